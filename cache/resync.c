/*
 * resync.c - rebuild a replaced leg online, while the LUNs keep serving.
 *
 * The new leg takes the failed leg's place in the mirror flagged
 * "resyncing": it is never read, and a write reaches it only when it lies
 * below the copy cursor (resync_pos). Worker 0 copies the used part of the
 * surviving leg (everything after the superblocks: table, journals, slots)
 * chunk by chunk. A foreground write that overlaps the chunk being copied
 * announces itself (a generation bump and an in-flight count, before it
 * decides which legs it goes to); the copier advances the cursor and then
 * checks that no write touched the chunk during its copy, else copies the
 * chunk again. So every byte below the cursor is either copied after the
 * last write to it, or written to both legs.
 *
 * When the cursor reaches the end, the leg is healthy: the superblocks of
 * both legs are rewritten without it in the failed mask, naming the new
 * leg's identity (a fresh leg_uuid) as the member at its index, so the
 * device it replaced is never taken back even if the configuration still
 * lists it. The copy starts by writing the rebuild mark over the new leg's
 * superblocks: a crash or a stop during the resync leaves it marked, and the
 * next start rebuilds it again (a marked or blank leg at a place the set
 * records as failed). The new leg gets its own superblock (naming it
 * failed) before both get one naming it healthy.
 *
 * Threading: cache_set_leg_replace on the main (control) thread; the copy
 * runs on worker 0.
 */
#include "cache/cache_int.h"

#include "common/bufpool.h"
#include "common/log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

struct resync {
	struct cache_set *cs;
	int leg, src;
	uint64_t pos, end;
	uint64_t gen0;
	void *buf;
	struct iovec iov;
	struct bdev_req req;
	struct sb_job sbj;
	uint64_t started_ms;
	unsigned redo;
};

static void copy_chunk(struct resync *rs);

static void resync_sb_done(void *arg, int err)
{
	struct resync *rs = arg;
	log_info("cache %s: leg %s resynced in %llu ms (%u chunks copied again after concurrent writes)%s",
		 rs->cs->name, rs->cs->legs[rs->leg]->name,
		 (unsigned long long)(now_ms() - rs->started_ms), rs->redo,
		 err ? "; the superblock update failed" : "");
	struct cache_set *cs = rs->cs;
	buf_put(rs->buf, RESYNC_CHUNK);
	free(rs);
	atomic_fetch_sub(&cs->bg_inflight, 1); /* the last access: shutdown may go on */
}

static void resync_fail(struct resync *rs, int err);

/*
 * Worker 0: the new leg holds a superblock of its own now (naming it
 * failed). Only then do both legs get one that names it healthy: if the
 * power goes while that is written, the new leg still has a valid copy
 * (superblock writes alternate between two), never two torn ones beside a
 * superblock that calls it healthy.
 */
static void resync_own_sb_done(void *arg, int err)
{
	struct resync *rs = arg;
	struct cache_set *cs = rs->cs;
	atomic_store(&cs->sb.include, 0);
	if (err) {
		resync_fail(rs, err);
		return;
	}
	/* its old failure is no longer what is on disk: a new one must be
	 * recorded before writes complete again (mirror.c, must_wait) */
	atomic_fetch_and(&cs->mirror.persisted, ~(1u << rs->leg));
	atomic_fetch_and(&cs->mirror.resyncing, ~(1u << rs->leg));
	intent_rewrite(cs);
	cache_sb_write(cs, &rs->sbj, resync_sb_done, rs);
}

static void resync_end(struct resync *rs)
{
	struct cache_set *cs = rs->cs;
	atomic_fetch_or(&cs->mirror.failed, 1u << rs->leg);
	atomic_fetch_and(&cs->mirror.resyncing, ~(1u << rs->leg));
	buf_put(rs->buf, RESYNC_CHUNK);
	free(rs);
	atomic_fetch_sub(&cs->bg_inflight, 1);
}

static void resync_fail(struct resync *rs, int err)
{
	log_err("cache %s: resync of %s failed: %s; the leg stays out of the mirror", rs->cs->name,
		rs->cs->legs[rs->leg]->name, strerror(-err));
	resync_end(rs);
}

