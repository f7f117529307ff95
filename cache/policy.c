/*
 * policy.c - admission and eviction for the cache tier.
 *
 * Why this file exists: an NVMe slot is precious and promoting an extent
 * costs an HDD read plus an NVMe write, so we promote only extents that
 * show reuse, never let one big scan push out the hot set, and when a slot
 * must be reused we give up a cold, clean one. Three pieces, each sized to
 * stay a few bytes per slot (the engine's whole budget is 24 bytes per slot:
 * 100 KB per GB at 256 KiB extents; this file uses about 3 of them):
 *
 * 1. Miss sketch (admission threshold, like Open CAS "nhit").
 *    Open CAS counts misses per core line in a hash table under locks; we
 *    keep a TinyLFU-style approximate count instead, because it is a fixed
 *    few bytes per slot and needs no lock. One 64-bit word per four slots holds a 32-bit
 *    doorkeeper (a Bloom filter: "missed before?", 3 bits per key) and eight
 *    4-bit counters (misses after the first, count-min with 2 counters per
 *    key, conservative update: only the counters at the minimum grow). A
 *    key's bits all live in one word, so one compare-and-swap counts a miss.
 *    A one-touch key costs 3 doorkeeper bits and no counter, so random scans
 *    barely disturb the counts. An extent is promoted on the miss that
 *    brings its count to admit_hits. Aging: every SKETCH_AGE_EVERY misses
 *    the word under a shared cursor loses its doorkeeper bits and halves its
 *    counters, so each word ages once per 2 x nslots misses; reuse older
 *    than that is forgotten. Lock-free, a bounded number of CAS tries (a
 *    miss lost to contention only delays one promotion). 2 bytes per slot.
 *
 * 2. Sequential-stream bypass (like bcache's sequential_cutoff).
 *    A small direct-mapped table remembers recent streams by where they end:
 *    entry = hash(backing id, end offset) -> run length so far. A request
 *    that starts where a remembered stream ended continues it; once the run
 *    (this request included) is longer than seq_cutoff, the request bypasses
 *    the cache and is not counted in the sketch either, so a nightly backup
 *    neither fills the cache nor makes its extents look reused. Each entry is
 *    one 64-bit word (40-bit tag, 24-bit run in sectors); continuing a stream
 *    consumes its old entry with one CAS and stores the new end: lock-free,
 *    and a lost race only shortens a run. 256 entries are shared by all
 *    backing stores (2 KiB): "a few streams per backing store" as in bcache,
 *    without its lock and LRU list.
 *    A request continuing a stream inside the extent the previous request of
 *    that stream already counted is not counted again: 64 small sequential
 *    reads of one extent are one visit, not 64 reuses.
 *
 * 3. Eviction: S3-FIFO (Yang et al., SOSP'23) laid over the slot array.
 *    S3-FIFO keeps a small FIFO (10% of the cache) for new entries, a main
 *    FIFO with a 2-bit CLOCK for the rest, and a ghost FIFO of keys recently
 *    dropped from the small queue. New extents go to the small queue; while
 *    it holds its share or more, eviction takes from it: its oldest entry
 *    moves to main if it was hit while there, else it is evicted. So a scan only ever churns the small queue,
 *    and the hot set in main is untouched. Main evicts with CLOCK: a slot
 *    with hits left loses one and stays, a slot at zero goes.
 *    Here:
 *     - per slot, 4 bits (two slots per atomic byte, 0.5 bytes per slot):
 *       2-bit hit counter, queue (free, small, main) and whether a
 *       small-ring entry names it. policy_touch is one relaxed load and,
 *       unless the counter is already at 3, one CAS: wait-free, and a hot
 *       slot's byte stays shared-clean in every CPU cache.
 *     - the small FIFO is a ring of slot numbers sized to 1.5 x its 10%
 *       share, 3 bytes an entry up to 2^24 slots (0.45 bytes per slot).
 *       policy_remove leaves a stale entry that is skipped when it reaches
 *       the head; an overfull ring (the cache is still filling, nobody
 *       evicts) moves its oldest entry to main, as libCacheSim's S3-FIFO
 *       does when the cache is not full.
 *     - main is not a list at all: a CLOCK hand sweeps the slot array and
 *       looks only at main slots. A victim's slot is refilled right behind
 *       the hand, so the hand order is the FIFO order, at zero bytes.
 *     - the ghost FIFO is the miss sketch: an extent being inserted whose
 *       sketch count is admit_hits + 2 or more kept missing after it was
 *       first admitted (it was evicted and came back), which is what a
 *       ghost hit means; it goes straight to main. Zero bytes, where a
 *       real ghost FIFO of keys would cost 8 bytes per main slot.
 *     - dirty or busy slots (is_clean says no) are never chosen: the small
 *       queue requeues them, the CLOCK hand passes them (their hit counter
 *       still decays, so once the cleaner has written them back they are
 *       among the first to go). Cold clean extents go first.
 *
 * Threading: see each function. policy_touch and policy_admit run on any
 * worker thread without locks; insert, remove and victim are serialized by
 * the engine's allocation lock. All per-slot and sketch accesses are C11
 * atomics (relaxed: this is a heuristic, the engine's lock and RCU order the
 * data); nothing here sleeps or allocates after policy_new.
 */
