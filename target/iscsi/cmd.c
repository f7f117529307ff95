/*
 * cmd.c - SCSI Command PDUs to struct scsi_cmd and back (RFC 7143 11.3,
 * 11.4, 11.7, 11.8).
 *
 * Life of a command (struct iscsi_cmd, from the session's pool):
 *  1. Its header arrives (iscsi_cmd_rx_header): CmdSN is checked, a pooled
 *     buffer of Expected Data Transfer Length bytes is taken and immediate
 *     data is received straight into it.
 *  2. Writes then collect unsolicited Data-Out (InitialR2T=No, up to
 *     FirstBurstLength) and solicited Data-Out, asking with R2Ts of at most
 *     MaxBurstLength, at most MaxOutstandingR2T at a time. Every Data-Out is
 *     checked (TTT, DataSN, BufferOffset, length) before its payload is read
 *     into the buffer at BufferOffset.
 *  3. With all data in, the command goes to the backstore (scsi_cmd_submit).
 *  4. On done(): Data-In PDUs no larger than the initiator's
 *     MaxRecvDataSegmentLength are written from the buffer; status rides on
 *     the final Data-In (S bit) when there is no sense data, otherwise a
 *     SCSI Response carries it. Residual over/underflow compares the CDB's
 *     transfer length with the Expected Data Transfer Length.
 * Bidirectional commands are refused with CHECK CONDITION.
 *
 * A Data-Out out of sequence (DataSN, BufferOffset, length beyond its R2T)
 * fails its command with CHECK CONDITION / ABORTED COMMAND / DATA PHASE
 * ERROR (ASC 0x4b) and the rest of its data is dropped; the session goes
 * on. Data-Out for a command that is gone (aborted, failed) is dropped
 * silently.
 *
 * Threading: the connection's worker thread; backstore completions arrive
 * there too.
 */
#include "target/iscsi/iscsi_int.h"

#include "common/bufpool.h"
#include "common/log.h"

#include <string.h>

/* SPC sense codes used when the front end itself fails a command */

static void cmd_pump(struct iscsi_conn *c, struct iscsi_cmd *cmd);

/* The command's data: its buffers, and the LU held while Data-In goes out from a file. */
static void cmd_free_bufs(struct iscsi_cmd *cmd)
{
	scsi_cmd_data_sent(&cmd->sc);
	for (int i = 0; i < cmd->nbufs; i++)
		buf_put(cmd->bufs[i], cmd->buf_req[i]);
	cmd->nbufs = 0;
}

static int cmd_alloc_bufs(struct iscsi_cmd *cmd, uint32_t len)
{
	uint32_t left = len;

	cmd->nbufs = 0;
	while (left) {
		uint32_t chunk = left > BUF_MAX ? BUF_MAX : left;
		void *p;
		if (cmd->nbufs == ISCSI_CMD_MAX_BUFS || !(p = buf_get(chunk))) {
			cmd_free_bufs(cmd);
			return -1;
		}
		cmd->bufs[cmd->nbufs] = p;
		cmd->buf_req[cmd->nbufs] = chunk;
		cmd->iov[cmd->nbufs].iov_base = p;
		cmd->iov[cmd->nbufs].iov_len = chunk;
		cmd->nbufs++;
		left -= chunk;
	}
	return 0;
}

/* Describe bytes [off, off + len) of the command buffer as iovecs. */
static int cmd_map(const struct iscsi_cmd *cmd, uint32_t off, uint32_t len, struct iovec *out)
{
	int n = 0;
	for (int i = 0; i < cmd->nbufs && len; i++) {
		size_t bl = cmd->iov[i].iov_len;
		if (off >= bl) {
			off -= (uint32_t)bl;
			continue;
		}
		size_t take = bl - off < len ? bl - off : len;
		out[n].iov_base = (char *)cmd->iov[i].iov_base + off;
		out[n].iov_len = take;
		n++;
		len -= (uint32_t)take;
		off = 0;
	}
	return n;
}

static void cmd_free(struct iscsi_cmd *cmd)
{
	struct iscsi_conn *c = cmd->sess->conn;
	if (cmd->tx.queued && c)
		iscsi_conn_unqueue(c, &cmd->tx);
	cmd_free_bufs(cmd);
	iscsi_cmd_put(cmd);
}

