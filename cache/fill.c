/*
 * fill.c - bringing backing-store data into the cache: promotion of a
 * whole extent on an admitted miss (fills) and top-ups of the invalid
 * blocks of a partly valid extent, and the durability rule both follow:
 * data read from the backing store is cached only once what was written
 * there before the read is known durable (a backing flush covers it).
 *
 * A fill gives up when a write to its extent bypasses the cache meanwhile
 * (the per-bucket bypass counter) or cancels it (SB_CANCEL), so it never
 * caches data older than an acknowledged write.
 *
 * Threading: started by reads on a worker; runs on that worker.
 */
#include "cache/cache_int.h"
#include "cache/vol_int.h"

#include "common/bufpool.h"

/* ---- durability of what is read from the backing store ------------------------ */

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
		vol_counter_max(&v->bw_flushed, gen);
}

/* ---- fills (promotion) ------------------------------------------------------ */

static void fill_end(struct fill *f, bool keep)
{
	struct cache_vol *v = f->v;
	struct cache_set *cs = v->cs;
	if (!keep)
		cache_drop_slot(cs, f->slot);
	buf_put(f->buf, cs->lay.extent_size);
	POOL_PUT(fill_free, f);
	cache_vol_release(v); /* the last touch of v */
	atomic_fetch_sub(&cs->bg_inflight, 1);
}

static void fill_recorded(struct jwait *w, int err)
{
	struct fill *f = caa_container_of(w, struct fill, jw);
	atomic_fetch_add(&f->v->cs->st.promotions, 1);
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
void vol_fill_start(struct cache_vol *v, uint64_t key)
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
	cache_vol_hold(v);
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
	struct cache_vol *v = t->v;
	struct cache_set *cs = v->cs;
	atomic_fetch_sub(&cs->slots[t->slot].users, SU_READER);
	if (t->buf)
		buf_put(t->buf, cs->lay.extent_size);
	POOL_PUT(topup_free, t);
	cache_vol_release(v); /* the last touch of v */
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
	atomic_fetch_add(&t->v->cs->st.topups, 1);
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
void vol_topup_start(struct cache_vol *v, uint32_t s, uint64_t key)
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
	if ((bits & SB_STATE_MASK) == SB_READY && !(bits & (SB_TOPUP | SB_CANCEL)) &&
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
	cache_vol_hold(v);
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
