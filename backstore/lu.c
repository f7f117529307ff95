/*
 * lu.c - logical units, targets, I_T nexuses and unit attentions.
 *
 * This file owns the objects of scsi.h: opening and closing LUs (and the
 * registry of open LUs, through which EXTENDED COPY resolves target
 * descriptors across LUs), the LUN maps of targets and their publication
 * to the nexuses of a running configuration, the I_T nexuses with their
 * per-(nexus, LU) unit attention masks, and task management. What every
 * command goes through before its handler is in lu_dispatch.c.
 */
#include "backstore/lu.h"

#include "common/log.h"
#include "common/worker.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* ------------------------------------------------------------------ */
/* Registry of open LUs                                                */

/*
 * The list changes under both locks (open and close, main thread), so
 * either keeps it still. lu_registry_each holds walk_lock only: its fn may
 * block (the space monitor's statvfs on a hung NFS mount), and
 * lu_registry_find_naa, which EXTENDED COPY calls on a worker, takes
 * registry_lock only, so that no worker waits behind it. An LU that opens
 * or closes waits for a walk in progress.
 */
static pthread_mutex_t walk_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static struct scsi_lu *registry;

void lu_registry_each(void (*fn)(struct scsi_lu *lu, void *arg), void *arg)
{
	pthread_mutex_lock(&walk_lock);
	for (struct scsi_lu *lu = registry; lu; lu = lu->next_open)
		fn(lu, arg);
	pthread_mutex_unlock(&walk_lock);
}

struct scsi_lu *lu_registry_find_naa(const uint8_t *desig, size_t len)
{
	struct scsi_lu *found = NULL;

	if (len != sizeof(registry->naa))
		return NULL;
	pthread_mutex_lock(&registry_lock);
	for (struct scsi_lu *lu = registry; lu; lu = lu->next_open)
		if (!memcmp(lu->naa, desig, len)) {
			found = lu;
			break;
		}
	pthread_mutex_unlock(&registry_lock);
	return found;
}

/* ------------------------------------------------------------------ */
/* Logical units                                                       */

static void copy_padded(char *dst, size_t cap, const char *src, const char *dflt)
{
	snprintf(dst, cap, "%s", src && *src ? src : dflt);
}

/* NAA 3 (locally assigned): 60 bits of an FNV-1a hash of the serial, so
 * the designator is as stable as the serial itself. */
static void naa_from_serial(const char *serial, uint8_t out[8])
{
	uint64_t h = 0xcbf29ce484222325ull;
	for (const char *p = serial; *p; p++) {
		h ^= (uint8_t)*p;
		h *= 0x100000001b3ull;
	}
	h = (h & 0x0fffffffffffffffull) | (3ull << 60);
	be64_put(out, h);
}

/*
 * The shared backing store's ownership changed (bdev.h "Ownership"; on the
 * driver's thread): every nexus learns that the asymmetric access states
 * changed (SPC-4 5.15.2.5: ASYMMETRIC ACCESS STATE CHANGED on every I_T
 * nexus), so hosts read REPORT TARGET PORT GROUPS again. Entering
 * TRANSITION is not announced: commands meanwhile get NOT READY with the
 * transition ASC. The LU outlives its bdev's callbacks (scsi_lu_close
 * closes the bdev, which stops them, before freeing the LU).
 */
static void lu_owner_changed(void *arg, const struct bdev_owner_change *c)
{
	struct scsi_lu *lu = arg;

	if (c->state == BDEV_OWNER_TRANSITION)
		return;
	/* the other owner's writes were never seen here: no token stands */
	odx_cancel_lu(lu);
	pthread_mutex_lock(&lu->mutex);
	lu_ua_all_locked(lu, UA_ALUA_CHANGED, NULL);
	pthread_mutex_unlock(&lu->mutex);
}

