#!/usr/bin/env bash
# tests/system/vm-failover-host.sh - the host side of step 12 of
# tests/system/run-vm-initiator.sh: a Linux host with dm-multipath (ALUA,
# the settings README.md documents) on two gateways of one RBD image loses
# the owner to kill -9 under fio verify load. How long its I/O paused (the
# longest gap between two completions in fio's per-I/O log) is printed and
# held to the 10 s goal, and no I/O may fail.
#
# Run by run-vm-initiator.sh's check with the guest up (DBGPORT set): a
# loopback Ceph cluster and gateways A (port group 1) and B (port group 2)
# start here on the host, where the guest reaches them at 10.0.2.2; a first
# write through A makes A the owner. The guest's part is /sbin/ini-steps
# step12 up|load|after|back:
#   up     log in to both, multipath: A's path optimized, B's non-optimized;
#   load   fio with crc32c verify on the map (writes on A's path only);
#   (here) kill -9 A;
#   after  fio ends with no error and its verify passes; the writes moved to
#          B; B's path optimized; the pause;
#   (here) B owns the image; restart A;
#   back   A's session returns by itself as non-optimized, I/O stays on B.
# Round 2 freezes the owner B instead (SIGSTOP: nothing answers, no
# connection closes) and thaws it once A has taken over, while fio still
# writes; the pause is printed and must stay below what the SCSI command
# timeout would give.
. "$(dirname "$0")/../lib.sh"
tc_tmpdir
. "$TC_ROOT/tests/ceph/lib.sh"
[ -x "$TC_BIN" ] || fail "$TC_BIN is missing; run make"
tc_build_tool alua_io
CTL=$TC_ROOT/build/tierctl
GOAL=10

# gstep ARGS: /sbin/ini-steps step12 ARGS in the guest; its lines are echoed,
# and a FAIL among them ends the step here
gstep() {
	local out
	out=$(bash "$TC_ROOT/tests/system/run-vm-initiator.sh" gsh "/sbin/ini-steps step12 $*") || true
	printf '%s\n' "$out"
	printf '%s\n' "$out" | grep -q '^FAIL: ' && fail "the guest's step12 $1 failed (above)"
	printf '%s\n' "$out" | grep -q '^ok: ' || fail "the guest's step12 $1 printed no result"
	GOUT=$out
}

rbd_cluster_up
rbd create --size 128M --image-feature layering,exclusive-lock "$CEPH_POOL/fo" || fail "cannot create the RBD image"

IQN=iqn.2026-11.io.tiercache:fo
gw_init A B
for g in A B; do
	[ $g = A ] && pg=1 || pg=2
	{
		gw_daemon_conf $g $pg
		cat <<CONF

[target $IQN]
lun0 = fo
$(rbd_conf_lun fo fo "serial = TWOGW0001" "gateways = 2" "cache = nvme")

[cache nvme]
legs = $T/$g/leg0 $T/$g/leg1
size = 64M
extent = 64K
mode = write-through
CONF
	} >"$T/$g.conf"
	gw_start $g
done
pass "gateways A (port ${PORT[A]}, group 1) and B (port ${PORT[B]}, group 2) serve $CEPH_POOL/fo"
# nobody owns a fresh image: a first write through A makes A the owner
out=$("$T/alua_io" write "iscsi://127.0.0.1:${PORT[A]}/$IQN/0" 0 16 0x5a 90 2>&1) || fail "the first write through A: $out"

# owner_of G: the port group gateway G's status names as the lock owner
owner_of() { "$CTL" -c "$T/$1.conf" --json status | python3 -c 'import json,sys; print(json.load(sys.stdin)["luns"][0].get("ownership", {}).get("owner_port_group", ""))'; }

