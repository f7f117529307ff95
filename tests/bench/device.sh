#!/usr/bin/env bash
# tests/bench/device.sh - the cache path against fio on the same leg files
# (make bench-device).
#
# The legs are two files on one disk, a 256 MiB write-back LUN of 512-byte
# blocks is cached on them entirely, and one iSCSI session (tierbench)
# drives each path. The limit is fio (io_uring, O_DIRECT) with the job
# files of tests/bench/fio/, kept fixed, on a region of the same two files
# past what the cache set uses. A second LUN, a page-cached file without a
# cache (backing_io = buffered), gives the iSCSI layer's own QD1 round trip
# and, under the 4K QD32 and 128K read rows, what the iSCSI path and the
# client carry with no device at all: where that ceiling is below 85% of
# fio, no cache behind this transport can reach the goal.
# The daemon runs on CPU 0 with one worker, tierbench on CPU 1, fio alone
# on CPU 0; fio and the daemon path of a row run one after the other, and
# the whole set of rows TB_ROUNDS times.
#
# Per row it prints fio's figure, ours, the ratio, the goal of issue 13 and
# whether the round met it, the latency (avg / p50 / p99 / p99.9), what each
# command sent to the legs (status: legs[].io; for write-back also the share
# of writes whose journal record went with their data, 1T, and of those over
# dirty blocks that needed none, 0R), the CPU per command (the
# daemon's from /proc, fio's from its usr+sys) and the client's share of
# its CPU (tierbench's client_cpu_pct: a client near 100% bounds the row).
# It is a benchmark: it asserts nothing about speed, and exits non-zero
# only when a run failed. After the table: where the QD1 rows' time goes,
# the write-back QD1 floor of the legs alone, and the device's queue under
# the queued rows (each below, where it runs).
#
#   bash tests/bench/device.sh                 3 rounds of 10 s rows (about 17 minutes in all)
#   TB_SECS=3 TB_ROUNDS=1 bash tests/bench/device.sh   a quick look
# Knobs: TB_SECS, TB_ROUNDS, TB_DIR (where the leg files go, default a
# folder under /var/tmp: a disk, not tmpfs), TB_OUT (keep the JSON there),
# TB_PRESSURE=0 (skip the 8K 70/30 sweep over an emulated HDD; it needs
# root), TB_MEM=0 (skip the memory row at the end), TB_ROWS="wb-qd1 wb-qd32"
# (only these rows of the table: rh-qd32 rh-qd1 rh-128k wb-qd1 wb-qd32 wb-128k),
# TB_POLL_US=N (the daemons' [daemon] poll_us, default 0: they sleep at once),
# TB_TRACE=0 (skip the traced parts after the table: the QD1 breakdown and
# the device's queue under the queued rows).
. "$(dirname "$0")/../lib.sh"
cd "$TC_ROOT" || exit 2
tc_tmpdir
command -v fio >/dev/null || { echo "bench-device: fio is not installed (make deps)" >&2; exit 2; }
command -v taskset >/dev/null || { echo "bench-device: taskset is missing (util-linux)" >&2; exit 2; }
TB=$TC_ROOT/build/tierbench
CTL=$TC_ROOT/build/tierctl
[ -x "$TB" ] && [ -x "$TC_BIN" ] && [ -x "$CTL" ] || { echo "bench-device: run make first" >&2; exit 2; }
mkdir -p "$T/bin"
cp "$TB" "$TC_BIN" "$CTL" "$T/bin/" || exit 2
TB=$T/bin/tierbench TC_BIN=$T/bin/tiercached CTL=$T/bin/tierctl

SECS=${TB_SECS:-10}
POLL_US=${TB_POLL_US:-0} # [daemon] poll_us of the daemons measured
ROUNDS=${TB_ROUNDS:-3}
D=${TB_DIR:-$(mktemp -d /var/tmp/tc-bench-device.XXXXXX)}
mkdir -p "$D"
[ -z "${TB_DIR:-}" ] && trap '_tc_cleanup; rm -rf "$D"' EXIT
OUT=${TB_OUT:-$T/results}
mkdir -p "$OUT"
CPU_TARGET=0 CPU_CLIENT=1
[ "$(nproc)" -ge 2 ] || CPU_CLIENT=0

# leg files of 512 MiB; the set uses their first 320 MiB, fio the last 128 MiB
export TB_LEG0=$D/leg0.img TB_LEG1=$D/leg1.img TB_FIO_SECS=$SECS TB_FIO_OFF=384M TB_FIO_SIZE=128M
for f in "$TB_LEG0" "$TB_LEG1"; do
	fallocate -l 512M "$f" 2>/dev/null || truncate -s 512M "$f"
	# written once, so neither fio nor the daemon meets unwritten extents
	dd if=/dev/zero of="$f" bs=4M count=128 oflag=direct conv=notrunc status=none
done
truncate -s 256M "$D/backing.img"
head -c 64M /dev/urandom >"$D/pc.img"

