/*
 * test_cache_journal_full.c - a journal ring that fills waits for the
 * checkpoint, is counted, and loses nothing.
 *
 * The slot table's area of both legs is made slow, so the checkpoint asked
 * for at half a ring keeps writing its table pages while QD1 write-back
 * writes, each a new block and so each with its own journal block, go on.
 * The worker's rings fill; their writes must wait (not overwrite blocks a
 * recovery still needs), status must count the wait (journal_full_waits)
 * and the checkpoint (checkpoints), and once the table is written the
 * writes must complete and read back as written, also after a reopen.
 */
#include "cache/cache_int.h" /* the layout: where the table is */
#include "tests/unit/cache_test_util.h"

#define LEG_SIZE (64u << 20)    /* a 2 MiB journal: 16 rings of 32 blocks */
#define BACK_SIZE (16u << 20)
#define EXT (64u << 10)
#define NWRITES 2048            /* 4 KiB each, every one a new block: a record each */
#define TABLE_HOPS 20000        /* re-posts per table page write of the checkpoint */

static struct cache_set_cfg cfg = {
	.name = "jf", .nlegs = 2, .extent_size = EXT, .mode = CACHE_WRITE_BACK, .admit_hits = 1, .dirty_target = 90,
};

static struct cache_set *open_set(struct mem_bdev **d, struct bdev **vol, uint8_t *const img[3])
{
	char err[512];
	uint64_t sizes[3] = { BACK_SIZE, LEG_SIZE, LEG_SIZE };
	for (int i = 0; i < 3; i++)
		d[i] = mem_borrow(i, sizes[i], img[i]);
	struct bdev *legs[2] = { &d[1]->dev, &d[2]->dev };
	struct cache_set *cs = cache_set_open_devs(&cfg, legs, err, sizeof(err));
	REQUIRE(cs, "open: %s", err);
	*vol = cache_vol_open(cs, "lun0", &d[0]->dev, NULL, CACHE_WRITE_BACK, err, sizeof(err));
	REQUIRE(*vol, "attach: %s", err);
	return cs;
}

static void fill(uint8_t *b, uint32_t i)
{
	for (uint32_t k = 0; k < 4096; k += 4)
		memcpy(b + k, &(uint32_t){ i * 2654435761u ^ k }, 4);
}

static void check_all(struct bdev *vol, const char *when)
{
	uint8_t *buf = buf_get(4096), *want = buf_get(4096);
	for (uint32_t i = 0; i < NWRITES; i++) {
		REQUIRE(tio_sync(vol, BDEV_READ, (uint64_t)i * 4096, buf, 4096, 0) == 0, "%s: read %u", when, i);
		fill(want, i);
		REQUIRE(memcmp(buf, want, 4096) == 0, "%s: block %u does not read back as written", when, i);
	}
	buf_put(buf, 4096);
	buf_put(want, 4096);
	printf("ok: %s: all %u writes read back\n", when, NWRITES);
}

int main(void)
{
	REQUIRE(workers_start(1) == 0, "workers");
	struct mem_bdev *d[3];
	struct bdev *vol;
	uint8_t *img[3];
	uint64_t sizes[3] = { BACK_SIZE, LEG_SIZE, LEG_SIZE };
	for (int i = 0; i < 3; i++)
		img[i] = calloc(1, sizes[i]);
	struct cache_set *cs = open_set(d, &vol, img);
	REQUIRE(cs->lay.jblocks == 32, "rings of %u blocks (the test is sized for 32)", cs->lay.jblocks);
	for (int i = 1; i < 3; i++) {
		atomic_store(&d[i]->slow_lo, cs->lay.table_off);
		atomic_store(&d[i]->slow_hi, cs->lay.journal_off);
		atomic_store(&d[i]->slow_hops, TABLE_HOPS);
	}
	struct cache_set_status st0, st;
	cache_set_status(cs, &st0);

	uint8_t *buf = buf_get(4096);
	for (uint32_t i = 0; i < NWRITES; i++) {
		fill(buf, i);
		REQUIRE(tio_sync(vol, BDEV_WRITE, (uint64_t)i * 4096, buf, 4096, BDEV_F_FUA) == 0, "write %u", i);
	}
	buf_put(buf, 4096);
	cache_set_status(cs, &st);
	printf("%u writes: %llu checkpoints, rings full %llu times\n", NWRITES,
	       (unsigned long long)(st.checkpoints - st0.checkpoints),
	       (unsigned long long)(st.journal_full_waits - st0.journal_full_waits));
	REQUIRE(st.journal_full_waits > st0.journal_full_waits,
		"no ring filled: the table writes were not slow enough for the test to mean anything");
	/* NWRITES records in 16 rings of 32 blocks: at least NWRITES / 512 reuses */
	REQUIRE(st.checkpoints - st0.checkpoints >= NWRITES / 512, "%llu checkpoints for %u journal blocks",
		(unsigned long long)(st.checkpoints - st0.checkpoints), NWRITES);
	printf("ok: the rings filled, writes waited for the checkpoint and completed\n");
	for (int i = 1; i < 3; i++)
		atomic_store(&d[i]->slow_hops, 0);
	check_all(vol, "live");

	cache_set_shutdown(cs);
	bdev_close(vol);
	cache_set_close(cs);
	cs = open_set(d, &vol, img);
	check_all(vol, "reopened");
	test_set_close(cs, vol);
	for (int i = 0; i < 3; i++)
		free(img[i]);
	printf("ok: test_cache_journal_full\n");
	return 0;
}
