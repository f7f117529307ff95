#!/usr/bin/env bash
# tests/test_rbd_shared_client.sh - the RBD images of one gateway share one
# Ceph client, and another gateway taking one of them over (which
# blocklists that client) costs the others no error.
#
# Gateway A exports three images of one cluster: x and y with a second
# gateway B (gateways = 2, y cached write-through on A), z alone
# (gateways = 1, no cache: its reads come from Ceph). Checked:
#  - A holds the locks of x, y and z through one client (one address);
#  - while five host sessions write y and z through A (three also read
#    each write back; tests/tools/alua_io.c loop and wloop: they retry
#    UNIT ATTENTION and NOT READY transition as multipath does, and fail
#    on anything else; each round goes to fresh blocks), B takes x over,
#    which blocklists A's client. A opens y and z on a fresh client and
#    owns them again without a takeover (no lock broken, no lease waited
#    out, no ASYMMETRIC ACCESS STATE CHANGED): every command of those
#    sessions ends GOOD, writes the fence cut off were sent again on the
#    fresh client (A holds one write to y and one to z across the takeover,
#    TIERCACHE_TEST_HOLD_WRITE, so there are some every run), and every
#    round's data is in the images in Ceph (rbd export);
#  - afterwards x is B's, y and z are A's on one new address;
#  - a SYNCHRONIZE CACHE through B, which does not own y, is answered
#    GOOD at once and leaves y with A (hosts send it down every path);
#  - a reload that adds 16 more images to A adds no thread (within the
#    service pool's reserve of 4) and no Ceph client: their locks are held
#    by the same address as y's.
. "$(dirname "$0")/lib.sh"
tc_tmpdir
. "$TC_ROOT/tests/ceph/lib.sh"

[ -x "$TC_BIN" ] || fail "build/tiercached is missing; run make"
tc_build_tool alua_io
IO=$T/alua_io

rbd_cluster_up
for i in x y z; do
	rbd create --size 64M --image-feature layering,exclusive-lock "$CEPH_POOL/$i" ||
		fail "cannot create the RBD image $i"
done
pass "RBD images x, y and z created (exclusive-lock)"

IQN=iqn.2026-12.io.tiercache:shared-client
gw_init A B

gw_conf() { # NAME PORT_GROUP LUNS...
	local g=$1
	gw_daemon_conf "$g" "$2"
	printf '\n[target %s]\n' "$IQN"
	local n=0 l
	for l in "${@:3}"; do
		echo "lun$n = $l"
		n=$((n + 1))
	done
	rbd_conf_lun x x "serial = SHAREDCLX" "gateways = 2" "cache = nvme"
	rbd_conf_lun y y "serial = SHAREDCLY" "gateways = 2" "cache = nvme"
	[ "$g" = A ] && rbd_conf_lun z z "serial = SHAREDCLZ"
	cat <<CONF

[cache nvme]
legs = $T/$g/leg0 $T/$g/leg1
size = 64M
extent = 64K
mode = write-through
admit_hits = 1
seq_cutoff = 0
CONF
}
gw_conf A 1 x y z >"$T/A.conf"
gw_conf B 2 x y >"$T/B.conf"
url() { echo "iscsi://127.0.0.1:${PORT[$1]}/$IQN/$2"; }


gw_start A TIERCACHE_TEST_HOLD_WRITE="$T/hold"
gw_start B
pass "gateways A (port group 1) and B (port group 2) up"
for l in 0 1 2; do
	out=$("$IO" write "$(url A $l)" 120000 16 0x5$l 90) || fail "write through A to LUN $l: $out"
done
pass "written through A to x, y and z (A owns all three)"
ax=$(rbd_locker x) ay=$(rbd_locker y) az=$(rbd_locker z)
[ "$ax" != none ] && [ "$ax" = "$ay" ] && [ "$ay" = "$az" ] ||
	fail "A holds x, y and z through more than one client: $ax / $ay / $az"
pass "A holds the locks of x, y and z through one Ceph client ($ax)"
threads=$(ls "/proc/${PID[A]}/task" | wc -l)
pass "gateway A runs $threads threads for its three images"

