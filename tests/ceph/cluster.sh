#!/usr/bin/env bash
# tests/ceph/cluster.sh - a throwaway Ceph cluster on 127.0.0.1 for the RBD tests.
#
#   cluster.sh up DIR [MON_V2_PORT [MON_V1_PORT]]
#   cluster.sh down DIR
#
# up makes DIR (which must not exist), starts one monitor, optionally one
# manager and one BlueStore OSD on a sparse file in DIR, creates an RBD pool
# and waits until it takes writes. Ports not given are picked free
# (tests/lib.sh tc_free_port), so several clusters can run side by side.
# Afterwards DIR/env holds shell assignments: CEPH_CONF, CEPH_POOL,
# CEPH_MON_PORT (and CEPH_USER / CEPH_KEYRING with cephx).
#
# Environment knobs:
#   NO_MGR=1       no ceph-mgr (saves ~300 MB and a few CPU-seconds; the
#                  RBD data path does not need it; `ceph -s` warns)
#   CEPHX=1        cephx on: keyrings for every daemon, client.admin and a
#                  restricted client.iscsi (profile rbd on the pool)
#   CEPH_POOL=rbd  the pool name
#   OSD_SIZE=4G    the OSD's block file (sparse), or its RAM with memstore
#   OSD_STORE=bluestore | memstore: BlueStore on a file (what production
#                  runs), or Ceph's in-memory object store (no disk syncs:
#                  several times faster for latency-bound protocol tests)
#
# down stops the daemons whose pid files are in DIR (OSD first, so it need
# not wait for a monitor that is gone), only if they really run on DIR's
# ceph.conf, then removes DIR. It never fails: use it from a trap.
#
# Facts behind the settings (measured on a 2-core machine): the monitor's
# ports are fixed per cluster; a size-1 pool needs "mon allow pool size one";
# BlueStore's block file must live outside the OSD's data directory; every
# client process needs its own admin socket when several run at once.
set -u

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

die() { echo "cluster.sh: $*" >&2; exit 1; }
# die, quoting the end of a log (the directory is removed on failure)
die_log() { local f=$1; shift; echo "cluster.sh: $*" >&2; [ -f "$f" ] && tail -n 15 "$f" | sed 's/^/  | /' >&2; exit 1; }

free_port() {
	if declare -F tc_free_port >/dev/null; then
		tc_free_port
	else
		# shellcheck source=../lib.sh
		(source "$here/../lib.sh" && tc_free_port)
	fi
}

# pid of a daemon of this cluster from its pid file, if it still runs on our conf
cluster_pid() {
	local f=$1 dir=$2 p
	[ -f "$f" ] || return 1
	p=$(cat "$f" 2>/dev/null) || return 1
	[ -n "$p" ] && [ -r "/proc/$p/cmdline" ] || return 1
	tr '\0' ' ' <"/proc/$p/cmdline" | grep -qF -- "$dir/ceph.conf" || return 1
	echo "$p"
}

proc_alive() { [ -e "/proc/$1" ] && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]; }

