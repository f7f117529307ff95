#!/usr/bin/env bash
# [daemon] metrics: Prometheus /metrics (daemon/metrics.c), checked against
# what a client did and with Debian's own Prometheus tools:
#  - promtool check metrics finds nothing to say about the 0.0.4 text;
#  - after 2048 sequential 4K writes that fill 8 MiB of a write-back LUN, 3000
#    QD4 random reads of them, and 500 reads of a plain LUN, the per-LUN counts
#    equal what was sent: commands by kind, bytes, and each latency
#    histogram's count (summed over its outcomes) with its +Inf bucket; the
#    reads of cached data and the write-back writes are hits, the plain
#    LUN's reads "backing";
#  - the cache set's read counts moved by the reads sent, the legs are
#    healthy; its checkpoints and journal full waits are the counts of
#    tierctl status, taken on either side of the scrape;
#  - a login the target's allow list refuses is counted on that target,
#    and an open session shows in tiercache_target_sessions;
#  - asked for OpenMetrics, it answers what the strict parser of
#    python3-prometheus-client reads, with the same counts;
#  - a real Prometheus server scrapes it: up is 1 and PromQL queries of the
#    read count and of the hit histograms return what the client sent;
#  - anything but /metrics is 404;
#  - contrib/: the alert rules pass promtool check rules and their own
#    promtool test rules, and under load every PromQL expression of the
#    Grafana dashboard returns data from that Prometheus (at least one
#    series with a number, not NaN).
. "$(dirname "$0")/lib.sh"
tc_tmpdir
TB=$TC_ROOT/build/tierbench
[ -x "$TB" ] || skip "build/tierbench is not built"
command -v promtool >/dev/null || skip "promtool (Debian package prometheus) is not installed"
command -v prometheus >/dev/null || skip "prometheus is not installed"
/usr/bin/python3 -c 'import prometheus_client' 2>/dev/null || skip "python3-prometheus-client is not installed"
port=$(tc_free_port)
mport=$(tc_free_port)
iqn=iqn.2026-11.io.tiercache:metrics
{
	tc_conf_head "$port" | sed "s/^log_level = info\$/log_level = info\nmetrics = 127.0.0.1:$mport/"
	tc_cu_target_conf "$iqn" write-back
	tc_cu_target_conf "$iqn" plain
	cat <<CONF

[target $iqn-closed]
lun0 = closedlun
allow = iqn.2026-11.test:nobody-we-know

[lun closedlun]
backing = $T/closed.img
size = 16M
CONF
} >"$T/t.conf"
tc_start "$T/t.conf"
tc_wait_port "$mport" 30 || fail "nothing listens on the metrics port $mport"
grep -q "metrics at http://127.0.0.1:$mport/metrics" "$T/daemon.log" || fail "no 'metrics at' line in the log"
scrape() { python3 - "$mport" "$@" <<'PY'
import sys, urllib.request
req = urllib.request.Request("http://127.0.0.1:%s/metrics" % sys.argv[1])
if len(sys.argv) > 2:
    req.add_header("Accept", sys.argv[2])
sys.stdout.write(urllib.request.urlopen(req, timeout=10).read().decode())
PY
}
# value NAME LABELS-SUBSTRING...: the sum of the samples of NAME whose labels hold every substring
value() {
	local name=$1
	shift
	python3 - "$T/m.txt" "$name" "$@" <<'PY'
import sys
path, name, subs = sys.argv[1], sys.argv[2], sys.argv[3:]
tot, n = 0.0, 0
for line in open(path):
    if line.startswith("#") or not line.strip():
        continue
    metric, val = line.rsplit(" ", 1)
    base, _, labels = metric.partition("{")
    if base == name and all(s in labels for s in subs):
        tot += float(val)
        n += 1
print("%d" % tot if n else "none")
PY
}

w=iscsi://127.0.0.1:$port/$iqn-write-back/0
p=iscsi://127.0.0.1:$port/$iqn-plain/0
# written first, so the reads find the blocks in the cache (write-back keeps them)
"$TB" --json --no-progress -b 4k --seq -r 0 -t 1 -q 4 -n 2048 --size 8M "$w" >"$T/tb.json" || fail "tierbench writes: $(head -c 300 "$T/tb.json")"
"$TB" --json --no-progress -b 4k --rand -r 100 -t 1 -q 4 -n 3000 --size 8M "$w" >"$T/tb.json" || fail "tierbench reads: $(head -c 300 "$T/tb.json")"
"$TB" --json --no-progress -b 4k --rand -r 100 -t 1 -q 4 -n 500 --size 8M "$p" >"$T/tb.json" || fail "tierbench plain reads: $(head -c 300 "$T/tb.json")"
# a login the allow list refuses
iscsi-inq "iscsi://127.0.0.1:$port/$iqn-closed/0" >/dev/null 2>&1 && fail "a login outside the allow list was accepted"

