/*
 * stamp_io.c - writer and verifiers of stamped sectors over iSCSI (libiscsi),
 * for the crash tests.
 *
 * Every 512-byte sector written carries a stamp (lba, seq, check) and a body
 * derived from (lba, seq): a sector is either all zero (never written), or
 * exactly one write's bytes, or garbage. seq numbers the writes (not the
 * sectors) in issue order.
 *
 *   stamp_io write URL LOG SEQ0 SECTORS [--sessions N] [--qd N] [--wce 0|1]
 *                  [--fua PCT] [--sync-acks N] [--secs S]
 *       N sessions (default 4) of QD N (default 32) write the first SECTORS
 *       sectors of the LUN with asynchronous WRITE(16)s of 512 B .. 256 KiB,
 *       PCT percent (default 20) with FUA. Two writes whose ranges overlap
 *       are never in flight at once, so a sector's writes complete in seq
 *       order. The caching mode page's WCE is set first (MODE SELECT) and
 *       checked on every session; with WCE=1 a SYNCHRONIZE CACHE goes out
 *       after every --sync-acks acknowledgements (default 150). LOG gets, in
 *       the order things happened:
 *           M wce                  the write cache setting of this run
 *           I seq lba count fua    a write issued
 *           A seq lba count dur    that write acknowledged (GOOD); dur 1: durable
 *                                  at the ack (WCE=0 or FUA), 0: only once a
 *                                  SYNCHRONIZE CACHE issued later completes
 *           Y id                   a SYNCHRONIZE CACHE issued
 *           Z id                   that SYNCHRONIZE CACHE completed (GOOD)
 *       --log-dev: LOG is a block device (a partition), written from its
 *       start with O_DSYNC before each batch of commands goes out (libiscsi
 *       over TCP only queues a command's PDUs; they reach the socket in
 *       iscsi_service) and right after each batch of acknowledgements, so
 *       a power cut leaves on it a prefix of LOG (read it up to the first
 *       NUL byte, drop a partial last line): what the host knew was issued
 *       and acknowledged by then.
 *       The writer ends only when the target goes away (every session lost
 *       its connection and the portal refuses new ones): exit 0. Any other
 *       status than GOOD (CHECK CONDITION, BUSY, a timeout, ...) is printed
 *       and fails it (exit 1), and so do S seconds (default 60) without
 *       the target going away.
 *
 *   stamp_io verify URL SECTORS LOG... [--dump FILE] [--unit N]
 *       Reads every unit of N sectors (default 8) holding a logged sector
 *       twice, the two reads back to back (the mirror alternates legs), and
 *       checks both reads are the same and every logged sector passes the
 *       rule below. --dump writes the first read of each unit to FILE at its
 *       offset.
 *
 *   stamp_io check IMAGE SECTORS LOG...
 *       The same rule for an image file of the LUN (sector i at offset
 *       512 i), e.g. a cache leg's view from tests/tools/leg_read.py.
 *
 * The rule, for one sector: a write is durable when it was acknowledged
 * durable (WCE=0 or FUA), or acknowledged and then a SYNCHRONIZE CACHE issued
 * after its acknowledgement completed (same LOG, i.e. same daemon lifetime). Let D be
 * the highest seq of a durable write of the sector. The sector must hold a
 * write of this sector with seq >= D that was issued (acknowledged or not),
 * or be all zero if no write of it is durable. An older stamp, a stamp
 * never issued for it, or anything else fails.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <iscsi/iscsi.h>
#include <iscsi/scsi-lowlevel.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tc_iscsi.h"

#define SECT 512
#define MAX_SECTORS_PER_WRITE 512 /* 256 KiB */
#define MAX_SESSIONS 16
#define MAX_QD 128

/* ---- stamps ------------------------------------------------------------------------------- */

struct stamp {
	uint64_t lba;   /* sector number */
	uint64_t seq;
	uint64_t check;
};

static uint64_t mix(uint64_t x)
{
	x ^= x >> 31;
	x *= 0x94d049bb133111ebULL;
	x ^= x >> 29;
	return x;
}

static uint64_t check_of(uint64_t lba, uint64_t seq)
{
	return mix(lba * 0x9e3779b97f4a7c15ULL ^ (seq + 0x632be59bd9b4e019ULL) * 0xc2b2ae3d27d4eb4fULL);
}

/* The whole sector of write seq at lba: stamp, then a body derived from both. */
static void fill_sector(uint8_t *p, uint64_t lba, uint64_t seq)
{
	struct stamp s = { lba, seq, check_of(lba, seq) };
	memcpy(p, &s, sizeof(s));
	uint64_t x = s.check | 1;
	for (size_t i = sizeof(s); i < SECT; i += 8) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		memcpy(p + i, &x, 8);
	}
}

enum { SEC_STAMP, SEC_ZERO, SEC_GARBAGE };

