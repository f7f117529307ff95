#!/usr/bin/env bash
# tests/bench/compare.sh - tiercached against tgtd, then cache off against
# cache on, with one client (tierbench) and the same files.
#
# Part 1, plain file: tgtd (rdwr backing store) and tiercached without a
# cache export the same pre-written file; every workload runs against each,
# and one table gives each figure and the ratio tiercached / tgtd.
# Part 2, emulated HDD (tools/hdd-emulate.sh: a loop device throttled by a
# block-I/O cgroup, the daemon started inside it): tiercached with the cache
# off, in write-through and in write-back, printed like the NAS reviews'
# cache-off / cache-on table.
#
# It is a benchmark: it prints and asserts nothing about speed. It exits
# non-zero only when a run failed (a target error, a verify mismatch).
#
#   bash tests/bench/compare.sh            full (about 20 minutes without the RBD part)
#   TB_QUICK=1 bash tests/bench/compare.sh  a few seconds per row (the smoke test)
# Knobs: TB_SECS (seconds per row), TB_SWEEP_SECS (per sweep point),
# TB_PRECOND (seconds of preconditioning on the HDD), TB_SIZE (plain LUN),
# TB_HDD_SIZE, TB_HOT (hot set on the HDD), TB_HDD_IOPS, TB_HDD_MBPS,
# TB_OUT (directory to keep JSON results and the SVG chart in), TB_PLAIN=0
# (skip the plain-file part), TB_HDD=0 (skip the emulated HDD part),
# TB_HDD_CONFIGS (which of "cache-off write-through write-back" to run),
# TB_RBD=0 / TB_RBD=1 (skip / force the Ceph RBD part).
. "$(dirname "$0")/../lib.sh"
cd "$TC_ROOT" || exit 2
tc_tmpdir

TB=$TC_ROOT/build/tierbench
HDD=$TC_ROOT/tools/hdd-emulate.sh
[ -x "$TB" ] || { echo "compare: build/tierbench is missing; run make" >&2; exit 2; }
[ -x "$TC_BIN" ] || { echo "compare: build/tiercached is missing; run make" >&2; exit 2; }
# measure one build from start to end, whatever happens to build/ meanwhile
mkdir -p "$T/bin"
cp "$TB" "$TC_BIN" "$T/bin/" || exit 2
TB=$T/bin/tierbench TC_BIN=$T/bin/tiercached

if [ -n "${TB_QUICK:-}" ]; then
	SECS=${TB_SECS:-1} SWEEP_SECS=${TB_SWEEP_SECS:-0.5} PRECOND=${TB_PRECOND:-1}
	SIZE=${TB_SIZE:-256M} HDD_SIZE=${TB_HDD_SIZE:-512M} HOT=${TB_HOT:-16M}
	SWEEP_LOADS=2x2,4x8,16x16
else
	SECS=${TB_SECS:-10} SWEEP_SECS=${TB_SWEEP_SECS:-5} PRECOND=${TB_PRECOND:-20}
	SIZE=${TB_SIZE:-1G} HDD_SIZE=${TB_HDD_SIZE:-4G} HOT=${TB_HOT:-64M}
	SWEEP_LOADS=2x2,2x4,2x8,2x16,4x2,4x4,4x8,4x16,8x2,8x4,8x8,8x16,16x2,16x4,16x8,16x16
fi
HDD_IOPS=${TB_HDD_IOPS:-300} HDD_MBPS=${TB_HDD_MBPS:-250}
OUT=${TB_OUT:-$T/results}
mkdir -p "$OUT"
IQN=iqn.2026-11.io.tiercache:bench
HDD_NAME=
TGTD_PID="" TGTD_CTL=""
errors=0

# tgtd_start PORT LOG: a tgtd on 127.0.0.1:PORT with its own control port,
# answering tgtadm; tgtd_stop takes it down (also at exit).
tgtd_start() {
	TGTD_CTL=$((10000 + $1 % 20000))
	tgtd -f -C "$TGTD_CTL" --iscsi portal=127.0.0.1:"$1" >"$2" 2>&1 &
	TGTD_PID=$!
	# up to 60 s: a busy machine; if it never answers, the setup after says so
	tc_until 60 tgtadm -C "$TGTD_CTL" --op show --mode target >/dev/null 2>&1
}

