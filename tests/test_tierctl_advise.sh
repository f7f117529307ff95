#!/usr/bin/env bash
# tierctl advise: the read hit ratio each LUN, and the set, would get at 1/4
# to 8 times today's cache size, from the accesses the daemon served.
#  - LUN b reads 8 MiB sequentially three times over (1/8 of it fits in
#    seq_cutoff, so the cache takes only the start of each pass; the rest
#    bypasses): LUN b alone stays under 25% at every size, where a cache
#    that took the passes would hit 2 reads in 3 at 1x and above.
#  - LUN a reads 4 KiB at random over four times the cache's size: a
#    uniform workload, so at size S out of N extents about S/N of reads
#    hit. LUN a alone: 1/4 under 15%, 1x between 15% and 40%, 4x and 8x
#    above 85%, rising from 1/4 to 4x.
#  - The set's curve at 1x is within 5 points of the hit ratio the cache
#    really had over the same reads (status: read hits over reads), which
#    ties the copies to the engine they copy.
#  - --target 90 names a size between 2x and 4.5x for LUN a; the text
#    output has a row per LUN; --reset starts a fresh curve.
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
lun1 = b

[lun a]
backing = $T/a.img
size = 128M
cache = fast

[lun b]
backing = $T/b.img
size = 64M
cache = fast

[cache fast]
legs = $T/leg0.img $T/leg1.img
size = 24M
extent = 64K
mode = write-through
admit_hits = 1
seq_cutoff = 1M
CONF
} >"$T/t.conf"
tc_start "$T/t.conf"
base=iscsi://127.0.0.1:$port/iqn.2026-11.io.tiercache:test
ctl() { "$CTL" -c "$T/t.conf" "$@"; }

ctl --json advise >"$T/a0.json" || fail "tierctl advise: $(cat "$T/a0.json")"
read -r size ext < <(python3 -c '
import json, sys
c = json.load(open(sys.argv[1]))["advice"][0]
print(c["size_bytes"], c["extent_size"])' "$T/a0.json")
[ "$ext" = 65536 ] || fail "advise gives extent_size $ext, the config 64K"
echo "today's cache: $size bytes, $((size / ext)) extents"

# b: three sequential passes over 8 MiB
"$TB" --seq -r 100 -b 128k -t 1 -q 1 --size 8M -n 192 --no-progress "$base/1" >"$T/b.out" 2>&1 ||
	fail "tierbench on b: $(tail -3 "$T/b.out")"
# a: uniform random 4 KiB reads over 4 x the cache
span=$((size * 4 / 1048576))M
"$TB" --rand -r 100 -b 4k -t 1 -q 4 --size "$span" -n 40000 --no-progress "$base/0" >"$T/a.out" 2>&1 ||
	fail "tierbench on a: $(tail -3 "$T/a.out")"

ctl --json advise --target 90 >"$T/a1.json" || fail "tierctl advise --target 90: $(cat "$T/a1.json")"
ctl --json status >"$T/st.json" || fail "tierctl status"
python3 - "$T/a1.json" "$T/st.json" <<'PY' || fail "the advisor's curves"
import json, sys
adv = json.load(open(sys.argv[1]))["advice"][0]
st = json.load(open(sys.argv[2]))["caches"][0]
luns = {l["name"]: l for l in adv["luns"]}
assert set(luns) == {"a", "b"}, "LUN curves: %s" % sorted(luns)
pct = lambda v: ["%.1f" % (100 * x) for x in v]
a, b, s = luns["a"]["hit_ratio"], luns["b"]["hit_ratio"], adv["set"]["hit_ratio"]
print("a alone:  ", pct(a))
print("b alone:  ", pct(b))
print("the set:  ", pct(s))
ok = True
def check(cond, what):
    global ok
    print(("ok: " if cond else "FAIL: ") + what)
    ok = ok and cond
check(luns["a"]["reads_sampled"] >= 10000 and luns["b"]["reads_sampled"] >= 100,
      "both curves are built from reads: a %d, b %d sampled" % (luns["a"]["reads_sampled"], luns["b"]["reads_sampled"]))
check(max(b) < 0.25, "b's sequential passes bypass at every size (max %.1f%%)" % (100 * max(b)))
check(a[0] < 0.15, "a at 1/4: %.1f%% (under 15%%)" % (100 * a[0]))
check(0.15 <= a[2] <= 0.40, "a at 1x: %.1f%% (15 to 40%%)" % (100 * a[2]))
check(a[4] > 0.85 and a[5] > 0.85, "a at 4x and 8x: %.1f%% and %.1f%% (over 85%%)" % (100 * a[4], 100 * a[5]))
check(all(a[i] < a[i + 1] for i in range(4)), "a rises from 1/4 to 4x")
reads = st["read_hits"] + st["read_misses"] + st["read_partial"]
real = st["read_hits"] / reads
check(abs(s[2] - real) <= 0.05, "the set at 1x: %.1f%%, the cache really had %.1f%% over %d reads" %
      (100 * s[2], 100 * real, reads))
t = luns["a"]["size_for_target"]
check(t is not None and 2 * adv["size_bytes"] < t < 4.5 * adv["size_bytes"],
      "90%% for a needs %s bytes: %.2fx today's" % (t, (t or 0) / adv["size_bytes"]))
sys.exit(0 if ok else 1)
PY
pass "advise: LUN a's uniform reads and LUN b's passes give the expected curves; the set's 1x matches the real hit ratio"

ctl advise --target 90 >"$T/text.out" || fail "tierctl advise (text)"
cat "$T/text.out"
grep -q "^  read hit ratio at .*1/4 .*8x" "$T/text.out" || fail "no row of sizes in the text output"
grep -q "^  lun a alone  " "$T/text.out" && grep -q "^  lun b alone  " "$T/text.out" &&
	grep -q "^  set fast (all LUNs)" "$T/text.out" || fail "the text output lacks a row per LUN and the set"
grep -q "90% needs about" "$T/text.out" || fail "the text output does not say what 90% needs"
pass "advise prints a row per LUN and the set under the six sizes, and what 90% needs"

ctl advise --reset >/dev/null || fail "tierctl advise --reset"
reads=$(ctl --json advise | python3 -c 'import json,sys; print(json.load(sys.stdin)["advice"][0]["set"]["reads_sampled"])')
[ "$reads" = 0 ] || fail "after --reset the set's curve still counts $reads reads"
ctl advise nosuch >"$T/err.out" 2>&1 && fail "advise of a set that does not exist succeeded"
grep -q "no cache set named nosuch" "$T/err.out" || fail "advise nosuch: $(cat "$T/err.out")"
pass "advise --reset starts a fresh curve; an unknown set is refused by name"
exit 0
