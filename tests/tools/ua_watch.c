/*
 * ua_watch.c - hold one iSCSI session open across an event on the target
 * and report the unit attention it brings (libiscsi), for the RBD resize
 * test.
 *
 *   ua_watch URL
 *       Logs in, sends TEST UNIT READY until it is GOOD (the power-on unit
 *       attention of the new nexus is consumed), prints "ready". Then runs
 *       one command per line of stdin on the same session:
 *         rc16      READ CAPACITY(16) until it is GOOD, printing "check KEY
 *                   ASC/ASCQ" for each CHECK CONDITION (e.g. "check 6 2a09")
 *                   and finally "capacity BLOCKS BLOCK_SIZE"
 *         read LBA  one READ(16) of one block: "good", "status XX" or
 *                   "check KEY ASC/ASCQ", and how long it took ("in N ms")
 *       Exit 0 at end of input, 1 on any transport failure.
 */
#include <iscsi/iscsi.h>
#include <iscsi/scsi-lowlevel.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static long long ms_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

static int read1(struct iscsi_context *is, int lun, unsigned long long lba)
{
	long long t0 = ms_now();
	struct scsi_task *t = iscsi_read16_sync(is, lun, lba, 512, 512, 0, 0, 0, 0, 0);
	if (!t) {
		fprintf(stderr, "READ(16): %s\n", iscsi_get_error(is));
		return -1;
	}
	if (t->status == SCSI_STATUS_GOOD)
		printf("good");
	else if (t->status == SCSI_STATUS_CHECK_CONDITION)
		printf("check %x %04x", t->sense.key, t->sense.ascq);
	else
		printf("status %02x", t->status);
	printf(" in %lld ms\n", ms_now() - t0);
	fflush(stdout);
	scsi_free_scsi_task(t);
	return 0;
}

static int rc16(struct iscsi_context *is, int lun)
{
	for (int tries = 0; tries < 10; tries++) {
		struct scsi_task *t = iscsi_readcapacity16_sync(is, lun);
		if (!t) {
			fprintf(stderr, "READ CAPACITY(16): %s\n", iscsi_get_error(is));
			return -1;
		}
		if (t->status == SCSI_STATUS_CHECK_CONDITION) {
			printf("check %x %04x\n", t->sense.key, t->sense.ascq);
			fflush(stdout);
			scsi_free_scsi_task(t);
			continue;
		}
		if (t->status != SCSI_STATUS_GOOD) {
			printf("status %02x\n", t->status);
			fflush(stdout);
			scsi_free_scsi_task(t);
			continue;
		}
		struct scsi_readcapacity16 *r = scsi_datain_unmarshall(t);
		if (!r) {
			fprintf(stderr, "cannot parse READ CAPACITY(16) data\n");
			scsi_free_scsi_task(t);
			return -1;
		}
		printf("capacity %llu %u\n", (unsigned long long)r->returned_lba + 1, r->block_length);
		fflush(stdout);
		scsi_free_scsi_task(t);
		return 0;
	}
	return -1;
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: ua_watch URL\n");
		return 2;
	}
	struct iscsi_context *is = iscsi_create_context("iqn.2026-11.test:ua-watch");
	struct iscsi_url *u = is ? iscsi_parse_full_url(is, argv[1]) : NULL;
	if (!u) {
		fprintf(stderr, "bad URL %s: %s\n", argv[1], is ? iscsi_get_error(is) : "no memory");
		return 2;
	}
	iscsi_set_session_type(is, ISCSI_SESSION_NORMAL);
	iscsi_set_header_digest(is, ISCSI_HEADER_DIGEST_NONE);
	if (iscsi_full_connect_sync(is, u->portal, u->lun) != 0) {
		fprintf(stderr, "login to %s: %s\n", argv[1], iscsi_get_error(is));
		return 1;
	}
	int ok = 0;
	for (int i = 0; i < 10 && !ok; i++) {
		struct scsi_task *t = iscsi_testunitready_sync(is, u->lun);
		if (!t) {
			fprintf(stderr, "TEST UNIT READY: %s\n", iscsi_get_error(is));
			return 1;
		}
		ok = t->status == SCSI_STATUS_GOOD;
		scsi_free_scsi_task(t);
	}
	if (!ok) {
		fprintf(stderr, "TEST UNIT READY never GOOD\n");
		return 1;
	}
	printf("ready\n");
	fflush(stdout);
	char line[64];
	unsigned long long lba;
	while (fgets(line, sizeof(line), stdin)) {
		int r = 0;
		if (!strncmp(line, "rc16", 4))
			r = rc16(is, u->lun);
		else if (sscanf(line, "read %llu", &lba) == 1)
			r = read1(is, u->lun, lba);
		else
			fprintf(stderr, "unknown command %s", line);
		if (r < 0)
			return 1;
	}
	iscsi_logout_sync(is);
	iscsi_destroy_context(is);
	iscsi_destroy_url(u);
	return 0;
}
