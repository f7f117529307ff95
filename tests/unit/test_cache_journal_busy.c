/*
 * test_cache_journal_busy.c - a worker that is never idle goes round its
 * journal rings before it asks for a checkpoint, and loses nothing.
 *
 * One worker owns all 16 rings (32 blocks each). The journal's writes are
 * slow and the data writes complete at random, so with 8 writes of new
 * blocks in flight the ring always has a block in flight and records
 * waiting behind it: the worker never finds it idle, which is when it
 * used to move to its next ring. It then filled one ring and asked for a
 * checkpoint at every half ring (16 blocks), each one writing the slot
 * table again. Now, when a ring is half full, its waiting records go to
 * the next ring (journal_moves counts it), and a checkpoint is asked for
 * only after all 16: the test wants at least 64 journal blocks per
 * checkpoint on average.
 *
 * A power cut in the middle (the legs copied on the worker, between two
 * of its steps) must recover every write acknowledged by then, and every
 * write must read back live and after a reopen.
 */
#include "cache/cache_int.h"
#include "tests/unit/cache_test_util.h"

#define LEG_SIZE (64u << 20) /* a 2 MiB journal: 16 rings of 32 blocks */
#define BACK_SIZE (16u << 20)
#define EXT (64u << 10)
#define NWRITES 3000u
#define QD 16
#define CUT_AT 1500u /* the power cut once this many are acknowledged */

static struct cache_set_cfg cfg = {
	.name = "jb", .nlegs = 2, .extent_size = EXT, .mode = CACHE_WRITE_BACK, .admit_hits = 1, .dirty_target = 90,
};

static const uint64_t sizes[3] = { BACK_SIZE, LEG_SIZE, LEG_SIZE };

static struct cache_set *open_set(struct mem_bdev **d, struct bdev **vol, uint8_t *const img[3])
{
	char err[512];
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
		memcpy(b + k, &(uint32_t){ i * 2654435761u ^ k ^ 0x5a5a0000u }, 4);
}

static void check_all(struct bdev *vol, const bool *want, uint32_t n, const char *when)
{
	uint8_t *buf = buf_get(4096), *exp = buf_get(4096);
	uint32_t checked = 0;
	for (uint32_t i = 0; i < n; i++) {
		if (!want[i])
			continue;
		REQUIRE(tio_sync(vol, BDEV_READ, (uint64_t)i * 4096, buf, 4096, 0) == 0, "%s: read %u", when, i);
		fill(exp, i);
		REQUIRE(memcmp(buf, exp, 4096) == 0, "%s: block %u does not read back as written", when, i);
		checked++;
	}
	buf_put(buf, 4096);
	buf_put(exp, 4096);
	printf("ok: %s: all %u acknowledged writes read back\n", when, checked);
}

/*
 * The writes, chained on the worker: each completion submits the next
 * write at once, so QD writes are in flight all the time. At the CUT_AT-th
 * completion the legs are copied there too: a power cut between two of
 * the worker's steps (no device write lands and no write completes
 * meanwhile; with write_hops set, a write lands at its completion).
 */
struct drv {
	struct bdev *vol;
	struct mem_bdev **d;
	uint8_t **cut, *bufs;
	struct bdev_req req[NWRITES];
	struct iovec iov[NWRITES];
	int err[NWRITES];
	bool acked[NWRITES], cut_acked[NWRITES];
	uint32_t next, completed;
	_Atomic bool all_done;
};

static void drv_submit(struct drv *v);

static void drv_done(struct bdev_req *req, int err)
{
	struct drv *v = req->priv;
	uint32_t i = (uint32_t)(req - v->req);
	v->err[i] = err;
	v->acked[i] = !err;
	if (++v->completed == CUT_AT) {
		memcpy(v->cut_acked, v->acked, sizeof(v->acked));
		for (int k = 0; k < 3; k++)
			memcpy(v->cut[k], v->d[k]->data, sizes[k]);
	}
	if (v->completed == NWRITES)
		atomic_store(&v->all_done, true);
	drv_submit(v);
}

static void drv_submit(struct drv *v)
{
	if (v->next >= NWRITES)
		return;
	uint32_t i = v->next++;
	fill(v->bufs + (size_t)i * 4096, i);
	v->iov[i] = (struct iovec){ .iov_base = v->bufs + (size_t)i * 4096, .iov_len = 4096 };
	v->req[i] = (struct bdev_req){ .op = BDEV_WRITE, .flags = BDEV_F_FUA, .offset = (uint64_t)i * 4096,
				       .len = 4096, .iov = &v->iov[i], .iovcnt = 1, .done = drv_done, .priv = v };
	bdev_submit(v->vol, &v->req[i]);
}

