/*
 * test_cache_readmit.c - an evicted extent is not cached again before the
 * record that freed its slot is durable.
 *
 * The FREE record of an eviction and the records of a new slot for the
 * same extent can go to different journal rings; if the new slot's landed
 * first and the power went, the extent was in two slots on disk (recovery
 * keeps the newer, test_cache_recover_dupkey), or, had the new slot been
 * destaged and evicted meanwhile, in the old slot alone, older than the
 * backing store. So the key waits (slots.c).
 *
 * A set of 21 slots holds 19 clean extents (reads promote them); the
 * journal's writes are then held, and a reclaim (on a worker, as the
 * allocator runs it) evicts two: their FREE records cannot land. A
 * write-back write to an evicted extent must go to the backing store
 * (it completes, the backing store holds it, the extent is in no slot),
 * although two slots are free; a read must not promote it. Released, the
 * eviction completes and the next reads promote the extent again.
 */
#include "cache/cache_int.h" /* the layout, the map, cache_reclaim: what the test holds and looks at */
#include "tests/unit/cache_test_util.h"

#define LEG_SIZE (4u << 20)
#define BACK_SIZE (4u << 20)
#define EXT (64u << 10)
#define FILLED 19

enum { DEV_BACK, DEV_LEG0, DEV_LEG1, NDEV };

static struct cache_set_cfg cfg = {
	.name = "ra", .nlegs = 2, .extent_size = EXT, .mode = CACHE_WRITE_BACK, .admit_hits = 1, .dirty_target = 90,
};

static void reclaim_fn(void *arg)
{
	struct sync_call *c = arg;
	cache_reclaim(c->cs);
	cache_sync_done(c, 0);
}

static void settle(struct cache_set *cs)
{
	for (int i = 0; i < 20000 && (atomic_load(&cs->bg_inflight) || atomic_load(&cs->fg_inflight)); i++)
		usleep(500);
}

static bool cached(struct cache_set *cs, uint64_t key)
{
	rcu_read_lock();
	bool in = map_lookup(&cs->map, key) != POLICY_NO_SLOT;
	rcu_read_unlock();
	return in;
}

int main(void)
{
	REQUIRE(workers_start(2) == 0, "workers");
	uint64_t sizes[NDEV] = { BACK_SIZE, LEG_SIZE, LEG_SIZE };
	struct mem_bdev *d[NDEV];
	for (int i = 0; i < NDEV; i++)
		d[i] = mem_new(i, sizes[i], NULL);
	struct cache_set *cs = test_set_open(&cfg, d[DEV_LEG0], d[DEV_LEG1]);
	struct bdev *vol = test_vol_open(cs, "lun0", d[DEV_BACK], CACHE_WRITE_BACK);
	REQUIRE(cs->lay.nslots == 21, "the set has %u slots, the test counts on 21", cs->lay.nslots);

	uint8_t *buf = malloc(EXT);
	for (uint64_t e = 0; e < FILLED; e++) {
		REQUIRE(tio_sync(vol, BDEV_READ, e * EXT, buf, EXT, 0) == 0, "read %llu", (unsigned long long)e);
		REQUIRE(tio_sync(vol, BDEV_READ, e * EXT, buf, EXT, 0) == 0, "read %llu", (unsigned long long)e);
		settle(cs);
	}
	REQUIRE(cs->alloc.nfree == cs->lay.nslots - FILLED, "%u slots free after %u promotions", cs->alloc.nfree,
		FILLED);

	/* the journal's writes held: FREE records cannot land */
	uint64_t jlo = cs->lay.journal_off, jhi = jlo + (uint64_t)CACHE_NJOURNALS * cs->lay.jblocks * CACHE_PAGE;
	for (int l = DEV_LEG0; l <= DEV_LEG1; l++) {
		atomic_store(&d[l]->slow_lo, jlo);
		atomic_store(&d[l]->slow_hi, jhi);
		atomic_store(&d[l]->slow_hold, true);
	}
	struct sync_call c = { .cs = cs };
	cache_sync_run(reclaim_fn, &c);
	uint64_t gone = CACHE_KEY_NONE;
	uint32_t retired = 0;
	for (uint32_t s = 0; s < cs->lay.nslots; s++)
		if ((atomic_load(&cs->slots[s].bits) & SB_STATE_MASK) == SB_RETIRED) {
			retired++;
			gone = atomic_load(&cs->slots[s].key);
		}
	REQUIRE(retired >= 1 && gone != CACHE_KEY_NONE, "the reclaim evicted %u slots", retired);
	REQUIRE(!cached(cs, gone), "the evicted extent is still in the map");
	REQUIRE(cs->alloc.nfree >= 1, "no slot free for the write");
	uint64_t off = key_ext(gone) * EXT;

	/* a write-back write to it: to the backing store, done without the journal */
	memset(buf, 0x5a, EXT);
	struct tio t;
	_Atomic int out = 0;
	tio_submit(&t, vol, BDEV_WRITE, off, buf, EXT, BDEV_F_FUA, &out, 0);
	for (int i = 0; i < 20000 && atomic_load(&out); i++)
		usleep(500);
	REQUIRE(!atomic_load(&out), "the write to extent %llu waited for the journal: it was cached again, in a "
		"new slot, while the FREE of its old one was not durable", (unsigned long long)key_ext(gone));
	REQUIRE(t.err == 0, "the write failed: %d", t.err);
	REQUIRE(!memcmp(d[DEV_BACK]->data + off, buf, EXT), "the backing store does not hold the write");
	REQUIRE(!cached(cs, gone), "the extent was cached again before its FREE was durable");
	/* and reads do not promote it */
	REQUIRE(tio_sync(vol, BDEV_READ, off, buf, EXT, 0) == 0, "read");
	REQUIRE(tio_sync(vol, BDEV_READ, off, buf, EXT, 0) == 0, "read");
	/* (a miss starts its fill, slot allocated, before the read completes: vol_read.c) */
	REQUIRE(!cached(cs, gone), "a read promoted the extent before its FREE was durable");
	printf("ok: extent %llu evicted (%u slots, FREE held): a write went to the backing store, reads did not "
	       "promote it, with %u slots free\n", (unsigned long long)key_ext(gone), retired, cs->alloc.nfree);

	/* released: the eviction ends, and the extent is cached again */
	for (int l = DEV_LEG0; l <= DEV_LEG1; l++)
		atomic_store(&d[l]->slow_hold, false);
	for (int i = 0; i < 20000; i++) {
		pthread_mutex_lock(&cs->alloc.lock);
		bool evicting = cs->alloc.evicting != NULL;
		pthread_mutex_unlock(&cs->alloc.lock);
		if (!evicting)
			break;
		usleep(500);
	}
	REQUIRE(tio_sync(vol, BDEV_READ, off, buf, EXT, 0) == 0, "read");
	REQUIRE(tio_sync(vol, BDEV_READ, off, buf, EXT, 0) == 0, "read");
	settle(cs);
	REQUIRE(cached(cs, gone), "the extent was not cached again once its FREE was durable");
	memset(buf, 0x5a, EXT);
	uint8_t *got = malloc(EXT);
	REQUIRE(tio_sync(vol, BDEV_READ, off, got, EXT, 0) == 0, "read");
	REQUIRE(!memcmp(got, buf, EXT), "the extent does not read back what was written");
	printf("ok: once the FREE was durable the extent was promoted again and reads the write\n");
	free(got);
	free(buf);
	test_set_close(cs, vol);
	workers_stop();
	return 0;
}
