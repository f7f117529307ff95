/*
 * test_cache_journal_full.c - a journal ring that fills waits for the
 * checkpoint, is counted once, and loses nothing.
 *
 * One worker owns all 16 rings and, at QD1, moves to its next ring after
 * every write, so each write-back write of a new block (a record each)
 * puts one block in the next ring. The slot table's area of both legs is
 * held (its writes do not complete): the checkpoint asked for at half a
 * ring (write 256) cannot finish, and after 512 writes every ring is full.
 * Write 513 must then wait, and status must say so exactly once
 * (journal_full_waits), also when write 514 joins it in that ring and
 * kicks it again; a power cut at that moment (the legs as they are,
 * the held table pages not landed) must recover all 512 acknowledged
 * writes from the journal, so no block a recovery needs was overwritten.
 * Released, the checkpoint completes (checkpoints counts it), write 513
 * and the rest complete, and everything reads back, also after a reopen.
 */
#include "cache/cache_int.h" /* the layout: where the table is */
#include "tests/unit/cache_test_util.h"

#define LEG_SIZE (64u << 20)    /* a 2 MiB journal: 16 rings of 32 blocks */
#define BACK_SIZE (16u << 20)
#define EXT (64u << 10)
#define RINGS_FULL 512          /* 16 rings x 32 blocks, one record per block */
#define NWRITES 1024            /* 4 KiB each, every one a new block */

static struct cache_set_cfg cfg = {
	.name = "jf", .nlegs = 2, .extent_size = EXT, .mode = CACHE_WRITE_BACK, .admit_hits = 1, .dirty_target = 90,
};

static struct cache_set *open_set(struct mem_bdev **d, struct bdev **vol, uint8_t *const img[3])
{
	char err[512];
	uint64_t sizes[3] = { BACK_SIZE, LEG_SIZE, LEG_SIZE };
	for (int i = 0; i < 3; i++)
		d[i] = mem_borrow(i, sizes[i], img[i]);
	struct bdev *legs[2] = { &d[1]->dev, &d[2]->dev };
	struct cache_set *cs = cache_set_open_devs(&cfg, legs, err, sizeof(err));
	REQUIRE(cs, "open: %s", err);
	*vol = cache_vol_open(cs, "lun0", &d[0]->dev, NULL, CACHE_WRITE_BACK, err, sizeof(err));
	REQUIRE(*vol, "attach: %s", err);
	return cs;
}

static void fill(uint8_t *b, uint32_t i)
{
	for (uint32_t k = 0; k < 4096; k += 4)
		memcpy(b + k, &(uint32_t){ i * 2654435761u ^ k }, 4);
}

static void check_all(struct bdev *vol, uint32_t n, const char *when)
{
	uint8_t *buf = buf_get(4096), *want = buf_get(4096);
	for (uint32_t i = 0; i < n; i++) {
		REQUIRE(tio_sync(vol, BDEV_READ, (uint64_t)i * 4096, buf, 4096, 0) == 0, "%s: read %u", when, i);
		fill(want, i);
		REQUIRE(memcmp(buf, want, 4096) == 0, "%s: block %u does not read back as written", when, i);
	}
	buf_put(buf, 4096);
	buf_put(want, 4096);
	printf("ok: %s: all %u writes read back\n", when, n);
}

/* records waiting for a journal block, over every ring */
static unsigned pending_records(struct cache_set *cs)
{
	unsigned n = 0;
	for (int j = 0; j < CACHE_NJOURNALS; j++) {
		struct journal *jr = &cs->journals[j];
		pthread_mutex_lock(&jr->lock);
		for (struct jwait *w = jr->pend_head; w; w = w->next)
			n++;
		pthread_mutex_unlock(&jr->lock);
	}
	return n;
}

static void set_hold(struct mem_bdev **d, bool on)
{
	for (int i = 1; i < 3; i++)
		atomic_store(&d[i]->slow_hold, on);
}

static void write_one(struct bdev *vol, uint32_t i)
{
	uint8_t *buf = buf_get(4096);
	fill(buf, i);
	REQUIRE(tio_sync(vol, BDEV_WRITE, (uint64_t)i * 4096, buf, 4096, BDEV_F_FUA) == 0, "write %u", i);
	buf_put(buf, 4096);
}

