/*
 * cleaner.c - destage dirty extents to the backing store.
 *
 * Write-back keeps the newest data on the legs; the cleaner copies dirty
 * blocks to the backing store so the slots become clean (evictable) and a
 * flush or mode switch can finish. Three concerns:
 *
 *  - Order: dirty slots are gathered in batches (up to CLEAN_BATCH), sorted
 *    by key (backing id, then extent = LBA order), and destaged in that
 *    order; within an extent each maximal dirty run is one backing write, so
 *    adjacent dirty blocks are coalesced.
 *  - Rate: a proportional-integral controller in the manner of bcache's
 *    writeback rate: the error is dirty bytes minus the target (dirty_target
 *    percent of the cache); rate = error / 40 + integral / 10000 per
 *    second, never below a trickle while anything is dirty. When foreground
 *    I/O has been idle for 2 s, or a flush was asked for, the limit is
 *    lifted. At most CLEAN_OPS extents are in flight, so foreground I/O is
 *    never starved of queue depth.
 *  - Foreground first: while the host has commands in flight, or had in
 *    the last FG_RECENT_MS, at most CLEAN_OPS_BUSY extent is destaged at a
 *    time and at most CLEAN_BYTES_BUSY of it (runs clipped to fit); the
 *    rest of its dirty runs wait for the next pass. A host read then
 *    queues behind one or a few short destage requests at the legs, not
 *    behind a hundred (a flush with no cap took QD1 read p99 of cached data
 *    from 0.28 to 1.0 ms on file legs; tests/bench/flush_foreground.sh),
 *    and a flush under load still moves on. Its reads of the legs are
 *    background reads (MIRROR_F_BG): all on one leg, and a host's read
 *    goes to the other leg while one is in flight, so with two drives it
 *    queues behind none.
 *  - Yielding to the host: the volumes time every read that hits
 *    (cache_set.hit_lat_*), marking those no destage overlapped
 *    (destage_state) and counting those slower than YIELD_SLOW_X quiet
 *    means. Every YIELD_WINDOW_US (longer until YIELD_MIN_HITS came) the
 *    cleaner compares the window's mean with the quiet mean (which falls
 *    fast and rises slowly, as quiet hits just after a destage may still
 *    meet its traces), and over each YIELD_TAIL_HITS hits the share of
 *    slow ones with the quiet share. Mean over YIELD_PCT (and
 *    YIELD_SLACK_NS), or the slow share over the quiet one by
 *    YIELD_TAIL_PERMILLE: the pause it takes after each destage while the
 *    host is busy doubles, from one destage's length to YIELD_GAP_MAX_OPS
 *    such lengths or YIELD_GAP_MAX_US, whichever is less (so a flush
 *    always keeps a share of the time), a timeout in worker 0's ring
 *    ending it. Otherwise, or with too few hits to judge (a host
 *    that only writes), a quarter of the pause goes. So on a disk the
 *    destage shares with the host's reads, a flush slows to what the
 *    reads bear (tests/bench/flush_foreground.sh: QD1 hits' p99 during a
 *    flush with no cap 1.2-1.55x idle on file legs, was 1.55-2.1x; the
 *    flush then moves 24-49 MB/s under the reads instead of 150), and
 *    where it does not touch their path (two drives, a backing array)
 *    the pause decays to none. Above the dirty target the
 *    limit is off: the cache filling up hurts the host more. The admin's caps (destage_max in bytes
 *    and destage_max_iops in backing writes per second, cleaner_set_max)
 *    hold always, a flush included: each second's budget is the smaller of
 *    the rate and the cap, and what one second overspent (a destage is
 *    started whole) is taken from the next.
 *  - Correctness under overwrite: a destage snapshots the slot's write
 *    generation under the slot lock (skipping slots with writes in flight)
 *    and marks the runs clean only if no write started since; the CLEAN
 *    records are journaled like any other change. A slot being destaged
 *    carries SB_DESTAGING so UNMAP and write-around wait rather than let
 *    old data land on the backing store after them.
 *
 * Threading: everything here runs on worker 0 (the set's tick and the
 * completions of the I/O it submits). cleaner_stats: any thread.
 */