struct scsi_lu *scsi_lu_open(const struct scsi_lu_config *cfg, struct bdev *dev,
			     char *err, size_t errlen)
{
	struct scsi_lu *lu;
	uint32_t bs = cfg->block_size ? cfg->block_size : dev->block_size;

	lu_dispatch_init();
	if (bs != 512 && bs != 4096) {
		snprintf(err, errlen, "lun \"%s\": block_size %u is not supported; use 512 or 4096",
			 cfg->name, bs);
		return NULL;
	}
	if (dev->block_size > bs || bs % dev->block_size || dev->size < bs) {
		snprintf(err, errlen, "lun \"%s\": backing %s (block size %u, %llu bytes) cannot hold %u-byte blocks",
			 cfg->name, dev->name, dev->block_size, (unsigned long long)dev->size, bs);
		return NULL;
	}
	lu = calloc(1, sizeof(*lu));
	if (!lu) {
		snprintf(err, errlen, "lun \"%s\": out of memory", cfg->name);
		return NULL;
	}
	static_assert(LU_SCAN_WORDS * 64 >= WORKERS_MAX, "a scan bit and call for every worker");
	lu->scan_call = calloc(LU_SCAN_WORDS * 64, sizeof(*lu->scan_call));
	if (!lu->scan_call) {
		free(lu);
		snprintf(err, errlen, "lun \"%s\": out of memory", cfg->name);
		return NULL;
	}
	if (lu_stats_init(lu) < 0) {
		free(lu->scan_call);
		free(lu);
		snprintf(err, errlen, "lun \"%s\": out of memory", cfg->name);
		return NULL;
	}
	lu->name = strdup(cfg->name ? cfg->name : "lun");
	lu->state_dir = cfg->state_dir ? strdup(cfg->state_dir) : NULL;
	copy_padded(lu->serial, sizeof(lu->serial), cfg->serial, lu->name);
	copy_padded(lu->vendor, sizeof(lu->vendor), cfg->vendor, "TIERCACH");
	copy_padded(lu->product, sizeof(lu->product), cfg->product, "tiercache");
	copy_padded(lu->revision, sizeof(lu->revision), cfg->revision, "0001");
	lu->dev = dev;
	lu->block_size = bs;
	lu->block_shift = (unsigned)__builtin_ctz(bs);
	lu->nblocks = dev->size / bs;
	lu->read_only = cfg->read_only;
	lu->tpg = cfg->target_port_group ? cfg->target_port_group : 1;
	lu->rel_port = cfg->rel_port_id ? cfg->rel_port_id : 1;
	naa_from_serial(lu->serial, lu->naa);
	lu->owner = bdev_is_shared(dev) ? dev->ops->owner : NULL;
	lu->alua_groups = cfg->alua_groups;
	atomic_init(&lu->wce, cfg->write_cache);
	lu->wce_default = cfg->write_cache;
	atomic_init(&lu->d_sense, false);
	atomic_init(&lu->resv_held, false);
	atomic_init(&lu->caw_active, 0);
	atomic_init(&lu->sanitizing, false);
	atomic_init(&lu->swp, false);
	for (int i = 0; i < LU_INFLIGHT_SLOTS; i++)
		atomic_init(&lu->inflight[i].n, 0);
	lu->tst = 0;
	lu->qerr = 0;
	lu->tas = 0;
	lu->ie_mrie = 0;
	lu->ie_dexcpt = true;
	pthread_mutex_init(&lu->mutex, NULL);
	if (!lu->name || (cfg->state_dir && !lu->state_dir)) {
		snprintf(err, errlen, "lun \"%s\": out of memory", cfg->name);
		goto fail;
	}
	if (pr_load(lu, err, errlen) < 0 || pr_shared_start(lu, err, errlen) < 0)
		goto fail;
	lu_space_init(lu, cfg->space_warn);
	atomic_init(&lu->io_timeout_ms, cfg->io_timeout_ms);

	pthread_mutex_lock(&walk_lock);
	pthread_mutex_lock(&registry_lock);
	lu->next_open = registry;
	registry = lu;
	pthread_mutex_unlock(&registry_lock);
	pthread_mutex_unlock(&walk_lock);
	if (lu->owner)
		lu->owner->listen(dev, lu_owner_changed, lu);
	return lu;
fail:
	pr_free(lu);
	pthread_mutex_destroy(&lu->mutex);
	free(lu->scan_call);
	free(lu->name);
	free(lu->state_dir);
	free(lu);
	return NULL;
}