static void cmd_sent(struct iscsi_conn *c, struct iscsi_tx *tx)
{
	struct iscsi_cmd *cmd = (struct iscsi_cmd *)((char *)tx - offsetof(struct iscsi_cmd, tx));
	if (cmd->aborted && cmd->state != CMD_BACKSTORE) {
		cmd_free(cmd);
		return;
	}
	cmd_pump(c, cmd);
}

static void send_r2t(struct iscsi_conn *c, struct iscsi_cmd *cmd, struct iscsi_r2t_slot *slot)
{
	struct iscsi_r2t_hdr *h = (struct iscsi_r2t_hdr *)cmd->tx.hdr;

	memset(h, 0, ISCSI_BHS_LEN);
	h->opcode = ISCSI_OP_R2T;
	h->flags = ISCSI_FLAG_FINAL;
	memcpy(h->lun, cmd->lun_raw, 8);
	be32_put(h->itt, cmd->itt);
	be32_put(h->ttt, slot->ttt);
	iscsi_conn_fill_sn(c, cmd->tx.hdr, false);
	be32_put(h->r2tsn, slot->r2tsn);
	be32_put(h->buffer_offset, slot->offset);
	be32_put(h->desired_len, slot->len);
	cmd->tx.data_iovcnt = 0;
	cmd->tx.data_len = 0;
	cmd->tx.file_fd = -1;
	cmd->tx.sent_cb = cmd_sent;
	slot->sent = true;
	iscsi_conn_send(c, &cmd->tx);
}

static void compute_residual(struct iscsi_cmd *cmd, uint8_t *flags, uint32_t *count)
{
	uint32_t edtl = cmd->edtl, xfer = cmd->sc.cdb_xfer_len;

	*flags = 0;
	*count = 0;
	if (xfer > edtl) {
		*flags = ISCSI_RSP_OVERFLOW;
		*count = xfer - edtl;
	} else if (cmd->sc.dir & SCSI_DIR_WRITE) {
		if (xfer < edtl) {
			*flags = ISCSI_RSP_UNDERFLOW;
			*count = edtl - xfer;
		}
	} else if (cmd->datain_len < edtl) {
		*flags = ISCSI_RSP_UNDERFLOW;
		*count = edtl - cmd->datain_len;
	}
}

static void send_data_in(struct iscsi_conn *c, struct iscsi_cmd *cmd)
{
	struct iscsi_sess *s = cmd->sess;
	struct iscsi_data_in_hdr *h = (struct iscsi_data_in_hdr *)cmd->tx.hdr;
	uint32_t len = cmd->datain_len - cmd->datain_off;

	if (cmd->burst_left == 0)
		cmd->burst_left = s->params.max_burst;
	if (len > c->params.initiator_mrdsl)
		len = c->params.initiator_mrdsl;
	if (len > cmd->burst_left)
		len = cmd->burst_left;
	bool last = cmd->datain_off + len == cmd->datain_len;
	cmd->burst_left -= len;

	memset(h, 0, ISCSI_BHS_LEN);
	h->opcode = ISCSI_OP_DATA_IN;
	if (last || cmd->burst_left == 0)
		h->flags |= ISCSI_FLAG_FINAL;
	memcpy(h->lun, cmd->lun_raw, 8);
	be32_put(h->itt, cmd->itt);
	be32_put(h->ttt, ISCSI_RSVD_TAG);
	be32_put(h->datasn, cmd->datasn++);
	be32_put(h->buffer_offset, cmd->datain_off);
	if (last && cmd->sc.sense_len == 0) {
		uint8_t rflags;
		uint32_t residual;
		compute_residual(cmd, &rflags, &residual);
		h->flags |= ISCSI_DATAIN_STATUS | rflags | ISCSI_FLAG_FINAL;
		h->status = cmd->sc.status;
		be32_put(h->residual, residual);
		iscsi_conn_fill_sn(c, cmd->tx.hdr, true);
		cmd->status_sent = true;
	} else {
		iscsi_conn_fill_sn(c, cmd->tx.hdr, false);
		be32_put(h->statsn, 0);
	}
	if (cmd->sc.data_fd >= 0) {
		cmd->tx.data_iovcnt = 0;
		cmd->tx.file_fd = cmd->sc.data_fd;
		cmd->tx.file_off = cmd->sc.data_fd_off + cmd->datain_off;
	} else {
		cmd->tx.data_iovcnt = cmd_map(cmd, cmd->datain_off, len, cmd->tx.data);
		cmd->tx.file_fd = -1;
	}
	cmd->tx.data_len = len;
	cmd->datain_off += len;
	cmd->tx.sent_cb = cmd_sent;
	iscsi_conn_send(c, &cmd->tx);
}

