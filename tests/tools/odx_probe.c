/*
 * odx_probe.c - ODX (POPULATE TOKEN, WRITE USING TOKEN, RECEIVE ROD TOKEN
 * INFORMATION) as Windows drives it, and what it must refuse.
 *
 *   odx_probe URL_T1 URL_T2 COPY_MIB
 *
 * URL_T1 is a target with LUN 0 (source, at least COPY_MIB + 16 MiB) and
 * LUN 1 (destination, as large); URL_T2 another target with one LUN.
 * Prints "ok: ..." or "FAIL: ..." per check, then the timing of a
 * COPY_MIB MiB copy by ODX against the same copy through the host (read,
 * then write, 1 MiB at a time), and the QD1 read latency of T2's LUN
 * while each runs (printed, not judged). Exit 0 when every check passed.
 */
#include "tc_iscsi.h"

#include <iscsi/scsi-lowlevel.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BS 512u
static int failures;

static void check(int ok, const char *what)
{
	printf("%s: %s\n", ok ? "ok" : "FAIL", what);
	fflush(stdout);
	if (!ok)
		failures++;
}

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void put32(uint8_t *p, uint32_t v) { p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v; }
static void put16(uint8_t *p, uint16_t v) { p[0] = v >> 8; p[1] = v; }
static void put64(uint8_t *p, uint64_t v) { put32(p, v >> 32); put32(p + 4, (uint32_t)v); }
static uint32_t get32(const uint8_t *p) { return (uint32_t)p[0] << 24 | p[1] << 16 | p[2] << 8 | p[3]; }
static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) << 32 | get32(p + 4); }

struct res {
	int status;          /* SCSI status, -1: no answer */
	int key, asc, ascq;
	uint8_t *data;       /* data in (malloc'ed copy) */
	int len;
};

static struct res run(struct iscsi_context *c, int lun, const uint8_t *cdb, int cdb_len, int dir,
		      void *out, int out_len, int in_len)
{
	struct res r = { .status = -1 };
	struct scsi_task *t = scsi_create_task(cdb_len, (unsigned char *)cdb, dir, dir == SCSI_XFER_WRITE ? out_len : in_len);
	struct iscsi_data d = { .size = (size_t)out_len, .data = out };
	if (!t)
		return r;
	if (!iscsi_scsi_command_sync(c, lun, t, dir == SCSI_XFER_WRITE ? &d : NULL)) {
		scsi_free_scsi_task(t);
		return r;
	}
	r.status = t->status;
	if (t->status == SCSI_STATUS_CHECK_CONDITION) {
		r.key = t->sense.key;
		r.asc = t->sense.ascq >> 8;
		r.ascq = t->sense.ascq & 0xff;
	}
	if (t->datain.size > 0) {
		r.data = malloc((size_t)t->datain.size);
		memcpy(r.data, t->datain.data, (size_t)t->datain.size);
		r.len = t->datain.size;
	}
	scsi_free_scsi_task(t);
	return r;
}

static int rw(struct iscsi_context *c, int lun, int write, uint64_t lba, uint32_t blocks, uint8_t *buf)
{
	uint8_t cdb[16] = { write ? 0x8a : 0x88 };
	put64(cdb + 2, lba);
	put32(cdb + 10, blocks);
	struct res r = write ? run(c, lun, cdb, 16, SCSI_XFER_WRITE, buf, (int)(blocks * BS), 0)
			     : run(c, lun, cdb, 16, SCSI_XFER_READ, NULL, 0, (int)(blocks * BS));
	if (!write && r.status == 0 && r.len == (int)(blocks * BS))
		memcpy(buf, r.data, blocks * BS);
	free(r.data);
	return r.status;
}

/* the pattern of source block lba */
static void stamp(uint8_t *b, uint64_t lba, uint32_t seed)
{
	for (unsigned i = 0; i < BS; i += 8) {
		uint64_t v = (lba * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)seed << 32) ^ i;
		memcpy(b + i, &v, 8);
	}
}

struct range {
	uint64_t lba;
	uint32_t n;
};

