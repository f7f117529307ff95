/*
 * main.c - tiercached: read the config, open the LUNs, serve, drain, exit.
 *
 * The main thread owns startup and shutdown only: it validates the config,
 * opens every backing store and logical unit, starts one worker per core
 * and the iSCSI portal, then waits for a signal. SIGTERM/SIGINT drain the
 * portal (in-flight commands complete and their status goes out) before the
 * workers stop and the stores are closed (and flushed).
 */
#include "backstore/scsi.h"
#include "cache/bdev.h"
#include "cache/cache.h"
#include "cache/status.h"
#include "common/log.h"
#include "common/worker.h"
#include "config/config.h"
#include "daemon/control.h"
#include "daemon/ctl_cache.h"
#include "daemon/leg_health.h"
#include "daemon/watchdog.h"
#include "target/iscsi/portal.h"
#include "target/tcmu/tcmu.h"

#include <errno.h>
#include <getopt.h>
#include <json-c/json.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#define TC_VERSION "0.1.0"

struct daemon {
	struct config *cfg;
	struct scsi_lu **lus;       /* parallel to cfg->luns */
	struct scsi_target **targets; /* parallel to cfg->targets */
	char (*serials)[33];
	struct iscsi_target_cfg *portal_targets;
	struct iscsi_listen_cfg *portal_listen;
	struct cache_set **sets;    /* parallel to cfg->caches (a reload keeps them) */
	struct bdev **vols;         /* parallel to cfg->luns: cache volume or NULL */
	struct iscsi_portal_cfg *pc;
	/*
	 * What a reload replaced but must outlive the portal: configurations
	 * and arrays that logins and sessions in progress still point into,
	 * retired targets, and LUs it could not close (a cache volume, or
	 * commands that did not drain). Freed at exit, after the drain.
	 */
	void **old_mem;
	int nold_mem;
	struct config **old_cfgs;
	int nold_cfgs;
	struct scsi_target **old_targets;
	int nold_targets;
	struct scsi_lu **parked_lus;
	int nparked_lus;
	const char *path;
	bool debug;
};

static int mkdir_p(const char *path);
static uint64_t started_ms;

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
	for (int i = 0; i < cfg->nluns; i++) {
		struct cfg_lun *l = &cfg->luns[i];
		struct json_object *o = json_object_new_object();
		json_object_object_add(o, "name", json_object_new_string(l->name));
		json_object_object_add(o, "backing", json_object_new_string(l->backing));
		json_object_object_add(o, "serial", json_object_new_string(d->serials[i]));
		json_object_object_add(o, "block_size", json_object_new_int(l->block_size));
		json_object_object_add(o, "read_only", json_object_new_boolean(l->read_only));
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
			leg_health_json(lg, st.legs[k].path);
			if (st.legs[k].health == LEG_RESYNCING) {
				json_object_object_add(lg, "resync_done", json_object_new_int64((int64_t)st.legs[k].resync_done));
				json_object_object_add(lg, "resync_total", json_object_new_int64((int64_t)st.legs[k].resync_total));
			}
			json_object_array_add(legs, lg);
		}
		json_object_object_add(o, "legs", legs);
		struct json_object *cl = json_object_new_array();
		for (int k = 0; k < st.nluns; k++) {
			struct json_object *lo = json_object_new_object();
			json_object_object_add(lo, "name", json_object_new_string(st.luns[k]));
			json_object_object_add(lo, "mode", json_object_new_string(cache_mode_name(st.lun_mode[k])));
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

/* Create the directory that will hold path (the control socket). */
static int mkdir_parent(const char *path)
{
	char dir[PATH_MAX];
	snprintf(dir, sizeof(dir), "%s", path);
	char *slash = strrchr(dir, '/');
	if (!slash || slash == dir)
		return 0;
	*slash = '\0';
	return mkdir_p(dir);
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: tiercached -c FILE [--check] [--debug]\n"
		"  -c, --config FILE  configuration file (INI; see README.md)\n"
		"      --check        validate the configuration and exit\n"
		"  -d, --debug        log debug messages\n"
		"  -V, --version      print the version\n");
}

/* mkdir -p with mode 0700 for new components. */
static int mkdir_p(const char *path)
{
	char buf[PATH_MAX];
	snprintf(buf, sizeof(buf), "%s", path);
	for (char *p = buf + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdir(buf, 0700) < 0 && errno != EEXIST)
			return -1;
		*p = '/';
	}
	if (mkdir(buf, 0700) < 0 && errno != EEXIST)
		return -1;
	return 0;
}


static enum log_level parse_level(const char *s)
{
	if (!strcmp(s, "error"))
		return LOG_LVL_ERR;
	if (!strcmp(s, "warning"))
		return LOG_LVL_WARN;
	if (!strcmp(s, "debug"))
		return LOG_LVL_DEBUG;
	return LOG_LVL_INFO;
}

