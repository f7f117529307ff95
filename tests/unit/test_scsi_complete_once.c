/*
 * test_scsi_complete_once.c - every SCSI command completes exactly once.
 *
 * Handlers return SCSI_RC_DONE or SCSI_RC_PENDING and scsi_cmd_submit
 * completes a DONE answer in one place (backstore/lu.h); this proves the
 * rule from the front end's side, where a missed completion is a hung
 * command and a doubled one a response for a freed command:
 *  - every entry of the command table gets a CDB that reaches its handler
 *    (and the bdev, for the block commands), the same CDB with a reserved
 *    bit set, with an LBA past the end, sent to an unmapped LUN, sent while
 *    the device fails every I/O (bdev/fault.h), and a run of seeded random
 *    CDBs; each command's done() must be called exactly once, also after
 *    the worker has gone quiet (a late second completion), and no command
 *    may stay counted on the LU;
 *  - in debug builds (TC_DEBUG: make asan), completing a command a second
 *    time, or one never submitted, aborts with a message naming it: a
 *    forked child does each, and the parent checks SIGABRT and the message.
 * Prints one line per check; exit status 0 means every check passed.
 */
#include "tests/unit/check.h"
#include "tests/unit/scsi_test_util.h"
#include "backstore/lu.h" /* scsi_cmd_table, scsi_cmd_complete */
#include "backstore/scsi.h"
#include "bdev/fault.h"
#include "bdev/file.h"
#include "common/worker.h"

#include <errno.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BS 512u
#define NBLOCKS 32768u           /* 16 MiB */
#define DATA_MAX (64u << 10)
#define RANDOM_PER_ENTRY 48
#define UNMAPPED_LUN 9

static struct scsi_nexus *nexus;
static struct scsi_lu *lu;
static struct bdev *fault_dev;
static uint8_t *data;            /* every command's data buffer */
static uint8_t naa[8];           /* the LU's NAA designator, for EXTENDED COPY */

/* One command, kept until the end so that a late second completion still
 * finds its counter. */
struct job {
	struct scsi_cmd cmd;
	struct iovec iov;
	atomic_int done_calls;
	atomic_int calls_at_return; /* done_calls when scsi_cmd_submit returned */
	sem_t done;
	const char *what;
	struct job *next;
};
static struct job *jobs;
static int njobs;

static void job_done(struct scsi_cmd *cmd)
{
	struct job *j = cmd->fe_priv;
	atomic_fetch_add(&j->done_calls, 1);
	sem_post(&j->done);
}

static void submit_on_worker(void *arg)
{
	struct job *j = arg;
	scsi_cmd_submit(&j->cmd);
	atomic_store(&j->calls_at_return, atomic_load(&j->done_calls));
}

/* Run cdb on the worker and wait for its first completion; a command that
 * never completes ends the test (the rest would wait behind it). */
static struct job *run(const char *what, uint64_t lun, const uint8_t *cdb, unsigned cdb_len,
		       uint32_t write_len, uint32_t read_len)
{
	struct job *j = calloc(1, sizeof(*j));
	REQUIRE(j, "out of memory");
	sem_init(&j->done, 0, 0);
	scsi_cmd_prepare(&j->cmd, &j->iov, nexus, lun, cdb, cdb_len, data, write_len, read_len, job_done, j);
	j->cmd.task_attr = SCSI_TASK_SIMPLE;
	j->what = what;
	j->next = jobs;
	jobs = j;
	njobs++;
	REQUIRE(worker_post(worker_get(0), submit_on_worker, j) == 0, "cannot post to the worker");
	REQUIRE(sem_wait_secs(&j->done, 30), "%s (CDB %02x %02x) was never completed", what, cdb[0], cdb[1]);
	return j;
}

static void put_be(uint8_t *p, uint64_t v, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		p[i] = (uint8_t)(v >> (8 * (n - 1 - i)));
}

/* LBA and transfer length where the READ/WRITE families keep them. */
static void put_lba_len(uint8_t *cdb, unsigned len, uint64_t lba, uint32_t n)
{
	switch (len) {
	case 6:
		put_be(cdb + 1, lba & 0x1fffff, 3);
		cdb[4] = (uint8_t)n;
		break;
	case 10:
		put_be(cdb + 2, lba, 4);
		put_be(cdb + 7, n, 2);
		break;
	case 12:
		put_be(cdb + 2, lba, 4);
		put_be(cdb + 6, n, 4);
		break;
	default:
		put_be(cdb + 2, lba, 8);
		put_be(cdb + 10, n, 4);
		break;
	}
}

