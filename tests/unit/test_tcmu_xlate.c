/*
 * test_tcmu_xlate.c - the TCMU glue without a kernel: ring commands in,
 * backstore SCSI, libtcmu results and sense out (target/tcmu/xlate.c).
 *
 * A stand-in for the ring layer hands CDBs and iovecs to
 * tcmu_xlate_submit on a worker, exactly as target/tcmu/tcmu.c does with
 * what tcmulib_get_next_command returns, and records what would go to
 * tcmulib_command_complete: the result code and the 96-byte sense buffer.
 * Proves: data written through one command reads back through another
 * (aligned ring buffers used in place, ragged ones bounced), a short
 * Data-In does not leak stale ring bytes, many commands are in flight at
 * once, bad CDBs come back as PASSTHROUGH_ERR with the backstore's exact
 * sense, and the status -> result table and cfgstring rules hold; and
 * that a write the store holds past io_timeout is declared overdue by the
 * device's own tick, so that a later write to its blocks waits for it
 * (the kernel fails the first to LIO at cmd_time_out, and the host's next
 * write must not land under it).
 */
#include "tests/unit/check.h"
#include "backstore/scsi.h"
#include "bdev/fault.h"
#include "bdev/file.h"
#include "common/worker.h"
#include "target/tcmu/libtcmu_abi.h"
#include "target/tcmu/xlate.h"

#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>


/* What the ring would hold for one command. */
struct ring_cmd {
	uint8_t cdb[32];
	struct iovec iov[4];
	int iovcnt;
	uint8_t sense[TCMU_SENSE_BUFFERSIZE];
	struct tcmu_xcmd xc;
	int result;
};

static struct tcmu_xdev xd;
static sem_t done_sem;      /* one post per completed command (ring_done) */
static sem_t submitted_sem; /* one post per batch, once submit_batch is done with it */
static struct scsi_lu *lu;
static struct bdev *fault; /* the LU's device: a fault wrapper over the file */

static void ring_done(struct tcmu_xdev *d, struct tcmu_xcmd *xc, void *ring_cmd, int result)
{
	struct ring_cmd *rc = ring_cmd;
	(void)d;
	(void)xc;
	rc->result = result;
	sem_post(&done_sem);
}

struct batch {
	struct ring_cmd **cmds;
	int n;
};

static void submit_batch(void *arg)
{
	/* a copy: once the last command completes, run_batch returns and the
	 * batch on its stack is gone, perhaps before this loop checks i < n */
	const struct batch b = *(struct batch *)arg;
	for (int i = 0; i < b.n; i++) {
		struct ring_cmd *rc = b.cmds[i];
		tcmu_xlate_submit(&xd, &rc->xc, rc, rc->cdb, rc->iov, rc->iovcnt, rc->sense);
	}
	/* the last touch of *b: after this the caller may return */
	sem_post(&submitted_sem);
}

/*
 * Submit n ring commands from one worker call and wait for all. A command
 * may complete inside tcmu_xlate_submit (xlate.h allows it: TEST UNIT
 * READY, INQUIRY and every CHECK CONDITION raised before the media do), so
 * n completions can arrive while submit_batch is still looping over *b,
 * which lives in this frame: wait for the loop to finish too, not only
 * for the completions, before the frame goes away.
 */
static void run_batch(struct ring_cmd **cmds, int n)
{
	struct batch b = { cmds, n };
	worker_post(worker_get(0), submit_batch, &b);
	for (int i = 0; i < n; i++)
		sem_wait(&done_sem);
	sem_wait(&submitted_sem);
}

static void run1(struct ring_cmd *rc)
{
	run_batch(&rc, 1);
}

static void be32_put(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24);
	p[1] = (uint8_t)(v >> 16);
	p[2] = (uint8_t)(v >> 8);
	p[3] = (uint8_t)v;
}

