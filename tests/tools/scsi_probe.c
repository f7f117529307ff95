/*
 * scsi_probe.c - one iSCSI session (libiscsi) held open while a test
 * changes things on the target, running one command per line of stdin
 * and printing what came back in full, for the thin provisioning test.
 *
 *   scsi_probe URL
 *       Logs in, sends TEST UNIT READY until GOOD (the new nexus's POWER
 *       ON unit attention consumed), prints "ready", then per line:
 *         tur                 TEST UNIT READY
 *         cdb HEX ALLOC       any CDB (hex, no spaces) reading up to ALLOC
 *                             bytes: "good HEX" with the data in
 *         write LBA N BYTE    WRITE(16) of N 512-byte blocks of BYTE (hex)
 *         read LBA N BYTE     READ(16) of N blocks; "good" only if every
 *                             byte is BYTE, else "differs at OFFSET"
 *       A CHECK CONDITION prints "check KEY ASC ASCQ info=N sense=HEX"
 *       (info=- when the INFORMATION field is not valid; sense is the
 *       sense data as the target sent it). Exit 0 at end of input, 1 on a
 *       transport failure.
 */
#include <iscsi/iscsi.h>
#include <iscsi/scsi-lowlevel.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void hex(const unsigned char *p, int n)
{
	for (int i = 0; i < n; i++)
		printf("%02x", p[i]);
}

/* The sense bytes: libiscsi keeps them, length first, in datain. */
static void check(struct scsi_task *t)
{
	const unsigned char *s = NULL;
	int n = 0;
	if (t->datain.size >= 2) {
		n = t->datain.data[0] << 8 | t->datain.data[1];
		s = t->datain.data + 2;
		if (n > t->datain.size - 2)
			n = t->datain.size - 2;
	}
	long long info = -1;
	if (s && n >= 7 && (s[0] & 0x7f) == 0x70 && (s[0] & 0x80))
		info = (long long)((unsigned)s[3] << 24 | s[4] << 16 | s[5] << 8 | s[6]);
	else if (s && n >= 8 && (s[0] & 0x7f) == 0x72) {
		for (int off = 8; off + 12 <= n; off += 2 + s[off + 1])
			if (s[off] == 0 && (s[off + 2] & 0x80)) {
				info = 0;
				for (int i = 0; i < 8; i++)
					info = info << 8 | s[off + 4 + i];
			}
	}
	printf("check %x %02x %02x info=", t->sense.key, (t->sense.ascq >> 8) & 0xff, t->sense.ascq & 0xff);
	if (info >= 0)
		printf("%lld", info);
	else
		printf("-");
	printf(" sense=");
	if (s)
		hex(s, n);
	printf("\n");
}

static int run(struct iscsi_context *is, int lun, unsigned char *cdb, int cdb_len, int dir, unsigned char *data,
	       int len, int expect_byte)
{
	struct scsi_task *t = scsi_create_task(cdb_len, cdb, dir, len);
	if (!t)
		return -1;
	struct iscsi_data d = { .size = (size_t)len, .data = data };
	if (!iscsi_scsi_command_sync(is, lun, t, dir == SCSI_XFER_WRITE ? &d : NULL)) {
		fprintf(stderr, "command: %s\n", iscsi_get_error(is));
		scsi_free_scsi_task(t);
		return -1;
	}
	if (t->status == SCSI_STATUS_CHECK_CONDITION)
		check(t);
	else if (t->status != SCSI_STATUS_GOOD)
		printf("status %02x\n", t->status);
	else if (expect_byte >= 0) {
		int bad = -1;
		for (int i = 0; i < t->datain.size && bad < 0; i++)
			if (t->datain.data[i] != expect_byte)
				bad = i;
		if (t->datain.size != len)
			printf("short %d\n", t->datain.size);
		else if (bad >= 0)
			printf("differs at %d\n", bad);
		else
			printf("good\n");
	} else if (dir == SCSI_XFER_READ) {
		printf("good ");
		hex(t->datain.data, t->datain.size);
		printf("\n");
	} else
		printf("good\n");
	fflush(stdout);
	scsi_free_scsi_task(t);
	return 0;
}

