/*
 * test_cache_dlog.c - the block log under pressure: a full ring waits for
 * a checkpoint and goes on, overwrites of one extent take turns, nothing
 * is lost or mixed up.
 *
 * A write-back set on RAM legs of 4 MiB (each block log ring holds 34
 * pages: two 64 KiB records), a volume under the torn-write guard, 1 MiB
 * of dirty 4 KiB blocks. Then rounds of 32 overwrites of 32 KiB at once,
 * two in each extent (so they take turns on it), all of dirty data: about
 * 16 records of 9 pages in flight over two rings, far more than fit, so
 * records wait for room until a checkpoint frees it. Checks: every round
 * completes (within a bound: a record left waiting for room would hang
 * it), every overwrite went through the log, some waited for room, every
 * block reads its last write, and again after a clean stop and a reopen.
 *
 * Then overlapping overwrites: rounds of two writes of the same 32 KiB at
 * once, in each of 16 extents. Recovery takes a later journal record on a
 * block to mean an earlier logged write there had completed, which holds
 * only if two logged writes of one extent are never in flight together;
 * the leg-0 write log must show, per slot, each block log record followed
 * by its in-place write's completion before the next record is sent. And
 * each range reads whole, from one of its two writes.
 * (Cuts during all this are test_cache_powercut's job.)
 */
#include "cache/cache_int.h"
#include "cache/status.h"
#include "tests/unit/cache_test_util.h"

#define BACK_SIZE (2u << 20)
#define LEG_SIZE (4u << 20)
#define AREA (1u << 20)       /* the dirty part of the LUN */
#define WSIZE (32u << 10)     /* each overwrite */
#define NW (AREA / WSIZE)     /* writes per round: two per 64 KiB extent */
#define ROUNDS 20

static struct cache_set_cfg cfg = {
	.name = "dlog", .nlegs = 2, .extent_size = 64u << 10, .mode = CACHE_WRITE_BACK,
	.admit_hits = 1, .dirty_target = 90,
};

static struct cache_set *open_set(struct mem_bdev **d, struct bdev **vol, uint8_t *const img[3])
{
	char err[512];
	uint64_t sizes[3] = { BACK_SIZE, LEG_SIZE, LEG_SIZE };
	for (int i = 0; i < 3; i++)
		d[i] = mem_borrow(i, sizes[i], img[i]); /* the devices outlive the set */
	struct bdev *legs[2] = { &d[1]->dev, &d[2]->dev };
	struct cache_set *cs = cache_set_open_devs(&cfg, legs, err, sizeof(err));
	REQUIRE(cs, "open: %s", err);
	*vol = cache_vol_open(cs, "lun0", &d[0]->dev, NULL, CACHE_WRITE_BACK, err, sizeof(err));
	REQUIRE(*vol, "attach: %s", err);
	REQUIRE(cache_vol_guard_torn(*vol, true), "no block log on a new set");
	REQUIRE(cs->lay.dlog_pages == 34, "ring of %u pages (the test is sized for 34)", cs->lay.dlog_pages);
	return cs;
}

static void check_all(struct bdev *vol, uint64_t seq, const char *when)
{
	uint8_t *buf = buf_get(AREA);
	REQUIRE(tio_sync(vol, BDEV_READ, 0, buf, AREA, 0) == 0, "%s: read", when);
	for (uint64_t s = 0; s < AREA / 512; s++) {
		uint64_t got = 0;
		int k = stamp_check(buf + s * 512, s, &got);
		REQUIRE(k == 1 && got == seq, "%s: lba %llu holds %s seq %llu, want seq %llu", when,
			(unsigned long long)s, k == 1 ? "stamp" : k == 0 ? "zeroes" : "garbage",
			(unsigned long long)got, (unsigned long long)seq);
	}
	buf_put(buf, AREA);
	printf("ok: %s: all %u sectors hold their last write (seq %llu)\n", when, AREA / 512,
	       (unsigned long long)seq);
}

