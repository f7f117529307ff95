#!/usr/bin/env bash
# tools/hdd-emulate.sh - a slow block device that behaves like a RAID of
# spinning disks, for benchmarks of the cache tier.
#
# A sparse file becomes a loop device, and a block-I/O cgroup caps what the
# processes inside it may do on that device: IOPS (what seeks cost a disk
# array) and bytes per second (its streaming rate). The cgroup throttles the
# processes in it, not the device: start the daemon inside it (`exec`, or
# `run`), and everything else on the host still sees the device at full speed.
#
#   hdd-emulate.sh up NAME [--size SIZE] [--iops N] [--mbps N] [--file PATH]
#       create the file, the loop device and the cgroup; print shell
#       assignments: HDD_DEV=/dev/loopN HDD_CGROUP=... HDD_FILE=...
#   hdd-emulate.sh exec NAME -- CMD [ARGS]
#       run CMD inside NAME's cgroup (exec: CMD keeps this process id)
#   hdd-emulate.sh down NAME
#       move any process left in the cgroup out, remove the cgroup, detach
#       the loop device, delete the file if `up` created it
#   hdd-emulate.sh run [--size ...] [--iops ...] [--mbps ...] -- CMD [ARGS]
#       up, run CMD inside the cgroup with HDD_DEV set, down when it exits
#       (also on Ctrl-C)
#   hdd-emulate.sh status NAME
#
# Defaults: 4G, 300 IOPS (read and write each), 250 MB/s: a small RAID6 of
# 7200 rpm disks under random 4K load. Limits of the model: the caps count
# commands, not seeks, so large sequential I/O is held to IOPS x size
# (300 x 128K = 39 MB/s) where real disks would stream; reads and writes are
# capped apart, so a mix can reach both caps. cgroup v1 (blkio.throttle.*) and v2
# (io.max) are both handled. Needs root. State lives in
# ${HDD_EMU_STATE:-/run/tiercache-hdd}/NAME.env.
set -euo pipefail

STATE=${HDD_EMU_STATE:-/run/tiercache-hdd}

die() { echo "hdd-emulate: $*" >&2; exit 2; }

usage() {
	sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
	exit 2
}

to_bytes() {
	local s=$1 n unit
	n=${s%[kKmMgGtT]}
	unit=${s#"$n"}
	[[ "$n" =~ ^[0-9]+$ ]] || die "size \"$s\" is not a number with an optional K, M, G or T"
	case $unit in
	"") echo "$n" ;;
	k | K) echo $((n << 10)) ;;
	m | M) echo $((n << 20)) ;;
	g | G) echo $((n << 30)) ;;
	t | T) echo $((n << 40)) ;;
	esac
}

cgroup_version() {
	if [ -f /sys/fs/cgroup/blkio/blkio.throttle.read_iops_device ]; then
		echo 1
	elif [ -f /sys/fs/cgroup/cgroup.controllers ] && grep -qw io /sys/fs/cgroup/cgroup.controllers; then
		echo 2
	else
		die "no block-I/O cgroup controller here: need cgroup v1 blkio at /sys/fs/cgroup/blkio or cgroup v2 with the io controller"
	fi
}

cgroup_path() {
	case $1 in
	1) echo "/sys/fs/cgroup/blkio/tiercache-hdd-$2" ;;
	2) echo "/sys/fs/cgroup/tiercache-hdd-$2" ;;
	esac
}

load_state() {
	local f="$STATE/$1.env"
	[ -f "$f" ] || die "no emulated HDD named \"$1\" (no $f); create it with: hdd-emulate.sh up $1"
	# shellcheck disable=SC1090
	. "$f"
}

