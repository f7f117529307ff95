/*
 * test_cache_powercut.c - no acknowledged write is lost, and the mirror is
 * one copy, at any power cut a real device allows.
 *
 * OCF's surprise-shutdown method with a device model that drops what a
 * real device may drop. A workload runs on a cache set whose legs and
 * backing store are RAM devices that complete out of order (each write
 * lands only when it completes, after a random number of re-posts) and log
 * every submission and every completion. In each cache mode it mixes
 * writes of 1..32 sectors (half with FUA, the others acknowledged by the
 * FLUSH that follows their batch), UNMAP and WRITE ZEROES, reads that
 * promote extents (fills, some of data that a write without FUA just
 * reached, before the FLUSH) and partial hits that top extents up, and a
 * destage of everything half-way. A third of the way in leg 1 is failed
 * (the set runs degraded), at two thirds it is rebuilt (the resync copies
 * leg 0 while the workload goes on): in place in write-through and
 * pass-through, onto another device in write-back and write-around (the
 * recoveries after that point list the new device, as an admin does after
 * tierctl leg replace), so cuts fall before, during and after a failure
 * and a resync.
 *
 * A write is durable at a cut once it completed with FUA, or completed
 * before a FLUSH of its device that was submitted and completed before the
 * cut. At each cut point the images keep every durable write and, in each
 * of SUBSETS random subsets (printed seeds), each write that was submitted
 * but is not durable is dropped, kept, or torn at 512-byte boundaries
 * (each sector kept or not). One cut in RECOVERY_CUT_EVERY also cuts the
 * recovery itself (its own writes logged, the same model), then recovers
 * again. After recovery:
 *  - the volume is read twice: every sector holds its last acknowledged
 *    write (or UNMAP) or a later one, never garbage, the same both times;
 *  - a leg found blank (a resync cut short) is rebuilt by the open; once
 *    that is done, every block the recovered metadata references as valid
 *    is equal on the two legs (when both are in service);
 *  - every valid clean cached block equals the backing store's (else an
 *    eviction would change what it reads);
 *  - with leg 0 failed the volume reads the same again (leg 1 alone, when
 *    it is in service).
 *
 * In write-back, writes over blocks that are already valid send their
 * journal record together with their data (one round trip, vol_write.c),
 * so cuts also fall between the two, either way round; overwrites of dirty
 * blocks send none. (test_cache_wb_trips covers what this workload does
 * not: overwrites of one block in flight together.)
 *
 * A fifth run is write-back on a LUN of 4 KiB blocks over legs that write
 * 512 bytes atomically (the torn-write guard on, cache_vol_guard_torn):
 * every request covers whole 4 KiB blocks, and each block must read back
 * from one write: its eight sectors hold the same write (or all zeroes).
 * There the backing store's writes tear at 4 KiB only: the store under
 * such a LUN writes its blocks whole, and the promise is about the legs.
 *
 * make check: CUTS cut points per mode (evenly spread) x SUBSETS subsets
 * (200 x 9 x 5 = 9000 recovered images, two to three minutes on 2 cores);
 * TC_LONG=1: every point of the log; PC_CUTS=N: N points; PC_MODE=M starts at mode M (0-4),
 * PC_MODES=N runs N modes from there; PC_DUMP and PC_REPLAY (below) save and replay a failing
 * workload, PC_CUT=C checks cut point C only, PC_TRACE=1 lists where a lost write's data went.
 * PC_SEED sets the base seed; the
 * engine's log is silenced during the recoveries unless PC_VERBOSE is set;
 * PC_PROFILE=1 prints where the time went.
 */
#include "cache/cache_int.h"
#include "tests/unit/cache_test_util.h"
#include "common/log.h"

#include <time.h>

#define BACK_SIZE (2u << 20)
#define LEG_SIZE (4u << 20)
#define NSECT (BACK_SIZE / 512)
#define EXT (64u << 10)
#define CUTS 200
#define SUBSETS 8
#define RECOVERY_CUT_EVERY 8

/* DEV_LEG1B: the device leg 1 is rebuilt onto in the modes that replace it (replace_new) */
enum { DEV_BACK, DEV_LEG0, DEV_LEG1, DEV_LEG1B, NDEV };
static const uint64_t dev_size[NDEV] = { BACK_SIZE, LEG_SIZE, LEG_SIZE, LEG_SIZE };
static bool replace_new;          /* this mode rebuilds leg 1 onto DEV_LEG1B, not in place */
static size_t replace_at = SIZE_MAX; /* log index of that replace */

/*
 * The device a configuration lists as leg 1 after a cut: once the replace
 * onto a new device was issued, the admin lists the new one (as README and
 * tierctl(8) say to), whose rebuild a cut may have left half done.
 */
static int leg1_at(size_t cut)
{
	return replace_new && cut > replace_at ? DEV_LEG1B : DEV_LEG1;
}

struct event {
	uint64_t seq;   /* 0 with unmap */
	size_t ack;     /* log index at acknowledgement */
	bool unmap;
};

struct sector_hist {
	struct event *e;
	int n, cap;
};

static struct sector_hist hist[NSECT];
static uint8_t *init_img[NDEV];
static enum cache_mode cur_mode;
static bool blk4k; /* the 4 KiB-block run */
#define BLK_SECT 8u

