/*
 * cache.h - the tiering engine's public surface: cache sets and volumes.
 *
 * A cache set is a RAID1 pair of leg devices holding extents of one or
 * more backing stores. Each LUN that uses the set gets a cache volume: a
 * bdev stacked on its backing bdev, which the SCSI layer uses like any
 * other bdev. The daemon:
 *
 *     workers_start();
 *     cs = cache_set_open(&cfg, err, n);            // format or recover
 *     dev = cache_vol_open(cs, "lun0", backing, path, err, n);
 *     scsi_lu_open(..., dev, ...);
 *     ...
 *     cache_set_shutdown(cs);                        // before workers_stop
 *     workers_stop();
 *     bdev_close(dev);                               // by scsi_lu_close
 *     cache_set_close(cs);
 *
 * Threading: open/shutdown/close/flush/mode are main-thread (or control
 * thread) calls that may sleep; they run their I/O on the workers, which
 * must be running. Volume I/O follows bdev.h.
 */
#ifndef TC_CACHE_H
#define TC_CACHE_H

#include "bdev/bdev.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum cache_mode {
	CACHE_WRITE_BACK,    /* writes land on the legs; the cleaner destages */
	CACHE_WRITE_THROUGH, /* writes go to the backing store, then the cache */
	CACHE_WRITE_AROUND,  /* writes go to the backing store, cached copy dropped */
	CACHE_PASS_THROUGH,  /* the cache is not used (after a flush) */
};

const char *cache_mode_name(enum cache_mode m);
int cache_mode_parse(const char *s, enum cache_mode *out);

struct cache_set_cfg {
	const char *name;
	const char *legs[2];
	int nlegs;
	bool allow_single_leg;
	uint64_t size;          /* bytes per leg; 0 = existing size */
	uint32_t extent_size;   /* 64 KiB .. 4 MiB, power of two */
	enum cache_mode mode;
	uint32_t admit_hits;    /* misses before promotion (policy) */
	uint64_t seq_cutoff;    /* sequential bypass, bytes (0 = never) */
	uint32_t dirty_target;  /* percent of slots the cleaner aims to keep dirty at most */
	uint64_t destage_max;   /* destage bytes per second at most, flushes included (0 = no cap) */
	uint32_t destage_max_iops; /* destage writes per second at most (0 = no cap) */
	uint32_t leg_timeout_ms; /* a leg that takes longer to answer is failed (0 = never) */
	uint32_t max_read_errors; /* unreadable ranges rewritten per leg within an hour before it is failed (0 = no limit) */
	bool fault_injection;   /* tests only: legs wrapped by bdev_fault (tierctl leg fault) */
};

struct cache_set;
struct advisor_report;

/*
 * The sizing advisor's answer (cache/advisor.h): the set's and each
 * attached LUN's read hit ratio at 1/4 .. 8 times today's size; names[bid]
 * is the LUN with that backing id ("" when none); *extent_size its unit.
 * With reset, every count is forgotten afterwards (a fresh curve from now).
 * -ENOMEM when the set has no advisor. Any thread but a worker.
 */
int cache_set_advice(struct cache_set *cs, struct advisor_report *r, char (*names)[65], uint32_t *extent_size,
		     bool reset);

/* The destage caps (cache_set_cfg's destage_max, destage_max_iops), changed
 * while running (tierctl set, a reload): from the cleaner's next second.
 * Any thread. */
void cache_set_destage_max(struct cache_set *cs, uint64_t bps, uint32_t iops);

/*
 * Open the legs (files are created at cfg->size when missing), then either
 * format them (no superblock anywhere) or recover: newest superblock,
 * table, journal replay. Refuses a leg of another set, a corrupt
 * superblock, a layout that differs from cfg, with a sentence in err.
 * Main thread, workers running; sleeps.
 */
struct cache_set *cache_set_open(const struct cache_set_cfg *cfg, char *err, size_t errlen);

/* Same, on leg bdevs already open (tests, other leg types); takes ownership. */
struct cache_set *cache_set_open_devs(const struct cache_set_cfg *cfg, struct bdev **legs, char *err,
				      size_t errlen);

/*
 * The bdev a LUN should use: backing with the set in front of it.
 * backing_path is stat()ed for the identity check (NULL: identity by size
 * and name only, for block devices and tests). A backing store whose
 * identity differs from the one recorded for this LUN is refused.
 * Main thread. bdev_close on the result frees the volume and closes backing.
 */
struct bdev *cache_vol_open(struct cache_set *cs, const char *lun, struct bdev *backing,
			    const char *backing_path, enum cache_mode mode, char *err, size_t errlen);

/*
 * A volume over a shared backing store (bdev_is_shared, an RBD image): keep
 * the generation of this gateway's last gain of the image in gen_path (a
 * small file, e.g. in the state_dir), so a gain that follows our own
 * without anyone else owning the image in between keeps the cache (a warm
 * restart), and any other drops it. Starts following the backing's
 * ownership (a single-gateway image's lock is asked for here, and taken
 * by the lock work: the daemon waits for it before it listens). Call after
 * cache_vol_open, before the LU is opened; main thread, may block. 0, or
 * -1 with a sentence in err. No-op for a volume whose backing is not shared.
 */
