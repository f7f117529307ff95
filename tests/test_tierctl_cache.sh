#!/usr/bin/env bash
# tierctl drives a live cache set: status shows dirty data after write-back
# writes, flush --wait destages it all (the backing file itself then holds
# the data), mode and detach switch a LUN online with data intact, a leg
# taken out with leg fail is resynced by leg replace, and bad requests
# (unknown LUN, mode or set; replacing a healthy leg; failing the last
# healthy one) are refused with a sentence.
. "$(dirname "$0")/lib.sh"
tc_tmpdir
command -v qemu-io >/dev/null || skip "qemu-io not installed"
ctl() { "$TC_ROOT/build/tierctl" -c "$T/t.conf" "$@"; }
jget() { python3 -c "import json,sys; d=json.load(sys.stdin); print(eval(sys.argv[1]))" "$1"; }

port=$(tc_free_port)
url=iscsi://127.0.0.1:$port/iqn.2026-11.io.tiercache:test/0
{
	tc_basic_conf "$port" 64M
	cat <<CONF
cache = fast

[cache fast]
legs = $T/leg0.img $T/leg1.img
size = 32M
mode = write-back
CONF
} >"$T/t.conf"
tc_start "$T/t.conf"

# 8 MiB of random data written as 16 chunks in reverse order: not one
# sequential stream, so write-back absorbs it instead of bypassing.
head -c 8M /dev/urandom >"$T/rand.img"
args=()
for i in $(seq 15 -1 0); do
	dd if="$T/rand.img" of="$T/chunk$i" bs=512k skip=$i count=1 status=none
	args+=(-c "write -s $T/chunk$i $((i * 512))k 512k")
done
qemu-io -f raw "${args[@]}" "$url" >/dev/null || fail "qemu-io chunked write"
dirty=$(ctl --json status | jget 'd["caches"][0]["dirty_bytes"]')
[ "$dirty" -gt 0 ] || fail "no dirty bytes after 8 MiB of write-back writes (dirty=$dirty)"
pass "status shows $dirty dirty bytes after write-back writes"

# the global options also work after the command, where people type them
after=$("$TC_ROOT/build/tierctl" status --json -c "$T/t.conf" | jget 'd["caches"][0]["name"]') ||
	fail "tierctl status --json -c CONFIG (options after the command) failed"
[ "$after" = fast ] || fail "tierctl status --json -c CONFIG answered $after, not the set fast"
"$TC_ROOT/build/tierctl" status --config="$T/t.conf" | grep -q '^ *name: *fast' ||
	fail "tierctl status --config=CONFIG did not print the plain status"
pass "tierctl status --json -c CONFIG works as tierctl -c CONFIG --json status"
# what was sent to each leg: sixteen 512 KiB writes went to both; with the
# write cache off each was made durable (FUA, or a flush after it)
io=$(ctl --json status | jget '[(l["io"]["writes"] >= 16, l["io"]["fua_writes"] + l["io"]["flushes"] >= 16) for l in d["caches"][0]["legs"]]')
expect_eq "$io" "[(True, True), (True, True)]" "status counts the writes, and the durable ones, sent to each leg"
r0=$(ctl --json status | jget 'sum(l["io"]["reads"] for l in d["caches"][0]["legs"])')
qemu-io -f raw -c "read 0 512k" "$url" >/dev/null || fail "qemu-io read"
r1=$(ctl --json status | jget 'sum(l["io"]["reads"] for l in d["caches"][0]["legs"])')
[ $((r1 - r0)) -ge 1 ] || fail "a read hit sent no read to a leg ($r0 -> $r1)"
pass "status counts the reads sent to the legs ($((r1 - r0)) for one 512 KiB read hit)"
expect_eq "$(ctl --json status | jget '[len(d["caches"][0]["lost_ranges"]), d["caches"][0]["lost_ranges_dropped"]]')" \
	"[0, 0]" "status lists no lost ranges while both legs are healthy"

out=$(ctl flush --wait 2>&1) || fail "tierctl flush --wait: $out"
[[ "$out" == *"flush complete"* ]] || fail "flush --wait did not report completion: $out"
expect_eq "$(ctl --json status | jget 'd["caches"][0]["dirty_bytes"]')" 0 "no dirty data after flush --wait"
cmp <(head -c 8M "$T/disk0.img") "$T/rand.img" || fail "after flush the backing file does not hold the data"
pass "flush destaged everything into the backing file"