static void add_event(uint64_t lba, uint32_t n, uint64_t seq, size_t ack, bool unmap)
{
	for (uint32_t i = 0; i < n; i++) {
		struct sector_hist *h = &hist[lba + i];
		if (h->n == h->cap) {
			h->cap = h->cap ? h->cap * 2 : 4;
			h->e = realloc(h->e, (size_t)h->cap * sizeof(*h->e));
		}
		h->e[h->n++] = (struct event){ seq, ack, unmap };
	}
}

static struct cache_set_cfg cfg = {
	.name = "pc",
	.nlegs = 2,
	.extent_size = EXT,
	.mode = CACHE_WRITE_BACK,
	.admit_hits = 1,
	.dirty_target = 10,
};

/*
 * borrow: the devices work on img in place (no copy); verifying: no
 * promotions (the checks read everything; fills would only add work)
 */
static bool verifying;
static uint8_t **pc_touched; /* borrowed images: pages recovery writes are marked here */

static struct cache_set *open_set(struct mem_bdev **d, struct bdev **vol, uint8_t *const img[NDEV],
				  struct wlog *log, bool borrow, int leg1)
{
	char err[512];
	for (int i = 0; i < NDEV; i++) {
		d[i] = borrow ? mem_borrow(i, dev_size[i], img[i]) : mem_new(i, dev_size[i], img ? img[i] : NULL);
		if (borrow && pc_touched)
			d[i]->touched = pc_touched[i];
		if (log)
			d[i]->log = log;
	}
	struct bdev *legs[2] = { &d[DEV_LEG0]->dev, &d[leg1]->dev };
	cfg.mode = cur_mode;
	cfg.admit_hits = verifying ? 1000 : 1;
	struct cache_set *cs = cache_set_open_devs(&cfg, legs, err, sizeof(err));
	if (!cs) {
		fprintf(stderr, "open: %s\n", err);
		return NULL;
	}
	*vol = cache_vol_open(cs, "lun0", &d[DEV_BACK]->dev, NULL, cur_mode, err, sizeof(err));
	REQUIRE(*vol, "attach: %s", err);
	if (blk4k)
		REQUIRE(cache_vol_guard_torn(*vol, true), "the torn-write guard is not available");
	return cs;
}

/* ---- the device model ------------------------------------------------------- */

/*
 * For every submission i of a log: done[i] = index of its completion
 * (SIZE_MAX: none), durable[i] = the index from which it is durable.
 */
struct model {
	struct wlog *log;
	size_t n;
	size_t *done, *durable;
};

static void model_build(struct model *m, struct wlog *log)
{
	pthread_mutex_lock(&log->lock);
	m->log = log;
	m->n = log->n;
	m->done = malloc((m->n + 1) * sizeof(size_t));
	m->durable = malloc((m->n + 1) * sizeof(size_t));
	for (size_t i = 0; i < m->n; i++)
		m->done[i] = m->durable[i] = SIZE_MAX;
	for (size_t i = 0; i < m->n; i++)
		if (log->e[i].kind == WL_DONE)
			m->done[log->e[i].ref] = i;
	for (size_t i = 0; i < m->n; i++) {
		struct wlog_ent *x = &log->e[i];
		if (x->kind != WL_SUBMIT || x->flush || m->done[i] == SIZE_MAX)
			continue;
		if (x->fua) {
			m->durable[i] = m->done[i];
			continue;
		}
		/* the earliest completion of a flush of its device submitted after it completed */
		for (size_t j = m->done[i] + 1; j < m->n; j++) {
			struct wlog_ent *f = &log->e[j];
			if (f->kind == WL_SUBMIT && f->flush && f->dev == x->dev && m->done[j] < m->durable[i])
				m->durable[i] = m->done[j];
		}
	}
	pthread_mutex_unlock(&log->lock);
}

static void model_free(struct model *m)
{
	free(m->done);
	free(m->durable);
}

/*
 * Images (into out, NDEV buffers of dev_size) as a cut before log index
 * cut leaves them, on top of base: every durable write; with subset 0
 * nothing else; otherwise each write in flight dropped, kept or torn, by
 * the seed. Returns how many were in flight.
 */
/*
 * touched (or NULL: copy all of base): a bitmap per device of the 4 KiB
 * pages of out that may differ from base (recovery writes into the images
 * it works on, and so do the writes applied here); only those are restored,
 * then marked again for what this image writes. Copying 10 MiB per image
 * was most of the test's time.
 */
static void mark_pages(uint8_t *touched, uint64_t off, uint64_t len)
{
	for (uint64_t p = off / 4096; len && p <= (off + len - 1) / 4096; p++)
		touched[p / 8] |= (uint8_t)(1u << (p % 8));
}

