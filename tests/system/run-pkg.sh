#!/usr/bin/env bash
# The Debian package, built and installed the way an admin gets it (issue 15
# part 6). From the committed tree (git archive HEAD, so what is built is
# what is committed):
#   1. dpkg-buildpackage -us -uc -b builds tiercache_VERSION_amd64.deb, and a
#      second one a version higher (an upgrade); lintian finds no error or
#      warning in either;
#   2. into a fresh Debian 12 root (debootstrap minbase, a new copy each run)
#      apt installs it with its dependencies from the archive: the daemon,
#      tierctl, the unit, the man pages and the commented configuration
#      (mode 0640, a conffile) are there, the state directory exists (0700),
#      tiercached --check accepts the shipped configuration, and nothing was
#      enabled or started;
#   3. the admin edits the configuration; the upgrade keeps the edit and
#      installs the new version;
#   4. apt remove leaves the configuration, purge takes it (and the state
#      directory, being empty).
# What is not covered yet: an upgrade over a daemon that runs under systemd
# with dirty data (needs a booted guest: the maintainer scripts stop and
# restart it only where systemd runs), and a guard that never starts a
# version unable to read the cache's on-disk format.
#
#   bash tests/system/run-pkg.sh      (root; needs the Debian archive)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT_DIR=$PWD
W=${TC_VM_DIR:-/var/tmp/tiercache-vm}
mkdir -p "$W"
R=$W/pkg-root
ok() { echo "ok: $*"; }
die() { echo "FAIL: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "SKIP: the package test needs root (debootstrap, chroot)"; exit 77; }

need=()
for t in dpkg-buildpackage:dpkg-dev dh:debhelper lintian:lintian debootstrap:debootstrap; do
	command -v "${t%%:*}" >/dev/null || need+=("${t#*:}")
done
if [ ${#need[@]} -gt 0 ]; then
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

# --- 1. build two versions from the committed tree ---------------------------------
B=$W/pkg-build
rm -rf "$B"
mkdir -p "$B/v1" "$B/v2"
git archive HEAD | tar -x -C "$B/v1/"
git archive HEAD | tar -x -C "$B/v2/"
v1=$(dpkg-parsechangelog -l "$B/v1/debian/changelog" -S Version)
v2=$v1+up1
{
	printf 'tiercache (%s) bookworm; urgency=medium\n\n  * A rebuild, to test upgrades.\n\n' "$v2"
	printf ' -- tiercache developers <team@tiercache.io>  %s\n\n' "$(date -R)"
	cat "$B/v1/debian/changelog"
} >"$B/v2/debian/changelog"
for v in v1 v2; do
	(cd "$B/$v" && dpkg-buildpackage -us -uc -b >"$B/$v.log" 2>&1) ||
		die "dpkg-buildpackage ($v): $(tail -15 "$B/$v.log")"
done
deb1=$B/tiercache_${v1}_amd64.deb
deb2=$B/tiercache_${v2}_amd64.deb
[ -f "$deb1" ] && [ -f "$deb2" ] || die "no .deb: $(ls "$B")"
for d in "$deb1" "$deb2"; do
	out=$(lintian "$d" 2>&1 | grep -v 'running with root privileges' || true)
	[ -z "$(printf '%s\n' "$out" | grep -E '^[EW]:' || true)" ] || die "lintian $(basename "$d"): $out"
done
ok "dpkg-buildpackage built $(basename "$deb1") and $(basename "$deb2"); lintian finds no error or warning"

# --- 2. a fresh Debian 12 root ------------------------------------------------------
base=$W/pkg-base.tar
if [ ! -f "$base" ]; then
	rm -rf "$R"
	debootstrap --variant=minbase bookworm "$R" http://deb.debian.org/debian >"$W/pkg-debootstrap.log" 2>&1 ||
		die "debootstrap: $(tail -5 "$W/pkg-debootstrap.log")"
	chroot "$R" apt-get clean
	tar -C "$R" -cf "$base" .
fi
umount_all() {
	for m in var/cache/apt/archives proc; do
		mountpoint -q "$R/$m" && umount "$R/$m"
	done
	return 0
}
trap umount_all EXIT
umount_all
rm -rf "$R"
mkdir -p "$R" "$W/pkg-apt"
tar -C "$R" -xf "$base"
cp /etc/resolv.conf "$R/etc/resolv.conf"
mount -t proc proc "$R/proc"
mount --bind "$W/pkg-apt" "$R/var/cache/apt/archives" # downloads kept between runs
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
echo "4 passed, 0 failed"
