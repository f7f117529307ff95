/*
 * tmf.c - Task Management Function requests (RFC 7143 11.5, 11.6).
 *
 * ABORT TASK, ABORT TASK SET, CLEAR TASK SET, LOGICAL UNIT RESET and
 * TARGET WARM/COLD RESET first take the affected commands of this session
 * away from the normal path: a command still receiving data is freed at
 * once; a command inside the backstore is marked aborted so its response
 * is dropped when it comes back. The TMF response waits (struct
 * iscsi_tmf_wait) until every aborted command has come back; only then is
 * scsi_task_mgmt called for the SAM side effects (unit attentions,
 * reservation release) and the response sent - so the initiator never sees
 * a response for a task after the TMF response that aborted it.
 * A command whose response is already on its way counts as completed:
 * ABORT TASK answers "task does not exist" for it.
 *
 * CLEAR TASK SET, LOGICAL UNIT RESET and TARGET WARM/COLD RESET affect
 * every initiator's tasks, not only this session's: the other sessions of
 * the target (on any worker) are sent a posted request to abort theirs
 * the same way, and a shared token (struct iscsi_remote_abort) counts the
 * aborted commands still in the backstore across all of them; when it
 * reaches zero the requesting session is told (posted back to its
 * worker) and its TMF response may go.
 *
 * TARGET COLD RESET, when the backstore performs it, also drops the
 * connection after the response (RFC 7143 11.5.1). TASK REASSIGN needs
 * ErrorRecoveryLevel 2: "allegiance reassignment not supported".
 *
 * Threading: the connection's worker thread.
 */
#include "target/iscsi/iscsi_int.h"

#include "common/log.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

struct iscsi_remote_abort {
	atomic_int pending;        /* aborted commands + requests in flight + 1 guard */
	struct iscsi_sess *origin; /* referenced until done */
	uint64_t lun;
	int posted;                /* requests posted (under the table lock) */
};

struct remote_req {
	struct iscsi_remote_abort *tok;
	struct iscsi_sess *sess;   /* referenced */
};

struct iscsi_tmf_wait {
	struct iscsi_tmf_wait *next;
	uint32_t itt;
	uint8_t function;
	uint64_t lun;
	int response;      /* -1: ask scsi_task_mgmt when the aborts are done */
};

/* The backstore's service responses are the values iSCSI sends. */
_Static_assert(SCSI_TMF_RSP_COMPLETE == ISCSI_TMF_RSP_COMPLETE && SCSI_TMF_RSP_NO_TASK == ISCSI_TMF_RSP_NO_TASK &&
	       SCSI_TMF_RSP_NO_LUN == ISCSI_TMF_RSP_NO_LUN && SCSI_TMF_RSP_NOT_SUPPORTED == ISCSI_TMF_RSP_NOT_SUPPORTED,
	       "TMF response codes");

static void tmf_send(struct iscsi_conn *c, struct iscsi_tmf_wait *w)
{
	struct iscsi_sess *s = c->sess;
	int response = w->response;
	bool close_after = false;

	if (response < 0) {
		response = s->nexus ? scsi_task_mgmt(s->nexus, (enum scsi_tmf)w->function, w->lun)
				    : ISCSI_TMF_RSP_NO_LUN;
		if (w->function == ISCSI_TMF_TARGET_COLD_RESET && response == ISCSI_TMF_RSP_COMPLETE)
			close_after = true;
	}
	struct iscsi_tx *tx = iscsi_tx_new(0);
	if (!tx) {
		iscsi_conn_close(c, "out of memory");
		return;
	}
	struct iscsi_tmf_rsp_hdr *r = (struct iscsi_tmf_rsp_hdr *)tx->hdr;
	r->opcode = ISCSI_OP_TMF_RSP;
	r->flags = ISCSI_FLAG_FINAL;
	r->response = (uint8_t)response;
	be32_put(r->itt, w->itt);
	iscsi_conn_fill_sn(c, tx->hdr, true);
	tx->close_after = close_after;
	iscsi_conn_send(c, tx);
}

/* Abort this session's commands on lun (UINT64_MAX: all LUNs). */
static void abort_set(struct iscsi_sess *s, uint64_t lun)
{
	struct iscsi_cmd *cmd, *next;
	for (cmd = s->active.next; cmd != &s->active; cmd = next) {
		next = cmd->next;
		if (lun == UINT64_MAX || cmd->sc.lun == lun)
			iscsi_cmd_abort(cmd);
	}
}

/* On the origin's worker: every other session's aborted command is back. */
static void remote_done(void *arg)
{
	struct iscsi_remote_abort *tok = arg;
	struct iscsi_sess *s = tok->origin;
	struct iscsi_conn *c = s->conn;

	s->remote_pending--;
	if (c && c->state != CONN_CLOSING) {
		iscsi_conn_enter(c);
		iscsi_tmf_aborted_done(s);
		iscsi_conn_leave(c);
	}
	iscsi_sess_put(s);
	free(tok);
}

void iscsi_tmf_remote_put(struct iscsi_remote_abort *tok)
{
	if (atomic_fetch_sub(&tok->pending, 1) != 1)
		return;
	if (!tok->origin->worker || worker_post(tok->origin->worker, remote_done, tok) < 0)
		log_err("iSCSI: cannot signal the end of a reset to %s's worker; its task "
			"management response is lost", tok->origin->initiator);
}