static size_t model_image(const struct model *m, size_t cut, uint64_t seed, int subset, uint8_t *const base[NDEV],
			  uint8_t *const out[NDEV], uint8_t *const touched[NDEV])
{
	uint64_t r = seed ? seed : 1;
	size_t inflight = 0;
	for (int d = 0; d < NDEV; d++) {
		if (!touched) {
			memcpy(out[d], base[d], dev_size[d]);
			continue;
		}
		for (uint64_t p = 0; p < dev_size[d] / 4096; p++)
			if (touched[d][p / 8] & (1u << (p % 8)))
				memcpy(out[d] + p * 4096, base[d] + p * 4096, 4096);
		memset(touched[d], 0, dev_size[d] / 4096 / 8);
	}
	for (size_t i = 0; touched && i < cut && i < m->n; i++) {
		struct wlog_ent *x = &m->log->e[i];
		if (x->kind == WL_SUBMIT && !x->flush && x->data)
			mark_pages(touched[x->dev], x->off, x->len);
	}
	for (size_t i = 0; i < cut && i < m->n; i++) {
		struct wlog_ent *x = &m->log->e[i];
		if (x->kind != WL_SUBMIT || x->flush || !x->data)
			continue;
		if (m->durable[i] < cut) {
			memcpy(out[x->dev] + x->off, x->data, x->len);
			continue;
		}
		inflight++;
		if (!subset)
			continue;
		switch (tc_xorshift(&r) % 4) {
		case 0:
			break; /* lost */
		case 1:
		case 2:
			memcpy(out[x->dev] + x->off, x->data, x->len);
			break;
		default:
		{
			/*
			 * torn: each 512-byte sector on its own; in the 4 KiB-block
			 * run the backing store tears at 4 KiB (a store a LUN with
			 * 4 KiB blocks is put on writes its blocks whole; the
			 * cache's promise is about its own legs)
			 */
			uint64_t g = blk4k && x->dev == DEV_BACK ? 4096 : 512;
			for (uint64_t o = 0; o < x->len; o += g)
				if (tc_xorshift(&r) & 1)
					memcpy(out[x->dev] + x->off + o, x->data + o, x->len - o < g ? x->len - o : g);
		}
		}
	}
	return inflight;
}

/* ---- checks after recovery ------------------------------------------------------------ */

static uint64_t rnd_state = 88172645463325252ull;
static uint64_t rnd(void) { return tc_xorshift(&rnd_state); }

static const struct model *cur_model; /* the log being cut, for trace_lost */
static uint64_t lost_seq;             /* the first lost write's seq (0: none yet) in this image */

/*
 * A lost write: where its data went (every submission carrying its stamp,
 * which device, when it completed and became durable against the cut), so
 * a failure says which of the engine's writes did not count.
 */
static void trace_lost(size_t cut, uint64_t seq)
{
	const struct model *m = cur_model;
	if (!m)
		return;
	static const char *devname[NDEV] = { "backing", "leg0", "leg1", "leg1b" };
	fprintf(stderr, "  write seq %llu (cut at %zu, replace at %zu): its data in the log:\n",
		(unsigned long long)seq, cut, replace_at);
	for (size_t i = 0; i < m->n; i++) {
		struct wlog_ent *x = &m->log->e[i];
		if (x->kind != WL_SUBMIT || !x->data)
			continue;
		for (uint64_t o = 0; o < x->len; o += 512) {
			struct stamp st;
			memcpy(&st, x->data + o, sizeof(st));
			if (st.seq != seq || st.crc != stamp_crc(st.lba, st.seq))
				continue;
			fprintf(stderr, "    #%zu %s off %llu len %llu%s lba %llu..: done #%zd, durable #%zd\n", i,
				devname[x->dev], (unsigned long long)x->off, (unsigned long long)x->len,
				x->fua ? " FUA" : "", (unsigned long long)st.lba,
				m->done[i] == SIZE_MAX ? (ssize_t)-1 : (ssize_t)m->done[i],
				m->durable[i] == SIZE_MAX ? (ssize_t)-1 : (ssize_t)m->durable[i]);
			break;
		}
	}
}

static int check_sector(size_t cut, const uint8_t *s, uint64_t lba, const char *what, int bad)
{
	uint64_t seq = 0;
	int k = stamp_check(s, lba, &seq);
	struct sector_hist *h = &hist[lba];
	int last = -1;
	for (int j = 0; j < h->n; j++)
		if (h->e[j].ack <= cut)
			last = j;
	bool ok;
	if (k < 0)
		ok = false;
	else if (last < 0)
		ok = true; /* nothing acknowledged: anything written, or nothing */
	else {
		ok = false;
		for (int j = last; j < h->n && !ok; j++)
			ok = h->e[j].unmap ? k == 0 : (k == 1 && seq == h->e[j].seq);
	}
	if (!ok && bad < 5)
		fprintf(stderr, "%s: lba %llu holds %s seq %llu; last acknowledged: %s seq %llu\n", what,
			(unsigned long long)lba, k < 0 ? "garbage" : k == 0 ? "zeroes" : "stamp",
			(unsigned long long)seq, last < 0 ? "none" : h->e[last].unmap ? "unmap" : "write",
			last < 0 ? 0ull : (unsigned long long)h->e[last].seq);
	if (!ok && !lost_seq && last >= 0 && !h->e[last].unmap) {
		lost_seq = h->e[last].seq;
		if (getenv("PC_TRACE"))
			trace_lost(cut, lost_seq);
	}
	return ok ? 0 : 1;
}

static uint8_t *vol_img[2];

static int read_all(struct bdev *vol, uint8_t *out)
{
	return tio_sync(vol, BDEV_READ, 0, out, BACK_SIZE, 0);
}

