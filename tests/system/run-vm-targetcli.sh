#!/bin/bash
# tests/system/run-vm-targetcli.sh - targetcli drives LIO with tiercached as the
# user:tiercache handler, in a Debian guest with D-Bus and tcmu-runner.
#
# Why: run-vm-tcmu.sh proves the data path with configfs written by hand. Admins
# use targetcli, which lists user: backstores only through D-Bus (a handler
# manager, tcmu-runner, owning org.kernel.TCMUService1) and asks the handler's
# check_config before creating one. This test builds a bookworm guest root with
# debootstrap (targetcli-fb, tcmu-runner, dbus), adds build/tiercached and
# build/tierctl, boots it under qemu (TCG) with two QEMU NVMe legs and a virtio
# backing disk, and inside the guest:
#   - waits until `targetcli ls /backstores` lists user:tiercache (our
#     [tcmu] dbus = yes registration through libtcmu),
#   - creates a backstore naming a LUN we do not have: targetcli must refuse it
#     with our check_config reason,
#   - pipes `tierctl -c CONF targetcli` into targetcli,
# then from the host checks the LUN through LIO (INQUIRY, data written and read
# back) and that tiercached, not tcmu-runner, claimed the device.
#
# Usage: tests/system/run-vm-targetcli.sh [setup|build|boot|check|stop|all]
# Env: TC_VM_DIR (default /var/tmp/tiercache-vm), BUILD (default build),
#      PORT=13263 DBGPORT=12326 MEM=1024 KEEP=1
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
W=${TC_VM_DIR:-/var/tmp/tiercache-vm}
R=$W/targetcli-rootfs
PORT=${PORT:-13263}
DBGPORT=${DBGPORT:-12326}
MEM=${MEM:-1024}
IQN=iqn.2026-11.io.tiercache:vmcli
URL=iscsi://127.0.0.1:$PORT/$IQN/0
mkdir -p "$W"
VMDIR=$W # lib-vm.sh: where the kernel is
. tests/system/lib-vm.sh # now, since, vm_nvme_*, vm_root_boot

