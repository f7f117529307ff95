/*
 * test_cache_legs_agree.c - after a crash the mirror is one copy again.
 *
 * The cache overwrites slots in place and the mirror writes both legs at
 * once, so a power cut can land an unacknowledged overwrite on one leg and
 * not the other; a write-through or write-around write cut after its
 * backing write leaves the cached copy older than the backing store. Either
 * version may survive, but only one: every block must read back the same
 * every time, from either leg, before and after its extent leaves the cache.
 *
 * Each case runs a short workload on RAM devices that log every write,
 * then rebuilds the devices as a cut right after one chosen logged write
 * would leave them (a write is kept if it came before the cut), recovers
 * the set and checks:
 *  - six reads of the block through the volume agree (reads alternate legs);
 *  - the data area of the two legs is byte for byte equal (only one slot
 *    was ever written);
 *  - failing either leg changes nothing a read returned;
 *  - after a flush (every dirty block destaged) the backing store holds
 *    what the cache served: no clean cached block differs from it.
 *
 * Last, a journal block that reached one leg only must not come back when
 * that leg is read alone after a later clean stop.
 *
 * Cases (each with and without FUA on the workload's writes):
 *  1. write-back: A acknowledged, then B cut between its leg-0 and leg-1 writes;
 *  2. write-back: same, A destaged (clean) before B;
 *  3. write-through: A acknowledged, B cut after its backing write, before
 *     the cached copy was refreshed;
 *  4. write-around over a cached A: B cut after its backing write, before
 *     the invalidation record;
 *  5. write-back over dirty A on a LUN of 4 KiB blocks whose legs write
 *     512 bytes atomically (the torn-write guard on): B's in-place writes
 *     torn on both legs, the first half of the block new on leg 0, the
 *     second half on leg 1 (the block log's copy of B had completed);
 *  6. the same over clean A (no block log: the cached copy is dropped).
 * Every read must return the whole 4 KiB block from one write: all eight
 * sectors A, or all eight B.
 */
#include "cache/meta.h"
#include "cache/status.h"
#include "tests/unit/cache_test_util.h"

#define BACK_SIZE (1u << 20)
#define LEG_SIZE (8u << 20)
#define BLK 4096u

enum { DEV_BACK = 0, DEV_LEG0 = 1, DEV_LEG1 = 2 };

static struct cache_set_cfg cfg = {
	.name = "agree",
	.nlegs = 2,
	.extent_size = 64u << 10,
	.mode = CACHE_WRITE_BACK,
	.admit_hits = 1,
	.dirty_target = 90,
};

static uint8_t *init_img[3];

static struct cache_set *open_set(struct mem_bdev **d, struct bdev **vol, enum cache_mode mode,
				  uint8_t *const img[3])
{
	char err[512];
	uint64_t sizes[3] = { BACK_SIZE, LEG_SIZE, LEG_SIZE };
	for (int i = 0; i < 3; i++)
		d[i] = mem_new(i, sizes[i], img ? img[i] : NULL);
	struct bdev *legs[2] = { &d[DEV_LEG0]->dev, &d[DEV_LEG1]->dev };
	cfg.mode = mode;
	struct cache_set *cs = cache_set_open_devs(&cfg, legs, err, sizeof(err));
	REQUIRE(cs, "open: %s", err);
	*vol = cache_vol_open(cs, "lun0", &d[DEV_BACK]->dev, NULL, mode, err, sizeof(err));
	REQUIRE(*vol, "attach: %s", err);
	return cs;
}

/* the logged write to dev whose data starts with B's stamp for lba 0, from `from` on */
static size_t find_stamp_lba(size_t from, int dev, uint64_t lba, uint64_t seq)
{
	size_t found = SIZE_MAX;
	pthread_mutex_lock(&g_log.lock);
	for (size_t i = from; i < g_log.n && found == SIZE_MAX; i++) {
		struct wlog_ent *x = &g_log.e[i];
		if (x->dev != dev || x->flush || !x->data)
			continue;
		for (uint64_t k = 0; k + 512 <= x->len; k += 512) {
			uint64_t s = 0;
			if (stamp_check(x->data + k, lba, &s) == 1 && s == seq) {
				found = i;
				break;
			}
		}
	}
	pthread_mutex_unlock(&g_log.lock);
	return found;
}

static size_t find_stamp(size_t from, int dev, uint64_t seq) { return find_stamp_lba(from, dev, 0, seq); }