#include "cache/policy.h"
#include "common/hash.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* Slot state, as the code below reads and writes it (stored as a nibble:
 * see slot_encode). */
#define SLOT_FREQ_MASK   0x03u  /* hits, saturating at 3 */
#define SLOT_FREQ_MAX    3u
#define SLOT_QUEUE_MASK  0x0cu
#define SLOT_FREE        0x00u
#define SLOT_SMALL       0x04u
#define SLOT_MAIN        0x08u
#define SLOT_IN_RING     0x10u  /* an entry in the small ring names this slot */

#define SMALL_PCT        10     /* S3-FIFO's share for the probation queue */

#define SKETCH_COUNTER_MAX    15u  /* so thresholds above 15 are clamped */
#define SKETCH_SLOTS_PER_WORD 4u   /* one 64-bit word per 4 slots: 2 B/slot */
#define SKETCH_MIN_WORDS      64u
/* Misses per aged word: each word ages once per 2 x nslots misses. The
 * replay benchmark chose it: 1 x nslots halves the doorkeeper's false
 * positives but loses reuse at distances of about one cache turnover. */
#define SKETCH_AGE_EVERY      8u
#define SKETCH_CAS_TRIES      4
/* Misses beyond admit_hits that count as a ghost hit (see policy_insert). */
#define GHOST_MISSES          2u

#define STREAM_ENTRIES   256u   /* streams remembered, all backing stores */
#define STREAM_RUN_BITS  24
#define STREAM_RUN_MAX   ((1u << STREAM_RUN_BITS) - 1)  /* in sectors: 8 GiB */
#define SECTOR_SHIFT     9

#define KEY_EXTENT_MASK  ((UINT64_C(1) << 40) - 1)

struct policy {
	uint32_t nslots;
	uint32_t admit_hits;
	uint32_t write_admit_hits;
	uint32_t fill_admit_pct;
	uint64_t seq_cutoff;
	uint32_t extent_size;

	_Atomic uint8_t *slot_state;       /* a nibble per slot: nslots / 2 + 1 bytes */

	/* Small (probation) FIFO: caller's lock. */
	uint8_t *ring;                     /* ring_cap entries of ring_width bytes */
	uint32_t ring_cap;
	uint32_t ring_width;               /* 3 while slot numbers fit in 24 bits, else 4 */
	uint32_t ring_head;                /* oldest entry */
	uint32_t ring_len;                 /* entries, stale ones included */
	uint32_t small_target;
	uint32_t small_live;               /* slots in the small queue */
	uint32_t main_live;
	uint32_t hand;                     /* CLOCK hand over main slots */
	_Atomic uint32_t resident;         /* written under lock, read by admit */

	/* Miss sketch: lock-free. */
	_Atomic uint64_t *sketch;
	uint32_t sketch_words;
	/* Written by every miss on every thread: own cache line, away from
	 * the fields the allocation lock guards. */
	_Alignas(64) _Atomic uint64_t misses;   /* drives the aging cursor */
	_Atomic uint64_t n_admitted;
	_Atomic uint64_t n_below_threshold;
	_Atomic uint64_t n_seq_bypassed;

	/* Stream table: lock-free. */
	_Alignas(64) _Atomic uint64_t streams[STREAM_ENTRIES];
};

/* ---- hashing ---------------------------------------------------------- */

/* Map 32 hash bits onto [0, n) without a division. */
static uint32_t reduce32(uint32_t h, uint32_t n)
{
	return (uint32_t)(((uint64_t)h * n) >> 32);
}

