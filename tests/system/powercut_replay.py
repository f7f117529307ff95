#!/usr/bin/env python3
"""powercut_replay.py - power cuts rebuilt from a QEMU blklogwrites log, recovered by tiercached.

The log (QEMU's blklogwrites, the dm-log-writes format, 512-byte log
sectors): sector 0 holds the superblock (little-endian u64 magic
0x6a736677736872, u64 version 1, u64 nr_entries, u32 sectorsize); entry 0
starts at log sector 1. An entry is one sector with its header (u64 sector,
u64 nr_sectors, u64 flags, u64 data_len, in log sectors), followed by
nr_sectors sectors of data, except for a discard (flag 4: no data) and a
flush (flag 1: no range). QEMU appends an entry when the write to the image
has completed, so the entries are in completion order.

On a write-through drive every completed write is durable: each prefix of
the log is a state a power cut can leave, and the write being done at the
cut may be torn at any 512-byte boundary. For each cut point (spread over
the log with a fixed, printed seed; the last is the end of the log) and
each tear seed (0: the write at the cut not at all, otherwise a random
subset of its sectors, from a printed seed), the drive is rebuilt from the
image before the run, split into its partitions (the LUN's backing store,
leg 0, leg 1, the writer's log), and:
  - tiercached is started on those files (the backing store through a loop
    device: the set knows it as a block device) and must come up;
  - stamp_io verify reads every sector the writer's log (as the cut left it
    on the fourth partition) names, twice, and every write acknowledged
    there must read back (or a later write of the same sector): exit 0;
  - after a clean stop, tests/tools/leg_read.py compare: both legs clean,
    with the same map and the same bytes in every valid block.
Exit 0 when every image passes, 1 at the first failure (its files are kept),
2 on a usage or set-up error.
"""
import argparse
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time

SECTOR = 512
MAGIC = 0x6A736677736872
F_FLUSH, F_FUA, F_DISCARD, F_MARK = 1, 2, 4, 8
HERE = os.path.dirname(os.path.abspath(__file__))
LEG_READ = os.path.join(HERE, "..", "tools", "leg_read.py")


def entries(path):
    """[(sector, nr_sectors, flags, data offset in the log)], as many as the superblock says."""
    with open(path, "rb") as f:
        sb = f.read(SECTOR)
        magic, version, n, secsize = struct.unpack_from("<QQQI", sb)
        if magic != MAGIC or version != 1 or secsize != SECTOR:
            raise SystemExit("powercut_replay: %s is not a 512-byte blklogwrites log (magic %#x, version %d, "
                             "sector %d)" % (path, magic, version, secsize))
        out, pos = [], SECTOR
        size = os.fstat(f.fileno()).st_size
        for i in range(n):
            f.seek(pos)
            hdr = f.read(32)
            if len(hdr) < 32:
                raise SystemExit("powercut_replay: the log ends inside entry %d of %d" % (i, n))
            sector, nsec, flags, _ = struct.unpack("<QQQQ", hdr)
            data = pos + SECTOR
            out.append((sector, nsec, flags, data))
            pos = data + (0 if flags & (F_DISCARD | F_FLUSH) else nsec * SECTOR)
            if pos > size:
                raise SystemExit("powercut_replay: entry %d runs past the end of the log" % i)
        return out


class Drive:
    """The drive as the log rebuilds it, in memory."""

    def __init__(self, base, log):
        with open(base, "rb") as f:
            self.img = bytearray(f.read())
        self.log = open(log, "rb")
        self.applied = 0

    def sectors_of(self, e):
        sector, nsec, flags, data = e
        if flags & F_FLUSH or nsec == 0:
            return []
        return list(range(sector, sector + nsec))

    def sector_bytes(self, e, s):
        sector, _, flags, data = e
        if flags & F_DISCARD:
            return bytes(SECTOR)  # a discarded block reads back zeroes (QEMU punches a hole)
        self.log.seek(data + (s - sector) * SECTOR)
        return self.log.read(SECTOR)

    def apply(self, e):
        sector, nsec, flags, data = e
        if flags & F_FLUSH or nsec == 0:
            return
        lo, hi = sector * SECTOR, (sector + nsec) * SECTOR
        if flags & F_DISCARD:
            self.img[lo:hi] = bytes(hi - lo)
        else:
            self.log.seek(data)
            self.img[lo:hi] = self.log.read(hi - lo)


