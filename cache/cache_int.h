/*
 * cache_int.h - the engine's internal objects, shared by the files of cache/.
 *
 * Nothing outside cache/ includes this; the public surface is cache.h
 * (build and open sets and volumes) and status.h (what tierctl shows).
 *
 * Objects:
 *  - struct slot: one extent-sized place on the legs; 16 bytes of RAM.
 *  - struct cache_map: backing extent key -> slot number, an open-addressing
 *    table of 32-bit entries (slot number + key fingerprint) published with
 *    RCU (map.c).
 *  - struct mirror: RAID1 of the leg bdevs (mirror.c).
 *  - struct journal: one metadata log ring per worker, group commit (journal.c).
 *  - struct cache_set: all of the above plus the free list, the cleaner state
 *    and the superblock (set.c).
 *  - struct cache_vol: the bdev a LUN sees (volume.c).
 */
#ifndef TC_CACHE_INT_H
#define TC_CACHE_INT_H

#include "bdev/bdev.h"
#include "bdev/fault.h"
#include "bdev/file.h"
#include "cache/cache.h"
#include "cache/meta.h"
#include "cache/advisor.h"
#include "cache/policy.h"
#include "cache/status.h"
#include "cache/trace.h"

#include <pthread.h>
#include <stdatomic.h>
#include <urcu.h>

/* ---- slots ---------------------------------------------------------- */

/*
 * slot.bits: one atomic word holding a tiny spinlock, the state and the
 * summary flags, with a write generation in the high bits.
 */
#define SB_LOCK        0x1u
#define SB_STATE_MASK  0x6u
#define SB_FREE        0x0u   /* on the free list or being reclaimed */
#define SB_FILLING     0x2u   /* promotion in flight: not readable yet */
#define SB_READY       0x4u   /* in the map, serving */
#define SB_RETIRED     0x6u   /* out of the map, waiting for a grace period */
#define SB_FULL_VALID  0x8u   /* every block valid (bitmap may be absent) */
#define SB_DIRTY       0x10u  /* some block dirty */
#define SB_HAS_BM      0x20u  /* per-block bitmaps are authoritative */
#define SB_CANCEL      0x40u  /* a write met the fill: drop it */
#define SB_DESTAGING   0x80u  /* the cleaner is writing it to the backing store */
#define SB_TOPUP       0x100u /* a top-up (fill of the invalid blocks of a READY slot) runs */
#define SB_TOPUP_WR    0x200u /* ... and is writing the legs: writers park (cache_slot_wait) */
#define SB_LOGWR       0x400u /* an overwrite through the block log is in flight: others park (dlog.c) */
#define SB_FINE        0x800u /* the bitmaps are per sector, not per 4 KiB page (map.c) */
#define SB_WGEN_SHIFT  12
#define SB_WGEN_ONE    (1u << SB_WGEN_SHIFT) /* bumped at each write start */

/* cache_set.hit_lat_*: count << HIT_LAT_SHIFT | microseconds */
#define HIT_LAT_SHIFT 40

/* slot.users: readers in the low half, writers in the high half */
#define SU_READER 1u
#define SU_WRITER (1u << 16)

struct slot {
	_Atomic uint64_t key;   /* CACHE_KEY_NONE when free */
	_Atomic uint32_t bits;
	_Atomic uint32_t users;
};
_Static_assert(sizeof(struct slot) == 16, "a slot is 16 bytes of RAM");

/* ---- map -------------------------------------------------------------- */

#define MAP_EMPTY UINT32_MAX
#define MAP_TOMB (UINT32_MAX - 1)

/*
 * An entry is a slot number in its low bits and, above them (fp_mask), a
 * fingerprint of the key's hash: a probe loads a slot's key only when the
 * fingerprint matches, so the table can run fuller than 2/3 (map.c).
 */
struct map_table {
	uint32_t size;
	uint32_t used;      /* live entries */
	uint32_t tombs;
	uint32_t fp_mask;   /* entry bits holding the fingerprint (0 = none) */
	struct rcu_head rcu;
	_Atomic uint32_t e[];
};

struct cache_map {
	/* published like rcu_assign_pointer/rcu_dereference, spelled as C11
	 * release/acquire so ThreadSanitizer sees the publication too */
	_Atomic(struct map_table *) t;
	struct slot *slots;
	uint32_t nslots;
};

/* init/destroy: main thread, no reader. */
int map_init(struct cache_map *m, struct slot *slots, uint32_t nslots);
void map_destroy(struct cache_map *m);
/* Needs rcu_read_lock (or alloc_lock); lock-free, never sleeps. */
uint32_t map_lookup(struct cache_map *m, uint64_t key);
/* insert/remove: alloc_lock held; never sleep (call_rcu only queues). */
int map_insert(struct cache_map *m, uint64_t key, uint32_t slot);
void map_remove(struct cache_map *m, uint64_t key, uint32_t slot);
/* Any thread. */
uint64_t map_mem_bytes(const struct cache_map *m);

/* ---- per-block bitmaps ------------------------------------------------- */

#define BM_GROUP 64          /* slots per lazily allocated bitmap chunk */
#define BM_PAGE_SHIFT 3      /* sectors per page-grain bit: 8 (4 KiB) */

struct bm_group;

