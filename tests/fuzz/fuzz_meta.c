/*
 * fuzz_meta.c - corrupted cache metadata into recovery (cache_set_open_devs).
 *
 * Invariant: whatever the legs' metadata holds, opening the set either
 * refuses with a sentence in err, or opens; and if it opens, a read of the
 * volume either fails or returns, for every 512-byte sector, a version that
 * was really written at that LBA at some point (or the backing store's
 * initial content): never another LBA's data, never garbage. Nothing
 * crashes, hangs or leaks (ASan/UBSan/LeakSanitizer, libFuzzer's timeout).
 *
 * Set-up (once per process, LLVMFuzzerInitialize): a mirrored write-back
 * set on two 4 MiB RAM legs (tests/unit/cache_test_util.h mem_bdev, every
 * submission logged) in front of a 2 MiB RAM backing store whose sectors
 * all carry a stamp (lba, seq 0, crc). A fixed pseudo-random workload of
 * stamped writes (every sector says which write put it there: lba, seq,
 * crc), reads that promote, UNMAPs and one flush runs through the volume
 * (under the torn-write guard, so overwrites of dirty data leave block log
 * records for recovery to parse);
 * the log gives the images of all three devices as a power cut at
 * NCUT-1 points of it would leave them (FUA writes, and others once a
 * flush followed), and the last image is the clean shutdown.
 *
 * Input: byte 0 picks the image (modulo NCUT) and the open variant (the
 * quotient: bit 0 legs swapped, bit 1 one leg only); byte 1 the extras:
 * bit 0 write after the open and read it back (the input's last 12 bytes,
 * 3 per write: lba, 2 bytes big-endian, then the sector count - 1), bit 1
 * shut down and open again, bit 2 run the set's tick (destage, evict,
 * clear intent bits) and read again, bit 3 after the first read a leg
 * fails every I/O from then on (bit 4: leg 1's image, not leg 0's; bit 5:
 * both); then mutation records:
 *
 *   hdr   bits 0-2 region: 0 superblock A, 1 superblock B, 2 write-intent
 *         page, 3 slot table, 4 journal rings, 5 the newest superblock copy
 *         of the leg, 6 journal: the block a ring replays first, 7 any
 *         metadata byte (0 .. data_off)
 *         bits 3-4 leg: 0 leg 0, 1 leg 1, 2-3 both
 *         bit 5 seal: recompute the checksum of the structure hit
 *         (meta_sb_seal / meta_slot_seal / meta_jblock_seal /
 *         meta_dlog_seal for a block log page), so the
 *         fuzzer gets past the checksums into the logic
 *         bits 6-7 op: 0 overwrite, 1 xor, 2 add to a little-endian
 *         integer of len bytes (1, 2, 4, 8), 3 copy the same bytes from
 *         another image (an older or newer state)
 *   off   3 bytes, big-endian, modulo the region's size
 *   len   1 byte: ops 0 and 1 take len % 32 + 1 bytes, op 2 an integer of
 *         1 << (len % 4) bytes, op 3 copies 16 * len + 1 bytes
 *   data  the bytes (ops 0, 1) or the addend (op 2); for op 3 one byte
 *         naming the source: image (byte % NCUT), leg (bit 4)
 *
 * The data check is strict when every structure the mutations changed
 * fails its checksum afterwards (corruption the format can detect) or
 * lies in the write-intent page (which has none). When a changed
 * structure passes its check (sealed, a copy, or a checksum the fuzzer
 * matched), the metadata lies credibly: a slot can then claim another
 * extent's data and no reader could tell, so only crashes, hangs, leaks,
 * a refusal without a message and lost read-after-write are failures.
 *
 * The engine runs on two worker threads, started once per process.
 */
#include "tests/unit/cache_test_util.h"

#include "cache/cache_int.h" /* the set's tick, run on demand (extras bit 2) */
#include "cache/meta.h"
#include "common/log.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define LEG_SIZE (4u << 20)
#define BACK_SIZE (2u << 20)
#define EXT (64u << 10)
#define NSECT (BACK_SIZE / 512)
#define NCUT 12
#define NOPS 360
#define MAX_WRITES 1024
#define POST_SEQ 1000000u /* seqs of writes made after the open */

