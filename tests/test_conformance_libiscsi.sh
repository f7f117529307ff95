#!/usr/bin/env bash
# The libiscsi conformance suite (iscsi-test-cu, all tests, destructive and
# sanitize tests allowed, two portals so the multipath tests run) against
# tiercached on three kinds of LUN: a plain file, the file behind a
# write-back cache set and behind a write-through one, all at once. Each run
# must end with CUnit's Run Summary showing all 230 tests of the suite (what
# `iscsi-test-cu -l` lists) registered and run, no failed test or suite,
# iscsi-test-cu exiting 0, and exactly the skipped tests that
# tests/conformance-skips.txt lists for that kind: a newly skipped test, or
# a listed one that now runs, fails until the list is changed on purpose.
# A transcript without a Run Summary (a crash, a timeout) fails. tgtd, the
# reference userspace target, runs the same suite on a LUN of the same size
# behind two portals too; the skip counts are printed and tiercached must
# skip fewer. TC_CU_NO_TGT=1 leaves tgtd out.
. "$(dirname "$0")/lib.sh"
tc_tmpdir
command -v iscsi-test-cu >/dev/null || skip "iscsi-test-cu not installed (libiscsi-bin)"

skips_file=tests/conformance-skips.txt
summary() { python3 "$TC_ROOT/tests/tools/cu_summary.py" "$@"; }
iqn=iqn.2026-11.io.tiercache:test
# a run takes 30 to 130 s here (four at once on two busy cores); the bound
# only stops a wedged target from holding the test
cu_timeout=600

# The suite's full count: what -t ALL of libiscsi 1.19 registers, and what
# every run must register and run. Another libiscsi with another count
# fails here until its tests (and their skips) have been looked at.
full=230
listed=$(iscsi-test-cu -l 2>/dev/null | awk -F. '$1 == "ALL" && NF == 3' | wc -l)
[ "$listed" = "$full" ] ||
	fail "iscsi-test-cu -l lists $listed tests under ALL, not $full: a libiscsi with other tests; review $skips_file and the count"

# usage: run_cu NAME URL...   the whole suite, transcript in $T/cu-NAME.log
# (copied to $TC_LOGS, build/test-logs/ unless run.sh says), initiator names of its own; returns the exit
# status of iscsi-test-cu: 0 when CUnit recorded no failure, 1 when it did,
# 255 when it could not log in or set up, 10 on a usage error (its main());
# 124 from timeout.
run_cu() {
	local name=$1 rc t0=$SECONDS
	shift
	timeout "$cu_timeout" iscsi-test-cu --dataloss --allow-sanitize -t ALL \
		-i "iqn.2026-11.test:$name-1" -I "iqn.2026-11.test:$name-2" "$@" >"$T/cu-$name.log" 2>&1
	rc=$?
	echo "$name: the suite took $((SECONDS - t0)) s, iscsi-test-cu exited $rc"
	cp "$T/cu-$name.log" "$TC_LOGS/" 2>/dev/null
	return $rc
}
declare -A cu_pid cu_rc

# usage: field COUNTS ROW KEY   the number after KEY in the ROW line of
# cu_summary.py --run-summary
field() { awk -v r="$2" -v k="$3" '$1 == r { for (i = 2; i < NF; i++) if ($i == k) print $(i + 1) }' <<<"$1"; }

# usage: listed_skips KIND   the tests the committed list says KIND skips: a
# bare name is skipped on every kind, a name followed by kinds only on those
listed_skips() {
	awk -v kind="$1" '{ sub(/#.*/, "") } NF == 1 { print $1 } NF > 1 { for (i = 2; i <= NF; i++) if ($i == kind) print $1 }' \
		"$TC_ROOT/$skips_file" | sort -u
}

# usage: check GOT WANT WHAT   expect_eq, but a mismatch is noted rather than
# fatal, so that every kind is judged before the test fails
problems=()
check() {
	if [ "$1" = "$2" ]; then
		pass "$3"
	else
		problems+=("$3: expected '$2', got '$1'")
		echo "not ok: $3: expected '$2', got '$1'"
	fi
}

