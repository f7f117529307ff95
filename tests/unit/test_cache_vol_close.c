/*
 * test_cache_vol_close.c - closing a cache volume waits for the background
 * work that still holds it: a fill its last read started, a destage.
 *
 * A reload that removes a cached LUN closes its volume once no command of
 * the LU is in flight; but a read miss may have started a fill (promotion)
 * that completes later, and the cleaner may be destaging one of its
 * extents, and both use the volume when they finish. Here the legs
 * complete writes late (so the fill is still writing them), the volume is
 * closed right after the read that started it, and the fill must find its
 * volume intact (the ASan build of this test sees a use after free
 * otherwise) and the set must shut down clean. The same for a destage:
 * a write-back volume with dirty data closed while the cleaner runs.
 *
 * Then status while volumes close: a reload closes a removed LUN's volume
 * while the daemon serves, and tierctl status, the metrics and the sizing
 * advisor read the set's volumes from threads outside RCU. One thread
 * reads cache_set_status and cache_set_advice in a loop while this one
 * opens and closes a volume 3000 times: the ASan build of this test sees a
 * use after free if a reader can still be looking into a closed volume
 * (5 runs of 5 did, the readers' lock taken out).
 */
#include "cache/cache_int.h"
#include "cache/status.h"
#include "common/log.h"
#include "tests/unit/cache_test_util.h"

#define BACK_SIZE (2u << 20)
#define LEG_SIZE (4u << 20)
#define LEN (64u << 10)

static void one_run(enum cache_mode mode, bool dirty)
{
	struct cache_set_cfg cfg = {
		.name = "close", .nlegs = 2, .extent_size = 64u << 10, .mode = mode,
		.admit_hits = 1, .dirty_target = 0,
	};
	char err[512];
	uint64_t sizes[3] = { BACK_SIZE, LEG_SIZE, LEG_SIZE };
	struct mem_bdev *d[3];
	for (int i = 0; i < 3; i++)
		d[i] = mem_new(i, sizes[i], NULL);
	struct bdev *legs[2] = { &d[1]->dev, &d[2]->dev };
	struct cache_set *cs = cache_set_open_devs(&cfg, legs, err, sizeof(err));
	REQUIRE(cs, "open: %s", err);
	struct bdev *vol = cache_vol_open(cs, "lun0", &d[0]->dev, NULL, mode, err, sizeof(err));
	REQUIRE(vol, "attach: %s", err);
	uint8_t *buf = buf_get(LEN);
	memset(buf, 0x5a, LEN);
	if (dirty) {
		for (uint64_t off = 0; off < 16 * LEN; off += LEN)
			REQUIRE(tio_sync(vol, BDEV_WRITE, off, buf, LEN, 0) == 0, "write");
		atomic_store(&d[0]->write_hops, 20000); /* destages reach the backing store late */
		atomic_store(&d[0]->write_hops_exact, true);
		cache_set_flush(cs, 1); /* sets the cleaner going at full rate; returns at the 1 ms timeout */
		bool destaging = false;
		for (int i = 0; i < 30000 && !destaging; i++) {
			for (uint32_t s = 0; s < cs->lay.nslots && !destaging; s++)
				destaging = atomic_load(&cs->slots[s].bits) & SB_DESTAGING;
			if (!destaging)
				usleep(1000);
		}
		CHECK(destaging, "a destage is in flight");
	} else {
		/* the fill's leg writes land late: milliseconds, so that they are
		 * still in flight however late this thread gets to the close */
		atomic_store(&d[1]->write_hops, 20000);
		atomic_store(&d[1]->write_hops_exact, true);
		atomic_store(&d[2]->write_hops, 20000);
		atomic_store(&d[2]->write_hops_exact, true);
		for (uint64_t off = 0; off < 8 * LEN; off += LEN)
			REQUIRE(tio_sync(vol, BDEV_READ, off, buf, LEN, 0) == 0, "read");
	}
	uint64_t before = atomic_load(&cs->bg_inflight);
	bdev_close(vol); /* at once: background work of the volume may be in flight */
	if (!dirty) {
		/* nothing else runs on this set: what is in flight is the volume's fills */
		CHECK(before > 0, "fills were in flight when the volume was closed (%llu)", (unsigned long long)before);
		CHECK(atomic_load(&cs->bg_inflight) == 0, "closing the volume waited for its fills (%llu left)",
		      (unsigned long long)atomic_load(&cs->bg_inflight));
	}
	cache_set_shutdown(cs);
	cache_set_close(cs);
	printf("ok: %s: closed with %s in flight, no use of the freed volume (ASan build)\n",
	       cache_mode_name(mode), dirty ? "destages" : "fills");
	buf_put(buf, LEN);
}

static atomic_bool readers_stop;
static atomic_ulong reads_done;

static void *status_reader(void *arg)
{
	struct cache_set *cs = arg;
	static struct cache_set_status st;
	static struct advisor_report r;
	static char names[ADVISOR_MAX_LUNS][65];
	uint32_t ext;
	while (!atomic_load(&readers_stop)) {
		cache_set_status(cs, &st);
		cache_set_advice(cs, &r, names, &ext, false);
		atomic_fetch_add(&reads_done, 1);
	}
	return NULL;
}

static void status_while_closing(void)
{
	struct cache_set_cfg cfg = {
		.name = "close", .nlegs = 2, .extent_size = 64u << 10, .mode = CACHE_WRITE_THROUGH,
		.admit_hits = 1,
	};
	char err[512];
	struct mem_bdev *d[2] = { mem_new(1, LEG_SIZE, NULL), mem_new(2, LEG_SIZE, NULL) };
	struct bdev *legs[2] = { &d[0]->dev, &d[1]->dev };
	struct cache_set *cs = cache_set_open_devs(&cfg, legs, err, sizeof(err));
	REQUIRE(cs, "open: %s", err);
	uint8_t *back = calloc(1, BACK_SIZE);
	REQUIRE(back, "memory");
	pthread_t th;
	REQUIRE(pthread_create(&th, NULL, status_reader, cs) == 0, "reader thread");
	log_set_level(LOG_LVL_WARN); /* not 3000 "attached" lines */
	for (int i = 0; i < 3000; i++) {
		/* the volume closes its backing store: a new one each time, over one buffer */
		struct mem_bdev *b = mem_borrow(0, BACK_SIZE, back);
		struct bdev *vol = cache_vol_open(cs, "lun0", &b->dev, NULL, CACHE_WRITE_THROUGH, err, sizeof(err));
		REQUIRE(vol, "attach %d: %s", i, err);
		bdev_close(vol);
	}
	log_set_level(LOG_LVL_INFO);
	atomic_store(&readers_stop, true);
	pthread_join(th, NULL);
	CHECK(atomic_load(&reads_done) > 0, "status was read while 3000 volumes opened and closed (%lu reads)",
	      (unsigned long)atomic_load(&reads_done));
	cache_set_shutdown(cs);
	cache_set_close(cs);
	free(back);
	printf("ok: status and the advisor read volumes while they closed, none after it was freed (ASan build)\n");
}

int main(void)
{
	REQUIRE(workers_start(2) == 0, "workers");
	one_run(CACHE_WRITE_THROUGH, false);
	one_run(CACHE_WRITE_BACK, true);
	status_while_closing();
	workers_stop();
	return check_failures ? 1 : 0;
}