for m in write-through write-around pass-through write-back; do
	ctl mode disk0 $m >/dev/null || fail "tierctl mode disk0 $m"
	expect_eq "$(ctl --json status | jget 'd["caches"][0]["luns"][0]["mode"]')" "$m" "mode switched to $m"
	qemu-img convert -f raw -O raw "$url" "$T/back.img" || fail "read in $m"
	cmp <(head -c 8M "$T/back.img") "$T/rand.img" || fail "data differs in $m"
done
pass "data intact across online mode switches"

qemu-io -f raw -c 'write -P 0x77 0 1M' "$url" >/dev/null || fail "write before detach"
ctl detach disk0 >/dev/null || fail "tierctl detach"
expect_eq "$(ctl --json status | jget 'd["caches"][0]["luns"][0]["mode"]')" pass-through "detach runs the LUN uncached"
cmp <(head -c 1M "$T/disk0.img") <(head -c 1M /dev/zero | tr '\0' '\167') || fail "detach did not flush dirty data first"
pass "detach flushed, then went pass-through"
ctl mode disk0 write-back >/dev/null

# Replacing a healthy leg is refused; an admin (or the NVMe health monitor,
# through the same call) takes it out of service first, then replaces it.
out=$(ctl leg replace fast "$T/leg1.img" "$T/leg1-new.img" 2>&1)
expect_eq "$?" 1 "replacing a healthy leg is refused"
[[ "$out" == *"is healthy; only a failed leg can be replaced"* ]] || fail "message: $out"
ctl leg fail fast "$T/leg1.img" >/dev/null || fail "tierctl leg fail"
set_state_is() { [ "$(ctl --json status | jget 'd["caches"][0]["state"]')" = "$1" ]; }
tc_wait_for 60 "the set degraded after leg fail" set_state_is degraded
pass "set degraded after leg fail"
expect_eq "$(ctl --json status | jget 'd["caches"][0]["legs"][1]["health"]')" failed "leg1 failed"
out=$(ctl leg fail fast "$T/leg0.img" 2>&1)
expect_eq "$?" 1 "failing the last healthy leg is refused"
[[ "$out" == *"is the last healthy leg"* ]] || fail "message: $out"
qemu-io -f raw -c 'write -P 0x42 2M 1M' "$url" >/dev/null || fail "write while degraded"
ctl leg replace fast "$T/leg1.img" "$T/leg1-new.img" >/dev/null || fail "tierctl leg replace"
tc_wait_for 60 "the set healthy again after the resync" set_state_is healthy
pass "set healthy again after the resync"
expect_eq "$(ctl --json status | jget 'd["caches"][0]["legs"][1]["path"]')" "$T/leg1-new.img" "new leg in place"
out=$(qemu-io -f raw -c 'read -P 0x77 0 1M' -c 'read -P 0x42 2M 1M' "$url" 2>&1)
[[ "$out" != *"verification failed"* ]] || fail "data after leg replace: $out"
pass "leg fail, then leg replace resyncs online with data intact"

out=$(ctl mode nosuch write-back 2>&1)
expect_eq "$?" 1 "unknown LUN refused"
[[ "$out" == *'no LUN named "nosuch"'* ]] || fail "message: $out"
out=$(ctl mode disk0 turbo 2>&1)
[[ "$out" == *'unknown mode "turbo"'* ]] || fail "message: $out"
out=$(ctl leg replace nope a b 2>&1)
[[ "$out" == *'no cache set named "nope"'* ]] || fail "message: $out"
pass "bad requests are refused with a sentence"
tc_stop

# The replacement is recorded in the legs' superblocks: a restart keeps it.
sed -i "s#legs = .*#legs = $T/leg0.img $T/leg1-new.img#" "$T/t.conf"
tc_start "$T/t.conf"
expect_eq "$(ctl --json status | jget 'd["caches"][0]["state"]')" healthy "healthy after a restart on the new leg"
out=$(qemu-io -f raw -c 'read -P 0x77 0 1M' -c 'read -P 0x42 2M 1M' "$url" 2>&1)
[[ "$out" != *"verification failed"* ]] || fail "data after restart: $out"
tc_stop

