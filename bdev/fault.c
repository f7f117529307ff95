/*
 * fault.c - a leg that fails on command, for tests through the daemon.
 *
 * Wraps another bdev and, when told (`tierctl leg fault`, accepted only by
 * a set configured with fault_injection = yes), fails the way dying NVMe
 * drives do: every I/O with -EIO (the kernel's EIO), or reads of one range
 * only with -ENODATA (latent sector errors, the kernel's medium error: a
 * write over a bad sector heals it, as a drive remaps on write; or, stuck,
 * it does not), or no answer at all (requests are held until the fault
 * is cleared or the device closed, then fail with -EIO). It counts the
 * reads and writes it passed on, so a test can tell which leg served what.
 *
 * It can also be slow in a known way instead of failing (BDEV_FAULT_DELAY):
 * one request at a time, in arrival order, each held a fixed time before
 * it goes to the inner device, and the next one starts when it completes:
 * a single server with a fixed service time, whose queueing under random
 * arrivals has a textbook answer (M/D/1) that tierbench's open-loop mode
 * is checked against (tests/test_tierbench_rate.sh).
 *
 * Never in production: the key exists so the daemon's own failure paths can
 * be tested under load on a host without device-mapper or a VM.
 *
 * Threading: submit on a worker thread like any bdev (errors complete later
 * on the same worker, through worker_post); bdev_fault_set from any thread.
 */
#include "bdev/fault.h"

#include <errno.h>
#include <liburing.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

struct fault_bdev {
	struct bdev dev;
	struct bdev *inner;
	_Atomic int mode;
	_Atomic uint64_t bad_off, bad_len;
	_Atomic uint64_t *bad;   /* a bit per 512-byte sector of the range: still bad */
	uint64_t bad_words;
	_Atomic uint64_t reads, writes, errors, held_reads, held_writes;
	pthread_mutex_t lock;    /* held list, delay queue */
	struct held {
		struct held *next;
		struct bdev_req *req;
		struct worker *w;
	} *held;
	_Atomic uint64_t delay_ns;
	bool serving;            /* BDEV_FAULT_DELAY: a request is in service */
	struct delayed *dq_head, *dq_tail; /* waiting for the server, oldest first */
};

/* A request going through the BDEV_FAULT_DELAY server. */
struct delayed {
	struct io_op op;                    /* the service time's timeout */
	struct __kernel_timespec ts;
	struct fault_bdev *f;
	struct bdev_req *req;
	struct worker *w;                   /* the submitter's: inner I/O and done run there */
	struct worker_call call;
	void (*done)(struct bdev_req *req, int err);
	void *priv;
	struct delayed *next;
};

struct fault_done {
	struct bdev_req *req;
	int err;
};

static void fault_complete(void *arg)
{
	struct fault_done *d = arg;
	struct bdev_req *req = d->req;
	int err = d->err;
	free(d);
	req->done(req, err);
}

/* Complete req with err later on worker w (never inside submit). */
static void fault_fail_on(struct worker *w, struct bdev_req *req, int err)
{
	struct fault_done *d = malloc(sizeof(*d));
	if (!d) {
		req->done(req, err); /* no memory: a nested call beats a lost I/O */
		return;
	}
	d->req = req;
	d->err = err;
	if (worker_post(w, fault_complete, d) < 0) {
		free(d);
		req->done(req, err);
	}
}

static void delay_start(struct delayed *d);

/* The inner device answered the request in service: hand the server to the
 * next one first (its service time starts now), then answer this one. */
static void delay_inner_done(struct bdev_req *req, int err)
{
	struct delayed *d = req->priv;
	struct fault_bdev *f = d->f;
	req->done = d->done;
	req->priv = d->priv;
	free(d);
	pthread_mutex_lock(&f->lock);
	struct delayed *next = f->dq_head;
	if (next) {
		f->dq_head = next->next;
		if (!f->dq_head)
			f->dq_tail = NULL;
	} else {
		f->serving = false;
	}
	pthread_mutex_unlock(&f->lock);
	if (next)
		delay_start(next);
	req->done(req, err);
}

/* On the submitter's worker once the service time is over. */
static void delay_pass(void *arg)
{
	struct delayed *d = arg;
	struct bdev_req *req = d->req;
	if (req->op == BDEV_READ)
		atomic_fetch_add(&d->f->reads, 1);
	else if (req->op == BDEV_WRITE)
		atomic_fetch_add(&d->f->writes, 1);
	req->done = delay_inner_done;
	req->priv = d;
	bdev_submit(d->f->inner, req);
}

static void delay_fired(struct io_op *op, int res)
{
	(void)res; /* -ETIME: the time is up */
	struct delayed *d = (struct delayed *)op;
	if (d->w == worker_self())
		delay_pass(d);
	else
		worker_post_call(d->w, &d->call, delay_pass, d);
}

