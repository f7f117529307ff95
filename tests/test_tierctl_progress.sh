#!/usr/bin/env bash
# tierctl detach and tierctl leg replace --wait say how much is left, the
# rate and an ETA, and the daemon keeps answering while they run.
#  - Two write-back LUNs share a set capped at destage_max = 1M. LUN a gets
#    6 MiB of dirty data, LUN b 4 MiB (the cleaner takes a's extents
#    first: they sort first). tierctl detach a, off a terminal, prints a
#    line a second ("destaging a: ... MiB left ... MiB/s ETA m:ss") with a
#    falling ETA and ends with "no dirty data left" once a is clean, while b
#    still holds at least 2 MiB (the detach waits for its own LUN, not for
#    the set, which would have taken b's 4 MiB too); a then runs
#    pass-through and its backing file holds what was written. tierctl status answers within 1 s throughout
#    (the destage runs on a thread of its own, not on the control socket's).
#    --json gives an object per sample.
#  - leg fail, then leg replace --wait while the surviving leg answers every
#    request after 60 ms (tierctl leg fault ... delay): lines of the resync
#    with bytes left and a falling ETA, then "resync complete", and the new
#    leg is healthy.
. "$(dirname "$0")/lib.sh"
tc_tmpdir
TB=$TC_ROOT/build/tierbench
CTL=$TC_ROOT/build/tierctl
[ -x "$TB" ] && [ -x "$CTL" ] || skip "build/tierbench or build/tierctl is not built"
command -v qemu-io >/dev/null || skip "qemu-io not installed"
port=$(tc_free_port)
{
	tc_conf_head "$port"
	cat <<CONF

[target iqn.2026-11.io.tiercache:test]
lun0 = a
lun1 = b

[lun a]
backing = $T/a.img
size = 64M
cache = fast

[lun b]
backing = $T/b.img
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
fault_injection = yes
CONF
} >"$T/t.conf"
tc_start "$T/t.conf"
ua=iscsi://127.0.0.1:$port/iqn.2026-11.io.tiercache:test/0
ub=iscsi://127.0.0.1:$port/iqn.2026-11.io.tiercache:test/1
ctl() { "$CTL" -c "$T/t.conf" "$@"; }
lun_field() { # LUN KEY: from the set's list of LUNs in status
	ctl --json status | python3 -c "
import json, sys
for l in json.load(sys.stdin)['caches'][0]['luns']:
    if l['name'] == sys.argv[1]:
        print(l[sys.argv[2]])" "$1" "$2"
}

# 6 MiB of random data into a, as 24 chunks in reverse order (not one
# sequential stream, so write-back absorbs it)
head -c 6M /dev/urandom >"$T/rand.img"
args=()
for i in $(seq 23 -1 0); do
	dd if="$T/rand.img" of="$T/chunk$i" bs=256k skip="$i" count=1 status=none
	args+=(-c "write -s $T/chunk$i $((i * 256))k 256k")
done
qemu-io -f raw "${args[@]}" "$ua" >/dev/null || fail "qemu-io write to a"
dirty=$(lun_field a dirty_bytes)
[ "$dirty" -ge $((4 << 20)) ] || fail "a has $dirty dirty bytes after 6 MiB of write-back writes"
pass "status gives each LUN's dirty bytes: a has $dirty"

# b: 4 MiB of dirty data, which a whole-set flush would destage as well
qemu-io -f raw "${args[@]:0:32}" "$ub" >/dev/null || fail "qemu-io write to b"
[ "$(lun_field b dirty_bytes)" -ge $((3 << 20)) ] || fail "b has $(lun_field b dirty_bytes) dirty bytes after 4 MiB"

ctl detach a >/dev/null 2>"$T/detach.err" &
det=$!
slow=0 n=0
while kill -0 "$det" 2>/dev/null; do
	t0=$(date +%s%N)
	ctl status >/dev/null || fail "tierctl status failed during the detach"
	ms=$((($(date +%s%N) - t0) / 1000000))
	n=$((n + 1))
	[ "$ms" -gt "$slow" ] && slow=$ms
	sleep 0.3
