/*
 * rbd.c - a bdev on a Ceph RBD image, through librbd's asynchronous calls.
 *
 * backing = rbd:POOL/IMAGE. One cluster connection (rados_t) per image, opened
 * with rbd_cache = false, so librbd never acknowledges a write the OSDs do not
 * hold; BDEV_FLUSH and every BDEV_F_FUA write still end with rbd_aio_flush (a
 * FUA write completes only after its flush), which is librbd's documented
 * durability barrier whatever the cache settings of the ceph.conf.
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
 * the configured timeout, and backstore/sense.c turns -ETIMEDOUT / -ENOTCONN
 * into BUSY (the host retries) and -ESHUTDOWN / -EROFS (blocklisted, or the
 * image's lock is held by another gateway) into NOT READY, LU NOT ACCESSIBLE
 * (target port in standby), as tcmu-runner's rbd handler does.
 *
 * A poller thread per image (woken at once by rbd_update_watch when the
 * image's header changes, otherwise once a second) follows the image size:
 * when `rbd resize` changed it, dev->size is updated and the resize listener
 * (the cache volume, then the LU: CAPACITY DATA HAS CHANGED) is told. Every
 * few seconds without a successful I/O it also probes the OSDs (a stat of
 * the image's id object) to keep the connection state of `tierctl status`
 * current.
 *
 * A fenced client (blocklisted after another gateway broke our lock) stays
 * fenced: rbd_lock.c notices and calls rbd_reopen, which connects a
 * fresh client (a new address, so the blocklist entry does not match it)
 * and swaps it in under the handoff described in rbd_int.h.
 */
#include "bdev/rbd_int.h"

#include "common/log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

static void registry_del(struct rbd_bdev *rb);

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

static void chan_thread_exit(void)
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

static void note_result(struct rbd_bdev *rb, int res)
{
	if (res >= 0) {
		atomic_store_explicit(&rb->last_ok_ms, now_ms(), memory_order_relaxed);
		if (atomic_load_explicit(&rb->conn, memory_order_relaxed) != BDEV_RBD_CONNECTED) {
			atomic_store(&rb->conn, BDEV_RBD_CONNECTED);
			log_info("rbd %s: cluster reachable again", rb->spec);
		}
	} else if (err_is_conn_loss(res)) {
		/* blocklisted: the lock thread reconnects with a fresh client */
		if (res == -ESHUTDOWN && !atomic_load_explicit(&rb->fenced, memory_order_relaxed))
			atomic_store(&rb->fenced, true);
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

static void rbd_aio_cb(rbd_completion_t c, void *arg)
{
	struct bdev_req *req = arg;
	struct rbd_bdev *rb = rbd_bdev_of(req->dev);
	ssize_t r = rbd_aio_get_return_value(c);
	rbd_aio_release(c);
	int res = r < 0 ? (int)r : 0;
	note_result(rb, res);
	complete_later(req, res);
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
		complete_later(req, r);
	}
}

static void rbd_submit(struct bdev *dev, struct bdev_req *req)
{
	struct rbd_bdev *rb = rbd_bdev_of(dev);
	rbd_completion_t c;
	int r;

	req->done_bytes = (uintptr_t)chan_self();
	if (!rbd_handles_enter(rb)) {
		/* the client is being replaced (fenced): BUSY, the host retries */
		req->io.done = rbd_finish_outside;
		complete_later(req, -ENOTCONN);
		return;
	}
	req->io.done = rbd_finish;
	if (req->op == BDEV_FLUSH) {
		rbd_issue_flush(req);
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
					      req->len % sizeof(zero) ? dev->block_size : sizeof(zero), c, 0);
		}
#endif
		break;
	default:
		r = -EOPNOTSUPP;
		break;
	}
	if (r < 0) {
		rbd_aio_release(c);
		complete_later(req, r);
	}
}

/* ---- size and connection poller ----------------------------------------- */

static pthread_mutex_t listener_lock = PTHREAD_MUTEX_INITIALIZER; /* every rb->on_resize */

static void rbd_header_changed(void *arg)
{
	struct rbd_bdev *rb = arg;
	pthread_mutex_lock(&rb->poll_lock);
	rb->poll_kick = true;
	pthread_cond_signal(&rb->poll_cond);
	pthread_mutex_unlock(&rb->poll_lock);
}

