/*
 * alua_io.c - an iSCSI client (libiscsi) for the gateway failover test: it
 * behaves like a host's multipath layer on one path, retrying what SPC-4
 * says to retry while asymmetric access states change.
 *
 *   alua_io write URL LBA BLOCKS BYTE [SECONDS]
 *       WRITE(10) BLOCKS 512-byte blocks at LBA filled with BYTE (0..255),
 *       then SYNCHRONIZE CACHE.
 *   alua_io read URL LBA BLOCKS BYTE [SECONDS]
 *       READ(10) and check that every byte is BYTE (exit 3 if not; the
 *       first byte found is printed).
 *   alua_io loop URL LBA BLOCKS SLOTS STOPFILE
 *       Until STOPFILE exists, round r = 0, 1, ...: WRITE(10) BLOCKS blocks
 *       at LBA + (r % SLOTS) * BLOCKS, every byte r & 0xff but the first
 *       four of each block, which hold r (big-endian), then READ(10) them
 *       and compare (exit 3 on a mismatch). Prints "started" after the
 *       first round; at the end "rounds=N maxgap_ms=N" (the longest time
 *       between two GOOD answers) before the counts.
 *   alua_io wloop URL LBA BLOCKS SLOTS STOPFILE
 *       The same without the READs (a write is in flight nearly always).
 *   alua_io sync URL
 *       SYNCHRONIZE CACHE(10) of the whole LU.
 *   alua_io rtpg URL
 *       REPORT TARGET PORT GROUPS (extended header): one line per group,
 *       "GROUP STATE" with STATE one of AO ANO S U T, then "pref" if set;
 *       and "rel=PORT" of its ports.
 *
 * Retries (for up to SECONDS, default 60): UNIT ATTENTION (counted as
 * "ua=N"), NOT READY / LOGICAL UNIT NOT ACCESSIBLE, ASYMMETRIC ACCESS
 * STATE TRANSITION 04/0A (counted as "transition=N", retried after 200 ms).
 * Anything else fails (exit 2). The counts are printed on success.
 */
#include <iscsi/iscsi.h>
#include <iscsi/scsi-lowlevel.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tc_iscsi.h"

#define SECT 512

static struct iscsi_context *connect_url(const char *url, int *lun)
{
	return tc_iscsi_connect(url, "iqn.2026-11.io.tiercache:alua-io", ISCSI_HEADER_DIGEST_NONE, 30, true, lun);
}

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int n_ua, n_transition;

/* Run one command with the retries above; the task (GOOD) or NULL. */
static struct scsi_task *run(struct iscsi_context *c, int lun, unsigned char *cdb, int cdb_len, int dir,
			     int xfer, unsigned char *out, double secs)
{
	double t0 = now_s();
	for (;;) {
		struct scsi_task *t = scsi_create_task(cdb_len, cdb, dir, xfer);
		struct iscsi_data d = { .size = (size_t)(dir == SCSI_XFER_WRITE ? xfer : 0), .data = out };
		if (!t)
			return NULL;
		if (!iscsi_scsi_command_sync(c, lun, t, dir == SCSI_XFER_WRITE ? &d : NULL)) {
			fprintf(stderr, "transport error: %s\n", iscsi_get_error(c));
			scsi_free_scsi_task(t);
			return NULL;
		}
		if (t->status == SCSI_STATUS_GOOD)
			return t;
		int key = t->sense.key, asc = t->sense.ascq;
		bool retry = false;
		if (t->status == SCSI_STATUS_CHECK_CONDITION && key == SCSI_SENSE_UNIT_ATTENTION) {
			n_ua++;
			retry = true;
		} else if (t->status == SCSI_STATUS_CHECK_CONDITION && key == SCSI_SENSE_NOT_READY && asc == 0x040a) {
			n_transition++;
			retry = true;
			usleep(200000);
		}
		if (!retry || now_s() - t0 > secs) {
			fprintf(stderr, "command 0x%02x failed: status 0x%02x sense %x/%02x/%02x (%s)\n", cdb[0],
				t->status, key, asc >> 8, asc & 0xff, iscsi_get_error(c));
			scsi_free_scsi_task(t);
			return NULL;
		}
		scsi_free_scsi_task(t);
	}
}

static void put32(unsigned char *p, uint32_t v)
{
	p[0] = (unsigned char)(v >> 24);
	p[1] = (unsigned char)(v >> 16);
	p[2] = (unsigned char)(v >> 8);
	p[3] = (unsigned char)v;
}

