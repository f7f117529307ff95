#!/usr/bin/env bash
# test_iscsi_chap.sh - CHAP through a real initiator (libiscsi).
#
# A target with one-way and mutual CHAP: the right user and secret log in
# (one-way, and mutual where libiscsi checks our answer with the mutual
# secret); a wrong secret, an unknown user and no credentials at all are
# refused with authentication failure; a wrong mutual secret on the
# initiator side makes libiscsi refuse us (so we really prove the mutual
# secret). Discovery sessions have CHAP of their own: refused without it,
# with a target's credentials or a wrong secret; listed with it, one-way
# and mutual. No secret ever reaches
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
discovery_chap_user = disco
discovery_chap_secret = discosecret12
discovery_mutual_user = discotgt
discovery_mutual_secret = discomutual99

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
# the login line names how the initiator authenticated (libiscsi: MD5)
grep -q "logged in to $iqn (TSIH [0-9]*, auth CHAP MD5, " "$T/daemon.log" ||
	fail "the one-way login's log line does not say 'auth CHAP MD5': $(grep -m1 'logged in to' "$T/daemon.log")"
grep -q "logged in to $iqn (TSIH [0-9]*, auth CHAP MD5 mutual, " "$T/daemon.log" ||
	fail "the mutual login's log line does not say 'auth CHAP MD5 mutual'"
pass "the login lines name the CHAP algorithm, and mutual when it was"
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

# discovery sessions have CHAP of their own ([portal] discovery_chap_*)
ls_disc() { timeout 20 iscsi-ls "iscsi://$1127.0.0.1:$port${2:-}" >"$T/ls.out" 2>&1; }
ls_disc "" && fail "discovery without credentials accepted: $(cat "$T/ls.out")"
ls_disc "alice%alicesecret123@" && fail "discovery with the target's credentials accepted: $(cat "$T/ls.out")"
ls_disc "disco%wrongsecret99@" && fail "discovery with a wrong secret accepted: $(cat "$T/ls.out")"
pass "discovery without credentials, with a target's and with a wrong secret is refused"
ls_disc "disco%discosecret12@" || fail "discovery with its credentials failed: $(cat "$T/ls.out")"
grep -q "$iqn" "$T/ls.out" || fail "discovery did not list $iqn: $(cat "$T/ls.out")"
pass "discovery with its own CHAP credentials lists the target"
ls_disc "disco%discosecret12@" "?target_user=discotgt&target_password=discomutual99" ||
	fail "mutual CHAP on discovery refused: $(cat "$T/ls.out")"
grep -q "$iqn" "$T/ls.out" || fail "mutual-CHAP discovery did not list $iqn"
ls_disc "disco%discosecret12@" "?target_user=discotgt&target_password=notthesecret1" &&
	fail "libiscsi accepted a mutual discovery answer made with another secret"
pass "mutual CHAP on discovery: libiscsi accepts our proof, and it depends on the mutual secret"
# a reload applies a new discovery secret to the next discovery login
sed -i 's/^discovery_chap_secret = .*/discovery_chap_secret = discosecret34/' "$T/t.conf"
kill -HUP "$TC_PID"
tc_wait_for 30 "the reload to finish" grep -q "reload: .* need a restart" "$T/daemon.log"
ls_disc "disco%discosecret12@" && fail "discovery with the secret the reload replaced accepted"
ls_disc "disco%discosecret34@" || fail "discovery with the reloaded secret failed: $(cat "$T/ls.out")"
pass "a reload changes the discovery secret: the old one is refused, the new one lists the target"

timeout 30 qemu-io -f raw -c 'write -P 0x5a 0 1M' -c 'read -P 0x5a 0 1M' \
	"$(url alice%alicesecret123)" >"$T/qemu.out" 2>&1 || fail "qemu-io over CHAP failed: $(cat "$T/qemu.out")"
grep -q "read 1048576/1048576" "$T/qemu.out" || fail "qemu-io did not read back its pattern"
pass "qemu-io writes and reads back 1 MiB over a CHAP session"

for s in alicesecret123 targetsecret99 wrongsecret99 notthesecret1 discosecret12 discosecret34 discomutual99; do
	grep -q "$s" "$T/daemon.log" && fail "secret '$s' appears in the daemon log"
done
pass "no CHAP secret in the daemon log"
tc_stop