static uint32_t clamp_threshold(uint32_t v)
{
	if (v < 1)
		return 1;
	if (v > SKETCH_COUNTER_MAX)
		return SKETCH_COUNTER_MAX;
	return v;
}

/* ---- miss sketch ------------------------------------------------------- */

/*
 * One 64-bit word per four slots. Bits 0-31: the doorkeeper, a Bloom filter
 * that answers "missed before?" with 3 bits per key; bits 32-63: eight 4-bit
 * counters of misses after the first (count-min, 2 per key). The doorkeeper
 * (TinyLFU's trick) means a key missed once costs bits, not a counter, so
 * one-touch scans barely load the counters. One CAS updates a key's bits
 * and counters together.
 */
#define DK_BITS       0x00000000ffffffffull
#define CM_LOW_BITS   0x7777777700000000ull   /* counters after a halving */

struct sketch_pos {
	uint32_t word;
	uint64_t dk_mask;      /* the key's doorkeeper bits */
	unsigned shift[2];     /* bit offset of each of the key's counters */
};

static struct sketch_pos sketch_locate(const struct policy *p, uint64_t key)
{
	uint64_t h = hash_mix64(key ^ 0x9e3779b97f4a7c15ull);
	struct sketch_pos pos;

	pos.word = reduce32((uint32_t)(h >> 32), p->sketch_words);
	pos.dk_mask = (UINT64_C(1) << (h & 31)) | (UINT64_C(1) << ((h >> 5) & 31)) |
		      (UINT64_C(1) << ((h >> 10) & 31));
	pos.shift[0] = 32 + 4 * (unsigned)((h >> 15) & 7);
	pos.shift[1] = 32 + 4 * (unsigned)((h >> 18) & 7);
	return pos;
}

static unsigned counter_at(uint64_t word, unsigned shift)
{
	return (unsigned)(word >> shift) & 15;
}

/* Misses on the key recorded in word: 0, or 1 + the smaller counter. */
static unsigned sketch_count(uint64_t word, const struct sketch_pos *pos)
{
	if ((word & pos->dk_mask) != pos->dk_mask)
		return 0;
	unsigned a = counter_at(word, pos->shift[0]), b = counter_at(word, pos->shift[1]);
	return 1 + (a < b ? a : b);
}

/* Estimate of recent misses on key. Lock-free, read-only. */
static unsigned sketch_estimate(const struct policy *p, uint64_t key)
{
	struct sketch_pos pos = sketch_locate(p, key);

	return sketch_count(atomic_load_explicit(&p->sketch[pos.word], memory_order_relaxed),
			    &pos);
}

/*
 * Age one word every SKETCH_AGE_EVERY misses, walking the array with a
 * shared cursor: clear its doorkeeper, halve its counters. One CAS attempt:
 * if it loses to an increment, that word simply ages a round later.
 */
static void sketch_age_step(struct policy *p)
{
	uint64_t n = atomic_fetch_add_explicit(&p->misses, 1, memory_order_relaxed);

	if (n % SKETCH_AGE_EVERY)
		return;
	uint32_t i = (uint32_t)((n / SKETCH_AGE_EVERY) % p->sketch_words);
	uint64_t old = atomic_load_explicit(&p->sketch[i], memory_order_relaxed);
	uint64_t aged = (old >> 1) & CM_LOW_BITS;

	if (aged != old)
		atomic_compare_exchange_strong_explicit(&p->sketch[i], &old, aged,
							memory_order_relaxed,
							memory_order_relaxed);
}

/* Count one miss on key; returns the misses now recorded for it.
 * Lock-free, at most SKETCH_CAS_TRIES attempts. */
static unsigned sketch_add(struct policy *p, uint64_t key)
{
	struct sketch_pos pos = sketch_locate(p, key);
	_Atomic uint64_t *wp = &p->sketch[pos.word];

	sketch_age_step(p);
	uint64_t old = atomic_load_explicit(wp, memory_order_relaxed);
	for (int t = 0; t < SKETCH_CAS_TRIES; t++) {
		unsigned count = sketch_count(old, &pos);
		uint64_t upd = old | pos.dk_mask;

		if (count > SKETCH_COUNTER_MAX)
			return count;
		if (count > 0) {
			/* Conservative update: raise only the counters at the
			 * minimum (a repeated position is raised once). */
			for (int i = 0; i < 2; i++)
				if (counter_at(upd, pos.shift[i]) == count - 1)
					upd += UINT64_C(1) << pos.shift[i];
		}
		if (atomic_compare_exchange_weak_explicit(wp, &old, upd, memory_order_relaxed,
							  memory_order_relaxed))
			return count + 1;
	}
	return sketch_count(old, &pos);   /* lost every race: not counted */
}

