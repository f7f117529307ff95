/*
 * sb.c - superblock writes: one at a time per set, both copies on every
 * healthy leg (alternating slots, generation + 1), callers queued behind
 * the one in flight; and the mirror's callbacks that persist a leg
 * failure in the superblock before the write that saw it completes.
 *
 * Nothing here allocates: a waiter brings its own job, and a generation
 * nobody waits on (a leg failure to record, a new size) is asked for with
 * a call embedded in the set. A request lost to a refused malloc would
 * leave its waiter waiting for good; for a leg failure, every write the
 * mirror holds until the failure is on disk.
 *
 * Threading: on worker 0 (cache_sb_write posts there from anywhere).
 */
#include "cache/cache_int.h"

#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int cache_leg_format(const char *path, uint32_t *version, char *err, size_t errlen)
{
	*version = 0;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		if (errno == ENOENT)
			return 0; /* a leg file not made yet: the start creates it */
		if (errno == EACCES || errno == EPERM) {
			/* a check by a user who may not read the devices: the
			 * configuration is still checked; the start (root) checks
			 * the format again when it opens the set */
			fprintf(stderr, "%s: not readable here (%s): its on-disk format is not checked\n", path,
				strerror(errno));
			return 0;
		}
		snprintf(err, errlen, "leg %s cannot be read: %s", path, strerror(errno));
		return -1;
	}
	uint8_t page[2][CACHE_PAGE];
	ssize_t n = pread(fd, page, sizeof(page), 0);
	int e = errno;
	close(fd);
	if (n < 0) {
		snprintf(err, errlen, "leg %s cannot be read: %s", path, strerror(e));
		return -1;
	}
	/*
	 * Both superblock copies: the newest whole one says the format. A copy
	 * this build can read must pass its checksum; one of a newer format
	 * cannot be checked, and counts when its generation (at the same place
	 * in every version so far) is the newest.
	 */
	uint64_t best_gen = 0;
	bool any = false;
	for (int i = 0; i < 2 && (i + 1) * (ssize_t)CACHE_PAGE <= n; i++) {
		struct cache_sb_disk sb;
		memcpy(&sb, page[i], sizeof(sb));
		if (le64_get(sb.magic) != CACHE_MAGIC)
			continue;
		uint32_t v = le32_get(sb.version);
		const char *why;
		if (v <= CACHE_VERSION && meta_sb_check(&sb, &why) < 0)
			continue; /* torn or corrupt: the other copy speaks */
		uint64_t gen = le64_get(sb.gen);
		if (!any || gen > best_gen) {
			best_gen = gen;
			*version = v;
			any = true;
		}
	}
	if (*version > CACHE_VERSION) {
		snprintf(err, errlen, "leg %s holds a cache set of on-disk format version %u, newer than this "
			 "tiercached reads (up to %u): run the tiercached that wrote it (its dirty data is there), "
			 "or flush and detach the cache with it first", path, *version, CACHE_VERSION);
		return -1;
	}
	return 0;
}

/* ---- superblock ---------------------------------------------------------------- */

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
	sb->ckpt_seq = le64_of(cs->ck.seq);
	for (int j = 0; j < CACHE_NJOURNALS; j++)
		sb->jtail[j] = le64_of(cs->jtail[j]);
	snprintf(sb->set_name, sizeof(sb->set_name), "%s", cs->name);
	sb->btab_copy = le32_of(cs->btab_leg[leg]);
	sb->btab_crc = le32_of(cs->btab_crc);
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

/*
 * Worker 0: the generation in flight is done (on sb_ok legs). The leg
 * failures it records are on disk: the mirror releases the writes that
 * waited for that (before the jobs' callbacks: a resync's clears its
 * leg's mark again). Then answer its jobs and start the next.
 */
