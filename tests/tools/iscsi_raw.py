# Minimal iSCSI initiator for raw-protocol tests: builds PDUs byte by byte.
import socket, struct, hashlib, os

def _crc_table():
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    return t
_T = _crc_table()

def crc32c(b):
    c = 0xFFFFFFFF
    for x in b:
        c = _T[(c ^ x) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF

def text(d):
    return b"".join(f"{k}={v}".encode() + b"\0" for k, v in d.items())

def parse_text(b):
    out = {}
    for p in b.split(b"\0"):
        if b"=" in p:
            k, v = p.split(b"=", 1)
            out[k.decode()] = v.decode()
    return out

# Timeouts bound a wait for an answer (or a close) that comes at once on an
# idle machine: generous, for two busy cores; only a broken run waits them out.
class Conn:
    def __init__(self, port, timeout=30, src=None):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=timeout,
                                          source_address=(src, 0) if src else None)
        self.hd = self.dd = False
        self.cmdsn = 1
        self.statsn = 0
        self.itt = 0x100
        self.answer_pings = True
        self.pings = 0

    def send_raw(self, b):
        self.s.sendall(b)

    def send(self, bhs, data=b"", bad_hd=False, bad_dd=False, ahs=b""):
        bhs = bytearray(bhs)
        bhs[4] = len(ahs) // 4
        bhs[5:8] = len(data).to_bytes(3, "big")
        out = bytes(bhs) + ahs
        if self.hd:
            c = crc32c(out) ^ (1 if bad_hd else 0)
            out += struct.pack("<I", c)
        if data:
            pad = b"\0" * ((4 - len(data) % 4) % 4)
            out += data + pad
            if self.dd:
                c = crc32c(data + pad) ^ (1 if bad_dd else 0)
                out += struct.pack("<I", c)
        self.s.sendall(out)

    def _recvn(self, n):
        b = b""
        while len(b) < n:
            chunk = self.s.recv(n - len(b))
            if not chunk:
                return None
            b += chunk
        return b

    def recv(self):
        """(bhs, data) or None when the target closed the connection.
        Target pings (NOP-In, ITT 0xffffffff) are answered and skipped
        unless answer_pings is False."""
        while True:
            r = self._recv_one()
            if (r is None or not self.answer_pings or r[0][0] & 0x3f != 0x20
                    or r[0][16:20] != b"\xff\xff\xff\xff"):
                return r
            self.pings += 1
            self.pong(r[0])

    def pong(self, ping):
        bhs = bytearray(48)
        bhs[0] = 0x40
        bhs[1] = 0x80
        bhs[16:20] = b"\xff\xff\xff\xff"
        bhs[20:24] = ping[20:24]
        bhs[24:28] = self.cmdsn.to_bytes(4, "big")
        self.send(bhs)

    def _recv_one(self):
        try:
            bhs = self._recvn(48)
            if bhs is None:
                return None
            ahs = bhs[4] * 4
            if ahs and self._recvn(ahs) is None:
                return None
            if self.hd:
                d = self._recvn(4)
                if d is None or struct.unpack("<I", d)[0] != crc32c(bhs):
                    raise AssertionError("bad header digest from target")
            dsl = int.from_bytes(bhs[5:8], "big")
            data = b""
            if dsl:
                padded = dsl + (4 - dsl % 4) % 4
                raw = self._recvn(padded)
                if raw is None:
                    return None
                if self.dd:
                    d = self._recvn(4)
                    if struct.unpack("<I", d)[0] != crc32c(raw):
                        raise AssertionError("bad data digest from target")
                data = raw[:dsl]
            return bhs, data
        except (ConnectionResetError, socket.timeout):
            return None

    def closed(self, timeout=30):
        """True if the target closes the connection (after any PDUs)."""
        self.s.settimeout(timeout)
        try:
            while True:
                if not self.s.recv(65536):
                    return True
        except ConnectionResetError:
            return True
        except socket.timeout:
            return False

    def login_pdu(self, flags, kv, isid=b"\x80\0\0\0\0\x01", tsih=0, vmin=0, cid=0):
        bhs = bytearray(48)
        bhs[0] = 0x43
        bhs[1] = flags
        bhs[3] = vmin
        bhs[8:14] = isid
        bhs[14:16] = tsih.to_bytes(2, "big")
        bhs[16:20] = (0x1).to_bytes(4, "big")
        bhs[20:22] = cid.to_bytes(2, "big")
        bhs[24:28] = self.cmdsn.to_bytes(4, "big")
        bhs[28:32] = self.statsn.to_bytes(4, "big")
        self.send(bhs, text(kv) if isinstance(kv, dict) else kv)
        r = self.recv()
        if r is None:
            return None
        bhs_r, data = r
        self.statsn = int.from_bytes(bhs_r[24:28], "big") + 1
        return {"status": bhs_r[36] << 8 | bhs_r[37], "flags": bhs_r[1],
                "tsih": int.from_bytes(bhs_r[14:16], "big"),
                "expcmdsn": int.from_bytes(bhs_r[28:32], "big"),
                "maxcmdsn": int.from_bytes(bhs_r[32:36], "big"),
                "keys": parse_text(data)}

    def login(self, initiator, target=None, extra=None, isid=b"\x80\0\0\0\0\x01"):
        """Operational-stage-only login straight to full feature phase."""
        kv = {"InitiatorName": initiator}
        if target:
            kv["TargetName"] = target
            kv["SessionType"] = "Normal"
        else:
            kv["SessionType"] = "Discovery"
        kv.update(extra or {})
        r = self.login_pdu(0x80 | (1 << 2) | 3, kv, isid=isid)
        if r and r["status"] == 0:
            self.hd = r["keys"].get("HeaderDigest") == "CRC32C"
            self.dd = r["keys"].get("DataDigest") == "CRC32C"
            self.cmdsn = r["expcmdsn"]
        return r

    def nop(self, data=b"", bad_dd=False):
        bhs = bytearray(48)
        bhs[0] = 0x40          # NOP-Out, immediate
        bhs[1] = 0x80
        self.itt += 1
        bhs[16:20] = self.itt.to_bytes(4, "big")
        bhs[20:24] = b"\xff\xff\xff\xff"
        bhs[24:28] = self.cmdsn.to_bytes(4, "big")
        bhs[28:32] = self.statsn.to_bytes(4, "big")
        self.send(bhs, data, bad_dd=bad_dd)
        return self.recv()