port=$(tc_free_port)
IQN=iqn.2026-11.io.tiercache:bench-device
# daemon_head NAME PORT: the [daemon], [portal] and [target] head of a config
daemon_head() {
	cat <<CONF
[daemon]
state_dir = $T/$1-state
control_socket = $T/$1-state/control.sock
log_level = info
workers = 1
poll_us = $POLL_US

[portal]
listen = 127.0.0.1:$2

[target $IQN]
CONF
}
{ daemon_head main "$port"; cat <<CONF
lun0 = hot
lun1 = pc

[lun hot]
backing = $D/backing.img
size = 256M
block_size = 512
cache = fast

; a page-cached file without a cache: the iSCSI layer's own round trip
[lun pc]
backing = $D/pc.img
size = 64M
block_size = 512
backing_io = buffered

[cache fast]
legs = $TB_LEG0 $TB_LEG1
size = 320M
mode = write-back
seq_cutoff = 0
admit_hits = 1
CONF
} >"$T/t.conf"
# start_pinned CONF PORT [PREFIX...]: tc_start on the target's CPU, under
# PREFIX (a command that execs the rest; so does taskset: TC_PID is the daemon's)
start_pinned() {
	local conf=$1 port=$2
	shift 2
	"$@" taskset -c "$CPU_TARGET" "$TC_BIN" -c "$conf" >>"$T/daemon.log" 2>&1 &
	TC_PID=$!
	tc_wait_port "$port" 60 || { echo "bench-device: the daemon of $conf did not start" >&2; tail "$T/daemon.log" >&2; exit 2; }
}
# one_lun_conf NAME PORT BACKING LUN-SIZE CACHE-SIZE [CACHE-LINE...]: a daemon
# with one write-back LUN on legs $D/NAME-leg0.img and $D/NAME-leg1.img
one_lun_conf() {
	local name=$1 p=$2 backing=$3 size=$4 csize=$5
	shift 5
	daemon_head "$name" "$p"
	cat <<CONF
lun0 = $name

[lun $name]
backing = $backing
size = $size
block_size = 512
cache = fast

[cache fast]
legs = $D/$name-leg0.img $D/$name-leg1.img
size = $csize
mode = write-back
CONF
	printf '%s\n' "$@"
}
start_pinned "$T/t.conf" "$port"
URL=iscsi://127.0.0.1:$port/$IQN

ctl() { "$CTL" -c "$T/t.conf" "$@"; }
tb() { taskset -c "$CPU_CLIENT" "$TB" --json --no-progress --io-timeout 60 "$@"; }

echo "== filling the cache: the whole 256 MiB LUN written once, then destaged"
tb -b 1M --seq -r 0 -t 1 -q 4 -n 256 "$URL/0" >"$OUT/fill.json" || { echo "bench-device: fill failed" >&2; exit 1; }
ctl flush --wait >/dev/null 2>&1 || { echo "bench-device: flush --wait failed" >&2; exit 1; }
cat "$D/pc.img" >/dev/null # the page-cache LUN in the page cache

# the daemon's CPU seconds so far
cpu_s() { awk -v hz="$(getconf CLK_TCK)" '{ print ($14 + $15) / hz }' "/proc/$TC_PID/stat"; }
snap() { ctl --json status; }

# perf can trace io_uring's submissions and completions (the QD1 breakdown)
want_trace() {
	local ev
	ev=$(perf list 2>/dev/null)
	command -v perf >/dev/null && grep -q "io_uring:io_uring_complete" <<<"$ev" &&
		grep -q "io_uring:io_uring_submit_req" <<<"$ev" ||
		{ echo "== where the QD1 time goes: n/a (perf with io_uring's tracepoints is not here)"; return 1; }
}
# is ROW one of TB_ROWS (all when unset)? Page-cache rows (pc-*) run when
# called: pc-qd1 always, the others beside the read row they bound.
want() { [ -z "${TB_ROWS:-}" ] || [[ $1 == pc-* ]] || [[ " $TB_ROWS " == *" $1 "* ]]; }
# daemon ROW LUN TIERBENCH-ARGS...: one run through the daemon -> $OUT/ROW.rN.tc.json (+ status before/after)
daemon() {
	local row=$1 lun=$2
	want "$row" || return 0
	shift 2
	snap >"$OUT/$row.r$R.before.json"
	echo "$(cpu_s)" >"$OUT/$row.r$R.cpu0"
	tb -T "$SECS" "$@" "$URL/$lun" >"$OUT/$row.r$R.tc.json" || { echo "bench-device: tierbench $row failed" >&2; errors=$((errors + 1)); }
	echo "$(cpu_s)" >"$OUT/$row.r$R.cpu1"
	snap >"$OUT/$row.r$R.after.json"
}
# fio_run ROW JOB: fio alone on the target's CPU -> $OUT/ROW.rN.fio.json
fio_run() {
	want "$1" || return 0
	taskset -c "$CPU_TARGET" fio --output-format=json "tests/bench/fio/$2.fio" >"$OUT/$1.r$R.fio.json" 2>"$OUT/$1.r$R.fio.err" ||
		{ echo "bench-device: fio $2 failed: $(head -3 "$OUT/$1.r$R.fio.err")" >&2; errors=$((errors + 1)); }
}

