/*
 * test_cache_journal_busy.c - a worker that is never idle goes round its
 * journal rings before it asks for a checkpoint, and loses nothing.
 *
 * Two workers; the writes run on worker 1, which owns the odd rings (8
 * rings of 32 blocks), while checkpoints run on worker 0. The journal's
 * writes are slow (40 re-posts), the data writes complete after a random
 * number of re-posts, and each write's completion submits the next one,
 * so with 16 writes of new blocks in flight the ring always has a block
 * in flight and records waiting behind it: the worker never finds it
 * idle, which is when it used to move to its next ring. It then filled
 * one ring and asked for a checkpoint at every half ring (16 blocks),
 * each one writing the slot table again. Now, when a ring is half full,
 * its waiting records go to another of the worker's rings (journal_moves
 * counts it), and a checkpoint is asked for only when none has room: the
 * test wants at least 64 journal blocks per checkpoint on average.
 *
 * The slot table's writes are held first, so the first checkpoint cannot
 * end and worker 1's ring fills; the test counts from when it lets them
 * go. The checkpoint's end then kicks the full ring. It did so on worker
 * 0, which submitted the ring's next block there, and the ring went on
 * from that block's completion on worker 0, which cannot move worker 1's
 * ring. journal_kick_owner posts the kick to worker 1: the test wants no
 * block of worker 1's rings submitted anywhere else.
 *
 * A power cut after a checkpoint that followed the release, once the
 * worker has moved on three times since (the legs copied while both
 * workers are between two of their steps), must recover every write
 * acknowledged by then: records on both sides of the checkpoint's ring
 * heads, moved ones among them. Every write must read back live and
 * after a reopen.
 */
#include "cache/cache_int.h"
#include "tests/unit/cache_test_util.h"

#define LEG_SIZE (64u << 20) /* a 2 MiB journal: 16 rings of 32 blocks */
#define BACK_SIZE (16u << 20)
#define EXT (64u << 10)
#define NWRITES 6000u
#define QD 16

static struct cache_set_cfg cfg = {
	.name = "jb", .nlegs = 2, .extent_size = EXT, .mode = CACHE_WRITE_BACK, .admit_hits = 1, .dirty_target = 90,
};

static const uint64_t sizes[3] = { BACK_SIZE, LEG_SIZE, LEG_SIZE };

