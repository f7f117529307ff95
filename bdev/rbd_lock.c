/*
 * rbd_lock.c - ownership of an RBD image (bdev.h "Ownership", rbd.h): the
 * image's exclusive lock, a generation kept in the image, and the state the
 * layers above (cache volume, SCSI LU and its implicit ALUA) read.
 *
 * The image's lock work does every blocking librbd call, in steps on
 * rbd_service.c's threads (rbd_lock_step; one step of an image at a time,
 * and a wait, such as a takeover's for the old holder's lease, is a due
 * time, not a thread held). It
 *  - takes the lock when asked (acquire(), or at the first listen() for a
 *    LUN only this gateway exports): the lock of the current holder is
 *    broken first (rbd_lock_break blocklists that client, so it can write
 *    nothing more), then rbd_lock_acquire in exclusive mode. Once held,
 *    the metadata key tiercache.owner = "GEN TPG GATEWAY" is read and
 *    written back with GEN + 1, our port group and our gateway id: every
 *    gain bumps the generation, and every gateway can tell who gained
 *    last. The listener runs (the cache drops what it must) while the
 *    state still reads TRANSITION; OWNED is published after it returns.
 *  - polls about every second: while OWNED, that librbd still says we own
 *    the lock (rbd_is_exclusive_lock_owner; blocklisted or broken: drop to
 *    STANDBY, or LOST when the cluster refuses or cannot be reached); and
 *    the owner key, so REPORT TARGET PORT GROUPS names the active group.
 *
 * The stale window of a gateway whose lock was broken while it lived: its
 * writes and cache misses fail as soon as the OSDs have the blocklist
 * (librbd's break waits for the new OSD map before the new owner writes,
 * so no old write lands after a new one). Reads that hit its NVMe cache do
 * not touch the cluster, so ownership is a lease: the owner serves media
 * commands only until RBD_LEASE_MS after it sent the last poll that found
 * it still the holder (state() says TRANSITION after that: NOT READY,
 * retried), and a gateway that broke another's lock waits
 * RBD_TAKEOVER_WAIT_MS after the break before it serves. Every poll the
 * old owner sent after the break failed, so its lease ran out before the
 * new owner's first write: a host still on the old path (or one the old
 * gateway is cut off from the cluster for, its polls hanging) never reads
 * there what the new owner has overwritten. The cost: a takeover of a
 * held lock takes RBD_TAKEOVER_WAIT_MS longer, and an owner whose polls
 * stall for RBD_LEASE_MS (the cluster that slow) answers NOT READY until
 * one gets through.
 *
 * A fenced gateway recovers by itself. When the lock work finds its
 * client blocklisted (a call returns -ESHUTDOWN, librados' EBLOCKLISTED; or
 * the lock we held was broken, which librbd's break does by blocklisting
 * the holder; or the data path, or another image on the same shared
 * client, saw -ESHUTDOWN), an image it did not own reports LOST (media
 * commands get NOT READY, LU not accessible) and ignores acquire(); one
 * it owned reports TRANSITION (NOT READY, retried). Then rbd_client.c's
 * rbd_reopen opens the image on a fresh client (a new address: the
 * blocklist entry names the old one) and hands the I/O path over to it
 * once the requests still on the old client finished or were parked
 * (rbd_int.h "Handle handoff", rbd_io.c "Parking"). An image we owned
 * whose lock our old client still holds is owned again at once (reown:
 * nobody took it, since a takeover breaks that lock first). Otherwise the
 * owner key is read again and the state goes back to STANDBY: ALUA
 * active/non-optimized, and a host's I/O takes the image over as before (a
 * gain on the new client, with the cache volume's usual drop unless the
 * generation says nobody else owned it). A failed reconnect (cluster down)
 * is retried with a backoff of 1 s doubling up to 30 s, LOST meanwhile.
 *
 * Locking: lk->mu guards the request flags, the reconnect schedule and the
 * listener; lk->op_mu serializes the blocking librbd calls on the handles
 * (the lock work's) with the swap of the handles, which the lock work does under it. Order:
 * op_mu before mu. The state, generation and owner group are atomics read
 * lock-free by any thread.
 */
#include "bdev/rbd_int.h"

#include "common/log.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define RBD_LOCK_POLL_MS 1000
#define RBD_LEASE_MS 3000          /* from the send of a poll that found us the holder */
#define RBD_TAKEOVER_WAIT_MS 3500  /* after breaking another's lock: its lease runs out */
#define RBD_SIBLING_RETRY_MS 100    /* held by another LUN of ours on the image: look again */
#define RBD_SIBLING_MAX_MS 60000    /* ... for this long (a reload's drain is 30 s), then standby */
#define RBD_RECONNECT_MIN_MS 1000
#define RBD_RECONNECT_MAX_MS 30000
#define RBD_OWNER_KEY "tiercache.owner"
#define RBD_OWNER_GW_KEY "tiercache.owner_gateways"

