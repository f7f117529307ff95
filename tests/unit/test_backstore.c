/*
 * test_backstore.c - the SCSI emulation answers real CDBs correctly.
 *
 * Starts one worker, opens an LU on a sparse temporary file through
 * bdev_file_open, and submits commands on the worker (the backstore's
 * threading contract) from two I_T nexuses, waiting for each completion
 * on a semaphore. Every check compares data, status and the exact sense
 * key / ASC / ASCQ, so a regression in decoding, sense building,
 * reservations, COMPARE AND WRITE, UNMAP or mode pages fails here.
 * Each function is named by the behaviour it proves; main runs them in
 * order on one fixture, and later ones build on the state earlier ones
 * leave (a unit attention taken, WCE set, reservations cleared).
 * Prints one line per check; exit status 0 means every check passed.
 */
#include "backstore/lu.h" /* scsi_fail_errno */
#include "backstore/scsi.h"
#include "bdev/file.h"
#include "common/worker.h"
#include "tests/unit/scsi_test_util.h"

#include <errno.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int failures;
static int checks;

static void check(bool ok, const char *what)
{
	checks++;
	if (!ok)
		failures++;
	printf("%s: %s\n", ok ? "ok" : "FAIL", what);
}

struct job {
	struct scsi_cmd cmd;
	sem_t done;
	struct iovec iov;
	struct scsi_target *tgt;
	struct scsi_nexus *nx;
	const char *iname;
};

static void cmd_done(struct scsi_cmd *cmd)
{
	struct job *j = cmd->fe_priv;
	sem_post(&j->done);
}

static void submit_on_worker(void *arg)
{
	struct job *j = arg;
	scsi_cmd_submit(&j->cmd);
}

static void nexus_on_worker(void *arg)
{
	struct job *j = arg;
	static const uint8_t isid[6] = { 0x40, 0, 0, 0, 0, 1 };
	j->nx = scsi_nexus_open(j->tgt, j->iname, isid, 1);
	sem_post(&j->done);
}

static void nexus_close_on_worker(void *arg)
{
	struct job *j = arg;
	scsi_nexus_close(j->nx);
	sem_post(&j->done);
}

/* scsi_nexus_close runs on a worker, like the front end's logout. */
static void close_nexus(struct scsi_nexus *nx)
{
	struct job j = { .nx = nx };
	sem_init(&j.done, 0, 0);
	worker_post(worker_get(0), nexus_close_on_worker, &j);
	sem_wait(&j.done);
}

static struct scsi_nexus *open_nexus(struct scsi_target *t, const char *iname)
{
	struct job j = { .tgt = t, .iname = iname };
	sem_init(&j.done, 0, 0);
	worker_post(worker_get(0), nexus_on_worker, &j);
	sem_wait(&j.done);
	return j.nx;
}

static uint8_t *buf;
#define BUF_LEN (1u << 20)

/* Run one command; data is in/out through buf. */
static struct scsi_cmd run(struct scsi_nexus *nx, uint64_t lun, const uint8_t *cdb, size_t cdb_len,
			   uint32_t write_len, uint32_t read_len)
{
	struct job *j = calloc(1, sizeof(*j));
	sem_init(&j->done, 0, 0);
	scsi_cmd_prepare(&j->cmd, &j->iov, nx, lun, cdb, cdb_len, buf, write_len, read_len, cmd_done, j);
	worker_post(worker_get(0), submit_on_worker, j);
	sem_wait(&j->done);
	struct scsi_cmd out = j->cmd;
	free(j);
	return out;
}

/* Two commands submitted back to back from one worker call, so the
 * second arrives while the first is still in flight. */
struct pair {
	struct job *first, *second;
};

static void submit_pair_on_worker(void *arg)
{
	struct pair *p = arg;
	scsi_cmd_submit(&p->first->cmd);
	scsi_cmd_submit(&p->second->cmd);
}

static struct job *job_new(struct scsi_nexus *nx, const uint8_t *cdb, size_t cdb_len, void *data,
			   uint32_t write_len)
{
	struct job *j = calloc(1, sizeof(*j));
	sem_init(&j->done, 0, 0);
	memcpy(j->cmd.cdb, cdb, cdb_len);
	j->cmd.cdb_len = (uint8_t)cdb_len;
	j->cmd.nexus = nx;
	j->iov.iov_base = data;
	j->iov.iov_len = write_len;
	j->cmd.iov = &j->iov;
	j->cmd.iovcnt = 1;
	j->cmd.write_len = write_len;
	j->cmd.dir = SCSI_DIR_WRITE;
	j->cmd.done = cmd_done;
	j->cmd.fe_priv = j;
	return j;
}

static bool sense_is(const struct scsi_cmd *c, uint8_t key, uint8_t asc, uint8_t ascq)
{
	if (c->status != SAM_STAT_CHECK_CONDITION || c->sense_len < 14)
		return false;
	if ((c->sense[0] & 0x7f) == 0x72)
		return (c->sense[1] & 0xf) == key && c->sense[2] == asc && c->sense[3] == ascq;
	return (c->sense[2] & 0xf) == key && c->sense[12] == asc && c->sense[13] == ascq;
}

static void be32(uint8_t *p, uint32_t v) { p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v; }
static void be64(uint8_t *p, uint64_t v) { be32(p, v >> 32); be32(p + 4, (uint32_t)v); }
static uint32_t rd32(const uint8_t *p) { return (uint32_t)p[0] << 24 | p[1] << 16 | p[2] << 8 | p[3]; }
static uint64_t rd64(const uint8_t *p) { return (uint64_t)rd32(p) << 32 | rd32(p + 4); }

static struct scsi_cmd rw10(struct scsi_nexus *nx, uint8_t op, uint32_t lba, uint16_t n, uint32_t bytes)
{
	uint8_t cdb[10] = { op };
	be32(cdb + 2, lba);
	cdb[7] = n >> 8;
	cdb[8] = (uint8_t)n;
	return op == 0x2a ? run(nx, 0, cdb, 10, bytes, 0) : run(nx, 0, cdb, 10, 0, bytes);
}

static void clear_ua(struct scsi_nexus *nx)
{
	static const uint8_t tur[6] = { 0 };
	for (int i = 0; i < 8; i++)
		if (run(nx, 0, tur, 6, 0, 0).status == SAM_STAT_GOOD)
			return;
}

static void tpr_out(struct scsi_nexus *nx, uint8_t sa, uint8_t type, uint64_t key, uint64_t sa_key,
		   struct scsi_cmd *out)
{
	uint8_t cdb[10] = { 0x5f, sa, type };
	cdb[8] = 24;
	memset(buf, 0, 24);
	be64(buf, key);
	be64(buf + 8, sa_key);
	*out = run(nx, 0, cdb, 10, 24, 0);
}

/* ---- implicit ALUA over a shared backing store ------------------------------- */

/*
 * A unit-test double of a shared device (bdev.h "Ownership"): a file bdev
 * underneath, and an ownership state the test sets by hand, announcing
 * changes to the listener as a driver would (the real one, over an RBD
 * image's lock, is exercised by tests/test_rbd_failover.sh).
 */
struct shared_dev {
	struct bdev dev;
	struct bdev *inner;
	struct bdev_ops ops;
	_Atomic int state;
	_Atomic uint64_t gen;
	_Atomic uint32_t owner;
	_Atomic int acquires;
	_Atomic int unowned;        /* READs submitted with BDEV_F_UNOWNED */
	_Atomic int owned_reads;    /* READs submitted without */
	_Atomic bool no_unowned;    /* what unowned_reads answers, negated */
	void (*fn)(void *arg, const struct bdev_owner_change *c);
	void *arg;
};

static void sh_submit(struct bdev *dev, struct bdev_req *req)
{
	struct shared_dev *d = (struct shared_dev *)dev;
	if (req->op == BDEV_READ)
		atomic_fetch_add(req->flags & BDEV_F_UNOWNED ? &d->unowned : &d->owned_reads, 1);
	bdev_submit(d->inner, req);
}

static void sh_close(struct bdev *dev)
{
	struct shared_dev *d = (struct shared_dev *)dev;
	bdev_close(d->inner);
	free(d);
}

static enum bdev_owner_state sh_state(struct bdev *dev, uint64_t *gen)
{
	struct shared_dev *d = (struct shared_dev *)dev;
	*gen = atomic_load(&d->gen);
	return (enum bdev_owner_state)atomic_load(&d->state);
}

static void sh_acquire(struct bdev *dev)
{
	struct shared_dev *d = (struct shared_dev *)dev;
	atomic_fetch_add(&d->acquires, 1);
	atomic_store(&d->state, BDEV_OWNER_TRANSITION);
}

