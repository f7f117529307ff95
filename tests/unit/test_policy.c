/*
 * test_policy.c - admission waits for the threshold, long sequential streams
 * bypass, a victim is always a clean resident slot, one scan cannot flush
 * the hot set, and the lock-free hit path is safe beside a running evictor.
 *
 * Every check prints "ok:" or "FAIL:"; exit status 1 if any failed. make
 * tsan builds it with -fsanitize=thread to let TSan watch the concurrency
 * check.
 */
#include "tests/unit/check.h"
#include "cache/policy.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#define KiB 1024ull
#define MiB (1024ull * KiB)
#define EXTENT (256 * KiB)
#define BID 1u

static uint64_t key_of(uint32_t bid, uint64_t extent)
{
	return ((uint64_t)bid << 40) | extent;
}

/* xorshift64*: a seeded generator, so every run sees the same sequence. */
static uint64_t rng_next(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 0x2545f4914f6cdd1dull;
}

static struct policy *make(uint32_t nslots, uint32_t admit_hits, uint64_t cutoff)
{
	struct policy_cfg cfg = {
		.nslots = nslots,
		.admit_hits = admit_hits,
		.seq_cutoff = cutoff,
		.extent_size = EXTENT,
	};
	return policy_new(&cfg);
}

/* A 4 KiB read at an 8 KiB boundary inside extent: never where an earlier
 * one ended, so never a sequential continuation. */
static bool miss(struct policy *p, uint64_t extent, uint64_t *rng)
{
	uint64_t off = extent * EXTENT + (rng_next(rng) % 30 + 1) * 8 * KiB;
	return policy_admit(p, key_of(BID, extent), BID, off, 4 * KiB, false);
}

/* ---- admission threshold ---------------------------------------------- */

static void test_threshold(void)
{
	uint64_t rng = 1;
	struct policy *p = make(4096, 3, 4 * MiB);
	int early = 0, late = 0;

	/* Lightly loaded sketch: exact. */
	for (uint64_t k = 0; k < 50; k++) {
		uint64_t ext = k * 7919 + 13;
		if (miss(p, ext, &rng))
			early++;
		if (miss(p, ext, &rng))
			early++;
		if (!miss(p, ext, &rng))
			late++;
	}
	CHECK(early == 0, "admit_hits=3: no extent of 50 admitted on its 1st or 2nd miss (%d were)",
	      early);
	CHECK(late == 0, "admit_hits=3: every extent admitted on its 3rd miss (%d were not)", late);

	/* Loaded: 2000 keys, each missed 3 times within one aging period of a
	 * 4096-slot sketch. A count-min sketch never undercounts (none late);
	 * collisions may admit some early. */
	early = late = 0;
	for (uint64_t k = 0; k < 2000; k++) {
		uint64_t ext = k * 104729 + 77;
		early += miss(p, ext, &rng);
		early += miss(p, ext, &rng);
		late += !miss(p, ext, &rng);
	}
	CHECK(early <= 2000 / 10 && late == 0, "admit_hits=3 under load: %d of 2000 admitted "
	      "early (limit 10%%), %d late", early, late);
	policy_free(p);

	p = make(4096, 1, 4 * MiB);
	int refused = 0;
	for (uint64_t k = 0; k < 500; k++)
		if (!miss(p, k * 31 + 5, &rng))
			refused++;
	CHECK(refused == 0, "admit_hits=1: every first miss admitted (%d refused)", refused);
	policy_free(p);

	struct policy_cfg cfg = {
		.nslots = 4096, .admit_hits = 3, .write_admit_hits = 1,
		.seq_cutoff = 4 * MiB, .extent_size = EXTENT,
	};
	p = policy_new(&cfg);
	bool w = policy_admit(p, key_of(BID, 100), BID, 100 * EXTENT + 8 * KiB, 4 * KiB, true);
	bool r = policy_admit(p, key_of(BID, 200), BID, 200 * EXTENT + 8 * KiB, 4 * KiB, false);
	CHECK(w && !r, "write_admit_hits=1: a write miss admitted at once (%d), a read miss not (%d)",
	      w, r);
	policy_free(p);

	/* One pass of small sequential reads through an extent is one visit. */
	p = make(4096, 2, 4 * MiB);
	int admitted = 0;
	for (uint64_t off = 0; off < EXTENT; off += 4 * KiB)
		admitted += policy_admit(p, key_of(BID, 50), BID, 50 * EXTENT + off, 4 * KiB, false);
	CHECK(admitted == 0, "admit_hits=2: 64 sequential 4 KiB reads of one extent count once "
	      "(%d admitted)", admitted);
	CHECK(miss(p, 50, &rng), "admit_hits=2: a later re-read of that extent is admitted");
	policy_free(p);

	/* OCF's trigger: while the cache fills, every miss is promoted. */
	cfg = (struct policy_cfg){
		.nslots = 100, .admit_hits = 3, .fill_admit_pct = 80,
		.seq_cutoff = 4 * MiB, .extent_size = EXTENT,
	};
	p = policy_new(&cfg);
	int filled = 0;
	for (uint64_t k = 0; k < 100; k++) {
		if (!miss(p, 5000 + k * 3, &rng))
			break;
		policy_insert(p, (uint32_t)k, key_of(BID, 5000 + k * 3));
		filled++;
	}
	CHECK(filled == 80, "fill_admit_pct=80: first misses admitted until 80 of 100 slots are "
	      "resident (%d were)", filled);
	policy_free(p);

	/* Aging: a miss long ago no longer counts. */
	p = make(1024, 2, 4 * MiB);
	(void)miss(p, 7, &rng);
	for (uint64_t k = 0; k < 20 * 1024; k++)
		(void)miss(p, 1000000 + k, &rng);
	CHECK(!miss(p, 7, &rng), "admit_hits=2: a miss 20 x nslots misses ago is forgotten");
	policy_free(p);
}