/* every write logged before cut lands (but entry skip); later ones do not */
static void image_skip(size_t cut, size_t skip, uint8_t *out[3]);
static void image_at(size_t cut, uint8_t *out[3]) { image_skip(cut, SIZE_MAX, out); }

static void image_skip(size_t cut, size_t skip, uint8_t *out[3])
{
	uint64_t sizes[3] = { BACK_SIZE, LEG_SIZE, LEG_SIZE };
	pthread_mutex_lock(&g_log.lock);
	for (int d = 0; d < 3; d++) {
		out[d] = malloc(sizes[d]);
		memcpy(out[d], init_img[d], sizes[d]);
		for (size_t i = 0; i < cut && i < g_log.n; i++) {
			struct wlog_ent *x = &g_log.e[i];
			if (x->dev == d && !x->flush && x->data && i != skip)
				memcpy(out[d] + x->off, x->data, x->len);
		}
	}
	pthread_mutex_unlock(&g_log.lock);
}

static uint64_t block_seq(const uint8_t *b)
{
	uint64_t s = 0;
	int k = stamp_check(b, 0, &s);
	return k == 1 ? s : k == 0 ? 0 : UINT64_MAX;
}

static int failures;

static void expect(bool ok, const char *what, const char *fmt, uint64_t a, uint64_t b)
{
	if (!ok) {
		fprintf(stderr, "FAIL: %s: ", what);
		fprintf(stderr, fmt, (unsigned long long)a, (unsigned long long)b);
		fprintf(stderr, "\n");
		failures++;
	}
}

/* Recover from images, check everything the header promises. */
static void verify(const char *name, uint8_t *img[3], enum cache_mode mode, uint64_t seq_a, uint64_t seq_b,
		   int fail_leg)
{
	struct mem_bdev *d[3];
	struct bdev *vol;
	struct cache_set *cs = open_set(d, &vol, mode, img);
	uint8_t *buf = buf_get(BLK);
	uint64_t first = UINT64_MAX;
	for (int i = 0; i < 6; i++) {
		REQUIRE(tio_sync(vol, BDEV_READ, 0, buf, BLK, 0) == 0, "%s: read", name);
		uint64_t s = block_seq(buf);
		expect(s == seq_a || s == seq_b, name, "read holds seq %llu (want A or B: %llu)", s, seq_a);
		for (uint32_t k = 1; k < BLK / 512; k++) {
			uint64_t sk = 0;
			int st = stamp_check(buf + k * 512, k, &sk);
			expect(st == 1 && sk == s, name, "the block is torn: sector %llu holds seq %llu", k,
			       st == 1 ? sk : UINT64_MAX);
		}
		if (i == 0)
			first = s;
		expect(s == first, name, "read %llu differs from the first read (seq %llu)", (uint64_t)i, first);
	}
	uint64_t doff = 64u << 10; /* everything past the superblocks and the intent page */
	bool same = !memcmp(d[DEV_LEG0]->data + doff, d[DEV_LEG1]->data + doff, LEG_SIZE - doff);
	expect(same, name, "legs differ after recovery (%llu%llu)", 0, 0);
	if (!same) {
		for (uint64_t o = doff; o < LEG_SIZE; o += 512)
			if (memcmp(d[DEV_LEG0]->data + o, d[DEV_LEG1]->data + o, 512)) {
				fprintf(stderr, "  first difference at leg offset %llu: leg0 seq %llu, leg1 seq %llu\n",
					(unsigned long long)o, (unsigned long long)block_seq(d[DEV_LEG0]->data + o),
					(unsigned long long)block_seq(d[DEV_LEG1]->data + o));
				break;
			}
	}
	/* a leg dies: what the host read stays */
	atomic_store(&d[fail_leg]->fail_after, 0);
	for (int i = 0; i < 2; i++) {
		REQUIRE(tio_sync(vol, BDEV_READ, 0, buf, BLK, 0) == 0, "%s: read with leg %d failed", name, fail_leg - 1);
		uint64_t s = block_seq(buf);
		expect(s == first, name, "with a leg failed the block reads seq %llu, before %llu", s, first);
	}
	/* destage everything: the backing store must then hold what was served */
	REQUIRE(cache_set_flush(cs, 20000) == 0, "%s: flush", name);
	uint64_t s = block_seq(d[DEV_BACK]->data);
	expect(s == first, name, "after a flush the backing store holds seq %llu, the cache served %llu", s, first);
	buf_put(buf, BLK);
	test_set_close(cs, vol);
	printf("ok: %s: every read returned seq %llu (A %llu, B %llu), legs equal, leg %d lost, backing agrees\n",
	       name, (unsigned long long)first, (unsigned long long)seq_a, (unsigned long long)seq_b,
	       fail_leg - 1);
}