/* Main thread, after every nexus that mapped lu is closed and no command
 * is in flight: the LU is freed with its bdev. */
void scsi_lu_close(struct scsi_lu *lu)
{
	if (!lu)
		return;
#ifdef TC_DEBUG
	/* Not an abort: a backing store that never answers (a hung device, a
	 * BDEV_FAULT_HANG) leaves commands counted at exit too. */
	if (scsi_lu_inflight(lu))
		log_err("lun \"%s\": closed with %u command(s) not completed", lu->name, scsi_lu_inflight(lu));
#endif
	pthread_mutex_lock(&walk_lock);
	pthread_mutex_lock(&registry_lock);
	for (struct scsi_lu **pp = &registry; *pp; pp = &(*pp)->next_open)
		if (*pp == lu) {
			*pp = lu->next_open;
			break;
		}
	pthread_mutex_unlock(&registry_lock);
	pthread_mutex_unlock(&walk_lock);
	pr_shared_stop(lu);
	xcopy_forget(NULL, lu);
	odx_forget(NULL, lu);
	pr_free(lu);
	/* entries of nexuses gone whose commands never came back (a hung
	 * device at exit) */
	for (struct nexus_lu *nl = lu->attached, *next; nl; nl = next) {
		next = nl->next_in_lu;
		if (atomic_load(&nl->inflight) & NL_DEAD)
			free(nl);
	}
	lu->attached = NULL;
	bdev_close(lu->dev);
	pthread_mutex_destroy(&lu->mutex);
	free(lu->scan_call);
	free(lu->stat);
	free(lu->name);
	free(lu->state_dir);
	free(lu);
}

void scsi_lu_set_capacity(struct scsi_lu *lu, uint64_t bytes)
{
	uint64_t nb = bytes >> lu->block_shift;
	pthread_mutex_lock(&lu->mutex);
	__atomic_store_n(&lu->nblocks, nb, __ATOMIC_RELAXED);
	lu_ua_all_locked(lu, UA_CAPACITY_CHANGED, NULL);
	pthread_mutex_unlock(&lu->mutex);
	log_info("lun %s: capacity now %llu blocks", lu->name, (unsigned long long)nb);
}

bool scsi_lu_ownership(const struct scsi_lu *lu, struct scsi_lu_ownership *out)
{
	if (!lu->owner)
		return false;
	out->generation = 0;
	out->state = (unsigned)lu->owner->state(lu->dev, &out->generation);
	out->port_group = lu->tpg;
	out->owner_port_group = lu->owner->owner_group ? lu->owner->owner_group(lu->dev) : 0;
	out->gateways = lu->alua_groups ? lu->alua_groups : 1;
	out->unowned_reads = atomic_load_explicit(&lu->unowned_reads, memory_order_relaxed);
	return true;
}

const char *scsi_lu_name(const struct scsi_lu *lu)
{
	return lu->name;
}

/* ------------------------------------------------------------------ */
/* Targets                                                             */

struct scsi_target *scsi_target_new(const char *iqn)
{
	struct scsi_target *t = calloc(1, sizeof(*t));
	if (!t)
		return NULL;
	t->iqn = strdup(iqn);
	if (!t->iqn) {
		free(t);
		return NULL;
	}
	pthread_mutex_init(&t->lock, NULL);
	return t;
}

