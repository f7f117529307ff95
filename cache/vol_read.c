/*
 * vol_read.c - a piece of a READ: a hit from the legs, a partial hit as
 * runs from the legs and the backing store (and a top-up), a miss from the
 * backing store (and a fill if the policy admits).
 *
 * Threading: on the submitting worker.
 */
#include "cache/cache_int.h"
#include "cache/vol_int.h"

/* ---- reads ------------------------------------------------------------------ */

static void read_sub_done(struct bdev_req *req, int err);

static void read_sub_issue(struct piece *p, struct vsub *s)
{
	struct vreq *r = p->parent;
	struct cache_set *cs = r->v->cs;
	uint64_t in_piece = (uint64_t)(s->first - p->first) * CACHE_SECTOR;
	uint64_t len = (uint64_t)s->count * CACHE_SECTOR;
	s->req = (struct bdev_req){
		.op = BDEV_READ,
		.offset = s->from_cache ? slot_leg_off(cs, p->slot) + (uint64_t)s->first * CACHE_SECTOR
					: p->off + in_piece,
		.len = len,
		.iov = s->iov,
		.iovcnt = s->iovcnt,
		.done = read_sub_done,
		.priv = s,
	};
	bdev_submit(s->from_cache ? &cs->mirror.dev : r->v->backing, &s->req);
}

/* Worker thread (bdev completion). Lock-free, except that a run found
 * lost with every leg gone takes the set's lost_lock (cache_lost_note). */
static void read_sub_done(struct bdev_req *req, int err)
{
	struct vsub *s = req->priv;
	struct piece *p = s->p;
	struct cache_set *cs = p->parent->v->cs;

	if (err && s->from_cache) {
		/* every leg gone, or this range unreadable on every leg still in service */
		if (!slot_any_dirty(cs, p->slot, s->first, s->count)) {
			/* clean copy lost: the backing store has the same data */
			s->from_cache = false;
			read_sub_issue(p, s);
			return;
		}
		atomic_fetch_add(&cs->st.lost_ios, 1);
		cache_lost_note(cs, p->parent->v->bid, p->slot,
				p->off + (uint64_t)(s->first - p->first) * CACHE_SECTOR, s->first, s->count);
		err = -EIO;
	}
	vol_slice_free(s->iov, s->iov_inline);
	POOL_PUT(vsub_free, s);
	piece_sub_done(p, err);
}

static int add_read_sub(struct piece *p, bool from_cache, uint32_t first, uint32_t count)
{
	struct vsub *s = POOL_GET(vsub_free, struct vsub);
	if (!s)
		return -ENOMEM;
	s->p = p;
	s->from_cache = from_cache;
	s->first = first;
	s->count = count;
	uint64_t at = p->data_off + (uint64_t)(first - p->first) * CACHE_SECTOR;
	if (vol_slice_into(p->parent->up, at, (uint64_t)count * CACHE_SECTOR, s->iov_inline, &s->iov,
		       &s->iovcnt) < 0) {
		POOL_PUT(vsub_free, s);
		return -ENOMEM;
	}
	p->pending++;
	read_sub_issue(p, s);
	return 0;
}

/* Worker thread; the RCU read lock is held around the lookup and pin only. */
void piece_read(struct piece *p)
{
	struct cache_vol *v = p->parent->v;
	struct cache_set *cs = v->cs;
	int mode = atomic_load(&v->mode);
	uint32_t st = SB_FREE;

	/* even in pass-through, blocks cached earlier are read from the cache */
	rcu_read_lock();
	st = vol_pin_lookup(cs, p, false);
	rcu_read_unlock();
	p->pending = 1; /* guard while subs are issued */
	if (st == SB_READY) {
		policy_touch(cs->policy, p->slot);
		uint32_t at = p->first, left = p->count;
		bool whole = true;
		while (left) {
			bool valid;
			uint32_t n = slot_valid_run(cs, p->slot, at, left, &valid);
			if (n != p->count || !valid)
				whole = false;
			if (add_read_sub(p, valid, at, n) < 0) {
				p->err = -ENOMEM;
				break;
			}
			at += n;
			left -= n;
		}
		atomic_fetch_add(whole ? &cs->st.read_hits : &cs->st.read_partial, 1);
		p->parent->how |= whole ? VH_HIT : VH_PARTIAL;
		if (!whole && vol_mode(mode)->fills && !mirror_all_failed(&cs->mirror))
			vol_topup_start(v, p->slot, p->key);
	} else {
		atomic_fetch_add(&cs->st.read_misses, 1);
		p->parent->how |= VH_MISS;
		if (add_read_sub(p, false, p->first, p->count) < 0)
			p->err = -ENOMEM;
		if (vol_mode(mode)->fills && !mirror_all_failed(&cs->mirror) &&
		    policy_admit_run(cs->policy, p->key, p->off, &p->run, false))
			vol_fill_start(v, p->key);
	}
	piece_sub_done(p, 0);
}
