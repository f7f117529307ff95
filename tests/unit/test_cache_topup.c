/*
 * test_cache_topup.c - top-ups: the invalid blocks of a resident extent
 * filled from the backing store, and the races they must lose.
 *
 * 1. A write miss in write-back makes its extent resident with only the
 *    written blocks valid. A read of the whole extent is a partial hit and
 *    starts a top-up; once it has run, the same read is a whole hit with the
 *    same data, and the written (dirty) blocks are still the new data.
 *    A partial hit while a write to the extent bypasses the cache (held in
 *    flight on purpose) starts none: its blocks read back as written.
 * 2. Stress, in write-back, write-through and write-around: two workers,
 *    up to 16 requests in flight, writes (stamped with a sequence number),
 *    reads and UNMAPs over a small region so that top-ups keep meeting
 *    writes to the blocks they are filling; the backing store completes
 *    reads late, and every device lands writes in flight together in a
 *    random order. Every read of a block
 *    with nothing in flight on it must return the last acknowledged write
 *    (or zeroes after an UNMAP, or the initial stamp): a top-up that made
 *    old data valid, or wrote a leg under a dirty block, shows up here.
 *    A region that fits the cache, then one wider than it (evictions, and
 *    writes that bypass the cache for want of a slot). The run must have
 *    started and finished top-ups, or it proves nothing.
 */
#include "cache/status.h"
#include "tests/unit/cache_test_util.h"

#define BACK (16u << 20)
#define LEG (8u << 20)
#define EXT (64u << 10)
#define BLK 4096u
#define REGION (2u << 20)           /* 32 extents: all fit in the cache */
#define WIDE (8u << 20)             /* 128 extents: more than its 93 slots */
#define NBLK (WIDE / BLK)
#define SPB (BLK / 512)             /* sectors per block */

static struct cache_set_cfg cfg = {
	.name = "topup", .nlegs = 2, .extent_size = EXT, .mode = CACHE_WRITE_BACK, .admit_hits = 1,
	.dirty_target = 50,
};

static uint64_t rnd_state = 0x2545f4914f6cdd1dull;
static uint64_t rnd(void) { return tc_xorshift(&rnd_state); }

static void status(struct cache_set *cs, struct cache_set_status *st)
{
	cache_set_status(cs, st);
}

/* Every sector of [blk, blk + n) blocks in buf carries seq (-1: zeroes). */
static void check_blocks(const uint8_t *buf, uint32_t blk, uint32_t n, const int64_t *want, const char *what)
{
	for (uint32_t b = 0; b < n; b++)
		for (uint32_t k = 0; k < SPB; k++) {
			uint64_t lba = (uint64_t)(blk + b) * SPB + k, seq = 0;
			int r = stamp_check(buf + ((size_t)b * SPB + k) * 512, lba, &seq);
			int64_t w = want[b];
			REQUIRE(r >= 0, "%s: sector %llu is garbage", what, (unsigned long long)lba);
			REQUIRE((w < 0 && r == 0) || (w >= 0 && r == 1 && (int64_t)seq == w),
				"%s: sector %llu holds %s %llu, wanted %s %lld", what, (unsigned long long)lba,
				r ? "seq" : "zeroes", (unsigned long long)(r ? seq : 0), w < 0 ? "zeroes" : "seq",
				(long long)w);
		}
}

/* A set (cfg, with this seq_cutoff) on two RAM legs in front of a RAM
 * backing store whose first stamped bytes carry the initial stamps
 * (sequence 0), with one volume. */
static struct cache_set *open_stamped(uint64_t seq_cutoff, uint64_t stamped, struct mem_bdev **b,
				      struct mem_bdev **l0, struct mem_bdev **l1, struct bdev **vol)
{
	char err[512];
	struct cache_set_cfg c = cfg;
	c.seq_cutoff = seq_cutoff;
	*b = mem_new(0, BACK, NULL);
	*l0 = mem_new(1, LEG, NULL);
	*l1 = mem_new(2, LEG, NULL);
	for (uint64_t off = 0; off < stamped; off += 512)
		stamp_fill((*b)->data + off, off / 512, 1, 0);
	struct bdev *legs[2] = { &(*l0)->dev, &(*l1)->dev };
	struct cache_set *cs = cache_set_open_devs(&c, legs, err, sizeof(err));
	REQUIRE(cs, "format: %s", err);
	*vol = cache_vol_open(cs, "lun0", &(*b)->dev, NULL, CACHE_WRITE_BACK, err, sizeof(err));
	REQUIRE(*vol, "attach: %s", err);
	return cs;
}