/*
 * The set is stopping: give the rebuild up where it is. The new leg still
 * carries the rebuild mark, so the next start rebuilds it again from the
 * beginning.
 */
static bool resync_stopped(struct resync *rs)
{
	if (!atomic_load(&rs->cs->stopping))
		return false;
	log_warn("cache %s: the resync of %s stops with the daemon at %llu of %llu MiB; the next start "
		 "rebuilds it", rs->cs->name, rs->cs->legs[rs->leg]->name, (unsigned long long)(rs->pos >> 20),
		 (unsigned long long)(rs->end >> 20));
	resync_end(rs);
	return true;
}

/*
 * Every chunk copied, the cursor at the end. Writes that skipped the new leg
 * and were still in flight are being caught up on it (mirror.c, caught_up):
 * wait for the last (it posts this again, on worker 0), then write the new
 * leg's own superblock, still naming it failed. The cursor is at the end
 * before the count is read, so no write skips the leg after a 0.
 */
static void resync_finish(void *arg)
{
	struct resync *rs = arg;
	struct mirror *m = &rs->cs->mirror;
	if (atomic_load(&m->resync_skip_inflight)) {
		atomic_store(&m->resync_finisher, rs);
		if (atomic_load(&m->resync_skip_inflight))
			return; /* the write that brings it to 0 posts us */
		if (atomic_exchange(&m->resync_finisher, NULL) != rs)
			return; /* it did, just now */
	}
	if (atomic_load(&m->failed) & ((1u << rs->leg) | (1u << rs->src))) {
		resync_fail(rs, -EIO); /* a catch-up failed on it, or the source failed */
		return;
	}
	atomic_store(&rs->cs->sb.include, 1u << rs->leg);
	/* the copy may have raced a table write on the source (and table
	 * writes skip a leg being rebuilt): this generation writes the table
	 * again, to both legs, before the superblock that names it */
	pthread_mutex_lock(&rs->cs->sb.lock);
	rs->cs->btab_leg[rs->leg] = rs->cs->btab_leg[rs->src]; /* what the copy brought: the other one is free */
	rs->cs->btab_changed = true;
	pthread_mutex_unlock(&rs->cs->sb.lock);
	cache_sb_write(rs->cs, &rs->sbj, resync_own_sb_done, rs);
}

static void chunk_written(struct bdev_req *req, int err)
{
	struct resync *rs = req->priv;
	struct mirror *m = &rs->cs->mirror;
	if (err) {
		resync_fail(rs, err);
		return;
	}
	uint64_t end = rs->pos + req->len;
	/* cursor first, then look for writes that raced with the copy */
	if (atomic_load(&m->resync_pos) < end)
		atomic_store(&m->resync_pos, end);
	if (atomic_load(&m->resync_chunk_gen) != rs->gen0 || atomic_load(&m->resync_chunk_inflight)) {
		rs->redo++;
		copy_chunk(rs);
		return;
	}
	rs->pos = end;
	if (rs->pos >= rs->end) {
		atomic_store(&m->resync_chunk_start, RESYNC_NO_CHUNK);
		resync_finish(rs);
		return;
	}
	copy_chunk(rs);
}

static void chunk_read(struct bdev_req *req, int err)
{
	struct resync *rs = req->priv;
	if (err) {
		/*
		 * The source could not read this chunk (a bad sector, or worse).
		 * It still holds the only copy of everything else: keep it in
		 * service and give up the rebuild (md does the same); a source
		 * that is really dead fails on its next write.
		 */
		log_err("cache %s: reading %s at %llu for the resync failed; the resync stops, %s stays in "
			"service", rs->cs->name, rs->cs->legs[rs->src]->name, (unsigned long long)req->offset,
			rs->cs->legs[rs->src]->name);
		resync_fail(rs, err);
		return;
	}
	req->op = BDEV_WRITE;
	req->flags = BDEV_F_FUA;
	req->done = chunk_written;
	bdev_submit(rs->cs->legs[rs->leg], req);
}

