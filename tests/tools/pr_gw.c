/*
 * pr_gw.c - a scripted iSCSI client (libiscsi) for persistent reservations
 * across gateways: one login as INITIATOR (a fixed ISID, so each run is
 * the same I_T nexus on a given gateway), then each STEP in order.
 *
 *   pr_gw URL INITIATOR STEP...
 *     reg:KEY[:aptpl]         REGISTER AND IGNORE EXISTING KEY to KEY (0: unregister)
 *     reserve:KEY:TYPE        RESERVE            release:KEY:TYPE   RELEASE
 *     preempt:KEY:SAKEY:TYPE  PREEMPT            pa:KEY:SAKEY:TYPE  PREEMPT AND ABORT
 *     clear:KEY               CLEAR
 *     keys                    READ KEYS: "keys gen=N K1 K2 ..." (hex)
 *     resv                    READ RESERVATION: "resv KEY TYPE" or "resv none"
 *     write:LBA:BYTE          WRITE(10) of one 512-byte block of BYTE
 *     read:LBA                READ(10) of one block: "read LBA GOOD first=0xNN"
 *     tur                     TEST UNIT READY
 *     ssu                     START STOP UNIT (START=1): no data, but a
 *                             reservation of the write kind refuses it
 *     xcopy:CMD:SRC:DST:LBA   EXTENDED COPY (LID1) sent to LUN CMD: one block
 *                             at LBA from LUN SRC to LUN DST (each named by
 *                             its NAA designator, read from VPD 83h first)
 *     token:LUN:LBA           POPULATE TOKEN for one block at LBA of LUN, then
 *                             RECEIVE ROD TOKEN INFORMATION: the token is kept
 *     wut:LUN:LBA             WRITE USING TOKEN of the kept token to one block
 *                             at LBA of LUN (ODX, as Windows copies)
 *     wait:PATH               wait (up to 120 s) until PATH exists, still logged in
 * Each step prints "STEP RESULT ms=T at=A": GOOD, CONFLICT (RESERVATION
 * CONFLICT), BUSY, or CHECK:K/ASC/ASCQ; T is how long it took, A when the
 * answer came (CLOCK_MONOTONIC, ms: comparable across runs of pr_gw). A UNIT ATTENTION is printed as
 * "ua ASC/ASCQ" and the step sent again; NOT READY and BUSY are retried
 * every 200 ms for up to 60 s (a takeover, a gateway reading the state
 * again). The exit status is 0 unless the login or a transport failed.
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

#define SECT 512

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void put32(unsigned char *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (unsigned char)(v >> (24 - 8 * i));
}

static void put64(unsigned char *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (unsigned char)(v >> (56 - 8 * i));
}

static uint64_t get64(const unsigned char *p)
{
	uint64_t v = 0;
	for (int i = 0; i < 8; i++)
		v = v << 8 | p[i];
	return v;
}

/* The ISID from the initiator name: the same name, the same nexus. */
static uint32_t name_hash(const char *s)
{
	uint32_t h = 2166136261u;
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 16777619u;
	return h;
}

/* The NAA designator (VPD 83h, associated with the LU) of lun: its length, 0 if none. */
static int naa_of(struct iscsi_context *c, int lun, unsigned char naa[16])
{
	struct scsi_task *t = iscsi_inquiry_sync(c, lun, 1, 0x83, 255);
	int n = 0;
	if (t && t->status == SCSI_STATUS_GOOD && t->datain.size >= 4) {
		const unsigned char *b = t->datain.data;
		int end = 4 + (b[2] << 8 | b[3]);
		if (end > t->datain.size)
			end = t->datain.size;
		for (int o = 4; o + 4 <= end; o += 4 + b[o + 3]) {
			int len = b[o + 3];
			if ((b[o + 1] & 0x0f) == 3 && !(b[o + 1] & 0x30) && len <= 16 && o + 4 + len <= end) {
				memcpy(naa, b + o + 4, (size_t)len);
				n = len;
				break;
			}
		}
	}
	if (t)
		scsi_free_scsi_task(t);
	return n;
}