/* Open (format or recover) every [cache] set. Workers must be running. */
static int open_caches(struct daemon *d)
{
	struct config *cfg = d->cfg;
	char err[1024];

	d->sets = calloc(cfg->ncaches ? cfg->ncaches : 1, sizeof(*d->sets));
	if (!d->sets)
		return -1;
	for (int i = 0; i < cfg->ncaches; i++) {
		struct cfg_cache *c = &cfg->caches[i];
		struct cache_set_cfg csc = {
			.name = c->name,
			.legs = { c->legs[0], c->legs[1] },
			.nlegs = c->nlegs,
			.allow_single_leg = c->allow_single_leg,
			.size = c->size,
			.extent_size = c->extent,
			.mode = (enum cache_mode)c->mode,
			.admit_hits = c->admit_hits,
			.seq_cutoff = c->seq_cutoff,
			.dirty_target = c->dirty_target,
		};
		for (int k = 0; k < c->nlegs; k++)
			if (c->size && mkdir_parent(c->legs[k]) < 0) {
				log_err("%s:%d: [cache %s]: cannot create the directory of %s: %s", cfg->path, c->line,
					c->name, c->legs[k], strerror(errno));
				return -1;
			}
		d->sets[i] = cache_set_open(&csc, err, sizeof(err));
		if (!d->sets[i]) {
			log_err("%s:%d: [cache %s]: %s", cfg->path, c->line, c->name, err);
			return -1;
		}
	}
	return 0;
}

/* Clean stop of every set: destage nothing, checkpoint metadata. Before workers_stop. */
static void shutdown_caches(struct daemon *d)
{
	for (int i = 0; d->sets && i < d->cfg->ncaches; i++)
		if (d->sets[i])
			cache_set_shutdown(d->sets[i]);
}

/*
 * Open the LU of [lun] l (its serial, backing store, cache volume on a set
 * already running, and the logical unit). cfg is the configuration in
 * effect: its state_dir, and its [cache] sections, parallel to sets (on a
 * reload, l belongs to the new file). 0, or -1 after logging why.
 */
static int open_one_lun(const struct config *cfg, const struct cfg_lun *l, struct cache_set **sets,
			char serial[33], struct scsi_lu **lu_out, struct bdev **vol_out)
{
	char err[512];
	const struct cfg_cache *cc = l->cache ? config_find_cache(cfg, l->cache) : NULL;

	*lu_out = NULL;
	*vol_out = NULL;
	if (l->cache && (!cc || !sets[cc - cfg->caches])) {
		log_err("%s:%d: [lun %s]: cache %s is not a running cache set; adding a [cache] section "
			"needs a restart", cfg->path, l->cache_line, l->name, l->cache);
		return -1;
	}
	if (config_lun_serial(cfg, l, true, serial) < 0) {
		log_err("%s:%d: [lun %s]: cannot keep its serial number in %s: %s; "
			"make state_dir writable", cfg->path, l->line, l->name, cfg->state_dir,
			strerror(errno));
		return -1;
	}
	struct bdev *dev = bdev_file_open(l->backing, l->size, l->block_size, true, err, sizeof(err));
	if (!dev) {
		log_err("%s:%d: [lun %s]: %s", cfg->path, l->line, l->name, err);
		return -1;
	}
	if (cc) {
		struct bdev *vol = cache_vol_open(sets[cc - cfg->caches], l->name, dev, l->backing,
						  (enum cache_mode)cc->mode, err, sizeof(err));
		if (!vol) {
			log_err("%s:%d: [lun %s]: %s", cfg->path, l->cache_line, l->name, err);
			bdev_close(dev);
			return -1;
		}
		dev = vol;
		*vol_out = vol;
	}
	struct scsi_lu_config lc = {
		.name = l->name,
		.serial = serial,
		.state_dir = cfg->state_dir,
		.block_size = l->block_size,
		.write_cache = l->write_cache,
		.read_only = l->read_only,
		.vendor = "TIERCACH",
		.product = "tiercache LUN",
		.revision = "0001",
		.target_port_group = 1,
		.rel_port_id = 1,
	};
	*lu_out = scsi_lu_open(&lc, dev, err, sizeof(err));
	if (!*lu_out) {
		log_err("%s:%d: [lun %s]: %s", cfg->path, l->line, l->name, err);
		bdev_close(dev);
		*vol_out = NULL;
		return -1;
	}
	log_info("lun %s: %s, %llu bytes, %u-byte blocks, serial %s, write cache %s", l->name, l->backing,
		 (unsigned long long)dev->size, l->block_size, serial, l->write_cache ? "on" : "off");
	return 0;
}

static int open_luns(struct daemon *d)
{
	struct config *cfg = d->cfg;

	if (open_caches(d) < 0)
		return -1;

	d->lus = calloc(cfg->nluns ? cfg->nluns : 1, sizeof(*d->lus));
	d->serials = calloc(cfg->nluns ? cfg->nluns : 1, sizeof(*d->serials));
	d->vols = calloc(cfg->nluns ? cfg->nluns : 1, sizeof(*d->vols));
	if (!d->lus || !d->serials || !d->vols)
		return -1;
	for (int i = 0; i < cfg->nluns; i++)
		if (open_one_lun(cfg, &cfg->luns[i], d->sets, d->serials[i], &d->lus[i], &d->vols[i]) < 0)
			return -1;
	return 0;
}

