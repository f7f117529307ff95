/*
 * bdev_rbd.h - the RBD backing-store driver's private state.
 *
 * Only bdev_rbd*.c include this file (it pulls in librados and librbd); the
 * rest of the daemon opens an RBD bdev through bdev_rbd_open / bdev_open_backing
 * in bdev.h and never sees a Ceph type.
 *
 * bdev_rbd.c owns the cluster connection, the image handle and the I/O path;
 * bdev_rbd_lock.c owns the image's exclusive lock (ownership, ALUA): it keeps
 * its state behind rb->lock and is called from bdev_rbd_open once the image is
 * open and sized (and from close before the image is closed).
 *
 * Threading: the fields set at open (cluster, ioctx, image, names, opts) are
 * read-only afterwards. conn is written by librbd's threads and the size
 * poller, read by anyone (atomics).
 */
#ifndef TC_BDEV_RBD_H
#define TC_BDEV_RBD_H

#include "bdev.h"

#include <pthread.h>
#include <rados/librados.h>
#include <rbd/librbd.h>
#include <stdatomic.h>

#define RBD_NAME_MAX 256

struct rbd_lock; /* bdev_rbd_lock.c */

struct rbd_bdev {
	struct bdev dev;            /* first: a struct bdev * is a struct rbd_bdev * */
	rados_t cluster;
	rados_ioctx_t ioctx;
	rbd_image_t image;
	char pool[RBD_NAME_MAX];
	char image_name[RBD_NAME_MAX];
	char spec[2 * RBD_NAME_MAX + 8]; /* "rbd:POOL/IMAGE", dev.name points here */
	char conf_path[4096];
	char user[RBD_NAME_MAX];    /* cephx id without "client." */
	unsigned op_timeout_s;      /* rados_osd_op_timeout / rados_mon_op_timeout */

	_Atomic int conn;           /* enum bdev_rbd_conn (bdev.h) */
	atomic_uint_fast64_t last_ok_ms; /* now_ms() of the last successful completion */
	atomic_uint inflight;       /* requests handed to librbd, not yet done */

	/* image size tracking (rbd_update_watch + a poll as a fallback) */
	uint64_t watch_handle;
	bool watching;
	pthread_t poller;
	bool poller_started;
	atomic_bool stopping;
	pthread_mutex_t poll_lock;  /* poll_kick; the poller sleeps on poll_cond */
	pthread_cond_t poll_cond;
	bool poll_kick;
	void (*on_resize)(void *arg, uint64_t new_size); /* bdev_set_resize_listener */
	void *on_resize_arg;

	struct rbd_bdev *next_open; /* every open image, for bdev_rbd_status */

	/* bdev_rbd_lock.c's state (exclusive lock, ownership, ALUA); NULL without */
	struct rbd_lock *lock;
};

/* bdev_rbd_lock.c: start the lock thread once the image is open and sized
 * (0, or -1 with a sentence in err); stop it (releasing a held lock) before
 * the image is closed. The owner ops every RBD bdev exports. */
int rbd_lock_start(struct rbd_bdev *rb, char *err, size_t errlen);
void rbd_lock_stop(struct rbd_bdev *rb);
extern const struct bdev_owner_ops bdev_rbd_owner_ops;

static inline struct rbd_bdev *rbd_bdev_of(struct bdev *dev)
{
	return (struct rbd_bdev *)dev;
}

#endif