/* What sector lba holds: a write's bytes (*seq set), all zero, or garbage. */
static int classify(const uint8_t *p, uint64_t lba, uint64_t *seq)
{
	struct stamp s;
	memcpy(&s, p, sizeof(s));
	*seq = s.seq;
	if (s.lba == lba && s.check == check_of(lba, s.seq)) {
		uint8_t want[SECT];
		fill_sector(want, lba, s.seq);
		return memcmp(want, p, SECT) ? SEC_GARBAGE : SEC_STAMP;
	}
	for (size_t i = 0; i < SECT; i++)
		if (p[i])
			return SEC_GARBAGE;
	*seq = 0;
	return SEC_ZERO;
}

/* ---- misc --------------------------------------------------------------------------------- */

static uint64_t rnd_state;
static uint64_t rnd(void)
{
	rnd_state ^= rnd_state << 13;
	rnd_state ^= rnd_state >> 7;
	rnd_state ^= rnd_state << 17;
	return rnd_state;
}

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static const char *status_name(int st)
{
	switch (st) {
	case SCSI_STATUS_GOOD: return "GOOD";
	case SCSI_STATUS_CHECK_CONDITION: return "CHECK CONDITION";
	case SCSI_STATUS_CONDITION_MET: return "CONDITION MET";
	case SCSI_STATUS_BUSY: return "BUSY";
	case SCSI_STATUS_RESERVATION_CONFLICT: return "RESERVATION CONFLICT";
	case SCSI_STATUS_TASK_SET_FULL: return "TASK SET FULL";
	case SCSI_STATUS_ACA_ACTIVE: return "ACA ACTIVE";
	case SCSI_STATUS_TASK_ABORTED: return "TASK ABORTED";
	case SCSI_STATUS_CANCELLED: return "CANCELLED";
	case SCSI_STATUS_ERROR: return "ERROR";
	case SCSI_STATUS_TIMEOUT: return "TIMEOUT";
	default: return "unknown status";
	}
}

/* "status CHECK CONDITION (0x2), sense key 0x6 ASC/ASCQ 0x2a01 (...)" */
static void describe(char *out, size_t len, struct iscsi_context *c, int status, struct scsi_task *t)
{
	int n = snprintf(out, len, "status %s (0x%x)", status_name(status), status);
	if (status == SCSI_STATUS_CHECK_CONDITION && t)
		snprintf(out + n, len - (size_t)n, ", sense key 0x%x (%s) ASC/ASCQ 0x%04x (%s)", t->sense.key,
			 scsi_sense_key_str(t->sense.key), t->sense.ascq, scsi_sense_ascq_str(t->sense.ascq));
	else if (status != SCSI_STATUS_GOOD)
		snprintf(out + n, len - (size_t)n, ": %s", iscsi_get_error(c));
}

static struct iscsi_context *connect_as(const char *url, const char *who, int *lun)
{
	/* a killed target must end the client, not be reconnected to forever */
	return tc_iscsi_connect(url, who, ISCSI_HEADER_DIGEST_NONE_CRC32C, 10, false, lun);
}

/* Does the portal of url refuse TCP connections (nobody listening)? */
static bool portal_refuses(const char *url)
{
	const char *h = strstr(url, "://");
	h = h ? h + 3 : url;
	char host[64];
	int port = 3260;
	size_t n = strcspn(h, ":/");
	if (n >= sizeof(host))
		return false;
	memcpy(host, h, n);
	host[n] = 0;
	if (h[n] == ':')
		port = atoi(h + n + 1);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	if (inet_pton(AF_INET, host, &a.sin_addr) != 1)
		return false;
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0)
		return false;
	int r = connect(fd, (struct sockaddr *)&a, sizeof(a));
	int e = errno;
	close(fd);
	return r < 0 && e == ECONNREFUSED;
}

/* ---- the caching mode page ------------------------------------------------------------------ */

/* MODE SENSE(6) of the caching page (current values) into page[]; its length, or -1. */
static int sense_caching(struct iscsi_context *c, int lun, uint8_t *page, size_t cap)
{
	unsigned char cdb[6] = { 0x1a, 0x08 /* DBD */, 0x08, 0, 255, 0 };
	struct scsi_task *t = scsi_create_task(6, cdb, SCSI_XFER_READ, 255);
	if (!t)
		return -1;
	struct scsi_task *r = iscsi_scsi_command_sync(c, lun, t, NULL);
	int len = -1;
	if (!r || t->status != SCSI_STATUS_GOOD) {
		char why[256];
		describe(why, sizeof(why), c, r ? t->status : SCSI_STATUS_ERROR, t);
		fprintf(stderr, "MODE SENSE(6) of the caching page: %s\n", why);
	} else if (t->datain.size < 6 || t->datain.data[3] != 0 || (t->datain.data[4] & 0x3f) != 0x08 ||
		   (size_t)t->datain.data[5] + 2 > cap || 4 + (size_t)t->datain.data[5] + 2 > (size_t)t->datain.size) {
		fprintf(stderr, "MODE SENSE(6): no caching page in the %d bytes returned\n", t->datain.size);
	} else {
		len = t->datain.data[5] + 2;
		memcpy(page, t->datain.data + 4, (size_t)len);
	}
	scsi_free_scsi_task(t);
	return len;
}