#include "cache/cache_int.h"

#include "common/bufpool.h"
#include "common/log.h"

#include <liburing.h>
#include <stdlib.h>
#include <string.h>

#define CLEAN_OPS 4
#define CLEAN_RUNS 32
#define CLEAN_OPS_BUSY 1
#define CLEAN_BYTES_BUSY (128u << 10)
#define FG_RECENT_MS 100
#define YIELD_WINDOW_US 100000  /* the host's hits are judged this often */
#define YIELD_MIN_HITS 16       /* fewer in a window (up to 10 windows): no verdict yet */
#define YIELD_PCT 120           /* their mean may be this much of the quiet mean */
#define YIELD_SLACK_NS 2000     /* ... plus this (the hits are timed in whole microseconds) */
#define YIELD_GAP_MAX_US 200000 /* the longest pause after a destage */
#define YIELD_GAP_MAX_OPS 16    /* and at most this many destages' length: a flush keeps moving */
#define YIELD_SLOW_X 4          /* a hit slower than this many quiet means is slow */
#define YIELD_TAIL_HITS 500     /* the share of slow hits is judged over this many */
#define YIELD_TAIL_PERMILLE 5   /* it may exceed the quiet share by this much */
#define CLEAN_BATCH 4096
#define CLEAN_MIN_RATE (256u << 10)
#define CLEAN_MAX_RATE (1ull << 40)

struct destage {
	struct cleaner *c;
	bool busy;
	uint32_t slot;
	uint64_t key;
	struct cache_vol *v;
	uint32_t wgen0;
	uint32_t nruns;
	uint32_t first[CLEAN_RUNS], count[CLEAN_RUNS];
	uint8_t *buf;
	struct iovec iov[CLEAN_RUNS];
	struct bdev_req req[CLEAN_RUNS];
	struct cjw {
		struct jwait jw;
		struct destage *d;
	} jw[CLEAN_RUNS];
	int pending;
	int err;
	int stage;
	uint64_t bytes;
	uint64_t t0_us;
	bool clipped;     /* dirty runs were left after next_at (the byte or run cap) */
	uint32_t next_at; /* the block the rest of the slot starts at */
};

struct dirty_ent {
	uint64_t key;
	uint32_t slot;
};

struct cleaner {
	struct cache_set *cs;
	_Atomic uint64_t rate;
	_Atomic uint64_t max_bps;   /* destage_max: bytes per second, 0 = no cap */
	_Atomic uint32_t max_iops;  /* destage_max_iops: backing writes per second, 0 = no cap */
	int64_t ops_budget;         /* backing writes left this second (with max_iops) */
	uint64_t dirty_target_bytes; /* the dirty target in bytes, as of the last tick */
	_Atomic int inflight;
	double integral;
	int64_t budget;
	bool unlimited;
	bool stalled;           /* a destage failed: no new one before the next tick */
	uint64_t settle_at;     /* next look for failing LUNs with nothing dirty (settle) */
	struct dirty_ent *order;
	uint32_t norder, pos, scan;
	/* order[pos] was clipped: its rest (from block resume_at) comes before order[pos + 1] */
	bool resume;
	uint32_t resume_at;
	struct destage ops[CLEAN_OPS];
	/* yielding to the host (see the top of the file) */
	uint64_t quiet_ns;      /* mean latency of hits no destage overlapped (smoothed); 0: not known */
	uint64_t gap_us;        /* the pause after each destage while the host is busy */
	uint64_t resume_us;     /* no destage before this while the host is busy */
	uint64_t window_us;     /* the current window's start */
	uint64_t op_us;         /* how long the last destage took */
	uint64_t tail_n, tail_slow;   /* hits and slow hits since the tail was last judged */
	uint64_t qtail_n, qtail_slow; /* the same of the quiet ones */
	uint64_t quiet_slow_pm;       /* slow quiet hits per mille (smoothed) */
	_Atomic uint64_t shown_gap_us, shown_quiet_us; /* the two above, for status */
	_Atomic uint64_t pauses; /* pauses taken (their timeouts fired) */
	_Atomic bool timer_armed;
	struct io_op timer;
	struct __kernel_timespec ts;
};

