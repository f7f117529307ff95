#!/usr/bin/env bash
# tests/bench/callgrind_cmd.sh - instructions the daemon executes per SCSI
# command, counted by valgrind's callgrind. This is the committed measure
# of the command path's CPU cost: the architecture redesign must keep it
# within 2% of what it was before. An instruction count does not depend on
# how fast the machine is, where timings on a shared 2-core machine vary
# by more than that from run to run.
#
# Three paths on one write-back LUN (512-byte blocks, two file legs), each
# a run of 4 KiB commands at QD1 from one tierbench session, at sequential
# LBAs that no command of the run visits twice:
#   read-hit   READ(16) of blocks already in the cache (written, destaged)
#   write      WRITE(16) over cached clean blocks, absorbed by both legs
#   read-miss  READ(16) of blocks never touched, served by the backing file;
#              an extent's first visit stays under admit_hits, so no fill
# Each line: path=NAME commands=N Ir_total=I Ir_per_cmd=I/N, then how many
# repeats the figure is the median of, and how far apart they were.
#
# How: the daemon runs under callgrind (--separate-threads=no: every thread
# summed; io_uring's work is the kernel's and is not counted), which dumps
# its counts whenever a tierctl status reaches the daemon's status handler
# (--dump-before=ctl_status): a status before and one after a run bracket
# what the daemon executed meanwhile. (callgrind_control -i on/off would do
# the same through vgdb, but vgdb now and then hangs for good opening its
# FIFO to the process; a control-socket request does not.) A path's figure
# is the difference between a run of BASE + N commands and one of BASE from
# the same cache state: N commands without a session's login, READ
# CAPACITY, logout, or the status requests. An empty run (a sleep) gives
# what the idle daemon executes per second (each worker's once-a-second
# tick); the difference's extra seconds at that rate are subtracted. Each
# path takes the median of CG_REPEAT such pairs. tierctl stats must show
# each run took its path (a hit, a miss and no promotion, a write hit per
# command), or the script fails.
#
# The daemon waits in epoll here (TIERCACHE_RING_WAIT=0, as on kernels
# before 5.11): under Debian 12's valgrind (3.19) the ring wait never
# gets the portal listening. The command path counted is the same.
#
# What keeps the count still (within about 0.3% from run to run):
#  - the daemon and tierbench run SCHED_FIFO on one CPU, so they take turns
#    (the one running goes on until it waits) and nothing else cuts in. How
#    many times the worker's loop turns per command depends on whether the
#    next command, or a leg's completion, is already there when it looks:
#    with the two on two shared cores, and the daemon slowed many times
#    over by valgrind, that differs from run to run by 1 to 5%;
#  - one worker thread (where a connection lands and what is posted
#    between threads does not vary); no NOP-In pings; seq_cutoff = 0, so
#    the runs, sequential streams, are never bypassed;
#  - no checkpoint during a write run. Once a journal ring is half full,
#    checkpoints run back to back (one asked for during another starts as
#    soon as it ends), as many per run as their I/O latency allows, each a
#    scan of the whole slot table. 16 GiB legs give the largest ring (2048
#    blocks before one is due), every write run starts from a daemon just
#    restarted (a clean stop checkpoints), and writes fewer blocks than
#    that;
#  - no cleaner scan during a write run. The cleaner looks through every
#    slot for dirty ones at the first tick that finds its last list used
#    up: in one run and not the other of a pair, that scan would weigh
#    more than a hundred writes. So before each write run ten extents
#    elsewhere are written and a tick lets the cleaner list them; it then
#    destages one a tick, for longer than the run. Before that the cleaner
#    has destaged everything and no write has come for 3 s, so the
#    write-intent bits are clear;
#  - a warm-up of 4 KiB writes before measuring: the legs' sparse journal
#    and slot table blocks are allocated by the file system once, not in
#    the middle of a run;
#  - a fixed glibc mmap threshold: glibc raises it after the first large
#    free, after which a session's command pool comes from the heap and
#    calloc clears it or not depending on what it reuses, so a login would
#    not always cost the same.
#
# A benchmark: it asserts nothing about the numbers, and exits non-zero
# only when the measurement itself is broken (a run failed, the daemon
# died, a path was not taken, nothing was counted).
#
#   bash tests/bench/callgrind_cmd.sh   (about 2.5 minutes)
# Knobs: CG_CMDS (commands per path, default 1800), CG_BASE (commands of
# the run subtracted, default 100; the two at most 1900 together),
# CG_REPEAT (pairs per path, default 5).
. "$(dirname "$0")/../lib.sh"
cd "$TC_ROOT" || exit 2
tc_tmpdir
TB=$TC_ROOT/build/tierbench
[ -x "$TB" ] && [ -x "$TC_BIN" ] || { echo "callgrind_cmd: run make first" >&2; exit 2; }
command -v valgrind >/dev/null || { echo "callgrind_cmd: valgrind is not installed (make deps)" >&2; exit 2; }
mkdir -p "$T/bin" && cp "$TB" "$TC_BIN" "$TC_ROOT/build/tierctl" "$T/bin/" || exit 2
TB=$T/bin/tierbench CTL=$T/bin/tierctl
N=${CG_CMDS:-1800}
BASE=${CG_BASE:-100}
R=${CG_REPEAT:-5}
IDLE_SECS=5
BS=4096
[ "$N" -gt 0 ] && [ "$BASE" -gt 0 ] && [ $((BASE + N)) -le 1900 ] && [ "$R" -gt 0 ] ||
	{ echo "callgrind_cmd: CG_CMDS and CG_BASE from 1, at most 1900 together; CG_REPEAT from 1" >&2; exit 2; }
