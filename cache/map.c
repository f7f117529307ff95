/*
 * map.c - which slot holds a backing extent, and which of its blocks are
 * valid and dirty; lookups take no lock.
 *
 * Why not cds_lfht: a node of liburcu's lock-free hash table costs 16 bytes
 * plus the bucket array, on top of our 16-byte slot, which puts the map
 * near 160 KB of RAM per GB of cache at 256 KiB extents (bench_cache_mem
 * measures it). The set of slots is fixed at format time, so we keep an
 * open-addressing (linear probing) table of 32-bit entries sized 1.15 x
 * nslots (MAP_SIZE_NUM / MAP_SIZE_DEN), and use liburcu for what it is
 * for: readers run under rcu_read_lock(), the table is replaced with
 * rcu_assign_pointer when tombstones pile up, and the old table is freed
 * by call_rcu.
 *
 * An entry is the slot number in its low bits and a fingerprint of the
 * key's hash in the bits a slot number never needs (13 bits for 2^18
 * slots, 7 for 2^24). A probe that passes another key's entry compares
 * fingerprints inside the table's cache line and loads that slot's key
 * (a cache miss of its own) only on a 1-in-2^bits collision. That is what
 * lets the table run 87% full (4.6 bytes per slot) where plain slot
 * numbers needed 2/3 (6 bytes) to keep probes short. Measured with every
 * slot resident (262144 slots): a hit loads 1.00 slot keys and 1.2 table
 * lines (plain 2/3-full table: 1.99 keys, 1.06 lines); an absent key loads
 * almost no slot key and 3 adjacent table lines (plain: 3.98 keys, 1.25
 * lines).
 *
 * Readers: load an entry (acquire), compare the slot's key (acquire). A
 * writer sets the slot's key before publishing the entry (release), so a
 * reader that sees the entry sees the key. A removed slot is reused only
 * after a grace period (set.c), so a reader that found it compares its
 * key against its own and never confuses two extents.
 *
 * Removal leaves a tombstone, except that tombstones (the removed entry
 * included) directly before an empty entry become empty: no live entry's
 * probe run crosses them, so no reader can be cut short by it.
 *
 * Per-block bitmaps live in chunks of 64 slots, allocated the first time
 * one of them holds a partial extent: a fully valid, all clean or all
 * dirty extent needs only its summary flags.
 */
#include "cache/cache_int.h"
#include "common/hash.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <urcu/uatomic.h>

/*
 * Table entries per slot, as a fraction: 1.15 (the table is at most 87%
 * live), rebuilt once live + tombstones pass 15/16. bench_cache_mem shows
 * bytes and lookup cost; test_cache_map churns it.
 */
#define MAP_SIZE_NUM 23u
#define MAP_SIZE_DEN 20u
#define MAP_FULL_NUM 15u
#define MAP_FULL_DEN 16u

/* The high half of the hash picks the home entry, the low half gives the
 * fingerprint: independent bits. */
static inline uint32_t home(uint64_t h, uint32_t size)
{
	return (uint32_t)(((h >> 32) * (uint64_t)size) >> 32);
}

static inline uint32_t entry_of(const struct map_table *t, uint64_t h, uint32_t slot)
{
	return ((uint32_t)h & t->fp_mask) | slot;
}

/*
 * Bits above the slot number: the smallest width w with 2^w >= nslots + 2,
 * so that a slot field never reads all ones (MAP_EMPTY) or all ones but
 * the last bit (MAP_TOMB), whatever the fingerprint.
 */
static uint32_t fp_mask_for(uint32_t nslots)
{
	unsigned w = 1;
	while (w < 32 && (1ull << w) < (uint64_t)nslots + 2)
		w++;
	return w >= 32 ? 0 : (uint32_t)(~0ull << w);
}

static struct map_table *table_new(uint32_t size, uint32_t fp_mask)
{
	struct map_table *t = malloc(sizeof(*t) + (size_t)size * sizeof(t->e[0]));
	if (!t)
		return NULL;
	t->size = size;
	t->used = 0;
	t->tombs = 0;
	t->fp_mask = fp_mask;
	for (uint32_t i = 0; i < size; i++)
		atomic_init(&t->e[i], MAP_EMPTY);
	return t;
}

