#!/usr/bin/env bash
# tierbench's open loop (--rate) against a known answer. LUN 0 of the target
# "slow" sits on a cache set of one leg whose fault device serves one
# request at a time with a fixed service time (tierctl leg fault ... delay
# 2000): with Poisson arrivals and one command at a time it is an M/D/1
# queue, whose mean time in system is D + rho*D/(2(1-rho)).
#   - D is measured in the run: closed loop at QD1 first, then each open
#     run's own service time (send to answer);
#   - at rho 0.5 and 0.8 (-q 1: the wait happens in tierbench), the mean
#     latency is within 10% of the M/D/1 value and of the exact
#     mean for the very arrivals sent (tests/tools/mdq.py draws the same
#     Poisson arrivals from the seed and runs Lindley's recursion; it also
#     picks a seed whose 15 s path lies within 1% of the formula, see
#     there), and tierbench sent exactly the arrivals the seed gives (a
#     point that misses is run again once on the next typical path);
#   - at rho 0.5 with -q 8 the queue forms in the device instead: the mean
#     lies within 10% of the M/D/1 answers for a 2 ms server (plus the rest
#     of D outside the queue) and for a server of all of D (a device that
#     served requests side by side would not queue: about D);
#   - the closed-loop error: the same arrivals measured from the send
#     (--latency-from issue) report under 60% of the M/D/1 value, and so
#     does the closed loop at QD1;
#   - evenly spaced arrivals at rho 0.8 (D/D/1) wait for nothing: mean
#     within 10% of D;
#   - each of these points that misses runs once more before it fails: a
#     slow moment of a 2-core machine moves one run, a broken queue both;
#   - percentiles reach p99.99 and the max, in order;
#   - --rates draws latency against offered load (--svg), rising with it;
#   - --compare runs each row on a second target ("fast": a plain LUN) and
#     its ratios are the second's figures over the first's.
. "$(dirname "$0")/lib.sh"
tc_tmpdir
TB=$TC_ROOT/build/tierbench
CTL=$TC_ROOT/build/tierctl
MDQ=$TC_ROOT/tests/tools/mdq.py
[ -x "$TB" ] || skip "build/tierbench is not built"
command -v python3 >/dev/null || skip "python3 not installed"

port=$(tc_free_port)
{
	tc_conf_head "$port"
	cat <<CONF

[target iqn.2026-11.io.tiercache:slow]
lun0 = slow0

[lun slow0]
backing = $T/slow.img
size = 64M
cache = one

[cache one]
legs = $T/leg0.img
allow_single_leg = yes
size = 32M
mode = write-through
fault_injection = yes

[target iqn.2026-11.io.tiercache:fast]
lun0 = fast0

[lun fast0]
backing = $T/fast.img
size = 64M
CONF
} >"$T/t.conf"
tc_start "$T/t.conf"
slow=iscsi://127.0.0.1:$port/iqn.2026-11.io.tiercache:slow/0
fast=iscsi://127.0.0.1:$port/iqn.2026-11.io.tiercache:fast/0
ctl() { "$CTL" -c "$T/t.conf" "$@"; }
# jq-like: python expression over the JSON document in FILE (d)
jv() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"; }
close() { python3 -c "import sys; a,b,t=map(float,sys.argv[1:]); sys.exit(0 if abs(a/b-1) <= t else 1)" "$@"; }
tb() { "$TB" --json --no-progress -w 4k-randread --size 4M "$@"; }

# the 4 MiB the runs read, into the cache (write-through fills it), then slow the leg
"$TB" --json --no-progress -b 64k --seq -r 0 -t 1 -q 4 -n 64 --size 4M "$slow" >"$T/fill.json" ||
	fail "fill: $(head -c 300 "$T/fill.json")"
ctl leg fault one "$T/leg0.img" delay 2000 >/dev/null || fail "tierctl leg fault ... delay 2000 refused"

