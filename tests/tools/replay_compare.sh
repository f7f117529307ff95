#!/usr/bin/env bash
# tests/tools/replay_compare.sh OLD_BIN NEW_BIN
# tests/tools/replay_compare.sh --rev GITREV
#
# Does a change of the code change what an initiator sees? Runs libiscsi's
# suite (iscsi-test-cu, all tests, destructive and sanitize tests allowed,
# two portals: what tests/test_conformance_libiscsi.sh runs, and so the
# tests it lists in tests/conformance-skips.txt skip themselves here too)
# against each of two tiercached binaries, captures the traffic with
# tcpdump on lo, and compares what the target answered to every SCSI
# command: status, sense, residuals and the Data-In bytes
# (tests/tools/iscsi_pcap.py). Exit 0 with "N commands identical", 1 with
# the first differences, 2 on a usage error, 3 with a FAIL line when a run
# could not be made or captured whole.
#
# --rev GITREV builds GITREV's build/tiercached in a git worktree of its own
# (removed at exit) and compares it, as OLD, with this tree's
# build/tiercached (made first).
#
# Each binary gets the same fresh start: the same config word for word
# (tc_conf_head, two portals, tc_cu_target_conf: a plain file-backed LUN
# and one behind a write-back cache set, each a target of its own), new
# backing files, legs and state directory at the same paths, the same
# portal ports, a daemon started anew for each LUN. The suite runs on the
# plain LUN, then on the write-back one (TC_REPLAY_KINDS="plain" or
# "write-back" runs one), old binary then new, one run at a time: a capture
# each, about 2.5 GB (in /dev/shm where there is room), listed and removed
# before the next run. A capture that lost packets is made again, up to
# three times.
#
# What would differ between two runs of the same binary, and what is done
# about it:
#   - ITT, CmdSN, StatSN, ExpCmdSN, MaxCmdSN, DataSN, TSIH, Target Transfer
#     Tags, timestamps, TCP ports: not compared (iscsi_pcap.py numbers the
#     commands of a connection instead; connections are named by initiator,
#     target, portal and rank in order of their first SYN).
#   - The ISID, iscsi-test-cu's persistent reservation keys and the byte its
#     VERIFY mismatch tests flip (random, seeded from /dev/urandom or the
#     clock): made the same in every run by tests/tools/fixed_seed.c, an
#     LD_PRELOAD shim, since they come back in PERSISTENT RESERVE IN data
#     (keys, transport IDs) and in the MISCOMPARE sense (the offset).
#   - The LUNs' unit serial numbers, random with serial = auto (VPD 0x80,
#     and VPD 0x83's NAA designator hashed from it): set in the config.
#   - NOP-In / NOP-Out (when the target pings is its own business): not
#     listed.
#   - Masked, because the timing of events decides them (iscsi_pcap.py's
#     mark_races() has the rules): the outcome of the COMPARE AND WRITEs
#     that MultipathIO.CompareAndWriteAsync races on its two paths (good or
#     MISCOMPARE); whether the WRITE of the async abort and LU reset tests
#     was done or aborted (and the ABORT TASK's answer with it); on the
#     write-back LUN the extent lengths in GET LBA STATUS data, which end
#     where the cleaner has got to (its first extent's LBA and provisioning
#     status are still compared).
#   Nothing else has had to be masked: no INQUIRY or VPD field is derived
#   from a build, a time or a path here.
#
# Run time: 3 to 4 minutes (the suite takes 30 to 50 s a LUN, the list of
# a capture 7 s), plus the builds with --rev. Needs root (tcpdump on lo),
# iscsi-test-cu (libiscsi-bin), tcpdump, cc. The lists, the suite's
# transcripts and the daemon logs stay in build/test-logs/replay/.
set -u
. "$(dirname "$0")/../lib.sh"
# a run that could not be made is not a difference: 3, not lib.sh's 1
fail() {
	echo "FAIL: $*" >&2
	[ -n "$T" ] && [ -f "$T/daemon.log" ] && { echo "--- daemon log (tail) ---" >&2; tail -n 30 "$T/daemon.log" >&2; }
	exit 3
}