/* An EXTENDED COPY parameter list in data: 4 blocks from LBA 100 to LBA
 * 2000 of this LU; returns its length. */
static uint32_t xcopy_params(void)
{
	memset(data, 0, 16 + 32 + 28);
	data[1] = 0x10;          /* list id usage 10b: no results kept */
	data[3] = 32;            /* one target descriptor */
	data[11] = 28;           /* one segment descriptor */
	uint8_t *td = data + 16;
	td[0] = 0xe4;
	td[4] = 0x01;
	td[5] = 0x03;            /* NAA, LU association */
	td[7] = 8;
	memcpy(td + 8, naa, 8);
	put_be(td + 30, BS, 2);
	uint8_t *sd = data + 48;
	sd[0] = 0x02;
	sd[3] = 24;
	sd[11] = 4;
	put_be(sd + 12, 100, 8);
	put_be(sd + 20, 2000, 8);
	return 16 + 32 + 28;
}

/*
 * A CDB for table entry d that gets past dispatch into its handler, with
 * the data it needs: reads and writes of a few blocks, a BYTCHK VERIFY, a
 * COMPARE AND WRITE, WRITE SAME, UNMAP and EXTENDED COPY with parameter
 * lists, allocation lengths that fit. Sets *wlen and *rlen.
 */
static void valid_cdb(const struct cmd_desc *d, uint8_t *cdb, uint32_t *wlen, uint32_t *rlen)
{
	unsigned len = d->cdb_len;

	memset(cdb, 0, SCSI_CDB_MAX);
	cdb[0] = d->opcode;
	if (d->flags & CMDF_SA)
		cdb[1] = d->sa;
	*wlen = 0;
	*rlen = d->dir == SCSI_DIR_READ ? 4096 : 0;
	memset(data, 0x5a, DATA_MAX);
	switch (d->opcode) {
	case OP_READ_6: case OP_READ_10: case OP_READ_12: case OP_READ_16:
		put_lba_len(cdb, len, 8, 2);
		*rlen = 2 * BS;
		break;
	case OP_WRITE_6: case OP_WRITE_10: case OP_WRITE_12: case OP_WRITE_16:
	case OP_WRITE_VERIFY_10: case OP_WRITE_VERIFY_12: case OP_WRITE_VERIFY_16: case OP_ORWRITE_16:
		put_lba_len(cdb, len, 8, 2);
		*wlen = 2 * BS;
		break;
	case OP_VERIFY_10: case OP_VERIFY_12: case OP_VERIFY_16:
		cdb[1] = 0x02; /* BYTCHK 01b: compare with the Data-Out */
		put_lba_len(cdb, len, 8, 2);
		*wlen = 2 * BS;
		break;
	case OP_COMPARE_AND_WRITE:
		put_be(cdb + 2, 8, 8);
		cdb[13] = 1;
		*wlen = 2 * BS;
		break;
	case OP_WRITE_SAME_10: case OP_WRITE_SAME_16:
		put_lba_len(cdb, len, 64, 16);
		*wlen = BS;
		break;
	case OP_SYNC_CACHE_10: case OP_SYNC_CACHE_16: case OP_PREFETCH_10: case OP_PREFETCH_16:
		put_lba_len(cdb, len, 8, 2);
		break;
	case OP_UNMAP:
		memset(data, 0, 24);
		data[1] = 22;
		data[3] = 16;
		put_be(data + 8, 4096, 8);
		put_be(data + 16, 64, 4);
		put_be(cdb + 7, 24, 2);
		*wlen = 24;
		break;
	case OP_SANITIZE:
		break; /* BLOCK ERASE of the whole LU, or EXIT FAILURE MODE */
	case OP_EXTENDED_COPY:
		*wlen = xcopy_params();
		put_be(cdb + 10, *wlen, 4);
		break;
	case OP_RECEIVE_COPY_RESULTS:
	case OP_SERVICE_ACTION_IN_16:
		put_be(cdb + 10, 64, 4);
		break;
	case OP_INQUIRY:
		put_be(cdb + 3, 96, 2);
		break;
	case OP_REQUEST_SENSE:
		cdb[4] = 18;
		break;
	case OP_MODE_SENSE_6:
		cdb[2] = 0x3f;
		cdb[4] = 255;
		break;
	case OP_MODE_SENSE_10:
		cdb[2] = 0x3f;
		put_be(cdb + 7, 255, 2);
		break;
	case OP_PR_IN:
	case OP_READ_DEFECT_DATA_10:
		put_be(cdb + 7, 64, 2);
		break;
	case OP_READ_DEFECT_DATA_12:
		put_be(cdb + 6, 64, 4);
		break;
	case OP_PR_OUT:
		cdb[2] = 0x01; /* scope LU, type WRITE EXCLUSIVE */
		memset(data, 0, 24);
		put_be(cdb + 5, 24, 4);
		*wlen = 24;
		break;
	case OP_REPORT_LUNS:
	case OP_MAINTENANCE_IN:
		put_be(cdb + 6, 4096, 4);
		break;
	case OP_SEND_DIAGNOSTIC:
		cdb[1] = 0x04; /* SELFTEST */
		break;
	default:
		break;
	}
}

