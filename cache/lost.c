/*
 * lost.c - lost ranges: where acknowledged data could not be kept (every
 * leg failed under dirty blocks), per LUN, merged and capped, so status
 * and the host's reads can say so instead of returning stale data.
 *
 * Threading: any thread (lost_lock).
 */
#include "cache/cache_int.h"

#include <stdio.h>
#include <string.h>

/* ---- lost ranges ------------------------------------------------------------------------------ */

/*
 * Add [lo, hi) of backing bid to the sorted list, merging every entry it
 * overlaps or touches; a range that would need a new entry in a full list
 * is counted in lost_dropped. Caller holds lost_lock.
 */
static void lost_add(struct cache_set *cs, uint32_t bid, const char *lun, uint64_t lo, uint64_t hi)
{
	struct lost_range *l = cs->lost.r;
	int n = cs->lost.n, i = 0;

	while (i < n && (l[i].bid < bid || (l[i].bid == bid && l[i].hi < lo)))
		i++;
	int j = i;
	while (j < n && l[j].bid == bid && l[j].lo <= hi) {
		if (l[j].lo < lo)
			lo = l[j].lo;
		if (l[j].hi > hi)
			hi = l[j].hi;
		j++;
	}
	if (j == i) {
		if (n == CACHE_LOST_MAX) {
			cs->lost.dropped++;
			return;
		}
		memmove(&l[i + 1], &l[i], (size_t)(n - i) * sizeof(l[0]));
		cs->lost.n = n + 1;
	} else {
		memmove(&l[i + 1], &l[j], (size_t)(n - j) * sizeof(l[0]));
		cs->lost.n = n - (j - i) + 1;
	}
	l[i].bid = bid;
	snprintf(l[i].lun, sizeof(l[i].lun), "%s", lun);
	l[i].lo = lo;
	l[i].hi = hi;
}

/* Any worker thread (see cache_int.h); takes lost_lock per dirty run. */
void cache_lost_note(struct cache_set *cs, uint32_t bid, uint32_t s, uint64_t off, uint32_t first,
		     uint32_t count)
{
	char lun[64] = ""; /* as the lost range keeps it */
	rcu_read_lock(); /* a worker: vol_close waits a grace period before it frees the volume */
	struct cache_vol *v = bid < CACHE_SET_MAX_VOLS ? cache_vol_of(cs, bid) : NULL;
	if (v)
		snprintf(lun, sizeof(lun), "%.63s", cache_vol_name(v));
	rcu_read_unlock();
	uint32_t end = first + count;

	for (uint32_t b = first; b < end;) {
		if (!slot_any_dirty(cs, s, b, 1)) {
			b++;
			continue;
		}
		uint32_t e = b + 1;
		while (e < end && slot_any_dirty(cs, s, e, 1))
			e++;
		pthread_mutex_lock(&cs->lost.lock);
		lost_add(cs, bid, lun, off + (uint64_t)(b - first) * CACHE_SECTOR,
			 off + (uint64_t)(e - first) * CACHE_SECTOR);
		pthread_mutex_unlock(&cs->lost.lock);
		b = e;
	}
}
