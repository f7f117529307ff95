/*
 * cache_test_int.h - helpers for the cache tests that reach into the
 * engine's internals (cache_int.h): waiting for its work to end, and
 * running the allocator's reclaim.
 */
#ifndef TC_CACHE_TEST_INT_H
#define TC_CACHE_TEST_INT_H

#include "cache/cache_int.h"
#include "tests/unit/cache_test_util.h"

/* Until no foreground or background work of the set is in flight (10 s at most). */
static inline void test_settle(struct cache_set *cs)
{
	for (int i = 0; i < 20000 && (atomic_load(&cs->bg_inflight) || atomic_load(&cs->fg_inflight)); i++)
		usleep(500);
}

static inline void test_reclaim_fn(void *arg)
{
	struct sync_call *c = arg;
	cache_reclaim(c->cs);
	cache_sync_done(c, 0);
}

/* One reclaim on a worker, as the allocator runs it; returns once it has journaled its FREE records. */
static inline void test_reclaim(struct cache_set *cs)
{
	struct sync_call c = { .cs = cs };
	cache_sync_run(test_reclaim_fn, &c);
}

#endif
