#!/usr/bin/env bash
# tests/test_rbd_failover.sh - two gateways export one RBD image with
# implicit ALUA; a gateway killed with -9 is taken over by the other when a
# host sends it I/O, and no gateway ever serves data older than the last
# acknowledged write, even from a warm NVMe cache.
#
# Gateways A (port group 1) and B (port group 2) are two tiercached on
# 127.0.0.1 with their own ports, state dirs and cache legs (write-through),
# in front of the same image on a throwaway Ceph cluster. The client is
# tests/tools/alua_io.c (libiscsi), which retries UNIT ATTENTION and NOT
# READY / ASYMMETRIC ACCESS STATE TRANSITION as a host's multipath does.
#
#   round 1: write X through A; RTPG through A and B: group 1 active/optimized,
#            group 2 active/non-optimized; status JSON names owner 1; kill -9 A;
#            write Y through B (NOT READY transition first, then GOOD; RTPG:
#            group 2 active/optimized); restart A, read through A: Y, at
#            once (a gateway that does not own the image reads it past
#            its cache, and the read does not take the image); a write
#            through A takes it back.
#   recovery: A's takeover fenced B (blocklisted); B, not restarted, connects
#            a fresh Ceph client by itself and is standby again
#            (active/non-optimized), and follows an `rbd resize` on its
#            fresh client. A writes Z; kill -9 A; a write through B
#            takes the image over (transition, then GOOD),
#            a read through B returns what B wrote, and Z where B itself
#            had written Y before (B's gain drops what it may have cached).
#   round 2: the same with A's cache warm on the region (X read through A
#            until cached). A's restart fences B again while B's Ceph
#            configuration is moved away: B stays lost, its reconnects fail
#            and are retried with a backoff; with the file back it recovers
#            by itself. Then the takeover by B and A's restart: A, not the
#            owner, reads Y past its warm copy of X; a write through A
#            takes the image, A drops its copies on that gain and reads Y;
#            B stops cleanly on SIGTERM.
#   round 3: a single gateway (gateways = 1) with a write-back cache takes the
#            lock at start; after kill -9 and a restart it keeps its cache.
. "$(dirname "$0")/lib.sh"
tc_tmpdir
. "$TC_ROOT/tests/ceph/lib.sh"

[ -x "$TC_BIN" ] || fail "build/tiercached is missing; run make"
cc -std=gnu11 -O2 -Wall -Wextra -o "$T/alua_io" "$TC_ROOT/tests/tools/alua_io.c" -liscsi 2>"$T/cc.log" ||
	skip "cannot build tests/tools/alua_io.c against libiscsi: $(head -1 "$T/cc.log")"
IO=$T/alua_io
CTL=$TC_ROOT/build/tierctl

rbd_cluster_up
rbd create --size 64M --image-feature layering,exclusive-lock "$CEPH_POOL/shared" ||
	fail "cannot create the RBD image"
pass "RBD image $CEPH_POOL/shared created (exclusive-lock)"

IQN=iqn.2026-11.io.tiercache:shared
gw_init A B
PID[C]=

gw_conf() { # NAME PORT_GROUP
	local g=$1
	gw_daemon_conf "$g" "$2"
	cat <<CONF

[target $IQN]
lun0 = shared
$(rbd_conf_lun shared shared "serial = SHAREDRBD0001" "gateways = 2" "cache = nvme")

[cache nvme]
legs = $T/$g/leg0 $T/$g/leg1
size = 64M
extent = 64K
mode = write-through
admit_hits = 1
seq_cutoff = 0
CONF
}
gw_conf A 1 >"$T/A.conf"
gw_conf B 2 >"$T/B.conf"

gw_term() { # NAME: SIGTERM, must exit 0 within 60 s
	local g=$1 rc
	kill -TERM "${PID[$g]}" 2>/dev/null
	tc_until 60 tc_gone "${PID[$g]}" || fail "gateway $g did not stop within 60 s of SIGTERM"
	wait "${PID[$g]}"
	rc=$?
	PID[$g]=
	[ "$rc" = 0 ] || fail "gateway $g exited with status $rc after SIGTERM"
}

url() { echo "iscsi://127.0.0.1:${PORT[$1]}/$IQN/0"; }

