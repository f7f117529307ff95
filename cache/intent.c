/*
 * intent.c - write-intent bitmap: which parts of the cache may be in doubt
 * after a crash.
 *
 * The cache overwrites slots in place. A write that is cut by a crash can
 * leave leg 0 with the new data and leg 1 with the old (the mirror writes
 * both at once), or the backing store with the new data and the cached
 * copy with the old (write-through, write-around and UNMAP write the
 * backing store first). Neither was acknowledged, so either version may
 * survive, but only one may: a block must read back the same every time,
 * from either leg, before and after its extent is evicted.
 *
 * So, as md does for RAID1, a write that touches data the metadata already
 * references (a READY slot) first makes sure the bit of its region is set
 * on disk, in one 4 KiB page at CACHE_WI_OFF on every healthy leg. After
 * an unclean stop, recovery (set.c) takes every region whose bit is set on
 * any leg, copies its slots from the leg the metadata was read from to the
 * other leg, and marks every valid block in them dirty, so the cached copy
 * (now one copy) is what the backing store will hold once destaged.
 * Writes to blocks nobody references yet (fills, top-ups, a fresh slot)
 * need no bit: recovery never exposes them unless their journal record,
 * written after the data reached both legs, says so.
 *
 * Costs: a region's first write pays one 4 KiB FUA write per leg (all
 * writes waiting for bits share it: one page write at a time, group
 * commit); later writes to it pay two atomic operations. Bits are cleared
 * lazily, on the set's tick, once a region saw no write for a whole tick.
 *
 * Per region one atomic word: the count of writes inside (WI_COUNT), the
 * bit is on disk (WI_ONDISK), and a write came since the last tick
 * (WI_TOUCHED). Only the page writer, with wi->lock held, sets or clears
 * WI_ONDISK, so a write that saw the bit clear (its own increment returned
 * no WI_ONDISK) always waits for a page written after its increment.
 *
 * Threading: intent_enter/intent_leave on worker threads, lock-free unless
 * the region's bit is not yet on disk; intent_tick on worker 0;
 * intent_init/intent_destroy on the main thread.
 */
#include "cache/cache_int.h"

#include "common/bufpool.h"
#include "common/log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WI_ONDISK 0x80000000u
#define WI_TOUCHED 0x40000000u
#define WI_COUNT 0x3fffffffu

uint32_t intent_region_slots(const struct cache_layout *lay)
{
	uint32_t by_bits = (lay->nslots + CACHE_WI_BITS - 1) / CACHE_WI_BITS;
	uint32_t by_size = (uint32_t)((CACHE_WI_MIN_REGION + lay->extent_size - 1) / lay->extent_size);
	return by_bits > by_size ? by_bits : by_size;
}

int intent_init(struct intent *wi, struct cache_set *cs)
{
	memset(wi, 0, sizeof(*wi));
	wi->cs = cs;
	wi->region_slots = intent_region_slots(&cs->lay);
	wi->nregions = (cs->lay.nslots + wi->region_slots - 1) / wi->region_slots;
	wi->word = calloc(wi->nregions, sizeof(*wi->word));
	wi->page = buf_get(CACHE_PAGE);
	wi->last = calloc(1, CACHE_PAGE);
	if (!wi->word || !wi->page || !wi->last)
		return -ENOMEM;
	pthread_mutex_init(&wi->lock, NULL);
	wi->ready = true;
	return 0;
}

void intent_destroy(struct intent *wi)
{
	if (!wi->ready)
		return;
	free(wi->word);
	buf_put(wi->page, CACHE_PAGE);
	free(wi->last);
	pthread_mutex_destroy(&wi->lock);
	wi->ready = false;
}

static bool wi_page_bit(const uint8_t *page, uint32_t r)
{
	return (page[r / 8] >> (r % 8)) & 1;
}

static void wi_issue(struct intent *wi);

static void wi_post(void *arg)
{
	struct intent_wait *w = arg;
	w->fn(w->arg);
}