/* Main thread, before any reader. */
int map_init(struct cache_map *m, struct slot *slots, uint32_t nslots)
{
	m->slots = slots;
	m->nslots = nslots;
	uint64_t size = (uint64_t)nslots * MAP_SIZE_NUM / MAP_SIZE_DEN + 2;
	if (nslots > UINT32_MAX - 2 || size >= MAP_TOMB) {
		atomic_store_explicit(&m->t, NULL, memory_order_release);
		return -EINVAL;
	}
	struct map_table *t = table_new((uint32_t)size, fp_mask_for(nslots));
	atomic_store_explicit(&m->t, t, memory_order_release);
	return t ? 0 : -ENOMEM;
}

/* Main thread, no reader left. */
void map_destroy(struct cache_map *m)
{
	free(atomic_load(&m->t));
	atomic_store(&m->t, NULL);
}

/*
 * Caller holds rcu_read_lock(). Lock-free, wait-free in practice (the table
 * always keeps a sixteenth of its entries empty). Never sleeps.
 * Returns the slot or POLICY_NO_SLOT; the caller re-checks the slot's key
 * and state after pinning it (volume.c).
 */
uint32_t map_lookup(struct cache_map *m, uint64_t key)
{
	struct map_table *t = atomic_load_explicit(&m->t, memory_order_acquire); /* rcu_dereference */
	uint64_t h = hash_mix64(key);
	uint32_t fpm = t->fp_mask, fp = (uint32_t)h & fpm;
	uint32_t i = home(h, t->size);

	for (uint32_t n = 0; n < t->size; n++) {
		uint32_t e = atomic_load_explicit(&t->e[i], memory_order_acquire);
		if (e == MAP_EMPTY)
			return POLICY_NO_SLOT;
		if ((e & fpm) == fp && e != MAP_TOMB) {
			uint32_t s = e & ~fpm;
			if (atomic_load_explicit(&m->slots[s].key, memory_order_acquire) == key)
				return s;
		}
		if (++i == t->size)
			i = 0;
	}
	return POLICY_NO_SLOT;
}

static void table_free_rcu(struct rcu_head *h)
{
	free(caa_container_of(h, struct map_table, rcu));
}

static void table_put(struct map_table *t, uint64_t key, uint32_t slot)
{
	uint64_t h = hash_mix64(key);
	uint32_t i = home(h, t->size);
	while (atomic_load_explicit(&t->e[i], memory_order_relaxed) != MAP_EMPTY)
		if (++i == t->size)
			i = 0;
	atomic_store_explicit(&t->e[i], entry_of(t, h, slot), memory_order_release);
	t->used++;
}

/* Copy the live entries into a fresh table and publish it (drops tombstones). */
static int rebuild(struct cache_map *m)
{
	struct map_table *old = atomic_load_explicit(&m->t, memory_order_relaxed);
	struct map_table *t = table_new(old->size, old->fp_mask);
	if (!t)
		return -ENOMEM;
	for (uint32_t i = 0; i < old->size; i++) {
		uint32_t e = atomic_load_explicit(&old->e[i], memory_order_relaxed);
		if (e != MAP_EMPTY && e != MAP_TOMB) {
			uint32_t s = e & ~old->fp_mask;
			table_put(t, atomic_load_explicit(&m->slots[s].key, memory_order_relaxed), s);
		}
	}
	atomic_store_explicit(&m->t, t, memory_order_release); /* rcu_assign_pointer */
	call_rcu(&old->rcu, table_free_rcu);
	return 0;
}

/*
 * Publish key -> slot. Caller holds the set's alloc_lock (writers are
 * serialized); readers may run concurrently. Sets the slot's key first.
 * May not sleep (call_rcu only queues). 0, -EEXIST or -ENOMEM.
 */