int scsi_target_map(struct scsi_target *t, uint64_t lun, struct scsi_lu *lu)
{
	int i, r = 0;

	pthread_mutex_lock(&t->lock);
	for (i = 0; i < t->nmaps; i++)
		if (t->maps[i].lun == lun) {
			r = -EEXIST;
			goto out;
		}
	struct tgt_map *m = realloc(t->maps, sizeof(*m) * (size_t)(t->nmaps + 1));
	if (!m) {
		r = -ENOMEM;
		goto out;
	}
	t->maps = m;
	for (i = t->nmaps; i > 0 && m[i - 1].lun > lun; i--)
		m[i] = m[i - 1];
	m[i].lun = lun;
	m[i].lu = lu;
	t->nmaps++;
out:
	pthread_mutex_unlock(&t->lock);
	return r;
}

int scsi_target_unmap(struct scsi_target *t, uint64_t lun)
{
	int r = -ENOENT;

	pthread_mutex_lock(&t->lock);
	for (int i = 0; i < t->nmaps; i++)
		if (t->maps[i].lun == lun) {
			memmove(&t->maps[i], &t->maps[i + 1], sizeof(t->maps[0]) * (size_t)(t->nmaps - i - 1));
			t->nmaps--;
			r = 0;
			break;
		}
	pthread_mutex_unlock(&t->lock);
	return r;
}

void scsi_target_retire(struct scsi_target *t)
{
	pthread_mutex_lock(&t->lock);
	t->retired = true;
	t->nmaps = 0;
	pthread_mutex_unlock(&t->lock);
}

int scsi_target_nexus_count(struct scsi_target *t)
{
	int n = 0;

	pthread_mutex_lock(&t->lock);
	for (struct scsi_nexus *nx = t->nexuses; nx; nx = nx->tgt_next)
		n++;
	pthread_mutex_unlock(&t->lock);
	return n;
}

unsigned scsi_lu_inflight(struct scsi_lu *lu)
{
	unsigned sum = 0;
	for (int i = 0; i < LU_INFLIGHT_SLOTS; i++)
		sum += atomic_load_explicit(&lu->inflight[i].n, memory_order_acquire);
	return sum;
}

void scsi_target_free(struct scsi_target *t)
{
	if (!t)
		return;
	pthread_mutex_destroy(&t->lock);
	free(t->maps);
	free(t->iqn);
	free(t);
}

const char *scsi_target_name(const struct scsi_target *t)
{
	return t->iqn;
}

void scsi_target_count_refused(struct scsi_target *t)
{
	atomic_fetch_add_explicit(&t->logins_refused, 1, memory_order_relaxed);
}

void scsi_target_counts(struct scsi_target *t, unsigned *sessions, uint64_t *refused)
{
	unsigned n = 0;
	pthread_mutex_lock(&t->lock);
	for (struct scsi_nexus *x = t->nexuses; x; x = x->tgt_next)
		n++;
	pthread_mutex_unlock(&t->lock);
	*sessions = n;
	*refused = atomic_load_explicit(&t->logins_refused, memory_order_relaxed);
}

/* ------------------------------------------------------------------ */
/* Nexuses and unit attentions                                         */

static struct nexus_lu *nexus_lu_attach(struct scsi_nexus *nx, uint64_t lun, struct scsi_lu *lu)
{
	struct nexus_lu *nl = calloc(1, sizeof(*nl));
	if (!nl)
		return NULL;
	nl->nx = nx;
	nl->lu = lu;
	nl->lun = lun;
	atomic_init(&nl->ua, UA_POWER_ON);
	nl->mode_seen = lu_mode_state(lu);
	pthread_mutex_lock(&lu->mutex);
	nl->next_in_lu = lu->attached;
	lu->attached = nl;
	/* a threshold passed before this nexus came (a host logging in to a
	 * LUN that is already short of space): it is told too. Read under
	 * the mutex: the monitor sets space_tripped before taking it to tell
	 * the attached nexuses, so one of the two reaches this one. */
	if (atomic_load(&lu->space_tripped) && atomic_load(&lu->lbpere))
		atomic_fetch_or(&nl->ua, UA_SPACE_SOFT);
	pthread_mutex_unlock(&lu->mutex);
	return nl;
}