static void sh_listen(struct bdev *dev, void (*fn)(void *arg, const struct bdev_owner_change *c), void *arg)
{
	struct shared_dev *d = (struct shared_dev *)dev;
	d->fn = fn;
	d->arg = arg;
}

static bool sh_unowned_reads(struct bdev *dev)
{
	return !atomic_load(&((struct shared_dev *)dev)->no_unowned);
}

static uint32_t sh_owner_group(struct bdev *dev)
{
	return atomic_load(&((struct shared_dev *)dev)->owner);
}

static const struct bdev_owner_ops sh_owner_ops = {
	.state = sh_state,
	.acquire = sh_acquire,
	.listen = sh_listen,
	.owner_group = sh_owner_group,
	.unowned_reads = sh_unowned_reads,
};

/* Change the state as the driver would: listener first (state still
 * TRANSITION for a gain), then publish. */
static void sh_change(struct shared_dev *d, enum bdev_owner_state st, uint32_t owner, uint64_t gen)
{
	struct bdev_owner_change c = { .state = st, .gen = gen, .prev_gen = atomic_load(&d->gen) };
	atomic_store(&d->owner, owner);
	if (st == BDEV_OWNER_OWNED)
		atomic_store(&d->gen, gen);
	if (d->fn)
		d->fn(d->arg, &c);
	atomic_store(&d->state, st);
}

/* RTPG (extended header) into buf; the descriptor of group g or NULL. */
static const uint8_t *rtpg_group(const uint8_t *b, uint32_t len, uint16_t g)
{
	for (uint32_t off = 8; off + 8 <= len + 4; off += 8 + 4 * b[off + 7])
		if ((b[off + 2] << 8 | b[off + 3]) == g)
			return b + off;
	return NULL;
}

static int rtpg_count(const uint8_t *b, uint32_t len)
{
	int n = 0;
	for (uint32_t off = 8; off + 8 <= len + 4; off += 8 + 4 * b[off + 7])
		n++;
	return n;
}

static struct scsi_cmd rtpg(struct scsi_nexus *nx)
{
	uint8_t cdb[12] = { 0xa3, 0x0a | 0x20 };
	be32(cdb + 6, 512);
	return run(nx, 0, cdb, 12, 0, 512);
}

/* Find designator type (low nibble of byte 1) in VPD 0x83 at buf; its 4-byte value. */
static int vpd83_value(const uint8_t *b, uint8_t type, uint32_t *out)
{
	uint32_t len = (uint32_t)(b[2] << 8 | b[3]);
	for (uint32_t off = 4; off + 4 <= len + 4; off += 4 + b[off + 3])
		if ((b[off + 1] & 0x0f) == type && b[off + 3] == 4) {
			*out = rd32(b + off + 4);
			return 1;
		}
	return 0;
}

static void shared_lu_reports_implicit_alua(const char *dir)
{
	char path[600], err[256];
	const uint32_t bs = 512;

	snprintf(path, sizeof(path), "%s/shared.img", dir);
	struct shared_dev *d = calloc(1, sizeof(*d));
	d->inner = bdev_file_open(path, 4096 * bs, bs, true, err, sizeof(err));
	if (!d->inner) {
		check(false, err);
		free(d);
		return;
	}
	d->ops = (struct bdev_ops){ .submit = sh_submit, .close = sh_close, .owner = &sh_owner_ops };
	d->dev = *d->inner;
	d->dev.ops = &d->ops;
	atomic_init(&d->state, BDEV_OWNER_STANDBY);
	atomic_init(&d->owner, 1);
	struct scsi_lu_config cfg = {
		.name = "shared", .serial = "TC-SHARED-1", .state_dir = dir, .block_size = bs,
		.vendor = "TIERCACH", .product = "unit-test", .revision = "0001",
		.target_port_group = 2, .rel_port_id = 2, .alua_groups = 2,
	};
	struct scsi_lu *lu = scsi_lu_open(&cfg, &d->dev, err, sizeof(err));
	check(lu && d->fn, "an LU over a shared device opens and listens to its ownership");
	if (!lu)
		return;
	struct scsi_target *t = scsi_target_new("iqn.2026-11.test:alua");
	scsi_target_map(t, 0, lu);
	struct scsi_nexus *nx = open_nexus(t, "iqn.2026-11.test:alua-init");
	struct scsi_nexus *nx2 = open_nexus(t, "iqn.2026-11.test:alua-init2");
	clear_ua(nx);
	clear_ua(nx2);
	struct scsi_cmd c;

	uint8_t inq[6] = { 0x12, 0, 0, 0, 96, 0 };
	c = run(nx, 0, inq, 6, 0, 96);
	check(c.status == SAM_STAT_GOOD && (buf[5] & 0x30) == 0x10, "shared LU: INQUIRY TPGS = 01b (implicit ALUA only)");

	uint8_t vpd[6] = { 0x12, 1, 0x83, 0, 255, 0 };
	c = run(nx, 0, vpd, 6, 0, 255);
	uint32_t relp = 0, tpg = 0;
	check(c.status == SAM_STAT_GOOD && vpd83_value(buf, 4, &relp) && vpd83_value(buf, 5, &tpg) && relp == 2 &&
		      tpg == 2,
	      "VPD 0x83 names this gateway's relative target port 2 and target port group 2");

	c = rtpg(nx);
	uint32_t len = rd32(buf);
	const uint8_t *g1 = rtpg_group(buf, len, 1), *g2 = rtpg_group(buf, len, 2);
	check(c.status == SAM_STAT_GOOD && buf[4] == 0x10 && buf[5] > 0 && rtpg_count(buf, len) == 2 && g1 && g2,
	      "RTPG (extended) lists both gateways' groups with an implicit transition time");
	check(g1 && g2 && (g1[0] & 0x0f) == 0x0 && (g2[0] & 0x0f) == 0x1,
	      "RTPG: the lock owner's group 1 is active/optimized, this standby gateway's group 2 active/non-optimized");
	check(g1 && g2 && (g2[1] & 0x83) == 0x83 && !(g2[1] & 0x04) &&
		      (g1[10] << 8 | g1[11]) == 1 && (g2[10] << 8 | g2[11]) == 2 && g1[7] == 1,
	      "RTPG: T_SUP, AN_SUP and AO_SUP (no standby), one port per group, relative ports 1 and 2");

	/* a READ on the non-owner: served from the store, past any copy, and
	 * the ownership left alone */
	c = rw10(nx, 0x28, 0, 1, bs);
	check(c.status == SAM_STAT_GOOD && atomic_load(&d->unowned) == 1 && atomic_load(&d->owned_reads) == 0 &&
		      atomic_load(&d->acquires) == 0,
	      "READ on a non-owner of a LU of two gateways: GOOD, sent with BDEV_F_UNOWNED, no takeover");
	struct scsi_lu_ownership ow;
	check(scsi_lu_ownership(lu, &ow) && ow.unowned_reads == 1, "the LU counts the read served unowned");
	/* on a LU of one gateway the store may lack what its write-back cache holds */
	lu->alua_groups = 1;
	c = rw10(nx, 0x28, 0, 1, bs);
	check(sense_is(&c, 0x2, 0x04, 0x0a) && atomic_load(&d->acquires) == 1 && atomic_load(&d->unowned) == 1,
	      "READ on a non-owner of a LU of one gateway: takes over, NOT READY 02/04/0A");
	lu->alua_groups = 2;
	atomic_store(&d->state, BDEV_OWNER_STANDBY);
	/* nor while the device says the store lacks data (a cache volume's leftover dirty data) */
	atomic_store(&d->no_unowned, true);
	c = rw10(nx, 0x28, 0, 1, bs);
	check(sense_is(&c, 0x2, 0x04, 0x0a) && atomic_load(&d->acquires) == 2 && atomic_load(&d->unowned) == 1,
	      "READ on a non-owner whose cache holds data the store lacks: takes over, NOT READY 02/04/0A");
	atomic_store(&d->no_unowned, false);
	atomic_store(&d->state, BDEV_OWNER_STANDBY);
	/* other media access on the non-owner: takes over, NOT READY transition */
	c = rw10(nx, 0x2a, 0, 1, bs);
	check(sense_is(&c, 0x2, 0x04, 0x0a) && atomic_load(&d->acquires) == 3,
	      "WRITE on a non-owner starts the takeover and gets NOT READY 02/04/0A (transition)");
	c = rw10(nx, 0x28, 0, 1, bs);
	check(sense_is(&c, 0x2, 0x04, 0x0a) && atomic_load(&d->acquires) == 3 && atomic_load(&d->unowned) == 1,
	      "READ during the transition: 02/04/0A, no second takeover started");
	c = rtpg(nx);
	g2 = rtpg_group(buf, rd32(buf), 2);
	check(c.status == SAM_STAT_GOOD && g2 && (g2[0] & 0x0f) == 0xf, "RTPG shows this gateway's group transitioning");
	static const uint8_t tur[6] = { 0 };
	c = run(nx, 0, tur, 6, 0, 0);
	check(c.status == SAM_STAT_GOOD, "TEST UNIT READY is served during the transition");
	uint8_t rc10[10] = { 0x25 };
	c = run(nx, 0, rc10, 10, 0, 8);
	check(c.status == SAM_STAT_GOOD && rd32(buf) == 4095, "READ CAPACITY is served during the transition");
	uint8_t ms[6] = { 0x1a, 0x08, 0x3f, 0, 255, 0 };
	c = run(nx, 0, ms, 6, 0, 255);
	check(c.status == SAM_STAT_GOOD, "MODE SENSE is served during the transition");
	uint8_t rk[10] = { 0x5e, 0x00 };
	rk[8] = 64;
	c = run(nx, 0, rk, 10, 0, 64);
	check(c.status == SAM_STAT_GOOD, "PERSISTENT RESERVE IN is served during the transition");
	uint8_t rl[12] = { 0xa0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0 };
	c = run(nx, 0, rl, 12, 0, 256);
	check(c.status == SAM_STAT_GOOD, "REPORT LUNS is served during the transition");
	uint8_t rs[6] = { 0x03, 0, 0, 0, 18, 0 };
	c = run(nx, 0, rs, 6, 0, 18);
	check(c.status == SAM_STAT_GOOD, "REQUEST SENSE is served during the transition");

	/* the gain completes */
	sh_change(d, BDEV_OWNER_OWNED, 2, 7);
	c = rw10(nx, 0x2a, 0, 1, bs);
	check(sense_is(&c, 0x6, 0x2a, 0x06), "after the takeover: UNIT ATTENTION 06/2A/06 ASYMMETRIC ACCESS STATE CHANGED");
	c = run(nx2, 0, tur, 6, 0, 0);
	check(sense_is(&c, 0x6, 0x2a, 0x06), "every nexus of the LU gets the 2A/06 unit attention");
	memset(buf, 0x5a, bs);
	c = rw10(nx, 0x2a, 0, 1, bs);
	check(c.status == SAM_STAT_GOOD, "the owner serves WRITE");
	memset(buf, 0, bs);
	c = rw10(nx, 0x28, 0, 1, bs);
	check(c.status == SAM_STAT_GOOD && buf[0] == 0x5a && buf[bs - 1] == 0x5a && atomic_load(&d->owned_reads) == 1 &&
		      atomic_load(&d->unowned) == 1,
	      "the owner serves READ, through its copies (no BDEV_F_UNOWNED)");
	c = rtpg(nx);
	len = rd32(buf);
	g1 = rtpg_group(buf, len, 1);
	g2 = rtpg_group(buf, len, 2);
	check(g1 && g2 && (g2[0] & 0x0f) == 0x0 && (g1[0] & 0x0f) == 0x1,
	      "RTPG: now group 2 (this gateway) is active/optimized and group 1 non-optimized");

	/* another gateway took it (we were fenced) */
	sh_change(d, BDEV_OWNER_STANDBY, 1, 7);
	c = run(nx, 0, tur, 6, 0, 0);
	check(sense_is(&c, 0x6, 0x2a, 0x06), "losing the lock: 2A/06 unit attention again");
	int before = atomic_load(&d->acquires);
	memset(buf, 0, bs);
	c = rw10(nx, 0x28, 0, 1, bs);
	check(c.status == SAM_STAT_GOOD && buf[0] == 0x5a && atomic_load(&d->unowned) == 2 &&
		      atomic_load(&d->acquires) == before,
	      "READ after losing the lock: served unowned, no takeover");
	c = rw10(nx, 0x2a, 0, 1, bs);
	check(sense_is(&c, 0x2, 0x04, 0x0a) && atomic_load(&d->acquires) == before + 1,
	      "WRITE after losing the lock: 02/04/0A and a takeover starts");
	sh_change(d, BDEV_OWNER_LOST, 0, 7);
	clear_ua(nx);
	c = rtpg(nx);
	g2 = rtpg_group(buf, rd32(buf), 2);
	check(g2 && (g2[0] & 0x0f) == 0x3 && (g2[1] & 0x08), "RTPG: this gateway's group unavailable (U_SUP set)");

	c = rw10(nx, 0x28, 0, 1, bs);
	check(sense_is(&c, 0x2, 0x04, 0x0c) && atomic_load(&d->acquires) == before + 2, "cluster lost: NOT READY 02/04/0C (unavailable), and the takeover is retried");

	close_nexus(nx);
	close_nexus(nx2);
	scsi_target_free(t);
	scsi_lu_close(lu);
	unlink(path);
	char prf[700];
	snprintf(prf, sizeof(prf), "%s/shared.pr", dir);
	unlink(prf);
}

