#!/usr/bin/env bash
# test_iscsi_raw_protocol.sh - the portal's answers to hand-built PDUs.
#
# A small Python initiator (tests/tools/iscsi_raw.py) speaks iSCSI
# byte by byte, so this test can send what real initiators never send and
# check the exact answer:
#  - login refusals with their status class/detail (0200, 0201, 0202,
#    0203, 0205, 0206 for an added connection, 0207, 020a);
#  - CHAP by hand: the mutual answer verified with MD5, a reflected mutual
#    challenge refused, unknown user and wrong secret refused;
#  - Reject reasons (command not supported, SNACK, protocol error, data
#    digest error) and dropped connections for PDUs before login, oversized
#    segments, bad header digests and Login PDUs in full feature phase;
#  - CRC32C header and data digests on NOP, immediate data, R2T-solicited
#    Data-Out and Data-In; a corrupted Data-Out fails only its command;
#  - LOGICAL UNIT RESET from one session aborts a task another session is
#    still sending data for (no response, late Data-Out dropped, UNIT
#    ATTENTION afterwards);
#  - text split over PDUs with the C bit, both directions; SendTargets
#    filtered by the ACL; session reinstatement by ISID;
#  - NOP-In pings on idle sessions and the drop after nop_timeout (second
#    daemon instance);
# while one session opened first keeps answering throughout, libiscsi still
# works at the end, and no CHAP secret reaches the log.
. "$(dirname "$0")/lib.sh"
tc_tmpdir
command -v python3 >/dev/null || skip "python3 not installed"

port=$(tc_free_port)
port2=$(tc_free_port)
cat >"$T/t.conf" <<CONF
[daemon]
state_dir = $T/state
control_socket = $T/state/control.sock
log_level = debug

[portal]
listen = 127.0.0.1:$port
listen = 127.0.0.2:$port2

[target iqn.2026-11.io.tiercache:open]
lun0 = disk0

[target iqn.2026-11.io.tiercache:acl]
lun0 = disk0
allow = iqn.2026-11.test:good

[target iqn.2026-11.io.tiercache:chap]
lun0 = disk0
chap_user = alice
chap_secret = alicesecret123
mutual_user = tgtuser
mutual_secret = targetsecret99

[lun disk0]
backing = $T/disk0.img
size = 16M
CONF
for i in 1 2 3 4 5 6 7 8; do
	printf '\n[target iqn.2026-11.io.tiercache:extra%s]\nlun0 = disk0\n' $i >>"$T/t.conf"
done
tc_start "$T/t.conf"

cp "$TC_ROOT/tests/tools/iscsi_raw.py" "$T/"

cat >"$T/checks.py" <<'PY'
import sys, os, time, struct
sys.path.insert(0, os.environ["T"])
from iscsi_raw import *

port = int(os.environ["PORT"])
port2 = int(os.environ["PORT2"])
OPEN = "iqn.2026-11.io.tiercache:open"
ACL = "iqn.2026-11.io.tiercache:acl"
CHAP = "iqn.2026-11.io.tiercache:chap"
GOOD = "iqn.2026-11.test:good"
BAD = "iqn.2026-11.test:stranger"
failures = 0

def check(cond, what):
    global failures
    print(("ok: " if cond else "FAIL: ") + what)
    if not cond:
        failures += 1

def status_of(kv, **kw):
    c = Conn(port)
    r = c.login_pdu(0x80 | (1 << 2) | 3, kv, **kw)
    return None if r is None else r["status"]

# --- login refusals carry the right status class/detail ---
check(status_of({"SessionType": "Normal", "TargetName": OPEN}) == 0x0207,
      "no InitiatorName: 0207 missing parameter")
check(status_of({"InitiatorName": GOOD, "SessionType": "Normal"}) == 0x0207,
      "normal session without TargetName: 0207 missing parameter")
check(status_of({"InitiatorName": GOOD, "TargetName": "iqn.2026-11.io.tiercache:nope"}) == 0x0203,
      "unknown target: 0203 not found")
check(status_of({"InitiatorName": BAD, "TargetName": ACL}) == 0x0202,
      "initiator outside the allow list: 0202 authorization failure")
check(status_of({"InitiatorName": GOOD, "TargetName": OPEN}, vmin=1) == 0x0205,
      "VersionMin 1: 0205 unsupported version")
check(status_of({"InitiatorName": GOOD, "TargetName": OPEN}, tsih=0x4242) == 0x020a,
      "unknown TSIH: 020a session does not exist")
