#!/usr/bin/env bash
# A reload with a site's number of LUNs: 250 configured (125 on one
# write-back cache set, 125 plain files), a SIGHUP that removes 50 and
# adds 50 (25 of them cached) while a host writes and reads back data on
# 100 of the untouched LUNs without a pause: not one error and not one
# wrong block on them (a UNIT ATTENTION for the changed inventory is
# retried, as hosts do); the 50 new LUNs serve, the 50 removed ones are
# gone from REPORT LUNS; and tiercached --check on the 250-LUN file
# answers, on the file as it is after the change too.
. "$(dirname "$0")/lib.sh"
tc_tmpdir
command -v iscsi-ls >/dev/null || skip "libiscsi's iscsi-ls is not installed"
tc_build_tool lun_sweep
port=$(tc_free_port)
iqn=iqn.2026-12.io.tiercache:many
url=iscsi://127.0.0.1:$port/$iqn/0

# conf FIRST LAST: LUNs dN for N in FIRST..LAST mapped as lunN; dN cached when N % 2 == 0 and N < 250,
# or N >= 250 and N % 2 == 0 (the new ones alternate too)
conf() {
	local first=$1 last=$2 i
	tc_conf_head "$port"
	printf '\n[target %s]\n' "$iqn"
	for ((i = first; i <= last; i++)); do printf 'lun%d = d%d\n' "$i" "$i"; done
	for ((i = first; i <= last; i++)); do
		printf '\n[lun d%d]\nbacking = %s/d%d.img\nsize = 4M\n' "$i" "$T" "$i"
		[ $((i % 2)) = 0 ] && echo "cache = fast"
	done
	printf '\n[cache fast]\nlegs = %s/leg0.img %s/leg1.img\nsize = 128M\nmode = write-back\n' "$T" "$T"
}
# old: d0..d249; new: d0..d199 and d250..d299 (lun200..lun249 removed)
conf 0 249 >"$T/old.conf"
{ conf 0 199; } >"$T/new.conf"
# the new LUNs' sections and maps, appended in the target's place
python3 - "$T/new.conf" "$T" <<'PY'
import sys
path, t = sys.argv[1], sys.argv[2]
s = open(path).read()
maps = "".join("lun%d = d%d\n" % (i, i) for i in range(250, 300))
secs = "".join("\n[lun d%d]\nbacking = %s/d%d.img\nsize = 4M\n%s" % (i, t, i, "cache = fast\n" if i % 2 == 0 else "")
               for i in range(250, 300))
s = s.replace("lun199 = d199\n", "lun199 = d199\n" + maps, 1)
s = s.replace("\n[cache fast]", secs + "\n[cache fast]", 1)
open(path, "w").write(s)
PY
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
tc_stop
