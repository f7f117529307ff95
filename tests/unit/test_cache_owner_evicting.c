/*
 * test_cache_owner_evicting.c - a gain of a shared backing store's
 * ownership records its generation only once no slot of the LUN is still
 * being evicted.
 *
 * On a gain after another gateway may have written the image, the volume
 * drops its cached copies durably and then records the generation
 * (owner.c): at the next gain, that record says the cache is current. A
 * slot being evicted is out of the map, but until its FREE record is
 * durable a power cut brings it back with what it held, older than the
 * other gateway's writes; recorded meanwhile, the generation would make
 * the next gain keep it. So the gain waits for such slots.
 *
 * LUN a (over a backing store that says it is shared) caches 1 extent,
 * LUN b (a plain one) 18: 19 of the set's 21 slots. The journal's writes
 * are held and a reclaim (on a worker, as the allocator runs it) evicts
 * two, a's among them (never hit, the newest in the small queue): their
 * FREE records cannot land.
 * The gain, run as the backing's driver thread runs it, must not return
 * (nor write the generation file) while they are held; released, it
 * records the generation, and a's slots are free. Then only b's slots are
 * being evicted, their records held again: a's next gain must not wait
 * for them. Then an eviction of a is held (only its journal ring) while
 * a partly valid extent of a is dropped: the emptied slot stays READY,
 * and the drop's later passes must not drop it again. Then an eviction
 * of a that never ends (its FREE held) makes the drop give up after its
 * bound, shortened to 1 s: the LUN unavailable, no generation recorded.
 * Last, a's extent is evicted again with every leg failing: its FREE
 * record fails (and frees the slot all the same), so the gain that waited
 * for it must record no generation (and leave the LUN available: with no
 * leg left it is served from the backing store).
 */
#include "cache/vol_int.h" /* the volume's backing id, drop_failed, vol_drop_timeout_s */
#include "tests/unit/cache_test_int.h" /* the layout, cache_reclaim, the slots: what the test holds and looks at */

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#define LEG_SIZE (4u << 20)
#define BACK_SIZE (4u << 20)
#define EXT (64u << 10)
#define A_EXTENTS 1
#define B_EXTENTS 18

enum { DEV_BACK_A, DEV_BACK_B, DEV_LEG0, DEV_LEG1, NDEV };

static struct cache_set_cfg cfg = {
	.name = "oe", .nlegs = 2, .extent_size = EXT, .mode = CACHE_WRITE_BACK, .admit_hits = 1, .dirty_target = 90,
};

/* ---- a backing store that says it is shared: the owner ops the volume passes up -------- */

static void (*listen_fn)(void *arg, const struct bdev_owner_change *c);
static void *listen_arg;

static enum bdev_owner_state shared_state(struct bdev *dev, uint64_t *gen)
{
	(void)dev;
	if (gen)
		*gen = 5;
	return BDEV_OWNER_OWNED;
}

static void shared_acquire(struct bdev *dev) { (void)dev; }

static void shared_listen(struct bdev *dev, void (*fn)(void *arg, const struct bdev_owner_change *c), void *arg)
{
	(void)dev;
	listen_fn = fn;
	listen_arg = arg;
}

static const struct bdev_owner_ops shared_owner = {
	.state = shared_state, .acquire = shared_acquire, .listen = shared_listen,
};
static const struct bdev_ops shared_ops = { .submit = mem_submit, .close = mem_close, .owner = &shared_owner };

/* ---- the gain, on a thread of its own as a driver runs it ---------------------------------- */

static _Atomic bool gained;
static uint64_t gain_gen;

static void *gain_thread(void *arg)
{
	(void)arg;
	/* another gateway owned the image since our last gain (prev_owner_us false): drop */
	struct bdev_owner_change c = {
		.state = BDEV_OWNER_OWNED, .gen = gain_gen, .prev_gen = gain_gen - 1, .prev_owner_us = false,
	};
	listen_fn(listen_arg, &c);
	atomic_store(&gained, true);
	return NULL;
}

