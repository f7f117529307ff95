/*
 * conn.c - one iSCSI connection: its socket, its PDU receive state
 * machine and its transmit queue.
 *
 * Receive (level-triggered EPOLLIN, non-blocking socket): one read takes
 * up to RX_STAGE_SIZE bytes into the connection's stage, as many PDUs as
 * the initiator sent (a QD32 burst is one read, not 32 or 64); PDUs are
 * then parsed out of the stage. A data segment of RX_DIRECT_MIN bytes or
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
 * Transmit: a FIFO of struct iscsi_tx written with sendmsg, many PDUs per
 * call, except that a data segment held in a file (a page-cached READ,
 * iscsi_tx.file_fd) goes with sendfile: the call before it ends at its
 * header, with MSG_MORE. The file's pages were all cached when the command
 * completed; if they are evicted before the send, sendfile reads them on
 * the worker (a stall, not an error), and a read error then closes the
 * connection (the initiator retries; the data is then read the ordinary
 * way). EPOLLOUT is watched only while the kernel refuses more
 * (backpressure), and reading stops while more than ISCSI_TX_HIGH_WATER
 * bytes wait.
 *
 * Lifetime: entry points (socket events, ticks, backstore completions,
 * posted calls) bracket their work with conn_enter/conn_leave. On a worker
 * the outermost leave does not write at once: it queues the connection's
 * batch end (worker_at_batch_end), which holds one in_handler count and
 * runs once the worker has handled the iteration's events and completions,
 * so every response of the iteration goes out in one writev. The batch end
 * (or, off the workers, the leave itself) flushes the transmit queue,
 * resumes parsing PDUs left in the stage, and frees a closed connection
 * once the backstore has returned every command it holds.
 *
 * Threading: all of it on the connection's worker thread.
 */
#include "target/iscsi/iscsi_int.h"

#include "common/log.h"

#include <errno.h>
#include <isa-l/crc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <unistd.h>

#define RX_PDUS_PER_EVENT 64
#define RX_STAGE_SIZE 65536
#define RX_DIRECT_MIN 16384
#define TX_IOV_MAX 256
#define LOGIN_TIMEOUT_MS 30000

static __thread struct iscsi_conn *conn_list;

uint32_t iscsi_crc32c(const void *buf, size_t len, uint32_t crc)
{
	while (len > 0) {
		int chunk = len > (1u << 30) ? (1 << 30) : (int)len;
		crc = crc32_iscsi((unsigned char *)buf, chunk, crc);
		buf = (const char *)buf + chunk;
		len -= (size_t)chunk;
	}
	return crc;
}

struct iscsi_conn *iscsi_conn_first(void) { return conn_list; }

static void conn_enter(struct iscsi_conn *c) { c->in_handler++; }

static unsigned cur_events(const struct iscsi_conn *c)
{
	return (c->reading ? EPOLLIN : 0) | (c->writing ? EPOLLOUT : 0);
}

void iscsi_conn_update_watch(struct iscsi_conn *c)
{
	unsigned before = cur_events(c);
	if (c->state == CONN_CLOSING)
		return;
	c->reading = !c->closing_after_tx && !c->draining &&
		     c->tx_queued_bytes < ISCSI_TX_HIGH_WATER;
	if (before != cur_events(c) && worker_self())
		worker_rewatch(&c->ev, cur_events(c));
}

static size_t rx_staged(const struct iscsi_conn *c) { return c->rx_stage_len - c->rx_stage_pos; }
static void rx_run(struct iscsi_conn *c);

/* The outermost leave's work. */
static void conn_leave_now(struct iscsi_conn *c)
{
	/* Still counted while flushing, so a close triggered by a written PDU
	 * (close_after) cannot free the connection under us. */
	if (c->state != CONN_CLOSING) {
		iscsi_conn_flush(c);
		if (c->draining && c->state != CONN_CLOSING && !c->closing_after_tx &&
		    iscsi_conn_drained(c))
			iscsi_conn_close(c, "portal drained");
		if (c->state != CONN_CLOSING)
			iscsi_conn_update_watch(c);
	}
	c->in_handler = 0;
	iscsi_conn_maybe_free(c);
}

