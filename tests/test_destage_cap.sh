#!/usr/bin/env bash
# [cache] destage_max and destage_max_iops: the cleaner never destages
# faster than the admin's cap, a flush included, and tierctl set changes
# the caps of a running set. An idle write-back LUN (or a flush) otherwise
# destages as fast as the backing store takes it: 12 MiB here in well under
# a second. Checked by the time the destaged bytes take to grow, which a
# slow machine only lengthens:
#  - destage_max = 1M in the file, a flush asked for: 6 MiB destaged take at
#    least 3 s (the cap allows 1 MiB/s, plus a second's budget and the
#    extents in flight);
#  - tierctl set: destage_max 0 and destage_max_iops 4 (4 writes of one
#    256 KiB extent a second): 3 MiB more take at least 1.5 s; status shows
#    the caps;
#  - tierctl set destage_max_iops 0: the rest drains;
#  - tierctl flush --wait off a terminal prints a line a second with the
#    MiB left, the measured rate (within the cap) and a falling ETA, and
#    --json an object per sample.
. "$(dirname "$0")/lib.sh"
tc_tmpdir
TB=$TC_ROOT/build/tierbench
CTL=$TC_ROOT/build/tierctl
[ -x "$TB" ] && [ -x "$CTL" ] || skip "build/tierbench or build/tierctl is not built"
port=$(tc_free_port)
{
	tc_conf_head "$port"
	cat <<CONF

[target iqn.2026-11.io.tiercache:test]
lun0 = disk0

[lun disk0]
backing = $T/disk0.img
size = 64M
cache = fast

[cache fast]
legs = $T/leg0.img $T/leg1.img
size = 64M
extent = 256K
mode = write-back
admit_hits = 1
seq_cutoff = 0
dirty_target = 90
destage_max = 1M
CONF
} >"$T/t.conf"
tc_start "$T/t.conf"
url=iscsi://127.0.0.1:$port/iqn.2026-11.io.tiercache:test/0
st() { "$CTL" -c "$T/t.conf" --json status | python3 -c "import json,sys; c=json.load(sys.stdin)['caches'][0]; print(c['$1'])"; }
"$TB" --json --no-progress -b 256k --seq -r 0 -t 1 -q 4 -n 48 --size 12M "$url" >"$T/tb.json" ||
	fail "tierbench: $(head -c 300 "$T/tb.json")"
[ "$(st destage_max)" = 1048576 ] || fail "status destage_max: $(st destage_max), expected 1048576"
"$CTL" -c "$T/t.conf" flush >/dev/null || fail "tierctl flush"
# seconds until destaged_bytes has grown by BYTES (condition, 120 s at most)
grow_time() {
	local want=$1 from t0
	t0=$(date +%s.%N)
	from=$(st destaged_bytes)
	tc_wait_for 120 "$((want >> 20)) MiB more destaged" eval '[ "$(st destaged_bytes)" -ge '"$((from + want))"' ]'
	python3 -c "import sys; print('%.2f' % ($(date +%s.%N) - $t0))"
}
t=$(grow_time $((6 << 20)))
echo "destage_max = 1M, flushing: 6 MiB destaged in $t s"
python3 -c "import sys; sys.exit(0 if $t >= 3.0 else 1)" ||
	fail "destage_max = 1M: 6 MiB destaged in $t s, faster than the cap allows (at least 3 s)"
pass "destage_max = 1M holds during a flush: 6 MiB in $t s"

# the IOPS cap first: between the two calls the flush runs under one cap
# or both, never under none (a tick there would drain the rest at once)
"$CTL" -c "$T/t.conf" set fast destage_max_iops 4 >/dev/null || fail "tierctl set destage_max_iops 4"
"$CTL" -c "$T/t.conf" set fast destage_max 0 >/dev/null || fail "tierctl set destage_max 0"
[ "$(st destage_max_iops)" = 4 ] && [ "$(st destage_max)" = 0 ] ||
	fail "status after tierctl set: destage_max $(st destage_max), destage_max_iops $(st destage_max_iops)"
