/*
 * bdev.h - the block device interface every storage layer speaks.
 *
 * A bdev is something that stores bytes at offsets: a backing file or block
 * device (bdev/file.h, through io_uring), an RBD image (bdev/rbd.h, through
 * librbd), and the cache volume itself, which sits on top of a backing bdev
 * and two leg bdevs and exports the same interface upward. The SCSI
 * emulation in backstore/ talks only to a bdev; it never knows whether a
 * cache is underneath. This header is the interface and its generic code
 * (bdev.c); the drivers have a header each, and bdev/backing.h opens what a
 * [lun] names. SPDK's bdev.h / bdev_module.h split is the model: users see
 * this file, drivers implement struct bdev_ops.
 *
 * Threading contract:
 *  - bdev_submit: on a worker thread (common/worker.h). The request's done()
 *    is called later on the same worker thread, never from inside
 *    bdev_submit (so callers may submit while holding their own state).
 *  - bdev_close: main thread, with no request in flight.
 *  - bdev_space: any thread but a worker's; may block (the space monitor).
 *  - bdev_lba_status: any thread; may block (it is for GET LBA STATUS and
 *    tools, not the I/O path).
 *
 * All offsets and lengths are in bytes and multiples of the bdev's
 * block_size; the data buffers of READ/WRITE are 4096-byte aligned.
 */
#ifndef TC_BDEV_H
#define TC_BDEV_H

#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "common/worker.h"

enum bdev_op {
	BDEV_READ,
	BDEV_WRITE,
	BDEV_FLUSH,        /* make every completed write durable */
	BDEV_UNMAP,        /* deallocate; later reads return zeroes */
	BDEV_WRITE_ZEROES, /* zero the range, keeping it allocated */
};

/* Write flag: durable when done() is called (FUA, or write cache off). */
#define BDEV_F_FUA 0x1
/*
 * Read flag: a gateway that does not own a shared store (bdev.h
 * "Ownership") reads it, straight from the store and past every copy: a
 * cache volume neither looks its extents up nor fills them (its copies may
 * be older than what the owner has written since, and a fill now could
 * outlive the owner's next write). Every other device ignores it.
 */
#define BDEV_F_UNOWNED 0x2

struct bdev;
struct bdev_owner_ops;

/*
 * Where a thin device's blocks come from (bdev_space), for thin
 * provisioning thresholds and LOG SENSE: the pool it allocates from (a
 * file's filesystem, an RBD image's pool or its quota), shared with
 * whatever else lives there, and what the device itself has allocated.
 */
struct bdev_space {
	uint64_t pool_bytes; /* the pool's size as far as the device may use it */
	uint64_t pool_free;  /* what the device could still allocate from it */
	uint64_t alloc;      /* bytes the device has allocated */
	bool alloc_known;    /* alloc is filled in */
};

/* How a cache volume served a request, worst last (a command of several
 * requests takes the largest). BDEV_OUT_NONE: not a cache volume. */
enum bdev_outcome { BDEV_OUT_NONE, BDEV_OUT_HIT, BDEV_OUT_PARTIAL, BDEV_OUT_MISS, BDEV_OUT_BYPASS };

struct bdev_req {
	enum bdev_op op;
	unsigned flags;
	uint64_t offset;
	uint64_t len;
	struct iovec *iov; /* READ / WRITE data */
	int iovcnt;
	/* err: 0, or -errno (-EIO medium error, -ENOSPC out of space...). */
	void (*done)(struct bdev_req *req, int err);
	void *priv;             /* owner's */
	/* how the device served it, set before done(): a cache volume's
	 * BDEV_OUT_*; every other device leaves what the caller put there */
	uint8_t outcome;
	/* implementation's scratch, untouched by callers */
	struct io_op io;
	struct bdev *dev;
	uint64_t done_bytes;
	void *link;             /* a driver's list link (bdev_rbd: completions) */
};

/*
 * What a request its submitter stops waiting for (a leg that does not answer
 * within leg_timeout) may still do to its READ buffers. See bdev_ops.abandon.
 */