enum kase { WB_DIRTY, WB_CLEAN, WT, WA, WB_DIRTY_TORN, WB_CLEAN_TORN };

/* B's in-place write to dev: the logged write whose first sector is B's lba 0 (not the block log's copy) */
static size_t find_in_place(size_t from, int dev, uint64_t seq)
{
	size_t found = SIZE_MAX;
	pthread_mutex_lock(&g_log.lock);
	for (size_t i = from; i < g_log.n && found == SIZE_MAX; i++) {
		struct wlog_ent *x = &g_log.e[i];
		uint64_t s = 0;
		if (x->dev == dev && !x->flush && x->data && x->len >= BLK && stamp_check(x->data, 0, &s) == 1 &&
		    s == seq)
			found = i;
	}
	pthread_mutex_unlock(&g_log.lock);
	return found;
}

/* as image_at(cut), then sectors [lo, hi) of logged write i applied (a torn write) */
static void tear(uint8_t *img[3], size_t i, uint32_t lo, uint32_t hi)
{
	pthread_mutex_lock(&g_log.lock);
	struct wlog_ent *x = &g_log.e[i];
	memcpy(img[x->dev] + x->off + lo * 512, x->data + lo * 512, (hi - lo) * 512);
	pthread_mutex_unlock(&g_log.lock);
}