int main(void)
{
	REQUIRE(workers_start(2) == 0, "workers");
	struct mem_bdev *d[3];
	struct bdev *vol;
	uint8_t *img[3];
	uint64_t sizes[3] = { BACK_SIZE, LEG_SIZE, LEG_SIZE };
	for (int i = 0; i < 3; i++)
		img[i] = calloc(1, sizes[i]);
	struct cache_set *cs = open_set(d, &vol, img);
	for (int i = 0; i < 3; i++)
		atomic_store(&d[i]->write_hops, 4); /* slow writes: more of them in flight */

	uint8_t *buf = buf_get(AREA);
	stamp_fill(buf, 0, AREA / 512, 1);
	REQUIRE(tio_sync(vol, BDEV_WRITE, 0, buf, AREA, BDEV_F_FUA) == 0, "first write");
	struct cache_set_status st;
	cache_set_status(cs, &st);
	uint64_t logged0 = st.block_log_writes;

	uint8_t *wb[NW];
	struct tio t[NW];
	for (unsigned i = 0; i < NW; i++)
		wb[i] = buf_get(WSIZE);
	uint64_t seq = 1;
	for (int r = 0; r < ROUNDS; r++) {
		seq++;
		_Atomic int out = 0;
		for (unsigned i = 0; i < NW; i++) {
			stamp_fill(wb[i], (uint64_t)i * WSIZE / 512, WSIZE / 512, seq);
			tio_submit(&t[i], vol, BDEV_WRITE, (uint64_t)i * WSIZE, wb[i], WSIZE, BDEV_F_FUA, &out, (int)i);
		}
		for (int k = 0; atomic_load(&out); k++) {
			REQUIRE(k < 60000, "round %d: %d overwrites still in flight after 60 s", r, atomic_load(&out));
			usleep(1000);
		}
		for (unsigned i = 0; i < NW; i++)
			REQUIRE(t[i].err == 0, "round %d write %u: %d", r, i, t[i].err);
	}
	cache_set_status(cs, &st);
	uint64_t logged = st.block_log_writes - logged0;
	printf("block log: %llu records for %u overwrites of dirty data, %llu waited for room\n",
	       (unsigned long long)logged, ROUNDS * NW, (unsigned long long)st.block_log_waits);
	REQUIRE(logged == (uint64_t)ROUNDS * NW, "%llu of %u overwrites of dirty data went through the log",
		(unsigned long long)logged, ROUNDS * NW);
	REQUIRE(st.block_log_waits > 0, "no record waited for room: the test did not fill a ring");
	printf("ok: %d rounds of %u concurrent 32 KiB overwrites completed, the ring filled and drained\n", ROUNDS,
	       NW);
	check_all(vol, seq, "live");

	cache_set_shutdown(cs);
	bdev_close(vol);
	cache_set_close(cs);

	cs = open_set(d, &vol, img);
	check_all(vol, seq, "after a clean stop and a reopen");

	/* overlapping overwrites, logged */
	uint64_t dlog_lo = cs->lay.dlog_off, dlog_hi = cs->lay.dlog_off + (uint64_t)CACHE_DLOG_RINGS * cs->lay.dlog_pages * CACHE_PAGE;
	uint64_t data_off = cs->lay.data_off, ext = cs->lay.extent_size;
	for (int i = 0; i < 3; i++)
		atomic_store(&d[i]->write_hops, 4);
	pthread_mutex_lock(&g_log.lock);
	g_log.on = true;
	pthread_mutex_unlock(&g_log.lock);
	for (int r = 0; r < 5; r++) {
		_Atomic int out = 0;
		for (unsigned i = 0; i < NW; i++) {
			/* writes 2k and 2k+1 both cover the first half of extent k */
			uint64_t off = (uint64_t)(i / 2) * ext;
			stamp_fill(wb[i], off / 512, WSIZE / 512, 1000 + (uint64_t)r * NW + i);
			tio_submit(&t[i], vol, BDEV_WRITE, off, wb[i], WSIZE, BDEV_F_FUA, &out, (int)i);
		}
		for (int k = 0; atomic_load(&out); k++) {
			REQUIRE(k < 60000, "overlap round %d: %d writes still in flight after 60 s", r, atomic_load(&out));
			usleep(1000);
		}
		for (unsigned i = 0; i < NW; i++)
			REQUIRE(t[i].err == 0, "overlap round %d write %u: %d", r, i, t[i].err);
		uint8_t *rb = buf_get(WSIZE);
		for (unsigned k = 0; k < NW / 2; k++) {
			REQUIRE(tio_sync(vol, BDEV_READ, (uint64_t)k * ext, rb, WSIZE, 0) == 0, "read");
			uint64_t a = 1000 + (uint64_t)r * NW + 2 * k, b = a + 1, s0 = 0;
			REQUIRE(stamp_check(rb, k * ext / 512, &s0) == 1 && (s0 == a || s0 == b),
				"overlap round %d extent %u holds seq %llu (want %llu or %llu)", r, k,
				(unsigned long long)s0, (unsigned long long)a, (unsigned long long)b);
			for (uint64_t q = 1; q < WSIZE / 512; q++) {
				uint64_t sq = 0;
				REQUIRE(stamp_check(rb + q * 512, k * ext / 512 + q, &sq) == 1 && sq == s0,
					"overlap round %d extent %u: sector %llu holds seq %llu, sector 0 seq %llu", r, k,
					(unsigned long long)q, (unsigned long long)sq, (unsigned long long)s0);
			}
		}
		buf_put(rb, WSIZE);
	}
	pthread_mutex_lock(&g_log.lock);
	g_log.on = false;
	/* per slot on leg 0: record sent, then its in-place write done, before the next record */
	enum { IDLE, LOGGED, IN_PLACE } state[64] = { IDLE };
	size_t inplace[64];
	unsigned records = 0, violations = 0;
	for (size_t i = 0; i < g_log.n; i++) {
		struct wlog_ent *x = &g_log.e[i];
		if (x->kind == WL_DONE) {
			struct wlog_ent *sub = &g_log.e[x->ref];
			if (sub->dev != 1 || sub->off < data_off)
				continue;
			uint64_t sl = (sub->off - data_off) / ext;
			if (sl < 64 && state[sl] == IN_PLACE && inplace[sl] == x->ref)
				state[sl] = IDLE;
			continue;
		}
		if (x->dev != 1 || x->flush || !x->data)
			continue;
		if (x->off >= dlog_lo && x->off < dlog_hi) {
			const struct cache_dlog_disk *h = (const void *)x->data;
			uint32_t sl = le32_get(h->slot);
			REQUIRE(sl < 64, "a record for slot %u", sl);
			records++;
			if (state[sl] != IDLE && violations++ < 3)
				fprintf(stderr, "slot %u: a block log record sent at log entry %zu while the previous "
					"logged write there had not completed in place\n", sl, i);
			state[sl] = LOGGED;
		} else if (x->off >= data_off) {
			uint64_t sl = (x->off - data_off) / ext;
			if (sl < 64 && state[sl] == LOGGED) {
				state[sl] = IN_PLACE;
				inplace[sl] = i;
			}
		}
	}
	pthread_mutex_unlock(&g_log.lock);
	REQUIRE(records >= 5 * NW, "only %u block log records for %u overlapping overwrites", records, 5 * NW);
	REQUIRE(!violations, "%u block log records were sent while another logged write of the extent was in flight",
		violations);
	printf("ok: %u overlapping overwrites: %u records, each extent's logged writes one at a time, every range "
	       "whole\n", 5 * NW, records);
	cache_set_shutdown(cs);
	bdev_close(vol);
	cache_set_close(cs);
	for (int i = 0; i < 3; i++)
		free(img[i]);

	for (unsigned i = 0; i < NW; i++)
		buf_put(wb[i], WSIZE);
	buf_put(buf, AREA);
	workers_stop();
	printf("ok: the block log holds under pressure\n");
	return 0;
}
