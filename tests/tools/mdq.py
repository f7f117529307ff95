#!/usr/bin/env python3
"""mdq.py - the queueing answers tests/test_tierbench_rate.sh checks tierbench against.

tierbench --rate draws Poisson arrivals from its --seed; this file draws the
same ones (the same generator, step for step) so that a test knows, before
the run, when every command was due. With a fixed service time D:

  md1 LAMBDA D                  the M/D/1 mean time in system,
                                D + rho * D / (2 * (1 - rho)), rho = LAMBDA * D
  path SEED RATE SECONDS D      the arrivals of tierbench's first run with
                                --seed SEED --rate RATE -T SECONDS: their count,
                                and the mean time in system of one FIFO server
                                of service time D fed exactly those arrivals
                                (Lindley's recursion), in seconds
  pick RATE SECONDS D TOL [AFTER]
                                the first seed (AFTER+1..200) whose path mean
                                is within TOL (a fraction) of the M/D/1 answer
  log FILE RUN SEED RATE SECONDS QD
                                run RUN (0 = the first) of a tierbench
                                --io-log FILE, set beside the schedule of SEED
                                (SEED 0: fixed arrivals), as JSON: see
                                log_facts
  mechanics FACTS RESULT QD D FROM
                                what those facts (the output of log) must
                                show of a run whatever the machine's load,
                                beside tierbench's --json RESULT of the same
                                run: see mechanics; FROM is intended or issue

Over a 20 s window at rho = 0.8 one sample path's mean strays from the
M/D/1 value (the mean over all paths) by up to about 8%; `pick` takes a
path that does not, so a check against the formula tests the tool and not
the luck of the draw, and `path` gives the exact answer for the path run.
"""
import json
import math
import sys

M64 = (1 << 64) - 1


def mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def arrivals(seed, rate, seconds, run=1):
    """Due times (ns from the start) of tierbench's run number RUN (1 = its first)."""
    state = mix64(seed ^ (run << 40))
    mean = 1e9 / rate
    t, out = 0, []
    end = int(seconds * 1e9)
    while t < end:
        out.append(t)
        state = (state + 0x9E3779B97F4A7C15) & M64
        u = ((mix64(state) >> 11) + 1.0) / 9007199254740992.0
        t += int(-math.log(u) * mean)
    return out


def lindley(due, service_ns):
    """Mean time in system (s) of one FIFO server fed the due times (ns),
    each served for its own time in service_ns (a list), or all for the
    same time (a number)."""
    if not isinstance(service_ns, list):
        service_ns = [service_ns] * len(due)
    free, total = 0, 0
    for a, d in zip(due, service_ns):
        free = max(a, free) + d
        total += free - a
    return total / len(due) / 1e9


def md1(lam, d):
    rho = lam * d
    if rho >= 1:
        return float("inf")
    return d + rho * d / (2 * (1 - rho))


def read_log(path, run):
    """[(due, sent, done)] in ns of run RUN of a tierbench --io-log file."""
    out, cur = [], -1
    with open(path) as f:
        for line in f:
            if line.startswith("# run "):
                cur = int(line.split()[2])
                continue
            if cur == run:
                due, sent, done = (int(x) for x in line.split()[:3])
                out.append((due, sent, done))
    return out


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0


def cs2(xs):
    if not xs:
        return 0.0
    m = sum(xs) / len(xs)
    return sum(x * x for x in xs) / len(xs) / (m * m) - 1 if m else 0.0