/* ---- the fixture: two LUs on sparse files, mapped as LUN 0 and 1, and two
 * I_T nexuses; the checks below run in order and build on each other's
 * state (a unit attention taken, WCE set, a reservation cleared). ---- */

#define LU0_BS 512u
#define LU0_NBLOCKS 131072u /* 64 MiB */

static char tmp_dir[512];
static char lu0_path[600], lu1_path[600];
static struct scsi_lu_config lu0_cfg;
static struct scsi_lu *lu0, *lu1;
static struct scsi_target *tgt;
static struct scsi_nexus *nx_a, *nx_b;
static const uint8_t cdb_tur[6] = { 0 };
static const uint8_t cdb_vpd83[6] = { 0x12, 1, 0x83, 0, 255, 0 };

/* A nexus's first command reports the POWER ON unit attention; the next is GOOD. */
static void first_contact_reports_power_on_then_ready(void)
{
	struct scsi_cmd c;

	c = run(nx_a, 0, cdb_tur, 6, 0, 0);
	check(sense_is(&c, 0x6, 0x29, 0x00), "first TEST UNIT READY reports POWER ON/RESET UA 6/29/00");
	c = run(nx_a, 0, cdb_tur, 6, 0, 0);
	check(c.status == SAM_STAT_GOOD, "second TEST UNIT READY is GOOD");
	clear_ua(nx_b);
}

/* INQUIRY: the standard data, VPD pages 0x83 and 0x80, an unknown page, an unmapped LUN. */
static void inquiry_reports_identity_and_vpd(void)
{
	struct scsi_cmd c;

	uint8_t inq[6] = { 0x12, 0, 0, 0, 96, 0 };
	c = run(nx_a, 0, inq, 6, 0, 96);
	check(c.status == SAM_STAT_GOOD && c.data_in_len == 96 && !memcmp(buf + 8, "TIERCACH", 8) &&
		      !memcmp(buf + 16, "unit-test       ", 16) && buf[2] == 0x06 && (buf[5] & 0x30) == 0x10 &&
		      (buf[5] & 0x08) && (buf[7] & 0x02),
	      "standard INQUIRY: vendor, product, SPC-4, TPGS=01b, 3PC, CmdQue");
	c = run(nx_a, 0, cdb_vpd83, 6, 0, 255);
	check(c.status == SAM_STAT_GOOD && buf[1] == 0x83 && (buf[5] & 0x0f) == 3 && buf[7] == 8 &&
		      (buf[8] >> 4) == 3,
	      "VPD 83 starts with an 8-byte NAA 3 designator");
	uint8_t vpd80[6] = { 0x12, 1, 0x80, 0, 255, 0 };
	c = run(nx_a, 0, vpd80, 6, 0, 255);
	check(c.status == SAM_STAT_GOOD && buf[3] == 12 && !memcmp(buf + 4, "TC0123456789", 12),
	      "VPD 80 returns the serial");
	uint8_t badvpd[6] = { 0x12, 1, 0x42, 0, 255, 0 };
	c = run(nx_a, 0, badvpd, 6, 0, 255);
	check(sense_is(&c, 0x5, 0x24, 0x00), "unknown VPD page -> INVALID FIELD IN CDB");
	c = run(nx_a, 7, inq, 6, 0, 96);
	check(c.status == SAM_STAT_GOOD && buf[0] == 0x7f, "INQUIRY to unmapped LUN 7: qualifier 3, type 0x1f");
	c = run(nx_a, 7, cdb_tur, 6, 0, 0);
	check(sense_is(&c, 0x5, 0x25, 0x00), "TEST UNIT READY to unmapped LUN -> LU NOT SUPPORTED");
}