scrape >"$T/m.txt" || fail "GET /metrics failed"
promtool check metrics <"$T/m.txt" >"$T/promtool.out" 2>&1 || fail "promtool check metrics: $(head -5 "$T/promtool.out")"
[ -s "$T/promtool.out" ] && fail "promtool check metrics has remarks: $(head -5 "$T/promtool.out")"
pass "promtool check metrics: clean ($(grep -vc '^#' "$T/m.txt") samples)"

check() { # WHAT GOT WANT
	[ "$2" = "$3" ] || fail "$1: $2, expected $3"
}
check "write-back LUN reads" "$(value tiercache_lun_commands_total 'lun="write-back"' 'op="read"')" 3000
check "write-back LUN writes" "$(value tiercache_lun_commands_total 'lun="write-back"' 'op="write"')" 2048
check "write-back LUN bytes read" "$(value tiercache_lun_bytes_total 'lun="write-back"' 'op="read"')" $((3000 * 4096))
check "write-back LUN bytes written" "$(value tiercache_lun_bytes_total 'lun="write-back"' 'op="write"')" $((2048 * 4096))
check "read latency histogram count" "$(value tiercache_lun_latency_seconds_count 'lun="write-back"' 'op="read"')" 3000
check "read latency +Inf buckets" "$(value tiercache_lun_latency_seconds_bucket 'lun="write-back"' 'op="read"' 'le="+Inf"')" 3000
check "write latency histogram count" "$(value tiercache_lun_latency_seconds_count 'lun="write-back"' 'op="write"')" 2048
check "reads of cached blocks counted as hits" "$(value tiercache_lun_latency_seconds_count 'lun="write-back"' 'op="read"' 'outcome="hit"')" 3000
check "write-back writes absorbed by the cache (hit)" "$(value tiercache_lun_latency_seconds_count 'lun="write-back"' 'op="write"' 'outcome="hit"')" 2048
check "plain LUN reads" "$(value tiercache_lun_latency_seconds_count 'lun="plain"' 'op="read"' 'outcome="backing"')" 500
check "cache set read pieces" "$(value tiercache_cache_reads_total 'cache="write-back"')" 3000
check "legs healthy" "$(value tiercache_cache_leg_state 'cache="write-back"' 'state="healthy"')" 2
check "refused logins of the closed target" "$(value tiercache_target_logins_refused_total "target=\"$iqn-closed\"")" 1
check "refused logins of the open target" "$(value tiercache_target_logins_refused_total "target=\"$iqn-write-back\"")" 0
pass "per-LUN counts and histograms equal what the client sent (3000 reads, 2048 writes, 500 plain reads), 1 refused login"

