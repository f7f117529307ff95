#!/usr/bin/env bash
# tests/test_rbd_pr_shared.sh - persistent reservations of an RBD image
# exported by two gateways are one state: the sequence a Windows cluster
# validation runs, across two gateways and two initiators.
#
# Gateways A (port group 1) and B (port group 2) export one image
# (gateways = 2) on a throwaway Ceph cluster. B takes 5 s to handle each
# change another gateway announces (TIERCACHE_TEST_SHARED_DELAY_MS), so a
# PERSISTENT RESERVE OUT through A must wait for it. Node 1 logs in to A,
# node 2 to B (tests/tools/pr_gw.c, libiscsi):
#   - both register (APTPL); node 1's REGISTER through A is answered only
#     after B took the change (>= 5 s); both gateways list both keys;
#   - node 1 writes through A (A owns the image), reserves Write Exclusive;
#     B reports node 1 as the holder; node 2's write through B gets
#     RESERVATION CONFLICT and the image stays A's (a refused command
#     never takes the image over); node 2's read through B is allowed
#     (Write Exclusive) and reads what node 1 wrote;
#   - an EXTENDED COPY node 2 sends to B's plain LUN 1, into the shared
#     LUN, while B owns the image and its copy of the state lacks the
#     reservation node 1 is making through A, ends in COPY ABORTED (copy
#     target not reachable), not a write past the reservation; once B has
#     read the change, RESERVATION CONFLICT;
#   - likewise a WRITE USING TOKEN (ODX) to B's LUN 1 of a token of the
#     shared LUN, while B's copy lacks the Exclusive Access reservation
#     node 1 is making: COPY ABORTED, then RESERVATION CONFLICT;
#   - kill -9 A, restart it: the same keys and reservation through A; A fences
#     the client it had before the kill (whose watch outlives the process)
#     as it starts;
#   - node 2 preempts node 1 (PREEMPT AND ABORT) through B while node 1 has
#     a write in flight on A (A's cache leg takes 1 s a request): the
#     preemption is answered only after that write is done, and without
#     waiting 10 s for A's dead client (B fences nobody); node 1 then gets the unit
#     attention REGISTRATIONS PREEMPTED on A, then RESERVATION CONFLICT;
#     both gateways name node 2;
#   - every gateway killed with -9 and restarted: the APTPL state is back;
#   - node 2 registers again without APTPL: kept while B runs across a
#     restart of A; dropped once both restart, as after a power loss;
#   - B made to take 30 s: A's next change is answered once A fenced B
#     (10 s), and B, on a fresh client, has the change;
#   - the reservation object's members are the two running clients, and
#     none once both stopped cleanly.
. "$(dirname "$0")/lib.sh"
tc_tmpdir
. "$TC_ROOT/tests/ceph/lib.sh"

[ -x "$TC_BIN" ] || fail "build/tiercached is missing; run make"
cc -std=gnu11 -O2 -Wall -Wextra -o "$T/pr_gw" "$TC_ROOT/tests/tools/pr_gw.c" -liscsi 2>"$T/cc.log" ||
	skip "cannot build tests/tools/pr_gw.c against libiscsi: $(head -1 "$T/cc.log")"
PR=$T/pr_gw
CTL=$TC_ROOT/build/tierctl
N1=iqn.2026-12.io.tiercache:node1
N2=iqn.2026-12.io.tiercache:node2

rbd_cluster_up
rbd create --size 64M --image-feature layering,exclusive-lock "$CEPH_POOL/prs" ||
	fail "cannot create the RBD image"

IQN=iqn.2026-12.io.tiercache:prs
gw_init A B