/* Set WCE of the caching page to want (MODE SELECT(6)), then read it back. 0 or -1. */
static int set_wce(struct iscsi_context *c, int lun, int want)
{
	uint8_t page[64];
	int len = sense_caching(c, lun, page, sizeof(page));
	if (len < 3)
		return -1;
	if (!!(page[2] & 0x04) != want) {
		uint8_t param[4 + 64] = { 0 };
		memcpy(param + 4, page, (size_t)len);
		param[4] &= 0x3f; /* PS is reserved in MODE SELECT */
		param[4 + 2] = (uint8_t)((page[2] & ~0x04) | (want ? 0x04 : 0));
		unsigned char cdb[6] = { 0x15, 0x10 /* PF */, 0, 0, (unsigned char)(4 + len), 0 };
		struct scsi_task *t = scsi_create_task(6, cdb, SCSI_XFER_WRITE, 4 + len);
		if (!t)
			return -1;
		struct iscsi_data d = { .size = (size_t)(4 + len), .data = param };
		struct scsi_task *r = iscsi_scsi_command_sync(c, lun, t, &d);
		if (!r || t->status != SCSI_STATUS_GOOD) {
			char why[256];
			describe(why, sizeof(why), c, r ? t->status : SCSI_STATUS_ERROR, t);
			fprintf(stderr, "MODE SELECT(6) WCE=%d: %s\n", want, why);
			scsi_free_scsi_task(t);
			return -1;
		}
		scsi_free_scsi_task(t);
		if (sense_caching(c, lun, page, sizeof(page)) < 3)
			return -1;
	}
	if (!!(page[2] & 0x04) != want) {
		fprintf(stderr, "the caching page says WCE=%d after MODE SELECT of WCE=%d\n", !!(page[2] & 0x04), want);
		return -1;
	}
	return 0;
}

/* ---- writer ------------------------------------------------------------------------------- */

struct sess {
	struct iscsi_context *c;
	int lun, idx;
	int inflight;
	bool lost;
};

struct wop {
	struct sess *s;
	uint64_t seq, lba;
	uint32_t n;
	int fua;
	int range;          /* index in ranges[] */
	uint8_t *buf;
};

struct sop {
	struct sess *s;
	unsigned id;
};

static struct {
	const char *url;
	int logfd;
	bool log_dev;    /* LOG is a block device, written in place with O_DSYNC */
	uint64_t log_off;
	char *lbuf;
	size_t llen, lcap;
	struct sess sess[MAX_SESSIONS];
	int nsess, qd, wce;
	/* ranges of the writes in flight (or cut off by the kill: those stay reserved) */
	struct {
		uint64_t lba;
		uint32_t n;
		bool used;
	} ranges[MAX_SESSIONS * MAX_QD];
	uint64_t next_seq, sectors;
	long issued, acked, acked_fua, syncs, syncs_done;
	long acks_since_sync;
	int syncs_inflight;
	bool target_gone;
} W;

static void logf_(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void logf_(const char *fmt, ...)
{
	if (W.lcap - W.llen < 128) {
		W.lcap = W.lcap ? W.lcap * 2 : 1 << 16;
		W.lbuf = realloc(W.lbuf, W.lcap);
		if (!W.lbuf) {
			perror("realloc");
			exit(2);
		}
	}
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(W.lbuf + W.llen, W.lcap - W.llen, fmt, ap);
	va_end(ap);
	W.llen += (size_t)n;
}

static void log_flush(void)
{
	size_t off = 0;
	while (off < W.llen) {
		ssize_t n = W.log_dev ? pwrite(W.logfd, W.lbuf + off, W.llen - off, (off_t)W.log_off)
				      : write(W.logfd, W.lbuf + off, W.llen - off);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			perror("write log");
			exit(2);
		}
		off += (size_t)n;
		W.log_off += (uint64_t)n;
	}
	W.llen = 0;
}

static void writer_fail(void) __attribute__((noreturn));
static void writer_fail(void)
{
	log_flush();
	fflush(stdout);
	exit(1);
}

/*
 * A session lost its connection. That may end the writer only if the target
 * is gone: the portal must refuse new connections within 3 s (the daemon's
 * sockets all close as it dies). Otherwise the target dropped a session it
 * should have kept: a failure.
 */
static void session_lost(struct sess *s, const char *how)
{
	if (s->lost)
		return;
	s->lost = true;
	if (W.target_gone)
		return;
	for (int i = 0; i < 300; i++) {
		if (portal_refuses(W.url)) {
			W.target_gone = true;
			return;
		}
		usleep(10000);
	}
	printf("session %d lost its connection (%s: %s) but the portal still accepts connections: the "
	       "target dropped a session it should have kept\n", s->idx, how, iscsi_get_error(s->c));
	writer_fail();
}

static bool range_free(uint64_t lba, uint32_t n)
{
	for (size_t i = 0; i < sizeof(W.ranges) / sizeof(W.ranges[0]); i++)
		if (W.ranges[i].used && lba < W.ranges[i].lba + W.ranges[i].n && W.ranges[i].lba < lba + n)
			return false;
	return true;
}

static int range_take(uint64_t lba, uint32_t n)
{
	for (size_t i = 0; i < sizeof(W.ranges) / sizeof(W.ranges[0]); i++)
		if (!W.ranges[i].used) {
			W.ranges[i].lba = lba;
			W.ranges[i].n = n;
			W.ranges[i].used = true;
			return (int)i;
		}
	return -1;
}

