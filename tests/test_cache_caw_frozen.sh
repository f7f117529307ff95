#!/usr/bin/env bash
# ATS heartbeats on a cached extent keep completing while the backing
# store answers nothing. ESXi drops a datastore when its heartbeat (COMPARE
# AND WRITE of one block) takes ~8 s; in write-back the block is in the
# cache, so nothing the backing store does may hold it.
#
# The backing file is on tests/tools/freeze_fs (FUSE). A write-back LUN's
# heartbeat block and the extent around it are written and cached; then
# the backing store is frozen, and while it holds the cleaner's destage,
# a host's read of uncached blocks and a 16 MiB write elsewhere (more
# than the 16 MiB cache can take without destaging, so it stays in
# flight), 100 heartbeats (caw_beat, one every 50 ms) must each complete
# within its 5 s timeout with no miscompare. With one worker, anything of
# the daemon's own that waits on the store stops them (an io_uring write
# the kernel issues inline, lseek for GET LBA STATUS), and so does a CAW
# that waits for writes to other blocks to finish. After the thaw
# everything lands: the backing file holds the last heartbeat.
. "$(dirname "$0")/lib.sh"
tc_tmpdir
command -v qemu-io >/dev/null || skip "qemu-io not installed"
CTL=$TC_ROOT/build/tierctl
tc_freeze_fs 32M
tc_build_tool caw_beat

port=$(tc_free_port)
url=iscsi://127.0.0.1:$port/iqn.2026-11.io.tiercache:test/0
# one worker: anything that blocks it on the frozen store stops the heartbeats
tc_basic_conf "$port" 32M | sed -e "s|^backing = .*|backing = $T/ff/disk|" -e "s|^\[daemon\]|&\nworkers = 1|" >"$T/t.conf"
cat >>"$T/t.conf" <<CONF
cache = fast

[cache fast]
legs = $T/leg0.img $T/leg1.img
size = 16M
mode = write-back
admit_hits = 1
seq_cutoff = 0
CONF
tc_start "$T/t.conf"
set_dirty() { "$CTL" -c "$T/t.conf" --json stats | python3 -c 'import json,sys; print(json.load(sys.stdin)["caches"][0]["dirty_bytes"])'; }

# the heartbeat block (LBA 2048) and its extent, and 4 MiB more, in the cache
out=$(qemu-io -f raw -c 'write -P 0x11 1M 1M' -c 'write -P 0x22 8M 4M' "$url" 2>&1) || fail "qemu-io write: $out"
"$T/caw_beat" "$url" 2048 5 10 5 >"$T/beat0.out" 2>&1 || fail "heartbeats before the freeze: $(cat "$T/beat0.out")"
pass "heartbeats on the cached block work: $(cat "$T/beat0.out")"

tc_freeze
# what a host does meanwhile: more writes (dirty data the cleaner cannot
# destage) and a read of blocks the cache does not hold (a miss that
# waits on the frozen store)
qemu-io -f raw -c 'write -P 0x33 14M 16M' "$url" >"$T/bg-write.out" 2>&1 &
bgw=$!
# (at 31 MiB, past the write's 14-30 MiB: a read inside it raced the write
# and read back 0x33 when the write got there first)
qemu-io -f raw -c 'read -P 0 31M 64K' "$url" >"$T/bg-read.out" 2>&1 &
bgr=$!
tc_wait_for 60 "requests to be held by the frozen backing store" eval '[ "$(tc_held)" -ge 1 ]'
pass "the backing store is frozen with $(tc_held) request(s) held"

if ! "$T/caw_beat" "$url" 2048 100 50 5 >"$T/beat.out" 2>&1; then
	tc_thaw
	fail "heartbeats on a cached block while the backing store is frozen: $(tr '\n' ' ' <"$T/beat.out")"
fi
[ "$(tc_held)" -ge 1 ] || fail "the backing store held nothing by the end of the heartbeats"
kill -0 "$bgw" 2>/dev/null || fail "the host's write ended during the freeze: the heartbeats did not run beside a write in flight"
pass "100 heartbeats while the backing store is frozen ($(tc_held) held) and a 16 MiB write waits for cache space: $(cat "$T/beat.out")"

tc_thaw
wait "$bgw" || fail "the write during the freeze failed: $(cat "$T/bg-write.out")"
wait "$bgr" || fail "the read during the freeze failed: $(cat "$T/bg-read.out")"
grep -q "read 65536/65536" "$T/bg-read.out" || fail "the read during the freeze: $(cat "$T/bg-read.out")"
pass "after the thaw, the write and the read held meanwhile complete"
timeout 120 "$CTL" -c "$T/t.conf" flush --wait >/dev/null 2>&1 || fail "flush --wait after the thaw"
[ "$(set_dirty)" = 0 ] || fail "dirty data left after the flush"
tc_stop
python3 - "$T/ff.img" <<'PY' || fail "the backing file does not hold the last heartbeat"
import sys
with open(sys.argv[1], "rb") as f:
    f.seek(2048 * 512)
    blk = f.read(512)
    f.seek(2048 * 512 + 512)
    rest = f.read((1 << 20) - 512)
    f.seek(14 << 20)
    bg = f.read(16 << 20)
assert blk.startswith(b"caw_beat 99 pid"), blk[:40]
assert rest == b"\x11" * len(rest), "the extent around the heartbeat changed"
assert bg == b"\x33" * len(bg), "the write during the freeze did not land"
PY
pass "the backing file holds the last heartbeat, its extent and the write made during the freeze"
