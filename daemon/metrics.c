/*
 * metrics.c - Prometheus metrics over HTTP: [daemon] metrics = ADDRESS:PORT.
 *
 * GET /metrics answers in the Prometheus text format 0.0.4, or in
 * OpenMetrics 1.0 when the Accept header asks for
 * application/openmetrics-text. HTTP is libmicrohttpd's (its own thread per
 * address, a few connections at a time, a short timeout); nothing here
 * parses a request beyond the path and that header.
 *
 * What a scrape reads, and what it costs the command path: nothing. The
 * LUs' counts are per-worker slots summed here (backstore/lu_stats.c), the
 * cache sets' come from cache_set_status (relaxed atomics), the targets'
 * from their nexus lists (the target's lock, which logins take, never a
 * command). The configuration and its arrays are read under control_lock,
 * the lock a reload swaps them under.
 *
 * Names: tiercache_lun_* per LUN (label lun), tiercache_cache_* per cache
 * set (label cache; legs: leg = its path), tiercache_target_* per target
 * (label target), tiercache_iscsi_* for the portal. docs/metrics.md lists
 * them.
 *
 * Threading: metrics_start/metrics_stop on the main thread; the handler on
 * libmicrohttpd's threads.
 */
#include "daemon/metrics.h"

#include "backstore/scsi.h"
#include "cache/status.h"
#include "common/log.h"
#include "config/config.h"
#include "daemon/control.h"
#include "daemon/daemon.h"
#include "daemon/leg_health.h"
#include "target/iscsi/portal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <json-c/json.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CT_PROM "text/plain; version=0.0.4; charset=utf-8"
#define CT_OM "application/openmetrics-text; version=1.0.0; charset=utf-8"

static struct MHD_Daemon *servers[CFG_MAX_LISTEN];
static int nservers;
static struct daemon *dmn;
static time_t started;

/* ---- the text ---------------------------------------------------------------------------- */

struct out {
	char *p;
	size_t len, cap;
	bool om;  /* OpenMetrics */
	bool oom;
};

static void put(struct out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct out *o, const char *fmt, ...)
{
	if (o->oom)
		return;
	for (;;) {
		va_list ap;
		va_start(ap, fmt);
		int n = vsnprintf(o->p + o->len, o->cap - o->len, fmt, ap);
		va_end(ap);
		if (n < 0) {
			o->oom = true;
			return;
		}
		if ((size_t)n < o->cap - o->len) {
			o->len += (size_t)n;
			return;
		}
		size_t cap = (o->cap + (size_t)n + 1) * 2;
		char *p = realloc(o->p, cap);
		if (!p) {
			o->oom = true;
			return;
		}
		o->p = p;
		o->cap = cap;
	}
}

/* A label value: backslash, double quote and newline escaped (both formats). */
static const char *esc(const char *s, char *buf, size_t cap)
{
	size_t k = 0;
	for (; *s && k + 2 < cap; s++) {
		if (*s == '\\' || *s == '"') {
			buf[k++] = '\\';
			buf[k++] = *s;
		} else if (*s == '\n') {
			buf[k++] = '\\';
			buf[k++] = 'n';
		} else {
			buf[k++] = *s;
		}
	}
	buf[k] = '\0';
	return buf;
}

/*
 * A family's HELP and TYPE. Counters are named without _total in
 * OpenMetrics' metadata and with it in the 0.0.4 format; their samples end
 * in _total in both (counter()).
 */
static void family(struct out *o, const char *name, const char *type, const char *help)
{
	bool total = !o->om && !strcmp(type, "counter");
	put(o, "# HELP %s%s %s\n# TYPE %s%s %s\n", name, total ? "_total" : "", help, name, total ? "_total" : "",
	    type);
}

static void counter(struct out *o, const char *name, const char *labels, uint64_t v)
{
	put(o, "%s_total{%s} %llu\n", name, labels, (unsigned long long)v);
}

static void gauge(struct out *o, const char *name, const char *labels, double v)
{
	put(o, "%s{%s} %.17g\n", name, labels, v);
}

/* ---- per LUN ----------------------------------------------------------------------------- */