static const char *state_name(int s)
{
	switch (s) {
	case 0: return "AO";
	case 1: return "ANO";
	case 2: return "S";
	case 3: return "U";
	case 0xf: return "T";
	}
	return "?";
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: alua_io write|read URL LBA BLOCKS BYTE [SECONDS] | alua_io loop URL LBA "
				"BLOCKS SLOTS STOPFILE | alua_io sync|rtpg URL\n");
		return 2;
	}
	const char *op = argv[1];
	int lun;
	struct iscsi_context *c = connect_url(argv[2], &lun);
	if (!c)
		return 2;
	int rc = 0;
	if (!strcmp(op, "rtpg")) {
		unsigned char cdb[12] = { 0xa3, 0x0a | 0x20 };
		put32(cdb + 6, 1024);
		struct scsi_task *t = run(c, lun, cdb, 12, SCSI_XFER_READ, 1024, NULL, 30);
		if (!t) {
			rc = 2;
		} else {
			unsigned char *b = t->datain.data;
			int n = t->datain.size;
			uint32_t len = n >= 4 ? (uint32_t)(b[0] << 24 | b[1] << 16 | b[2] << 8 | b[3]) : 0;
			int off = (n > 4 && (b[4] & 0x70) == 0x10) ? 8 : 4;
			while (off + 8 <= n && (uint32_t)off < len + 4) {
				int ports = b[off + 7];
				printf("%u %s%s", b[off + 2] << 8 | b[off + 3], state_name(b[off] & 0x0f),
				       (b[off] & 0x80) ? " pref" : "");
				for (int i = 0; i < ports && off + 8 + 4 * i + 4 <= n; i++)
					printf(" rel=%u", b[off + 8 + 4 * i + 2] << 8 | b[off + 8 + 4 * i + 3]);
				printf("\n");
				off += 8 + 4 * ports;
			}
			scsi_free_scsi_task(t);
		}
	} else if (!strcmp(op, "sync")) {
		unsigned char sc[10] = { 0x35 };
		struct scsi_task *t = run(c, lun, sc, 10, SCSI_XFER_NONE, 0, NULL, 60);
		if (!t) {
			rc = 2;
		} else {
			scsi_free_scsi_task(t);
			printf("ua=%d transition=%d\n", n_ua, n_transition);
		}
	} else if ((!strcmp(op, "loop") || !strcmp(op, "wloop")) && argc >= 7) {
		bool verify = !strcmp(op, "loop");
		uint32_t base = (uint32_t)strtoul(argv[3], NULL, 0);
		int blocks = atoi(argv[4]);
		unsigned slots = (unsigned)strtoul(argv[5], NULL, 0);
		const char *stop = argv[6];
		int bytes = blocks * SECT;
		unsigned char *buf = malloc((size_t)bytes);
		unsigned rounds = 0;
		double last = now_s(), maxgap = 0;
		for (; rc == 0 && slots && access(stop, F_OK) != 0; rounds++) {
			/* round r: slot r % SLOTS, every byte r & 0xff but the first
			 * four of each block, which hold r */
			uint32_t lba = base + (rounds % slots) * (uint32_t)blocks;
			unsigned char wcdb[10] = { 0x2a }, rcdb[10] = { 0x28 };
			put32(wcdb + 2, lba);
			put32(rcdb + 2, lba);
			wcdb[8] = rcdb[8] = (unsigned char)blocks;
			wcdb[7] = rcdb[7] = (unsigned char)(blocks >> 8);
			memset(buf, (int)(rounds & 0xff), (size_t)bytes);
			for (int b = 0; b < blocks; b++)
				put32(buf + b * SECT, rounds);
			struct scsi_task *t = run(c, lun, wcdb, 10, SCSI_XFER_WRITE, bytes, buf, 60);
			double now = now_s();
			if (!t) {
				rc = 2;
				break;
			}
			scsi_free_scsi_task(t);
			maxgap = now - last > maxgap ? now - last : maxgap;
			last = now;
			if (!verify) {
				if (rounds == 0) {
					printf("started\n");
					fflush(stdout);
				}
				continue;
			}
			t = run(c, lun, rcdb, 10, SCSI_XFER_READ, bytes, NULL, 60);
			now = now_s();
			if (!t) {
				rc = 2;
				break;
			}
			maxgap = now - last > maxgap ? now - last : maxgap;
			last = now;
			if (t->datain.size != bytes || memcmp(t->datain.data, buf, (size_t)bytes)) {
				fprintf(stderr, "round %u: LBA %u did not read back as written\n", rounds, lba);
				rc = 3;
			}
			scsi_free_scsi_task(t);
			if (rounds == 0) {
				printf("started\n");
				fflush(stdout);
			}
		}
		free(buf);
		printf("rounds=%u maxgap_ms=%.0f ua=%d transition=%d\n", rounds, maxgap * 1000, n_ua, n_transition);
	} else if ((!strcmp(op, "write") || !strcmp(op, "read")) && argc >= 6) {
		uint32_t lba = (uint32_t)strtoul(argv[3], NULL, 0);
		int blocks = atoi(argv[4]);
		int byte = (int)strtol(argv[5], NULL, 0);
		double secs = argc > 6 ? atof(argv[6]) : 60;
		int bytes = blocks * SECT;
		unsigned char *buf = malloc((size_t)bytes);
		unsigned char cdb[10] = { 0 };
		put32(cdb + 2, lba);
		cdb[7] = (unsigned char)(blocks >> 8);
		cdb[8] = (unsigned char)blocks;
		if (!strcmp(op, "write")) {
			memset(buf, byte, (size_t)bytes);
			cdb[0] = 0x2a;
			struct scsi_task *t = run(c, lun, cdb, 10, SCSI_XFER_WRITE, bytes, buf, secs);
			if (!t) {
				rc = 2;
			} else {
				scsi_free_scsi_task(t);
				unsigned char sc[10] = { 0x35 };
				t = run(c, lun, sc, 10, SCSI_XFER_NONE, 0, NULL, secs);
				if (!t)
					rc = 2;
				else
					scsi_free_scsi_task(t);
			}
		} else {
			cdb[0] = 0x28;
			struct scsi_task *t = run(c, lun, cdb, 10, SCSI_XFER_READ, bytes, NULL, secs);
			if (!t) {
				rc = 2;
			} else {
				int bad = t->datain.size != bytes;
				for (int i = 0; !bad && i < bytes; i++)
					bad = t->datain.data[i] != byte;
				printf("first=0x%02x ", t->datain.size > 0 ? t->datain.data[0] : 0);
				rc = bad ? 3 : 0;
				scsi_free_scsi_task(t);
			}
		}
		free(buf);
		if (rc != 2)
			printf("ua=%d transition=%d\n", n_ua, n_transition);
	} else {
		fprintf(stderr, "alua_io: unknown command %s\n", op);
		rc = 2;
	}
	iscsi_logout_sync(c);
	iscsi_destroy_context(c);
	return rc;
}