span=$(((BASE + N) * BS))
fill=$(((span + 262143) / 262144 * 262144))
# the hit, write and ballast areas, then a fresh miss area for every run,
# 1 MiB apart
HIT_OFF=0 WRITE_OFF=$((1 << 30)) BALLAST_OFF=$((3 << 29)) MISS_OFF=$((2 << 30))
miss_area() { echo $((MISS_OFF + $1 * (fill + (1 << 20)))); }
cpu=$(($(nproc) - 1))
run_as="chrt -f 1 taskset -c $cpu"
$run_as true 2>/dev/null || {
	echo "callgrind_cmd: cannot run SCHED_FIFO (needs root): the counts will vary more" >&2
	run_as="taskset -c $cpu"
}

cat >"$T/bin/tiercached-cg" <<SH
#!/bin/sh
GLIBC_TUNABLES=glibc.malloc.mmap_threshold=131072 TIERCACHE_RING_WAIT=0 exec $run_as valgrind --tool=callgrind --vgdb=no \\
	--separate-threads=no --dump-before=ctl_status --callgrind-out-file="$T/cg.out.%p" "$T/bin/tiercached" "\$@"
SH
chmod +x "$T/bin/tiercached-cg"
TC_BIN=$T/bin/tiercached-cg

port=$(tc_free_port)
iqn=iqn.2026-11.io.tiercache:test
url=iscsi://127.0.0.1:$port/$iqn/0
{
	tc_conf_head "$port"
	cat <<CONF

[daemon]
workers = 1
log_level = warning
; nop_timeout alone: no NOP-In pings (both 0 would mean the defaults)
nop_interval = 0
nop_timeout = 30

[target $iqn]
lun0 = disk0

[lun disk0]
backing = $T/disk0.img
size = $(($(miss_area $((2 * R))) / (1 << 30) + 1))G
block_size = 512
cache = fast

[cache fast]
legs = $T/leg0.img $T/leg1.img
size = 16G
extent = 256K
mode = write-back
seq_cutoff = 0
CONF
} >"$T/t.conf"
tc_start "$T/t.conf"

