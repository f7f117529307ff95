/*
 * lun_sweep.c - how many LUNs of a target serve, and the read latency of
 * one, for tests/bench/scale_luns.sh (libiscsi, one session).
 *
 *   lun_sweep URL NLUNS [--wait SECONDS]
 *       READ(16) 4 KiB at LBA 0 of LUN 0 .. NLUNS-1 of the URL's target,
 *       each until it is answered GOOD (UNIT ATTENTION and NOT READY are
 *       retried every 10 ms, for at most SECONDS, default 120; the login
 *       too). Prints "served N of NLUNS in MS ms" and exits 0 when all
 *       served, 1 otherwise.
 *   lun_sweep URL NLUNS --lat LUN COUNT
 *       Then COUNT READ(16)s of 4 KiB, one at a time, at random offsets in
 *       the first MiB of LUN (read once first, so they are cache hits), and
 *       prints "lat LUN: avg A p50 B p99 C max D us".
 *   lun_sweep URL NLUNS --loop FIRST LAST STOPFILE
 *       Then, until STOPFILE exists: over LUN FIRST .. LAST in turn, WRITE(16)
 *       4 KiB stamped with (LUN, LBA, round) at a pseudo-random LBA in the
 *       first MiB, and READ(16) it back. UNIT ATTENTION (a reload changes
 *       the LUN inventory) is retried, as a host does; anything else that
 *       is not GOOD, or data that is not what was written, is an error.
 *       Prints "loop: N writes, N reads, N unit attentions, N errors"; exit 3
 *       when there was an error.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tc_iscsi.h"

#include <iscsi/scsi-lowlevel.h>

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* libiscsi sends the LUN field as given: from 256 on, flat space addressing (SAM: 0x4000 | LUN) */
static int wire(int lun)
{
	return lun < 256 ? lun : 0x4000 | lun;
}

/* 0 GOOD, 1 retry (UA, NOT READY, transport), -1 another failure */
static int read_one(struct iscsi_context *c, int lun, uint64_t lba, uint32_t blocks)
{
	struct scsi_task *t = iscsi_read16_sync(c, wire(lun), lba, blocks * 512, 512, 0, 0, 0, 0, 0);
	if (!t)
		return 1;
	int r = t->status == SCSI_STATUS_GOOD ? 0
		: t->status == SCSI_STATUS_CHECK_CONDITION && (t->sense.key == SCSI_SENSE_UNIT_ATTENTION ||
							       t->sense.key == SCSI_SENSE_NOT_READY) ? 1 : -1;
	scsi_free_scsi_task(t);
	return r;
}

/* 0 GOOD, 1 UNIT ATTENTION or no answer yet (retry), -1 another failure */
static int write_one(struct iscsi_context *c, int lun, uint64_t lba, unsigned char *buf)
{
	struct scsi_task *t = iscsi_write16_sync(c, wire(lun), lba, buf, 4096, 512, 0, 0, 0, 0, 0);
	if (!t)
		return -1;
	int r = t->status == SCSI_STATUS_GOOD ? 0
		: t->status == SCSI_STATUS_CHECK_CONDITION && t->sense.key == SCSI_SENSE_UNIT_ATTENTION ? 1 : -1;
	if (r < 0)
		fprintf(stderr, "write lun %d lba %llu: status %d sense %x/%x\n", lun, (unsigned long long)lba,
			t->status, t->sense.key, t->sense.ascq);
	scsi_free_scsi_task(t);
	return r;
}

static int read_into(struct iscsi_context *c, int lun, uint64_t lba, unsigned char *out)
{
	struct scsi_task *t = iscsi_read16_sync(c, wire(lun), lba, 4096, 512, 0, 0, 0, 0, 0);
	if (!t)
		return -1;
	int r = t->status == SCSI_STATUS_GOOD ? 0
		: t->status == SCSI_STATUS_CHECK_CONDITION && t->sense.key == SCSI_SENSE_UNIT_ATTENTION ? 1 : -1;
	if (r == 0) {
		if (t->datain.size != 4096)
			r = -1;
		else
			memcpy(out, t->datain.data, 4096);
	} else if (r < 0) {
		fprintf(stderr, "read lun %d lba %llu: status %d sense %x/%x\n", lun, (unsigned long long)lba,
			t->status, t->sense.key, t->sense.ascq);
	}
	scsi_free_scsi_task(t);
	return r;
}

