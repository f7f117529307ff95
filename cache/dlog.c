/*
 * dlog.c - the block log: an overwrite of dirty data never tears it.
 *
 * A write-back write over blocks that are dirty overwrites the only copy
 * of acknowledged data in place. A power cut in the middle may leave each
 * leg with some sectors of a LUN block new and others old (a device writes
 * 512 bytes, or its atomic write unit, atomically; not a 4 KiB block of a
 * LUN whose legs say less); the write-intent bitmap (intent.c) makes the
 * two legs agree again, but on the torn version. So, as InnoDB's
 * doublewrite buffer does for its pages, such a write first goes whole into
 * a log on every healthy leg (one request: a header page with a checksum
 * of the data, then the data), and only then in place. After a crash,
 * recovery (dlog_recover) writes each logged record's sectors in place
 * again where the record is still the newest word on them: it makes the
 * torn overwrite whole and new. A record whose own write was cut fails its
 * checksum and is ignored: the in place write had not started, so the
 * blocks are wholly old.
 *
 * When a record is the newest word: its sectors are still dirty after the
 * metadata is recovered, the slot still holds its key, and no journal
 * record replayed with a later seq touched them (the writer's own record
 * that makes the overwrite current comes later: then the in place write
 * had completed). Only records with seq >= the superblock's ckpt_seq
 * count: a checkpoint does not write its superblock while a record older
 * than its seq is in flight (dlog_older_inflight), so every record before
 * it is finished, and every later change to its sectors is in a journal.
 * The space of the records before a checkpoint's heads is reused after its
 * superblock is durable (dlog_release), as the journal's is. Recovery runs
 * at every open (after a clean stop there is normally nothing to do), and
 * logged overwrites of one extent take turns (SB_LOGWR, volume.c): "a later
 * record touched it" means "it had completed" only if they never overlap.
 *
 * Costs: one more round trip (header page + data, FUA) for an overwrite of
 * dirty data on a LUN guarded by cache_vol_guard_torn; nothing for other
 * writes.
 *
 * Threading: dlog_write, dlog_finish on worker threads (a ring's mutex is
 * shared by the workers that map to it and never held across I/O);
 * dlog_heads, dlog_older_inflight, dlog_release on worker 0 (checkpoint);
 * dlog_init, dlog_destroy, dlog_recover on the main thread.
 */
#include "cache/cache_int.h"

#include "common/bufpool.h"
#include "common/log.h"

#include <errno.h>
#include <isa-l/crc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int dlog_init(struct cache_set *cs)
{
	for (unsigned r = 0; r < CACHE_DLOG_RINGS; r++) {
		struct dlog_ring *g = &cs->dlog[r];
		memset(g, 0, sizeof(*g));
		g->cs = cs;
		g->idx = r;
		g->wait_tail = &g->wait_head;
		pthread_mutex_init(&g->lock, NULL);
	}
	return 0;
}

void dlog_destroy(struct cache_set *cs)
{
	for (unsigned r = 0; r < CACHE_DLOG_RINGS; r++)
		if (cs->dlog[r].cs)
			pthread_mutex_destroy(&cs->dlog[r].lock);
}

static void dlog_written(struct bdev_req *req, int err)
{
	struct dlog_ent *e = req->priv;
	e->done(e, err);
}

/* ring lock held: room for e at the head? then take its position and seq */
static bool dlog_place(struct cache_set *cs, struct dlog_ring *g, struct dlog_ent *e)
{
	uint32_t pages = cs->lay.dlog_pages;
	uint64_t head = g->head;
	uint64_t at = head % pages;
	if (at + e->npages > pages)
		head += pages - at; /* never across the end: skip to the start */
	if (head + e->npages - g->tail > pages)
		return false;
	e->pos = head;
	e->seq = cache_seq(cs); /* under the lock: seq order is position order in a ring */
	g->head = head + e->npages;
	e->prev = g->live_tail;
	e->next = NULL;
	if (g->live_tail)
		g->live_tail->next = e;
	else
		g->live_head = e;
	g->live_tail = e;
	e->live = true;
	g->records++;
	return true;
}