static void send_response(struct iscsi_conn *c, struct iscsi_cmd *cmd)
{
	struct iscsi_scsi_rsp_hdr *h = (struct iscsi_scsi_rsp_hdr *)cmd->tx.hdr;
	uint8_t rflags;
	uint32_t residual;

	compute_residual(cmd, &rflags, &residual);
	memset(h, 0, ISCSI_BHS_LEN);
	h->opcode = ISCSI_OP_SCSI_RSP;
	h->flags = ISCSI_FLAG_FINAL | rflags;
	h->response = 0; /* command completed at target */
	h->status = cmd->sc.status;
	be32_put(h->itt, cmd->itt);
	iscsi_conn_fill_sn(c, cmd->tx.hdr, true);
	be32_put(h->exp_datasn, (cmd->sc.dir & SCSI_DIR_WRITE) ? cmd->r2tsn : cmd->datasn);
	be32_put(h->residual, residual);
	cmd->tx.data_iovcnt = 0;
	cmd->tx.data_len = 0;
	cmd->tx.file_fd = -1;
	if (cmd->sc.sense_len) {
		uint8_t sl = cmd->sc.sense_len > SCSI_SENSE_MAX ? SCSI_SENSE_MAX : cmd->sc.sense_len;
		be16_put(cmd->rsp_data, sl);
		memcpy(cmd->rsp_data + 2, cmd->sc.sense, sl);
		cmd->tx.data[0].iov_base = cmd->rsp_data;
		cmd->tx.data[0].iov_len = 2u + sl;
		cmd->tx.data_iovcnt = 1;
		cmd->tx.data_len = 2u + sl;
	}
	cmd->status_sent = true;
	cmd->tx.sent_cb = cmd_sent;
	iscsi_conn_send(c, &cmd->tx);
}

/* Queue the command's next PDU, if any; free it when all are out. */
static void cmd_pump(struct iscsi_conn *c, struct iscsi_cmd *cmd)
{
	if (cmd->tx.queued)
		return;
	if (cmd->state == CMD_RECV_DATA) {
		for (int i = 0; i < ISCSI_MAX_R2T; i++) {
			if (cmd->r2t[i].active && !cmd->r2t[i].sent) {
				send_r2t(c, cmd, &cmd->r2t[i]);
				return;
			}
		}
		return;
	}
	if (cmd->state != CMD_SENDING)
		return;
	if (cmd->datain_off < cmd->datain_len) {
		send_data_in(c, cmd);
		return;
	}
	if (!cmd->status_sent) {
		send_response(c, cmd);
		return;
	}
	cmd_free(cmd);
}

static void cmd_respond(struct iscsi_conn *c, struct iscsi_cmd *cmd)
{
	cmd->state = CMD_SENDING;
	cmd->datain_off = 0;
	cmd->datain_len = 0;
	if ((cmd->sc.dir & SCSI_DIR_READ) && !cmd->failed) {
		cmd->datain_len = cmd->sc.data_in_len;
		if (cmd->datain_len > cmd->edtl)
			cmd->datain_len = cmd->edtl;
	}
	cmd->burst_left = 0;
	cmd_pump(c, cmd);
}

/* Fail before the backstore sees it: CHECK CONDITION with this sense. */
static void cmd_fail(struct iscsi_cmd *cmd, uint8_t key, uint16_t asc_ascq)
{
	cmd->failed = true;
	cmd->sc.status = SAM_STAT_CHECK_CONDITION;
	cmd->sc.data_in_len = 0;
	cmd->sc.cdb_xfer_len = 0;
	scsi_cmd_set_sense(&cmd->sc, key, asc_ascq);
}