struct rbd_lock {
	struct rbd_bdev *rb;
	pthread_mutex_t mu;
	pthread_mutex_t op_mu;      /* librbd calls on the handles vs their swap */
	bool want_acquire;          /* under mu */
	bool sibling_wait;          /* under mu: another handle of ours holds the lock (take_lock) */
	uint64_t sibling_at;        /* under mu: now_ms() of the next take_lock then */
	uint64_t sibling_since;     /* under mu: now_ms() when that wait began (0: since the request) */
	bool stopping;              /* under mu */
	bool reconnecting;          /* under mu: fenced, a fresh client is due */
	bool reown;                 /* under mu: we owned the image when the fence was noticed */
	char fence_addrs[512];      /* lock work: the fenced client's addresses (for reown) */
	bool taking;                /* under op_mu: the lock is ours, serving waits for serve_at */
	uint64_t serve_at;          /* under op_mu: now_ms() when the old holder's lease is out */
	uint64_t next_try_ms;       /* under mu: now_ms() of the next reconnect */
	unsigned backoff_ms;        /* under mu: the delay after the next failure */
	void (*fn)(void *arg, const struct bdev_owner_change *c); /* under mu */
	void *arg;
	/* configuration (bdev_rbd_set_gateway, before listen) */
	unsigned gateways;
	uint32_t port_group;
	char gw_id[RBD_GW_ID_MAX];
	/* published */
	_Atomic int state;          /* enum bdev_owner_state */
	_Atomic uint64_t gen;
	_Atomic uint32_t owner_group;
	_Atomic uint64_t owner_gen;  /* generation in the key as last read */
	/* the key as last read names another gateway that ran the image as its
	 * only gateway (gateways = 1): it may keep write-back data of it in its
	 * own cache, so a LUN of several gateways here neither reads past it
	 * nor takes the image from it (read_owner) */
	atomic_bool key_single_other;
	bool mode_read;             /* under op_mu: read_owner_mode looked at mode_gen */
	uint64_t mode_gen;
	_Atomic uint64_t lease_until; /* now_ms() until which OWNED may serve (see the top) */
	uint64_t next_poll_ms;      /* lock work: when the next poll is due */
};

static struct rbd_lock *lock_of(struct bdev *dev)
{
	return rbd_bdev_of(dev)->lock;
}

static bool err_fenced(int r)
{
	/* librados reports a blocklisted client as -ESHUTDOWN */
	return r == -ESHUTDOWN || r == -ENOTCONN || r == -ETIMEDOUT;
}

/* Parse "GEN TPG GATEWAY" (any field may be missing in a damaged key). */
static void parse_owner(const char *s, uint64_t *gen, uint32_t *tpg, char *id, size_t idlen)
{
	unsigned long long g = 0;
	unsigned t = 0;
	int n = 0;

	*gen = 0;
	*tpg = 0;
	id[0] = '\0';
	if (sscanf(s, "%llu %u %n", &g, &t, &n) >= 2) {
		*gen = g;
		*tpg = t;
		if (n > 0)
			snprintf(id, idlen, "%s", s + n);
	}
}

/* Read the owner key; 0 (missing key: generation 0) or -errno. */
static int read_owner(struct rbd_lock *lk, uint64_t *gen, uint32_t *tpg, char *id, size_t idlen)
{
	char buf[64 + RBD_GW_ID_MAX];
	size_t len = sizeof(buf) - 1;
	int r = rbd_metadata_get(lk->rb->image, RBD_OWNER_KEY, buf, &len);

	if (r == -ENOENT) {
		*gen = 0;
		*tpg = 0;
		id[0] = '\0';
		return 0;
	}
	if (r < 0)
		return r;
	buf[len < sizeof(buf) ? len : sizeof(buf) - 1] = '\0';
	parse_owner(buf, gen, tpg, id, idlen);
	return 0;
}

/*
 * A LUN of several gateways: is the image's last owner (generation gen,
 * gateway id, as read from the owner key) another gateway that ran it as
 * its only gateway? That count is kept in its own key, RBD_OWNER_GW_KEY
 * ("GEN GATEWAYS", written before the owner key and trusted only for the
 * same generation), so that the owner key keeps the format older releases
 * read. Sets key_single_other, and says why the first time it is set.
 * Read again only when the generation moves. 0 or -errno (lock work, or
 * the main thread at listen, op_mu held).
 */
static int read_owner_mode(struct rbd_lock *lk, uint64_t gen, const char *id)
{
	if (lk->gateways <= 1)
		return 0;
	if (lk->mode_read && gen == lk->mode_gen)
		return 0;
	bool single = false;
	if (gen && id[0] && strcmp(id, lk->gw_id) != 0) {
		char buf[64];
		size_t len = sizeof(buf) - 1;
		int r = rbd_metadata_get(lk->rb->image, RBD_OWNER_GW_KEY, buf, &len);
		if (r < 0 && r != -ENOENT)
			return r;
		unsigned long long g = 0;
		unsigned n = 0;
		if (r == 0) {
			buf[len < sizeof(buf) ? len : sizeof(buf) - 1] = '\0';
			single = sscanf(buf, "%llu %u", &g, &n) == 2 && g == gen && n == 1;
		}
	}
	lk->mode_read = true;
	lk->mode_gen = gen;
	if (!atomic_exchange(&lk->key_single_other, single) && single)
		log_err("%s: gateway %s runs this image as its only gateway (gateways = 1) and may keep "
			"write-back data of it in its cache; this LUN (gateways = %u) neither takes it nor reads "
			"past it (NOT READY). Give the LUN the same gateways on every gateway; once %s has "
			"flushed its cache or is gone for good, `rbd image-meta remove %s/%s %s` lifts this",
			lk->rb->spec, id, lk->gateways, id, lk->rb->pool, lk->rb->image_name, RBD_OWNER_KEY);
	return 0;
}

/* The owner key, then (several gateways) what its owner ran it as; id has
 * RBD_GW_ID_MAX bytes. 0 or -errno. */
static int read_owner_both(struct rbd_lock *lk, uint64_t *gen, uint32_t *tpg, char *id)
{
	int r = read_owner(lk, gen, tpg, id, RBD_GW_ID_MAX);
	return r < 0 ? r : read_owner_mode(lk, *gen, id);
}

/* Tell the listener (from the lock work). */
static void notify(struct rbd_lock *lk, const struct bdev_owner_change *c)
{
	void (*fn)(void *, const struct bdev_owner_change *);
	void *arg;

	pthread_mutex_lock(&lk->mu);
	fn = lk->fn;
	arg = lk->arg;
	pthread_mutex_unlock(&lk->mu);
	if (fn)
		fn(arg, c);
}

