/*
 * sbc_rw.c - the SBC commands that move data: READ, WRITE, WRITE AND
 * VERIFY, VERIFY, COMPARE AND WRITE and ORWRITE.
 *
 * READ/WRITE go straight from the command's iovec to bdev_submit with the
 * bdev_req embedded in cmd->bs_scratch (struct sbc_io): no lock, no
 * allocation. What needs a buffer of its own (COMPARE AND WRITE, VERIFY
 * with BYTCHK, reads the initiator wants only part of) takes one from the
 * per-thread buffer pool. Writers pass the COMPARE AND WRITE interlock of
 * sbc.c; COMPARE AND WRITE and ORWRITE read, combine and write under it.
 *
 * Threading: handlers run on the submitting worker; bdev completions come
 * back on the same worker.
 */
#include "backstore/lu.h"
#include "backstore/sbc_io.h"

#include "common/bufpool.h"

/* ---------------------------------------------------------------- */
/* READ                                                              */

static void read_bounced(struct sbc_io *io, int err)
{
	if (err < 0) {
		sbc_io_fail_errno(io, err, false);
		return;
	}
	scsi_data_in(io->cmd, io->buf, io->end, io->end);
	sbc_io_finish(io);
}

static void read_done(struct sbc_io *io, int err)
{
	if (err < 0) {
		sbc_io_fail_errno(io, err, false);
		return;
	}
	io->cmd->data_in_len = (uint32_t)io->end;
	sbc_io_finish(io);
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
	struct sbc_io *io = sbc_io_of(cmd);
	uint64_t lba;
	uint32_t n;

	sbc_decode_lba_len(cmd->cdb, &lba, &n);
	if (cmd->cdb[0] != OP_READ_6 && (cmd->cdb[1] & 0xe0)) /* RDPROTECT without PI */
		return scsi_fail_cdb(cmd, 1, 7);
	uint64_t bytes = (uint64_t)n << lu->block_shift;
	cmd->cdb_xfer_len = bytes > UINT32_MAX ? UINT32_MAX : (uint32_t)bytes;
	if (!sbc_range_ok(cmd, lba, n) || n == 0)
		return SCSI_RC_DONE;
	if (bytes > LU_MAX_XFER_BYTES)
		return scsi_fail_cdb(cmd, cmd->cdb[0] == OP_READ_16 ? 10 : 7, -1);
	io->end = bytes;
	unsigned flags = cmd->unowned ? BDEV_F_UNOWNED : 0;
	if (cmd->fe_data_fd && !cmd->unowned && bytes >= SBC_SENDFILE_MIN && cmd->read_len >= bytes) {
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
		int cnt = sbc_iov_window(io, 0, bytes, &iov);
		if (cnt > 0) {
			sbc_io_submit(io, BDEV_READ, flags, lba << lu->block_shift, bytes, iov, cnt, read_done);
			return SCSI_RC_PENDING;
		}
	}
	/* The initiator wants less than the CDB says (or a ragged buffer):
	 * read it all into a pooled buffer and hand over what fits. */
	if (bytes > BUF_MAX)
		return scsi_fail_cdb(cmd, cmd->cdb[0] == OP_READ_16 ? 10 : 7, -1);
	if (!sbc_io_alloc(io, bytes))
		return SCSI_RC_DONE;
	io->biov.iov_base = io->buf;
	io->biov.iov_len = bytes;
	sbc_io_submit(io, BDEV_READ, flags, lba << lu->block_shift, bytes, &io->biov, 1, read_bounced);
	return SCSI_RC_PENDING;
}

/* ---------------------------------------------------------------- */
/* WRITE                                                             */

