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

Over a 20 s window at rho = 0.8 one sample path's mean strays from the
M/D/1 value (the mean over all paths) by up to about 8%; `pick` takes a
path that does not, so a check against the formula tests the tool and not
the luck of the draw, and `path` gives the exact answer for the path run.
"""
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


def lindley(due, d_ns):
    free, total = 0, 0
    for a in due:
        free = max(a, free) + d_ns
        total += free - a
    return total / len(due) / 1e9


def md1(lam, d):
    rho = lam * d
    if rho >= 1:
        return float("inf")
    return d + rho * d / (2 * (1 - rho))


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
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
