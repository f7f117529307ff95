/*
 * set.c - a cache set's life: format, open with recovery, slot allocation
 * and eviction, checkpoints, superblock writes, attach, flush, shutdown.
 *
 * Recovery is what makes a warm restart possible: the newest superblock
 * (two copies per leg, highest generation with a good checksum) says where
 * the last checkpoint's table is and from which journal block to replay.
 * The table is loaded, the journal records with seq >= ckpt_seq are applied
 * in seq order, and the map is rebuilt from the slots: hits are served as
 * soon as the LUN opens.
 *
 * Slot reuse is the other delicate part. A slot is evicted only when it is
 * clean and unpinned; it leaves the map at once, but is handed out again
 * only when (a) its FREE record is durable (else a crash would replay the
 * old owner's records over the new owner's data) and (b) an RCU grace
 * period has passed (so no reader that found it in the map is still
 * pinning it). Eviction runs ahead of need, keeping a small free pool,
 * so a miss never waits for a grace period.
 *
 * Threading: cache_set_open/close/shutdown/flush, cache_vol_open and
 * cache_vol_set_mode: main (or control) thread, may sleep, need running
 * workers. cache_alloc_slot/cache_drop_slot/cache_reclaim: worker threads,
 * take alloc_lock briefly, never sleep. Checkpoints and superblock writes
 * run on worker 0.
 */
#include "cache/cache_int.h"
#include "cache/status.h"

#include "common/bufpool.h"
#include "common/log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- synchronous I/O for the main thread ----------------------------------- */

struct sync_io {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool done;
	int err;
	struct bdev *dev;
	struct bdev_req req;
	struct iovec iov;
};

static void sync_io_done(struct bdev_req *req, int err)
{
	struct sync_io *s = req->priv;
	pthread_mutex_lock(&s->lock);
	s->err = err;
	s->done = true;
	pthread_cond_signal(&s->cond);
	pthread_mutex_unlock(&s->lock);
}

static void sync_io_start(void *arg)
{
	struct sync_io *s = arg;
	bdev_submit(s->dev, &s->req);
}

/*
 * Main thread (never a worker: it would wait for itself). Runs one request
 * on worker 0 and waits. buf must be 4096-aligned (buf_get).
 */
int cache_sync_io(struct bdev *dev, enum bdev_op op, uint64_t off, void *buf, uint64_t len,
		  unsigned flags)
{
	struct sync_io s = { .dev = dev };
	pthread_mutex_init(&s.lock, NULL);
	pthread_cond_init(&s.cond, NULL);
	s.iov.iov_base = buf;
	s.iov.iov_len = len;
	s.req = (struct bdev_req){ .op = op, .flags = flags, .offset = off, .len = len,
				   .iov = &s.iov, .iovcnt = 1, .done = sync_io_done, .priv = &s };
	if (worker_post(worker_get(0), sync_io_start, &s) < 0)
		return -ENOMEM;
	pthread_mutex_lock(&s.lock);
	while (!s.done)
		pthread_cond_wait(&s.cond, &s.lock);
	pthread_mutex_unlock(&s.lock);
	pthread_mutex_destroy(&s.lock);
	pthread_cond_destroy(&s.cond);
	return s.err;
}

/* Run fn(arg) on worker 0 and wait for it to call sync_done. Main thread. */
struct sync_call {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool done;
	int err;
	struct cache_set *cs;
};

static void sync_done(struct sync_call *c, int err)
{
	pthread_mutex_lock(&c->lock);
	c->err = err;
	c->done = true;
	pthread_cond_signal(&c->cond);
	pthread_mutex_unlock(&c->lock);
}

static int sync_run(void (*fn)(void *), struct sync_call *c)
{
	pthread_mutex_init(&c->lock, NULL);
	pthread_cond_init(&c->cond, NULL);
	c->done = false;
	if (worker_post(worker_get(0), fn, c) < 0)
		return -ENOMEM;
	pthread_mutex_lock(&c->lock);
	while (!c->done)
		pthread_cond_wait(&c->cond, &c->lock);
	pthread_mutex_unlock(&c->lock);
	pthread_mutex_destroy(&c->lock);
	pthread_cond_destroy(&c->cond);
	return c->err;
}

/* ---- superblock ---------------------------------------------------------------- */

struct sb_job {
	struct sb_job *next;
	void (*cb)(void *arg, int err);
	void *arg;
};

static void build_sb(struct cache_set *cs, int leg, uint64_t gen, struct cache_sb_disk *sb)
{
	memset(sb, 0, sizeof(*sb));
	sb->magic = le64_of(CACHE_MAGIC);
	sb->version = le32_of(cs->version);
	memcpy(sb->set_uuid, cs->uuid, 16);
	sb->gen = le64_of(gen);
	sb->leg_index = le32_of((uint32_t)(cs->alone_index >= 0 ? cs->alone_index : leg));
	sb->nlegs = le32_of((uint32_t)(cs->alone_index >= 0 ? 2 : cs->mirror.nlegs));
	sb->extent_size = le32_of(cs->lay.extent_size);
	sb->block_size = le32_of(CACHE_SECTOR);
	sb->nslots = le32_of(cs->lay.nslots);
	sb->rec_size = le32_of(cs->lay.rec_size);
	sb->njournals = le32_of(CACHE_NJOURNALS);
	sb->jblocks = le32_of(cs->lay.jblocks);
	sb->leg_size = le64_of(cs->lay.leg_size);
	sb->table_off = le64_of(cs->lay.table_off);
	sb->journal_off = le64_of(cs->lay.journal_off);
	sb->data_off = le64_of(cs->lay.data_off);
	sb->clean = le32_of(cs->clean_flag ? 1 : 0);
	sb->failed_mask = le32_of(atomic_load(&cs->mirror.failed) | atomic_load(&cs->mirror.resyncing));
	if (cs->alone_index >= 0)
		sb->failed_mask = le32_of(1u << (1 - cs->alone_index)); /* the leg left out is stale */
	sb->ckpt_seq = le64_of(cs->ckpt_seq);
	for (int j = 0; j < CACHE_NJOURNALS; j++)
		sb->jtail[j] = le64_of(cs->jtail[j]);
	snprintf(sb->set_name, sizeof(sb->set_name), "%s", cs->name);
	memcpy(sb->backing, cs->backing, sizeof(cs->backing));
	memcpy(sb->leg_uuid, cs->leg_uuid[leg], 16);
	memcpy(sb->member_uuid, cs->leg_uuid, sizeof(sb->member_uuid));
	if (cs->alone_index >= 0) {
		memcpy(sb->member_uuid[cs->alone_index], cs->leg_uuid[0], 16);
		memcpy(sb->member_uuid[1 - cs->alone_index], cs->alone_other_uuid, 16);
	}
	if (cs->lay.dlog_pages) {
		sb->dlog_off = le64_of(cs->lay.dlog_off);
		sb->dlog_rings = le32_of(CACHE_DLOG_RINGS);
		sb->dlog_pages = le32_of(cs->lay.dlog_pages);
	}
	meta_sb_seal(sb);
}

static void sb_issue(struct cache_set *cs);

/* Worker 0: the generation in flight is done (on sb_ok legs): answer its jobs, start the next. */
static void sb_finish(struct cache_set *cs)
{
	struct sb_job *list = cs->sb_inflight;
	int res = cs->sb_ok ? 0 : -EIO;
	cs->sb_inflight = NULL;
	cs->sb_busy = false;
	int done = 0;
	while (list) {
		struct sb_job *j = list;
		list = j->next;
		j->cb(j->arg, res);
		free(j);
		done++;
	}
	if (cs->sb_waiting)
		sb_issue(cs);
	atomic_fetch_sub(&cs->sb_jobs, done); /* the last access: shutdown may free the set after it */
}

static void sb_leg_done(struct bdev_req *req, int err)
{
	struct cache_set *cs = req->priv;
	int leg = (int)(req - cs->sbreq);
	if (err)
		mirror_leg_failed(&cs->mirror, leg, err);
	else
		cs->sb_ok++;
	if (--cs->sb_pending)
		return;
	sb_finish(cs);
}

/* Worker 0. No leg to write to: the jobs fail with -EIO (sbreq[] was not issued: no leg erred). */
static void sb_fail_async(void *arg)
{
	struct cache_set *cs = arg;
	cs->sb_pending = 0;
	cs->sb_ok = 0;
	sb_finish(cs);
}

/* Worker 0. Writes one generation to every healthy leg, serving every waiter. */
static void sb_issue(struct cache_set *cs)
{
	cs->sb_busy = true;
	cs->sb_inflight = cs->sb_waiting;
	cs->sb_waiting = NULL;
	pthread_mutex_lock(&cs->sb_lock);
	uint64_t gen = ++cs->sb_gen;
	uint32_t failed = atomic_load(&cs->mirror.failed) |
			  (atomic_load(&cs->mirror.resyncing) & ~atomic_load(&cs->sb_include));
	int n = 0;
	for (int i = 0; i < cs->mirror.nlegs; i++) {
		if (failed & (1u << i))
			continue;
		build_sb(cs, i, gen, cs->sbbuf[i]);
		n++;
	}
	pthread_mutex_unlock(&cs->sb_lock);
	cs->sb_pending = n;
	cs->sb_ok = 0;
	if (!n) {
		worker_post(worker_self(), sb_fail_async, cs);
		return;
	}
	for (int i = 0; i < cs->mirror.nlegs; i++) {
		if (failed & (1u << i))
			continue;
		cs->sbiov[i].iov_base = cs->sbbuf[i];
		cs->sbiov[i].iov_len = CACHE_PAGE;
		cs->sbreq[i] = (struct bdev_req){
			.op = BDEV_WRITE,
			.flags = BDEV_F_FUA,
			.offset = (gen & 1) * CACHE_PAGE,
			.len = CACHE_PAGE,
			.iov = &cs->sbiov[i],
			.iovcnt = 1,
			.done = sb_leg_done,
			.priv = cs,
		};
		bdev_submit(cs->legs[i], &cs->sbreq[i]);
	}
}

struct sb_post {
	struct cache_set *cs;
	struct sb_job *job;
};

static void sb_post_fn(void *arg)
{
	struct sb_post *p = arg;
	struct cache_set *cs = p->cs;
	struct sb_job *j = p->job;
	free(p);
	j->next = NULL;
	struct sb_job **t = &cs->sb_waiting;
	while (*t)
		t = &(*t)->next;
	*t = j;
	if (!cs->sb_busy)
		sb_issue(cs);
}