/* ---- stream table ------------------------------------------------------ */

static uint64_t stream_hash(uint32_t bid, uint64_t end)
{
	return hash_mix64(end ^ ((uint64_t)bid << 48) ^ ((uint64_t)bid >> 16) ^ 0x5851f42d4c957f2dull);
}

/*
 * Record [offset, offset+len) on bid; returns the run length in sectors of
 * the stream it belongs to (this request included) and in *prev_run the run
 * before it (0 = it starts a new stream). Lock-free: two loads and one CAS
 * or store.
 *
 * The entry a request continues is consumed, so a stream leaves only its
 * latest end behind (a later read in the middle of an old stream is not a
 * continuation). If the end of this request is already recorded, this is
 * the engine asking again for another extent of the same request: answer
 * from that entry, so every extent of a request gets the same answer.
 */
static uint32_t stream_update(struct policy *p, uint32_t bid, uint64_t offset, uint32_t len,
			      uint32_t *prev_run)
{
	uint64_t sectors = ((uint64_t)len + (1u << SECTOR_SHIFT) - 1) >> SECTOR_SHIFT;
	uint64_t he = stream_hash(bid, offset + len);
	_Atomic uint64_t *end = &p->streams[he % STREAM_ENTRIES];
	uint64_t e = atomic_load_explicit(end, memory_order_relaxed);
	uint64_t run;

	if (e >> STREAM_RUN_BITS == he >> STREAM_RUN_BITS) {
		run = e & STREAM_RUN_MAX;
		*prev_run = run > sectors ? (uint32_t)(run - sectors) : 0;
		return (uint32_t)run;
	}

	uint64_t hs = stream_hash(bid, offset);
	_Atomic uint64_t *start = &p->streams[hs % STREAM_ENTRIES];
	uint64_t s = atomic_load_explicit(start, memory_order_relaxed);

	*prev_run = 0;
	if (s >> STREAM_RUN_BITS == hs >> STREAM_RUN_BITS &&
	    atomic_compare_exchange_strong_explicit(start, &s, 0, memory_order_relaxed,
						    memory_order_relaxed))
		*prev_run = (uint32_t)(s & STREAM_RUN_MAX);
	run = *prev_run + sectors;
	if (run > STREAM_RUN_MAX)
		run = STREAM_RUN_MAX;
	atomic_store_explicit(end, (he >> STREAM_RUN_BITS << STREAM_RUN_BITS) | run,
			      memory_order_relaxed);
	return (uint32_t)run;
}

/* ---- slot state -------------------------------------------------------- */

/*
 * The state above has 5 bits but only 4 are ever needed at once, so two
 * slots share a byte:
 *   free:  0 0 0 r   (r = a ring entry still names it; no hits kept)
 *   small: 0 1 f f   (always named by a ring entry)
 *   main:  1 r f f
 * slot_load and slot_update translate; policy_touch adds 1 to the nibble,
 * which is the hit counter of a small or main slot. A CAS on the byte may
 * fail because the neighbour slot changed: the lock holders retry, a touch
 * is dropped (it is a hint, as with any lost touch).
 */
static uint8_t slot_encode(uint8_t st)
{
	uint8_t ring = st & SLOT_IN_RING ? 1 : 0;

	switch (st & SLOT_QUEUE_MASK) {
	case SLOT_FREE:
		return ring;
	case SLOT_SMALL:
		return (uint8_t)(0x4 | (st & SLOT_FREQ_MASK));
	default:
		return (uint8_t)(0x8 | ring << 2 | (st & SLOT_FREQ_MASK));
	}
}

static uint8_t slot_decode(uint8_t nib)
{
	if (nib & 0x8)
		return (uint8_t)(SLOT_MAIN | (nib & 0x4 ? SLOT_IN_RING : 0) | (nib & SLOT_FREQ_MASK));
	if (nib & 0x4)
		return (uint8_t)(SLOT_SMALL | SLOT_IN_RING | (nib & SLOT_FREQ_MASK));
	return nib & 1 ? SLOT_IN_RING : SLOT_FREE;
}

