/*
 * advisor.h - the read hit ratio a cache set would have at other sizes.
 *
 * From the live stream of accesses, each LUN's and the whole set's hit
 * ratio at 1/4, 1/2, 1, 2, 4 and 8 times today's size, for `tierctl
 * advise`. Our policy is not LRU (admission sketch, S3-FIFO, sequential
 * bypass), so a stack-distance curve would describe another cache; instead
 * the real policy code (cache/policy.c) runs in scaled-down copies, one per
 * size, on a spatially sampled stream: miniature simulation (Waldspurger et
 * al., "Cache Modeling and Optimization using Miniature Simulations",
 * USENIX ATC'17). An extent is in the sample when a hash of its key falls
 * under the sampling rate R; a copy standing for S slots has S x R slots
 * and sees every access to the sampled extents, so its hit ratio estimates
 * the full-size one. R = sample_slots / today's slots (at most 1): each
 * copy at 1x holds sample_slots slots whatever the cache's size.
 *
 * Sequential streams are found on the full stream before sampling (a scan
 * touches only one sampled extent in 1/R, so a copy could not see it): the
 * caller passes the answer of the set's own stream table (policy_stream)
 * with each access, and the copies decide admission with it.
 *
 * Cost, bounded and fixed at advisor_new/advisor_add: about 24 bytes per
 * slot of every copy, 15.75 x sample_slots slots per group (the set, and
 * each LUN in a private cache of the set's sizes). Per access: a hash and,
 * for a read, two counters in this thread's own cache line; per sampled
 * access, six policy lookups for the set and six for its LUN.
 */
#ifndef TC_CACHE_ADVISOR_H
#define TC_CACHE_ADVISOR_H

#include "cache/policy.h"

#include <stdbool.h>
#include <stdint.h>

#define ADVISOR_SIZES 6
#define ADVISOR_MAX_LUNS 256         /* backing ids below this (CACHE_MAX_BACKINGS) */
#define ADVISOR_MAX_CURVES 16        /* LUNs with a curve of their own at once (memory: see above) */
#define ADVISOR_SAMPLE_SLOTS 4096u   /* default slots of a copy at 1x */

/* 0.25, 0.5, 1, 2, 4, 8: the sizes, as multiples of today's */
extern const double advisor_scale[ADVISOR_SIZES];

struct advisor_cfg {
	uint32_t nslots;          /* today's cache, in extents */
	struct policy_cfg policy; /* the set's policy settings (its nslots is ignored) */
	uint32_t sample_slots;    /* slots of a copy at 1x (0: ADVISOR_SAMPLE_SLOTS) */
};

struct advisor;

/* Main thread. NULL on ENOMEM or a bad cfg. */
struct advisor *advisor_new(const struct advisor_cfg *cfg);
void advisor_free(struct advisor *a);

/* Main or control thread: start (-ENOMEM; -ENOSPC when ADVISOR_MAX_CURVES
 * LUNs have one) or end the curve of one LUN (backing id bid) in a private
 * cache. Accesses of a LUN not added still count for the set. */
int advisor_add(struct advisor *a, uint32_t bid);
void advisor_drop(struct advisor *a, uint32_t bid);

/*
 * Any worker thread, never sleeps: the extent key (cache_key: backing id
 * << 40 | extent) was read or written at byte offset, one piece of a
 * request as the engine splits them; run is where the piece stands in its
 * stream (policy_stream on the set's policy). may_admit: whether the
 * LUN's mode would promote it on a miss (reads: all but pass-through;
 * writes: write-back only); the copies do the same. Unsampled: lock-free.
 * Sampled: queued in this thread's ring, and run through the copies by
 * whichever thread gets the try-lock next; dropped (and counted) if the
 * ring is full (a ninth thread and more, without a ring: if the lock is
 * taken).
 */
void advisor_note(struct advisor *a, uint64_t key, uint64_t offset, const struct policy_run *run,
		  bool is_write, bool may_admit);

struct advisor_curve {
	bool on;                          /* a LUN's curve: added */
	uint64_t reads;                   /* sampled reads counted (decayed) */
	double ratio[ADVISOR_SIZES];      /* read hits / reads at each size */
};

struct advisor_report {
	double rate;                      /* sampling rate R */
	uint32_t nslots;                  /* today's size, in extents */
	uint32_t copy_slots[ADVISOR_SIZES]; /* slots of each copy */
	uint64_t sampled;                 /* sampled accesses since start */
	uint64_t dropped;                 /* sampled accesses lost: their thread's ring was full */
	uint64_t mem_bytes;               /* memory of every copy and table */
	struct advisor_curve set;
	struct advisor_curve lun[ADVISOR_MAX_LUNS];
};

/* Any thread but a worker (takes the lock). */
void advisor_get(struct advisor *a, struct advisor_report *r);
/* Forget every count and empty every copy: curves from now on. */
void advisor_reset(struct advisor *a);

/*
 * The smallest size, in multiples of today's, whose ratio reaches target,
 * interpolated between the sizes on a log scale; 0 when even 8x falls
 * short, advisor_scale[0] or less when 1/4 already reaches it (returns
 * advisor_scale[0]).
 */
double advisor_size_for(const struct advisor_curve *c, double target);

#endif