enum { DEV_BACK, DEV_LEG0, DEV_LEG1, NDEV };
static const uint64_t dev_size[NDEV] = { BACK_SIZE, LEG_SIZE, LEG_SIZE };

/* the workload: write or unmap number k (seq k for writes) */
struct wop {
	uint32_t lba, n;
	bool unmap;
	size_t start;   /* log index at submission: in an image cut at c iff start < c */
};
static struct wop wops[MAX_WRITES];
static uint32_t nwops;

static uint8_t *img[NCUT][NDEV];
static size_t cut_at[NCUT];
static uint8_t *work[NDEV];
static struct cache_layout lay;
static uint8_t *sector_buf;
static uint8_t fill_tpl[256][512]; /* a sector of seq's fill byte (stamp_fill) */
/* TC_FUZZ_META_STATS=1: how the inputs ended, printed at exit */
static _Atomic unsigned long st_runs, st_refused, st_vol_refused, st_opened, st_strict, st_reopened;

static const struct cache_set_cfg base_cfg = {
	.name = "meta", .nlegs = 2, .extent_size = EXT, .mode = CACHE_WRITE_BACK,
	.admit_hits = 1, .dirty_target = 10,
};

/* The oracle's own loops are not the code under test: keep them out of coverage and cmp tracing. */
#define ORACLE __attribute__((no_sanitize("coverage")))

#define DIE(...)                                      \
	do {                                          \
		fprintf(stderr, "fuzz_meta: " __VA_ARGS__); \
		fprintf(stderr, "\n");                \
		abort();                              \
	} while (0)

/* ---- building the images ---------------------------------------------------------- */

static int io(struct bdev *dev, enum bdev_op op, uint64_t off, void *buf, uint64_t len, int worker)
{
	struct tio t;
	tio_submit(&t, dev, op, off, buf, len, 0, NULL, worker);
	while (!atomic_load(&t.done))
		usleep(20);
	return t.err;
}

static void build_images(void)
{
	char err[512];
	uint8_t *init_back = malloc(BACK_SIZE);
	stamp_fill(init_back, 0, NSECT, 0);
	struct mem_bdev *d[NDEV] = { mem_new(0, BACK_SIZE, init_back), mem_new(1, LEG_SIZE, NULL),
				     mem_new(2, LEG_SIZE, NULL) };
	pthread_mutex_lock(&g_log.lock);
	g_log.on = true;
	pthread_mutex_unlock(&g_log.lock);
	struct bdev *legs[2] = { &d[DEV_LEG0]->dev, &d[DEV_LEG1]->dev };
	struct cache_set *cs = cache_set_open_devs(&base_cfg, legs, err, sizeof(err));
	if (!cs)
		DIE("cannot format the base set: %s", err);
	struct bdev *vol = cache_vol_open(cs, "lun0", &d[DEV_BACK]->dev, NULL, CACHE_WRITE_BACK, err, sizeof(err));
	if (!vol)
		DIE("cannot attach the base volume: %s", err);
	/* overwrites of dirty data go through the block log: the images hold records for recovery to parse */
	if (!cache_vol_guard_torn(vol, true))
		DIE("the base set has no block log");
	size_t first_cut = wlog_len();

	uint64_t rnd = 0x243f6a8885a308d3ull;
	uint8_t *buf = buf_get(EXT * 2);
	for (int op = 0; op < NOPS; op++) {
		uint64_t r = tc_xorshift(&rnd);
		unsigned kind = (unsigned)(r % 16);
		uint32_t lba, n;
		if (r >> 60 < 6) { /* aligned 4 KiB .. 64 KiB */
			n = 8u * (1 + (uint32_t)(tc_xorshift(&rnd) % 16));
			lba = (uint32_t)(tc_xorshift(&rnd) % (NSECT / 8)) * 8;
		} else {
			n = 1 + (uint32_t)(tc_xorshift(&rnd) % 160);
			lba = (uint32_t)(tc_xorshift(&rnd) % NSECT);
		}
		/* a hot quarter of the store gets most of the traffic: overwrites, slot reuse */
		if (r & (1ull << 40))
			lba %= NSECT / 4;
		if (lba + n > NSECT)
			n = NSECT - lba;
		int w = (int)(op % 2);
		if (kind < 9 || kind == 15) {
			uint32_t k = ++nwops;
			if (k >= MAX_WRITES)
				DIE("workload too long");
			stamp_fill(buf, lba, n, k);
			wops[k] = (struct wop){ lba, n, false, wlog_len() };
			if (io(vol, BDEV_WRITE, (uint64_t)lba * 512, buf, (uint64_t)n * 512, w))
				DIE("base workload: write failed");
		} else if (kind < 14) {
			if (io(vol, BDEV_READ, (uint64_t)lba * 512, buf, (uint64_t)n * 512, w))
				DIE("base workload: read failed");
		} else {
			uint32_t k = ++nwops;
			wops[k] = (struct wop){ lba, n, true, wlog_len() };
			if (io(vol, BDEV_UNMAP, (uint64_t)lba * 512, NULL, (uint64_t)n * 512, w))
				DIE("base workload: unmap failed");
		}
		if (op == NOPS / 2)
			cache_set_flush(cs, 5000); /* destage: clean slots, evictions, reuse after */
	}
	size_t last = wlog_len();
	/* cuts: spread over the workload, a few just after it (the journal not yet checkpointed) */
	uint64_t cr = 0x13198a2e03707344ull;
	for (int c = 0; c < NCUT - 2; c++)
		cut_at[c] = first_cut + (size_t)(tc_xorshift(&cr) % (last - first_cut));
	cut_at[NCUT - 2] = last;
	cache_set_shutdown(cs);
	cut_at[NCUT - 1] = wlog_len();
	uint8_t *zero = calloc(1, LEG_SIZE); /* the legs before the log began */
	for (int c = 0; c < NCUT; c++)
		for (int i = 0; i < NDEV; i++) {
			img[c][i] = malloc(dev_size[i]);
			wlog_image(i, i == DEV_BACK ? init_back : zero, dev_size[i], cut_at[c], img[c][i]);
		}
	free(zero);
	bdev_close(vol);
	cache_set_close(cs);
	wlog_reset(&g_log);
	buf_put(buf, EXT * 2);
	free(init_back);
}