static void conn_batch_end(struct worker_batch_end *b)
{
	struct iscsi_conn *c = (struct iscsi_conn *)((char *)b - offsetof(struct iscsi_conn, batch));

	if (c->in_handler > 1) { /* not expected: batch ends run outside handlers */
		c->in_handler--;
		return;
	}
	conn_leave_now(c);
	/* PDUs left in the stage (the per-event limit, or reading paused for
	 * transmit backpressure): epoll will not report them, parse them now. */
	if (c->state != CONN_CLOSING && c->reading && !c->closing_after_tx && rx_staged(c))
		rx_run(c);
}

static void conn_leave(struct iscsi_conn *c)
{
	if (c->in_handler > 1) {
		c->in_handler--;
		return;
	}
	if (c->state != CONN_CLOSING && worker_self()) {
		/* the count passes to the batch end (not queued yet: it would hold
		 * a count of its own, and in_handler would be above 1) */
		c->batch.fn = conn_batch_end;
		worker_at_batch_end(&c->batch);
		return;
	}
	conn_leave_now(c);
}

/* ---- transmit ---- */

struct iscsi_tx *iscsi_tx_new(size_t dlen)
{
	struct iscsi_tx *tx = calloc(1, sizeof(*tx) + dlen + 1);
	if (!tx)
		return NULL;
	tx->kind = ISCSI_TX_CTRL;
	tx->file_fd = -1;
	tx->payload = (uint8_t *)(tx + 1);
	if (dlen) {
		tx->data[0].iov_base = tx->payload;
		tx->data[0].iov_len = dlen;
		tx->data_iovcnt = 1;
		tx->data_len = (uint32_t)dlen;
	}
	return tx;
}

void iscsi_conn_fill_sn(struct iscsi_conn *c, uint8_t *hdr, bool advance_statsn)
{
	struct iscsi_sess *s = c->sess;
	be32_put(hdr + 24, c->statsn);
	if (advance_statsn)
		c->statsn++;
	if (s) {
		iscsi_sess_update_max_cmdsn(s);
		be32_put(hdr + 28, s->exp_cmdsn);
		be32_put(hdr + 32, s->max_cmdsn);
	}
}

static void tx_done(struct iscsi_conn *c, struct iscsi_tx *tx)
{
	tx->queued = false;
	if (tx->kind == ISCSI_TX_CTRL) {
		bool close = tx->close_after;
		free(tx);
		if (close)
			iscsi_conn_close(c, "closing after final response");
	} else if (tx->sent_cb) {
		tx->sent_cb(c, tx);
	}
}

void iscsi_conn_send(struct iscsi_conn *c, struct iscsi_tx *tx)
{
	if (c->state == CONN_CLOSING) {
		if (tx->kind == ISCSI_TX_CTRL)
			free(tx);
		return;
	}
	be24_put(tx->hdr + 5, tx->data_len);
	tx->hdr_len = ISCSI_BHS_LEN;
	if (c->params.header_digest) {
		uint32_t crc = iscsi_crc32c(tx->hdr, ISCSI_BHS_LEN, ISCSI_CRC_INIT);
		digest_put(tx->hdr + ISCSI_BHS_LEN, ISCSI_CRC_FINAL(crc));
		tx->hdr_len += ISCSI_DIGEST_LEN;
	}
	tx->trailer_len = 0;
	if (tx->data_len) {
		uint32_t pad = (4 - (tx->data_len & 3)) & 3;
		memset(tx->trailer, 0, pad);
		tx->trailer_len = pad;
		if (c->params.data_digest) { /* never with file_fd: cmd.c sets fe_data_fd only without */
			uint32_t crc = ISCSI_CRC_INIT;
			for (int i = 0; i < tx->data_iovcnt; i++)
				crc = iscsi_crc32c(tx->data[i].iov_base, tx->data[i].iov_len, crc);
			crc = iscsi_crc32c(tx->trailer, pad, crc);
			digest_put(tx->trailer + pad, ISCSI_CRC_FINAL(crc));
			tx->trailer_len += ISCSI_DIGEST_LEN;
		}
	}
	tx->total = tx->hdr_len + tx->data_len + tx->trailer_len;
	tx->sent = 0;
	tx->next = NULL;
	tx->queued = true;
	if (tx->close_after)
		c->closing_after_tx = true;
	if (c->tx_tail)
		c->tx_tail->next = tx;
	else
		c->tx_head = tx;
	c->tx_tail = tx;
	c->tx_queued_bytes += tx->total;
	if (!c->in_handler) {
		conn_enter(c);
		conn_leave(c);
	}
}

