#!/usr/bin/env bash
# tierctl top in a real terminal (a tmux pane): one LUN is driven at a
# fixed rate R (tierbench --rate R --arrivals fixed: open loop, R commands
# a second whatever the target does) for 8 s, another left idle. While the
# load runs, the pane's row of the driven LUN shows R within 20% (the mean
# of four refreshes), the idle LUN's row shows 0, the write-back LUN's
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
"$TB" --json --no-progress -b 4k --rand -r 70 -t 1 -q 8 -T 8 --rate $rate --arrivals fixed --size 8M "$w" \
	>"$T/tb.json" &
load=$!
# the IOPS column of LUN NAME on the pane, empty when the row is not there
iops_of() { pane | awk -v n="$1" '$1 == n { print $2; exit }'; }
tc_wait_for 30 "the driven LUN's row moving" eval '[ "$(iops_of write-back)" -gt 0 ] 2>/dev/null'
samples=() idle=()
for i in 1 2 3 4; do
	sleep 1.1 # one refresh apart: the pane is redrawn every second
	samples+=("$(iops_of write-back)")
	idle+=("$(iops_of plain)")
	pane >"$T/pane.$i"
done
wait "$load" || fail "tierbench: $(head -c 300 "$T/tb.json")"
got=$(python3 -c 'import json,sys; print("%.0f" % json.load(open(sys.argv[1]))["runs"][0]["iops"])' "$T/tb.json")
# the client kept the rate (else the check below would compare with the wrong R)
python3 -c "import sys; sys.exit(0 if abs($got - $rate) <= 0.05 * $rate else 1)" ||
	fail "tierbench --rate $rate --arrivals fixed did $got IOPS"
want=$rate
# the mean of four consecutive refreshes (a refresh may catch 0.9 or 1.1 s)
mean=$(printf '%s\n' "${samples[@]}" | awk '{ s += $1 } END { printf "%.0f", s / NR }')
echo "tierbench: $rate IOPS offered, $got done; tierctl top: ${samples[*]} (mean $mean); idle LUN: ${idle[*]}"
python3 -c "import sys; sys.exit(0 if abs($mean - $want) <= 0.2 * $want else 1)" ||
	fail "tierctl top shows $mean IOPS for the driven LUN driven at $want (more than 20% off); pane: $(cat "$T/pane.4")"
for v in "${idle[@]}"; do
	[ "$v" = 0 ] || fail "the idle LUN shows $v IOPS; pane: $(cat "$T/pane.4")"
done
grep -E '^write-back ' "$T/pane.4" | awk '{ exit !($10 == 100) }' ||
	fail "the write-back LUN's reads of written blocks are not all hits: $(grep -E '^write-back ' "$T/pane.4")"
grep -E '^write-back .*healthy healthy' "$T/pane.4" >/dev/null ||
	fail "the cache set's row does not show two healthy legs: $(grep -A3 '^CACHE' "$T/pane.4")"
pass "tierctl top under tmux: the LUN driven at $rate IOPS shows $mean, the idle one 0, hits 100%, legs healthy"
