/*
 * bench_policy_replay.c - hit ratio of the real admission/eviction code
 * (cache/policy.c) on synthetic traces, beside plain LRU and Belady's OPT.
 * (The sizing advisor's check against this replay, at six sizes, is
 * tests/unit/test_advisor.c.)
 *
 * Each trace is a seeded, deterministic list of requests (backing extent,
 * offset inside it, length). The tiercache column drives policy_admit,
 * policy_touch, policy_victim and policy_insert exactly as the engine does:
 * a resident extent is a hit and is touched; a miss asks policy_admit, and
 * an admitted extent takes a free slot or a victim's. LRU admits every miss
 * and evicts the least recently used extent. OPT is Belady's MIN computed
 * offline from the same trace with the same number of slots, allowed to
 * bypass (not cache) a miss: the best any policy could do.
 *
 * Workloads (N = 200k extents of 256 KiB in the Zipf region):
 *   zipf        Zipf(0.9) over N, 4 KiB reads at random offsets.
 *   zipf+scans  the same, plus a sequential scan (256 KiB reads) of N/8
 *               contiguous extents after every 100k requests: a backup
 *               running beside the hot working set.
 *   loop-mix    60% Zipf(0.9), 25% a loop over 20k extents in a fixed
 *               random order (not sequential, so no cutoff catches it),
 *               15% one-touch random extents never seen again.
 * Cache sizes are 1%, 5% and 10% of each trace's footprint (distinct
 * extents). Prints hit ratios, promotions (NVMe fills) per 100 requests,
 * and the policy's RAM per slot.
 *
 * Usage: bench_policy_replay [requests per trace, default 4000000]
 * Exit status 1 only if the policy does not beat LRU on zipf+scans (the
 * claim this benchmark exists to show); nothing is asserted about speed.
 */
#include "cache/policy.h"
#include "tests/unit/zipf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXTENT      (256u * 1024)
#define BID         1u
#define ZIPF_N      200000u
#define ZIPF_S      0.9
#define NEVER       UINT32_MAX

struct req {
	uint32_t ext;
	uint32_t off;     /* byte offset inside the extent */
	uint32_t len;
};

struct trace {
	const char *name;
	struct req *r;
	size_t n, cap;
	uint32_t universe;    /* extent ids are < universe */
	uint32_t footprint;   /* distinct extents */
};

static void push(struct trace *t, uint32_t ext, uint32_t off, uint32_t len)
{
	if (t->n == t->cap) {
		t->cap = t->cap ? t->cap * 2 : 1 << 20;
		t->r = realloc(t->r, t->cap * sizeof(*t->r));
	}
	t->r[t->n++] = (struct req){ ext, off, len };
	if (ext >= t->universe)
		t->universe = ext + 1;
}

static void push_small_read(struct trace *t, uint32_t ext, uint64_t *rng)
{
	push(t, ext, (uint32_t)(splitmix(rng) % (EXTENT / 4096)) * 4096, 4096);
}

enum workload { WL_ZIPF, WL_ZIPF_SCANS, WL_LOOP_MIX, WL_COUNT };
static const char *const wl_names[WL_COUNT] = { "zipf", "zipf+scans", "loop-mix" };

static void trace_make(struct trace *t, enum workload w, size_t nreq)
{
	uint64_t rng = 0x7ce5eed0 + (uint64_t)w;
	struct zipf z;

	memset(t, 0, sizeof(*t));
	t->name = wl_names[w];
	zipf_init(&z, ZIPF_N, ZIPF_S, &rng);

	const uint32_t loop_len = 20000, loop_base = ZIPF_N;
	uint32_t *loop = malloc(loop_len * sizeof(uint32_t));
	for (uint32_t i = 0; i < loop_len; i++)
		loop[i] = loop_base + i;
	shuffle32(loop, loop_len, &rng);
	uint32_t loop_pos = 0, one_touch = loop_base + loop_len;

	while (t->n < nreq) {
		if (w == WL_ZIPF_SCANS && t->n % 100000 == 99999) {
			uint32_t start = (uint32_t)(splitmix(&rng) % ZIPF_N);
			for (uint32_t i = 0; i < ZIPF_N / 8 && t->n < nreq; i++)
				push(t, (start + i) % ZIPF_N, 0, EXTENT);
			continue;
		}
		if (w == WL_LOOP_MIX) {
			uint64_t d = splitmix(&rng) % 100;
			if (d >= 85) {
				push_small_read(t, one_touch++, &rng);
				continue;
			}
			if (d >= 60) {
				push_small_read(t, loop[loop_pos++ % loop_len], &rng);
				continue;
			}
		}
		push_small_read(t, zipf_next(&z, &rng), &rng);
	}
	free(loop);
	zipf_free(&z);

	uint8_t *seen = calloc(t->universe, 1);
	for (size_t i = 0; i < t->n; i++) {
		t->footprint += !seen[t->r[i].ext];
		seen[t->r[i].ext] = 1;
	}
	free(seen);
}

