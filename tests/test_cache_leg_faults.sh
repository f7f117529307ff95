#!/usr/bin/env bash
# Dying cache legs under load, through the daemon's test fault device
# ([cache] fault_injection = yes, tierctl leg fault), on a write-back LUN
# with two file legs. Every host I/O goes over iSCSI: tierbench --verify
# (stamped blocks, every read checked, all read back at the end) and
# tests/tools/lba_io (READ(16)/WRITE(16) with the sense of each command).
#   1. Leg 1 starts failing every I/O (eio) in the middle of a verify load:
#      no initiator error, no mismatch; the set is degraded with leg 1
#      failed, and known data written before and after reads back.
#   3. (right after 1) The daemon stops, leg 1's data area is overwritten
#      with garbage, and the daemon starts with leg 1 answering again: the
#      failure recorded in leg 0's superblock keeps it out, so every read
#      verifies and leg 1 serves no read (beyond its superblocks at open).
#   2. On fresh legs, a latent sector error (range) on leg 0 under cached
#      data: reads of it succeed from leg 1, the leg's error count goes up
#      but it stays in service, the range is rewritten from leg 1, and then
#      the same reads raise no error. A verify load over another bad range
#      has no error either and leaves the set healthy.
#  2b. (right after 2) The same range on leg 0 stays unreadable although
#      every rewrite succeeds (a drive that can no longer remap), with
#      max_read_errors = 3: every read is good, and once 4 ranges were
#      noted for a rewrite within the hour leg 0 is failed, the reason in
#      the daemon log.
#   4. On fresh legs, both legs fail with dirty data: status lists the lost
#      ranges before any host reads them; a lost LBA reads CHECK CONDITION,
#      MEDIUM ERROR, UNRECOVERED READ ERROR (03/11/00); clean LBAs (destaged
#      by flush --wait, or only ever on the backing store) read correctly.
#   5. On fresh legs, leg 1 stops answering (hang) in the middle of a verify
#      load, with leg_timeout = 2: the reads and writes it holds finish on
#      leg 0 (the load ends while leg 1 still holds them), no initiator
#      error, status degraded with leg 1 failed; a stop with leg 1 still
#      hung finishes, and the restart keeps leg 1 out.
# Every wait polls a condition with a bound.
. "$(dirname "$0")/lib.sh"
tc_tmpdir
cp "$TC_BIN" "$T/tiercached" || fail "no daemon binary at $TC_BIN; run make"
TC_BIN=$T/tiercached # a rebuild while the test restarts the daemon must not matter
# the helper is part of the test: one that does not build fails it
cc -std=gnu11 -O2 -Wall -Wextra -o "$T/lba_io" "$TC_ROOT/tests/tools/lba_io.c" -liscsi 2>"$T/cc.log" ||
	fail "cannot build tests/tools/lba_io.c against libiscsi: $(head -5 "$T/cc.log")"
python3 "$TC_ROOT/tests/tools/leg_read.py" >/dev/null 2>&1
[ $? = 2 ] || fail "tests/tools/leg_read.py does not run (python3 missing or the script broken)"
[ -x "$TC_ROOT/build/tierbench" ] || fail "no build/tierbench; run make"

port=$(tc_free_port)
url=iscsi://127.0.0.1:$port/iqn.2026-11.io.tiercache:test/0
leg0=$T/leg0.img
leg1=$T/leg1.img
{
	tc_basic_conf "$port" 64M
	cat <<CONF
cache = fast

[cache fast]
legs = $leg0 $leg1
size = 32M
extent = 256K
mode = write-back
seq_cutoff = 0
leg_timeout = 2
fault_injection = yes
CONF
} >"$T/t.conf"

