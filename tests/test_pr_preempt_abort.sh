#!/usr/bin/env bash
# tests/test_pr_preempt_abort.sh - PREEMPT AND ABORT on a LUN of one gateway
# is answered only once no command of the nexus it preempted is in flight:
# a cluster fences a node with it and then trusts that none of that node's
# writes lands after the GOOD.
#
# Two LUNs of one write-back cache set whose leg 0 answers one request at a
# time, each after 1.5 s (tierctl leg fault ... delay): pa
# (io_timeout off) and pb (io_timeout = 1). Node 1 holds a Write Exclusive reservation with a
# write in flight; node 2 preempts it with abort (tests/tools/pr_gw.c, whose
# "at=" is when each answer came, on one clock for both nodes):
#   - on pa: GOOD, sent before node 1's write was answered and answered
#     after it (at most 1 s before, for two sockets and two client
#     processes racing; not waiting at all is seconds early) and within 2 s
#     of it (woken by that completion, not by the 8 s limit); node 1's
#     write GOOD; node 1's next write meets RESERVATION CONFLICT;
#   - on pb: node 1's write outlives io_timeout and is answered ABORTED
#     COMMAND, but still runs: the PREEMPT AND ABORT is GOOD (io_timeout is
#     not for it) and answered once the LUN has nothing in flight;
#   - with nothing of node 1 in flight: answered at once (< 500 ms);
#   - a reload that moves pa from LUN 0 to LUN 2 while node 1's write to
#     LUN 0 is in flight: node 2's PREEMPT AND ABORT through LUN 2 still
#     waits for it, and is answered within 2 s of it (the count of a
#     mapping a reload removed lives until its last command, which wakes
#     the wait), and that write's completion touches no freed memory (on
#     the ASan daemon, run.sh's asan/ list, a report fails the test);
#   - no PREEMPT AND ABORT was answered for want of time ("answered anyway").
. "$(dirname "$0")/lib.sh"
tc_tmpdir
tc_build_tool pr_gw
PR=$T/pr_gw
CTL=$TC_ROOT/build/tierctl
N1=iqn.2026-12.io.tiercache:node1
N2=iqn.2026-12.io.tiercache:node2
IQN=iqn.2026-12.io.tiercache:pa

port=$(tc_free_port)
write_conf() { # LUN-NUMBER-OF-pa
	{
		tc_conf_head "$port"
		cat <<CONF

[target $IQN]
lun$1 = pa
lun1 = pb

[lun pa]
backing = $T/pa.img
size = 64M
cache = fast
io_timeout = off

[lun pb]
backing = $T/pb.img
size = 64M
cache = fast
io_timeout = 1

[cache fast]
legs = $T/leg0.img $T/leg1.img
size = 64M
mode = write-back
seq_cutoff = 0
fault_injection = yes
CONF
	} >"$T/t.conf.new"
	mv "$T/t.conf.new" "$T/t.conf"
}
write_conf 0
tc_start "$T/t.conf"
ctl() { "$CTL" -c "$T/t.conf" "$@"; }
inflight() { # LUN-NAME
	ctl --json status | python3 -c '
import json, sys
print(next(l["io"]["in_flight"] for l in json.load(sys.stdin)["luns"] if l["name"] == sys.argv[1]))' "$1"
}
busy() { [ "$(inflight "$1")" -ge 1 ]; }
line_of() { printf '%s\n' "$1" | grep "^$2 " | head -1; }
ms_of() { sed -n 's/.* ms=\([0-9]*\).*/\1/p' <<<"$1"; }
at_of() { sed -n 's/.* at=\([0-9]*\).*/\1/p' <<<"$1"; }
# answered_after PA-LINE W-LINE WHAT: the PREEMPT AND ABORT was sent before
# the write was answered, and answered after it (1 s of slack for the two
# clients racing) and within 2 s of it
answered_after() {
	local d=$(($(at_of "$1") - $(at_of "$2"))) sent=$(($(at_of "$1") - $(ms_of "$1")))
	[ "$sent" -lt "$(at_of "$2")" ] ||
		fail "$3: node 1's write was answered before the PREEMPT AND ABORT was sent: the machine is too slow for this test"
	[ "$d" -ge -1000 ] || fail "$3: the PREEMPT AND ABORT was answered $((-d)) ms before node 1's write: it did not wait"
	[ "$d" -le 2000 ] || fail "$3: the PREEMPT AND ABORT came $d ms after node 1's write: the completion did not wake it"
	pass "$3: the PREEMPT AND ABORT was answered $d ms after node 1's write (it waited $(ms_of "$1") ms)"
}
expect_match() { # TEXT REGEX WHAT
	[[ $1 =~ $2 ]] || fail "$3: expected /$2/ in '$1'"
	pass "$3"
}
# slow US: the cache's dirty data destaged first, so that leg 0 has the
# test's writes to serve and little else
slow() {
	ctl flush --wait >/dev/null 2>&1 || fail "cannot flush the cache"
	ctl leg fault fast "$T/leg0.img" delay "$1" >/dev/null || fail "cannot slow leg 0"
}
fast() { ctl leg fault fast "$T/leg0.img" ok >/dev/null || fail "cannot restore leg 0"; }

