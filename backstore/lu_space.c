/*
 * lu_space.c - thin provisioning thresholds (SBC-4 4.7.3.7): how full the
 * space under an LU is, and telling hosts before it runs out.
 *
 * A monitor thread looks at every open LU's backing store (bdev_space: a
 * file's filesystem, an RBD pool) every few seconds. With a threshold
 * configured ([lun] space_warn = P%), the LU is "passed" when the pool is
 * P% used or more, or the LU itself has allocated P% of its capacity; it
 * re-arms once both are 2 points below P. Passing it gives every I_T
 * nexus of the LU one THIN PROVISIONING SOFT THRESHOLD REACHED unit
 * attention (SITUA is zero), whose INFORMATION is the offset of the
 * threshold descriptor that tripped in the Logical Block Provisioning mode
 * page, unless a host turned LBPERE off in the read-write error recovery
 * page. ESXi answers it by warning the administrator (and, with
 * space-efficient datastores, by stunning only the VMs that then meet
 * out-of-space), where a target that says nothing lets writes fail.
 *
 * The page has two soft thresholds, as SBC-4 table 7 pairs them:
 *  - 16: available LBA mapping resources, armed decreasing, at (100 - P)%
 *    of the pool (the pool passing P% used);
 *  - 24: used LBA mapping resources, armed increasing, at P% of the LU's
 *    capacity.
 * Counts are in threshold sets of 2^thr_exp blocks (1 MiB, or more on an
 * LU too large for 32-bit counts), the exponent VPD B2 reports. LOG SENSE
 * page 0Ch reports the same two resources from the last look: available
 * (the pool's free space, shared with whatever else uses the pool) and
 * used (the LU's own allocation).
 *
 * Threading: the monitor thread polls; everything else reads the atomics.
 * MODE SENSE and LOG SENSE run on workers and never touch the device.
 */
#include "backstore/lu.h"

#include "common/log.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void lu_space_init(struct scsi_lu *lu, unsigned warn_pct)
{
	lu->space_warn = (uint8_t)(warn_pct < 100 ? warn_pct : 99);
	unsigned e = lu->block_shift < 20 ? 20 - lu->block_shift : 0;
	while (e < 63 && (lu->nblocks >> e) > 0xffffffffull)
		e++;
	lu->thr_exp = (uint8_t)e;
	atomic_init(&lu->lbpere, lu->space_warn != 0);
	atomic_init(&lu->space_known, false);
	atomic_init(&lu->space_alloc_known, false);
	atomic_init(&lu->space_tripped, false);
	atomic_init(&lu->space_ua_info, 0);
	atomic_init(&lu->space_pool, 0);
	atomic_init(&lu->space_free, 0);
	atomic_init(&lu->space_alloc, 0);
	scsi_lu_space_poll(lu); /* LOG SENSE has figures from the start */
}

static uint64_t set_bytes(const struct scsi_lu *lu)
{
	return (uint64_t)lu->block_size << lu->thr_exp;
}

static uint32_t sets32(uint64_t v)
{
	return v > 0xffffffffull ? 0xffffffffu : (uint32_t)v;
}

static int pct_of(uint64_t part, uint64_t whole)
{
	if (!whole)
		return -1;
	if (part > whole)
		part = whole;
	return (int)((unsigned __int128)part * 100 / whole);
}

static uint64_t capacity_bytes(const struct scsi_lu *lu)
{
	return __atomic_load_n(&lu->nblocks, __ATOMIC_RELAXED) << lu->block_shift;
}

