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
 * new); the legs are byte-equal; both superblocks are now version 4 (a
 * version 1 set gains the page; neither gains a block log, which would
 * move the data); losing either leg changes nothing; after a flush the
 * backing store holds what was served. And a superblock of an unknown,
 * newer version is refused with a message that says so.
 *
 * tests/data/v3-unclean/ holds a version 3 set (the table of LUNs inside
 * the superblock) with two LUNs' dirty data: it is upgraded to version 4
 * (the table in its own pages) and both LUNs read back what they were
 * acknowledged, by name, whatever order they attach in. The upgrade is cut
 * by a power failure at every write it makes (and with each write torn
 * after its first page): every cut opens, as version 3 or 4, with both
 * LUNs' data. And the upgraded set, closed and opened again, still knows
 * both LUNs, takes a 20th LUN (more than version 3's 16), and refuses a
 * LUN's store that is not the one it holds data for.
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
		REQUIRE(best && le32_get(best->version) == CACHE_VERSION && !le32_get(best->dlog_rings),
			"leg %d's newest superblock is not version %d without a block log", l - 1, CACHE_VERSION);
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

/* ---- version 3: the table of LUNs moves out of the superblock ---- */

#define LUN1_BLOCKS 16

struct v3_img {
	uint8_t *img[4]; /* lun0's backing, leg 0, leg 1, lun1's backing */
};
static const uint64_t v3_sizes[4] = { BACK_SIZE, LEG_SIZE, LEG_SIZE, BACK_SIZE };

static void v3_load(struct v3_img *m)
{
	const char *files[4] = { "backing.img.gz", "leg0.img.gz", "leg1.img.gz", "backing1.img.gz" };
	img_dir = "v3-unclean";
	for (int i = 0; i < 4; i++)
		m->img[i] = load(files[i], v3_sizes[i]);
}

static const struct cache_sb_disk *newest_sb(const uint8_t *leg)
{
	const struct cache_sb_disk *best = NULL;
	for (int k = 0; k < 2; k++) {
		const struct cache_sb_disk *sb = (const void *)(leg + k * 4096);
		const char *why;
		if (meta_sb_check(sb, &why) == 0 && (!best || le64_get(sb->gen) > le64_get(best->gen)))
			best = sb;
	}
	return best;
}

/*
 * Open the set on devices d[0..3] (ids 0..3 as in v3_sizes), attach both
 * LUNs (lun0 first when lun0_first) and check every acknowledged block of
 * both; block 0 of lun0 reads 1 or 100. Leaves the set open in *csp with
 * the volumes in vol[2] (lun0, lun1).
 */
static uint8_t *zdatas[4]; /* the new LUNs' stores, freed by v3_close */
static int nz;

static void v3_check(struct mem_bdev **d, bool lun0_first, const char *what, struct cache_set **csp,
		     struct bdev **vol)
{
	char err[512];
	struct cache_set_cfg c3 = cfg;
	c3.name = "v3";
	struct bdev *legs[2] = { &d[1]->dev, &d[2]->dev };
	struct cache_set *cs = cache_set_open_devs(&c3, legs, err, sizeof(err));
	REQUIRE(cs, "%s: the set does not open: %s", what, err);
	REQUIRE(cs->lay.dlog_pages, "%s: the version 3 set lost its block log", what);
	/* a new LUN first: it takes the lowest free backing id, so had the table been lost it would take
	 * lun1's (0) and read lun1's dirty data */
	uint8_t *zdata = calloc(1, BACK_SIZE);
	struct mem_bdev *zd = mem_borrow(20, BACK_SIZE, zdata);
	struct bdev *zv = cache_vol_open(cs, "zz", &zd->dev, NULL, CACHE_WRITE_BACK, err, sizeof(err));
	REQUIRE(zv, "%s: a new LUN does not attach: %s", what, err);
	uint8_t *zb = buf_get(LUN1_BLOCKS * BLK);
	REQUIRE(tio_sync(zv, BDEV_READ, 0, zb, LUN1_BLOCKS * BLK, 0) == 0, "%s: read the new LUN", what);
	for (uint64_t b = 0; b < LUN1_BLOCKS; b++)
		REQUIRE(seq_of(zb + b * BLK, b * 8) == 0, "%s: a new LUN's block %llu reads seq %llu, not its zeros",
			what, (unsigned long long)b, (unsigned long long)seq_of(zb + b * BLK, b * 8));
	buf_put(zb, LUN1_BLOCKS * BLK);
	for (int k = 0; k < 2; k++) {
		int l = lun0_first ? k : 1 - k;
		vol[l] = cache_vol_open(cs, l ? "lun1" : "lun0", &d[l ? 3 : 0]->dev, NULL, CACHE_WRITE_BACK, err,
					sizeof(err));
		REQUIRE(vol[l], "%s: lun%d does not attach: %s", what, l, err);
	}
	uint8_t *buf = buf_get(64 * BLK);
	REQUIRE(tio_sync(vol[0], BDEV_READ, 0, buf, 64 * BLK, 0) == 0, "%s: read lun0", what);
	for (uint64_t b = 1; b < 64; b++)
		REQUIRE(seq_of(buf + b * BLK, b * 8) == b + 1 && seq_of(buf + b * BLK + 7 * 512, b * 8 + 7) == b + 1,
			"%s: lun0 block %llu holds seq %llu, want %llu", what, (unsigned long long)b,
			(unsigned long long)seq_of(buf + b * BLK, b * 8), (unsigned long long)b + 1);
	uint64_t first = seq_of(buf, 0);
	REQUIRE(first == 1 || first == 100, "%s: lun0 block 0 holds seq %llu", what, (unsigned long long)first);
	REQUIRE(tio_sync(vol[1], BDEV_READ, 0, buf, LUN1_BLOCKS * BLK, 0) == 0, "%s: read lun1", what);
	for (uint64_t b = 0; b < LUN1_BLOCKS; b++)
		REQUIRE(seq_of(buf + b * BLK, b * 8) == 1001 + b,
			"%s: lun1 block %llu holds seq %llu, want %llu (another LUN's data?)", what,
			(unsigned long long)b, (unsigned long long)seq_of(buf + b * BLK, b * 8),
			(unsigned long long)(1001 + b));
	buf_put(buf, 64 * BLK);
	*csp = cs;
	vol[2] = zv;
	zdatas[nz++] = zdata;
}

static void v3_close(struct cache_set *cs, struct bdev **vol)
{
	cache_set_shutdown(cs);
	bdev_close(vol[0]);
	bdev_close(vol[1]);
	bdev_close(vol[2]);
	cache_set_close(cs);
	while (nz)
		free(zdatas[--nz]);
}

static void v3_upgrade(void)
{
	struct v3_img m;
	v3_load(&m);
	const struct cache_sb_disk *sb0 = newest_sb(m.img[1]);
	REQUIRE(sb0 && le32_get(sb0->version) == CACHE_VERSION_V3 && !le32_get(sb0->clean),
		"the images are not an unclean version 3 set");
	REQUIRE(!strcmp(sb0->legacy_backing[0].lun, "lun1") && !strcmp(sb0->legacy_backing[1].lun, "lun0"),
		"the images do not hold lun1 at backing id 0 and lun0 at 1");
	/* over m's buffers: closing the set and the volumes closes the devices, not the data */
	struct mem_bdev *d[4];
	for (int i = 0; i < 4; i++)
		d[i] = mem_borrow(i, v3_sizes[i], m.img[i]);
	struct cache_set *cs;
	struct bdev *vol[3];
	v3_check(d, true, "version 3 upgraded", &cs, vol);
	for (int l = 1; l <= 2; l++) {
		const struct cache_sb_disk *sb = newest_sb(m.img[l]);
		REQUIRE(sb && le32_get(sb->version) == CACHE_VERSION && le32_get(sb->dlog_rings) == CACHE_DLOG_RINGS,
			"leg %d's newest superblock is not version %d with the block log", l - 1, CACHE_VERSION);
		for (int k = 0; k < 2; k++) /* both copies: nothing left for an older tiercached to open by */
			REQUIRE(le32_get(((const struct cache_sb_disk *)(m.img[l] + k * 4096))->version) == CACHE_VERSION,
				"leg %d's superblock copy %d is still version %u", l - 1, k,
				le32_get(((const struct cache_sb_disk *)(m.img[l] + k * 4096))->version));
		const struct cache_btab_disk *t = (const void *)(m.img[l] + meta_btab_off(le32_get(sb->btab_copy)));
		REQUIRE(meta_btab_crc(t) == le32_get(sb->btab_crc), "leg %d: the table the superblock names is not whole",
			l - 1);
		REQUIRE(!strcmp(t[0].lun, "lun1") && !strcmp(t[1].lun, "lun0") && !strcmp(t[2].lun, "zz") &&
				!t[3].lun[0],
			"leg %d: the table holds %s, %s, %s", l - 1, t[0].lun, t[1].lun, t[2].lun);
	}
	REQUIRE(cache_set_flush(cs, 20000) == 0, "flush");
	v3_close(cs, vol);

	/* opened again: the table comes from its own pages now */
	struct mem_bdev *e[4];
	for (int i = 0; i < 4; i++)
		e[i] = mem_borrow(i, v3_sizes[i], m.img[i]);
	v3_check(e, false, "version 4, opened again", &cs, vol);
	char err[512];
	struct mem_bdev *more[20];
	struct bdev *mv[20];
	for (int i = 0; i < 20; i++) {
		char name[16];
		snprintf(name, sizeof(name), "more%d", i);
		more[i] = mem_new(10 + i, BACK_SIZE, NULL);
		mv[i] = cache_vol_open(cs, name, &more[i]->dev, NULL, CACHE_WRITE_BACK, err, sizeof(err));
		REQUIRE(mv[i], "LUN %d of the set does not attach: %s", i + 3, err);
	}
	struct mem_bdev *other = mem_new(40, BACK_SIZE / 2, NULL);
	REQUIRE(!cache_vol_open(cs, "more7", &other->dev, NULL, CACHE_WRITE_BACK, err, sizeof(err)) &&
		strstr(err, "not the one this cache holds"), "another store under a known LUN's name was taken: %s", err);
	bdev_close(&other->dev);
	cache_set_shutdown(cs);
	for (int i = 0; i < 20; i++)
		bdev_close(mv[i]);
	bdev_close(vol[0]);
	bdev_close(vol[1]);
	bdev_close(vol[2]);
	cache_set_close(cs);
	while (nz)
		free(zdatas[--nz]);
	for (int i = 0; i < 4; i++)
		free(m.img[i]);
	printf("ok: version 3 set upgraded to %d: both LUNs' acknowledged data by name, the table in its own "
	       "pages, 23 LUNs attach after a reopen, a wrong store refused\n", CACHE_VERSION);
}

/* Device id's image as a power cut before log entry cut leaves it; with torn, entry cut itself reached
 * the device as far as its first page. */
static void cut_image(int id, const uint8_t *initial, uint64_t size, size_t cut, bool torn, uint8_t *out)
{
	wlog_image(id, initial, size, cut, out);
	pthread_mutex_lock(&g_log.lock);
	if (torn && cut < g_log.n && g_log.e[cut].dev == id && g_log.e[cut].kind == WL_SUBMIT && g_log.e[cut].data)
		memcpy(out + g_log.e[cut].off, g_log.e[cut].data, g_log.e[cut].len < 4096 ? g_log.e[cut].len : 4096);
	pthread_mutex_unlock(&g_log.lock);
}

static void v3_upgrade_cut(void)
{
	struct v3_img m;
	v3_load(&m);
	struct mem_bdev *d[4];
	for (int i = 0; i < 4; i++)
		d[i] = mem_new(i, v3_sizes[i], m.img[i]);
	char err[512];
	struct cache_set_cfg c3 = cfg;
	c3.name = "v3";
	struct bdev *legs[2] = { &d[1]->dev, &d[2]->dev };
	wlog_reset(&g_log);
	pthread_mutex_lock(&g_log.lock);
	g_log.on = true;
	pthread_mutex_unlock(&g_log.lock);
	struct cache_set *cs = cache_set_open_devs(&c3, legs, err, sizeof(err));
	REQUIRE(cs, "%s", err);
	pthread_mutex_lock(&g_log.lock);
	g_log.on = false;
	size_t n = g_log.n;
	pthread_mutex_unlock(&g_log.lock);
	for (int l = 1; l <= 2; l++)
		for (int k = 0; k < 2; k++) /* both copies: nothing left for an older tiercached to open by */
			REQUIRE(le32_get(((const struct cache_sb_disk *)(d[l]->data + k * 4096))->version) == CACHE_VERSION,
				"after the open, leg %d's superblock copy %d is still version %u", l - 1, k,
				le32_get(((const struct cache_sb_disk *)(d[l]->data + k * 4096))->version));
	cache_set_shutdown(cs);
	cache_set_close(cs);
	size_t tab_writes = 0;
	for (size_t i = 0; i < n; i++)
		if (g_log.e[i].kind == WL_SUBMIT && g_log.e[i].dev >= 1 && g_log.e[i].off == meta_btab_off(0) &&
		    g_log.e[i].len == CACHE_BTAB_BYTES)
			tab_writes++;
	REQUIRE(tab_writes == 2, "the upgrade wrote table copy 0 %zu times (want once per leg)", tab_writes);
	uint8_t *leg[2] = { malloc(LEG_SIZE), malloc(LEG_SIZE) };
	unsigned cuts = 0, as_v4 = 0;
	for (size_t cut = 0; cut <= n; cut++) {
		if (cut < n && g_log.e[cut].kind != WL_SUBMIT)
			continue;
		for (int torn = 0; torn < 2; torn++) {
			if (torn && (cut == n || !g_log.e[cut].data || g_log.e[cut].len <= 4096))
				continue;
			for (int l = 0; l < 2; l++)
				cut_image(1 + l, m.img[1 + l], LEG_SIZE, cut, torn, leg[l]);
			struct mem_bdev *e[4] = { mem_new(0, BACK_SIZE, m.img[0]), mem_borrow(1, LEG_SIZE, leg[0]),
						  mem_borrow(2, LEG_SIZE, leg[1]), mem_new(3, BACK_SIZE, m.img[3]) };
			char what[96];
			snprintf(what, sizeof(what), "upgrade cut at write %zu of %zu%s", cut, n, torn ? " (torn)" : "");
			as_v4 += newest_sb(leg[0]) && le32_get(newest_sb(leg[0])->version) == CACHE_VERSION;
			struct bdev *vol[3];
			v3_check(e, cut % 2, what, &cs, vol);
			v3_close(cs, vol); /* closes all four devices */
			cuts++;
		}
	}
	REQUIRE(as_v4 > 0 && as_v4 < cuts, "the cuts never fell on both sides of the upgrade (%u of %u as version 4)",
		as_v4, cuts);
	free(leg[0]);
	free(leg[1]);
	bdev_close(&d[0]->dev); /* the legs went with the set */
	bdev_close(&d[3]->dev);
	wlog_reset(&g_log);
	for (int i = 0; i < 4; i++)
		free(m.img[i]);
	printf("ok: the upgrade cut by a power failure at each of its writes, whole or torn (%u images, %u of them "
	       "already version %d): every one opens with both LUNs' data\n", cuts, as_v4, CACHE_VERSION);
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
	v3_upgrade();
	v3_upgrade_cut();
	img_dir = "v2-unclean";
	newer_version_refused();
	workers_stop();
	return 0;
}
