/*
 * test_cache_legfail.c - a leg dies mid-load: no error reaches the LUN.
 *
 * A write-back workload (writes, reads that verify against a model of the
 * LUN, flushes) runs on a set whose leg 1 is a fault-injecting RAM device
 * that fails every I/O after N operations. Asserts: 0 errors upward, every
 * read returns the latest acknowledged data, status says degraded with
 * leg 1 failed; after a restart on the same devices the set opens degraded
 * (the failure was recorded durably) and all data reads back; a replacement
 * leg is resynced online while I/O runs, after which the old survivor is
 * failed too and every block still reads back from the new leg alone.
 * Finally both legs are lost: clean blocks read from the backing store,
 * dirty ones fail with -EIO (MEDIUM ERROR), none returns stale data.
 * Then a write the resync cursor passes while it is still in flight (it
 * skipped the new leg, being above the cursor when sent, and lands on the
 * old leg only after the copier read that range) must reach the new leg.
 * Last, the write-intent page built when no leg is left (leg 0 never sent
 * one) completes instead of crashing.
 */
#include "cache/cache_int.h" /* intent_stats */
#include "cache/status.h"
#include "tests/unit/cache_test_util.h"

#define BACK_SIZE (8u << 20)
#define LEG_SIZE (16u << 20)

static uint8_t model[BACK_SIZE];
static uint64_t rs = 0x1234567;
static uint64_t rnd(void) { return tc_xorshift(&rs); }

static struct cache_set_cfg cfg = {
	.name = "lf",
	.nlegs = 2,
	.extent_size = 64u << 10,
	.mode = CACHE_WRITE_BACK,
	.admit_hits = 1,
	.dirty_target = 10,
};

static int errors_seen;

/* n rounds of 8 concurrent ops; reads verify against the model */
static void load(struct bdev *vol, int rounds, uint64_t *seq)
{
	uint8_t *bufs[8];
	for (int i = 0; i < 8; i++)
		bufs[i] = buf_get(32u << 10);
	for (int r = 0; r < rounds; r++) {
		struct tio t[8];
		uint64_t lba[8];
		uint32_t n[8];
		bool wr[8];
		int k = 0;
		_Atomic int out = 0;
		for (int i = 0; i < 8; i++) {
			uint32_t ns = 1 + (uint32_t)(rnd() % 64);
			uint64_t l = rnd() % (BACK_SIZE / 512 - ns);
			bool overlap = false;
			for (int j = 0; j < k; j++)
				if (l < lba[j] + n[j] && lba[j] < l + ns)
					overlap = true;
			if (overlap)
				continue;
			lba[k] = l;
			n[k] = ns;
			wr[k] = rnd() % 3 != 0;
			if (wr[k]) {
				stamp_fill(bufs[k], l, ns, (*seq)++);
				tio_submit(&t[k], vol, BDEV_WRITE, l * 512, bufs[k], ns * 512u, BDEV_F_FUA, &out, k);
			} else {
				tio_submit(&t[k], vol, BDEV_READ, l * 512, bufs[k], ns * 512u, 0, &out, k);
			}
			k++;
		}
		while (atomic_load(&out))
			usleep(20);
		for (int i = 0; i < k; i++) {
			if (t[i].err) {
				errors_seen++;
				fprintf(stderr, "I/O error upward: %d\n", t[i].err);
				continue;
			}
			if (wr[i])
				memcpy(model + lba[i] * 512, bufs[i], n[i] * 512u);
			else
				REQUIRE(!memcmp(model + lba[i] * 512, bufs[i], n[i] * 512u),
				      "read at lba %llu returned other data than was written",
				      (unsigned long long)lba[i]);
		}
	}
	for (int i = 0; i < 8; i++)
		buf_put(bufs[i], 32u << 10);
}

/* Wait (2 s at most) until leg is failed; st gets the last status seen. */
static void wait_leg_failed(struct cache_set *cs, int leg, struct cache_set_status *st)
{
	for (int i = 0; i < 20000; i++) {
		cache_set_status(cs, st);
		if (st->legs[leg].health == LEG_FAILED)
			return;
		usleep(100);
	}
}

