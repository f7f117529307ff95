#!/usr/bin/env python3
"""Summarise an iscsi-test-cu log: per-test outcome and counts.

usage: cu_summary.py LOG [--names]
Prints "tests T passed P failed F skipped S": failed is CUnit's own verdict
for the test; a skipped test is one that printed [SKIPPED] (CUnit counts
those as passes). With --names, the failed and skipped test names follow.
"""
import re
import sys

def parse(text):
    results = []
    suite = None
    cur = None
    buf = []
    def close():
        if cur is None:
            return
        body = "\n".join(buf)
        # CUnit's verdict is the first bare "passed"/"FAILED"; "[FAILED] ..."
        # lines are the test's own messages (some printed by its teardown
        # after the verdict, e.g. a PRIN meeting the reset's unit attention).
        m = re.search(r"(?<!\[)\b(passed|FAILED)\b", body)
        verdict = m.group(1) if m else "FAILED"
        if verdict == "FAILED":
            st = "failed"
        elif "[SKIPPED]" in body:
            st = "skipped"
        else:
            st = "passed"
        results.append((cur, st))
    for line in text.splitlines():
        m = re.match(r"^Suite: (\S+)", line)
        if m:
            close(); cur = None; buf = []
            suite = m.group(1)
            continue
        m = re.match(r"^\s+Test: (\S+) \.\.\.(.*)$", line)
        if m:
            close()
            cur = f"{suite}.{m.group(1)}"
            buf = [m.group(2)]
            continue
        if line.startswith("Run Summary"):
            close(); cur = None; buf = []
            continue
        if cur is not None:
            buf.append(line)
    close()
    return results

def main():
    text = open(sys.argv[1], errors="replace").read()
    res = parse(text)
    count = {"passed": 0, "failed": 0, "skipped": 0}
    for _, st in res:
        count[st] += 1
    print(f"tests {len(res)} passed {count['passed']} failed {count['failed']} skipped {count['skipped']}")
    if "--names" in sys.argv:
        for name, st in res:
            if st != "passed":
                print(f"  {st}: {name}")

main()