cmd_up() {
	local name=$1
	shift
	local size=4G iops=300 mbps=250 file=""
	while [ $# -gt 0 ]; do
		case $1 in
		--size) size=$2; shift 2 ;;
		--iops) iops=$2; shift 2 ;;
		--mbps) mbps=$2; shift 2 ;;
		--file) file=$2; shift 2 ;;
		*) die "up: unknown option \"$1\"" ;;
		esac
	done
	[[ "$name" =~ ^[A-Za-z0-9_.-]+$ ]] || die "name \"$name\" may hold only letters, digits, _ . -"
	[[ "$iops" =~ ^[0-9]+$ && "$mbps" =~ ^[0-9]+$ ]] || die "--iops and --mbps take whole numbers"
	[ "$(id -u)" = 0 ] || die "needs root (loop devices and cgroups)"
	[ -f "$STATE/$name.env" ] && die "an emulated HDD named \"$name\" is already up; take it down first: hdd-emulate.sh down $name"
	local bytes created=0
	bytes=$(to_bytes "$size")
	if [ -z "$file" ]; then
		file="${TMPDIR:-/tmp}/tiercache-hdd-$name.img"
		[ -e "$file" ] && die "$file exists; remove it or give --file"
		created=1
	fi
	if [ ! -e "$file" ]; then
		truncate -s "$bytes" "$file"
		created=1
	fi
	local dev
	dev=$(losetup -f --show --direct-io=on "$file" 2>/dev/null) ||
		dev=$(losetup -f --show "$file") || die "losetup $file failed"
	local majmin ver cg
	majmin=$(lsblk -dno MAJ:MIN "$dev" | tr -d ' ')
	ver=$(cgroup_version)
	cg=$(cgroup_path "$ver" "$name")
	mkdir -p "$cg"
	local bps=$((mbps * 1000000))
	if [ "$ver" = 1 ]; then
		echo "$majmin $iops" >"$cg/blkio.throttle.read_iops_device"
		echo "$majmin $iops" >"$cg/blkio.throttle.write_iops_device"
		echo "$majmin $bps" >"$cg/blkio.throttle.read_bps_device"
		echo "$majmin $bps" >"$cg/blkio.throttle.write_bps_device"
	else
		grep -qw io /sys/fs/cgroup/cgroup.subtree_control || echo +io >/sys/fs/cgroup/cgroup.subtree_control
		echo "$majmin riops=$iops wiops=$iops rbps=$bps wbps=$bps" >"$cg/io.max"
	fi
	mkdir -p "$STATE"
	cat >"$STATE/$name.env" <<EOF
HDD_DEV=$dev
HDD_CGROUP=$cg
HDD_CGVER=$ver
HDD_FILE=$file
HDD_FILE_CREATED=$created
HDD_IOPS=$iops
HDD_MBPS=$mbps
EOF
	cat "$STATE/$name.env"
}

cmd_down() {
	local name=$1 rc=0
	load_state "$name"
	if [ -d "$HDD_CGROUP" ]; then
		local parent pid
		parent=$(dirname "$HDD_CGROUP")
		for pid in $(cat "$HDD_CGROUP/cgroup.procs" 2>/dev/null); do
			echo "$pid" >"$parent/cgroup.procs" 2>/dev/null || true
		done
		rmdir "$HDD_CGROUP" 2>/dev/null || { echo "hdd-emulate: cannot remove $HDD_CGROUP (still in use)" >&2; rc=1; }
	fi
	if losetup "$HDD_DEV" >/dev/null 2>&1; then
		losetup -d "$HDD_DEV" || { echo "hdd-emulate: cannot detach $HDD_DEV" >&2; rc=1; }
	fi
	[ "$HDD_FILE_CREATED" = 1 ] && rm -f "$HDD_FILE"
	rm -f "$STATE/$name.env"
	return $rc
}

cmd_exec() {
	local name=$1
	shift
	[ "${1:-}" = "--" ] && shift
	[ $# -gt 0 ] || die "exec: give the command after --"
	load_state "$name"
	echo $$ >"$HDD_CGROUP/cgroup.procs"
	export HDD_DEV HDD_CGROUP
	exec "$@"
}

cmd_run() {
	local opts=()
	while [ $# -gt 0 ] && [ "$1" != "--" ]; do
		opts+=("$1")
		shift
	done
	[ "${1:-}" = "--" ] && shift
	[ $# -gt 0 ] || die "run: give the command after --"
	RUN_NAME="run$$"
	cmd_up "$RUN_NAME" "${opts[@]}" >/dev/null
	trap 'cmd_down "$RUN_NAME"' EXIT
	trap 'exit 130' INT TERM
	load_state "$RUN_NAME"
	export HDD_DEV HDD_CGROUP
	# the command runs in a child that joins the cgroup; this shell stays out
	bash -c 'echo $$ >"$HDD_CGROUP/cgroup.procs" && exec "$@"' hdd-run "$@"
}

cmd_status() {
	load_state "$1"
	cat "$STATE/$1.env"
	if [ "$HDD_CGVER" = 1 ]; then
		echo "processes: $(tr '\n' ' ' <"$HDD_CGROUP/cgroup.procs")"
		echo "serviced:"
		grep -F "$(lsblk -dno MAJ:MIN "$HDD_DEV" | tr -d ' ')" "$HDD_CGROUP/blkio.throttle.io_serviced" || true
	else
		echo "processes: $(tr '\n' ' ' <"$HDD_CGROUP/cgroup.procs")"
		cat "$HDD_CGROUP/io.stat" 2>/dev/null || true
	fi
}

[ $# -ge 1 ] || usage
cmd=$1
shift
case $cmd in
up) [ $# -ge 1 ] || usage; cmd_up "$@" ;;
down) [ $# -eq 1 ] || usage; cmd_down "$1" ;;
exec) [ $# -ge 2 ] || usage; cmd_exec "$@" ;;
run) cmd_run "$@" ;;
status) [ $# -eq 1 ] || usage; cmd_status "$1" ;;
-h | --help | help) usage ;;
*) die "unknown command \"$cmd\"; use up, down, exec, run or status" ;;
esac
