/*
 * test_cache_wb_trips.c - a write-back write acknowledged after one round
 * trip (record and data together) or with no record (an overwrite of dirty
 * blocks) never leans on a record that is not durable yet.
 *
 * The legs' journal area is made slow (its writes land and complete only
 * after many re-posts), so whatever waits for a record is acknowledged
 * late and whatever does not is acknowledged at once. At the first
 * acknowledgement the devices are copied as they are then: a power cut at
 * that moment. A set recovered from the copy must read the acknowledged
 * write (or the other one in flight), the same with either leg.
 *
 *  1. X written and destaged (valid, clean). W overwrites X alone: its
 *     record goes with its data, and it is acknowledged only once both are
 *     durable (without a record, X stays clean on disk and the cut reads
 *     its old data).
 *  2. X destaged again. A and B overwrite X together:
 *     A's record (over valid blocks, so sent with its data) makes X dirty
 *     in RAM at once; B, seeing X dirty, must still wait for a durable
 *     record, since A's is not. (Taking "dirty in RAM" for "dirty on disk"
 *     acknowledged B with X recorded clean: the cut read X's old data.)
 *  3. With A and B durable, C overwrites X alone: no record is needed, C
 *     is acknowledged while the journal is still slow, and the cut reads C.
 *
 * Both must have taken the paths they test: status counts one-trip writes
 * and writes with no record.
 */
#include "cache/cache_int.h"
#include "cache/status.h"
#include "tests/unit/cache_test_util.h"

#define BACK_SIZE (1u << 20)
#define LEG_SIZE (8u << 20)
#define X_LBA 8u
#define X_SECT 8u
#define SLOW 3000

enum { DEV_BACK = 0, DEV_LEG0 = 1, DEV_LEG1 = 2, NDEV = 3 };
static const uint64_t sizes[NDEV] = { BACK_SIZE, LEG_SIZE, LEG_SIZE };

static struct cache_set_cfg cfg = {
	.name = "trips",
	.nlegs = 2,
	.extent_size = 64u << 10,
	.mode = CACHE_WRITE_BACK,
	.admit_hits = 1,
	.dirty_target = 90,
};

static struct cache_set *open_set(struct mem_bdev **d, struct bdev **vol, uint8_t *const img[NDEV])
{
	char err[512];
	for (int i = 0; i < NDEV; i++)
		d[i] = mem_new(i, sizes[i], img ? img[i] : NULL);
	struct bdev *legs[2] = { &d[DEV_LEG0]->dev, &d[DEV_LEG1]->dev };
	struct cache_set *cs = cache_set_open_devs(&cfg, legs, err, sizeof(err));
	REQUIRE(cs, "open: %s", err);
	*vol = cache_vol_open(cs, "lun0", &d[DEV_BACK]->dev, NULL, CACHE_WRITE_BACK, err, sizeof(err));
	REQUIRE(*vol, "attach: %s", err);
	return cs;
}

/* the power cut: the devices as they are at the first acknowledgement */
static struct mem_bdev *live[NDEV];
static uint8_t *cut_img[NDEV];
static _Atomic bool cut_taken;
static _Atomic int cut_by; /* the seq of the write whose acknowledgement took it */

struct wio {
	struct tio t;
	uint64_t seq;
};

static void wio_done(struct bdev_req *req, int err)
{
	struct wio *w = caa_container_of(req->priv, struct wio, t);
	if (!err && !atomic_exchange(&cut_taken, true)) {
		for (int i = 0; i < NDEV; i++)
			memcpy(cut_img[i], live[i]->data, sizes[i]);
		atomic_store(&cut_by, (int)w->seq);
	}
	tio_done(req, err);
}

/* a FUA write of X stamped seq, on worker 0; its acknowledgement may take the cut */
static void write_x(struct wio *w, struct bdev *vol, uint8_t *buf, uint64_t seq)
{
	memset(w, 0, sizeof(*w));
	w->seq = seq;
	stamp_fill(buf, X_LBA, X_SECT, seq);
	w->t.iov = (struct iovec){ .iov_base = buf, .iov_len = X_SECT * 512 };
	w->t.req = (struct bdev_req){ .op = BDEV_WRITE, .flags = BDEV_F_FUA, .offset = X_LBA * 512,
				      .len = X_SECT * 512, .iov = &w->t.iov, .iovcnt = 1, .done = wio_done,
				      .priv = &w->t };
	w->t.req.dev = vol;
	worker_post(worker_get(0), tio_start, &w->t);
}

static void wait_done(struct wio *w)
{
	while (!atomic_load(&w->t.done))
		usleep(50);
	REQUIRE(w->t.err == 0, "write %llu failed: %d", (unsigned long long)w->seq, w->t.err);
}

static void slow_journal(struct cache_set *cs, int hops)
{
	for (int i = DEV_LEG0; i <= DEV_LEG1; i++) {
		atomic_store(&live[i]->slow_lo, cs->lay.journal_off);
		atomic_store(&live[i]->slow_hi, cs->lay.journal_off + (uint64_t)CACHE_NJOURNALS * cs->lay.jblocks * CACHE_PAGE);
		atomic_store(&live[i]->slow_hops, hops);
	}
}

