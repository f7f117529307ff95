#!/usr/bin/env bash
# test_iscsi_conformance_families.sh - the iSCSI families of libiscsi's
# conformance suite (iscsi-test-cu -t iSCSI: CmdSN window, DataSN checks,
# residual over/underflow, task management), which exercise the portal
# rather than SCSI emulation: 0 failures, and the daemon survives them.
# test_conformance_libiscsi.sh runs the whole suite.
. "$(dirname "$0")/lib.sh"
tc_tmpdir
command -v iscsi-test-cu >/dev/null || skip "iscsi-test-cu not installed (libiscsi-bin)"

port=$(tc_free_port)
iqn=iqn.2026-11.io.tiercache:test
tc_basic_conf "$port" 64M >"$T/t.conf"
tc_start "$T/t.conf"
timeout 600 iscsi-test-cu --dataloss -i iqn.2026-11.test:init1 -I iqn.2026-11.test:init2 \
	-t iSCSI "iscsi://127.0.0.1:$port/$iqn/0" >"$T/cu.log" 2>&1
kill -0 "$TC_PID" 2>/dev/null || fail "tiercached died during the iSCSI tests"
summary=$(grep -E '^ +tests ' "$T/cu.log")
[ -n "$summary" ] || fail "no CUnit summary: $(tail -5 "$T/cu.log")"
echo "iscsi-test-cu -t iSCSI:$summary"
total=$(echo "$summary" | awk '{print $2}')
failed=$(echo "$summary" | awk '{print $5}')
[ "$total" -ge 15 ] || fail "only $total iSCSI tests ran"
if [ "$failed" != 0 ]; then
	grep -E '^  Test: .*' "$T/cu.log" | grep -v 'passed$' >&2
	grep -B1 -E '^FAILED' "$T/cu.log" | grep 'Test:' >&2
fi
expect_eq "$failed" 0 "failed iSCSI conformance tests"
tc_stop
