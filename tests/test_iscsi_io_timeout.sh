#!/usr/bin/env bash
# A backing store that stops answering never wedges the target: io_timeout.
#
# LUN 0's backing file is on tests/tools/freeze_fs (FUSE), LUN 1's on a
# plain file; one worker serves both, and io_timeout is 2 s. With the
# store frozen, tests/tools/stuck_probe checks on one session that a
# WRITE, a 64K READ, SYNCHRONIZE CACHE, UNMAP and GET LBA STATUS are each
# answered ABORTED COMMAND / COMMAND TIMEOUT DURING PROCESSING between 2
# and 5 s; that LUN 1 and a new login keep answering meanwhile; that
# ABORT TASK, ABORT TASK SET, LUN RESET and TARGET WARM RESET over stuck
# writes are answered within 5 s (before io_timeout they waited for the
# store forever); and that a write B sent after write A was answered as
# failed lands after A once the store thaws. Then status shows the count,
# every held command comes back, and SIGTERM during a freeze still stops
# the daemon.
#
# Once the store has given every held command back, 64 READs sent at once
# on the same session are all answered: a command slot kept the overdue
# mark of its last command, and the next command in it was served but its
# answer dropped (seen as the READ of LBA 8 going unanswered once in a
# while, whenever an overdue command came back after write B).
#
# Both backing_io = direct and backing_io = buffered.
. "$(dirname "$0")/lib.sh"
tc_tmpdir
CTL=$TC_ROOT/build/tierctl
tc_freeze_fs 64M
tc_build_tool stuck_probe