static void cmd_done(struct scsi_cmd *sc)
{
	struct iscsi_cmd *cmd = sc->fe_priv;
	struct iscsi_sess *s = cmd->sess;
	struct iscsi_conn *c = s->conn;

	s->in_backstore--;
	iscsi_conn_enter(c);
	if (cmd->overdue) {
		/* answered already; its answer may still be on its way out */
		if (cmd->tx.queued && c->state != CONN_CLOSING)
			cmd->state = CMD_SENDING; /* cmd_sent frees it */
		else
			cmd_free(cmd);
	} else if (cmd->aborted) {
		struct iscsi_remote_abort *tok = cmd->remote_tok;
		cmd_free(cmd);
		s->aborted_inflight--;
		if (tok)
			iscsi_tmf_remote_put(tok);
		if (c->state != CONN_CLOSING)
			iscsi_tmf_aborted_done(s);
	} else if (c->state == CONN_CLOSING) {
		cmd_free(cmd);
	} else {
		cmd_respond(c, cmd);
	}
	iscsi_conn_leave(c);
}

static void cmd_submit(struct iscsi_conn *c, struct iscsi_cmd *cmd)
{
	if (cmd->failed) {
		cmd_respond(c, cmd);
		return;
	}
	cmd->state = CMD_BACKSTORE;
	cmd->sc.iov = cmd->iov;
	cmd->sc.iovcnt = cmd->nbufs;
	cmd->sc.write_len = (cmd->sc.dir & SCSI_DIR_WRITE) ? cmd->edtl : 0;
	cmd->sc.read_len = (cmd->sc.dir & SCSI_DIR_READ) ? cmd->edtl : 0;
	cmd->sess->in_backstore++;
	cmd->sent_tick = c->ticks;
	scsi_cmd_submit(&cmd->sc);
}

/* Open R2T slots while allowed, then queue what is unsent. */
static void cmd_solicit(struct iscsi_conn *c, struct iscsi_cmd *cmd)
{
	struct iscsi_sess *s = cmd->sess;
	unsigned max = s->params.max_outstanding_r2t;
	unsigned active = 0;

	if (max > ISCSI_MAX_R2T)
		max = ISCSI_MAX_R2T;
	for (int i = 0; i < ISCSI_MAX_R2T; i++)
		active += cmd->r2t[i].active;
	for (int i = 0; i < ISCSI_MAX_R2T && active < max && cmd->r2t_next < cmd->edtl; i++) {
		struct iscsi_r2t_slot *slot = &cmd->r2t[i];
		if (slot->active)
			continue;
		uint32_t len = cmd->edtl - cmd->r2t_next;
		if (len > s->params.max_burst)
			len = s->params.max_burst;
		slot->active = true;
		slot->sent = false;
		slot->offset = cmd->r2t_next;
		slot->len = len;
		slot->received = 0;
		slot->next_datasn = 0;
		slot->r2tsn = cmd->r2tsn++;
		if (++s->ttt_gen == 0xffff)
			s->ttt_gen = 0;
		slot->ttt = (uint32_t)s->ttt_gen << 16 | cmd->idx;
		cmd->r2t_next += len;
		active++;
	}
	cmd_pump(c, cmd);
}

static void cmd_progress(struct iscsi_conn *c, struct iscsi_cmd *cmd)
{
	if (cmd->received >= cmd->edtl || !(cmd->sc.dir & SCSI_DIR_WRITE)) {
		cmd_submit(c, cmd);
		return;
	}
	cmd_solicit(c, cmd);
}

