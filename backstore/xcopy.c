/*
 * xcopy.c - EXTENDED COPY (LID1) and RECEIVE COPY RESULTS: the copy
 * manager VMware's XCOPY (and Windows ODX-less hosts, and sg_xcopy) use to
 * clone blocks without moving them over the wire.
 *
 * Supported: identification-descriptor CSCD targets (type E4h) naming an
 * LU by its NAA designator from VPD page 83, and block-to-block segment
 * descriptors (type 02h). Targets resolve through the registry of open LUs
 * in lu.c, so a copy may go from one LU to another. Each segment is copied
 * in chunks through a pooled buffer: read from the source bdev, then write
 * to the destination through sbc_write_begin/end, so a COMPARE AND WRITE
 * on the destination stays atomic against the copy.
 *
 * The result of the last copies (by nexus and list identifier) is kept in
 * a small table for RECEIVE COPY RESULTS (COPY STATUS).
 *
 * Threading: the command runs on the submitting worker; bdev completions
 * come back there. The results table has its own mutex.
 */
#include "backstore/lu.h"

#include "common/bufpool.h"

#include <assert.h>
#include <stdlib.h>

#define XC_HDR 16
#define XC_TGT_DESC_LEN 32
#define XC_TGT_IDENT 0xe4
#define XC_SEG_B2B 0x02
#define XC_SEG_B2B_LEN 28
#define XC_MAX_TARGETS 8
#define XC_MAX_SEGMENTS 16
#define XC_MAX_LIST_LEN 1024
#define XC_MAX_SEGMENT_BYTES (16u << 20)
#define XC_CHUNK (1u << 20)
#define XC_LIST_ID_DISCARD 0x02
#define DESIG_TYPE_NAA 3


#define COPY_STATUS_GOOD 0x01
#define COPY_STATUS_ERROR 0x02

struct xcopy_io {
	struct bdev_req req;
	struct range_lock rl;
	struct scsi_cmd *cmd;
	uint8_t *param;           /* the parameter list (pooled) */
	size_t param_len;
	uint8_t *buf;             /* data chunk (pooled) */
	size_t buf_len;
	struct iovec iov;
	struct scsi_lu *src, *dst;
	uint64_t src_off, dst_off, left; /* bytes of the current segment */
	uint64_t done_blocks;
	size_t seg_off;           /* next segment descriptor in param */
	size_t seg_end;
	uint16_t segs_done;
	uint16_t ntargets;
	bool locked;
	bool held;                /* src and dst counted in their inflight */
	/* the writes into dst count as this nexus's commands on it: a
	 * PREEMPT AND ABORT there waits for them (pr.c) */
	struct nexus_lu *dst_nl;
	uint32_t dst_shift;
};

static_assert(sizeof(struct xcopy_io) <= sizeof(((struct scsi_cmd *)0)->bs_scratch),
	      "xcopy_io must fit in scsi_cmd.bs_scratch");

/* ---------------------------------------------------------------- */
/* Results of finished copies                                        */

struct copy_result {
	const struct scsi_nexus *nx;
	const struct scsi_lu *lu;
	uint8_t list_id;
	uint8_t status;
	uint16_t segs;
	uint32_t blocks;
	bool used;
};

static pthread_mutex_t results_lock = PTHREAD_MUTEX_INITIALIZER;
static struct copy_result results[32];
static unsigned results_next;

static void result_store(struct scsi_cmd *cmd, uint8_t list_id, uint8_t status, uint16_t segs,
			 uint64_t blocks)
{
	pthread_mutex_lock(&results_lock);
	struct copy_result *slot = NULL;
	for (unsigned i = 0; i < sizeof(results) / sizeof(results[0]); i++)
		if (results[i].used && results[i].nx == cmd->nexus && results[i].lu == cmd->lu &&
		    results[i].list_id == list_id)
			slot = &results[i];
	if (!slot)
		slot = &results[results_next++ % (sizeof(results) / sizeof(results[0]))];
	slot->nx = cmd->nexus;
	slot->lu = cmd->lu;
	slot->list_id = list_id;
	slot->status = status;
	slot->segs = segs;
	slot->blocks = blocks > UINT32_MAX ? UINT32_MAX : (uint32_t)blocks;
	slot->used = true;
	pthread_mutex_unlock(&results_lock);
}