ctl() { "$TC_ROOT/build/tierctl" -c "$T/t.conf" "$@"; }
lba_io() { "$T/lba_io" "$1" "$url" "${@:2}"; }
# a field of the cache set's status, as a Python expression on c (the set)
cst() { ctl --json status | python3 -c "import json,sys; c=json.load(sys.stdin)['caches'][0]; print(eval(sys.argv[1]))" "$1"; }
# a counter of a leg's fault device: leg fault LEG MODE [OFF LEN] reports reads, writes, errors
fault() { # LEG MODE [OFF LEN] -> "reads writes errors"
	ctl --json leg fault fast "$@" | python3 -c "import json,sys; d=json.load(sys.stdin); print(d['reads'], d['writes'], d['errors'])"
}
# the pieces of a random file: slice SRC FIRST_BLOCK BLOCKS DST
slice() { dd if="$1" of="$4" bs=512 skip="$2" count="$3" status=none; }
fresh() { rm -rf "$T/state" "$leg0" "$leg1" "$T/disk0.img"; }
# tierbench --verify: the exit status, and the JSON in $T/tb.json
bench() { # SECONDS OFFSET SIZE
	"$TC_ROOT/build/tierbench" --verify -w 4k-randwrite -r 70 -t 2 -q 16 -T "$1" --offset "$2" --size "$3" \
		--no-progress --json "$url" >"$T/tb.json" 2>"$T/tb.err"
}
bench_check() { # WHAT: exit 0, read back > 0, no mismatch
	local rc=$1 what=$2
	[ "$rc" = 0 ] || fail "$what: tierbench exited $rc (1: mismatch, 2: a target error): $(head -c 600 "$T/tb.err")"
	read -r ios mism rb < <(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); v=d['verify']
print(sum(r['ios'] for r in d['runs']), v['mismatches'], v['read_back'])" "$T/tb.json")
	[ "$mism" = 0 ] && [ "$rb" -gt 0 ] || fail "$what: $mism mismatches, $rb blocks read back"
	pass "$what: tierbench --verify: $ios I/Os, $rb blocks read back, 0 errors, 0 mismatches"
}
# poll until the command succeeds: wait_for SECONDS WHAT CMD...
wait_for() {
	local secs=$1 what=$2 i
	shift 2
	for ((i = 0; i < secs * 10; i++)); do
		"$@" && return 0
		sleep 0.1
	done
	fail "$what: not within $secs s"
}

# Start again with leg 1 answering: the failure recorded in leg 0's superblock
# keeps it out (read at most for its 2 superblock copies), and the known
# ranges read back from leg 0. restart_leg1_out PART WHAT_R WHAT_R2; sets rd0.
restart_leg1_out() {
	tc_start "$T/t.conf"
	read -r rd0 _ _ < <(fault "$leg1" ok)
	[ "$rd0" -le 2 ] || fail "$1: the daemon read leg 1 $rd0 times at start (no more than its 2 superblock copies)"
	expect_eq "$(cst 'c["state"], c["legs"][1]["health"]')" "('degraded', 'failed')" \
		"$1: after the restart the set is degraded, leg 1 still failed"
	expect_eq "$(lba_io read "$r_lba" 8192 --times 2 --expect "$T/r.img")" good "$1: $2"
	expect_eq "$(lba_io read "$r2_lba" 8192 --times 2 --expect "$T/r2.img")" good "$1: $3"
}

head -c 4M /dev/urandom >"$T/r.img"  # LUN 24M..28M: written on two healthy legs
head -c 4M /dev/urandom >"$T/r2.img" # LUN 32M..36M: written after leg 1 failed
r_lba=$((24 << 11))
r2_lba=$((32 << 11))

# ---- 1. leg 1 fails (eio) in the middle of a verify load -----------------------------------
fresh
tc_start "$T/t.conf"
expect_eq "$(lba_io write "$r_lba" 8192 "$T/r.img")" good "part 1: 4 MiB written on two healthy legs"
read -r _ w0 _ < <(fault "$leg1" ok)
bench 8 0 16M &
tb_pid=$!
leg1_writes_past() { local w; read -r _ w _ < <(fault "$leg1" ok); [ "$w" -ge $((w0 + 1000)) ]; }
wait_for 20 "part 1: the load writing to leg 1" leg1_writes_past
kill -0 $tb_pid 2>/dev/null || fail "part 1: the load ended before the fault could be injected"
fault "$leg1" eio >/dev/null || fail "part 1: tierctl leg fault eio"
pass "part 1: leg 1 fails every I/O from the middle of the load on"
wait $tb_pid
bench_check $? "part 1: load across the failure of leg 1"
read -r _ _ e1 < <(fault "$leg1" eio)
[ "$e1" -gt 0 ] || fail "part 1: leg 1's fault device failed no I/O"
expect_eq "$(cst 'c["state"], c["legs"][0]["health"], c["legs"][1]["health"]')" \
	"('degraded', 'healthy', 'failed')" "part 1: status degraded, leg 1 failed after $e1 failed I/O(s)"
