#!/bin/bash
# tests/system/run-vm-tcmu.sh - tiercached behind the kernel's LIO target, on a
# real kernel, with real (emulated) NVMe drives.
#
# Why: the TCMU front end, libtcmu, target_core_user and libnvme can only be
# proven against a real kernel, and the build machines have no kernel modules,
# no configfs and no KVM. So we boot Debian 12's stock kernel under
# qemu-system-x86_64 (TCG) with an initramfs holding busybox, the modules and
# build/tiercached + build/tierctl with their shared libraries (found by ldd).
# The guest has two QEMU NVMe controllers (the cache set's mirrored legs) and a
# virtio disk (the LUN's backing store). Its init loads LIO + target_core_user
# + iscsi_target_mod, starts tiercached with [tcmu] enable = yes, and creates
# the LIO objects through configfs the way rtslib/targetcli do: a user backstore
# with dev_config tiercache/vm0, an iSCSI target, LUN 0, an open TPG.
#
# From the host, through a user-mode port forward to LIO's portal:
#   - iscsi-inq shows our INQUIRY and VPD data (vendor TIERCACH, our serial),
#   - qemu-img writes 16 MiB of random data and reads it back, equal sha256,
#   - a handful of iscsi-test-cu tests pass,
# and inside the guest:
#   - tierctl status shows the LIO device's command counters and the NVMe legs'
#     model, serial, firmware and SMART data read with libnvme,
#   - the daemon log shows the commands arrived through the TCMU ring.
# tiercached's own portal listens on 127.0.0.1:3261 inside the guest only, which
# the host cannot reach: every command the host sends goes through LIO.
#
# Usage: tests/system/run-vm-tcmu.sh [setup|build|boot|check|stop|all]  (default all)
# Env: TC_VM_DIR (work dir, default /var/tmp/tiercache-vm), BUILD (default build),
#      PORT=13262 DBGPORT=12325 MEM=1024 KEEP=1 (leave the VM running)
# Exit: 0 pass, 1 fail, 77 skip (no qemu-system-x86_64 and cannot install it).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
BUILD=${BUILD:-build}
W=${TC_VM_DIR:-/var/tmp/tiercache-vm}
PORT=${PORT:-13262}
DBGPORT=${DBGPORT:-12325}
MEM=${MEM:-1024}
IQN=iqn.2026-11.io.tiercache:vmtest
URL=iscsi://127.0.0.1:$PORT/$IQN/0
SERIAL=tcvm0001
BACKING_SIZE=67108864
LEG_SIZE=67108864
mkdir -p "$W"
VMDIR=$W # lib-vm.sh: where the kernel is
. tests/system/lib-vm.sh

