/*
 * stuck_probe.c - what a host gets from a LUN whose backing store stops
 * answering: io_timeout, task management that ends, and no late write
 * landing over a newer one (tests/test_iscsi_io_timeout.sh).
 *
 *   stuck_probe URL_STUCK URL_OTHER FREEZE_FS_PID IO_TIMEOUT_S
 *
 * URL_STUCK's backing file lives on tests/tools/freeze_fs (pid
 * FREEZE_FS_PID: SIGUSR1 freezes it, SIGUSR2 thaws it); URL_OTHER is
 * another LUN of the same target (the same session, so the same worker),
 * on a file that keeps answering. One session, asynchronous commands:
 *  1. frozen: a 4K WRITE, a 64K READ, SYNCHRONIZE CACHE, UNMAP and GET LBA
 *     STATUS are each answered CHECK CONDITION, ABORTED COMMAND, COMMAND
 *     TIMEOUT DURING PROCESSING (0B/2E/02), no sooner than io_timeout and
 *     within io_timeout + 3 s; meanwhile READs of URL_OTHER keep
 *     answering within a second, and a new session logs in.
 *  2. frozen: ABORT TASK, ABORT TASK SET, LOGICAL UNIT RESET and TARGET
 *     WARM RESET, each over a write stuck since half a second, are
 *     answered FUNCTION COMPLETE within io_timeout + 3 s.
 *  3. frozen: WRITE A of LBA 8 is answered as failed; WRITE B of LBA 8 is
 *     sent, then WRITE C of LBA 8, both waiting behind A; ABORT TASK of C
 *     is answered at once (C never reached the store: it leaves the queue,
 *     well within io_timeout); the store thaws: B completes GOOD and LBA 8
 *     reads back as B (neither A nor the aborted C lands over it).
 *  4. the store has given every held command back (STUCK_PROBE_ALL_BACK,
 *     a shell command, exits 0): 64 READs sent at once on the session,
 *     which take every command slot the held commands used, are all
 *     answered GOOD.
 * Prints "ok: ..." or "FAIL: ..." per check and exits 0 when all passed.
 */
#include <iscsi/iscsi.h>
#include <iscsi/scsi-lowlevel.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#define BS 512

static int failures;
static struct iscsi_context *is;
static int lun_stuck, lun_other;
static pid_t ff_pid;
static double io_timeout_ms;
static double other_max_ms; /* slowest READ of the other LUN while frozen */
static const char *volatile step = "logging in"; /* what the probe waits for now */

/* The last resort, alarm(): say what the probe was waiting for when it ran out. */
static void on_alarm(int sig)
{
	(void)sig;
	const char *a = "FAIL: stuck_probe ran out of time while ", *b = step;
	if (write(1, a, strlen(a)) < 0 || write(1, b, strlen(b)) < 0 || write(1, "\n", 1) < 0)
		_exit(3);
	_exit(3);
}

