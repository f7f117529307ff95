/*
 * set_status.c - a set's status and memory use, for tierctl and metrics.
 *
 * Threading: any thread; counters are read without stopping I/O.
 */
#include "cache/cache_int.h"
#include "cache/status.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

/* ---- status ------------------------------------------------------------------------------- */

uint64_t cache_set_mem_bytes(const struct cache_set *cs)
{
	/* the map counts the slots; here the allocator's free, retire and grace bits, the checkpoint's marks */
	uint64_t per_slot = 3 * ((uint64_t)(cs->lay.nslots + 63) / 64 * 8) + (cs->lay.nslots + 7) / 8;
	return map_mem_bytes(&cs->map) + atomic_load(&cs->bm.allocated_bytes) + per_slot +
	       (cs->policy ? policy_mem_bytes(cs->policy) : 0);
}

int cache_set_advice(struct cache_set *cs, struct advisor_report *r, char (*names)[65], uint32_t *extent_size,
		     bool reset)
{
	if (!cs->advisor)
		return -ENOMEM;
	advisor_get(cs->advisor, r);
	if (reset)
		advisor_reset(cs->advisor);
	*extent_size = cs->lay.extent_size;
	pthread_mutex_lock(&cs->vols_lock); /* a volume closed meanwhile stays until unlock */
	for (int i = 0; i < ADVISOR_MAX_LUNS; i++) {
		struct cache_vol *v = i < CACHE_SET_MAX_VOLS ? cache_vol_of(cs, (uint32_t)i) : NULL;
		snprintf(names[i], 65, "%s", v ? cache_vol_name(v) : "");
		if (!v)
			r->lun[i].on = false;
	}
	pthread_mutex_unlock(&cs->vols_lock);
	return 0;
}

void cache_set_destage_max(struct cache_set *cs, uint64_t bps, uint32_t iops)
{
	cleaner_set_max(cs->cleaner, bps, iops);
}

