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
 * Threading: vol_submit on a worker, completions on that worker. Contexts
 * come from per-thread free lists (no malloc per command in steady state).
 */
#include "cache/cache_int.h"

#include "common/bufpool.h"
#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct cache_vol {
	struct bdev dev;
	struct cache_set *cs;
	struct bdev *backing;
	uint32_t bid;
	_Atomic int mode;
	/* LUN blocks larger than the legs write atomically: overwrites of dirty data go through the block log */
	_Atomic bool guard_torn;
	char name[64];
	/* ownership of a shared backing store (see "Ownership" below) */
	struct bdev_ops ops;            /* vol_ops, plus owner when the backing is shared */
	pthread_mutex_t own_mu;         /* up_fn/up_arg, listening, gen_path */
	void (*up_fn)(void *arg, const struct bdev_owner_change *c);
	void *up_arg;
	bool listening;                 /* registered with the backing's listen */
	uint64_t recorded_gen;          /* generation of our last gain, as persisted */
	_Atomic bool drop_failed;       /* the last gain could not drop stale copies: serve nothing */
	char *gen_path;                 /* where it persists (NULL: not kept) */
	/*
	 * Writes to the backing store without FUA that completed (bw_volatile)
	 * and how many of them a completed FLUSH covers (bw_flushed): data a
	 * fill or top-up read while they differ may not be durable there yet
	 * (backing_settle).
	 */
	_Atomic uint64_t bw_volatile, bw_flushed;
	/* bdev_set_resize_listener: the backing store's new size, passed up */
	void (*on_resize)(void *arg, uint64_t size);
	void *on_resize_arg;
};

struct vreq;

struct piece {
	struct piece *next_free;
	struct vreq *parent;
	uint64_t key;
	uint64_t off;           /* volume byte offset */
	uint64_t len;
	uint64_t data_off;      /* offset into the parent's iov */
	uint32_t first, count;  /* blocks inside the extent */
	uint32_t slot;
	uint32_t pin;           /* SU_READER / SU_WRITER held, 0 none */
	uint32_t bucket;        /* bypass counter held, or UINT32_MAX */
	int pending;
	int err;
	int stage;
	struct jwait jw;
	struct bdev_req sub;    /* single-sub stages */
	struct slot_wait dwait; /* parked behind a destage or a top-up (park_while) */
	struct intent_wait iw;  /* the slot's write-intent region (piece_intent) */
	bool intent_held;       /* entered: leave it when the piece ends or starts over */
	bool fresh;             /* the slot was allocated by this write: nothing in it is referenced */
	bool logged;            /* its block log record is in flight (dl): finish it when recorded */
	struct dlog_ent dl;
	struct iovec iov_inline[8];
	struct iovec *iov;
	int iovcnt;
};

struct vsub {                   /* extra subs of a partial read */
	struct vsub *next_free;
	struct piece *p;
	bool from_cache;
	uint32_t first, count;
	struct bdev_req req;
	struct iovec iov_inline[8];
	struct iovec *iov;
	int iovcnt;
};

struct vreq {
	struct vreq *next_free;
	struct cache_vol *v;
	struct bdev_req *up;
	int pending;
	int err;
	uint64_t flush_covers;  /* FLUSH: bw_volatile when it was sent */
	struct bdev_req sub;    /* pass-through, flush */
	struct worker_batch_end later; /* completion after a submit that did it all */
};

struct fill {
	struct fill *next_free;
	struct cache_vol *v;
	uint32_t slot;
	uint64_t key;
	uint32_t count;
	uint64_t settle;        /* bw_volatile a backing flush must cover first */
	void *buf;
	struct iovec iov;
	struct bdev_req req;
	struct jwait jw;
};

#define TOPUP_RUNS 16

/* A top-up: the invalid blocks of a READY slot, read from the backing store. */
struct topup {
	struct topup *next_free;
	struct cache_vol *v;
	uint32_t slot;
	uint64_t key;
	uint32_t wgen0;
	uint32_t nruns;
	uint64_t settle;        /* as struct fill's */
	uint32_t first[TOPUP_RUNS], count[TOPUP_RUNS]; /* read as one span: first[0] .. last end */
	uint8_t *buf;
	int pending;
	int err;
	struct iovec iov[TOPUP_RUNS];
	struct bdev_req req[TOPUP_RUNS];
	struct tjw {
		struct jwait jw;
		struct topup *t;
	} jw[TOPUP_RUNS];
};

static __thread struct piece *piece_free;
static __thread struct vsub *vsub_free;
static __thread struct vreq *vreq_free;
static __thread struct fill *fill_free;
static __thread struct topup *topup_free;

#define POOL_GET(head, type)                                                  \
	({                                                                    \
		type *o_ = head;                                              \
		if (o_)                                                       \
			head = o_->next_free;                                 \
		else                                                          \
			o_ = malloc(sizeof(type));                            \
		o_;                                                           \
	})
#define POOL_PUT(head, o)                                                     \
	do {                                                                  \
		(o)->next_free = head;                                        \
		head = (o);                                                   \
	} while (0)

