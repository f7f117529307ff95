#!/usr/bin/env python3
"""depth.py - the device's queue over time, from perf's block tracepoints
(tests/bench/device.sh: what bounds the queued read rows).

  depth.py --fio-depth OURS FIO BS N
                            the depth to give fio's job (at N in FIO) for the
                            device to see as many reads as it saw from OURS
  depth.py --row ROW --depth N --bs BS PREFIX
                            the report for ROW, whose runs are PREFIX.txt and
                            PREFIX.tc.json (ours), PREFIX.fio.txt and
                            PREFIX.fio.json (fio at depth N), PREFIX.fio-at.txt
                            and PREFIX.fio-at.json (fio at the depth ours kept)

A TRACE is `perf script` output of block:block_rq_issue and
block:block_rq_complete. Only reads of BS bytes count (not fio's own
start, say), from the first one on, but in fio's traces from one second
after it (its ramp_time); a read is matched to its completion by device
and sector. perf drops an event now and then (a few per thousand here),
so the mean number at the device is Little's: the reads issued per second
times the mean time of those matched to their completion. The share of
the time with none at the device comes from the sweep, in which a read
whose completion is missing stops counting after 10 ms.
The two events of one read may come from two CPUs whose clocks differ by
microseconds, so a completion can sort before its issue: a completion of
no read in flight cancels the issue of that sector that follows within
1 ms, and a reissued read (requeued by the driver) is counted once.
"""
import json
import re
import sys

EV = re.compile(r"\s(\d+\.\d+):\s+block:block_rq_(issue|complete):\s+(\d+,\d+)\s+(\S+)\s.*?\(\)\s+(\d+)\s+\+\s+(\d+)")
STALE = 0.01
SKEW = 0.001


def queue(path, bs, skip=0.0):
    """(time-weighted mean in flight, share of the time with none, reads completed, avg time at the device in us)"""
    events = []
    for line in open(path):
        m = EV.search(line)
        if m and "R" in m.group(4) and int(m.group(6)) * 512 == bs:
            events.append((float(m.group(1)), m.group(2), (m.group(3), m.group(5))))
    events.sort()
    if events and skip:
        # from skip seconds on, and only reads issued from then on
        start = events[0][0] + skip
        seen = set()
        kept = []
        for e in events:
            if e[0] >= start and (e[1] == "issue" or e[2] in seen):
                seen.add(e[2])
                kept.append(e)
        events = kept
    if not events:
        raise SystemExit("depth.py: no block read of %d bytes in %s" % (bs, path))
    inflight = {}
    early = {}
    acc = {}
    done, service = 0, 0.0
    last = events[0][0]
    for t, kind, key in events:
        for k in [k for k, t0 in inflight.items() if t - t0 > STALE]:
            del inflight[k]
        n = len(inflight)
        acc[n] = acc.get(n, 0.0) + (t - last)
        last = t
        if kind == "issue":
            if key in early and t - early.pop(key) < SKEW:
                done += 1
                continue
            inflight.setdefault(key, t)
        elif key in inflight:
            service += t - inflight.pop(key)
            done += 1
        else:
            early[key] = t
    total = sum(acc.values()) or 1e-9
    issued = sum(1 for e in events if e[1] == "issue")
    avg = service / done if done else 0.0
    window = (events[-1][0] - events[0][0]) or 1e-9
    return issued / window * avg, acc.get(0, 0.0) / total, done, 1e6 * avg


def fio_rate(path):
    j = json.load(open(path))["jobs"][0]["read"]
    return j["iops"], j["bw_bytes"] / 1e6


def main(argv):
    if len(argv) == 6 and argv[1] == "--fio-depth":
        bs, n = int(argv[4]), int(argv[5])
        ours, fio = queue(argv[2], bs)[0], queue(argv[3], bs, 1.0)[0]
        print(max(1, min(n, round(n * ours / fio))) if fio else n)
        return 0
    if len(argv) != 8 or argv[1] != "--row" or argv[3] != "--depth" or argv[5] != "--bs":
        print(__doc__, file=sys.stderr)
        return 2
    row, depth, bs, pre = argv[2], int(argv[4]), int(argv[6]), argv[7]
    run = json.load(open(pre + ".tc.json"))["runs"][0]
    ours = (run["iops"], run["mb_per_s"])
    fio, fio_at = fio_rate(pre + ".fio.json"), fio_rate(pre + ".fio-at.json")
    big = row.endswith("128k")
    fig = (lambda r: "%.0f MB/s" % r[1]) if big else (lambda r: "%.0f IOPS" % r[0])
    val = (lambda r: r[1]) if big else (lambda r: r[0])
    qo, qf, qa = queue(pre + ".txt", bs), queue(pre + ".fio.txt", bs, 1.0), queue(pre + ".fio-at.txt", bs, 1.0)
    seen = json.load(open(pre + ".fio-at.json"))["jobs"][0]["job options"].get("iodepth", "?")
    line = "  %-24s %12s   at the device: %5.1f reads on average, none %4.1f%% of the time, %6.0f us each"
    print("%s (traced; the initiator's queue depth %d):" % (row, depth))
    print(line % ("ours", fig(ours), qo[0], 100 * qo[1], qo[3]))
    print(line % ("fio at depth %d" % depth, fig(fio), qf[0], 100 * qf[1], qf[3]))
    print(line % ("fio at depth %s" % seen, fig(fio_at), qa[0], 100 * qa[1], qa[3]))
    if val(fio) and val(fio_at):
        # Little: rate = mean at the device / time each; ours loses on both factors
        print("  ours is %.2f of fio at depth %d and %.2f of fio with as many reads at the device on average (%.2f of"
              " its figure at depth %d): the device was idle %.0f%% of the time under ours against %.0f%%, each read"
              " took %.0f us there against %.0f us" % (val(ours) / val(fio), depth, val(ours) / val(fio_at),
                                                    val(fio_at) / val(fio), depth, 100 * qo[1], 100 * qa[1], qo[3], qa[3]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