check(status_of({"InitiatorName": GOOD, "TargetName": OPEN, "SessionType": "Bogus"}) == 0x0200,
      "bad SessionType: 0200 initiator error")
check(status_of({"InitiatorName": GOOD, "TargetName": CHAP}) == 0x0201,
      "skipping the security stage of a CHAP target: 0201 authentication failure")
check(status_of({"InitiatorName": GOOD, "TargetName": OPEN, "MaxBurstLength": "4096",
                 "MaxBurstLength ": "x"}) in (0, 0x0200), "odd keys do not crash login")

# --- CHAP by hand: good exchange with mutual answer, reflection, unknown user ---
def chap_login(user, secret, **kw):
    return chap_exchange(port, GOOD, CHAP, user, secret, **kw)

c, r, _, chal = chap_login("alice", b"alicesecret123")
check(r["status"] == 0 and r["flags"] & 0x80, "CHAP with the right secret passes the security stage")
check(len(chal) >= 16, "CHAP challenge is at least 16 bytes")
mine = os.urandom(16)
c, r, my_id, _ = chap_login("alice", b"alicesecret123", mutual_challenge=mine)
want = "0x" + chap_md5(my_id, b"targetsecret99", mine).hex()
check(r["status"] == 0 and r["keys"].get("CHAP_N") == "tgtuser" and r["keys"].get("CHAP_R") == want,
      "mutual CHAP: the target proves the mutual secret")
c, r, _, _ = chap_login("alice", b"alicesecret123", reflect=True)
check(r["status"] == 0x0201 and "CHAP_R" not in r["keys"],
      "mutual challenge equal to the target's own is refused (0201), unanswered")
c, r, _, _ = chap_login("mallory", b"alicesecret123")
check(r["status"] == 0x0201, "unknown CHAP user: 0201")
c, r, _, _ = chap_login("alice", b"wrongsecret")
check(r["status"] == 0x0201, "wrong CHAP secret: 0201")
check(c.closed(), "connection closes after a refused login")

# SHA-256 (7) and SHA3-256 (8), as open-iscsi and LIO offer them: the
# strongest offered is chosen, the challenge is as long as the digest,
# one-way and mutual work, a wrong secret fails (each offer from its own
# address, so that the failures before it do not make its proofs wait:
# test_iscsi_login_guard.sh)
for i, (offer, alg, name) in enumerate((("7,5", "7", "SHA-256"), ("8,7,5", "8", "SHA3-256"),
                                        ("5,8", "8", "SHA3-256"), ("6,7", "7", "SHA-256"))):
    src = "127.0.1.%d" % (i + 1)
    c, r, _, chal = chap_login("alice", b"alicesecret123", offer=offer, want_alg=alg, src=src)
    check(r["status"] == 0 and r["flags"] & 0x80 and len(chal) == 32,
          "CHAP_A=%s: %s chosen, 32-byte challenge, the right secret passes" % (offer, name))
    mine = os.urandom(32)
    c, r, my_id, _ = chap_login("alice", b"alicesecret123", mutual_challenge=mine, offer=offer, want_alg=alg,
                                src=src)
    want = "0x" + chap_digest(alg, my_id, b"targetsecret99", mine).hex()
    check(r["status"] == 0 and r["keys"].get("CHAP_N") == "tgtuser" and r["keys"].get("CHAP_R") == want,
          "CHAP_A=%s: mutual %s answer proves the mutual secret" % (offer, name))
    c, r, _, _ = chap_login("alice", b"wrongsecret", offer=offer, want_alg=alg, src=src)
    check(r["status"] == 0x0201, "CHAP_A=%s: a wrong secret fails (0201)" % offer)
c = Conn(port)
r = c.login_pdu(0, {"InitiatorName": GOOD, "SessionType": "Normal", "TargetName": CHAP, "AuthMethod": "CHAP"})
r = c.login_pdu(0, {"CHAP_A": "6,15"})
check(r["status"] == 0x0201, "CHAP_A offering only algorithms we do not know (SHA-1, 15): 0201")

# --- a session that must survive everything below ---
a = Conn(port)
r = a.login(GOOD, OPEN, isid=b"\x80\0\0\0\0\xaa")
check(r and r["status"] == 0, "session A logs in")
check(r["maxcmdsn"] - r["expcmdsn"] + 1 >= 128, "CmdSN window is at least 128 commands")
check(int(r["keys"].get("MaxRecvDataSegmentLength", "0")) >= 8192,
      "target declares its MaxRecvDataSegmentLength")