gw_conf() { # NAME PORT_GROUP
	local g=$1
	gw_daemon_conf "$g" "$2"
	cat <<CONF

[target $IQN]
lun0 = prs
lun1 = scratch
$(rbd_conf_lun prs prs "serial = PRSHARED0001" "gateways = 2" "cache = nvme")

[lun scratch]
backing = $T/$g/scratch.img
size = 4M

[cache nvme]
legs = $T/$g/leg0 $T/$g/leg1
size = 64M
extent = 64K
mode = write-through
admit_hits = 1
seq_cutoff = 0
fault_injection = yes
CONF
}
gw_conf A 1 >"$T/A.conf"
gw_conf B 2 >"$T/B.conf"

B_DELAY_MS=5000
gw_up() { # NAME: B takes B_DELAY_MS to handle each change
	if [ "$1" = B ]; then
		gw_start B TIERCACHE_TEST_SHARED_DELAY_MS=$B_DELAY_MS
	else
		gw_start "$1"
	fi
}

url() { echo "iscsi://127.0.0.1:${PORT[$1]}/$IQN/0"; }
expect_match() { # TEXT REGEX WHAT
	[[ $1 =~ $2 ]] || fail "$3: expected /$2/ in '$1'"
	pass "$3"
}
pr() { # GATEWAY NODE STEP... -> the client's lines
	"$PR" "$(url "$1")" "$2" "${@:3}" 2>&1
}
# the step's line of a pr_gw output
line_of() { printf '%s\n' "$1" | grep "^$2 " | head -1; }
ms_of() { sed -n 's/.* ms=\([0-9]*\).*/\1/p' <<<"$1"; }

# the ownership of gateway G from tierctl status --json: "state owner_port_group"
status_of() {
	"$CTL" -s "$T/$1/state/control.sock" --json status 2>/dev/null | python3 -c '
import json, sys
o = json.load(sys.stdin)["luns"][0].get("ownership", {})
print(o.get("state"), o.get("owner_port_group"))'
}

gw_up A
gw_up B
pass "gateways A and B up (B answers announcements after 5 s)"

# ------------------------------------------------------------- register
out=$(pr A "$N1" reg:1:aptpl)
l=$(line_of "$out" reg:1:aptpl)
case $l in
*" GOOD "*) ;;
*) fail "node 1's REGISTER through A: $out" ;;
esac
ms=$(ms_of "$l")
[ "${ms:-0}" -ge 4900 ] ||
	fail "node 1's REGISTER through A was answered in ${ms} ms, before B (5 s to take it) had the change"
pass "node 1 registered through A, answered after B took the change ($ms ms)"
grep -q "fenced it" "$T/A.log" && fail "A fenced B for taking 5 s (the limit is 10 s)"

out=$(pr B "$N2" reg:2:aptpl)
expect_match "$(line_of "$out" reg:2:aptpl)" " GOOD " "node 2 registered through B"
ka=$(line_of "$(pr A "$N1" keys)" keys)
kb=$(line_of "$(pr B "$N2" keys)" keys)
expect_match "$ka" "gen=2 1 2$" "A lists both keys ($ka)"
expect_match "$kb" "gen=2 1 2$" "B lists both keys ($kb)"

# ------------------------------------------------------------- reserve
# While B takes the reservation (5 s), B's copy may be stale: a command
# the reservation refuses (START STOP UNIT: of the write kind, no media
# access) waits there (NOT READY, retried) and then meets the reservation,
# instead of passing on the stale copy.
synced_of() {
	"$CTL" -s "$T/$1/state/control.sock" --json status 2>/dev/null |
		python3 -c 'import json, sys; print(json.load(sys.stdin)["luns"][0].get("reservations_synced"))'
}
pr A "$N1" write:8:0x11 reserve:1:1 >"$T/n1r.out" 2>&1 &
n1r=$!
RBD_KILL_PIDS="$RBD_KILL_PIDS $n1r"
b_stale() { [ "$(synced_of B)" = False ]; }
tc_until 30 b_stale || fail "B's copy never turned stale while node 1 reserved through A"
out=$(pr B "$N2" ssu)
expect_match "$(line_of "$out" ssu)" " CONFLICT " \
	"node 2's START STOP UNIT through B while B's copy was stale: RESERVATION CONFLICT, not passed on the old copy"