static void wi_leg_done(struct bdev_req *req, int err)
{
	struct intent *wi = req->priv;
	struct cache_set *cs = wi->cs;
	int leg = (int)(req - wi->req);
	if (err)
		mirror_leg_failed(&cs->mirror, leg, err);
	if (--wi->pending)
		return;

	/*
	 * The page is on every leg that is still healthy (a leg that failed
	 * this write is out of the mirror and gets no data writes either).
	 * If none is left, writes go on and meet the failed mirror.
	 */
	struct intent_wait *ready = NULL;
	pthread_mutex_lock(&wi->lock);
	for (uint32_t r = 0; r < wi->nregions; r++)
		if (wi_page_bit(wi->page, r))
			atomic_fetch_or(&wi->word[r], WI_ONDISK);
	memcpy(wi->last, wi->page, CACHE_PAGE);
	wi->page_writes++;
	struct intent_wait **keep = &wi->waiters;
	while (*keep) {
		struct intent_wait *w = *keep;
		if (atomic_load(&wi->word[w->region]) & WI_ONDISK) {
			*keep = w->next;
			w->next = ready;
			ready = w;
		} else {
			keep = &w->next;
		}
	}
	wi->busy = false;
	bool again = wi->waiters != NULL || wi->again;
	wi->again = false;
	pthread_mutex_unlock(&wi->lock);
	while (ready) {
		struct intent_wait *w = ready;
		ready = w->next;
		if (w->w == worker_self())
			w->fn(w->arg);
		else
			worker_post_call(w->w, &w->call, wi_post, w);
	}
	if (again) {
		pthread_mutex_lock(&wi->lock);
		if (!wi->busy)
			wi_issue(wi); /* unlocks */
		else
			pthread_mutex_unlock(&wi->lock);
	}
	atomic_fetch_sub(&cs->bg_inflight, 1); /* the last access */
}

/*
 * wi->lock held, not busy; unlocks. Builds the page from the words (a bit
 * for every region with writes inside or already on disk; on a clearing
 * pass, regions idle for a whole tick drop out) and writes it to every
 * healthy leg unless it equals what is on disk.
 */
static void wi_build_and_issue(struct intent *wi, bool clearing)
{
	memset(wi->page, 0, CACHE_PAGE);
	for (uint32_t r = 0; r < wi->nregions; r++) {
		uint32_t x = atomic_load(&wi->word[r]);
		for (;;) {
			if (!clearing || !(x & WI_ONDISK) || (x & WI_COUNT))
				break;
			/* idle on disk: first tick forgets TOUCHED, the next one clears */
			uint32_t nx = (x & WI_TOUCHED) ? (x & ~WI_TOUCHED) : 0;
			if (atomic_compare_exchange_weak(&wi->word[r], &x, nx)) {
				x = nx;
				break;
			}
		}
		if ((x & WI_ONDISK) || (x & WI_COUNT))
			wi->page[r / 8] |= (uint8_t)(1u << (r % 8));
	}
	struct cache_set *cs = wi->cs;
	uint32_t failed = atomic_load(&cs->mirror.failed);
	int n = 0;
	for (int i = 0; i < cs->mirror.nlegs; i++)
		if (!(failed & (1u << i)))
			n++;
	if (!memcmp(wi->page, wi->last, CACHE_PAGE) && !wi->waiters) {
		pthread_mutex_unlock(&wi->lock);
		return;
	}
	wi->busy = true;
	wi->pending = n ? n : 1;
	atomic_fetch_add(&cs->bg_inflight, 1); /* shutdown waits for it */
	pthread_mutex_unlock(&wi->lock);
	if (!n) {
		/* no leg to write: complete as if written (req[0] may never have been sent) */
		wi->req[0] = (struct bdev_req){ .priv = wi };
		wi_leg_done(&wi->req[0], 0);
		return;
	}
	for (int i = 0; i < cs->mirror.nlegs; i++) {
		if (failed & (1u << i))
			continue;
		wi->iov[i].iov_base = wi->page;
		wi->iov[i].iov_len = CACHE_PAGE;
		wi->req[i] = (struct bdev_req){
			.op = BDEV_WRITE,
			.flags = BDEV_F_FUA,
			.offset = CACHE_WI_OFF,
			.len = CACHE_PAGE,
			.iov = &wi->iov[i],
			.iovcnt = 1,
			.done = wi_leg_done,
			.priv = wi,
		};
		bdev_submit(cs->mirror.leg[i], &wi->req[i]);
	}
}

static void wi_issue(struct intent *wi)
{
	wi_build_and_issue(wi, false);
}

