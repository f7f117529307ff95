/*
 * rbd_shared.c - blobs every gateway of an RBD image keeps alike (bdev.h
 * "struct bdev_shared_ops"; persistent reservations use one).
 *
 * A blob NAME of image ID is the RADOS object "tiercache.NAME.ID" in the
 * image's pool: its data is the blob. A change is one write operation
 * that compares the blob's first bytes (which the caller makes a version)
 * and replaces the whole object only if they still match (cmpext +
 * write_full, or exclusive create for the first), so two gateways racing
 * never both win. The object's omap holds the members: each gateway that
 * watches it writes "GID" -> its client's address, so that an announcer
 * can fence one that does not answer, and "GID.gw" -> whose client it is
 * (member_add). A gateway removes its entry when it stops watching or
 * moves to a fresh client. One that died without that leaves it; the same
 * gateway starting again fences that old client and removes the entry
 * before it watches (fence_predecessors): the old client's watch outlives
 * the process, and the next change another gateway announced would
 * otherwise wait 10 s for it.
 *
 * Announcements are RADOS notifies on that object. Each gateway watches
 * it on the same client as its image I/O: a gateway that does not answer
 * in time is blocklisted by address, which is also what stops its I/O (a
 * takeover's lock break does the same; the client is shared by all the
 * gateway's images, which all move), and its lock work then gets a fresh
 * client; rbd_shared_moved watches again on that client and has the
 * layer above read the blob again before the device serves.
 *
 * librados calls the watch callback on its own thread; the callback only
 * queues the notify, and a step on rbd_service.c's threads runs the caller's fn and
 * acknowledges after it returns (fn reads the blob: a blocking call in
 * librados' callback thread is not ours to make). The test hook
 * TIERCACHE_TEST_SHARED_DELAY_MS delays each acknowledgement.
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

#define SHARED_NAME_MAX 64
#define SHARED_OID_MAX (SHARED_NAME_MAX + 96)

struct notice {
	struct notice *next;
	uint64_t notify_id, cookie;
	bool reload;            /* not a notify: read everything again */
	bool rewatch;           /* and watch again first: the watch failed */
	bool own;               /* our own announcement: acknowledged, nothing to do */
	size_t len;
	char data[];
};

struct rbd_shared {
	struct rbd_bdev *rb;
	char name[SHARED_NAME_MAX];
	char oid[SHARED_OID_MAX];
	int (*fn)(void *arg, const void *msg, size_t len);
	void (*stale)(void *arg);
	void *arg;
	uint64_t cookie;        /* the watch on the current handles */
	_Atomic uint64_t me;    /* our client's instance id (the watch's) */
	bool watching;
	rados_ioctx_t watch_io; /* the ioctx the watch is on */
	struct rbd_svc_item svc;    /* notice_step: the queued notices */
	pthread_mutex_t mu;
	struct notice *head, **tail;
	bool stopping;
	uint64_t retry_at;          /* the notice step's: watching again failed, wait till then */
	unsigned delay_ms;
};

static int oid_of(struct rbd_bdev *rb, const char *name, char *oid, size_t cap)
{
	char id[64];
	int r = rbd_get_id(rb->image, id, sizeof(id));
	if (r < 0)
		return r;
	if (strlen(name) >= SHARED_NAME_MAX)
		return -ENAMETOOLONG;
	if ((size_t)snprintf(oid, cap, "tiercache.%s.%s", name, id) >= cap)
		return -ENAMETOOLONG;
	return 0;
}

/* Enter the handles and name the blob's object: 0 (leave with rbd_handles_exit), or -errno, not entered. */
static int blob_enter(struct rbd_bdev *rb, const char *name, char oid[SHARED_OID_MAX])
{
	if (!rbd_handles_enter(rb))
		return -EAGAIN;
	int r = oid_of(rb, name, oid, SHARED_OID_MAX);
	if (r < 0)
		rbd_handles_exit(rb);
	return r;
}