struct cache_bitmaps {
	uint32_t bpe;
	uint32_t fwords;          /* 64-bit words per per-sector bitmap (bpe / 64, >= 1) */
	uint32_t pwords;          /* 64-bit words per per-page bitmap (bpe / 512, >= 1) */
	uint32_t ngroups;
	_Atomic(struct bm_group *) *group; /* [ngroups]: NULL until a slot in it goes partial */
	_Atomic uint64_t allocated_bytes;
	_Atomic uint64_t fine_slots;       /* slots whose state is per sector now (SB_FINE) */
};

/* Main thread. */
int bm_init(struct cache_bitmaps *b, uint32_t nslots, uint32_t bpe);
void bm_destroy(struct cache_bitmaps *b);
/* A free slot is being handed out (no reader can hold it): drop its
 * per-sector bitmaps, if it had any. */
void bm_slot_reuse(struct cache_bitmaps *b, uint32_t s);

/* ---- slot state helpers (map.c) -------------------------------------- */

struct cache_set;

void slot_lock(struct slot *sl);
void slot_unlock(struct slot *sl);
/*
 * Apply an absolute per-block change to slot s (caller holds slot_lock):
 * op is a JOP_*; blocks [first, first+count).
 */
void slot_apply(struct cache_set *cs, uint32_t s, int op, uint32_t first, uint32_t count);
/* Are all of [first, first+count) valid? (no lock: atomic loads) */
bool slot_all_valid(struct cache_set *cs, uint32_t s, uint32_t first, uint32_t count);
/* Length of the run starting at first whose valid bit equals *v (set). */
uint32_t slot_valid_run(struct cache_set *cs, uint32_t s, uint32_t first, uint32_t count, bool *v);
/* Is any of [first, first+count) dirty? */
bool slot_any_dirty(struct cache_set *cs, uint32_t s, uint32_t first, uint32_t count);
/* Are all of [first, first+count) dirty? (false for a slot without bitmaps) */
bool slot_all_dirty(struct cache_set *cs, uint32_t s, uint32_t first, uint32_t count);
/* Dirty sectors of slot s, 0 unless it is READY (no lock: a snapshot). */
uint64_t slot_dirty_blocks(struct cache_set *cs, uint32_t s);
/* First dirty run at or after *first within the extent; false if none. */
bool slot_next_dirty_run(struct cache_set *cs, uint32_t s, uint32_t *first, uint32_t *count);
/* The slot's valid and dirty bits, one per sector, as the table record
 * stores them (bpe / 8 bytes each); caller holds slot_lock. */
void slot_encode_bits(struct cache_set *cs, uint32_t s, uint8_t *valid, uint8_t *dirty);

/* ---- mirror ------------------------------------------------------------ */

struct mirror_waiter;

/* request flag, internal: a superblock write does not wait for the failed mask */
#define MIRROR_F_NOWAIT 0x100
/* request flags, internal: to (or from) leg i only, errors reported, not acted on (repair.c) */
#define MIRROR_F_LEG(i) (0x200u << (i))
#define MIRROR_F_LEGS (MIRROR_F_LEG(0) | MIRROR_F_LEG(1))
/*
 * request flag, internal: a background read (a destage's). It goes to one
 * leg (the last in service), and a host's read avoids a leg with one in
 * flight while another leg has none: it then never queues behind a
 * destage at the drive.
 */
#define MIRROR_F_BG 0x800

struct mirror {
	struct bdev dev;                 /* what the engine submits to */
	struct bdev *leg[CACHE_MAX_LEGS];
	int nlegs;
	_Atomic uint32_t failed;         /* legs that erred: not read, not written */
	_Atomic uint32_t persisted;      /* failed mask known durable on the survivors */
	_Atomic uint32_t resyncing;      /* legs being rebuilt: written, not read */
	_Atomic uint32_t rr;
	_Atomic uint32_t bg_reads[CACHE_MAX_LEGS]; /* MIRROR_F_BG reads in flight per leg */
	_Atomic uint64_t errors[CACHE_MAX_LEGS];
	/* resync window: writes at or above resync_pos skip the resyncing leg */
	_Atomic uint64_t resync_pos, resync_end;
	_Atomic uint64_t resync_chunk_gen;
	_Atomic uint32_t resync_chunk_inflight;
	/* the chunk the copier has in hand: [start, start + RESYNC_CHUNK), one
	 * word so a writer never pairs one chunk's start with another's end;
	 * RESYNC_NO_CHUNK: none */
	_Atomic uint64_t resync_chunk_start;
	/* writes in flight that skipped a resyncing leg, until they were caught
	 * up or found still above the cursor; the resync ends only at 0 */
	_Atomic uint32_t resync_skip_inflight;
	void *_Atomic resync_finisher;   /* the resync waiting for that 0 (resync.c) */
	void (*resync_finish_fn)(void *rs);
	struct worker_call resync_finish_call; /* posts it: one resync at a time, its end once */
	_Atomic uint64_t resync_started_ms;  /* for the rate and ETA status shows */
	pthread_mutex_t lock;            /* the waiters list */
	struct mirror_waiter *waiters;
	/* set.c persists a new failed mask and then calls mirror_persisted */
	void (*persist)(struct mirror *m, uint32_t failed, void *arg);
	void *persist_arg;
	/*
	 * A read of leg failed with bad blocks (bdev_err_bad_blocks) and
	 * another leg serves it: 0 if the range was queued for a rewrite
	 * (repair.c), else the leg is failed.
	 */
	int (*read_error)(struct mirror *m, int leg, uint64_t off, uint64_t len, void *arg);
	/* the last leg failed (once, on the worker that saw it) */
	void (*all_failed)(struct mirror *m, void *arg);
};

