#!/bin/bash
# tests/system/run-vm-initiator.sh - the Linux kernel's own iSCSI initiator
# (open-iscsi: iscsid, iscsiadm, iscsi_tcp, sd) against tiercached's built-in
# portal, used the way a host uses it.
#
# Why: every other test talks to the portal through libiscsi (a userspace
# initiator) or reaches tiercached through LIO. Hosts run the kernel initiator,
# which reads our VPD pages to decide how to discard, reconnects on its own
# after a connection drop and, with dm-multipath, spreads I/O over several
# portals. None of that can be proven without a real kernel, and the build
# machines have no iscsi_tcp and no KVM. So, as run-vm-targetcli.sh does, we
# build a Debian bookworm root with debootstrap (open-iscsi, multipath-tools,
# udev, sg3-utils, fio, ddpt, tcpdump), add Debian's stock kernel modules (the
# kernel unpacked by run-vm-tcmu.sh setup), build/tiercached and build/tierctl,
# and boot it under qemu (TCG) with a busybox initramfs that switch_roots into
# an ext4 image. tiercached runs in the same guest, listening on 127.0.0.1:3260
# and 127.0.0.2:3260, with one target: LUN 0 (128 MiB file, write-back cache on
# two file legs, serial tcini0001) and LUN 1 (16 MiB file, for ODX); a second
# target needs CHAP. Steps, run inside the guest over a debug shell (the
# guest's network device only carries that port forward):
#   1. SendTargets lists the target on both portals; login; sdX appears with
#      vendor TIERCACH and our serial in VPD 0x80.
#   2. the kernel took our limits: provisioning_mode unmap, nonzero discard.
#   3. mkfs.ext4, mount, fio with crc32c verify, sha256 of files, umount,
#      fsck -fn clean, remount, the sums still match.
#   4. fstrim -v trims bytes (files intact after); blkdiscard of a written
#      range reads back zeroes.
#   5. persistent reservations between two sessions with two initiator names
#      (two iface records): register, reserve Write Exclusive, the other sees
#      the holder, its write gets RESERVATION CONFLICT, release, preempt.
#   6. kill -9 of tiercached under fio with verify, restart it after the
#      kernel saw the connection drop: the session recovers, fio ends with no
#      error and its verify passes.
#   7. dm-multipath over both portals: 2 paths; fio with verify on the map
#      while one path's session logs out; no error; the path logs back in and
#      multipath shows 2 active paths again.
#   8. (in every step) the kernel lines logged during the step are printed;
#      an error line fails the step unless it is one the step causes itself.
#   9. (extra) CHAP with SHA3-256 / SHA-256 / MD5, one-way and mutual: which
#      digest was agreed is read off the wire (tcpdump on lo), a wrong secret
#      is refused.
#  10. (extra) target-side copies: EXTENDED COPY (sg_xcopy) of LUN 1 onto
#      LUN 0, cmp equal. ODX with ddpt --odx is SKIPped: bookworm's ddpt 0.97
#      sends malformed POPULATE TOKEN range descriptors (see step10).
#  12. dm-multipath with ALUA (the settings README.md documents) over two
#      gateways of one RBD image, run on the host with a loopback Ceph
#      cluster (tests/system/vm-failover-host.sh): the owner is killed
#      under fio verify load; no I/O fails, the verify passes, the pause
#      the host saw (longest gap between completions) is under 10 s, and
#      the restarted gateway's path comes back non-optimized. Then the new
#      owner is frozen (SIGSTOP) and thawed once the other took over, while
#      fio still writes: no I/O fails, the verify passes, the pause (NOP-Out
#      timers first) is printed, and the thawed gateway is fenced.
#  11. (recording, not a check; STEPS="1 11") a trace of a real filesystem
#      workload for the sizing advisor: tierctl trace records cache fast
#      while ext4 on LUN 0 takes a source tarball (zlib, Debian's), and in
#      three trees of their own unpacks it, configures and builds it, runs
#      its tests and builds it again from clean (the first tree is removed
#      before the third), the guest's page cache dropped between phases (a
#      host with little memory to spare). The trace comes
#      back compressed to $W/ext4-build.trace.xz; tests/unit/test_advisor
#      replays the copy in tests/data/advisor/.
#
# Usage: tests/system/run-vm-initiator.sh [setup|build|boot|check|stop|all]
#        (debugging a running guest, KEEP=1: gsh CMD runs CMD in it, push
#        installs the current step script in it)
# Env: TC_VM_DIR (default /var/tmp/tiercache-vm), BUILD (default build),
#      PORT=13264 DBGPORT=12327 MEM=1024 KEEP=1 (leave the VM running),
#      STEPS="1 2 ..." (check only these steps; they assume the earlier ones ran)
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
W=${TC_VM_DIR:-/var/tmp/tiercache-vm}
R=$W/initiator-rootfs
PORT=${PORT:-13264}
DBGPORT=${DBGPORT:-12327}
MEM=${MEM:-1024}
STEPS=${STEPS:-1 2 3 4 5 6 7 9 10 12}
mkdir -p "$W"
VMDIR=$W # lib-vm.sh: where the kernel is
. tests/system/lib-vm.sh # now, since

# Debian packages of the guest root (debootstrap --include)
GUEST_PKGS=open-iscsi,sg3-utils,fio,e2fsprogs,multipath-tools,udev,kmod,iproute2,busybox,procps,util-linux,ddpt,tcpdump
# step 11 builds a source tree in the guest
recording() { [[ " $STEPS " == *" 11 "* ]]; }
recording && GUEST_PKGS+=,gcc,make,libc6-dev,xz-utils,bzip2
# kernel modules of the guest root (with what modprobe --show-depends adds)
ROOT_MODS="iscsi_tcp libiscsi libiscsi_tcp scsi_transport_iscsi sd_mod sg scsi_dh_alua scsi_dh_emc scsi_dh_rdac
	dm_mod dm_multipath dm_round_robin dm_service_time dm_queue_length ext4 crc32c_generic
	virtio_pci virtio_blk virtio_net"

