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
 * Per-block state has two grains. A fully valid, all clean or all dirty
 * extent needs only its summary flags. A partial one first keeps a valid
 * and a dirty bit per 4 KiB page: that is what hosts write (ext4, NTFS,
 * VMFS and databases all issue whole pages), and it costs 16 bytes per
 * 256 KiB slot, in chunks of 64 slots allocated the first time one of
 * them goes partial. The on-disk records stay per 512-byte sector, so a
 * change that splits a page (a sector-aligned write that is not page
 * aligned, a LUN that ends inside a page) moves that slot alone to
 * per-sector bitmaps (SB_FINE, 128 bytes at 256 KiB), which it keeps
 * until it is handed out again from the free list. Keeping every slot per
 * sector cost 600 KB of RAM per GB of cache under 4 KiB misses; per page
 * it is 16 KB of bitmaps per GB on top of the slots and the table.
 */
#include "cache/cache_int.h"
#include "common/hash.h"
#include "common/log.h"

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

/*
 * A chunk: the page-grain words of BM_GROUP slots (valid then dirty,
 * pwords each), and, once one of them splits a page, an array of
 * per-sector bitmaps (valid then dirty, fwords each) indexed by slot.
 *
 * Readers hold no lock. A slot moving to per-sector state (under its
 * lock) fills its new bitmaps from the page words, publishes them, and
 * only then sets SB_FINE (release); from then on its page words are left
 * as they were. A reader that loaded the flags before sees the state as
 * of before that change, one that loads them after sees the new bitmaps:
 * each reader sees each word before or after a change, as with one grain.
 * Per-sector bitmaps are freed only when the slot is handed out again
 * (bm_slot_reuse): it has then been out of the map for a grace period.
 */
struct bm_group {
	_Atomic(_Atomic(uint64_t *) *) fine; /* [BM_GROUP], or NULL */
	_Atomic uint64_t words[];
};

/* Main thread. */
int bm_init(struct cache_bitmaps *b, uint32_t nslots, uint32_t bpe)
{
	b->bpe = bpe;
	b->fwords = (bpe + 63) / 64;
	b->pwords = ((bpe >> BM_PAGE_SHIFT) + 63) / 64;
	b->ngroups = (nslots + BM_GROUP - 1) / BM_GROUP;
	b->group = calloc(b->ngroups, sizeof(*b->group));
	atomic_init(&b->allocated_bytes, (uint64_t)b->ngroups * sizeof(*b->group));
	atomic_init(&b->fine_slots, 0);
	return b->group ? 0 : -ENOMEM;
}

/* Main thread, no reader left. */
void bm_destroy(struct cache_bitmaps *b)
{
	for (uint32_t g = 0; g < b->ngroups; g++) {
		struct bm_group *gr = atomic_load(&b->group[g]);
		if (!gr)
			continue;
		_Atomic(uint64_t *) *fa = atomic_load(&gr->fine);
		if (fa) {
			for (uint32_t i = 0; i < BM_GROUP; i++)
				free(atomic_load(&fa[i]));
			free(fa);
		}
		free(gr);
	}
	free(b->group);
	b->group = NULL;
}

static size_t fine_bytes(const struct cache_bitmaps *b)
{
	return (size_t)2 * b->fwords * sizeof(uint64_t);
}

void bm_slot_reuse(struct cache_bitmaps *b, uint32_t s)
{
	struct bm_group *g = atomic_load_explicit(&b->group[s / BM_GROUP], memory_order_acquire);
	_Atomic(uint64_t *) *fa = g ? atomic_load_explicit(&g->fine, memory_order_acquire) : NULL;
	uint64_t *f = fa ? atomic_exchange(&fa[s % BM_GROUP], NULL) : NULL;
	if (f) {
		free(f);
		atomic_fetch_sub(&b->allocated_bytes, fine_bytes(b));
	}
}

/*
 * Where a slot's bits are: v and d point at units of (1 << shift)
 * sectors, units of them per bitmap. Absent (false) for a slot whose
 * chunk was never allocated.
 */
struct bm_view {
	_Atomic uint64_t *v, *d;
	uint32_t shift, units, words;
};

static bool bm_view(struct cache_bitmaps *b, uint32_t s, uint32_t bits, struct bm_view *o)
{
	struct bm_group *g = atomic_load_explicit(&b->group[s / BM_GROUP], memory_order_acquire);
	if (!g)
		return false;
	if (bits & SB_FINE) {
		_Atomic(uint64_t *) *fa = atomic_load_explicit(&g->fine, memory_order_acquire);
		uint64_t *f = atomic_load_explicit(&fa[s % BM_GROUP], memory_order_acquire);
		o->v = (_Atomic uint64_t *)f;
		o->shift = 0;
		o->words = b->fwords;
	} else {
		o->v = g->words + (size_t)(s % BM_GROUP) * 2 * b->pwords;
		o->shift = BM_PAGE_SHIFT;
		o->words = b->pwords;
	}
	o->d = o->v + o->words;
	o->units = b->bpe >> o->shift;
	return true;
}

