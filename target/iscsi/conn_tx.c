/*
 * conn_tx.c - what a connection writes: control PDUs, the PDUs of its
 * commands, and the queue they wait in until the socket takes them.
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
 * Threading: the connection's worker (conn.c).
 */
#include "target/iscsi/iscsi_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/socket.h>

#define TX_IOV_MAX 256

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
		iscsi_conn_enter(c);
		iscsi_conn_leave(c);
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
			worker_rewatch(&c->ev, iscsi_conn_events(c));
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
			worker_rewatch(&c->ev, iscsi_conn_events(c));
	}
}
