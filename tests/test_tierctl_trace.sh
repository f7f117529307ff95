#!/usr/bin/env bash
# tierctl trace: a cache set's reads and writes, recorded to a file the
# sizing replay reads (cache/trace.h).
#  - qemu-io sends a known sequence to two LUNs of one set; the trace has
#    exactly those requests, in that order, with each LUN's id, name and
#    mode, and the set's slots and extent size in its header.
#  - two sessions on the two workers at once: every request is in the
#    trace, the two LUNs' lines interleave, and the times (fifth field)
#    run forward: the workers' rings are merged by time, not one after
#    the other.
#  - a second start is refused while one runs; an existing file is never
#    overwritten; a relative name lands in state_dir; --max N records N
#    requests and counts every later one as not recorded; stop says what
#    was written.
#  - tests/unit/test_advisor reads the file (the replay's input format).
#  - a trace still running when the daemon stops is finished (footer,
#    sync) and the daemon exits 0; make check runs this test on the ASan
#    daemon too.
. "$(dirname "$0")/lib.sh"
tc_tmpdir
CTL=$TC_ROOT/build/tierctl
[ -x "$CTL" ] && [ -x "$TC_ROOT/build/tests/test_advisor" ] || skip "build/tierctl or build/tests/test_advisor is not built"
port=$(tc_free_port)
{
	tc_conf_head "$port" | sed -e "s|^\[daemon\]|&\nworkers = 2|"
	cat <<CONF

[target iqn.2026-12.io.tiercache:trace]
lun0 = a
lun1 = b

[lun a]
backing = $T/a.img
size = 32M
cache = fast

[lun b]
backing = $T/b.img
size = 16M
cache = fast

[cache fast]
legs = $T/leg0.img $T/leg1.img
size = 16M
extent = 64K
mode = write-back
CONF
} >"$T/t.conf"
tc_start "$T/t.conf"
base=iscsi://127.0.0.1:$port/iqn.2026-12.io.tiercache:trace
ctl() { "$CTL" -c "$T/t.conf" "$@"; }
qio() { qemu-io -f raw "$@" >>"$T/qio.out" 2>&1 || fail "qemu-io $*: $(tail -3 "$T/qio.out")"; }

ctl trace fast start "$T/t1.trace" >"$T/start.out" 2>&1 || fail "trace start: $(cat "$T/start.out")"
ctl trace fast start "$T/t2.trace" >"$T/again.out" 2>&1 && fail "a second trace of the set started: $(cat "$T/again.out")"
grep -q "being traced already" "$T/again.out" || fail "a second start said: $(cat "$T/again.out")"
ctl --json trace fast | grep -q '"tracing":true' || fail "trace state does not say tracing"
# the sequence: LUN a write, read, write; LUN b read; LUN a a 200K write over three extents
qio -c 'write -P 0x11 0 4k' -c 'read 65536 8k' -c 'write 1048576 64k' "$base/0"
qio -c 'read 4096 4k' "$base/1"
qio -c 'write 130048 204800' "$base/0"
ctl trace fast stop >"$T/stop.out" 2>&1 || fail "trace stop: $(cat "$T/stop.out")"
cat "$T/stop.out"
grep -v '^#' "$T/t1.trace" | cut -d' ' -f1-4 >"$T/t1.lines"
printf '%s\n' 'W 0 0 4096' 'R 0 65536 8192' 'W 0 1048576 65536' 'R 1 4096 4096' 'W 0 130048 204800' >"$T/want"
diff "$T/want" "$T/t1.lines" >"$T/diff" || fail "the trace is not the sequence sent: $(cat "$T/diff")"
pass "the trace has the 5 requests sent to two LUNs, in order, with their LUN ids, offsets and lengths"
grep -qx '# nslots [0-9]*' "$T/t1.trace" && grep -qx '# extent 65536' "$T/t1.trace" &&
	grep -qx '# lun 0 a write-back' "$T/t1.trace" && grep -qx '# lun 1 b write-back' "$T/t1.trace" ||
	fail "the header lacks slots, extent or LUN names: $(grep '^#' "$T/t1.trace" | tr '\n' ' ')"
grep -qx '# records 5, dropped 0, .*' "$T/t1.trace" || fail "the footer: $(tail -1 "$T/t1.trace")"
ctl trace fast stop >"$T/stop2.out" 2>&1 && fail "a stop with no trace running succeeded"

