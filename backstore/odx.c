/*
 * odx.c - token-based offloaded data transfer (ODX: SBC-3 POPULATE TOKEN,
 * WRITE USING TOKEN, SPC-4 RECEIVE ROD TOKEN INFORMATION), what Windows
 * and Hyper-V use to copy files and clone disks inside the array.
 *
 * A token is a point-in-time view of its source ranges, of ROD type
 * "point in time copy, change vulnerable" (00800001h): any write that
 * reaches one of its ranges after it was made (a WRITE, WRITE SAME,
 * UNMAP, COMPARE AND WRITE, EXTENDED COPY or WRITE USING TOKEN landing
 * there, seen where every write takes its range in sbc.c, at its start
 * and at its end) cancels it. A WRITE USING TOKEN checks the token
 * before it copies and again after the last chunk: one cancelled
 * meanwhile fails with INVALID TOKEN OPERATION, TOKEN CANCELLED, and the
 * host (Windows falls back on any error) copies the normal way. So a copy
 * that succeeds holds exactly the source as it was when the token was
 * made. On a shared backing store (RBD with several gateways) another
 * gateway's writes are not seen here: a change of owner cancels every
 * token of the LU, and a copy checks both LUs are still ours per chunk.
 *
 * A token is 512 bytes: its type and length, a serial, the creator LU's
 * NAA designator, the bytes it represents, and 352 random bytes (the
 * secret that names it; a token is found by its serial and matched on
 * all 512 bytes). Tokens live in one table of ODX_MAX_TOKENS; one lives
 * until its inactivity timeout (60 s unless POPULATE TOKEN asks for up
 * to 600) passes without use, ODX_MAX_LIFETIME_S at most, or until its
 * source LU closes; WRITE USING TOKEN with DEL_TKN ends it.
 * A token is used only through a nexus that reaches its source LU
 * (mapped in the same target: that target's ACL let the nexus in) and
 * that the source's reservation lets read. The well-known zero token
 * (FFFF0001h) writes zeroes.
 *
 * Copies run on the command's worker, one ODX_CHUNK at a time: read from
 * the source LU's device (the cache volume when cached: dirty data comes
 * from the legs) and written to the destination through sbc_write_begin
 * and the device, as EXTENDED COPY does, so a COMPARE AND WRITE stays
 * atomic against them and other commands interleave with the chunks.
 *
 * The last results per (nexus, LU, list identifier) are kept for
 * RECEIVE ROD TOKEN INFORMATION, which is how the host gets the token.
 *
 * Threading: commands on their worker; the token and result tables under
 * odx_lock; lu->odx_tokens (tokens whose source is lu) lets every write
 * skip the lock while an LU has none.
 */
#include "backstore/lu.h"

#include "common/bufpool.h"
#include "common/log.h"
#include "common/worker.h"

#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <stdlib.h>
#include <sys/random.h>

#define ODX_SA_POPULATE 0x10
#define ODX_SA_WRITE_USING 0x11
#define ODX_MAX_TOKENS 128
#define ODX_MAX_RESULTS 64
#define ODX_MAX_RANGES 64
#define ODX_DEFAULT_INACTIVITY_S 60
#define ODX_MAX_INACTIVITY_S 600
#define ODX_MAX_LIFETIME_S 3600
#define ODX_MAX_TOKEN_BYTES (1ull << 30)    /* bytes one token may represent */
#define ODX_OPTIMAL_BYTES (64ull << 20)     /* what a host should ask per token */
#define ODX_CHUNK (1u << 20)
#define ODX_ROD_LEN 512
#define ODX_ROD_TYPE_PIT_VULNERABLE 0x00800001u
#define ODX_ROD_TYPE_PIT_DEFAULT 0x00800000u
#define ODX_ROD_TYPE_ZERO 0xffff0001u
#define ODX_PT_HDR 16
#define ODX_WUT_HDR 536
#define ODX_RANGE_LEN 16

/* copy operation status (RECEIVE ROD TOKEN INFORMATION) */
#define ODX_ST_GOOD 0x01
#define ODX_ST_ERROR 0x02
#define ODX_ST_PARTIAL_ROD 0x03  /* done, not all of the token used */
#define ODX_ST_RESIDUAL 0x04     /* done, the token held less than asked */