static const char *const sense_key_names[16] = {
	"no_sense", "recovered_error", "not_ready", "medium_error", "hardware_error", "illegal_request",
	"unit_attention", "data_protect", "blank_check", "vendor_specific", "copy_aborted", "aborted_command",
	"reserved_0c", "volume_overflow", "miscompare", "completed",
};

/* The (op, outcome) series a LUN always has, so rate() works from the first scrape. */
static bool series_standard(bool cached, int k, int oc)
{
	if (k == SCSI_IO_OTHER)
		return oc == SCSI_OUT_NONE;
	if (!cached)
		return oc == SCSI_OUT_BACKING;
	if (k == SCSI_IO_READ)
		return oc == SCSI_OUT_HIT || oc == SCSI_OUT_PARTIAL || oc == SCSI_OUT_MISS;
	return oc == SCSI_OUT_HIT || oc == SCSI_OUT_BYPASS;
}

static void lun_metrics(struct out *o, const struct config *cfg)
{
	int n = cfg->nluns;
	struct scsi_lu_stats *st = calloc(n ? (size_t)n : 1, sizeof(*st));
	char (*lab)[160] = calloc(n ? (size_t)n : 1, sizeof(*lab));
	if (!st || !lab) {
		o->oom = true;
		free(st);
		free(lab);
		return;
	}
	for (int i = 0; i < n; i++) {
		char e[128];
		snprintf(lab[i], sizeof(lab[i]), "lun=\"%s\"", esc(cfg->luns[i].name, e, sizeof(e)));
		if (dmn->lus && dmn->lus[i])
			scsi_lu_stats(dmn->lus[i], &st[i]);
	}
	char l[256];
#define EACH_LU for (int i = 0; i < n; i++) if (dmn->lus && dmn->lus[i])
	family(o, "tiercache_lun_commands", "counter", "SCSI commands completed, by kind (read, write, other).");
	EACH_LU for (int k = 0; k < SCSI_IO_KINDS; k++) {
		snprintf(l, sizeof(l), "%s,op=\"%s\"", lab[i], scsi_io_kind_name(k));
		counter(o, "tiercache_lun_commands", l, st[i].cmds[k]);
	}
	family(o, "tiercache_lun_bytes", "counter", "Bytes read and written by completed commands.");
	EACH_LU for (int k = 0; k < 2; k++) {
		snprintf(l, sizeof(l), "%s,op=\"%s\"", lab[i], k ? "write" : "read");
		counter(o, "tiercache_lun_bytes", l, st[i].bytes[k]);
	}
	family(o, "tiercache_lun_commands_in_flight", "gauge", "Commands submitted and not yet completed.");
	EACH_LU gauge(o, "tiercache_lun_commands_in_flight", lab[i], (double)st[i].inflight);
	family(o, "tiercache_lun_check_conditions", "counter", "Commands answered CHECK CONDITION, by sense key.");
	EACH_LU for (int k = 0; k < 16; k++) {
		/* the errors hosts act on always; the rest once seen */
		bool always = k == 2 || k == 3 || k == 4 || k == 5 || k == 6 || k == 7 || k == 11;
		if (!always && !st[i].sense_keys[k])
			continue;
		snprintf(l, sizeof(l), "%s,sense_key=\"%s\"", lab[i], sense_key_names[k]);
		counter(o, "tiercache_lun_check_conditions", l, st[i].sense_keys[k]);
	}
	family(o, "tiercache_lun_statuses", "counter", "Commands answered with a status other than GOOD or CHECK CONDITION.");
	EACH_LU {
		const struct { const char *name; uint64_t v; } sv[] = {
			{ "busy", st[i].busy }, { "reservation_conflict", st[i].resv_conflicts },
			{ "task_set_full", st[i].task_set_full }, { "task_aborted", st[i].aborted },
		};
		for (size_t k = 0; k < sizeof(sv) / sizeof(sv[0]); k++) {
			snprintf(l, sizeof(l), "%s,status=\"%s\"", lab[i], sv[k].name);
			counter(o, "tiercache_lun_statuses", l, sv[k].v);
		}
	}
	family(o, "tiercache_lun_latency_seconds", "histogram",
	       "Command latency from submission to completion, by kind and by how the cache served it "
	       "(hit, partial, miss, bypass; backing without a cache; none for other commands).");
	EACH_LU {
		bool cached = dmn->vols && dmn->vols[i];
		for (int k = 0; k < SCSI_IO_KINDS; k++)
			for (int oc = 0; oc < SCSI_OUTCOMES; oc++) {
				uint64_t count = 0;
				for (int b = 0; b < SCSI_LAT_BUCKETS; b++)
					count += st[i].lat[k][oc][b];
				if (!count && !series_standard(cached, k, oc))
					continue;
				uint64_t cum = 0;
				for (int b = 0; b < SCSI_LAT_BUCKETS; b++) {
					cum += st[i].lat[k][oc][b];
					char le[32];
					if (b == SCSI_LAT_BUCKETS - 1)
						snprintf(le, sizeof(le), "+Inf");
					else
						snprintf(le, sizeof(le), "%g", (double)scsi_lat_bound_ns((unsigned)b) / 1e9);
					put(o, "tiercache_lun_latency_seconds_bucket{%s,op=\"%s\",outcome=\"%s\",le=\"%s\"} %llu\n",
					    lab[i], scsi_io_kind_name(k), scsi_outcome_name(oc), le, (unsigned long long)cum);
				}
				snprintf(l, sizeof(l), "%s,op=\"%s\",outcome=\"%s\"", lab[i], scsi_io_kind_name(k),
					 scsi_outcome_name(oc));
				put(o, "tiercache_lun_latency_seconds_count{%s} %llu\n", l, (unsigned long long)count);
				put(o, "tiercache_lun_latency_seconds_sum{%s} %.9f\n", l, (double)st[i].lat_sum_ns[k][oc] / 1e9);
			}
	}
	family(o, "tiercache_lun_overdue_commands", "counter", "Commands the backing store kept past io_timeout.");
	EACH_LU {
		struct scsi_lu_overdue od;
		scsi_lu_overdue(dmn->lus[i], &od);
		counter(o, "tiercache_lun_overdue_commands", lab[i], od.total);
	}
	family(o, "tiercache_lun_space_bytes", "gauge",
	       "Backing store space: the pool's size and what is free in it, and the LUN's own allocation.");
	EACH_LU {
		struct scsi_lu_space sp;
		if (!scsi_lu_space(dmn->lus[i], &sp))
			continue;
		snprintf(l, sizeof(l), "%s,kind=\"pool\"", lab[i]);
		gauge(o, "tiercache_lun_space_bytes", l, (double)sp.pool_bytes);
		snprintf(l, sizeof(l), "%s,kind=\"free\"", lab[i]);
		gauge(o, "tiercache_lun_space_bytes", l, (double)sp.pool_free);
		if (sp.alloc_pct >= 0) {
			snprintf(l, sizeof(l), "%s,kind=\"allocated\"", lab[i]);
			gauge(o, "tiercache_lun_space_bytes", l, (double)sp.alloc);
		}
	}
	family(o, "tiercache_lun_space_warning", "gauge", "1 while the LUN is past its space_warn threshold.");
	EACH_LU {
		struct scsi_lu_space sp;
		if (scsi_lu_space(dmn->lus[i], &sp) && sp.warn_pct)
			gauge(o, "tiercache_lun_space_warning", lab[i], sp.warning ? 1 : 0);
	}
#undef EACH_LU
	free(st);
	free(lab);
}