static void sb_finish(struct cache_set *cs)
{
	struct sb_job *list = cs->sb.inflight;
	int res = cs->sb.ok ? 0 : -EIO;
	int done = cs->sb.kick_inflight ? 1 : 0;
	cs->sb.inflight = NULL;
	cs->sb.kick_inflight = false;
	cs->sb.busy = false;
	/*
	 * Always: with no leg left to take it (res != 0) every leg has
	 * failed, and the writes the mirror holds must be let go all the same
	 * (must_wait is false then; mirror_persisted looks at them again).
	 */
	uint32_t newly = res ? 0 : cs->sb.built_failed & ~atomic_load(&cs->mirror.persisted);
	mirror_persisted(&cs->mirror, res ? 0 : cs->sb.built_failed);
	if (newly)
		log_warn("cache %s: degraded; leg failure recorded in the surviving leg's superblock", cs->name);
	while (list) {
		struct sb_job *j = list;
		list = j->next; /* j may be gone once its callback returns */
		j->cb(j->arg, res);
		done++;
	}
	if (cs->sb.waiting || cs->sb.kick)
		sb_issue(cs);
	atomic_fetch_sub(&cs->sb.jobs, done); /* the last access: shutdown may free the set after it */
}

static void sb_leg_done(struct bdev_req *req, int err)
{
	struct cache_set *cs = req->priv;
	int leg = (int)(req - cs->sb.req);
	if (err)
		mirror_leg_failed(&cs->mirror, leg, err);
	else
		cs->sb.ok++;
	if (--cs->sb.pending)
		return;
	sb_finish(cs);
}

/*
 * Worker 0: a leg's copy of the new backing table is on disk (or not: then
 * the leg gets no superblock naming it, and has failed).
 */
static void sb_tab_done(struct bdev_req *req, int err)
{
	struct cache_set *cs = req->priv;
	int leg = (int)(req - cs->sb.tab_req);
	if (err) {
		sb_leg_done(&cs->sb.req[leg], err);
		return;
	}
	bdev_submit(cs->legs[leg], &cs->sb.req[leg]);
}

/* Worker 0. No leg to write to: the jobs fail with -EIO (sbreq[] was not issued: no leg erred). */
static void sb_fail_async(void *arg)
{
	struct cache_set *cs = arg;
	cs->sb.pending = 0;
	cs->sb.ok = 0;
	sb_finish(cs);
}

/* Worker 0. Writes one generation to every healthy leg, serving every waiter. */
static void sb_issue(struct cache_set *cs)
{
	cs->sb.busy = true;
	cs->sb.inflight = cs->sb.waiting;
	cs->sb.waiting = NULL;
	cs->sb.kick_inflight = cs->sb.kick;
	cs->sb.kick = false;
	pthread_mutex_lock(&cs->sb.lock);
	uint64_t gen = ++cs->sb.gen;
	cs->sb.built_failed = atomic_load(&cs->mirror.failed); /* build_sb records it, or more */
	uint32_t failed = cs->sb.built_failed |
			  (atomic_load(&cs->mirror.resyncing) & ~atomic_load(&cs->sb.include));
	/*
	 * A changed backing table goes, on each leg this generation reaches,
	 * into the copy that leg's newest superblock does not name, and the
	 * generation names it there: until its superblock is whole on a leg,
	 * that leg's newest whole superblock still names the copy left
	 * untouched. (Per leg: after a crash the legs' newest superblocks may
	 * name different copies.)
	 */
	bool tab = cs->btab_changed;
	if (tab) {
		memcpy(cs->sb.tab, cs->backing, CACHE_BTAB_BYTES);
		cs->btab_crc = meta_btab_crc(cs->sb.tab);
		cs->btab_changed = false;
		for (int i = 0; i < cs->mirror.nlegs; i++)
			if (!(failed & (1u << i)))
				cs->btab_leg[i] ^= 1;
	}
	int n = 0;
	for (int i = 0; i < cs->mirror.nlegs; i++) {
		if (failed & (1u << i))
			continue;
		build_sb(cs, i, gen, cs->sb.buf[i]);
		n++;
	}
	pthread_mutex_unlock(&cs->sb.lock);
	cs->sb.pending = n;
	cs->sb.ok = 0;
	if (!n) {
		worker_post_call(worker_self(), &cs->sb.fail_call, sb_fail_async, cs); /* one at a time: busy */
		return;
	}
	for (int i = 0; i < cs->mirror.nlegs; i++) {
		if (failed & (1u << i))
			continue;
		cs->sb.iov[i].iov_base = cs->sb.buf[i];
		cs->sb.iov[i].iov_len = CACHE_PAGE;
		cs->sb.req[i] = (struct bdev_req){
			.op = BDEV_WRITE,
			.flags = BDEV_F_FUA,
			.offset = (gen & 1) * CACHE_PAGE,
			.len = CACHE_PAGE,
			.iov = &cs->sb.iov[i],
			.iovcnt = 1,
			.done = sb_leg_done,
			.priv = cs,
		};
		if (!tab) {
			bdev_submit(cs->legs[i], &cs->sb.req[i]);
			continue;
		}
		cs->sb.tab_iov[i].iov_base = cs->sb.tab;
		cs->sb.tab_iov[i].iov_len = CACHE_BTAB_BYTES;
		cs->sb.tab_req[i] = (struct bdev_req){
			.op = BDEV_WRITE,
			.flags = BDEV_F_FUA,
			.offset = meta_btab_off(cs->btab_leg[i]),
			.len = CACHE_BTAB_BYTES,
			.iov = &cs->sb.tab_iov[i],
			.iovcnt = 1,
			.done = sb_tab_done,
			.priv = cs,
		};
		bdev_submit(cs->legs[i], &cs->sb.tab_req[i]);
	}
}