/* Put d in service: its fixed time runs in this worker's ring. */
static void delay_start(struct delayed *d)
{
	uint64_t ns = atomic_load(&d->f->delay_ns);
	d->ts.tv_sec = (long long)(ns / 1000000000u);
	d->ts.tv_nsec = (long long)(ns % 1000000000u);
	d->op.done = delay_fired;
	struct io_uring_sqe *sqe = worker_sqe();
	io_uring_prep_timeout(sqe, &d->ts, 0, 0);
	io_uring_sqe_set_data(sqe, &d->op);
}

static void delay_submit(struct fault_bdev *f, struct bdev_req *req)
{
	struct delayed *d = calloc(1, sizeof(*d));
	if (!d) {
		fault_fail_on(worker_self(), req, -EIO);
		return;
	}
	d->f = f;
	d->req = req;
	d->w = worker_self();
	d->done = req->done;
	d->priv = req->priv;
	pthread_mutex_lock(&f->lock);
	bool start = !f->serving;
	if (start) {
		f->serving = true;
	} else {
		if (f->dq_tail)
			f->dq_tail->next = d;
		else
			f->dq_head = d;
		f->dq_tail = d;
	}
	pthread_mutex_unlock(&f->lock);
	if (start)
		delay_start(d);
}

static void fault_submit(struct bdev *dev, struct bdev_req *req)
{
	struct fault_bdev *f = (struct fault_bdev *)dev;
	int mode = atomic_load(&f->mode);
	bool rw = req->op == BDEV_READ || req->op == BDEV_WRITE;
	if (mode == BDEV_FAULT_DELAY) {
		delay_submit(f, req);
		return;
	}
	if (mode == BDEV_FAULT_EIO) {
		atomic_fetch_add(&f->errors, 1);
		fault_fail_on(worker_self(), req, -EIO);
		return;
	}
	if (mode == BDEV_FAULT_HANG) {
		struct held *h = malloc(sizeof(*h));
		if (!h) {
			fault_fail_on(worker_self(), req, -EIO);
			return;
		}
		h->req = req;
		h->w = worker_self();
		if (req->op == BDEV_READ)
			atomic_fetch_add(&f->held_reads, 1);
		else
			atomic_fetch_add(&f->held_writes, 1);
		pthread_mutex_lock(&f->lock);
		h->next = f->held;
		f->held = h;
		pthread_mutex_unlock(&f->lock);
		return;
	}
	if (bdev_fault_has_range(mode) && rw) {
		uint64_t lo = atomic_load(&f->bad_off), len = atomic_load(&f->bad_len);
		uint64_t a = req->offset > lo ? req->offset : lo;
		uint64_t b = req->offset + req->len < lo + len ? req->offset + req->len : lo + len;
		bool bad = false;
		for (uint64_t o = a; o < b; o += 512) {
			uint64_t k = (o - lo) / 512;
			uint64_t bit = 1ull << (k % 64);
			if (req->op == BDEV_READ) {
				if (atomic_load(&f->bad[k / 64]) & bit) {
					bad = true;
					break;
				}
			} else if (mode == BDEV_FAULT_RANGE) {
				atomic_fetch_and(&f->bad[k / 64], ~bit); /* rewritten: remapped */
			}
		}
		if (bad) {
			/* the kernel's answer to an unrecovered read error (BLK_STS_MEDIUM) */
			atomic_fetch_add(&f->errors, 1);
			fault_fail_on(worker_self(), req, -ENODATA);
			return;
		}
	}
	if (req->op == BDEV_READ)
		atomic_fetch_add(&f->reads, 1);
	else if (req->op == BDEV_WRITE)
		atomic_fetch_add(&f->writes, 1);
	bdev_submit(f->inner, req);
}

/* now: complete on this thread (the device closes, the workers may be gone) */
static void release_held(struct fault_bdev *f, bool now)
{
	pthread_mutex_lock(&f->lock);
	struct held *h = f->held;
	f->held = NULL;
	pthread_mutex_unlock(&f->lock);
	while (h) {
		struct held *n = h->next;
		atomic_fetch_add(&f->errors, 1);
		if (!now)
			fault_fail_on(h->w, h->req, -EIO);
		else if (h->req->flags & BDEV_F_ABANDONED)
			h->req->done(h->req, -EIO); /* frees the submitter's leftover context */
		/* else nobody waits any more (the set is closing): drop it */
		free(h);
		h = n;
	}
}

/* A request held here is never passed on (it fails when released, touching
 * none of its buffers); any other is the inner device's */
static enum bdev_abandon fault_abandon(struct bdev *dev, struct bdev_req *req)
{
	struct fault_bdev *f = (struct fault_bdev *)dev;
	bool held = false;
	pthread_mutex_lock(&f->lock);
	for (struct held *h = f->held; h && !held; h = h->next)
		held = h->req == req;
	pthread_mutex_unlock(&f->lock);
	return held ? BDEV_ABANDON_UNTOUCHED : bdev_abandon(f->inner, req);
}