static inline _Atomic uint8_t *slot_byte(const struct policy *p, uint32_t slot)
{
	return &p->slot_state[slot / 2];
}

static inline unsigned slot_shift(uint32_t slot)
{
	return (slot & 1) * 4;
}

static uint8_t slot_load(const struct policy *p, uint32_t slot)
{
	uint8_t b = atomic_load_explicit(slot_byte(p, slot), memory_order_relaxed);

	return slot_decode((b >> slot_shift(slot)) & 0xf);
}

/* Replace slot's nibble in byte b by the encoding of st. */
static uint8_t with_state(uint8_t b, uint32_t slot, uint8_t st)
{
	unsigned sh = slot_shift(slot);

	return (uint8_t)((b & ~(0xfu << sh)) | (unsigned)slot_encode(st) << sh);
}

/*
 * Replace the bits in clear with set, leaving the rest (the hit counter a
 * concurrent policy_touch may be bumping, the other slot of the byte)
 * intact. Caller's lock.
 */
static void slot_update(struct policy *p, uint32_t slot, uint8_t clear, uint8_t set)
{
	_Atomic uint8_t *bp = slot_byte(p, slot);
	uint8_t old = atomic_load_explicit(bp, memory_order_relaxed);

	for (;;) {
		uint8_t st = slot_decode((old >> slot_shift(slot)) & 0xf);
		uint8_t upd = with_state(old, slot, (uint8_t)((st & ~clear) | set));

		if (atomic_compare_exchange_weak_explicit(bp, &old, upd, memory_order_relaxed,
							  memory_order_relaxed))
			return;
	}
}

/* Take one hit off slot if it has any; returns whether it had. Caller's lock. */
static bool slot_spend_hit(struct policy *p, uint32_t slot)
{
	_Atomic uint8_t *bp = slot_byte(p, slot);
	unsigned sh = slot_shift(slot);
	uint8_t old = atomic_load_explicit(bp, memory_order_relaxed);

	/* Only small and main slots have hits: their counter is the nibble's
	 * low two bits. */
	while ((old >> sh) & 0xc && (old >> sh) & SLOT_FREQ_MASK) {
		if (atomic_compare_exchange_weak_explicit(bp, &old, (uint8_t)(old - (1u << sh)),
							  memory_order_relaxed,
							  memory_order_relaxed))
			return true;
	}
	return false;
}

/* ---- small ring (caller's lock) ---------------------------------------- */

/* Entry i, little-endian in ring_width bytes. */
static uint32_t ring_get(const struct policy *p, uint32_t i)
{
	const uint8_t *e = p->ring + (size_t)i * p->ring_width;
	uint32_t v = (uint32_t)e[0] | (uint32_t)e[1] << 8 | (uint32_t)e[2] << 16;

	return p->ring_width == 4 ? v | (uint32_t)e[3] << 24 : v;
}

static void ring_set(struct policy *p, uint32_t i, uint32_t slot)
{
	uint8_t *e = p->ring + (size_t)i * p->ring_width;

	e[0] = (uint8_t)slot;
	e[1] = (uint8_t)(slot >> 8);
	e[2] = (uint8_t)(slot >> 16);
	if (p->ring_width == 4)
		e[3] = (uint8_t)(slot >> 24);
}

static uint32_t ring_pop(struct policy *p)
{
	uint32_t slot = ring_get(p, p->ring_head);

	p->ring_head = (p->ring_head + 1) % p->ring_cap;
	p->ring_len--;
	return slot;
}

static void ring_push(struct policy *p, uint32_t slot)
{
	ring_set(p, (p->ring_head + p->ring_len) % p->ring_cap, slot);
	p->ring_len++;
}

static void small_to_main(struct policy *p, uint32_t slot)
{
	slot_update(p, slot, SLOT_QUEUE_MASK | SLOT_IN_RING, SLOT_MAIN);
	p->small_live--;
	p->main_live++;
}

/* Free one ring entry: drop a stale one, or move the oldest live slot to
 * main (the cache is filling and nobody evicts yet). */
static void ring_make_room(struct policy *p)
{
	uint32_t slot = ring_pop(p);

	if ((slot_load(p, slot) & SLOT_QUEUE_MASK) == SLOT_SMALL)
		small_to_main(p, slot);
	else
		slot_update(p, slot, SLOT_IN_RING, 0);
}

