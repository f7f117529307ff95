/*
 * vol_int.h - what the cache volume's files share (volume.c: requests,
 * pieces, submit; vol_read.c; vol_write.c; fill.c: fills and top-ups;
 * owner.c: shared backing stores). Private to cache/.
 *
 * Threading: see each file; a request and its pieces live on the worker
 * that submitted it.
 */
#ifndef TC_CACHE_VOL_INT_H
#define TC_CACHE_VOL_INT_H

#include "cache/cache_int.h"

#include <stdlib.h>

struct cache_vol {
	struct bdev dev;
	struct cache_set *cs;
	struct bdev *backing;
	/* fills, top-ups and destages that hold the volume: vol_close waits for them */
	_Atomic uint32_t bg_users;
	uint32_t bid;
	_Atomic int mode;
	/* LUN blocks larger than the legs write atomically: overwrites of dirty data go through the block log */
	_Atomic bool guard_torn;
	char name[64];
	/* ownership of a shared backing store (see "Ownership" below) */
	struct bdev_ops ops;            /* vol_ops, plus owner when the backing is shared */
	pthread_mutex_t own_mu;         /* up_fn/up_arg, listening, gen_path */
	void (*up_fn)(void *arg, const struct bdev_owner_change *c);
	void *up_arg;
	bool listening;                 /* registered with the backing's listen */
	uint64_t recorded_gen;          /* generation of our last gain, as persisted */
	_Atomic bool drop_failed;       /* the last gain could not drop stale copies: serve nothing */
	_Atomic bool dirty_when_tracked; /* dirty data at cache_vol_owner_track: no unowned reads (bdev.h) */
	char *gen_path;                 /* where it persists (NULL: not kept) */
	/*
	 * Writes to the backing store without FUA that completed (bw_volatile)
	 * and how many of them a completed FLUSH covers (bw_flushed): data a
	 * fill or top-up read while they differ may not be durable there yet
	 * (backing_settle).
	 */
	_Atomic uint64_t bw_volatile, bw_flushed;
	/*
	 * Destage to this backing store failing (cleaner.c, worker 0 writes;
	 * status reads): the error (0: working), failed attempts since it
	 * started, and when the next one may go (the wait doubles, 1 to 30 s);
	 * successes in a row while failing.
	 */
	_Atomic int destage_err;
	_Atomic uint64_t destage_failures;
	_Atomic uint64_t destage_since_ms, destage_retry_ms;
	uint32_t destage_wait_ms, destage_ok_run;
	/* bdev_set_resize_listener: the backing store's new size, passed up */
	void (*on_resize)(void *arg, uint64_t size);
	void *on_resize_arg;
};

struct vreq;

struct piece {
	struct piece *next_free;
	struct vreq *parent;
	uint64_t key;
	struct policy_run run;  /* its place in its stream (policy_stream), read or write */
	uint64_t off;           /* volume byte offset */
	uint64_t len;
	uint64_t data_off;      /* offset into the parent's iov */
	uint32_t first, count;  /* blocks inside the extent */
	uint32_t slot;
	uint32_t pin;           /* SU_READER / SU_WRITER held, 0 none */
	uint32_t bucket;        /* bypass counter held, or UINT32_MAX */
	int pending;
	int err;
	int stage;
	struct jwait jw;
	struct bdev_req sub;    /* single-sub stages */
	struct slot_wait dwait; /* parked behind a destage or a top-up (park_while) */
	struct intent_wait iw;  /* the slot's write-intent region (piece_intent) */
	bool intent_held;       /* entered: leave it when the piece ends or starts over */
	bool fresh;             /* the slot was allocated by this write: nothing in it is referenced */
	bool logged;            /* its block log record is in flight (dl): finish it when recorded */
	struct dlog_ent dl;
	struct iovec iov_inline[8];
	struct iovec *iov;
	int iovcnt;
};

struct vsub {                   /* extra subs of a partial read */
	struct vsub *next_free;
	struct piece *p;
	bool from_cache;
	uint32_t first, count;
	struct bdev_req req;
	struct iovec iov_inline[8];
	struct iovec *iov;
	int iovcnt;
};