/*
 * leg_guard.c: inner (taken over) as a bdev whose requests may be given up
 * on after timeout_ms (see there): timed_out(arg, the guard) runs on a
 * worker for each and says whether to. leg_guard_inner: what a guard
 * wraps, or dev itself.
 */
struct bdev *leg_guard_wrap(struct bdev *inner, uint32_t timeout_ms, bool (*timed_out)(void *arg, struct bdev *dev),
			    void *arg);
struct bdev *leg_guard_inner(struct bdev *dev);
/* Requests of guard dev past its timeout and not answered yet (0: not a guard). */
uint32_t leg_guard_unanswered(struct bdev *dev);
/* set.c: the timed_out of a set's guards (arg: the set). */
bool cache_leg_timed_out(void *arg, struct bdev *dev);

#define RESYNC_CHUNK (1u << 20)
#define RESYNC_NO_CHUNK UINT64_MAX

/* Main thread. I/O: bdev_submit(&m->dev, req) on a worker, as any bdev. */
int mirror_init(struct mirror *m, struct bdev **legs, int nlegs, uint32_t failed);
void mirror_destroy(struct mirror *m);
/* Worker exit hooks (worker_exit_hook): free the thread's cached contexts. */
void mirror_thread_release(void);
void volume_thread_release(void);
/* The failed mask m->persist was asked to write is durable. Any thread. */
void mirror_persisted(struct mirror *m, uint32_t failed);
/* Any thread, lock-free. */
bool mirror_all_failed(struct mirror *m);
/* Worker thread: a leg erred (asks the set to persist the failure). */
void mirror_leg_failed(struct mirror *m, int leg, int err);

/* ---- journal ----------------------------------------------------------- */

struct jwait {
	struct jwait *next;
	struct cache_jrec_disk rec;
	void (*done)(struct jwait *w, int err); /* on the appending worker */
	struct worker *worker;                  /* the appending worker */
	int err;
	struct worker_call call;                /* done() posted back to it: needs no memory */
};

struct journal {
	struct cache_set *cs;
	unsigned idx;
	/* The ring is half full: its owner should checkpoint so it can be
	 * reused (set up at open: cache_want_checkpoint). Any worker. */
	void (*half_full)(struct cache_set *cs);
	pthread_mutex_t lock;                  /* lists and busy; never held across I/O */
	struct jwait *pend_head, **pend_tail;  /* records waiting for a block */
	struct jwait *inflight;                /* records in the block being written */
	bool busy;
	bool full;                             /* commits wait for a checkpoint (counted once per wait) */
	struct cache_jblock_disk *buf;
	_Atomic uint64_t head;                 /* next absolute block to write */
	_Atomic uint64_t tail;                 /* oldest block still needed */
	struct bdev_req req;
	struct iovec iov;
	uint64_t commits, records;
	struct worker_call kick_call;          /* journal_kick_owner's post: needs no memory */
	_Atomic bool kick_posted;
};

/* Worker thread: append w->rec (seq filled by the caller) to the calling
 * worker's ring; w->done runs on this worker once durable. Never sleeps. */
void journal_append(struct cache_set *cs, struct jwait *w);
struct journal *journal_self(struct cache_set *cs);
/* Any worker thread. */
void journal_kick(struct journal *j);
/* Any worker thread: journal_kick on the ring's owner (journal_move_on). */
void journal_kick_owner(struct journal *j);

/* ---- block log (dlog.c) ------------------------------------------------ */

/*
 * One record in flight: from dlog_write until dlog_finish (the caller's
 * journal record that makes the overwrite current has its seq, or the
 * write ended in an error). Embedded in the writer's context.
 */
struct dlog_ent {
	struct dlog_ent *prev, *next;   /* the ring's records in flight, seq order */
	struct dlog_ent *wnext;         /* waiting for room in the ring */
	struct dlog_ring *ring;
	struct worker *w;               /* the writer's worker: done() runs there */
	struct worker_call call;        /* a retry posted to w: needs no memory */
	uint64_t seq, pos;
	uint32_t slot, first, count, npages;
	uint64_t key;
	bool live;                      /* on the in-flight list */
	struct cache_dlog_disk *hdr;    /* a pooled page */
	const struct iovec *data;
	int datacnt;
	struct iovec iov_inline[9];
	struct iovec *iov;
	struct bdev_req req;
	void (*done)(struct dlog_ent *e, int err);
	void *priv;
};

struct dlog_ring {
	struct cache_set *cs;
	unsigned idx;
	pthread_mutex_t lock;           /* all below; never held across I/O */
	uint64_t head, tail;            /* absolute page positions */
	struct dlog_ent *live_head, *live_tail;
	struct dlog_ent *wait_head, **wait_tail;
	uint32_t retrying;              /* taken off the wait list, retry posted */
	uint64_t records, waits;
};

int dlog_init(struct cache_set *cs);
void dlog_destroy(struct cache_set *cs);
/*
 * Worker thread: log count sectors of slot (holding key) from first, data
 * in iov, on every healthy leg with FUA; done(e, err) on this worker once
 * durable. The caller then writes them in place, records the change and
 * calls dlog_finish (also when it gives up).
 */
void dlog_write(struct cache_set *cs, struct dlog_ent *e, uint32_t slot, uint64_t key, uint32_t first,
		uint32_t count, const struct iovec *iov, int iovcnt, void (*done)(struct dlog_ent *, int),
		void *priv);