static void print_stats(void)
{
	fprintf(stderr, "fuzz_meta: %lu inputs: %lu refused at open, %lu volumes refused, %lu opened (%lu with the "
		"strict data check), %lu opened again after a clean shutdown\n", st_runs, st_refused, st_vol_refused,
		st_opened, st_strict, st_reopened);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	if (getenv("TC_FUZZ_META_STATS"))
		atexit(print_stats);
	log_set_level((enum log_level)0); /* millions of recoveries: their log says nothing new */
	if (workers_start(2) < 0) {
		fprintf(stderr, "fuzz_meta: cannot start workers\n");
		exit(1);
	}
	if (meta_layout(LEG_SIZE, EXT, CACHE_VERSION, &lay) < 0)
		DIE("no layout");
	build_images();
	for (int i = 0; i < NDEV; i++)
		work[i] = malloc(dev_size[i]);
	sector_buf = buf_get(BACK_SIZE);
	for (int i = 0; i < 256; i++)
		memset(fill_tpl[i], i, 512);
	return 0;
}

/* ---- mutations -------------------------------------------------------------------------- */

static uint64_t region_base(int region, const uint8_t *leg, uint64_t *size)
{
	switch (region) {
	case 0: *size = CACHE_PAGE; return 0;
	case 1: *size = CACHE_PAGE; return CACHE_PAGE;
	case 2: *size = CACHE_PAGE; return CACHE_WI_OFF;
	case 3: *size = lay.journal_off - lay.table_off; return lay.table_off;
	case 4: *size = (uint64_t)lay.jblocks * CACHE_NJOURNALS * CACHE_PAGE; return lay.journal_off;
	case 5: {
		const struct cache_sb_disk *a = (const void *)leg, *b = (const void *)(leg + CACHE_PAGE);
		*size = CACHE_PAGE;
		return le64_get(b->gen) > le64_get(a->gen) ? CACHE_PAGE : 0;
	}
	case 6: /* the block ring j's replay starts at (offset / 4096 picks j): apply() */
		*size = (uint64_t)CACHE_NJOURNALS * CACHE_PAGE;
		return 0;
	default: *size = lay.data_off; return 0;
	}
}