wait "$n1r"
out=$(cat "$T/n1r.out")
expect_match "$(line_of "$out" write:8:0x11)" " GOOD " "node 1 wrote through A"
expect_match "$(line_of "$out" reserve:1:1)" " GOOD " "node 1 reserved (Write Exclusive) through A"
a_owns() { [ "$(status_of A)" = "owned 1" ]; }
tc_until 30 a_owns || fail "A does not own the image: $(status_of A)"
out=$(pr B "$N2" resv)
expect_match "$(line_of "$out" resv)" "holder=1 type=1" "B reports node 1 as the holder"
out=$(pr B "$N2" write:8:0x22)
expect_match "$(line_of "$out" write:8:0x22)" " CONFLICT " "node 2's write through B: RESERVATION CONFLICT"
sleep 2 # the lock poll runs every second: a takeover would show by now
st=$(status_of A)
expect_eq "$st" "owned 1" "A still owns the image: the refused write did not take it over"
st=$(status_of B)
expect_eq "$st" "standby 1" "B is still standby"
out=$(pr B "$N2" read:8)
expect_match "$(line_of "$out" read:8)" " GOOD .*first=0x11" "node 2's read through B is allowed and reads node 1's data"

# ------------------------------------------------------------- EXTENDED COPY on a stale copy
# The reservation is made again through A while B owns the image: in B's
# 5 s to read the change, a copy into the shared LUN sent to B's other LUN
# is checked against the shared LUN's reservations only on a synced copy.
out=$(pr A "$N1" release:1:1)
expect_match "$(line_of "$out" release:1:1)" " GOOD " "node 1 released through A"
b_synced() { [ "$(synced_of B)" = True ]; }
tc_until 30 b_synced || fail "B did not read the release"
out=$(pr B "$N2" write:8:0x22)
expect_match "$(line_of "$out" write:8:0x22)" " GOOD " "node 2 writes through B (no reservation): B takes the image"
b_owns() { [ "$(status_of B)" = "owned 2" ]; }
tc_until 30 b_owns || fail "B does not own the image: $(status_of B)"
out=$(pr B "$N2" write:8:0x77 xcopy:1:1:0:8)
expect_match "$(line_of "$out" xcopy:1:1:0:8)" " GOOD " "with B's copy synced, node 2's EXTENDED COPY into the shared LUN through B works"
pr A "$N1" reserve:1:1 >"$T/n1x.out" 2>&1 &
n1x=$!
RBD_KILL_PIDS="$RBD_KILL_PIDS $n1x"
tc_until 30 b_stale || fail "B's copy never turned stale while node 1 reserved again through A"
out=$(pr B "$N2" xcopy:1:1:0:8)
l=$(line_of "$out" xcopy:1:1:0:8)
b_was_stale=$(synced_of B)
expect_match "$l" " CHECK:a/0d/02 " "node 2's EXTENDED COPY into the shared LUN through B while B's copy was stale: COPY ABORTED, target not reachable ($l)"
[ "$b_was_stale" = False ] || fail "B had read the change before the copy was answered: this run shows nothing"
wait "$n1x"
expect_match "$(line_of "$(cat "$T/n1x.out")" reserve:1:1)" " GOOD " "node 1 reserved (Write Exclusive) again through A"
out=$(pr B "$N2" xcopy:1:1:0:8)
expect_match "$(line_of "$out" xcopy:1:1:0:8)" " CONFLICT " "once B has read it, the same copy: RESERVATION CONFLICT"

