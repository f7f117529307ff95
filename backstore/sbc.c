/*
 * sbc.c - SCSI block commands (SBC-3): the data path and its relatives.
 *
 * READ/WRITE go straight from the command's iovec to bdev_submit with the
 * bdev_req embedded in cmd->bs_scratch: no lock, no allocation. Everything
 * that needs a buffer of its own (COMPARE AND WRITE, VERIFY with BYTCHK,
 * WRITE SAME data replication, reads the initiator wants only part of)
 * takes one from the per-thread buffer pool.
 *
 * COMPARE AND WRITE (VMware ATS) must be atomic against every other writer
 * of the same LBAs. Plain writes stay lock-free while no CAW is active:
 *
 *   writer:  fast_writes++ ; if caw_active == 0 -> go (lock-free)
 *                            else fast_writes-- and take the slow path
 *   CAW:     caw_active++  ; then, under lu->mutex, wait until
 *                            fast_writes == 0 and no overlapping entry is
 *                            ahead of it in lu->ranges
 *
 * Both counters are sequentially consistent, so at least one side sees the
 * other (Dekker). On the slow path every writer appends a range_lock to
 * lu->ranges; an entry may run when no entry ahead of it overlaps it with
 * a CAW on either side (writes never wait for writes). A deferred command
 * is resumed on its own worker through worker_post. The last fast writer
 * to finish while a CAW waits, and every slow-path release, re-evaluate
 * the queue.
 *
 * Threading: handlers run on the submitting worker; bdev completions come
 * back on the same worker. lu->mutex is taken only on the CAW slow path
 * and is never held across bdev_submit.
 */
#include "backstore/lu.h"

#include "common/bufpool.h"
#include "common/log.h"

#include <assert.h>
#include <errno.h>

#define SBC_TIOV 6
#define CHUNK_BYTES (1u << 20)

struct sbc_io {
	struct bdev_req req;
	struct range_lock rl;
	struct scsi_cmd *cmd;
	uint64_t lba;
	uint32_t nblocks;
	unsigned wflags;          /* BDEV_F_FUA for writes */
	uint8_t *buf;             /* pooled buffer, or NULL */
	size_t buf_len;
	uint64_t pos, end;        /* byte range of a chunked operation */
	size_t chunk;
	struct iovec biov;
	struct iovec tiov[SBC_TIOV];
	void (*next)(struct sbc_io *io, int err);
	uint8_t op;               /* what the chunked loop submits */
	bool locked;
};

static_assert(sizeof(struct sbc_io) <= sizeof(((struct scsi_cmd *)0)->bs_scratch),
	      "sbc_io must fit in scsi_cmd.bs_scratch");

static struct sbc_io *io_of(struct scsi_cmd *cmd)
{
	struct sbc_io *io = (struct sbc_io *)cmd->bs_scratch;
	memset(io, 0, sizeof(*io));
	io->cmd = cmd;
	return io;
}

/* ---------------------------------------------------------------- */
/* CAW interlock                                                     */

static bool ranges_overlap(const struct range_lock *a, const struct range_lock *b)
{
	return a->lba < b->lba + b->nblocks && b->lba < a->lba + a->nblocks;
}

/* May e run now? Caller holds lu->mutex. */
static bool range_eligible(struct scsi_lu *lu, struct range_lock *e)
{
	if (e->is_caw && atomic_load(&lu->fast_writes) != 0)
		return false;
	for (struct range_lock *a = lu->ranges; a && a != e; a = a->next)
		if ((a->is_caw || e->is_caw) && ranges_overlap(a, e))
			return false;
	return true;
}

static void range_resume(void *arg)
{
	struct range_lock *rl = arg;
	rl->resume(rl);
}

/* Grant every waiting entry that became eligible. Locked. */
static void ranges_wake_locked(struct scsi_lu *lu)
{
	for (struct range_lock *e = lu->ranges; e; e = e->next) {
		if (e->granted || !range_eligible(lu, e))
			continue;
		e->granted = true;
		if (worker_post(e->worker, range_resume, e) < 0)
			log_err("lun \"%s\": cannot resume a deferred write (out of memory)", lu->name);
	}
}

static void range_append_locked(struct scsi_lu *lu, struct range_lock *rl)
{
	struct range_lock **pp = &lu->ranges;
	while (*pp)
		pp = &(*pp)->next;
	rl->next = NULL;
	*pp = rl;
}

static void range_remove_locked(struct scsi_lu *lu, struct range_lock *rl)
{
	for (struct range_lock **pp = &lu->ranges; *pp; pp = &(*pp)->next)
		if (*pp == rl) {
			*pp = rl->next;
			break;
		}
}

static void fast_write_done(struct scsi_lu *lu)
{
	if (atomic_fetch_sub(&lu->fast_writes, 1) == 1 && atomic_load(&lu->caw_active)) {
		pthread_mutex_lock(&lu->mutex);
		ranges_wake_locked(lu);
		pthread_mutex_unlock(&lu->mutex);
	}
}

static bool range_begin(struct scsi_lu *lu, struct range_lock *rl, uint64_t lba, uint64_t nblocks,
			bool is_caw)
{
	rl->lba = lba;
	rl->nblocks = nblocks ? nblocks : 1;
	rl->is_caw = is_caw;
	rl->granted = false;
	rl->fast = false;
	rl->worker = worker_self();
	if (!is_caw) {
		atomic_fetch_add(&lu->fast_writes, 1);
		if (atomic_load(&lu->caw_active) == 0) {
			rl->fast = true;
			return true;
		}
		fast_write_done(lu);
	} else {
		atomic_fetch_add(&lu->caw_active, 1);
	}
	pthread_mutex_lock(&lu->mutex);
	range_append_locked(lu, rl);
	bool go = range_eligible(lu, rl);
	rl->granted = go;
	pthread_mutex_unlock(&lu->mutex);
	return go;
}

