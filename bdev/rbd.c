/*
 * rbd.c - a bdev on a Ceph RBD image, through librbd's asynchronous calls:
 * open and close, the image's size, and the list tierctl status reads.
 *
 * backing = rbd:POOL/IMAGE. One cluster connection (rados_t) per cluster,
 * shared by its images (rbd_client.c), opened with rbd_cache = false, so librbd never acknowledges a write the OSDs do not
 * hold; BDEV_FLUSH and every BDEV_F_FUA write still end with rbd_aio_flush (a
 * FUA write completes only after its flush), which is librbd's documented
 * durability barrier whatever the cache settings of the ceph.conf.
 *
 * A poll per image (on rbd_service.c's threads: at once when
 * rbd_update_watch says the image's header changed, otherwise once a
 * second) follows the image size:
 * when `rbd resize` changed it, dev->size is updated and the resize listener
 * (the cache volume, then the LU: CAPACITY DATA HAS CHANGED) is told. Every
 * few seconds without a successful I/O it also probes the OSDs (a stat of
 * the image's id object) to keep the connection state of `tierctl status`
 * current.
 *
 * The rest of the driver: rbd_io.c (submit and complete I/O), rbd_client.c
 * (the Ceph client and the image handle, and replacing a fenced client),
 * rbd_lock.c (the image's exclusive lock); rbd_int.h is what they share.
 */
#include "bdev/rbd_int.h"

#include "common/log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void registry_del(struct rbd_bdev *rb);

/* ---- size and connection poller ----------------------------------------- */

static pthread_mutex_t listener_lock = PTHREAD_MUTEX_INITIALIZER; /* every rb->on_resize */

void rbd_header_changed(void *arg)
{
	struct rbd_bdev *rb = arg;
	atomic_store(&rb->poll_kick, true);
	rbd_service_kick(&rb->poll_svc);
}

/* A service step, inside the handles. */
static void rbd_check_size(struct rbd_bdev *rb)
{
	uint64_t sz;
	int r = rbd_get_size(rb->image, &sz);
	if (r < 0) {
		rbd_note_result(rb, r);
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
	rbd_note_result(rb, r);
}

/* The size and connection poll's service step: an item of its own, so a
 * probe the cluster holds up does not delay the lock work's lease renewal. */
static uint64_t rbd_poll_step(struct rbd_svc_item *it)
{
	struct rbd_bdev *rb = (struct rbd_bdev *)((char *)it - offsetof(struct rbd_bdev, poll_svc));
	uint64_t now = now_ms();
	bool kicked = atomic_exchange(&rb->poll_kick, false);
	if (!kicked && now < rb->poll_next_ms)
		return rb->poll_next_ms;
	rb->poll_next_ms = now + 1000;
	if (atomic_load(&rb->stopping) || rbd_test_stalled(rb)) /* tests: as if the probe hung */
		return rb->poll_next_ms;
	if (!rbd_handles_enter(rb))
		return rb->poll_next_ms; /* being replaced: the swap kicks us again */
	rbd_check_size(rb);
	/* probe when idle, or while lost (to notice the way back) */
	uint64_t last = atomic_load_explicit(&rb->last_ok_ms, memory_order_relaxed);
	if (!kicked && ++rb->poll_ticks % 5 == 0 && now_ms() - last > 5000)
		rbd_probe(rb);
	rbd_handles_exit(rb);
	return rb->poll_next_ms;
}

/* The lock work's service step. */
static uint64_t rbd_lock_svc_step(struct rbd_svc_item *it)
{
	struct rbd_bdev *rb = (struct rbd_bdev *)((char *)it - offsetof(struct rbd_bdev, svc));
	return rb->lock ? rbd_lock_step(rb) : UINT64_MAX;
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

static void rbd_teardown(struct rbd_bdev *rb)
{
	rbd_shared_stop(rb);
	atomic_store(&rb->stopping, true);
	rbd_lock_stopping(rb); /* a step waiting in a reconnect gives up */
	rbd_service_remove(&rb->svc); /* no step runs from here */
	rbd_service_remove(&rb->poll_svc);
	rbd_lock_stop(rb);
	registry_del(rb);
	if (rb->watching) {
		rbd_update_unwatch(rb->image, rb->watch_handle);
		rb->watching = false;
	}
	struct rbd_handles h = { .client = rb->client, .cluster = rb->cluster, .ioctx = rb->ioctx,
				 .image = rb->image };
	rbd_handles_close(&h);
	rb->client = NULL;
	rb->cluster = NULL;
	rb->ioctx = NULL;
	rb->image = NULL;
	/* whatever the fence parked and no fresh client took: failed */
	rbd_unpark(rb, false, false, -ESHUTDOWN, NULL);
	rbd_client_leave(rb);
	pthread_mutex_destroy(&rb->park_mu);
	pthread_mutex_destroy(&rb->shared_lock);
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
	 * owner for the lock and fail with EROFS). The lock work may be
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
	if (!rbd_run_bounded(rbd_close_sync, rb, wait_s))
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
	.space = rbd_space,
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

bool rbd_other_open(const struct rbd_bdev *rb)
{
	bool other = false;
	pthread_mutex_lock(&open_lock);
	for (const struct rbd_bdev *o = open_list; o && !other; o = o->next_open)
		other = o != rb && !strcmp(o->spec, rb->spec) && !strcmp(o->conf_path, rb->conf_path);
	pthread_mutex_unlock(&open_lock);
	return other;
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
			st->pool_full = atomic_load(&rb->pool_full);
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
	pthread_mutex_init(&rb->shared_lock, NULL);
	pthread_mutex_init(&rb->park_mu, NULL);
	rb->test_stall = getenv("TIERCACHE_TEST_CLUSTER_STALL");
	rb->test_hold = getenv("TIERCACHE_TEST_HOLD_WRITE");
	atomic_init(&rb->test_held, false);
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
	atomic_init(&rb->pool_full, false);

	struct rbd_handles h;
	int r;
	uint64_t isize;
	rbd_client_join(rb);
	if (rbd_handles_open(rb, NULL, &h, &isize, err, errlen) < 0)
		goto fail;
	rb->client = h.client;
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

	atomic_init(&rb->poll_kick, false);
	r = rbd_service_add(&rb->svc, rbd_lock_svc_step);
	if (r == 0)
		r = rbd_service_add(&rb->poll_svc, rbd_poll_step);
	if (r < 0) {
		snprintf(err, errlen, "%s: cannot start a service thread: %s", rb->spec, strerror(-r));
		goto fail;
	}
	if (worker_exit_hook(rbd_chan_thread_exit) < 0) {
		snprintf(err, errlen, "%s: too many worker exit hooks", rb->spec);
		goto fail;
	}
	registry_add(rb);
	return &rb->dev;
fail:
	rbd_teardown(rb);
	return NULL;
}