void iscsi_cmd_rx_header(struct iscsi_conn *c, const uint8_t *bhs)
{
	const struct iscsi_scsi_cmd_hdr *h = (const struct iscsi_scsi_cmd_hdr *)bhs;
	struct iscsi_sess *s = c->sess;
	uint32_t dsl = bhs_dsl(bhs);
	bool imm = bhs_immediate(bhs);
	bool rd = h->flags & ISCSI_CMD_READ, wr = h->flags & ISCSI_CMD_WRITE;
	uint32_t edtl = be32_get(h->edtl);
	struct iscsi_cmd *cmd;

	c->rx_discard = dsl > 0;
	if (s->discovery) {
		c->rx_reject = ISCSI_REJECT_PROTOCOL_ERROR;
		return;
	}
	if (!iscsi_sess_cmdsn_accept(s, be32_get(h->cmdsn), imm)) {
		c->rx_ignore = true;
		return;
	}
	if (dsl && (!wr || dsl > edtl || !s->params.immediate_data ||
		    dsl > s->params.first_burst)) {
		log_warn("iSCSI %s: SCSI command with %u bytes of immediate data that the "
			 "negotiated parameters do not allow; rejecting", c->peer, dsl);
		c->rx_reject = ISCSI_REJECT_PROTOCOL_ERROR;
		return;
	}
	cmd = iscsi_cmd_get(s, imm);
	if (!cmd) {
		c->rx_reject = imm ? ISCSI_REJECT_IMMEDIATE_CMD : ISCSI_REJECT_LONG_OP;
		return;
	}
	cmd->state = CMD_RECV_DATA;
	cmd->itt = bhs_itt(bhs);
	cmd->cmdsn = be32_get(h->cmdsn);
	cmd->edtl = edtl;
	memcpy(cmd->lun_raw, h->lun, 8);
	memset(cmd->sc.cdb, 0, SCSI_CDB_MAX);
	memcpy(cmd->sc.cdb, h->cdb, 16);
	unsigned cdb_len = scsi_cdb_len(h->cdb);
	cmd->sc.cdb_len = (uint8_t)(cdb_len < 16 ? cdb_len : 16);
	cmd->sc.task_attr = h->flags & ISCSI_CMD_ATTR_MASK;
	cmd->sc.dir = (rd ? SCSI_DIR_READ : 0) | (wr ? SCSI_DIR_WRITE : 0);
	cmd->sc.lun = iscsi_lun_decode(h->lun);
	cmd->sc.tag = cmd->itt;
	cmd->sc.nexus = s->nexus;
	cmd->sc.iov = NULL;
	cmd->sc.iovcnt = 0;
	cmd->sc.write_len = cmd->sc.read_len = 0;
	cmd->sc.done = cmd_done;
	cmd->sc.fe_priv = cmd;
	cmd->sc.fe_data_fd = !c->params.data_digest; /* a data digest needs the bytes here */
	cmd->sc.data_fd = -1;
	cmd->sc.status = SAM_STAT_GOOD;
	cmd->sc.sense_len = 0;
	cmd->sc.data_in_len = 0;
	cmd->sc.cdb_xfer_len = 0;
	c->rx_cmd = cmd;

	/* Extended CDB AHS (type 1) for CDBs longer than 16 bytes. */
	if (bhs[4]) {
		const uint8_t *ahs = bhs + ISCSI_BHS_LEN;
		uint16_t alen = be16_get(ahs);
		if (ahs[2] == 1 && alen >= 2 && 16u + alen - 1 <= SCSI_CDB_MAX &&
		    (uint32_t)alen + 3 <= (uint32_t)bhs[4] * 4) {
			memcpy(cmd->sc.cdb + 16, ahs + 4, alen - 1u);
			cmd->sc.cdb_len = (uint8_t)(16 + alen - 1);
		} else if (ahs[2] == 1) {
			cmd_fail(cmd, SK_ILLEGAL_REQUEST, ASC_INVALID_FIELD_IN_CDB);
		}
	}
	/* A CDB that says it is longer than the bytes that came (a
	 * variable-length CDB without its extended CDB AHS) is not run on a
	 * guess at the rest. */
	if (!cmd->failed && cdb_len > cmd->sc.cdb_len)
		cmd_fail(cmd, SK_ILLEGAL_REQUEST, ASC_INVALID_FIELD_IN_CDB);
	if (rd && wr) {
		cmd_fail(cmd, SK_ILLEGAL_REQUEST, ASC_INVALID_FIELD_IN_CDB);
	} else if ((rd || wr) && edtl) {
		if (edtl > (uint32_t)ISCSI_CMD_MAX_BUFS * BUF_MAX) {
			cmd_fail(cmd, SK_ILLEGAL_REQUEST, ASC_INVALID_FIELD_IN_CDB);
		} else if (cmd_alloc_bufs(cmd, edtl) < 0) {
			cmd->failed = true;
			cmd->sc.status = SAM_STAT_TASK_SET_FULL;
		}
	}
	if (wr && !cmd->failed) {
		cmd->unsol_expected = dsl;
		if (!s->params.initial_r2t && !(h->flags & ISCSI_FLAG_FINAL)) {
			uint32_t fb = s->params.first_burst;
			cmd->unsol_expected = edtl < fb ? edtl : fb;
			if (cmd->unsol_expected < dsl)
				cmd->unsol_expected = dsl;
		} else {
			cmd->unsol_final = true;
		}
		cmd->r2t_next = cmd->unsol_expected;
	}
	if (dsl && !cmd->failed) {
		c->rx_discard = false;
		c->rx_iovcnt = cmd_map(cmd, 0, dsl, c->rx_iov);
	}
}