# the journal's counters are status' own: read on either side of a scrape,
# after a flush (a destage writes records, which may bring a checkpoint),
# until no checkpoint came in between
# journal_counters: "CHECKPOINTS JOURNAL_FULL_WAITS" of the write-back set, from one status
journal_counters() { "$TC_ROOT/build/tierctl" -c "$T/t.conf" --json status | python3 -c '
import json, sys
c = next(c for c in json.load(sys.stdin)["caches"] if c["name"] == "write-back")
print(c["checkpoints"], c["journal_full_waits"])'; }
"$TC_ROOT/build/tierctl" -c "$T/t.conf" flush --wait >/dev/null || fail "tierctl flush --wait"
for try in 1 2 3 4 5; do
	before=$(journal_counters)
	scrape >"$T/m.txt" || fail "GET /metrics failed"
	after=$(journal_counters)
	[ "$before" = "$after" ] && break
	[ "$try" = 5 ] && fail "the journal's counters kept moving around a scrape of the idle set ($before, then $after)"
done
read -r ck0 jf0 <<<"$before"
[[ $ck0 =~ ^[0-9]+$ ]] && [ "$ck0" -ge 1 ] || fail "status counts '$ck0' checkpoints after the set opened"
check "tiercache_cache_checkpoints_total" "$(value tiercache_cache_checkpoints_total 'cache="write-back"')" "$ck0"
check "tiercache_cache_journal_full_waits_total" "$(value tiercache_cache_journal_full_waits_total 'cache="write-back"')" "$jf0"
pass "checkpoints ($ck0) and journal full waits ($jf0) as status counts them"

# a session held open shows in the sessions gauge
"$TB" --json --no-progress -b 4k --rand -r 100 -t 1 -q 1 -T 30 --size 8M "$p" >/dev/null 2>&1 &
held=$!
sessions() { scrape >"$T/m.txt" 2>/dev/null && value tiercache_target_sessions "target=\"$iqn-plain\""; }
tc_wait_for 20 "tiercache_target_sessions of the plain target at 1" eval '[ "$(sessions)" = 1 ]'
kill "$held" 2>/dev/null
wait "$held" 2>/dev/null
pass "an open session shows in tiercache_target_sessions"

code=$(python3 -c '
import sys, urllib.request, urllib.error
try:
    urllib.request.urlopen("http://127.0.0.1:%s/other" % sys.argv[1], timeout=10)
    print(200)
except urllib.error.HTTPError as e:
    print(e.code)' "$mport")
check "GET /other" "$code" 404

# OpenMetrics, through the strict parser of Debian's python3-prometheus-client
scrape "application/openmetrics-text; version=1.0.0" >"$T/om.txt" || fail "GET /metrics (OpenMetrics) failed"
/usr/bin/python3 - "$T/om.txt" >"$T/om.out" 2>&1 <<'PY' || fail "OpenMetrics: $(tail -3 "$T/om.out")"
import sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families
reads = None
n = 0
for fam in text_string_to_metric_families(open(sys.argv[1]).read()):
    for s in fam.samples:
        n += 1
        if s.name == "tiercache_lun_commands_total" and s.labels == {"lun": "write-back", "op": "read"}:
            reads = s.value
if reads != 3000:
    sys.exit("tiercache_lun_commands_total{lun=write-back,op=read} parsed as %r, expected 3000" % reads)
print(n)
PY
pass "OpenMetrics 1.0: $(cat "$T/om.out") samples parse, the read count among them"

# Debian's Prometheus server scrapes it
pport=$(tc_free_port)
cat >"$T/prometheus.yml" <<CONF
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: tiercache
    static_configs:
      - targets: ['127.0.0.1:$mport']
CONF
prometheus --config.file="$T/prometheus.yml" --storage.tsdb.path="$T/prom" \
	--web.listen-address="127.0.0.1:$pport" >"$T/prometheus.log" 2>&1 &
prom=$!
trap 'kill $prom 2>/dev/null; _tc_cleanup' EXIT
query() { promtool query instant "http://127.0.0.1:$pport" "$1" 2>/dev/null | sed -n 's/.*=> \([0-9.e+]*\) @.*/\1/p' | head -1; }
tc_wait_for 60 "Prometheus's up{job=\"tiercache\"} at 1" eval '[ "$(query "up{job=\"tiercache\"}")" = 1 ]'
reads=$(query 'tiercache_lun_commands_total{lun="write-back",op="read"}')
[ "$reads" = 3000 ] || fail "Prometheus has tiercache_lun_commands_total{lun=\"write-back\",op=\"read\"} = ${reads:-nothing}, expected 3000 ($(tail -3 "$T/prometheus.log"))"
hits=$(query 'sum(tiercache_lun_latency_seconds_count{lun="write-back",outcome="hit"})')
[ "$hits" = 5048 ] || fail "Prometheus's sum of hit histograms: ${hits:-nothing}, expected 5048"
pass "Prometheus scrapes it: up 1, the read count and the hit histograms' count as sent"

# contrib/: the alert rules, and the dashboard's queries against this Prometheus
rules=$TC_ROOT/contrib/prometheus
promtool check rules "$rules/tiercache-alerts.yml" >"$T/rules.out" 2>&1 || fail "promtool check rules: $(tail -3 "$T/rules.out")"
(cd "$rules" && promtool test rules tiercache-alerts.test.yml) >"$T/rules.out" 2>&1 ||
	fail "promtool test rules: $(head -12 "$T/rules.out")"
pass "contrib alert rules: promtool check rules and test rules pass"
"$TB" --json --no-progress -b 4k --rand -r 70 -t 1 -q 4 -T 60 --size 8M "$w" >/dev/null 2>&1 &
load=$!
trap 'kill $load $prom 2>/dev/null; _tc_cleanup' EXIT
# rate() over a minute needs two scrapes of the load
tc_wait_for 60 "Prometheus sees the load" eval '[ -n "$(query '"'"'sum(rate(tiercache_lun_commands_total{lun="write-back",op="read"}[1m])) > 0'"'"')" ]'
/usr/bin/python3 -c '
import json, sys
for p in json.load(open(sys.argv[1]))["panels"]:
    for t in p["targets"]:
        print(p["title"] + "\t" + t["expr"])' "$TC_ROOT/contrib/grafana/tiercache.json" >"$T/exprs"
[ -s "$T/exprs" ] || fail "no PromQL expression in contrib/grafana/tiercache.json"
nexpr=0
while IFS=$'\t' read -r title expr; do
	promtool query instant "http://127.0.0.1:$pport" "$expr" >"$T/q.out" 2>&1 || fail "dashboard panel \"$title\": $expr: $(head -2 "$T/q.out")"
	grep -qE '=> -?[0-9]' "$T/q.out" || fail "dashboard panel \"$title\": $expr returns no number: $(head -3 "$T/q.out")"
	nexpr=$((nexpr + 1))
done <"$T/exprs"
kill "$load" 2>/dev/null
wait "$load" 2>/dev/null
pass "contrib Grafana dashboard: all $nexpr PromQL expressions return data under load"