/* ---- public ------------------------------------------------------------ */

/* Main thread. Returns NULL if cfg is unusable (nslots or extent_size 0) or
 * memory runs out. */
struct policy *policy_new(const struct policy_cfg *cfg)
{
	if (!cfg || cfg->nslots == 0 || cfg->nslots == POLICY_NO_SLOT || cfg->extent_size == 0)
		return NULL;

	size_t size = (sizeof(struct policy) + 63) / 64 * 64;
	struct policy *p = aligned_alloc(64, size);
	if (!p)
		return NULL;
	memset(p, 0, size);
	p->nslots = cfg->nslots;
	p->admit_hits = clamp_threshold(cfg->admit_hits);
	p->write_admit_hits = cfg->write_admit_hits ? clamp_threshold(cfg->write_admit_hits)
						    : p->admit_hits;
	p->fill_admit_pct = cfg->fill_admit_pct > 100 ? 100 : cfg->fill_admit_pct;
	p->seq_cutoff = cfg->seq_cutoff;
	p->extent_size = cfg->extent_size;

	p->small_target = (uint32_t)((uint64_t)cfg->nslots * SMALL_PCT / 100);
	if (p->small_target == 0)
		p->small_target = 1;
	/* Slack for stale entries left by policy_remove; while the cache
	 * fills, the probation queue may also run this far over its share. */
	p->ring_cap = p->small_target + p->small_target / 2 + 1;
	p->sketch_words = cfg->nslots / SKETCH_SLOTS_PER_WORD;
	if (p->sketch_words < SKETCH_MIN_WORDS)
		p->sketch_words = SKETCH_MIN_WORDS;

	p->slot_state = calloc(cfg->nslots / 2 + 1, sizeof(*p->slot_state));
	p->ring_width = cfg->nslots <= (1u << 24) ? 3 : 4;
	p->ring = calloc(p->ring_cap, p->ring_width);
	p->sketch = calloc(p->sketch_words, sizeof(*p->sketch));
	if (!p->slot_state || !p->ring || !p->sketch) {
		policy_free(p);
		return NULL;
	}
	return p;
}

/* Main thread, after every other caller is gone. */
void policy_free(struct policy *p)
{
	if (!p)
		return;
	free((void *)p->slot_state);
	free(p->ring);
	free((void *)p->sketch);
	free(p);
}

/*
 * Any thread, lock-free, never sleeps: a few relaxed atomics on the stream
 * table and one sketch word (bounded CAS retries), plus stats counters.
 *
 * Order of questions: a stream past seq_cutoff bypasses, reads and writes
 * alike (as bcache does; it is not counted). Otherwise the miss is counted
 * and the extent is promoted once its count reaches admit_hits
 * (write_admit_hits for a write), or at once while the cache is below
 * fill_admit_pct. Call it for each extent a request misses; asking again
 * with the same offset and len gives the same stream answer.
 */
bool policy_admit(struct policy *p, uint64_t key, uint32_t bid, uint64_t offset, uint32_t len,
		  bool is_write)
{
	struct policy_run r;
	policy_stream(p, bid, offset, len, &r);
	return policy_admit_run(p, key, offset, &r, is_write);
}

void policy_stream(struct policy *p, uint32_t bid, uint64_t offset, uint32_t len, struct policy_run *r)
{
	r->run = stream_update(p, bid, offset, len, &r->prev_run);
}

bool policy_admit_run(struct policy *p, uint64_t key, uint64_t offset, const struct policy_run *r,
		      bool is_write)
{
	uint32_t run = r->run, prev_run = r->prev_run;

	if (p->seq_cutoff && ((uint64_t)run << SECTOR_SHIFT) > p->seq_cutoff) {
		atomic_fetch_add_explicit(&p->n_seq_bypassed, 1, memory_order_relaxed);
		return false;
	}

	/* The previous request of this stream ended inside this extent: it
	 * already counted this visit. */
	bool same_visit = prev_run && offset > 0 &&
			  (offset - 1) / p->extent_size == (key & KEY_EXTENT_MASK);
	unsigned est = same_visit ? sketch_estimate(p, key) : sketch_add(p, key);
	uint32_t need = is_write ? p->write_admit_hits : p->admit_hits;
	bool filling = p->fill_admit_pct &&
		       (uint64_t)atomic_load_explicit(&p->resident, memory_order_relaxed) * 100 <
			       (uint64_t)p->fill_admit_pct * p->nslots;

	if (est >= need || filling) {
		atomic_fetch_add_explicit(&p->n_admitted, 1, memory_order_relaxed);
		return true;
	}
	atomic_fetch_add_explicit(&p->n_below_threshold, 1, memory_order_relaxed);
	return false;
}