/* The first reserved bit of d's CDB (usage mask clear, outside the control
 * byte's vendor bits): true with its byte and bit. */
static bool reserved_bit(const struct cmd_desc *d, unsigned *byte, unsigned *bit)
{
	for (unsigned i = 1; i < d->cdb_len && i < 16; i++) {
		uint8_t allowed = d->usage[i] | (i == d->cdb_len - 1u ? 0xc0 : 0);
		if (allowed != 0xff) {
			*byte = i;
			*bit = (unsigned)__builtin_ctz((unsigned)(uint8_t)~allowed);
			return true;
		}
	}
	return false;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next_random(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

/* Post nothing to the worker and wait for it: whatever the worker had
 * queued before (a deferred write's resume, a completion) has run. */
static void drain_on_worker(void *arg)
{
	sem_post(arg);
}

static void worker_drain(void)
{
	sem_t s;
	sem_init(&s, 0, 0);
	REQUIRE(worker_post(worker_get(0), drain_on_worker, &s) == 0, "cannot post to the worker");
	REQUIRE(sem_wait_secs(&s, 30), "the worker does not answer");
	sem_destroy(&s);
}

/* Every entry of the command table, each way that ends it differently. */
static void every_table_entry_completes_once(void)
{
	size_t n;
	const struct cmd_desc *tab = scsi_cmd_table(&n);
	uint8_t cdb[SCSI_CDB_MAX];
	uint32_t wlen, rlen;
	int before = njobs, reserved = 0;

	for (size_t i = 0; i < n; i++) {
		const struct cmd_desc *d = &tab[i];
		unsigned byte, bit;

		valid_cdb(d, cdb, &wlen, &rlen);
		run(d->name, 0, cdb, d->cdb_len, wlen, rlen);

		if (reserved_bit(d, &byte, &bit)) {
			valid_cdb(d, cdb, &wlen, &rlen);
			cdb[byte] |= (uint8_t)(1u << bit);
			run(d->name, 0, cdb, d->cdb_len, wlen, rlen);
			reserved++;
		}

		if (d->flags & (CMDF_READS | CMDF_WRITES)) {
			valid_cdb(d, cdb, &wlen, &rlen);
			put_lba_len(cdb, d->cdb_len, d->cdb_len == 16 ? NBLOCKS + 5 : 0x1fffff, 2);
			if (d->flags & CMDF_SA)
				cdb[1] = d->sa;
			run(d->name, 0, cdb, d->cdb_len, wlen, rlen);
		}

		valid_cdb(d, cdb, &wlen, &rlen);
		run(d->name, UNMAPPED_LUN, cdb, d->cdb_len, wlen, rlen);
	}
	/* the same valid CDBs on a device that fails every read and write */
	REQUIRE(bdev_fault_set(fault_dev, BDEV_FAULT_EIO, 0, 0) == 0, "cannot make the device fail");
	for (size_t i = 0; i < n; i++) {
		valid_cdb(&tab[i], cdb, &wlen, &rlen);
		run(tab[i].name, 0, cdb, tab[i].cdb_len, wlen, rlen);
	}
	REQUIRE(bdev_fault_set(fault_dev, BDEV_FAULT_NONE, 0, 0) == 0, "cannot heal the device");
	CHECK(reserved > (int)n / 2, "%d of the %zu entries have a reserved CDB bit to set", reserved, n);
	printf("    %d commands over the table entries (valid, reserved bit, LBA past the end, unmapped "
	       "LUN, failing device) each had a first completion\n", njobs - before);
}

/* Seeded random CDBs per entry: opcode and service action from the table,
 * every other byte random, reserved bits cleared half of the time. */
static void random_cdbs_complete_once(void)
{
	size_t n;
	const struct cmd_desc *tab = scsi_cmd_table(&n);
	uint8_t cdb[SCSI_CDB_MAX];
	int before = njobs;

	for (size_t i = 0; i < n; i++) {
		const struct cmd_desc *d = &tab[i];
		for (int r = 0; r < RANDOM_PER_ENTRY; r++) {
			uint64_t sel = next_random();
			for (unsigned k = 0; k < SCSI_CDB_MAX; k++)
				cdb[k] = (uint8_t)next_random();
			cdb[0] = d->opcode;
			if (sel & 1)
				for (unsigned k = 1; k < d->cdb_len && k < 16; k++)
					cdb[k] &= d->usage[k];
			if (sel & 2) /* small numbers: an LBA and length that may fit */
				for (unsigned k = 2; k < d->cdb_len; k++)
					cdb[k] &= (uint8_t)(k % 4 == 1 ? 0x0f : 0);
			if (d->flags & CMDF_SA)
				cdb[1] = (uint8_t)((cdb[1] & 0xe0) | d->sa);
			uint32_t len = (uint32_t)(sel >> 8) % DATA_MAX;
			if (sel & 4)
				len &= ~(BS - 1);
			for (uint32_t k = 0; k < len; k++)
				data[k] = (uint8_t)(k % 7 ? 0 : next_random());
			if (d->dir == SCSI_DIR_WRITE)
				run(d->name, 0, cdb, d->cdb_len, len, 0);
			else
				run(d->name, 0, cdb, d->cdb_len, 0, len);
		}
	}
	CHECK(njobs - before == (int)n * RANDOM_PER_ENTRY, "%d random CDBs each had a first completion",
	      njobs - before);
}

/* After the worker went quiet: no command completed twice, none is still
 * counted on the LU. */
static void no_command_completed_twice(void)
{
	int bad = 0;

	worker_drain();
	usleep(100 * 1000);
	worker_drain();
	for (struct job *j = jobs; j; j = j->next) {
		int c = atomic_load(&j->done_calls);
		if (c != 1) {
			if (bad++ < 10)
				printf("  %s (CDB %02x %02x ...): %d completions\n", j->what, j->cmd.cdb[0],
				       j->cmd.cdb[1], c);
		}
	}
	CHECK(bad == 0, "all %d commands completed exactly once (%d did not)", njobs, bad);
	int later = 0;
	for (struct job *j = jobs; j; j = j->next)
		later += atomic_load(&j->calls_at_return) == 0;
	CHECK(later >= 40 && later < njobs / 2, "both ends were taken: %d commands completed after "
	      "scsi_cmd_submit returned (SCSI_RC_PENDING), %d before", later, njobs - later);
	CHECK(scsi_lu_inflight(lu) == 0, "no command is still counted on the LU (%u are)", scsi_lu_inflight(lu));
}

/* ---- debug builds: a doubled completion aborts ---------------------------- */

#ifdef TC_DEBUG
static void done_nothing(struct scsi_cmd *cmd)
{
	(void)cmd;
}

/* In a child: a TEST UNIT READY answered synchronously, then what how says.
 * Returns the child's wait status; its stderr goes to msg. */
static int child_completes(int how, char *msg, size_t cap)
{
	int fds[2];
	REQUIRE(pipe(fds) == 0, "pipe");
	fflush(stdout);
	pid_t pid = fork();
	REQUIRE(pid >= 0, "fork");
	if (pid == 0) {
		static const uint8_t tur[6] = { OP_TEST_UNIT_READY };
		static struct scsi_cmd c;
		dup2(fds[1], 2);
		close(fds[0]);
		memcpy(c.cdb, tur, sizeof(tur));
		c.cdb_len = 6;
		c.nexus = nexus;
		c.done = done_nothing;
		if (how != 2)
			scsi_cmd_submit(&c); /* the worker is not ours here; TUR needs none */
		if (how >= 1)
			scsi_cmd_complete(&c);
		_exit(0);
	}
	close(fds[1]);
	size_t got = 0;
	ssize_t r;
	while (got + 1 < cap && (r = read(fds[0], msg + got, cap - 1 - got)) > 0)
		got += (size_t)r;
	while (got && msg[got - 1] == '\n')
		got--;
	msg[got] = 0;
	close(fds[0]);
	int st;
	REQUIRE(waitpid(pid, &st, 0) == pid, "waitpid");
	return st;
}
#endif

static void doubled_completion_aborts(void)
{
#ifdef TC_DEBUG
	char msg[1024];
	int st = child_completes(0, msg, sizeof(msg));
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0 && !msg[0],
	      "a command completed once: the child exits 0 and says nothing");
	st = child_completes(1, msg, sizeof(msg));
	CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT && strstr(msg, "TEST UNIT READY") &&
		      strstr(msg, "completed twice"),
	      "a command completed a second time aborts, naming it: %s", msg);
	st = child_completes(2, msg, sizeof(msg));
	CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT && strstr(msg, "never submitted"),
	      "completing a command never submitted aborts: %s", msg);
