/*
 * test_cache_readmit.c - until the record that freed an evicted extent's
 * slot is durable, the extent is not cached again and a write to it waits.
 *
 * A power cut before that FREE lands brings the old slot back, clean,
 * with the extent's data as of the eviction. A write acknowledged
 * meanwhile, to the backing store or to a new slot (whose records, in
 * another journal ring, may land first), would then read back older data,
 * or the extent would be in two slots (recovery keeps the newer,
 * test_cache_recover_dupkey). So the key waits (slots.c).
 *
 * A set of 21 slots holds 19 clean extents (reads promote them); the
 * journal's writes are then held, and a reclaim (on a worker, as the
 * allocator runs it) evicts two: their FREE records cannot land. Reads
 * of an evicted extent must not promote it, though two slots are free; a
 * write-back write to it must park (the set's list of waiting writes)
 * without reaching the backing store. Released, the write completes and
 * reads back, and the next reads promote the extent again.
 */
#include "tests/unit/cache_test_int.h" /* the layout, the map, cache_reclaim: what the test holds and looks at */

#define LEG_SIZE (4u << 20)
#define BACK_SIZE (4u << 20)
#define EXT (64u << 10)
#define FILLED 19

enum { DEV_BACK, DEV_LEG0, DEV_LEG1, NDEV };

static struct cache_set_cfg cfg = {
	.name = "ra", .nlegs = 2, .extent_size = EXT, .mode = CACHE_WRITE_BACK, .admit_hits = 1, .dirty_target = 90,
};

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
		test_settle(cs);
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
	test_reclaim(cs);
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

	/* reads do not promote it */
	uint8_t *before = malloc(EXT);
	memcpy(before, d[DEV_BACK]->data + off, EXT);
	REQUIRE(tio_sync(vol, BDEV_READ, off, buf, EXT, 0) == 0, "read");
	REQUIRE(tio_sync(vol, BDEV_READ, off, buf, EXT, 0) == 0, "read");
	/* (a miss starts its fill, slot allocated, before the read completes: vol_read.c) */
	REQUIRE(!cached(cs, gone), "a read promoted the extent before its FREE was durable");

	/* a write-back write to it parks, and reaches neither the backing store nor a slot */
	memset(buf, 0x5a, EXT);
	struct tio t;
	_Atomic int out = 0;
	tio_submit(&t, vol, BDEV_WRITE, off, buf, EXT, BDEV_F_FUA, &out, 0);
	bool parked = false;
	for (int i = 0; i < 20000 && !parked; i++) {
		pthread_mutex_lock(&cs->alloc.lock);
		parked = cs->alloc.evict_waiters != NULL;
		pthread_mutex_unlock(&cs->alloc.lock);
		if (!parked)
			usleep(500);
	}
	REQUIRE(parked, "the write to extent %llu did not wait for the FREE of its old slot%s",
		(unsigned long long)key_ext(gone), atomic_load(&out) ? "" : " (it completed)");
	REQUIRE(atomic_load(&out), "the write completed while the FREE of the extent's old slot was held");
	REQUIRE(!memcmp(d[DEV_BACK]->data + off, before, EXT), "the parked write reached the backing store");
	REQUIRE(!cached(cs, gone), "the extent was cached again before its FREE was durable");
	printf("ok: extent %llu evicted (%u slots, FREE held): reads did not promote it with %u slots free, a "
	       "write waits\n", (unsigned long long)key_ext(gone), retired, cs->alloc.nfree);

	/* released: the eviction ends, the write goes on, and the extent is cached again */
	for (int l = DEV_LEG0; l <= DEV_LEG1; l++)
		atomic_store(&d[l]->slow_hold, false);
	for (int i = 0; i < 20000 && atomic_load(&out); i++)
		usleep(500);
	REQUIRE(!atomic_load(&out), "the parked write never completed");
	REQUIRE(t.err == 0, "the parked write failed: %d", t.err);
	for (int i = 0; i < 20000; i++) {
		pthread_mutex_lock(&cs->alloc.lock);
		bool evicting = cs->alloc.evicting != NULL;
		pthread_mutex_unlock(&cs->alloc.lock);
		if (!evicting)
			break;
		usleep(500);
	}
	uint8_t *got = malloc(EXT);
	REQUIRE(tio_sync(vol, BDEV_READ, off, got, EXT, 0) == 0, "read");
	REQUIRE(tio_sync(vol, BDEV_READ, off, got, EXT, 0) == 0, "read");
	test_settle(cs);
	REQUIRE(cached(cs, gone), "the extent was not cached again once its FREE was durable");
	REQUIRE(tio_sync(vol, BDEV_READ, off, got, EXT, 0) == 0, "read");
	REQUIRE(!memcmp(got, buf, EXT), "the extent does not read back what was written");
	printf("ok: once the FREE was durable the write completed, the extent is cached and reads the write\n");
	free(got);
	free(before);
	free(buf);
	test_set_close(cs, vol);
	workers_stop();
	return 0;
}