static void write_done(struct iscsi_context *c, int status, void *command_data, void *private_data)
{
	struct wop *w = private_data;
	struct scsi_task *t = command_data;
	w->s->inflight--;
	if (status == SCSI_STATUS_GOOD) {
		logf_("A %llu %llu %u %d\n", (unsigned long long)w->seq, (unsigned long long)w->lba, w->n,
		      !W.wce || w->fua);
		W.acked++;
		W.acked_fua += w->fua;
		W.acks_since_sync++;
		W.ranges[w->range].used = false;
	} else if (status == SCSI_STATUS_CANCELLED) {
		/* the connection went away with the write in flight: it may or may not have landed,
		 * and its range stays reserved (nothing else may overlap it) */
		session_lost(w->s, "a WRITE was cancelled");
	} else {
		char why[256];
		describe(why, sizeof(why), c, status, t);
		printf("session %d: WRITE(16) lba %llu +%u seq %llu%s: %s\n", w->s->idx, (unsigned long long)w->lba,
		       w->n, (unsigned long long)w->seq, w->fua ? " FUA" : "", why);
		writer_fail();
	}
	if (t)
		scsi_free_scsi_task(t);
	free(w->buf);
	free(w);
}

static void sync_done(struct iscsi_context *c, int status, void *command_data, void *private_data)
{
	struct sop *y = private_data;
	struct scsi_task *t = command_data;
	y->s->inflight--;
	W.syncs_inflight--;
	if (status == SCSI_STATUS_GOOD) {
		logf_("Z %u\n", y->id);
		W.syncs_done++;
	} else if (status == SCSI_STATUS_CANCELLED) {
		session_lost(y->s, "a SYNCHRONIZE CACHE was cancelled");
	} else {
		char why[256];
		describe(why, sizeof(why), c, status, t);
		printf("session %d: SYNCHRONIZE CACHE(10) %u: %s\n", y->s->idx, y->id, why);
		writer_fail();
	}
	if (t)
		scsi_free_scsi_task(t);
	free(y);
}

/* 512 B .. 256 KiB, most of them small; half of them 4 KiB aligned. */
static bool pick_write(uint64_t *lba, uint32_t *n)
{
	for (int tries = 0; tries < 8; tries++) {
		uint64_t r = rnd() % 100;
		uint32_t len = r < 40 ? 1 + (uint32_t)(rnd() % 8)
			       : r < 75 ? 9 + (uint32_t)(rnd() % 56) : 65 + (uint32_t)(rnd() % 448);
		uint64_t at;
		if (rnd() & 1) {
			at = rnd() % (W.sectors / 8) * 8;
			len = (len + 7) / 8 * 8;
		} else {
			at = rnd() % W.sectors;
		}
		if (at + len > W.sectors)
			len = (uint32_t)(W.sectors - at);
		if (range_free(at, len)) {
			*lba = at;
			*n = len;
			return true;
		}
	}
	return false;
}

static bool submit_write(struct sess *s, int fua_pct)
{
	uint64_t lba;
	uint32_t n;
	if (!pick_write(&lba, &n))
		return false;
	struct wop *w = calloc(1, sizeof(*w));
	w->buf = malloc((size_t)n * SECT);
	if (!w || !w->buf) {
		perror("malloc");
		exit(2);
	}
	w->s = s;
	w->seq = W.next_seq++;
	w->lba = lba;
	w->n = n;
	w->fua = (int)(rnd() % 100) < fua_pct;
	w->range = range_take(lba, n);
	for (uint32_t i = 0; i < n; i++)
		fill_sector(w->buf + (size_t)i * SECT, lba + i, w->seq);
	logf_("I %llu %llu %u %d\n", (unsigned long long)w->seq, (unsigned long long)lba, n, w->fua);
	W.issued++;
	if (!iscsi_write16_task(s->c, s->lun, lba, w->buf, n * SECT, SECT, 0, 0, w->fua, 0, 0, write_done, w)) {
		/* not even queued: counts as issued and cut off (its range stays reserved) */
		free(w->buf);
		free(w);
		session_lost(s, "WRITE(16) could not be queued");
		return false;
	}
	s->inflight++;
	return true;
}

static void submit_sync(struct sess *s)
{
	struct sop *y = calloc(1, sizeof(*y));
	if (!y) {
		perror("calloc");
		exit(2);
	}
	y->s = s;
	y->id = (unsigned)++W.syncs;
	/* logged before it can be sent: every A line above is covered when it completes */
	logf_("Y %u\n", y->id);
	W.acks_since_sync = 0;
	if (!iscsi_synchronizecache10_task(s->c, s->lun, 0, 0, 0, 0, sync_done, y)) {
		free(y);
		session_lost(s, "SYNCHRONIZE CACHE(10) could not be queued");
		return;
	}
	s->inflight++;
	W.syncs_inflight++;
}