errors=0
echo "== the daemon: one worker on CPU $CPU_TARGET, poll_us = $POLL_US"
for ((R = 1; R <= ROUNDS; R++)); do
	echo "== round $R of $ROUNDS"
	daemon pc-qd1 1 -b 4k --rand -r 100 -t 1 -q 1
	fio_run rh-qd32 randread-4k-qd32
	daemon rh-qd32 0 -b 4k --rand -r 100 -t 1 -q 32
	want rh-qd32 && daemon pc-qd32 1 -b 4k --rand -r 100 -t 1 -q 32
	fio_run rh-qd1 randread-4k-qd1
	daemon rh-qd1 0 -b 4k --rand -r 100 -t 1 -q 1
	fio_run rh-128k seqread-128k
	daemon rh-128k 0 -b 128k --seq -r 100 -t 1 -q 8
	want rh-128k && daemon pc-128k 1 -b 128k --seq -r 100 -t 1 -q 8
	fio_run wb-qd1 randwrite-4k-dsync-qd1
	daemon wb-qd1 0 -b 4k --rand -r 0 -t 1 -q 1
	fio_run wb-qd32 randwrite-4k-dsync-both
	daemon wb-qd32 0 -b 4k --rand -r 0 -t 1 -q 32
	fio_run wb-128k seqwrite-128k-dsync-both
	daemon wb-128k 0 -b 128k --seq -r 0 -t 1 -q 8
done

python3 - "$OUT" "$ROUNDS" "$SECS" <<'PY'
import json, sys, os
out, rounds, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
def load(p):
    with open(p) as f:
        return json.load(f)
def fio(row, r):
    d = load(f"{out}/{row}.r{r}.fio.json")
    j = d["jobs"][0]
    side = j["write"] if j["write"]["io_bytes"] > j["read"]["io_bytes"] else j["read"]
    ios = side["total_ios"]
    run_s = j["job_runtime"] / 1000.0 if j.get("job_runtime") else secs
    pct = side["clat_ns"].get("percentile", {})
    p = lambda q: pct.get(q, 0) / 1000.0
    # group_reporting sums the jobs; usr/sys are a share of one CPU over the run
    cpu_s = (j["usr_cpu"] + j["sys_cpu"]) / 100.0 * run_s
    return dict(iops=side["iops"], mbps=side["bw_bytes"] / 1e6, avg=side["clat_ns"]["mean"] / 1000.0,
                p50=p("50.000000"), p99=p("99.000000"), p999=p("99.900000"),
                cpu_us=1e6 * cpu_s / ios if ios else 0)
def legs_delta(row, r):
    b = load(f"{out}/{row}.r{r}.before.json")["caches"][0]
    a = load(f"{out}/{row}.r{r}.after.json")["caches"][0]
    d = {k: sum(la["io"][k] - lb["io"][k] for la, lb in zip(a["legs"], b["legs"])) for k in ("reads", "writes", "fua_writes", "flushes")}
    # write-back pieces sent with their record (one trip) and with none (over dirty blocks)
    for k in ("write_one_trip", "write_no_record", "write_hits", "write_misses"):
        d[k] = a.get(k, 0) - b.get(k, 0)
    return d
def ours(row, r, counts=True):
    d = load(f"{out}/{row}.r{r}.tc.json")["runs"][0]
    lat = d["latency_us"]
    c0 = float(open(f"{out}/{row}.r{r}.cpu0").read()); c1 = float(open(f"{out}/{row}.r{r}.cpu1").read())
    res = dict(iops=d["iops"], mbps=d["mb_per_s"], avg=lat["avg"], p50=lat["p50"], p99=lat["p99"], p999=lat["p99_9"],
               ios=d["ios"], cpu_us=1e6 * (c1 - c0) / d["ios"] if d["ios"] else 0, client=d.get("client_cpu_pct", 0))
    if counts:
        res["legs"] = legs_delta(row, r)
    return res