/*
 * Any thread, under RCU read lock or not, wait-free: one relaxed load and at
 * most one CAS. A touch that loses its CAS is dropped (another touch or the
 * allocator changed the byte at that instant); the counter is a hint. A
 * touch arriving after the slot was reused may credit the new extent with
 * one hit; harmless for the same reason.
 */
void policy_touch(struct policy *p, uint32_t slot)
{
	if (slot >= p->nslots)
		return;
	_Atomic uint8_t *bp = slot_byte(p, slot);
	unsigned sh = slot_shift(slot);
	uint8_t b = atomic_load_explicit(bp, memory_order_relaxed);
	unsigned nib = (b >> sh) & 0xf;

	/* free (queue bits 00) or the counter at 3: nothing to do */
	if (!(nib & 0xc) || (nib & SLOT_FREQ_MASK) == SLOT_FREQ_MAX)
		return;
	atomic_compare_exchange_strong_explicit(bp, &b, (uint8_t)(b + (1u << sh)),
						memory_order_relaxed, memory_order_relaxed);
}

/* Caller's allocation lock; O(1), never sleeps. Inserting an occupied slot
 * replaces its old key. */
void policy_insert(struct policy *p, uint32_t slot, uint64_t key)
{
	if (slot >= p->nslots)
		return;
	if ((slot_load(p, slot) & SLOT_QUEUE_MASK) != SLOT_FREE)
		policy_remove(p, slot);

	/* Missed again and again after it was first admitted: it was evicted
	 * and keeps coming back, a ghost hit in S3-FIFO terms, so it skips
	 * probation. Two misses, not one, so that a doorkeeper collision
	 * alone (a few % of one-touch keys) cannot let a scan into main. */
	if (sketch_estimate(p, key) >= p->admit_hits + GHOST_MISSES) {
		slot_update(p, slot, (uint8_t)~SLOT_IN_RING, SLOT_MAIN);
		p->main_live++;
	} else if (slot_load(p, slot) & SLOT_IN_RING) {
		/* Removed while still named by a ring entry: reuse that
		 * entry (an older place in the queue, but no duplicate). */
		slot_update(p, slot, (uint8_t)~SLOT_IN_RING, SLOT_SMALL);
		p->small_live++;
	} else {
		if (p->ring_len == p->ring_cap)
			ring_make_room(p);
		ring_push(p, slot);
		slot_update(p, slot, 0xff, SLOT_SMALL | SLOT_IN_RING);
		p->small_live++;
	}
	atomic_store_explicit(&p->resident, atomic_load_explicit(&p->resident,
								 memory_order_relaxed) + 1,
			      memory_order_relaxed);
}

static void forget(struct policy *p, uint32_t slot, uint8_t queue)
{
	if (queue == SLOT_SMALL)
		p->small_live--;
	else
		p->main_live--;
	/* A ring entry may still name the slot; it stays marked until the
	 * ring head reaches it. */
	slot_update(p, slot, (uint8_t)~SLOT_IN_RING, SLOT_FREE);
	atomic_store_explicit(&p->resident, atomic_load_explicit(&p->resident,
								 memory_order_relaxed) - 1,
			      memory_order_relaxed);
}

/* Caller's allocation lock; O(1), never sleeps. Removing a free slot is a
 * no-op. */
void policy_remove(struct policy *p, uint32_t slot)
{
	if (slot >= p->nslots)
		return;
	uint8_t q = slot_load(p, slot) & SLOT_QUEUE_MASK;

	if (q != SLOT_FREE)
		forget(p, slot, q);
}

/*
 * Walk the small queue from its oldest entry: hit while on probation ->
 * main; not clean -> back of the queue; else the victim. Looks at each
 * entry at most once; *promoted counts the slots it moved to main.
 */
