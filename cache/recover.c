/*
 * recover.c - recovery at open: the newest superblock (two copies per leg,
 * highest generation with a good checksum) says where the last
 * checkpoint's table is and from which journal block to replay. The table
 * is loaded, the journal records with seq >= ckpt_seq are applied in seq
 * order, logged overwrites are settled (dlog_recover), and the map is
 * rebuilt from the slots: hits are served as soon as the LUN opens.
 *
 * Threading: main thread, during cache_set_open_devs, workers running.
 */
#include "cache/cache_int.h"

#include "common/bufpool.h"
#include "common/log.h"

#include <string.h>

static int rrec_cmp(const void *a, const void *b)
{
	const struct rrec *x = a, *y = b;
	return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/*
 * kseq[slot]: the last record replayed onto the slot under the key it
 * holds, as its seq - ckpt_seq + 1 (every replayed seq is at least
 * ckpt_seq, and a journal holds far fewer than 2^32 records); 0: it holds
 * its key from the table alone, older than every record replayed. 4 bytes
 * a slot, for the open only.
 */
static void recover_apply(struct cache_set *cs, const struct rrec *r, uint32_t *kseq)
{
	struct slot *sl = &cs->slots[r->slot];
	if (r->op == JOP_FREE) {
		slot_apply(cs, r->slot, JOP_FREE, 0, cs->lay.bpe);
		atomic_store(&sl->key, CACHE_KEY_NONE);
		kseq[r->slot] = 0;
	} else {
		if (atomic_load(&sl->key) != r->key) {
			slot_apply(cs, r->slot, JOP_FREE, 0, cs->lay.bpe);
			atomic_store(&sl->key, r->key);
		}
		slot_apply(cs, r->slot, r->op, r->first, r->count);
		kseq[r->slot] = (uint32_t)(r->seq - cs->ck.seq + 1);
	}
	ckpt_mark(cs, r->slot);
}

/*
 * Two slots holding one key: an extent evicted from one slot and cached
 * again in another, where the record that freed the first one (in one
 * journal ring) did not reach the leg before the power went, and the
 * records of the second one (in another ring, acknowledged writes among
 * them) did. Every record of the second slot came after that free, so
 * the slot with the newer record holds the extent; the other is stale.
 * (Both from the table alone: the second slot then holds nothing that was
 * acknowledged, and the first found is kept.) Picks, through the map, the
 * slot each key stays in.
 */
static void recover_pick_slots(struct cache_set *cs, const uint32_t *kseq)
{
	for (uint32_t s = cs->lay.nslots; s-- > 0;) {
		struct slot *sl = &cs->slots[s];
		uint64_t key = atomic_load(&sl->key);
		uint32_t bits = atomic_load(&sl->bits);
		if (key == CACHE_KEY_NONE || !((bits & SB_FULL_VALID) || (bits & SB_HAS_BM)))
			continue;
		if (map_insert(&cs->map, key, s) != -EEXIST)
			continue; /* in; or out of memory, and the pass below frees it */
		rcu_read_lock();
		uint32_t e = map_lookup(&cs->map, key);
		rcu_read_unlock();
		if (e == POLICY_NO_SLOT)
			continue;
		uint32_t keep = kseq[s] > kseq[e] ? s : e, drop = keep == s ? e : s;
		log_warn("cache %s: slots %u and %u both hold extent %llu of backing %u (the record that freed "
			 "slot %u was cut): the newer, slot %u, is kept", cs->name, e, s,
			 (unsigned long long)key_ext(key), key_bid(key), drop, keep);
		if (keep == e)
			continue;
		map_remove(&cs->map, key, e);
		if (map_insert(&cs->map, key, s) < 0)
			map_insert(&cs->map, key, e);
	}
}

int cache_recover_set(struct cache_set *cs, int leg, char *err, size_t errlen)
{
	struct bdev *dev = cs->legs[leg];
	size_t chunk = 1u << 20;
	uint8_t *buf = buf_get(chunk);
	if (!buf)
		return cache_errf(err, errlen, "cache %s: out of memory", cs->name);
	/* 1. the table */
	uint64_t table_bytes = (uint64_t)cs->ck.run->npages * CACHE_PAGE;
	uint32_t loaded = 0;
	for (uint64_t off = 0; off < table_bytes; off += chunk) {
		uint64_t len = table_bytes - off < chunk ? table_bytes - off : chunk;
		int r = cache_sync_io(dev, BDEV_READ, cs->lay.table_off + off, buf, len, 0);
		if (r < 0) {
			buf_put(buf, chunk);
			return cache_errf(err, errlen, "cache %s: cannot read the slot table of %s: %s", cs->name,
				    dev->name, strerror(-r));
		}
		for (uint64_t p = 0; p < len / CACHE_PAGE; p++)
			for (uint32_t k = 0; k < cs->ck.run->rpp; k++) {
				uint32_t s = (uint32_t)((off / CACHE_PAGE + p) * cs->ck.run->rpp + k);
				if (s >= cs->lay.nslots)
					break;
				uint8_t *rec = buf + p * CACHE_PAGE + (size_t)k * cs->lay.rec_size;
				const struct cache_slot_disk *h = (const void *)rec;
				/* a key naming a backing id the superblock cannot hold is no record of ours */
				uint64_t rkey = le64_get(h->key);
				if (!meta_slot_ok(rec, cs->lay.rec_size) || le64_get(h->nblocks) != cs->lay.bpe ||
				    (rkey != CACHE_KEY_NONE && key_bid(rkey) >= CACHE_MAX_BACKINGS)) {
					buf_put(buf, chunk);
					return cache_errf(err, errlen,
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
		return cache_errf(err, errlen, "cache %s: out of memory reading the journal", cs->name);
	size_t cap = 1024, n = 0;
	struct rrec *recs = malloc(cap * sizeof(*recs));
	uint64_t max_seq = cs->ck.seq;
	for (int j = 0; j < CACHE_NJOURNALS; j++) {
		int r = cache_sync_io(dev, BDEV_READ, cs->lay.journal_off + (uint64_t)j * ring, rbuf, ring, 0);
		if (r < 0) {
			free(recs);
			buf_put(rbuf, ring);
			return cache_errf(err, errlen, "cache %s: cannot read the journal of %s: %s", cs->name,
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
				if (x.seq < cs->ck.seq || x.slot >= cs->lay.nslots || x.op < JOP_DIRTY ||
				    x.op > JOP_FREE || (uint32_t)x.first + x.count > cs->lay.bpe ||
				    (x.op != JOP_FREE && (!x.count || key_bid(x.key) >= CACHE_MAX_BACKINGS)))
					continue;
				if (n == cap) {
					cap *= 2;
					struct rrec *nr = realloc(recs, cap * sizeof(*recs));
					if (!nr) {
						free(recs);
						buf_put(rbuf, ring);
						return cache_errf(err, errlen, "cache %s: out of memory", cs->name);
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
	uint32_t *kseq = calloc(cs->lay.nslots, sizeof(*kseq));
	if (!kseq) {
		free(recs);
		return cache_errf(err, errlen, "cache %s: out of memory", cs->name);
	}
	qsort(recs, n, sizeof(*recs), rrec_cmp);
	for (size_t i = 0; i < n; i++)
		recover_apply(cs, &recs[i], kseq);
	atomic_store(&cs->next_seq, max_seq);

	/* 3. the map (one slot per key) and the free list */
	recover_pick_slots(cs, kseq);
	free(kseq);
	uint32_t live = 0;
	for (uint32_t s = cs->lay.nslots; s-- > 0;) {
		struct slot *sl = &cs->slots[s];
		uint64_t key = atomic_load(&sl->key);
		uint32_t bits = atomic_load(&sl->bits);
		bool any_valid = (bits & SB_FULL_VALID) || (bits & SB_HAS_BM);
		uint32_t in = POLICY_NO_SLOT;
		if (key != CACHE_KEY_NONE && any_valid) {
			rcu_read_lock();
			in = map_lookup(&cs->map, key);
			rcu_read_unlock();
		}
		if (in == s) {
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
int cache_journal_cut_heads(struct cache_set *cs)
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