# RTPG through gateway G until it prints the expected group states (the
# other gateway's owner is polled about every second), for up to 60 s.
# takeover_write GATEWAY LBA BYTE WHAT: 16 blocks written through GATEWAY
# right after the owner died: NOT READY (transition) first, then GOOD
takeover_write() {
	local t0=$SECONDS out
	out=$(io write "$1" "$2" 16 "$3") || fail "$4 after the owner died: $out"
	case $out in
	*transition=0*) fail "$4 succeeded without a transition: $out" ;;
	esac
	pass "$4: NOT READY (transition) first, then GOOD, in $((SECONDS - t0)) s ($out)"
}

# hits_of GATEWAY: read hits of G's cache
hits_of() {
	"$CTL" -s "$T/$1/state/control.sock" --json status | python3 -c '
import json, sys
c = json.load(sys.stdin)["caches"][0]
print(c.get("read_hits", c.get("counters", {}).get("read_hits", 0)))' 2>/dev/null
}

# no_transition OUT WHAT: the client saw no NOT READY (transition)
no_transition() {
	case $1 in
	*transition=0*) ;;
	*) fail "$2 waited for a takeover (a gateway that does not own the image serves reads from it): $1" ;;
	esac
}

# expect_unowned GATEWAY N: G's status counts at least N reads served while another gateway owned the image
expect_unowned() {
	local n
	n=$("$CTL" -s "$T/$1/state/control.sock" --json status | python3 -c '
import json, sys
print(json.load(sys.stdin)["luns"][0]["ownership"]["unowned_reads"])')
	[ "${n:-0}" -ge "$2" ] || fail "gateway $1's status counts $n reads served unowned, expected at least $2"
	pass "gateway $1's status counts $n read(s) served while it did not own the image"
}

expect_rtpg() { # GATEWAY EXPECTED WHAT
	local out t0=$SECONDS
	while :; do
		out=$("$IO" rtpg "$(url "$1")" 2>&1 | awk '{printf "%s %s;", $1, $2}')
		[ "$out" = "$2" ] && { pass "$3 ($out)"; return 0; }
		[ $((SECONDS - t0)) -lt 60 ] || break
		sleep 0.5
	done
	fail "$3: expected '$2', got '$out' (for 60 s)"
}

# the ownership object of tierctl status --json for gateway G: "state owner alua"
status_of() {
	"$CTL" -s "$T/$1/state/control.sock" --json status 2>/dev/null | python3 -c '
import json, sys
o = json.load(sys.stdin)["luns"][0].get("ownership", {})
print(o.get("state"), o.get("owner_port_group"), o.get("alua_state"))'
}

io() { # write|read GATEWAY LBA BLOCKS BYTE -> prints the client's counters
	"$IO" "$1" "$(url "$2")" "$3" "$4" "$5" 90
}

gw_start A
gw_start B
pass "gateways A (port group 1, port ${PORT[A]}) and B (port group 2, port ${PORT[B]}) up"

# ---------------------------------------------------------------- round 1
out=$(io write A 0 16 0xa1) || fail "write X through A: $out"
pass "write X through A ($out)"
expect_rtpg A "1 AO;2 ANO;" "RTPG through A: A's group active/optimized, B's non-optimized"
expect_rtpg B "1 AO;2 ANO;" "RTPG through B: the same view"
st=$(status_of A)
expect_eq "$st" "owned 1 active/optimized" "status of A: owns the image"
st=$(status_of B)
expect_eq "$st" "standby 1 active/non-optimized" "status of B: standby, owner port group 1"
if out=$("$CTL" -s "$T/B/state/control.sock" mode shared write-back 2>&1); then
	fail "tierctl mode write-back was accepted on a LUN two gateways export: $out"
fi
case $out in
*"2 gateways"*) pass "tierctl mode write-back refused on the shared LUN ($out)" ;;
*) fail "tierctl mode write-back refusal does not say why: $out" ;;
esac

gw_kill9 A
pass "gateway A killed with -9 (its lock stays behind)"
takeover_write B 0 0xb2 "write Y through B"
expect_rtpg B "1 ANO;2 AO;" "RTPG through B: B's group active/optimized now"
st=$(status_of B)
expect_eq "$st" "owned 2 active/optimized" "status of B: owns the image"

gw_start A
out=$(io read A 0 16 0xb2) || fail "read through the restarted A did not return Y: $out"
no_transition "$out" "a read through the restarted A (not the owner)"
pass "read through the restarted A returns Y, never X, at once: from the image, not the owner ($out)"
st=$(status_of B)
expect_eq "$st" "owned 2 active/optimized" "the read through A did not take the image: B still owns it"
expect_unowned A 1
takeover_write A 2048 0xa5 "write through A (takes the image back)"

