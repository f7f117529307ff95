/*
 * tierbench_io.c - sessions, the poll loop, I/O generation and verification.
 *
 * All sessions live on one thread. Each session is a libiscsi context; a
 * job gives every session QD "slots", and a slot is one command kept in
 * flight: when its completion callback runs, the slot records the latency
 * and, unless the run is stopping, issues its next command right away. One
 * poll() covers every session's socket, so N x QD outstanding commands cost
 * no threads and no locks.
 *
 * Verification: with tb_verify_setup() the range is cut into units of the
 * block size. Every 512-byte piece of a written unit carries a stamp (run id,
 * byte offset, generation) and a payload derived from the stamp; the program
 * remembers each unit's last acknowledged generation and checks every read
 * against it. A unit is never read and written at the same time (a slot
 * skips a busy unit), so the expected content is always known.
 */
#include "tools/tierbench.h"

#include <errno.h>
#include <iscsi/iscsi.h>
#include <iscsi/scsi-lowlevel.h>
#include <math.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <inttypes.h>
#include <time.h>

#define STAMP_MAGIC UINT64_C(0x48434e4542524954) /* "TIERBNCH" little-endian */
#define PIECE 512u
#define MAX_UA_RETRIES 8
#define MISMATCH_REPORT_LIMIT 10
#define SPIN_NS 100000u /* open loop: the last 100 us before an arrival, poll without sleeping */

volatile int tb_interrupted;

struct session;

struct slot {
	struct session *s;
	unsigned char *buf;
	struct scsi_iovec iov;
	uint64_t off;           /* byte offset of the command */
	uint64_t unit;          /* verify unit, when verifying */
	uint32_t gen;           /* generation being written */
	uint64_t t_submit;
	uint64_t t_intended;    /* open loop: when the command was due */
	uint64_t t_first;       /* open loop: its first send (t_submit: the last) */
	bool is_read;
	int ua_retries;
};

struct session {
	struct tb_bench *b;
	struct iscsi_context *ctx;
	int idx;
	bool connected;
	uint64_t rng;
	uint64_t seq_start, seq_end, seq_cursor;
	uint64_t phase_ios;     /* commands completed and recorded in this phase */
};

/* What the current phase of a run is doing. */
struct phase {
	const struct tb_job *job;
	struct tb_result *res;      /* NULL: do not record (precondition) */
	bool readback;
	uint64_t readback_cursor;
	uint64_t t_start, t_deadline, t_stop, t_last_done;
	uint64_t count_limit, issued, inflight;
	bool stopping;
	uint64_t checked, mismatches;
	uint64_t tick_ios, tick_lat_ns;  /* for the progress line */
	/* open loop */
	bool open;
	uint64_t next_arrival;      /* intended start of the next command */
	uint64_t arrival_rng;
	bool arrivals_over;         /* the next arrival falls past the deadline */
	struct slot **free_ring;    /* idle slots, used oldest first */
	size_t free_cap, free_head, free_n;
	uint64_t late_max, late_n;
};

struct tb_bench {
	struct session *sess;
	int nsess;
	int lun;
	char portal[MAX_STRING_SIZE + 1];
	char target[MAX_STRING_SIZE + 1];
	uint32_t lbs;
	uint64_t blocks;
	int io_timeout;
	bool rc16_done;

	struct slot *slots;
	size_t nslots;
	uint32_t slot_bs;

	struct phase ph;
	bool failed, closing;
	char err[512];

	/* verification */
	bool verify;
	uint64_t v_off, v_units;
	uint32_t v_bs;
	uint32_t *v_gen;            /* last acknowledged generation, 0 = never written */
	uint8_t *v_busy;
	uint64_t run_id;
	uint64_t mismatches_reported;

