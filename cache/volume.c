/*
 * volume.c - the cache volume: the bdev a LUN sees, stacked on its backing
 * bdev and the set's mirrored legs.
 *
 * A request is cut at extent boundaries into pieces; each piece finds its
 * slot with a lock-free lookup (RCU read lock held only around the lookup
 * and the pin: a pin is a count in the slot, so an evictor that waited a
 * grace period knows whether anyone still uses the slot) and then goes:
 *
 *   READ   hit: from the legs; partial hit: valid runs from the legs,
 *          the rest from the backing store, and a top-up of the missing
 *          blocks (see "top-ups"); miss: from the backing store, and a
 *          promotion (fill) of the whole extent if the policy admits.
 *   WRITE  write-back: data to the legs (FUA), then a DIRTY journal record;
 *          acknowledged when the record is durable (group commit), so every
 *          acknowledged write is durable whatever FUA/WCE say.
 *          write-through: backing first (with the initiator's FUA), then the
 *          cached copy is refreshed. write-around: backing, then the cached
 *          blocks invalidated durably. A miss that is not admitted, or
 *          finds no free slot, goes to the backing store ("bypass").
 *   FLUSH  the backing store's (leg writes are all FUA already).
 *   UNMAP, WRITE_ZEROES  passed down, then the cached blocks invalidated
 *          durably before the status goes out (dirty data never resurfaces:
 *          the cleaner stays off the slot meanwhile).
 *
 * Races handled here:
 *  - a write meets a fill in flight: the write sets CANCEL and goes to the
 *    backing store; the fill is dropped when it completes.
 *  - a fill starts while a bypass write of the same extent is in flight: the
 *    per-bucket bypass counter (incremented before the lookup) makes the
 *    fill give up, so it never caches data older than an acknowledged write.
 *  - UNMAP meets the cleaner destaging the slot: it waits (re-posted) until
 *    the destage ends, so old dirty data is not written after the UNMAP;
 *    while the UNMAP holds its writer pin no destage of the slot starts.
 *  - both legs gone: reads of clean blocks go to the backing store, reads
 *    of dirty blocks fail with -EIO (MEDIUM ERROR), never old data.
 *
 * This file: the volume object, requests cut into pieces, their
 * completion and pinning, and submit. The paths of a piece live in
 * vol_read.c and vol_write.c, fills and top-ups in fill.c, shared backing
 * stores in owner.c; what they share in vol_int.h.
 *
 * Threading: vol_submit on a worker, completions on that worker. Contexts
 * come from per-thread free lists (no malloc per command in steady state).
 */
#include "cache/cache_int.h"
#include "cache/vol_int.h"

#include "common/log.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

__thread struct piece *piece_free;
__thread struct vsub *vsub_free;
__thread struct vreq *vreq_free;
__thread struct fill *fill_free;
__thread struct topup *topup_free;

/* Worker exit (worker_exit_hook): free this thread's cached contexts. */
void volume_thread_release(void)
{
	POOL_RELEASE(piece_free);
	POOL_RELEASE(vsub_free);
	POOL_RELEASE(vreq_free);
	POOL_RELEASE(fill_free);
	POOL_RELEASE(topup_free);
}

const char *cache_mode_name(enum cache_mode m)
{
	switch (m) {
	case CACHE_WRITE_BACK: return "write-back";
	case CACHE_WRITE_THROUGH: return "write-through";
	case CACHE_WRITE_AROUND: return "write-around";
	case CACHE_PASS_THROUGH: return "pass-through";
	}
	return "?";
}

int cache_mode_parse(const char *s, enum cache_mode *out)
{
	for (int m = CACHE_WRITE_BACK; m <= CACHE_PASS_THROUGH; m++)
		if (!strcmp(s, cache_mode_name((enum cache_mode)m))) {
			*out = (enum cache_mode)m;
			return 0;
		}
	return -1;
}

struct bdev *cache_vol_backing(struct cache_vol *v) { return v->backing; }
struct cache_set *cache_vol_set(struct cache_vol *v) { return v->cs; }

struct cache_set *cache_vol_cache_set(struct bdev *vol) { return ((struct cache_vol *)vol)->cs; }

