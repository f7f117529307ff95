#!/usr/bin/env bash
# Thin provisioning on Ceph: an RBD pool with a quota, seen by hosts over
# iSCSI (libiscsi, tests/tools/scsi_probe.c), on a loopback cluster with a
# manager (the monitors learn a pool's usage from it):
#  - LOG SENSE 0Ch reports the quota as the available resource, and the
#    image's own allocation (fast-diff) as the used one;
#  - data written through a plain LUN past space_warn = 50% of the quota
#    gives the session one UNIT ATTENTION 06/38/07, INFORMATION 16;
#  - the pool at its quota (Ceph marks it full and would hold every write
#    until it has room): a write, an overwrite and an UNMAP get 07/27/07 at
#    once, well inside ceph_timeout, with the whole sense checked; reads go
#    on; status says the pool is full (UNMAP takes the same path in
#    bdev/rbd_io.c; scsi_probe sends no data-out CDBs of its own);
#  - a write-back LUN on the same pool keeps its dirty data on the legs
#    while its destage meets the full pool;
#  - the quota raised: writes are taken again without a restart, the
#    write-back LUN's dirty data lands, and every acknowledged write reads
#    back through the LUNs and from the images directly.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ceph/lib.sh"
tc_tmpdir
command -v qemu-io >/dev/null || fail "qemu-io not installed (qemu-utils, qemu-block-extra)"
tc_build_tool scsi_probe
NO_MGR=0 rbd_cluster_up
CTL=$TC_ROOT/build/tierctl
MiB=1048576
quota=$((24 * MiB))
rbd create --size 64M "$CEPH_POOL/plain" || fail "rbd create plain"
rbd create --size 32M "$CEPH_POOL/cached" || fail "rbd create cached"
rbd info "$CEPH_POOL/plain" | grep -q fast-diff || fail "the image has no fast-diff: $(rbd info "$CEPH_POOL/plain")"
ceph osd pool set-quota "$CEPH_POOL" max_bytes $quota >/dev/null 2>&1 || fail "ceph osd pool set-quota"

port=$(tc_free_port)
iqn=iqn.2026-11.io.tiercache:test
url=iscsi://127.0.0.1:$port/$iqn
{
	tc_conf_head "$port" | sed 's/^\[daemon\]$/&\nspace_interval = 1/'
	cat <<CONF

[target $iqn]
lun0 = disk0
lun1 = disk1

[cache fast]
legs = $T/leg0.img $T/leg1.img
size = 32M
mode = write-back
admit_hits = 1
seq_cutoff = 0
CONF
	rbd_conf_lun disk0 plain "ceph_timeout = 20" "space_warn = 50%"
	rbd_conf_lun disk1 cached "ceph_timeout = 20" "cache = fast"
} >"$T/t.conf"
tc_start "$T/t.conf"
status_rbd() { # FIELD of LUN $2's rbd status
	"$CTL" -c "$T/t.conf" --json status | python3 -c '
import json,sys
for l in json.load(sys.stdin)["luns"]:
    if l["name"] == sys.argv[2]: print(l.get("rbd", {}).get(sys.argv[1], ""))' "$1" "$2"
}
dirty() { # the cache set's dirty bytes (disk1 is its only LUN)
	"$CTL" -c "$T/t.conf" --json status | python3 -c '
import json,sys
print(json.load(sys.stdin)["caches"][0]["dirty_bytes"])'
}
lun_destage() {
	"$CTL" -c "$T/t.conf" --json status | python3 -c '
import json,sys
for c in json.load(sys.stdin)["caches"]:
    for l in c["luns"]:
        if l["name"] == "disk1": print(l.get("destage", ""))'
}
tc_probe_open A "$url/0"
tc_probe_open C "$url/1"

# ---- LOG SENSE 0Ch: the quota is the pool ----
# the manager reports the pool's usage a few seconds after start
lbp() { # sets avail and used (1 MiB sets) from LOG SENSE 0Ch
	tc_probe A cdb 4d004c00000000010000 256
	[ "${reply%% *}" = good ] && [ "$(tc_probe_byte 0)" = $((0x8c)) ] || fail "LOG SENSE 0Ch: $reply"
	avail=-1 used=-1
	[ "$(tc_probe_byte 3)" -ge 12 ] && avail=$(tc_probe_be32 8)
	[ "$(tc_probe_byte 3)" -ge 24 ] && used=$(tc_probe_be32 20)
	true
}
lbp_known() { lbp; [ "$avail" -ge 0 ] && [ "$used" -ge 0 ]; }
tc_wait_for 60 "LOG SENSE 0Ch to report the pool and the image" lbp_known
[ "$avail" -ge 22 ] && [ "$avail" -le 24 ] || fail "LOG SENSE 0Ch: $avail MiB available, want about the 24 MiB quota"
expect_eq "$used" 0 "LOG SENSE 0Ch: the new image has allocated nothing"
pass "LOG SENSE 0Ch: $avail MiB available (the 24 MiB quota), $used used"

# ---- past 50% of the quota: the soft threshold ----
out=$(qemu-io -f raw -c 'write -P 0x5a 0 14M' "$url/0" 2>&1) || fail "qemu-io write of 14 MiB: $out"
tc_wait_for 60 "the daemon to see the pool past 50%" grep -q "lun disk0: the space under rbd:$CEPH_POOL/plain is .* past space_warn = 50%" "$T/daemon.log"
tc_probe A tur
case "$reply" in
"check 6 38 07 info=16 sense="*) ;;
*) fail "after the pool passed 50% of its quota: '$reply' (want UNIT ATTENTION 38/07, INFORMATION 16)" ;;
esac
tc_probe A tur
[ "$reply" = good ] || fail "told twice: $reply"
lbp
[ "$used" -ge 14 ] && [ "$used" -le 16 ] || fail "LOG SENSE 0Ch: the image has $used MiB allocated, want 14-16 after 14 MiB written"
pass "past 50% of the quota: 06/38/07 once, INFORMATION 16; the image's 14 MiB counted as used ($used sets)"

