/*
 * test_cache_old_format.c - sets written by earlier releases, holding
 * dirty data after a crash, are recovered, never misread.
 *
 * tests/data/v1-unclean/ and v2-unclean/ hold images made by the releases
 * that wrote superblock versions 1 (before the write-intent page) and 2
 * (before the block log); make_image.c in each says how: 64 dirty 4 KiB
 * blocks acknowledged with FUA, then an overwrite of block 0 cut after it
 * reached leg 0 and before leg 1, no clean shutdown. A version 1 set has
 * no record of what was in flight, so every region is reconciled; a
 * version 2 set has its write-intent page. Checks: the set opens; every
 * acknowledged block reads back; block 0 reads the same six times (old or
 * new); the legs are byte-equal; both superblocks are now version 2 (a
 * version 1 set gains the page; neither gains a block log, which would
 * move the data); losing either leg changes nothing; after a flush the
 * backing store holds what was served. And a superblock of an unknown,
 * newer version is refused with a message that says so.
 */
#include "cache/cache_int.h"
#include "cache/meta.h"
#include "tests/unit/cache_test_util.h"

#define BACK_SIZE (1u << 20)
#define LEG_SIZE (8u << 20)
#define BLK 4096u

static struct cache_set_cfg cfg = {
	.name = "v1", .nlegs = 2, .extent_size = 64u << 10, .mode = CACHE_WRITE_BACK,
	.admit_hits = 1, .dirty_target = 90,
};

static const char *img_dir = "v1-unclean";

static uint8_t *load(const char *name, uint64_t size)
{
	char cmd[512];
	const char *root = getenv("TC_ROOT") ? getenv("TC_ROOT") : ".";
	snprintf(cmd, sizeof(cmd), "gzip -dc %s/tests/data/%s/%s", root, img_dir, name);
	FILE *f = popen(cmd, "r");
	REQUIRE(f, "cannot run %s", cmd);
	uint8_t *b = malloc(size);
	size_t n = fread(b, 1, size, f);
	REQUIRE(pclose(f) == 0 && n == size, "%s: read %zu of %llu bytes", cmd, n, (unsigned long long)size);
	return b;
}

static uint64_t seq_of(const uint8_t *b, uint64_t lba)
{
	uint64_t s = 0;
	int k = stamp_check(b, lba, &s);
	return k == 1 ? s : k == 0 ? 0 : UINT64_MAX;
}