int map_insert(struct cache_map *m, uint64_t key, uint32_t slot)
{
	struct map_table *t = atomic_load_explicit(&m->t, memory_order_relaxed);

	if ((uint64_t)(t->used + t->tombs + 1) * MAP_FULL_DEN > (uint64_t)t->size * MAP_FULL_NUM) {
		if (rebuild(m) < 0)
			return -ENOMEM;
		t = atomic_load_explicit(&m->t, memory_order_relaxed);
	}
	uint64_t h = hash_mix64(key);
	uint32_t fpm = t->fp_mask, fp = (uint32_t)h & fpm;
	uint32_t i = home(h, t->size), free_at = MAP_EMPTY;
	for (uint32_t n = 0; n < t->size; n++) {
		uint32_t e = atomic_load_explicit(&t->e[i], memory_order_relaxed);
		if (e == MAP_EMPTY) {
			if (free_at == MAP_EMPTY)
				free_at = i;
			break;
		}
		if (e == MAP_TOMB) {
			if (free_at == MAP_EMPTY)
				free_at = i;
		} else if ((e & fpm) == fp &&
			   atomic_load_explicit(&m->slots[e & ~fpm].key, memory_order_relaxed) == key) {
			return -EEXIST;
		}
		if (++i == t->size)
			i = 0;
	}
	if (free_at == MAP_EMPTY)
		return -ENOMEM;
	atomic_store_explicit(&m->slots[slot].key, key, memory_order_release);
	if (atomic_load_explicit(&t->e[free_at], memory_order_relaxed) == MAP_TOMB)
		t->tombs--;
	atomic_store_explicit(&t->e[free_at], entry_of(t, h, slot), memory_order_release);
	t->used++;
	return 0;
}

/*
 * Entry i was just made a tombstone. If the next entry is empty, no live
 * entry's probe run passes i (it would have to pass the empty one too), so
 * i and the tombstones right before it can be emptied; a reader scanning
 * them stops at most one entry earlier than it would have, on the same
 * answer. Caller holds alloc_lock.
 */
static void trim_tombs(struct map_table *t, uint32_t i)
{
	uint32_t next = i + 1 == t->size ? 0 : i + 1;
	if (atomic_load_explicit(&t->e[next], memory_order_relaxed) != MAP_EMPTY)
		return;
	while (atomic_load_explicit(&t->e[i], memory_order_relaxed) == MAP_TOMB) {
		atomic_store_explicit(&t->e[i], MAP_EMPTY, memory_order_release);
		t->tombs--;
		i = i == 0 ? t->size - 1 : i - 1;
	}
}

/*
 * Unpublish key -> slot. Caller holds alloc_lock. Readers that already
 * found the slot keep using it; the caller reuses the slot only after a
 * grace period. Never sleeps.
 */
void map_remove(struct cache_map *m, uint64_t key, uint32_t slot)
{
	struct map_table *t = atomic_load_explicit(&m->t, memory_order_relaxed);
	uint64_t h = hash_mix64(key);
	uint32_t want = entry_of(t, h, slot);
	uint32_t i = home(h, t->size);

	for (uint32_t n = 0; n < t->size; n++) {
		uint32_t e = atomic_load_explicit(&t->e[i], memory_order_relaxed);
		if (e == MAP_EMPTY)
			return;
		if (e == want) {
			atomic_store_explicit(&t->e[i], MAP_TOMB, memory_order_release);
			t->used--;
			t->tombs++;
			trim_tombs(t, i);
			return;
		}
		if (++i == t->size)
			i = 0;
	}
}

/* Any thread (an estimate; the table pointer is read without RCU). */
uint64_t map_mem_bytes(const struct cache_map *m)
{
	return sizeof(struct map_table) + (uint64_t)atomic_load(&m->t)->size * sizeof(uint32_t) +
	       (uint64_t)m->nslots * sizeof(struct slot);
}

/* ---- bitmaps ------------------------------------------------------------ */

