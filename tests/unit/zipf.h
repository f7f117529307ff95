/*
 * zipf.h - the seeded generator and Zipf sampler the policy replay
 * (tests/bench/bench_policy_replay.c) and the advisor's check
 * (tests/unit/test_advisor.c) build their traces with.
 *
 * splitmix64 steps a 64-bit state; zipf_next draws a rank with
 * P(rank r) proportional to 1 / r^s by a binary search of the CDF, and
 * maps it through a seeded shuffle, so hot extents are scattered over the
 * LUN rather than adjacent (adjacent ones would look like a stream).
 * Single-threaded; the same seed gives the same trace.
 */
#ifndef TC_TESTS_ZIPF_H
#define TC_TESTS_ZIPF_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static inline uint64_t splitmix(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static inline double uniform01(uint64_t *s)
{
	return (double)(splitmix(s) >> 11) * (1.0 / 9007199254740992.0);
}

/* Fisher-Yates with the seeded generator. */
static inline void shuffle32(uint32_t *a, uint32_t n, uint64_t *rng)
{
	for (uint32_t i = n - 1; i > 0 && n; i--) {
		uint32_t j = (uint32_t)(splitmix(rng) % (i + 1)), x = a[i];
		a[i] = a[j];
		a[j] = x;
	}
}

struct zipf {
	double *cdf;
	uint32_t *rank_to_ext;
	uint32_t n;
};

static inline void zipf_init(struct zipf *z, uint32_t n, double s, uint64_t *rng)
{
	double sum = 0;

	z->n = n;
	z->cdf = malloc(n * sizeof(double));
	z->rank_to_ext = malloc(n * sizeof(uint32_t));
	if (!z->cdf || !z->rank_to_ext) {
		fprintf(stderr, "zipf: out of memory\n");
		exit(2);
	}
	for (uint32_t i = 0; i < n; i++) {
		sum += 1.0 / pow(i + 1.0, s);
		z->cdf[i] = sum;
		z->rank_to_ext[i] = i;
	}
	for (uint32_t i = 0; i < n; i++)
		z->cdf[i] /= sum;
	shuffle32(z->rank_to_ext, n, rng);
}

static inline uint32_t zipf_next(const struct zipf *z, uint64_t *rng)
{
	double u = uniform01(rng);
	uint32_t lo = 0, hi = z->n - 1;

	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;
		if (z->cdf[mid] < u)
			lo = mid + 1;
		else
			hi = mid;
	}
	return z->rank_to_ext[lo];
}

static inline void zipf_free(struct zipf *z)
{
	free(z->cdf);
	free(z->rank_to_ext);
}

#endif