static int build_targets(struct daemon *d)
{
	struct config *cfg = d->cfg;
	int nt = cfg->ntargets;

	d->targets = calloc(nt ? nt : 1, sizeof(*d->targets));
	d->portal_targets = calloc(nt ? nt : 1, sizeof(*d->portal_targets));
	d->portal_listen = calloc(cfg->nlisten, sizeof(*d->portal_listen));
	if (!d->targets || !d->portal_targets || !d->portal_listen)
		return -1;
	for (int i = 0; i < nt; i++) {
		struct cfg_target *t = &cfg->targets[i];
		d->targets[i] = scsi_target_new(t->iqn);
		if (!d->targets[i])
			return -1;
		for (int j = 0; j < t->nluns; j++) {
			int idx = (int)(t->luns[j].lu - cfg->luns);
			scsi_target_map(d->targets[i], t->luns[j].lun, d->lus[idx]);
		}
		d->portal_targets[i] = (struct iscsi_target_cfg){
			.iqn = t->iqn,
			.scsi = d->targets[i],
			.allow = (const char *const *)t->allow,
			.nallow = t->nallow,
			.chap_user = t->chap_user,
			.chap_secret = t->chap_secret,
			.mutual_user = t->mutual_user,
			.mutual_secret = t->mutual_secret,
		};
		log_info("target %s: %d LUN(s), %s, %s", t->iqn, t->nluns,
			 t->nallow ? "initiators restricted by allow" : "any initiator",
			 t->mutual_user ? "mutual CHAP" : t->chap_user ? "CHAP" : "no CHAP");
	}
	for (int i = 0; i < cfg->nlisten; i++) {
		d->portal_listen[i].addr = cfg->listen[i].addr;
		d->portal_listen[i].port = cfg->listen[i].port;
	}
	return 0;
}

static void teardown(struct daemon *d)
{
	struct config *cfg = d->cfg;
	if (d->targets)
		for (int i = 0; i < cfg->ntargets; i++)
			if (d->targets[i])
				scsi_target_free(d->targets[i]);
	if (d->lus)
		for (int i = 0; i < cfg->nluns; i++)
			if (d->lus[i])
				scsi_lu_close(d->lus[i]);
	free(d->targets);
	free(d->lus);
	free(d->serials);
	free(d->vols);
	free(d->portal_targets);
	free(d->portal_listen);
	for (int i = 0; i < d->nold_targets; i++)
		scsi_target_free(d->old_targets[i]);
	for (int i = 0; i < d->nparked_lus; i++)
		scsi_lu_close(d->parked_lus[i]);
	for (int i = 0; d->sets && i < cfg->ncaches; i++)
		cache_set_close(d->sets[i]);
	free(d->sets);
	free(d->pc);
	for (int i = 0; i < d->nold_mem; i++)
		free(d->old_mem[i]);
	for (int i = 0; i < d->nold_cfgs; i++)
		config_free(d->old_cfgs[i]);
	free(d->old_mem);
	free(d->old_cfgs);
	free(d->old_targets);
	free(d->parked_lus);
	config_free(cfg);
}

/* ------------------------------------------------------------------ */
/* Configuration reload (SIGHUP)                                       */

static int keep_old(struct daemon *d, void *p)
{
	void **v = realloc(d->old_mem, sizeof(*v) * (size_t)(d->nold_mem + 1));
	if (!v)
		return -1;
	d->old_mem = v;
	d->old_mem[d->nold_mem++] = p;
	return 0;
}

static bool str_eq(const char *a, const char *b)
{
	return (!a && !b) || (a && b && !strcmp(a, b));
}

static void needs_restart(const struct config *n, int line, const char *what)
{
	if (line > 0)
		log_warn("%s:%d: changing %s needs a restart; the old value stays in effect", n->path, line, what);
	else
		log_warn("%s: changing %s needs a restart; the old value stays in effect", n->path, what);
}

static bool cache_eq(const struct cfg_cache *a, const struct cfg_cache *b)
{
	if (strcmp(a->name, b->name) || a->nlegs != b->nlegs || a->allow_single_leg != b->allow_single_leg ||
	    a->size != b->size || a->extent != b->extent || a->mode != b->mode || a->admit_hits != b->admit_hits ||
	    a->seq_cutoff != b->seq_cutoff || a->dirty_target != b->dirty_target)
		return false;
	for (int k = 0; k < a->nlegs; k++)
		if (strcmp(a->legs[k], b->legs[k]))
			return false;
	return true;
}

static bool listen_eq(const struct cfg_listen *a, int na, const struct cfg_listen *b, int nb)
{
	if (na != nb)
		return false;
	for (int i = 0; i < na; i++)
		if (strcmp(a[i].addr, b[i].addr) || a[i].port != b[i].port)
			return false;
	return true;
}

/* *dst = a copy of src (NULL stays NULL); false when out of memory. */
static bool dup_into(char **dst, const char *src)
{
	char *c = src ? strdup(src) : NULL;
	if (src && !c)
		return false;
	free(*dst);
	*dst = c;
	return true;
}

static bool copy_listen(struct cfg_listen *dst, int *ndst, const struct cfg_listen *src, int nsrc)
{
	char *addr[CFG_MAX_LISTEN];

	for (int i = 0; i < nsrc; i++) {
		addr[i] = strdup(src[i].addr);
		if (!addr[i]) {
			while (i-- > 0)
				free(addr[i]);
			return false;
		}
	}
	for (int i = 0; i < *ndst; i++)
		free(dst[i].addr);
	for (int i = 0; i < nsrc; i++) {
		dst[i] = src[i];
		dst[i].addr = addr[i];
	}
	*ndst = nsrc;
	return true;
}

