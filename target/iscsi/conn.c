/*
 * conn.c - one iSCSI connection: its life from the accepted socket to the
 * free, and the entry points that bracket every piece of work on it. What
 * it reads is conn_rx.c, what it writes conn_tx.c.
 *
 * Lifetime: entry points (socket events, ticks, backstore completions,
 * posted calls) bracket their work with conn_enter/conn_leave (the other
 * files with iscsi_conn_enter/iscsi_conn_leave). On a worker
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

#include <isa-l/crc.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <unistd.h>

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

void iscsi_conn_update_watch(struct iscsi_conn *c)
{
	unsigned before = iscsi_conn_events(c);
	if (c->state == CONN_CLOSING)
		return;
	c->reading = !c->closing_after_tx && !c->draining &&
		     c->tx_queued_bytes < ISCSI_TX_HIGH_WATER;
	if (before != iscsi_conn_events(c) && worker_self())
		worker_rewatch(&c->ev, iscsi_conn_events(c));
}


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
	if (c->state != CONN_CLOSING && c->reading && !c->closing_after_tx && iscsi_conn_rx_staged(c))
		iscsi_conn_rx_run(c);
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

void iscsi_conn_enter(struct iscsi_conn *c) { conn_enter(c); }
void iscsi_conn_leave(struct iscsi_conn *c) { conn_leave(c); }

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
	if (c->state == CONN_LOGIN)
		iscsi_login_tick(c);
	if (c->state == CONN_LOGIN && now_ms() - c->last_rx_ms > LOGIN_TIMEOUT_MS)
		iscsi_conn_close(c, "login timed out");
	else if (c->state == CONN_FULL_FEATURE) {
		iscsi_nop_tick(c);
		c->ticks++;
		if (c->sess && c->sess->in_backstore)
			iscsi_cmd_overdue_tick(c);
	}
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
	c->rx_stage = malloc(ISCSI_RX_STAGE_SIZE);
	if (!c->rx_stage) {
		free(c);
		return NULL;
	}
	c->state = CONN_LOGIN;
	c->rx_want = ISCSI_RX_STAGE_SIZE;
	c->statsn = 1;
	c->last_rx_ms = now_ms();
	iscsi_params_default(&c->params);
	iscsi_conn_rx_reset(c);
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