static void write_go(struct sbc_io *io)
{
	struct scsi_cmd *cmd = io->cmd;
	struct scsi_lu *lu = cmd->lu;
	uint64_t bytes = (uint64_t)io->nblocks << lu->block_shift;
	struct iovec *iov;
	int cnt = sbc_iov_window(io, 0, bytes, &iov);

	if (cnt < 0) {
		if (!sbc_io_alloc(io, bytes)) {
			sbc_io_finish(io);
			return;
		}
		scsi_data_out(cmd, 0, io->buf, bytes);
		io->biov.iov_base = io->buf;
		io->biov.iov_len = bytes;
		iov = &io->biov;
		cnt = 1;
	}
	sbc_io_submit(io, BDEV_WRITE, io->wflags, io->lba << lu->block_shift, bytes, iov, cnt, sbc_io_done);
}

static void write_resume(struct range_lock *rl)
{
	struct sbc_io *io = (struct sbc_io *)((char *)rl - offsetof(struct sbc_io, rl));
	write_go(io);
}

/* A WRITE or COMPARE AND WRITE aborted while it waited in the interlock
 * (scsi_cmd_cancel, which already took it out): it never reached the device. */
static void rw_cancelled(struct range_lock *rl)
{
	struct sbc_io *io = (struct sbc_io *)((char *)rl - offsetof(struct sbc_io, rl));
	io->locked = false;
	scsi_fail(io->cmd, SK_ABORTED_COMMAND, ASC_NO_ADDITIONAL_SENSE);
	sbc_io_finish(io);
}

/* Shared by WRITE and WRITE AND VERIFY: checks done by the caller. */
static void write_start(struct sbc_io *io, uint64_t lba, uint32_t n, bool fua)
{
	struct scsi_cmd *cmd = io->cmd;

	io->lba = lba;
	io->nblocks = n;
	io->wflags = sbc_write_flags(cmd, fua);
	io->rl.resume = write_resume;
	io->locked = true;
	if (sbc_write_begin(cmd->lu, &io->rl, io->cmd, lba, n))
		write_go(io);
	else
		io->rl.cancelled = rw_cancelled;
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
	} else if (!sbc_range_ok(cmd, lba, n)) {
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
	struct sbc_io *io = sbc_io_of(cmd);
	uint64_t lba;
	uint32_t n;

	sbc_decode_lba_len(cmd->cdb, &lba, &n);
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
	struct sbc_io *io = sbc_io_of(cmd);
	uint64_t lba;
	uint32_t n;

	sbc_decode_lba_len(cmd->cdb, &lba, &n);
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
		sbc_io_fail_errno(io, err, false);
		return;
	}
	/* compare the medium with the Data-Out buffer, a block at a time */
	for (size_t off = 0; off < len; off += bs) {
		size_t src = bytchk == BYTCHK_ONE_BLOCK ? 0 : off;
		scsi_data_out(cmd, src, tmp, bs);
		for (size_t i = 0; i < bs; i++) {
			if (tmp[i] != io->buf[off + i]) {
				scsi_fail_info(cmd, SK_MISCOMPARE, ASC_MISCOMPARE_DURING_VERIFY, off + i);
				sbc_io_finish(io);
				return;
			}
		}
	}
	sbc_io_finish(io);
}

enum scsi_rc sbc_verify(struct scsi_cmd *cmd)
{
	struct scsi_lu *lu = cmd->lu;
	struct sbc_io *io = sbc_io_of(cmd);
	uint8_t bytchk = (cmd->cdb[1] >> 1) & 0x03;
	uint64_t lba;
	uint32_t n;