#define POOL_RELEASE(head)                                                    \
	while (head) {                                                        \
		void *o_ = head;                                              \
		head = head->next_free;                                       \
		free(o_);                                                     \
	}

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
static int slice_into(const struct bdev_req *up, uint64_t off, uint64_t len, struct iovec *inl,
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

static void slice_free(struct iovec *iov, struct iovec *inl)
{
	if (iov != inl)
		free(iov);
}

/* ---- completion of requests and pieces ---------------------------------- */

static void vreq_put(struct vreq *r)
{
	if (--r->pending)
		return;
	struct bdev_req *up = r->up;
	int err = r->err;
	atomic_fetch_sub(&r->v->cs->fg_inflight, 1);
	POOL_PUT(vreq_free, r);
	up->done(up, err);
}

static void vreq_async_done(struct worker_batch_end *b)
{
	vreq_put(caa_container_of(b, struct vreq, later));
}

static void slot_unpin(struct cache_set *cs, struct piece *p)
{
	if (p->pin) {
		atomic_fetch_sub(&cs->slots[p->slot].users, p->pin);
		p->pin = 0;
	}
}

static void bypass_put(struct cache_set *cs, struct piece *p)
{
	if (p->bucket != UINT32_MAX) {
		atomic_fetch_sub(&cs->bypass[p->bucket], 1);
		p->bucket = UINT32_MAX;
	}
}

static void intent_drop(struct cache_set *cs, struct piece *p)
{
	if (p->intent_held) {
		intent_leave(cs, p->iw.region);
		p->intent_held = false;
	}
}

static void dlog_drop(struct cache_set *cs, struct piece *p)
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

static void piece_end(struct piece *p, int err)
{
	struct vreq *r = p->parent;
	struct cache_set *cs = r->v->cs;
	dlog_drop(cs, p);
	intent_drop(cs, p);
	slot_unpin(cs, p);
	bypass_put(cs, p);
	if (err && !r->err)
		r->err = err;
	if (p->iov)
		slice_free(p->iov, p->iov_inline);
	POOL_PUT(piece_free, p);
	vreq_put(r);
}

static void piece_sub_done(struct piece *p, int err)
{
	if (err && !p->err)
		p->err = err;
	if (--p->pending == 0)
		piece_end(p, p->err);
}

/* ---- pinning -------------------------------------------------------------- */

/*
 * Under rcu_read_lock (the caller's): find key's slot and pin it. A pin
 * increments users first and then checks key and state, the mirror image
 * of the evictor (state RETIRED first, then users): one of the two sees
 * the other. Returns the state pinned in (READY, or FILLING for writers).
 */
static uint32_t pin_lookup(struct cache_set *cs, struct piece *p, bool writer)
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
static bool cancel_fill(struct cache_set *cs, struct piece *p)
{
	struct slot *sl = &cs->slots[p->slot];
	slot_lock(sl);
	uint32_t st = atomic_load(&sl->bits) & SB_STATE_MASK;
	if (st == SB_FILLING)
		atomic_fetch_or(&sl->bits, SB_CANCEL);
	slot_unlock(sl);
	if (st == SB_READY)
		return true;
	slot_unpin(cs, p);
	return false;
}

/* ---- durability of what is read from the backing store ------------------------ */

static void counter_max(_Atomic uint64_t *c, uint64_t v)
{
	uint64_t cur = atomic_load(c);
	while (cur < v && !atomic_compare_exchange_weak(c, &cur, v))
		;
}

/*
 * A fill or top-up caches what it read from the backing store as clean.
 * If a write without FUA reached the backing store before that read and no
 * FLUSH covers it yet, the backing store may still lose it at a power cut
 * while the cache keeps it as clean: the block would then read back the new
 * data until evicted, and the old data after. So, worker thread, after the
 * read: false when nothing volatile is outstanding (go on); true when a
 * FLUSH of the backing store went out on req (done(req, err) follows, and
 * backing_settled must then be called with *gen).
 */
static bool backing_settle(struct cache_vol *v, struct bdev_req *req, void (*done)(struct bdev_req *, int),
			   void *priv, uint64_t *gen)
{
	uint64_t g = atomic_load(&v->bw_volatile);
	if (g == atomic_load(&v->bw_flushed))
		return false;
	*gen = g;
	*req = (struct bdev_req){ .op = BDEV_FLUSH, .done = done, .priv = priv };
	bdev_submit(v->backing, req);
	return true;
}

static void backing_settled(struct cache_vol *v, uint64_t gen, int err)
{
	if (!err)
		counter_max(&v->bw_flushed, gen);
}

/* ---- fills (promotion) ------------------------------------------------------ */

static void fill_end(struct fill *f, bool keep)
{
	struct cache_set *cs = f->v->cs;
	if (!keep)
		cache_drop_slot(cs, f->slot);
	buf_put(f->buf, cs->lay.extent_size);
	POOL_PUT(fill_free, f);
	atomic_fetch_sub(&cs->bg_inflight, 1);
}

static void fill_recorded(struct jwait *w, int err)
{
	struct fill *f = caa_container_of(w, struct fill, jw);
	atomic_fetch_add(&f->v->cs->st_promotions, 1);
	fill_end(f, true);
}

static void fill_written(struct bdev_req *req, int err)
{
	struct fill *f = req->priv;
	struct cache_set *cs = f->v->cs;
	struct slot *sl = &cs->slots[f->slot];

	slot_lock(sl);
	if (err || (atomic_load(&sl->bits) & SB_CANCEL)) {
		slot_unlock(sl);
		fill_end(f, false);
		return;
	}
	cache_record_locked(cs, f->slot, f->key, JOP_VALID, 0, f->count, &f->jw);
	atomic_fetch_and(&sl->bits, ~SB_STATE_MASK);
	atomic_fetch_or(&sl->bits, SB_READY);
	slot_unlock(sl);
	f->jw.done = fill_recorded;
	journal_append(cs, &f->jw);
}

static void fill_to_legs(struct fill *f, int err)
{
	struct cache_set *cs = f->v->cs;
	if (err || (atomic_load(&cs->slots[f->slot].bits) & SB_CANCEL)) {
		fill_end(f, false);
		return;
	}
	f->req = (struct bdev_req){
		.op = BDEV_WRITE,
		.flags = BDEV_F_FUA,
		.offset = slot_leg_off(cs, f->slot),
		.len = f->iov.iov_len,
		.iov = &f->iov,
		.iovcnt = 1,
		.done = fill_written,
		.priv = f,
	};
	bdev_submit(&cs->mirror.dev, &f->req);
}

static void fill_flushed(struct bdev_req *req, int err)
{
	struct fill *f = req->priv;
	backing_settled(f->v, f->settle, err);
	fill_to_legs(f, err);
}

static void fill_read(struct bdev_req *req, int err)
{
	struct fill *f = req->priv;
	if (!err && backing_settle(f->v, &f->req, fill_flushed, f, &f->settle))
		return;
	fill_to_legs(f, err);
}

/* Worker thread, never sleeps: promote key (a whole extent) from the backing store. */
static void fill_start(struct cache_vol *v, uint64_t key)
{
	struct cache_set *cs = v->cs;
	uint32_t existing;
	uint32_t s = cache_alloc_slot(cs, key, SB_FILLING, &existing);
	if (s == POLICY_NO_SLOT)
		return;
	if (atomic_load(&cs->bypass[bypass_bucket(key)])) {
		cache_drop_slot(cs, s);
		return;
	}
	struct fill *f = POOL_GET(fill_free, struct fill);
	void *buf = f ? buf_get(cs->lay.extent_size) : NULL;
	if (!buf) {
		if (f)
			POOL_PUT(fill_free, f);
		cache_drop_slot(cs, s);
		return;
	}
	uint64_t off = key_ext(key) * cs->lay.extent_size;
	uint64_t len = cs->lay.extent_size;
	if (off + len > v->dev.size)
		len = v->dev.size - off;
	atomic_fetch_add(&cs->bg_inflight, 1);
	f->v = v;
	f->slot = s;
	f->key = key;
	f->buf = buf;
	f->count = (uint32_t)(len / CACHE_SECTOR);
	f->iov.iov_base = buf;
	f->iov.iov_len = len;
	f->req = (struct bdev_req){
		.op = BDEV_READ,
		.offset = off,
		.len = len,
		.iov = &f->iov,
		.iovcnt = 1,
		.done = fill_read,
		.priv = f,
	};
	bdev_submit(v->backing, &f->req);
}

/* ---- top-ups ------------------------------------------------------------------
 *
 * A write miss admitted in write-back makes its extent resident with only
 * the written blocks valid; a later read of the rest would be a partial
 * hit served from the backing store every time, since fills only start
 * for extents that are not resident. A partial hit therefore starts a
 * top-up: the invalid blocks (up to TOPUP_RUNS runs) are read from the
 * backing store in one request, written to the legs run by run, and
 * recorded VALID. Valid blocks are never written, so dirty data is safe;
 * what must not happen is a top-up making stale data valid:
 *
 *  - at most one top-up per slot (SB_TOPUP); it holds a reader pin, so
 *    the slot is not evicted under it;
 *  - any write that starts after it (writers bump the slot's write
 *    generation when they pin, before anything else) makes it give up when
 *    its backing read completes; a write to the backing store that started
 *    before it and bypassed the cache is seen on the bypass counter;
 *  - it starts only while no writer holds a pin (one may be writing
 *    blocks that still read invalid);
 *  - while its leg writes are in flight (SB_TOPUP_WR) writers park
 *    (cache_slot_wait) instead of writing the same blocks concurrently; it
 *    records before releasing them, so their records follow its own;
 *  - an invalidation of the volume's copies (ownership gain) cancels it
 *    (SB_CANCEL on a READY slot means exactly that).
 */

static void topup_free_ctx(struct topup *t)
{
	struct cache_set *cs = t->v->cs;
	atomic_fetch_sub(&cs->slots[t->slot].users, SU_READER);
	if (t->buf)
		buf_put(t->buf, cs->lay.extent_size);
	POOL_PUT(topup_free, t);
	atomic_fetch_sub(&cs->bg_inflight, 1);
}

/* Give up: clear the slot's top-up bits (the caller holds its lock), release parked writers. */
static void topup_abandon_locked(struct topup *t)
{
	struct cache_set *cs = t->v->cs;
	struct slot *sl = &cs->slots[t->slot];
	bool was_writing = atomic_load(&sl->bits) & SB_TOPUP_WR;
	atomic_fetch_and(&sl->bits, ~(SB_TOPUP | SB_TOPUP_WR | SB_CANCEL));
	slot_unlock(sl);
	if (was_writing)
		cache_slot_wake(cs, t->slot);
	topup_free_ctx(t);
}

static void topup_recorded(struct jwait *w, int err)
{
	struct topup *t = caa_container_of(w, struct tjw, jw)->t;
	if (--t->pending)
		return;
	atomic_fetch_add(&t->v->cs->st_topups, 1);
	topup_free_ctx(t);
}

static void topup_written(struct bdev_req *req, int err)
{
	struct topup *t = req->priv;
	struct cache_set *cs = t->v->cs;
	struct slot *sl = &cs->slots[t->slot];
	if (err && !t->err)
		t->err = err;
	if (--t->pending)
		return;
	slot_lock(sl);
	if (t->err || (atomic_load(&sl->bits) & SB_CANCEL)) {
		topup_abandon_locked(t); /* the blocks stay invalid: what the legs hold does not matter */
		return;
	}
	for (uint32_t i = 0; i < t->nruns; i++)
		cache_record_locked(cs, t->slot, t->key, JOP_VALID, t->first[i], t->count[i], &t->jw[i].jw);
	atomic_fetch_and(&sl->bits, ~(SB_TOPUP | SB_TOPUP_WR));
	slot_unlock(sl);
	cache_slot_wake(cs, t->slot);
	t->pending = (int)t->nruns;
	for (uint32_t i = 0; i < t->nruns; i++) {
		t->jw[i].t = t;
		t->jw[i].jw.done = topup_recorded;
		journal_append(cs, &t->jw[i].jw);
	}
}

static void topup_to_legs(struct topup *t, int err)
{
	struct cache_set *cs = t->v->cs;
	struct slot *sl = &cs->slots[t->slot];

	/*
	 * One read-modify-write: a writer's generation bump (also an RMW of
	 * bits) is either before it, and seen here, or after it, and then
	 * that writer sees SB_TOPUP_WR and parks.
	 */
	slot_lock(sl);
	uint32_t bits = atomic_fetch_or(&sl->bits, SB_TOPUP_WR);
	if (err || (bits >> SB_WGEN_SHIFT) != t->wgen0 || (bits & SB_CANCEL)) {
		topup_abandon_locked(t);
		return;
	}
	slot_unlock(sl);
	t->pending = (int)t->nruns;
	for (uint32_t i = 0; i < t->nruns; i++) {
		uint64_t at = (uint64_t)t->first[i] * CACHE_SECTOR;
		t->iov[i].iov_base = t->buf + (uint64_t)(t->first[i] - t->first[0]) * CACHE_SECTOR;
		t->iov[i].iov_len = (uint64_t)t->count[i] * CACHE_SECTOR;
		t->req[i] = (struct bdev_req){
			.op = BDEV_WRITE,
			.flags = BDEV_F_FUA,
			.offset = slot_leg_off(cs, t->slot) + at,
			.len = t->iov[i].iov_len,
			.iov = &t->iov[i],
			.iovcnt = 1,
			.done = topup_written,
			.priv = t,
		};
		bdev_submit(&cs->mirror.dev, &t->req[i]);
	}
}

static void topup_flushed(struct bdev_req *req, int err)
{
	struct topup *t = req->priv;
	backing_settled(t->v, t->settle, err);
	topup_to_legs(t, err);
}

static void topup_read(struct bdev_req *req, int err)
{
	struct topup *t = req->priv;
	if (!err && backing_settle(t->v, &t->req[0], topup_flushed, t, &t->settle))
		return;
	topup_to_legs(t, err);
}

/*
 * Worker thread, the caller holds a pin on slot s (READY, key key): start a
 * top-up of its invalid blocks unless one runs or a bypass write of the
 * extent is in flight. Never sleeps; gives up quietly when out of memory.
 */
static void topup_start(struct cache_vol *v, uint32_t s, uint64_t key)
{
	struct cache_set *cs = v->cs;
	struct slot *sl = &cs->slots[s];
	if (atomic_load_explicit(&sl->bits, memory_order_relaxed) & SB_TOPUP)
		return;
	uint64_t ext_off = key_ext(key) * cs->lay.extent_size;
	uint64_t size = __atomic_load_n(&v->dev.size, __ATOMIC_RELAXED);
	if (ext_off >= size)
		return;
	uint32_t blocks = cs->lay.bpe;
	if (size - ext_off < cs->lay.extent_size)
		blocks = (uint32_t)((size - ext_off) / CACHE_SECTOR);
	struct topup *t = POOL_GET(topup_free, struct topup);
	if (!t)
		return;
	t->buf = buf_get(cs->lay.extent_size);
	if (!t->buf) {
		POOL_PUT(topup_free, t);
		return;
	}
	atomic_fetch_add(&sl->users, SU_READER); /* ours; the caller's pin keeps the slot meanwhile */
	slot_lock(sl);
	uint32_t bits = atomic_load(&sl->bits);
	t->nruns = 0;
	/*
	 * No writer may hold a pin: one that pinned before bits was read may
	 * still be writing blocks seen invalid here. Writers add to users, then
	 * bump the generation; seeing no writer after reading bits means any
	 * later one bumps a generation we did not read.
	 */
	/* Dirty without a bitmap (none could be allocated): which blocks are valid is not known. */
	bool unknown = (bits & SB_DIRTY) && !(bits & (SB_HAS_BM | SB_FULL_VALID));
	if ((bits & SB_STATE_MASK) == SB_READY && !(bits & (SB_TOPUP | SB_CANCEL)) && !unknown &&
	    !(atomic_load(&sl->users) >> 16) && atomic_load(&sl->key) == key) {
		uint32_t at = 0;
		while (at < blocks && t->nruns < TOPUP_RUNS) {
			bool valid;
			uint32_t n = slot_valid_run(cs, s, at, blocks - at, &valid);
			if (!valid) {
				t->first[t->nruns] = at;
				t->count[t->nruns] = n;
				t->nruns++;
			}
			at += n;
		}
	}
	if (t->nruns) {
		atomic_fetch_or(&sl->bits, SB_TOPUP);
		t->wgen0 = bits >> SB_WGEN_SHIFT;
	}
	slot_unlock(sl);
	/* after SB_TOPUP and the generation: a bypass write counted later pins and bumps it */
	if (!t->nruns || atomic_load(&cs->bypass[bypass_bucket(key)])) {
		if (t->nruns) {
			slot_lock(sl);
			atomic_fetch_and(&sl->bits, ~(SB_TOPUP | SB_CANCEL));
			slot_unlock(sl);
		}
		atomic_fetch_sub(&sl->users, SU_READER);
		buf_put(t->buf, cs->lay.extent_size);
		POOL_PUT(topup_free, t);
		return;
	}
	atomic_fetch_add(&cs->bg_inflight, 1);
	t->v = v;
	t->slot = s;
	t->key = key;
	t->err = 0;
	uint32_t span_end = t->first[t->nruns - 1] + t->count[t->nruns - 1];
	t->iov[0].iov_base = t->buf;
	t->iov[0].iov_len = (uint64_t)(span_end - t->first[0]) * CACHE_SECTOR;
	t->req[0] = (struct bdev_req){
		.op = BDEV_READ,
		.offset = ext_off + (uint64_t)t->first[0] * CACHE_SECTOR,
		.len = t->iov[0].iov_len,
		.iov = &t->iov[0],
		.iovcnt = 1,
		.done = topup_read,
		.priv = t,
	};
	bdev_submit(v->backing, &t->req[0]);
}

/* ---- reads ------------------------------------------------------------------ */

static void read_sub_done(struct bdev_req *req, int err);

static void read_sub_issue(struct piece *p, struct vsub *s)
{
	struct vreq *r = p->parent;
	struct cache_set *cs = r->v->cs;
	uint64_t in_piece = (uint64_t)(s->first - p->first) * CACHE_SECTOR;
	uint64_t len = (uint64_t)s->count * CACHE_SECTOR;
	s->req = (struct bdev_req){
		.op = BDEV_READ,
		.offset = s->from_cache ? slot_leg_off(cs, p->slot) + (uint64_t)s->first * CACHE_SECTOR
					: p->off + in_piece,
		.len = len,
		.iov = s->iov,
		.iovcnt = s->iovcnt,
		.done = read_sub_done,
		.priv = s,
	};
	bdev_submit(s->from_cache ? &cs->mirror.dev : r->v->backing, &s->req);
}

/* Worker thread (bdev completion). Lock-free, except that a run found
 * lost with every leg gone takes the set's lost_lock (cache_lost_note). */
static void read_sub_done(struct bdev_req *req, int err)
{
	struct vsub *s = req->priv;
	struct piece *p = s->p;
	struct cache_set *cs = p->parent->v->cs;

	if (err && s->from_cache) {
		/* every leg gone, or this range unreadable on every leg still in service */
		if (!slot_any_dirty(cs, p->slot, s->first, s->count)) {
			/* clean copy lost: the backing store has the same data */
			s->from_cache = false;
			read_sub_issue(p, s);
			return;
		}
		atomic_fetch_add(&cs->st_lost_ios, 1);
		cache_lost_note(cs, p->parent->v->bid, p->slot,
				p->off + (uint64_t)(s->first - p->first) * CACHE_SECTOR, s->first, s->count);
		err = -EIO;
	}
	slice_free(s->iov, s->iov_inline);
	POOL_PUT(vsub_free, s);
	piece_sub_done(p, err);
}

static int add_read_sub(struct piece *p, bool from_cache, uint32_t first, uint32_t count)
{
	struct vsub *s = POOL_GET(vsub_free, struct vsub);
	if (!s)
		return -ENOMEM;
	s->p = p;
	s->from_cache = from_cache;
	s->first = first;
	s->count = count;
	uint64_t at = p->data_off + (uint64_t)(first - p->first) * CACHE_SECTOR;
	if (slice_into(p->parent->up, at, (uint64_t)count * CACHE_SECTOR, s->iov_inline, &s->iov,
		       &s->iovcnt) < 0) {
		POOL_PUT(vsub_free, s);
		return -ENOMEM;
	}
	p->pending++;
	read_sub_issue(p, s);
	return 0;
}

/* Worker thread; the RCU read lock is held around the lookup and pin only. */
static void piece_read(struct piece *p)
{
	struct cache_vol *v = p->parent->v;
	struct cache_set *cs = v->cs;
	int mode = atomic_load(&v->mode);
	uint32_t st = SB_FREE;

	/* even in pass-through, blocks cached earlier are read from the cache */
	rcu_read_lock();
	st = pin_lookup(cs, p, false);
	rcu_read_unlock();
	p->pending = 1; /* guard while subs are issued */
	if (st == SB_READY) {
		policy_touch(cs->policy, p->slot);
		uint32_t at = p->first, left = p->count;
		bool whole = true;
		while (left) {
			bool valid;
			uint32_t n = slot_valid_run(cs, p->slot, at, left, &valid);
			if (n != p->count || !valid)
				whole = false;
			if (add_read_sub(p, valid, at, n) < 0) {
				p->err = -ENOMEM;
				break;
			}
			at += n;
			left -= n;
		}
		atomic_fetch_add(whole ? &cs->st_read_hits : &cs->st_read_partial, 1);
		if (!whole && mode != CACHE_PASS_THROUGH && !mirror_all_failed(&cs->mirror))
			topup_start(v, p->slot, p->key);
	} else {
		atomic_fetch_add(&cs->st_read_misses, 1);
		if (add_read_sub(p, false, p->first, p->count) < 0)
			p->err = -ENOMEM;
		if (mode != CACHE_PASS_THROUGH && !mirror_all_failed(&cs->mirror) &&
		    policy_admit(cs->policy, p->key, v->bid, p->off, (uint32_t)p->len, false))
			fill_start(v, p->key);
	}
	piece_sub_done(p, 0);
}

/* ---- writes ------------------------------------------------------------------ */

enum { ST_CACHE_DATA = 1, ST_BACKING, ST_RECORD, ST_BACKING_INVAL };

static void write_step(struct bdev_req *req, int err);
static void retry_piece(void *arg);

static void submit_sub(struct piece *p, struct bdev *dev, enum bdev_op op, unsigned flags,
		       uint64_t offset)
{
	p->sub = (struct bdev_req){
		.op = op,
		.flags = flags,
		.offset = offset,
		.len = p->len,
		.iov = p->iov,
		.iovcnt = p->iovcnt,
		.done = write_step,
		.priv = p,
	};
	bdev_submit(dev, &p->sub);
}

/*
 * Before the first device write of a piece that may change data the
 * metadata references (its pinned slot is READY and not its own fresh
 * one): the slot's write-intent region must be durable (intent.c), so that
 * recovery knows to reconcile the legs and the backing store there. true:
 * go on now; false: parked, cont(p) runs later on this worker.
 */
static bool piece_intent(struct piece *p, void (*cont)(void *))
{
	if (p->intent_held || !p->pin || p->fresh)
		return true;
	p->intent_held = true;
	p->iw.fn = cont;
	p->iw.arg = p;
	return intent_enter(p->parent->v->cs, p->slot, &p->iw);
}

static void to_backing_cont(void *arg);

static void to_backing(struct piece *p)
{
	struct vreq *r = p->parent;
	if (!piece_intent(p, to_backing_cont))
		return;
	p->stage = ST_BACKING;
	unsigned fl = r->up->flags & BDEV_F_FUA;
	/*
	 * Write-through over a cached copy refreshes the copy as clean right
	 * after: the backing store must hold the data durably by then, or a
	 * power cut could leave a clean cached block it does not have.
	 */
	if (p->pin && r->up->op == BDEV_WRITE)
		fl |= BDEV_F_FUA;
	submit_sub(p, r->v->backing, r->up->op, fl, p->off);
}

static void to_backing_cont(void *arg) { to_backing(arg); }

static void to_cache_cont(void *arg);
static void to_cache(struct piece *p);
static bool park_while(struct piece *p, uint32_t mask);

static void piece_logged(struct dlog_ent *e, int err)
{
	struct piece *p = e->priv;
	if (err) {
		piece_end(p, err);
		return;
	}
	to_cache(p);
}

/*
 * An overwrite of dirty blocks that a torn write could leave part old,
 * part new (the LUN's blocks are larger than what the legs write
 * atomically): the only copy of acknowledged data. It goes whole into the
 * block log first (dlog.c), then in place.
 */
static bool needs_log(struct piece *p)
{
	struct cache_vol *v = p->parent->v;
	struct cache_set *cs = v->cs;
	return !p->logged && !p->fresh && p->pin && cs->lay.dlog_pages && atomic_load(&v->guard_torn) &&
	       p->count > 1 && slot_any_dirty(cs, p->slot, p->first, p->count);
}

static void to_cache(struct piece *p)
{
	struct cache_set *cs = p->parent->v->cs;
	if (!piece_intent(p, to_cache_cont))
		return;
	if (needs_log(p)) {
		/*
		 * One logged overwrite per extent at a time: recovery takes a
		 * later journal record on a block to mean the logged write
		 * before it had completed, which only holds if they never
		 * overlap in time (two in flight over one block, the later
		 * acknowledged first, could otherwise stay torn).
		 */
		while (atomic_fetch_or(&cs->slots[p->slot].bits, SB_LOGWR) & SB_LOGWR)
			if (park_while(p, SB_LOGWR))
				return; /* starts over from the lookup when it is clear */
		p->logged = true;
		p->stage = ST_CACHE_DATA;
		dlog_write(cs, &p->dl, p->slot, atomic_load(&cs->slots[p->slot].key), p->first, p->count, p->iov,
			   p->iovcnt, piece_logged, p);
		return;
	}
	p->stage = ST_CACHE_DATA;
	submit_sub(p, &cs->mirror.dev, BDEV_WRITE, BDEV_F_FUA,
		   slot_leg_off(cs, p->slot) + (uint64_t)p->first * CACHE_SECTOR);
}

static void to_cache_cont(void *arg) { to_cache(arg); }

static void record_done(struct jwait *w, int err)
{
	struct piece *p = caa_container_of(w, struct piece, jw);
	piece_end(p, err ? err : p->err); /* p->err: the backing write's, after an INVALIDATE */
}

static void record(struct piece *p, int op, int next_stage)
{
	struct cache_set *cs = p->parent->v->cs;
	p->stage = next_stage;
	p->jw.done = record_done;
	/* the data is in place (or the write failed): the logged copy is not needed any more */
	dlog_drop(cs, p);
	cache_record(cs, p->slot, op, p->first, p->count, &p->jw);
}

static void write_step(struct bdev_req *req, int err)
{
	struct piece *p = req->priv;
	struct cache_vol *v = p->parent->v;
	int mode = atomic_load(&v->mode);

	if (err) {
		struct cache_set *cs = v->cs;
		bool to_back = p->stage == ST_BACKING || p->stage == ST_BACKING_INVAL;
		if (to_back)
			atomic_fetch_add(&v->bw_volatile, 1); /* it may have landed in part */
		if (p->stage == ST_CACHE_DATA && mode != CACHE_WRITE_BACK) {
			/* backing has the data; the stale cached copy must go */
			record(p, JOP_INVALIDATE, ST_RECORD);
			return;
		}
		if (to_back && p->pin && (atomic_load(&cs->slots[p->slot].bits) & SB_STATE_MASK) == SB_READY &&
		    !slot_any_dirty(cs, p->slot, p->first, p->count)) {
			/*
			 * The backing store may now hold part of the new data: a
			 * clean cached copy of the old must not stay (an eviction
			 * would change what the block reads). Dirty blocks stay:
			 * they are the only copy of acknowledged data.
			 */
			p->err = err;
			record(p, JOP_INVALIDATE, ST_RECORD);
			return;
		}
		piece_end(p, err);
		return;
	}
	if ((p->stage == ST_BACKING || p->stage == ST_BACKING_INVAL) && !(p->sub.flags & BDEV_F_FUA))
		atomic_fetch_add(&v->bw_volatile, 1);
	switch (p->stage) {
	case ST_CACHE_DATA:
		record(p, mode == CACHE_WRITE_BACK ? JOP_DIRTY : JOP_VALID, ST_RECORD);
		return;
	case ST_BACKING_INVAL:
		record(p, JOP_INVALIDATE, ST_RECORD);
		return;
	case ST_BACKING:
		if (p->pin && p->parent->up->op == BDEV_WRITE) {
			/* write-through: refresh the cached copy we kept pinned */
			to_cache(p);
			return;
		}
		piece_end(p, 0);
		return;
	}
	piece_end(p, 0);
}

/*
 * If any of the slot's bits in mask is set, park p (pin and bypass count
 * dropped) until it is cleared, then start it over from the lookup on this
 * worker; true if parked. The check under the slot lock pairs with the
 * clearer's, which wakes after clearing.
 */
static bool park_while(struct piece *p, uint32_t mask)
{
	struct cache_set *cs = p->parent->v->cs;
	struct slot *sl = &cs->slots[p->slot];

	slot_lock(sl);
	bool busy = atomic_load(&sl->bits) & mask;
	if (busy) {
		p->dwait.fn = retry_piece;
		p->dwait.arg = p;
		p->dwait.mask = mask;
		cache_slot_wait(cs, p->slot, &p->dwait);
	}
	slot_unlock(sl);
	if (!busy)
		return false;
	intent_drop(cs, p);
	slot_unpin(cs, p);
	bypass_put(cs, p);
	slice_free(p->iov, p->iov_inline);
	p->iov = NULL;
	return true;
}

/*
 * Send the piece to the backing store, then invalidate its cached blocks
 * durably (write-around, pass-through, UNMAP, WRITE_ZEROES, and a
 * write-through write over dirty blocks). The writer pin held all along
 * keeps the cleaner off the slot (it skips slots with writers), so old
 * dirty data cannot be destaged over the new data; a destage already
 * running is waited for. The order matters for crashes: invalidating first
 * would, after a cut between the two steps, expose the backing store's
 * older data in place of the dirty copy.
 */
static void backing_then_invalidate_cont(void *arg);

static void backing_then_invalidate(struct piece *p)
{
	/*
	 * Wait for a running destage to end, parked (not re-posted: a piece
	 * that re-posts itself keeps its worker in run_posts, and when that is
	 * worker 0 the destage's own completions never run). The retry starts
	 * over from the lookup; it runs on this worker, after this returns.
	 */
	if (park_while(p, SB_DESTAGING))
		return;
	if (!piece_intent(p, backing_then_invalidate_cont))
		return; /* parked: comes back here, destage check included */
	p->stage = ST_BACKING_INVAL;
	submit_sub(p, p->parent->v->backing, p->parent->up->op, p->parent->up->flags & BDEV_F_FUA, p->off);
}

static void backing_then_invalidate_cont(void *arg) { backing_then_invalidate(arg); }

/* Worker thread; the RCU read lock is held around the lookup and pin only. */
static void piece_write(struct piece *p)
{
	struct vreq *r = p->parent;
	struct cache_vol *v = r->v;
	struct cache_set *cs = v->cs;
	int mode = atomic_load(&v->mode);
	bool is_write = r->up->op == BDEV_WRITE;

	p->fresh = false;
	if (slice_into(r->up, p->data_off, is_write ? p->len : 0, p->iov_inline, &p->iov, &p->iovcnt) < 0) {
		piece_end(p, -ENOMEM);
		return;
	}
	/* Counted before the lookup: a fill that starts later sees it. */
	p->bucket = bypass_bucket(p->key);
	atomic_fetch_add(&cs->bypass[p->bucket], 1);

	rcu_read_lock();
	uint32_t st = pin_lookup(cs, p, true);
	rcu_read_unlock();
	if (st == SB_FILLING)
		st = cancel_fill(cs, p) ? SB_READY : SB_FREE; /* READY: the fill had finished */
	/* a top-up writing the legs: wait (the lock-free test pairs with topup_read's) */
	if (st == SB_READY && (atomic_load(&cs->slots[p->slot].bits) & SB_TOPUP_WR) &&
	    park_while(p, SB_TOPUP_WR))
		return;

	bool around = !is_write || mode == CACHE_WRITE_AROUND || mode == CACHE_PASS_THROUGH;
	if (st == SB_READY &&
	    (around || (mode == CACHE_WRITE_THROUGH && slot_any_dirty(cs, p->slot, p->first, p->count)))) {
		backing_then_invalidate(p);
		return;
	}
	if (around || mode == CACHE_WRITE_THROUGH) {
		if (st == SB_READY)
			atomic_fetch_add(&cs->st_write_hits, 1);
		else
			atomic_fetch_add(&cs->st_write_misses, 1);
		to_backing(p); /* write-through keeps its pin and refreshes the copy after */
		return;
	}
	/* write-back */
	if (mirror_all_failed(&cs->mirror)) {
		/* no leg to hold it: the backing store takes it; dirty blocks lost stay unreadable */
		slot_unpin(cs, p);
		to_backing(p);
		return;
	}
	if (st == SB_READY) {
		atomic_fetch_add(&cs->st_write_hits, 1);
		policy_touch(cs->policy, p->slot);
		bypass_put(cs, p);
		to_cache(p);
		return;
	}
	atomic_fetch_add(&cs->st_write_misses, 1);
	if (policy_admit(cs->policy, p->key, v->bid, p->off, (uint32_t)p->len, true)) {
		uint32_t existing = POLICY_NO_SLOT;
		uint32_t s = cache_alloc_slot(cs, p->key, SB_READY, &existing);
		if (s == POLICY_NO_SLOT && existing != POLICY_NO_SLOT) {
			/* someone else's slot for this extent, pinned for us */
			p->slot = existing;
			p->pin = SU_WRITER;
			if ((atomic_load(&cs->slots[existing].bits) & SB_TOPUP_WR) && park_while(p, SB_TOPUP_WR))
				return;
			if ((atomic_load(&cs->slots[existing].bits) & SB_STATE_MASK) == SB_FILLING &&
			    !cancel_fill(cs, p)) {
				to_backing(p);
				return;
			}
			bypass_put(cs, p);
			to_cache(p);
			return;
		}
		if (s != POLICY_NO_SLOT) {
			p->slot = s;
			p->pin = SU_WRITER;
			p->fresh = true;
			bypass_put(cs, p);
			to_cache(p);
			return;
		}
	}
	to_backing(p);
}

static void retry_piece(void *arg)
{
	struct piece *p = arg;
	piece_write(p);
}

/* ---- submit -------------------------------------------------------------------- */

static void vreq_sub_done(struct bdev_req *req, int err)
{
	struct vreq *r = req->priv;
	if (req->op == BDEV_FLUSH && !err)
		counter_max(&r->v->bw_flushed, r->flush_covers);
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
	r->pending = 1;
	atomic_fetch_add(&cs->fg_inflight, 1);
	atomic_store_explicit(&cs->last_io_ms, now_ms(), memory_order_relaxed);

	if (req->op == BDEV_FLUSH) {
		r->pending++;
		r->flush_covers = atomic_load(&v->bw_volatile);
		r->sub = *req;
		r->sub.done = vreq_sub_done;
		r->sub.priv = r;
		bdev_submit(v->backing, &r->sub);
	} else {
		uint64_t ext = cs->lay.extent_size;
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

/* Main thread, no request in flight: frees the volume, closes its backing. */
static void vol_close(struct bdev *dev)
{
	struct cache_vol *v = (struct cache_vol *)dev;
	struct cache_set *cs = v->cs;
	atomic_store(&cs->vols[v->bid], NULL);
	bdev_close(v->backing); /* stops the owner callbacks before v goes */
	pthread_mutex_destroy(&v->own_mu);
	free(v->gen_path);
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
	pthread_mutex_lock(&cs->alloc_lock); /* the map's table cannot change under it */
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
	pthread_mutex_unlock(&cs->alloc_lock);
	return r;
}

static void vol_resize_recorded(void *arg, int err)
{
	struct cache_set *cs = arg;
	if (err)
		log_err("cache %s: cannot record a backing store's new size in the superblock: %s",
			cs->name, strerror(-err));
}

/* The backing store changed size (an RBD image resized): the volume
 * follows, the superblock's record of the backing store takes the new
 * size (else the next start would take it for another store), then the
 * volume tells its own listener (the LU). Driver's thread. */
static void vol_backing_resized(void *arg, uint64_t size)
{
	struct cache_vol *v = arg;
	struct cache_set *cs = v->cs;
	__atomic_store_n(&v->dev.size, size, __ATOMIC_RELAXED);
	pthread_mutex_lock(&cs->sb_lock);
	cs->backing[v->bid].size = le64_of(size);
	pthread_mutex_unlock(&cs->sb_lock);
	cache_sb_write(cs, vol_resize_recorded, cs);
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

static const struct bdev_ops vol_ops = {
	.submit = vol_submit,
	.close = vol_close,
	.lba_status = vol_lba_status,
	.set_resize_listener = vol_set_resize_listener,
};

/* ---- ownership of a shared backing store -------------------------------------------------- */

/*
 * An RBD image several gateways export (bdev.h "Ownership"): the volume
 * passes the backing's owner ops up to the LU, and on every gain drops the
 * copies it holds of the image unless nobody else can have written it
 * since: the previous owner was this gateway and the generation before the
 * gain is the one recorded at our own last gain (kept in gen_path, a small
 * file in the state_dir written after the drop is durable and before the
 * LU is told, so a warm restart of a single-gateway write-back LUN keeps
 * its cache, and a gateway that served in between makes us drop it).
 * The drop runs while the backing's state still reads TRANSITION, so no
 * I/O of this volume runs meanwhile (the LU serves media access only when
 * OWNED); fills already in flight are cancelled (SB_CANCEL) so they cannot
 * bring old data back.
 */

struct vol_inval {
	struct cache_vol *v;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool pass_done;
	int pending;                /* INVALIDATE records not yet durable */
	uint32_t busy;              /* slots skipped: a destage runs on them */
	uint64_t slots, dirty;      /* dropped in this pass */
	struct jwait *jw;
	uint32_t njw;
	int err;
};

static void inval_finish(struct vol_inval *iv)
{
	pthread_mutex_lock(&iv->mu);
	iv->pass_done = true;
	pthread_cond_signal(&iv->cv);
	pthread_mutex_unlock(&iv->mu);
}

static void inval_rec_done(struct jwait *w, int err)
{
	struct vol_inval *iv = *(struct vol_inval **)((char *)w - sizeof(void *));
	if (err && !iv->err)
		iv->err = err;
	if (--iv->pending == 0)
		inval_finish(iv);
}

/* Worker thread: one pass over the set's slots for this volume's extents. */
static void inval_pass(void *arg)
{
	struct vol_inval *iv = arg;
	struct cache_vol *v = iv->v;
	struct cache_set *cs = v->cs;
	size_t per = sizeof(void *) + sizeof(struct jwait);
	uint32_t n = 0;

	iv->pending = 1; /* guard */
	for (uint32_t s = 0; s < cs->lay.nslots; s++) {
		struct slot *sl = &cs->slots[s];
		uint64_t key = atomic_load(&sl->key);
		if (key == CACHE_KEY_NONE || key_bid(key) != v->bid)
			continue;
		slot_lock(sl);
		uint32_t bits = atomic_load(&sl->bits);
		uint32_t st = bits & SB_STATE_MASK;
		if (atomic_load(&sl->key) != key) {
			slot_unlock(sl);
			continue;
		}
		if (st == SB_FILLING || (st == SB_READY && (bits & SB_TOPUP)))
			atomic_fetch_or(&sl->bits, SB_CANCEL); /* the fill or top-up is dropped */
		if (st == SB_FILLING) {
			slot_unlock(sl);
			continue;
		}
		if (st != SB_READY || !(bits & (SB_FULL_VALID | SB_HAS_BM | SB_DIRTY))) {
			slot_unlock(sl);
			continue;
		}
		if (bits & SB_DESTAGING) {
			iv->busy++;
			slot_unlock(sl);
			continue;
		}
		if (n == iv->njw) {
			slot_unlock(sl);
			iv->busy++; /* out of records for this pass: the next pass takes it */
			break;
		}
		char *e = (char *)iv->jw + (size_t)n * per;
		*(struct vol_inval **)e = iv;
		struct jwait *w = (struct jwait *)(e + sizeof(void *));
		w->done = inval_rec_done;
		if (bits & SB_DIRTY)
			iv->dirty++;
		cache_record_locked(cs, s, key, JOP_INVALIDATE, 0, cs->lay.bpe, w);
		slot_unlock(sl);
		iv->slots++;
		iv->pending++;
		n++;
		journal_append(cs, w);
	}
	if (--iv->pending == 0)
		inval_finish(iv);
}

/*
 * Drop every cached extent of v durably. The backing's driver thread (may
 * block). Bounded: when the workers are gone (a gain racing the daemon's
 * stop) or the journal hangs, it gives up with -ETIMEDOUT and leaves the
 * pass's memory behind for a worker that might still run it.
 */
#define VOL_DROP_TIMEOUT_S 60
static int vol_drop_all(struct cache_vol *v, uint64_t *slots, uint64_t *dirty)
{
	struct vol_inval *iv = calloc(1, sizeof(*iv));
	size_t per = sizeof(void *) + sizeof(struct jwait);
	int r = 0;

	if (!iv)
		return -ENOMEM;
	iv->v = v;
	iv->njw = 4096;
	iv->jw = calloc(iv->njw, per);
	if (!iv->jw) {
		free(iv);
		return -ENOMEM;
	}
	pthread_mutex_init(&iv->mu, NULL);
	pthread_cond_init(&iv->cv, NULL);
	for (;;) {
		iv->pass_done = false;
		iv->busy = 0;
		int tries = 0;
		while (worker_post(worker_get(0), inval_pass, iv) < 0 && ++tries < 1000)
			usleep(1000);
		if (tries == 1000) {
			r = -ESHUTDOWN;
			break;
		}
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += VOL_DROP_TIMEOUT_S;
		pthread_mutex_lock(&iv->mu);
		while (!iv->pass_done && r == 0)
			if (pthread_cond_timedwait(&iv->cv, &iv->mu, &ts) == ETIMEDOUT)
				r = -ETIMEDOUT;
		pthread_mutex_unlock(&iv->mu);
		if (r == -ETIMEDOUT)
			return r; /* iv stays: a late pass may still touch it */
		if (!iv->busy || iv->err)
			break;
		usleep(10000); /* a destage is running on some slot: let it end */
	}
	pthread_cond_destroy(&iv->cv);
	pthread_mutex_destroy(&iv->mu);
	*slots = iv->slots;
	*dirty = iv->dirty;
	if (!r)
		r = iv->err;
	free(iv->jw);
	free(iv);
	return r;
}

/* Persist gen as the generation our cached copies belong to (durable on return). */
static int gen_store(const char *path, uint64_t gen)
{
	char tmp[4096];
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	FILE *f = fopen(tmp, "w");
	if (!f)
		return -errno;
	fprintf(f, "%llu\n", (unsigned long long)gen);
	int r = fflush(f) == 0 && fsync(fileno(f)) == 0 ? 0 : -errno;
	if (fclose(f) != 0 && !r)
		r = -errno;
	if (!r && rename(tmp, path) < 0)
		r = -errno;
	if (!r) {
		/* the rename itself: fsync the directory */
		char dir[4096];
		snprintf(dir, sizeof(dir), "%s", path);
		char *slash = strrchr(dir, '/');
		if (slash)
			*slash = '\0';
		int fd = open(slash ? dir : ".", O_RDONLY | O_DIRECTORY);
		if (fd >= 0) {
			fsync(fd);
			close(fd);
		}
	}
	return r;
}

/* The backing's ownership changed (its driver's thread). */
static void vol_owner_changed(void *arg, const struct bdev_owner_change *c)
{
	struct cache_vol *v = arg;

	if (c->state == BDEV_OWNER_OWNED) {
		pthread_mutex_lock(&v->own_mu);
		uint64_t recorded = v->recorded_gen;
		char *path = v->gen_path ? strdup(v->gen_path) : NULL;
		pthread_mutex_unlock(&v->own_mu);
		bool keep = c->prev_owner_us && c->prev_gen == recorded && recorded;
		bool clean = true; /* no stale copy left: the generation may be recorded */
		if (keep) {
			atomic_store(&v->drop_failed, false);
			log_info("cache lun %s: nobody else owned %s since generation %llu; the cache stays",
				 v->name, v->backing->name, (unsigned long long)recorded);
		} else {
			uint64_t slots = 0, dirty = 0;
			int r = vol_drop_all(v, &slots, &dirty);
			/* stale copies may remain: this gateway must not serve the image */
			atomic_store(&v->drop_failed, r < 0);
			clean = r >= 0;
			if (r < 0)
				log_err("cache lun %s: dropping the cached copies failed (%s); the LUN stays "
					"unavailable on this gateway until a later takeover succeeds", v->name,
					strerror(-r));
			if (dirty)
				log_err("cache lun %s: %llu extent(s) held dirty data that another gateway "
					"never saw; they are dropped, since the image was served without them",
					v->name, (unsigned long long)dirty);
			log_info("cache lun %s: generation %llu (previous %llu%s, ours %llu): %llu cached "
				 "extent(s) dropped", v->name, (unsigned long long)c->gen,
				 (unsigned long long)c->prev_gen, c->prev_owner_us ? ", this gateway" : "",
				 (unsigned long long)recorded, (unsigned long long)slots);
		}
		/* After a failed drop the generation is not recorded (in memory or in
		 * the file): a later gain, or a restart, must drop again rather than
		 * take this one for a gain that left the cache clean. */
		if (path && clean) {
			int r = gen_store(path, c->gen);
			if (r < 0)
				log_err("cache lun %s: cannot keep the owner generation in %s: %s; the next "
					"start drops this LUN's cache", v->name, path, strerror(-r));
		}
		free(path);
		if (clean) {
			pthread_mutex_lock(&v->own_mu);
			v->recorded_gen = c->gen;
			pthread_mutex_unlock(&v->own_mu);
		}
	}
	pthread_mutex_lock(&v->own_mu);
	void (*fn)(void *, const struct bdev_owner_change *) = v->up_fn;
	void *up = v->up_arg;
	pthread_mutex_unlock(&v->own_mu);
	if (fn)
		fn(up, c);
}

static struct bdev_owner_ops const *vol_bowner(struct bdev *dev)
{
	return ((struct cache_vol *)dev)->backing->ops->owner;
}

static enum bdev_owner_state vol_owner_state(struct bdev *dev, uint64_t *gen)
{
	struct cache_vol *v = (struct cache_vol *)dev;
	enum bdev_owner_state st = vol_bowner(dev)->state(v->backing, gen);
	if (st == BDEV_OWNER_OWNED && atomic_load_explicit(&v->drop_failed, memory_order_relaxed))
		return BDEV_OWNER_LOST;
	return st;
}

static void vol_owner_acquire(struct bdev *dev)
{
	struct cache_vol *v = (struct cache_vol *)dev;
	vol_bowner(dev)->acquire(v->backing);
}

/* Register with the backing once (main thread). */
static void vol_owner_attach(struct cache_vol *v)
{
	pthread_mutex_lock(&v->own_mu);
	bool first = !v->listening;
	v->listening = true;
	pthread_mutex_unlock(&v->own_mu);
	if (first)
		v->backing->ops->owner->listen(v->backing, vol_owner_changed, v);
}

static void vol_owner_listen(struct bdev *dev, void (*fn)(void *arg, const struct bdev_owner_change *c),
			     void *arg)
{
	struct cache_vol *v = (struct cache_vol *)dev;
	pthread_mutex_lock(&v->own_mu);
	v->up_fn = fn;
	v->up_arg = arg;
	pthread_mutex_unlock(&v->own_mu);
	vol_owner_attach(v);
}

static uint32_t vol_owner_group(struct bdev *dev)
{
	struct cache_vol *v = (struct cache_vol *)dev;
	const struct bdev_owner_ops *o = vol_bowner(dev);
	return o->owner_group ? o->owner_group(v->backing) : 0;
}

static const struct bdev_owner_ops vol_owner_ops = {
	.state = vol_owner_state,
	.acquire = vol_owner_acquire,
	.listen = vol_owner_listen,
	.owner_group = vol_owner_group,
};

int cache_vol_owner_track(struct bdev *vol, const char *gen_path, char *err, size_t errlen)
{
	struct cache_vol *v = (struct cache_vol *)vol;

	if (!bdev_is_shared(v->backing))
		return 0;
	uint64_t gen = 0;
	FILE *f = gen_path ? fopen(gen_path, "r") : NULL;
	if (f) {
		unsigned long long g = 0;
		if (fscanf(f, "%llu", &g) == 1)
			gen = g;
		fclose(f);
	} else if (gen_path && errno != ENOENT) {
		snprintf(err, errlen, "cannot read %s: %s", gen_path, strerror(errno));
		return -1;
	}
	pthread_mutex_lock(&v->own_mu);
	free(v->gen_path);
	v->gen_path = gen_path ? strdup(gen_path) : NULL;
	v->recorded_gen = gen;
	pthread_mutex_unlock(&v->own_mu);
	vol_owner_attach(v);
	return 0;
}

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
	return v;
}

/* Main thread or control thread. */
enum cache_mode cache_vol_mode(struct cache_vol *v) { return (enum cache_mode)atomic_load(&v->mode); }
void cache_vol_store_mode(struct cache_vol *v, enum cache_mode m) { atomic_store(&v->mode, (int)m); }
const char *cache_vol_name(struct cache_vol *v) { return v->name; }
uint32_t cache_vol_bid(struct cache_vol *v) { return v->bid; }