expect_eq "$(lba_io read "$r_lba" 8192 --times 2 --expect "$T/r.img")" good \
	"part 1: data written before the failure reads back"
expect_eq "$(lba_io write "$r2_lba" 8192 "$T/r2.img")" good "part 1: 4 MiB written while degraded"
expect_eq "$(lba_io read "$r2_lba" 8192 --times 2 --expect "$T/r2.img")" good \
	"part 1: data written while degraded reads back"

# ---- 3. the failed leg comes back with garbage: never read before a resync -----------------
tc_stop
info=$(python3 "$TC_ROOT/tests/tools/leg_read.py" info "$leg0") || fail "part 3: leg_read.py info: $info"
[[ "$info" == *"failed mask 0x2;"* ]] || fail "part 3: leg 0's superblock does not record leg 1 as failed: $info"
# what leg 0 holds of the two known ranges (the reads below must come from the cache to mean anything)
read -r data_off leg_size cached < <(PYTHONPATH="$TC_ROOT/tests/tools" python3 - "$leg0" "$r_lba" "$r2_lba" <<'PY'
import sys
import leg_read
g = leg_read.Leg(sys.argv[1])
n = 0
for base in (int(sys.argv[2]), int(sys.argv[3])):
    for s in range(base, base + 8192):
        n += g.block("disk0", s)[0]
print(g.sb["data_off"], g.sb["leg_size"], n)
PY
)
[ "${cached:-0}" -gt 4096 ] || fail "part 3: leg 0 caches only ${cached:-0} of the 16384 known sectors"
dd if=/dev/urandom of="$leg1" bs=64K seek=$((data_off / 65536)) count=$(((leg_size - data_off) / 65536)) \
	conv=notrunc status=none || fail "part 3: cannot overwrite leg 1"
pass "part 3: leg 1's data area (from byte $data_off) overwritten with garbage; leg 0 caches $cached of the known sectors"
restart_leg1_out "part 3" "data written on two legs reads back" "data written while degraded reads back"
bench 2 0 16M
bench_check $? "part 3: load with leg 1 back"
read -r rd1 _ _ < <(fault "$leg1" ok)
expect_eq "$rd1" "$rd0" "part 3: leg 1 served no read ($rd0 superblock read(s) at open)"
tc_stop

# ---- 2. a latent sector error on leg 0 ------------------------------------------------------
fresh
head -c 4M /dev/urandom >"$T/p.img" # LUN 0..4M
tc_start "$T/t.conf"
expect_eq "$(lba_io write 0 8192 "$T/p.img")" good "part 2: 4 MiB written"
# clean, so that only the reads below meet the bad sectors (no destage reads them first)
out=$(ctl flush --wait 2>&1) || fail "part 2: tierctl flush --wait: $out"
tc_stop
# where leg 0 holds LUN extents 5 and 10: 64 KiB from block 128 of each (bad ranges A and B)
read -r a_slot a_off b_off < <(PYTHONPATH="$TC_ROOT/tests/tools" python3 - "$leg0" <<'PY'
import sys
import leg_read
g = leg_read.Leg(sys.argv[1])
key = g.bid("disk0") << 40
out = []
for ext in (5, 10):
    s = g.map.get(key | ext)
    if s is None or g.slots[s].v != g.all:
        sys.exit("extent %d is not cached whole on leg 0" % ext)
    out.append(g.sb["data_off"] + s * g.ext + 128 * 512)
    if ext == 5:
        out.insert(0, s)
print(*out)
PY
) || fail "part 2: cannot locate the cached extents on leg 0"
a_lba=$((5 * 512 + 128))
slice "$T/p.img" "$a_lba" 128 "$T/a.img"
tc_start "$T/t.conf"
errs0=$(cst 'c["legs"][0]["errors"]')
fault "$leg0" range "$a_off" 64K >/dev/null || fail "part 2: tierctl leg fault range"
a_errors() { [ "$(cst 'c["legs"][0]["errors"]')" -gt "$errs0" ]; }
for ((i = 0; i < 40; i++)); do
	out=$(lba_io read "$a_lba" 128 --expect "$T/a.img")
	[ "$out" = good ] || fail "part 2: read $((i + 1)) of the bad range: $out"
	a_errors && break
