#!/usr/bin/env bash
# tests/test_rbd_restart_takeover.sh - a gateway killed with the locks of
# its single-gateway RBD LUNs starts again without taking them over one
# after another.
#
# Each image's lock is still held by the dead gateway's Ceph client, so
# each LUN breaks it (a blocklist: a monitor round trip) and waits out the
# old holder's lease (3.5 s) before it serves. Checked: the takeovers run
# side by side (with 16 images the start, until the portal listens, takes
# under 10 s: 4.4-4.7 s measured; one after another it took 57 s); the
# portal opens only once every LUN serves, so the first command to each
# finds it serving (no NOT READY); the data written before the kill reads
# back.
. "$(dirname "$0")/lib.sh"
tc_tmpdir
. "$TC_ROOT/tests/ceph/lib.sh"

[ -x "$TC_BIN" ] || fail "build/tiercached is missing; run make"
tc_build_tool alua_io
IO=$T/alua_io
N=16

rbd_cluster_up
creates=()
for i in $(seq 0 $((N - 1))); do
	rbd create --size 16M --image-feature layering,exclusive-lock "$CEPH_POOL/k$i" &
	creates+=($!)
done
wait "${creates[@]}"
for i in $(seq 0 $((N - 1))); do
	rbd info "$CEPH_POOL/k$i" >/dev/null 2>&1 || fail "cannot create the RBD image k$i"
done
IQN=iqn.2026-12.io.tiercache:restart
gw_init A
{
	gw_daemon_conf A 1
	printf '\n[target %s]\n' "$IQN"
	for i in $(seq 0 $((N - 1))); do echo "lun$i = k$i"; done
	for i in $(seq 0 $((N - 1))); do rbd_conf_lun "k$i" "k$i" "serial = RESTART$i"; done
} >"$T/A.conf"
gw_start A
url() { echo "iscsi://127.0.0.1:${PORT[A]}/$IQN/$1"; }
for i in $(seq 0 $((N - 1))); do
	out=$("$IO" write "$(url "$i")" 100 16 $((0x30 + i)) 30) || fail "write to LUN $i: $out"
done
pass "$N single-gateway RBD LUNs written through A"

gw_kill9 A
for i in $(seq 0 $((N - 1))); do
	[ "$(rbd lock ls --format json "$CEPH_POOL/k$i" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')" = 1 ] ||
		fail "k$i has no lock left after the kill: nothing to wait out"
done
pass "A killed with -9: every image's lock is still held by its old client"

: >"$T/A.log"
t0=$(date +%s%N)
gw_start A
start_ms=$((($(date +%s%N) - t0) / 1000000))
waits=$(grep -c "waiting 3500 ms for the old holder's lease" "$T/A.log")
[ "$waits" = "$N" ] || fail "$waits of $N LUNs waited out the old holder's lease: $(grep -E 'breaking|waiting' "$T/A.log" | head -3)"
line=$(grep "start: every LUN that takes its image's lock holds it, after" "$T/A.log") ||
	fail "the start did not wait for the takeovers: $(tail -5 "$T/A.log")"
ms=$(echo "$line" | sed 's/.* holds it, after \([0-9]*\) ms.*/\1/')
# one after another: a break and a lease (3.5 s) each, 57 s for 16;
# side by side: about one of each
[ "$start_ms" -lt 10000 ] || fail "A took $start_ms ms to start: the $N takeovers ran one after another"
pass "the $N takeovers ran side by side: A listened $start_ms ms after it was started (the portal waited $ms ms for them)"
for i in $(seq 0 $((N - 1))); do
	out=$("$IO" read "$(url "$i")" 100 16 $((0x30 + i)) 30) || fail "LUN $i after the restart: $out"
	case $out in
	*transition=0*) ;;
	*) fail "LUN $i was not serving when the portal opened: $out" ;;
	esac
done
pass "the first command to each LUN found it serving, and the data written before the kill is there"

gw_stop A
pass "A stops cleanly on SIGTERM"
