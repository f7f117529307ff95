/*
 * sbc_prov.c - the SBC commands that provision blocks rather than move
 * data: WRITE SAME, UNMAP, GET LBA STATUS and SANITIZE.
 *
 * WRITE SAME and SANITIZE cover ranges too long for one request: a chunked
 * loop walks [pos, end) with one bdev request at a time (a replicated
 * block from a pooled buffer, an unmap or a write of zeroes). UNMAP sends
 * each run of adjacent descriptors as one request. All of them are writers
 * for the COMPARE AND WRITE interlock of sbc.c.
 *
 * Threading: handlers run on the submitting worker; bdev completions come
 * back on the same worker.
 */
#include "backstore/lu.h"
#include "backstore/sbc_io.h"
#include "common/offload.h"

#define CHUNK_BYTES (1u << 20)

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
		sbc_io_submit(io, BDEV_WRITE, io->wflags, io->pos, len, &io->biov, 1, chunk_step);
	} else {
		/* unmap / write zeroes: big pieces, bounded so one op never
		 * ties the worker's ring up for long */
		uint64_t max = (uint64_t)256 << 20;
		if (len > max)
			len = max;
		sbc_io_submit(io, (enum bdev_op)io->op, io->wflags, io->pos, len, NULL, 0, chunk_step);
	}
	(void)lu;
}

static void chunk_step(struct sbc_io *io, int err)
{
	if (err < 0) {
		if (atomic_load(&io->cmd->lu->sanitizing) && io->cmd->cdb[0] == OP_SANITIZE)
			atomic_store(&io->cmd->lu->sanitizing, false);
		sbc_io_fail_errno(io, err, true);
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
			sbc_io_submit(io, BDEV_FLUSH, 0, 0, 0, NULL, 0, chunk_step);
			return;
		}
		atomic_store(&io->cmd->lu->sanitizing, false);
	}
	sbc_io_finish(io);
}

static void chunk_start(struct sbc_io *io)
{
	if (io->pos >= io->end) {
		sbc_io_finish(io);
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
	struct sbc_io *io = sbc_io_of(cmd);
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
	if (!sbc_range_ok(cmd, lba, n))
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
	io->wflags = sbc_write_flags(cmd, false);
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
		if (!sbc_io_alloc(io, io->chunk))
			return SCSI_RC_DONE;
		for (size_t off = 0; off < io->chunk; off += bs)
			memcpy(io->buf + off, block, bs);
	}
	io->rl.resume = chunk_resume;
	io->locked = true;
	if (sbc_write_begin(lu, &io->rl, io->cmd, lba, n))
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
		sbc_io_submit(io, lu->dev->can_unmap ? BDEV_UNMAP : BDEV_WRITE_ZEROES, 0, lba << lu->block_shift,
			      (uint64_t)n << lu->block_shift, NULL, 0, unmap_next);
		return;
	}
	sbc_io_finish(io);
}

static void unmap_next(struct sbc_io *io, int err)
{
	if (err < 0) {
		sbc_io_fail_errno(io, err, true);
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
	struct sbc_io *io = sbc_io_of(cmd);
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
		if (!sbc_range_ok(cmd, lba, n))
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
	if (sbc_write_begin(lu, &io->rl, io->cmd, lo, hi - lo))
		unmap_issue(io);
	return SCSI_RC_PENDING;
}

/* ---------------------------------------------------------------- */
/* GET LBA STATUS                                                    */

#define LBA_STATUS_MAPPED 0
#define LBA_STATUS_DEALLOCATED 1
#define LBA_STATUS_MAX_DESC 64

/*
 * The descriptors come from bdev_lba_status, which may block (lseek on a
 * file): they are built on an offload thread (common/offload.h) into a
 * pooled buffer, and the command completes back on its worker.
 */
struct lba_status_job {
	struct offload_job job;
	struct sbc_io *io;
	uint64_t lba;
	size_t maxd, off;
	uint8_t b[8 + 16 * LBA_STATUS_MAX_DESC];
};

static void lba_status_build(void *arg)
{
	struct lba_status_job *j = arg;
	struct scsi_lu *lu = j->io->cmd->lu;
	uint8_t *b = j->b;
	size_t off = 8;
	uint64_t cur = j->lba;

	memset(b, 0, sizeof(j->b));
	while (cur < lu->nblocks && (off - 8) / 16 < j->maxd) {
		bool mapped = true;
		int64_t len = bdev_lba_status(lu->dev, cur << lu->block_shift, &mapped);
		if (offload_closing())
			return; /* the daemon stopped while this waited: lu may be gone */
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
	j->off = off;
}

static void lba_status_done(void *arg)
{
	struct lba_status_job *j = arg;
	struct sbc_io *io = j->io;
	scsi_data_in(io->cmd, j->b, j->off, be32_get(io->cmd->cdb + 10));
	sbc_io_finish(io);
}

enum scsi_rc sbc_get_lba_status(struct scsi_cmd *cmd)
{
	struct scsi_lu *lu = cmd->lu;
	uint64_t lba = be64_get(cmd->cdb + 2);
	uint32_t alloc = be32_get(cmd->cdb + 10);

	if (lba >= lu->nblocks)
		return scsi_fail(cmd, SK_ILLEGAL_REQUEST, ASC_LBA_OUT_OF_RANGE);
	struct sbc_io *io = sbc_io_of(cmd);
	if (!sbc_io_alloc(io, sizeof(struct lba_status_job)))
		return SCSI_RC_DONE;
	struct lba_status_job *j = (struct lba_status_job *)io->buf;
	j->io = io;
	j->lba = lba;
	j->maxd = alloc > 8 ? (alloc - 8 + 15) / 16 : 1;
	if (j->maxd > LBA_STATUS_MAX_DESC)
		j->maxd = LBA_STATUS_MAX_DESC;
	offload_run(&j->job, lba_status_build, lba_status_done, j);
	return SCSI_RC_PENDING;
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
	struct sbc_io *io = sbc_io_of(cmd);
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
	if (sbc_write_begin(lu, &io->rl, io->cmd, 0, lu->nblocks))
		chunk_start(io);
	return SCSI_RC_PENDING;
}