struct op {
	const char *name;
	struct scsi_task *task;
	bool done;
	int status;
	int key, ascq;
	uint32_t tmf_response;
	double t0, t1;
};

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void check(bool ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void check(bool ok, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	printf("%s: ", ok ? "ok" : "FAIL");
	vprintf(fmt, ap);
	printf("\n");
	fflush(stdout);
	va_end(ap);
	if (!ok)
		failures++;
}

static void op_cb(struct iscsi_context *i, int status, void *data, void *priv)
{
	(void)i;
	struct op *o = priv;
	struct scsi_task *t = data;
	o->done = true;
	o->t1 = now_ms();
	o->status = status;
	if (t && status == SCSI_STATUS_CHECK_CONDITION) {
		o->key = t->sense.key;
		o->ascq = t->sense.ascq;
	}
}

static void tmf_cb(struct iscsi_context *i, int status, void *data, void *priv)
{
	(void)i;
	struct op *o = priv;
	o->done = true;
	o->t1 = now_ms();
	o->status = status;
	o->tmf_response = data ? *(uint32_t *)data : 0xff;
}

/* Serve the session for up to ms milliseconds, or until *flag. */
static void serve(double ms, const bool *flag)
{
	double end = now_ms() + ms;
	while ((!flag || !*flag) && now_ms() < end) {
		struct pollfd p = { .fd = iscsi_get_fd(is), .events = (short)iscsi_which_events(is) };
		int left = (int)(end - now_ms());
		if (poll(&p, 1, left > 100 ? 100 : left < 1 ? 1 : left) < 0)
			break;
		if (iscsi_service(is, p.revents) < 0) {
			fprintf(stderr, "session lost: %s\n", iscsi_get_error(is));
			exit(1);
		}
	}
}

/* A READ of the other LUN, on the same session: its round trip. */
static double read_other(void)
{
	struct op o = { .name = "read other" };
	o.t0 = now_ms();
	o.task = iscsi_read10_task(is, lun_other, 0, 4096, BS, 0, 0, 0, 0, 0, op_cb, &o);
	if (!o.task)
		return 1e9;
	serve(10000, &o.done);
	double ms = o.done && o.status == SCSI_STATUS_GOOD ? o.t1 - o.t0 : 1e9;
	scsi_free_scsi_task(o.task);
	if (ms > other_max_ms)
		other_max_ms = ms;
	return ms;
}

/*
 * READ(10) of 4K at lba, answered within max_ms or NULL: a synchronous
 * call that cannot hang the probe on a command the target never answers.
 */
static struct scsi_task *read_bounded(struct iscsi_context *c, int lun, uint32_t lba, double max_ms)
{
	struct op o = { .name = "read" };
	o.task = iscsi_read10_task(c, lun, lba, 4096, BS, 0, 0, 0, 0, 0, op_cb, &o);
	if (!o.task)
		return NULL;
	if (c == is) {
		serve(max_ms, &o.done);
	} else {
		double end = now_ms() + max_ms;
		while (!o.done && now_ms() < end) {
			struct pollfd p = { .fd = iscsi_get_fd(c), .events = (short)iscsi_which_events(c) };
			if (poll(&p, 1, 100) < 0 || iscsi_service(c, p.revents) < 0)
				break;
		}
	}
	if (!o.done) {
		/* whose side is it on? (a read after the thaw once went
		 * unanswered, seldom, and only under load) */
		printf("read of LBA %u: no answer in %.0f ms; libiscsi holds %d PDU(s), %d of them not sent\n", lba,
		       max_ms, iscsi_queue_length(c), iscsi_out_queue_length(c));
		/* the state of both ends while the read is still unanswered */
		const char *hook = getenv("STUCK_PROBE_ON_HANG");
		if (hook) {
			fflush(stdout);
			if (system(hook) != 0)
				printf("STUCK_PROBE_ON_HANG failed\n");
		}
		/* New bytes on the connection: if the answer comes now, the
		 * target had not read the command (its reader missed it) */
		if (c == is && iscsi_nop_out_async(c, NULL, NULL, 0, NULL) == 0) {
			serve(3000, &o.done);
			check(false, "after a NOP-Out the read %s", o.done ? "was answered at once: the target had not "
			      "read the command until more bytes came" : "is still unanswered");
		}
		if (o.done)
			return o.task;
		iscsi_scsi_cancel_task(c, o.task);
		scsi_free_scsi_task(o.task);
		return NULL;
	}
	return o.task;
}

/* Wait for every op in ops, reading the other LUN every half second. */
static void wait_ops(struct op **ops, int n, double max_ms)
{
	double end = now_ms() + max_ms;
	for (;;) {
		bool all = true;
		for (int i = 0; i < n; i++)
			all = all && ops[i]->done;
		if (all || now_ms() > end)
			return;
		serve(500, NULL);
		read_other();
	}
}

static unsigned char pat_a[4096], pat_b[4096], pat_c[4096];

static struct scsi_task *write_stuck(uint32_t lba, unsigned char *data, struct op *o)
{
	o->t0 = now_ms();
	return o->task = iscsi_write10_task(is, lun_stuck, lba, data, 4096, BS, 0, 0, 0, 0, 0, op_cb, o);
}

static struct iscsi_context *login(const char *url, const char *iqn, int *lun)
{
	struct iscsi_context *c = iscsi_create_context(iqn);
	struct iscsi_url *u = c ? iscsi_parse_full_url(c, url) : NULL;
	if (!u)
		return NULL;
	iscsi_set_session_type(c, ISCSI_SESSION_NORMAL);
	iscsi_set_header_digest(c, ISCSI_HEADER_DIGEST_NONE);
	if (iscsi_full_connect_sync(c, u->portal, u->lun) != 0) {
		fprintf(stderr, "login to %s: %s\n", url, iscsi_get_error(c));
		iscsi_destroy_url(u);
		iscsi_destroy_context(c);
		return NULL;
	}
	*lun = u->lun;
	iscsi_destroy_url(u);
	return c;
}

/* Clear unit attentions (a new nexus, a reset) with TEST UNIT READY. */
static void clear_ua(struct iscsi_context *c, int lun)
{
	for (int i = 0; i < 10; i++) {
		struct scsi_task *t = iscsi_testunitready_sync(c, lun);
		bool good = t && t->status == SCSI_STATUS_GOOD;
		scsi_free_scsi_task(t);
		if (good)
			return;
	}
}

static bool sense_is_timeout(const struct op *o)
{
	return o->done && o->status == SCSI_STATUS_CHECK_CONDITION && o->key == 0x0b &&
	       o->ascq == 0x2e02;
}

/*
 * Freeze the store and wait until freeze_fs says it is frozen (its held
 * file, STUCK_PROBE_HELD, reads "1 ..."): the signal is handled when one
 * of its threads next runs, and a request arriving before that passes.
 */
static void freeze(void)
{
	const char *held = getenv("STUCK_PROBE_HELD");
	kill(ff_pid, SIGUSR1);
	for (int i = 0; held && i < 1000; i++) {
		char b[64] = "";
		FILE *f = fopen(held, "r");
		if (f) {
			if (!fgets(b, sizeof(b), f))
				b[0] = 0;
			fclose(f);
		}
		if (b[0] == '1')
			return;
		usleep(10000);
	}
	if (held)
		check(false, "freeze_fs did not say it was frozen within 10 s");
}

static void phase_commands(void)
{
	struct op w = { .name = "WRITE(10) 4K" }, r = { .name = "READ(10) 64K" }, s = { .name = "SYNCHRONIZE CACHE(10)" },
		  u = { .name = "UNMAP" }, g = { .name = "GET LBA STATUS" };
	static unsigned char rbuf[65536];
	(void)rbuf;
	struct unmap_list ul = { .lba = 2048, .num = 8 };
	write_stuck(16, pat_a, &w);
	r.t0 = now_ms();
	r.task = iscsi_read10_task(is, lun_stuck, 1024, 65536, BS, 0, 0, 0, 0, 0, op_cb, &r);
	s.t0 = now_ms();
	s.task = iscsi_synchronizecache10_task(is, lun_stuck, 0, 0, 0, 0, op_cb, &s);
	u.t0 = now_ms();
	u.task = iscsi_unmap_task(is, lun_stuck, 0, 0, &ul, 1, op_cb, &u);
	g.t0 = now_ms();
	g.task = iscsi_get_lba_status_task(is, lun_stuck, 0, 64, op_cb, &g);
	struct op *ops[] = { &w, &r, &s, &u, &g };
	step = "waiting for the five commands sent to the frozen store";
	wait_ops(ops, 5, io_timeout_ms + 8000);
	for (int i = 0; i < 5; i++) {
		struct op *o = ops[i];
		double ms = o->t1 - o->t0;
		check(sense_is_timeout(o) && ms >= io_timeout_ms - 500 && ms <= io_timeout_ms + 3000,
		      "%s on the frozen store: %s, status 0x%02x sense %x/%04x after %.0f ms (io_timeout %.0f ms)",
		      o->name, o->done ? "answered" : "no answer", o->status, o->key, o->ascq,
		      o->done ? ms : -1.0, io_timeout_ms);
		scsi_free_scsi_task(o->task);
	}
	check(other_max_ms < 1000, "the other LUN on the same session answered every READ meanwhile, the slowest "
	      "in %.0f ms", other_max_ms);
	int l2;
	double t0 = now_ms();
	step = "a second session logged in";
	struct iscsi_context *c2 = login(getenv("STUCK_PROBE_LOGIN_URL"), "iqn.2026-12.test:stuck-second", &l2);
	double ms = now_ms() - t0;
	check(c2 != NULL && ms < 5000, "a new session logs in while the store is frozen (%.0f ms)", ms);
	if (c2) {
		clear_ua(c2, l2);
		step = "the second session read the other LUN";
		struct scsi_task *t = read_bounded(c2, l2, 0, 10000);
		check(t && t->status == SCSI_STATUS_GOOD, "and reads the other LUN (%s)", t ? "answered" : "no answer in 10 s");
		scsi_free_scsi_task(t);
		step = "the second session logged out";
		iscsi_logout_sync(c2);
		iscsi_destroy_context(c2);
	}
}

static void phase_tmfs(void)
{
	static const char *names[] = { "ABORT TASK", "ABORT TASK SET", "LOGICAL UNIT RESET", "TARGET WARM RESET" };
	for (int k = 0; k < 4; k++) {
		struct op w = { .name = "write" }, t = { .name = names[k] };
		step = names[k];
		write_stuck(4096 + 64 * (uint32_t)k, pat_a, &w);
		serve(500, &w.done);
		t.t0 = now_ms();
		int rc = k == 0 ? iscsi_task_mgmt_abort_task_async(is, w.task, tmf_cb, &t)
			 : k == 1 ? iscsi_task_mgmt_abort_task_set_async(is, (uint32_t)lun_stuck, tmf_cb, &t)
			 : k == 2 ? iscsi_task_mgmt_lun_reset_async(is, (uint32_t)lun_stuck, tmf_cb, &t)
				  : iscsi_task_mgmt_target_warm_reset_async(is, tmf_cb, &t);
		if (rc == 0)
			serve(io_timeout_ms + 8000, &t.done);
		double ms = t.t1 - t.t0;
		check(rc == 0 && t.done && t.tmf_response == 0 && ms <= io_timeout_ms + 3000,
		      "%s over a write stuck on the frozen store: %s, response %u after %.0f ms", names[k],
		      t.done ? "answered" : "no answer", t.tmf_response, t.done ? ms : -1.0);
		/* the aborted write gets no answer: libiscsi forgets it */
		if (!w.done)
			iscsi_scsi_cancel_task(is, w.task);
		scsi_free_scsi_task(w.task);
		step = "TEST UNIT READY after a task management function";
		clear_ua(is, lun_stuck);
		clear_ua(is, lun_other);
	}
}

static void phase_fence(void)
{
	struct op a = { .name = "A" }, b = { .name = "B" };
	step = "write A, B and C of LBA 8";
	write_stuck(8, pat_a, &a);
	serve(io_timeout_ms + 8000, &a.done);
	check(sense_is_timeout(&a), "write A of LBA 8 is answered as failed (status 0x%02x sense %x/%04x)", a.status,
	      a.key, a.ascq);
	write_stuck(8, pat_b, &b);
	serve(300, &b.done);
	check(!b.done, "write B of LBA 8 waits while A may still land");
	struct op c = { .name = "C" }, ab = { .name = "ABORT TASK" };
	write_stuck(8, pat_c, &c);
	serve(300, &c.done);
	ab.t0 = now_ms();
	int rc = iscsi_task_mgmt_abort_task_async(is, c.task, tmf_cb, &ab);
	if (rc == 0)
		serve(io_timeout_ms + 8000, &ab.done);
	double ms = ab.t1 - ab.t0;
	check(rc == 0 && ab.done && ab.tmf_response == 0 && ms < 1000,
	      "ABORT TASK of write C of LBA 8, queued behind A, never sent to the store: %s, response %u after %.0f ms "
	      "(want well within io_timeout, %.0f ms)",
	      ab.done ? "answered" : "no answer", ab.tmf_response, ab.done ? ms : -1.0, io_timeout_ms);
	if (!c.done)
		iscsi_scsi_cancel_task(is, c.task);
	scsi_free_scsi_task(c.task);
	check(!b.done, "write B still waits behind A");
	kill(ff_pid, SIGUSR2);
	step = "write B after the thaw";
	serve(io_timeout_ms + 8000, &b.done);
	check(b.done && b.status == SCSI_STATUS_GOOD, "after the thaw B completes GOOD (status 0x%02x, %.0f ms)",
	      b.status, b.done ? b.t1 - b.t0 : -1.0);
	step = "reading LBA 8 back after the thaw";
	struct scsi_task *t = read_bounded(is, lun_stuck, 8, io_timeout_ms + 8000);
	bool same = t && t->status == SCSI_STATUS_GOOD && t->datain.size == 4096 &&
		    !memcmp(t->datain.data, pat_b, 4096);
	check(same, "LBA 8 reads back as B, the newer write, not the aborted C (%s, first byte '%c')",
	      t ? "answered" : "no answer", t && t->datain.size > 0 ? t->datain.data[0] : '?');
	scsi_free_scsi_task(t);
	scsi_free_scsi_task(a.task);
	scsi_free_scsi_task(b.task);
}

/*
 * 4. Once the store has given every held command back, the session's
 * command slots those used serve again: a burst of READs, enough to take
 * every slot freed since the thaw, is answered in full. (A slot kept the
 * "overdue" mark of its last command, and the next command in it was
 * served but its answer dropped: the READ of LBA 8 above went unanswered
 * once in a while, whenever an overdue command came back after B.)
 */
#define BURST 64
static void phase_reuse(void)
{
	const char *back = getenv("STUCK_PROBE_ALL_BACK");
	step = "waiting for the daemon to have every held command back";
	if (back) {
		double end = now_ms() + 30000;
		while (system(back) != 0 && now_ms() < end)
			serve(100, NULL);
	}
	step = "a burst of READs after the thaw";
	static struct op ops[BURST];
	struct op *all[BURST];
	for (int i = 0; i < BURST; i++) {
		ops[i] = (struct op){ .name = "burst read", .t0 = now_ms() };
		ops[i].task = iscsi_read10_task(is, lun_stuck, (uint32_t)(64 + 8 * i), 4096, BS, 0, 0, 0, 0, 0, op_cb, &ops[i]);
		all[i] = &ops[i];
	}
	wait_ops(all, BURST, io_timeout_ms + 8000);
	int answered = 0, good = 0;
	for (int i = 0; i < BURST; i++) {
		answered += ops[i].done;
		good += ops[i].done && ops[i].status == SCSI_STATUS_GOOD;
	}
	check(good == BURST, "after the thaw, %d READs sent at once on the session are all answered GOOD: %d answered, "
	      "%d GOOD", BURST, answered, good);
	for (int i = 0; i < BURST; i++) {
		if (!ops[i].done && ops[i].task)
			iscsi_scsi_cancel_task(is, ops[i].task);
		scsi_free_scsi_task(ops[i].task);
	}
}

int main(int argc, char **argv)
{
	if (argc < 5) {
		fprintf(stderr, "usage: stuck_probe URL_STUCK URL_OTHER FREEZE_FS_PID IO_TIMEOUT_S\n");
		return 2;
	}
	ff_pid = (pid_t)atoi(argv[3]);
	io_timeout_ms = atof(argv[4]) * 1000;
	setenv("STUCK_PROBE_LOGIN_URL", argv[2], 0);
	memset(pat_a, 'A', sizeof(pat_a));
	memset(pat_b, 'B', sizeof(pat_b));
	memset(pat_c, 'C', sizeof(pat_c));
	signal(SIGALRM, on_alarm);
	alarm(300); /* whatever happens, end, and say where */
	is = login(argv[1], "iqn.2026-12.test:stuck-probe", &lun_stuck);
	struct iscsi_url *u = is ? iscsi_parse_full_url(is, argv[2]) : NULL;
	if (!u)
		return 1;
	lun_other = u->lun;
	iscsi_destroy_url(u);
	clear_ua(is, lun_stuck);
	clear_ua(is, lun_other);

	step = "freezing the store";
	freeze();
	phase_commands();
	phase_tmfs();
	phase_fence();
	kill(ff_pid, SIGUSR2);
	phase_reuse();
	step = "logging out";
	iscsi_logout_sync(is);
	iscsi_destroy_context(is);
	printf("%d failed\n", failures);
	return failures ? 1 : 0;
}
