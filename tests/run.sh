#!/usr/bin/env bash
# tests/run.sh - run every test and print one summary line.
#
#   unit tests      build/tests/test_*          (C programs, exit 0 = pass)
#   TSan builds     build/tests/tsan/test_*     (the map and policy under TSan)
#   shell tests     tests/test_*.sh             (exit 0 pass, 77 skip)
#   fuzz smoke      build/fuzz/fuzz_*           (libFuzzer, a short time each,
#                                                seeded from tests/fuzz/corpus/NAME)
# Logs go to build/test-logs/. TC_LONG=1 runs the long variants. A pattern
# argument runs only the tests whose name contains it.
set -u
cd "$(dirname "$0")/.."
logs=build/test-logs
mkdir -p "$logs/unit" "$logs/tsan" "$logs/fuzz"
filter=${1:-}
passed=0 failed=0 skipped=0
failures=()
fuzz_secs=${TC_FUZZ_SECS:-20}
[ -n "${TC_LONG:-}" ] && fuzz_secs=300

run_one() {
	local name=$1
	shift
	[ -n "$filter" ] && [[ "$name" != *"$filter"* ]] && return
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
		tail -n 25 "$logs/$name.log" | sed 's/^/      | /'
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

for t in tests/test_*.sh; do
	[ -f "$t" ] || continue
	run_one "$(basename "$t" .sh)" bash "$t"
done

for f in build/fuzz/fuzz_*; do
	[ -x "$f" ] || continue
	name=$(basename "$f")
	corpus=tests/fuzz/corpus/${name#fuzz_}
	work=$(mktemp -d)
	[ -d "$corpus" ] && cp -r "$corpus/." "$work/"
	# -error_exitcode: libFuzzer's default (77) is the skip code here
	run_one "fuzz/$name" "$f" -max_total_time="$fuzz_secs" -timeout=10 -rss_limit_mb=2048 -error_exitcode=1 \
		-artifact_prefix="$logs/$name-" -print_final_stats=1 "$work"
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
