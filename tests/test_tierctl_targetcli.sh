#!/usr/bin/env bash
# tierctl -c CONF targetcli prints, from the config file alone, the targetcli
# commands for every LUN (user:tiercache backstore with size, serial, block
# size) and target (portals, LUN numbers, ACLs with CHAP, or demo mode).
. "$(dirname "$0")/lib.sh"
tc_tmpdir
mkdir -p "$T/state"
echo 00c0ffee00c0ffee >"$T/state/lun-logs.serial"
truncate -s 32M "$T/scratch.img"
cat >"$T/t.conf" <<CONF
[daemon]
state_dir = $T/state
[portal]
listen = 192.0.2.10:3260
listen = [2001:db8::10]:3260
[target iqn.2026-11.io.tiercache:db]
lun0 = db
lun3 = logs
allow = iqn.1994-05.com.redhat:client1 iqn.1991-05.com.microsoft:win1
chap_user = alice
chap_secret = 12-to-16-chars!
mutual_user = tgt
mutual_secret = another-secret-1
[target iqn.2026-11.io.tiercache:open]
lun0 = scratch
[lun db]
backing = $T/db.img
size = 1G
serial = DB0001
[lun logs]
backing = $T/logs.img
size = 64M
block_size = 4096
[lun scratch]
backing = $T/scratch.img
CONF
out=$("$TC_ROOT/build/tierctl" -c "$T/t.conf" targetcli 2>"$T/notes") || fail "tierctl targetcli failed: $out"
echo "$out"
grep -v '^/' <<<"$out" | grep -vx saveconfig && fail "stdout holds something targetcli cannot run (it has no comments)"
grep -q "^note: \[lun scratch\]: serial = auto" "$T/notes" || fail "no note about the unmade serial: $(cat "$T/notes")"
pass "stdout is pure targetcli commands; advice goes to stderr as note: lines"
want() { grep -qxF -- "$1" <<<"$out" || fail "missing line: $1"; }
want "/backstores/user:tiercache create name=db size=1073741824 cfgstring=db wwn=DB0001"
want "/backstores/user:tiercache create name=logs size=67108864 cfgstring=logs wwn=00c0ffee00c0ffee control=hw_block_size=4096"
want "/backstores/user:tiercache create name=scratch size=33554432 cfgstring=scratch"
pass "one user:tiercache backstore per LUN: size (also measured from an existing file), serial, block size"
want "/iscsi create iqn.2026-11.io.tiercache:db"
want "/iscsi/iqn.2026-11.io.tiercache:db/tpg1/portals delete 0.0.0.0 3260"
want "/iscsi/iqn.2026-11.io.tiercache:db/tpg1/portals create 192.0.2.10 3260"
want "/iscsi/iqn.2026-11.io.tiercache:db/tpg1/portals create 2001:db8::10 3260"
want "/iscsi/iqn.2026-11.io.tiercache:db/tpg1/luns create /backstores/user:tiercache/logs lun=3"
pass "targets get their portals from [portal] and LUN numbers from lunN"
want "/iscsi/iqn.2026-11.io.tiercache:db/tpg1 set attribute generate_node_acls=0 authentication=1"
want "/iscsi/iqn.2026-11.io.tiercache:db/tpg1/acls create iqn.1991-05.com.microsoft:win1"
want "/iscsi/iqn.2026-11.io.tiercache:db/tpg1/acls/iqn.1994-05.com.redhat:client1 set auth userid=alice password=12-to-16-chars! mutual_userid=tgt mutual_password=another-secret-1"
pass "allow list becomes ACLs, each with one-way and mutual CHAP"
want "/iscsi/iqn.2026-11.io.tiercache:open/tpg1 set attribute generate_node_acls=1 demo_mode_write_protect=0 cache_dynamic_acls=1 authentication=0"
want "saveconfig"
pass "a target without allow list is opened in demo mode; the script ends with saveconfig"
[ "$(grep -c '^/backstores' <<<"$out")" = 3 ] || fail "expected 3 backstores"

# [tcmu] portal: LIO gets its own addresses, tiercached keeps [portal] listen
{ cat "$T/t.conf"; printf '[tcmu]\nenable = yes\ndbus = yes\nportal = 0.0.0.0:3260\n'; } >"$T/t2.conf"
out=$("$TC_ROOT/build/tierctl" -c "$T/t2.conf" targetcli 2>/dev/null) || fail "tierctl targetcli (t2) failed"
want "/backstores/user:tiercache create name=db size=1073741824 cfgstring=db wwn=DB0001 control=nl_reply_supported=-1"
want "/backstores/user:tiercache create name=logs size=67108864 cfgstring=logs wwn=00c0ffee00c0ffee control=hw_block_size=4096,nl_reply_supported=-1"
pass "with [tcmu] dbus (tcmu-runner beside us) LIO is told not to wait for a handler's answer"
want "/iscsi/iqn.2026-11.io.tiercache:db/tpg1/portals create 0.0.0.0 3260"
grep -q "portals create 192.0.2.10" <<<"$out" && fail "[portal] listen leaked into LIO's portals with [tcmu] portal set"
pass "[tcmu] portal gives LIO its own portal addresses"

"$TC_ROOT/build/tierctl" targetcli 2>"$T/err"
expect_eq "$?" 2 "targetcli without -c is a usage error"
grep -q "needs the config: tierctl -c CONFIG targetcli" "$T/err" || fail "message: $(cat "$T/err")"
printf '[lun x]\nbacking = %s/missing.img\n' "$T" >"$T/nosize.conf"
"$TC_ROOT/build/tierctl" -c "$T/nosize.conf" targetcli >/dev/null 2>"$T/err"
expect_eq "$?" 1 "a LUN of unknown size is refused"
grep -q "nosize.conf:1: \[lun x\] gives no size" "$T/err" || fail "message: $(cat "$T/err")"
pass "the refusal names FILE:LINE and the fix"
