#!/usr/bin/env bash
# tierbench end to end: errors are one line and exit 2; a mixed workload with
# --verify checks every read and the read-back and finds no mismatch, and its
# JSON carries real figures; verification does catch data changed behind the
# target's back; --svg draws; and tests/bench/compare.sh runs through in its
# short form (a second or two per row) with every run succeeding.
# Nothing here asserts speed.
. "$(dirname "$0")/lib.sh"
tc_tmpdir
TB=$TC_ROOT/build/tierbench
[ -x "$TB" ] || skip "build/tierbench is not built"
command -v python3 >/dev/null || skip "python3 not installed"

port=$(tc_free_port)
iqn=iqn.2026-11.io.tiercache:test
url=iscsi://127.0.0.1:$port/$iqn/0
tc_basic_conf "$port" 64M >"$T/t.conf"
tc_start "$T/t.conf"

# --- errors: one line on stderr, exit 2 ---
one_line_exit2() { # WHAT ARGS...
	local what=$1 out rc
	shift
	out=$("$TB" -T 1 "$@" 2>&1 >/dev/null)
	rc=$?
	[ "$rc" = 2 ] || fail "$what: exit $rc, expected 2 ($out)"
	[ "$(printf '%s\n' "$out" | wc -l)" = 1 ] || fail "$what: more than one line: $out"
	[[ "$out" == tierbench:* ]] || fail "$what: message does not name tierbench: $out"
	pass "$what: one line, exit 2"
}
one_line_exit2 "bad URL" "iscsi://127.0.0.1:$port/"
one_line_exit2 "unknown target" "iscsi://127.0.0.1:$port/iqn.2026-11.io.tiercache:nope/0"
one_line_exit2 "refused connection" "iscsi://127.0.0.1:$(tc_free_port)/$iqn/0"
one_line_exit2 "unknown workload" -w 3k-nothing "$url"

# --- verify mode on a mixed workload, JSON figures ---
"$TB" --json --verify -w 8k-7030 -t 2 -q 8 -T 2 --size 16M --label smoke "$url" >"$T/v.json" 2>"$T/v.err" ||
	fail "tierbench --verify 8k-7030 failed: $(cat "$T/v.err")"
python3 - "$T/v.json" <<'PY' || fail "JSON of the verify run: see above"
import json, sys
d = json.load(open(sys.argv[1]))
r = d["runs"][0]
lat = r["latency_us"]
problems = []
if r["workload"] != "8k-7030": problems.append("workload %r" % r["workload"])
if not r["iops"] > 0: problems.append("iops %r" % r["iops"])
if not (r["read"]["ios"] > 0 and r["write"]["ios"] > 0): problems.append("not a read/write mix")
if not (0 < lat["p50"] <= lat["p99"] <= lat["p99_9"] <= lat["max"]): problems.append("latency order %r" % lat)
if not lat["min"] <= lat["avg"] <= lat["max"]: problems.append("avg outside min..max")
if not r["session_ios_min"] > 0: problems.append("a session completed nothing: %r" % r["session_ios_min"])
v = d["verify"]
if v["mismatches"] != 0: problems.append("%d mismatches" % v["mismatches"])
if not (v["reads_checked"] > 0 and v["read_back"] > 0): problems.append("nothing verified: %r" % v)
if problems:
    print("FAIL: " + "; ".join(problems)); sys.exit(1)
print("ok: %d IOPS, %d reads checked, %d blocks read back, 0 mismatches" % (r["iops"], v["reads_checked"], v["read_back"]))
PY
pass "verify mode: no mismatch, JSON has nonzero IOPS, every session busy, ordered percentiles"

# --- verification catches corruption: stamp blocks of 16 MiB with random
# writes; once that run is over (its row is printed), zero the backing file
# under the daemon while tierbench is stopped, so that no write comes after
# the zeroing and the final read-back of every written block comes after
# it, however slow the machine is ---
"$TB" --verify -w 4k-randwrite,4k-randread -t 2 -q 8 -T 2 --size 16M --seed 7 "$url" \
	>"$T/c.out" 2>"$T/c.err" &
tb=$!
write_run_done() {
	grep -q '^4k-randwrite ' "$T/c.out" && return 0
	tc_gone "$tb" && fail "tierbench ended before its read run: $(cat "$T/c.err")"
	return 1
}
tc_wait_for 60 "the 4k-randwrite run of tierbench --verify" write_run_done
kill -STOP "$tb"
dd if=/dev/zero of="$T/disk0.img" bs=1M count=16 conv=notrunc oflag=direct status=none ||
	dd if=/dev/zero of="$T/disk0.img" bs=1M count=16 conv=notrunc,fsync status=none
kill -CONT "$tb"
wait "$tb"
rc=$?
[ "$rc" = 1 ] || fail "verify after zeroing the backing file: exit $rc, expected 1 (mismatch); $(cat "$T/c.err")"
grep -q "verify: byte offset .* expected generation" "$T/c.err" || fail "no mismatch report: $(cat "$T/c.err")"
pass "verify mode reports blocks zeroed behind the target (exit 1)"
tc_stop

# --- chart from saved JSON ---
"$TB" --svg "$T/c.svg" --from "$T/v.json" || fail "--svg from JSON failed"
grep -q "<svg" "$T/c.svg" && grep -q "8k-7030" "$T/c.svg" || fail "chart lacks the run"
pass "--svg draws saved results"

# --- the benchmark script, short form ---
TB_QUICK=1 TB_OUT="$T/cmp" bash "$TC_ROOT/tests/bench/compare.sh" >"$T/cmp.out" 2>&1
rc=$?
cat "$T/cmp.out"
[ "$rc" = 0 ] || fail "compare.sh (TB_QUICK=1) exited $rc"
python3 - "$T/cmp" <<'PY' || fail "compare.sh results: see above"
import glob, json, os, sys
files = glob.glob(os.path.join(sys.argv[1], "*", "*.json"))
cfgs = sorted({os.path.basename(os.path.dirname(f)) for f in files})
if "tiercached" not in cfgs:
    print("FAIL: no tiercached results"); sys.exit(1)
bad = []
for f in files:
    for r in json.load(open(f))["runs"]:
        if not r["ios"] > 0:
            bad.append("%s %s" % (f, r["load"]))
if bad:
    print("FAIL: runs without a completed command: " + ", ".join(bad)); sys.exit(1)
print("ok: %d result files from %s" % (len(files), ", ".join(cfgs)))
PY
grep -q "tiercached / tgtd\|tiercached vs tgtd" "$T/cmp.out" || fail "compare.sh printed no comparison table"
pass "compare.sh short form: every run completed commands"