tgtd_stop() {
	[ -n "$TGTD_PID" ] || return 0
	tgtadm -C "$TGTD_CTL" --op delete --mode system >/dev/null 2>&1
	sleep 0.2
	kill -KILL "$TGTD_PID" 2>/dev/null
	wait "$TGTD_PID" 2>/dev/null
	TGTD_PID=
}

cleanup() {
	tgtd_stop
	if [ -n "$TC_PID" ] && kill -0 "$TC_PID" 2>/dev/null; then
		kill -KILL "$TC_PID" 2>/dev/null
		wait "$TC_PID" 2>/dev/null
	fi
	[ -n "$HDD_NAME" ] && "$HDD" down "$HDD_NAME" >/dev/null 2>&1
	_tc_cleanup
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# run_row CONFIG ROW URL TIERBENCH-ARGS...: one tierbench run, JSON kept in
# $OUT/CONFIG/ROW.json; a failure is printed and counted, the rest goes on.
run_row() {
	local cfg=$1 row=$2 url=$3
	shift 3
	mkdir -p "$OUT/$cfg"
	if ! "$TB" --json --label "$cfg" "$@" "$url" >"$OUT/$cfg/$row.json" 2>"$OUT/$cfg/$row.err"; then
		echo "  $cfg $row: FAILED: $(head -c 300 "$OUT/$cfg/$row.err")" >&2
		errors=$((errors + 1))
		rm -f "$OUT/$cfg/$row.json"
		return 1
	fi
	printf '.'
}

# The plain-file workloads, same arguments for both targets.
plain_rows() {
	local cfg=$1 url=$2
	printf '  %-20s ' "$cfg"
	run_row "$cfg" 4k-randread-qd32 "$url" -w 4k-randread -t 1 -q 32 -T "$SECS"
	run_row "$cfg" 4k-randwrite-qd32 "$url" -w 4k-randwrite -t 1 -q 32 -T "$SECS"
	run_row "$cfg" 4k-randread-qd1 "$url" -w 4k-randread -t 1 -q 1 -T "$SECS"
	run_row "$cfg" 4k-randwrite-qd1 "$url" -w 4k-randwrite -t 1 -q 1 -T "$SECS"
	run_row "$cfg" 128k-seqread "$url" -w 128k-seqread -t 1 -q 8 -T "$SECS"
	run_row "$cfg" 128k-seqwrite "$url" -w 128k-seqwrite -t 1 -q 8 -T "$SECS"
	run_row "$cfg" 8k-7030 "$url" -w 8k-7030 -t 16 -q 16 -T "$SECS"
	run_row "$cfg" sweep "$url" -w sweep --loads "$SWEEP_LOADS" -T "$SWEEP_SECS"
	echo
}

start_tiercached() { # CONF [HDD-NAME]
	local port
	port=$(sed -n 's/^listen = .*:\([0-9]*\)$/\1/p' "$1")
	if [ -n "${2:-}" ]; then
		"$HDD" exec "$2" -- "$TC_BIN" -c "$1" >>"$T/daemon.log" 2>&1 &
	else
		"$TC_BIN" -c "$1" >>"$T/daemon.log" 2>&1 &
	fi
	TC_PID=$!
	tc_wait_port "$port" 60 || { echo "compare: tiercached did not start; log:" >&2; tail -n 20 "$T/daemon.log" >&2; exit 2; }
}

stop_tiercached() {
	kill -TERM "$TC_PID" 2>/dev/null
	local i
	for ((i = 0; i < 200; i++)); do
		kill -0 "$TC_PID" 2>/dev/null || break
		sleep 0.1
	done
	kill -KILL "$TC_PID" 2>/dev/null
	wait "$TC_PID" 2>/dev/null
	TC_PID=
}

# conf PORT BACKING [CACHE-MODE]: a one-LUN config, with a cache set of two
# file legs when a mode is given. WRITE_CACHE sets the LUN's WCE bit.
WRITE_CACHE=no
conf() {
	cat <<EOF
[daemon]
state_dir = $T/state-$1
control_socket = $T/state-$1/control.sock
log_level = warning

[portal]
listen = 127.0.0.1:$1

[target $IQN]
lun0 = disk0

[lun disk0]
backing = $2
block_size = 512
write_cache = $WRITE_CACHE
EOF
	if [ -n "${3:-}" ]; then
		echo "cache = fast0"
		cat <<EOF

[cache fast0]
legs = $T/leg0-$1.img $T/leg1-$1.img
size = ${TB_CACHE_SIZE:-1G}
mode = $3
EOF
	fi
}

cpus=$(nproc)
echo "tierbench compare: $(date -u '+%Y-%m-%d %H:%M UTC'), $cpus CPUs; client and targets share them,"
echo "so every figure includes the client's own CPU cost. ${SECS}s per row, sweep ${SWEEP_SECS}s per point."

# ---- part 1: plain file ----------------------------------------------------
echo
echo "== plain file ($SIZE, pre-written with random data): tgtd (rdwr) vs tiercached (no cache)"
# tgtd reports WCE=1 by default and its rdwr store acknowledges writes from
# the page cache; tiercached gets the same contract (write_cache = yes) so
# both are measured with a volatile write cache. TB_WCE=0 measures
# tiercached durable-on-status instead.
if [ "${TB_WCE:-1}" = 1 ]; then WRITE_CACHE=yes; else WRITE_CACHE=no; fi
echo "   tgtd: rdwr store through the page cache, write cache on (its default)."
echo "   tiercached: O_DIRECT backing (no page cache), write_cache = $WRITE_CACHE (TB_WCE=${TB_WCE:-1});"
echo "   tiercached-buffered: the same LUN with backing_io = buffered (page cache, as tgtd)."
img=$T/plain.img
bytes=$(numfmt --from=iec "$SIZE")
head -c "$bytes" /dev/urandom >"$img"
# What the O_DIRECT side reaches: the device under the file, not memory.
fsdev=$(df -PT "$img" 2>/dev/null | awk 'NR == 2 { print $2 " on " $1 }')
echo "   both on the same file, $fsdev: tgtd's I/O is served from RAM once the file is cached, tiercached's goes to that device."

if [ "${TB_PLAIN:-}" = 0 ]; then
	echo "  skipped (TB_PLAIN=0)"
elif command -v tgtd >/dev/null && command -v tgtadm >/dev/null; then
	port=$(tc_free_port)
	tgtd_start "$port" "$T/tgtd.log"
	tgtadm -C "$TGTD_CTL" --lld iscsi --op new --mode target --tid 1 -T "$IQN" &&
		tgtadm -C "$TGTD_CTL" --lld iscsi --op new --mode logicalunit --tid 1 --lun 1 -b "$img" --bstype rdwr &&
		tgtadm -C "$TGTD_CTL" --lld iscsi --op bind --mode target --tid 1 -I ALL ||
		{ echo "compare: tgtd setup failed" >&2; cat "$T/tgtd.log" >&2; exit 2; }
	plain_rows tgtd "iscsi://127.0.0.1:$port/$IQN/1"
	tgtd_stop
else
	echo "  tgtd: not installed (package tgt); its column stays empty"
fi

if [ "${TB_PLAIN:-}" != 0 ]; then
	port=$(tc_free_port)
	conf "$port" "$img" >"$T/plain.conf"
	start_tiercached "$T/plain.conf"
	plain_rows tiercached "iscsi://127.0.0.1:$port/$IQN/0"
	stop_tiercached
	# the same LUN through the page cache, as tgtd's rdwr store (backing_io = buffered)
	port=$(tc_free_port)
	{ conf "$port" "$img"; echo "backing_io = buffered"; } >"$T/plain-buffered.conf"
	start_tiercached "$T/plain-buffered.conf"
	plain_rows tiercached-buffered "iscsi://127.0.0.1:$port/$IQN/0"
	stop_tiercached
fi
WRITE_CACHE=no

# ---- part 2: emulated HDD, cache off and on ---------------------------------
hdd_rows() {
	local cfg=$1 url=$2
	printf '  %-14s ' "$cfg"
	run_row "$cfg" 4k-randread "$url" -w 4k-randread -t 16 -q 16 --size "$HOT" -T "$SECS" --precondition "$PRECOND"
	run_row "$cfg" 4k-randwrite "$url" -w 4k-randwrite -t 16 -q 16 --size "$HOT" -T "$SECS" --precondition "$PRECOND"
	if [ -z "${TB_QUICK:-}" ]; then
		run_row "$cfg" 8k-7030 "$url" -w 8k-7030 -t 16 -q 16 --size "$HOT" -T "$SECS" --precondition "$PRECOND"
		run_row "$cfg" 128k-seqread "$url" -w 128k-seqread -t 1 -q 8 -T "$SECS"
		run_row "$cfg" 128k-seqwrite "$url" -w 128k-seqwrite -t 1 -q 8 -T "$SECS"
	fi
	# preconditioned like the random rows: the 128K rows before it stream
	# over the whole LUN, so the sweep would otherwise start by re-warming
	run_row "$cfg" sweep "$url" -w sweep --size "$HOT" --loads "$SWEEP_LOADS" -T "$SWEEP_SECS" \
		--precondition "$PRECOND"
	echo
}

echo
echo "== emulated HDD ($HDD_SIZE, $HDD_IOPS IOPS, $HDD_MBPS MB/s; hot set $HOT): tiercached cache off / on"
echo "   (reads and writes are capped separately, so a mix can use both caps; the cap counts"
echo "   commands, so 128K sequential is held to $HDD_IOPS x 128K = $((HDD_IOPS * 131072 / 1000000)) MB/s where real disks would"
echo "   stream; write_cache = no: every write durable on status; random rows preconditioned ${PRECOND}s)"
hdd_ok=1
if [ "${TB_HDD:-}" = 0 ]; then
	echo "  skipped (TB_HDD=0)"
	hdd_ok=
elif [ "$(id -u)" != 0 ]; then
	echo "  n/a (the emulated HDD needs root)"
	hdd_ok=
else
	HDD_NAME=bench$$
	if ! "$HDD" up "$HDD_NAME" --size "$HDD_SIZE" --iops "$HDD_IOPS" --mbps "$HDD_MBPS" >"$T/hdd.env" 2>"$T/hdd.err"; then
		echo "  n/a (emulated HDD: $(cat "$T/hdd.err"))"
		HDD_NAME="" hdd_ok=""
	fi
fi
cache_modes=()
if [ -n "$hdd_ok" ]; then
	. "$T/hdd.env"
	configs=" ${TB_HDD_CONFIGS:-cache-off write-through write-back} "
	port=$(tc_free_port)
	if [[ $configs == *" cache-off "* ]]; then
		conf "$port" "$HDD_DEV" >"$T/hdd-off.conf"
		start_tiercached "$T/hdd-off.conf" "$HDD_NAME"
		hdd_rows cache-off "iscsi://127.0.0.1:$port/$IQN/0"
		stop_tiercached
	fi

	conf "$port" "$HDD_DEV" write-back >"$T/probe.conf"
	if probe=$("$TC_BIN" --check -c "$T/probe.conf" 2>&1); then
		for mode in write-through write-back; do
			[[ $configs == *" $mode "* ]] && cache_modes+=("$mode")
		done
	else
		echo "  cache on: n/a (cache engine not available: $(echo "$probe" | head -n 1))"
	fi
	for mode in "${cache_modes[@]}"; do
		port=$(tc_free_port)
		rm -f "$T"/leg*.img
		conf "$port" "$HDD_DEV" "$mode" >"$T/hdd-$mode.conf"
		start_tiercached "$T/hdd-$mode.conf" "$HDD_NAME"
		hdd_rows "$mode" "iscsi://127.0.0.1:$port/$IQN/0"
		stop_tiercached
	done
	"$HDD" down "$HDD_NAME" >/dev/null
	HDD_NAME=
fi

# ---- tables -------------------------------------------------------------------
echo
python3 - "$OUT" "$HDD_IOPS" "$HDD_MBPS" "$HOT" <<'PY'
import json, os, sys
out, hdd_iops, hdd_mbps, hot = sys.argv[1:5]

def load(cfg, row):
    try:
        with open(os.path.join(out, cfg, row + ".json")) as f:
            return json.load(f)["runs"]
    except (OSError, ValueError, KeyError):
        return None

def lat(us):
    if us is None: return "-"
    if us >= 1e6: return "%.2fs" % (us / 1e6)
    if us >= 1e3: return "%.2fms" % (us / 1e3)
    return "%.0fus" % us

def num(v):
    return "-" if v is None else ("{:,.0f}".format(v) if v >= 100 else "%.1f" % v)

def ratio(a, b):
    if a is None or b is None or b == 0: return "-"
    return "%.2fx" % (a / b)

rows = [("4k-randread-qd32", "4K random read, QD32"), ("4k-randwrite-qd32", "4K random write, QD32"),
        ("4k-randread-qd1", "4K random read, QD1"), ("4k-randwrite-qd1", "4K random write, QD1"),
        ("128k-seqread", "128K sequential read, 1T8Q"), ("128k-seqwrite", "128K sequential write, 1T8Q"),
        ("8k-7030", "8K 70/30 random, 16T16Q")]
metrics = [("IOPS", lambda r: r["iops"], num), ("MB/s", lambda r: r["mb_per_s"], num),
           ("avg lat", lambda r: r["latency_us"]["avg"], lat), ("p50 lat", lambda r: r["latency_us"]["p50"], lat),
           ("p99 lat", lambda r: r["latency_us"]["p99"], lat), ("p99.9 lat", lambda r: r["latency_us"]["p99_9"], lat),
           ("max lat", lambda r: r["latency_us"]["max"], lat), ("stddev", lambda r: r["latency_us"]["stddev"], lat)]
plain_ran = any(load(c, k) for c in ("tgtd", "tiercached", "tiercached-buffered") for k, _ in rows)
if plain_ran:
    print("tiercached vs tgtd, plain file (ratio = tiercached / tgtd: above 1 is better for IOPS and MB/s,")
    print("below 1 is better for latency); direct = O_DIRECT, buffered = backing_io = buffered (page cache, as tgtd)")
fmt = "%-28s %-10s %12s %12s %8s %12s %8s"
if plain_ran:
    print(fmt % ("workload", "figure", "tgtd", "direct", "ratio", "buffered", "ratio"))
for key, title in (rows if plain_ran else []):
    a, b, c = load("tgtd", key), load("tiercached", key), load("tiercached-buffered", key)
    for i, (mname, get, f) in enumerate(metrics):
        va = get(a[0]) if a else None
        vb = get(b[0]) if b else None
        vc = get(c[0]) if c else None
        print(fmt % (title if i == 0 else "", mname, f(va), f(vb), ratio(vb, va), f(vc), ratio(vc, va)))

def sweep_summary(cfg):
    runs = load(cfg, "sweep")
    if not runs: return None
    peak = max(runs, key=lambda r: r["iops"])
    low = min(runs, key=lambda r: r["iops"])
    worst = max(runs, key=lambda r: r["latency_us"]["p99_9"])
    # collapse under load: the lowest point at or above the peak's outstanding count
    heavier = [r for r in runs if r["sessions"] * r["qd"] >= peak["sessions"] * peak["qd"]]
    after = min(heavier, key=lambda r: r["iops"])
    return runs[0]["iops"], runs[-1]["iops"], peak["iops"], low, worst, after

print()
print("8K 70/30 sweep (%s .. %s): throughput floor vs its own peak, worst p99.9" % (
      (load("tiercached", "sweep") or load("tgtd", "sweep") or [{"load": "?"}])[0]["load"],
      (load("tiercached", "sweep") or load("tgtd", "sweep") or [{"load": "?"}])[-1]["load"]))
for cfg in ("tgtd", "tiercached", "tiercached-buffered", "cache-off", "write-through", "write-back"):
    s = sweep_summary(cfg)
    if not s: continue
    first, last, peak, low, worst, after = s
    print("  %-14s start %s -> end %s IOPS, peak %s; floor %s at %s (%.0f%% of peak); under more load than"
          " the peak's: floor %s at %s (%.0f%%); worst p99.9 %s at %s" % (
        cfg, num(first), num(last), num(peak), num(low["iops"]), low["load"],
        100.0 * low["iops"] / peak if peak else 0, num(after["iops"]), after["load"],
        100.0 * after["iops"] / peak if peak else 0, lat(worst["latency_us"]["p99_9"]), worst["load"]))

cfgs = [c for c in ("cache-off", "write-through", "write-back") if os.path.isdir(os.path.join(out, c))]
if "cache-off" in cfgs:
    print()
    print("Emulated HDD (%s IOPS, %s MB/s), tiercached, cache off vs on; hot set %s, 16T16Q" % (hdd_iops, hdd_mbps, hot))
    cols = cfgs + [c + " / off" for c in cfgs if c != "cache-off"]
    fmt2 = "%-36s" + " %15s" * len(cols)
    print(fmt2 % tuple(["workload"] + cols))
    def g(cfg, row, get):
        r = load(cfg, row)
        return get(r[0]) if r else None
    table = [
        ("4K random read IOPS", "4k-randread", lambda r: r["iops"], num),
        ("4K random write IOPS", "4k-randwrite", lambda r: r["iops"], num),
        ("4K random read avg latency", "4k-randread", lambda r: r["latency_us"]["avg"], lat),
        ("4K random write avg latency", "4k-randwrite", lambda r: r["latency_us"]["avg"], lat),
        ("4K random read max latency", "4k-randread", lambda r: r["latency_us"]["max"], lat),
        ("4K random write max latency", "4k-randwrite", lambda r: r["latency_us"]["max"], lat),
        ("4K random read stddev", "4k-randread", lambda r: r["latency_us"]["stddev"], lat),
        ("4K random write stddev", "4k-randwrite", lambda r: r["latency_us"]["stddev"], lat),
        ("8K 70/30 16T16Q IOPS", "8k-7030", lambda r: r["iops"], num),
        ("128K sequential read MB/s", "128k-seqread", lambda r: r["mb_per_s"], num),
        ("128K sequential write MB/s", "128k-seqwrite", lambda r: r["mb_per_s"], num),
    ]
    for title, row, get, f in table:
        vals = [g(c, row, get) for c in cfgs]
        if all(v is None for v in vals): continue
        off = vals[0]
        rat = [ratio(v, off) for v in vals[1:]]
        print(fmt2 % tuple([title] + [f(v) for v in vals] + rat))
    for cfg in cfgs:
        s = sweep_summary(cfg)
        if s:
            print("  8K 70/30 sweep %-14s start -> end: %s -> %s IOPS" % (cfg, num(s[0]), num(s[1])))

# The goals of issue 5, measured here; printed, never asserted.
def fig(cfg, row, get):
    r = load(cfg, row)
    return get(r[0]) if r else None
iops = lambda r: r["iops"]
mbs = lambda r: r["mb_per_s"]
avg = lambda r: r["latency_us"]["avg"]
goals = []
def goal(text, value, ok, shown):
    goals.append((text, shown if value is not None else "-", "-" if value is None else ("met" if ok else "not met")))
def rat(cfg_a, cfg_b, row, get):
    a, b = fig(cfg_a, row, get), fig(cfg_b, row, get)
    return None if a is None or not b else a / b
for cfg, tag in (("tiercached", "direct"), ("tiercached-buffered", "buffered")):
    for row, what in (("4k-randread-qd32", "4K random read QD32"), ("4k-randwrite-qd32", "4K random write QD32")):
        r = rat(cfg, "tgtd", row, iops)
        goal("%s: %s IOPS >= 2x tgtd" % (tag, what), r, r is not None and r >= 2, "%.2fx" % r if r else "-")
    for row, what in (("4k-randread-qd1", "4K random read QD1"), ("4k-randwrite-qd1", "4K random write QD1")):
        r = rat(cfg, "tgtd", row, avg)
        goal("%s: %s avg latency <= 0.6x tgtd" % (tag, what), r, r is not None and r <= 0.6,
             "%.2fx" % r if r else "-")
    for row, what in (("128k-seqread", "128K sequential read"), ("128k-seqwrite", "128K sequential write")):
        r = rat(cfg, "tgtd", row, mbs)
        goal("%s: %s MB/s >= 1.5x tgtd" % (tag, what), r, r is not None and r >= 1.5, "%.2fx" % r if r else "-")
best = None
for mode in ("write-through", "write-back"):
    r = rat(mode, "cache-off", "4k-randread", iops)
    if r is not None and (best is None or r > best[0]): best = (r, mode)
goal("HDD: cached hot-set 4K read >= 50x uncached", best and best[0], best is not None and best[0] >= 50,
     "%.1fx (%s)" % best if best else "-")
r = rat("write-back", "cache-off", "4k-randwrite", iops)
goal("HDD: write-back 4K random write >= 50x uncached", r, r is not None and r >= 50, "%.1fx" % r if r else "-")
for cfg in ("tiercached", "tiercached-buffered", "write-back"):
    s = sweep_summary(cfg)
    if s:
        first, last, peak, low, worst, after = s
        floor = low["iops"] / peak if peak else 0
        collapse = after["iops"] / peak if peak else 0
        p999 = worst["latency_us"]["p99_9"]
        goal("sweep (%s): every point >= 90%% of peak, p99.9 <= 50 ms" % cfg, floor,
             floor >= 0.9 and p999 <= 50000, "%.0f%%, %s" % (100 * floor, lat(p999)))
        goal("sweep (%s): past the peak >= 90%% of it (no collapse)" % cfg, collapse,
             collapse >= 0.9, "%.0f%%" % (100 * collapse))
print()
print("Goals of issue 5 (printed, not asserted):")
for text, shown, verdict in goals:
    print("  %-64s %-22s %s" % (text, shown, verdict))
PY

# charts: plain file (tgtd vs tiercached) and emulated HDD (cache off vs on)
charts=()
for part in plain hdd; do
	docs=()
	if [ $part = plain ]; then cfgs="tgtd tiercached tiercached-buffered"; else cfgs="cache-off write-through write-back"; fi
	for c in $cfgs; do
		for f in "$OUT/$c"/*.json; do
			[ -f "$f" ] && docs+=(--from "$f")
		done
	done
	[ ${#docs[@]} -gt 0 ] && "$TB" --svg "$OUT/compare-$part.svg" "${docs[@]}" && charts+=("$OUT/compare-$part.svg")
done
if [ ${#charts[@]} -gt 0 ]; then
	echo
	echo "charts: ${charts[*]} (JSON results beside them)"
	[ -z "${TB_OUT:-}" ] && echo "(set TB_OUT=DIR to keep them; this run's directory is removed at exit)"
fi
# ---- part 3: Ceph RBD as the capacity tier -------------------------------------
# 4K random reads on a hot set of an RBD image (one BlueStore OSD on a file,
# tests/ceph/cluster.sh): tiercached on the image without a cache, with a
# write-through cache set of two file legs in front, and tgtd's rbd backing
# store (package tgt-rbd) on the same image; same client, same hot set. The
# hot set is written first, from its start with one thread (librbd answers
# reads of never-written objects itself from the object map, which would
# measure nothing; rbd bench's threads would each start elsewhere). Full runs only, or TB_RBD=1; TB_RBD=0
# never. Needs ceph-mon/ceph-osd (about 20 s to start, ~1 GB of RAM).
rbd_section() {
	local want=${TB_RBD:-}
	[ "$want" = 0 ] && return 0
	[ -n "${TB_QUICK:-}" ] && [ "$want" != 1 ] && return 0
	echo
	echo "== Ceph RBD (1 OSD on a file, 127.0.0.1; hot set $HOT of a ${TB_RBD_SIZE:-1G} image): 4K random read"
	if ! command -v ceph-osd >/dev/null || ! command -v rbd >/dev/null; then
		echo "  n/a (Ceph not installed: ceph-mon ceph-osd ceph-common)"
		return 0
	fi
	local cdir=$T/ceph cport tport ctl i
	if ! NO_MGR=1 bash "$TC_ROOT/tests/ceph/cluster.sh" up "$cdir" >"$T/ceph-up.log" 2>&1; then
		echo "  n/a (the Ceph cluster did not start: $(tail -n 3 "$T/ceph-up.log" | tr '\n' ' '))"
		return 0
	fi
	# stop the cluster whatever happens from here on (after the daemons)
	trap 'cleanup; bash "$TC_ROOT/tests/ceph/cluster.sh" down "'"$cdir"'"' EXIT
	local CEPH_CONF CEPH_POOL
	. "$cdir/env"
	export CEPH_CONF
	local spec="$CEPH_POOL/bench"
	rbd create --size "${TB_RBD_SIZE:-1G}" "$spec" >/dev/null 2>&1 &&
		rbd bench --io-type write --io-size 4M --io-threads 1 --io-total "$HOT" --io-pattern seq "$spec" \
			>"$T/rbd-fill.log" 2>&1 || { echo "  n/a (cannot create and fill $spec)"; errors=$((errors + 1)); return 0; }

	rbd_rows() { # CONFIG URL
		printf '  %-14s ' "$1"
		run_row "$1" 4k-randread "$2" -w 4k-randread -t 16 -q 16 --size "$HOT" -T "$SECS" --precondition "$PRECOND"
		run_row "$1" 4k-randread-qd1 "$2" -w 4k-randread -t 1 -q 1 --size "$HOT" -T "$SECS"
		echo
	}
	local mode cfg
	for mode in "" write-through; do
		cfg=rbd-nocache
		[ -n "$mode" ] && cfg=rbd-cache
		cport=$(tc_free_port)
		rm -f "$T"/leg*-"$cport".img
		conf "$cport" "rbd:$spec" "$mode" | sed "s#^backing = rbd:.*#&\nceph_conf = $CEPH_CONF#" >"$T/$cfg.conf"
		start_tiercached "$T/$cfg.conf"
		rbd_rows "$cfg" "iscsi://127.0.0.1:$cport/$IQN/0"
		stop_tiercached
	done

	if command -v tgtd >/dev/null && [ -e /usr/lib/tgt/backing-store/bs_rbd.so ]; then
		tport=$(tc_free_port)
		tgtd_start "$tport" "$T/tgtd-rbd.log"
		if tgtadm -C "$TGTD_CTL" --lld iscsi --op new --mode target --tid 1 -T "$IQN" &&
			tgtadm -C "$TGTD_CTL" --lld iscsi --op new --mode logicalunit --tid 1 --lun 1 \
				--bstype rbd -b "$spec" --bsopts "conf=$CEPH_CONF" &&
			tgtadm -C "$TGTD_CTL" --lld iscsi --op bind --mode target --tid 1 -I ALL; then
			rbd_rows tgtd-rbd "iscsi://127.0.0.1:$tport/$IQN/1"
		else
			echo "  tgtd-rbd: setup failed: $(tail -n 3 "$T/tgtd-rbd.log" | tr '\n' ' ')"
			errors=$((errors + 1))
		fi
		tgtd_stop
	else
		echo "  tgtd-rbd: n/a (packages tgt and tgt-rbd)"
	fi
	bash "$TC_ROOT/tests/ceph/cluster.sh" down "$cdir"
	trap cleanup EXIT

	python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
def run(cfg, row):
    try:
        with open(os.path.join(out, cfg, row + ".json")) as f:
            return json.load(f)["runs"][0]
    except (OSError, ValueError, KeyError, IndexError):
        return None
def lat(us):
    if us is None: return "-"
    return "%.2fms" % (us / 1e3) if us >= 1e3 else "%.0fus" % us
print()
print("RBD, 4K random read on the hot set (ratio = against tgtd's rbd store)")
fmt = "%-24s %-14s %10s %10s %10s %8s"
print(fmt % ("workload", "config", "IOPS", "avg lat", "p99 lat", "ratio"))
for row, title in (("4k-randread", "16T16Q"), ("4k-randread-qd1", "QD1")):
    base = run("tgtd-rbd", row)
    for cfg in ("tgtd-rbd", "rbd-nocache", "rbd-cache"):
        r = run(cfg, row)
        if r is None:
            print(fmt % (title, cfg, "-", "-", "-", "-"))
            continue
        ratio = "%.2fx" % (r["iops"] / base["iops"]) if base and base["iops"] else "-"
        print(fmt % (title, cfg, "{:,.0f}".format(r["iops"]), lat(r["latency_us"]["avg"]),
                     lat(r["latency_us"]["p99"]), ratio))
PY
}
rbd_section

if [ $errors -gt 0 ]; then
	echo "compare: $errors run(s) failed (see the messages above)" >&2
	exit 1
fi
exit 0