stop_group() { # DIR PIDFILE...: TERM, wait up to 10 s, then KILL
	local dir=$1 f p i any
	shift
	local pids=()
	for f in "$@"; do
		p=$(cluster_pid "$f" "$dir") && { kill -TERM "$p" 2>/dev/null; pids+=("$p"); }
	done
	[ ${#pids[@]} -gt 0 ] || return 0
	for ((i = 0; i < 100; i++)); do
		any=0
		for p in "${pids[@]}"; do proc_alive "$p" && any=1; done
		[ $any = 0 ] && return 0
		sleep 0.1
	done
	for p in "${pids[@]}"; do proc_alive "$p" && kill -KILL "$p" 2>/dev/null; done
	return 0
}

cmd_down() {
	local dir=$1
	[ -d "$dir" ] || return 0
	dir=$(cd "$dir" && pwd)
	shopt -s nullglob
	stop_group "$dir" "$dir"/run/osd.*.pid
	stop_group "$dir" "$dir"/run/mgr.*.pid "$dir"/run/mon.*.pid
	shopt -u nullglob
	rm -rf "$dir"
	return 0
}

cmd_up() {
	local dir=$1 v2=${2:-} v1=${3:-}
	local pool=${CEPH_POOL:-rbd} osd_size=${OSD_SIZE:-4G} cephx=${CEPHX:-0} no_mgr=${NO_MGR:-0}
	local store=${OSD_STORE:-bluestore}
	case $store in bluestore | memstore) ;; *) die "OSD_STORE=$store: use bluestore or memstore" ;; esac
	[ -e "$dir" ] && die "$dir exists; give a new directory"
	for b in ceph-mon ceph-osd ceph monmaptool ceph-authtool rbd uuidgen; do
		command -v "$b" >/dev/null || die "$b is missing; install ceph-mon ceph-osd ceph-mgr ceph-common"
	done
	mkdir -p "$dir" || die "cannot make $dir"
	dir=$(cd "$dir" && pwd)
	mkdir -p "$dir"/{run,log,crash,mon.a,mgr.x}
	[ -n "$v2" ] || v2=$(free_port)
	[ -n "$v1" ] || v1=$(free_port)
	[ "$v1" != "$v2" ] || v1=$(free_port)
	local conf=$dir/ceph.conf fsid auth=none
	fsid=$(uuidgen)
	[ "$cephx" = 1 ] && auth=cephx
	local mon_addr="[v2:127.0.0.1:$v2,v1:127.0.0.1:$v1]"
	local bytes
	bytes=$(numfmt --from=iec "$osd_size") || die "OSD_SIZE=$osd_size is not a size"

	{
		echo "[global]"
		echo "fsid = $fsid"
		echo "mon host = $mon_addr"
		echo "public addr = 127.0.0.1"
		echo "cluster addr = 127.0.0.1"
		echo "ms bind ipv6 = false"
		for k in cluster service client; do echo "auth $k required = $auth"; done
		echo "auth supported = $auth"
		echo "run dir = $dir/run"
		echo "pid file = $dir/run/\$name.pid"
		echo "admin socket = $dir/run/\$name.asok"
		echo "log file = $dir/log/\$name.log"
		echo "crash dir = $dir/crash"
		echo "log to stderr = false"
		echo "err to stderr = true"
		echo "log to syslog = false"
		echo "osd pool default size = 1"
		echo "osd pool default min size = 1"
		echo "osd pool default pg autoscale mode = off"
		echo "osd crush chooseleaf type = 0"
		echo "mon allow pool size one = true"
		echo "mon allow pool delete = true"
		echo "mon warn on pool no redundancy = false"
		echo "mon warn on insecure global id reclaim allowed = false"
		echo "mon data avail warn = 2"
		echo "mon data avail crit = 1"
		echo "mgr initial modules = iostat"
		echo
		echo "[client]"
		echo "admin socket = $dir/run/\$name.\$pid.asok"
		echo "log file = $dir/log/client.log"
		[ "$cephx" = 1 ] && echo "keyring = $dir/client.keyring"
		echo
		echo "[mon]"
		echo "mon data = $dir/\$name"
		echo "mon cluster log file = $dir/log/cluster.log"
		[ "$cephx" = 1 ] && echo "keyring = $dir/\$name/keyring"
		echo
		echo "[mgr]"
		echo "mgr data = $dir/\$name"
		[ "$cephx" = 1 ] && echo "keyring = $dir/\$name/keyring"
		echo
		echo "[osd]"
		echo "osd data = $dir/\$name"
		[ "$cephx" = 1 ] && echo "keyring = $dir/\$name/keyring"
		if [ "$store" = memstore ]; then
			echo "osd objectstore = memstore"
			echo "memstore device bytes = $bytes"
		else
			echo "osd objectstore = bluestore"
			echo "bluestore block path = $dir/\$name.block"
			echo "bluestore block create = true"
			echo "bluestore block size = $bytes"
			echo "bluestore fsck on mount = false"
		fi
		echo "osd memory target = 939524096"
		echo "osd max object name len = 460"
		echo "osd max object namespace len = 64"
	} >"$conf"

	local C=(-c "$conf")
	# monitor
	monmaptool --create --clobber --fsid "$fsid" --addv a "$mon_addr" "$dir/monmap" >/dev/null ||
		die "monmaptool failed"
	ceph-authtool --create-keyring "$dir/mon.keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null ||
		die "ceph-authtool failed"
	if [ "$cephx" = 1 ]; then
		ceph-authtool --create-keyring "$dir/client.keyring" --gen-key -n client.admin \
			--cap mon 'allow *' --cap osd 'allow *' --cap mgr 'allow *' --cap mds 'allow *' >/dev/null &&
			ceph-authtool "$dir/mon.keyring" --import-keyring "$dir/client.keyring" >/dev/null ||
			die "cannot make the admin keyring"
	fi
	ceph-mon "${C[@]}" --mkfs -i a --monmap "$dir/monmap" --keyring "$dir/mon.keyring" \
		>"$dir/log/mon.mkfs.log" 2>&1 || die_log "$dir/log/mon.mkfs.log" "ceph-mon --mkfs failed"
	# Every map change waits for the monitor's next proposal, 1 s apart by
	# default: the OSD's boot and the pool take half the start that way.
	# They are made 50 ms apart here, and Ceph's default is back once the
	# cluster is up, so the tests see a monitor's real pace.
	ceph-mon "${C[@]}" -i a --paxos-propose-interval 0.05 ||
		die_log "$dir/log/mon.a.log" "ceph-mon did not start"
	local i ok=0
	for ((i = 0; i < 120; i++)); do
		ceph "${C[@]}" --connect-timeout 5 mon stat >/dev/null 2>&1 && { ok=1; break; }
		sleep 0.25
	done
	[ $ok = 1 ] || die_log "$dir/log/mon.a.log" "the monitor did not form a quorum"

	# manager (optional)
	if [ "$no_mgr" != 1 ]; then
		if [ "$cephx" = 1 ]; then
			ceph "${C[@]}" auth get-or-create mgr.x mon 'allow profile mgr' osd 'allow *' mds 'allow *' \
				-o "$dir/mgr.x/keyring" >/dev/null 2>&1 || die "cannot make the mgr key"
		fi
		command -v ceph-mgr >/dev/null || die "ceph-mgr is missing (or set NO_MGR=1)"
		ceph-mgr "${C[@]}" -i x || die "ceph-mgr did not start"
	fi

	# one OSD
	local uuid id
	uuid=$(uuidgen)
	id=$(ceph "${C[@]}" osd new "$uuid" 2>/dev/null) || die "ceph osd new failed"
	mkdir -p "$dir/osd.$id"
	if [ "$cephx" = 1 ]; then
		# the OSD's key exists and is known to the monitor before mkfs, which
		# already talks to the monitor
		ceph-authtool --create-keyring "$dir/osd.$id/keyring" --gen-key -n "osd.$id" >/dev/null &&
			ceph "${C[@]}" auth add "osd.$id" osd 'allow *' mon 'allow profile osd' \
				mgr 'allow profile osd' -i "$dir/osd.$id/keyring" >/dev/null 2>&1 ||
			die "cannot make the OSD key"
	fi
	ceph-osd "${C[@]}" -i "$id" --mkfs --osd-uuid "$uuid" >"$dir/log/osd.$id.mkfs.log" 2>&1 ||
		die_log "$dir/log/osd.$id.mkfs.log" "ceph-osd --mkfs failed"
	ceph-osd "${C[@]}" -i "$id" 2>>"$dir/log/osd.$id.stderr" ||
		die_log "$dir/log/osd.$id.log" "ceph-osd did not start"
	ok=0
	for ((i = 0; i < 240; i++)); do
		ceph "${C[@]}" osd dump 2>/dev/null | grep -q "^osd\.$id up" && { ok=1; break; }
		sleep 0.25
	done
	[ $ok = 1 ] || die_log "$dir/log/osd.$id.log" "the OSD did not come up"

	# the pool; rbd pool init writes to it, so it returns once the PGs are active
	ceph "${C[@]}" osd pool create "$pool" 8 8 >/dev/null 2>&1 || die "cannot create pool $pool"
	ceph "${C[@]}" osd pool set "$pool" size 1 --yes-i-really-mean-it >/dev/null 2>&1
	timeout 120 rbd "${C[@]}" pool init "$pool" || die "rbd pool init $pool failed or timed out"

	if [ "$cephx" = 1 ]; then
		ceph "${C[@]}" auth get-or-create client.iscsi mon 'profile rbd' osd "profile rbd pool=$pool" \
			mgr "profile rbd pool=$pool" >>"$dir/client.keyring" 2>/dev/null ||
			die "cannot make client.iscsi"
	fi
	ceph "${C[@]}" tell mon.a config set paxos_propose_interval 1 >/dev/null 2>&1 &&
		ceph "${C[@]}" tell mon.a config get paxos_propose_interval 2>/dev/null | grep -q '"1.000000"' ||
		die "cannot set paxos_propose_interval back to 1 s"
	{
		echo "CEPH_CONF=$conf"
		echo "CEPH_POOL=$pool"
		echo "CEPH_MON_PORT=$v2"
		if [ "$cephx" = 1 ]; then
			echo "CEPH_USER=iscsi"
			echo "CEPH_KEYRING=$dir/client.keyring"
		fi
	} >"$dir/env"
	return 0
}

case "${1:-}" in
up)
	[ $# -ge 2 ] || die "usage: cluster.sh up DIR [MON_V2_PORT [MON_V1_PORT]]"
	[ -e "$2" ] && die "$2 exists; give a new directory"
	# a subshell, so a failure (die) still tears down what was started
	(cmd_up "$2" "${3:-}" "${4:-}") || { [ -e "$2" ] && cmd_down "$2"; exit 1; }
	;;
down)
	[ $# -eq 2 ] || die "usage: cluster.sh down DIR"
	cmd_down "$2"
	;;
*)
	echo "usage: cluster.sh up DIR [MON_V2_PORT [MON_V1_PORT]] | down DIR" >&2
	exit 2
	;;
esac
