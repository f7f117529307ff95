/*
 * fuzz_cdb.c - arbitrary CDBs and parameter data through scsi_cmd_submit.
 *
 * Invariant 4 of the design ("bad input gets a precise answer, never a
 * crash") for the SCSI emulation: any CDB, from either of two I_T nexuses,
 * to a mapped or unmapped LUN, with any Data-Out payload and any Data-In
 * room, must complete exactly once with a sane status, sense no longer
 * than the buffer and no more Data-In than the room given.
 *
 * The backstore runs on worker threads (its threading contract), so
 * LLVMFuzzerInitialize starts one worker and opens a small LU on a sparse
 * temporary file; each input is posted to that worker and the fuzzer
 * thread waits for done() on a semaphore, which keeps every run
 * synchronous and deterministic enough for libFuzzer.
 *
 * Input layout: byte 0 selects nexus / LUN / direction and whether the
 * opcode (and service action) is taken from the command table (so most
 * inputs get past dispatch into the handlers), byte 1 the CDB length,
 * byte 2-3 the Data-In room, then the CDB, then the Data-Out.
 */
#include "backstore/lu.h"
#include "backstore/scsi.h"
#include "bdev/file.h"
#include "common/worker.h"

#include <errno.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define LU_BYTES (4u << 20)
#define MAX_IO (256u << 10)

static struct scsi_target *tgt;
static struct scsi_nexus *nexus[2];
static uint8_t *dout_buf, *din_buf;

struct run {
	struct scsi_cmd cmd;
	struct iovec iov;
	sem_t done;
	int completions;
	_Atomic bool submitted; /* set on the worker just before scsi_cmd_submit */
};

/* The previous input's CDB: a completion that arrives before this input's
 * command was submitted is a late second completion of that one. */
static uint8_t prev_cdb[SCSI_CDB_MAX];

static sem_t setup_done;
static char state_dir[512];

/* libFuzzer leaves through exit(): take the temporary state with us. */
static void remove_state_dir(void)
{
	char p[600];
	snprintf(p, sizeof(p), "%s/fuzz.pr", state_dir);
	unlink(p);
	snprintf(p, sizeof(p), "%s/fuzz.pr.tmp", state_dir);
	unlink(p);
	rmdir(state_dir);
}