/* Results are kept per I_T nexus and LU, and named by their addresses:
 * when either goes away its results must go too, or a nexus (or LU)
 * allocated later at the same address would be answered with them, e.g. a
 * COPY STATUS for a list identifier it never used. */
void xcopy_forget(const struct scsi_nexus *nx, const struct scsi_lu *lu)
{
	pthread_mutex_lock(&results_lock);
	for (unsigned i = 0; i < sizeof(results) / sizeof(results[0]); i++)
		if (results[i].used && ((nx && results[i].nx == nx) || (lu && results[i].lu == lu)))
			results[i].used = false;
	pthread_mutex_unlock(&results_lock);
}

/* ---------------------------------------------------------------- */
/* Execution                                                         */

static void xc_release(struct xcopy_io *io);

static void xc_finish(struct xcopy_io *io, bool ok)
{
	struct scsi_cmd *cmd = io->cmd;
	uint8_t list_usage = (io->param[1] >> 3) & 0x03;

	if (io->locked) {
		sbc_write_end(io->dst, &io->rl);
		io->locked = false;
	}
	if (list_usage != XC_LIST_ID_DISCARD)
		result_store(cmd, io->param[0], ok ? COPY_STATUS_GOOD : COPY_STATUS_ERROR, io->segs_done,
			     io->done_blocks);
	xc_release(io);
	buf_put(io->buf, io->buf_len);
	buf_put(io->param, io->param_len);
	scsi_cmd_complete(cmd);
}

static bool xc_owned(struct scsi_lu *lu)
{
	uint64_t gen;
	return !lu->owner || lu->owner->state(lu->dev, &gen) == BDEV_OWNER_OWNED;
}

static void xc_fail(struct xcopy_io *io, uint8_t key, uint16_t asc)
{
	scsi_fail(io->cmd, key, asc);
	xc_finish(io, false);
}

static void xc_next_segment(struct xcopy_io *io);
static void xc_read_chunk(struct xcopy_io *io);

static void xc_req_done(struct bdev_req *req, int err);

static void xc_submit(struct xcopy_io *io, struct scsi_lu *lu, enum bdev_op op, unsigned flags,
		      uint64_t off, uint64_t len)
{
	lu_copy_io(lu, &io->req, &io->iov, io->buf, op, flags, off, len, xc_req_done, io);
}

static void xc_write_resume(struct range_lock *rl)
{
	struct xcopy_io *io = (struct xcopy_io *)((char *)rl - offsetof(struct xcopy_io, rl));
	unsigned fl = atomic_load(&io->dst->wce) ? 0 : BDEV_F_FUA;
	xc_submit(io, io->dst, BDEV_WRITE, fl, io->dst_off, io->req.len);
}

static void xc_req_done(struct bdev_req *req, int err)
{
	struct xcopy_io *io = req->priv;

	if (err < 0) {
		scsi_fail_errno(io->cmd, err, req->op == BDEV_WRITE);
		/* an error while copying is reported as COPY ABORTED */
		io->cmd->sense[(io->cmd->sense[0] & 0x7f) == 0x72 ? 1 : 2] = SK_COPY_ABORTED;
		xc_finish(io, false);
		return;
	}
	if (req->op == BDEV_READ) {
		if (io->cmd->overdue) {
			/* answered while the read was out: no write behind its back */
			scsi_fail(io->cmd, SK_ABORTED_COMMAND, ASC_COMMAND_TIMEOUT_DURING_PROCESSING);
			xc_finish(io, false);
			return;
		}
		uint64_t len = req->len;
		io->locked = true;
		io->rl.resume = xc_write_resume; /* when the write waits behind a CAW */
		if (sbc_write_begin(io->dst, &io->rl, io->cmd, io->dst_off >> io->dst->block_shift,
				    len >> io->dst->block_shift)) {
			req->len = len;
			xc_write_resume(&io->rl);
		} else {
			req->len = len; /* resumed later with the same length */
		}
		return;
	}
	/* write done */
	sbc_write_end(io->dst, &io->rl);
	io->locked = false;
	io->src_off += req->len;
	io->dst_off += req->len;
	io->left -= req->len;
	io->done_blocks += req->len >> io->dst->block_shift;
	if (io->cmd->overdue) {
		/* the host was answered already: copy no more behind its back */
		scsi_fail(io->cmd, SK_ABORTED_COMMAND, ASC_COMMAND_TIMEOUT_DURING_PROCESSING);
		xc_finish(io, false);
		return;
	}
	if (io->left) {
		xc_read_chunk(io);
		return;
	}
	io->segs_done++;
	xc_next_segment(io);
}

