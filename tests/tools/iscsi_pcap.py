#!/usr/bin/env python3
"""iscsi_pcap.py - what a target answered to each SCSI command of a capture.

Reads a classic pcap file (what tcpdump -w writes: micro- or nanosecond
timestamps, either byte order; Ethernet as on Linux's lo, Linux cooked v1
or v2, raw IP or BSD loopback framing; IPv4 or IPv6), puts each TCP
connection's two byte streams back together by sequence number, cuts them
into iSCSI PDUs (RFC 7143: the 48-byte header, TotalAHSLength, the header
and data digests that login negotiated, the data segment padded to four
bytes) and writes, one connection after another, a line per SCSI command:

  iscsi_pcap.py list PCAP [--ports P,P...] [--lba-status-runs-vary] > LIST
  iscsi_pcap.py compare OLD.LIST NEW.LIST [--show N]

A connection is named by what its login said and where it went: the
InitiatorName, the TargetName (or "discovery"), the portal's place among
--ports (or its port number without --ports), and its rank among the
connections with the same name in order of their first SYN. Connections
are listed sorted by that name, so that two runs whose connections overlap
in time in another order still pair up. Under each one, in the order the
initiator sent them:

  cmd N lun=L cdb=HEX edtl=N R|W|RW|- resp=R status=S sense=HEX|-
        resid=U:N|O:N|- in=LEN:SHA256 [data=HEX]|in=0
  tmf N lun=L fn=F ref=cmd M|ref=- resp=R|resp=none
  reject reason=R opcode=OP ref=cmd M|ref=-

(one line each). "in" is the length and the SHA-256 of the Data-In bytes
in buffer-offset order ("in=gap" when the offsets leave a hole), and
"data" the bytes in hex where there are at most 64 of them; a command
the target never answered says "no-response" instead of resp and the rest.
What the order or timing of events decides, not the target's code, is
masked (mark_races() says which commands): a COMPARE AND WRITE racing
others to its block from another connection says "status=raced
sense=raced" when it was good or a MISCOMPARE; a command that the
initiator followed at once with a TMF covering it says "done-or-aborted"
when it was good or not answered, and an ABORT TASK naming it "resp=
done-or-aborted" when it answered FUNCTION COMPLETE or TASK DOES NOT EXIST;
with --lba-status-runs-vary (for a write-back cached LU, where an extent
ends where the cleaner has come to) a good GET LBA STATUS says
"resid=masked in=lba-status:lba=N,status=S", its first extent without
the length.
What differs between two runs by nature is left out: the ITT (commands
are numbered within their connection, and a TMF's referenced task tag
becomes that number), CmdSN, StatSN, ExpCmdSN, MaxCmdSN, DataSN, the TSIH
and ISID, the Target Transfer Tags, the timestamps, the TCP ports; NOP-In
and NOP-Out (their timing is the target's and the initiator's business),
R2Ts and Data-Out.

compare pairs the two lists' connections by name and prints the first
differences (a unified diff, --show lines of it, 80 by default) and exits
1, or prints "N commands identical" and exits 0. Exit 2 on a usage error
or a capture that cannot be read whole (a gap in a stream: the capture
lost packets; a snapshot length shorter than the packets).
"""
import difflib
import hashlib
import struct
import sys

# opcodes, initiator to target and target to initiator (RFC 7143 11.1)
OP_NOP_OUT, OP_SCSI_CMD, OP_TMF_REQ, OP_LOGIN_REQ = 0x00, 0x01, 0x02, 0x03
OP_NOP_IN, OP_SCSI_RSP, OP_TMF_RSP, OP_LOGIN_RSP = 0x20, 0x21, 0x22, 0x23
OP_DATA_IN, OP_REJECT = 0x25, 0x3F
BHS = 48
WANT_DATA = (OP_LOGIN_REQ, OP_LOGIN_RSP, OP_SCSI_RSP, OP_DATA_IN, OP_REJECT)
AHS_EXT_CDB = 1


