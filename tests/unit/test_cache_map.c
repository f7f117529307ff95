/*
 * test_cache_map.c - the extent map under concurrent readers and writers,
 * and the per-block valid/dirty bitmaps.
 *
 * Map: 1000 "stable" keys stay mapped to fixed slots the whole time while a
 * writer churns other keys (insert, remove, wait a grace period, reuse the
 * slot for a new key), which fills the table with tombstones and forces
 * RCU-published rebuilds. Two reader threads (registered RCU readers, as
 * workers are) look keys up lock-free: a stable key must always be found
 * at its slot (a rebuild or a tombstone must never hide it), a churn key
 * must resolve to a churn slot holding that key or to nothing. make tsan
 * builds it with -fsanitize=thread too (tests/unit/tsan.supp: TSan does
 * not model liburcu's grace periods, so the deferred free of an old table
 * is suppressed).
 *
 * Map, single-threaded: every slot resident (the table at its fullest),
 * for slot counts at the edges of the entry encoding (slot number plus
 * key fingerprint), then evict-and-refill churn through several rebuilds:
 * every present key found at its slot, absent keys not found, no slot
 * number out of range in any entry; and the table's RAM per slot.
 *
 * Bitmaps: partial writes never need a read-fill: blocks become valid and
 * dirty exactly where written; CLEAN, INVALIDATE, whole-extent summaries,
 * dirty-run iteration and the dirty block count follow. Then a model: random
 * ops, half of them whole 4 KiB pages, on slots of several extent sizes,
 * checked sector by sector against a plain array after each op (runs, any
 * and all dirty, the next dirty run, the table record's bytes, the count);
 * slots written only in whole pages must stay at page grain (the RAM
 * figure rests on it), and handing a slot out again frees its per-sector
 * bitmaps. And lock-free readers across the move to per-sector state: a
 * page made valid and dirty before a slot splits must read valid and dirty
 * at every moment of the split (it would not if SB_FINE were published
 * before the new bitmaps were filled); also under make tsan.
 */
#include "tests/unit/check.h"
#include "cache/cache_int.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>


#define NSLOTS 4096
#define STABLE 1000

static struct slot slots[NSLOTS];
static struct cache_map map;
static pthread_mutex_t wlock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic bool stop;
static _Atomic long lookups, found_churn;

static uint64_t stable_key(uint32_t i) { return cache_key(1, (uint64_t)i * 7919); }

static void *reader(void *arg)
{
	uint64_t r = (uint64_t)(uintptr_t)arg * 0x9e3779b97f4a7c15ULL + 1;
	rcu_register_thread();
	while (!atomic_load(&stop)) {
		r ^= r << 13;
		r ^= r >> 7;
		r ^= r << 17;
		uint32_t i = (uint32_t)(r % STABLE);
		rcu_read_lock();
		uint32_t s = map_lookup(&map, stable_key(i));
		rcu_read_unlock();
		REQUIRE(s == i, "stable key %u found at slot %d", i, (int)s);
		uint64_t ck = cache_key(2, r % 20000);
		rcu_read_lock();
		s = map_lookup(&map, ck);
		if (s != POLICY_NO_SLOT) {
			REQUIRE(s >= STABLE && s < NSLOTS, "churn key in slot %u", s);
			atomic_fetch_add(&found_churn, 1);
		}
		rcu_read_unlock();
		atomic_fetch_add(&lookups, 2);
	}
	rcu_unregister_thread();
	return NULL;
}

