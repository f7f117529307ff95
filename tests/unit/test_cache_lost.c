/*
 * test_cache_lost.c - with both legs gone, status says WHICH ranges were lost.
 *
 * A write-back set takes dirty writes in two separate regions of a LUN
 * (one inside an extent, one straddling two extents), then both legs fail.
 * Every 4 KiB around the regions is read (some twice, and once as one big
 * read): exactly the blocks of the regions fail with -EIO, and
 * cache_set_status lists exactly the two regions, merged across the extent
 * boundary and across repeated reads. Then: more separate losses than the
 * list holds keep CACHE_LOST_MAX ranges and count the rest as dropped (the
 * set lists every dirty range when its last leg fails, reads then meet them
 * again), and
 * the same offsets lost on two LUNs stay two ranges, one per LUN.
 *
 * The cleaner trickles dirty data out even under load; if it happened to
 * destage part of a region before the legs failed (seen as fewer dirty
 * bytes than written), the scenario is run again on fresh devices.
 */
#include "cache/status.h"
#include "tests/unit/cache_test_util.h"

#define BACK_SIZE (8u << 20)
#define LEG_SIZE (16u << 20)
#define KIB 1024u

static struct cache_set_cfg cfg = {
	.name = "lost",
	.nlegs = 2,
	.extent_size = 64u << 10,
	.mode = CACHE_WRITE_BACK,
	.admit_hits = 1,
	.dirty_target = 90,
};

struct rig {
	struct mem_bdev *back[2], *leg[2];
	struct cache_set *cs;
	struct bdev *vol[2];
	int nvols;
};

static void rig_open(struct rig *r, int nvols)
{
	char err[512];
	memset(r, 0, sizeof(*r));
	r->leg[0] = mem_new(1, LEG_SIZE, NULL);
	r->leg[1] = mem_new(2, LEG_SIZE, NULL);
	struct bdev *legs[2] = { &r->leg[0]->dev, &r->leg[1]->dev };
	r->cs = cache_set_open_devs(&cfg, legs, err, sizeof(err));
	REQUIRE(r->cs, "open: %s", err);
	for (int i = 0; i < nvols; i++) {
		char name[16];
		snprintf(name, sizeof(name), "lun%d", i);
		r->back[i] = mem_new(10 + i, BACK_SIZE, NULL);
		r->vol[i] = cache_vol_open(r->cs, name, &r->back[i]->dev, NULL, CACHE_WRITE_BACK, err, sizeof(err));
		REQUIRE(r->vol[i], "attach %s: %s", name, err);
	}
	r->nvols = nvols;
}

static void rig_close(struct rig *r)
{
	cache_set_shutdown(r->cs);
	for (int i = 0; i < r->nvols; i++)
		bdev_close(r->vol[i]);
	cache_set_close(r->cs);
}

static void write_region(struct bdev *vol, uint64_t off, uint32_t len, uint64_t seq)
{
	uint8_t *buf = buf_get(len);
	stamp_fill(buf, off / 512, len / 512, seq);
	REQUIRE(tio_sync(vol, BDEV_WRITE, off, buf, len, BDEV_F_FUA) == 0, "write at %llu", (unsigned long long)off);
	buf_put(buf, len);
}

/* Fail both legs; true if every byte written is still dirty (the cleaner did not get there first). */
static bool lose_legs(struct rig *r, uint64_t expect_dirty)
{
	atomic_store(&r->leg[0]->fail_after, 0);
	atomic_store(&r->leg[1]->fail_after, 0);
	usleep(50000); /* let anything the cleaner had in flight finish */
	struct cache_set_status st;
	cache_set_status(r->cs, &st);
	if (st.dirty_bytes != expect_dirty)
		fprintf(stderr, "note: %llu dirty bytes instead of %llu (the cleaner raced); again\n",
			(unsigned long long)st.dirty_bytes, (unsigned long long)expect_dirty);
	return st.dirty_bytes == expect_dirty;
}