void dlog_finish(struct cache_set *cs, struct dlog_ent *e);
/* Checkpoint (worker 0): heads before its seq; then whether a record older than seq is in flight. */
void dlog_heads(struct cache_set *cs, uint64_t heads[CACHE_DLOG_RINGS]);
bool dlog_older_inflight(struct cache_set *cs, uint64_t seq);
/* After the checkpoint's superblock: the space before heads is free. */
void dlog_release(struct cache_set *cs, const uint64_t heads[CACHE_DLOG_RINGS]);

/* A journal record as recovery reads it (set.c), in seq order for dlog_recover. */
struct rrec {
	uint64_t seq, key;
	uint32_t slot;
	uint16_t op, first, count;
};
/*
 * Main thread, at open, after the metadata is recovered (recs: every
 * journal record replayed, seq order): put back in place, on every healthy
 * leg, each logged sector that is dirty and that no later record touched.
 * Raises next_seq above every record seen. 0, or -1 with err.
 */
int dlog_recover(struct cache_set *cs, const struct rrec *recs, size_t nrecs, char *err, size_t errlen);

/* ---- write intent (intent.c) ------------------------------------------- */

/* A write parked until its region's bit is on disk; fn(arg) then runs on w. */
struct intent_wait {
	struct intent_wait *next;
	uint32_t region;        /* filled by intent_enter: give it to intent_leave */
	struct worker *w;
	void (*fn)(void *arg);
	void *arg;
	struct worker_call call; /* fn posted to w: needs no memory */
};

struct intent {
	struct cache_set *cs;
	uint32_t region_slots;            /* slots per bit */
	uint32_t nregions;
	_Atomic uint32_t *word;           /* per region: count, ONDISK, TOUCHED (intent.c) */
	pthread_mutex_t lock;             /* waiters, busy, again, page, last; never held across I/O */
	struct intent_wait *waiters;
	bool busy, again, ready;
	int pending;
	uint8_t *page;                    /* the page being written */
	uint8_t *last;                    /* the page last written */
	struct bdev_req req[CACHE_MAX_LEGS];
	struct iovec iov[CACHE_MAX_LEGS];
	uint64_t page_writes, parked;
};

/* Slots per intent bit for a layout (stable: recovery computes it again). */
uint32_t intent_region_slots(const struct cache_layout *lay);
/* Main thread, after the layout is known / at close. */
int intent_init(struct intent *wi, struct cache_set *cs);
void intent_destroy(struct intent *wi);
/*
 * Worker thread, before the first device write of a write that touches a
 * READY slot. true: the region's bit is durable, go on. false: w (fn, arg
 * filled) is parked and w->fn(w->arg) runs on this worker once it is.
 * Either way the caller calls intent_leave(cs, w->region) once, after its
 * device writes completed. Lock-free when the bit is already on disk.
 */
bool intent_enter(struct cache_set *cs, uint32_t slot, struct intent_wait *w);
void intent_leave(struct cache_set *cs, uint32_t region);
/*
 * Worker thread: write the page to every leg again (a resync just ended:
 * its copy of the page may predate writes that bypassed the mirror).
 */
void intent_rewrite(struct cache_set *cs);
/* Worker 0, on the set's tick: clear the bits of regions idle a whole tick. */
void intent_tick(struct cache_set *cs);
/*
 * Main thread, nothing served yet, after an unclean stop (metadata recovered
 * from leg src; all: the set has no bitmap, every region is in doubt):
 * reconcile the regions in doubt (intent.c). 0, or -1 with err filled.
 */
int intent_recover(struct cache_set *cs, int src, bool all, char *err, size_t errlen);
/* Main thread, nothing in doubt any more: write an empty page. */
int intent_clear_all(struct cache_set *cs);
/* Any thread. */
void intent_stats(struct cache_set *cs, uint64_t *page_writes, uint64_t *parked, uint32_t *regions_set);

/* ---- repairs of unreadable ranges (repair.c) ------------------------------ */

#define REPAIR_MAX 64

struct repair_ent {
	uint64_t off, len;   /* leg byte range that failed to read */
	int leg;
};

/* mirror.read_error: any worker; queue the range (0) or refuse (-1: too many). */
int cache_repair_note(struct mirror *m, int leg, uint64_t off, uint64_t len, void *arg);
/* Worker 0, on the set's tick: start the queued repairs. */
void cache_repair_tick(struct cache_set *cs);

/* ---- the set ----------------------------------------------------------- */

#define CACHE_SET_MAX_VOLS CACHE_MAX_BACKINGS

struct cache_vol;

/*
 * A writer that must not pass a destage in progress (volume.c,
 * backing_then_invalidate) or a top-up writing the legs parks here until
 * SB_DESTAGING / SB_TOPUP_WR of its slot is cleared; fn(arg) is then
 * posted to worker w, which starts the write over.
 */
struct slot_wait {
	struct slot_wait *next;
	uint32_t slot;
	uint32_t mask;          /* the bit(s) waited for: SB_DESTAGING, SB_TOPUP_WR or SB_LOGWR */
	uint64_t key;           /* cache_evicted_wait's: the key whose eviction is waited for */
	struct worker *w;
	void (*fn)(void *arg);
	void *arg;
	struct worker_call call; /* fn posted to w: needs no memory */
};

struct sync_call;

/* Writes that bypass the cache are counted per extent hash bucket: a fill
 * or a destage of an extent whose bucket has one in flight stands back. */