t=$(grow_time $((3 << 20)))
echo "destage_max_iops = 4 (tierctl set): 3 MiB destaged in $t s"
python3 -c "import sys; sys.exit(0 if $t >= 1.5 else 1)" ||
	fail "destage_max_iops = 4: 3 MiB of 256 KiB extents destaged in $t s (at least 1.5 s)"
pass "tierctl set destage_max_iops 4 holds: 3 MiB in $t s"

"$CTL" -c "$T/t.conf" set fast destage_max_iops 0 >/dev/null || fail "tierctl set destage_max_iops 0"
tc_wait_for 60 "the dirty data drained with no cap" eval '[ "$(st dirty_bytes)" = 0 ]'
"$CTL" -c "$T/t.conf" set fast destage_max 1k >/dev/null 2>&1 && fail "destage_max 1k (under 64K) was accepted"
"$CTL" -c "$T/t.conf" set fast dirty_target 5 >/dev/null 2>&1 && fail "set dirty_target (not changeable) was accepted"
pass "no cap: the rest drained; a cap under 64K and other keys are refused"

# tierctl flush --wait says how much is left, the rate and an ETA: plain
# lines, one a second, off a terminal; JSON objects with --json
"$CTL" -c "$T/t.conf" set fast destage_max 1M >/dev/null || fail "tierctl set destage_max 1M"
"$TB" --json --no-progress -b 256k --seq -r 0 -t 1 -q 4 -n 24 --size 6M "$url" >"$T/tb.json" ||
	fail "tierbench: $(head -c 300 "$T/tb.json")"
"$CTL" -c "$T/t.conf" flush --wait >/dev/null 2>"$T/flush.err" || fail "tierctl flush --wait: $(tail -2 "$T/flush.err")"
python3 - "$T/flush.err" <<'PY' || fail "flush --wait progress: $(cat "$T/flush.err")"
import re, sys
lines = open(sys.argv[1]).read().splitlines()
prog = [l for l in lines if l.startswith("flushing: ")]
assert lines and lines[-1] == "flush complete: no dirty data left", "no final line"
assert len(prog) >= 3, "%d progress lines" % len(prog)
etas, rates = [], []
for l in prog:
    m = re.search(r"(\d+) MiB left  ([\d.]+) MiB/s  ETA (\d+:\d\d|unknown)", l)
    assert m, "line without left/rate/ETA: " + l
    rates.append(float(m.group(2)))
    if m.group(3) != "unknown":
        mm, ss = m.group(3).split(":")
        etas.append(int(mm) * 60 + int(ss))
assert len(etas) >= 2, "fewer than two ETAs"
assert etas[0] > etas[-1], "ETA does not go down: %s" % etas
assert max(rates) <= 2.5, "rate %.1f MiB/s over the 1M cap" % max(rates)
print("%d lines, ETA %s, rates %s" % (len(prog), etas, rates))
PY
pass "flush --wait off a terminal: a line a second with MiB left, the rate (within the cap) and a falling ETA"
"$TB" --json --no-progress -b 256k --seq -r 0 -t 1 -q 4 -n 12 --size 3M "$url" >"$T/tb.json" ||
	fail "tierbench: $(head -c 300 "$T/tb.json")"
"$CTL" -c "$T/t.conf" --json flush --wait >"$T/flush.json" 2>/dev/null || fail "tierctl --json flush --wait"
python3 - "$T/flush.json" <<'PY' || fail "flush --wait --json: $(head -5 "$T/flush.json")"
import json, sys
objs = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{"dirty_bytes"')]
assert len(objs) >= 3, "%d progress objects" % len(objs)
assert objs[-1]["dirty_bytes"] == 0, objs[-1]
assert any(o["eta_seconds"] > 0 for o in objs), "no ETA"
assert all("rate_bytes_per_second" in o for o in objs)
PY
pass "flush --wait --json: a JSON object per sample with dirty bytes, rate and ETA"