#define ASC_INVALID_TOKEN_OP 0x2300
#define ASC_UNSUPPORTED_TOKEN_TYPE 0x2301
#define ASC_TOKEN_UNKNOWN 0x2304
#define ASC_TOKEN_EXPIRED 0x2307
#define ASC_TOKEN_CANCELLED 0x2308
#define ASC_INVALID_TOKEN_LENGTH 0x230a
#define ASC_NO_ROD_TOKEN_RESOURCES 0x550d

struct odx_range {
	uint64_t lba;
	uint32_t n;
};

struct odx_token {
	bool used;
	bool valid;                 /* no write has reached its ranges */
	bool counted;               /* in src->odx_tokens: while valid */
	uint8_t rod[ODX_ROD_LEN];
	uint64_t serial;
	struct scsi_lu *src;
	uint32_t nranges;
	struct odx_range ranges[ODX_MAX_RANGES];
	uint64_t blocks;
	uint64_t born_ms, used_ms;
	uint32_t inactivity_s;
};

struct odx_result {
	bool used;
	const struct scsi_nexus *nx;
	const struct scsi_lu *lu;
	uint32_t list_id;
	uint8_t sa;                 /* the command's service action */
	uint8_t status;
	uint64_t blocks;            /* transfer count */
	bool has_token;
	uint8_t rod[ODX_ROD_LEN];
	uint8_t sense_len;
	uint8_t sense[SCSI_SENSE_MAX];
};

static pthread_mutex_t odx_lock = PTHREAD_MUTEX_INITIALIZER;
static struct odx_token tokens[ODX_MAX_TOKENS];
static struct odx_result results[ODX_MAX_RESULTS];
static unsigned results_next;
static uint64_t serial_next = 1;

/* ---------------------------------------------------------------- */
/* Tokens and results (under odx_lock)                               */

/* A cancelled token needs no more news of writes: its LU's writes stop
 * taking the lock for it. */
static void token_uncount_locked(struct odx_token *t)
{
	t->valid = false;
	if (t->counted) {
		t->counted = false;
		atomic_fetch_sub(&t->src->odx_tokens, 1);
	}
}

static void token_drop_locked(struct odx_token *t)
{
	if (!t->used)
		return;
	token_uncount_locked(t);
	OPENSSL_cleanse(t->rod, sizeof(t->rod));
	t->used = false;
}

static bool token_expired(const struct odx_token *t, uint64_t now)
{
	if (now < t->used_ms)
		return false; /* used since the caller read the clock */
	return now - t->used_ms >= (uint64_t)t->inactivity_s * 1000 ||
	       now - t->born_ms >= (uint64_t)ODX_MAX_LIFETIME_S * 1000;
}

static void result_store(const struct scsi_cmd *cmd, uint32_t list_id, uint8_t sa, uint8_t status,
			 uint64_t blocks, const uint8_t *rod)
{
	pthread_mutex_lock(&odx_lock);
	struct odx_result *r = NULL;
	for (unsigned i = 0; i < ODX_MAX_RESULTS && !r; i++)
		if (results[i].used && results[i].nx == cmd->nexus && results[i].lu == cmd->lu &&
		    results[i].list_id == list_id)
			r = &results[i];
	if (!r)
		r = &results[results_next++ % ODX_MAX_RESULTS];
	memset(r, 0, sizeof(*r));
	r->used = true;
	r->nx = cmd->nexus;
	r->lu = cmd->lu;
	r->list_id = list_id;
	r->sa = sa;
	r->status = status;
	r->blocks = blocks;
	if (rod) {
		r->has_token = true;
		memcpy(r->rod, rod, ODX_ROD_LEN);
	}
	if (cmd->status == SAM_STAT_CHECK_CONDITION && cmd->sense_len) {
		r->sense_len = (uint8_t)(cmd->sense_len < sizeof(r->sense) ? cmd->sense_len : sizeof(r->sense));
		memcpy(r->sense, cmd->sense, r->sense_len);
	}
	pthread_mutex_unlock(&odx_lock);
}

void odx_forget(const struct scsi_nexus *nx, const struct scsi_lu *lu)
{
	pthread_mutex_lock(&odx_lock);
	for (unsigned i = 0; i < ODX_MAX_RESULTS; i++)
		if (results[i].used && ((nx && results[i].nx == nx) || (lu && results[i].lu == lu))) {
			OPENSSL_cleanse(results[i].rod, sizeof(results[i].rod));
			results[i].used = false;
		}
	for (unsigned i = 0; lu && i < ODX_MAX_TOKENS; i++)
		if (tokens[i].used && tokens[i].src == lu)
			token_drop_locked(&tokens[i]);
	pthread_mutex_unlock(&odx_lock);
}

