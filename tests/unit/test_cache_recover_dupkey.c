/*
 * test_cache_recover_dupkey.c - an extent evicted and cached again in
 * another slot, cut so that the record freeing the old slot is lost but the
 * new slot's record is not: recovery keeps the new slot.
 *
 * The records of one change can sit in different journal rings: the
 * eviction's FREE in the ring of the worker that evicted, the new slot's
 * DIRTY in the ring of the worker that wrote. A ring with a slow block in
 * flight (a resync's copy sharing the leg, say) holds the FREE back while
 * the write's record lands and the write is acknowledged. Recovery then
 * found two slots holding the extent, inserted the first one it met into
 * the map (the higher slot index) and freed the other: the acknowledged
 * write was lost whenever the old slot had the higher index
 * (test_cache_powercut caught it, a few runs in a hundred, during a
 * rebuild onto a new leg).
 *
 * Here the journal is written by hand, as the cut left it in that run, on
 * the legs of an open set (its superblock says unclean): the old slot holds
 * the extent clean (a VALID record, the data equal to the backing store's),
 * the new slot holds eight dirty blocks of a later write (a DIRTY record
 * with a higher seq, in another ring), and no FREE of the old slot. Both
 * orders of the slots' indexes are tried: the extent must read the new
 * data in its first eight blocks and the old data after them.
 */
#include "cache/cache_int.h"
#include "cache/vol_int.h" /* the volume's backing id: the key the records name */
#include "tests/unit/cache_test_util.h"

#define LEG_SIZE (4u << 20)
#define BACK_SIZE (2u << 20)
#define EXT (64u << 10)
#define NEW_BLOCKS 8

enum { DEV_BACK, DEV_LEG0, DEV_LEG1, NDEV };
static const uint64_t sizes[NDEV] = { BACK_SIZE, LEG_SIZE, LEG_SIZE };

static struct cache_set_cfg cfg = {
	.name = "dk", .nlegs = 2, .extent_size = EXT, .mode = CACHE_WRITE_BACK, .admit_hits = 1000, .dirty_target = 90,
};

static struct cache_set *open_set(struct mem_bdev **d, struct bdev **vol, uint8_t *const img[NDEV])
{
	for (int i = 0; i < NDEV; i++)
		d[i] = mem_new(i, sizes[i], img ? img[i] : NULL);
	struct cache_set *cs = test_set_open(&cfg, d[DEV_LEG0], d[DEV_LEG1]);
	*vol = test_vol_open(cs, "lun0", d[DEV_BACK], CACHE_WRITE_BACK);
	return cs;
}

/* one journal block at ring j, position pos, holding one record, on both legs */
static void put_block(uint8_t *const img[NDEV], const struct cache_set *cs, uint32_t j, uint64_t pos,
		      struct cache_jrec_disk rec)
{
	struct cache_jblock_disk b;
	memset(&b, 0, sizeof(b));
	b.pos = le64_of(pos);
	memcpy(b.set_uuid8, cs->uuid, 8);
	b.nrec = le32_of(1);
	b.journal = le32_of(j);
	b.rec[0] = rec;
	meta_jblock_seal(&b);
	uint64_t off = cs->lay.journal_off + ((uint64_t)j * cs->lay.jblocks + pos % cs->lay.jblocks) * CACHE_PAGE;
	for (int l = DEV_LEG0; l <= DEV_LEG1; l++)
		memcpy(img[l] + off, &b, sizeof(b));
}

static void run(uint32_t old_slot, uint32_t new_slot)
{
	struct mem_bdev *d[NDEV];
	struct bdev *vol;
	uint8_t *img[NDEV];
	/* an open set: its superblock says unclean, as after a power cut */
	struct cache_set *cs = open_set(d, &vol, NULL);
	uint32_t bid = ((struct cache_vol *)vol)->bid;
	const uint64_t ext = 7, key = ((uint64_t)bid << 40) | ext;
	uint64_t seq = atomic_load(&cs->next_seq) + 10;
	uint64_t head0 = atomic_load(&cs->journals[0].head), head1 = atomic_load(&cs->journals[1].head);
	REQUIRE(old_slot < cs->lay.nslots && new_slot < cs->lay.nslots, "only %u slots", cs->lay.nslots);
	REQUIRE(atomic_load(&cs->slots[old_slot].key) == CACHE_KEY_NONE &&
		atomic_load(&cs->slots[new_slot].key) == CACHE_KEY_NONE, "the slots are not free");
	uint64_t old_off = slot_leg_off(cs, old_slot), new_off = slot_leg_off(cs, new_slot);
	for (int i = 0; i < NDEV; i++) {
		img[i] = malloc(sizes[i]);
		memcpy(img[i], d[i]->data, sizes[i]);
	}
	/* the old copy: clean, the same data as the backing store's */
	memset(img[DEV_BACK] + ext * EXT, 'O', EXT);
	for (int l = DEV_LEG0; l <= DEV_LEG1; l++) {
		memset(img[l] + old_off, 'O', EXT);
		memset(img[l] + new_off, 'N', NEW_BLOCKS * CACHE_SECTOR);
	}
	put_block(img, cs, 0, head0,
		  (struct cache_jrec_disk){ .seq = le64_of(seq), .key = le64_of(key), .slot = le32_of(old_slot),
					    .op = le16_of(JOP_VALID), .first = le16_of(0),
					    .count = le16_of((uint16_t)cs->lay.bpe) });
	/* seq + 1 was the FREE of the old slot: cut */
	put_block(img, cs, 1, head1,
		  (struct cache_jrec_disk){ .seq = le64_of(seq + 2), .key = le64_of(key), .slot = le32_of(new_slot),
					    .op = le16_of(JOP_DIRTY), .first = le16_of(0),
					    .count = le16_of(NEW_BLOCKS) });
	test_set_close(cs, vol);

	cs = open_set(d, &vol, img);
	uint8_t *buf = malloc(EXT);
	REQUIRE(tio_sync(vol, BDEV_READ, ext * EXT, buf, EXT, 0) == 0, "read");
	for (uint32_t b = 0; b < EXT / CACHE_SECTOR; b++) {
		char want = b < NEW_BLOCKS ? 'N' : 'O';
		for (uint32_t k = 0; k < CACHE_SECTOR; k++)
			REQUIRE(buf[b * CACHE_SECTOR + k] == want,
				"old slot %u, new slot %u: block %u reads '%c', not '%c' (%s)", old_slot, new_slot, b,
				buf[b * CACHE_SECTOR + k], want,
				want == 'N' ? "the acknowledged write in the new slot was lost" : "the extent's older data is gone");
	}
	uint32_t holders = 0;
	for (uint32_t s = 0; s < cs->lay.nslots; s++)
		if (atomic_load(&cs->slots[s].key) == key)
			holders++;
	REQUIRE(holders == 1, "%u slots hold the extent after recovery", holders);
	REQUIRE(atomic_load(&cs->slots[new_slot].key) == key, "the new slot %u was not kept", new_slot);
	printf("ok: old slot %u, new slot %u: the new slot kept, the extent reads the new write and the older "
	       "data around it\n", old_slot, new_slot);
	free(buf);
	test_set_close(cs, vol);
	for (int i = 0; i < NDEV; i++)
		free(img[i]);
}

int main(void)
{
	REQUIRE(workers_start(2) == 0, "workers");
	run(5, 3); /* the old slot met first (recovery walks down): the order the power-cut test lost */
	run(3, 5);
	workers_stop();
	return 0;
}