# ------------------------------------------------------------- ODX on a stale copy
# Node 2 takes a token of the shared LUN through B (synced), then node 1
# reserves Exclusive Access through A: in B's 5 s to read it, node 2's
# WRITE USING TOKEN to B's LUN 1 (reading the shared LUN) must not pass on
# the stale copy.
out=$(pr A "$N1" release:1:1)
expect_match "$(line_of "$out" release:1:1)" " GOOD " "node 1 released through A"
tc_until 30 b_synced || fail "B did not read the release"
rm -f "$T/go2" "$T/go3"
"$PR" "$(url B)" "$N2" token:0:8 wut:1:8 "wait:$T/go2" wut:1:8 "wait:$T/go3" wut:1:8 >"$T/n2o.out" 2>&1 &
n2o=$!
RBD_KILL_PIDS="$RBD_KILL_PIDS $n2o"
odx_first() { grep -q '^wut:1:8 ' "$T/n2o.out"; }
tc_until 30 odx_first || fail "node 2's token and first copy did not come: $(cat "$T/n2o.out")"
expect_match "$(line_of "$(cat "$T/n2o.out")" token:0:8)" " GOOD " "node 2 took a token of the shared LUN through B"
expect_match "$(line_of "$(cat "$T/n2o.out")" wut:1:8)" " GOOD " "with B's copy synced, node 2's WRITE USING TOKEN to B's LUN 1 works"
pr A "$N1" reserve:1:3 >"$T/n1o.out" 2>&1 &
n1o=$!
RBD_KILL_PIDS="$RBD_KILL_PIDS $n1o"
tc_until 30 b_stale || fail "B's copy never turned stale while node 1 reserved Exclusive Access through A"
touch "$T/go2"
odx_second() { [ "$(grep -c '^wut:1:8 ' "$T/n2o.out")" -ge 2 ]; }
tc_until 30 odx_second || fail "node 2's second WRITE USING TOKEN was not answered: $(cat "$T/n2o.out")"
b_was_stale=$(synced_of B)
l=$(grep '^wut:1:8 ' "$T/n2o.out" | sed -n 2p)
expect_match "$l" " CHECK:a/0d/02 " "node 2's WRITE USING TOKEN of the shared LUN's token while B's copy was stale: COPY ABORTED ($l)"
[ "$b_was_stale" = False ] || fail "B had read the change before the copy was answered: this run shows nothing"
wait "$n1o"
expect_match "$(line_of "$(cat "$T/n1o.out")" reserve:1:3)" " GOOD " "node 1 reserved Exclusive Access through A"
tc_until 30 b_synced || fail "B did not read the reservation"
touch "$T/go3"
wait "$n2o"
l=$(grep '^wut:1:8 ' "$T/n2o.out" | sed -n 3p)
expect_match "$l" " CONFLICT " "once B has read it, the same WRITE USING TOKEN: RESERVATION CONFLICT ($l)"

# ------------------------------------------------------------- A dies
a_lines=$(wc -l <"$T/A.log")
b_lines=$(wc -l <"$T/B.log")
gw_kill9 A
gw_up A
ka=$(line_of "$(pr A "$N1" keys)" keys)
ra=$(line_of "$(pr A "$N1" resv)" resv)
expect_match "$ka" "gen=2 1 2$" "after kill -9 and restart, A lists the same keys ($ka)"
expect_match "$ra" "holder=1 type=3" "and the same holder and type ($ra)"
tail -n +"$((a_lines + 1))" "$T/A.log" | grep -q "fenced this gateway's earlier client" ||
	fail "the restarted A did not fence the client it had before the kill"
tail -n +"$((b_lines + 1))" "$T/B.log" | grep -q "Ceph client is fenced" &&
	fail "the restarted A fenced B's running client"
pass "the restarted A fenced the client it had before the kill, and not B's"