/* ---- tiercache: the real policy, driven like the engine --------------- */

struct run {
	uint64_t hits, fills;
};

static bool always_clean(uint32_t slot, void *arg)
{
	return true;
}

static uint64_t key_of(uint32_t ext)
{
	return ((uint64_t)BID << 40) | ext;
}

static struct run run_policy(const struct trace *t, uint32_t nslots, uint32_t admit_hits,
			     uint64_t *mem)
{
	struct policy_cfg cfg = {
		.nslots = nslots,
		.admit_hits = admit_hits,
		.seq_cutoff = 4u << 20,
		.extent_size = EXTENT,
	};
	struct policy *p = policy_new(&cfg);
	int32_t *slot_of = malloc(t->universe * sizeof(int32_t));
	uint32_t *ext_of = malloc(nslots * sizeof(uint32_t));
	uint32_t used = 0;
	struct run res = { 0, 0 };

	for (uint32_t e = 0; e < t->universe; e++)
		slot_of[e] = -1;
	for (size_t i = 0; i < t->n; i++) {
		const struct req *r = &t->r[i];
		struct policy_run run;
		uint64_t off = (uint64_t)r->ext * EXTENT + r->off;
		/* every request is a step of its stream, hit or miss (as
		 * cache/volume.c records each piece) */
		policy_stream(p, BID, off, r->len, &run);
		if (slot_of[r->ext] >= 0) {
			res.hits++;
			policy_touch(p, (uint32_t)slot_of[r->ext]);
			continue;
		}
		if (!policy_admit_run(p, key_of(r->ext), off, &run, false))
			continue;
		uint32_t slot;
		if (used < nslots) {
			slot = used++;
		} else {
			slot = policy_victim(p, always_clean, NULL);
			if (slot == POLICY_NO_SLOT)
				continue;
			slot_of[ext_of[slot]] = -1;
		}
		ext_of[slot] = r->ext;
		slot_of[r->ext] = (int32_t)slot;
		policy_insert(p, slot, key_of(r->ext));
		res.fills++;
	}
	*mem = policy_mem_bytes(p);
	policy_free(p);
	free(slot_of);
	free(ext_of);
	return res;
}

/* ---- plain LRU --------------------------------------------------------- */

static struct run run_lru(const struct trace *t, uint32_t nslots)
{
	int32_t *slot_of = malloc(t->universe * sizeof(int32_t));
	uint32_t *ext_of = malloc(nslots * sizeof(uint32_t));
	uint32_t *prev = malloc(nslots * sizeof(uint32_t)), *next = malloc(nslots * sizeof(uint32_t));
	uint32_t head = NEVER, tail = NEVER, used = 0;   /* head = most recent */
	struct run res = { 0, 0 };

	for (uint32_t e = 0; e < t->universe; e++)
		slot_of[e] = -1;
	for (size_t i = 0; i < t->n; i++) {
		uint32_t e = t->r[i].ext, s;
		if (slot_of[e] >= 0) {
			res.hits++;
			s = (uint32_t)slot_of[e];
			if (s == head)
				continue;
			next[prev[s]] = next[s];          /* unlink */
			if (next[s] != NEVER)
				prev[next[s]] = prev[s];
			else
				tail = prev[s];
		} else {
			res.fills++;
			if (used < nslots) {
				s = used++;
			} else {
				s = tail;
				tail = prev[s];
				if (tail != NEVER)
					next[tail] = NEVER;
				else
					head = NEVER;
				slot_of[ext_of[s]] = -1;
			}
			ext_of[s] = e;
			slot_of[e] = (int32_t)s;
		}
		prev[s] = NEVER;                          /* link at head */
		next[s] = head;
		if (head != NEVER)
			prev[head] = s;
		head = s;
		if (tail == NEVER)
			tail = s;
	}
	free(slot_of);
	free(ext_of);
	free(prev);
	free(next);
	return res;
}