static void test_basic(void)
{
	struct mem_bdev *b, *l0, *l1;
	struct bdev *vol;
	struct cache_set *cs = open_stamped(0, REGION, &b, &l0, &l1, &vol);

	uint8_t *w = buf_get(8192), *r = buf_get(EXT);
	uint64_t ext = 3 * (uint64_t)EXT;
	stamp_fill(w, (ext + 16384) / 512, 16, 1);
	REQUIRE(tio_sync(vol, BDEV_WRITE, ext + 16384, w, 8192, 0) == 0, "write");
	int64_t want[EXT / BLK];
	for (uint32_t i = 0; i < EXT / BLK; i++)
		want[i] = (i == 4 || i == 5) ? 1 : 0;

	struct cache_set_status st0, st;
	status(cs, &st0);
	REQUIRE(st0.write_misses == 1 && st0.dirty_bytes == 8192, "an admitted write miss, 8K dirty (misses %llu, dirty %llu)",
		(unsigned long long)st0.write_misses, (unsigned long long)st0.dirty_bytes);
	REQUIRE(tio_sync(vol, BDEV_READ, ext, r, EXT, 0) == 0, "read");
	check_blocks(r, (uint32_t)(ext / BLK), EXT / BLK, want, "partial hit");
	for (int i = 0; i < 5000; i++) {
		status(cs, &st);
		if (st.topups)
			break;
		usleep(1000);
	}
	REQUIRE(st.read_partial == st0.read_partial + 1 && st.topups == 1, "a partial hit started one top-up (partial %llu, topups %llu)",
		(unsigned long long)st.read_partial, (unsigned long long)st.topups);
	REQUIRE(st.dirty_bytes == 8192 || st.destaged_bytes, "the top-up left the dirty blocks dirty (%llu)",
		(unsigned long long)st.dirty_bytes);
	memset(r, 0, EXT);
	REQUIRE(tio_sync(vol, BDEV_READ, ext, r, EXT, 0) == 0, "read");
	check_blocks(r, (uint32_t)(ext / BLK), EXT / BLK, want, "after the top-up");
	status(cs, &st0);
	REQUIRE(st0.read_hits == st.read_hits + 1 && st0.read_partial == st.read_partial,
		"the extent now reads as a whole hit (hits %llu -> %llu)", (unsigned long long)st.read_hits,
		(unsigned long long)st0.read_hits);
	REQUIRE(b->data[ext + 16384 + 100] == 0, "write-back: the backing store still has the old data");
	printf("ok: a partial hit tops the extent up; the next read is a whole hit, dirty data kept\n");


	buf_put(w, 8192);
	buf_put(r, EXT);
	cache_set_shutdown(cs);
	bdev_close(vol);
	cache_set_close(cs);
}

/*
 * A write that bypasses the cache is in flight when the extent becomes
 * resident and a partial hit asks for a top-up: the top-up must not read
 * the backing store's old copy of those blocks and call it valid. The
 * bypass write (8K: over this set's 4K seq_cutoff) lands only after
 * a million re-posts; a 4K write makes the extent resident, a read of it and
 * the next 4K is a partial hit. Once the 8K write is done, its blocks must
 * read back as written.
 */