void scsi_lu_space_poll(struct scsi_lu *lu)
{
	struct bdev_space sp;
	int r = bdev_space(lu->dev, &sp);
	if (r < 0) {
		if (r != -ENOTSUP && !lu->space_err_logged)
			log_warn("lun %s: cannot tell how much space %s has left: %s", lu->name, lu->dev->name,
				 strerror(-r));
		lu->space_err_logged = r != -ENOTSUP;
		return;
	}
	if (lu->space_err_logged)
		log_info("lun %s: the space of %s can be read again", lu->name, lu->dev->name);
	lu->space_err_logged = false;
	atomic_store(&lu->space_pool, sp.pool_bytes);
	atomic_store(&lu->space_free, sp.pool_free);
	atomic_store(&lu->space_alloc, sp.alloc);
	atomic_store(&lu->space_alloc_known, sp.alloc_known);
	atomic_store(&lu->space_known, true);
	if (!lu->space_warn)
		return;

	int warn = lu->space_warn;
	int pool = pct_of(sp.pool_bytes - (sp.pool_free < sp.pool_bytes ? sp.pool_free : sp.pool_bytes),
			  sp.pool_bytes);
	int own = sp.alloc_known ? pct_of(sp.alloc, capacity_bytes(lu)) : -1;
	bool tripped = atomic_load(&lu->space_tripped);
	if (!tripped && (pool >= warn || own >= warn)) {
		uint32_t desc = pool >= warn ? LU_LBP_DESC_AVAIL : LU_LBP_DESC_USED;
		atomic_store(&lu->space_ua_info, desc);
		atomic_store(&lu->space_tripped, true);
		bool tell = atomic_load(&lu->lbpere);
		if (desc == LU_LBP_DESC_AVAIL)
			log_warn("lun %s: the space under %s is %d%% used, past space_warn = %d%%; %s", lu->name,
				 lu->dev->name, pool, warn,
				 tell ? "hosts are told (THIN PROVISIONING SOFT THRESHOLD REACHED)"
				      : "a host turned the warning off (LBPERE)");
		else
			log_warn("lun %s: %d%% of its capacity is allocated in %s, past space_warn = %d%%; %s",
				 lu->name, own, lu->dev->name, warn,
				 tell ? "hosts are told (THIN PROVISIONING SOFT THRESHOLD REACHED)"
				      : "a host turned the warning off (LBPERE)");
		if (tell) {
			pthread_mutex_lock(&lu->mutex);
			lu_ua_all_locked(lu, UA_SPACE_SOFT, NULL);
			pthread_mutex_unlock(&lu->mutex);
		}
	} else if (tripped && pool <= (warn > 2 ? warn - 2 : 0) && own <= (warn > 2 ? warn - 2 : 0)) {
		atomic_store(&lu->space_tripped, false);
		log_info("lun %s: space back under space_warn = %d%% (pool %d%% used, the LUN %d%% allocated); "
			 "the warning is armed again", lu->name, warn, pool, own);
	}
}

bool scsi_lu_space(const struct scsi_lu *lu, struct scsi_lu_space *out)
{
	struct scsi_lu *l = (struct scsi_lu *)lu; /* the atomics only */
	if (!atomic_load(&l->space_known))
		return false;
	out->pool_bytes = atomic_load(&l->space_pool);
	out->pool_free = atomic_load(&l->space_free);
	out->alloc = atomic_load(&l->space_alloc);
	out->pool_used_pct = pct_of(out->pool_bytes - (out->pool_free < out->pool_bytes ? out->pool_free
											 : out->pool_bytes),
				    out->pool_bytes);
	out->alloc_pct = atomic_load(&l->space_alloc_known) ? pct_of(out->alloc, capacity_bytes(lu)) : -1;
	out->warn_pct = lu->space_warn;
	out->warning = atomic_load(&l->space_tripped);
	return true;
}

/* ---- mode page 1Ch/02h and log page 0Ch ---- */

#define MP_PC_CHANGEABLE 1

static void desc_put(uint8_t *d, uint8_t arming, uint8_t resource, uint32_t count)
{
	d[0] = (uint8_t)(0x80 | arming); /* ENABLED; THRESHOLD TYPE 000b: soft */
	d[1] = resource;
	d[2] = d[3] = 0;
	be32_put(d + 4, count);
}

