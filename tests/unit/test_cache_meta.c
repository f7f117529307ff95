/*
 * test_cache_meta.c - on-disk formats and recovery.
 *
 * Formats: little-endian helpers round-trip; layouts fit their legs;
 * superblocks, slot records and journal blocks pass their checks when sealed
 * and are rejected after a single flipped bit, a wrong position or another
 * set's UUID.
 *
 * Recovery (RAM devices): data written in write-back mode reads back
 * after a clean restart (from the checkpointed table, no journal records)
 * and after an unclean one (journal replay), with hits served at once; the
 * set refuses a leg from another set, a corrupt superblock, a changed
 * extent size and a different backing store, each with a sentence naming
 * the fix.
 */
#include "cache/meta.h"
#include "cache/status.h"
#include "tests/unit/cache_test_util.h"

static void test_le(void)
{
	le64 a = le64_of(0x0102030405060708ull);
	REQUIRE(a.b[0] == 8 && a.b[7] == 1 && le64_get(a) == 0x0102030405060708ull, "le64");
	le32 b = le32_of(0xdeadbeef);
	REQUIRE(b.b[0] == 0xef && le32_get(b) == 0xdeadbeef, "le32");
	REQUIRE(le16_get(le16_of(0xbeef)) == 0xbeef, "le16");
	printf("ok: little-endian helpers\n");
}

static void test_layout(void)
{
	uint32_t exts[] = { 64u << 10, 256u << 10, 1u << 20, 4u << 20 };
	uint64_t sizes[] = { 16ull << 20, 256ull << 20, 10ull << 30, 1ull << 40 };
	for (int i = 0; i < 4; i++)
		for (int j = 0; j < 4; j++) {
			struct cache_layout l, old;
			if (meta_layout(sizes[j], exts[i], CACHE_VERSION, &l) < 0) {
				REQUIRE(sizes[j] < 64ull << 20, "layout refused for %llu / %u", (unsigned long long)sizes[j], exts[i]);
				continue;
			}
			REQUIRE(l.table_off >= 2 * CACHE_PAGE, "table after superblocks");
			REQUIRE(l.journal_off >= l.table_off + (uint64_t)l.nslots * l.rec_size, "journal after table");
			REQUIRE(l.dlog_off >= l.journal_off + (uint64_t)l.jblocks * CACHE_NJOURNALS * CACHE_PAGE,
			      "block log after journal");
			REQUIRE(l.dlog_pages >= 2 * (exts[i] / CACHE_PAGE + 1), "a ring holds two whole-extent records");
			REQUIRE(l.data_off >= l.dlog_off + (uint64_t)l.dlog_pages * CACHE_DLOG_RINGS * CACHE_PAGE,
			      "data after block log");
			/* version 2: the layout it always had, no block log */
			REQUIRE(meta_layout(sizes[j], exts[i], CACHE_VERSION_V2, &old) == 0 && !old.dlog_pages &&
				!old.dlog_off && old.journal_off == old.table_off +
				(((uint64_t)old.nslots * old.rec_size + CACHE_PAGE - 1) / CACHE_PAGE * CACHE_PAGE) &&
				old.data_off >= old.journal_off + (uint64_t)old.jblocks * CACHE_NJOURNALS * CACHE_PAGE &&
				old.nslots >= l.nslots, "version 2 layout");
			REQUIRE(l.data_off % exts[i] == 0 && l.data_off + (uint64_t)l.nslots * exts[i] <= sizes[j],
			      "slots aligned and inside the leg");
			REQUIRE(l.rec_size >= 32 + l.bpe / 4 && CACHE_PAGE % l.rec_size == 0, "record holds both bitmaps");
			REQUIRE(l.nslots > (sizes[j] / exts[i]) * 8 / 10 || sizes[j] < (1ull << 30),
			      "metadata costs under 20%% of a large leg");
		}
	printf("ok: layouts for 64K..4M extents and 16M..1T legs\n");
}