bool cache_vol_waits_destage(struct bdev *vol)
{
	struct cache_vol *v = (struct cache_vol *)vol;
	struct cache_set *cs = v->cs;
	if (cache_vol_of(cs, v->bid) != v)
		return false; /* the LUN's new volume destages what is dirty of it */
	for (uint32_t s = 0; s < cs->lay.nslots; s++) {
		uint32_t bits = atomic_load_explicit(&cs->slots[s].bits, memory_order_relaxed);
		if ((bits & SB_STATE_MASK) != SB_READY || !(bits & SB_DIRTY))
			continue;
		uint64_t key = atomic_load_explicit(&cs->slots[s].key, memory_order_relaxed);
		if (key != CACHE_KEY_NONE && key_bid(key) == v->bid)
			return true;
	}
	return false;
}

/* Copy the iovec slice [off, off+len) of (iov, iovcnt) into out[max]; count or -1. */
static int iov_slice(const struct iovec *iov, int iovcnt, uint64_t off, uint64_t len,
		     struct iovec *out, int max)
{
	int n = 0;
	for (int i = 0; i < iovcnt && len; i++) {
		if (off >= iov[i].iov_len) {
			off -= iov[i].iov_len;
			continue;
		}
		uint64_t take = iov[i].iov_len - off;
		if (take > len)
			take = len;
		if (n == max)
			return -1;
		out[n].iov_base = (char *)iov[i].iov_base + off;
		out[n].iov_len = take;
		n++;
		len -= take;
		off = 0;
	}
	return n;
}

/* Point (iov, iovcnt) at the parent's data [off, off+len); inline or malloc'd. */
int vol_slice_into(const struct bdev_req *up, uint64_t off, uint64_t len, struct iovec *inl,
		   struct iovec **iov, int *iovcnt)
{
	int n = iov_slice(up->iov, up->iovcnt, off, len, inl, 8);
	if (n >= 0) {
		*iov = inl;
		*iovcnt = n;
		return 0;
	}
	struct iovec *a = malloc(sizeof(*a) * (size_t)up->iovcnt);
	if (!a)
		return -ENOMEM;
	*iov = a;
	*iovcnt = iov_slice(up->iov, up->iovcnt, off, len, a, up->iovcnt);
	return 0;
}

void vol_slice_free(struct iovec *iov, struct iovec *inl)
{
	if (iov != inl)
		free(iov);
}

/* ---- completion of requests and pieces ---------------------------------- */

static uint8_t vreq_outcome(uint8_t how)
{
	if (how & (VH_CACHE | VH_BACKING))
		return how & VH_BACKING ? BDEV_OUT_BYPASS : BDEV_OUT_HIT;
	if ((how & VH_PARTIAL) || ((how & VH_HIT) && (how & VH_MISS)))
		return BDEV_OUT_PARTIAL;
	if (how & VH_MISS)
		return BDEV_OUT_MISS;
	return how & VH_HIT ? BDEV_OUT_HIT : BDEV_OUT_NONE;
}

/*
 * A read that hit: its latency, for the cleaner's yield to the host
 * (cleaner.c). Quiet: no destage was in flight or started meanwhile.
 */
static void hit_latency(struct cache_set *cs, const struct vreq *r)
{
	uint64_t us = now_us() - r->t0_us;
	uint64_t one = (1ull << HIT_LAT_SHIFT) | (us < (1ull << 24) ? us : (1ull << 24));
	uint64_t slow_us = atomic_load_explicit(&cs->hit_slow_us, memory_order_relaxed);
	bool slow = slow_us && us > slow_us;
	atomic_fetch_add_explicit(&cs->hit_lat_all, one, memory_order_relaxed);
	if (slow)
		atomic_fetch_add_explicit(&cs->hit_slow_all, 1, memory_order_relaxed);
	if (!(r->destage0 & 0xff) && atomic_load_explicit(&cs->destage_state, memory_order_relaxed) == r->destage0) {
		atomic_fetch_add_explicit(&cs->hit_lat_quiet, one, memory_order_relaxed);
		if (slow)
			atomic_fetch_add_explicit(&cs->hit_slow_quiet, 1, memory_order_relaxed);
	}
}

static void vreq_put(struct vreq *r)
{
	if (--r->pending)
		return;
	struct bdev_req *up = r->up;
	int err = r->err;
	if (r->how)
		up->outcome = vreq_outcome(r->how);
	if (r->how == VH_HIT && up->op == BDEV_READ && !err)
		hit_latency(r->v->cs, r);
	atomic_fetch_sub(&r->v->cs->fg_inflight, 1);
	POOL_PUT(vreq_free, r);
	up->done(up, err);
}

static void vreq_async_done(struct worker_batch_end *b)
{
	vreq_put(caa_container_of(b, struct vreq, later));
}