setup() {
	local need=()
	command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
	[ -x /bin/busybox ] && /bin/busybox --list 2>/dev/null | grep -qx insmod || need+=(busybox-static)
	command -v cpio >/dev/null || need+=(cpio)
	command -v depmod >/dev/null || need+=(kmod)
	command -v socat >/dev/null || need+=(socat)
	command -v iscsi-inq >/dev/null || need+=(libiscsi-bin)
	command -v qemu-img >/dev/null || need+=(qemu-utils qemu-block-extra)
	if [ ${#need[@]} -gt 0 ]; then
		echo "installing: ${need[*]}"
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null ||
			{ echo "SKIP: cannot install ${need[*]}"; exit 77; }
	fi
	if [ ! -d "$W/kroot/boot" ]; then
		mkdir -p "$W/debs" "$W/kroot"
		local kpkg
		kpkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
		[ -n "$kpkg" ] || { apt-get update -qq; kpkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}'); }
		(cd "$W/debs" && apt-get download -qq "$kpkg" 2>/dev/null)
		dpkg -x "$W"/debs/linux-image-*.deb "$W/kroot"
	fi
}

write_init() {
{ vm_init_head; vm_nvme_kick_sh; cat <<'EOF'; } >"$1"
log init-start
for ko in $(cat /etc/modlist); do insmod "$ko" 2>/dev/null || log "insmod failed: $ko"; done
mount -t configfs configfs /sys/kernel/config
ip link set lo up; ip link set eth0 up
ip addr add 10.0.2.15/24 dev eth0; ip route add default via 10.0.2.2
nc -ll -p 2323 -e /bin/sh &
for i in $(seq 1 100); do [ -b /dev/nvme1n1 ] && [ -b /dev/vda ] && break; sleep 0.1; done
log "devices: $(ls /dev | grep -E '^(nvme|vd)' | tr '\n' ' ')"
nvme_kick &

tiercached -c /etc/tiercached.conf > /var/log/tiercached.log 2>&1 &
for i in $(seq 1 300); do [ -S /run/tiercache/control.sock ] && break; sleep 0.1; done
[ -S /run/tiercache/control.sock ] || { log "TARGET-FAILED: tiercached did not start"; cat /var/log/tiercached.log; sleep 100000; }
log tiercached-ready

C=/sys/kernel/config/target
D=$C/core/user_0/vm0                        # HBA user_N = target_core_user
SIZE=$(cat /sys/block/vda/size); SIZE=$((SIZE * 512))
mkdir -p $D
echo -n "dev_config=tiercache/vm0" > $D/control
echo -n "dev_size=$SIZE" > $D/control
echo -n "tcvm0001" > $D/wwn/vpd_unit_serial
echo -n 1 > $D/enable || { log "TARGET-FAILED: enable refused"; cat /var/log/tiercached.log; sleep 100000; }
T=$C/iscsi/iqn.2026-11.io.tiercache:vmtest/tpgt_1
mkdir -p $T/lun/lun_0
ln -s $D $T/lun/lun_0/vm0
mkdir $T/np/0.0.0.0:3260
echo 1 > $T/attrib/generate_node_acls
echo 0 > $T/attrib/demo_mode_write_protect
echo 0 > $T/attrib/authentication
echo 1 > $T/attrib/cache_dynamic_acls
echo 1 > $T/enable
log TARGET-READY $(head -1 $D/info)
sleep 100000
EOF
}

write_conf() {
cat >"$1" <<'EOF'
; tiercached.conf of the system test guest
[daemon]
state_dir = /var/lib/tiercache
control_socket = /run/tiercache/control.sock
log_level = info

[portal]
; LIO owns 0.0.0.0:3260 in this guest; our own portal stays local
listen = 127.0.0.1:3261

[cache fast]
legs = /dev/nvme0n1 /dev/nvme1n1

[lun vm0]
backing = /dev/vda
block_size = 512
serial = tcvm0001
cache = fast
; LIO's cmd_time_out of the device follows it: 7 + 2 s
io_timeout = 7

[tcmu]
enable = yes
EOF
}

build() {
	[ -x "$BUILD/tiercached" ] && [ -x "$BUILD/tierctl" ] || { echo "FAIL: build $BUILD/tiercached first (make)"; exit 1; }
	write_conf "$W/tiercached.conf"
	write_init "$W/init"
	vm_initrd "$W/initrd-root" "$W/init" "$W/tiercached.conf" \
		"configfs target_core_mod uio target_core_user iscsi_target_mod virtio_pci virtio_net virtio_blk nvme crc32c_generic" \
		"$BUILD/tiercached" "$BUILD/tierctl"
	rm -f "$W/backing.img" "$W/nvme0.img" "$W/nvme1.img"
	truncate -s $BACKING_SIZE "$W/backing.img"
	truncate -s $LEG_SIZE "$W/nvme0.img"
	truncate -s $LEG_SIZE "$W/nvme1.img"
	echo "initrd: $(stat -c %s "$W/initrd.cpio") bytes, $(wc -l <"$W/modlist.txt") modules, $(wc -l <"$W/liblist.txt") libraries"
}

boot() {
	rm -f "$W/serial.log"
	local t0
	t0=$(now)
	qemu-system-x86_64 -accel tcg -cpu max -m "$MEM" -smp 1 -display none -monitor none \
		-serial file:"$W/serial.log" -no-reboot -kernel "$W/vmlinuz" -initrd "$W/initrd.cpio" \
		-append "console=ttyS0 quiet panic=-1$(vm_nvme_append)" \
		-drive file="$W/backing.img",if=virtio,format=raw,cache=unsafe \
		-drive file="$W/nvme0.img",if=none,id=nv0,format=raw,cache=unsafe \
		-device nvme,serial=tcleg0,drive=nv0 \
		-drive file="$W/nvme1.img",if=none,id=nv1,format=raw,cache=unsafe \
		-device nvme,serial=tcleg1,drive=nv1 \
		-netdev user,id=n0,hostfwd=tcp:127.0.0.1:$PORT-:3260,hostfwd=tcp:127.0.0.1:$DBGPORT-:2323 \
		-device virtio-net-pci,netdev=n0 >"$W/qemu.out" 2>&1 &
	echo $! >"$W/qemu.pid"
	local rc=0
	vm_wait_ready "$W/serial.log" "$W/qemu.pid" 900 || rc=1
	echo "BOOT: qemu start -> target ready: $(since "$t0") s"
	grep -E 'PROBE|tiercached:' "$W/serial.log" || true
	return $rc
}

gsh() { printf '%s\nexit\n' "$*" | socat -t 60 - TCP:127.0.0.1:$DBGPORT; }

RC=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; RC=1; }

check() {
	local t0 out
	echo "== iscsi-inq (standard INQUIRY and VPD 0x80 through LIO)"
	out=$(iscsi-inq "$URL" 2>&1) || true
	echo "$out" | grep -E 'Vendor|Product|Device Type'
	echo "$out" | grep -q 'TIERCACH' && ok "INQUIRY vendor is TIERCACH (our backstore answered, not LIO)" || bad "INQUIRY: $out"
	out=$(iscsi-inq -e 1 -c 128 "$URL" 2>&1) || true
	echo "$out"
	echo "$out" | grep -q "Unit Serial Number:\[$SERIAL\]" && ok "VPD 0x80 unit serial is $SERIAL" || bad "VPD 0x80: $out"
	out=$(iscsi-inq -e 1 -c 0 "$URL" 2>&1) || true
	echo "$out"
	echo "$out" | grep -q "LOGICAL_BLOCK_PROVISIONING" && ok "VPD 0x00 lists our pages (B0, B1, B2)" || bad "VPD 0x00: $out"

	echo "== write then read back 16 MiB of random data through iSCSI -> LIO -> TCMU -> tiercached"
	head -c 16M /dev/urandom >"$W/data.raw"
	t0=$(now)
	qemu-img convert -n -f raw -O raw "$W/data.raw" "$URL" || bad "qemu-img write"
	echo "write: $(since "$t0") s"
	rm -f "$W/back.raw"
	t0=$(now)
	qemu-img dd -f raw -O raw bs=1M count=16 if="$URL" of="$W/back.raw" || bad "qemu-img read"
	echo "read: $(since "$t0") s"
	sha256sum "$W/data.raw" "$W/back.raw"
	cmp -s "$W/data.raw" "$W/back.raw" && ok "16 MiB read back equal (sha256 above)" || bad "data read back differs"

	echo "== 2000 random 4 KiB reads, 32 in parallel (qemu-img bench)"
	t0=$(now)
	qemu-img bench -c 2000 -d 32 -s 4096 -f raw "$URL" || bad "qemu-img bench"
	echo "bench: $(since "$t0") s"

	echo "== iscsi-test-cu"
	local t
	for t in SCSI.TestUnitReady.Simple SCSI.Inquiry.Standard SCSI.ReadCapacity16.Simple SCSI.Read10.Simple \
		SCSI.Write10.Simple SCSI.Read16.Simple SCSI.Write16.Simple SCSI.Write10.BeyondEol; do
		t0=$(now)
		if iscsi-test-cu -s -f --dataloss --test=$t "$URL" >"$W/cu-$t.log" 2>&1; then
			ok "$t ($(since "$t0") s)"
		else
			bad "$t"
			tail -15 "$W/cu-$t.log"
		fi
	done

	echo "== inside the guest"
	# reconfig from LIO: write cache on (accepted), a different size (refused);
	# a second backstore naming a LUN we do not have (refused at enable)
	gsh 'C=/sys/kernel/config/target/core/user_0
echo 1 > $C/vm0/attrib/emulate_write_cache && echo WCE-SET-OK
echo 33554432 > $C/vm0/attrib/dev_size || echo SIZE-REFUSED
mkdir $C/bad; echo -n dev_config=tiercache/nosuch > $C/bad/control; echo -n dev_size=1048576 > $C/bad/control
echo -n 1 > $C/bad/enable || echo BAD-ENABLE-REFUSED; rmdir $C/bad' >"$W/reconfig.out" 2>&1 || true
	cat "$W/reconfig.out"
	out=$(gsh 'tierctl status; echo ===LOG; cat /var/log/tiercached.log; echo ===INFO; cat /sys/kernel/config/target/core/user_0/vm0/info; cat /sys/class/uio/uio0/name; echo CMD_TIME_OUT=$(cat /sys/kernel/config/target/core/user_0/vm0/attrib/cmd_time_out); echo KERNEL=$(uname -r)')
	echo "$out"
	echo "$out" | grep -q "first command from LIO through the TCMU ring" && ok "daemon log: commands arrived through the TCMU ring" || bad "no TCMU ring line in the daemon log"
	# Debian 12's kernel (6.1) has what the one wait point needs (5.11, 5.19)
	echo "$out" | grep -q "waiting in io_uring (one wait point)" &&
		ok "daemon log: on the guest's $(echo "$out" | sed -n 's/^KERNEL=//p' | tr -d '\r') kernel the workers wait in io_uring, the TCMU ring's fd polled there" ||
		bad "the workers do not wait in io_uring on the guest's kernel: $(echo "$out" | grep -m1 'workers, waiting')"
	echo "$out" | grep -q "attached to \[lun vm0\]" && ok "daemon log: LIO device attached to [lun vm0]" || bad "no attach line"
	grep -q WCE-SET-OK "$W/reconfig.out" && echo "$out" | grep -q "write cache of \[lun vm0\] turned on" &&
		ok "reconfig: LIO emulate_write_cache=1 turned the LU's write cache on (MODE SELECT)" || bad "write cache reconfig"
	grep -q SIZE-REFUSED "$W/reconfig.out" && echo "$out" | grep -q "refusing LIO size 33554432" &&
		ok "reconfig: a dev_size that differs from [lun vm0] is refused with a reason" || bad "size reconfig not refused"
	grep -q BAD-ENABLE-REFUSED "$W/reconfig.out" && echo "$out" | grep -q "tiercached has no \[lun nosuch\]" &&
		ok "a backstore with cfgstring tiercache/nosuch is refused at enable, reason logged" || bad "unknown LUN not refused"
	echo "$out" | grep -q "^CMD_TIME_OUT=9$" && echo "$out" | grep -q "cmd_time_out set to 9 s" &&
		ok "LIO's cmd_time_out of the device is io_timeout (7 s) + 2 s, set by the daemon at attach" ||
		bad "LIO's cmd_time_out: $(echo "$out" | grep -E "CMD_TIME_OUT|cmd_time_out")"
	local maxq
	maxq=$(echo "$out" | awk '/^ *max_inflight:/{print $2; exit}')
	[ "${maxq:-0}" -ge 8 ] && ok "many commands in flight on the TCMU device (max $maxq)" || bad "max in flight ${maxq:-none}"
	echo "$out" | grep -qE "check_conditions: [1-9]" && ok "CHECK CONDITIONs (BeyondEol) went back through the ring with our sense" || bad "no check conditions counted"
	local cmds
	cmds=$(echo "$out" | awk '/^ *commands:/{print $2; exit}')
	[ "${cmds:-0}" -gt 100 ] && ok "tierctl status: $cmds commands completed through TCMU" || bad "tierctl status TCMU commands: ${cmds:-none}"
	echo "$out" | grep -q "QEMU NVMe Ctrl" && ok "tierctl status shows the QEMU NVMe model via libnvme" || bad "no NVMe model in tierctl status"
	echo "$out" | grep -q "tcleg0" && echo "$out" | grep -q "tcleg1" && ok "tierctl status shows both NVMe serials" || bad "NVMe serials missing"
	echo "$out" | grep -qE "percent_used|available_spare" && ok "tierctl status shows SMART data" || bad "no SMART data"
}

stop() {
	[ -f "$W/qemu.pid" ] && kill "$(cat "$W/qemu.pid")" 2>/dev/null
	rm -f "$W/qemu.pid"
	true
}

case "${1:-all}" in
setup) setup ;;
build) build ;;
boot) boot ;;
check) check; exit $RC ;;
stop) stop ;;
all) vm_all "LIO + TCMU + tiercached system test" setup ;;
*) echo "usage: $0 [setup|build|boot|check|stop|all]"; exit 2 ;;
esac
