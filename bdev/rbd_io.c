/*
 * rbd_io.c - the I/O path of an RBD bdev: requests go to librbd's
 * asynchronous calls and come back on the worker that submitted them.
 *
 * Completions: librbd calls back on its own threads, but bdev.h promises
 * done() on the worker that submitted. Each worker has a completion channel:
 * a lock-free LIFO of finished requests (linked through bdev_req.link, so no
 * allocation per request) and an eventfd in the worker's epoll set, written
 * only when the list goes from empty to non-empty. The worker takes the whole
 * list at once and runs the continuation kept in req->io.done. The channel is
 * made on the worker's thread the first time it submits to any RBD image and
 * torn down by a worker exit hook.
 *
 * A lost cluster fails I/O instead of hanging it: rados_osd_op_timeout and
 * rados_mon_op_timeout (and client_mount_timeout for the connect) are set to
 * the configured timeout (rbd_client.c), and backstore/sense.c turns
 * -ETIMEDOUT / -ENOTCONN into BUSY (the host retries) and -ESHUTDOWN /
 * -EROFS (blocklisted, or the image's lock is held by another gateway) into
 * NOT READY, LU NOT ACCESSIBLE (target port in standby), as tcmu-runner's
 * rbd handler does. rbd_note_result turns the same results into the
 * connection state `tierctl status` shows.
 *
 * Parking: a client is shared by the images of a cluster (rbd_client.c),
 * so another gateway taking one image over fences them all. A request that
 * fails with -ESHUTDOWN (blocklisted), or comes while the image's handles
 * are being replaced, is not failed: it is parked on the image (it leaves
 * the handles, so the swap does not wait for it) and the lock work, once
 * the image is open on a fresh client, sends it again there or fails it
 * (rbd_unpark: writes only go again while this gateway still owns the
 * image). A write the fence cut off may have reached some of its objects;
 * sending all of it again is what any retry does, and nobody else wrote
 * the image meanwhile when it is still ours (rbd_lock.c's reown).
 */
#include "bdev/rbd_int.h"

#include "common/log.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* ---- per-worker completion channels ------------------------------------ */

#define RBD_MAX_WORKERS 1024

struct rbd_chan {
	_Atomic(struct bdev_req *) head; /* pushed by librbd threads */
	int efd;
	struct ev_handler ev;
	bool ready; /* touched only by the owning worker */
};

static struct rbd_chan chans[RBD_MAX_WORKERS];

static void chan_push(struct rbd_chan *ch, struct bdev_req *req)
{
	struct bdev_req *old = atomic_load_explicit(&ch->head, memory_order_relaxed);
	do
		req->link = old;
	while (!atomic_compare_exchange_weak_explicit(&ch->head, &old, req, memory_order_release,
						      memory_order_relaxed));
	if (!old) {
		uint64_t one = 1;
		ssize_t r = write(ch->efd, &one, sizeof(one));
		(void)r; /* EAGAIN: the counter is already non-zero */
	}
}

static void chan_on_event(struct ev_handler *h, uint32_t events)
{
	struct rbd_chan *ch = (struct rbd_chan *)((char *)h - offsetof(struct rbd_chan, ev));
	uint64_t v;
	ssize_t r = read(ch->efd, &v, sizeof(v)); /* drain first, then take the list */
	(void)r;
	(void)events;
	struct bdev_req *list = atomic_exchange_explicit(&ch->head, NULL, memory_order_acquire);
	/* LIFO -> submission order */
	struct bdev_req *fifo = NULL;
	while (list) {
		struct bdev_req *next = list->link;
		list->link = fifo;
		fifo = list;
		list = next;
	}
	while (fifo) {
		struct bdev_req *req = fifo;
		fifo = req->link;
		int res = (int)(int64_t)req->done_bytes;
		req->io.done(&req->io, res);
	}
}

void rbd_chan_thread_exit(void)
{
	struct worker *w = worker_self();
	if (!w || worker_index(w) >= RBD_MAX_WORKERS)
		return;
	struct rbd_chan *ch = &chans[worker_index(w)];
	if (!ch->ready)
		return;
	worker_unwatch(&ch->ev);
	close(ch->efd);
	ch->ready = false;
}