bool intent_enter(struct cache_set *cs, uint32_t slot, struct intent_wait *w)
{
	struct intent *wi = &cs->intent;
	uint32_t r = slot / wi->region_slots;
	w->region = r;
	uint32_t old = atomic_fetch_add(&wi->word[r], 1);
	if (!(old & WI_TOUCHED))
		atomic_fetch_or(&wi->word[r], WI_TOUCHED);
	if (old & WI_ONDISK)
		return true;
	w->w = worker_self();
	pthread_mutex_lock(&wi->lock);
	if (atomic_load(&wi->word[r]) & WI_ONDISK) {
		pthread_mutex_unlock(&wi->lock); /* a page landed in between */
		return true;
	}
	w->next = wi->waiters;
	wi->waiters = w;
	wi->parked++;
	if (wi->busy) {
		wi->again = true;
		pthread_mutex_unlock(&wi->lock);
		return false;
	}
	wi_issue(wi); /* unlocks */
	return false;
}

void intent_leave(struct cache_set *cs, uint32_t region)
{
	atomic_fetch_sub(&cs->intent.word[region], 1);
}

void intent_rewrite(struct cache_set *cs)
{
	struct intent *wi = &cs->intent;
	pthread_mutex_lock(&wi->lock);
	memset(wi->last, 0xa5, CACHE_PAGE); /* differs from any page: the next build writes */
	if (wi->busy) {
		wi->again = true;
		pthread_mutex_unlock(&wi->lock);
		return;
	}
	wi_issue(wi); /* unlocks */
}

void intent_tick(struct cache_set *cs)
{
	struct intent *wi = &cs->intent;
	pthread_mutex_lock(&wi->lock);
	if (wi->busy) {
		pthread_mutex_unlock(&wi->lock);
		return;
	}
	wi_build_and_issue(wi, true); /* unlocks */
}

void intent_stats(struct cache_set *cs, uint64_t *page_writes, uint64_t *parked, uint32_t *regions_set)
{
	struct intent *wi = &cs->intent;
	pthread_mutex_lock(&wi->lock);
	*page_writes = wi->page_writes;
	*parked = wi->parked;
	pthread_mutex_unlock(&wi->lock);
	uint32_t n = 0;
	for (uint32_t r = 0; r < wi->nregions; r++)
		if (atomic_load(&wi->word[r]) & WI_ONDISK)
			n++;
	*regions_set = n;
}

/* ---- recovery ------------------------------------------------------------------------ */

static int wi_write_page(struct cache_set *cs, const uint8_t *page)
{
	uint8_t *buf = buf_get(CACHE_PAGE);
	if (!buf)
		return -ENOMEM;
	memcpy(buf, page, CACHE_PAGE);
	uint32_t failed = atomic_load(&cs->mirror.failed);
	int ok = 0, err = 0;
	for (int i = 0; i < cs->mirror.nlegs; i++) {
		if (failed & (1u << i))
			continue;
		int r = cache_sync_io(cs->legs[i], BDEV_WRITE, CACHE_WI_OFF, buf, CACHE_PAGE, BDEV_F_FUA);
		if (r < 0)
			err = r;
		else
			ok++;
	}
	buf_put(buf, CACHE_PAGE);
	return ok ? 0 : err ? err : -EIO;
}

/*
 * Main thread, before anything is served, after an unclean stop; the
 * metadata was recovered from leg src. For every region whose bit is set
 * on any healthy leg (every region when the set has no bitmap: all):
 *  - slots holding dirty blocks are copied from src to the other healthy
 *    leg, so both legs hold the same version of each (the dirty blocks are
 *    the only copy: whichever version src has, old or new, is kept);
 *  - valid clean blocks are invalidated: the backing store has an equally
 *    good version of them (the old one, or the new one a cut write reached),
 *    and the cache must not hold a different one that an eviction would
 *    later swap for it.
 * The changes are in RAM and marked for the checkpoint the caller takes;
 * the page stays on disk until then, so a crash meanwhile does this again.
 */