static void range_end(struct scsi_lu *lu, struct range_lock *rl)
{
	if (rl->fast) {
		fast_write_done(lu);
		return;
	}
	pthread_mutex_lock(&lu->mutex);
	range_remove_locked(lu, rl);
	if (rl->is_caw)
		atomic_fetch_sub(&lu->caw_active, 1);
	ranges_wake_locked(lu);
	pthread_mutex_unlock(&lu->mutex);
}

bool sbc_write_begin(struct scsi_lu *lu, struct range_lock *rl, uint64_t lba, uint64_t nblocks)
{
	return range_begin(lu, rl, lba, nblocks, false);
}

void sbc_write_end(struct scsi_lu *lu, struct range_lock *rl)
{
	range_end(lu, rl);
}

/* ---------------------------------------------------------------- */
/* Common helpers                                                    */

static void io_finish(struct sbc_io *io)
{
	struct scsi_cmd *cmd = io->cmd;
	if (io->locked) {
		range_end(cmd->lu, &io->rl);
		io->locked = false;
	}
	if (io->buf) {
		buf_put(io->buf, io->buf_len);
		io->buf = NULL;
	}
	scsi_cmd_complete(cmd);
}

static void io_fail_errno(struct sbc_io *io, int err, bool writing)
{
	scsi_fail_errno(io->cmd, err, writing);
	io_finish(io);
}

static void io_bdev_done(struct bdev_req *req, int err)
{
	struct sbc_io *io = req->priv;
	io->next(io, err);
}

static void io_submit(struct sbc_io *io, enum bdev_op op, unsigned flags, uint64_t off, uint64_t len,
		      struct iovec *iov, int iovcnt, void (*next)(struct sbc_io *, int))
{
	io->req.op = op;
	io->req.flags = flags;
	io->req.offset = off;
	io->req.len = len;
	io->req.iov = iov;
	io->req.iovcnt = iovcnt;
	io->req.done = io_bdev_done;
	io->req.priv = io;
	io->next = next;
	bdev_submit(io->cmd->lu->dev, &io->req);
}

static bool io_alloc(struct sbc_io *io, size_t len)
{
	io->buf = buf_get(len);
	if (!io->buf) {
		scsi_fail(io->cmd, SK_HARDWARE_ERROR, ASC_INTERNAL_TARGET_FAILURE);
		return false;
	}
	io->buf_len = len;
	return true;
}

/* Decode LBA and transfer length of the READ/WRITE/VERIFY families. */
static void decode_lba_len(const uint8_t *cdb, uint64_t *lba, uint32_t *len)
{
	switch (cdb[0] >> 5) {
	case 0: /* 6-byte */
		*lba = be24_get(cdb + 1) & 0x1fffff;
		*len = cdb[4] ? cdb[4] : 256;
		break;
	case 1: /* 10-byte */
	case 2:
		*lba = be32_get(cdb + 2);
		*len = be16_get(cdb + 7);
		break;
	case 5: /* 12-byte */
		*lba = be32_get(cdb + 2);
		*len = be32_get(cdb + 6);
		break;
	default: /* 16-byte */
		*lba = be64_get(cdb + 2);
		*len = be32_get(cdb + 10);
		break;
	}
}

static bool range_ok(struct scsi_cmd *cmd, uint64_t lba, uint64_t n)
{
	uint64_t cap = cmd->lu->nblocks;
	if (lba > cap || n > cap - lba) {
		scsi_fail(cmd, SK_ILLEGAL_REQUEST, ASC_LBA_OUT_OF_RANGE);
		return false;
	}
	return true;
}

/*
 * The part of the command's iovec covering [off, off + len): the iovec
 * itself when it matches exactly, else a trimmed copy of the entries in
 * io->tiov. Returns the entry count, or -1 when the data is short or too
 * fragmented to describe (the caller then bounces).
 */
static int iov_window(struct sbc_io *io, size_t off, size_t len, struct iovec **out)
{
	struct scsi_cmd *cmd = io->cmd;
	size_t pos = 0;
	int k = 0;

	if (off == 0 && cmd->iovcnt > 0) {
		size_t total = scsi_iov_len(cmd);
		if (total == len) {
			*out = cmd->iov;
			return cmd->iovcnt;
		}
	}
	for (int i = 0; i < cmd->iovcnt && len; i++) {
		size_t l = cmd->iov[i].iov_len;
		if (pos + l <= off) {
			pos += l;
			continue;
		}
		size_t skip = off > pos ? off - pos : 0;
		size_t take = l - skip < len ? l - skip : len;
		if (k == SBC_TIOV)
			return -1;
		io->tiov[k].iov_base = (uint8_t *)cmd->iov[i].iov_base + skip;
		io->tiov[k].iov_len = take;
		k++;
		len -= take;
		pos += l;
		off = pos;
	}
	if (len)
		return -1;
	*out = io->tiov;
	return k;
}

static unsigned write_flags(struct scsi_cmd *cmd, bool fua)
{
	return (fua || !atomic_load_explicit(&cmd->lu->wce, memory_order_relaxed)) ? BDEV_F_FUA : 0;
}

/* ---------------------------------------------------------------- */
/* READ CAPACITY                                                     */

enum scsi_rc sbc_read_capacity_10(struct scsi_cmd *cmd)
{
	struct scsi_lu *lu = cmd->lu;
	uint8_t b[8];
	uint64_t last = lu->nblocks - 1;