/*
 * Run a command; print the outcome. Returns the task when GOOD (the
 * caller frees it), else NULL; *transport set on a transport failure.
 */
static struct scsi_task *run(struct iscsi_context *c, int lun, const char *step, unsigned char *cdb, int cdb_len,
			     int dir, int xfer, unsigned char *out, bool *transport)
{
	double t0 = now_s();
	for (;;) {
		struct scsi_task *t = scsi_create_task(cdb_len, cdb, dir, xfer);
		struct iscsi_data d = { .size = (size_t)(dir == SCSI_XFER_WRITE ? xfer : 0), .data = out };
		if (!t || !iscsi_scsi_command_sync(c, lun, t, dir == SCSI_XFER_WRITE ? &d : NULL)) {
			fprintf(stderr, "%s: transport error: %s\n", step, iscsi_get_error(c));
			if (t)
				scsi_free_scsi_task(t);
			*transport = true;
			return NULL;
		}
		double t1 = now_s();
		int ms = (int)((t1 - t0) * 1000);
		long long at = (long long)(t1 * 1000);
		if (t->status == SCSI_STATUS_GOOD) {
			printf("%s GOOD ms=%d at=%lld", step, ms, at);
			return t;
		}
		int key = t->sense.key, asc = t->sense.ascq;
		if (t->status == SCSI_STATUS_CHECK_CONDITION && key == SCSI_SENSE_UNIT_ATTENTION) {
			printf("ua %02x/%02x\n", asc >> 8, asc & 0xff);
			scsi_free_scsi_task(t);
			continue;
		}
		bool wait = t->status == SCSI_STATUS_BUSY ||
			    (t->status == SCSI_STATUS_CHECK_CONDITION && key == SCSI_SENSE_NOT_READY);
		if (wait && now_s() - t0 < 60) {
			scsi_free_scsi_task(t);
			usleep(200000);
			continue;
		}
		if (t->status == SCSI_STATUS_RESERVATION_CONFLICT)
			printf("%s CONFLICT ms=%d at=%lld\n", step, ms, at);
		else if (t->status == SCSI_STATUS_BUSY)
			printf("%s BUSY ms=%d at=%lld\n", step, ms, at);
		else
			printf("%s CHECK:%x/%02x/%02x ms=%d at=%lld\n", step, key, asc >> 8, asc & 0xff, ms, at);
		scsi_free_scsi_task(t);
		return NULL;
	}
}

static struct scsi_task *prout(struct iscsi_context *c, int lun, const char *step, int sa, int type, uint64_t key,
			       uint64_t sakey, bool aptpl, bool *transport)
{
	unsigned char cdb[10] = { 0x5f, (unsigned char)sa, (unsigned char)type };
	unsigned char p[24] = { 0 };
	put64(p, key);
	put64(p + 8, sakey);
	p[20] = aptpl ? 1 : 0;
	put32(cdb + 5, sizeof(p));
	return run(c, lun, step, cdb, 10, SCSI_XFER_WRITE, sizeof(p), p, transport);
}

/* A third-party copy command (83h) of service action sa with its parameter list p. */
static struct scsi_task *copy_out(struct iscsi_context *c, int lun, const char *step, int sa, uint32_t list_id,
				  unsigned char *p, uint32_t len, bool *transport)
{
	unsigned char cdb[16] = { 0x83, (unsigned char)sa };
	put32(cdb + 6, list_id);
	put32(cdb + 10, len);
	return run(c, lun, step, cdb, 16, SCSI_XFER_WRITE, (int)len, p, transport);
}