/* ---- Belady's OPT (MIN with bypass) ------------------------------------ */

struct heap_ent {
	uint32_t next_use;
	uint32_t ext;
};

struct heap {
	struct heap_ent *a;
	size_t n, cap;
};

static void heap_push(struct heap *h, struct heap_ent x)
{
	if (h->n == h->cap) {
		h->cap = h->cap ? h->cap * 2 : 1024;
		h->a = realloc(h->a, h->cap * sizeof(*h->a));
	}
	size_t i = h->n++;
	while (i > 0 && h->a[(i - 1) / 2].next_use < x.next_use) {
		h->a[i] = h->a[(i - 1) / 2];
		i = (i - 1) / 2;
	}
	h->a[i] = x;
}

static void heap_pop(struct heap *h)
{
	struct heap_ent x = h->a[--h->n];
	size_t i = 0;

	for (;;) {
		size_t c = 2 * i + 1;
		if (c >= h->n)
			break;
		if (c + 1 < h->n && h->a[c + 1].next_use > h->a[c].next_use)
			c++;
		if (h->a[c].next_use <= x.next_use)
			break;
		h->a[i] = h->a[c];
		i = c;
	}
	if (h->n)
		h->a[i] = x;
}

/* next[i] = index of the next request for the same extent, NEVER if none. */
static uint32_t *next_uses(const struct trace *t)
{
	uint32_t *next = malloc(t->n * sizeof(uint32_t));
	uint32_t *last = malloc(t->universe * sizeof(uint32_t));

	for (uint32_t e = 0; e < t->universe; e++)
		last[e] = NEVER;
	for (size_t i = t->n; i-- > 0;) {
		next[i] = last[t->r[i].ext];
		last[t->r[i].ext] = (uint32_t)i;
	}
	free(last);
	return next;
}

static struct run run_opt(const struct trace *t, const uint32_t *next, uint32_t nslots)
{
	/* cur[e]: the next use of resident extent e; NEVER - 1 marks "not
	 * resident" (NEVER itself is a valid next use: never again). */
	const uint32_t absent = NEVER - 1;
	uint32_t *cur = malloc(t->universe * sizeof(uint32_t));
	struct heap h = { 0 };
	uint32_t used = 0;
	struct run res = { 0, 0 };

	for (uint32_t e = 0; e < t->universe; e++)
		cur[e] = absent;
	for (size_t i = 0; i < t->n; i++) {
		uint32_t e = t->r[i].ext, nu = next[i];
		if (cur[e] != absent) {
			res.hits++;
		} else {
			if (nu == NEVER)
				continue;                         /* bypass */
			if (used == nslots) {
				while (cur[h.a[0].ext] != h.a[0].next_use)
					heap_pop(&h);             /* stale entry */
				if (h.a[0].next_use < nu)
					continue;                 /* bypass */
				cur[h.a[0].ext] = absent;
				heap_pop(&h);
			} else {
				used++;
			}
			res.fills++;
		}
		cur[e] = nu;
		heap_push(&h, (struct heap_ent){ nu, e });
		if (h.n > 8 * (size_t)nslots + 4096) {            /* drop stale entries */
			size_t k = 0;
			for (size_t j = 0; j < h.n; j++)
				if (cur[h.a[j].ext] == h.a[j].next_use)
					h.a[k++] = h.a[j];
			struct heap_ent *old = h.a;
			size_t n = k;
			h.a = NULL;
			h.n = h.cap = 0;
			for (size_t j = 0; j < n; j++)
				heap_push(&h, old[j]);
			free(old);
		}
	}
	free(cur);
	free(h.a);
	return res;
}

/* ---- report ------------------------------------------------------------ */

static double pct(uint64_t x, size_t n)
{
	return 100.0 * (double)x / (double)n;
}