/* 0 if recovery from img meets every promise at this cut */
static double tnow(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}
static double t_open, t_read, t_close;
static unsigned long n_both, n_degraded; /* recoveries with both legs in service, with one */

static int verify(size_t cut, uint8_t *const img[NDEV], const char *what)
{
	double t0 = tnow();
	struct mem_bdev *d[NDEV];
	struct bdev *vol;
	int l1 = leg1_at(cut);
	struct cache_set *cs = open_set(d, &vol, img, NULL, true, l1);
	if (!cs) {
		fprintf(stderr, "%s: the set did not open\n", what);
		return 1;
	}
	int bad = 0;
	/* a blank leg (a resync cut short) is rebuilt by the open: wait for it */
	for (int i = 0; i < 20000 && atomic_load(&cs->mirror.resyncing); i++)
		usleep(500);
	if (atomic_load(&cs->mirror.resyncing)) {
		fprintf(stderr, "%s: the rebuild of a blank leg did not finish\n", what);
		bad++;
	}
	bool both = !atomic_load(&cs->mirror.failed);
	int blank = cs->blank_leg;
	if (both)
		n_both++;
	else
		n_degraded++;
	double t1 = tnow();
	t_open += t1 - t0;
	for (int pass = 0; pass < 2; pass++) {
		int r = read_all(vol, vol_img[pass]);
		if (r) {
			fprintf(stderr, "%s: read failed: %d\n", what, r);
			bad++;
		}
	}
	lost_seq = 0;
	for (uint64_t lba = 0; lba < NSECT; lba++)
		bad += check_sector(cut, vol_img[0] + lba * 512, lba, what, bad);
	/* 4 KiB blocks: each from one write, never part old, part new */
	for (uint64_t lba = 0; blk4k && lba < NSECT; lba += BLK_SECT) {
		uint64_t s0 = 0, sk = 0;
		int k0 = stamp_check(vol_img[0] + lba * 512, lba, &s0);
		for (uint32_t k = 1; k < BLK_SECT; k++) {
			int kk = stamp_check(vol_img[0] + (lba + k) * 512, lba + k, &sk);
			if (kk != k0 || (kk == 1 && sk != s0)) {
				if (bad < 5)
					fprintf(stderr, "%s: the 4 KiB block at lba %llu is torn: sector 0 holds %s seq "
						"%llu, sector %u %s seq %llu\n", what, (unsigned long long)lba,
						k0 == 1 ? "stamp" : "other", (unsigned long long)s0, k,
						kk == 1 ? "stamp" : "other", (unsigned long long)sk);
				bad++;
				break;
			}
		}
	}
	if (memcmp(vol_img[0], vol_img[1], BACK_SIZE)) {
		fprintf(stderr, "%s: two reads of the volume differ\n", what);
		bad++;
	}
	/* every referenced block equal on both legs */
	uint32_t diff = 0;
	for (uint32_t s = 0; both && s < cs->lay.nslots; s++) {
		if (atomic_load(&cs->slots[s].key) == CACHE_KEY_NONE)
			continue;
		for (uint32_t b = 0; b < cs->lay.bpe; b++) {
			if (!slot_all_valid(cs, s, b, 1))
				continue;
			uint64_t o = slot_leg_off(cs, s) + (uint64_t)b * CACHE_SECTOR;
			if (memcmp(d[DEV_LEG0]->data + o, d[l1]->data + o, CACHE_SECTOR)) {
				if (!diff)
					fprintf(stderr, "%s: slot %u block %u differs between the legs\n", what, s, b);
				diff++;
			}
		}
	}
	bad += diff ? 1 : 0;
	/*
	 * every valid clean block equal to the backing store: an eviction
	 * must not change what a block reads
	 */
	uint32_t stale = 0;
	for (uint32_t s = 0; s < cs->lay.nslots; s++) {
		uint64_t key = atomic_load(&cs->slots[s].key);
		if (key == CACHE_KEY_NONE)
			continue;
		for (uint32_t b = 0; b < cs->lay.bpe; b++) {
			if (!slot_all_valid(cs, s, b, 1) || slot_any_dirty(cs, s, b, 1))
				continue;
			uint64_t o = slot_leg_off(cs, s) + (uint64_t)b * CACHE_SECTOR;
			uint64_t bo = key_ext(key) * EXT + (uint64_t)b * CACHE_SECTOR;
			int src = (atomic_load(&cs->mirror.failed) & 2) ? DEV_LEG0 : l1;
			if (memcmp(d[src]->data + o, d[DEV_BACK]->data + bo, CACHE_SECTOR)) {
				if (!stale)
					fprintf(stderr, "%s: lba %llu is cached as clean but the backing store holds other data\n",
						what, (unsigned long long)(bo / 512));
				stale++;
			}
		}
	}
	bad += stale ? 1 : 0;
	/* leg 1 alone serves what both did */
	atomic_store(&d[DEV_LEG0]->fail_after, 0);
	if (both && (read_all(vol, vol_img[1]) || memcmp(vol_img[0], vol_img[1], BACK_SIZE))) {
		fprintf(stderr, "%s: with leg 0 failed the volume reads differently\n", what);
		bad++;
	}
	if (bad)
		fprintf(stderr, "%s: recovered with %s, %s, leg 1 on %s\n", what, both ? "both legs" : "leg 1 out",
			blank >= 0 ? "leg 1 found blank and rebuilt" : "no rebuild",
			l1 == DEV_LEG1B ? "the device it was replaced onto" : "its first device");
	double t2 = tnow();
	t_read += t2 - t1;
	test_set_close(cs, vol);
	bdev_close(&d[l1 == DEV_LEG1 ? DEV_LEG1B : DEV_LEG1]->dev); /* the leg 1 device not listed */
	t_close += tnow() - t2;
	return bad;
}