/* Poller thread, inside the handles. */
static void rbd_check_size(struct rbd_bdev *rb)
{
	uint64_t sz;
	int r = rbd_get_size(rb->image, &sz);
	if (r < 0) {
		note_result(rb, r);
		return;
	}
	uint64_t cur = __atomic_load_n(&rb->dev.size, __ATOMIC_RELAXED);
	if (sz == cur)
		return;
	uint64_t usable = sz / rb->dev.block_size * rb->dev.block_size;
	if (usable == cur)
		return;
	if (usable < rb->dev.block_size) {
		log_err("rbd %s: the image shrank to %llu bytes, less than one block; keeping %llu", rb->spec,
			(unsigned long long)sz, (unsigned long long)cur);
		return;
	}
	log_info("rbd %s: image resized from %llu to %llu bytes", rb->spec, (unsigned long long)cur,
		 (unsigned long long)usable);
	__atomic_store_n(&rb->dev.size, usable, __ATOMIC_RELAXED);
	pthread_mutex_lock(&listener_lock);
	void (*fn)(void *, uint64_t) = rb->on_resize;
	void *arg = rb->on_resize_arg;
	if (fn)
		fn(arg, usable);
	pthread_mutex_unlock(&listener_lock);
}

static void rbd_probe(struct rbd_bdev *rb)
{
	char oid[RBD_NAME_MAX + 16];
	uint64_t psize;
	time_t mtime;
	snprintf(oid, sizeof(oid), "rbd_id.%s", rb->image_name);
	int r = rados_stat(rb->ioctx, oid, &psize, &mtime);
	if (r == -ENOENT)
		r = 0; /* a format 1 image has no id object; the OSD answered */
	note_result(rb, r);
}

static void *rbd_poller(void *arg)
{
	struct rbd_bdev *rb = arg;
	unsigned ticks = 0;

	while (!atomic_load(&rb->stopping)) {
		pthread_mutex_lock(&rb->poll_lock);
		if (!rb->poll_kick && !atomic_load(&rb->stopping)) {
			struct timespec ts;
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_sec += 1;
			pthread_cond_timedwait(&rb->poll_cond, &rb->poll_lock, &ts);
		}
		rb->poll_kick = false;
		pthread_mutex_unlock(&rb->poll_lock);
		if (atomic_load(&rb->stopping))
			break;
		if (!rbd_handles_enter(rb))
			continue; /* being replaced: the swap kicks us again */
		rbd_check_size(rb);
		/* probe when idle, or while lost (to notice the way back) */
		uint64_t last = atomic_load_explicit(&rb->last_ok_ms, memory_order_relaxed);
		if (++ticks % 5 == 0 && now_ms() - last > 5000)
			rbd_probe(rb);
		rbd_handles_exit(rb);
	}
	return NULL;
}

static void rbd_set_resize_listener(struct bdev *dev, void (*fn)(void *arg, uint64_t size), void *arg)
{
	struct rbd_bdev *rb = rbd_bdev_of(dev);
	pthread_mutex_lock(&listener_lock);
	rb->on_resize = fn;
	rb->on_resize_arg = arg;
	pthread_mutex_unlock(&listener_lock);
}

/* ---- open / close ------------------------------------------------------- */

/* One cluster connection with the image open on it. */
struct rbd_handles {
	rados_t cluster;
	rados_ioctx_t ioctx;
	rbd_image_t image;
};

static void handles_close(struct rbd_handles *h)
{
	if (h->image)
		rbd_close(h->image);
	if (h->ioctx)
		rados_ioctx_destroy(h->ioctx);
	if (h->cluster)
		rados_shutdown(h->cluster);
	h->image = NULL;
	h->ioctx = NULL;
	h->cluster = NULL;
}

static int conf_set(struct rbd_bdev *rb, rados_t cl, const char *key, const char *val, char *err,
		    size_t errlen)
{
	int r = rados_conf_set(cl, key, val);
	if (r < 0)
		snprintf(err, errlen, "rbd %s: cannot set %s = %s: %s", rb->spec, key, val, strerror(-r));
	return r;
}

/*
 * The nth fresh client of this process (nth > 0) gets its own admin socket:
 * the configured path (usually $name.$pid.asok, the same for every client
 * of the process) with ".nth" before ".asok", since the client it replaces
 * still holds that path while the new one connects.
 */
static void admin_socket_suffix(rados_t cl, unsigned nth)
{
	char cur[4096], path[4096 + 16];
	if (rados_conf_get(cl, "admin_socket", cur, sizeof(cur)) < 0 || !cur[0])
		return;
	size_t l = strlen(cur);
	bool ext = l > 5 && !strcmp(cur + l - 5, ".asok");
	snprintf(path, sizeof(path), "%.*s.%u%s", (int)(ext ? l - 5 : l), cur, nth, ext ? ".asok" : "");
	rados_conf_set(cl, "admin_socket", path);
}

