#!/usr/bin/env bash
# The Debian package, built and installed the way an admin gets it (issue 15
# part 6). From the committed tree (git archive HEAD, so what is built is
# what is committed):
#   1. dpkg-buildpackage -us -uc -b builds tiercache_VERSION_amd64.deb, and a
#      second one a version higher (an upgrade); lintian finds no error or
#      warning in either; a third, higher still, is built from OLD_FORMAT_REV;
#   2. into a fresh Debian 12 root (debootstrap minbase, a new copy each run)
#      apt installs it with its dependencies from the archive: the daemon,
#      tierctl, the unit, the man pages and the commented configuration
#      (mode 0640, a conffile) are there, the state directory exists (0700),
#      tiercached --check accepts the shipped configuration, and nothing was
#      enabled or started;
#   3. the admin edits the configuration; the upgrade keeps the edit and
#      installs the new version;
#   4. apt remove leaves the configuration, purge takes it (and the state
#      directory, being empty);
#   5. in a Debian 12 guest booted with systemd (Debian's kernel under qemu),
#      with the service enabled and serving a write-back LUN with dirty data:
#      - the upgrade stops the old daemon cleanly and starts the new one,
#        which serves the same bytes from the cache legs (the backing store
#        does not hold them yet);
#      - an "upgrade" to a build that cannot read the legs' on-disk format
#        (the last release that wrote format 3, OLD_FORMAT_REV) is installed
#        but never started, by the package or by the admin, and the legs
#        are not changed;
#      - going back to a build that reads them, the data is all there.
#
#   bash tests/system/run-pkg.sh      (root; needs the Debian archive)
#   PKG_GUEST_ONLY=1 bash ...         only part 5 (reuses the packages built before);
#                                     KEEP=1 leaves its guest running (shell: port DBGPORT)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT_DIR=$PWD
W=${TC_VM_DIR:-/var/tmp/tiercache-vm}
mkdir -p "$W"
R=$W/pkg-root
PASSED=0
ok() { echo "ok: $*"; PASSED=$((PASSED + 1)); }
die() { echo "FAIL: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "SKIP: the package test needs root (debootstrap, chroot)"; exit 77; }

need=()
for t in dpkg-buildpackage:dpkg-dev dh:debhelper lintian:lintian debootstrap:debootstrap; do
	command -v "${t%%:*}" >/dev/null || need+=("${t#*:}")
done
if [ ${#need[@]} -gt 0 ]; then
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

# --- 1. build two versions from the committed tree, and one that reads only format 3
# The last commit whose tiercached wrote on-disk format 3; it refuses version 4
# sets, so a package of it, numbered as an upgrade, must never be started on one.
OLD_FORMAT_REV=1b9c82c
GUEST_ONLY=${PKG_GUEST_ONLY:-0}
B=$W/pkg-build
v1=$(git show HEAD:debian/changelog | dpkg-parsechangelog -l - -S Version)
v2=$v1+up1
v3=$v1+up2
deb1=$B/tiercache_${v1}_amd64.deb
deb2=$B/tiercache_${v2}_amd64.deb
deb3=$B/tiercache_${v3}_amd64.deb
bump() { # DIR VERSION WHY: a changelog entry on top
	{
		printf 'tiercache (%s) bookworm; urgency=medium\n\n  * %s\n\n' "$2" "$3"
		printf ' -- tiercache developers <team@tiercache.io>  %s\n\n' "$(date -R)"
		cat "$1/debian/changelog"
	} >"$1/debian/changelog.new"
	mv "$1/debian/changelog.new" "$1/debian/changelog"
}
if [ "$GUEST_ONLY" = 0 ] || [ ! -f "$deb1" ] || [ ! -f "$deb2" ] || [ ! -f "$deb3" ]; then
	rm -rf "$B"
	mkdir -p "$B/v1" "$B/v2" "$B/v3"
	git archive HEAD | tar -x -C "$B/v1/"
	git archive HEAD | tar -x -C "$B/v2/"
	git archive "$OLD_FORMAT_REV" | tar -x -C "$B/v3/"
	bump "$B/v2" "$v2" "A rebuild, to test upgrades."
	echo "# rebuilt as $v2, to test upgrades" >>"$B/v2/systemd/tiercached.service" # a changed unit
	bump "$B/v3" "$v3" "Format 3 only, to test the guard on upgrades."
	for v in v1 v2 v3; do
		(cd "$B/$v" && dpkg-buildpackage -us -uc -b >"$B/$v.log" 2>&1) ||
			die "dpkg-buildpackage ($v): $(tail -15 "$B/$v.log")"
	done
	[ -f "$deb1" ] && [ -f "$deb2" ] && [ -f "$deb3" ] || die "no .deb: $(ls "$B")"
	for d in "$deb1" "$deb2"; do
		out=$(lintian "$d" 2>&1 | grep -v 'running with root privileges' || true)
		[ -z "$(printf '%s\n' "$out" | grep -E '^[EW]:' || true)" ] || die "lintian $(basename "$d"): $out"
	done
	ok "dpkg-buildpackage built $(basename "$deb1") and $(basename "$deb2") (lintian finds no error or warning), and $(basename "$deb3") from $OLD_FORMAT_REV"
fi

# fresh_root DIR TARBALL [PACKAGES]: a new Debian 12 root in DIR from TARBALL
# (debootstrap minbase with PACKAGES, made on the first run), /proc mounted
# and apt's downloads kept between runs
root_umount() {
	for m in var/cache/apt/archives proc; do
		mountpoint -q "$1/$m" && umount "$1/$m"
	done
	return 0
}
fresh_root() {
	local dir=$1 tarball=$2 inc=${3:-}
	if [ ! -f "$tarball" ]; then
		root_umount "$dir"
		rm -rf "$dir"
		debootstrap --variant=minbase ${inc:+--include=$inc} bookworm "$dir" http://deb.debian.org/debian \
			>"$W/pkg-debootstrap.log" 2>&1 || die "debootstrap: $(tail -5 "$W/pkg-debootstrap.log")"
		chroot "$dir" apt-get clean
		tar -C "$dir" -cf "$tarball" .
	fi
	root_umount "$dir"
	rm -rf "$dir"
	mkdir -p "$dir" "$W/pkg-apt"
	tar -C "$dir" -xf "$tarball"
	cp /etc/resolv.conf "$dir/etc/resolv.conf"
	mount -t proc proc "$dir/proc"
	mount --bind "$W/pkg-apt" "$dir/var/cache/apt/archives"
}
G=$W/pkg-guest-root
QPID=
cleanup() {
	root_umount "$R"
	root_umount "$G"
	[ -z "$QPID" ] || [ "${KEEP:-0}" = 1 ] || kill "$QPID" 2>/dev/null || true
	return 0
}
trap cleanup EXIT

if [ "$GUEST_ONLY" = 0 ]; then
	# --- 2. a fresh Debian 12 root ------------------------------------------------------
	fresh_root "$R" "$W/pkg-base.tar"
	cp "$deb1" "$deb2" "$R/tmp/"
	in_root() { chroot "$R" env DEBIAN_FRONTEND=noninteractive LC_ALL=C "$@"; }
	in_root apt-get update -qq >"$W/pkg-apt.log" 2>&1 || die "apt-get update in the root: $(tail -5 "$W/pkg-apt.log")"
	in_root apt-get install -y -qq "/tmp/$(basename "$deb1")" >>"$W/pkg-apt.log" 2>&1 ||
		die "apt-get install $(basename "$deb1"): $(tail -15 "$W/pkg-apt.log")"
	for f in /usr/sbin/tiercached /usr/sbin/tierctl /usr/lib/systemd/system/tiercached.service \
		/usr/share/man/man8/tiercached.8.gz /usr/share/man/man8/tierctl.8.gz /usr/share/man/man5/tiercached.conf.5.gz \
		/etc/tiercache/tiercached.conf; do
		[ -e "$R$f" ] || die "$f is not installed"
	done
	[ "$(stat -c %a "$R/etc/tiercache/tiercached.conf")" = 640 ] ||
		die "/etc/tiercache/tiercached.conf has mode $(stat -c %a "$R/etc/tiercache/tiercached.conf"), not 0640 (it may hold CHAP secrets)"
	grep -qx /etc/tiercache/tiercached.conf "$R/var/lib/dpkg/info/tiercache.conffiles" ||
		die "the configuration is not a conffile"
	[ "$(stat -c %a "$R/var/lib/tiercache")" = 700 ] || die "/var/lib/tiercache: mode $(stat -c %a "$R/var/lib/tiercache")"
	grep -q '^; ' "$R/etc/tiercache/tiercached.conf" || die "the shipped configuration has no comments"
	out=$(in_root tiercached -c /etc/tiercache/tiercached.conf --check 2>&1) || die "tiercached --check in the root: $out"
	[ -z "$(ls "$R/etc/systemd/system/multi-user.target.wants/" 2>/dev/null | grep tiercached || true)" ] ||
		die "the package enabled tiercached.service"
	for p in /proc/[0-9]*; do
		[ "$(readlink "$p/root" 2>/dev/null)" = "$R" ] && die "$(tr '\0' ' ' <"$p/cmdline") runs in the root after the installation"
	done
	in_root tierctl status --json -c /etc/tiercache/tiercached.conf >/dev/null 2>&1 &&
		die "tierctl reached a daemon after the installation: it was started"
	ok "apt installed $(basename "$deb1") in a fresh Debian 12 root: files, conffile 0640, state dir 0700, --check ($out), not enabled or started"

	# --- 3. the admin's edit survives an upgrade ------------------------------------------
	echo "; an admin was here" >>"$R/etc/tiercache/tiercached.conf"
	in_root apt-get install -y -qq "/tmp/$(basename "$deb2")" >>"$W/pkg-apt.log" 2>&1 ||
		die "the upgrade to $v2: $(tail -15 "$W/pkg-apt.log")"
	[ "$(in_root dpkg-query -W -f='${Version}' tiercache)" = "$v2" ] || die "the upgrade did not install $v2"
	grep -q '^; an admin was here' "$R/etc/tiercache/tiercached.conf" || die "the upgrade overwrote the admin's configuration"
	ok "the upgrade to $v2 kept the admin's edit of the configuration"

	# --- 4. remove, purge -------------------------------------------------------------------
	in_root apt-get remove -y -qq tiercache >>"$W/pkg-apt.log" 2>&1 || die "apt-get remove: $(tail -5 "$W/pkg-apt.log")"
	[ ! -e "$R/usr/sbin/tiercached" ] || die "remove left /usr/sbin/tiercached"
	[ -e "$R/etc/tiercache/tiercached.conf" ] || die "remove took the configuration (only purge may)"
	in_root apt-get purge -y -qq tiercache >>"$W/pkg-apt.log" 2>&1 || die "apt-get purge: $(tail -5 "$W/pkg-apt.log")"
	[ ! -e "$R/etc/tiercache/tiercached.conf" ] || die "purge left the configuration"
	[ ! -e "$R/var/lib/tiercache" ] || die "purge left the empty state directory"
	ok "remove keeps the configuration, purge takes it and the empty state directory"
fi

# --- 5. upgrades over a running daemon with dirty data, in a guest booted with systemd -
# The maintainer scripts stop and start the service only where systemd runs,
# so this part boots one: Debian's kernel under qemu, a debootstrap'ed root
# with systemd as init, the package installed by apt, the service enabled.
# The host writes through the guest's portal (qemu's user network).
bash tests/system/run-vm-tcmu.sh setup >/dev/null # qemu, busybox, Debian's kernel in $W/kroot
command -v mkfs.ext4 >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq e2fsprogs >/dev/null
VMDIR=$W
. tests/system/lib-vm.sh # now, since, vm_root_boot
PORT=${PORT:-13266}
DBGPORT=${DBGPORT:-12329}
IQN=iqn.2026-12.io.tiercache:pkgup
URL=iscsi://127.0.0.1:$PORT/$IQN/0
fresh_root "$G" "$W/pkg-guest-base.tar" systemd,systemd-sysv,udev,dbus,kmod,iproute2,busybox,procps
cp "$deb1" "$deb2" "$deb3" "$G/root/"
in_guest_root() { chroot "$G" env DEBIAN_FRONTEND=noninteractive LC_ALL=C "$@"; }
in_guest_root apt-get update -qq >"$W/pkg-guest-apt.log" 2>&1 || die "apt-get update in the guest root: $(tail -5 "$W/pkg-guest-apt.log")"
in_guest_root apt-get install -y -qq "/root/$(basename "$deb1")" >>"$W/pkg-guest-apt.log" 2>&1 ||
	die "apt-get install $(basename "$deb1") in the guest root: $(tail -15 "$W/pkg-guest-apt.log")"
root_umount "$G"
# the admin's configuration: a write-back LUN on file legs whose cleaner is
# capped low, so the data written below is still dirty at each upgrade
cat >"$G/etc/tiercache/tiercached.conf" <<CONF
[daemon]
state_dir = /var/lib/tiercache
control_socket = /run/tiercache/control.sock

[portal]
listen = 0.0.0.0:3260

[target $IQN]
lun0 = up

[lun up]
backing = /var/lib/tiercache/hdd.img
size = 64M
cache = fast

[cache fast]
legs = /var/lib/tiercache/nvme0.img /var/lib/tiercache/nvme1.img
size = 128M
mode = write-back
seq_cutoff = 0
destage_max = 64K
CONF
in_guest_root systemctl enable tiercached.service >/dev/null 2>&1 || die "systemctl enable tiercached in the guest root"
# the test's way in: a shell on port 2323, and the network it needs
cat >"$G/etc/systemd/system/tc-test-shell.service" <<'UNIT'
[Unit]
Description=run-pkg.sh's shell (a test guest only)
[Service]
ExecStartPre=/bin/sh -c 'modprobe virtio_net; for i in $(seq 1 100); do ip link show eth0 >/dev/null 2>&1 && break; sleep 0.1; done; ip link set lo up; ip link set eth0 up; ip addr add 10.0.2.15/24 dev eth0; ip route add default via 10.0.2.2'
# busybox nc ignores SIGCHLD, and its children would inherit that (dpkg waits on its own)
ExecStart=/bin/busybox nc -ll -p 2323 -e /usr/bin/perl -e '$$SIG{CHLD} = "DEFAULT"; exec "/bin/bash"'
[Install]
WantedBy=multi-user.target
UNIT
in_guest_root systemctl enable tc-test-shell.service >/dev/null 2>&1 || die "systemctl enable tc-test-shell in the guest root"
printf '#!/bin/sh\nexec /lib/systemd/systemd\n' >"$G/sbin/tc-init"
chmod 755 "$G/sbin/tc-init"
echo pkgguest >"$G/etc/hostname"
: >"$G/etc/machine-id"
VM_ROOT_BINARIES=0 vm_root_boot "$G" pkgguest "virtio_net uio" || die "vm_root_boot"
rm -f "$W/pkg-guest.img"
mkfs.ext4 -q -F -L tcroot -d "$G" "$W/pkg-guest.img" 2G || die "mkfs.ext4 of the guest root"
rm -f "$W/pkg-guest-serial.log"
qemu-system-x86_64 -accel tcg -cpu max -m "${MEM:-1024}" -smp 1 -display none -monitor none \
	-serial file:"$W/pkg-guest-serial.log" -no-reboot -kernel "$W/pkgguest-vmlinuz" -initrd "$W/pkgguest-initrd.cpio" \
	-append "console=ttyS0 panic=-1 net.ifnames=0 systemd.log_color=0" \
	-drive file="$W/pkg-guest.img",if=virtio,format=raw,cache=unsafe \
	-netdev user,id=n0,hostfwd=tcp:127.0.0.1:$PORT-:3260,hostfwd=tcp:127.0.0.1:$DBGPORT-:2323 \
	-device virtio-net-pci,netdev=n0 >"$W/pkg-guest-qemu.out" 2>&1 &
QPID=$!
gsh() { printf '%s\nexit\n' "$*" | socat -t 120 - TCP:127.0.0.1:$DBGPORT 2>/dev/null; }
# grun COMMAND: COMMAND's own exit status in the guest
grun() { [ "$(gsh "{ $*; } >/dev/null 2>&1; echo rc=\$?" | tail -1)" = rc=0 ]; }
t0=$(now)
for _ in $(seq 1 600); do
	[ "$(gsh 'echo shell-ready')" = shell-ready ] && break
	kill -0 "$QPID" 2>/dev/null || die "qemu exited: $(tail -20 "$W/pkg-guest-serial.log")"
	sleep 0.5
done
[ "$(gsh 'echo shell-ready')" = shell-ready ] || die "the guest's shell never answered: $(tail -20 "$W/pkg-guest-serial.log")"
# gwait SECONDS COMMAND: until COMMAND succeeds in the guest
gwait() { grun "for i in \$(seq 1 $(($1 * 5))); do $2 && break; sleep 0.2; done; $2"; }
gwait 120 'systemctl is-active -q tiercached' ||
	die "tiercached.service is not active in the guest: $(gsh 'systemctl status tiercached --no-pager; journalctl -u tiercached --no-pager | tail -20')"
echo "guest: systemd up and tiercached.service active after $(since "$t0") s"
gdirty() { gsh 'tierctl --json status' | grep -o '"dirty_bytes": *[0-9]*' | head -1 | grep -o '[0-9]*$'; }
gpid() { gsh 'systemctl show -p MainPID --value tiercached'; }
data=$W/pkg-data.raw
head -c 16M /dev/urandom >"$data"
qemu-img convert -n -f raw -O raw "$data" "$URL" || die "writing 16 MiB through the guest's portal"
d0=$(gdirty)
[ "${d0:-0}" -gt $((8 << 20)) ] || die "only ${d0:-no} dirty bytes after writing 16 MiB (the test needs dirty data to upgrade over)"
back_sum=$(gsh 'head -c 16777216 /var/lib/tiercache/hdd.img | md5sum' | cut -d' ' -f1)
[ "$back_sum" != "$(md5sum <"$data" | cut -d' ' -f1)" ] || die "the backing store already holds the data"
ok "the guest serves a write-back LUN under systemd: 16 MiB written, $d0 bytes dirty, not on the backing store"

# readback WHAT: the 16 MiB read through the portal equal what was written
readback() {
	rm -f "$W/pkg-back.raw"
	qemu-img dd -f raw -O raw bs=1M count=16 if="$URL" of="$W/pkg-back.raw" 2>/dev/null || die "reading back $1"
	cmp -s "$data" "$W/pkg-back.raw" || die "the data read back $1 differs from what was written"
}

# a: the upgrade to a build that reads the format
pid0=$(gpid)
out=$(gsh "dpkg --force-confold -i /root/$(basename "$deb2") 2>&1; echo rc=\$?")
echo "$out" | grep -q '^rc=0$' || die "dpkg -i $(basename "$deb2"): $out"
gwait 60 'systemctl is-active -q tiercached' || die "tiercached.service not active after the upgrade: $(gsh 'journalctl -u tiercached --no-pager | tail -20')"
pid1=$(gpid)
[ -n "$pid1" ] && [ "$pid1" != 0 ] && [ "$pid1" != "$pid0" ] || die "the upgrade did not restart the daemon (MainPID $pid0, then $pid1)"
log=$(gsh 'journalctl -u tiercached --no-pager -o cat')
echo "$log" | grep -q "clean shutdown recorded" && echo "$log" | grep -q "stopped cleanly" ||
	die "the old daemon did not stop cleanly: $(echo "$log" | tail -20)"
d1=$(gdirty)
[ "${d1:-0}" -gt $((4 << 20)) ] || die "${d1:-no} dirty bytes after the upgrade (${d0} before)"
readback "after the upgrade to $v2"
[ "$(gsh "dpkg-query -W -f='\${Version}' tiercache")" = "$v2" ] || die "dpkg says $v2 is not installed"
[ "$(gsh 'systemctl show -p NeedDaemonReload --value tiercached')" = no ] ||
	die "systemd still runs the old unit file after the upgrade (no daemon-reload)"
ok "upgrade to $v2 under systemd: the old daemon stopped cleanly (pid $pid0), the new unit is loaded, the new daemon (pid $pid1) serves the same 16 MiB, $d1 bytes still dirty"

# b: an "upgrade" to a build that cannot read format 4 is never started
out=$(gsh "dpkg --force-confold -i /root/$(basename "$deb3") 2>&1; echo rc=\$?")
echo "$out" | grep -q '^rc=0$' || die "dpkg -i $(basename "$deb3"): $out"
echo "$out" | grep -q "the service stays stopped" || die "the package did not say why it left the service stopped: $out"
grun 'systemctl is-active -q tiercached' && die "the format 3 build runs on a format 4 set: $(gsh 'journalctl -u tiercached --no-pager | tail -5')"
# the admin tries: the unit's --check refuses (the daemon's own start would log "starting with")
cur=$(gsh 'journalctl -u tiercached -n 0 --show-cursor --no-pager' | sed -n 's/^-- cursor: //p')
[ -n "$cur" ] || die "no journal cursor in the guest"
sums0=$(gsh 'md5sum /var/lib/tiercache/nvme0.img /var/lib/tiercache/nvme1.img')
gsh 'systemctl start tiercached 2>/dev/null; echo rc=$?' | grep -q '^rc=0$' && die "systemctl start of the format 3 build succeeded"
gwait 60 "journalctl -u tiercached --after-cursor='$cur' --no-pager -o cat | grep -qE 'newer than this tiercached reads|starting with'" ||
	die "the unit's start left no refusal in the journal: $(gsh "journalctl -u tiercached --after-cursor='$cur' --no-pager -o cat | tail -20")"
log=$(gsh "journalctl -u tiercached --after-cursor='$cur' --no-pager -o cat")
echo "$log" | grep -q "starting with" && die "the format 3 daemon started: $log"
gsh 'systemctl stop tiercached' >/dev/null
sums1=$(gsh 'md5sum /var/lib/tiercache/nvme0.img /var/lib/tiercache/nvme1.img')
[ -n "$sums0" ] && [ "$sums0" = "$sums1" ] || die "the legs changed while the format 3 build was installed"
ok "$(basename "$deb3") (format 3 only) installed but never started, by the package or by systemctl start; the legs did not change"

# c: back to a build that reads the format: nothing was lost
out=$(gsh "dpkg --force-confold -i /root/$(basename "$deb2") 2>&1; systemctl reset-failed tiercached; systemctl start tiercached; echo rc=\$?")
echo "$out" | grep -q '^rc=0$' || die "reinstalling $v2 and starting it: $out"
gwait 60 'systemctl is-active -q tiercached' || die "tiercached.service not active after going back to $v2"
readback "after going back to $v2"
ok "back on $v2 (started by the admin): the 16 MiB read back equal"
if [ "${KEEP:-0}" != 1 ]; then
	gsh 'systemctl poweroff' >/dev/null 2>&1 || true
	for _ in $(seq 1 150); do kill -0 "$QPID" 2>/dev/null || break; sleep 0.2; done
fi
echo "$PASSED passed, 0 failed"
