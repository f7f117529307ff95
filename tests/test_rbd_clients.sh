#!/usr/bin/env bash
# An RBD image served as a LUN, seen by real clients, with cephx on and a
# restricted user (client.iscsi, "profile rbd" on the pool only):
#  - qemu-io writes patterns through iscsi:// and reads them back; qemu-io
#    reads the same bytes from the image directly (rbd:POOL/IMAGE), so they
#    reached Ceph (the gateway holds the image's exclusive lock, so other
#    clients may read it but not write it);
#  - tierctl status shows the pool/image and "cluster: connected";
#  - `rbd resize` gives the open session CAPACITY DATA HAS CHANGED and the
#    new READ CAPACITY;
#  - with the OSD frozen (SIGSTOP) a read fails with BUSY after ceph_timeout
#    instead of hanging, status says "lost"; after SIGCONT reads succeed
#    again and status says "connected".
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/ceph/lib.sh"
tc_tmpdir
command -v qemu-io >/dev/null || fail "qemu-io not installed (qemu-utils, qemu-block-extra)"
cc -std=gnu11 -O2 -Wall -Wextra -o "$T/ua_watch" "$TC_ROOT/tests/tools/ua_watch.c" -liscsi 2>"$T/cc.log" ||
	fail "cannot build tests/tools/ua_watch.c against libiscsi: $(head -3 "$T/cc.log")"
CEPHX=1 rbd_cluster_up
[ "${CEPH_USER:-}" = iscsi ] || fail "the cluster has no restricted client user"

img=img1
rbd create --size 64M "$CEPH_POOL/$img" || fail "rbd create"
port=$(tc_free_port)
iqn=iqn.2026-11.io.tiercache:test
url=iscsi://127.0.0.1:$port/$iqn/0
direct="rbd:$CEPH_POOL/$img:conf=$CEPH_CONF:id=$CEPH_USER"
{
	tc_conf_head "$port"
	cat <<CONF

[target $iqn]
lun0 = disk0
CONF
	rbd_conf_lun disk0 "$img" "ceph_user = client.$CEPH_USER" "ceph_timeout = 4" "size = 64M"
} >"$T/t.conf"
"$TC_BIN" -c "$T/t.conf" --check >"$T/check.log" 2>&1 || fail "--check refused: $(cat "$T/check.log")"
tc_start "$T/t.conf"
grep -q "lun disk0: rbd:$CEPH_POOL/$img, 67108864 bytes" "$T/daemon.log" || fail "the LUN did not open on the image"
pass "LUN on rbd:$CEPH_POOL/$img as client.$CEPH_USER (cephx)"

# --- data through the LUN reaches the image, and back -------------------
out=$(qemu-io -f raw -c 'write -P 0xa5 0 1M' -c 'write -P 0x3c 40M 256k' -c 'write -P 0x11 63M 1M' \
	-c 'read -P 0xa5 0 1M' -c 'read -P 0x3c 40M 256k' -c 'read -P 0 8M 64k' "$url" 2>&1) ||
	fail "qemu-io over iSCSI: $out"
[[ "$out" != *"verification failed"* ]] || fail "pattern mismatch over iSCSI: $out"
pass "qemu-io writes and reads back patterns over iSCSI"
out=$(qemu-io -r -f raw -c 'read -P 0xa5 0 1M' -c 'read -P 0x3c 40M 256k' -c 'read -P 0x11 63M 1M' \
	-c 'read -P 0 8M 64k' "$direct" 2>&1) || fail "qemu-io on the image directly: $out"
[[ "$out" != *"verification failed"* ]] || fail "the image does not hold what the LUN acknowledged: $out"
pass "qemu-io reads the same bytes from the RBD image directly"
head -c 8M /dev/urandom >"$T/rand.img"
qemu-img convert -n -f raw -O raw "$T/rand.img" "$url" || fail "qemu-img convert to the LUN"
qemu-img convert -f raw -O raw "$direct" "$T/back.img" 2>/dev/null || fail "qemu-img read of the image"
cmp <(head -c 8M "$T/back.img") "$T/rand.img" >/dev/null || fail "8 MiB of random data differ in the image"
pass "qemu-img: 8 MiB of random data through the LUN equal the image's first 8 MiB"

# --- status ---------------------------------------------------------------
tierctl() { "$TC_ROOT/build/tierctl" -s "$T/state/control.sock" "$@"; }
st=$(tierctl --json status) || fail "tierctl status: $st"
rbd_field() { echo "$st" | python3 -c "import json,sys; d=json.load(sys.stdin); print(d['luns'][0]['rbd']['$1'])"; }
expect_eq "$(rbd_field pool)/$(rbd_field image)" "$CEPH_POOL/$img" "status names the pool and image"
expect_eq "$(rbd_field cluster)" connected "status: cluster connected"