tsih_a = r["tsih"]
p = a.nop(b"ping-1")
check(p and p[0][0] & 0x3f == 0x20 and p[1] == b"ping-1", "NOP-Out ping echoed by NOP-In")

# MC/S: adding a connection to session A is refused cleanly
check(status_of({"InitiatorName": GOOD, "TargetName": OPEN}, isid=b"\x80\0\0\0\0\xaa",
                tsih=tsih_a, cid=1) == 0x0206,
      "adding a second connection to a session: 0206 too many connections")

# --- malformed input on other connections ---
g = Conn(port)
g.send_raw(b"\x01" + os.urandom(47))
check(g.closed(), "a SCSI Command before login (random fields): connection dropped")

g = Conn(port)
bhs = bytearray(48); bhs[0] = 0x43; bhs[1] = 0x87
bhs[5:8] = (200000).to_bytes(3, "big")
g.send_raw(bytes(bhs))
check(g.closed(), "login PDU claiming 200000 data bytes: connection dropped")

g = Conn(port)
g.send_raw(b"\x43\x87\x00")
g.s.close()

b = Conn(port)
check(b.login(GOOD, OPEN, isid=b"\x80\0\0\0\0\xbb")["status"] == 0, "session B logs in")
bhs = bytearray(48); bhs[0] = 0x1c; bhs[1] = 0x80; bhs[16:20] = b"\0\0\0\x09"
b.send(bhs)
r = b.recv()
check(r and r[0][0] & 0x3f == 0x3f and r[0][2] == 0x05 and r[1][:48] == bytes(bhs),
      "unknown opcode: Reject 'command not supported' carrying the header")
bhs = bytearray(48); bhs[0] = 0x10; bhs[1] = 0x80
b.send(bhs)
r = b.recv()
check(r and r[0][0] & 0x3f == 0x3f and r[0][2] == 0x03, "SNACK at ErrorRecoveryLevel 0: Reject")
bhs = bytearray(48); bhs[0] = 0x01; bhs[1] = 0x80 | 0x40; bhs[16:20] = b"\0\0\0\x0a"
bhs[20:24] = (512).to_bytes(4, "big"); bhs[24:28] = b.cmdsn.to_bytes(4, "big"); b.cmdsn += 1
bhs[32] = 0x28
b.send(bhs, b"x" * 512)
r = b.recv()
check(r and r[0][0] & 0x3f == 0x3f and r[0][2] == 0x04,
      "immediate data on a read command: Reject 'protocol error'")
p = b.nop(b"still-there")
check(p and p[1] == b"still-there", "session B still answers after its rejected PDUs")
b.login_pdu(0x87, {"InitiatorName": GOOD})
check(b.closed(), "Login request in full feature phase: rejected and dropped")

d = Conn(port)
check(d.login(GOOD, OPEN, isid=b"\x80\0\0\0\0\xcc")["status"] == 0, "session D logs in")
bhs = bytearray(48); bhs[0] = 0x40; bhs[1] = 0x80
bhs[5:8] = (0xfffff0).to_bytes(3, "big")
d.send_raw(bytes(bhs))
r = d.recv()
check((r is None or r[0][0] & 0x3f == 0x3f) and d.closed(),
      "data segment over our MaxRecvDataSegmentLength: rejected and dropped")

# --- digests ---
e = Conn(port)
r = e.login(GOOD, OPEN, extra={"HeaderDigest": "CRC32C,None", "DataDigest": "CRC32C,None"},
            isid=b"\x80\0\0\0\0\xdd")
check(r["status"] == 0 and e.hd and e.dd, "HeaderDigest and DataDigest CRC32C negotiated")
p = e.nop(b"digested payload")
check(p and p[1] == b"digested payload", "NOP round trip with CRC32C digests both ways")
p = e.nop(b"corrupted payload", bad_dd=True)
check(p and p[0][0] & 0x3f == 0x3f and p[0][2] == 0x02, "bad data digest: Reject 'data digest error'")
p = e.nop(b"after")
check(p and p[1] == b"after", "session continues after a data digest error")

def scsi(conn, cdb, edtl, read=False, write=False, data=b"", final=True, itt=None, ahs=b""):
    bhs = bytearray(48)
    bhs[0] = 0x01
    bhs[1] = (0x80 if final else 0) | (0x40 if read else 0) | (0x20 if write else 0) | 1
    conn.itt += 1
    bhs[16:20] = conn.itt.to_bytes(4, "big")
    bhs[20:24] = edtl.to_bytes(4, "big")
    bhs[24:28] = conn.cmdsn.to_bytes(4, "big"); conn.cmdsn += 1
    bhs[32:32 + len(cdb)] = cdb
    conn.send(bhs, data, ahs=ahs)
    return conn.itt

