/*
 * conn.c - one iSCSI connection: its socket, its PDU receive state
 * machine and its transmit queue.
 *
 * Receive (level-triggered EPOLLIN, non-blocking socket):
 *   RX_BHS   48 bytes of Basic Header Segment
 *   RX_AHS   TotalAHSLength words of AHS, then the header digest if
 *            negotiated (checked: a bad header digest drops the connection,
 *            since no length in that header can be trusted)
 *   RX_DATA  the data segment, its padding and the data digest. Where the
 *            segment goes is decided from the header before a byte of it
 *            is read: a SCSI Command's immediate data and a Data-Out's
 *            payload land directly in the command's pooled buffer at the
 *            right offset (cmd.c sets up rx_iov); anything else lands in
 *            the connection's rx_buf; data of a refused PDU is read into a
 *            sink and dropped.
 * Then the complete PDU is dispatched by opcode to login.c, cmd.c,
 * tmf.c, text.c, logout.c, nop.c or reject.c.
 *
 * Transmit: a FIFO of struct iscsi_tx written with writev, many PDUs per
 * call; EPOLLOUT is watched only while the kernel refuses more (backpressure),
 * and reading stops while more than ISCSI_TX_HIGH_WATER bytes wait.
 *
 * Lifetime: entry points (socket events, ticks, backstore completions,
 * posted calls) bracket their work with conn_enter/conn_leave; the last
 * leave flushes the transmit queue and frees a closed connection once the
 * backstore has returned every command it holds.
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
#include <sys/socket.h>
#include <unistd.h>

#define RX_PDUS_PER_EVENT 64
#define TX_IOV_MAX 64
#define LOGIN_TIMEOUT_MS 30000

static __thread struct iscsi_conn *conn_list;
static __thread uint8_t rx_sink[65536];

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

static void conn_leave(struct iscsi_conn *c)
{
	if (c->in_handler > 1) {
		c->in_handler--;
		return;
	}
	/* Outermost: still counted while flushing, so a close triggered by a
	 * written PDU (close_after) cannot free the connection under us. */
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

/* ---- transmit ---- */