done
a_errors || fail "part 2: 40 reads of the bad range raised no error on leg 0"
errs1=$(cst 'c["legs"][0]["errors"]')
pass "part 2: $((i + 1)) read(s) of the bad range all good; leg 0's error count $errs0 -> $errs1"
expect_eq "$(cst 'c["state"], c["legs"][0]["health"], c["legs"][1]["health"]')" \
	"('healthy', 'healthy', 'healthy')" "part 2: a read error does not fail the leg"
rewritten() { grep -q "leg $leg0: [0-9]* block(s) of slot $a_slot that could not be read were rewritten" "$T/daemon.log"; }
wait_for 10 "part 2: the bad range rewritten from leg 1" rewritten
pass "part 2: daemon log: $(grep -o "[0-9]* block(s) of slot $a_slot that .* rewritten from the other leg" "$T/daemon.log" | head -1)"
errs2=$(cst 'c["legs"][0]["errors"]')
expect_eq "$(lba_io read "$a_lba" 128 --times 20 --expect "$T/a.img")" good "part 2: 20 reads after the rewrite"
expect_eq "$(cst 'c["legs"][0]["errors"]')" "$errs2" "part 2: no new error on leg 0 once repaired"
# a second bad range, met by a verify load over the first 4 MiB
fault "$leg0" range "$b_off" 64K >/dev/null || fail "part 2: tierctl leg fault range (second range)"
bench 3 0 4M
bench_check $? "part 2: load over a bad range"
errs3=$(cst 'c["legs"][0]["errors"]')
[ "$errs3" -gt "$errs2" ] || fail "part 2: the load met no bad sector (errors stayed $errs2)"
expect_eq "$(cst 'c["state"], c["legs"][0]["health"]')" "('healthy', 'healthy')" \
	"part 2: healthy after the load met $((errs3 - errs2)) read error(s)"
read -r _ _ fe < <(fault "$leg0" ok)
expect_eq "$fe" "$errs3" "part 2: the errors the fault device returned are the ones status counts"
tc_stop

# ---- 2b. a range that stays unreadable although rewritten: max_read_errors fails the leg ---------
sed 's/^leg_timeout = 2$/leg_timeout = 2\nmax_read_errors = 3/' "$T/t.conf" >"$T/t2.conf"
grep -q '^max_read_errors = 3$' "$T/t2.conf" || fail "part 2b: cannot write the configuration"
tc_start "$T/t2.conf"
# the load of part 2 overwrote range A: new known data there (the slot stays the same)
head -c 64K /dev/urandom >"$T/a.img"
expect_eq "$(lba_io write "$a_lba" 128 "$T/a.img")" good "part 2b: range A written again"
fault "$leg0" stuck "$a_off" 64K >/dev/null || fail "part 2b: tierctl leg fault stuck"
leg0_failed() { [ "$(cst 'c["legs"][0]["health"]')" = failed ]; }
reads=0
t0=$SECONDS
while ! leg0_failed && ((SECONDS - t0 < 60)); do
	out=$(lba_io read "$a_lba" 128 --expect "$T/a.img")
	[ "$out" = good ] || fail "part 2b: read $((reads + 1)) of the stuck range: $out"
	reads=$((reads + 1))
done
leg0_failed || fail "part 2b: leg 0 still in service after $reads reads of a range its rewrites never heal"
grep -q "leg $leg0: 4 unreadable ranges within an hour (max_read_errors 3); failing it" "$T/daemon.log" ||
	fail "part 2b: no max_read_errors line in the daemon log"
pass "part 2b: leg 0 failed after $reads good reads of a range it could not keep (max_read_errors 3)"
expect_eq "$(lba_io read "$a_lba" 128 --times 4 --expect "$T/a.img")" good "part 2b: the range reads back from leg 1"
expect_eq "$(cst 'c["state"], c["legs"][1]["health"]')" "('degraded', 'healthy')" "part 2b: status degraded"
tc_stop

