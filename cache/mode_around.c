/*
 * mode_around.c - write-around and pass-through: a write goes to the
 * backing store, and cached blocks it covers are invalidated durably after
 * it (before the status goes out), so the cache never returns old data.
 * Write-around still promotes on reads; pass-through caches nothing new.
 * UNMAP and WRITE ZEROES take this path in every mode.
 *
 * Threading: on the submitting worker.
 */
#include "cache/cache_int.h"
#include "cache/vol_int.h"

static void around_write(struct piece *p, uint32_t st)
{
	struct cache_set *cs = p->parent->v->cs;

	if (st == SB_READY) {
		backing_then_invalidate(p);
		return;
	}
	atomic_fetch_add(&cs->st.write_misses, 1);
	to_backing(p);
}

const struct vol_mode_ops vol_mode_around = { .write = around_write, .dirty = false, .fills = true };
const struct vol_mode_ops vol_mode_pt = { .write = around_write, .dirty = false, .fills = false };
