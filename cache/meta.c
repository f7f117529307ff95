/*
 * meta.c - layout arithmetic and checksums of the on-disk formats (meta.h).
 *
 * Kept apart from the code that reads and writes metadata (set.c,
 * journal.c) so that encode/decode and checksum rejection can be tested on
 * buffers alone. All functions are pure: any thread, never sleep.
 */
#include "cache/meta.h"

#include <isa-l/crc.h>
#include <string.h>

uint32_t meta_crc(const void *buf, size_t len)
{
	return crc32_iscsi((unsigned char *)buf, (int)len, 0xffffffffu);
}

int meta_layout(uint64_t leg_size, uint32_t extent_size, uint32_t version, struct cache_layout *out)
{
	struct cache_layout l = { .leg_size = leg_size, .extent_size = extent_size };

	l.bpe = extent_size / CACHE_SECTOR;
	l.rec_size = 64;
	while (l.rec_size < sizeof(struct cache_slot_disk) + l.bpe / 4)
		l.rec_size *= 2;
	/* Journal: 1/64 of the leg, between 2 MiB and 256 MiB, split in rings. */
	uint64_t jbytes = leg_size / 64;
	if (jbytes < (2u << 20))
		jbytes = 2u << 20;
	if (jbytes > (256ull << 20))
		jbytes = 256ull << 20;
	l.jblocks = (uint32_t)(jbytes / CACHE_NJOURNALS / CACHE_PAGE);
	/*
	 * Block log (version 3): 1/32 of the leg, at most 64 MiB, and per
	 * ring room for two records of a whole extent at least.
	 */
	uint64_t dbytes = 0;
	if (version >= 3) {
		uint64_t per = leg_size / 32 / CACHE_DLOG_RINGS / CACHE_PAGE;
		uint64_t min = 2 * (extent_size / CACHE_PAGE + 1);
		if (per > (64ull << 20) / CACHE_DLOG_RINGS / CACHE_PAGE)
			per = (64ull << 20) / CACHE_DLOG_RINGS / CACHE_PAGE;
		if (per < min)
			per = min;
		l.dlog_pages = (uint32_t)per;
		dbytes = per * CACHE_DLOG_RINGS * CACHE_PAGE;
	}
	l.table_off = CACHE_TABLE_OFF;
	/* Solve for nslots: table + journal + block log + data fit, data extent-aligned. */
	uint64_t jb = (uint64_t)l.jblocks * CACHE_NJOURNALS * CACHE_PAGE;
	uint64_t fixed = l.table_off + jb + dbytes + extent_size;
	if (leg_size <= fixed)
		return -1;
	uint64_t n = (leg_size - fixed) / (extent_size + l.rec_size);
	for (; n >= 8; n--) {
		uint64_t table = (n * l.rec_size + CACHE_PAGE - 1) / CACHE_PAGE * CACHE_PAGE;
		uint64_t joff = l.table_off + table;
		uint64_t doff = joff + jb + dbytes;
		doff = (doff + extent_size - 1) / extent_size * extent_size;
		if (doff + n * extent_size <= leg_size) {
			l.journal_off = joff;
			l.dlog_off = dbytes ? joff + jb : 0;
			l.data_off = doff;
			l.nslots = (uint32_t)n;
			*out = l;
			return 0;
		}
	}
	return -1;
}

void meta_sb_seal(struct cache_sb_disk *sb)
{
	sb->crc = le32_of(0);
	sb->crc = le32_of(meta_crc(sb, sizeof(*sb)));
}

void meta_rebuild_mark(struct cache_sb_disk *page, const uint8_t set_uuid[16])
{
	memset(page, 0, sizeof(*page));
	page->magic = le64_of(CACHE_REBUILD_MAGIC);
	page->version = le32_of(CACHE_VERSION);
	memcpy(page->set_uuid, set_uuid, 16);
	meta_sb_seal(page);
}

bool meta_rebuild_marked(const struct cache_sb_disk *page, uint8_t set_uuid[16])
{
	if (le64_get(page->magic) != CACHE_REBUILD_MAGIC)
		return false;
	struct cache_sb_disk tmp;
	memcpy(&tmp, page, sizeof(tmp));
	tmp.crc = le32_of(0);
	if (meta_crc(&tmp, sizeof(tmp)) != le32_get(page->crc))
		return false;
	memcpy(set_uuid, page->set_uuid, 16);
	return true;
}

