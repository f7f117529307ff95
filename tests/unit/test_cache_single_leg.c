/*
 * test_cache_single_leg.c - a leg left out while the set ran on the other
 * one alone (allow_single_leg) is stale, and must never be read when it is
 * listed again: it is rebuilt first.
 *
 * A mirrored write-back set writes A to block 0 and stops cleanly. It is
 * opened again on leg 0 alone (allow_single_leg = yes), B overwrites block
 * 0 (dirty, acknowledged), and it stops cleanly again. Then both legs are
 * listed: block 0 must read B every time (reads alternate legs), and with
 * leg 0 failed afterwards, still B (leg 1 must have been rebuilt, not
 * trusted). The same again with leg 1 as the one that ran alone.
 */
#include "cache/cache_int.h"
#include "cache_test_util.h"

#define BACK_SIZE (1u << 20)
#define LEG_SIZE (8u << 20)
#define BLK 4096u

static struct cache_set_cfg cfg = {
	.name = "single", .nlegs = 2, .extent_size = 64u << 10, .mode = CACHE_WRITE_BACK,
	.admit_hits = 1, .dirty_target = 90, .allow_single_leg = true,
};

static uint64_t seq_of(const uint8_t *b)
{
	uint64_t s = 0;
	int k = stamp_check(b, 0, &s);
	return k == 1 ? s : k == 0 ? 0 : UINT64_MAX;
}

static void run(int alone)
{
	char err[512];
	uint8_t *img[3];
	uint64_t sizes[3] = { BACK_SIZE, LEG_SIZE, LEG_SIZE };
	for (int i = 0; i < 3; i++)
		img[i] = calloc(1, sizes[i]);
	struct mem_bdev *d[3];
	uint8_t *buf = buf_get(BLK);

	/* 1. both legs: A */
	for (int i = 0; i < 3; i++)
		d[i] = mem_borrow(i, sizes[i], img[i]);
	struct bdev *legs[2] = { &d[1]->dev, &d[2]->dev };
	cfg.nlegs = 2;
	struct cache_set *cs = cache_set_open_devs(&cfg, legs, err, sizeof(err));
	REQUIRE(cs, "open: %s", err);
	struct bdev *vol = cache_vol_open(cs, "lun0", &d[0]->dev, NULL, CACHE_WRITE_BACK, err, sizeof(err));
	REQUIRE(vol, "attach: %s", err);
	stamp_fill(buf, 0, BLK / 512, 11);
	REQUIRE(tio_sync(vol, BDEV_WRITE, 0, buf, BLK, BDEV_F_FUA) == 0, "write A");
	cache_set_shutdown(cs);
	bdev_close(vol);
	cache_set_close(cs);

	/* 2. leg `alone` only: B */
	for (int i = 0; i < 3; i++)
		d[i] = mem_borrow(i, sizes[i], img[i]);
	struct bdev *one[1] = { &d[1 + alone]->dev };
	cfg.nlegs = 1;
	cs = cache_set_open_devs(&cfg, one, err, sizeof(err));
	REQUIRE(cs, "open on leg %d alone: %s", alone, err);
	vol = cache_vol_open(cs, "lun0", &d[0]->dev, NULL, CACHE_WRITE_BACK, err, sizeof(err));
	REQUIRE(vol, "attach: %s", err);
	stamp_fill(buf, 0, BLK / 512, 12);
	REQUIRE(tio_sync(vol, BDEV_WRITE, 0, buf, BLK, BDEV_F_FUA) == 0, "write B");
	cache_set_shutdown(cs);
	bdev_close(vol);
	cache_set_close(cs);
	bdev_close(&d[2 - alone]->dev); /* not listed */

	/* 3. both legs again */
	for (int i = 0; i < 3; i++)
		d[i] = mem_borrow(i, sizes[i], img[i]);
	struct bdev *both[2] = { &d[1]->dev, &d[2]->dev };
	cfg.nlegs = 2;
	cs = cache_set_open_devs(&cfg, both, err, sizeof(err));
	REQUIRE(cs, "open with both legs again: %s", err);
	vol = cache_vol_open(cs, "lun0", &d[0]->dev, NULL, CACHE_WRITE_BACK, err, sizeof(err));
	REQUIRE(vol, "attach: %s", err);
	for (int i = 0; i < 20000 && atomic_load(&cs->mirror.resyncing); i++)
		usleep(500);
	for (int i = 0; i < 6; i++) {
		REQUIRE(tio_sync(vol, BDEV_READ, 0, buf, BLK, 0) == 0, "read");
		REQUIRE(seq_of(buf) == 12, "leg %d ran alone; read %d of block 0 holds seq %llu, want B (12)", alone,
			i, (unsigned long long)seq_of(buf));
	}
	/* the leg that ran alone dies: the other must hold B (rebuilt), or be out of service */
	atomic_store(&d[1 + alone]->fail_after, 0);
	int r = tio_sync(vol, BDEV_READ, 0, buf, BLK, 0);
	REQUIRE(r == 0 ? seq_of(buf) == 12 : true, "leg %d ran alone and then failed: block 0 reads seq %llu from "
		"the other leg, want B (12) or an error", alone, (unsigned long long)seq_of(buf));
	cache_set_shutdown(cs);
	bdev_close(vol);
	cache_set_close(cs);
	buf_put(buf, BLK);
	for (int i = 0; i < 3; i++)
		free(img[i]);
	printf("ok: leg %d ran alone; with both listed again block 0 reads B every time, %s\n", alone,
	       r == 0 ? "and from the other leg too (rebuilt)" : "and the other leg is out of service");
}

int main(void)
{
	REQUIRE(workers_start(2) == 0, "workers");
	run(0);
	run(1);
	workers_stop();
	return 0;
}