	if (!(cmd->cdb[8] & 0x01) && be32_get(cmd->cdb + 2))
		return scsi_fail_cdb(cmd, 2, -1);
	be32_put(b, last > 0xffffffffull ? 0xffffffffu : (uint32_t)last);
	be32_put(b + 4, lu->block_size);
	scsi_data_in(cmd, b, sizeof(b), sizeof(b));
	return SCSI_RC_DONE;
}

enum scsi_rc sbc_read_capacity_16(struct scsi_cmd *cmd)
{
	struct scsi_lu *lu = cmd->lu;
	uint32_t alloc = be32_get(cmd->cdb + 10);
	uint8_t b[32];

	if (!(cmd->cdb[14] & 0x01) && be64_get(cmd->cdb + 2))
		return scsi_fail_cdb(cmd, 2, -1);
	memset(b, 0, sizeof(b));
	be64_put(b, lu->nblocks - 1);
	be32_put(b + 8, lu->block_size);
	/* LOGICAL BLOCKS PER PHYSICAL BLOCK EXPONENT stays 0: the backing
	 * store takes single-block writes atomically and unmaps by block. */
	if (lu->dev->can_unmap)
		b[14] = 0x80 | 0x40; /* LBPME, LBPRZ */
	scsi_data_in(cmd, b, sizeof(b), alloc);
	return SCSI_RC_DONE;
}

/* ---------------------------------------------------------------- */
/* READ                                                              */

static void read_bounced(struct sbc_io *io, int err)
{
	if (err < 0) {
		io_fail_errno(io, err, false);
		return;
	}
	scsi_data_in(io->cmd, io->buf, io->end, io->end);
	io_finish(io);
}

static void read_done(struct sbc_io *io, int err)
{
	if (err < 0) {
		io_fail_errno(io, err, false);
		return;
	}
	io->cmd->data_in_len = (uint32_t)io->end;
	io_finish(io);
}

/*
 * Reads at least this long may go out with sendfile (scsi_cmd.fe_data_fd):
 * below it, the two copies saved cost less than the extra system calls
 * (a residency check, then a sendfile per command instead of one batched
 * ring submission and one writev for many responses).
 */
#define SBC_SENDFILE_MIN (32u << 10)

enum scsi_rc sbc_read(struct scsi_cmd *cmd)
{
	struct scsi_lu *lu = cmd->lu;
	struct sbc_io *io = io_of(cmd);
	uint64_t lba;
	uint32_t n;

	decode_lba_len(cmd->cdb, &lba, &n);
	if (cmd->cdb[0] != OP_READ_6 && (cmd->cdb[1] & 0xe0)) /* RDPROTECT without PI */
		return scsi_fail_cdb(cmd, 1, 7);
	uint64_t bytes = (uint64_t)n << lu->block_shift;
	cmd->cdb_xfer_len = bytes > UINT32_MAX ? UINT32_MAX : (uint32_t)bytes;
	if (!range_ok(cmd, lba, n) || n == 0)
		return SCSI_RC_DONE;
	if (bytes > LU_MAX_XFER_BYTES)
		return scsi_fail_cdb(cmd, cmd->cdb[0] == OP_READ_16 ? 10 : 7, -1);
	io->end = bytes;
	if (cmd->fe_data_fd && bytes >= SBC_SENDFILE_MIN && cmd->read_len >= bytes) {
		/* all of it in the page cache: the front end sends it from there */
		uint64_t fd_off;
		int fd = bdev_cached_fd(lu->dev, lba << lu->block_shift, bytes, &fd_off);
		if (fd >= 0) {
			cmd->data_fd = fd;
			cmd->data_fd_off = fd_off;
			cmd->data_in_len = (uint32_t)bytes;
			cmd->data_fd_lu = cmd->held_lu; /* the hold lasts until the data is out */
			cmd->held_lu = NULL;
			return SCSI_RC_DONE;
		}
	}
	if (cmd->read_len >= bytes) {
		struct iovec *iov;
		int cnt = iov_window(io, 0, bytes, &iov);
		if (cnt > 0) {
			io_submit(io, BDEV_READ, 0, lba << lu->block_shift, bytes, iov, cnt, read_done);
			return SCSI_RC_PENDING;
		}
	}
	/* The initiator wants less than the CDB says (or a ragged buffer):
	 * read it all into a pooled buffer and hand over what fits. */
	if (bytes > BUF_MAX)
		return scsi_fail_cdb(cmd, cmd->cdb[0] == OP_READ_16 ? 10 : 7, -1);
	if (!io_alloc(io, bytes))
		return SCSI_RC_DONE;
	io->biov.iov_base = io->buf;
	io->biov.iov_len = bytes;
	io_submit(io, BDEV_READ, 0, lba << lu->block_shift, bytes, &io->biov, 1, read_bounced);
	return SCSI_RC_PENDING;
}

/* ---------------------------------------------------------------- */
/* WRITE                                                             */

static void write_done(struct sbc_io *io, int err)
{
	if (err < 0) {
		io_fail_errno(io, err, true);
		return;
	}
	io_finish(io);
}

static void write_go(struct sbc_io *io)
{
	struct scsi_cmd *cmd = io->cmd;
	struct scsi_lu *lu = cmd->lu;
	uint64_t bytes = (uint64_t)io->nblocks << lu->block_shift;
	struct iovec *iov;
	int cnt = iov_window(io, 0, bytes, &iov);

	if (cnt < 0) {
		if (!io_alloc(io, bytes)) {
			io_finish(io);
			return;
		}
		scsi_data_out(cmd, 0, io->buf, bytes);
		io->biov.iov_base = io->buf;
		io->biov.iov_len = bytes;
		iov = &io->biov;
		cnt = 1;
	}
	io_submit(io, BDEV_WRITE, io->wflags, io->lba << lu->block_shift, bytes, iov, cnt, write_done);
}

