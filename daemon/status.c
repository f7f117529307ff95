/*
 * status.c - tierctl status: the configuration as served, each LUN's
 * backing store and ownership, each cache set's legs and counters, and
 * the TCMU front end, as one JSON object on the control socket.
 *
 * main.c registers it once the portal serves; it runs on the control
 * thread under control_lock, which a reload (reload.c) takes to swap
 * d->cfg and the arrays parallel to it, so it always sees one
 * configuration whole. Everything else it reads is a snapshot through
 * atomics and short locks (cache_set_status, bdev_rbd_status,
 * scsi_lu_ownership).
 */
#include "daemon/daemon.h"

#include "backstore/scsi.h"
#include "bdev/rbd.h"
#include "cache/cache.h"
#include "cache/status.h"
#include "common/worker.h"
#include "config/config.h"
#include "daemon/control.h"
#include "daemon/ctl_cache.h"
#include "daemon/leg_health.h"
#include "target/tcmu/tcmu.h"

#include <json-c/json.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static uint64_t started_ms;

/* A LUN over a shared store (an RBD image's lock): who owns it, and what
 * this gateway's target port group reports (REPORT TARGET PORT GROUPS). */
static void owner_json(struct json_object *o, const struct scsi_lu_ownership *ow)
{
	static const char *const states[] = { "standby", "transition", "owned", "lost" };
	static const char *const alua[] = { "active/non-optimized", "transitioning", "active/optimized",
					    "unavailable" };
	struct json_object *w = json_object_new_object();
	json_object_object_add(w, "state", json_object_new_string(states[ow->state & 3]));
	json_object_object_add(w, "alua_state", json_object_new_string(alua[ow->state & 3]));
	json_object_object_add(w, "port_group", json_object_new_int64(ow->port_group));
	json_object_object_add(w, "gateways", json_object_new_int(ow->gateways));
	json_object_object_add(w, "owner_port_group", json_object_new_int64(ow->owner_port_group));
	json_object_object_add(w, "unowned_reads", json_object_new_int64((int64_t)ow->unowned_reads));
	if (ow->state == BDEV_OWNER_OWNED)
		json_object_object_add(w, "generation", json_object_new_int64((int64_t)ow->generation));
	json_object_object_add(o, "ownership", w);
}

/* tierctl status, on the control thread (under control_lock, which a reload
 * takes to swap d->cfg and its arrays): the configuration as served and a
 * status snapshot of each cache set (cache_set_status). */
