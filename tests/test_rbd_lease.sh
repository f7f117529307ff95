#!/usr/bin/env bash
# An RBD image's owner serves from its cache only on a lease: a gateway
# cut off from the cluster (its lock polls hang) never answers a read from
# its cache with data another gateway has overwritten since.
#
# Gateway A serves an image (a single-gateway LUN: it takes the image's
# lock at start) with a write-through cache; it writes 0xAA and reads it
# until cached. A's looks at the cluster then hang (TIERCACHE_TEST_CLUSTER_STALL:
# its lock thread's polls and its poller's probes, as in a partition from
# the cluster). Gateway B is
# started on the same image (a second gateway started by mistake, or one
# taking over from a gateway it thinks dead): it breaks A's lock
# (blocklisting A) and serves only once A's lease has run out; a host
# writes 0xBB through B. A read through A right after must not return
# 0xAA: it gets NOT READY (A's lease ran out) until it gives up. With the
# polls back, A notices the fence and reconnects.
# (A LUN with gateways > 1 also has its reservation watch, which learns of
# the blocklist from the cluster when the cluster can still reach it.)
. "$(dirname "$0")/lib.sh"
tc_tmpdir
. "$TC_ROOT/tests/ceph/lib.sh"

[ -x "$TC_BIN" ] || fail "build/tiercached is missing; run make"
cc -std=gnu11 -O2 -Wall -Wextra -o "$T/alua_io" "$TC_ROOT/tests/tools/alua_io.c" -liscsi 2>"$T/cc.log" ||
	skip "cannot build tests/tools/alua_io.c against libiscsi: $(head -1 "$T/cc.log")"
IO=$T/alua_io

rbd_cluster_up
rbd create --size 64M --image-feature layering,exclusive-lock "$CEPH_POOL/leased" || fail "cannot create the RBD image"

IQN=iqn.2026-12.io.tiercache:leased
gw_init A B

gw_conf() { # NAME PORT_GROUP
	local g=$1
	gw_daemon_conf "$g" "$2"
	cat <<CONF

[target $IQN]
lun0 = leased
$(rbd_conf_lun leased leased "serial = LEASEDRBD0001" "cache = nvme")

[cache nvme]
legs = $T/$g/leg0 $T/$g/leg1
size = 64M
extent = 64K
mode = write-through
admit_hits = 1
seq_cutoff = 0
CONF
}
gw_conf A 1 >"$T/A.conf"
gw_conf B 2 >"$T/B.conf"
url() { echo "iscsi://127.0.0.1:${PORT[$1]}/$IQN/0"; }

gw_start A TIERCACHE_TEST_CLUSTER_STALL="$T/stall"
out=$("$IO" write "$(url A)" 0 16 170) || fail "write 0xAA through A: $out"
for i in 1 2 3; do
	out=$("$IO" read "$(url A)" 0 16 170) || fail "read 0xAA through A: $out"
done
hits() { "$TC_ROOT/build/tierctl" -c "$T/A.conf" --json stats |
	python3 -c 'import json,sys; print(json.load(sys.stdin)["caches"][0]["read_hits"])'; }
[ "$(hits)" -gt 0 ] || fail "A served no read from its cache: the test would show nothing"
pass "A owns the image and serves 0xAA from its cache"

touch "$T/stall"
t0=$SECONDS
gw_start B
out=$("$IO" write "$(url B)" 0 16 187) || fail "write 0xBB through B: $out"
pass "B took the image over and wrote 0xBB $((SECONDS - t0)) s after A was cut off ($out)"
grep -q "waiting .* ms for the old holder's lease to run out" "$T/B.log" ||
	fail "B served without waiting for A's lease"

out=$("$IO" read "$(url A)" 0 16 187 3 2>&1)
rc=$?
[ "$rc" = 3 ] && fail "A, cut off from the cluster, served the overwritten data from its cache: $out"
# what A must answer: NOT READY, ASYMMETRIC ACCESS STATE TRANSITION (its lease ran out), until alua_io
# gives up; not a crash, a lost connection or a medium error
[ "$rc" = 2 ] && [[ "$out" == *"sense 2/04/0a"* ]] ||
	fail "read through A: expected NOT READY (transition) until the client gave up; exit $rc: $out"
pass "A, cut off from the cluster, answered NOT READY (transition), not the overwritten data"

rm -f "$T/stall"
fenced() { grep -q "reconnected with a fresh Ceph client" "$T/A.log"; }
tc_until 60 fenced || fail "A did not notice the fence and reconnect once its polls were back"
pass "with its polls back A noticed the fence and reconnected"