static void *writer(void *arg)
{
	(void)arg;
	uint64_t r = 12345;
	uint64_t owner[NSLOTS];
	for (int i = 0; i < NSLOTS; i++)
		owner[i] = CACHE_KEY_NONE;
	rcu_register_thread();
	long ops = 0;
	while (!atomic_load(&stop)) {
		r ^= r << 13;
		r ^= r >> 7;
		r ^= r << 17;
		uint32_t s = STABLE + (uint32_t)(r % (NSLOTS - STABLE));
		pthread_mutex_lock(&wlock);
		if (owner[s] != CACHE_KEY_NONE) {
			map_remove(&map, owner[s], s);
			pthread_mutex_unlock(&wlock);
			synchronize_rcu(); /* nobody can still be looking at it */
			atomic_store(&slots[s].key, CACHE_KEY_NONE);
			owner[s] = CACHE_KEY_NONE;
		} else {
			uint64_t k = cache_key(2, (r >> 20) % 20000);
			if (map_insert(&map, k, s) == 0)
				owner[s] = k;
			pthread_mutex_unlock(&wlock);
		}
		ops++;
	}
	printf("writer: %ld inserts/removes\n", ops);
	rcu_unregister_thread();
	return NULL;
}

static void test_map_concurrent(void)
{
	for (int i = 0; i < NSLOTS; i++)
		atomic_init(&slots[i].key, CACHE_KEY_NONE);
	REQUIRE(map_init(&map, slots, NSLOTS) == 0, "init");
	for (uint32_t i = 0; i < STABLE; i++)
		REQUIRE(map_insert(&map, stable_key(i), i) == 0, "insert stable %u", i);
	REQUIRE(map_insert(&map, stable_key(5), 4000) == -EEXIST, "a key cannot be inserted twice");
	pthread_t rd[2], wr;
	for (int i = 0; i < 2; i++)
		pthread_create(&rd[i], NULL, reader, (void *)(uintptr_t)(i + 1));
	pthread_create(&wr, NULL, writer, NULL);
	sleep(2);
	atomic_store(&stop, true);
	pthread_join(wr, NULL);
	for (int i = 0; i < 2; i++)
		pthread_join(rd[i], NULL);
	rcu_barrier();
	REQUIRE(atomic_load(&found_churn) > 0, "readers never saw a churn key");
	printf("ok: %ld lock-free lookups against a churning map, stable keys always found\n",
	       atomic_load(&lookups));
	map_destroy(&map);
}

/* Walk the table: live entries, tombstones; every live entry names a slot < n. */
static void table_census(struct cache_map *m, uint32_t n, uint32_t *live, uint32_t *tombs)
{
	struct map_table *t = atomic_load(&m->t);
	*live = *tombs = 0;
	for (uint32_t i = 0; i < t->size; i++) {
		uint32_t e = atomic_load(&t->e[i]);
		if (e == MAP_TOMB)
			(*tombs)++;
		else if (e != MAP_EMPTY) {
			REQUIRE((e & ~t->fp_mask) < n, "entry %#x names slot %u of %u", e, e & ~t->fp_mask, n);
			(*live)++;
		}
	}
	REQUIRE(*live == t->used && *tombs == t->tombs, "census %u/%u, table says %u/%u", *live, *tombs,
		t->used, t->tombs);
}

