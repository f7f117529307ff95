/*
 * journal.c - the metadata log with group commit.
 *
 * A write-back write is acknowledged only when its data and the record that
 * says where that data is are durable on every healthy leg. Writing a 4 KiB
 * slot-table page per 4 KiB write would double the I/O; instead each change
 * becomes a 32-byte record appended to a log block, and all records that
 * arrive while one log block is being written share the next one: with 16
 * writes in flight, one metadata write serves up to 16 data writes.
 *
 * Rings per worker thread (CACHE_NJOURNALS on disk; with more workers than
 * rings, workers share rings round-robin): a worker does not wait on
 * another thread's commit, and the ring's mutex is uncontended. Records carry
 * a global sequence number; recovery merges the rings in seq order. At most
 * one block per ring is in flight, and its records complete (in order)
 * only when it is durable: a later block can never be acknowledged ahead of
 * an earlier one of the same ring, and recovery stops at the first block
 * whose position or checksum is wrong.
 *
 * The ring is reused after a checkpoint (ckpt.c) wrote the slot table and
 * moved the ring's tail; when the ring fills, commits pause until then.
 *
 * Threading: journal_append and journal_kick on worker threads; a record's
 * done() runs on the worker that appended it.
 */
#include "cache/cache_int.h"

#include <string.h>

static bool journal_idle(struct journal *j)
{
	pthread_mutex_lock(&j->lock);
	bool idle = !j->busy && !j->pend_head;
	pthread_mutex_unlock(&j->lock);
	return idle;
}

/* Rings worker idx of nw owns (idx, idx + nw, ...); 0: more workers than rings share them. */
static unsigned rings_owned(unsigned idx, unsigned nw)
{
	return nw && nw < CACHE_NJOURNALS ? (CACHE_NJOURNALS - 1 - idx) / nw + 1 : 0;
}

/*
 * Worker thread. The ring the calling worker appends to. Of W workers
 * (W < CACHE_NJOURNALS), worker i owns rings i, i + W, i + 2W, ... and
 * uses one at a time: records join it while it has a block in flight or
 * records waiting (the group commit), and only when it is idle does the
 * worker move on to its next ring. So every record the worker appended
 * before is durable when it changes rings, and its records become durable
 * in the order it appended them, as with a single ring; but a writer at
 * low queue depth spreads its blocks over all its rings, each filling
 * R times slower, and a checkpoint (asked for at half a ring) is due R
 * times less often. With one ring, one worker writing at QD1 on 320 MiB
 * legs asked for a checkpoint every 40 writes, and its table pages cost
 * about 1.6 more leg writes per acknowledged write (make bench-device).
 *
 * A worker that is never idle (a queue of writes: one block in flight and
 * records waiting behind it, all the time) moves on in journal_kick
 * instead: when a kick finds its ring half full, with records waiting and
 * no block in flight, they go to its next ring if that one is idle and
 * less than half full (journal_move_on; or the one after it, and so on).
 * Nothing of the worker is in flight then, so the order above still holds.
 * Only when none of its rings has room is a checkpoint asked for. The
 * owner makes the move, so a ring's blocks are submitted (and completed,
 * and the ring kicked again) on its owner, also when a checkpoint lets a
 * full ring go on (journal_kick_owner). Before, such a worker filled one
 * ring and asked for a checkpoint every half ring: R times as many, each
 * writing most of the slot table again under random writes (72
 * checkpoints in 5 s of bench-device's write-back QD32 row; by the
 * counts, about two thirds of the leg writes that were not data).
 */
struct journal *journal_self(struct cache_set *cs)
{
	unsigned idx = worker_index(worker_self()), nw = workers_count(), own = rings_owned(idx, nw);
	if (!own)
		return &cs->journals[idx % CACHE_NJOURNALS];
	uint8_t *k = &cs->jcur[idx];
	struct journal *j = &cs->journals[idx + *k * nw];
	if (own > 1 && journal_idle(j)) {
		*k = (uint8_t)((*k + 1) % own);
		j = &cs->journals[idx + *k * nw];
	}
	return j;
}

