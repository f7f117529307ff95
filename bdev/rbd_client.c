/*
 * rbd_client.c - the Ceph client under the RBD bdevs: connect as the
 * configured user with the settings durability and a lost cluster need,
 * open the pool and the image on it, and replace a fenced client.
 *
 * One client per cluster: every image whose configuration file, user and
 * operation timeout are the same shares one librados client (its messenger
 * threads, its sessions to the monitors and OSDs), so a gateway's threads
 * and sockets do not grow with its images. The cost: Ceph fences a client,
 * not an image. When another gateway takes one image over, it breaks that
 * image's lock and blocklists our client, which fences every image on it.
 * The first image to notice marks the client fenced and has the lock work
 * of the others run now (rbd_client_fenced); each calls rbd_reopen, which
 * opens its image on the cluster's current client, connecting a fresh one
 * (a new address, so the blocklist entry does not match it) when the
 * current one is the fenced one, and swaps it in under the handoff
 * described in rbd_int.h. The images this gateway still owned are owned
 * again on the fresh client (rbd_lock.c), and their requests the fence
 * failed are resubmitted there (rbd_io.c); the fenced client is shut down
 * when the last image has left it.
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

/* ---- the clients, one per cluster ------------------------------------- */

struct rbd_client {
	rados_t cl;
	struct rbd_cluster *rc;
	unsigned refs;              /* handles open on it (under reg_mu) */
	atomic_bool fenced;         /* found blocklisted: new handles go elsewhere */
};

/* The images sharing a configuration file, user and timeout. */
struct rbd_cluster {
	struct rbd_cluster *next;
	char conf_path[4096];
	char user[RBD_NAME_MAX];
	unsigned op_timeout_s;
	unsigned users;             /* images joined (under reg_mu) */
	unsigned clients;           /* its clients alive, current or not (under reg_mu) */
	struct rbd_bdev *images;    /* them, through next_user (under reg_mu) */
	struct rbd_client *cur;     /* where new handles open; NULL: none yet (under reg_mu) */
	unsigned made;              /* clients connected so far (under connect_mu) */
	pthread_mutex_t connect_mu; /* one connect at a time: the others then share it */
	uint64_t failed_at;         /* now_ms() of the last failed connect (under connect_mu) */
	int failed_err;
	char failed_msg[512];
};

/* A reconnect within this long of a failed connect fails at once with its
 * error (the images' own backoff retries later). */
#define RBD_CONNECT_HOLDOFF_MS 5000

/* Order: connect_mu, then reg_mu, then the service's lock (rbd_service_kick). */
static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static struct rbd_cluster *clusters;

static struct rbd_cluster *rc_of(struct rbd_bdev *rb)
{
	return rb->rc;
}

/* Take rc off the registry when nothing uses it any more (reg_mu held):
 * true when the caller must free it. */
static bool rc_unused_locked(struct rbd_cluster *rc)
{
	if (rc->users || rc->clients)
		return false;
	for (struct rbd_cluster **pp = &clusters; *pp; pp = &(*pp)->next)
		if (*pp == rc) {
			*pp = rc->next;
			break;
		}
	return true;
}

static void rc_free(struct rbd_cluster *rc)
{
	pthread_mutex_destroy(&rc->connect_mu);
	free(rc);
}

static void client_put(struct rbd_client *c)
{
	struct rbd_cluster *rc = c->rc;
	bool gone = false;
	pthread_mutex_lock(&reg_mu);
	bool last = --c->refs == 0;
	if (last) {
		if (rc->cur == c)
			rc->cur = NULL;
		rc->clients--;
		gone = rc_unused_locked(rc);
	}
	pthread_mutex_unlock(&reg_mu);
	if (last) {
		/* an old client's handles may close long after (an abandoned
		 * close): the entry lives until its last client is gone */
		rados_shutdown(c->cl);
		free(c);
	}
	if (gone)
		rc_free(rc);
}

void rbd_handles_close(struct rbd_handles *h)
{
	if (h->image)
		rbd_close(h->image);
	if (h->ioctx)
		rados_ioctx_destroy(h->ioctx);
	if (h->client)
		client_put(h->client);
	h->image = NULL;
	h->ioctx = NULL;
	h->cluster = NULL;
	h->client = NULL;
}

