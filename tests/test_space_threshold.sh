#!/usr/bin/env bash
# Thin provisioning that tells the host before it hurts, through the
# daemon over iSCSI (libiscsi, tests/tools/scsi_probe.c), with backing
# files on a small loop-mounted ext4:
#  - VPD B2 (THRESHOLD EXPONENT), MODE SENSE 1Ch/02h (two soft threshold
#    descriptors) and LOG SENSE 00h/0Ch (available and used resources, as
#    df counts them) describe a LUN with space_warn = 60%;
#  - another file filling the filesystem past 60% gives each of two
#    sessions one UNIT ATTENTION 06/38/07 with INFORMATION 16, status says
#    so; deleting it re-arms the threshold, and passing it again tells again;
#  - the filesystem full: a write to unallocated space of a plain LUN gets
#    07/27/07 with the whole sense checked;
#  - a write-back LUN whose few dirty extents met ENOSPC: once space is
#    back and they land, its destage state ends by itself although fewer
#    than the 8 good destages in a row that end it otherwise came.
# Needs root and a loop device; skipped where the kernel gives neither.
. "$(dirname "$0")/lib.sh"
tc_tmpdir
CTL=$TC_ROOT/build/tierctl
tc_loop_fs 48M
tc_build_tool scsi_probe

port=$(tc_free_port)
iqn=iqn.2026-11.io.tiercache:test
tc_conf_head "$port" | sed 's/^\[daemon\]$/&\nspace_interval = 1/' >"$T/t.conf"
cat >>"$T/t.conf" <<CONF

[target $iqn]
lun0 = disk0
lun1 = disk1

[lun disk0]
backing = $T/fs/disk0.img
size = 8M
space_warn = 60%

[lun disk1]
backing = $T/fs/disk1.img
size = 16M
cache = fast

[cache fast]
legs = $T/leg0.img $T/leg1.img
size = 32M
mode = write-back
admit_hits = 1
seq_cutoff = 0
CONF
tc_start "$T/t.conf"

# sessions: A and B on disk0, C on disk1 (tests/lib.sh tc_probe_*)
open_probe() { tc_probe_open "$@"; }
probe() { tc_probe "$@"; }
url=iscsi://127.0.0.1:$port/$iqn
open_probe A "$url/0"
open_probe B "$url/0"
open_probe C "$url/1"
space() { # field of disk0's space in status
	"$CTL" -c "$T/t.conf" --json status | python3 -c '
import json,sys
for l in json.load(sys.stdin)["luns"]:
    if l["name"] == sys.argv[2]: print(l.get("space", {}).get(sys.argv[1], ""))' "$1" "${2:-disk0}"
}
lun_destage() {
	"$CTL" -c "$T/t.conf" --json status | python3 -c '
import json,sys
for c in json.load(sys.stdin)["caches"]:
    for l in c["luns"]:
        if l["name"] == "disk1": print(l.get("destage", ""))'
}
byte() { tc_probe_byte "$1"; } # byte N of "good HEX"
be32() { tc_probe_be32 "$1"; }

# ---- what the LUN says about its threshold ----
probe A cdb 1201b2004000 64
[ "${reply%% *}" = good ] && [ "$(byte 1)" = $((0xb2)) ] || fail "VPD B2: $reply"
expect_eq "$(byte 4)" 11 "VPD B2: THRESHOLD EXPONENT 11 (1 MiB sets)"
probe A cdb 5a081c02000000010000 256
[ "${reply%% *}" = good ] || fail "MODE SENSE 1Ch/02h: $reply"
# header 8 bytes; page at 8: 5C 02 00 1C; descriptors at 8+16 and 8+24
[ "$(byte 8)" = $((0x5c)) ] && [ "$(byte 9)" = 2 ] && [ "$(byte 11)" = 28 ] || fail "MODE SENSE 1Ch/02h page header: $reply"
[ "$(byte 24)" = $((0x80)) ] && [ "$(byte 25)" = 1 ] || fail "descriptor 16: want enabled, armed decreasing, available: $reply"
[ "$(byte 32)" = $((0x81)) ] && [ "$(byte 33)" = 2 ] || fail "descriptor 24: want enabled, armed increasing, used: $reply"
expect_eq "$(be32 36)" 4 "descriptor 24: the used-resources threshold at 60% of 8 sets"
pool_sets=$(( $(df --output=size -B1M "$T/fs" | tail -1) ))
avail_thr=$(be32 28)
[ "$avail_thr" -ge $((pool_sets * 35 / 100)) ] && [ "$avail_thr" -le $((pool_sets * 45 / 100)) ] ||
	fail "descriptor 16 threshold $avail_thr sets: want about 40% of the ${pool_sets} MiB filesystem"
pass "MODE SENSE 1Ch/02h: available <= $avail_thr sets (40% of the pool), used >= 4 sets (60% of the LUN)"
probe A cdb 4d004000000000010000 256
[ "${reply%% *}" = good ] && [ "$(byte 3)" = 2 ] && [ "$(byte 4)" = 0 ] && [ "$(byte 5)" = 12 ] ||
	fail "LOG SENSE 00h: want pages 00h and 0Ch: $reply"
