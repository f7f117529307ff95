#!/usr/bin/env python3
"""Summarise an iscsi-test-cu transcript (CUnit basic mode, verbose).

usage: cu_summary.py LOG [--names]
         "tests T passed P failed F skipped S" from the per-test verdicts;
         with --names the failed and skipped tests follow, one a line.
       cu_summary.py LOG --run-summary
         CUnit's own "Run Summary" block, then what the per-test parse saw:
           suites total N ran N failed N inactive N
           tests total N ran N passed N failed N inactive N
           parsed tests N failed N skipped N
           skipped SUITE.TEST        (one line per skipped test)
           failed SUITE.TEST         (one line per failed test)
         Exit 3, with a message on stderr, when the transcript has no Run
         Summary (the suite did not finish: a crash, a timeout, a refused
         login) or the block lacks a row or column the caller relies on.

A test's verdict is CUnit's "passed" or "FAILED" at the start of a line or
right after the test's "..." ("[FAILED] ..." and "[SKIPPED] ..." lines are
the test's own messages, indented, and a suite's teardown may print after
the verdict on the same line). A skipped test is a passed one that printed
"[SKIPPED]" (CUnit counts it as a pass), in whole or in part: libiscsi's
tests skip what the device does not claim to support.
"""
import re
import sys

VERDICT = re.compile(r"^(passed|FAILED)")


def parse_tests(text):
    results = []
    suite = None
    cur = None
    buf = []

    def close():
        if cur is None:
            return
        verdict = "FAILED"  # no verdict printed: the run ended inside the test
        for line in buf:
            m = VERDICT.match(line)
            if m:
                verdict = m.group(1)
                break
        if verdict == "FAILED":
            st = "failed"
        elif any("[SKIPPED]" in line for line in buf):
            st = "skipped"
        else:
            st = "passed"
        results.append((cur, st))

    for line in text.splitlines():
        m = re.match(r"^Suite: (\S+)", line)
        if m:
            close()
            cur, buf = None, []
            suite = m.group(1)
            continue
        m = re.match(r"^\s+Test: (\S+) \.\.\.(.*)$", line)
        if m:
            close()
            cur = f"{suite}.{m.group(1)}"
            buf = [m.group(2)]
            continue
        if line.startswith("Run Summary"):
            close()
            cur, buf = None, []
            continue
        if cur is not None:
            buf.append(line)
    close()
    return results


def parse_run_summary(text):
    """{"suites": {"Total": "51", ...}, "tests": {...}, ...} or None.

    CUnit 2.1 prints
        Run Summary:    Type  Total    Ran Passed Failed Inactive
                      suites     51     51    n/a      0        0
                       tests    230    230    230      0        0
                     asserts  85571  85571  85571      0      n/a
    The columns are read by their header names, not by position."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^Run Summary:\s+Type\s+(.*)$", line)
        if not m:
            continue
        cols = m.group(1).split()
        rows = {}
        for row in lines[i + 1:]:
            f = row.split()
            if len(f) != len(cols) + 1:
                break
            rows[f[0]] = dict(zip(cols, f[1:]))
        return rows
    return None


def run_summary(path, text):
    rows = parse_run_summary(text)
    if rows is None:
        print(f"{path}: no CUnit Run Summary (the suite did not finish)", file=sys.stderr)
        sys.exit(3)
    want = {"suites": ("Total", "Ran", "Failed", "Inactive"),
            "tests": ("Total", "Ran", "Passed", "Failed", "Inactive")}
    out = []
    for kind, keys in want.items():
        row = rows.get(kind)
        if row is None or any(not row.get(k, "").isdigit() for k in keys):
            print(f"{path}: the Run Summary has no usable '{kind}' row: {row}", file=sys.stderr)
            sys.exit(3)
        out.append(kind + "".join(f" {k.lower()} {row[k]}" for k in keys))
    print("\n".join(out))
    res = parse_tests(text)
    failed = [n for n, st in res if st == "failed"]
    skipped = [n for n, st in res if st == "skipped"]
    print(f"parsed tests {len(res)} failed {len(failed)} skipped {len(skipped)}")
    for n in skipped:
        print(f"skipped {n}")
    for n in failed:
        print(f"failed {n}")


def main():
    path = sys.argv[1]
    text = open(path, errors="replace").read()
    if "--run-summary" in sys.argv:
        run_summary(path, text)
        return
    res = parse_tests(text)
    count = {"passed": 0, "failed": 0, "skipped": 0}
    for _, st in res:
        count[st] += 1
    print(f"tests {len(res)} passed {count['passed']} failed {count['failed']} skipped {count['skipped']}")
    if "--names" in sys.argv:
        for name, st in res:
            if st != "passed":
                print(f"  {st}: {name}")


main()