/* REPORT LUNS. */
static void report_luns_lists_both_luns(void)
{
	struct scsi_cmd c;

	uint8_t rl[12] = { 0xa0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0 };
	c = run(nx_a, 0, rl, 12, 0, 256);
	check(c.status == SAM_STAT_GOOD && rd32(buf) == 16 && buf[9] == 0 && buf[17] == 1,
	      "REPORT LUNS lists LUN 0 and LUN 1");
}

/* READ CAPACITY. */
static void read_capacity_reports_the_size(void)
{
	const uint64_t nblocks = LU0_NBLOCKS;
	const uint32_t bs = LU0_BS;
	struct scsi_cmd c;

	uint8_t rc16[16] = { 0x9e, 0x10 };
	rc16[13] = 32;
	c = run(nx_a, 0, rc16, 16, 0, 32);
	check(c.status == SAM_STAT_GOOD && rd64(buf) == nblocks - 1 && rd32(buf + 8) == bs &&
		      (buf[14] & 0xc0) == 0xc0,
	      "READ CAPACITY(16): last LBA, block size, LBPME+LBPRZ");
	uint8_t rc10[10] = { 0x25 };
	c = run(nx_a, 0, rc10, 10, 0, 8);
	check(c.status == SAM_STAT_GOOD && rd32(buf) == nblocks - 1, "READ CAPACITY(10)");
}

/* WRITE then READ, a READ past the end, a WRITE with less Data-Out than its CDB asks, RDPROTECT. */
static void read_returns_what_write_wrote(void)
{
	const uint64_t nblocks = LU0_NBLOCKS;
	const uint32_t bs = LU0_BS;
	struct scsi_cmd c;

	for (unsigned i = 0; i < 8 * bs; i++)
		buf[i] = (uint8_t)(i * 7 + 3);
	c = rw10(nx_a, 0x2a, 100, 8, 8 * bs);
	check(c.status == SAM_STAT_GOOD, "WRITE(10) 8 blocks at LBA 100");
	memset(buf, 0, 8 * bs);
	c = rw10(nx_a, 0x28, 100, 8, 8 * bs);
	bool same = c.status == SAM_STAT_GOOD && c.data_in_len == 8 * bs;
	for (unsigned i = 0; same && i < 8 * bs; i++)
		same = buf[i] == (uint8_t)(i * 7 + 3);
	check(same, "READ(10) returns what was written");
	c = rw10(nx_a, 0x28, (uint32_t)nblocks - 1, 2, 2 * bs);
	check(sense_is(&c, 0x5, 0x21, 0x00), "READ(10) past the end -> LBA OUT OF RANGE 5/21/00");
	memset(buf, 'a', 2 * bs);
	c = rw10(nx_a, 0x2a, 0, 2, 2 * bs);
	memset(buf, 'b', 2 * bs);
	c = rw10(nx_a, 0x2a, 0, 2, bs);
	check(c.status == SAM_STAT_GOOD && c.cdb_xfer_len == 2 * bs,
	      "WRITE(10) of 2 blocks with 1 block of Data-Out: GOOD, CDB length kept for the residual");
	c = rw10(nx_a, 0x28, 0, 2, 2 * bs);
	check(buf[0] == 'b' && buf[bs - 1] == 'b' && buf[bs] == 'a' && buf[2 * bs - 1] == 'a',
	      "only the block that arrived was written, the second is untouched");
	uint8_t rdprot[10] = { 0x28, 0x20, 0, 0, 0, 0, 0, 0, 1, 0 };
	c = run(nx_a, 0, rdprot, 10, 0, bs);
	check(sense_is(&c, 0x5, 0x24, 0x00), "READ(10) with RDPROTECT -> INVALID FIELD IN CDB");
}

/* An unsupported opcode, and a reserved bit answered with its field pointer. */
static void bad_cdbs_get_precise_sense(void)
{
	struct scsi_cmd c;

	uint8_t badop[6] = { 0x02 };
	c = run(nx_a, 0, badop, 6, 0, 0);
	check(sense_is(&c, 0x5, 0x20, 0x00), "unsupported opcode -> INVALID COMMAND OPERATION CODE");
	uint8_t turres[6] = { 0, 0x04, 0, 0, 0, 0 };
	c = run(nx_a, 0, turres, 6, 0, 0);
	check(sense_is(&c, 0x5, 0x24, 0x00) && (c.sense[15] & 0xc0) == 0xc0 && c.sense[17] == 1 &&
		      (c.sense[15] & 0x0f) == (0x08 | 2),
	      "reserved bit in TEST UNIT READY -> 5/24/00, field pointer byte 1 bit 2");
}

/* A backing store's errno as sense: the kernel's medium error is one too. */
static void bdev_errors_map_to_sense(void)
{
	static const struct { int err; bool wr; uint8_t key, asc, ascq; const char *what; } em[] = {
		{ -EIO, false, 0x3, 0x11, 0x00, "-EIO on a read -> 3/11/00 UNRECOVERED READ ERROR" },
		{ -ENODATA, false, 0x3, 0x11, 0x00, "-ENODATA (BLK_STS_MEDIUM) on a read -> 3/11/00" },
		{ -EILSEQ, false, 0x3, 0x11, 0x00, "-EILSEQ (BLK_STS_PROTECTION) on a read -> 3/11/00" },
		{ -ENODATA, true, 0x3, 0x0c, 0x00, "-ENODATA on a write -> 3/0C/00 WRITE ERROR" },
		{ -ENOMEM, false, 0x4, 0x44, 0x00, "-ENOMEM -> 4/44/00 INTERNAL TARGET FAILURE" },
	};
	for (size_t i = 0; i < sizeof(em) / sizeof(em[0]); i++) {
		struct scsi_cmd ec = { .lu = lu0 };
		scsi_fail_errno(&ec, em[i].err, em[i].wr);
		check(sense_is(&ec, em[i].key, em[i].asc, em[i].ascq), em[i].what);
	}
}

/* MODE SENSE / MODE SELECT of WCE; the other nexus hears MODE PARAMETERS CHANGED. */
static void mode_select_sets_wce_and_tells_other_nexus(void)
{
	struct scsi_cmd c;

	uint8_t ms6[6] = { 0x1a, 0x08, 0x08, 0, 255, 0 };
	c = run(nx_a, 0, ms6, 6, 0, 255);
	check(c.status == SAM_STAT_GOOD && buf[4] == 0x08 && !(buf[6] & 0x04), "MODE SENSE(6) caching page: WCE=0");
	uint8_t page[24];
	memcpy(page, buf, 24);
	memset(buf, 0, 24);
	memcpy(buf + 4, page + 4, 20);
	buf[6] |= 0x04;
	uint8_t msel6[6] = { 0x15, 0x10, 0, 0, 24, 0 };
	c = run(nx_a, 0, msel6, 6, 24, 0);
	check(c.status == SAM_STAT_GOOD, "MODE SELECT(6) sets WCE=1");
	c = run(nx_a, 0, ms6, 6, 0, 255);
	check(c.status == SAM_STAT_GOOD && (buf[6] & 0x04), "MODE SENSE(6) now shows WCE=1");
	c = run(nx_b, 0, cdb_tur, 6, 0, 0);
	check(sense_is(&c, 0x6, 0x2a, 0x01), "other nexus gets MODE PARAMETERS CHANGED UA 6/2A/01");
	uint8_t ms_saved[6] = { 0x1a, 0x08, 0xc8, 0, 255, 0 };
	c = run(nx_a, 0, ms_saved, 6, 0, 255);
	check(sense_is(&c, 0x5, 0x39, 0x00), "MODE SENSE saved values -> SAVING PARAMETERS NOT SUPPORTED");
}

/* SYNCHRONIZE CACHE. */
static void sync_cache_succeeds(void)
{
	struct scsi_cmd c;

	uint8_t sync10[10] = { 0x35 };
	c = run(nx_a, 0, sync10, 10, 0, 0);
	check(c.status == SAM_STAT_GOOD, "SYNCHRONIZE CACHE(10)");
}