static void drv_start(void *arg)
{
	for (int q = 0; q < QD; q++)
		drv_submit(arg);
}

static uint64_t journal_blocks(struct cache_set *cs)
{
	uint64_t n = 0;
	for (int j = 0; j < CACHE_NJOURNALS; j++) {
		pthread_mutex_lock(&cs->journals[j].lock);
		n += cs->journals[j].commits;
		pthread_mutex_unlock(&cs->journals[j].lock);
	}
	return n;
}

int main(void)
{
	REQUIRE(workers_start(1) == 0, "workers");
	struct mem_bdev *d[3], *c[3];
	struct bdev *vol;
	uint8_t *img[3], *cut[3];
	for (int i = 0; i < 3; i++) {
		img[i] = calloc(1, sizes[i]);
		cut[i] = malloc(sizes[i]);
	}
	struct cache_set *cs = open_set(d, &vol, img);
	REQUIRE(cs->lay.jblocks == 32, "rings of %u blocks (the test is sized for 32)", cs->lay.jblocks);
	for (int i = 1; i < 3; i++) {
		atomic_store(&d[i]->slow_lo, cs->lay.journal_off);
		atomic_store(&d[i]->slow_hi, cs->lay.journal_off + (uint64_t)CACHE_NJOURNALS * cs->lay.jblocks * CACHE_PAGE);
		atomic_store(&d[i]->slow_hops, 40);
		atomic_store(&d[i]->write_hops, 24);
	}
	struct cache_set_status st0, st;
	cache_set_status(cs, &st0);
	uint64_t blocks0 = journal_blocks(cs), moves0 = atomic_load(&cs->st.journal_moves);

	struct drv *v = calloc(1, sizeof(*v));
	v->vol = vol;
	v->d = d;
	v->cut = cut;
	v->bufs = malloc((size_t)NWRITES * 4096);
	worker_post(worker_get(0), drv_start, v);
	while (!atomic_load(&v->all_done))
		usleep(1000);
	for (uint32_t i = 0; i < NWRITES; i++)
		REQUIRE(v->err[i] == 0, "write %u: %d", i, v->err[i]);

	cache_set_status(cs, &st);
	uint64_t blocks = journal_blocks(cs) - blocks0, ckpts = st.checkpoints - st0.checkpoints;
	uint64_t moves = atomic_load(&cs->st.journal_moves) - moves0;
	printf("%u writes at QD%d: %llu journal blocks, %llu moves to the next ring, %llu checkpoints\n", NWRITES, QD,
	       (unsigned long long)blocks, (unsigned long long)moves, (unsigned long long)ckpts);
	REQUIRE(blocks >= 4 * 16 * 2, "only %llu journal blocks: the load did not fill the rings",
		(unsigned long long)blocks);
	REQUIRE(moves > 0, "the busy worker never took its records to its next ring");
	REQUIRE(ckpts * 64 <= blocks,
		"%llu checkpoints for %llu journal blocks: one every %.1f blocks, want one per 64 at most "
		"(a half ring is 16)", (unsigned long long)ckpts, (unsigned long long)blocks,
		ckpts ? (double)blocks / (double)ckpts : 0.0);
	for (int i = 1; i < 3; i++) {
		atomic_store(&d[i]->slow_hops, 0);
		atomic_store(&d[i]->write_hops, 0);
	}
	check_all(vol, v->acked, NWRITES, "live");
	test_set_close(cs, vol);
	cs = open_set(d, &vol, img);
	check_all(vol, v->acked, NWRITES, "reopened");
	test_set_close(cs, vol);

	uint32_t nacked = 0;
	for (uint32_t i = 0; i < NWRITES; i++)
		nacked += v->cut_acked[i];
	REQUIRE(nacked == CUT_AT, "the cut saw %u acknowledged writes", nacked);
	cs = open_set(c, &vol, cut);
	check_all(vol, v->cut_acked, NWRITES, "power cut in the middle");
	test_set_close(cs, vol);
	for (int i = 0; i < 3; i++) {
		free(img[i]);
		free(cut[i]);
	}
	free(v->bufs);
	free(v);
	printf("ok: test_cache_journal_busy\n");
	return 0;
}