static void write_resume(struct range_lock *rl)
{
	struct sbc_io *io = (struct sbc_io *)((char *)rl - offsetof(struct sbc_io, rl));
	write_go(io);
}

/* Shared by WRITE and WRITE AND VERIFY: checks done by the caller. */
static void write_start(struct sbc_io *io, uint64_t lba, uint32_t n, bool fua)
{
	struct scsi_cmd *cmd = io->cmd;

	io->lba = lba;
	io->nblocks = n;
	io->wflags = write_flags(cmd, fua);
	io->rl.resume = write_resume;
	io->locked = true;
	if (sbc_write_begin(cmd->lu, &io->rl, lba, n))
		write_go(io);
}

/*
 * Blocks of a WRITE that the Data-Out actually carries. An initiator that
 * sends less than the CDB asks for (iSCSI EDTL < transfer length) gets the
 * command processed for the whole blocks it sent and nothing beyond
 * (FCP-4 / RFC 7143 overflow semantics); the front end reports the
 * residual from cdb_xfer_len.
 */
static uint32_t data_out_blocks(const struct scsi_cmd *cmd, uint32_t n)
{
	uint32_t have = cmd->write_len >> cmd->lu->block_shift;
	return have < n ? have : n;
}

/* Common checks of the WRITE families; false after failing cmd. */
static bool write_checks(struct scsi_cmd *cmd, uint64_t lba, uint32_t n, bool has_protect)
{
	uint64_t bytes = (uint64_t)n << cmd->lu->block_shift;

	cmd->cdb_xfer_len = bytes > UINT32_MAX ? UINT32_MAX : (uint32_t)bytes;
	if (has_protect && (cmd->cdb[1] & 0xe0)) {
		scsi_fail_cdb(cmd, 1, 7);
	} else if (!range_ok(cmd, lba, n)) {
		/* failed */
	} else if (bytes > LU_MAX_XFER_BYTES) {
		scsi_fail_cdb(cmd, cmd->cdb[0] >> 5 == 0 ? 4 : 7, -1);
	} else {
		return true;
	}
	return false;
}

enum scsi_rc sbc_write(struct scsi_cmd *cmd)
{
	struct sbc_io *io = io_of(cmd);
	uint64_t lba;
	uint32_t n;

	decode_lba_len(cmd->cdb, &lba, &n);
	if (!write_checks(cmd, lba, n, cmd->cdb[0] != OP_WRITE_6))
		return SCSI_RC_DONE;
	n = data_out_blocks(cmd, n);
	if (n == 0)
		return SCSI_RC_DONE;
	write_start(io, lba, n, cmd->cdb[0] != OP_WRITE_6 && (cmd->cdb[1] & 0x08));
	return SCSI_RC_PENDING;
}

enum scsi_rc sbc_write_verify(struct scsi_cmd *cmd)
{
	struct sbc_io *io = io_of(cmd);
	uint64_t lba;
	uint32_t n;

	decode_lba_len(cmd->cdb, &lba, &n);
	if (!write_checks(cmd, lba, n, true))
		return SCSI_RC_DONE;
	n = data_out_blocks(cmd, n);
	if (n == 0)
		return SCSI_RC_DONE;
	/* The medium is verified by being written durably: a write that
	 * completes without error reads back what was sent. */
	write_start(io, lba, n, true);
	return SCSI_RC_PENDING;
}

/* ---------------------------------------------------------------- */
/* VERIFY                                                            */

#define BYTCHK_NONE 0
#define BYTCHK_COMPARE 1
#define BYTCHK_ONE_BLOCK 3

static void verify_read_done(struct sbc_io *io, int err)
{
	struct scsi_cmd *cmd = io->cmd;
	uint32_t bs = cmd->lu->block_size;
	uint8_t bytchk = (cmd->cdb[1] >> 1) & 0x03;
	size_t len = (size_t)io->nblocks * bs;
	uint8_t tmp[4096];

	if (err < 0) {
		io_fail_errno(io, err, false);
		return;
	}
	/* compare the medium with the Data-Out buffer, a block at a time */
	for (size_t off = 0; off < len; off += bs) {
		size_t src = bytchk == BYTCHK_ONE_BLOCK ? 0 : off;
		scsi_data_out(cmd, src, tmp, bs);
		for (size_t i = 0; i < bs; i++) {
			if (tmp[i] != io->buf[off + i]) {
				scsi_fail_info(cmd, SK_MISCOMPARE, ASC_MISCOMPARE_DURING_VERIFY, off + i);
				io_finish(io);
				return;
			}
		}
	}
	io_finish(io);
}

enum scsi_rc sbc_verify(struct scsi_cmd *cmd)
{
	struct scsi_lu *lu = cmd->lu;
	struct sbc_io *io = io_of(cmd);
	uint8_t bytchk = (cmd->cdb[1] >> 1) & 0x03;
	uint64_t lba;
	uint32_t n;