/* Recover from img with the recovery's writes logged, cut those, recover again. */
static int verify_recovery_cut(size_t cut, uint8_t *const img[NDEV], uint64_t seed, const char *what)

{
	static struct wlog rlog = { .lock = PTHREAD_MUTEX_INITIALIZER };
	wlog_reset(&rlog);
	rlog.on = true;
	struct mem_bdev *d[NDEV];
	struct bdev *vol;
	int l1 = leg1_at(cut);
	struct cache_set *cs = open_set(d, &vol, img, &rlog, false, l1);
	if (!cs) {
		fprintf(stderr, "%s: the set did not open\n", what);
		return 1;
	}
	pthread_mutex_lock(&rlog.lock);
	rlog.on = false;
	pthread_mutex_unlock(&rlog.lock);
	test_set_close(cs, vol);
	bdev_close(&d[l1 == DEV_LEG1 ? DEV_LEG1B : DEV_LEG1]->dev); /* the leg 1 device not listed */
	struct model rm;
	model_build(&rm, &rlog);
	uint64_t r = seed;
	size_t rcut = rm.n ? (size_t)(tc_xorshift(&r) % (rm.n + 1)) : 0;
	static uint8_t *img2[NDEV];
	for (int i = 0; i < NDEV; i++)
		if (!img2[i])
			img2[i] = malloc(dev_size[i]);
	model_image(&rm, rcut, tc_xorshift(&r), 1, img, img2, NULL);
	char w2[256];
	snprintf(w2, sizeof(w2), "%s, recovery cut at %zu of %zu", what, rcut, rm.n);
	int bad = verify(cut, img2, w2);
	model_free(&rm);
	return bad;
}

/* ---- the workload ------------------------------------------------------------------- */

static void set_hops(struct mem_bdev **d, int rh, int wh)
{
	for (int i = 0; i < NDEV; i++) {
		atomic_store(&d[i]->read_hops, rh);
		atomic_store(&d[i]->write_hops, wh);
	}
}