void vol_dlog_drop(struct cache_set *cs, struct piece *p)
{
	if (p->logged) {
		dlog_finish(cs, &p->dl);
		p->logged = false;
		/* under the slot lock, as park_while checks it: a writer parking meanwhile is on the list */
		struct slot *sl = &cs->slots[p->slot];
		slot_lock(sl);
		atomic_fetch_and(&sl->bits, ~SB_LOGWR);
		slot_unlock(sl);
		cache_slot_wake(cs, p->slot);
	}
}

void piece_end(struct piece *p, int err)
{
	struct vreq *r = p->parent;
	struct cache_set *cs = r->v->cs;
	vol_dlog_drop(cs, p);
	vol_intent_drop(cs, p);
	vol_slot_unpin(cs, p);
	vol_bypass_put(cs, p);
	if (err && !r->err)
		r->err = err;
	if (p->iov)
		vol_slice_free(p->iov, p->iov_inline);
	POOL_PUT(piece_free, p);
	vreq_put(r);
}

/* ---- pinning -------------------------------------------------------------- */

/*
 * Under rcu_read_lock (the caller's): find key's slot and pin it. A pin
 * increments users first and then checks key and state, the mirror image
 * of the evictor (state RETIRED first, then users): one of the two sees
 * the other. Returns the state pinned in (READY, or FILLING for writers).
 */
uint32_t vol_pin_lookup(struct cache_set *cs, struct piece *p, bool writer)
{
	uint32_t s = map_lookup(&cs->map, p->key);
	if (s == POLICY_NO_SLOT)
		return SB_FREE;
	struct slot *sl = &cs->slots[s];
	uint32_t how = writer ? SU_WRITER : SU_READER;
	atomic_fetch_add(&sl->users, how);
	if (writer)
		atomic_fetch_add(&sl->bits, SB_WGEN_ONE);
	uint32_t st = atomic_load(&sl->bits) & SB_STATE_MASK;
	if (st == SB_RETIRED) {
		/*
		 * A reclaim may be between retiring the slot and seeing our pin;
		 * then it puts the slot back to READY (under the slot lock) and
		 * a writer that took RETIRED for a miss would leave the cached
		 * copy stale. Its answer is final once we hold the lock.
		 */
		slot_lock(sl);
		st = atomic_load(&sl->bits) & SB_STATE_MASK;
		slot_unlock(sl);
	}
	if (atomic_load(&sl->key) != p->key || !(st == SB_READY || (writer && st == SB_FILLING))) {
		atomic_fetch_sub(&sl->users, how);
		return SB_FREE;
	}
	p->slot = s;
	p->pin = how;
	return st;
}

/* A writer met a fill: cancel it; true if the slot is READY after all. */
bool vol_cancel_fill(struct cache_set *cs, struct piece *p)
{
	struct slot *sl = &cs->slots[p->slot];
	slot_lock(sl);
	uint32_t st = atomic_load(&sl->bits) & SB_STATE_MASK;
	if (st == SB_FILLING)
		atomic_fetch_or(&sl->bits, SB_CANCEL);
	slot_unlock(sl);
	if (st == SB_READY)
		return true;
	vol_slot_unpin(cs, p);
	return false;
}

/* ---- submit -------------------------------------------------------------------- */

static void vreq_sub_done(struct bdev_req *req, int err)
{
	struct vreq *r = req->priv;
	if (req->op == BDEV_FLUSH && !err)
		vol_counter_max(&r->v->bw_flushed, r->flush_covers);
	if (err && !r->err)
		r->err = err;
	vreq_put(r);
}