# setup LUN KEY1 KEY2: node 1 registers KEY1 and reserves (Write Exclusive),
# writes; node 2 registers KEY2
setup() {
	local url=iscsi://127.0.0.1:$port/$IQN/$1 out
	out=$("$PR" "$url" "$N1" "reg:$2" "reserve:$2:1" write:8:0x41 2>&1)
	expect_match "$(line_of "$out" "reserve:$2:1")" " GOOD " "LUN $1: node 1 registers and reserves (Write Exclusive)"
	expect_match "$(line_of "$out" write:8:0x41)" " GOOD " "LUN $1: node 1, the holder, writes"
	out=$("$PR" "$url" "$N2" "reg:$3" 2>&1)
	expect_match "$(line_of "$out" "reg:$3")" " GOOD " "LUN $1: node 2 registers"
}

# in_flight LUN NAME US: node 1 starts a write to LUN whose every request
# to leg 0 takes US (a write-back write makes two: data, then its record),
# then waits for $T/go to send one more (into $T/n1.out); back once the
# write is in flight
in_flight() {
	rm -f "$T/go"
	slow "$3"
	"$PR" "iscsi://127.0.0.1:$port/$IQN/$1" "$N1" write:8:0x44 "wait:$T/go" write:16:0x33 >"$T/n1.out" 2>&1 &
	n1=$!
	tc_until 30 busy "$2" || fail "node 1's write is not in flight: $(cat "$T/n1.out")"
}

# next_write: node 1's next write, once the leg is fast again, meets the new state
next_write() {
	fast
	touch "$T/go"
	tc_until 60 grep -q "^write:16:0x33 " "$T/n1.out" || fail "node 1's next write got no answer: $(cat "$T/n1.out")"
	wait "$n1"
	expect_match "$(line_of "$(cat "$T/n1.out")" write:16:0x33)" " CONFLICT " "node 1's next write meets RESERVATION CONFLICT"
}

# ---- pa (io_timeout off): the answer follows node 1's write ----
setup 0 1 2
in_flight 0 pa 1500000
pass "node 1's write to pa is in flight (leg 0 answers after 1.5 s)"
out=$("$PR" "iscsi://127.0.0.1:$port/$IQN/0" "$N2" pa:2:1:1 resv 2>&1)
left=$(inflight pa)
pa=$(line_of "$out" pa:2:1:1)
expect_match "$pa" " GOOD " "pa: node 2's PREEMPT AND ABORT is GOOD ($pa)"
expect_match "$(line_of "$out" resv)" "holder=2 type=1" "pa: node 2 holds the reservation now"
tc_until 30 grep -q "^write:8:0x44 " "$T/n1.out" || fail "node 1's write got no answer: $(cat "$T/n1.out")"
w=$(line_of "$(cat "$T/n1.out")" write:8:0x44)
expect_match "$w" " GOOD " "pa: node 1's write in flight was let finish ($w)"
expect_eq "$left" 0 "pa: once node 2 has its answer, nothing is in flight on pa"
answered_after "$pa" "$w" pa
next_write

