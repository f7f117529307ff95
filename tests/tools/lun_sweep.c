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

/* 0 GOOD, 1 retry (UA, NOT READY, transport), -1 another failure */
static int read_one(struct iscsi_context *c, int lun, uint64_t lba, uint32_t blocks)
{
	struct scsi_task *t = iscsi_read16_sync(c, lun, lba, blocks * 512, 512, 0, 0, 0, 0, 0);
	if (!t)
		return 1;
	int r = t->status == SCSI_STATUS_GOOD ? 0
		: t->status == SCSI_STATUS_CHECK_CONDITION && (t->sense.key == SCSI_SENSE_UNIT_ATTENTION ||
							       t->sense.key == SCSI_SENSE_NOT_READY) ? 1 : -1;
	scsi_free_scsi_task(t);
	return r;
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
	int n = atoi(argv[2]), lat_lun = -1, count = 0;
	double wait_s = 120;
	for (int i = 3; i < argc; i++) {
		if (!strcmp(argv[i], "--wait") && i + 1 < argc)
			wait_s = atof(argv[++i]);
		else if (!strcmp(argv[i], "--lat") && i + 2 < argc) {
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
	if (served != n)
		return 1;
	if (lat_lun >= 0 && count > 0) {
		for (uint64_t lba = 0; lba < 2048; lba += 8)
			if (read_one(c, lat_lun, lba, 8) != 0)
				return 1;
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