static void rw10(struct ring_cmd *rc, uint8_t op, uint32_t lba, uint16_t blocks)
{
	memset(rc->cdb, 0, sizeof(rc->cdb));
	rc->cdb[0] = op;
	be32_put(rc->cdb + 2, lba);
	rc->cdb[7] = (uint8_t)(blocks >> 8);
	rc->cdb[8] = (uint8_t)blocks;
}

static void xdev_open_on_worker(void *arg)
{
	(void)arg;
	int r = tcmu_xdev_open(&xd, lu, "test-dev (uio0)", ring_done);
	CHECK(r == 0, "tcmu_xdev_open on the worker");
	sem_post(&done_sem);
}

static void xdev_close_on_worker(void *arg)
{
	(void)arg;
	tcmu_xdev_close(&xd);
	sem_post(&done_sem);
}

static uint8_t *abuf(size_t len, int fill)
{
	uint8_t *p = NULL;
	if (posix_memalign((void **)&p, 4096, len))
		exit(2);
	memset(p, fill, len);
	return p;
}

/* A fresh nexus owes its first command a POWER ON / RESET unit attention
 * (the ring layer consumes it at attach with its own TEST UNIT READY). */
static void test_first_unit_attention(void)
{
	struct ring_cmd tur = { .cdb = { 0x00, 0, 0, 0, 0, 0 } };
	run1(&tur);
	CHECK(tur.result == TCMU_STS_PASSTHROUGH_ERR && (tur.sense[2] & 0x0f) == 0x06 && tur.sense[12] == 0x29,
	      "first command on a new device: UNIT ATTENTION / POWER ON OR RESET in the ring's sense (key %x asc %02x)",
	      tur.sense[2] & 0x0f, tur.sense[12]);
}

static void test_inquiry_no_stale_bytes(void)
{
	struct ring_cmd rc = { .cdb = { 0x12, 0, 0, 0, 255, 0 } };
	uint8_t *data = abuf(4096, 0xaa);
	rc.iov[0] = (struct iovec){ data, 255 };
	rc.iovcnt = 1;
	run1(&rc);
	CHECK(rc.result == TCMU_STS_OK, "INQUIRY through the ring: result %d", rc.result);
	CHECK(!memcmp(data + 8, "TIERCACH", 8), "INQUIRY vendor is TIERCACH");
	unsigned len = 5u + data[4];
	bool clean = true;
	for (unsigned i = len; i < 255; i++)
		clean = clean && data[i] == 0;
	CHECK(len < 255 && clean, "bytes after the %u-byte INQUIRY answer are zeroed, not stale ring data", len);
	free(data);
}

static void test_write_read_back(void)
{
	struct ring_cmd w = { 0 }, r = { 0 };
	uint8_t *wdata = abuf(8192, 0);
	for (int i = 0; i < 8192; i++)
		wdata[i] = (uint8_t)(i * 7 + 3);
	/* aligned, two ring iovecs of one page each: used in place */
	rw10(&w, 0x2a, 100, 16);
	w.iov[0] = (struct iovec){ wdata, 4096 };
	w.iov[1] = (struct iovec){ wdata + 4096, 4096 };
	w.iovcnt = 2;
	uint64_t bounced0 = xd.bounced;
	run1(&w);
	CHECK(w.result == TCMU_STS_OK, "WRITE(10) of 16 blocks from two ring iovecs: result %d", w.result);
	CHECK(xd.bounced == bounced0, "page-aligned ring buffers are handed to the backstore in place");

	/* ragged: starts 512 bytes into a page, three pieces */
	uint8_t *rbase = abuf(16384, 0x55);
	uint8_t *rdata = rbase + 512;
	rw10(&r, 0x28, 100, 16);
	r.iov[0] = (struct iovec){ rdata, 1000 };
	r.iov[1] = (struct iovec){ rdata + 1000, 5000 };
	r.iov[2] = (struct iovec){ rdata + 6000, 2192 };
	r.iovcnt = 3;
	run1(&r);
	CHECK(r.result == TCMU_STS_OK, "READ(10) into a ragged ring buffer: result %d", r.result);
	CHECK(xd.bounced == bounced0 + 1, "a misaligned ring buffer goes through a bounce buffer");
	CHECK(!memcmp(rdata, wdata, 8192), "data read back through the ring equals what was written");

	/* forced bounce on the write side too */
	xd.force_bounce = true;
	for (int i = 0; i < 8192; i++)
		wdata[i] = (uint8_t)(255 - i);
	run1(&w);
	memset(rdata, 0, 8192);
	run1(&r);
	xd.force_bounce = false;
	CHECK(w.result == TCMU_STS_OK && r.result == TCMU_STS_OK && !memcmp(rdata, wdata, 8192),
	      "bounced write + bounced read keep the data");
	free(wdata);
	free(rbase);
}

