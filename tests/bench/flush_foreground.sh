#!/usr/bin/env bash
# tests/bench/flush_foreground.sh - what a flush with no cap does to the host.
#
# Issue 15 part 3: while a flush with no destage cap runs, QD1 reads of
# cached data should keep their p99 within 2x of the idle figure, and
# tierctl status should answer within 1 s throughout. Two backing stores:
#   file  a plain file (the flush is bound by reading the legs): FF_DIRTY_MIB
#         (default 1200) MiB of dirty data, 64 KiB random writes
#   hdd   an emulated HDD (tools/hdd-emulate.sh, 300 IOPS; root only):
#         FF_HDD_DIRTY_MIB (default 256) MiB
# For each: FF_SECS (default 4) s of QD1 4 KiB random reads over 64 MiB of
# cached data with the cleaner quiet, then `tierctl flush` and the same
# reads again, tierctl status timed every 0.2 s meanwhile. Prints p50/p99
# idle and flushing, their ratio against the 2x goal, what the flush
# destaged during the window and the slowest status answer. A window that
# the flush outlived is marked; one it did not is a short measurement.
# Asserts nothing about speed (a benchmark).
#
#   bash tests/bench/flush_foreground.sh
#   FF_SCENARIOS=file TC_BIN=/path/to/other/tiercached bash tests/bench/flush_foreground.sh
. "$(dirname "$0")/../lib.sh"
cd "$TC_ROOT" || exit 2
tc_tmpdir
TB=$TC_ROOT/build/tierbench
CTL=$TC_ROOT/build/tierctl
HDD=$TC_ROOT/tools/hdd-emulate.sh
[ -x "$TB" ] && [ -x "$TC_BIN" ] || { echo "flush_foreground: run make first" >&2; exit 2; }
SECS=${FF_SECS:-4}
SCENARIOS=${FF_SCENARIOS:-"file hdd"}
IQN=iqn.2026-12.io.tiercache:ff
echo "flush_foreground: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs shared by the client and the target"
echo "QD1 4 KiB reads of cached data, ${SECS} s idle then ${SECS} s into a flush with no cap; goal: p99 within 2x"
printf '%-6s %9s %9s %9s %9s %7s %10s %8s  %s\n' store "p50 idle" "p99 idle" "p50 fl" "p99 fl" "p99 x" "destaged" "status" ""

HDD_NAME=
cleanup_hdd() { [ -n "$HDD_NAME" ] && "$HDD" down "$HDD_NAME" >/dev/null 2>&1; HDD_NAME=; }
trap 'cleanup_hdd; _tc_cleanup' EXIT # the scratch directory holds GiBs

conf() { # PORT BACKING SIZE
	tc_conf_head "$1"
	cat <<CONF

[target $IQN]
lun0 = ff

[lun ff]
backing = $2
size = $3
cache = fast

[cache fast]
legs = $T/leg0.img $T/leg1.img
size = 2G
mode = write-back
dirty_target = 90
CONF
}
dirty() { "$CTL" -c "$T/t.conf" --json status | python3 -c 'import json,sys; print(json.load(sys.stdin)["caches"][0]["dirty_bytes"])'; }
lat() { python3 -c 'import json,sys; l=json.load(open(sys.argv[1]))["runs"][0]["latency_us"]; print(l["p50"], l["p99"])' "$1"; }

run() { # NAME BACKING SIZE DIRTY_MIB
	local name=$1 port url
	port=$(tc_free_port)
	conf "$port" "$2" "$3" >"$T/t.conf"
	rm -f "$T"/leg*.img
	if [ "$name" = hdd ]; then
		"$HDD" exec "$HDD_NAME" -- "$TC_BIN" -c "$T/t.conf" >>"$T/daemon.log" 2>&1 &
		TC_PID=$!
		tc_wait_for 30 "the daemon's portal" eval "echo >/dev/tcp/127.0.0.1/$port" 2>/dev/null
	else
		tc_start "$T/t.conf"
	fi
	url=iscsi://127.0.0.1:$port/$IQN/0
	# dirty data: 64 KiB random writes over 1.5 GiB until DIRTY_MIB are dirty
	local want=$(($4 << 20)) t0=$SECONDS
	while [ "$(dirty)" -lt "$want" ] && [ $((SECONDS - t0)) -lt 120 ]; do
		"$TB" --json --no-progress -b 64k --rand -r 0 -t 1 -q 8 --size 1536M -T 2 "$url" >/dev/null ||
			{ echo "$name: the fill failed"; return 1; }
	done
	"$TB" --json --no-progress -w 4k-randread -t 1 -q 1 --size 64M -T "$SECS" "$url" >"$T/idle.json" ||
		{ echo "$name: the idle run failed"; return 1; }
	local before after slow=0 ms
	before=$(dirty)
	"$CTL" -c "$T/t.conf" flush >/dev/null
	"$TB" --json --no-progress -w 4k-randread -t 1 -q 1 --size 64M -T "$SECS" "$url" >"$T/flush.json" &
	local load=$!
	while kill -0 "$load" 2>/dev/null; do
		local s=$(date +%s%N)
		"$CTL" -c "$T/t.conf" status >/dev/null
		ms=$((($(date +%s%N) - s) / 1000000))
		[ "$ms" -gt "$slow" ] && slow=$ms
		sleep 0.2
	done
	wait "$load" || { echo "$name: the run during the flush failed"; return 1; }
	after=$(dirty)
	read -r i50 i99 < <(lat "$T/idle.json")
	read -r f50 f99 < <(lat "$T/flush.json")
	local note="the flush outlived the window"
	[ "$after" -gt 0 ] || note="the flush ended inside the window"
	printf '%-6s %7.0fus %7.0fus %7.0fus %7.0fus %6.2fx %6d MiB %6d ms  %s\n' "$name" "$i50" "$i99" "$f50" "$f99" \
		"$(python3 -c "print($f99 / $i99)")" $(((before - after) >> 20)) "$slow" "$note"
	"$CTL" -c "$T/t.conf" flush --wait >/dev/null 2>&1
	tc_stop
}

for s in $SCENARIOS; do
	case $s in
	file) run file "$T/ff.img" 4G "${FF_DIRTY_MIB:-1200}" ;;
	hdd)
		if [ "$(id -u)" != 0 ]; then
			echo "hdd    n/a (the emulated HDD needs root)"
			continue
		fi
		HDD_NAME=ff$$
		"$HDD" up "$HDD_NAME" --size 2G --iops 300 >"$T/hdd.env" 2>"$T/hdd.err" ||
			{ echo "hdd    n/a (emulated HDD: $(cat "$T/hdd.err"))"; HDD_NAME=; continue; }
		. "$T/hdd.env"
		run hdd "$HDD_DEV" 2G "${FF_HDD_DIRTY_MIB:-256}"
		cleanup_hdd
		;;
	esac
done