static void set_state(struct rbd_lock *lk, enum bdev_owner_state st, bool announce)
{
	int old = atomic_exchange(&lk->state, (int)st);
	if (announce && old != (int)st) {
		struct bdev_owner_change c = { .state = st, .gen = atomic_load(&lk->gen) };
		notify(lk, &c);
	}
}

/*
 * Our client is fenced (any thread, op_mu held or not): LOST, acquire()
 * ignored, and the lock work connects a fresh client (try_reconnect).
 */
static void fence_noticed(struct rbd_lock *lk, const char *why, bool blocklisted)
{
	bool reown = atomic_load(&lk->state) == BDEV_OWNER_OWNED;
	pthread_mutex_lock(&lk->mu);
	bool first = !lk->reconnecting;
	if (first) {
		lk->reconnecting = true;
		lk->reown = reown;
		lk->next_try_ms = 0;
		lk->backoff_ms = RBD_RECONNECT_MIN_MS;
	}
	lk->want_acquire = false;
	lk->sibling_wait = false;
	lk->sibling_since = 0;
	pthread_mutex_unlock(&lk->mu);
	if (!first)
		return;
	/* the lock our client holds is what reown looks for (the handles are
	 * the lock work's own) */
	char *a = NULL;
	lk->fence_addrs[0] = '\0';
	if (rados_getaddrs(lk->rb->cluster, &a) == 0 && a)
		snprintf(lk->fence_addrs, sizeof(lk->fence_addrs), "%s", a);
	free(a);
	/* the client is shared: when Ceph said so, the other images on it
	 * move too (a lock found broken alone does not move them: each finds
	 * out on its own at its next call if the client really is fenced) */
	if (blocklisted)
		rbd_client_fenced(lk->rb);
	if (reown) {
		/* not serving from here (a takeover elsewhere may be under way);
		 * try_reconnect owns the image again when nobody took it */
		log_warn("%s: this gateway's Ceph client is fenced (%s); the LUN waits for a fresh "
			 "client and is owned again on it unless another gateway took it", lk->rb->spec, why);
		set_state(lk, BDEV_OWNER_TRANSITION, true);
		return;
	}
	log_err("%s: this gateway's Ceph client is fenced (%s); the LUN is unavailable here until a "
		"fresh client is connected", lk->rb->spec, why);
	atomic_store(&lk->owner_group, 0);
	set_state(lk, BDEV_OWNER_LOST, true);
}

/* A librbd call of take_lock failed with r: fenced, LOST or STANDBY. */
static void take_failed(struct rbd_lock *lk, int r)
{
	if (r == -ESHUTDOWN)
		fence_noticed(lk, "blocklisted", true);
	else
		set_state(lk, err_fenced(r) ? BDEV_OWNER_LOST : BDEV_OWNER_STANDBY, true);
}

static int holder_is_us(struct rbd_bdev *rb);
static bool owner_is(const char *owner, const char *addrs);

static void take_finish(struct rbd_lock *lk);

/*
 * A LUN of several gateways does not take an image that another gateway
 * last owned as its only gateway (the key says gateways = 1): that one may
 * keep write-back data of the image in its own cache, which taking the
 * image (or reading Ceph past it) would lose or miss. The configurations
 * disagree; standby until they match. false after saying so (lock work,
 * op_mu held).
 */
static bool single_owner_ok(struct rbd_lock *lk)
{
	uint64_t g;
	uint32_t tpg;
	char id[RBD_GW_ID_MAX];
	int r = read_owner_both(lk, &g, &tpg, id);
	if (r < 0) {
		log_err("%s: cannot read the image's owner key: %s", lk->rb->spec, strerror(-r));
		take_failed(lk, r);
		return false;
	}
	if (!atomic_load(&lk->key_single_other))
		return true;
	take_failed(lk, -EBUSY); /* read_owner_mode said why */
	return false;
}

/*
 * Take the lock (a service step, op_mu held; for a single-gateway LUN the
 * first listen asks for it). The state reads TRANSITION throughout.
 * When another held it, its lease must run out before we serve: then the
 * lock is ours with taking set, and take_finish is due at serve_at (the
 * service step waits for it without holding a thread).
 */