static void pump(struct cleaner *c);

static void op_end(struct destage *d)
{
	struct cleaner *c = d->c;
	struct cache_set *cs = c->cs;
	if (d->buf)
		buf_put(d->buf, cs->lay.extent_size);
	d->buf = NULL;
	cache_vol_release(d->v);
	d->busy = false;
	uint64_t now = now_us();
	c->op_us = now - d->t0_us;
	c->resume_us = now + c->gap_us;
	atomic_fetch_sub(&cs->destage_state, 1);
	atomic_fetch_sub(&c->inflight, 1);
	pump(c);
}

void cache_slot_wait(struct cache_set *cs, uint32_t s, struct slot_wait *w)
{
	w->slot = s;
	w->w = worker_self();
	pthread_mutex_lock(&cs->dwait_lock);
	w->next = cs->dwait;
	cs->dwait = w;
	pthread_mutex_unlock(&cs->dwait_lock);
}

/*
 * SB_DESTAGING (worker 0) or SB_TOPUP_WR (any worker) of slot s cleared:
 * hand the waiters whose bits are clear back to their workers. A waiter
 * parked under the slot lock while its bit was set, so it is on the list
 * by now; if its bit was set again since, whoever set it clears it and
 * wakes it later.
 */
void cache_slot_wake(struct cache_set *cs, uint32_t s)
{
	struct slot_wait *list = NULL;
	pthread_mutex_lock(&cs->dwait_lock);
	uint32_t bits = atomic_load(&cs->slots[s].bits);
	for (struct slot_wait **pp = &cs->dwait; *pp;) {
		struct slot_wait *w = *pp;
		if (w->slot == s && !(bits & w->mask)) {
			*pp = w->next;
			w->next = list;
			list = w;
		} else {
			pp = &w->next;
		}
	}
	pthread_mutex_unlock(&cs->dwait_lock);
	while (list) {
		struct slot_wait *w = list;
		list = w->next;
		worker_post_call(w->w, &w->call, w->fn, w->arg);
	}
}

static void clear_destaging(struct cache_set *cs, uint32_t s)
{
	struct slot *sl = &cs->slots[s];
	slot_lock(sl);
	atomic_fetch_and(&sl->bits, ~SB_DESTAGING);
	slot_unlock(sl);
	cache_slot_wake(cs, s);
}

static void recorded(struct jwait *w, int err)
{
	struct destage *d = caa_container_of(w, struct cjw, jw)->d;
	if (--d->pending)
		return;
	atomic_fetch_add(&d->c->cs->st.destaged_bytes, d->bytes);
	op_end(d);
}

static void step(struct bdev_req *req, int err)
{
	struct destage *d = req->priv;
	struct cache_set *cs = d->c->cs;

	if (err && !d->err)
		d->err = err;
	if (--d->pending)
		return;
	if (d->err) {
		/*
		 * Retried at once, a range the legs cannot read would fail at once
		 * again, for ever, and hold worker 0: wait for the next tick. A
		 * backing store that refuses writes (out of space, say) waits
		 * longer, by itself, while the other LUNs' data keeps going.
		 */
		if (d->stage == 2)
			cache_vol_destage_failed(d->v, d->err);
		else
			d->c->stalled = true;
		clear_destaging(cs, d->slot);
		op_end(d);
		return;
	}
	if (d->stage == 2)
		cache_vol_destage_works(d->v);
	if (d->stage == 1) {
		/* read from the legs done: write every run to the backing store */
		d->stage = 2;
		d->pending = (int)d->nruns;
		uint64_t base = key_ext(d->key) * cs->lay.extent_size;
		for (uint32_t i = 0; i < d->nruns; i++) {
			d->req[i] = (struct bdev_req){
				.op = BDEV_WRITE,
				.flags = BDEV_F_FUA,
				.offset = base + (uint64_t)d->first[i] * CACHE_SECTOR,
				.len = (uint64_t)d->count[i] * CACHE_SECTOR,
				.iov = &d->iov[i],
				.iovcnt = 1,
				.done = step,
				.priv = d,
			};
			bdev_submit(cache_vol_backing(d->v), &d->req[i]);
		}
		return;
	}
	/* backing writes durable: clean the runs unless a write started since */
	struct slot *sl = &cs->slots[d->slot];
	slot_lock(sl);
	uint32_t wgen = atomic_load(&sl->bits) >> SB_WGEN_SHIFT;
	bool same = wgen == d->wgen0;
	if (same)
		for (uint32_t i = 0; i < d->nruns; i++)
			cache_record_locked(cs, d->slot, d->key, JOP_CLEAN, d->first[i], d->count[i], &d->jw[i].jw);
	atomic_fetch_and(&sl->bits, ~SB_DESTAGING);
	slot_unlock(sl);
	cache_slot_wake(cs, d->slot);
	if (!same) {
		op_end(d);
		return;
	}
	d->stage = 3;
	d->pending = (int)d->nruns;
	for (uint32_t i = 0; i < d->nruns; i++) {
		d->jw[i].d = d;
		d->jw[i].jw.done = recorded;
		journal_append(cs, &d->jw[i].jw);
	}
}