usage() {
	sed -n '2,3p' "$0" | sed 's/^# /usage: /' >&2
	exit 2
}
rev=
case ${1:-} in
--rev)
	[ $# = 2 ] || usage
	rev=$2
	;;
-*|"") usage ;;
*)
	[ $# = 2 ] || usage
	old_bin=$1
	new_bin=$2
	;;
esac

command -v iscsi-test-cu >/dev/null || fail "iscsi-test-cu not installed (libiscsi-bin)"
command -v tcpdump >/dev/null || fail "tcpdump not installed (tools/deps.sh installs it)"
[ "$(id -u)" = 0 ] || fail "tcpdump on lo needs root"

tc_tmpdir
out=$TC_LOGS/replay
mkdir -p "$out"
rm -f "$out"/*.list "$out"/*.log
rev_tree=
tcpdump_pid=
cap_dir=
cleanup() {
	if [ -n "$tcpdump_pid" ]; then
		kill -INT "$tcpdump_pid" 2>/dev/null
		wait "$tcpdump_pid" 2>/dev/null
	fi
	[ -n "$rev_tree" ] && git -C "$TC_ROOT" worktree remove --force "$rev_tree" 2>/dev/null
	[ -n "$cap_dir" ] && [ -z "${TC_KEEP:-}" ] && rm -rf "$cap_dir"
	_tc_cleanup
}
trap cleanup EXIT
# A capture goes to memory where there is room for it: tcpdump writing to
# a disk stalls in the disk's writeback, long enough on a busy machine for
# the kernel's buffer to overflow.
avail=$(df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 { print $4 }')
if [ "${avail:-0}" -gt $((6 * 1024 * 1024)) ]; then
	cap_dir=$(mktemp -d /dev/shm/tiercache-replay.XXXXXX) || cap_dir=
fi

if [ -n "$rev" ]; then
	git -C "$TC_ROOT" rev-parse --verify -q "$rev^{commit}" >/dev/null || fail "no commit $rev"
	echo "building $rev and this tree's build/tiercached"
	make -C "$TC_ROOT" -j2 build/tiercached >"$T/make-new.log" 2>&1 ||
		fail "make build/tiercached in this tree failed: $(tail -5 "$T/make-new.log")"
	rev_tree=$T/rev
	git -C "$TC_ROOT" worktree add -q --detach "$rev_tree" "$rev" >"$T/worktree.log" 2>&1 ||
		{ rev_tree=; fail "git worktree add $rev failed: $(cat "$T/worktree.log")"; }
	make -C "$rev_tree" -j2 build/tiercached >"$T/make-old.log" 2>&1 ||
		fail "make build/tiercached of $rev failed: $(tail -5 "$T/make-old.log")"
	old_bin=$rev_tree/build/tiercached
	new_bin=$TC_ROOT/build/tiercached
fi
for b in "$old_bin" "$new_bin"; do
	[ -f "$b" ] && [ -x "$b" ] || fail "$b: not an executable"
done
old_bin=$(realpath "$old_bin")
new_bin=$(realpath "$new_bin")

cc -std=gnu11 -O2 -Wall -Wextra -shared -fPIC -o "$T/fixed_seed.so" "$TC_ROOT/tests/tools/fixed_seed.c" 2>"$T/cc.log" ||
	fail "cannot build tests/tools/fixed_seed.c: $(head -5 "$T/cc.log")"

iqn=iqn.2026-11.io.tiercache:test
kinds=${TC_REPLAY_KINDS:-plain write-back}
port=$(tc_free_port)
port2=$(tc_free_port)
while [ "$port2" = "$port" ]; do port2=$(tc_free_port); done
{
	tc_conf_head "$port"
	echo "listen = 127.0.0.1:$port2"
	for kind in $kinds; do
		tc_cu_target_conf "$iqn" $kind "REPLAY-$kind"
	done
} >"$T/t.conf"

# usage: capture_start PCAP   tcpdump on lo for the two portals, until
# capture_stop. At a higher priority and with a kernel buffer of 1 GiB,
# since two busy cores let the suite outpace it otherwise; in immediate
# mode, since without it the packets of the last second are still in the
# kernel's buffer when tcpdump stops.
capture_start() {
	rm -f "$1" "$1.err"
	nice -n -10 tcpdump -Z root -i lo -s 0 -B 1048576 --immediate-mode -w "$1" \
		"tcp port $port or tcp port $port2" 2>"$1.err" &
	tcpdump_pid=$!
	capture_listening() {
		grep -qs "listening on" "$1.err" && return 0
		kill -0 "$tcpdump_pid" 2>/dev/null || fail "tcpdump exited: $(cat "$1.err")"
		return 1
	}
	tc_wait_for 30 "tcpdump listening" capture_listening "$1"
}

# usage: capture_stop PCAP   once tcpdump has taken everything from the
# kernel (its count of packets, SIGUSR1, stands still); 1 if the kernel
# dropped packets. What is lost anyway (the tail, a hole) iscsi_pcap.py
# finds: a connection it did not see open or close, a gap in a stream.
capture_stop() {
	local n=-1 m
	while :; do
		kill -USR1 "$tcpdump_pid"
		sleep 0.5
		m=$(sed -n 's/^tcpdump: \([0-9]*\) packets captured,.*/\1/p' "$1.err" | tail -n 1)
		[ "$m" = "$n" ] && break
		n=$m
	done
	kill -INT "$tcpdump_pid"
	wait "$tcpdump_pid"
	tcpdump_pid=
	local dropped
	dropped=$(sed -n 's/^\([0-9]*\) packets dropped by kernel$/\1/p' "$1.err")
	[ "$dropped" = 0 ] && return 0
	echo "tcpdump: ${dropped:-an unknown number of} packets dropped by the kernel"
	return 1
}