void cache_set_status(struct cache_set *cs, struct cache_set_status *st)
{
	memset(st, 0, sizeof(*st));
	snprintf(st->name, sizeof(st->name), "%s", cs->name);
	st->nlegs = cs->mirror.nlegs;
	uint32_t failed = atomic_load(&cs->mirror.failed), resync = atomic_load(&cs->mirror.resyncing);
	for (int i = 0; i < st->nlegs; i++) {
		snprintf(st->legs[i].path, sizeof(st->legs[i].path), "%s", cs->legs[i]->name);
		st->legs[i].health = (failed & (1u << i)) ? LEG_FAILED
				     : (resync & (1u << i)) ? LEG_RESYNCING : LEG_HEALTHY;
		st->legs[i].errors = atomic_load(&cs->mirror.errors[i]);
		const struct bdev_io_counts *io = cs->legs[i]->io;
		if (io) {
			st->legs[i].reads = atomic_load_explicit(&io->reads, memory_order_relaxed);
			st->legs[i].writes = atomic_load_explicit(&io->writes, memory_order_relaxed);
			st->legs[i].fua_writes = atomic_load_explicit(&io->fua_writes, memory_order_relaxed);
			st->legs[i].flushes = atomic_load_explicit(&io->flushes, memory_order_relaxed);
		}
		if (resync & (1u << i)) {
			st->legs[i].resync_done = atomic_load(&cs->mirror.resync_pos) - 2 * CACHE_PAGE;
			st->legs[i].resync_total = atomic_load(&cs->mirror.resync_end) - 2 * CACHE_PAGE;
			uint64_t ms = now_ms() - atomic_load(&cs->mirror.resync_started_ms);
			uint64_t done = st->legs[i].resync_done, total = st->legs[i].resync_total;
			st->legs[i].resync_rate_bps = ms ? done * 1000 / ms : 0;
			st->legs[i].resync_eta_s = st->legs[i].resync_rate_bps
							   ? (int64_t)((total - (done < total ? done : total)) /
								       st->legs[i].resync_rate_bps)
							   : -1;
		}
	}
	st->degraded = failed || resync;
	st->extent_size = cs->lay.extent_size;
	st->nslots = cs->lay.nslots;
	st->slots_used = cs->lay.nslots - cs->alloc.nfree;
	st->dirty_bytes = atomic_load(&cs->dirty_blocks) * CACHE_SECTOR;
	st->read_hits = atomic_load(&cs->st.read_hits);
	st->read_misses = atomic_load(&cs->st.read_misses);
	st->read_partial = atomic_load(&cs->st.read_partial);
	st->write_hits = atomic_load(&cs->st.write_hits);
	st->write_misses = atomic_load(&cs->st.write_misses);
	st->write_one_trip = atomic_load(&cs->st.one_trip_writes);
	st->write_no_record = atomic_load(&cs->st.no_record_writes);
	uint64_t reads = st->read_hits + st->read_misses + st->read_partial;
	st->hit_ratio = reads ? (double)st->read_hits / (double)reads : 0.0;
	st->promotions = atomic_load(&cs->st.promotions);
	struct policy_stats ps;
	pthread_mutex_lock(&cs->alloc.lock);
	policy_get_stats(cs->policy, &ps);
	pthread_mutex_unlock(&cs->alloc.lock);
	st->admitted = ps.admitted;
	st->below_threshold = ps.below_threshold;
	st->seq_bypassed = ps.seq_bypassed;
	st->topups = atomic_load(&cs->st.topups);
	st->evictions = atomic_load(&cs->st.evictions);
	st->destaged_bytes = atomic_load(&cs->st.destaged_bytes);
	uint64_t busy;
	cleaner_stats(cs->cleaner, &st->cleaner_rate_bps, &busy);
	cleaner_get_max(cs->cleaner, &st->destage_max_bps, &st->destage_max_iops);
	cleaner_yield_stats(cs->cleaner, &st->destage_pause_us, &st->hit_quiet_us, &st->destage_pauses);
	st->lost_ios = atomic_load(&cs->st.lost_ios);
	st->leg_read_errors = atomic_load(&cs->st.read_errors);
	st->leg_timeouts = atomic_load(&cs->st.leg_timeouts);
	st->leg_repairs = atomic_load(&cs->st.repairs);
	uint64_t parked;
	uint32_t regions;
	intent_stats(cs, &st->intent_writes, &parked, &regions);
	st->block_log_writes = atomic_load(&cs->st.dlog_records);
	st->block_log_waits = atomic_load(&cs->st.dlog_waits);
	st->checkpoints = atomic_load(&cs->st.checkpoints);
	st->journal_full_waits = atomic_load(&cs->st.journal_full_waits);
	st->version = cs->version;
	st->block_log = cs->lay.dlog_pages ? 1 : 0;
	pthread_mutex_lock(&cs->sb.lock);
	for (int i = 0; i < CACHE_MAX_BACKINGS; i++)
		st->luns_known += cs->backing[i].lun[0] != 0;
	pthread_mutex_unlock(&cs->sb.lock);
	pthread_mutex_lock(&cs->lost.lock);
	for (int i = 0; i < cs->lost.n; i++) {
		memcpy(st->lost[i].lun, cs->lost.r[i].lun, sizeof(st->lost[i].lun));
		st->lost[i].offset = cs->lost.r[i].lo;
		st->lost[i].length = cs->lost.r[i].hi - cs->lost.r[i].lo;
	}
	st->nlost = cs->lost.n;
	st->lost_dropped = cs->lost.dropped;
	pthread_mutex_unlock(&cs->lost.lock);
	st->mem_bytes = cache_set_mem_bytes(cs);
	st->sector_grain_slots = atomic_load(&cs->bm.fine_slots);
	int lun_of_bid[CACHE_SET_MAX_VOLS];
	for (int i = 0; i < CACHE_SET_MAX_VOLS; i++)
		lun_of_bid[i] = -1;
	pthread_mutex_lock(&cs->vols_lock); /* a volume closed meanwhile stays until unlock */
	for (int i = 0; i < CACHE_SET_MAX_VOLS && st->nluns < 16; i++) {
		struct cache_vol *v = cache_vol_of(cs, i);
		if (!v)
			continue;
		lun_of_bid[i] = st->nluns;
		st->lun_dirty_bytes[st->nluns] = 0;
		snprintf(st->luns[st->nluns], sizeof(st->luns[0]), "%s", cache_vol_name(v));
		st->lun_mode[st->nluns] = cache_vol_mode(v);
		int k = st->nluns;
		cache_vol_destage_state(v, &st->lun_destage_err[k], &st->lun_destage_failures[k],
					&st->lun_destage_retry_ms[k]);
		st->nluns++;
	}
	pthread_mutex_unlock(&cs->vols_lock);
	/* dirty data per LUN: only slots marked dirty are looked at closer */
	for (uint32_t s = 0; s < cs->lay.nslots && st->nluns; s++) {
		uint32_t bits = atomic_load(&cs->slots[s].bits);
		if ((bits & SB_STATE_MASK) != SB_READY || !(bits & SB_DIRTY))
			continue;
		uint64_t key = atomic_load(&cs->slots[s].key);
		if (key == CACHE_KEY_NONE || key_bid(key) >= CACHE_SET_MAX_VOLS || lun_of_bid[key_bid(key)] < 0)
			continue;
		st->lun_dirty_bytes[lun_of_bid[key_bid(key)]] += slot_dirty_blocks(cs, s) * CACHE_SECTOR;
	}
	/* what waits for a LUN whose destage fails: its dirty data, from the same pass */
	for (int k = 0; k < st->nluns; k++)
		st->lun_dirty_waiting[k] = st->lun_destage_err[k] ? st->lun_dirty_bytes[k] : 0;
}