done
wait "$det" || fail "tierctl detach a: $(tail -3 "$T/detach.err")"
# at once: the cleaner goes on to b's extents at 1 MiB/s now that a is clean
bdirty=$(lun_field b dirty_bytes)
echo "tierctl status answered $n times during the detach, the slowest in $slow ms"
[ "$slow" -lt 1000 ] || fail "tierctl status took $slow ms during the detach (the goal is under 1 s)"
[ "$n" -ge 3 ] || fail "the detach ended in under a second: nothing measured the progress lines (dirty was $dirty)"
python3 - "$T/detach.err" <<'PY' || fail "detach progress: $(cat "$T/detach.err")"
import re, sys
lines = open(sys.argv[1]).read().splitlines()
prog = [l for l in lines if l.startswith("destaging a: ")]
assert lines and lines[-1] == "LUN a: no dirty data left", "no final line"
assert len(prog) >= 3, "%d progress lines" % len(prog)
etas = []
for l in prog:
    m = re.search(r"(\d+) MiB left  ([\d.]+) MiB/s  ETA (\d+:\d\d|unknown)", l)
    assert m, "line without left/rate/ETA: " + l
    if m.group(3) != "unknown":
        mm, ss = m.group(3).split(":")
        etas.append(int(mm) * 60 + int(ss))
assert len(etas) >= 2 and etas[0] > etas[-1], "ETA does not go down: %s" % etas
print("%d lines, ETA %s" % (len(prog), etas))
PY
[ "$(lun_field a mode)" = pass-through ] || fail "a runs $(lun_field a mode) after detach, not pass-through"
[ "$(lun_field a dirty_bytes)" = 0 ] || fail "a still has $(lun_field a dirty_bytes) dirty bytes after detach"
[ "$bdirty" -ge $((2 << 20)) ] || fail "b has $bdirty dirty bytes left of 4 MiB: the detach waited for the set, not for a"
cmp -n $((6 << 20)) "$T/rand.img" "$T/a.img" || fail "a's backing file does not hold what was written"
pass "detach a: progress lines with a falling ETA, status under 1 s ($slow ms), a clean and on its backing file, b still dirty ($bdirty bytes)"

# --json: an object per sample (a is clean: switch it back, dirty it, detach again)
ctl mode a write-back >/dev/null || fail "tierctl mode a write-back"
qemu-io -f raw "${args[@]:0:16}" "$ua" >/dev/null || fail "qemu-io write to a (again)"
ctl --json detach a >"$T/detach.json" 2>/dev/null || fail "tierctl --json detach a"
python3 - "$T/detach.json" <<'PY' || fail "detach --json: $(head -c 400 "$T/detach.json")"
import json, sys
objs = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{"dirty_bytes"')]
assert len(objs) >= 3, "%d progress objects" % len(objs)
assert objs[-1]["dirty_bytes"] == 0, objs[-1]
assert any(o["eta_seconds"] > 0 for o in objs), "no ETA"
PY
pass "detach --json: an object per sample with dirty bytes, rate and ETA"

# --- leg replace --wait ----------------------------------------------------------
ctl leg fail fast "$T/leg1.img" >/dev/null || fail "tierctl leg fail"
ctl leg fault fast "$T/leg0.img" delay 60000 >/dev/null || fail "tierctl leg fault delay on the surviving leg"
ctl leg replace fast "$T/leg1.img" "$T/leg2.img" --wait >/dev/null 2>"$T/replace.err" ||
	fail "tierctl leg replace --wait: $(tail -3 "$T/replace.err")"
ctl leg fault fast "$T/leg0.img" ok >/dev/null
python3 - "$T/replace.err" "$T/leg2.img" <<'PY' || fail "leg replace progress: $(cat "$T/replace.err")"
import re, sys
lines = open(sys.argv[1]).read().splitlines()
leg = sys.argv[2]
prog = [l for l in lines if l.startswith("resyncing %s: " % leg)]
assert lines and lines[-1] == "resync complete: leg %s is healthy" % leg, "no final line"
assert len(prog) >= 3, "%d progress lines" % len(prog)
left, etas = [], []
for l in prog:
    m = re.search(r"(\d+) MiB left  ([\d.]+) MiB/s  ETA (\d+:\d\d|unknown)", l)
    assert m, "line without left/rate/ETA: " + l
    left.append(int(m.group(1)))
    if m.group(3) != "unknown":
        mm, ss = m.group(3).split(":")
        etas.append(int(mm) * 60 + int(ss))
assert left[0] > left[-1], "bytes left do not go down: %s" % left
assert len(etas) >= 2 and etas[0] > etas[-1], "ETA does not go down: %s" % etas
print("%d lines, MiB left %s, ETA %s" % (len(prog), left, etas))
PY
health=$(ctl --json status | python3 -c "
import json, sys
print(' '.join(l['health'] for l in json.load(sys.stdin)['caches'][0]['legs']))")
[ "$health" = "healthy healthy" ] || fail "legs after leg replace --wait: $health"
pass "leg replace --wait: lines with MiB left, rate and a falling ETA, then the new leg is healthy"
