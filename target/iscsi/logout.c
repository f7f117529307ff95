/*
 * logout.c - Logout Request / Response (RFC 7143 11.14, 11.15).
 *
 * Closing the session or this connection (the same thing with
 * MaxConnections=1) is answered with success and the connection closes
 * once the response is written; removing a connection for recovery needs
 * ErrorRecoveryLevel 2 and is answered "recovery not supported". Time2Wait
 * and Time2Retain are 0: at ErrorRecoveryLevel 0 nothing is kept for a
 * later reconnect.
 *
 * Threading: the connection's worker thread.
 */
#include "target/iscsi/iscsi_int.h"

#include "common/log.h"

void iscsi_logout_pdu(struct iscsi_conn *c, const uint8_t *bhs)
{
	const struct iscsi_logout_req_hdr *h = (const struct iscsi_logout_req_hdr *)bhs;
	uint8_t reason = h->reason & ISCSI_LOGOUT_REASON_MASK;
	uint8_t response = ISCSI_LOGOUT_RSP_OK;

	if (!iscsi_sess_cmdsn_accept(c->sess, be32_get(h->cmdsn), bhs_immediate(bhs)))
		return;
	if (reason == ISCSI_LOGOUT_CLOSE_CONNECTION && be16_get(h->cid) != c->cid)
		response = ISCSI_LOGOUT_RSP_CID_NOT_FOUND;
	else if (reason == ISCSI_LOGOUT_REMOVE_FOR_RECOVERY)
		response = ISCSI_LOGOUT_RSP_NO_RECOVERY;
	else if (reason != ISCSI_LOGOUT_CLOSE_SESSION && reason != ISCSI_LOGOUT_CLOSE_CONNECTION)
		response = ISCSI_LOGOUT_RSP_CLEANUP_FAILED;

	struct iscsi_tx *tx = iscsi_tx_new(0);
	if (!tx) {
		iscsi_conn_close(c, "out of memory");
		return;
	}
	struct iscsi_logout_rsp_hdr *r = (struct iscsi_logout_rsp_hdr *)tx->hdr;
	r->opcode = ISCSI_OP_LOGOUT_RSP;
	r->flags = ISCSI_FLAG_FINAL;
	r->response = response;
	be32_put(r->itt, bhs_itt(bhs));
	iscsi_conn_fill_sn(c, tx->hdr, true);
	be16_put(r->time2wait, 0);
	be16_put(r->time2retain, 0);
	tx->close_after = response == ISCSI_LOGOUT_RSP_OK;
	if (response == ISCSI_LOGOUT_RSP_OK)
		log_info("iSCSI %s: %s logged out", c->peer, c->sess->initiator);
	iscsi_conn_send(c, tx);
}