size_t lu_space_mode_page(struct scsi_lu *lu, int pc, uint8_t *b)
{
	if (!lu->space_warn)
		return 0;
	size_t len = 32;
	memset(b, 0, len);
	b[0] = 0x40 | 0x1c; /* SPF */
	b[1] = 0x02;
	be16_put(b + 2, (uint16_t)(len - 4));
	if (pc == MP_PC_CHANGEABLE)
		return len; /* nothing: the threshold is the configuration's */
	/* SITUA 0: every nexus is told */
	uint64_t set = set_bytes(lu);
	uint64_t pool_sets = atomic_load(&lu->space_pool) / set;
	uint64_t cap_sets = capacity_bytes(lu) / set;
	desc_put(b + LU_LBP_DESC_AVAIL, 0 /* armed decreasing */, 0x01,
		 sets32(pool_sets * (100u - lu->space_warn) / 100u));
	desc_put(b + LU_LBP_DESC_USED, 1 /* armed increasing */, 0x02, sets32(cap_sets * lu->space_warn / 100u));
	return len;
}

static size_t log_param(uint8_t *p, uint16_t code, uint32_t count, uint8_t scope)
{
	be16_put(p, code);
	p[2] = 0x03; /* binary format list: FORMAT AND LINKING 11b */
	p[3] = 8;
	be32_put(p + 4, count);
	p[8] = scope;
	p[9] = p[10] = p[11] = 0;
	return 12;
}

size_t lu_space_log_page(struct scsi_lu *lu, uint8_t *b)
{
	uint64_t set = set_bytes(lu);
	size_t off = 4;
	memset(b, 0, 4);
	b[0] = 0x80 | 0x0c; /* DS: nothing to save */
	if (atomic_load(&lu->space_known)) {
		/* available: the pool's free space, which others use too (scope 10b) */
		off += log_param(b + off, 0x0001, sets32(atomic_load(&lu->space_free) / set), 0x02);
		/* used: this LU's own allocation (scope 01b) */
		if (atomic_load(&lu->space_alloc_known))
			off += log_param(b + off, 0x0002, sets32((atomic_load(&lu->space_alloc) + set - 1) / set),
					 0x01);
	}
	be16_put(b + 2, (uint16_t)(off - 4));
	return off;
}

/* ---- the monitor thread ---- */

static pthread_t mon_thread;
static bool mon_running, mon_stopping;
static unsigned mon_interval;
static pthread_mutex_t mon_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t mon_wake = PTHREAD_COND_INITIALIZER;

static void poll_one(struct scsi_lu *lu, void *arg)
{
	(void)arg;
	scsi_lu_space_poll(lu);
}

static void *mon_main(void *arg)
{
	(void)arg;
	pthread_setname_np(pthread_self(), "tc-space");
	pthread_mutex_lock(&mon_lock);
	while (!mon_stopping) {
		pthread_mutex_unlock(&mon_lock);
		lu_registry_each(poll_one, NULL);
		pthread_mutex_lock(&mon_lock);
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += mon_interval;
		while (!mon_stopping && pthread_cond_timedwait(&mon_wake, &mon_lock, &ts) == 0)
			;
	}
	pthread_mutex_unlock(&mon_lock);
	return NULL;
}

int scsi_space_monitor_start(unsigned interval_s)
{
	mon_interval = interval_s ? interval_s : 10;
	mon_stopping = false;
	if (pthread_create(&mon_thread, NULL, mon_main, NULL))
		return -1;
	mon_running = true;
	return 0;
}

void scsi_space_monitor_stop(void)
{
	if (!mon_running)
		return;
	pthread_mutex_lock(&mon_lock);
	mon_stopping = true;
	pthread_cond_signal(&mon_wake);
	pthread_mutex_unlock(&mon_lock);
	pthread_join(mon_thread, NULL);
	mon_running = false;
}