/*
 * What a reload cannot change is put back into n as o has it (copied: o
 * stays untouched, the control thread and logins may be reading it), one
 * warning per item: [daemon] (log_level excepted: applied at commit),
 * [portal], [tcmu], the [cache] sections, and the settings of a [lun]
 * that stays. Returns how many, or -1 when out of memory.
 */
static int keep_unreloadable(struct config *o, struct config *n)
{
	int count = 0;

	if (strcmp(o->state_dir, n->state_dir)) {
		needs_restart(n, 0, "[daemon] state_dir");
		if (!dup_into(&n->state_dir, o->state_dir))
			return -1;
		count++;
	}
	if (strcmp(o->control_socket, n->control_socket)) {
		needs_restart(n, 0, "[daemon] control_socket");
		if (!dup_into(&n->control_socket, o->control_socket))
			return -1;
		count++;
	}
	if (o->workers != n->workers) {
		needs_restart(n, 0, "[daemon] workers");
		n->workers = o->workers;
		count++;
	}
	if (o->nop_interval != n->nop_interval || o->nop_timeout != n->nop_timeout) {
		needs_restart(n, 0, "[daemon] nop_interval/nop_timeout");
		n->nop_interval = o->nop_interval;
		n->nop_timeout = o->nop_timeout;
		count++;
	}
	if (!listen_eq(o->listen, o->nlisten, n->listen, n->nlisten)) {
		needs_restart(n, n->nlisten ? n->listen[0].line : 0, "[portal] listen");
		if (!copy_listen(n->listen, &n->nlisten, o->listen, o->nlisten))
			return -1;
		count++;
	}
	if (o->tcmu_enable != n->tcmu_enable || o->tcmu_dbus != n->tcmu_dbus ||
	    !listen_eq(o->tcmu_portal, o->ntcmu_portal, n->tcmu_portal, n->ntcmu_portal)) {
		needs_restart(n, 0, "[tcmu]");
		n->tcmu_enable = o->tcmu_enable;
		n->tcmu_dbus = o->tcmu_dbus;
		if (!copy_listen(n->tcmu_portal, &n->ntcmu_portal, o->tcmu_portal, o->ntcmu_portal))
			return -1;
		count++;
	}
	/* [cache]: the running sets stay exactly as they are */
	bool caches_same = o->ncaches == n->ncaches;
	for (int i = 0; caches_same && i < n->ncaches; i++)
		caches_same = cache_eq(&o->caches[i], &n->caches[i]);
	if (!caches_same) {
		for (int i = 0; i < n->ncaches; i++) {
			struct cfg_cache *oc = config_find_cache(o, n->caches[i].name);
			char what[300];
			snprintf(what, sizeof(what), "%s [cache %s]", oc ? "the settings of" : "adding",
				 n->caches[i].name);
			if (!oc || !cache_eq(oc, &n->caches[i])) {
				needs_restart(n, n->caches[i].line, what);
				count++;
			}
		}
		for (int i = 0; i < o->ncaches; i++)
			if (!config_find_cache(n, o->caches[i].name)) {
				char what[300];
				snprintf(what, sizeof(what), "removing [cache %s]", o->caches[i].name);
				needs_restart(n, 0, what);
				count++;
			}
		struct cfg_cache *cc = calloc(o->ncaches ? o->ncaches : 1, sizeof(*cc));
		if (!cc)
			return -1;
		bool ok = true;
		for (int i = 0; i < o->ncaches; i++) {
			cc[i] = o->caches[i];
			cc[i].name = strdup(o->caches[i].name);
			ok &= cc[i].name != NULL;
			for (int k = 0; k < o->caches[i].nlegs; k++) {
				cc[i].legs[k] = strdup(o->caches[i].legs[k]);
				ok &= cc[i].legs[k] != NULL;
			}
		}
		for (int i = 0; i < n->ncaches; i++) {
			free(n->caches[i].name);
			for (int k = 0; k < n->caches[i].nlegs; k++)
				free(n->caches[i].legs[k]);
		}
		free(n->caches);
		n->caches = cc;
		n->ncaches = o->ncaches;
		for (int i = 0; i < n->nluns; i++)
			n->luns[i].cache_set = n->luns[i].cache ? config_find_cache(n, n->luns[i].cache) : NULL;
		if (!ok)
			return -1; /* config_free(n) frees what was copied */
	}
	/* a [lun] that stays keeps its LU: its settings stay too */
	for (int i = 0; i < n->nluns; i++) {
		struct cfg_lun *nl = &n->luns[i], *ol = config_find_lun(o, nl->name);
		char what[300];
		int before = count;
		if (!ol)
			continue;
#define LUN_FIELD(cond, field)                                                           \
	if (cond) {                                                                      \
		snprintf(what, sizeof(what), "%s of [lun %s]", field, nl->name);         \
		needs_restart(n, nl->line, what);                                        \
		count++;                                                                 \
	}
		LUN_FIELD(strcmp(ol->backing, nl->backing), "backing")
		LUN_FIELD(ol->size != nl->size, "size")
		LUN_FIELD(ol->block_size != nl->block_size, "block_size")
		LUN_FIELD(!str_eq(ol->serial, nl->serial), "serial")
		LUN_FIELD(ol->write_cache != nl->write_cache, "write_cache")
		LUN_FIELD(ol->read_only != nl->read_only, "read_only")
		LUN_FIELD(!str_eq(ol->cache, nl->cache), "cache")
#undef LUN_FIELD
		if (count != before) {
			if (!dup_into(&nl->backing, ol->backing) || !dup_into(&nl->serial, ol->serial) ||
			    !dup_into(&nl->cache, ol->cache))
				return -1;
			nl->size = ol->size;
			nl->block_size = ol->block_size;
			nl->write_cache = ol->write_cache;
			nl->read_only = ol->read_only;
			nl->cache_set = nl->cache ? config_find_cache(n, nl->cache) : NULL;
		}
	}
	return count;
}