/* Reseal whatever structure holds leg offset off. */
static void seal_at(uint8_t *leg, uint64_t off)
{
	if (off < 2 * CACHE_PAGE) {
		meta_sb_seal((struct cache_sb_disk *)(leg + off / CACHE_PAGE * CACHE_PAGE));
	} else if (off >= lay.table_off && off < lay.table_off + (uint64_t)lay.nslots * lay.rec_size) {
		uint64_t r = (off - lay.table_off) / lay.rec_size;
		meta_slot_seal(leg + lay.table_off + r * lay.rec_size, lay.rec_size);
	} else if (off >= lay.journal_off && off < lay.journal_off + (uint64_t)lay.jblocks * CACHE_NJOURNALS * CACHE_PAGE) {
		uint64_t b = (off - lay.journal_off) / CACHE_PAGE;
		meta_jblock_seal((struct cache_jblock_disk *)(leg + lay.journal_off + b * CACHE_PAGE));
	} else if (lay.dlog_pages && off >= lay.dlog_off &&
		   off < lay.dlog_off + (uint64_t)lay.dlog_pages * CACHE_DLOG_RINGS * CACHE_PAGE) {
		/* a block log header page (a data page resealed as one is refused by its checks) */
		uint64_t p = (off - lay.dlog_off) / CACHE_PAGE;
		meta_dlog_seal((struct cache_dlog_disk *)(leg + lay.dlog_off + p * CACHE_PAGE));
	}
}

static uint64_t ring_start(const uint8_t *leg, uint32_t j)
{
	const struct cache_sb_disk *a = (const void *)leg, *b = (const void *)(leg + CACHE_PAGE);
	const struct cache_sb_disk *sb = le64_get(b->gen) > le64_get(a->gen) ? b : a;
	uint64_t pos = le64_get(sb->jtail[j % CACHE_NJOURNALS]);
	return lay.journal_off + ((uint64_t)(j % CACHE_NJOURNALS) * lay.jblocks + pos % lay.jblocks) * CACHE_PAGE;
}