/*
 * Connect a new client as rb's user with rb's configuration (the nth since
 * open, 0 at open), open the pool and the image: 0 with *h and the image's
 * size in *size, or -errno with a sentence in err and *h all NULL.
 */
static int handles_open(struct rbd_bdev *rb, unsigned nth, struct rbd_handles *h, uint64_t *size,
			char *err, size_t errlen)
{
	memset(h, 0, sizeof(*h));
	int r = rados_create(&h->cluster, rb->user);
	if (r < 0) {
		snprintf(err, errlen, "%s: cannot create a Ceph client for client.%s: %s", rb->spec, rb->user,
			 strerror(-r));
		h->cluster = NULL;
		return r;
	}
	r = rados_conf_read_file(h->cluster, rb->conf_path);
	if (r < 0) {
		snprintf(err, errlen, "%s: cannot parse the Ceph configuration %s: %s", rb->spec,
			 rb->conf_path, strerror(-r));
		goto fail;
	}
	if (nth)
		admin_socket_suffix(h->cluster, nth);
	char t[16];
	snprintf(t, sizeof(t), "%u", rb->op_timeout_s);
	/* durability: no write-back cache in librbd; a lost cluster: errors, not hangs */
	if ((r = conf_set(rb, h->cluster, "rbd_cache", "false", err, errlen)) < 0 ||
	    (r = conf_set(rb, h->cluster, "rados_osd_op_timeout", t, err, errlen)) < 0 ||
	    (r = conf_set(rb, h->cluster, "rados_mon_op_timeout", t, err, errlen)) < 0 ||
	    (r = conf_set(rb, h->cluster, "client_mount_timeout", t, err, errlen)) < 0 ||
	    /* UNMAP must really zero partial objects (reads after it return zeroes) */
	    (r = conf_set(rb, h->cluster, "rbd_skip_partial_discard", "false", err, errlen)) < 0)
		goto fail;
	r = rados_connect(h->cluster);
	if (r < 0) {
		snprintf(err, errlen,
			 "%s: cannot connect to the Ceph cluster of %s as client.%s: %s; check that the "
			 "monitors in its mon host are up and the keyring it names is readable",
			 rb->spec, rb->conf_path, rb->user, strerror(-r));
		goto fail;
	}
	r = rados_ioctx_create(h->cluster, rb->pool, &h->ioctx);
	if (r < 0) {
		h->ioctx = NULL;
		snprintf(err, errlen, "%s: cannot open pool %s: %s%s", rb->spec, rb->pool, strerror(-r),
			 r == -ENOENT ? "; create it with `ceph osd pool create` and `rbd pool init`" : "");
		goto fail;
	}
	r = rbd_open(h->ioctx, rb->image_name, &h->image, NULL);
	if (r < 0) {
		h->image = NULL;
		snprintf(err, errlen, "%s: cannot open image %s in pool %s: %s%s", rb->spec, rb->image_name,
			 rb->pool, strerror(-r),
			 r == -ENOENT ? "; create it with `rbd create --size SIZE POOL/IMAGE`" : "");
		goto fail;
	}
	r = rbd_get_size(h->image, size);
	if (r < 0) {
		snprintf(err, errlen, "%s: cannot read the image size: %s", rb->spec, strerror(-r));
		goto fail;
	}
	return 0;
fail:
	handles_close(h);
	return r;
}

/*
 * Run fn(arg) on a thread of its own and wait at most wait_s for it: true
 * when it finished. A run the cluster does not let finish (some of librbd's
 * and librados' teardown waits without a timeout) is abandoned: it ends, or
 * not, in the background, and fn owns arg either way.
 */
struct bounded_run {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool done, abandoned;
	void (*fn)(void *arg);
	void *arg;
};

static void bounded_run_free(struct bounded_run *br)
{
	pthread_cond_destroy(&br->cond);
	pthread_mutex_destroy(&br->lock);
	free(br);
}

static void *bounded_run_thread(void *p)
{
	struct bounded_run *br = p;
	br->fn(br->arg);
	pthread_mutex_lock(&br->lock);
	br->done = true;
	bool abandoned = br->abandoned;
	pthread_cond_signal(&br->cond);
	pthread_mutex_unlock(&br->lock);
	if (abandoned)
		bounded_run_free(br);
	return NULL;
}