/* COMPARE AND WRITE. */
static void compare_and_write_writes_only_on_match(void)
{
	const uint32_t bs = LU0_BS;
	struct scsi_cmd c;

	uint8_t caw[16] = { 0x89 };
	be64(caw + 2, 100);
	caw[13] = 1;
	c = rw10(nx_a, 0x28, 100, 1, bs); /* current contents as the compare half */
	memcpy(buf + bs, buf, bs);
	memmove(buf, buf + bs, bs);
	memset(buf + bs, 0xab, bs);
	c = run(nx_a, 0, caw, 16, 2 * bs, 0);
	check(c.status == SAM_STAT_GOOD, "COMPARE AND WRITE with matching data succeeds");
	c = rw10(nx_a, 0x28, 100, 1, bs);
	check(buf[0] == 0xab && buf[bs - 1] == 0xab, "COMPARE AND WRITE wrote the new block");
	memset(buf, 0xab, bs);
	buf[37] = 0;
	memset(buf + bs, 0xcd, bs);
	c = run(nx_a, 0, caw, 16, 2 * bs, 0);
	check(sense_is(&c, 0xe, 0x1d, 0x00) && (c.sense[0] & 0x80) && rd32(c.sense + 3) == 37,
	      "COMPARE AND WRITE mismatch -> MISCOMPARE 0E/1D/00, information = offset 37");
}

/* UNMAP, GET LBA STATUS. */
static void unmap_deallocates_and_get_lba_status_says_so(void)
{
	const uint32_t bs = LU0_BS;
	struct scsi_cmd c;

	memset(buf, 0x5a, 64 * bs);
	c = rw10(nx_a, 0x2a, 4096, 64, 64 * bs);
	uint8_t unmap[10] = { 0x42 };
	unmap[8] = 24;
	memset(buf, 0, 24);
	buf[1] = 22;
	buf[3] = 16;
	be64(buf + 8, 4096);
	be32(buf + 16, 64);
	c = run(nx_a, 0, unmap, 10, 24, 0);
	check(c.status == SAM_STAT_GOOD, "UNMAP 64 blocks at LBA 4096");
	uint8_t gls[16] = { 0x9e, 0x12 };
	be64(gls + 2, 4096);
	gls[13] = 64;
	c = run(nx_a, 0, gls, 16, 0, 64);
	check(c.status == SAM_STAT_GOOD && rd64(buf + 8) == 4096 && rd32(buf + 16) >= 64 && buf[20] == 1,
	      "GET LBA STATUS reports LBA 4096 deallocated");
	c = rw10(nx_a, 0x28, 4096, 1, bs);
	bool zero = c.status == SAM_STAT_GOOD;
	for (unsigned i = 0; zero && i < bs; i++)
		zero = buf[i] == 0;
	check(zero, "unmapped block reads back zeroes (LBPRZ)");
	unmap[8] = 4;
	c = run(nx_a, 0, unmap, 10, 4, 0);
	check(sense_is(&c, 0x5, 0x1a, 0x00), "UNMAP with a 4-byte parameter list -> PARAMETER LIST LENGTH ERROR");
}

/* Persistent reservations between two nexuses. */
static void persistent_reservations_between_two_nexuses(void)
{
	const uint32_t bs = LU0_BS;
	struct scsi_cmd c;

	tpr_out(nx_a, 0x00, 0, 0, 0x1111, &c);
	check(c.status == SAM_STAT_GOOD, "nexus A registers key 0x1111");
	tpr_out(nx_a, 0x01, 0x01, 0x1111, 0, &c);
	check(c.status == SAM_STAT_GOOD, "nexus A reserves WRITE EXCLUSIVE");
	memset(buf, 1, bs);
	c = rw10(nx_b, 0x2a, 10, 1, bs);
	check(c.status == SAM_STAT_RESERVATION_CONFLICT, "nexus B write -> RESERVATION CONFLICT");
	c = rw10(nx_b, 0x28, 10, 1, bs);
	check(c.status == SAM_STAT_GOOD, "nexus B read under WRITE EXCLUSIVE is allowed");
	c = rw10(nx_a, 0x2a, 10, 1, bs);
	check(c.status == SAM_STAT_GOOD, "holder A may write");
	uint8_t prin[10] = { 0x5e, 0x01 };
	prin[8] = 64;
	c = run(nx_b, 0, prin, 10, 0, 64);
	check(c.status == SAM_STAT_GOOD && rd32(buf + 4) == 16 && rd64(buf + 8) == 0x1111 && buf[21] == 1,
	      "READ RESERVATION shows key 0x1111 type WE");
	tpr_out(nx_b, 0x00, 0, 0, 0x2222, &c);
	tpr_out(nx_b, 0x04, 0x03, 0x2222, 0x1111, &c);
	check(c.status == SAM_STAT_GOOD, "nexus B preempts A with EXCLUSIVE ACCESS");
	c = run(nx_a, 0, cdb_tur, 6, 0, 0);
	check(sense_is(&c, 0x6, 0x2a, 0x05), "nexus A gets REGISTRATIONS PREEMPTED UA 6/2A/05");
	c = rw10(nx_a, 0x28, 10, 1, bs);
	check(c.status == SAM_STAT_RESERVATION_CONFLICT, "nexus A read under B's EXCLUSIVE ACCESS conflicts");
	tpr_out(nx_b, 0x03, 0, 0x2222, 0, &c);
	check(c.status == SAM_STAT_GOOD, "nexus B clears");
	c = rw10(nx_a, 0x28, 10, 1, bs);
	check(c.status == SAM_STAT_GOOD, "after CLEAR nexus A reads again");
}

/* SPC-2 RESERVE between nexuses. */
static void spc2_reserve_shuts_out_the_other_nexus(void)
{
	const uint32_t bs = LU0_BS;
	struct scsi_cmd c;

	uint8_t res6[6] = { 0x16 }, rel6[6] = { 0x17 };
	c = run(nx_a, 0, res6, 6, 0, 0);
	check(c.status == SAM_STAT_GOOD, "RESERVE(6) by A");
	c = rw10(nx_b, 0x28, 10, 1, bs);
	check(c.status == SAM_STAT_RESERVATION_CONFLICT, "B read while A holds RESERVE(6) conflicts");
	c = run(nx_a, 0, rel6, 6, 0, 0);
	c = rw10(nx_b, 0x28, 10, 1, bs);
	check(c.status == SAM_STAT_GOOD, "after RELEASE(6) B reads");
}

/* WRITE SAME. */
static void write_same_fills_every_block(void)
{
	const uint32_t bs = LU0_BS;
	struct scsi_cmd c;

	uint8_t ws10[10] = { 0x41 };
	be32(ws10 + 2, 2000);
	ws10[8] = 16;
	memset(buf, 0x77, bs);
	c = run(nx_a, 0, ws10, 10, bs, 0);
	check(c.status == SAM_STAT_GOOD, "WRITE SAME(10) 16 blocks of 0x77");
	c = rw10(nx_a, 0x28, 2000, 16, 16 * bs);
	bool same = c.status == SAM_STAT_GOOD;
	for (unsigned i = 0; same && i < 16 * bs; i++)
		same = buf[i] == 0x77;
	check(same, "WRITE SAME data reads back in every block");
}

/* REPORT SUPPORTED OPERATION CODES for one command. */
static void rsoc_describes_one_command(void)
{
	struct scsi_cmd c;

	uint8_t rsoc[12] = { 0xa3, 0x0c, 0x01, 0x28 };
	rsoc[9] = 64;
	c = run(nx_a, 0, rsoc, 12, 0, 64);
	check(c.status == SAM_STAT_GOOD && (buf[1] & 7) == 3 && buf[3] == 10 && buf[4] == 0x28,
	      "REPORT SUPPORTED OPERATION CODES for READ(10): supported, 10-byte CDB, usage data");
}

/* COMPARE AND WRITE holds off an overlapping WRITE (the slow path). */
static void compare_and_write_holds_off_an_overlapping_write(void)
{
	const uint32_t bs = LU0_BS;

	uint8_t *d1 = NULL, *d2 = NULL;
	if (posix_memalign((void **)&d1, 4096, 2 * bs) || posix_memalign((void **)&d2, 4096, bs))
		exit(2);
	memset(buf, 0x11, bs);
	rw10(nx_a, 0x2a, 300, 1, bs);
	memset(d1, 0x11, bs);        /* compare: matches */
	memset(d1 + bs, 0x22, bs);   /* CAW writes 0x22 */
	memset(d2, 0x33, bs);        /* the plain write that must land after */
	uint8_t cawc[16] = { 0x89 };
	be64(cawc + 2, 300);
	cawc[13] = 1;
	uint8_t w10[10] = { 0x2a, 0, 0, 0, 1, 44, 0, 0, 1, 0 }; /* LBA 300 */
	struct pair p = { job_new(nx_a, cawc, 16, d1, 2 * bs), job_new(nx_b, w10, 10, d2, bs) };
	worker_post(worker_get(0), submit_pair_on_worker, &p);
	sem_wait(&p.first->done);
	sem_wait(&p.second->done);
	check(p.first->cmd.status == SAM_STAT_GOOD && p.second->cmd.status == SAM_STAT_GOOD,
	      "COMPARE AND WRITE and an overlapping WRITE issued together both complete GOOD");
	rw10(nx_a, 0x28, 300, 1, bs);
	check(buf[0] == 0x33 && buf[bs - 1] == 0x33,
	      "the overlapping WRITE waited for the COMPARE AND WRITE and landed after it");
	free(p.first);
	free(p.second);
	free(d1);
	free(d2);
}