static void test_many_in_flight(void)
{
	enum { N = 32 };
	struct ring_cmd *cmds[N];
	uint8_t *data = abuf((size_t)N * 4096, 0);
	for (int i = 0; i < N; i++) {
		cmds[i] = calloc(1, sizeof(struct ring_cmd));
		memset(data + (size_t)i * 4096, i + 1, 4096);
		rw10(cmds[i], 0x2a, (uint32_t)(1000 + i * 8), 8);
		cmds[i]->iov[0] = (struct iovec){ data + (size_t)i * 4096, 4096 };
		cmds[i]->iovcnt = 1;
	}
	xd.max_inflight = 0;
	run_batch(cmds, N);
	bool all_ok = true;
	for (int i = 0; i < N; i++)
		all_ok = all_ok && cmds[i]->result == TCMU_STS_OK;
	CHECK(all_ok, "%d writes submitted in one ring pass all complete OK", N);
	CHECK(xd.max_inflight == N, "all %d were in flight at once (max in flight %u)", N, xd.max_inflight);
	memset(data, 0, (size_t)N * 4096);
	for (int i = 0; i < N; i++)
		rw10(cmds[i], 0x28, (uint32_t)(1000 + i * 8), 8);
	run_batch(cmds, N);
	bool same = true;
	for (int i = 0; i < N; i++)
		for (int k = 0; k < 4096; k++)
			same = same && data[(size_t)i * 4096 + k] == (uint8_t)(i + 1);
	CHECK(same, "and read back in parallel, every block holds its own pattern");
	for (int i = 0; i < N; i++)
		free(cmds[i]);
	free(data);
}

static void test_error_sense(void)
{
	struct ring_cmd rc = { 0 };
	uint8_t *data = abuf(4096, 0);
	rw10(&rc, 0x28, 0xfffffff0u, 1); /* far past the end of a 64 MiB LU */
	rc.iov[0] = (struct iovec){ data, 512 };
	rc.iovcnt = 1;
	uint64_t cc0 = xd.check_conditions;
	run1(&rc);
	CHECK(rc.result == TCMU_STS_PASSTHROUGH_ERR, "READ past the end: result PASSTHROUGH_ERR (%d)", rc.result);
	CHECK((rc.sense[0] & 0x7f) == 0x70 && (rc.sense[2] & 0x0f) == 0x05 && rc.sense[12] == 0x21 &&
		      rc.sense[13] == 0x00,
	      "its sense in the ring buffer is ILLEGAL REQUEST / LBA OUT OF RANGE (key %x asc %02x ascq %02x)",
	      rc.sense[2] & 0x0f, rc.sense[12], rc.sense[13]);
	CHECK(xd.check_conditions == cc0 + 1, "the device counts the CHECK CONDITION");

	struct ring_cmd bad = { .cdb = { 0xc5, 0, 0, 0, 0, 0 } }; /* vendor specific, unsupported */
	run1(&bad);
	CHECK(bad.result == TCMU_STS_PASSTHROUGH_ERR && (bad.sense[2] & 0x0f) == 0x05 && bad.sense[12] == 0x20,
	      "an unknown opcode: ILLEGAL REQUEST / INVALID COMMAND OPERATION CODE (asc %02x)", bad.sense[12]);

	struct ring_cmd tur = { .cdb = { 0x00, 0, 0, 0, 0, 0 } };
	memset(tur.sense, 0xee, sizeof(tur.sense));
	run1(&tur);
	CHECK(tur.result == TCMU_STS_OK && tur.sense[0] == 0, "TEST UNIT READY: OK, with a clean sense buffer");
	free(data);
}