int meta_sb_check(const struct cache_sb_disk *sb, const char **why)
{
	if (le64_get(sb->magic) != CACHE_MAGIC) {
		*why = "no tiercache superblock (never formatted, or overwritten)";
		return -1;
	}
	uint32_t v = le32_get(sb->version);
	if (v != CACHE_VERSION && v != CACHE_VERSION_V3 && v != CACHE_VERSION_V2 && v != CACHE_VERSION_V1) {
		*why = v > CACHE_VERSION ? "the set was written by a newer tiercached (superblock version "
					   "unknown here); run that version, or flush and detach the cache with it"
					 : "superblock version unknown to this tiercached";
		return -1;
	}
	struct cache_sb_disk tmp;
	memcpy(&tmp, sb, sizeof(tmp));
	tmp.crc = le32_of(0);
	if (meta_crc(&tmp, sizeof(tmp)) != le32_get(sb->crc)) {
		*why = "superblock checksum mismatch (corrupt)";
		return -1;
	}
	return 0;
}

uint32_t meta_layout_version(const struct cache_sb_disk *sb)
{
	uint32_t v = le32_get(sb->version);
	if (v >= CACHE_VERSION)
		return le32_get(sb->dlog_rings) ? CACHE_VERSION_V3 : CACHE_VERSION_V2;
	return v;
}

uint32_t meta_btab_crc(const struct cache_btab_disk *tab)
{
	return meta_crc(tab, CACHE_BTAB_BYTES);
}

void meta_slot_seal(void *rec, uint32_t rec_size)
{
	struct cache_slot_disk *h = rec;
	h->crc = le32_of(0);
	h->crc = le32_of(meta_crc(rec, rec_size));
}

bool meta_slot_ok(const void *rec, uint32_t rec_size)
{
	const struct cache_slot_disk *h = rec;
	uint32_t want = le32_get(h->crc);
	uint8_t tmp[CACHE_PAGE];
	if (rec_size > sizeof(tmp))
		return false;
	memcpy(tmp, rec, rec_size);
	((struct cache_slot_disk *)tmp)->crc = le32_of(0);
	return meta_crc(tmp, rec_size) == want;
}

void meta_jblock_seal(struct cache_jblock_disk *b)
{
	b->magic = le32_of(JBLOCK_MAGIC);
	b->crc = le32_of(0);
	b->crc = le32_of(meta_crc(b, sizeof(*b)));
}

bool meta_jblock_ok(const struct cache_jblock_disk *b, const uint8_t uuid8[8], uint64_t pos)
{
	if (le32_get(b->magic) != JBLOCK_MAGIC || le64_get(b->pos) != pos ||
	    memcmp(b->set_uuid8, uuid8, 8) || le32_get(b->nrec) > JBLOCK_RECS)
		return false;
	struct cache_jblock_disk tmp;
	memcpy(&tmp, b, sizeof(tmp));
	tmp.crc = le32_of(0);
	return meta_crc(&tmp, sizeof(tmp)) == le32_get(b->crc);
}

void meta_dlog_seal(struct cache_dlog_disk *h)
{
	h->crc = le32_of(0);
	h->crc = le32_of(meta_crc(h, sizeof(*h)));
}

bool meta_dlog_ok(const struct cache_dlog_disk *h, const uint8_t uuid8[8], uint32_t ring, uint32_t at,
		  uint32_t pages)
{
	if (le32_get(h->magic) != DLOG_MAGIC || memcmp(h->set_uuid8, uuid8, 8) || le32_get(h->ring) != ring ||
	    !pages || le64_get(h->pos) % pages != at)
		return false;
	uint32_t np = le32_get(h->npages);
	if (np < 2 || np > pages - at)
		return false;
	struct cache_dlog_disk tmp;
	memcpy(&tmp, h, sizeof(tmp));
	tmp.crc = le32_of(0);
	return meta_crc(&tmp, sizeof(tmp)) == le32_get(h->crc);
}
