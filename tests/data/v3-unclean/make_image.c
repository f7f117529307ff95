/*
 * make_image.c - how the committed version 3 images were made (kept for
 * the record; it builds only against the last release that wrote version 3
 * sets, commit 1b9c82c, as tests/unit/NAME.c there).
 *
 * The workload of v1-unclean/make_image.c (a write-back set on RAM
 * devices: lun0's 64 blocks of 4 KiB written with FUA, seq 1..64,
 * acknowledged, dirty; then block 0 overwritten with seq 100 and the
 * images taken as a power cut right after that overwrite reached leg 0
 * and before it reached leg 1), with a second LUN attached first, so the
 * superblock's table holds two entries whose backing ids matter: lun1
 * (backing id 0) has 16 dirty blocks, seq 1001..1016; lun0 is backing id
 * 1. Writes leg0.img.gz, leg1.img.gz, backing.img.gz (lun0) and
 * backing1.img.gz (lun1) in the current folder.
 */
#include "cache_test_util.h"

#define BACK_SIZE (1u << 20)
#define LEG_SIZE (8u << 20)
#define BLK 4096u

static struct cache_set_cfg cfg = {
	.name = "v3", .nlegs = 2, .extent_size = 64u << 10, .mode = CACHE_WRITE_BACK,
	.admit_hits = 1, .dirty_target = 90,
};

static void dump(const char *name, const uint8_t *img, uint64_t size)
{
	char cmd[256];
	snprintf(cmd, sizeof(cmd), "gzip -9 -n > %s", name);
	FILE *f = popen(cmd, "w");
	REQUIRE(f && fwrite(img, 1, size, f) == size && pclose(f) == 0, "write %s", name);
}

int main(void)
{
	char err[512];
	REQUIRE(workers_start(2) == 0, "workers");
	struct mem_bdev *d[4] = { mem_new(0, BACK_SIZE, NULL), mem_new(1, LEG_SIZE, NULL), mem_new(2, LEG_SIZE, NULL),
				  mem_new(3, BACK_SIZE, NULL) };
	struct bdev *legs[2] = { &d[1]->dev, &d[2]->dev };
	struct cache_set *cs = cache_set_open_devs(&cfg, legs, err, sizeof(err));
	REQUIRE(cs, "%s", err);
	struct bdev *vol1 = cache_vol_open(cs, "lun1", &d[3]->dev, NULL, CACHE_WRITE_BACK, err, sizeof(err));
	REQUIRE(vol1, "%s", err);
	struct bdev *vol = cache_vol_open(cs, "lun0", &d[0]->dev, NULL, CACHE_WRITE_BACK, err, sizeof(err));
	REQUIRE(vol, "%s", err);
	uint8_t *init[4];
	uint64_t sizes[4] = { BACK_SIZE, LEG_SIZE, LEG_SIZE, BACK_SIZE };
	for (int i = 0; i < 4; i++) {
		init[i] = malloc(sizes[i]);
		memcpy(init[i], d[i]->data, sizes[i]);
	}
	pthread_mutex_lock(&g_log.lock);
	g_log.on = true;
	pthread_mutex_unlock(&g_log.lock);
	uint8_t *buf = buf_get(BLK);
	for (uint64_t b = 0; b < 16; b++) {
		stamp_fill(buf, b * 8, 8, 1001 + b);
		REQUIRE(tio_sync(vol1, BDEV_WRITE, b * BLK, buf, BLK, BDEV_F_FUA) == 0, "write lun1");
	}
	for (uint64_t b = 0; b < 64; b++) {
		stamp_fill(buf, b * 8, 8, b + 1);
		REQUIRE(tio_sync(vol, BDEV_WRITE, b * BLK, buf, BLK, BDEV_F_FUA) == 0, "write");
	}
	size_t mark = wlog_len();
	stamp_fill(buf, 0, 8, 100);
	REQUIRE(tio_sync(vol, BDEV_WRITE, 0, buf, BLK, BDEV_F_FUA) == 0, "overwrite");
	/* the cut: after the overwrite's leg-0 write (the block log's copy
	 * and the in-place write both count: the first that holds seq 100
	 * for block 0 on leg 0) */
	size_t cut = SIZE_MAX;
	pthread_mutex_lock(&g_log.lock);
	for (size_t i = mark; i < g_log.n && cut == SIZE_MAX; i++) {
		uint64_t s;
		if (g_log.e[i].dev == 1 && g_log.e[i].data && stamp_check(g_log.e[i].data, 0, &s) == 1 && s == 100)
			cut = i + 1;
	}
	REQUIRE(cut != SIZE_MAX, "no leg-0 write of the overwrite");
	for (int dv = 0; dv < 4; dv++) {
		for (size_t i = 0; i < cut; i++)
			if (g_log.e[i].dev == dv && g_log.e[i].data)
				memcpy(init[dv] + g_log.e[i].off, g_log.e[i].data, g_log.e[i].len);
	}
	pthread_mutex_unlock(&g_log.lock);
	dump("backing.img.gz", init[0], BACK_SIZE);
	dump("leg0.img.gz", init[1], LEG_SIZE);
	dump("leg1.img.gz", init[2], LEG_SIZE);
	dump("backing1.img.gz", init[3], BACK_SIZE);
	printf("images written: cut at log entry %zu\n", cut);
	_exit(0); /* no shutdown: the set stays unclean */
}
