/*
 * reload.c - configuration reload on SIGHUP (systemd's ExecReload).
 *
 * The new file is loaded and validated first; a bad one is refused with
 * FILE:LINE and the configuration in effect stays. Otherwise the two are
 * compared: new LUNs are opened and published to every live login, removed
 * ones are unpublished, drained and closed (or parked until exit when they
 * cannot be), targets are added to or retired from the portal's list, and
 * every other change is logged as needing a restart while the old value is
 * kept. What a reload replaces but sessions may still point into is kept in
 * struct daemon until exit. Main thread only.
 */
#include "daemon/daemon.h"

#include "backstore/scsi.h"
#include "bdev/bdev.h"
#include "cache/cache.h"
#include "common/log.h"
#include "common/worker.h"
#include "config/config.h"
#include "daemon/control.h"
#include "daemon/ctl_cache.h"
#include "daemon/watchdog.h"
#include "target/iscsi/portal.h"
#include "target/tcmu/tcmu.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

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
	    a->seq_cutoff != b->seq_cutoff || a->dirty_target != b->dirty_target ||
	    a->leg_timeout != b->leg_timeout || a->max_read_errors != b->max_read_errors ||
	    a->fault_injection != b->fault_injection)
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
 * warning per item: [daemon] (log_level and poll_us excepted: applied at commit),
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
	if (o->space_interval != n->space_interval) {
		needs_restart(n, 0, "[daemon] space_interval");
		n->space_interval = o->space_interval;
		count++;
	}
	if (!listen_eq(o->metrics, o->nmetrics, n->metrics, n->nmetrics)) {
		needs_restart(n, n->nmetrics ? n->metrics[0].line : 0, "[daemon] metrics");
		if (!copy_listen(n->metrics, &n->nmetrics, o->metrics, o->nmetrics))
			return -1;
		count++;
	}
	if (o->port_group != n->port_group) {
		needs_restart(n, n->port_group_line, "[portal] port_group");
		n->port_group = o->port_group;
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
		LUN_FIELD(ol->backing_buffered != nl->backing_buffered, "backing_io")
		LUN_FIELD(!str_eq(ol->ceph_conf, nl->ceph_conf), "ceph_conf")
		LUN_FIELD(!str_eq(ol->ceph_user, nl->ceph_user), "ceph_user")
		LUN_FIELD(ol->ceph_timeout != nl->ceph_timeout, "ceph_timeout")
		LUN_FIELD(ol->gateways != nl->gateways, "gateways")
		LUN_FIELD(ol->space_warn != nl->space_warn, "space_warn")
		/* through TCMU, LIO's cmd_time_out was set from it when the device
		 * was set up: a longer io_timeout (or off) would let the kernel fail
		 * a command before it is fenced here; a shorter one is safe */
		bool tmo_longer = ol->io_timeout && (!nl->io_timeout || nl->io_timeout > ol->io_timeout);
		LUN_FIELD(tmo_longer && n->tcmu_enable, "a longer io_timeout (with [tcmu] enable)")
#undef LUN_FIELD
		if (count != before) {
			if (!dup_into(&nl->backing, ol->backing) || !dup_into(&nl->serial, ol->serial) ||
			    !dup_into(&nl->cache, ol->cache) || !dup_into(&nl->ceph_conf, ol->ceph_conf) ||
			    !dup_into(&nl->ceph_user, ol->ceph_user))
				return -1;
			nl->ceph_timeout = ol->ceph_timeout;
			nl->backing_buffered = ol->backing_buffered;
			nl->gateways = ol->gateways;
			nl->space_warn = ol->space_warn;
			if (tmo_longer && n->tcmu_enable)
				nl->io_timeout = ol->io_timeout;
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

/* The file or device behind a backing store's path: false if none (an RBD image). */
static bool backing_id(const char *path, unsigned long long *dev, unsigned long long *ino)
{
	struct stat st;
	if (!path || stat(path, &st) < 0)
		return false;
	*dev = S_ISBLK(st.st_mode) ? (unsigned long long)st.st_rdev : (unsigned long long)st.st_dev;
	*ino = S_ISBLK(st.st_mode) ? 0 : (unsigned long long)st.st_ino;
	return true;
}

/* vol: lu's cache volume, when that is all it waits for (else NULL); l: its LUN */
static int park_lu(struct daemon *d, struct scsi_lu *lu, struct bdev *vol, const struct cfg_lun *l)
{
	struct parked_lu *pv = realloc(d->parked, sizeof(*pv) * (size_t)(d->nparked + 1));
	if (!pv)
		return -1;
	d->parked = pv;
	pv = &d->parked[d->nparked++];
	memset(pv, 0, sizeof(*pv));
	pv->lu = lu;
	pv->vol = vol;
	if (vol && l) {
		snprintf(pv->name, sizeof(pv->name), "%s", l->name);
		pv->backing = strdup(l->backing ? l->backing : "");
		pv->have_id = backing_id(l->backing, &pv->dev, &pv->ino);
	}
	return 0;
}

/*
 * A new LUN l may not take the backing store of a removed LUN whose dirty
 * data a parked volume still destages (it would land over l's writes),
 * unless l is that LUN, configured again on the same set (its new volume
 * serves from the cached copies and destages them). false after logging
 * why.
 */
static bool backing_free(struct daemon *d, const struct config *n, const struct cfg_lun *l)
{
	unsigned long long dev = 0, ino = 0;
	bool have_id = backing_id(l->backing, &dev, &ino);
	for (int i = 0; i < d->nparked; i++) {
		const struct parked_lu *pv = &d->parked[i];
		if (!pv->vol || !cache_vol_waits_destage(pv->vol))
			continue;
		bool same = have_id && pv->have_id ? dev == pv->dev && ino == pv->ino
						   : !strcmp(pv->backing, l->backing ? l->backing : "");
		if (!same)
			continue;
		const struct cfg_cache *cc = l->cache ? config_find_cache(n, l->cache) : NULL;
		struct cache_set *cs = cc && d->sets ? d->sets[cc - n->caches] : NULL;
		if (!strcmp(pv->name, l->name) && cs == cache_vol_cache_set(pv->vol))
			continue;
		log_err("%s:%d: [lun %s] uses the backing store of lun %s, which a reload removed while the cache "
			"still held data of it not written there: that data would land over this LUN's writes. "
			"Configure it as [lun %s] on its cache again, or reload once the log says \"reload: lun %s: its "
			"cache volume has nothing left to destage\"", n->path, l->line, l->name, pv->name, pv->name,
			pv->name);
		return false;
	}
	return true;
}

/*
 * Close lu, whose volume vol the set no longer needs for a destage, and
 * have the set free the entries of LUNs no longer configured (this one's,
 * unless it is configured again; the set says which it freed).
 */
static void release_cached(struct scsi_lu *lu, struct bdev *vol)
{
	struct cache_set *cs = cache_vol_cache_set(vol);
	char name[128];
	snprintf(name, sizeof(name), "%s", scsi_lu_name(lu));
	scsi_lu_close(lu); /* closes vol */
	log_info("reload: lun %s: its cache volume has nothing left to destage; closed", name);
	int r = cache_set_prune(cs);
	if (r < 0)
		log_warn("reload: lun %s: the cache set could not record the entries it freed: %s", name,
			 strerror(-r));
	watchdog_feed(); /* each release may take a while: closing, the set's purge */
}

bool daemon_release_parked(struct daemon *d)
{
	bool waiting = false;
	for (int i = 0; i < d->nparked;) {
		struct parked_lu *p = &d->parked[i];
		if (!p->vol || cache_vol_waits_destage(p->vol)) {
			waiting |= p->vol != NULL;
			i++;
			continue;
		}
		release_cached(p->lu, p->vol);
		free(p->backing);
		*p = d->parked[--d->nparked];
	}
	return waiting;
}

#define RELOAD_DRAIN_MS 30000
#define RELOAD_LOGOUT_MS 10000

/*
 * One reload: the configuration in effect (o), the new one (n), and what
 * n is to be served with, parallel to its arrays. The steps before
 * "nothing is refused" in daemon_reload fill it and may still refuse the
 * reload (reload_refuse undoes them); the steps after apply it.
 */
struct reload {
	struct daemon *d;
	struct config *o, *n;
	int nl, nt;                   /* n->nluns, n->ntargets */
	struct scsi_lu **lus;         /* parallel to n->luns: kept or opened now */
	struct bdev **vols;
	char (*serials)[33];
	bool *lu_new;                 /* lus[i] was opened by this reload */
	bool *o_lu_kept;              /* parallel to o->luns: n still has it */
	struct scsi_target **targets; /* parallel to n->targets: kept or built now */
	bool *t_new;                  /* targets[j] was built by this reload */
	int *t_old;                   /* its index in o->targets, or -1 */
	bool *o_t_kept;               /* parallel to o->targets: n still has it */
	struct iscsi_target_cfg *ptargets;
	struct iscsi_portal_cfg *pc;
	/* the targets whose maps changed, then from first_retired the removed ones */
	struct scsi_target **pub;
	int npub, first_retired;
	/* o's LUs and volumes, for closing the removed ones once d holds n's */
	struct scsi_lu **old_lus;
	struct bdev **old_vols;
	int restarts;                 /* settings that need a restart (keep_unreloadable) */
	int luns_added, luns_removed, maps_added, maps_removed, tgts_added, tgts_removed;
};

/* Read and validate the new file, and make room for what it will serve.
 * -1 after logging why. */
static int reload_parse(struct reload *r)
{
	struct config *o = r->o;
	char err[1024];

	if (config_load(r->d->path, &r->n, err, sizeof(err)) < 0) {
		log_err("%s", err);
		return -1;
	}
	int nl = r->nl = r->n->nluns, nt = r->nt = r->n->ntargets;
	r->lus = calloc(nl ? nl : 1, sizeof(*r->lus));
	r->vols = calloc(nl ? nl : 1, sizeof(*r->vols));
	r->serials = calloc(nl ? nl : 1, sizeof(*r->serials));
	r->lu_new = calloc(nl ? nl : 1, sizeof(*r->lu_new));
	r->o_lu_kept = calloc(o->nluns ? o->nluns : 1, sizeof(*r->o_lu_kept));
	r->targets = calloc(nt ? nt : 1, sizeof(*r->targets));
	r->t_new = calloc(nt ? nt : 1, sizeof(*r->t_new));
	r->t_old = calloc(nt ? nt : 1, sizeof(*r->t_old));
	r->o_t_kept = calloc(o->ntargets ? o->ntargets : 1, sizeof(*r->o_t_kept));
	r->ptargets = calloc(nt ? nt : 1, sizeof(*r->ptargets));
	r->pc = calloc(1, sizeof(*r->pc));
	r->pub = calloc((size_t)(nt + o->ntargets + 1), sizeof(*r->pub));
	if (!r->lus || !r->vols || !r->serials || !r->lu_new || !r->o_lu_kept || !r->targets || !r->t_new ||
	    !r->t_old || !r->o_t_kept || !r->ptargets || !r->pc || !r->pub) {
		log_err("reload: out of memory");
		return -1;
	}
	return 0;
}

/* What a reload cannot change goes back to its value in effect, each with
 * a warning (keep_unreloadable). -1 when out of memory. */
static int reload_keep_settings(struct reload *r)
{
	r->restarts = keep_unreloadable(r->o, r->n);
	if (r->restarts < 0) {
		log_err("reload: out of memory");
		return -1;
	}
	return 0;
}

/* LUNs: a name that stays keeps its LU; new ones are opened now. -1 after
 * logging why one cannot be. */
static int reload_diff_luns(struct reload *r)
{
	struct daemon *d = r->d;
	struct config *o = r->o, *n = r->n;

	for (int i = 0; i < r->nl; i++) {
		int oi = find_lun_idx(o, n->luns[i].name);
		if (oi >= 0) {
			r->lus[i] = d->lus[oi];
			r->vols[i] = d->vols[oi];
			memcpy(r->serials[i], d->serials[oi], sizeof(r->serials[i]));
			r->o_lu_kept[oi] = true;
			continue;
		}
		if (!backing_free(d, n, &n->luns[i]) ||
		    daemon_open_lun(n, &n->luns[i], d->sets, r->serials[i], &r->lus[i], &r->vols[i]) < 0)
			return -1;
		r->lu_new[i] = true;
		r->luns_added++;
		if (o->tcmu_enable)
			log_warn("%s:%d: [lun %s] is served over iSCSI; LIO (TCMU) sees it after a restart",
				 n->path, n->luns[i].line, n->luns[i].name);
	}
	return 0;
}

/* Targets: an IQN that stays keeps its scsi target; new ones are built
 * now, and the portal's new target list with them. -1 when out of memory. */
static int reload_diff_targets(struct reload *r)
{
	struct daemon *d = r->d;
	struct config *o = r->o, *n = r->n;

	for (int j = 0; j < r->nt; j++) {
		struct cfg_target *t = &n->targets[j];
		int oj = find_target(o, t->iqn);
		r->t_old[j] = oj;
		if (oj >= 0) {
			r->targets[j] = d->targets[oj];
			r->o_t_kept[oj] = true;
			if (!auth_eq(&o->targets[oj], t))
				log_info("%s:%d: [target %s]: allow list or CHAP changed; new logins use it, "
					 "sessions already logged in stay", n->path, t->line, t->iqn);
		} else {
			r->targets[j] = scsi_target_new(t->iqn);
			if (!r->targets[j]) {
				log_err("reload: out of memory");
				return -1;
			}
			r->t_new[j] = true;
			for (int k = 0; k < t->nluns; k++)
				if (scsi_target_map(r->targets[j], t->luns[k].lun,
						    r->lus[t->luns[k].lu - n->luns]) < 0) {
					log_err("reload: out of memory");
					return -1;
				}
		}
		r->ptargets[j] = daemon_portal_target(t, r->targets[j]);
	}
	*r->pc = *d->pc;
	r->pc->targets = r->ptargets;
	r->pc->ntargets = r->nt;
	/* discovery CHAP follows the new file (the old one is kept for logins
	 * in progress, as the targets' credentials are) */
	r->pc->disc_chap_user = n->disc_chap_user;
	r->pc->disc_chap_secret = n->disc_chap_secret;
	r->pc->disc_mutual_user = n->disc_mutual_user;
	r->pc->disc_mutual_secret = n->disc_mutual_secret;
	return 0;
}

static void reload_apply_log_level(struct reload *r)
{
	struct daemon *d = r->d;
	struct config *o = r->o, *n = r->n;

	if (strcmp(o->log_level, n->log_level)) {
		if (!d->debug)
			log_set_level(daemon_parse_level(n->log_level));
		log_info("%s: log_level is now %s%s", n->path, n->log_level, d->debug ? " (--debug overrides it)" : "");
	}
}

/* Mapping changes of the targets that stay; those that changed are
 * gathered in pub for publishing. */
static void reload_apply_maps(struct reload *r)
{
	struct config *o = r->o, *n = r->n;

	for (int j = 0; j < r->nt; j++) {
		int oj = r->t_old[j];
		if (oj < 0) {
			r->tgts_added++;
			log_info("reload: target %s added with %d LUN(s)", n->targets[j].iqn, n->targets[j].nluns);
			continue;
		}
		struct cfg_target *ot = &o->targets[oj], *t = &n->targets[j];
		bool changed = false;
		for (int k = 0; k < ot->nluns; k++)
			if (!has_mapping(t, ot->luns[k].lun, ot->luns[k].lun_name)) {
				scsi_target_unmap(r->targets[j], ot->luns[k].lun);
				log_info("reload: target %s: lun%llu (%s) removed", t->iqn,
					 (unsigned long long)ot->luns[k].lun, ot->luns[k].lun_name);
				r->maps_removed++;
				changed = true;
			}
		for (int k = 0; k < t->nluns; k++)
			if (!has_mapping(ot, t->luns[k].lun, t->luns[k].lun_name)) {
				if (scsi_target_map(r->targets[j], t->luns[k].lun, r->lus[t->luns[k].lu - n->luns]) < 0)
					log_err("%s:%d: target %s: cannot map lun%llu (out of memory)", n->path,
						t->luns[k].line, t->iqn, (unsigned long long)t->luns[k].lun);
				else
					log_info("reload: target %s: lun%llu = %s added", t->iqn,
						 (unsigned long long)t->luns[k].lun, t->luns[k].lun_name);
				r->maps_added++;
				changed = true;
			}
		if (changed)
			r->pub[r->npub++] = r->targets[j];
	}
}

/* Removed targets: no new nexus (a login already past the lookup fails);
 * the sessions they have are asked to log out by reload_close_retired.
 * They join pub from first_retired on. */
static void reload_retire_targets(struct reload *r)
{
	struct daemon *d = r->d;
	struct config *o = r->o;

	r->first_retired = r->npub;
	for (int oj = 0; oj < o->ntargets; oj++)
		if (!r->o_t_kept[oj]) {
			scsi_target_retire(d->targets[oj]);
			r->pub[r->npub++] = d->targets[oj];
			r->tgts_removed++;
			log_info("reload: target %s removed; its sessions are asked to log out", o->targets[oj].iqn);
		}
}

/* tierctl sees the new configuration; the old one and its arrays are
 * kept until exit (logins and sessions may still point into them). */
static void reload_swap_config(struct reload *r)
{
	struct daemon *d = r->d;

	control_lock();
	r->old_lus = d->lus;
	r->old_vols = d->vols;
	keep_old(d, d->lus);
	keep_old(d, d->vols);
	keep_old(d, d->serials);
	keep_old(d, d->targets);
	keep_old(d, d->portal_targets);
	keep_old(d, d->pc);
	d->cfg = r->n;
	d->lus = r->lus;
	d->vols = r->vols;
	d->serials = r->serials;
	d->targets = r->targets;
	d->portal_targets = r->ptargets;
	d->pc = r->pc;
	ctl_cache_update(r->n, r->vols);
	control_unlock();
	worker_set_poll_us(r->n->poll_us); /* takes effect at each worker's next wait */
	/* destage caps: at once (the sets are the same, in the same order, when they apply) */
	for (int i = 0; d->sets && i < r->n->ncaches && r->n->ncaches == r->o->ncaches; i++) {
		const struct cfg_cache *nc = &r->n->caches[i], *oc = &r->o->caches[i];
		if (!d->sets[i] || (nc->destage_max == oc->destage_max && nc->destage_max_iops == oc->destage_max_iops))
			continue;
		cache_set_destage_max(d->sets[i], nc->destage_max, nc->destage_max_iops);
		log_info("reload: [cache %s] destage_max %llu B/s, destage_max_iops %u (0: no cap)", nc->name,
			 (unsigned long long)nc->destage_max, nc->destage_max_iops);
	}
	/* io_timeout of the LUNs that stay: for the next look at each command */
	for (int i = 0; i < r->nl; i++) {
		const struct cfg_lun *nl = &r->n->luns[i], *ol = config_find_lun(r->o, nl->name);
		if (r->lu_new[i] || !ol || ol->io_timeout == nl->io_timeout || !r->lus[i])
			continue;
		char was[16] = "off", now[16] = "off";
		if (ol->io_timeout)
			snprintf(was, sizeof(was), "%u s", ol->io_timeout);
		if (nl->io_timeout)
			snprintf(now, sizeof(now), "%u s", nl->io_timeout);
		scsi_lu_set_io_timeout(r->lus[i], nl->io_timeout * 1000u);
		log_info("reload: [lun %s] io_timeout %s -> %s, for the commands in flight too", nl->name, was, now);
	}
	{
		struct config **v = realloc(d->old_cfgs, sizeof(*v) * (size_t)(d->nold_cfgs + 1));
		if (v) {
			d->old_cfgs = v;
			d->old_cfgs[d->nold_cfgs++] = r->o;
		} /* else: leaked; logins in progress may still read it */
	}
}

/*
 * Sessions of removed targets: asked to log out; each stops taking
 * new commands and closes once those in flight have answered. One
 * that outlasts the grace period loses its LUNs (it answers LOGICAL
 * UNIT NOT SUPPORTED) so that removed LUNs can close. The targets
 * are freed at exit.
 */
static void reload_close_retired(struct reload *r)
{
	struct daemon *d = r->d;
	struct scsi_target **pub = r->pub;
	int first_retired = r->first_retired, npub = r->npub;

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
}

/* Removed LUNs: no map holds them now; wait for their commands (one
 * deadline for all of them), then close */
static void reload_close_luns(struct reload *r)
{
	struct daemon *d = r->d;
	struct config *o = r->o;

	uint64_t end = now_ms() + RELOAD_DRAIN_MS;
	for (int oi = 0; oi < o->nluns; oi++) {
		if (r->o_lu_kept[oi])
			continue;
		struct scsi_lu *lu = r->old_lus[oi];
		const char *name = scsi_lu_name(lu);
		r->luns_removed++;
		while (scsi_lu_inflight(lu) > 0 && now_ms() < end) {
			watchdog_feed();
			sleep_ms(1);
		}
		publish_wait(NULL, 0); /* whatever touched it last has returned */
		if (scsi_lu_inflight(lu) > 0) {
			log_warn("reload: lun %s: %u command(s) still in flight after %u s; it stays open "
				 "(unreachable) until exit", name, scsi_lu_inflight(lu), RELOAD_DRAIN_MS / 1000);
			end = now_ms(); /* the others get one last look each, not another 30 s */
			if (park_lu(d, lu, NULL, NULL) < 0)
				log_err("reload: lun %s: out of memory; it is leaked", name);
		} else if (o->tcmu_enable) {
			log_info("reload: lun %s removed and drained; LIO (TCMU) may still use it, so it stays open "
				 "(unreachable) until exit", name);
			if (park_lu(d, lu, NULL, NULL) < 0)
				log_err("reload: lun %s: out of memory; it is leaked", name);
		} else if (r->old_vols[oi] && cache_vol_waits_destage(r->old_vols[oi])) {
			log_info("reload: lun %s removed and drained; its cache volume stays open (unreachable) "
				 "until its dirty data is destaged, then it is closed", name);
			if (park_lu(d, lu, r->old_vols[oi], &o->luns[oi]) < 0)
				log_err("reload: lun %s: out of memory; it is leaked", name);
		} else if (r->old_vols[oi]) {
			log_info("reload: lun %s removed and drained", name);
			release_cached(lu, r->old_vols[oi]);
		} else {
			log_info("reload: lun %s removed, drained and closed", name);
			scsi_lu_close(lu);
		}
	}
}

/* A reload applied: free what only it used, say what changed. */
static void reload_report(struct reload *r)
{
	free(r->lu_new);
	free(r->o_lu_kept);
	free(r->t_new);
	free(r->t_old);
	free(r->o_t_kept);
	free(r->pub);
	log_info("reload: %d LUN(s) added, %d removed; %d mapping(s) added, %d removed; %d target(s) added, "
		 "%d removed; %d setting(s) need a restart", r->luns_added, r->luns_removed, r->maps_added,
		 r->maps_removed, r->tgts_added, r->tgts_removed, r->restarts);
	sd_notifyf(0, "STATUS=serving: %d target(s), %d LUN(s)", r->n->ntargets, r->n->nluns);
}

/* A reload refused before anything was applied: close what it opened and
 * built, free the new configuration; the one in effect stays. */
static void reload_refuse(struct reload *r)
{
	for (int j = 0; r->targets && r->t_new && j < r->nt; j++)
		if (r->t_new[j])
			scsi_target_free(r->targets[j]);
	for (int i = 0; r->lus && r->lu_new && i < r->nl; i++)
		if (r->lu_new[i] && r->lus[i]) {
			/* a cache volume on a running set stays open until exit */
			if (r->vols[i] && park_lu(r->d, r->lus[i], NULL, NULL) == 0)
				continue;
			scsi_lu_close(r->lus[i]);
		}
	free(r->lus);
	free(r->vols);
	free(r->serials);
	free(r->lu_new);
	free(r->o_lu_kept);
	free(r->targets);
	free(r->t_new);
	free(r->t_old);
	free(r->o_t_kept);
	free(r->ptargets);
	free(r->pc);
	free(r->pub);
	config_free(r->n);
	log_err("reload refused: the configuration in effect stays as it was");
}

void daemon_reload(struct daemon *d)
{
	struct reload r = { .d = d, .o = d->cfg };

	log_info("SIGHUP: reloading %s", d->path);
	if (reload_parse(&r) < 0 || reload_keep_settings(&r) < 0 || reload_diff_luns(&r) < 0 ||
	    reload_diff_targets(&r) < 0) {
		reload_refuse(&r);
		return;
	}

	/* ---- from here on nothing is refused ---- */
	reload_apply_log_level(&r);
	reload_apply_maps(&r);
	/* logins and discovery see the new target list */
	iscsi_portal_update(r.pc);
	/* every nexus on every worker takes its new LUN list */
	publish_wait(r.pub, r.npub);
	reload_retire_targets(&r);
	reload_swap_config(&r);
	reload_close_retired(&r);
	reload_close_luns(&r);
	reload_report(&r);
}