static void take_lock(struct rbd_lock *lk)
{
	struct rbd_bdev *rb = lk->rb;
	int owner = 0;
	bool held_before = false; /* someone else held the lock, or we could not tell */
	int r = rbd_is_exclusive_lock_owner(rb->image, &owner);

	atomic_store(&lk->state, BDEV_OWNER_TRANSITION);
	if (r < 0) {
		log_err("%s: cannot query the image's lock: %s", rb->spec, strerror(-r));
		take_failed(lk, r);
		return;
	}
	if (!owner && lk->gateways > 1 && !single_owner_ok(lk))
		return;
	if (!owner) {
		rbd_lock_mode_t mode;
		char *owners[4];
		size_t n = 4;
		r = rbd_lock_get_owners(rb->image, &mode, owners, &n);
		char *mine = NULL;
		bool sibling = r == 0 && n > 0 && rbd_other_open(rb) &&
			       rados_getaddrs(rb->cluster, &mine) == 0 && owner_is(owners[0], mine);
		free(mine);
		if (sibling) {
			/* Held through our own client by another open handle of
			 * the image: a LUN that a reload is replacing (it opens
			 * the new LUN before it closes the old one). Breaking it
			 * would blocklist our client and fence every image on it
			 * (librbd refuses to anyway). TRANSITION until that LUN
			 * lets go; standby if it has not within a minute (a host's
			 * next write asks again). */
			rbd_lock_get_owners_cleanup(owners, n);
			uint64_t now = now_ms();
			pthread_mutex_lock(&lk->mu);
			if (!lk->sibling_since) {
				lk->sibling_since = now;
				log_info("%s: the lock is held by another LUN of this gateway on the image (a "
					 "reload replacing it); taken once that one lets go", rb->spec);
			}
			bool give_up = now - lk->sibling_since >= RBD_SIBLING_MAX_MS;
			lk->sibling_wait = !give_up;
			lk->sibling_at = now + RBD_SIBLING_RETRY_MS;
			if (give_up)
				lk->sibling_since = 0;
			pthread_mutex_unlock(&lk->mu);
			if (give_up) {
				log_warn("%s: another LUN of this gateway still holds the image's lock after %u s; "
					 "standby", rb->spec, RBD_SIBLING_MAX_MS / 1000);
				take_failed(lk, -EBUSY);
			}
			return;
		}
		if (r == 0 && n > 0) {
			/* The holder is taken to be gone: a host sends I/O here only
			 * after its path to the owner failed. Breaking blocklists it.
			 * (Whether our break or a third gateway's got it, it was
			 * held: the wait below is due either way.) */
			held_before = true;
			log_warn("%s: breaking the lock of %s (blocklisting it) to take over", rb->spec, owners[0]);
			int b = rbd_lock_break(rb->image, mode, owners[0]);
			if (b < 0 && b != -ENOENT)
				log_warn("%s: breaking the lock of %s failed: %s", rb->spec, owners[0], strerror(-b));
			rbd_lock_get_owners_cleanup(owners, n);
		} else if (r < 0 && r != -ENOENT) {
			held_before = true; /* cannot tell: as if held */
			log_warn("%s: cannot list the lock's owners: %s", rb->spec, strerror(-r));
		}
		r = rbd_lock_acquire(rb->image, RBD_LOCK_MODE_EXCLUSIVE);
		if (r < 0) {
			log_err("%s: cannot take the image's exclusive lock: %s%s", rb->spec, strerror(-r),
				r == -EINVAL ? "; enable it with `rbd feature enable POOL/IMAGE exclusive-lock`" : "");
			take_failed(lk, r);
			return;
		}
	}

	if (held_before) {
		/* the old holder may still serve reads from its cache until its
		 * lease runs out: counted from now, when the lock is ours (the
		 * break, ours or another's, came before) */
		log_info("%s: waiting %u ms for the old holder's lease to run out before serving", rb->spec,
			 RBD_TAKEOVER_WAIT_MS);
		lk->serve_at = now_ms() + RBD_TAKEOVER_WAIT_MS;
		lk->taking = true;
		return;
	}
	take_finish(lk);
}

/* The lock is ours and no other holder's lease can run: bump the
 * generation, tell the layers above, serve (op_mu held). */
static void take_finish(struct rbd_lock *lk)
{
	struct rbd_bdev *rb = lk->rb;
	int r;

	lk->taking = false;
	/* held: bump the generation in the image */
	uint64_t prev_gen;
	uint32_t prev_tpg;
	char prev_id[RBD_GW_ID_MAX];
	r = read_owner(lk, &prev_gen, &prev_tpg, prev_id, sizeof(prev_id));
	/* a single gateway that took the image since single_owner_ok looked:
	 * give the lock back rather than serve over it (several gateways only) */
	if (r == 0) {
		r = read_owner_mode(lk, prev_gen, prev_id);
		if (r == 0 && atomic_load(&lk->key_single_other)) {
			rbd_lock_release(rb->image);
			take_failed(lk, -EBUSY);
			return;
		}
	}
	char val[64 + RBD_GW_ID_MAX];
	uint64_t gen = prev_gen + 1;
	if (r == 0) {
		/* the count first: a reader trusts it only for the owner key's generation */
		snprintf(val, sizeof(val), "%" PRIu64 " %u", gen, lk->gateways);
		r = rbd_metadata_set(rb->image, RBD_OWNER_GW_KEY, val);
	}
	if (r == 0) {
		snprintf(val, sizeof(val), "%" PRIu64 " %u %s", gen, lk->port_group, lk->gw_id);
		r = rbd_metadata_set(rb->image, RBD_OWNER_KEY, val);
	}
	if (r < 0) {
		log_err("%s: cannot record the owner generation in the image (%s); giving the lock back",
			rb->spec, strerror(-r));
		rbd_lock_release(rb->image);
		take_failed(lk, r);
		return;
	}
	atomic_store(&lk->gen, gen);
	atomic_store(&lk->owner_gen, gen);
	atomic_store(&lk->owner_group, lk->port_group);
	struct bdev_owner_change c = {
		.state = BDEV_OWNER_OWNED,
		.gen = gen,
		.prev_gen = prev_gen,
		.prev_owner_us = prev_gen > 0 && !strcmp(prev_id, lk->gw_id),
	};
	log_info("%s: this gateway (port group %u) owns the image now, generation %" PRIu64
		 " (previous %" PRIu64 " by %s)", rb->spec, lk->port_group, gen, prev_gen,
		 prev_gen ? (c.prev_owner_us ? "this gateway" : prev_id) : "nobody");
	/* the layers above drop stale copies while the state reads TRANSITION */
	notify(lk, &c);
	/* our own lease starts with a look that finds us the holder, sent
	 * now: just before serving, so slow work above does not eat it */
	uint64_t sent = now_ms();
	int h = holder_is_us(rb);
	if (h != 1) {
		log_err("%s: the image's lock is not ours right after taking it (%s)", rb->spec,
			h < 0 ? strerror(-h) : "another gateway holds it");
		if (h == 0)
			rbd_lock_release(rb->image);
		take_failed(lk, h < 0 ? h : -EBUSY);
		return;
	}
	atomic_store(&lk->lease_until, sent + RBD_LEASE_MS);
	atomic_store(&lk->state, BDEV_OWNER_OWNED);
}