struct iscsi_tx *iscsi_tx_new(size_t dlen)
{
	struct iscsi_tx *tx = calloc(1, sizeof(*tx) + dlen + 1);
	if (!tx)
		return NULL;
	tx->kind = ISCSI_TX_CTRL;
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
		if (c->params.data_digest) {
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

/* Append the unsent part of tx to iov; returns the new count. */
static int tx_iov(struct iscsi_tx *tx, struct iovec *iov, int n, int max)
{
	size_t skip = tx->sent;
	struct iovec parts[ISCSI_TX_DATA_IOV + 2];
	int np = 0;

	parts[np].iov_base = tx->hdr;
	parts[np++].iov_len = tx->hdr_len;
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
		iov[n].iov_base = (char *)parts[i].iov_base + skip;
		iov[n].iov_len = parts[i].iov_len - skip;
		skip = 0;
		n++;
	}
	return n;
}

void iscsi_conn_flush(struct iscsi_conn *c)
{
	struct iovec iov[TX_IOV_MAX];

	while (c->tx_head && c->state != CONN_CLOSING) {
		int n = 0;
		for (struct iscsi_tx *tx = c->tx_head; tx && n < TX_IOV_MAX - (ISCSI_TX_DATA_IOV + 2);
		     tx = tx->next)
			n = tx_iov(tx, iov, n, TX_IOV_MAX);
		ssize_t w = writev(c->ev.fd, iov, n);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK) {
				if (!c->writing) {
					c->writing = true;
					if (worker_self())
						worker_rewatch(&c->ev, cur_events(c));
				}
				return;
			}
			iscsi_conn_close(c, strerror(errno));
			return;
		}
		size_t left = (size_t)w;
		c->tx_queued_bytes -= left;
		while (left && c->tx_head) {
			struct iscsi_tx *tx = c->tx_head;
			size_t rem = tx->total - tx->sent;
			if (left < rem) {
				tx->sent += left;
				left = 0;
				break;
			}
			left -= rem;
			tx->sent = tx->total;
			c->tx_head = tx->next;
			if (!c->tx_head)
				c->tx_tail = NULL;
			tx_done(c, tx);
			if (c->state == CONN_CLOSING)
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

/* Read once into the current phase's buffers. 1: progress, 0: would block, -1: closed. */
static int rx_step(struct iscsi_conn *c)
{
	ssize_t r;

	if (c->rx_phase != RX_DATA) {
		r = read(c->ev.fd, c->rx_hdr + c->rx_got, c->rx_hdr_len - c->rx_got);
	} else if (c->rx_discard && c->rx_left > c->rx_trailer_len) {
		size_t want = c->rx_left - c->rx_trailer_len;
		if (want > sizeof(rx_sink))
			want = sizeof(rx_sink);
		r = read(c->ev.fd, rx_sink, want);
	} else {
		r = readv(c->ev.fd, c->rx_iov + c->rx_iovidx, c->rx_iovcnt - c->rx_iovidx);
	}
	if (r == 0) {
		iscsi_conn_close(c, "peer closed the connection");
		return -1;
	}
	if (r < 0) {
		if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
			return 0;
		iscsi_conn_close(c, strerror(errno));
		return -1;
	}
	if (c->rx_phase == RX_BHS) {
		c->rx_got += (uint32_t)r;
		if (c->rx_got < ISCSI_BHS_LEN)
			return 1;
		if (c->state == CONN_LOGIN && bhs_opcode(c->rx_hdr) != ISCSI_OP_LOGIN_REQ) {
			log_warn("iSCSI %s: opcode 0x%02x before login completed; dropping the connection",
				 c->peer, bhs_opcode(c->rx_hdr));
			iscsi_conn_close(c, "PDU before login");
			return -1;
		}
		uint32_t ahs = (uint32_t)c->rx_hdr[4] * 4;
		bool hd = c->state == CONN_FULL_FEATURE && c->params.header_digest;
		c->rx_hdr_len = ISCSI_BHS_LEN + ahs + (hd ? ISCSI_DIGEST_LEN : 0);
		if (c->rx_hdr_len > ISCSI_BHS_LEN) {
			c->rx_phase = RX_AHS;
			return 1;
		}
		header_done(c);
		return 1;
	}
	if (c->rx_phase == RX_AHS) {
		c->rx_got += (uint32_t)r;
		if (c->rx_got == c->rx_hdr_len)
			header_done(c);
		return 1;
	}
	/* RX_DATA */
	c->rx_left -= (size_t)r;
	if (!(c->rx_discard && c->rx_left + (size_t)r > c->rx_trailer_len)) {
		size_t adv = (size_t)r;
		while (adv && c->rx_iovidx < c->rx_iovcnt) {
			struct iovec *v = &c->rx_iov[c->rx_iovidx];
			if (adv < v->iov_len) {
				v->iov_base = (char *)v->iov_base + adv;
				v->iov_len -= adv;
				adv = 0;
			} else {
				adv -= v->iov_len;
				c->rx_iovidx++;
			}
		}
	}
	if (c->rx_left == 0)
		pdu_complete(c, data_digest_ok(c, c->rx_view, c->rx_viewcnt));
	return 1;
}

void iscsi_conn_on_readable(struct iscsi_conn *c)
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
	c->state = CONN_LOGIN;
	c->statsn = 1;
	c->last_rx_ms = now_ms();
	iscsi_params_default(&c->params);
	rx_reset(c);
	snprintf(c->peer, sizeof(c->peer), "fd %d", fd);
	if (iscsi_login_init(c) < 0) {
		free(c);
		return NULL;
	}
	c->reading = true;
	if (worker_self()) {
		if (worker_watch(&c->ev, EPOLLIN) < 0) {
			iscsi_login_free(c);
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