/* The ODX token of a token step, for the wut steps after it. */
static unsigned char odx_token[512];

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: pr_gw URL INITIATOR STEP...\n");
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	struct iscsi_context *c = iscsi_create_context(argv[2]);
	if (!c)
		return 2;
	struct iscsi_url *u = iscsi_parse_full_url(c, argv[1]);
	if (!u) {
		fprintf(stderr, "bad URL %s: %s\n", argv[1], iscsi_get_error(c));
		return 2;
	}
	iscsi_set_targetname(c, u->target);
	iscsi_set_session_type(c, ISCSI_SESSION_NORMAL);
	iscsi_set_header_digest(c, ISCSI_HEADER_DIGEST_NONE);
	iscsi_set_isid_random(c, name_hash(argv[2]) & 0xffffff, 0);
	iscsi_set_noautoreconnect(c, 1); /* a gateway gone ends the client, never a reconnect loop */
	iscsi_set_timeout(c, 90);
	int lun = u->lun;
	if (iscsi_full_connect_sync(c, u->portal, u->lun) != 0) {
		fprintf(stderr, "connect %s: %s\n", argv[1], iscsi_get_error(c));
		return 2;
	}
	iscsi_destroy_url(u);
	bool transport = false;
	for (int i = 3; i < argc && !transport; i++) {
		char step[128];
		snprintf(step, sizeof(step), "%s", argv[i]);
		char *f[5] = { 0 };
		int nf = 0;
		for (char *s = strtok(step, ":"); s && nf < 5; s = strtok(NULL, ":"))
			f[nf++] = s;
		const char *name = argv[i];
		struct scsi_task *t = NULL;
		if (!strcmp(f[0], "reg") && nf >= 2) {
			t = prout(c, lun, name, 6, 0, 0, strtoull(f[1], NULL, 16), nf > 2 && !strcmp(f[2], "aptpl"),
				  &transport);
		} else if ((!strcmp(f[0], "reserve") || !strcmp(f[0], "release")) && nf == 3) {
			t = prout(c, lun, name, f[0][2] == 's' ? 1 : 2, atoi(f[2]), strtoull(f[1], NULL, 16), 0, false,
				  &transport);
		} else if ((!strcmp(f[0], "preempt") || !strcmp(f[0], "pa")) && nf == 4) {
			t = prout(c, lun, name, f[0][1] == 'a' ? 5 : 4, atoi(f[3]), strtoull(f[1], NULL, 16),
				  strtoull(f[2], NULL, 16), false, &transport);
		} else if (!strcmp(f[0], "clear") && nf == 2) {
			t = prout(c, lun, name, 3, 0, strtoull(f[1], NULL, 16), 0, false, &transport);
		} else if (!strcmp(f[0], "keys") || !strcmp(f[0], "resv")) {
			bool keys = f[0][0] == 'k';
			unsigned char cdb[10] = { 0x5e, keys ? 0 : 1 };
			cdb[7] = 0x10;
			t = run(c, lun, name, cdb, 10, SCSI_XFER_READ, 4096, NULL, &transport);
			if (t) {
				const unsigned char *b = t->datain.data;
				uint32_t gen = (uint32_t)(b[0] << 24 | b[1] << 16 | b[2] << 8 | b[3]);
				uint32_t len = (uint32_t)(b[4] << 24 | b[5] << 16 | b[6] << 8 | b[7]);
				if (keys) {
					printf(" gen=%u", gen);
					for (uint32_t o = 0; o + 8 <= len && 8 + o + 8 <= (uint32_t)t->datain.size; o += 8)
						printf(" %llx", (unsigned long long)get64(b + 8 + o));
				} else if (len >= 16) {
					printf(" holder=%llx type=%u", (unsigned long long)get64(b + 8), b[8 + 13] & 0x0f);
				} else {
					printf(" none");
				}
			}
		} else if (!strcmp(f[0], "write") && nf == 3) {
			unsigned char buf[SECT];
			memset(buf, (int)strtol(f[2], NULL, 0), sizeof(buf));
			unsigned char cdb[10] = { 0x2a };
			put32(cdb + 2, (uint32_t)strtoul(f[1], NULL, 0));
			cdb[8] = 1;
			t = run(c, lun, name, cdb, 10, SCSI_XFER_WRITE, SECT, buf, &transport);
		} else if (!strcmp(f[0], "read") && nf == 2) {
			unsigned char cdb[10] = { 0x28 };
			put32(cdb + 2, (uint32_t)strtoul(f[1], NULL, 0));
			cdb[8] = 1;
			t = run(c, lun, name, cdb, 10, SCSI_XFER_READ, SECT, NULL, &transport);
			if (t)
				printf(" first=0x%02x", t->datain.size ? t->datain.data[0] : 0);
		} else if (!strcmp(f[0], "wait") && nf == 2) {
			double t0 = now_s();
			while (access(f[1], F_OK) != 0 && now_s() - t0 < 120)
				usleep(50000);
			printf("%s %s\n", name, access(f[1], F_OK) == 0 ? "GOOD" : "TIMEOUT");
			continue;
		} else if (!strcmp(f[0], "tur")) {
			unsigned char cdb[6] = { 0 };
			t = run(c, lun, name, cdb, 6, SCSI_XFER_NONE, 0, NULL, &transport);
		} else if (!strcmp(f[0], "xcopy") && nf == 5) {
			/* two identification CSCD descriptors (E4h), one block-to-block segment (02h) */
			unsigned char p[16 + 2 * 32 + 28] = { 0 }, naa[16];
			int luns[2] = { atoi(f[2]), atoi(f[3]) };
			p[1] = 0x18; /* list identifier not used */
			p[3] = 2 * 32;
			put32(p + 8, 28);
			for (int k = 0; k < 2; k++) {
				unsigned char *d = p + 16 + 32 * k;
				int len = naa_of(c, luns[k], naa);
				if (!len) {
					printf("%s NO-NAA lun=%d\n", name, luns[k]);
					continue;
				}
				d[0] = 0xe4;
				d[4] = 0x01; /* binary */
				d[5] = 0x03; /* associated with the LU, NAA */
				d[7] = (unsigned char)len;
				memcpy(d + 8, naa, (size_t)len);
				d[30] = 0x02; /* block device: disk block length 512 (bytes 29-31) */
			}
			unsigned char *g = p + 16 + 64;
			uint64_t lba = strtoull(f[4], NULL, 0);
			g[0] = 0x02;
			g[3] = 24;
			g[5] = 0; /* source: descriptor 0 */
			g[7] = 1; /* destination: descriptor 1 */
			g[11] = 1; /* one block */
			put64(g + 12, lba);
			put64(g + 20, lba);
			t = copy_out(c, atoi(f[1]), name, 0x00, 0, p, sizeof(p), &transport);
		} else if (!strcmp(f[0], "token") && nf == 3) {
			/* one block range descriptor; list identifier 1; default inactivity timeout */
			unsigned char p[32] = { 0 };
			p[1] = 30;
			p[15] = 16;
			put64(p + 16, strtoull(f[2], NULL, 0));
			put32(p + 24, 1);
			t = copy_out(c, atoi(f[1]), name, 0x10, 1, p, sizeof(p), &transport);
			if (t) {
				scsi_free_scsi_task(t);
				unsigned char rc[16] = { 0x84, 0x07 };
				put32(rc + 2, 1);
				put32(rc + 10, 1024);
				bool tr = false;
				t = run(c, atoi(f[1]), " rrti", rc, 16, SCSI_XFER_READ, 1024, NULL, &tr);
				transport |= tr;
				if (t && t->datain.size >= 38 + 512)
					memcpy(odx_token, t->datain.data + 38, 512);
				else if (t)
					printf(" short");
			}
		} else if (!strcmp(f[0], "wut") && nf == 3) {
			unsigned char p[552] = { 0 };
			p[0] = (sizeof(p) - 2) >> 8; /* data length */
			p[1] = (sizeof(p) - 2) & 0xff;
			memcpy(p + 16, odx_token, 512);
			p[535] = 16;
			put64(p + 536, strtoull(f[2], NULL, 0));
			put32(p + 544, 1);
			t = copy_out(c, atoi(f[1]), name, 0x11, 2, p, sizeof(p), &transport);
		} else if (!strcmp(f[0], "ssu")) {
			unsigned char cdb[6] = { 0x1b, 0, 0, 0, 0x01, 0 };
			t = run(c, lun, name, cdb, 6, SCSI_XFER_NONE, 0, NULL, &transport);
		} else {
			fprintf(stderr, "pr_gw: unknown step %s\n", argv[i]);
			return 2;
		}
		if (t) {
			printf("\n");
			scsi_free_scsi_task(t);
		}
	}
	iscsi_logout_sync(c);
	iscsi_destroy_context(c);
	return transport ? 2 : 0;
}