	FILE *io_log;               /* --io-log, or NULL */
};

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static double cpu_seconds(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
	       (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

static uint64_t splitmix(uint64_t *state)
{
	uint64_t z = (*state += UINT64_C(0x9e3779b97f4a7c15));
	z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
	z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
	return z ^ (z >> 31);
}

/* The first failure wins; later ones are consequences of it. */
static void fail(struct tb_bench *b, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static void fail(struct tb_bench *b, const char *fmt, ...)
{
	if (b->failed || b->closing)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(b->err, sizeof(b->err), fmt, ap);
	va_end(ap);
	b->failed = true;
	b->ph.stopping = true;
}

/* One round of poll over every session; services what is ready. */
static void pump_ns(struct tb_bench *b, uint64_t timeout_ns)
{
	struct pollfd pfd[b->nsess];
	for (int i = 0; i < b->nsess; i++) {
		struct iscsi_context *ctx = b->sess[i].ctx;
		int ev = ctx ? iscsi_which_events(ctx) : 0;
		pfd[i].fd = ev ? iscsi_get_fd(ctx) : -1;
		pfd[i].events = (short)ev;
		pfd[i].revents = 0;
	}
	struct timespec ts = { .tv_sec = (time_t)(timeout_ns / 1000000000u),
			       .tv_nsec = (long)(timeout_ns % 1000000000u) };
	int n = ppoll(pfd, (nfds_t)b->nsess, &ts, NULL);
	if (n < 0) {
		if (errno != EINTR)
			fail(b, "poll: %s", strerror(errno));
		return;
	}
	for (int i = 0; i < b->nsess && n > 0; i++) {
		if (!pfd[i].revents)
			continue;
		n--;
		if (iscsi_service(b->sess[i].ctx, pfd[i].revents) < 0)
			fail(b, "connection %d to %s lost: %s", i, b->portal,
			     iscsi_get_error(b->sess[i].ctx));
	}
}

static void pump(struct tb_bench *b, int timeout_ms)
{
	pump_ns(b, (uint64_t)timeout_ms * 1000000u);
}

/* libiscsi runs its timeouts only from iscsi_service. */
static void service_timers(struct tb_bench *b)
{
	for (int i = 0; i < b->nsess; i++)
		if (b->sess[i].ctx && iscsi_service(b->sess[i].ctx, 0) < 0)
			fail(b, "connection %d to %s lost: %s", i, b->portal,
			     iscsi_get_error(b->sess[i].ctx));
}

/* ---- connecting ---------------------------------------------------------- */

static void connect_cb(struct iscsi_context *ctx, int status, void *data, void *priv)
{
	struct session *s = priv;
	struct tb_bench *b = s->b;
	(void)data;
	if (status == SCSI_STATUS_GOOD && !s->connected) {
		s->connected = true;
		return;
	}
	if (!s->connected)
		fail(b, "cannot log in to %s at %s (session %d): %s", b->target, b->portal,
		     s->idx, iscsi_get_error(ctx));
	else
		fail(b, "connection %d to %s lost: %s", s->idx, b->portal, iscsi_get_error(ctx));
}

static void rc16_cb(struct iscsi_context *ctx, int status, void *data, void *priv)
{
	struct tb_bench *b = priv;
	struct scsi_task *task = data;
	b->rc16_done = true;
	if (status != SCSI_STATUS_GOOD) {
		fail(b, "READ CAPACITY(16) on %s LUN %d failed: %s", b->target, b->lun,
		     status == SCSI_STATUS_CHECK_CONDITION ?
		     scsi_sense_ascq_str(task->sense.ascq) : iscsi_get_error(ctx));
	} else {
		struct scsi_readcapacity16 *rc = scsi_datain_unmarshall(task);
		if (!rc || !rc->block_length || rc->block_length % 512) {
			fail(b, "READ CAPACITY(16) on %s LUN %d returned no usable block size",
			     b->target, b->lun);
		} else {
			b->lbs = rc->block_length;
			b->blocks = rc->returned_lba + 1;
		}
	}
	if (task)
		scsi_free_scsi_task(task);
}

struct tb_bench *tb_connect(const struct tb_connect_opts *o, char *err, size_t errlen)
{
	struct tb_bench *b = calloc(1, sizeof(*b));
	if (!b) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	b->nsess = o->sessions;
	b->io_timeout = o->io_timeout;
	b->sess = calloc((size_t)o->sessions, sizeof(*b->sess));
	if (!b->sess) {
		snprintf(err, errlen, "out of memory");
		free(b);
		return NULL;
	}
	uint64_t seed = now_ns();
	for (int i = 0; i < b->nsess; i++) {
		struct session *s = &b->sess[i];
		s->b = b;
		s->idx = i;
		s->rng = splitmix(&seed);
		s->ctx = iscsi_create_context(o->initiator);
		if (!s->ctx) {
			snprintf(err, errlen, "cannot create an iSCSI context (initiator name \"%s\")",
				 o->initiator);
			goto fail;
		}
		/* Parsing with the context also hands it the URL's CHAP credentials. */
		struct iscsi_url *url = iscsi_parse_full_url(s->ctx, o->url);
		if (!url) {
			snprintf(err, errlen, "bad URL: %s", iscsi_get_error(s->ctx));
			goto fail;
		}
		snprintf(b->portal, sizeof(b->portal), "%s", url->portal);
		snprintf(b->target, sizeof(b->target), "%s", url->target);
		b->lun = url->lun;
		iscsi_set_targetname(s->ctx, url->target);
		iscsi_set_session_type(s->ctx, ISCSI_SESSION_NORMAL);
		iscsi_set_header_digest(s->ctx, o->header_digest ? ISCSI_HEADER_DIGEST_CRC32C :
					ISCSI_HEADER_DIGEST_NONE);
		iscsi_set_noautoreconnect(s->ctx, 1);
		iscsi_set_timeout(s->ctx, o->login_timeout);
		int rc = iscsi_full_connect_async(s->ctx, url->portal, url->lun, connect_cb, s);
		iscsi_destroy_url(url);
		if (rc) {
			snprintf(err, errlen, "cannot connect to %s: %s", b->portal,
				 iscsi_get_error(s->ctx));
			goto fail;
		}
	}

	uint64_t deadline = now_ns() + (uint64_t)o->login_timeout * 1000000000u;
	for (;;) {
		int up = 0;
		for (int i = 0; i < b->nsess; i++)
			up += b->sess[i].connected;
		if (up == b->nsess || b->failed || tb_interrupted)
			break;
		if (now_ns() > deadline) {
			fail(b, "no answer from %s within %d s (%d of %d sessions logged in to %s)",
			     b->portal, o->login_timeout, up, b->nsess, b->target);
			break;
		}
		pump(b, 100);
		service_timers(b);
	}
	if (!b->failed && tb_interrupted)
		fail(b, "interrupted while logging in");
	if (!b->failed) {
		if (!iscsi_readcapacity16_task(b->sess[0].ctx, b->lun, rc16_cb, b))
			fail(b, "cannot send READ CAPACITY(16): %s", iscsi_get_error(b->sess[0].ctx));
		while (!b->rc16_done && !b->failed && now_ns() < deadline)
			pump(b, 100);
		if (!b->rc16_done)
			fail(b, "no answer to READ CAPACITY(16) from %s within %d s", b->portal,
			     o->login_timeout);
	}
	if (b->failed) {
		snprintf(err, errlen, "%s", b->err);
		goto fail;
	}
	for (int i = 0; i < b->nsess; i++)
		iscsi_set_timeout(b->sess[i].ctx, o->io_timeout);
	return b;
fail:
	tb_close(b);
	return NULL;
}

void tb_close(struct tb_bench *b)
{
	if (!b)
		return;
	b->closing = true;
	for (int i = 0; i < b->nsess; i++) {
		if (!b->sess[i].ctx)
			continue;
		/* a clean logout when nothing is in flight; otherwise just drop */
		if (b->sess[i].connected && !b->failed && !b->ph.inflight)
			iscsi_logout_sync(b->sess[i].ctx);
		iscsi_destroy_context(b->sess[i].ctx);
	}
	for (size_t i = 0; i < b->nslots; i++)
		free(b->slots[i].buf);
	free(b->slots);
	free(b->sess);
	free(b->v_gen);
	free(b->v_busy);
	free(b);
}

void tb_set_io_log(struct tb_bench *b, FILE *f)
{
	b->io_log = f;
}

uint32_t tb_block_size(const struct tb_bench *b) { return b->lbs; }
uint64_t tb_capacity(const struct tb_bench *b) { return b->blocks * b->lbs; }
const char *tb_portal(const struct tb_bench *b) { return b->portal; }

/* ---- verification -------------------------------------------------------- */

int tb_verify_setup(struct tb_bench *b, uint64_t offset, uint64_t span, uint32_t bs,
		    uint64_t seed, char *err, size_t errlen)
{
	b->v_off = offset;
	b->v_bs = bs;
	b->v_units = span / bs;
	b->v_gen = calloc(b->v_units, sizeof(*b->v_gen));
	b->v_busy = calloc(b->v_units, 1);
	if (!b->v_gen || !b->v_busy) {
		snprintf(err, errlen, "out of memory for %llu verification units",
			 (unsigned long long)b->v_units);
		return -1;
	}
	b->run_id = seed ? seed : now_ns();
	b->verify = true;
	return 0;
}

/* The expected content of one 512-byte piece. */
static void stamp_piece(const struct tb_bench *b, unsigned char *p, uint64_t off, uint32_t gen)
{
	uint64_t w[PIECE / 8];
	w[0] = STAMP_MAGIC;
	w[1] = b->run_id;
	w[2] = off;
	w[3] = gen;
	uint64_t st = b->run_id ^ (off * UINT64_C(0x9e3779b97f4a7c15)) ^ ((uint64_t)gen << 32);
	for (unsigned i = 4; i < PIECE / 8; i++)
		w[i] = splitmix(&st);
	memcpy(p, w, PIECE);
}

static void stamp_unit(const struct tb_bench *b, unsigned char *buf, uint64_t off, uint32_t len,
		       uint32_t gen)
{
	for (uint32_t i = 0; i < len; i += PIECE)
		stamp_piece(b, buf + i, off + i, gen);
}

static void report_mismatch(struct tb_bench *b, uint64_t off, uint32_t want, const unsigned char *got)
{
	if (b->mismatches_reported++ >= MISMATCH_REPORT_LIMIT)
		return;
	uint64_t w[4];
	memcpy(w, got, sizeof(w));
	const char *what;
	char found[160];
	if (w[0] != STAMP_MAGIC || w[1] != b->run_id) {
		what = "no stamp of this run";
		snprintf(found, sizeof(found), "%s", what);
	} else if (w[2] != off) {
		snprintf(found, sizeof(found), "the stamp of byte offset %llu (misplaced data)",
			 (unsigned long long)w[2]);
	} else if (w[3] != want) {
		snprintf(found, sizeof(found), "generation %llu (%s)", (unsigned long long)w[3],
			 w[3] < want ? "stale data" : "a write never acknowledged");
	} else {
		snprintf(found, sizeof(found), "the right stamp but a corrupted payload");
	}
	fprintf(stderr, "tierbench: verify: byte offset %llu (LBA %llu): expected %s%u, found %s\n",
		(unsigned long long)off, (unsigned long long)(off / b->lbs),
		want ? "generation " : "no stamp of this run, generation ", want, found);
}

/* Check a unit just read; returns the number of bad pieces. */
static unsigned check_unit(struct tb_bench *b, const unsigned char *buf, uint64_t off,
			   uint32_t len, uint32_t gen)
{
	unsigned bad = 0;
	unsigned char want[PIECE];
	for (uint32_t i = 0; i < len; i += PIECE) {
		const unsigned char *got = buf + i;
		bool ok;
		if (gen == 0) {
			/* never written by us: anything but our own stamp is fine */
			uint64_t w[2];
			memcpy(w, got, sizeof(w));
			ok = !(w[0] == STAMP_MAGIC && w[1] == b->run_id);
		} else {
			stamp_piece(b, want, off + i, gen);
			ok = !memcmp(want, got, PIECE);
		}
		if (!ok) {
			bad++;
			report_mismatch(b, off + i, gen, got);
		}
	}
	return bad;
}

/* ---- I/O generation ------------------------------------------------------ */

static void io_cb(struct iscsi_context *ctx, int status, void *data, void *priv);

/* Choose the slot's next command. False when there is nothing more to do. */
static bool next_io(struct tb_bench *b, struct slot *sl)
{
	struct phase *ph = &b->ph;
	const struct tb_job *job = ph->job;
	struct session *s = sl->s;
	if (ph->stopping || b->failed)
		return false;
	if (ph->count_limit && ph->issued >= ph->count_limit)
		return false;

	if (ph->readback) {
		while (ph->readback_cursor < b->v_units &&
		       (!b->v_gen[ph->readback_cursor] || b->v_busy[ph->readback_cursor]))
			ph->readback_cursor++;
		if (ph->readback_cursor >= b->v_units)
			return false;
		sl->unit = ph->readback_cursor++;
		sl->off = b->v_off + sl->unit * b->v_bs;
		sl->is_read = true;
		b->v_busy[sl->unit] = 1;
		return true;
	}

	uint64_t r = splitmix(&s->rng);
	sl->is_read = (int)(r % 100) < job->read_pct;
	uint64_t units = job->span / job->bs;
	if (job->sequential) {
		for (;;) {
			sl->off = s->seq_cursor;
			s->seq_cursor += job->bs;
			if (s->seq_cursor + job->bs > s->seq_end)
				s->seq_cursor = s->seq_start;
			if (!b->verify || !b->v_busy[(sl->off - b->v_off) / b->v_bs])
				break;
		}
	} else {
		uint64_t u = (r >> 8) % units;
		while (b->verify && b->v_busy[(job->offset + u * job->bs - b->v_off) / b->v_bs])
			u = (u + 1) % units;
		sl->off = job->offset + u * job->bs;
	}
	if (b->verify) {
		sl->unit = (sl->off - b->v_off) / b->v_bs;
		b->v_busy[sl->unit] = 1;
		if (!sl->is_read) {
			sl->gen = b->v_gen[sl->unit] + 1;
			stamp_unit(b, sl->buf, sl->off, job->bs, sl->gen);
		}
	}
	return true;
}

static void submit(struct tb_bench *b, struct slot *sl)
{
	struct phase *ph = &b->ph;
	uint32_t len = ph->readback ? b->v_bs : ph->job->bs;
	struct iscsi_context *ctx = sl->s->ctx;
	uint64_t lba = sl->off / b->lbs;
	sl->iov.iov_base = sl->buf;
	sl->iov.iov_len = len;
	sl->t_submit = now_ns();
	struct scsi_task *t;
	if (sl->is_read)
		t = iscsi_read16_iov_task(ctx, b->lun, lba, len, (int)b->lbs, 0, 0, 0, 0, 0,
					  io_cb, sl, &sl->iov, 1);
	else
		t = iscsi_write16_iov_task(ctx, b->lun, lba, NULL, len, (int)b->lbs, 0, 0, 0, 0, 0,
					   io_cb, sl, &sl->iov, 1);
	if (!t) {
		fail(b, "cannot queue %s(16) at LBA %llu: %s", sl->is_read ? "READ" : "WRITE",
		     (unsigned long long)lba, iscsi_get_error(ctx));
		return;
	}
	ph->inflight++;
	ph->issued++;
}

/* ---- open loop ------------------------------------------------------------- */

/* Nanoseconds from one arrival to the next: exponential (Poisson
 * arrivals) or fixed. */
static uint64_t arrival_gap(struct phase *ph)
{
	double mean = 1e9 / ph->job->rate;
	if (ph->job->fixed_arrivals)
		return (uint64_t)mean;
	/* u in (0, 1]: 53 random bits */
	double u = ((double)(splitmix(&ph->arrival_rng) >> 11) + 1.0) / 9007199254740992.0;
	return (uint64_t)(-log(u) * mean);
}

static void free_push(struct phase *ph, struct slot *sl)
{
	ph->free_ring[(ph->free_head + ph->free_n++) % ph->free_cap] = sl;
}

static struct slot *free_pop(struct phase *ph)
{
	struct slot *sl = ph->free_ring[ph->free_head];
	ph->free_head = (ph->free_head + 1) % ph->free_cap;
	ph->free_n--;
	return sl;
}

/* Send every arrival that is due while a slot is free. */
static void open_issue(struct tb_bench *b, uint64_t now)
{
	struct phase *ph = &b->ph;
	/* the schedule ends at the deadline, whether or not its next arrival is due */
	if ((ph->t_deadline && ph->next_arrival >= ph->t_deadline) ||
	    (ph->count_limit && ph->issued >= ph->count_limit))
		ph->arrivals_over = true;
	while (!ph->arrivals_over && ph->free_n && ph->next_arrival <= now && !ph->stopping && !b->failed) {
		struct slot *sl = free_pop(ph);
		if (!next_io(b, sl)) {
			free_push(ph, sl);
			ph->arrivals_over = true;
			break;
		}
		sl->t_intended = ph->next_arrival;
		ph->next_arrival += arrival_gap(ph);
		submit(b, sl);
		sl->t_first = sl->t_submit;
		if ((ph->t_deadline && ph->next_arrival >= ph->t_deadline) ||
		    (ph->count_limit && ph->issued >= ph->count_limit))
			ph->arrivals_over = true;
		uint64_t late = sl->t_submit > sl->t_intended ? sl->t_submit - sl->t_intended : 0;
		if (late > ph->late_max)
			ph->late_max = late;
		if (late > 1000000u) /* more than a millisecond: it waited for a slot */
			ph->late_n++;
	}
}

static void io_cb(struct iscsi_context *ctx, int status, void *data, void *priv)
{
	struct slot *sl = priv;
	struct tb_bench *b = sl->s->b;
	struct phase *ph = &b->ph;
	struct scsi_task *task = data;
	uint64_t now = now_ns();
	ph->inflight--;
	if (b->closing) {
		if (task)
			scsi_free_scsi_task(task);
		return;
	}

	if (status == SCSI_STATUS_CHECK_CONDITION && task &&
	    task->sense.key == SCSI_SENSE_UNIT_ATTENTION && sl->ua_retries < MAX_UA_RETRIES) {
		/* a reset or a capacity change: the command was not run, send it again */
		scsi_free_scsi_task(task);
		sl->ua_retries++;
		ph->issued--;
		submit(b, sl);
		return;
	}
	sl->ua_retries = 0;
	if (status != SCSI_STATUS_GOOD) {
		const char *op = sl->is_read ? "READ(16)" : "WRITE(16)";
		unsigned long long lba = (unsigned long long)(sl->off / b->lbs);
		if (status == SCSI_STATUS_CHECK_CONDITION && task)
			fail(b, "target error: %s at LBA %llu: CHECK CONDITION, %s, %s", op, lba,
			     scsi_sense_key_str(task->sense.key), scsi_sense_ascq_str(task->sense.ascq));
		else if (status == SCSI_STATUS_TIMEOUT)
			fail(b, "target error: %s at LBA %llu got no answer within %d s", op, lba,
			     b->io_timeout);
		else if (status == SCSI_STATUS_CANCELLED || status == SCSI_STATUS_ERROR)
			fail(b, "target error: %s at LBA %llu failed: %s", op, lba, iscsi_get_error(ctx));
		else
			fail(b, "target error: %s at LBA %llu: SCSI status 0x%x", op, lba, status);
		if (task)
			scsi_free_scsi_task(task);
		if (b->verify)
			b->v_busy[sl->unit] = 0;
		return;
	}
	scsi_free_scsi_task(task);

	/* from the intended start (open loop) or the first send (a UNIT
	 * ATTENTION resend is part of the command's time) */
	uint64_t sent = ph->open ? sl->t_first : sl->t_submit;
	uint64_t lat = now - (ph->open && !ph->job->from_issue ? sl->t_intended : sent);
	uint32_t len = (uint32_t)sl->iov.iov_len;
	if (b->verify) {
		if (sl->is_read) {
			ph->checked++;
			if (check_unit(b, sl->buf, sl->off, len, b->v_gen[sl->unit]))
				ph->mismatches++;
		} else {
			b->v_gen[sl->unit] = sl->gen;
		}
		b->v_busy[sl->unit] = 0;
	}

	if (ph->t_deadline && now >= ph->t_deadline && !ph->stopping && !ph->open) {
		ph->stopping = true;
		ph->t_stop = ph->t_deadline;
	}
	/* open loop: every command that arrived in the window counts, however
	 * late it ends (leaving the slow ones out would hide the tail) */
	if (ph->res && (!ph->t_stop || now <= ph->t_stop || ph->open)) {
		struct tb_side *side = sl->is_read ? &ph->res->rd : &ph->res->wr;
		side->ios++;
		side->bytes += len;
		tb_hist_add(&side->lat, lat);
		if (ph->open)
			tb_hist_add(&ph->res->service, now - sent);
		ph->t_last_done = now;
		sl->s->phase_ios++;
		if (b->io_log && !ph->readback) {
			uint64_t due = ph->open ? sl->t_intended : sent;
			fprintf(b->io_log, "%" PRIu64 " %" PRIu64 " %" PRIu64 " %c %" PRIu64 "\n",
				due - ph->t_start, sent - ph->t_start, now - ph->t_start,
				sl->is_read ? 'r' : 'w', sl->off / b->lbs);
		}
	}
	ph->tick_ios++;
	ph->tick_lat_ns += lat;

	if (ph->open) {
		free_push(ph, sl);
		open_issue(b, now);
	} else if (next_io(b, sl)) {
		submit(b, sl);
	}
}

/* Slots for sessions x qd commands of bs bytes; write buffers hold random
 * bytes so that no layer can compress or deduplicate them. */
static int prepare_slots(struct tb_bench *b, int sessions, int qd, uint32_t bs, char *err,
			 size_t errlen)
{
	size_t need = (size_t)sessions * (size_t)qd;
	if (need > b->nslots || bs > b->slot_bs) {
		size_t n = need > b->nslots ? need : b->nslots;
		uint32_t sz = bs > b->slot_bs ? bs : b->slot_bs;
		for (size_t i = 0; i < b->nslots; i++)
			free(b->slots[i].buf);
		free(b->slots);
		b->nslots = 0;
		b->slots = calloc(n, sizeof(*b->slots));
		if (!b->slots)
			goto oom;
		uint64_t st = now_ns();
		for (size_t i = 0; i < n; i++) {
			void *p;
			if (posix_memalign(&p, 4096, sz))
				goto oom;
			b->slots[i].buf = p;
			b->nslots = i + 1;
			uint64_t *w = p;
			for (size_t j = 0; j < sz / 8; j++)
				w[j] = splitmix(&st);
		}
		b->slot_bs = sz;
	}
	for (size_t i = 0; i < need; i++)
		b->slots[i].s = &b->sess[i / (size_t)qd];
	return 0;
oom:
	snprintf(err, errlen, "out of memory for %zu buffers of %u bytes", need, bs);
	return -1;
}

static void progress_line(struct tb_bench *b, const char *what, uint64_t now, uint64_t last_tick)
{
	struct phase *ph = &b->ph;
	double dt = (double)(now - last_tick) / 1e9;
	double el = (double)(now - ph->t_start) / 1e9;
	double iops = dt > 0 ? (double)ph->tick_ios / dt : 0;
	double avg_us = ph->tick_ios ? (double)ph->tick_lat_ns / (double)ph->tick_ios / 1e3 : 0;
	uint32_t bs = ph->readback ? b->v_bs : ph->job->bs;
	char bound[32] = "";
	if (ph->t_deadline)
		snprintf(bound, sizeof(bound), "/%.0f", (double)(ph->t_deadline - ph->t_start) / 1e9);
	printf("\r\033[K  %s  %.0f%s s  %.0f IOPS  %.1f MB/s  avg %.0f us  in flight %llu",
	       what, el, bound, iops, iops * bs / 1e6, avg_us, (unsigned long long)ph->inflight);
	fflush(stdout);
	ph->tick_ios = 0;
	ph->tick_lat_ns = 0;
}

/* Run one phase to its end: deadline, count, SIGINT, or nothing left. */
static int run_phase(struct tb_bench *b, const struct tb_job *job, struct tb_result *res,
		     double seconds, uint64_t count, bool readback, int sessions, int qd,
		     bool progress, const char *what, char *err, size_t errlen)
{
	struct phase *ph = &b->ph;
	memset(ph, 0, sizeof(*ph));
	ph->job = job;
	ph->res = res;
	ph->readback = readback;
	ph->count_limit = count;
	for (int i = 0; i < sessions; i++) {
		struct session *s = &b->sess[i];
		s->phase_ios = 0;
		if (job && job->sequential) {
			uint64_t region = job->span / (uint64_t)sessions / job->bs * job->bs;
			s->seq_start = job->offset + (uint64_t)i * region;
			s->seq_end = s->seq_start + region;
			s->seq_cursor = s->seq_start;
		}
	}
	/* open loop: only measured runs (a precondition just fills the cache) */
	ph->open = job && job->rate > 0 && res && !readback;
	if (ph->open) {
		ph->free_cap = (size_t)sessions * (size_t)qd;
		ph->free_ring = calloc(ph->free_cap, sizeof(*ph->free_ring));
		if (!ph->free_ring) {
			snprintf(err, errlen, "out of memory");
			return -1;
		}
		/* slot i is session i / qd's: queue them session by session in turn */
		for (int q = 0; q < qd; q++)
			for (int i = 0; i < sessions; i++)
				free_push(ph, &b->slots[i * qd + q]);
		ph->arrival_rng = job->arrival_seed ? job->arrival_seed : now_ns();
	}
	double cpu0 = cpu_seconds();
	ph->t_start = now_ns();
	if (seconds > 0)
		ph->t_deadline = ph->t_start + (uint64_t)(seconds * 1e9);
	if (ph->open) {
		ph->next_arrival = ph->t_start;
		open_issue(b, ph->t_start);
	} else {
		for (int i = 0; i < sessions * qd; i++)
			if (next_io(b, &b->slots[i]))
				submit(b, &b->slots[i]);
	}

	uint64_t last_tick = ph->t_start;
	while (ph->inflight > 0 || (ph->open && !ph->arrivals_over && !ph->stopping && !b->failed)) {
		uint64_t now = now_ns();
		int timeout = 250;
		if (ph->open) {
			open_issue(b, now);
			uint64_t wait = 250000000u;
			if (!ph->arrivals_over && ph->free_n && !ph->stopping) {
				/* wake a little early and poll without sleeping for the
				 * rest: a timer wake-up can be tens of microseconds late,
				 * and that lag would count as the target's */
				uint64_t due = ph->next_arrival > now ? ph->next_arrival - now : 0;
				wait = due > SPIN_NS ? due - SPIN_NS : 0;
			}
			if (wait > 250000000u)
				wait = 250000000u;
			if (tb_interrupted && !ph->stopping) {
				ph->stopping = true;
				ph->t_stop = now;
			}
			pump_ns(b, wait);
			open_issue(b, now_ns());
		} else {
			if (ph->t_deadline && !ph->stopping) {
				if (now >= ph->t_deadline) {
					ph->stopping = true;
					ph->t_stop = ph->t_deadline;
				} else if ((ph->t_deadline - now) / 1000000 < (uint64_t)timeout) {
					timeout = (int)((ph->t_deadline - now) / 1000000) + 1;
				}
			}
			if (tb_interrupted && !ph->stopping) {
				ph->stopping = true;
				ph->t_stop = now;
			}
			pump(b, timeout);
		}
		now = now_ns();
		if (now - last_tick >= 1000000000u) {
			service_timers(b);
			if (progress)
				progress_line(b, what, now, last_tick);
			last_tick = now;
		}
		if (b->failed)
			break;
	}
	if (progress) {
		printf("\r\033[K");
		fflush(stdout);
	}
	free(ph->free_ring);
	ph->free_ring = NULL;
	if (b->failed) {
		snprintf(err, errlen, "%s", b->err);
		return -1;
	}
	if (res) {
		uint64_t end = ph->t_stop && !ph->open ? ph->t_stop : ph->t_last_done;
		res->send_late_max_ns = ph->late_max;
		res->sent_late = ph->late_n;
		res->elapsed = end > ph->t_start ? (double)(end - ph->t_start) / 1e9 : 0;
		res->client_cpu = cpu_seconds() - cpu0;
		res->session_ios_min = UINT64_MAX;
		res->session_ios_max = 0;
		for (int i = 0; i < sessions; i++) {
			uint64_t n = b->sess[i].phase_ios;
			if (n < res->session_ios_min)
				res->session_ios_min = n;
			if (n > res->session_ios_max)
				res->session_ios_max = n;
		}
		res->interrupted = tb_interrupted != 0;
		res->verify_checked += ph->checked;
		res->verify_mismatches += ph->mismatches;
	}
	return 0;
}

int tb_run(struct tb_bench *b, const struct tb_job *job, struct tb_result *res, bool progress,
	   char *err, size_t errlen)
{
	if (job->sessions > b->nsess) {
		snprintf(err, errlen, "job wants %d sessions, only %d are connected", job->sessions,
			 b->nsess);
		return -1;
	}
	int pre_s = job->pre_sessions ? job->pre_sessions : job->sessions;
	int pre_q = job->pre_qd ? job->pre_qd : job->qd;
	if (pre_s > b->nsess)
		pre_s = b->nsess;
	int slots_s = pre_s > job->sessions ? pre_s : job->sessions;
	int slots_q = pre_q > job->qd ? pre_q : job->qd;
	if (prepare_slots(b, slots_s, slots_q, job->bs, err, errlen))
		return -1;
	memset(res, 0, sizeof(*res));
	res->job = *job;
	tb_hist_reset(&res->rd.lat);
	tb_hist_reset(&res->wr.lat);
	tb_hist_reset(&res->service);
	char what[96];
	if (job->precondition > 0 && !tb_interrupted) {
		snprintf(what, sizeof(what), "precondition %s %dT%dQ", job->name, pre_s, pre_q);
		if (prepare_slots(b, pre_s, pre_q, job->bs, err, errlen))
			return -1;
		/* stats of the precondition are thrown away, its verify checks are not */
		if (run_phase(b, job, NULL, job->precondition, 0, false, pre_s, pre_q,
			      progress, what, err, errlen))
			return -1;
		res->verify_checked += b->ph.checked;
		res->verify_mismatches += b->ph.mismatches;
	}
	/* lay the slots out for this job: slot i belongs to session i / qd */
	if (prepare_slots(b, job->sessions, job->qd, job->bs, err, errlen))
		return -1;
	snprintf(what, sizeof(what), "%s %dT%dQ", job->name, job->sessions, job->qd);
	return run_phase(b, job, res, job->seconds, job->count, false, job->sessions, job->qd,
			 progress, what, err, errlen);
}

int tb_verify_readback(struct tb_bench *b, int sessions, int qd, uint64_t *checked,
		       uint64_t *mismatches, bool progress, char *err, size_t errlen)
{
	if (!b->verify) {
		*checked = *mismatches = 0;
		return 0;
	}
	if (sessions > b->nsess)
		sessions = b->nsess;
	if (prepare_slots(b, sessions, qd, b->v_bs, err, errlen))
		return -1;
	struct tb_result rb;
	memset(&rb, 0, sizeof(rb));
	tb_hist_reset(&rb.rd.lat);
	tb_hist_reset(&rb.wr.lat);
	if (run_phase(b, NULL, &rb, 0, 0, true, sessions, qd, progress, "verify read-back",
		      err, errlen))
		return -1;
	*checked = rb.verify_checked;
	*mismatches = rb.verify_mismatches;
	return 0;
}
