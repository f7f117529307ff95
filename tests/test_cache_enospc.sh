#!/usr/bin/env bash
# Write-back over a backing store whose filesystem fills up: the destage
# that meets ENOSPC keeps the data dirty in the cache, backs off (1 s
# doubling to 30 s per LUN) instead of retrying in a loop, logs once per
# state change, and tierctl status names the LUN, the error and the dirty
# bytes waiting for it, and flush --wait names what it waits for. A write
# that needs new space is refused (07/27/07) while overwrites and reads of
# cached blocks work. When space comes back the destage resumes by itself,
# the flush ends, and every byte written through iSCSI reaches the backing
# file.
# Needs root and a loop device (a 40 MiB ext4 image holds the backing
# file); skipped where the kernel gives neither.
. "$(dirname "$0")/lib.sh"
tc_tmpdir
command -v qemu-io >/dev/null || skip "qemu-io not installed"
CTL=$TC_ROOT/build/tierctl
tc_loop_fs 40M

port=$(tc_free_port)
url=iscsi://127.0.0.1:$port/iqn.2026-11.io.tiercache:test/0
tc_basic_conf "$port" 24M | sed "s|^backing = .*|backing = $T/fs/disk0.img|" >"$T/t.conf"
cat >>"$T/t.conf" <<CONF
cache = fast

[cache fast]
legs = $T/leg0.img $T/leg1.img
size = 64M
mode = write-back
admit_hits = 1
seq_cutoff = 0
CONF
tc_start "$T/t.conf"
# leave about 4 MiB free on the filesystem: most of the 16 MiB below cannot land
avail=$(df --output=avail -B1 "$T/fs" | tail -1)
fallocate -l $((avail - (4 << 20))) "$T/fs/filler" || fail "fallocate of the filler failed"

lun() { # field of the LUN's entry in the cache's status
	"$CTL" -c "$T/t.conf" --json status | python3 -c '
import json,sys
for c in json.load(sys.stdin)["caches"]:
    for l in c["luns"]:
        if l["name"] == "disk0": print(l.get(sys.argv[1], ""))' "$1"
}
set_dirty() { "$CTL" -c "$T/t.conf" --json stats | python3 -c 'import json,sys; print(json.load(sys.stdin)["caches"][0]["dirty_bytes"])'; }

out=$(qemu-io -f raw -c 'write -P 0x5a 2M 16M' "$url" 2>&1) || fail "qemu-io write: $out"
pass "16 MiB written and acknowledged through the cache with 4 MiB free on the backing filesystem"
tc_wait_for 60 "the destage to report the full filesystem" eval '[ "$(lun destage)" = "No space left on device" ]'
waiting=$(lun dirty_bytes_waiting)
[ "$waiting" -gt 0 ] || fail "status says the destage fails but counts $waiting dirty bytes waiting"
pass "status: destage to disk0 fails with ENOSPC, $waiting dirty bytes waiting for it"

# back off: over 8 s, a handful of attempts, one log line, little CPU
cpu() { awk -v hz="$(getconf CLK_TCK)" '{ print ($14 + $15) / hz }' "/proc/$TC_PID/stat"; }
f0=$(lun destage_failures) c0=$(cpu) l0=$(grep -c "destage to LUN disk0" "$T/daemon.log")
sleep 8
f1=$(lun destage_failures) c1=$(cpu) l1=$(grep -c "destage to LUN disk0" "$T/daemon.log")
tries=$((f1 - f0))
[ "$tries" -le 20 ] || fail "$tries failed destage attempts in 8 s: the cleaner does not back off"
[ "$((l1 - l0))" = 0 ] || fail "$((l1 - l0)) more log lines about the failing destage in 8 s (want none: once per state change)"
[ "$l1" = 1 ] || fail "the failing destage was logged $l1 times (want once)"
busy=$(python3 -c "print('%.2f' % ($c1 - $c0))")
python3 -c "import sys; sys.exit(0 if $busy < 0.8 else 1)" || fail "the daemon used $busy s of CPU in 8 s while the destage fails"
[ "$(set_dirty)" -gt 0 ] || fail "the dirty data is gone while the backing store is full"
pass "backing off: $tries attempts and no log line in 8 s, $busy s of CPU; the data stays dirty"