/*
 * Does the cluster still list this client as the lock's holder? 1 yes, 0 no
 * (broken by another gateway), or -errno (-ESHUTDOWN: we are blocklisted).
 * A round trip to the image's header object: librbd's own idea of holding
 * the lock (rbd_is_exclusive_lock_owner) is local and learns of a break
 * only when its watch fails, seconds later.
 */
/* Is the lock owner (a client address "IP:PORT/NONCE") the client whose
 * addresses are addrs (possibly a vector "[v2:IP:PORT/NONCE,...]")? The
 * nonces are compared. */
static bool owner_is(const char *owner, const char *addrs)
{
	const char *slash = strrchr(owner, '/');
	if (!slash || !addrs)
		return false;
	size_t l = strlen(slash);
	for (const char *p = strstr(addrs, slash); p; p = strstr(p + 1, slash))
		if (p[l] == '\0' || p[l] == ',' || p[l] == ']')
			return true;
	return false;
}

static int holder_is_us(struct rbd_bdev *rb)
{
	rbd_lock_mode_t mode;
	char *owners[4];
	size_t n = 4;
	int r = rbd_lock_get_owners(rb->image, &mode, owners, &n);
	if (r == -ENOENT)
		return 0;
	if (r < 0)
		return r;
	char *mine = NULL;
	int us = n > 0 && rados_getaddrs(rb->cluster, &mine) == 0 && owner_is(owners[0], mine);
	free(mine);
	rbd_lock_get_owners_cleanup(owners, n);
	return us;
}

/*
 * After a fence, on the fresh client (lock work, op_mu held): was the
 * image still locked by our old client (addresses old_addrs)? Then nobody
 * took it since (a takeover breaks that lock first), so take it over from
 * our old self at once: no lease to wait out (ours stopped when the fence
 * was noticed) and no new generation (the cache holds nothing anyone else
 * overwrote). true when owned again; false leaves the lock alone, or gives
 * it back.
 */
static bool reown(struct rbd_lock *lk, const char *old_addrs)
{
	struct rbd_bdev *rb = lk->rb;
	rbd_lock_mode_t mode;
	char *owners[4];
	size_t n = 4;
	int r = rbd_lock_get_owners(rb->image, &mode, owners, &n);
	if (r < 0 || n == 0) {
		log_info("%s: the image's lock is %s; not owning it again", rb->spec,
			 r < 0 && r != -ENOENT ? strerror(-r) : "free (another gateway broke ours)");
		return false;
	}
	bool ours = owner_is(owners[0], old_addrs);
	if (ours) {
		r = rbd_lock_break(rb->image, mode, owners[0]);
		if (r == -ENOENT)
			r = 0;
	}
	if (!ours)
		log_info("%s: %s holds the image's lock now; standby here", rb->spec, owners[0]);
	rbd_lock_get_owners_cleanup(owners, n);
	if (!ours)
		return false;
	if (r == 0)
		r = rbd_lock_acquire(rb->image, RBD_LOCK_MODE_EXCLUSIVE);
	bool acquired = r == 0;
	uint64_t g = 0;
	uint32_t tpg = 0;
	char id[RBD_GW_ID_MAX] = "";
	if (r == 0)
		r = read_owner(lk, &g, &tpg, id, sizeof(id));
	if (r == 0 && (g != atomic_load(&lk->gen) || strcmp(id, lk->gw_id))) {
		log_err("%s: the owner key says generation %" PRIu64 " by %s, not ours (%" PRIu64 "); "
			"giving the lock back", rb->spec, g, id, atomic_load(&lk->gen));
		rbd_lock_release(rb->image);
		return false;
	}
	uint64_t sent = now_ms();
	int h = r == 0 ? holder_is_us(rb) : r;
	if (h != 1) {
		log_err("%s: cannot own the image again on the fresh client (%s)", rb->spec,
			h < 0 ? strerror(-h) : "another gateway took its lock");
		if (acquired) /* not ours to keep while we report STANDBY */
			rbd_lock_release(rb->image);
		return false;
	}
	atomic_store(&lk->owner_gen, g);
	atomic_store(&lk->owner_group, lk->port_group);
	atomic_store(&lk->lease_until, sent + RBD_LEASE_MS);
	/* from TRANSITION silently, as if the fence had not been; from LOST
	 * (reconnects failed meanwhile) as a gain that keeps the cache */
	int was = atomic_exchange(&lk->state, BDEV_OWNER_TRANSITION);
	if (was != BDEV_OWNER_TRANSITION) {
		/* the layers above look while the state still reads TRANSITION */
		struct bdev_owner_change c = { .state = BDEV_OWNER_OWNED, .gen = g, .prev_gen = g,
					       .prev_owner_us = true };
		notify(lk, &c);
	}
	atomic_store(&lk->state, BDEV_OWNER_OWNED);
	log_info("%s: owned again on the fresh client, generation %" PRIu64 " (nobody took it)", rb->spec, g);
	return true;
}

