#!/usr/bin/env bash
# The sizing advisor on a real filesystem workload: the replay of
# tests/data/advisor/ext4-build.trace.xz through the real policy at each
# size (1/4 .. 8x) against the advisor's curve from the same requests, for
# the set and for the LUN, within 5 points at every size, the replay
# spanning 30 points or more (tests/unit/test_advisor.c does the work).
#
# The trace: tierctl trace of the cache set in the system test guest
# while ext4 on a write-back LUN took Debian's zlib source tarball and,
# in three trees, unpacked, configured, built, tested and rebuilt it
# (tests/system/run-vm-initiator.sh, step 11: STEPS="1 11"): 2,475
# requests over 73 extents of 256 KiB (18 MiB). It is replayed with 16
# extents as "today's" size, so that the six sizes (4 to 128 extents)
# straddle its working set; the replay spans 33 points.
#
# What this proves, and what not: a trace this small fits under the
# advisor's 4096 slots per copy, so the advisor simulates every extent
# (sampling rate 1), as the daemon would at these sizes; the check ties
# the recorded stream (its pieces, streams, admit_hits 2, the LUN's
# write-back admission of writes) to the curves, and fails when the
# advisor's notes and the replay disagree on any of it (11 points off
# with writes not admitted in the notes). Sampling accuracy is checked on
# the 3-million-request synthetic trace of tests/unit/test_advisor.c.
. "$(dirname "$0")/lib.sh"
tc_tmpdir
bin=$TC_ROOT/build/tests/test_advisor
trace=$TC_ROOT/tests/data/advisor/ext4-build.trace.xz
[ -x "$bin" ] || skip "build/tests/test_advisor is not built"
[ -f "$trace" ] || fail "no $trace"
NSLOTS=${NSLOTS:-16}
"$bin" "$trace" "$NSLOTS" >"$T/out" 2>&1
rc=$?
sed -n '/requests,/,$p' "$T/out"
grep -q '^FAIL' "$T/out" && fail "$(grep '^FAIL' "$T/out" | tr '\n' ' ')"
[ $rc = 0 ] || fail "test_advisor exited $rc"
grep -q 'the advisor is within' "$T/out" || fail "no comparison was made"
pass "ext4 build trace at $NSLOTS slots: $(grep -c 'the advisor is within' "$T/out") curves within 5 points of the replay at every size, each spanning 30 points or more"
