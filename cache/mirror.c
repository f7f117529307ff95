/*
 * mirror.c - RAID1 of the cache legs, presented as one bdev.
 *
 * Writes (and flushes) go to every healthy leg; reads go to one healthy leg,
 * alternating. A leg that returns a write error is marked failed and never
 * used again until it is replaced; a write that reached the other leg
 * succeeds. A read error (bdev_err_bad_blocks: -EIO, or the kernel's
 * medium error -ENODATA) is retried on the other leg and the range
 * handed to repair.c to be rewritten on the failing leg (a latent sector
 * error, which a drive remaps on write); the leg fails only if the rewrite
 * does, or if more bad ranges wait than repair.c holds. So one dying leg produces no
 * error upward; only when no leg is left does the engine see -EIO (and
 * volume.c then fails dirty blocks with MEDIUM ERROR and reads clean
 * blocks from the backing store).
 *
 * The subtle part is durability of the failure itself: once leg 1 is
 * failed, writes land on leg 0 only, so leg 1 holds stale data. If the
 * daemon crashed before it recorded that, a restart would read leg 1 as
 * good. Therefore, after a failure, no write completes upward until the set
 * has written the new failed mask into the survivors' superblocks
 * (m->persist, then mirror_persisted); such writes wait on a short list.
 * Superblock writes themselves carry MIRROR_F_NOWAIT.
 *
 * Threading: mirror_submit on a worker thread, completions on the same
 * worker (waiters released from another worker are posted back to their
 * own). Request contexts come from a per-thread free list: no malloc per
 * I/O in steady state.
 */
#include "cache/cache_int.h"

#include "common/log.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct mirror_waiter {
	struct mirror_waiter *next;
	struct worker *w;
	struct mreq *r;
	struct worker_call call; /* the release, posted to w: needs no memory */
};

struct mreq {
	struct mreq *next_free;
	struct mirror *m;
	struct bdev_req *up;
	struct bdev_req sub[CACHE_MAX_LEGS];
	int pending;
	int ok;              /* legs that succeeded */
	int result;
	uint32_t tried;      /* read: legs tried */
	int bg_leg;          /* a background read: the leg it is counted on, else -1 */
	uint32_t skipped;    /* write: resyncing legs it skipped (above the copy cursor) */
	bool in_chunk;       /* counted in the resync chunk */
	struct mirror_waiter wait;
	struct worker_batch_end later; /* finish_async */
};

static __thread struct mreq *mreq_free;

static struct mreq *mreq_get(void)
{
	struct mreq *r = mreq_free;
	if (r) {
		mreq_free = r->next_free;
		return r;
	}
	return malloc(sizeof(*r));
}

static void mreq_put(struct mreq *r)
{
	r->next_free = mreq_free;
	mreq_free = r;
}

/* Worker exit (worker_exit_hook): free this thread's cached contexts. */
void mirror_thread_release(void)
{
	while (mreq_free) {
		struct mreq *r = mreq_free;
		mreq_free = r->next_free;
		free(r);
	}
}

static void finish_now(void *arg)
{
	struct mreq *r = arg;
	struct bdev_req *up = r->up;
	if (r->in_chunk) {
		atomic_fetch_add(&r->m->resync_chunk_gen, 1);
		atomic_fetch_sub(&r->m->resync_chunk_inflight, 1);
		r->in_chunk = false;
	}
	int err = r->result;
	mreq_put(r);
	up->done(up, err);
}

/* Complete later on this worker (done() must never run inside submit). */
static void finish_later(struct worker_batch_end *b)
{
	finish_now(caa_container_of(b, struct mreq, later));
}

static void finish_async(struct mreq *r, int err)
{
	r->result = err;
	r->later = (struct worker_batch_end){ .fn = finish_later };
	worker_at_batch_end(&r->later);
}

/* No leg holds a whole copy: every one failed, or is still being rebuilt. */
bool mirror_all_failed(struct mirror *m)
{
	uint32_t all = (1u << m->nlegs) - 1;
	return ((atomic_load(&m->failed) | atomic_load(&m->resyncing)) & all) == all;
}