static bool run_bounded(void (*fn)(void *arg), void *arg, unsigned wait_s)
{
	struct bounded_run *br = calloc(1, sizeof(*br));
	pthread_t th;

	if (!br) {
		fn(arg);
		return true;
	}
	pthread_mutex_init(&br->lock, NULL);
	pthread_cond_init(&br->cond, NULL);
	br->fn = fn;
	br->arg = arg;
	if (pthread_create(&th, NULL, bounded_run_thread, br)) {
		bounded_run_free(br);
		fn(arg);
		return true;
	}
	pthread_detach(th);
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += wait_s;
	pthread_mutex_lock(&br->lock);
	while (!br->done)
		if (pthread_cond_timedwait(&br->cond, &br->lock, &ts) == ETIMEDOUT)
			break;
	bool done = br->done;
	if (!done)
		br->abandoned = true;
	pthread_mutex_unlock(&br->lock);
	if (done)
		bounded_run_free(br);
	return done;
}

static void handles_close_free(void *arg)
{
	struct rbd_handles *h = arg;
	handles_close(h);
	free(h);
}

int rbd_reopen(struct rbd_bdev *rb, bool (*cancelled)(void *arg), void *arg, char *err, size_t errlen)
{
	struct rbd_handles nh;
	uint64_t size;
	int r = handles_open(rb, rb->reopens + 1, &nh, &size, err, errlen);
	if (r < 0)
		return r;
	struct rbd_handles *old = malloc(sizeof(*old));
	if (!old) {
		handles_close(&nh);
		snprintf(err, errlen, "%s: out of memory", rb->spec);
		return -ENOMEM;
	}

	/* the handoff: nobody enters from here; wait for those inside to leave
	 * (requests on a fenced client fail fast; a lost cluster's within the
	 * operation timeout) */
	atomic_store(&rb->swapping, true);
	uint64_t t0 = now_ms(), said = t0;
	while (atomic_load(&rb->inflight) != 0) {
		if (cancelled && cancelled(arg)) {
			atomic_store(&rb->swapping, false);
			handles_close(&nh);
			free(old);
			snprintf(err, errlen, "%s: reconnect cancelled", rb->spec);
			return -ECANCELED;
		}
		if (now_ms() - said >= 10000) {
			said = now_ms();
			log_warn("%s: %u request(s) still on the fenced client after %llu s; waiting", rb->spec,
				 atomic_load(&rb->inflight), (unsigned long long)(said - t0) / 1000);
		}
		usleep(2000);
	}
	if (rb->watching) {
		rbd_update_unwatch(rb->image, rb->watch_handle);
		rb->watching = false;
	}
	old->cluster = rb->cluster;
	old->ioctx = rb->ioctx;
	old->image = rb->image;
	rb->cluster = nh.cluster;
	rb->ioctx = nh.ioctx;
	rb->image = nh.image;
	rb->reopens++;
	atomic_store(&rb->fenced, false);
	atomic_store(&rb->last_ok_ms, now_ms());
	if (atomic_exchange(&rb->conn, BDEV_RBD_CONNECTED) != BDEV_RBD_CONNECTED)
		log_info("rbd %s: cluster reachable again (fresh client)", rb->spec);
	atomic_store(&rb->swapping, false); /* publishes the new handles to those who enter */

	r = rbd_update_watch(rb->image, &rb->watch_handle, rbd_header_changed, rb);
	if (r == 0)
		rb->watching = true;
	else
		log_warn("%s: cannot watch the image header (%s); size changes are polled", rb->spec,
			 strerror(-r));
	rbd_header_changed(rb); /* the poller looks at the size on the new handle now */

	unsigned wait_s = rb->op_timeout_s + 5;
	if (!run_bounded(handles_close_free, old, wait_s))
		log_warn("%s: the fenced client did not close within %u s; left behind", rb->spec, wait_s);
	(void)size;
	return 0;
}

static void rbd_teardown(struct rbd_bdev *rb)
{
	rbd_lock_stop(rb);
	registry_del(rb);
	if (rb->poller_started) {
		atomic_store(&rb->stopping, true);
		rbd_header_changed(rb);
		pthread_join(rb->poller, NULL);
		rb->poller_started = false;
	}
	if (rb->watching) {
		rbd_update_unwatch(rb->image, rb->watch_handle);
		rb->watching = false;
	}
	if (rb->image) {
		rbd_close(rb->image);
		rb->image = NULL;
	}
	if (rb->ioctx) {
		rados_ioctx_destroy(rb->ioctx);
		rb->ioctx = NULL;
	}
	if (rb->cluster) {
		rados_shutdown(rb->cluster);
		rb->cluster = NULL;
	}
	pthread_cond_destroy(&rb->poll_cond);
	pthread_mutex_destroy(&rb->poll_lock);
	free(rb);
}

