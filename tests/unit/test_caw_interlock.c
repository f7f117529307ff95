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
#include "tests/unit/scsi_test_util.h"

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

static int failures, checks;

static void check(bool ok, const char *what)
{
	checks++;
	if (!ok)
		failures++;
	printf("%s: %s\n", ok ? "ok" : "FAIL", what);
}

struct job {
	struct scsi_cmd cmd;
	struct iovec iov;
	sem_t done;
	atomic_int order; /* completion order, from 1 */
	uint8_t data[2 * BS * 8] __attribute__((aligned(4096)));
};

static atomic_int completed;

static void cmd_done(struct scsi_cmd *cmd)
{
	struct job *j = cmd->fe_priv;
	atomic_store(&j->order, atomic_fetch_add(&completed, 1) + 1);
	sem_post(&j->done);
}

static void submit_on_worker(void *arg)
{
	struct job *j = arg;
	scsi_cmd_submit(&j->cmd);
}

struct nexus_job {
	struct scsi_target *tgt;
	struct scsi_nexus *nx;
	sem_t done;
};

static void nexus_open_on_worker(void *arg)
{
	struct nexus_job *j = arg;
	static const uint8_t isid[6] = { 0x40, 0, 0, 0, 0, 1 };
	j->nx = scsi_nexus_open(j->tgt, "iqn.2026-11.test:caw", isid, 1);
	sem_post(&j->done);
}

static void nexus_close_on_worker(void *arg)
{
	struct nexus_job *j = arg;
	scsi_nexus_close(j->nx);
	sem_post(&j->done);
}

static struct scsi_nexus *nx;

static struct job *submit(unsigned worker, const uint8_t *cdb, size_t cdb_len, uint32_t write_len)
{
	struct job *j = aligned_alloc(4096, (sizeof(*j) + 4095) / 4096 * 4096);
	if (!j)
		exit(2);
	memset(j, 0, sizeof(*j));
	sem_init(&j->done, 0, 0);
	scsi_cmd_prepare(&j->cmd, &j->iov, nx, 0, cdb, cdb_len, j->data, write_len, 0, cmd_done, j);
	worker_post(worker_get(worker), submit_on_worker, j);
	return j;
}

static struct job *caw(unsigned worker, uint64_t lba)
{
	uint8_t cdb[16] = { 0x89 };
	for (int i = 0; i < 8; i++)
		cdb[2 + i] = (uint8_t)(lba >> (56 - 8 * i));
	cdb[13] = 1;
	return submit(worker, cdb, 16, 2 * BS);
}

/* Wait for cond on the fault wrapper's counts, up to 10 s. */
static bool wait_counts(struct bdev *f, uint64_t reads, uint64_t writes)
{
	for (int i = 0; i < 1000; i++) {
		struct bdev_fault_counts c;
		bdev_fault_counts(f, &c);
		if (c.held_reads >= reads && c.held_writes >= writes)
			return true;
		usleep(10000);
	}
	return false;
}

static bool wait_job(struct job *j)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += 10;
	while (sem_timedwait(&j->done, &ts) < 0)
		if (errno != EINTR)
			return false;
	return true;
}

int main(void)
{
	char dir[] = "/tmp/tc-caw-XXXXXX", path[64], err[256];
	if (!mkdtemp(dir)) {
		perror("mkdtemp");
		return 2;
	}
	snprintf(path, sizeof(path), "%s/lun.img", dir);
	if (workers_start(2) < 0) {
		fprintf(stderr, "cannot start workers (io_uring unavailable?)\n");
		return 2;
	}
	struct bdev *file = bdev_file_open(path, (uint64_t)NBLOCKS * BS, BS, true, err, sizeof(err));
	struct bdev *f = file ? bdev_fault_wrap(file) : NULL;
	if (!f) {
		fprintf(stderr, "%s\n", file ? "cannot wrap the file" : err);
		return 2;
	}
	struct scsi_lu_config cfg = {
		.name = "lun0", .serial = "TC-CAW-INTERLOCK", .state_dir = dir, .block_size = BS,
		.write_cache = false, .vendor = "TIERCACH", .product = "unit-test", .revision = "0001",
		.target_port_group = 1, .rel_port_id = 1,
	};
	struct scsi_lu *lu = scsi_lu_open(&cfg, f, err, sizeof(err));
	if (!lu) {
		fprintf(stderr, "%s\n", err);
		return 2;
	}
	struct scsi_target *tgt = scsi_target_new("iqn.2026-11.test:tgt");
	scsi_target_map(tgt, 0, lu);
	struct nexus_job nj = { .tgt = tgt };
	sem_init(&nj.done, 0, 0);
	worker_post(worker_get(0), nexus_open_on_worker, &nj);
	sem_wait(&nj.done);
	nx = nj.nx;
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
	uint8_t xc[16] = { 0x83 };
	xc[13] = 76;
	struct job *x = aligned_alloc(4096, (sizeof(*x) + 4095) / 4096 * 4096);
	if (!x)
		exit(2);
	memset(x, 0, sizeof(*x));
	sem_init(&x->done, 0, 0);
	uint8_t *pl = x->data;
	pl[0] = 1;                  /* list identifier */
	pl[3] = 32;                 /* one target descriptor */
	pl[11] = 28;                /* one segment descriptor */
	pl[16] = 0xe4;
	pl[20] = 0x01;
	pl[21] = 0x03;              /* NAA */
	pl[23] = 8;
	memcpy(pl + 24, lu->naa, 8);
	pl[48] = 0x02;              /* block to block */
	pl[51] = 24;
	pl[59] = 8;                 /* 8 blocks */
	pl[66] = 1000 >> 8;
	pl[67] = 1000 & 0xff;       /* from LBA 1000 */
	pl[75] = 296 & 0xff;
	pl[74] = 296 >> 8;          /* to LBA 296 */
	scsi_cmd_prepare(&x->cmd, &x->iov, nx, 0, xc, 16, x->data, 76, 0, cmd_done, x);
	worker_post(worker_get(1), submit_on_worker, x);
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

	worker_post(worker_get(0), nexus_close_on_worker, &nj);
	sem_wait(&nj.done);
	workers_stop();
	scsi_target_free(tgt);
	scsi_lu_close(lu);
	unlink(path);
	rmdir(dir);
	printf("%d checks, %d failed\n", checks, failures);
	return failures ? 1 : 0;
}
