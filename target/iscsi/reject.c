/*
 * reject.c - Reject PDUs (RFC 7143 11.17) and Asynchronous Messages (11.9).
 *
 * A Reject carries the reason and, as its data segment, the complete
 * header of the PDU being rejected so the initiator can tell which one.
 * At ErrorRecoveryLevel 0 a protocol error in the data phase leaves no way
 * to resynchronise, so iscsi_reject_close queues the Reject and closes the
 * connection once it has been written.
 *
 * Threading: the connection's worker thread.
 */
#include "target/iscsi/iscsi_int.h"

#include "common/log.h"

#include <string.h>

static void queue_reject(struct iscsi_conn *c, uint8_t reason, const uint8_t *bhs, bool close)
{
	struct iscsi_tx *tx = iscsi_tx_new(ISCSI_BHS_LEN);
	if (!tx) {
		iscsi_conn_close(c, "out of memory");
		return;
	}
	struct iscsi_reject_hdr *h = (struct iscsi_reject_hdr *)tx->hdr;
	h->opcode = ISCSI_OP_REJECT;
	h->flags = ISCSI_FLAG_FINAL;
	h->reason = reason;
	be32_put(h->itt, ISCSI_RSVD_TAG);
	iscsi_conn_fill_sn(c, tx->hdr, true);
	memcpy(tx->payload, bhs, ISCSI_BHS_LEN);
	tx->close_after = close;
	iscsi_conn_send(c, tx);
}

void iscsi_reject(struct iscsi_conn *c, uint8_t reason, const uint8_t *bhs)
{
	queue_reject(c, reason, bhs, false);
}

void iscsi_reject_close(struct iscsi_conn *c, uint8_t reason, const uint8_t *bhs, const char *why)
{
	log_debug("iSCSI %s: rejecting opcode 0x%02x (reason 0x%02x) and closing: %s", c->peer,
		  bhs_opcode(bhs), reason, why);
	queue_reject(c, reason, bhs, true);
}

void iscsi_async_logout_request(struct iscsi_conn *c, uint16_t wait_seconds, bool close_after)
{
	struct iscsi_tx *tx = iscsi_tx_new(0);
	if (!tx)
		return;
	struct iscsi_async_hdr *h = (struct iscsi_async_hdr *)tx->hdr;
	h->opcode = ISCSI_OP_ASYNC;
	h->flags = ISCSI_FLAG_FINAL;
	be32_put(h->itt, ISCSI_RSVD_TAG);
	iscsi_conn_fill_sn(c, tx->hdr, true);
	h->event = ISCSI_ASYNC_REQUEST_LOGOUT;
	/* Parameter3: seconds the initiator has to log out. */
	be16_put(h->param3, wait_seconds);
	tx->close_after = close_after;
	iscsi_conn_send(c, tx);
}