/* Locked. */
static void nexus_lu_unlink(struct scsi_lu *lu, struct nexus_lu *nl)
{
	for (struct nexus_lu **pp = &lu->attached; *pp; pp = &(*pp)->next_in_lu)
		if (*pp == nl) {
			*pp = nl->next_in_lu;
			break;
		}
}

/*
 * The nexus no longer maps the LUN (its nexus's list no longer holds nl).
 * With none of its commands in flight, nl goes now; else it stays on
 * lu->attached, marked dead and still counted, and its last command frees
 * it (nexus_lu_last_gone): a reload that unmaps a LUN under I/O must not
 * leave those commands a freed count to decrement.
 */
static void nexus_lu_detach(struct nexus_lu *nl)
{
	struct scsi_lu *lu = nl->lu;

	pr_nexus_gone(lu, nl->nx);
	pthread_mutex_lock(&lu->mutex);
	nl->prevent = false; /* a gone nexus prevents no removal */
	uint32_t was = atomic_fetch_or(&nl->inflight, NL_DEAD);
	if (!was)
		nexus_lu_unlink(lu, nl);
	pthread_mutex_unlock(&lu->mutex);
	if (!was)
		free(nl);
}

void nexus_lu_last_gone(struct nexus_lu *nl)
{
	struct scsi_lu *lu = nl->lu;

	pthread_mutex_lock(&lu->mutex);
	nexus_lu_unlink(lu, nl);
	pthread_mutex_unlock(&lu->mutex);
	free(nl);
	if (atomic_load(&lu->pa_waiting))
		lu_pa_poke(lu);
}

/*
 * Bring nx's LUN list to t's map (t->lock held; on nx's worker, or on any
 * thread when nx has none). Mappings that stay keep their nexus_lu (and
 * its pending unit attentions); new ones start with POWER ON; if anything
 * changed, the kept ones get REPORTED LUNS DATA HAS CHANGED.
 */
static void nexus_resync_locked(struct scsi_nexus *nx)
{
	struct scsi_target *t = nx->tgt;
	struct nexus_lu **nv = calloc((size_t)(t->nmaps ? t->nmaps : 1), sizeof(*nv));
	bool *kept = calloc((size_t)(nx->nlus ? nx->nlus : 1), sizeof(*kept));
	int n = 0;
	bool changed = false;

	if (!nv || !kept) {
		log_err("%s: out of memory updating the LUN list of %s; it keeps the old one", t->iqn,
			nx->i_port);
		free(nv);
		free(kept);
		return;
	}
	for (int i = 0; i < t->nmaps; i++) {
		struct nexus_lu *nl = NULL;
		for (int j = 0; j < nx->nlus; j++)
			if (!kept[j] && nx->lus[j]->lun == t->maps[i].lun && nx->lus[j]->lu == t->maps[i].lu) {
				nl = nx->lus[j];
				kept[j] = true;
				break;
			}
		if (!nl) {
			nl = nexus_lu_attach(nx, t->maps[i].lun, t->maps[i].lu);
			if (!nl) {
				log_err("%s: out of memory adding LUN %llu for %s", t->iqn,
					(unsigned long long)t->maps[i].lun, nx->i_port);
				continue;
			}
			changed = true;
		}
		nv[n++] = nl;
	}
	for (int j = 0; j < nx->nlus; j++)
		if (!kept[j]) {
			nexus_lu_detach(nx->lus[j]);
			changed = true;
		}
	if (changed)
		for (int i = 0; i < n; i++)
			if (!(atomic_load(&nv[i]->ua) & UA_POWER_ON))
				atomic_fetch_or(&nv[i]->ua, UA_LUNS_CHANGED);
	free(kept);
	free(nx->lus);
	nx->lus = nv;
	nx->nlus = n;
}

struct scsi_publish {
	atomic_int pending;
	int nt;
	struct scsi_target *t[];
};