/* ---- sequential bypass ------------------------------------------------ */

static void test_sequential(void)
{
	struct policy *p = make(4096, 1, 4 * MiB);
	int wrong_before = 0, wrong_after = 0;

	for (uint64_t off = 0; off < 16 * MiB; off += 64 * KiB) {
		bool a = policy_admit(p, key_of(BID, off / EXTENT), BID, off, 64 * KiB, false);
		if (off + 64 * KiB <= 4 * MiB && !a)
			wrong_before++;
		if (off + 64 * KiB > 4 * MiB && a)
			wrong_after++;
	}
	CHECK(wrong_before == 0, "cutoff 4 MiB: 64 KiB stream admitted while run <= 4 MiB (%d not)",
	      wrong_before);
	CHECK(wrong_after == 0, "cutoff 4 MiB: 64 KiB stream bypassed once run > 4 MiB (%d not)",
	      wrong_after);

	/* Exactly the cutoff, then a seek: never bypassed. */
	int bypassed = 0;
	for (int rep = 0; rep < 3; rep++) {
		uint64_t base = (uint64_t)(1000 + rep * 100) * MiB;
		for (uint64_t off = 0; off < 4 * MiB; off += 128 * KiB)
			bypassed += !policy_admit(p, key_of(BID, (base + off) / EXTENT), BID,
						  base + off, 128 * KiB, false);
	}
	CHECK(bypassed == 0, "cutoff 4 MiB: three streams of exactly 4 MiB never bypass (%d did)",
	      bypassed);

	/* Two interleaved streams on one backing store are tracked apart. */
	int short_bypassed = 0, long_admitted = 0;
	for (uint64_t off = 0; off < 8 * MiB; off += 256 * KiB) {
		for (uint64_t s = 0; s < 2; s++) {
			uint64_t o = (5000 + s * 1000) * MiB + off;
			bool a = policy_admit(p, key_of(BID, o / EXTENT), BID, o, 256 * KiB, false);
			if (off + 256 * KiB <= 4 * MiB)
				short_bypassed += !a;
			else
				long_admitted += a;
		}
	}
	CHECK(short_bypassed == 0 && long_admitted == 0,
	      "two interleaved 8 MiB streams: each bypasses exactly past its own 4 MiB "
	      "(%d early, %d late)", short_bypassed, long_admitted);

	/* Same offsets on different backing stores do not add up. */
	int cross = 0;
	for (uint64_t off = 0; off < 3 * MiB; off += 256 * KiB)
		for (uint32_t bid = 2; bid < 6; bid++)
			cross += !policy_admit(p, key_of(bid, off / EXTENT), bid, off, 256 * KiB, false);
	CHECK(cross == 0, "four 3 MiB streams at the same offsets on 4 backing stores: none "
	      "bypassed (%d were)", cross);

	/* The engine asks once per extent of a multi-extent request. */
	int multi_wrong = 0;
	for (uint64_t off = 0; off < 8 * MiB; off += MiB) {
		uint64_t o = 9000 * MiB + off;
		for (uint64_t e = 0; e < MiB / EXTENT; e++) {
			bool a = policy_admit(p, key_of(BID, o / EXTENT + e), BID, o, MiB, false);
			if (a != (off + MiB <= 4 * MiB))
				multi_wrong++;
		}
	}
	CHECK(multi_wrong == 0, "1 MiB requests asked per extent (4 calls each): bypass starts at "
	      "the 5th request, not earlier (%d wrong answers)", multi_wrong);

	uint64_t rng = 7;
	int rand_bypassed = 0;
	for (int i = 0; i < 20000; i++) {
		uint64_t o = (rng_next(&rng) % (1ull << 40)) & ~(4 * KiB - 1);
		rand_bypassed += !policy_admit(p, key_of(BID, o / EXTENT), BID, o, 4 * KiB, false);
	}
	CHECK(rand_bypassed == 0, "20000 random 4 KiB reads: none bypassed (%d were)", rand_bypassed);

	struct policy_stats st;
	policy_get_stats(p, &st);
	CHECK(st.seq_bypassed > 0 && st.admitted > 0, "stats count admitted (%llu) and bypassed (%llu)",
	      (unsigned long long)st.admitted, (unsigned long long)st.seq_bypassed);
	policy_free(p);

	p = make(4096, 1, 0);
	int never = 0;
	for (uint64_t off = 0; off < 64 * MiB; off += 256 * KiB)
		never += !policy_admit(p, key_of(BID, off / EXTENT), BID, off, 256 * KiB, false);
	CHECK(never == 0, "cutoff 0: a 64 MiB stream is never bypassed (%d were)", never);
	policy_free(p);
}