static int sh_get(struct bdev *dev, const char *name, void *buf, size_t cap, size_t *len)
{
	struct rbd_bdev *rb = rbd_bdev_of(dev);
	char oid[SHARED_OID_MAX];
	int r = blob_enter(rb, name, oid);
	if (r < 0)
		return r;
	/* one read, never a stat and then a read: a blob replaced in between
	 * would be read cut at the old length */
	r = rados_read(rb->ioctx, oid, buf, cap, 0);
	rbd_handles_exit(rb);
	if (r == 0)
		return -ENOENT; /* the members' omap made it; no blob yet */
	if (r > 0 && (size_t)r >= cap)
		return -EFBIG;
	if (r > 0) {
		*len = (size_t)r;
		r = 0;
	}
	return r;
}

static int sh_cas(struct bdev *dev, const char *name, const void *cmp, size_t cmp_len, const void *buf,
		  size_t len)
{
	struct rbd_bdev *rb = rbd_bdev_of(dev);
	char oid[SHARED_OID_MAX];
	rados_write_op_t op = rados_create_write_op();
	if (!op)
		return -ENOMEM;
	int r = blob_enter(rb, name, oid);
	if (r < 0) {
		rados_release_write_op(op);
		return r;
	}
	/* "none yet": an empty object (the members' omap may have made it)
	 * reads as zeros, a blob starts with a byte that is not */
	static const char zero[1];
	int cmp_rval = 0;
	if (!cmp_len)
		rados_write_op_create(op, LIBRADOS_CREATE_IDEMPOTENT, NULL);
	rados_write_op_cmpext(op, cmp_len ? cmp : zero, cmp_len ? cmp_len : 1, 0, &cmp_rval);
	rados_write_op_write_full(op, buf, len);
	r = rados_write_op_operate2(op, rb->ioctx, oid, NULL, 0);
	rbd_handles_exit(rb);
	rados_release_write_op(op);
	/* a mismatch fails the op with -MAX_ERRNO - offset */
	if (r <= -4095 || cmp_rval <= -4095 || (cmp_len && r == -ENOENT))
		r = -ECANCELED;
	return r;
}

/*
 * "[v2:IP:PORT/NONCE,v1:...]" or "IP:PORT/NONCE": the first, without its
 * type; an IPv6 address keeps its brackets ("[::1]:0/NONCE").
 */
static void addr_plain(const char *in, char *out, size_t cap)
{
	const char *p = in;
	if (*p == '[' && (!strncmp(p + 1, "v1:", 3) || !strncmp(p + 1, "v2:", 3) || !strncmp(p + 1, "any:", 4)))
		p++; /* the list's bracket, not an IPv6 address's */
	if (!strncmp(p, "v1:", 3) || !strncmp(p, "v2:", 3))
		p += 3;
	else if (!strncmp(p, "any:", 4))
		p += 4;
	size_t n = 0;
	if (*p == '[') {
		const char *q = strchr(p, ']');
		if (q)
			n = (size_t)(q - p) + 1;
	}
	n += strcspn(p + n, ",]");
	if (n >= cap)
		n = cap - 1;
	memcpy(out, p, n);
	out[n] = 0;
}

/* Our client's address, plain. */
static int own_addr(struct rbd_bdev *rb, char *addr, size_t cap)
{
	char *addrs = NULL;
	int r = rados_getaddrs(rb->cluster, &addrs);
	if (r < 0 || !addrs)
		return r < 0 ? r : -EIO;
	addr_plain(addrs, addr, cap);
	free(addrs);
	return 0;
}

/* This boot of this host (a process of an earlier boot is not running). */
static void boot_id(char *out, size_t cap)
{
	snprintf(out, cap, "-");
	FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
	if (f) {
		if (fgets(out, (int)cap, f))
			out[strcspn(out, "\n")] = 0;
		fclose(f);
	}
}

/*
 * Record this client as a member of the blob's watchers: "GID" -> its
 * address (what an announcer fences; the only key before gateway ids were
 * kept, so older gateways read it as before), and "GID.gw" -> "GATEWAY_ID
 * BOOT_ID PID" (whose client it is: fence_predecessors).
 */