# ---- pb (io_timeout = 1): the write is answered ABORTED, the wait goes on ----
setup 1 3 4
# a write takes two requests to leg 0 (data, then its record), 3 s or
# more: io_timeout's check, about once a second, finds it late; and a few
# more requests queued there still leave it well inside the 8 s limit
in_flight 1 pb 1500000
pass "node 1's write to pb is in flight (leg 0 answers after 1.5 s)"
out=$("$PR" "iscsi://127.0.0.1:$port/$IQN/1" "$N2" pa:4:3:1 2>&1)
left=$(inflight pb)
pa=$(line_of "$out" pa:4:3:1)
expect_match "$pa" " GOOD " "pb: node 2's PREEMPT AND ABORT is GOOD, not aborted by io_timeout ($pa)"
expect_eq "$left" 0 "pb: once node 2 has its answer, nothing is in flight on pb"
tc_until 30 grep -q "^write:8:0x44 " "$T/n1.out" || fail "node 1's write got no answer: $(cat "$T/n1.out")"
w=$(line_of "$(cat "$T/n1.out")" write:8:0x44)
expect_match "$w" " CHECK:b/2e/02 " "pb: node 1's write was answered ABORTED COMMAND (io_timeout) while it ran ($w)"
[ "$(ms_of "$pa")" -ge 2000 ] ||
	fail "pb: answered in $(ms_of "$pa") ms: too soon to show that io_timeout (1 s, checked each second) spares it"
pass "pb: the PREEMPT AND ABORT waited $(ms_of "$pa") ms, past io_timeout and node 1's answer"
next_write

# ---- nothing of node 1 in flight: no wait ----
out=$("$PR" "iscsi://127.0.0.1:$port/$IQN/0" "$N1" reg:5 2>&1)
expect_match "$(line_of "$out" reg:5)" " GOOD " "node 1 registers again on pa"
out=$("$PR" "iscsi://127.0.0.1:$port/$IQN/0" "$N2" pa:2:5:1 2>&1)
pa=$(line_of "$out" pa:2:5:1)
expect_match "$pa" " GOOD " "a PREEMPT AND ABORT with nothing in flight is GOOD"
[ "$(ms_of "$pa")" -lt 500 ] || fail "with nothing in flight it still took $(ms_of "$pa") ms"
pass "with nothing in flight it is answered at once ($(ms_of "$pa") ms)"

# ---- a reload unmaps LUN 0 under node 1's write: the count lives on ----
out=$("$PR" "iscsi://127.0.0.1:$port/$IQN/0" "$N2" release:2:1 2>&1)
expect_match "$(line_of "$out" release:2:1)" " GOOD " "node 2 releases pa"
out=$("$PR" "iscsi://127.0.0.1:$port/$IQN/0" "$N1" reg:6 reserve:6:1 2>&1)
expect_match "$(line_of "$out" reserve:6:1)" " GOOD " "node 1 registers again and reserves pa"
in_flight 0 pa 1500000
pass "node 1's write to pa (LUN 0) is in flight"
write_conf 2
kill -HUP "$TC_PID" || fail "cannot send SIGHUP"
reloaded() { grep -qE 'reload: [0-9]+ LUN\(s\) added|reload refused' "$T/daemon.log"; }
tc_wait_for 60 "the reload's summary in the log" reloaded
grep -q 'reload refused' "$T/daemon.log" && fail "the reload was refused: $(grep 'reload refused' "$T/daemon.log")"
busy pa || fail "node 1's write was done before the reload: the leg's delay is too short for this machine"
out=$("$PR" "iscsi://127.0.0.1:$port/$IQN/2" "$N2" pa:2:6:1 2>&1)
pa=$(line_of "$out" pa:2:6:1)
expect_match "$pa" " GOOD " "pa, now LUN 2: node 2's PREEMPT AND ABORT is GOOD ($pa)"
tc_until 30 grep -q "^write:8:0x44 " "$T/n1.out" || fail "node 1's write got no answer: $(cat "$T/n1.out")"
w=$(line_of "$(cat "$T/n1.out")" write:8:0x44)
expect_match "$w" " GOOD " "node 1's write to the LUN the reload took away completed ($w)"
answered_after "$pa" "$w" "through LUN 2, for node 1's write through the old LUN 0"
fast
touch "$T/go"
wait "$n1"
grep -q "answered anyway" "$T/daemon.log" &&
	fail "a PREEMPT AND ABORT ran out of time: $(grep 'answered anyway' "$T/daemon.log")"
pass "no PREEMPT AND ABORT ran out of time"
tc_stop