/* ---- victims are clean ------------------------------------------------ */

struct slots {
	uint32_t n;
	bool *resident;
	bool *dirty;
	unsigned calls;
};

static bool slot_is_clean(uint32_t slot, void *arg)
{
	struct slots *s = arg;

	s->calls++;
	return slot < s->n && !s->dirty[slot];
}

static void test_victim_clean(void)
{
	const uint32_t n = 1000;
	struct policy *p = make(n, 1, 0);
	struct slots s = { .n = n };
	uint64_t rng = 3, key = 1;
	int bad = 0, missed = 0, victims = 0;

	s.resident = calloc(n, sizeof(bool));
	s.dirty = calloc(n, sizeof(bool));
	for (int op = 0; op < 300000; op++) {
		uint32_t slot = (uint32_t)(rng_next(&rng) % n);
		switch (rng_next(&rng) % 8) {
		case 0: case 1:     /* fill a free slot */
			if (!s.resident[slot]) {
				policy_insert(p, slot, key_of(BID, key++));
				s.resident[slot] = true;
			}
			break;
		case 2:             /* a write dirties, the cleaner cleans */
			s.dirty[slot] = !s.dirty[slot];
			break;
		case 3: case 4:
			if (s.resident[slot])
				policy_touch(p, slot);
			break;
		case 5:             /* discard */
			if (rng_next(&rng) % 8 == 0 && s.resident[slot] && !s.dirty[slot]) {
				policy_remove(p, slot);
				s.resident[slot] = false;
			}
			break;
		default: {
			uint32_t v = policy_victim(p, slot_is_clean, &s);
			if (v == POLICY_NO_SLOT) {
				for (uint32_t i = 0; i < n; i++)
					if (s.resident[i] && !s.dirty[i])
						missed++;
			} else {
				victims++;
				if (v >= n || !s.resident[v] || s.dirty[v])
					bad++;
				else
					s.resident[v] = false;
			}
		}
		}
	}
	CHECK(victims > 10000 && bad == 0, "%d victims under random dirtying: none dirty, busy or "
	      "free (%d were)", victims, bad);
	CHECK(missed == 0, "NO_SLOT only when no resident slot is clean (%d clean slots overlooked)",
	      missed);

	/* Everything dirty: nothing to give. Then one clean slot: that one. */
	for (uint32_t i = 0; i < n; i++) {
		if (!s.resident[i]) {
			policy_insert(p, i, key_of(BID, key++));
			s.resident[i] = true;
		}
		s.dirty[i] = true;
	}
	uint32_t v = policy_victim(p, slot_is_clean, &s);
	CHECK(v == POLICY_NO_SLOT, "all %u slots dirty: victim is NO_SLOT (got %u)", n, v);
	s.dirty[417] = false;
	v = policy_victim(p, slot_is_clean, &s);
	CHECK(v == 417, "then slot 417 cleaned: victim is 417 (got %u)", v);
	v = policy_victim(p, slot_is_clean, &s);
	CHECK(v == POLICY_NO_SLOT, "a victim leaves the policy: not chosen twice (got %u)", v);
	policy_free(p);
	free(s.resident);
	free(s.dirty);
}