static int find_target(const struct config *cfg, const char *iqn)
{
	for (int i = 0; i < cfg->ntargets; i++)
		if (!strcasecmp(cfg->targets[i].iqn, iqn))
			return i;
	return -1;
}

static int find_lun_idx(const struct config *cfg, const char *name)
{
	for (int i = 0; i < cfg->nluns; i++)
		if (!strcmp(cfg->luns[i].name, name))
			return i;
	return -1;
}

static bool has_mapping(const struct cfg_target *t, uint64_t lun, const char *name)
{
	for (int j = 0; j < t->nluns; j++)
		if (t->luns[j].lun == lun && !strcmp(t->luns[j].lun_name, name))
			return true;
	return false;
}

static bool auth_eq(const struct cfg_target *a, const struct cfg_target *b)
{
	if (a->nallow != b->nallow || !str_eq(a->chap_user, b->chap_user) || !str_eq(a->chap_secret, b->chap_secret) ||
	    !str_eq(a->mutual_user, b->mutual_user) || !str_eq(a->mutual_secret, b->mutual_secret))
		return false;
	for (int k = 0; k < a->nallow; k++)
		if (strcasecmp(a->allow[k], b->allow[k]))
			return false;
	return true;
}

static void sleep_ms(unsigned ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
	nanosleep(&ts, NULL);
}

/* Post the new maps of t[0..nt) to every worker and wait (nt 0: a barrier,
 * every worker finished what it was doing). Feeds the watchdog. */
static void publish_wait(struct scsi_target *const *t, int nt)
{
	struct scsi_publish *p;

	while (!(p = scsi_target_publish_start(t, nt)))
		sleep_ms(10);
	while (!scsi_target_publish_done(p)) {
		watchdog_feed();
		sleep_ms(1);
	}
}

static int park_lu(struct daemon *d, struct scsi_lu *lu)
{
	struct scsi_lu **v = realloc(d->parked_lus, sizeof(*v) * (size_t)(d->nparked_lus + 1));
	if (!v)
		return -1;
	d->parked_lus = v;
	d->parked_lus[d->nparked_lus++] = lu;
	return 0;
}

#define RELOAD_DRAIN_MS 30000
#define RELOAD_LOGOUT_MS 10000

