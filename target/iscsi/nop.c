/*
 * nop.c - NOP-Out / NOP-In in both directions (RFC 7143 11.18, 11.19).
 *
 * An initiator's ping (ITT != 0xffffffff) is answered with a NOP-In that
 * echoes its data. A NOP-Out with ITT 0xffffffff answers one of our pings
 * (matching TTT) or just updates ExpStatSN; it gets no reply. Our own
 * pings go out after nop_interval idle seconds; if nothing arrives for
 * nop_timeout seconds after a ping, the connection is dropped.
 *
 * Threading: the connection's worker thread (PDU handlers and the 1 s tick).
 */
#include "target/iscsi/iscsi_int.h"

#include "common/log.h"

#include <string.h>

void iscsi_nop_out_pdu(struct iscsi_conn *c, const uint8_t *bhs, const char *data, uint32_t dlen)
{
	const struct iscsi_nop_hdr *h = (const struct iscsi_nop_hdr *)bhs;
	uint32_t itt = bhs_itt(bhs), ttt = be32_get(h->ttt);

	if (ttt != ISCSI_RSVD_TAG) {
		if (ttt == c->ping_ttt)
			c->ping_ttt = 0;
		return; /* answer to our ping: no reply */
	}
	if (itt == ISCSI_RSVD_TAG)
		return; /* ExpStatSN update only (must be immediate) */
	if (!iscsi_sess_cmdsn_accept(c->sess, be32_get(h->sn24), bhs_immediate(bhs)))
		return;
	struct iscsi_tx *tx = iscsi_tx_new(dlen);
	if (!tx) {
		iscsi_conn_close(c, "out of memory");
		return;
	}
	struct iscsi_nop_hdr *r = (struct iscsi_nop_hdr *)tx->hdr;
	r->opcode = ISCSI_OP_NOP_IN;
	r->flags = ISCSI_FLAG_FINAL;
	memcpy(r->lun, h->lun, 8);
	be32_put(r->itt, itt);
	be32_put(r->ttt, ISCSI_RSVD_TAG);
	iscsi_conn_fill_sn(c, tx->hdr, true);
	if (dlen)
		memcpy(tx->payload, data, dlen);
	iscsi_conn_send(c, tx);
}

void iscsi_nop_tick(struct iscsi_conn *c)
{
	const struct iscsi_portal_cfg *cfg = iscsi_portal_cfg();
	uint64_t now = now_ms();
	static __thread uint32_t ping_seq;

	if (!cfg || cfg->nop_interval == 0)
		return;
	if (c->ping_ttt) {
		if (now - c->last_rx_ms >= (uint64_t)cfg->nop_timeout * 1000 &&
		    now - c->ping_sent_ms >= (uint64_t)cfg->nop_timeout * 1000) {
			log_warn("iSCSI %s: %s did not answer a NOP-In ping within %u s; dropping "
				 "the connection", c->peer, c->sess ? c->sess->initiator : "initiator",
				 cfg->nop_timeout);
			iscsi_conn_close(c, "NOP-In ping timed out");
		}
		return;
	}
	if (now - c->last_rx_ms < (uint64_t)cfg->nop_interval * 1000)
		return;
	struct iscsi_tx *tx = iscsi_tx_new(0);
	if (!tx)
		return;
	if (++ping_seq == ISCSI_RSVD_TAG || ping_seq == 0)
		ping_seq = 1;
	struct iscsi_nop_hdr *r = (struct iscsi_nop_hdr *)tx->hdr;
	r->opcode = ISCSI_OP_NOP_IN;
	r->flags = ISCSI_FLAG_FINAL;
	be32_put(r->itt, ISCSI_RSVD_TAG);
	be32_put(r->ttt, ping_seq);
	iscsi_conn_fill_sn(c, tx->hdr, false); /* a ping does not consume a StatSN */
	c->ping_ttt = ping_seq;
	c->ping_sent_ms = now;
	iscsi_conn_send(c, tx);
}
