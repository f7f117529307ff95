/*
 * status.h - what the engine tells the operator (for tierctl status/stats).
 *
 * A snapshot struct, filled without stopping I/O (counters are read with
 * relaxed atomics, so the numbers are a consistent-enough picture, not a
 * transaction). The control socket turns it into JSON with json-c.
 *
 * Threading: any thread; takes no lock on the I/O path; never sleeps
 * (cache_set_status takes the set's lost-range mutex for a copy of at most
 * CACHE_LOST_MAX entries, held by writers only on the both-legs-lost path).
 */
#ifndef TC_CACHE_STATUS_H
#define TC_CACHE_STATUS_H

#include "cache/cache.h"

#include <stdbool.h>
#include <stdint.h>

#define CACHE_LOST_MAX 32           /* lost ranges a set remembers */

enum cache_leg_health { LEG_HEALTHY, LEG_FAILED, LEG_RESYNCING };

struct cache_leg_status {
	char path[256];
	enum cache_leg_health health;
	uint64_t errors;
	uint64_t reads, writes, fua_writes, flushes; /* requests sent to the leg (bdev_io_counts) */
	uint64_t resync_done, resync_total; /* bytes, while resyncing */
	uint64_t resync_rate_bps;           /* average since the resync started */
	int64_t resync_eta_s;               /* seconds left at that rate, -1 unknown */
};

struct cache_set_status {
	char name[64];
	bool degraded;               /* a leg failed or resyncing */
	int nlegs;
	struct cache_leg_status legs[2];
	uint32_t extent_size;
	uint32_t nslots, slots_used;
	uint64_t dirty_bytes;
	uint64_t read_hits, read_misses, read_partial;
	uint64_t write_hits, write_misses;
	uint64_t write_one_trip;      /* of which data and journal record went together */
	uint64_t write_no_record;     /* of which overwrote dirty blocks: no record needed */
	double hit_ratio;            /* read hits / reads */
	uint64_t promotions, evictions, destaged_bytes;
	/* the admission policy's answers to misses: promote, not yet (too
	 * few misses), or bypass (part of a stream longer than seq_cutoff) */
	uint64_t admitted, below_threshold, seq_bypassed;
	uint64_t topups;             /* fills of the invalid blocks of resident extents */
	uint64_t cleaner_rate_bps;   /* current destage rate target */
	uint64_t destage_max_bps;    /* the admin's caps (0 = none) */
	uint32_t destage_max_iops;
	uint64_t destage_pause_us;   /* the cleaner's pause after each destage while hosts read (0: none) */
	uint64_t hit_quiet_us;       /* the hits' mean latency with no destage about, as the cleaner saw it */
	uint64_t destage_pauses;     /* such pauses taken */
	uint64_t lost_ios;           /* I/Os failed with both legs gone and dirty data */
	uint64_t leg_read_errors;    /* reads a leg failed that the other served (queued for rewrite) */
	uint64_t leg_timeouts;       /* requests a leg did not answer within leg_timeout */
	uint64_t leg_repairs;        /* such ranges rewritten on the failing leg */
	uint64_t intent_writes;      /* write-intent page writes (a region's first write since idle) */
	uint64_t block_log_writes;   /* overwrites of dirty data logged first (torn-write guard) */
	uint64_t block_log_waits;    /* of those, how many waited for a checkpoint to free log space */
	uint64_t checkpoints;        /* checkpoints written since the set opened */
	uint64_t journal_full_waits; /* times a journal ring filled and its writes waited for a checkpoint */
	uint32_t version;            /* on-disk format (4) */
	uint32_t block_log;          /* 1: the set has the block log (a set made before format 3 has not) */
	uint32_t luns_known;         /* entries of its table of LUNs in use (attached or not) */
	/* Dirty data found lost (both legs gone) by the reads that met it:
	 * byte ranges of the LUN (backing offsets), overlapping and adjacent
	 * ones merged, sorted by LUN then offset; at most CACHE_LOST_MAX per
	 * set, lost_dropped counts ranges that found the list full. */
	struct cache_lost_range {
		char lun[64];
		uint64_t offset, length;
	} lost[CACHE_LOST_MAX];
	int nlost;
	uint64_t lost_dropped;
	uint64_t mem_bytes;
	uint64_t sector_grain_slots; /* slots whose state is kept per 512-byte sector, not per 4 KiB page */
	char luns[16][65]; /* LUN names are up to 64 characters */
	enum cache_mode lun_mode[16];
	/* destage to the LUN's backing store: 0 working, else the error of the
	 * failing writes, how many failed, ms to the next try, dirty bytes of
	 * the LUN waiting in the cache (counted only while failing) */
	int lun_destage_err[16];
	uint64_t lun_destage_failures[16], lun_destage_retry_ms[16], lun_dirty_waiting[16];
	uint64_t lun_dirty_bytes[16]; /* dirty data of each LUN (a pass over the slots) */
	int nluns;
};

void cache_set_status(struct cache_set *cs, struct cache_set_status *st);

#endif