void odx_cancel_lu(struct scsi_lu *lu)
{
	pthread_mutex_lock(&odx_lock);
	for (unsigned i = 0; i < ODX_MAX_TOKENS; i++)
		if (tokens[i].used && tokens[i].src == lu)
			token_uncount_locked(&tokens[i]);
	pthread_mutex_unlock(&odx_lock);
}

void odx_write_seen(struct scsi_lu *lu, uint64_t lba, uint64_t nblocks)
{
	pthread_mutex_lock(&odx_lock);
	for (unsigned i = 0; i < ODX_MAX_TOKENS; i++) {
		struct odx_token *t = &tokens[i];
		if (!t->used || !t->valid || t->src != lu)
			continue;
		for (uint32_t k = 0; k < t->nranges; k++)
			if (lba < t->ranges[k].lba + t->ranges[k].n && t->ranges[k].lba < lba + nblocks) {
				token_uncount_locked(t);
				break;
			}
	}
	pthread_mutex_unlock(&odx_lock);
}

/* ---------------------------------------------------------------- */
/* POPULATE TOKEN                                                    */

static void build_rod(struct odx_token *t, const struct scsi_lu *lu)
{
	uint8_t *r = t->rod;
	memset(r, 0, ODX_ROD_LEN);
	be32_put(r, ODX_ROD_TYPE_PIT_VULNERABLE);
	be16_put(r + 6, ODX_ROD_LEN - 8);
	be64_put(r + 8, t->serial);
	/* creator LU: an identification CSCD descriptor (E4h) with its NAA */
	r[16] = 0xe4;
	r[20] = 0x01;           /* code set binary */
	r[21] = 0x03;           /* association LU, type NAA */
	r[23] = sizeof(lu->naa);
	memcpy(r + 24, lu->naa, sizeof(lu->naa));
	r[45] = (uint8_t)(lu->block_size >> 16);
	r[46] = (uint8_t)(lu->block_size >> 8);
	r[47] = (uint8_t)lu->block_size;
	be64_put(r + 56, t->blocks << lu->block_shift); /* bytes represented */
	be32_put(r + 96, lu->block_size);
	/* the secret: 352 random bytes */
	if (RAND_bytes(r + 160, ODX_ROD_LEN - 160) != 1)
		getrandom(r + 160, ODX_ROD_LEN - 160, 0);
}

/* Parse and check n range descriptors at p against lu: 0, or a failure
 * already set on cmd (param_off: where the list starts in the parameter
 * data, for the sense pointer). */
static int parse_ranges(struct scsi_cmd *cmd, struct scsi_lu *lu, const uint8_t *p, uint32_t n,
			struct odx_range *out, uint64_t *total, bool no_overlap)
{
	*total = 0;
	for (uint32_t i = 0; i < n; i++) {
		const uint8_t *d = p + (size_t)i * ODX_RANGE_LEN;
		out[i].lba = be64_get(d);
		out[i].n = be32_get(d + 8);
		if (out[i].lba > lu->nblocks || out[i].n > lu->nblocks - out[i].lba) {
			scsi_fail(cmd, SK_ILLEGAL_REQUEST, ASC_LBA_OUT_OF_RANGE);
			return -1;
		}
		*total += out[i].n;
		for (uint32_t k = 0; no_overlap && k < i; k++)
			if (out[i].n && out[k].n && out[i].lba < out[k].lba + out[k].n &&
			    out[k].lba < out[i].lba + out[i].n) {
				scsi_fail(cmd, SK_ILLEGAL_REQUEST, ASC_INVALID_FIELD_IN_PARAM_LIST);
				return -1;
			}
	}
	return 0;
}

enum scsi_rc odx_populate_token(struct scsi_cmd *cmd)
{
	struct scsi_lu *lu = cmd->lu;
	uint32_t list_id = be32_get(cmd->cdb + 6);
	uint32_t plen = be32_get(cmd->cdb + 10);
	uint8_t p[ODX_PT_HDR + ODX_MAX_RANGES * ODX_RANGE_LEN];
	struct odx_range ranges[ODX_MAX_RANGES];

