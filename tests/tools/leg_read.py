#!/usr/bin/env python3
"""leg_read.py - read a tiercache cache leg offline, without the daemon.

Written from the on-disk format that cache/meta.h declares (and the
recovery that cache/set.c recover_set, cache/journal.c and cache/map.c
slot_apply describe), not from the daemon's code, so the crash tests can
look at what a leg holds after a kill -9 before the daemon touches it.

A leg: two superblock copies at 0 and 4 KiB (the valid one with the higher
generation wins); the slot table (one record per slot: key, flags, valid
and dirty bitmaps of 512-byte blocks); CACHE_NJOURNALS journal rings whose
records since the last checkpoint are replayed in seq order, each ring
from its jtail up to the first block whose position, set uuid or checksum
is wrong; then the data, slot i at data_off + i * extent_size. Extent key
= (backing id << 40) | extent index; backing ids are in the superblock's
backing table by LUN name: in the superblock in versions 1 to 3, in two
copies of its own at 12 and 36 KiB in version 4 (the superblock names the
current copy and its CRC). Superblock versions 1 to 4 are read (version 2
adds a write-intent bitmap in the padding before the table: ignored;
version 3 a block log between the journal and the data, which the daemon's
recovery writes back in place: read a leg after the daemon has opened it).

  leg_read.py info LEG
      The superblock and the recovered map, one line.
  leg_read.py view LEG BACKING LUN SECTORS OUT
      OUT = what this leg says the first SECTORS 512-byte blocks of LUN hold:
      the cached block where the leg's metadata says it is valid, else the
      backing file's bytes.
  leg_read.py diffviews A B
      Count the sectors two views disagree on.
  leg_read.py compare LEG0 LEG1 BACKING LUN
      After a clean stop: both legs clean, the same map, the same bytes in
      every valid block, and every valid clean block equal to the backing
      file. Exit 1 with a line per difference (a valid clean block unlike
      the backing file would read back differently once evicted: recovery
      drops the clean blocks of regions whose writes a crash cut).

As a module: Leg(path).block(lun, sector) -> (valid, dirty, bytes or None).
"""
import struct
import sys

SECTOR = 512
PAGE = 4096
MAGIC = 0x3145484341434354
VERSIONS = (1, 2, 3, 4)
NJOURNALS = 16
MAX_BACKINGS = 16          # the table inside the superblock (versions 1-3)
BTAB_OFF = 12 * 1024       # version 4: the table's own copies
BTAB_ENTRIES = 256
BTAB_ENTRY = 96
BTAB_BYTES = BTAB_ENTRIES * BTAB_ENTRY
SB_BTAB_OFF = 3960         # btab_copy, btab_crc
KEY_NONE = (1 << 64) - 1
JBLOCK_MAGIC = 0x4B4C424A
JBLOCK_RECS = 127
JOP_DIRTY, JOP_VALID, JOP_CLEAN, JOP_INVALIDATE, JOP_FREE = 1, 2, 3, 4, 5


# CRC32C (Castagnoli, reflected) as ISA-L's crc32_iscsi(buf, len, 0xffffffff)
# computes it: initial value all ones, no final inversion.
def _crc_table():
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    return t


_CRC_T = _crc_table()