static size_t workload(int nbatches)
{
	struct mem_bdev *d[NDEV];
	struct bdev *vol;
	wlog_reset(&g_log);
	for (uint32_t i = 0; i < NSECT; i++)
		hist[i].n = 0;
	replace_at = SIZE_MAX;
	struct cache_set *cs = open_set(d, &vol, NULL, NULL, false, DEV_LEG1);
	REQUIRE(cs, "format");
	/* pre-existing backing data: stamps with seq 0 in the first half */
	for (uint64_t off = 0; off < BACK_SIZE / 2; off += 512)
		stamp_fill(d[DEV_BACK]->data + off, off / 512, 1, 0);
	for (int i = 0; i < NDEV; i++) {
		free(init_img[i]);
		init_img[i] = malloc(dev_size[i]);
		memcpy(init_img[i], d[i]->data, dev_size[i]);
	}
	for (uint64_t s = 0; s < NSECT / 2; s++)
		add_event(s, 1, 0, 0, false);
	set_hops(d, 1, 3);
	pthread_mutex_lock(&g_log.lock);
	g_log.on = true;
	pthread_mutex_unlock(&g_log.lock);

	uint64_t seq = 1;
	uint8_t *bufs[8];
	for (int i = 0; i < 8; i++)
		bufs[i] = buf_get(32u << 10);
	uint8_t *rbuf = buf_get(EXT);
	for (int batch = 0; batch < nbatches; batch++) {
		struct tio t[8];
		uint64_t lba[8];
		uint32_t n[8];
		int kind[8]; /* 0 write, 1 unmap, 2 write zeroes */
		_Atomic int out = 0;
		int k = 0;
		for (int i = 0; i < 8; i++) {
			uint32_t ns = 1 + (uint32_t)(rnd() % 32);
			uint64_t l = rnd() % (NSECT - ns);
			if (blk4k) {
				/* up to 32 KiB: eight such records in flight overfill a ring (waits for room) */
				ns = BLK_SECT * (1 + (uint32_t)(rnd() % 8));
				l = rnd() % ((NSECT - ns) / BLK_SECT + 1) * BLK_SECT;
			}
			bool overlap = false;
			for (int j = 0; j < k; j++)
				if (l < lba[j] + n[j] && lba[j] < l + ns)
					overlap = true;
			if (overlap)
				continue;
			lba[k] = l;
			n[k] = ns;
			uint64_t x = rnd() % 16;
			kind[k] = x == 0 ? 1 : x == 1 ? 2 : 0;
			if (kind[k]) {
				tio_submit(&t[k], vol, kind[k] == 1 ? BDEV_UNMAP : BDEV_WRITE_ZEROES, l * 512, NULL, ns * 512,
					   0, &out, k);
			} else {
				stamp_fill(bufs[k], l, ns, seq + (uint64_t)k);
				tio_submit(&t[k], vol, BDEV_WRITE, l * 512, bufs[k], ns * 512, (rnd() & 1) ? BDEV_F_FUA : 0,
					   &out, k);
			}
			k++;
		}
		while (atomic_load(&out))
			usleep(20);
		/* a write without FUA is acknowledged by the FLUSH after it (SCSI's rule with WCE=1) */
		bool any_volatile = false;
		for (int i = 0; i < k; i++)
			if (!kind[i] && !(t[i].req.flags & BDEV_F_FUA))
				any_volatile = true;
		size_t flush_ack = 0;
		if (any_volatile && batch % 3 == 2) {
			/* promote an extent that a write without FUA just reached, before the FLUSH */
			for (int i = 0; i < k; i++)
				if (!kind[i] && !(t[i].req.flags & BDEV_F_FUA)) {
					uint64_t off = lba[i] * 512 / EXT * EXT;
					REQUIRE(tio_sync(vol, BDEV_READ, off, rbuf, EXT, 0) == 0, "read");
					REQUIRE(tio_sync(vol, BDEV_READ, off, rbuf, EXT, 0) == 0, "read");
					break;
				}
		}
		if (any_volatile) {
			struct tio f;
			tio_submit(&f, vol, BDEV_FLUSH, 0, NULL, 0, 0, NULL, batch);
			while (!atomic_load(&f.done))
				usleep(20);
			REQUIRE(f.err == 0, "flush failed: %d", f.err);
			flush_ack = f.ack_index;
		}
		for (int i = 0; i < k; i++) {
			REQUIRE(t[i].err == 0, "workload request failed: %d", t[i].err);
			size_t ack = (!kind[i] && !(t[i].req.flags & BDEV_F_FUA)) ? flush_ack : t[i].ack_index;
			add_event(lba[i], n[i], kind[i] ? 0 : seq + (uint64_t)i, ack, kind[i] != 0);
		}
		seq += 8;
		if (batch % 3 == 1) {
			/* reads: a whole extent twice (promotion: a fill), then a partial hit (top-up) */
			uint64_t off = (rnd() % (BACK_SIZE / EXT)) * EXT;
			REQUIRE(tio_sync(vol, BDEV_READ, off, rbuf, EXT, 0) == 0, "read");
			REQUIRE(tio_sync(vol, BDEV_READ, off, rbuf, EXT, 0) == 0, "read");
			uint64_t l = lba[0] / (EXT / 512) * EXT;
			REQUIRE(tio_sync(vol, BDEV_READ, l, rbuf, EXT, 0) == 0, "read");
		}
		if (batch == nbatches / 2)
			REQUIRE(cache_set_flush(cs, 20000) == 0, "flush did not finish");
		char err[256];
		if (batch == nbatches / 3) {
			REQUIRE(cache_set_fail_leg(cs, d[DEV_LEG1]->name, "by the power-cut test", err, sizeof(err)) == 0,
				"leg fail: %s", err);
			for (int i = 0; i < 20000 && atomic_load(&cs->mirror.persisted) != 2; i++)
				usleep(100);
		}
		if (batch == 2 * nbatches / 3) {
			if (replace_new)
				replace_at = wlog_len();
			REQUIRE(cache_set_leg_replace(cs, 1, &d[replace_new ? DEV_LEG1B : DEV_LEG1]->dev, err,
						      sizeof(err)) == 0,
				"rebuild %s: %s", replace_new ? "onto a new device" : "in place", err);
		}
	}
	/* the rebuild runs beside the rest of the workload; let it end */
	for (int i = 0; i < 20000 && atomic_load(&cs->mirror.resyncing); i++)
		usleep(500);
	REQUIRE(!atomic_load(&cs->mirror.resyncing) && !atomic_load(&cs->mirror.failed),
		"the rebuild of leg 1 did not finish");
	/* let fills and top-ups finish, then stop logging */
	for (int i = 0; i < 2000 && (atomic_load(&cs->bg_inflight) || atomic_load(&cs->fg_inflight)); i++)
		usleep(1000);
	size_t total = wlog_len();
	pthread_mutex_lock(&g_log.lock);
	g_log.on = false;
	pthread_mutex_unlock(&g_log.lock);
	/* the rebuilt leg holds what leg 0 does, block for block, without any cut */
	uint32_t differ = 0;
	for (uint32_t s = 0; s < cs->lay.nslots; s++) {
		if (atomic_load(&cs->slots[s].key) == CACHE_KEY_NONE)
			continue;
		for (uint32_t b = 0; b < cs->lay.bpe; b++) {
			uint64_t o = slot_leg_off(cs, s) + (uint64_t)b * CACHE_SECTOR;
			if (slot_all_valid(cs, s, b, 1) &&
			    memcmp(d[DEV_LEG0]->data + o, d[replace_new ? DEV_LEG1B : DEV_LEG1]->data + o, CACHE_SECTOR))
				differ++;
		}
	}
	REQUIRE(differ == 0, "%s: after the rebuild %u referenced blocks differ between the legs",
		cache_mode_name(cur_mode), differ);
	struct cache_set_status st;
	cache_set_status(cs, &st);
	printf("%s workload: %d batches, %zu log entries, leg 1 rebuilt %s; %llu promotions, %llu top-ups, "
	       "%llu KiB destaged, %llu write hits (%llu with data and record together, %llu needing no record), "
	       "%llu block log records "
	       "(%llu waited for room)\n",
	       cache_mode_name(cur_mode), nbatches, total, replace_new ? "onto a new device" : "in place", (unsigned long long)st.promotions,
	       (unsigned long long)st.topups, (unsigned long long)(st.destaged_bytes >> 10),
	       (unsigned long long)st.write_hits, (unsigned long long)st.write_one_trip,
	       (unsigned long long)st.write_no_record,
	       (unsigned long long)st.block_log_writes, (unsigned long long)st.block_log_waits);
	/* write-back must have cut records sent beside their data (the one-trip path, vol_write.c) */
	if (cur_mode == CACHE_WRITE_BACK && !blk4k)
		REQUIRE(st.write_one_trip > 0 && st.write_no_record > 0,
			"write-back took the one trip %llu times and went without a record %llu times",
			(unsigned long long)st.write_one_trip, (unsigned long long)st.write_no_record);
	/* the 4 KiB-block run must have exercised the block log, its ring full included */
	if (blk4k)
		REQUIRE(st.block_log_writes > 0, "no overwrite of dirty data went through the block log");
	for (int i = 0; i < 8; i++)
		buf_put(bufs[i], 32u << 10);
	buf_put(rbuf, EXT);
	test_set_close(cs, vol);
	if (!replace_new)
		bdev_close(&d[DEV_LEG1B]->dev); /* never given to the set */
	return total;
}