counter() { # FIELD: the cache set's counter
	"$CTL" -c "$T/t.conf" --json stats | python3 -c 'import json,sys; print(json.load(sys.stdin)["caches"][0][sys.argv[1]])' "$1"
}
alive() { kill -0 "$TC_PID" 2>/dev/null || fail "the daemon died (callgrind's last words in $T/daemon.log)"; }
clean() { [ "$(counter dirty_bytes)" = 0 ]; }
settle() { # no dirty data, then no write for 3 s: the intent bits cleared
	tc_until 120 clean || fail "dirty data still in the cache after 120 s"
	sleep 3
}
dumps=0
# mark: a tierctl status, at whose handler callgrind dumps what was
# counted since the last dump; sets F to the dump's file
mark() {
	alive
	"$CTL" -c "$T/t.conf" status >/dev/null || { alive; fail "tierctl status"; }
	dumps=$((dumps + 1))
	F=$T/cg.out.$TC_PID.$dumps
	tc_until 30 test -s "$F" || fail "callgrind wrote no dump $F (is ctl_status still the status handler?)"
}
# measure CMD...: run CMD between two marks; sets IR (what the daemon
# executed meanwhile) and SECS (the wall time)
measure() {
	local t0 t1
	mark
	t0=$(date +%s.%N)
	"$@" || { alive; fail "$* failed"; }
	t1=$(date +%s.%N)
	mark
	IR=$(sed -n 's/^totals: *\([0-9]*\).*/\1/p' "$F")
	IR=${IR:-0}
	SECS=$(python3 -c "print($t1 - $t0)")
}
# tb RW OFFSET COUNT [BS]: COUNT commands at QD1, LBAs from OFFSET up
tb() {
	local bs=${4:-$BS} ios
	$run_as "$TB" -w 4k-randread -r "$1" --seq -b "$bs" -t 1 -q 1 --offset "$2" --size $(($3 * bs)) \
		-n "$3" --no-progress --json "$url" >"$T/tb.json" || return 1
	ios=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["runs"][0]["ios"])' "$T/tb.json")
	[ "$ios" = "$3" ] || { echo "callgrind_cmd: tierbench did $ios commands, not $3" >&2; return 1; }
}
# fresh: the state every write run starts from. Everything destaged, the
# daemon stopped clean (the journal checkpointed) and started again, one
# session of reads unmeasured (no run is its process's first), then the
# ballast: ten extents written elsewhere and a tick, whose cleaner scan
# finds them; the cleaner then destages one a tick, for longer than the run
fresh() {
	settle
	tc_stop
	dumps=0
	tc_start "$T/t.conf"
	tb 100 $HIT_OFF "$BASE" || fail "the reads after a restart"
	tb 0 $BALLAST_OFF 10 262144 || fail "the ballast"
	sleep 1.5
}
# the hit and write areas written whole, the write area three times more
# in 4 KiB writes (the warm-up: more than a journal ring), all destaged
tb 0 $HIT_OFF $((fill / 262144)) 262144 || fail "filling the cache"
tb 0 $WRITE_OFF $((fill / 262144)) 262144 || fail "filling the cache"
for i in 1 2 3; do tb 0 $WRITE_OFF $((BASE + N)) || fail "the warm-up writes"; done
settle

# what the idle daemon executes per second: a sleep between the marks,
# less the marks' own cost (no sleep between them)
measure true
ir0=$IR s0=$SECS
measure sleep $IDLE_SECS
idle_rate=$(python3 -c "print(($IR - $ir0) / ($SECS - $s0))")
echo "idle daemon: $(python3 -c "print(round($idle_rate))") instructions/s, subtracted"

# checked FIELD COUNT CMD...: measure CMD COUNT; FIELD of tierctl stats
# must grow by COUNT (one per command), promotions not at all
checked() {
	local field=$1 n=$2 before promo
	shift 2
	before=$(counter "$field") promo=$(counter promotions)
	measure "$@" "$n"
	[ "$(counter "$field")" = $((before + n)) ] ||
		fail "$* $n: $field grew by $(($(counter "$field") - before)), not $n: not the path meant"
	[ "$(counter promotions)" = "$promo" ] || fail "$* $n: extents were promoted"
}
# run PATH FIELD: CG_REPEAT pairs of runs, BASE then BASE + N commands;
# sets LINE to the path's line
run() {
	local path=$1 field=$2 i ir0 s0 all="" run0 run1
	for ((i = 0; i < R; i++)); do
		case $path in
		read-hit) run0="tb 100 $HIT_OFF" run1=$run0 ;;
		read-miss) run0="tb 100 $(miss_area $((2 * i)))" run1="tb 100 $(miss_area $((2 * i + 1)))" ;;
		write) run0="tb 0 $WRITE_OFF" run1=$run0 ;;
		esac
		[ "$path" = write ] && fresh
		checked "$field" "$BASE" $run0
		ir0=$IR s0=$SECS
		[ "$path" = write ] && fresh
		checked "$field" $((BASE + N)) $run1
		all+=" $(python3 -c "print(round($IR - $ir0 - $idle_rate * ($SECS - $s0)))")"
	done
	LINE=$(python3 -c '
import statistics, sys
path, n, runs = sys.argv[1], int(sys.argv[2]), [int(x) for x in sys.argv[3:]]
total = round(statistics.median(runs))
if total <= 0 or min(runs) <= 0:
    sys.exit(1)
print("path=%s commands=%d Ir_total=%d Ir_per_cmd=%.1f repeats=%d spread=%.2f%%"
      % (path, n, total, total / n, len(runs), 100.0 * (max(runs) - min(runs)) / total))' "$path" "$N" $all) ||
		fail "$path: no instructions counted (runs:$all)"
}
# the writes last: what they leave dirty is destaged while the reads would run
run read-hit read_hits
hit=$LINE
run read-miss read_misses
miss=$LINE
run write write_hits
printf '%s\n' "$hit" "$LINE" "$miss"
tc_stop
