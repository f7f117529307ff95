/*
 * meta.h - the cache's on-disk formats, declared once.
 *
 * Every structure written to a leg is here, as a packed struct of
 * explicitly little-endian fields (le16/le32/le64 wrappers: a field cannot
 * be read without the helper, so byte order is never forgotten) with a
 * _Static_assert on its size. Checksums are CRC32C (ISA-L crc32_iscsi).
 *
 * Leg layout (every leg of a set holds the same bytes at the same offsets):
 *
 *   0        superblock copy A (4 KiB)      two copies, written alternately
 *   4 KiB    superblock copy B (4 KiB)      by generation: a torn write of
 *                                           one leaves the other intact
 *   8 KiB    write-intent bitmap (4 KiB, version 2): a bit per region of
 *            slots that may be in doubt after a crash (intent.c)
 *   12 KiB   backing table copy 0 (24 KiB, version 4): the LUNs whose data
 *            the set holds, CACHE_MAX_BACKINGS entries
 *   36 KiB   backing table copy 1; the superblock names the copy that is
 *            current and its checksum (attach.c)
 *   60 KiB   ... padding to 64 KiB
 *   table    one slot record per slot, rec_size bytes (a power of two),
 *            grouped in 4 KiB pages: the checkpointed extent map
 *   journal  CACHE_NJOURNALS rings of jblocks 4 KiB blocks: metadata
 *            updates since the last checkpoint, one ring per worker thread
 *            (so a worker never waits on another thread's commit)
 *   dlog     (version 3) CACHE_DLOG_RINGS rings of dlog_pages 4 KiB pages:
 *            the block log, a copy of each write-back overwrite of dirty
 *            data made before the slot is overwritten in place (dlog.c)
 *   data     slot i at data_off + i * extent_size
 *
 * Recovery = newest valid superblock, load the table, replay every journal
 * record with seq >= ckpt_seq in seq order (records are absolute per-block
 * assignments, so replaying over a snapshot that already holds some of them
 * yields the same state).
 *
 * Threading: pure functions, any thread.
 */
#ifndef TC_CACHE_META_H
#define TC_CACHE_META_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/endian.h"

#define CACHE_MAGIC 0x3145484341434354ULL /* "TCCACHE1" little-endian */
/* a leg being rebuilt: both superblock copies replaced by this mark first */
#define CACHE_REBUILD_MAGIC 0x31444c4942455254ULL /* "TREBILD1" little-endian */
/*
 * Version 2 adds the write-intent page at CACHE_WI_OFF; nothing else moved.
 * A version 1 set that was shut down cleanly opens as is; one that was not
 * is recovered as if every region's bit were set (set.c).
 */
/*
 * Version 3 adds the block log between the journal and the data (so the
 * data moved: a version 2 set keeps its version and its layout, and runs
 * without the block log; re-creating it gets one).
 */
/*
 * Version 4 moves the table of backing stores out of the superblock (16
 * entries there) into two copies of its own in the padding before the
 * table (CACHE_MAX_BACKINGS entries); the rest of the layout is the one
 * the set had (with the block log, or without it for a set made before
 * version 3: dlog_rings says which). Every older set is upgraded when it
 * is opened: the table is written first, then a version 4 superblock.
 */
#define CACHE_VERSION 4
#define CACHE_VERSION_V3 3
#define CACHE_VERSION_V2 2
#define CACHE_VERSION_V1 1
#define CACHE_SECTOR 512u          /* metadata granularity: one valid/dirty bit each */
#define CACHE_PAGE 4096u
#define CACHE_NJOURNALS 16
#define CACHE_DLOG_RINGS 4
#define CACHE_LEGACY_BACKINGS 16 /* the table inside the superblock, versions 1 to 3 */
#define CACHE_MAX_BACKINGS 256
#define CACHE_MAX_LEGS 2
#define CACHE_TABLE_OFF (64u << 10)
#define CACHE_WI_OFF (8u << 10)
#define CACHE_WI_BITS (CACHE_PAGE * 8)
#define CACHE_WI_MIN_REGION (16u << 20) /* bytes of slots per bit, at least */
#define CACHE_BTAB_OFF (12u << 10)

/*
 * Identity of a backing store attached to the set (versions 1 to 3, in the
 * superblock; version 4 keeps the same facts, but the path, in
 * struct cache_btab_disk). We keep the LUN name,
 * the store's size and, for regular files, the inode number and the
 * filesystem's device number. Why not a header written into the store:
 * the store is the LUN's data, every byte belongs to the initiator. Why
 * inode + device: a file restored from a copy, or a config pointing at
 * another file of the same size, gets a different inode, and destaging
 * dirty extents into it would corrupt it silently. Block devices (whose
 * major:minor can change between boots) are matched by size and path.
 */
struct cache_backing_disk {
	char lun[64];        /* NUL-padded LUN name; empty = unused entry */
	char path[128];      /* NUL-padded, for messages */
	le64 size;
	le64 ino;            /* 0 for a block device */
	le64 fsdev;
	le32 bid;            /* backing id in extent keys */
	le32 is_blockdev;
};
_Static_assert(sizeof(struct cache_backing_disk) == 224, "backing identity is 224 bytes");