static struct scsi_cmd cap_seen;
static uint8_t cap_buf[32] __attribute__((aligned(64)));

static void cap_done(struct scsi_cmd *sc, void *arg)
{
	(void)arg;
	cap_seen = *sc;
	sem_post(&done_sem);
}

static void cap_on_worker(void *arg)
{
	(void)arg;
	static const uint8_t cdb[16] = { 0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0 };
	if (tcmu_xlate_internal(&xd, cdb, cap_buf, sizeof(cap_buf), false, cap_done, NULL) < 0)
		sem_post(&done_sem);
}

static void test_internal_command(void)
{
	worker_post(worker_get(0), cap_on_worker, NULL);
	sem_wait(&done_sem);
	uint64_t last = 0;
	for (int i = 0; i < 8; i++)
		last = last << 8 | cap_buf[i];
	uint32_t bs = (uint32_t)cap_buf[8] << 24 | (uint32_t)cap_buf[9] << 16 | (uint32_t)cap_buf[10] << 8 | cap_buf[11];
	CHECK(cap_seen.status == SAM_STAT_GOOD && last + 1 == 131072 && bs == 512,
	      "our own READ CAPACITY(16) on the device's nexus: %llu blocks of %u bytes",
	      (unsigned long long)(last + 1), bs);
}

static void test_result_table(void)
{
	struct scsi_cmd sc;
	uint8_t sense[TCMU_XLATE_SENSE_LEN];

	memset(&sc, 0, sizeof(sc));
	sc.status = SAM_STAT_GOOD;
	CHECK(tcmu_xlate_result(&sc, sense) == TCMU_STS_OK, "GOOD -> OK");
	sc.status = SAM_STAT_CONDITION_MET;
	CHECK(tcmu_xlate_result(&sc, sense) == TCMU_STS_OK, "CONDITION MET -> OK");
	sc.status = SAM_STAT_BUSY;
	CHECK(tcmu_xlate_result(&sc, sense) == TCMU_STS_BUSY, "BUSY -> BUSY");
	sc.status = SAM_STAT_TASK_SET_FULL;
	CHECK(tcmu_xlate_result(&sc, sense) == TCMU_STS_NO_RESOURCE, "TASK SET FULL -> NO_RESOURCE");
	sc.status = SAM_STAT_RESERVATION_CONFLICT;
	CHECK(tcmu_xlate_result(&sc, sense) == TCMU_STS_BUSY, "RESERVATION CONFLICT -> BUSY (not expressible)");
	sc.status = SAM_STAT_CHECK_CONDITION;
	sc.sense_len = 0;
	CHECK(tcmu_xlate_result(&sc, sense) == TCMU_STS_HW_ERR, "CHECK CONDITION without sense -> HW_ERR");
	sc.sense_len = 18;
	sc.sense[0] = 0x70;
	sc.sense[2] = 0x03;
	sc.sense[12] = 0x11;
	memset(sense, 0xff, sizeof(sense));
	CHECK(tcmu_xlate_result(&sc, sense) == TCMU_STS_PASSTHROUGH_ERR && sense[2] == 0x03 && sense[12] == 0x11 &&
		      sense[18] == 0 && sense[95] == 0,
	      "CHECK CONDITION -> PASSTHROUGH_ERR, sense copied and the rest zeroed");
}