/* Main thread. */
int bm_init(struct cache_bitmaps *b, uint32_t nslots, uint32_t bpe)
{
	b->bpe = bpe;
	b->words = (bpe + 63) / 64;
	b->ngroups = (nslots + BM_GROUP - 1) / BM_GROUP;
	b->group = calloc(b->ngroups, sizeof(*b->group));
	atomic_init(&b->allocated_bytes, (uint64_t)b->ngroups * sizeof(*b->group));
	return b->group ? 0 : -ENOMEM;
}

/* Main thread, no reader left. */
void bm_destroy(struct cache_bitmaps *b)
{
	for (uint32_t g = 0; g < b->ngroups; g++)
		free(atomic_load(&b->group[g]));
	free(b->group);
	b->group = NULL;
}

static _Atomic uint64_t *bm_words(struct cache_bitmaps *b, uint32_t s, bool create)
{
	_Atomic(uint64_t *) *gp = &b->group[s / BM_GROUP];
	uint64_t *g = atomic_load_explicit(gp, memory_order_acquire);
	if (!g && create) {
		size_t bytes = (size_t)BM_GROUP * 2 * b->words * sizeof(uint64_t);
		uint64_t *n = calloc(1, bytes);
		if (!n)
			return NULL;
		uint64_t *expected = NULL;
		if (atomic_compare_exchange_strong(gp, &expected, n)) {
			atomic_fetch_add(&b->allocated_bytes, bytes);
			g = n;
		} else {
			free(n);
			g = expected;
		}
	}
	if (!g)
		return NULL;
	return (_Atomic uint64_t *)g + (size_t)(s % BM_GROUP) * 2 * b->words;
}

/* Any thread; with create, may allocate (slot lock held by the caller). */
_Atomic uint64_t *bm_valid(struct cache_bitmaps *b, uint32_t s, bool create)
{
	return bm_words(b, s, create);
}

_Atomic uint64_t *bm_dirty(struct cache_bitmaps *b, uint32_t s, bool create)
{
	_Atomic uint64_t *w = bm_words(b, s, create);
	return w ? w + b->words : NULL;
}

/* ---- slot state ----------------------------------------------------------- */

/* Any thread; spins (held for a few hundred instructions at most). */
void slot_lock(struct slot *sl)
{
	while (atomic_fetch_or_explicit(&sl->bits, SB_LOCK, memory_order_acquire) & SB_LOCK)
		caa_cpu_relax();
}

void slot_unlock(struct slot *sl)
{
	atomic_fetch_and_explicit(&sl->bits, ~SB_LOCK, memory_order_release);
}

/* Mask of bits [lo, hi) inside word w (bit positions relative to the extent). */
static inline uint64_t word_mask(uint32_t w, uint32_t lo, uint32_t hi)
{
	uint32_t wlo = w * 64, whi = wlo + 64;
	uint32_t a = lo > wlo ? lo - wlo : 0;
	uint32_t z = hi < whi ? hi - wlo : 64;
	if (a >= z)
		return 0;
	uint64_t m = z == 64 ? ~0ull : ((1ull << z) - 1);
	return m & ~((1ull << a) - 1);
}

static uint64_t count_bits(_Atomic uint64_t *w, uint32_t words)
{
	uint64_t n = 0;
	for (uint32_t i = 0; i < words; i++)
		n += (uint64_t)__builtin_popcountll(atomic_load_explicit(&w[i], memory_order_relaxed));
	return n;
}

static uint64_t slot_dirty_count(struct cache_set *cs, uint32_t s, uint32_t bits)
{
	if (!(bits & SB_DIRTY))
		return 0;
	if (!(bits & SB_HAS_BM))
		return cs->bm.bpe;
	return count_bits(bm_dirty(&cs->bm, s, false), cs->bm.words);
}

/*
 * Caller holds slot_lock(s). Applies op to blocks [first, first+count)
 * with atomic word updates so lock-free readers see each word either
 * before or after. Never sleeps; may allocate the slot's bitmap chunk
 * (a failed allocation degrades to "whole extent" flags only when that is
 * safe; otherwise the change is applied to the summary conservatively).
 */