/* Caller holds the slot lock: the slot's chunk, allocated if need be. */
static struct bm_group *bm_group_get(struct cache_bitmaps *b, uint32_t s)
{
	_Atomic(struct bm_group *) *gp = &b->group[s / BM_GROUP];
	struct bm_group *g = atomic_load_explicit(gp, memory_order_acquire);
	if (g)
		return g;
	size_t bytes = sizeof(*g) + (size_t)BM_GROUP * 2 * b->pwords * sizeof(uint64_t);
	struct bm_group *n = calloc(1, bytes);
	if (!n)
		return NULL;
	struct bm_group *expected = NULL;
	if (atomic_compare_exchange_strong(gp, &expected, n)) {
		atomic_fetch_add(&b->allocated_bytes, bytes);
		return n;
	}
	free(n);
	return expected;
}

/* Caller holds the slot lock: per-sector bitmaps for s, zeroed. */
static uint64_t *bm_fine_get(struct cache_bitmaps *b, struct bm_group *g, uint32_t s)
{
	_Atomic(uint64_t *) *fa = atomic_load_explicit(&g->fine, memory_order_acquire);
	if (!fa) {
		_Atomic(uint64_t *) *n = calloc(BM_GROUP, sizeof(*n));
		if (!n)
			return NULL;
		_Atomic(uint64_t *) *expected = NULL;
		if (atomic_compare_exchange_strong(&g->fine, &expected, n)) {
			atomic_fetch_add(&b->allocated_bytes, BM_GROUP * sizeof(*n));
			fa = n;
		} else {
			free(n);
			fa = expected;
		}
	}
	uint64_t *f = atomic_load_explicit(&fa[s % BM_GROUP], memory_order_relaxed);
	if (f) {
		/* a JOP_FREE earlier in this slot's life left them; nobody reads them */
		memset(f, 0, fine_bytes(b));
		return f;
	}
	f = calloc(1, fine_bytes(b));
	if (!f)
		return NULL;
	atomic_store_explicit(&fa[s % BM_GROUP], f, memory_order_release);
	atomic_fetch_add(&b->allocated_bytes, fine_bytes(b));
	return f;
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

static inline bool unit_bit(_Atomic uint64_t *w, uint32_t u)
{
	return (atomic_load_explicit(&w[u / 64], memory_order_relaxed) >> (u % 64)) & 1;
}

static uint64_t slot_dirty_count(struct cache_set *cs, uint32_t s, uint32_t bits)
{
	struct bm_view w;
	if (!(bits & SB_DIRTY))
		return 0;
	if (!(bits & SB_HAS_BM) || !bm_view(&cs->bm, s, bits, &w))
		return cs->bm.bpe;
	return count_bits(w.d, w.words) << w.shift;
}

/* Any thread, no lock: dirty sectors of slot s (a snapshot). */
uint64_t slot_dirty_blocks(struct cache_set *cs, uint32_t s)
{
	uint32_t bits = atomic_load_explicit(&cs->slots[s].bits, memory_order_acquire);
	return (bits & SB_STATE_MASK) == SB_READY ? slot_dirty_count(cs, s, bits) : 0;
}

/*
 * The state in RAM can only be made exact with memory for it, and there
 * is no safe approximation: a partial dirty write is not "the whole
 * extent dirty" (that would destage invalid blocks) nor "not valid" (that
 * would read the backing store's stale copy). The journal on the legs is
 * exact, so stopping here loses nothing acknowledged: start again with
 * the memory to hold the set.
 */
static _Noreturn void bm_oom(struct cache_set *cs, uint32_t s)
{
	log_err("cache %s: no memory for the block bitmaps of slot %u: stopping (the journal holds the state)",
		cs->name, s);
	abort();
}

/* Fill a fresh bitmap from the summary flags (units of the view). */
static void bm_fill(const struct bm_view *w, uint32_t bits)
{
	uint64_t vfill = (bits & SB_FULL_VALID) ? ~0ull : 0;
	uint64_t dfill = (bits & SB_DIRTY) ? ~0ull : 0;
	for (uint32_t i = 0; i < w->words; i++) {
		uint64_t lim = word_mask(i, 0, w->units);
		atomic_store_explicit(&w->v[i], vfill & lim, memory_order_relaxed);
		atomic_store_explicit(&w->d[i], dfill & lim, memory_order_relaxed);
	}
}

/* Page-grain words of pw, one bit per sector into f (valid, then dirty). */
static void bm_split(const struct cache_bitmaps *b, const struct bm_view *pw, uint64_t *f)
{
	const uint32_t per = 1u << BM_PAGE_SHIFT;
	const uint64_t ones = (1ull << per) - 1;
	for (uint32_t u = 0; u < pw->units; u++) {
		uint32_t at = u * per;
		if (unit_bit(pw->v, u))
			f[at / 64] |= ones << (at % 64);
		if (unit_bit(pw->d, u))
			f[b->fwords + at / 64] |= ones << (at % 64);
	}
}

/*
 * Caller holds slot_lock(s). Applies op to blocks [first, first+count)
 * with atomic word updates so lock-free readers see each word either
 * before or after. Never sleeps; may allocate the slot's bitmap chunk or
 * its per-sector bitmaps.
 */
void slot_apply(struct cache_set *cs, uint32_t s, int op, uint32_t first, uint32_t count)
{
	struct slot *sl = &cs->slots[s];
	struct cache_bitmaps *b = &cs->bm;
	uint32_t bits = atomic_load(&sl->bits);
	uint64_t dirty_before = slot_dirty_count(cs, s, bits);
	bool whole = first == 0 && count >= b->bpe;
	struct bm_view w;

	if (op == JOP_FREE) {
		if ((bits & SB_HAS_BM) && bm_view(b, s, bits, &w)) {
			for (uint32_t i = 0; i < w.words; i++) {
				atomic_store(&w.v[i], 0);
				atomic_store(&w.d[i], 0);
			}
		}
		atomic_fetch_and(&sl->bits, ~(SB_FULL_VALID | SB_DIRTY | SB_HAS_BM | SB_FINE | SB_CANCEL));
		atomic_fetch_sub(&cs->dirty_blocks, dirty_before);
		if (bits & SB_FINE)
			atomic_fetch_sub(&b->fine_slots, 1); /* its bitmaps wait for bm_slot_reuse */
		return;
	}
	if (!count)
		return;
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
	uint32_t end = first + count < b->bpe ? first + count : b->bpe;
	struct bm_group *g = bm_group_get(b, s);
	if (!g)
		bm_oom(cs, s);
	if (!(bits & SB_HAS_BM)) {
		/* from the summary, at page grain (a slot without bitmaps is never SB_FINE) */
		bits &= ~SB_FINE;
		bm_view(b, s, bits, &w);
		bm_fill(&w, bits);
		atomic_fetch_or_explicit(&sl->bits, SB_HAS_BM, memory_order_release);
		bits |= SB_HAS_BM;
	}
	const uint32_t pmask = (1u << BM_PAGE_SHIFT) - 1;
	if (!(bits & SB_FINE) && ((first & pmask) || (end & pmask))) {
		uint64_t *f = bm_fine_get(b, g, s);
		if (!f)
			bm_oom(cs, s);
		bm_view(b, s, bits, &w);
		bm_split(b, &w, f);
		atomic_fetch_or_explicit(&sl->bits, SB_FINE, memory_order_release);
		atomic_fetch_add(&b->fine_slots, 1);
		bits |= SB_FINE;
	}
	bm_view(b, s, bits, &w);
	uint32_t lo = first >> w.shift, hi = end >> w.shift; /* exact: aligned, or per sector */
	for (uint32_t i = lo / 64; i <= (hi - 1) / 64 && i < w.words; i++) {
		uint64_t m = word_mask(i, lo, hi);
		switch (op) {
		case JOP_DIRTY:
			atomic_fetch_or(&w.v[i], m);
			atomic_fetch_or(&w.d[i], m);
			break;
		case JOP_VALID:
			atomic_fetch_or(&w.v[i], m);
			atomic_fetch_and(&w.d[i], ~m);
			break;
		case JOP_CLEAN:
			atomic_fetch_and(&w.d[i], ~m);
			break;
		case JOP_INVALIDATE:
			atomic_fetch_and(&w.d[i], ~m);
			atomic_fetch_and(&w.v[i], ~m);
			break;
		}
	}
	bool full = true, any_dirty = false;
	for (uint32_t i = 0; i < w.words; i++) {
		uint64_t lim = word_mask(i, 0, w.units);
		if ((atomic_load(&w.v[i]) & lim) != lim)
			full = false;
		if (atomic_load(&w.d[i]))
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
	struct bm_view w;
	if (bits & SB_FULL_VALID) {
		*v = true;
		return count;
	}
	if (!(bits & SB_HAS_BM) || !bm_view(&cs->bm, s, bits, &w)) {
		*v = false;
		return count;
	}
	uint32_t end = first + count, i = first;
	bool want = unit_bit(w.v, first >> w.shift);
	while (i < end) {
		uint32_t u = i >> w.shift;
		if (unit_bit(w.v, u) != want)
			break;
		i = (u + 1) << w.shift;
	}
	*v = want;
	return (i < end ? i : end) - first;
}

bool slot_all_valid(struct cache_set *cs, uint32_t s, uint32_t first, uint32_t count)
{
	bool v;
	return slot_valid_run(cs, s, first, count, &v) == count && v;
}

/* The units of view w that [first, first+count) touches: [*lo, *hi). */
static inline void unit_span(const struct bm_view *w, uint32_t first, uint32_t count, uint32_t *lo, uint32_t *hi)
{
	*lo = first >> w->shift;
	*hi = (first + count + (1u << w->shift) - 1) >> w->shift;
}

/* Any thread, no lock. */
bool slot_any_dirty(struct cache_set *cs, uint32_t s, uint32_t first, uint32_t count)
{
	uint32_t bits = atomic_load_explicit(&cs->slots[s].bits, memory_order_acquire);
	struct bm_view w;
	uint32_t lo, hi;
	if (!(bits & SB_DIRTY) || !count)
		return false;
	if (!(bits & SB_HAS_BM) || !bm_view(&cs->bm, s, bits, &w))
		return true;
	unit_span(&w, first, count, &lo, &hi);
	for (uint32_t i = lo / 64; i <= (hi - 1) / 64; i++)
		if (atomic_load(&w.d[i]) & word_mask(i, lo, hi))
			return true;
	return false;
}

/*
 * Any thread, no lock: are all of [first, first+count) dirty (so valid)?
 * Only a slot with bitmaps answers yes: without them the summary says
 * only whether the whole extent is.
 */
bool slot_all_dirty(struct cache_set *cs, uint32_t s, uint32_t first, uint32_t count)
{
	uint32_t bits = atomic_load_explicit(&cs->slots[s].bits, memory_order_acquire);
	struct bm_view w;
	uint32_t lo, hi;
	if (!(bits & SB_DIRTY) || !(bits & SB_HAS_BM) || !count || !bm_view(&cs->bm, s, bits, &w))
		return false;
	unit_span(&w, first, count, &lo, &hi);
	for (uint32_t i = lo / 64; i <= (hi - 1) / 64; i++) {
		uint64_t m = word_mask(i, lo, hi);
		if ((atomic_load(&w.d[i]) & m) != m)
			return false;
	}
	return true;
}

/* Caller holds slot_lock (the cleaner snapshots dirty runs). */
bool slot_next_dirty_run(struct cache_set *cs, uint32_t s, uint32_t *first, uint32_t *count)
{
	uint32_t bits = atomic_load(&cs->slots[s].bits);
	uint32_t bpe = cs->bm.bpe;
	struct bm_view w;
	if (!(bits & SB_DIRTY) || *first >= bpe)
		return false;
	if (!(bits & SB_HAS_BM) || !bm_view(&cs->bm, s, bits, &w)) {
		*count = bpe - *first; /* the whole extent is dirty */
		return true;
	}
	uint32_t u = *first >> w.shift;
	while (u < w.units && !unit_bit(w.d, u))
		u++;
	if (u >= w.units)
		return false;
	uint32_t v = u;
	while (v < w.units && unit_bit(w.d, v))
		v++;
	uint32_t a = u << w.shift, z = v << w.shift;
	if (a < *first)
		a = *first;
	*first = a;
	*count = (z < bpe ? z : bpe) - a;
	return true;
}

/* Caller holds slot_lock(s). */
void slot_encode_bits(struct cache_set *cs, uint32_t s, uint8_t *valid, uint8_t *dirty)
{
	uint32_t bits = atomic_load(&cs->slots[s].bits);
	uint32_t bytes = cs->bm.bpe / 8;
	struct bm_view w;
	if (!(bits & SB_HAS_BM) || !bm_view(&cs->bm, s, bits, &w)) {
		memset(valid, (bits & SB_FULL_VALID) ? 0xff : 0, bytes);
		memset(dirty, (bits & SB_DIRTY) ? 0xff : 0, bytes);
		return;
	}
	for (uint32_t i = 0; i < bytes; i++) {
		if (w.shift) { /* a page (8 sectors) per byte */
			_Static_assert(BM_PAGE_SHIFT == 3, "one byte of sectors per page bit");
			valid[i] = unit_bit(w.v, i) ? 0xff : 0;
			dirty[i] = unit_bit(w.d, i) ? 0xff : 0;
		} else {
			valid[i] = (uint8_t)(atomic_load(&w.v[i / 8]) >> (8 * (i % 8)));
			dirty[i] = (uint8_t)(atomic_load(&w.d[i / 8]) >> (8 * (i % 8)));
		}
	}
}
