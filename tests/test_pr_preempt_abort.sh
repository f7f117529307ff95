#!/usr/bin/env bash
# PREEMPT AND ABORT on a LUN of one gateway waits for the preempted
# nexus's commands in flight, as a cluster's fencing relies on: once the
# surviving node has its GOOD, no write of the node it preempted may still
# land. Node 1 holds a Write Exclusive reservation and has a write in
# flight (the cache leg it goes to answers each request after 1 s, by
# tierctl leg fault ... delay); node 2 preempts it with abort:
#   - the PREEMPT AND ABORT is GOOD, answered only once node 1's write is
#     done (nothing of node 1 in flight then, and it took 500 ms or more);
#   - node 1's write itself completed GOOD (let finish, not lost);
#   - node 1's next write meets the new state: RESERVATION CONFLICT (after
#     the unit attention of its preempted registration);
#   - with no command of the preempted node in flight the answer comes at
#     once (under 500 ms).
. "$(dirname "$0")/lib.sh"
tc_tmpdir
tc_build_tool pr_gw
PR=$T/pr_gw
CTL=$TC_ROOT/build/tierctl
N1=iqn.2026-12.io.tiercache:node1
N2=iqn.2026-12.io.tiercache:node2
IQN=iqn.2026-12.io.tiercache:pa

port=$(tc_free_port)
{
	tc_conf_head "$port"
	cat <<CONF

[target $IQN]
lun0 = pa

[lun pa]
backing = $T/pa.img
size = 64M
cache = fast

[cache fast]
legs = $T/leg0.img $T/leg1.img
size = 32M
mode = write-back
seq_cutoff = 0
fault_injection = yes
CONF
} >"$T/t.conf"
tc_start "$T/t.conf"
url=iscsi://127.0.0.1:$port/$IQN/0
ctl() { "$CTL" -c "$T/t.conf" "$@"; }
inflight() { ctl --json status | python3 -c 'import json,sys; print(json.load(sys.stdin)["luns"][0]["io"]["in_flight"])'; }
pr() { "$PR" "$url" "$@" 2>&1; } # NODE STEP...
line_of() { printf '%s\n' "$1" | grep "^$2 " | head -1; }
ms_of() { sed -n 's/.* ms=\([0-9]*\).*/\1/p' <<<"$1"; }
expect_match() { # TEXT REGEX WHAT
	[[ $1 =~ $2 ]] || fail "$3: expected /$2/ in '$1'"
	pass "$3"
}

out=$(pr "$N1" reg:1 reserve:1:1 write:8:0x41)
expect_match "$(line_of "$out" reserve:1:1)" " GOOD " "node 1 registers and reserves (Write Exclusive)"
expect_match "$(line_of "$out" write:8:0x41)" " GOOD " "node 1, the holder, writes"
expect_match "$(line_of "$(pr "$N2" reg:2)" reg:2)" " GOOD " "node 2 registers"

ctl leg fault fast "$T/leg0.img" delay 1000000 >/dev/null || fail "cannot slow leg 0"
rm -f "$T/go"
"$PR" "$url" "$N1" write:8:0x44 "wait:$T/go" write:16:0x33 >"$T/n1.out" 2>&1 &
n1=$!
busy() { [ "$(inflight)" -ge 1 ]; }
tc_until 30 busy || fail "node 1's write is not in flight: $(cat "$T/n1.out")"
pass "node 1's write is in flight (leg 0 answers after 1 s)"
out=$(pr "$N2" pa:2:1:1 resv)
inf=$(inflight)
l=$(line_of "$out" pa:2:1:1)
expect_match "$l" " GOOD " "node 2's PREEMPT AND ABORT is GOOD ($l)"
expect_eq "$inf" 0 "when it is answered, nothing of node 1 is in flight"
[ "$(ms_of "$l")" -ge 500 ] || fail "it was answered in $(ms_of "$l") ms: it did not wait for node 1's write"
expect_match "$(line_of "$out" resv)" "holder=2 type=1" "node 2 holds the reservation now"
expect_match "$(line_of "$(cat "$T/n1.out")" write:8:0x44)" " GOOD " "node 1's write in flight was let finish"
pass "the PREEMPT AND ABORT waited $(ms_of "$l") ms for node 1's write"

ctl leg fault fast "$T/leg0.img" ok >/dev/null || fail "cannot restore leg 0"
touch "$T/go"
tc_until 60 grep -q "^write:16:0x33 " "$T/n1.out" || fail "node 1's next write got no answer: $(cat "$T/n1.out")"
wait "$n1"
expect_match "$(line_of "$(cat "$T/n1.out")" write:16:0x33)" " CONFLICT " "node 1's next write meets the new state"

# nothing of the preempted node in flight: no wait
out=$(pr "$N1" reg:3)
expect_match "$(line_of "$out" reg:3)" " GOOD " "node 1 registers again"
out=$(pr "$N2" pa:2:3:1)
l=$(line_of "$out" pa:2:3:1)
expect_match "$l" " GOOD " "a PREEMPT AND ABORT with nothing in flight is GOOD"
[ "$(ms_of "$l")" -lt 500 ] || fail "with nothing in flight it still took $(ms_of "$l") ms"
pass "with nothing in flight it is answered at once ($(ms_of "$l") ms)"
tc_stop
