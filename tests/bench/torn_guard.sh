#!/usr/bin/env bash
# tests/bench/torn_guard.sh - what the torn-write guard (the block log)
# costs: 4 KiB random overwrites of dirty data on a write-back LUN with
# 4096-byte blocks (guarded: the legs are files, whose atomic write unit is
# not known) against the same on a LUN with 512-byte blocks (no guard), on
# the same leg files, one daemon, alternating, three times.
#
# Each row: IOPS, average and p99 latency (tierbench), and the block log
# records per acknowledged write (tierctl stats block_log_writes: on the
# guarded LUN the share of writes that met dirty blocks, the rest being
# blocks the cleaner had destaged meanwhile; 0 on the other); the last line
# gives the guarded/unguarded ratios of the medians. A benchmark: it asserts
# nothing about speed, and exits non-zero only when a run fails or the guard
# is not where it should be (records on the 512-byte LUN, or none on the
# 4 KiB one).
#
#   bash tests/bench/torn_guard.sh      (TG_SECS seconds per run, default 10; TG_QD, default 1 and 16)
. "$(dirname "$0")/../lib.sh"
cd "$TC_ROOT" || exit 2
tc_tmpdir
TB=$TC_ROOT/build/tierbench
[ -x "$TB" ] && [ -x "$TC_BIN" ] || { echo "torn_guard: run make first" >&2; exit 2; }
mkdir -p "$T/bin" && cp "$TB" "$TC_BIN" "$TC_ROOT/build/tierctl" "$T/bin/" || exit 2
TB=$T/bin/tierbench TC_BIN=$T/bin/tiercached CTL=$T/bin/tierctl
SECS=${TG_SECS:-10}
QDS=${TG_QD:-"1 16"}
AREA=64M
port=$(tc_free_port)
iqn=iqn.2026-11.io.tiercache:test
{
	tc_conf_head "$port"
	cat <<CONF

[target $iqn]
lun0 = g4k
lun1 = g512

[lun g4k]
backing = $T/g4k.img
size = 256M
block_size = 4096
cache = fast

[lun g512]
backing = $T/g512.img
size = 256M
block_size = 512
cache = fast

[cache fast]
legs = $T/leg0.img $T/leg1.img
size = 1G
extent = 256K
mode = write-back
admit_hits = 1
dirty_target = 90
CONF
} >"$T/t.conf"
tc_start "$T/t.conf"
grep -q "\[lun g4k\]: 4096-byte blocks; cache leg" "$T/daemon.log" ||
	{ echo "torn_guard: the 4 KiB LUN was not put under the guard" >&2; tc_stop; exit 1; }
logged() { "$CTL" -c "$T/t.conf" --json stats | python3 -c 'import json,sys; print(json.load(sys.stdin)["caches"][0]["block_log_writes"])'; }
# make the area cached and dirty on both LUNs (twice: the second pass overwrites cached blocks)
for l in 0 1 0 1; do
	"$TB" -w 4k-randwrite --seq -b 256k -t 1 -q 8 --size $AREA -n $((64 * 4)) --no-progress --json \
		"iscsi://127.0.0.1:$port/$iqn/$l" >/dev/null || { echo "torn_guard: precondition failed" >&2; tc_stop; exit 1; }
done
errors=0
declare -A IOPS LAT REC
printf '%-8s %4s %5s %10s %10s %10s %12s\n' LUN QD run IOPS avg_us p99_us records/ack
for qd in $QDS; do
	t=1
	[ "$qd" -gt 4 ] && t=4 q=$((qd / 4)) || q=$qd
	for run in 1 2 3; do
		for l in 0 1; do
			name=$([ $l = 0 ] && echo 4k-guard || echo 512)
			before=$(logged)
			out=$("$TB" -w 4k-randwrite -t $t -q $q --size $AREA -T "$SECS" --no-progress --json \
				"iscsi://127.0.0.1:$port/$iqn/$l") || { errors=$((errors + 1)); continue; }
			after=$(logged)
			read -r iops avg p99 n < <(python3 -c '
import json,sys
r=json.loads(sys.argv[1])["runs"][0]
print(r["iops"], r["latency_us"]["avg"], r["latency_us"]["p99"], r["ios"])' "$out")
			rec=$(python3 -c "print('%.2f' % (($after - $before) / max(1, $n)))")
			printf '%-8s %4s %5s %10.0f %10.1f %10.1f %12s\n' "$name" "$qd" "$run" "$iops" "$avg" "$p99" "$rec"
			IOPS[$name,$qd]+="$iops "
			LAT[$name,$qd]+="$avg "
			REC[$qd]+="$rec "
			if [ $l = 0 ] && [ "$after" = "$before" ]; then
				echo "torn_guard: the guarded LUN logged no overwrite" >&2
				errors=$((errors + 1))
			fi
			if [ $l = 1 ] && [ "$after" != "$before" ]; then
				echo "torn_guard: the 512-byte LUN went through the block log" >&2
				errors=$((errors + 1))
			fi
		done
	done
	python3 - "${IOPS[4k-guard,$qd]}" "${IOPS[512,$qd]}" "${LAT[4k-guard,$qd]}" "${LAT[512,$qd]}" "$qd" <<'PY'
import statistics, sys
g, u, lg, lu = ([float(x) for x in a.split()] for a in sys.argv[1:5])
print("QD%s medians: guarded %.0f IOPS / %.1f us, unguarded %.0f IOPS / %.1f us: IOPS ratio %.2f, latency ratio %.2f"
      % (sys.argv[5], statistics.median(g), statistics.median(lg), statistics.median(u), statistics.median(lu),
         statistics.median(g) / statistics.median(u), statistics.median(lg) / statistics.median(lu)))
PY
done
tc_stop
exit $((errors > 0))