# ---- at the quota: writes fail as out of space, fast ----
# a write-back LUN's dirty data first (absorbed by the legs while there is room)
tc_probe C write 0 2048 c1 # 1 MiB
[ "$reply" = good ] || fail "write-back write: $reply"
out=$(qemu-io -f raw -c 'write -P 0x6b 14M 12M' "$url/0" 2>&1) || fail "qemu-io write of 12 MiB more: $out"
tc_wait_for 60 "the daemon to see the pool full" grep -q "rbd rbd:$CEPH_POOL/plain: pool $CEPH_POOL is full" "$T/daemon.log"
expect_eq "$(status_rbd pool_full disk0)" True "status: disk0's pool is full"
for what in "write 61440 256 33:a write to new space" "write 0 8 34:an overwrite of written blocks"; do
	cmd=${what%%:*}
	t0=$(date +%s.%N)
	tc_probe A $cmd
	secs=$(python3 -c "import time; print('%.1f' % (time.time() - $t0))")
	case "$reply" in "check 7 27 07 "*) ;; *) fail "${what#*:} with the pool full: '$reply' (want 07/27/07)" ;; esac
	sense=${reply##*sense=}
	[[ "$sense" =~ ^[7f]0..07 ]] && [ "${sense:14:2}" = 0a ] && [ "${sense:24:4}" = 2707 ] ||
		fail "sense $sense: want fixed format, key 7, additional length 0Ah, 27/07"
	python3 -c "import sys; sys.exit(0 if $secs < 10 else 1)" || fail "${what#*:} took $secs s to fail (ceph_timeout is 20): it waited on the full pool"
	pass "pool full: ${what#*:} gets 07/27/07 in $secs s ($sense)"
done
tc_probe A read 0 2048 5a
[ "$reply" = good ] || fail "a read with the pool full: $reply"
pass "pool full: reads go on"

# the write-back LUN: a write absorbed by the legs whose destage then meets
# the full pool stays dirty; after that the cache takes only overwrites of
# blocks it holds, and a write to new space gets 07/27/07
tc_probe C write 4096 2048 c2 # 1 MiB at 2 MiB
[ "$reply" = good ] || fail "write-back write with the pool full (before any destage failed): $reply"
"$CTL" -c "$T/t.conf" flush >/dev/null 2>&1
tc_wait_for 60 "disk1's destage to meet the full pool" eval '[ "$(lun_destage)" = "Disk quota exceeded" ]'
[ "$(dirty)" -gt 0 ] || fail "disk1's dirty data is gone while its pool is full"
tc_probe C write 16384 256 c3
case "$reply" in "check 7 27 07 "*) ;; *) fail "disk1: a write to new space with its destage failing: '$reply' (want 07/27/07)" ;; esac
tc_probe C write 4096 256 c4
[ "$reply" = good ] || fail "disk1: an overwrite of cached blocks with the pool full: $reply"
tc_probe C read 4096 256 c4
[ "$reply" = good ] || fail "disk1 reading its overwrite back: $reply"
tc_probe C read 4352 1792 c2
[ "$reply" = good ] || fail "disk1 reading its dirty data back: $reply"
pass "write-back: the destage meets the full pool, $(dirty) bytes stay dirty; new space 07/27/07, overwrites taken"

# ---- the quota raised: writes taken again, dirty data lands ----
ceph osd pool set-quota "$CEPH_POOL" max_bytes 0 >/dev/null 2>&1 || fail "ceph osd pool set-quota 0"
tc_wait_for 60 "the daemon to see room in the pool" grep -q "rbd rbd:$CEPH_POOL/plain: pool $CEPH_POOL has room again" "$T/daemon.log"
expect_eq "$(status_rbd pool_full disk0)" False "status: disk0's pool has room"
tc_wait_for 60 "a write to be taken again" eval 'tc_probe A write 61440 256 33; [ "$reply" = good ]'
tc_probe A read 61440 256 33
[ "$reply" = good ] || fail "reading the write after the quota was raised: $reply"
tc_wait_for 90 "disk1's dirty data to land" eval '[ "$(dirty)" = 0 ]'
pass "quota raised: writes taken again with no restart; disk1's dirty data landed"

for who in A C; do tc_probe_close "$who"; done
tc_stop
out=$(qemu-io -r -f raw -c 'read -P 0x5a 0 14M' -c 'read -P 0x6b 14M 12M' -c 'read -P 0x33 30M 128k' \
	"rbd:$CEPH_POOL/plain:conf=$CEPH_CONF" 2>&1) || fail "qemu-io on the plain image: $out"
[[ "$out" != *"verification failed"* ]] || fail "the plain image does not hold what the LUN acknowledged: $out"
out=$(qemu-io -r -f raw -c 'read -P 0xc1 0 1M' -c 'read -P 0xc4 2M 128k' -c 'read -P 0xc2 2176k 896k' \
	"rbd:$CEPH_POOL/cached:conf=$CEPH_CONF" 2>&1) ||
	fail "qemu-io on the cached image: $out"
[[ "$out" != *"verification failed"* ]] || fail "the cached image does not hold its acknowledged writes: $out"
pass "every acknowledged write is in the images"