/* Any thread. cb(arg, err) runs on worker 0 when the superblock is durable. */
void cache_sb_write(struct cache_set *cs, void (*cb)(void *arg, int err), void *arg)
{
	struct sb_job *j = malloc(sizeof(*j));
	struct sb_post *p = malloc(sizeof(*p));
	if (!j || !p) {
		free(j);
		free(p);
		log_err("cache %s: out of memory writing the superblock", cs->name);
		return;
	}
	j->cb = cb;
	j->arg = arg;
	p->cs = cs;
	p->job = j;
	atomic_fetch_add(&cs->sb_jobs, 1);
	worker_post(worker_get(0), sb_post_fn, p);
}

struct persist_arg {
	struct cache_set *cs;
	uint32_t failed;
};

static void persist_done(void *arg, int err)
{
	struct persist_arg *pa = arg;
	if (!err)
		log_warn("cache %s: degraded; leg failure recorded in the surviving leg's superblock",
			 pa->cs->name);
	mirror_persisted(&pa->cs->mirror, pa->failed);
	free(pa);
}

/* Any worker: the mirror lost a leg; record it before writes complete. */
static void persist_failed(struct mirror *m, uint32_t failed, void *arg)
{
	struct cache_set *cs = arg;
	struct persist_arg *pa = malloc(sizeof(*pa));
	if (!pa)
		return;
	pa->cs = cs;
	pa->failed = failed;
	cache_sb_write(cs, persist_done, pa);
}

/*
 * Any worker, once: the last leg failed. Every dirty block is lost from
 * this moment; list them all now (cache_lost_note), so status names the
 * lost ranges before a host meets them.
 */
static void all_legs_failed(struct mirror *m, void *arg)
{
	struct cache_set *cs = arg;
	(void)m;
	uint64_t slots = 0;
	for (uint32_t s = 0; s < cs->lay.nslots; s++) {
		struct slot *sl = &cs->slots[s];
		if (!(atomic_load(&sl->bits) & SB_DIRTY))
			continue;
		atomic_fetch_add(&sl->users, SU_READER); /* pin, then look: the bitmaps stay this slot's */
		uint32_t bits = atomic_load(&sl->bits);
		uint64_t key = atomic_load(&sl->key);
		if ((bits & SB_STATE_MASK) == SB_READY && (bits & SB_DIRTY) && key != CACHE_KEY_NONE) {
			cache_lost_note(cs, key_bid(key), s, key_ext(key) * cs->lay.extent_size, 0, cs->lay.bpe);
			slots++;
		}
		atomic_fetch_sub(&sl->users, SU_READER);
	}
	log_err("cache %s: dirty data of %llu extent(s) is lost; tierctl status lists the ranges", cs->name,
		(unsigned long long)slots);
}

/* ---- slot allocation and reclaim ------------------------------------------------- */

struct evict_batch {
	struct rcu_head rcu;
	struct cache_set *cs;
	_Atomic int refs;       /* FREE records outstanding + 1 for the grace period */
	uint32_t n;
	uint32_t *slots;
	struct jwait *jw;
};

static void batch_release(struct evict_batch *b)
{
	if (atomic_fetch_sub(&b->refs, 1) != 1)
		return;
	struct cache_set *cs = b->cs;
	pthread_mutex_lock(&cs->alloc_lock);
	for (uint32_t i = 0; i < b->n; i++) {
		struct slot *sl = &cs->slots[b->slots[i]];
		atomic_store(&sl->key, CACHE_KEY_NONE);
		atomic_store(&sl->bits, SB_FREE);
		free_push(cs, b->slots[i]);
	}
	pthread_mutex_unlock(&cs->alloc_lock);
	free(b);
	atomic_fetch_sub(&cs->bg_inflight, 1);
}

static void batch_graced(struct rcu_head *h)
{
	batch_release(caa_container_of(h, struct evict_batch, rcu));
}

static void batch_recorded(struct jwait *w, int err)
{
	/* jw[] follows the header: find the batch from the record's index */
	struct evict_batch *b = *(struct evict_batch **)((char *)w - sizeof(void *));
	(void)err;
	batch_release(b);
}

static struct evict_batch *batch_new(struct cache_set *cs, uint32_t n)
{
	/* layout: header, slots[n], then n x { back pointer, jwait } */
	size_t per = sizeof(void *) + sizeof(struct jwait);
	struct evict_batch *b = calloc(1, sizeof(*b) + n * sizeof(uint32_t) + n * per + 16);
	if (!b)
		return NULL;
	b->cs = cs;
	b->slots = (uint32_t *)(b + 1);
	atomic_fetch_add(&cs->bg_inflight, 1);
	return b;
}

static struct jwait *batch_jw(struct evict_batch *b, uint32_t cap, uint32_t i)
{
	size_t per = sizeof(void *) + sizeof(struct jwait);
	char *base = (char *)(b->slots + cap);
	base = (char *)(((uintptr_t)base + 7) & ~(uintptr_t)7);
	char *e = base + i * per;
	*(struct evict_batch **)e = b;
	return (struct jwait *)(e + sizeof(void *));
}

static bool evictable(uint32_t s, void *arg)
{
	struct cache_set *cs = arg;
	struct slot *sl = &cs->slots[s];
	uint32_t bits = atomic_load(&sl->bits);
	return (bits & SB_STATE_MASK) == SB_READY && !(bits & (SB_DIRTY | SB_DESTAGING | SB_LOCK)) &&
	       atomic_load(&sl->users) == 0;
}

/*
 * Worker thread. Keeps about 1/64 of the slots free: evicts clean cold
 * slots (policy_victim), journals their FREE records and frees them after
 * both the records are durable and a grace period passed.
 */
void cache_reclaim(struct cache_set *cs)
{
	uint32_t want = cs->lay.nslots / 64 + 4;
	uint32_t cap = 64;
	struct evict_batch *b = NULL;

	pthread_mutex_lock(&cs->alloc_lock);
	if (cs->nfree >= want) {
		pthread_mutex_unlock(&cs->alloc_lock);
		atomic_store(&cs->reclaim_pending, false);
		return;
	}
	b = batch_new(cs, cap);
	if (!b) {
		pthread_mutex_unlock(&cs->alloc_lock);
		return;
	}
	uint64_t keys[64];
	while (b->n < cap && cs->nfree + b->n < want) {
		uint32_t s = policy_victim(cs->policy, evictable, cs);
		if (s == POLICY_NO_SLOT)
			break;
		struct slot *sl = &cs->slots[s];
		uint64_t key = atomic_load(&sl->key);
		slot_lock(sl);
		uint32_t bits = atomic_load(&sl->bits);
		bool ok = (bits & SB_STATE_MASK) == SB_READY && !(bits & (SB_DIRTY | SB_DESTAGING));
		if (ok) {
			atomic_fetch_and(&sl->bits, ~SB_STATE_MASK);
			atomic_fetch_or(&sl->bits, SB_RETIRED);
			/* Dekker with pin_lookup: users after state */
			if (atomic_load(&sl->users)) {
				atomic_fetch_and(&sl->bits, ~SB_STATE_MASK);
				atomic_fetch_or(&sl->bits, SB_READY);
				ok = false;
			}
		}
		slot_unlock(sl);
		if (!ok) {
			policy_insert(cs->policy, s, key);
			break;
		}
		map_remove(&cs->map, key, s);
		keys[b->n] = key;
		b->slots[b->n++] = s;
	}
	pthread_mutex_unlock(&cs->alloc_lock);
	atomic_store(&cs->reclaim_pending, false);
	if (!b->n) {
		free(b);
		atomic_fetch_sub(&cs->bg_inflight, 1);
		return;
	}
	atomic_fetch_add(&cs->st_evictions, b->n);
	atomic_store(&b->refs, (int)b->n + 1);
	for (uint32_t i = 0; i < b->n; i++) {
		struct jwait *w = batch_jw(b, cap, i);
		struct slot *sl = &cs->slots[b->slots[i]];
		w->done = batch_recorded;
		slot_lock(sl);
		cache_record_locked(cs, b->slots[i], keys[i], JOP_FREE, 0, cs->lay.bpe, w);
		slot_unlock(sl);
		journal_append(cs, w);
	}
	call_rcu(&b->rcu, batch_graced);
}

static void maybe_reclaim(struct cache_set *cs)
{
	if (cs->nfree < cs->lay.nslots / 128 + 2 && !atomic_exchange(&cs->reclaim_pending, true))
		cache_reclaim(cs);
}

/*
 * Worker thread. Insert key with a free slot in state (SB_READY: pinned
 * for the calling writer; SB_FILLING: not pinned). If key is present
 * already, returns POLICY_NO_SLOT and, for SB_READY, *existing = that
 * slot pinned for the writer. POLICY_NO_SLOT and *existing untouched if
 * no slot is free (a reclaim is started).
 */
uint32_t cache_alloc_slot(struct cache_set *cs, uint64_t key, uint32_t state, uint32_t *existing)
{
	pthread_mutex_lock(&cs->alloc_lock);
	uint32_t s = map_lookup(&cs->map, key);
	if (s != POLICY_NO_SLOT) {
		if (state == SB_READY) {
			atomic_fetch_add(&cs->slots[s].users, SU_WRITER);
			atomic_fetch_add(&cs->slots[s].bits, SB_WGEN_ONE);
			*existing = s;
		}
		pthread_mutex_unlock(&cs->alloc_lock);
		return POLICY_NO_SLOT;
	}
	if (!cs->nfree) {
		pthread_mutex_unlock(&cs->alloc_lock);
		if (!atomic_exchange(&cs->reclaim_pending, true))
			cache_reclaim(cs);
		return POLICY_NO_SLOT;
	}
	s = free_pop(cs);
	struct slot *sl = &cs->slots[s];
	atomic_store(&sl->users, state == SB_READY ? SU_WRITER : 0);
	atomic_store(&sl->bits, state);
	if (map_insert(&cs->map, key, s) < 0) {
		free_push(cs, s);
		atomic_store(&sl->bits, SB_FREE);
		atomic_store(&sl->users, 0);
		pthread_mutex_unlock(&cs->alloc_lock);
		return POLICY_NO_SLOT;
	}
	policy_insert(cs->policy, s, key);
	pthread_mutex_unlock(&cs->alloc_lock);
	maybe_reclaim(cs);
	return s;
}

/*
 * Slots retired without a batch (cache_drop_slot out of memory) go to the
 * free list after a grace period of their own: retire_rcu, one at a time.
 * Under alloc_lock: if none is under way and some wait, the waiting ones
 * enter the next. The callback frees those and starts the next for slots
 * retired meanwhile. Counted in bg_inflight, so a close waits for it.
 */
static void retire_graced(struct rcu_head *h);

