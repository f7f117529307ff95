# tests/system/lib-vm.sh - what the busybox-initrd guests of the system tests share.
# Sourced with VMDIR (where tests/system/run-vm-tcmu.sh setup unpacked Debian's
# kernel, in $VMDIR/kroot) and W (this test's work dir) set.

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# vm_all WHAT SETUP...: the whole run of a test that defines build, boot, check
# (which sets RC) and stop: SETUP (a command), build, boot, check; the VM is
# stopped at the end unless KEEP=1. Exits with RC, saying PASS or FAIL: WHAT.
vm_all() {
	local what=$1 t0 t1
	shift
	t0=$(now)
	"$@"
	build
	echo "SETUP+BUILD: $(since "$t0") s"
	trap stop EXIT
	t1=$(now)
	boot || { echo "FAIL: $what: the guest did not come up"; exit 1; }
	check
	echo "BOOT+CHECK: $(since "$t1") s; TOTAL: $(since "$t0") s"
	[ "${KEEP:-0}" = 1 ] && trap - EXIT
	[ "$RC" = 0 ] && echo "PASS: $what" || echo "FAIL: $what"
	exit "$RC"
}

# vm_initrd ROOT INIT CONF "MODULES" BINARIES...: an initrd at $W/initrd.cpio with
# busybox, the modules and their dependencies (insmod order in /etc/modlist), the
# binaries in /usr/sbin with their shared libraries (found by ldd), INIT as
# /init and CONF as /etc/tiercached.conf; the kernel at $W/vmlinuz.
vm_initrd() {
	local IR=$1 init=$2 conf=$3 mods=$4 K=$VMDIR/kroot KVER m ko rel f lib
	shift 4
	[ -d "$K/lib/modules" ] || { echo "FAIL: no kernel in $K (tests/system/run-vm-tcmu.sh setup)"; return 1; }
	KVER=$(ls "$K/lib/modules" | head -1)
	depmod -b "$K" "$KVER"
	rm -rf "$IR"
	mkdir -p "$IR"/{bin,sbin,etc,proc,sys,dev,run,tmp,var/log,lib64,lib/x86_64-linux-gnu,usr/bin,usr/sbin}
	cp /bin/busybox "$IR/bin/busybox"
	for m in $mods; do
		modprobe -d "$K" -S "$KVER" --show-depends "$m" | awk '$1=="insmod"{print $2}'
	done | awk '!s[$0]++' >"$W/modlist.txt"
	while read -r ko; do
		rel=${ko#"$K"/}
		mkdir -p "$IR/$(dirname "$rel")"
		cp "$ko" "$IR/$rel"
	done <"$W/modlist.txt"
	sed "s#^$K##" "$W/modlist.txt" >"$IR/etc/modlist"
	install -m 755 "$@" "$IR/usr/sbin/"
	for f in "$@"; do
		ldd "$f" | awk '/=> \//{print $3}'
	done | sort -u >"$W/liblist.txt"
	while read -r lib; do cp "$(readlink -f "$lib")" "$IR/lib/x86_64-linux-gnu/$(basename "$lib")"; done <"$W/liblist.txt"
	cp "$(readlink -f /lib64/ld-linux-x86-64.so.2)" "$IR/lib64/ld-linux-x86-64.so.2"
	echo 'root:x:0:0:root:/:/bin/sh' >"$IR/etc/passwd"
	echo 'root:x:0:' >"$IR/etc/group"
	cp "$conf" "$IR/etc/tiercached.conf"
	install -m 755 "$init" "$IR/init"
	(cd "$IR" && find . -print0 | cpio --null -o -H newc --quiet) >"$W/initrd.cpio"
	cp "$K/boot/vmlinuz-$KVER" "$W/vmlinuz"
}

# vm_qmp SOCKET EXECUTE [ARGUMENTS-JSON]: one QMP command; prints its "return" (JSON)
vm_qmp() {
	python3 - "$@" <<'PY'
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
f = s.makefile("rw")
def reply():
    while True:
        m = json.loads(f.readline())
        if "return" in m or "error" in m:
            return m
json.loads(f.readline())  # greeting
f.write(json.dumps({"execute": "qmp_capabilities"}) + "\n"); f.flush(); reply()
cmd = {"execute": sys.argv[2]}
if len(sys.argv) > 3:
    cmd["arguments"] = json.loads(sys.argv[3])
f.write(json.dumps(cmd) + "\n")
f.flush()
m = reply()
if "error" in m:
    print(m["error"], file=sys.stderr)
    sys.exit(1)
print(json.dumps(m["return"]) if not isinstance(m["return"], str) else m["return"], end="")
PY
}

# vm_init_head: the start of every guest's /init (busybox, /proc, /sys, /dev,
# the daemon's folders, and log(), which prefixes PROBE[uptime] to a line)
vm_init_head() {
	cat <<'EOF_HEAD'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /run/tiercache /var/lib/tiercache /tmp /var/log
log() { echo "PROBE[$(cut -d' ' -f1 /proc/uptime)] $*"; }
EOF_HEAD
}

# QEMU 7.2's NVMe controller (Debian 12's) can miss a submission: with the
# shadow doorbells that Linux uses when a controller offers them, the device
# writes its event index and reads the guest's shadow tail with no barrier
# between, so it may read the old tail while the guest reads the old index
# and skips the doorbell write; the command then sits in the queue, unfetched,
# until the next doorbell write, which never comes (the guest, still seeing
# no new index, writes none). Under load a guest's NVMe drive stalls for good
# (seen: tens of I/Os, both controllers, until the kernel's timeout resets
# it). With shadow doorbells the device takes the tail from the shadow
# buffer whenever it is woken, so a write of any in-range value to the
# queue's doorbell register only wakes it: vm_nvme_kick_sh's guest loop does
# that five times a second. Not without shadow doorbells (QEMU before 7.1):
# there the written value is the tail. vm_nvme_append gives the kernel
# command line what the loop needs (iomem=relaxed: /dev/mem may map a BAR a
# driver holds) and the switch it looks for.
vm_nvme_append() {
	local v
	v=$(qemu-system-x86_64 --version | awk 'NR==1{print $4}')
	awk -v v="$v" 'BEGIN { split(v, a, "."); exit !(a[1] > 7 || (a[1] == 7 && a[2] >= 1)) }' &&
		printf ' iomem=relaxed tc_nvme_kick=1'
}

# vm_nvme_kick_sh: the guest's nvme_kick function (busybox sh or bash); start
# it in the background once the NVMe drives are there. I/O queue 1 only: these
# guests have one vCPU, so one I/O queue per controller.
vm_nvme_kick_sh() {
	cat <<'EOF_KICK'
nvme_kick() {
	grep -q 'tc_nvme_kick=1' /proc/cmdline || return 0
	local c bar caphi dbs=""
	for c in /sys/class/nvme/nvme*; do
		bar=$(head -1 "$c/device/resource" | cut -d' ' -f1)
		caphi=$(busybox devmem $((bar + 4)) 32) || return 0
		# submission queue 1's tail doorbell: 0x1000 + 2 * (4 << CAP.DSTRD)
		dbs="$dbs $(printf '0x%x' $((bar + 0x1000 + 2 * (4 << (caphi & 0xf)))))"
	done
	log "nvme doorbell kick (QEMU 7.2 shadow doorbell race) at:$dbs"
	while :; do
		for a in $dbs; do busybox devmem "$a" 32 0; done
		sleep 0.2
	done
}
EOF_KICK
}

# vm_conf_head WHAT IQN LISTEN: the start of a guest's tiercached.conf, up to its target
vm_conf_head() {
	cat <<EOF_CONF
; tiercached.conf of the $1 system test guest
[daemon]
state_dir = /var/lib/tiercache
control_socket = /run/tiercache/control.sock
log_level = info

[portal]
listen = $3

[target $2]
lun0 = disk0
EOF_CONF
}

# vm_wait_ready SERIAL PIDFILE TRIES: wait (TRIES x 0.2 s at most) for the guest to print
# TARGET-READY or TARGET-FAILED on SERIAL while qemu (PIDFILE) runs; 0 if ready
vm_wait_ready() {
	local serial=$1 pidfile=$2 tries=$3 i
	for ((i = 0; i < tries; i++)); do
		grep -qE 'TARGET-READY|TARGET-FAILED' "$serial" 2>/dev/null && break
		kill -0 "$(cat "$pidfile")" 2>/dev/null || { echo "qemu exited"; cat "$serial"; return 1; }
		sleep 0.2
	done
	grep -q TARGET-READY "$serial"
}

# vm_root_boot ROOT PREFIX "MODULES": what a debootstrap'ed guest root needs
# to boot Debian's kernel ($VMDIR/kroot): $W/PREFIX-vmlinuz, and an initrd
# $W/PREFIX-initrd.cpio (busybox, the virtio disk and ext4 modules) that
# mounts /dev/vda and switch_roots into its /sbin/tc-init; in ROOT, MODULES
# with their dependencies (for modprobe), and build/tiercached and
# build/tierctl with the libraries the root lacks (same Debian release, so
# none is ever replaced), unless VM_ROOT_BINARIES=0 (a root whose daemon
# comes from the package). Lists in $W/PREFIX-modlist-{initrd,root}.txt.
vm_root_boot() {
	local R=$1 P=$2 mods=$3 K=$VMDIR/kroot IR KVER m ko rel f lib
	[ -n "$R" ] && [ -n "$P" ] && [ -d "$K/lib/modules" ] || { echo "FAIL: vm_root_boot: no root, prefix or kernel"; return 1; }
	[ "${VM_ROOT_BINARIES:-1}" = 0 ] || [ -x "$BUILD/tiercached" ] || { echo "FAIL: build $BUILD/tiercached first"; return 1; }
	IR=$W/$P-initrd
	KVER=$(ls "$K/lib/modules" | head -1)
	depmod -b "$K" "$KVER"
	rm -rf "$IR"
	mkdir -p "$IR"/{bin,etc,proc,sys,dev,newroot}
	cp /bin/busybox "$IR/bin/busybox"
	for m in virtio_pci virtio_blk ext4 crc32c_generic; do
		modprobe -d "$K" -S "$KVER" --show-depends $m | awk '$1=="insmod"{print $2}'
	done | awk '!s[$0]++' >"$W/$P-modlist-initrd.txt"
	while read -r ko; do rel=${ko#"$K"/}; mkdir -p "$IR/$(dirname "$rel")"; cp "$ko" "$IR/$rel"; done <"$W/$P-modlist-initrd.txt"
	sed "s#^$K##" "$W/$P-modlist-initrd.txt" >"$IR/etc/modlist"
	cat >"$IR/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs devtmpfs /dev
for ko in $(cat /etc/modlist); do insmod "$ko" 2>/dev/null; done
for i in $(seq 1 50); do [ -b /dev/vda ] && break; sleep 0.1; done
mkdir -p /newroot
mount -t ext4 -o rw /dev/vda /newroot || { echo "mount /dev/vda FAILED"; exec sh; }
mount --move /dev /newroot/dev; mount --move /proc /newroot/proc; mount --move /sys /newroot/sys
exec switch_root /newroot /sbin/tc-init
INIT
	chmod 755 "$IR/init"
	(cd "$IR" && find . -print0 | cpio --null -o -H newc --quiet) >"$W/$P-initrd.cpio"
	cp "$K/boot/vmlinuz-$KVER" "$W/$P-vmlinuz"
	for m in $mods; do
		modprobe -d "$K" -S "$KVER" --show-depends $m | awk '$1=="insmod"{print $2}'
	done | awk '!s[$0]++' >"$W/$P-modlist-root.txt"
	rm -rf "$R/lib/modules"
	mkdir -p "$R/lib/modules/$KVER"
	while read -r ko; do rel=${ko#"$K"/}; mkdir -p "$R/$(dirname "$rel")"; cp "$ko" "$R/$rel"; done <"$W/$P-modlist-root.txt"
	cp "$K/lib/modules/$KVER"/modules.{order,builtin,builtin.modinfo} "$R/lib/modules/$KVER/"
	depmod -b "$R" "$KVER"
	[ "${VM_ROOT_BINARIES:-1}" = 0 ] && return 0
	install -m 755 "$BUILD/tiercached" "$BUILD/tierctl" "$R/usr/sbin/"
	for f in "$BUILD/tiercached" "$BUILD/tierctl"; do ldd "$f" | awk '/=> \//{print $3}'; done | sort -u |
		while read -r lib; do
			[ -e "$R/usr/lib/x86_64-linux-gnu/$(basename "$lib")" ] ||
				cp "$(readlink -f "$lib")" "$R/usr/lib/x86_64-linux-gnu/$(basename "$lib")"
		done
}