static int do_write(int argc, char **argv)
{
	int nsess = 4, qd = 32, wce = 0, fua_pct = 20, sync_acks = 150;
	double secs = 60;
	static const struct option opts[] = {
		{ "sessions", required_argument, NULL, 's' }, { "qd", required_argument, NULL, 'q' },
		{ "wce", required_argument, NULL, 'w' },      { "fua", required_argument, NULL, 'f' },
		{ "sync-acks", required_argument, NULL, 'y' }, { "secs", required_argument, NULL, 't' },
		{ "log-dev", no_argument, NULL, 'D' },        { NULL, 0, NULL, 0 },
	};
	int o;
	while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (o) {
		case 's': nsess = atoi(optarg); break;
		case 'q': qd = atoi(optarg); break;
		case 'w': wce = atoi(optarg); break;
		case 'f': fua_pct = atoi(optarg); break;
		case 'y': sync_acks = atoi(optarg); break;
		case 't': secs = atof(optarg); break;
		case 'D': W.log_dev = true; break;
		default: return 2;
		}
	}
	if (argc - optind != 4 || nsess < 1 || nsess > MAX_SESSIONS || qd < 1 || qd > MAX_QD || sync_acks < 1) {
		fprintf(stderr, "usage: stamp_io write URL LOG SEQ0 SECTORS [--sessions N] [--qd N] [--wce 0|1] "
				"[--fua PCT] [--sync-acks N] [--secs S] [--log-dev]\n");
		return 2;
	}
	W.url = argv[optind];
	const char *logpath = argv[optind + 1];
	W.next_seq = strtoull(argv[optind + 2], NULL, 0);
	W.sectors = strtoull(argv[optind + 3], NULL, 0);
	W.nsess = nsess;
	W.qd = qd;
	W.wce = wce;
	if (W.next_seq == 0 || W.sectors < 8) {
		fprintf(stderr, "SEQ0 must be > 0 (0 means never written) and SECTORS >= 8\n");
		return 2;
	}
	rnd_state = W.next_seq * 2654435761u + 1;
	W.logfd = W.log_dev ? open(logpath, O_WRONLY | O_DSYNC) : open(logpath, O_WRONLY | O_CREAT | O_APPEND, 0644);
	if (W.logfd < 0) {
		perror(logpath);
		return 2;
	}
	/*
	 * Session 0 sets WCE before the others log in: a nexus that exists when
	 * the mode page changes gets a MODE PARAMETERS CHANGED unit attention,
	 * one that logs in later does not. Each session checks the value.
	 */
	for (int i = 0; i < nsess; i++) {
		char who[96];
		snprintf(who, sizeof(who), "iqn.2026-11.io.tiercache:stamp-io-w%d", i);
		struct sess *s = &W.sess[i];
		s->idx = i;
		s->c = connect_as(W.url, who, &s->lun);
		if (!s->c)
			return 1;
		if (i == 0 && set_wce(s->c, s->lun, wce) < 0)
			return 1;
		uint8_t page[64];
		if (sense_caching(s->c, s->lun, page, sizeof(page)) < 3)
			return 1;
		if (!!(page[2] & 0x04) != wce) {
			fprintf(stderr, "session %d sees WCE=%d, want %d\n", i, !!(page[2] & 0x04), wce);
			return 1;
		}
	}
	logf_("M %d\n", wce);
	log_flush();

	double t0 = now_s();
	struct pollfd pfd[MAX_SESSIONS];
	int map[MAX_SESSIONS];
	double gone_at = 0;
	for (;;) {
		int live = 0;
		for (int i = 0; i < nsess; i++)
			live += !W.sess[i].lost;
		if (!live)
			break;
		if (W.target_gone) {
			/* the others see it too; give them a moment, then cut them off */
			if (!gone_at)
				gone_at = now_s();
			else if (now_s() - gone_at > 2)
				break;
		}
		if (!W.target_gone && now_s() - t0 > secs) {
			printf("the target was still up after %.0f s of writes; nothing killed it\n", secs);
			writer_fail();
		}
		for (int i = 0; i < nsess && !W.target_gone; i++) {
			struct sess *s = &W.sess[i];
			while (!s->lost && s->inflight < qd && submit_write(s, fua_pct))
				;
		}
		if (wce && !W.target_gone && W.acks_since_sync >= sync_acks && W.syncs_inflight < 2) {
			struct sess *s = &W.sess[rnd() % (uint64_t)nsess];
			if (!s->lost)
				submit_sync(s);
		}
		log_flush();
		int n = 0;
		for (int i = 0; i < nsess; i++) {
			if (W.sess[i].lost)
				continue;
			pfd[n].fd = iscsi_get_fd(W.sess[i].c);
			pfd[n].events = (short)iscsi_which_events(W.sess[i].c);
			pfd[n].revents = 0;
			map[n++] = i;
		}
		if (poll(pfd, (nfds_t)n, 100) < 0 && errno != EINTR) {
			perror("poll");
			return 2;
		}
		for (int k = 0; k < n; k++) {
			struct sess *s = &W.sess[map[k]];
			if (s->lost)
				continue;
			if (iscsi_service(s->c, pfd[k].revents) < 0)
				session_lost(s, "iscsi_service failed");
		}
		log_flush(); /* the acknowledgements just received, before anything else goes out */
	}
	log_flush();
	/* the remaining sessions: their commands end as CANCELLED, i.e. cut off */
	for (int i = 0; i < nsess; i++) {
		W.sess[i].lost = true;
		iscsi_destroy_context(W.sess[i].c);
	}
	log_flush();
	close(W.logfd);
	printf("%ld writes issued, %ld acknowledged (%ld with FUA), %ld of %ld syncs completed, WCE=%d; the "
	       "target went away\n", W.issued, W.acked, W.acked_fua, W.syncs_done, W.syncs, wce);
	return 0;
}