static void test_map_full(void)
{
	/* 2^w - 2 slots is the most a w-bit slot field holds (all ones and
	 * all ones but one are EMPTY and TOMB); one more widens the field. */
#ifdef TC_TSAN /* single-threaded part: the smaller sizes are enough under TSan */
	const uint32_t sizes[] = { 1, 2, 3, 6, 7, 14, 100, 1022, 1023 };
#else
	const uint32_t sizes[] = { 1, 2, 3, 6, 7, 14, 100, 1022, 1023, 65534, 65535, 200000 };
#endif
	for (size_t z = 0; z < sizeof(sizes) / sizeof(sizes[0]); z++) {
		uint32_t n = sizes[z];
		struct slot *sl = calloc(n, sizeof(*sl));
		uint64_t *owner = malloc(n * sizeof(*owner));
		struct cache_map m;
		REQUIRE(sl && owner && map_init(&m, sl, n) == 0, "init %u", n);
		for (uint32_t s = 0; s < n; s++) {
			owner[s] = cache_key(3, (uint64_t)s * 2);
			REQUIRE(map_insert(&m, owner[s], s) == 0, "fill slot %u of %u", s, n);
		}
		REQUIRE(map_insert(&m, owner[n - 1], 0) == -EEXIST, "duplicate refused (%u slots)", n);
		uint64_t r = n, next = (uint64_t)n * 2;
		long rounds = 4L * n + 64, rebuilds = 0;
		for (long i = 0; i <= rounds; i++) {
			if (i % (rounds / 4) == 0) {
				uint32_t live, tombs;
				table_census(&m, n, &live, &tombs);
				REQUIRE(live == n, "%u live entries for %u slots", live, n);
				for (uint32_t s = 0; s < n; s++) {
					REQUIRE(map_lookup(&m, owner[s]) == s, "slot %u of %u found", s, n);
					REQUIRE(map_lookup(&m, owner[s] + 1) == POLICY_NO_SLOT, "absent key %u", s);
				}
			}
			/* evict a slot, refill it with an extent never seen */
			r ^= r << 13;
			r ^= r >> 7;
			r ^= r << 17;
			uint32_t s = (uint32_t)(r % n);
			map_remove(&m, owner[s], s);
			REQUIRE(map_lookup(&m, owner[s]) == POLICY_NO_SLOT, "removed key gone");
			owner[s] = cache_key(3, next += 2);
			struct map_table *before = atomic_load(&m.t);
			REQUIRE(map_insert(&m, owner[s], s) == 0, "refill slot %u of %u", s, n);
			rebuilds += atomic_load(&m.t) != before;
		}
		REQUIRE(n < 1000 || rebuilds > 0, "%u slots: no rebuild in %ld evictions", n, rounds);
		if (n == 200000)
			printf("ok: 200000 slots: %ld rebuilds in %ld evictions\n", rebuilds, rounds);
		/* emptying the table leaves neither entries nor tombstones
		 * behind a removal that ends a run */
		for (uint32_t s = 0; s < n; s++)
			map_remove(&m, owner[s], s);
		uint32_t live, tombs;
		table_census(&m, n, &live, &tombs);
		REQUIRE(live == 0, "%u entries left", live);
		map_destroy(&m);
		rcu_barrier();
		free(sl);
		free(owner);
	}
	printf("ok: full tables of 1 to 200000 slots through 4 x n evictions: every key at its slot\n");

	/* RAM: the table's share of the 100 KB per GB budget (bench_cache_mem) */
	uint32_t n = 262144; /* 64 GiB of 256 KiB extents */
	struct slot *sl = calloc(n, sizeof(*sl));
	struct cache_map m;
	REQUIRE(sl && map_init(&m, sl, n) == 0, "init");
	double per_slot = (double)(map_mem_bytes(&m) - (uint64_t)n * sizeof(struct slot)) / n;
	REQUIRE(per_slot <= 4.61, "map table %.3f bytes per slot (budget 4.6)", per_slot);
	printf("ok: map table %.3f bytes per slot beside the %zu-byte slot\n", per_slot, sizeof(struct slot));
	map_destroy(&m);
	free(sl);
}