enum bdev_abandon {
	BDEV_ABANDON_UNSAFE = 0, /* it may still write into its buffers (any
				  * request the kernel has: even O_DIRECT may be
				  * queued unpinned, or fall back to buffered) */
	BDEV_ABANDON_UNTOUCHED,  /* never again (a request the fault device holds) */
};

/* Set by a submitter on a request it gave up on (leg_guard.c): a device
 * that closes with it still held completes it; any other it drops. */
#define BDEV_F_ABANDONED 0x80000000u

struct bdev_ops {
	void (*submit)(struct bdev *dev, struct bdev_req *req);
	void (*close)(struct bdev *dev);
	/*
	 * req is in flight on dev: what it may still do to its buffers if its
	 * submitter gives up on it (its done() is still called once, whenever
	 * the device answers). On the worker that submitted req. NULL: UNSAFE.
	 */
	enum bdev_abandon (*abandon)(struct bdev *dev, struct bdev_req *req);
	/*
	 * Provisioning of the range at offset: sets *mapped and returns the
	 * length in bytes (>= block_size) over which that state holds, or
	 * -errno. NULL when the device cannot tell (everything mapped).
	 */
	int64_t (*lba_status)(struct bdev *dev, uint64_t offset, bool *mapped);
	/*
	 * The space the device draws on (bdev_space): may block, never on a
	 * worker. NULL when the device cannot tell.
	 */
	int (*space)(struct bdev *dev, struct bdev_space *out);
	/*
	 * Shared devices only (NULL otherwise): an image several gateways
	 * export, of which one at a time owns (serves) it. See "Ownership".
	 */
	const struct bdev_owner_ops *owner;
	/*
	 * Devices whose size can change under us (an RBD image resized with
	 * `rbd resize`; NULL otherwise): register fn, called with the new
	 * size in bytes after dev->size changed, from the driver's own thread
	 * (never a worker's). One listener per device; main thread, before
	 * I/O starts. See bdev_set_resize_listener.
	 */
	void (*set_resize_listener)(struct bdev *dev, void (*fn)(void *arg, uint64_t size), void *arg);
	/*
	 * A file read through the page cache (NULL otherwise): if every page
	 * of [offset, offset + len) is in the page cache right now, return
	 * the file descriptor and set *fd_off, so a front end can send the
	 * data to a socket without reading it into a buffer (sendfile); else
	 * -1: read it. Worker thread, never blocks.
	 */
	int (*cached_fd)(struct bdev *dev, uint64_t offset, uint64_t len, uint64_t *fd_off);
};

/*
 * Ownership of a shared backing store (an RBD image exported by several
 * gateways, held through the image's exclusive lock).
 *
 * A gateway serves I/O for a shared device only while it owns it (but for
 * reads that go to the store itself, BDEV_F_UNOWNED). Every
 * time ownership is gained, the generation goes up (the driver keeps it
 * with the device, e.g. in the image's metadata, so every gateway sees the
 * same sequence); a layer that keeps copies of the device's data (the cache
 * volume) must drop them unless it can prove nobody else owned the device
 * since it last did (prev_owner_us and prev_gen equal to what it recorded).
 *
 * Threading contract:
 *  - state: any thread, never blocks (an atomic load); *gen gets the
 *    current generation when OWNED.
 *  - acquire: any thread, never blocks: starts taking ownership in the
 *    background (breaking the lock of an owner that is gone); the state
 *    reads TRANSITION until it is done, then OWNED or STANDBY.
 *  - listen: main thread, before I/O starts. fn runs on the driver's own
 *    thread after each change; while fn runs for a gain, state() still
 *    reads TRANSITION, so the layer above can invalidate before it serves.
 */
enum bdev_owner_state {
	BDEV_OWNER_STANDBY = 0, /* another gateway, or nobody, holds the lock */
	BDEV_OWNER_TRANSITION,  /* taking the lock right now */
	BDEV_OWNER_OWNED,       /* we hold it: serve I/O */
	BDEV_OWNER_LOST,        /* cannot reach the cluster, or fenced and
				 * reconnecting: fail I/O */
};

struct bdev_owner_change {
	enum bdev_owner_state state; /* the new state */
	uint64_t gen;                /* the generation now (when OWNED) */
	uint64_t prev_gen;           /* the generation before this gain */
	bool prev_owner_us;          /* the previous owner was this gateway */
};