bool iscsi_conn_unqueue(struct iscsi_conn *c, struct iscsi_tx *tx)
{
	struct iscsi_tx **pp = &c->tx_head, *prev = NULL;

	if (!tx->queued)
		return true;
	if (tx->sent)
		return false;
	for (; *pp; prev = *pp, pp = &(*pp)->next) {
		if (*pp == tx) {
			*pp = tx->next;
			if (c->tx_tail == tx)
				c->tx_tail = prev;
			c->tx_queued_bytes -= tx->total;
			tx->queued = false;
			return true;
		}
	}
	tx->queued = false;
	return true;
}

/*
 * Append the unsent part of tx to iov; returns the new count. A data
 * segment that comes from a file (file_fd) is not in memory: *stop is set
 * when it is reached, and the caller sends it with sendfile.
 */
static int tx_iov(struct iscsi_tx *tx, struct iovec *iov, int n, int max, bool *stop)
{
	size_t skip = tx->sent;
	struct iovec parts[ISCSI_TX_DATA_IOV + 2];
	int np = 0;

	parts[np].iov_base = tx->hdr;
	parts[np++].iov_len = tx->hdr_len;
	int file_part = -1;
	if (tx->file_fd >= 0 && tx->data_len) {
		file_part = np;
		parts[np].iov_base = NULL;
		parts[np++].iov_len = tx->data_len;
	}
	for (int i = 0; i < tx->data_iovcnt; i++)
		parts[np++] = tx->data[i];
	if (tx->trailer_len) {
		parts[np].iov_base = tx->trailer;
		parts[np++].iov_len = tx->trailer_len;
	}
	for (int i = 0; i < np && n < max; i++) {
		if (skip >= parts[i].iov_len) {
			skip -= parts[i].iov_len;
			continue;
		}
		if (i == file_part) {
			*stop = true;
			break;
		}
		iov[n].iov_base = (char *)parts[i].iov_base + skip;
		iov[n].iov_len = parts[i].iov_len - skip;
		skip = 0;
		n++;
	}
	return n;
}

static void wait_writable(struct iscsi_conn *c)
{
	if (!c->writing) {
		c->writing = true;
		if (worker_self())
			worker_rewatch(&c->ev, cur_events(c));
	}
}

/* w bytes of the queue went out: retire the PDUs they finish. */
static void tx_advance(struct iscsi_conn *c, size_t w)
{
	c->tx_queued_bytes -= w;
	while (w && c->tx_head) {
		struct iscsi_tx *tx = c->tx_head;
		size_t rem = tx->total - tx->sent;
		if (w < rem) {
			tx->sent += w;
			return;
		}
		w -= rem;
		tx->sent = tx->total;
		c->tx_head = tx->next;
		if (!c->tx_head)
			c->tx_tail = NULL;
		tx_done(c, tx);
		if (c->state == CONN_CLOSING)
			return;
	}
}

/* The head PDU is inside a data segment that comes from a file. */
static bool head_in_file(const struct iscsi_conn *c)
{
	const struct iscsi_tx *tx = c->tx_head;
	return tx->file_fd >= 0 && tx->sent >= tx->hdr_len && tx->sent < tx->hdr_len + tx->data_len;
}