/* ---- per cache set ----------------------------------------------------------------------- */

/* The numeric SMART fields leg_health_json puts under "device" (NVMe legs). */
static void leg_smart(struct out *o, const char *labels, const char *path)
{
	struct json_object *leg = json_object_new_object();
	if (!leg)
		return;
	leg_health_json(leg, path);
	struct json_object *dev;
	if (json_object_object_get_ex(leg, "device", &dev) && json_object_is_type(dev, json_type_object)) {
		json_object_object_foreach(dev, key, val) {
			if (!json_object_is_type(val, json_type_int) && !json_object_is_type(val, json_type_double))
				continue;
			char l[1200], e[96];
			snprintf(l, sizeof(l), "%s,field=\"%s\"", labels, esc(key, e, sizeof(e)));
			gauge(o, "tiercache_cache_leg_smart", l, json_object_get_double(val));
		}
	}
	json_object_put(leg);
}

static void cache_metrics(struct out *o, const struct config *cfg)
{
	int n = dmn->sets ? cfg->ncaches : 0;
	struct cache_set_status *st = calloc(n ? (size_t)n : 1, sizeof(*st));
	if (!st) {
		o->oom = true;
		return;
	}
	for (int i = 0; i < n; i++)
		if (dmn->sets[i])
			cache_set_status(dmn->sets[i], &st[i]);
	char lab[400], l[1024], e[300];
#define EACH_SET for (int i = 0; i < n; i++) if (dmn->sets[i] && (snprintf(lab, sizeof(lab), "cache=\"%s\"", esc(st[i].name, e, sizeof(e))), 1))
	family(o, "tiercache_cache_reads", "counter", "Read pieces (one per extent a read touches): served whole by the cache (hit), in part (partial), or not (miss).");
	EACH_SET {
		const char *res[] = { "hit", "partial", "miss" };
		uint64_t v[] = { st[i].read_hits, st[i].read_partial, st[i].read_misses };
		for (int k = 0; k < 3; k++) {
			snprintf(l, sizeof(l), "%s,result=\"%s\"", lab, res[k]);
			counter(o, "tiercache_cache_reads", l, v[k]);
		}
	}
	family(o, "tiercache_cache_writes", "counter", "Write pieces: into a cached extent (hit) or not (miss).");
	EACH_SET {
		snprintf(l, sizeof(l), "%s,result=\"hit\"", lab);
		counter(o, "tiercache_cache_writes", l, st[i].write_hits);
		snprintf(l, sizeof(l), "%s,result=\"miss\"", lab);
		counter(o, "tiercache_cache_writes", l, st[i].write_misses);
	}
	family(o, "tiercache_cache_hit_ratio", "gauge", "Read hits over reads since start.");
	EACH_SET gauge(o, "tiercache_cache_hit_ratio", lab, st[i].hit_ratio);
	family(o, "tiercache_cache_dirty_bytes", "gauge", "Data in the cache not yet written to the backing store.");
	EACH_SET gauge(o, "tiercache_cache_dirty_bytes", lab, (double)st[i].dirty_bytes);
	family(o, "tiercache_cache_dirty_target_bytes", "gauge",
	       "Dirty data the cleaner lets stay while the LUNs are busy ([cache] dirty_target of the cache's room).");
	EACH_SET gauge(o, "tiercache_cache_dirty_target_bytes", lab,
		       (double)cfg->caches[i].dirty_target / 100.0 * st[i].nslots * st[i].extent_size);
	family(o, "tiercache_cache_extents", "gauge", "Extents the cache holds (used) and can hold (total).");
	EACH_SET {
		snprintf(l, sizeof(l), "%s,state=\"used\"", lab);
		gauge(o, "tiercache_cache_extents", l, st[i].slots_used);
		snprintf(l, sizeof(l), "%s,state=\"total\"", lab);
		gauge(o, "tiercache_cache_extents", l, st[i].nslots);
	}
	family(o, "tiercache_cache_extent_bytes", "gauge", "The size of one extent.");
	EACH_SET gauge(o, "tiercache_cache_extent_bytes", lab, st[i].extent_size);
	family(o, "tiercache_cache_destaged_bytes", "counter", "Dirty data written to the backing store.");
	EACH_SET counter(o, "tiercache_cache_destaged_bytes", lab, st[i].destaged_bytes);
	family(o, "tiercache_cache_destage_target_bytes_per_second", "gauge", "The cleaner's current destage rate target.");
	EACH_SET gauge(o, "tiercache_cache_destage_target_bytes_per_second", lab, (double)st[i].cleaner_rate_bps);
	family(o, "tiercache_cache_destage_pause_seconds", "gauge",
	       "The cleaner's pause after each destage while hosts read, yielding to them (0: none).");
	EACH_SET gauge(o, "tiercache_cache_destage_pause_seconds", lab, (double)st[i].destage_pause_us / 1e6);
	family(o, "tiercache_cache_destage_max_bytes_per_second", "gauge", "The admin's destage cap, destage_max (0: none).");
	EACH_SET gauge(o, "tiercache_cache_destage_max_bytes_per_second", lab, (double)st[i].destage_max_bps);
	family(o, "tiercache_cache_destage_max_writes_per_second", "gauge", "The admin's destage cap, destage_max_iops (0: none).");
	EACH_SET gauge(o, "tiercache_cache_destage_max_writes_per_second", lab, st[i].destage_max_iops);
	family(o, "tiercache_cache_fills", "counter", "Extents brought into the cache (promotions).");
	EACH_SET counter(o, "tiercache_cache_fills", lab, st[i].promotions);
	family(o, "tiercache_cache_seq_bypassed", "counter",
	       "Misses not promoted: part of a sequential stream longer than seq_cutoff.");
	EACH_SET counter(o, "tiercache_cache_seq_bypassed", lab, st[i].seq_bypassed);
	family(o, "tiercache_cache_below_threshold", "counter",
	       "Misses not promoted yet: fewer misses on the extent than admit_hits.");
	EACH_SET counter(o, "tiercache_cache_below_threshold", lab, st[i].below_threshold);
	family(o, "tiercache_cache_topups", "counter", "Fills of the missing blocks of cached extents.");
	EACH_SET counter(o, "tiercache_cache_topups", lab, st[i].topups);
	family(o, "tiercache_cache_evictions", "counter", "Extents dropped to make room.");
	EACH_SET counter(o, "tiercache_cache_evictions", lab, st[i].evictions);
	family(o, "tiercache_cache_checkpoints", "counter",
	       "Checkpoints written: the slot table on the legs, so the journal can be reused.");
	EACH_SET counter(o, "tiercache_cache_checkpoints", lab, st[i].checkpoints);
	family(o, "tiercache_cache_journal_full_waits", "counter",
	       "Times a journal ring filled and its writes waited for a checkpoint.");
	EACH_SET counter(o, "tiercache_cache_journal_full_waits", lab, st[i].journal_full_waits);
	family(o, "tiercache_cache_degraded", "gauge", "1 while a leg is failed or resyncing.");
	EACH_SET gauge(o, "tiercache_cache_degraded", lab, st[i].degraded ? 1 : 0);
	family(o, "tiercache_cache_lost_ranges", "gauge", "Ranges of dirty data lost with both legs (tierctl status lists them).");
	EACH_SET gauge(o, "tiercache_cache_lost_ranges", lab, st[i].nlost + (double)st[i].lost_dropped);
	family(o, "tiercache_cache_lost_ios", "counter", "I/Os failed because both legs were gone and the data was dirty.");
	EACH_SET counter(o, "tiercache_cache_lost_ios", lab, st[i].lost_ios);
	family(o, "tiercache_cache_memory_bytes", "gauge", "The set's metadata in RAM.");
	EACH_SET gauge(o, "tiercache_cache_memory_bytes", lab, (double)st[i].mem_bytes);
	family(o, "tiercache_cache_leg_state", "gauge", "1 for the leg's state (healthy, failed, resyncing), 0 for the others.");
	EACH_SET for (int k = 0; k < st[i].nlegs; k++) {
		const char *sn[] = { "healthy", "failed", "resyncing" };
		char pe[300];
		for (int s = 0; s < 3; s++) {
			snprintf(l, sizeof(l), "%s,leg=\"%s\",state=\"%s\"", lab, esc(st[i].legs[k].path, pe, sizeof(pe)), sn[s]);
			gauge(o, "tiercache_cache_leg_state", l, (int)st[i].legs[k].health == s ? 1 : 0);
		}
	}
	family(o, "tiercache_cache_leg_errors", "counter", "I/O errors of the leg.");
	EACH_SET for (int k = 0; k < st[i].nlegs; k++) {
		char pe[300];
		snprintf(l, sizeof(l), "%s,leg=\"%s\"", lab, esc(st[i].legs[k].path, pe, sizeof(pe)));
		counter(o, "tiercache_cache_leg_errors", l, st[i].legs[k].errors);
	}
	family(o, "tiercache_cache_leg_requests", "counter", "Requests sent to the leg: reads, writes, of those FUA writes, and flushes.");
	EACH_SET for (int k = 0; k < st[i].nlegs; k++) {
		char pe[300];
		const struct cache_leg_status *lg = &st[i].legs[k];
		const char *op[] = { "read", "write", "fua_write", "flush" };
		uint64_t v[] = { lg->reads, lg->writes, lg->fua_writes, lg->flushes };
		for (int q = 0; q < 4; q++) {
			snprintf(l, sizeof(l), "%s,leg=\"%s\",op=\"%s\"", lab, esc(lg->path, pe, sizeof(pe)), op[q]);
			counter(o, "tiercache_cache_leg_requests", l, v[q]);
		}
	}
	family(o, "tiercache_cache_leg_smart", "gauge", "The leg's SMART / health log fields (NVMe legs), as tierctl status shows them.");
	EACH_SET for (int k = 0; k < st[i].nlegs; k++) {
		char pe[300];
		snprintf(l, sizeof(l), "%s,leg=\"%s\"", lab, esc(st[i].legs[k].path, pe, sizeof(pe)));
		leg_smart(o, l, st[i].legs[k].path);
	}
	family(o, "tiercache_cache_lun_destage_failing", "gauge", "1 while destaging to the LUN's backing store fails (out of space, errors).");
	EACH_SET for (int k = 0; k < st[i].nluns; k++) {
		char le[128];
		snprintf(l, sizeof(l), "%s,lun=\"%s\"", lab, esc(st[i].luns[k], le, sizeof(le)));
		gauge(o, "tiercache_cache_lun_destage_failing", l, st[i].lun_destage_err[k] ? 1 : 0);
	}
	family(o, "tiercache_cache_lun_dirty_bytes", "gauge", "Dirty data of the LUN in the cache set, not yet on its backing store.");
	EACH_SET for (int k = 0; k < st[i].nluns; k++) {
		char le[128];
		snprintf(l, sizeof(l), "%s,lun=\"%s\"", lab, esc(st[i].luns[k], le, sizeof(le)));
		gauge(o, "tiercache_cache_lun_dirty_bytes", l, (double)st[i].lun_dirty_bytes[k]);
	}
#undef EACH_SET
	free(st);
}