static void copy_chunk(struct resync *rs)
{
	struct mirror *m = &rs->cs->mirror;
	if (resync_stopped(rs))
		return;
	uint32_t failed = atomic_load(&m->failed);
	if (failed & ((1u << rs->leg) | (1u << rs->src))) {
		/* the source failed (nothing to copy from), or a write to the new
		 * leg did (mirror.c) */
		resync_fail(rs, -EIO);
		return;
	}
	uint64_t len = rs->end - rs->pos < RESYNC_CHUNK ? rs->end - rs->pos : RESYNC_CHUNK;
	atomic_store(&m->resync_chunk_start, rs->pos);
	rs->gen0 = atomic_load(&m->resync_chunk_gen);
	rs->iov.iov_base = rs->buf;
	rs->iov.iov_len = len;
	rs->req = (struct bdev_req){ .op = BDEV_READ, .offset = rs->pos, .len = len, .iov = &rs->iov,
				     .iovcnt = 1, .done = chunk_read, .priv = rs };
	bdev_submit(rs->cs->legs[rs->src], &rs->req);
}

static void mark_copy(struct resync *rs, uint64_t off);

static void marked(struct bdev_req *req, int err)
{
	struct resync *rs = req->priv;
	if (err) {
		resync_fail(rs, err);
		return;
	}
	if (req->offset == CACHE_PAGE)
		mark_copy(rs, 0);
	else
		copy_chunk(rs);
}

static void mark_copy(struct resync *rs, uint64_t off)
{
	rs->iov.iov_base = rs->buf;
	rs->iov.iov_len = CACHE_PAGE;
	rs->req = (struct bdev_req){ .op = BDEV_WRITE, .flags = BDEV_F_FUA, .offset = off, .len = CACHE_PAGE,
				     .iov = &rs->iov, .iovcnt = 1, .done = marked, .priv = rs };
	bdev_submit(rs->cs->legs[rs->leg], &rs->req);
}

/*
 * Worker 0. First both superblock copies of the new leg get the rebuild
 * mark (meta.h), one after the other, each FUA: until the copy is done and
 * the leg has a superblock of its own again, it is marked, so a crash or a
 * stop in the middle leaves a leg the next start rebuilds again, never an
 * old superblock that could pass for a member; a torn mark leaves the
 * other copy whole.
 */
static void resync_start(void *arg)
{
	struct resync *rs = arg;
	meta_rebuild_mark((struct cache_sb_disk *)rs->buf, rs->cs->uuid);
	mark_copy(rs, CACHE_PAGE);
}

/*
 * Main thread. Put newdev in place of failed leg `leg` and start copying.
 * 0, or -1 with a sentence in err.
 */
