#!/usr/bin/env bash
# test_iscsi_login_guard.sh - CHAP guessing from one address is slowed down;
# the host that knows the secret, and every other address, are not.
#
# By hand (tests/tools/iscsi_raw.py), from 127.0.0.3 (the guesser):
#  - wrong-secret logins one after another for 12 s, each waiting for its
#    answer: the first three are answered at once, each later one waits for
#    its turn (at least 0.9 s), so few are judged (without the guard: over a
#    hundred a second);
#  - then 50 wrong-secret proofs at once on 50 connections: every one is
#    answered, 0201 (judged, wrong) for the few whose turn came and 0301
#    (service unavailable, try again) for the rest, never a hang; a NOP on
#    an open session answers while they wait (no worker sleeps);
#  - then the right secret logs in, retrying on 0301 as initiators do,
#    within 10 s;
#  - meanwhile the right secret from 127.0.0.4 logs in at once.
# The daemon log has at most two refusal lines for 127.0.0.3 (one a minute)
# and never a secret.
. "$(dirname "$0")/lib.sh"
tc_tmpdir
command -v python3 >/dev/null || skip "python3 not installed"

port=$(tc_free_port)
tc_conf_head "$port" | sed 's/^log_level = .*/log_level = debug/' >"$T/t.conf"
cat >>"$T/t.conf" <<CONF

[target iqn.2026-11.io.tiercache:open]
lun0 = disk0

[target iqn.2026-11.io.tiercache:chap]
lun0 = disk0
chap_user = alice
chap_secret = alicesecret123

[lun disk0]
backing = $T/disk0.img
size = 16M
CONF
tc_start "$T/t.conf"
cp "$TC_ROOT/tests/tools/iscsi_raw.py" "$T/"

T=$T PORT=$port python3 - <<'PY' || fail "login guard checks failed (see above)"
import sys, os, time, select
sys.path.insert(0, os.environ["T"])
from iscsi_raw import *

port = int(os.environ["PORT"])
GOOD = "iqn.2026-11.test:good"
CHAP = "iqn.2026-11.io.tiercache:chap"
OPEN = "iqn.2026-11.io.tiercache:open"
GUESSER, OTHER = "127.0.0.3", "127.0.0.4"
failures = 0

def check(cond, what):
    global failures
    print(("ok: " if cond else "FAIL: ") + what)
    if not cond:
        failures += 1

def attempt(secret, src):
    """One CHAP login; (status of the answer to the proof, seconds it took)."""
    t0 = time.time()
    c, r, _, _ = chap_exchange(port, GOOD, CHAP, "alice", secret, src=src)
    c.s.close()
    return (r["status"] if r else None), time.time() - t0

# an open session whose NOPs must keep answering while proofs wait
live = Conn(port)
check(live.login(GOOD, OPEN)["status"] == 0, "a session on the open target logs in")

# --- one guess after another, each waiting for its answer ---
judged, waits, t_end = [], [], time.time() + 12
while time.time() < t_end:
    st, dt = attempt(b"wrongsecret", GUESSER)
    judged.append(st)
    waits.append(dt)
print("serial: %d guesses in 12 s, answer times %s" % (len(judged), ["%.1f" % w for w in waits]))
check(all(s == 0x0201 for s in judged), "every serial wrong guess is refused 0201")
check(len(judged) <= 9, "serial guessing is slowed down: %d judged in 12 s (at most 9)" % len(judged))
check(all(w < 0.9 for w in waits[:3]), "the first three wrong guesses are answered at once")
# the turn comes 1 s after the previous answer; what the client spends
# between that answer and its next proof (a new connection, the CHAP
# exchange: more on a busy machine) comes off the wait it sees
check(len(waits) > 3 and all(w >= 0.5 for w in waits[3:]),
      "from the fourth guess on, each waits for its turn (at least 0.5 s)")

# --- 50 guesses at once ---
conns = []
for i in range(50):
    c = Conn(port, src=GUESSER)
    r = c.login_pdu(0, {"InitiatorName": GOOD, "SessionType": "Normal", "TargetName": CHAP,
                        "AuthMethod": "CHAP"})
    r = c.login_pdu(0, {"CHAP_A": "5"})
    ident = int(r["keys"]["CHAP_I"])
    chal = bytes.fromhex(r["keys"]["CHAP_C"][2:])
    conns.append((c, ident, chal))
t0 = time.time()
for c, ident, chal in conns:
    bhs = bytearray(48)
    bhs[0] = 0x43; bhs[1] = 0x81
    bhs[8:14] = b"\x80\0\0\0\0\x01"
    bhs[16:20] = (1).to_bytes(4, "big")
    bhs[24:28] = c.cmdsn.to_bytes(4, "big")
    bhs[28:32] = c.statsn.to_bytes(4, "big")
    c.send(bhs, text({"CHAP_N": "alice", "CHAP_R": "0x" + chap_md5(ident, b"wrongsecret", chal).hex()}))
pending = {c.s: c for c, _, _ in conns}
status = {}
nop_worst = 0.0
while pending and time.time() - t0 < 30:
    rd, _, _ = select.select(list(pending), [], [], 0.5)
    for s in rd:
        r = pending.pop(s).recv()
        status[s] = None if r is None else (r[0][36] << 8 | r[0][37])
    n0 = time.time()
    p = live.nop(b"still-here")
    if not (p and p[1] == b"still-here"):
        nop_worst = 99.0
    nop_worst = max(nop_worst, time.time() - n0)
burst = time.time() - t0
n201 = sum(1 for v in status.values() if v == 0x0201)
n301 = sum(1 for v in status.values() if v == 0x0301)
print("burst: %d answered in %.1f s: %d x 0201, %d x 0301, NOP worst %.3f s" %
      (len(status), burst, n201, n301, nop_worst))
check(not pending and n201 + n301 == 50, "all 50 parallel guesses are answered, 0201 or 0301")
check(n201 <= 3, "at most 3 of the 50 parallel guesses are judged (%d)" % n201)
check(nop_worst < 1.0, "a NOP on another session answers while guesses wait (worst %.3f s)" % nop_worst)

# --- another address is not slowed; the right secret gets in ---
st, dt = attempt(b"alicesecret123", OTHER)
check(st == 0 and dt < 1.0, "the right secret from another address logs in at once (%.2f s)" % dt)
t0 = time.time()
tries = []
while time.time() - t0 < 10:
    st, dt = attempt(b"alicesecret123", GUESSER)
    tries.append(st)
    if st == 0:
        break
    time.sleep(0.5)
took = time.time() - t0
check(tries and tries[-1] == 0 and took < 10,
      "after %d guesses the right secret logs in from the same address within 10 s (%.1f s, answers %s)" %
      (len(judged) + 50, took, ["%04x" % s for s in tries]))
sys.exit(1 if failures else 0)
PY

n=$(grep -c "iSCSI 127\.0\.0\.3:[0-9]*: login of .* refused" "$T/daemon.log")
[ "$n" -ge 1 ] && [ "$n" -le 2 ] || fail "expected 1-2 refusal lines for 127.0.0.3 (one a minute), found $n"
pass "the guesses from 127.0.0.3 left $n refusal line(s) in the log"
for s in alicesecret123 wrongsecret; do
	grep -q "$s" "$T/daemon.log" && fail "CHAP secret '$s' appears in the daemon log"
done
pass "no CHAP secret in the daemon log (log_level = debug)"
tc_stop