static void test_bypass(void)
{
	struct mem_bdev *b, *l0, *l1;
	struct bdev *vol;
	struct cache_set *cs = open_stamped(4096, REGION, &b, &l0, &l1, &vol);
	struct cache_set_status st0, st;
	uint8_t *r = buf_get(8192);
	uint64_t e2 = 9 * (uint64_t)EXT;
	uint8_t *w8 = buf_get(8192), *w4 = buf_get(4096);
	stamp_fill(w8, e2 / 512, 16, 7);
	stamp_fill(w4, (e2 + 32768) / 512, 8, 8);
	atomic_store(&b->write_hops_exact, true);
	atomic_store(&b->write_hops, 1000000); /* about 0.35 s here */
	struct tio slow;
	tio_submit(&slow, vol, BDEV_WRITE, e2, w8, 8192, 0, NULL, 0);
	REQUIRE(tio_sync(vol, BDEV_WRITE, e2 + 32768, w4, 4096, 0) == 0, "4K write");
	status(cs, &st0);
	REQUIRE(tio_sync(vol, BDEV_READ, e2 + 32768, r, 8192, 0) == 0, "partial read");
	usleep(20000); /* a top-up, had one started, has finished by now */
	REQUIRE(!atomic_load(&slow.done), "the bypass write is still in flight (make its delay longer)");
	while (!atomic_load(&slow.done))
		usleep(1000);
	atomic_store(&b->write_hops, 0);
	REQUIRE(slow.err == 0, "bypass write");
	memset(r, 0, 8192);
	REQUIRE(tio_sync(vol, BDEV_READ, e2, r, 8192, 0) == 0, "read");
	int64_t want7[2] = { 7, 7 };
	check_blocks(r, (uint32_t)(e2 / BLK), 2, want7, "blocks of a write that bypassed the cache");
	status(cs, &st);
	printf("ok: no top-up while a write to the extent bypasses the cache (top-ups %llu -> %llu)\n",
	       (unsigned long long)st0.topups, (unsigned long long)st.topups);
	buf_put(w8, 8192);
	buf_put(w4, 4096);
	buf_put(r, 8192);
	cache_set_shutdown(cs);
	bdev_close(vol);
	cache_set_close(cs);
}

#define INFL 16

struct op {
	struct tio t;
	bool busy;
	enum bdev_op kind;
	uint32_t blk, n;
	uint64_t seq;
	uint8_t *buf;
};

static void stress(struct bdev *vol, enum cache_mode mode, uint32_t nblk, int nops, int64_t *model, uint64_t *seq)
{
	static uint8_t inflight[NBLK];
	struct op ops[INFL];
	_Atomic int out = 0;
	memset(ops, 0, sizeof(ops));
	for (int i = 0; i < INFL; i++)
		ops[i].buf = buf_get(16 * BLK);
	REQUIRE(cache_vol_set_mode(vol, mode) == 0, "mode %s", cache_mode_name(mode));
	int issued = 0, finished = 0;
	while (finished < nops) {
		for (int i = 0; i < INFL; i++) {
			struct op *o = &ops[i];
			if (o->busy && atomic_load(&o->t.done)) {
				REQUIRE(o->t.err == 0, "%s op failed: %d", cache_mode_name(mode), o->t.err);
				if (o->kind == BDEV_READ)
					check_blocks(o->buf, o->blk, o->n, model + o->blk, cache_mode_name(mode));
				for (uint32_t k = 0; k < o->n; k++) {
					if (o->kind == BDEV_WRITE)
						model[o->blk + k] = (int64_t)o->seq;
					else if (o->kind == BDEV_UNMAP)
						model[o->blk + k] = -1;
					inflight[o->blk + k] = 0;
				}
				o->busy = false;
				finished++;
			}
			if (o->busy || issued >= nops)
				continue;
			/* a new request on blocks nothing else is using */
			uint64_t x = rnd();
			uint32_t pct = (uint32_t)(x % 100);
			enum bdev_op kind = pct < 45 ? BDEV_WRITE : pct < 95 ? BDEV_READ : BDEV_UNMAP;
			uint32_t n = kind == BDEV_READ ? 1 + (uint32_t)((x >> 8) % 16) : 1 + (uint32_t)((x >> 8) % 3);
			uint32_t blk = (uint32_t)((x >> 16) % (nblk - n + 1));
			bool free_ = true;
			for (uint32_t k = 0; k < n; k++)
				free_ = free_ && !inflight[blk + k];
			if (!free_)
				continue;
			for (uint32_t k = 0; k < n; k++)
				inflight[blk + k] = 1;
			o->busy = true;
			o->kind = kind;
			o->blk = blk;
			o->n = n;
			if (kind == BDEV_WRITE) {
				o->seq = ++*seq;
				stamp_fill(o->buf, (uint64_t)blk * SPB, n * SPB, o->seq);
			}
			tio_submit(&o->t, vol, kind, (uint64_t)blk * BLK, kind == BDEV_UNMAP ? NULL : o->buf,
				   (uint64_t)n * BLK, 0, &out, (int)(x >> 40));
			issued++;
		}
	}
	for (int i = 0; i < INFL; i++)
		buf_put(ops[i].buf, 16 * BLK);
	/* and once more, everything, with nothing in flight */
	uint8_t *r = buf_get(EXT);
	for (uint32_t e = 0; e < nblk * BLK / EXT; e++) {
		REQUIRE(tio_sync(vol, BDEV_READ, (uint64_t)e * EXT, r, EXT, 0) == 0, "read");
		check_blocks(r, e * (EXT / BLK), EXT / BLK, model + e * (EXT / BLK), "final read");
	}
	buf_put(r, EXT);
}

