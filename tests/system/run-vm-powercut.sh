#!/bin/bash
# tests/system/run-vm-powercut.sh - power cuts taken from what a real kernel wrote.
#
# The unit power-cut model (tests/unit/test_cache_powercut.c) cuts our own
# submission log. This one is independent of our code: Debian 12's kernel
# boots under qemu (TCG) with one QEMU NVMe drive holding four partitions,
# the LUN's backing store (p1), the cache legs (p2, p3) and the writer's
# acknowledgement log (p4), behind one QEMU blklogwrites node. Every write
# the guest kernel completed on that drive is in one log, in completion
# order. The drive is write-through (QEMU's write-cache=off, and the guest
# kernel is told so: it sends no flush and no FUA, and a completed write is
# durable; QEMU 7.2's blklogwrites does not record FUA, so a write-back
# drive could not be modelled from its log), so every prefix of the log is
# a state a power cut can leave, and the write at the cut can be torn at
# any 512-byte boundary.
#
# In the guest tiercached serves a write-back LUN on p1 cached on p2 + p3,
# and tests/tools/stamp_io writes stamped sectors to it (2 sessions of
# QD 16, 512 B .. 256 KiB, 20% FUA, WCE=0), logging every write it issues
# and every acknowledgement to p4 (O_DSYNC, before the next commands go
# out); then the daemon is killed with -9. On the host,
# tests/system/powercut_replay.py rebuilds the drive at cut points spread
# over the log, each with the write at the cut torn by 8 seeds (printed),
# recovers the daemon from each image (the legs and the backing store as
# files), checks that every write acknowledged in the image's own p4 log
# reads back (or a later write of it), twice, through iSCSI, and after a
# clean stop that both legs hold the same map and bytes
# (tests/tools/leg_read.py compare).
#
# Usage: tests/system/run-vm-powercut.sh [build|run|replay|all]  (default all)
# Env: TC_VM_DIR (default /var/tmp/tiercache-vm; shares the kernel that
#      run-vm-tcmu.sh setup unpacks), BUILD (default build), RUN_SECS=40
#      (the guest's writing time), CUTS=16 SEEDS=8 (the replay), MEM=1024
# Exit: 0 pass, 1 fail, 77 skip (no qemu-system-x86_64 and cannot install it).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
VMDIR=${TC_VM_DIR:-/var/tmp/tiercache-vm}
W=$VMDIR/powercut
MEM=${MEM:-1024}
RUN_SECS=${RUN_SECS:-40}
CUTS=${CUTS:-16}
SEEDS=${SEEDS:-8}
IQN=iqn.2026-11.io.tiercache:powercut
# the drive, in 512-byte sectors: p1 backing 32 MiB, p2 + p3 legs 16 MiB, p4 the writer's log 8 MiB
P1=2048 P1N=65536 P2=67584 P2N=32768 P3=100352 P3N=32768 P4=133120 P4N=16384
DRIVE_SIZE=$((80 << 20))
SECTORS=49152 # the LUN's first 24 MiB are written: more than the cache holds
mkdir -p "$W"
. tests/system/lib-vm.sh

write_init() {
{ vm_init_head; vm_nvme_kick_sh; cat <<EOF; } >"$1"
for ko in \$(cat /etc/modlist); do insmod "\$ko" 2>/dev/null || log "insmod failed: \$ko"; done
ip link set lo up
for i in \$(seq 1 100); do [ -b /dev/nvme0n1p4 ] && break; sleep 0.1; done
log "devices: \$(ls /dev | grep -E '^nvme' | tr '\n' ' ')"
nvme_kick &
# QEMU's drive is write-through (write-cache=off: each write is on the image when it completes) but
# its NVMe controller always reports a volatile write cache: tell the kernel the truth
echo "write through" > /sys/block/nvme0n1/queue/write_cache
log "write cache: \$(cat /sys/block/nvme0n1/queue/write_cache)"
tiercached -c /etc/tiercached.conf > /var/log/tiercached.log 2>&1 &
D=\$!
for i in \$(seq 1 600); do [ -S /run/tiercache/control.sock ] && break; sleep 0.1; done
[ -S /run/tiercache/control.sock ] || { log "RUN-FAILED: the daemon did not start"; cat /var/log/tiercached.log; poweroff -f; }
stamp_io write iscsi://127.0.0.1:3261/$IQN/0 /dev/nvme0n1p4 1 $SECTORS --log-dev --sessions 2 --qd 16 --fua 20 \
	--secs 3600 > /tmp/writer.out 2>&1 &
S=\$!
sleep $RUN_SECS # the workload's length
kill -9 \$D
wait \$S; rc=\$?
log "writer exit \$rc: \$(tail -3 /tmp/writer.out)"
grep -E "error|warning|recover" /var/log/tiercached.log | head -20
[ \$rc = 0 ] && log RUN-DONE || log RUN-FAILED
sync
poweroff -f
EOF
}