/* the gain as the driver runs it, on a thread: gained is set when it returns */
static pthread_t gain_start(uint64_t gen)
{
	pthread_t th;
	atomic_store(&gained, false);
	gain_gen = gen;
	REQUIRE(pthread_create(&th, NULL, gain_thread, NULL) == 0, "thread");
	return th;
}

static uint64_t recorded_gen(const char *path)
{
	FILE *f = fopen(path, "r");
	unsigned long long g = 0;
	if (f) {
		if (fscanf(f, "%llu", &g) != 1)
			g = 0;
		fclose(f);
	}
	return g;
}

static void hold_journal(struct cache_set *cs, struct mem_bdev **d, bool on)
{
	uint64_t jlo = cs->lay.journal_off, jhi = jlo + (uint64_t)CACHE_NJOURNALS * cs->lay.jblocks * CACHE_PAGE;
	for (int l = DEV_LEG0; l <= DEV_LEG1; l++) {
		atomic_store(&d[l]->slow_lo, jlo);
		atomic_store(&d[l]->slow_hi, jhi);
		atomic_store(&d[l]->slow_hold, on);
	}
}

static char dir[64], gen_path[96];

/* Records the set's journal rings have put in blocks so far. */
static uint64_t journal_records(struct cache_set *cs)
{
	uint64_t n = 0;
	for (int j = 0; j < CACHE_NJOURNALS; j++) {
		pthread_mutex_lock(&cs->journals[j].lock);
		n += cs->journals[j].records;
		pthread_mutex_unlock(&cs->journals[j].lock);
	}
	return n;
}

static void cleanup(void)
{
	unlink(gen_path);
	rmdir(dir);
}

/* n extents of vol cached (admit_hits = 1: the first miss promotes), each read reads times */
static void promote(struct cache_set *cs, struct bdev *vol, uint32_t from, uint32_t n, int reads, uint8_t *buf)
{
	for (uint64_t e = from; e < from + n; e++) {
		for (int i = 0; i < reads; i++) {
			REQUIRE(tio_sync(vol, BDEV_READ, e * EXT, buf, EXT, 0) == 0, "read %llu", (unsigned long long)e);
			test_settle(cs);
		}
	}
}

/* slots of backing id bid in state st */
static uint32_t count_slots(struct cache_set *cs, uint32_t bid, uint32_t st)
{
	uint32_t n = 0;
	for (uint32_t s = 0; s < cs->lay.nslots; s++) {
		uint64_t key = atomic_load(&cs->slots[s].key);
		if (key != CACHE_KEY_NONE && key_bid(key) == bid &&
		    (atomic_load(&cs->slots[s].bits) & SB_STATE_MASK) == st)
			n++;
	}
	return n;
}