# Back to a configuration that lists the replaced leg: its contents are stale
# (it missed the writes since leg fail) but its superblock is a good one of
# this set. The superblocks name the member at each index, so it stays out.
sed -i "s#legs = .*#legs = $T/leg0.img $T/leg1.img#" "$T/t.conf"
tc_start "$T/t.conf"
expect_eq "$(ctl --json status | jget 'd["caches"][0]["state"], d["caches"][0]["legs"][1]["health"]')" \
	"('degraded', 'failed')" "a restart listing the replaced leg keeps it out (degraded)"
grep -q "leg $T/leg1.img is not the device the set last recorded" "$T/daemon.log" ||
	fail "the log does not say why the old leg is out"
out=$(qemu-io -f raw -c 'read -P 0x77 0 1M' -c 'read -P 0x42 2M 1M' "$url" 2>&1)
[[ "$out" != *"verification failed"* ]] || fail "data with the replaced leg listed: $out"
pass "the replaced leg is never read, data intact"
tc_stop

sed -i "s#legs = .*#legs = $T/leg0.img $T/leg1-new.img#" "$T/t.conf"

# A blank leg at a place the set records as failed (here: the replaced leg
# listed above kept it so) is rebuilt at start, with the data intact: a
# drive swapped for a failed one while the daemon was stopped.
rm -f "$T/leg1-new.img"
tc_start "$T/t.conf"
grep -q "leg $T/leg1-new.img is blank or was being rebuilt" "$T/daemon.log" || fail "no rebuild of the blank leg at start"
tc_wait_for 60 "the set healthy after rebuilding the blank leg" set_state_is healthy
out=$(qemu-io -f raw -c 'read -P 0x77 0 1M' -c 'read -P 0x42 2M 1M' "$url" 2>&1)
[[ "$out" != *"verification failed"* ]] || fail "data after the rebuild: $out"
pass "a blank leg is rebuilt at start, data intact"
# kill -9 in the middle of a rebuild: the leg still carries the rebuild
# mark and the next start rebuilds it. A 32 MiB leg copies in tens of ms:
# poll for the mark and kill at once; try again if the copy won the race.
magic() { dd if="$T/leg1-new.img" bs=1 skip="$1" count=8 status=none 2>/dev/null | tr -d '\0'; }
marked() { [ "$(magic 0)" = TREBILD1 ] || [ "$(magic 4096)" = TREBILD1 ]; }
cut=0
for attempt in 1 2 3 4 5 6 7 8 9 10; do
	ctl leg fail fast "$T/leg1-new.img" >/dev/null || fail "tierctl leg fail of the rebuilt leg"
	tc_wait_for 60 "the set degraded after leg fail" set_state_is degraded
	tc_stop
	rm -f "$T/leg1-new.img"
	"$TC_BIN" -c "$T/t.conf" >>"$T/daemon.log" 2>&1 &
	TC_PID=$!
	for ((i = 0; i < 20000; i++)); do
		marked && break
		kill -0 "$TC_PID" 2>/dev/null || break
	done
	kill -KILL "$TC_PID"
	wait "$TC_PID" 2>/dev/null
	TC_PID=
	if marked; then
		cut=$attempt
		break
	fi
	tc_start "$T/t.conf" # the copy finished first: again
	tc_wait_for 60 "the set healthy after a finished rebuild" set_state_is healthy
done
[ "$cut" -gt 0 ] || fail "no kill -9 landed inside a rebuild in 10 attempts"
pass "kill -9 inside a rebuild (attempt $cut): the new leg carries the rebuild mark"
tc_start "$T/t.conf"
tc_wait_for 60 "the set healthy after a kill -9 during the rebuild" set_state_is healthy
out=$(qemu-io -f raw -c 'read -P 0x77 0 1M' -c 'read -P 0x42 2M 1M' "$url" 2>&1)
[[ "$out" != *"verification failed"* ]] || fail "data after kill -9 during the rebuild: $out"
pass "after kill -9 during a rebuild the restart finishes it, data intact"
tc_stop

# A blank leg where the set thought the leg healthy is refused: the good
# drive may be the one that is missing.
rm -f "$T/leg1-new.img"
out=$(timeout 60 "$TC_BIN" -c "$T/t.conf" 2>&1)
[[ "$out" == *"is blank but leg"* ]] || fail "a blank leg at a healthy place was not refused: $out"
pass "a blank leg where the set recorded a healthy one is refused"
