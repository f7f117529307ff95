/*
 * test_mirror_bg_reads.c - a host's read of the mirror does not queue
 * behind a destage's read at the drive.
 *
 * The cleaner reads what it destages from the legs (MIRROR_F_BG). Those
 * reads all go to one leg, the last in service, and while one is in
 * flight a host's read goes to another leg instead of taking its turn
 * round the legs. Checked by counting each leg's requests:
 *  - a background read goes to leg 1;
 *  - while it is in flight (its leg answers late), 10 host reads all go
 *    to leg 0 (round the legs would give leg 1 five of them);
 *  - once it is back, host reads go round both legs again;
 *  - with leg 1 failed, a background read goes to leg 0, and a host's
 *    read goes to leg 0 too (the only leg left), the steering never
 *    sending a read to a failed leg;
 *  - the count of background reads in flight returns to 0 each time.
 */
#include "cache/cache_int.h"
#include "tests/unit/cache_test_util.h"

#include <semaphore.h>

#define LEG_SIZE (4u << 20)
#define LEN 4096u
#define HOST_READS 10

static struct cache_set_cfg cfg = {
	.name = "bg", .nlegs = 2, .extent_size = 64u << 10, .mode = CACHE_WRITE_THROUGH,
	.admit_hits = 1, .dirty_target = 90,
};

struct rd {
	struct bdev_req req;
	struct iovec iov;
	uint8_t *buf;
	int err;
};

struct batch {
	struct mirror *m;
	struct rd bg;
	struct rd host[HOST_READS];
	bool with_bg;
	_Atomic int left;
	sem_t done;
};

static void rd_done(struct bdev_req *req, int err)
{
	struct batch *b = req->priv;
	struct rd *r = req == &b->bg.req ? &b->bg : (struct rd *)((char *)req - offsetof(struct rd, req));
	r->err = err;
	if (atomic_fetch_sub(&b->left, 1) == 1)
		sem_post(&b->done);
}

static void rd_init(struct batch *b, struct rd *r, uint64_t off, unsigned flags)
{
	r->buf = buf_get(LEN);
	r->iov = (struct iovec){ .iov_base = r->buf, .iov_len = LEN };
	r->req = (struct bdev_req){ .op = BDEV_READ, .flags = flags, .offset = off, .len = LEN, .iov = &r->iov,
				    .iovcnt = 1, .done = rd_done, .priv = b };
}

/* On a worker: the background read first (if any), then the host's, all in one go. */
static void batch_start(void *arg)
{
	struct batch *b = arg;
	if (b->with_bg)
		bdev_submit(&b->m->dev, &b->bg.req);
	for (int i = 0; i < HOST_READS; i++)
		bdev_submit(&b->m->dev, &b->host[i].req);
}

/* Run a batch; *ops[leg] gets the requests each leg received. */
static void run_batch(struct mirror *m, struct mem_bdev **legs, bool with_bg, long ops[2], int *errors)
{
	struct batch *b = calloc(1, sizeof(*b));
	b->m = m;
	b->with_bg = with_bg;
	sem_init(&b->done, 0, 0);
	rd_init(b, &b->bg, 1u << 20, MIRROR_F_BG);
	for (int i = 0; i < HOST_READS; i++)
		rd_init(b, &b->host[i], (uint64_t)(i + 1) * (64u << 10), 0);
	atomic_store(&b->left, HOST_READS + (with_bg ? 1 : 0));
	long before[2] = { atomic_load(&legs[0]->ops), atomic_load(&legs[1]->ops) };
	REQUIRE(worker_post(worker_get(1), batch_start, b) == 0, "post");
	while (sem_wait(&b->done) < 0)
		;
	for (int l = 0; l < 2; l++)
		ops[l] = atomic_load(&legs[l]->ops) - before[l];
	*errors = (with_bg && b->bg.err) ? 1 : 0;
	for (int i = 0; i < HOST_READS; i++)
		*errors += b->host[i].err != 0;
	buf_put(b->bg.buf, LEN);
	for (int i = 0; i < HOST_READS; i++)
		buf_put(b->host[i].buf, LEN);
	sem_destroy(&b->done);
	free(b);
}

int main(void)
{
	REQUIRE(workers_start(2) == 0, "workers");
	char err[512];
	struct mem_bdev *l[2];
	for (int i = 0; i < 2; i++)
		l[i] = mem_new(i, LEG_SIZE, NULL);
	struct bdev *legs[2] = { &l[0]->dev, &l[1]->dev };
	struct cache_set *cs = cache_set_open_devs(&cfg, legs, err, sizeof(err));
	REQUIRE(cs, "open: %s", err);
	struct mirror *m = &cs->mirror;
	long ops[2];
	int errors;

	/* no background read: round the legs */
	run_batch(m, l, false, ops, &errors);
	CHECK(!errors && ops[0] == HOST_READS / 2 && ops[1] == HOST_READS / 2,
	      "without a background read, host reads go round the legs (%ld / %ld)", ops[0], ops[1]);

	/* a background read in flight on leg 1 (its reads answer 200 posts late) */
	atomic_store(&l[1]->read_hops, 200);
	run_batch(m, l, true, ops, &errors);
	CHECK(!errors, "every read succeeded (%d errors)", errors);
	CHECK(ops[1] == 1, "the background read, and nothing else, went to leg 1 (%ld)", ops[1]);
	CHECK(ops[0] == HOST_READS, "every host read went to leg 0 while it was in flight (%ld of %d)", ops[0],
	      HOST_READS);
	CHECK(atomic_load(&m->bg_reads[0]) == 0 && atomic_load(&m->bg_reads[1]) == 0,
	      "no background read is counted in flight once it is back");
	atomic_store(&l[1]->read_hops, 0);

	run_batch(m, l, false, ops, &errors);
	CHECK(!errors && ops[0] == HOST_READS / 2 && ops[1] == HOST_READS / 2,
	      "once it is back, host reads go round both legs again (%ld / %ld)", ops[0], ops[1]);

	/* leg 1 out of service: everything from leg 0 */
	atomic_fetch_or(&m->failed, 2u);
	run_batch(m, l, true, ops, &errors);
	CHECK(!errors && ops[1] == 0 && ops[0] == HOST_READS + 1,
	      "with leg 1 failed, the background read and host reads all go to leg 0 (%ld / %ld, %d errors)", ops[0],
	      ops[1], errors);
	CHECK(atomic_load(&m->bg_reads[0]) == 0, "and it is not counted in flight once back");
	atomic_fetch_and(&m->failed, ~2u);

	cache_set_shutdown(cs);
	cache_set_close(cs);
	workers_stop();
	return check_failures ? 1 : 0;
}
