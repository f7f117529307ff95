/*
 * stamp_io.c - writer and verifier of stamped blocks over iSCSI (libiscsi),
 * for the crash tests.
 *
 *   stamp_io write URL LOG SEQ0 [SECONDS] [BLOCKS]
 *       Writes 4 KiB blocks at random LBAs among the first BLOCKS 4 KiB
 *       blocks of the LUN (default 4096), each 512-byte sector stamped with
 *       (lba, seq, checksum), seq counting up from SEQ0. After each write is
 *       acknowledged (GOOD status) it appends "lba seq" to LOG. Stops after
 *       SECONDS or when the target goes away (it is being killed): exit 0.
 *   stamp_io verify URL LOG
 *       For every LBA in LOG, reads the block back: every sector must carry
 *       a valid stamp for its LBA with seq >= the last acknowledged seq
 *       (a later, unacknowledged write may have landed; nothing older, no
 *       garbage). Exit 1 with a line per bad block otherwise.
 */
#include <errno.h>
#include <fcntl.h>
#include <iscsi/iscsi.h>
#include <iscsi/scsi-lowlevel.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tc_iscsi.h"

#define BLK 4096
#define SECT 512

struct stamp {
	uint64_t lba;   /* sector number */
	uint64_t seq;
	uint64_t check;
};

static uint64_t check_of(uint64_t lba, uint64_t seq)
{
	uint64_t x = lba * 0x9e3779b97f4a7c15ULL ^ (seq + 0x632be59bd9b4e019ULL) * 0xc2b2ae3d27d4eb4fULL;
	x ^= x >> 31;
	return x * 0x94d049bb133111ebULL;
}

static struct iscsi_context *connect_url(const char *url, int *lun)
{
	/* a killed target must end the writer, not be reconnected to forever */
	return tc_iscsi_connect(url, "iqn.2026-11.io.tiercache:stamp-io", ISCSI_HEADER_DIGEST_NONE_CRC32C, 10, false,
				lun);
}

static uint64_t rnd_state;
static uint64_t rnd(void)
{
	rnd_state ^= rnd_state << 13;
	rnd_state ^= rnd_state >> 7;
	rnd_state ^= rnd_state << 17;
	return rnd_state;
}

static int do_write(const char *url, const char *logpath, uint64_t seq, double secs, uint64_t blocks)
{
	int lun;
	struct iscsi_context *c = connect_url(url, &lun);
	if (!c)
		return 2;
	int fd = open(logpath, O_WRONLY | O_CREAT | O_APPEND, 0644);
	if (fd < 0) {
		perror(logpath);
		return 2;
	}
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	rnd_state = seq * 2654435761u + 1;
	unsigned char buf[BLK];
	long n = 0;
	for (;;) {
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (secs > 0 && (double)(t.tv_sec - t0.tv_sec) + (double)(t.tv_nsec - t0.tv_nsec) / 1e9 > secs)
			break;
		uint64_t blk = rnd() % blocks;
		for (int i = 0; i < BLK / SECT; i++) {
			struct stamp s = { blk * 8 + (uint64_t)i, seq, check_of(blk * 8 + (uint64_t)i, seq) };
			memset(buf + i * SECT, (int)(seq & 0xff), SECT);
			memcpy(buf + i * SECT, &s, sizeof(s));
		}
		struct scsi_task *task = iscsi_write10_sync(c, lun, (uint32_t)(blk * 8), buf, BLK, SECT, 0, 0, 0, 0, 0);
		if (!task || task->status != SCSI_STATUS_GOOD) {
			/* the target went away (killed) or refused: stop, the log holds what was acknowledged */
			if (task)
				scsi_free_scsi_task(task);
			break;
		}
		scsi_free_scsi_task(task);
		char line[64];
		int len = snprintf(line, sizeof(line), "%llu %llu\n", (unsigned long long)blk, (unsigned long long)seq);
		if (write(fd, line, (size_t)len) != len) {
			perror("log");
			return 2;
		}
		seq++;
		n++;
	}
	close(fd);
	printf("%ld writes acknowledged\n", n);
	iscsi_destroy_context(c);
	return 0;
}

struct ent {
	uint64_t blk, seq;
};

static int cmp_ent(const void *a, const void *b)
{
	const struct ent *x = a, *y = b;
	if (x->blk != y->blk)
		return x->blk < y->blk ? -1 : 1;
	return x->seq < y->seq ? -1 : x->seq > y->seq;
}

static int do_verify(const char *url, const char *logpath)
{
	FILE *f = fopen(logpath, "r");
	if (!f) {
		perror(logpath);
		return 2;
	}
	size_t cap = 1 << 16, n = 0;
	struct ent *e = malloc(cap * sizeof(*e));
	unsigned long long b, s;
	while (fscanf(f, "%llu %llu", &b, &s) == 2) {
		if (n == cap)
			e = realloc(e, (cap *= 2) * sizeof(*e));
		e[n++] = (struct ent){ b, s };
	}
	fclose(f);
	qsort(e, n, sizeof(*e), cmp_ent);
	int lun;
	struct iscsi_context *c = connect_url(url, &lun);
	if (!c)
		return 2;
	long blocks = 0, bad = 0;
	for (size_t i = 0; i < n; i++) {
		if (i + 1 < n && e[i + 1].blk == e[i].blk)
			continue; /* the last (highest seq) entry of each block */
		struct scsi_task *task = iscsi_read10_sync(c, lun, (uint32_t)(e[i].blk * 8), BLK, SECT, 0, 0, 0, 0, 0);
		if (!task || task->status != SCSI_STATUS_GOOD || task->datain.size != BLK) {
			printf("block %llu: read failed\n", (unsigned long long)e[i].blk);
			bad++;
			if (task)
				scsi_free_scsi_task(task);
			continue;
		}
		blocks++;
		for (int k = 0; k < BLK / SECT; k++) {
			struct stamp st;
			memcpy(&st, task->datain.data + k * SECT, sizeof(st));
			uint64_t lba = e[i].blk * 8 + (uint64_t)k;
			const char *why = NULL;
			if (st.lba != lba || st.check != check_of(lba, st.seq))
				why = "garbage (no valid stamp)";
			else if (st.seq < e[i].seq)
				why = "older than the acknowledged write";
			for (int j = sizeof(st); !why && j < SECT; j++)
				if (task->datain.data[k * SECT + j] != (unsigned char)(st.seq & 0xff))
					why = "torn sector";
			if (why) {
				printf("lba %llu: %s (acknowledged seq %llu, found seq %llu)\n", (unsigned long long)lba,
				       why, (unsigned long long)e[i].seq, (unsigned long long)st.seq);
				bad++;
				break;
			}
		}
		scsi_free_scsi_task(task);
	}
	iscsi_destroy_context(c);
	free(e);
	printf("%ld blocks verified, %ld bad\n", blocks, bad);
	return bad ? 1 : 0;
}

int main(int argc, char **argv)
{
	if (argc >= 5 && !strcmp(argv[1], "write"))
		return do_write(argv[2], argv[3], strtoull(argv[4], NULL, 0), argc > 5 ? atof(argv[5]) : 0,
				argc > 6 ? strtoull(argv[6], NULL, 0) : 4096);
	if (argc == 4 && !strcmp(argv[1], "verify"))
		return do_verify(argv[2], argv[3]);
	fprintf(stderr, "usage: stamp_io write URL LOG SEQ0 [SECONDS] [BLOCKS]\n       stamp_io verify URL LOG\n");
	return 2;
}
