#!/usr/bin/env bash
# ODX, the offloaded copy Windows and Hyper-V use (issue 14 part 4), through
# the portal with tests/tools/odx_probe (libiscsi). Target 1 has a source
# LUN cached write-back (the copied data is dirty on the legs: the copy must
# read it from the cache) and a destination LUN; target 2 another LUN.
# The probe checks VPD 8Fh, POPULATE TOKEN / RECEIVE ROD TOKEN INFORMATION /
# WRITE USING TOKEN with two ranges and with an offset into the token, that
# a write to a source range cancels the token (and one elsewhere does not),
# altered, foreign and malformed tokens, the zero token, a nexus of another
# target and a reservation on the source refused, DEL_TKN and the
# inactivity timeout; then copies COPY_MIB (64) MiB by ODX and through the
# host and prints both times and another LUN's QD1 read p99 meanwhile.
# After the daemon stops, the destination file holds the copy.
. "$(dirname "$0")/lib.sh"
tc_tmpdir
tc_build_tool odx_probe
port=$(tc_free_port)
MIB=${ODX_MIB:-64}
tc_conf_head "$port" >"$T/t.conf"
cat >>"$T/t.conf" <<CONF

[target iqn.2026-12.io.tiercache:odx1]
lun0 = src
lun1 = dst

[target iqn.2026-12.io.tiercache:odx2]
lun0 = other

[lun src]
backing = $T/src.img
size = $((MIB * 2 + 64))M
cache = fast

[lun dst]
backing = $T/dst.img
size = $((MIB * 2 + 64))M

[lun other]
backing = $T/other.img
size = 32M

[cache fast]
legs = $T/leg0.img $T/leg1.img
size = 64M
mode = write-back
CONF
tc_start "$T/t.conf"
base=iscsi://127.0.0.1:$port/iqn.2026-12.io.tiercache
if ! "$T/odx_probe" "$base:odx1/0" "$base:odx2/0" "$MIB" >"$T/probe.out" 2>&1; then
	cat "$T/probe.out"
	fail "odx_probe: $(grep -c '^FAIL' "$T/probe.out") check(s) failed: $(grep '^FAIL' "$T/probe.out" | head -3 | tr '\n' ' ')"
fi
pass "odx_probe: $(grep -c '^ok' "$T/probe.out") checks passed"
grep '^timing' "$T/probe.out" | sed 's/^/  /'
tc_stop
# LBAs 0-4095 and 8192-12287 of the source (odx_probe's pattern, seed 1), at
# LBA 100 of the destination, in the destination's file
python3 - "$T/dst.img" <<'PY' || fail "the destination file does not hold the copied ranges"
import struct, sys
def stamp(lba, seed):
    v = (lba * 0x9e3779b97f4a7c15) & (2**64 - 1)
    return b"".join(struct.pack("<Q", v ^ (seed << 32) ^ i) for i in range(0, 512, 8))
dst = open(sys.argv[1], "rb")
dst.seek(100 * 512)
got = dst.read(8192 * 512)
want = b"".join(stamp(l, 1) for l in list(range(0, 4096)) + list(range(8192, 12288)))
assert got == want, "mismatch"
PY
pass "after the stop, the destination's file holds the token's two ranges at LBA 100"
