#!/usr/bin/env python3
"""depth.py - the disk's queue over time, from perf's block tracepoints
(tests/bench/device.sh: what bounds the queued rows).

  depth.py fio-depth [--rw R|W] [--dev MAJ,MIN] OURS FIO N
        a depth to give fio's job (at depth N in FIO) for the disk to see
        nearer as many requests as it saw from OURS: N scaled by the ratio
        of the two means, down to a power of two (fio before 3.39 rounds
        io_uring's depth up to one), at most N
  depth.py report --row ROW --depth N --bs BS [--rw R|W] [--dev MAJ,MIN] PREFIX
        the report for ROW, whose runs are PREFIX.txt and PREFIX.tc.json
        (ours), PREFIX.fio.txt and PREFIX.fio.json (fio at depth N), and, if
        there, PREFIX.fio-at.txt and PREFIX.fio-at.json (fio at the depth
        fio-depth gave); figures in MB/s when BS is 64 KiB or more

A trace is `perf script` output of block:block_rq_issue and
block:block_rq_complete. The data requests of one direction count (reads,
R, the default; or writes, W), of any size, on the disk --dev names (all
disks without it): from the first one on, but in fio's traces from one
second after it (its ramp_time, and fio's own start). A request is matched
to its completion by disk and sector.
- perf drops an event now and then (a few per thousand here), so the mean
  number at the disk is Little's: the requests issued per second times the
  mean time of those matched to their completion.
- The share of the time with none at the disk comes from a sweep over the
  events, in which a request whose completion is missing stops counting
  after 10 ms; for writes, the part of it when the disk was flushing its
  cache with no write is printed too. The mean while the disk had any is
  the mean over the share of the time it had some.
- A request the driver put back (its queue was full) and sent again is one
  request, at the disk from its last issue; the share sent twice is printed.
- The two events of one request may come from two CPUs whose clocks differ
  by microseconds, so a completion can sort before its issue: a completion
  of no request in flight and the issue of that sector that follows within
  1 ms are one request, with no time of its own.
- Flushes: a disk without FUA (queue/fua 0, as the bench's) follows each
  durable write with a flush of its cache; it runs one flush at a time, and
  a flush serves every write that was done when it started. The flushes
  per write are printed for the write rows.
"""
import argparse
import json
import os
import re
import sys

EV = re.compile(r"\s(\d+\.\d+):\s+block:block_rq_(issue|complete):\s+(\d+,\d+)\s+(\S+)\s.*?\(\)\s+(\d+)\s+\+\s+(\d+)")
STALE = 0.01
SKEW = 0.001


def queue(path, skip=0.0, rw="R", dev=None):
    """What the disk had from one traced run: a dict (see the top of the file)."""
    events, flushes = [], []
    for line in open(path):
        m = EV.search(line)
        if not m or (dev and m.group(3) != dev):
            continue
        t, kind, flags, nsect = float(m.group(1)), m.group(2), m.group(4), int(m.group(6))
        if flags.startswith("F") and nsect == 0:
            # a flush of the disk's cache, alone (the kernel runs one at a time per disk)
            flushes.append((t, kind, (m.group(3), "flush"), 0))
        elif rw in flags and nsect:
            events.append((t, kind, (m.group(3), m.group(5)), nsect))
    events.sort()
    if events and skip:
        # from skip seconds on, and only requests issued from then on
        start = events[0][0] + skip
        seen = set()
        kept = []
        for e in events:
            if e[0] >= start and (e[1] == "issue" or e[2] in seen):
                seen.add(e[2])
                kept.append(e)
        events = kept
    if not events:
        raise SystemExit("depth.py: no block %s in %s" % ("read" if rw == "R" else "write", path))
    t_first, t_last = events[0][0], events[-1][0]
    window = (t_last - t_first) or 1e-9
    flushes = [f for f in flushes if t_first <= f[0] <= t_last]
    inflight, early = {}, {}
    idle_any = idle_data = 0.0  # time with nothing at the disk; with no data request (a flush alone, or nothing)
    issued = done = resent = nflush = 0
    service = 0.0
    sectors = 0
    last = t_first
    for t, kind, key, nsect in sorted(events + flushes):
        for k in [k for k, t0 in inflight.items() if t - t0 > STALE]:
            del inflight[k]
        if not inflight:
            idle_any += t - last
        if all(k[1] == "flush" for k in inflight):
            idle_data += t - last
        last = t
        flush = key[1] == "flush"
        if kind == "issue":
            if flush:
                nflush += 1
                inflight.setdefault(key, t)
            elif key in inflight:
                # put back by the driver and sent again: one request, at the disk from now
                resent += 1
                inflight[key] = t
            else:
                issued += 1
                sectors += nsect
                # a completion that sorted first (clock skew) leaves it a request with no time of its own
                if not (key in early and t - early.pop(key) < SKEW):
                    inflight[key] = t
        elif key in inflight:
            t0 = inflight.pop(key)
            if not flush:
                service += t - t0
                done += 1
        elif not flush:
            early[key] = t
    idle = idle_data / window
    avg = service / done if done else 0.0
    mean = issued / window * avg  # Little
    return dict(mean=mean, busy_mean=mean / (1 - idle) if idle < 1 else 0.0, idle=idle,
                flush_alone=(idle_data - idle_any) / window, each_us=1e6 * avg,
                rate=issued / window, mbps=sectors * 512 / window / 1e6, resent=resent / issued if issued else 0.0,
                flushes=nflush / issued if issued else 0.0)


