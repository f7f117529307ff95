#!/usr/bin/env bash
# Under systemd (NOTIFY_SOCKET, WATCHDOG_USEC) the daemon says READY=1 once it
# serves and then keeps sending WATCHDOG=1 while its worker loops tick;
# STOPPING=1 on SIGTERM. A small Python listener stands in for systemd.
. "$(dirname "$0")/lib.sh"
tc_tmpdir
port=$(tc_free_port)
tc_basic_conf "$port" >"$T/t.conf"
sock=$T/notify.sock
python3 - "$sock" "$T/notify.log" <<'PY' &
import socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
s.settimeout(0.5)
end = time.time() + 180  # a bound for a broken run; STOPPING=1 ends it
with open(sys.argv[2], "w", buffering=1) as log:
    while time.time() < end:
        try:
            msg = s.recv(4096).decode()
        except socket.timeout:
            continue
        for line in msg.split("\n"):
            log.write("%.2f %s\n" % (time.time(), line))
        if "STOPPING=1" in msg:
            break
PY
listener=$!
tc_wait_for 30 "the notify listener's socket" test -S "$sock"
# 1 s asked; the daemon allows one late tick and pings every 1 s
NOTIFY_SOCKET=$sock WATCHDOG_USEC=1000000 tc_start "$T/t.conf"
t0=$SECONDS
pings() { cat "$T/notify.log" 2>/dev/null | grep -c " WATCHDOG=1"; }
three_pings() { [ "$(pings)" -ge 3 ]; }
tc_until 60 three_pings || fail "only $(pings) WATCHDOG=1 pings in 60 s: $(cat "$T/notify.log")"
pass "3 WATCHDOG=1 pings, the third $((SECONDS - t0)) s after the start"
tc_stop
wait $listener
grep -q " READY=1" "$T/notify.log" || fail "no READY=1: $(cat "$T/notify.log")"
pass "READY=1 sent once serving"
grep -q "systemd watchdog: pinging every 1000 ms while" "$T/daemon.log" || fail "no watchdog line in the log"
grep -q " STOPPING=1" "$T/notify.log" || fail "no STOPPING=1 on SIGTERM"
pass "STOPPING=1 on SIGTERM"

# without WATCHDOG_USEC: no pings, and no watchdog line. No wait needed:
# SIGTERM stays blocked until the main loop, which the daemon enters only
# after it logged "ready:" and decided about the watchdog, so once it has
# stopped cleanly the line would be in the log.
: >"$T/daemon.log"
tc_start "$T/t.conf"
tc_stop
grep -q "ready: " "$T/daemon.log" || fail "no ready line in the log"
grep -q "systemd watchdog" "$T/daemon.log" && fail "watchdog started without WATCHDOG_USEC"
pass "no watchdog without WATCHDOG_USEC"