void iscsi_conn_flush(struct iscsi_conn *c)
{
	struct iovec iov[TX_IOV_MAX];

	while (c->tx_head && c->state != CONN_CLOSING) {
		size_t want = 0;
		ssize_t w;
		if (head_in_file(c)) {
			/* page cache to socket: no copy through our buffers */
			struct iscsi_tx *tx = c->tx_head;
			size_t done = tx->sent - tx->hdr_len;
			off_t off = (off_t)(tx->file_off + done);
			want = tx->data_len - done;
			w = sendfile(c->ev.fd, tx->file_fd, &off, want);
			if (w == 0) {
				iscsi_conn_close(c, "LUN data ended early (file shorter than the LUN?)");
				return;
			}
		} else {
			int n = 0;
			bool stop = false;
			for (struct iscsi_tx *tx = c->tx_head;
			     tx && !stop && n < TX_IOV_MAX - (ISCSI_TX_DATA_IOV + 2); tx = tx->next)
				n = tx_iov(tx, iov, n, TX_IOV_MAX, &stop);
			for (int i = 0; i < n; i++)
				want += iov[i].iov_len;
			/* MSG_MORE before a file segment: its header and data leave together */
			struct msghdr m = { .msg_iov = iov, .msg_iovlen = (size_t)n };
			w = sendmsg(c->ev.fd, &m, MSG_NOSIGNAL | (stop ? MSG_MORE : 0));
		}
		if (w < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK) {
				wait_writable(c);
				return;
			}
			iscsi_conn_close(c, strerror(errno));
			return;
		}
		tx_advance(c, (size_t)w);
		if (c->state == CONN_CLOSING)
			return;
		if ((size_t)w < want) {
			/* the socket buffer is full: another write now would only
			 * say EAGAIN; wait for room */
			wait_writable(c);
			return;
		}
	}
	if (c->writing && c->state != CONN_CLOSING) {
		c->writing = false;
		if (worker_self())
			worker_rewatch(&c->ev, cur_events(c));
	}
}

/* ---- receive ---- */

void iscsi_conn_enter(struct iscsi_conn *c) { conn_enter(c); }
void iscsi_conn_leave(struct iscsi_conn *c) { conn_leave(c); }

static void rx_reset(struct iscsi_conn *c)
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
	c->rx_want = c->rx_dsl >= RX_DIRECT_MIN ? ISCSI_BHS_LEN : RX_STAGE_SIZE;
	dispatch_pdu(c, digest_ok);
	c->rx_pdus++;
	if (c->state != CONN_CLOSING)
		rx_reset(c);
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
	size_t want = c->rx_phase == RX_DATA ? RX_STAGE_SIZE : c->rx_want;
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
	if (!rx_staged(c))
		return rx_fill(c); /* the caller's loop checks the state first */
	const uint8_t *src = c->rx_stage + c->rx_stage_pos;
	size_t avail = rx_staged(c);

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

static void rx_run(struct iscsi_conn *c)
{
	unsigned start = c->rx_pdus;

	conn_enter(c);
	while (c->state != CONN_CLOSING && !c->closing_after_tx &&
	       c->rx_pdus - start < RX_PDUS_PER_EVENT) {
		if (c->rx_phase == RX_BHS && c->rx_got == 0 &&
		    c->tx_queued_bytes >= ISCSI_TX_HIGH_WATER)
			break;
		if (rx_step(c) <= 0)
			break;
	}
	conn_leave(c);
}

void iscsi_conn_on_readable(struct iscsi_conn *c)
{
	c->rx_dry = false; /* the socket has something (or the caller says so) */
	rx_run(c);
}

static void on_event(struct ev_handler *h, uint32_t events)
{
	struct iscsi_conn *c = (struct iscsi_conn *)h;

	conn_enter(c);
	if (events & (EPOLLERR | EPOLLHUP) && !(events & EPOLLIN))
		iscsi_conn_close(c, "socket error");
	if (c->state != CONN_CLOSING && (events & EPOLLOUT))
		iscsi_conn_flush(c);
	if (c->state != CONN_CLOSING && (events & EPOLLIN))
		iscsi_conn_on_readable(c);
	conn_leave(c);
}

static void on_tick(struct worker_tick *t)
{
	struct iscsi_conn *c = (struct iscsi_conn *)((char *)t - offsetof(struct iscsi_conn, tick));

	conn_enter(c);
	if (c->state == CONN_LOGIN && now_ms() - c->last_rx_ms > LOGIN_TIMEOUT_MS)
		iscsi_conn_close(c, "login timed out");
	else if (c->state == CONN_FULL_FEATURE)
		iscsi_nop_tick(c);
	if (c->draining && !c->closing_after_tx && iscsi_conn_drained(c))
		iscsi_conn_close(c, "portal drained");
	conn_leave(c);
}