# five sessions on y and z through A, each writing 4 KiB rounds to fresh
# blocks of its own 8 MiB (2048 slots: never the same twice in this run)
stop=$T/stop
loops=()
n=0
SLOTS=2048
# (the last two only write: a write is in flight when the fence comes)
sessions=("1 0 loop" "1 16384 loop" "2 0 loop" "1 32768 wloop" "2 16384 wloop")
for spec in "${sessions[@]}"; do
	set -- $spec
	"$IO" "$3" "$(url A "$1")" "$2" 8 $SLOTS "$stop" >"$T/loop$n.out" 2>"$T/loop$n.err" &
	loops+=($!)
	RBD_KILL_PIDS="$RBD_KILL_PIDS $!"
	n=$((n + 1))
done
started() {
	local i
	for i in $(seq 0 $((n - 1))); do
		grep -q started "$T/loop$i.out" || return 1
	done
}
tc_until 60 started || fail "the host sessions did not get going: $(cat "$T"/loop*.err)"
pass "$n host sessions writing and verifying y and z through A"

# A holds the next write to y and to z inside the image's handles
# (TIERCACHE_TEST_HOLD_WRITE) until its client is fenced: they reach Ceph
# through the fenced client, so the fence cuts off two writes every run.
# The sessions' other commands keep going meanwhile.
touch "$T/hold"
held() {
	grep -q "rbd:$CEPH_POOL/y: a write held for the test" "$T/A.log" &&
		grep -q "rbd:$CEPH_POOL/z: a write held for the test" "$T/A.log"
}
tc_until 30 held || fail "A held no write to y and z for the test: $(grep 'held for the test' "$T/A.log")"
"$IO" write "$(url B 0)" 0 16 0x6b 90 >"$T/bx.out" 2>&1 &
bxpid=$!
RBD_KILL_PIDS="$RBD_KILL_PIDS $bxpid"
# until A has seen the fence on y and z (its sessions' commands meet it),
# or B has the lock (Ceph has fenced A's client by then)
fenced_or_taken() {
	{ grep -q "rbd:$CEPH_POOL/y: this gateway's Ceph client is fenced" "$T/A.log" &&
		grep -q "rbd:$CEPH_POOL/z: this gateway's Ceph client is fenced" "$T/A.log"; } ||
		! kill -0 "$bxpid" 2>/dev/null
}
tc_until 90 fenced_or_taken || fail "A did not see the fence: $(grep -E 'fenced' "$T/A.log" | tail -3)"
rm -f "$T/hold"
wait "$bxpid" || fail "write through B to x: $(cat "$T/bx.out")"
pass "B took x over ($(cat "$T/bx.out")) while A held a write to y and to z"
reowned() {
	grep -q "rbd:$CEPH_POOL/y: owned again on the fresh client" "$T/A.log" &&
		grep -q "rbd:$CEPH_POOL/z: owned again on the fresh client" "$T/A.log"
}
tc_until 60 reowned ||
	fail "A did not own y and z again on a fresh client: $(grep -E 'fenced|fresh|standby' "$T/A.log" | tail -5)"
