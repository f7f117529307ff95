#!/usr/bin/env bash
# A partly valid extent keeps its state per 4 KiB page (16 bytes per 256 KiB
# slot) and moves to per-sector bitmaps (128 bytes) only when a change
# splits a page (cache/map.c). Through the daemon, on a write-back LUN of
# 512-byte blocks whose cache is smaller than the written range:
#  - random 4 KiB writes (verified) leave status sector_grain_slots at 0
#    while many slots are partly valid: the RAM figure holds for hosts that
#    write whole pages;
#  - after a kill -9 (journal replay) and after a clean restart (the slot
#    table), still 0: recovery rebuilds page-aligned state at page grain;
#  - random 512-byte writes then move slots to per-sector state (count > 0)
#    and every read returns what was written.
. "$(dirname "$0")/lib.sh"
tc_tmpdir
TB=$TC_ROOT/build/tierbench
[ -x "$TB" ] || skip "build/tierbench is not built"
CTL=$TC_ROOT/build/tierctl
port=$(tc_free_port)
url=iscsi://127.0.0.1:$port/iqn.2026-11.io.tiercache:test/0
tc_basic_conf "$port" 64M >"$T/t.conf"
cat >>"$T/t.conf" <<CONF
cache = fast

[cache fast]
legs = $T/leg0.img $T/leg1.img
size = 32M
mode = write-back
admit_hits = 1
CONF

field() {
	"$CTL" -c "$T/t.conf" --json status | python3 -c 'import json,sys; print(json.load(sys.stdin)["caches"][0]["'"$1"'"])'
}
# writes N commands of BS at random over the LUN, then (with a fourth
# argument, verify) reads all of them back
load() {
	"$TB" --json --no-progress -b "$1" --rand -r 0 -t 2 -q 4 -n "$2" --seed "$3" ${4:+--verify} "$url" >"$T/tb.json" ||
		fail "tierbench $1 writes: $(head -c 300 "$T/tb.json")"
}
tc_start "$T/t.conf"
load 4k 6000 11 verify
g=$(field sector_grain_slots)
[ "$g" = 0 ] || fail "after 4 KiB writes $g slots keep per-sector state (want 0: whole pages stay at page grain)"
dirty=$(field dirty_bytes)
[ "$dirty" -gt 0 ] || fail "the 4 KiB writes left no dirty data (dirty_bytes $dirty): the test runs nothing"
pass "6000 random 4 KiB write-back writes verified: $dirty dirty bytes, 0 slots at sector grain"

kill -KILL "$TC_PID"
wait "$TC_PID" 2>/dev/null
TC_PID=
tc_start "$T/t.conf"
g=$(field sector_grain_slots)
[ "$g" = 0 ] || fail "after the journal replay $g slots keep per-sector state (want 0)"
tc_stop
tc_start "$T/t.conf"
g=$(field sector_grain_slots)
[ "$g" = 0 ] || fail "after loading the slot table $g slots keep per-sector state (want 0)"
pass "kill -9, then a clean restart: still 0 slots at sector grain"

# counted right after the writes: reading a partly valid slot tops it up
# (it becomes whole and leaves sector grain), so after a verify pass the
# count depends on how far the top-ups got
load 512 6000 12
g=$(field sector_grain_slots)
[ "$g" -gt 0 ] || fail "after 512-byte writes no slot keeps per-sector state: the split is not counted"
load 512 6000 13 verify
pass "6000 random 512-byte writes: $g slots at sector grain; 6000 more verified"
tc_stop