/*
 * What every gateway of a shared device keeps alike (persistent
 * reservations): small named blobs kept with the device in the cluster,
 * and announcements that reach each gateway watching a blob. All but
 * unwatch block on the cluster: call them from a thread of your own,
 * never a worker.
 *  - get: the blob's bytes in buf (at most cap, -EFBIG past that), *len;
 *    -ENOENT when there is none.
 *  - cas: replace the blob with buf if its first cmp_len bytes still
 *    equal cmp (cmp_len 0: only if there is none yet): 0, -ECANCELED when
 *    another gateway changed it first, or -errno. A blob does not start
 *    with a zero byte.
 *  - announce: send msg to every other gateway watching name and wait
 *    until each has handled it (its fn returned 0), at most timeout_ms.
 *    With fence, a gateway that has not by then is fenced (cut off from
 *    the device, as a takeover does) before this returns. *others: how
 *    many answered. 0, or -errno when one could be neither heard nor
 *    fenced (or, without fence, did not answer: -ETIMEDOUT). An empty
 *    msg is a ping: every gateway alive answers it at once, without fn.
 *  - watch: fn(arg, msg, len) runs on a thread of the driver's for each
 *    announcement of another gateway (the announcer hears back when fn
 *    returns 0); fn(arg, NULL, 0) when some may have been missed (the
 *    watch was lost, or a fresh client replaced a fenced one; then before
 *    the device serves again): read the blob again. stale(arg) runs, on
 *    any thread and without blocking, as soon as such a call is due (an
 *    announcement arrived, the watch failed): the caller's copy is not
 *    the latest from then until fn returns 0. One watch per device.
 *    unwatch: neither is called after it returns.
 */
struct bdev_shared_ops {
	int (*get)(struct bdev *dev, const char *name, void *buf, size_t cap, size_t *len);
	int (*cas)(struct bdev *dev, const char *name, const void *cmp, size_t cmp_len, const void *buf,
		   size_t len);
	int (*announce)(struct bdev *dev, const char *name, const void *msg, size_t len, unsigned timeout_ms,
			bool fence, unsigned *others);
	int (*watch)(struct bdev *dev, const char *name, int (*fn)(void *arg, const void *msg, size_t len),
		     void (*stale)(void *arg), void *arg);
	void (*unwatch)(struct bdev *dev);
};

struct bdev_owner_ops {
	enum bdev_owner_state (*state)(struct bdev *dev, uint64_t *gen);
	void (*acquire)(struct bdev *dev);
	void (*listen)(struct bdev *dev, void (*fn)(void *arg, const struct bdev_owner_change *c),
		       void *arg);
	/*
	 * The target port group of the gateway that owns the device as last
	 * seen (the driver polls it about every second), 0 when unknown or
	 * nobody; for REPORT TARGET PORT GROUPS and status. Any thread, never
	 * blocks. A change of it alone is also reported to the listener (with
	 * the state unchanged), so hosts are told to look again.
	 */
	uint32_t (*owner_group)(struct bdev *dev);
	/* The device's shared blobs (NULL: none), and for a device stacked on
	 * the shared one (a cache volume) the one below, whose they are. */
	const struct bdev_shared_ops *shared;
	struct bdev *(*lower)(struct bdev *dev);
	/*
	 * Whether a READ at a gateway that does not own the device may be
	 * served from the shared store itself (BDEV_F_UNOWNED); NULL: yes. A
	 * cache volume says no if it held dirty data of the device when it
	 * started tracking ownership (left from a write-back run before the
	 * LUN had several gateways): the store lacks that data. Any thread,
	 * never blocks.
	 */
	bool (*unowned_reads)(struct bdev *dev);
};

/*
 * What was sent to a device, counted by bdev_submit for status and the
 * benchmarks (per command: how many leg writes, how many of them FUA, how
 * many leg reads), for devices whose owner asks (a cache set, its legs):
 * it keeps them on a cache line of their own, as they are written on every
 * I/O and from every worker. Relaxed atomics: a count, never a
 * synchronisation.
 */
struct bdev_io_counts {
	_Atomic uint64_t reads, writes, fua_writes, flushes;
};

