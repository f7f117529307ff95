#!/usr/bin/env bash
# tests/test_rbd_reload_rename.sh - a reload that renames an RBD LUN (same
# image, same serial, new section name) while hosts write to it.
#
# The reload opens the new LUN before it closes the old one, so for a
# moment two handles of the gateway are open on one image, both through
# the gateway's one Ceph client. The new one must not break the old one's
# lock: that would blocklist the client and fence every image on it. It
# waits, NOT READY (transition) to the host, until the old one lets go.
# Checked: a session writing to the renamed LUN, and one writing and
# reading another image's LUN, see only retried answers (UNIT ATTENTION,
# transition) across the reload; no lock is broken; the renamed LUN holds
# the image's lock through the gateway's client afterwards; every round
# of both sessions is in the images in Ceph (rbd export).
. "$(dirname "$0")/lib.sh"
tc_tmpdir
. "$TC_ROOT/tests/ceph/lib.sh"

[ -x "$TC_BIN" ] || fail "build/tiercached is missing; run make"
tc_build_tool alua_io
IO=$T/alua_io

rbd_cluster_up
for i in r1 r2; do
	rbd create --size 64M --image-feature layering,exclusive-lock "$CEPH_POOL/$i" ||
		fail "cannot create the RBD image $i"
done
IQN=iqn.2026-12.io.tiercache:rename
gw_init A
conf() { # the name of r1's LUN
	gw_daemon_conf A 1
	printf '\n[target %s]\nlun0 = %s\nlun1 = other\n' "$IQN" "$1"
	rbd_conf_lun "$1" r1 "serial = RENAME1"
	rbd_conf_lun other r2 "serial = RENAME2"
}
conf before >"$T/A.conf"
gw_start A
url() { echo "iscsi://127.0.0.1:${PORT[A]}/$IQN/$1"; }
a1=$(rbd_locker r1)
[ "$a1" != none ] && [ "$a1" = "$(rbd_locker r2)" ] || fail "A does not hold r1 and r2 through one client: $a1 / $(rbd_locker r2)"
pass "A holds r1 (lun before) and r2 (lun other) through one client ($a1)"

SLOTS=2048
sessions=("0 0 wloop" "1 0 loop")
loops=()
for n in 0 1; do
	set -- ${sessions[$n]}
	"$IO" "$3" "$(url "$1")" "$2" 8 $SLOTS "$T/stop" >"$T/loop$n.out" 2>"$T/loop$n.err" &
	loops+=($!)
	RBD_KILL_PIDS="$RBD_KILL_PIDS $!"
done
started() { grep -q started "$T/loop0.out" && grep -q started "$T/loop1.out"; }
tc_until 60 started || fail "the host sessions did not get going: $(cat "$T"/loop*.err)"
pass "a session writes to lun0 (r1), another writes and reads lun1 (r2)"

conf after >"$T/A.conf"
kill -HUP "${PID[A]}"
reloaded() { grep -qE 'reload: [0-9]+ LUN\(s\) added|reload refused' "$T/A.log"; }
tc_wait_for 120 "A's reload summary" reloaded
grep -q "reload refused" "$T/A.log" && fail "A refused the reload: $(grep 'reload refused' "$T/A.log")"
grep -q "lun before removed, drained and closed" "$T/A.log" || fail "the reload did not close lun before"
pass "reloaded: lun0 is now [lun after] on the same image"
# the renamed LUN serves (and so holds the lock) before the sessions stop
out=$("$IO" write "$(url 0)" 120000 16 0x5a 60) || fail "a write to the renamed LUN: $out"
touch "$T/stop"
for n in 0 1; do
	wait "${loops[$n]}"
	rc=$?
	out=$(tail -1 "$T/loop$n.out")
	[ "$rc" = 0 ] || fail "session $n failed across the reload (exit $rc): $(cat "$T/loop$n.err") $out"
	pass "session $n (${sessions[$n]##* }): every command GOOD or retried ($out)"
done
if grep -E "rbd:$CEPH_POOL/r[12]: (breaking the lock|.*fenced)" "$T/A.log" >"$T/broke"; then
	fail "the renamed LUN broke the old one's lock: $(head -3 "$T/broke")"
fi
grep -q "rbd:$CEPH_POOL/r1: the lock is held by another LUN of this gateway" "$T/A.log" ||
	fail "the new LUN never met the old one's lock (the test did not test it)"
n1=$(rbd_locker r1)
[ "$n1" = "$a1" ] && [ "$(rbd_locker r2)" = "$a1" ] ||
	fail "after the rename r1 is held by $n1 and r2 by $(rbd_locker r2), not A's client $a1"
pass "no lock broken, no client fenced: the new LUN waited for the old one and holds r1 through A's client"

rbd export "$CEPH_POOL/r1" "$T/0.img" >/dev/null 2>&1 || fail "cannot export r1"
rbd export "$CEPH_POOL/r2" "$T/1.img" >/dev/null 2>&1 || fail "cannot export r2"
total=0
for n in 0 1; do
	rounds=$(tail -1 "$T/loop$n.out" | sed 's/^rounds=\([0-9]*\).*/\1/')
	out=$(rbd_rounds_check "$T/$n.img" 0 "$rounds" $SLOTS)
	[ "$out" = ok ] || fail "session $n: rounds $out are not in the image in Ceph (of $rounds)"
	total=$((total + rounds))
done
pass "all $total rounds of both sessions are in the images in Ceph (rbd export)"

gw_stop A
pass "A stops cleanly on SIGTERM"