static void test_bitmaps(void)
{
	static struct cache_set cs;
	static struct slot sl[130];
	cs.slots = sl;
	cs.lay.bpe = 128; /* 64 KiB extents of 512-byte blocks */
	REQUIRE(bm_init(&cs.bm, 130, 128) == 0, "bm init");

	/* a 4 KiB write into the middle of an empty slot: no read-fill, 8 blocks valid+dirty */
	slot_lock(&sl[3]);
	slot_apply(&cs, 3, JOP_DIRTY, 16, 8);
	slot_unlock(&sl[3]);
	bool v;
	REQUIRE(slot_valid_run(&cs, 3, 0, 128, &v) == 16 && !v, "blocks 0..15 invalid");
	REQUIRE(slot_valid_run(&cs, 3, 16, 112, &v) == 8 && v, "blocks 16..23 valid");
	REQUIRE(slot_all_valid(&cs, 3, 16, 8) && !slot_all_valid(&cs, 3, 15, 2), "all_valid at the edges");
	REQUIRE(slot_any_dirty(&cs, 3, 0, 17) && !slot_any_dirty(&cs, 3, 24, 104), "dirty exactly where written");
	REQUIRE(atomic_load(&cs.dirty_blocks) == 8, "8 dirty blocks counted, got %llu",
	      (unsigned long long)atomic_load(&cs.dirty_blocks));
	REQUIRE(atomic_load(&sl[3].bits) & SB_HAS_BM, "partial slot has a bitmap");

	/* a second write across a word boundary, then runs */
	slot_apply(&cs, 3, JOP_DIRTY, 60, 10);
	uint32_t first = 0, count = 0;
	REQUIRE(slot_next_dirty_run(&cs, 3, &first, &count) && first == 16 && count == 8, "first run 16+8");
	first += count;
	REQUIRE(slot_next_dirty_run(&cs, 3, &first, &count) && first == 60 && count == 10, "second run 60+10");
	first += count;
	REQUIRE(!slot_next_dirty_run(&cs, 3, &first, &count), "no third run");

	/* destage cleans one run; it stays valid */
	slot_apply(&cs, 3, JOP_CLEAN, 60, 10);
	REQUIRE(!slot_any_dirty(&cs, 3, 60, 10) && slot_all_valid(&cs, 3, 60, 10), "clean keeps valid");
	REQUIRE(atomic_load(&cs.dirty_blocks) == 8, "dirty count after clean");
	/* UNMAP invalidates: neither valid nor dirty */
	slot_apply(&cs, 3, JOP_INVALIDATE, 18, 2);
	REQUIRE(!slot_all_valid(&cs, 3, 18, 1) && !slot_any_dirty(&cs, 3, 18, 2) && slot_any_dirty(&cs, 3, 16, 2),
	      "invalidate is exact");
	REQUIRE(atomic_load(&cs.dirty_blocks) == 6, "dirty count after invalidate");
	/* filling the rest makes the summary say full-valid */
	slot_apply(&cs, 3, JOP_VALID, 0, 16);
	slot_apply(&cs, 3, JOP_VALID, 18, 2);
	slot_apply(&cs, 3, JOP_VALID, 24, 36);
	slot_apply(&cs, 3, JOP_VALID, 70, 58);
	REQUIRE(atomic_load(&sl[3].bits) & SB_FULL_VALID, "full-valid summary");
	REQUIRE(slot_any_dirty(&cs, 3, 0, 128) && atomic_load(&sl[3].bits) & SB_DIRTY, "still dirty where written");

	/* whole-extent ops on another slot need no bitmap at all */
	slot_apply(&cs, 100, JOP_DIRTY, 0, 128);
	REQUIRE(!(atomic_load(&sl[100].bits) & SB_HAS_BM) && (atomic_load(&sl[100].bits) & SB_FULL_VALID) &&
	      slot_any_dirty(&cs, 100, 5, 1), "whole-extent write: summary flags only");
	REQUIRE(atomic_load(&cs.bm.group[100 / BM_GROUP]) == NULL, "no bitmap chunk allocated for it");
	REQUIRE(atomic_load(&cs.dirty_blocks) == 6 + 128, "dirty count with a whole dirty extent");
	slot_apply(&cs, 100, JOP_FREE, 0, 128);
	slot_apply(&cs, 3, JOP_FREE, 0, 128);
	REQUIRE(atomic_load(&cs.dirty_blocks) == 0, "free clears the dirty count");
	REQUIRE(!slot_any_dirty(&cs, 3, 0, 128) && !slot_all_valid(&cs, 3, 0, 1), "free clears the bitmaps");
	bm_destroy(&cs.bm);
	printf("ok: bitmaps: partial writes, runs, clean, invalidate, summaries, counts\n");
}