/* On another session's worker: abort its tasks for the reset. */
static void remote_abort_run(void *arg)
{
	struct remote_req *req = arg;
	struct iscsi_sess *o = req->sess;
	struct iscsi_conn *c = o->conn;

	if (c && c->state != CONN_CLOSING) {
		iscsi_conn_enter(c);
		struct iscsi_cmd *cmd, *next;
		for (cmd = o->active.next; cmd != &o->active; cmd = next) {
			next = cmd->next;
			if (req->tok->lun != UINT64_MAX && cmd->sc.lun != req->tok->lun)
				continue;
			bool had_token = cmd->remote_tok != NULL;
			if (iscsi_cmd_abort(cmd) && !had_token) {
				cmd->remote_tok = req->tok;
				atomic_fetch_add(&req->tok->pending, 1);
			}
		}
		iscsi_conn_leave(c);
	}
	iscsi_tmf_remote_put(req->tok);
	iscsi_sess_put(o);
	free(req);
}

static void post_remote(struct iscsi_sess *o, void *arg)
{
	struct iscsi_remote_abort *tok = arg;
	struct remote_req *req = malloc(sizeof(*req));

	if (!req) {
		iscsi_sess_put(o);
		return;
	}
	req->tok = tok;
	req->sess = o;
	atomic_fetch_add(&tok->pending, 1);
	if (worker_post(o->worker, remote_abort_run, req) < 0) {
		atomic_fetch_sub(&tok->pending, 1);
		iscsi_sess_put(o);
		free(req);
		return;
	}
	tok->posted++;
}

/* Abort the other sessions' tasks on lun; the TMF response waits for them. */
static void abort_others(struct iscsi_sess *s, uint64_t lun)
{
	struct iscsi_remote_abort *tok = malloc(sizeof(*tok));

	if (!tok)
		return;
	atomic_init(&tok->pending, 1);
	tok->origin = s;
	tok->lun = lun;
	tok->posted = 0;
	iscsi_sess_for_others(s, post_remote, tok);
	if (tok->posted == 0) {
		free(tok); /* this session is the target's only one */
		return;
	}
	atomic_fetch_add(&s->refs, 1);
	s->remote_pending++;
	iscsi_tmf_remote_put(tok); /* drop the guard; posts remote_done when all are back */
}

void iscsi_tmf_pdu(struct iscsi_conn *c, const uint8_t *bhs)
{
	const struct iscsi_tmf_req_hdr *h = (const struct iscsi_tmf_req_hdr *)bhs;
	struct iscsi_sess *s = c->sess;
	uint8_t fn = h->function & ISCSI_TMF_FUNC_MASK;
	uint64_t lun = iscsi_lun_decode(h->lun);
	struct iscsi_tmf_wait *w;

	if (s->discovery) {
		iscsi_reject(c, ISCSI_REJECT_PROTOCOL_ERROR, bhs);
		return;
	}
	if (!iscsi_sess_cmdsn_accept(s, be32_get(h->cmdsn), bhs_immediate(bhs)))
		return;
	w = calloc(1, sizeof(*w));
	if (!w) {
		iscsi_conn_close(c, "out of memory");
		return;
	}
	w->itt = bhs_itt(bhs);
	w->function = fn;
	w->lun = lun;
	w->response = -1;

	switch (fn) {
	case ISCSI_TMF_ABORT_TASK: {
		struct iscsi_cmd *cmd = iscsi_cmd_by_itt(s, be32_get(h->ref_itt));
		if (!cmd || cmd->state == CMD_SENDING) {
			w->response = ISCSI_TMF_RSP_NO_TASK;
		} else {
			iscsi_cmd_abort(cmd);
			w->response = ISCSI_TMF_RSP_COMPLETE;
		}
		break;
	}
	case ISCSI_TMF_ABORT_TASK_SET:
	case ISCSI_TMF_CLEAR_TASK_SET:
	case ISCSI_TMF_LOGICAL_UNIT_RESET:
		if (!s->nexus || !scsi_nexus_has_lun(s->nexus, lun)) {
			w->response = ISCSI_TMF_RSP_NO_LUN;
			break;
		}
		abort_set(s, lun);
		if (fn != ISCSI_TMF_ABORT_TASK_SET)
			abort_others(s, lun);
		break;
	case ISCSI_TMF_CLEAR_ACA:
		break;
	case ISCSI_TMF_TARGET_WARM_RESET:
	case ISCSI_TMF_TARGET_COLD_RESET:
		abort_set(s, UINT64_MAX);
		abort_others(s, UINT64_MAX);
		break;
	case ISCSI_TMF_TASK_REASSIGN:
		w->response = ISCSI_TMF_RSP_NO_REASSIGN;
		break;
	default:
		w->response = ISCSI_TMF_RSP_NOT_SUPPORTED;
		break;
	}
	log_debug("iSCSI %s: task management function %u on LUN %llu", c->peer, fn,
		  (unsigned long long)lun);
	if (s->aborted_inflight == 0 && s->remote_pending == 0 && !s->tmf_head) {
		tmf_send(c, w);
		free(w);
		return;
	}
	if (s->tmf_tail)
		s->tmf_tail->next = w;
	else
		s->tmf_head = w;
	s->tmf_tail = w;
}

void iscsi_tmf_aborted_done(struct iscsi_sess *s)
{
	if (s->aborted_inflight || s->remote_pending)
		return;
	while (s->tmf_head && s->conn && s->conn->state != CONN_CLOSING) {
		struct iscsi_tmf_wait *w = s->tmf_head;
		s->tmf_head = w->next;
		if (!s->tmf_head)
			s->tmf_tail = NULL;
		tmf_send(s->conn, w);
		free(w);
	}
}

void iscsi_tmf_free_all(struct iscsi_sess *s)
{
	while (s->tmf_head) {
		struct iscsi_tmf_wait *w = s->tmf_head;
		s->tmf_head = w->next;
		free(w);
	}
	s->tmf_tail = NULL;
}
