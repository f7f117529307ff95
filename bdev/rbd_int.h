/*
 * rbd_int.h - the RBD backing-store driver's private state.
 *
 * Only bdev/rbd*.c include this file (it pulls in librados and librbd); the
 * rest of the daemon opens an RBD bdev through bdev_rbd_open (rbd.h) or
 * bdev_open_backing (backing.h) and never sees a Ceph type.
 *
 * rbd.c opens and closes the bdev and follows the image's size;
 * rbd_client.c connects the cluster client and opens the image handle;
 * rbd_io.c is the I/O path; rbd_lock.c owns the image's exclusive lock
 * (ownership, ALUA): it keeps its state behind rb->lock and is called from
 * bdev_rbd_open once the image is open and sized (and from close before
 * the image is closed).
 *
 * Threading: the names and opts set at open are read-only afterwards. conn
 * is written by librbd's threads and the size poller, read by anyone
 * (atomics).
 *
 * Handle handoff: the handles (cluster, ioctx, image) are replaced as a unit
 * when the lock work finds this gateway's client fenced (blocklisted):
 * rbd_reopen connects a fresh client, opens the image on it, then swaps.
 * Every user other than the lock work (the I/O path, the poller, the
 * final flush) brackets its use with rbd_handles_enter / rbd_handles_exit:
 * enter increments inflight, then reads swapping (both seq_cst) and backs
 * out when it is set; the swapper sets swapping, waits for inflight to
 * reach 0, swaps the pointers and clears swapping. Either the user sees the
 * flag or the swapper sees the user's increment (seq_cst total order), so
 * no handle is ever closed under a user. A request holds its increment from
 * submit to done() (a FUA write's flush uses the same image as its write).
 * The lock work uses the handles directly: the swap runs on it.
 */
#ifndef TC_BDEV_RBD_INT_H
#define TC_BDEV_RBD_INT_H

#include "bdev/rbd.h"

#include <pthread.h>
#include <rados/librados.h>
#include <rbd/librbd.h>
#include <stdatomic.h>
#include <unistd.h>

#define RBD_NAME_MAX 256

struct rbd_lock; /* rbd_lock.c */

/* Background work on rbd_service.c's threads: one item, run by one thread
 * at a time; the fields are the service's (under its lock). */
struct rbd_svc_item {
	struct rbd_svc_item *next;
	uint64_t (*step)(struct rbd_svc_item *it); /* the now_ms() when it is due again */
	uint64_t due;
	bool busy, kicked, listed;
};
struct rbd_client; /* rbd_client.c: one Ceph client shared by the images of a cluster */
struct rbd_cluster;

struct rbd_bdev {
	struct bdev dev;            /* first: a struct bdev * is a struct rbd_bdev * */
	/* the handles: see "Handle handoff" above. cluster is client's rados_t */
	struct rbd_client *client;
	struct rbd_cluster *rc;     /* the images sharing its client (rbd_client.c) */
	rados_t cluster;
	rados_ioctx_t ioctx;
	rbd_image_t image;
	atomic_uint inflight;       /* users inside the handles (requests until done()) */
	atomic_bool swapping;       /* rbd_reopen is replacing them: stay out */
	atomic_bool fenced;         /* a call returned -ESHUTDOWN: we are blocklisted */
	unsigned reopens;           /* fresh clients since open (the lock work's) */
	/* requests the fence failed, or that came while the handles were being
	 * replaced: resubmitted on the fresh client, or failed, by
	 * rbd_unpark (the lock work, after the swap); "Parking" in rbd_io.c */
	pthread_mutex_t park_mu;
	struct bdev_req *parked;    /* newest first, through link */
	struct rbd_bdev *next_user; /* the images on one rbd_client's cluster (rbd_client.c) */
	struct rbd_svc_item svc;    /* the lock work (rbd_lock_step) */
	struct rbd_svc_item poll_svc; /* the size and connection poll (rbd.c) */
	char pool[RBD_NAME_MAX];
	char image_name[RBD_NAME_MAX];
	char spec[2 * RBD_NAME_MAX + 8]; /* "rbd:POOL/IMAGE", dev.name points here */
	char conf_path[4096];
	char user[RBD_NAME_MAX];    /* cephx id without "client." */
	unsigned op_timeout_s;      /* rados_osd_op_timeout / rados_mon_op_timeout */

