#!/usr/bin/env bash
# Writes that meet a destage in progress wait for it without stalling the
# daemon. On an emulated slow HDD (tools/hdd-emulate.sh, daemon inside its
# cgroup) a small write-back cache is filled with dirty data by 16-session
# x 16-deep random writes, then takes 16x16 8K random 70/30 I/O while the
# LUN flips between write-back, write-through and write-around: each switch
# away from write-back starts a flush, so the cleaner destages slots that
# new write-through or write-around writes hit, and those writes must wait
# for the destage to end. Every client run must finish in time, the data
# must verify, and SIGTERM must stop the daemon cleanly. Needs root and a
# block-I/O cgroup (else skip).
. "$(dirname "$0")/lib.sh"
tc_tmpdir
[ "$(id -u)" = 0 ] || skip "needs root (emulated HDD)"
TB=$TC_ROOT/build/tierbench
CTL=$TC_ROOT/build/tierctl
HDD=$TC_ROOT/tools/hdd-emulate.sh
[ -x "$TB" ] && [ -x "$CTL" ] || skip "build/tierbench or build/tierctl missing; run make"
HDD_NAME=dstg$$
"$HDD" up "$HDD_NAME" --size 512M --iops 300 >"$T/hdd.env" 2>"$T/hdd.err" ||
	skip "emulated HDD unavailable: $(head -n 1 "$T/hdd.err")"
hdd_cleanup() {
	if [ -n "$TC_PID" ] && kill -0 "$TC_PID" 2>/dev/null; then
		kill -KILL "$TC_PID" 2>/dev/null
		wait "$TC_PID" 2>/dev/null
	fi
	"$HDD" down "$HDD_NAME" >/dev/null 2>&1
	_tc_cleanup
}
trap hdd_cleanup EXIT
. "$T/hdd.env"

port=$(tc_free_port)
iqn=iqn.2026-11.io.tiercache:test
url=iscsi://127.0.0.1:$port/$iqn/0
cat >"$T/t.conf" <<EOF
[daemon]
state_dir = $T/state
control_socket = $T/state/control.sock
log_level = warning

[portal]
listen = 127.0.0.1:$port

[target $iqn]
lun0 = disk0

[lun disk0]
backing = $HDD_DEV
block_size = 512
write_cache = no
cache = fast

[cache fast]
legs = $T/leg0.img $T/leg1.img
size = 16M
mode = write-back
EOF
mkdir -p "$T/state"
"$HDD" exec "$HDD_NAME" -- "$TC_BIN" -c "$T/t.conf" >>"$T/daemon.log" 2>&1 &
TC_PID=$!
tc_wait_port "$port" 60 || fail "daemon did not start"

# A stalled daemon never answers; a slow one (an HDD at 300 IOPS, two busy
# cores) only answers late. The deadlines below catch the first and leave
# room for the second: 300 s for a run of 4-6 s or a mode switch's flush,
# 120 s for one command, 600 s for the verify run (its final read-back of
# 96 MiB in 8 KiB units is bound by the HDD's IOPS).
rounds=${TC_DESTAGE_ROUNDS:-4}
for ((r = 1; r <= rounds; r++)); do
	# write-back first, so the flush of the next switch has much to destage
	timeout 300 "$TB" --no-progress -w 4k-randwrite -t 16 -q 16 --size 64M -T 4 --io-timeout 120 \
		"$url" >>"$T/tb.log" 2>&1 || fail "round $r: write-back load failed (exit $?)"
	timeout 300 "$TB" --no-progress -w 8k-7030 -t 16 -q 16 --size 64M -T 6 --io-timeout 120 \
		"$url" >>"$T/tb.log" 2>&1 &
	tb=$!
	for m in write-through write-back write-around write-through write-back; do
		sleep 1 # the load runs a while in each mode
		timeout 300 "$CTL" -c "$T/t.conf" mode disk0 "$m" >>"$T/ctl.log" 2>&1 ||
			fail "round $r: mode $m did not finish within 300 s (daemon stalled?)"
	done
	wait "$tb" || fail "round $r: the write load did not finish in time (exit $?; daemon stalled?)"
done
pass "$rounds rounds of 16x16 I/O with cache mode switches finished"

timeout 600 "$TB" --no-progress -w 8k-7030 -t 4 -q 16 --size 96M -T 4 --verify --io-timeout 120 "$url" \
	>"$T/verify.log" 2>&1 || { tail -n 5 "$T/verify.log" >&2; fail "verify run failed"; }
pass "data verifies after the switches"
tc_stop
pass "SIGTERM stopped the daemon cleanly"
