#!/usr/bin/env bash
# A LUN removed from the configuration gives its entry in the cache set's
# table of LUNs back at the next start once its data is clean, and keeps it
# (with a warning naming it) while it has dirty data: two write-back LUNs
# written through the portal; disk1 flushed clean, disk2 left dirty; both
# removed, the daemon restarted: disk1's entry is freed, disk2's kept
# (tierctl stats: luns_known 2 -> 1 + disk2); disk2 configured again reads
# what was written to it.
. "$(dirname "$0")/lib.sh"
tc_tmpdir
command -v qemu-io >/dev/null || skip "qemu-io not installed"
CTL="$TC_ROOT/build/tierctl"
known() { "$CTL" -c "$T/t.conf" --json stats | python3 -c 'import json,sys; print(json.load(sys.stdin)["caches"][0]["luns_known"])'; }
dirty() { "$CTL" -c "$T/t.conf" --json stats | python3 -c 'import json,sys; print(json.load(sys.stdin)["caches"][0]["dirty_bytes"])'; }

port=$(tc_free_port)
iqn=iqn.2026-11.io.tiercache:test
conf() { # conf LUN...: the set, disk0 always, and the LUNs named
	tc_conf_head "$port"
	printf '\n[target %s]\n' "$iqn"
	local i=0 l
	for l in disk0 "$@"; do
		printf 'lun%d = %s\n' "$i" "$l"
		i=$((i + 1))
	done
	for l in disk0 "$@"; do
		printf '\n[lun %s]\nbacking = %s/%s.img\nsize = 16M\ncache = fast\n' "$l" "$T" "$l"
	done
	printf '\n[cache fast]\nlegs = %s/leg0.img %s/leg1.img\nsize = 32M\nmode = write-back\ndestage_max = %s\n' \
		"$T" "$T" "${DESTAGE_MAX:-0}"
}
conf disk1 disk2 >"$T/t.conf"
tc_start "$T/t.conf"
head -c 1M /dev/urandom >"$T/d1"
head -c 1M /dev/urandom >"$T/d2"
# FILE written to LUN at OFFSET in 64 KiB pieces, last first: not one
# sequential stream, so write-back takes it instead of bypassing
put() {
	local f=$1 lun=$2 off=$3 i args=()
	for i in $(seq 15 -1 0); do
		dd if="$f" of="$T/piece$i" bs=64k skip=$i count=1 status=none
		args+=(-c "write -s $T/piece$i $((off + i * 65536)) 64k")
	done
	qemu-io -f raw "${args[@]}" "iscsi://127.0.0.1:$port/$iqn/$lun" >/dev/null
}
put "$T/d1" 1 0 || fail "write disk1"
"$CTL" -c "$T/t.conf" flush --wait >/dev/null || fail "tierctl flush --wait"
expect_eq "$(dirty)" 0 "disk1's data is clean after a flush"
tc_stop
# disk2's data stays dirty: the cleaner moves 64 KiB a second at most
DESTAGE_MAX=64K conf disk1 disk2 >"$T/t.conf"
tc_start "$T/t.conf"
put "$T/d2" 2 65536 || fail "write disk2"
[ "$(dirty)" -gt 0 ] || fail "disk2's data is not dirty"
expect_eq "$(known)" 3 "the set knows three LUNs"
tc_stop

DESTAGE_MAX=64K conf >"$T/t.conf"
tc_start "$T/t.conf"
grep -q 'lun disk1 is not configured and holds no dirty data: its entry is freed' "$T/daemon.log" ||
	fail "the start did not free disk1's entry"
grep -q 'lun disk2 is not configured but has dirty data in the cache; it is kept' "$T/daemon.log" ||
	fail "the start did not warn that disk2's dirty data is kept"
expect_eq "$(known)" 2 "disk1's entry is freed, disk2's (dirty) kept"
tc_stop

conf disk2 >"$T/t.conf"
tc_start "$T/t.conf"
qemu-io -f raw -c "read -P 0 0 64k" "iscsi://127.0.0.1:$port/$iqn/1" >/dev/null || fail "disk2's unwritten start does not read zeros"
"$CTL" -c "$T/t.conf" flush --wait >/dev/null || fail "tierctl flush --wait"
tc_stop
cmp -n 1048576 "$T/d2" <(dd if="$T/disk2.img" bs=64k skip=1 count=16 status=none) ||
	fail "disk2's store does not hold what was written to it after the flush"
pass "disk2, configured again, still had its dirty data, destaged by a flush"
