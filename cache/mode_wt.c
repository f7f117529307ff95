/*
 * mode_wt.c - write-through: a write goes to the backing store first (with
 * the initiator's FUA); a cached copy, kept pinned meanwhile, is refreshed
 * after it (VALID record), so the legs never hold data the backing store
 * does not. A cached extent with dirty blocks in the range (left by an
 * earlier write-back run) is invalidated instead, after the backing write.
 *
 * Threading: on the submitting worker.
 */
#include "cache/cache_int.h"
#include "cache/vol_int.h"

static void wt_write(struct piece *p, uint32_t st)
{
	struct cache_set *cs = p->parent->v->cs;

	if (st == SB_READY && slot_any_dirty(cs, p->slot, p->first, p->count)) {
		backing_then_invalidate(p);
		return;
	}
	atomic_fetch_add(st == SB_READY ? &cs->st.write_hits : &cs->st.write_misses, 1);
	to_backing(p); /* keeps its pin and refreshes the copy after */
}

const struct vol_mode_ops vol_mode_wt = { .write = wt_write, .dirty = false, .fills = true };