static void reload(struct daemon *d)
{
	struct config *o = d->cfg, *n = NULL;
	char err[1024];

	log_info("SIGHUP: reloading %s", d->path);
	if (config_load(d->path, &n, err, sizeof(err)) < 0) {
		log_err("%s", err);
		log_err("reload refused: the configuration in effect stays as it was");
		return;
	}
	int nl = n->nluns, nt = n->ntargets;
	struct scsi_lu **lus = calloc(nl ? nl : 1, sizeof(*lus));
	struct bdev **vols = calloc(nl ? nl : 1, sizeof(*vols));
	char (*serials)[33] = calloc(nl ? nl : 1, sizeof(*serials));
	bool *lu_new = calloc(nl ? nl : 1, sizeof(*lu_new));
	bool *o_lu_kept = calloc(o->nluns ? o->nluns : 1, sizeof(*o_lu_kept));
	struct scsi_target **targets = calloc(nt ? nt : 1, sizeof(*targets));
	bool *t_new = calloc(nt ? nt : 1, sizeof(*t_new));
	int *t_old = calloc(nt ? nt : 1, sizeof(*t_old));
	bool *o_t_kept = calloc(o->ntargets ? o->ntargets : 1, sizeof(*o_t_kept));
	struct iscsi_target_cfg *ptargets = calloc(nt ? nt : 1, sizeof(*ptargets));
	struct iscsi_portal_cfg *pc = calloc(1, sizeof(*pc));
	struct scsi_target **pub = calloc((size_t)(nt + o->ntargets + 1), sizeof(*pub));
	int npub = 0;
	int luns_added = 0, luns_removed = 0, maps_added = 0, maps_removed = 0, tgts_added = 0, tgts_removed = 0;

	if (!lus || !vols || !serials || !lu_new || !o_lu_kept || !targets || !t_new || !t_old || !o_t_kept ||
	    !ptargets || !pc || !pub) {
		log_err("reload: out of memory");
		goto abort;
	}
	int restarts = keep_unreloadable(o, n);
	if (restarts < 0) {
		log_err("reload: out of memory");
		goto abort;
	}

	/* LUNs: a name that stays keeps its LU; new ones are opened now */
	for (int i = 0; i < nl; i++) {
		int oi = find_lun_idx(o, n->luns[i].name);
		if (oi >= 0) {
			lus[i] = d->lus[oi];
			vols[i] = d->vols[oi];
			memcpy(serials[i], d->serials[oi], sizeof(serials[i]));
			o_lu_kept[oi] = true;
			continue;
		}
		if (open_one_lun(n, &n->luns[i], d->sets, serials[i], &lus[i], &vols[i]) < 0)
			goto abort;
		lu_new[i] = true;
		luns_added++;
		if (o->tcmu_enable)
			log_warn("%s:%d: [lun %s] is served over iSCSI; LIO (TCMU) sees it after a restart",
				 n->path, n->luns[i].line, n->luns[i].name);
	}
	/* targets: an IQN that stays keeps its scsi target; new ones are built now */
	for (int j = 0; j < nt; j++) {
		struct cfg_target *t = &n->targets[j];
		int oj = find_target(o, t->iqn);
		t_old[j] = oj;
		if (oj >= 0) {
			targets[j] = d->targets[oj];
			o_t_kept[oj] = true;
			if (!auth_eq(&o->targets[oj], t))
				log_info("%s:%d: [target %s]: allow list or CHAP changed; new logins use it, "
					 "sessions already logged in stay", n->path, t->line, t->iqn);
		} else {
			targets[j] = scsi_target_new(t->iqn);
			if (!targets[j]) {
				log_err("reload: out of memory");
				goto abort;
			}
			t_new[j] = true;
			for (int k = 0; k < t->nluns; k++)
				if (scsi_target_map(targets[j], t->luns[k].lun,
						    lus[t->luns[k].lu - n->luns]) < 0) {
					log_err("reload: out of memory");
					goto abort;
				}
		}
		ptargets[j] = (struct iscsi_target_cfg){
			.iqn = t->iqn,
			.scsi = targets[j],
			.allow = (const char *const *)t->allow,
			.nallow = t->nallow,
			.chap_user = t->chap_user,
			.chap_secret = t->chap_secret,
			.mutual_user = t->mutual_user,
			.mutual_secret = t->mutual_secret,
		};
	}
	*pc = *d->pc;
	pc->targets = ptargets;
	pc->ntargets = nt;

	/* ---- from here on nothing is refused ---- */
	if (strcmp(o->log_level, n->log_level)) {
		if (!d->debug)
			log_set_level(parse_level(n->log_level));
		log_info("%s: log_level is now %s%s", n->path, n->log_level, d->debug ? " (--debug overrides it)" : "");
	}

	/* mapping changes of the targets that stay */
	for (int j = 0; j < nt; j++) {
		int oj = t_old[j];
		if (oj < 0) {
			tgts_added++;
			log_info("reload: target %s added with %d LUN(s)", n->targets[j].iqn, n->targets[j].nluns);
			continue;
		}
		struct cfg_target *ot = &o->targets[oj], *t = &n->targets[j];
		bool changed = false;
		for (int k = 0; k < ot->nluns; k++)
			if (!has_mapping(t, ot->luns[k].lun, ot->luns[k].lun_name)) {
				scsi_target_unmap(targets[j], ot->luns[k].lun);
				log_info("reload: target %s: lun%llu (%s) removed", t->iqn,
					 (unsigned long long)ot->luns[k].lun, ot->luns[k].lun_name);
				maps_removed++;
				changed = true;
			}
		for (int k = 0; k < t->nluns; k++)
			if (!has_mapping(ot, t->luns[k].lun, t->luns[k].lun_name)) {
				if (scsi_target_map(targets[j], t->luns[k].lun, lus[t->luns[k].lu - n->luns]) < 0)
					log_err("%s:%d: target %s: cannot map lun%llu (out of memory)", n->path,
						t->luns[k].line, t->iqn, (unsigned long long)t->luns[k].lun);
				else
					log_info("reload: target %s: lun%llu = %s added", t->iqn,
						 (unsigned long long)t->luns[k].lun, t->luns[k].lun_name);
				maps_added++;
				changed = true;
			}
		if (changed)
			pub[npub++] = targets[j];
	}
	/* logins and discovery see the new target list */
	iscsi_portal_update(pc);
	/* every nexus on every worker takes its new LUN list */
	publish_wait(pub, npub);
	/* removed targets: no new nexus (a login already past the lookup
	 * fails); the sessions they have are asked to log out below */
	int first_retired = npub;
	for (int oj = 0; oj < o->ntargets; oj++)
		if (!o_t_kept[oj]) {
			scsi_target_retire(d->targets[oj]);
			pub[npub++] = d->targets[oj];
			tgts_removed++;
			log_info("reload: target %s removed; its sessions are asked to log out", o->targets[oj].iqn);
		}

	/* tierctl sees the new configuration */
	control_lock();
	struct scsi_lu **old_lus = d->lus;
	struct bdev **old_vols = d->vols;
	keep_old(d, d->lus);
	keep_old(d, d->vols);
	keep_old(d, d->serials);
	keep_old(d, d->targets);
	keep_old(d, d->portal_targets);
	keep_old(d, d->pc);
	d->cfg = n;
	d->lus = lus;
	d->vols = vols;
	d->serials = serials;
	d->targets = targets;
	d->portal_targets = ptargets;
	d->pc = pc;
	ctl_cache_update(n, vols);
	control_unlock();
	{
		struct config **v = realloc(d->old_cfgs, sizeof(*v) * (size_t)(d->nold_cfgs + 1));
		if (v) {
			d->old_cfgs = v;
			d->old_cfgs[d->nold_cfgs++] = o;
		} /* else: leaked; logins in progress may still read it */
	}

	/*
	 * Sessions of removed targets: asked to log out; each stops taking
	 * new commands and closes once those in flight have answered. One
	 * that outlasts the grace period loses its LUNs (it answers LOGICAL
	 * UNIT NOT SUPPORTED) so that removed LUNs can close. The targets
	 * are freed at exit.
	 */
	for (int i = first_retired; i < npub; i++)
		iscsi_portal_close_target(pub[i]);
	uint64_t end = now_ms() + RELOAD_LOGOUT_MS;
	for (int i = first_retired; i < npub; i++) {
		while (scsi_target_nexus_count(pub[i]) > 0 && now_ms() < end) {
			watchdog_feed();
			sleep_ms(10);
		}
		if (scsi_target_nexus_count(pub[i]) > 0)
			log_warn("reload: target %s: %d session(s) still open after %u s; they lose their LUNs "
				 "and close when the initiator logs out", scsi_target_name(pub[i]),
				 scsi_target_nexus_count(pub[i]), RELOAD_LOGOUT_MS / 1000);
		struct scsi_target **v = realloc(d->old_targets, sizeof(*v) * (size_t)(d->nold_targets + 1));
		if (v) {
			d->old_targets = v;
			d->old_targets[d->nold_targets++] = pub[i];
		}
	}
	if (npub > first_retired)
		publish_wait(pub + first_retired, npub - first_retired);

	/* removed LUNs: no map holds them now; wait for their commands (one
	 * deadline for all of them), then close */
	end = now_ms() + RELOAD_DRAIN_MS;
	for (int oi = 0; oi < o->nluns; oi++) {
		if (o_lu_kept[oi])
			continue;
		struct scsi_lu *lu = old_lus[oi];
		const char *name = scsi_lu_name(lu);
		luns_removed++;
		while (scsi_lu_inflight(lu) > 0 && now_ms() < end) {
			watchdog_feed();
			sleep_ms(1);
		}
		publish_wait(NULL, 0); /* whatever touched it last has returned */
		if (scsi_lu_inflight(lu) > 0) {
			log_warn("reload: lun %s: %u command(s) still in flight after %u s; it stays open "
				 "(unreachable) until exit", name, scsi_lu_inflight(lu), RELOAD_DRAIN_MS / 1000);
			end = now_ms(); /* the others get one last look each, not another 30 s */
			if (park_lu(d, lu) < 0)
				log_err("reload: lun %s: out of memory; it is leaked", name);
		} else if (old_vols[oi] || o->tcmu_enable) {
			log_info("reload: lun %s removed and drained; %s stays open (unreachable) until exit",
				 name, old_vols[oi] ? "its cache volume" : "LIO (TCMU) may still use it, so it");
			if (park_lu(d, lu) < 0)
				log_err("reload: lun %s: out of memory; it is leaked", name);
		} else {
			log_info("reload: lun %s removed, drained and closed", name);
			scsi_lu_close(lu);
		}
	}
	free(lu_new);
	free(o_lu_kept);
	free(t_new);
	free(t_old);
	free(o_t_kept);
	free(pub);
	log_info("reload: %d LUN(s) added, %d removed; %d mapping(s) added, %d removed; %d target(s) added, "
		 "%d removed; %d setting(s) need a restart", luns_added, luns_removed, maps_added, maps_removed,
		 tgts_added, tgts_removed, restarts);
	sd_notifyf(0, "STATUS=serving: %d target(s), %d LUN(s)", n->ntargets, n->nluns);
	return;

abort:
	for (int j = 0; targets && t_new && j < nt; j++)
		if (t_new[j])
			scsi_target_free(targets[j]);
	for (int i = 0; lus && lu_new && i < nl; i++)
		if (lu_new[i] && lus[i]) {
			/* a cache volume on a running set stays open until exit */
			if (vols[i] && park_lu(d, lus[i]) == 0)
				continue;
			scsi_lu_close(lus[i]);
		}
	free(lus);
	free(vols);
	free(serials);
	free(lu_new);
	free(o_lu_kept);
	free(targets);
	free(t_new);
	free(t_old);
	free(o_t_kept);
	free(ptargets);
	free(pc);
	free(pub);
	config_free(n);
	log_err("reload refused: the configuration in effect stays as it was");
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "config", required_argument, NULL, 'c' },
		{ "check", no_argument, NULL, 'k' },
		{ "debug", no_argument, NULL, 'd' },
		{ "version", no_argument, NULL, 'V' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	const char *path = NULL;
	bool check_only = false, debug = false;
	int c;

	while ((c = getopt_long(argc, argv, "c:dVh", opts, NULL)) != -1) {
		switch (c) {
		case 'c': path = optarg; break;
		case 'k': check_only = true; break;
		case 'd': debug = true; break;
		case 'V': printf("tiercached %s\n", TC_VERSION); return 0;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (!path || optind != argc) {
		usage(stderr);
		return 2;
	}

	struct daemon d = { .path = path, .debug = debug };
	char err[1024];
	if (config_load(path, &d.cfg, err, sizeof(err)) < 0) {
		fprintf(stderr, "%s\n", err);
		return 1;
	}
	if (check_only) {
		printf("%s: configuration OK: %d target(s), %d LUN(s), %d listen address(es)\n", path,
		       d.cfg->ntargets, d.cfg->nluns, d.cfg->nlisten);
		config_free(d.cfg);
		return 0;
	}
	log_set_level(debug ? LOG_LVL_DEBUG : parse_level(d.cfg->log_level));
	log_info("tiercached %s starting with %s", TC_VERSION, path);

	/* Signals are taken synchronously by the main thread only. */
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	signal(SIGPIPE, SIG_IGN);

	if (mkdir_p(d.cfg->state_dir) < 0) {
		log_err("%s: state_dir %s cannot be created: %s; create it or point state_dir elsewhere",
			path, d.cfg->state_dir, strerror(errno));
		config_free(d.cfg);
		return 1;
	}
	int r = workers_start(d.cfg->workers);
	if (r < 0) {
		log_err("cannot start worker threads: %s", strerror(-r));
		config_free(d.cfg);
		return 1;
	}
	if (open_luns(&d) < 0 || build_targets(&d) < 0) {
		shutdown_caches(&d);
	workers_stop();
		teardown(&d);
		return 1;
	}
	d.pc = calloc(1, sizeof(*d.pc));
	if (!d.pc) {
		log_err("out of memory");
		shutdown_caches(&d);
		workers_stop();
		teardown(&d);
		return 1;
	}
	*d.pc = (struct iscsi_portal_cfg){
		.listen = d.portal_listen,
		.nlisten = d.cfg->nlisten,
		.targets = d.portal_targets,
		.ntargets = d.cfg->ntargets,
		.nop_interval = d.cfg->nop_interval,
		.nop_timeout = d.cfg->nop_timeout,
	};
	if (iscsi_portal_start(d.pc, err, sizeof(err)) < 0) {
		log_err("%s", err);
		shutdown_caches(&d);
	workers_stop();
		teardown(&d);
		return 1;
	}
	for (int i = 0; i < d.cfg->nlisten; i++)
		log_info("portal listening on %s%s%s:%u", strchr(d.cfg->listen[i].addr, ':') ? "[" : "",
			 d.cfg->listen[i].addr, strchr(d.cfg->listen[i].addr, ':') ? "]" : "",
			 d.cfg->listen[i].port);
	/* LIO through TCMU: optional; a kernel without it is not fatal. */
	if (d.cfg->tcmu_enable && tcmu_start(d.lus, d.cfg->nluns, d.cfg->tcmu_dbus, err, sizeof(err)) < 0) {
		log_err("%s", err);
		iscsi_portal_drain();
		shutdown_caches(&d);
		workers_stop();
		teardown(&d);
		return 1;
	}
	err[0] = '\0';
	started_ms = now_ms();
	control_register("status", ctl_status, &d);
	ctl_cache_register(d.cfg, d.sets, d.vols);
	if (d.cfg->ncaches && leg_health_start(d.sets, d.cfg->ncaches, 60) < 0)
		log_warn("cannot start the NVMe health monitor; legs are still failed on I/O errors");
	if (mkdir_parent(d.cfg->control_socket) < 0 ||
	    control_start(d.cfg->control_socket, err, sizeof(err)) < 0) {
		log_err("%s", err[0] ? err : "cannot create the control socket directory");
		iscsi_portal_drain();
		shutdown_caches(&d);
	workers_stop();
		teardown(&d);
		return 1;
	}
	sd_notify(0, "READY=1\nSTATUS=serving");
	log_info("ready: %d target(s), %d LUN(s), %u worker thread(s)", d.cfg->ntargets, d.cfg->nluns,
		 workers_count());

	watchdog_start();
	for (;;) {
		int sig;
		int wd_ms = watchdog_poll_ms();
		if (wd_ms >= 0) {
			/* Wake at least every half watchdog interval to feed it. */
			struct timespec ts = { .tv_sec = wd_ms / 1000, .tv_nsec = (long)(wd_ms % 1000) * 1000000L };
			sig = sigtimedwait(&set, NULL, &ts);
			watchdog_feed();
			if (sig < 0)
				continue;
		} else if (sigwait(&set, &sig)) {
			continue;
		}
		if (sig == SIGHUP) {
			reload(&d);
			continue;
		}
		log_info("%s received: draining in-flight commands", sig == SIGTERM ? "SIGTERM" : "SIGINT");
		break;
	}
	sd_notify(0, "STOPPING=1");
	watchdog_stop();
	control_stop();
	ctl_cache_stop();
	leg_health_stop();
	iscsi_portal_drain();
	tcmu_stop();
	shutdown_caches(&d);
	workers_stop();
	teardown(&d);
	log_info("stopped cleanly");
	return 0;
}