# ------------------------------------------------------------- preempt
# Node 1 has a write in flight on A (A's cache leg takes 1 s for each
# request) when node 2 preempts it with abort through B: the PREEMPT AND
# ABORT is answered only once that write is done, and node 1's next write
# meets the new state.
ctl_a() { "$CTL" -s "$T/A/state/control.sock" "$@"; }
inflight_a() { ctl_a --json status | python3 -c 'import json,sys; print(json.load(sys.stdin)["luns"][0]["io"]["in_flight"])'; }
# node 1's write through A takes the image back to A (a read would not: a
# gateway that does not own the image reads it without taking it), and its
# reads cache the extent, so that the next write goes to A's legs
# (write-through)
out=$(pr A "$N1" write:16:0x43 read:16 read:16)
expect_match "$(line_of "$out" write:16:0x43)" " GOOD " "node 1 writes through A (A owns the image again)"
expect_match "$(line_of "$out" read:16)" " GOOD " "node 1 reads through A (the extent cached)"
sleep 1
ctl_a leg fault nvme "$T/A/leg0" delay 1000000 >/dev/null || fail "cannot slow A's cache leg"
rm -f "$T/go"
"$PR" "$(url A)" "$N1" write:16:0x44 "wait:$T/go" write:8:0x33 resv >"$T/n1.out" 2>&1 &
n1=$!
RBD_KILL_PIDS="$RBD_KILL_PIDS $n1"
a_busy() { [ "$(inflight_a)" -ge 1 ]; }
tc_until 30 a_busy || fail "node 1's write is not in flight on A: $(cat "$T/n1.out")"
pass "node 1's write is in flight on A"
a_lines=$(wc -l <"$T/A.log")
"$PR" "$(url B)" "$N2" pa:2:1:1 resv >"$T/n2.out" 2>&1 &
n2=$!
RBD_KILL_PIDS="$RBD_KILL_PIDS $n2"
tc_until 60 grep -q "^pa:2:1:1 " "$T/n2.out" || fail "the PREEMPT AND ABORT was not answered: $(cat "$T/n2.out")"
inf=$(inflight_a)
expect_eq "$inf" 0 "when the PREEMPT AND ABORT is answered, nothing of node 1 is in flight on A any more"
out=$(cat "$T/n2.out")
l=$(line_of "$out" pa:2:1:1)
expect_match "$l" " GOOD " "the PREEMPT AND ABORT is GOOD ($l)"
[ "$(ms_of "$l")" -ge 500 ] || fail "it was answered in $(ms_of "$l") ms: it did not wait for node 1's write"
# A fenced its own dead client as it started, so nobody is left whose watch
# does not answer: B fences nobody, and the change does not wait the 10 s
tail -n +"$((a_lines + 1))" "$T/A.log" | grep -q "Ceph client is fenced" &&
	fail "B fenced A: A did not take the change in time: $(grep "fenced it" "$T/B.log")"
grep -q "fenced it" "$T/B.log" && fail "B fenced a gateway client: $(grep "fenced it" "$T/B.log")"
[ "$(ms_of "$l")" -lt 8000 ] || fail "the PREEMPT AND ABORT took $(ms_of "$l") ms: it waited for a dead watch"
pass "A took the change in time (A not fenced), B fenced nobody, answered in $(ms_of "$l") ms"
ctl_a leg fault nvme "$T/A/leg0" ok >/dev/null || fail "cannot restore A's cache leg"
tc_until 30 grep -q "^write:16:0x44 " "$T/n1.out" || fail "node 1's write never finished"
expect_match "$(line_of "$(cat "$T/n1.out")" write:16:0x44)" " GOOD " "node 1's write finished GOOD"
expect_match "$(line_of "$out" resv)" "holder=2 type=1" "B names node 2 the holder"
touch "$T/go"
wait "$n1"
out=$(cat "$T/n1.out")
expect_match "$out" "ua 2a/05" "node 1, logged in to A, got REGISTRATIONS PREEMPTED"
expect_match "$(line_of "$out" write:8:0x33)" " CONFLICT " "node 1's write through A: RESERVATION CONFLICT"
expect_match "$(line_of "$out" resv)" "holder=2 type=1" "A names node 2 the holder"