static void dlog_issue(struct cache_set *cs, struct dlog_ent *e)
{
	struct dlog_ring *g = e->ring;
	struct cache_dlog_disk *h = e->hdr;
	memset(h, 0, sizeof(*h));
	h->magic = le32_of(DLOG_MAGIC);
	h->pos = le64_of(e->pos);
	memcpy(h->set_uuid8, cs->uuid, 8);
	h->ring = le32_of(g->idx);
	h->npages = le32_of(e->npages);
	h->seq = le64_of(e->seq);
	h->key = le64_of(e->key);
	h->slot = le32_of(e->slot);
	h->first = le16_of((uint16_t)e->first);
	h->count = le16_of((uint16_t)e->count);
	uint32_t crc = 0xffffffffu;
	for (int i = 0; i < e->datacnt; i++)
		crc = crc32_iscsi(e->data[i].iov_base, (int)e->data[i].iov_len, crc);
	h->data_crc = le32_of(crc);
	meta_dlog_seal(h);
	e->iov[0] = (struct iovec){ .iov_base = h, .iov_len = CACHE_PAGE };
	memcpy(e->iov + 1, e->data, (size_t)e->datacnt * sizeof(*e->iov));
	e->req = (struct bdev_req){
		.op = BDEV_WRITE,
		.flags = BDEV_F_FUA,
		.offset = cs->lay.dlog_off + ((uint64_t)g->idx * cs->lay.dlog_pages + e->pos % cs->lay.dlog_pages) *
				      CACHE_PAGE,
		.len = CACHE_PAGE + (uint64_t)e->count * CACHE_SECTOR,
		.iov = e->iov,
		.iovcnt = e->datacnt + 1,
		.done = dlog_written,
		.priv = e,
	};
	atomic_fetch_add(&cs->st.dlog_records, 1);
	bdev_submit(&cs->mirror.dev, &e->req);
}

void dlog_write(struct cache_set *cs, struct dlog_ent *e, uint32_t slot, uint64_t key, uint32_t first,
		uint32_t count, const struct iovec *iov, int iovcnt, void (*done)(struct dlog_ent *, int),
		void *priv)
{
	struct dlog_ring *g = &cs->dlog[worker_index(worker_self()) % CACHE_DLOG_RINGS];
	*e = (struct dlog_ent){
		.ring = g, .w = worker_self(), .slot = slot, .key = key, .first = first, .count = count,
		.npages = 1 + (count * CACHE_SECTOR + CACHE_PAGE - 1) / CACHE_PAGE,
		.data = iov, .datacnt = iovcnt, .done = done, .priv = priv,
	};
	e->hdr = buf_get(CACHE_PAGE);
	e->iov = iovcnt + 1 <= (int)(sizeof(e->iov_inline) / sizeof(e->iov_inline[0]))
			 ? e->iov_inline : malloc(((size_t)iovcnt + 1) * sizeof(*e->iov));
	if (!e->hdr || !e->iov) {
		done(e, -ENOMEM);
		return;
	}
	pthread_mutex_lock(&g->lock);
	/* behind any that wait for room (or are being retried): first come, first placed */
	bool placed = !g->wait_head && !g->retrying && dlog_place(cs, g, e);
	bool half = g->head - g->tail >= cs->lay.dlog_pages / 2;
	if (!placed) {
		/* full: wait for a checkpoint to free the space (dlog_release) */
		e->wnext = NULL;
		*g->wait_tail = e;
		g->wait_tail = &e->wnext;
		g->waits++;
		atomic_fetch_add(&cs->st.dlog_waits, 1);
	}
	pthread_mutex_unlock(&g->lock);
	if (half || !placed)
		cache_want_checkpoint(cs);
	if (placed)
		dlog_issue(cs, e);
}

void dlog_finish(struct cache_set *cs, struct dlog_ent *e)
{
	struct dlog_ring *g = e->ring;
	if (!g)
		return;
	if (e->live) {
		pthread_mutex_lock(&g->lock);
		if (e->prev)
			e->prev->next = e->next;
		else
			g->live_head = e->next;
		if (e->next)
			e->next->prev = e->prev;
		else
			g->live_tail = e->prev;
		e->live = false;
		pthread_mutex_unlock(&g->lock);
		if (atomic_load(&cs->dlog_ckpt_wait) && atomic_exchange(&cs->dlog_ckpt_wait, false))
			cache_ckpt_resume(cs);
	}
	if (e->hdr)
		buf_put(e->hdr, CACHE_PAGE);
	if (e->iov && e->iov != e->iov_inline)
		free(e->iov);
	e->hdr = NULL;
	e->iov = NULL;
	e->ring = NULL;
}

void dlog_heads(struct cache_set *cs, uint64_t heads[CACHE_DLOG_RINGS])
{
	for (unsigned r = 0; r < CACHE_DLOG_RINGS; r++) {
		struct dlog_ring *g = &cs->dlog[r];
		pthread_mutex_lock(&g->lock);
		heads[r] = g->head;
		pthread_mutex_unlock(&g->lock);
	}
}

bool dlog_older_inflight(struct cache_set *cs, uint64_t seq)
{
	bool older = false;
	for (unsigned r = 0; r < CACHE_DLOG_RINGS && !older; r++) {
		struct dlog_ring *g = &cs->dlog[r];
		pthread_mutex_lock(&g->lock);
		older = g->live_head && g->live_head->seq < seq;
		pthread_mutex_unlock(&g->lock);
	}
	return older;
}