tc_wait_for 30 "gateway A owns the image" eval '[ "$(owner_of A)" = 1 ]'
pass "A owns the image after a first write through it ($out)"
gstep up "${PORT[A]}" "${PORT[B]}"
gstep load A B
[ "$(owner_of A)" = 1 ] || fail "A is not the owner any more: the guest's login or load moved the image"
pass "A still owns the image under the guest's load (its reads through B did not move it)"
gw_kill9 A
pass "kill -9 gateway A (the owner) under fio"
gstep after A B killed
pause=$(printf '%s\n' "$GOUT" | awk '$1=="PAUSE"{print $2}')
[ -n "$pause" ] || fail "the guest reported no pause"
tc_wait_for 30 "gateway B owns the image" eval '[ "$(owner_of B)" = 2 ]'
python3 -c "import sys; sys.exit(0 if $pause < $GOAL else 1)" ||
	fail "the host's I/O paused $pause s when the owner died: the goal is under $GOAL s"
pass "the host's I/O paused $pause s when the owner died (goal: under $GOAL s), no I/O failed"
gw_start A
gstep back A B
tc_wait_for 30 "B still owns the image" eval '[ "$(owner_of A)" = 2 ]'
pass "A restarted: B stays the owner"

# ---- round 2: the owner freezes (SIGSTOP): a gateway that hangs, or whose
# host lost power or its network. No connection closes; the host's iSCSI
# NOP-Out finds it (noop_out_interval + noop_out_timeout, 5 s each by
# default), then fast_io_fail_tmo, then A breaks the frozen owner's lock
# and waits out its lease. Thawed, B finds itself fenced: whatever it still
# had on its way to Ceph is refused (the verify would see an old write land
# over a newer one), and it comes back as standby on a fresh client.
gstep load B A
kill -STOP "${PID[B]}"
pass "gateway B (the owner) frozen with SIGSTOP under fio"
tc_wait_for 30 "B stopped" eval '[ "$(ps -o stat= -p "${PID[B]}" | cut -c1)" = T ]'
# the guest's step waits for fio, which goes on through A once A owns the
# image; B is thawed then, while fio still writes
(gstep after B A frozen >"$T/after2.out" 2>&1) &
after_pid=$!
RBD_KILL_PIDS="$RBD_KILL_PIDS $after_pid"
if ! tc_until 120 eval '[ "$(owner_of A)" = 1 ]'; then
	echo "--- A's status: $(owner_of A); A's log:"
	tail -25 "$T/A.log"
	echo "--- the image's lock: $(rbd lock ls "$CEPH_POOL/fo" 2>&1 | tr '\n' ' ')"
	echo "--- the guest:"
	bash "$TC_ROOT/tests/system/run-vm-initiator.sh" gsh 'dmesg | tail -30; multipath -ll; iscsiadm -m session -P 1 | grep -E "Target|Portal|State"'
	kill -CONT "${PID[B]}"
	wait "$after_pid"
	echo "--- the guest's step (after B was thawed):"
	cat "$T/after2.out"
	fail "A did not take the image over from the frozen B within 120 s"
fi
pass "A owns the image: it broke the frozen B's lock"
kill -CONT "${PID[B]}"
pass "gateway B thawed while fio still runs"
wait "$after_pid"
rc=$?
cat "$T/after2.out"
[ "$rc" = 0 ] || fail "the guest's step12 after (round 2) failed"
pause2=$(awk '$1=="PAUSE"{print $2}' "$T/after2.out")
[ -n "$pause2" ] || fail "the guest reported no pause (round 2)"
# NOP-Out 5 + 5 s, fast_io_fail_tmo 3 s, the takeover about 4.5 s: a host
# left to the SCSI command timeout (30 s) and its error handling would wait longer
python3 -c "import sys; sys.exit(0 if $pause2 < 25 else 1)" ||
	fail "the host's I/O paused $pause2 s when the owner froze: not found by the NOP-Out timers"
pass "the host's I/O paused $pause2 s when the owner froze (the NOP-Out timers, then the same failover), no I/O failed"
tc_wait_for 60 "the thawed B finds itself fenced" grep -q "Ceph client is fenced" "$T/B.log"
pass "B's log: $(grep "Ceph client is fenced" "$T/B.log" | tail -1 | sed 's/.*: this/this/')"
gstep back B A
tc_wait_for 30 "A still owns the image" eval '[ "$(owner_of B)" = 1 ]'
pass "B thawed and recovered: A stays the owner"