static struct res populate(struct iscsi_context *c, int lun, uint32_t list_id, uint32_t timeout,
			   const struct range *r, int n)
{
	uint8_t p[16 + 64 * 16] = { 0 };
	int len = 16 + 16 * n;
	put16(p, (uint16_t)(len - 2));
	put32(p + 4, timeout);
	put16(p + 14, (uint16_t)(16 * n));
	for (int i = 0; i < n; i++) {
		put64(p + 16 + 16 * i, r[i].lba);
		put32(p + 24 + 16 * i, r[i].n);
	}
	uint8_t cdb[16] = { 0x83, 0x10 };
	put32(cdb + 6, list_id);
	put32(cdb + 10, (uint32_t)len);
	return run(c, lun, cdb, 16, SCSI_XFER_WRITE, p, len, 0);
}

static struct res rrti(struct iscsi_context *c, int lun, uint32_t list_id)
{
	uint8_t cdb[16] = { 0x84, 0x07 };
	put32(cdb + 2, list_id);
	put32(cdb + 10, 1024);
	return run(c, lun, cdb, 16, SCSI_XFER_READ, NULL, 0, 1024);
}

static struct res wut(struct iscsi_context *c, int lun, uint32_t list_id, const uint8_t *token, uint64_t offset,
		      int del_tkn, const struct range *r, int n)
{
	uint8_t p[536 + 64 * 16] = { 0 };
	int len = 536 + 16 * n;
	put16(p, (uint16_t)(len - 2));
	p[2] = del_tkn ? 0x02 : 0;
	put64(p + 8, offset);
	memcpy(p + 16, token, 512);
	put16(p + 534, (uint16_t)(16 * n));
	for (int i = 0; i < n; i++) {
		put64(p + 536 + 16 * i, r[i].lba);
		put32(p + 544 + 16 * i, r[i].n);
	}
	uint8_t cdb[16] = { 0x83, 0x11 };
	put32(cdb + 6, list_id);
	put32(cdb + 10, (uint32_t)len);
	return run(c, lun, cdb, 16, SCSI_XFER_WRITE, p, len, 0);
}

/* POPULATE TOKEN then RRTI: the token into tok, 0; or -1 */
static int make_token(struct iscsi_context *c, int lun, uint32_t list_id, uint32_t timeout, const struct range *r,
		      int n, uint8_t *tok)
{
	struct res p = populate(c, lun, list_id, timeout, r, n);
	free(p.data);
	if (p.status != 0)
		return -1;
	struct res i = rrti(c, lun, list_id);
	int ok = i.status == 0 && i.len >= 38 + 512 && i.data[5] == 0x01 && get32(i.data + 32) == 0x202;
	if (ok)
		memcpy(tok, i.data + 38, 512);
	free(i.data);
	return ok ? 0 : -1;
}

static int sense_is(struct res r, int key, int asc, int ascq)
{
	return r.status == SCSI_STATUS_CHECK_CONDITION && r.key == key && r.asc == asc && r.ascq == ascq;
}

/* ---- QD1 reads of another LUN, while a copy runs ---- */
static const char *other_url;
static atomic_int lat_run, lat_phase;
static double lat[3][100000];
static int nlat[3];

static void *reader(void *arg)
{
	(void)arg;
	int lun;
	struct iscsi_context *c = tc_iscsi_connect(other_url, "iqn.2026-12.test:odx-reader", ISCSI_HEADER_DIGEST_NONE,
						   30, false, &lun);
	if (!c)
		return NULL;
	uint8_t *b = malloc(4096);
	unsigned seed = 7;
	for (int i = 0; i < 4; i++) /* the nexus's unit attention */
		rw(c, lun, 0, 0, 8, b);
	while (atomic_load(&lat_run)) {
		int ph = atomic_load(&lat_phase);
		uint64_t lba = (uint64_t)(rand_r(&seed) % 4000) * 8;
		double t0 = now_ms();
		if (rw(c, lun, 0, lba, 8, b) != 0)
			break;
		if (nlat[ph] < 100000)
			lat[ph][nlat[ph]++] = now_ms() - t0;
		usleep(2000);
	}
	free(b);
	iscsi_logout_sync(c);
	iscsi_destroy_context(c);
	return NULL;
}

