/*
 * test_cache_submit_nomem.c - a cache volume or the mirror that finds no
 * memory for a request's context takes it again later, and never calls
 * done() from inside its submit.
 *
 * bdev.h promises that done() runs later, never inside bdev_submit:
 * callers submit while holding their own state. vol_submit and
 * mirror_submit used to answer -ENOMEM from inside submit when their
 * per-thread pool was empty and malloc failed: a nested completion, and a
 * failed I/O the host sees as a medium error. Here the first malloc of a
 * submit fails (the test links with --wrap=malloc) on a worker that has
 * not run I/O before, so its pools are empty and the request context is
 * the allocation refused:
 *  - done() is not called while submit runs;
 *  - the request completes later, without an error;
 *  - a write so retried reads back, and a mirror read returns the leg's bytes.
 * And a leg guard (leg_timeout) that finds no memory for a request to its
 * leg takes it again later too, and the request comes back naming the
 * guard: it used to be passed straight to the leg and came back naming
 * the leg's own device, and the mirror ignores an error from a device
 * that is not its leg's (a replaced leg's late answer), so the leg that
 * failed a write stayed in service without it.
 * And a leg that fails a write while no memory is to be had: the mirror
 * holds the write until the failure is in the surviving leg's superblock,
 * and asking for that superblock write used to take three mallocs (the
 * set's, the job's, the post's), any of which, refused, dropped the ask:
 * the write, and every write after it, waited for good. Here every malloc
 * on the worker that sees the failure is refused from the moment the
 * write is submitted until it completes, which it must, with the failure
 * recorded on the surviving leg.
 * And write-back writes on a worker where every malloc is refused (once
 * its pools are warm) go on past many journal rings' worth: the journal
 * asks for a checkpoint when a ring is half full, and that ask was a
 * malloc'd post; refused, it was lost with the "wanted" mark left set, so
 * nobody asked again, and writes stalled once the ring was full.
 */
#include "cache/cache_int.h"
#include "tests/unit/cache_test_util.h"

#include <semaphore.h>
#include <time.h>

void *__real_malloc(size_t size);
void *__wrap_malloc(size_t size);

static __thread int fail_mallocs;  /* the next N mallocs on this thread fail */
static __thread bool in_submit;
static atomic_int failed_mallocs;

void *__wrap_malloc(size_t size)
{
	if (fail_mallocs > 0) {
		fail_mallocs--;
		atomic_fetch_add(&failed_mallocs, 1);
		return NULL;
	}
	return __real_malloc(size);
}

#define BACK_SIZE (2u << 20)
#define LEG_SIZE (4u << 20)
#define LEN 4096u

static struct cache_set_cfg cfg = {
	.name = "nomem", .nlegs = 2, .extent_size = 64u << 10, .mode = CACHE_WRITE_THROUGH,
	.admit_hits = 1, .dirty_target = 90,
};

struct job {
	struct bdev *dev;
	struct bdev_req req;
	struct iovec iov;
	int fails;              /* mallocs to refuse inside the submit */
	int late_fails;         /* and after it, until done() */
	int err;
	bool nested;            /* done() ran inside submit */
	sem_t done;
};

static struct bdev *last_dev; /* the dev the last job's request came back with */

static void job_done(struct bdev_req *req, int err)
{
	struct job *j = req->priv;
	last_dev = req->dev;
	fail_mallocs = 0;
	j->err = err;
	j->nested = in_submit;
	sem_post(&j->done);
}

static void job_start(void *arg)
{
	struct job *j = arg;
	fail_mallocs = j->fails;
	in_submit = true;
	bdev_submit(j->dev, &j->req);
	in_submit = false;
	fail_mallocs = j->late_fails; /* job_done ends it */
}

/* The job's result, or -ETIMEDOUT when it has not come back in 30 s (it never will). */
static int run_late(unsigned worker, struct bdev *dev, enum bdev_op op, uint64_t off, void *buf, int fails,
		    int late_fails, bool *nested)
{
	static struct job j; /* a job that never comes back stays valid */
	j = (struct job){ .dev = dev, .fails = fails, .late_fails = late_fails };
	sem_init(&j.done, 0, 0);
	j.iov = (struct iovec){ .iov_base = buf, .iov_len = LEN };
	j.req = (struct bdev_req){ .op = op, .offset = off, .len = LEN, .iov = &j.iov, .iovcnt = 1,
				   .done = job_done, .priv = &j };
	REQUIRE(worker_post(worker_get(worker), job_start, &j) == 0, "post");
	struct timespec until;
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 30;
	while (sem_timedwait(&j.done, &until) < 0)
		if (errno == ETIMEDOUT)
			return -ETIMEDOUT;
	sem_destroy(&j.done);
	*nested = j.nested;
	return j.err;
}

static int run_on(unsigned worker, struct bdev *dev, enum bdev_op op, uint64_t off, void *buf, int fails,
		  bool *nested)
{
	return run_late(worker, dev, op, off, buf, fails, 0, nested);
}