/* ---- targets and the portal -------------------------------------------------------------- */

static void target_metrics(struct out *o, const struct config *cfg)
{
	char l[320], e[300];
	int n = dmn->targets ? cfg->ntargets : 0;
	unsigned *sess = calloc(n ? (size_t)n : 1, sizeof(*sess));
	uint64_t *refused_t = calloc(n ? (size_t)n : 1, sizeof(*refused_t));
	if (!sess || !refused_t) {
		o->oom = true;
		free(sess);
		free(refused_t);
		return;
	}
	for (int i = 0; i < n; i++) /* one look (and one take of the target's lock) each */
		if (dmn->targets[i])
			scsi_target_counts(dmn->targets[i], &sess[i], &refused_t[i]);
	family(o, "tiercache_target_sessions", "gauge", "Open sessions (I_T nexuses) of the target.");
	for (int i = 0; i < n; i++) {
		if (!dmn->targets[i])
			continue;
		snprintf(l, sizeof(l), "target=\"%s\"", esc(cfg->targets[i].iqn, e, sizeof(e)));
		gauge(o, "tiercache_target_sessions", l, sess[i]);
	}
	family(o, "tiercache_target_logins_refused", "counter", "Logins to the target refused (ACL, CHAP, parameters).");
	for (int i = 0; i < n; i++) {
		if (!dmn->targets[i])
			continue;
		snprintf(l, sizeof(l), "target=\"%s\"", esc(cfg->targets[i].iqn, e, sizeof(e)));
		counter(o, "tiercache_target_logins_refused", l, refused_t[i]);
	}
	free(sess);
	free(refused_t);
	uint64_t ok, refused, failed;
	iscsi_login_counts(&ok, &refused, &failed);
	family(o, "tiercache_iscsi_logins", "counter",
	       "Logins to the portal: accepted, refused (the initiator's fault, any target or none) and failed (the target's).");
	counter(o, "tiercache_iscsi_logins", "result=\"accepted\"", ok);
	counter(o, "tiercache_iscsi_logins", "result=\"refused\"", refused);
	counter(o, "tiercache_iscsi_logins", "result=\"failed\"", failed);
}