static void retire_start_locked(struct cache_set *cs)
{
	uint32_t words = (cs->lay.nslots + 63) / 64;
	bool any = false;

	if (cs->retire_inflight)
		return;
	for (uint32_t w = 0; w < words; w++) {
		cs->grace_bits[w] = cs->retire_bits[w];
		cs->retire_bits[w] = 0;
		any |= cs->grace_bits[w] != 0;
	}
	if (!any)
		return;
	cs->retire_inflight = true;
	atomic_fetch_add(&cs->bg_inflight, 1);
	call_rcu(&cs->retire_rcu, retire_graced);
}

static void retire_graced(struct rcu_head *h)
{
	struct cache_set *cs = caa_container_of(h, struct cache_set, retire_rcu);
	uint32_t words = (cs->lay.nslots + 63) / 64;

	pthread_mutex_lock(&cs->alloc_lock);
	for (uint32_t w = 0; w < words; w++)
		for (uint64_t m = cs->grace_bits[w]; m; m &= m - 1) {
			uint32_t s = w * 64 + (uint32_t)__builtin_ctzll(m);
			atomic_store(&cs->slots[s].key, CACHE_KEY_NONE);
			atomic_store(&cs->slots[s].bits, SB_FREE);
			free_push(cs, s);
		}
	cs->retire_inflight = false;
	retire_start_locked(cs);
	pthread_mutex_unlock(&cs->alloc_lock);
	atomic_fetch_sub(&cs->bg_inflight, 1);
}

/* Worker thread. A fill that never recorded anything gives its slot back. */
void cache_drop_slot(struct cache_set *cs, uint32_t s)
{
	struct evict_batch *b = batch_new(cs, 1);
	struct slot *sl = &cs->slots[s];
	pthread_mutex_lock(&cs->alloc_lock);
	map_remove(&cs->map, atomic_load(&sl->key), s);
	policy_remove(cs->policy, s);
	slot_lock(sl);
	atomic_fetch_and(&sl->bits, ~SB_STATE_MASK);
	atomic_fetch_or(&sl->bits, SB_RETIRED);
	slot_unlock(sl);
	pthread_mutex_unlock(&cs->alloc_lock);
	if (!b) {
		/* out of memory: wait for a grace period without a batch */
		pthread_mutex_lock(&cs->alloc_lock);
		cs->retire_bits[s / 64] |= 1ull << (s % 64);
		retire_start_locked(cs);
		pthread_mutex_unlock(&cs->alloc_lock);
		return;
	}
	b->n = 1;
	b->slots[0] = s;
	atomic_store(&b->refs, 1);
	call_rcu(&b->rcu, batch_graced);
}

/* ---- checkpoint ---------------------------------------------------------------------- */

#define CKPT_INFLIGHT 8

struct ckpt {
	struct cache_set *cs;
	uint64_t heads[CACHE_NJOURNALS];
	uint64_t dheads[CACHE_DLOG_RINGS]; /* block log heads */
	uint64_t seq;
	uint32_t npages, rpp, cursor;
	int inflight;
	bool final;                   /* clean shutdown: set the clean flag */
	struct sync_call *waiter;
	void *buf[CKPT_INFLIGHT];
	struct bdev_req req[CKPT_INFLIGHT];
	struct iovec iov[CKPT_INFLIGHT];
	bool busy[CKPT_INFLIGHT];
};

static void encode_slot(struct cache_set *cs, uint32_t s, uint8_t *rec)
{
	struct slot *sl = &cs->slots[s];
	struct cache_slot_disk *h = (struct cache_slot_disk *)rec;
	uint32_t bpe = cs->lay.bpe;
	uint8_t *vb = rec + sizeof(*h), *db = vb + bpe / 8;

	memset(rec, 0, cs->lay.rec_size);
	slot_lock(sl);
	uint32_t bits = atomic_load(&sl->bits);
	if ((bits & SB_STATE_MASK) == SB_READY) {
		h->key = le64_of(atomic_load(&sl->key));
		h->flags = le32_of(bits & (SB_FULL_VALID | SB_DIRTY | SB_HAS_BM));
		if (bits & SB_HAS_BM) {
			_Atomic uint64_t *v = bm_valid(&cs->bm, s, false), *d = bm_dirty(&cs->bm, s, false);
			for (uint32_t i = 0; i < bpe / 8; i++) {
				vb[i] = (uint8_t)(atomic_load(&v[i / 8]) >> (8 * (i % 8)));
				db[i] = (uint8_t)(atomic_load(&d[i / 8]) >> (8 * (i % 8)));
			}
		} else {
			memset(vb, (bits & SB_FULL_VALID) ? 0xff : 0, bpe / 8);
			memset(db, (bits & SB_DIRTY) ? 0xff : 0, bpe / 8);
		}
	} else {
		h->key = le64_of(CACHE_KEY_NONE);
	}
	slot_unlock(sl);
	h->nblocks = le64_of(bpe);
	meta_slot_seal(rec, cs->lay.rec_size);
}

static void ckpt_pump(struct ckpt *ck);

static void ckpt_start(struct cache_set *cs);

static void ckpt_sync_start(struct sync_call *c, bool final);

static void ckpt_sb_done(void *arg, int err)
{
	struct ckpt *ck = arg;
	struct cache_set *cs = ck->cs;
	if (err)
		log_err("cache %s: checkpoint superblock write failed: %s", cs->name, strerror(-err));
	for (int j = 0; j < CACHE_NJOURNALS; j++) {
		struct journal *jr = &cs->journals[j];
		atomic_store(&jr->tail, ck->heads[j]);
		pthread_mutex_lock(&jr->lock);
		bool waiting = jr->pend_head != NULL;
		pthread_mutex_unlock(&jr->lock);
		if (waiting)
			journal_kick(jr); /* any worker may kick a ring */
	}
	if (!err)
		dlog_release(cs, ck->dheads); /* else the next checkpoint frees it */
	cs->ckpt_running = false;
	struct sync_call *w = ck->waiter;
	ck->waiter = NULL;
	if (w)
		sync_done(w, err);
	struct sync_call *q = cs->ckpt_queued;
	if (q) {
		/* a checkpoint the main thread waits for was asked for meanwhile */
		cs->ckpt_queued = NULL;
		ckpt_sync_start(q, cs->ckpt_queued_final);
	} else if (atomic_load(&cs->ckpt_wanted)) {
		ckpt_start(cs);
	}
}

static void ckpt_page_done(struct bdev_req *req, int err)
{
	struct ckpt *ck = req->priv;
	int i = (int)(req - ck->req);
	ck->busy[i] = false;
	ck->inflight--;
	if (err)
		log_err("cache %s: checkpoint write failed: %s", ck->cs->name, strerror(-err));
	ckpt_pump(ck);
}

static bool page_dirty_take(struct cache_set *cs, uint32_t page, uint32_t rpp)
{
	bool any = false;
	uint32_t lo = page * rpp, hi = lo + rpp;
	if (hi > cs->lay.nslots)
		hi = cs->lay.nslots;
	for (uint32_t s = lo; s < hi; s++) {
		uint8_t bit = (uint8_t)(1u << (s % 8));
		if (atomic_fetch_and(&cs->ckpt_dirty[s / 8], (uint8_t)~bit) & bit)
			any = true;
	}
	return any;
}

static void ckpt_pump(struct ckpt *ck)
{
	struct cache_set *cs = ck->cs;
	while (ck->cursor < ck->npages && ck->inflight < CKPT_INFLIGHT) {
		uint32_t page = ck->cursor++;
		if (!page_dirty_take(cs, page, ck->rpp))
			continue;
		int i = 0;
		while (ck->busy[i])
			i++;
		uint8_t *buf = ck->buf[i];
		memset(buf, 0, CACHE_PAGE);
		for (uint32_t k = 0; k < ck->rpp; k++) {
			uint32_t s = page * ck->rpp + k;
			if (s >= cs->lay.nslots)
				break;
			encode_slot(cs, s, buf + (size_t)k * cs->lay.rec_size);
		}
		ck->busy[i] = true;
		ck->inflight++;
		ck->iov[i].iov_base = buf;
		ck->iov[i].iov_len = CACHE_PAGE;
		ck->req[i] = (struct bdev_req){
			.op = BDEV_WRITE,
			.flags = BDEV_F_FUA,
			.offset = cs->lay.table_off + (uint64_t)page * CACHE_PAGE,
			.len = CACHE_PAGE,
			.iov = &ck->iov[i],
			.iovcnt = 1,
			.done = ckpt_page_done,
			.priv = ck,
		};
		bdev_submit(&cs->mirror.dev, &ck->req[i]);
	}
	if (ck->cursor == ck->npages && ck->inflight == 0) {
		/*
		 * Not before every block log record older than our seq has
		 * finished: recovery trusts no record older than ckpt_seq
		 * (dlog.c). dlog_finish posts us again if we wait.
		 */
		if (dlog_older_inflight(cs, ck->seq)) {
			atomic_store(&cs->dlog_ckpt_wait, true);
			if (dlog_older_inflight(cs, ck->seq) || !atomic_exchange(&cs->dlog_ckpt_wait, false))
				return; /* still, or a finish took the flag and posted us */
		}
		pthread_mutex_lock(&cs->sb_lock);
		cs->ckpt_seq = ck->seq;
		for (int j = 0; j < CACHE_NJOURNALS; j++)
			cs->jtail[j] = ck->heads[j];
		cs->clean_flag = ck->final;
		pthread_mutex_unlock(&cs->sb_lock);
		ck->cursor++; /* once */
		cache_sb_write(cs, ckpt_sb_done, ck);
	}
}

/* Worker 0. */
static void ckpt_start(struct cache_set *cs)
{
	struct ckpt *ck = cs->ckpt;
	if (cs->ckpt_running)
		return;
	cs->ckpt_running = true;
	atomic_store(&cs->ckpt_wanted, false);
	/* heads first, then seq: every block before a head holds only seq < S */
	for (int j = 0; j < CACHE_NJOURNALS; j++)
		ck->heads[j] = atomic_load(&cs->journals[j].head);
	dlog_heads(cs, ck->dheads);
	ck->seq = atomic_load(&cs->next_seq);
	ck->cursor = 0;
	ckpt_pump(ck);
}

static void ckpt_post(void *arg)
{
	ckpt_start(arg);
}

static void ckpt_resume_fn(void *arg)
{
	struct cache_set *cs = arg;
	if (cs->ckpt_running)
		ckpt_pump(cs->ckpt);
}

/* Any worker: a checkpoint waiting for the block log may go on (dlog_finish). */
void cache_ckpt_resume(struct cache_set *cs)
{
	if (worker_post(worker_get(0), ckpt_resume_fn, cs) < 0)
		log_warn("cache %s: cannot resume a checkpoint", cs->name);
}

/* Any thread. */
void cache_want_checkpoint(struct cache_set *cs)
{
	if (!atomic_exchange(&cs->ckpt_wanted, true))
		worker_post(worker_get(0), ckpt_post, cs);
}