	cmd->cdb_xfer_len = plen;
	if (plen == 0)
		return SCSI_RC_DONE;
	if (plen < ODX_PT_HDR || cmd->write_len < plen)
		return scsi_fail(cmd, SK_ILLEGAL_REQUEST, ASC_PARAM_LIST_LENGTH_ERROR);
	size_t take = plen < sizeof(p) ? plen : sizeof(p);
	memset(p, 0, sizeof(p));
	scsi_data_out(cmd, 0, p, take);

	uint32_t timeout = be32_get(p + 4);
	uint32_t rdl = be16_get(p + 14);
	if ((p[2] & 0x02) && be32_get(p + 8) != ODX_ROD_TYPE_PIT_VULNERABLE &&
	    be32_get(p + 8) != ODX_ROD_TYPE_PIT_DEFAULT)
		return scsi_fail_param(cmd, 8, -1); /* RTV with a ROD type we do not make */
	if (timeout > ODX_MAX_INACTIVITY_S)
		return scsi_fail_param(cmd, 4, -1);
	if (rdl == 0 || rdl % ODX_RANGE_LEN || rdl / ODX_RANGE_LEN > ODX_MAX_RANGES)
		return scsi_fail_param(cmd, 14, -1);
	if ((uint64_t)ODX_PT_HDR + rdl > plen)
		return scsi_fail(cmd, SK_ILLEGAL_REQUEST, ASC_PARAM_LIST_LENGTH_ERROR);
	uint32_t n = rdl / ODX_RANGE_LEN;
	uint64_t blocks;
	if (parse_ranges(cmd, lu, p + ODX_PT_HDR, n, ranges, &blocks, true) < 0)
		return SCSI_RC_DONE;
	if (blocks == 0 || (blocks << lu->block_shift) > ODX_MAX_TOKEN_BYTES)
		return scsi_fail_param(cmd, 14, -1);

	uint64_t now = now_ms();
	uint8_t rod[ODX_ROD_LEN];
	pthread_mutex_lock(&odx_lock);
	struct odx_token *t = NULL;
	for (unsigned i = 0; i < ODX_MAX_TOKENS; i++) {
		if (tokens[i].used && token_expired(&tokens[i], now))
			token_drop_locked(&tokens[i]);
		if (!tokens[i].used && !t)
			t = &tokens[i];
	}
	if (t) {
		memset(t, 0, sizeof(*t));
		t->used = true;
		t->valid = true;
		t->counted = true;
		t->serial = serial_next++;
		t->src = lu;
		t->nranges = n;
		memcpy(t->ranges, ranges, n * sizeof(ranges[0]));
		t->blocks = blocks;
		t->born_ms = t->used_ms = now;
		t->inactivity_s = timeout ? timeout : ODX_DEFAULT_INACTIVITY_S;
		build_rod(t, lu);
		memcpy(rod, t->rod, sizeof(rod));
		/* before the lock goes: a write that reads 0 here has not
		 * started, and one that started sees the token at its end */
		atomic_fetch_add(&lu->odx_tokens, 1);
	}
	pthread_mutex_unlock(&odx_lock);
	if (!t) {
		scsi_fail(cmd, SK_ILLEGAL_REQUEST, ASC_NO_ROD_TOKEN_RESOURCES);
		result_store(cmd, list_id, ODX_SA_POPULATE, ODX_ST_ERROR, 0, NULL);
		return SCSI_RC_DONE;
	}
	result_store(cmd, list_id, ODX_SA_POPULATE, ODX_ST_GOOD, blocks, rod);
	OPENSSL_cleanse(rod, sizeof(rod));
	return SCSI_RC_DONE;
}

/* ---------------------------------------------------------------- */
/* WRITE USING TOKEN                                                 */

struct odx_job {
	struct bdev_req req;
	struct range_lock rl;
	struct scsi_cmd *cmd;
	struct scsi_lu *src, *dst;  /* src NULL: the zero token */
	uint64_t serial;            /* the token's, to check it again at the end */
	uint8_t *buf;
	struct iovec iov;
	uint32_t list_id;
	bool del_tkn;
	bool locked;
	uint8_t done_status;        /* ODX_ST_* when all went well */
	uint32_t ns, nd, si, di;
	uint64_t s_off, d_off;      /* blocks into src[si], dst[di] */
	uint64_t left, done;        /* blocks */
	struct odx_range s[ODX_MAX_RANGES], d[ODX_MAX_RANGES];
};