def rw10(op, lba, blocks):
    return bytes([op, 0]) + lba.to_bytes(4, "big") + b"\0" + blocks.to_bytes(2, "big") + b"\0"

def read_back(conn, lba, blocks):
    scsi(conn, rw10(0x28, lba, blocks), blocks * 512, read=True)
    got = b""
    while True:
        r = conn.recv()
        if r is None:
            return None, None
        if r[0][0] & 0x3f == 0x25:
            got += r[1]
            if r[0][1] & 0x01:
                return r[0][3], got
        elif r[0][0] & 0x3f == 0x21:
            return r[0][3], got

scsi(e, bytes(6), 0)   # TEST UNIT READY: collects the power-on unit attention
e.recv()
pattern = os.urandom(512)
scsi(e, rw10(0x2a, 100, 1), 512, write=True, data=pattern)
r = e.recv()
check(r and r[0][0] & 0x3f == 0x21 and r[0][3] == 0, "WRITE(10) with digested immediate data: GOOD")
st, got = read_back(e, 100, 1)
check(st == 0 and got == pattern, "READ(10) returns it, Data-In digests verified, status in the S bit")

pattern2 = os.urandom(1024)
itt = scsi(e, rw10(0x2a, 200, 2), 1024, write=True)
r = e.recv()
ok = r and r[0][0] & 0x3f == 0x31 and int.from_bytes(r[0][44:48], "big") == 1024
check(ok, "a write without immediate data is asked for with an R2T of the whole length")
if ok:
    ttt = r[0][20:24]
    bhs = bytearray(48); bhs[0] = 0x05; bhs[1] = 0x80; bhs[16:20] = itt.to_bytes(4, "big")
    bhs[20:24] = ttt; bhs[8:16] = r[0][8:16]
    e.send(bhs, pattern2)
    r = e.recv()
    check(r and r[0][0] & 0x3f == 0x21 and r[0][3] == 0, "solicited Data-Out with data digest: GOOD")
    st, got = read_back(e, 200, 2)
    check(got == pattern2, "the solicited data reads back")
itt = scsi(e, rw10(0x2a, 300, 1), 512, write=True)
r = e.recv()
if r and r[0][0] & 0x3f == 0x31:
    bhs = bytearray(48); bhs[0] = 0x05; bhs[1] = 0x80; bhs[16:20] = itt.to_bytes(4, "big")
    bhs[20:24] = r[0][20:24]
    e.send(bhs, os.urandom(512), bad_dd=True)
    r1 = e.recv(); r2 = e.recv()
    kinds = sorted([x[0][0] & 0x3f for x in (r1, r2) if x])
    rsp = [x for x in (r1, r2) if x and x[0][0] & 0x3f == 0x21]
    check(kinds == [0x21, 0x3f] and rsp and rsp[0][0][3] == 2 and rsp[0][1][4] & 0x0f == 0x0b,
          "Data-Out with a bad data digest: Reject, and the write fails with ABORTED COMMAND")
else:
    check(False, "R2T for the bad-digest write")
bhs = bytearray(48); bhs[0] = 0x40; bhs[1] = 0x80; bhs[16:20] = b"\0\0\0\x33"
bhs[20:24] = b"\xff\xff\xff\xff"
e.send(bhs, bad_hd=True)
check(e.closed(), "bad header digest: connection dropped")

# --- discovery ---
f = Conn(port)
check(f.login(BAD)["status"] == 0, "discovery session logs in")
bhs = bytearray(48); bhs[0] = 0x44; bhs[1] = 0x80; bhs[16:20] = b"\0\0\0\x44"
bhs[20:24] = b"\xff\xff\xff\xff"; bhs[24:28] = f.cmdsn.to_bytes(4, "big")
f.send(bhs, text({"SendTargets": "All"}))
r = f.recv()
names = [p.split(b"=", 1)[1].decode() for p in r[1].split(b"\0") if p.startswith(b"TargetName=")]
check(OPEN in names and ACL not in names, "SendTargets hides targets the initiator may not reach")
keys = [p for p in r[1].split(b"\0") if p]
i = keys.index(b"TargetName=" + OPEN.encode())
after = keys[i + 3:i + 4]
check(keys[i + 1:i + 3] == [b"TargetAddress=127.0.0.1:%d,1" % port, b"TargetAddress=127.0.0.2:%d,1" % port2] and
      (not after or after[0].startswith(b"TargetName=")),
      "SendTargets names every portal, the one connected to first: %r" % keys[i:i + 4])