log_lbp() { # sets avail and used (in 1 MiB sets) from LOG SENSE 0Ch
	probe A cdb 4d004c00000000010000 256
	[ "${reply%% *}" = good ] && [ "$(byte 0)" = $((0x8c)) ] && [ "$(byte 3)" = 24 ] || fail "LOG SENSE 0Ch: $reply"
	[ "$(byte 5)" = 1 ] && [ "$(byte 6)" = 3 ] && [ "$(byte 7)" = 8 ] && [ "$(byte 12)" = 2 ] ||
		fail "LOG SENSE 0Ch parameter 0001h (binary list, length 8, scope 10b): $reply"
	[ "$(byte 17)" = 2 ] && [ "$(byte 18)" = 3 ] && [ "$(byte 19)" = 8 ] && [ "$(byte 24)" = 1 ] ||
		fail "LOG SENSE 0Ch parameter 0002h (binary list, length 8, scope 01b): $reply"
	avail=$(be32 8) used=$(be32 20)
}
log_lbp
df_avail=$(( $(df --output=avail -B1M "$T/fs" | tail -1) ))
[ $((avail - df_avail)) -le 1 ] && [ $((df_avail - avail)) -le 1 ] ||
	fail "LOG SENSE 0Ch: $avail MiB available, df says $df_avail"
pass "LOG SENSE 0Ch: $avail sets available (df: $df_avail MiB), $used used by the LUN"

# ---- another file fills the filesystem past 60% ----
# each session consumes its POWER ON and anything else first
for who in A B; do probe "$who" tur; [ "$reply" = good ] || fail "session $who not ready: $reply"; done
warned() { [ "$(grep -c 'lun disk0: the space under .* past space_warn = 60%' "$T/daemon.log")" -ge "$1" ]; }
fill_to() { # PERCENT of the filesystem used, by $T/fs/filler
	local size used
	size=$(df --output=size -B1 "$T/fs" | tail -1) used=$(df --output=used -B1 "$T/fs" | tail -1)
	fallocate -l $((size * $1 / 100 - used)) "$T/fs/filler" || fail "fallocate of the filler failed"
}
fill_to 75
tc_wait_for 30 "the daemon to see the filesystem past 60%" warned 1
for who in A B; do
	probe "$who" tur
	case "$reply" in
	"check 6 38 07 info=16 sense="*) ;;
	*) fail "session $who after the threshold: '$reply' (want UNIT ATTENTION 38/07, INFORMATION 16)" ;;
	esac
	sense=${reply##*sense=}
	[ "${sense:0:2}" = f0 ] && [ "${sense:4:2}" = 06 ] && [ "${sense:6:8}" = 00000010 ] && [ "${sense:24:4}" = 3807 ] ||
		fail "session $who: sense $sense (want f0 .. 06, INFORMATION 00000010, 38/07)"
	probe "$who" tur
	[ "$reply" = good ] || fail "session $who told twice: $reply"
done
expect_eq "$(space warning)" True "status: disk0's space warning is on"
pass "past 60% used: both sessions got 06/38/07 once, INFORMATION 16 ($sense); status says so"

# ---- full: a write that needs new space fails as out of space ----
dd if=/dev/zero of="$T/fs/filler2" bs=64k 2>/dev/null
sync
probe A write 0 256 33
case "$reply" in
"check 7 27 07 "*) ;;
*) fail "a write to unallocated space on the full filesystem: '$reply' (want 07/27/07)" ;;
esac
sense=${reply##*sense=}
[[ "$sense" =~ ^[7f]0..07 ]] && [ "${sense:14:2}" = 0a ] && [ "${sense:24:4}" = 2707 ] ||
	fail "sense $sense: want fixed format, key 7, additional length 0Ah, 27/07"
pass "filesystem full: a plain LUN's write needing space gets 07/27/07 ($sense)"

# ---- space back: re-armed; past it again: told again ----
rm -f "$T/fs/filler" "$T/fs/filler2"
tc_wait_for 30 "the threshold to re-arm" grep -q "lun disk0: space back under space_warn = 60%" "$T/daemon.log"
expect_eq "$(space warning)" False "status: the warning is off once space is back"
fill_to 75
tc_wait_for 30 "the daemon to see the filesystem past 60% again" warned 2
probe B tur
case "$reply" in "check 6 38 07 info=16 "*) ;; *) fail "passing the re-armed threshold: '$reply'" ;; esac
pass "re-armed below 58%, and passing it again tells again"
rm -f "$T/fs/filler"

# ---- a write-back LUN with a few dirty extents that met ENOSPC ----
probe C tur
dd if=/dev/zero of="$T/fs/filler2" bs=64k 2>/dev/null
sync
for lba in 0 8192 16384; do # three extents, far apart
	probe C write "$lba" 128 44
	[ "$reply" = good ] || fail "write-back write at $lba: $reply"
done
tc_wait_for 60 "disk1's destage to meet the full filesystem" eval '[ "$(lun_destage)" = "No space left on device" ]'
rm -f "$T/fs/filler2"
tc_wait_for 90 "disk1's destage state to end once its three extents landed" eval '[ "$(lun_destage)" = ok ]'
grep -q "LUN disk1 has no dirty data left to destage" "$T/daemon.log" || fail "the end of the state is not logged"
for lba in 0 8192 16384; do
	probe C read "$lba" 128 44
	[ "$reply" = good ] || fail "reading back disk1 at $lba: $reply"
done
pass "write-back: three dirty extents landed after space came back, the destage state ended by itself"

for who in A B C; do tc_probe_close "$who"; done
tc_stop
python3 - "$T/fs/disk1.img" <<'PY' || fail "disk1's backing file does not hold the three writes"
import sys
with open(sys.argv[1], "rb") as f:
    for lba in (0, 8192, 16384):
        f.seek(lba * 512)
        if f.read(65536) != b"\x44" * 65536:
            sys.exit(f"LBA {lba} differs")
PY
pass "every acknowledged write-back block is on disk1's backing file"