# usage: run_kind SIDE BIN KIND   the suite on LUN KIND of a fresh start of
# BIN, captured; its list in $out/SIDE-KIND.list. 1 if the capture lost
# packets (the run can be made again), fails on anything else.
run_kind() {
	local side=$1 bin=$2 kind=$3 t0 rc sum log=$out/$1-$3.cu.log pcap=${cap_dir:-$T}/$3.pcap
	rm -rf "$T/state" "$T"/*.img "$T/daemon.log"
	TC_BIN=$bin tc_start "$T/t.conf"
	[ $kind = plain ] || grep -q "cache $kind: lun $kind attached" "$T/daemon.log" ||
		fail "$side: LUN $kind has no cache set"
	capture_start "$pcap"
	t0=$SECONDS
	LD_PRELOAD=$T/fixed_seed.so timeout 600 iscsi-test-cu --dataloss --allow-sanitize -t ALL \
		-i "iqn.2026-11.test:$kind-1" -I "iqn.2026-11.test:$kind-2" \
		"iscsi://127.0.0.1:$port/$iqn-$kind/0" "iscsi://127.0.0.1:$port2/$iqn-$kind/0" >"$log" 2>&1
	rc=$?
	local took=$((SECONDS - t0)) lost=
	capture_stop "$pcap" || lost=1
	kill -0 "$TC_PID" 2>/dev/null || fail "$side $kind: tiercached died during the suite"
	tc_stop
	mv "$T/daemon.log" "$out/$side-$kind.daemon.log"
	python3 "$TC_ROOT/tests/tools/cu_summary.py" "$log" --run-summary >/dev/null 2>&1 ||
		fail "$side $kind: iscsi-test-cu exited $rc without a Run Summary (see $log)"
	sum=$(python3 "$TC_ROOT/tests/tools/cu_summary.py" "$log")
	echo "$side $kind: the suite took $took s, exited $rc: $sum"
	if [ -z "$lost" ]; then
		local vary=
		[ $kind = write-back ] && vary=--lba-status-runs-vary
		python3 "$TC_ROOT/tests/tools/iscsi_pcap.py" list "$pcap" --ports "$port,$port2" $vary \
			>"$out/$side-$kind.list" 2>"$T/list.err"
		rc=$?
		[ $rc = 0 ] || [ $rc = 2 ] || fail "$side $kind: iscsi_pcap.py failed: $(tail -5 "$T/list.err")"
		[ $rc = 2 ] && { cat "$T/list.err"; lost=1; }
	fi
	[ -n "${TC_KEEP:-}" ] || rm -f "$pcap"
	[ -z "$lost" ]
}

echo "old: $old_bin${rev:+ ($rev)}"
echo "new: $new_bin"
for kind in $kinds; do
	for side in old new; do
		[ $side = old ] && bin=$old_bin || bin=$new_bin
		try=1
		until run_kind $side "$bin" $kind; do
			[ $try -lt 3 ] || fail "$side $kind: $try captures in a row lost packets (a machine too busy?)"
			try=$((try + 1))
			echo "$side $kind: the capture lost packets; again (try $try of 3)"
		done
	done
done
cat "$out"/old-*.list >"$out/old.list"
cat "$out"/new-*.list >"$out/new.list"
python3 "$TC_ROOT/tests/tools/iscsi_pcap.py" compare "$out/old.list" "$out/new.list"