static void fault_close(struct bdev *dev)
{
	struct fault_bdev *f = (struct fault_bdev *)dev;
	/* the workers may have stopped: complete what was given up on here,
	 * drop the rest (nothing waits for it once the set closes) */
	release_held(f, true);
	bdev_close(f->inner);
	free(f->bad);
	pthread_mutex_destroy(&f->lock);
	free(f);
}

static int64_t fault_lba_status(struct bdev *dev, uint64_t offset, bool *mapped)
{
	struct fault_bdev *f = (struct fault_bdev *)dev;
	return bdev_lba_status(f->inner, offset, mapped);
}

static int fault_space(struct bdev *dev, struct bdev_space *out)
{
	return bdev_space(((struct fault_bdev *)dev)->inner, out);
}

static const struct bdev_ops fault_ops = {
	.submit = fault_submit,
	.close = fault_close,
	.abandon = fault_abandon,
	.lba_status = fault_lba_status,
	.space = fault_space,
};

struct bdev *bdev_fault_wrap(struct bdev *inner)
{
	struct fault_bdev *f = calloc(1, sizeof(*f));
	if (!f)
		return NULL;
	f->inner = inner;
	pthread_mutex_init(&f->lock, NULL);
	f->dev.ops = &fault_ops;
	bdev_like(&f->dev, inner);
	return &f->dev;
}

bool bdev_is_fault(const struct bdev *dev)
{
	return dev && dev->ops == &fault_ops;
}

int bdev_fault_set(struct bdev *dev, enum bdev_fault mode, uint64_t off, uint64_t len)
{
	if (!bdev_is_fault(dev))
		return -ENOTSUP;
	struct fault_bdev *f = (struct fault_bdev *)dev;
	if (bdev_fault_has_range(mode)) {
		if (len > (64u << 20) || off % 512 || len % 512)
			return -EINVAL;
		uint64_t words = (len / 512 + 63) / 64;
		if (words > f->bad_words) {
			if (bdev_fault_has_range(atomic_load(&f->mode)))
				atomic_store(&f->mode, BDEV_FAULT_NONE); /* no reader of the old map from here on */
			_Atomic uint64_t *nb = calloc(words, sizeof(*nb));
			if (!nb)
				return -ENOMEM;
			free(f->bad); /* tests set faults between loads; see bdev.h */
			f->bad = nb;
			f->bad_words = words;
		}
		for (uint64_t k = 0; k < f->bad_words; k++)
			atomic_store(&f->bad[k], 0);
		for (uint64_t k = 0; k < len / 512; k++)
			atomic_fetch_or(&f->bad[k / 64], 1ull << (k % 64));
	}
	if (mode == BDEV_FAULT_DELAY) {
		if (!off || off > 10000000u)
			return -EINVAL;
		atomic_store(&f->delay_ns, off * 1000u);
		off = 0;
	}
	atomic_store(&f->bad_off, off);
	atomic_store(&f->bad_len, len);
	int old = atomic_exchange(&f->mode, (int)mode);
	if (old == BDEV_FAULT_HANG && mode != BDEV_FAULT_HANG)
		release_held(f, false);
	return 0;
}

static void pass_on(void *arg)
{
	struct held *h = arg;
	struct fault_bdev *f = (struct fault_bdev *)h->req->dev;
	struct bdev_req *req = h->req;
	free(h);
	if (req->op == BDEV_READ)
		atomic_fetch_add(&f->reads, 1);
	else if (req->op == BDEV_WRITE)
		atomic_fetch_add(&f->writes, 1);
	bdev_submit(f->inner, req);
}

static int pass_one(struct bdev *dev, bool newest)
{
	if (!bdev_is_fault(dev))
		return 0;
	struct fault_bdev *f = (struct fault_bdev *)dev;
	pthread_mutex_lock(&f->lock);
	struct held **pp = &f->held; /* pushed at the head: the newest */
	while (!newest && *pp && (*pp)->next)
		pp = &(*pp)->next;
	struct held *h = *pp;
	if (h)
		*pp = h->next;
	pthread_mutex_unlock(&f->lock);
	if (!h)
		return 0;
	if (worker_post(h->w, pass_on, h) < 0) {
		fault_fail_on(h->w, h->req, -EIO);
		free(h);
	}
	return 1;
}

int bdev_fault_pass_newest(struct bdev *dev)
{
	return pass_one(dev, true);
}

int bdev_fault_pass_oldest(struct bdev *dev)
{
	return pass_one(dev, false);
}

void bdev_fault_counts(struct bdev *dev, struct bdev_fault_counts *c)
{
	struct fault_bdev *f = (struct fault_bdev *)dev;
	c->reads = atomic_load(&f->reads);
	c->writes = atomic_load(&f->writes);
	c->errors = atomic_load(&f->errors);
	c->held_reads = atomic_load(&f->held_reads);
	c->held_writes = atomic_load(&f->held_writes);
}