def write_parts(img, parts, names, d, torn):
    """Write each partition to its file; torn = {drive sector: bytes} applied over them."""
    for (start, n), name in zip(parts, names):
        buf = bytearray(img[start * SECTOR:(start + n) * SECTOR])
        for s, b in torn.items():
            if start <= s < start + n:
                buf[(s - start) * SECTOR:(s - start + 1) * SECTOR] = b
        with open(os.path.join(d, name), "wb") as f:
            f.write(buf)


def writer_log(path):
    """The writer's log as the cut left it: up to the first NUL, without a last partial line."""
    with open(path, "rb") as f:
        raw = f.read()
    raw = raw.split(b"\0", 1)[0]
    if not raw.endswith(b"\n"):
        raw = raw[: raw.rfind(b"\n") + 1]
    return raw.decode("ascii", "replace")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def conf(d, port, iqn, backing, backing_bytes):
    path = os.path.join(d, "t.conf")
    with open(path, "w") as f:
        f.write("""[daemon]
state_dir = {d}/state
control_socket = {d}/ctl.sock
log_level = info

[portal]
listen = 127.0.0.1:{port}

[target {iqn}]
lun0 = disk0

[lun disk0]
backing = {backing}
size = {size}
block_size = 512
cache = fast

[cache fast]
legs = {d}/leg0.img {d}/leg1.img
extent = 64K
mode = write-back
seq_cutoff = 0
""".format(d=d, port=port, iqn=iqn, backing=backing, size=backing_bytes))
    return path


