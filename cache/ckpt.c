/*
 * ckpt.c - checkpoints: the slot table written out (dirty pages only, a
 * few in flight), then a superblock naming it and the journal position to
 * replay from, so the journals can be reused.
 *
 * A checkpoint starts when a journal ring is half full and its worker has
 * no ring left to move on to (cache_want_checkpoint, journal.c),
 * on demand (the main thread through cache_sync_run) and at shutdown (the
 * final one records a clean stop). It does not write its superblock while
 * a block log record older than its seq is in flight (dlog.c).
 *
 * Threading: on worker 0.
 */
#include "cache/cache_int.h"

#include "common/log.h"

#include <string.h>

/* ---- checkpoint ---------------------------------------------------------------------- */

void cache_encode_slot(struct cache_set *cs, uint32_t s, uint8_t *rec)
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
		slot_encode_bits(cs, s, vb, db);
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
	else
		atomic_fetch_add_explicit(&cs->st.checkpoints, 1, memory_order_relaxed);
	for (int j = 0; j < CACHE_NJOURNALS; j++) {
		struct journal *jr = &cs->journals[j];
		atomic_store(&jr->tail, ck->heads[j]);
		pthread_mutex_lock(&jr->lock);
		bool waiting = jr->pend_head != NULL;
		pthread_mutex_unlock(&jr->lock);
		if (waiting)
			journal_kick_owner(jr);
	}
	if (!err)
		dlog_release(cs, ck->dheads); /* else the next checkpoint frees it */
	cs->ck.running = false;
	struct sync_call *w = ck->waiter;
	ck->waiter = NULL;
	struct sync_call *q = cs->ck.queued;
	if (q) {
		/* a checkpoint the main thread waits for was asked for meanwhile */
		cs->ck.queued = NULL;
		ckpt_sync_start(q, cs->ck.queued_final);
	} else if (atomic_load(&cs->ck.wanted)) {
		/*
		 * None after the stop's: shutdown waits for the superblock
		 * writes in flight (sb.jobs), not for a checkpoint's table
		 * pages, so one started now could complete into a freed set;
		 * and it would record the clean stop again (ck->final stays).
		 */
		if (ck->final)
			atomic_store(&cs->ck.wanted, false);
		else
			ckpt_start(cs);
	}
	/* last: nothing here runs after its waiter is woken */
	if (w)
		cache_sync_done(w, err);
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
		if (atomic_fetch_and(&cs->ck.dirty[s / 8], (uint8_t)~bit) & bit)
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
			cache_encode_slot(cs, s, buf + (size_t)k * cs->lay.rec_size);
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
		pthread_mutex_lock(&cs->sb.lock);
		cs->ck.seq = ck->seq;
		for (int j = 0; j < CACHE_NJOURNALS; j++)
			cs->jtail[j] = ck->heads[j];
		cs->clean_flag = ck->final;
		pthread_mutex_unlock(&cs->sb.lock);
		ck->cursor++; /* once */
		cache_sb_write(cs, &ck->sbj, ckpt_sb_done, ck);
	}
}

/* Worker 0. */
static void ckpt_start(struct cache_set *cs)
{
	struct ckpt *ck = cs->ck.run;
	if (cs->ck.running)
		return;
	cs->ck.running = true;
	atomic_store(&cs->ck.wanted, false);
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
	struct cache_set *cs = arg;
	atomic_store(&cs->ck.want_posted, false);
	ckpt_start(cs);
}

static void ckpt_resume_fn(void *arg)
{
	struct cache_set *cs = arg;
	atomic_store(&cs->ck.resume_posted, false);
	if (cs->ck.running)
		ckpt_pump(cs->ck.run);
}

/*
 * These two post calls embedded in the set: one lost to a refused malloc
 * would leave the journal without a checkpoint for good (wanted stays
 * set, so nobody asks again) or a checkpoint waiting on the block log,
 * and writes would stall once the journal filled.
 */

/* Any worker: a checkpoint waiting for the block log may go on (dlog_finish). */
void cache_ckpt_resume(struct cache_set *cs)
{
	if (!atomic_exchange(&cs->ck.resume_posted, true))
		worker_post_call(worker_get(0), &cs->ck.resume_call, ckpt_resume_fn, cs);
}

/* Any thread. */
void cache_want_checkpoint(struct cache_set *cs)
{
	if (!atomic_exchange(&cs->ck.wanted, true) && !atomic_exchange(&cs->ck.want_posted, true))
		worker_post_call(worker_get(0), &cs->ck.want_call, ckpt_post, cs);
}

/*
 * Worker 0: a checkpoint the main thread waits for (cache_sync_run: one at a
 * time). If one is running, ours starts when it ends (ckpt_sb_done). It
 * used to post itself again until then: worker 0 then ran that post round
 * after round without going back to its ring, so the running checkpoint's
 * completions were never reaped and a stop hung (seen in
 * test_cache_destage_overwrite and the power-cut replay).
 */
static void ckpt_sync_start(struct sync_call *c, bool final)
{
	struct cache_set *cs = c->cs;
	if (cs->ck.running) {
		cs->ck.queued = c;
		cs->ck.queued_final = final;
		return;
	}
	cs->ck.run->final = final;
	cs->ck.run->waiter = c;
	ckpt_start(cs);
}

/* Worker 0: the last checkpoint of a clean shutdown. */
void cache_ckpt_final_fn(void *arg) { ckpt_sync_start(arg, true); }

/* Worker 0: a checkpoint now (after recovery: both legs' metadata the same). */
void cache_ckpt_now_fn(void *arg) { ckpt_sync_start(arg, false); }