/* ---- what each sector may hold -------------------------------------------------------------- */

struct sect {
	uint64_t d;          /* seq of the last durable write, 0: none */
	uint64_t *later;     /* seqs > d issued (not durable), ascending */
	uint32_t n, cap;
	bool logged;
};

struct wrec {
	uint64_t seq, lba;
	uint32_t n;
	bool fua, acked, dur_at_ack, durable;
	long ack_pos;
};

static struct sect *sects;
static uint64_t nsectors;
static long n_durable, n_writes;

static void sect_push(struct sect *e, uint64_t seq)
{
	if (e->n == e->cap) {
		e->cap = e->cap ? e->cap * 2 : 4;
		e->later = realloc(e->later, e->cap * sizeof(*e->later));
		if (!e->later) {
			perror("realloc");
			exit(2);
		}
	}
	e->later[e->n++] = seq;
}

/* One LOG (one daemon lifetime): which writes are durable, then what each sector may hold. */
static int load_log(const char *path)
{
	FILE *f = fopen(path, "r");
	if (!f) {
		perror(path);
		return -1;
	}
	size_t cap = 1024, n = 0;
	struct wrec *w = malloc(cap * sizeof(*w));
	size_t scap = 64;
	long *sync_pos = calloc(scap, sizeof(*sync_pos));
	long pos = 0, covered = -1; /* acks before line `covered` are covered by a completed sync */
	int wce = -1;
	uint64_t seq0 = 0;
	char line[256];
	while (fgets(line, sizeof(line), f)) {
		pos++;
		unsigned long long a, b;
		unsigned c;
		int d;
		if (sscanf(line, "M %d", &d) == 1) {
			wce = d;
		} else if (sscanf(line, "I %llu %llu %u %d", &a, &b, &c, &d) == 4) {
			if (n == 0)
				seq0 = a;
			if (a != seq0 + n || b + c > nsectors || c == 0) {
				fprintf(stderr, "%s:%ld: bad write line (seq %llu, expected %llu; or range outside "
						"%llu sectors)\n", path, pos, a, (unsigned long long)(seq0 + n),
					(unsigned long long)nsectors);
				return -1;
			}
			if (n == cap)
				w = realloc(w, (cap *= 2) * sizeof(*w));
			w[n++] = (struct wrec){ .seq = a, .lba = b, .n = c, .fua = d != 0, .ack_pos = -1 };
		} else if (sscanf(line, "A %llu %llu %u %d", &a, &b, &c, &d) == 4) {
			if (!n || a < seq0 || a - seq0 >= n || w[a - seq0].acked || w[a - seq0].lba != b ||
			    w[a - seq0].n != c) {
				fprintf(stderr, "%s:%ld: acknowledgement of an unknown write\n", path, pos);
				return -1;
			}
			w[a - seq0].acked = true;
			w[a - seq0].dur_at_ack = d != 0;
			w[a - seq0].ack_pos = pos;
		} else if (sscanf(line, "Y %llu", &a) == 1) {
			while (a >= scap) {
				sync_pos = realloc(sync_pos, scap * 2 * sizeof(*sync_pos));
				memset(sync_pos + scap, 0, scap * sizeof(*sync_pos));
				scap *= 2;
			}
			sync_pos[a] = pos;
		} else if (sscanf(line, "Z %llu", &a) == 1) {
			if (a >= scap || !sync_pos[a]) {
				fprintf(stderr, "%s:%ld: completion of an unknown sync\n", path, pos);
				return -1;
			}
			if (sync_pos[a] > covered)
				covered = sync_pos[a];
		} else {
			fprintf(stderr, "%s:%ld: unknown line: %s", path, pos, line);
			return -1;
		}
	}
	fclose(f);
	if (n && wce < 0) {
		fprintf(stderr, "%s: writes but no M line (WCE unknown)\n", path);
		return -1;
	}
	/* in seq order: for one sector that is completion order (no overlapping writes in flight) */
	for (size_t i = 0; i < n; i++) {
		w[i].durable = w[i].acked && (w[i].dur_at_ack || w[i].ack_pos < covered);
		n_durable += w[i].durable;
		n_writes++;
		for (uint64_t s = w[i].lba; s < w[i].lba + w[i].n; s++) {
			struct sect *e = &sects[s];
			e->logged = true;
			if (w[i].durable) {
				e->d = w[i].seq;
				e->n = 0;
			} else {
				sect_push(e, w[i].seq);
			}
		}
	}
	free(w);
	free(sync_pos);
	return 0;
}

