# tests/ceph/lib.sh - source after tests/lib.sh and tc_tmpdir: one Ceph
# cluster for the calling test, torn down at exit.
#
#   rbd_cluster_up        starts a cluster in $T/ceph (NO_MGR=1 unless the
#                         caller set NO_MGR=0; CEPHX as the caller set it),
#                         loads its env (CEPH_CONF, CEPH_POOL, ...) and
#                         exports CEPH_CONF for the ceph/rbd/qemu tools.
#                         A missing Ceph install fails the test: CI has it.
#   rbd_conf_lun NAME IMAGE [EXTRA KEYS...] -> a [lun NAME] section on
#                         rbd:$CEPH_POOL/IMAGE
# At exit: the processes in RBD_KILL_PIDS and the daemon (if any) are
# killed first, then the cluster stopped, then the scratch directory removed.
#
# Several gateways (tiercached processes on one image): PORT[G] is the port
# of gateway G, PID[G] its pid or empty. The test writes $T/G.conf and uses
#   gw_init G...                 PORT and PID for each G (a free port, no
#                                pid), and trap gw_cleanup EXIT
#   gw_daemon_conf G PORT_GROUP  -> its [daemon] and [portal] sections
#                                   (state and control socket in $T/G/state)
#   gw_start G [VAR=VALUE...]    starts it (with those in its environment),
#                                logging to $T/G.log; waits until it listens
#   gw_kill9 G                   kill -9, reaped
#   gw_stop G                    SIGTERM, reaped; fails the test unless exit 0
#   rbd_locker IMAGE             the address holding the image's lock, or none
#   rbd_rounds_check IMG BASE ROUNDS SLOTS
#                                "ok" or the alua_io loop rounds IMG lacks
#   trap gw_cleanup EXIT         every gateway killed, then _rbd_cleanup
CEPH_DIR=
RBD_KILL_PIDS= # helper processes of the test, killed first at exit

_rbd_cleanup() {
	local p
	for p in $RBD_KILL_PIDS; do
		kill -KILL "$p" 2>/dev/null
	done
	if [ -n "$TC_PID" ] && kill -0 "$TC_PID" 2>/dev/null; then
		kill -KILL "$TC_PID" 2>/dev/null
		wait "$TC_PID" 2>/dev/null
	fi
	TC_PID=
	[ -n "$CEPH_DIR" ] && bash "$TC_ROOT/tests/ceph/cluster.sh" down "$CEPH_DIR"
	_tc_cleanup
}

rbd_cluster_up() {
	local b
	for b in ceph-mon ceph-osd rbd; do
		command -v "$b" >/dev/null ||
			fail "$b not installed: apt-get install ceph-mon ceph-osd ceph-mgr ceph-common (tools/debian-packages.txt)"
	done
	CEPH_DIR=$T/ceph
	trap _rbd_cleanup EXIT
	local t0=$SECONDS
	NO_MGR=${NO_MGR:-1} bash "$TC_ROOT/tests/ceph/cluster.sh" up "$CEPH_DIR" >"$T/ceph-up.log" 2>&1 ||
		fail "the Ceph cluster did not come up: $(tail -5 "$T/ceph-up.log")"
	# shellcheck disable=SC1091
	. "$CEPH_DIR/env"
	export CEPH_CONF
	pass "Ceph cluster up in $((SECONDS - t0)) s (mon port $CEPH_MON_PORT)"
}

rbd_conf_lun() {
	local name=$1 image=$2
	shift 2
	printf '\n[lun %s]\nbacking = rbd:%s/%s\nceph_conf = %s\nblock_size = 512\n' \
		"$name" "$CEPH_POOL" "$image" "$CEPH_CONF"
	local kv
	for kv in "$@"; do echo "$kv"; done
}

gw_init() { # NAME...
	declare -gA PORT PID
	local g
	for g; do
		PORT[$g]=$(tc_free_port)
		PID[$g]=
	done
	trap gw_cleanup EXIT
}

gw_daemon_conf() { # NAME PORT_GROUP
	mkdir -p "$T/$1/state"
	cat <<CONF
[daemon]
state_dir = $T/$1/state
control_socket = $T/$1/state/control.sock
log_level = info
workers = 2

[portal]
listen = 127.0.0.1:${PORT[$1]}
port_group = $2
CONF
}

gw_listening() { # NAME
	(exec 3<>"/dev/tcp/127.0.0.1/${PORT[$1]}") 2>/dev/null && return 0
	kill -0 "${PID[$1]}" 2>/dev/null || { tail -20 "$T/$1.log" >&2; fail "gateway $1 exited at start"; }
	return 1
}

gw_start() { # NAME [VAR=VALUE...]
	env "${@:2}" "$TC_BIN" -c "$T/$1.conf" >>"$T/$1.log" 2>&1 &
	PID[$1]=$!
	tc_wait_for 90 "gateway $1 listening" gw_listening "$1"
}

rbd_locker() { # IMAGE -> the address holding its lock, or none
	rbd lock ls --format json "$CEPH_POOL/$1" 2>/dev/null | python3 -c '
import json, sys
l = json.load(sys.stdin)
print(l[0]["address"] if l else "none")'
}

# rbd_rounds_check IMG BASE ROUNDS SLOTS -> "ok", or the first rounds of a
# tests/tools/alua_io loop or wloop session (8-block rounds from block
# BASE, over SLOTS slots) that the image file IMG does not hold
rbd_rounds_check() {
	python3 - "$@" <<'PY'
import struct, sys
img, base, rounds, slots = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
bad = []
with open(img, "rb") as f:
    for r in range(max(0, rounds - slots), rounds):
        f.seek((base + (r % slots) * 8) * 512)
        data = f.read(8 * 512)
        want = b"".join(struct.pack(">I", r) + bytes([r & 0xff]) * 508 for _ in range(8))
        if data != want:
            bad.append(r)
print(" ".join(map(str, bad[:5])) if bad else "ok")
PY
}

gw_stop() { # NAME: SIGTERM and reaped; the test fails unless it exits 0 within 60 s
	kill -TERM "${PID[$1]}"
	tc_until 60 tc_gone "${PID[$1]}" || fail "gateway $1 did not stop within 60 s of SIGTERM"
	wait "${PID[$1]}"
	local rc=$?
	PID[$1]=
	[ "$rc" = 0 ] || fail "gateway $1 exited with status $rc after SIGTERM: $(tail -3 "$T/$1.log")"
}

gw_kill9() { # NAME
	kill -KILL "${PID[$1]}" 2>/dev/null
	wait "${PID[$1]}" 2>/dev/null
	PID[$1]=
}

gw_cleanup() {
	local g
	for g in "${!PID[@]}"; do
		if [ -n "${PID[$g]}" ] && kill -0 "${PID[$g]}" 2>/dev/null; then
			kill -KILL "${PID[$g]}" 2>/dev/null
			wait "${PID[$g]}" 2>/dev/null
		fi
	done
	_rbd_cleanup
}