/*
 * Slot numbers past 2^24 (the probation ring stores 4 bytes an entry then,
 * 3 below) and neighbours sharing a state byte: a touch of slot 2k is not
 * a hit of slot 2k+1. Probation is FIFO: victims come back in insertion
 * order, except that a slot hit while on probation moves to main and is
 * taken later, by the CLOCK hand.
 */
static bool always_ok(uint32_t slot, void *arg)
{
	return true;
}

static void test_wide_slots(void)
{
	const uint32_t n = (1u << 24) + 64;
	struct policy *p = make(n, 1, 0);
	uint32_t order[16];
	const int want[16] = { 0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 9, 11, 12, 13, 14, 15 };
	int wrong = 0;

	for (uint32_t i = 0; i < 16; i++) {
		order[i] = (1u << 24) + 40 - i * 3;   /* odd and even, all past 2^24 */
		policy_insert(p, order[i], key_of(BID, i));
	}
	policy_touch(p, order[5] ^ 1);   /* its byte's other slot, not resident */
	policy_touch(p, order[9]);
	for (int i = 0; i < 16; i++) {
		uint32_t v = policy_victim(p, always_ok, NULL);
		if (v != order[want[i]]) {
			printf("  victim %d: slot %u, wanted %u\n", i, v, order[want[i]]);
			wrong++;
		}
	}
	CHECK(wrong == 0 && policy_victim(p, always_ok, NULL) == POLICY_NO_SLOT,
	      "%u slots: victims past 2^24 in FIFO order, the one hit on probation from main, "
	      "its byte neighbour untouched (%d out of place)", n, wrong);
	policy_free(p);
}

/* ---- scan resistance --------------------------------------------------- */

/* The engine's miss/hit path in miniature: key -> slot, slot -> key. */
struct sim {
	struct policy *p;
	uint32_t nslots, nfree;
	uint32_t *free_slots;
	uint64_t *key_of_slot;
	int32_t *slot_of;        /* indexed by extent, -1 = not resident */
	uint64_t nextents;
	uint64_t hits, promotions;
};

static bool always_clean(uint32_t slot, void *arg)
{
	return true;
}

static void sim_init(struct sim *s, struct policy *p, uint32_t nslots, uint64_t nextents)
{
	memset(s, 0, sizeof(*s));
	s->p = p;
	s->nslots = s->nfree = nslots;
	s->free_slots = malloc(nslots * sizeof(uint32_t));
	s->key_of_slot = malloc(nslots * sizeof(uint64_t));
	s->slot_of = malloc(nextents * sizeof(int32_t));
	s->nextents = nextents;
	for (uint32_t i = 0; i < nslots; i++)
		s->free_slots[i] = nslots - 1 - i;
	for (uint64_t e = 0; e < nextents; e++)
		s->slot_of[e] = -1;
}

static void sim_free(struct sim *s)
{
	free(s->free_slots);
	free(s->key_of_slot);
	free(s->slot_of);
}