static void render(struct out *o)
{
	family(o, "tiercache_build_info", "gauge", "The daemon's version (always 1).");
	put(o, "tiercache_build_info{version=\"%s\"} 1\n", TC_VERSION);
	family(o, "tiercache_start_time_seconds", "gauge", "When the daemon started (Unix time).");
	put(o, "tiercache_start_time_seconds %lld\n", (long long)started);
	control_lock();
	const struct config *cfg = dmn->cfg;
	lun_metrics(o, cfg);
	cache_metrics(o, cfg);
	target_metrics(o, cfg);
	control_unlock();
	if (o->om)
		put(o, "# EOF\n");
}

/* ---- HTTP -------------------------------------------------------------------------------- */

static enum MHD_Result reply(struct MHD_Connection *conn, unsigned code, const char *type, char *body, size_t len,
			     enum MHD_ResponseMemoryMode mode)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(len, body, mode);
	if (!r)
		return MHD_NO;
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
	enum MHD_Result ret = MHD_queue_response(conn, code, r);
	MHD_destroy_response(r);
	return ret;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
				  const char *version, const char *upload_data, size_t *upload_size, void **con_cls)
{
	(void)cls;
	(void)version;
	(void)upload_data;
	(void)upload_size;
	(void)con_cls;
	if (strcmp(method, MHD_HTTP_METHOD_GET) && strcmp(method, MHD_HTTP_METHOD_HEAD)) {
		static char msg[] = "only GET\n";
		return reply(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "text/plain", msg, sizeof(msg) - 1,
			     MHD_RESPMEM_PERSISTENT);
	}
	if (strcmp(url, "/metrics")) {
		static char msg[] = "tiercached: metrics are at /metrics\n";
		return reply(conn, MHD_HTTP_NOT_FOUND, "text/plain", msg, sizeof(msg) - 1, MHD_RESPMEM_PERSISTENT);
	}
	const char *accept = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_ACCEPT);
	struct out o = { .om = accept && strstr(accept, "application/openmetrics-text") };
	render(&o);
	if (o.oom) {
		free(o.p);
		static char msg[] = "out of memory\n";
		return reply(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "text/plain", msg, sizeof(msg) - 1,
			     MHD_RESPMEM_PERSISTENT);
	}
	return reply(conn, MHD_HTTP_OK, o.om ? CT_OM : CT_PROM, o.p, o.len, MHD_RESPMEM_MUST_FREE);
}