/* One poll: still the owner? who owns it? (lock work, op_mu held) */
static void poll_once(struct rbd_lock *lk)
{
	struct rbd_bdev *rb = lk->rb;
	enum bdev_owner_state st = (enum bdev_owner_state)atomic_load(&lk->state);

	while (rbd_test_stalled(rb)) { /* tests: a poll that hangs */
		pthread_mutex_lock(&lk->mu);
		bool stop = lk->stopping;
		pthread_mutex_unlock(&lk->mu);
		if (stop)
			return;
		usleep(50000);
	}
	if (st == BDEV_OWNER_OWNED) {
		int owner = 0;
		uint64_t sent = now_ms();
		int r = rbd_is_exclusive_lock_owner(rb->image, &owner);
		if (r == 0 && owner) {
			int h = holder_is_us(rb);
			if (h == 0)
				owner = 0;
			else if (h == -ESHUTDOWN)
				r = h;
			else if (h == 1)
				atomic_store(&lk->lease_until, sent + RBD_LEASE_MS);
			/* other errors (a slow cluster): the data path's state decides, and the lease runs down */
		}
		if (r < 0 || !owner || atomic_load(&rb->conn) == BDEV_RBD_LOST) {
			log_err("%s: this gateway lost the image's lock (%s); serving stops here",
				rb->spec, r < 0 ? strerror(-r) : !owner ? "another gateway broke it" : "cluster lost");
			/* not us any more; who, the next read of the key tells (if it still can) */
			atomic_store(&lk->owner_group, 0);
			/* a broken lock means a blocklisted client: librbd's break blocklists
			 * the holder (reconnecting a client that was not is harmless) */
			if (r == -ESHUTDOWN || (r == 0 && !owner) || atomic_load(&rb->fenced)) {
				bool certain = r == -ESHUTDOWN || atomic_load(&rb->fenced);
				fence_noticed(lk, r == -ESHUTDOWN ? "blocklisted" : !owner ? "lock broken"
												: "I/O blocklisted",
					      certain);
				return;
			}
			set_state(lk, r < 0 && err_fenced(r) ? BDEV_OWNER_LOST : BDEV_OWNER_STANDBY, true);
		}
	}
	uint64_t g;
	uint32_t tpg;
	char id[RBD_GW_ID_MAX];
	int r = read_owner_both(lk, &g, &tpg, id);
	if (r == -ESHUTDOWN)
		fence_noticed(lk, "blocklisted", true);
	if (r < 0)
		return;
	uint32_t old_tpg = atomic_exchange(&lk->owner_group, tpg);
	uint64_t old_gen = atomic_exchange(&lk->owner_gen, g);
	if (old_tpg != tpg || old_gen != g) {
		st = (enum bdev_owner_state)atomic_load(&lk->state);
		if (st == BDEV_OWNER_TRANSITION)
			return;
		/* someone else gained: hosts should look at the groups again */
		struct bdev_owner_change c = { .state = st, .gen = atomic_load(&lk->gen) };
		notify(lk, &c);
	}
}

/* rbd_reopen's cancel test: the lock is stopping. */
static bool lk_stopping(void *arg)
{
	struct rbd_lock *lk = arg;
	pthread_mutex_lock(&lk->mu);
	bool s = lk->stopping;
	pthread_mutex_unlock(&lk->mu);
	return s;
}

/* Fenced: connect a fresh client and go back to STANDBY (lock work, op_mu held). */
static void try_reconnect(struct rbd_lock *lk)
{
	struct rbd_bdev *rb = lk->rb;
	char err[1024];
	uint64_t g = 0;
	uint32_t tpg = 0;
	char id[RBD_GW_ID_MAX];

	log_info("%s: opening the image on a fresh Ceph client", rb->spec);
	int r = rbd_reopen(rb, lk_stopping, lk, err, sizeof(err));
	if (r == 0) {
		r = read_owner(lk, &g, &tpg, id, sizeof(id));
		if (r == -ESHUTDOWN) {
			snprintf(err, sizeof(err), "%s: the fresh client is blocklisted too", rb->spec);
			rbd_client_fenced(rb); /* the next try, and the other images, get another */
		} else {
			r = 0; /* a slow cluster: the polls read the owner later */
		}
	}
	if (r == -ECANCELED)
		return;
	if (r == -EINPROGRESS) {
		/* another image is connecting the fresh client: ours is that one,
		 * in a moment (no failure: nothing changes meanwhile) */
		pthread_mutex_lock(&lk->mu);
		lk->next_try_ms = now_ms() + 20;
		pthread_mutex_unlock(&lk->mu);
		return;
	}
	if (r < 0) {
		/* held requests get BUSY: the host retries */
		rbd_unpark(rb, false, false, -ENOTCONN, NULL);
		/* an image we owned: unavailable meanwhile, like the others (and
		 * owned again later if our old client still holds its lock) */
		if (atomic_load(&lk->state) == BDEV_OWNER_TRANSITION) {
			atomic_store(&lk->owner_group, 0);
			set_state(lk, BDEV_OWNER_LOST, true);
		}
		pthread_mutex_lock(&lk->mu);
		unsigned delay = lk->backoff_ms;
		lk->next_try_ms = now_ms() + delay;
		lk->backoff_ms = delay * 2 > RBD_RECONNECT_MAX_MS ? RBD_RECONNECT_MAX_MS : delay * 2;
		pthread_mutex_unlock(&lk->mu);
		log_warn("%s; the LUN stays unavailable on this gateway, next try in %u s", err,
			 (delay + 999) / 1000);
		return;
	}
	pthread_mutex_lock(&lk->mu);
	bool was_owner = lk->reown;
	pthread_mutex_unlock(&lk->mu);
	bool owned = was_owner && reown(lk, lk->fence_addrs);
	if (!owned) {
		atomic_store(&lk->owner_gen, g);
		atomic_store(&lk->owner_group, tpg);
		log_info("%s: reconnected with a fresh Ceph client; standby again (the image's owner is "
			 "port group %u)", rb->spec, tpg);
		/* STANDBY first, then acquire() is heard again */
		set_state(lk, BDEV_OWNER_STANDBY, true);
	}
	/* what the fence failed or held: again on the fresh client where that
	 * is still right (writes only while we own the image, reads of one we
	 * did not own, or still own), failed otherwise (NOT READY: the host
	 * goes to the owner's path) */
	unsigned nw = 0, n = rbd_unpark(rb, owned, owned || !was_owner, -ESHUTDOWN, &nw);
	if (n)
		log_info("%s: %u request(s) the fence held were sent again on the fresh client (%u write(s) "
			 "or flush(es))", rb->spec, n, nw);
	pthread_mutex_lock(&lk->mu);
	lk->reconnecting = false;
	lk->reown = false;
	lk->backoff_ms = RBD_RECONNECT_MIN_MS;
	pthread_mutex_unlock(&lk->mu);
}

