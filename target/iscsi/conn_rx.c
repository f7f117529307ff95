/*
 * conn_rx.c - what a connection reads: the PDU receive state machine.
 *
 * Receive (level-triggered EPOLLIN, non-blocking socket): one read takes
 * up to ISCSI_RX_STAGE_SIZE bytes into the connection's stage, as many
 * PDUs as the initiator sent (a QD32 burst is one read, not 32 or 64);
 * PDUs are then parsed out of the stage. A data segment of RX_DIRECT_MIN bytes or
 * more that is not in the stage yet is read straight into its buffer
 * (readv, with the stage as the last element for what follows), so big
 * transfers are not copied; small ones are copied once from the stage,
 * which costs less than the read it saves. After a PDU with a big data
 * segment the stage asks for one header only (rx_want), so the next big
 * segment is not pulled into the stage either: one readv per PDU, no copy.
 * A read that comes back short means the socket is empty: the next one
 * waits for epoll.
 *   RX_BHS   48 bytes of Basic Header Segment
 *   RX_AHS   TotalAHSLength words of AHS, then the header digest if
 *            negotiated (checked: a bad header digest drops the connection,
 *            since no length in that header can be trusted)
 *   RX_DATA  the data segment, its padding and the data digest. Where the
 *            segment goes is decided from the header before a byte of it
 *            is read: a SCSI Command's immediate data and a Data-Out's
 *            payload land in the command's pooled buffer at the right
 *            offset (cmd.c sets up rx_iov); anything else lands in the
 *            connection's rx_buf; data of a refused PDU is skipped.
 * Then the complete PDU is dispatched by opcode to login.c, cmd.c,
 * tmf.c, text.c, logout.c, nop.c or reject.c.
 *
 * Threading: the connection's worker (conn.c).
 */
#include "target/iscsi/iscsi_int.h"

#include "common/log.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define RX_PDUS_PER_EVENT 64
#define RX_DIRECT_MIN 16384

void iscsi_conn_rx_reset(struct iscsi_conn *c)
{
	c->rx_ignore = false;
	c->rx_reject = 0;
	c->rx_phase = RX_BHS;
	c->rx_got = 0;
	c->rx_hdr_len = ISCSI_BHS_LEN;
	c->rx_cmd = NULL;
	c->rx_slot = NULL;
	c->rx_discard = false;
	c->rx_iovcnt = c->rx_iovidx = 0;
}

static int ensure_rx_buf(struct iscsi_conn *c, size_t need)
{
	if (c->rx_buf_cap >= need)
		return 0;
	char *nb = realloc(c->rx_buf, need);
	if (!nb)
		return -1;
	c->rx_buf = nb;
	c->rx_buf_cap = need;
	return 0;
}

static uint32_t rx_limit(const struct iscsi_conn *c)
{
	return c->state == CONN_LOGIN ? ISCSI_LOGIN_MAX_DSL : c->params.target_mrdsl;
}

static void dispatch_pdu(struct iscsi_conn *c, bool digest_ok);

/* A whole PDU is in: dispatch it, then get ready for the next header. */
static void pdu_complete(struct iscsi_conn *c, bool digest_ok)
{
	/* the next PDU is likely alike: big segments go direct (see the top) */
	c->rx_want = c->rx_dsl >= RX_DIRECT_MIN ? ISCSI_BHS_LEN : ISCSI_RX_STAGE_SIZE;
	dispatch_pdu(c, digest_ok);
	c->rx_pdus++;
	if (c->state != CONN_CLOSING)
		iscsi_conn_rx_reset(c);
}