# ------------------------------------------------------------- APTPL
gw_kill9 A
gw_kill9 B
gw_up A
gw_up B
ka=$(line_of "$(pr A "$N1" keys)" keys)
rb=$(line_of "$(pr B "$N2" resv)" resv)
expect_match "$ka" "gen=[0-9]* 2$" "every gateway restarted: A lists node 2's key only (APTPL) ($ka)"
expect_match "$rb" "holder=2 type=1" "and B names node 2 the holder ($rb)"

out=$(pr B "$N2" reg:3)
expect_match "$(line_of "$out" reg:3)" " GOOD " "node 2 registered again without APTPL"
gw_kill9 A
gw_up A
ka=$(line_of "$(pr A "$N1" keys)" keys)
expect_match "$ka" "gen=[0-9]* 3$" "A restarted while B runs: the state without APTPL is kept ($ka)"
gw_kill9 A
gw_kill9 B
gw_up A
gw_up B
ka=$(line_of "$(pr A "$N1" keys)" keys)
kb=$(line_of "$(pr B "$N2" resv)" resv)
expect_match "$ka" "gen=[0-9]*$" "every gateway restarted: no registration without APTPL is left ($ka)"
expect_match "$kb" " none" "and no reservation ($kb)"
grep -q "registrations made without APTPL are dropped" "$T/A.log" ||
	fail "A's log does not say it dropped the registrations"
pass "A says it dropped them: no other gateway ran"

# ------------------------------------------------------------- a gateway that does not answer
# B now takes 30 s to handle a change: past the 10 s limit. A's REGISTER
# is answered once B is fenced (blocklisted); B gets a fresh client and
# reads the state again before it serves: it lists the new key.
gw_kill9 B
B_DELAY_MS=30000
gw_up B
out=$(pr A "$N1" reg:5)
l=$(line_of "$out" reg:5)
expect_match "$l" " GOOD " "node 1's REGISTER through A with B not answering"
ms=$(ms_of "$l")
[ "${ms:-0}" -ge 9500 ] && [ "${ms:-0}" -lt 25000 ] ||
	fail "it was answered after ${ms} ms: not when the 10 s limit fenced B"
grep -q "did not take a change of pr within 10000 ms; fenced it" "$T/A.log" ||
	fail "A's log does not say it fenced B"
pass "answered after $ms ms, once A fenced B"
kb=$(line_of "$(pr B "$N2" keys)" keys)
expect_match "$kb" "gen=[0-9]* 5$" "B, on a fresh client, lists the new key ($kb)"
grep -q "fresh client" "$T/B.log" || fail "B's log does not show a fresh client"
pass "B reconnected with a fresh client"

# ------------------------------------------------------------- the members
# After all those kills and the fence, the reservation object lists the two
# clients that run (each restart removed what the gateway's killed process
# left, B's move to a fresh client its old one); a clean stop removes each.
img_id=$(rbd info --format json "$CEPH_POOL/prs" | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
# a member is two keys: GID (its address) and GID.gw (whose client it is)
members() {
	local k
	k=$(rados -p "$CEPH_POOL" listomapkeys "tiercache.pr.$img_id")
	[ "$(grep -c '\.gw$' <<<"$k")" = "$(grep -c '^[0-9][0-9]*$' <<<"$k")" ] || { echo "unpaired: $k"; return; }
	grep -c '^[0-9][0-9]*$' <<<"$k"
}
n=$(members)
[ "$n" = 2 ] || fail "the reservation object lists $n members, not the 2 running clients: $(rados -p "$CEPH_POOL" listomapvals "tiercache.pr.$img_id")"
for g in A B; do
	kill -TERM "${PID[$g]}"
	wait "${PID[$g]}" 2>/dev/null
	PID[$g]=
done
n=$(members)
[ "$n" = 0 ] || fail "after both gateways stopped cleanly the object still lists $n members"
pass "the members: 2 while both run (after 7 restarts and a fence), none after a clean stop"
echo "all checks passed"