/* A service step, mu held: run op under op_mu, without mu (op_mu comes
 * first in the lock order, and mu is never held across a cluster call). */
static void run_op(struct rbd_lock *lk, void (*op)(struct rbd_lock *lk))
{
	pthread_mutex_unlock(&lk->mu);
	pthread_mutex_lock(&lk->op_mu);
	op(lk);
	pthread_mutex_unlock(&lk->op_mu);
	pthread_mutex_lock(&lk->mu);
}

/* The old holder's lease is out (op_mu held): serve, unless stopping. */
static void take_finish_or_stop(struct rbd_lock *lk)
{
	pthread_mutex_lock(&lk->mu);
	bool stop = lk->stopping;
	pthread_mutex_unlock(&lk->mu);
	if (stop) {
		lk->taking = false;
		rbd_lock_release(lk->rb->image);
		set_state(lk, BDEV_OWNER_STANDBY, false);
		return;
	}
	take_finish(lk);
}

/* One action of the lock work when one is due: returns when the next is
 * due (now or earlier: another may be due at once). */
static uint64_t step_once(struct rbd_lock *lk)
{
	struct rbd_bdev *rb = lk->rb;
	uint64_t now = now_ms(), due;

	pthread_mutex_lock(&lk->op_mu);
	if (lk->taking) {
		/* nothing else until we serve (the state reads TRANSITION) */
		due = lk->serve_at;
		if (now >= due)
			take_finish_or_stop(lk);
		pthread_mutex_unlock(&lk->op_mu);
		return now >= due ? now : due;
	}
	pthread_mutex_unlock(&lk->op_mu);

	pthread_mutex_lock(&lk->mu);
	if (lk->stopping) {
		pthread_mutex_unlock(&lk->mu);
		return UINT64_MAX;
	}
	if (!lk->reconnecting && (atomic_load(&rb->fenced) || rbd_client_is_fenced(rb))) {
		/* the data path, or another image on our client, saw -ESHUTDOWN */
		pthread_mutex_unlock(&lk->mu);
		fence_noticed(lk, "blocklisted (I/O)", true);
		return now;
	}
	if (lk->reconnecting) {
		due = lk->next_try_ms;
		if (now >= due)
			run_op(lk, try_reconnect);
		pthread_mutex_unlock(&lk->mu);
		return now >= due ? now : due;
	}
	if (lk->sibling_wait) {
		due = lk->sibling_at;
		if (now >= due) {
			lk->sibling_wait = false;
			run_op(lk, take_lock);
		}
		pthread_mutex_unlock(&lk->mu);
		return now >= due ? now : due;
	}
	if (lk->want_acquire) {
		lk->want_acquire = false;
		lk->sibling_since = 0; /* a new request: a sibling's wait starts afresh */
		run_op(lk, take_lock);
		pthread_mutex_unlock(&lk->mu);
		return now;
	}
	/* polls by the clock, not by wakeups: the lease is renewed on time */
	due = lk->next_poll_ms;
	if (now >= due) {
		lk->next_poll_ms = due = now + RBD_LOCK_POLL_MS;
		run_op(lk, poll_once);
	}
	pthread_mutex_unlock(&lk->mu);
	return due;
}

uint64_t rbd_lock_step(struct rbd_bdev *rb)
{
	struct rbd_lock *lk = rb->lock;
	for (int round = 0; round < 8; round++) {
		uint64_t due = step_once(lk);
		if (due > now_ms())
			return due;
	}
	return 0; /* more to do: again at once, after the other images' turns */
}

/* ---- bdev_owner_ops ------------------------------------------------------ */

static enum bdev_owner_state rbd_owner_state(struct bdev *dev, uint64_t *gen)
{
	struct rbd_lock *lk = lock_of(dev);
	enum bdev_owner_state st = (enum bdev_owner_state)atomic_load_explicit(&lk->state, memory_order_acquire);
	if (st == BDEV_OWNER_OWNED) {
		/* the lease (see the top): a coarse clock, a few ms early at worst */
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
		uint64_t now = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000 + 10;
		if (now >= atomic_load_explicit(&lk->lease_until, memory_order_relaxed))
			return BDEV_OWNER_TRANSITION;
	}
	if (gen && st == BDEV_OWNER_OWNED)
		*gen = atomic_load_explicit(&lk->gen, memory_order_relaxed);
	return st;
}

static void rbd_owner_acquire(struct bdev *dev)
{
	struct rbd_lock *lk = lock_of(dev);
	int st = atomic_load(&lk->state);

	if (st == BDEV_OWNER_OWNED || st == BDEV_OWNER_TRANSITION)
		return;
	/* declined while another gateway runs the image alone (single_owner_ok;
	 * set only with several gateways; the poll reads the key every second) */
	if (atomic_load(&lk->key_single_other))
		return;
	pthread_mutex_lock(&lk->mu);
	/* fenced: nothing to take until the fresh client is in (LOST stays) */
	bool kick = false;
	if (!lk->reconnecting && !lk->stopping &&
	    atomic_compare_exchange_strong(&lk->state, &st, BDEV_OWNER_TRANSITION)) {
		lk->want_acquire = true;
		kick = true;
	}
	pthread_mutex_unlock(&lk->mu);
	if (kick)
		rbd_service_kick(&lk->rb->svc);
}