# --- D: closed loop, one command at a time -----------------------------------
tb -t 1 -q 1 -T 3 "$slow" >"$T/closed.json" || fail "closed loop: $(head -c 300 "$T/closed.json")"
D=$(jv "$T/closed.json" 'd["runs"][0]["latency_us"]["avg"]/1e6')
hits=$(ctl --json status | python3 -c 'import json,sys; print(json.load(sys.stdin)["caches"][0]["read_hits"])')
[ "$hits" -gt 0 ] || fail "the reads did not hit the cache (read_hits $hits): the delay was not in their path"
python3 -c "import sys; sys.exit(0 if 0.0019 < $D < 0.004 else 1)" ||
	fail "closed-loop QD1 mean $D s: the leg's 2 ms delay is not what serves the reads"
echo "D (closed loop, QD1): $D s"

# One open-loop run at utilisation RHO with -q QD; sets mean, S, md1, pathm.
secs=15
open_run() { # NAME RHO QD [ARGS...]   (AFTER=N: a seed after N)
	local name=$1 rho=$2 qd=$3
	shift 3
	rate=$(python3 -c "print(round($rho / $D))")
	seed=$(python3 "$MDQ" pick "$rate" "$secs" "$D" 0.01 "${AFTER:-0}") || fail "mdq.py pick"
	tb -t 1 -q "$qd" -T "$secs" --rate "$rate" --seed "$seed" "$@" "$slow" >"$T/$name.json" ||
		fail "$name: $(head -c 300 "$T/$name.json")"
	ios=$(jv "$T/$name.json" 'd["runs"][0]["ios"]')
	mean=$(jv "$T/$name.json" 'd["runs"][0]["latency_us"]["avg"]/1e6')
	S=$(jv "$T/$name.json" 'd["runs"][0]["service_us"]["avg"]/1e6')
	read -r n_due pathm < <(python3 "$MDQ" path "$seed" "$rate" "$secs" "$S")
	[ $((ios - n_due)) -le 1 ] && [ $((n_due - ios)) -le 1 ] ||
		fail "$name: tierbench sent $ios commands, the seed's Poisson schedule has $n_due"
	md1=$(python3 "$MDQ" md1 "$(python3 -c "print($ios / $secs)")" "$S")
}

# --- M/D/1 at rho 0.5 and 0.8, the wait in tierbench (-q 1) ------------------
# A mean is a sample: near rho 0.8 a few slow moments of a busy 2-core
# machine can move one 15 s run by several percent. A point that misses is
# run once more on the next typical path, and both runs are printed; a
# broken open loop (latency from the send, a schedule that waits for the
# target) misses by 30% and more, twice.
for rho in 0.5 0.8; do
	for try in 1 2; do
		AFTER=${seed_tried:-0} open_run "q1-$rho" "$rho" 1
		seed_tried=$seed
		echo "rho $rho (try $try): rate $rate/s seed $seed, service $S s, mean $mean s; M/D/1 $md1 s, this path $pathm s"
		close "$mean" "$pathm" 0.10 && close "$mean" "$md1" 0.10 && break
		[ "$try" = 2 ] &&
			fail "rho $rho: mean latency $mean s is not within 10% of the M/D/1 answer $md1 s and of $pathm s, the exact mean for the arrivals sent (twice)"
	done
	seed_tried=
	[ "$rho" = 0.8 ] && md1_08=$md1 && rate_08=$rate && seed_08=$seed
done
pass "open loop, Poisson arrivals at rho 0.5 and 0.8: within 10% of the M/D/1 mean and of the path's"

