/*
 * test_io_fence.c - a write the host was told failed (io_timeout) never
 * lands over a newer write (backstore/lu_timeout.c, sbc.c's fences).
 *
 * Two workers and an LU on a file behind a fault wrapper (bdev/fault.h)
 * that holds every request and, when told, passes the newest held one on
 * to the file: a stuck device that wakes up and answers newest first.
 * Round 1, a fast write (no CAW active): WRITE A of LBAs 100-107 is held
 * on worker 1; its io_timeout passes (scsi_cmd_overdue); WRITE B of LBAs
 * 104-111, from worker 0, must not reach the device while A is still out;
 * a write elsewhere (LBA 900) must. The device then answers newest first
 * until both are done: LBAs 104-107 must read back as B.
 * Round 2, the same with A on the slow path (a CAW elsewhere is held, so
 * writes queue in lu->ranges): A becomes its own fence.
 * Without the fences B goes out at once, lands first, and A over it.
 * Prints one line per check; exit status 0 means every check passed.
 */
#include "backstore/lu.h"
#include "backstore/scsi.h"
#include "bdev/fault.h"
#include "bdev/file.h"
#include "common/worker.h"

#include <errno.h>
#include <fcntl.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BS 512u
#define NBLOCKS 2048u

#include "tests/unit/lu_job_util.h"

struct overdue_job {
	struct job *j;
	bool ret;
	sem_t done;
};

static void overdue_on_worker(void *arg)
{
	struct overdue_job *o = arg;
	o->ret = scsi_cmd_overdue(&o->j->cmd, 3600u * 1000);
	sem_post(&o->done);
}

/* Ask the LU whether j (in flight on worker w) is overdue, as a front end would. */
static bool overdue(unsigned w, struct job *j)
{
	struct overdue_job o = { .j = j };
	sem_init(&o.done, 0, 0);
	worker_post(worker_get(w), overdue_on_worker, &o);
	sem_wait(&o.done);
	return o.ret;
}

static void cancel_on_worker(void *arg)
{
	struct overdue_job *o = arg;
	o->ret = scsi_cmd_cancel(&o->j->cmd);
	sem_post(&o->done);
}

/* A task management function aborts j (in flight on worker w), as a front end would. */
static bool cancel(unsigned w, struct job *j)
{
	struct overdue_job o = { .j = j };
	sem_init(&o.done, 0, 0);
	worker_post(worker_get(w), cancel_on_worker, &o);
	sem_wait(&o.done);
	return o.ret;
}

static struct job *write10(unsigned worker, uint32_t lba, uint8_t blocks, uint8_t fill)
{
	uint8_t cdb[10] = { 0x2a };
	cdb[2] = (uint8_t)(lba >> 24);
	cdb[3] = (uint8_t)(lba >> 16);
	cdb[4] = (uint8_t)(lba >> 8);
	cdb[5] = (uint8_t)lba;
	cdb[8] = blocks;
	struct job *j = job_new();
	memset(j->data, fill, (size_t)blocks * BS);
	return job_submit(j, worker, cdb, 10, (uint32_t)blocks * BS);
}

static uint64_t held_writes(struct bdev *f)
{
	struct bdev_fault_counts c;
	bdev_fault_counts(f, &c);
	return c.held_writes;
}

/* The device answers newest first until every job is done (10 s at most). */
static bool drain_newest_first(struct bdev *f, struct job **jobs, int n)
{
	for (int i = 0; i < 2000; i++) {
		bool all = true;
		for (int k = 0; k < n; k++)
			all = all && is_done(jobs[k]);
		if (all)
			return true;
		if (!bdev_fault_pass_newest(f))
			usleep(5000);
		else
			usleep(20000); /* let it land before the next one goes */
	}
	return false;
}