struct iscsi_conn *iscsi_conn_new(int fd)
{
	struct iscsi_conn *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->ev.fd = fd;
	c->ev.on_event = on_event;
	c->rx_stage = malloc(RX_STAGE_SIZE);
	if (!c->rx_stage) {
		free(c);
		return NULL;
	}
	c->state = CONN_LOGIN;
	c->rx_want = RX_STAGE_SIZE;
	c->statsn = 1;
	c->last_rx_ms = now_ms();
	iscsi_params_default(&c->params);
	rx_reset(c);
	snprintf(c->peer, sizeof(c->peer), "fd %d", fd);
	if (iscsi_login_init(c) < 0) {
		free(c->rx_stage);
		free(c);
		return NULL;
	}
	c->reading = true;
	if (worker_self()) {
		if (worker_watch(&c->ev, EPOLLIN) < 0) {
			iscsi_login_free(c);
			free(c->rx_stage);
			free(c);
			return NULL;
		}
		c->tick.fn = on_tick;
		worker_tick_add(&c->tick);
	}
	c->next = conn_list;
	if (conn_list)
		conn_list->prev = c;
	conn_list = c;
	return c;
}

void iscsi_conn_close(struct iscsi_conn *c, const char *why)
{
	if (c->state == CONN_CLOSING)
		return;
	if (c->sess)
		log_info("iSCSI %s: connection of %s closed (%s)", c->peer, c->sess->initiator, why);
	else
		log_debug("iSCSI %s: connection closed during login (%s)", c->peer, why);
	c->state = CONN_CLOSING;
	if (worker_self())
		worker_unwatch(&c->ev);
	worker_tick_del(&c->tick);
	close(c->ev.fd);
	c->ev.fd = -1;
	while (c->tx_head) {
		struct iscsi_tx *tx = c->tx_head;
		c->tx_head = tx->next;
		tx->queued = false;
		if (tx->kind == ISCSI_TX_CTRL)
			free(tx);
	}
	c->tx_tail = NULL;
	c->tx_queued_bytes = 0;
	if (c->login)
		iscsi_login_free(c);
	if (c->sess) {
		iscsi_tmf_free_all(c->sess);
		iscsi_cmd_release_all(c->sess);
	}
	if (!c->in_handler)
		iscsi_conn_maybe_free(c);
}

/* A freed connection's handler: an event of the same epoll batch that was
 * already collected when the connection went away lands here. */
static void on_dead_event(struct ev_handler *h, uint32_t events)
{
	(void)h;
	(void)events;
}

void iscsi_conn_maybe_free(struct iscsi_conn *c)
{
	if (c->in_handler || c->state != CONN_CLOSING)
		return;
	if (c->sess && c->sess->in_backstore)
		return;
	if (c->sess)
		iscsi_sess_conn_gone(c->sess);
	if (c->prev)
		c->prev->next = c->next;
	else if (conn_list == c)
		conn_list = c->next;
	if (c->next)
		c->next->prev = c->prev;
	free(c->rx_buf);
	free(c->rx_stage);
	free(c->text_acc);
	free(c->text_out);
	c->ev.on_event = on_dead_event;
	worker_defer_free(c);
	iscsi_portal_conn_gone();
}

bool iscsi_conn_drained(struct iscsi_conn *c)
{
	if (c->tx_head)
		return false;
	if (c->sess && c->sess->active.next != &c->sess->active)
		return false;
	return true;
}

void iscsi_conn_drain(struct iscsi_conn *c)
{
	conn_enter(c);
	c->draining = true;
	if (c->state == CONN_FULL_FEATURE && c->sess && !c->sess->discovery &&
	    !c->closing_after_tx) {
		/* Tell the initiator why the connection is about to go. */
		iscsi_async_logout_request(c, 1, iscsi_conn_drained(c));
	} else if (iscsi_conn_drained(c)) {
		iscsi_conn_close(c, "portal drained");
	}
	conn_leave(c);
}