# --- LOGICAL UNIT RESET from one session aborts another session's task ---
x = Conn(port); y = Conn(port)
check(x.login(GOOD, OPEN, isid=b"\x80\0\0\0\2\1")["status"] == 0 and
      y.login(GOOD, OPEN, isid=b"\x80\0\0\0\2\2")["status"] == 0, "sessions X and Y log in")
for conn in (x, y):
    scsi(conn, bytes(6), 0); conn.recv()          # clear the power-on unit attention
itt = scsi(y, rw10(0x2a, 400, 1), 512, write=True)   # waits for Data-Out
r2t = y.recv()
check(r2t and r2t[0][0] & 0x3f == 0x31, "Y's write is waiting for data (R2T)")
bhs = bytearray(48); bhs[0] = 0x42; bhs[1] = 0x80 | 5; bhs[16:20] = b"\0\0\0\x66"
bhs[20:24] = b"\xff\xff\xff\xff"; bhs[24:28] = x.cmdsn.to_bytes(4, "big")
x.send(bhs)
r = x.recv()
check(r and r[0][0] & 0x3f == 0x22 and r[0][2] == 0, "LOGICAL UNIT RESET answered 'function complete'")
bhs = bytearray(48); bhs[0] = 0x05; bhs[1] = 0x80; bhs[16:20] = itt.to_bytes(4, "big")
bhs[20:24] = r2t[0][20:24]
y.send(bhs, b"z" * 512)                            # late data for the aborted task
scsi(y, bytes(6), 0)
r = y.recv()
check(r and r[0][0] & 0x3f == 0x21 and int.from_bytes(r[0][16:20], "big") == y.itt,
      "Y's aborted write gets no response; its late Data-Out is dropped")
check(r and r[0][3] == 2 and len(r[1]) > 14 and r[1][2 + 2] & 0x0f == 6,
      "Y's next command reports the reset as a UNIT ATTENTION")

# --- a variable-length CDB (7Fh) is 8 + its byte 7 long, on the portal too ---
cdb32 = bytes([0x7f, 0, 0, 0, 0, 0, 0, 24, 0, 0x09]) + bytes(22)   # READ(32): 32 bytes
scsi(x, cdb32[:16], 512, read=True)
r = x.recv()
check(r and r[0][0] & 0x3f == 0x21 and r[0][3] == 2 and len(r[1]) > 15 and r[1][2 + 2] & 0x0f == 5
      and r[1][2 + 12] == 0x24 and r[1][2 + 13] == 0,
      "a 32-byte CDB sent without its extended CDB AHS: ILLEGAL REQUEST, INVALID FIELD IN CDB")
ext = (17).to_bytes(2, "big") + b"\x01\x00" + cdb32[16:]   # AHSLength counts the reserved byte
scsi(x, cdb32[:16], 512, read=True, ahs=ext)
r = x.recv()
check(r and r[0][0] & 0x3f == 0x21 and r[0][3] == 2 and len(r[1]) > 15 and r[1][2 + 2] & 0x0f == 5
      and r[1][2 + 12] == 0x20,
      "the same CDB whole, in BHS + AHS: reaches the backstore (INVALID COMMAND OPERATION CODE)")

# --- text split over PDUs (C bit), both directions ---
h = Conn(port)
r = h.login_pdu(0x40 | (1 << 2), {"InitiatorName": GOOD, "SessionType": "Discovery"})
check(r and r["status"] == 0 and not r["flags"] & 0x80 and not r["keys"],
      "login text with C=1: empty response, waiting for the rest")
r = h.login_pdu(0x80 | (1 << 2) | 3, {"MaxRecvDataSegmentLength": "512"})
check(r and r["status"] == 0 and r["flags"] & 0x80, "login completes once the text is whole")
h.cmdsn = r["expcmdsn"]
got = b""
ttt = b"\xff\xff\xff\xff"
payload = text({"SendTargets": "All"})
for i in range(10):
    bhs = bytearray(48); bhs[0] = 0x44; bhs[1] = 0x80; bhs[16:20] = b"\0\0\0\x55"
    bhs[20:24] = ttt; bhs[24:28] = h.cmdsn.to_bytes(4, "big")
    h.send(bhs, payload)
    payload = b""
    r = h.recv()
    if r is None or len(r[1]) > 512:
        break
    got += r[1]
    if r[0][1] & 0x80:
        break
    ttt = r[0][20:24]