/*
 * Closing talks to the cluster (flush, lock release, unwatch, shutdown),
 * and with the cluster gone some of those wait without a timeout. Every
 * write was acknowledged durable already (no librbd cache), so close gives
 * the teardown its own thread and stops waiting after twice the operation
 * timeout: a daemon stopping or a LUN removed while Ceph is down does not
 * hang; the abandoned teardown finishes (or not) in the background.
 */
static void rbd_close_sync(void *arg)
{
	struct rbd_bdev *rb = arg;
	/* Only an owner has writes to flush (a standby's flush would ask the
	 * owner for the lock and fail with EROFS). The lock thread may be
	 * replacing the handles right now: enter them. */
	bool owned = !rb->lock || bdev_rbd_owner_ops.state(&rb->dev, NULL) == BDEV_OWNER_OWNED;
	if (owned && rb->image && rbd_handles_enter(rb)) {
		int r = rbd_flush(rb->image);
		rbd_handles_exit(rb);
		if (r < 0)
			log_warn("rbd %s: final flush failed: %s", rb->spec, strerror(-r));
	}
	rbd_teardown(rb);
}

static void rbd_close_dev(struct bdev *dev)
{
	struct rbd_bdev *rb = rbd_bdev_of(dev);
	char spec[sizeof(rb->spec)];
	unsigned wait_s = 2 * rb->op_timeout_s + 5;

	snprintf(spec, sizeof(spec), "%s", rb->spec);
	if (!run_bounded(rbd_close_sync, rb, wait_s))
		log_err("%s: the cluster did not let the image close within %u s; giving up on it "
			"(every acknowledged write is already on the OSDs)", spec, wait_s);
}

static int64_t rbd_lba_status(struct bdev *dev, uint64_t offset, bool *mapped)
{
	/* librbd's diff_iterate could tell; everything reads as mapped for now */
	*mapped = true;
	return (int64_t)(__atomic_load_n(&dev->size, __ATOMIC_RELAXED) - offset);
}

static const struct bdev_ops rbd_ops = {
	.submit = rbd_submit,
	.close = rbd_close_dev,
	.lba_status = rbd_lba_status,
	.set_resize_listener = rbd_set_resize_listener,
	.owner = &bdev_rbd_owner_ops,
};

static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;
static struct rbd_bdev *open_list;

static void registry_add(struct rbd_bdev *rb)
{
	pthread_mutex_lock(&open_lock);
	rb->next_open = open_list;
	open_list = rb;
	pthread_mutex_unlock(&open_lock);
}

static void registry_del(struct rbd_bdev *rb)
{
	pthread_mutex_lock(&open_lock);
	for (struct rbd_bdev **pp = &open_list; *pp; pp = &(*pp)->next_open)
		if (*pp == rb) {
			*pp = rb->next_open;
			break;
		}
	pthread_mutex_unlock(&open_lock);
}

bool bdev_rbd_status(const char *backing, struct bdev_rbd_status *st)
{
	bool found = false;
	pthread_mutex_lock(&open_lock);
	for (struct rbd_bdev *rb = open_list; rb; rb = rb->next_open)
		if (!strcmp(rb->spec, backing)) {
			snprintf(st->pool, sizeof(st->pool), "%s", rb->pool);
			snprintf(st->image, sizeof(st->image), "%s", rb->image_name);
			st->conn = (enum bdev_rbd_conn)atomic_load(&rb->conn);
			st->size = __atomic_load_n(&rb->dev.size, __ATOMIC_RELAXED);
			found = true;
			break;
		}
	pthread_mutex_unlock(&open_lock);
	return found;
}

const char *bdev_rbd_conn_name(enum bdev_rbd_conn c)
{
	return c == BDEV_RBD_CONNECTED ? "connected" : "lost";
}