	decode_lba_len(cmd->cdb, &lba, &n);
	uint64_t bytes = (uint64_t)n << lu->block_shift;
	uint64_t dout = bytchk == BYTCHK_ONE_BLOCK ? lu->block_size : bytchk ? bytes : 0;
	cmd->cdb_xfer_len = n ? (uint32_t)dout : 0;
	if (cmd->cdb[1] & 0xe0) {
		scsi_fail_cdb(cmd, 1, 7);
	} else if (bytchk == 2) {
		scsi_fail_cdb(cmd, 1, 2);
	} else if (!range_ok(cmd, lba, n)) {
		/* failed */
	} else if (n == 0 || bytchk == BYTCHK_NONE) {
		/* the medium is always readable: nothing to check */
	} else if (bytes > LU_MAX_XFER_BYTES || bytes > BUF_MAX) {
		scsi_fail_cdb(cmd, 7, -1);
	} else if (cmd->write_len < dout) {
		scsi_fail(cmd, SK_ILLEGAL_REQUEST, ASC_INVALID_FIELD_IN_IU);
	} else if (io_alloc(io, bytes)) {
		io->nblocks = n;
		io->biov.iov_base = io->buf;
		io->biov.iov_len = bytes;
		io_submit(io, BDEV_READ, 0, lba << lu->block_shift, bytes, &io->biov, 1, verify_read_done);
		return SCSI_RC_PENDING;
	}
	return SCSI_RC_DONE;
}

/* ---------------------------------------------------------------- */
/* SYNCHRONIZE CACHE, PRE-FETCH                                      */

static void flush_done(struct sbc_io *io, int err)
{
	if (err < 0) {
		io_fail_errno(io, err, true);
		return;
	}
	io_finish(io);
}

enum scsi_rc sbc_sync_cache(struct scsi_cmd *cmd)
{
	struct sbc_io *io = io_of(cmd);
	bool sixteen = cmd->cdb[0] == OP_SYNC_CACHE_16;
	uint64_t lba = sixteen ? be64_get(cmd->cdb + 2) : be32_get(cmd->cdb + 2);
	uint32_t n = sixteen ? be32_get(cmd->cdb + 10) : be16_get(cmd->cdb + 7);

	if (!range_ok(cmd, lba, n))
		return SCSI_RC_DONE;
	/* IMMED is honoured by being fast enough: the flush of the whole
	 * device is what makes the range durable either way. */
	io_submit(io, BDEV_FLUSH, 0, 0, 0, NULL, 0, flush_done);
	return SCSI_RC_PENDING;
}

enum scsi_rc sbc_prefetch(struct scsi_cmd *cmd)
{
	bool sixteen = cmd->cdb[0] == OP_PREFETCH_16;
	uint64_t lba = sixteen ? be64_get(cmd->cdb + 2) : be32_get(cmd->cdb + 2);
	uint32_t n = sixteen ? be32_get(cmd->cdb + 10) : be16_get(cmd->cdb + 7);

	range_ok(cmd, lba, n);
	return SCSI_RC_DONE;
}

/* ---------------------------------------------------------------- */
/* Chunked operations: WRITE SAME replication, SANITIZE, big zeroing */

static void chunk_step(struct sbc_io *io, int err);

/* Issue the next piece of [pos, end) with io->op. */
static void chunk_issue(struct sbc_io *io)
{
	struct scsi_lu *lu = io->cmd->lu;
	uint64_t len = io->end - io->pos;

	if (io->op == BDEV_WRITE) {
		if (len > io->chunk)
			len = io->chunk;
		io->biov.iov_base = io->buf;
		io->biov.iov_len = len;
		io_submit(io, BDEV_WRITE, io->wflags, io->pos, len, &io->biov, 1, chunk_step);
	} else {
		/* unmap / write zeroes: big pieces, bounded so one op never
		 * ties the worker's ring up for long */
		uint64_t max = (uint64_t)256 << 20;
		if (len > max)
			len = max;
		io_submit(io, (enum bdev_op)io->op, io->wflags, io->pos, len, NULL, 0, chunk_step);
	}
	(void)lu;
}

static void chunk_step(struct sbc_io *io, int err)
{
	if (err < 0) {
		if (atomic_load(&io->cmd->lu->sanitizing) && io->cmd->cdb[0] == OP_SANITIZE)
			atomic_store(&io->cmd->lu->sanitizing, false);
		io_fail_errno(io, err, true);
		return;
	}
	io->pos += io->req.len;
	if (io->pos < io->end) {
		chunk_issue(io);
		return;
	}
	if (io->cmd->cdb[0] == OP_SANITIZE) {
		/* make it durable before reporting success */
		if (io->op != BDEV_FLUSH) {
			io->op = BDEV_FLUSH;
			io_submit(io, BDEV_FLUSH, 0, 0, 0, NULL, 0, chunk_step);
			return;
		}
		atomic_store(&io->cmd->lu->sanitizing, false);
	}
	io_finish(io);
}

static void chunk_start(struct sbc_io *io)
{
	if (io->pos >= io->end) {
		io_finish(io);
		return;
	}
	chunk_issue(io);
}

static void chunk_resume(struct range_lock *rl)
{
	struct sbc_io *io = (struct sbc_io *)((char *)rl - offsetof(struct sbc_io, rl));
	chunk_start(io);
}

/* ---------------------------------------------------------------- */
/* WRITE SAME                                                        */

static bool all_zero(const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i])
			return false;
	return true;
}

enum scsi_rc sbc_write_same(struct scsi_cmd *cmd)
{
	struct scsi_lu *lu = cmd->lu;
	struct sbc_io *io = io_of(cmd);
	bool sixteen = cmd->cdb[0] == OP_WRITE_SAME_16;
	uint64_t lba = sixteen ? be64_get(cmd->cdb + 2) : be32_get(cmd->cdb + 2);
	uint64_t n = sixteen ? be32_get(cmd->cdb + 10) : be16_get(cmd->cdb + 7);
	bool unmap = cmd->cdb[1] & 0x08;
	bool ndob = sixteen && (cmd->cdb[1] & 0x01);
	uint32_t bs = lu->block_size;
	uint8_t block[4096];