/* EXTENDED COPY from LUN 0 to LUN 1, target descriptors by NAA. */
static void extended_copy_copies_between_luns(void)
{
	const uint32_t bs = LU0_BS;
	struct scsi_cmd c;

	uint8_t naa0[8], naa1[8];
	c = run(nx_a, 0, cdb_vpd83, 6, 0, 255);
	memcpy(naa0, buf + 8, 8);
	c = run(nx_a, 1, cdb_vpd83, 6, 0, 255);
	check(c.status == SAM_STAT_GOOD && memcmp(buf + 8, naa0, 8), "LUN 1 has its own NAA designator");
	memcpy(naa1, buf + 8, 8);
	memset(buf, 0x5c, 4 * bs);
	rw10(nx_a, 0x2a, 700, 4, 4 * bs);
	uint8_t *p = buf;
	memset(p, 0, 16 + 64 + 28);
	p[1] = 0x10;            /* list id usage 10b: do not hold results */
	p[3] = 64;              /* two target descriptors */
	p[11] = 28;             /* one segment descriptor */
	for (int i = 0; i < 2; i++) {
		uint8_t *td = p + 16 + 32 * i;
		td[0] = 0xe4;
		td[4] = 0x01;   /* binary */
		td[5] = 0x03;   /* NAA, LU association */
		td[7] = 8;
		memcpy(td + 8, i ? naa1 : naa0, 8);
		td[30] = bs >> 8;
		td[31] = bs & 0xff;
	}
	uint8_t *sd = p + 16 + 64;
	sd[0] = 0x02;
	sd[3] = 24;
	sd[7] = 1;              /* source 0 -> destination 1 */
	sd[11] = 4;             /* 4 blocks */
	be64(sd + 12, 700);
	be64(sd + 20, 10);
	uint8_t xc[16] = { 0x83 };
	be32(xc + 10, 16 + 64 + 28);
	c = run(nx_a, 0, xc, 16, 16 + 64 + 28, 0);
	check(c.status == SAM_STAT_GOOD, "EXTENDED COPY of 4 blocks from LUN 0 to LUN 1");
	uint8_t r10[10] = { 0x28, 0, 0, 0, 0, 10, 0, 0, 4, 0 };
	c = run(nx_a, 1, cdb_tur, 6, 0, 0); /* LUN 1's power-on UA for this nexus */
	c = run(nx_a, 1, r10, 10, 0, 4 * bs);
	bool same = c.status == SAM_STAT_GOOD;
	for (unsigned i = 0; same && i < 4 * bs; i++)
		same = buf[i] == 0x5c;
	check(same, "LUN 1 holds the copied blocks at LBA 10");
}

/* APTPL: registrations survive a restart (the LU reopened from state_dir). */
static void aptpl_registrations_survive_a_restart(void)
{
	const uint32_t bs = LU0_BS;
	struct scsi_cmd c;

	uint8_t prout[10] = { 0x5f, 0x00 };
	prout[8] = 24;
	memset(buf, 0, 24);
	be64(buf + 8, 0xabcdef);
	buf[20] = 0x01; /* APTPL */
	c = run(nx_a, 0, prout, 10, 24, 0);
	check(c.status == SAM_STAT_GOOD, "REGISTER key 0xabcdef with APTPL");
	char err2[256];
	struct bdev *dev3 = bdev_file_open(lu0_path, 0, bs, false, err2, sizeof(err2));
	struct scsi_lu *lu3 = dev3 ? scsi_lu_open(&lu0_cfg, dev3, err2, sizeof(err2)) : NULL;
	check(lu3 != NULL, "the LU reopens with its persisted reservation state");
	if (lu3) {
		struct scsi_target *t3 = scsi_target_new("iqn.2026-11.test:restarted");
		scsi_target_map(t3, 0, lu3);
		struct scsi_nexus *n3 = open_nexus(t3, "iqn.2026-11.test:init3");
		clear_ua(n3);
		uint8_t rk[10] = { 0x5e, 0x00 };
		rk[8] = 64;
		c = run(n3, 0, rk, 10, 0, 64);
		check(c.status == SAM_STAT_GOOD && rd32(buf + 4) == 8 && rd64(buf + 8) == 0xabcdef,
		      "after the restart READ KEYS still lists 0xabcdef");
		uint8_t cap[10] = { 0x5e, 0x02 };
		cap[8] = 8;
		c = run(n3, 0, cap, 10, 0, 8);
		check(c.status == SAM_STAT_GOOD && (buf[3] & 0x01), "REPORT CAPABILITIES shows PTPL_A");
		close_nexus(n3);
		scsi_target_free(t3);
		scsi_lu_close(lu3);
	}
	/* unregister (APTPL off) removes the state file */
	memset(buf, 0, 24);
	be64(buf, 0xabcdef);
	c = run(nx_a, 0, prout, 10, 24, 0);
	char prf0[600];
	snprintf(prf0, sizeof(prf0), "%s/lun0.pr", tmp_dir);
	check(c.status == SAM_STAT_GOOD && access(prf0, F_OK) != 0,
	      "unregistering with APTPL clear removes the persisted state");
}

/* Descriptor sense once D_SENSE is set. */
static void d_sense_gives_descriptor_sense(void)
{
	const uint64_t nblocks = LU0_NBLOCKS;
	const uint32_t bs = LU0_BS;
	struct scsi_cmd c;

	uint8_t msc[6] = { 0x1a, 0x08, 0x0a, 0, 255, 0 };
	c = run(nx_a, 0, msc, 6, 0, 255);
	uint8_t page[12];
	memcpy(page, buf + 4, 12);
	memset(buf, 0, 16);
	memcpy(buf + 4, page, 12);
	buf[4 + 2] |= 0x04;
	uint8_t msel6[6] = { 0x15, 0x10, 0, 0, 16, 0 };
	c = run(nx_a, 0, msel6, 6, 16, 0);
	check(c.status == SAM_STAT_GOOD, "MODE SELECT sets D_SENSE");
	c = rw10(nx_a, 0x28, (uint32_t)nblocks, 1, bs);
	check(c.status == SAM_STAT_CHECK_CONDITION && c.sense[0] == 0x72 && c.sense[1] == 5 && c.sense[2] == 0x21,
	      "with D_SENSE, LBA OUT OF RANGE comes as descriptor sense 0x72");
}

/* The non-shared LU: one target port group, active/optimized. */
static void local_lu_has_one_active_optimized_group(void)
{
	struct scsi_cmd c;

	uint8_t cdb[12] = { 0xa3, 0x0a | 0x20 };
	be32(cdb + 6, 512);
	c = run(nx_a, 0, cdb, 12, 0, 512);
	check(c.status == SAM_STAT_GOOD && rd32(buf) == 16 && buf[4] == 0x10 && buf[8] == 0x80 &&
		      buf[9] == 0x01 && buf[10] == 0 && buf[11] == 1 && buf[18] == 0 && buf[19] == 1,
	      "RTPG on a local LU: one group (1), preferred active/optimized, relative port 1");
}

