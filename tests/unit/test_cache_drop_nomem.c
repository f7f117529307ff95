/*
 * test_cache_drop_nomem.c - a worker that drops a slot while memory is
 * short never waits for an RCU grace period.
 *
 * cache_drop_slot (a fill that recorded nothing gives its slot back) puts
 * the slot on the free list only after a grace period, since lock-free
 * readers may still see it in the map. Normally an eviction batch carries
 * it through call_rcu. Without memory for that batch it used to call
 * synchronize_rcu() on the worker: one reader anywhere then stalled every
 * session on that worker. Here calloc fails for the batch (the test links
 * with --wrap=calloc) while another thread sits in an RCU read-side
 * critical section, and:
 *  - the drop returns while the reader still holds its lock (bounded wait:
 *    a drop that waits for the reader never returns until it lets go);
 *  - the slot is not free yet while the reader holds on (it was graced,
 *    not freed early);
 *  - once the reader lets go the slot reaches the free list, and a second
 *    drop after that goes the same way.
 */
#include "cache/cache_int.h"
#include "tests/unit/cache_test_util.h"

#include <semaphore.h>
#include <time.h>

void *__real_calloc(size_t n, size_t size);
void *__wrap_calloc(size_t n, size_t size);

static __thread int fail_callocs;   /* the next N callocs on this thread fail */
static atomic_int failed_callocs;

void *__wrap_calloc(size_t n, size_t size)
{
	if (fail_callocs > 0) {
		fail_callocs--;
		atomic_fetch_add(&failed_callocs, 1);
		return NULL;
	}
	return __real_calloc(n, size);
}

static struct cache_set_cfg cfg = {
	.name = "nomem", .nlegs = 2, .extent_size = 64u << 10, .mode = CACHE_WRITE_BACK,
	.admit_hits = 1, .dirty_target = 90,
};

struct drop_job {
	struct cache_set *cs;
	uint64_t key;
	uint32_t slot;
	sem_t done;
};

static void drop_on_worker(void *arg)
{
	struct drop_job *j = arg;
	j->slot = cache_alloc_slot(j->cs, j->key, SB_FILLING, NULL);
	if (j->slot != POLICY_NO_SLOT) {
		fail_callocs = 1; /* the eviction batch */
		cache_drop_slot(j->cs, j->slot);
		fail_callocs = 0;
	}
	sem_post(&j->done);
}

static atomic_int reader_state; /* 1 holding the read lock, 2 told to let go, 3 gone */

static void *reader(void *arg)
{
	(void)arg;
	rcu_register_thread();
	rcu_read_lock();
	atomic_store(&reader_state, 1);
	while (atomic_load(&reader_state) != 2)
		usleep(1000);
	rcu_read_unlock();
	rcu_unregister_thread();
	atomic_store(&reader_state, 3);
	return NULL;
}

static bool wait_nfree(struct cache_set *cs, uint32_t want, int secs)
{
	for (int i = 0; i < secs * 100; i++) {
		if (atomic_load(&cs->alloc.nfree) == want)
			return true;
		usleep(10000);
	}
	return false;
}

static void drop_once(struct cache_set *cs, uint64_t key, bool hold_reader)
{
	struct drop_job j = { .cs = cs, .key = key };
	pthread_t rt;
	uint32_t before = atomic_load(&cs->alloc.nfree);
	int failed_before = atomic_load(&failed_callocs);

	sem_init(&j.done, 0, 0);
	if (hold_reader) {
		atomic_store(&reader_state, 0);
		REQUIRE(pthread_create(&rt, NULL, reader, NULL) == 0, "reader thread");
		while (atomic_load(&reader_state) != 1)
			usleep(1000);
	}
	REQUIRE(worker_post(worker_get(0), drop_on_worker, &j) == 0, "post");
	bool returned = sem_wait_secs(&j.done, 30);
	if (hold_reader && !returned) {
		atomic_store(&reader_state, 2); /* let the stuck worker go before failing */
		sem_wait_secs(&j.done, 30);
	}
	CHECK(returned, "the drop returned while a reader held the RCU read lock (key %llu)",
	      (unsigned long long)key);
	REQUIRE(j.slot != POLICY_NO_SLOT, "a free slot for key %llu", (unsigned long long)key);
	CHECK(atomic_load(&failed_callocs) == failed_before + 1, "the batch allocation was refused");
	if (hold_reader && returned) {
		CHECK(atomic_load(&cs->alloc.nfree) == before - 1 &&
			      (atomic_load(&cs->slots[j.slot].bits) & SB_RETIRED),
		      "the slot waits, retired, while the reader holds on (nfree %u, was %u)",
		      atomic_load(&cs->alloc.nfree), before);
		atomic_store(&reader_state, 2);
	}
	if (hold_reader) {
		pthread_join(rt, NULL);
		REQUIRE(atomic_load(&reader_state) == 3, "reader gone");
	}
	CHECK(wait_nfree(cs, before, 30), "the slot reached the free list after the grace period (nfree %u, want %u)",
	      atomic_load(&cs->alloc.nfree), before);
	CHECK(atomic_load(&cs->slots[j.slot].key) == CACHE_KEY_NONE &&
		      atomic_load(&cs->slots[j.slot].bits) == SB_FREE,
	      "the slot is free and holds no key");
	sem_destroy(&j.done);
}

int main(void)
{
	REQUIRE(workers_start(2) == 0, "workers");
	struct mem_bdev *d[2];
	char err[512];
	for (int i = 0; i < 2; i++)
		d[i] = mem_new(i + 1, 4u << 20, NULL);
	struct bdev *legs[2] = { &d[0]->dev, &d[1]->dev };
	struct cache_set *cs = cache_set_open_devs(&cfg, legs, err, sizeof(err));
	REQUIRE(cs, "open: %s", err);

	drop_once(cs, 7, true);
	drop_once(cs, 8, true);
	drop_once(cs, 9, false);

	cache_set_shutdown(cs);
	cache_set_close(cs);
	workers_stop();
	return check_failures ? 1 : 0;
}
