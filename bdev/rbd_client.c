/*
 * rbd_client.c - the Ceph client under an RBD bdev: connect as the
 * configured user with the settings durability and a lost cluster need,
 * open the pool and the image on it, and replace a fenced client.
 *
 * A fenced client (blocklisted after another gateway broke our lock) stays
 * fenced: rbd_lock.c notices and calls rbd_reopen, which connects a
 * fresh client (a new address, so the blocklist entry does not match it)
 * and swaps it in under the handoff described in rbd_int.h.
 *
 * Some of librbd's and librados' teardown waits without a timeout;
 * rbd_run_bounded gives such a call a thread of its own and stops waiting
 * for it (the old client here, the whole image at close in rbd.c).
 */
#include "bdev/rbd_int.h"

#include "common/log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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
int rbd_handles_open(struct rbd_bdev *rb, unsigned nth, struct rbd_handles *h, uint64_t *size,
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

bool rbd_run_bounded(void (*fn)(void *arg), void *arg, unsigned wait_s)
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
	int r = rbd_handles_open(rb, rb->reopens + 1, &nh, &size, err, errlen);
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
	rbd_shared_moved(rb, false);
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
	rbd_shared_moved(rb, true); /* before the lock thread says STANDBY again */

	unsigned wait_s = rb->op_timeout_s + 5;
	if (!rbd_run_bounded(handles_close_free, old, wait_s))
		log_warn("%s: the fenced client did not close within %u s; left behind", rb->spec, wait_s);
	(void)size;
	return 0;
}
