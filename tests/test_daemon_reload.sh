#!/usr/bin/env bash
# Configuration reload on SIGHUP (systemd's ExecReload): a LUN added to the
# file appears on the running target, a removed one disappears while the
# other LUN keeps serving without an error, a new target can be discovered
# and logged in to, a removed one goes away, a broken file is refused with
# FILE:LINE and the old configuration keeps serving, and the daemon still
# exits 0 on SIGTERM afterwards.
. "$(dirname "$0")/lib.sh"
tc_tmpdir
[ -n "$T" ] && [ -d "$T" ] || { echo "FAIL: cannot create a scratch directory" >&2; exit 1; }
command -v iscsi-ls >/dev/null || skip "libiscsi's iscsi-ls is not installed"
command -v qemu-io >/dev/null || skip "qemu-io not installed"
TB=$TC_ROOT/build/tierbench
TCTL=$TC_ROOT/build/tierctl
[ -x "$TB" ] || skip "build/tierbench is not built"

port=$(tc_free_port)
iqn=iqn.2026-11.io.tiercache:test
iqn2=iqn.2026-11.io.tiercache:second
base=iscsi://127.0.0.1:$port/$iqn

lun1_map="lun1 = disk1"
lun1_section="[lun disk1]
backing = $T/disk1.img
size = 32M
block_size = 512"
tgt2_section="[target $iqn2]
lun0 = disk2

[lun disk2]
backing = $T/disk2.img
size = 16M
block_size = 512"

# write_conf [with-lun1] [with-target2] [with-cached-lun2]
write_conf() {
	local with1=$1 with2=$2 with3=${3:-0}
	{
		tc_conf_head "$port"
		cat <<CONF

[target $iqn]
lun0 = disk0
CONF
		[ "$with1" = 1 ] && echo "$lun1_map"
		[ "$with3" = 1 ] && echo "lun2 = cached"
		cat <<CONF

[lun disk0]
backing = $T/disk0.img
size = 64M
block_size = 512

[cache fast]
legs = $T/leg0.img $T/leg1.img
size = 32M
extent = 256K
mode = write-back
admit_hits = 1

CONF
		[ "$with3" = 1 ] && printf '[lun cached]\nbacking = %s\nsize = 32M\nblock_size = 512\ncache = fast\n\n' "$T/cached.img"
		[ "$with1" = 1 ] && printf '%s\n\n' "$lun1_section"
		[ "$with2" = 1 ] && printf '%s\n' "$tgt2_section"
	} >"$T/t.conf.new"
	mv "$T/t.conf.new" "$T/t.conf"
}

# reload: SIGHUP, then wait for the n-th "reload:" summary or refusal line
nreload=0
reloads_at_least() {
	[ "$(grep -cE 'reload: [0-9]+ LUN\(s\) added|reload refused' "$T/daemon.log")" -ge "$1" ] && return 0
	kill -0 "$TC_PID" 2>/dev/null || fail "daemon died on SIGHUP"
	return 1
}
hup() {
	local want=$((nreload + 1))
	kill -HUP "$TC_PID" || fail "cannot send SIGHUP"
	# a reload may wait 10 s for sessions to log out and 30 s for the
	# commands of removed LUNs; the rest is room for busy cores
	tc_wait_for 90 "a reload summary in the log after SIGHUP" reloads_at_least "$want"
	nreload=$want
}

# logins_of INITIATOR: how many sessions INITIATOR logged in so far
logins_of() { grep -c ": $1 logged in to " "$T/daemon.log"; }
# logged_in INITIATOR N: at least N of them (a load is connected and busy)
logged_in() { [ "$(logins_of "$1")" -ge "$2" ]; }

# LUN numbers REPORT LUNS lists for the target, one per line
luns_of() {
	iscsi-ls -s "iscsi://127.0.0.1:$port/" 2>&1 |
		awk -v t="Target:$1" '/^Target:/ { on = ($1 == t) } on && /Lun:/ { sub(/.*Lun:/, ""); print $1 }'
}