static bool start_held(struct cleaner *c, struct destage *d, uint32_t s, uint64_t key, struct cache_vol *v,
		       uint64_t max_bytes, uint32_t from)
{
	struct cache_set *cs = c->cs;
	struct slot *sl = &cs->slots[s];
	if (atomic_load(&cs->bypass[bypass_bucket(key)]))
		return false;
	slot_lock(sl);
	uint32_t bits = atomic_load(&sl->bits);
	if ((bits & SB_STATE_MASK) != SB_READY || !(bits & SB_DIRTY) || (bits & SB_DESTAGING) ||
	    (atomic_load(&sl->users) >> 16) || atomic_load(&sl->key) != key) {
		slot_unlock(sl);
		return false;
	}
	d->nruns = 0;
	uint32_t at = from, n;
	uint64_t room = max_bytes / CACHE_SECTOR; /* sectors this destage may still take */
	while (d->nruns < CLEAN_RUNS && room && slot_next_dirty_run(cs, s, &at, &n)) {
		if (n > room)
			n = (uint32_t)room; /* the rest of the run stays dirty for the next pass */
		room -= n;
		d->first[d->nruns] = at;
		d->count[d->nruns] = n;
		d->nruns++;
		at += n;
	}
	d->next_at = at;
	uint32_t more = at, mn;
	d->clipped = d->nruns && slot_next_dirty_run(cs, s, &more, &mn);
	if (!d->nruns) {
		slot_unlock(sl);
		return false;
	}
	atomic_fetch_or(&sl->bits, SB_DESTAGING);
	d->wgen0 = bits >> SB_WGEN_SHIFT;
	slot_unlock(sl);

	d->buf = buf_get(cs->lay.extent_size);
	if (!d->buf) {
		clear_destaging(cs, s);
		return false;
	}
	d->busy = true;
	d->c = c;
	d->slot = s;
	d->key = key;
	d->v = v;
	d->err = 0;
	d->stage = 1;
	d->bytes = 0;
	d->pending = (int)d->nruns;
	d->t0_us = now_us();
	atomic_fetch_add(&c->inflight, 1);
	atomic_fetch_add(&cs->destage_state, (1u << 8) + 1);
	for (uint32_t i = 0; i < d->nruns; i++) {
		uint64_t off = (uint64_t)d->first[i] * CACHE_SECTOR, len = (uint64_t)d->count[i] * CACHE_SECTOR;
		d->bytes += len;
		d->iov[i].iov_base = d->buf + off;
		d->iov[i].iov_len = len;
		d->req[i] = (struct bdev_req){
			.op = BDEV_READ,
			.flags = MIRROR_F_BG,
			.offset = slot_leg_off(cs, s) + off,
			.len = len,
			.iov = &d->iov[i],
			.iovcnt = 1,
			.done = step,
			.priv = d,
		};
		bdev_submit(&cs->mirror.dev, &d->req[i]);
	}
	c->budget -= (int64_t)d->bytes;
	c->ops_budget -= (int64_t)d->nruns;
	return true;
}