static void verify_all(struct bdev *vol)
{
	uint8_t *buf = buf_get(64u << 10);
	for (uint64_t off = 0; off < BACK_SIZE; off += 64u << 10) {
		REQUIRE(tio_sync(vol, BDEV_READ, off, buf, 64u << 10, 0) == 0, "read");
		REQUIRE(!memcmp(buf, model + off, 64u << 10), "data differs at %llu", (unsigned long long)off);
	}
	buf_put(buf, 64u << 10);
}

struct resync_arg {
	struct bdev *vol;
	uint64_t *seq;
	_Atomic bool stop;
};

/*
 * A write sent above the resync cursor skips the new leg (the copier is to
 * bring it over). Leg 0 takes 5000 re-posts to land it, the copier passes
 * its range long before: without a catch-up the new leg keeps the old data,
 * and once leg 0 is gone the LUN reads it back.
 */
static void test_write_passed_by_resync(void)
{
	char err[512];
	struct cache_set_status st;
	struct mem_bdev *b = mem_new(10, BACK_SIZE, NULL);
	struct mem_bdev *l0 = mem_new(11, LEG_SIZE, NULL), *l1 = mem_new(12, LEG_SIZE, NULL);
	struct bdev *legs[2] = { &l0->dev, &l1->dev };
	struct cache_set *cs = cache_set_open_devs(&cfg, legs, err, sizeof(err));
	REQUIRE(cs, "open: %s", err);
	struct bdev *vol = cache_vol_open(cs, "lun0", &b->dev, NULL, CACHE_WRITE_BACK, err, sizeof(err));
	REQUIRE(vol, "attach: %s", err);
	uint8_t *old = buf_get(4096), *new = buf_get(4096), *got = buf_get(4096);
	memset(old, 0x0a, 4096);
	memset(new, 0x0b, 4096);
	REQUIRE(tio_sync(vol, BDEV_WRITE, 0, old, 4096, BDEV_F_FUA) == 0, "write old");
	REQUIRE(cache_set_fail_leg(cs, l1->name, "by the test", err, sizeof(err)) == 0, "fail leg 1: %s", err);
	wait_leg_failed(cs, 1, &st);
	struct mem_bdev *nl = mem_new(13, LEG_SIZE, NULL);
	/* an overwrite now sets the region's write-intent bit, so the late write
	 * below sends its data at once (no intent page write first) */
	REQUIRE(tio_sync(vol, BDEV_WRITE, 0, old, 4096, BDEV_F_FUA) == 0, "overwrite old");
	atomic_store(&l0->write_hops, 5000);
	atomic_store(&l0->write_hops_exact, true);
	REQUIRE(cache_set_leg_replace(cs, 1, &nl->dev, err, sizeof(err)) == 0, "replace: %s", err);
	struct tio w;
	tio_submit(&w, vol, BDEV_WRITE, 0, new, 4096, BDEV_F_FUA, NULL, 0);
	for (int i = 0; i < 200000 && !atomic_load(&w.done); i++)
		usleep(50);
	REQUIRE(atomic_load(&w.done) && w.err == 0, "the late write did not complete (%d)", w.err);
	atomic_store(&l0->write_hops, 0);
	atomic_store(&l0->write_hops_exact, false);
	int spins = 0;
	do {
		usleep(1000);
		cache_set_status(cs, &st);
	} while (st.legs[1].health == LEG_RESYNCING && ++spins < 20000);
	REQUIRE(st.legs[1].health == LEG_HEALTHY, "the resync did not finish");
	atomic_store(&l0->fail_after, 0);
	REQUIRE(tio_sync(vol, BDEV_READ, 0, got, 4096, 0) == 0, "read from the new leg alone");
	REQUIRE(!memcmp(got, new, 4096), "the new leg holds the data from before the late write (%#x)", got[0]);
	printf("ok: a write the resync cursor passed while it was in flight reached the new leg\n");
	buf_put(old, 4096);
	buf_put(new, 4096);
	buf_put(got, 4096);
	cache_set_shutdown(cs);
	bdev_close(vol);
	cache_set_close(cs);
}

/*
 * The last leg fails and the write-intent page has never been written to
 * leg 0 (failed first, before any write): the tick that clears the idle
 * region builds a page with no leg left to take it. That must complete as
 * if written (the bits clear) rather than touch a request never sent.
 */
