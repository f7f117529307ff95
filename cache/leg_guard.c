/*
 * leg_guard.c - a cache leg that answers within leg_timeout, or is given up on.
 *
 * Every leg of a set with leg_timeout is wrapped by a guard, so everything
 * that talks to a leg (the mirror, superblock and write-intent writes, the
 * resync copier) meets the same rule. Each worker keeps a list of the
 * requests it sent through guards; about once a second (a worker tick) it
 * looks for one older than its guard's timeout and asks the set
 * (timed_out) whether to give up on the leg. The set says no while it is
 * still opening, and for the last leg in service (a stall is better than
 * declaring every dirty block lost); otherwise it fails the leg, so new
 * I/O avoids it, and:
 *  - a write, flush or unmap is answered -ETIMEDOUT at once: the mirror
 *    finishes it with the other leg, as after a write error. Whatever the
 *    late write puts on the failed leg no longer matters: the leg comes
 *    back only through a full resync. Its iovec array is the guard's own
 *    copy, so a late resumption of a short transfer reads nothing freed;
 *  - a read is answered -ETIMEDOUT (and the mirror reads the other leg) only
 *    if its late answer can no longer reach its buffers (bdev_abandon: a
 *    request the fault device holds). A read the kernel has may still land
 *    in them whatever the flags (O_DIRECT may be queued unpinned, or fall
 *    back to buffered I/O; TCMU's buffers are the kernel's shared ring), so
 *    it waits for the device's own answer or error (the kernel's NVMe
 *    timeout aborts a hung command) and is then retried on the other leg.
 * A request given up on keeps its context (a "zombie", flagged
 * BDEV_F_ABANDONED) until the device hands it back; then only that context
 * is freed: it refers to nothing else.
 *
 * Threading: submit and completion on the same worker (bdev.h); the list
 * and the free list are per thread, so the path takes no lock. The cost
 * per I/O is a coarse clock read, an iovec copy and two list links.
 */
#include "cache/cache_int.h"

#include "common/log.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct guard {
	struct bdev dev;
	struct bdev *inner;
	uint64_t timeout_ms;
	bool (*timed_out)(void *arg, struct bdev *dev);
	void *arg;
	_Atomic uint32_t unanswered; /* given up on, or waiting past the timeout */
};

#define GUARD_IOV 32 /* more: not copied, so never given up on */

struct greq {
	struct greq *prev, *next; /* this worker's requests in flight; next: free list too */
	struct guard *g;
	struct bdev_req *up;
	struct bdev_req sub;
	uint64_t sent_ms;
	struct greq *expired_next; /* scan's list of those past their timeout */
	struct iovec iov[GUARD_IOV]; /* the caller's, copied: a zombie outlives it */
	bool zombie;  /* answered upward; the device still holds sub */
	bool waiting; /* timed out, but its late answer could reach its buffers */
};

static __thread struct greq *greq_free;
static __thread struct greq inflight; /* list head, set up by watch() */
static __thread struct worker_tick tick;
static __thread bool tick_on;

static void guard_thread_release(void)
{
	while (greq_free) {
		struct greq *r = greq_free;
		greq_free = r->next;
		free(r);
	}
}

/* Milliseconds, to a few: enough for timeouts of seconds, cheaper per I/O. */
static uint64_t coarse_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void unlink_req(struct greq *r)
{
	r->prev->next = r->next;
	r->next->prev = r->prev;
	r->next = r->prev = NULL;
}

static void sub_done(struct bdev_req *sub, int err)
{
	struct greq *r = sub->priv;
	if (r->zombie) {
		/* maybe on another thread than the one that sent it (a device
		 * closed after the workers stopped): free, not a free list; the
		 * guard outlives every request counted here (guard_close) */
		atomic_fetch_sub(&r->g->unanswered, 1);
		free(r);
		return;
	}
	if (r->waiting)
		atomic_fetch_sub(&r->g->unanswered, 1);
	struct bdev_req *up = r->up;
	unlink_req(r);
	r->next = greq_free;
	greq_free = r;
	up->done(up, err);
}

/* r is past its guard's timeout: give up on it if nothing can reach its buffers. */
static void expire(struct greq *r)
{
	struct guard *g = r->g;
	bool own_iov = r->sub.iov == r->iov || !r->sub.iovcnt;
	/* the leg is failed (or kept, if the set says so) first; then this
	 * request is let go only if nothing of the caller's can be touched */
	atomic_fetch_add(&g->unanswered, 1);
	if (!g->timed_out(g->arg, &g->dev) || !own_iov ||
	    (r->sub.op == BDEV_READ && bdev_abandon(g->inner, &r->sub) != BDEV_ABANDON_UNTOUCHED)) {
		r->waiting = true; /* the device's answer decides */
		return;
	}
	struct bdev_req *up = r->up;
	unlink_req(r);
	r->zombie = true;
	r->sub.flags |= BDEV_F_ABANDONED;
	up->done(up, -ETIMEDOUT);
}

