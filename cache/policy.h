/*
 * policy.h - which extents deserve a cache slot, and which slot to give up.
 *
 * The engine (cache/volume.c) owns slots: slot i of a cache set holds one
 * extent of some backing store. The policy sees only slot numbers and extent
 * keys; it never touches data or metadata. It decides:
 *  - admission: should a missed extent be promoted now? (hit-count
 *    threshold like Open CAS nhit, sequential-stream bypass above a cutoff
 *    like bcache, so one scan cannot flush the hot set);
 *  - eviction: which resident slot to reuse (cold clean extents first;
 *    a dirty slot is never chosen: the engine says which are clean).
 *
 * Extent key: (backing id << 40) | extent index; unique per cache set.
 *
 * Threading contract:
 *  - policy_touch: any worker thread, lock-free and wait-free (the hit
 *    path calls it under RCU read lock); it only sets per-slot bits.
 *  - policy_admit: any worker thread, lock-free (atomic counters in a
 *    small sketch); may be called for every miss.
 *  - policy_insert, policy_remove, policy_victim: serialized by the caller
 *    (the engine's allocation lock); may not sleep.
 *  - policy_new/free: main thread.
 */
#ifndef TC_CACHE_POLICY_H
#define TC_CACHE_POLICY_H

#include <stdbool.h>
#include <stdint.h>

#define POLICY_NO_SLOT UINT32_MAX

struct policy_cfg {
	uint32_t nslots;
	uint32_t admit_hits;        /* misses on an extent before it is promoted (>= 1) */
	uint64_t seq_cutoff;        /* bytes; a stream longer than this bypasses (0 = never) */
	uint32_t extent_size;       /* bytes */
	/* Added after the first version; zero keeps the behaviour above. */
	uint32_t write_admit_hits;  /* threshold for write misses (0 = admit_hits) */
	uint32_t fill_admit_pct;    /* admit every non-sequential miss while fewer than
				       this % of slots are resident (0 = off; OCF's
				       nhit trigger is 80) */
};

struct policy;

struct policy *policy_new(const struct policy_cfg *cfg);
void policy_free(struct policy *p);

/*
 * A request touched [offset, offset+len) of backing store bid, which is not
 * (entirely) cached. Returns true when the extent at key should be promoted
 * now. Tracks per-stream sequentiality from offset/len.
 */
bool policy_admit(struct policy *p, uint64_t key, uint32_t bid, uint64_t offset, uint32_t len,
		  bool is_write);

/*
 * policy_admit in two halves, for a caller that sees the stream in one
 * place and decides admission in another (cache/advisor.c: the stream of
 * every request, admission in sampled miniature caches). policy_stream
 * records [offset, offset+len) of bid in p's stream table, as policy_admit
 * does, and says where the request stands in its stream; policy_admit_run
 * is the rest of policy_admit for that answer (p's sketch, threshold and
 * seq_cutoff). policy_admit(p, ...) is policy_stream(p, ...) then
 * policy_admit_run(p, ...). Same threading as policy_admit.
 */
struct policy_run {
	uint32_t run;       /* sectors in the stream, this request included */
	uint32_t prev_run;  /* sectors before it (0: it starts a stream) */
};
void policy_stream(struct policy *p, uint32_t bid, uint64_t offset, uint32_t len, struct policy_run *r);
bool policy_admit_run(struct policy *p, uint64_t key, uint64_t offset, const struct policy_run *r,
		      bool is_write);

/* A request hit resident slot. */
void policy_touch(struct policy *p, uint32_t slot);

/* slot now holds key (after promotion or recovery). */
void policy_insert(struct policy *p, uint32_t slot, uint64_t key);
/* slot no longer holds anything. */
void policy_remove(struct policy *p, uint32_t slot);

/*
 * Pick a resident slot to reuse, or POLICY_NO_SLOT if none is evictable.
 * is_clean(slot, arg) tells whether a slot may be dropped now (clean, not
 * busy). The chosen slot is removed from the policy's structures.
 */
uint32_t policy_victim(struct policy *p, bool (*is_clean)(uint32_t slot, void *arg), void *arg);

/* Bytes of RAM the policy uses (for the RAM-per-GB benchmark). */
uint64_t policy_mem_bytes(const struct policy *p);

/* Counters for status output. Caller's allocation lock (as for
 * policy_victim); the admit counters are a snapshot, not a consistent cut. */
struct policy_stats {
	uint64_t admitted;          /* policy_admit said yes */
	uint64_t below_threshold;   /* said no: too few recent misses */
	uint64_t seq_bypassed;      /* said no: stream longer than seq_cutoff */
	uint32_t resident;          /* slots holding an extent */
	uint32_t probation;         /* of which in the small (probation) queue */
};
void policy_get_stats(const struct policy *p, struct policy_stats *st);

#endif