static void test_intent_with_no_leg_left(void)
{
	char err[512];
	struct cache_set_status st;
	struct mem_bdev *b = mem_new(20, BACK_SIZE, NULL);
	struct mem_bdev *l0 = mem_new(21, LEG_SIZE, NULL), *l1 = mem_new(22, LEG_SIZE, NULL);
	struct bdev *legs[2] = { &l0->dev, &l1->dev };
	struct cache_set *cs = cache_set_open_devs(&cfg, legs, err, sizeof(err));
	REQUIRE(cs, "open: %s", err);
	struct bdev *vol = cache_vol_open(cs, "lun0", &b->dev, NULL, CACHE_WRITE_BACK, err, sizeof(err));
	REQUIRE(vol, "attach: %s", err);
	REQUIRE(cache_set_fail_leg(cs, l0->name, "by the test", err, sizeof(err)) == 0, "fail leg 0: %s", err);
	wait_leg_failed(cs, 0, &st);
	REQUIRE(st.legs[0].health == LEG_FAILED, "leg 0 did not fail");
	uint8_t *buf = buf_get(4096);
	memset(buf, 0x5c, 4096);
	REQUIRE(tio_sync(vol, BDEV_WRITE, 0, buf, 4096, BDEV_F_FUA) == 0, "write on leg 1 alone");
	/* an overwrite in place sets the region's write-intent bit */
	REQUIRE(tio_sync(vol, BDEV_WRITE, 0, buf, 4096, BDEV_F_FUA) == 0, "overwrite on leg 1 alone");
	uint64_t writes, parked;
	uint32_t regions;
	intent_stats(cs, &writes, &parked, &regions);
	REQUIRE(regions == 1 && writes > 0, "the write did not set its region's write-intent bit (%u)", regions);
	/* the next overwrite fails leg 1, the last one: its region's bit stays set */
	atomic_store(&l1->fail_after, atomic_load(&l1->ops));
	int r = tio_sync(vol, BDEV_WRITE, 0, buf, 4096, BDEV_F_FUA);
	wait_leg_failed(cs, 1, &st);
	REQUIRE(st.legs[1].health == LEG_FAILED, "leg 1 did not fail (the write returned %d)", r);
	intent_stats(cs, &writes, &parked, &regions);
	REQUIRE(regions == 1, "no write-intent bit left set when the last leg failed");
	/* the ticks forget the idle region: a page build with no leg left */
	for (int i = 0; i < 1000 && regions; i++) {
		usleep(10000);
		intent_stats(cs, &writes, &parked, &regions);
	}
	REQUIRE(regions == 0, "the write-intent bit never cleared with no leg left");
	printf("ok: the write-intent page with no leg left completes, its bits clear\n");
	buf_put(buf, 4096);
	cache_set_shutdown(cs);
	bdev_close(vol);
	cache_set_close(cs);
}

