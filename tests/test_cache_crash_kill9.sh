#!/usr/bin/env bash
# Write-back survives kill -9. Each cycle, tests/tools/stamp_io writes the
# first 24 MiB of a LUN from 4 sessions at QD32 (512 B .. 256 KiB, some with
# FUA; every other cycle with WCE=1 and SYNCHRONIZE CACHE), every sector
# stamped (LBA, seq, checksum), and logs every write issued, every
# acknowledgement and every completed SYNCHRONIZE CACHE. Once this cycle's
# log holds >= 1000 acknowledgements, and a random moment later, the daemon
# is SIGKILLed. Then:
#   - offline, before the restart, tests/tools/leg_read.py reads each leg's
#     metadata and data the way recovery would (superblocks, slot table,
#     journal replay) and each leg's view of the LUN must pass the rule;
#   - the restart must report an unclean recovery with dirty data;
#   - every logged sector is read twice over iSCSI: the reads must agree and
#     pass the rule.
# The rule: a sector holds the last write of it that was durable (acked with
# WCE=0 or FUA, or followed by a completed SYNCHRONIZE CACHE) or one issued
# after it; never older data, never garbage. Every 5 cycles and at the end
# the daemon stops cleanly: both legs must be identical on every valid block
# and hold what iSCSI read, and no valid clean block may differ from the
# backing store (an eviction would change what it reads). The cache is smaller
# than the written region, so eviction, bypass writes, promotion and the
# cleaner all run between the kills. 20 cycles (200 with TC_LONG=1; TC_CYCLES
# overrides).
. "$(dirname "$0")/lib.sh"
tc_tmpdir
# a private copy: the daemon is restarted many times, a rebuild meanwhile must not matter
cp "$TC_BIN" "$T/tiercached" || fail "no daemon binary at $TC_BIN; run make"
TC_BIN=$T/tiercached
# the helpers are part of the test: one that does not build fails it
cc -std=gnu11 -O2 -Wall -Wextra -o "$T/stamp_io" "$TC_ROOT/tests/tools/stamp_io.c" -liscsi 2>"$T/cc.log" ||
	fail "cannot build tests/tools/stamp_io.c against libiscsi: $(head -5 "$T/cc.log")"
legread() { python3 "$TC_ROOT/tests/tools/leg_read.py" "$@"; }
legread >/dev/null 2>&1
[ $? = 2 ] || fail "tests/tools/leg_read.py does not run (python3 missing or the script broken)"

port=$(tc_free_port)
url=iscsi://127.0.0.1:$port/iqn.2026-11.io.tiercache:test/0
tc_basic_conf "$port" 64M >"$T/t.conf"
cat >>"$T/t.conf" <<CONF
cache = fast

[cache fast]
legs = $T/leg0.img $T/leg1.img
size = 16M
extent = 64K
mode = write-back
admit_hits = 1
CONF

sectors=$((24 << 11)) # the written region: 24 MiB, the cache holds about 14
cycles=${TC_CYCLES:-20}
[ -n "${TC_LONG:-}" ] && cycles=${TC_CYCLES:-200}
clean_every=5
min_acks=1000
logs() { ls "$T"/log.*; } # cycle order (zero-padded)

# wait until LOG holds N acknowledgements; 1 if the writer PID ended first or 30 s passed
wait_acks() {
	local log=$1 want=$2 pid=$3 k
	for ((k = 0; k < 600; k++)); do
		[ -f "$log" ] && [ "$(grep -c '^A' "$log")" -ge "$want" ] && return 0
		kill -0 "$pid" 2>/dev/null || return 1
		sleep 0.05
	done
	return 1
}

# the daemon log written since line $1 (this start's lines only)
log_since() { tail -n +"$(($1 + 1))" "$T/daemon.log"; }

# after an unclean stop: each leg's view, offline, must pass the rule
check_legs_offline() {
	local i=$1 k out
	for k in 0 1; do
		out=$(legread view "$T/leg$k.img" "$T/disk0.img" disk0 $sectors "$T/view$k.img") ||
			fail "cycle $i: leg_read.py cannot read leg $k: $out"
		echo "  offline $out"
		out=$("$T/stamp_io" check "$T/view$k.img" $sectors $(logs)) ||
			fail "cycle $i: leg $k's view after the kill breaks the rule: $out"
		echo "  leg $k view: $out"
	done
	echo "  legs' views: $(legread diffviews "$T/view0.img" "$T/view1.img")"
}