# usage: check_run KIND RC   the verdict on one tiercached run; sets nskipped
check_run() {
	local kind=$1 rc=$2 log="$TC_LOGS/cu-$1.log" out
	nskipped=
	if [ "$rc" = 124 ]; then
		check "did not finish" "finished" "$kind: iscsi-test-cu within $cu_timeout s (see $log)"
		return
	fi
	if ! out=$(summary "$T/cu-$kind.log" --run-summary); then
		check "none" "present" "$kind: CUnit Run Summary (iscsi-test-cu exited $rc; see $log)"
		return
	fi
	nskipped=$(field "$out" parsed skipped)
	echo "$kind: $(head -n 3 <<<"$out" | tr '\n' ';' | sed 's/;$//; s/;/; /g')"
	local failed_names
	failed_names=$(sed -n 's/^failed //p' <<<"$out" | tr '\n' ' ' | sed 's/ $//')
	check "$(field "$out" tests total)" "$full" "$kind: tests registered"
	check "$(field "$out" tests ran)" "$full" "$kind: tests run"
	check "$(field "$out" tests inactive)" 0 "$kind: inactive tests"
	check "$(field "$out" tests failed)" 0 "$kind: failed tests${failed_names:+ ($failed_names)}"
	check "$(field "$out" suites failed)" 0 "$kind: failed suites (a suite set-up or teardown that failed)"
	check "$(field "$out" suites ran)" "$(field "$out" suites total)" "$kind: suites run"
	# the per-test parse names the skipped tests; it must see every test
	# CUnit ran, with CUnit's verdicts, or its list of names means nothing
	check "$(field "$out" parsed tests) $(field "$out" parsed failed)" \
		"$(field "$out" tests ran) $(field "$out" tests failed)" "$kind: per-test verdicts agree with the Run Summary"
	check "$rc" 0 "$kind: iscsi-test-cu exit status"
	local got want new gone
	got=$(sed -n 's/^skipped //p' <<<"$out" | sort -u)
	want=$(listed_skips "$kind")
	new=$(comm -13 <(echo "$want") <(echo "$got") | grep . | tr '\n' ' ' | sed 's/ $//')
	gone=$(comm -23 <(echo "$want") <(echo "$got") | grep . | tr '\n' ' ' | sed 's/ $//')
	check "$new" "" "$kind: newly skipped tests (not in $skips_file)"
	check "$gone" "" "$kind: tests in $skips_file that now run (or do not exist)"
}

port=$(tc_free_port)
port2=$(tc_free_port)
while [ "$port2" = "$port" ]; do port2=$(tc_free_port); done
kinds="plain write-back write-through"

# One daemon, both portals, a target of one 256 MiB LUN per kind
# (tc_cu_target_conf). A target reset or a reservation only reaches its own
# target, so the three runs go at once (the suite is latency-bound: resets,
# CmdSN waits).
{
	tc_conf_head "$port"
	echo "listen = 127.0.0.1:$port2"
	for kind in $kinds; do
		tc_cu_target_conf "$iqn" $kind
	done
} >"$T/t.conf"
tc_start "$T/t.conf"
# a cached kind whose set did not attach would pass as a plain LUN
for kind in write-back write-through; do
	grep -q "cache $kind: lun $kind attached ($kind)" "$T/daemon.log" || fail "LUN $kind has no $kind cache set"
done