/* How a request's pieces went (vreq.how), for bdev_req.outcome */
#define VH_HIT 0x01     /* a read all from the legs */
#define VH_PARTIAL 0x02 /* a read part from the legs, part from the backing store */
#define VH_MISS 0x04    /* a read from the backing store */
#define VH_CACHE 0x08   /* a write to the legs */
#define VH_BACKING 0x10 /* a write to the backing store */

struct vreq {
	struct vreq *next_free;
	struct cache_vol *v;
	struct bdev_req *up;
	int pending;
	int err;
	uint8_t how;            /* VH_*, of every piece */
	uint64_t t0_us;         /* when it came */
	uint64_t destage0;      /* cache_set.destage_state then */
	uint64_t flush_covers;  /* FLUSH: bw_volatile when it was sent */
	struct bdev_req sub;    /* pass-through, flush */
	struct worker_batch_end later; /* completion after a submit that did it all */
};

struct fill {
	struct fill *next_free;
	struct cache_vol *v;
	uint32_t slot;
	uint64_t key;
	uint32_t count;
	uint64_t settle;        /* bw_volatile a backing flush must cover first */
	void *buf;
	struct iovec iov;
	struct bdev_req req;
	struct jwait jw;
};

#define TOPUP_RUNS 16

/* A top-up: the invalid blocks of a READY slot, read from the backing store. */
struct topup {
	struct topup *next_free;
	struct cache_vol *v;
	uint32_t slot;
	uint64_t key;
	uint32_t wgen0;
	uint32_t nruns;
	uint64_t settle;        /* as struct fill's */
	uint32_t first[TOPUP_RUNS], count[TOPUP_RUNS]; /* read as one span: first[0] .. last end */
	uint8_t *buf;
	int pending;
	int err;
	struct iovec iov[TOPUP_RUNS];
	struct bdev_req req[TOPUP_RUNS];
	struct tjw {
		struct jwait jw;
		struct topup *t;
	} jw[TOPUP_RUNS];
};

/* Per-thread free lists of contexts (volume.c): no malloc per command in
 * steady state. POOL_GET falls back to malloc, and returns NULL without memory. */
extern __thread struct piece *piece_free;
extern __thread struct vsub *vsub_free;
extern __thread struct vreq *vreq_free;
extern __thread struct fill *fill_free;
extern __thread struct topup *topup_free;

#define POOL_GET(head, type)                                                  \
	({                                                                    \
		type *o_ = head;                                              \
		if (o_)                                                       \
			head = o_->next_free;                                 \
		else                                                          \
			o_ = malloc(sizeof(type));                            \
		o_;                                                           \
	})
#define POOL_PUT(head, o)                                                     \
	do {                                                                  \
		(o)->next_free = head;                                        \
		head = (o);                                                   \
	} while (0)

#define POOL_RELEASE(head)                                                    \
	while (head) {                                                        \
		void *o_ = head;                                              \
		head = head->next_free;                                       \
		free(o_);                                                     \
	}

/* ---- slices of a request's data (volume.c) ---- */
int vol_slice_into(const struct bdev_req *up, uint64_t off, uint64_t len, struct iovec *inl, struct iovec **iov,
		   int *iovcnt);
void vol_slice_free(struct iovec *iov, struct iovec *inl);

/* ---- a piece's end and what it holds (volume.c) ---- */
static inline void vol_slot_unpin(struct cache_set *cs, struct piece *p)
{
	if (p->pin) {
		atomic_fetch_sub(&cs->slots[p->slot].users, p->pin);
		p->pin = 0;
	}
}

static inline void vol_bypass_put(struct cache_set *cs, struct piece *p)
{
	if (p->bucket != UINT32_MAX) {
		atomic_fetch_sub(&cs->bypass[p->bucket], 1);
		p->bucket = UINT32_MAX;
	}
}

