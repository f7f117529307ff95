#!/usr/bin/env bash
# tierctl trace: a cache set's reads and writes, recorded to a file the
# sizing replay reads (cache/trace.h).
#  - qemu-io sends a known sequence to two LUNs of one set; the trace has
#    exactly those requests, in that order, with each LUN's id and name,
#    and the set's slots and extent size in its header.
#  - a second start is refused while one runs; an existing file is never
#    overwritten; --max N records N requests and counts the rest as not
#    recorded; stop says what was written.
#  - tests/unit/test_advisor reads the file (the replay's input format).
. "$(dirname "$0")/lib.sh"
tc_tmpdir
CTL=$TC_ROOT/build/tierctl
[ -x "$CTL" ] && [ -x "$TC_ROOT/build/tests/test_advisor" ] || skip "build/tierctl or build/tests/test_advisor is not built"
port=$(tc_free_port)
{
	tc_conf_head "$port"
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
grep -v '^#' "$T/t1.trace" >"$T/t1.lines"
printf '%s\n' 'W 0 0 4096' 'R 0 65536 8192' 'W 0 1048576 65536' 'R 1 4096 4096' 'W 0 130048 204800' >"$T/want"
diff "$T/want" "$T/t1.lines" >"$T/diff" || fail "the trace is not the sequence sent: $(cat "$T/diff")"
pass "the trace has the 5 requests sent to two LUNs, in order, with their LUN ids, offsets and lengths"
grep -qx '# nslots [0-9]*' "$T/t1.trace" && grep -qx '# extent 65536' "$T/t1.trace" &&
	grep -qx '# lun 0 a write-back' "$T/t1.trace" && grep -qx '# lun 1 b write-back' "$T/t1.trace" ||
	fail "the header lacks slots, extent or LUN names: $(grep '^#' "$T/t1.trace" | tr '\n' ' ')"
grep -qx '# records 5, dropped 0, .*' "$T/t1.trace" || fail "the footer: $(tail -1 "$T/t1.trace")"
ctl trace fast stop >"$T/stop2.out" 2>&1 && fail "a stop with no trace running succeeded"

# never over an existing file
echo keep >"$T/exists.trace"
ctl trace fast start "$T/exists.trace" >"$T/ex.out" 2>&1 && fail "trace start over an existing file succeeded"
[ "$(cat "$T/exists.trace")" = keep ] || fail "an existing file was overwritten"
pass "a second start and a start over an existing file are refused; stop without a trace is refused"

# --max: 3 recorded, the rest counted
(cd "$T" && "$CTL" -c t.conf trace fast start rel.trace --max 3) >"$T/m.out" 2>&1 || fail "trace --max: $(cat "$T/m.out")"
qio -c 'read 0 4k' -c 'read 8192 4k' -c 'read 16384 4k' -c 'read 32768 4k' -c 'read 49152 4k' "$base/0"
ctl --json trace fast stop >"$T/mstop.json" 2>&1 || fail "trace stop: $(cat "$T/mstop.json")"
n=$(grep -vc '^#' "$T/rel.trace")
[ "$n" = 3 ] || fail "--max 3 recorded $n requests"
python3 -c '
import json, sys
t = json.load(open(sys.argv[1]))["trace"]
assert t["records"] == 3 and t["not_recorded"] == 2, t' "$T/mstop.json" || fail "stop reports $(cat "$T/mstop.json")"
pass "a relative path is the caller's; --max 3 wrote 3 requests and counted 2 as not recorded"

"$TC_ROOT/build/tests/test_advisor" "$T/t1.trace" >"$T/adv.out" 2>&1 || true
grep -q "requests" "$T/adv.out" || fail "test_advisor did not read the trace: $(head -5 "$T/adv.out")"
pass "tests/unit/test_advisor reads the recorded file"