#define BYPASS_BUCKET_BITS 10
#define BYPASS_BUCKETS (1u << BYPASS_BUCKET_BITS)
static inline uint32_t bypass_bucket(uint64_t key)
{
	return (uint32_t)((key * 0x9e3779b97f4a7c15ULL) >> (64 - BYPASS_BUCKET_BITS));
}

/* Slot allocation and eviction (slots.c). */
struct set_alloc {
	pthread_mutex_t lock;         /* free list, map inserts/removes, policy structures */
	uint64_t *free_bits;          /* a bit per slot: on the free list (1 bit, not 4 bytes, per slot) */
	_Atomic uint32_t nfree;       /* written under lock, read anywhere as a hint */
	/* In eviction batches (cache_reclaim, cache_drop_slot) on their way
	 * to the free list (FREE record, grace period), under lock: a reclaim
	 * counts them as free already, or every miss that finds the pool empty
	 * meanwhile would evict another batch and the cache would empty itself
	 * under churn. */
	_Atomic uint32_t nfreeing;
	/*
	 * Eviction batches (cache_reclaim) whose slots are on that way, under
	 * lock: until a batch is released (its FREE records durable) its keys
	 * are not cached again, and a host's write to one waits
	 * (evict_waiters), so an old slot a power cut brings back never holds
	 * data older than what was acknowledged (slots.c). nevicting: their
	 * keys, counted before they leave the map (a writer that misses them
	 * in the map sees the count).
	 */
	struct evict_batch *evicting;
	_Atomic uint32_t nevicting;
	struct slot_wait *evict_waiters;
	uint32_t cursor;              /* where free_pop looks first */
	/*
	 * Slots dropped when no eviction batch could be allocated (out of
	 * memory), under lock: retire_bits wait for a grace period to start,
	 * grace_bits are in the one under way (retire_rcu queued,
	 * retire_inflight); they reach the free list when it ends. A bit
	 * each per slot, so dropping a slot never allocates and a worker
	 * never waits for a grace period.
	 */
	uint64_t *retire_bits, *grace_bits;
	bool retire_inflight;
	struct rcu_head retire_rcu;
	_Atomic bool reclaim_pending;
};

/*
 * A superblock write's waiter (sb.c), embedded in what waits: asking for a
 * write needs no memory, so it cannot be lost when memory runs out. One
 * write at a time per job: reuse it once its callback has started.
 */
struct sb_job {
	struct worker_call call;
	struct sb_job *next;
	struct cache_set *cs;
	void (*cb)(void *arg, int err);
	void *arg;
};

/* Superblock writes (sb.c): one at a time, callers queued behind it. */
struct set_sb {
	pthread_mutex_t lock;
	uint64_t gen;
	struct sb_job *waiting, *inflight;
	_Atomic int jobs;               /* writes asked for whose generation has not finished */
	bool busy;
	bool kick, kick_inflight;       /* worker 0: a generation nobody waits on is wanted / in flight */
	_Atomic bool kick_posted;       /* kick_call is on its way to worker 0 */
	struct worker_call kick_call, fail_call;
	uint32_t built_failed;          /* the failed legs the generation in flight records */
	_Atomic uint32_t include;       /* resyncing legs that superblock writes reach anyway (resync.c) */
	int pending, ok;
	struct cache_sb_disk *buf[CACHE_MAX_LEGS];
	struct bdev_req req[CACHE_MAX_LEGS];
	struct iovec iov[CACHE_MAX_LEGS];
	/* the backing table, when the generation in flight carries a new one:
	 * written on each leg before that leg's superblock (tab_req) */
	struct cache_btab_disk *tab;    /* CACHE_BTAB_BYTES, aligned */
	struct bdev_req tab_req[CACHE_MAX_LEGS];
	struct iovec tab_iov[CACHE_MAX_LEGS];
};

/* Checkpoints (ckpt.c). */
struct set_ckpt {
	_Atomic uint8_t *dirty;       /* a bit per slot: record changed since checkpoint */
	uint64_t seq;                 /* the last durable checkpoint's: replay from here */
	bool running;
	_Atomic bool wanted;
	_Atomic bool want_posted, resume_posted; /* want_call, resume_call on their way to worker 0 */
	struct worker_call want_call, resume_call;
	struct sync_call *queued;     /* waits for the running checkpoint to end (worker 0) */
	bool queued_final;
	struct ckpt *run;             /* the one running, its buffers kept for the next */
};

/* Read errors waiting for a rewrite (repair.c). */
struct set_repair {
	pthread_mutex_t lock;
	struct repair_ent q[REPAIR_MAX];
	int n;
	/* per leg: ranges noted for a rewrite since read_err_since (ms, monotonic), for max_read_errors */
	uint32_t read_errs[CACHE_MAX_LEGS];
	uint64_t read_err_since[CACHE_MAX_LEGS];
	const struct bdev *read_err_dev[CACHE_MAX_LEGS]; /* the device they were counted on */
};

/* Lost dirty data (both legs gone), as met by reads: cache_lost_note (lost.c). */
struct set_lost {
	pthread_mutex_t lock;         /* the fields below; never held across I/O */
	struct lost_range {
		uint32_t bid;
		char lun[64];         /* the LUN's name when the loss was seen */
		uint64_t lo, hi;      /* backing byte offsets [lo, hi) */
	} r[CACHE_LOST_MAX];          /* sorted by (bid, lo), disjoint, not adjacent */
	int n;
	uint64_t dropped;             /* ranges not recorded: the list was full */
};

