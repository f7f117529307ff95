#!/usr/bin/env bash
# tierctl top in a real terminal (a tmux pane): one LUN is driven at a
# fixed rate R (tierbench --rate R --arrivals fixed: open loop, R commands
# a second whatever the target does) for 14 s, another left idle. While
# the load runs, the pane's row of the driven LUN shows R within 20% (the
# median of eight refreshes), the idle LUN's row shows 0, the write-back LUN's
# reads are hits, and the cache set's legs are healthy.
. "$(dirname "$0")/lib.sh"
tc_tmpdir
TB=$TC_ROOT/build/tierbench
CTL=$TC_ROOT/build/tierctl
[ -x "$TB" ] && [ -x "$CTL" ] || skip "build/tierbench or build/tierctl is not built"
command -v tmux >/dev/null || skip "tmux is not installed"
port=$(tc_free_port)
iqn=iqn.2026-11.io.tiercache:top
{
	tc_conf_head "$port"
	tc_cu_target_conf "$iqn" write-back
	tc_cu_target_conf "$iqn" plain
} >"$T/t.conf"
tc_start "$T/t.conf"
w=iscsi://127.0.0.1:$port/$iqn-write-back/0
# the blocks the load reads are written first, so its reads are hits
"$TB" --json --no-progress -b 64k --seq -r 0 -t 1 -q 4 -n 128 --size 8M "$w" >"$T/tb0.json" ||
	fail "tierbench fill: $(head -c 300 "$T/tb0.json")"
sock="$T/tmux.sock"
tmux -S "$sock" new-session -d -s top -x 160 -y 40 "$CTL -c $T/t.conf top" || fail "tmux new-session"
trap 'tmux -S "$sock" kill-server 2>/dev/null; _tc_cleanup' EXIT
pane() { tmux -S "$sock" capture-pane -p -t top; }
tc_wait_for 30 "tierctl top on the pane" eval 'pane | grep -q "^LUN .*IOPS"'
rate=300
"$TB" --json --no-progress -b 4k --rand -r 70 -t 1 -q 8 -T 14 --rate $rate --arrivals fixed --size 8M "$w" \
	>"$T/tb.json" &
load=$!
# the IOPS column of LUN NAME on the pane, empty when the row is not there
iops_of() { pane | awk -v n="$1" '$1 == n { print $2; exit }'; }
tc_wait_for 30 "the driven LUN's row moving" eval '[ "$(iops_of write-back)" -gt 0 ] 2>/dev/null'
samples=() idle=()
for i in 1 2 3 4 5 6 7 8; do
	sleep 1.1 # one refresh apart: the pane is redrawn every second
	samples+=("$(iops_of write-back)")
	idle+=("$(iops_of plain)")
	pane >"$T/pane.$i"
done
kill -0 "$load" 2>/dev/null || fail "the load ended before the eighth sample: the samples are not all of it"
wait "$load" || fail "tierbench: $(head -c 300 "$T/tb.json")"
got=$(python3 -c 'import json,sys; print("%.0f" % json.load(open(sys.argv[1]))["runs"][0]["iops"])' "$T/tb.json")
# the client kept the rate (else the check below would compare with the wrong R)
python3 -c "import sys; sys.exit(0 if abs($got - $rate) <= 0.05 * $rate else 1)" ||
	fail "tierbench --rate $rate --arrivals fixed did $got IOPS"
want=$rate
# the median of eight refreshes: a slow moment of the machine makes one
# second low and the next high (the open loop catches up), and a sample
# 1.1 s after the last can read the same refresh twice
mid=$(printf '%s\n' "${samples[@]}" | sort -n | awk '{ v[NR] = $1 } END { printf "%.0f", (v[4] + v[5]) / 2 }')
echo "tierbench: $rate IOPS offered, $got done; tierctl top: ${samples[*]} (median $mid); idle LUN: ${idle[*]}"
python3 -c "import sys; sys.exit(0 if abs($mid - $want) <= 0.2 * $want else 1)" ||
	fail "tierctl top shows $mid IOPS (median) for the LUN driven at $want (more than 20% off); pane: $(cat "$T/pane.8")"
for v in "${idle[@]}"; do
	[ "$v" = 0 ] || fail "the idle LUN shows $v IOPS; pane: $(cat "$T/pane.8")"
done
grep -E '^write-back ' "$T/pane.8" | awk '{ exit !($10 == 100) }' ||
	fail "the write-back LUN's reads of written blocks are not all hits: $(grep -E '^write-back ' "$T/pane.8")"
grep -E '^write-back .*healthy healthy' "$T/pane.8" >/dev/null ||
	fail "the cache set's row does not show two healthy legs: $(grep -A3 '^CACHE' "$T/pane.8")"
pass "tierctl top under tmux: the LUN driven at $rate IOPS shows $mid (median of 8 refreshes), the idle one 0, hits 100%, legs healthy"