/*
 * Version 4: one entry of the backing table; its index is the backing id
 * in extent keys. The table is CACHE_BTAB_BYTES, written whole into the
 * copy the newest superblock does not name, FUA, before the superblock
 * that names it: a torn table write leaves the named copy whole. The
 * path is not kept (it was for messages only): the LUN name, size and
 * inode say which store it was.
 */
#define BTAB_F_BLOCKDEV 1u
struct cache_btab_disk {
	char lun[64];        /* NUL-padded LUN name; empty = unused entry */
	le64 size;
	le64 ino;            /* 0 for a block device */
	le64 fsdev;
	le32 flags;          /* BTAB_F_* */
	le32 reserved;
};
_Static_assert(sizeof(struct cache_btab_disk) == 96, "backing table entry is 96 bytes");
#define CACHE_BTAB_BYTES (CACHE_MAX_BACKINGS * 96u)
_Static_assert(CACHE_BTAB_BYTES % 4096 == 0, "a table copy is whole pages");
_Static_assert(CACHE_BTAB_OFF + 2 * CACHE_BTAB_BYTES <= CACHE_TABLE_OFF, "both copies fit before the slot table");

struct cache_sb_disk {
	le64 magic;
	le32 version;
	le32 crc;            /* crc32c of the 4 KiB with this field zero */
	uint8_t set_uuid[16];
	le64 gen;            /* bumped on every superblock write; the higher copy wins */
	le32 leg_index;
	le32 nlegs;
	le32 extent_size;
	le32 block_size;     /* CACHE_SECTOR */
	le32 nslots;
	le32 rec_size;
	le32 njournals;
	le32 jblocks;        /* per journal ring */
	le64 leg_size;
	le64 table_off;
	le64 journal_off;
	le64 data_off;
	le32 clean;          /* 1: written by a clean shutdown, journals empty */
	le32 failed_mask;    /* legs known to hold stale data (need resync) */
	le64 ckpt_seq;       /* records with seq < ckpt_seq are in the table */
	le64 jtail[CACHE_NJOURNALS]; /* first journal block (absolute) to replay */
	char set_name[64];
	struct cache_backing_disk legacy_backing[CACHE_LEGACY_BACKINGS]; /* versions 1-3; zero in 4 */
	/*
	 * Which device each leg index is: this leg's own identity, and the
	 * identities of every member as the writer knew them. A leg whose own
	 * identity is not the member the newest superblock names for its
	 * index is not part of the set any more (it was replaced), however
	 * good its contents look. All zero in superblocks written before they
	 * existed (then nothing is checked); new ones are made at format and
	 * at every `leg replace`.
	 */
	uint8_t leg_uuid[16];
	uint8_t member_uuid[CACHE_MAX_LEGS][16];
	/* version 3: the block log (0 in older versions: none) */
	le64 dlog_off;
	le32 dlog_rings;     /* CACHE_DLOG_RINGS */
	le32 dlog_pages;     /* per ring */
	/* version 4: the backing table copy that is current, and its crc32c */
	le32 btab_copy;      /* 0 or 1 */
	le32 btab_crc;
	uint8_t pad[4096 - 8 - 4 - 4 - 16 - 8 - 4 * 8 - 8 * 4 - 4 - 4 - 8 - 8 * CACHE_NJOURNALS - 64 -
		    224 * CACHE_LEGACY_BACKINGS - 16 - 16 * CACHE_MAX_LEGS - 16 - 8];
};
_Static_assert(sizeof(struct cache_sb_disk) == 4096, "superblock is one 4 KiB block");

/* Slot record in the table: header, then valid bitmap, then dirty bitmap. */
struct cache_slot_disk {
	le64 key;            /* CACHE_KEY_NONE: free */
	le32 flags;          /* SLOTF_* (summary; bitmaps authoritative) */
	le32 crc;            /* crc32c of rec_size bytes with this field zero */
	le64 nblocks;        /* blocks per extent, a sanity check */
	le64 reserved;
	/* uint8_t valid[bpe / 8]; uint8_t dirty[bpe / 8]; */
};
_Static_assert(sizeof(struct cache_slot_disk) == 32, "slot record header is 32 bytes");

#define CACHE_KEY_NONE UINT64_MAX

enum jrec_op {
	JOP_DIRTY = 1,      /* blocks valid and dirty (write-back write) */
	JOP_VALID = 2,      /* blocks valid and clean (promotion, write-through) */
	JOP_CLEAN = 3,      /* blocks clean (destaged) */
	JOP_INVALIDATE = 4, /* blocks invalid (write-around, UNMAP) */
	JOP_FREE = 5,       /* slot holds nothing */
};