static void test_checksums(void)
{
	static struct cache_sb_disk sb;
	memset(&sb, 0, sizeof(sb));
	sb.magic = le64_of(CACHE_MAGIC);
	sb.version = le32_of(CACHE_VERSION);
	sb.gen = le64_of(42);
	meta_sb_seal(&sb);
	const char *why = NULL;
	REQUIRE(meta_sb_check(&sb, &why) == 0, "sealed superblock accepted");
	for (size_t bit = 0; bit < sizeof(sb) * 8; bit += 997) {
		((uint8_t *)&sb)[bit / 8] ^= (uint8_t)(1u << (bit % 8));
		REQUIRE(meta_sb_check(&sb, &why) < 0, "flipped bit %zu accepted", bit);
		((uint8_t *)&sb)[bit / 8] ^= (uint8_t)(1u << (bit % 8));
	}
	REQUIRE(meta_sb_check(&sb, &why) == 0, "restored superblock accepted");
	sb.magic = le64_of(1);
	REQUIRE(meta_sb_check(&sb, &why) < 0 && strstr(why, "no tiercache superblock"), "wrong magic: %s", why);

	uint8_t rec[256] = { 0 };
	((struct cache_slot_disk *)rec)->key = le64_of((1ull << 40) | 77);
	rec[100] = 0x5a;
	meta_slot_seal(rec, sizeof(rec));
	REQUIRE(meta_slot_ok(rec, sizeof(rec)), "sealed slot record accepted");
	rec[200] ^= 4;
	REQUIRE(!meta_slot_ok(rec, sizeof(rec)), "corrupt slot record rejected");

	static struct cache_jblock_disk jb;
	uint8_t uuid[8] = { 1, 2, 3, 4, 5, 6, 7, 8 }, other[8] = { 9 };
	memset(&jb, 0, sizeof(jb));
	memcpy(jb.set_uuid8, uuid, 8);
	jb.pos = le64_of(1000);
	jb.nrec = le32_of(2);
	jb.rec[1].seq = le64_of(99);
	meta_jblock_seal(&jb);
	REQUIRE(meta_jblock_ok(&jb, uuid, 1000), "journal block accepted at its position");
	REQUIRE(!meta_jblock_ok(&jb, uuid, 1000 + 512), "a block from an older lap of the ring is rejected");
	REQUIRE(!meta_jblock_ok(&jb, other, 1000), "a block of another set is rejected");
	jb.rec[1].seq = le64_of(98);
	REQUIRE(!meta_jblock_ok(&jb, uuid, 1000), "a torn journal block is rejected");
	printf("ok: checksums reject flipped bits, stale ring laps and other sets\n");
}

/* ---- recovery with RAM devices ---- */

#define BACK (4u << 20)
#define LEG (8u << 20)

static struct cache_set_cfg cfg = {
	.name = "rec", .nlegs = 2, .extent_size = 64u << 10, .mode = CACHE_WRITE_BACK, .admit_hits = 1,
	.dirty_target = 50,
};

static uint8_t *img[3];

static void save(struct mem_bdev *b, struct mem_bdev *l0, struct mem_bdev *l1)
{
	for (int i = 0; i < 3; i++)
		if (!img[i])
			img[i] = malloc(i ? LEG : BACK);
	memcpy(img[0], b->data, BACK);
	memcpy(img[1], l0->data, LEG);
	memcpy(img[2], l1->data, LEG);
}

static struct cache_set *reopen(struct mem_bdev **b, struct mem_bdev **l0, struct mem_bdev **l1, char *err,
				size_t errlen)
{
	*b = mem_new(0, BACK, img[0]);
	*l0 = mem_new(1, LEG, img[1]);
	*l1 = mem_new(2, LEG, img[2]);
	struct bdev *legs[2] = { &(*l0)->dev, &(*l1)->dev };
	return cache_set_open_devs(&cfg, legs, err, errlen);
}

static void read_check(struct bdev *vol, uint64_t off, uint8_t pat, uint64_t len)
{
	uint8_t *buf = buf_get(len);
	REQUIRE(tio_sync(vol, BDEV_READ, off, buf, len, 0) == 0, "read");
	for (uint64_t i = 0; i < len; i++)
		REQUIRE(buf[i] == pat, "byte %llu is %02x, wanted %02x", (unsigned long long)(off + i), buf[i], pat);
	buf_put(buf, len);
}