# two LUNs at once, one session each (the portal spreads them over the workers)
TB=$TC_ROOT/build/tierbench
ctl trace fast start "$T/t3.trace" >/dev/null 2>&1 || fail "trace start t3"
"$TB" -b 4k -r 50 --rand -t 1 -q 4 -n 3000 --size 8M "$base/0" >"$T/tb0.out" 2>&1 &
p0=$!
"$TB" -b 4k -r 50 --rand -t 1 -q 4 -n 3000 --size 8M "$base/1" >"$T/tb1.out" 2>&1 &
p1=$!
wait $p0 || fail "tierbench on LUN a: $(tail -3 "$T/tb0.out")"
wait $p1 || fail "tierbench on LUN b: $(tail -3 "$T/tb1.out")"
ctl --json trace fast stop >"$T/t3stop.json" 2>&1 || fail "trace stop t3: $(cat "$T/t3stop.json")"
read -r n0 n1 alt inv < <(awk '!/^#/ { n[$2]++; if (NR > 1 && $2 != last) alt++; if ($5 < t) inv++; t = $5; last = $2 }
	END { print n[0] + 0, n[1] + 0, alt + 0, inv + 0 }' "$T/t3.trace")
echo "two sessions at once: $n0 + $n1 lines, $alt switches between the LUNs, $inv times out of order"
[ "$n0" -ge 3000 ] && [ "$n1" -ge 3000 ] || fail "the trace has $n0 and $n1 requests of the 3000+ each session sent"
[ "$alt" -ge 20 ] || fail "the two LUNs' lines switch only $alt times: not interleaved"
# a worker preempted between its clock read and its publish may come a
# little late (rare, more so on a busy machine or under ASan); a merge by
# ring puts one ring after the other at every drain, every 20 ms: dozens
# in a run of these
[ "$inv" -le 10 ] || fail "$inv lines come before an earlier time: the rings are not merged by time"
pass "two sessions at once: $n0 + $n1 requests, interleaved ($alt switches), times in order ($inv exceptions)"

# never over an existing file
echo keep >"$T/exists.trace"
ctl trace fast start "$T/exists.trace" >"$T/ex.out" 2>&1 && fail "trace start over an existing file succeeded"
[ "$(cat "$T/exists.trace")" = keep ] || fail "an existing file was overwritten"
pass "a second start and a start over an existing file are refused; stop without a trace is refused"

# --max: 3 recorded, the rest counted
ctl trace fast start rel.trace --max 3 >"$T/m.out" 2>&1 || fail "trace --max: $(cat "$T/m.out")"
[ -f "$T/state/rel.trace" ] || fail "a relative name is not in state_dir: $(cat "$T/m.out")"
qio -c 'read 0 4k' -c 'read 8192 4k' -c 'read 16384 4k' -c 'read 32768 4k' -c 'read 49152 4k' "$base/0"
# once the trace's thread has seen the cap, the workers count by themselves
tc_wait_for 10 "the trace to fill" eval '"$CTL" -c "$T/t.conf" --json trace fast | grep -q "\"records\":3,"'
sleep 0.1
qio -c 'read 0 4k' -c 'read 8192 4k' -c 'read 16384 4k' -c 'read 32768 4k' -c 'read 49152 4k' "$base/0"
ctl --json trace fast stop >"$T/mstop.json" 2>&1 || fail "trace stop: $(cat "$T/mstop.json")"
n=$(grep -vc '^#' "$T/state/rel.trace")
[ "$n" = 3 ] || fail "--max 3 recorded $n requests"
python3 -c '
import json, sys
t = json.load(open(sys.argv[1]))["trace"]
assert t["records"] == 3 and t["not_recorded"] == 7, t' "$T/mstop.json" || fail "stop reports $(cat "$T/mstop.json")"
grep -qx '# records 3, dropped 7, .*' "$T/state/rel.trace" || fail "the footer: $(tail -1 "$T/state/rel.trace")"
ctl trace fast start x.trace --max 1e6 >"$T/bad.out" 2>&1 && fail "--max 1e6 was taken"
pass "a relative name lands in state_dir; --max 3 wrote 3 requests and counted the 7 after them"

"$TC_ROOT/build/tests/test_advisor" "$T/t1.trace" >"$T/adv.out" 2>&1
grep -q "t1.trace: 5 requests, 9 accesses" "$T/adv.out" ||
	fail "test_advisor did not read the trace's 5 requests (9 pieces): $(grep requests "$T/adv.out")"
pass "tests/unit/test_advisor reads the recorded file: 5 requests, 9 extent pieces"

# a trace still running when the daemon stops is finished: rest, footer, sync
ctl trace fast start "$T/last.trace" >/dev/null 2>&1 || fail "trace start last"
qio -c 'write 0 4k' -c 'read 0 4k' "$base/0"
tc_stop
[ "$(grep -vc '^#' "$T/last.trace")" = 2 ] && grep -qx '# records 2, dropped 0, .*' "$T/last.trace" ||
	fail "a trace running at shutdown: $(tail -3 "$T/last.trace" | tr '\n' ' ')"
pass "a trace running when the daemon stops is finished with its 2 requests and its footer; exit status 0"
