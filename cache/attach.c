/*
 * attach.c - a set's volumes: attach a LUN's backing store (cache_vol_open),
 * flush the attached volumes' dirty data, change a volume's cache mode.
 *
 * Threading: main (or control) thread, may sleep, needs running workers.
 */
#include "cache/cache_int.h"

#include "common/log.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- volumes --------------------------------------------------------------------------- */


struct bdev *cache_vol_open(struct cache_set *cs, const char *lun, struct bdev *backing,
			    const char *backing_path, enum cache_mode mode, char *err, size_t errlen)
{
	struct stat st = { 0 };
	if (backing_path && stat(backing_path, &st) < 0) {
		cache_errf(err, errlen, "cache %s: cannot stat backing %s: %s", cs->name, backing_path, strerror(errno));
		return NULL;
	}
	bool blk = !backing_path || S_ISBLK(st.st_mode);
	if (!backing_path)
		backing_path = backing->name;
	uint64_t ino = blk ? 0 : (uint64_t)st.st_ino, fsdev = blk ? 0 : (uint64_t)st.st_dev;
	int bid = -1, freeb = -1;
	pthread_mutex_lock(&cs->sb.lock);
	for (int i = 0; i < CACHE_MAX_BACKINGS; i++) {
		struct cache_btab_disk *b = &cs->backing[i];
		if (!b->lun[0]) {
			if (freeb < 0)
				freeb = i;
			continue;
		}
		if (strncmp(b->lun, lun, sizeof(b->lun)))
			continue;
		bid = i;
		if (le64_get(b->size) != backing->size || le64_get(b->ino) != ino || le64_get(b->fsdev) != fsdev) {
			pthread_mutex_unlock(&cs->sb.lock);
			cache_errf(err, errlen, "cache %s: lun %s: the backing store %s is not the one this cache holds "
				"data for (that was %s of %llu bytes%s); put the original store back, or if the data "
				"in the cache must be discarded, delete the legs to start with an empty cache",
			     cs->name, lun, backing_path, (le32_get(b->flags) & BTAB_F_BLOCKDEV) ? "a block device" : "a file",
			     (unsigned long long)le64_get(b->size),
			     le64_get(b->ino) ? ", another inode" : "");
			return NULL;
		}
		break;
	}
	bool added = false;
	if (bid < 0) {
		if (freeb < 0) {
			pthread_mutex_unlock(&cs->sb.lock);
			cache_errf(err, errlen, "cache %s: more than %d LUNs use this set; give some another set",
			     cs->name, CACHE_MAX_BACKINGS);
			return NULL;
		}
		bid = freeb;
		struct cache_btab_disk *b = &cs->backing[bid];
		memset(b, 0, sizeof(*b));
		strncpy(b->lun, lun, sizeof(b->lun)); /* NUL-padded; a 64-character name fills it */
		b->size = le64_of(backing->size);
		b->ino = le64_of(ino);
		b->fsdev = le64_of(fsdev);
		b->flags = le32_of(blk ? BTAB_F_BLOCKDEV : 0);
		cs->btab_changed = true;
		added = true;
	}
	pthread_mutex_unlock(&cs->sb.lock);
	if (added) {
		if (cache_sb_write_wait(cs) < 0) {
			cache_errf(err, errlen, "cache %s: cannot record lun %s in the superblock", cs->name, lun);
			return NULL;
		}
	}
	struct cache_vol *v = cache_vol_new(cs, lun, backing, (uint32_t)bid, mode);
	if (!v) {
		cache_errf(err, errlen, "out of memory");
		return NULL;
	}
	int ar = cs->advisor ? advisor_add(cs->advisor, (uint32_t)bid) : 0;
	if (ar == -ENOSPC)
		log_info("cache %s: lun %s has no curve of its own in the sizing advisor (%d LUNs of the set have "
			 "one); its accesses count for the set's", cs->name, lun, ADVISOR_MAX_CURVES);
	else if (ar < 0)
		log_warn("cache %s: no memory for lun %s's own curve in the sizing advisor", cs->name, lun);
	pthread_mutex_lock(&cs->vols_lock);
	atomic_store(&cs->vols[bid], v);
	pthread_mutex_unlock(&cs->vols_lock);
	log_info("cache %s: lun %s attached (%s)", cs->name, lun, cache_mode_name(mode));
	return (struct bdev *)v;
}

/* ---- forgetting LUNs that are gone ---------------------------------------------------- */

struct prune_call {
	struct sync_call c;
	uint32_t bid;
	int res;
	bool busy;
};

static void purged(void *arg)
{
	struct prune_call *p = arg;
	cache_sync_done(&p->c, 0);
}

