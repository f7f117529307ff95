/*
 * sync.c - the main thread waiting for work on worker 0: one request to a
 * device (cache_sync_io), or a call that finishes asynchronously
 * (cache_sync_run / cache_sync_done), for open, checkpoints on demand and
 * shutdown.
 *
 * Threading: the waiting side on the main (or control) thread, never on a
 * worker (it would wait for itself); the work on worker 0.
 */
#include "cache/cache_int.h"

/* ---- synchronous I/O for the main thread ----------------------------------- */

struct sync_io {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool done;
	int err;
	struct bdev *dev;
	struct bdev_req req;
	struct iovec iov;
};

static void sync_io_done(struct bdev_req *req, int err)
{
	struct sync_io *s = req->priv;
	pthread_mutex_lock(&s->lock);
	s->err = err;
	s->done = true;
	pthread_cond_signal(&s->cond);
	pthread_mutex_unlock(&s->lock);
}

static void sync_io_start(void *arg)
{
	struct sync_io *s = arg;
	bdev_submit(s->dev, &s->req);
}

/*
 * Main thread (never a worker: it would wait for itself). Runs one request
 * on worker 0 and waits. buf must be 4096-aligned (buf_get).
 */
int cache_sync_io(struct bdev *dev, enum bdev_op op, uint64_t off, void *buf, uint64_t len,
		  unsigned flags)
{
	struct sync_io s = { .dev = dev };
	pthread_mutex_init(&s.lock, NULL);
	pthread_cond_init(&s.cond, NULL);
	s.iov.iov_base = buf;
	s.iov.iov_len = len;
	s.req = (struct bdev_req){ .op = op, .flags = flags, .offset = off, .len = len,
				   .iov = &s.iov, .iovcnt = 1, .done = sync_io_done, .priv = &s };
	if (worker_post(worker_get(0), sync_io_start, &s) < 0)
		return -ENOMEM;
	pthread_mutex_lock(&s.lock);
	while (!s.done)
		pthread_cond_wait(&s.cond, &s.lock);
	pthread_mutex_unlock(&s.lock);
	pthread_mutex_destroy(&s.lock);
	pthread_cond_destroy(&s.cond);
	return s.err;
}

/* Run fn(arg) on worker 0 and wait for it to call cache_sync_done. Main thread. */

void cache_sync_done(struct sync_call *c, int err)
{
	pthread_mutex_lock(&c->lock);
	c->err = err;
	c->done = true;
	pthread_cond_signal(&c->cond);
	pthread_mutex_unlock(&c->lock);
}

int cache_sync_run(void (*fn)(void *), struct sync_call *c)
{
	return cache_sync_run_on(worker_get(0), fn, c);
}

/* The same on worker w. */
int cache_sync_run_on(struct worker *w, void (*fn)(void *), struct sync_call *c)
{
	pthread_mutex_init(&c->lock, NULL);
	pthread_cond_init(&c->cond, NULL);
	c->done = false;
	if (worker_post(w, fn, c) < 0)
		return -ENOMEM;
	pthread_mutex_lock(&c->lock);
	while (!c->done)
		pthread_cond_wait(&c->cond, &c->lock);
	pthread_mutex_unlock(&c->lock);
	pthread_mutex_destroy(&c->lock);
	pthread_cond_destroy(&c->cond);
	return c->err;
}
