#!/usr/bin/env bash
# Real initiators against the running daemon: libiscsi's tools see the
# target, its VPD pages and its capacity; qemu-io and qemu-img write data
# that reads back equal, also after a restart.
. "$(dirname "$0")/lib.sh"
tc_tmpdir
command -v qemu-io >/dev/null || skip "qemu-io not installed"

port=$(tc_free_port)
iqn=iqn.2026-11.io.tiercache:test
url=iscsi://127.0.0.1:$port/$iqn/0
tc_basic_conf "$port" 64M >"$T/t.conf"
tc_start "$T/t.conf"

out=$(iscsi-ls -s "iscsi://127.0.0.1:$port/" 2>&1) || fail "iscsi-ls failed: $out"
[[ "$out" == *"Target:$iqn"* ]] || fail "discovery does not list $iqn: $out"
pass "iscsi-ls discovers the target"

out=$(iscsi-inq "$url" 2>&1) || fail "iscsi-inq failed: $out"
[[ "$out" == *"TIERCACH"* ]] || fail "standard INQUIRY lacks vendor: $out"
pass "standard INQUIRY"
out=$(iscsi-inq -e 1 -c 128 "$url" 2>&1) || fail "VPD 0x80: $out"
serial=$(cat "$T"/state/lun-disk0.serial)
[[ "$out" == *"$serial"* ]] || fail "VPD 0x80 does not carry serial $serial: $out"
pass "VPD 0x80 unit serial number"
out=$(iscsi-inq -e 1 -c 131 "$url" 2>&1) || fail "VPD 0x83: $out"
[[ "$out" == *"NAA"* ]] || fail "VPD 0x83 has no NAA designator: $out"
pass "VPD 0x83 device identification"
out=$(iscsi-inq -e 1 -c 176 "$url" 2>&1) || fail "VPD 0xb0: $out"
pass "VPD 0xb0 block limits"

out=$(iscsi-readcapacity16 "$url" 2>&1) || fail "readcapacity16: $out"
[[ "$out" == *"Total size:67108864"* ]] || fail "capacity: $out"
pass "READ CAPACITY 16 reports 64 MiB"

out=$(qemu-io -f raw -c 'write -P 0xab 0 1M' -c 'write -P 0x5c 4M 512k' -c 'read -P 0xab 0 1M' \
	-c 'read -P 0x5c 4M 512k' -c 'read -P 0 8M 64k' "$url" 2>&1) || fail "qemu-io: $out"
[[ "$out" != *"Pattern verification failed"* ]] || fail "pattern mismatch: $out"
pass "qemu-io patterns write and read back"

head -c 16M /dev/urandom >"$T/rand.img"
qemu-img convert -n -f raw -O raw "$T/rand.img" "$url" || fail "qemu-img convert to the LUN"
qemu-img convert -f raw -O raw "$url" "$T/back.img" || fail "qemu-img convert from the LUN"
cmp <(head -c 16M "$T/back.img") "$T/rand.img" || fail "16 MiB of random data did not read back equal"
pass "qemu-img random data round trip"

tc_stop
tc_start "$T/t.conf"
qemu-img convert -f raw -O raw "$url" "$T/back2.img" || fail "read after restart"
cmp <(head -c 16M "$T/back2.img") "$T/rand.img" || fail "data changed across a restart"
pass "data survives a restart"
tc_stop