static int cmpd(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double p99(int ph)
{
	if (!nlat[ph])
		return 0;
	qsort(lat[ph], (size_t)nlat[ph], sizeof(double), cmpd);
	return lat[ph][(int)(0.99 * (nlat[ph] - 1))];
}

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: odx_probe URL_T1 URL_T2 COPY_MIB\n");
		return 2;
	}
	int lun0, lun2;
	uint32_t copy_mib = (uint32_t)atoi(argv[3]);
	other_url = argv[2];
	struct iscsi_context *c = tc_iscsi_connect(argv[1], "iqn.2026-12.test:odx-a", ISCSI_HEADER_DIGEST_NONE, 60,
						   false, &lun0);
	struct iscsi_context *b = tc_iscsi_connect(argv[1], "iqn.2026-12.test:odx-b", ISCSI_HEADER_DIGEST_NONE, 60,
						   false, &lun0);
	struct iscsi_context *o = tc_iscsi_connect(argv[2], "iqn.2026-12.test:odx-a", ISCSI_HEADER_DIGEST_NONE, 60,
						   false, &lun2);
	if (!c || !b || !o)
		return 2;
	const int SRC = 0, DST = 1;
	uint8_t *buf = malloc(1u << 20), *buf2 = malloc(1u << 20);
	/* the unit attentions of the new nexuses */
	for (int i = 0; i < 4; i++) {
		rw(c, SRC, 0, 0, 1, buf);
		rw(c, DST, 0, 0, 1, buf);
		rw(b, SRC, 0, 0, 1, buf);
		rw(b, DST, 0, 0, 1, buf);
		rw(o, lun2, 0, 0, 1, buf);
	}

	/* VPD 00h lists 8Fh, and 8Fh has what Windows reads */
	uint8_t inq[6] = { 0x12, 0x01, 0x00, 0x04, 0x00, 0 };
	struct res v = run(c, SRC, inq, 6, SCSI_XFER_READ, NULL, 0, 1024);
	check(v.status == 0 && v.len > 4 && memchr(v.data + 4, 0x8f, (size_t)v.len - 4) != NULL,
	      "VPD page 00h lists the third-party copy page (8Fh)");
	free(v.data);
	inq[2] = 0x8f;
	v = run(c, SRC, inq, 6, SCSI_XFER_READ, NULL, 0, 1024);
	int rod_limits = 0, rod_types = 0;
	for (int off = 4; v.status == 0 && off + 4 <= v.len;) {
		int type = v.data[off] << 8 | v.data[off + 1], dl = v.data[off + 2] << 8 | v.data[off + 3];
		if (type == 0x0000 && dl == 0x20 && (v.data[off + 10] << 8 | v.data[off + 11]) == 64 &&
		    get64(v.data + off + 20) > 0)
			rod_limits = 1;
		if (type == 0x0108 && get32(v.data + off + 8) == 0x00800001 && get32(v.data + off + 72) == 0xffff0001)
			rod_types = 1;
		off += 4 + dl;
	}
	check(rod_limits && rod_types, "VPD 8Fh: block device ROD token limits (64 ranges, a maximum size) and the "
	      "supported ROD types (point-in-time change vulnerable, the zero token)");
	free(v.data);

	/* source blocks 0-16383 stamped */
	for (uint64_t lba = 0; lba < 16384; lba += 2048) {
		for (unsigned k = 0; k < 2048; k++)
			stamp(buf + k * BS, lba + k, 1);
		if (rw(c, SRC, 1, lba, 2048, buf) != 0) {
			check(0, "writing the source pattern");
			return 1;
		}
	}

	/* 1: a token of two ranges, copied to the destination */
	uint8_t tok[512];
	struct range src2[2] = { { 0, 4096 }, { 8192, 4096 } };
	check(make_token(c, SRC, 1, 0, src2, 2, tok) == 0,
	      "POPULATE TOKEN of 2 ranges (4 MiB) and RECEIVE ROD TOKEN INFORMATION give a 512-byte token");
	check(get32(tok) == 0x00800001 && (tok[6] << 8 | tok[7]) == 0x1f8 && get64(tok + 56) == 8192ull * BS,
	      "the token: point in time (change vulnerable), length 1F8h, represents 4 MiB");
	struct range d1 = { 100, 8192 };
	struct res w = wut(c, DST, 2, tok, 0, 0, &d1, 1);
	check(w.status == 0, "WRITE USING TOKEN of the whole token to LBA 100 of the destination: GOOD");
	struct res i = rrti(c, DST, 2);
	check(i.status == 0 && i.len >= 36 && i.data[4] == 0x11 && i.data[5] == 0x01 && get64(i.data + 16) == 8192,
	      "RECEIVE ROD TOKEN INFORMATION for it: completed, 8192 blocks transferred");
	free(i.data);
	int same = 1;
	for (uint64_t k = 0; k < 8192 && same; k += 2048) {
		rw(c, DST, 0, 100 + k, 2048, buf);
		for (unsigned j = 0; j < 2048 && same; j++) {
			uint64_t s = k + j < 4096 ? k + j : 8192 + (k + j - 4096);
			stamp(buf2, s, 1);
			same = !memcmp(buf + j * BS, buf2, BS);
		}
	}
	check(same, "the destination holds both source ranges, in order");

	/* 2: an offset into the token */
	struct range d2 = { 20000, 2048 };
	w = wut(c, DST, 3, tok, 4096 + 100, 0, &d2, 1);
	rw(c, DST, 0, 20000, 2048, buf);
	same = w.status == 0;
	for (unsigned j = 0; j < 2048 && same; j++) {
		stamp(buf2, 8192 + 100 + j, 1);
		same = !memcmp(buf + j * BS, buf2, BS);
	}
	i = rrti(c, DST, 3);
	check(same && i.status == 0 && i.data[5] == 0x03,
	      "an offset into the token copies from there (status: done, part of the token used)");
	free(i.data);

	/* 3: a write to a source range cancels the token */
	struct range s3 = { 0, 2048 };
	uint8_t tok3[512];
	check(make_token(c, SRC, 4, 0, &s3, 1, tok3) == 0, "a token of LBAs 0-2047");
	stamp(buf, 10, 2);
	rw(b, SRC, 1, 10, 1, buf); /* another initiator's write, to block 10 */
	struct range d3 = { 40000, 2048 };
	w = wut(c, DST, 5, tok3, 0, 0, &d3, 1);
	check(sense_is(w, 5, 0x23, 0x08),
	      "after a write to its block 10, WRITE USING TOKEN fails: INVALID TOKEN OPERATION, TOKEN CANCELLED");
	stamp(buf, 10, 1);
	rw(c, SRC, 1, 10, 1, buf); /* the pattern back */
	uint8_t tok3b[512];
	struct range s3b = { 4096, 2048 };
	make_token(c, SRC, 6, 0, &s3b, 1, tok3b);
	stamp(buf, 9000, 2);
	rw(b, SRC, 1, 9000, 1, buf); /* outside its range */
	stamp(buf, 9000, 1);
	rw(c, SRC, 1, 9000, 1, buf);
	w = wut(c, DST, 7, tok3b, 0, 0, &d3, 1);
	check(w.status == 0, "a write outside a token's ranges leaves it valid");

	/* 4: tokens that are not ours, or altered */
	uint8_t bad[512];
	memcpy(bad, tok, 512);
	bad[300] ^= 0x40;
	w = wut(c, DST, 8, bad, 0, 0, &d3, 1);
	check(sense_is(w, 5, 0x23, 0x04), "a token with one secret bit flipped: TOKEN UNKNOWN");
	memcpy(bad, tok, 512);
	put32(bad, 0x12345678);
	w = wut(c, DST, 9, bad, 0, 0, &d3, 1);
	check(sense_is(w, 5, 0x23, 0x01), "a token of another type: UNSUPPORTED TOKEN TYPE");
	memcpy(bad, tok, 512);
	bad[7] = 0x10;
	w = wut(c, DST, 10, bad, 0, 0, &d3, 1);
	check(sense_is(w, 5, 0x23, 0x0a), "a token of another length: INVALID TOKEN LENGTH");

	/* 5: the zero token */
	uint8_t zero[512] = { 0xff, 0xff, 0x00, 0x01 };
	struct range dz = { 100, 64 };
	w = wut(c, DST, 11, zero, 0, 0, &dz, 1);
	rw(c, DST, 0, 100, 64, buf);
	memset(buf2, 0, 64 * BS);
	check(w.status == 0 && !memcmp(buf, buf2, 64 * BS), "the well-known zero token writes zeroes");

	/* 6: another target's nexus may not use it; a reservation refuses it
	 * (a fresh token: the writes of 3 cancelled the first) */
	check(make_token(c, SRC, 21, 0, src2, 2, tok) == 0, "a new token of the two ranges");
	w = wut(o, lun2, 12, tok, 0, 0, &dz, 1);
	check(sense_is(w, 5, 0x23, 0x00), "through another target (whose ACL is its own), the token is refused");
	uint8_t reg[24] = { 0 };
	put64(reg + 8, 0xa1);
	uint8_t pro[10] = { 0x5f, 0x00, 0, 0, 0, 0, 0, 0, 24, 0 };
	struct res pr = run(c, SRC, pro, 10, SCSI_XFER_WRITE, reg, 24, 0);
	free(pr.data);
	memset(reg, 0, sizeof(reg));
	put64(reg, 0xa1);
	pro[1] = 0x01;
	pro[2] = 0x03; /* RESERVE, exclusive access */
	pr = run(c, SRC, pro, 10, SCSI_XFER_WRITE, reg, 24, 0);
	check(pr.status == 0, "initiator A reserves the source LU, exclusive access");
	free(pr.data);
	w = wut(b, DST, 13, tok, 0, 0, &dz, 1);
	check(w.status == SCSI_STATUS_RESERVATION_CONFLICT,
	      "initiator B's WRITE USING TOKEN from the reserved source: RESERVATION CONFLICT");
	w = wut(c, DST, 14, tok, 0, 0, &dz, 1);
	check(w.status == 0, "the holder's own WRITE USING TOKEN goes");
	pro[1] = 0x03; /* CLEAR */
	pro[2] = 0;
	pr = run(c, SRC, pro, 10, SCSI_XFER_WRITE, reg, 24, 0);
	free(pr.data);

	/* 7: DEL_TKN ends the token; an idle token expires */
	w = wut(c, DST, 15, tok, 0, 1, &dz, 1);
	struct res w2 = wut(c, DST, 16, tok, 0, 0, &dz, 1);
	check(w.status == 0 && sense_is(w2, 5, 0x23, 0x04), "after DEL_TKN the token is gone: TOKEN UNKNOWN");
	uint8_t tok7[512];
	make_token(c, SRC, 17, 1, &s3, 1, tok7); /* inactivity timeout 1 s */
	usleep(2200000);
	w = wut(c, DST, 18, tok7, 0, 0, &dz, 1);
	check(sense_is(w, 5, 0x23, 0x07), "a token idle past its 1 s inactivity timeout: TOKEN EXPIRED");

	/* 8: a large copy by ODX against the host's own copy */
	uint64_t big = (uint64_t)copy_mib << 11, base = 32768; /* blocks */
	for (uint64_t lba = 0; lba < big; lba += 2048) {
		for (unsigned k = 0; k < 2048; k++)
			stamp(buf + k * BS, base + lba + k, 3);
		rw(c, SRC, 1, base + lba, 2048, buf);
	}
	pthread_t th;
	atomic_store(&lat_run, 1);
	atomic_store(&lat_phase, 0);
	pthread_create(&th, NULL, reader, NULL);
	usleep(1500000);
	atomic_store(&lat_phase, 1);
	double t0 = now_ms();
	struct range sb = { base, (uint32_t)big }, db = { base, (uint32_t)big };
	uint8_t tokb[512];
	int okb = make_token(c, SRC, 19, 0, &sb, 1, tokb) == 0;
	w = wut(c, DST, 20, tokb, 0, 1, &db, 1);
	double odx_ms = now_ms() - t0;
	atomic_store(&lat_phase, 2);
	t0 = now_ms();
	for (uint64_t lba = 0; lba < big; lba += 2048) {
		rw(c, SRC, 0, base + lba, 2048, buf);
		rw(c, DST, 1, base + big + lba, 2048, buf);
	}
	double host_ms = now_ms() - t0;
	atomic_store(&lat_run, 0);
	pthread_join(th, NULL);
	same = okb && w.status == 0;
	for (uint64_t lba = 0; lba < big && same; lba += 2048) {
		rw(c, DST, 0, base + lba, 2048, buf);
		for (unsigned k = 0; k < 2048 && same; k++) {
			stamp(buf2, base + lba + k, 3);
			same = !memcmp(buf + k * BS, buf2, BS);
		}
	}
	char what[200];
	snprintf(what, sizeof(what), "a %u MiB copy by ODX reads back equal to its source", copy_mib);
	check(same, what);
	printf("timing: %u MiB by ODX %.0f ms, through the host %.0f ms (%.1fx); QD1 4K read p99 of another LUN: "
	       "idle %.2f ms, during ODX %.2f ms, during the host copy %.2f ms (%d/%d/%d reads)\n",
	       copy_mib, odx_ms, host_ms, odx_ms > 0 ? host_ms / odx_ms : 0, p99(0), p99(1), p99(2), nlat[0],
	       nlat[1], nlat[2]);

	iscsi_logout_sync(c);
	iscsi_logout_sync(b);
	iscsi_logout_sync(o);
	printf("%d failed\n", failures);
	return failures ? 1 : 0;
}