static bool overlaps(uint64_t off, uint64_t len, uint64_t lo, uint64_t n)
{
	return off < lo + n && lo < off + len;
}

/* Two regions; every 4 KiB around them read: EIO exactly on the regions. */
static bool two_regions(void)
{
	const uint64_t a = (1u << 20) + 8 * KIB, alen = 20 * KIB;  /* inside extent 16 */
	const uint64_t b = (5u << 20) - 12 * KIB, blen = 28 * KIB; /* extents 79 and 80 */
	struct rig r;
	rig_open(&r, 1);
	write_region(r.vol[0], a, (uint32_t)alen, 1);
	write_region(r.vol[0], b, (uint32_t)blen, 2);
	if (!lose_legs(&r, alen + blen)) {
		rig_close(&r);
		return false;
	}
	/* an unrelated write meets the dead legs: status lists the loss from then on, before any read */
	uint8_t *w = buf_get(4 * KIB);
	stamp_fill(w, (3u << 20) / 512, 8, 9);
	(void)tio_sync(r.vol[0], BDEV_WRITE, 3u << 20, w, 4 * KIB, BDEV_F_FUA);
	buf_put(w, 4 * KIB);
	struct cache_set_status st0;
	cache_set_status(r.cs, &st0);
	REQUIRE(st0.nlost == 2 && st0.lost[0].offset == a && st0.lost[0].length == alen && st0.lost[1].offset == b &&
			st0.lost[1].length == blen,
		"before any read, status lists %d lost ranges, not regions A and B", st0.nlost);
	printf("ok: the moment the last leg failed, before any read, status listed both lost regions\n");
	uint8_t *buf = buf_get(256 * KIB);
	uint64_t spans[3][2] = { { a - 64 * KIB, 192 * KIB }, { a, alen }, { b - 128 * KIB, 192 * KIB } };
	for (int k = 0; k < 3; k++)
		for (uint64_t off = spans[k][0]; off < spans[k][0] + spans[k][1]; off += 4 * KIB) {
			int rc = tio_sync(r.vol[0], BDEV_READ, off, buf, 4 * KIB, 0);
			bool lost = overlaps(off, 4 * KIB, a, alen) || overlaps(off, 4 * KIB, b, blen);
			REQUIRE(rc == (lost ? -EIO : 0), "read of 4 KiB at %llu: %d, expected %d",
			      (unsigned long long)off, rc, lost ? -EIO : 0);
		}
	REQUIRE(tio_sync(r.vol[0], BDEV_READ, b - 64 * KIB, buf, 256 * KIB, 0) == -EIO, "big read over region B");
	buf_put(buf, 256 * KIB);

	struct cache_set_status st;
	cache_set_status(r.cs, &st);
	REQUIRE(st.lost_ios > 0, "no lost I/O counted");
	REQUIRE(st.nlost == 2 && st.lost_dropped == 0, "%d lost ranges (%llu dropped), expected exactly 2", st.nlost,
	      (unsigned long long)st.lost_dropped);
	for (int i = 0; i < st.nlost; i++)
		printf("  lost: lun %s offset %llu length %llu\n", st.lost[i].lun,
		       (unsigned long long)st.lost[i].offset, (unsigned long long)st.lost[i].length);
	REQUIRE(!strcmp(st.lost[0].lun, "lun0") && st.lost[0].offset == a && st.lost[0].length == alen,
	      "first range is not region A");
	REQUIRE(!strcmp(st.lost[1].lun, "lun0") && st.lost[1].offset == b && st.lost[1].length == blen,
	      "second range is not region B (merged across the extent boundary)");
	rig_close(&r);
	printf("ok: both legs lost with dirty data in two regions: status lists exactly those two ranges\n");
	return true;
}