static void run_case(enum kase k, bool fua)
{
	static const char *names[] = { "write-back over dirty A", "write-back over clean A",
				       "write-through", "write-around over cached A",
				       "write-back over dirty A, 4 KiB block torn on both legs",
				       "write-back over clean A, 4 KiB block torn on both legs" };
	enum cache_mode mode = k == WT ? CACHE_WRITE_THROUGH : k == WA ? CACHE_WRITE_AROUND : CACHE_WRITE_BACK;
	bool torn = k == WB_DIRTY_TORN || k == WB_CLEAN_TORN;
	char name[128];
	snprintf(name, sizeof(name), "%s%s", names[k], fua ? ", FUA" : "");

	pthread_mutex_lock(&g_log.lock);
	for (size_t i = 0; i < g_log.n; i++)
		free(g_log.e[i].data);
	g_log.n = 0;
	g_log.on = false;
	pthread_mutex_unlock(&g_log.lock);

	struct mem_bdev *d[3];
	struct bdev *vol;
	/* write-around caches nothing on writes: start in write-through to cache A */
	struct cache_set *cs = open_set(d, &vol, k == WA ? CACHE_WRITE_THROUGH : mode, NULL);
	if (torn)
		REQUIRE(cache_vol_guard_torn(vol, true), "%s: the torn-write guard is not available", name);
	uint64_t sizes[3] = { BACK_SIZE, LEG_SIZE, LEG_SIZE };
	for (int i = 0; i < 3; i++) {
		free(init_img[i]);
		init_img[i] = malloc(sizes[i]);
		memcpy(init_img[i], d[i]->data, sizes[i]);
	}
	pthread_mutex_lock(&g_log.lock);
	g_log.on = true;
	pthread_mutex_unlock(&g_log.lock);

	uint8_t *a = buf_get(BLK), *b = buf_get(BLK);
	uint64_t seq_a = 11, seq_b = 12;
	stamp_fill(a, 0, BLK / 512, seq_a);
	stamp_fill(b, 0, BLK / 512, seq_b);
	unsigned fl = fua ? BDEV_F_FUA : 0;
	REQUIRE(tio_sync(vol, BDEV_WRITE, 0, a, BLK, fl) == 0, "write A");
	REQUIRE(tio_sync(vol, BDEV_FLUSH, 0, NULL, 0, 0) == 0, "flush A");
	if (k == WA || k == WT) {
		/* A must be cached: read it until a read hits (promotion runs in the background) */
		struct cache_set_status st;
		for (int i = 0;; i++) {
			REQUIRE(i < 20000, "A never became a read hit");
			REQUIRE(tio_sync(vol, BDEV_READ, 0, a, BLK, 0) == 0, "read A");
			cache_set_status(cs, &st);
			if (st.read_hits)
				break;
			usleep(1000);
		}
	}
	if (k == WB_CLEAN || k == WB_CLEAN_TORN)
		REQUIRE(cache_set_flush(cs, 20000) == 0, "destage A");
	if (k == WA)
		REQUIRE(cache_vol_set_mode(vol, CACHE_WRITE_AROUND) == 0, "switch to write-around");
	size_t mark = wlog_len();
	REQUIRE(tio_sync(vol, BDEV_WRITE, 0, b, BLK, fl) == 0, "write B");
	REQUIRE(tio_sync(vol, BDEV_FLUSH, 0, NULL, 0, 0) == 0, "flush B");
	pthread_mutex_lock(&g_log.lock);
	g_log.on = false;
	pthread_mutex_unlock(&g_log.lock);
	test_set_close(cs, vol);

	/* where to cut: right after B's first device write that matters */
	size_t cut;
	int fail_leg = DEV_LEG1;
	if (torn) {
		size_t i0 = find_in_place(mark, DEV_LEG0, seq_b), i1 = find_in_place(mark, DEV_LEG1, seq_b);
		REQUIRE(i0 != SIZE_MAX && i1 != SIZE_MAX, "%s: B's in-place writes are not in the log", name);
		cut = i0 < i1 ? i0 : i1;
		for (int pass = 0; pass < 2; pass++) {
			uint8_t *img[3];
			image_at(cut, img);
			tear(img, i0, 0, BLK / 512 / 2);
			tear(img, i1, BLK / 512 / 2, BLK / 512);
			verify(name, img, mode, seq_a, seq_b, pass ? DEV_LEG0 : DEV_LEG1);
			for (int i = 0; i < 3; i++)
				free(img[i]);
		}
		buf_put(a, BLK);
		buf_put(b, BLK);
		return;
	}
	if (k == WB_DIRTY || k == WB_CLEAN) {
		size_t i0 = find_stamp(mark, DEV_LEG0, seq_b);
		REQUIRE(i0 != SIZE_MAX, "%s: B's write to leg 0 is not in the log", name);
		size_t i1 = find_stamp(mark, DEV_LEG1, seq_b);
		REQUIRE(i1 != SIZE_MAX && i1 > i0, "%s: B's leg-1 write does not follow its leg-0 write", name);
		cut = i0 + 1;
	} else {
		size_t ib = find_stamp(mark, DEV_BACK, seq_b);
		REQUIRE(ib != SIZE_MAX, "%s: B's backing write is not in the log", name);
		cut = ib + 1;
		fail_leg = DEV_LEG0;
	}
	uint8_t *img[3];
	image_at(cut, img);
	verify(name, img, mode, seq_a, seq_b, fail_leg);
	/* the other leg lost instead */
	for (int i = 0; i < 3; i++)
		free(img[i]);
	image_at(cut, img);
	verify(name, img, mode, seq_a, seq_b, fail_leg == DEV_LEG1 ? DEV_LEG0 : DEV_LEG1);
	for (int i = 0; i < 3; i++)
		free(img[i]);
	buf_put(a, BLK);
	buf_put(b, BLK);
}

/*
 * A journal block that reached leg 1 only: recovery reads leg 0, where the
 * record is missing, so the block written by the cut write reads the old
 * data. After a clean stop, leg 1 alone (leg 0 lost) must read the same:
 * the stale journal block at the ring's head must not be replayed then.
 */
