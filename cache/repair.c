/*
 * repair.c - rewrite what a leg could not read from the other leg, as md does.
 *
 * A read error on one leg (a latent sector error: -ENODATA or -EIO on that
 * range only) is not a dead leg. The mirror serves the read from the other leg and
 * hands the range here (cache_repair_note, any worker); the set's tick
 * (worker 0) then reads the range from the good leg and writes it back to
 * the failing one, which a drive remaps on write. The leg is failed only if
 * that rewrite fails, if more ranges wait than REPAIR_MAX (a leg erring
 * that much is dying, and failing it stops the retries), or if more than
 * max_read_errors ranges were noted within an hour (a leg whose reads keep
 * failing although its rewrites succeed).
 *
 * Safety against writers is the top-up's (volume.c): the repair takes
 * SB_TOPUP so no top-up or other repair runs on the slot, starts only while
 * no writer holds a pin, and checks the slot's write generation after the
 * read and before the write, with SB_TOPUP_WR set so writers park meanwhile.
 * So the rewrite carries exactly what the good leg holds now; a crash in the
 * middle leaves each sector of the failing leg either still unreadable or
 * equal to the good leg, never a third version (no write intent needed).
 *
 * Threading: cache_repair_note on any worker (a short mutex, no I/O);
 * cache_repair_tick and the I/O completions on worker 0.
 */
#include "cache/cache_int.h"

#include "common/bufpool.h"
#include "common/log.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct repair {
	struct cache_set *cs;
	uint32_t slot;
	uint32_t first, count;
	int leg;
	uint32_t wgen0;
	uint8_t *buf;
	struct iovec iov;
	struct bdev_req req;
};

/*
 * max_read_errors: a leg that keeps returning read errors although every
 * rewrite succeeds (a drive that can no longer remap, or that fails reads
 * for another reason) would otherwise stay in service for good, each read
 * of it retried on the other leg. Like md's max_read_errors, more than
 * that many ranges queued for a rewrite within an hour fail the leg.
 * repair_lock held.
 */
static bool read_errors_exceeded(struct cache_set *cs, int leg, uint32_t *n)
{
	uint32_t max = cs->cfg.max_read_errors;
	uint64_t now = now_ms();
	if (cs->repair.read_err_dev[leg] != cs->legs[leg] || now - cs->repair.read_err_since[leg] >= 3600u * 1000u) {
		cs->repair.read_err_dev[leg] = cs->legs[leg]; /* a replaced leg starts again */
		cs->repair.read_err_since[leg] = now;
		cs->repair.read_errs[leg] = 0;
	}
	*n = ++cs->repair.read_errs[leg];
	return max && *n > max;
}

int cache_repair_note(struct mirror *m, int leg, uint64_t off, uint64_t len, void *arg)
{
	struct cache_set *cs = arg;
	(void)m;
	int rc = 0;
	uint32_t nerr = 0;
	bool too_many = false;
	pthread_mutex_lock(&cs->repair.lock);
	bool dup = false;
	for (int i = 0; i < cs->repair.n; i++)
		if (cs->repair.q[i].leg == leg && cs->repair.q[i].off == off && cs->repair.q[i].len == len)
			dup = true;
	if (!dup) {
		if (cs->repair.n == REPAIR_MAX)
			rc = -1;
		else if ((too_many = read_errors_exceeded(cs, leg, &nerr)))
			rc = -1;
		else
			cs->repair.q[cs->repair.n++] = (struct repair_ent){ off, len, leg };
	}
	pthread_mutex_unlock(&cs->repair.lock);
	if (too_many)
		log_err("cache %s: leg %s: %u unreadable ranges within an hour (max_read_errors %u); failing it",
			cs->name, cs->legs[leg]->name, nerr, cs->cfg.max_read_errors);
	if (!rc)
		atomic_fetch_add(&cs->st.read_errors, 1);
	return rc;
}

static void repair_end(struct repair *rp)
{
	struct cache_set *cs = rp->cs;
	struct slot *sl = &cs->slots[rp->slot];
	slot_lock(sl);
	atomic_fetch_and(&sl->bits, ~(SB_TOPUP | SB_TOPUP_WR | SB_CANCEL));
	slot_unlock(sl);
	cache_slot_wake(cs, rp->slot);
	atomic_fetch_sub(&sl->users, SU_READER);
	buf_put(rp->buf, (uint64_t)rp->count * CACHE_SECTOR);
	atomic_fetch_sub(&cs->bg_inflight, 1);
	free(rp);
}

static void repair_written(struct bdev_req *req, int err)
{
	struct repair *rp = req->priv;
	struct cache_set *cs = rp->cs;
	if (err) {
		log_err("cache %s: leg %s: rewriting %u unreadable block(s) of slot %u failed (%s)", cs->name,
			cs->mirror.leg[rp->leg]->name, rp->count, rp->slot, strerror(-err));
		mirror_leg_failed(&cs->mirror, rp->leg, err);
	} else {
		atomic_fetch_add(&cs->st.repairs, 1);
		log_warn("cache %s: leg %s: %u block(s) of slot %u that could not be read were rewritten from "
			 "the other leg", cs->name, cs->mirror.leg[rp->leg]->name, rp->count, rp->slot);
	}
	repair_end(rp);
}