# while the store is full the cache takes only overwrites of what it holds:
# a write that needs new backing space gets SPACE ALLOCATION FAILED WRITE
# PROTECT at once (not absorbed as dirty data that cannot land), while
# overwrites and reads of cached blocks keep working
tc_build_tool scsi_probe
coproc PROBE { exec "$T/scsi_probe" "$url" 2>&1; }
probe() {
	echo "$*" >&"${PROBE[1]}"
	IFS= read -r -t 60 reply <&"${PROBE[0]}" || fail "scsi_probe did not answer: $*"
}
IFS= read -r -t 60 reply <&"${PROBE[0]}" && [ "$reply" = ready ] || fail "scsi_probe did not log in: $reply"
probe write 40960 256 33 # 128 KiB at 20 MiB, never written: needs new space
case "$reply" in
"check 7 27 07 "*) ;;
*) fail "a write needing new space on the full store got '$reply' (want check 7 27 07: SPACE ALLOCATION FAILED WRITE PROTECT)" ;;
esac
sense=${reply##*sense=}
[[ "$sense" =~ ^[7f]0..07 ]] && [ "${sense:24:4}" = 2707 ] ||
	fail "sense bytes $sense: want fixed format, key 7 at byte 2, 27/07 at bytes 12-13"
pass "a write needing new backing space: 07/27/07 at once ($sense)"
probe write 4096 128 77 # 64 KiB at 2 MiB: cached
[ "$reply" = good ] || fail "an overwrite of cached blocks while the store is full got '$reply'"
probe read 4096 128 77
[ "$reply" = good ] || fail "reading back the overwrite: $reply"
probe read 4224 128 5a
[ "$reply" = good ] || fail "reading cached data next to it: $reply"
pass "overwrites and reads of cached blocks work while the store is full"
probe_pid=$PROBE_PID # bash unsets PROBE_PID once the coprocess is reaped
exec {PROBE[1]}>&-
wait "$probe_pid" 2>/dev/null

# a flush says what it waits for
"$CTL" -c "$T/t.conf" flush --wait 2>"$T/flush.err" >/dev/null &
flush_pid=$!
tc_wait_for 30 "flush --wait to name the failing destage" \
	grep -q "waiting: destage to LUN disk0 fails: No space left on device" "$T/flush.err"
kill -0 "$flush_pid" 2>/dev/null || fail "flush --wait ended while the backing store is full: $(tr '\r' '\n' <"$T/flush.err" | tail -2)"
pass "flush --wait shows what it waits for: $(tr '\r' '\n' <"$T/flush.err" | grep -m1 -o 'waiting: .*')"

# space comes back: the destage resumes by itself, everything lands, the flush ends
rm -f "$T/fs/filler"
tc_wait_for 120 "the destage to work again" eval '[ "$(lun destage)" = ok ]'
tc_wait_for 120 "the dirty data to reach the backing store" eval '[ "$(set_dirty)" = 0 ]'
grep -q "destage to LUN disk0 works again" "$T/daemon.log" || fail "the recovery is not logged"
tc_wait_for 60 "flush --wait to end" tc_gone "$flush_pid"
wait "$flush_pid" || fail "flush --wait failed after space came back: $(tr '\r' '\n' <"$T/flush.err" | tail -2)"
grep -q "flush complete" "$T/flush.err" || fail "flush --wait did not report completion"
tc_stop
python3 - "$T/fs/disk0.img" <<'PY' || fail "the backing file does not hold what was written"
import sys
with open(sys.argv[1], "rb") as f:
    f.seek(2 << 20)
    d = f.read(16 << 20)
want = b"\x77" * (64 << 10) + b"\x5a" * ((16 << 20) - (64 << 10))
bad = sum(1 for a, b in zip(d, want) if a != b)
sys.exit(0 if d == want else print(f"{bad} of {len(d)} bytes differ") or 1)
PY
pass "space back: destage resumed by itself, logged once, all 16 MiB (and the overwrite) on the backing file"
