/*
 * sbc_io.h - what the SBC files share (sbc.c, sbc_rw.c, sbc_prov.c), not a
 * surface for the rest of backstore/: the state of a block command that
 * goes to the bdev, and the helpers that submit it and finish it.
 *
 * Such a command keeps one struct sbc_io in cmd->bs_scratch: its
 * bdev_req, its place in the COMPARE AND WRITE interlock (rl, locked), a
 * buffer from the per-thread pool when it needs one of its own, and the
 * function the next bdev completion goes to. sbc_io_finish releases all of
 * that and completes the command: after a handler returned SCSI_RC_PENDING
 * it is the one way out, called exactly once.
 *
 * Threading: a command's sbc_io is touched only on its submitting worker.
 */
#ifndef TC_BACKSTORE_SBC_IO_H
#define TC_BACKSTORE_SBC_IO_H

#include "backstore/lu.h"

#include <assert.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define SBC_TIOV 6

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

/* The command's sbc_io, cleared. */
static inline struct sbc_io *sbc_io_of(struct scsi_cmd *cmd)
{
	struct sbc_io *io = (struct sbc_io *)cmd->bs_scratch;
	memset(io, 0, sizeof(*io));
	io->cmd = cmd;
	return io;
}

/* Leave the interlock if in it, return the buffer, complete the command. */
void sbc_io_finish(struct sbc_io *io);
/* bdev completion: GOOD, or the error through sbc_io_fail_errno; then sbc_io_finish. */
void sbc_io_done(struct sbc_io *io, int err);
/* The bdev's -errno as the command's answer, then sbc_io_finish. */
void sbc_io_fail_errno(struct sbc_io *io, int err, bool writing);
/* Send one request to the LU's bdev; its completion calls next(io, err). */
void sbc_io_submit(struct sbc_io *io, enum bdev_op op, unsigned flags, uint64_t off, uint64_t len,
		   struct iovec *iov, int iovcnt, void (*next)(struct sbc_io *, int));
/* A pooled buffer of len bytes in io->buf; false after failing the
 * command (not completed). */
bool sbc_io_alloc(struct sbc_io *io, size_t len);
/* The command's iovec over [off, off + len) in *out (itself, or a trimmed
 * copy in io->tiov): the entry count, or -1 when the caller must bounce. */
int sbc_iov_window(struct sbc_io *io, size_t off, size_t len, struct iovec **out);
/* COMPARE AND WRITE's side of the interlock (sbc_write_begin is the
 * writers'): true when it may go now, else rl->resume runs later on this
 * worker. sbc_io_finish releases it when io->locked. */
bool sbc_caw_begin(struct scsi_lu *lu, struct range_lock *rl, struct scsi_cmd *cmd, uint64_t lba,
		   uint64_t nblocks);

/* Decode LBA and transfer length of the READ/WRITE/VERIFY families. */
static inline void sbc_decode_lba_len(const uint8_t *cdb, uint64_t *lba, uint32_t *len)
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

/* false after failing cmd with LBA OUT OF RANGE (not completed) */
static inline bool sbc_range_ok(struct scsi_cmd *cmd, uint64_t lba, uint64_t n)
{
	uint64_t cap = cmd->lu->nblocks;
	if (lba > cap || n > cap - lba) {
		scsi_fail(cmd, SK_ILLEGAL_REQUEST, ASC_LBA_OUT_OF_RANGE);
		return false;
	}
	return true;
}

/* FUA when asked, or when the write cache is off */
static inline unsigned sbc_write_flags(struct scsi_cmd *cmd, bool fua)
{
	return (fua || !atomic_load_explicit(&cmd->lu->wce, memory_order_relaxed)) ? BDEV_F_FUA : 0;
}

#endif