setup() {
	bash tests/system/run-vm-tcmu.sh setup # qemu, busybox, socat, the kernel package
	local need=() missing
	command -v debootstrap >/dev/null || need+=(debootstrap)
	command -v mkfs.ext4 >/dev/null || need+=(e2fsprogs)
	if [ ${#need[@]} -gt 0 ]; then
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
	fi
	if [ ! -x "$R/usr/sbin/iscsiadm" ]; then
		local t0
		t0=$(now)
		rm -rf "$R"
		debootstrap --variant=minbase --include=$GUEST_PKGS \
			bookworm "$R" http://deb.debian.org/debian >"$W/ini-debootstrap.log" 2>&1
		echo "debootstrap: $(since "$t0") s"
	fi
	# a root made before a package was added to GUEST_PKGS gets it now
	missing=$(for p in ${GUEST_PKGS//,/ }; do
		chroot "$R" dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q 'install ok installed' || echo "$p"
	done)
	if [ -n "$missing" ]; then
		echo "adding to the guest root: $missing"
		chroot "$R" apt-get update -qq >/dev/null
		# shellcheck disable=SC2086
		DEBIAN_FRONTEND=noninteractive chroot "$R" apt-get install -y -qq $missing >/dev/null
	fi
	chroot "$R" apt-get clean
	# step 11's source tree: Debian's zlib source, fetched from the archive
	if recording && ! ls "$W"/src/zlib_*.orig.tar.* >/dev/null 2>&1; then
		mkdir -p "$W/src/lists/partial"
		echo "deb-src http://deb.debian.org/debian bookworm main" >"$W/src/sources.list"
		local o=(-o Dir::Etc::SourceList="$W/src/sources.list" -o Dir::Etc::SourceParts=/dev/null
			-o Dir::State::Lists="$W/src/lists")
		apt-get "${o[@]}" update -qq
		(cd "$W/src" && apt-get "${o[@]}" source --download-only zlib)
	fi
}

# the guest's /sbin/tc-init (PID 1 after switch_root): modules, udev, the debug
# shell, iscsid, tiercached; TARGET-READY on the console when all are up
write_guest_init() {
cat >"$R/sbin/tc-init" <<'EOF'
#!/bin/bash
export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TERM=dumb
log() { echo "PROBE[$(cut -d' ' -f1 /proc/uptime)] $*" >/dev/console; }
mount -t tmpfs tmpfs /run; mkdir -p /run/lock /run/tiercache /tmp /var/lib/tiercache
ln -sfn /run /var/run
mount -t tmpfs tmpfs /tmp
# what udev does not make in a devtmpfs: bash's <(...) needs /dev/fd
ln -sfn /proc/self/fd /dev/fd; ln -sf /proc/self/fd/0 /dev/stdin
ln -sf /proc/self/fd/1 /dev/stdout; ln -sf /proc/self/fd/2 /dev/stderr
modprobe -a virtio_net sd_mod sg iscsi_tcp scsi_dh_alua dm_multipath dm_round_robin crc32c_generic || log "modprobe failed"
ip link set lo up; ip link set eth0 up
ip addr add 10.0.2.15/24 dev eth0; ip route add default via 10.0.2.2
busybox nc -ll -p 2323 -e /bin/bash &
# udev: /dev/disk/by-*, the ID_SERIAL multipath keys paths by, dm device nodes
/lib/systemd/systemd-udevd --daemon
udevadm trigger --action=add; udevadm settle -t 60
log udev-started
for i in $(seq 1 100); do [ -b /dev/vdb ] && break; sleep 0.1; done
mount -t ext4 /dev/vdb /var/lib/tiercache || log "mount /dev/vdb failed"
iscsid || log "iscsid failed"
tiercached -c /etc/tiercached.conf >/var/log/tiercached.log 2>&1 &
echo $! >/run/tiercached.pid
for i in $(seq 1 300); do [ -S /run/tiercache/control.sock ] && break; sleep 0.1; done
if [ -S /run/tiercache/control.sock ] && pgrep -x iscsid >/dev/null; then
	log TARGET-READY
else
	log TARGET-FAILED
	tail -20 /var/log/tiercached.log >/dev/console
fi
# PID 1: reap whatever is orphaned (daemons fork, killed ones must go away)
while :; do sleep 5; done
EOF
chmod 755 "$R/sbin/tc-init"
}

write_conf() {
cat >"$R/etc/tiercached.conf" <<'EOF'
; tiercached.conf of the kernel-initiator system test guest
[daemon]
state_dir = /var/lib/tiercache
control_socket = /run/tiercache/control.sock
log_level = info

[portal]
; two addresses: the two paths of step 7 (lo answers all of 127/8)
listen = 127.0.0.1:3260
listen = 127.0.0.2:3260

[target iqn.2026-11.io.tiercache:vmini]
lun0 = ini0
lun1 = ini1

[target iqn.2026-11.io.tiercache:vmchap]
lun0 = ini2
chap_user = hostchap
chap_secret = chapsecret1234
mutual_user = tgtchap
mutual_secret = mutualsecr5678

[cache fast]
legs = /var/lib/tiercache/leg0.img /var/lib/tiercache/leg1.img
size = 48M

[lun ini0]
backing = /var/lib/tiercache/ini0.img
size = 128M
block_size = 512
serial = tcini0001
cache = fast

[lun ini1]
backing = /var/lib/tiercache/ini1.img
size = 16M
block_size = 512
serial = tcini0002

[lun ini2]
backing = /var/lib/tiercache/ini2.img
size = 16M
block_size = 512
serial = tcini0003
EOF
}

# the guest's /sbin/ini-steps STEP: the steps themselves, run through the debug
# shell; each prints ok:/FAIL:/SKIP: lines and the kernel lines of the step
write_guest_steps() {
cat >"$R/sbin/ini-steps" <<'EOF'
#!/bin/bash
set -u
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
IQN=iqn.2026-11.io.tiercache:vmini
CHAP_IQN=iqn.2026-11.io.tiercache:vmchap
SERIAL=tcini0001
INAME_B=iqn.2026-11.io.tiercache:hostb
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; }
skip() { echo "SKIP: $*"; }
note() { echo "   $*"; }

# wait_for TRIES CMD...: run CMD every 0.2 s until it succeeds, TRIES times at most
wait_for() {
	local n=$1 i
	shift
	for ((i = 0; i < n; i++)); do "$@" && return 0; sleep 0.2; done
	return 1
}

# sess_of TARGET ADDR[:PORT] [INITIATORNAME]: the number of our session to
# ADDR (any port, 3260 for the guest's own portals) or to ADDR:PORT
sess_of() {
	local s n c
	for s in /sys/class/iscsi_session/session*; do
		[ -e "$s" ] || continue
		n=${s##*/session}
		c=/sys/class/iscsi_connection/connection$n:0
		[ "$(cat "$s/targetname" 2>/dev/null)" = "$1" ] || continue
		[ "$(cat $c/persistent_address 2>/dev/null)" = "${2%%:*}" ] || continue
		[ "$2" = "${2%%:*}" ] || [ "$(cat $c/persistent_port 2>/dev/null)" = "${2#*:}" ] || continue
		[ -z "${3:-}" ] || [ "$(cat "$s/initiatorname" 2>/dev/null)" = "$3" ] || continue
		echo "$n"
		return 0
	done
	return 1
}

# disk_of SESSION LUN: the sd device of LUN of session SESSION
disk_of() {
	local b
	for b in /sys/class/iscsi_session/session$1/device/target*/*:*:*:$2/block/*; do
		[ -e "$b" ] && [ -b "/dev/${b##*/}" ] && { echo "${b##*/}"; return 0; }
	done
	return 1
}
has_disk() { disk_of "$@" >/dev/null; }
sess_state() { cat /sys/class/iscsi_session/session$1/state 2>/dev/null; }
writes_done() { awk '{print $5}' "/sys/block/$1/stat"; }
# more_writes DEV BASE N: DEV has completed N writes more than BASE
more_writes() { [ "$(writes_done "$1")" -ge $(($2 + $3)) ]; }

# kernel lines since the step began (dmesg -C at its start); an error line
# fails the step unless it matches ALLOW (an ERE, case-insensitive)
kbegin() { dmesg -C; }
kcheck() {
	local what=$1 allow=${2:-} k errs n
	k=$(dmesg)
	n=$(printf '%s' "$k" | grep -c '' || true)
	echo "   kernel ($n lines during the step):"
	[ "$n" -gt 0 ] && printf '%s\n' "$k" | head -60 | sed 's/^/     | /'
	[ "$n" -gt 60 ] && echo "     | ... $((n - 60)) more"
	errs=$(printf '%s\n' "$k" | grep -iE 'error|fail|critical' || true)
	[ -n "$allow" ] && errs=$(printf '%s\n' "$errs" | grep -viE "$allow" || true)
	errs=$(printf '%s\n' "$errs" | sed '/^$/d')
	if [ -z "$errs" ]; then
		ok "$what: no unexpected error lines in the kernel log"
	else
		bad "$what: unexpected kernel lines: $(printf '%s' "$errs" | tr '\n' '|')"
	fi
}

# fio_ok OUTFILE RC WHAT: fio exited 0, reported err=0 and no verify error
fio_ok() {
	grep -E 'err=|WRITE:|READ:|verify' "$1" | sed 's/^/   fio| /'
	if [ "$2" = 0 ] && grep -q 'err= 0' "$1" && ! grep -qE 'err= *[1-9]|verify: bad|crc32c: verify failed' "$1"; then
		ok "$3"
	else
		bad "$3 (fio rc=$2)"
		tail -20 "$1" | sed 's/^/   fio| /'
	fi
}

daemon_pid() { pgrep -x tiercached; }

step1() {
	kbegin
	local out s d
	out=$(iscsiadm -m discovery -t sendtargets -p 127.0.0.1:3260 2>&1)
	printf '%s\n' "$out" | sed 's/^/   st| /'
	if printf '%s\n' "$out" | grep -qE "^127\.0\.0\.1:3260,[0-9]+ $IQN\$" &&
		printf '%s\n' "$out" | grep -qE "^127\.0\.0\.2:3260,[0-9]+ $IQN\$"; then
		ok "SendTargets lists $IQN on 127.0.0.1:3260 and 127.0.0.2:3260"
	else
		bad "SendTargets does not list $IQN on both portals"
	fi
	out=$(iscsiadm -m node -T $IQN -p 127.0.0.1:3260 --login 2>&1)
	printf '%s\n' "$out" | sed 's/^/   login| /'
	s=$(sess_of $IQN 127.0.0.1) && [ "$(sess_state "$s")" = LOGGED_IN ] &&
		ok "login to 127.0.0.1:3260: session $s LOGGED_IN" || { bad "no session to 127.0.0.1"; kcheck step1; return; }
	if wait_for 150 has_disk "$s" 0 && wait_for 50 test -s "/sys/block/$(disk_of "$s" 0)/size"; then
		d=$(disk_of "$s" 0)
		echo "$d" >/run/ini-diskA
		echo "$s" >/run/ini-sessA
		ok "LUN 0 appeared as /dev/$d ($(($(cat /sys/block/$d/size) / 2048)) MiB), LUN 1 as /dev/$(disk_of "$s" 1 || echo none)"
	else
		bad "no sd device for LUN 0 of session $s"
		kcheck step1
		return
	fi
	local vendor model
	vendor=$(cat /sys/block/$d/device/vendor)
	model=$(cat /sys/block/$d/device/model)
	note "vendor '$vendor' model '$model' rev '$(cat /sys/block/$d/device/rev)'"
	[ "$(echo $vendor)" = TIERCACH ] && ok "sysfs vendor is TIERCACH" || bad "sysfs vendor is '$vendor'"
	out=$(sg_inq -p 0x80 /dev/$d 2>&1)
	printf '%s\n' "$out" | sed 's/^/   sg_inq| /'
	printf '%s\n' "$out" | grep -qE "Unit serial number: *$SERIAL\$" && ok "VPD 0x80 serial is $SERIAL" ||
		bad "VPD 0x80 serial is not $SERIAL"
	kcheck step1
}

step2() {
	kbegin
	local d sd v pm dmax
	d=$(cat /run/ini-diskA)
	pm=$(cat /sys/block/$d/device/scsi_disk/*/provisioning_mode)
	for v in /sys/block/$d/device/scsi_disk/*/{provisioning_mode,max_write_same_blocks,max_unmap_blocks,thin_provisioning} \
		/sys/block/$d/queue/{discard_max_bytes,discard_max_hw_bytes,discard_granularity,write_same_max_bytes,write_zeroes_max_bytes,max_hw_sectors_kb,optimal_io_size,minimum_io_size,write_cache}; do
		[ -e "$v" ] && note "${v##*/}: $(cat "$v")"
	done
	case $pm in
	unmap | writesame_16) ok "provisioning_mode is $pm" ;;
	*) bad "provisioning_mode is '$pm', not unmap" ;;
	esac
	dmax=$(cat /sys/block/$d/queue/discard_max_bytes)
	[ "$dmax" -gt 0 ] && ok "discard_max_bytes $dmax" || bad "discard_max_bytes is 0: the kernel will not discard"
	kcheck step2
}

step3() {
	kbegin
	local d rc
	d=$(cat /run/ini-diskA)
	mkfs.ext4 -q -F -E nodiscard /dev/$d && ok "mkfs.ext4 /dev/$d" || bad "mkfs.ext4"
	mkdir -p /mnt/ini
	mount /dev/$d /mnt/ini && ok "mounted" || { bad "mount"; kcheck step3; return; }
	fio --name=v --filename=/mnt/ini/f --size=8M --rw=randwrite --bs=4k --ioengine=libaio --iodepth=8 --direct=1 \
		--verify=crc32c --do_verify=1 >/tmp/fio3.out 2>&1
	rc=$?
	fio_ok /tmp/fio3.out $rc "fio 8 MiB random 4k writes on ext4, crc32c verify passed"
	mkdir -p /mnt/ini/files
	cp -a /usr/sbin /etc /mnt/ini/files/ 2>/dev/null
	head -c 4M /dev/urandom >/mnt/ini/files/random.bin
	(cd /mnt/ini && find files -type f -print0 | xargs -0 sha256sum) >/tmp/sums
	note "$(wc -l </tmp/sums) files, $(du -sm /mnt/ini/files | cut -f1) MiB"
	umount /mnt/ini && ok "umount" || bad "umount"
	echo 3 >/proc/sys/vm/drop_caches
	fsck.ext4 -fn /dev/$d >/tmp/fsck.out 2>&1
	rc=$?
	sed 's/^/   fsck| /' /tmp/fsck.out
	[ $rc = 0 ] && ok "fsck.ext4 -fn clean" || bad "fsck.ext4 -fn rc=$rc"
	mount /dev/$d /mnt/ini && (cd /mnt/ini && sha256sum -c --quiet /tmp/sums) &&
		ok "remounted: all $(wc -l </tmp/sums) sha256 sums equal" || bad "sums differ after remount"
	kcheck step3
}

step4() {
	kbegin
	local d out n off=$((96 << 20)) len=$((8 << 20))
	d=$(cat /run/ini-diskA)
	mountpoint -q /mnt/ini || mount /dev/$d /mnt/ini
	rm -f /mnt/ini/f   # fio's file: free space for fstrim to hand back
	sync
	out=$(fstrim -v /mnt/ini 2>&1)
	note "fstrim: $out"
	n=$(echo "$out" | sed -n 's/.*(\([0-9]*\) bytes).*/\1/p')
	[ "${n:-0}" -gt 0 ] && ok "fstrim -v trimmed $n bytes" || bad "fstrim: $out"
	echo 3 >/proc/sys/vm/drop_caches
	(cd /mnt/ini && sha256sum -c --quiet /tmp/sums) && ok "files intact after fstrim" || bad "files differ after fstrim"
	umount /mnt/ini
	# blkdiscard on a range past the data we care about: write it, discard it,
	# read it back (O_DIRECT): LBPRZ says unmapped blocks read as zeroes
	head -c $len /dev/urandom >/tmp/r.bin
	dd if=/tmp/r.bin of=/dev/$d bs=1M seek=$((off >> 20)) oflag=direct status=none
	cmp -s /tmp/r.bin <(dd if=/dev/$d bs=1M skip=$((off >> 20)) count=$((len >> 20)) iflag=direct status=none) ||
		bad "the range before blkdiscard does not read back what was written"
	blkdiscard -v -o $off -l $len /dev/$d 2>&1 | sed 's/^/   /'
	[ "${PIPESTATUS[0]}" = 0 ] && ok "blkdiscard -o $off -l $len" || bad "blkdiscard failed"
	cmp -s <(head -c $len /dev/zero) <(dd if=/dev/$d bs=1M skip=$((off >> 20)) count=$((len >> 20)) iflag=direct status=none) &&
		ok "the discarded 8 MiB read back as zeroes" || bad "the discarded range does not read as zeroes"
	kcheck step4
}

# pr_keys DEV / pr_resv DEV: READ KEYS / READ RESERVATION as sg_persist prints them
pr_keys() { sg_persist --in -k /dev/$1 2>&1; }
pr_resv() { sg_persist --in -r /dev/$1 2>&1; }

step5() {
	kbegin
	local a b sb out rc n
	a=$(cat /run/ini-diskA)
	iscsiadm -m iface -I ifaceB -o new >/dev/null 2>&1
	iscsiadm -m iface -I ifaceB -o update -n iface.initiatorname -v $INAME_B >/dev/null
	iscsiadm -m node -o new -T $IQN -p 127.0.0.1:3260 -I ifaceB >/dev/null
	iscsiadm -m node -T $IQN -p 127.0.0.1:3260 -I ifaceB --login 2>&1 | sed 's/^/   login| /'
	sb=$(sess_of $IQN 127.0.0.1 $INAME_B) && wait_for 150 has_disk "$sb" 0 ||
		{ bad "no second session (initiator $INAME_B)"; kcheck step5; return; }
	b=$(disk_of "$sb" 0)
	echo "$b" >/run/ini-diskB
	ok "second session $sb as $INAME_B: LUN 0 is also /dev/$b (A = /dev/$a)"
	sg_persist --out --register --param-sark=0xa1 /dev/$a >/dev/null 2>&1 &&
		sg_persist --out --register --param-sark=0xb1 /dev/$b >/dev/null 2>&1 &&
		ok "registered key 0xa1 (A) and 0xb1 (B)" || bad "register"
	out=$(pr_keys $a)
	printf '%s\n' "$out" | sed 's/^/   keys| /'
	printf '%s\n' "$out" | grep -q 0xa1 && printf '%s\n' "$out" | grep -q 0xb1 && ok "READ KEYS lists both" || bad "READ KEYS"
	sg_persist --out --reserve --param-rk=0xa1 --prout-type=1 /dev/$a >/dev/null 2>&1 &&
		ok "A reserved (type 1, Write Exclusive)" || bad "reserve"
	out=$(pr_resv $b)
	printf '%s\n' "$out" | sed 's/^/   resv(B)| /'
	printf '%s\n' "$out" | grep -q "Key=0xa1" && printf '%s\n' "$out" | grep -qi "Write Exclusive" &&
		ok "READ RESERVATION from B shows A's key 0xa1, Write Exclusive" || bad "READ RESERVATION from B"
	# the one write the reservation must refuse
	out=$(dd if=/dev/zero of=/dev/$b bs=4k count=1 seek=100 oflag=direct 2>&1)
	rc=$?
	note "dd from B: rc=$rc $out"
	[ $rc != 0 ] && printf '%s' "$out" | grep -q "Invalid exchange" && dmesg | grep -qi 'reservation conflict' &&
		ok "B's write failed with RESERVATION CONFLICT (EBADE to dd)" || bad "B's write was not refused by the reservation"
	dd if=/dev/$b of=/dev/null bs=4k count=1 iflag=direct status=none && ok "B may still read (Write Exclusive)" || bad "B's read failed"
	dd if=/dev/zero of=/dev/$a bs=4k count=1 seek=100 oflag=direct status=none && ok "A (holder) may write" || bad "A's write failed"
	sg_persist --out --release --param-rk=0xa1 --prout-type=1 /dev/$a >/dev/null 2>&1 && ok "A released" || bad "release"
	out=$(pr_resv $b)
	printf '%s\n' "$out" | grep -qi "no reservation" && ok "no reservation held after release" || bad "after release: $out"
	dd if=/dev/zero of=/dev/$b bs=4k count=1 seek=100 oflag=direct status=none && ok "B may write after the release" || bad "B's write after release"
	# preempt: A reserves again, B takes over and removes A's registration.
	# Write Exclusive again, not Exclusive Access: udev re-reads a disk that
	# was opened for writing (sg_persist) when it is closed, and under EA
	# those reads from the unregistered A would conflict too.
	sg_persist --out --reserve --param-rk=0xa1 --prout-type=1 /dev/$a >/dev/null 2>&1 || bad "second reserve"
	sg_persist --out --preempt --param-rk=0xb1 --param-sark=0xa1 --prout-type=1 /dev/$b >/dev/null 2>&1 &&
		ok "B preempted A's reservation" || bad "preempt"
	out=$(pr_resv $b; pr_keys $b)
	printf '%s\n' "$out" | sed 's/^/   after preempt(B)| /'
	printf '%s\n' "$out" | grep -q "Key=0xb1" && ! printf '%s\n' "$out" | grep -q 0xa1 &&
		ok "after preempt B (0xb1) holds the reservation, A's key is gone" || bad "preempt result"
	# A's next command gets UNIT ATTENTION, REGISTRATIONS PREEMPTED (2A/05):
	# our TUR, or a read udev makes first (the kernel then logs "Parameters
	# changed" for A's device, which is what it prints for 2A/xx)
	local hctl
	hctl=$(basename "$(readlink -f /sys/block/$a/device)")
	out=$(sg_turs -vv /dev/$a 2>&1)
	printf '%s\n' "$out" | sed 's/^/   A TUR| /'
	if printf '%s\n' "$out" | grep -qi "Registrations preempted"; then
		ok "A's TUR got UNIT ATTENTION, registrations preempted"
	elif dmesg | grep -q "sd $hctl: Parameters changed"; then
		ok "A was given the UNIT ATTENTION (2A/xx: the kernel logged 'sd $hctl: Parameters changed')"
	else
		bad "A got no REGISTRATIONS PREEMPTED unit attention"
	fi
	sg_persist --out --clear --param-rk=0xb1 /dev/$b >/dev/null 2>&1 && ok "B cleared all keys" || bad "clear"
	out=$(pr_keys $a)
	printf '%s\n' "$out" | grep -qi "there are NO registered" && ok "no keys left" || bad "keys left: $out"
	iscsiadm -m node -T $IQN -p 127.0.0.1:3260 -I ifaceB --logout >/dev/null 2>&1 && ok "B logged out" || bad "B logout"
	n=$(dmesg | grep -c 'reservation conflict')
	[ "$n" = 1 ] && ok "the kernel logged exactly one reservation conflict (B's write)" ||
		bad "$n reservation conflicts in the kernel log, expected 1"
	kcheck step5 'reservation conflict|critical nexus error|FAILED Result: hostbyte=DID_OK driverbyte=DRIVER_OK|Parameters changed'
}

step6() {
	kbegin
	local d s fpid base pid rc t0
	d=$(cat /run/ini-diskA)
	s=$(cat /run/ini-sessA)
	note "replacement_timeout of session $s: $(cat /sys/class/iscsi_session/session$s/recovery_tmo) s"
	base=$(writes_done $d)
	fio --name=k --filename=/dev/$d --size=24M --rw=randwrite --bs=4k --ioengine=libaio --iodepth=4 --direct=1 \
		--verify=crc32c --do_verify=1 >/tmp/fio6.out 2>&1 &
	fpid=$!
	wait_for 300 more_writes $d "$base" 400 || note "fio wrote less than 400 blocks in 60 s"
	pid=$(daemon_pid)
	if kill -0 $fpid 2>/dev/null; then
		kill -9 "$pid" && ok "kill -9 tiercached (pid $pid) after $(($(writes_done $d) - base)) writes, fio still running"
	else
		bad "fio ended before the kill: make it longer"
	fi
	wait_for 150 eval '! kill -0 '"$pid"' 2>/dev/null' || bad "tiercached $pid did not die"
	wait_for 150 eval '[ "$(sess_state '"$s"')" = FAILED ]' && ok "the kernel saw the connection drop (session $s FAILED)" ||
		bad "session $s state $(sess_state "$s") after the kill"
	sleep 2 # the daemon stays away a while, as a crashed one would
	t0=$(cut -d' ' -f1 /proc/uptime)
	setsid tiercached -c /etc/tiercached.conf >>/var/log/tiercached-restart.log 2>&1 </dev/null &
	wait_for 300 test -S /run/tiercache/control.sock || true
	wait_for 600 eval '[ "$(sess_state '"$s"')" = LOGGED_IN ]' &&
		ok "the session logged in again $(awk -v a="$t0" '{printf "%.1f", $1 - a}' /proc/uptime) s after the restart" ||
		bad "session $s state $(sess_state "$s") 120 s after the restart"
	wait_for 1500 eval '! kill -0 '"$fpid"' 2>/dev/null' || { bad "fio still running 300 s later"; kill $fpid; }
	wait $fpid
	rc=$?
	fio_ok /tmp/fio6.out $rc "fio across the kill -9 and restart: no error, crc32c verify of all 24 MiB passed"
	note "restarted daemon's log:"
	sed 's/^/   log| /' /var/log/tiercached-restart.log | head -30
	kcheck step6 'conn error|connection[0-9:]* .*error|detected conn error|session recovery|recovery timer|iscsid|Connection refused|ping timeout|nop'
}

# mp_conf BLACKLIST DEVICE: /etc/multipath.conf with our device section,
# BLACKLIST and DEVICE lines added to those every config here has
mp_conf() {
	cat >/etc/multipath.conf <<CONF
defaults {
	user_friendly_names yes
	find_multipaths no
	polling_interval 2
}
blacklist {
	devnode "^vd[a-z]"
	$1
}
devices {
	device {
		vendor "TIERCACH"
		product ".*"
		path_checker tur
		no_path_retry 12
		$2
	}
}
CONF
}

# map_of DEV: the multipath map DEV is a path of (nothing while it is none's)
map_of() { multipathd show paths raw format "%d %m" 2>/dev/null | awk -v d="$1" '$1==d && $2!="[orphan]"{print $2}'; }
map_made() { local m; m=$(map_of "$1"); [ -n "$m" ] && [ -e "/dev/mapper/$m" ]; }
mp_active() { multipathd show paths raw format "%d %m %t %T" 2>/dev/null | awk -v m="$1" '$2==m && $3=="active" && $4=="ready"' | wc -l; }
mp_has() { [ "$(mp_active "$1")" -eq "$2" ]; }

step7() {
	kbegin
	local s2 d1 d2 map fpid base base2 rc
	d1=$(cat /run/ini-diskA)
	iscsiadm -m node -T $IQN -p 127.0.0.2:3260 --login 2>&1 | sed 's/^/   login| /'
	s2=$(sess_of $IQN 127.0.0.2) && wait_for 150 has_disk "$s2" 0 || { bad "no session to 127.0.0.2"; kcheck step7; return; }
	d2=$(disk_of "$s2" 0)
	ok "second path: session $s2 to 127.0.0.2:3260, LUN 0 is /dev/$d2"
	mp_conf 'wwid "1TIERCACHtcini0003"' 'path_grouping_policy multibus
		path_selector "round-robin 0"'

	udevadm settle -t 30
	multipathd >/dev/null 2>&1 || bad "multipathd did not start"
	wait_for 150 map_made "$d1" ||
		{ bad "multipathd made no map for /dev/$d1"; multipath -ll; multipathd show paths; kcheck step7; return; }
	map=$(map_of "$d1")
	wait_for 150 mp_has "$map" 2
	multipath -ll "$map" | sed 's/^/   mp| /'
	[ "$(mp_active "$map")" = 2 ] && multipath -ll "$map" | grep -q "$d1 " && multipath -ll "$map" | grep -q "$d2 " &&
		ok "multipath map $map has 2 active paths ($d1, $d2)" || { bad "map $map: $(mp_active "$map") active paths"; kcheck step7; return; }
	base=$(writes_done $d1)
	base2=$(writes_done $d2)
	fio --name=m --filename=/dev/mapper/$map --size=24M --rw=randwrite --bs=4k --ioengine=libaio --iodepth=8 --direct=1 \
		--verify=crc32c --do_verify=1 >/tmp/fio7.out 2>&1 &
	fpid=$!
	wait_for 300 more_writes $d1 "$base" 100 && wait_for 300 more_writes $d2 "$base2" 100 &&
		ok "I/O on /dev/mapper/$map goes over both paths ($(($(writes_done $d1) - base)) writes on $d1, $(($(writes_done $d2) - base2)) on $d2)" ||
		bad "I/O did not use both paths: $(($(writes_done $d1) - base)) writes on $d1, $(($(writes_done $d2) - base2)) on $d2"
	kill -0 $fpid 2>/dev/null || bad "fio ended before the path went down: make it longer"
	iscsiadm -m node -T $IQN -p 127.0.0.2:3260 --logout 2>&1 | sed 's/^/   logout| /'
	wait_for 150 mp_has "$map" 1 && ok "path $d2 (127.0.0.2) logged out under I/O: 1 active path left, fio $(kill -0 $fpid 2>/dev/null && echo still running || echo had ended)" ||
		bad "after the logout $(mp_active "$map") active paths"
	wait_for 1500 eval '! kill -0 '"$fpid"' 2>/dev/null' || { bad "fio still running 300 s later"; kill $fpid; }
	wait $fpid
	rc=$?
	fio_ok /tmp/fio7.out $rc "fio on /dev/mapper/$map across the path loss: no error, crc32c verify passed"
	iscsiadm -m node -T $IQN -p 127.0.0.2:3260 --login 2>&1 | sed 's/^/   login| /'
	wait_for 300 mp_has "$map" 2
	multipath -ll "$map" | sed 's/^/   mp| /'
	[ "$(mp_active "$map")" = 2 ] && ok "the path logged back in: $map has 2 active paths again" ||
		bad "after the re-login $(mp_active "$map") active paths"
	echo "$map" >/run/ini-map
	kcheck step7 'multipath|failing path|remaining active paths|Synchronizing SCSI cache'
}

# chap_login ALGS [PASSWORD_IN]: log in to the CHAP target offering ALGS, mutual
# CHAP with PASSWORD_IN (default the right one); tcpdump records the login on lo
chap_login() {
	local algs=$1 pin=${2:-mutualsecr5678} rc
	local -a set=(node.session.auth.authmethod CHAP node.session.auth.chap_algs "$algs"
		node.session.auth.username hostchap node.session.auth.password chapsecret1234
		node.session.auth.username_in tgtchap node.session.auth.password_in "$pin"
		node.session.initial_login_retry_max 1)
	local i
	for ((i = 0; i < ${#set[@]}; i += 2)); do
		iscsiadm -m node -T $CHAP_IQN -p 127.0.0.1:3260 -o update -n "${set[i]}" -v "${set[i + 1]}" || return 9
	done
	rm -f /tmp/chap.pcap
	tcpdump --immediate-mode -i lo -s 0 -U -w /tmp/chap.pcap 'tcp port 3260' >/tmp/tcpdump.out 2>&1 &
	local tp=$!
	wait_for 50 grep -q listening /tmp/tcpdump.out
	timeout 60 iscsiadm -m node -T $CHAP_IQN -p 127.0.0.1:3260 --login >/tmp/chap-login.out 2>&1
	rc=$?
	sleep 0.5
	kill $tp; wait $tp 2>/dev/null
	# the target's answer to CHAP_A=...: CHAP_A=<chosen> with CHAP_I and CHAP_C
	CHOSEN=$(tcpdump -r /tmp/chap.pcap -A 2>/dev/null | tr '\0' '\n' | grep -a -o 'CHAP_A=[0-9]*' | sort -u | tr '\n' ' ')
	# the target's mutual answer: its name and response
	TGT_ANSWERED=$(tcpdump -r /tmp/chap.pcap -A 2>/dev/null | tr '\0' '\n' | grep -a -c 'CHAP_N=tgtchap')
	udevadm settle -t 30 # let udev's probe of the new disk end before it goes
	iscsiadm -m node -T $CHAP_IQN -p 127.0.0.1:3260 --logout >/dev/null 2>&1
	return $rc
}

step9() {
	kbegin
	local out rc
	if chap_login "SHA3-256,SHA256,MD5"; then
		note "wire: $CHOSEN"
		[ "$CHOSEN" = "CHAP_A=8 " ] && ok "CHAP (mutual) offering SHA3-256,SHA256,MD5: logged in with SHA3-256 (CHAP_A=8)" ||
			bad "CHAP offering SHA3-256,SHA256,MD5: target answered $CHOSEN"
	else
		bad "CHAP login offering SHA3-256,SHA256,MD5: $(cat /tmp/chap-login.out)"
	fi
	if chap_login "SHA256,MD5"; then
		note "wire: $CHOSEN"
		[ "$CHOSEN" = "CHAP_A=7 " ] && ok "CHAP (mutual) offering SHA256,MD5: logged in with SHA-256 (CHAP_A=7)" ||
			bad "CHAP offering SHA256,MD5: target answered $CHOSEN"
	else
		bad "CHAP login offering SHA256,MD5: $(cat /tmp/chap-login.out)"
	fi
	if chap_login "MD5"; then
		note "wire: $CHOSEN"
		[ "$CHOSEN" = "CHAP_A=5 " ] && ok "CHAP (mutual) offering MD5 only: logged in with MD5 (CHAP_A=5)" ||
			bad "CHAP offering MD5: target answered $CHOSEN"
	else
		bad "CHAP login offering MD5: $(cat /tmp/chap-login.out)"
	fi
	chap_login "SHA256" wrongmutual5678
	rc=$?
	case $rc in
	0) bad "login succeeded although the target's mutual secret is not the one the initiator expects" ;;
	19 | 24)
		# 19: iscsid refused the target's proof (a non-retryable login failure)
		[ "$TGT_ANSWERED" -gt 0 ] &&
			ok "a wrong mutual secret: the target answered as tgtchap, the initiator refused its proof (iscsiadm rc $rc)" ||
			bad "the login with a wrong mutual secret failed before the target's mutual answer"
		;;
	*) bad "the login with a wrong mutual secret failed for another reason: $(cat /tmp/chap-login.out 2>/dev/null)" ;;
	esac
	out=$(grep -E 'hostchap|vmchap|CHAP|chap' /var/log/tiercached.log /var/log/tiercached-restart.log 2>/dev/null | tail -8)
	note "daemon log lines of these logins:"
	printf '%s\n' "$out" | sed 's/^/   log| /'
	kcheck step9 'authentication|auth|login|conn error|connection[0-9:]* .*error'
}

step10() {
	kbegin
	local s a0 a1 sg0 sg1 out rc
	s=$(cat /run/ini-sessA)
	a0=$(cat /run/ini-diskA)
	a1=$(disk_of "$s" 1) || { bad "no LUN 1 on session $s"; kcheck step10; return; }
	sg0=$(ls /sys/block/$a0/device/scsi_generic/)
	sg1=$(ls /sys/block/$a1/device/scsi_generic/)
	note "LUN 0 /dev/$a0 /dev/$sg0, LUN 1 /dev/$a1 /dev/$sg1"
	# LUN 1 (16 MiB, no cache) gets random data; it is copied onto the first
	# 16 MiB of LUN 0 (write-back cache) by the target itself
	head -c 16M /dev/urandom >/tmp/l1.bin
	dd if=/tmp/l1.bin of=/dev/$a1 bs=1M oflag=direct status=none || bad "filling LUN 1"
	# ODX with ddpt: Debian 12's ddpt 0.97 builds POPULATE TOKEN parameter
	# lists we must refuse: with skip=LBA,NUM lists it writes the range
	# descriptor one byte early (NUMBER OF LOGICAL BLOCKS reads 0x00800000:
	# LBA OUT OF RANGE), without them it asks for 0 blocks (INVALID FIELD IN
	# PARAMETER LIST, byte 14); seen on the wire with tcpdump. So not here.
	skip "ODX with ddpt --odx: bookworm's ddpt 0.97 sends malformed POPULATE TOKEN range descriptors (the target refuses them, rightly)"
	dd if=/dev/zero of=/dev/$a0 bs=1M count=16 oflag=direct status=none
	out=$(timeout 300 sg_xcopy if=/dev/$sg1 of=/dev/$sg0 bs=512 count=32768 2>&1)
	rc=$?
	printf '%s\n' "$out" | sed 's/^/   sg_xcopy| /'
	[ $rc = 0 ] && ok "EXTENDED COPY (LID1, sg_xcopy) LUN 1 -> LUN 0, 16 MiB" || bad "sg_xcopy rc=$rc"
	cmp /tmp/l1.bin <(dd if=/dev/$a0 bs=1M count=16 iflag=direct status=none) &&
		ok "cmp: the first 16 MiB of LUN 0 equal LUN 1 after the target-side copy" || bad "LUN 0 differs from LUN 1 after the copy"
	kcheck step10
}

# drop the guest's page cache: the next phase reads from the LUN
dropc() { sync; echo 3 >/proc/sys/vm/drop_caches; }

step11() {
	local d tb t=/var/lib/tiercache/ext4-build.trace rc
	d=$(cat /run/ini-diskA)
	tb=$(ls /usr/src/zlib_*.orig.tar.*) || { bad "no source tarball in /usr/src"; return; }
	rm -f $t
	tierctl -c /etc/tiercached.conf trace fast start $t || { bad "tierctl trace start"; return; }
	mkfs.ext4 -q -F /dev/$d && mkdir -p /mnt/rec && mount /dev/$d /mnt/rec || { bad "mkfs/mount /dev/$d"; return; }
	cp "$tb" /mnt/rec/ && dropc
	# three builds in trees of their own, as a build server keeps them;
	# the first tree is removed before the third build
	rc=0
	for i in 1 2 3; do
		[ $i = 3 ] && rm -rf /mnt/rec/b1 && dropc
		mkdir -p /mnt/rec/b$i && (cd /mnt/rec/b$i && tar xf "../${tb##*/}") && dropc || { bad "unpack $i"; rc=1; break; }
		(cd /mnt/rec/b$i/zlib-* && ./configure && make -j2 && dropc && make test && dropc &&
			make clean && make -j2 && dropc && tar cf - . | wc -c) >/tmp/build$i.log 2>&1 || { rc=$?; break; }
		tail -1 /tmp/build$i.log | sed "s/^/   build $i| /"
	done
	umount /mnt/rec
	tierctl -c /etc/tiercached.conf trace fast stop | sed 's/^/   trace| /'
	[ $rc = 0 ] && ok "zlib unpacked, configured, built, tested and rebuilt three times on ext4 on LUN 0" || bad "the builds (rc $rc)"
	ok "trace: $(grep -vc '^#' $t) requests"
	echo "TRACE-BEGIN"
	xz -6 -c $t | base64 -w 76 # -9 wants more memory than the guest has
	echo "TRACE-END"
}

# --- step 12: ALUA multipath over two gateways of one RBD image ---------------
# The gateways run on the host (Ceph is there), reached at 10.0.2.2 (qemu's
# user network forwards it to the host's 127.0.0.1); the host side of the step
# is tests/system/vm-failover-host.sh, which calls these in turn.
FO_IQN=iqn.2026-11.io.tiercache:fo
FO_HOST=10.0.2.2
# the settings README.md documents for hosts on several gateways
FO_REPL=3
# fo_path DEV: "DM_STATE CHECKER_STATE PRIO" of path DEV in multipathd's view
fo_path() { multipathd show paths raw format "%d %t %T %p" 2>/dev/null | awk -v d="$1" '$1==d{print $2, $3, $4}'; }
fo_path_is() { [ "$(fo_path "$1")" = "$2" ]; }
fo_dev() { cat /run/fo-dev$1; }
fo_show() { multipath -ll "$(cat /run/fo-map)" 2>&1 | sed 's/^/   mp| /'; }

# step12 up PORT_A PORT_B: log in to gateway A (the image's owner) and B,
# multipath with the README's settings; both paths up, A's the one in use
step12_up() {
	kbegin
	local p g s d map
	for g in A B; do
		[ $g = A ] && p=$1 || p=$2
		iscsiadm -m node -o new -T $FO_IQN -p $FO_HOST:$p >/dev/null &&
			iscsiadm -m node -T $FO_IQN -p $FO_HOST:$p -o update -n node.session.timeo.replacement_timeout -v $FO_REPL &&
			iscsiadm -m node -T $FO_IQN -p $FO_HOST:$p --login 2>&1 | sed 's/^/   login| /'
		s=$(sess_of $FO_IQN $FO_HOST:$p) && wait_for 150 has_disk "$s" 0 || { bad "no session or disk to gateway $g ($FO_HOST:$p)"; kcheck step12; return; }
		d=$(disk_of "$s" 0)
		echo $d >/run/fo-dev$g
		echo $s >/run/fo-sess$g
		ok "gateway $g: session $s to $FO_HOST:$p, the image is /dev/$d (replacement_timeout $(cat /sys/class/iscsi_session/session$s/recovery_tmo) s)"
	done
	mp_conf "" "hardware_handler \"1 alua\"
		prio alua
		path_grouping_policy failover
		failback immediate
		fast_io_fail_tmo $FO_REPL"

	udevadm settle -t 30
	if pgrep -x multipathd >/dev/null; then multipathd reconfigure >/dev/null; else multipathd >/dev/null 2>&1 || bad "multipathd did not start"; fi
	wait_for 150 map_made "$(fo_dev A)" || { bad "no multipath map for /dev/$(fo_dev A)"; multipath -ll; kcheck step12; return; }
	map=$(map_of "$(fo_dev A)")
	echo $map >/run/fo-map
	[ "$(map_of "$(fo_dev B)")" = "$map" ] || { bad "/dev/$(fo_dev B) is not a path of $map"; fo_show; kcheck step12; return; }
	# ALUA priorities: 50 active/optimized (the owner), 10 active/non-optimized
	wait_for 150 fo_path_is "$(fo_dev A)" "active ready 50" && wait_for 150 fo_path_is "$(fo_dev B)" "active ready 10" &&
		ok "map $map: A's path /dev/$(fo_dev A) active/optimized (prio 50), B's /dev/$(fo_dev B) active/non-optimized (prio 10)" ||
		bad "map $map: A's path is '$(fo_path "$(fo_dev A)")', B's '$(fo_path "$(fo_dev B)")'"
	# multipathd sets an iSCSI session's replacement timeout to fast_io_fail_tmo
	for g in A B; do
		s=$(cat /run/fo-sess$g)
		[ "$(cat /sys/class/iscsi_session/session$s/recovery_tmo)" = $FO_REPL ] &&
			ok "gateway $g's session: replacement timeout $FO_REPL s under multipathd" ||
			bad "gateway $g's session $s: replacement timeout $(cat /sys/class/iscsi_session/session$s/recovery_tmo) s, not $FO_REPL"
	done
	fo_show
	kcheck step12 'alua|multipath'
}

# step12 load OWNER OTHER: fio with verify on the map, in the background;
# returns once OWNER's path has done 400 writes (OTHER's none: failover
# grouping)
step12_load() {
	kbegin
	local o=$1 x=$2 a b base bb map
	map=$(cat /run/fo-map)
	a=$(fo_dev $o)
	b=$(fo_dev $x)
	base=$(writes_done $a)
	bb=$(writes_done $b)
	rm -f /tmp/fo_*.log
	setsid fio --name=fo --filename=/dev/mapper/$map --size=48M --rw=randwrite --bs=4k --ioengine=libaio --iodepth=8 \
		--direct=1 --verify=crc32c --do_verify=1 --write_lat_log=/tmp/fo --log_avg_msec=0 \
		>/tmp/fio12.out 2>&1 </dev/null &
	echo $! >/run/fo-fio.pid
	wait_for 300 more_writes $a "$base" 400 || { bad "fio wrote less than 400 blocks on $o's path in 60 s"; return; }
	kill -0 "$(cat /run/fo-fio.pid)" 2>/dev/null || { bad "fio ended before the owner went: make it longer"; return; }
	[ "$(writes_done $b)" = "$bb" ] && ok "fio on /dev/mapper/$map writes through $o only ($(($(writes_done $a) - base)) writes on $a, 0 on $b)" ||
		bad "$x's path took $(($(writes_done $b) - bb)) writes while $o was optimized"
	writes_done $b >/run/fo-bbase
}

# step12 after OLD NEW HOW: OLD went (HOW: killed, frozen); fio finishes
# without an error, its verify passes, the writes moved to NEW's path, and
# the longest gap between two completions (fio's per-I/O log) is the pause
# the host saw
step12_after() {
	local o=$1 n=$2 how=$3 fpid rc a b map
	map=$(cat /run/fo-map)
	a=$(fo_dev $o)
	b=$(fo_dev $n)
	fpid=$(cat /run/fo-fio.pid)
	wait_for 3000 eval '! kill -0 '"$fpid"' 2>/dev/null' || { bad "fio still running 600 s later"; kill $fpid; }
	rc=$(sed -n 's/.*err= *\([0-9]*\).*/\1/p' /tmp/fio12.out | head -1)
	fio_ok /tmp/fio12.out "${rc:-1}" "fio on /dev/mapper/$map across the owner $how: no error, crc32c verify of all 48 MiB passed"
	[ "$(writes_done $b)" -gt "$(cat /run/fo-bbase)" ] && ok "the writes moved to $n's path ($(($(writes_done $b) - $(cat /run/fo-bbase))) on $b)" ||
		bad "$n's path took no writes after the owner went"
	fo_show
	# fio's log: completion time (ms since the start), latency, direction, size, offset
	awk -F', *' '{print $1}' /tmp/fo_clat.1.log | sort -n | awk 'NR > 1 && $1 - p > g { g = $1 - p; at = p } { p = $1 }
		END { printf "%.3f %.3f %d\n", g / 1000, at / 1000, NR }' >/run/fo-pause
	read -r gap at cnt </run/fo-pause
	note "fio logged $cnt completions; the longest gap between two: $gap s, from $at s after fio started"
	echo "PAUSE $gap"
	wait_for 50 fo_path_is "$b" "active ready 50" && ok "$n's path is active/optimized now (prio 50)" ||
		bad "$n's path is '$(fo_path "$b")'"
	# the dead path's own I/O errors are multipath's to take (fio saw none);
	# one on the map would not be. A frozen target's commands come back
	# for a retry when its connection is dropped.
	kcheck step12 "alua|multipath: .*Failing path|conn error|session recovery|ping timeout|I/O error, dev $a, |\[$a\] tag#[0-9]+ FAILED Result: hostbyte=DID_TRANSPORT_(DISRUPTED|FAILFAST)"
}

# step12 back OLD NEW: OLD is serving again (restarted, or thawed and
# reconnected); its session logs in again by itself and its path comes
# back active/non-optimized, with the I/O staying on NEW
step12_back() {
	local o=$1 n=$2 a b s
	a=$(fo_dev $o)
	b=$(fo_dev $n)
	s=$(cat /run/fo-sess$o)
	wait_for 600 eval '[ "$(sess_state '"$s"')" = LOGGED_IN ]' && ok "$o's session $s logged in again by itself" ||
		{ bad "$o's session $s is $(sess_state "$s") 120 s after $o came back"; return; }
	wait_for 150 fo_path_is "$a" "active ready 10" && wait_for 50 fo_path_is "$b" "active ready 50" &&
		ok "$o's path is back as active/non-optimized (prio 10), $n's stays optimized" ||
		bad "after $o's return $o's path is '$(fo_path "$a")', $n's '$(fo_path "$b")'"
	fo_show
	local base=$(writes_done $a) bb=$(writes_done $b)
	dd if=/dev/zero of=/dev/mapper/$(cat /run/fo-map) bs=4k count=64 oflag=direct 2>/dev/null
	[ "$(writes_done $a)" = "$base" ] && [ "$(writes_done $b)" -ge $((bb + 64)) ] &&
		ok "new writes go to $n only (failback follows the owner, not the first path)" ||
		bad "after $o's return: $(($(writes_done $a) - base)) writes on $o's path, $(($(writes_done $b) - bb)) on $n's"
}
step12() { "step12_$@"; }

"$@"
EOF
chmod 755 "$R/sbin/ini-steps"
}

build() {
	vm_root_boot "$R" ini "$ROOT_MODS" || exit 1
	write_guest_init
	write_guest_steps
	write_conf
	# the initiator's own name and timeouts; no records from an earlier run
	echo "InitiatorName=iqn.2026-11.io.tiercache:hosta" >"$R/etc/iscsi/initiatorname.iscsi"
	sed -i -e 's/^node.session.timeo.replacement_timeout = .*/node.session.timeo.replacement_timeout = 120/' \
		"$R/etc/iscsi/iscsid.conf"
	rm -rf "$R"/etc/iscsi/{nodes,send_targets,ifaces} "$R"/etc/multipath.conf "$R"/etc/multipath/{bindings,wwids}
	rm -f "$W/ini-root.img" "$W/ini-data.img"
	rm -f "$R"/usr/src/zlib_*
	if recording; then cp "$W"/src/zlib_*.orig.tar.* "$R/usr/src/"; fi
	mkfs.ext4 -q -F -L tcroot -d "$R" "$W/ini-root.img" 1G
	# the daemon's state_dir, backing files and cache legs: a fresh filesystem each run
	mkfs.ext4 -q -F -L tcdata "$W/ini-data.img" 512M
}

boot() {
	rm -f "$W/ini-serial.log"
	local t0
	t0=$(now)
	qemu-system-x86_64 -accel tcg -cpu max -m "$MEM" -smp 1 -display none -monitor none \
		-serial file:"$W/ini-serial.log" -no-reboot -kernel "$W/ini-vmlinuz" -initrd "$W/ini-initrd.cpio" \
		-append "console=ttyS0 quiet panic=-1" \
		-drive file="$W/ini-root.img",if=virtio,format=raw,cache=unsafe \
		-drive file="$W/ini-data.img",if=virtio,format=raw,cache=unsafe \
		-netdev user,id=n0,hostfwd=tcp:127.0.0.1:$PORT-:3260,hostfwd=tcp:127.0.0.1:$DBGPORT-:2323 \
		-device virtio-net-pci,netdev=n0 >"$W/ini-qemu.out" 2>&1 &
	echo $! >"$W/ini-qemu.pid"
	local rc=0
	vm_wait_ready "$W/ini-serial.log" "$W/ini-qemu.pid" 1500 || rc=1
	echo "BOOT: qemu start -> target ready: $(since "$t0") s"
	grep -E 'PROBE|tiercached:' "$W/ini-serial.log" || true
	return $rc
}

# gsh SCRIPT: run SCRIPT with bash in the guest, stdin /dev/null (so fio and
# friends cannot eat the rest of it), at most TMO seconds
gsh() {
	local tmo=${TMO:-900}
	printf 'echo %s | base64 -d >/tmp/gsh.sh\ntimeout %s bash /tmp/gsh.sh </dev/null 2>&1\nexit\n' \
		"$(printf '%s' "$*" | base64 -w0)" "$tmo" | socat -t "$((tmo + 30))" - TCP:127.0.0.1:$DBGPORT
}

RC=0
check() {
	local n t0 out title
	for n in $STEPS; do
		case $n in
		1) title="discovery, login, our disk" ;;
		2) title="the kernel's view of our limits" ;;
		3) title="ext4 + fio verify + fsck + sums" ;;
		4) title="fstrim and blkdiscard" ;;
		5) title="persistent reservations from two initiator names" ;;
		6) title="kill -9 of tiercached under fio" ;;
		7) title="dm-multipath over two portals, one path lost under I/O" ;;
		9) title="(extra) CHAP: SHA3-256, SHA-256, MD5, mutual" ;;
		10) title="(extra) ODX with ddpt, EXTENDED COPY with sg_xcopy" ;;
		11) title="(recording) a trace of ext4 while a source tree is unpacked and built" ;;
		12) title="dm-multipath (ALUA) over two gateways of one RBD image, the owner killed, then frozen, under fio" ;;
		esac
		echo "== step $n: $title"
		t0=$(now)
		if [ "$n" = 11 ]; then
			out=$(TMO=3000 gsh "/sbin/ini-steps step$n") || true # three builds under TCG
		elif [ "$n" = 12 ]; then
			# Ceph and the gateways run on the host; the script drives the guest
			out=$(DBGPORT=$DBGPORT TC_VM_DIR=$W TC_BIN=$(realpath "$BUILD/tiercached") \
				bash tests/system/vm-failover-host.sh 2>&1) || true
		else
			out=$(gsh "/sbin/ini-steps step$n") || true
		fi
		if [ "$n" = 11 ]; then
			echo "$out" | sed -n '/^TRACE-BEGIN$/,/^TRACE-END$/p' | sed '1d;$d' | base64 -d >"$W/ext4-build.trace.xz" &&
				echo "   the trace: $W/ext4-build.trace.xz ($(stat -c %s "$W/ext4-build.trace.xz") bytes)"
			out=$(echo "$out" | sed '/^TRACE-BEGIN$/,/^TRACE-END$/d')
		fi
		echo "$out"
		echo "   (step $n: $(since "$t0") s)"
		echo "$out" | grep -q '^FAIL: ' && RC=1
		echo "$out" | grep -qE '^(ok|SKIP): ' || { echo "FAIL: step $n printed no result"; RC=1; }
	done
	echo "== daemon log (errors and warnings)"
	gsh 'grep -hiE "error|warn|fail|crash|recover" /var/log/tiercached.log /var/log/tiercached-restart.log 2>/dev/null | tail -40' || true
}

stop() { [ -f "$W/ini-qemu.pid" ] && kill "$(cat "$W/ini-qemu.pid")" 2>/dev/null; rm -f "$W/ini-qemu.pid"; true; }

case "${1:-all}" in
setup) setup ;;
build) build ;;
boot) boot ;;
check) check; exit $RC ;;
stop) stop ;;
gsh) shift; gsh "$*" ;;
# push: copy the current step script into the running guest (while debugging)
push) write_guest_steps; gsh "echo $(base64 -w0 "$R/sbin/ini-steps") | base64 -d >/sbin/ini-steps" ;;
all) vm_all "kernel iSCSI initiator (open-iscsi, multipath) + tiercached system test" setup ;;
*) echo "usage: $0 [setup|build|boot|check|stop|gsh CMD|push|all]"; exit 2 ;;
esac