/* The calling worker's channel, made on first use; NULL off a worker. */
static struct rbd_chan *chan_self(void)
{
	struct worker *w = worker_self();
	if (!w || worker_index(w) >= RBD_MAX_WORKERS)
		return NULL;
	struct rbd_chan *ch = &chans[worker_index(w)];
	if (ch->ready)
		return ch;
	ch->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (ch->efd < 0)
		return NULL;
	atomic_store(&ch->head, NULL);
	ch->ev.fd = ch->efd;
	ch->ev.on_event = chan_on_event;
	if (worker_watch(&ch->ev, EPOLLIN) < 0) {
		close(ch->efd);
		return NULL;
	}
	ch->ready = true;
	return ch;
}

/* ---- the I/O path ------------------------------------------------------- */

/*
 * While a request is in librbd, req->done_bytes holds the channel it returns
 * to (or 0: none, call the continuation on librbd's thread); when it comes
 * back, the result. req->io.done is the continuation.
 */

static bool err_is_conn_loss(int err)
{
	return err == -ETIMEDOUT || err == -ENOTCONN || err == -ESHUTDOWN || err == -ECONNREFUSED ||
	       err == -ECONNRESET;
}

void rbd_note_result(struct rbd_bdev *rb, int res)
{
	if (res >= 0) {
		atomic_store_explicit(&rb->last_ok_ms, now_ms(), memory_order_relaxed);
		if (atomic_load_explicit(&rb->conn, memory_order_relaxed) != BDEV_RBD_CONNECTED) {
			atomic_store(&rb->conn, BDEV_RBD_CONNECTED);
			log_info("rbd %s: cluster reachable again", rb->spec);
		}
	} else if (res == -ESHUTDOWN) {
		/* blocklisted: the lock work reconnects with a fresh client, and
		 * tells the other images on this one */
		if (!atomic_load_explicit(&rb->fenced, memory_order_relaxed)) {
			atomic_store(&rb->fenced, true);
			rbd_client_fenced(rb);
		}
		if (atomic_exchange(&rb->conn, BDEV_RBD_LOST) != BDEV_RBD_LOST)
			log_err("rbd %s: this gateway's Ceph client is fenced (blocklisted); requests wait for "
				"a fresh one", rb->spec);
	} else if (err_is_conn_loss(res)) {
		if (atomic_exchange(&rb->conn, BDEV_RBD_LOST) != BDEV_RBD_LOST)
			log_err("rbd %s: lost the Ceph cluster (%s); I/O fails with BUSY until it is back",
				rb->spec, strerror(-res));
	}
}

/* Hand a finished request (res: 0 or -errno) back to the worker that
 * submitted it, or run it here when it was submitted off the workers. */
static void complete_later(struct bdev_req *req, int res)
{
	struct rbd_chan *ch = (struct rbd_chan *)(uintptr_t)req->done_bytes;
	req->done_bytes = (uint64_t)(int64_t)res;
	if (ch)
		chan_push(ch, req);
	else
		req->io.done(&req->io, res);
}

/* Requests that allocate or change data, which a full pool holds. */
static bool rbd_op_writes(const struct bdev_req *req)
{
	return req->op == BDEV_WRITE || req->op == BDEV_UNMAP || req->op == BDEV_WRITE_ZEROES;
}

/* Park req (its channel still in done_bytes): see "Parking" at the top. */
static void park(struct rbd_bdev *rb, struct bdev_req *req)
{
	req->link = rb->parked; /* newest first: rbd_unpark reverses */
	rb->parked = req;
}

/* A request inside the handles ended with res: fenced, it is parked and
 * leaves the handles here; otherwise it goes back to its worker. */
static void end_inside(struct rbd_bdev *rb, struct bdev_req *req, int res)
{
	if (res == -ESHUTDOWN) {
		rbd_note_result(rb, res);
		pthread_mutex_lock(&rb->park_mu);
		park(rb, req);
		pthread_mutex_unlock(&rb->park_mu);
		rbd_handles_exit(rb); /* after the park: the swap, then the unpark, come later */
		return;
	}
	complete_later(req, res);
}

static void rbd_aio_cb(rbd_completion_t c, void *arg)
{
	struct bdev_req *req = arg;
	struct rbd_bdev *rb = rbd_bdev_of(req->dev);
	ssize_t r = rbd_aio_get_return_value(c);
	rbd_aio_release(c);
	int res = r < 0 ? (int)r : 0;
	/* held by a full pool until the timeout cancelled it: out of space */
	if (res == -ETIMEDOUT && rbd_op_writes(req) && atomic_load_explicit(&rb->pool_full, memory_order_relaxed))
		res = -EDQUOT;
	if (res != -ESHUTDOWN)
		rbd_note_result(rb, res);
	end_inside(rb, req, res);
}

