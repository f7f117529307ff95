#!/usr/bin/env bash
# A LUN on a Ceph RBD image (a real single-OSD cluster on 127.0.0.1) passes
# libiscsi's SCSI Read*, Write*, WriteVerify*, CompareAndWrite, Unmap and
# WriteSame families, twice: on the image alone, and with a write-through
# cache set in front of another image. 0 failures each. Then the cached
# image is grown with `rbd resize`: the LU follows, and a restart accepts
# the grown image (the cache set recorded the new size).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ceph/lib.sh"
tc_tmpdir
command -v iscsi-test-cu >/dev/null || fail "iscsi-test-cu not installed (libiscsi-bin)"
rbd_cluster_up

rbd create --size 64M "$CEPH_POOL/plain" || fail "rbd create plain"
rbd create --size 64M "$CEPH_POOL/cached" || fail "rbd create cached"

port=$(tc_free_port)
iqn=iqn.2026-11.io.tiercache:test
{
	tc_conf_head "$port"
	cat <<CONF

[target $iqn]
lun0 = plain
lun1 = cached

[cache fast]
legs = $T/leg0.img $T/leg1.img
size = 64M
extent = 256K
mode = write-through
admit_hits = 1
CONF
	rbd_conf_lun plain plain
	rbd_conf_lun cached cached "cache = fast"
} >"$T/t.conf"
tc_start "$T/t.conf"

families=SCSI.Read6,SCSI.Read10,SCSI.Read12,SCSI.Read16,SCSI.ReadCapacity10,SCSI.ReadCapacity16
families+=,SCSI.Write10,SCSI.Write12,SCSI.Write16,SCSI.WriteVerify10,SCSI.WriteVerify12,SCSI.WriteVerify16
families+=,SCSI.CompareAndWrite,SCSI.Unmap,SCSI.WriteSame10,SCSI.WriteSame16
min_tests=80
# TC_RBD_CU_TESTS=SCSI.Read10,... runs only those (for debugging)
[ -n "${TC_RBD_CU_TESTS:-}" ] && families=$TC_RBD_CU_TESTS min_tests=1

# both LUNs at once (distinct initiator names, so no session replaces
# another): the suite is latency-bound, one command at a time
for lun in 0 1; do
	timeout 900 iscsi-test-cu --dataloss -i "iqn.2026-11.test:lun$lun-a" -I "iqn.2026-11.test:lun$lun-b" \
		-t "$families" "iscsi://127.0.0.1:$port/$iqn/$lun" >"$T/cu$lun.log" 2>&1 &
	cu_pid[$lun]=$!
done
wait "${cu_pid[0]}" "${cu_pid[1]}"
kill -0 "$TC_PID" 2>/dev/null || fail "tiercached died during the suite"
for lun in 0 1; do
	what="LUN $lun ($([ $lun = 0 ] && echo "RBD image alone" || echo "write-through cache on RBD"))"
	cp "$T/cu$lun.log" "$TC_ROOT/build/test-logs/cu-rbd-lun$lun.log" 2>/dev/null
	sum=$(python3 "$TC_ROOT/tests/tools/cu_summary.py" "$T/cu$lun.log" --names)
	echo "$what: $sum"
	line=$(echo "$sum" | head -1)
	total=$(echo "$line" | awk '{print $2}')
	failed=$(echo "$line" | awk '{print $6}')
	[ -n "$total" ] && [ "$total" -ge "$min_tests" ] || fail "$what: only '$total' tests ran; see $T/cu$lun.log"
	expect_eq "$failed" 0 "iscsi-test-cu failures on $what"
done

# an image grown under the cache set: the LU follows, and the set's record
# of its backing store too, so the next start still accepts the image
rbd resize --size 80M "$CEPH_POOL/cached" >/dev/null 2>&1 || fail "rbd resize"
tc_wait_for 60 "the cached LUN following rbd resize" \
	grep -q "lun cached: capacity now 163840 blocks" "$T/daemon.log"
pass "the cached LUN follows rbd resize"
# No wait for the superblock write the resize started: the set's record of
# the size changed before the LU logged its capacity, and the checkpoint of
# a clean stop writes the superblock again (after any write in flight).
tc_stop
: >"$T/daemon.log"
tc_start "$T/t.conf"
grep -q "lun cached: rbd:$CEPH_POOL/cached, 83886080 bytes" "$T/daemon.log" ||
	fail "after a restart the cached LUN did not open on the grown image"
pass "after a restart the cache set accepts the grown image"
tc_stop