rows = [
    # row, title, figure, goal(fio, ours, pc) -> (bar, met)
    ("rh-qd32", "read hit 4K QD32 (IOPS)", "iops", lambda f, o, pc: (0.85 * f["iops"], o["iops"] >= 0.85 * f["iops"]), ">= 85% of fio"),
    ("rh-qd1", "read hit 4K QD1 (avg us)", "avg", lambda f, o, pc: (f["avg"] + pc["avg"] + 10, o["avg"] <= f["avg"] + pc["avg"] + 10), "<= fio + page-cache RTT + 10 us"),
    ("rh-128k", "read hit 128K seq (MB/s)", "mbps", lambda f, o, pc: (0.85 * f["mbps"], o["mbps"] >= 0.85 * f["mbps"]), ">= 85% of fio"),
    ("wb-qd1", "write-back 4K QD1 (avg us)", "avg", lambda f, o, pc: (1.3 * f["avg"], o["avg"] <= 1.3 * f["avg"]), "<= 1.3x one dsync write"),
    ("wb-qd32", "write-back 4K QD32 (IOPS)", "iops", lambda f, o, pc: (0.8 * f["iops"] / 2, o["iops"] >= 0.8 * f["iops"] / 2 and o["p999"] <= 3 * f["p999"]), ">= 80% of mirrored, p99.9 <= 3x"),
    ("wb-128k", "write-back 128K seq (MB/s)", "mbps", lambda f, o, pc: (0.8 * f["mbps"] / 2, o["mbps"] >= 0.8 * f["mbps"] / 2), ">= 80% of mirrored"),
]
print()
print("%-27s %5s %10s %10s %6s %10s %4s  %-31s %-31s %-38s %s" % ("path", "round", "fio", "tiercached", "ratio", "goal", "met",
      "ours avg/p50/p99/p99.9 us", "fio avg/p50/p99/p99.9 us", "legs per command", "CPU us/cmd: ours fio pc; client %"))
summary = {}
for r in range(1, rounds + 1):
    pc = ours("pc-qd1", r, counts=False)
    for row, title, fig, goal, goaltext in rows:
        if not os.path.exists(f"{out}/{row}.r{r}.tc.json"):
            continue # not in TB_ROWS
        f, o = fio(row, r), ours(row, r)
        ref = f[fig] / 2 if row in ("wb-qd32", "wb-128k") else f[fig]
        bar, met = goal(f, o, pc)
        ratio = o[fig] / ref if ref else 0
        n = o["ios"] or 1
        lg = o["legs"]
        if row.startswith("wb"):
            pieces = (lg["write_hits"] + lg["write_misses"]) or 1
            per = "W %.2f FUA %.2f F %.2f; 1T %.0f%% 0R %.0f%%" % (lg["writes"] / n, lg["fua_writes"] / n, lg["flushes"] / n,
                                                     100.0 * lg["write_one_trip"] / pieces, 100.0 * lg["write_no_record"] / pieces)
        else:
            per = "R %.2f W %.2f" % (lg["reads"] / n, lg["writes"] / n)
        print("%-27s %5d %10.1f %10.1f %6.2f %10.1f %4s  %-31s %-31s %-38s %.1f %.1f %.1f; %.0f%%" % (
            title, r, ref, o[fig], ratio, bar, "yes" if met else "NO",
            "%.0f/%.0f/%.0f/%.0f" % (o["avg"], o["p50"], o["p99"], o["p999"]),
            "%.0f/%.0f/%.0f/%.0f" % (f["avg"], f["p50"], f["p99"], f["p999"]),
            per, o["cpu_us"], f["cpu_us"], pc["cpu_us"], o["client"]))
        summary.setdefault(title, []).append(met)
        # the same load on the page-cache LUN: what the iSCSI path and the
        # client carry with no device behind them, a ceiling for the read rows
        pcrow = {"rh-qd32": "pc-qd32", "rh-128k": "pc-128k"}.get(row)
        if pcrow and os.path.exists(f"{out}/{pcrow}.r{r}.tc.json"):
            q = ours(pcrow, r, counts=False)
            print("%-27s %5d %10s %10.1f %6.2f   (page-cache LUN, same load: the path with no device, its ratio to fio)" % (
                "  page-cache, same load", r, "", q[fig], q[fig] / ref if ref else 0))
    print("%-27s %5d %10s %10.1f   (page-cache LUN, 4K QD1 avg us: the iSCSI round trip)" % ("page-cache read 4K QD1", r, "", pc["avg"]))
print()
print("(fio for the write-back rows: half of its total over both files, the mirrored limit)")
for title, mets in summary.items():
    print("%-27s met the goal in %d of %d rounds" % (title, sum(mets), len(mets)))
PY
[ $? = 0 ] || errors=$((errors + 1))