pass "A owns y and z again on a fresh client: $(grep "owned again on the fresh" "$T/A.log" | sed 's/.*rbd:/rbd:/' | tr '\n' ';')"
# a few more rounds on the fresh client, then stop the sessions
touch "$stop"
i=0
for p in "${loops[@]}"; do
	wait "$p"
	rc=$?
	out=$(tail -1 "$T/loop$i.out")
	set -- ${sessions[$i]}
	[ "$rc" = 0 ] || fail "session $i failed (exit $rc): $(cat "$T/loop$i.err") $out"
	case $out in
	*" ua=0 "*) ;;
	*) fail "session $i saw a UNIT ATTENTION (an access state change) on an image A kept: $out" ;;
	esac
	case $out in
	rounds=[1-9]*) ;;
	*) fail "session $i did no round: $out" ;;
	esac
	gap=${out#*maxgap_ms=}
	gap=${gap%% *}
	[ "$gap" -lt 10000 ] || fail "session $i waited $gap ms for one command: $out"
	pass "session $i ($3): every command GOOD ($out)"
	i=$((i + 1))
done
# the reads above may come from A's cache (y's): every round's write,
# the ones the fence held and sent again included, is in the images
rbd export "$CEPH_POOL/y" "$T/1.img" >/dev/null 2>&1 || fail "cannot export y"
rbd export "$CEPH_POOL/z" "$T/2.img" >/dev/null 2>&1 || fail "cannot export z"
i=0
total=0
for spec in "${sessions[@]}"; do
	set -- $spec
	rounds=$(tail -1 "$T/loop$i.out" | sed 's/^rounds=\([0-9]*\).*/\1/')
	out=$(rbd_rounds_check "$T/$1.img" "$2" "$rounds" $SLOTS)
	[ "$out" = ok ] || fail "session $i: rounds $out are not in the image in Ceph (of $rounds)"
	total=$((total + rounds))
	i=$((i + 1))
done
pass "all $total rounds of the five sessions are in the images in Ceph (rbd export)"
again=$(grep "the fence held were sent again" "$T/A.log" | sed 's/.*rbd:/rbd:/' | tr '\n' ';')
# the held write itself: the first resend of each image after it went
# out on the fenced client counts a write
for i in y z; do
	w=$(awk -v go="rbd:$CEPH_POOL/$i: the write held for the test goes now" \
		-v again="rbd:$CEPH_POOL/$i: .* the fence held were sent again" '
		index($0, go) { seen = 1; next }
		seen && $0 ~ again { print; exit }' "$T/A.log" | sed -n 's/.*(\([0-9]*\) write(s).*/\1/p')
	[ "${w:-0}" -gt 0 ] ||
		fail "the write to $i held across the fence was not sent again on the fresh client: ${again:-none}"
done
pass "requests the fence cut off went again on the fresh client: $again"
if grep -E "rbd:$CEPH_POOL/[yz]: (breaking the lock|waiting [0-9]+ ms)" "$T/A.log" >"$T/broke"; then
	fail "A took y or z over instead of owning them again: $(head -2 "$T/broke")"
fi
pass "A broke no other gateway's lock and waited out no lease for y or z"

bx=$(rbd_locker x) ny=$(rbd_locker y) nz=$(rbd_locker z)
[ "$bx" != "$ax" ] && [ "$bx" != none ] || fail "x is not B's: $bx"
[ "$ny" = "$nz" ] && [ "$ny" != "$ax" ] && [ "$ny" != "$bx" ] && [ "$ny" != none ] ||
	fail "y and z are not held by one fresh client of A: y $ny, z $nz (old $ax, B $bx)"
pass "x is B's ($bx); y and z are A's through one fresh client ($ny)"
for l in 1 2; do
	out=$("$IO" read "$(url A $l)" 120000 16 0x5$l 90) || fail "read back the first write to LUN $l through A: $out"
done
out=$("$IO" read "$(url B 0)" 0 16 0x6b 90) || fail "read back B's write to x through B: $out"
pass "the writes made before the fence read back through A (y, z) and B (x)"
out=$("$IO" sync "$(url B 1)") || fail "SYNCHRONIZE CACHE of y through B: $out"
case $out in
*transition=0*) ;;
*) fail "a SYNCHRONIZE CACHE through B, which does not own y, waited for a takeover: $out" ;;
esac
[ "$(rbd_locker y)" = "$ny" ] || fail "a SYNCHRONIZE CACHE through B moved y's lock: $(rbd_locker y)"
pass "SYNCHRONIZE CACHE of y through B (not its owner): GOOD at once, y stays A's ($out)"

# 16 more images on A: no thread and no client per image
extra=16
creates=()
for i in $(seq 1 $extra); do
	rbd create --size 16M --image-feature layering,exclusive-lock "$CEPH_POOL/e$i" &
	creates+=($!)
done
wait "${creates[@]}"
for i in $(seq 1 $extra); do
	rbd info "$CEPH_POOL/e$i" >/dev/null 2>&1 || fail "cannot create the RBD image e$i"
done
before=$(ls "/proc/${PID[A]}/task" | wc -l)
{
	gw_conf A 1 x y z $(seq -f 'e%g' 1 $extra)
	for i in $(seq 1 $extra); do rbd_conf_lun "e$i" "e$i" "serial = SHAREDCLE$i"; done
} >"$T/A.conf"
kill -HUP "${PID[A]}"
reloaded() { grep -qE 'reload: [0-9]+ LUN\(s\) added|reload refused' "$T/A.log"; }
tc_wait_for 120 "A's reload summary" reloaded
grep -q "reload refused" "$T/A.log" && fail "A refused the reload: $(grep 'reload refused' "$T/A.log")"
out=$("$IO" write "$(url A $((2 + extra)))" 0 16 0x7e 90) || fail "write to the last new image: $out"
after=$(ls "/proc/${PID[A]}/task" | wc -l)
[ "$after" -le $((before + 4)) ] ||
	fail "A went from $before to $after threads with $extra more images"
pass "A runs $after threads with $((3 + extra)) images ($before with 3)"
clients=$(for i in y z $(seq -f 'e%g' 1 $extra); do rbd_locker "$i"; done | sort -u)
[ "$clients" = "$ny" ] || fail "A's images are held by more than one client: $(echo $clients)"
pass "all $((2 + extra)) of A's images are held through its one client ($ny)"

# A write the fence held, on an image another gateway took meanwhile, is
# failed and not sent again: A holds a write to y, B takes y over (which
# fences A's client once more), then A lets the write go. It meets the
# fence and is parked; A finds y's lock B's and answers it NOT READY,
# target port in standby (a host goes to B's path). B's data stays, read
# through either gateway.
sent_y() { grep "rbd:$CEPH_POOL/y: .* the fence held were sent again" "$T/A.log"; }
sent_before=$(sent_y | wc -l)
touch "$T/hold"
"$IO" write "$(url A 1)" 130000 16 0xaa 5 >"$T/aw.out" 2>&1 &
awpid=$!
RBD_KILL_PIDS="$RBD_KILL_PIDS $awpid"
held_again() { [ "$(grep -c "rbd:$CEPH_POOL/y: a write held for the test" "$T/A.log")" -ge 2 ]; }
tc_until 30 held_again || fail "A held no second write to y: $(cat "$T/aw.out")"
out=$("$IO" write "$(url B 1)" 130000 16 0xbb 90) || fail "write through B to y: $out"
by=$(rbd_locker y)
[ "$by" != "$ny" ] && [ "$by" != none ] || fail "B's write to y left y's lock with A: $by"
rm -f "$T/hold"
wait "$awpid"
rc=$?
grep -q "sense 2/04/0b" "$T/aw.out" && [ "$rc" = 2 ] ||
	fail "A's held write to y, which B took meanwhile, was not failed NOT READY standby (exit $rc): $(cat "$T/aw.out")"
standby() { grep -q "rbd:$CEPH_POOL/y: reconnected with a fresh Ceph client; standby again" "$T/A.log"; }
tc_until 30 standby || fail "A did not go standby on y: $(grep "rbd:$CEPH_POOL/y" "$T/A.log" | tail -3)"
if sent_y | tail -n +$((sent_before + 1)) | grep -v "(0 write(s)" >"$T/sent"; then
	fail "A sent a held write to y again after B took it: $(cat "$T/sent")"
fi
pass "A's held write to y, taken by B meanwhile, failed NOT READY standby ($(tail -1 "$T/aw.out"))"
out=$("$IO" read "$(url B 1)" 130000 16 0xbb 90) || fail "B's write to y does not read back through B: $out"
# A, standby on y, either refuses the read (NOT READY, standby) or
# serves B's data: never its own failed write
out=$("$IO" read "$(url A 1)" 130000 16 0xbb 5 2>&1)
rc=$?
case $rc:$out in
0:* | 2:*"sense 2/04/0b"*) ;;
*) fail "a read of y through A after B took it (exit $rc): $out" ;;
esac
rbd export "$CEPH_POOL/y" "$T/y.img" >/dev/null 2>&1 || fail "cannot export y"
got=$(od -v -An -tx1 -j $((130000 * 512)) -N 8192 "$T/y.img" | tr -s ' \n' '\n' | sort -u | tr -d '\n')
[ "$got" = bb ] || fail "y in Ceph at LBA 130000 holds $got, not B's 0xbb"
pass "B's write to y is what y holds, in Ceph and read through B; A $([ "$rc" = 0 ] && echo "reads it too" || echo "refuses the read (standby)")"

# a clean stop closes the images and the shared client (on the ASan
# daemon: nothing leaked, nothing used after its free)
for g in A B; do
	gw_stop "$g"
done
pass "both gateways stop cleanly on SIGTERM"
