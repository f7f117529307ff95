/*
 * tierbench_hist.c - the latency histogram (log-linear, HDR style).
 *
 * Percentiles come from counting every command into a bucket whose width is
 * under 1/128 of its value, so p99.9 of a million commands is as precise as
 * p50 and costs the same few instructions per command. Mean and standard
 * deviation are kept exactly from sums beside the buckets.
 */
#include "tools/tierbench.h"

#include <math.h>
#include <string.h>

#define TOP_VALUE ((UINT64_C(2) << (TB_HIST_MAX_SHIFT + TB_HIST_SUB_BITS)) - 1)

static unsigned bucket_of(uint64_t v)
{
	if (v < 2 * TB_HIST_SUB)
		return (unsigned)v;
	if (v > TOP_VALUE)
		v = TOP_VALUE;
	unsigned shift = (unsigned)(63 - __builtin_clzll(v)) - TB_HIST_SUB_BITS;
	return (shift + 1) * TB_HIST_SUB + (unsigned)((v >> shift) - TB_HIST_SUB);
}

/* Highest value that lands in bucket idx. */
static uint64_t bucket_top(unsigned idx)
{
	if (idx < 2 * TB_HIST_SUB)
		return idx;
	unsigned shift = idx / TB_HIST_SUB - 1;
	uint64_t low = (uint64_t)(idx % TB_HIST_SUB + TB_HIST_SUB) << shift;
	return low + (UINT64_C(1) << shift) - 1;
}

void tb_hist_reset(struct tb_hist *h)
{
	memset(h, 0, sizeof(*h));
	h->min_ns = UINT64_MAX;
}

void tb_hist_add(struct tb_hist *h, uint64_t ns)
{
	h->count++;
	h->bucket[bucket_of(ns)]++;
	if (ns < h->min_ns)
		h->min_ns = ns;
	if (ns > h->max_ns)
		h->max_ns = ns;
	double d = (double)ns;
	h->sum_ns += d;
	h->sumsq_ns += d * d;
}

void tb_hist_merge(struct tb_hist *dst, const struct tb_hist *src)
{
	if (!src->count)
		return;
	for (unsigned i = 0; i < TB_HIST_BUCKETS; i++)
		dst->bucket[i] += src->bucket[i];
	dst->count += src->count;
	dst->sum_ns += src->sum_ns;
	dst->sumsq_ns += src->sumsq_ns;
	if (src->min_ns < dst->min_ns)
		dst->min_ns = src->min_ns;
	if (src->max_ns > dst->max_ns)
		dst->max_ns = src->max_ns;
}

uint64_t tb_hist_quantile(const struct tb_hist *h, double q)
{
	if (!h->count)
		return 0;
	/* the rank of the command at quantile q, counted from 1 */
	uint64_t rank = (uint64_t)ceil(q * (double)h->count);
	if (rank < 1)
		rank = 1;
	uint64_t seen = 0;
	for (unsigned i = 0; i < TB_HIST_BUCKETS; i++) {
		seen += h->bucket[i];
		if (seen >= rank) {
			uint64_t v = bucket_top(i);
			if (v > h->max_ns)
				v = h->max_ns;
			if (v < h->min_ns)
				v = h->min_ns;
			return v;
		}
	}
	return h->max_ns;
}

double tb_hist_mean(const struct tb_hist *h)
{
	return h->count ? h->sum_ns / (double)h->count : 0.0;
}

double tb_hist_stddev(const struct tb_hist *h)
{
	if (h->count < 2)
		return 0.0;
	double n = (double)h->count, mean = h->sum_ns / n;
	double var = h->sumsq_ns / n - mean * mean;
	return var > 0 ? sqrt(var) : 0.0;
}