/*
 * Worker 0: a checkpoint the main thread waits for (sync_run: one at a
 * time). If one is running, ours starts when it ends (ckpt_sb_done). It
 * used to post itself again until then: worker 0 then ran that post round
 * after round without going back to its ring, so the running checkpoint's
 * completions were never reaped and a stop hung (seen in
 * test_cache_destage_overwrite and the power-cut replay).
 */
static void ckpt_sync_start(struct sync_call *c, bool final)
{
	struct cache_set *cs = c->cs;
	if (cs->ckpt_running) {
		cs->ckpt_queued = c;
		cs->ckpt_queued_final = final;
		return;
	}
	cs->ckpt->final = final;
	cs->ckpt->waiter = c;
	ckpt_start(cs);
}

/* Worker 0: the last checkpoint of a clean shutdown. */
static void ckpt_final_fn(void *arg) { ckpt_sync_start(arg, true); }

/* Worker 0: a checkpoint now (after recovery: both legs' metadata the same). */
static void ckpt_now_fn(void *arg) { ckpt_sync_start(arg, false); }

/* ---- ticks ------------------------------------------------------------------------- */

static void set_tick(struct worker_tick *t)
{
	struct cache_set *cs = caa_container_of(t, struct cache_set, tick);
	if (atomic_load(&cs->stopping))
		return;
	cache_reclaim(cs);
	cleaner_tick(cs->cleaner);
	intent_tick(cs);
	cache_repair_tick(cs);
}

static void tick_add(void *arg)
{
	struct sync_call *c = arg;
	c->cs->tick.fn = set_tick;
	worker_tick_add(&c->cs->tick);
	sync_done(c, 0);
}

static void tick_del(void *arg)
{
	struct sync_call *c = arg;
	worker_tick_del(&c->cs->tick);
	sync_done(c, 0);
}

static __thread int rcu_registered;

/* ---- open: format or recover --------------------------------------------------------- */

static int fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return -1;
}

static int alloc_memory(struct cache_set *cs)
{
	uint32_t n = cs->lay.nslots;
	cs->slots = calloc(n, sizeof(*cs->slots));
	cs->free_bits = calloc((n + 63) / 64, sizeof(uint64_t));
	cs->retire_bits = calloc((n + 63) / 64, sizeof(uint64_t));
	cs->grace_bits = calloc((n + 63) / 64, sizeof(uint64_t));
	cs->ckpt_dirty = calloc((n + 7) / 8, 1);
	cs->ckpt = calloc(1, sizeof(*cs->ckpt));
	if (!cs->slots || !cs->free_bits || !cs->retire_bits || !cs->grace_bits || !cs->ckpt_dirty || !cs->ckpt)
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++)
		atomic_init(&cs->slots[i].key, CACHE_KEY_NONE);
	if (map_init(&cs->map, cs->slots, n) < 0 || bm_init(&cs->bm, n, cs->lay.bpe) < 0)
		return -ENOMEM;
	struct policy_cfg pc = {
		.nslots = n,
		.admit_hits = cs->cfg.admit_hits ? cs->cfg.admit_hits : 1,
		.seq_cutoff = cs->cfg.seq_cutoff,
		.extent_size = cs->lay.extent_size,
		/* A write miss is absorbed at once (unless part of a long
		 * sequential stream): caching it costs no extra backing read,
		 * and write-back is what makes random writes fast. */
		.write_admit_hits = 1,
	};
	cs->policy = policy_new(&pc);
	if (!cs->policy)
		return -ENOMEM;
	struct ckpt *ck = cs->ckpt;
	ck->cs = cs;
	ck->rpp = CACHE_PAGE / cs->lay.rec_size;
	ck->npages = (n + ck->rpp - 1) / ck->rpp;
	for (int i = 0; i < CKPT_INFLIGHT; i++)
		if (!(ck->buf[i] = buf_get(CACHE_PAGE)))
			return -ENOMEM;
	for (int i = 0; i < CACHE_MAX_LEGS; i++)
		if (!(cs->sbbuf[i] = buf_get(CACHE_PAGE)))
			return -ENOMEM;
	for (int j = 0; j < CACHE_NJOURNALS; j++) {
		struct journal *jr = &cs->journals[j];
		jr->cs = cs;
		jr->idx = (unsigned)j;
		jr->pend_tail = &jr->pend_head;
		pthread_mutex_init(&jr->lock, NULL);
		if (!(jr->buf = buf_get(CACHE_PAGE)))
			return -ENOMEM;
	}
	return 0;
}

static int format_set(struct cache_set *cs, char *err, size_t errlen)
{
	if (getrandom(cs->uuid, 16, 0) != 16 || getrandom(cs->leg_uuid, sizeof(cs->leg_uuid), 0) != sizeof(cs->leg_uuid))
		return fail(err, errlen, "cache %s: cannot get random bytes for the set UUID", cs->name);
	/* an all-free table */
	size_t chunk = 1u << 20;
	uint8_t *buf = buf_get(chunk);
	if (!buf)
		return fail(err, errlen, "cache %s: out of memory", cs->name);
	uint64_t table_bytes = (uint64_t)cs->ckpt->npages * CACHE_PAGE;
	for (uint64_t off = 0; off < table_bytes; off += chunk) {
		uint64_t len = table_bytes - off < chunk ? table_bytes - off : chunk;
		memset(buf, 0, len);
		for (uint64_t p = 0; p < len / CACHE_PAGE; p++)
			for (uint32_t k = 0; k < cs->ckpt->rpp; k++) {
				uint32_t s = (uint32_t)((off / CACHE_PAGE + p) * cs->ckpt->rpp + k);
				if (s >= cs->lay.nslots)
					break;
				encode_slot(cs, s, buf + p * CACHE_PAGE + (size_t)k * cs->lay.rec_size);
			}
		int r = cache_sync_io(&cs->mirror.dev, BDEV_WRITE, cs->lay.table_off + off, buf, len, BDEV_F_FUA);
		if (r < 0) {
			buf_put(buf, chunk);
			return fail(err, errlen, "cache %s: cannot write the slot table: %s", cs->name, strerror(-r));
		}
	}
	buf_put(buf, chunk);
	cs->ckpt_seq = 1;
	atomic_store(&cs->next_seq, 1);
	for (uint32_t s = 0; s < cs->lay.nslots; s++)
		free_push(cs, s);
	log_info("cache %s: formatted %d leg(s): %u slots of %u KiB", cs->name, cs->mirror.nlegs,
		 cs->lay.nslots, cs->lay.extent_size >> 10);
	return 0;
}

static int rrec_cmp(const void *a, const void *b)
{
	const struct rrec *x = a, *y = b;
	return x->seq < y->seq ? -1 : x->seq > y->seq;
}

static void recover_apply(struct cache_set *cs, const struct rrec *r)
{
	struct slot *sl = &cs->slots[r->slot];
	if (r->op == JOP_FREE) {
		slot_apply(cs, r->slot, JOP_FREE, 0, cs->lay.bpe);
		atomic_store(&sl->key, CACHE_KEY_NONE);
	} else {
		if (atomic_load(&sl->key) != r->key) {
			slot_apply(cs, r->slot, JOP_FREE, 0, cs->lay.bpe);
			atomic_store(&sl->key, r->key);
		}
		slot_apply(cs, r->slot, r->op, r->first, r->count);
	}
	ckpt_mark(cs, r->slot);
}