def crc32c(data, crc=0xFFFFFFFF):
    t = _CRC_T
    for b in data:
        crc = t[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc


def crc_with_zeroed(buf, off):
    """CRC of buf with the 4-byte checksum field at off taken as zero."""
    return crc32c(bytes(buf[:off]) + b"\0\0\0\0" + bytes(buf[off + 4:]))


class LegError(Exception):
    pass


SB_FMT = "<QII16sQIIIIIIIIQQQQIIQ"  # up to and including ckpt_seq
SB_FIELDS = ("magic", "version", "crc", "uuid", "gen", "leg_index", "nlegs", "extent_size",
             "block_size", "nslots", "rec_size", "njournals", "jblocks", "leg_size", "table_off",
             "journal_off", "data_off", "clean", "failed_mask", "ckpt_seq")
SB_JTAIL_OFF = struct.calcsize(SB_FMT)       # 120
SB_NAME_OFF = SB_JTAIL_OFF + 8 * NJOURNALS   # 248
SB_BACKING_OFF = SB_NAME_OFF + 64            # 312
BACKING_SIZE = 224


def parse_sb(buf):
    """A superblock copy as a dict, or (None, why)."""
    f = dict(zip(SB_FIELDS, struct.unpack_from(SB_FMT, buf, 0)))
    if f["magic"] != MAGIC:
        return None, "no superblock magic"
    if f["version"] not in VERSIONS:
        return None, "version %d unknown" % f["version"]
    if crc_with_zeroed(buf[:PAGE], 12) != f["crc"]:
        return None, "checksum mismatch"
    f["jtail"] = list(struct.unpack_from("<%dQ" % NJOURNALS, buf, SB_JTAIL_OFF))
    f["set_name"] = buf[SB_NAME_OFF:SB_NAME_OFF + 64].split(b"\0")[0].decode(errors="replace")
    f["backing"] = {}
    if f["version"] >= 4:
        f["btab_copy"], f["btab_crc"] = struct.unpack_from("<II", buf, SB_BTAB_OFF)
        return f, None  # the table is in its own pages: Leg reads it
    for i in range(MAX_BACKINGS):
        o = SB_BACKING_OFF + i * BACKING_SIZE
        lun = buf[o:o + 64].split(b"\0")[0].decode(errors="replace")
        if not lun:
            continue
        size, ino, fsdev, bid, isblk = struct.unpack_from("<QQQII", buf, o + 192)
        f["backing"][lun] = {"bid": bid, "size": size, "ino": ino, "path":
                             buf[o + 64:o + 192].split(b"\0")[0].decode(errors="replace")}
    return f, None


class Slot:
    __slots__ = ("key", "v", "d", "has_bm")

    def __init__(self):
        self.key = KEY_NONE
        self.v = 0
        self.d = 0
        self.has_bm = False


class Leg:
    def __init__(self, path):
        self.path = path
        self.f = open(path, "rb")
        head = self.f.read(2 * PAGE)
        if len(head) < 2 * PAGE:
            raise LegError("%s: shorter than two superblocks" % path)
        best, whys = None, []
        for k in range(2):
            if head[k * PAGE:k * PAGE + 8] == b"TREBILD1":
                # the rebuild mark (cache/meta.h): the daemon rebuilds this
                # leg at start; nothing on it belongs to the set yet
                raise LegError("%s: being rebuilt (superblock copy %d carries the rebuild mark)" % (path, k))
            sb, why = parse_sb(head[k * PAGE:(k + 1) * PAGE])
            if sb is None:
                whys.append("copy %d: %s" % (k, why))
            elif best is None or sb["gen"] > best["gen"]:
                best = sb
                best["copy"] = k
        if best is None:
            raise LegError("%s: no valid superblock (%s)" % (path, "; ".join(whys)))
        self.sb = sb = best
        if sb["version"] >= 4:
            self._load_btab()
        self.ext = sb["extent_size"]
        self.bpe = self.ext // SECTOR
        self.all = (1 << self.bpe) - 1
        self.nslots = sb["nslots"]
        self.slots = [Slot() for _ in range(self.nslots)]
        self.from_table = 0
        self.records = 0
        self._load_table()
        self._replay()
        self._build_map()

    # -- recovery --------------------------------------------------------------------------

    def _load_btab(self):
        """Version 4: the table copy the superblock names; its CRC must match."""
        copy = self.sb["btab_copy"]
        if copy > 1:
            raise LegError("%s: the superblock names table copy %d" % (self.path, copy))
        self.f.seek(BTAB_OFF + copy * BTAB_BYTES)
        tab = self.f.read(BTAB_BYTES)
        if len(tab) < BTAB_BYTES or crc32c(tab) != self.sb["btab_crc"]:
            raise LegError("%s: table copy %d does not match its checksum" % (self.path, copy))
        for i in range(BTAB_ENTRIES):
            o = i * BTAB_ENTRY
            lun = tab[o:o + 64].split(b"\0")[0].decode(errors="replace")
            if not lun:
                continue
            size, ino, fsdev, flags = struct.unpack_from("<QQQI", tab, o + 64)
            self.sb["backing"][lun] = {"bid": i, "size": size, "ino": ino, "path": ""}

    def _apply(self, sl, op, first, count):
        """One change of a slot's blocks, as cache/map.c slot_apply does it."""
        if op == JOP_FREE:
            sl.v = sl.d = 0
            sl.has_bm = False
            return
        whole = first == 0 and count >= self.bpe
        if whole and not sl.has_bm:
            m = self.all
        else:
            sl.has_bm = True
            m = ((1 << count) - 1) << first & self.all
        if op == JOP_DIRTY:
            sl.v |= m
            sl.d |= m
        elif op == JOP_VALID:
            sl.v |= m
            sl.d &= ~m
        elif op == JOP_CLEAN:
            sl.d &= ~m
        elif op == JOP_INVALIDATE:
            sl.v &= ~m
            sl.d &= ~m

    def _load_table(self):
        rs = self.sb["rec_size"]
        self.f.seek(self.sb["table_off"])
        table = self.f.read(self.nslots * rs)
        if len(table) < self.nslots * rs:
            raise LegError("%s: slot table cut short" % self.path)
        nb = self.bpe // 8
        for s in range(self.nslots):
            rec = table[s * rs:(s + 1) * rs]
            key, flags, crc, nblocks = struct.unpack_from("<QIIQ", rec, 0)
            if crc_with_zeroed(rec, 12) != crc or nblocks != self.bpe:
                raise LegError("%s: slot record %d is corrupt" % (self.path, s))
            if key == KEY_NONE:
                continue
            sl = self.slots[s]
            sl.key = key
            self.from_table += 1
            v = int.from_bytes(rec[32:32 + nb], "little")
            d = int.from_bytes(rec[32 + nb:32 + 2 * nb], "little")
            # runs of (invalid | valid clean | valid dirty), as the table load applies them
            b = 0
            while b < self.bpe:
                st = ((v >> b) & 1) * (1 + ((d >> b) & 1))
                e = b + 1
                while e < self.bpe and ((v >> e) & 1) * (1 + ((d >> e) & 1)) == st:
                    e += 1
                if st:
                    self._apply(sl, JOP_DIRTY if st == 2 else JOP_VALID, b, e - b)
                b = e

    def _replay(self):
        sb = self.sb
        jb = sb["jblocks"]
        uuid8 = sb["uuid"][:8]
        recs = []
        for j in range(NJOURNALS):
            self.f.seek(sb["journal_off"] + j * jb * PAGE)
            ring = self.f.read(jb * PAGE)
            pos = sb["jtail"][j]
            while pos - sb["jtail"][j] < jb:
                blk = ring[(pos % jb) * PAGE:(pos % jb + 1) * PAGE]
                magic, crc, bpos = struct.unpack_from("<IIQ", blk, 0)
                nrec, = struct.unpack_from("<I", blk, 24)
                if magic != JBLOCK_MAGIC or bpos != pos or blk[16:24] != uuid8 or nrec > JBLOCK_RECS or \
                        crc_with_zeroed(blk, 4) != crc:
                    break
                for i in range(nrec):
                    seq, key, slot, op, first, count = struct.unpack_from("<QQIHHH", blk, 32 + 32 * i)
                    if seq < sb["ckpt_seq"] or slot >= self.nslots or not JOP_DIRTY <= op <= JOP_FREE or \
                            first + count > self.bpe:
                        continue
                    recs.append((seq, key, slot, op, first, count))
                pos += 1
        recs.sort()
        self.records = len(recs)
        for seq, key, slot, op, first, count in recs:
            sl = self.slots[slot]
            if op == JOP_FREE:
                self._apply(sl, JOP_FREE, 0, self.bpe)
                sl.key = KEY_NONE
                continue
            if sl.key != key:
                self._apply(sl, JOP_FREE, 0, self.bpe)
                sl.key = key
            self._apply(sl, op, first, count)

    def _build_map(self):
        """Slots from the highest down: the first live slot of a key wins, the rest are free."""
        self.map = {}
        for s in range(self.nslots - 1, -1, -1):
            sl = self.slots[s]
            any_valid = sl.has_bm or sl.v == self.all
            if sl.key != KEY_NONE and any_valid and sl.key not in self.map:
                self.map[sl.key] = s
            else:
                sl.key = KEY_NONE
                sl.v = sl.d = 0
                sl.has_bm = False

    # -- queries ---------------------------------------------------------------------------

    def bid(self, lun):
        b = self.sb["backing"].get(lun)
        if b is None:
            raise LegError("%s: no LUN %s in the backing table (%s)" % (self.path, lun,
                                                                      ", ".join(self.sb["backing"]) or "empty"))
        return b["bid"]

    def data(self, slot, first, count):
        self.f.seek(self.sb["data_off"] + slot * self.ext + first * SECTOR)
        return self.f.read(count * SECTOR)

    def block(self, lun, sector):
        """(valid, dirty, the cached bytes or None) for one 512-byte block of lun."""
        key = self.bid(lun) << 40 | sector * SECTOR // self.ext
        s = self.map.get(key)
        b = sector % self.bpe
        if s is None or not (self.slots[s].v >> b) & 1:
            return False, False, None
        return True, bool((self.slots[s].d >> b) & 1), self.data(s, b, 1)

    def runs(self, slot):
        """Maximal runs (first, count) of valid blocks of a slot."""
        v, b, out = self.slots[slot].v, 0, []
        while b < self.bpe:
            if (v >> b) & 1:
                e = b
                while e < self.bpe and (v >> e) & 1:
                    e += 1
                out.append((b, e - b))
                b = e
            else:
                b += 1
        return out

    def view(self, lun, backing, sectors):
        """The first `sectors` blocks of lun as this leg has them: cached where valid, else backing."""
        with open(backing, "rb") as bf:
            img = bytearray(bf.read(sectors * SECTOR))
        img.extend(b"\0" * (sectors * SECTOR - len(img)))
        bid = self.bid(lun)
        valid = 0
        for key, s in self.map.items():
            if key >> 40 != bid:
                continue
            base = (key & ((1 << 40) - 1)) * self.bpe
            for first, count in self.runs(s):
                lo, hi = base + first, min(base + first + count, sectors)
                if lo >= hi:
                    continue
                img[lo * SECTOR:hi * SECTOR] = self.data(s, first, hi - lo)
                valid += hi - lo
        return img, valid

    def summary(self):
        sb = self.sb
        dirty = sum(bin(self.slots[s].d).count("1") for s in self.map.values())
        valid = sum(bin(self.slots[s].v).count("1") for s in self.map.values())
        return ("%s: set %s, superblock v%d gen %d (copy %s), leg %d of %d, %s, failed mask %#x; %d extents "
                "(%d from the table, %d journal records since seq %d), %d KiB valid, %d KiB dirty" %
                (self.path, sb["set_name"], sb["version"], sb["gen"], "AB"[sb["copy"]], sb["leg_index"],
                 sb["nlegs"], "clean" if sb["clean"] else "not clean", sb["failed_mask"], len(self.map),
                 self.from_table, self.records, sb["ckpt_seq"], valid * SECTOR >> 10, dirty * SECTOR >> 10))


def cmd_view(leg, backing, lun, sectors, out):
    g = Leg(leg)
    img, valid = g.view(lun, backing, int(sectors))
    with open(out, "wb") as f:
        f.write(img)
    print("%s; %d of the %s sectors viewed come from the leg" % (g.summary(), valid, sectors))
    return 0


def cmd_diffviews(a, b):
    with open(a, "rb") as f:
        x = f.read()
    with open(b, "rb") as f:
        y = f.read()
    n = min(len(x), len(y)) // SECTOR
    diff = [s for s in range(n) if x[s * SECTOR:(s + 1) * SECTOR] != y[s * SECTOR:(s + 1) * SECTOR]] \
        if x != y else []
    print("%d sectors differ%s" % (len(diff), (": " + " ".join(map(str, diff[:10])) +
                                                (" ..." if len(diff) > 10 else "")) if diff else ""))
    return 0


def cmd_compare(leg0, leg1, backing, lun):
    """Exit 1 if the legs disagree, or a valid clean block differs from the backing store."""
    a, b = Leg(leg0), Leg(leg1)
    bad, stale = [], []
    for g in (a, b):
        if not g.sb["clean"]:
            bad.append("%s: superblock not marked clean" % g.path)
        if g.records:
            bad.append("%s: %d journal records past the final checkpoint" % (g.path, g.records))
    if a.map != b.map:
        keys = set(a.map.items()) ^ set(b.map.items())
        bad.append("the legs map different extents: %d (key, slot) pairs differ" % len(keys))
    bid = a.bid(lun)
    blocks = 0
    with open(backing, "rb") as bf:
        for key, s in sorted(a.map.items()):
            sa, sb_ = a.slots[s], b.slots[s]
            if b.map.get(key) != s:
                continue
            if sa.v != sb_.v or sa.d != sb_.d:
                bad.append("slot %d (key %#x): valid/dirty bitmaps differ between the legs" % (s, key))
                continue
            base = (key & ((1 << 40) - 1)) * a.bpe
            for first, count in a.runs(s):
                da, db = a.data(s, first, count), b.data(s, first, count)
                back = None
                if key >> 40 == bid:
                    bf.seek((base + first) * SECTOR)
                    back = bf.read(count * SECTOR)
                    back += b"\0" * (count * SECTOR - len(back))
                for i in range(count):
                    blocks += 1
                    x, y = da[i * SECTOR:(i + 1) * SECTOR], db[i * SECTOR:(i + 1) * SECTOR]
                    where = "sector %d (slot %d block %d)" % (base + first + i, s, first + i)
                    if x != y:
                        bad.append("%s: the legs hold different bytes" % where)
                    elif back is not None and not (sa.d >> (first + i)) & 1 and \
                            x != back[i * SECTOR:(i + 1) * SECTOR]:
                        stale.append("%s: valid and clean, but the backing store holds other bytes" % where)
    for line in bad[:20] + stale[:5]:
        print(line)
    print("%s\n%s" % (a.summary(), b.summary()))
    print("%d valid blocks compared: %d differences between the legs, %d clean blocks unlike the backing "
          "store" % (blocks, len(bad), len(stale)))
    return 1 if bad or stale else 0


def main(argv):
    cmds = {"info": (1, lambda p: print(Leg(p).summary()) or 0), "view": (5, cmd_view),
            "diffviews": (2, cmd_diffviews), "compare": (4, cmd_compare)}
    if len(argv) < 2 or argv[1] not in cmds or len(argv) - 2 != cmds[argv[1]][0]:
        sys.stderr.write(__doc__)
        return 2
    try:
        return cmds[argv[1]][1](*argv[2:])
    except LegError as e:
        print("leg_read: %s" % e)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