overdue() { "$CTL" -c "$T/t.conf" --json status | python3 -c '
import json, sys
l = json.load(sys.stdin)["luns"][0]["timeouts"]
print(l["overdue_now"], l["overdue_total"], l["io_timeout_s"])'; }

# direct: io_timeout = 2 from the start; buffered: 30 at the start, then 2
# by a reload (SIGHUP), so every check of the probe runs on the reloaded value
for io in direct buffered; do
	tmo0=2
	[ $io = buffered ] && tmo0=30
	port=$(tc_free_port)
	base=iscsi://127.0.0.1:$port/iqn.2026-12.io.tiercache:stuck
	tc_conf_head "$port" | sed -e "s|^\[daemon\]|&\nworkers = 1|" >"$T/t.conf"
	cat >>"$T/t.conf" <<CONF

[target iqn.2026-12.io.tiercache:stuck]
lun0 = stuck
lun1 = other

[lun stuck]
backing = $T/ff/disk
size = 64M
backing_io = $io
write_cache = yes
io_timeout = $tmo0

[lun other]
backing = $T/other.img
size = 16M
CONF
	# each mode's checks of the log read that mode's daemon only
	[ -f "$T/daemon.log" ] && mv "$T/daemon.log" "$T/daemon-before-$io.log"
	tc_start "$T/t.conf"
	set -- $(overdue)
	[ "$3" = $tmo0 ] || fail "status gives io_timeout $3 s, the config $tmo0"
	if [ $tmo0 != 2 ]; then
		sed -i 's/^io_timeout = 30$/io_timeout = 2/' "$T/t.conf"
		kill -HUP "$TC_PID"
		tc_wait_for 30 "the reload to apply io_timeout = 2" \
			grep -q 'reload: \[lun stuck\] io_timeout 30 s -> 2 s' "$T/daemon.log"
		set -- $(overdue)
		[ "$3" = 2 ] || fail "after the reload status gives io_timeout $3 s, want 2"
		pass "backing_io = $io: a reload took io_timeout from 30 s to 2 s"
	fi

	# what both ends hold if a read ever goes unanswered (stuck_probe runs it)
	export STUCK_PROBE_ON_HANG="{ echo '--- sockets of port $port (Recv-Q Send-Q) ---'; ss -tnio '( sport = :$port or dport = :$port )';
		echo '--- status ---'; '$CTL' -c '$T/t.conf' --json status;
		echo '--- held by freeze_fs ---'; cat '$T/ff/held';
		echo '--- daemon threads ---'; for t in /proc/$TC_PID/task/*; do echo \"\$(cat \$t/comm) \$(cat \$t/wchan)\"; cat \$t/stack 2>/dev/null | head -8; done; } >'$T/hang-$io.out' 2>&1"
	# the probe's last phase waits for this: no command held any more
	export STUCK_PROBE_ALL_BACK="'$CTL' -c '$T/t.conf' --json status | python3 -c 'import json, sys; sys.exit(json.load(sys.stdin)[\"luns\"][0][\"timeouts\"][\"overdue_now\"] != 0)'"
	if ! STUCK_PROBE_HELD=$T/ff/held "$T/stuck_probe" "$base/0" "$base/1" "$TC_FF_PID" 2 >"$T/probe-$io.out" 2>&1; then
		# where the daemon's threads wait, taken before the thaw changes it
		for t in /proc/"$TC_PID"/task/*; do
			echo "thread $(cat "$t/comm" 2>/dev/null): $(cat "$t/wchan" 2>/dev/null)"
		done >"$T/threads-$io.out"
		tc_thaw
		echo "--- stuck_probe ($io) ---" >&2
		cat "$T/probe-$io.out" >&2
		echo "--- the daemon's threads while the probe was stuck, by wait channel ---" >&2
		sort -k3 "$T/threads-$io.out" | uniq -c -f2 >&2
		echo "--- status ---" >&2
		"$CTL" -c "$T/t.conf" --json status >&2 2>&1
		[ -f "$T/hang-$io.out" ] && { echo "--- while the read was unanswered ---"; cat "$T/hang-$io.out"; } >&2
		fail "backing_io = $io: $(grep -av '^ok' "$T/probe-$io.out" | tr '\n' ' ')"
	fi
	pass "backing_io = $io: $(grep -ac '^ok' "$T/probe-$io.out") checks of stuck_probe passed; $(grep -a 'ABORT TASK over\|WARM\|queued behind A' "$T/probe-$io.out" | sed 's/^ok: //' | tr '\n' ';')"
	tc_wait_for 30 "every command held past io_timeout to come back after the thaw" \
		eval '[ "$(overdue | cut -d" " -f1)" = 0 ]'
	set -- $(overdue)
	[ "$2" -ge 10 ] || fail "status counts $2 commands past io_timeout, the probe had at least 10"
	grep -q 'held a command longer than io_timeout' "$T/daemon.log" ||
		fail "nothing in the log says the store held commands past io_timeout"
	pass "backing_io = $io: after the thaw none is held; status counted $2 past io_timeout, and the log said so"

	# SIGTERM while a write is held by the frozen store
	tc_freeze
	qemu-io -f raw -c 'write -P 0x44 0 4k' "$base/0" >"$T/qio.out" 2>&1 &
	qio=$!
	tc_wait_for 30 "a write to be held by the frozen store" eval '[ "$(tc_held)" -ge 1 ]'
	t0=$(date +%s)
	kill -TERM "$TC_PID"
	# The daemon's own shutdown must end; the process itself may outlive it
	# only as long as the kernel keeps a thread in an uninterruptible FUSE
	# wait (a request the store holds), which no program can end.
	tc_wait_for 40 "the daemon to finish its shutdown on SIGTERM with a write held" \
		eval 'grep -q "stopped cleanly" "$T/daemon.log" || ! kill -0 "$TC_PID" 2>/dev/null'
	took=$(($(date +%s) - t0))
	tc_thaw
	tc_wait_for 30 "the daemon's process to end after the thaw" eval '! kill -0 "$TC_PID" 2>/dev/null'
	wait "$TC_PID" 2>/dev/null
	rc=$?
	TC_PID=
	kill "$qio" 2>/dev/null; wait "$qio" 2>/dev/null
	[ "$rc" = 0 ] || fail "backing_io = $io: SIGTERM with the store frozen: exit status $rc"
	grep -q "has not answered the fsync of its close" "$T/daemon.log" ||
		fail "backing_io = $io: the shutdown did not say it left the frozen file's fsync behind"
	pass "backing_io = $io: SIGTERM with a write held by the frozen store: shutdown done in $took s, exit status 0"
done
exit 0