struct cache_jrec_disk {
	le64 seq;
	le64 key;
	le32 slot;
	le16 op;
	le16 first;          /* first block inside the extent */
	le16 count;          /* blocks */
	uint8_t pad[6];
};
_Static_assert(sizeof(struct cache_jrec_disk) == 32, "journal record is 32 bytes");

#define JBLOCK_MAGIC 0x4b4c424a /* "JBLK" */
#define JBLOCK_RECS 127

struct cache_jblock_disk {
	le32 magic;
	le32 crc;            /* crc32c of the block with this field zero */
	le64 pos;            /* absolute position in the ring: replay expects consecutive */
	uint8_t set_uuid8[8];
	le32 nrec;
	le32 journal;        /* which ring */
	struct cache_jrec_disk rec[JBLOCK_RECS];
};
_Static_assert(sizeof(struct cache_jblock_disk) == 4096, "journal block is 4 KiB");

/*
 * Block log record: a header page, then the data (count sectors, padded to
 * whole pages), written as one request. It says "these sectors of slot
 * (holding key) read as this data", as of seq; recovery (dlog.c) puts the
 * data back in place where that is still the newest word on them, so an
 * overwrite of dirty data torn by a power cut reads wholly new.
 */
#define DLOG_MAGIC 0x474f4c44 /* "DLOG" */

struct cache_dlog_disk {
	le32 magic;
	le32 crc;            /* crc32c of the header page with this field zero */
	le64 pos;            /* absolute page position in the ring */
	uint8_t set_uuid8[8];
	le32 ring;
	le32 npages;         /* header included */
	le64 seq;
	le64 key;
	le32 slot;
	le16 first;          /* first block inside the extent */
	le16 count;          /* blocks */
	le32 data_crc;       /* crc32c of the count * 512 data bytes */
	uint8_t pad[4096 - 4 - 4 - 8 - 8 - 4 - 4 - 8 - 8 - 4 - 2 - 2 - 4];
};
_Static_assert(sizeof(struct cache_dlog_disk) == 4096, "block log header is 4 KiB");

/* Geometry derived from a leg size and extent size. */
struct cache_layout {
	uint64_t leg_size;
	uint32_t extent_size;
	uint32_t bpe;        /* blocks (sectors) per extent */
	uint32_t rec_size;
	uint32_t nslots;
	uint32_t jblocks;
	uint32_t dlog_pages; /* per ring; 0: no block log (a version 1 or 2 set) */
	uint64_t table_off, journal_off, dlog_off, data_off;
};

/*
 * Compute the layout a set of this version has; 0, or -1 if the leg is too
 * small for 8 slots. Versions 1 and 2 share one layout (no block log).
 */
int meta_layout(uint64_t leg_size, uint32_t extent_size, uint32_t version, struct cache_layout *out);

uint32_t meta_crc(const void *buf, size_t len);

/* Seal (compute crc) and check superblocks, slot records, journal blocks. */
void meta_sb_seal(struct cache_sb_disk *sb);
/*
 * The rebuild mark: a page, written over each superblock copy of a leg
 * before a resync copies anything onto it (one copy, then the other), that
 * says "this leg of set_uuid is being rebuilt". A leg with a mark in either
 * copy holds no member of the set, whatever the other copy says, and is
 * rebuilt again at start; a torn mark leaves the other copy whole. mark:
 * fill page; marked: true (and *set_uuid) if page is a whole mark.
 */
void meta_rebuild_mark(struct cache_sb_disk *page, const uint8_t set_uuid[16]);
bool meta_rebuild_marked(const struct cache_sb_disk *page, uint8_t set_uuid[16]);
/* 0 if magic, version (1 to 4) and checksum are right; otherwise -1 and a reason. */
int meta_sb_check(const struct cache_sb_disk *sb, const char **why);

/*
 * The layout version of a superblock's set: 3 with the block log, 2 or 1
 * without (a version 4 set has the layout it was upgraded from: its
 * dlog_rings says whether that had the block log). For meta_layout.
 */
uint32_t meta_layout_version(const struct cache_sb_disk *sb);
/* crc32c of a backing table copy (CACHE_BTAB_BYTES). */
uint32_t meta_btab_crc(const struct cache_btab_disk *tab);
/* Offset on the leg of backing table copy k (0 or 1). */
static inline uint64_t meta_btab_off(uint32_t k) { return CACHE_BTAB_OFF + (uint64_t)(k & 1) * CACHE_BTAB_BYTES; }

void meta_slot_seal(void *rec, uint32_t rec_size);
bool meta_slot_ok(const void *rec, uint32_t rec_size);

void meta_jblock_seal(struct cache_jblock_disk *b);
bool meta_jblock_ok(const struct cache_jblock_disk *b, const uint8_t uuid8[8], uint64_t pos);

void meta_dlog_seal(struct cache_dlog_disk *h);
/* header checksum, magic, set, ring, and its position (pos % pages == at) */
bool meta_dlog_ok(const struct cache_dlog_disk *h, const uint8_t uuid8[8], uint32_t ring, uint32_t at,
		  uint32_t pages);

#endif
