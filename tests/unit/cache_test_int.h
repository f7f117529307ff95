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

/* One reclaim on worker w, as the allocator runs it; returns once it has journaled its FREE records. */
static inline void test_reclaim_on(struct cache_set *cs, unsigned w)
{
	struct sync_call c = { .cs = cs };
	REQUIRE(cache_sync_run_on(worker_get(w), test_reclaim_fn, &c) == 0, "reclaim on worker %u", w);
}

static inline void test_reclaim(struct cache_set *cs) { test_reclaim_on(cs, 0); }

#endif
