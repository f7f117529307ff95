/*
 * caw_beat.c - an ATS heartbeat as ESXi sends it: COMPARE AND WRITE of one
 * block, again and again, each time comparing with what the last one wrote
 * and writing a new stamp, and how long each took.
 *
 *   caw_beat URL LBA COUNT INTERVAL_MS [TIMEOUT_S]
 *
 * Reads the block, then sends COUNT COMPARE AND WRITEs of it, one every
 * INTERVAL_MS (or back to back after a slow one), each bounded by
 * TIMEOUT_S (default 10): without an answer by then it prints "caws I: no
 * answer within T s" and exits 1, as it does when the login and the first
 * read take longer. Only this client writes the block, so every MISCOMPARE
 * is a false one. At the end it prints
 *   caws N p50_ms X p99_ms X p999_ms X max_ms X miscompares N errors N
 * (caws: the ones answered) and exits 0 when all COUNT completed GOOD, 1
 * otherwise (2: usage).
 */
#include <iscsi/iscsi.h>
#include <iscsi/scsi-lowlevel.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile int current = -1; /* the CAW in flight, -1: login or the first read */
static int timeout_s;

/* A command without an answer: say which, and stop (libiscsi's own
 * timeout does not end a synchronous wait). */
static void on_alarm(int sig)
{
	(void)sig;
	char m[96];
	int n = snprintf(m, sizeof(m), "caws %d: no answer within %d s\n", current, timeout_s);
	if (write(1, m, (size_t)n) < 0)
		_exit(1);
	_exit(1);
}

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double pct(const double *v, int n, double p)
{
	int i = (int)(p * (n - 1) + 0.5);
	return n ? v[i] : 0;
}

int main(int argc, char **argv)
{
	if (argc < 5) {
		fprintf(stderr, "usage: caw_beat URL LBA COUNT INTERVAL_MS [TIMEOUT_S]\n");
		return 2;
	}
	unsigned long long lba = strtoull(argv[2], NULL, 0);
	int count = atoi(argv[3]), interval = atoi(argv[4]);
	int timeout = argc > 5 ? atoi(argv[5]) : 10;
	timeout_s = timeout;
	signal(SIGALRM, on_alarm);
	alarm((unsigned)timeout);
	struct iscsi_context *is = iscsi_create_context("iqn.2026-11.test:caw-beat");
	struct iscsi_url *u = is ? iscsi_parse_full_url(is, argv[1]) : NULL;
	if (!u || count <= 0) {
		fprintf(stderr, "bad URL or count\n");
		return 2;
	}
	iscsi_set_session_type(is, ISCSI_SESSION_NORMAL);
	iscsi_set_header_digest(is, ISCSI_HEADER_DIGEST_NONE);
	iscsi_set_timeout(is, timeout);
	if (iscsi_full_connect_sync(is, u->portal, u->lun) != 0) {
		fprintf(stderr, "login to %s: %s\n", argv[1], iscsi_get_error(is));
		return 1;
	}
	int lun = u->lun;
	struct scsi_task *t = NULL;
	for (int i = 0; i < 10; i++) { /* the new nexus's unit attention */
		t = iscsi_readcapacity16_sync(is, lun);
		if (t && t->status == SCSI_STATUS_GOOD)
			break;
		scsi_free_scsi_task(t);
		t = NULL;
	}
	struct scsi_readcapacity16 *rc = t ? scsi_datain_unmarshall(t) : NULL;
	if (!rc) {
		fprintf(stderr, "READ CAPACITY(16) failed\n");
		return 1;
	}
	size_t bs = rc->block_length;
	scsi_free_scsi_task(t);

	unsigned char *buf = malloc(2 * bs), *old = buf, *neu = buf + bs;
	t = iscsi_read16_sync(is, lun, lba, (uint32_t)bs, (int)bs, 0, 0, 0, 0, 0);
	if (!t || t->status != SCSI_STATUS_GOOD || t->datain.size != (int)bs) {
		fprintf(stderr, "reading block %llu failed\n", lba);
		return 1;
	}
	memcpy(old, t->datain.data, bs);
	scsi_free_scsi_task(t);
	alarm(0);

	double *lat = calloc((size_t)count, sizeof(double));
	int done = 0, miscompares = 0, errors = 0;
	double next = now_ms();
	for (int i = 0; i < count; i++) {
		double w = next - now_ms();
		if (w > 0)
			usleep((useconds_t)(w * 1000));
		next = now_ms() + interval;
		memset(neu, 0, bs);
		snprintf((char *)neu, bs, "caw_beat %d pid %d", i, (int)getpid());
		unsigned char cdb[16] = { 0x89 };
		for (int k = 0; k < 8; k++)
			cdb[2 + k] = (unsigned char)(lba >> (56 - 8 * k));
		cdb[13] = 1;
		struct scsi_task *c = scsi_create_task(16, cdb, SCSI_XFER_WRITE, (int)(2 * bs));
		struct iscsi_data d = { .size = 2 * bs, .data = buf };
		double t0 = now_ms();
		current = i;
		alarm((unsigned)timeout);
		bool sent = iscsi_scsi_command_sync(is, lun, c, &d) != NULL;
		alarm(0);
		if (!sent) {
			fprintf(stderr, "CAW %d: %s after %.0f ms\n", i, iscsi_get_error(is), now_ms() - t0);
			errors++;
			scsi_free_scsi_task(c);
			break; /* the session is gone */
		}
		lat[done++] = now_ms() - t0;
		if (c->status == SCSI_STATUS_GOOD) {
			memcpy(old, neu, bs);
		} else if (c->status == SCSI_STATUS_CHECK_CONDITION && c->sense.key == SCSI_SENSE_MISCOMPARE) {
			miscompares++;
			fprintf(stderr, "CAW %d: false MISCOMPARE\n", i);
		} else {
			errors++;
			fprintf(stderr, "CAW %d: status %02x sense %x/%04x\n", i, c->status, c->sense.key, c->sense.ascq);
		}
		scsi_free_scsi_task(c);
	}
	qsort(lat, (size_t)done, sizeof(double), cmp_double);
	printf("caws %d p50_ms %.2f p99_ms %.2f p999_ms %.2f max_ms %.2f miscompares %d errors %d\n", done,
	       pct(lat, done, 0.5), pct(lat, done, 0.99), pct(lat, done, 0.999), done ? lat[done - 1] : 0.0,
	       miscompares, errors);
	fflush(stdout);
	int ok = done == count && !miscompares && !errors;
	if (ok)
		iscsi_logout_sync(is);
	iscsi_destroy_context(is);
	iscsi_destroy_url(u);
	return ok ? 0 : 1;
}