void slot_apply(struct cache_set *cs, uint32_t s, int op, uint32_t first, uint32_t count)
{
	struct slot *sl = &cs->slots[s];
	struct cache_bitmaps *b = &cs->bm;
	uint32_t bits = atomic_load(&sl->bits);
	uint64_t dirty_before = slot_dirty_count(cs, s, bits);
	bool whole = first == 0 && count >= b->bpe;

	if (op == JOP_FREE) {
		if (bits & SB_HAS_BM) {
			_Atomic uint64_t *v = bm_valid(b, s, false), *d = bm_dirty(b, s, false);
			for (uint32_t i = 0; i < b->words; i++) {
				atomic_store(&v[i], 0);
				atomic_store(&d[i], 0);
			}
		}
		atomic_fetch_and(&sl->bits, ~(SB_FULL_VALID | SB_DIRTY | SB_HAS_BM | SB_CANCEL));
		atomic_fetch_sub(&cs->dirty_blocks, dirty_before);
		return;
	}
	if (!(bits & SB_HAS_BM) && whole) {
		uint32_t set = 0, clr = 0;
		switch (op) {
		case JOP_DIRTY: set = SB_FULL_VALID | SB_DIRTY; break;
		case JOP_VALID: set = SB_FULL_VALID; clr = SB_DIRTY; break;
		case JOP_CLEAN: clr = SB_DIRTY; break;
		case JOP_INVALIDATE: clr = SB_FULL_VALID | SB_DIRTY; break;
		}
		atomic_fetch_or(&sl->bits, set);
		atomic_fetch_and(&sl->bits, ~clr);
		bits = atomic_load(&sl->bits);
		atomic_fetch_add(&cs->dirty_blocks, slot_dirty_count(cs, s, bits) - dirty_before);
		return;
	}
	_Atomic uint64_t *v = bm_valid(b, s, true), *d = bm_dirty(b, s, true);
	if (!v) {
		/* No memory for a bitmap: keep the summary conservative. */
		if (op == JOP_DIRTY || op == JOP_INVALIDATE)
			atomic_fetch_and(&sl->bits, ~SB_FULL_VALID);
		if (op == JOP_DIRTY)
			atomic_fetch_or(&sl->bits, SB_DIRTY);
		return;
	}
	if (!(bits & SB_HAS_BM)) {
		uint64_t vfill = (bits & SB_FULL_VALID) ? ~0ull : 0;
		uint64_t dfill = (bits & SB_DIRTY) ? ~0ull : 0;
		for (uint32_t i = 0; i < b->words; i++) {
			uint64_t lim = word_mask(i, 0, b->bpe);
			atomic_store(&v[i], vfill & lim);
			atomic_store(&d[i], dfill & lim);
		}
		atomic_fetch_or_explicit(&sl->bits, SB_HAS_BM, memory_order_release);
	}
	uint32_t end = first + count;
	for (uint32_t w = first / 64; w <= (end - 1) / 64 && w < b->words; w++) {
		uint64_t m = word_mask(w, first, end);
		switch (op) {
		case JOP_DIRTY:
			atomic_fetch_or(&v[w], m);
			atomic_fetch_or(&d[w], m);
			break;
		case JOP_VALID:
			atomic_fetch_or(&v[w], m);
			atomic_fetch_and(&d[w], ~m);
			break;
		case JOP_CLEAN:
			atomic_fetch_and(&d[w], ~m);
			break;
		case JOP_INVALIDATE:
			atomic_fetch_and(&d[w], ~m);
			atomic_fetch_and(&v[w], ~m);
			break;
		}
	}
	bool full = true, any_dirty = false;
	for (uint32_t i = 0; i < b->words; i++) {
		uint64_t lim = word_mask(i, 0, b->bpe);
		if ((atomic_load(&v[i]) & lim) != lim)
			full = false;
		if (atomic_load(&d[i]))
			any_dirty = true;
	}
	if (full)
		atomic_fetch_or(&sl->bits, SB_FULL_VALID);
	else
		atomic_fetch_and(&sl->bits, ~SB_FULL_VALID);
	if (any_dirty)
		atomic_fetch_or(&sl->bits, SB_DIRTY);
	else
		atomic_fetch_and(&sl->bits, ~SB_DIRTY);
	bits = atomic_load(&sl->bits);
	atomic_fetch_add(&cs->dirty_blocks, slot_dirty_count(cs, s, bits) - dirty_before);
}