struct bdev {
	const struct bdev_ops *ops;
	const char *name;     /* for messages: a path or an image spec */
	uint64_t size;        /* bytes */
	uint32_t block_size;  /* bytes: smallest addressable unit */
	bool can_unmap;       /* UNMAP really deallocates (thin provisioning) */
	bool rotational;      /* reported in VPD B1 */
	struct bdev_io_counts *io; /* NULL: not counted; a wrapper's count is what it was sent */
};

/* A wrapper (fault device, leg guard) looks to its users like what it wraps. */
static inline void bdev_like(struct bdev *dev, const struct bdev *inner)
{
	dev->name = inner->name;
	dev->size = inner->size;
	dev->block_size = inner->block_size;
	dev->can_unmap = inner->can_unmap;
	dev->rotational = inner->rotational;
}

/*
 * A read error that names bad blocks, not a dead device: the kernel's
 * BLK_STS_MEDIUM (-ENODATA: an unrecovered read error, what a drive's
 * latent sector gives), BLK_STS_PROTECTION (-EILSEQ: a protection
 * information check failed) and the generic BLK_STS_IOERR (-EIO).
 */
static inline bool bdev_err_bad_blocks(int err)
{
	return err == -EIO || err == -ENODATA || err == -EILSEQ;
}

static inline bool bdev_is_shared(const struct bdev *dev)
{
	return dev && dev->ops->owner;
}

/* The device that keeps dev's shared blobs, or NULL. */
static inline struct bdev *bdev_shared_base(struct bdev *dev)
{
	while (dev && dev->ops->owner && !dev->ops->owner->shared && dev->ops->owner->lower)
		dev = dev->ops->owner->lower(dev);
	return dev && dev->ops->owner && dev->ops->owner->shared ? dev : NULL;
}

static inline void bdev_submit(struct bdev *dev, struct bdev_req *req)
{
	req->dev = dev;
	struct bdev_io_counts *io = dev->io;
	if (io) {
		if (req->op == BDEV_READ)
			atomic_fetch_add_explicit(&io->reads, 1, memory_order_relaxed);
		else if (req->op == BDEV_FLUSH)
			atomic_fetch_add_explicit(&io->flushes, 1, memory_order_relaxed);
		else if (req->op == BDEV_WRITE) {
			atomic_fetch_add_explicit(&io->writes, 1, memory_order_relaxed);
			if (req->flags & BDEV_F_FUA)
				atomic_fetch_add_explicit(&io->fua_writes, 1, memory_order_relaxed);
		}
	}
	dev->ops->submit(dev, req);
}

static inline enum bdev_abandon bdev_abandon(struct bdev *dev, struct bdev_req *req)
{
	return dev->ops->abandon ? dev->ops->abandon(dev, req) : BDEV_ABANDON_UNSAFE;
}

static inline void bdev_close(struct bdev *dev)
{
	if (dev)
		dev->ops->close(dev);
}

int64_t bdev_lba_status(struct bdev *dev, uint64_t offset, bool *mapped);
/* The device's space (struct bdev_space): 0, or -ENOTSUP, or -errno. */
int bdev_space(struct bdev *dev, struct bdev_space *out);
/*
 * For a device's submit that cannot take req now (no memory for its
 * context): req goes to dev's submit again at the end of this worker's
 * iteration, or a later one while memory stays short, and done() is not
 * called meanwhile, so the contract above holds without allocating.
 * Uses req->link, which belongs to the device holding req. Worker thread.
 */
void bdev_submit_later(struct bdev *dev, struct bdev_req *req);

/* See bdev_ops.cached_fd: -1 when the device cannot send from its page cache. */
static inline int bdev_cached_fd(struct bdev *dev, uint64_t offset, uint64_t len, uint64_t *fd_off)
{
	return dev->ops->cached_fd ? dev->ops->cached_fd(dev, offset, len, fd_off) : -1;
}

/* Register the resize listener of dev (no-op for fixed-size devices). */
static inline void bdev_set_resize_listener(struct bdev *dev, void (*fn)(void *arg, uint64_t size),
					    void *arg)
{
	if (dev && dev->ops->set_resize_listener)
		dev->ops->set_resize_listener(dev, fn, arg);
}

#endif