static void publish_on_worker(void *arg)
{
	struct scsi_publish *p = arg;
	struct worker *self = worker_self();

	for (int i = 0; i < p->nt; i++) {
		struct scsi_target *t = p->t[i];
		pthread_mutex_lock(&t->lock);
		for (struct scsi_nexus *nx = t->nexuses; nx; nx = nx->tgt_next)
			if (nx->worker == self)
				nexus_resync_locked(nx);
		pthread_mutex_unlock(&t->lock);
	}
	/* the last access to p: the main thread frees it once this is 0 */
	atomic_fetch_sub_explicit(&p->pending, 1, memory_order_release);
}

struct scsi_publish *scsi_target_publish_start(struct scsi_target *const *t, int nt)
{
	unsigned nw = workers_count();
	struct scsi_publish *p = calloc(1, sizeof(*p) + sizeof(p->t[0]) * (size_t)(nt ? nt : 1));

	if (!p)
		return NULL;
	p->nt = nt;
	if (nt)
		memcpy(p->t, t, sizeof(p->t[0]) * (size_t)nt);
	atomic_init(&p->pending, (int)nw);
	/* nexuses opened off the workers (unit tests, tools): right here */
	for (int i = 0; i < nt; i++) {
		pthread_mutex_lock(&t[i]->lock);
		for (struct scsi_nexus *nx = t[i]->nexuses; nx; nx = nx->tgt_next)
			if (!nx->worker)
				nexus_resync_locked(nx);
		pthread_mutex_unlock(&t[i]->lock);
	}
	for (unsigned w = 0; w < nw; w++)
		worker_post_wait(worker_get(w), publish_on_worker, p);
	return p;
}

bool scsi_target_publish_done(struct scsi_publish *p)
{
	if (atomic_load_explicit(&p->pending, memory_order_acquire) > 0)
		return false;
	free(p);
	return true;
}

struct scsi_nexus *scsi_nexus_open(struct scsi_target *t, const char *initiator_name,
				   const uint8_t isid[6], uint16_t tpgt)
{
	struct scsi_nexus *nx = calloc(1, sizeof(*nx));
	if (!nx)
		return NULL;
	nx->tgt = t;
	nx->worker = worker_self();
	snprintf(nx->initiator_name, sizeof(nx->initiator_name), "%s", initiator_name);
	memcpy(nx->isid, isid, 6);
	nx->tpgt = tpgt;
	snprintf(nx->i_port, sizeof(nx->i_port), "%s,i,0x%02x%02x%02x%02x%02x%02x", initiator_name,
		 isid[0], isid[1], isid[2], isid[3], isid[4], isid[5]);
	snprintf(nx->t_port, sizeof(nx->t_port), "%s,t,0x%04x", t->iqn, tpgt);
	pthread_mutex_lock(&t->lock);
	if (t->retired) {
		pthread_mutex_unlock(&t->lock);
		free(nx);
		return NULL;
	}
	nx->lus = calloc((size_t)(t->nmaps ? t->nmaps : 1), sizeof(*nx->lus));
	if (!nx->lus) {
		pthread_mutex_unlock(&t->lock);
		free(nx);
		return NULL;
	}
	for (int i = 0; i < t->nmaps; i++) {
		struct nexus_lu *nl = nexus_lu_attach(nx, t->maps[i].lun, t->maps[i].lu);
		if (!nl) {
			for (int j = 0; j < nx->nlus; j++)
				nexus_lu_detach(nx->lus[j]);
			pthread_mutex_unlock(&t->lock);
			free(nx->lus);
			free(nx);
			return NULL;
		}
		nx->lus[nx->nlus++] = nl;
	}
	nx->tgt_next = t->nexuses;
	t->nexuses = nx;
	pthread_mutex_unlock(&t->lock);
	return nx;
}

void scsi_nexus_close(struct scsi_nexus *nx)
{
	if (!nx)
		return;
	struct scsi_target *t = nx->tgt;
	pthread_mutex_lock(&t->lock);
	for (struct scsi_nexus **pp = &t->nexuses; *pp; pp = &(*pp)->tgt_next)
		if (*pp == nx) {
			*pp = nx->tgt_next;
			break;
		}
	for (int i = 0; i < nx->nlus; i++)
		nexus_lu_detach(nx->lus[i]);
	pthread_mutex_unlock(&t->lock);
	xcopy_forget(nx, NULL);
	odx_forget(nx, NULL);
	free(nx->lus);
	free(nx);
}