int metrics_start(struct daemon *d)
{
	const struct config *cfg = d->cfg;
	dmn = d;
	started = time(NULL);
	for (int i = 0; i < cfg->nmetrics; i++) {
		const struct cfg_listen *m = &cfg->metrics[i];
		struct sockaddr_in6 a6 = { .sin6_family = AF_INET6, .sin6_port = htons(m->port) };
		struct sockaddr_in a4 = { .sin_family = AF_INET, .sin_port = htons(m->port) };
		const struct sockaddr *sa;
		unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
		if (inet_pton(AF_INET, m->addr, &a4.sin_addr) == 1) {
			sa = (const struct sockaddr *)&a4;
		} else if (inet_pton(AF_INET6, m->addr, &a6.sin6_addr) == 1) {
			sa = (const struct sockaddr *)&a6;
			flags |= MHD_USE_IPv6;
		} else {
			log_err("[daemon] metrics = %s:%u: give a numeric IPv4 or IPv6 address", m->addr, m->port);
			metrics_stop();
			return -1;
		}
		servers[nservers] = MHD_start_daemon(flags, m->port, NULL, NULL, on_request, NULL,
						     MHD_OPTION_SOCK_ADDR, sa,
						     MHD_OPTION_CONNECTION_LIMIT, (unsigned)16,
						     MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10,
						     MHD_OPTION_END);
		if (!servers[nservers]) {
			log_err("metrics: cannot listen on %s:%u (%s)", m->addr, m->port, strerror(errno));
			metrics_stop();
			return -1;
		}
		nservers++;
		log_info("metrics at http://%s%s%s:%u/metrics", strchr(m->addr, ':') ? "[" : "", m->addr,
			 strchr(m->addr, ':') ? "]" : "", m->port);
	}
	return 0;
}

void metrics_stop(void)
{
	for (int i = 0; i < nservers; i++)
		MHD_stop_daemon(servers[i]);
	nservers = 0;
}