static void fixture_open(void)
{
	const char *tmp = getenv("TMPDIR");
	char err[256];

	snprintf(tmp_dir, sizeof(tmp_dir), "%s/tc-backstore-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(tmp_dir)) {
		perror("mkdtemp");
		exit(2);
	}
	snprintf(lu0_path, sizeof(lu0_path), "%s/lun0.img", tmp_dir);
	if (workers_start(1) < 0) {
		fprintf(stderr, "cannot start a worker (io_uring unavailable?)\n");
		exit(2);
	}
	if (posix_memalign((void **)&buf, 4096, BUF_LEN))
		exit(2);
	struct bdev *dev = bdev_file_open(lu0_path, (uint64_t)LU0_NBLOCKS * LU0_BS, LU0_BS, true, err, sizeof(err));
	if (!dev) {
		fprintf(stderr, "%s\n", err);
		exit(2);
	}
	lu0_cfg = (struct scsi_lu_config){
		.name = "lun0", .serial = "TC0123456789", .state_dir = tmp_dir, .block_size = LU0_BS,
		.write_cache = false, .vendor = "TIERCACH", .product = "unit-test", .revision = "0001",
		.target_port_group = 1, .rel_port_id = 1,
	};
	lu0 = scsi_lu_open(&lu0_cfg, dev, err, sizeof(err));
	if (!lu0) {
		fprintf(stderr, "%s\n", err);
		exit(2);
	}
	tgt = scsi_target_new("iqn.2026-11.test:tgt");
	scsi_target_map(tgt, 0, lu0);
	/* a second LU for EXTENDED COPY across LUs */
	snprintf(lu1_path, sizeof(lu1_path), "%s/lun1.img", tmp_dir);
	struct bdev *dev2 = bdev_file_open(lu1_path, 1024 * LU0_BS, LU0_BS, true, err, sizeof(err));
	struct scsi_lu_config cfg2 = lu0_cfg;
	cfg2.name = "lun1";
	cfg2.serial = "TC-SECOND-LU";
	lu1 = dev2 ? scsi_lu_open(&cfg2, dev2, err, sizeof(err)) : NULL;
	if (!lu1) {
		fprintf(stderr, "%s\n", err);
		exit(2);
	}
	scsi_target_map(tgt, 1, lu1);
	nx_a = open_nexus(tgt, "iqn.2026-11.test:init1");
	nx_b = open_nexus(tgt, "iqn.2026-11.test:init2");
}

static void fixture_close(void)
{
	close_nexus(nx_a);
	close_nexus(nx_b);
	workers_stop();
	scsi_target_free(tgt);
	scsi_lu_close(lu0);
	scsi_lu_close(lu1);
	unlink(lu0_path);
	unlink(lu1_path);
	char prf[600];
	snprintf(prf, sizeof(prf), "%s/lun0.pr", tmp_dir);
	unlink(prf);
	rmdir(tmp_dir);
	free(buf);
}

/* ---- thin provisioning soft threshold (lu_space.c) ---- */

struct space_dev {
	struct bdev dev;
	struct bdev *inner;
	struct bdev_ops ops;
	_Atomic uint64_t pool, free_b, alloc;
};

static void sp_submit(struct bdev *dev, struct bdev_req *req) { bdev_submit(((struct space_dev *)dev)->inner, req); }
static void sp_close(struct bdev *dev)
{
	struct space_dev *d = (struct space_dev *)dev;
	bdev_close(d->inner);
	free(d);
}
static int sp_space(struct bdev *dev, struct bdev_space *out)
{
	struct space_dev *d = (struct space_dev *)dev;
	out->pool_bytes = atomic_load(&d->pool);
	out->pool_free = atomic_load(&d->free_b);
	out->alloc = atomic_load(&d->alloc);
	out->alloc_known = true;
	return 0;
}

/* INFORMATION of fixed-format sense (VALID set), or -1 */
static long long sense_info(const struct scsi_cmd *c)
{
	if (c->sense_len < 8 || (c->sense[0] & 0x7f) != 0x70 || !(c->sense[0] & 0x80))
		return -1;
	return rd32(c->sense + 3);
}