static void repair_read(struct bdev_req *req, int err)
{
	struct repair *rp = req->priv;
	struct cache_set *cs = rp->cs;
	struct slot *sl = &cs->slots[rp->slot];
	if (err) {
		repair_end(rp); /* both legs unreadable here: nothing to copy */
		return;
	}
	slot_lock(sl);
	uint32_t bits = atomic_fetch_or(&sl->bits, SB_TOPUP_WR);
	bool moved = (bits >> SB_WGEN_SHIFT) != rp->wgen0 || (bits & SB_STATE_MASK) != SB_READY ||
		     (bits & SB_CANCEL);
	slot_unlock(sl);
	if (moved) {
		repair_end(rp); /* a write came: the next read error asks again */
		return;
	}
	rp->req = (struct bdev_req){
		.op = BDEV_WRITE,
		.flags = BDEV_F_FUA | MIRROR_F_LEG(rp->leg),
		.offset = slot_leg_off(cs, rp->slot) + (uint64_t)rp->first * CACHE_SECTOR,
		.len = rp->iov.iov_len,
		.iov = &rp->iov,
		.iovcnt = 1,
		.done = repair_written,
		.priv = rp,
	};
	bdev_submit(&cs->mirror.dev, &rp->req);
}

/* Worker 0: start one repair; false if the slot is busy (try again next tick). */
static bool repair_start(struct cache_set *cs, const struct repair_ent *e)
{
	struct mirror *m = &cs->mirror;
	int src = 1 - e->leg;
	uint32_t out = atomic_load(&m->failed) | atomic_load(&m->resyncing);
	if (m->nlegs < 2 || (out & (1u << src)) || (out & (1u << e->leg)) || e->off < cs->lay.data_off)
		return true; /* nothing to copy from, or not data: drop it */
	uint64_t rel = e->off - cs->lay.data_off;
	uint32_t s = (uint32_t)(rel / cs->lay.extent_size);
	if (s >= cs->lay.nslots)
		return true;
	uint32_t first = (uint32_t)(rel % cs->lay.extent_size / CACHE_SECTOR);
	uint32_t count = (uint32_t)(e->len / CACHE_SECTOR);
	if (count > cs->lay.bpe - first)
		count = cs->lay.bpe - first;
	struct slot *sl = &cs->slots[s];
	atomic_fetch_add(&sl->users, SU_READER); /* pin first, then look (as pin_lookup) */
	slot_lock(sl);
	uint32_t bits = atomic_load(&sl->bits);
	if ((bits & SB_STATE_MASK) != SB_READY) {
		slot_unlock(sl);
		atomic_fetch_sub(&sl->users, SU_READER);
		return true; /* nothing referenced there any more */
	}
	if ((bits & (SB_TOPUP | SB_DESTAGING)) || atomic_load(&sl->users) >= SU_WRITER) {
		slot_unlock(sl);
		atomic_fetch_sub(&sl->users, SU_READER);
		return false;
	}
	struct repair *rp = calloc(1, sizeof(*rp));
	uint8_t *buf = rp ? buf_get((uint64_t)count * CACHE_SECTOR) : NULL;
	if (!buf) {
		slot_unlock(sl);
		atomic_fetch_sub(&sl->users, SU_READER);
		free(rp);
		return false;
	}
	atomic_fetch_or(&sl->bits, SB_TOPUP);
	slot_unlock(sl);
	atomic_fetch_add(&cs->bg_inflight, 1);
	*rp = (struct repair){ .cs = cs, .slot = s, .first = first, .count = count, .leg = e->leg,
			       .wgen0 = bits >> SB_WGEN_SHIFT, .buf = buf };
	rp->iov.iov_base = buf;
	rp->iov.iov_len = (uint64_t)count * CACHE_SECTOR;
	rp->req = (struct bdev_req){
		.op = BDEV_READ,
		.flags = MIRROR_F_LEG(src),
		.offset = slot_leg_off(cs, s) + (uint64_t)first * CACHE_SECTOR,
		.len = rp->iov.iov_len,
		.iov = &rp->iov,
		.iovcnt = 1,
		.done = repair_read,
		.priv = rp,
	};
	bdev_submit(&m->dev, &rp->req);
	return true;
}

void cache_repair_tick(struct cache_set *cs)
{
	struct repair_ent q[REPAIR_MAX];
	pthread_mutex_lock(&cs->repair.lock);
	int n = cs->repair.n;
	memcpy(q, cs->repair.q, (size_t)n * sizeof(q[0]));
	cs->repair.n = 0;
	pthread_mutex_unlock(&cs->repair.lock);
	for (int i = 0; i < n; i++)
		if (!repair_start(cs, &q[i]) && cache_repair_note(&cs->mirror, q[i].leg, q[i].off, q[i].len, cs) == 0)
			atomic_fetch_sub(&cs->st.read_errors, 1); /* put back, not a new error */
}