/* ---- bitmaps against a model -------------------------------------------- */

static uint64_t rnd_state = 0x9e3779b97f4a7c15ull;

static uint32_t rnd(uint32_t n)
{
	rnd_state ^= rnd_state << 13;
	rnd_state ^= rnd_state >> 7;
	rnd_state ^= rnd_state << 17;
	return (uint32_t)(rnd_state % n);
}

#define MODEL_SLOTS 6

static void model_check(struct cache_set *cs, uint32_t s, const uint8_t *val, const uint8_t *dir, const char *when)
{
	uint32_t bpe = cs->bm.bpe;
	for (uint32_t i = 0; i < bpe; i += 1 + rnd(bpe / 64)) { /* about 130 starts at any size */
		bool v;
		uint32_t n = slot_valid_run(cs, s, i, bpe - i, &v), k = i;
		while (k < bpe && val[k] == val[i])
			k++;
		REQUIRE(v == val[i] && n == k - i, "%s: slot %u valid run at %u: %u %d, model %u %d", when, s, i, n, v,
			k - i, val[i]);
		uint32_t len = 1 + rnd(bpe - i);
		bool any = false, all = true;
		for (uint32_t j = i; j < i + len; j++) {
			any |= dir[j];
			all &= dir[j];
		}
		REQUIRE(slot_any_dirty(cs, s, i, len) == any, "%s: slot %u any_dirty(%u, %u)", when, s, i, len);
		/* all_dirty may say no for a slot without bitmaps (its contract) */
		bool has_bm = atomic_load(&cs->slots[s].bits) & SB_HAS_BM;
		bool ad = slot_all_dirty(cs, s, i, len);
		REQUIRE(has_bm ? ad == all : !ad, "%s: slot %u all_dirty(%u, %u)", when, s, i, len);
	}
	/* dirty runs, from every start */
	for (uint32_t i = 0; i < bpe; i += 1 + rnd(9)) {
		uint32_t f = i, c = 0, a = i;
		while (a < bpe && !dir[a])
			a++;
		uint32_t z = a;
		while (z < bpe && dir[z])
			z++;
		bool got = slot_next_dirty_run(cs, s, &f, &c);
		REQUIRE(got == (a < bpe) && (!got || (f == a && c == z - a)),
			"%s: slot %u next dirty run from %u: %d %u+%u, model %u+%u", when, s, i, got, f, c, a, z - a);
	}
	uint8_t vb[1024], db[1024];
	slot_encode_bits(cs, s, vb, db);
	for (uint32_t i = 0; i < bpe; i++)
		REQUIRE(((vb[i / 8] >> (i % 8)) & 1) == val[i] && ((db[i / 8] >> (i % 8)) & 1) == dir[i],
			"%s: slot %u record bit %u", when, s, i);
}