	cmd->cdb_xfer_len = ndob ? 0 : bs;
	if (cmd->cdb[1] & 0xe0)
		return scsi_fail_cdb(cmd, 1, 7);
	if (cmd->cdb[1] & 0x10) /* ANCHOR: no anchored state here */
		return scsi_fail_cdb(cmd, 1, 4);
	if (n == 0 && lba <= lu->nblocks) {
		n = lu->nblocks - lba; /* to the end of the medium */
		if (n > lu_max_ws_blocks(lu))
			return scsi_fail_cdb(cmd, sixteen ? 10 : 7, -1);
	}
	if (!range_ok(cmd, lba, n))
		return SCSI_RC_DONE;
	if (n > lu_max_ws_blocks(lu))
		return scsi_fail_cdb(cmd, sixteen ? 10 : 7, -1);
	if (ndob) {
		memset(block, 0, bs);
	} else if (cmd->write_len != bs) {
		/* exactly one block of Data-Out, no more, no less */
		return scsi_fail(cmd, SK_ILLEGAL_REQUEST, ASC_INVALID_FIELD_IN_IU);
	} else {
		scsi_data_out(cmd, 0, block, bs);
	}
	if (n == 0)
		return SCSI_RC_DONE;

	io->pos = lba << lu->block_shift;
	io->end = (lba + n) << lu->block_shift;
	io->wflags = write_flags(cmd, false);
	bool zero = all_zero(block, bs);
	if (unmap && lu->dev->can_unmap) {
		/* UNMAP asks for deallocation; reads then return zeroes
		 * (LBPRZ), whatever block came with the command. */
		io->op = BDEV_UNMAP;
	} else if (zero) {
		io->op = BDEV_WRITE_ZEROES;
	} else {
		io->op = BDEV_WRITE;
		io->chunk = io->end - io->pos < CHUNK_BYTES ? (size_t)(io->end - io->pos) : CHUNK_BYTES;
		if (!io_alloc(io, io->chunk))
			return SCSI_RC_DONE;
		for (size_t off = 0; off < io->chunk; off += bs)
			memcpy(io->buf + off, block, bs);
	}
	io->rl.resume = chunk_resume;
	io->locked = true;
	if (sbc_write_begin(lu, &io->rl, lba, n))
		chunk_start(io);
	return SCSI_RC_PENDING;
}

/* ---------------------------------------------------------------- */
/* UNMAP                                                             */

#define UNMAP_HDR 8
#define UNMAP_DESC 16

static void unmap_next(struct sbc_io *io, int err);

static void unmap_issue(struct sbc_io *io)
{
	struct scsi_cmd *cmd = io->cmd;
	struct scsi_lu *lu = cmd->lu;
	uint8_t d[UNMAP_DESC];

	/* io->pos walks descriptors: offset into the parameter list */
	while (io->pos < io->end) {
		scsi_data_out(cmd, io->pos, d, UNMAP_DESC);
		io->pos += UNMAP_DESC;
		uint64_t lba = be64_get(d);
		uint32_t n = be32_get(d + 8);
		if (!n)
			continue;
		/* Descriptors that continue this one (hosts send one per block
		 * or per extent) go down as one request: one round trip to a
		 * network store instead of one per descriptor. */
		while (io->pos < io->end) {
			scsi_data_out(cmd, io->pos, d, UNMAP_DESC);
			uint32_t more = be32_get(d + 8);
			if (be64_get(d) != lba + n || more > UINT32_MAX - n)
				break;
			n += more;
			io->pos += UNMAP_DESC;
		}
		io->lba = lba;
		io->nblocks = n;
		io_submit(io, lu->dev->can_unmap ? BDEV_UNMAP : BDEV_WRITE_ZEROES, 0, lba << lu->block_shift,
			  (uint64_t)n << lu->block_shift, NULL, 0, unmap_next);
		return;
	}
	io_finish(io);
}

static void unmap_next(struct sbc_io *io, int err)
{
	if (err < 0) {
		io_fail_errno(io, err, true);
		return;
	}
	unmap_issue(io);
}

static void unmap_resume(struct range_lock *rl)
{
	struct sbc_io *io = (struct sbc_io *)((char *)rl - offsetof(struct sbc_io, rl));
	unmap_issue(io);
}

enum scsi_rc sbc_unmap(struct scsi_cmd *cmd)
{
	struct scsi_lu *lu = cmd->lu;
	struct sbc_io *io = io_of(cmd);
	uint32_t plen = be16_get(cmd->cdb + 7);
	uint8_t hdr[UNMAP_HDR], d[UNMAP_DESC];
	uint64_t lo = UINT64_MAX, hi = 0;