	_Atomic int conn;           /* enum bdev_rbd_conn (bdev.h) */
	atomic_uint_fast64_t last_ok_ms; /* now_ms() of the last successful completion */

	/* image size tracking (rbd_update_watch + a poll as a fallback) */
	uint64_t watch_handle;
	bool watching;
	atomic_bool stopping;
	atomic_bool poll_kick;      /* a size check is wanted now */
	uint64_t poll_next_ms;      /* the service step's: when the next poll is due */
	unsigned poll_ticks;
	void (*on_resize)(void *arg, uint64_t new_size); /* bdev_set_resize_listener */
	void *on_resize_arg;

	struct rbd_bdev *next_open; /* every open image, for bdev_rbd_status */

	/* rbd_space.c: the last look found the pool full (quota or cluster):
	 * writes fail at once with -EDQUOT; read by the I/O path */
	atomic_bool pool_full;
	bool space_unknown_logged;  /* the space monitor's thread only */
	bool alloc_known;           /* and the last count of the image's allocation */
	uint64_t alloc_bytes, alloc_at_ms, alloc_cost_ms;

	/* rbd_lock.c's state (exclusive lock, ownership, ALUA); NULL without */
	struct rbd_lock *lock;
	/* rbd_shared.c's watch of a shared blob; NULL without. shared_lock
	 * guards the pointer: the lock work's reopen moves the watch under
	 * it while a closing LU may be taking the watch down */
	pthread_mutex_t shared_lock;
	struct rbd_shared *shared;
	/* tests (TIERCACHE_TEST_CLUSTER_STALL): while this file exists, the
	 * lock work's polls and the poller's probes hang, as they do when
	 * the gateway is cut off from the cluster; NULL otherwise */
	const char *test_stall;
	/* tests (TIERCACHE_TEST_HOLD_WRITE, rbd_io.c): while this file
	 * exists, one write at a time is held inside the image's handles */
	const char *test_hold;
	atomic_bool test_held;
};

/* this gateway's id (bdev_rbd_set_gateway), the same across restarts; NULL
 * without ownership (one gateway, no lock work). Any thread. */
#define RBD_GW_ID_MAX 128
const char *rbd_gateway_id(struct rbd_bdev *rb);

/* Tests: the cluster calls that find out about a fence hang for now. */
static inline bool rbd_test_stalled(const struct rbd_bdev *rb)
{
	return rb->test_stall && access(rb->test_stall, F_OK) == 0;
}

/* Enter the handles (false: they are being replaced, do not touch them). */
static inline bool rbd_handles_enter(struct rbd_bdev *rb)
{
	atomic_fetch_add(&rb->inflight, 1);
	if (atomic_load(&rb->swapping)) {
		atomic_fetch_sub(&rb->inflight, 1);
		return false;
	}
	return true;
}

static inline void rbd_handles_exit(struct rbd_bdev *rb)
{
	atomic_fetch_sub(&rb->inflight, 1);
}

/* ---- rbd_client.c ---- */

/* One cluster connection (shared) with the image open on it. */
struct rbd_handles {
	struct rbd_client *client;
	rados_t cluster;
	rados_ioctx_t ioctx;
	rbd_image_t image;
};

/*
 * Take a reference on the gateway's client for rb's cluster (its
 * configuration file, user and timeout), connecting one when there is
 * none, or when the current one is stale (the one the caller found fenced;
 * NULL at open), then open the pool and the image on it: 0 with *h and the
 * image's size in *size, or -errno with a sentence in err and *h all NULL.
 */
int rbd_handles_open(struct rbd_bdev *rb, struct rbd_client *stale, struct rbd_handles *h,
		     uint64_t *size, char *err, size_t errlen);
/* Close the image and the pool and drop the reference on the client (the
 * last one shuts it down). May wait on the cluster. */
void rbd_handles_close(struct rbd_handles *h);

/* rb uses its cluster's shared client from now on / no more. */
void rbd_client_join(struct rbd_bdev *rb);
void rbd_client_leave(struct rbd_bdev *rb);
/* The client was found fenced (blocklisted): every image on it is told
 * (rbd_lock_kick) and the next rbd_handles_open with it as stale connects
 * a fresh one. Any thread inside rb's handles, or the lock work. */
void rbd_client_fenced(struct rbd_bdev *rb);
/* Is rb's client known to be fenced? (the lock work) */
bool rbd_client_is_fenced(struct rbd_bdev *rb);