# ------------------------------------------------------------- recovery
# A took the image back (breaking B's lock: B is blocklisted). B is not
# restarted: it reports lost, connects a fresh client and is standby again.
# log_count GATEWAY N TEXT: G's log holds TEXT at least N times
log_count() { [ "$(grep -c "$3" "$T/$1.log")" -ge "$2" ]; }
# wait_recovered GATEWAY FENCE_COUNT: the FENCE_COUNT-th fence of G's log
# is followed by its recovery to standby (each within 60 s)
wait_recovered() {
	local g=$1 n=$2 st seen_lost=0 t0=$SECONDS
	tc_until 60 log_count "$g" "$n" "Ceph client is fenced" ||
		fail "gateway $g never noticed it was fenced: $(grep -i 'lock\|fence' "$T/$g.log" | tail -3)"
	recovered() {
		st=$(status_of "$g")
		[ "$st" = "lost 0 unavailable" ] && seen_lost=1
		log_count "$g" "$n" "reconnected with a fresh Ceph client" && [ "$st" = "standby 1 active/non-optimized" ]
	}
	tc_until 60 recovered
	expect_eq "$st" "standby 1 active/non-optimized" \
		"the fenced gateway $g is standby again by itself in $((SECONDS - t0)) s (lost seen: $seen_lost)"
	pass "$g's log: $(grep "Ceph client is fenced" "$T/$g.log" | tail -1 | sed 's/.*: this/this/')"
}
wait_recovered B 1
if [ -z "${PID[B]}" ] || ! kill -0 "${PID[B]}" 2>/dev/null; then fail "gateway B is not running"; fi
expect_rtpg B "1 AO;2 ANO;" "RTPG through the recovered B: A's group active/optimized, B's non-optimized"
# the size watch moved to the fresh image handle
rbd resize --size 80M "$CEPH_POOL/shared" >/dev/null 2>&1 || fail "cannot resize rbd/shared"
tc_until 60 log_count B 1 "image resized from 67108864 to 83886080" ||
	fail "the recovered B did not see the image grow: $(grep -i resiz "$T/B.log" | tail -2)"
pass "the recovered B follows the image size on its fresh client (64 MiB -> 80 MiB)"
out=$(io write A 0 16 0xa9) || fail "write Z through A: $out"
pass "write Z through A ($out)"
gw_kill9 A
pass "gateway A killed with -9"
takeover_write B 512 0xb7 "write W through the recovered B"
st=$(status_of B)
expect_eq "$st" "owned 2 active/optimized" "status of the recovered B: owns the image (fresh client)"
out=$(io read B 512 16 0xb7) || fail "read W back through B: $out"
pass "read through B returns W ($out)"
out=$(io read B 0 16 0xa9) || fail "B served its own older Y instead of A's Z: $out"
pass "read through B returns Z written by A, not its older Y ($out)"

# ---------------------------------------------------------------- round 2
# A's gain fences B again, this time while B cannot connect (its Ceph
# configuration is gone): B stays lost, retrying with a backoff, and
# recovers once the configuration is back.
gw_start A
tries0=$(grep -c "next try in" "$T/B.log")
mv "$CEPH_CONF" "$CEPH_CONF.away"
conf_back() { [ -e "$CEPH_CONF.away" ] && mv "$CEPH_CONF.away" "$CEPH_CONF"; }
out=$(io write A 1024 16 0xc3) || { conf_back; fail "write X2 through A: $out"; }
# two failed reconnects (the second after the backoff's first second)
tc_until 60 log_count B $((tries0 + 2)) "next try in" || {
	conf_back
	fail "B did not retry its reconnect: $(grep -i 'fresh\|fence\|next try' "$T/B.log" | tail -3)"
}
st=$(status_of B)
conf_back
expect_eq "$st" "lost 0 unavailable" "B stays lost while it cannot reconnect"
pass "B's reconnects failed while the configuration was away: $(grep -c "next try in" "$T/B.log") tries, the last: $(grep "next try in" "$T/B.log" | tail -1 | sed 's/.*; the LUN/the LUN/')"
for i in 1 2 3 4; do
	out=$(io read A 1024 16 0xc3) || fail "read X2 through A: $out"
done
hits=$(hits_of A)
case $hits in
'' | 0) fail "A's cache never served the region (read_hits = '$hits')" ;;
esac
pass "X2 written and read through A until cached (read hits $hits)"