static int recover_set(struct cache_set *cs, int leg, char *err, size_t errlen)
{
	struct bdev *dev = cs->legs[leg];
	size_t chunk = 1u << 20;
	uint8_t *buf = buf_get(chunk);
	if (!buf)
		return fail(err, errlen, "cache %s: out of memory", cs->name);
	/* 1. the table */
	uint64_t table_bytes = (uint64_t)cs->ckpt->npages * CACHE_PAGE;
	uint32_t loaded = 0;
	for (uint64_t off = 0; off < table_bytes; off += chunk) {
		uint64_t len = table_bytes - off < chunk ? table_bytes - off : chunk;
		int r = cache_sync_io(dev, BDEV_READ, cs->lay.table_off + off, buf, len, 0);
		if (r < 0) {
			buf_put(buf, chunk);
			return fail(err, errlen, "cache %s: cannot read the slot table of %s: %s", cs->name,
				    dev->name, strerror(-r));
		}
		for (uint64_t p = 0; p < len / CACHE_PAGE; p++)
			for (uint32_t k = 0; k < cs->ckpt->rpp; k++) {
				uint32_t s = (uint32_t)((off / CACHE_PAGE + p) * cs->ckpt->rpp + k);
				if (s >= cs->lay.nslots)
					break;
				uint8_t *rec = buf + p * CACHE_PAGE + (size_t)k * cs->lay.rec_size;
				const struct cache_slot_disk *h = (const void *)rec;
				/* a key naming a backing id the superblock cannot hold is no record of ours */
				uint64_t rkey = le64_get(h->key);
				if (!meta_slot_ok(rec, cs->lay.rec_size) || le64_get(h->nblocks) != cs->lay.bpe ||
				    (rkey != CACHE_KEY_NONE && key_bid(rkey) >= CACHE_MAX_BACKINGS)) {
					buf_put(buf, chunk);
					return fail(err, errlen,
						    "cache %s: slot record %u on %s is corrupt; the set cannot be "
						    "trusted: flush is impossible, so restore the leg from the other "
						    "one, or delete both legs to start with an empty cache "
						    "(dirty data in it will be lost)", cs->name, s, dev->name);
				}
				uint64_t key = le64_get(h->key);
				if (key == CACHE_KEY_NONE)
					continue;
				struct slot *sl = &cs->slots[s];
				atomic_store(&sl->key, key);
				uint32_t bpe = cs->lay.bpe;
				const uint8_t *vb = rec + sizeof(*h), *db = vb + bpe / 8;
				/* apply valid-clean and dirty runs from the bitmaps */
				for (uint32_t b = 0; b < bpe;) {
					int st = ((vb[b / 8] >> (b % 8)) & 1) ? (((db[b / 8] >> (b % 8)) & 1) ? 2 : 1) : 0;
					uint32_t e = b + 1;
					while (e < bpe) {
						int st2 = ((vb[e / 8] >> (e % 8)) & 1)
								  ? (((db[e / 8] >> (e % 8)) & 1) ? 2 : 1) : 0;
						if (st2 != st)
							break;
						e++;
					}
					if (st)
						slot_apply(cs, s, st == 2 ? JOP_DIRTY : JOP_VALID, b, e - b);
					b = e;
				}
				loaded++;
			}
	}
	buf_put(buf, chunk);

	/* 2. the journals */
	size_t ring = (size_t)cs->lay.jblocks * CACHE_PAGE;
	uint8_t *rbuf = buf_get(ring <= BUF_MAX ? ring : BUF_MAX);
	if (!rbuf || ring > BUF_MAX)
		return fail(err, errlen, "cache %s: out of memory reading the journal", cs->name);
	size_t cap = 1024, n = 0;
	struct rrec *recs = malloc(cap * sizeof(*recs));
	uint64_t max_seq = cs->ckpt_seq;
	for (int j = 0; j < CACHE_NJOURNALS; j++) {
		int r = cache_sync_io(dev, BDEV_READ, cs->lay.journal_off + (uint64_t)j * ring, rbuf, ring, 0);
		if (r < 0) {
			free(recs);
			buf_put(rbuf, ring);
			return fail(err, errlen, "cache %s: cannot read the journal of %s: %s", cs->name,
				    dev->name, strerror(-r));
		}
		uint64_t pos = cs->jtail[j];
		for (; pos - cs->jtail[j] < cs->lay.jblocks; pos++) {
			const struct cache_jblock_disk *b =
				(const void *)(rbuf + (pos % cs->lay.jblocks) * CACHE_PAGE);
			if (!meta_jblock_ok(b, cs->uuid, pos))
				break;
			for (uint32_t i = 0; i < le32_get(b->nrec); i++) {
				const struct cache_jrec_disk *d = &b->rec[i];
				struct rrec x = {
					.seq = le64_get(d->seq), .key = le64_get(d->key), .slot = le32_get(d->slot),
					.op = le16_get(d->op), .first = le16_get(d->first), .count = le16_get(d->count),
				};
				if (x.seq < cs->ckpt_seq || x.slot >= cs->lay.nslots || x.op < JOP_DIRTY ||
				    x.op > JOP_FREE || (uint32_t)x.first + x.count > cs->lay.bpe ||
				    (x.op != JOP_FREE && (!x.count || key_bid(x.key) >= CACHE_MAX_BACKINGS)))
					continue;
				if (n == cap) {
					cap *= 2;
					struct rrec *nr = realloc(recs, cap * sizeof(*recs));
					if (!nr) {
						free(recs);
						buf_put(rbuf, ring);
						return fail(err, errlen, "cache %s: out of memory", cs->name);
					}
					recs = nr;
				}
				recs[n++] = x;
				if (x.seq + 1 > max_seq)
					max_seq = x.seq + 1;
			}
		}
		atomic_store(&cs->journals[j].head, pos);
		atomic_store(&cs->journals[j].tail, cs->jtail[j]);
	}
	buf_put(rbuf, ring);
	qsort(recs, n, sizeof(*recs), rrec_cmp);
	for (size_t i = 0; i < n; i++)
		recover_apply(cs, &recs[i]);
	atomic_store(&cs->next_seq, max_seq);

	/* 3. the map and the free list */
	uint32_t live = 0;
	for (uint32_t s = cs->lay.nslots; s-- > 0;) {
		struct slot *sl = &cs->slots[s];
		uint64_t key = atomic_load(&sl->key);
		uint32_t bits = atomic_load(&sl->bits);
		bool any_valid = (bits & SB_FULL_VALID) || (bits & SB_HAS_BM);
		if (key != CACHE_KEY_NONE && any_valid && map_insert(&cs->map, key, s) == 0) {
			atomic_fetch_or(&sl->bits, SB_READY);
			policy_insert(cs->policy, s, key);
			live++;
		} else {
			if (key != CACHE_KEY_NONE)
				ckpt_mark(cs, s);
			slot_apply(cs, s, JOP_FREE, 0, cs->lay.bpe);
			atomic_store(&sl->key, CACHE_KEY_NONE);
			free_push(cs, s);
		}
	}
	log_info("cache %s: recovered %u cached extents (%u from the table, %zu journal records), "
		 "%llu dirty KiB", cs->name, live, loaded, n,
		 (unsigned long long)(atomic_load(&cs->dirty_blocks) * CACHE_SECTOR >> 10));
	/*
	 * 4. overwrites of dirty data the cut may have torn: whole again from
	 * the block log. After a clean stop too: a stop that gave up waiting
	 * for writes in flight records clean with some still going (their
	 * journal records are replayed above all the same), and next_seq
	 * must pass every record's seq either way.
	 */
	int dr = dlog_recover(cs, recs, n, err, errlen);
	free(recs);
	return dr;
}

/*
 * Main thread, after an unclean recovery from one leg: the block each ring
 * was writing at the stop may have reached another leg only. Recovery
 * stopped before it on the leg it read; a later recovery from the other
 * leg would replay it (its position and checksum are right), with sequence
 * numbers this run hands out again. Zero each ring's next block on every
 * healthy leg before anything is appended.
 */
static int journal_cut_heads(struct cache_set *cs)
{
	uint8_t *zero = buf_get(CACHE_PAGE);
	if (!zero)
		return -ENOMEM;
	memset(zero, 0, CACHE_PAGE);
	uint32_t failed = atomic_load(&cs->mirror.failed);
	int rc = 0;
	for (int j = 0; j < CACHE_NJOURNALS && !rc; j++) {
		uint64_t head = atomic_load(&cs->journals[j].head);
		uint64_t off = cs->lay.journal_off + ((uint64_t)j * cs->lay.jblocks + head % cs->lay.jblocks) * CACHE_PAGE;
		for (int i = 0; i < cs->mirror.nlegs && !rc; i++)
			if (!(failed & (1u << i)))
				rc = cache_sync_io(cs->legs[i], BDEV_WRITE, off, zero, CACHE_PAGE, BDEV_F_FUA);
	}
	buf_put(zero, CACHE_PAGE);
	return rc;
}

static bool all_zero(const void *p, size_t n)
{
	const uint8_t *b = p;
	for (size_t i = 0; i < n; i++)
		if (b[i])
			return false;
	return true;
}

static void uuid_str(const uint8_t u[16], char out[37])
{
	snprintf(out, 37, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1],
		 u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
}

/*
 * A worker: a request to leg (guard dev) took longer than leg_timeout
 * (leg_guard.c). Give up on it, failing the leg, unless the set is still
 * opening (nothing to fail over to yet) or this is the last leg in service
 * (failing it would declare every dirty block lost: better a stall). A
 * guard no longer in the set (a replaced leg's) is given up on freely.
 */
bool cache_leg_timed_out(void *arg, struct bdev *dev)
{
	struct cache_set *cs = arg;
	if (!atomic_load(&cs->open_done))
		return false;
	/* the place is looked up: open orders the legs by their recorded index */
	int leg = -1;
	for (int i = 0; i < cs->mirror.nlegs; i++)
		if (cs->legs[i] == dev)
			leg = i;
	if (leg < 0)
		return true; /* a replaced leg's: fails nothing */
	struct mirror *m = &cs->mirror;
	uint32_t out = atomic_load(&m->failed) | atomic_load(&m->resyncing);
	if (!(atomic_load(&m->failed) & (1u << leg))) {
		bool other = false;
		for (int k = 0; k < m->nlegs; k++)
			other |= k != leg && !(out & (1u << k));
		if (!other)
			return false;
		log_err("cache %s: leg %s did not answer within leg_timeout (%u ms): failing it", cs->name,
			cs->legs[leg]->name, cs->cfg.leg_timeout_ms);
	}
	atomic_fetch_add(&cs->st_leg_timeouts, 1);
	mirror_leg_failed(m, leg, -ETIMEDOUT);
	return true;
}

struct cache_set *cache_set_open(const struct cache_set_cfg *cfg, char *err, size_t errlen)
{
	struct bdev *legs[CACHE_MAX_LEGS] = { NULL };
	if (cfg->nlegs < 1 || cfg->nlegs > 2 || (cfg->nlegs == 1 && !cfg->allow_single_leg)) {
		fail(err, errlen, "cache %s: give two legs (a mirror), or one with allow_single_leg = yes",
		     cfg->name);
		return NULL;
	}
	for (int i = 0; i < cfg->nlegs; i++) {
		legs[i] = bdev_file_open(cfg->legs[i], cfg->size, CACHE_SECTOR, true, err, errlen);
		if (legs[i] && cfg->fault_injection) {
			struct bdev *f = bdev_fault_wrap(legs[i]);
			if (!f) {
				bdev_close(legs[i]);
				snprintf(err, errlen, "cache %s: out of memory", cfg->name);
			}
			legs[i] = f;
		}
		if (!legs[i]) {
			for (int k = 0; k < i; k++)
				bdev_close(legs[k]);
			return NULL;
		}
	}
	return cache_set_open_devs(cfg, legs, err, errlen);
}

