/*
 * fault.h - a bdev that fails on command, for the daemon's own fault tests
 * (fault.c; [cache] fault_injection, tierctl leg fault).
 */
#ifndef TC_BDEV_FAULT_H
#define TC_BDEV_FAULT_H

#include "bdev/bdev.h"

/*
 * Fault injection (bdev/fault.c), for tests through the daemon only: a
 * wrapper that passes I/O to inner until told to fail it. The wrapper takes
 * inner's name and ownership. bdev_fault_set: any thread; -ENOTSUP if dev is
 * not a fault wrapper, -EINVAL for a range over 64 MiB or not 512-aligned.
 * BDEV_FAULT_RANGE fails reads that touch a bad sector of [off, off+len);
 * a write heals the sectors it covers. BDEV_FAULT_STUCK is the same range
 * that no write heals (a drive that can no longer remap). (Growing the
 * range frees the old sector map: give the largest range first, or set
 * ranges while idle.)
 * BDEV_FAULT_HANG holds every request until the mode changes (they then
 * fail with -EIO).
 * BDEV_FAULT_DELAY serves one request at a time, oldest first, each held
 * off microseconds (1 to 10 s) before it goes to the inner device (a single
 * server with a fixed service time). Requests already queued when the mode
 * changes still go through the queue. Worker threads only; let the queue
 * drain before the device closes.
 */
enum bdev_fault { BDEV_FAULT_NONE, BDEV_FAULT_EIO, BDEV_FAULT_RANGE, BDEV_FAULT_HANG, BDEV_FAULT_STUCK,
		  BDEV_FAULT_DELAY };
/* The modes that take a range (OFFSET LENGTH). */
static inline bool bdev_fault_has_range(int mode)
{
	return mode == BDEV_FAULT_RANGE || mode == BDEV_FAULT_STUCK;
}
struct bdev *bdev_fault_wrap(struct bdev *inner);
bool bdev_is_fault(const struct bdev *dev);
int bdev_fault_set(struct bdev *dev, enum bdev_fault mode, uint64_t off, uint64_t len);
struct bdev_fault_counts {
	uint64_t reads, writes; /* passed on to the inner device */
	uint64_t errors;        /* failed here (held ones when released) */
	uint64_t held_reads, held_writes; /* held without an answer (BDEV_FAULT_HANG) */
};
void bdev_fault_counts(struct bdev *dev, struct bdev_fault_counts *c);
/*
 * The request held last, passed on to the
 * inner device now (on the worker that sent it), as a device that was
 * stuck answers the newest first: 1, or 0 when none is held. Any thread.
 */
int bdev_fault_pass_newest(struct bdev *dev);
/* The same for the request held first. */
int bdev_fault_pass_oldest(struct bdev *dev);

#endif