/* Counters, for status (set_status.c); relaxed, summed on read. */
struct set_stats {
	_Atomic uint64_t read_hits, read_misses, read_partial, write_hits, write_misses;
	_Atomic uint64_t promotions, topups, evictions, destaged_bytes, lost_ios;
	_Atomic uint64_t read_errors, repairs, leg_timeouts;
	_Atomic uint64_t dlog_records, dlog_waits;
	_Atomic uint64_t one_trip_writes; /* write-back pieces whose record went with their data */
	_Atomic uint64_t no_record_writes; /* ... that overwrote dirty blocks and needed none */
	_Atomic uint64_t checkpoints;      /* whose superblock was written */
	_Atomic uint64_t journal_full_waits; /* times a ring was full and its commits waited for one */
	_Atomic uint64_t journal_moves;      /* times a busy worker took its records to its next ring (journal.c) */
};

struct cache_set {
	char *name;
	struct cache_set_cfg cfg;
	struct cache_layout lay;
	uint32_t version;             /* of the on-disk format: 4 (lay.dlog_pages: with a block log) */
	uint8_t uuid[16];
	uint8_t leg_uuid[CACHE_MAX_LEGS][16]; /* the member at each index (superblock member_uuid) */
	struct mirror mirror;
	struct intent intent;
	struct bdev *legs[CACHE_MAX_LEGS];
	/* what each leg device was sent (legs[i]->io points at one; a
	 * replacement takes over its leg's), padded so that no count shares a
	 * cache line with anything else: written on every leg I/O */
	struct {
		char before[64];
		struct bdev_io_counts c;
		char after[64];
	} leg_io[CACHE_MAX_LEGS];
	struct slot *slots;
	struct cache_map map;
	struct cache_bitmaps bm;
	struct policy *policy;
	struct advisor *advisor;      /* the sizing advisor's copies (NULL: out of memory at open) */
	_Atomic(struct cache_trace *) trace; /* tierctl trace: NULL when none runs (trace.c) */
	_Atomic(struct cache_vol *) vols[CACHE_SET_MAX_VOLS]; /* by backing id: cache_vol_of */
	/*
	 * A volume is closed while the daemon serves (a reload removed its
	 * LUN): readers on threads outside RCU (status, the advisor's names)
	 * hold vols_lock while they look into a volume they found in vols[],
	 * and vol_close takes it out of vols[] under it. vols_open[id]: the
	 * volumes of that id not closed yet (a LUN configured again while its
	 * old volume waits has two); prune frees no entry with one left.
	 */
	pthread_mutex_t vols_lock;
	atomic_uint vols_open[CACHE_SET_MAX_VOLS];
	/*
	 * The backing table (attach.c), under sb.lock: by backing id. A
	 * change sets btab_changed; the next superblock generation writes the
	 * table into copy 1 - btab_leg[i] of each leg it writes first, and
	 * names it there (sb.c). Per leg: after a crash one leg's newest
	 * superblock may name the other copy than the other leg's.
	 */
	struct cache_btab_disk backing[CACHE_MAX_BACKINGS];
	uint32_t btab_leg[CACHE_MAX_LEGS]; /* the copy leg i's newest superblock names */
	uint32_t btab_crc;              /* the table's checksum (every leg's named copy) */
	bool btab_changed;
	struct set_alloc alloc;
	_Atomic uint64_t next_seq;
	struct journal journals[CACHE_NJOURNALS];
	uint8_t jcur[CACHE_NJOURNALS]; /* per worker: which of its rings it appends to (journal_self) */
	uint64_t jtail[CACHE_NJOURNALS];
	/*
	 * A two-leg set running on one of them (allow_single_leg): that leg's
	 * index in the set (-1: not so) and the other member's identity. Its
	 * superblocks keep saying two legs, and record the other as failed:
	 * it misses every write from now on.
	 */
	int alone_index;
	uint8_t alone_other_uuid[16];
	struct dlog_ring dlog[CACHE_DLOG_RINGS];
	_Atomic bool dlog_ckpt_wait;  /* a checkpoint waits for an older record to finish */
	struct set_sb sb;
	struct set_ckpt ck;
	bool clean_flag;              /* what the next superblock says */
	struct set_repair repair;
	/* in-flight writes that bypass the cache, by bypass_bucket(key) (fills check) */
	_Atomic uint32_t bypass[BYPASS_BUCKETS];
	struct set_stats st;
	_Atomic uint64_t dirty_blocks;  /* approximate: blocks marked dirty */
	/* writers waiting for a destage or top-up to end: cache_slot_wait */
	pthread_mutex_t dwait_lock;
	struct slot_wait *dwait;
	struct set_lost lost;
	struct cleaner *cleaner;
	_Atomic uint32_t flush_req;      /* >0: the cleaner ignores its rate limit */
	struct worker_tick tick;
	struct bdev *old_legs[8];       /* replaced legs, closed with the set */
	int nold_legs;
	int blank_leg;                  /* open found this leg blank: resync it (-1: none) */
	_Atomic bool open_done;         /* cache_set_open finished: legs may be failed by timeouts */
	/* activity: last foreground I/O (ms), for idle detection */
	_Atomic uint64_t last_io_ms;
	_Atomic uint64_t fg_inflight;
	/*
	 * What destaging does to the host (cleaner.c, "Foreground first"):
	 * destage_state is the destages started << 8 | those in flight (the
	 * cleaner's only); hit_lat_all and hit_lat_quiet sum the latency of
	 * the reads that hit, all of them and those no destage overlapped,
	 * as count << HIT_LAT_SHIFT | microseconds, until the cleaner takes
	 * them; hit_slow_* count those of each kind slower than hit_slow_us
	 * (set by the cleaner, 0: none counted).
	 */
	_Atomic uint64_t destage_state;
	_Atomic uint64_t hit_lat_all, hit_lat_quiet;
	_Atomic uint64_t hit_slow_all, hit_slow_quiet, hit_slow_us;
	_Atomic uint64_t bg_inflight;   /* fills and eviction batches in flight */
	_Atomic int stopping;
};