write_conf() {
{ vm_conf_head power-cut "$IQN" 127.0.0.1:3261; cat <<EOF; } >"$1"

[lun disk0]
backing = /dev/nvme0n1p1
block_size = 512
cache = fast

[cache fast]
legs = /dev/nvme0n1p2 /dev/nvme0n1p3
extent = 64K
mode = write-back
seq_cutoff = 0
EOF
}

# an MBR with the four primary partitions above
write_mbr() {
	python3 - "$1" $P1 $P1N $P2 $P2N $P3 $P3N $P4 $P4N <<'PY'
import struct, sys
p = [int(x) for x in sys.argv[2:]]
mbr = bytearray(512)
struct.pack_into("<I", mbr, 440, 0x7463706b)  # disk signature
for i in range(4):
    start, n = p[2 * i], p[2 * i + 1]
    # status, CHS first (unused), type 0x83, CHS last (unused), LBA first, sectors
    struct.pack_into("<B3sB3sII", mbr, 446 + 16 * i, 0, b"\xfe\xff\xff", 0x83, b"\xfe\xff\xff", start, n)
mbr[510:512] = b"\x55\xaa"
with open(sys.argv[1], "r+b") as f:
    f.write(mbr)
PY
}

build() {
	[ -x "$BUILD/tiercached" ] && [ -x "$BUILD/tierctl" ] || { echo "FAIL: build $BUILD/tiercached first (make)"; exit 1; }
	cc -std=gnu11 -O2 -Wall -Wextra -o "$W/stamp_io" tests/tools/stamp_io.c -liscsi 2>"$W/cc.log" ||
		{ echo "FAIL: cannot build tests/tools/stamp_io.c: $(head -5 "$W/cc.log")"; exit 1; }
	write_init "$W/init"
	write_conf "$W/tiercached.conf"
	vm_initrd "$W/initrd-root" "$W/init" "$W/tiercached.conf" "virtio_pci nvme crc32c_generic" \
		"$BUILD/tiercached" "$BUILD/tierctl" "$W/stamp_io"
	rm -f "$W/drive.img" "$W/drive0.img" "$W/blk.log"
	truncate -s $DRIVE_SIZE "$W/drive.img"
	write_mbr "$W/drive.img"
	cp --sparse=always "$W/drive.img" "$W/drive0.img" # the drive before the run: where the replay starts
	: >"$W/blk.log"
	echo "initrd: $(stat -c %s "$W/initrd.cpio") bytes, $(wc -l <"$W/modlist.txt") modules"
}

run() {
	# from the drive the replay starts from, with an empty log
	cp --sparse=always "$W/drive0.img" "$W/drive.img"
	: >"$W/blk.log"
	rm -f "$W/serial.log"
	local t0
	t0=$(now)
	timeout $((RUN_SECS * 10 + 600)) qemu-system-x86_64 -accel tcg -cpu max -m "$MEM" -smp 1 -display none \
		-monitor none -serial file:"$W/serial.log" -no-reboot -kernel "$W/vmlinuz" -initrd "$W/initrd.cpio" \
		-append "console=ttyS0 quiet panic=-1$(vm_nvme_append)" \
		-blockdev driver=file,filename="$W/drive.img",node-name=df,cache.no-flush=on \
		-blockdev driver=raw,file=df,node-name=dr \
		-blockdev driver=file,filename="$W/blk.log",node-name=lf,cache.no-flush=on \
		-blockdev driver=blklogwrites,file=dr,log=lf,log-sector-size=512,log-super-update-interval=1,node-name=blw \
		-device nvme,drive=blw,serial=tcpc0,write-cache=off >"$W/qemu.out" 2>&1 || true
	echo "RUN: $(since "$t0") s, log $(stat -c %s "$W/blk.log") bytes"
	grep -E 'PROBE|tiercached:' "$W/serial.log" || true
	grep -q "write cache: write through" "$W/serial.log" ||
		{ echo "FAIL: the guest's drive is not write-through: the model needs every completed write durable"; return 1; }
	grep -q RUN-DONE "$W/serial.log" || { echo "FAIL: the guest run did not finish"; tail -30 "$W/serial.log"; return 1; }
}

replay() {
	python3 tests/system/powercut_replay.py --log "$W/blk.log" --base "$W/drive0.img" --work "$W/replay" \
		--parts $P1:$P1N,$P2:$P2N,$P3:$P3N,$P4:$P4N --cuts "$CUTS" --seeds "$SEEDS" --sectors $SECTORS \
		--daemon "$BUILD/tiercached" --tierctl "$BUILD/tierctl" --stamp-io "$W/stamp_io" --iqn $IQN
}

case "${1:-all}" in
build) build ;;
run) run ;;
replay) replay ;;
all)
	T0=$(now)
	TC_VM_DIR=$VMDIR bash tests/system/run-vm-tcmu.sh setup
	build
	run || exit 1
	rc=0
	replay || rc=$?
	echo "TOTAL: $(since "$T0") s"
	[ $rc = 0 ] && echo "PASS: power cuts replayed from a guest's write log" ||
		echo "FAIL: power cuts replayed from a guest's write log"
	exit $rc
	;;
*) echo "usage: $0 [build|run|replay|all]"; exit 2 ;;
esac