/* Apply the records; returns bytes consumed, 0 at the end. */
static size_t apply(const uint8_t *p, size_t left)
{
	if (left < 5)
		return 0;
	uint8_t hdr = p[0];
	int region = hdr & 7, legsel = (hdr >> 3) & 3, op = hdr >> 6;
	bool seal = hdr & 0x20;
	uint32_t off24 = (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
	size_t len = op == 3 ? (size_t)p[4] * 16 + 1 : (size_t)(p[4] % 32) + 1;
	if (op == 2)
		len = (size_t)1 << (p[4] % 4);
	size_t used = 5 + (op == 3 ? 1 : len);
	if (used > left)
		return 0;
	const uint8_t *arg = p + 5;
	for (int l = 0; l < 2; l++) {
		if (legsel < 2 && legsel != l)
			continue;
		uint8_t *leg = work[DEV_LEG0 + l];
		uint64_t size, base = region_base(region, leg, &size);
		uint64_t off = base + off24 % size;
		if (region == 6)
			off = ring_start(leg, (uint32_t)(off % size) / CACHE_PAGE) + off24 % CACHE_PAGE;
		if (off >= lay.data_off)
			continue;
		if (off + len > lay.data_off)
			len = lay.data_off - off;
		switch (op) {
		case 0:
			memcpy(leg + off, arg, len);
			break;
		case 1:
			for (size_t i = 0; i < len; i++)
				leg[off + i] ^= arg[i];
			break;
		case 2: {
			uint64_t v = 0, a = 0;
			for (size_t i = 0; i < len; i++) {
				v |= (uint64_t)leg[off + i] << (8 * i);
				a |= (uint64_t)arg[i] << (8 * i);
			}
			v += a;
			for (size_t i = 0; i < len; i++)
				leg[off + i] = (uint8_t)(v >> (8 * i));
			break;
		}
		case 3: {
			const uint8_t *src = img[arg[0] % NCUT][DEV_LEG0 + ((arg[0] >> 4) & 1)];
			memcpy(leg + off, src + off, len);
			break;
		}
		}
		if (seal)
			seal_at(leg, off);
	}
	return used;
}

/* Does a structure differ from the image and still pass its check? (a credible lie) */
ORACLE static bool forged(int cut)
{
	for (int l = 0; l < 2; l++) {
		const uint8_t *w = work[DEV_LEG0 + l], *o = img[cut][DEV_LEG0 + l];
		for (int k = 0; k < 2; k++) {
			const char *why;
			if (memcmp(w + k * CACHE_PAGE, o + k * CACHE_PAGE, CACHE_PAGE) &&
			    meta_sb_check((const void *)(w + k * CACHE_PAGE), &why) == 0)
				return true;
		}
		for (uint32_t s = 0; s < lay.nslots; s++) {
			uint64_t off = lay.table_off + (uint64_t)s * lay.rec_size;
			if (memcmp(w + off, o + off, lay.rec_size) && meta_slot_ok(w + off, lay.rec_size))
				return true;
		}
		for (uint64_t off = lay.journal_off; off < lay.journal_off + (uint64_t)lay.jblocks * CACHE_NJOURNALS *
								CACHE_PAGE; off += CACHE_PAGE) {
			if (!memcmp(w + off, o + off, CACHE_PAGE))
				continue;
			struct cache_jblock_disk b;
			memcpy(&b, w + off, sizeof(b));
			uint32_t crc = le32_get(b.crc);
			b.crc = le32_of(0);
			if (le32_get(b.magic) == JBLOCK_MAGIC && meta_crc(&b, sizeof(b)) == crc)
				return true;
		}
		/* a block log header page that changed and still passes (its data's checksum is checked later) */
		for (uint32_t r = 0; r < CACHE_DLOG_RINGS; r++)
			for (uint32_t at = 0; at < lay.dlog_pages; at++) {
				uint64_t off = lay.dlog_off + ((uint64_t)r * lay.dlog_pages + at) * CACHE_PAGE;
				if (memcmp(w + off, o + off, CACHE_PAGE) &&
				    meta_dlog_ok((const void *)(w + off), ((const struct cache_sb_disk *)o)->set_uuid, r, at,
						 lay.dlog_pages))
					return true;
			}
	}
	return false;
}

/* ---- the check ---------------------------------------------------------------------------- */

struct post {
	uint32_t lba, n;
	uint32_t seq;
	bool acked;
};

/* Is seq a version of lba that some write put there before the image was cut? */
ORACLE static bool allowed(uint32_t lba, uint64_t seq, size_t cut)
{
	if (seq == 0)
		return true; /* the backing store's initial content */
	if (seq > nwops || wops[seq].unmap || wops[seq].start >= cut)
		return false;
	return lba >= wops[seq].lba && lba < wops[seq].lba + wops[seq].n;
}

ORACLE static bool zero_allowed(uint32_t lba, size_t cut)
{
	for (uint32_t k = 1; k <= nwops; k++)
		if (wops[k].unmap && wops[k].start < cut && lba >= wops[k].lba && lba < wops[k].lba + wops[k].n)
			return true;
	return false;
}

/* stamp_check's answer (0 zeroes, 1 a stamp of lba, -1 anything else), with memcmp against templates */
ORACLE static int fast_stamp_check(const uint8_t *s, uint64_t lba, uint64_t *seq)
{
	static const uint8_t zero[512];
	struct stamp st;
	memcpy(&st, s, sizeof(st));
	if (st.lba == 0 && st.seq == 0 && !memcmp(s, zero, 512))
		return 0;
	if (st.lba != lba || st.crc != stamp_crc(lba, st.seq) ||
	    memcmp(s + sizeof(st), fill_tpl[st.seq & 0xff] + sizeof(st), 512 - sizeof(st)))
		return -1;
	*seq = st.seq;
	return 1;
}

ORACLE static void check_sector(const uint8_t *s, uint32_t lba, size_t cut, bool strict, const struct post *posts,
			 int nposts, const char *when)
{
	uint64_t seq = 0;
	int k = fast_stamp_check(s, lba, &seq);
	/* writes after the open covering lba: the newest acknowledged one, or one after it */
	int ia = -1;
	bool match = false;
	for (int i = 0; i < nposts; i++)
		if (lba >= posts[i].lba && lba < posts[i].lba + posts[i].n && posts[i].acked)
			ia = i;
	for (int i = ia < 0 ? 0 : ia; i < nposts; i++)
		if (lba >= posts[i].lba && lba < posts[i].lba + posts[i].n && k == 1 && seq == posts[i].seq)
			match = true;
	if (ia >= 0 && !match)
		DIE("%s: lba %u: an acknowledged write (seq %u) after the open does not read back: %s seq %llu",
		    when, lba, posts[ia].seq, k == 1 ? "stamp" : k == 0 ? "zeroes" : "garbage",
		    (unsigned long long)seq);
	if (match || !strict)
		return;
	if (k == 0) {
		if (!zero_allowed(lba, cut))
			DIE("%s: lba %u reads zeroes, never written or unmapped there", when, lba);
	} else if (k < 0) {
		struct stamp st;
		memcpy(&st, s, sizeof(st));
		DIE("%s: lba %u reads garbage or another LBA's data (stamp says lba %llu seq %llu)", when, lba,
		    (unsigned long long)st.lba, (unsigned long long)st.seq);
	} else if (!allowed(lba, seq, cut)) {
		DIE("%s: lba %u reads seq %llu, which was never written there before the cut", when, lba,
		    (unsigned long long)seq);
	}
}

/* Read the whole volume in pieces; check what each successful read returns. */
ORACLE static void read_all(struct bdev *vol, size_t cut, bool strict, const struct post *posts, int nposts,
		     const char *when)
{
	const uint32_t chunk = 256;   /* sectors: 128 KiB, two extents */
	for (uint32_t lba = 0; lba < NSECT; lba += chunk) {
		uint8_t *b = sector_buf + (size_t)lba * 512;
		if (tio_sync(vol, BDEV_READ, (uint64_t)lba * 512, b, (uint64_t)chunk * 512, 0) != 0)
			continue;
		for (uint32_t i = 0; i < chunk; i++)
			check_sector(b + (size_t)i * 512, lba + i, cut, strict, posts, nposts, when);
	}
}

struct opened {
	struct cache_set *cs;
	struct bdev *vol;
	struct mem_bdev *leg[2];  /* by image: leg[0] holds work[DEV_LEG0] (NULL: not opened) */
};

/* Open the set on the work images (borrowed: the devices write them in place). */
static bool open_set(uint8_t variant, struct opened *o, char *err, size_t errlen, bool *refused)
{
	struct cache_set_cfg cfg = base_cfg;
	cfg.admit_hits = 1000; /* the read pass promotes nothing: no fills to wait for at shutdown */
	struct mem_bdev *leg[2] = { mem_borrow(1, LEG_SIZE, work[DEV_LEG0]), mem_borrow(2, LEG_SIZE, work[DEV_LEG1]) };
	struct bdev *legs[2] = { &leg[0]->dev, &leg[1]->dev };
	if (variant & 1) {
		legs[0] = &leg[1]->dev;
		legs[1] = &leg[0]->dev;
	}
	o->leg[0] = leg[0];
	o->leg[1] = leg[1];
	if (variant & 2) { /* one leg, the other lost */
		cfg.nlegs = 1;
		cfg.allow_single_leg = true;
		o->leg[(variant & 1) ? 0 : 1] = NULL;
		bdev_close(legs[1]);
	}
	cfg.legs[0] = legs[0]->name;
	cfg.legs[1] = cfg.nlegs > 1 ? legs[1]->name : NULL;
	err[0] = 0;
	*refused = false;
	o->vol = NULL;
	o->cs = cache_set_open_devs(&cfg, legs, err, errlen);
	if (!o->cs) {
		if (!err[0])
			DIE("the set was refused without a message");
		*refused = true;
		st_refused++;
		if (getenv("TC_FUZZ_META_STATS"))
			fprintf(stderr, "fuzz_meta: refused: %s\n", err);
		return false;
	}
	struct mem_bdev *back = mem_borrow(0, BACK_SIZE, work[DEV_BACK]);
	err[0] = 0;
	o->vol = cache_vol_open(o->cs, "lun0", &back->dev, NULL, CACHE_WRITE_BACK, err, errlen);
	if (!o->vol) {
		if (!err[0])
			DIE("the volume was refused without a message");
		st_vol_refused++;
		bdev_close(&back->dev);
		cache_set_shutdown(o->cs);
		cache_set_close(o->cs);
		o->cs = NULL;
		return false;
	}
	st_opened++;
	return true;
}

struct tick_run {
	struct cache_set *cs;
	_Atomic bool done;
};

static void tick_on_worker(void *arg)
{
	struct tick_run *t = arg;
	t->cs->tick.fn(&t->cs->tick);
	atomic_store(&t->done, true);
}

/*
 * What a second of the daemon's life would do, now: the set's tick on
 * worker 0 (reclaim, cleaner, write-intent clearing) a few times, the
 * cleaner unthrottled, then wait a little for the destages it started.
 */
static void run_ticks(struct cache_set *cs, int n)
{
	atomic_fetch_add(&cs->flush_req, 1);
	for (int i = 0; i < n; i++) {
		struct tick_run t = { cs, false };
		worker_post(worker_get(0), tick_on_worker, &t);
		while (!atomic_load(&t.done))
			usleep(20);
		for (int k = 0; k < 200; k++) { /* 10-20 ms: with no leg left a destage can stay busy far longer */
			uint64_t rate, busy;
			cleaner_stats(cs->cleaner, &rate, &busy);
			if (!busy)
				break;
			usleep(50);
		}
	}
	atomic_fetch_sub(&cs->flush_req, 1);
}

static int close_set(struct opened *o)
{
	int r = cache_set_shutdown(o->cs);
	bdev_close(o->vol);
	cache_set_close(o->cs);
	o->cs = NULL;
	return r;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char err[1024];
	if (size < 2)
		return 0;
	st_runs++;
	int cut = data[0] % NCUT;
	uint8_t variant = (uint8_t)(data[0] / NCUT);
	uint8_t extras = data[1];
	for (int i = 0; i < NDEV; i++)
		memcpy(work[i], img[cut][i], dev_size[i]);
	const uint8_t *p = data + 2;
	size_t left = size - 2, n;
	/* extras bit 0: the last 12 bytes (or fewer) are the writes after the open, 3 bytes each */
	const uint8_t *wp = p + left;
	size_t wleft = 0;
	if (extras & 1) {
		wleft = left < 12 ? left : 12;
		left -= wleft;
		wp = p + left;
	}
	int nmut = 0;
	while (nmut < 64 && (n = apply(p, left)) > 0) {
		p += n;
		left -= n;
		nmut++;
	}
	bool strict = !forged(cut);
	st_strict += strict;

	struct opened o;
	bool refused;
	if (!open_set(variant, &o, err, sizeof(err), &refused))
		return 0;
	struct post posts[4];
	int nposts = 0;
	read_all(o.vol, cut_at[cut], strict, NULL, 0, "after the open");
	if (extras & 8) {
		/* a leg (bit 4: the other one; bit 5: both) fails every I/O from now on */
		for (int l = 0; l < 2; l++)
			if (o.leg[l] && ((extras & 0x20) || l == ((extras >> 4) & 1)))
				atomic_store(&o.leg[l]->fail_after, 0);
	}

	if (extras & 1) {
		/* writes after recovery: allocation from the recovered free list, overwrites */
		uint8_t *b = buf_get(EXT * 2);
		for (int i = 0; i < 4 && wleft >= 3; i++) {
			uint32_t lba = ((uint32_t)wp[0] << 8 | wp[1]) % NSECT, cnt = 1 + wp[2] % 128;
			wp += 3;
			wleft -= 3;
			if (lba + cnt > NSECT)
				cnt = NSECT - lba;
			posts[nposts] = (struct post){ lba, cnt, POST_SEQ + (uint32_t)nposts, false };
			stamp_fill(b, lba, cnt, posts[nposts].seq);
			posts[nposts].acked = tio_sync(o.vol, BDEV_WRITE, (uint64_t)lba * 512, b, (uint64_t)cnt * 512, 0) == 0;
			nposts++;
		}
		buf_put(b, EXT * 2);
		read_all(o.vol, cut_at[cut], strict, posts, nposts, "after writes following the open");
	}
	if (extras & 4) {
		/* destage what recovery found dirty, evict, clear intent bits: then read again */
		run_ticks(o.cs, 3);
		read_all(o.vol, cut_at[cut], strict, posts, nposts, "after the cleaner ran");
	}
	int sd = close_set(&o);
	if ((extras & 2) && sd == 0) {
		/* shut down cleanly: it must open again, and serve the same versions */
		if (!open_set(variant, &o, err, sizeof(err), &refused))
			DIE("a set that opened and shut down cleanly is refused: %s", err);
		st_reopened++;
		read_all(o.vol, cut_at[cut], strict, posts, nposts, "after a clean shutdown and a new open");
		close_set(&o);
	}
	return 0;
}