/*
 * Ring j (lock held, nothing in flight, records waiting) is half full: the
 * calling worker's next ring that can take over (idle, under half full),
 * if j is the ring it appends to; NULL otherwise. Only the worker that
 * owns the rings moves, so it is the only thread that ever holds two ring
 * locks (j's, then one other's): no lock order to keep.
 */
static struct journal *journal_move_on(struct cache_set *cs, struct journal *j)
{
	struct worker *self = worker_self();
	if (!self)
		return NULL;
	unsigned nw = workers_count(), idx = worker_index(self), own = rings_owned(idx, nw);
	uint8_t *k = &cs->jcur[idx];
	if (own < 2 || j != &cs->journals[idx + *k * nw])
		return NULL;
	/*
	 * The first of its other rings, in turn, with room: they do not fill
	 * evenly (a checkpoint frees only what was written before it started,
	 * and a move when idle does not look at room).
	 */
	for (unsigned step = 1; step < own; step++) {
		unsigned nk = (*k + step) % own;
		struct journal *n = &cs->journals[idx + nk * nw];
		pthread_mutex_lock(&n->lock);
		bool free_ = !n->busy && !n->pend_head &&
			     atomic_load(&n->head) - atomic_load(&n->tail) < cs->lay.jblocks / 2;
		if (free_) {
			/* the records waiting keep their order, and their seqs: recovery merges rings by seq */
			*n->pend_tail = j->pend_head;
			n->pend_tail = j->pend_tail;
			j->pend_head = NULL;
			j->pend_tail = &j->pend_head;
			*k = (uint8_t)nk;
			j->full = false; /* its wait, if any, ends here: a later one is counted again */
			atomic_fetch_add_explicit(&cs->st.journal_moves, 1, memory_order_relaxed);
		}
		pthread_mutex_unlock(&n->lock);
		if (free_)
			return n;
	}
	return NULL;
}

static void call_done(void *arg)
{
	struct jwait *w = arg;
	w->done(w, w->err);
}

static void journal_written(struct bdev_req *req, int err)
{
	struct journal *j = req->priv;

	pthread_mutex_lock(&j->lock);
	struct jwait *list = j->inflight;
	j->inflight = NULL;
	j->busy = false;
	j->commits++;
	pthread_mutex_unlock(&j->lock);
	struct worker *self = worker_self();
	while (list) {
		struct jwait *w = list;
		list = w->next;
		w->err = err;
		/* done() runs on the appender's worker (another one only when
		 * more workers than rings share this ring) */
		if (w->worker == self)
			w->done(w, err);
		else
			worker_post_call(w->worker, &w->call, call_done, w);
	}
	journal_kick(j);
}

/*
 * Any worker thread. Starts a commit if none is in flight; the block's
 * completion runs on the calling worker. The ring's mutex is uncontended
 * unless several workers share a ring; it is never held across I/O.
 */