/* Worker thread (bdev.h); done() later on the same worker. Never sleeps. */
static void vol_submit(struct bdev *dev, struct bdev_req *req)
{
	struct cache_vol *v = (struct cache_vol *)dev;
	struct cache_set *cs = v->cs;
	struct vreq *r = POOL_GET(vreq_free, struct vreq);

	if (!r) {
		bdev_submit_later(dev, req); /* out of memory: again when there is some */
		return;
	}
	r->v = v;
	r->up = req;
	r->err = 0;
	r->how = 0;
	r->pending = 1;
	atomic_fetch_add(&cs->fg_inflight, 1);
	r->t0_us = now_us();
	r->destage0 = atomic_load_explicit(&cs->destage_state, memory_order_relaxed);
	atomic_store_explicit(&cs->last_io_ms, r->t0_us / 1000, memory_order_relaxed);

	if (req->op == BDEV_FLUSH || (req->op == BDEV_READ && (req->flags & BDEV_F_UNOWNED))) {
		r->pending++;
		if (req->op == BDEV_FLUSH)
			r->flush_covers = atomic_load(&v->bw_volatile);
		else
			r->how = VH_BACKING; /* a bypass, as the metrics count it */
		r->sub = *req;
		r->sub.done = vreq_sub_done;
		r->sub.priv = r;
		bdev_submit(v->backing, &r->sub);
	} else {
		uint64_t ext = cs->lay.extent_size;
		bool rw = req->op == BDEV_READ || req->op == BDEV_WRITE;
		/* whether this request's misses may be promoted, for the advisor */
		const struct vol_mode_ops *m = vol_mode(atomic_load(&v->mode));
		bool may_admit = req->op == BDEV_READ ? m->fills : m->dirty;
		if (rw && atomic_load_explicit(&cs->trace, memory_order_relaxed))
			cache_trace_note(cs, v->bid, req->op == BDEV_WRITE, req->offset, req->len);
		uint64_t off = req->offset, end = req->offset + req->len;
		while (off < end) {
			uint64_t e = off / ext;
			uint64_t stop = (e + 1) * ext < end ? (e + 1) * ext : end;
			struct piece *p = POOL_GET(piece_free, struct piece);
			if (!p) {
				r->err = -ENOMEM;
				break;
			}
			p->parent = r;
			p->key = cache_key(v->bid, e);
			p->off = off;
			p->len = stop - off;
			p->data_off = off - req->offset;
			p->first = (uint32_t)((off - e * ext) / CACHE_SECTOR);
			p->count = (uint32_t)(p->len / CACHE_SECTOR);
			p->pin = 0;
			p->bucket = UINT32_MAX;
			p->intent_held = false;
			p->fresh = false;
			p->logged = false;
			p->err = 0;
			p->pending = 0;
			p->iov = NULL;
			r->pending++;
			/* Every read and write piece, hit or miss, is a step of
			 * its stream: a backup that reads through cached extents
			 * stays one stream past seq_cutoff and bypasses, rather
			 * than starting over at each hit and being admitted. */
			if (rw) {
				policy_stream(cs->policy, v->bid, p->off, (uint32_t)p->len, &p->run);
				if (cs->advisor)
					advisor_note(cs->advisor, p->key, p->off, &p->run, req->op == BDEV_WRITE,
						     may_admit);
			} else {
				p->run = (struct policy_run){ 0, 0 };
			}
			if (req->op == BDEV_READ)
				piece_read(p);
			else
				piece_write(p);
			off = stop;
		}
	}
	/* Drop the guard later: done() must never run inside submit. */
	if (r->pending == 1) {
		r->later = (struct worker_batch_end){ .fn = vreq_async_done };
		worker_at_batch_end(&r->later);
		return;
	}
	vreq_put(r);
}

void cache_vol_hold(struct cache_vol *v) { atomic_fetch_add(&v->bg_users, 1); }
void cache_vol_release(struct cache_vol *v) { atomic_fetch_sub(&v->bg_users, 1); }

/*
 * Main thread, no request in flight: frees the volume, closes its backing.
 * Fills and top-ups its reads started, and destages of its extents, may
 * still run: once the volume cannot be found any more (and a grace period
 * has let a cleaner that found it take its hold), wait for them.
 */
static void vol_close(struct bdev *dev)
{
	struct cache_vol *v = (struct cache_vol *)dev;
	struct cache_set *cs = v->cs;
	/* a reload may have attached the LUN again meanwhile (its new volume
	 * took the id): that one stays */
	struct cache_vol *self = v;
	pthread_mutex_lock(&cs->vols_lock); /* no status reader is looking into v after */
	bool mine = atomic_compare_exchange_strong(&cs->vols[v->bid], &self, NULL);
	pthread_mutex_unlock(&cs->vols_lock);
	synchronize_rcu();
	if (cs->advisor && mine)
		advisor_drop(cs->advisor, v->bid);
	while (atomic_load(&v->bg_users))
		usleep(1000);
	bdev_close(v->backing); /* stops the owner callbacks before v goes */
	pthread_mutex_destroy(&v->own_mu);
	free(v->gen_path);
	atomic_fetch_sub(&cs->vols_open[v->bid], 1);
	free(v);
}

/*
 * Any thread (may block). The backing store knows its holes, but an extent
 * written in write-back mode may live only on the legs so far: a hole of the
 * backing store that holds a dirty extent is reported mapped (clients such
 * as qemu-img skip reading what is reported unmapped).
 */