static inline uint64_t cache_key(uint32_t bid, uint64_t ext) { return (uint64_t)bid << 40 | ext; }
static inline uint32_t key_bid(uint64_t key) { return (uint32_t)(key >> 40); }
static inline uint64_t key_ext(uint64_t key) { return key & ((1ull << 40) - 1); }
static inline uint64_t slot_leg_off(const struct cache_set *cs, uint32_t s)
{
	return cs->lay.data_off + (uint64_t)s * cs->lay.extent_size;
}

/* Allocate a global sequence number (journal order). */
static inline uint64_t cache_seq(struct cache_set *cs) { return atomic_fetch_add(&cs->next_seq, 1); }

/* mark slot's table record as changed since the last checkpoint */
static inline void ckpt_mark(struct cache_set *cs, uint32_t s)
{
	atomic_fetch_or(&cs->ck.dirty[s / 8], (uint8_t)(1u << (s % 8)));
}

/*
 * Record an absolute change of slot s: takes seq, applies it in RAM,
 * marks the table record dirty and fills w->rec, all under the slot lock;
 * then appends w to the calling worker's journal (w->done runs when the
 * record is durable on every healthy leg). Worker thread.
 */
void cache_record(struct cache_set *cs, uint32_t s, int op, uint32_t first, uint32_t count,
		  struct jwait *w);
/*
 * Worker thread, slot s's lock held and w->mask (SB_DESTAGING or
 * SB_TOPUP_WR) seen set on it: park w (w->fn, w->arg filled) until that is
 * cleared; w->fn then runs on the calling worker. cache_slot_wake: whoever
 * cleared a bit under the slot lock releases the slot's waiters whose bits
 * are now clear (a waiter for the other bit stays parked: woken, it would
 * only retry, and its retry's write-generation bump would cost a destage
 * its CLEAN records).
 */
void cache_slot_wait(struct cache_set *cs, uint32_t s, struct slot_wait *w);
void cache_slot_wake(struct cache_set *cs, uint32_t s);
/* Same, with the slot lock already held by the caller (who unlocks). */
void cache_record_locked(struct cache_set *cs, uint32_t s, uint64_t key, int op, uint32_t first,
			 uint32_t count, struct jwait *w);

/* Background work (a destage) holding a volume it found with cache_vol_of
 * under the RCU read lock: the volume is not freed until it lets go. */
void cache_vol_hold(struct cache_vol *v);
void cache_vol_release(struct cache_vol *v);

/* The volume attached with backing id bid, or NULL (not attached this
 * run, or detached). Any thread. The cleaner and the engine reach volumes
 * only through this; a volume is closed only with none of its I/O or
 * destages in flight (vol_close). */
static inline struct cache_vol *cache_vol_of(struct cache_set *cs, uint32_t bid)
{
	return atomic_load(&cs->vols[bid]);
}

/* The free list, under alloc_lock. */
static inline void free_push(struct cache_set *cs, uint32_t s)
{
	cs->alloc.free_bits[s / 64] |= 1ull << (s % 64);
	cs->alloc.nfree++;
}
static inline uint32_t free_pop(struct cache_set *cs)
{
	uint32_t words = (cs->lay.nslots + 63) / 64;
	for (uint32_t k = 0; k <= words; k++) {
		uint32_t w = (cs->alloc.cursor + k) % words;
		if (cs->alloc.free_bits[w]) {
			uint32_t s = w * 64 + (uint32_t)__builtin_ctzll(cs->alloc.free_bits[w]);
			cs->alloc.free_bits[w] &= cs->alloc.free_bits[w] - 1;
			cs->alloc.cursor = w;
			cs->alloc.nfree--;
			return s;
		}
	}
	return POLICY_NO_SLOT;
}

/*
 * Dirty blocks [first, first+count) of slot s (which holds an extent of
 * backing bid; block `first` is at backing offset off) could not be read
 * with every leg gone: record their dirty runs as lost ranges. Any worker
 * thread; takes lost_lock (a short critical section, no I/O, no sleep);
 * the caller keeps the slot pinned so its bitmaps stay the slot's.
 */
void cache_lost_note(struct cache_set *cs, uint32_t bid, uint32_t s, uint64_t off, uint32_t first,
		     uint32_t count);

/* Take a free slot for key and insert it (state given). POLICY_NO_SLOT if none. */
uint32_t cache_alloc_slot(struct cache_set *cs, uint64_t key, uint32_t state, uint32_t *existing);
/* Drop a slot that never became valid (a cancelled fill). Worker thread. */
void cache_drop_slot(struct cache_set *cs, uint32_t s);
int cache_purge_bid(struct cache_set *cs, uint32_t bid, bool *busy, int *count, void (*done)(void *arg),
		    void *arg);
/* Evict clean slots when the free list runs low; reclaim retired slots. Worker. */
void cache_reclaim(struct cache_set *cs);
/*
 * Worker thread, a host's write (any kind) to key, which holds no slot: if
 * key's eviction is under way (its FREE not durable yet), w is parked,
 * fn(arg) is posted back to this worker once it is, and true is returned.
 */
