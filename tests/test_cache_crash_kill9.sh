#!/usr/bin/env bash
# Write-back survives kill -9: a writer over iSCSI logs every acknowledged
# 4 KiB block stamp (LBA, sequence, checksum); the daemon is SIGKILLed at a
# random moment while the writer runs, restarted, and a verifier reads every
# logged block back: each sector must hold its acknowledged stamp or a later
# one, never older data and never garbage. 20 cycles (200 with TC_LONG=1).
# The cache is smaller than the written region, so eviction, bypass writes,
# promotion and the cleaner all run between the kills.
. "$(dirname "$0")/lib.sh"
tc_tmpdir
# a private copy: the daemon is restarted many times, a rebuild meanwhile must not matter
cp "$TC_BIN" "$T/tiercached" || fail "no daemon binary at $TC_BIN; run make"
TC_BIN=$T/tiercached
cc -std=gnu11 -O2 -Wall -Wextra -o "$T/stamp_io" tests/tools/stamp_io.c -liscsi 2>"$T/cc.log" ||
	skip "cannot build tests/tools/stamp_io.c against libiscsi: $(head -1 "$T/cc.log")"

port=$(tc_free_port)
url=iscsi://127.0.0.1:$port/iqn.2026-11.io.tiercache:test/0
tc_basic_conf "$port" 64M >"$T/t.conf"
cat >>"$T/t.conf" <<CONF
cache = fast

[cache fast]
legs = $T/leg0.img $T/leg1.img
size = 16M
extent = 64K
mode = write-back
admit_hits = 1
CONF

cycles=${TC_CYCLES:-20}
[ -n "${TC_LONG:-}" ] && cycles=200
: >"$T/acked.log"
tc_start "$T/t.conf"
for ((i = 1; i <= cycles; i++)); do
	"$T/stamp_io" write "$url" "$T/acked.log" $((i * 1000000)) 10 4096 >"$T/writer.log" 2>&1 &
	wpid=$!
	# kill somewhere between 0.2 s and 1.4 s into the writes
	sleep "$(awk -v r=$RANDOM 'BEGIN { printf "%.2f", 0.2 + (r % 120) / 100 }')"
	kill -KILL "$TC_PID"
	wait "$TC_PID" 2>/dev/null
	wait "$wpid" || fail "cycle $i: the writer failed: $(cat "$T/writer.log")"
	tc_start "$T/t.conf"
	out=$("$T/stamp_io" verify "$url" "$T/acked.log" 2>&1) || fail "cycle $i: $out"
	echo "cycle $i: $(tail -1 "$T/writer.log"); $out"
done
grep -q "recovered" "$T/daemon.log" || fail "the daemon never reported a recovery"
pass "$cycles kill -9 cycles: every acknowledged write read back ($(wc -l <"$T/acked.log") acknowledged writes)"
tc_stop