/*
 * Run fn(arg) on a thread of its own and wait at most wait_s for it: true
 * when it finished. A run the cluster does not let finish is abandoned: it
 * ends, or not, in the background, and fn owns arg either way.
 */
bool rbd_run_bounded(void (*fn)(void *arg), void *arg, unsigned wait_s);

/*
 * For the lock work only: connect a fresh client, open the image on it,
 * wait for the users of the current handles to leave (giving up with
 * -ECANCELED when cancelled(arg) turns true meanwhile), move the update
 * watch over, swap, and close the old handles (bounded: a close the
 * cluster does not let finish is abandoned). 0, or -errno with a sentence
 * in err; on failure the current handles stay.
 */
int rbd_reopen(struct rbd_bdev *rb, bool (*cancelled)(void *arg), void *arg, char *err, size_t errlen);

/* ---- rbd_io.c ---- */

/* bdev_ops.submit of every RBD bdev. */
void rbd_submit(struct bdev *dev, struct bdev_req *req);
/* A cluster call ended with res (0 or -errno): the connection state
 * (conn, last_ok_ms) and the fenced flag follow it. Any thread. */
void rbd_note_result(struct rbd_bdev *rb, int res);
/* A worker's exit hook (worker_exit_hook): close its completion channel. */
void rbd_chan_thread_exit(void);
/* The lock work, after a swap of the handles (or a failed try): resubmit
 * the parked requests on the current handles; those that may_write is
 * false for (writes and flushes) or may_read is false for (reads) are
 * failed with res instead. Returns how many were resubmitted, and in
 * *writes (may be NULL) how many of them were writes or flushes. */
unsigned rbd_unpark(struct rbd_bdev *rb, bool may_write, bool may_read, int res, unsigned *writes);

/* ---- rbd_space.c ---- */

/* bdev_ops.space: the image's pool (its quota, else what the cluster can
 * still store in it) and, with fast-diff, the image's allocation; sets
 * pool_full. May block up to the operation timeout: the space monitor's
 * thread only. 0, -ENOTSUP (no usage statistics yet), or -errno. */
int rbd_space(struct bdev *dev, struct bdev_space *out);

/* ---- rbd.c ---- */

/* Is another image of this process open on rb's image (the same spec and
 * configuration file)? A reload renaming a LUN has both open a moment. */
bool rbd_other_open(const struct rbd_bdev *rb);

/* The image's header changed (rbd_update_watch's callback), or a size
 * check is wanted now: the next service step checks. Any thread. */
void rbd_header_changed(void *arg);

/* ---- rbd_service.c ---- */

/* it's step runs on the service threads from now on (0, or -EAGAIN: no
 * thread could be started) / no more: remove waits for a step running now. */
int rbd_service_add(struct rbd_svc_item *it, uint64_t (*step)(struct rbd_svc_item *it));
void rbd_service_remove(struct rbd_svc_item *it);
/* Run it's step now (or again right after the one running). Any thread. */
void rbd_service_kick(struct rbd_svc_item *it);

/* ---- rbd_lock.c ---- */

/* ---- rbd_shared.c ---- */
extern const struct bdev_shared_ops rbd_shared_ops;
/* rbd_reopen: before the swap (drop the watch on the old handles), after it (watch again, read again). */
void rbd_shared_moved(struct rbd_bdev *rb, bool after);
/* Stop watching (unwatch, close): no callback after it returns. */
void rbd_shared_stop(struct rbd_bdev *rb);

/* Set up the lock state once the image is open and sized (0, or -1 with a
 * sentence in err). rbd_lock_stopping ends its waits (before the image
 * leaves the service); rbd_lock_stop then releases a held lock and frees
 * the state, before the image is closed. */
/* The owner ops every RBD bdev exports: bdev_rbd_owner_ops, below. */
int rbd_lock_start(struct rbd_bdev *rb, char *err, size_t errlen);
void rbd_lock_stopping(struct rbd_bdev *rb);
void rbd_lock_stop(struct rbd_bdev *rb);
/* The lock work's part of a service step: the now_ms() when it is due again. */
uint64_t rbd_lock_step(struct rbd_bdev *rb);
extern const struct bdev_owner_ops bdev_rbd_owner_ops;

static inline struct rbd_bdev *rbd_bdev_of(struct bdev *dev)
{
	return (struct rbd_bdev *)dev;
}

#endif