void journal_kick(struct journal *j)
{
	struct cache_set *cs = j->cs;

	pthread_mutex_lock(&j->lock);
	if (j->busy || !j->pend_head) {
		pthread_mutex_unlock(&j->lock);
		return;
	}
	uint64_t head = atomic_load(&j->head), tail = atomic_load(&j->tail);
	if (head - tail >= cs->lay.jblocks / 2) {
		struct journal *n = journal_move_on(cs, j);
		if (n) {
			pthread_mutex_unlock(&j->lock);
			journal_kick(n);
			return;
		}
		j->half_full(cs);
	}
	if (head - tail >= cs->lay.jblocks) {
		if (!j->full)
			atomic_fetch_add_explicit(&cs->st.journal_full_waits, 1, memory_order_relaxed);
		j->full = true;
		pthread_mutex_unlock(&j->lock);
		return; /* full: the checkpoint's completion kicks us again */
	}

	j->full = false;
	struct cache_jblock_disk *b = j->buf;
	memset(b, 0, sizeof(*b));
	uint32_t n = 0;
	struct jwait **tailp = &j->inflight;
	while (j->pend_head && n < JBLOCK_RECS) {
		struct jwait *w = j->pend_head;
		j->pend_head = w->next;
		b->rec[n++] = w->rec;
		w->next = NULL;
		*tailp = w;
		tailp = &w->next;
	}
	if (!j->pend_head)
		j->pend_tail = &j->pend_head;
	j->records += n;
	b->pos = le64_of(head);
	memcpy(b->set_uuid8, cs->uuid, 8);
	b->nrec = le32_of(n);
	b->journal = le32_of(j->idx);
	meta_jblock_seal(b);
	atomic_store(&j->head, head + 1);

	j->busy = true;
	j->iov.iov_base = b;
	j->iov.iov_len = CACHE_PAGE;
	j->req = (struct bdev_req){
		.op = BDEV_WRITE,
		.flags = BDEV_F_FUA,
		.offset = cs->lay.journal_off +
			  ((uint64_t)j->idx * cs->lay.jblocks + head % cs->lay.jblocks) * CACHE_PAGE,
		.len = CACHE_PAGE,
		.iov = &j->iov,
		.iovcnt = 1,
		.done = journal_written,
		.priv = j,
	};
	pthread_mutex_unlock(&j->lock);
	bdev_submit(&cs->mirror.dev, &j->req);
}

static void kick_posted_fn(void *arg)
{
	struct journal *j = arg;
	atomic_store(&j->kick_posted, false);
	journal_kick(j);
}

/*
 * Any worker thread. A kick from another worker (the checkpoint's, on
 * worker 0) would submit the ring's next blocks there, and their
 * completions would kick it there again, where journal_move_on does not
 * move it: the owner would be back to a checkpoint every half ring until
 * the ring went idle.
 */
void journal_kick_owner(struct journal *j)
{
	unsigned nw = workers_count(), owner = nw ? j->idx % nw : 0;
	struct worker *self = worker_self();
	if (!rings_owned(owner, nw) || (self && worker_index(self) == owner)) {
		journal_kick(j);
		return;
	}
	if (!atomic_exchange(&j->kick_posted, true))
		worker_post_call(worker_get(owner), &j->kick_call, kick_posted_fn, j);
}

/* Worker thread. w->rec is complete (seq set); w->done runs when durable. */
void journal_append(struct cache_set *cs, struct jwait *w)
{
	struct journal *j = journal_self(cs);
	w->next = NULL;
	w->worker = worker_self();
	pthread_mutex_lock(&j->lock);
	*j->pend_tail = w;
	j->pend_tail = &w->next;
	pthread_mutex_unlock(&j->lock);
	journal_kick(j);
}

/*
 * Worker thread. Take a seq, apply the change in RAM and fill the record,
 * atomically with respect to other changes of this slot and to a
 * checkpoint's snapshot of it (both hold the slot lock); then append.
 */
void cache_record_locked(struct cache_set *cs, uint32_t s, uint64_t key, int op, uint32_t first,
			 uint32_t count, struct jwait *w)
{
	uint64_t seq = cache_seq(cs);
	slot_apply(cs, s, op, first, count);
	ckpt_mark(cs, s);
	w->rec = (struct cache_jrec_disk){
		.seq = le64_of(seq),
		.key = le64_of(key),
		.slot = le32_of(s),
		.op = le16_of((uint16_t)op),
		.first = le16_of((uint16_t)first),
		.count = le16_of((uint16_t)count),
	};
}

void cache_record(struct cache_set *cs, uint32_t s, int op, uint32_t first, uint32_t count,
		  struct jwait *w)
{
	struct slot *sl = &cs->slots[s];
	slot_lock(sl);
	cache_record_locked(cs, s, atomic_load(&sl->key), op, first, count, w);
	slot_unlock(sl);
	journal_append(cs, w);
}