static void thin_threshold_warns_every_nexus_once(const char *dir)
{
	char path[600], err[256];
	const uint32_t bs = 512, nblocks = 8192; /* 4 MiB: 4 threshold sets of 1 MiB */
	const uint64_t gib = 1ull << 30, set = 1ull << 20;

	snprintf(path, sizeof(path), "%s/thin.img", dir);
	struct space_dev *d = calloc(1, sizeof(*d));
	d->inner = bdev_file_open(path, (uint64_t)nblocks * bs, bs, true, err, sizeof(err));
	if (!d->inner) {
		check(false, err);
		free(d);
		return;
	}
	d->ops = (struct bdev_ops){ .submit = sp_submit, .close = sp_close, .space = sp_space };
	d->dev = *d->inner;
	d->dev.ops = &d->ops;
	atomic_init(&d->pool, 10 * gib);
	atomic_init(&d->free_b, 5 * gib);
	atomic_init(&d->alloc, set);
	struct scsi_lu_config cfg = {
		.name = "thin", .serial = "TC-THIN-1", .block_size = bs, .vendor = "TIERCACH",
		.product = "unit-test", .revision = "0001", .space_warn = 90,
	};
	struct scsi_lu *lu = scsi_lu_open(&cfg, &d->dev, err, sizeof(err));
	check(lu != NULL, "an LU with space_warn = 90 opens");
	if (!lu)
		return;
	struct scsi_target *t = scsi_target_new("iqn.2026-11.test:thin");
	scsi_target_map(t, 0, lu);
	struct scsi_nexus *n1 = open_nexus(t, "iqn.2026-11.test:thin-a");
	struct scsi_nexus *n2 = open_nexus(t, "iqn.2026-11.test:thin-b");
	clear_ua(n1);
	clear_ua(n2);
	struct scsi_cmd c;

	static const uint8_t vpd_b2[6] = { 0x12, 1, 0xb2, 0, 64, 0 };
	c = run(n1, 0, vpd_b2, 6, 0, 64);
	check(c.status == SAM_STAT_GOOD && buf[4] == 11, "VPD B2: THRESHOLD EXPONENT 11 (1 MiB sets of 512-byte blocks)");

	static const uint8_t ms_lbp[10] = { 0x5a, 0x08, 0x1c, 0x02, 0, 0, 0, 0, 255, 0 };
	c = run(n1, 0, ms_lbp, 10, 0, 255);
	const uint8_t *pg = buf + 8;
	check(c.status == SAM_STAT_GOOD && pg[0] == 0x5c && pg[1] == 0x02 && pg[2] == 0 && pg[3] == 28 &&
		      !(pg[4] & 1),
	      "MODE SENSE 1Ch/02h: the logical block provisioning page, SITUA 0");
	check(pg[16] == 0x80 && pg[17] == 0x01 && rd32(pg + 20) == 10 * 1024 / 10,
	      "descriptor at 16: enabled soft threshold, available resources armed decreasing, at 10% of the pool");
	check(pg[24] == 0x81 && pg[25] == 0x02 && rd32(pg + 28) == 4 * 90 / 100,
	      "descriptor at 24: used resources armed increasing, at 90% of the capacity");
	static const uint8_t ms_rwer[10] = { 0x5a, 0x08, 0x01, 0, 0, 0, 0, 0, 255, 0 };
	c = run(n1, 0, ms_rwer, 10, 0, 255);
	check(c.status == SAM_STAT_GOOD && (buf[8 + 7] & 0x80), "read-write error recovery page: LBPERE set");
	static const uint8_t ms_all[10] = { 0x5a, 0x08, 0x3f, 0xff, 0, 0, 0, 0x10, 0, 0 };
	c = run(n1, 0, ms_all, 10, 0, 4096);
	bool found = false;
	for (uint32_t off = 8; off + 4 <= c.read_len && off < (uint32_t)((buf[0] << 8 | buf[1]) + 2);) {
		if ((buf[off] & 0x40) && (buf[off] & 0x3f) == 0x1c && buf[off + 1] == 2)
			found = true;
		off += (buf[off] & 0x40) ? 4u + (buf[off + 2] << 8 | buf[off + 3]) : 2u + buf[off + 1];
	}
	check(c.status == SAM_STAT_GOOD && found, "MODE SENSE 3Fh/FFh includes the 1Ch/02h subpage");

	static const uint8_t ls_sup[10] = { 0x4d, 0, 0x40, 0, 0, 0, 0, 0, 255, 0 };
	c = run(n1, 0, ls_sup, 10, 0, 255);
	check(c.status == SAM_STAT_GOOD && buf[0] == 0 && buf[3] == 2 && buf[4] == 0x00 && buf[5] == 0x0c,
	      "LOG SENSE 00h lists pages 00h and 0Ch");
	static const uint8_t ls_lbp[10] = { 0x4d, 0, 0x4c, 0, 0, 0, 0, 0, 255, 0 };
	c = run(n1, 0, ls_lbp, 10, 0, 255);
	check(c.status == SAM_STAT_GOOD && buf[0] == 0x8c && buf[3] == 24, "LOG SENSE 0Ch: two parameters");
	check(buf[4] == 0 && buf[5] == 1 && buf[6] == 0x03 && buf[7] == 8 && rd32(buf + 8) == 5 * 1024 &&
		      (buf[12] & 3) == 2,
	      "parameter 0001h: 5 GiB available, as 5120 sets, scope not dedicated");
	check(buf[16] == 0 && buf[17] == 2 && buf[18] == 0x03 && buf[19] == 8 && rd32(buf + 20) == 1 &&
		      (buf[24] & 3) == 1,
	      "parameter 0002h: 1 set used by the LU, scope dedicated");
	static const uint8_t ls_ptr[10] = { 0x4d, 0, 0x4c, 0, 0, 0, 2, 0, 255, 0 };
	c = run(n1, 0, ls_ptr, 10, 0, 255);
	check(c.status == SAM_STAT_GOOD && buf[3] == 12 && buf[5] == 2, "PARAMETER POINTER 2: only parameter 0002h");
	static const uint8_t ls_ptr3[10] = { 0x4d, 0, 0x4c, 0, 0, 0, 3, 0, 255, 0 };
	c = run(n1, 0, ls_ptr3, 10, 0, 255);
	check(sense_is(&c, 5, 0x24, 0), "PARAMETER POINTER 3, past the last parameter: INVALID FIELD IN CDB");
	static const uint8_t ls_sp[10] = { 0x4d, 1, 0x4c, 0, 0, 0, 0, 0, 255, 0 };
	c = run(n1, 0, ls_sp, 10, 0, 255);
	check(sense_is(&c, 5, 0x24, 0), "LOG SENSE with SP: INVALID FIELD IN CDB");
	static const uint8_t ls_bad[10] = { 0x4d, 0, 0x4d, 0, 0, 0, 0, 0, 255, 0 };
	c = run(n1, 0, ls_bad, 10, 0, 255);
	check(sense_is(&c, 5, 0x24, 0), "LOG SENSE of a page we do not have: INVALID FIELD IN CDB");

	/* 95% of the pool used: every nexus told once, INFORMATION 16 */
	atomic_store(&d->free_b, gib / 2);
	scsi_lu_space_poll(lu);
	c = run(n1, 0, cdb_tur, 6, 0, 0);
	check(sense_is(&c, 6, 0x38, 0x07) && sense_info(&c) == LU_LBP_DESC_AVAIL,
	      "pool 95% used: UNIT ATTENTION 6/38/07, INFORMATION 16 (the available-resources descriptor)");
	c = run(n1, 0, cdb_tur, 6, 0, 0);
	check(c.status == SAM_STAT_GOOD, "told once: the next command is GOOD");
	static const uint8_t rs[6] = { 0x03, 0, 0, 0, 252, 0 };
	c = run(n2, 0, rs, 6, 0, 252);
	check(c.status == SAM_STAT_GOOD && (buf[2] & 0xf) == 6 && buf[12] == 0x38 && buf[13] == 0x07 &&
		      (buf[0] & 0x80) && rd32(buf + 3) == 16,
	      "the other nexus gets it too (REQUEST SENSE), with the same INFORMATION");
	scsi_lu_space_poll(lu);
	c = run(n1, 0, cdb_tur, 6, 0, 0);
	check(c.status == SAM_STAT_GOOD, "still past it: not told again");
	/* a host that logs in while the threshold stays passed is told too */
	struct scsi_nexus *n3 = open_nexus(t, "iqn.2026-11.test:thin-late");
	struct scsi_cmd c1 = run(n3, 0, cdb_tur, 6, 0, 0);
	struct scsi_cmd c2 = run(n3, 0, cdb_tur, 6, 0, 0);
	struct scsi_cmd c3 = run(n3, 0, cdb_tur, 6, 0, 0);
	check(sense_is(&c1, 6, 0x29, 0) && sense_is(&c2, 6, 0x38, 0x07) && c3.status == SAM_STAT_GOOD,
	      "a nexus made after the threshold was passed: POWER ON, then 6/38/07, then GOOD");
	close_nexus(n3);
	/* 89% used: not re-armed (2 points below 90 is 88) */
	atomic_store(&d->free_b, gib + gib / 10);
	scsi_lu_space_poll(lu);
	atomic_store(&d->free_b, gib / 2);
	scsi_lu_space_poll(lu);
	c = run(n1, 0, cdb_tur, 6, 0, 0);
	check(c.status == SAM_STAT_GOOD, "89% used then 95% again: not re-armed, not told");
	/* 50% used re-arms; 95% tells again */
	atomic_store(&d->free_b, 5 * gib);
	scsi_lu_space_poll(lu);
	atomic_store(&d->free_b, gib / 2);
	scsi_lu_space_poll(lu);
	c = run(n1, 0, cdb_tur, 6, 0, 0);
	check(sense_is(&c, 6, 0x38, 0x07), "re-armed at 50% used: 95% tells again");
	clear_ua(n2);

	/* the LU's own allocation: INFORMATION 24 */
	atomic_store(&d->free_b, 5 * gib);
	scsi_lu_space_poll(lu);
	atomic_store(&d->alloc, (uint64_t)nblocks * bs * 95 / 100);
	scsi_lu_space_poll(lu);
	c = run(n1, 0, cdb_tur, 6, 0, 0);
	check(sense_is(&c, 6, 0x38, 0x07) && sense_info(&c) == LU_LBP_DESC_USED,
	      "the LU 95% allocated: 6/38/07 with INFORMATION 24 (the used-resources descriptor)");
	clear_ua(n2);
	atomic_store(&d->alloc, set);
	scsi_lu_space_poll(lu);

	/* LBPERE off: not told */
	c = run(n1, 0, ms_rwer, 10, 0, 255);
	uint8_t sel[20] = { 0 };
	memcpy(sel + 8, buf + 8, 12);
	sel[8] &= 0x3f;
	sel[8 + 7] &= (uint8_t)~0x80;
	memcpy(buf, sel, 20);
	static const uint8_t msel10[10] = { 0x55, 0x10, 0, 0, 0, 0, 0, 0, 20, 0 };
	c = run(n1, 0, msel10, 10, 20, 0);
	check(c.status == SAM_STAT_GOOD, "MODE SELECT clears LBPERE");
	clear_ua(n2);
	atomic_store(&d->free_b, gib / 2);
	scsi_lu_space_poll(lu);
	c = run(n1, 0, cdb_tur, 6, 0, 0);
	check(c.status == SAM_STAT_GOOD, "with LBPERE off, passing the threshold tells nobody");

	/* the threshold page can be selected unchanged, not changed */
	c = run(n1, 0, ms_lbp, 10, 0, 255);
	uint8_t lsel[40] = { 0 };
	memcpy(lsel + 8, buf + 8, 32);
	lsel[8] &= 0x7f;
	memcpy(buf, lsel, 40);
	uint8_t msel_lbp[10] = { 0x55, 0x10, 0, 0, 0, 0, 0, 0, 40, 0 };
	c = run(n1, 0, msel_lbp, 10, 40, 0);
	check(c.status == SAM_STAT_GOOD, "MODE SELECT of 1Ch/02h as it is: GOOD");
	lsel[8 + 28] ^= 1;
	memcpy(buf, lsel, 40);
	c = run(n1, 0, msel_lbp, 10, 40, 0);
	check(sense_is(&c, 5, 0x26, 0), "MODE SELECT changing a threshold: INVALID FIELD IN PARAMETER LIST");

	close_nexus(n1);
	close_nexus(n2);
	scsi_target_free(t);
	scsi_lu_close(lu);
	unlink(path);
}

int main(void)
{
	fixture_open();
	first_contact_reports_power_on_then_ready();
	inquiry_reports_identity_and_vpd();
	report_luns_lists_both_luns();
	read_capacity_reports_the_size();
	read_returns_what_write_wrote();
	bad_cdbs_get_precise_sense();
	bdev_errors_map_to_sense();
	mode_select_sets_wce_and_tells_other_nexus();
	sync_cache_succeeds();
	compare_and_write_writes_only_on_match();
	unmap_deallocates_and_get_lba_status_says_so();
	persistent_reservations_between_two_nexuses();
	spc2_reserve_shuts_out_the_other_nexus();
	write_same_fills_every_block();
	rsoc_describes_one_command();
	compare_and_write_holds_off_an_overlapping_write();
	extended_copy_copies_between_luns();
	aptpl_registrations_survive_a_restart();
	d_sense_gives_descriptor_sense();
	local_lu_has_one_active_optimized_group();
	shared_lu_reports_implicit_alua(tmp_dir);
	thin_threshold_warns_every_nexus_once(tmp_dir);
	fixture_close();
	printf("%d checks, %d failed\n", checks, failures);
	return failures ? 1 : 0;
}
