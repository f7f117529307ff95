#!/bin/sh
# Install the Debian packages in tools/debian-packages.txt that are missing.
# Idempotent: does nothing (and needs no network) when all are present.
# Needs only sh, dpkg and apt-get, so it runs on a fresh Debian 12 machine
# before make itself is installed (the README's first commands run it
# first): as root, or as a user with sudo.
set -eu
here=$(dirname "$0")
pkgs=$(grep -v '^#' "$here/debian-packages.txt" | tr '\n' ' ')
missing=""
for p in $pkgs; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "tiercache: installing missing packages:$missing"
if [ "$(id -u)" = 0 ]; then
	SUDO=
elif command -v sudo >/dev/null 2>&1; then
	SUDO=sudo
else
	echo "tiercache: installing packages needs root; run this as root or install sudo" >&2
	exit 1
fi
$SUDO apt-get update -q
# env: sudo does not pass the caller's environment on
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q $missing