/*
 * Destage (up to max_bytes of) slot s from block `from` on with d, holding
 * its volume meanwhile; false if not started.
 */
static bool start(struct cleaner *c, struct destage *d, uint32_t s, uint64_t max_bytes, uint32_t from)
{
	struct cache_set *cs = c->cs;
	uint64_t key = atomic_load(&cs->slots[s].key);
	if (key == CACHE_KEY_NONE)
		return false;
	rcu_read_lock(); /* vol_close waits a grace period before it counts holds */
	struct cache_vol *v = cache_vol_of(cs, key_bid(key));
	if (v)
		cache_vol_hold(v);
	rcu_read_unlock();
	if (!v)
		return false; /* its LUN is not attached this run */
	if (cache_vol_destage_waits(v)) {
		cache_vol_release(v); /* its backing store refused the last one: not yet */
		return false;
	}
	if (start_held(c, d, s, key, v, max_bytes, from))
		return true;
	cache_vol_release(v);
	return false;
}

static int ent_cmp(const void *a, const void *b)
{
	const struct dirty_ent *x = a, *y = b;
	return x->key < y->key ? -1 : x->key > y->key;
}

/* Gather up to CLEAN_BATCH dirty slots (continuing where the last scan stopped), sorted by key. */
static void gather(struct cleaner *c)
{
	struct cache_set *cs = c->cs;
	uint32_t n = cs->lay.nslots;
	c->norder = 0;
	c->pos = 0;
	c->resume = false;
	for (uint32_t k = 0; k < n && c->norder < CLEAN_BATCH; k++) {
		uint32_t s = (c->scan + k) % n;
		uint32_t bits = atomic_load(&cs->slots[s].bits);
		if ((bits & SB_STATE_MASK) == SB_READY && (bits & SB_DIRTY)) {
			c->order[c->norder].key = atomic_load(&cs->slots[s].key);
			c->order[c->norder].slot = s;
			c->norder++;
		}
		if (k + 1 == n || c->norder == CLEAN_BATCH)
			c->scan = (c->scan + k + 1) % n;
	}
	qsort(c->order, c->norder, sizeof(*c->order), ent_cmp);
}

/*
 * Judge the window that ended: the host's hits against their quiet mean.
 * Slower by more than YIELD_PCT: the pause after each destage doubles (from
 * one destage's length); within it, or with too few hits to tell (a host
 * that writes only), a quarter of the pause goes.
 */