	cmd->cdb_xfer_len = plen;
	if (cmd->cdb[1] & 0x01) /* ANCHOR unsupported (ANC_SUP=0) */
		return scsi_fail_cdb(cmd, 1, 0);
	if (plen == 0)
		return SCSI_RC_DONE;
	if (plen < UNMAP_HDR || cmd->write_len < UNMAP_HDR)
		return scsi_fail(cmd, SK_ILLEGAL_REQUEST, ASC_PARAM_LIST_LENGTH_ERROR);
	scsi_data_out(cmd, 0, hdr, UNMAP_HDR);
	uint32_t avail = plen < cmd->write_len ? plen : cmd->write_len;
	uint32_t bddl = be16_get(hdr + 2);
	if (be16_get(hdr) + 2u > plen && be16_get(hdr))
		return scsi_fail(cmd, SK_ILLEGAL_REQUEST, ASC_PARAM_LIST_LENGTH_ERROR);
	if (bddl > avail - UNMAP_HDR)
		return scsi_fail(cmd, SK_ILLEGAL_REQUEST, ASC_PARAM_LIST_LENGTH_ERROR);
	uint32_t ndesc = bddl / UNMAP_DESC;
	if (ndesc > LU_MAX_UNMAP_DESCS)
		return scsi_fail_param(cmd, 2, -1);
	for (uint32_t i = 0; i < ndesc; i++) {
		scsi_data_out(cmd, UNMAP_HDR + (size_t)i * UNMAP_DESC, d, UNMAP_DESC);
		uint64_t lba = be64_get(d);
		uint32_t n = be32_get(d + 8);
		if (!range_ok(cmd, lba, n))
			return SCSI_RC_DONE;
		if (n > LU_MAX_UNMAP_BLOCKS)
			return scsi_fail_param(cmd, UNMAP_HDR + i * UNMAP_DESC + 8, -1);
		if (n && lba < lo)
			lo = lba;
		if (n && lba + n > hi)
			hi = lba + n;
	}
	if (hi == 0)
		return SCSI_RC_DONE;
	io->pos = UNMAP_HDR;
	io->end = UNMAP_HDR + (uint64_t)ndesc * UNMAP_DESC;
	io->rl.resume = unmap_resume;
	io->locked = true;
	if (sbc_write_begin(lu, &io->rl, lo, hi - lo))
		unmap_issue(io);
	return SCSI_RC_PENDING;
}

/* ---------------------------------------------------------------- */
/* COMPARE AND WRITE, ORWRITE                                        */

static void caw_write_done(struct sbc_io *io, int err)
{
	if (err < 0) {
		io_fail_errno(io, err, true);
		return;
	}
	io_finish(io);
}

static void caw_read_done(struct sbc_io *io, int err)
{
	struct scsi_cmd *cmd = io->cmd;
	struct scsi_lu *lu = cmd->lu;
	size_t len = (size_t)io->nblocks << lu->block_shift;
	uint8_t *medium = io->buf, *data = io->buf + len;

	if (err < 0) {
		io_fail_errno(io, err, false);
		return;
	}
	scsi_data_out(cmd, 0, data, cmd->cdb[0] == OP_COMPARE_AND_WRITE ? 2 * len : len);
	if (cmd->cdb[0] == OP_COMPARE_AND_WRITE) {
		for (size_t i = 0; i < len; i++) {
			if (medium[i] != data[i]) {
				scsi_fail_info(cmd, SK_MISCOMPARE, ASC_MISCOMPARE_DURING_VERIFY, i);
				io_finish(io);
				return;
			}
		}
		io->biov.iov_base = data + len; /* the write half */
	} else {
		for (size_t i = 0; i < len; i++)
			medium[i] |= data[i];
		io->biov.iov_base = medium;
	}
	io->biov.iov_len = len;
	io_submit(io, BDEV_WRITE, io->wflags, io->lba << lu->block_shift, len, &io->biov, 1, caw_write_done);
}

static void caw_go(struct sbc_io *io)
{
	struct scsi_lu *lu = io->cmd->lu;
	size_t len = (size_t)io->nblocks << lu->block_shift;
	io->biov.iov_base = io->buf;
	io->biov.iov_len = len;
	io_submit(io, BDEV_READ, 0, io->lba << lu->block_shift, len, &io->biov, 1, caw_read_done);
}

static void caw_resume(struct range_lock *rl)
{
	caw_go((struct sbc_io *)((char *)rl - offsetof(struct sbc_io, rl)));
}

/* COMPARE AND WRITE and ORWRITE: read, combine, write, all under a CAW
 * range lock so no other writer of these LBAs slips in between. */
static enum scsi_rc atomic_rmw(struct scsi_cmd *cmd, uint64_t lba, uint32_t n, uint32_t max_blocks,
			       unsigned len_byte, uint64_t dout)
{
	struct scsi_lu *lu = cmd->lu;
	struct sbc_io *io = io_of(cmd);
	uint64_t bytes = (uint64_t)n << lu->block_shift;

	cmd->cdb_xfer_len = (uint32_t)dout;
	if (cmd->cdb[1] & 0xe0) {
		scsi_fail_cdb(cmd, 1, 7);
	} else if (n > max_blocks) {
		scsi_fail_cdb(cmd, len_byte, -1);
	} else if (!range_ok(cmd, lba, n)) {
		/* failed */
	} else if (n == 0) {
		/* nothing to do, unless Data-Out came that the length cannot
		 * account for (a NUMBER OF BLOCKS that wrapped, e.g. 256) */
		if (cmd->write_len)
			scsi_fail_cdb(cmd, len_byte, -1);
	} else if (cmd->write_len < dout || (cmd->cdb[0] == OP_COMPARE_AND_WRITE && cmd->write_len != dout)) {
		scsi_fail(cmd, SK_ILLEGAL_REQUEST, ASC_INVALID_FIELD_IN_IU);
	} else if (io_alloc(io, bytes + dout)) { /* medium image + Data-Out */
		io->lba = lba;
		io->nblocks = n;
		io->wflags = write_flags(cmd, cmd->cdb[1] & 0x08);
		io->rl.resume = caw_resume;
		io->locked = true;
		if (range_begin(lu, &io->rl, lba, n, true))
			caw_go(io);
		return SCSI_RC_PENDING;
	}
	return SCSI_RC_DONE;
}

enum scsi_rc sbc_compare_and_write(struct scsi_cmd *cmd)
{
	uint32_t n = cmd->cdb[13];
	return atomic_rmw(cmd, be64_get(cmd->cdb + 2), n, LU_MAX_CAW_BLOCKS, 13,
			  2 * ((uint64_t)n << cmd->lu->block_shift));
}

