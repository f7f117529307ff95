#!/usr/bin/env bash
# tests/test_rbd_gateways_mismatch.sh - a LUN configured for several
# gateways never reads past, nor takes the image from, a gateway that runs
# the image as its only gateway.
#
# Gateway A exports image m alone (gateways = 1) with a write-back cache:
# what hosts write may sit only in A's cache for a while. Gateway B is
# misconfigured with gateways = 2 on the same image. B must not answer a
# READ from Ceph past A's cache (it could be stale), nor break A's lock on
# a write (A's cached writes would be cut off from the image). B's LUN has
# a write-through cache of its own (its unowned reads ask the image's
# driver through the cache volume). Checked:
#  - a READ and a WRITE through B are refused NOT READY (ALUA transition,
#    which hosts retry; B never serves them), A keeps the lock, and B's
#    log says why and how to fix it;
#  - A still serves what it was written;
#  - after A stops, the image's owner key still names A's single-gateway
#    run, so B still refuses (A's cache may hold dirty data until A comes
#    back); removing the key, as the log says, lets B take the image.
. "$(dirname "$0")/lib.sh"
tc_tmpdir
. "$TC_ROOT/tests/ceph/lib.sh"

[ -x "$TC_BIN" ] || fail "build/tiercached is missing; run make"
tc_build_tool alua_io
IO=$T/alua_io

rbd_cluster_up
rbd create --size 64M --image-feature layering,exclusive-lock "$CEPH_POOL/m" || fail "cannot create the RBD image m"
IQN=iqn.2026-12.io.tiercache:mismatch
gw_init A B
{
	gw_daemon_conf A 1
	printf '\n[target %s]\nlun0 = m\n' "$IQN"
	rbd_conf_lun m m "serial = MISMATCH1" "cache = wb"
	cat <<CONF

[cache wb]
legs = $T/A/leg0 $T/A/leg1
size = 64M
extent = 64K
mode = write-back
CONF
} >"$T/A.conf"
{
	gw_daemon_conf B 2
	printf '\n[target %s]\nlun0 = m\n' "$IQN"
	rbd_conf_lun m m "serial = MISMATCH1" "gateways = 2" "cache = wt"
	cat <<CONF

[cache wt]
legs = $T/B/leg0 $T/B/leg1
size = 64M
extent = 64K
mode = write-through
CONF
} >"$T/B.conf"
url() { echo "iscsi://127.0.0.1:${PORT[$1]}/$IQN/0"; }

gw_start A
out=$("$IO" write "$(url A)" 1000 16 0xa1 30) || fail "write through A: $out"
a=$(rbd_locker m)
[ "$a" != none ] || fail "A holds no lock on m"
pass "A runs m alone with a write-back cache and holds its lock ($a)"

gw_start B
refused() { # WHAT OUT RC
	[ "$3" = 2 ] && [[ "$2" == *"sense 2/04/0a"* ]] ||
		fail "$1 through B was not refused NOT READY (exit $3): $2"
}
# (alua_io retries NOT READY transition for 2 s, then gives up)
out=$("$IO" read "$(url B)" 1000 16 0xa1 2 2>&1)
refused "a READ" "$out" $?
out=$("$IO" write "$(url B)" 2000 16 0xb2 2 2>&1)
refused "a WRITE" "$out" $?
[ "$(rbd_locker m)" = "$a" ] || fail "B's write moved m's lock: $(rbd_locker m), was $a"
grep -q "runs this image as its only gateway (gateways = 1)" "$T/B.log" ||
	fail "B did not say why it refused: $(grep "rbd:$CEPH_POOL/m" "$T/B.log" | tail -3)"
pass "B (gateways = 2) refuses reads and writes NOT READY and leaves A's lock alone"
out=$("$IO" read "$(url A)" 1000 16 0xa1 30) || fail "read through A: $out"
pass "A still serves what it was written"

gw_stop A
out=$("$IO" write "$(url B)" 2000 16 0xb2 2 2>&1)
refused "a WRITE after A stopped" "$out" $?
pass "with A stopped, B still refuses (A's cache may hold the image's newest data)"

rbd image-meta remove "$CEPH_POOL/m" tiercache.owner || fail "cannot remove the owner key"
# B reads the key again within a second (and retried transitions until then)
out=$("$IO" write "$(url B)" 2000 16 0xb2 60) || fail "write through B once the key is gone: $out"
out=$("$IO" read "$(url B)" 2000 16 0xb2 60) || fail "read back through B: $out"
pass "once the key is removed (as B's log says), B takes m and serves it"

gw_stop B
pass "B stops cleanly"