	sbc_decode_lba_len(cmd->cdb, &lba, &n);
	uint64_t bytes = (uint64_t)n << lu->block_shift;
	uint64_t dout = bytchk == BYTCHK_ONE_BLOCK ? lu->block_size : bytchk ? bytes : 0;
	cmd->cdb_xfer_len = n ? (uint32_t)dout : 0;
	if (cmd->cdb[1] & 0xe0) {
		scsi_fail_cdb(cmd, 1, 7);
	} else if (bytchk == 2) {
		scsi_fail_cdb(cmd, 1, 2);
	} else if (!sbc_range_ok(cmd, lba, n)) {
		/* failed */
	} else if (n == 0 || bytchk == BYTCHK_NONE) {
		/* the medium is always readable: nothing to check */
	} else if (bytes > LU_MAX_XFER_BYTES || bytes > BUF_MAX) {
		scsi_fail_cdb(cmd, 7, -1);
	} else if (cmd->write_len < dout) {
		scsi_fail(cmd, SK_ILLEGAL_REQUEST, ASC_INVALID_FIELD_IN_IU);
	} else if (sbc_io_alloc(io, bytes)) {
		io->nblocks = n;
		io->biov.iov_base = io->buf;
		io->biov.iov_len = bytes;
		sbc_io_submit(io, BDEV_READ, 0, lba << lu->block_shift, bytes, &io->biov, 1, verify_read_done);
		return SCSI_RC_PENDING;
	}
	return SCSI_RC_DONE;
}

/* ---------------------------------------------------------------- */
/* COMPARE AND WRITE, ORWRITE                                        */

static void caw_read_done(struct sbc_io *io, int err)
{
	struct scsi_cmd *cmd = io->cmd;
	struct scsi_lu *lu = cmd->lu;
	size_t len = (size_t)io->nblocks << lu->block_shift;
	uint8_t *medium = io->buf, *data = io->buf + len;

	if (err < 0) {
		sbc_io_fail_errno(io, err, false);
		return;
	}
	scsi_data_out(cmd, 0, data, cmd->cdb[0] == OP_COMPARE_AND_WRITE ? 2 * len : len);
	if (cmd->cdb[0] == OP_COMPARE_AND_WRITE) {
		for (size_t i = 0; i < len; i++) {
			if (medium[i] != data[i]) {
				scsi_fail_info(cmd, SK_MISCOMPARE, ASC_MISCOMPARE_DURING_VERIFY, i);
				sbc_io_finish(io);
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
	sbc_io_submit(io, BDEV_WRITE, io->wflags, io->lba << lu->block_shift, len, &io->biov, 1, sbc_io_done);
}

static void caw_go(struct sbc_io *io)
{
	struct scsi_lu *lu = io->cmd->lu;
	size_t len = (size_t)io->nblocks << lu->block_shift;
	io->biov.iov_base = io->buf;
	io->biov.iov_len = len;
	sbc_io_submit(io, BDEV_READ, 0, io->lba << lu->block_shift, len, &io->biov, 1, caw_read_done);
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
	struct sbc_io *io = sbc_io_of(cmd);
	uint64_t bytes = (uint64_t)n << lu->block_shift;

	cmd->cdb_xfer_len = (uint32_t)dout;
	if (cmd->cdb[1] & 0xe0) {
		scsi_fail_cdb(cmd, 1, 7);
	} else if (n > max_blocks) {
		scsi_fail_cdb(cmd, len_byte, -1);
	} else if (!sbc_range_ok(cmd, lba, n)) {
		/* failed */
	} else if (n == 0) {
		/* nothing to do, unless Data-Out came that the length cannot
		 * account for (a NUMBER OF BLOCKS that wrapped, e.g. 256) */
		if (cmd->write_len)
			scsi_fail_cdb(cmd, len_byte, -1);
	} else if (cmd->write_len < dout || (cmd->cdb[0] == OP_COMPARE_AND_WRITE && cmd->write_len != dout)) {
		scsi_fail(cmd, SK_ILLEGAL_REQUEST, ASC_INVALID_FIELD_IN_IU);
	} else if (sbc_io_alloc(io, bytes + dout)) { /* medium image + Data-Out */
		io->lba = lba;
		io->nblocks = n;
		io->wflags = sbc_write_flags(cmd, cmd->cdb[1] & 0x08);
		io->rl.resume = caw_resume;
		io->locked = true;
		if (sbc_caw_begin(lu, &io->rl, io->cmd, lba, n))
			caw_go(io);
		else
			io->rl.cancelled = rw_cancelled;
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