names = [p for p in got.split(b"\0") if p.startswith(b"TargetName=")]
check(len(names) == 11 and i >= 1,
      "SendTargets answer longer than MaxRecvDataSegmentLength arrives in C-bit pieces")

# --- session A survived; reinstatement replaces it ---
p = a.nop(b"ping-2")
check(p and p[1] == b"ping-2", "session A unaffected by the malformed traffic")
n = Conn(port)
check(n.login(GOOD, OPEN, isid=b"\x80\0\0\0\0\xaa")["status"] == 0,
      "a new login with session A's ISID succeeds (reinstatement)")
check(a.closed(), "the reinstated session's old connection is closed")
p = n.nop(b"ping-3")
check(p and p[1] == b"ping-3", "the new session works")

sys.exit(1 if failures else 0)
PY

T=$T PORT=$port PORT2=$port2 python3 "$T/checks.py" || fail "raw protocol checks failed (see above)"
kill -0 "$TC_PID" 2>/dev/null || fail "tiercached died"
timeout 20 iscsi-inq "iscsi://127.0.0.1:$port/iqn.2026-11.io.tiercache:open/0" >/dev/null ||
	fail "libiscsi cannot use the target after the malformed traffic"
pass "libiscsi still works after the malformed traffic"
for s in alicesecret123 targetsecret99 wrongsecret; do
	grep -q "$s" "$T/daemon.log" && fail "CHAP secret '$s' appears in the daemon log"
done
pass "no CHAP secret in the daemon log (log_level = debug)"
tc_stop

# --- target pings: a second daemon with nop_interval = 1, nop_timeout = 2 ---
port=$(tc_free_port)
sed -e "/^listen = 127.0.0.2:/d" -e "s/^listen = .*/listen = 127.0.0.1:$port/" -e "s/^log_level = debug/&\nnop_interval = 1\nnop_timeout = 2/" \
	"$T/t.conf" >"$T/nop.conf"
tc_start "$T/nop.conf"
T=$T PORT=$port python3 - <<'PY' || fail "NOP-In ping checks failed"
import sys, os, time
sys.path.insert(0, os.environ["T"])
from iscsi_raw import *
port = int(os.environ["PORT"])
ok = True
quiet = Conn(port)
assert quiet.login("iqn.2026-11.test:good", "iqn.2026-11.io.tiercache:open",
                   isid=b"\x80\0\0\0\1\1")["status"] == 0
quiet.answer_pings = False
r = quiet.recv()
if not (r and r[0][0] & 0x3f == 0x20 and r[0][16:20] == b"\xff\xff\xff\xff"
        and r[0][20:24] != b"\xff\xff\xff\xff"):
    print("FAIL: no NOP-In ping on an idle session"); ok = False
else:
    print("ok: idle session gets a NOP-In ping (ITT 0xffffffff, a TTT to echo)")
live = Conn(port)
assert live.login("iqn.2026-11.test:good", "iqn.2026-11.io.tiercache:open",
                  isid=b"\x80\0\0\0\1\2")["status"] == 0
# Wait for the drop of the quiet session (nop_timeout is 2 s; 60 s bounds a
# busy machine, not the daemon) while the live one answers its pings, so
# that however long the drop takes, live never looks unanswering itself.
import select
t0 = time.time()
dropped = False
while not dropped and time.time() - t0 < 60:
    rd, _, _ = select.select([quiet.s, live.s], [], [], 1.0)
    if live.s in rd:
        r = live._recv_one()
        if r and r[0][0] & 0x3f == 0x20 and r[0][16:20] == b"\xff\xff\xff\xff":
            live.pings += 1
            live.pong(r[0])
    if quiet.s in rd:
        try:
            dropped = not quiet.s.recv(65536)
        except ConnectionResetError:
            dropped = True
if dropped:
    print("ok: a session that does not answer pings is dropped after nop_timeout (%.1f s)" % (time.time() - t0))
else:
    print("FAIL: unanswered pings did not drop the session"); ok = False
live.s.settimeout(0.5)
end = time.time() + 5
while time.time() < end:
    live.recv()          # answers target pings as they come
live.s.settimeout(30)
p = live.nop(b"alive")
if p and p[1] == b"alive" and live.pings >= 1:
    print("ok: a session answering pings stays up")
else:
    print("FAIL: answering session lost"); ok = False
sys.exit(0 if ok else 1)
PY
tc_stop
