/*
 * vol_write.c - a piece of a WRITE, UNMAP or WRITE ZEROES: the slot looked
 * up and pinned, a fill in the way cancelled, a top-up in the way waited
 * for; then the cache mode's write (mode_wb.c, mode_wt.c, mode_around.c)
 * picks the stages, which live here: to the legs (to_cache: FUA, then a
 * journal record, or both at once over blocks already valid, or no record
 * over blocks already dirty (wb_trips);
 * overwrites of dirty blocks on a guarded volume through the block log
 * first), to the backing store (to_backing), or to the
 * backing store and then the cached blocks invalidated durably
 * (backing_then_invalidate).
 *
 * Threading: on the submitting worker; waits are re-posts, never sleeps.
 */
#include "cache/cache_int.h"
#include "cache/vol_int.h"

/* ---- writes ------------------------------------------------------------------ */

enum { ST_CACHE_DATA = 1, ST_BACKING, ST_RECORD, ST_BACKING_INVAL, ST_ONE_TRIP, ST_NO_RECORD };

static void write_step(struct bdev_req *req, int err);

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

void to_backing(struct piece *p)
{
	struct vreq *r = p->parent;
	r->how |= VH_BACKING;
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

/* Both halves of a one-trip write: the second to finish ends the piece. */
static void one_trip_half(struct piece *p, int err)
{
	if (err && !p->err)
		p->err = err;
	if (--p->pending == 0)
		piece_end(p, p->err);
}

static void one_trip_recorded(struct jwait *w, int err)
{
	one_trip_half(caa_container_of(w, struct piece, jw), err);
}

/*
 * A write-back write whose blocks are all valid already may send its DIRTY
 * record with its data instead of after it, and is acknowledged after one
 * round trip to the legs. The order data-then-record exists so that a
 * record never names blocks whose data is not there; over valid blocks the
 * worst a power cut can leave is a record naming blocks that hold the old
 * data, or a mix of old and new sectors, on one leg or both, and recovery
 * makes the legs agree on the slot (its write-intent region is durable
 * before either write is sent): every sector then reads its last
 * acknowledged write or this one, the same on both legs. Blocks that were
 * not valid hold leftovers of another extent, which such a record would
 * expose, so those writes keep the two trips; so do writes under the
 * torn-write guard, whose block is all old or all new. The record is
 * applied in RAM and given its seq now, as every record is, atomically
 * with the check: the checkpoint's snapshot and recovery's seq order are
 * unchanged. ST_ONE_TRIP: the record is taken (p->jw), append it.
 *
 * An overwrite of blocks that are all dirty already, by the slot's only
 * writer, needs no record at all (ST_NO_RECORD): a record would say
 * "valid and dirty", which the journal and table already say durably.
 * Durably, because only a write sets a block dirty, it holds its pin until
 * its record is durable, and with no other writer pinned the last record
 * on these blocks is such a write's (a CLEAN after our pin is refused by
 * the write generation, an INVALIDATE comes from a writer that pins after
 * us and so carries a later seq). A power cut then leaves the slot's
 * region reconciled as above (ST_NO_RECORD). Otherwise the two trips
 * (ST_CACHE_DATA, then record()). Returns the stage of the data write.
 */
static int wb_trips(struct piece *p)
{
	struct cache_vol *v = p->parent->v;
	struct cache_set *cs = v->cs;
	if (!p->pin || p->fresh || p->logged || atomic_load(&v->guard_torn) ||
	    !vol_mode(atomic_load(&v->mode))->dirty)
		return ST_CACHE_DATA;
	struct slot *sl = &cs->slots[p->slot];
	int how = ST_CACHE_DATA;
	slot_lock(sl);
	if ((atomic_load(&sl->bits) & SB_STATE_MASK) == SB_READY) {
		if ((atomic_load(&sl->users) >> 16) == 1 && slot_all_dirty(cs, p->slot, p->first, p->count)) {
			how = ST_NO_RECORD;
			atomic_fetch_add_explicit(&cs->st.no_record_writes, 1, memory_order_relaxed);
		} else if (slot_all_valid(cs, p->slot, p->first, p->count)) {
			how = ST_ONE_TRIP;
			atomic_fetch_add_explicit(&cs->st.one_trip_writes, 1, memory_order_relaxed);
			cache_record_locked(cs, p->slot, atomic_load(&sl->key), JOP_DIRTY, p->first, p->count, &p->jw);
		}
	}
	slot_unlock(sl);
	return how;
}

void to_cache(struct piece *p)
{
	struct cache_set *cs = p->parent->v->cs;
	p->parent->how |= VH_CACHE;
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
	p->stage = wb_trips(p);
	if (p->stage == ST_ONE_TRIP) {
		/* data and record in flight together; piece_end when both are durable */
		p->pending = 2;
		p->err = 0;
		p->jw.done = one_trip_recorded;
	}
	submit_sub(p, &cs->mirror.dev, BDEV_WRITE, BDEV_F_FUA,
		   slot_leg_off(cs, p->slot) + (uint64_t)p->first * CACHE_SECTOR);
	if (p->stage == ST_ONE_TRIP)
		journal_append(cs, &p->jw);
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
	vol_dlog_drop(cs, p);
	cache_record(cs, p->slot, op, p->first, p->count, &p->jw);
}

static void write_step(struct bdev_req *req, int err)
{
	struct piece *p = req->priv;
	struct cache_vol *v = p->parent->v;
	int mode = atomic_load(&v->mode);

	/* after an error, a one-trip record stands: it names valid blocks holding old data, or part new */
	if (p->stage == ST_ONE_TRIP) {
		one_trip_half(p, err);
		return;
	}
	if (p->stage == ST_NO_RECORD) {
		piece_end(p, err);
		return;
	}
	if (err) {
		struct cache_set *cs = v->cs;
		bool to_back = p->stage == ST_BACKING || p->stage == ST_BACKING_INVAL;
		if (to_back)
			atomic_fetch_add(&v->bw_volatile, 1); /* it may have landed in part */
		if (p->stage == ST_CACHE_DATA && !vol_mode(mode)->dirty) {
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
		record(p, vol_mode(mode)->dirty ? JOP_DIRTY : JOP_VALID, ST_RECORD);
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

/* A parked piece lets go of what it held; it takes it all again when it starts over. */
static void piece_unwind(struct cache_set *cs, struct piece *p)
{
	vol_intent_drop(cs, p);
	vol_slot_unpin(cs, p);
	vol_bypass_put(cs, p);
	vol_slice_free(p->iov, p->iov_inline);
	p->iov = NULL;
}

/*
 * If any of the slot's bits in mask is set, park p (pin and bypass count
 * dropped) until it is cleared, then start it over from the lookup on this
 * worker; true if parked. The check under the slot lock pairs with the
 * clearer's, which wakes after clearing.
 */
bool park_while(struct piece *p, uint32_t mask)
{
	struct cache_set *cs = p->parent->v->cs;
	struct slot *sl = &cs->slots[p->slot];

	slot_lock(sl);
	bool busy = atomic_load(&sl->bits) & mask;
	if (busy) {
		p->dwait.fn = vol_piece_retry;
		p->dwait.arg = p;
		p->dwait.mask = mask;
		cache_slot_wait(cs, p->slot, &p->dwait);
	}
	slot_unlock(sl);
	if (!busy)
		return false;
	piece_unwind(cs, p);
	return true;
}

bool park_evicted(struct piece *p)
{
	struct cache_set *cs = p->parent->v->cs;
	if (!cache_evicted_wait(cs, p->key, &p->dwait, vol_piece_retry, p))
		return false;
	piece_unwind(cs, p);
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

void backing_then_invalidate(struct piece *p)
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
	p->parent->how |= VH_BACKING;
	p->stage = ST_BACKING_INVAL;
	unsigned fl = p->parent->up->flags & BDEV_F_FUA;
	/*
	 * Dirty blocks in the range are the only copy of data the host may
	 * have synced: once the INVALIDATE record is durable they are gone, so
	 * the backing store must hold the new data durably before it is
	 * written, or a power cut could bring back data older than a sync.
	 */
	if (p->parent->up->op == BDEV_WRITE && slot_any_dirty(p->parent->v->cs, p->slot, p->first, p->count))
		fl |= BDEV_F_FUA;
	submit_sub(p, p->parent->v->backing, p->parent->up->op, fl, p->off);
}

static void backing_then_invalidate_cont(void *arg) { backing_then_invalidate(arg); }

/* Worker thread; the RCU read lock is held around the lookup and pin only. */
void piece_write(struct piece *p)
{
	struct vreq *r = p->parent;
	struct cache_vol *v = r->v;
	struct cache_set *cs = v->cs;
	int mode = atomic_load(&v->mode);
	bool is_write = r->up->op == BDEV_WRITE;

	p->fresh = false;
	if (vol_slice_into(r->up, p->data_off, is_write ? p->len : 0, p->iov_inline, &p->iov, &p->iovcnt) < 0) {
		piece_end(p, -ENOMEM);
		return;
	}
	/* Counted before the lookup: a fill that starts later sees it. */
	p->bucket = bypass_bucket(p->key);
	atomic_fetch_add(&cs->bypass[p->bucket], 1);

	rcu_read_lock();
	uint32_t st = vol_pin_lookup(cs, p, true);
	rcu_read_unlock();
	if (st == SB_FILLING)
		st = vol_cancel_fill(cs, p) ? SB_READY : SB_FREE; /* READY: the fill had finished */
	/* a top-up writing the legs: wait (the lock-free test pairs with topup_read's) */
	if (st == SB_READY && (atomic_load(&cs->slots[p->slot].bits) & SB_TOPUP_WR) &&
	    park_while(p, SB_TOPUP_WR))
		return;
	if (st == SB_FREE && park_evicted(p))
		return;

	/* UNMAP and WRITE ZEROES go around the cache in every mode */
	(is_write ? vol_mode(mode) : &vol_mode_around)->write(p, st);
}

void vol_piece_retry(void *arg)
{
	struct piece *p = arg;
	piece_write(p);
}