/* done() of a request that entered the handles: it leaves them here */
static void rbd_finish(struct io_op *op, int res)
{
	struct bdev_req *req = (struct bdev_req *)((char *)op - offsetof(struct bdev_req, io));
	struct rbd_bdev *rb = rbd_bdev_of(req->dev);
	rbd_handles_exit(rb);
	req->done(req, res);
}

/* done() of a request turned away while the handles were being replaced */
static void rbd_finish_outside(struct io_op *op, int res)
{
	struct bdev_req *req = (struct bdev_req *)((char *)op - offsetof(struct bdev_req, io));
	req->done(req, res);
}

static void rbd_issue_flush(struct bdev_req *req);

/* A FUA write's data is in: it completes after a flush. */
static void rbd_write_then_flush(struct io_op *op, int res)
{
	struct bdev_req *req = (struct bdev_req *)((char *)op - offsetof(struct bdev_req, io));
	if (res < 0) {
		rbd_finish(op, res);
		return;
	}
	req->done_bytes = (uintptr_t)chan_self();
	req->io.done = rbd_finish;
	rbd_issue_flush(req);
}

static void rbd_issue_flush(struct bdev_req *req)
{
	struct rbd_bdev *rb = rbd_bdev_of(req->dev);
	rbd_completion_t c;
	int r = rbd_aio_create_completion(req, rbd_aio_cb, &c);
	if (r < 0) {
		complete_later(req, r);
		return;
	}
	r = rbd_aio_flush(rb->image, c);
	if (r < 0) {
		rbd_aio_release(c);
		end_inside(rb, req, r);
	}
}

static void issue_inside(struct rbd_bdev *rb, struct bdev_req *req);
static bool test_hold(struct rbd_bdev *rb, struct bdev_req *req);

/* Submit req, whose channel is in done_bytes already. */
static void submit_on_chan(struct rbd_bdev *rb, struct bdev_req *req)
{
	while (!rbd_handles_enter(rb)) {
		/* being replaced (fenced): held until the fresh client is in. The
		 * lock work clears swapping before it unparks: seen set under
		 * park_mu, the park comes before that unpark's take */
		pthread_mutex_lock(&rb->park_mu);
		if (atomic_load(&rb->swapping)) {
			park(rb, req);
			pthread_mutex_unlock(&rb->park_mu);
			return;
		}
		pthread_mutex_unlock(&rb->park_mu);
	}
	if (__builtin_expect(rb->test_hold != NULL, 0) && test_hold(rb, req))
		return;
	issue_inside(rb, req);
}

/* Issue req, which has entered rb's handles, to librbd. */
static void issue_inside(struct rbd_bdev *rb, struct bdev_req *req)
{
	rbd_completion_t c;
	int r;

	req->io.done = rbd_finish;
	if (req->op == BDEV_FLUSH) {
		rbd_issue_flush(req);
		return;
	}
	if (rbd_op_writes(req) && atomic_load_explicit(&rb->pool_full, memory_order_relaxed)) {
		/* Ceph would hold it until the pool has room (rbd_space.c) */
		complete_later(req, -EDQUOT);
		return;
	}
	if (req->op == BDEV_WRITE && (req->flags & BDEV_F_FUA))
		req->io.done = rbd_write_then_flush;

	r = rbd_aio_create_completion(req, rbd_aio_cb, &c);
	if (r < 0) {
		complete_later(req, r);
		return;
	}
	switch (req->op) {
	case BDEV_READ:
		r = rbd_aio_readv(rb->image, req->iov, req->iovcnt, req->offset, c);
		break;
	case BDEV_WRITE:
		r = rbd_aio_writev(rb->image, req->iov, req->iovcnt, req->offset, c);
		break;
	case BDEV_UNMAP:
		r = rbd_aio_discard(rb->image, req->offset, req->len, c);
		break;
	case BDEV_WRITE_ZEROES:
#if defined(LIBRBD_SUPPORTS_WRITE_ZEROES) && LIBRBD_SUPPORTS_WRITE_ZEROES
		/* thick: the range stays allocated, as BDEV_WRITE_ZEROES promises */
		r = rbd_aio_write_zeroes(rb->image, req->offset, req->len, c,
					 RBD_WRITE_ZEROES_FLAG_THICK_PROVISION, 0);
#else
		{
			static const char zero[4096];
			r = rbd_aio_writesame(rb->image, req->offset, req->len, zero,
					      req->len % sizeof(zero) ? rb->dev.block_size : sizeof(zero), c, 0);
		}
#endif
		break;
	default:
		r = -EOPNOTSUPP;
		break;
	}
	if (r < 0) {
		rbd_aio_release(c);
		end_inside(rb, req, r);
	}
}