# --- the same queue formed in the device (-q 8) ------------------------------
# The queue is now the leg's. Its server takes the 2 ms of the delay and a
# little more (the file read, the hand-over between workers); the rest of
# D (iSCSI, the daemon) is spent outside the queue. The answer lies between
# M/D/1 on 2 ms plus the rest of D as is (lo) and M/D/1 on all of D (hi).
# Like the points above, one that misses runs once more on the next
# typical path: a device serving side by side misses by far more, twice.
for try in 1 2; do
	AFTER=${seed_tried:-0} open_run q8-0.5 0.5 8
	seed_tried=$seed
	lam=$(python3 -c "print($ios / $secs)")
	lo=$(python3 -c "print(max($D - 0.002, 0) + $(python3 "$MDQ" md1 "$lam" 0.002))")
	hi=$(python3 "$MDQ" md1 "$lam" "$D")
	echo "rho 0.5, -q 8 (try $try): mean $mean s; M/D/1 bounds: $lo s (a 2 ms server) .. $hi s (a server of all of D)"
	python3 -c "import sys; sys.exit(0 if 0.9 * $lo <= $mean <= 1.1 * $hi else 1)" && break
	[ "$try" = 2 ] &&
		fail "rho 0.5 with 8 in flight: mean $mean s is outside 10% of the M/D/1 bounds $lo .. $hi s, twice (does the device serve one at a time?)"
done
seed_tried=
pass "with 8 in flight the device queues them one at a time: the M/D/1 mean within 10%"

# --- what closed-loop measurement makes of it ---------------------------------
tb -t 1 -q 1 -T 8 --rate "$rate_08" --seed "$seed_08" --latency-from issue "$slow" >"$T/issue.json" ||
	fail "--latency-from issue: $(head -c 300 "$T/issue.json")"
issue=$(jv "$T/issue.json" 'd["runs"][0]["latency_us"]["avg"]/1e6')
echo "rho 0.8 measured from the send: $issue s; closed loop QD1: $D s; M/D/1: $md1_08 s"
python3 -c "import sys; sys.exit(0 if $issue < 0.6 * $md1_08 and $D < 0.6 * $md1_08 else 1)" ||
	fail "measuring from the send ($issue s) or the closed loop ($D s) did not under-report the M/D/1 mean $md1_08 s"
[ "$(jv "$T/issue.json" 'd["runs"][0]["latency_from"]')" = issue ] || fail "the JSON does not say latency_from issue"
pass "measured from the send, the same load reads $issue s and the closed loop $D s: under 60% of $md1_08 s"

# --- evenly spaced arrivals: D/D/1, no wait ------------------------------------
# A slow moment of the machine stretches a few services past the 1.25 D
# gap and the queue forms after all; a miss runs once more (a schedule
# that bunched arrivals would wait in both runs).
for try in 1 2; do
	tb -t 1 -q 1 -T 8 --rate "$rate_08" --arrivals fixed "$slow" >"$T/fixed.json" ||
		fail "--arrivals fixed: $(head -c 300 "$T/fixed.json")"
	fmean=$(jv "$T/fixed.json" 'd["runs"][0]["latency_us"]["avg"]/1e6')
	fS=$(jv "$T/fixed.json" 'd["runs"][0]["service_us"]["avg"]/1e6')
	echo "fixed arrivals at rho 0.8 (try $try): mean $fmean s, service $fS s"
	close "$fmean" "$fS" 0.10 && break
	[ "$try" = 2 ] && fail "fixed arrivals at rho 0.8: mean $fmean s, not within 10% of the service time $fS s (twice)"
done
pass "evenly spaced arrivals at rho 0.8 wait for nothing: mean $fmean s, service $fS s"

# --- percentiles to p99.99 and the max ------------------------------------------
jv "$T/q1-0.8.json" 'd["runs"][0]["latency_us"]' >"$T/lat.txt"
python3 - "$T/q1-0.8.json" <<'PY' || fail "percentiles of the rho 0.8 run are missing or out of order: $(cat "$T/lat.txt")"
import json, sys
l = json.load(open(sys.argv[1]))["runs"][0]["latency_us"]
order = [l[k] for k in ("min", "p50", "p99", "p99_9", "p99_99", "max")]
sys.exit(0 if all(a <= b for a, b in zip(order, order[1:])) and l["max"] > l["p50"] else 1)
PY
"$TB" --no-progress -w 4k-randread --size 4M -T 1 --rate 100 "$slow" >"$T/table.txt" || fail "table run"
grep -q 'p99.99' "$T/table.txt" && grep -q '@100 ' "$T/table.txt" ||
	fail "the table lacks the p99.99 column or the offered rate: $(cat "$T/table.txt")"