enum scsi_rc sbc_orwrite(struct scsi_cmd *cmd)
{
	uint32_t n = be32_get(cmd->cdb + 10);
	uint64_t dout = (uint64_t)n << cmd->lu->block_shift;
	/* medium image and Data-Out share one pooled buffer */
	return atomic_rmw(cmd, be64_get(cmd->cdb + 2), n, (BUF_MAX / 2) >> cmd->lu->block_shift, 10,
			  dout > UINT32_MAX ? UINT32_MAX : dout);
}

/* ---------------------------------------------------------------- */
/* GET LBA STATUS                                                    */

#define LBA_STATUS_MAPPED 0
#define LBA_STATUS_DEALLOCATED 1
#define LBA_STATUS_MAX_DESC 64

enum scsi_rc sbc_get_lba_status(struct scsi_cmd *cmd)
{
	struct scsi_lu *lu = cmd->lu;
	uint64_t lba = be64_get(cmd->cdb + 2);
	uint32_t alloc = be32_get(cmd->cdb + 10);
	uint8_t b[8 + 16 * LBA_STATUS_MAX_DESC];
	size_t off = 8;

	if (lba >= lu->nblocks)
		return scsi_fail(cmd, SK_ILLEGAL_REQUEST, ASC_LBA_OUT_OF_RANGE);
	memset(b, 0, sizeof(b));
	size_t maxd = alloc > 8 ? (alloc - 8 + 15) / 16 : 1;
	if (maxd > LBA_STATUS_MAX_DESC)
		maxd = LBA_STATUS_MAX_DESC;
	if (maxd == 0)
		maxd = 1;
	uint64_t cur = lba;
	while (cur < lu->nblocks && (off - 8) / 16 < maxd) {
		bool mapped = true;
		int64_t len = bdev_lba_status(lu->dev, cur << lu->block_shift, &mapped);
		uint64_t nb;
		if (len <= 0) {
			mapped = true;
			nb = lu->nblocks - cur;
		} else {
			nb = ((uint64_t)len + lu->block_size - 1) >> lu->block_shift;
		}
		if (nb > lu->nblocks - cur)
			nb = lu->nblocks - cur;
		if (nb > 0xffffffffu)
			nb = 0xffffffffu;
		if (nb == 0)
			nb = 1;
		/* merge with the previous descriptor when the state repeats */
		if (off > 8 && b[off - 4] == (mapped ? LBA_STATUS_MAPPED : LBA_STATUS_DEALLOCATED) &&
		    be32_get(b + off - 8) + nb <= 0xffffffffu) {
			be32_put(b + off - 8, (uint32_t)(be32_get(b + off - 8) + nb));
		} else {
			be64_put(b + off, cur);
			be32_put(b + off + 8, (uint32_t)nb);
			b[off + 12] = mapped ? LBA_STATUS_MAPPED : LBA_STATUS_DEALLOCATED;
			off += 16;
		}
		cur += nb;
	}
	be32_put(b, (uint32_t)(off - 4));
	scsi_data_in(cmd, b, off, alloc);
	return SCSI_RC_DONE;
}

/* ---------------------------------------------------------------- */
/* READ DEFECT DATA: the medium is a file or a RAID volume; it has no  */
/* defect list of its own, so both lists are reported, and empty.      */

#define DEFECT_PLISTV 0x10
#define DEFECT_GLISTV 0x08

enum scsi_rc sbc_read_defect_data(struct scsi_cmd *cmd)
{
	bool twelve = cmd->cdb[0] == OP_READ_DEFECT_DATA_12;
	uint8_t req = twelve ? cmd->cdb[1] : cmd->cdb[2];
	uint32_t alloc = twelve ? be32_get(cmd->cdb + 6) : be16_get(cmd->cdb + 7);
	uint8_t b[8];

	memset(b, 0, sizeof(b));
	b[1] = req & (DEFECT_PLISTV | DEFECT_GLISTV | 0x07);
	scsi_data_in(cmd, b, twelve ? 8 : 4, alloc);
	return SCSI_RC_DONE;
}

/* ---------------------------------------------------------------- */
/* SANITIZE                                                          */

/*
 * BLOCK ERASE deallocates every block (reads return zeroes, LBPRZ), which
 * is what erasing means for thin storage; EXIT FAILURE MODE has nothing to
 * leave since a sanitize here cannot end half done without an error
 * reported. OVERWRITE is not offered: on thin storage it would only be a
 * slower BLOCK ERASE, and CRYPTO ERASE needs encryption we do not have.
 * Other commands see NOT READY / SANITIZE IN PROGRESS while it runs.
 */
enum scsi_rc sbc_sanitize(struct scsi_cmd *cmd)
{
	struct scsi_lu *lu = cmd->lu;
	struct sbc_io *io = io_of(cmd);
	uint8_t sa = cmd->cdb[1] & 0x1f;
	uint16_t plen = be16_get(cmd->cdb + 7);

	cmd->cdb_xfer_len = plen;
	if (plen)
		return scsi_fail_cdb(cmd, 7, -1);
	if (sa == SANITIZE_EXIT_FAILURE_MODE)
		return SCSI_RC_DONE;
	io->pos = 0;
	io->end = lu->nblocks << lu->block_shift;
	io->op = lu->dev->can_unmap ? BDEV_UNMAP : BDEV_WRITE_ZEROES;
	atomic_store(&lu->sanitizing, true);
	io->rl.resume = chunk_resume;
	io->locked = true;
	if (sbc_write_begin(lu, &io->rl, 0, lu->nblocks))
		chunk_start(io);
	return SCSI_RC_PENDING;
}
