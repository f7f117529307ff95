#!/usr/bin/env bash
# A reload with a site's number of LUNs: 250 configured (125 on one
# write-back cache set, 125 plain files), a SIGHUP that removes 50 and
# adds 50 (25 of them cached) while a host writes and reads back data on
# 100 of the untouched LUNs without a pause: not one error and not one
# wrong block on them (a UNIT ATTENTION for the changed inventory is
# retried, as hosts do); the 50 new LUNs serve, the 50 removed ones are
# gone from REPORT LUNS; and tiercached --check on the 250-LUN file
# answers, on the file as it is after the change too. Then a kill -9 in the
# middle of a second reload: every serial stays as it was, and the daemon
# starts on the old file and on the new one, each LUN with its serial and
# the cache set's table holding only the LUNs of the file it runs.
. "$(dirname "$0")/lib.sh"
tc_tmpdir
command -v iscsi-ls >/dev/null || skip "libiscsi's iscsi-ls is not installed"
tc_build_tool lun_sweep
port=$(tc_free_port)
iqn=iqn.2026-12.io.tiercache:many
url=iscsi://127.0.0.1:$port/$iqn/0

# conf RANGE...: LUNs dN for N in each FIRST-LAST of the RANGEs, mapped as lunN;
# dN cached when N is even
conf() {
	local r i
	tc_conf_head "$port"
	printf '\n[target %s]\n' "$iqn"
	for r in "$@"; do
		for ((i = ${r%-*}; i <= ${r#*-}; i++)); do printf 'lun%d = d%d\n' "$i" "$i"; done
	done
	for r in "$@"; do
		for ((i = ${r%-*}; i <= ${r#*-}; i++)); do
			printf '\n[lun d%d]\nbacking = %s/d%d.img\nsize = 4M\n' "$i" "$T" "$i"
			[ $((i % 2)) = 0 ] && echo "cache = fast"
		done
	done
	printf '\n[cache fast]\nlegs = %s/leg0.img %s/leg1.img\nsize = 128M\nmode = write-back\n' "$T" "$T"
}
# old: d0..d249; new: d0..d199 and d250..d299 (lun200..lun249 removed);
# next (the reload killed below): d0..d199 and d300..d349
conf 0-249 >"$T/old.conf"
conf 0-199 250-299 >"$T/new.conf"
conf 0-199 300-349 >"$T/next.conf"
t0=$(date +%s%N)
"$TC_BIN" -c "$T/old.conf" --check >/dev/null || fail "--check refused the 250-LUN file"
"$TC_BIN" -c "$T/new.conf" --check >/dev/null || fail "--check refused the changed file"
check_ms=$((($(date +%s%N) - t0) / 2000000))
pass "tiercached --check on a 250-LUN file: about $check_ms ms"
cp "$T/old.conf" "$T/t.conf"
tc_start "$T/t.conf"
out=$("$T/lun_sweep" "$url" 250 --wait 120) || fail "not every LUN serves: $out"
pass "250 LUNs serve ($out)"

rm -f "$T/stop"
"$T/lun_sweep" "$url" 1 --loop 0 99 "$T/stop" >"$T/loop.out" 2>"$T/loop.err" &
loop_pid=$!
RBD_KILL_PIDS="$loop_pid" # (not a Ceph test: killed by the trap below if we fail)
trap 'kill $loop_pid 2>/dev/null; _tc_cleanup' EXIT
tc_until 30 grep -q '^served' "$T/loop.out" || fail "the host's I/O loop did not start"
writes_before() { grep -c . "$T/loop.out"; }
sleep 1 # some I/O before the reload (a measurement window, not a wait for a condition)
cp "$T/new.conf" "$T/t.conf"
kill -HUP "$TC_PID"
applied() { grep -q 'reload: 50 LUN(s) added, 50 removed' "$T/daemon.log"; }
tc_until 120 applied || fail "the reload did not apply within 120 s: $(grep 'reload' "$T/daemon.log" | tail -3)"
sleep 1 # and some after it
touch "$T/stop"
wait "$loop_pid"
rc=$?
trap _tc_cleanup EXIT
res=$(grep '^loop:' "$T/loop.out")
[ "$rc" = 0 ] || fail "the host saw errors on untouched LUNs during the reload: $res; $(head -5 "$T/loop.err")"
writes=$(echo "$res" | awk '{ print $2 }')
[ "$writes" -ge 200 ] || fail "too little I/O ran across the reload to show anything: $res"
pass "a reload removing 50 and adding 50 LUNs under I/O on 100 others: $res"

out=$("$T/lun_sweep" "iscsi://127.0.0.1:$port/$iqn/0" 200 --wait 30) || fail "an untouched LUN stopped serving: $out"
listed=$(iscsi-ls -s "iscsi://127.0.0.1:$port/" 2>&1 | awk '/Lun:/ { sub(/.*Lun:/, ""); print $1 }' | sort -n | tr '\n' ' ')
# LUNs from 256 on are sent in flat space addressing (SAM: 0x4000 | LUN), which iscsi-ls prints raw
want="$(seq 0 199 | tr '\n' ' ')$(seq 250 255 | tr '\n' ' ')$(seq $((16384 + 256)) $((16384 + 299)) | tr '\n' ' ')"
[ "$listed" = "$want" ] || fail "REPORT LUNS after the reload lists: $listed"
for l in 250 251 298 299; do
	"$T/lun_sweep" "iscsi://127.0.0.1:$port/$iqn/0" 1 --wait 30 --lat "$l" 10 >/dev/null ||
		fail "new lun$l does not serve"
done
pass "after the reload: 250 LUNs listed, the new ones serve, the removed ones are gone"

# --- kill -9 in the middle of a reload ---------------------------------------------
# The persistent state must then be the old configuration's, plus at most
# whole state of some of the LUNs the reload was adding: the serials of
# every LUN unchanged, and the daemon must start on either file, each LUN
# keeping the serial it had (hosts know the disks by it).
serials() { # the auto serials in state_dir, "NAME SERIAL" a line
	local f
	for f in "$T"/state/lun-*.serial; do printf '%s %s\n' "$(basename "$f" .serial)" "$(cat "$f")"; done | sort
}
known() { "$TC_ROOT/build/tierctl" -c "$T/t.conf" --json stats | python3 -c 'import json,sys; print(json.load(sys.stdin)["caches"][0]["luns_known"])'; }
serials >"$T/serials.before"
# 125 cached LUNs configured; the 25 the first reload removed held nothing
# dirty, so the reload closed them and freed their entries (as it does once
# a removed LUN's dirty data is destaged)
[ "$(known)" = 125 ] || fail "the set knows $(known) LUNs before the killed reload, not 125"
pass "the 25 cached LUNs the reload removed gave their entries in the set back"
hup_line=$(($(wc -l <"$T/daemon.log") + 1))
cp "$T/next.conf" "$T/t.conf"
kill -HUP "$TC_PID"
# stop it once the reload has opened three of its new LUNs (cached and
# not), then kill it there: 47 opens to go leave this loop time to see it
# on a busy machine
until tail -n +"$hup_line" "$T/daemon.log" | grep -qE '^tiercached: info: lun d3(0[2-9]|[1-4][0-9]):'; do
	kill -0 "$TC_PID" 2>/dev/null || fail "the daemon died during the reload"
done
kill -STOP "$TC_PID"
opened=$(tail -n +"$hup_line" "$T/daemon.log" | grep -c '^tiercached: info: lun d3[0-4][0-9]:')
tail -n +"$hup_line" "$T/daemon.log" | grep -q 'reload: 50 LUN(s) added' &&
	fail "the reload had ended when the daemon was stopped: this run shows nothing"
kill -KILL "$TC_PID"
wait "$TC_PID" 2>/dev/null
TC_PID=
serials >"$T/serials.killed"
extra=$(comm -13 "$T/serials.before" "$T/serials.killed")
changed=$(comm -23 "$T/serials.before" "$T/serials.killed")
[ -z "$changed" ] || fail "a kill -9 in the reload changed or lost serials: $changed"
bad=$(echo "$extra" | grep -v '^$' | grep -vE '^lun-d3[0-4][0-9] [0-9a-f]{16}$' || true)
[ -z "$bad" ] || fail "state after the kill holds what no configuration has: $bad"
pass "kill -9 after $opened of the reload's 50 new LUNs opened: every serial unchanged, $(echo "$extra" | grep -c .) whole new one(s)"

# the configuration in effect before the reload: all of it as it was; what the
# killed reload attached to the set (clean, empty) is freed at the start
cp "$T/new.conf" "$T/t.conf"
tc_start "$T/t.conf"
out=$("$T/lun_sweep" "$url" 200 --wait 120) || fail "after the kill, on the old file, not every LUN serves: $out"
for l in 250 299; do
	"$T/lun_sweep" "$url" 1 --wait 30 --lat "$l" 1 >/dev/null || fail "lun$l does not serve after the kill (old file)"
done
[ "$(known)" = 125 ] || fail "the set knows $(known) LUNs on the old file after the kill, not 125"
serials >"$T/serials.old"
cmp -s "$T/serials.killed" "$T/serials.old" || fail "serials changed starting on the old file: $(diff "$T/serials.killed" "$T/serials.old" | head -5)"
tc_stop
# the new one: every LUN serves, those the killed reload had made keep their serials
cp "$T/next.conf" "$T/t.conf"
tc_start "$T/t.conf"
out=$("$T/lun_sweep" "$url" 200 --wait 120) || fail "after the kill, on the new file, not every LUN serves: $out"
for l in 300 301 349; do
	"$T/lun_sweep" "$url" 1 --wait 30 --lat "$l" 1 >/dev/null || fail "lun$l does not serve after the kill (new file)"
done
[ "$(known)" = 125 ] || fail "the set knows $(known) LUNs on the new file, not 125"
serials >"$T/serials.new"
lost=$(comm -23 "$T/serials.killed" "$T/serials.new")
[ -z "$lost" ] || fail "serials changed starting on the new file: $lost"
[ "$(grep -cE '^lun-d3[0-4][0-9] ' "$T/serials.new")" = 50 ] || fail "the new file's LUNs lack serials: $(grep -cE '^lun-d3[0-4][0-9] ' "$T/serials.new") of 50"
pass "then the daemon starts on the old file and on the new one: every LUN serves with its serial, the set holds 125 entries each time"
tc_stop
