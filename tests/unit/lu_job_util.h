/*
 * lu_job_util.h - the harness the interlock tests share (test_caw_interlock,
 * test_io_fence): SCSI commands submitted on a worker to one nexus, as a
 * front end does, waited for on a semaphore; a COMPARE AND WRITE and an
 * EXTENDED COPY within one LU; the fault wrapper's held counts awaited;
 * the LU on a file behind the fault wrapper they all run on (job_env).
 * Header-only; the includer defines BS (the LU's block size) and NBLOCKS
 * (its size in blocks).
 */
#ifndef TC_LU_JOB_UTIL_H
#define TC_LU_JOB_UTIL_H

#include "backstore/lu.h"
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

static int failures, checks;

static inline void check(bool ok, const char *what)
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

static inline void cmd_done(struct scsi_cmd *cmd)
{
	struct job *j = cmd->fe_priv;
	atomic_store(&j->order, atomic_fetch_add(&completed, 1) + 1);
	sem_post(&j->done);
}

static inline void submit_on_worker(void *arg)
{
	struct job *j = arg;
	scsi_cmd_submit(&j->cmd);
}

struct nexus_job {
	struct scsi_target *tgt;
	const char *initiator;
	struct scsi_nexus *nx;
	sem_t done;
};

static inline void nexus_open_on_worker(void *arg)
{
	struct nexus_job *j = arg;
	static const uint8_t isid[6] = { 0x40, 0, 0, 0, 0, 1 };
	j->nx = scsi_nexus_open(j->tgt, j->initiator, isid, 1);
	sem_post(&j->done);
}

static inline void nexus_close_on_worker(void *arg)
{
	struct nexus_job *j = arg;
	scsi_nexus_close(j->nx);
	sem_post(&j->done);
}

static struct scsi_nexus *nx; /* the nexus every job goes to */

/* A nexus of initiator to tgt, opened on worker 0 as a front end does. */
static inline struct scsi_nexus *job_nexus_open(struct scsi_target *tgt, const char *initiator)
{
	struct nexus_job nj = { .tgt = tgt, .initiator = initiator };
	sem_init(&nj.done, 0, 0);
	worker_post(worker_get(0), nexus_open_on_worker, &nj);
	sem_wait(&nj.done);
	return nj.nx;
}

/* ... and closed there. */
static inline void job_nexus_close(struct scsi_nexus *n)
{
	struct nexus_job nj = { .nx = n };
	sem_init(&nj.done, 0, 0);
	worker_post(worker_get(0), nexus_close_on_worker, &nj);
	sem_wait(&nj.done);
}

/*
 * Two workers and an LU of NBLOCKS blocks on a file in a fresh directory,
 * behind the fault wrapper, mapped as LUN 0 of a target (serial and
 * io_timeout_ms as given). Exits 2 when something cannot be had.
 */
struct job_env {
	char dir[64], path[96];
	struct bdev *fault;
	struct scsi_lu *lu;
	struct scsi_target *tgt;
};

static inline void job_env_open(struct job_env *e, const char *tag, const char *serial, uint32_t io_timeout_ms)
{
	char err[256];
	snprintf(e->dir, sizeof(e->dir), "/tmp/tc-%s-XXXXXX", tag);
	if (!mkdtemp(e->dir)) {
		perror("mkdtemp");
		exit(2);
	}
	snprintf(e->path, sizeof(e->path), "%s/lun.img", e->dir);
	if (workers_start(2) < 0) {
		fprintf(stderr, "cannot start workers (io_uring unavailable?)\n");
		exit(2);
	}
	struct bdev *file = bdev_file_open(e->path, (uint64_t)NBLOCKS * BS, BS, true, err, sizeof(err));
	e->fault = file ? bdev_fault_wrap(file) : NULL;
	if (!e->fault) {
		fprintf(stderr, "%s\n", file ? "cannot wrap the file" : err);
		exit(2);
	}
	struct scsi_lu_config cfg = {
		.name = "lun0", .serial = serial, .state_dir = e->dir, .block_size = BS,
		.write_cache = false, .vendor = "TIERCACH", .product = "unit-test", .revision = "0001",
		.target_port_group = 1, .rel_port_id = 1, .io_timeout_ms = io_timeout_ms,
	};
	e->lu = scsi_lu_open(&cfg, e->fault, err, sizeof(err));
	if (!e->lu) {
		fprintf(stderr, "%s\n", err);
		exit(2);
	}
	e->tgt = scsi_target_new("iqn.2026-12.test:tgt");
	scsi_target_map(e->tgt, 0, e->lu);
}