void rbd_client_join(struct rbd_bdev *rb)
{
	pthread_mutex_lock(&reg_mu);
	struct rbd_cluster *rc = clusters;
	while (rc && (strcmp(rc->conf_path, rb->conf_path) || strcmp(rc->user, rb->user) ||
		      rc->op_timeout_s != rb->op_timeout_s))
		rc = rc->next;
	if (!rc) {
		rc = calloc(1, sizeof(*rc));
		if (!rc)
			abort(); /* a few hundred bytes at open */
		snprintf(rc->conf_path, sizeof(rc->conf_path), "%s", rb->conf_path);
		snprintf(rc->user, sizeof(rc->user), "%s", rb->user);
		rc->op_timeout_s = rb->op_timeout_s;
		pthread_mutex_init(&rc->connect_mu, NULL);
		rc->next = clusters;
		clusters = rc;
	}
	rc->users++;
	rb->next_user = rc->images;
	rc->images = rb;
	rb->rc = rc;
	pthread_mutex_unlock(&reg_mu);
}

void rbd_client_leave(struct rbd_bdev *rb)
{
	struct rbd_cluster *rc = rc_of(rb);
	if (!rc)
		return;
	pthread_mutex_lock(&reg_mu);
	for (struct rbd_bdev **pp = &rc->images; *pp; pp = &(*pp)->next_user)
		if (*pp == rb) {
			*pp = rb->next_user;
			break;
		}
	rb->rc = NULL;
	rc->users--;
	bool gone = rc_unused_locked(rc);
	pthread_mutex_unlock(&reg_mu);
	if (gone)
		rc_free(rc);
}

void rbd_client_fenced(struct rbd_bdev *rb)
{
	struct rbd_client *c = rb->client;
	if (!c || atomic_exchange(&c->fenced, true))
		return;
	pthread_mutex_lock(&reg_mu);
	for (struct rbd_bdev *o = c->rc->images; o; o = o->next_user)
		if (__atomic_load_n(&o->client, __ATOMIC_RELAXED) == c)
			rbd_service_kick(&o->svc);
	pthread_mutex_unlock(&reg_mu);
}

