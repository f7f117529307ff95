#!/usr/bin/env bash
# test_iscsi_acl.sh - a target's allow list is enforced at login and in
# discovery.
#
# Two targets: one restricted to iqn.2026-11.test:good, one open. An
# initiator outside the list cannot log in (status 0202, authorization
# failure) and does not see the restricted target in SendTargets, while it
# still sees and uses the open one; the allowed initiator sees both and
# reads and writes the restricted LUN.
. "$(dirname "$0")/lib.sh"
tc_tmpdir
command -v iscsi-ls >/dev/null || skip "libiscsi-bin not installed"

port=$(tc_free_port)
secret=iqn.2026-11.io.tiercache:restricted
open=iqn.2026-11.io.tiercache:open
good=iqn.2026-11.test:good
bad=iqn.2026-11.test:stranger
cat >"$T/t.conf" <<CONF
[daemon]
state_dir = $T/state
control_socket = $T/state/control.sock

[portal]
listen = 127.0.0.1:$port

[target $secret]
lun0 = disk0
allow = $good, iqn.2026-11.test:other

[target $open]
lun0 = disk1

[lun disk0]
backing = $T/disk0.img
size = 16M

[lun disk1]
backing = $T/disk1.img
size = 16M
CONF
tc_start "$T/t.conf"

timeout 20 iscsi-ls -i $bad "iscsi://127.0.0.1:$port" >"$T/ls-bad" 2>&1 || fail "discovery failed: $(cat "$T/ls-bad")"
grep -q "$secret" "$T/ls-bad" && fail "an initiator outside the allow list sees $secret"
grep -q "$open" "$T/ls-bad" || fail "the open target is missing from discovery"
pass "SendTargets hides the restricted target from a stranger"

timeout 20 iscsi-ls -i $good "iscsi://127.0.0.1:$port" >"$T/ls-good" 2>&1 || fail "discovery failed"
grep -q "$secret" "$T/ls-good" && grep -q "$open" "$T/ls-good" || fail "allowed initiator does not see both targets"
pass "the allowed initiator sees both targets"

timeout 20 iscsi-inq -i $bad "iscsi://127.0.0.1:$port/$secret/0" >/dev/null 2>&1 &&
	fail "an initiator outside the allow list logged in"
grep -q "$bad.*0x0202" "$T/daemon.log" || fail "refusal not logged with status 0202"
pass "login from outside the allow list refused with authorization failure (0202)"

timeout 20 iscsi-inq -i $bad "iscsi://127.0.0.1:$port/$open/0" >/dev/null || fail "stranger cannot use the open target"
pass "the stranger still uses the open target"

timeout 30 qemu-io --image-opts -c 'write -P 0x3c 0 1M' -c 'read -P 0x3c 0 1M' \
	"driver=iscsi,transport=tcp,portal=127.0.0.1:$port,target=$secret,lun=0,initiator-name=$good" \
	>"$T/qemu.out" 2>&1 || fail "allowed initiator cannot write: $(cat "$T/qemu.out")"
grep -q "read 1048576/1048576" "$T/qemu.out" || fail "pattern not read back"
pass "the allowed initiator writes and reads back 1 MiB"

timeout 20 iscsi-inq -i iqn.2026-11.io.tiercache:nosuch "iscsi://127.0.0.1:$port/iqn.2026-11.io.tiercache:nosuch/0" \
	>/dev/null 2>&1 && fail "login to an unknown target succeeded"
grep -q "0x0203" "$T/daemon.log" || fail "unknown target not refused with 0203"
pass "unknown target refused with not found (0203)"
tc_stop