# with its configuration back, B recovers from the second fence by itself
wait_recovered B 2
gw_kill9 A
out=$(io write B 1024 16 0xd4) || fail "write Y2 through B after A died: $out"
pass "write Y2 through B after A's death ($out)"
gw_start A
drops=$(grep -c "cached extent(s) dropped" "$T/A.log")
hits0=$(hits_of A)
# not the owner: the read comes from the image, past A's warm copy of X2
out=$(io read A 1024 16 0xd4) || fail "A, not the owner, served its stale cached copy: $out"
no_transition "$out" "a read through the restarted A (not the owner)"
[ "$(hits_of A)" = "$hits0" ] || fail "A's cache counted a hit ($hits0 -> $(hits_of A)) for a read it does not own"
pass "the restarted A, cache warm with X2 and not the owner, reads Y2 from the image, no cache hit ($out)"
[ "$(grep -c "cached extent(s) dropped" "$T/A.log")" = "$drops" ] || fail "A dropped its cached copies without a gain"
takeover_write A 2048 0xa6 "write through A (takes the image over)"
out=$(io read A 1024 16 0xd4) || fail "A served its stale cached copy after the takeover: $out"
pass "A, the owner now, reads Y2 ($out)"
[ "$(grep -c "cached extent(s) dropped" "$T/A.log")" -gt "$drops" ] ||
	fail "A's log does not say it dropped its cached copies on its gain"
ndrop=$(grep -o '[0-9]* cached extent(s) dropped' "$T/A.log" | tail -1 | cut -d' ' -f1)
[ "${ndrop:-0}" -ge 1 ] || fail "A's gain dropped $ndrop cached extents: its cache was not warm, so the read above proved nothing"
pass "A's gain dropped $ndrop cached extent(s): the copy of X2 it read past was there"
pass "A dropped its cached copies on its gain: $(grep -o '[0-9]* cached extent(s) dropped' "$T/A.log" | tail -1)"
# B was fenced a third time by that gain; it stops cleanly whatever it is doing
gw_term B
pass "the fenced gateway B stops cleanly on SIGTERM"

# ---------------------------------------------------------------- round 3
# One gateway alone (gateways = 1) with a write-back cache: it takes the
# lock at start and keeps it; after kill -9 and a restart nobody else owned
# the image in between, so its cache (dirty data included) stays.
gw_kill9 A
gw_kill9 B
rbd create --size 64M --image-feature layering,exclusive-lock "$CEPH_POOL/solo" || fail "cannot create rbd/solo"
PORT[C]=$(tc_free_port)
PID[C]=
mkdir -p "$T/C/state"
cat >"$T/C.conf" <<CONF
[daemon]
state_dir = $T/C/state
control_socket = $T/C/state/control.sock
workers = 2

[portal]
listen = 127.0.0.1:${PORT[C]}

[target $IQN]
lun0 = solo
$(rbd_conf_lun solo solo "cache = wb")

[cache wb]
legs = $T/C/leg0 $T/C/leg1
size = 64M
extent = 64K
mode = write-back
admit_hits = 1
seq_cutoff = 0
CONF
gw_start C
st=$(status_of C)
expect_eq "$st" "owned 1 active/optimized" "a single-gateway LUN owns its image from the start"
out=$(io write C 0 16 0xe5) || fail "write through the single gateway: $out"
case $out in
*transition=0*) ;;
*) fail "a single gateway should never answer NOT READY transition: $out" ;;
esac
pass "write-back write through the single gateway, no transition ($out)"
gw_kill9 C
gw_start C
grep -q "nobody else owned .* since generation 1; the cache stays" "$T/C.log" ||
	fail "the restarted single gateway did not keep its cache: $(grep 'cache lun solo' "$T/C.log" | tail -2)"
pass "after kill -9 and a restart the single gateway keeps its cache (generation 1 was its own)"
out=$(io read C 0 16 0xe5) || fail "read after the warm restart: $out"
pass "the data written before kill -9 reads back ($out)"

gw_term C
locks=$(rbd lock ls "$CEPH_POOL/solo" 2>&1)
[ -z "$locks" ] || fail "the lock of rbd/solo is still held after a clean stop: $locks"
pass "a clean stop releases the image's lock"

for g in A B C; do
	if [ -n "${PID[$g]}" ]; then
		kill -KILL "${PID[$g]}" 2>/dev/null
		wait "${PID[$g]}" 2>/dev/null
		PID[$g]=
	fi
done
echo "all checks passed"
