#!/usr/bin/env bash
# tests/run.sh - run every test and print one summary line.
#
#   unit tests      build/tests/test_*          (C programs, exit 0 = pass)
#   TSan builds     build/tests/tsan/test_*     (the map and policy under TSan)
#   shell tests     tests/test_*.sh             (exit 0 pass, 77 skip)
#   epoll wait      epoll_shell_tests again     (TIERCACHE_RING_WAIT=0)
#   fuzz regression build/fuzz/fuzz_* over tests/fuzz/regress/NAME/ (inputs
#                                                that once crashed or hung a
#                                                harness: each must run clean)
#   fuzz smoke      build/fuzz/fuzz_*           (libFuzzer, a short time each,
#                                                seeded from tests/fuzz/corpus/NAME)
#   ASan + UBSan    build/asan/tests/test_*     (make asan: every unit test, and
#                   build/asan/tiercached        the shell tests in asan_shell_tests
#                                                run on that daemon), as asan/NAME
# Logs go to build/test-logs/. TC_LONG=1 runs the long variants: each fuzzer
# then runs for at least 20 minutes and at least a million executions
# (TC_FUZZ_LONG_SECS, TC_FUZZ_LONG_RUNS), and its execution count is printed.
# A pattern argument runs only the tests whose name contains it.
set -u
cd "$(dirname "$0")/.."
logs=build/test-logs
mkdir -p "$logs/unit" "$logs/tsan" "$logs/fuzz" "$logs/fuzz-regress" "$logs/asan" "$logs/epoll"
filter=${1:-}
passed=0 failed=0 skipped=0
failures=()
fuzz_secs=${TC_FUZZ_SECS:-8}
fuzz_long_secs=${TC_FUZZ_LONG_SECS:-1200}
fuzz_long_runs=${TC_FUZZ_LONG_RUNS:-1000000}

# What a failed test printed, the reason first: the test's own last lines
# (up to the daemon log tail that lib.sh's fail appends), then the end of
# that daemon log. A CI report shows only so much; a daemon tail alone
# would hide why the test failed.
fail_excerpt() {
	local log=$1 mark='--- daemon log (tail) ---'
	if grep -qxF -- "$mark" "$log"; then
		sed "/^$mark\$/,\$d" "$log" | tail -n 15
		echo "$mark"
		sed "1,/^$mark\$/d" "$log" | tail -n 10
	else
		tail -n 25 "$log"
	fi
}

run_one() {
	local name=$1
	shift
	[ -n "$filter" ] && [[ "$name" != *"$filter"* ]] && return
	ran=1
	local start=$SECONDS rc
	"$@" >"$logs/$name.log" 2>&1 </dev/null
	rc=$?
	local took=$((SECONDS - start))
	if [ $rc = 0 ]; then
		passed=$((passed + 1))
		printf 'PASS  %-40s %4ds\n' "$name" "$took"
	elif [ $rc = 77 ]; then
		skipped=$((skipped + 1))
		printf 'SKIP  %-40s %4ds  %s\n' "$name" "$took" "$(grep -m1 '^SKIP' "$logs/$name.log")"
	else
		failed=$((failed + 1))
		failures+=("$name")
		printf 'FAIL  %-40s %4ds (exit %d)\n' "$name" "$took" "$rc"
		fail_excerpt "$logs/$name.log" | sed 's/^/      | /'
	fi
}

for t in build/tests/test_*; do
	[ -x "$t" ] || continue
	run_one "unit/$(basename "$t")" "$t"
done

# ThreadSanitizer builds (make tsan): any report fails the test
for t in build/tests/tsan/test_*; do
	[ -x "$t" ] || continue
	TSAN_OPTIONS="suppressions=tests/unit/tsan.supp halt_on_error=1 exitcode=66" \
		run_one "tsan/$(basename "$t")" "$t"
done

