/*
 * set.c - a cache set's life: open (format a new set, or recover one:
 * recover.c), the background ticks, shutdown and close.
 *
 * The rest of the set lives by concern: superblock writes in sb.c, slot
 * allocation and eviction in slots.c, checkpoints in ckpt.c, recovery in
 * recover.c, attached volumes in attach.c, lost ranges in lost.c, status
 * in set_status.c, the main thread's waits on worker 0 in sync.c.
 *
 * Threading: cache_set_open/close/shutdown: main (or control) thread, may
 * sleep, need running workers.
 */
#include "cache/cache_int.h"

#include "common/bufpool.h"
#include "common/log.h"

#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

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
	cache_sync_done(c, 0);
}

static void tick_del(void *arg)
{
	struct sync_call *c = arg;
	worker_tick_del(&c->cs->tick);
	cache_sync_done(c, 0);
}

static __thread int rcu_registered;

/* ---- open: format or recover --------------------------------------------------------- */

int cache_errf(char *err, size_t errlen, const char *fmt, ...)
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
	cs->alloc.free_bits = calloc((n + 63) / 64, sizeof(uint64_t));
	cs->alloc.retire_bits = calloc((n + 63) / 64, sizeof(uint64_t));
	cs->alloc.grace_bits = calloc((n + 63) / 64, sizeof(uint64_t));
	cs->ck.dirty = calloc((n + 7) / 8, 1);
	cs->ck.run = calloc(1, sizeof(*cs->ck.run));
	if (!cs->slots || !cs->alloc.free_bits || !cs->alloc.retire_bits || !cs->alloc.grace_bits || !cs->ck.dirty || !cs->ck.run)
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
	/* the advisor is a convenience: without it the cache still runs */
	_Static_assert(ADVISOR_MAX_LUNS >= CACHE_SET_MAX_VOLS, "the advisor has a curve for every backing id");
	struct advisor_cfg ac = { .nslots = n, .policy = pc };
	cs->advisor = advisor_new(&ac);
	if (!cs->advisor)
		log_warn("cache %s: no memory for the sizing advisor; tierctl advise will have no answer", cs->name);
	struct ckpt *ck = cs->ck.run;
	ck->cs = cs;
	ck->rpp = CACHE_PAGE / cs->lay.rec_size;
	ck->npages = (n + ck->rpp - 1) / ck->rpp;
	for (int i = 0; i < CKPT_INFLIGHT; i++)
		if (!(ck->buf[i] = buf_get(CACHE_PAGE)))
			return -ENOMEM;
	for (int i = 0; i < CACHE_MAX_LEGS; i++)
		if (!(cs->sb.buf[i] = buf_get(CACHE_PAGE)))
			return -ENOMEM;
	if (!(cs->sb.tab = buf_get(CACHE_BTAB_BYTES)))
		return -ENOMEM;
	for (int j = 0; j < CACHE_NJOURNALS; j++) {
		struct journal *jr = &cs->journals[j];
		jr->cs = cs;
		jr->idx = (unsigned)j;
		jr->half_full = cache_want_checkpoint;
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
		return cache_errf(err, errlen, "cache %s: cannot get random bytes for the set UUID", cs->name);
	/* an all-free table */
	size_t chunk = 1u << 20;
	uint8_t *buf = buf_get(chunk);
	if (!buf)
		return cache_errf(err, errlen, "cache %s: out of memory", cs->name);
	uint64_t table_bytes = (uint64_t)cs->ck.run->npages * CACHE_PAGE;
	for (uint64_t off = 0; off < table_bytes; off += chunk) {
		uint64_t len = table_bytes - off < chunk ? table_bytes - off : chunk;
		memset(buf, 0, len);
		for (uint64_t p = 0; p < len / CACHE_PAGE; p++)
			for (uint32_t k = 0; k < cs->ck.run->rpp; k++) {
				uint32_t s = (uint32_t)((off / CACHE_PAGE + p) * cs->ck.run->rpp + k);
				if (s >= cs->lay.nslots)
					break;
				cache_encode_slot(cs, s, buf + p * CACHE_PAGE + (size_t)k * cs->lay.rec_size);
			}
		int r = cache_sync_io(&cs->mirror.dev, BDEV_WRITE, cs->lay.table_off + off, buf, len, BDEV_F_FUA);
		if (r < 0) {
			buf_put(buf, chunk);
			return cache_errf(err, errlen, "cache %s: cannot write the slot table: %s", cs->name, strerror(-r));
		}
	}
	buf_put(buf, chunk);
	cs->btab_leg[0] = cs->btab_leg[1] = 1;
	cs->btab_changed = true; /* the first superblock writes the empty table into copy 0 */
	cs->ck.seq = 1;
	atomic_store(&cs->next_seq, 1);
	for (uint32_t s = 0; s < cs->lay.nslots; s++)
		free_push(cs, s);
	log_info("cache %s: formatted %d leg(s): %u slots of %u KiB", cs->name, cs->mirror.nlegs,
		 cs->lay.nslots, cs->lay.extent_size >> 10);
	return 0;
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
	atomic_fetch_add(&cs->st.leg_timeouts, 1);
	mirror_leg_failed(m, leg, -ETIMEDOUT);
	return true;
}