/* The whole header is in: decide where the data segment goes. */
static void header_done(struct iscsi_conn *c)
{
	const uint8_t *bhs = c->rx_hdr;
	uint32_t ahs = (uint32_t)bhs[4] * 4;
	uint32_t dsl = bhs_dsl(bhs);
	uint8_t op = bhs_opcode(bhs);

	if (c->state == CONN_FULL_FEATURE && c->params.header_digest) {
		uint32_t crc = iscsi_crc32c(c->rx_hdr, ISCSI_BHS_LEN + ahs, ISCSI_CRC_INIT);
		if (ISCSI_CRC_FINAL(crc) != digest_get(c->rx_hdr + ISCSI_BHS_LEN + ahs)) {
			log_warn("iSCSI %s: header digest error; dropping the connection", c->peer);
			iscsi_conn_close(c, "header digest error");
			return;
		}
	}
	c->last_rx_ms = now_ms();
	c->rx_dsl = dsl;
	if (dsl > rx_limit(c)) {
		log_warn("iSCSI %s: PDU opcode 0x%02x carries %u data bytes, over our "
			 "MaxRecvDataSegmentLength %u; dropping the connection",
			 c->peer, op, dsl, rx_limit(c));
		iscsi_reject_close(c, ISCSI_REJECT_PROTOCOL_ERROR, bhs, "data segment too long");
		return;
	}
	c->rx_iovcnt = c->rx_iovidx = 0;
	if (c->state == CONN_FULL_FEATURE && op == ISCSI_OP_SCSI_CMD) {
		iscsi_cmd_rx_header(c, bhs);
	} else if (c->state == CONN_FULL_FEATURE && op == ISCSI_OP_DATA_OUT) {
		iscsi_data_out_rx_header(c, bhs);
	} else if (dsl) {
		if (ensure_rx_buf(c, (size_t)dsl + 4) < 0) {
			iscsi_conn_close(c, "out of memory");
			return;
		}
		c->rx_iov[0].iov_base = c->rx_buf;
		c->rx_iov[0].iov_len = dsl;
		c->rx_iovcnt = 1;
	}
	if (c->state == CONN_CLOSING)
		return;
	if (dsl == 0) {
		pdu_complete(c, true);
		return;
	}
	memcpy(c->rx_view, c->rx_iov, sizeof(struct iovec) * (size_t)c->rx_iovcnt);
	c->rx_viewcnt = c->rx_iovcnt;
	uint32_t pad = (4 - (dsl & 3)) & 3;
	c->rx_trailer_len = pad +
		(c->state == CONN_FULL_FEATURE && c->params.data_digest ? ISCSI_DIGEST_LEN : 0);
	if (c->rx_discard)
		c->rx_iovcnt = 0;
	c->rx_left = (size_t)dsl + c->rx_trailer_len;
	if (c->rx_trailer_len) {
		c->rx_iov[c->rx_iovcnt].iov_base = c->rx_trailer;
		c->rx_iov[c->rx_iovcnt].iov_len = c->rx_trailer_len;
		c->rx_iovcnt++;
	}
	c->rx_phase = RX_DATA;
}

static bool data_digest_ok(struct iscsi_conn *c, const struct iovec *data, int n)
{
	uint32_t pad = (4 - (c->rx_dsl & 3)) & 3;
	uint32_t crc = ISCSI_CRC_INIT;

	if (c->state != CONN_FULL_FEATURE || !c->params.data_digest || c->rx_discard)
		return true;
	for (int i = 0; i < n; i++)
		crc = iscsi_crc32c(data[i].iov_base, data[i].iov_len, crc);
	crc = iscsi_crc32c(c->rx_trailer, pad, crc);
	return ISCSI_CRC_FINAL(crc) == digest_get(c->rx_trailer + pad);
}