/* The failed-leg mask in leg's newest valid superblock; -1 when none is valid. */
static long sb_failed_mask(const struct mem_bdev *leg)
{
	const struct cache_sb_disk *best = NULL;
	for (int k = 0; k < 2; k++) {
		const struct cache_sb_disk *sb = (const void *)(leg->data + k * 4096);
		const char *why;
		if (meta_sb_check(sb, &why) == 0 && (!best || le64_get(sb->gen) > le64_get(best->gen)))
			best = sb;
	}
	return best ? (long)le32_get(best->failed_mask) : -1;
}

int main(void)
{
	REQUIRE(workers_start(4) == 0, "workers"); /* the set's own I/O runs on worker 0 */
	char err[512];
	struct mem_bdev *d[3];
	uint64_t sizes[3] = { BACK_SIZE, LEG_SIZE, LEG_SIZE };
	for (int i = 0; i < 3; i++)
		d[i] = mem_new(i, sizes[i], NULL);
	struct bdev *legs[2] = { &d[1]->dev, &d[2]->dev };
	struct cache_set *cs = cache_set_open_devs(&cfg, legs, err, sizeof(err));
	REQUIRE(cs, "open: %s", err);
	struct bdev *vol = cache_vol_open(cs, "lun0", &d[0]->dev, NULL, CACHE_WRITE_THROUGH, err, sizeof(err));
	REQUIRE(vol, "attach: %s", err);

	uint8_t *w = buf_get(LEN), *r = buf_get(LEN);
	bool nested;
	for (unsigned i = 0; i < LEN; i++)
		w[i] = (uint8_t)(i * 7 + 1);

	/* the volume, on worker 3: its request context is the first allocation */
	int before = atomic_load(&failed_mallocs);
	int e = run_on(3, vol, BDEV_WRITE, 64u << 10, w, 1, &nested);
	CHECK(atomic_load(&failed_mallocs) == before + 1, "volume: the allocation was refused");
	CHECK(!nested, "volume: done() did not run inside submit");
	CHECK(e == 0, "volume: the write completed later without an error (err %d)", e);
	memset(r, 0, LEN);
	e = run_on(3, vol, BDEV_READ, 64u << 10, r, 0, &nested);
	CHECK(e == 0 && !memcmp(r, w, LEN), "volume: the retried write reads back");

	/* the mirror itself, on worker 2, which has run nothing yet */
	before = atomic_load(&failed_mallocs);
	memset(r, 0, LEN);
	e = run_on(2, &cs->mirror.dev, BDEV_READ, 0, r, 1, &nested);
	CHECK(atomic_load(&failed_mallocs) == before + 1, "mirror: the allocation was refused");
	CHECK(!nested, "mirror: done() did not run inside submit");
	CHECK(e == 0 && !memcmp(r, d[1]->data, LEN), "mirror: the read completed later with the leg's bytes (err %d)",
	      e);

	buf_put(r, LEN);
	r = NULL;
	cache_set_shutdown(cs); /* waits for the fill the read started */
	bdev_close(vol);
	cache_set_close(cs);

	/*
	 * A leg guard (leg_timeout), on worker 3, whose guard context pool is
	 * empty (the first set has no guards): the context is the first
	 * allocation. The request must come back later, naming the guard.
	 */
	struct cache_set_cfg gcfg = cfg;
	gcfg.name = "guarded";
	gcfg.leg_timeout_ms = 30000;
	struct mem_bdev *g[2];
	for (int i = 0; i < 2; i++)
		g[i] = mem_new(10 + i, LEG_SIZE, NULL);
	struct bdev *glegs[2] = { &g[0]->dev, &g[1]->dev };
	struct cache_set *gs = cache_set_open_devs(&gcfg, glegs, err, sizeof(err));
	REQUIRE(gs, "open guarded: %s", err);
	before = atomic_load(&failed_mallocs);
	last_dev = NULL;
	e = run_on(3, gs->legs[1], BDEV_WRITE, 1u << 20, w, 1, &nested);
	CHECK(atomic_load(&failed_mallocs) == before + 1, "guard: the allocation was refused");
	CHECK(!nested, "guard: done() did not run inside submit");
	CHECK(e == 0 && !memcmp(g[1]->data + (1u << 20), w, LEN), "guard: the write landed, later (err %d)", e);
	CHECK(last_dev == gs->legs[1], "guard: it came back naming the guard, as the mirror checks (%s)",
	      last_dev == &g[1]->dev ? "the leg's own device: an error would be ignored" : "?");
	cache_set_shutdown(gs);
	cache_set_close(gs);

	/*
	 * A leg fails a mirror write on worker 3 while every malloc there is
	 * refused: the write must still complete, once the failure is in the
	 * surviving leg's superblock.
	 */
	struct cache_set_cfg pcfg = cfg;
	pcfg.name = "persist";
	struct mem_bdev *p[2];
	for (int i = 0; i < 2; i++)
		p[i] = mem_new(20 + i, LEG_SIZE, NULL);
	struct bdev *plegs[2] = { &p[0]->dev, &p[1]->dev };
	struct cache_set *ps = cache_set_open_devs(&pcfg, plegs, err, sizeof(err));
	REQUIRE(ps, "open persist: %s", err);
	CHECK(sb_failed_mask(p[0]) == 0, "persist: no leg is marked failed at first");
	atomic_store(&p[1]->fail_after, 0);
	before = atomic_load(&failed_mallocs);
	e = run_late(3, &ps->mirror.dev, BDEV_WRITE, 1u << 20, w, 0, 1000000, &nested);
	REQUIRE(e != -ETIMEDOUT, "persist: the write never completed: the ask to record the leg's failure was "
		"lost (%d mallocs refused)", atomic_load(&failed_mallocs) - before);
	CHECK(e == 0 && !memcmp(p[0]->data + (1u << 20), w, LEN), "persist: the write landed on the good leg (err %d)",
	      e);
	CHECK(atomic_load(&ps->mirror.failed) == 2u, "persist: leg 1 is failed (mask %u)",
	      atomic_load(&ps->mirror.failed));
	CHECK(sb_failed_mask(p[0]) == 2, "persist: the surviving leg's superblock records it (mask %ld)",
	      sb_failed_mask(p[0]));
	cache_set_shutdown(ps);
	cache_set_close(ps);

	/*
	 * The same, but the last leg fails too, on the very superblock write
	 * that records the first failure: no leg takes it, and the write the
	 * mirror holds for it must still be let go (every leg is gone: nothing
	 * is left to wait for).
	 */
	struct mem_bdev *q[2];
	for (int i = 0; i < 2; i++)
		q[i] = mem_new(40 + i, LEG_SIZE, NULL);
	struct bdev *qlegs[2] = { &q[0]->dev, &q[1]->dev };
	pcfg.name = "lastleg";
	struct cache_set *qs = cache_set_open_devs(&pcfg, qlegs, err, sizeof(err));
	REQUIRE(qs, "open lastleg: %s", err);
	atomic_store(&q[0]->fail_after, atomic_load(&q[0]->ops) + 1); /* the write, then nothing */
	atomic_store(&q[1]->fail_after, 0);
	e = run_late(3, &qs->mirror.dev, BDEV_WRITE, 1u << 20, w, 0, 0, &nested);
	REQUIRE(e != -ETIMEDOUT, "lastleg: the write held for the failure record never completed, though no leg "
		"was left to record it on");
	CHECK(mirror_all_failed(&qs->mirror), "lastleg: both legs failed (mask %u)", atomic_load(&qs->mirror.failed));
	CHECK(e == 0 || e == -EIO, "lastleg: the held write completed (err %d)", e);
	cache_set_shutdown(qs);
	cache_set_close(qs);

	/* write-back writes on worker 3 with every malloc there refused, past many checkpoints */
	struct cache_set_cfg kcfg = cfg;
	kcfg.name = "ckpt";
	kcfg.mode = CACHE_WRITE_BACK;
	struct mem_bdev *k[3];
	for (int i = 0; i < 3; i++)
		k[i] = mem_new(30 + i, sizes[i], NULL);
	struct bdev *klegs[2] = { &k[1]->dev, &k[2]->dev };
	struct cache_set *ks = cache_set_open_devs(&kcfg, klegs, err, sizeof(err));
	REQUIRE(ks, "open ckpt: %s", err);
	struct bdev *kvol = cache_vol_open(ks, "lun0", &k[0]->dev, NULL, CACHE_WRITE_BACK, err, sizeof(err));
	REQUIRE(kvol, "attach ckpt: %s", err);
	const int warm = 64, nw = 2000;
	int bad = 0;
	uint64_t seq0 = 0;
	before = 0;
	for (int i = 0; i < warm + nw && !bad; i++) {
		if (i == warm) {
			seq0 = ks->ck.seq;
			before = atomic_load(&failed_mallocs);
		}
		uint64_t off = (uint64_t)(i % 32) * (64u << 10) + (uint64_t)(i / 32 % 16) * LEN;
		w[0] = (uint8_t)i;
		int refuse = i < warm ? 0 : 1000000;
		e = run_late(3, kvol, BDEV_WRITE, off, w, refuse, refuse, &nested);
		REQUIRE(e != -ETIMEDOUT, "ckpt: write %d never completed (%d mallocs refused, checkpoint seq %llu -> %llu)",
			i, atomic_load(&failed_mallocs) - before, (unsigned long long)seq0,
			(unsigned long long)ks->ck.seq);
		if (e)
			bad++;
	}
	CHECK(!bad, "ckpt: every write completed without an error");
	CHECK(ks->ck.seq > seq0, "ckpt: checkpoints ran meanwhile (seq %llu -> %llu)", (unsigned long long)seq0,
	      (unsigned long long)ks->ck.seq);
	printf("ckpt: %d mallocs refused on the writing worker over %d writes\n",
	       atomic_load(&failed_mallocs) - before, nw);
	buf_put(w, LEN);
	test_set_close(ks, kvol);
	workers_stop();
	return check_failures ? 1 : 0;
}