static void open_nexuses(void *arg)
{
	static const uint8_t isid1[6] = { 0x40, 0, 0, 0, 0, 1 };
	static const uint8_t isid2[6] = { 0x40, 0, 0, 0, 0, 2 };
	(void)arg;
	nexus[0] = scsi_nexus_open(tgt, "iqn.2026-11.test:fuzz1", isid1, 1);
	nexus[1] = scsi_nexus_open(tgt, "iqn.2026-11.test:fuzz2", isid2, 1);
	sem_post(&setup_done);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	const char *tmp = getenv("TMPDIR");
	char dir[512];
	snprintf(dir, sizeof(dir), "%s/tc-fuzz-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	char path[600], err[256];
	(void)argc;
	(void)argv;

	if (!mkdtemp(dir) || workers_start(1) < 0) {
		fprintf(stderr, "fuzz_cdb: cannot set up (temp dir or io_uring)\n");
		exit(1);
	}
	snprintf(state_dir, sizeof(state_dir), "%s", dir);
	atexit(remove_state_dir);
	snprintf(path, sizeof(path), "%s/lu.img", dir);
	struct bdev *dev = bdev_file_open(path, LU_BYTES, 512, true, err, sizeof(err));
	if (!dev) {
		fprintf(stderr, "fuzz_cdb: %s\n", err);
		exit(1);
	}
	unlink(path); /* the open descriptor keeps it alive */
	struct scsi_lu_config cfg = {
		.name = "fuzz", .serial = "FUZZ0001", .state_dir = dir, .block_size = 512,
		.vendor = "TIERCACH", .product = "fuzz", .revision = "0001",
		.target_port_group = 1, .rel_port_id = 1,
	};
	struct scsi_lu *lu = scsi_lu_open(&cfg, dev, err, sizeof(err));
	if (!lu) {
		fprintf(stderr, "fuzz_cdb: %s\n", err);
		exit(1);
	}
	tgt = scsi_target_new("iqn.2026-11.test:fuzz");
	scsi_target_map(tgt, 0, lu);
	scsi_target_map(tgt, 300, lu); /* a flat-space LUN, same LU */
	sem_init(&setup_done, 0, 0);
	worker_post(worker_get(0), open_nexuses, NULL);
	sem_wait(&setup_done);
	if (posix_memalign((void **)&dout_buf, 4096, MAX_IO) || posix_memalign((void **)&din_buf, 4096, MAX_IO))
		exit(1);
	return 0;
}

static void on_done(struct scsi_cmd *cmd)
{
	struct run *r = cmd->fe_priv;
	if (!atomic_load(&r->submitted)) {
		fprintf(stderr, "fuzz_cdb: a completion arrived before the command was submitted: the previous "
			"command (CDB %02x %02x %02x ...) completed twice\n", prev_cdb[0], prev_cdb[1], prev_cdb[2]);
		abort();
	}
	r->completions++;
	sem_post(&r->done);
}

static void submit(void *arg)
{
	struct run *r = arg;
	atomic_store(&r->submitted, true);
	scsi_cmd_submit(&r->cmd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const uint64_t luns[4] = { 0, 300, 1, 0 };
	struct run r;

	if (size < 4)
		return 0;
	uint8_t sel = data[0];
	size_t cdb_len = 6 + data[1] % 11;
	size_t din = ((size_t)data[2] << 8 | data[3]) * 4;
	if (din > MAX_IO)
		din = MAX_IO;
	data += 4;
	size -= 4;
	if (size < cdb_len)
		return 0;

	memset(&r, 0, sizeof(r));
	memcpy(r.cmd.cdb, data, cdb_len);
	if (sel & 0x10) {
		size_t n;
		const struct cmd_desc *tab = scsi_cmd_table(&n);
		const struct cmd_desc *d = &tab[data[0] % n];
		r.cmd.cdb[0] = d->opcode;
		if (d->flags & CMDF_SA)
			r.cmd.cdb[1] = (uint8_t)((r.cmd.cdb[1] & 0xe0) | d->sa);
		cdb_len = d->cdb_len;
		if (size < cdb_len)
			return 0;
		memcpy(r.cmd.cdb + 1, data + 1, cdb_len - 1);
		if (d->flags & CMDF_SA)
			r.cmd.cdb[1] = (uint8_t)((r.cmd.cdb[1] & 0xe0) | d->sa);
		if (sel & 0x20) /* keep reserved bits clear half of the time */
			for (size_t i = 1; i < cdb_len; i++)
				r.cmd.cdb[i] &= d->usage[i];
	}
	r.cmd.cdb_len = (uint8_t)cdb_len;
	data += cdb_len;
	size -= cdb_len;
	if (size > MAX_IO)
		size = MAX_IO;
	r.cmd.nexus = nexus[sel & 1];
	r.cmd.lun = luns[(sel >> 1) & 3];
	r.cmd.task_attr = SCSI_TASK_SIMPLE;
	if (sel & 0x08) {
		memcpy(dout_buf, data, size);
		r.iov.iov_base = dout_buf;
		r.iov.iov_len = size;
		r.cmd.write_len = (uint32_t)size;
		r.cmd.dir = SCSI_DIR_WRITE;
	} else {
		r.iov.iov_base = din_buf;
		r.iov.iov_len = din;
		r.cmd.read_len = (uint32_t)din;
		r.cmd.dir = SCSI_DIR_READ;
	}
	r.cmd.iov = &r.iov;
	r.cmd.iovcnt = 1;
	r.cmd.done = on_done;
	r.cmd.fe_priv = &r;
	sem_init(&r.done, 0, 0);
	worker_post(worker_get(0), submit, &r);
	while (sem_wait(&r.done) < 0 && errno == EINTR)
		; /* libFuzzer's -timeout alarm interrupts the wait; the command is still running */

	/* exactly one completion, sane answers */
	if (r.completions != 1 || r.cmd.data_in_len > r.cmd.read_len || r.cmd.sense_len > SCSI_SENSE_MAX ||
	    (r.cmd.status == SAM_STAT_CHECK_CONDITION && r.cmd.sense_len < 8) ||
	    (r.cmd.status != SAM_STAT_GOOD && r.cmd.status != SAM_STAT_CHECK_CONDITION &&
	     r.cmd.status != SAM_STAT_RESERVATION_CONFLICT)) {
		fprintf(stderr, "fuzz_cdb: CDB %02x (len %u): %d completion(s), status 0x%02x, sense %u bytes, "
			"Data-In %u of %u\n", r.cmd.cdb[0], r.cmd.cdb_len, r.completions, r.cmd.status,
			r.cmd.sense_len, r.cmd.data_in_len, r.cmd.read_len);
		abort();
	}
	memcpy(prev_cdb, r.cmd.cdb, sizeof(prev_cdb));
	sem_destroy(&r.done);
	return 0;
}