static struct nexus_lu *nexus_find(struct scsi_nexus *nx, uint64_t lun)
{
	int lo = 0, hi = nx->nlus - 1;
	while (lo <= hi) {
		int mid = (lo + hi) / 2;
		if (nx->lus[mid]->lun == lun)
			return nx->lus[mid];
		if (nx->lus[mid]->lun < lun)
			lo = mid + 1;
		else
			hi = mid - 1;
	}
	return NULL;
}

bool scsi_nexus_has_lun(struct scsi_nexus *nx, uint64_t lun)
{
	return nexus_find(nx, lun) != NULL;
}

struct nexus_lu *scsi_cmd_nlu(struct scsi_cmd *cmd)
{
	return cmd->nexus ? nexus_find(cmd->nexus, cmd->lun) : NULL;
}

void lu_ua_all_locked(struct scsi_lu *lu, unsigned ua, const struct scsi_nexus *skip)
{
	for (struct nexus_lu *nl = lu->attached; nl; nl = nl->next_in_lu)
		if (nl->nx != skip)
			atomic_fetch_or(&nl->ua, ua);
}

void lu_ua_port_locked(struct scsi_lu *lu, unsigned ua, const char *i_port, const char *t_port)
{
	for (struct nexus_lu *nl = lu->attached; nl; nl = nl->next_in_lu)
		if (!strcmp(nl->nx->i_port, i_port) && (!t_port || !strcmp(nl->nx->t_port, t_port)))
			atomic_fetch_or(&nl->ua, ua);
}

unsigned lu_port_inflight_locked(struct scsi_lu *lu, const char *i_port, const char *t_port,
				 const struct scsi_nexus *skip, int ep)
{
	unsigned n = 0;
	for (struct nexus_lu *nl = lu->attached; nl; nl = nl->next_in_lu)
		if (nl->nx != skip && !strcmp(nl->nx->i_port, i_port) && (!t_port || !strcmp(nl->nx->t_port, t_port))) {
			uint32_t v = atomic_load(&nl->inflight);
			if (ep != 1)
				n += v & NL_COUNT_MASK;
			if (ep != 0)
				n += (v >> NL_ODD_SHIFT) & NL_COUNT_MASK;
		}
	return n;
}

int lu_pa_epoch_next_locked(struct scsi_lu *lu)
{
	return (int)(atomic_fetch_add(&lu->pa_epoch, 1) & 1);
}

bool lu_drain_port(struct scsi_lu *lu, const char *i_port, const char *t_port, const struct scsi_nexus *skip,
		   int ep, uint64_t end_ns)
{
	for (;;) {
		pthread_mutex_lock(&lu->mutex);
		unsigned n = lu_port_inflight_locked(lu, i_port, t_port, skip, ep);
		pthread_mutex_unlock(&lu->mutex);
		if (!n)
			return true;
		if (lu_now_ns() > end_ns)
			return false;
		struct timespec ts = { 0, 1000000 };
		nanosleep(&ts, NULL);
	}
}

static uint16_t ua_asc(unsigned bit)
{
	switch (bit) {
	case UA_POWER_ON: return ASC_POWER_ON_RESET;
	case UA_LU_RESET: return ASC_BUS_DEVICE_RESET;
	case UA_NEXUS_LOSS: return ASC_I_T_NEXUS_LOSS;
	case UA_COMMANDS_CLEARED: return ASC_COMMANDS_CLEARED_BY_ANOTHER;
	case UA_RESERVATIONS_PREEMPTED: return ASC_RESERVATIONS_PREEMPTED;
	case UA_RESERVATIONS_RELEASED: return ASC_RESERVATIONS_RELEASED;
	case UA_REGISTRATIONS_PREEMPTED: return ASC_REGISTRATIONS_PREEMPTED;
	case UA_MODE_CHANGED: return ASC_MODE_PARAMETERS_CHANGED;
	case UA_CAPACITY_CHANGED: return ASC_CAPACITY_DATA_CHANGED;
	case UA_ALUA_CHANGED: return ASC_ASYMMETRIC_ACCESS_STATE_CHANGED;
	case UA_SPACE_SOFT: return ASC_THIN_PROV_SOFT_THRESHOLD;
	default: return ASC_REPORTED_LUNS_CHANGED;
	}
}

