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
#include "tests/unit/cache_test_util.h"

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

static const uint64_t sizes[3] = { BACK_SIZE, LEG_SIZE, LEG_SIZE };

/* open the set on the legs listed (1, 2: indices into img), devices over img */
static struct cache_set *open_on(uint8_t *img[3], const int *listed, int n, struct mem_bdev *d[3],
				 struct bdev **vol)
{
	char err[512];
	for (int i = 0; i < 3; i++)
		d[i] = mem_borrow(i, sizes[i], img[i]);
	struct bdev *legs[2];
	for (int k = 0; k < n; k++)
		legs[k] = &d[listed[k]]->dev;
	cfg.nlegs = n;
	struct cache_set *cs = cache_set_open_devs(&cfg, legs, err, sizeof(err));
	REQUIRE(cs, "open on %d leg(s), the first mem%d: %s", n, listed[0], err);
	*vol = cache_vol_open(cs, "lun0", &d[0]->dev, NULL, CACHE_WRITE_BACK, err, sizeof(err));
	REQUIRE(*vol, "attach: %s", err);
	return cs;
}

static void write_block0(struct bdev *vol, uint8_t *buf, uint64_t seq)
{
	stamp_fill(buf, 0, BLK / 512, seq);
	REQUIRE(tio_sync(vol, BDEV_WRITE, 0, buf, BLK, BDEV_F_FUA) == 0, "write seq %llu", (unsigned long long)seq);
}

static void run(int alone)
{
	uint8_t *img[3];
	for (int i = 0; i < 3; i++)
		img[i] = calloc(1, sizes[i]);
	struct mem_bdev *d[3];
	struct bdev *vol;
	uint8_t *buf = buf_get(BLK);
	const int both[2] = { 1, 2 }, one[1] = { 1 + alone };

	/* 1. both legs: A */
	struct cache_set *cs = open_on(img, both, 2, d, &vol);
	write_block0(vol, buf, 11);
	test_set_close(cs, vol);

	/* 2. leg `alone` only: B */
	cs = open_on(img, one, 1, d, &vol);
	write_block0(vol, buf, 12);
	test_set_close(cs, vol);
	bdev_close(&d[2 - alone]->dev); /* not listed */

	/* 3. both legs again */
	cs = open_on(img, both, 2, d, &vol);
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
	test_set_close(cs, vol);
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