static int64_t vol_lba_status(struct bdev *dev, uint64_t offset, bool *mapped)
{
	struct cache_vol *v = (struct cache_vol *)dev;
	struct cache_set *cs = v->cs;
	int64_t n = bdev_lba_status(v->backing, offset, mapped);
	if (n <= 0 || *mapped)
		return n;
	uint64_t ext = cs->lay.extent_size, end = offset + (uint64_t)n;
	int64_t r = n;
	pthread_mutex_lock(&cs->alloc.lock); /* the map's table cannot change under it */
	for (uint64_t e = offset / ext; e * ext < end; e++) {
		uint32_t s = map_lookup(&cs->map, cache_key(v->bid, e));
		if (s == POLICY_NO_SLOT || !(atomic_load(&cs->slots[s].bits) & SB_DIRTY))
			continue;
		uint64_t start = e * ext > offset ? e * ext : offset;
		if (start == offset) {
			uint64_t stop = (e + 1) * ext < end ? (e + 1) * ext : end;
			*mapped = true;
			r = (int64_t)(stop - offset);
		} else {
			r = (int64_t)(start - offset);
		}
		break;
	}
	pthread_mutex_unlock(&cs->alloc.lock);
	return r;
}

/* The backing store changed size (an RBD image resized): the volume
 * follows, the set's table of LUNs takes the new
 * size (else the next start would take it for another store), then the
 * volume tells its own listener (the LU). Driver's thread. */
static void vol_backing_resized(void *arg, uint64_t size)
{
	struct cache_vol *v = arg;
	struct cache_set *cs = v->cs;
	__atomic_store_n(&v->dev.size, size, __ATOMIC_RELAXED);
	pthread_mutex_lock(&cs->sb.lock);
	cs->backing[v->bid].size = le64_of(size);
	cs->btab_changed = true; /* the table is written with the next superblock */
	pthread_mutex_unlock(&cs->sb.lock);
	cache_sb_kick(cs); /* a leg that fails it says so itself */
	if (v->on_resize)
		v->on_resize(v->on_resize_arg, size);
}

static void vol_set_resize_listener(struct bdev *dev, void (*fn)(void *arg, uint64_t size), void *arg)
{
	struct cache_vol *v = (struct cache_vol *)dev;
	v->on_resize = fn;
	v->on_resize_arg = arg;
	bdev_set_resize_listener(v->backing, vol_backing_resized, v);
}

bool cache_vol_guard_torn(struct bdev *dev, bool on)
{
	struct cache_vol *v = caa_container_of(dev, struct cache_vol, dev);
	bool ok = on && v->cs->lay.dlog_pages;
	atomic_store(&v->guard_torn, ok);
	return ok;
}

/*
 * The backing store's space. Dirty data not destaged yet is not in its
 * allocation: a threshold on the LUN's own allocation sees it once it
 * lands (the filesystem's free space is what runs out first anyway).
 */
static int vol_space(struct bdev *dev, struct bdev_space *out)
{
	return bdev_space(((struct cache_vol *)dev)->backing, out);
}

static const struct bdev_ops vol_ops = {
	.submit = vol_submit,
	.close = vol_close,
	.lba_status = vol_lba_status,
	.space = vol_space,
	.set_resize_listener = vol_set_resize_listener,
};

/* set.c: create the volume object once identity checks passed. Main thread. */
struct cache_vol *cache_vol_new(struct cache_set *cs, const char *lun, struct bdev *backing, uint32_t bid,
				enum cache_mode mode)
{
	struct cache_vol *v = calloc(1, sizeof(*v));
	if (!v)
		return NULL;
	worker_exit_hook(volume_thread_release);
	v->cs = cs;
	v->backing = backing;
	v->bid = bid;
	atomic_init(&v->mode, (int)mode);
	/* writes of an earlier run may still sit in the backing store's cache: the first fill flushes */
	atomic_init(&v->bw_volatile, 1);
	snprintf(v->name, sizeof(v->name), "%s", lun);
	pthread_mutex_init(&v->own_mu, NULL);
	v->ops = vol_ops;
	if (bdev_is_shared(backing))
		v->ops.owner = &vol_owner_ops;
	v->dev.ops = &v->ops;
	v->dev.name = backing->name;
	v->dev.size = backing->size;
	v->dev.block_size = backing->block_size;
	v->dev.can_unmap = backing->can_unmap;
	v->dev.rotational = false;
	atomic_fetch_add(&cs->vols_open[bid], 1); /* until vol_close */
	return v;
}

