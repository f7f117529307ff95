/*
 * bdev.h - the block device interface every storage layer speaks.
 *
 * A bdev is something that stores bytes at offsets: a backing file or block
 * device (bdev_file.c, through io_uring), later an RBD image, and the cache
 * volume itself, which sits on top of a backing bdev and two leg bdevs and
 * exports the same interface upward. The SCSI emulation in backstore/ talks
 * only to a bdev; it never knows whether a cache is underneath.
 *
 * Threading contract:
 *  - bdev_submit: on a worker thread (common/worker.h). The request's done()
 *    is called later on the same worker thread, never from inside
 *    bdev_submit (so callers may submit while holding their own state).
 *  - bdev_close: main thread, with no request in flight.
 *  - bdev_lba_status: any thread; may block (it is for GET LBA STATUS and
 *    tools, not the I/O path).
 *
 * All offsets and lengths are in bytes and multiples of the bdev's
 * block_size; the data buffers of READ/WRITE are 4096-byte aligned.
 */
#ifndef TC_BDEV_H
#define TC_BDEV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "../common/worker.h"

enum bdev_op {
	BDEV_READ,
	BDEV_WRITE,
	BDEV_FLUSH,        /* make every completed write durable */
	BDEV_UNMAP,        /* deallocate; later reads return zeroes */
	BDEV_WRITE_ZEROES, /* zero the range, keeping it allocated */
};

/* Write flag: durable when done() is called (FUA, or write cache off). */
#define BDEV_F_FUA 0x1

struct bdev;
struct bdev_owner_ops;

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
	/* implementation's scratch, untouched by callers */
	struct io_op io;
	struct bdev *dev;
	uint64_t done_bytes;
};

struct bdev_ops {
	void (*submit)(struct bdev *dev, struct bdev_req *req);
	void (*close)(struct bdev *dev);
	/*
	 * Provisioning of the range at offset: sets *mapped and returns the
	 * length in bytes (>= block_size) over which that state holds, or
	 * -errno. NULL when the device cannot tell (everything mapped).
	 */
	int64_t (*lba_status)(struct bdev *dev, uint64_t offset, bool *mapped);
	/*
	 * Shared devices only (NULL otherwise): an image several gateways
	 * export, of which one at a time owns (serves) it. See "Ownership".
	 */
	const struct bdev_owner_ops *owner;
};

/*
 * Ownership of a shared backing store (an RBD image exported by several
 * gateways, held through the image's exclusive lock).
 *
 * A gateway serves I/O for a shared device only while it owns it. Every
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
	BDEV_OWNER_LOST,        /* cannot reach the cluster: fail I/O */
};

struct bdev_owner_change {
	enum bdev_owner_state state; /* the new state */
	uint64_t gen;                /* the generation now (when OWNED) */
	uint64_t prev_gen;           /* the generation before this gain */
	bool prev_owner_us;          /* the previous owner was this gateway */
};

struct bdev_owner_ops {
	enum bdev_owner_state (*state)(struct bdev *dev, uint64_t *gen);
	void (*acquire)(struct bdev *dev);
	void (*listen)(struct bdev *dev, void (*fn)(void *arg, const struct bdev_owner_change *c),
		       void *arg);
};

struct bdev {
	const struct bdev_ops *ops;
	const char *name;     /* for messages: a path or an image spec */
	uint64_t size;        /* bytes */
	uint32_t block_size;  /* bytes: smallest addressable unit */
	bool can_unmap;       /* UNMAP really deallocates (thin provisioning) */
	bool rotational;      /* reported in VPD B1 */
};

static inline bool bdev_is_shared(const struct bdev *dev)
{
	return dev && dev->ops->owner;
}

static inline void bdev_submit(struct bdev *dev, struct bdev_req *req)
{
	req->dev = dev;
	dev->ops->submit(dev, req);
}

static inline void bdev_close(struct bdev *dev)
{
	if (dev)
		dev->ops->close(dev);
}

int64_t bdev_lba_status(struct bdev *dev, uint64_t offset, bool *mapped);

/*
 * Open (and with create, make sparse if missing) a file or block device of
 * size bytes (0 = use its current size). On error returns NULL and writes a
 * sentence naming the path and the fix into err.
 */
struct bdev *bdev_file_open(const char *path, uint64_t size, uint32_t block_size,
			    bool create, char *err, size_t errlen);

#endif
