#!/bin/sh
# Install the Debian packages in tools/debian-packages.txt that are missing.
# Idempotent: does nothing (and needs no network) when all are present.
set -eu
here=$(dirname "$0")
pkgs=$(grep -v '^#' "$here/debian-packages.txt" | tr '\n' ' ')
missing=""
for p in $pkgs; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "tiercache: installing missing packages:$missing"
if [ "$(id -u)" != 0 ]; then
	SUDO=sudo
else
	SUDO=
fi
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q $missing