static bool lu_owned_here(struct scsi_lu *lu)
{
	uint64_t gen;
	return !lu->owner || lu->owner->state(lu->dev, &gen) == BDEV_OWNER_OWNED;
}

static void job_chunk(struct odx_job *j);

static void job_finish(struct odx_job *j, bool ok)
{
	struct scsi_cmd *cmd = j->cmd;
	if (j->locked) {
		sbc_write_end(j->dst, &j->rl);
		j->locked = false;
	}
	if (ok && j->src) {
		/* the token must still stand for what was read: a write that
		 * reached its ranges while the copy ran cancels the copy too */
		pthread_mutex_lock(&odx_lock);
		bool valid = false;
		for (unsigned i = 0; i < ODX_MAX_TOKENS; i++)
			if (tokens[i].used && tokens[i].serial == j->serial) {
				valid = tokens[i].valid;
				tokens[i].used_ms = now_ms();
				if (j->del_tkn)
					token_drop_locked(&tokens[i]);
				break;
			}
		pthread_mutex_unlock(&odx_lock);
		if (!valid) {
			scsi_fail(cmd, SK_ILLEGAL_REQUEST, ASC_TOKEN_CANCELLED);
			ok = false;
		}
	}
	result_store(cmd, j->list_id, ODX_SA_WRITE_USING, ok ? j->done_status : ODX_ST_ERROR, j->done, NULL);
	if (j->src)
		lu_inflight_add(j->src, -1);
	buf_put(j->buf, ODX_CHUNK);
	free(j);
	scsi_cmd_complete(cmd);
}

static void job_req_done(struct bdev_req *req, int err);

static void job_submit(struct odx_job *j, struct scsi_lu *lu, enum bdev_op op, unsigned flags, uint64_t off,
		       uint64_t len)
{
	lu_copy_io(lu, &j->req, &j->iov, j->buf, op, flags, off, len, job_req_done, j);
}

static void job_write(struct range_lock *rl)
{
	struct odx_job *j = (struct odx_job *)((char *)rl - offsetof(struct odx_job, rl));
	unsigned fl = atomic_load(&j->dst->wce) ? 0 : BDEV_F_FUA;
	job_submit(j, j->dst, BDEV_WRITE, fl, (j->d[j->di].lba + j->d_off) << j->dst->block_shift, j->req.len);
}

/* The chunk is in the buffer (read, or zeroes): write it under the range lock. */
static void job_have_chunk(struct odx_job *j, uint64_t len)
{
	j->locked = true;
	j->req.len = len;
	j->rl.resume = job_write;
	if (sbc_write_begin(j->dst, &j->rl, j->cmd, j->d[j->di].lba + j->d_off, len >> j->dst->block_shift))
		job_write(&j->rl);
}

static void job_req_done(struct bdev_req *req, int err)
{
	struct odx_job *j = req->priv;

	if (err < 0) {
		scsi_fail_errno(j->cmd, err, req->op == BDEV_WRITE);
		job_finish(j, false);
		return;
	}
	if (req->op == BDEV_READ) {
		if (j->cmd->overdue) {
			/* answered already while the read was out: writing it
			 * now could land over the host's own rewrite */
			scsi_fail(j->cmd, SK_ABORTED_COMMAND, ASC_COMMAND_TIMEOUT_DURING_PROCESSING);
			job_finish(j, false);
			return;
		}
		job_have_chunk(j, req->len);
		return;
	}
	sbc_write_end(j->dst, &j->rl);
	j->locked = false;
	uint64_t nb = req->len >> j->dst->block_shift;
	j->done += nb;
	j->left -= nb;
	j->d_off += nb;
	if (j->d_off == j->d[j->di].n) {
		j->di++;
		j->d_off = 0;
	}
	if (j->src) {
		j->s_off += nb;
		if (j->s_off == j->s[j->si].n) {
			j->si++;
			j->s_off = 0;
		}
	}
	if (j->cmd->overdue) {
		scsi_fail(j->cmd, SK_ABORTED_COMMAND, ASC_COMMAND_TIMEOUT_DURING_PROCESSING);
		job_finish(j, false);
		return;
	}
	job_chunk(j);
}