/*
 * PC_DUMP=FILE: the first failing mode's workload (its log, the images it
 * started from, what was acknowledged when) is saved to FILE, so
 * PC_REPLAY=FILE checks the same interleaving again (PC_MODE names its mode)
 * without running the workload: a failure that needs a rare interleaving
 * can be studied as often as needed.
 */
static void dump_workload(const char *path, size_t total)
{
	FILE *f = fopen(path, "wb");
	if (!f)
		return;
	fwrite(&replace_at, sizeof(replace_at), 1, f);
	fwrite(&total, sizeof(total), 1, f);
	for (int d = 0; d < NDEV; d++)
		fwrite(init_img[d], 1, dev_size[d], f);
	for (uint32_t i = 0; i < NSECT; i++) {
		fwrite(&hist[i].n, sizeof(int), 1, f);
		fwrite(hist[i].e, sizeof(struct event), (size_t)hist[i].n, f);
	}
	fwrite(&g_log.n, sizeof(g_log.n), 1, f);
	for (size_t i = 0; i < g_log.n; i++) {
		struct wlog_ent x = g_log.e[i];
		bool has = x.data != NULL;
		x.data = NULL;
		fwrite(&x, sizeof(x), 1, f);
		fwrite(&has, sizeof(has), 1, f);
		if (has)
			fwrite(g_log.e[i].data, 1, x.len, f);
	}
	fclose(f);
	fprintf(stderr, "workload saved to %s (PC_REPLAY)\n", path);
}

static size_t load_workload(const char *path)
{
	FILE *f = fopen(path, "rb");
	REQUIRE(f, "cannot open %s", path);
	size_t total = 0, n = 0;
	bool ok = fread(&replace_at, sizeof(replace_at), 1, f) == 1 && fread(&total, sizeof(total), 1, f) == 1;
	for (int d = 0; d < NDEV; d++) {
		free(init_img[d]);
		init_img[d] = malloc(dev_size[d]);
		ok = ok && fread(init_img[d], 1, dev_size[d], f) == dev_size[d];
	}
	for (uint32_t i = 0; i < NSECT && ok; i++) {
		int k = 0;
		ok = fread(&k, sizeof(k), 1, f) == 1;
		hist[i].n = 0;
		for (int j = 0; j < k && ok; j++) {
			struct event e;
			ok = fread(&e, sizeof(e), 1, f) == 1;
			add_event(i, 1, e.seq, e.ack, e.unmap);
		}
	}
	ok = ok && fread(&n, sizeof(n), 1, f) == 1;
	wlog_reset(&g_log);
	for (size_t i = 0; i < n && ok; i++) {
		struct wlog_ent x;
		bool has = false;
		ok = fread(&x, sizeof(x), 1, f) == 1 && fread(&has, sizeof(has), 1, f) == 1;
		uint8_t *data = NULL;
		if (ok && has) {
			data = malloc(x.len);
			ok = fread(data, 1, x.len, f) == x.len;
		}
		g_log.on = true;
		wlog_append(&g_log, x.kind, x.dev, x.flush, x.fua, x.off, x.len, data, x.ref);
		g_log.on = false;
		free(data);
	}
	fclose(f);
	REQUIRE(ok, "%s is not a whole saved workload", path);
	return total;
}