def chap_md5(ident, secret, challenge):
    return hashlib.md5(bytes([ident]) + secret + challenge).digest()

# CHAP_A code -> digest (RFC 1994 framing: H(id | secret | challenge))
CHAP_HASH = {"5": hashlib.md5, "7": hashlib.sha256, "8": hashlib.sha3_256}

def chap_digest(alg, ident, secret, challenge):
    return CHAP_HASH[alg](bytes([ident]) + secret + challenge).digest()

def chap_exchange(port, initiator, target, user, secret, mutual_challenge=None, reflect=False, offer="5",
                  want_alg="5", src=None, timeout=30):
    """A security-stage CHAP login by hand, up to the target's answer to the
    proof: (conn, that answer or None, our CHAP_I, the target's challenge)."""
    c = Conn(port, timeout=timeout, src=src)
    r = c.login_pdu(0, {"InitiatorName": initiator, "SessionType": "Normal", "TargetName": target,
                        "AuthMethod": "CHAP,None"})
    assert r["status"] == 0 and r["keys"]["AuthMethod"] == "CHAP", r
    r = c.login_pdu(0, {"CHAP_A": offer})
    assert r["status"] == 0 and r["keys"]["CHAP_A"] == want_alg, (offer, r)
    ident = int(r["keys"]["CHAP_I"])
    chal = bytes.fromhex(r["keys"]["CHAP_C"][2:])
    kv = {"CHAP_N": user, "CHAP_R": "0x" + chap_digest(want_alg, ident, secret, chal).hex()}
    my_id = 77
    if reflect:
        mutual_challenge = chal
    if mutual_challenge is not None:
        kv["CHAP_I"] = str(my_id)
        kv["CHAP_C"] = "0x" + mutual_challenge.hex()
    r = c.login_pdu(0x80 | 1, kv)
    return c, r, my_id, chal