static void dlog_retry(void *arg)
{
	struct dlog_ent *e = arg;
	struct cache_set *cs = e->ring->cs;
	struct dlog_ring *g = e->ring;
	pthread_mutex_lock(&g->lock);
	g->retrying--;
	bool placed = dlog_place(cs, g, e);
	if (!placed) {
		e->wnext = g->wait_head; /* back at the front: it keeps its turn */
		g->wait_head = e;
		if (g->wait_tail == &g->wait_head)
			g->wait_tail = &e->wnext;
	}
	pthread_mutex_unlock(&g->lock);
	if (placed)
		dlog_issue(cs, e);
	else
		cache_want_checkpoint(cs);
}

void dlog_release(struct cache_set *cs, const uint64_t heads[CACHE_DLOG_RINGS])
{
	for (unsigned r = 0; r < CACHE_DLOG_RINGS; r++) {
		struct dlog_ring *g = &cs->dlog[r];
		pthread_mutex_lock(&g->lock);
		if (heads[r] > g->tail)
			g->tail = heads[r];
		struct dlog_ent *list = g->wait_head;
		g->wait_head = NULL;
		g->wait_tail = &g->wait_head;
		for (struct dlog_ent *e = list; e; e = e->wnext)
			g->retrying++;
		pthread_mutex_unlock(&g->lock);
		while (list) {
			struct dlog_ent *e = list;
			list = e->wnext;
			worker_post_call(e->w, &e->call, dlog_retry, e);
		}
	}
}

/* ---- recovery ------------------------------------------------------------------------ */

struct cand {
	uint64_t seq, key;
	uint32_t slot, first, count;
	uint8_t *data;         /* count * 512 bytes */
	uint8_t *killed;       /* a byte per block: a later record touched it */
};

static int cand_seq_cmp(const void *a, const void *b)
{
	const struct cand *x = a, *y = b;
	return x->seq < y->seq ? -1 : x->seq > y->seq;
}

static int cand_slot_cmp(const void *a, const void *b)
{
	const struct cand *const *x = a, *const *y = b;
	if ((*x)->slot != (*y)->slot)
		return (*x)->slot < (*y)->slot ? -1 : 1;
	return 0;
}