int main(void)
{
	REQUIRE(workers_start(1) == 0, "workers");
	struct mem_bdev *d[3], *c[3];
	struct bdev *vol;
	uint8_t *img[3], *cut[3];
	uint64_t sizes[3] = { BACK_SIZE, LEG_SIZE, LEG_SIZE };
	for (int i = 0; i < 3; i++) {
		img[i] = calloc(1, sizes[i]);
		cut[i] = malloc(sizes[i]);
	}
	struct cache_set *cs = open_set(d, &vol, img);
	REQUIRE(cs->lay.jblocks * CACHE_NJOURNALS == RINGS_FULL, "rings of %u blocks (the test is sized for 32)",
		cs->lay.jblocks);
	for (int i = 1; i < 3; i++) {
		atomic_store(&d[i]->slow_lo, cs->lay.table_off);
		atomic_store(&d[i]->slow_hi, cs->lay.journal_off);
	}
	struct cache_set_status st0, st;
	cache_set_status(cs, &st0);
	set_hold(d, true);
	for (uint32_t i = 0; i < RINGS_FULL; i++)
		write_one(vol, i);
	cache_set_status(cs, &st);
	REQUIRE(st.journal_full_waits == st0.journal_full_waits && st.checkpoints == st0.checkpoints,
		"after %u writes into empty rings: %llu waits, %llu checkpoints (want none)", RINGS_FULL,
		(unsigned long long)(st.journal_full_waits - st0.journal_full_waits),
		(unsigned long long)(st.checkpoints - st0.checkpoints));

	/* write 513: no room in its ring until the checkpoint ends */
	uint8_t *buf = buf_get(4096);
	fill(buf, RINGS_FULL);
	struct tio t;
	tio_submit(&t, vol, BDEV_WRITE, (uint64_t)RINGS_FULL * 4096, buf, 4096, BDEV_F_FUA, NULL, 0);
	for (int k = 0;; k++) {
		cache_set_status(cs, &st);
		if (st.journal_full_waits != st0.journal_full_waits)
			break;
		REQUIRE(k < 60000, "write %u: its full ring not counted after 60 s", RINGS_FULL + 1);
		usleep(1000);
	}
	/* write 514 joins the same ring (it is not idle) and kicks it again: still one wait */
	uint8_t *buf2 = buf_get(4096);
	fill(buf2, RINGS_FULL + 1);
	struct tio t2;
	tio_submit(&t2, vol, BDEV_WRITE, (uint64_t)(RINGS_FULL + 1) * 4096, buf2, 4096, BDEV_F_FUA, NULL, 0);
	for (int k = 0; pending_records(cs) < 2; k++) {
		REQUIRE(k < 60000, "write %u: its record not queued after 60 s", RINGS_FULL + 2);
		usleep(1000);
	}
	REQUIRE(!atomic_load(&t.done) && !atomic_load(&t2.done),
		"a write completed with every ring full and the checkpoint held");
	cache_set_status(cs, &st);
	REQUIRE(st.journal_full_waits == st0.journal_full_waits + 1, "one wait counted %llu times",
		(unsigned long long)(st.journal_full_waits - st0.journal_full_waits));
	/* the power cut: the legs as they are now (the held table writes have not landed) */
	for (int i = 0; i < 3; i++)
		memcpy(cut[i], img[i], sizes[i]);
	printf("ok: %u writes filled the rings; writes %u and %u wait, counted once\n", RINGS_FULL, RINGS_FULL + 1,
	       RINGS_FULL + 2);

	set_hold(d, false);
	while (!atomic_load(&t.done) || !atomic_load(&t2.done))
		usleep(100);
	REQUIRE(t.err == 0 && t2.err == 0, "writes %u and %u: %d, %d", RINGS_FULL + 1, RINGS_FULL + 2, t.err, t2.err);
	buf_put(buf, 4096);
	buf_put(buf2, 4096);
	for (uint32_t i = RINGS_FULL + 2; i < NWRITES; i++)
		write_one(vol, i);
	cache_set_status(cs, &st);
	printf("%u writes: %llu checkpoints, rings full %llu times\n", NWRITES,
	       (unsigned long long)(st.checkpoints - st0.checkpoints),
	       (unsigned long long)(st.journal_full_waits - st0.journal_full_waits));
	REQUIRE(st.checkpoints > st0.checkpoints, "the released checkpoint was not counted");
	REQUIRE(st.journal_full_waits - st0.journal_full_waits <= st.checkpoints - st0.checkpoints,
		"%llu waits, %llu checkpoints: a wait ends only with a checkpoint",
		(unsigned long long)(st.journal_full_waits - st0.journal_full_waits),
		(unsigned long long)(st.checkpoints - st0.checkpoints));
	check_all(vol, NWRITES, "live");
	test_set_close(cs, vol);
	cs = open_set(d, &vol, img);
	check_all(vol, NWRITES, "reopened");
	test_set_close(cs, vol);

	/* recovery at the cut: the 512 acknowledged writes are all in the journal */
	cs = open_set(c, &vol, cut);
	check_all(vol, RINGS_FULL, "power cut while the rings were full");
	test_set_close(cs, vol);
	for (int i = 0; i < 3; i++) {
		free(img[i]);
		free(cut[i]);
	}
	printf("ok: test_cache_journal_full\n");
	return 0;
}