static void xc_read_chunk(struct xcopy_io *io)
{
	uint64_t len = io->left < XC_CHUNK ? io->left : XC_CHUNK;
	xc_submit(io, io->src, BDEV_READ, 0, io->src_off, len);
}

/*
 * Resolve target descriptor idx to an LU, or NULL. Only LUs mapped in the
 * target the command came through qualify: the registry knows every open
 * LU, but an initiator reaches only what its target grants (invariant 5).
 */
static struct nexus_lu *xc_target(struct xcopy_io *io, unsigned idx)
{
	const uint8_t *t = io->param + XC_HDR + (size_t)idx * XC_TGT_DESC_LEN;
	uint8_t type = t[5] & 0x0f;
	uint8_t len = t[7];
	const struct scsi_nexus *nx = io->cmd->nexus;

	if (type != DESIG_TYPE_NAA || len > 16 || !nx)
		return NULL;
	struct scsi_lu *lu = lu_registry_find_naa(t + 8, len);
	/* the nexus's map, on its worker: an LU a reload removed is not in it */
	for (int i = 0; lu && i < nx->nlus; i++)
		if (nx->lus[i]->lu == lu)
			return nx->lus[i];
	return NULL;
}

/* The segment's source and destination count as in flight on their LUs
 * (a reload closes a removed LU only when nothing uses it). */
static void xc_hold(struct xcopy_io *io)
{
	lu_inflight_add(io->src, +1);
	lu_inflight_add(io->dst, +1);
	io->dst_shift = nexus_lu_get(io->dst_nl);
	io->held = true;
}

static void xc_release(struct xcopy_io *io)
{
	if (!io->held)
		return;
	io->held = false;
	nexus_lu_put(io->dst, io->dst_nl, io->dst_shift); /* dst still held */
	io->dst_nl = NULL;
	lu_inflight_add(io->src, -1);
	lu_inflight_add(io->dst, -1);
}

/* Reservation checks on the copy's source (read) and destination (write). */
static const struct cmd_desc xc_read_access = { .flags = CMDF_READS };
static const struct cmd_desc xc_write_access = { .flags = CMDF_WRITES };

static void xc_next_segment(struct xcopy_io *io)
{
	if (io->seg_off >= io->seg_end) {
		xc_finish(io, true);
		return;
	}
	const uint8_t *s = io->param + io->seg_off;
	uint16_t src_idx = be16_get(s + 4), dst_idx = be16_get(s + 6);
	uint32_t nblocks = be16_get(s + 10);
	uint64_t src_lba = be64_get(s + 12), dst_lba = be64_get(s + 20);

	io->seg_off += XC_SEG_B2B_LEN;
	if (src_idx >= io->ntargets || dst_idx >= io->ntargets) {
		xc_fail(io, SK_COPY_ABORTED, ASC_COPY_TARGET_DEVICE_NOT_REACHABLE);
		return;
	}
	xc_release(io);
	struct nexus_lu *src_nl = xc_target(io, src_idx);
	io->dst_nl = xc_target(io, dst_idx);
	io->src = src_nl ? src_nl->lu : NULL;
	io->dst = io->dst_nl ? io->dst_nl->lu : NULL;
	if (!io->src || !io->dst) {
		xc_fail(io, SK_COPY_ABORTED, ASC_COPY_TARGET_DEVICE_NOT_REACHABLE);
		return;
	}
	xc_hold(io);
	/* An LU over a shared backing store is read or written only while
	 * this gateway owns it (lu_dispatch.c checks the LU the command came
	 * to, not the copy's targets); else the copy target is unreachable
	 * from here and the host falls back to reads and writes on its own
	 * paths. */
	if (!xc_owned(io->src) || !xc_owned(io->dst)) {
		xc_fail(io, SK_COPY_ABORTED, ASC_COPY_TARGET_DEVICE_NOT_REACHABLE);
		return;
	}
	/* a copy's other LU is checked against its reservations only on a copy
	 * of them known to be the cluster's latest (as lu_dispatch.c does for
	 * the LU the command came to) */
	if ((io->src->prs && !pr_shared_synced(io->src)) || (io->dst->prs && !pr_shared_synced(io->dst))) {
		xc_fail(io, SK_COPY_ABORTED, ASC_COPY_TARGET_DEVICE_NOT_REACHABLE);
		return;
	}
	if (pr_conflicts_lu(io->src, io->cmd->nexus, &xc_read_access) ||
	    pr_conflicts_lu(io->dst, io->cmd->nexus, &xc_write_access)) {
		io->cmd->status = SAM_STAT_RESERVATION_CONFLICT;
		xc_finish(io, false);
		return;
	}
	if (io->dst->read_only || atomic_load(&io->dst->swp)) {
		xc_fail(io, SK_DATA_PROTECT, ASC_WRITE_PROTECTED);
		return;
	}
	if (io->src->block_size != io->dst->block_size) {
		xc_fail(io, SK_COPY_ABORTED, ASC_UNREACHABLE_COPY_TARGET);
		return;
	}
	if (src_lba > io->src->nblocks || nblocks > io->src->nblocks - src_lba ||
	    dst_lba > io->dst->nblocks || nblocks > io->dst->nblocks - dst_lba) {
		xc_fail(io, SK_COPY_ABORTED, ASC_NO_ADDITIONAL_SENSE);
		return;
	}
	io->src_off = src_lba << io->src->block_shift;
	io->dst_off = dst_lba << io->dst->block_shift;
	io->left = (uint64_t)nblocks << io->src->block_shift;
	if (!io->left) {
		io->segs_done++;
		xc_next_segment(io);
		return;
	}
	xc_read_chunk(io);
}