int intent_recover(struct cache_set *cs, int src, bool all, char *err, size_t errlen)
{
	struct intent *wi = &cs->intent;
	uint8_t *mask = calloc(1, CACHE_PAGE);
	uint8_t *page = buf_get(CACHE_PAGE);
	uint8_t *ext = buf_get(cs->lay.extent_size);
	int rc = -1;
	if (!mask || !page || !ext) {
		snprintf(err, errlen, "cache %s: out of memory recovering", cs->name);
		goto out;
	}
	uint32_t failed = atomic_load(&cs->mirror.failed);
	int dst = -1;
	if (cs->mirror.nlegs == 2 && !(failed & (1u << (1 - src))))
		dst = 1 - src;
	if (all) {
		memset(mask, 0xff, CACHE_PAGE);
		/* the page first: a crash from here on finds every bit set again */
		int r = wi_write_page(cs, mask);
		if (r < 0) {
			snprintf(err, errlen, "cache %s: cannot write the write-intent page: %s", cs->name,
				 strerror(-r));
			goto out;
		}
	} else {
		for (int i = 0; i < cs->mirror.nlegs; i++) {
			if (failed & (1u << i))
				continue;
			int r = cache_sync_io(cs->legs[i], BDEV_READ, CACHE_WI_OFF, page, CACHE_PAGE, 0);
			if (r < 0) {
				/* unknown: everything may be in doubt */
				log_warn("cache %s: cannot read the write-intent page of %s (%s); reconciling every "
					 "region", cs->name, cs->legs[i]->name, strerror(-r));
				memset(page, 0xff, CACHE_PAGE);
			}
			for (uint32_t k = 0; k < CACHE_PAGE; k++)
				mask[k] |= page[k];
		}
	}
	uint32_t regions = 0, copied = 0, invalidated = 0;
	uint32_t bpe = cs->lay.bpe;
	for (uint32_t r = 0; r < wi->nregions; r++) {
		if (!wi_page_bit(mask, r))
			continue;
		regions++;
		uint32_t end = (r + 1) * wi->region_slots;
		if (end > cs->lay.nslots)
			end = cs->lay.nslots;
		for (uint32_t s = r * wi->region_slots; s < end; s++) {
			struct slot *sl = &cs->slots[s];
			if (atomic_load(&sl->key) == CACHE_KEY_NONE)
				continue;
			if (dst >= 0 && slot_any_dirty(cs, s, 0, bpe)) {
				uint64_t off = slot_leg_off(cs, s);
				int e = cache_sync_io(cs->legs[src], BDEV_READ, off, ext, cs->lay.extent_size, 0);
				if (e == 0)
					e = cache_sync_io(cs->legs[dst], BDEV_WRITE, off, ext, cs->lay.extent_size,
							  BDEV_F_FUA);
				if (e < 0) {
					snprintf(err, errlen, "cache %s: cannot make the legs agree on slot %u "
						 "(%s to %s): %s; the set cannot be trusted until they do",
						 cs->name, s, cs->legs[src]->name, cs->legs[dst]->name, strerror(-e));
					goto out;
				}
				copied++;
			}
			slot_lock(sl);
			for (uint32_t b = 0; b < bpe;) {
				bool v;
				uint32_t n = slot_valid_run(cs, s, b, bpe - b, &v);
				if (v) {
					/* within a valid run, invalidate the clean stretches */
					for (uint32_t k = b; k < b + n;) {
						uint32_t e = k;
						while (e < b + n && !slot_any_dirty(cs, s, e, 1))
							e++;
						if (e > k) {
							slot_apply(cs, s, JOP_INVALIDATE, k, e - k);
							invalidated += e - k;
						}
						while (e < b + n && slot_any_dirty(cs, s, e, 1))
							e++;
						k = e;
					}
				}
				b += n;
			}
			slot_unlock(sl);
			ckpt_mark(cs, s);
		}
	}
	log_info("cache %s: %u region(s) of %u slot(s) were being written at the stop%s: %u slot(s) with "
		 "dirty data copied from %s to %s, %u clean block(s) dropped from the cache",
		 cs->name, regions, wi->region_slots, all ? " (a version 1 set: every region)" : "", copied,
		 cs->legs[src]->name, dst >= 0 ? cs->legs[dst]->name : "(no other leg)", invalidated);
	rc = 0;
out:
	free(mask);
	if (page)
		buf_put(page, CACHE_PAGE);
	if (ext)
		buf_put(ext, cs->lay.extent_size);
	return rc;
}

/* Main thread, after recovery's checkpoint (or on a clean start): nothing in doubt. */
int intent_clear_all(struct cache_set *cs)
{
	struct intent *wi = &cs->intent;
	uint8_t *zero = calloc(1, CACHE_PAGE);
	if (!zero)
		return -ENOMEM;
	int r = wi_write_page(cs, zero);
	free(zero);
	memset(wi->last, 0, CACHE_PAGE);
	for (uint32_t i = 0; i < wi->nregions; i++)
		atomic_store(&wi->word[i], 0);
	return r;
}