struct cache_set *cache_set_open_devs(const struct cache_set_cfg *cfg, struct bdev **legdevs, char *err,
				      size_t errlen)
{
	struct cache_set *cs = calloc(1, sizeof(*cs));
	struct cache_sb_disk *sbs[CACHE_MAX_LEGS][2] = { { NULL } };
	int have[CACHE_MAX_LEGS] = { -1, -1 };
	bool fresh[CACHE_MAX_LEGS] = { false, false };
	bool rebuilding[CACHE_MAX_LEGS] = { false, false };
	uint8_t mark_uuid[CACHE_MAX_LEGS][16];
	const struct cache_sb_disk *mark_sb[CACHE_MAX_LEGS] = { NULL, NULL }; /* a marked leg's other copy */

	if (!cs) {
		for (int i = 0; i < cfg->nlegs; i++)
			bdev_close(legdevs[i]);
		fail(err, errlen, "out of memory");
		return NULL;
	}
	cs->version = CACHE_VERSION; /* a new set; an existing one says its own */
	cs->alone_index = -1;
	for (int i = 0; i < cfg->nlegs; i++) {
		struct bdev *g = cfg->leg_timeout_ms ? leg_guard_wrap(legdevs[i], cfg->leg_timeout_ms, cache_leg_timed_out, cs)
						     : legdevs[i];
		if (!g) {
			for (int k = 0; k < cfg->nlegs; k++)
				bdev_close(k < i ? cs->legs[k] : legdevs[k]);
			free(cs);
			fail(err, errlen, "out of memory");
			return NULL;
		}
		cs->legs[i] = g;
	}
	if (!rcu_registered++)
		rcu_register_thread(); /* call_rcu/synchronize_rcu from this thread */
	cs->cfg = *cfg;
	cs->blank_leg = -1;
	cs->name = strdup(cfg->name);
	pthread_mutex_init(&cs->alloc_lock, NULL);
	pthread_mutex_init(&cs->sb_lock, NULL);
	pthread_mutex_init(&cs->lost_lock, NULL);
	pthread_mutex_init(&cs->dwait_lock, NULL);
	pthread_mutex_init(&cs->repair_lock, NULL);
	if (cfg->nlegs < 1 || cfg->nlegs > 2 || (cfg->nlegs == 1 && !cfg->allow_single_leg)) {
		fail(err, errlen, "cache %s: give two legs (a mirror), or one with allow_single_leg = yes",
		     cfg->name);
		goto out;
	}
	for (int i = 0; i < cfg->nlegs; i++) {
		for (int k = 0; k < 2; k++) {
			sbs[i][k] = buf_get(CACHE_PAGE);
			if (!sbs[i][k] ||
			    cache_sync_io(cs->legs[i], BDEV_READ, (uint64_t)k * CACHE_PAGE, sbs[i][k], CACHE_PAGE, 0) < 0) {
				fail(err, errlen, "cache %s: cannot read the superblock of leg %s", cfg->name,
				     cfg->legs[i]);
				goto out;
			}
		}
		const char *why = NULL, *why2 = NULL;
		int a = meta_sb_check(sbs[i][0], &why), b = meta_sb_check(sbs[i][1], &why2);
		if (meta_rebuild_marked(sbs[i][0], mark_uuid[i]) || meta_rebuild_marked(sbs[i][1], mark_uuid[i])) {
			rebuilding[i] = true; /* whatever the other copy holds: not a member */
			mark_sb[i] = a == 0 ? sbs[i][0] : b == 0 ? sbs[i][1] : NULL;
		}
		else if (a == 0 && (b != 0 || le64_get(sbs[i][0]->gen) >= le64_get(sbs[i][1]->gen)))
			have[i] = 0;
		else if (b == 0)
			have[i] = 1;
		else if (all_zero(sbs[i][0], CACHE_PAGE) && all_zero(sbs[i][1], CACHE_PAGE))
			fresh[i] = true;
		else {
			fail(err, errlen, "cache %s: leg %s: %s; if it holds nothing you need, zero its first "
				"8 KiB (dd if=/dev/zero of=%s bs=4096 count=2 conv=notrunc) so tiercached formats it",
			     cfg->name, cs->legs[i]->name, why, cs->legs[i]->name);
			goto out;
		}
	}
	if (cfg->nlegs == 2 && cs->legs[0]->size != cs->legs[1]->size) {
		fail(err, errlen, "cache %s: leg %s is %llu bytes, leg %s is %llu bytes; legs of a mirror must "
			"be the same size", cfg->name, cfg->legs[1], (unsigned long long)cs->legs[1]->size,
		     cfg->legs[0], (unsigned long long)cs->legs[0]->size);
		goto out;
	}
	/* pick the newest superblock; check every leg belongs to it */
	int best = -1;
	for (int i = 0; i < cfg->nlegs; i++)
		if (have[i] >= 0 && (best < 0 || le64_get(sbs[i][have[i]]->gen) >
						     le64_get(sbs[best][have[best]]->gen)))
			best = i;
	struct cache_sb_disk *nsb = best >= 0 ? sbs[best][have[best]] : NULL;
	for (int i = 0; i < cfg->nlegs; i++)
		if (rebuilding[i] && !nsb) {
			fail(err, errlen, "cache %s: leg %s is marked as being rebuilt, and no leg holds the set "
				"to rebuild it from; if the data is not needed, zero the first 8 KiB of every leg",
			     cfg->name, cs->legs[i]->name);
			goto out;
		}
	uint32_t failed = 0, not_member = 0;
	int blank = -1; /* config index of a blank leg to resync onto */
	if (nsb) {
		memcpy(cs->uuid, nsb->set_uuid, 16);
		char u[37];
		uuid_str(cs->uuid, u);
		for (int i = 0; i < cfg->nlegs; i++) {
			/*
			 * A blank leg, or one marked as being rebuilt for this set,
			 * at a place the newest superblock records as failed (a
			 * drive swapped for a failed one, a rebuild a stop or a
			 * crash interrupted), or a marked leg whose other copy is
			 * already its own superblock as the member the newest one
			 * names (cut just before the last superblock write): the
			 * set needs nothing on it, the other leg is at least as
			 * new. Rebuild it from the other leg once the set is open.
			 * Anywhere else it is refused: the good drive may be the
			 * one missing.
			 */
			bool place_failed = false;
			if (cfg->nlegs == 2 && (fresh[i] || rebuilding[i]) && have[1 - i] >= 0) {
				uint32_t idx = 1 - (le32_get(nsb->leg_index) & 1);
				bool recorded = (le32_get(nsb->failed_mask) & (1u << idx)) != 0;
				if (fresh[i])
					place_failed = recorded;
				else
					place_failed = !memcmp(mark_uuid[i], nsb->set_uuid, 16) &&
						       (recorded || (mark_sb[i] && !all_zero(nsb->member_uuid[idx], 16) &&
								     !memcmp(mark_sb[i]->leg_uuid, nsb->member_uuid[idx], 16)));
			}
			if (place_failed) {
				blank = i;
				continue;
			}
			if (rebuilding[i]) {
				fail(err, errlen, "cache %s: leg %s is marked as being rebuilt, but for another "
					"set or at a place the set records as healthy; list the right device, or "
					"zero its first 8 KiB to start it afresh", cfg->name, cs->legs[i]->name);
				goto out;
			}
			if (fresh[i]) {
				fail(err, errlen, "cache %s: leg %s is blank but leg %s holds set %s; a replaced "
					"leg is rebuilt online with `tierctl leg replace`; to start the daemon now, "
					"give allow_single_leg = yes and list only %s", cfg->name, cfg->legs[i],
				     cfg->legs[best], u, cfg->legs[best]);
				goto out;
			}
			struct cache_sb_disk *sb = sbs[i][have[i]];
			if (memcmp(sb->set_uuid, cs->uuid, 16)) {
				char u2[37];
				uuid_str(sb->set_uuid, u2);
				fail(err, errlen, "cache %s: leg %s belongs to another cache set (\"%.64s\", %s), not "
					"to this one (%s); list the right device, or zero its first 8 KiB if its "
					"contents may be discarded", cfg->name, cfg->legs[i], sb->set_name, u2, u);
				goto out;
			}
		}
		uint32_t ext = le32_get(nsb->extent_size);
		if (ext != cfg->extent_size) {
			fail(err, errlen, "cache %s: the legs were formatted with extent = %uK but the "
				"configuration says %uK; set extent = %uK (the extent size cannot change without "
				"reformatting the legs)", cfg->name, ext >> 10, cfg->extent_size >> 10, ext >> 10);
			goto out;
		}
		if (le32_get(nsb->nlegs) != (uint32_t)cfg->nlegs && !cfg->allow_single_leg) {
			fail(err, errlen, "cache %s: the set was made of %u legs, the configuration lists %d; "
				"list both legs", cfg->name, le32_get(nsb->nlegs), cfg->nlegs);
			goto out;
		}
		/* order legs by their recorded index (a blank leg takes the other index) */
		bool swap = false;
		if (cfg->nlegs == 2) {
			int ref = blank == 0 ? 1 : 0;
			swap = le32_get(sbs[ref][have[ref]]->leg_index) == (uint32_t)(ref == 0 ? 1 : 0);
		}
		if (swap) {
			struct bdev *t = cs->legs[0];
			cs->legs[0] = cs->legs[1];
			cs->legs[1] = t;
			best = 1 - best;
		}
		/*
		 * Which device each index is. A leg whose own identity is not
		 * the member the newest superblock names for its index was
		 * replaced (`leg replace` onto another device, the configuration
		 * still listing the old one): its contents are stale however
		 * good they look, so it is failed, never read.
		 */
		bool members = !all_zero(nsb->member_uuid, sizeof(nsb->member_uuid));
		for (int c = 0; c < cfg->nlegs; c++) {
			int i = swap ? 1 - c : c; /* mirror index of config leg c */
			if (cfg->nlegs == 1)
				i = (int)le32_get(sbs[c][have[c]]->leg_index) % CACHE_MAX_LEGS;
			int at = cfg->nlegs == 1 ? 0 : i; /* where it sits in cs->legs[] */
			const uint8_t *want = nsb->member_uuid[i];
			bool want_known = members && !all_zero(want, 16);
			if (c == blank) {
				not_member |= 1u << i;
			} else if (want_known && memcmp(sbs[c][have[c]]->leg_uuid, want, 16) &&
				   !(all_zero(sbs[c][have[c]]->leg_uuid, 16) &&
				     le64_get(sbs[c][have[c]]->gen) + 1 >= le64_get(nsb->gen))) {
				/* (a leg with no identity of its own yet, from before they
				 * existed, whose superblock is the newest but one: the
				 * first write after an upgrade was cut on it) */
				log_err("cache %s: leg %s is not the device the set last recorded at its place (it "
					"was replaced by `tierctl leg replace`): it is out of service; list the "
					"replacement in legs =", cfg->name, cs->legs[at]->name);
				not_member |= 1u << i;
			}
			if (want_known)
				memcpy(cs->leg_uuid[at], want, 16);
			else if (c != blank && !all_zero(sbs[c][have[c]]->leg_uuid, 16))
				memcpy(cs->leg_uuid[at], sbs[c][have[c]]->leg_uuid, 16);
			else if (getrandom(cs->leg_uuid[at], 16, 0) != 16)
				memset(cs->leg_uuid[at], 0, 16); /* unchecked, as before */
		}
		if (blank >= 0)
			cs->blank_leg = swap ? 1 - blank : blank;
		struct cache_layout lay = {
			.leg_size = le64_get(nsb->leg_size),
			.extent_size = ext,
			.bpe = ext / CACHE_SECTOR,
			.rec_size = le32_get(nsb->rec_size),
			.nslots = le32_get(nsb->nslots),
			.jblocks = le32_get(nsb->jblocks),
			.table_off = le64_get(nsb->table_off),
			.journal_off = le64_get(nsb->journal_off),
			.data_off = le64_get(nsb->data_off),
		};
		uint32_t version = le32_get(nsb->version);
		if (version >= CACHE_VERSION) {
			lay.dlog_off = le64_get(nsb->dlog_off);
			lay.dlog_pages = le32_get(nsb->dlog_pages);
		}
		if (cs->legs[0]->size < lay.leg_size || lay.data_off + (uint64_t)lay.nslots * ext > lay.leg_size) {
			fail(err, errlen, "cache %s: legs are %llu bytes but the set was formatted for %llu; "
				"give size = %llu", cfg->name, (unsigned long long)cs->legs[0]->size,
			     (unsigned long long)lay.leg_size, (unsigned long long)lay.leg_size);
			goto out;
		}
		/*
		 * The geometry is a function of leg size and extent size
		 * (meta_layout, unchanged since the first format): anything
		 * else is a superblock that passed its checksum but cannot be
		 * ours, and trusting it divides by a zero rec_size, reads a
		 * ring of zero blocks or sizes the slot array from garbage.
		 */
		struct cache_layout want;
		if (le32_get(nsb->block_size) != CACHE_SECTOR || le32_get(nsb->njournals) != CACHE_NJOURNALS ||
		    meta_layout(lay.leg_size, ext, version, &want) < 0 || want.rec_size != lay.rec_size ||
		    want.nslots != lay.nslots || want.jblocks != lay.jblocks || want.table_off != lay.table_off ||
		    want.journal_off != lay.journal_off || want.data_off != lay.data_off ||
		    want.dlog_off != lay.dlog_off || want.dlog_pages != lay.dlog_pages ||
		    (version >= CACHE_VERSION && le32_get(nsb->dlog_rings) != CACHE_DLOG_RINGS)) {
			fail(err, errlen, "cache %s: the superblock of %s describes a layout tiercached never writes "
				"(%u slots of %u bytes, %u journal blocks per ring, table at %llu, journal at %llu, "
				"data at %llu for %llu-byte legs); the set cannot be trusted: restore the leg from "
				"the other one, or delete both legs to start with an empty cache (dirty data in it "
				"will be lost)", cfg->name, cs->legs[best]->name, lay.nslots, lay.rec_size, lay.jblocks,
			     (unsigned long long)lay.table_off, (unsigned long long)lay.journal_off,
			     (unsigned long long)lay.data_off, (unsigned long long)lay.leg_size);
			goto out;
		}
		cs->lay = lay;
		/* a version 1 set gains the write-intent page (version 2); a version 2 set keeps its layout */
		cs->version = version == CACHE_VERSION_V1 ? CACHE_VERSION_V2 : version;
		cs->sb_gen = le64_get(nsb->gen);
		cs->ckpt_seq = le64_get(nsb->ckpt_seq);
		for (int j = 0; j < CACHE_NJOURNALS; j++)
			cs->jtail[j] = le64_get(nsb->jtail[j]);
		memcpy(cs->backing, nsb->backing, sizeof(cs->backing));
		/*
		 * failed_mask is by leg index (the superblock's leg_index), and
		 * so is cs->legs[] with two legs. One leg listed alone is index
		 * 0 of the mirror whatever its index was: it may run alone only
		 * if it is not the one recorded stale; the other is gone.
		 */
		failed = (le32_get(nsb->failed_mask) | not_member) & ((1u << CACHE_MAX_LEGS) - 1);
		if (cfg->nlegs == 1) {
			uint32_t self = le32_get(nsb->leg_index);
			if (self >= CACHE_MAX_LEGS || (failed & (1u << self))) {
				fail(err, errlen, "cache %s: leg %s is recorded as failed in the set's superblock (it "
					"missed writes the other leg took); it cannot serve alone: list the other leg",
				     cfg->name, cs->legs[0]->name);
				goto out;
			}
			if (le32_get(nsb->nlegs) == 2) {
				/* the other leg misses what this run writes: say so in our superblocks */
				cs->alone_index = (int)self;
				memcpy(cs->alone_other_uuid, nsb->member_uuid[1 - self], 16);
				log_warn("cache %s: running on leg %s alone; the other leg is recorded as stale and is "
					 "rebuilt (tierctl leg replace) before it serves again", cfg->name, cs->legs[0]->name);
			}
			failed = 0;
		} else if (failed == 3) {
			fail(err, errlen, "cache %s: both legs are recorded as failed in the set's superblock; no leg "
				"holds data that can be trusted: delete both legs to start with an empty cache (dirty "
				"data in it is lost)", cfg->name);
			goto out;
		}
		if (!le32_get(nsb->clean))
			log_warn("cache %s: not shut down cleanly; recovering from the journal", cfg->name);
	} else if (meta_layout(cs->legs[0]->size, cfg->extent_size, CACHE_VERSION, &cs->lay) < 0) {
		fail(err, errlen, "cache %s: legs of %llu bytes are too small for %u KiB extents; give a "
			"larger size", cfg->name, (unsigned long long)cs->legs[0]->size, cfg->extent_size >> 10);
		goto out;
	}
	if (alloc_memory(cs) < 0) {
		fail(err, errlen, "cache %s: out of memory for %u slots", cfg->name, cs->lay.nslots);
		goto out;
	}
	mirror_init(&cs->mirror, cs->legs, cfg->nlegs, failed);
	cs->mirror.persist = persist_failed;
	cs->mirror.persist_arg = cs;
	cs->mirror.read_error = cache_repair_note;
	cs->mirror.all_failed = all_legs_failed;
	if (intent_init(&cs->intent, cs) < 0 || dlog_init(cs) < 0) {
		fail(err, errlen, "cache %s: out of memory", cfg->name);
		goto out;
	}
	bool unclean = nsb && !le32_get(nsb->clean);
	if (failed)
		log_warn("cache %s: degraded: a leg was recorded as failed; replace it", cfg->name);
	if (nsb) {
		int leg = best;
		if (failed & (1u << leg))
			leg = 1 - leg;
		if (recover_set(cs, leg, err, errlen) < 0)
			goto out;
		if (unclean &&
		    intent_recover(cs, leg, le32_get(nsb->version) == CACHE_VERSION_V1, err, errlen) < 0)
			goto out;
		int jr = unclean ? journal_cut_heads(cs) : 0;
		if (jr < 0) {
			fail(err, errlen, "cache %s: cannot write the journal: %s", cfg->name, strerror(-jr));
			goto out;
		}
	} else if (format_set(cs, err, errlen) < 0) {
		goto out;
	}
	cs->cleaner = cleaner_new(cs);
	if (!cs->cleaner) {
		fail(err, errlen, "cache %s: out of memory", cfg->name);
		goto out;
	}
	/* the first superblock of this run: not clean until shutdown says so */
	struct sync_call c = { .cs = cs };
	cs->clean_flag = false;
	cache_sb_write(cs, (void (*)(void *, int))sync_done, &c);
	pthread_mutex_init(&c.lock, NULL);
	pthread_cond_init(&c.cond, NULL);
	pthread_mutex_lock(&c.lock);
	while (!c.done)
		pthread_cond_wait(&c.cond, &c.lock);
	pthread_mutex_unlock(&c.lock);
	if (c.err) {
		fail(err, errlen, "cache %s: cannot write the superblock: %s", cfg->name, strerror(-c.err));
		goto out;
	}
	/*
	 * After an unclean stop the legs may hold different journal tails (a
	 * block that reached one leg only) and the reconciled regions changed
	 * in RAM: a checkpoint now gives both legs the same metadata before
	 * anything is served, whichever leg a later recovery reads.
	 */
	if (unclean) {
		struct sync_call k = { .cs = cs };
		int r = sync_run(ckpt_now_fn, &k);
		if (r) {
			fail(err, errlen, "cache %s: cannot write the recovered metadata: %s", cfg->name,
			     strerror(-r));
			goto out;
		}
	}
	int wr = intent_clear_all(cs);
	if (wr < 0) {
		fail(err, errlen, "cache %s: cannot write the write-intent page: %s", cfg->name, strerror(-wr));
		goto out;
	}
	struct sync_call t = { .cs = cs };
	sync_run(tick_add, &t);
	for (int i = 0; i < cfg->nlegs; i++)
		for (int k = 0; k < 2; k++)
			buf_put(sbs[i][k], CACHE_PAGE);
	atomic_store(&cs->open_done, true);
	if (cs->blank_leg >= 0) {
		int b = cs->blank_leg;
		char rerr[256];
		log_warn("cache %s: leg %s is blank or was being rebuilt (a new drive, or a resync that a stop "
			 "or a crash interrupted): rebuilding it from %s", cfg->name, cs->legs[b]->name,
			 cs->legs[1 - b]->name);
		if (cache_set_leg_replace(cs, b, cs->legs[b], rerr, sizeof(rerr)) < 0)
			log_err("%s; the set stays degraded", rerr);
	}
	return cs;
out:
	for (int i = 0; i < CACHE_MAX_LEGS; i++)
		for (int k = 0; k < 2; k++)
			if (sbs[i][k])
				buf_put(sbs[i][k], CACHE_PAGE);
	cs->cfg.nlegs = cfg->nlegs;
	cache_set_close(cs);
	return NULL;
}