/* ---------------------------------------------------------------- */
/* EXTENDED COPY: validate the parameter list, then run it            */

enum scsi_rc xcopy_extended_copy(struct scsi_cmd *cmd)
{
	struct xcopy_io *io = (struct xcopy_io *)cmd->bs_scratch;
	uint32_t plen = be32_get(cmd->cdb + 10);

	memset(io, 0, sizeof(*io));
	io->cmd = cmd;
	cmd->cdb_xfer_len = plen;
	if (plen == 0)
		return SCSI_RC_DONE;
	if (plen < XC_HDR || cmd->write_len < plen)
		return scsi_fail(cmd, SK_ILLEGAL_REQUEST, ASC_PARAM_LIST_LENGTH_ERROR);
	if (plen > XC_HDR + XC_MAX_LIST_LEN + XC_SEG_B2B_LEN * 4)
		return scsi_fail(cmd, SK_ILLEGAL_REQUEST, ASC_PARAM_LIST_LENGTH_ERROR);
	io->param = buf_get(plen);
	io->buf = buf_get(XC_CHUNK);
	if (!io->param || !io->buf) {
		buf_put(io->param, plen);
		buf_put(io->buf, XC_CHUNK);
		return scsi_fail(cmd, SK_HARDWARE_ERROR, ASC_INTERNAL_TARGET_FAILURE);
	}
	io->param_len = plen;
	io->buf_len = XC_CHUNK;
	scsi_data_out(cmd, 0, io->param, plen);

	const uint8_t *p = io->param;
	uint32_t tdl = be16_get(p + 2);
	uint32_t sdl = be32_get(p + 8);
	uint32_t inl = be32_get(p + 12);
	uint8_t list_usage = (p[1] >> 3) & 0x03;