static void fence_round(const char *name, struct scsi_lu *lu, struct bdev *f, int fd, uint32_t base)
{
	char what[200];
	uint64_t h0 = held_writes(f);
	struct job *a = write10(1, base, 8, 'A');
	snprintf(what, sizeof(what), "%s: write A of LBAs %u-%u is held on worker 1", name, base, base + 7);
	bool held = false;
	for (int i = 0; i < 1000 && !held; i++, usleep(10000))
		held = held_writes(f) >= h0 + 1;
	check(held, what);
	snprintf(what, sizeof(what), "%s: its io_timeout passed: the LU calls it overdue", name);
	check(overdue(1, a), what);
	struct scsi_lu_overdue od;
	scsi_lu_overdue(lu, &od);
	snprintf(what, sizeof(what), "%s: status counts it (%llu overdue now)", name, (unsigned long long)od.now);
	check(od.now == 1, what);
	check(!is_done(a), "the overdue write is not completed: the device still has its buffer");

	struct job *b = write10(0, base + 4, 8, 'B');
	struct job *far = write10(0, base + 800, 8, 'F');
	held = false;
	for (int i = 0; i < 1000 && !held; i++, usleep(10000))
		held = held_writes(f) >= h0 + 2;
	usleep(200000); /* room for a wrong write of B to arrive */
	snprintf(what, sizeof(what), "%s: a write elsewhere goes out (held %llu), B waits behind A (expect %llu)", name,
		 (unsigned long long)(held_writes(f) - h0), 2ull);
	check(held && held_writes(f) == h0 + 2, what);

	struct job *jobs[3] = { a, b, far };
	bool done = drain_newest_first(f, jobs, 3);
	check(done, "everything completes once the device answers");
	uint8_t got[12 * BS];
	ssize_t r = pread(fd, got, sizeof(got), (off_t)base * BS);
	bool a_ok = r == (ssize_t)sizeof(got), b_ok = a_ok;
	for (unsigned i = 0; i < 4 * BS && a_ok; i++)
		a_ok = got[i] == 'A';
	for (unsigned i = 4 * BS; i < 12 * BS && b_ok; i++)
		b_ok = got[i] == 'B';
	snprintf(what, sizeof(what), "%s: LBAs %u-%u read back as B, the newer write (LBA %u holds '%c')", name, base + 4,
		 base + 11, base + 4, r > 0 ? got[4 * BS] : '?');
	check(done && a_ok && b_ok, what);
	check(done && b->cmd.status == SAM_STAT_GOOD, "B completes GOOD");
	scsi_lu_overdue(lu, &od);
	check(od.now == 0 && od.total >= 1, "the overdue count is back to 0 once A is back");
	free(a);
	free(b);
	free(far);
}