int cache_vol_owner_track(struct bdev *vol, const char *gen_path, char *err, size_t errlen);

/*
 * The on-disk format of the set a leg (device or file) holds, read without
 * opening the set: *version is the newest superblock copy's version, 0 for
 * a leg that holds no set (blank, new, or being rebuilt). 0, or -1 with a
 * sentence in err when the leg cannot be read or holds a format newer than
 * this build reads (CACHE_VERSION): such a set must not be opened by it.
 * For tiercached --check, which the unit and the package run before any
 * start. Any thread; reads 8 KiB.
 */
int cache_leg_format(const char *path, uint32_t *version, char *err, size_t errlen);

/*
 * Forget the LUNs the set holds an entry for that are not attached now
 * (removed from the configuration): one whose data in the set is all
 * clean loses it and its entry, which a new LUN may take (the set holds
 * CACHE_MAX_BACKINGS); one with dirty data keeps both, and is named in a
 * warning. Call once every configured LUN is attached. Main thread, may
 * block. How many were freed, or -errno.
 */
int cache_set_prune(struct cache_set *cs);

/* The set a volume (cache_vol_open's) is in. */
struct cache_set *cache_vol_cache_set(struct bdev *vol);
/*
 * Whether the set still needs the volume to destage dirty data of its LUN
 * (a pass over the slots): false once none is dirty, or once the LUN,
 * configured again, has a new volume, which destages it. For a removed
 * LUN whose volume waits to be closed. Any thread.
 */
bool cache_vol_waits_destage(struct bdev *vol);

/* Destage every dirty extent and wait (timeout_ms 0 = forever). 0 or -errno. Main thread. */
int cache_set_flush(struct cache_set *cs, unsigned timeout_ms);
/* Change a volume's mode; leaving write-back flushes first. Main thread. */
int cache_vol_set_mode(struct bdev *vol, enum cache_mode mode);
/*
 * The same without the wait: new writes follow mode at once (writes over
 * dirty blocks invalidate them, so nothing new becomes dirty) and the
 * caller destages the set with cache_set_flush when this returns 1 (the
 * volume left write-back); 0 when nothing is left to do. Any thread.
 */
int cache_vol_switch_mode(struct bdev *vol, enum cache_mode mode);
/*
 * The LUN's blocks are larger than what the legs write atomically across a
 * power cut: each write-back overwrite of dirty data then goes through the
 * set's block log first, so a cut never leaves a block part old, part new
 * (one more leg write for those writes only). true if the guard is on: the
 * set has a block log (a set made before version 3 has none). Before the
 * LU is opened; main thread.
 */
bool cache_vol_guard_torn(struct bdev *vol, bool on);

/*
 * Put newdev in place of failed leg number leg (0 or 1) and rebuild it
 * online from the other leg; progress in cache_set_status (resyncing,
 * resync_done/resync_total). 0, or -1 with a sentence in err. Main or
 * control thread; returns once the copy has started. The set owns newdev.
 */
int cache_set_leg_replace(struct cache_set *cs, int leg, struct bdev *newdev, char *err, size_t errlen);
/* Same by paths (tierctl leg replace SET OLD NEW); a missing NEW file is created. */
int cache_set_leg_replace_path(struct cache_set *cs, const char *old_path, const char *new_path, char *err,
			       size_t errlen);

/*
 * Take the healthy leg at path out of service on purpose (why: a sentence
 * for the log, e.g. the NVMe health warning or "by the administrator"), as
 * if it had an I/O error: the set runs degraded on the other leg until
 * cache_set_leg_replace. The last healthy leg is refused. 0, or -1 with a
 * sentence in err. Main or control thread; returns before the failure is
 * persisted (status shows it within milliseconds).
 */
int cache_set_fail_leg(struct cache_set *cs, const char *path, const char *why, char *err, size_t errlen);
/*
 * Tests only (a set opened with fault_injection): set the fault of leg
 * path (enum bdev_fault, bdev/fault.h) and return what its fault device has seen.
 * Any thread. 0, or -1 with a sentence in err.
 */
struct bdev_fault_counts;
int cache_set_leg_fault(struct cache_set *cs, const char *path, int fault, uint64_t off, uint64_t len,
			struct bdev_fault_counts *counts, char *err, size_t errlen);

/*
 * Quiesce and write the final checkpoint with the clean-shutdown flag.
 * Call after the front end has drained, before workers_stop. Main thread.
 */
int cache_set_shutdown(struct cache_set *cs);
/* Free everything (volumes already closed). Main thread, workers stopped. */
void cache_set_close(struct cache_set *cs);

/* RAM used by the set's in-memory map, slots, bitmaps and policy (bytes). */
uint64_t cache_set_mem_bytes(const struct cache_set *cs);

#endif