static void test_recovery(void)
{
	char err[1024];
	struct mem_bdev *b = mem_new(0, BACK, NULL), *l0 = mem_new(1, LEG, NULL), *l1 = mem_new(2, LEG, NULL);
	struct bdev *legs[2] = { &l0->dev, &l1->dev };
	struct cache_set *cs = cache_set_open_devs(&cfg, legs, err, sizeof(err));
	REQUIRE(cs, "format: %s", err);
	struct bdev *vol = cache_vol_open(cs, "lun0", &b->dev, NULL, CACHE_WRITE_BACK, err, sizeof(err));
	REQUIRE(vol, "attach: %s", err);
	uint8_t *w = buf_get(64u << 10);
	memset(w, 0xa1, 64u << 10);
	REQUIRE(tio_sync(vol, BDEV_WRITE, 0, w, 64u << 10, BDEV_F_FUA) == 0, "write");
	memset(w, 0xb2, 4096);
	REQUIRE(tio_sync(vol, BDEV_WRITE, 1u << 20, w, 4096, BDEV_F_FUA) == 0, "write");
	REQUIRE(b->data[0] == 0 && b->data[1u << 20] == 0, "write-back: the backing store is untouched");

	/* clean stop, then restart: hits at once from the checkpointed table */
	cache_set_shutdown(cs);
	save(b, l0, l1);
	bdev_close(vol);
	cache_set_close(cs);
	cs = reopen(&b, &l0, &l1, err, sizeof(err));
	REQUIRE(cs, "reopen: %s", err);
	vol = cache_vol_open(cs, "lun0", &b->dev, NULL, CACHE_WRITE_BACK, err, sizeof(err));
	REQUIRE(vol, "attach: %s", err);
	read_check(vol, 0, 0xa1, 64u << 10);
	read_check(vol, 1u << 20, 0xb2, 4096);
	read_check(vol, (1u << 20) + 4096, 0, 4096);
	struct cache_set_status st;
	cache_set_status(cs, &st);
	REQUIRE(st.read_hits >= 1 && st.read_partial >= 1, "served from the cache after restart (hits %llu, partial %llu)",
	      (unsigned long long)st.read_hits, (unsigned long long)st.read_partial);
	printf("ok: clean restart: data and hits from the checkpointed table\n");

	/* more writes, then a "crash": images taken without shutdown */
	memset(w, 0xc3, 8192);
	REQUIRE(tio_sync(vol, BDEV_WRITE, 2u << 20, w, 8192, BDEV_F_FUA) == 0, "write");
	memset(w, 0xd4, 512);
	REQUIRE(tio_sync(vol, BDEV_WRITE, 512, w, 512, BDEV_F_FUA) == 0, "overwrite one sector");
	usleep(100000);
	save(b, l0, l1);
	struct bdev *oldvol = vol;
	struct cache_set *old = cs;
	cs = reopen(&b, &l0, &l1, err, sizeof(err));
	REQUIRE(cs, "recover: %s", err);
	vol = cache_vol_open(cs, "lun0", &b->dev, NULL, CACHE_WRITE_BACK, err, sizeof(err));
	REQUIRE(vol, "attach: %s", err);
	read_check(vol, 0, 0xa1, 512);
	read_check(vol, 512, 0xd4, 512);
	read_check(vol, 1024, 0xa1, (64u << 10) - 1024);
	read_check(vol, 2u << 20, 0xc3, 8192);
	printf("ok: unclean restart: journal replayed, every acknowledged write back\n");
	cache_set_shutdown(cs);
	save(b, l0, l1);
	bdev_close(vol);
	cache_set_close(cs);
	cache_set_shutdown(old);
	bdev_close(oldvol);
	cache_set_close(old);

	/* refusals */
	uint8_t *keep1 = malloc(LEG);
	memcpy(keep1, img[1], LEG);
	img[1][100] ^= 1; /* copy A */
	img[1][4096 + 100] ^= 1; /* copy B */
	cs = reopen(&b, &l0, &l1, err, sizeof(err));
	REQUIRE(!cs && strstr(err, "checksum mismatch") && strstr(err, "zero its first 8 KiB"),
	      "corrupt superblock refused: %s", err);
	bdev_close(&b->dev); /* a refused set closed its legs; the backing store is ours */
	memcpy(img[1], keep1, LEG);

	cfg.extent_size = 256u << 10;
	cs = reopen(&b, &l0, &l1, err, sizeof(err));
	REQUIRE(!cs && strstr(err, "formatted with extent = 64K") && strstr(err, "set extent = 64K"),
	      "changed extent refused: %s", err);
	bdev_close(&b->dev);
	cfg.extent_size = 64u << 10;

	/* a leg of another set */
	struct mem_bdev *o0 = mem_new(1, LEG, NULL), *o1 = mem_new(2, LEG, NULL);
	struct bdev *olegs[2] = { &o0->dev, &o1->dev };
	struct cache_set_cfg ocfg = cfg;
	ocfg.name = "other";
	struct cache_set *ocs = cache_set_open_devs(&ocfg, olegs, err, sizeof(err));
	REQUIRE(ocs, "other set: %s", err);
	cache_set_shutdown(ocs);
	uint8_t *keep2 = malloc(LEG);
	memcpy(keep2, img[2], LEG);
	memcpy(img[2], o1->data, LEG);
	cache_set_close(ocs);
	cs = reopen(&b, &l0, &l1, err, sizeof(err));
	REQUIRE(!cs && strstr(err, "belongs to another cache set") && strstr(err, "other"),
	      "foreign leg refused: %s", err);
	bdev_close(&b->dev);
	memcpy(img[2], keep2, LEG);
	free(keep2);
	free(keep1);

	/* a different backing store for the LUN */
	cs = reopen(&b, &l0, &l1, err, sizeof(err));
	REQUIRE(cs, "reopen: %s", err);
	struct mem_bdev *small = mem_new(0, BACK / 2, NULL);
	vol = cache_vol_open(cs, "lun0", &small->dev, NULL, CACHE_WRITE_BACK, err, sizeof(err));
	REQUIRE(!vol && strstr(err, "is not the one this cache holds data for") && strstr(err, "put the original"),
	      "other backing store refused: %s", err);
	bdev_close(&small->dev);
	bdev_close(&b->dev);
	cache_set_shutdown(cs);
	cache_set_close(cs);
	buf_put(w, 64u << 10);
	printf("ok: refused: corrupt superblock, changed extent, foreign leg, other backing store\n");
}

int main(void)
{
	test_le();
	test_layout();
	test_checksums();
	REQUIRE(workers_start(getenv("TC_TEST_WORKERS") ? (unsigned)atoi(getenv("TC_TEST_WORKERS")) : 2) == 0, "workers");
	test_recovery();
	workers_stop();
	return 0;
}