struct bdev *bdev_rbd_open(const char *spec, const struct bdev_rbd_opts *opts, uint64_t size,
			   uint32_t block_size, char *err, size_t errlen)
{
	const char *conf = opts && opts->conf ? opts->conf : BDEV_RBD_DEFAULT_CONF;
	const char *user = opts && opts->user ? opts->user : BDEV_RBD_DEFAULT_USER;
	unsigned tmo = opts && opts->op_timeout_s ? opts->op_timeout_s : BDEV_RBD_DEFAULT_TIMEOUT;
	const char *slash = strchr(spec, '/');

	if (!slash || slash == spec || !slash[1] || strchr(slash + 1, '/') ||
	    (size_t)(slash - spec) >= RBD_NAME_MAX || strlen(slash + 1) >= RBD_NAME_MAX) {
		snprintf(err, errlen, "backing rbd:%s: write it as rbd:POOL/IMAGE", spec);
		return NULL;
	}
	if (strlen(conf) >= sizeof(((struct rbd_bdev *)0)->conf_path) || strlen(user) >= RBD_NAME_MAX) {
		snprintf(err, errlen, "rbd:%s: ceph_conf or ceph_user is too long", spec);
		return NULL;
	}
	if (access(conf, R_OK) < 0) {
		snprintf(err, errlen, "rbd:%s: cannot read the Ceph configuration %s: %s; set ceph_conf = PATH",
			 spec, conf, strerror(errno));
		return NULL;
	}

	struct rbd_bdev *rb = calloc(1, sizeof(*rb));
	if (!rb) {
		snprintf(err, errlen, "out of memory opening rbd:%s", spec);
		return NULL;
	}
	pthread_mutex_init(&rb->poll_lock, NULL);
	pthread_cond_init(&rb->poll_cond, NULL);
	memcpy(rb->pool, spec, (size_t)(slash - spec));
	snprintf(rb->image_name, sizeof(rb->image_name), "%s", slash + 1);
	snprintf(rb->spec, sizeof(rb->spec), "rbd:%s/%s", rb->pool, rb->image_name);
	snprintf(rb->conf_path, sizeof(rb->conf_path), "%s", conf);
	snprintf(rb->user, sizeof(rb->user), "%s", user);
	rb->op_timeout_s = tmo;
	atomic_init(&rb->conn, BDEV_RBD_LOST);
	atomic_init(&rb->last_ok_ms, 0);
	atomic_init(&rb->inflight, 0);
	atomic_init(&rb->stopping, false);
	atomic_init(&rb->swapping, false);
	atomic_init(&rb->fenced, false);

	struct rbd_handles h;
	int r;
	uint64_t isize;
	if (handles_open(rb, 0, &h, &isize, err, errlen) < 0)
		goto fail;
	rb->cluster = h.cluster;
	rb->ioctx = h.ioctx;
	rb->image = h.image;
	if (size && size != isize) {
		snprintf(err, errlen,
			 "%s: size = %llu but the image holds %llu bytes; leave size out (the image's size "
			 "is used) or resize the image with `rbd resize`",
			 rb->spec, (unsigned long long)size, (unsigned long long)isize);
		goto fail;
	}
	if (isize < block_size || isize % block_size) {
		snprintf(err, errlen, "%s: image size %llu is not a whole number of %u-byte blocks; "
			 "resize it with `rbd resize`", rb->spec, (unsigned long long)isize, block_size);
		goto fail;
	}
	atomic_store(&rb->conn, BDEV_RBD_CONNECTED);
	atomic_store(&rb->last_ok_ms, now_ms());

	rb->dev.ops = &rbd_ops;
	rb->dev.name = rb->spec;
	rb->dev.size = isize;
	rb->dev.block_size = block_size;
	rb->dev.can_unmap = true;
	rb->dev.rotational = false;

	r = rbd_update_watch(rb->image, &rb->watch_handle, rbd_header_changed, rb);
	if (r == 0)
		rb->watching = true;
	else
		log_warn("%s: cannot watch the image header (%s); size changes are polled",
			 rb->spec, strerror(-r));

	/* rbd_lock.c: exclusive lock / ownership hooks in here */
	if (rbd_lock_start(rb, err, errlen) < 0)
		goto fail;

	r = pthread_create(&rb->poller, NULL, rbd_poller, rb);
	if (r) {
		snprintf(err, errlen, "%s: cannot start the size poller: %s", rb->spec, strerror(r));
		goto fail;
	}
	rb->poller_started = true;
	if (worker_exit_hook(chan_thread_exit) < 0) {
		snprintf(err, errlen, "%s: too many worker exit hooks", rb->spec);
		goto fail;
	}
	registry_add(rb);
	return &rb->dev;
fail:
	rbd_teardown(rb);
	return NULL;
}