/* More separate losses than the list holds: CACHE_LOST_MAX kept, the rest counted. */
static bool overflow(void)
{
	const int n = CACHE_LOST_MAX + 8;
	struct rig r;
	rig_open(&r, 1);
	for (int i = 0; i < n; i++)
		write_region(r.vol[0], (uint64_t)i * 128 * KIB + 4 * KIB, 4 * KIB, (uint64_t)i + 1);
	if (!lose_legs(&r, (uint64_t)n * 4 * KIB)) {
		rig_close(&r);
		return false;
	}
	uint8_t *buf = buf_get(4 * KIB);
	for (int i = 0; i < n; i++)
		REQUIRE(tio_sync(r.vol[0], BDEV_READ, (uint64_t)i * 128 * KIB + 4 * KIB, buf, 4 * KIB, 0) == -EIO,
		      "lost block %d read without error", i);
	/* lost again: merges into its range, drops nothing more */
	REQUIRE(tio_sync(r.vol[0], BDEV_READ, 4 * KIB, buf, 4 * KIB, 0) == -EIO, "lost block 0 again");
	buf_put(buf, 4 * KIB);
	struct cache_set_status st;
	cache_set_status(r.cs, &st);
	/* listed when the last leg failed, then met again by the reads: a dropped one counts each time */
	REQUIRE(st.nlost == CACHE_LOST_MAX && st.lost_dropped >= 8, "%d ranges, %llu dropped; expected %d and >= 8",
	      st.nlost, (unsigned long long)st.lost_dropped, CACHE_LOST_MAX);
	for (int i = 0; i < st.nlost; i++)
		REQUIRE(st.lost[i].offset == (uint64_t)i * 128 * KIB + 4 * KIB && st.lost[i].length == 4 * KIB,
		      "range %d is %llu+%llu", i, (unsigned long long)st.lost[i].offset,
		      (unsigned long long)st.lost[i].length);
	rig_close(&r);
	printf("ok: %d separate losses: %d ranges kept in order, %llu counted as dropped\n", n, st.nlost,
	       (unsigned long long)st.lost_dropped);
	return true;
}

/* The same offsets lost on two LUNs of one set are two ranges. */
static bool two_luns(void)
{
	struct rig r;
	rig_open(&r, 2);
	write_region(r.vol[0], 64 * KIB, 8 * KIB, 1);
	write_region(r.vol[1], 64 * KIB, 8 * KIB, 2);
	if (!lose_legs(&r, 16 * KIB)) {
		rig_close(&r);
		return false;
	}
	uint8_t *buf = buf_get(8 * KIB);
	REQUIRE(tio_sync(r.vol[0], BDEV_READ, 64 * KIB, buf, 8 * KIB, 0) == -EIO, "lun0 read");
	REQUIRE(tio_sync(r.vol[1], BDEV_READ, 64 * KIB, buf, 8 * KIB, 0) == -EIO, "lun1 read");
	buf_put(buf, 8 * KIB);
	struct cache_set_status st;
	cache_set_status(r.cs, &st);
	REQUIRE(st.nlost == 2 && strcmp(st.lost[0].lun, st.lost[1].lun) &&
	      st.lost[0].offset == 64 * KIB && st.lost[1].offset == 64 * KIB &&
	      st.lost[0].length == 8 * KIB && st.lost[1].length == 8 * KIB,
	      "expected one 8 KiB range at 64 KiB on each LUN (%d ranges)", st.nlost);
	rig_close(&r);
	printf("ok: the same range lost on two LUNs is listed once per LUN\n");
	return true;
}

int main(void)
{
	REQUIRE(workers_start(getenv("TC_TEST_WORKERS") ? (unsigned)atoi(getenv("TC_TEST_WORKERS")) : 2) == 0, "workers");
	bool (*scenario[])(void) = { two_regions, overflow, two_luns };
	for (size_t i = 0; i < sizeof(scenario) / sizeof(scenario[0]); i++) {
		int tries = 0;
		while (!scenario[i]())
			REQUIRE(++tries < 5, "the cleaner destaged the test's dirty data %d times in a row", tries);
	}
	workers_stop();
	return 0;
}