int cache_set_leg_replace(struct cache_set *cs, int leg, struct bdev *newdev, char *err, size_t errlen)
{
	struct mirror *m = &cs->mirror;
	if (leg < 0 || leg >= m->nlegs || m->nlegs != 2) {
		snprintf(err, errlen, "cache %s: no leg %d to replace (the set has %d)", cs->name, leg, m->nlegs);
		return -1;
	}
	int src = 1 - leg;
	uint32_t failed = atomic_load(&m->failed);
	if (!(failed & (1u << leg)) || (failed & (1u << src)) || atomic_load(&m->resyncing)) {
		snprintf(err, errlen, "cache %s: leg %s is %s; only a failed leg can be replaced, while the "
			 "other one is healthy", cs->name, cs->legs[leg]->name,
			 (failed & (1u << leg)) ? "failed but so is the other" : "healthy");
		return -1;
	}
	if (newdev->size < cs->lay.leg_size) {
		snprintf(err, errlen, "cache %s: the new leg %s holds %llu bytes, the set needs %llu; use a "
			 "larger device", cs->name, newdev->name, (unsigned long long)newdev->size,
			 (unsigned long long)cs->lay.leg_size);
		return -1;
	}
	struct resync *rs = calloc(1, sizeof(*rs));
	void *buf = buf_get(RESYNC_CHUNK);
	if (!rs || !buf || cs->nold_legs == (int)(sizeof(cs->old_legs) / sizeof(cs->old_legs[0]))) {
		free(rs);
		if (buf)
			buf_put(buf, RESYNC_CHUNK);
		snprintf(err, errlen, "cache %s: out of memory (or too many replacements; restart first)", cs->name);
		return -1;
	}
	rs->cs = cs;
	rs->leg = leg;
	rs->src = src;
	rs->buf = buf;
	rs->pos = 2 * CACHE_PAGE;
	rs->end = cs->lay.data_off + (uint64_t)cs->lay.nslots * cs->lay.extent_size;
	rs->started_ms = now_ms();
	m->resync_finish_fn = resync_finish;
	atomic_store(&cs->mirror.resync_started_ms, rs->started_ms);
	if (newdev != cs->legs[leg]) /* else: the leg found blank at open, rebuilt in place */
		cs->old_legs[cs->nold_legs++] = cs->legs[leg];
	/* a new member at this index: the device it replaces is never taken back */
	if (getrandom(cs->leg_uuid[leg], 16, 0) != 16)
		memset(cs->leg_uuid[leg], 0, 16);
	atomic_store(&m->resync_pos, rs->pos);
	atomic_store(&m->resync_end, rs->end);
	atomic_store(&m->resync_chunk_start, RESYNC_NO_CHUNK);
	newdev->io = cs->legs[leg]->io; /* the leg's counts go on */
	cs->legs[leg] = newdev;
	m->leg[leg] = newdev;
	/* resyncing before un-failing: no moment where reads could pick it */
	atomic_fetch_or(&m->resyncing, 1u << leg);
	atomic_fetch_and(&m->failed, ~(1u << leg));
	log_info("cache %s: resyncing %s from %s (%llu MiB)", cs->name, newdev->name, cs->legs[src]->name,
		 (unsigned long long)((rs->end - rs->pos) >> 20));
	atomic_fetch_add(&cs->bg_inflight, 1); /* shutdown waits for the copy to stop */
	if (worker_post(worker_get(0), resync_start, rs) < 0) {
		atomic_fetch_sub(&cs->bg_inflight, 1);
		snprintf(err, errlen, "cache %s: out of memory", cs->name);
		return -1;
	}
	return 0;
}

/*
 * Main (control) thread. tierctl's `leg replace SET OLD NEW`: find the leg
 * by its path, open (creating a file of the right size if missing) the new
 * one, and start the resync. 0, or -1 with a sentence in err.
 */
int cache_set_leg_replace_path(struct cache_set *cs, const char *old_path, const char *new_path, char *err,
			       size_t errlen)
{
	int leg = -1;
	for (int i = 0; i < cs->mirror.nlegs; i++)
		if (!strcmp(cs->legs[i]->name, old_path))
			leg = i;
	if (leg < 0) {
		snprintf(err, errlen, "cache %s has no leg %s; its legs are %s%s%s", cs->name, old_path,
			 cs->legs[0]->name, cs->mirror.nlegs > 1 ? " and " : "",
			 cs->mirror.nlegs > 1 ? cs->legs[1]->name : "");
		return -1;
	}
	uint32_t late = leg_guard_unanswered(cs->legs[leg]);
	if (late && !strcmp(old_path, new_path)) {
		snprintf(err, errlen, "cache %s: leg %s still has %u request(s) it never answered, and may yet "
			 "write them: rebuilding onto the same device now could be overwritten by them; replace "
			 "it with another device, or restart the daemon first", cs->name, old_path, late);
		return -1;
	}
	struct bdev *dev = bdev_file_open(new_path, cs->lay.leg_size, CACHE_SECTOR, true, err, errlen);
	if (!dev)
		return -1;
	if (cs->cfg.leg_timeout_ms) {
		struct bdev *g = leg_guard_wrap(dev, cs->cfg.leg_timeout_ms, cache_leg_timed_out, cs);
		if (!g) {
			bdev_close(dev);
			snprintf(err, errlen, "cache %s: out of memory", cs->name);
			return -1;
		}
		dev = g;
	}
	if (cache_set_leg_replace(cs, leg, dev, err, errlen) < 0) {
		bdev_close(dev);
		return -1;
	}
	return 0;
}
