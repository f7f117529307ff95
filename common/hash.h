/*
 * hash.h - the one 64-bit mixing function.
 *
 * hash_mix64 is a finalizer with the murmur3 / splitmix constants: every
 * input bit affects every output bit. The slot map (cache/map.c) takes its
 * home entry and fingerprint from it; the admission sketch and stream
 * table (cache/policy.c) take their counters and buckets from it.
 *
 * Threading: pure function, any thread.
 */
#ifndef TC_COMMON_HASH_H
#define TC_COMMON_HASH_H

#include <stdint.h>

static inline uint64_t hash_mix64(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdULL;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ULL;
	x ^= x >> 33;
	return x;
}

#endif