static int load_logs(uint64_t sectors, int nlogs, char **logs)
{
	nsectors = sectors;
	sects = calloc(sectors, sizeof(*sects));
	if (!sects) {
		perror("calloc");
		return -1;
	}
	for (int i = 0; i < nlogs; i++)
		if (load_log(logs[i]) < 0)
			return -1;
	return 0;
}

struct tally {
	long checked, bad, newer, zero;
};

/* NULL if sector lba of p may hold what it holds; else why not. *found: its seq. */
static const char *judge(const uint8_t *p, uint64_t lba, uint64_t *found, struct tally *t)
{
	const struct sect *e = &sects[lba];
	int k = classify(p, lba, found);
	if (k == SEC_GARBAGE)
		return "garbage (neither a write's bytes nor zero)";
	if (k == SEC_ZERO) {
		if (e->d)
			return "zero: the durable write was lost";
		t->zero++;
		return NULL;
	}
	if (*found == e->d)
		return NULL;
	if (*found < e->d)
		return "older than the last durable write";
	for (uint32_t i = 0; i < e->n; i++)
		if (e->later[i] == *found) {
			t->newer++;
			return NULL;
		}
	return "a write never issued to this sector after the durable one";
}

static void report(const char *what, uint64_t lba, const char *why, uint64_t found, struct tally *t)
{
	const struct sect *e = &sects[lba];
	if (t->bad++ < 20)
		printf("%s lba %llu: %s (durable seq %llu, found seq %llu, %u later writes allowed)\n", what,
		       (unsigned long long)lba, why, (unsigned long long)e->d, (unsigned long long)found, e->n);
}

/* ---- check an image ------------------------------------------------------------------------ */

static int do_check(int argc, char **argv)
{
	if (argc < 5) {
		fprintf(stderr, "usage: stamp_io check IMAGE SECTORS LOG...\n");
		return 2;
	}
	uint64_t sectors = strtoull(argv[3], NULL, 0);
	if (load_logs(sectors, argc - 4, argv + 4) < 0)
		return 2;
	int fd = open(argv[2], O_RDONLY);
	if (fd < 0) {
		perror(argv[2]);
		return 2;
	}
	uint8_t *img = malloc(sectors * SECT);
	size_t got = 0;
	while (got < sectors * SECT) {
		ssize_t r = pread(fd, img + got, sectors * SECT - got, (off_t)got);
		if (r <= 0) {
			fprintf(stderr, "%s: shorter than %llu sectors\n", argv[2], (unsigned long long)sectors);
			return 2;
		}
		got += (size_t)r;
	}
	close(fd);
	struct tally t = { 0 };
	for (uint64_t s = 0; s < sectors; s++) {
		if (!sects[s].logged)
			continue;
		t.checked++;
		uint64_t found;
		const char *why = judge(img + s * SECT, s, &found, &t);
		if (why)
			report(argv[2], s, why, found, &t);
	}
	printf("%ld sectors checked, %ld bad (%ld hold a write newer than the last durable one, %ld never "
	       "durably written are zero)\n", t.checked, t.bad, t.newer, t.zero);
	return t.bad ? 1 : 0;
}

/* ---- verify over iSCSI ---------------------------------------------------------------------- */

struct pair {
	uint64_t lba;
	uint32_t n;
	struct scsi_task *t[2];
	int status[2];
	int done;
};

static struct {
	struct iscsi_context *c;
	int lun, dumpfd, inflight;
	long units, twoways;
	struct tally t;
	bool failed;
} V;

static void pair_finish(struct pair *p)
{
	bool ok = true;
	for (int k = 0; k < 2; k++) {
		struct scsi_task *t = p->t[k];
		if (p->status[k] != SCSI_STATUS_GOOD || !t || t->datain.size != (int)(p->n * SECT)) {
			char why[256];
			describe(why, sizeof(why), V.c, p->status[k], t);
			printf("READ(16) lba %llu +%u (read %d): %s, %d bytes\n", (unsigned long long)p->lba, p->n, k + 1,
			       why, t ? t->datain.size : 0);
			V.failed = true;
			ok = false;
		}
	}
	if (ok) {
		V.units++;
		const uint8_t *a = p->t[0]->datain.data, *b = p->t[1]->datain.data;
		if (V.dumpfd >= 0 && pwrite(V.dumpfd, a, p->n * SECT, (off_t)(p->lba * SECT)) != (ssize_t)(p->n * SECT)) {
			perror("dump");
			exit(2);
		}
		for (uint32_t i = 0; i < p->n; i++) {
			uint64_t lba = p->lba + i;
			if (lba >= nsectors || !sects[lba].logged)
				continue;
			V.t.checked++;
			uint64_t f1, f2;
			const char *why = judge(a + (size_t)i * SECT, lba, &f1, &V.t);
			if (why)
				report("read 1:", lba, why, f1, &V.t);
			if (memcmp(a + (size_t)i * SECT, b + (size_t)i * SECT, SECT)) {
				classify(b + (size_t)i * SECT, lba, &f2);
				if (V.twoways++ < 20)
					printf("lba %llu reads back two ways: seq %llu, then seq %llu (the legs differ)\n",
					       (unsigned long long)lba, (unsigned long long)f1, (unsigned long long)f2);
				why = judge(b + (size_t)i * SECT, lba, &f2, &V.t);
				if (why)
					report("read 2:", lba, why, f2, &V.t);
			}
		}
	}
	for (int k = 0; k < 2; k++)
		if (p->t[k])
			scsi_free_scsi_task(p->t[k]);
	free(p);
}