static unsigned long loop(struct iscsi_context *c, int first, int last, const char *stop)
{
	unsigned char w[4096], r[4096];
	unsigned long writes = 0, reads = 0, uas = 0, errors = 0;
	uint64_t s = 0x9e3779b97f4a7c15ull;
	for (unsigned long round = 1; access(stop, F_OK) != 0; round++)
		for (int l = first; l <= last && errors < 20; l++) {
			s ^= s << 13, s ^= s >> 7, s ^= s << 17;
			uint64_t lba = (s % 256) * 8;
			for (int i = 0; i < 4096; i += 16) {
				uint32_t v[4] = { (uint32_t)l, (uint32_t)lba, (uint32_t)round, (uint32_t)i };
				memcpy(w + i, v, 16);
			}
			int k, tries = 0;
			while ((k = write_one(c, l, lba, w)) == 1 && tries++ < 10)
				uas++;
			if (k != 0) {
				errors++;
				continue;
			}
			writes++;
			tries = 0;
			while ((k = read_into(c, l, lba, r)) == 1 && tries++ < 10)
				uas++;
			if (k != 0) {
				errors++;
				continue;
			}
			reads++;
			if (memcmp(w, r, 4096)) {
				fprintf(stderr, "lun %d lba %llu: read back other data than written\n", l,
					(unsigned long long)lba);
				errors++;
			}
		}
	printf("loop: %lu writes, %lu reads, %lu unit attentions, %lu errors\n", writes, reads, uas, errors);
	fflush(stdout);
	return errors;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: lun_sweep URL NLUNS [--wait S] [--lat LUN COUNT]\n");
		return 2;
	}
	int n = atoi(argv[2]), lat_lun = -1, count = 0, loop_first = -1, loop_last = -1;
	const char *stop = NULL;
	double wait_s = 120;
	for (int i = 3; i < argc; i++) {
		if (!strcmp(argv[i], "--wait") && i + 1 < argc)
			wait_s = atof(argv[++i]);
		else if (!strcmp(argv[i], "--loop") && i + 3 < argc) {
			loop_first = atoi(argv[++i]);
			loop_last = atoi(argv[++i]);
			stop = argv[++i];
		} else if (!strcmp(argv[i], "--lat") && i + 2 < argc) {
			lat_lun = atoi(argv[++i]);
			count = atoi(argv[++i]);
		}
	}
	double t0 = now_ms(), end = t0 + wait_s * 1e3;
	struct iscsi_context *c = NULL;
	int lun0;
	while (!c && now_ms() < end) {
		c = tc_iscsi_connect(argv[1], "iqn.2026-11.io.tiercache:lun-sweep", ISCSI_HEADER_DIGEST_NONE, 30, true,
				     &lun0);
		if (!c)
			usleep(10000);
	}
	if (!c)
		return 1;
	int served = 0;
	for (int l = 0; l < n; l++) {
		int r;
		while ((r = read_one(c, l, 0, 8)) == 1 && now_ms() < end)
			usleep(10000);
		if (r != 0) {
			fprintf(stderr, "lun %d does not serve\n", l);
			break;
		}
		served++;
	}
	printf("served %d of %d in %.0f ms\n", served, n, now_ms() - t0);
	fflush(stdout);
	if (served != n)
		return 1;
	if (stop && loop(c, loop_first, loop_last, stop))
		return 3;
	if (lat_lun >= 0 && count > 0) {
		for (uint64_t lba = 0; lba < 2048; lba += 8) {
			int r, tries = 0;
			while ((r = read_one(c, lat_lun, lba, 8)) == 1 && tries++ < 10)
				; /* the LUN's first unit attention, as a host retries it */
			if (r != 0) {
				fprintf(stderr, "lun %d does not serve\n", lat_lun);
				return 1;
			}
		}
		double *v = calloc((size_t)count, sizeof(*v)), sum = 0;
		uint64_t s = 88172645463325252ull;
		for (int i = 0; i < count; i++) {
			s ^= s << 13, s ^= s >> 7, s ^= s << 17;
			double a = now_ms();
			if (read_one(c, lat_lun, (s % 256) * 8, 8) != 0)
				return 1;
			v[i] = (now_ms() - a) * 1e3;
			sum += v[i];
		}
		qsort(v, (size_t)count, sizeof(*v), cmp_d);
		printf("lat %d: avg %.1f p50 %.1f p99 %.1f max %.1f us\n", lat_lun, sum / count, v[count / 2],
		       v[count * 99 / 100], v[count - 1]);
		free(v);
	}
	iscsi_logout_sync(c);
	iscsi_destroy_context(c);
	return 0;
}