void iscsi_cmd_rx_data_done(struct iscsi_conn *c, const uint8_t *bhs, bool digest_ok)
{
	struct iscsi_cmd *cmd = c->rx_cmd;
	uint32_t dsl = bhs_dsl(bhs);

	if (c->rx_reject) {
		iscsi_reject(c, c->rx_reject, bhs);
		return;
	}
	if (c->rx_ignore || !cmd)
		return;
	if (!digest_ok) {
		/* The command never happened; the initiator retries it. */
		log_warn("iSCSI %s: data digest error in immediate data (ITT 0x%x)", c->peer, cmd->itt);
		iscsi_reject(c, ISCSI_REJECT_DATA_DIGEST, bhs);
		cmd_free(cmd);
		return;
	}
	if (cmd->failed) {
		cmd_respond(c, cmd);
		return;
	}
	cmd->received = dsl;
	cmd->unsol_received = dsl;
	cmd_progress(c, cmd);
}

/*
 * A Data-Out that breaks the sequence (DataSN, BufferOffset, length): the
 * command fails with CHECK CONDITION, ABORTED COMMAND / DATA PHASE ERROR,
 * its remaining Data-Out PDUs are dropped, the connection stays up.
 */
static void data_phase_error(struct iscsi_conn *c, struct iscsi_cmd *cmd, uint16_t asc_ascq)
{
	c->rx_ignore = true;
	for (int i = 0; i < ISCSI_MAX_R2T; i++)
		if (!cmd->r2t[i].sent)
			cmd->r2t[i].active = false;
	cmd_fail(cmd, SK_ABORTED_COMMAND, asc_ascq);
	cmd_respond(c, cmd);
}