int dlog_recover(struct cache_set *cs, const struct rrec *recs, size_t nrecs, char *err, size_t errlen)
{
	if (!cs->lay.dlog_pages)
		return 0;
	uint32_t pages = cs->lay.dlog_pages;
	size_t ring = (size_t)pages * CACHE_PAGE;
	uint8_t *buf = buf_get(ring); /* at most 16 MiB (meta_layout), BUF_MAX */
	if (!buf) {
		snprintf(err, errlen, "cache %s: out of memory reading the block log", cs->name);
		return -1;
	}
	struct cand *c = NULL;
	size_t n = 0, cap = 0;
	uint64_t max_seq = atomic_load(&cs->next_seq);
	uint32_t failed = atomic_load(&cs->mirror.failed);
	int rc = -1;
	/* every whole record of either healthy leg (a record may have reached one only) */
	for (int leg = 0; leg < cs->mirror.nlegs; leg++) {
		if (failed & (1u << leg))
			continue;
		for (unsigned r = 0; r < CACHE_DLOG_RINGS; r++) {
			int e = cache_sync_io(cs->legs[leg], BDEV_READ,
					      cs->lay.dlog_off + (uint64_t)r * ring, buf, ring, 0);
			if (e < 0) {
				/* the other leg's copy of each record will do (one that reached this leg only was not acknowledged) */
				log_warn("cache %s: cannot read ring %u of the block log of %s (%s); using the other "
					 "leg's", cs->name, r, cs->legs[leg]->name, strerror(-e));
				continue;
			}
			for (uint32_t at = 0; at < pages; at++) {
				const struct cache_dlog_disk *h = (const void *)(buf + (size_t)at * CACHE_PAGE);
				if (!meta_dlog_ok(h, cs->uuid, r, at, pages))
					continue;
				uint64_t seq = le64_get(h->seq);
				uint32_t slot = le32_get(h->slot), first = le16_get(h->first), count = le16_get(h->count);
				if (seq < cs->ck.seq || slot >= cs->lay.nslots || !count ||
				    first + count > cs->lay.bpe ||
				    le32_get(h->npages) != 1 + (count * CACHE_SECTOR + CACHE_PAGE - 1) / CACHE_PAGE)
					continue;
				const uint8_t *data = (const uint8_t *)h + CACHE_PAGE;
				if (meta_crc(data, (size_t)count * CACHE_SECTOR) != le32_get(h->data_crc))
					continue; /* torn: its in place write had not started */
				if (seq + 1 > max_seq)
					max_seq = seq + 1;
				if (n == cap) {
					cap = cap ? cap * 2 : 64;
					struct cand *nc = realloc(c, cap * sizeof(*c));
					if (!nc) {
						snprintf(err, errlen, "cache %s: out of memory", cs->name);
						goto out;
					}
					c = nc;
				}
				struct cand *x = &c[n];
				*x = (struct cand){ .seq = seq, .key = le64_get(h->key), .slot = slot, .first = first,
						    .count = count };
				x->data = malloc((size_t)count * CACHE_SECTOR);
				x->killed = calloc(count, 1);
				if (!x->data || !x->killed) {
					free(x->data);
					free(x->killed);
					snprintf(err, errlen, "cache %s: out of memory", cs->name);
					goto out;
				}
				memcpy(x->data, data, (size_t)count * CACHE_SECTOR);
				n++;
			}
		}
	}
	atomic_store(&cs->next_seq, max_seq);
	if (!n) {
		rc = 0;
		goto out;
	}
	qsort(c, n, sizeof(*c), cand_seq_cmp);
	/* a record found on both legs counts once (seqs are unique to a record) */
	size_t kept = 0;
	for (size_t k = 0; k < n; k++) {
		if (kept && c[kept - 1].seq == c[k].seq) {
			free(c[k].data);
			free(c[k].killed);
			continue;
		}
		c[kept++] = c[k];
	}
	n = kept;
	/* a later journal record on a block: the log is not the newest word on it */
	struct cand **by_slot = malloc(n * sizeof(*by_slot));
	if (!by_slot) {
		snprintf(err, errlen, "cache %s: out of memory", cs->name);
		goto out;
	}
	for (size_t k = 0; k < n; k++)
		by_slot[k] = &c[k];
	qsort(by_slot, n, sizeof(*by_slot), cand_slot_cmp);
	for (size_t i = 0; i < nrecs; i++) {
		const struct rrec *q = &recs[i];
		size_t lo = 0, hi = n;
		while (lo < hi) {
			size_t mid = (lo + hi) / 2;
			if (by_slot[mid]->slot < q->slot)
				lo = mid + 1;
			else
				hi = mid;
		}
		for (size_t k = lo; k < n && by_slot[k]->slot == q->slot; k++) {
			struct cand *x = by_slot[k];
			if (q->seq < x->seq)
				continue;
			uint32_t a = q->op == JOP_FREE ? 0 : q->first;
			uint32_t b = q->op == JOP_FREE ? cs->lay.bpe : (uint32_t)q->first + q->count;
			for (uint32_t blk = a > x->first ? a : x->first; blk < b && blk < x->first + x->count; blk++)
				x->killed[blk - x->first] = 1;
		}
	}
	free(by_slot);
	/* in seq order: a later record over the same block wins */
	uint64_t applied = 0, records = 0;
	for (size_t k = 0; k < n; k++) {
		struct cand *x = &c[k];
		struct slot *sl = &cs->slots[x->slot];
		if (atomic_load(&sl->key) != x->key || (atomic_load(&sl->bits) & SB_STATE_MASK) != SB_READY)
			continue;
		bool any = false;
		for (uint32_t b = 0; b < x->count;) {
			if (x->killed[b] || !slot_any_dirty(cs, x->slot, x->first + b, 1)) {
				b++;
				continue;
			}
			uint32_t e = b + 1;
			while (e < x->count && !x->killed[e] && slot_any_dirty(cs, x->slot, x->first + e, 1))
				e++;
			uint64_t off = slot_leg_off(cs, x->slot) + (uint64_t)(x->first + b) * CACHE_SECTOR;
			for (int leg = 0; leg < cs->mirror.nlegs; leg++) {
				if (failed & (1u << leg))
					continue;
				int w = cache_sync_io(cs->legs[leg], BDEV_WRITE, off, x->data + (size_t)b * CACHE_SECTOR,
						      (uint64_t)(e - b) * CACHE_SECTOR, BDEV_F_FUA);
				if (w < 0) {
					snprintf(err, errlen, "cache %s: cannot write logged blocks back to slot %u on %s: "
						 "%s", cs->name, x->slot, cs->legs[leg]->name, strerror(-w));
					goto out;
				}
			}
			applied += e - b;
			any = true;
			b = e;
		}
		records += any;
	}
	log_info("cache %s: block log: %zu record(s) newer than the checkpoint, %llu block(s) of %llu "
		 "record(s) written back in place", cs->name, n, (unsigned long long)applied,
		 (unsigned long long)records);
	rc = 0;
out:
	for (size_t k = 0; k < n; k++) {
		free(c[k].data);
		free(c[k].killed);
	}
	free(c);
	buf_put(buf, ring);
	return rc;
}