# --- resize: unit attention and new capacity --------------------------------
mkfifo "$T/cmd"
"$T/ua_watch" "$url" <"$T/cmd" >>"$T/ua.out" 2>&1 & # appends: the file is emptied between commands
ua_pid=$!
RBD_KILL_PIDS=$ua_pid
exec 7>"$T/cmd"
wait_line() { # PATTERN SECONDS
	local i
	for ((i = 0; i < $2 * 10; i++)); do
		grep -q "$1" "$T/ua.out" && return 0
		kill -0 $ua_pid 2>/dev/null || return 1
		sleep 0.1
	done
	return 1
}
wait_line '^ready' 60 || fail "ua_watch did not log in: $(cat "$T/ua.out")"
rbd resize --size 96M "$CEPH_POOL/$img" >/dev/null 2>&1 || fail "rbd resize"
tc_wait_for 60 "the LUN following rbd resize" grep -q "lun disk0: capacity now 196608 blocks" "$T/daemon.log"
echo rc16 >&7
wait_line '^capacity' 60 || fail "no READ CAPACITY answer: $(cat "$T/ua.out")"
grep -q '^check 6 2a09$' "$T/ua.out" || fail "no CAPACITY DATA HAS CHANGED unit attention: $(cat "$T/ua.out")"
pass "the open session gets CAPACITY DATA HAS CHANGED"
expect_eq "$(grep '^capacity' "$T/ua.out" | tail -1)" "capacity 196608 512" "READ CAPACITY(16) after rbd resize"
out=$(qemu-io -f raw -c 'write -P 0x42 95M 1M' -c 'read -P 0x42 95M 1M' "$url" 2>&1) || fail "qemu-io past the old end: $out"
[[ "$out" != *"verification failed"* ]] || fail "the grown part does not read back: $out"
pass "the grown part of the LUN takes data"

# --- a lost cluster: BUSY after ceph_timeout, not a hang -----------------
osd_pid=$(cat "$CEPH_DIR"/run/osd.*.pid)
[[ "$osd_pid" =~ ^[0-9]+$ ]] && [ -d "/proc/$osd_pid" ] || fail "no running OSD in the pid file: '$osd_pid'"
# every thread of the OSD stopped (state T): kill only queues SIGSTOP, and a
# thread that has not taken it yet may still answer a request
osd_threads() { # STATE... of each thread, one per line
	local f
	for f in /proc/"$osd_pid"/task/*/stat; do
		sed 's/.*) //' "$f" 2>/dev/null | cut -d' ' -f1
	done
}
osd_stopped() { ! osd_threads | grep -qv '^[Tt]$'; }
: >"$T/ua.out"
echo "read 1000" >&7
wait_line '^good' 60 || fail "a read before the freeze: $(cat "$T/ua.out")"
kill -STOP "$osd_pid" || fail "kill -STOP of the OSD ($osd_pid)"
if ! tc_until 30 osd_stopped; then
	kill -CONT "$osd_pid"
	fail "the OSD's threads did not all stop within 30 s: $(osd_threads | sort | uniq -c | tr '\n' ' ')"
fi
: >"$T/ua.out"
echo "read 2000" >&7 # object 0 exists: the OSD must answer (the object map knows holes)
if ! wait_line '^\(good\|status\|check\)' 60; then
	kill -CONT "$osd_pid"
	fail "a read with the OSD frozen neither completed nor failed within 60 s"
fi
res=$(head -1 "$T/ua.out")
st=$(tierctl --json status)
cl=$(rbd_field cluster)
osd_state=$(osd_threads | sort | uniq -c | tr '\n' ' ')
kill -CONT "$osd_pid"
[[ "$res" == "status 08 in "* ]] ||
	fail "a read with the OSD frozen: expected BUSY (status 08), got '$res' (cluster '$cl'; OSD thread states: $osd_state; ceph-osd processes: $(pgrep -c ceph-osd))"
pass "with the OSD frozen a read fails with BUSY: $res"
expect_eq "$cl" lost "status while the OSD is frozen"
# back: the host's retry succeeds (the driver may first report other state
# changes); a retry a second after each answer that was not GOOD, for up to
# 120 s
ok=0 t0=$SECONDS
while [ $((SECONDS - t0)) -lt 120 ]; do
	: >"$T/ua.out"
	echo "read 2000" >&7 # object 0 exists: the OSD must answer (the object map knows holes)
	wait_line '^\(good\|status\|check\)' 60 || break
	grep -q '^good' "$T/ua.out" && { ok=1; break; }
	sleep 1 # a host's retry interval, not a wait for something
done
[ $ok = 1 ] || fail "reads do not succeed again after the OSD is back: $(cat "$T/ua.out")"
pass "reads succeed again once the OSD is back"
st=$(tierctl --json status)
expect_eq "$(rbd_field cluster)" connected "status after the OSD is back"
exec 7>&-
wait $ua_pid 2>/dev/null
tc_stop