struct cache_set *cache_set_open(const struct cache_set_cfg *cfg, char *err, size_t errlen)
{
	struct bdev *legs[CACHE_MAX_LEGS] = { NULL };
	if (cfg->nlegs < 1 || cfg->nlegs > 2 || (cfg->nlegs == 1 && !cfg->allow_single_leg)) {
		cache_errf(err, errlen, "cache %s: give two legs (a mirror), or one with allow_single_leg = yes",
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

/*
 * What opening a set learns from its legs before it trusts them: each
 * leg's two superblock copies, which is valid (have: copy index, or -1),
 * blank (fresh) or marked as being rebuilt; the newest superblock (nsb, on
 * config leg best); the legs it must not read (failed, not_member); a
 * blank or interrupted leg to rebuild (blank); whether the legs are listed
 * in the other order than their recorded index (swap).
 */
struct set_scan {
	struct cache_sb_disk *sbs[CACHE_MAX_LEGS][2];
	int have[CACHE_MAX_LEGS];
	bool fresh[CACHE_MAX_LEGS];
	bool rebuilding[CACHE_MAX_LEGS];
	uint8_t mark_uuid[CACHE_MAX_LEGS][16];
	const struct cache_sb_disk *mark_sb[CACHE_MAX_LEGS]; /* a marked leg's other copy */
	int best;
	struct cache_sb_disk *nsb;
	uint32_t failed, not_member;
	int blank; /* config index of a blank leg to resync onto */
	bool swap;
	bool upgraded; /* a set of version 1-3: both superblock copies get version 4 at open */
};

/* Read both superblock copies of every leg and sort each leg out. */
static int scan_legs(struct cache_set *cs, const struct cache_set_cfg *cfg, struct set_scan *sc, char *err,
		     size_t errlen)
{
	for (int i = 0; i < cfg->nlegs; i++) {
		for (int k = 0; k < 2; k++) {
			sc->sbs[i][k] = buf_get(CACHE_PAGE);
			if (!sc->sbs[i][k] ||
			    cache_sync_io(cs->legs[i], BDEV_READ, (uint64_t)k * CACHE_PAGE, sc->sbs[i][k], CACHE_PAGE, 0) < 0) {
				cache_errf(err, errlen, "cache %s: cannot read the superblock of leg %s", cfg->name,
				     cfg->legs[i]);
				return -1;
			}
		}
		const char *why = NULL, *why2 = NULL;
		int a = meta_sb_check(sc->sbs[i][0], &why), b = meta_sb_check(sc->sbs[i][1], &why2);
		if (meta_rebuild_marked(sc->sbs[i][0], sc->mark_uuid[i]) || meta_rebuild_marked(sc->sbs[i][1], sc->mark_uuid[i])) {
			sc->rebuilding[i] = true; /* whatever the other copy holds: not a member */
			sc->mark_sb[i] = a == 0 ? sc->sbs[i][0] : b == 0 ? sc->sbs[i][1] : NULL;
		}
		else if (a == 0 && (b != 0 || le64_get(sc->sbs[i][0]->gen) >= le64_get(sc->sbs[i][1]->gen)))
			sc->have[i] = 0;
		else if (b == 0)
			sc->have[i] = 1;
		else if (all_zero(sc->sbs[i][0], CACHE_PAGE) && all_zero(sc->sbs[i][1], CACHE_PAGE))
			sc->fresh[i] = true;
		else {
			cache_errf(err, errlen, "cache %s: leg %s: %s; if it holds nothing you need, zero its first "
				"8 KiB (dd if=/dev/zero of=%s bs=4096 count=2 conv=notrunc) so tiercached formats it",
			     cfg->name, cs->legs[i]->name, why, cs->legs[i]->name);
			return -1;
		}
	}
	if (cfg->nlegs == 2 && cs->legs[0]->size != cs->legs[1]->size) {
		cache_errf(err, errlen, "cache %s: leg %s is %llu bytes, leg %s is %llu bytes; legs of a mirror must "
			"be the same size", cfg->name, cfg->legs[1], (unsigned long long)cs->legs[1]->size,
		     cfg->legs[0], (unsigned long long)cs->legs[0]->size);
		return -1;
	}
	return 0;
}

/* The newest superblock of the legs, if any holds one. */
static int pick_newest(struct cache_set *cs, const struct cache_set_cfg *cfg, struct set_scan *sc, char *err,
		       size_t errlen)
{
	/* pick the newest superblock; check every leg belongs to it */
	sc->best = -1;
	for (int i = 0; i < cfg->nlegs; i++)
		if (sc->have[i] >= 0 && (sc->best < 0 || le64_get(sc->sbs[i][sc->have[i]]->gen) >
						     le64_get(sc->sbs[sc->best][sc->have[sc->best]]->gen)))
			sc->best = i;
	sc->nsb = sc->best >= 0 ? sc->sbs[sc->best][sc->have[sc->best]] : NULL;
	for (int i = 0; i < cfg->nlegs; i++)
		if (sc->rebuilding[i] && !sc->nsb) {
			cache_errf(err, errlen, "cache %s: leg %s is marked as being rebuilt, and no leg holds the set "
				"to rebuild it from; if the data is not needed, zero the first 8 KiB of every leg",
			     cfg->name, cs->legs[i]->name);
			return -1;
		}
	return 0;
}

/* Every listed leg belongs to the newest superblock's set, or is a blank
 * or interrupted leg at a place it records as failed (rebuilt once open). */
static int check_members(struct cache_set *cs, const struct cache_set_cfg *cfg, struct set_scan *sc, char *err,
			 size_t errlen)
{
	memcpy(cs->uuid, sc->nsb->set_uuid, 16);
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
		if (cfg->nlegs == 2 && (sc->fresh[i] || sc->rebuilding[i]) && sc->have[1 - i] >= 0) {
			uint32_t idx = 1 - (le32_get(sc->nsb->leg_index) & 1);
			bool recorded = (le32_get(sc->nsb->failed_mask) & (1u << idx)) != 0;
			if (sc->fresh[i])
				place_failed = recorded;
			else
				place_failed = !memcmp(sc->mark_uuid[i], sc->nsb->set_uuid, 16) &&
					       (recorded || (sc->mark_sb[i] && !all_zero(sc->nsb->member_uuid[idx], 16) &&
							     !memcmp(sc->mark_sb[i]->leg_uuid, sc->nsb->member_uuid[idx], 16)));
		}
		if (place_failed) {
			sc->blank = i;
			continue;
		}
		if (sc->rebuilding[i]) {
			cache_errf(err, errlen, "cache %s: leg %s is marked as being rebuilt, but for another "
				"set or at a place the set records as healthy; list the right device, or "
				"zero its first 8 KiB to start it afresh", cfg->name, cs->legs[i]->name);
			return -1;
		}
		if (sc->fresh[i]) {
			cache_errf(err, errlen, "cache %s: leg %s is blank but leg %s holds set %s; a replaced "
				"leg is rebuilt online with `tierctl leg replace`; to start the daemon now, "
				"give allow_single_leg = yes and list only %s", cfg->name, cfg->legs[i],
			     cfg->legs[sc->best], u, cfg->legs[sc->best]);
			return -1;
		}
		struct cache_sb_disk *sb = sc->sbs[i][sc->have[i]];
		if (memcmp(sb->set_uuid, cs->uuid, 16)) {
			char u2[37];
			uuid_str(sb->set_uuid, u2);
			cache_errf(err, errlen, "cache %s: leg %s belongs to another cache set (\"%.64s\", %s), not "
				"to this one (%s); list the right device, or zero its first 8 KiB if its "
				"contents may be discarded", cfg->name, cfg->legs[i], sb->set_name, u2, u);
			return -1;
		}
	}
	return 0;
}

/* The configuration agrees with the set's extent size and leg count. */
static int check_shape(const struct cache_set_cfg *cfg, const struct set_scan *sc, char *err, size_t errlen)
{
	uint32_t ext = le32_get(sc->nsb->extent_size);
	if (ext != cfg->extent_size) {
		cache_errf(err, errlen, "cache %s: the legs were formatted with extent = %uK but the "
			"configuration says %uK; set extent = %uK (the extent size cannot change without "
			"reformatting the legs)", cfg->name, ext >> 10, cfg->extent_size >> 10, ext >> 10);
		return -1;
	}
	if (le32_get(sc->nsb->nlegs) != (uint32_t)cfg->nlegs && !cfg->allow_single_leg) {
		cache_errf(err, errlen, "cache %s: the set was made of %u legs, the configuration lists %d; "
			"list both legs", cfg->name, le32_get(sc->nsb->nlegs), cfg->nlegs);
		return -1;
	}
	return 0;
}

/* Put the legs in the order of their recorded index, and learn which
 * device each index is. */
static void order_legs(struct cache_set *cs, const struct cache_set_cfg *cfg, struct set_scan *sc)
{
	/* order legs by their recorded index (a blank leg takes the other index) */
	sc->swap = false;
	if (cfg->nlegs == 2) {
		int ref = sc->blank == 0 ? 1 : 0;
		sc->swap = le32_get(sc->sbs[ref][sc->have[ref]]->leg_index) == (uint32_t)(ref == 0 ? 1 : 0);
	}
	if (sc->swap) {
		struct bdev *t = cs->legs[0];
		cs->legs[0] = cs->legs[1];
		cs->legs[1] = t;
		sc->best = 1 - sc->best;
	}
	/*
	 * Which device each index is. A leg whose own identity is not
	 * the member the newest superblock names for its index was
	 * replaced (`leg replace` onto another device, the configuration
	 * still listing the old one): its contents are stale however
	 * good they look, so it is failed, never read.
	 */
	bool members = !all_zero(sc->nsb->member_uuid, sizeof(sc->nsb->member_uuid));
	for (int c = 0; c < cfg->nlegs; c++) {
		int i = sc->swap ? 1 - c : c; /* mirror index of config leg c */
		if (cfg->nlegs == 1)
			i = (int)le32_get(sc->sbs[c][sc->have[c]]->leg_index) % CACHE_MAX_LEGS;
		int at = cfg->nlegs == 1 ? 0 : i; /* where it sits in cs->legs[] */
		const uint8_t *want = sc->nsb->member_uuid[i];
		bool want_known = members && !all_zero(want, 16);
		if (c == sc->blank) {
			sc->not_member |= 1u << i;
		} else if (want_known && memcmp(sc->sbs[c][sc->have[c]]->leg_uuid, want, 16) &&
			   !(all_zero(sc->sbs[c][sc->have[c]]->leg_uuid, 16) &&
			     le64_get(sc->sbs[c][sc->have[c]]->gen) + 1 >= le64_get(sc->nsb->gen))) {
			/* (a leg with no identity of its own yet, from before they
			 * existed, whose superblock is the newest but one: the
			 * first write after an upgrade was cut on it) */
			log_err("cache %s: leg %s is not the device the set last recorded at its place (it "
				"was replaced by `tierctl leg replace`): it is out of service; list the "
				"replacement in legs =", cfg->name, cs->legs[at]->name);
			sc->not_member |= 1u << i;
		}
		if (want_known)
			memcpy(cs->leg_uuid[at], want, 16);
		else if (c != sc->blank && !all_zero(sc->sbs[c][sc->have[c]]->leg_uuid, 16))
			memcpy(cs->leg_uuid[at], sc->sbs[c][sc->have[c]]->leg_uuid, 16);
		else if (getrandom(cs->leg_uuid[at], 16, 0) != 16)
			memset(cs->leg_uuid[at], 0, 16); /* unchecked, as before */
	}
	if (sc->blank >= 0)
		cs->blank_leg = sc->swap ? 1 - sc->blank : sc->blank;
}

/* Take the set's geometry from the newest superblock, once it is one
 * tiercached writes. */
static int adopt_layout(struct cache_set *cs, const struct cache_set_cfg *cfg, struct set_scan *sc, char *err,
			size_t errlen)
{
	uint32_t ext = le32_get(sc->nsb->extent_size);
	struct cache_layout lay = {
		.leg_size = le64_get(sc->nsb->leg_size),
		.extent_size = ext,
		.bpe = ext / CACHE_SECTOR,
		.rec_size = le32_get(sc->nsb->rec_size),
		.nslots = le32_get(sc->nsb->nslots),
		.jblocks = le32_get(sc->nsb->jblocks),
		.table_off = le64_get(sc->nsb->table_off),
		.journal_off = le64_get(sc->nsb->journal_off),
		.data_off = le64_get(sc->nsb->data_off),
	};
	uint32_t version = meta_layout_version(sc->nsb);
	if (version >= CACHE_VERSION_V3) {
		lay.dlog_off = le64_get(sc->nsb->dlog_off);
		lay.dlog_pages = le32_get(sc->nsb->dlog_pages);
	}
	if (cs->legs[0]->size < lay.leg_size || lay.data_off + (uint64_t)lay.nslots * ext > lay.leg_size) {
		cache_errf(err, errlen, "cache %s: legs are %llu bytes but the set was formatted for %llu; "
			"give size = %llu", cfg->name, (unsigned long long)cs->legs[0]->size,
		     (unsigned long long)lay.leg_size, (unsigned long long)lay.leg_size);
		return -1;
	}
	/*
	 * The geometry is a function of leg size and extent size
	 * (meta_layout, unchanged since the first format): anything
	 * else is a superblock that passed its checksum but cannot be
	 * ours, and trusting it divides by a zero rec_size, reads a
	 * ring of zero blocks or sizes the slot array from garbage.
	 */
	struct cache_layout want;
	if (le32_get(sc->nsb->block_size) != CACHE_SECTOR || le32_get(sc->nsb->njournals) != CACHE_NJOURNALS ||
	    meta_layout(lay.leg_size, ext, version, &want) < 0 || want.rec_size != lay.rec_size ||
	    want.nslots != lay.nslots || want.jblocks != lay.jblocks || want.table_off != lay.table_off ||
	    want.journal_off != lay.journal_off || want.data_off != lay.data_off ||
	    want.dlog_off != lay.dlog_off || want.dlog_pages != lay.dlog_pages ||
	    (version >= CACHE_VERSION_V3 && le32_get(sc->nsb->dlog_rings) != CACHE_DLOG_RINGS)) {
		cache_errf(err, errlen, "cache %s: the superblock of %s describes a layout tiercached never writes "
			"(%u slots of %u bytes, %u journal blocks per ring, table at %llu, journal at %llu, "
			"data at %llu for %llu-byte legs); the set cannot be trusted: restore the leg from "
			"the other one, or delete both legs to start with an empty cache (dirty data in it "
			"will be lost)", cfg->name, cs->legs[sc->best]->name, lay.nslots, lay.rec_size, lay.jblocks,
		     (unsigned long long)lay.table_off, (unsigned long long)lay.journal_off,
		     (unsigned long long)lay.data_off, (unsigned long long)lay.leg_size);
		return -1;
	}
	cs->lay = lay;
	/*
	 * Every set is version 4 from its first superblock of this run on: a
	 * version 1 set gains the write-intent page, an older set the backing
	 * table of its own (adopt_btab); neither gains a block log (which
	 * would move the data): lay.dlog_pages says whether there is one.
	 */
	cs->version = CACHE_VERSION;
	cs->sb.gen = le64_get(sc->nsb->gen);
	cs->ck.seq = le64_get(sc->nsb->ckpt_seq);
	for (int j = 0; j < CACHE_NJOURNALS; j++)
		cs->jtail[j] = le64_get(sc->nsb->jtail[j]);
	return 0;
}

/* Leg i (mirror index) may be read for the table: in the set and not failed. */
static bool leg_readable(const struct cache_set *cs, const struct cache_set_cfg *cfg, const struct set_scan *sc, int i)
{
	if (i < 0 || i >= cfg->nlegs || !cs->legs[i])
		return false;
	return cfg->nlegs == 1 || !(sc->failed & (1u << i));
}

/*
 * The backing table. A version 4 set's is the one whose checksum its
 * newest superblock records, read from a whole copy on either leg; a leg
 * whose own superblock names a copy that is not it gets it again. An older
 * set's is in its superblock: taken from
 * there, and written out by the first superblock of this run (the
 * upgrade: the table lands before the version 4 superblock that names it,
 * so a crash in between leaves the old superblock, whole).
 */
static int adopt_btab(struct cache_set *cs, const struct cache_set_cfg *cfg, struct set_scan *sc, int leg,
		      char *err, size_t errlen)
{
	const struct cache_sb_disk *nsb = sc->nsb;
	uint32_t version = le32_get(nsb->version);
	if (version < CACHE_VERSION) {
		int n = 0;
		for (int i = 0; i < CACHE_LEGACY_BACKINGS; i++) {
			const struct cache_backing_disk *o = &nsb->legacy_backing[i];
			struct cache_btab_disk *b = &cs->backing[i];
			if (!o->lun[0])
				continue;
			if (le32_get(o->bid) != (uint32_t)i) {
				cache_errf(err, errlen, "cache %s: the superblock's table of LUNs is inconsistent "
					"(entry %d says backing id %u); the set cannot be trusted", cfg->name, i,
				     le32_get(o->bid));
				return -1;
			}
			memcpy(b->lun, o->lun, sizeof(b->lun));
			b->size = o->size;
			b->ino = o->ino;
			b->fsdev = o->fsdev;
			b->flags = le32_of(le32_get(o->is_blockdev) ? BTAB_F_BLOCKDEV : 0);
			n++;
		}
		cs->btab_leg[0] = cs->btab_leg[1] = 1; /* the upgrade writes copy 0 */
		cs->btab_changed = true;
		sc->upgraded = true;
		log_info("cache %s: on-disk format version %u, upgraded to %u now (a table of up to %d LUNs "
			 "instead of %d; %d in use); a tiercached older than this one cannot open the set "
			 "any more", cfg->name, version, CACHE_VERSION, CACHE_MAX_BACKINGS, CACHE_LEGACY_BACKINGS, n);
		return 0;
	}
	/*
	 * The table is the one whose checksum the newest superblock records,
	 * wherever a whole copy of it is: on the leg recovery reads or the
	 * other, in either place (a leg whose write of it was cut may hold
	 * it in neither, or only an older one). Never an older table: the
	 * journal may name a backing id only the newest one gives.
	 */
	uint32_t want = le32_get(nsb->btab_crc);
	struct cache_btab_disk *buf = buf_get(CACHE_BTAB_BYTES);
	if (!buf) {
		cache_errf(err, errlen, "cache %s: out of memory", cfg->name);
		return -1;
	}
	bool found = false;
	for (int k = 0; k < 4 && !found; k++) {
		int i = k < 2 ? leg : 1 - leg;
		uint32_t copy = (le32_get(nsb->btab_copy) ^ (uint32_t)k) & 1;
		if (!leg_readable(cs, cfg, sc, i) ||
		    cache_sync_io(cs->legs[i], BDEV_READ, meta_btab_off(copy), buf, CACHE_BTAB_BYTES, 0) < 0 ||
		    meta_btab_crc(buf) != want)
			continue;
		memcpy(cs->backing, buf, CACHE_BTAB_BYTES);
		found = true;
	}
	if (!found) {
		buf_put(buf, CACHE_BTAB_BYTES);
		cache_errf(err, errlen, "cache %s: no leg holds a whole copy of the set's table of LUNs (checksum "
			"mismatch); the set cannot be trusted: restore a leg from a copy, or delete both legs to "
			"start with an empty cache (dirty data in it will be lost)", cfg->name);
		return -1;
	}
	cs->btab_crc = want;
	/*
	 * The copy each leg's own newest superblock names is where the next
	 * table does not go; a leg whose named copy is not this table (its
	 * write was cut, or it is a generation behind) gets it again from the
	 * first superblock of this run, into its other copy.
	 */
	for (int i = 0; i < cfg->nlegs && i < CACHE_MAX_LEGS; i++) {
		int c = cfg->nlegs == 1 ? 0 : (sc->swap ? 1 - i : i); /* its config index */
		const struct cache_sb_disk *own = sc->have[c] >= 0 ? sc->sbs[c][sc->have[c]] : NULL;
		bool v4 = own && le32_get(own->version) >= CACHE_VERSION;
		cs->btab_leg[i] = v4 ? le32_get(own->btab_copy) & 1 : 1;
		if (!leg_readable(cs, cfg, sc, i))
			continue;
		if (!v4 || cache_sync_io(cs->legs[i], BDEV_READ, meta_btab_off(cs->btab_leg[i]), buf,
					 CACHE_BTAB_BYTES, 0) < 0 || meta_btab_crc(buf) != want) {
			cs->btab_changed = true;
			log_warn("cache %s: leg %s does not hold the newest table of LUNs where its superblock says "
				 "(a write of it was cut); it is written again", cfg->name, cs->legs[i]->name);
		}
	}
	buf_put(buf, CACHE_BTAB_BYTES);
	return 0;
}

/* The legs the set must not read, and a leg listed alone. */
static int adopt_failed(struct cache_set *cs, const struct cache_set_cfg *cfg, struct set_scan *sc, char *err,
			size_t errlen)
{
	/*
	 * failed_mask is by leg index (the superblock's leg_index), and
	 * so is cs->legs[] with two legs. One leg listed alone is index
	 * 0 of the mirror whatever its index was: it may run alone only
	 * if it is not the one recorded stale; the other is gone.
	 */
	sc->failed = (le32_get(sc->nsb->failed_mask) | sc->not_member) & ((1u << CACHE_MAX_LEGS) - 1);
	if (cfg->nlegs == 1) {
		uint32_t self = le32_get(sc->nsb->leg_index);
		if (self >= CACHE_MAX_LEGS || (sc->failed & (1u << self))) {
			cache_errf(err, errlen, "cache %s: leg %s is recorded as failed in the set's superblock (it "
				"missed writes the other leg took); it cannot serve alone: list the other leg",
			     cfg->name, cs->legs[0]->name);
			return -1;
		}
		if (le32_get(sc->nsb->nlegs) == 2) {
			/* the other leg misses what this run writes: say so in our superblocks */
			cs->alone_index = (int)self;
			memcpy(cs->alone_other_uuid, sc->nsb->member_uuid[1 - self], 16);
			log_warn("cache %s: running on leg %s alone; the other leg is recorded as stale and is "
				 "rebuilt (tierctl leg replace) before it serves again", cfg->name, cs->legs[0]->name);
		}
		sc->failed = 0;
	} else if (sc->failed == 3) {
		cache_errf(err, errlen, "cache %s: both legs are recorded as failed in the set's superblock; no leg "
			"holds data that can be trusted: delete both legs to start with an empty cache (dirty "
			"data in it is lost)", cfg->name);
		return -1;
	}
	if (!le32_get(sc->nsb->clean))
		log_warn("cache %s: not shut down cleanly; recovering from the journal", cfg->name);
	return 0;
}

struct cache_set *cache_set_open_devs(const struct cache_set_cfg *cfg, struct bdev **legdevs, char *err,
				      size_t errlen)
{
	struct cache_set *cs = calloc(1, sizeof(*cs));
	struct set_scan scan = { .have = { -1, -1 }, .blank = -1 }, *sc = &scan;

	if (!cs) {
		for (int i = 0; i < cfg->nlegs; i++)
			bdev_close(legdevs[i]);
		cache_errf(err, errlen, "out of memory");
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
			cache_errf(err, errlen, "out of memory");
			return NULL;
		}
		cs->legs[i] = g;
		g->io = &cs->leg_io[i].c;
	}
	if (!rcu_registered++)
		rcu_register_thread(); /* call_rcu/synchronize_rcu from this thread */
	cs->cfg = *cfg;
	cs->blank_leg = -1;
	cs->name = strdup(cfg->name);
	pthread_mutex_init(&cs->alloc.lock, NULL);
	pthread_mutex_init(&cs->vols_lock, NULL);
	pthread_mutex_init(&cs->sb.lock, NULL);
	pthread_mutex_init(&cs->lost.lock, NULL);
	pthread_mutex_init(&cs->dwait_lock, NULL);
	pthread_mutex_init(&cs->repair.lock, NULL);
	if (cfg->nlegs < 1 || cfg->nlegs > 2 || (cfg->nlegs == 1 && !cfg->allow_single_leg)) {
		cache_errf(err, errlen, "cache %s: give two legs (a mirror), or one with allow_single_leg = yes",
		     cfg->name);
		goto out;
	}
	if (scan_legs(cs, cfg, sc, err, errlen) < 0 || pick_newest(cs, cfg, sc, err, errlen) < 0)
		goto out;
	if (sc->nsb) {
		if (check_members(cs, cfg, sc, err, errlen) < 0 || check_shape(cfg, sc, err, errlen) < 0)
			goto out;
		order_legs(cs, cfg, sc);
		if (adopt_layout(cs, cfg, sc, err, errlen) < 0 || adopt_failed(cs, cfg, sc, err, errlen) < 0)
			goto out;
	} else if (meta_layout(cs->legs[0]->size, cfg->extent_size, CACHE_VERSION, &cs->lay) < 0) {
		cache_errf(err, errlen, "cache %s: legs of %llu bytes are too small for %u KiB extents; give a "
			"larger size", cfg->name, (unsigned long long)cs->legs[0]->size, cfg->extent_size >> 10);
		goto out;
	}
	if (alloc_memory(cs) < 0) {
		cache_errf(err, errlen, "cache %s: out of memory for %u slots", cfg->name, cs->lay.nslots);
		goto out;
	}
	mirror_init(&cs->mirror, cs->legs, cfg->nlegs, sc->failed);
	cs->mirror.persist = cache_persist_failed;
	cs->mirror.persist_arg = cs;
	cs->mirror.read_error = cache_repair_note;
	cs->mirror.all_failed = cache_all_legs_failed;
	if (intent_init(&cs->intent, cs) < 0 || dlog_init(cs) < 0) {
		cache_errf(err, errlen, "cache %s: out of memory", cfg->name);
		goto out;
	}
	bool unclean = sc->nsb && !le32_get(sc->nsb->clean);
	if (sc->failed)
		log_warn("cache %s: degraded: a leg was recorded as failed; replace it", cfg->name);
	if (sc->nsb) {
		int leg = sc->best;
		if (sc->failed & (1u << leg))
			leg = 1 - leg;
		if (adopt_btab(cs, cfg, sc, leg, err, errlen) < 0 || cache_recover_set(cs, leg, err, errlen) < 0)
			goto out;
		if (unclean &&
		    intent_recover(cs, leg, le32_get(sc->nsb->version) == CACHE_VERSION_V1, err, errlen) < 0)
			goto out;
		int jr = unclean ? cache_journal_cut_heads(cs) : 0;
		if (jr < 0) {
			cache_errf(err, errlen, "cache %s: cannot write the journal: %s", cfg->name, strerror(-jr));
			goto out;
		}
	} else if (format_set(cs, err, errlen) < 0) {
		goto out;
	}
	cs->cleaner = cleaner_new(cs);
	if (cs->cleaner)
		cleaner_set_max(cs->cleaner, cfg->destage_max, cfg->destage_max_iops);
	if (!cs->cleaner) {
		cache_errf(err, errlen, "cache %s: out of memory", cfg->name);
		goto out;
	}
	/*
	 * The first superblock of this run: not clean until shutdown says so.
	 * An upgraded set gets two, one in each copy, so no older superblock
	 * is left for an older tiercached to open the set by.
	 */
	cs->clean_flag = false;
	int sr = 0;
	for (int k = 0; k < (sc->upgraded ? 2 : 1) && !sr; k++)
		sr = cache_sb_write_wait(cs);
	if (sr) {
		cache_errf(err, errlen, "cache %s: cannot write the superblock: %s", cfg->name, strerror(-sr));
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
		int r = cache_sync_run(cache_ckpt_now_fn, &k);
		if (r) {
			cache_errf(err, errlen, "cache %s: cannot write the recovered metadata: %s", cfg->name,
			     strerror(-r));
			goto out;
		}
	}
	int wr = intent_clear_all(cs);
	if (wr < 0) {
		cache_errf(err, errlen, "cache %s: cannot write the write-intent page: %s", cfg->name, strerror(-wr));
		goto out;
	}
	struct sync_call t = { .cs = cs };
	cache_sync_run(tick_add, &t);
	for (int i = 0; i < cfg->nlegs; i++)
		for (int k = 0; k < 2; k++)
			buf_put(sc->sbs[i][k], CACHE_PAGE);
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
			if (sc->sbs[i][k])
				buf_put(sc->sbs[i][k], CACHE_PAGE);
	cs->cfg.nlegs = cfg->nlegs;
	cache_set_close(cs);
	return NULL;
}

/* ---- shutdown / close -------------------------------------------------------------------- */

int cache_set_shutdown(struct cache_set *cs)
{
	/* no new foreground I/O (the front end drained); wait for the cleaner and fills */
	atomic_store(&cs->stopping, 1);
	for (int i = 0; i < 10000 && (atomic_load(&cs->fg_inflight) || atomic_load(&cs->bg_inflight)); i++)
		usleep(1000);
	struct sync_call t = { .cs = cs };
	cache_sync_run(tick_del, &t);
	for (int i = 0; i < 5000; i++) {
		uint64_t rate, busy;
		cleaner_stats(cs->cleaner, &rate, &busy);
		if (!busy)
			break;
		usleep(1000);
	}
	struct sync_call c = { .cs = cs };
	int r = cache_sync_run(cache_ckpt_final_fn, &c);
	if (r)
		log_err("cache %s: final checkpoint failed: %s; the next start replays the journal",
			cs->name, strerror(-r));
	else
		log_info("cache %s: metadata checkpointed, clean shutdown recorded", cs->name);
	/* a leg that failed during the checkpoint has its failure recorded still: let it land */
	for (int i = 0; i < 10000 && atomic_load(&cs->sb.jobs); i++)
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
	if (atomic_load(&cs->trace))
		cache_trace_stop(cs, NULL);
	if (cs->cleaner)
		cleaner_free(cs->cleaner);
	for (int i = 0; i < CACHE_MAX_LEGS; i++)
		bdev_close(cs->legs[i]);
	for (int i = 0; i < cs->nold_legs; i++)
		bdev_close(cs->old_legs[i]);
	if (cs->policy)
		policy_free(cs->policy);
	advisor_free(cs->advisor);
	if (atomic_load(&cs->map.t))
		map_destroy(&cs->map);
	if (cs->bm.group)
		bm_destroy(&cs->bm);
	if (cs->ck.run) {
		for (int i = 0; i < CKPT_INFLIGHT; i++)
			if (cs->ck.run->buf[i])
				buf_put(cs->ck.run->buf[i], CACHE_PAGE);
		free(cs->ck.run);
	}
	for (int i = 0; i < CACHE_MAX_LEGS; i++)
		if (cs->sb.buf[i])
			buf_put(cs->sb.buf[i], CACHE_PAGE);
	if (cs->sb.tab)
		buf_put(cs->sb.tab, CACHE_BTAB_BYTES);
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
	free(cs->alloc.free_bits);
	free(cs->alloc.retire_bits);
	free(cs->alloc.grace_bits);
	free((void *)cs->ck.dirty);
	pthread_mutex_destroy(&cs->alloc.lock);
	pthread_mutex_destroy(&cs->vols_lock);
	pthread_mutex_destroy(&cs->sb.lock);
	pthread_mutex_destroy(&cs->lost.lock);
	pthread_mutex_destroy(&cs->dwait_lock);
	pthread_mutex_destroy(&cs->repair.lock);
	free(cs->name);
	free(cs);
}