static int member_add(struct rbd_bdev *rb, const char *oid)
{
	char addr[256], who[RBD_GW_ID_MAX + 64], boot[48], key[32], key_gw[40];
	int r = own_addr(rb, addr, sizeof(addr));
	if (r < 0)
		return r;
	const char *gw = rbd_gateway_id(rb);
	boot_id(boot, sizeof(boot));
	snprintf(who, sizeof(who), "%s %s %d", gw && *gw ? gw : "-", boot, (int)getpid());
	uint64_t gid = rados_get_instance_id(rb->cluster);
	snprintf(key, sizeof(key), "%" PRIu64, gid);
	snprintf(key_gw, sizeof(key_gw), "%" PRIu64 ".gw", gid);
	const char *keys[2] = { key, key_gw };
	const char *vals[2] = { addr, who };
	size_t klens[2] = { strlen(key), strlen(key_gw) };
	size_t lens[2] = { strlen(addr), strlen(who) };
	rados_write_op_t op = rados_create_write_op();
	if (!op)
		return -ENOMEM;
	rados_write_op_omap_set2(op, keys, vals, klens, lens, 2);
	r = rados_write_op_operate2(op, rb->ioctx, oid, NULL, 0);
	rados_release_write_op(op);
	return r;
}

/* The address member gid recorded, or -ENOENT. */
static int member_addr(struct rbd_bdev *rb, const char *oid, uint64_t gid, char *addr, size_t cap)
{
	char key[32];
	snprintf(key, sizeof(key), "%" PRIu64, gid);
	const char *keys[1] = { key };
	rados_read_op_t op = rados_create_read_op();
	if (!op)
		return -ENOMEM;
	rados_omap_iter_t it = NULL;
	int rv = 0;
	rados_read_op_omap_get_vals_by_keys2(op, keys, 1, (size_t[]){ strlen(key) }, &it, &rv);
	int r = rados_read_op_operate(op, rb->ioctx, oid, 0);
	if (r == 0 && rv < 0)
		r = rv;
	if (r == 0) {
		char *k = NULL, *v = NULL;
		size_t kl = 0, vl = 0;
		r = -ENOENT;
		if (rados_omap_get_next2(it, &k, &v, &kl, &vl) == 0 && k && v && vl < cap) {
			memcpy(addr, v, vl);
			addr[vl] = 0;
			r = 0;
		}
	}
	if (it)
		rados_omap_get_end(it);
	rados_release_read_op(op);
	return r;
}

/* Remove the members gids[0..n) (both their keys). */
static int members_remove(struct rbd_bdev *rb, const char *oid, const uint64_t *gids, size_t n)
{
	char keys[2 * n][40];
	const char *kp[2 * n];
	size_t kl[2 * n];
	for (size_t i = 0; i < n; i++) {
		snprintf(keys[2 * i], sizeof(keys[0]), "%" PRIu64, gids[i]);
		snprintf(keys[2 * i + 1], sizeof(keys[0]), "%" PRIu64 ".gw", gids[i]);
	}
	for (size_t i = 0; i < 2 * n; i++) {
		kp[i] = keys[i];
		kl[i] = strlen(keys[i]);
	}
	rados_write_op_t op = rados_create_write_op();
	if (!op)
		return -ENOMEM;
	rados_write_op_omap_rm_keys2(op, kp, kl, 2 * n);
	int r = rados_write_op_operate2(op, rb->ioctx, oid, NULL, 0);
	rados_release_write_op(op);
	return r;
}

#define PREDECESSORS_MAX 16
#define MEMBERS_READ_MAX 4096

/*
 * Was the process that recorded "GATEWAY_ID BOOT_ID PID" this gateway's,
 * and is it certainly gone? Of an earlier boot of this host, or of this
 * boot with no tiercached at that PID any more. This process itself (a LU
 * a reload opens again while the old one still serves) and any other
 * running tiercached (a second start by mistake) are never taken for one:
 * when in doubt, nothing is fenced and an announcement waits as before.
 */
