#!/usr/bin/env bash
# One worker writing one command at a time spreads its journal blocks over
# all the rings it owns (cache/journal.c), so checkpoints, due at half a
# ring, stay rare: 2000 random 4 KiB write-back writes at QD1 cost each leg
# the data write and the journal block, and little more. With the worker
# on a single 80-block ring a checkpoint came every 40 writes and each leg
# took 2.4 writes per command here; with its 16 rings 2.03. The
# counts come from the legs' own (tierctl --json status: legs[].io). The
# few writes that land on blocks they made dirty before need no record
# (status: write_no_record) and cost each leg its data write alone: they
# are taken out of the count.
. "$(dirname "$0")/lib.sh"
tc_tmpdir
TB=$TC_ROOT/build/tierbench
[ -x "$TB" ] || skip "build/tierbench is not built"
ctl() { "$TC_ROOT/build/tierctl" -c "$T/t.conf" "$@"; }
jget() { python3 -c "import json,sys; d=json.load(sys.stdin); print(eval(sys.argv[1]))" "$1"; }

port=$(tc_free_port)
url=iscsi://127.0.0.1:$port/iqn.2026-11.io.tiercache:test/0
# 320 MiB legs: 80 journal blocks per ring (meta.c: 1/64 of the leg, 16 rings)
{
	tc_conf_head "$port" | sed 's/^log_level = info$/log_level = info\nworkers = 1/'
	cat <<CONF

[target iqn.2026-11.io.tiercache:test]
lun0 = disk0

[lun disk0]
backing = $T/disk0.img
size = 256M
cache = fast

[cache fast]
legs = $T/leg0.img $T/leg1.img
size = 320M
mode = write-back
seq_cutoff = 0
CONF
} >"$T/t.conf"
tc_start "$T/t.conf"
grep -q "1 worker thread" "$T/daemon.log" || fail "the daemon did not start one worker: $(grep -m1 'worker thread' "$T/daemon.log")"

writes() { ctl --json status | jget '[l["io"]["writes"] for l in d["caches"][0]["legs"]] + [d["caches"][0]["write_no_record"]]' | tr -d '[],'; }
read -r a0 a1 an < <(writes)
n=2000
"$TB" --json --no-progress -b 4k --rand -r 0 -t 1 -q 1 -n $n --size 64M "$url" >"$T/tb.json" ||
	fail "tierbench: $(head -c 300 "$T/tb.json")"
read -r b0 b1 bn < <(writes)
nr=$((bn - an))
per=$(python3 -c "print('%.2f %.2f' % (($b0 - $a0 - $nr) / ($n - $nr), ($b1 - $a1 - $nr) / ($n - $nr)))")
read -r p0 p1 <<<"$per"
echo "leg writes per acknowledged write with a record: leg 0 $p0, leg 1 $p1 ($nr of $n writes needed none)"
python3 -c "import sys; sys.exit(0 if 2.0 <= $p0 <= 2.2 and 2.0 <= $p1 <= 2.2 else 1)" ||
	fail "each leg took $p0 / $p1 writes per QD1 write-back write: expected 2.0-2.2 (data, journal, rare checkpoints)"
pass "QD1 write-back: $p0 / $p1 leg writes per write (data + journal; checkpoints rare)"
tc_stop