static void job_chunk(struct odx_job *j)
{
	/* empty ranges carry nothing */
	while (j->di < j->nd && j->d[j->di].n == 0)
		j->di++;
	while (j->src && j->si < j->ns && j->s[j->si].n == 0)
		j->si++;
	if (!j->left || j->di >= j->nd || (j->src && j->si >= j->ns)) {
		job_finish(j, true);
		return;
	}
	/* a shared store's other gateway may have taken either LU meanwhile */
	if ((j->src && !lu_owned_here(j->src)) || !lu_owned_here(j->dst)) {
		scsi_fail(j->cmd, SK_COPY_ABORTED, ASC_COPY_TARGET_DEVICE_NOT_REACHABLE);
		job_finish(j, false);
		return;
	}
	uint64_t nb = ODX_CHUNK >> j->dst->block_shift;
	if (nb > j->left)
		nb = j->left;
	if (nb > j->d[j->di].n - j->d_off)
		nb = j->d[j->di].n - j->d_off;
	if (j->src && nb > j->s[j->si].n - j->s_off)
		nb = j->s[j->si].n - j->s_off;
	if (!j->src) {
		job_have_chunk(j, nb << j->dst->block_shift);
		return;
	}
	job_submit(j, j->src, BDEV_READ, 0, (j->s[j->si].lba + j->s_off) << j->src->block_shift,
		   nb << j->src->block_shift);
}

/* The nexus reaches lu: it is mapped in the target the nexus logged in to. */
static bool nexus_reaches(const struct scsi_nexus *nx, const struct scsi_lu *lu)
{
	for (int i = 0; nx && i < nx->nlus; i++)
		if (nx->lus[i]->lu == lu)
			return true;
	return false;
}

static const struct cmd_desc odx_read_access = { .flags = CMDF_READS };

enum scsi_rc odx_write_using_token(struct scsi_cmd *cmd)
{
	struct scsi_lu *lu = cmd->lu;
	uint32_t list_id = be32_get(cmd->cdb + 6);
	uint32_t plen = be32_get(cmd->cdb + 10);
	uint8_t hdr[ODX_WUT_HDR];

	cmd->cdb_xfer_len = plen;
	if (plen == 0)
		return SCSI_RC_DONE;
	if (plen < ODX_WUT_HDR + ODX_RANGE_LEN || cmd->write_len < plen)
		return scsi_fail(cmd, SK_ILLEGAL_REQUEST, ASC_PARAM_LIST_LENGTH_ERROR);
	scsi_data_out(cmd, 0, hdr, sizeof(hdr));
	uint32_t rdl = be16_get(hdr + 534);
	if (rdl == 0 || rdl % ODX_RANGE_LEN || rdl / ODX_RANGE_LEN > ODX_MAX_RANGES)
		return scsi_fail_param(cmd, 534, -1);
	if ((uint64_t)ODX_WUT_HDR + rdl > plen)
		return scsi_fail(cmd, SK_ILLEGAL_REQUEST, ASC_PARAM_LIST_LENGTH_ERROR);

	struct odx_job *j = calloc(1, sizeof(*j));
	if (!j)
		return scsi_fail(cmd, SK_HARDWARE_ERROR, ASC_INTERNAL_TARGET_FAILURE);
	j->cmd = cmd;
	j->dst = lu;
	j->list_id = list_id;
	j->del_tkn = hdr[2] & 0x02;
	j->done_status = ODX_ST_GOOD;
	uint8_t ranges_raw[ODX_MAX_RANGES * ODX_RANGE_LEN];
	scsi_data_out(cmd, ODX_WUT_HDR, ranges_raw, rdl);
	j->nd = rdl / ODX_RANGE_LEN;
	uint64_t want;
	if (parse_ranges(cmd, lu, ranges_raw, j->nd, j->d, &want, false) < 0)
		goto fail;