int main(void)
{
	char err[512];
	struct cache_set_status st;
	uint64_t seq = 1;
	REQUIRE(workers_start(getenv("TC_TEST_WORKERS") ? (unsigned)atoi(getenv("TC_TEST_WORKERS")) : 2) == 0, "workers");

	struct mem_bdev *b = mem_new(0, BACK_SIZE, NULL);
	struct mem_bdev *l0 = mem_new(1, LEG_SIZE, NULL), *l1 = mem_new(2, LEG_SIZE, NULL);
	struct bdev *legs[2] = { &l0->dev, &l1->dev };
	struct cache_set *cs = cache_set_open_devs(&cfg, legs, err, sizeof(err));
	REQUIRE(cs, "open: %s", err);
	struct bdev *vol = cache_vol_open(cs, "lun0", &b->dev, NULL, CACHE_WRITE_BACK, err, sizeof(err));
	REQUIRE(vol, "attach: %s", err);

	load(vol, 100, &seq);
	cache_set_status(cs, &st);
	REQUIRE(!st.degraded, "degraded before any fault");
	/* leg 1 dies after 150 more operations, in the middle of the load */
	atomic_store(&l1->fail_after, atomic_load(&l1->ops) + 150);
	load(vol, 300, &seq);
	REQUIRE(errors_seen == 0, "%d errors reached the LUN after a leg failure", errors_seen);
	REQUIRE(atomic_load(&l1->errors) > 0, "the fault was never injected");
	cache_set_status(cs, &st);
	REQUIRE(st.degraded && st.legs[1].health == LEG_FAILED && st.legs[0].health == LEG_HEALTHY,
	      "status does not say degraded with leg 1 failed");
	verify_all(vol);
	printf("ok: leg 1 failed after %ld ops, %ld I/O errors absorbed, 0 errors upward, degraded\n",
	       atomic_load(&l1->fail_after), atomic_load(&l1->errors));

	/* restart on the same devices: leg 1 must stay out (its data is stale) */
	cache_set_shutdown(cs);
	uint8_t *img[3] = { malloc(BACK_SIZE), malloc(LEG_SIZE), malloc(LEG_SIZE) };
	memcpy(img[0], b->data, BACK_SIZE);
	memcpy(img[1], l0->data, LEG_SIZE);
	memcpy(img[2], l1->data, LEG_SIZE);
	bdev_close(vol);
	cache_set_close(cs);
	b = mem_new(0, BACK_SIZE, img[0]);
	l0 = mem_new(1, LEG_SIZE, img[1]);
	l1 = mem_new(2, LEG_SIZE, img[2]);
	for (int i = 0; i < 3; i++)
		free(img[i]); /* mem_new copied them */
	legs[0] = &l0->dev;
	legs[1] = &l1->dev;
	cs = cache_set_open_devs(&cfg, legs, err, sizeof(err));
	REQUIRE(cs, "reopen: %s", err);
	vol = cache_vol_open(cs, "lun0", &b->dev, NULL, CACHE_WRITE_BACK, err, sizeof(err));
	REQUIRE(vol, "attach: %s", err);
	cache_set_status(cs, &st);
	REQUIRE(st.degraded && st.legs[1].health == LEG_FAILED, "restart forgot that leg 1 failed");
	verify_all(vol);
	printf("ok: restart keeps leg 1 out, all data reads back from leg 0\n");

	/* replace leg 1 and resync online under load */
	struct mem_bdev *nl = mem_new(3, LEG_SIZE, NULL);
	REQUIRE(cache_set_leg_replace(cs, 1, &nl->dev, err, sizeof(err)) == 0, "replace: %s", err);
	int spins = 0;
	do {
		load(vol, 10, &seq);
		cache_set_status(cs, &st);
		spins++;
	} while (st.legs[1].health == LEG_RESYNCING && spins < 10000);
	REQUIRE(st.legs[1].health == LEG_HEALTHY && !st.degraded, "resync did not finish (%d rounds)", spins);
	REQUIRE(errors_seen == 0, "errors during resync");
	printf("ok: resync finished after %d load rounds, set healthy\n", spins);
	load(vol, 50, &seq);
	/* now lose leg 0: the resynced leg alone must hold everything */
	atomic_store(&l0->fail_after, 0);
	verify_all(vol);
	load(vol, 50, &seq);
	REQUIRE(errors_seen == 0, "errors after failing the old leg");
	verify_all(vol);
	printf("ok: after failing leg 0, every block reads back from the resynced leg\n");

	/* both legs gone: dirty blocks fail with -EIO, nothing stale is ever returned */
	REQUIRE(cache_set_flush(cs, 30000) == 0, "flush did not finish");
	load(vol, 5, &seq); /* a few dirty blocks again */
	cache_set_status(cs, &st);
	uint64_t dirty = st.dirty_bytes;
	atomic_store(&nl->fail_after, 0);
	uint8_t *buf = buf_get(4096);
	long eio = 0, good = 0;
	for (uint64_t off = 0; off < BACK_SIZE; off += 4096) {
		int r = tio_sync(vol, BDEV_READ, off, buf, 4096, 0);
		REQUIRE(r == 0 || r == -EIO, "read failed with %d", r);
		if (r == -EIO) {
			eio++;
			continue;
		}
		REQUIRE(!memcmp(buf, model + off, 4096), "stale data at %llu after losing both legs",
		      (unsigned long long)off);
		good++;
	}
	cache_set_status(cs, &st);
	REQUIRE(dirty > 0 && eio > 0 && st.lost_ios > 0, "dirty data lost but no MEDIUM ERROR (%llu dirty bytes)",
	      (unsigned long long)dirty);
	REQUIRE(good > 0, "clean blocks were not read from the backing store");
	printf("ok: both legs lost: %ld blocks read correctly (clean or from backing), %ld failed with EIO, "
	       "none stale\n", good, eio);
	buf_put(buf, 4096);
	cache_set_shutdown(cs);
	bdev_close(vol);
	cache_set_close(cs);
	test_write_passed_by_resync();
	test_intent_with_no_leg_left();
	workers_stop();
	return 0;
}