int main(void)
{
	REQUIRE(workers_start(2) == 0, "workers");
	uint64_t sizes[NDEV] = { BACK_SIZE, BACK_SIZE, LEG_SIZE, LEG_SIZE };
	struct mem_bdev *d[NDEV];
	for (int i = 0; i < NDEV; i++)
		d[i] = mem_new(i, sizes[i], NULL);
	d[DEV_BACK_A]->dev.ops = &shared_ops;
	struct cache_set *cs = test_set_open(&cfg, d[DEV_LEG0], d[DEV_LEG1]);
	struct bdev *va = test_vol_open(cs, "a", d[DEV_BACK_A], CACHE_WRITE_BACK);
	struct bdev *vb = test_vol_open(cs, "b", d[DEV_BACK_B], CACHE_WRITE_BACK);
	REQUIRE(cs->lay.nslots == A_EXTENTS + B_EXTENTS + 2, "the set has %u slots, the test counts on %u",
		cs->lay.nslots, A_EXTENTS + B_EXTENTS + 2);
	uint32_t bid_a = ((struct cache_vol *)va)->bid;

	const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
	snprintf(dir, sizeof(dir), "%s/tc-owner-evicting.XXXXXX", tmp);
	REQUIRE(mkdtemp(dir), "mkdtemp %s", dir);
	atexit(cleanup);
	snprintf(gen_path, sizeof(gen_path), "%s/gen", dir);
	char err[256];
	REQUIRE(cache_vol_owner_track(va, gen_path, err, sizeof(err)) == 0, "track: %s", err);
	REQUIRE(listen_fn, "the volume did not listen to its shared backing store");

	/* b's extents read again (a hit moves them to the main queue), a's once: the
	 * newest in the small queue and never hit there, the reclaim's victims (policy.c) */
	uint8_t *buf = malloc(EXT);
	promote(cs, vb, 0, B_EXTENTS, 2, buf);
	promote(cs, va, 0, A_EXTENTS, 1, buf);
	REQUIRE(count_slots(cs, bid_a, SB_READY) == A_EXTENTS, "a caches %u extents", count_slots(cs, bid_a, SB_READY));
	REQUIRE(cs->alloc.nfree == 2, "%u slots free after the promotions", cs->alloc.nfree);

	/* the journal's writes held: the FREE records cannot land */
	hold_journal(cs, d, true);
	test_reclaim(cs);
	REQUIRE(count_slots(cs, bid_a, SB_RETIRED) == A_EXTENTS && count_slots(cs, bid_a, SB_READY) == 0,
		"the reclaim was to evict a's %u extents: %u retired, %u still cached", A_EXTENTS,
		count_slots(cs, bid_a, SB_RETIRED), count_slots(cs, bid_a, SB_READY));

	/* the gain must wait for their FREE records */
	pthread_t th = gain_start(5);
	for (int i = 0; i < 2000 && !atomic_load(&gained); i++)
		usleep(500);
	REQUIRE(!atomic_load(&gained), "the gain returned while %u slots of the LUN were being evicted, their FREE "
		"records not durable", count_slots(cs, bid_a, SB_RETIRED));
	REQUIRE(access(gen_path, F_OK) != 0, "the generation was recorded while the LUN's evictions were not durable");
	printf("ok: with a's eviction not durable, the gain waits and records no generation\n");

	/* released: the FREE records land, the gain ends and records the generation */
	hold_journal(cs, d, false);
	for (int i = 0; i < 20000 && !atomic_load(&gained); i++)
		usleep(500);
	REQUIRE(atomic_load(&gained), "the gain never returned once the FREE records were durable");
	pthread_join(th, NULL);
	REQUIRE(count_slots(cs, bid_a, SB_RETIRED) == 0, "a's slots are still being evicted after the gain");
	uint64_t g = recorded_gen(gen_path);
	REQUIRE(g == 5, "the gain recorded generation %llu, not 5", (unsigned long long)g);
	REQUIRE(!atomic_load(&((struct cache_vol *)va)->drop_failed), "the drop failed");
	printf("ok: once they were durable the gain recorded generation %llu\n", (unsigned long long)g);

	/* another LUN's evictions do not hold a's gain: only b's are in flight now */
	test_settle(cs);
	promote(cs, vb, B_EXTENTS, cs->alloc.nfree - 2, 1, buf);
	REQUIRE(cs->alloc.nfree == 2, "%u slots free after b's promotions", cs->alloc.nfree);
	hold_journal(cs, d, true);
	test_reclaim(cs);
	uint32_t bid_b = ((struct cache_vol *)vb)->bid;
	REQUIRE(count_slots(cs, bid_b, SB_RETIRED) >= 1 && count_slots(cs, bid_a, SB_RETIRED) == 0,
		"the reclaim retired %u of b's slots and %u of a's", count_slots(cs, bid_b, SB_RETIRED),
		count_slots(cs, bid_a, SB_RETIRED));
	th = gain_start(6);
	for (int i = 0; i < 20000 && !atomic_load(&gained); i++)
		usleep(500);
	REQUIRE(atomic_load(&gained), "a's gain waited for LUN b's %u evictions", count_slots(cs, bid_b, SB_RETIRED));
	pthread_join(th, NULL);
	REQUIRE(recorded_gen(gen_path) == 6, "the second gain recorded generation %llu, not 6",
		(unsigned long long)recorded_gen(gen_path));
	printf("ok: with only b's evictions in flight, a's gain did not wait for them\n");
	hold_journal(cs, d, false);
	test_settle(cs);

	/*
	 * A slot the drop empties stays READY (its bitmaps say nothing is
	 * valid): while the drop waits for an eviction, its later passes must
	 * not drop that slot again (a record each, every 10 ms, and the wait's
	 * bound pushed back each time). Only the FREE's journal ring is held
	 * now, so the passes' own records land.
	 */
	memset(buf, 0x3c, 4096);
	for (int i = 0; i < 2; i++) /* written twice: a hit, so not the reclaim's victim */
		REQUIRE(tio_sync(va, BDEV_WRITE, 5 * EXT, buf, 4096, BDEV_F_FUA) == 0, "write");
	/* destaged (no CLEAN record of the cleaner's later): partly valid and clean */
	for (int i = 0; i < 20000 && atomic_load(&cs->dirty_blocks); i++)
		usleep(500);
	REQUIRE(!atomic_load(&cs->dirty_blocks), "the cleaner left %llu blocks dirty",
		(unsigned long long)atomic_load(&cs->dirty_blocks));
	test_settle(cs);
	promote(cs, vb, B_EXTENTS + 4, cs->alloc.nfree - 3, 2, buf);
	promote(cs, va, 6, 1, 1, buf);
	REQUIRE(cs->alloc.nfree == 2, "%u slots free before the reclaim", cs->alloc.nfree);
	hold_journal(cs, d, true);
	test_reclaim_on(cs, 1); /* its FREE records in worker 1's rings, the passes' in worker 0's */
	REQUIRE(count_slots(cs, bid_a, SB_RETIRED) == 1 && count_slots(cs, bid_a, SB_READY) == 1,
		"the reclaim was to evict a's extent 6 and keep 5: %u retired, %u cached",
		count_slots(cs, bid_a, SB_RETIRED), count_slots(cs, bid_a, SB_READY));
	int ring = -1;
	for (int j = 0; j < CACHE_NJOURNALS; j++) {
		pthread_mutex_lock(&cs->journals[j].lock);
		if (cs->journals[j].busy)
			ring = j;
		pthread_mutex_unlock(&cs->journals[j].lock);
	}
	REQUIRE(ring >= 0 && ring % 2 == 1, "the FREE records are in ring %d, not one of worker 1's", ring);
	uint64_t rlo = cs->lay.journal_off + (uint64_t)ring * cs->lay.jblocks * CACHE_PAGE;
	for (int l = DEV_LEG0; l <= DEV_LEG1; l++) {
		atomic_store(&d[l]->slow_lo, rlo);
		atomic_store(&d[l]->slow_hi, rlo + (uint64_t)cs->lay.jblocks * CACHE_PAGE);
	}
	uint64_t rec0 = journal_records(cs);
	th = gain_start(7);
	for (int i = 0; i < 20000 && journal_records(cs) == rec0; i++)
		usleep(500);
	REQUIRE(journal_records(cs) > rec0, "the drop journaled nothing for a's extent 5");
	uint64_t rec1 = journal_records(cs);
	usleep(300000); /* some 30 passes */
	REQUIRE(!atomic_load(&gained), "the gain returned while a's eviction was not durable");
	REQUIRE(journal_records(cs) - rec1 <= 1, "while the drop waited, its passes journaled %llu more records: the "
		"slot it emptied was dropped again", (unsigned long long)(journal_records(cs) - rec1));
	hold_journal(cs, d, false);
	for (int i = 0; i < 20000 && !atomic_load(&gained); i++)
		usleep(500);
	REQUIRE(atomic_load(&gained), "the gain never returned once the FREE records were durable");
	pthread_join(th, NULL);
	REQUIRE(recorded_gen(gen_path) == 7 && !atomic_load(&((struct cache_vol *)va)->drop_failed),
		"the gain recorded generation %llu", (unsigned long long)recorded_gen(gen_path));
	printf("ok: while the drop waited for an eviction, the slot it emptied was not dropped again\n");
	test_settle(cs);

	/* an eviction that never ends: the drop gives up after its bound, fails, and records nothing */
	promote(cs, vb, B_EXTENTS + 8, cs->alloc.nfree - 3, 2, buf);
	promote(cs, va, 7, 1, 1, buf);
	REQUIRE(cs->alloc.nfree == 2, "%u slots free before the reclaim", cs->alloc.nfree);
	hold_journal(cs, d, true);
	test_reclaim(cs);
	REQUIRE(count_slots(cs, bid_a, SB_RETIRED) == 1, "the reclaim did not evict a's extent 7");
	vol_drop_timeout_s = 1;
	th = gain_start(8);
	for (int i = 0; i < 20000 && !atomic_load(&gained); i++)
		usleep(500);
	REQUIRE(atomic_load(&gained), "the gain still waits for an eviction that does not end, past its 1 s bound");
	pthread_join(th, NULL);
	REQUIRE(atomic_load(&((struct cache_vol *)va)->drop_failed) && recorded_gen(gen_path) == 7,
		"the drop that timed out left the LUN available (%d) or recorded generation %llu",
		(int)atomic_load(&((struct cache_vol *)va)->drop_failed), (unsigned long long)recorded_gen(gen_path));
	printf("ok: a drop waiting for an eviction that does not end gives up after its bound and records nothing\n");
	vol_drop_timeout_s = 60;
	hold_journal(cs, d, false);
	test_settle(cs);

	/* a FREE that fails on every leg still frees its slot: the drop that waited for it fails */
	promote(cs, vb, B_EXTENTS + 16, cs->alloc.nfree - 3, 2, buf);
	promote(cs, va, 1, 1, 1, buf); /* not extent 0: the policy remembers it (its ghost queue) */
	REQUIRE(cs->alloc.nfree == 2, "%u slots free before the reclaim", cs->alloc.nfree);
	hold_journal(cs, d, true);
	for (int l = DEV_LEG0; l <= DEV_LEG1; l++)
		atomic_store(&d[l]->fail_after, atomic_load(&d[l]->ops));
	test_reclaim(cs);
	REQUIRE(count_slots(cs, bid_a, SB_RETIRED) == 1, "the reclaim did not evict a's extent");
	th = gain_start(9);
	for (int i = 0; i < 200 && !atomic_load(&gained); i++)
		usleep(500);
	REQUIRE(!atomic_load(&gained), "the gain returned while a's eviction was not durable");
	hold_journal(cs, d, false); /* the FREE completes with an error; the legs fail */
	for (int i = 0; i < 20000 && !atomic_load(&gained); i++)
		usleep(500);
	REQUIRE(atomic_load(&gained), "the gain never returned after the FREE failed");
	pthread_join(th, NULL);
	REQUIRE(recorded_gen(gen_path) == 7, "generation %llu was recorded after the FREE failed",
		(unsigned long long)recorded_gen(gen_path));
	REQUIRE(!atomic_load(&((struct cache_vol *)va)->drop_failed), "the LUN was made unavailable: with no leg "
		"left it is served from the backing store");
	printf("ok: with the FREE it waited for failed on every leg, the gain records no generation\n");
	test_settle(cs);

	free(buf);
	cache_set_shutdown(cs);
	bdev_close(va);
	bdev_close(vb);
	cache_set_close(cs);
	workers_stop();
	return 0;
}