# Where the QD1 time goes: every leg operation's time from its submission
# to its completion (io_uring's submit_req and complete tracepoints, with
# perf; the completion is posted in the worker's context, so this includes
# its wakeup, as fio's does), ours during a QD1 run through the daemon
# beside fio's during its QD1 job, and the command's own average split in
# two: the time the legs had an operation of ours in flight, per command
# (the run's rate times the traced window), and what is left for the
# iSCSI round trip and the engine. Each traced run starts after a flush,
# so no destage of the rows before is in it; the cleaner's own destages
# during a write-back run (reads of the legs, writes of the backing file:
# the tracepoints do not name the file) are counted as ours, a few per
# hundred commands. The rate is the whole run's, the window a part of it,
# so the share per command is an estimate within a few per cent. Traced
# runs are slower than the table's (a few microseconds per operation,
# fio's alike); they run after the table, and TB_TRACE=0 skips them.
TS=$((SECS < 4 ? 4 : SECS))
# every dirty block destaged: no destage of a run before in the next one
settle() { ctl flush --wait >/dev/null 2>&1 || { echo "bench-device: flush --wait failed" >&2; errors=$((errors + 1)); }; }
# traced_fio OUT-BASE JOB-FILE "PERF-ARGS" ERR-FILE: fio's job on the
# target's CPU under perf -> OUT-BASE.{json,perf}; non-zero if either failed
traced_fio() {
	# shellcheck disable=SC2086 # the perf arguments are words
	TB_FIO_SECS=$TS perf record -q $3 -o "$1.perf" -- taskset -c "$CPU_TARGET" fio --output-format=json "$2" \
		>"$1.json" 2>>"$4"
}
# traced_pair ROW TAG FIO-JOB "OURS-PERF-ARGS" "FIO-PERF-ARGS" TIERBENCH-ARGS...:
# a traced run through the daemon (perf from its second second, for TS - 2
# seconds), then fio's job traced whole -> $OUT/ROW.TAG.{tc.json,txt} and
# $OUT/ROW.TAG.fio.{json,txt}; non-zero, with the error counted once, when
# a run failed (what would read its output is skipped)
traced_pair() {
	local row=$1 tag=$2 job=$3 ours=$4 theirs=$5
	shift 5
	settle # (nor a checkpoint or fill of the rows before)
	tb -T "$TS" "$@" "$URL/0" >"$OUT/$row.$tag.tc.json" &
	local tbpid=$! perf_failed=0
	sleep 1
	# shellcheck disable=SC2086 # the perf arguments are words
	perf record -q $ours -o "$OUT/$row.$tag.perf" -- sleep $((TS - 2)) >/dev/null 2>"$OUT/$row.$tag.err" ||
		perf_failed=1
	if ! wait $tbpid; then
		echo "$row: the traced tierbench run failed"
		errors=$((errors + 1))
		return 1
	fi
	settle # (our run's writes, not during fio's)
	traced_fio "$OUT/$row.$tag.fio" "tests/bench/fio/$job.fio" "$theirs" "$OUT/$row.$tag.err" || perf_failed=1
	if [ $perf_failed != 0 ]; then
		echo "$row: the traced runs failed: $(head -2 "$OUT/$row.$tag.err")"
		errors=$((errors + 1))
		return 1
	fi
	perf script -i "$OUT/$row.$tag.perf" >"$OUT/$row.$tag.txt" 2>/dev/null
	perf script -i "$OUT/$row.$tag.fio.perf" >"$OUT/$row.$tag.fio.txt" 2>/dev/null
}
if [ "${TB_TRACE:-1}" = 1 ] && { want rh-qd1 || want wb-qd1; } && want_trace; then
	echo "== where the QD1 time goes: each leg operation from submission to completion (io_uring tracepoints)"
	trace_row() { # ROW FIO-JOB TIERBENCH-ARGS...
		local row=$1 job=$2 ev=io_uring:io_uring_submit_req,io_uring:io_uring_complete
		shift 2
		want "$row" || return 0
		traced_pair "$row" trace "$job" "-e $ev -p $TC_PID" "-e $ev" "$@" || return 0
		python3 - "$OUT" "$row" <<'PY' || errors=$((errors + 1))
import json, re, sys
out, row = sys.argv[1], sys.argv[2]
EV = re.compile(r"\s(\d+\.\d+):\s+io_uring:(io_uring_submit_req|io_uring_complete):.*?user_data (0x[0-9a-f]+)")
def legops(path):
    sub, lat, spans = {}, {}, []
    for line in open(path):
        m = EV.search(line)
        if not m:
            continue
        t, ev, ud = float(m.group(1)), m.group(2), m.group(3)
        if ev == "io_uring_submit_req":
            op = re.search(r"opcode (\w+)", line)
            sub[ud] = (t, op.group(1) if op else "?")
        elif ud in sub:
            t0, op = sub.pop(ud)
            if op.startswith(("READ", "WRITE")):  # not the sockets' polls
                lat.setdefault(op.rstrip("V"), []).append((t - t0) * 1e6)
                spans.append((t0, t))
    # at QD1 a command's leg operations overlap one another and no other
    # command's: the length of their union is the legs' share of the commands
    busy, end = 0.0, float("-inf")
    for t0, t1 in sorted(spans):
        busy += max(0.0, t1 - max(t0, end))
        end = max(end, t1)
    busy *= 1e6
    span = (max(t for _, t in spans) - min(t for t, _ in spans)) if spans else 0
    return {op: sorted(v) for op, v in lat.items()}, busy, span
def show(v):
    return "%6d ops, avg %5.1f us, p50 %5.1f, p99 %6.1f" % (len(v), sum(v) / len(v), v[len(v) // 2], v[int(len(v) * 0.99)])
(ours, busy, span), (fio, _, _) = legops("%s/%s.trace.txt" % (out, row)), legops("%s/%s.trace.fio.txt" % (out, row))
run = json.load(open("%s/%s.trace.tc.json" % (out, row)))["runs"][0]
cmd = run["latency_us"]["avg"]
j = json.load(open("%s/%s.trace.fio.json" % (out, row)))["jobs"][0]
side = j["write"] if j["write"]["io_bytes"] > j["read"]["io_bytes"] else j["read"]
print("%s: a command takes %.1f us (avg, traced); fio's I/O %.1f us" % (row, cmd, side["clat_ns"]["mean"] / 1000.0))
for op in sorted(set(ours) | set(fio)):
    if op in ours:
        print("  ours %-5s %s" % (op, show(ours[op])))
    if op in fio:
        print("  fio  %-5s %s" % (op, show(fio[op])))
# commands in the traced window: the run's rate (over all of it) times the window
cmds = run["iops"] * span
if cmds >= 1:
    per = busy / cmds
    print("  the legs: %.1f us per command (the time with a leg operation in flight, overlapping ones merged, over"
          " %.0f commands); the rest of the command, %.1f us, is the iSCSI round trip and the engine" % (per, cmds, cmd - per))
else:
    print("  the legs' share per command: n/a (no command in the traced window)")
PY
	}
	trace_row rh-qd1 randread-4k-qd1 -b 4k --rand -r 100 -t 1 -q 1
	trace_row wb-qd1 randwrite-4k-dsync-qd1 -b 4k --rand -r 0 -t 1 -q 1
fi

# The write-back QD1 row's floor: what the legs alone cost the writes a
# write-back write sends, timed on fio's region of the leg files with no
# daemon I/O (tests/bench/leg_floor.c, its own timing, system calls
# included): one durable write, one on each leg (the least a mirrored write
# can send), and data and record on each leg at once (what a one-trip write
# sends today). With the page-cache LUN's 4K QD1 read round trip of the
# table's rounds added (a write's round trip also carries its data: more),
# against one durable write: the row's floor for today's design, and for
# one write per leg.
FLOOR=$TC_ROOT/build/bench/leg_floor
if want wb-qd1; then
	echo "== the write-back QD1 floor: the legs alone, 4 KiB durable writes, all of an iteration at once"
	settle
	if [ ! -x "$FLOOR" ]; then
		echo "  n/a ($FLOOR is not built: make)"
	elif taskset -c "$CPU_TARGET" "$FLOOR" "$TB_LEG0" "$TB_LEG1" $((384 << 20)) $((128 << 20)) "$SECS" \
		>"$OUT/floor.txt" 2>"$OUT/floor.err"; then
		python3 - "$OUT" "$ROUNDS" <<'PY' || errors=$((errors + 1))
import json, sys
out, rounds = sys.argv[1], int(sys.argv[2])
f = {l.split()[0]: float(l.split()[1]) for l in open(out + "/floor.txt")}
rtt = [json.load(open("%s/pc-qd1.r%d.tc.json" % (out, r)))["runs"][0]["latency_us"]["avg"] for r in range(1, rounds + 1)]
pc = sum(rtt) / len(rtt)
one = f["one"]
print("  one durable write %.1f us; one on each leg %.1f us (%.2fx); data and record on each leg %.1f us (%.2fx)"
      % (one, f["legs"], f["legs"] / one, f["trip"], f["trip"] / one))
print("  plus the page-cache LUN's 4K read round trip (%.1f us, the table's mean): today's one-trip write %.2fx one"
      " durable write, one write per leg %.2fx; the row's goal is 1.3x" % (pc, (f["trip"] + pc) / one, (f["legs"] + pc) / one))
PY
	else
		echo "  the floor run failed: $(head -2 "$OUT/floor.err")"
		errors=$((errors + 1))
	fi
fi

# What bounds the queued rows (4K QD32 and 128K, reads and writes): the
# disk's own queue. A command of ours is at the disk only between its leg
# operations' issue and completion; the rest of its turn (the response to
# the initiator, the initiator's next command, the target's parsing) it
# holds one of the initiator's slots while the disk does not see it; fio
# hands a slot back to the disk as soon as it has reaped it. The block
# layer's issue and complete tracepoints (perf, on the disk the legs are
# files on) give how many requests the disk had over time, in a traced run
# of ours and of fio's job (tests/bench/depth.py); fio's job is then run
# again at its depth scaled by the ratio of the two means, down to a power
# of two (fio before 3.39 rounds io_uring's depth up to one), so nearer
# what ours kept there (not again at its own depth). By Little's law the
# disk's rate is the mean number there over the time each takes (and, in
# bytes, times the bytes each carries), so the report splits what ours
# loses against that run into those factors, beside
# the share of the time the disk had none (the round trip: the responses
# going out, the next commands coming in) and the mean while it had any
# (requests that arrive together wait for one another). A write-back
# command puts its data on both legs and a share of a journal block, and
# the cleaner writes the backing file (on the same disk here): the writes
# per command, and the flushes of the disk's cache per write, are printed
# too. Traced after the table, like the QD1 breakdown (TB_TRACE=0 skips
# both).
if [ "${TB_TRACE:-1}" = 1 ] && { want rh-qd32 || want rh-128k || want wb-qd32 || want wb-128k; }; then
	echo "== what bounds the queued rows: requests at the disk over time (block tracepoints)"
	# the disk the leg files are on, as the tracepoints name it (MAJOR,MINOR): a partition's disk; a
	# device the block layer queues requests for (mq: not device-mapper or md, whose requests are the
	# disks' below); else every disk
	LEG_DISK=$(python3 -c 'import os, sys; s = os.stat(sys.argv[1]); print("%d:%d" % (os.major(s.st_dev), os.minor(s.st_dev)))' "$TB_LEG0")
	[ -e "/sys/dev/block/$LEG_DISK/partition" ] && LEG_DISK=$(cat "/sys/dev/block/$LEG_DISK/../dev")
	if [ -d "/sys/dev/block/$LEG_DISK/mq" ]; then
		LEG_DISK=${LEG_DISK/:/,}
		echo "  (the legs' disk: $LEG_DISK)"
	else
		LEG_DISK=
		echo "  (the legs' disk is not one the block layer queues for: every disk is counted)"
	fi
	depth_row() { # ROW FIO-JOB DEPTH BYTES R|W TIERBENCH-ARGS...
		local row=$1 job=$2 depth=$3 bs=$4 rw=$5 ev="-a -m 64M -e block:block_rq_issue,block:block_rq_complete"
		shift 5
		want "$row" || return 0
		traced_pair "$row" depth "$job" "$ev" "$ev" "$@" || return 0
		# fio's job as it is but for its depth, scaled by the ratio of the two means, down to a power of two
		# (fio before 3.39 rounds io_uring's depth up to one); not again at its own depth
		local seen
		rm -f "$OUT/$row.depth.fio-at.json"
		seen=$(python3 tests/bench/depth.py fio-depth --rw "$rw" ${LEG_DISK:+--dev "$LEG_DISK"} "$OUT/$row.depth.txt" \
			"$OUT/$row.depth.fio.txt" "$depth") || { errors=$((errors + 1)); return 0; }
		if [ "$seen" != "$depth" ]; then
			sed "s/^iodepth=.*/iodepth=$seen/" "tests/bench/fio/$job.fio" >"$T/$job-at-$seen.fio"
			grep -q "^iodepth=$seen\$" "$T/$job-at-$seen.fio" || { echo "$row: no iodepth= line in $job.fio"; errors=$((errors + 1)); return 0; }
			# traced too, so that the runs carry the same tracing cost
			traced_fio "$OUT/$row.depth.fio-at" "$T/$job-at-$seen.fio" "$ev" "$OUT/$row.depth.err" ||
				{ echo "$row: fio at depth $seen failed"; errors=$((errors + 1)); return 0; }
			perf script -i "$OUT/$row.depth.fio-at.perf" >"$OUT/$row.depth.fio-at.txt" 2>/dev/null
		fi
		python3 tests/bench/depth.py report --row "$row" --depth "$depth" --bs "$bs" --rw "$rw" \
			${LEG_DISK:+--dev "$LEG_DISK"} "$OUT/$row.depth" || errors=$((errors + 1))
	}
	if ! command -v perf >/dev/null || ! perf list 2>/dev/null | grep -q "block:block_rq_complete"; then
		echo "  n/a (perf with the block tracepoints is not here)"
	else
		depth_row rh-qd32 randread-4k-qd32 32 4096 R -b 4k --rand -r 100 -t 1 -q 32
		depth_row rh-128k seqread-128k 8 131072 R -b 128k --seq -r 100 -t 1 -q 8
		depth_row wb-qd32 randwrite-4k-dsync-both 32 4096 W -b 4k --rand -r 0 -t 1 -q 32
		depth_row wb-128k seqwrite-128k-dsync-both 8 131072 W -b 128k --seq -r 0 -t 1 -q 8
	fi
fi
tc_stop

# Pressure: 8K 70/30 random over a working set of twice the cache, on an
# emulated HDD (tools/hdd-emulate.sh: 300 IOPS), from 2T2Q to 16T16Q; the
# goal is that no step falls below 90% of the IOPS of the step before it
# (a NAS review's 8K 70/30 fell from 8,308 to 1,340 IOPS at 16T16Q).
HDD=$TC_ROOT/tools/hdd-emulate.sh HDD_NAME=
if [ "${TB_PRESSURE:-1}" = 1 ] && [ "$(id -u)" = 0 ]; then
	echo "== pressure: 8K 70/30 over twice a 256 MiB cache on an emulated HDD, 2T2Q .. 16T16Q"
	HDD_NAME=benchdev$$
	if "$HDD" up "$HDD_NAME" --size 1G --iops 300 --mbps 250 >"$T/hdd.env" 2>"$T/hdd.err"; then
		. "$T/hdd.env"
		trap '"$HDD" down "$HDD_NAME" >/dev/null 2>&1; _tc_cleanup; [ -z "${TB_DIR:-}" ] && rm -rf "$D"' EXIT
		truncate -s 288M "$D/hdd-leg0.img" "$D/hdd-leg1.img"
		pport=$(tc_free_port)
		one_lun_conf hdd "$pport" "$HDD_DEV" 512M 288M >"$T/p.conf"
		start_pinned "$T/p.conf" "$pport" "$HDD" exec "$HDD_NAME" --
		taskset -c "$CPU_CLIENT" "$TB" --json --no-progress --io-timeout 120 -b 8k --rand -r 70 --loads 2x2,4x4,8x8,16x16 \
			-T "$SECS" --precondition "$SECS" "iscsi://127.0.0.1:$pport/$IQN/0" >"$OUT/pressure.tc.json" || errors=$((errors + 1))
		tc_stop
		"$HDD" down "$HDD_NAME" >/dev/null 2>&1
		python3 - "$OUT/pressure.tc.json" <<'PY'
import json, sys
runs = json.load(open(sys.argv[1]))["runs"]
prev, ok = None, True
for r in runs:
    step = r["iops"] / prev if prev else None
    met = step is None or step >= 0.9
    ok &= met
    print("pressure %-6s %8.0f IOPS  avg %7.0f us  p99.9 %8.0f us  %s" % (r["load"], r["iops"], r["latency_us"]["avg"],
          r["latency_us"]["p99_9"], "" if step is None else "%.2fx the step before (goal >= 0.90: %s)" % (step, "yes" if met else "NO")))
    prev = r["iops"]
print("pressure: every step >= 90%% of the one before: %s" % ("yes" if ok else "NO"))
PY
	else
		echo "  n/a (emulated HDD: $(cat "$T/hdd.err"))"
	fi
fi

# Memory: the daemon's own growth, set opened the normal way, after random
# 4 KiB write-back misses over twice the cache (each a partly valid
# extent: per-block state), per GiB of cache; goal <= 200 KB per GiB. Two
# caches, 1 and 3 GiB, each driven the same way: the growth per GiB is the
# slope between them, so what does not grow with the cache (buffer pools,
# each thread's malloc arena, the sessions) is not counted as if it did.
# Anonymous memory (RssAnon), not VmRSS: mapped files are not the cache's.
# The status's mem_bytes (the set's map and slots, policy and block bitmaps)
# beside it.
if [ "${TB_MEM:-1}" = 1 ]; then
	echo "== memory: 4K random write-back misses over twice a 1 GiB and a 3 GiB cache"
	anon() { awk '/^RssAnon:/ { print $2 }' "/proc/$TC_PID/status"; }
	for MC in 1024 3072; do # MiB of cache
		truncate -s $((MC + 64))M "$D/big$MC-leg0.img" "$D/big$MC-leg1.img"
		truncate -s $((2 * MC))M "$D/big$MC-backing.img"
		mport=$(tc_free_port)
		one_lun_conf big$MC "$mport" "$D/big$MC-backing.img" $((2 * MC))M $((MC + 64))M "seq_cutoff = 0" >"$T/m$MC.conf"
		start_pinned "$T/m$MC.conf" "$mport"
		setmem() { "$CTL" -c "$T/m$MC.conf" --json status | python3 -c 'import json,sys; print(json.load(sys.stdin)["caches"][0]["mem_bytes"])'; }
		r0=$(anon) m0=$(setmem)
		taskset -c "$CPU_CLIENT" "$TB" --json --no-progress --io-timeout 60 -b 4k --rand -r 0 -t 1 -q 32 -T $((SECS * 3)) \
			"iscsi://127.0.0.1:$mport/$IQN/0" >"$OUT/mem$MC.tc.json" || errors=$((errors + 1))
		r1=$(anon) m1=$(setmem)
		echo "$MC $r0 $r1 $m0 $m1" >>"$OUT/mem.txt"
		tc_stop
		rm -f "$D/big$MC-leg0.img" "$D/big$MC-leg1.img" "$D/big$MC-backing.img"
	done
	python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
rows = [[float(x) for x in l.split()] for l in open(out + "/mem.txt")]
for mc, r0, r1, m0, m1 in rows:
    ios = json.load(open("%s/mem%d.tc.json" % (out, mc)))["runs"][0]["ios"]
    print("memory: %4d MiB cache, %d writes: anonymous memory %.0f -> %.0f KB (+%.0f); the set's own count %.0f -> %.0f KB" % (
        mc, ios, r0, r1, r1 - r0, m0 / 1024, m1 / 1024))
(a, ar0, ar1, am0, am1), (b, br0, br1, bm0, bm1) = rows[0], rows[-1]
gib = (b - a) / 1024
grow = ((br1 - br0) - (ar1 - ar0)) / gib
whole = ((br1 - ar1)) / gib
print("memory: per GiB of cache (the slope between the two): growth %.0f KB (goal <= 200), all anonymous memory %.0f KB; the set's own count %.0f KB" % (
    grow, whole, ((bm1 - am1) / 1024) / gib))
PY
fi
[ -n "${TB_OUT:-}" ] && echo "results in $OUT"
exit $((errors > 0))