write_conf 0 0
tc_start "$T/t.conf"
expect_eq "$(luns_of "$iqn" | tr '\n' ' ')" "0 " "at start the target reports LUN 0 only"

# ---- add lun1 ----
write_conf 1 0
hup
grep -q "reload: 1 LUN(s) added, 0 removed; 1 mapping(s) added, 0 removed; 0 target(s) added, 0 removed" \
	"$T/daemon.log" || fail "summary of adding lun1: $(grep 'reload:' "$T/daemon.log")"
pass "SIGHUP logs a summary of what it applied"
expect_eq "$(luns_of "$iqn" | tr '\n' ' ')" "0 1 " "after the reload REPORT LUNS lists LUN 0 and LUN 1"
out=$(iscsi-inq "$base/1" 2>&1) || fail "iscsi-inq on the new LUN 1: $out"
[[ "$out" == *"TIERCACH"* ]] || fail "INQUIRY of LUN 1: $out"
pass "LUN 1 answers INQUIRY"
out=$(iscsi-readcapacity16 "$base/1" 2>&1) || fail "readcapacity16 on LUN 1: $out"
[[ "$out" == *"Total size:33554432"* ]] || fail "capacity of LUN 1: $out"
pass "LUN 1 has the configured 32 MiB"
out=$(qemu-io -f raw -c 'write -P 0x3c 0 1M' -c 'write -P 0xc3 31M 1M' -c 'read -P 0x3c 0 1M' \
	-c 'read -P 0xc3 31M 1M' "$base/1" 2>&1) || fail "qemu-io on LUN 1: $out"
[[ "$out" != *"Pattern verification failed"* ]] || fail "LUN 1 pattern mismatch: $out"
pass "qemu-io writes and reads back LUN 1"
json=$("$TCTL" -c "$T/t.conf" --json status) || fail "tierctl status after adding lun1"
echo "$json" | python3 -c '
import json, sys
d = json.load(sys.stdin)
names = sorted(l["name"] for l in d["luns"])
maps = d["targets"][0]["luns"]
assert names == ["disk0", "disk1"], names
assert maps == ["lun0 = disk0", "lun1 = disk1"], maps' || fail "tierctl status does not show lun1: $json"
pass "tierctl status shows the added LUN"

# ---- remove lun1 while lun0 serves a verified read/write load (and lun1
# itself is busy: its commands in flight drain before it is closed) ----
# (each load logs in under its own initiator name, so that the daemon's log
# tells when both are connected: their commands start right after)
ini0=iqn.2026-11.test:reload-load0 ini1=iqn.2026-11.test:reload-load1
"$TB" --json --verify -w 8k-7030 -t 2 -q 8 -T 10 --size 16M --no-progress --initiator $ini0 "$base/0" \
	>"$T/load.json" 2>"$T/load.err" &
tb=$!
"$TB" -w 4k-randwrite -t 2 -q 16 -T 20 --no-progress --initiator $ini1 "$base/1" >"$T/load1.out" 2>&1 &
tb1=$!
tc_wait_for 60 "both sessions of the load on LUN 0 logged in" logged_in $ini0 2
tc_wait_for 60 "both sessions of the load on LUN 1 logged in" logged_in $ini1 2
kill -0 "$tb" 2>/dev/null || fail "the load on LUN 0 ended early: $(cat "$T/load.err")"
kill -0 "$tb1" 2>/dev/null || fail "the load on LUN 1 ended early: $(cat "$T/load1.out")"
write_conf 0 0
hup
wait "$tb"
rc=$?
tc_until 60 tc_gone "$tb1" || { kill "$tb1"; fail "the load on the removed LUN 1 did not end within 60 s"; }
wait "$tb1"
rc1=$?
[ "$rc1" != 0 ] || fail "the load on the removed LUN 1 did not notice the removal"
pass "the load on the removed LUN 1 ended with an error (exit $rc1)"
[ "$rc" = 0 ] || fail "the load on LUN 0 failed across the reload (exit $rc): $(cat "$T/load.err")"
python3 - "$T/load.json" <<'PY' || fail "load JSON: see above"
import json, sys
d = json.load(open(sys.argv[1]))
r = d["runs"][0]
if not (r["read"]["ios"] > 0 and r["write"]["ios"] > 0):
    print("FAIL: no I/O: %r" % r); sys.exit(1)
