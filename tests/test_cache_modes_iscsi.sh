#!/usr/bin/env bash
# Data written through a cache set reads back equal in every mode, through
# real initiators (qemu-io, qemu-img over libiscsi): patterns, discards,
# 16 MiB of random data, promoted re-reads, restarts, and mode changes
# between restarts with dirty data still in the cache. In write-back mode
# the idle cleaner destages everything to the backing file.
. "$(dirname "$0")/lib.sh"
tc_tmpdir
cp "$TC_BIN" "$T/tiercached" || fail "no daemon binary at $TC_BIN; run make"
TC_BIN=$T/tiercached # a rebuild while the test restarts the daemon must not matter
command -v qemu-io >/dev/null || skip "qemu-io not installed"
# libiscsi reconnects for ever to a target that died: bound each initiator
# run so that a crashed daemon fails the test instead of hanging it
qemu-io() { timeout 120 qemu-io "$@"; }
qemu-img() { timeout 120 qemu-img "$@"; }

port=$(tc_free_port)
url=iscsi://127.0.0.1:$port/iqn.2026-11.io.tiercache:test/0
head -c 16M /dev/urandom >"$T/rand.img"
head -c 16M /dev/urandom >"$T/rand2.img"

conf() { # MODE
	tc_basic_conf "$port" 64M
	cat <<CONF
cache = fast

[cache fast]
legs = $T/leg0.img $T/leg1.img
size = 32M
extent = 256K
mode = $1
admit_hits = 1
CONF
}

roundtrip() { # IMG WHAT
	qemu-img convert -f raw -O raw "$url" "$T/back.img" || fail "$2: qemu-img read"
	cmp <(head -c 16M "$T/back.img") "$1" >/dev/null || fail "$2: data differs"
}

for mode in write-back write-through write-around pass-through; do
	rm -rf "$T"/state "$T"/disk0.img "$T"/leg*.img
	conf $mode >"$T/t.conf"
	tc_start "$T/t.conf"
	out=$(qemu-io -f raw -c 'write -P 0xab 20M 1M' -c 'write -P 0x5c 24M 512k' -c 'write -P 0x33 28M 256k' \
		-c 'discard 28M 64k' -c 'read -P 0xab 20M 1M' -c 'read -P 0x5c 24M 512k' \
		-c 'read -P 0 28M 64k' -c 'read -P 0x33 28736k 192k' -c 'read -P 0 32M 64k' "$url" 2>&1) ||
		fail "$mode: qemu-io: $out"
	[[ "$out" != *"verification failed"* ]] || fail "$mode: pattern mismatch: $out"
	qemu-img convert -n -f raw -O raw "$T/rand.img" "$url" || fail "$mode: qemu-img write"
	roundtrip "$T/rand.img" "$mode: first read"
	roundtrip "$T/rand.img" "$mode: second read (promoted extents)"
	tc_stop
	tc_start "$T/t.conf"
	roundtrip "$T/rand.img" "$mode: after a restart"
	out=$(qemu-io -f raw -c 'read -P 0xab 20M 1M' -c 'read -P 0 28M 64k' "$url" 2>&1)
	[[ "$out" != *"verification failed"* ]] || fail "$mode: patterns after restart: $out"
	tc_stop
	pass "$mode: patterns, discard, 16 MiB random data, re-reads and a restart"
done

# mode changes between restarts, with dirty data in the cache
rm -rf "$T"/state "$T"/disk0.img "$T"/leg*.img
conf write-back >"$T/t.conf"
tc_start "$T/t.conf"
qemu-img convert -n -f raw -O raw "$T/rand.img" "$url" || fail "write-back write"
tc_stop
for mode in write-through pass-through write-around write-back; do
	conf $mode >"$T/t.conf"
	tc_start "$T/t.conf"
	roundtrip "$T/rand.img" "after switching to $mode"
	tc_stop
done
conf write-through >"$T/t.conf"
tc_start "$T/t.conf"
qemu-img convert -n -f raw -O raw "$T/rand2.img" "$url" || fail "write-through over dirty data"
roundtrip "$T/rand2.img" "write-through over dirty blocks"
tc_stop
conf write-back >"$T/t.conf"
tc_start "$T/t.conf"
roundtrip "$T/rand2.img" "back in write-back after write-through overwrote dirty blocks"
pass "mode changes across restarts keep every write"

# write-back: the idle cleaner destages to the backing file
qemu-img convert -n -f raw -O raw "$T/rand.img" "$url" || fail "write-back write"
destaged() { cmp -s <(head -c 16M "$T/disk0.img") "$T/rand.img"; }
tc_wait_for 60 "the idle cleaner destaging every dirty block" destaged
pass "idle cleaner destaged every dirty block to the backing file"
tc_stop