# ---- 4. both legs fail with dirty data ------------------------------------------------------
fresh
head -c 1M /dev/urandom >"$T/b.img" # LUN 48M..49M: only ever on the backing store
head -c 1M /dev/urandom >"$T/c.img" # LUN 20M..21M: cached, destaged by flush --wait
head -c 4M /dev/urandom >"$T/d.img" # LUN 10M..14M: dirty when the legs die
b_lba=$((48 << 11)) c_lba=$((20 << 11)) d_lba=$((10 << 11))
truncate -s 64M "$T/disk0.img"
dd if="$T/b.img" of="$T/disk0.img" bs=1M seek=48 conv=notrunc status=none
tc_start "$T/t.conf"
expect_eq "$(lba_io write "$c_lba" 2048 "$T/c.img")" good "part 4: 1 MiB written"
out=$(ctl flush --wait 2>&1) || fail "part 4: tierctl flush --wait: $out"
expect_eq "$(cst 'c["dirty_bytes"]')" 0 "part 4: flush --wait destaged it"
expect_eq "$(lba_io write "$d_lba" 8192 "$T/d.img")" good "part 4: 4 MiB written"
fault "$leg0" eio >/dev/null && fault "$leg1" eio >/dev/null || fail "part 4: tierctl leg fault eio"
dirty=$(cst 'c["dirty_bytes"]')
[ "$dirty" -gt 0 ] || fail "part 4: nothing dirty when the legs failed"
# a read error is a bad range, not a dead leg: a read of the clean cached
# range meets both legs failing and is served from the backing store...
expect_eq "$(lba_io read "$c_lba" 2048 --expect "$T/c.img")" good \
	"part 4: a read both legs fail (a clean range) reads correct data"