static struct cache_set *open_set(struct mem_bdev **d, struct bdev **vol, uint8_t *const img[3])
{
	for (int i = 0; i < 3; i++)
		d[i] = mem_borrow(i, sizes[i], img[i]);
	struct cache_set *cs = test_set_open(&cfg, d[1], d[2]);
	*vol = test_vol_open(cs, "lun0", d[0], CACHE_WRITE_BACK);
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
 * The writes, chained on worker 1: each completion submits the next write
 * at once, so QD writes are in flight all the time. At the first
 * completion after a checkpoint that followed the release and three moves
 * since, the legs are copied: a power cut. Every leg write lands at its
 * completion (write_hops), on the worker that submitted it, so worker 0 is
 * parked in a posted call meanwhile: no device write lands and no write
 * completes during the copy.
 */
struct drv {
	struct cache_set *cs;
	_Atomic bool armed;     /* the table's writes were let go: look for the cut */
	uint64_t ckpt0, moves_at_ckpt;
	bool saw_ckpt, cut_taken;
	uint32_t cut_after;
	_Atomic int w0;         /* 1: worker 0 parked for the copy; 2: let it go */
	struct bdev *vol;
	struct mem_bdev **d;
	uint8_t **cut, *bufs;
	struct bdev_req req[NWRITES];
	struct iovec iov[NWRITES];
	int err[NWRITES];
	bool acked[NWRITES], cut_acked[NWRITES];
	_Atomic uint32_t completed;
	uint32_t next;
	_Atomic bool all_done;
};

static void park_w0(void *arg)
{
	struct drv *v = arg;
	atomic_store(&v->w0, 1);
	while (atomic_load(&v->w0) != 2)
		;
}

static void take_cut(struct drv *v)
{
	REQUIRE(worker_index(worker_self()) == 1, "the writes complete on worker %u", worker_index(worker_self()));
	struct worker_call c;
	worker_post_call(worker_get(0), &c, park_w0, v);
	while (atomic_load(&v->w0) != 1)
		;
	v->cut_taken = true;
	v->cut_after = atomic_load(&v->completed);
	memcpy(v->cut_acked, v->acked, sizeof(v->acked));
	for (int k = 0; k < 3; k++)
		memcpy(v->cut[k], v->d[k]->data, sizes[k]);
	atomic_store(&v->w0, 2);
}

static void drv_submit(struct drv *v);

static void drv_done(struct bdev_req *req, int err)
{
	struct drv *v = req->priv;
	uint32_t i = (uint32_t)(req - v->req);
	v->err[i] = err;
	v->acked[i] = !err;
	atomic_fetch_add(&v->completed, 1);
	uint64_t moves = atomic_load(&v->cs->st.journal_moves);
	if (atomic_load(&v->armed) && !v->saw_ckpt && atomic_load(&v->cs->st.checkpoints) > v->ckpt0) {
		v->saw_ckpt = true;
		v->moves_at_ckpt = moves;
	}
	if (v->saw_ckpt && !v->cut_taken && moves >= v->moves_at_ckpt + 3)
		take_cut(v);
	if (atomic_load(&v->completed) == NWRITES)
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

/* leg writes of worker 1's journal rings (the odd ones) that another worker submitted */
static uint64_t jlo, jring_bytes;
static _Atomic unsigned foreign_blocks;

static void spy(struct mem_bdev *m, const struct bdev_req *req)
{
	if (req->op != BDEV_WRITE || !jring_bytes || req->offset < jlo ||
	    req->offset >= jlo + CACHE_NJOURNALS * jring_bytes)
		return;
	unsigned ring = (unsigned)((req->offset - jlo) / jring_bytes);
	if (ring % 2 == 1 && worker_index(worker_self()) != 1)
		atomic_fetch_add(&foreign_blocks, 1);
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
	REQUIRE(workers_start(2) == 0, "workers");
	struct mem_bdev *d[3], *c[3];
	struct bdev *vol;
	uint8_t *img[3], *cut[3];
	for (int i = 0; i < 3; i++) {
		img[i] = calloc(1, sizes[i]);
		cut[i] = malloc(sizes[i]);
	}
	struct cache_set *cs = open_set(d, &vol, img);
	REQUIRE(cs->lay.jblocks == 32, "rings of %u blocks (the test is sized for 32)", cs->lay.jblocks);
	jlo = cs->lay.journal_off;
	jring_bytes = (uint64_t)cs->lay.jblocks * CACHE_PAGE;
	for (int i = 1; i < 3; i++) {
		d[i]->on_submit = spy;
		atomic_store(&d[i]->hold_lo, cs->lay.table_off);
		atomic_store(&d[i]->hold_hi, cs->lay.journal_off);
		atomic_store(&d[i]->slow_hold, true);
		atomic_store(&d[i]->slow_lo, cs->lay.journal_off);
		atomic_store(&d[i]->slow_hi, cs->lay.journal_off + (uint64_t)CACHE_NJOURNALS * cs->lay.jblocks * CACHE_PAGE);
		atomic_store(&d[i]->slow_hops, 40);
		atomic_store(&d[i]->write_hops, 24);
	}
	struct cache_set_status st0, st;
	cache_set_status(cs, &st0);

	struct drv *v = calloc(1, sizeof(*v));
	v->cs = cs;
	v->vol = vol;
	v->d = d;
	v->cut = cut;
	v->bufs = malloc((size_t)NWRITES * 4096);
	worker_post(worker_get(1), drv_start, v);
	/* the first checkpoint held: worker 1's ring fills and its writes wait */
	for (int k = 0;; k++) {
		cache_set_status(cs, &st);
		if (st.journal_full_waits > st0.journal_full_waits)
			break;
		REQUIRE(k < 60000 && !atomic_load(&v->all_done),
			"no ring filled with the checkpoint held (%u writes completed)", atomic_load(&v->completed));
		usleep(1000);
	}
	REQUIRE(st.checkpoints == st0.checkpoints, "a checkpoint ended with the table's writes held");
	uint32_t done_at_release = atomic_load(&v->completed);
	uint64_t blocks0 = journal_blocks(cs), moves0 = atomic_load(&cs->st.journal_moves);
	v->ckpt0 = st.checkpoints;
	atomic_store(&v->armed, true);
	for (int i = 1; i < 3; i++)
		atomic_store(&d[i]->slow_hold, false);
	for (int k = 0; !atomic_load(&v->all_done); k++) {
		REQUIRE(k < 120000, "%u of %u writes completed after 120 s", atomic_load(&v->completed), NWRITES);
		usleep(1000);
	}
	for (uint32_t i = 0; i < NWRITES; i++)
		REQUIRE(v->err[i] == 0, "write %u: %d", i, v->err[i]);

	cache_set_status(cs, &st);
	uint64_t blocks = journal_blocks(cs) - blocks0, ckpts = st.checkpoints - v->ckpt0;
	uint64_t moves = atomic_load(&cs->st.journal_moves) - moves0;
	printf("%u writes at QD%d, a ring full after %u: from the release on, %llu journal blocks, %llu moves to "
	       "another ring, %llu checkpoints\n", NWRITES, QD, done_at_release, (unsigned long long)blocks,
	       (unsigned long long)moves, (unsigned long long)ckpts);
	REQUIRE(blocks >= 3 * 8 * 16, "only %llu journal blocks: the load did not go round the rings 3 times",
		(unsigned long long)blocks);
	REQUIRE(moves > 0, "the busy worker never took its records to its next ring");
	REQUIRE(atomic_load(&foreign_blocks) == 0,
		"%u leg writes of worker 1's journal rings were submitted on worker 0 (the checkpoint's kick of the "
		"full ring)",
		atomic_load(&foreign_blocks));
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
	REQUIRE(v->cut_taken, "no cut: the writes ended before a checkpoint after the release and three moves");
	REQUIRE(nacked == v->cut_after, "the cut saw %u acknowledged writes of %u", nacked, v->cut_after);
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