static void sim_access(struct sim *s, uint64_t extent, uint64_t off_in_extent, uint32_t len)
{
	if (s->slot_of[extent] >= 0) {
		s->hits++;
		policy_touch(s->p, (uint32_t)s->slot_of[extent]);
		return;
	}
	if (!policy_admit(s->p, key_of(BID, extent), BID, extent * EXTENT + off_in_extent, len,
			  false))
		return;
	uint32_t slot;
	if (s->nfree) {
		slot = s->free_slots[--s->nfree];
	} else {
		slot = policy_victim(s->p, always_clean, NULL);
		if (slot == POLICY_NO_SLOT)
			return;
		s->slot_of[s->key_of_slot[slot]] = -1;
	}
	s->key_of_slot[slot] = extent;
	s->slot_of[extent] = (int32_t)slot;
	policy_insert(s->p, slot, key_of(BID, extent));
	s->promotions++;
}

static int hot_resident(const struct sim *s, uint64_t nhot)
{
	int n = 0;

	for (uint64_t e = 0; e < nhot; e++)
		n += s->slot_of[e * 97] >= 0;
	return n;
}

static void scan_case(uint32_t admit_hits, uint64_t cutoff, bool hot_during_scan,
		      const char *what)
{
	const uint32_t nslots = 1000;
	const uint64_t nhot = 600, nscan = 50000;
	struct sim s;
	uint64_t rng = 11;

	sim_init(&s, make(nslots, admit_hits, cutoff), nslots, 200 * 1000);
	/* Warm: the hot set (extents 0, 97, 194, ...) read at random. */
	for (int i = 0; i < 30000; i++)
		sim_access(&s, (rng_next(&rng) % nhot) * 97, 8 * KiB, 4 * KiB);
	int before = hot_resident(&s, nhot);
	/* One long sequential scan of cold extents, 50 x the cache, in
	 * 256 KiB reads; the hot set keeps being read at 1 per 10. */
	uint64_t promotions_before = s.promotions;
	for (uint64_t i = 0; i < nscan; i++) {
		sim_access(&s, 100000 + i, 0, EXTENT);
		if (hot_during_scan && i % 10 == 0)
			sim_access(&s, (rng_next(&rng) % nhot) * 97, 8 * KiB, 4 * KiB);
	}
	int after = hot_resident(&s, nhot);
	CHECK(before == (int)nhot && after >= (int)(nhot * 95 / 100),
	      "%s: hot set of %llu in a %u-slot cache survives a %llu-extent scan "
	      "(%d resident before, %d after, %llu scan promotions)",
	      what, (unsigned long long)nhot, nslots, (unsigned long long)nscan, before, after,
	      (unsigned long long)(s.promotions - promotions_before));
	policy_free(s.p);
	sim_free(&s);
}

static void test_scan_resistance(void)
{
	/* Eviction alone: no threshold, no sequential bypass. */
	scan_case(1, 0, true, "eviction alone (admit_hits=1, no cutoff), hot set still read");
	scan_case(1, 0, false, "eviction alone (admit_hits=1, no cutoff), hot set idle");
	/* Admission alone would do it too; all three together are the default. */
	scan_case(2, 0, false, "threshold admission (admit_hits=2, no cutoff)");
	scan_case(2, 4 * MiB, false, "admit_hits=2 with 4 MiB cutoff");

	/* A random-order one-touch scan (no sequential pattern to catch):
	 * the threshold must keep almost all of it out. */
	struct policy *p = make(4096, 2, 4 * MiB);
	uint64_t rng = 5;
	int admitted = 0;
	for (uint64_t i = 0; i < 100000; i++)
		admitted += miss(p, rng_next(&rng) % (1ull << 30), &rng);
	CHECK(admitted < 100000 * 8 / 100, "admit_hits=2: of 100000 one-touch random extents "
	      "%d (%.2f%%) admitted by doorkeeper collisions (limit 8%%)", admitted,
	      admitted / 1000.0);
	policy_free(p);
}

/* ---- concurrency ------------------------------------------------------- */

#define CONC_SLOTS 4096

struct conc {
	struct policy *p;
	pthread_mutex_t lock;
	_Atomic int stop;
	long bad_victims, victims, no_slot;
	unsigned seed;
};

static bool conc_is_clean(uint32_t slot, void *arg)
{
	return slot % 7 != 0;   /* every 7th slot stays dirty */
}