static void test_bitmap_model(uint32_t bpe)
{
	static struct cache_set cs;
	static struct slot sl[MODEL_SLOTS];
	static uint8_t val[MODEL_SLOTS][8192], dir[MODEL_SLOTS][8192];
	memset(&cs, 0, sizeof(cs));
	memset(sl, 0, sizeof(sl));
	memset(val, 0, sizeof(val));
	memset(dir, 0, sizeof(dir));
	cs.slots = sl;
	cs.name = "model";
	cs.lay.bpe = bpe;
	REQUIRE(bm_init(&cs.bm, MODEL_SLOTS, bpe) == 0, "bm init");
	uint64_t base = atomic_load(&cs.bm.allocated_bytes), ever_fine = 0;
	/* slots 0..2 are only ever changed in whole pages, 3..5 also in sectors */
	for (int round = 0; round < 400; round++) {
		uint32_t s = rnd(MODEL_SLOTS);
		int op = 1 + (int)rnd(5);
		uint32_t first, count;
		if (op == JOP_FREE) {
			if (rnd(4))
				continue; /* keep slots populated most of the time */
			first = 0;
			count = bpe;
		} else if (s < 3 || rnd(2)) {
			uint32_t pages = bpe / 8;
			first = 8 * rnd(pages);
			count = 8 * (1 + rnd(rnd(4) ? 4 : pages - first / 8));
			if (first + count > bpe)
				count = bpe - first;
			if (!rnd(8)) {
				first = 0;
				count = bpe;
			}
		} else {
			first = rnd(bpe);
			count = 1 + rnd(bpe - first < 40 ? bpe - first : 40);
		}
		slot_lock(&sl[s]);
		slot_apply(&cs, s, op, first, count);
		slot_unlock(&sl[s]);
		for (uint32_t i = first; i < first + count; i++) {
			switch (op) {
			case JOP_DIRTY: val[s][i] = dir[s][i] = 1; break;
			case JOP_VALID: val[s][i] = 1; dir[s][i] = 0; break;
			case JOP_CLEAN: dir[s][i] = 0; break;
			case JOP_INVALIDATE: case JOP_FREE: val[s][i] = dir[s][i] = 0; break;
			}
		}
		char when[64];
		snprintf(when, sizeof(when), "bpe %u op %d %u+%u", bpe, op, first, count);
		model_check(&cs, s, val[s], dir[s], when);
		uint64_t ndirty = 0;
		for (uint32_t t = 0; t < MODEL_SLOTS; t++)
			for (uint32_t i = 0; i < bpe; i++)
				ndirty += dir[t][i];
		REQUIRE(atomic_load(&cs.dirty_blocks) == ndirty, "%s: dirty count %llu, model %llu", when,
			(unsigned long long)atomic_load(&cs.dirty_blocks), (unsigned long long)ndirty);
		for (uint32_t t = 0; t < 3; t++)
			REQUIRE(!(atomic_load(&sl[t].bits) & SB_FINE), "%s: slot %u, written in whole pages, went per sector",
				when, t);
		uint64_t nfine = 0;
		for (uint32_t t = 0; t < MODEL_SLOTS; t++)
			nfine += !!(atomic_load(&sl[t].bits) & SB_FINE);
		REQUIRE(atomic_load(&cs.bm.fine_slots) == nfine, "%s: %llu slots counted at sector grain, %llu are", when,
			(unsigned long long)atomic_load(&cs.bm.fine_slots), (unsigned long long)nfine);
		ever_fine += nfine;
	}
	REQUIRE(ever_fine > 0, "bpe %u: no slot went per sector", bpe);
	/* freed: none counted; handed out again: the per-sector bitmaps go, their bytes come back (the chunk stays) */
	for (uint32_t t = 0; t < MODEL_SLOTS; t++) {
		slot_lock(&sl[t]);
		slot_apply(&cs, t, JOP_FREE, 0, bpe);
		slot_unlock(&sl[t]);
	}
	REQUIRE(atomic_load(&cs.bm.fine_slots) == 0, "bpe %u: slots counted at sector grain after JOP_FREE", bpe);
	uint64_t kept = atomic_load(&cs.bm.allocated_bytes) - base;
	for (uint32_t t = 0; t < MODEL_SLOTS; t++) {
		atomic_store(&sl[t].bits, SB_FREE);
		bm_slot_reuse(&cs.bm, t);
	}
	uint64_t left = atomic_load(&cs.bm.allocated_bytes) - base;
	REQUIRE(kept > left, "bpe %u: handing the slots out again freed no per-sector bitmaps", bpe);
	uint64_t page_chunk = 8 + (uint64_t)BM_GROUP * 2 * ((bpe / 8 + 63) / 64) * 8;
	REQUIRE(left == page_chunk + BM_GROUP * sizeof(void *), "bpe %u: %llu bytes left, want the page chunk (%llu) and "
		"the per-sector pointer array", bpe, (unsigned long long)left, (unsigned long long)page_chunk);
	bm_destroy(&cs.bm);
	printf("ok: bitmaps at %u sectors per extent: 400 random ops match the model; whole pages stay at page grain\n",
	       bpe);
}