	const uint8_t *rod = hdr + 16;
	uint32_t type = be32_get(rod);
	uint64_t offset = be64_get(hdr + 8); /* into the ROD, in blocks */
	if (type == ODX_ROD_TYPE_ZERO) {
		j->left = want;
	} else {
		if (type != ODX_ROD_TYPE_PIT_VULNERABLE) {
			scsi_fail(cmd, SK_ILLEGAL_REQUEST, ASC_UNSUPPORTED_TOKEN_TYPE);
			goto fail;
		}
		if (be16_get(rod + 6) != ODX_ROD_LEN - 8) {
			scsi_fail(cmd, SK_ILLEGAL_REQUEST, ASC_INVALID_TOKEN_LENGTH);
			goto fail;
		}
		uint64_t serial = be64_get(rod + 8), now = now_ms();
		uint16_t why = 0;
		pthread_mutex_lock(&odx_lock);
		struct odx_token *t = NULL;
		for (unsigned i = 0; i < ODX_MAX_TOKENS && !t; i++)
			if (tokens[i].used && tokens[i].serial == serial &&
			    !CRYPTO_memcmp(tokens[i].rod, rod, ODX_ROD_LEN))
				t = &tokens[i];
		if (!t)
			why = ASC_TOKEN_UNKNOWN;
		else if (token_expired(t, now))
			why = ASC_TOKEN_EXPIRED;
		else if (!t->valid)
			why = ASC_TOKEN_CANCELLED;
		else if (!nexus_reaches(cmd->nexus, t->src))
			why = ASC_INVALID_TOKEN_OP; /* its LU is not this nexus's to read */
		if (t && why == ASC_TOKEN_EXPIRED)
			token_drop_locked(t);
		if (!why) {
			t->used_ms = now;
			j->src = t->src;
			j->serial = t->serial;
			j->ns = t->nranges;
			memcpy(j->s, t->ranges, t->nranges * sizeof(t->ranges[0]));
			lu_inflight_add(j->src, +1); /* a reload closes it only after the copy */
			if (offset > t->blocks)
				offset = t->blocks;
			uint64_t avail = t->blocks - offset;
			j->left = want < avail ? want : avail;
			j->done_status = want > avail ? ODX_ST_RESIDUAL : want < avail ? ODX_ST_PARTIAL_ROD : ODX_ST_GOOD;
		}
		pthread_mutex_unlock(&odx_lock);
		if (why) {
			if (why == ASC_INVALID_TOKEN_OP)
				log_info("lun \"%s\": WRITE USING TOKEN from %s refused: the token's LU is not in its target",
					 lu->name, cmd->nexus ? cmd->nexus->initiator_name : "?");
			scsi_fail(cmd, SK_ILLEGAL_REQUEST, why);
			goto fail;
		}
		if (j->src->prs && !pr_shared_synced(j->src)) {
			/* its reservations are checked only on a copy known to be the latest */
			scsi_fail(cmd, SK_COPY_ABORTED, ASC_COPY_TARGET_DEVICE_NOT_REACHABLE);
			goto fail;
		}
		if (pr_conflicts_lu(j->src, cmd->nexus, &odx_read_access)) {
			cmd->status = SAM_STAT_RESERVATION_CONFLICT;
			goto fail;
		}
		if (!lu_owned_here(j->src) || !lu_owned_here(lu)) {
			scsi_fail(cmd, SK_COPY_ABORTED, ASC_COPY_TARGET_DEVICE_NOT_REACHABLE);
			goto fail;
		}
		if (j->src->block_size != lu->block_size) {
			scsi_fail(cmd, SK_ILLEGAL_REQUEST, ASC_INVALID_TOKEN_OP);
			goto fail;
		}
		/* skip `offset` blocks of the source */
		while (j->si < j->ns && offset >= j->s[j->si].n)
			offset -= j->s[j->si++].n;
		j->s_off = offset;
	}
	j->buf = buf_get(ODX_CHUNK);
	if (!j->buf) {
		scsi_fail(cmd, SK_HARDWARE_ERROR, ASC_INTERNAL_TARGET_FAILURE);
		goto fail;
	}
	if (!j->src)
		memset(j->buf, 0, ODX_CHUNK); /* never read into: stays zero */
	job_chunk(j);
	return SCSI_RC_PENDING;
fail:
	result_store(cmd, list_id, ODX_SA_WRITE_USING, ODX_ST_ERROR, 0, NULL);
	if (j->src)
		lu_inflight_add(j->src, -1);
	free(j);
	return SCSI_RC_DONE;
}

/* ---------------------------------------------------------------- */
/* RECEIVE ROD TOKEN INFORMATION                                     */

enum scsi_rc odx_receive_rod_token_info(struct scsi_cmd *cmd)
{
	uint32_t list_id = be32_get(cmd->cdb + 2);
	uint32_t alloc = be32_get(cmd->cdb + 10);
	uint8_t b[32 + SCSI_SENSE_MAX + 6 + ODX_ROD_LEN];
	struct odx_result r;
	bool found = false;