# Shell tests that run only in make check-long (TC_LONG), to keep make check
# within its 30 minutes on 2 cores; make check lists them as skipped.
# test_tierbench_rate (about 110 s) checks the benchmark tool's open loop
# against queueing formulas, not the daemon (test_tierbench_smoke covers
# the tool's everyday use in make check).
long_shell_tests="test_tierbench_rate"
for t in tests/test_*.sh; do
	[ -f "$t" ] || continue
	name=$(basename "$t" .sh)
	if [ -z "${TC_LONG:-}" ] && [[ " $long_shell_tests " == *" $name "* ]]; then
		run_one "$name" sh -c 'echo "SKIP: runs in make check-long (TC_LONG=1), not make check"; exit 77'
		continue
	fi
	run_one "$name" bash "$t"
done

# The workers' older wait (epoll, completions through an eventfd), the one
# kernels before 5.11 get, forced with TIERCACHE_RING_WAIT=0: these shell
# tests run again on it, as epoll/NAME (tests/unit/test_worker_watch.c runs
# its cases under both, tests/test_worker_wait.sh tells them apart).
epoll_shell_tests="test_iscsi_data_path test_cache_modes_iscsi test_worker_poll test_iscsi_raw_protocol test_cleaner_yield"
for name in $epoll_shell_tests; do
	if [ -f "tests/$name.sh" ]; then
		run_one "epoll/$name" env TIERCACHE_RING_WAIT=0 bash "tests/$name.sh"
	else
		run_one "epoll/$name" sh -c "echo 'tests/$name.sh (in epoll_shell_tests) does not exist'; exit 1"
	fi
done

# AddressSanitizer + UndefinedBehaviorSanitizer builds (make asan): every
# unit test, and these shell tests with TC_BIN on the ASan daemon. Any
# report fails the test: ASan, LSan (at exit, so after a SIGTERM, not a
# kill -9) and UBSan make the process exit 66, tests/lib.sh's tc_stop fails
# on that, and its exit trap fails a test whose daemon log holds a report
# (a daemon that died of one while the test was about to kill it anyway).
# tests/unit/lsan.supp says why each leak suppression is there. Under ASan
# test_cache_powercut recovers 60 power-cut images, not its thousands,
# test_cache_crash_kill9 runs 10 kill cycles, not 20 (200 in check-long), and
# the conformance run leaves tgtd out (the plain run compares against it).
# test_cache_crash_kill9 once had its daemon not finish a SIGTERM shutdown
# within 60 s here (stuck before the final checkpoint); tc_stop writes every
# thread's stack to the daemon log when that happens, which is how the cause
# was found: the final checkpoint spun on worker 0 waiting for a running one
# whose completions that spin kept it from reaping (fixed in cache/set.c,
# tests/unit/test_cache_ckpt_stop.c).
asan_shell_tests="test_iscsi_data_path test_conformance_libiscsi test_cache_modes_iscsi test_cache_leg_faults test_cache_crash_kill9 test_tierctl_trace test_pr_preempt_abort test_cleaner_yield"
asan_kill_cycles=10
[ -n "${TC_LONG:-}" ] && asan_kill_cycles=200
asan_env=(
	ASAN_OPTIONS="halt_on_error=1:abort_on_error=0:exitcode=66:detect_leaks=1"
	LSAN_OPTIONS="suppressions=$PWD/tests/unit/lsan.supp:print_suppressions=0:exitcode=66"
	UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:exitcode=66"
	PC_CUTS=60
	TC_CYCLES="$asan_kill_cycles"
	TC_CU_NO_TGT=1
	TC_LOGS="$PWD/$logs/asan"
)
for t in build/asan/tests/test_*; do
	[ -x "$t" ] || continue
	run_one "asan/$(basename "$t")" env "${asan_env[@]}" "$t"
done
for name in $asan_shell_tests; do
	[ -x build/asan/tiercached ] || break
	if [ -f "tests/$name.sh" ]; then
		run_one "asan/$name" env "${asan_env[@]}" TC_BIN="$PWD/build/asan/tiercached" bash "tests/$name.sh"
	else
		run_one "asan/$name" sh -c "echo 'tests/$name.sh (in asan_shell_tests) does not exist'; exit 1"
	fi
done