static void test_cdb_len_and_cfgstring(void)
{
	uint8_t cdb[32] = { 0 };
	/* the one rule both front ends use (backstore/scsi.h) */
	static const struct { uint8_t op; unsigned len; const char *what; } by_op[] = {
		{ 0x12, 6, "INQUIRY is a 6-byte CDB" },
		{ 0x28, 10, "READ(10) is 10 bytes" },
		{ 0xa8, 12, "READ(12) is 12 bytes" },
		{ 0x88, 16, "READ(16) is 16 bytes" },
		{ 0x60, 12, "reserved group 3 is sized 12, as Linux fills the ring" },
		{ 0xc0, 10, "vendor group 6 is sized 10" },
		{ 0xe5, 10, "vendor group 7 is sized 10" },
	};
	for (size_t i = 0; i < sizeof(by_op) / sizeof(by_op[0]); i++) {
		cdb[0] = by_op[i].op;
		CHECK(scsi_cdb_len(cdb) == by_op[i].len, "%s", by_op[i].what);
	}
	cdb[0] = 0x7f;
	cdb[7] = 24;
	CHECK(scsi_cdb_len(cdb) == 32, "a variable-length CDB is 8 + additional length");
	cdb[7] = 200;
	CHECK(scsi_cdb_len(cdb) == 208, "a variable-length CDB may pass SCSI_CDB_MAX (front ends refuse or cap)");

	const char *s;
	CHECK((s = tcmu_cfgstring_lun("tiercache/db")) && !strcmp(s, "db"), "tiercache/db names [lun db]");
	CHECK((s = tcmu_cfgstring_lun("tiercache/tiercache/db")) && !strcmp(s, "db"),
	      "tiercache/tiercache/db (subtype typed twice) names [lun db]");
	CHECK((s = tcmu_cfgstring_lun("db")) && !strcmp(s, "db"), "a bare db names [lun db]");
	CHECK(tcmu_cfgstring_lun("tiercache/") == NULL, "tiercache/ names nothing");
	CHECK(tcmu_cfgstring_lun("tiercache/a/b") == NULL, "a path is not a LUN name");
}

static void submit_async(void *arg)
{
	struct ring_cmd *rc = arg;
	tcmu_xlate_submit(&xd, &rc->xc, rc, rc->cdb, rc->iov, rc->iovcnt, rc->sense);
}

static uint64_t overdue_now(void)
{
	struct scsi_lu_overdue o;
	scsi_lu_overdue(lu, &o);
	return o.now;
}

/* writes the store has held so far (a running count) */
static uint64_t held_writes(void)
{
	struct bdev_fault_counts c;
	bdev_fault_counts(fault, &c);
	return c.held_writes;
}

static bool wait_until(bool (*cond)(void), int ms)
{
	for (int i = 0; i < ms / 10; i++, usleep(10000))
		if (cond())
			return true;
	return cond();
}
static bool a_overdue(void) { return overdue_now() == 1; }
static bool one_held(void) { return held_writes() == 1; }
static bool two_held(void) { return held_writes() == 2; }
static bool none_overdue(void) { return overdue_now() == 0; }