# a restart after kill -9: an unclean recovery that found dirty data
start_after_kill() {
	local i=$1 n0 lines dirty
	n0=$(wc -l <"$T/daemon.log")
	tc_start "$T/t.conf"
	lines=$(log_since "$n0")
	grep -q "cache fast: not shut down cleanly; recovering from the journal" <<<"$lines" ||
		fail "cycle $i: the restart after kill -9 did not report an unclean shutdown: $lines"
	dirty=$(sed -n 's/.*cache fast: recovered [0-9]* cached extents (.*), \([0-9]*\) dirty KiB.*/\1/p' <<<"$lines")
	[ -n "$dirty" ] || fail "cycle $i: the restart did not report what it recovered: $lines"
	[ "$dirty" -gt 0 ] || fail "cycle $i: the recovery found no dirty data; the kill tested nothing"
	echo "  restart: $(grep -o 'recovered .*' <<<"$lines")"
}

# a clean stop: the legs must agree on every valid block, and the views must be what iSCSI read
stop_and_compare() {
	local i=$1 out
	tc_stop
	out=$(legread compare "$T/leg0.img" "$T/leg1.img" "$T/disk0.img" disk0) ||
		fail "cycle $i: after a clean stop the legs differ: $out"
	echo "  clean stop: $(tail -1 <<<"$out")"
	out=$(legread view "$T/leg0.img" "$T/disk0.img" disk0 $sectors "$T/view0.img") ||
		fail "cycle $i: leg_read.py: $out"
	out=$("$T/stamp_io" check "$T/view0.img" $sectors $(logs)) ||
		fail "cycle $i: after a clean stop the legs break the rule: $out"
	cmp -s "$T/view0.img" "$T/read.img" ||
		fail "cycle $i: after a clean stop the legs do not hold what iSCSI read before it: $(cmp "$T/view0.img" "$T/read.img")"
}

start=$SECONDS
total_acks=0
tc_start "$T/t.conf"
for ((i = 1; i <= cycles; i++)); do
	log=$(printf '%s/log.%04d' "$T" "$i")
	wce=$((i % 2 == 0 ? 1 : 0))
	"$T/stamp_io" write "$url" "$log" $((i * 10000000)) $sectors --sessions 4 --qd 32 --wce $wce \
		>"$T/writer.log" 2>&1 &
	wpid=$!
	wait_acks "$log" $min_acks $wpid ||
		fail "cycle $i: no $min_acks acknowledgements: $(grep -c '^A' "$log" 2>/dev/null) so far; writer: $(cat "$T/writer.log")"
	# then somewhere within the next 0.6 s
	sleep "$(awk -v r=$RANDOM 'BEGIN { printf "%.2f", (r % 60) / 100 }')"
	kill -KILL "$TC_PID"
	wait "$TC_PID" 2>/dev/null
	TC_PID=
	wait "$wpid" || fail "cycle $i: the writer failed (exit $?): $(cat "$T/writer.log")"
	acks=$(grep -c '^A' "$log")
	[ "$acks" -ge $min_acks ] || fail "cycle $i: only $acks acknowledgements"
	total_acks=$((total_acks + acks))
	echo "cycle $i (WCE=$wce): $(tail -1 "$T/writer.log")"
	check_legs_offline "$i"
	start_after_kill "$i"
	out=$("$T/stamp_io" verify "$url" $sectors $(logs) --dump "$T/read.img") || fail "cycle $i: $out"
	echo "  iSCSI: $(tail -1 <<<"$out")"
	if ((i % clean_every == 0 || i == cycles)); then
		stop_and_compare "$i"
		if ((i < cycles)); then
			n0=$(wc -l <"$T/daemon.log")
			tc_start "$T/t.conf"
			log_since "$n0" | grep -q "not shut down cleanly" && fail "cycle $i: a clean stop was taken for a crash"
		fi
	fi
done
pass "$cycles kill -9 cycles in $((SECONDS - start)) s: every durable write read back, offline from each leg and over iSCSI ($total_acks acknowledged writes)"