static void sb_post_fn(void *arg)
{
	struct sb_job *j = arg;
	struct cache_set *cs = j->cs;
	j->next = NULL;
	struct sb_job **t = &cs->sb.waiting;
	while (*t)
		t = &(*t)->next;
	*t = j;
	if (!cs->sb.busy)
		sb_issue(cs);
}

void cache_sb_write(struct cache_set *cs, struct sb_job *j, void (*cb)(void *arg, int err), void *arg)
{
	j->cs = cs;
	j->cb = cb;
	j->arg = arg;
	atomic_fetch_add(&cs->sb.jobs, 1);
	worker_post_call(worker_get(0), &j->call, sb_post_fn, j);
}

int cache_sb_write_wait(struct cache_set *cs)
{
	struct sync_call c = { .cs = cs };
	pthread_mutex_init(&c.lock, NULL);
	pthread_cond_init(&c.cond, NULL);
	cache_sb_write(cs, &c.job, (void (*)(void *, int))cache_sync_done, &c);
	pthread_mutex_lock(&c.lock);
	while (!c.done)
		pthread_cond_wait(&c.cond, &c.lock);
	pthread_mutex_unlock(&c.lock);
	pthread_mutex_destroy(&c.lock);
	pthread_cond_destroy(&c.cond);
	return c.err;
}

static void sb_kick_fn(void *arg)
{
	struct cache_set *cs = arg;
	atomic_store(&cs->sb.kick_posted, false); /* a kick from now on posts again */
	if (cs->sb.kick)
		atomic_fetch_sub(&cs->sb.jobs, 1); /* joins the one not issued yet */
	else
		cs->sb.kick = true;
	if (!cs->sb.busy)
		sb_issue(cs);
}

void cache_sb_kick(struct cache_set *cs)
{
	if (atomic_exchange(&cs->sb.kick_posted, true))
		return; /* one is on its way: its generation is built after this call */
	atomic_fetch_add(&cs->sb.jobs, 1);
	worker_post_call(worker_get(0), &cs->sb.kick_call, sb_kick_fn, cs);
}

/*
 * Any worker: the mirror lost a leg; record it before writes complete.
 * The next generation records it (sb_issue reads the failed mask when it
 * builds one), and its end tells the mirror (sb_finish).
 */
void cache_persist_failed(struct mirror *m, uint32_t failed, void *arg)
{
	(void)m;
	(void)failed;
	cache_sb_kick(arg);
}

/*
 * Any worker, once: the last leg failed. Every dirty block is lost from
 * this moment; list them all now (cache_lost_note), so status names the
 * lost ranges before a host meets them.
 */
void cache_all_legs_failed(struct mirror *m, void *arg)
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