static void test_stress(void)
{
	struct mem_bdev *b, *l0, *l1;
	struct bdev *vol;
	/* requests over 4K bypass promotion, so write-back also has writes to the backing store in flight */
	struct cache_set *cs = open_stamped(4096, WIDE, &b, &l0, &l1, &vol);
	atomic_store(&b->read_hops, 40);
	atomic_store(&b->write_hops, 40);
	atomic_store(&l0->write_hops, 8);
	atomic_store(&l1->write_hops, 8);
	static int64_t model[NBLK];
	uint64_t seq = 0;
	int nops = getenv("TC_LONG") ? 400000 : 60000;
	static const struct {
		enum cache_mode mode;
		uint32_t bytes;
	} phases[] = {
		{ CACHE_WRITE_BACK, REGION }, { CACHE_WRITE_THROUGH, REGION }, { CACHE_WRITE_AROUND, REGION },
		{ CACHE_WRITE_BACK, REGION }, { CACHE_WRITE_BACK, WIDE },      { CACHE_WRITE_THROUGH, WIDE },
	};
	int nph = (int)(sizeof(phases) / sizeof(phases[0]));
	for (int m = 0; m < nph; m++) {
		struct cache_set_status st0, st;
		status(cs, &st0);
		stress(vol, phases[m].mode, phases[m].bytes / BLK, nops / nph, model, &seq);
		status(cs, &st);
		printf("ok: %s over %u MiB: %d requests, %llu partial hits, %llu top-ups, %llu evictions, data as written\n",
		       cache_mode_name(phases[m].mode), phases[m].bytes >> 20, nops / nph,
		       (unsigned long long)(st.read_partial - st0.read_partial),
		       (unsigned long long)(st.topups - st0.topups), (unsigned long long)(st.evictions - st0.evictions));
	}
	struct cache_set_status st;
	status(cs, &st);
	REQUIRE(st.topups >= 20, "the stress ran top-ups (%llu)", (unsigned long long)st.topups);
	/* no pin left behind: a leaked writer pin would keep its slot from being destaged */
	REQUIRE(cache_set_flush(cs, 20000) == 0, "flush after the stress");
	status(cs, &st);
	REQUIRE(st.dirty_bytes == 0, "everything destaged (%llu dirty)", (unsigned long long)st.dirty_bytes);
	printf("ok: flushed clean afterwards\n");
	cache_set_shutdown(cs);
	bdev_close(vol);
	cache_set_close(cs);
}

int main(void)
{
	REQUIRE(workers_start(getenv("TC_TEST_WORKERS") ? (unsigned)atoi(getenv("TC_TEST_WORKERS")) : 2) == 0, "workers");
	test_basic();
	test_bypass();
	test_stress();
	workers_stop();
	return 0;
}
