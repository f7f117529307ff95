#!/usr/bin/env bash
# backing_io: an uncached file LUN opened with O_DIRECT by default, through
# the page cache with backing_io = buffered; both serve the same bytes to a
# real initiator, and the buffered one keeps them across a restart. Large
# reads of page-cached data go out with sendfile, the rest as usual.
. "$(dirname "$0")/lib.sh"
tc_tmpdir
command -v qemu-io >/dev/null || skip "qemu-io not installed"

port=$(tc_free_port)
iqn=iqn.2026-11.io.tiercache:test
url=iscsi://127.0.0.1:$port/$iqn/0

# The open flags of the daemon's descriptor on the backing file (octal).
backing_flags() {
	local fd
	for fd in /proc/"$TC_PID"/fd/*; do
		[ "$(readlink "$fd")" = "$T/disk0.img" ] || continue
		awk '/^flags:/ { print $2 }' /proc/"$TC_PID"/fdinfo/"${fd##*/}"
		return 0
	done
	return 1
}
o_direct() { (( 8#$1 & 8#40000 )); }

tc_basic_conf "$port" 64M >"$T/direct.conf"
tc_start "$T/direct.conf"
flags=$(backing_flags) || fail "the daemon holds no descriptor on the backing file"
if ! o_direct "$flags"; then
	# tmpfs and a few others refuse O_DIRECT; the daemon then falls back
	df -PT "$T" | awk 'NR == 2 { print $2 }' | grep -qx tmpfs ||
		fail "default backing_io: the backing file is not open with O_DIRECT (flags $flags)"
	pass "default backing_io: no O_DIRECT on tmpfs, as expected"
else
	pass "default backing_io: the backing file is open with O_DIRECT (flags $flags)"
fi
out=$(qemu-io -f raw -c 'write -P 0x3c 0 1M' -c 'read -P 0x3c 0 1M' "$url" 2>&1) || fail "qemu-io (direct): $out"
[[ "$out" != *"Pattern verification failed"* ]] || fail "pattern mismatch (direct): $out"
pass "direct: a pattern written reads back"
tc_stop

{ cat "$T/direct.conf"; echo "backing_io = buffered"; } >"$T/buffered.conf"
tc_start "$T/buffered.conf"
flags=$(backing_flags) || fail "the daemon holds no descriptor on the backing file"
o_direct "$flags" && fail "backing_io = buffered: the backing file is still open with O_DIRECT (flags $flags)"
pass "backing_io = buffered: the backing file is open without O_DIRECT (flags $flags)"
grep -q "disk0.img (buffered)" "$T/daemon.log" || fail "the daemon's log does not say the LUN is buffered"
out=$(qemu-io -f raw -c 'read -P 0x3c 0 1M' -c 'write -P 0xa5 1M 3M' -c 'flush' -c 'read -P 0xa5 1M 3M' \
	-c 'read -P 0 8M 64k' "$url" 2>&1) || fail "qemu-io (buffered): $out"
[[ "$out" != *"Pattern verification failed"* ]] || fail "pattern mismatch (buffered): $out"
pass "buffered: the direct LUN's data reads back, new patterns and SYNCHRONIZE CACHE work"
head -c 8M /dev/urandom >"$T/rand.img"
qemu-img convert -n -f raw -O raw "$T/rand.img" "$url" || fail "qemu-img convert to the LUN"
cmp <(head -c 8M "$T/disk0.img") "$T/rand.img" || fail "the backing file does not hold what was written"
pass "buffered: 8 MiB of random data is in the backing file once acknowledged (write cache off)"

# Reads of 32K or more whose pages all sit in the page cache leave with
# sendfile (file to socket, no copy through the daemon); the others are
# read as usual. Both must return the same bytes; strace tells which ran.
# all_traced TRACER: every thread of the daemon is traced by TRACER
all_traced() {
	local s
	tc_gone "$1" && fail "strace could not attach to the daemon: $(cat "$T/strace.err")"
	for s in /proc/"$TC_PID"/task/*/status; do
		grep -q "^TracerPid:[[:space:]]*$1\$" "$s" || return 1
	done
}
# traced NAME CMD [ARGS]: run CMD (an initiator) while strace watches the
# daemon; sets n to the daemon's sendfile calls meanwhile (-1 without
# strace) and returns CMD's status. Not in a subshell: fail must end the test.
traced() {
	local name=$1 sp= rc
	shift
	n=-1
	if command -v strace >/dev/null; then
		strace -f -qq -e trace=sendfile -o "$T/strace.$name" -p "$TC_PID" 2>"$T/strace.err" & sp=$!
		tc_wait_for 60 "strace attached to every thread of the daemon" all_traced "$sp"
	fi
	"$@"
	rc=$?
	if [ -n "$sp" ]; then
		# strace writes each call as it returns, and its file is complete
		# once it has exited
		kill "$sp"
		wait "$sp" 2>/dev/null
		n=$(grep -c '^[0-9]* *sendfile(' "$T/strace.$name")
	fi
	return $rc
}
# drop the backing file's pages from the page cache (written back first:
# dirty pages would stay)
drop_page_cache() {
	python3 -c 'import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
os.fdatasync(fd)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)' "$T/disk0.img"
}
traced cached qemu-img convert -f raw -O raw "$url" "$T/cached.img" || fail "read back over iSCSI (page-cached)"
cmp <(head -c 8M "$T/cached.img") "$T/rand.img" || fail "read back (page-cached): not the data written"
[ "$n" != 0 ] || fail "page-cached reads: no sendfile ran"
pass "buffered: page-cached data reads back correctly, sent from the page cache ($n sendfile calls)"
# Data not in the page cache: one READ of 256 KiB (a pattern written for
# it) right after the file's pages were dropped, so that nothing can have
# brought them back. A long sequential read would not do: the kernel's
# readahead fills the page cache ahead of it, and how many of its later
# commands then find their pages cached (and use sendfile) is timing.
out=$(qemu-io -f raw -c 'write -P 0x6b 12M 256k' "$url" 2>&1) || fail "qemu-io write at 12 MiB: $out"
drop_page_cache
traced cold qemu-io -f raw -c 'read -P 0x6b 12M 256k' "$url" >"$T/cold.out" 2>&1 ||
	fail "qemu-io read of data not in the page cache: $(cat "$T/cold.out")"
grep -q "Pattern verification failed" "$T/cold.out" && fail "data not in the page cache: pattern mismatch"
[ "$n" = 0 ] || [ "$n" = -1 ] || fail "a read of data not in the page cache used sendfile ($n calls)"
pass "buffered: data not in the page cache is read as usual and correct (sendfile calls: $n)"
# and a long read of dropped pages returns the same bytes, whichever way
# each of its commands went
drop_page_cache
traced dropped qemu-img convert -f raw -O raw "$url" "$T/dropped.img" || fail "read back over iSCSI (dropped)"
cmp <(head -c 8M "$T/dropped.img") "$T/rand.img" || fail "read back (dropped pages): not the data written"
pass "buffered: 8 MiB dropped from the page cache read back correctly ($n sendfile calls after readahead)"
tc_stop
tc_start "$T/direct.conf"
qemu-img convert -f raw -O raw "$url" "$T/back.img" || fail "read after restart"
cmp <(head -c 8M "$T/back.img") "$T/rand.img" || fail "data changed across a restart"
pass "buffered data reads back through a direct restart"
tc_stop

# With the write cache on, small writes go into the page cache on the
# worker itself (no FUA): mixed sizes, overlapping, then SYNCHRONIZE CACHE.
{ cat "$T/buffered.conf"; echo "write_cache = yes"; } >"$T/wce.conf"
tc_start "$T/wce.conf"
out=$(qemu-io -f raw -c 'write -P 0x11 0 4k' -c 'write -P 0x22 4k 60k' -c 'write -P 0x33 64k 64k' \
	-c 'write -P 0x44 128k 256k' -c 'write -P 0x55 2k 4k' -c 'flush' \
	-c 'read -P 0x11 0 2k' -c 'read -P 0x55 2k 4k' -c 'read -P 0x22 6k 58k' -c 'read -P 0x33 64k 64k' \
	-c 'read -P 0x44 128k 256k' "$url" 2>&1) || fail "qemu-io (buffered, write cache on): $out"
[[ "$out" != *"Pattern verification failed"* ]] || fail "pattern mismatch (buffered, write cache on): $out"
pass "buffered, write cache on: writes of 2K..256K, overlapping, read back after SYNCHRONIZE CACHE"
head -c 4M /dev/urandom >"$T/rand2.img"
qemu-img convert -n -f raw -O raw -t writeback "$T/rand2.img" "$url" || fail "qemu-img convert (write cache on)"
tc_stop
cmp <(head -c 4M "$T/disk0.img") "$T/rand2.img" || fail "after a clean stop the backing file lacks what was written"
pass "buffered, write cache on: 4 MiB in the backing file after a clean stop"

# The read, write, verify, compare-and-write and unmap families of the
# libiscsi conformance suite on a buffered LUN: the page cache, the inline
# small writes and the sendfile reads answer as the O_DIRECT path does.
if command -v iscsi-test-cu >/dev/null; then
	tc_start "$T/wce.conf"
	families=SCSI.Read6,SCSI.Read10,SCSI.Read12,SCSI.Read16,SCSI.Write10,SCSI.Write12,SCSI.Write16
	families+=,SCSI.WriteVerify10,SCSI.WriteVerify16,SCSI.Verify10,SCSI.Verify16,SCSI.CompareAndWrite
	families+=,SCSI.Unmap,SCSI.WriteSame10,SCSI.WriteSame16
	timeout 600 iscsi-test-cu --dataloss -i iqn.2026-11.test:buf-a -I iqn.2026-11.test:buf-b -t "$families" \
		"$url" >"$T/cu.log" 2>&1
	kill -0 "$TC_PID" 2>/dev/null || fail "tiercached died during the suite"
	sum=$(python3 "$TC_ROOT/tests/tools/cu_summary.py" "$T/cu.log" --names)
	line=$(echo "$sum" | head -1)
	total=$(echo "$line" | awk '{print $2}') failed=$(echo "$line" | awk '{print $6}')
	[ -n "$total" ] && [ "$total" -ge 60 ] || fail "only '$total' conformance tests ran; see $T/cu.log"
	[ "$failed" = 0 ] || fail "conformance failures on a buffered LUN: $sum"
	pass "buffered: libiscsi read/write/verify/compare/unmap families: $line"
	tc_stop
fi
