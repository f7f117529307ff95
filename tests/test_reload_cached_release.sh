#!/usr/bin/env bash
# tests/test_reload_cached_release.sh - a cached LUN a reload removes gives
# its entry in the cache set back once nothing of it is dirty, without a
# restart (a set holds CACHE_MAX_BACKINGS entries; before, a removed LUN
# kept its entry, and its volume stayed open, until the next start).
#
# A write-back set whose cleaner is capped at 64 KiB/s, LUNs plain and
# cached on it:
#   - cached removed with 4 MiB dirty: it stays attached (the set still
#     lists it); once the cap is lifted and the data destaged, it is closed
#     and its entry freed, with no reload or restart; configured again, it
#     reads back what was written (from the backing store);
#   - cached removed while clean: closed and its entry freed at once;
#   - cached removed dirty: a reload that puts another LUN on its backing
#     file, or cached itself without the cache, is refused (the destage
#     would land over that LUN's writes);
#   - cached removed dirty and configured again before it was destaged: a
#     new volume is attached and the old one closed (the new one destages
#     the LUN's dirty data), leaving the new one in place: new writes are
#     cached dirty, a flush destages them (dirty 0), and the backing file
#     itself holds every write.
. "$(dirname "$0")/lib.sh"
tc_tmpdir
CTL=$TC_ROOT/build/tierctl
IQN=iqn.2026-12.io.tiercache:rel
port=$(tc_free_port)
write_conf() { # 0: no LUN 1; 1: cached; 2: "other" over cached's file; 3: cached without the cache
	{
		tc_conf_head "$port"
		printf '\n[target %s]\nlun0 = plain\n' "$IQN"
		case $1 in 1 | 3) echo "lun1 = cached" ;; 2) echo "lun1 = other" ;; esac
		printf '\n[lun plain]\nbacking = %s\nsize = 16M\ncache = fast\n' "$T/plain.img"
		[ "$1" = 1 ] && printf '\n[lun cached]\nbacking = %s\nsize = 32M\ncache = fast\n' "$T/cached.img"
		[ "$1" = 2 ] && printf '\n[lun other]\nbacking = %s\nsize = 32M\n' "$T/cached.img"
		[ "$1" = 3 ] && printf '\n[lun cached]\nbacking = %s\nsize = 32M\n' "$T/cached.img"
		cat <<CONF

[cache fast]
legs = $T/leg0.img $T/leg1.img
size = 64M
mode = write-back
dirty_target = 90
destage_max = 64K
CONF
	} >"$T/t.conf.new"
	mv "$T/t.conf.new" "$T/t.conf"
}
ctl() { "$CTL" -c "$T/t.conf" "$@"; }
set_luns() { ctl --json status | python3 -c 'import json,sys; print(" ".join(sorted(l["name"] for l in json.load(sys.stdin)["caches"][0]["luns"])))'; }
dirty_of() { # LUN: its dirty bytes as the set lists it ("-" if not listed)
	ctl --json status | python3 -c '
import json, sys
print(next((l["dirty_bytes"] for l in json.load(sys.stdin)["caches"][0]["luns"] if l["name"] == sys.argv[1]), "-"))' "$1"
}
nlines() { grep -c "$1" "$T/daemon.log"; }
reload() { # WITH-CACHED
	local want=$(($(nlines 'reload: [0-9]* LUN(s) added') + 1)) refusals=$(nlines 'reload refused')
	write_conf "$1"
	kill -HUP "$TC_PID" || fail "cannot send SIGHUP"
	tc_wait_for 60 "reload number $want's summary" \
		sh -c "[ \$(grep -c 'reload: [0-9]* LUN(s) added' '$T/daemon.log') -ge $want ]"
	[ "$(nlines 'reload refused')" = "$refusals" ] || fail "the reload was refused: $(grep -B1 'reload refused' "$T/daemon.log" | tail -2)"
	return 0
}
# refused LUN WHAT: a reload of the file as it is now is refused, saying why LUN may not be
refused() {
	local want=$(($(nlines 'reload refused') + 1))
	kill -HUP "$TC_PID" || fail "cannot send SIGHUP"
	tc_wait_for 60 "the reload refused" sh -c "[ \$(grep -c 'reload refused' '$T/daemon.log') -ge $want ]"
	grep -qF "[lun $1] uses the backing store of lun cached, which a reload removed while the cache still held data of it" \
		"$T/daemon.log" || fail "$2: refused without saying why"
	pass "$2: the reload is refused (the removed LUN's destage would land over it)"
}
url=iscsi://127.0.0.1:$port/$IQN/1
qio() { qemu-io -f raw "$@" "$url" 2>&1; }