static void yield_judge(struct cleaner *c, uint64_t now)
{
	struct cache_set *cs = c->cs;
	const uint64_t mask = (1ull << HIT_LAT_SHIFT) - 1;
	if (now - c->window_us < YIELD_WINDOW_US)
		return;
	uint64_t all = atomic_load(&cs->hit_lat_all), quiet = atomic_load(&cs->hit_lat_quiet);
	uint64_t nall = all >> HIT_LAT_SHIFT, nquiet = quiet >> HIT_LAT_SHIFT;
	if (nall < YIELD_MIN_HITS && now - c->window_us < 10 * YIELD_WINDOW_US)
		return; /* too few hits to judge: a longer window */
	/* taken by subtraction: what the workers add meanwhile stays for the next window */
	uint64_t slow = atomic_load(&cs->hit_slow_all), qslow = atomic_load(&cs->hit_slow_quiet);
	atomic_fetch_sub(&cs->hit_lat_all, all);
	atomic_fetch_sub(&cs->hit_lat_quiet, quiet);
	atomic_fetch_sub(&cs->hit_slow_all, slow);
	atomic_fetch_sub(&cs->hit_slow_quiet, qslow);
	c->window_us = now;
	if (nquiet >= YIELD_MIN_HITS) {
		uint64_t q = (quiet & mask) * 1000 / nquiet;
		/* down faster than up: quiet hits just after a destage may still meet its traces */
		if (!c->quiet_ns)
			c->quiet_ns = q;
		else if (q < c->quiet_ns)
			c->quiet_ns -= (c->quiet_ns - q) / 4;
		else
			c->quiet_ns += (q - c->quiet_ns) / 16;
		atomic_store_explicit(&cs->hit_slow_us, c->quiet_ns * YIELD_SLOW_X / 1000, memory_order_relaxed);
	}
	/* the tail: the share of slow hits, over YIELD_TAIL_HITS at least */
	bool tail_bad = false;
	c->tail_n += nall;
	c->tail_slow += slow;
	c->qtail_n += nquiet;
	c->qtail_slow += qslow;
	if (c->qtail_n >= YIELD_TAIL_HITS) {
		uint64_t pm = c->qtail_slow * 1000 / c->qtail_n;
		c->quiet_slow_pm = c->quiet_slow_pm ? c->quiet_slow_pm - c->quiet_slow_pm / 4 + pm / 4 : pm;
		c->qtail_n = c->qtail_slow = 0;
	}
	if (c->tail_n >= YIELD_TAIL_HITS) {
		tail_bad = c->tail_slow * 1000 > c->tail_n * (c->quiet_slow_pm + YIELD_TAIL_PERMILLE);
		c->tail_n = c->tail_slow = 0;
	}
	uint64_t mean = nall ? (all & mask) * 1000 / nall : 0, step = c->op_us ? c->op_us : 1000;
	if (nall >= YIELD_MIN_HITS &&
	    (!c->quiet_ns || tail_bad || mean * 100 > c->quiet_ns * YIELD_PCT + YIELD_SLACK_NS * 100)) {
		uint64_t most = step * YIELD_GAP_MAX_OPS < YIELD_GAP_MAX_US ? step * YIELD_GAP_MAX_OPS : YIELD_GAP_MAX_US;
		c->gap_us = c->gap_us ? c->gap_us * 2 : step;
		if (c->gap_us > most)
			c->gap_us = most;
	} else if (c->gap_us) {
		c->gap_us -= c->gap_us / 4;
		if (c->gap_us < step / 8 || c->gap_us < 2)
			c->gap_us = 0;
	}
	atomic_store_explicit(&c->shown_gap_us, c->gap_us, memory_order_relaxed);
	atomic_store_explicit(&c->shown_quiet_us, c->quiet_ns / 1000, memory_order_relaxed);
}

static void yield_fired(struct io_op *op, int res)
{
	(void)res; /* -ETIME: the pause is over */
	struct cleaner *c = caa_container_of(op, struct cleaner, timer);
	atomic_fetch_add_explicit(&c->pauses, 1, memory_order_relaxed);
	atomic_store(&c->timer_armed, false);
	pump(c);
}

/* Pump again in us microseconds (worker 0's ring). */
static void yield_arm(struct cleaner *c, uint64_t us)
{
	if (atomic_load(&c->timer_armed))
		return;
	atomic_store(&c->timer_armed, true);
	c->ts.tv_sec = (long long)(us / 1000000);
	c->ts.tv_nsec = (long long)(us % 1000000) * 1000;
	c->timer.done = yield_fired;
	struct io_uring_sqe *sqe = worker_sqe();
	io_uring_prep_timeout(sqe, &c->ts, 0, 0);
	io_uring_sqe_set_data(sqe, &c->timer);
}