/* ---- volumes --------------------------------------------------------------------------- */

struct bdev *cache_vol_open(struct cache_set *cs, const char *lun, struct bdev *backing,
			    const char *backing_path, enum cache_mode mode, char *err, size_t errlen)
{
	struct stat st = { 0 };
	if (backing_path && stat(backing_path, &st) < 0) {
		fail(err, errlen, "cache %s: cannot stat backing %s: %s", cs->name, backing_path, strerror(errno));
		return NULL;
	}
	bool blk = !backing_path || S_ISBLK(st.st_mode);
	if (!backing_path)
		backing_path = backing->name;
	uint64_t ino = blk ? 0 : (uint64_t)st.st_ino, fsdev = blk ? 0 : (uint64_t)st.st_dev;
	int bid = -1, freeb = -1;
	pthread_mutex_lock(&cs->sb_lock);
	for (int i = 0; i < CACHE_MAX_BACKINGS; i++) {
		struct cache_backing_disk *b = &cs->backing[i];
		if (!b->lun[0]) {
			if (freeb < 0)
				freeb = i;
			continue;
		}
		if (strncmp(b->lun, lun, sizeof(b->lun)))
			continue;
		bid = i;
		if (le64_get(b->size) != backing->size || le64_get(b->ino) != ino || le64_get(b->fsdev) != fsdev) {
			pthread_mutex_unlock(&cs->sb_lock);
			fail(err, errlen, "cache %s: lun %s: the backing store %s is not the one this cache holds "
				"data for (%.128s, %llu bytes%s); put the original store back, or if the data in "
				"the cache must be discarded, delete the legs to start with an empty cache",
			     cs->name, lun, backing_path, b->path, (unsigned long long)le64_get(b->size),
			     le64_get(b->ino) ? ", another inode" : "");
			return NULL;
		}
		break;
	}
	bool added = false;
	if (bid < 0) {
		if (freeb < 0) {
			pthread_mutex_unlock(&cs->sb_lock);
			fail(err, errlen, "cache %s: more than %d LUNs use this set; give some another set",
			     cs->name, CACHE_MAX_BACKINGS);
			return NULL;
		}
		bid = freeb;
		struct cache_backing_disk *b = &cs->backing[bid];
		memset(b, 0, sizeof(*b));
		snprintf(b->lun, sizeof(b->lun), "%s", lun);
		snprintf(b->path, sizeof(b->path), "%s", backing_path);
		b->size = le64_of(backing->size);
		b->ino = le64_of(ino);
		b->fsdev = le64_of(fsdev);
		b->bid = le32_of((uint32_t)bid);
		b->is_blockdev = le32_of(blk);
		added = true;
	}
	pthread_mutex_unlock(&cs->sb_lock);
	if (added) {
		struct sync_call c = { .cs = cs };
		pthread_mutex_init(&c.lock, NULL);
		pthread_cond_init(&c.cond, NULL);
		cache_sb_write(cs, (void (*)(void *, int))sync_done, &c);
		pthread_mutex_lock(&c.lock);
		while (!c.done)
			pthread_cond_wait(&c.cond, &c.lock);
		pthread_mutex_unlock(&c.lock);
		if (c.err) {
			fail(err, errlen, "cache %s: cannot record lun %s in the superblock", cs->name, lun);
			return NULL;
		}
	}
	struct cache_vol *v = cache_vol_new(cs, lun, backing, (uint32_t)bid, mode);
	if (!v) {
		fail(err, errlen, "out of memory");
		return NULL;
	}
	atomic_store(&cs->vols[bid], v);
	log_info("cache %s: lun %s attached (%s)", cs->name, lun, cache_mode_name(mode));
	return (struct bdev *)v;
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
		if (key != CACHE_KEY_NONE && atomic_load(&cs->vols[key_bid(key)]))
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

int cache_vol_set_mode(struct bdev *vol, enum cache_mode mode)
{
	struct cache_vol *v = (struct cache_vol *)vol;
	enum cache_mode old = cache_vol_mode(v);
	if (old == mode)
		return 0;
	/*
	 * New writes follow the new mode at once; write-through, write-around
	 * and pass-through writes over dirty blocks invalidate them first, so
	 * switching before the flush is safe, and the flush converges because
	 * nothing new becomes dirty. Then destage what is dirty.
	 */
	cache_vol_store_mode(v, mode);
	if (old == CACHE_WRITE_BACK)
		return cache_set_flush(cache_vol_set(v), 0);
	return 0;
}

/* ---- shutdown / close -------------------------------------------------------------------- */

int cache_set_shutdown(struct cache_set *cs)
{
	/* no new foreground I/O (the front end drained); wait for the cleaner and fills */
	atomic_store(&cs->stopping, 1);
	for (int i = 0; i < 10000 && (atomic_load(&cs->fg_inflight) || atomic_load(&cs->bg_inflight)); i++)
		usleep(1000);
	struct sync_call t = { .cs = cs };
	sync_run(tick_del, &t);
	for (int i = 0; i < 5000; i++) {
		uint64_t rate, busy;
		cleaner_stats(cs->cleaner, &rate, &busy);
		if (!busy)
			break;
		usleep(1000);
	}
	struct sync_call c = { .cs = cs };
	int r = sync_run(ckpt_final_fn, &c);
	if (r)
		log_err("cache %s: final checkpoint failed: %s; the next start replays the journal",
			cs->name, strerror(-r));
	else
		log_info("cache %s: metadata checkpointed, clean shutdown recorded", cs->name);
	/* a leg that failed during the checkpoint has its failure recorded still: let it land */
	for (int i = 0; i < 10000 && atomic_load(&cs->sb_jobs); i++)
		usleep(1000);
	return r;
}

void cache_set_close(struct cache_set *cs)
{
	if (!cs)
		return;
	/*
	 * Eviction batches' RCU callbacks use the set; each is counted in
	 * bg_inflight until its last access. Map tables freed by call_rcu use
	 * nothing else, so with no batch left there is no grace period to wait
	 * for (a barrier costs one; tests open and close thousands of sets).
	 */
	if (atomic_load(&cs->bg_inflight))
		rcu_barrier();
	if (cs->cleaner)
		cleaner_free(cs->cleaner);
	for (int i = 0; i < CACHE_MAX_LEGS; i++)
		bdev_close(cs->legs[i]);
	for (int i = 0; i < cs->nold_legs; i++)
		bdev_close(cs->old_legs[i]);
	if (cs->policy)
		policy_free(cs->policy);
	if (atomic_load(&cs->map.t))
		map_destroy(&cs->map);
	if (cs->bm.group)
		bm_destroy(&cs->bm);
	if (cs->ckpt) {
		for (int i = 0; i < CKPT_INFLIGHT; i++)
			if (cs->ckpt->buf[i])
				buf_put(cs->ckpt->buf[i], CACHE_PAGE);
		free(cs->ckpt);
	}
	for (int i = 0; i < CACHE_MAX_LEGS; i++)
		if (cs->sbbuf[i])
			buf_put(cs->sbbuf[i], CACHE_PAGE);
	for (int j = 0; j < CACHE_NJOURNALS; j++)
		if (cs->journals[j].buf) {
			buf_put(cs->journals[j].buf, CACHE_PAGE);
			pthread_mutex_destroy(&cs->journals[j].lock);
		}
	if (cs->mirror.dev.ops)
		mirror_destroy(&cs->mirror);
	intent_destroy(&cs->intent);
	dlog_destroy(cs);
	free(cs->slots);
	free(cs->free_bits);
	free(cs->retire_bits);
	free(cs->grace_bits);
	free((void *)cs->ckpt_dirty);
	pthread_mutex_destroy(&cs->alloc_lock);
	pthread_mutex_destroy(&cs->sb_lock);
	pthread_mutex_destroy(&cs->lost_lock);
	pthread_mutex_destroy(&cs->dwait_lock);
	pthread_mutex_destroy(&cs->repair_lock);
	free(cs->name);
	free(cs);
}

/* ---- lost ranges ------------------------------------------------------------------------------ */

/*
 * Add [lo, hi) of backing bid to the sorted list, merging every entry it
 * overlaps or touches; a range that would need a new entry in a full list
 * is counted in lost_dropped. Caller holds lost_lock.
 */
static void lost_add(struct cache_set *cs, uint32_t bid, const char *lun, uint64_t lo, uint64_t hi)
{
	struct lost_range *l = cs->lost;
	int n = cs->nlost, i = 0;

	while (i < n && (l[i].bid < bid || (l[i].bid == bid && l[i].hi < lo)))
		i++;
	int j = i;
	while (j < n && l[j].bid == bid && l[j].lo <= hi) {
		if (l[j].lo < lo)
			lo = l[j].lo;
		if (l[j].hi > hi)
			hi = l[j].hi;
		j++;
	}
	if (j == i) {
		if (n == CACHE_LOST_MAX) {
			cs->lost_dropped++;
			return;
		}
		memmove(&l[i + 1], &l[i], (size_t)(n - i) * sizeof(l[0]));
		cs->nlost = n + 1;
	} else {
		memmove(&l[i + 1], &l[j], (size_t)(n - j) * sizeof(l[0]));
		cs->nlost = n - (j - i) + 1;
	}
	l[i].bid = bid;
	snprintf(l[i].lun, sizeof(l[i].lun), "%s", lun);
	l[i].lo = lo;
	l[i].hi = hi;
}

/* Any worker thread (see cache_int.h); takes lost_lock per dirty run. */
void cache_lost_note(struct cache_set *cs, uint32_t bid, uint32_t s, uint64_t off, uint32_t first,
		     uint32_t count)
{
	struct cache_vol *v = bid < CACHE_SET_MAX_VOLS ? atomic_load(&cs->vols[bid]) : NULL;
	const char *lun = v ? cache_vol_name(v) : "";
	uint32_t end = first + count;

	for (uint32_t b = first; b < end;) {
		if (!slot_any_dirty(cs, s, b, 1)) {
			b++;
			continue;
		}
		uint32_t e = b + 1;
		while (e < end && slot_any_dirty(cs, s, e, 1))
			e++;
		pthread_mutex_lock(&cs->lost_lock);
		lost_add(cs, bid, lun, off + (uint64_t)(b - first) * CACHE_SECTOR,
			 off + (uint64_t)(e - first) * CACHE_SECTOR);
		pthread_mutex_unlock(&cs->lost_lock);
		b = e;
	}
}

/* ---- status ------------------------------------------------------------------------------- */

uint64_t cache_set_mem_bytes(const struct cache_set *cs)
{
	return map_mem_bytes(&cs->map) + atomic_load(&cs->bm.allocated_bytes) +
	       (uint64_t)(cs->lay.nslots + 63) / 64 * 8 /* free list */ + (cs->lay.nslots + 7) / 8 +
	       (cs->policy ? policy_mem_bytes(cs->policy) : 0);
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
	st->slots_used = cs->lay.nslots - cs->nfree;
	st->dirty_bytes = atomic_load(&cs->dirty_blocks) * CACHE_SECTOR;
	st->read_hits = atomic_load(&cs->st_read_hits);
	st->read_misses = atomic_load(&cs->st_read_misses);
	st->read_partial = atomic_load(&cs->st_read_partial);
	st->write_hits = atomic_load(&cs->st_write_hits);
	st->write_misses = atomic_load(&cs->st_write_misses);
	uint64_t reads = st->read_hits + st->read_misses + st->read_partial;
	st->hit_ratio = reads ? (double)st->read_hits / (double)reads : 0.0;
	st->promotions = atomic_load(&cs->st_promotions);
	st->topups = atomic_load(&cs->st_topups);
	st->evictions = atomic_load(&cs->st_evictions);
	st->destaged_bytes = atomic_load(&cs->st_destaged_bytes);
	uint64_t busy;
	cleaner_stats(cs->cleaner, &st->cleaner_rate_bps, &busy);
	st->lost_ios = atomic_load(&cs->st_lost_ios);
	st->leg_read_errors = atomic_load(&cs->st_read_errors);
	st->leg_timeouts = atomic_load(&cs->st_leg_timeouts);
	st->leg_repairs = atomic_load(&cs->st_repairs);
	uint64_t parked;
	uint32_t regions;
	intent_stats(cs, &st->intent_writes, &parked, &regions);
	st->block_log_writes = atomic_load(&cs->st_dlog_records);
	st->block_log_waits = atomic_load(&cs->st_dlog_waits);
	st->version = cs->version;
	pthread_mutex_lock(&cs->lost_lock);
	for (int i = 0; i < cs->nlost; i++) {
		memcpy(st->lost[i].lun, cs->lost[i].lun, sizeof(st->lost[i].lun));
		st->lost[i].offset = cs->lost[i].lo;
		st->lost[i].length = cs->lost[i].hi - cs->lost[i].lo;
	}
	st->nlost = cs->nlost;
	st->lost_dropped = cs->lost_dropped;
	pthread_mutex_unlock(&cs->lost_lock);
	st->mem_bytes = cache_set_mem_bytes(cs);
	for (int i = 0; i < CACHE_SET_MAX_VOLS && st->nluns < 16; i++) {
		struct cache_vol *v = atomic_load(&cs->vols[i]);
		if (!v)
			continue;
		snprintf(st->luns[st->nluns], sizeof(st->luns[0]), "%s", cache_vol_name(v));
		st->lun_mode[st->nluns] = cache_vol_mode(v);
		st->nluns++;
	}
}
