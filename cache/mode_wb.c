/*
 * mode_wb.c - write-back: a write goes to the legs (FUA on every healthy
 * leg) and is acknowledged once it and its DIRTY journal record are durable
 * (sent together over blocks already valid: vol_write.c's wb_trips); the
 * cleaner destages it later. A miss the policy admits takes a fresh slot;
 * one it does not, or that finds no free slot, goes to the backing store
 * (bypass). With no healthy leg the backing store takes the write.
 *
 * While the LUN's backing store is out of space (its last destage failed
 * with ENOSPC or EDQUOT: cache_vol_destage_failed), the cache takes only
 * overwrites of blocks it holds already: anything else would pile up dirty
 * data that cannot be destaged. A write over blocks it does not hold goes
 * to the backing store instead, as in write-through, so that one needing
 * new space there fails now (SPACE ALLOCATION FAILED WRITE PROTECT) and
 * one over space the file already owns still works; cached blocks it
 * covers are invalidated after it.
 *
 * Threading: on the submitting worker.
 */
#include "cache/cache_int.h"
#include "cache/vol_int.h"

static void wb_write(struct piece *p, uint32_t st)
{
	struct cache_vol *v = p->parent->v;
	struct cache_set *cs = v->cs;

	if (mirror_all_failed(&cs->mirror)) {
		/* no leg to hold it: the backing store takes it; dirty blocks lost stay unreadable */
		vol_slot_unpin(cs, p);
		to_backing(p);
		return;
	}
	if (vol_space_blocked(v)) {
		if (st == SB_READY && slot_all_valid(cs, p->slot, p->first, p->count)) {
			atomic_fetch_add(&cs->st.write_hits, 1);
			vol_bypass_put(cs, p);
			to_cache(p);
		} else if (st == SB_READY) {
			backing_then_invalidate(p);
		} else {
			atomic_fetch_add(&cs->st.write_misses, 1);
			to_backing(p);
		}
		return;
	}
	if (st == SB_READY) {
		atomic_fetch_add(&cs->st.write_hits, 1);
		policy_touch(cs->policy, p->slot);
		vol_bypass_put(cs, p);
		to_cache(p);
		return;
	}
	atomic_fetch_add(&cs->st.write_misses, 1);
	if (policy_admit_run(cs->policy, p->key, p->off, &p->run, true)) {
		uint32_t existing = POLICY_NO_SLOT;
		uint32_t s = cache_alloc_slot(cs, p->key, SB_READY, &existing);
		if (s == POLICY_NO_SLOT && existing != POLICY_NO_SLOT) {
			/* someone else's slot for this extent, pinned for us */
			p->slot = existing;
			p->pin = SU_WRITER;
			if ((atomic_load(&cs->slots[existing].bits) & SB_TOPUP_WR) && park_while(p, SB_TOPUP_WR))
				return;
			if ((atomic_load(&cs->slots[existing].bits) & SB_STATE_MASK) == SB_FILLING &&
			    !vol_cancel_fill(cs, p)) {
				to_backing(p);
				return;
			}
			vol_bypass_put(cs, p);
			to_cache(p);
			return;
		}
		if (s != POLICY_NO_SLOT) {
			p->slot = s;
			p->pin = SU_WRITER;
			p->fresh = true;
			vol_bypass_put(cs, p);
			to_cache(p);
			return;
		}
		/* refused because the extent began to be evicted since piece_write looked: wait too */
		if (park_evicted(p))
			return;
	}
	to_backing(p);
}

const struct vol_mode_ops vol_mode_wb = { .write = wb_write, .dirty = true, .fills = true };
