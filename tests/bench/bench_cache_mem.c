/*
 * bench_cache_mem.c - RAM per GB of cache, and what a map lookup costs.
 *
 * Builds the in-RAM structures of a full cache set (slots, RCU map, lazily
 * allocated bitmaps, free list, checkpoint bits, and the policy through its
 * public header) for 64 GiB of cache at the default 256 KiB extent and
 * at 64 KiB and 1 MiB, fills every slot, and prints bytes per GB of cache
 * with no partial extents and with 10% of extents partial (bitmaps
 * allocated). The target is <= 100 KB per GB at 256 KiB. The resident-size
 * growth of the process is printed beside it as a cross-check, and the
 * 256 KiB set's bytes per cached extent are broken down by structure.
 *
 * Then times lock-free lookups (rcu_read_lock + map_lookup + pin check of
 * the key) of random resident keys with 1 and 2 threads, and of keys that
 * are not resident (the miss path walks to an empty entry) with 1 thread;
 * each the fastest of ROUNDS rounds.
 *
 * Prints numbers; asserts nothing about speed.
 */
#include "cache/cache_int.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static long rss_kb(void)
{
	FILE *f = fopen("/proc/self/statm", "r");
	long pages = 0, res = 0;
	if (f) {
		if (fscanf(f, "%ld %ld", &pages, &res) != 2)
			res = 0;
		fclose(f);
	}
	return res * (sysconf(_SC_PAGESIZE) / 1024);
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

struct built {
	struct cache_set cs;
	uint32_t nslots;
};

static void build(struct built *b, uint64_t cache_bytes, uint32_t extent, double partial)
{
	struct cache_set *cs = &b->cs;
	memset(cs, 0, sizeof(*cs));
	uint32_t n = (uint32_t)(cache_bytes / extent);
	b->nslots = n;
	cs->lay.nslots = n;
	cs->lay.extent_size = extent;
	cs->lay.bpe = extent / CACHE_SECTOR;
	cs->slots = calloc(n, sizeof(*cs->slots));
	cs->alloc.free_bits = calloc((n + 63) / 64, sizeof(uint64_t));
	cs->ck.dirty = calloc((n + 7) / 8, 1);
	map_init(&cs->map, cs->slots, n);
	bm_init(&cs->bm, n, cs->lay.bpe);
	struct policy_cfg pc = { .nslots = n, .admit_hits = 2, .seq_cutoff = 4u << 20, .extent_size = extent };
	cs->policy = policy_new(&pc);
	uint64_t step = (uint64_t)(partial > 0 ? 1.0 / partial : 0);
	for (uint32_t s = 0; s < n; s++) {
		uint64_t key = cache_key(1, (uint64_t)s * 3 + 1);
		map_insert(&cs->map, key, s);
		atomic_store(&cs->slots[s].bits, SB_READY);
		policy_insert(cs->policy, s, key);
		if (step && s % step == 0)
			slot_apply(cs, s, JOP_DIRTY, 8, 8); /* a 4 KiB write into a fresh extent */
		else
			slot_apply(cs, s, JOP_VALID, 0, cs->lay.bpe);
	}
}

static void destroy(struct built *b)
{
	struct cache_set *cs = &b->cs;
	policy_free(cs->policy);
	bm_destroy(&cs->bm);
	map_destroy(&cs->map);
	free(cs->slots);
	free(cs->alloc.free_bits);
	free((void *)cs->ck.dirty);
}

static uint64_t engine_bytes(struct cache_set *cs)
{
	return map_mem_bytes(&cs->map) + atomic_load(&cs->bm.allocated_bytes) +
	       (uint64_t)(cs->lay.nslots + 63) / 64 * 8 + (cs->lay.nslots + 7) / 8;
}

/* Where the bytes of one cached extent go (the 256 KiB set, no partial extents). */
static void breakdown(struct cache_set *cs)
{
	double n = cs->lay.nslots, per_gb = (double)(1ull << 30) / cs->lay.extent_size;
	uint64_t slots = (uint64_t)cs->lay.nslots * sizeof(struct slot);
	struct {
		const char *what;
		double bytes;
	} part[] = {
		{ "slot array (struct slot: key, bits, users)", (double)slots },
		{ "map table (32-bit entries: slot + fingerprint)", (double)(map_mem_bytes(&cs->map) - slots) },
		{ "bitmap chunk index (+ chunks allocated)", (double)atomic_load(&cs->bm.allocated_bytes) },
		{ "free list (1 bit)", (double)((cs->lay.nslots + 63) / 64 * 8) },
		{ "checkpoint dirty bits (1 bit)", (double)((cs->lay.nslots + 7) / 8) },
		{ "policy (state nibble, probation ring, sketch)", (double)policy_mem_bytes(cs->policy) },
	};
	double total = 0;
	printf("256K, no partial extents: bytes per cached extent (%u extents)\n", cs->lay.nslots);
	for (size_t i = 0; i < sizeof(part) / sizeof(part[0]); i++) {
		printf("  %-48s %6.3f B  %6.1f KB/GB\n", part[i].what, part[i].bytes / n,
		       part[i].bytes / n * per_gb / 1000);
		total += part[i].bytes;
	}
	printf("  %-48s %6.3f B  %6.1f KB/GB\n\n", "total", total / n, total / n * per_gb / 1000);
}

/* Lookups are timed in rounds and the fastest round is kept: on a shared
 * machine, other processes only ever make a round slower. */
#define ROUNDS 5
#define ITERS 4000000

struct lk {
	struct cache_set *cs;
	uint32_t n;
	long iters;
	double secs;
	uint64_t seed;
	bool miss;   /* look up keys that are not resident */
};

static void *lookup_thread(void *arg)
{
	struct lk *l = arg;
	struct cache_set *cs = l->cs;
	uint64_t r = l->seed, found = 0;
	rcu_register_thread();
	double t0 = now_s();
	for (long i = 0; i < l->iters; i++) {
		r ^= r << 13;
		r ^= r >> 7;
		r ^= r << 17;
		uint64_t key = cache_key(1, (r % l->n) * 3 + 1 + l->miss);
		rcu_read_lock();
		uint32_t s = map_lookup(&cs->map, key);
		if (s != POLICY_NO_SLOT && atomic_load_explicit(&cs->slots[s].key, memory_order_acquire) == key)
			found++;
		rcu_read_unlock();
	}
	l->secs = now_s() - t0;
	rcu_unregister_thread();
	if (l->miss ? found != 0 : found != (uint64_t)l->iters)
		fprintf(stderr, "warning: %llu of %ld lookups found\n", (unsigned long long)found, l->iters);
	return NULL;
}

int main(void)
{
	const uint64_t gb = 1ull << 30, cache = 64 * gb;
	uint32_t exts[] = { 256u << 10, 64u << 10, 1u << 20 };

	printf("RAM per GB of cache (64 GiB set, every slot resident)\n");
	printf("%-8s %-12s %14s %14s %14s %14s\n", "extent", "partial", "engine B/GB", "policy B/GB",
	       "total KB/GB", "RSS KB/GB");
	for (int e = 0; e < 3; e++)
		for (int p = 0; p < 2; p++) {
			double partial = p ? 0.10 : 0.0;
			long before = rss_kb();
			struct built b;
			build(&b, cache, exts[e], partial);
			long after = rss_kb();
			uint64_t eng = engine_bytes(&b.cs), pol = policy_mem_bytes(b.cs.policy);
			printf("%-8s %-12s %14.0f %14.0f %14.1f %14.1f\n",
			       exts[e] >= (1u << 20) ? "1M" : exts[e] == (256u << 10) ? "256K" : "64K",
			       p ? "10% of slots" : "none", (double)eng / 64, (double)pol / 64,
			       (double)(eng + pol) / 64 / 1000, (double)(after - before) / 64);
			destroy(&b);
		}
	printf("(goal: <= 100 KB/GB at 256K; Synology's SSD cache needs 416 KB/GB)\n\n");

	struct built b;
	build(&b, cache, 256u << 10, 0);
	breakdown(&b.cs);
	printf("map lookup (rcu_read_lock + lookup + key check), %u resident extents, best of %d rounds\n",
	       b.nslots, ROUNDS);
	for (int threads = 1; threads <= 3; threads++) {
		bool miss = threads == 3;
		int nth = miss ? 1 : threads;
		double best = 0;
		for (int round = 0; round < ROUNDS; round++) {
			pthread_t th[2];
			struct lk l[2];
			for (int i = 0; i < nth; i++) {
				l[i] = (struct lk){ .cs = &b.cs, .n = b.nslots, .iters = ITERS, .miss = miss,
						    .seed = 88172645463325252ull + (uint64_t)(i + 2 * round) };
				pthread_create(&th[i], NULL, lookup_thread, &l[i]);
			}
			double worst = 0;
			for (int i = 0; i < nth; i++) {
				pthread_join(th[i], NULL);
				if (l[i].secs > worst)
					worst = l[i].secs;
			}
			if (round == 0 || worst < best)
				best = worst;
		}
		if (miss)
			printf("  absent keys, 1 thread: %.1f ns per lookup\n", best * 1e9 / ITERS);
		else
			printf("  %d thread(s): %.1f ns per lookup per thread, %.1f M lookups/s in total\n",
			       nth, best * 1e9 / ITERS, nth * ITERS / best / 1e6);
	}
	destroy(&b);
	rcu_barrier();
	return 0;
}