int main(void)
{
	bool long_run = getenv("TC_LONG") != NULL;
	setvbuf(stdout, NULL, _IOLBF, 0);
	uint64_t base_seed = getenv("PC_SEED") ? strtoull(getenv("PC_SEED"), NULL, 0) : 0x7c0ffee5eedull;
	REQUIRE(workers_start(getenv("TC_TEST_WORKERS") ? (unsigned)atoi(getenv("TC_TEST_WORKERS")) : 2) == 0, "workers");
	vol_img[0] = malloc(BACK_SIZE);
	vol_img[1] = malloc(BACK_SIZE);
	printf("base seed %#llx (PC_SEED); subset s of cut c uses seed base ^ (c * 1000003 + s)\n",
	       (unsigned long long)base_seed);
	enum cache_mode modes[] = { CACHE_WRITE_BACK, CACHE_WRITE_THROUGH, CACHE_WRITE_AROUND, CACHE_PASS_THROUGH,
				    CACHE_WRITE_BACK };
	int total_failures = 0;
	size_t first_mode = getenv("PC_MODE") ? strtoul(getenv("PC_MODE"), NULL, 0) : 0;
	size_t end_mode = sizeof(modes) / sizeof(modes[0]);
	if (getenv("PC_MODES") && first_mode + strtoul(getenv("PC_MODES"), NULL, 0) < end_mode)
		end_mode = first_mode + strtoul(getenv("PC_MODES"), NULL, 0);
	for (size_t mi = first_mode; mi < end_mode; mi++) {
		cur_mode = modes[mi];
		blk4k = mi == 4;
		replace_new = mi % 2 == 0; /* write-back and write-around: onto a new device */
		struct timespec t0, t1;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		size_t total = getenv("PC_REPLAY") ? load_workload(getenv("PC_REPLAY")) : workload(long_run ? 60 : 24);
		struct model m;
		model_build(&m, &g_log);
		cur_model = &m;
		if (!getenv("PC_VERBOSE"))
			log_set_level((enum log_level)0); /* thousands of recoveries: their log says nothing new */
		verifying = true;
		static uint8_t *touched[NDEV];
		for (int i = 0; i < NDEV; i++) {
			if (!touched[i])
				touched[i] = malloc(dev_size[i] / 4096 / 8);
			memset(touched[i], 0xff, dev_size[i] / 4096 / 8); /* a new base: the first image copies all */
		}
		size_t cuts = getenv("PC_CUTS") ? strtoul(getenv("PC_CUTS"), NULL, 0) : CUTS;
		size_t npoints = long_run || total + 1 <= cuts ? total + 1 : cuts;
		size_t only_cut = getenv("PC_CUT") ? strtoul(getenv("PC_CUT"), NULL, 0) : SIZE_MAX;
		int failures = 0;
		size_t tried = 0, rcuts = 0, inflight_sum = 0;
		for (size_t pi = 0; pi < npoints && failures < 3; pi++) {
			size_t cut = npoints == total + 1 ? pi : pi * (total + 1) / npoints;
			if (only_cut != SIZE_MAX) {
				if (pi)
					break;
				cut = only_cut; /* PC_CUT: this cut point only */
			}
			for (int s = 0; s <= SUBSETS && failures < 3; s++) {
				uint64_t seed = base_seed ^ ((uint64_t)cut * 1000003u + (uint64_t)s);
				static uint8_t *img[NDEV];
				for (int i = 0; i < NDEV; i++)
					if (!img[i])
						img[i] = malloc(dev_size[i]);
				pc_touched = touched;
				inflight_sum += model_image(&m, cut, seed, s, init_img, img, touched);
				char what[160];
				snprintf(what, sizeof(what), "%s cut %zu subset %d (seed %#llx)", cache_mode_name(cur_mode), cut,
					 s, (unsigned long long)seed);
				int bad;
				if ((pi * (SUBSETS + 1) + (size_t)s) % RECOVERY_CUT_EVERY == 0) {
					bad = verify_recovery_cut(cut, img, seed * 0x9e3779b97f4a7c15ull + 1, what);
					rcuts++;
				} else {
					bad = verify(cut, img, what);
				}
				tried++;
				if (bad) {
					fprintf(stderr, "%s: %d problems\n", what, bad);
					if (!failures && getenv("PC_DUMP") && !getenv("PC_REPLAY"))
						dump_workload(getenv("PC_DUMP"), total);
					failures++;
				}
			}
		}
		clock_gettime(CLOCK_MONOTONIC, &t1);
		printf("%s%s: %zu cut points x %d subsets (+ the durable-only image): %zu recoveries (%zu with the "
		       "recovery cut too; %lu with both legs in service, %lu degraded), %.1f writes in flight per "
		       "image on average, %d failed, %.1f s\n",
		       cache_mode_name(cur_mode), blk4k ? " (4 KiB blocks)" : "", npoints, SUBSETS, tried, rcuts, n_both, n_degraded,
		       tried ? (double)inflight_sum / (double)tried : 0.0, failures,
		       (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
		cur_model = NULL;
		model_free(&m);
		if (getenv("PC_PROFILE"))
			printf("  open %.1f s, reads and checks %.1f s, shutdown %.1f s\n", t_open, t_read, t_close);
		t_open = t_read = t_close = 0;
		n_both = n_degraded = 0;
		log_set_level(LOG_LVL_INFO);
		verifying = false;
		total_failures += failures;
	}
	REQUIRE(total_failures == 0, "%d power-cut images broke a promise", total_failures);
	printf("ok: no acknowledged write lost, no garbage, reads stable, legs equal, in every mode\n");
	workers_stop();
	return 0;
}
