#!/usr/bin/env python3
"""depth.py - the device's queue over time, from perf's block tracepoints
(tests/bench/device.sh: what bounds the queued rows).

  depth.py fio-depth [--rw R|W] OURS FIO BS N
                            the depth to give fio's job (at N in FIO) for the
                            device to see as many requests as it saw from OURS
  depth.py report --row ROW --depth N --bs BS [--rw R|W] PREFIX
                            the report for ROW, whose runs are PREFIX.txt and
                            PREFIX.tc.json (ours), PREFIX.fio.txt and
                            PREFIX.fio.json (fio at depth N), PREFIX.fio-at.txt
                            and PREFIX.fio-at.json (fio at the depth ours kept)

A TRACE is `perf script` output of block:block_rq_issue and
block:block_rq_complete. Only reads (--rw R, the default) or writes (W)
of BS bytes count (not fio's own start, say), from the first one on, but
in fio's traces from one second after it (its ramp_time); a request is
matched to its completion by device and sector. perf drops an event now
and then (a few per thousand here), so the mean number at the device is
Little's: the requests issued per second times the mean time of those
matched to their completion. The share of the time with none at the
device comes from the sweep, in which a request whose completion is
missing stops counting after 10 ms. Flushes of the disk's cache (a disk
without FUA makes each durable write a write and a flush, and runs its
flushes one at a time) are counted per request, and in the sweep as busy
time. The two events of one request may come from two CPUs whose clocks
differ by microseconds, so a completion can sort before its issue: a
completion of no request in flight cancels the issue of that sector that
follows within 1 ms, and a reissued request (requeued by the driver) is
counted once.
"""
import argparse
import json
import re
import sys

EV = re.compile(r"\s(\d+\.\d+):\s+block:block_rq_(issue|complete):\s+(\d+,\d+)\s+(\S+)\s.*?\(\)\s+(\d+)\s+\+\s+(\d+)")
STALE = 0.01
SKEW = 0.001


def queue(path, bs, skip=0.0, rw="R"):
    """(mean number at the device, share of the time with none, number completed, mean time at the device in us,
    flushes issued per request issued)"""
    events = []
    flushes = []
    for line in open(path):
        m = EV.search(line)
        if m and rw in m.group(4) and int(m.group(6)) * 512 == bs:
            events.append((float(m.group(1)), m.group(2), (m.group(3), m.group(5))))
        elif m and m.group(4).startswith("F") and m.group(6) == "0":
            # a flush of the disk's cache, alone (the kernel runs one at a time per disk)
            flushes.append((float(m.group(1)), m.group(2), (m.group(3), "flush")))
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
        raise SystemExit("depth.py: no block %s of %d bytes in %s" % ("read" if rw == "R" else "write", bs, path))
    issued = sum(1 for e in events if e[1] == "issue")
    window = (events[-1][0] - events[0][0]) or 1e-9
    flushes = [f for f in flushes if events[0][0] <= f[0] <= events[-1][0]]
    nflush = sum(1 for f in flushes if f[1] == "issue")
    inflight = {}
    early = {}
    acc = {}
    done, service = 0, 0.0
    last = events[0][0]
    # the sweep counts flushes as busy time too; the mean and the time each are the requests' alone
    for t, kind, key in sorted(events + flushes):
        for k in [k for k, t0 in inflight.items() if t - t0 > STALE]:
            del inflight[k]
        n = len(inflight)
        acc[n] = acc.get(n, 0.0) + (t - last)
        last = t
        if kind == "issue":
            if key in early and t - early.pop(key) < SKEW:
                done += 1
                continue
            if key[1] == "flush" and key in inflight:
                continue
            inflight.setdefault(key, t)
        elif key in inflight:
            t0 = inflight.pop(key)
            if key[1] != "flush":
                service += t - t0
                done += 1
        elif key[1] != "flush":
            early[key] = t
    total = sum(acc.values()) or 1e-9
    avg = service / done if done else 0.0
    return issued / window * avg, acc.get(0, 0.0) / total, done, 1e6 * avg, nflush / issued if issued else 0.0