void iscsi_data_out_rx_header(struct iscsi_conn *c, const uint8_t *bhs)
{
	const struct iscsi_data_out_hdr *h = (const struct iscsi_data_out_hdr *)bhs;
	struct iscsi_sess *s = c->sess;
	uint32_t dsl = bhs_dsl(bhs), itt = bhs_itt(bhs), ttt = be32_get(h->ttt);
	uint32_t datasn = be32_get(h->datasn), off = be32_get(h->buffer_offset);
	struct iscsi_cmd *cmd = NULL;
	struct iscsi_r2t_slot *slot = NULL;

	c->rx_discard = dsl > 0;
	if (s->discovery) {
		c->rx_reject = ISCSI_REJECT_PROTOCOL_ERROR;
		return;
	}
	if (ttt == ISCSI_RSVD_TAG) {
		cmd = iscsi_cmd_by_itt(s, itt);
		if (!cmd || cmd->state != CMD_RECV_DATA || cmd->failed) {
			c->rx_ignore = true; /* late data of an aborted or failed command */
			return;
		}
		if (cmd->unsol_final || datasn != cmd->unsol_datasn || off != cmd->unsol_received ||
		    (uint64_t)off + dsl > cmd->unsol_expected) {
			log_warn("iSCSI %s: unsolicited Data-Out out of sequence (ITT 0x%x DataSN %u "
				 "offset %u length %u); failing the command", c->peer, itt, datasn,
				 off, dsl);
			data_phase_error(c, cmd, datasn != cmd->unsol_datasn ? ASC_DATA_PHASE_ERROR :
					 off != cmd->unsol_received ? ASC_DATA_OFFSET_ERROR :
					 ASC_TOO_MUCH_WRITE_DATA);
			return;
		}
	} else {
		uint32_t idx = ttt & 0xffff;
		if (idx < ISCSI_POOL_SIZE && s->pool[idx].state == CMD_RECV_DATA &&
		    s->pool[idx].itt == itt && !s->pool[idx].aborted)
			cmd = &s->pool[idx];
		for (int i = 0; cmd && i < ISCSI_MAX_R2T; i++)
			if (cmd->r2t[i].active && cmd->r2t[i].ttt == ttt)
				slot = &cmd->r2t[i];
		if (!slot) {
			c->rx_ignore = true; /* stale TTT: the command is gone */
			return;
		}
		if (datasn != slot->next_datasn || off != slot->offset + slot->received ||
		    dsl > slot->len - slot->received) {
			log_warn("iSCSI %s: Data-Out out of sequence (ITT 0x%x TTT 0x%x DataSN %u, "
				 "expected %u; offset %u, expected %u; length %u); failing the command",
				 c->peer, itt, ttt, datasn, slot->next_datasn, off,
				 slot->offset + slot->received, dsl);
			data_phase_error(c, cmd, datasn != slot->next_datasn ? ASC_DATA_PHASE_ERROR :
					 off != slot->offset + slot->received ? ASC_DATA_OFFSET_ERROR :
					 ASC_TOO_MUCH_WRITE_DATA);
			return;
		}
	}
	c->rx_cmd = cmd;
	c->rx_slot = slot;
	if (dsl) {
		c->rx_discard = false;
		c->rx_iovcnt = cmd_map(cmd, off, dsl, c->rx_iov);
	}
}

void iscsi_data_out_rx_data_done(struct iscsi_conn *c, const uint8_t *bhs, bool digest_ok)
{
	struct iscsi_cmd *cmd = c->rx_cmd;
	struct iscsi_r2t_slot *slot = c->rx_slot;
	uint32_t dsl = bhs_dsl(bhs);

	if (c->rx_reject) {
		iscsi_reject(c, c->rx_reject, bhs);
		return;
	}
	if (c->rx_ignore || !cmd)
		return;
	if (!digest_ok && !cmd->failed) {
		log_warn("iSCSI %s: data digest error in Data-Out (ITT 0x%x)", c->peer, cmd->itt);
		iscsi_reject(c, ISCSI_REJECT_DATA_DIGEST, bhs);
		cmd_fail(cmd, SK_ABORTED_COMMAND, ASC_DATA_PHASE_CRC_ERROR);
	}
	if (slot) {
		slot->received += dsl;
		slot->next_datasn++;
		if (slot->received == slot->len)
			slot->active = false;
	} else {
		cmd->unsol_received += dsl;
		cmd->unsol_datasn++;
		if (bhs[1] & ISCSI_FLAG_FINAL) {
			cmd->unsol_final = true;
			if (cmd->unsol_received < cmd->unsol_expected) {
				/* Fewer unsolicited bytes than promised: solicit the gap. */
				for (int i = 0; i < ISCSI_MAX_R2T; i++) {
					struct iscsi_r2t_slot *g = &cmd->r2t[i];
					if (g->active)
						continue;
					g->active = true;
					g->sent = false;
					g->offset = cmd->unsol_received;
					g->len = cmd->unsol_expected - cmd->unsol_received;
					g->received = 0;
					g->next_datasn = 0;
					g->r2tsn = cmd->r2tsn++;
					if (++cmd->sess->ttt_gen == 0xffff)
						cmd->sess->ttt_gen = 0;
					g->ttt = (uint32_t)cmd->sess->ttt_gen << 16 | cmd->idx;
					break;
				}
			}
		}
	}
	cmd->received += dsl;
	if (cmd->received >= cmd->edtl) {
		cmd_submit(c, cmd);
		return;
	}
	cmd_progress(c, cmd);
}

