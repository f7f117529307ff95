/*
 * test_caw_interlock.c - COMPARE AND WRITE waits for overlapping writes
 * in flight on other workers, and only for those (backstore/sbc.c).
 *
 * Two workers and an LU on a file behind a fault wrapper (bdev/fault.h)
 * that holds every request unanswered, counting what it holds. A WRITE of
 * LBAs 100-107 goes out on worker 1 and is held there (a fast write: no
 * CAW was active). Then, on worker 0:
 *  - a CAW of LBA 104 (overlapping) must not read before the write ends:
 *    the wrapper holds no read for it;
 *  - a CAW of LBA 500 (elsewhere) must go ahead at once: its read reaches
 *    the wrapper (before the fix it waited for every write in flight on
 *    the LU, so an ATS heartbeat waited behind a stuck unrelated write).
 * When the wrapper lets go, the held requests fail (EIO) and the CAW of
 * LBA 104 then reads, compares and writes: it completes only after the
 * write did.
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

int main(void)
{
	struct job_env e;
	job_env_open(&e, "caw", "TC-CAW-INTERLOCK", 0);
	struct bdev *f = e.fault;
	struct scsi_lu *lu = e.lu;
	nx = job_nexus_open(e.tgt, "iqn.2026-11.test:caw");
	/* the new nexus's POWER ON unit attention */
	uint8_t tur[6] = { 0 };
	struct job *t = submit(0, tur, 6, 0);
	wait_job(t);
	free(t);

	bdev_fault_set(f, BDEV_FAULT_HANG, 0, 0);
	uint8_t w10[10] = { 0x2a };
	w10[5] = 100;
	w10[8] = 8;
	struct job *w = submit(1, w10, 10, 8 * BS);
	check(wait_counts(f, 0, 1), "a write of LBAs 100-107 is held in flight on worker 1");

	struct job *near = caw(0, 104);
	struct job *far = caw(0, 500);
	check(wait_counts(f, 1, 1), "a CAW of LBA 500 does not wait for the write to 100-107: its read goes out");
	usleep(200000); /* room for a wrong read of the overlapping CAW to arrive */
	struct bdev_fault_counts c;
	bdev_fault_counts(f, &c);
	check(c.held_reads == 1, "the CAW of LBA 104 waits for the overlapping write: it has not read");

	bdev_fault_set(f, BDEV_FAULT_NONE, 0, 0); /* held requests fail with EIO */
	bool done = wait_job(w) && wait_job(far) && wait_job(near);
	check(done, "everything completes once the requests are let go");
	check(done && atomic_load(&near->order) > atomic_load(&w->order),
	      "the overlapping CAW completes after the write it waited for");
	check(done && w->cmd.status == SAM_STAT_CHECK_CONDITION,
	      "the held write fails (the wrapper answers EIO), it is not lost silently");
	/* the near CAW compared zeroes (never written) with zeroes: GOOD */
	check(done && near->cmd.status == SAM_STAT_GOOD, "the overlapping CAW then reads, compares and writes");
	free(w);
	free(near);
	free(far);

	/*
	 * EXTENDED COPY's chunk write deferred behind a CAW: the copy's read
	 * of LBAs 1000-1007 is let through, its write to 296-303 overlaps the
	 * CAW of LBA 300 held on its read, so it waits in the interlock; when
	 * the CAW ends the write must resume (it had no resume hook: the
	 * worker called a null pointer).
	 */
	bdev_fault_set(f, BDEV_FAULT_HANG, 0, 0);
	bdev_fault_counts(f, &c);
	uint64_t r0 = c.held_reads, w0 = c.held_writes;
	struct job *hold = caw(0, 300);
	check(wait_counts(f, r0 + 1, 0), "a CAW of LBA 300 is held on its read");
	struct job *x = xcopy_within(1, lu, 1000, 296, 8); /* LBAs 1000-1007 to 296-303 */
	check(wait_counts(f, r0 + 2, 0), "the copy's read is held too");
	check(bdev_fault_pass_newest(f) == 1, "the copy's read passed on to the file");
	usleep(200000); /* room for a wrong write of the copy to arrive */
	bdev_fault_counts(f, &c);
	check(c.held_writes == w0, "the copy's write to 296-303 waits for the CAW of LBA 300");
	bdev_fault_set(f, BDEV_FAULT_NONE, 0, 0); /* the CAW's read fails; the copy's write goes */
	check(wait_job(hold) && wait_job(x), "the CAW ends and the copy resumes and completes");
	check(x->cmd.status == SAM_STAT_GOOD, "the deferred copy completes GOOD");
	free(hold);
	free(x);

	job_nexus_close(nx);
	job_env_close(&e);
	printf("%d checks, %d failed\n", checks, failures);
	return failures ? 1 : 0;
}