/* X's seq in every sector (0: zeroes, -1: garbage or a mix of writes) */
static long read_x(struct bdev *vol)
{
	uint8_t buf[X_SECT * 512];
	REQUIRE(tio_sync(vol, BDEV_READ, X_LBA * 512, buf, sizeof(buf), 0) == 0, "read X");
	long seq = -2;
	for (uint32_t i = 0; i < X_SECT; i++) {
		uint64_t s = 0;
		int r = stamp_check(buf + i * 512, X_LBA + i, &s);
		long v = r == 1 ? (long)s : r == 0 ? 0 : -1;
		if (seq == -2)
			seq = v;
		else if (seq != v)
			return -1;
	}
	return seq;
}

/* Recover from the cut: X reads one of the allowed writes, the same twice and with leg 0 out. */
static int check_cut(const char *what, uint64_t lo, uint64_t hi)
{
	struct mem_bdev *d[NDEV];
	struct bdev *vol;
	struct cache_set *cs = open_set(d, &vol, cut_img);
	long a = read_x(vol), b = read_x(vol);
	char err[256];
	REQUIRE(cache_set_fail_leg(cs, d[DEV_LEG0]->name, "test: the other leg alone", err, sizeof(err)) == 0,
		"fail leg 0: %s", err);
	long c = read_x(vol);
	test_set_close(cs, vol);
	int bad = 0;
	if (a < (long)lo || a > (long)hi || b != a || c != a) {
		fprintf(stderr, "FAIL %s: the cut at write %d's acknowledgement reads X as %ld, %ld, then %ld with "
				"leg 1 alone; want one write of %llu..%llu, every time\n",
			what, atomic_load(&cut_by), a, b, c, (unsigned long long)lo, (unsigned long long)hi);
		bad = 1;
	} else {
		printf("ok %s: cut at write %d's acknowledgement, X reads write %ld (leg 1 alone too)\n", what,
		       atomic_load(&cut_by), a);
	}
	return bad;
}

int main(void)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	REQUIRE(workers_start(2) == 0, "workers");
	for (int i = 0; i < NDEV; i++)
		cut_img[i] = malloc(sizes[i]);
	struct bdev *vol;
	struct cache_set *cs = open_set(live, &vol, NULL);
	uint8_t *buf[3];
	for (int i = 0; i < 3; i++)
		buf[i] = buf_get(X_SECT * 512);
	int bad = 0;

	/* X valid and clean: written, then destaged */
	struct wio w1;
	write_x(&w1, vol, buf[0], 1);
	wait_done(&w1);
	REQUIRE(cache_set_flush(cs, 20000) == 0, "flush");
	struct cache_set_status st0;
	cache_set_status(cs, &st0);
	REQUIRE(st0.dirty_bytes == 0 && read_x(vol) == 1, "X is not cached clean");

	/* 1. W alone over clean X, the journal slow */
	slow_journal(cs, SLOW);
	atomic_store(&cut_taken, false);
	struct wio ww;
	write_x(&ww, vol, buf[1], 2);
	wait_done(&ww);
	struct cache_set_status st1;
	cache_set_status(cs, &st1);
	bad += check_cut("W alone over clean X", 2, 2);
	REQUIRE(st1.write_one_trip - st0.write_one_trip == 1, "W over clean X did not send its record with its data");

	/* 2. A and B together over clean X */
	slow_journal(cs, 0);
	REQUIRE(cache_set_flush(cs, 20000) == 0, "flush");
	slow_journal(cs, SLOW);
	atomic_store(&cut_taken, false);
	struct wio wa, wb;
	write_x(&wa, vol, buf[1], 3);
	write_x(&wb, vol, buf[2], 4);
	wait_done(&wa);
	wait_done(&wb);
	struct cache_set_status st2;
	cache_set_status(cs, &st2);
	bad += check_cut("A and B over clean X", 3, 4);
	REQUIRE(st2.write_one_trip - st1.write_one_trip >= 1, "neither A nor B sent its record with its data");

	/* 3. C alone over dirty X: no record, acknowledged with the journal still slow */
	atomic_store(&cut_taken, false);
	struct wio wc;
	write_x(&wc, vol, buf[0], 5);
	wait_done(&wc);
	struct cache_set_status st3;
	cache_set_status(cs, &st3);
	bad += check_cut("C alone over dirty X", 5, 5);
	REQUIRE(st3.write_no_record - st2.write_no_record == 1, "C over dirty X wrote a record (%llu without)",
		(unsigned long long)(st3.write_no_record - st2.write_no_record));

	slow_journal(cs, 0);
	for (int i = 0; i < 3; i++)
		buf_put(buf[i], X_SECT * 512);
	test_set_close(cs, vol);
	for (int i = 0; i < NDEV; i++)
		free(cut_img[i]);
	workers_stop();
	REQUIRE(bad == 0, "%d cut(s) lost an acknowledged write", bad);
	printf("ok: no write-back acknowledgement leaned on a record that was not durable\n");
	return 0;
}
