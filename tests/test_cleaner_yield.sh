#!/usr/bin/env bash
# The cleaner yields to the host: a flush with no cap does not make the
# host's reads of cached data much slower, and still moves on.
#
# The cache set has one leg, a fault device that serves one request at a
# time with a fixed 2 ms service time (tierctl leg fault ... delay), so a
# host read that meets a destage's leg read or CLEAN record waits for it:
# with the cleaner running flat out (about 4 s for the data below), the
# reads' mean grows by half or more.
#   - 96 MiB are made dirty (write-back) under a destage cap, so nothing
#     is destaged before the flush; the cap is lifted and a flush asked;
#   - QD1 4 KiB reads of cached data for 2 s before and 3 s during the
#     flush: the mean during the flush stays within 1.5x of before (the
#     cleaner aims at 1.2x; on this VM 1.22-1.37x with it, 2.11-2.45x with
#     the pause never taken; 1.35x failed a CI run), status shows the cleaner pausing
#     (destage_pause_us), its pauses ending by their own timeouts (at
#     least 10 destage_pauses in the window, not only the once-a-second
#     tick) and knowing the quiet latency (hit_quiet_us);
#   - the flush moved on meanwhile (at least 1 MiB destaged) and had not
#     ended (or the window measured nothing), and once the host stops it
#     drains the rest.
. "$(dirname "$0")/lib.sh"
tc_tmpdir
TB=$TC_ROOT/build/tierbench
CTL=$TC_ROOT/build/tierctl
[ -x "$TB" ] || skip "build/tierbench is not built"
command -v python3 >/dev/null || skip "python3 not installed"

port=$(tc_free_port)
{
	tc_conf_head "$port"
	cat <<CONF

[target iqn.2026-11.io.tiercache:test]
lun0 = wb0

[lun wb0]
backing = $T/backing.img
size = 256M
cache = one

[cache one]
legs = $T/leg0.img
allow_single_leg = yes
size = 128M
mode = write-back
admit_hits = 1
seq_cutoff = 0
dirty_target = 90
destage_max = 64K
fault_injection = yes
CONF
} >"$T/t.conf"
tc_start "$T/t.conf"
url=iscsi://127.0.0.1:$port/iqn.2026-11.io.tiercache:test/0
ctl() { "$CTL" -c "$T/t.conf" "$@"; }
st() { ctl --json status | python3 -c "import json,sys; c=json.load(sys.stdin)['caches'][0]; print(c['$1'])"; }
mean_us() { python3 -c 'import json,sys; print(int(json.load(open(sys.argv[1]))["runs"][0]["latency_us"]["avg"]))' "$1"; }

"$TB" --json --no-progress -b 64k --seq -r 0 -t 1 -q 4 -n 1536 --size 96M "$url" >"$T/fill.json" ||
	fail "fill: $(head -c 300 "$T/fill.json")"
dirty=$(st dirty_bytes)
[ "$dirty" -ge $((90 << 20)) ] || fail "only $dirty bytes dirty after writing 96 MiB in write-back"
ctl leg fault one "$T/leg0.img" delay 2000 >/dev/null || fail "tierctl leg fault ... delay 2000 refused"

reads() { # SECONDS OUT
	"$TB" --json --no-progress -w 4k-randread -t 1 -q 1 --size 4M -T "$1" "$url" >"$2" ||
		fail "reads: $(head -c 300 "$2")"
}
reads 2 "$T/idle.json"
hits0=$(st read_hits)
idle=$(mean_us "$T/idle.json")
[ "$hits0" -gt 0 ] || fail "the reads did not hit the cache"
[ "$idle" -ge 2000 ] || fail "QD1 hit mean $idle us: the leg's 2 ms delay is not in the reads' path"

before=$(st destaged_bytes)
pauses0=$(st destage_pauses)
ctl set one destage_max 0 >/dev/null || fail "tierctl set destage_max 0"
ctl flush >/dev/null || fail "tierctl flush"
reads 3 "$T/flush.json" &
load=$!
pause=0 quiet=0
while kill -0 "$load" 2>/dev/null; do
	p=$(st destage_pause_us) q=$(st hit_quiet_us)
	[ "$p" -gt "$pause" ] && pause=$p
	[ "$q" -gt 0 ] && quiet=$q
	sleep 0.3
done
wait "$load" || fail "the reads during the flush failed"
after=$(st destaged_bytes)
left=$(st dirty_bytes)
pauses=$(($(st destage_pauses) - pauses0))
busy=$(mean_us "$T/flush.json")
moved=$((after - before))
ratio=$(python3 -c "print('%.2f' % ($busy / $idle))")
echo "QD1 hit mean: $idle us idle, $busy us flushing (${ratio}x); destaged meanwhile: $((moved >> 10)) KiB;" \
	"longest pause $pause us, $pauses pauses, quiet mean $quiet us"
[ "$moved" -ge $((1 << 20)) ] || fail "the flush stood still under the reads: $moved bytes destaged"
[ "$pauses" -ge 10 ] || fail "only $pauses pauses ended by their timeouts in 3 s"
[ "$left" -gt 0 ] || fail "the flush ended inside the window: the reads measured no flush"
[ "$pause" -gt 0 ] || fail "status never showed the cleaner pausing (destage_pause_us)"
[ "$quiet" -gt 0 ] || fail "status never showed the quiet latency (hit_quiet_us)"
python3 -c "import sys; sys.exit(0 if $busy <= 1.5 * $idle else 1)" ||
	fail "a flush made the host's hits ${ratio}x slower ($idle -> $busy us; at most 1.5x)"
pass "a flush with no cap kept QD1 hits at ${ratio}x their idle mean and moved $((moved >> 10)) KiB"

ctl leg fault one "$T/leg0.img" ok >/dev/null || fail "tierctl leg fault ... ok refused"
tc_wait_for 60 "the flush to drain the rest" eval '[ "$(st dirty_bytes)" = 0 ]'
pass "with the host gone the flush drained the rest"
tc_stop