int main(int argc, char **argv)
{
	size_t nreq = argc > 1 ? strtoul(argv[1], NULL, 10) : 4000000;
	static const double sizes[] = { 0.01, 0.05, 0.10 };
	static const uint32_t nhits[] = { 1, 2, 3 };
	bool claim_holds = true;
	char verdict[3][200] = { "", "", "" };
	struct timespec t0, t1;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	printf("policy replay: %zu requests per trace, 256 KiB extents, seq_cutoff 4 MiB, "
	       "Zipf s=%.1f over %u extents\n", nreq, ZIPF_S, ZIPF_N);
	printf("hit ratio %% (promotions per 100 requests); tc nhit=K = cache/policy.c with "
	       "admit_hits K\n\n");
	printf("%-11s %5s %7s | %13s %13s %13s %13s | %6s | %7s %7s\n", "workload", "cache",
	       "slots", "LRU", "tc nhit=1", "tc nhit=2", "tc nhit=3", "OPT", "tc2/LRU", "tc2/OPT");

	for (int w = 0; w < WL_COUNT; w++) {
		struct trace t;
		trace_make(&t, (enum workload)w, nreq);
		uint32_t *next = next_uses(&t);

		for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
			uint32_t nslots = (uint32_t)(t.footprint * sizes[si]);
			struct run lru = run_lru(&t, nslots);
			struct run opt = run_opt(&t, next, nslots);
			struct run tc[3];
			uint64_t mem = 0;

			for (int k = 0; k < 3; k++)
				tc[k] = run_policy(&t, nslots, nhits[k], &mem);
			printf("%-11s %4.0f%% %7u | %5.1f (%5.1f) %5.1f (%5.1f) %5.1f (%5.1f) "
			       "%5.1f (%5.1f) | %6.1f | %7.2f %7.2f\n",
			       t.name, sizes[si] * 100, nslots, pct(lru.hits, t.n), pct(lru.fills, t.n),
			       pct(tc[0].hits, t.n), pct(tc[0].fills, t.n), pct(tc[1].hits, t.n),
			       pct(tc[1].fills, t.n), pct(tc[2].hits, t.n), pct(tc[2].fills, t.n),
			       pct(opt.hits, t.n), (double)tc[1].hits / (double)(lru.hits ? lru.hits : 1),
			       (double)tc[1].hits / (double)(opt.hits ? opt.hits : 1));
			if (w == WL_ZIPF_SCANS) {
				if (tc[1].hits <= lru.hits)
					claim_holds = false;
				snprintf(verdict[si], sizeof(verdict[si]),
					 "  cache %2.0f%%: tiercache %.1f%% vs LRU %.1f%% "
					 "(%+.1f points, x%.2f), OPT %.1f%%; promotions per 100 "
					 "requests %.1f vs %.1f", sizes[si] * 100,
					 pct(tc[1].hits, t.n), pct(lru.hits, t.n),
					 pct(tc[1].hits, t.n) - pct(lru.hits, t.n),
					 (double)tc[1].hits / (double)(lru.hits ? lru.hits : 1),
					 pct(opt.hits, t.n), pct(tc[1].fills, t.n),
					 pct(lru.fills, t.n));
			}
		}
		printf("%-11s footprint %u extents\n", "", t.footprint);
		free(next);
		free(t.r);
	}

	struct policy_cfg one_gb = { .nslots = 4096, .admit_hits = 2, .seq_cutoff = 4u << 20,
				     .extent_size = EXTENT };
	struct policy_cfg one_tb = one_gb;
	one_tb.nslots = 4096u * 1024;
	struct policy *p = policy_new(&one_gb);
	uint64_t gb = policy_mem_bytes(p);
	policy_free(p);
	p = policy_new(&one_tb);
	uint64_t tb = policy_mem_bytes(p);
	policy_free(p);
	printf("\npolicy RAM: %.2f bytes per slot (1 TiB cache); %.1f KB per GB of cache at "
	       "1 GiB, %.1f KB per GB at 1 TiB (256 KiB extents, 4096 slots per GB)\n",
	       (double)tb / one_tb.nslots, gb / 1000.0, tb / 1024 / 1000.0);

	clock_gettime(CLOCK_MONOTONIC, &t1);
	printf("\nZipf(0.9) + periodic scans, tiercache (admit_hits=2) against plain LRU:\n");
	for (int i = 0; i < 3; i++)
		printf("%s\n", verdict[i]);
	printf("=> tiercache %s LRU at every cache size\n",
	       claim_holds ? "beats" : "does NOT beat");
	printf("elapsed %.1f s\n", (double)(t1.tv_sec - t0.tv_sec) +
	       (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
	return claim_holds ? 0 : 1;
}