static void dispatch_pdu(struct iscsi_conn *c, bool digest_ok)
{
	const uint8_t *bhs = c->rx_hdr;
	uint8_t op = bhs_opcode(bhs);
	char *data = c->rx_buf;
	uint32_t dlen = c->rx_discard ? 0 : c->rx_dsl;

	if (c->state == CONN_LOGIN) {
		if (op != ISCSI_OP_LOGIN_REQ) {
			log_warn("iSCSI %s: opcode 0x%02x before login completed; dropping the connection",
				 c->peer, op);
			iscsi_conn_close(c, "PDU before login");
			return;
		}
		iscsi_login_pdu(c, bhs, data, dlen);
		return;
	}
	if (!digest_ok && op != ISCSI_OP_SCSI_CMD && op != ISCSI_OP_DATA_OUT) {
		log_warn("iSCSI %s: data digest error on opcode 0x%02x", c->peer, op);
		iscsi_reject(c, ISCSI_REJECT_DATA_DIGEST, bhs);
		return;
	}
	switch (op) {
	case ISCSI_OP_NOP_OUT:
		iscsi_nop_out_pdu(c, bhs, data, dlen);
		break;
	case ISCSI_OP_SCSI_CMD:
		iscsi_cmd_rx_data_done(c, bhs, digest_ok);
		break;
	case ISCSI_OP_DATA_OUT:
		iscsi_data_out_rx_data_done(c, bhs, digest_ok);
		break;
	case ISCSI_OP_TMF_REQ:
		iscsi_tmf_pdu(c, bhs);
		break;
	case ISCSI_OP_TEXT_REQ:
		iscsi_text_pdu(c, bhs, data, dlen);
		break;
	case ISCSI_OP_LOGOUT_REQ:
		iscsi_logout_pdu(c, bhs);
		break;
	case ISCSI_OP_LOGIN_REQ:
		log_warn("iSCSI %s: Login request in full feature phase; rejecting and dropping",
			 c->peer);
		iscsi_reject_close(c, ISCSI_REJECT_PROTOCOL_ERROR, bhs, "login in full feature phase");
		break;
	case ISCSI_OP_SNACK:
		/* ErrorRecoveryLevel=0: no SNACK support. */
		iscsi_reject(c, ISCSI_REJECT_SNACK, bhs);
		break;
	default:
		log_warn("iSCSI %s: unknown opcode 0x%02x; rejecting", c->peer, op);
		iscsi_reject(c, ISCSI_REJECT_CMD_NOT_SUPPORTED, bhs);
		break;
	}
}

/* A failed or empty read: 0 would block, -1 closed. */
static int rx_error(struct iscsi_conn *c, ssize_t r)
{
	if (r == 0) {
		iscsi_conn_close(c, "peer closed the connection");
		return -1;
	}
	if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
		c->rx_dry = true;
		return 0;
	}
	iscsi_conn_close(c, strerror(errno));
	return -1;
}

/*
 * n data-phase bytes arrived: from src (the stage), copied into the data
 * iovecs, or already in them (src NULL, a direct read). While a refused
 * PDU's data is skipped only the trailer goes to the iovecs. Returns the
 * bytes used (at most rx_left).
 */
static size_t rx_data_bytes(struct iscsi_conn *c, const uint8_t *src, size_t n)
{
	size_t used = 0;

	if (n > c->rx_left)
		n = c->rx_left;
	if (c->rx_discard && c->rx_left > c->rx_trailer_len) {
		size_t skip = c->rx_left - c->rx_trailer_len;
		used = skip < n ? skip : n;
		c->rx_left -= used;
	}
	while (used < n && c->rx_iovidx < c->rx_iovcnt) {
		struct iovec *v = &c->rx_iov[c->rx_iovidx];
		size_t k = n - used < v->iov_len ? n - used : v->iov_len;
		if (src)
			memcpy(v->iov_base, src + used, k);
		v->iov_base = (char *)v->iov_base + k;
		v->iov_len -= k;
		if (v->iov_len == 0)
			c->rx_iovidx++;
		used += k;
		c->rx_left -= k;
	}
	if (used < n) { /* iovecs shorter than the segment: cannot happen; skip */
		c->rx_left -= n - used;
		used = n;
	}
	return used;
}

/* Header bytes were added at rx_hdr + rx_got (n of them). */
static void rx_hdr_bytes(struct iscsi_conn *c, size_t n)
{
	c->rx_got += (uint32_t)n;
	if (c->rx_phase == RX_BHS) {
		if (c->rx_got < ISCSI_BHS_LEN)
			return;
		if (c->state == CONN_LOGIN && bhs_opcode(c->rx_hdr) != ISCSI_OP_LOGIN_REQ) {
			log_warn("iSCSI %s: opcode 0x%02x before login completed; dropping the connection",
				 c->peer, bhs_opcode(c->rx_hdr));
			iscsi_conn_close(c, "PDU before login");
			return;
		}
		uint32_t ahs = (uint32_t)c->rx_hdr[4] * 4;
		bool hd = c->state == CONN_FULL_FEATURE && c->params.header_digest;
		c->rx_hdr_len = ISCSI_BHS_LEN + ahs + (hd ? ISCSI_DIGEST_LEN : 0);
		if (c->rx_hdr_len > ISCSI_BHS_LEN) {
			c->rx_phase = RX_AHS;
			return;
		}
		header_done(c);
		return;
	}
	if (c->rx_got == c->rx_hdr_len)
		header_done(c);
}