struct rd {
	struct pair *p;
	int k;
};

static void read_done(struct iscsi_context *c, int status, void *command_data, void *private_data)
{
	(void)c;
	struct rd *r = private_data;
	struct pair *p = r->p;
	p->t[r->k] = command_data;
	p->status[r->k] = status;
	free(r);
	V.inflight--;
	if (++p->done == 2)
		pair_finish(p);
}

static bool submit_read(struct pair *p, int k)
{
	struct rd *r = malloc(sizeof(*r));
	r->p = p;
	r->k = k;
	if (!iscsi_read16_task(V.c, V.lun, p->lba, p->n * SECT, SECT, 0, 0, 0, 0, 0, read_done, r)) {
		printf("cannot queue READ(16): %s\n", iscsi_get_error(V.c));
		free(r);
		return false;
	}
	V.inflight++;
	return true;
}

static int do_verify(int argc, char **argv)
{
	const char *dump = NULL;
	uint32_t unit = 8;
	static const struct option opts[] = {
		{ "dump", required_argument, NULL, 'd' },
		{ "unit", required_argument, NULL, 'u' },
		{ NULL, 0, NULL, 0 },
	};
	int o;
	while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (o) {
		case 'd': dump = optarg; break;
		case 'u': unit = (uint32_t)atoi(optarg); break;
		default: return 2;
		}
	}
	if (argc - optind < 3 || unit < 1 || unit > MAX_SECTORS_PER_WRITE) {
		fprintf(stderr, "usage: stamp_io verify URL SECTORS LOG... [--dump FILE] [--unit N]\n");
		return 2;
	}
	const char *url = argv[optind];
	uint64_t sectors = strtoull(argv[optind + 1], NULL, 0);
	if (load_logs(sectors, argc - optind - 2, argv + optind + 2) < 0)
		return 2;
	V.dumpfd = -1;
	if (dump) {
		V.dumpfd = open(dump, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		if (V.dumpfd < 0 || ftruncate(V.dumpfd, (off_t)(sectors * SECT)) < 0) {
			perror(dump);
			return 2;
		}
	}
	V.c = connect_as(url, "iqn.2026-11.io.tiercache:stamp-io-v", &V.lun);
	if (!V.c)
		return 1;
	/* Pairs go out back to back on one session: the two reads of a unit are consecutive
	 * reads for the mirror, which alternates legs (unless the cleaner reads in between). */
	uint64_t next = 0;
	for (;;) {
		while (V.inflight < 16 && next < sectors) {
			uint64_t at = next;
			uint32_t n = sectors - at < unit ? (uint32_t)(sectors - at) : unit;
			next += n;
			bool any = false;
			for (uint32_t i = 0; i < n && !any; i++)
				any = sects[at + i].logged;
			if (!any)
				continue;
			struct pair *p = calloc(1, sizeof(*p));
			p->lba = at;
			p->n = n;
			if (!submit_read(p, 0) || !submit_read(p, 1))
				return 1;
		}
		if (!V.inflight)
			break;
		struct pollfd pfd = { .fd = iscsi_get_fd(V.c), .events = (short)iscsi_which_events(V.c) };
		if (poll(&pfd, 1, 1000) < 0 && errno != EINTR) {
			perror("poll");
			return 2;
		}
		if (iscsi_service(V.c, pfd.revents) < 0) {
			printf("the verifier lost its connection: %s\n", iscsi_get_error(V.c));
			return 1;
		}
	}
	iscsi_logout_sync(V.c);
	iscsi_destroy_context(V.c);
	if (V.dumpfd >= 0)
		close(V.dumpfd);
	printf("%ld sectors verified in %ld units read twice, %ld bad, %ld read back two ways (%ld hold a write "
	       "newer than the last durable one, %ld never durably written are zero)\n", V.t.checked, V.units,
	       V.t.bad, V.twoways, V.t.newer, V.t.zero);
	return V.t.bad || V.twoways || V.failed ? 1 : 0;
}

int main(int argc, char **argv)
{
	/* libiscsi sends data-out with writev: a write to the killed target's socket must be an
	 * error (EPIPE: the connection is lost), not a SIGPIPE that ends the writer silently */
	signal(SIGPIPE, SIG_IGN);
	if (argc >= 2 && !strcmp(argv[1], "write"))
		return do_write(argc - 1, argv + 1);
	if (argc >= 2 && !strcmp(argv[1], "verify"))
		return do_verify(argc - 1, argv + 1);
	if (argc >= 2 && !strcmp(argv[1], "check"))
		return do_check(argc, argv);
	fprintf(stderr, "usage: stamp_io write URL LOG SEQ0 SECTORS [options]\n"
			"       stamp_io verify URL SECTORS LOG... [--dump FILE] [--unit N]\n"
			"       stamp_io check IMAGE SECTORS LOG...\n");
	return 2;
}