static void run(uint32_t version, int fail_leg)
{
	char err[512];
	struct mem_bdev *d[3] = { mem_new(0, BACK_SIZE, NULL), mem_new(1, LEG_SIZE, NULL), mem_new(2, LEG_SIZE, NULL) };
	const char *files[3] = { "backing.img.gz", "leg0.img.gz", "leg1.img.gz" };
	uint64_t sizes[3] = { BACK_SIZE, LEG_SIZE, LEG_SIZE };
	for (int i = 0; i < 3; i++) {
		uint8_t *img = load(files[i], sizes[i]);
		memcpy(d[i]->data, img, sizes[i]);
		free(img);
	}
	const struct cache_sb_disk *sb0 = (const void *)d[1]->data;
	REQUIRE(le32_get(sb0->version) == version && !le32_get(sb0->clean), "the images are not an unclean version %u set",
		version);
	struct bdev *legs[2] = { &d[1]->dev, &d[2]->dev };
	struct cache_set *cs = cache_set_open_devs(&cfg, legs, err, sizeof(err));
	REQUIRE(cs, "a version %u set does not open: %s", version, err);
	REQUIRE(!cs->lay.dlog_pages, "a version %u set was given a block log", version);
	struct bdev *vol = cache_vol_open(cs, "lun0", &d[0]->dev, NULL, CACHE_WRITE_BACK, err, sizeof(err));
	REQUIRE(vol, "attach: %s", err);

	uint8_t *buf = buf_get(64 * BLK);
	REQUIRE(tio_sync(vol, BDEV_READ, 0, buf, 64 * BLK, 0) == 0, "read");
	for (uint64_t b = 1; b < 64; b++)
		for (uint64_t s = 0; s < 8; s++)
			REQUIRE(seq_of(buf + b * BLK + s * 512, b * 8 + s) == b + 1,
				"acknowledged block %llu sector %llu lost: holds seq %llu", (unsigned long long)b,
				(unsigned long long)s, (unsigned long long)seq_of(buf + b * BLK + s * 512, b * 8 + s));
	uint64_t first = seq_of(buf, 0);
	REQUIRE(first == 1 || first == 100, "block 0 holds seq %llu (want 1 or 100)", (unsigned long long)first);
	for (int i = 0; i < 6; i++) {
		REQUIRE(tio_sync(vol, BDEV_READ, 0, buf, BLK, 0) == 0, "read");
		for (uint64_t s = 0; s < 8; s++)
			REQUIRE(seq_of(buf + s * 512, s) == first, "read %d of block 0 sector %llu: seq %llu, first read %llu",
				i, (unsigned long long)s, (unsigned long long)seq_of(buf + s * 512, s),
				(unsigned long long)first);
	}
	uint64_t doff = 64u << 10;
	REQUIRE(!memcmp(d[1]->data + doff, d[2]->data + doff, LEG_SIZE - doff), "the legs differ after recovery");
	for (int l = 1; l <= 2; l++) {
		/* the newest valid copy on each leg */
		const struct cache_sb_disk *best = NULL;
		for (int k = 0; k < 2; k++) {
			const struct cache_sb_disk *sb = (const void *)(d[l]->data + k * 4096);
			const char *why;
			if (meta_sb_check(sb, &why) == 0 && (!best || le64_get(sb->gen) > le64_get(best->gen)))
				best = sb;
		}
		REQUIRE(best && le32_get(best->version) == CACHE_VERSION_V2, "leg %d's newest superblock is not version %d",
			l - 1, CACHE_VERSION_V2);
	}
	atomic_store(&d[fail_leg]->fail_after, 0);
	REQUIRE(tio_sync(vol, BDEV_READ, 0, buf, 64 * BLK, 0) == 0, "read with a leg lost");
	REQUIRE(seq_of(buf, 0) == first, "with leg %d lost block 0 reads seq %llu, before %llu", fail_leg - 1,
		(unsigned long long)seq_of(buf, 0), (unsigned long long)first);
	for (uint64_t b = 1; b < 64; b++)
		REQUIRE(seq_of(buf + b * BLK, b * 8) == b + 1, "block %llu lost with a leg gone", (unsigned long long)b);
	REQUIRE(cache_set_flush(cs, 20000) == 0, "flush");
	for (uint64_t b = 0; b < 64; b++)
		REQUIRE(seq_of(d[0]->data + b * BLK, b * 8) == (b ? b + 1 : first),
			"after a flush backing block %llu holds seq %llu", (unsigned long long)b,
			(unsigned long long)seq_of(d[0]->data + b * BLK, b * 8));
	buf_put(buf, 64 * BLK);
	cache_set_shutdown(cs);
	bdev_close(vol);
	cache_set_close(cs);
	printf("ok: version %u set recovered (leg %d lost afterwards): 63 acknowledged blocks intact, block 0 "
	       "reads seq %llu every time, legs equal, backing agrees after a flush\n",
	       version, fail_leg - 1, (unsigned long long)first);
}

static void newer_version_refused(void)
{
	char err[512];
	struct mem_bdev *l[2] = { mem_new(1, LEG_SIZE, NULL), mem_new(2, LEG_SIZE, NULL) };
	for (int i = 0; i < 2; i++) {
		uint8_t *img = load(i ? "leg1.img.gz" : "leg0.img.gz", LEG_SIZE);
		memcpy(l[i]->data, img, LEG_SIZE);
		free(img);
		for (int k = 0; k < 2; k++) {
			struct cache_sb_disk *sb = (void *)(l[i]->data + k * 4096);
			sb->version = le32_of(CACHE_VERSION + 1);
			meta_sb_seal(sb);
		}
	}
	struct bdev *legs[2] = { &l[0]->dev, &l[1]->dev };
	struct cache_set *cs = cache_set_open_devs(&cfg, legs, err, sizeof(err));
	REQUIRE(!cs, "a set of a newer version opened");
	REQUIRE(strstr(err, "newer tiercached"), "the refusal does not say why: %s", err);
	printf("ok: a newer version is refused: %s\n", err);
}

int main(void)
{
	REQUIRE(workers_start(2) == 0, "workers");
	run(1, 2);
	run(1, 1);
	img_dir = "v2-unclean";
	run(2, 2);
	run(2, 1);
	newer_version_refused();
	workers_stop();
	return 0;
}
