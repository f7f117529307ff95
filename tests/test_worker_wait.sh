#!/usr/bin/env bash
# A worker's one wait point (common/worker.c): sockets are polls in the same
# io_uring as the leg I/O, and the iteration's submit is the call that
# waits. Checked from the worker's system calls (strace -c) while it serves
# 2000 QD1 4K reads and 2000 QD1 4K writes from an O_DIRECT file LUN:
#  - by default `tierctl status` says worker_wait io_uring, the worker makes
#    no epoll_wait but for accepting the two connections (the listening
#    socket waits in the epoll set the ring polls), and at most 2.5
#    io_uring_enter per command (2: the wait for the command, then the
#    submit of its I/O and the wait for it in one call; a submit of its own
#    makes it 3);
#  - with TIERCACHE_RING_WAIT=0 (the wait on kernels before 5.11) status
#    says epoll and the worker waits in epoll_wait, at least once per
#    command; the data written is read back in both;
#  - after a kill -9, nothing accepts connections on the portal's port once
#    the daemon is reaped (the listening socket is not held by the ring).
. "$(dirname "$0")/lib.sh"
tc_tmpdir
TB=$TC_ROOT/build/tierbench
CTL=$TC_ROOT/build/tierctl
[ -x "$TB" ] && [ -x "$CTL" ] || skip "build/tierbench or build/tierctl is not built"
command -v strace >/dev/null || skip "strace is not installed"
port=$(tc_free_port)
url=iscsi://127.0.0.1:$port/iqn.2026-11.io.tiercache:test/0
tc_basic_conf "$port" 64M | sed 's/^log_level = info$/log_level = info\nworkers = 1/' >"$T/t.conf"
n=2000

# calls KIND: start the daemon (KIND epoll: with TIERCACHE_RING_WAIT=0), check its status,
# count the worker's system calls over the loads -> $T/calls: epoll_wait calls,
# io_uring_enter calls, io_uring_enter per command, epoll_wait per command
calls() {
	local kind=$1
	[ "$kind" = epoll ] && export TIERCACHE_RING_WAIT=0
	tc_start "$T/t.conf"
	unset TIERCACHE_RING_WAIT
	local got
	got=$("$CTL" -c "$T/t.conf" --json status | python3 -c 'import json,sys; print(json.load(sys.stdin)["worker_wait"])') ||
		fail "tierctl status has no worker_wait"
	[ "$got" = "$kind" ] || fail "worker_wait is $got, expected $kind"
	local tid= t
	for t in /proc/"$TC_PID"/task/*; do
		[ "$(cat "$t/comm")" = tc-worker0 ] && tid=${t##*/}
	done
	[ -n "$tid" ] || fail "no tc-worker0 thread in the daemon"
	strace -c -e trace=epoll_wait,epoll_pwait,io_uring_enter -p "$tid" -o "$T/strace.$kind" 2>/dev/null &
	local st=$!
	# strace is attached once the thread names it as its tracer
	tc_wait_for 30 "strace attached" eval '[ -d /proc/'"$st"' ] && grep -q TracerPid:.'"$st"' /proc/'"$tid"'/status'
	"$TB" --json --no-progress -b 4k --rand -r 0 -t 1 -q 1 -n $n --size 32M --verify --seed 7 "$url" >"$T/tb.json" ||
		fail "tierbench writes ($kind): $(head -c 300 "$T/tb.json")"
	"$TB" --json --no-progress -b 4k --rand -r 100 -t 1 -q 1 -n $n --size 32M "$url" >"$T/tb.json" ||
		fail "tierbench reads ($kind): $(head -c 300 "$T/tb.json")"
	kill -INT "$st"
	wait "$st"
	tc_stop
	python3 - "$T/strace.$kind" $((2 * n)) >"$T/calls" <<'PY'
import sys
counts = {}
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) >= 5 and f[-1] in ("epoll_wait", "epoll_pwait", "io_uring_enter"):
        counts[f[-1]] = int(f[3])
cmds = int(sys.argv[2])
ep = counts.get("epoll_wait", 0) + counts.get("epoll_pwait", 0)
en = counts.get("io_uring_enter", 0)
print(ep, en, "%.2f" % (en / cmds), "%.2f" % (ep / cmds))
PY
}

calls io_uring
read -r ep en per ep_per <"$T/calls"
echo "io_uring wait: $ep epoll_wait, $en io_uring_enter ($per per command) over $((2 * n)) commands"
# the listening socket waits in the epoll set the ring polls: one
# epoll_wait per accepted connection (2 here), none per command
[ "$ep" -le 4 ] || fail "the io_uring wait made $ep epoll_wait calls over 2 connections"
python3 -c "import sys; sys.exit(0 if $per <= 2.5 else 1)" ||
	fail "the io_uring wait made $per io_uring_enter per QD1 command (want <= 2.5: the submit is the wait)"
pass "io_uring wait: $ep epoll_wait (the accepts), $per io_uring_enter per command, data verified"

calls epoll
read -r ep en per ep_per <"$T/calls"
echo "epoll wait: $ep epoll_wait ($ep_per per command), $en io_uring_enter over $((2 * n)) commands"
python3 -c "import sys; sys.exit(0 if $ep_per >= 1 else 1)" ||
	fail "TIERCACHE_RING_WAIT=0: $ep_per epoll_wait per command (want >= 1: the epoll wait)"
pass "TIERCACHE_RING_WAIT=0: the epoll wait ($ep_per epoll_wait per command), data verified"

# Files polled by the ring stay open until the ring lets go of the poll,
# some milliseconds after a kill -9: the listening socket must not (the next
# daemon binds the port), so it waits in the epoll set the ring polls
# (worker_watch_file). Right after the killed daemon is reaped, nothing may
# accept a connection on its port.
tc_start "$T/t.conf"
for i in 1 2 3 4 5; do
	kill -KILL "$TC_PID"
	wait "$TC_PID" 2>/dev/null
	if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
		fail "kill -9, run $i: the port still accepted a connection after the daemon was gone"
	fi
	TC_PID=
	[ "$i" = 5 ] || tc_start "$T/t.conf"
done
pass "kill -9: the portal's port closes with the process (5 runs)"