static void *toucher(void *arg)
{
	struct conc *c = arg;
	uint64_t rng = 0x1234 + (uint64_t)__atomic_fetch_add(&c->seed, 1, __ATOMIC_RELAXED);
	long n = 0;

	while (!atomic_load(&c->stop) || n < 100000) {
		uint64_t r = rng_next(&rng);
		policy_touch(c->p, (uint32_t)(r % CONC_SLOTS));
		if (r % 16 == 0) {
			uint64_t e = (r >> 20) % 100000;
			(void)policy_admit(c->p, key_of(BID, e), BID, e * EXTENT, 4 * KiB, false);
		}
		n++;
	}
	return NULL;
}

static void *evictor(void *arg)
{
	struct conc *c = arg;
	uint64_t key = 1000000, rng = 99;

	for (int i = 0; i < 200000; i++) {
		pthread_mutex_lock(&c->lock);
		uint32_t v = policy_victim(c->p, conc_is_clean, NULL);
		if (v == POLICY_NO_SLOT) {
			c->no_slot++;
		} else {
			c->victims++;
			if (!conc_is_clean(v, NULL))
				c->bad_victims++;
			policy_insert(c->p, v, key_of(BID, key++));
		}
		if (rng_next(&rng) % 64 == 0) {       /* a discard and a refill */
			uint32_t s = (uint32_t)(rng_next(&rng) % CONC_SLOTS);
			policy_remove(c->p, s);
			policy_insert(c->p, s, key_of(BID, key++));
		}
		pthread_mutex_unlock(&c->lock);
	}
	atomic_store(&c->stop, 1);
	return NULL;
}

static void test_concurrent(void)
{
	struct conc c = { .p = make(CONC_SLOTS, 2, 4 * MiB) };
	pthread_t t[3];

	pthread_mutex_init(&c.lock, NULL);
	for (uint32_t i = 0; i < CONC_SLOTS; i++)
		policy_insert(c.p, i, key_of(BID, i));
	pthread_create(&t[0], NULL, toucher, &c);
	pthread_create(&t[1], NULL, toucher, &c);
	pthread_create(&t[2], NULL, evictor, &c);
	for (int i = 0; i < 3; i++)
		pthread_join(t[i], NULL);

	struct policy_stats st;
	pthread_mutex_lock(&c.lock);
	policy_get_stats(c.p, &st);
	pthread_mutex_unlock(&c.lock);
	CHECK(c.victims == 200000 && c.bad_victims == 0 && c.no_slot == 0,
	      "2 threads touching + admitting while a 3rd evicts: %ld victims, %ld dirty, "
	      "%ld NO_SLOT", c.victims, c.bad_victims, c.no_slot);
	CHECK(st.resident == CONC_SLOTS, "afterwards every slot is resident exactly once "
	      "(resident = %u of %u)", st.resident, CONC_SLOTS);
	pthread_mutex_destroy(&c.lock);
	policy_free(c.p);
}

/* ---- memory ------------------------------------------------------------ */

static void test_memory(void)
{
	struct policy *p = make(4096, 2, 4 * MiB);        /* 1 GiB of 256 KiB extents */
	uint64_t gb = policy_mem_bytes(p);
	policy_free(p);
	p = make(4096 * 1024, 2, 4 * MiB);                /* 1 TiB */
	uint64_t tb = policy_mem_bytes(p);
	policy_free(p);
	double per_slot = (double)tb / (4096.0 * 1024);

	/* 2 B sketch + 0.5 B state + 0.45 B ring: its share of the engine's
	 * 100 KB per GB (bench_cache_mem) */
	CHECK(per_slot <= 3.0, "policy RAM: %.2f bytes per slot; %.1f KB per GB at 1 GiB, "
	      "%.1f KB per GB at 1 TiB (256 KiB extents)", per_slot, gb / 1000.0,
	      tb / 1024 / 1000.0);
	CHECK(policy_new(&(struct policy_cfg){ .nslots = 0, .extent_size = EXTENT }) == NULL,
	      "nslots = 0 is refused");
}

int main(void)
{
	test_threshold();
	test_sequential();
	test_victim_clean();
	test_wide_slots();
	test_scan_resistance();
	test_concurrent();
	test_memory();
	if (check_failures) {
		printf("%d check(s) failed\n", check_failures);
		return 1;
	}
	printf("all policy checks passed\n");
	return 0;
}