class CaptureError(Exception):
    pass


# ---- pcap ---------------------------------------------------------------------------------

LINK_NULL, LINK_ETHERNET, LINK_RAW, LINK_RAW2, LINK_SLL, LINK_SLL2 = 0, 1, 12, 101, 113, 276


def packets(path):
    """(time, ip packet bytes) for each record of a classic pcap file."""
    with open(path, "rb") as f:
        head = f.read(24)
        if len(head) < 24:
            raise CaptureError("%s: not a pcap file (too short)" % path)
        magic = head[:4]
        if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"):
            endian = "<"
        elif magic in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d"):
            endian = ">"
        elif magic == b"\x0a\x0d\x0d\x0a":
            raise CaptureError("%s: a pcapng file; write classic pcap (tcpdump -w does)" % path)
        else:
            raise CaptureError("%s: not a pcap file" % path)
        nano = magic in (b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d")
        _, _, _, _, snaplen, link = struct.unpack(endian + "HHiIII", head[4:])
        link &= 0xFFFF
        rec = struct.Struct(endian + "IIII")
        div = 1e9 if nano else 1e6
        n = 0
        while True:
            h = f.read(16)
            if not h:
                return
            if len(h) < 16:
                raise CaptureError("%s: the last record is cut short" % path)
            sec, frac, caplen, origlen = rec.unpack(h)
            data = f.read(caplen)
            n += 1
            if len(data) < caplen:
                raise CaptureError("%s: the last record is cut short" % path)
            if caplen < origlen:
                raise CaptureError("%s: packet %d has %d of its %d bytes (a snapshot length of %d): "
                                   "capture with -s 0" % (path, n, caplen, origlen, snaplen))
            ip = link_payload(link, data)
            if ip is not None:
                yield sec + frac / div, ip


def link_payload(link, data):
    """The IP packet inside a link-layer frame, or None for anything else."""
    if link == LINK_ETHERNET:
        off, etype = 14, struct.unpack_from(">H", data, 12)[0]
        while etype in (0x8100, 0x88A8):  # VLAN tags
            etype = struct.unpack_from(">H", data, off + 2)[0]
            off += 4
        return data[off:] if etype in (0x0800, 0x86DD) else None
    if link == LINK_SLL:
        etype = struct.unpack_from(">H", data, 14)[0]
        return data[16:] if etype in (0x0800, 0x86DD) else None
    if link == LINK_SLL2:
        etype = struct.unpack_from(">H", data, 0)[0]
        return data[20:] if etype in (0x0800, 0x86DD) else None
    if link in (LINK_RAW, LINK_RAW2):
        return data
    if link == LINK_NULL:
        return data[4:]
    raise CaptureError("link type %d is not one this reader knows" % link)


def tcp_segment(ip):
    """(src, dst, sport, dport, seq, flags, payload) of a TCP/IP packet, or None."""
    ver = ip[0] >> 4
    if ver == 4:
        ihl = (ip[0] & 0x0F) * 4
        total, = struct.unpack_from(">H", ip, 2)
        frag, = struct.unpack_from(">H", ip, 6)
        if ip[9] != 6:
            return None
        if frag & 0x3FFF:
            raise CaptureError("a fragmented IP packet: not expected on loopback")
        src, dst = ip[12:16], ip[16:20]
        # total is 0 for a segmentation-offloaded packet larger than 64 KiB
        end = total if total else len(ip)
        tcp = ip[ihl:end]
    elif ver == 6:
        plen, nxt = struct.unpack_from(">HB", ip, 4)
        if nxt != 6:
            return None  # extension headers do not occur on loopback
        src, dst = ip[8:24], ip[24:40]
        tcp = ip[40:40 + plen] if plen else ip[40:]
    else:
        return None
    sport, dport, seq = struct.unpack_from(">HHI", tcp, 0)
    doff = (tcp[12] >> 4) * 4
    return src, dst, sport, dport, seq, tcp[13], tcp[doff:]


# ---- TCP ----------------------------------------------------------------------------------

SYN, FIN, RST, ACK = 0x02, 0x01, 0x04, 0x10


class Stream:
    """One direction of a TCP connection, its bytes handed on in order."""

    def __init__(self, sink, what):
        self.sink = sink
        self.what = what
        self.next = None    # the sequence number of the next byte to hand on
        self.held = {}      # segments that came before a hole was filled
        self.fin = self.reset = False

    def segment(self, seq, flags, payload):
        if flags & SYN:
            self.next = (seq + 1) & 0xFFFFFFFF
            self.held = {}
            return
        if self.next is None:
            raise CaptureError("%s: data before the SYN (the capture began mid-connection)" % self.what)
        if payload:
            self._data(seq, payload)
        if flags & FIN:
            self.fin = True
        if flags & RST:
            self.reset = True

    def _data(self, seq, payload):
        d = (seq - self.next) & 0xFFFFFFFF
        if d >= 0x80000000:  # starts before what was handed on: a retransmission
            skip = 0x100000000 - d
            if skip >= len(payload):
                return
            payload = payload[skip:]
            seq = self.next
            d = 0
        if d > 0:
            old = self.held.get(seq)
            if old is None or len(old) < len(payload):
                self.held[seq] = payload
            return
        self.sink(payload)
        self.next = (seq + len(payload)) & 0xFFFFFFFF
        while self.held:
            progressed = False
            for s in list(self.held):
                d = (s - self.next) & 0xFFFFFFFF
                p = self.held[s]
                if d >= 0x80000000 or d == 0:
                    del self.held[s]
                    skip = (self.next - s) & 0xFFFFFFFF
                    if skip < len(p):
                        self.sink(p[skip:])
                        self.next = (self.next + len(p) - skip) & 0xFFFFFFFF
                    progressed = True
            if not progressed:
                break

    def check(self):
        if self.held:
            raise CaptureError("%s: a hole of %d bytes in the stream that nothing filled (the capture "
                               "dropped packets)" % (self.what, min((s - self.next) & 0xFFFFFFFF for s in self.held)))


# ---- iSCSI --------------------------------------------------------------------------------

def cdb_length(cdb, ext):
    """The length of a CDB by its group code (SAM-5), the whole field if unknown."""
    group = cdb[0] >> 5
    n = {0: 6, 1: 10, 2: 10, 4: 16, 5: 12}.get(group)
    if cdb[0] == 0x7F and len(cdb) >= 8:
        n = 8 + cdb[7]
    if n is None:
        n = 16
    full = bytes(cdb) + ext
    return full[:n] if n <= len(full) else full


def text_keys(data):
    out = {}
    for kv in bytes(data).split(b"\0"):
        if b"=" in kv:
            k, v = kv.split(b"=", 1)
            out[k.decode(errors="replace")] = v.decode(errors="replace")
    return out


class Command:
    __slots__ = ("n", "lun", "cdb", "edtl", "dirn", "done", "resp", "status", "sense",
                 "resid", "data", "rejected", "t_sent", "t_done", "raced")

    def __init__(self, n, lun, cdb, edtl, dirn):
        self.n, self.lun, self.cdb, self.edtl, self.dirn = n, lun, cdb, edtl, dirn
        self.done = False
        self.resp = self.status = None
        self.sense = b""
        self.resid = "-"
        self.data = []
        self.rejected = None
        self.t_sent = self.t_done = None
        self.raced = None    # "caw", "tmf" or "runs": see mark_races()

    def line(self):
        s = "cmd %d lun=%d cdb=%s edtl=%d %s" % (self.n, self.lun, self.cdb.hex(), self.edtl, self.dirn)
        if self.rejected is not None:
            s += " rejected reason=%#04x" % self.rejected
        good = self.done and self.resp == 0 and self.status == 0
        if self.raced == "tmf" and (good or not self.done):
            # done before the TMF took it, or aborted: the target's timing
            return s + " done-or-aborted" + data_in(self.data, " in=")
        if not self.done:
            return s + " no-response" + data_in(self.data, " in=")
        if self.raced == "runs" and good:
            return s + " resp=0x00 status=0x00 sense=- resid=masked " + lba_status_first(self.data)
        if self.raced == "caw" and (good or self.resp == 0 and miscompare(self.sense)):
            # which of two racing COMPARE AND WRITEs finds the data it
            # expects is the order the target took them in
            s += " resp=0x00 status=raced sense=raced resid=%s" % self.resid
        else:
            s += " resp=%#04x status=%#04x sense=%s resid=%s" % (
                self.resp, self.status, self.sense.hex() if self.sense else "-", self.resid)
        return s + data_in(self.data, " in=")


def lba_status_first(pieces):
    """What GET LBA STATUS says of the LBA asked about, without the extents'
    lengths: the first descriptor's LBA and provisioning status."""
    b = b"".join(p for _, p in sorted(pieces, key=lambda p: p[0]))
    if len(b) < 24:
        return "in=lba-status:short:" + b.hex()
    return "in=lba-status:lba=%d,status=%d" % (int.from_bytes(b[8:16], "big"), b[20] & 0x0F)


def miscompare(sense):
    """Sense data (fixed or descriptor format) of MISCOMPARE / MISCOMPARE DURING VERIFY."""
    if len(sense) >= 14 and sense[0] & 0x7F in (0x70, 0x71):
        return sense[2] & 0x0F == 0x0E and sense[12:14] == b"\x1d\x00"
    if len(sense) >= 4 and sense[0] & 0x7F in (0x72, 0x73):
        return sense[1] & 0x0F == 0x0E and sense[2:4] == b"\x1d\x00"
    return False


SHOW_DATA = 64


def data_in(pieces, tag):
    """LEN:SHA256 of the Data-In bytes in offset order, and the bytes
    themselves where there are at most SHOW_DATA of them (INQUIRY, VPD
    pages, READ CAPACITY, ...: a difference then shows which byte)."""
    if not pieces:
        return tag + "0"
    pieces.sort(key=lambda p: p[0])
    h = hashlib.sha256()
    at = 0
    for off, b in pieces:
        if off != at:
            return tag + "gap@%d" % at
        h.update(b)
        at += len(b)
    s = tag + "%d:%s" % (at, h.hexdigest())
    if at <= SHOW_DATA:
        s += " data=" + b"".join(b for _, b in pieces).hex()
    return s


TMF_ABORT_TASK, TMF_TASK_REASSIGN = 1, 8
TMF_TASK_DOES_NOT_EXIST = 0x01


class Tmf:
    __slots__ = ("n", "lun", "fn", "ref", "resp", "raced")

    def __init__(self, n, lun, fn, ref):
        self.n, self.lun, self.fn, self.ref, self.resp = n, lun, fn, ref, None
        self.raced = False

    def line(self):
        if self.ref is None:
            ref = "-" if self.fn not in (TMF_ABORT_TASK, TMF_TASK_REASSIGN) else "unknown"
        else:
            ref = "cmd %d" % self.ref.n
        if self.resp is None:
            resp = "none"
        elif self.raced and self.resp in (0, TMF_TASK_DOES_NOT_EXIST):
            resp = "done-or-aborted"  # as the task it names
        else:
            resp = "%#04x" % self.resp
        return "tmf %d lun=%d fn=%d ref=%s resp=%s" % (self.n, self.lun, self.fn, ref, resp)


class Reject:
    __slots__ = ("reason", "opcode", "ref")

    def __init__(self, reason, opcode, ref):
        self.reason, self.opcode, self.ref = reason, opcode, ref

    def line(self):
        return "reject reason=%#04x opcode=%#04x ref=%s" % (self.reason, self.opcode, self.ref)


class Connection:
    """One TCP connection's iSCSI traffic: login keys, then the commands."""

    def __init__(self, what, t0, portal):
        self.what = what
        self.t0 = t0
        self.portal = portal
        self.keys_i = {}     # what the initiator's Login Requests said
        self.keys_t = {}     # what the target's Login Responses said
        self.ffp = {"i": False, "t": False}   # the direction is past login
        self.hdigest = {"i": 0, "t": 0}   # 4 where a CRC32C was negotiated
        self.ddigest = {"i": 0, "t": 0}
        self.events = []     # Command, Tmf, Reject in the order they came
        self.pending = {}    # ITT -> Command or Tmf
        self.by_itt = {}     # ITT -> the last item that used it
        self.ncmd = 0
        self.ntmf = 0
        self.buf = {"i": bytearray(), "t": bytearray()}
        self.error = None
        self.now = 0.0       # the time of the packet being read

    def name(self):
        init = self.keys_i.get("InitiatorName", "?")
        if self.keys_i.get("SessionType") == "Discovery":
            tgt = "discovery"
        else:
            tgt = self.keys_i.get("TargetName", "?")
        return "%s > %s portal %s" % (init, tgt, self.portal)

    def feed(self, side, data):
        if self.error:
            return
        buf = self.buf[side]
        buf += data
        pos = 0
        try:
            while len(buf) - pos >= BHS:
                opcode = buf[pos] & 0x3F
                login = opcode in (OP_LOGIN_REQ, OP_LOGIN_RSP)
                if not login and not self.ffp[side]:
                    self._enter_ffp(side)
                ahs = buf[pos + 4] * 4
                dsl = int.from_bytes(buf[pos + 5:pos + 8], "big")
                hd = 0 if login else self.hdigest[side]
                dd = 0 if login or not dsl else self.ddigest[side]
                total = BHS + ahs + hd + ((dsl + 3) & ~3) + dd
                if len(buf) - pos < total:
                    break
                hdr = bytes(buf[pos:pos + BHS])
                ahs_b = bytes(buf[pos + BHS:pos + BHS + ahs])
                dstart = pos + BHS + ahs + hd
                # the data of what is written (Data-Out, immediate data) is
                # not looked at: not copied either
                data_b = bytes(buf[dstart:dstart + dsl]) if opcode in WANT_DATA else b""
                self._pdu(side, opcode, hdr, ahs_b, data_b)
                pos += total
        except CaptureError as e:
            self.error = str(e)
        del buf[:pos]

    def _enter_ffp(self, side):
        """The first PDU of a direction past login: the digests apply from it on."""
        self.ffp[side] = True
        for key, table in (("HeaderDigest", self.hdigest), ("DataDigest", self.ddigest)):
            v = self.keys_t.get(key, "None")
            if v not in ("None", "CRC32C"):
                raise CaptureError("%s: %s=%s negotiated" % (self.what, key, v))
            table[side] = 4 if v == "CRC32C" else 0

    def _pdu(self, side, opcode, hdr, ahs, data):
        itt = bytes(hdr[16:20])
        if opcode == OP_LOGIN_REQ:
            self.keys_i.update(text_keys(data))
        elif opcode == OP_LOGIN_RSP:
            self.keys_t.update(text_keys(data))
        elif opcode == OP_SCSI_CMD:
            ext = b""
            a = 0
            while a + 4 <= len(ahs):
                alen = int.from_bytes(ahs[a:a + 2], "big")
                if ahs[a + 2] == AHS_EXT_CDB:
                    ext = bytes(ahs[a + 4:a + 3 + alen])
                a += (3 + alen + 3) & ~3
            flags = hdr[1]
            dirn = {0x40: "R", 0x20: "W", 0x60: "RW"}.get(flags & 0x60, "-")
            lun = int.from_bytes(hdr[8:10], "big") & 0x3FFF
            c = Command(self.ncmd, lun, cdb_length(hdr[32:48], ext),
                        int.from_bytes(hdr[20:24], "big"), dirn)
            c.t_sent = self.now
            self.ncmd += 1
            self.events.append(c)
            self.pending[itt] = c
            self.by_itt[itt] = c
        elif opcode == OP_TMF_REQ:
            fn = hdr[1] & 0x7F
            ref = None
            if fn in (TMF_ABORT_TASK, TMF_TASK_REASSIGN):  # the others name no task
                ref = self.by_itt.get(bytes(hdr[20:24]))
                if not isinstance(ref, Command):
                    ref = None
            t = Tmf(self.ntmf, int.from_bytes(hdr[8:10], "big") & 0x3FFF, fn, ref)
            self.ntmf += 1
            self.events.append(t)
            self.pending[itt] = t
            self.by_itt[itt] = t
        elif opcode == OP_DATA_IN:
            c = self.pending.get(itt)
            if isinstance(c, Command):
                c.data.append((int.from_bytes(hdr[40:44], "big"), bytes(data)))
                if hdr[1] & 0x01:  # S: the status is in this PDU
                    self._status(c, 0, hdr[3], b"", hdr[1], hdr)
                    del self.pending[itt]
        elif opcode == OP_SCSI_RSP:
            c = self.pending.pop(itt, None)
            if isinstance(c, Command):
                sense = b""
                if len(data) >= 2:
                    sl = int.from_bytes(data[0:2], "big")
                    sense = bytes(data[2:2 + sl])
                self._status(c, hdr[2], hdr[3], sense, hdr[1], hdr)
        elif opcode == OP_TMF_RSP:
            t = self.pending.pop(itt, None)
            if isinstance(t, Tmf):
                t.resp = hdr[2]
        elif opcode == OP_REJECT:
            rej = bytes(data[:BHS])
            op = rej[0] & 0x3F if rej else 0xFF
            ref = self.by_itt.get(rej[16:20]) if len(rej) >= 20 else None
            if isinstance(ref, Command) and ref.n == self.ncmd - 1 and op == OP_SCSI_CMD:
                ref.rejected = hdr[2]
                self.pending.pop(rej[16:20], None)
            else:
                refs = "cmd %d" % ref.n if isinstance(ref, Command) else "-"
                self.events.append(Reject(hdr[2], op, refs))

    def _status(self, c, resp, status, sense, flags, hdr):
        c.done = True
        c.t_done = self.now
        c.resp, c.status, c.sense = resp, status, sense
        res = int.from_bytes(hdr[44:48], "big")
        parts = []
        if flags & 0x04:
            parts.append("O:%d" % res)
        if flags & 0x02:
            parts.append("U:%d" % res)
        if flags & 0x10:
            parts.append("bidiO:%d" % int.from_bytes(hdr[40:44], "big"))
        if flags & 0x08:
            parts.append("bidiU:%d" % int.from_bytes(hdr[40:44], "big"))
        c.resid = ",".join(parts) or "-"


def read_capture(path, ports, runs_vary=False):
    """The connections of a capture, in the order the list names them."""
    conns = {}   # (client addr, client port, server addr, server port) -> Connection
    done = []
    streams = {}
    for t, ip in packets(path):
        seg = tcp_segment(ip)
        if seg is None:
            continue
        src, dst, sport, dport, seq, flags, payload = seg
        a, b = (src, sport), (dst, dport)
        if flags & SYN and not flags & ACK:
            key = a + b
            old = conns.pop(key, None)
            if old is not None:
                done.append(old)
            portal = ports.index(dport) if ports and dport in ports else dport
            c = Connection("connection %d from port %d" % (len(done) + len(conns), sport), t, portal)
            conns[key] = c
            streams[key + ("i",)] = Stream(lambda d, c=c: c.feed("i", d), c.what + " (to the target)")
            streams[key + ("t",)] = Stream(lambda d, c=c: c.feed("t", d), c.what + " (to the initiator)")
        key_i, key_t = a + b, b + a
        if key_i in conns:
            st = streams[key_i + ("i",)]
        elif key_t in conns:
            st = streams[key_t + ("t",)]
        elif payload:
            raise CaptureError("%s: data on a connection (port %d to %d) whose SYN the capture did not "
                               "see: the capture began too late" % (path, sport, dport))
        else:
            continue  # the last ACK of one that closed before the capture
        conns[key_i if key_i in conns else key_t].now = t
        st.segment(seq, flags, payload)
    done.extend(conns.values())
    for key, st in streams.items():
        st.check()
        other = streams[key[:4] + ("t" if key[4] == "i" else "i",)]
        if not (st.reset or other.reset or st.fin and other.fin):
            raise CaptureError("%s: %s did not close before the capture ended: the capture ended too "
                               "early" % (path, st.what))
    for c in done:
        if c.error:
            raise CaptureError(c.error)
    mark_races(done, runs_vary)
    done.sort(key=lambda c: c.t0)
    rank = {}
    for c in done:
        nm = c.name()
        rank[nm] = rank.get(nm, 0) + 1
        c.label = "%s #%d" % (nm, rank[nm])
    done.sort(key=lambda c: (c.name(), c.t0))
    return done


TMF_ON_LU = (1, 2, 3, 5, 6, 7)  # ABORT TASK (SET), CLEAR TASK SET, LU and target resets


def mark_races(conns, runs_vary):
    """Mark the commands whose outcome the order of events decides, not the
    target's code, by rules that look at the order of what was sent alone
    (a rule that looked at when answers came would itself vary):

    - A command that the initiator followed with a TMF that covers it (an
      ABORT TASK naming it; one for its LU or target) before it sent
      anything else: iscsi-test-cu's async abort and LU reset tests send a
      WRITE and the TMF at once, and the WRITE is done before the TMF comes
      or aborted by it (and ABORT TASK then answers FUNCTION COMPLETE or
      TASK DOES NOT EXIST), as the libiscsi tests themselves allow.
    - COMPARE AND WRITEs to one block sent back to back on one connection,
      some before the one before them was answered, while another
      connection did the same to that block of the LU
      (MultipathIO.CompareAndWriteAsync: a thousand on each path at once):
      which finds the block as it expects, good or MISCOMPARE, is the order
      the target happened to take them in.
    - With runs_vary (a write-back cached LU): every GET LBA STATUS, whose
      extents end where the data is dirty on the cache or already on the
      backing store, as far as the cleaner has come (only the LBA and
      provisioning status of the first extent are kept).
    """
    runs = []
    for c in conns:
        for e in c.events:
            if runs_vary and isinstance(e, Command) and e.cdb[:1] == b"\x9e" and e.cdb[1] & 0x1F == 0x12:
                e.raced = "runs"
        tgt = c.keys_i.get("TargetName")
        last = None
        for e in c.events:
            if isinstance(e, Tmf):
                if isinstance(last, Command) and (e.ref is last if e.fn == TMF_ABORT_TASK else
                                                  e.fn in TMF_ON_LU and (e.fn >= 6 or e.lun == last.lun)):
                    last.raced = "tmf"
                    e.raced = e.fn == TMF_ABORT_TASK
            if isinstance(e, (Command, Tmf)):
                last = e
        run = []
        for e in c.events + [None]:
            if not isinstance(e, (Command, type(None))):
                continue
            caw = e is not None and e.cdb[:1] == b"\x89" and len(e.cdb) == 16
            if run and (not caw or e.lun != run[0].lun or e.cdb[2:10] != run[0].cdb[2:10]):
                runs.append(((tgt, run[0].lun, run[0].cdb[2:10]), c, run))
                run = []
            if caw:
                run.append(e)
    windows = []
    for lu, c, run in runs:
        end = 0.0
        piped = False
        for e in run:
            if e.t_sent < end:
                piped = True
            end = max(end, e.t_done if e.t_done is not None else float("inf"))
        if piped:
            windows.append((run[0].t_sent, end, lu, c, run))
    for a in windows:
        for b in windows:
            if a[2] == b[2] and a[3] is not b[3] and a[0] < b[1] and b[0] < a[1]:
                for e in a[4]:
                    e.raced = "caw"


def cmd_list(path, ports, runs_vary):
    out = sys.stdout
    for c in read_capture(path, ports, runs_vary):
        out.write("conn %s\n" % c.label)
        for e in c.events:
            out.write("  %s\n" % e.line())


# ---- compare ------------------------------------------------------------------------------

def read_list(path):
    """{connection label: [lines]} and the labels in file order."""
    conns, order, cur = {}, [], None
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("conn "):
                cur = line[5:]
                order.append(cur)
                conns[cur] = []
            elif cur is not None:
                conns[cur].append(line.strip())
    return conns, order


def cmd_compare(old, new, show):
    a, a_order = read_list(old)
    b, b_order = read_list(new)
    ncmd = same = 0
    problems = []
    for label in a_order + [x for x in b_order if x not in a]:
        la, lb = a.get(label), b.get(label)
        if la is None or lb is None:
            problems.append("connection %s only in the %s run" % (label, "new" if la is None else "old"))
            continue
        for i in range(max(len(la), len(lb))):
            x = la[i] if i < len(la) else None
            y = lb[i] if i < len(lb) else None
            if x is not None and x.startswith("cmd "):
                ncmd += 1
                if x == y:
                    same += 1
    with open(old) as f:
        ta = f.read().splitlines()
    with open(new) as f:
        tb = f.read().splitlines()
    if ta == tb and not problems:
        other = sum(1 for v in a.values() for x in v if not x.startswith("cmd "))
        lines = [x for v in a.values() for x in v if x.startswith("cmd ")]
        caw = sum(1 for x in lines if " status=raced " in x)
        tmf = sum(1 for x in lines if " done-or-aborted" in x)
        runs = sum(1 for x in lines if " resid=masked " in x)
        print("%d commands identical (%d connections, %d task management and reject lines; masked: "
              "the outcome of %d racing COMPARE AND WRITEs and of %d commands a TMF followed, the extent "
              "lengths of %d GET LBA STATUS)" % (ncmd, len(a_order), other, caw, tmf, runs))
        return 0
    for p in problems:
        print(p)
    diff = list(difflib.unified_diff(ta, tb, old, new, n=3, lineterm=""))
    nd = sum(1 for d in diff[2:] if d[:1] in "+-")
    for d in diff[:show]:
        print(d)
    if len(diff) > show:
        print("... %d more lines of diff" % (len(diff) - show))
    print("DIFFERENT: %d of %d commands of the old run identical; %d lines differ" % (same, ncmd, nd))
    return 1


def usage():
    sys.stderr.write(__doc__)
    return 2


def main(argv):
    if len(argv) >= 2 and argv[0] == "list":
        ports = []
        runs_vary = False
        args = argv[2:]
        while args:
            if args[0] == "--ports" and len(args) >= 2:
                ports = [int(p) for p in args[1].split(",")]
                args = args[2:]
            elif args[0] == "--lba-status-runs-vary":
                runs_vary = True
                args = args[1:]
            else:
                return usage()
        try:
            cmd_list(argv[1], ports, runs_vary)
        except (CaptureError, OSError) as e:
            sys.stderr.write("iscsi_pcap.py: %s\n" % e)
            return 2
        return 0
    if len(argv) >= 3 and argv[0] == "compare":
        show = 80
        if len(argv) == 5 and argv[3] == "--show":
            show = int(argv[4])
        elif len(argv) != 3:
            return usage()
        return cmd_compare(argv[1], argv[2], show)
    return usage()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