/* Any worker: leg erred; mark it failed and have the set persist that. */
void mirror_leg_failed(struct mirror *m, int leg, int err)
{
	uint32_t bit = 1u << leg;
	atomic_fetch_add(&m->errors[leg], 1);
	uint32_t old = atomic_fetch_or(&m->failed, bit);
	if (old & bit)
		return;
	log_err("cache leg %s failed (%s); serving from the other leg; replace it with "
		"`tierctl leg replace`", m->leg[leg]->name, strerror(-err));
	uint32_t now = old | bit;
	if (!mirror_all_failed(m) && m->persist)
		m->persist(m, now, m->persist_arg);
	else if (mirror_all_failed(m)) {
		log_err("every cache leg has failed: dirty data is lost and reads of it return MEDIUM ERROR");
		if (m->all_failed)
			m->all_failed(m, m->persist_arg);
	}
}

static void sub_done(struct bdev_req *sub, int err);

static bool must_wait(struct mirror *m, struct mreq *r)
{
	if (r->up->op == BDEV_READ || (r->up->flags & MIRROR_F_NOWAIT))
		return false;
	uint32_t f = atomic_load(&m->failed);
	return !mirror_all_failed(m) && (f & ~atomic_load(&m->persisted));
}

static void complete(struct mreq *r, int err)
{
	struct mirror *m = r->m;
	if (r->in_chunk) {
		atomic_fetch_add(&m->resync_chunk_gen, 1);
		atomic_fetch_sub(&m->resync_chunk_inflight, 1);
		r->in_chunk = false;
	}
	if (!err && must_wait(m, r)) {
		pthread_mutex_lock(&m->lock);
		if (must_wait(m, r)) {
			r->wait.w = worker_self();
			r->wait.r = r;
			r->wait.next = m->waiters;
			m->waiters = &r->wait;
			r->result = 0;
			pthread_mutex_unlock(&m->lock);
			return;
		}
		pthread_mutex_unlock(&m->lock);
	}
	struct bdev_req *up = r->up;
	mreq_put(r);
	up->done(up, err);
}

/* Any thread: the failed mask is on disk; release writes that waited for it. */
void mirror_persisted(struct mirror *m, uint32_t failed)
{
	pthread_mutex_lock(&m->lock);
	atomic_fetch_or(&m->persisted, failed);
	struct mirror_waiter *list = NULL, **keep = &m->waiters;
	while (*keep) {
		struct mirror_waiter *w = *keep;
		if (!must_wait(m, w->r)) {
			*keep = w->next;
			w->next = list;
			list = w;
		} else {
			keep = &w->next;
		}
	}
	pthread_mutex_unlock(&m->lock);
	while (list) {
		struct mirror_waiter *w = list;
		list = w->next;
		w->r->result = 0;
		worker_post_call(w->w, &w->call, finish_now, w->r);
	}
}

/*
 * A leg to read from, not in exclude. A background read takes the last
 * leg in service; a host's read goes round the legs, skipping those with
 * background reads in flight while another leg has none.
 */
static void issue_leg(struct mreq *r, int leg);

static int pick_read_leg(struct mirror *m, uint32_t exclude, bool bg)
{
	uint32_t bad = atomic_load(&m->failed) | atomic_load(&m->resyncing) | exclude;
	if (bg) {
		for (int leg = m->nlegs - 1; leg >= 0; leg--)
			if (!(bad & (1u << leg)))
				return leg;
		return -1;
	}
	uint32_t start = atomic_fetch_add_explicit(&m->rr, 1, memory_order_relaxed);
	int any = -1;
	for (int k = 0; k < m->nlegs; k++) {
		int leg = (int)((start + (uint32_t)k) % (uint32_t)m->nlegs);
		if (bad & (1u << leg))
			continue;
		if (!atomic_load_explicit(&m->bg_reads[leg], memory_order_relaxed))
			return leg;
		if (any < 0)
			any = leg;
	}
	return any;
}

/* Issue a read to leg, counting it there if it is a background one. */
static void issue_read(struct mreq *r, int leg)
{
	if (r->up->flags & MIRROR_F_BG) {
		r->bg_leg = leg;
		atomic_fetch_add_explicit(&r->m->bg_reads[leg], 1, memory_order_relaxed);
	}
	issue_leg(r, leg);
}

static void issue_leg_done(struct mreq *r, int leg, void (*done)(struct bdev_req *, int))
{
	struct bdev_req *s = &r->sub[leg];
	const struct bdev_req *up = r->up;
	s->op = up->op;
	s->flags = up->flags & BDEV_F_FUA;
	s->offset = up->offset;
	s->len = up->len;
	s->iov = up->iov;
	s->iovcnt = up->iovcnt;
	s->done = done;
	s->priv = r;
	bdev_submit(r->m->leg[leg], s);
}