/* Main thread or control thread. */
enum cache_mode cache_vol_mode(struct cache_vol *v) { return (enum cache_mode)atomic_load(&v->mode); }
void cache_vol_store_mode(struct cache_vol *v, enum cache_mode m) { atomic_store(&v->mode, (int)m); }
const char *cache_vol_name(struct cache_vol *v) { return v->name; }
uint32_t cache_vol_bid(struct cache_vol *v) { return v->bid; }

/* ---- destage to the backing store failing (worker 0: the cleaner) ---- */

#define DESTAGE_WAIT_MIN_MS 1000u
#define DESTAGE_WAIT_MAX_MS 30000u
#define DESTAGE_OK_RUN 8u

/*
 * A destage write to v's backing store failed with err. Logged when the
 * state changes (working to failing, or to another error), not per
 * attempt: a full filesystem would otherwise log every retry. After a
 * failure the next attempt on v waits 1 s, then twice as long after each
 * failure in a row, up to 30 s.
 */
void cache_vol_destage_failed(struct cache_vol *v, int err)
{
	uint64_t now = now_ms();
	int was = atomic_exchange(&v->destage_err, err);
	atomic_fetch_add(&v->destage_failures, 1);
	v->destage_ok_run = 0;
	if (was != err) {
		if (!was)
			atomic_store(&v->destage_since_ms, now);
		v->destage_wait_ms = DESTAGE_WAIT_MIN_MS;
		log_err("cache %s: destage to LUN %s (%s) fails: %s; its dirty data stays in the cache, retried "
			"every %u to %u s (logged again when this changes)",
			v->cs->name, v->name, cache_vol_backing(v)->name, strerror(-err),
			DESTAGE_WAIT_MIN_MS / 1000, DESTAGE_WAIT_MAX_MS / 1000);
	} else if (v->destage_wait_ms < DESTAGE_WAIT_MAX_MS) {
		v->destage_wait_ms = v->destage_wait_ms * 2 < DESTAGE_WAIT_MAX_MS ? v->destage_wait_ms * 2
										: DESTAGE_WAIT_MAX_MS;
	}
	atomic_store(&v->destage_retry_ms, now + v->destage_wait_ms);
}

/*
 * A destage write to v's backing store worked. On a full filesystem some
 * still do (blocks the file already owns), so one success does not end
 * the failing state: the next attempt may go at once, and DESTAGE_OK_RUN
 * successes in a row say the store works again (logged once).
 */
void cache_vol_destage_works(struct cache_vol *v)
{
	int was = atomic_load(&v->destage_err);
	if (!was)
		return;
	atomic_store(&v->destage_retry_ms, 0);
	if (++v->destage_ok_run < DESTAGE_OK_RUN)
		return;
	atomic_store(&v->destage_err, 0);
	uint64_t n = atomic_exchange(&v->destage_failures, 0);
	log_info("cache %s: destage to LUN %s works again (%s before) after %llu failed attempts in %llu s",
		 v->cs->name, v->name, strerror(-was), (unsigned long long)n,
		 (unsigned long long)((now_ms() - atomic_load(&v->destage_since_ms)) / 1000));
}

/*
 * v's destage was failing and v has no dirty data left (the cleaner looked):
 * no destage will come to prove the store works, so the state ends here.
 */
void cache_vol_destage_idle(struct cache_vol *v)
{
	int was = atomic_exchange(&v->destage_err, 0);
	if (!was)
		return;
	atomic_store(&v->destage_retry_ms, 0);
	v->destage_ok_run = 0;
	uint64_t n = atomic_exchange(&v->destage_failures, 0);
	log_info("cache %s: LUN %s has no dirty data left to destage (%s before, %llu failed attempts in %llu s)",
		 v->cs->name, v->name, strerror(-was), (unsigned long long)n,
		 (unsigned long long)((now_ms() - atomic_load(&v->destage_since_ms)) / 1000));
}

bool cache_vol_destage_waits(struct cache_vol *v)
{
	return atomic_load(&v->destage_err) && now_ms() < atomic_load(&v->destage_retry_ms);
}

void cache_vol_destage_state(struct cache_vol *v, int *err, uint64_t *failures, uint64_t *retry_in_ms)
{
	uint64_t now = now_ms(), at = atomic_load(&v->destage_retry_ms);
	*err = atomic_load(&v->destage_err);
	*failures = atomic_load(&v->destage_failures);
	*retry_in_ms = *err && at > now ? at - now : 0;
}