/*
 * Refill the empty stage from the socket: 1 progress, 0 would block (or
 * the last read said the socket is empty), -1 closed. A long data segment
 * still to come is read straight into its iovecs.
 */
static int rx_fill(struct iscsi_conn *c)
{
	ssize_t r;

	if (c->rx_dry)
		return 0;
	c->rx_stage_pos = c->rx_stage_len = 0;
	if (c->rx_phase == RX_DATA && !c->rx_discard && c->rx_left >= RX_DIRECT_MIN) {
		struct iovec v[ISCSI_CMD_MAX_BUFS + 3];
		int n = 0;
		size_t direct = 0;
		for (int i = c->rx_iovidx; i < c->rx_iovcnt; i++) {
			v[n++] = c->rx_iov[i];
			direct += c->rx_iov[i].iov_len;
		}
		v[n].iov_base = c->rx_stage;
		v[n++].iov_len = ISCSI_BHS_LEN; /* the next header, if it is there */
		r = readv(c->ev.fd, v, n);
		if (r <= 0)
			return rx_error(c, r);
		c->rx_dry = (size_t)r < direct + ISCSI_BHS_LEN;
		if ((size_t)r > direct)
			c->rx_stage_len = (uint32_t)((size_t)r - direct);
		else
			direct = (size_t)r;
		rx_data_bytes(c, NULL, direct);
		if (c->rx_left == 0)
			pdu_complete(c, data_digest_ok(c, c->rx_view, c->rx_viewcnt));
		return 1;
	}
	/* a short data segment (or one being skipped) and what follows, or a
	 * header after a big segment (rx_want) */
	size_t want = c->rx_phase == RX_DATA ? ISCSI_RX_STAGE_SIZE : c->rx_want;
	r = read(c->ev.fd, c->rx_stage, want);
	if (r <= 0)
		return rx_error(c, r);
	c->rx_dry = (size_t)r < want;
	c->rx_stage_len = (uint32_t)r;
	return 1;
}

/* Move the PDU in progress along with the bytes at hand. 1: progress,
 * 0: nothing to read, -1: closed. */
static int rx_step(struct iscsi_conn *c)
{
	if (!iscsi_conn_rx_staged(c))
		return rx_fill(c); /* the caller's loop checks the state first */
	const uint8_t *src = c->rx_stage + c->rx_stage_pos;
	size_t avail = iscsi_conn_rx_staged(c);

	if (c->rx_phase != RX_DATA) {
		size_t n = c->rx_hdr_len - c->rx_got;
		if (n > avail)
			n = avail;
		memcpy(c->rx_hdr + c->rx_got, src, n);
		c->rx_stage_pos += (uint32_t)n;
		rx_hdr_bytes(c, n);
		return 1;
	}
	c->rx_stage_pos += (uint32_t)rx_data_bytes(c, src, avail);
	if (c->rx_left == 0)
		pdu_complete(c, data_digest_ok(c, c->rx_view, c->rx_viewcnt));
	return 1;
}

void iscsi_conn_rx_run(struct iscsi_conn *c)
{
	unsigned start = c->rx_pdus;

	iscsi_conn_enter(c);
	while (c->state != CONN_CLOSING && !c->closing_after_tx &&
	       c->rx_pdus - start < RX_PDUS_PER_EVENT) {
		if (c->rx_phase == RX_BHS && c->rx_got == 0 &&
		    c->tx_queued_bytes >= ISCSI_TX_HIGH_WATER)
			break;
		if (rx_step(c) <= 0)
			break;
	}
	iscsi_conn_leave(c);
}

void iscsi_conn_on_readable(struct iscsi_conn *c)
{
	c->rx_dry = false; /* the socket has something (or the caller says so) */
	iscsi_conn_rx_run(c);
}