static void issue_leg(struct mreq *r, int leg)
{
	issue_leg_done(r, leg, sub_done);
}

static void skip_settled(struct mirror *m);

static void catchup_done(struct bdev_req *sub, int err)
{
	struct mreq *r = sub->priv;
	struct mirror *m = r->m;
	int leg = (int)(sub - r->sub);
	if (err && sub->dev == m->leg[leg])
		mirror_leg_failed(m, leg, err); /* the rebuild then fails too */
	skip_settled(m);
	complete(r, r->ok ? 0 : -EIO);
}

static bool chunk_overlaps(struct mirror *m, uint64_t off, uint64_t len)
{
	uint64_t c = atomic_load(&m->resync_chunk_start);
	return c != RESYNC_NO_CHUNK && off < c + RESYNC_CHUNK && off + len > c;
}

/* A write counted in resync_skip_inflight is settled: the last one wakes the resync's end. */
static void skip_settled(struct mirror *m)
{
	if (atomic_fetch_sub(&m->resync_skip_inflight, 1) != 1)
		return;
	void *f = atomic_exchange(&m->resync_finisher, NULL);
	if (f) /* a lost post would leave the leg resyncing for good */
		worker_post_call(worker_get(0), &m->resync_finish_call, m->resync_finish_fn, f);
}

/*
 * A write that skipped a resyncing leg (it lay above the copy cursor when it
 * was sent) is done on the others. If it landed while the copier had its
 * range in hand, the copier may have read the old data: make it copy that
 * chunk again (the generation it checks). If the cursor passed it while it
 * was in flight, the copier is done with that range for good: write it to
 * the resyncing leg as well (a catch-up) before completing. The generation
 * goes up before the cursor is read, as the copier moves the cursor before
 * reading the generation, so one of the two always sees the other. True if
 * a catch-up was sent (it completes the request).
 */
static bool caught_up(struct mreq *r)
{
	struct mirror *m = r->m;
	const struct bdev_req *up = r->up;
	uint32_t skipped = r->skipped;
	r->skipped = 0;
	if (chunk_overlaps(m, up->offset, up->len))
		atomic_fetch_add(&m->resync_chunk_gen, 1);
	uint32_t legs = skipped & atomic_load(&m->resyncing) & ~atomic_load(&m->failed);
	if (up->offset >= atomic_load(&m->resync_pos) || !r->ok || !legs) {
		skip_settled(m);
		return false;
	}
	issue_leg_done(r, __builtin_ctz(legs), catchup_done);
	return true;
}

static void sub_done(struct bdev_req *sub, int err)
{
	struct mreq *r = sub->priv;
	struct mirror *m = r->m;
	int leg = (int)(sub - r->sub);

	bool one_leg = r->up->flags & MIRROR_F_LEGS;
	if (r->bg_leg >= 0) {
		atomic_fetch_sub_explicit(&m->bg_reads[r->bg_leg], 1, memory_order_relaxed);
		r->bg_leg = -1;
	}
	/* an answer from a device replaced since (tierctl leg replace) says
	 * nothing about the leg now in its place */
	if (err && !one_leg && sub->dev == m->leg[leg]) {
		/*
		 * A read error (bdev_err_bad_blocks) is a bad range, not a dead
		 * leg: it is retried on another leg and queued to be rewritten
		 * (repair.c).
		 * A leg is failed by write errors, by a rewrite that fails, or by
		 * more bad ranges than the queue holds; a range no leg can read
		 * is MEDIUM ERROR for its dirty blocks only (volume.c), not the
		 * loss of the whole set.
		 */
		bool bad_range = r->up->op == BDEV_READ && bdev_err_bad_blocks(err) && m->read_error;
		if (!bad_range || m->read_error(m, leg, r->up->offset, r->up->len, m->persist_arg) < 0)
			mirror_leg_failed(m, leg, err);
		else
			atomic_fetch_add(&m->errors[leg], 1);
	}
	if (!err && !(atomic_load(&m->resyncing) & (1u << leg)))
		r->ok++; /* a leg being rebuilt holds no copy a host may count on yet */
	if (r->up->op == BDEV_READ) {
		if (!err || one_leg) {
			complete(r, err);
			return;
		}
		r->tried |= 1u << leg;
		int next = pick_read_leg(m, r->tried, r->up->flags & MIRROR_F_BG);
		if (next < 0) {
			complete(r, -EIO);
			return;
		}
		issue_read(r, next);
		return;
	}
	if (--r->pending)
		return;
	if (r->skipped && caught_up(r))
		return;
	complete(r, r->ok ? 0 : -EIO);
}

