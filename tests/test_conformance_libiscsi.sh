#!/usr/bin/env bash
# The libiscsi conformance suite (iscsi-test-cu, all tests, destructive and
# sanitize tests allowed) against tiercached: 0 failures. tgtd, the reference
# userspace target, runs the same suite on a LUN of the same size in the same
# run, and both counts are printed; tiercached must skip fewer tests than it.
# TC_CU_NO_TGT=1 skips the tgtd half.
. "$(dirname "$0")/lib.sh"
tc_tmpdir
command -v iscsi-test-cu >/dev/null || skip "iscsi-test-cu not installed (libiscsi-bin)"

summary() { python3 "$TC_ROOT/tests/tools/cu_summary.py" "$@"; }
i1=iqn.2026-11.test:init1
i2=iqn.2026-11.test:init2

port=$(tc_free_port)
port2=$(tc_free_port)
while [ "$port2" = "$port" ]; do port2=$(tc_free_port); done
tc_basic_conf "$port" 256M | sed "s#^listen = .*#&\nlisten = 127.0.0.1:$port2#" >"$T/t.conf"
tc_start "$T/t.conf"
iqn=iqn.2026-11.io.tiercache:test
timeout 900 iscsi-test-cu --dataloss --allow-sanitize -i $i1 -I $i2 -t ALL \
	"iscsi://127.0.0.1:$port/$iqn/0" "iscsi://127.0.0.1:$port2/$iqn/0" >"$T/cu-tiercache.log" 2>&1
kill -0 "$TC_PID" 2>/dev/null || fail "tiercached died during the suite"
ours=$(summary "$T/cu-tiercache.log" --names)
cp "$T/cu-tiercache.log" "$TC_ROOT/build/test-logs/cu-tiercache.log" 2>/dev/null
echo "tiercached: $ours"
tc_stop

tgt_skipped=
if [ -z "${TC_CU_NO_TGT:-}" ] && command -v tgtd >/dev/null; then
	tport=$(tc_free_port)
	cport=$((20000 + RANDOM % 10000))
	truncate -s 256M "$T/tgt.img"
	tgtd -f -C "$cport" --iscsi portal=127.0.0.1:$tport >"$T/tgtd.log" 2>&1 &
	tgt_pid=$!
	trap 'kill -KILL $tgt_pid 2>/dev/null; _tc_cleanup' EXIT
	for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/$tport) 2>/dev/null && break; sleep 0.1; done
	tgtadm -C "$cport" --lld iscsi --op new --mode target --tid 1 -T iqn.2026-11.test:tgt &&
	tgtadm -C "$cport" --lld iscsi --op new --mode logicalunit --tid 1 --lun 1 -b "$T/tgt.img" &&
	tgtadm -C "$cport" --lld iscsi --op bind --mode target --tid 1 -I ALL || fail "tgtd setup failed"
	# tgt finishes the suite in well under a minute here; do not let a
	# wedged peer hold the run. tgtd ignores SIGTERM while targets exist.
	timeout 300 iscsi-test-cu --dataloss --allow-sanitize -i $i1 -I $i2 -t ALL \
		"iscsi://127.0.0.1:$tport/iqn.2026-11.test:tgt/1" >"$T/cu-tgt.log" 2>&1
	cu_rc=$?
	kill -KILL "$tgt_pid"; wait "$tgt_pid" 2>/dev/null
	theirs=$(summary "$T/cu-tgt.log" --names)
	if [ "$cu_rc" = 124 ]; then
		echo "tgtd:       did not finish the suite within 300 s; no comparison this run"
	else
		echo "tgtd:       $theirs"
		tgt_skipped=$(echo "$theirs" | head -1 | awk '{print $8}')
	fi
fi

line=$(echo "$ours" | head -1)
failed=$(echo "$line" | awk '{print $6}')
skipped=$(echo "$line" | awk '{print $8}')
total=$(echo "$line" | awk '{print $2}')
[ "$total" -ge 200 ] || fail "the suite ran only $total tests"
expect_eq "$failed" 0 "iscsi-test-cu failures against tiercached"
if [ -n "$tgt_skipped" ]; then
	[ "$skipped" -lt "$tgt_skipped" ] || fail "tiercached skipped $skipped tests, tgtd $tgt_skipped"
	pass "tiercached skips $skipped tests, tgtd $tgt_skipped"
fi