# libFuzzer flags every fuzz run shares. -error_exitcode/-timeout_exitcode:
# libFuzzer's defaults may be 77, the skip code here.
fuzz_flags=(-timeout=10 -rss_limit_mb=2048 -error_exitcode=1 -timeout_exitcode=1)

# Regression inputs: every file of tests/fuzz/regress/NAME/ (but README*
# and flags) through its harness once; the folder's flags file, if any, adds
# libFuzzer flags (e.g. a shorter -timeout and -runs=N repeats, for inputs
# that crashed only when libFuzzer's alarm came during them). A folder with
# no input still proves the harness starts and runs the empty input.
for f in build/fuzz/fuzz_*; do
	[ -x "$f" ] || continue
	name=$(basename "$f")
	dir=tests/fuzz/regress/${name#fuzz_}
	inputs=() extra=()
	if [ -d "$dir" ]; then
		for i in "$dir"/*; do
			case $(basename "$i") in README* | flags) continue ;; esac
			[ -f "$i" ] && inputs+=("$i")
		done
		[ -f "$dir/flags" ] && read -r -a extra <"$dir/flags"
	fi
	empty=
	if [ ${#inputs[@]} = 0 ]; then
		empty=$(mktemp -d)
		inputs=("$empty")
		extra+=(-runs=0)
	fi
	run_one "fuzz-regress/$name" "$f" "${fuzz_flags[@]}" -artifact_prefix="$logs/$name-regress-" "${extra[@]}" \
		"${inputs[@]}"
	[ -n "$empty" ] && rm -rf "$empty"
done

# One fuzzing campaign in work dir $2 with harness $1. Short (make check):
# fuzz_secs seconds. Long (TC_LONG): max(fuzz_long_secs, fuzz_long_runs
# executions): libFuzzer stops at whichever of -max_total_time and -runs
# comes first, so run for the time, and if that did fewer executions than
# wanted, go on in the same corpus with -runs for the rest.
fuzz_campaign() {
	local bin=$1 work=$2 name
	name=$(basename "$bin")
	if [ -z "${TC_LONG:-}" ]; then
		"$bin" "${fuzz_flags[@]}" -max_total_time="$fuzz_secs" -artifact_prefix="$logs/$name-" \
			-print_final_stats=1 "$work"
		return
	fi
	"$bin" "${fuzz_flags[@]}" -max_total_time="$fuzz_long_secs" -artifact_prefix="$logs/$name-" \
		-print_final_stats=1 "$work" || return
	local done_runs
	done_runs=$(fuzz_execs "$logs/fuzz/$name.log")
	if [ "${done_runs:-0}" -lt "$fuzz_long_runs" ]; then
		echo "== $done_runs executions in ${fuzz_long_secs} s: $((fuzz_long_runs - done_runs)) more to reach $fuzz_long_runs"
		"$bin" "${fuzz_flags[@]}" -runs=$((fuzz_long_runs - done_runs)) -artifact_prefix="$logs/$name-" \
			-print_final_stats=1 "$work"
	fi
}

# Executions a fuzz log reports, summed over its runs.
fuzz_execs() {
	awk '/^stat::number_of_executed_units:/ { n += $2 } END { print n + 0 }' "$1"
}

for f in build/fuzz/fuzz_*; do
	[ -x "$f" ] || continue
	name=$(basename "$f")
	corpus=tests/fuzz/corpus/${name#fuzz_}
	work=$(mktemp -d)
	[ -d "$corpus" ] && cp -r "$corpus/." "$work/"
	start=$SECONDS ran=
	run_one "fuzz/$name" fuzz_campaign "$f" "$work"
	[ -n "$ran" ] && printf '      %s: %d executions in %d s\n' "$name" "$(fuzz_execs "$logs/fuzz/$name.log")" \
		$((SECONDS - start))
	rm -rf "$work"
done

if [ ${#failures[@]} -gt 0 ]; then
	echo "failed: ${failures[*]} (logs in $logs/)"
fi
if [ $skipped -gt 0 ]; then
	summary="$passed passed, $failed failed, $skipped skipped"
else
	summary="$passed passed, $failed failed"
fi
echo "$summary" >"$logs/summary.txt"
echo "$summary"
[ $failed = 0 ]