/* Once every nexus is closed: stop the workers, close and remove all. */
static inline void job_env_close(struct job_env *e)
{
	workers_stop();
	scsi_target_free(e->tgt);
	scsi_lu_close(e->lu);
	unlink(e->path);
	rmdir(e->dir);
}

static inline struct job *job_new(void)
{
	struct job *j = aligned_alloc(4096, (sizeof(*j) + 4095) / 4096 * 4096);
	if (!j)
		exit(2);
	memset(j, 0, sizeof(*j));
	sem_init(&j->done, 0, 0);
	return j;
}

/* cdb with write_len bytes of j->data (the caller fills them after, or
 * passes a prepared job), submitted on worker */
static inline struct job *job_submit(struct job *j, unsigned worker, const uint8_t *cdb, size_t cdb_len,
				     uint32_t write_len)
{
	scsi_cmd_prepare(&j->cmd, &j->iov, nx, 0, cdb, cdb_len, j->data, write_len, 0, cmd_done, j);
	worker_post(worker_get(worker), submit_on_worker, j);
	return j;
}

static inline struct job *submit(unsigned worker, const uint8_t *cdb, size_t cdb_len, uint32_t write_len)
{
	return job_submit(job_new(), worker, cdb, cdb_len, write_len);
}

static inline struct job *caw(unsigned worker, uint64_t lba)
{
	uint8_t cdb[16] = { 0x89 };
	for (int i = 0; i < 8; i++)
		cdb[2 + i] = (uint8_t)(lba >> (56 - 8 * i));
	cdb[13] = 1;
	return submit(worker, cdb, 16, 2 * BS);
}

/* EXTENDED COPY (LID1) of n blocks from src to dst within lu, on worker */
static inline struct job *xcopy_within(unsigned worker, const struct scsi_lu *lu, uint16_t src, uint16_t dst,
				       uint8_t n)
{
	struct job *x = job_new();
	uint8_t *pl = x->data;
	pl[0] = 1;                  /* list identifier */
	pl[3] = 32;                 /* one target descriptor */
	pl[11] = 28;                /* one segment descriptor */
	pl[16] = 0xe4;              /* identification descriptor: the LU's NAA */
	pl[20] = 0x01;
	pl[21] = 0x03;
	pl[23] = 8;
	memcpy(pl + 24, lu->naa, 8);
	pl[48] = 0x02;              /* block to block */
	pl[51] = 24;
	pl[59] = n;
	pl[66] = (uint8_t)(src >> 8);
	pl[67] = (uint8_t)src;
	pl[74] = (uint8_t)(dst >> 8);
	pl[75] = (uint8_t)dst;
	uint8_t cdb[16] = { 0x83 };
	cdb[13] = 76;
	return job_submit(x, worker, cdb, 16, 76);
}

static inline bool wait_job(struct job *j)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += 10;
	while (sem_timedwait(&j->done, &ts) < 0)
		if (errno != EINTR)
			return false;
	return true;
}

static inline bool is_done(struct job *j)
{
	int v;
	sem_getvalue(&j->done, &v);
	return v > 0;
}

/* Wait until the fault wrapper holds at least reads and writes, up to 10 s. */
static inline bool wait_counts(struct bdev *f, uint64_t reads, uint64_t writes)
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

#endif