pass "percentiles up to p99.99 and the max, in order; the table names the offered rate"

# --- latency against offered load ----------------------------------------------
tb -t 1 -q 64 -T 4 --rates 100,250,400 --label slow --svg "$T/hs.svg" "$slow" >"$T/rates.json" ||
	fail "--rates: $(head -c 300 "$T/rates.json")"
python3 - "$T/rates.json" "$T/hs.svg" <<'PY' || fail "the --rates sweep or its chart is wrong"
import json, re, sys
runs = json.load(open(sys.argv[1]))["runs"]
offered = [r["offered_iops"] for r in runs]
avg = [r["latency_us"]["avg"] for r in runs]
assert offered == [100, 250, 400], offered
assert all(r["rate_sweep"] for r in runs)
assert avg[2] > 1.5 * avg[0], "latency does not rise with the load: %s" % avg
svg = open(sys.argv[2]).read()
assert "Latency vs offered load" in svg
lines = re.findall(r"<polyline class='rate'[^>]* points='([^']*)'", svg)
assert len(lines) == 2, lines  # average and p99 of the one label
for pts in lines:
    xy = [tuple(map(int, p.split(","))) for p in pts.split()]
    assert len(xy) == 3 and xy[0][0] < xy[1][0] < xy[2][0], xy
    assert xy[2][1] < xy[0][1], "the line does not go up (SVG y grows downwards): %s" % xy
print("avg latency at 100/250/400 per s:", avg)
PY
pass "--rates: latency rises with the offered load, and --svg draws it"

# --- two targets in one run ------------------------------------------------------
"$TB" --no-progress -w 4k-randread --size 4M -t 1 -q 1 -T 2 --label slow --label2 fast --compare "$fast" "$slow" \
	>"$T/cmp.txt" || fail "--compare: $(cat "$T/cmp.txt")"
grep -q '^  fast/slow ' "$T/cmp.txt" || fail "no ratio row in the --compare table: $(cat "$T/cmp.txt")"
tb -t 1 -q 1 -T 2 --compare "$fast" "$slow" >"$T/cmp.json" || fail "--compare --json: $(head -c 300 "$T/cmp.json")"
python3 - "$T/cmp.json" <<'PY' || fail "the --compare ratios do not match the runs"
import json, sys
d = json.load(open(sys.argv[1]))
a, b = d["runs"]
c = d["compare"][0]
assert (a["label"], b["label"]) == ("A", "B")
for k in ("avg", "p50", "p99"):
    want = b["latency_us"][k] / a["latency_us"][k]
    assert abs(c[k] - want) <= 0.01 * want + 0.002, (k, c[k], want)
assert abs(c["iops"] - b["iops"] / a["iops"]) <= 0.01 * c["iops"] + 0.002
assert c["p50"] < 0.5, "the plain LUN is not faster than the 2 ms one: %s" % c
print("fast/slow:", c)
PY
pass "--compare: both targets each row, ratios of B over A"

# --- usage -----------------------------------------------------------------------
for bad in "--rate 10 --rates 10,20" "--arrivals fixed" "--rate 0" "--arrivals sometimes --rate 5"; do
	# shellcheck disable=SC2086
	"$TB" -T 1 $bad "$slow" >/dev/null 2>"$T/err" && fail "tierbench $bad was accepted"
	[ "$(wc -l <"$T/err")" = 1 ] || fail "tierbench $bad: not one line: $(cat "$T/err")"
done
pass "bad open-loop options are refused with one line"
ctl leg fault one "$T/leg0.img" ok >/dev/null
tc_stop