if d["verify"]["mismatches"] != 0:
    print("FAIL: %d mismatches" % d["verify"]["mismatches"]); sys.exit(1)
print("ok: %d IOPS on LUN 0 across the reload, 0 mismatches" % r["iops"])
PY
pass "LUN 0 kept serving (no error, no mismatch) while LUN 1 was removed"
grep -q "lun disk1 removed, drained and closed" "$T/daemon.log" || fail "no drain-and-close line for disk1"
pass "the removed LUN was drained and closed"
expect_eq "$(luns_of "$iqn" | tr '\n' ' ')" "0 " "REPORT LUNS no longer lists LUN 1"
out=$(iscsi-readcapacity16 "$base/1" 2>&1) && fail "READ CAPACITY on the removed LUN 1 succeeded: $out"
pass "the removed LUN 1 is refused"

# ---- a new target ----
write_conf 0 1
hup
out=$(iscsi-ls -s "iscsi://127.0.0.1:$port/" 2>&1) || fail "iscsi-ls after adding a target: $out"
[[ "$out" == *"Target:$iqn2"* ]] || fail "discovery does not list the new target: $out"
pass "discovery lists the new target"
expect_eq "$(luns_of "$iqn2" | tr '\n' ' ')" "0 " "the new target reports its LUN 0"
out=$(qemu-io -f raw -c 'write -P 0x77 0 64k' -c 'read -P 0x77 0 64k' "iscsi://127.0.0.1:$port/$iqn2/0" 2>&1) ||
	fail "qemu-io on the new target: $out"
[[ "$out" != *"Pattern verification failed"* ]] || fail "new target pattern mismatch: $out"
pass "the new target's LUN is writable and reads back"

# ---- a broken file is refused; the old configuration keeps serving ----
cp "$T/t.conf" "$T/good.conf"
sed -i '/^\[lun disk2\]$/,$ s/^block_size = 512$/block_size = 1000/' "$T/t.conf"
line=$(grep -n '^block_size = 1000$' "$T/t.conf" | cut -d: -f1)
[ -n "$line" ] || fail "test bug: no line to break"
hup
grep -qF "$T/t.conf:$line: [lun disk2] block_size = 1000: use 512 or 4096" "$T/daemon.log" ||
	fail "the refusal does not name $T/t.conf:$line: $(grep -A1 'reloading' "$T/daemon.log" | tail -n 3)"
grep -q "reload refused: the configuration in effect stays as it was" "$T/daemon.log" ||
	fail "no refusal line"
pass "a broken file is refused with FILE:LINE"
out=$(qemu-io -f raw -c 'read -P 0x77 0 64k' "iscsi://127.0.0.1:$port/$iqn2/0" 2>&1) ||
	fail "the new target stopped serving after a refused reload: $out"
out=$(qemu-io -f raw -c 'write -P 0x42 0 64k' -c 'read -P 0x42 0 64k' "$base/0" 2>&1) ||
	fail "LUN 0 stopped serving after a refused reload: $out"
[[ "$out" != *"Pattern verification failed"* ]] || fail "LUN 0 pattern mismatch: $out"
expect_eq "$(luns_of "$iqn" | tr '\n' ' ')" "0 " "the old configuration still serves after a refused reload"
json=$("$TCTL" -c "$T/good.conf" --json status) || fail "tierctl status after a refused reload"
echo "$json" | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert sorted(t["iqn"] for t in d["targets"]) == sorted(sys.argv[1:]), d["targets"]' "$iqn" "$iqn2" ||
	fail "tierctl status changed on a refused reload: $json"
pass "tierctl status is unchanged by a refused reload"