static void pump(struct cleaner *c)
{
	struct cache_set *cs = c->cs;
	if (atomic_load(&cs->stopping) && !atomic_load(&cs->flush_req))
		return;
	/*
	 * With every leg gone the dirty data is lost: a destage could only
	 * fail at once (posted back to this worker) and start the next one,
	 * for ever while the rate is unlimited, and worker 0 would serve
	 * nothing else, the portal's listeners included.
	 */
	if (mirror_all_failed(&cs->mirror) || c->stalled)
		return;
	bool regathered = false;
	bool capped = atomic_load(&c->max_bps) || atomic_load(&c->max_iops);
	/* foreground first, unless the cache is filling up: see the top of the file */
	uint64_t last = atomic_load(&cs->last_io_ms); /* before the clock: another worker may move it on */
	bool host = atomic_load(&cs->fg_inflight) || (int64_t)(now_ms() - last) < FG_RECENT_MS;
	if (host && c->dirty_target_bytes && atomic_load(&cs->dirty_blocks) * CACHE_SECTOR > c->dirty_target_bytes)
		host = false;
	int max_ops = host ? CLEAN_OPS_BUSY : CLEAN_OPS;
	uint64_t max_bytes = host ? CLEAN_BYTES_BUSY : UINT64_MAX;
	if (host) {
		uint64_t now = now_us();
		yield_judge(c, now);
		if (c->gap_us && now < c->resume_us && atomic_load(&cs->dirty_blocks)) {
			yield_arm(c, c->resume_us - now);
			return;
		}
	}
	while (atomic_load(&c->inflight) < max_ops &&
	       (c->unlimited || (!capped && atomic_load(&cs->flush_req)) ||
		(c->budget > 0 && (!atomic_load(&c->max_iops) || c->ops_budget > 0)))) {
		if (c->pos >= c->norder) {
			if (regathered || !atomic_load(&cs->dirty_blocks))
				return;
			gather(c);
			regathered = true;
			if (!c->norder)
				return;
		}
		struct destage *d = NULL;
		for (int i = 0; i < CLEAN_OPS; i++)
			if (!c->ops[i].busy) {
				d = &c->ops[i];
				break;
			}
		if (!d)
			return;
		/*
		 * A slot clipped by the busy host's caps is finished before the
		 * next one in the list (its destage ends first: this pump comes
		 * again then), from where the last part stopped, so a host
		 * rewriting its start cannot hold the cleaner on it. Left until the
		 * next gather, the rest would wait behind every extent after it, of
		 * any LUN: a detach of one LUN (tierctl detach) would wait for the
		 * others. (With the host quiet only CLEAN_RUNS clips, and other
		 * destages go on beside it: the rest waits for the next gather.)
		 */
		uint32_t s = c->order[c->pos].slot, from = 0;
		if (c->resume) {
			if (atomic_load(&cs->slots[s].bits) & SB_DESTAGING)
				return;
			from = c->resume_at;
		}
		c->resume = false;
		c->pos++;
		if (start(c, d, s, max_bytes, from) && d->clipped && host && d->next_at < cs->lay.bpe) {
			c->pos--;
			c->resume = true;
			c->resume_at = d->next_at;
			return;
		}
	}
}

/*
 * A LUN whose destage fails ends that state after DESTAGE_OK_RUN good
 * destages in a row; one left with fewer dirty extents than that (the
 * host overwrote or unmapped them, or the last ones landed) would stay
 * "failing" for ever, and in write-back keep sending new writes around
 * the cache (mode_wb.c). Every 5 s while some LUN fails, look for dirty
 * slots of each; a failing LUN with none is settled.
 */
static void settle(struct cleaner *c)
{
	struct cache_set *cs = c->cs;
	uint64_t now = now_ms();
	if (now < c->settle_at)
		return;
	c->settle_at = now + 5000;
	bool failing[CACHE_SET_MAX_VOLS] = { 0 }, dirty[CACHE_SET_MAX_VOLS] = { 0 }, any = false;
	rcu_read_lock();
	for (uint32_t b = 0; b < CACHE_SET_MAX_VOLS; b++) {
		struct cache_vol *v = cache_vol_of(cs, b);
		int err;
		uint64_t n, in;
		if (!v)
			continue;
		cache_vol_destage_state(v, &err, &n, &in);
		failing[b] = err != 0;
		any |= failing[b];
	}
	rcu_read_unlock();
	if (!any)
		return;
	for (uint32_t s = 0; s < cs->lay.nslots; s++) {
		uint32_t bits = atomic_load_explicit(&cs->slots[s].bits, memory_order_relaxed);
		if ((bits & SB_STATE_MASK) != SB_READY || !(bits & SB_DIRTY))
			continue;
		uint64_t key = atomic_load_explicit(&cs->slots[s].key, memory_order_relaxed);
		if (key != CACHE_KEY_NONE && key_bid(key) < CACHE_SET_MAX_VOLS)
			dirty[key_bid(key)] = true;
	}
	for (uint32_t b = 0; b < CACHE_SET_MAX_VOLS; b++) {
		if (!failing[b] || dirty[b])
			continue;
		rcu_read_lock();
		struct cache_vol *v = cache_vol_of(cs, b);
		if (v)
			cache_vol_hold(v);
		rcu_read_unlock();
		if (v) {
			cache_vol_destage_idle(v);
			cache_vol_release(v);
		}
	}
}