# ...and a write is what fails the legs (it was never acknowledged: its
# status does not matter here)
head -c 4K /dev/urandom >"$T/z.img"
lba_io write $((30 << 11)) 8 "$T/z.img" >/dev/null 2>&1
both_failed() { [ "$(cst 'c["legs"][0]["health"], c["legs"][1]["health"]')" = "('failed', 'failed')" ]; }
wait_for 10 "part 4: both legs failed" both_failed
# at once, before any host read of the dirty range
ctl --json status >"$T/st.json"
read -r nlost lost_ios dropped < <(python3 -c "import json,sys; c=json.load(open(sys.argv[1]))['caches'][0]
print(len(c['lost_ranges']), c['lost_ios'], c['lost_ranges_dropped'])" "$T/st.json")
[ "$nlost" -gt 0 ] || fail "part 4: status lists no lost range right after the last leg failed ($dirty bytes were dirty)"
expect_eq "$lost_ios $dropped" "0 0" "part 4: $nlost lost range(s) listed before any host read met them"
# the lost ranges, cut into reads of at most one extent: "LBA BLOCKS lost|clean" over all of D
python3 - "$T/st.json" "$d_lba" 8192 >"$T/plan" <<'PY' || fail "part 4: $(cat "$T/plan")"
import json, sys
c = json.load(open(sys.argv[1]))["caches"][0]
lo, n = int(sys.argv[2]), int(sys.argv[3])
lost = set()
for r in c["lost_ranges"]:
    a, b = r["offset"] // 512, (r["offset"] + r["length"]) // 512
    if r["lun"] != "disk0" or a < lo or b > lo + n:
        sys.exit("lost range %s is not inside the dirty writes" % r)
    lost.update(range(a, b))
ext = c["extent_size"] // 512
s = lo
while s < lo + n:
    e = s + 1
    while e < lo + n and e % ext and (e in lost) == (s in lost):
        e += 1
    print(s, e - s, "lost" if s in lost else "clean")
    s = e
PY
nl=0 nc=0
while read -r lba blocks kind; do
	if [ "$kind" = lost ]; then
		out=$(lba_io read "$lba" "$blocks")
		[ $? = 3 ] && [[ "$out" == "check condition: sense 3/11/00 "* ]] ||
			fail "part 4: a lost range ($blocks blocks at LBA $lba) read: $out"
		nl=$((nl + blocks))
	else
		slice "$T/d.img" $((lba - d_lba)) "$blocks" "$T/piece.img"
		out=$(lba_io read "$lba" "$blocks" --expect "$T/piece.img")
		[ "$out" = good ] || fail "part 4: a destaged piece of the dirty writes ($blocks blocks at LBA $lba): $out"
		nc=$((nc + blocks))
	fi
done <"$T/plan"
[ "$nl" -gt 0 ] || fail "part 4: no lost block read"
pass "part 4: $nl lost blocks read CHECK CONDITION 03/11/00 (MEDIUM ERROR, UNRECOVERED READ ERROR); $nc destaged before the failure read correctly"
[ "$(cst 'c["lost_ios"]')" -gt 0 ] || fail "part 4: status counts no lost I/O after reads of lost blocks"
expect_eq "$(lba_io read "$c_lba" 2048 --times 2 --expect "$T/c.img")" good \
	"part 4: the range destaged by flush --wait reads correct data"
expect_eq "$(lba_io read "$b_lba" 2048 --times 2 --expect "$T/b.img")" good \
	"part 4: a range only ever on the backing store reads correct data"
# Once the host is idle the cleaner runs unlimited (its rate at the maximum,
# 1 TiB/s): with the lost data still dirty, it must not spin on worker 0
# (which also accepts connections), so a new login is still served.
unlimited() { [ "$(cst 'c["cleaner_rate_bps"]')" = $((1 << 40)) ]; }
wait_for 15 "part 4: the cleaner running unlimited on an idle host" unlimited
out=$(timeout 15 "$T/lba_io" read "$url" "$c_lba" 2048 --expect "$T/c.img")
expect_eq "$out" good "part 4: a new session is served with the cleaner unlimited and every leg gone"
tc_stop

# ---- 5. leg 1 stops answering in the middle of a verify load (leg_timeout = 2) -------------
fresh
tc_start "$T/t.conf"
expect_eq "$(lba_io write "$r_lba" 8192 "$T/r.img")" good "part 5: 4 MiB written on two healthy legs"
held() { # -> "held_reads held_writes errors" of leg 1's fault device
	ctl --json leg fault fast "$leg1" "$1" |
		python3 -c "import json,sys; d=json.load(sys.stdin); print(d['held_reads'], d['held_writes'], d['errors'])"
}
read -r _ w0 _ < <(fault "$leg1" ok)
bench 8 0 16M &
tb_pid=$!
wait_for 20 "part 5: the load writing to leg 1" leg1_writes_past
kill -0 $tb_pid 2>/dev/null || fail "part 5: the load ended before the fault could be injected"
fault "$leg1" hang >/dev/null || fail "part 5: tierctl leg fault hang"
pass "part 5: leg 1 answers nothing from the middle of the load on"
# leg 1 keeps what it holds until told otherwise: the load can only end if
# every command it held finished on leg 0
wait_for 60 "part 5: the load ending while leg 1 holds its requests" tc_gone $tb_pid
wait $tb_pid
bench_check $? "part 5: load across leg 1 hanging"
read -r hr hw _ < <(held hang)
[ "$hr" -gt 0 ] && [ "$hw" -gt 0 ] ||
	fail "part 5: leg 1 held $hr reads and $hw writes: the hang did not catch both in flight"
expect_eq "$(cst 'c["state"], c["legs"][0]["health"], c["legs"][1]["health"]')" \
	"('degraded', 'healthy', 'failed')" "part 5: status degraded, leg 1 failed after it held $hr reads and $hw writes"
[ "$(cst 'c["leg_timeouts"]')" -gt 0 ] || fail "part 5: status counts no leg timeout"
grep -q "did not answer within leg_timeout" "$T/daemon.log" || fail "part 5: the log does not say why leg 1 failed"
expect_eq "$(lba_io read "$r_lba" 8192 --times 2 --expect "$T/r.img")" good \
	"part 5: data written before the hang reads back"
expect_eq "$(lba_io write "$r2_lba" 8192 "$T/r2.img")" good "part 5: 4 MiB written with leg 1 still hung"
expect_eq "$(lba_io read "$r2_lba" 8192 --times 2 --expect "$T/r2.img")" good \
	"part 5: data written with leg 1 hung reads back"
tc_stop # leg 1 still holds its requests: they fail when its device closes
pass "part 5: the daemon stops with leg 1 still holding $((hr + hw)) requests"
restart_leg1_out "part 5" "after the restart, data written before the hang reads back" \
	"after the restart, data written with leg 1 hung reads back"
tc_stop
