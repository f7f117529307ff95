#!/usr/bin/env bash
# tests/tools/repeat.sh N TEST... - run each test N times, beside
# `stress-ng --cpu 2` (LOAD=0: on an idle machine), and print how many runs
# passed: the check that a test passes every time, not most times, on two
# busy cores.
#   TEST: tests/test_NAME.sh, or a unit test binary (build/tests/test_NAME)
# The log of every failed run is kept in build/test-logs/repeat/.
# Run from the top of the tree after make.
set -u
[ $# -ge 2 ] || { echo "usage: $0 N TEST..." >&2; exit 2; }
n=$1
shift
logs=build/test-logs/repeat
mkdir -p "$logs"
load=
if [ "${LOAD:-1}" != 0 ]; then
	command -v stress-ng >/dev/null || { echo "stress-ng is not installed (apt-get install stress-ng)" >&2; exit 2; }
	stress-ng --cpu 2 --quiet &
	load=$!
	trap 'kill $load 2>/dev/null; wait $load 2>/dev/null' EXIT
fi
total_fail=0
for t in "$@"; do
	name=$(basename "$t" .sh)
	pass=0
	t0=$SECONDS
	for ((i = 1; i <= n; i++)); do
		case $t in
		*.sh) cmd=(bash "$t") ;;
		*) cmd=("$t") ;;
		esac
		if "${cmd[@]}" >"$logs/$name.run" 2>&1; then
			pass=$((pass + 1))
		else
			mv "$logs/$name.run" "$logs/$name.fail$i.log"
			echo "  $name run $i failed: $(grep -m1 -E '^FAIL' "$logs/$name.fail$i.log" || tail -1 "$logs/$name.fail$i.log")"
		fi
	done
	rm -f "$logs/$name.run"
	total_fail=$((total_fail + n - pass))
	echo "$name: $pass/$n passed ($((SECONDS - t0)) s${load:+, beside stress-ng --cpu 2})"
done
[ "$total_fail" = 0 ]
