#!/usr/bin/env bash
# The daemon validates configs with --check (FILE:LINE messages), refuses a
# port already taken with a sentence naming it, and exits 0 on SIGTERM.
. "$(dirname "$0")/lib.sh"
tc_tmpdir

out=$("$TC_BIN" -c config/examples/quickstart.conf --check 2>&1) || fail "--check refused the quickstart config: $out"
[[ "$out" == *"configuration OK"* ]] || fail "--check printed: $out"
pass "--check accepts config/examples/quickstart.conf"

cat >"$T/bad.conf" <<'CONF'
[portal]
listen = 127.0.0.1:3260

[lun a]
backing = /tmp/x
block_size = 1000
CONF
out=$("$TC_BIN" -c "$T/bad.conf" --check 2>&1)
rc=$?
expect_eq "$rc" 1 "--check exits 1 on a bad config"
[[ "$out" == "$T/bad.conf:6: [lun a] block_size = 1000: use 512 or 4096" ]] || fail "unexpected message: $out"
pass "bad config names file, line and fix"

out=$("$TC_BIN" -c "$T/missing.conf" 2>&1)
[[ "$out" == *"missing.conf: cannot open the configuration file"* ]] || fail "missing file message: $out"
pass "missing config file is named"

port=$(tc_free_port)
tc_basic_conf "$port" >"$T/t.conf"
tc_start "$T/t.conf"
[ -f "$T/disk0.img" ] || fail "backing file was not created"
expect_eq "$(stat -c %s "$T/disk0.img")" 67108864 "backing created at the configured size"
[ "$(stat -c %b "$T/disk0.img")" -lt 1024 ] || fail "backing file is not sparse"
pass "backing file is sparse"

# a second daemon on the same port is refused with a clear sentence
tc_basic_conf "$port" | sed "s#disk0.img#other.img#; s#$T/state#$T/state2#g" >"$T/t2.conf"
out=$(timeout 60 "$TC_BIN" -c "$T/t2.conf" 2>&1)
rc=$?
[ "$rc" != 0 ] || fail "second daemon on a taken port started"
[[ "$out" == *"127.0.0.1:$port"* ]] || fail "port clash message does not name the address: $out"
pass "port in use is refused naming 127.0.0.1:$port"

serial1=$(cat "$T"/state/lun-disk0.serial)

# tierctl reaches the daemon over the root-only control socket
expect_eq "$(stat -c %a "$T/state/control.sock")" 600 "control socket is mode 0600"
out=$("$TC_ROOT/build/tierctl" -c "$T/t.conf" status) || fail "tierctl status failed: $out"
[[ "$out" == *"iqn.2026-11.io.tiercache:test"* && "$out" == *"serial: $serial1"* ]] || fail "tierctl status: $out"
pass "tierctl status shows the target and the LUN's serial"
json=$("$TC_ROOT/build/tierctl" -c "$T/t.conf" --json status) || fail "tierctl --json status failed"
echo "$json" | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["ok"] and d["luns"][0]["name"]=="disk0"' ||
	fail "tierctl --json is not the expected JSON: $json"
pass "tierctl --json status is machine-readable"
"$TC_ROOT/build/tierctl" -s "$T/nowhere.sock" status 2>"$T/err"
expect_eq "$?" 3 "tierctl exits 3 when the daemon is unreachable"
grep -q "cannot reach tiercached at $T/nowhere.sock" "$T/err" || fail "unreachable message: $(cat "$T/err")"
tc_stop
grep -q "stopped cleanly" "$T/daemon.log" || fail "no clean-stop line in the log"
pass "SIGTERM drains and exits 0"

tc_start "$T/t.conf"
expect_eq "$(cat "$T"/state/lun-disk0.serial)" "$serial1" "auto serial is stable across restarts"
tc_stop

# --check reads the cache legs' on-disk format too: a set written by a newer
# tiercached (a format this one cannot read) fails it, so neither the unit's
# ExecStartPre nor the package's upgrade ever starts this version on it
port=$(tc_free_port)
{
	tc_basic_conf "$port"
	cat <<CONF
cache = fast

[cache fast]
legs = $T/leg0.img $T/leg1.img
size = 16M
mode = write-back
CONF
} >"$T/c.conf"
out=$("$TC_BIN" -c "$T/c.conf" --check 2>&1) || fail "--check refused legs not made yet: $out"
tc_start "$T/c.conf"
tc_stop
out=$("$TC_BIN" -c "$T/c.conf" --check 2>&1) || fail "--check refused the set this build made: $out"
# the superblock copies (4 KiB each at 0 and 4096): version, after the 8-byte magic
for off in 8 4104; do
	printf '\x63\x00\x00\x00' | dd of="$T/leg1.img" bs=1 seek=$off conv=notrunc status=none
done
out=$("$TC_BIN" -c "$T/c.conf" --check 2>&1)
expect_eq "$?" 1 "--check exits 1 on a leg of a newer on-disk format"
[[ "$out" == *"[cache fast] leg $T/leg1.img holds a cache set of on-disk format version 99, newer than this tiercached reads"* ]] ||
	fail "--check on a newer format: $out"
pass "--check refuses a leg holding an on-disk format newer than it reads, naming the leg"