static inline void vol_intent_drop(struct cache_set *cs, struct piece *p)
{
	if (p->intent_held) {
		intent_leave(cs, p->iw.region);
		p->intent_held = false;
	}
}

/* The backing store refuses destages for want of space (mode_wb.c): any thread. */
static inline bool vol_space_blocked(struct cache_vol *v)
{
	int e = atomic_load_explicit(&v->destage_err, memory_order_relaxed);
	return e == -ENOSPC || e == -EDQUOT;
}

static inline void vol_counter_max(_Atomic uint64_t *c, uint64_t v)
{
	uint64_t cur = atomic_load(c);
	while (cur < v && !atomic_compare_exchange_weak(c, &cur, v))
		;
}

void vol_dlog_drop(struct cache_set *cs, struct piece *p);
/* The piece is done: release what it holds, count it off its request. */
void piece_end(struct piece *p, int err);
static inline void piece_sub_done(struct piece *p, int err)
{
	if (err && !p->err)
		p->err = err;
	if (--p->pending == 0)
		piece_end(p, p->err);
}

/* Under rcu_read_lock: find the piece's slot and pin it; the state pinned
 * in (READY, or FILLING for writers), or SB_FREE. */
uint32_t vol_pin_lookup(struct cache_set *cs, struct piece *p, bool writer);
/* A writer met a fill: cancel it; true if the slot is READY after all. */
bool vol_cancel_fill(struct cache_set *cs, struct piece *p);

/* ---- cache modes: what a WRITE does, one file each ---- */
struct vol_mode_ops {
	/* A WRITE piece, its slot pinned (st SB_READY) or a miss (SB_FREE):
	 * choose its stages (vol_write.c). */
	void (*write)(struct piece *p, uint32_t st);
	bool dirty;  /* data written to the legs is recorded dirty (destaged later) */
	bool fills;  /* reads promote misses and top up partial hits */
};
extern const struct vol_mode_ops vol_mode_wb;      /* mode_wb.c: write-back */
extern const struct vol_mode_ops vol_mode_wt;      /* mode_wt.c: write-through */
extern const struct vol_mode_ops vol_mode_around;  /* mode_around.c: write-around, and UNMAP/WRITE ZEROES */
extern const struct vol_mode_ops vol_mode_pt;      /* mode_around.c: pass-through */

static inline const struct vol_mode_ops *vol_mode(int mode)
{
	switch (mode) {
	case CACHE_WRITE_BACK: return &vol_mode_wb;
	case CACHE_WRITE_THROUGH: return &vol_mode_wt;
	case CACHE_WRITE_AROUND: return &vol_mode_around;
	default: return &vol_mode_pt;
	}
}

/* The stages a mode's write picks (vol_write.c). */
void to_cache(struct piece *p);                 /* legs, then a journal record (VALID or DIRTY) */
void to_backing(struct piece *p);               /* the backing store; a kept pin refreshes the copy after */
void backing_then_invalidate(struct piece *p);  /* the backing store, then the cached blocks invalidated */
/* A flag in mask is set on the piece's slot: true if the piece was parked
 * until it clears (it starts over then); false if it cleared meanwhile. */
bool park_while(struct piece *p, uint32_t mask);
/* The piece's extent (no slot) is being evicted, its FREE not durable yet:
 * true if the piece was parked until it is (it starts over then; slots.c). */
bool park_evicted(struct piece *p);
/* A parked piece's wake-up, on its worker: it starts over from the lookup. */
void vol_piece_retry(void *arg);

/* ---- the paths of a piece ---- */
void piece_read(struct piece *p);             /* vol_read.c */
void piece_write(struct piece *p);            /* vol_write.c: writes, UNMAP, WRITE ZEROES */
void vol_fill_start(struct cache_vol *v, uint64_t key);                /* fill.c */
void vol_topup_start(struct cache_vol *v, uint32_t s, uint64_t key);   /* fill.c */
extern const struct bdev_owner_ops vol_owner_ops;                     /* owner.c */
extern unsigned vol_drop_timeout_s; /* owner.c: how long a gain's drop waits with no progress (s) */

#endif