bool cache_evicted_wait(struct cache_set *cs, uint64_t key, struct slot_wait *w, void (*fn)(void *), void *arg);
/* Ask for a checkpoint (journal filling up). Any thread. */
void cache_want_checkpoint(struct cache_set *cs);
void cache_ckpt_resume(struct cache_set *cs);
/* Write the superblock to every healthy leg; cb on the calling worker. */
/* Any thread. cb(arg, err) runs on worker 0 once a superblock generation
 * built after this call is durable (err: no leg took it). Cannot fail. */
void cache_sb_write(struct cache_set *cs, struct sb_job *j, void (*cb)(void *arg, int err), void *arg);
/* The same, and wait for it: 0 or -errno. Main (control) thread. */
int cache_sb_write_wait(struct cache_set *cs);
/* Any thread: have a new generation written, with nobody waiting on it
 * (calls coalesce). Needs no memory. */
void cache_sb_kick(struct cache_set *cs);

/* volume.c: any thread, read-only accessors; cache_vol_new main thread. */
struct bdev *cache_vol_backing(struct cache_vol *v);
struct cache_set *cache_vol_set(struct cache_vol *v);
struct cache_vol *cache_vol_new(struct cache_set *cs, const char *lun, struct bdev *backing, uint32_t bid,
				enum cache_mode mode);
enum cache_mode cache_vol_mode(struct cache_vol *v);
void cache_vol_store_mode(struct cache_vol *v, enum cache_mode m);
const char *cache_vol_name(struct cache_vol *v);
/* Destages to v's backing store (volume.c): a write failed with err, or
 * one worked, or v has nothing dirty left (worker 0); may the next wait?
 * (any thread); the state for status: err 0 when working, failed
 * attempts, ms until the next one. */
void cache_vol_destage_failed(struct cache_vol *v, int err);
void cache_vol_destage_works(struct cache_vol *v);
void cache_vol_destage_idle(struct cache_vol *v);
bool cache_vol_destage_waits(struct cache_vol *v);
void cache_vol_destage_state(struct cache_vol *v, int *err, uint64_t *failures, uint64_t *retry_in_ms);
uint32_t cache_vol_bid(struct cache_vol *v);

/* cleaner.c: new/free main thread; tick on worker 0; stats any thread. */
struct cleaner;
struct cleaner *cleaner_new(struct cache_set *cs);
void cleaner_free(struct cleaner *c);
void cleaner_tick(struct cleaner *c);
void cleaner_stats(struct cleaner *c, uint64_t *rate_bps, uint64_t *busy);
void cleaner_set_max(struct cleaner *c, uint64_t bps, uint32_t iops);
void cleaner_get_max(struct cleaner *c, uint64_t *bps, uint32_t *iops);
void cleaner_yield_stats(struct cleaner *c, uint64_t *pause_us, uint64_t *quiet_us, uint64_t *pauses);


/* helpers shared by the files: synchronous I/O from the main thread */
int cache_sync_io(struct bdev *dev, enum bdev_op op, uint64_t off, void *buf, uint64_t len,
		  unsigned flags);

/* ---- the set's own machinery, split over set.c (open, format, close),
 * sync.c, sb.c, slots.c, ckpt.c, recover.c, attach.c, lost.c and
 * set_status.c ---- */

/* A call the main thread runs on worker 0 and waits for (sync.c). */
struct sync_call {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool done;
	int err;
	struct cache_set *cs;
	struct sb_job job;            /* for a superblock write it waits on */
};
/* Post fn(c) to worker 0 and wait until it calls cache_sync_done. */
int cache_sync_run(void (*fn)(void *), struct sync_call *c);
int cache_sync_run_on(struct worker *w, void (*fn)(void *), struct sync_call *c);
void cache_sync_done(struct sync_call *c, int err);

/* Format err and return -1 (open and attach errors). */
int cache_errf(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* The mirror's callbacks into the set (sb.c): persist a leg failure in
 * the superblock; every leg failed. */
void cache_persist_failed(struct mirror *m, uint32_t failed, void *arg);
void cache_all_legs_failed(struct mirror *m, void *arg);

/* Checkpoints (ckpt.c). */
#define CKPT_INFLIGHT 8

struct ckpt {
	struct cache_set *cs;
	uint64_t heads[CACHE_NJOURNALS];
	uint64_t dheads[CACHE_DLOG_RINGS]; /* block log heads */
	uint64_t seq;
	uint32_t npages, rpp, cursor;
	int inflight;
	bool final;                   /* clean shutdown: set the clean flag */
	struct sync_call *waiter;
	struct sb_job sbj;
	void *buf[CKPT_INFLIGHT];
	struct bdev_req req[CKPT_INFLIGHT];
	struct iovec iov[CKPT_INFLIGHT];
	bool busy[CKPT_INFLIGHT];
};
/* One slot's table record. */
void cache_encode_slot(struct cache_set *cs, uint32_t s, uint8_t *rec);
/* On worker 0, for cache_sync_run: the final checkpoint (clean stop) or one now. */
void cache_ckpt_final_fn(void *arg);
void cache_ckpt_now_fn(void *arg);

/* Recovery at open (recover.c): load leg's checkpoint, replay the journals. */
int cache_recover_set(struct cache_set *cs, int leg, char *err, size_t errlen);
int cache_journal_cut_heads(struct cache_set *cs);

#endif