#else
	printf("skip: not a debug build (TC_DEBUG); build/asan/tests/test_scsi_complete_once checks the abort\n");
#endif
}

/* ---- setup ------------------------------------------------------------------ */

static void nexus_on_worker(void *arg)
{
	static const uint8_t isid[6] = { 0x40, 0, 0, 0, 0, 1 };
	struct scsi_target *t = arg;
	nexus = scsi_nexus_open(t, "iqn.2026-11.test:once", isid, 1);
}

static void nexus_close_on_worker(void *arg)
{
	scsi_nexus_close(arg);
}

int main(void)
{
	const char *tmp = getenv("TMPDIR");
	char dir[512], path[600], err[256];

	snprintf(dir, sizeof(dir), "%s/tc-once-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	REQUIRE(mkdtemp(dir), "mkdtemp");
	snprintf(path, sizeof(path), "%s/lu.img", dir);
	REQUIRE(workers_start(1) == 0, "cannot start a worker (io_uring unavailable?)");
	REQUIRE(posix_memalign((void **)&data, 4096, DATA_MAX) == 0, "out of memory");
	struct bdev *file = bdev_file_open(path, (uint64_t)NBLOCKS * BS, BS, true, err, sizeof(err));
	REQUIRE(file, "%s", err);
	fault_dev = bdev_fault_wrap(file);
	REQUIRE(fault_dev, "cannot wrap the device");
	struct scsi_lu_config cfg = {
		.name = "once", .serial = "TC-ONCE-1", .state_dir = dir, .block_size = BS,
		.vendor = "TIERCACH", .product = "unit-test", .revision = "0001",
		.target_port_group = 1, .rel_port_id = 1,
	};
	lu = scsi_lu_open(&cfg, fault_dev, err, sizeof(err));
	REQUIRE(lu, "%s", err);
	struct scsi_target *t = scsi_target_new("iqn.2026-11.test:once");
	scsi_target_map(t, 0, lu);
	REQUIRE(worker_post(worker_get(0), nexus_on_worker, t) == 0, "cannot post to the worker");
	worker_drain(); /* posted calls run in order: the nexus is open */
	REQUIRE(nexus, "cannot open the nexus");

	static const uint8_t vpd83[6] = { OP_INQUIRY, 1, 0x83, 0, 255, 0 };
	run("INQUIRY", 0, vpd83, 6, 0, 255);
	memcpy(naa, data + 8, sizeof(naa));

	every_table_entry_completes_once();
	random_cdbs_complete_once();
	no_command_completed_twice();
	doubled_completion_aborts();

	while (jobs) {
		struct job *j = jobs;
		jobs = j->next;
		sem_destroy(&j->done);
		free(j);
	}
	REQUIRE(worker_post(worker_get(0), nexus_close_on_worker, nexus) == 0, "cannot post to the worker");
	worker_drain();
	workers_stop();
	scsi_target_free(t);
	scsi_lu_close(lu);
	unlink(path);
	snprintf(path, sizeof(path), "%s/once.pr", dir);
	unlink(path);
	rmdir(dir);
	free(data);
	return check_failures ? 1 : 0;
}