/*
 * Tests (TIERCACHE_TEST_HOLD_WRITE=PATH): while PATH exists, one write to
 * each image at a time is held after it entered the image's handles (so
 * they cannot be replaced meanwhile) and issued on them once PATH is gone.
 * A write held across another gateway's takeover is one the fence cuts
 * off for certain (tests/test_rbd_shared_client.sh). One thread, started
 * by the first hold, lets them go (failed, if the image is stopping; a
 * test removes PATH before it stops the daemon).
 */
static pthread_mutex_t held_mu = PTHREAD_MUTEX_INITIALIZER;
static struct bdev_req *held;
static pthread_once_t held_once = PTHREAD_ONCE_INIT;
static bool held_running;

static void *held_thread(void *arg)
{
	(void)arg;
	for (;;) {
		usleep(20 * 1000);
		pthread_mutex_lock(&held_mu);
		struct bdev_req *keep = NULL, *go = NULL;
		while (held) {
			struct bdev_req *req = held;
			struct rbd_bdev *rb = rbd_bdev_of(req->dev);
			held = req->link;
			bool hold = access(rb->test_hold, F_OK) == 0 && !atomic_load(&rb->stopping);
			req->link = hold ? keep : go;
			*(hold ? &keep : &go) = req;
		}
		held = keep;
		pthread_mutex_unlock(&held_mu);
		while (go) {
			struct bdev_req *req = go;
			go = req->link;
			struct rbd_bdev *rb = rbd_bdev_of(req->dev);
			atomic_store(&rb->test_held, false);
			if (atomic_load(&rb->stopping)) { /* its handles are closing */
				req->io.done = rbd_finish;
				complete_later(req, -ESHUTDOWN);
				continue;
			}
			log_info("%s: the write held for the test goes now", rb->spec);
			issue_inside(rb, req);
		}
	}
	return NULL;
}

static void held_start(void)
{
	pthread_t t;
	if (pthread_create(&t, NULL, held_thread, NULL) == 0) {
		pthread_detach(t);
		held_running = true;
	}
}

static bool test_hold(struct rbd_bdev *rb, struct bdev_req *req)
{
	if (req->op != BDEV_WRITE || access(rb->test_hold, F_OK) != 0 ||
	    atomic_exchange(&rb->test_held, true))
		return false;
	pthread_once(&held_once, held_start);
	if (!held_running) { /* nothing would let it go */
		atomic_store(&rb->test_held, false);
		return false;
	}
	log_info("%s: a write held for the test (inside the handles)", rb->spec);
	pthread_mutex_lock(&held_mu);
	req->link = held;
	held = req;
	pthread_mutex_unlock(&held_mu);
	return true;
}

void rbd_submit(struct bdev *dev, struct bdev_req *req)
{
	req->done_bytes = (uintptr_t)chan_self();
	submit_on_chan(rbd_bdev_of(dev), req);
}

unsigned rbd_unpark(struct rbd_bdev *rb, bool may_write, bool may_read, int res, unsigned *writes)
{
	pthread_mutex_lock(&rb->park_mu);
	struct bdev_req *lifo = rb->parked, *list = NULL;
	rb->parked = NULL;
	pthread_mutex_unlock(&rb->park_mu);
	while (lifo) { /* oldest first */
		struct bdev_req *next = lifo->link;
		lifo->link = list;
		list = lifo;
		lifo = next;
	}
	unsigned again = 0;
	if (writes)
		*writes = 0;
	while (list) {
		struct bdev_req *req = list;
		list = req->link;
		bool w = rbd_op_writes(req) || req->op == BDEV_FLUSH;
		if (w ? may_write : may_read) {
			if (w && writes)
				(*writes)++;
			submit_on_chan(rb, req);
			again++;
		} else {
			req->io.done = rbd_finish_outside;
			complete_later(req, res);
		}
	}
	return again;
}
