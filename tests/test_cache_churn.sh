#!/usr/bin/env bash
# A cache under churn stays full: uniform random 4 KiB reads over four
# times the cache's size hit about a quarter of the time (S/N for S slots
# and N extents: any policy that keeps the cache full gets that much).
#
# Eviction frees a slot only once its FREE record is durable and a grace
# period has passed; misses that found the free pool empty meanwhile each
# evicted another batch, so under a miss storm the cache emptied itself
# again and again and hit 0.5% of these reads. The reclaim now counts the
# slots on their way to the free list. Checked through the daemon: the
# set's read hit ratio (status) is at least 15%, and the cache holds at
# least 3/4 of its slots at the end.
#
# Then a sequential scan through that cache: hits are steps of the stream
# too, so past seq_cutoff its misses bypass (status seq_bypassed) instead of
# being admitted after every hit, which cut the stream. Last, a new hot
# set still gets into the full cache.
. "$(dirname "$0")/lib.sh"
tc_tmpdir
TB=$TC_ROOT/build/tierbench
CTL=$TC_ROOT/build/tierctl
[ -x "$TB" ] && [ -x "$CTL" ] || skip "build/tierbench or build/tierctl is not built"
port=$(tc_free_port)
{
	tc_conf_head "$port"
	cat <<CONF

[target iqn.2026-11.io.tiercache:test]
lun0 = a

[lun a]
backing = $T/a.img
size = 128M
cache = fast

[cache fast]
legs = $T/leg0.img $T/leg1.img
size = 24M
extent = 64K
mode = write-through
admit_hits = 1
CONF
} >"$T/t.conf"
tc_start "$T/t.conf"
base=iscsi://127.0.0.1:$port/iqn.2026-11.io.tiercache:test
stat() { "$CTL" -c "$T/t.conf" --json status | python3 -c "
import json, sys
c = json.load(sys.stdin)['caches'][0]
print(c['slots'], c['slots_used'], c['read_hits'], c['read_hits'] + c['read_misses'] + c['read_partial'], c['evictions'])"; }
set -- $(stat)
span=$(($1 * 4 * 64))K
"$TB" --rand -r 100 -b 4k -t 1 -q 4 --size "$span" -n 40000 --no-progress "$base/0" >"$T/tb.out" 2>&1 ||
	fail "tierbench: $(tail -3 "$T/tb.out")"
set -- $(stat)
slots=$1 used=$2 hits=$3 reads=$4 evictions=$5
pct=$((100 * hits / reads))
echo "$slots slots, $used in use; $hits of $reads reads hit ($pct%); $evictions evictions"
[ "$pct" -ge 15 ] || fail "uniform reads over 4x the cache hit $pct% (want about 25%, at least 15%)"
[ $((4 * used)) -ge $((3 * slots)) ] || fail "the cache holds $used of $slots slots after the churn"
pass "uniform reads over 4x the cache: $pct% hit, $used of $slots slots in use, $evictions evictions"

# A backup reading through the cached extents is one stream: past
# seq_cutoff (4M) its misses bypass, instead of a new stream starting
# after each hit (a quarter of the extents are cached: a stream cut at
# every hit would almost never grow past 4M). 32 MiB is 512 extents,
# about 380 of them misses.
bypassed() { "$CTL" -c "$T/t.conf" --json status | python3 -c 'import json,sys; print(json.load(sys.stdin)["caches"][0]["seq_bypassed"])'; }
s0=$(bypassed)
"$TB" --seq -r 100 -b 128k -t 1 -q 1 --size 32M -n 256 --no-progress "$base/0" >"$T/scan.out" 2>&1 ||
	fail "tierbench scan: $(tail -3 "$T/scan.out")"
s1=$(bypassed)
[ $((s1 - s0)) -ge 100 ] || fail "a 32 MiB scan through cached extents: only $((s1 - s0)) misses bypassed as sequential"
pass "a 32 MiB scan through cached extents stays one stream: $((s1 - s0)) misses bypassed as sequential"

# The cache is full of the churn's extents: a new small hot set (32
# extents, past the span above) still gets in, so eviction still frees
# slots after all that (slots counted on their way to the free list must
# also leave that count, or the reclaim would think it has room forever).
set -- $(stat)
h0=$3 r0=$4
"$TB" --rand -r 100 -b 4k -t 1 -q 1 --offset 100M --size 2M -n 6000 --no-progress "$base/0" >"$T/hot.out" 2>&1 ||
	fail "tierbench hot set: $(tail -3 "$T/hot.out")"
set -- $(stat)
hot=$((100 * ($3 - h0) / ($4 - r0)))
[ "$hot" -ge 60 ] || fail "a new hot set of 32 extents in a full cache: $hot% of 6000 reads hit (want 60% or more)"
pass "a new hot set of 32 extents in the full cache: $hot% of 6000 reads hit"
exit 0