def log_facts(path, run, seed, rate, secs, qd):
    """What a run's per-command log says, beside what the seed scheduled.

    schedule_err_ns   the largest |logged due - scheduled due| (the log in
                      due order: commands can complete out of order)
    early             commands sent before they were due (must be 0)
    overlap           -q 1 only: commands sent before the previous answer
                      came (must be 0: one at a time)
    lag_p50/p99_ns    -q 1: the send minus when it could first go, the later
                      of its due time and the previous answer
    wait_p50_ns       the median of send - due
    mean_latency      the mean of done - due, seconds
    service_*         done - sent: mean (s), squared coefficient of
                      variation cs2, median, p99.9
    lindley           the mean time in system of a FIFO server fed the
                      logged due times, each command served for its own
                      logged service time (the exact answer for what the
                      target did), seconds
    pk                the M/G/1 mean (Pollaczek-Khinchine) with the logged
                      service distribution: the M/D/1 answer when every
                      service takes the same time
    md1               the M/D/1 mean with the logged mean service time
    busy_gap_p50_ns   the median gap between answers that followed one
                      another while more commands were in flight (a server
                      taking one at a time: its service time), and
    busy_gap_cs2      the squared coefficient of variation of those gaps
    device_mg1        with more than one in flight, the queue is the
                      device's: its M/G/1 mean wait (Pollaczek-Khinchine)
                      for service times distributed as those gaps, plus
                      the mean time in system of a command that found no
                      answer due before its own (the server's time and
                      the path outside the queue), seconds: the M/D/1
                      answer when every service takes the same time
    """
    rows = sorted(read_log(path, run))
    n = len(rows)
    if not n:
        raise SystemExit("%s: run %d logged no command" % (path, run))
    # fixed arrivals: tierbench adds the same whole nanoseconds each time
    want = arrivals(seed, rate, secs) if seed else list(range(0, int(secs * 1e9), int(1e9 / rate)))
    err = max((abs(a - r[0]) for a, r in zip(want, rows)), default=0)
    early = sum(1 for d, s, _ in rows if s < d)
    overlap, lags, prev_done = 0, [], None
    if qd == 1:
        for d, s, e in sorted(rows, key=lambda r: r[1]):
            if prev_done is not None and s < prev_done:
                overlap += 1
            lags.append(s - max(d, prev_done or 0))
            prev_done = e
    svc = [e - s for _, s, e in rows]
    lat = [e - d for d, _, e in rows]
    es = sum(svc) / n / 1e9
    es2 = sum((x / 1e9) ** 2 for x in svc) / n
    lam = n / secs
    rho = lam * es
    by_done = sorted(rows, key=lambda r: r[2])
    gaps, alone = [], [by_done[0][2] - by_done[0][1]]
    for i in range(1, n):
        # more in flight at the previous answer than it: the server was busy
        prev = by_done[i - 1][2]
        if by_done[i][1] < prev:
            gaps.append(by_done[i][2] - prev)
        else:
            alone.append(by_done[i][2] - by_done[i][1])
    dev = float("nan")
    if gaps:
        ex = sum(gaps) / len(gaps) / 1e9
        ex2 = sum((g / 1e9) ** 2 for g in gaps) / len(gaps)
        t_alone = sum(alone) / len(alone) / 1e9
        dev = max(t_alone, ex) + (lam * ex2 / (2 * (1 - lam * ex)) if lam * ex < 1 else float("inf"))
    return {
        "n": n, "n_scheduled": len(want), "schedule_err_ns": err,
        "early": early, "overlap": overlap,
        "lag_p50_ns": pct(lags, 0.5), "lag_p99_ns": pct(lags, 0.99),
        "wait_p50_ns": pct([s - d for d, s, _ in rows], 0.5),
        "mean_latency": sum(lat) / n / 1e9,
        "service_mean": es, "service_cs2": cs2(svc),
        "service_p50": pct(svc, 0.5) / 1e9, "service_p999": pct(svc, 0.999) / 1e9,
        "lindley": lindley([d for d, _, _ in rows], svc),
        "pk": es + lam * es2 / (2 * (1 - rho)) if rho < 1 else float("inf"),
        "md1": md1(lam, es),
        "busy_gap_p50_ns": pct(gaps, 0.5), "busy_gaps": len(gaps),
        "busy_gap_cs2": cs2(gaps), "device_mg1": dev,
    }


def mechanics(f, r, qd, d, frm):
    """Problems with a run that no load on the machine explains: tierbench
    sent the arrivals the seed (or the fixed spacing) gives, none before it
    was due, with -q 1 none before the previous answer; the mean it reports
    is the log's done - due (from issue: done - send); the median send left
    within 200 us of when it could (-q 1); the median service is the leg's
    2 ms delay and at most the rest of the closed-loop D (-q 1)."""
    bad = []
    if f["n"] != r["ios"]:
        bad.append("the log has %d commands, the JSON %d" % (f["n"], r["ios"]))
    if abs(f["n"] - f["n_scheduled"]) > 1:
        bad.append("%d commands ran, the schedule has %d" % (f["n"], f["n_scheduled"]))
    if f["schedule_err_ns"] > 2000:
        bad.append("a command was due %d ns off its scheduled time" % f["schedule_err_ns"])
    if f["early"]:
        bad.append("%d commands were sent before they were due" % f["early"])
    if qd == 1 and f["overlap"]:
        bad.append("%d commands were sent before the previous answer (-q 1)" % f["overlap"])
    want = f["service_mean"] if frm == "issue" else f["mean_latency"]
    got = r["latency_us"]["avg"] / 1e6
    if abs(got / want - 1) > 0.002:
        bad.append("the reported mean %.6f s is not the log's %.6f s (latency from %s)"
                   % (got, want, frm))
    if qd == 1 and f["lag_p50_ns"] > 200000:
        bad.append("the median send left %d us after it could" % (f["lag_p50_ns"] // 1000))
    # with more in flight a service holds the wait in the device's queue:
    # there the busy gaps show the delay (the -q 8 check in the test)
    if qd == 1 and not 0.0019 <= f["service_p50"] <= 1.5 * d:
        bad.append("the median service %.6f s is not the 2 ms delay and the rest of D (%.6f s)"
                   % (f["service_p50"], d))
    return bad


def main(argv):
    if len(argv) == 3 and argv[0] == "md1":
        print("%.9f" % md1(float(argv[1]), float(argv[2])))
    elif len(argv) == 5 and argv[0] == "path":
        seed, rate, secs, d = int(argv[1]), float(argv[2]), float(argv[3]), float(argv[4])
        due = arrivals(seed, rate, secs)
        print(len(due), "%.9f" % lindley(due, d * 1e9))
    elif len(argv) in (5, 6) and argv[0] == "pick":
        rate, secs, d, tol = float(argv[1]), float(argv[2]), float(argv[3]), float(argv[4])
        after = int(argv[5]) if len(argv) == 6 else 0
        for seed in range(after + 1, 201):
            due = arrivals(seed, rate, secs)
            want = md1(len(due) / secs, d)
            if abs(lindley(due, d * 1e9) / want - 1) <= tol:
                print(seed)
                return 0
        print("no seed in 1..200 gives a typical path", file=sys.stderr)
        return 1
    elif len(argv) == 7 and argv[0] == "log":
        print(json.dumps(log_facts(argv[1], int(argv[2]), int(argv[3]), float(argv[4]),
                                   float(argv[5]), int(argv[6]))))
    elif len(argv) == 6 and argv[0] == "mechanics":
        bad = mechanics(json.load(open(argv[1])), json.load(open(argv[2]))["runs"][0],
                        int(argv[3]), float(argv[4]), argv[5])
        print("; ".join(bad))
        return 1 if bad else 0
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
