/*
 * test_pr_preempt_epoch.c - PREEMPT AND ABORT on a LU of one gateway waits
 * for the commands the preempted nexus had in flight when it came, not for
 * those it sends after (backstore/pr.c, nexus_lu in backstore/lu.h).
 *
 * An LU on a file behind a fault wrapper that holds every request until
 * told to pass the oldest one on. Nexus A holds a Write Exclusive
 * reservation, B is registered.
 * Round 1: A's write W is held; B's PREEMPT AND ABORT is not answered
 * while W is out; A then reads (allowed to all under Write Exclusive) and
 * the read is held too. W is let go: the PREEMPT AND ABORT is GOOD within
 * 2 s although A's read is still held (a fenced host that keeps sending
 * must not hold the preemption to its 8 s limit); the read is let go.
 * Round 2: A's write held for good (never let go): the PREEMPT AND ABORT
 * is answered anyway once its limit (8 s, checked once a second) passed,
 * not before 7 s.
 * Prints one line per check; exit status 0 means every check passed.
 */
#include "backstore/lu.h"
#include "backstore/scsi.h"
#include "bdev/fault.h"
#include "bdev/file.h"
#include "common/worker.h"

#include <errno.h>
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

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Wait up to ms for j: true when it is done. */
static bool wait_ms(struct job *j, unsigned ms)
{
	for (unsigned i = 0; i < ms / 5; i++) {
		if (is_done(j))
			return true;
		usleep(5000);
	}
	return is_done(j);
}

/* A command of nexus n on worker w (not waited for). */
static struct job *cmd_of(struct scsi_nexus *n, unsigned w, const uint8_t *cdb, size_t len, uint32_t out_len,
			  const uint8_t *out)
{
	struct job *j = job_new();
	if (out)
		memcpy(j->data, out, out_len);
	nx = n;
	return job_submit(j, w, cdb, len, out_len);
}

/* PERSISTENT RESERVE OUT of nexus n, waited for: its status. */
static int prout(struct scsi_nexus *n, uint8_t sa, uint8_t type, uint64_t key, uint64_t sa_key, struct job **keep)
{
	uint8_t cdb[10] = { 0x5f, sa, type }, p[24] = { 0 };
	cdb[8] = sizeof(p);
	for (int i = 0; i < 8; i++) {
		p[i] = (uint8_t)(key >> (56 - 8 * i));
		p[8 + i] = (uint8_t)(sa_key >> (56 - 8 * i));
	}
	struct job *j = cmd_of(n, 0, cdb, 10, sizeof(p), p);
	if (keep) {
		*keep = j;
		return -1;
	}
	int st = wait_job(j) ? j->cmd.status : -1;
	free(j);
	return st;
}

/* TEST UNIT READY of n, waited for (takes a pending unit attention). */
static void tur(struct scsi_nexus *n)
{
	uint8_t cdb[6] = { 0 };
	struct job *j = cmd_of(n, 0, cdb, 6, 0, NULL);
	wait_job(j);
	free(j);
}

static struct job *rw10(struct scsi_nexus *n, uint8_t op, uint32_t lba)
{
	uint8_t cdb[10] = { op };
	cdb[5] = (uint8_t)lba;
	cdb[4] = (uint8_t)(lba >> 8);
	cdb[8] = 1;
	uint8_t blk[BS];
	memset(blk, 0x5a, sizeof(blk));
	return cmd_of(n, 1, cdb, 10, op == 0x2a ? BS : 0, op == 0x2a ? blk : NULL);
}

static bool held(struct bdev *f, uint64_t reads, uint64_t writes)
{
	return wait_counts(f, reads, writes);
}

int main(void)
{
	struct job_env e;
	job_env_open(&e, "paepoch", "TC-PA-EPOCH", 0);
	struct bdev *f = e.fault;
	struct scsi_nexus *a = job_nexus_open(e.tgt, "iqn.2026-12.test:a");
	struct scsi_nexus *b = job_nexus_open(e.tgt, "iqn.2026-12.test:b");
	tur(a);
	tur(b);
	check(prout(a, 6, 0, 0, 0xa1, NULL) == SAM_STAT_GOOD, "A registers");
	check(prout(b, 6, 0, 0, 0xb1, NULL) == SAM_STAT_GOOD, "B registers");
	check(prout(a, 1, 1, 0xa1, 0, NULL) == SAM_STAT_GOOD, "A reserves (Write Exclusive)");

	/* round 1 */
	bdev_fault_set(f, BDEV_FAULT_HANG, 0, 0);
	struct job *w = rw10(a, 0x2a, 10);
	check(held(f, 0, 1), "A's write is held by the device");
	struct job *pa;
	prout(b, 5, 1, 0xb1, 0xa1, &pa);
	check(!wait_ms(pa, 300), "B's PREEMPT AND ABORT is not answered while A's write is out");
	tur(a); /* REGISTRATIONS PREEMPTED */
	struct job *r = rw10(a, 0x28, 20);
	check(held(f, 1, 1), "A reads after the preemption (Write Exclusive lets it); the read is held too");
	check(!is_done(pa), "the PREEMPT AND ABORT is still not answered");
	check(bdev_fault_pass_oldest(f) == 1, "the device lets A's write go");
	check(wait_job(w) && w->cmd.status == SAM_STAT_GOOD, "A's write completes GOOD");
	double t0 = now_s();
	bool pa_done = wait_ms(pa, 2000);
	check(pa_done && pa->cmd.status == SAM_STAT_GOOD,
	      "the PREEMPT AND ABORT is GOOD within 2 s of A's write, although A's read is still out");
	printf("   (%.0f ms after the write)\n", (now_s() - t0) * 1000);
	check(!is_done(r), "A's read is still held then");
	wait_job(pa);
	check(bdev_fault_pass_oldest(f) == 1 && wait_job(r) && r->cmd.status == SAM_STAT_GOOD,
	      "A's read completes GOOD once let go");
	free(w);
	free(r);
	free(pa);

	/* round 2: a write held for good */
	tur(a);
	check(prout(a, 6, 0, 0, 0xa2, NULL) == SAM_STAT_GOOD, "A registers again");
	check(prout(b, 2, 1, 0xb1, 0, NULL) == SAM_STAT_GOOD, "B releases");
	check(prout(a, 1, 1, 0xa2, 0, NULL) == SAM_STAT_GOOD, "A reserves again");
	struct bdev_fault_counts fc;
	bdev_fault_counts(f, &fc);
	w = rw10(a, 0x2a, 30);
	check(held(f, fc.held_reads, fc.held_writes + 1), "A's write is held, and will not be let go");
	t0 = now_s();
	prout(b, 5, 1, 0xb1, 0xa2, &pa);
	pa_done = wait_ms(pa, 12000);
	double took = now_s() - t0;
	check(pa_done && pa->cmd.status == SAM_STAT_GOOD, "the PREEMPT AND ABORT is answered anyway, GOOD");
	check(took >= 7.0 && took <= 11.0, "after its limit (8 s, checked once a second), not before");
	printf("   (after %.1f s)\n", took);
	check(!is_done(w), "A's write is still held then");
	free(pa);

	bdev_fault_set(f, BDEV_FAULT_NONE, 0, 0); /* the held write fails */
	check(wait_job(w), "A's write ends once the device gives up on it");
	free(w);
	job_nexus_close(a);
	job_nexus_close(b);
	job_env_close(&e);
	printf("%d checks, %d failed\n", checks, failures);
	return failures ? 1 : 0;
}