setup() {
	bash tests/system/run-vm-tcmu.sh setup # qemu, busybox, the kernel package
	local need=()
	command -v debootstrap >/dev/null || need+=(debootstrap)
	command -v mkfs.ext4 >/dev/null || need+=(e2fsprogs)
	if [ ${#need[@]} -gt 0 ]; then
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
	fi
	if [ ! -x "$R/usr/bin/targetcli" ]; then
		local t0
		t0=$(now)
		rm -rf "$R"
		debootstrap --variant=minbase \
			--include=targetcli-fb,python3-rtslib-fb,tcmu-runner,dbus,kmod,iproute2,busybox,procps \
			bookworm "$R" http://deb.debian.org/debian >"$W/debootstrap.log" 2>&1
		echo "debootstrap: $(since "$t0") s"
	fi
}

write_guest_init() {
vm_nvme_kick_sh >"$R/sbin/tc-nvme-kick.sh"
cat >"$R/sbin/tc-init" <<'EOF'
#!/bin/bash
export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TERM=dumb
log() { echo "PROBE[$(cut -d' ' -f1 /proc/uptime)] $*" >/dev/console; }
mount -t tmpfs tmpfs /run; mkdir -p /run/dbus /run/lock /run/tiercache /tmp /var/lib/tiercache
ln -sfn /run /var/run
modprobe -a target_core_user iscsi_target_mod virtio_net nvme crc32c_generic || log "modprobe failed"
mount -t configfs configfs /sys/kernel/config
ip link set lo up; ip link set eth0 up
ip addr add 10.0.2.15/24 dev eth0; ip route add default via 10.0.2.2
busybox nc -ll -p 2323 -e /bin/bash &
for i in $(seq 1 100); do [ -b /dev/nvme1n1 ] && [ -b /dev/vdb ] && break; sleep 0.1; done
. /sbin/tc-nvme-kick.sh; nvme_kick &
dbus-daemon --system --fork && log dbus-started
tcmu-runner -l /var/log >/var/log/tcmu-runner.stdout 2>&1 &
for i in $(seq 1 100); do
	dbus-send --system --print-reply --dest=org.freedesktop.DBus / org.freedesktop.DBus.NameHasOwner \
		string:org.kernel.TCMUService1 2>/dev/null | grep -q 'boolean true' && break; sleep 0.1; done
log tcmu-runner-on-bus
tiercached -c /etc/tiercached.conf >/var/log/tiercached.log 2>&1 &
for i in $(seq 1 300); do [ -S /run/tiercache/control.sock ] && break; sleep 0.1; done
log tiercached-started
for i in $(seq 1 30); do
	targetcli ls /backstores 1 >/var/log/tc-ls.txt 2>&1
	grep -q 'user:tiercache' /var/log/tc-ls.txt && break
	sleep 1
done
sed 's/^/TCLS: /' /var/log/tc-ls.txt >/dev/console
targetcli /backstores/user:tiercache create name=bad size=1M cfgstring=nosuch >/var/log/tc-bad.txt 2>&1
echo "rc=$?" >>/var/log/tc-bad.txt
sed 's/^/TCBAD: /' /var/log/tc-bad.txt >/dev/console
tierctl -c /etc/tiercached.conf targetcli >/var/log/tc-cmds.txt 2>&1
sed 's/^/TCCMD: /' /var/log/tc-cmds.txt >/dev/console
targetcli </var/log/tc-cmds.txt >/var/log/tc-cfg.txt 2>&1
echo "rc=$?" >>/var/log/tc-cfg.txt
sed 's/^/TCCFG: /' /var/log/tc-cfg.txt >/dev/console
T=/sys/kernel/config/target/iscsi/iqn.2026-11.io.tiercache:vmcli/tpgt_1
if [ "$(cat $T/enable 2>/dev/null)" = 1 ] && [ -e $T/np/0.0.0.0:3260 ]; then
	log TARGET-READY
else
	log TARGET-FAILED
	tail -20 /var/log/tiercached.log >/dev/console
fi
sleep 100000
EOF
chmod 755 "$R/sbin/tc-init"
}

write_conf() {
cat >"$R/etc/tiercached.conf" <<'EOF'
[daemon]
state_dir = /var/lib/tiercache
control_socket = /run/tiercache/control.sock

[portal]
listen = 127.0.0.1:3261

[target iqn.2026-11.io.tiercache:vmcli]
lun0 = vm0

[cache fast]
legs = /dev/nvme0n1 /dev/nvme1n1

[lun vm0]
backing = /dev/vdb
serial = tccli0001
cache = fast

[tcmu]
enable = yes
dbus = yes
portal = 0.0.0.0:3260
EOF
}

build() {
	vm_root_boot "$R" targetcli "configfs target_core_mod target_core_user target_core_iblock target_core_file
		target_core_pscsi iscsi_target_mod virtio_net crc32c_generic virtio_blk ext4 virtio_pci nvme" || exit 1
	write_guest_init
	write_conf
	[ -s "$R/etc/machine-id" ] || chroot "$R" dbus-uuidgen --ensure=/etc/machine-id
	rm -rf "$R"/etc/rtslib-fb-target/*.json "$R"/etc/rtslib-fb-target/backup "$R"/var/log/tc-*.txt "$R"/var/lib/tiercache
	rm -f "$W/targetcli-root.img" "$W/cli-backing.img" "$W/cli-nvme0.img" "$W/cli-nvme1.img"
	mkfs.ext4 -q -F -L tcroot -d "$R" "$W/targetcli-root.img" 768M
	truncate -s 64M "$W/cli-backing.img" "$W/cli-nvme0.img" "$W/cli-nvme1.img"
}

boot() {
	rm -f "$W/targetcli-serial.log"
	local t0
	t0=$(now)
	qemu-system-x86_64 -accel tcg -cpu max -m "$MEM" -smp 1 -display none -monitor none \
		-serial file:"$W/targetcli-serial.log" -no-reboot -kernel "$W/targetcli-vmlinuz" -initrd "$W/targetcli-initrd.cpio" \
		-append "console=ttyS0 quiet panic=-1$(vm_nvme_append)" \
		-drive file="$W/targetcli-root.img",if=virtio,format=raw,cache=unsafe \
		-drive file="$W/cli-backing.img",if=virtio,format=raw,cache=unsafe \
		-drive file="$W/cli-nvme0.img",if=none,id=nv0,format=raw,cache=unsafe -device nvme,serial=tccli0,drive=nv0 \
		-drive file="$W/cli-nvme1.img",if=none,id=nv1,format=raw,cache=unsafe -device nvme,serial=tccli1,drive=nv1 \
		-netdev user,id=n0,hostfwd=tcp:127.0.0.1:$PORT-:3260,hostfwd=tcp:127.0.0.1:$DBGPORT-:2323 \
		-device virtio-net-pci,netdev=n0 >"$W/targetcli-qemu.out" 2>&1 &
	echo $! >"$W/targetcli-qemu.pid"
	for _ in $(seq 1 1500); do
		grep -qE 'TARGET-READY|TARGET-FAILED' "$W/targetcli-serial.log" 2>/dev/null && break
		kill -0 "$(cat "$W/targetcli-qemu.pid")" 2>/dev/null || { echo "qemu exited"; cat "$W/targetcli-serial.log"; return 1; }
		sleep 0.2
	done
	echo "BOOT: qemu start -> target ready/failed: $(since "$t0") s"
	grep -E 'PROBE|TCLS|TCBAD|TCCMD|TCCFG|tiercached:' "$W/targetcli-serial.log" || true
	grep -q TARGET-READY "$W/targetcli-serial.log"
}

gsh() { printf '%s\nexit\n' "$*" | socat -t 60 - TCP:127.0.0.1:$DBGPORT; }
RC=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; RC=1; }

check() {
	local S=$W/targetcli-serial.log out
	grep -q 'TCLS: .*user:tiercache' "$S" && ok "targetcli lists /backstores/user:tiercache (D-Bus registration)" || bad "user:tiercache not listed by targetcli"
	grep -q "TCBAD: .*tiercached has no \[lun nosuch\]" "$S" && ok "targetcli shows our check_config reason for cfgstring=nosuch" || bad "no check_config reason shown"
	out=$(iscsi-inq "$URL" 2>&1) || true
	echo "$out" | grep -q TIERCACH && ok "INQUIRY through LIO answered by tiercached" || bad "INQUIRY: $out"
	out=$(iscsi-inq -e 1 -c 128 "$URL" 2>&1) || true
	echo "$out" | grep -q "tccli0001" && ok "VPD 0x80 serial tccli0001" || bad "VPD 0x80: $out"
	head -c 4M /dev/urandom >"$W/cli-data.raw"
	qemu-img convert -n -f raw -O raw "$W/cli-data.raw" "$URL" || bad "write"
	rm -f "$W/cli-back.raw"
	qemu-img dd -f raw -O raw bs=1M count=4 if="$URL" of="$W/cli-back.raw" || bad "read"
	cmp -s "$W/cli-data.raw" "$W/cli-back.raw" && ok "4 MiB written through the targetcli-made target read back equal" || bad "data differs"
	out=$(gsh 'tierctl status | sed -n "/^tcmu:/,\$p"; grep -E "tcmu|error" /var/log/tiercached.log; tail -5 /var/log/tcmu-runner.log')
	echo "$out"
	echo "$out" | grep -q "attached to \[lun vm0\]" && ok "tiercached (not tcmu-runner) claimed the tiercache/vm0 device" || bad "attach line missing"

	# restart: SIGTERM detaches and checkpoints; a new daemon finds LIO's
	# existing device (libtcmu scans the uio devices) and the data is there
	out=$(gsh 'kill -TERM $(pidof tiercached); for i in $(seq 1 100); do pidof tiercached >/dev/null || break; sleep 0.1; done
grep -E "detached|stopped cleanly" /var/log/tiercached.log
tiercached -c /etc/tiercached.conf >/var/log/tiercached2.log 2>&1 &
for i in $(seq 1 100); do grep -q "attached to" /var/log/tiercached2.log && break; sleep 0.1; done
grep tcmu /var/log/tiercached2.log')
	echo "$out"
	echo "$out" | grep -q "LIO device for \[lun vm0\] detached after" && echo "$out" | grep -q "stopped cleanly" &&
		ok "SIGTERM: the LIO device is detached after its commands, the daemon stops cleanly" || bad "clean stop"
	echo "$out" | grep -q "attached to \[lun vm0\]" && ok "a restarted daemon re-attaches LIO's existing device" || bad "no re-attach"
	rm -f "$W/cli-back.raw"
	qemu-img dd -f raw -O raw bs=1M count=4 if="$URL" of="$W/cli-back.raw" || bad "read after restart"
	cmp -s "$W/cli-data.raw" "$W/cli-back.raw" && ok "the 4 MiB read back equal after the restart" || bad "data differs after restart"
}

stop() { [ -f "$W/targetcli-qemu.pid" ] && kill "$(cat "$W/targetcli-qemu.pid")" 2>/dev/null; rm -f "$W/targetcli-qemu.pid"; true; }

case "${1:-all}" in
setup) setup ;;
build) build ;;
boot) boot ;;
check) check; exit $RC ;;
stop) stop ;;
all)
	T0=$(now)
	setup
	build
	echo "SETUP+BUILD: $(since "$T0") s"
	trap stop EXIT
	boot || { echo "FAIL: the guest did not bring the target up"; check || true; exit 1; }
	check
	echo "TOTAL: $(since "$T0") s"
	[ "${KEEP:-0}" = 1 ] && trap - EXIT
	[ $RC = 0 ] && echo "PASS: targetcli + tiercached system test" || echo "FAIL: targetcli + tiercached system test"
	exit $RC
	;;
esac
