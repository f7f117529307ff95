#!/usr/bin/env bash
# tests/bench/scale_luns.sh - what one gateway pays per LUN.
#
# Issue 16 part 2: for N LUNs on one daemon, print the start time until
# every LUN serves (a READ of each answered GOOD, through one session),
# threads, sockets and resident memory of the daemon (and per LUN, against
# the run with the fewest), and QD1 4 KiB read latency on LUN 0 (cache or
# page-cache hits) while the others idle. Two kinds:
#   file  N file LUNs (16 MiB each) sharing one write-back cache set (two
#         256 MiB file legs): SL_FILE_COUNTS, default "1 50 250"
#   rbd   N RBD images (16 MiB each) on the loopback Ceph cluster, one
#         gateway: SL_RBD_COUNTS, default "1 50 250" (SL_KINDS=file skips)
# Asserts nothing about speed (a benchmark); a run whose LUNs do not all
# serve within 300 s says so.
#
#   bash tests/bench/scale_luns.sh
#   SL_KINDS=file SL_FILE_COUNTS="1 250" bash tests/bench/scale_luns.sh
. "$(dirname "$0")/../lib.sh"
cd "$TC_ROOT" || exit 2
tc_tmpdir
[ -x "$TC_BIN" ] || { echo "scale_luns: run make first" >&2; exit 2; }
KINDS=${SL_KINDS:-"file rbd"}
IQN=iqn.2026-12.io.tiercache:scale
cc -std=gnu11 -O2 -Wall -Wextra -o "$T/lun_sweep" tests/tools/lun_sweep.c -liscsi || exit 2
ulimit -n 65536 2>/dev/null
echo "scale_luns: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs, tiercached $(git -C "$TC_ROOT" rev-parse --short HEAD 2>/dev/null)"
printf '%-5s %5s %9s %8s %8s %10s %10s %10s %10s %10s\n' kind luns "start ms" threads sockets "rss MiB" \
	"KiB/LUN" "p50 us" "p99 us" "max us"

conf_head() { # PORT N
	tc_conf_head "$1"
	printf '\n[target %s]\n' "$IQN"
	local i
	for ((i = 0; i < $2; i++)); do printf 'lun%d = d%d\n' "$i" "$i"; done
}

base_rss=
base_n=
run() { # KIND N CONF
	local kind=$1 n=$2 conf=$3 port
	port=$(sed -n 's/^listen = 127.0.0.1:\([0-9]*\)/\1/p' "$conf")
	local t0 out
	t0=$(date +%s%N)
	"$TC_BIN" -c "$conf" >>"$T/daemon-$kind-$n.log" 2>&1 &
	TC_PID=$!
	out=$("$T/lun_sweep" "iscsi://127.0.0.1:$port/$IQN/0" "$n" --wait 300 --lat 0 2000 2>&1)
	local rc=$? ms=$((($(date +%s%N) - t0) / 1000000))
	local threads sockets rss
	threads=$(awk '/^Threads:/ { print $2 }' "/proc/$TC_PID/status")
	sockets=$(find "/proc/$TC_PID/fd" -lname 'socket:*' 2>/dev/null | wc -l)
	rss=$(awk '/^VmRSS:/ { print $2 }' "/proc/$TC_PID/status")
	tc_stop
	if [ "$rc" != 0 ]; then
		printf '%-5s %5d  not every LUN served within 300 s: %s\n' "$kind" "$n" "$(echo "$out" | tail -1)"
		return
	fi
	local per="-"
	if [ -z "$base_rss" ]; then
		base_rss=$rss
		base_n=$n
	elif [ "$n" -gt "$base_n" ]; then
		per=$(((rss - base_rss) / (n - base_n)))
	fi
	local lat
	lat=$(echo "$out" | sed -n 's/^lat 0: avg [0-9.]* p50 \([0-9.]*\) p99 \([0-9.]*\) max \([0-9.]*\) us/\1 \2 \3/p')
	# shellcheck disable=SC2086
	printf '%-5s %5d %9d %8d %8d %10.1f %10s %10s %10s %10s\n' "$kind" "$n" "$ms" "$threads" "$sockets" \
		"$(echo "$rss / 1024" | bc -l)" "$per" $lat
}

for kind in $KINDS; do
	base_rss=
	if [ "$kind" = file ]; then
		for n in ${SL_FILE_COUNTS:-1 50 250}; do
			rm -rf "$T/state" "$T"/leg*.img "$T"/d*.img
			port=$(tc_free_port)
			{
				conf_head "$port" "$n"
				for ((i = 0; i < n; i++)); do
					printf '\n[lun d%d]\nbacking = %s/d%d.img\nsize = 16M\ncache = fast\n' "$i" "$T" "$i"
				done
				printf '\n[cache fast]\nlegs = %s/leg0.img %s/leg1.img\nsize = 256M\nmode = write-back\n' "$T" "$T"
			} >"$T/file-$n.conf"
			run file "$n" "$T/file-$n.conf"
		done
	elif [ "$kind" = rbd ]; then
		. "$TC_ROOT/tests/ceph/lib.sh"
		rbd_cluster_up >/dev/null
		made=0
		for n in ${SL_RBD_COUNTS:-1 50 250}; do
			for ((i = made; i < n; i++)); do
				rbd create --size 16M "$CEPH_POOL/sl$i" || { echo "rbd create sl$i failed" >&2; exit 1; }
			done
			made=$n
			rm -rf "$T/state"
			port=$(tc_free_port)
			{
				conf_head "$port" "$n"
				for ((i = 0; i < n; i++)); do rbd_conf_lun "d$i" "sl$i"; done
			} >"$T/rbd-$n.conf"
			run rbd "$n" "$T/rbd-$n.conf"
		done
	fi
done