static void rw16(unsigned char *cdb, unsigned char op, unsigned long long lba, unsigned n)
{
	memset(cdb, 0, 16);
	cdb[0] = op;
	for (int i = 0; i < 8; i++)
		cdb[2 + i] = (unsigned char)(lba >> (56 - 8 * i));
	for (int i = 0; i < 4; i++)
		cdb[10 + i] = (unsigned char)(n >> (24 - 8 * i));
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: scsi_probe URL\n");
		return 2;
	}
	struct iscsi_context *is = iscsi_create_context("iqn.2026-11.test:scsi-probe");
	struct iscsi_url *u = is ? iscsi_parse_full_url(is, argv[1]) : NULL;
	if (!u) {
		fprintf(stderr, "bad URL %s\n", argv[1]);
		return 2;
	}
	iscsi_set_session_type(is, ISCSI_SESSION_NORMAL);
	iscsi_set_header_digest(is, ISCSI_HEADER_DIGEST_NONE);
	/* a target that went away (the test stopped it first) fails the
	 * command: libiscsi would otherwise try to log in again for ever, at
	 * 100% CPU, long after the test ended */
	iscsi_set_noautoreconnect(is, 1);
	if (iscsi_full_connect_sync(is, u->portal, u->lun) != 0) {
		fprintf(stderr, "login to %s: %s\n", argv[1], iscsi_get_error(is));
		return 1;
	}
	int lun = u->lun, ok = 0;
	for (int i = 0; i < 10 && !ok; i++) {
		struct scsi_task *t = iscsi_testunitready_sync(is, lun);
		if (!t)
			return 1;
		ok = t->status == SCSI_STATUS_GOOD;
		scsi_free_scsi_task(t);
	}
	if (!ok) {
		fprintf(stderr, "TEST UNIT READY never GOOD\n");
		return 1;
	}
	printf("ready\n");
	fflush(stdout);
	char line[256], hx[80];
	unsigned long long lba;
	unsigned n, byte, alloc;
	while (fgets(line, sizeof(line), stdin)) {
		unsigned char cdb[16];
		int r = 0;
		if (!strncmp(line, "tur", 3)) {
			memset(cdb, 0, 6);
			r = run(is, lun, cdb, 6, SCSI_XFER_NONE, NULL, 0, -1);
		} else if (sscanf(line, "cdb %79s %u", hx, &alloc) == 2) {
			int len = (int)strlen(hx) / 2;
			if (len < 6 || len > 16) {
				fprintf(stderr, "bad CDB %s\n", hx);
				return 2;
			}
			for (int i = 0; i < len; i++)
				sscanf(hx + 2 * i, "%2hhx", &cdb[i]);
			r = run(is, lun, cdb, len, alloc ? SCSI_XFER_READ : SCSI_XFER_NONE, NULL, (int)alloc, -1);
		} else if (sscanf(line, "write %llu %u %x", &lba, &n, &byte) == 3) {
			unsigned char *b = malloc((size_t)n * 512);
			memset(b, (int)byte, (size_t)n * 512);
			rw16(cdb, 0x8a, lba, n);
			r = run(is, lun, cdb, 16, SCSI_XFER_WRITE, b, (int)n * 512, -1);
			free(b);
		} else if (sscanf(line, "read %llu %u %x", &lba, &n, &byte) == 3) {
			rw16(cdb, 0x88, lba, n);
			r = run(is, lun, cdb, 16, SCSI_XFER_READ, NULL, (int)n * 512, (int)byte);
		} else {
			fprintf(stderr, "unknown command %s", line);
		}
		if (r < 0)
			return 1;
	}
	iscsi_logout_sync(is);
	iscsi_destroy_context(is);
	iscsi_destroy_url(u);
	return 0;
}