/* Worker 0. */
static void prune_fn(void *arg)
{
	struct prune_call *p = arg;
	/* p->busy and p->res are set before purged() can run; p is not
	 * touched after that unless it never will */
	int r = cache_purge_bid(p->c.cs, p->bid, &p->busy, &p->res, purged, p);
	if (r <= 0)
		cache_sync_done(&p->c, r); /* else purged() says when the slots are free */
}

int cache_set_prune(struct cache_set *cs)
{
	int freed = 0;
	for (uint32_t bid = 0; bid < CACHE_MAX_BACKINGS; bid++) {
		char lun[65];
		pthread_mutex_lock(&cs->sb.lock);
		snprintf(lun, sizeof(lun), "%.64s", cs->backing[bid].lun);
		pthread_mutex_unlock(&cs->sb.lock);
		/* attached, or a volume of it not closed yet (one a reload
		 * replaced, or parked with commands stuck) */
		if (!lun[0] || atomic_load(&cs->vols_open[bid]))
			continue;
		struct prune_call p;
		int r, dropped = 0;
		do { /* a chunk of its slots at a time, until none is left */
			p = (struct prune_call){ .c = { .cs = cs }, .bid = bid };
			r = cache_sync_run(prune_fn, &p.c);
			dropped += r == 0 ? p.res : 0;
		} while (r == 0 && !p.busy && p.res > 0);
		if (r == -EBUSY) {
			log_warn("cache %s: lun %s is not configured but has dirty data in the cache; it is kept for "
				 "it (configure the LUN again to destage it)", cs->name, lun);
			continue;
		}
		if (r < 0 || p.busy) {
			log_info("cache %s: lun %s is not configured; its cached data is busy (or there was no "
				 "memory to free it), so its entry is kept until a later start", cs->name, lun);
			continue;
		}
		/* its slots' FREE records are durable: no recovery gives them back to a LUN that takes the id */
		pthread_mutex_lock(&cs->sb.lock);
		if (!atomic_load(&cs->vols_open[bid]) && !strncmp(cs->backing[bid].lun, lun, sizeof(cs->backing[bid].lun))) {
			memset(&cs->backing[bid], 0, sizeof(cs->backing[bid]));
			cs->btab_changed = true;
			freed++;
		}
		pthread_mutex_unlock(&cs->sb.lock);
		log_info("cache %s: lun %s is not configured and holds no dirty data: its entry is freed "
			 "(%d clean extent(s) dropped)", cs->name, lun, dropped);
	}
	if (!freed)
		return 0;
	int r = cache_sb_write_wait(cs);
	return r < 0 ? r : freed;
}

/* Any thread: is any slot of an attached LUN dirty? (dirty data of a LUN
 * that is not configured this run cannot be destaged and is not waited for) */
static bool attached_dirty(struct cache_set *cs)
{
	for (uint32_t s = 0; s < cs->lay.nslots; s++) {
		uint32_t bits = atomic_load(&cs->slots[s].bits);
		if ((bits & SB_STATE_MASK) != SB_READY || !(bits & SB_DIRTY))
			continue;
		uint64_t key = atomic_load(&cs->slots[s].key);
		if (key != CACHE_KEY_NONE && cache_vol_of(cs, key_bid(key)))
			return true;
	}
	return false;
}

/* Main (control) thread; sleeps. */
int cache_set_flush(struct cache_set *cs, unsigned timeout_ms)
{
	uint64_t start = now_ms();
	atomic_fetch_add(&cs->flush_req, 1);
	int r = 0;
	for (int i = 0; atomic_load(&cs->dirty_blocks); i++) {
		if (timeout_ms && now_ms() - start > timeout_ms) {
			r = -ETIMEDOUT;
			break;
		}
		if (i % 20 == 19 && !attached_dirty(cs))
			break;
		if (mirror_all_failed(&cs->mirror)) {
			r = -EIO; /* what is dirty is lost */
			break;
		}
		usleep(10000);
	}
	atomic_fetch_sub(&cs->flush_req, 1);
	return r;
}

int cache_vol_switch_mode(struct bdev *vol, enum cache_mode mode)
{
	struct cache_vol *v = (struct cache_vol *)vol;
	enum cache_mode old = cache_vol_mode(v);
	if (old == mode)
		return 0;
	/*
	 * New writes follow the new mode at once; write-through, write-around
	 * and pass-through writes over dirty blocks invalidate them first, so
	 * switching before the flush is safe, and the flush converges because
	 * nothing new becomes dirty. Then what is dirty must be destaged.
	 */
	cache_vol_store_mode(v, mode);
	return old == CACHE_WRITE_BACK;
}

int cache_vol_set_mode(struct bdev *vol, enum cache_mode mode)
{
	if (cache_vol_switch_mode(vol, mode) == 1)
		return cache_set_flush(cache_vol_set((struct cache_vol *)vol), 0);
	return 0;
}