/* Any thread, no lock: atomic loads of the summary and the bitmap. */
uint32_t slot_valid_run(struct cache_set *cs, uint32_t s, uint32_t first, uint32_t count, bool *v)
{
	uint32_t bits = atomic_load_explicit(&cs->slots[s].bits, memory_order_acquire);
	if (bits & SB_FULL_VALID) {
		*v = true;
		return count;
	}
	if (!(bits & SB_HAS_BM)) {
		*v = false;
		return count;
	}
	_Atomic uint64_t *vb = bm_valid(&cs->bm, s, false);
	bool want = (atomic_load_explicit(&vb[first / 64], memory_order_acquire) >> (first % 64)) & 1;
	uint32_t n = 0;
	while (n < count) {
		uint32_t bit = first + n;
		bool cur = (atomic_load_explicit(&vb[bit / 64], memory_order_relaxed) >> (bit % 64)) & 1;
		if (cur != want)
			break;
		n++;
	}
	*v = want;
	return n;
}

bool slot_all_valid(struct cache_set *cs, uint32_t s, uint32_t first, uint32_t count)
{
	bool v;
	return slot_valid_run(cs, s, first, count, &v) == count && v;
}

/* Any thread, no lock. */
bool slot_any_dirty(struct cache_set *cs, uint32_t s, uint32_t first, uint32_t count)
{
	uint32_t bits = atomic_load(&cs->slots[s].bits);
	if (!(bits & SB_DIRTY))
		return false;
	if (!(bits & SB_HAS_BM))
		return true;
	_Atomic uint64_t *d = bm_dirty(&cs->bm, s, false);
	uint32_t end = first + count;
	for (uint32_t w = first / 64; w <= (end - 1) / 64; w++)
		if (atomic_load(&d[w]) & word_mask(w, first, end))
			return true;
	return false;
}

/*
 * Any thread, no lock: are all of [first, first+count) dirty (so valid)?
 * Only a slot with bitmaps answers yes: without them the summary is exact
 * only for whole-extent changes, and one made with no memory for a bitmap
 * leaves it saying more than is true (slot_apply).
 */
bool slot_all_dirty(struct cache_set *cs, uint32_t s, uint32_t first, uint32_t count)
{
	uint32_t bits = atomic_load(&cs->slots[s].bits);
	if (!(bits & SB_DIRTY) || !(bits & SB_HAS_BM))
		return false;
	_Atomic uint64_t *d = bm_dirty(&cs->bm, s, false);
	uint32_t end = first + count;
	for (uint32_t w = first / 64; w <= (end - 1) / 64; w++) {
		uint64_t m = word_mask(w, first, end);
		if ((atomic_load(&d[w]) & m) != m)
			return false;
	}
	return true;
}

/* Caller holds slot_lock (the cleaner snapshots dirty runs). */
bool slot_next_dirty_run(struct cache_set *cs, uint32_t s, uint32_t *first, uint32_t *count)
{
	uint32_t bits = atomic_load(&cs->slots[s].bits);
	uint32_t bpe = cs->bm.bpe;
	if (!(bits & SB_DIRTY) || *first >= bpe)
		return false;
	if (!(bits & SB_HAS_BM)) {
		if (*first != 0)
			return false;
		*count = bpe;
		return true;
	}
	_Atomic uint64_t *d = bm_dirty(&cs->bm, s, false);
	uint32_t i = *first;
	while (i < bpe && !((atomic_load(&d[i / 64]) >> (i % 64)) & 1))
		i++;
	if (i >= bpe)
		return false;
	uint32_t j = i;
	while (j < bpe && ((atomic_load(&d[j / 64]) >> (j % 64)) & 1))
		j++;
	*first = i;
	*count = j - i;
	return true;
}