/* Worker 0, once a second: new rate, new budget, start destaging. */
void cleaner_tick(struct cleaner *c)
{
	struct cache_set *cs = c->cs;
	uint64_t dirty = atomic_load(&cs->dirty_blocks) * CACHE_SECTOR;
	uint64_t cap = (uint64_t)cs->lay.nslots * cs->lay.extent_size;
	uint32_t pct = cs->cfg.dirty_target ? cs->cfg.dirty_target : 10;
	double target = (double)cap * pct / 100.0;
	double error = (double)dirty - target;
	c->dirty_target_bytes = (uint64_t)target;
	uint64_t last = atomic_load(&cs->last_io_ms); /* before the clock (see pump) */
	bool idle = (int64_t)(now_ms() - last) > 2000 && !atomic_load(&cs->fg_inflight);

	if (error < 0)
		c->integral *= 0.5;
	else
		c->integral += error;
	if (c->integral > target * 100)
		c->integral = target * 100;
	double rate = error / 40.0 + c->integral / 10000.0;
	if (rate < CLEAN_MIN_RATE)
		rate = CLEAN_MIN_RATE;
	uint64_t max_bps = atomic_load(&c->max_bps);
	uint32_t max_iops = atomic_load(&c->max_iops);
	bool capped = max_bps || max_iops;
	c->unlimited = (idle || atomic_load(&cs->flush_req)) && !capped;
	if (idle || atomic_load(&cs->flush_req))
		rate = (double)CLEAN_MAX_RATE;
	if (max_bps && rate > (double)max_bps)
		rate = (double)max_bps;
	atomic_store(&c->rate, dirty ? (uint64_t)rate : 0);
	/* what a capped second overspent comes out of the next */
	int64_t carry = max_bps && c->budget < 0 ? c->budget : 0;
	c->budget = dirty ? carry + (int64_t)(rate > 1e12 ? 1e12 : rate) : 0;
	c->ops_budget = (max_iops && c->ops_budget < 0 ? c->ops_budget : 0) + max_iops;
	c->stalled = false;
	yield_judge(c, now_us()); /* also when the host is idle: the sums must not grow for ever */
	settle(c);
	pump(c);
}

/* Any thread: the admin's caps, taken at the next tick (0 = none). */
void cleaner_set_max(struct cleaner *c, uint64_t bps, uint32_t iops)
{
	atomic_store(&c->max_bps, bps);
	atomic_store(&c->max_iops, iops);
}

void cleaner_get_max(struct cleaner *c, uint64_t *bps, uint32_t *iops)
{
	*bps = atomic_load(&c->max_bps);
	*iops = atomic_load(&c->max_iops);
}

/* Any thread. */
void cleaner_yield_stats(struct cleaner *c, uint64_t *pause_us, uint64_t *quiet_us, uint64_t *pauses)
{
	*pauses = atomic_load_explicit(&c->pauses, memory_order_relaxed);
	*pause_us = atomic_load_explicit(&c->shown_gap_us, memory_order_relaxed);
	*quiet_us = atomic_load_explicit(&c->shown_quiet_us, memory_order_relaxed);
}

/* Any thread. */
void cleaner_stats(struct cleaner *c, uint64_t *rate_bps, uint64_t *busy)
{
	*rate_bps = atomic_load(&c->rate);
	*busy = (uint64_t)atomic_load(&c->inflight) + atomic_load(&c->timer_armed);
}

/* Main thread. */
struct cleaner *cleaner_new(struct cache_set *cs)
{
	struct cleaner *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->cs = cs;
	c->order = calloc(CLEAN_BATCH, sizeof(*c->order));
	if (!c->order) {
		free(c);
		return NULL;
	}
	return c;
}

void cleaner_free(struct cleaner *c)
{
	free(c->order);
	free(c);
}