# tgtd on the same two portals and a LUN of the same size, at the same time
tgt_pid=
if [ -z "${TC_CU_NO_TGT:-}" ] && command -v tgtd >/dev/null; then
	tport=$(tc_free_port)
	tport2=$(tc_free_port)
	while [ "$tport2" = "$tport" ]; do tport2=$(tc_free_port); done
	cport=$((20000 + RANDOM % 10000))
	truncate -s 256M "$T/tgt.img"
	tgtd -f -C "$cport" --iscsi portal=127.0.0.1:$tport,portal=127.0.0.1:$tport2 >"$T/tgtd.log" 2>&1 &
	tgt_pid=$!
	# tgtd ignores SIGTERM while targets exist
	trap 'kill -KILL $tgt_pid 2>/dev/null; wait $tgt_pid 2>/dev/null; _tc_cleanup' EXIT
	tgtd_listening() {
		(exec 3<>/dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0
		kill -0 "$tgt_pid" 2>/dev/null || fail "tgtd exited at start: $(tail -5 "$T/tgtd.log")"
		return 1
	}
	for p in $tport $tport2; do
		tc_wait_for 60 "tgtd listening on port $p" tgtd_listening "$p"
	done
	tgtadm -C "$cport" --lld iscsi --op new --mode target --tid 1 -T iqn.2026-11.test:tgt &&
		tgtadm -C "$cport" --lld iscsi --op new --mode logicalunit --tid 1 --lun 1 -b "$T/tgt.img" &&
		tgtadm -C "$cport" --lld iscsi --op bind --mode target --tid 1 -I ALL || fail "tgtd setup failed"
	tgt=iqn.2026-11.test:tgt
	run_cu tgtd "iscsi://127.0.0.1:$tport/$tgt/1" "iscsi://127.0.0.1:$tport2/$tgt/1" &
	cu_pid[tgtd]=$!
fi

for kind in $kinds; do
	run_cu $kind "iscsi://127.0.0.1:$port/$iqn-$kind/0" "iscsi://127.0.0.1:$port2/$iqn-$kind/0" &
	cu_pid[$kind]=$!
done
for kind in $kinds; do
	wait "${cu_pid[$kind]}"
	cu_rc[$kind]=$?
done
kill -0 "$TC_PID" 2>/dev/null || fail "tiercached died during the suite"
tc_stop
# kept for a look at a failure; out of $T so that fail() below ends with
# the verdict, not the tail of a daemon that stopped cleanly
mv "$T/daemon.log" "$TC_LOGS/conformance-daemon.log" 2>/dev/null || rm -f "$T/daemon.log"

declare -A skipped_by
for kind in $kinds; do
	check_run $kind "${cu_rc[$kind]}"
	skipped_by[$kind]=$nskipped
done

tgt_skipped=
if [ -n "$tgt_pid" ]; then
	wait "${cu_pid[tgtd]}"
	rc=$?
	kill -KILL "$tgt_pid"
	wait "$tgt_pid" 2>/dev/null
	# tgt fails some tests (exit 1) and that is its own business; its skip
	# count is only worth comparing when it ran the whole suite
	out=
	[ "$rc" != 124 ] && out=$(summary "$T/cu-tgtd.log" --run-summary 2>/dev/null)
	if [ -n "$out" ] && [ "$(field "$out" tests ran)" = "$full" ]; then
		tgt_skipped=$(field "$out" parsed skipped)
		echo "tgtd: $(head -n 3 <<<"$out" | tr '\n' ';' | sed 's/;$//; s/;/; /g')"
	else
		echo "tgtd: did not run the whole suite (iscsi-test-cu exited $rc); no comparison this run"
	fi
fi

counts="plain ${skipped_by[plain]:-?}, write-back ${skipped_by[write-back]:-?}, write-through ${skipped_by[write-through]:-?}"
if [ -n "$tgt_skipped" ]; then
	for kind in $kinds; do
		[ -z "${skipped_by[$kind]}" ] || [ "${skipped_by[$kind]}" -lt "$tgt_skipped" ] ||
			problems+=("tiercached ($kind) skipped ${skipped_by[$kind]} tests, tgtd $tgt_skipped")
	done
	echo "skipped tests of $full: tiercached $counts; tgtd $tgt_skipped"
else
	echo "skipped tests of $full: tiercached $counts"
fi
[ ${#problems[@]} = 0 ] || fail "$(printf '%s\n' "${problems[@]}")"
pass "all three kinds of LUN pass the whole suite, and skip what $skips_file lists${tgt_skipped:+, fewer than tgtd}"