static void rbd_owner_listen(struct bdev *dev, void (*fn)(void *arg, const struct bdev_owner_change *c),
			     void *arg)
{
	struct rbd_lock *lk = lock_of(dev);

	pthread_mutex_lock(&lk->mu);
	lk->fn = fn;
	lk->arg = arg;
	pthread_mutex_unlock(&lk->mu);
	/* a LUN only this gateway exports takes the lock now and keeps it.
	 * The lock work takes it, not this thread: after a crash each image
	 * breaks the dead client's lock (a blocklist, a monitor round trip)
	 * and waits out its lease, and the images of a gateway do that side
	 * by side, not one after another. The LUN reads TRANSITION meanwhile;
	 * the daemon waits for them all before it listens. */
	if (lk->gateways <= 1) {
		rbd_owner_acquire(dev);
	} else {
		/* who last owned the image, as this gateway (its id is set now)
		 * sees it: not past a gateway that runs it alone */
		uint64_t g;
		uint32_t tpg;
		char id[RBD_GW_ID_MAX];
		pthread_mutex_lock(&lk->op_mu);
		read_owner_both(lk, &g, &tpg, id);
		pthread_mutex_unlock(&lk->op_mu);
	}
}

/* Reads here while another gateway owns the image: not past a gateway
 * that runs it alone (single_owner_ok). */
static bool rbd_unowned_reads(struct bdev *dev)
{
	return !atomic_load_explicit(&lock_of(dev)->key_single_other, memory_order_relaxed);
}

static uint32_t rbd_owner_group(struct bdev *dev)
{
	return atomic_load_explicit(&lock_of(dev)->owner_group, memory_order_relaxed);
}

const struct bdev_owner_ops bdev_rbd_owner_ops = {
	.state = rbd_owner_state,
	.acquire = rbd_owner_acquire,
	.listen = rbd_owner_listen,
	.owner_group = rbd_owner_group,
	.unowned_reads = rbd_unowned_reads,
	.shared = &rbd_shared_ops,
};

/* ---- set up / tear down (rbd.c) -------------------------------------- */

int rbd_lock_start(struct rbd_bdev *rb, char *err, size_t errlen)
{
	struct rbd_lock *lk = calloc(1, sizeof(*lk));
	if (!lk) {
		snprintf(err, errlen, "%s: out of memory", rb->spec);
		return -1;
	}
	lk->rb = rb;
	pthread_mutex_init(&lk->mu, NULL);
	pthread_mutex_init(&lk->op_mu, NULL);
	lk->backoff_ms = RBD_RECONNECT_MIN_MS;
	lk->gateways = 1;
	lk->port_group = 1;
	char host[64] = "localhost";
	gethostname(host, sizeof(host) - 1);
	snprintf(lk->gw_id, sizeof(lk->gw_id), "%s/1", host);
	atomic_init(&lk->state, BDEV_OWNER_STANDBY);
	atomic_init(&lk->gen, 0);
	atomic_init(&lk->owner_group, 0);
	atomic_init(&lk->owner_gen, 0);
	uint64_t g;
	uint32_t tpg;
	char id[RBD_GW_ID_MAX];
	if (read_owner(lk, &g, &tpg, id, sizeof(id)) == 0) {
		atomic_store(&lk->owner_group, tpg);
		atomic_store(&lk->owner_gen, g);
	}
	(void)err;
	(void)errlen;
	rb->lock = lk; /* the service steps use it once rbd.c adds the image */
	return 0;
}

void rbd_lock_stopping(struct rbd_bdev *rb)
{
	struct rbd_lock *lk = rb->lock;
	if (!lk)
		return;
	pthread_mutex_lock(&lk->mu);
	lk->stopping = true;
	lk->fn = NULL;
	pthread_mutex_unlock(&lk->mu);
}

void rbd_lock_stop(struct rbd_bdev *rb)
{
	struct rbd_lock *lk = rb->lock;
	if (!lk)
		return;
	rbd_lock_stopping(rb);
	/* a clean stop hands the lock over without anyone being blocklisted;
	 * nothing is served here from the moment it may be another's (a
	 * takeover waiting out the old holder's lease holds it too) */
	if (atomic_load(&lk->state) == BDEV_OWNER_OWNED || lk->taking) {
		atomic_store(&lk->lease_until, 0);
		int r = rbd_lock_release(rb->image);
		if (r < 0)
			log_warn("%s: releasing the image's lock failed: %s", rb->spec, strerror(-r));
	}
	rb->lock = NULL;
	pthread_mutex_destroy(&lk->op_mu);
	pthread_mutex_destroy(&lk->mu);
	free(lk);
}

const char *rbd_gateway_id(struct rbd_bdev *rb)
{
	return rb->lock && rb->lock->gw_id[0] ? rb->lock->gw_id : NULL;
}

int bdev_rbd_set_gateway(struct bdev *dev, unsigned gateways, uint32_t port_group, const char *gateway_id)
{
	if (!dev || dev->ops->owner != &bdev_rbd_owner_ops || !lock_of(dev))
		return -1;
	struct rbd_lock *lk = lock_of(dev);
	lk->gateways = gateways ? gateways : 1;
	lk->port_group = port_group ? port_group : 1;
	if (gateway_id && *gateway_id) {
		snprintf(lk->gw_id, sizeof(lk->gw_id), "%s", gateway_id);
	} else {
		char host[64] = "localhost";
		gethostname(host, sizeof(host) - 1);
		snprintf(lk->gw_id, sizeof(lk->gw_id), "%s/%u", host, lk->port_group);
	}
	return 0;
}