bool iscsi_cmd_abort(struct iscsi_cmd *cmd)
{
	struct iscsi_conn *c = cmd->sess->conn;

	switch (cmd->state) {
	case CMD_BACKSTORE:
		if (cmd->overdue)
			return false; /* nothing waits for it any more */
		if (!cmd->aborted) {
			cmd->aborted = true;
			cmd->sess->aborted_inflight++;
			/* still queued in the backstore: it ends at once (posted) */
			scsi_cmd_cancel(&cmd->sc);
		}
		return true;
	case CMD_RECV_DATA:
		if (cmd->tx.queued && c && !iscsi_conn_unqueue(c, &cmd->tx)) {
			cmd->aborted = true; /* mid-write: freed when the PDU is out */
			return false;
		}
		cmd_free(cmd);
		return false;
	default:
		return false;
	}
}

/* CHECK CONDITION for a command the backstore still holds past io_timeout. */
static void send_overdue(struct iscsi_conn *c, struct iscsi_cmd *cmd)
{
	struct iscsi_scsi_rsp_hdr *h = (struct iscsi_scsi_rsp_hdr *)cmd->tx.hdr;
	size_t sl = scsi_cmd_overdue_sense(&cmd->sc, cmd->rsp_data + 2, SCSI_SENSE_MAX);

	memset(h, 0, ISCSI_BHS_LEN);
	h->opcode = ISCSI_OP_SCSI_RSP;
	h->flags = ISCSI_FLAG_FINAL;
	h->response = 0; /* command completed at target */
	h->status = SAM_STAT_CHECK_CONDITION;
	be32_put(h->itt, cmd->itt);
	iscsi_conn_fill_sn(c, cmd->tx.hdr, true);
	be32_put(h->exp_datasn, (cmd->sc.dir & SCSI_DIR_WRITE) ? cmd->r2tsn : cmd->datasn);
	be16_put(cmd->rsp_data, (uint16_t)sl);
	cmd->tx.data[0].iov_base = cmd->rsp_data;
	cmd->tx.data[0].iov_len = 2u + sl;
	cmd->tx.data_iovcnt = 1;
	cmd->tx.data_len = (uint32_t)(2u + sl);
	cmd->tx.file_fd = -1;
	cmd->status_sent = true;
	cmd->tx.sent_cb = cmd_sent;
	iscsi_conn_send(c, &cmd->tx);
}

void iscsi_cmd_overdue_tick(struct iscsi_conn *c)
{
	struct iscsi_sess *s = c->sess;
	struct iscsi_cmd *cmd, *next;
	bool let_go = false;

	for (cmd = s->active.next; cmd != &s->active; cmd = next) {
		next = cmd->next;
		if (cmd->state != CMD_BACKSTORE || cmd->overdue)
			continue;
		/* whole ticks since the one before it was sent: never more than its age */
		uint32_t ticks = c->ticks - cmd->sent_tick;
		uint64_t age_ms = ticks > 1 ? (uint64_t)(ticks - 1) * 1000 : 0;
		if (!scsi_cmd_overdue(&cmd->sc, age_ms))
			continue;
		cmd->overdue = true;
		log_debug("iSCSI %s: ITT 0x%x (opcode 0x%02x) past io_timeout", c->peer, cmd->itt, cmd->sc.cdb[0]);
		if (cmd->aborted) {
			/* a task management function waits for it: not any more */
			struct iscsi_remote_abort *tok = cmd->remote_tok;
			cmd->remote_tok = NULL;
			s->aborted_inflight--;
			if (tok)
				iscsi_tmf_remote_put(tok);
			let_go = true;
			continue;
		}
		cmd->aborted = true; /* its late status is dropped; ITT lookups pass it by */
		send_overdue(c, cmd);
	}
	if (let_go)
		iscsi_tmf_aborted_done(s);
}

void iscsi_cmd_release_all(struct iscsi_sess *s)
{
	struct iscsi_cmd *cmd, *next;

	for (cmd = s->active.next; cmd != &s->active; cmd = next) {
		next = cmd->next;
		if (cmd->state == CMD_BACKSTORE)
			continue; /* freed by done() */
		cmd->tx.queued = false;
		cmd_free_bufs(cmd);
		iscsi_cmd_put(cmd);
	}
}
