#!/usr/bin/env bash
# test_iscsi_chap.sh - CHAP through a real initiator (libiscsi).
#
# A target with one-way and mutual CHAP: the right user and secret log in
# (one-way, and mutual where libiscsi checks our answer with the mutual
# secret); a wrong secret, an unknown user and no credentials at all are
# refused with authentication failure; a wrong mutual secret on the
# initiator side makes libiscsi refuse us (so we really prove the mutual
# secret). Discovery with credentials still works. No secret ever reaches
# the daemon log, even at log_level = debug. (The reflected mutual
# challenge is refused in test_iscsi_raw_protocol.sh, which can forge it.)
. "$(dirname "$0")/lib.sh"
tc_tmpdir
command -v iscsi-inq >/dev/null || skip "libiscsi-bin not installed"

port=$(tc_free_port)
iqn=iqn.2026-11.io.tiercache:chap
cat >"$T/t.conf" <<CONF
[daemon]
state_dir = $T/state
control_socket = $T/state/control.sock
log_level = debug

[portal]
listen = 127.0.0.1:$port

[target $iqn]
lun0 = disk0
chap_user = alice
chap_secret = alicesecret123
mutual_user = tgtuser
mutual_secret = targetsecret99

[lun disk0]
backing = $T/disk0.img
size = 16M
CONF
tc_start "$T/t.conf"

url() { echo "iscsi://$1@127.0.0.1:$port/$iqn/0${2:-}"; }
inq() { timeout 20 iscsi-inq "$@" >"$T/inq.out" 2>&1; }

inq "$(url alice%alicesecret123)" || fail "one-way CHAP with the right secret refused: $(cat "$T/inq.out")"
pass "one-way CHAP with the right secret logs in"
inq "$(url alice%alicesecret123 '?target_user=tgtuser&target_password=targetsecret99')" ||
	fail "mutual CHAP refused: $(cat "$T/inq.out")"
pass "mutual CHAP: libiscsi accepts the target's proof"
inq "$(url alice%alicesecret123 '?target_user=tgtuser&target_password=notthesecret1')" &&
	fail "libiscsi accepted a mutual answer made with another secret"
pass "mutual CHAP answer depends on the mutual secret"
inq "$(url alice%wrongsecret99)" && fail "wrong CHAP secret logged in"
pass "wrong CHAP secret refused"
inq "$(url mallory%alicesecret123)" && fail "unknown CHAP user logged in"
pass "unknown CHAP user refused"
timeout 20 iscsi-inq "iscsi://127.0.0.1:$port/$iqn/0" >/dev/null 2>&1 && fail "login without credentials accepted"
pass "login without credentials refused"
# failed CHAP proofs log one line per address a minute (the unknown user's
# falls in the wrong secret's minute); the skipped authentication has its own
grep -q "refused: CHAP response does not match the secret (status 0x0201)" "$T/daemon.log" ||
	fail "the wrong secret's refusal is not logged as 0201"
grep -q "refused: .*without authenticating (status 0x0201)\|refused: .*skipped authentication (status 0x0201)" \
	"$T/daemon.log" || fail "the login without credentials is not logged as 0201"
pass "refusals logged as authentication failure (0201)"

timeout 20 iscsi-ls "iscsi://alice%alicesecret123@127.0.0.1:$port" >"$T/ls.out" 2>&1 ||
	fail "discovery with credentials failed: $(cat "$T/ls.out")"
grep -q "$iqn" "$T/ls.out" || fail "discovery did not list $iqn"
pass "discovery with credentials lists the target"

timeout 30 qemu-io -f raw -c 'write -P 0x5a 0 1M' -c 'read -P 0x5a 0 1M' \
	"$(url alice%alicesecret123)" >"$T/qemu.out" 2>&1 || fail "qemu-io over CHAP failed: $(cat "$T/qemu.out")"
grep -q "read 1048576/1048576" "$T/qemu.out" || fail "qemu-io did not read back its pattern"
pass "qemu-io writes and reads back 1 MiB over a CHAP session"

for s in alicesecret123 targetsecret99 wrongsecret99 notthesecret1; do
	grep -q "$s" "$T/daemon.log" && fail "secret '$s' appears in the daemon log"
done
pass "no CHAP secret in the daemon log"
tc_stop