static void mirror_submit(struct bdev *dev, struct bdev_req *req)
{
	struct mirror *m = (struct mirror *)dev;
	struct mreq *r = mreq_get();

	if (!r) {
		bdev_submit_later(dev, req); /* out of memory: again when there is some */
		return;
	}
	r->m = m;
	r->up = req;
	r->ok = 0;
	r->tried = 0;
	r->bg_leg = -1;
	r->skipped = 0;
	r->in_chunk = false;
	if (req->flags & MIRROR_F_LEGS) {
		/* repair.c: exactly this leg, if it is in service */
		int leg = (req->flags & MIRROR_F_LEG(0)) ? 0 : 1;
		uint32_t out = atomic_load(&m->failed) | atomic_load(&m->resyncing);
		if (leg >= m->nlegs || (out & (1u << leg))) {
			finish_async(r, -EIO);
			return;
		}
		r->pending = 1;
		issue_leg(r, leg);
		return;
	}
	if (req->op == BDEV_READ) {
		int leg = pick_read_leg(m, 0, req->flags & MIRROR_F_BG);
		if (leg < 0) {
			finish_async(r, -EIO);
			return;
		}
		issue_read(r, leg);
		return;
	}
	uint32_t failed = atomic_load(&m->failed);
	uint32_t resync = atomic_load(&m->resyncing);
	r->in_chunk = false;
	/* counted before the cursor is read: the resync ends only when no write
	 * that may skip its leg is in flight (resync.c, resync_finish) */
	if (resync)
		atomic_fetch_add(&m->resync_skip_inflight, 1);
	if (resync && chunk_overlaps(m, req->offset, req->len)) {
		/* announce before deciding: the copier re-copies a chunk it saw touched */
		atomic_fetch_add(&m->resync_chunk_inflight, 1);
		atomic_fetch_add(&m->resync_chunk_gen, 1);
		r->in_chunk = true;
	}
	int n = 0;
	bool use[CACHE_MAX_LEGS] = { false };
	for (int i = 0; i < m->nlegs; i++) {
		if (failed & (1u << i))
			continue;
		if ((resync & (1u << i)) && req->offset >= atomic_load(&m->resync_pos)) {
			r->skipped |= 1u << i; /* the resync copies it later (or caught_up) */
			continue;
		}
		use[i] = true;
		n++;
	}
	if (resync && (!n || !r->skipped)) {
		r->skipped = 0;
		skip_settled(m);
	}
	if (!n) {
		finish_async(r, -EIO);
		return;
	}
	r->pending = n;
	for (int i = 0; i < m->nlegs; i++)
		if (use[i])
			issue_leg(r, i);
}

static void mirror_close(struct bdev *dev)
{
	(void)dev; /* the set owns the legs and closes them */
}

static const struct bdev_ops mirror_ops = {
	.submit = mirror_submit,
	.close = mirror_close,
};

/* Main thread. failed: legs recorded as stale in the newest superblock. */
int mirror_init(struct mirror *m, struct bdev **legs, int nlegs, uint32_t failed)
{
	memset(m, 0, sizeof(*m));
	m->nlegs = nlegs;
	for (int i = 0; i < nlegs; i++)
		m->leg[i] = legs[i];
	atomic_init(&m->failed, failed);
	atomic_init(&m->resync_chunk_start, RESYNC_NO_CHUNK);
	atomic_init(&m->persisted, failed);
	pthread_mutex_init(&m->lock, NULL);
	worker_exit_hook(mirror_thread_release);
	m->dev.ops = &mirror_ops;
	m->dev.name = "mirror";
	m->dev.size = legs[0]->size;
	m->dev.block_size = legs[0]->block_size;
	return 0;
}

/* Main thread, no I/O in flight. */
void mirror_destroy(struct mirror *m)
{
	pthread_mutex_destroy(&m->lock);
}