int main(void)
{
	struct job_env e;
	job_env_open(&e, "fence", "TC-IO-FENCE", 5000);
	struct bdev *f = e.fault;
	struct scsi_lu *lu = e.lu;
	int fd = open(e.path, O_RDONLY);
	if (fd < 0) {
		perror(e.path);
		return 2;
	}
	nx = job_nexus_open(e.tgt, "iqn.2026-12.test:fence");
	uint8_t tur[6] = { 0 };
	struct job *t = submit(0, tur, 6, 0);
	wait_job(t);
	free(t);

	bdev_fault_set(f, BDEV_FAULT_HANG, 0, 0);
	fence_round("fast write", lu, f, fd, 100);

	/* a CAW elsewhere, held on its read: every write now takes the slow path */
	struct job *c = caw(0, 1900);
	struct bdev_fault_counts fc;
	bool caw_held = false;
	for (int i = 0; i < 1000 && !caw_held; i++, usleep(10000)) {
		bdev_fault_counts(f, &fc);
		caw_held = fc.held_reads >= 1;
	}
	check(caw_held, "a CAW of LBA 1900 is held on its read (writes queue in the interlock)");
	fence_round("slow write", lu, f, fd, 300);
	bdev_fault_set(f, BDEV_FAULT_NONE, 0, 0); /* the CAW's read fails */
	check(wait_job(c), "the CAW completes when let go");
	free(c);

	/*
	 * EXTENDED COPY answered overdue while its source read is out: when
	 * the read comes back, the copy must end there, not write the chunk
	 * (the host, told it failed, may have rewritten the destination).
	 */
	bdev_fault_set(f, BDEV_FAULT_HANG, 0, 0);
	bdev_fault_counts(f, &fc);
	uint64_t r0 = fc.held_reads, w0 = fc.held_writes;
	struct job *x = xcopy_within(1, lu, 1500, 1600, 8);
	bool xr = false;
	for (int i = 0; i < 1000 && !xr; i++, usleep(10000)) {
		bdev_fault_counts(f, &fc);
		xr = fc.held_reads >= r0 + 1;
	}
	check(xr, "EXTENDED COPY: its source read is held");
	check(overdue(1, x), "EXTENDED COPY: its io_timeout passed: the LU calls it overdue");
	check(bdev_fault_pass_newest(f) == 1, "EXTENDED COPY: the read comes back late");
	check(wait_job(x), "EXTENDED COPY: the copy ends when the late read is back");
	bdev_fault_counts(f, &fc);
	check(fc.held_writes == w0 && x->cmd.status == SAM_STAT_CHECK_CONDITION,
	      "EXTENDED COPY: answered overdue, it wrote nothing after its late read");
	bdev_fault_set(f, BDEV_FAULT_NONE, 0, 0);
	free(x);

	/*
	 * A task management function aborts a write that never reached the
	 * device (scsi_cmd_cancel): write A of LBAs 500-507 held and overdue (a
	 * fence), B of 504-511 queued behind it. Cancelling B ends it at once,
	 * ABORTED COMMAND, and it never reaches the device; cancelling A, which
	 * the device holds, does nothing; a later write C of 506-509 still waits
	 * behind A's fence and lands over it.
	 */
	bdev_fault_set(f, BDEV_FAULT_HANG, 0, 0);
	uint64_t h0 = held_writes(f);
	struct job *a = write10(1, 500, 8, 'a');
	bool held = false;
	for (int i = 0; i < 1000 && !held; i++, usleep(10000))
		held = held_writes(f) >= h0 + 1;
	check(held && overdue(1, a), "cancel: write A of LBAs 500-507 is held and overdue");
	struct job *b = write10(0, 504, 8, 'b');
	usleep(200000);
	check(held_writes(f) == h0 + 1 && !is_done(b), "cancel: write B of 504-511 waits behind A's fence");
	check(!cancel(1, a), "cancel: A, which the device holds, is not cancelled");
	check(cancel(0, b), "cancel: B, which waits in the interlock, is");
	bool b_done = wait_job(b);
	check(b_done && b->cmd.status == SAM_STAT_CHECK_CONDITION && b->cmd.sense_len >= 14 &&
		      (b->cmd.sense[2] & 0x0f) == SK_ABORTED_COMMAND,
	      "cancel: B ends at once, CHECK CONDITION, ABORTED COMMAND");
	check(held_writes(f) == h0 + 1, "cancel: B never reached the device");
	struct job *cw = write10(0, 506, 4, 'c');
	usleep(200000);
	check(held_writes(f) == h0 + 1 && !is_done(cw), "cancel: a later write C of 506-509 still waits behind A");
	/* D, queued too, passes io_timeout while it waits: the host is told it
	 * failed, so it leaves the queue rather than land after C */
	struct job *dw = write10(0, 504, 4, 'd');
	usleep(200000);
	check(!is_done(dw) && overdue(0, dw), "cancel: write D of 504-507, queued behind A, passes io_timeout");
	check(wait_job(dw) && held_writes(f) == h0 + 1, "cancel: D ends without reaching the device");
	struct job *cjobs[2] = { a, cw };
	bool cdone = drain_newest_first(f, cjobs, 2);
	uint8_t cg[12 * BS];
	ssize_t cr = pread(fd, cg, sizeof(cg), 500 * BS);
	bool cok = cdone && cr == (ssize_t)sizeof(cg);
	for (unsigned i = 0; i < 12 * BS && cok; i++)
		cok = cg[i] == (i < 6 * BS ? 'a' : i < 10 * BS ? 'c' : 0);
	check(cok, "cancel: 500-505 hold A, 506-509 C, 510-511 nothing (B never landed)");
	bdev_fault_set(f, BDEV_FAULT_NONE, 0, 0);
	free(a);
	free(b);
	free(cw);
	free(dw);

	job_nexus_close(nx);
	close(fd);
	job_env_close(&e);
	printf("%d checks, %d failed\n", checks, failures);
	return failures ? 1 : 0;
}