static void test_overdue_fence(void)
{
	struct ring_cmd a = { 0 }, b = { 0 }, r = { 0 };
	uint8_t *da = abuf(4096, 'A'), *db = abuf(4096, 'B'), *dr = abuf(4096, 0);
	rw10(&a, 0x2a, 5000, 8);
	a.iov[0] = (struct iovec){ da, 4096 };
	a.iovcnt = 1;
	rw10(&b, 0x2a, 5000, 8);
	b.iov[0] = (struct iovec){ db, 4096 };
	b.iovcnt = 1;

	bdev_fault_set(fault, BDEV_FAULT_HANG, 0, 0);
	worker_post(worker_get(0), submit_async, &a);
	CHECK(wait_until(one_held, 5000), "WRITE A is held by the store");
	/* io_timeout is 2 s: the device's tick declares A overdue */
	CHECK(wait_until(a_overdue, 6000), "WRITE A, held past io_timeout, is declared overdue by the TCMU tick "
	      "(overdue now %llu)", (unsigned long long)overdue_now());
	worker_post(worker_get(0), submit_async, &b);
	/* B must wait behind A's fence: give it the time it would take to get
	 * to the device if it did not (it is on the same worker) */
	usleep(300000);
	CHECK(held_writes() == 1, "WRITE B of the same blocks waits for overdue A (%llu writes reached the store)",
	      (unsigned long long)held_writes());
	/* the store wakes up: A lands, then B reaches it and lands */
	CHECK(bdev_fault_pass_newest(fault) == 1, "A passed on to the file");
	sem_wait(&done_sem);
	CHECK(a.result == TCMU_STS_OK, "A's late status goes to the ring (the kernel drops it): result %d", a.result);
	CHECK(wait_until(two_held, 5000), "B reaches the store once A is back");
	CHECK(bdev_fault_pass_newest(fault) == 1, "B passed on to the file");
	sem_wait(&done_sem);
	bdev_fault_set(fault, BDEV_FAULT_NONE, 0, 0);
	CHECK(b.result == TCMU_STS_OK, "B completes: result %d", b.result);
	CHECK(wait_until(none_overdue, 1000), "no command is overdue once A is back");
	rw10(&r, 0x28, 5000, 8);
	r.iov[0] = (struct iovec){ dr, 4096 };
	r.iovcnt = 1;
	run1(&r);
	CHECK(r.result == TCMU_STS_OK && !memcmp(dr, db, 4096), "the blocks read back as B, the newer write");
	struct scsi_lu_overdue o;
	scsi_lu_overdue(lu, &o);
	CHECK(o.total == 1, "one command was overdue in all (%llu)", (unsigned long long)o.total);
	free(da);
	free(db);
	free(dr);
}

int main(void)
{
	char dir[] = "/tmp/tc-tcmu-xlate-XXXXXX";
	char path[300], err[256];

	if (!mkdtemp(dir))
		return 2;
	snprintf(path, sizeof(path), "%s/lun.img", dir);
	sem_init(&done_sem, 0, 0);
	sem_init(&submitted_sem, 0, 0);
	if (workers_start(1) < 0) {
		fprintf(stderr, "cannot start a worker (io_uring unavailable?)\n");
		return 2;
	}
	struct bdev *file = bdev_file_open(path, 131072ull * 512, 512, true, err, sizeof(err));
	struct bdev *dev = file ? bdev_fault_wrap(file) : NULL;
	fault = dev;
	if (!dev) {
		fprintf(stderr, "%s\n", err);
		return 2;
	}
	struct scsi_lu_config cfg = {
		.name = "db", .serial = "TCMU-XLATE-1", .state_dir = dir, .block_size = 512,
		.vendor = "TIERCACH", .product = "tcmu-test", .revision = "0001",
		.target_port_group = 1, .rel_port_id = 1, .io_timeout_ms = 2000,
	};
	lu = scsi_lu_open(&cfg, dev, err, sizeof(err));
	if (!lu) {
		fprintf(stderr, "%s\n", err);
		return 2;
	}
	worker_post(worker_get(0), xdev_open_on_worker, NULL);
	sem_wait(&done_sem);

	test_inquiry_no_stale_bytes();
	test_first_unit_attention();
	test_write_read_back();
	test_many_in_flight();
	test_error_sense();
	test_internal_command();
	test_result_table();
	test_cdb_len_and_cfgstring();
	test_overdue_fence();

	worker_post(worker_get(0), xdev_close_on_worker, NULL);
	sem_wait(&done_sem);
	workers_stop();
	scsi_lu_close(lu);
	unlink(path);
	char cmd[400];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	if (system(cmd) != 0)
		printf("note: could not remove %s\n", dir);
	printf("%s\n", check_failures ? "FAILED" : "all passed");
	return check_failures ? 1 : 0;
}