static int ctl_status(struct json_object *req, struct json_object *resp, void *arg)
{
	struct daemon *d = arg;
	struct config *cfg = d->cfg;
	struct json_object *luns = json_object_new_array();
	struct json_object *targets = json_object_new_array();

	(void)req;
	json_object_object_add(resp, "version", json_object_new_string(TC_VERSION));
	json_object_object_add(resp, "uptime_s", json_object_new_int64((int64_t)((now_ms() - started_ms) / 1000)));
	json_object_object_add(resp, "worker_wait", json_object_new_string(worker_wait_kind()));
	for (int i = 0; i < cfg->nluns; i++) {
		struct cfg_lun *l = &cfg->luns[i];
		struct json_object *o = json_object_new_object();
		json_object_object_add(o, "name", json_object_new_string(l->name));
		json_object_object_add(o, "backing", json_object_new_string(l->backing));
		json_object_object_add(o, "serial", json_object_new_string(d->serials[i]));
		json_object_object_add(o, "block_size", json_object_new_int(l->block_size));
		json_object_object_add(o, "read_only", json_object_new_boolean(l->read_only));
		struct bdev_rbd_status rs;
		if (bdev_rbd_status(l->backing, &rs)) {
			struct json_object *r = json_object_new_object();
			json_object_object_add(r, "pool", json_object_new_string(rs.pool));
			json_object_object_add(r, "image", json_object_new_string(rs.image));
			json_object_object_add(r, "cluster", json_object_new_string(bdev_rbd_conn_name(rs.conn)));
			json_object_object_add(r, "size", json_object_new_int64((int64_t)rs.size));
			json_object_object_add(r, "pool_full", json_object_new_boolean(rs.pool_full));
			json_object_object_add(o, "rbd", r);
		}
		struct scsi_lu *lu = d->lus ? d->lus[i] : NULL;
		struct scsi_lu_ownership ow;
		if (lu && scsi_lu_ownership(lu, &ow))
			owner_json(o, &ow);
		if (lu) {
			struct scsi_lu_overdue od;
			scsi_lu_overdue(lu, &od);
			struct json_object *t = json_object_new_object();
			json_object_object_add(t, "io_timeout_s", json_object_new_int((int)(od.io_timeout_ms / 1000)));
			json_object_object_add(t, "overdue_now", json_object_new_int64((int64_t)od.now));
			json_object_object_add(t, "overdue_total", json_object_new_int64((int64_t)od.total));
			json_object_object_add(o, "timeouts", t);
		}
		if (lu) {
			/* what tierctl top shows: counts since start, latency buckets per kind */
			struct scsi_lu_stats ls;
			scsi_lu_stats(lu, &ls);
			struct json_object *io = json_object_new_object();
			for (int k = 0; k < SCSI_IO_KINDS; k++)
				json_object_object_add(io, scsi_io_kind_name(k), json_object_new_int64((int64_t)ls.cmds[k]));
			json_object_object_add(io, "read_bytes", json_object_new_int64((int64_t)ls.bytes[0]));
			json_object_object_add(io, "write_bytes", json_object_new_int64((int64_t)ls.bytes[1]));
			json_object_object_add(io, "in_flight", json_object_new_int64((int64_t)ls.inflight));
			uint64_t hits = 0; /* of the "read" count above */
			for (int b = 0; b < SCSI_LAT_BUCKETS; b++)
				hits += ls.lat[SCSI_IO_READ][SCSI_OUT_HIT][b];
			json_object_object_add(io, "read_hits", json_object_new_int64((int64_t)hits));
			struct json_object *bounds = json_object_new_array();
			for (int b = 0; b < SCSI_LAT_BUCKETS - 1; b++)
				json_object_array_add(bounds, json_object_new_int64((int64_t)(scsi_lat_bound_ns((unsigned)b) / 1000)));
			json_object_object_add(io, "latency_bounds_us", bounds);
			for (int k = 0; k < 2; k++) {
				struct json_object *h = json_object_new_array();
				for (int b = 0; b < SCSI_LAT_BUCKETS; b++) {
					uint64_t n = 0;
					for (int oc = 0; oc < SCSI_OUTCOMES; oc++)
						n += ls.lat[k][oc][b];
					json_object_array_add(h, json_object_new_int64((int64_t)n));
				}
				json_object_object_add(io, k ? "write_latency_buckets" : "read_latency_buckets", h);
			}
			json_object_object_add(o, "io", io);
			if (ls.resv_synced >= 0)
				json_object_object_add(o, "reservations_synced", json_object_new_boolean(ls.resv_synced));
		}
		struct scsi_lu_space sp;
		if (lu && scsi_lu_space(lu, &sp)) {
			struct json_object *s = json_object_new_object();
			json_object_object_add(s, "pool_bytes", json_object_new_int64((int64_t)sp.pool_bytes));
			json_object_object_add(s, "pool_free", json_object_new_int64((int64_t)sp.pool_free));
			json_object_object_add(s, "pool_used_pct", json_object_new_int(sp.pool_used_pct));
			if (sp.alloc_pct >= 0) {
				json_object_object_add(s, "allocated", json_object_new_int64((int64_t)sp.alloc));
				json_object_object_add(s, "allocated_pct", json_object_new_int(sp.alloc_pct));
			}
			if (sp.warn_pct) {
				json_object_object_add(s, "warn_pct", json_object_new_int((int)sp.warn_pct));
				json_object_object_add(s, "warning", json_object_new_boolean(sp.warning));
			}
			json_object_object_add(o, "space", s);
		}
		json_object_array_add(luns, o);
	}
	for (int i = 0; i < cfg->ntargets; i++) {
		struct cfg_target *t = &cfg->targets[i];
		struct json_object *o = json_object_new_object();
		struct json_object *map = json_object_new_array();
		json_object_object_add(o, "iqn", json_object_new_string(t->iqn));
		for (int j = 0; j < t->nluns; j++) {
			char s[96];
			snprintf(s, sizeof(s), "lun%llu = %s", (unsigned long long)t->luns[j].lun, t->luns[j].lun_name);
			json_object_array_add(map, json_object_new_string(s));
		}
		json_object_object_add(o, "luns", map);
		json_object_object_add(o, "auth", json_object_new_string(t->mutual_user ? "mutual CHAP"
									: t->chap_user ? "CHAP" : "none"));
		json_object_object_add(o, "acl", json_object_new_string(t->nallow ? "allow list" : "any initiator"));
		json_object_array_add(targets, o);
	}
	json_object_object_add(resp, "targets", targets);
	json_object_object_add(resp, "luns", luns);
	struct json_object *caches = json_object_new_array();
	for (int i = 0; d->sets && i < cfg->ncaches; i++) {
		struct cache_set_status st;
		if (!d->sets[i])
			continue;
		cache_set_status(d->sets[i], &st);
		struct json_object *o = json_object_new_object();
		struct json_object *legs = json_object_new_array();
		json_object_object_add(o, "name", json_object_new_string(st.name));
		json_object_object_add(o, "state", json_object_new_string(st.degraded ? "degraded" : "healthy"));
		for (int k = 0; k < st.nlegs; k++) {
			struct json_object *lg = json_object_new_object();
			json_object_object_add(lg, "path", json_object_new_string(st.legs[k].path));
			json_object_object_add(lg, "health", json_object_new_string(
				st.legs[k].health == LEG_HEALTHY ? "healthy" :
				st.legs[k].health == LEG_FAILED ? "failed" : "resyncing"));
			json_object_object_add(lg, "errors", json_object_new_int64((int64_t)st.legs[k].errors));
			struct json_object *io = json_object_new_object();
			json_object_object_add(io, "reads", json_object_new_int64((int64_t)st.legs[k].reads));
			json_object_object_add(io, "writes", json_object_new_int64((int64_t)st.legs[k].writes));
			json_object_object_add(io, "fua_writes", json_object_new_int64((int64_t)st.legs[k].fua_writes));
			json_object_object_add(io, "flushes", json_object_new_int64((int64_t)st.legs[k].flushes));
			json_object_object_add(lg, "io", io);
			leg_health_json(lg, st.legs[k].path);
			if (st.legs[k].health == LEG_RESYNCING) {
				json_object_object_add(lg, "resync_done", json_object_new_int64((int64_t)st.legs[k].resync_done));
				json_object_object_add(lg, "resync_total", json_object_new_int64((int64_t)st.legs[k].resync_total));
				json_object_object_add(lg, "resync_rate_bps",
						       json_object_new_int64((int64_t)st.legs[k].resync_rate_bps));
				json_object_object_add(lg, "resync_eta_seconds", json_object_new_int64(st.legs[k].resync_eta_s));
			}
			json_object_array_add(legs, lg);
		}
		json_object_object_add(o, "legs", legs);
		struct json_object *cl = json_object_new_array();
		for (int k = 0; k < st.nluns; k++) {
			struct json_object *lo = json_object_new_object();
			json_object_object_add(lo, "name", json_object_new_string(st.luns[k]));
			json_object_object_add(lo, "mode", json_object_new_string(cache_mode_name(st.lun_mode[k])));
			json_object_object_add(lo, "dirty_bytes", json_object_new_int64((int64_t)st.lun_dirty_bytes[k]));
			int de = st.lun_destage_err[k];
			json_object_object_add(lo, "destage", json_object_new_string(de ? strerror(-de) : "ok"));
			if (de) {
				json_object_object_add(lo, "destage_failures",
						       json_object_new_int64((int64_t)st.lun_destage_failures[k]));
				json_object_object_add(lo, "destage_retry_in_ms",
						       json_object_new_int64((int64_t)st.lun_destage_retry_ms[k]));
				json_object_object_add(lo, "dirty_bytes_waiting",
						       json_object_new_int64((int64_t)st.lun_dirty_waiting[k]));
			}
			json_object_array_add(cl, lo);
		}
		json_object_object_add(o, "luns", cl);
		json_object_object_add(o, "extent_size", json_object_new_int64(st.extent_size));
		ctl_cache_counters_json(o, &st);
		struct json_object *lost = json_object_new_array();
		for (int k = 0; k < st.nlost; k++) {
			struct json_object *lr = json_object_new_object();
			json_object_object_add(lr, "lun", json_object_new_string(st.lost[k].lun));
			json_object_object_add(lr, "offset", json_object_new_int64((int64_t)st.lost[k].offset));
			json_object_object_add(lr, "length", json_object_new_int64((int64_t)st.lost[k].length));
			json_object_array_add(lost, lr);
		}
		json_object_object_add(o, "lost_ranges", lost);
		json_object_object_add(o, "lost_ranges_dropped", json_object_new_int64((int64_t)st.lost_dropped));
		json_object_object_add(o, "mem_bytes", json_object_new_int64((int64_t)st.mem_bytes));
		json_object_array_add(caches, o);
	}
	json_object_object_add(resp, "caches", caches);
	if (cfg->tcmu_enable) {
		struct json_object *tcmu = json_object_new_object();
		tcmu_status_json(tcmu);
		json_object_object_add(resp, "tcmu", tcmu);
	}
	return 0;
}

int daemon_status_register(struct daemon *d)
{
	started_ms = now_ms();
	return control_register("status", ctl_status, d);
}