static void journal_on_one_leg(void)
{
	const char *name = "a journal block on leg 1 only";
	wlog_reset(&g_log);
	struct mem_bdev *d[3];
	struct bdev *vol;
	struct cache_set *cs = open_set(d, &vol, CACHE_WRITE_BACK, NULL);
	uint64_t sizes[3] = { BACK_SIZE, LEG_SIZE, LEG_SIZE };
	for (int i = 0; i < 3; i++) {
		free(init_img[i]);
		init_img[i] = malloc(sizes[i]);
		memcpy(init_img[i], d[i]->data, sizes[i]);
	}
	pthread_mutex_lock(&g_log.lock);
	g_log.on = true;
	pthread_mutex_unlock(&g_log.lock);
	uint8_t *b = buf_get(BLK);
	uint64_t lba = 4 * (64u << 10) / 512; /* an extent nothing cached before */
	stamp_fill(b, lba, BLK / 512, 21);
	REQUIRE(tio_sync(vol, BDEV_WRITE, lba * 512, b, BLK, BDEV_F_FUA) == 0, "write B");
	pthread_mutex_lock(&g_log.lock);
	g_log.on = false;
	pthread_mutex_unlock(&g_log.lock);
	test_set_close(cs, vol);
	/* the journal write after B's data: on leg 0 dropped, on leg 1 kept */
	size_t j0 = SIZE_MAX, j1 = SIZE_MAX;
	size_t data1 = find_stamp_lba(0, DEV_LEG1, lba, 21);
	REQUIRE(data1 != SIZE_MAX, "%s: B's data is not in the log", name);
	pthread_mutex_lock(&g_log.lock);
	for (size_t i = data1 + 1; i < g_log.n; i++) {
		struct wlog_ent *x = &g_log.e[i];
		if (!x->data || x->flush || x->off < (64u << 10) || x->len != 4096)
			continue;
		if (x->dev == DEV_LEG0 && j0 == SIZE_MAX && le32_get(((struct cache_jblock_disk *)x->data)->magic) == JBLOCK_MAGIC)
			j0 = i;
		if (x->dev == DEV_LEG1 && j1 == SIZE_MAX && le32_get(((struct cache_jblock_disk *)x->data)->magic) == JBLOCK_MAGIC)
			j1 = i;
	}
	pthread_mutex_unlock(&g_log.lock);
	REQUIRE(j0 != SIZE_MAX && j1 != SIZE_MAX, "%s: B's journal block is not in the log", name);
	uint8_t *img[3];
	image_skip((j0 > j1 ? j0 : j1) + 1, j0, img);
	/*
	 * recovery from leg 0: B's record missing, so B's block reads the
	 * backing store (no promotion: a fill's record would overwrite the
	 * stale block by chance)
	 */
	struct mem_bdev *e[3];
	cfg.admit_hits = 1000;
	cs = open_set(e, &vol, CACHE_WRITE_BACK, img);
	REQUIRE(tio_sync(vol, BDEV_READ, lba * 512, b, BLK, 0) == 0, "%s: read", name);
	uint64_t first = block_seq(b);
	/* a clean stop, then leg 0 is lost: leg 1 alone */
	cache_set_shutdown(cs);
	uint8_t *leg1 = malloc(LEG_SIZE), *back = malloc(BACK_SIZE);
	memcpy(back, e[DEV_BACK]->data, BACK_SIZE); /* before the volume closes its backing device */
	bdev_close(vol);
	memcpy(leg1, e[DEV_LEG1]->data, LEG_SIZE);
	cache_set_close(cs);
	char err[512];
	struct mem_bdev *l1 = mem_new(DEV_LEG1, LEG_SIZE, leg1), *bk = mem_new(DEV_BACK, BACK_SIZE, back);
	struct bdev *legs[1] = { &l1->dev };
	struct cache_set_cfg one = cfg;
	one.nlegs = 1;
	one.allow_single_leg = true;
	one.mode = CACHE_WRITE_BACK;
	cs = cache_set_open_devs(&one, legs, err, sizeof(err));
	REQUIRE(cs, "%s: leg 1 alone does not open: %s", name, err);
	vol = cache_vol_open(cs, "lun0", &bk->dev, NULL, CACHE_WRITE_BACK, err, sizeof(err));
	REQUIRE(vol, "attach: %s", err);
	REQUIRE(tio_sync(vol, BDEV_READ, lba * 512, b, BLK, 0) == 0, "%s: read from leg 1", name);
	cfg.admit_hits = 1;
	uint64_t second = block_seq(b);
	expect(second == first, name, "leg 1 alone reads seq %llu where both legs read %llu", second, first);
	test_set_close(cs, vol);
	for (int i = 0; i < 3; i++)
		free(img[i]);
	free(leg1);
	free(back);
	buf_put(b, BLK);
	printf("%s: %s: the block read seq %llu, and the same from leg 1 alone\n", failures ? "FAIL" : "ok", name,
	       (unsigned long long)first);
}

int main(void)
{
	REQUIRE(workers_start(2) == 0, "workers");
	for (int fua = 0; fua < 2; fua++) {
		run_case(WB_DIRTY, fua);
		run_case(WB_CLEAN, fua);
		run_case(WT, fua);
		run_case(WA, fua);
		run_case(WB_DIRTY_TORN, fua);
		run_case(WB_CLEAN_TORN, fua);
	}
	journal_on_one_leg();
	workers_stop();
	if (failures) {
		fprintf(stderr, "%d check(s) failed\n", failures);
		return 1;
	}
	printf("ok: the mirror is one copy after every cut\n");
	return 0;
}