static bool predecessor_gone(const char *who, const char *gw, const char *boot)
{
	char id[RBD_GW_ID_MAX], b[48];
	int pid = 0;
	if (sscanf(who, "%127s %47s %d", id, b, &pid) != 3 || strcmp(id, gw) || pid <= 0)
		return false;
	if (strcmp(b, boot))
		return strcmp(boot, "-") != 0; /* another boot: gone, if ours is known */
	if (pid == (int)getpid())
		return false;
	char path[64], comm[32] = "";
	snprintf(path, sizeof(path), "/proc/%d/comm", pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return errno == ENOENT; /* no such process */
	bool running = fgets(comm, sizeof(comm), f) && !strncmp(comm, "tiercached", 10);
	fclose(f);
	return !running;
}

/*
 * Before this process first watches the blob: the members a process of
 * this same gateway left and that is gone (killed, or the host rebooted)
 * are fenced by address and removed. Their watches outlive them until
 * they time out, and an announcement another gateway makes meanwhile
 * would wait 10 s for them; the OSDs drop a blocklisted client's watches.
 * Inside the handles, on the caller's thread; each call is bounded by the
 * cluster timeout (the new osdmap is not waited for: an announcement made
 * before the OSDs have it waits as before, no longer).
 */
static void fence_predecessors(struct rbd_bdev *rb, const char *oid)
{
	const char *gw = rbd_gateway_id(rb);
	char me_addr[256], boot[48];
	if (!gw || !*gw || own_addr(rb, me_addr, sizeof(me_addr)) < 0)
		return;
	boot_id(boot, sizeof(boot));
	uint64_t me = rados_get_instance_id(rb->cluster);
	uint64_t gids[PREDECESSORS_MAX];
	size_t n = 0, seen = 0;
	char after[40] = "";
	unsigned char more = 1;
	int r = 0;
	while (more && n < PREDECESSORS_MAX && seen < MEMBERS_READ_MAX) {
		rados_read_op_t op = rados_create_read_op();
		if (!op)
			return;
		rados_omap_iter_t it = NULL;
		int rv = 0;
		more = 0;
		rados_read_op_omap_get_vals2(op, after[0] ? after : NULL, NULL, 256, &it, &more, &rv);
		r = rados_read_op_operate(op, rb->ioctx, oid, 0);
		if (r == 0 && rv < 0)
			r = rv;
		char *k, *v;
		size_t kl, vl;
		while (r == 0 && n < PREDECESSORS_MAX && rados_omap_get_next2(it, &k, &v, &kl, &vl) == 0 && k) {
			seen++;
			if (kl < sizeof(after)) {
				memcpy(after, k, kl);
				after[kl] = 0;
			}
			char who[RBD_GW_ID_MAX + 64];
			if (kl < 4 || kl >= sizeof(after) || memcmp(k + kl - 3, ".gw", 3) || !v || vl >= sizeof(who))
				continue;
			memcpy(who, v, vl);
			who[vl] = 0;
			uint64_t gid = strtoull(after, NULL, 10);
			if (gid && gid != me && predecessor_gone(who, gw, boot))
				gids[n++] = gid;
		}
		if (it)
			rados_omap_get_end(it);
		rados_release_read_op(op);
		if (r < 0)
			break;
	}
	if (r < 0 && r != -ENOENT)
		log_warn("%s: cannot read the members of %s: %s", rb->spec, oid, strerror(-r));
	uint64_t fenced[PREDECESSORS_MAX];
	size_t nf = 0;
	for (size_t i = 0; i < n; i++) {
		char addr[256];
		int e = member_addr(rb, oid, gids[i], addr, sizeof(addr));
		if (e == -ENOENT) {
			fenced[nf++] = gids[i]; /* half an entry: nothing to fence, just remove it */
			continue;
		}
		if (e == 0 && !strcmp(addr, me_addr))
			continue;
		if (e == 0)
			e = rados_blocklist_add(rb->cluster, addr, 0);
		if (e < 0) {
			/* its entry stays: another gateway can still fence it when it does not answer */
			log_warn("%s: cannot fence this gateway's earlier client %" PRIu64 " (%s); the next change "
				 "another gateway makes waits for its watch", rb->spec, gids[i], strerror(-e));
			continue;
		}
		log_info("%s: fenced this gateway's earlier client %s (client %" PRIu64 "), left by a process that "
			 "is gone", rb->spec, addr, gids[i]);
		fenced[nf++] = gids[i];
	}
	if (nf) {
		int e = members_remove(rb, oid, fenced, nf);
		if (e < 0)
			log_warn("%s: cannot remove this gateway's earlier members of %s: %s", rb->spec, oid,
				 strerror(-e));
	}
}

static int sh_announce(struct bdev *dev, const char *name, const void *msg, size_t len, unsigned timeout_ms,
		       bool fence, unsigned *others)
{
	struct rbd_bdev *rb = rbd_bdev_of(dev);
	char oid[SHARED_OID_MAX];
	*others = 0;
	int r = blob_enter(rb, name, oid);
	if (r < 0)
		return r;
	char *reply = NULL;
	size_t reply_len = 0;
	r = rados_notify2(rb->ioctx, oid, msg, (int)len, timeout_ms, &reply, &reply_len);
	if ((r == 0 || r == -ETIMEDOUT) && reply) {
		struct notify_ack_t *acks = NULL;
		struct notify_timeout_t *tos = NULL;
		size_t na = 0, nt = 0;
		uint64_t me = rados_get_instance_id(rb->cluster);
		int d = rados_decode_notify_response(reply, reply_len, &acks, &na, &tos, &nt);
		if (d < 0) {
			r = d;
		} else {
			for (size_t i = 0; i < na; i++)
				if (acks[i].notifier_id != me)
					(*others)++;
			int fenced = 0;
			for (size_t i = 0; i < nt && fence; i++) {
				char addr[256];
				if (tos[i].notifier_id == me) {
					fenced++; /* our own watch: nothing to fence */
					continue;
				}
				int e = member_addr(rb, oid, tos[i].notifier_id, addr, sizeof(addr));
				if (e == 0)
					e = rados_blocklist_add(rb->cluster, addr, 0);
				if (e < 0) {
					log_err("%s: gateway client %" PRIu64 " did not take a change of %s and cannot be "
						"fenced: %s", rb->spec, tos[i].notifier_id, name, strerror(-e));
					r = e;
					break;
				}
				log_warn("%s: gateway client %" PRIu64 " (%s) did not take a change of %s within %u ms; "
					 "fenced it", rb->spec, tos[i].notifier_id, addr, name, timeout_ms);
				fenced++;
			}
			if (fenced && fenced == (int)nt)
				rados_wait_for_latest_osdmap(rb->cluster); /* the blocklist is in force before we answer */
			if (r == -ETIMEDOUT && fenced == (int)nt)
				r = 0;
			rados_free_notify_response(acks, na, tos);
		}
	}
	if (reply)
		rados_buffer_free(reply);
	rbd_handles_exit(rb);
	return r;
}

static void notice_push(struct rbd_shared *s, struct notice *n)
{
	pthread_mutex_lock(&s->mu);
	n->next = NULL;
	*s->tail = n;
	s->tail = &n->next;
	pthread_mutex_unlock(&s->mu);
	rbd_service_kick(&s->svc);
}

static void push_reload(struct rbd_shared *s, bool rewatch)
{
	s->stale(s->arg);
	struct notice *n = calloc(1, sizeof(*n));
	if (n) {
		n->reload = true;
		n->rewatch = rewatch;
		notice_push(s, n);
	}
}

/* librados' thread: queue it for ours. */
static void watch_cb(void *arg, uint64_t notify_id, uint64_t handle, uint64_t notifier_id, void *data,
		     size_t len)
{
	struct rbd_shared *s = arg;
	if (notifier_id == atomic_load(&s->me) || !len) {
		/* our own: acknowledged at once, never queued behind others'
		 * (a late answer would have us fence ourselves); a ping too */
		rados_notify_ack(s->watch_io, s->oid, notify_id, handle, NULL, 0);
		return;
	}
	s->stale(s->arg); /* a change we have not read yet: our copy is not the latest */
	struct notice *n = malloc(sizeof(*n) + len);
	if (!n)
		return; /* unanswered: the announcer fences us, and we read it all again then */
	n->notify_id = notify_id;
	n->cookie = handle;
	n->reload = false;
	n->rewatch = false;
	n->own = false;
	n->len = len;
	if (len)
		memcpy(n->data, data, len);
	notice_push(s, n);
}

static void watch_err(void *arg, uint64_t cookie, int err)
{
	struct rbd_shared *s = arg;
	log_warn("%s: the watch on %s failed (%s); watching and reading it again", s->rb->spec, s->oid,
		 strerror(-err));
	push_reload(s, true);
}

/* Watch the object on the current handles (they are ours: the lock work's, or before I/O). */
static int watch_on(struct rbd_shared *s)
{
	struct rbd_bdev *rb = s->rb;
	int r = member_add(rb, s->oid);
	if (r < 0)
		return r;
	atomic_store(&s->me, rados_get_instance_id(rb->cluster));
	s->watch_io = rb->ioctx;
	r = rados_watch2(rb->ioctx, s->oid, &s->cookie, watch_cb, watch_err, s);
	if (r == 0)
		s->watching = true;
	return r;
}

/* The watch's service step: the queued notices, oldest first. */
static uint64_t notice_step(struct rbd_svc_item *it)
{
	struct rbd_shared *s = (struct rbd_shared *)((char *)it - offsetof(struct rbd_shared, svc));
	for (;;) {
		pthread_mutex_lock(&s->mu);
		uint64_t now = now_ms();
		if (s->stopping || !s->head || now < s->retry_at) {
			uint64_t due = !s->stopping && s->head ? s->retry_at : UINT64_MAX;
			pthread_mutex_unlock(&s->mu);
			return due;
		}
		struct notice *n = s->head;
		s->head = n->next;
		if (!s->head)
			s->tail = &s->head;
		pthread_mutex_unlock(&s->mu);
		if (n->reload) {
			int r = 0;
			if (n->rewatch) {
				/* a failed watch stays failed: drop it and watch again,
				 * and until that works the copy stays stale */
				r = -EAGAIN;
				pthread_mutex_lock(&s->mu);
				if (rbd_handles_enter(s->rb)) {
					if (s->watching)
						rados_unwatch2(s->watch_io, s->cookie);
					s->watching = false;
					r = watch_on(s);
					rbd_handles_exit(s->rb);
				}
				pthread_mutex_unlock(&s->mu);
			}
			if (r == 0) {
				s->fn(s->arg, NULL, 0);
			} else {
				log_warn("%s: cannot watch %s again (%s); retrying in 1 s", s->rb->spec, s->oid,
					 strerror(-r));
				pthread_mutex_lock(&s->mu);
				s->retry_at = now_ms() + 1000;
				pthread_mutex_unlock(&s->mu);
				push_reload(s, true);
			}
		} else {
			if (s->delay_ms && !n->own)
				usleep(s->delay_ms * 1000u);
			if ((n->own || s->fn(s->arg, n->data, n->len) == 0) && rbd_handles_enter(s->rb)) {
				int r = rados_notify_ack(s->rb->ioctx, s->oid, n->notify_id, n->cookie, NULL, 0);
				rbd_handles_exit(s->rb);
				if (r < 0 && r != -ENOTCONN)
					log_warn("%s: cannot acknowledge a change of %s: %s", s->rb->spec, s->name,
						 strerror(-r));
			}
		}
		free(n);
	}
}

static int sh_watch(struct bdev *dev, const char *name, int (*fn)(void *arg, const void *msg, size_t len),
		    void (*stale)(void *arg), void *arg)
{
	struct rbd_bdev *rb = rbd_bdev_of(dev);
	pthread_mutex_lock(&rb->shared_lock);
	bool taken = rb->shared != NULL;
	pthread_mutex_unlock(&rb->shared_lock);
	if (taken)
		return -EBUSY;
	struct rbd_shared *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->rb = rb;
	s->fn = fn;
	s->stale = stale;
	s->arg = arg;
	snprintf(s->name, sizeof(s->name), "%s", name);
	s->tail = &s->head;
	const char *d = getenv("TIERCACHE_TEST_SHARED_DELAY_MS");
	s->delay_ms = d ? (unsigned)atoi(d) : 0;
	pthread_mutex_init(&s->mu, NULL);
	if (rbd_service_add(&s->svc, notice_step) < 0) {
		pthread_mutex_destroy(&s->mu);
		free(s);
		return -EAGAIN;
	}
	/* published first, then watched inside the handles under s->mu: a
	 * reopen meanwhile waits for us, then moves the watch (rbd_shared_moved) */
	pthread_mutex_lock(&rb->shared_lock);
	pthread_mutex_lock(&s->mu);
	rb->shared = s;
	pthread_mutex_unlock(&rb->shared_lock);
	int r = -EAGAIN;
	if (rbd_handles_enter(rb)) {
		r = oid_of(rb, name, s->oid, sizeof(s->oid));
		if (r == 0) {
			fence_predecessors(rb, s->oid);
			r = watch_on(s);
		}
		rbd_handles_exit(rb);
	}
	pthread_mutex_unlock(&s->mu);
	if (r < 0)
		rbd_shared_stop(rb);
	return r;
}

static void sh_unwatch(struct bdev *dev)
{
	struct rbd_bdev *rb = rbd_bdev_of(dev);
	rbd_shared_stop(rb);
}

void rbd_shared_stop(struct rbd_bdev *rb)
{
	/* under shared_lock throughout: a reopen moving the watch waits for us
	 * before its swap (so the handles the watch is on stay open), and one
	 * that comes later finds nothing to move */
	pthread_mutex_lock(&rb->shared_lock);
	struct rbd_shared *s = rb->shared;
	if (!s) {
		pthread_mutex_unlock(&rb->shared_lock);
		return;
	}
	/* no notice step from here (one would watch again) */
	pthread_mutex_lock(&s->mu);
	s->stopping = true;
	pthread_mutex_unlock(&s->mu);
	rbd_service_remove(&s->svc); /* waits for a step running now */
	/* not under s->mu: a callback in flight takes it to queue its notice,
	 * and the flush waits for that callback */
	if (s->watching) {
		int u = rados_unwatch2(s->watch_io, s->cookie);
		rados_watch_flush(rb->cluster); /* no callback of librados' after this */
		/* not a member any more (our restart has nothing to fence); not
		 * tried when the cluster did not take the unwatch either */
		uint64_t me = atomic_load(&s->me);
		int e = u == 0 ? members_remove(rb, s->oid, &me, 1) : 0;
		if (e < 0)
			log_warn("%s: cannot remove this gateway from the members of %s: %s", rb->spec, s->oid,
				 strerror(-e));
	}
	s->watching = false;
	rb->shared = NULL;
	pthread_mutex_unlock(&rb->shared_lock);
	while (s->head) {
		struct notice *n = s->head;
		s->head = n->next;
		free(n);
	}
	pthread_mutex_destroy(&s->mu);
	free(s);
}

/*
 * The lock work, inside rbd_reopen: the old handles are about to go
 * (before the swap: drop the watch on them) or a fresh client took their
 * place (after it: watch there, and have the blob read again before the
 * device serves: the caller runs fn itself, on this thread).
 */
void rbd_shared_moved(struct rbd_bdev *rb, bool after)
{
	/* held throughout: rbd_shared_stop waits for us before it frees s (the
	 * owner's fn and arg go with it) */
	pthread_mutex_lock(&rb->shared_lock);
	struct rbd_shared *s = rb->shared;
	if (!s) {
		pthread_mutex_unlock(&rb->shared_lock);
		return;
	}
	pthread_mutex_lock(&s->mu);
	if (!after) {
		if (s->watching)
			rados_unwatch2(s->watch_io, s->cookie); /* fenced: fails fast, the watch is gone anyway */
		s->watching = false;
		pthread_mutex_unlock(&s->mu);
		pthread_mutex_unlock(&rb->shared_lock);
		return;
	}
	uint64_t old = atomic_load(&s->me);
	int r = s->oid[0] ? watch_on(s) : -ENOENT;
	if (r == 0 && old && old != atomic_load(&s->me))
		members_remove(rb, s->oid, &old, 1); /* the old client is gone (fenced): no longer a member */
	pthread_mutex_unlock(&s->mu);
	s->stale(s->arg);
	if (r < 0)
		log_err("%s: cannot watch %s on the fresh client (%s); changes other gateways make are not "
			"seen until it can", rb->spec, s->oid, strerror(-r));
	s->fn(s->arg, NULL, 0);
	pthread_mutex_unlock(&rb->shared_lock);
}

const struct bdev_shared_ops rbd_shared_ops = {
	.get = sh_get,
	.cas = sh_cas,
	.announce = sh_announce,
	.watch = sh_watch,
	.unwatch = sh_unwatch,
};