# ---- a change that needs a restart is named, the rest still applies ----
write_conf 0 1
sed -i 's/^size = 16M$/size = 8M/' "$T/t.conf"
line=$(grep -n '^\[lun disk2\]$' "$T/t.conf" | cut -d: -f1)
hup
grep -qF "$T/t.conf:$line: changing size of [lun disk2] needs a restart; the old value stays in effect" \
	"$T/daemon.log" || fail "no needs-a-restart line for the size change: $(grep 'restart' "$T/daemon.log")"
out=$(iscsi-readcapacity16 "iscsi://127.0.0.1:$port/$iqn2/0" 2>&1) || fail "readcapacity16 on the new target: $out"
[[ "$out" == *"Total size:16777216"* ]] || fail "the size change took effect without a restart: $out"
pass "a size change is logged as needing a restart and the old size stays"

# ---- a LUN behind the running cache set: added, used, removed ----
write_conf 0 1 1
hup
expect_eq "$(luns_of "$iqn" | tr '\n' ' ')" "0 2 " "a LUN with a cache volume on the running set appears as LUN 2"
out=$(qemu-io -f raw -c 'write -P 0x5a 0 2M' -c 'read -P 0x5a 0 2M' -c 'read -P 0x5a 0 2M' "$base/2" 2>&1) ||
	fail "qemu-io on the cached LUN 2: $out"
[[ "$out" != *"Pattern verification failed"* ]] || fail "cached LUN 2 pattern mismatch: $out"
pass "the cached LUN 2 writes and reads back"
"$TCTL" -c "$T/t.conf" status | grep -q "cached" || fail "tierctl status does not show the cached LUN"
write_conf 0 1 0
hup
grep -q "lun cached removed and drained" "$T/daemon.log" || fail "no drain line for the cached LUN"
# closed once nothing of it is dirty (at once, or when the cleaner is done)
cached_released() { grep -q "cache fast: lun cached is not configured and holds no dirty data: its entry is freed" "$T/daemon.log"; }
tc_wait_for 60 "the removed cached LUN closed and its entry freed" cached_released
expect_eq "$(luns_of "$iqn" | tr '\n' ' ')" "0 " "the cached LUN 2 is gone after its removal"

# ---- remove the new target while a session on it is busy ----
ini2=iqn.2026-11.test:reload-load2
"$TB" -w 4k-randread -t 1 -q 8 -T 30 --no-progress --initiator $ini2 "iscsi://127.0.0.1:$port/$iqn2/0" \
	>"$T/load2.out" 2>&1 &
tb2=$!
tc_wait_for 60 "the load on the second target logged in" logged_in $ini2 1
kill -0 "$tb2" 2>/dev/null || fail "the load on the second target ended early: $(cat "$T/load2.out")"
write_conf 0 0
hup
tc_until 60 tc_gone "$tb2" || { kill "$tb2"; fail "the session on the removed target was not closed within 60 s"; }
wait "$tb2"
grep -q "target $iqn2 was removed from the configuration; asking the initiator to log out" "$T/daemon.log" ||
	fail "the session on the removed target was not asked to log out"
grep -q "session(s) still open after" "$T/daemon.log" && fail "sessions of the removed target lingered"
pass "the busy session on the removed target was asked to log out and went away"
grep -q "reload: target $iqn2 removed" "$T/daemon.log" || fail "no removal line for $iqn2"
out=$(iscsi-ls -s "iscsi://127.0.0.1:$port/" 2>&1)
[[ "$out" != *"Target:$iqn2"* ]] || fail "discovery still lists the removed target: $out"
out=$(iscsi-inq "iscsi://127.0.0.1:$port/$iqn2/0" 2>&1) && fail "login to the removed target succeeded: $out"
pass "the removed target is gone from discovery and refuses logins"
out=$(qemu-io -f raw -c 'read -P 0x42 0 64k' "$base/0" 2>&1) || fail "LUN 0 after removing the other target: $out"
[[ "$out" != *"Pattern verification failed"* ]] || fail "LUN 0 pattern mismatch: $out"
pass "LUN 0 still reads back what was written"

tc_stop
grep -q "stopped cleanly" "$T/daemon.log" || fail "no clean-stop line in the log"
pass "SIGTERM after reloads drains and exits 0"