def fio_rate(path, side):
    j = json.load(open(path))["jobs"][0][side]
    return j["iops"], j["bw_bytes"] / 1e6


def fio_depth(path):
    d = json.load(open(path))
    return d["jobs"][0]["job options"].get("iodepth") or d.get("global options", {}).get("iodepth", "?")


def report(row, depth, bs, rw, pre, dev):
    side = "read" if rw == "R" else "write"
    what = "reads" if rw == "R" else "writes"
    big = bs >= 65536
    run = json.load(open(pre + ".tc.json"))["runs"][0]
    runs = [("ours", (run["iops"], run["mb_per_s"]), queue(pre + ".txt", rw=rw, dev=dev)),
            ("fio at depth %d" % depth, fio_rate(pre + ".fio.json", side), queue(pre + ".fio.txt", 1.0, rw, dev))]
    if os.path.exists(pre + ".fio-at.json"):
        runs.append(("fio at depth %s" % fio_depth(pre + ".fio-at.json"), fio_rate(pre + ".fio-at.json", side),
                     queue(pre + ".fio-at.txt", 1.0, rw, dev)))
    if rw == "W":  # the write jobs have a job per leg file
        runs[1:] = [(n + " each", f, q) for n, f, q in runs[1:]]
    print("%s (traced; the initiator's queue depth %d; each side one run):" % (row, depth))
    for name, fig, q in runs:
        print("  %-23s %13s | at the disk: %5.1f %s on average, %5.1f while it had any; none %4.1f%% of the time%s;"
              " %5.0f us each; %s%s" % (name, "%.0f MB/s" % fig[1] if big else "%.0f IOPS" % fig[0], q["mean"], what,
                                        q["busy_mean"], 100 * q["idle"],
                                        " (a flush alone %.1f%%)" % (100 * q["flush_alone"]) if rw == "W" else "",
                                        q["each_us"], "%.0f MB/s" % q["mbps"] if big else "%.0f/s" % q["rate"],
                                        "; %.0f%% sent twice" % (100 * q["resent"]) if q["resent"] >= 0.005 else ""))
    qo = runs[0][2]
    if rw == "W":
        print("  (fio's figures are over both files at once; each write of ours goes to both)")
        if run["iops"]:
            print("  ours: %.2f writes at the disk per command (data on each leg, journal blocks, the cleaner's writes"
                  " to the backing file)" % (qo["rate"] / run["iops"]))
        # a disk without FUA (queue/fua 0) follows each durable write with a flush of its cache; it runs one
        # flush at a time, and a flush serves every write that was done when it started
        print("  flushes of the disk's cache per write: %s" % ", ".join("%s %.2f" % (n, q["flushes"]) for n, _, q in runs))
    # By Little's law the disk's rate in requests is its mean number over the time each takes; in bytes, times
    # the bytes each carries. The split of ours against the last fio run (the one at the depth scaled toward ours):
    ref = runs[-1]
    qr = ref[2]
    key = "mbps" if big else "rate"
    if qr[key] and qr["mean"] and runs[1][2][key] and qo["each_us"] and qo["rate"] and qr["rate"]:
        parts = [(qo["mean"] / qr["mean"], "how many there"), (qr["each_us"] / qo["each_us"], "how short each was")]
        if big:
            parts.append(((qo["mbps"] / qo["rate"]) / (qr["mbps"] / qr["rate"]), "bytes each"))
        split = "%.2f = %s" % (qo[key] / qr[key], " x ".join("%.2f (%s)" % p for p in parts))
        if len(runs) > 2:
            print("  the disk's rate under ours: %.2f of fio's at depth %d; against %s (%.1f at the disk on average,"
                  " ours %.1f): %s" % (qo[key] / runs[1][2][key], depth, ref[0], qr["mean"], qo["mean"], split))
        else:
            print("  the disk's rate under ours against fio's at depth %d: %s" % (depth, split))


def main(argv):
    ap = argparse.ArgumentParser(description="the disk's queue over time (see the top of the file)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fio-depth")
    f.add_argument("--rw", choices=("R", "W"), default="R")
    f.add_argument("--dev")
    f.add_argument("ours")
    f.add_argument("fio")
    f.add_argument("depth", type=int)
    r = sub.add_parser("report")
    r.add_argument("--row", required=True)
    r.add_argument("--depth", type=int, required=True)
    r.add_argument("--bs", type=int, required=True)
    r.add_argument("--rw", choices=("R", "W"), default="R")
    r.add_argument("--dev")
    r.add_argument("prefix")
    a = ap.parse_args(argv[1:])
    if a.cmd == "fio-depth":
        ours, fio = queue(a.ours, rw=a.rw, dev=a.dev)["mean"], queue(a.fio, 1.0, a.rw, a.dev)["mean"]
        want = max(1, min(a.depth, a.depth * ours / fio)) if fio else a.depth
        # down to a power of two: fio before 3.39 rounds io_uring's depth up to one
        print(1 << (int(want).bit_length() - 1))
    else:
        report(a.row, a.depth, a.bs, a.rw, a.prefix, a.dev)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