bool rbd_client_is_fenced(struct rbd_bdev *rb)
{
	return rb->client && atomic_load(&rb->client->fenced);
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
 * Connect a new client as rb's user with rb's configuration (the nth of its
 * cluster entry, 0 first): 0 with *out, or -errno with a sentence in err.
 */
static int client_connect(struct rbd_bdev *rb, unsigned nth, rados_t *out, char *err, size_t errlen)
{
	rados_t cl;
	int r = rados_create(&cl, rb->user);
	if (r < 0) {
		snprintf(err, errlen, "%s: cannot create a Ceph client for client.%s: %s", rb->spec, rb->user,
			 strerror(-r));
		return r;
	}
	r = rados_conf_read_file(cl, rb->conf_path);
	if (r < 0) {
		snprintf(err, errlen, "%s: cannot parse the Ceph configuration %s: %s", rb->spec,
			 rb->conf_path, strerror(-r));
		goto fail;
	}
	if (nth)
		admin_socket_suffix(cl, nth);
	char t[16];
	snprintf(t, sizeof(t), "%u", rb->op_timeout_s);
	/* durability: no write-back cache in librbd; a lost cluster: errors, not hangs */
	if ((r = conf_set(rb, cl, "rbd_cache", "false", err, errlen)) < 0 ||
	    (r = conf_set(rb, cl, "rados_osd_op_timeout", t, err, errlen)) < 0 ||
	    (r = conf_set(rb, cl, "rados_mon_op_timeout", t, err, errlen)) < 0 ||
	    (r = conf_set(rb, cl, "client_mount_timeout", t, err, errlen)) < 0 ||
	    /* UNMAP must really zero partial objects (reads after it return zeroes) */
	    (r = conf_set(rb, cl, "rbd_skip_partial_discard", "false", err, errlen)) < 0)
		goto fail;
	r = rados_connect(cl);
	if (r < 0) {
		snprintf(err, errlen,
			 "%s: cannot connect to the Ceph cluster of %s as client.%s: %s; check that the "
			 "monitors in its mon host are up and the keyring it names is readable",
			 rb->spec, rb->conf_path, rb->user, strerror(-r));
		goto fail;
	}
	*out = cl;
	return 0;
fail:
	rados_shutdown(cl);
	return r;
}

/*
 * A reference on rb's cluster's current client, connecting one when there
 * is none or the current one is stale (or known fenced). A connect can
 * take the whole mount timeout when the cluster is down: a reconnect
 * (stale set: a service step) does not queue behind one under way, nor
 * try again within RBD_CONNECT_HOLDOFF_MS of one that failed, so a lost
 * cluster holds one service thread, not one per image (-EINPROGRESS: try
 * again in a moment). An open (the main thread) waits its turn.
 */
static int client_get(struct rbd_bdev *rb, struct rbd_client *stale, struct rbd_client **out, char *err,
		      size_t errlen)
{
	struct rbd_cluster *rc = rc_of(rb);
	if (!stale) {
		pthread_mutex_lock(&rc->connect_mu);
	} else if (pthread_mutex_trylock(&rc->connect_mu) != 0) {
		snprintf(err, errlen, "%s: another image is connecting a fresh client", rb->spec);
		return -EINPROGRESS;
	}
	pthread_mutex_lock(&reg_mu);
	struct rbd_client *c = rc->cur;
	if (c && (c == stale || atomic_load(&c->fenced))) {
		rc->cur = NULL; /* its users keep it until they leave it */
		c = NULL;
	}
	if (c)
		c->refs++;
	pthread_mutex_unlock(&reg_mu);
	if (!c && stale && rc->failed_at && now_ms() - rc->failed_at < RBD_CONNECT_HOLDOFF_MS) {
		snprintf(err, errlen, "%s (%llu ms ago)", rc->failed_msg,
			 (unsigned long long)(now_ms() - rc->failed_at));
		int r = rc->failed_err;
		pthread_mutex_unlock(&rc->connect_mu);
		return r;
	}
	if (!c) {
		c = calloc(1, sizeof(*c));
		int r = c ? client_connect(rb, rc->made++, &c->cl, err, errlen) : -ENOMEM;
		if (r < 0) {
			if (!c)
				snprintf(err, errlen, "%s: out of memory", rb->spec);
			free(c);
			rc->failed_at = now_ms();
			rc->failed_err = r;
			snprintf(rc->failed_msg, sizeof(rc->failed_msg), "%s", err);
			pthread_mutex_unlock(&rc->connect_mu);
			return r;
		}
		rc->failed_at = 0;
		c->rc = rc;
		c->refs = 1;
		atomic_init(&c->fenced, false);
		pthread_mutex_lock(&reg_mu);
		rc->cur = c;
		rc->clients++;
		pthread_mutex_unlock(&reg_mu);
	}
	pthread_mutex_unlock(&rc->connect_mu);
	*out = c;
	return 0;
}

int rbd_handles_open(struct rbd_bdev *rb, struct rbd_client *stale, struct rbd_handles *h,
		     uint64_t *size, char *err, size_t errlen)
{
	memset(h, 0, sizeof(*h));
	int r = client_get(rb, stale, &h->client, err, errlen);
	if (r < 0) {
		h->client = NULL;
		return r;
	}
	h->cluster = h->client->cl;
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
	rbd_handles_close(h);
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
	rbd_handles_close(h);
	free(h);
}

int rbd_reopen(struct rbd_bdev *rb, bool (*cancelled)(void *arg), void *arg, char *err, size_t errlen)
{
	struct rbd_handles nh;
	uint64_t size;
	int r = rbd_handles_open(rb, rb->client, &nh, &size, err, errlen);
	if (r < 0)
		return r;
	struct rbd_handles *old = malloc(sizeof(*old));
	if (!old) {
		rbd_handles_close(&nh);
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
			rbd_handles_close(&nh);
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
	old->client = rb->client;
	old->cluster = rb->cluster;
	old->ioctx = rb->ioctx;
	old->image = rb->image;
	pthread_mutex_lock(&reg_mu); /* rbd_client_fenced reads other images' client */
	__atomic_store_n(&rb->client, nh.client, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&reg_mu);
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
	rbd_shared_moved(rb, true); /* before the lock work says STANDBY again */

	unsigned wait_s = rb->op_timeout_s + 5;
	if (!rbd_run_bounded(handles_close_free, old, wait_s))
		log_warn("%s: the fenced client did not close within %u s; left behind", rb->spec, wait_s);
	(void)size;
	return 0;
}