static uint32_t evict_small(struct policy *p, bool (*is_clean)(uint32_t, void *), void *arg,
			    uint32_t *promoted)
{
	for (uint32_t n = p->ring_len; n > 0; n--) {
		uint32_t slot = ring_pop(p);
		uint8_t s = slot_load(p, slot);

		if ((s & SLOT_QUEUE_MASK) != SLOT_SMALL) {          /* stale */
			slot_update(p, slot, SLOT_IN_RING, 0);
			continue;
		}
		if (s & SLOT_FREQ_MASK) {
			small_to_main(p, slot);
			(*promoted)++;
			continue;
		}
		if (!is_clean(slot, arg)) {
			ring_push(p, slot);
			continue;
		}
		forget(p, slot, SLOT_SMALL);          /* free, still named by the entry */
		slot_update(p, slot, SLOT_IN_RING, 0); /* the entry is gone: popped */
		return slot;
	}
	return POLICY_NO_SLOT;
}

/*
 * CLOCK over main slots: spend a hit and pass, pass a slot that is not
 * clean, take the first clean slot with no hits left. Hit counters are at
 * most 3, so within four sweeps every clean main slot is offered unless
 * concurrent touches re-arm it; a fifth sweep ignores hits. At most
 * 5 * nslots steps, in practice a handful.
 */
static uint32_t evict_main(struct policy *p, bool (*is_clean)(uint32_t, void *), void *arg)
{
	if (p->main_live == 0)
		return POLICY_NO_SLOT;
	for (uint64_t steps = (uint64_t)p->nslots * (SLOT_FREQ_MAX + 2); steps > 0; steps--) {
		uint32_t slot = p->hand;
		/* Touches may keep re-arming every slot; the last sweep takes
		 * the first clean one regardless. */
		bool last_sweep = steps <= p->nslots;

		p->hand = slot + 1 == p->nslots ? 0 : slot + 1;
		if ((slot_load(p, slot) & SLOT_QUEUE_MASK) != SLOT_MAIN)
			continue;
		if (!last_sweep && slot_spend_hit(p, slot))
			continue;
		if (!is_clean(slot, arg))
			continue;
		forget(p, slot, SLOT_MAIN);
		return slot;
	}
	return POLICY_NO_SLOT;
}

/*
 * Caller's allocation lock; never sleeps; is_clean is called with that lock
 * held and must not take it. Usually O(1) amortized; when almost nothing is
 * clean it may look at every slot a few times before giving up.
 */
uint32_t policy_victim(struct policy *p, bool (*is_clean)(uint32_t slot, void *arg), void *arg)
{
	uint32_t v = POLICY_NO_SLOT, promoted = 0;
	bool tried_small = false;

	/* S3-FIFO: the probation queue gives up its share first. */
	if (p->small_live >= p->small_target || p->main_live == 0) {
		v = evict_small(p, is_clean, arg, &promoted);
		tried_small = true;
	}
	if (v == POLICY_NO_SLOT)
		v = evict_main(p, is_clean, arg);
	/* Main had nothing clean: take from probation after all, and if that
	 * only moved hit slots to main, offer those too (NO_SLOT must mean
	 * nothing resident is clean). */
	if (v == POLICY_NO_SLOT && !tried_small) {
		promoted = 0;
		v = evict_small(p, is_clean, arg, &promoted);
		if (v == POLICY_NO_SLOT && promoted)
			v = evict_main(p, is_clean, arg);
	}
	return v;
}

/* Any thread; constant after policy_new. */
uint64_t policy_mem_bytes(const struct policy *p)
{
	return sizeof(*p) + ((uint64_t)p->nslots / 2 + 1) * sizeof(*p->slot_state) +
	       (uint64_t)p->ring_cap * p->ring_width +
	       (uint64_t)p->sketch_words * sizeof(*p->sketch);
}

/* Caller's allocation lock (the queue size is a plain field); the
 * counters are relaxed atomics, a snapshot rather than a consistent cut. */
void policy_get_stats(const struct policy *p, struct policy_stats *st)
{
	memset(st, 0, sizeof(*st));
	st->admitted = atomic_load_explicit(&p->n_admitted, memory_order_relaxed);
	st->below_threshold = atomic_load_explicit(&p->n_below_threshold, memory_order_relaxed);
	st->seq_bypassed = atomic_load_explicit(&p->n_seq_bypassed, memory_order_relaxed);
	st->resident = atomic_load_explicit(&p->resident, memory_order_relaxed);
	st->probation = p->small_live;
}
