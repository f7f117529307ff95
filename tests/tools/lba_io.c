/*
 * lba_io.c - READ(16) and WRITE(16) of a range of 512-byte blocks over
 * iSCSI (libiscsi), with the status and sense of every command, for the leg
 * fault test.
 *
 *   lba_io write URL LBA BLOCKS FILE
 *       Write BLOCKS blocks from FILE (its first BLOCKS * 512 bytes) at LBA,
 *       in WRITE(16)s of at most 256 KiB issued from the last piece to the
 *       first (so a cache does not take it for one sequential stream).
 *   lba_io read URL LBA BLOCKS [--times N] [--expect FILE] [--out FILE]
 *       READ(16) the range N times (default 1), in one command each;
 *       --expect: every read must equal FILE's first BLOCKS * 512 bytes
 *       (exit 4 at the first that does not, naming the first sector that
 *       differs); --out: write the last read to FILE.
 *
 * Output and exit: "good" and 0 when every command got GOOD. A CHECK
 * CONDITION prints "check condition: sense KEY/ASC/ASCQ" in hex (e.g.
 * "sense 3/11/00") and exits 3; any other failure (login, transport,
 * another status) exits 2. UNIT ATTENTION is retried (a few times) as a
 * host would.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tc_iscsi.h"

#include <iscsi/scsi-lowlevel.h>

#define SECT 512
#define PIECE_BLOCKS 512 /* 256 KiB */
#define UA_RETRIES 8

static void usage(void)
{
	fprintf(stderr, "usage: lba_io write URL LBA BLOCKS FILE\n"
			"       lba_io read URL LBA BLOCKS [--times N] [--expect FILE] [--out FILE]\n");
	exit(2);
}

static unsigned char *load(const char *path, size_t len)
{
	FILE *f = fopen(path, "rb");
	unsigned char *buf = malloc(len ? len : 1);
	if (!f || !buf || fread(buf, 1, len, f) != len) {
		fprintf(stderr, "lba_io: cannot read %zu bytes of %s\n", len, path);
		exit(2);
	}
	fclose(f);
	return buf;
}

/* A finished task: 0 GOOD, 1 UNIT ATTENTION (retry), else exit with the status. */
static int judge(struct iscsi_context *c, struct scsi_task *t, const char *op, uint64_t lba)
{
	if (!t) {
		fprintf(stderr, "lba_io: %s at LBA %llu: no answer: %s\n", op, (unsigned long long)lba,
			iscsi_get_error(c));
		exit(2);
	}
	if (t->status == SCSI_STATUS_GOOD)
		return 0;
	if (t->status == SCSI_STATUS_CHECK_CONDITION) {
		if (t->sense.key == SCSI_SENSE_UNIT_ATTENTION)
			return 1;
		printf("check condition: sense %x/%02x/%02x (%s at LBA %llu)\n", (unsigned)t->sense.key,
		       (unsigned)(t->sense.ascq >> 8) & 0xff, (unsigned)t->sense.ascq & 0xff, op,
		       (unsigned long long)lba);
		exit(3);
	}
	fprintf(stderr, "lba_io: %s at LBA %llu: SCSI status 0x%x: %s\n", op, (unsigned long long)lba, t->status,
		iscsi_get_error(c));
	exit(2);
}

int main(int argc, char **argv)
{
	if (argc < 5)
		usage();
	const char *cmd = argv[1], *url = argv[2];
	uint64_t lba = strtoull(argv[3], NULL, 0);
	uint32_t blocks = (uint32_t)strtoul(argv[4], NULL, 0);
	bool writing = !strcmp(cmd, "write");
	if ((!writing && strcmp(cmd, "read")) || !blocks || (writing && argc != 6))
		usage();
	int times = 1;
	const char *expect = NULL, *out = NULL;
	for (int i = 5; !writing && i < argc; i++) {
		if (i + 1 >= argc)
			usage();
		if (!strcmp(argv[i], "--times"))
			times = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--expect"))
			expect = argv[++i];
		else if (!strcmp(argv[i], "--out"))
			out = argv[++i];
		else
			usage();
	}
	size_t len = (size_t)blocks * SECT;
	int lun;
	struct iscsi_context *c = tc_iscsi_connect(url, "iqn.2026-11.io.tiercache:lba-io", ISCSI_HEADER_DIGEST_NONE,
						   30, false, &lun);
	if (!c)
		return 2;

	if (writing) {
		unsigned char *data = load(argv[5], len);
		uint32_t npieces = (blocks + PIECE_BLOCKS - 1) / PIECE_BLOCKS;
		for (uint32_t k = npieces; k-- > 0;) {
			uint32_t first = k * PIECE_BLOCKS;
			uint32_t n = blocks - first < PIECE_BLOCKS ? blocks - first : PIECE_BLOCKS;
			for (int tries = 0;; tries++) {
				struct scsi_task *t = iscsi_write16_sync(c, lun, lba + first, data + (size_t)first * SECT,
									 n * SECT, SECT, 0, 0, 0, 0, 0);
				int r = judge(c, t, "WRITE(16)", lba + first);
				scsi_free_scsi_task(t);
				if (!r)
					break;
				if (tries == UA_RETRIES) {
					fprintf(stderr, "lba_io: UNIT ATTENTION %d times in a row\n", tries + 1);
					return 2;
				}
			}
		}
		free(data);
	} else {
		unsigned char *want = expect ? load(expect, len) : NULL;
		for (int i = 0; i < times; i++) {
			struct scsi_task *t;
			for (int tries = 0;; tries++) {
				t = iscsi_read16_sync(c, lun, lba, (uint32_t)len, SECT, 0, 0, 0, 0, 0);
				if (!judge(c, t, "READ(16)", lba))
					break;
				scsi_free_scsi_task(t);
				if (tries == UA_RETRIES) {
					fprintf(stderr, "lba_io: UNIT ATTENTION %d times in a row\n", tries + 1);
					return 2;
				}
			}
			if (t->datain.size != (int)len) {
				fprintf(stderr, "lba_io: READ(16) at LBA %llu returned %d bytes, not %zu\n",
					(unsigned long long)lba, t->datain.size, len);
				return 2;
			}
			if (want && memcmp(want, t->datain.data, len)) {
				size_t s = 0;
				while (!memcmp(want + s * SECT, t->datain.data + s * SECT, SECT))
					s++;
				printf("mismatch: read %d of %d: LBA %llu differs from %s\n", i + 1, times,
				       (unsigned long long)(lba + s), expect);
				return 4;
			}
			if (out && i == times - 1) {
				FILE *f = fopen(out, "wb");
				if (!f || fwrite(t->datain.data, 1, len, f) != len || fclose(f)) {
					fprintf(stderr, "lba_io: cannot write %s\n", out);
					return 2;
				}
			}
			scsi_free_scsi_task(t);
		}
		free(want);
	}
	printf("good\n");
	iscsi_logout_sync(c);
	iscsi_destroy_context(c);
	return 0;
}