def fio_rate(path, side):
    j = json.load(open(path))["jobs"][0][side]
    return j["iops"], j["bw_bytes"] / 1e6


def report(row, depth, bs, rw, pre):
    side = "read" if rw == "R" else "write"
    what = "reads" if rw == "R" else "writes"
    run = json.load(open(pre + ".tc.json"))["runs"][0]
    ours = (run["iops"], run["mb_per_s"])
    fio, fio_at = fio_rate(pre + ".fio.json", side), fio_rate(pre + ".fio-at.json", side)
    qo, qf, qa = (queue(pre + ".txt", bs, rw=rw), queue(pre + ".fio.txt", bs, 1.0, rw),
                  queue(pre + ".fio-at.txt", bs, 1.0, rw))
    fa = json.load(open(pre + ".fio-at.json"))
    at = fa["jobs"][0]["job options"].get("iodepth") or fa.get("global options", {}).get("iodepth", "?")
    fig = (lambda r: "%.0f MB/s" % r[1]) if bs >= 65536 else (lambda r: "%.0f IOPS" % r[0])
    val = (lambda r: r[1]) if bs >= 65536 else (lambda r: r[0])
    # the device's rate by Little's law: the mean number there over the time each takes
    rate = lambda q: q[0] / (q[3] / 1e6) if q[3] else 0.0
    line = "  %-24s %12s   at the device: %5.1f %s on average, none %4.1f%% of the time, %6.0f us each, %6.0f/s"
    print("%s (traced; the initiator's queue depth %d):" % (row, depth))
    print(line % ("ours", fig(ours), qo[0], what, 100 * qo[1], qo[3], rate(qo)))
    print(line % ("fio at depth %d" % depth, fig(fio), qf[0], what, 100 * qf[1], qf[3], rate(qf)))
    print(line % ("fio at depth %s" % at, fig(fio_at), qa[0], what, 100 * qa[1], qa[3], rate(qa)))
    if rw == "W":
        print("  (fio's figures are over both files at once; each write of ours goes to both)")
    if rw == "W" and ours[0] and bs == 4096:  # (the journal's blocks are 4 KiB: counted only in a 4 KiB row)
        print("  ours: %.2f writes at the device per command (data on each leg, a share of a journal block, the cleaner's"
              " writes to the backing file)" % (rate(qo) / ours[0]))
    if rw == "W":
        # a disk without FUA (queue/fua 0) makes each durable write a write and a flush of its cache, and
        # runs its flushes one at a time: a flush covers the writes that were done when it started
        print("  flushes of the disk's cache per write: ours %.2f, fio at depth %d %.2f, at depth %s %.2f"
              % (qo[4], depth, qf[4], at, qa[4]))
    if rate(qa) and rate(qf):
        print("  the device's rate under ours is %.2f of fio's at depth %d and %.2f of fio's with as many %s there on"
              " average: it was idle %.0f%% of the time under ours against %.0f%%, and each took %.0f us there"
              " against %.0f us" % (rate(qo) / rate(qf), depth, rate(qo) / rate(qa), what, 100 * qo[1],
                                    100 * qa[1], qo[3], qa[3]))


def main(argv):
    ap = argparse.ArgumentParser(description="the device's queue over time (see the top of the file)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fio-depth")
    f.add_argument("--rw", choices=("R", "W"), default="R")
    f.add_argument("ours")
    f.add_argument("fio")
    f.add_argument("bs", type=int)
    f.add_argument("depth", type=int)
    r = sub.add_parser("report")
    r.add_argument("--row", required=True)
    r.add_argument("--depth", type=int, required=True)
    r.add_argument("--bs", type=int, required=True)
    r.add_argument("--rw", choices=("R", "W"), default="R")
    r.add_argument("prefix")
    a = ap.parse_args(argv[1:])
    if a.cmd == "fio-depth":
        ours, fio = queue(a.ours, a.bs, rw=a.rw)[0], queue(a.fio, a.bs, 1.0, a.rw)[0]
        print(max(1, min(a.depth, round(a.depth * ours / fio))) if fio else a.depth)
    else:
        report(a.row, a.depth, a.bs, a.rw, a.prefix)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
