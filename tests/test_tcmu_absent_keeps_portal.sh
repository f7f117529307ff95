#!/usr/bin/env bash
# [tcmu] enable = yes on a kernel without target_core_user: the daemon says so
# in one line and keeps serving its own portal; tierctl status reports TCMU
# as not enabled. Bad [tcmu] keys are refused with FILE:LINE.
. "$(dirname "$0")/lib.sh"
tc_tmpdir
[ -e /sys/module/target_core_user ] && skip "target_core_user is loaded here; tests/system/run-vm-tcmu.sh covers LIO"

port=$(tc_free_port)
{ tc_basic_conf "$port"; printf '\n[tcmu]\nenable = yes\n'; } >"$T/t.conf"
tc_start "$T/t.conf"
lines=$(grep -c "target_core_user" "$T/daemon.log")
expect_eq "$lines" 1 "one log line about the missing target_core_user"
grep -q "warning: tcmu: \[tcmu\] enable = yes, but the kernel module target_core_user is not loaded (modprobe target_core_user); LIO user:tiercache backstores are not served, the built-in portal is" "$T/daemon.log" ||
	fail "the line does not say what is missing and what still works: $(grep target_core_user "$T/daemon.log")"
pass "the line names the module, the fix and what still works"
out=$(iscsi-inq "iscsi://127.0.0.1:$port/iqn.2026-11.io.tiercache:test/0" 2>&1) || fail "portal not serving: $out"
[[ "$out" == *TIERCACH* ]] || fail "INQUIRY over the portal: $out"
pass "the built-in portal still serves the LUN"
json=$("$TC_ROOT/build/tierctl" -c "$T/t.conf" --json status) || fail "tierctl status failed"
echo "$json" | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["tcmu"]["enabled"] is False and d["tcmu"]["devices"] == []' ||
	fail "tierctl status tcmu: $json"
pass "tierctl status: tcmu enabled false, no devices"
tc_stop

printf '[tcmu]\nenable = maybe\n' >"$T/bad.conf"
out=$("$TC_BIN" -c "$T/bad.conf" --check 2>&1)
expect_eq "$out" "$T/bad.conf:2: [tcmu] enable = maybe: use yes or no" "bad [tcmu] enable is refused with FILE:LINE"
printf '[tcmu]\nsubtype = x\n' >"$T/bad2.conf"
out=$("$TC_BIN" -c "$T/bad2.conf" --check 2>&1)
expect_eq "$out" "$T/bad2.conf:2: [tcmu] has no key \"subtype\"; known keys: enable, dbus, portal" "unknown [tcmu] key is refused"