write_conf 1
tc_start "$T/t.conf"

# ---- removed dirty: released once destaged ----
out=$(qio -c 'write -P 0x11 0 4M') || fail "write to cached: $out"
[ "$(dirty_of cached)" -gt 0 ] || fail "cached has no dirty data after the write"
pass "cached holds $(dirty_of cached) dirty bytes"
reload 0
grep -q "reload: lun cached removed and drained; its cache volume stays open (unreachable) until its dirty data is destaged" \
	"$T/daemon.log" || fail "no line for the dirty LUN's volume staying open"
expect_eq "$(set_luns)" "cached plain" "the removed LUN with dirty data stays attached to the set"
ctl set fast destage_max 0 >/dev/null || fail "cannot lift the destage cap"
CLOSED='reload: lun cached: its cache volume has nothing left to destage; closed'
FREED='cache fast: lun cached is not configured and holds no dirty data: its entry is freed'
released() { [ "$(nlines "$FREED")" -ge 1 ]; }
tc_wait_for 60 "the removed LUN's entry freed after its destage" released
expect_eq "$(nlines "$CLOSED")" 1 "once destaged, the removed LUN's volume was closed"
expect_eq "$(set_luns)" "plain" "the set no longer holds the removed LUN"
pass "its entry was freed without a restart"
reload 1
out=$(qio -c 'read -P 0x11 0 4M') || fail "read back cached: $out"
[[ "$out" != *"Pattern verification failed"* ]] || fail "cached configured again reads back wrong data: $out"
pass "configured again, cached reads back what was written before its removal"

# ---- removed clean: released at once ----
ctl flush --wait >/dev/null 2>&1 || fail "flush"
reload 0
expect_eq "$(nlines "$CLOSED") $(nlines "$FREED")" "2 2" \
	"removed while clean, cached is closed and its entry freed by the reload itself"
expect_eq "$(set_luns)" "plain" "the set no longer holds it"

# ---- removed dirty, configured again before the destage ----
reload 1
ctl set fast destage_max 65536 >/dev/null || fail "cannot cap the cleaner"
out=$(qio -c 'write -P 0x22 0 4M') || fail "write to cached: $out"
[ "$(dirty_of cached)" -gt 0 ] || fail "the write left nothing dirty"
reload 0
grep -q "reload: lun cached removed and drained; its cache volume stays open (unreachable) until its dirty data is destaged" \
	"$T/daemon.log" || fail "no line for the dirty LUN's volume staying open"
write_conf 2
refused other "another LUN over the file of cached while its dirty data waits"
write_conf 3
refused cached "cached configured again without the cache while its dirty data waits"
attached=$(nlines 'cache fast: lun cached attached')
reload 1
expect_eq "$(nlines 'cache fast: lun cached attached')" $((attached + 1)) "configured again, cached gets a new volume"
old_closed() { [ "$(nlines "$CLOSED")" -ge 3 ]; }
tc_wait_for 30 "the old volume closed, its LUN's dirty data now the new one's to destage" old_closed
pass "the old volume was closed"
expect_eq "$(nlines "$FREED")" 2 "the entry of the LUN configured again was kept"
expect_eq "$(set_luns)" "cached plain" "the set lists cached (its new volume)"
out=$(qio -c 'read -P 0x22 0 4M' -c 'write -P 0x33 4M 1M' -c 'write -P 0x44 8M 2M') || fail "cached: $out"
[[ "$out" != *"Pattern verification failed"* ]] || fail "cached configured again reads back wrong data: $out"
pass "it reads back what was written before"
# the cleaner is still capped: what was just written waits in the cache
[ "$(dirty_of cached)" -ge $((3 << 20)) ] ||
	fail "write-back writes to cached left $(dirty_of cached) bytes dirty: the cache does not hold them"
pass "new writes to cached are held in the cache ($(dirty_of cached) bytes dirty)"
ctl set fast destage_max 0 >/dev/null || fail "cannot lift the destage cap"
ctl flush --wait >/dev/null 2>&1 || fail "flush after the old volume closed"
expect_eq "$(dirty_of cached)" 0 "its dirty data is destaged by a flush"
python3 - "$T/cached.img" <<'PY' || fail "the backing file does not hold what was written to cached"
import sys
d = open(sys.argv[1], 'rb').read(10 << 20)
for off, n, b in ((0, 4 << 20, 0x22), (4 << 20, 1 << 20, 0x33), (8 << 20, 2 << 20, 0x44)):
    assert d[off:off + n] == bytes([b]) * n, (off, b)
PY
pass "the backing file holds every write to cached"
tc_stop
grep -q "stopped cleanly" "$T/daemon.log" || fail "no clean stop"
pass "stopped cleanly"