	if (list_usage == 0x03 && p[0] != 0) { /* list id must be zero */
		scsi_fail_param(cmd, 0, -1);
		goto fail;
	}
	if (p[1] & 0x20) { /* STR: no stream devices */
		scsi_fail_param(cmd, 1, 5);
		goto fail;
	}
	if (inl) {
		scsi_fail_param(cmd, 12, -1);
		goto fail;
	}
	if ((uint64_t)tdl + sdl > XC_MAX_LIST_LEN || (uint64_t)XC_HDR + tdl + sdl > plen) {
		scsi_fail(cmd, SK_ILLEGAL_REQUEST, ASC_PARAM_LIST_LENGTH_ERROR);
		goto fail;
	}
	if (tdl % XC_TGT_DESC_LEN) {
		scsi_fail(cmd, SK_ILLEGAL_REQUEST, ASC_PARAM_LIST_LENGTH_ERROR);
		goto fail;
	}
	if (tdl / XC_TGT_DESC_LEN > XC_MAX_TARGETS) {
		scsi_fail(cmd, SK_ILLEGAL_REQUEST, ASC_TOO_MANY_TARGET_DESCRIPTORS);
		goto fail;
	}
	io->ntargets = (uint16_t)(tdl / XC_TGT_DESC_LEN);
	for (unsigned i = 0; i < io->ntargets; i++) {
		if (p[XC_HDR + i * XC_TGT_DESC_LEN] != XC_TGT_IDENT) {
			scsi_fail(cmd, SK_ILLEGAL_REQUEST, ASC_UNSUPPORTED_TARGET_DESC_TYPE);
			goto fail;
		}
	}
	/* segments: walk by their own length fields */
	size_t off = XC_HDR + tdl, end = XC_HDR + (size_t)tdl + sdl;
	unsigned nseg = 0;
	while (off < end) {
		if (off + 4 > end) {
			scsi_fail(cmd, SK_ILLEGAL_REQUEST, ASC_PARAM_LIST_LENGTH_ERROR);
			goto fail;
		}
		if (p[off] != XC_SEG_B2B) {
			scsi_fail(cmd, SK_ILLEGAL_REQUEST, ASC_UNSUPPORTED_SEGMENT_DESC_TYPE);
			goto fail;
		}
		size_t dl = (size_t)be16_get(p + off + 2) + 4;
		if (dl != XC_SEG_B2B_LEN || off + dl > end) {
			scsi_fail(cmd, SK_ILLEGAL_REQUEST, ASC_PARAM_LIST_LENGTH_ERROR);
			goto fail;
		}
		if (++nseg > XC_MAX_SEGMENTS) {
			scsi_fail(cmd, SK_ILLEGAL_REQUEST, ASC_TOO_MANY_SEGMENT_DESCRIPTORS);
			goto fail;
		}
		off += dl;
	}
	io->seg_off = XC_HDR + tdl;
	io->seg_end = end;
	/* the segments run from here, and complete the command once */
	xc_next_segment(io);
	return SCSI_RC_PENDING;
fail:
	buf_put(io->param, io->param_len);
	buf_put(io->buf, io->buf_len);
	return SCSI_RC_DONE;
}

/* ---------------------------------------------------------------- */
/* RECEIVE COPY RESULTS                                              */

enum scsi_rc xcopy_receive_copy_results(struct scsi_cmd *cmd)
{
	uint8_t sa = cmd->cdb[1] & 0x1f;
	uint8_t list_id = cmd->cdb[2];
	uint32_t alloc = be32_get(cmd->cdb + 10);
	uint8_t b[64];
	size_t len;

	memset(b, 0, sizeof(b));
	if (sa == RCR_OPERATING_PARAMETERS) {
		len = 44 + 2;
		be32_put(b, (uint32_t)(len - 4));
		b[4] = 0x01; /* SNLID: list id usage supported */
		be16_put(b + 8, XC_MAX_TARGETS);
		be16_put(b + 10, XC_MAX_SEGMENTS);
		be32_put(b + 12, XC_MAX_LIST_LEN);
		be32_put(b + 16, XC_MAX_SEGMENT_BYTES);
		be32_put(b + 20, 0);   /* no inline data */
		be32_put(b + 24, 0);   /* no held data */
		be32_put(b + 28, 0);
		be16_put(b + 34, 1);   /* total concurrent copies */
		b[36] = 1;
		b[37] = 9;             /* data segment granularity: 512 bytes (log2) */
		b[43] = 2;
		b[44] = XC_SEG_B2B;
		b[45] = XC_TGT_IDENT;
	} else {
		struct copy_result r = { 0 };
		bool found = false;
		pthread_mutex_lock(&results_lock);
		for (unsigned i = 0; i < sizeof(results) / sizeof(results[0]); i++)
			if (results[i].used && results[i].nx == cmd->nexus && results[i].lu == cmd->lu &&
			    results[i].list_id == list_id) {
				r = results[i];
				found = true;
			}
		pthread_mutex_unlock(&results_lock);
		if (!found)
			return scsi_fail_cdb(cmd, 2, -1);
		len = 12;
		be32_put(b, 8);
		b[4] = r.status;
		be16_put(b + 5, r.segs);
		b[7] = 0x01; /* transfer count units: KiB */
		be32_put(b + 8, (uint32_t)(((uint64_t)r.blocks * cmd->lu->block_size) >> 10));
	}
	scsi_data_in(cmd, b, len, alloc);
	return SCSI_RC_DONE;
}