def check_image(a, d, tag):
    """One rebuilt drive: recover, verify, stop, compare. Returns None or why it failed."""
    log = writer_log(os.path.join(d, "acklog.img"))
    with open(os.path.join(d, "writer.log"), "w") as f:
        f.write(log)
    lines = log.splitlines()
    acks = sum(1 for l in lines if l.startswith("A ") and l.endswith(" 1"))
    started = any(l.startswith("M ") for l in lines)
    port = free_port()
    # The set knows its backing store as a block device (the guest's p1): a file in its place is
    # another store, and refused. A loop device over the file is the same kind of store.
    r = subprocess.run(["losetup", "--find", "--show", os.path.join(d, "backing.img")], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        print("powercut_replay: cannot attach the backing store to a loop device (root, and /dev/loop-control, "
              "are needed): %s" % r.stdout.strip())
        sys.exit(2)
    loop = r.stdout.strip()
    try:
        return recover(a, d, started, acks, port, loop)
    finally:
        subprocess.run(["losetup", "-d", loop])


def recover(a, d, started, acks, port, loop):
    cfg = conf(d, port, a.iqn, loop, a.parts[0][1] * SECTOR)
    dlog = open(os.path.join(d, "daemon.log"), "w")
    p = subprocess.Popen([a.daemon, "-c", cfg], stdout=dlog, stderr=subprocess.STDOUT)
    try:
        t0 = time.time()
        while True:
            if p.poll() is not None:
                return "the daemon did not come up (exit %d): see daemon.log" % p.returncode
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                pass
            if time.time() - t0 > 120:
                return "the daemon's portal did not open within 120 s"
            time.sleep(0.05)
        url = "iscsi://127.0.0.1:%d/%s/0" % (port, a.iqn)
        if started:
            r = subprocess.run([a.stamp_io, "verify", url, str(a.sectors), os.path.join(d, "writer.log")],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            with open(os.path.join(d, "verify.out"), "w") as f:
                f.write(r.stdout)
            if r.returncode != 0:
                return "stamp_io verify exited %d: %s" % (r.returncode, r.stdout.strip().splitlines()[-3:])
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(120)
            except subprocess.TimeoutExpired:
                with open(os.path.join(d, "stop-hang-stacks.txt"), "w") as f:
                    subprocess.run(["gdb", "-p", str(p.pid), "-batch", "-ex", "thread apply all bt"], stdout=f,
                                   stderr=subprocess.STDOUT)
                p.kill()
                p.wait()
                return "the daemon did not stop within 120 s (its threads: stop-hang-stacks.txt)"
        dlog.close()
    if p.returncode != 0:
        return "the daemon exited %d on a clean stop" % p.returncode
    r = subprocess.run([sys.executable, LEG_READ, "compare", os.path.join(d, "leg0.img"), os.path.join(d, "leg1.img"),
                        os.path.join(d, "backing.img"), "disk0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True)
    if r.returncode != 0:
        return "the legs differ after recovery and a clean stop: %s" % r.stdout.strip().splitlines()[:5]
    return None, acks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--log", required=True)
    ap.add_argument("--base", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--parts", required=True, help="START:SECTORS of backing, leg 0, leg 1, writer log")
    ap.add_argument("--cuts", type=int, default=16)
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--seed", type=int, default=20261201)
    ap.add_argument("--sectors", type=int, required=True)
    ap.add_argument("--daemon", required=True)
    ap.add_argument("--tierctl", required=True)
    ap.add_argument("--stamp-io", dest="stamp_io", required=True)
    ap.add_argument("--iqn", required=True)
    a = ap.parse_args()
    a.parts = [tuple(int(x) for x in p.split(":")) for p in a.parts.split(",")]
    if len(a.parts) != 4:
        ap.error("--parts takes four START:SECTORS")
    names = ["backing.img", "leg0.img", "leg1.img", "acklog.img"]
    ents = entries(a.log)
    writes = [i for i, e in enumerate(ents) if not e[2] & F_FLUSH and e[1]]
    if len(writes) < a.cuts * 4:
        print("powercut_replay: only %d writes in the log" % len(writes))
        return 2
    rng = random.Random(a.seed)
    # cut k: before entry cuts[k] of the log (the one torn); the last: the whole log. Half the cuts
    # fall just after a write to the writer's log partition: the moment an acknowledgement became
    # durable there, when data acknowledged early but not yet on a leg would be missed.
    p4lo, p4hi = a.parts[3][0], a.parts[3][0] + a.parts[3][1]
    ack_writes = [i + 1 for i in writes if p4lo <= ents[i][0] < p4hi and i + 1 < len(ents)]
    n_ack = min((a.cuts - 1) // 2, len(ack_writes))
    picked = set(rng.sample(ack_writes, n_ack))
    picked |= set(rng.sample([w for w in writes[1:] if w not in picked], a.cuts - 1 - n_ack))
    cuts = sorted(picked) + [len(ents)]
    print("log: %d entries (%d writes, %d flushes, %d discards); %d cut points (seed %d) x %d tears"
          % (len(ents), len(writes), sum(1 for e in ents if e[2] & F_FLUSH),
             sum(1 for e in ents if e[2] & F_DISCARD), len(cuts), a.seed, a.seeds))
    drive = Drive(a.base, a.log)
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    done = failed = 0
    acks_min, acks_max = None, 0
    t0 = time.time()
    for k, c in enumerate(cuts):
        while drive.applied < c:
            drive.apply(ents[drive.applied])
            drive.applied += 1
        secs = drive.sectors_of(ents[c]) if c < len(ents) else []
        for s in range(a.seeds if secs else 1):
            tseed = a.seed * 1000003 + c * 131 + s
            trng = random.Random(tseed)
            if s == 0:
                keep = []
            else:
                keep = [x for x in secs if trng.random() < 0.5]
            torn = {x: drive.sector_bytes(ents[c], x) for x in keep}
            tag = "cut %d/%d (entry %d of %d), tear seed %d (%d of %d sectors of the write at the cut)" % (
                k + 1, len(cuts), c, len(ents), tseed, len(keep), len(secs))
            d = os.path.join(a.work, "img")
            shutil.rmtree(d, ignore_errors=True)
            os.makedirs(d)
            write_parts(drive.img, a.parts, names, d, torn)
            res = check_image(a, d, tag)
            if isinstance(res, str):
                failed += 1
                keepdir = os.path.join(a.work, "failed-%d-%d" % (c, s))
                shutil.move(d, keepdir)
                print("FAIL: %s: %s (files in %s)" % (tag, res, keepdir))
                return 1
            _, acks = res
            if c == len(ents) and acks == 0:
                print("FAIL: the whole log's image holds no acknowledged write in the writer's log: nothing was "
                      "checked (is the writer's log on partition 4?)")
                return 1
            done += 1
            acks_min = acks if acks_min is None else min(acks_min, acks)
            acks_max = max(acks_max, acks)
        print("ok: cut %d/%d (entry %d of %d, a write of %d sectors): %d image(s) (tears 0 .. %d of its sectors) "
              "recovered, every acknowledged write read back twice, legs equal"
              % (k + 1, len(cuts), c, len(ents), len(secs), a.seeds if secs else 1, len(secs)))
    print("%d images recovered and verified (%d cut points, %d of them just after an acknowledgement reached the "
          "writer's log; up to %d tears each) in %.0f s; durable acknowledgements checked per image: %d .. %d"
          % (done, len(cuts), n_ack, a.seeds, time.time() - t0, acks_min or 0, acks_max))
    print("model: prefixes of the completion order of a write-through drive, the write at the cut torn; not "
          "modelled: a later in-flight write landing before an earlier one, a volatile cache and its flushes "
          "(the unit power-cut test covers those on our own submission log)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