/*
 * Take the highest-priority pending UA of nl (clearing it) and return its
 * ASC, or 0 when none. Used by dispatch and REQUEST SENSE. Any thread;
 * lock-free (the mask is an atomic).
 */
unsigned lu_mode_state(const struct scsi_lu *lu)
{
	return (atomic_load(&lu->wce) ? 1u : 0) | (atomic_load(&lu->d_sense) ? 2u : 0) |
	       (atomic_load(&lu->swp) ? 4u : 0) | (atomic_load(&lu->lbpere) ? 8u : 0);
}

uint16_t lu_ua_take(struct nexus_lu *nl)
{
	unsigned cur = atomic_load(&nl->ua);
	while (cur) {
		unsigned bit = cur & -cur;
		if (!atomic_compare_exchange_weak(&nl->ua, &cur, cur & ~bit))
			continue;
		if (bit == UA_MODE_CHANGED) {
			/* parameters changed and changed back: nothing to report */
			unsigned now = lu_mode_state(nl->lu);
			if (now == nl->mode_seen) {
				cur &= ~bit;
				continue;
			}
			nl->mode_seen = now;
		}
		return ua_asc(bit);
	}
	return 0;
}

/* ------------------------------------------------------------------ */
/* Task management                                                     */

static void lu_reset(struct scsi_lu *lu, unsigned ua)
{
	pthread_mutex_lock(&lu->mutex);
	lu_ua_all_locked(lu, ua, NULL);
	for (struct nexus_lu *nl = lu->attached; nl; nl = nl->next_in_lu)
		nl->prevent = false;
	pthread_mutex_unlock(&lu->mutex);
	pr_lu_reset(lu);
}

enum scsi_tmf_response scsi_task_mgmt(struct scsi_nexus *nx, enum scsi_tmf fn, uint64_t lun)
{
	struct nexus_lu *nl = nexus_find(nx, lun);

	switch (fn) {
	case SCSI_TMF_ABORT_TASK:
	case SCSI_TMF_ABORT_TASK_SET:
		return nl ? SCSI_TMF_RSP_COMPLETE : SCSI_TMF_RSP_NO_LUN;
	case SCSI_TMF_CLEAR_TASK_SET:
		if (!nl)
			return SCSI_TMF_RSP_NO_LUN;
		pthread_mutex_lock(&nl->lu->mutex);
		lu_ua_all_locked(nl->lu, UA_COMMANDS_CLEARED, nx);
		pthread_mutex_unlock(&nl->lu->mutex);
		return SCSI_TMF_RSP_COMPLETE;
	case SCSI_TMF_CLEAR_ACA:
		return nl ? SCSI_TMF_RSP_NOT_SUPPORTED : SCSI_TMF_RSP_NO_LUN;
	case SCSI_TMF_LOGICAL_UNIT_RESET:
		if (!nl)
			return SCSI_TMF_RSP_NO_LUN;
		lu_reset(nl->lu, UA_LU_RESET);
		return SCSI_TMF_RSP_COMPLETE;
	case SCSI_TMF_TARGET_WARM_RESET:
	case SCSI_TMF_TARGET_COLD_RESET:
		for (int i = 0; i < nx->nlus; i++)
			lu_reset(nx->lus[i]->lu, fn == SCSI_TMF_TARGET_COLD_RESET ? UA_POWER_ON : UA_LU_RESET);
		return SCSI_TMF_RSP_COMPLETE;
	}
	return SCSI_TMF_RSP_NOT_SUPPORTED;
}