/* ---- readers across the split -------------------------------------------- */

#define SPLIT_SLOTS 32768
static struct cache_set split_cs;
static struct slot split_sl[SPLIT_SLOTS];
static _Atomic uint32_t split_ready; /* slots 0..split_ready-1 hold their stable page */
static _Atomic bool split_done;
static _Atomic long split_checks, split_seen_fine;

static void split_check(uint32_t s)
{
	bool fine = atomic_load(&split_sl[s].bits) & SB_FINE;
	REQUIRE(slot_all_valid(&split_cs, s, 0, 8) && slot_all_dirty(&split_cs, s, 0, 8) &&
			slot_any_dirty(&split_cs, s, 3, 2),
		"slot %u: its first page, dirty before the split, read otherwise (per sector: %d)", s, fine);
	atomic_fetch_add(&split_checks, 1);
	if (fine)
		atomic_fetch_add(&split_seen_fine, 1);
}

/* mostly the newest slot (the one splitting now), now and then all of them;
 * the writer splits each slot once the reader has started on it */
static void *split_reader(void *arg)
{
	(void)arg;
	for (unsigned long k = 0; !atomic_load(&split_done); k++) {
		uint32_t n = atomic_load(&split_ready);
		if (!n)
			continue;
		split_check(n - 1);
		if (k % 65536 == 0)
			for (uint32_t s = 0; s < n; s++)
				split_check(s);
	}
	return NULL;
}

static void test_bitmap_split_readers(void)
{
	split_cs.slots = split_sl;
	split_cs.name = "split";
	split_cs.lay.bpe = 512;
	REQUIRE(bm_init(&split_cs.bm, SPLIT_SLOTS, 512) == 0, "bm init");
	pthread_t rd;
	pthread_create(&rd, NULL, split_reader, NULL); /* one: with the writer, both cores busy */
	for (uint32_t s = 0; s < SPLIT_SLOTS; s++) {
		slot_lock(&split_sl[s]);
		slot_apply(&split_cs, s, JOP_DIRTY, 0, 8);
		slot_apply(&split_cs, s, JOP_VALID, 64, 64);
		slot_unlock(&split_sl[s]);
		atomic_store(&split_ready, s + 1);
		/* split it while the reader is reading it: wait until it has (a bounded wait) */
		long c0 = atomic_load(&split_checks);
		for (long k = 0; k < 1000000 && atomic_load(&split_checks) < c0 + 2; k++)
			caa_cpu_relax();
		slot_lock(&split_sl[s]);
		slot_apply(&split_cs, s, JOP_DIRTY, 9 + s % 50, 1 + s % 7);
		slot_apply(&split_cs, s, JOP_CLEAN, 70, 3);
		slot_unlock(&split_sl[s]);
	}
	atomic_store(&split_done, true);
	pthread_join(rd, NULL);
	REQUIRE(atomic_load(&split_cs.bm.fine_slots) == SPLIT_SLOTS, "%llu of %u slots split",
		(unsigned long long)atomic_load(&split_cs.bm.fine_slots), SPLIT_SLOTS);
	REQUIRE(atomic_load(&split_checks) > SPLIT_SLOTS, "the readers checked only %ld slots", atomic_load(&split_checks));
	bm_destroy(&split_cs.bm);
	printf("ok: %ld lock-free reads (%ld per sector) across %u splits to per-sector state, every stable page "
	       "intact\n", atomic_load(&split_checks), atomic_load(&split_seen_fine), SPLIT_SLOTS);
}

int main(void)
{
	rcu_register_thread();
	test_bitmaps();
	test_bitmap_split_readers();
	test_bitmap_model(128);
	test_bitmap_model(512);
	test_bitmap_model(8192);
	test_map_full();
	test_map_concurrent();
	rcu_unregister_thread();
	return 0;
}