static void scan(struct worker_tick *t)
{
	(void)t;
	uint64_t now = coarse_ms();
	/* collect first: done() may send new requests, which join the list */
	struct greq *expired = NULL, **tail = &expired;
	for (struct greq *r = inflight.next; r != &inflight; r = r->next) {
		if (r->waiting || now - r->sent_ms < r->g->timeout_ms)
			continue;
		r->expired_next = NULL;
		*tail = r;
		tail = &r->expired_next;
	}
	while (expired) {
		struct greq *r = expired;
		expired = r->expired_next;
		expire(r);
	}
}

static void watch(void)
{
	if (tick_on)
		return;
	tick_on = true;
	inflight.next = inflight.prev = &inflight;
	tick.fn = scan;
	worker_tick_add(&tick);
	worker_exit_hook(guard_thread_release);
}

static void guard_submit(struct bdev *dev, struct bdev_req *req)
{
	struct guard *g = (struct guard *)dev;
	struct greq *r = greq_free;
	if (r)
		greq_free = r->next;
	else if (!(r = malloc(sizeof(*r)))) {
		/* no memory: again later, not unguarded. Passed through, req
		 * came back naming the leg's own device, and the mirror
		 * ignores an error from a device that is not its leg's (a
		 * replaced leg's late answer): the leg that failed a write
		 * stayed in service without it. */
		bdev_submit_later(dev, req);
		return;
	}
	watch();
	r->g = g;
	r->up = req;
	r->zombie = false;
	r->waiting = false;
	r->sent_ms = coarse_ms();
	r->sub = (struct bdev_req){
		.op = req->op,
		.flags = req->flags,
		.offset = req->offset,
		.len = req->len,
		.iov = req->iov,
		.iovcnt = req->iovcnt,
		.done = sub_done,
		.priv = r,
	};
	if (req->iovcnt > 0 && req->iovcnt <= GUARD_IOV) {
		memcpy(r->iov, req->iov, (size_t)req->iovcnt * sizeof(*req->iov));
		r->sub.iov = r->iov;
	}
	r->next = &inflight;
	r->prev = inflight.prev;
	inflight.prev->next = r;
	inflight.prev = r;
	bdev_submit(g->inner, &r->sub);
}

/*
 * Main thread, the workers stopped. A device still holding requests past the
 * timeout stays open, and the guard with it: closing a file fsyncs it, which
 * waits on them, and their answers still come here. The process is ending.
 * The fault device is closed whatever it holds: that answers them all.
 */
static void guard_close(struct bdev *dev)
{
	struct guard *g = (struct guard *)dev;
	uint32_t n = atomic_load(&g->unanswered);
	if (n && !bdev_is_fault(g->inner)) {
		log_warn("cache leg %s: %u request(s) never answered; leaving the device open", dev->name, n);
		return;
	}
	bdev_close(g->inner);
	if ((n = atomic_load(&g->unanswered))) {
		log_warn("cache leg %s: %u request(s) still unanswered after its close", dev->name, n);
		return;
	}
	free(g);
}


static int64_t guard_lba_status(struct bdev *dev, uint64_t offset, bool *mapped)
{
	return bdev_lba_status(((struct guard *)dev)->inner, offset, mapped);
}

static int guard_space(struct bdev *dev, struct bdev_space *out)
{
	return bdev_space(((struct guard *)dev)->inner, out);
}

static const struct bdev_ops guard_ops = {
	.submit = guard_submit,
	.close = guard_close,
	.lba_status = guard_lba_status,
	.space = guard_space,
};

struct bdev *leg_guard_wrap(struct bdev *inner, uint32_t timeout_ms, bool (*timed_out)(void *arg, struct bdev *dev),
			    void *arg)
{
	struct guard *g = calloc(1, sizeof(*g));
	if (!g)
		return NULL;
	g->inner = inner;
	g->timeout_ms = timeout_ms;
	g->timed_out = timed_out;
	g->arg = arg;
	g->dev.ops = &guard_ops;
	bdev_like(&g->dev, inner);
	return &g->dev;
}

struct bdev *leg_guard_inner(struct bdev *dev)
{
	return dev && dev->ops == &guard_ops ? ((struct guard *)dev)->inner : dev;
}

uint32_t leg_guard_unanswered(struct bdev *dev)
{
	return dev && dev->ops == &guard_ops ? atomic_load(&((struct guard *)dev)->unanswered) : 0;
}