	pthread_mutex_lock(&odx_lock);
	for (unsigned i = 0; i < ODX_MAX_RESULTS && !found; i++)
		if (results[i].used && results[i].nx == cmd->nexus && results[i].lu == cmd->lu &&
		    results[i].list_id == list_id) {
			r = results[i];
			found = true;
		}
	pthread_mutex_unlock(&odx_lock);
	if (!found)
		return scsi_fail_cdb(cmd, 2, -1);
	memset(b, 0, sizeof(b));
	b[4] = r.sa;
	b[5] = r.status;
	b[13] = r.sense_len;
	b[14] = r.sense_len;
	b[15] = 0xf1; /* transfer count in logical blocks */
	be64_put(b + 16, r.blocks);
	be16_put(b + 24, 1);
	memcpy(b + 32, r.sense, r.sense_len);
	size_t off = 32 + r.sense_len;
	if (r.has_token) {
		be32_put(b + off, ODX_ROD_LEN + 2);
		memcpy(b + off + 6, r.rod, ODX_ROD_LEN);
		off += 6 + ODX_ROD_LEN;
	} else {
		off += 4;
	}
	be32_put(b, (uint32_t)(off - 4));
	scsi_data_in(cmd, b, off, alloc);
	OPENSSL_cleanse(&r, sizeof(r));
	OPENSSL_cleanse(b, sizeof(b));
	return SCSI_RC_DONE;
}

/* ---------------------------------------------------------------- */
/* VPD page 8Fh (third-party copy): what Windows reads to use ODX     */

size_t odx_vpd_tpc(const struct scsi_lu *lu, uint8_t *b)
{
	size_t off = 4;
	/* block device ROD token limits (0000h) */
	be16_put(b + off, 0x0000);
	be16_put(b + off + 2, 0x0020);
	be16_put(b + off + 10, ODX_MAX_RANGES);
	be32_put(b + off + 12, ODX_MAX_INACTIVITY_S);
	be32_put(b + off + 16, ODX_DEFAULT_INACTIVITY_S);
	be64_put(b + off + 20, ODX_MAX_TOKEN_BYTES >> lu->block_shift);
	be64_put(b + off + 28, ODX_OPTIMAL_BYTES >> lu->block_shift);
	off += 36;
	/* supported commands (0001h): 83h 10h 11h, 84h 07h (and the LID1 pair) */
	static const uint8_t cmds[] = { 0x83, 3, 0x00, 0x10, 0x11, 0x84, 3, 0x00, 0x03, 0x07 };
	size_t clen = 1 + sizeof(cmds), cpad = (clen + 3) & ~(size_t)3;
	be16_put(b + off, 0x0001);
	be16_put(b + off + 2, (uint16_t)cpad);
	b[off + 4] = (uint8_t)sizeof(cmds);
	memcpy(b + off + 5, cmds, sizeof(cmds));
	off += 4 + cpad;
	/* ROD token features (0106h): no remote tokens; lifetimes */
	be16_put(b + off, 0x0106);
	be16_put(b + off + 2, 0x005c);
	be32_put(b + off + 16, 1);
	be32_put(b + off + 20, ODX_MAX_LIFETIME_S);
	be32_put(b + off + 24, ODX_MAX_INACTIVITY_S);
	be16_put(b + off + 46, 48);
	/* its block device part */
	uint8_t *s = b + off + 48;
	be16_put(s + 2, 0x002c);
	be64_put(s + 8, ODX_MAX_TOKEN_BYTES);
	be64_put(s + 16, ODX_OPTIMAL_BYTES);
	be64_put(s + 24, ODX_MAX_TOKEN_BYTES);
	be64_put(s + 32, ODX_CHUNK);
	off += 4 + 0x5c;
	/* supported ROD types (0108h): ours (in and out), the zero token (in) */
	be16_put(b + off, 0x0108);
	be16_put(b + off + 2, 0x0084);
	be16_put(b + off + 6, 128);
	be32_put(b + off + 8, ODX_ROD_TYPE_PIT_VULNERABLE);
	b[off + 12] = 0x03;
	be32_put(b + off + 72, ODX_ROD_TYPE_ZERO);
	b[off + 76] = 0x02;
	off += 4 + 0x84;
	/* general copy operations (8001h) */
	be16_put(b + off, 0x8001);
	be16_put(b + off + 2, 0x0020);
	be32_put(b + off + 4, ODX_MAX_TOKENS);
	be32_put(b + off + 8, ODX_MAX_RESULTS);
	off += 4 + 0x20;
	return off;
}
