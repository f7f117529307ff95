/*
 * session.c - iSCSI sessions: the table, reinstatement, the CmdSN window
 * and the per-session command pool.
 *
 * A session is identified by (InitiatorName, ISID, TargetName) and, once
 * logged in, by its TSIH. The table is global because a reinstating login
 * may arrive on any worker: a new leading login with the ISID of a live
 * session closes the old one (RFC 7143 6.3.5) - the close is posted to the
 * old session's worker, carrying a reference so the object outlives the
 * trip. We negotiate MaxConnections=1; a login that tries to add a
 * connection to an existing session is refused by login.c with "too many
 * connections" (0206), or "session does not exist" (020a) for an unknown TSIH.
 *
 * CmdSN window: ExpCmdSN advances with every accepted non-immediate
 * request; MaxCmdSN = ExpCmdSN + free queue slots - 1, so the window is
 * ISCSI_QUEUE_DEPTH wide when idle and never shrinks from the initiator's
 * point of view (slots only return when commands finish). Requests outside
 * the window are silently ignored, as RFC 7143 4.2.2.1 requires.
 *
 * Threading: the table and TSIH allocation under table_lock (login and
 * teardown only); everything else on the session's worker.
 */
#include "target/iscsi/iscsi_int.h"

#include "common/log.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static struct iscsi_sess *table;
static uint16_t next_tsih = 1;

static void sess_kill(void *arg)
{
	struct iscsi_sess *s = arg;
	if (s->conn)
		iscsi_conn_close(s->conn, "session reinstated by a new login");
	iscsi_sess_put(s);
}

void iscsi_sess_put(struct iscsi_sess *s)
{
	if (atomic_fetch_sub(&s->refs, 1) == 1)
		free(s);
}

static bool same_nexus(const struct iscsi_sess *a, const uint8_t isid[6], const char *initiator,
		       const struct iscsi_target_cfg *tgt, bool discovery)
{
	return memcmp(a->isid, isid, 6) == 0 && strcmp(a->initiator, initiator) == 0 &&
	       iscsi_same_target(a->tgt, tgt) && a->discovery == discovery;
}

static bool tsih_used(uint16_t tsih)
{
	for (struct iscsi_sess *s = table; s; s = s->tbl_next)
		if (s->tsih == tsih)
			return true;
	return false;
}

bool iscsi_sess_tsih_exists(uint16_t tsih)
{
	pthread_mutex_lock(&table_lock);
	bool r = tsih_used(tsih);
	pthread_mutex_unlock(&table_lock);
	return r;
}

static int pool_init(struct iscsi_sess *s)
{
	s->active.next = s->active.prev = &s->active;
	if (s->discovery)
		return 0;
	s->pool = calloc(ISCSI_POOL_SIZE, sizeof(*s->pool));
	if (!s->pool)
		return -1;
	for (int i = ISCSI_POOL_SIZE - 1; i >= 0; i--) {
		struct iscsi_cmd *cmd = &s->pool[i];
		cmd->idx = (uint16_t)i;
		cmd->sess = s;
		cmd->state = CMD_FREE;
		cmd->tx.kind = ISCSI_TX_CMD;
		cmd->tx.file_fd = -1;
		cmd->next = s->free_list;
		s->free_list = cmd;
	}
	s->nfree = ISCSI_POOL_SIZE;
	return 0;
}

struct iscsi_sess *iscsi_sess_new(struct iscsi_conn *c, const uint8_t isid[6],
				  const char *initiator,
				  const struct iscsi_target_cfg *tgt, bool discovery,
				  uint32_t cmdsn)
{
	struct iscsi_sess *s = calloc(1, sizeof(*s));
	struct iscsi_sess *old = NULL;

	if (!s)
		return NULL;
	memcpy(s->isid, isid, 6);
	snprintf(s->initiator, sizeof(s->initiator), "%s", initiator);
	s->tgt = tgt;
	s->discovery = discovery;
	s->conn = c;
	s->worker = worker_self();
	s->exp_cmdsn = cmdsn;
	s->max_cmdsn = cmdsn + ISCSI_QUEUE_DEPTH - 1;
	s->params = c->params;
	atomic_init(&s->refs, 2); /* the connection's and the table's */
	if (pool_init(s) < 0) {
		free(s);
		return NULL;
	}
	if (!discovery && tgt->scsi) {
		s->nexus = scsi_nexus_open(tgt->scsi, initiator, isid, 1);
		if (!s->nexus) {
			free(s->pool);
			free(s);
			return NULL;
		}
	}

	pthread_mutex_lock(&table_lock);
	for (struct iscsi_sess **pp = &table; *pp; pp = &(*pp)->tbl_next) {
		if (same_nexus(*pp, isid, initiator, tgt, discovery)) {
			old = *pp;
			*pp = old->tbl_next;
			old->in_table = false; /* the table's reference moves to sess_kill */
			break;
		}
	}
	do {
		s->tsih = next_tsih++;
		if (next_tsih == 0)
			next_tsih = 1;
	} while (s->tsih == 0 || tsih_used(s->tsih));
	s->in_table = true;
	s->tbl_next = table;
	table = s;
	pthread_mutex_unlock(&table_lock);

	if (old) {
		log_info("iSCSI: %s reinstates its session (ISID %02x%02x%02x%02x%02x%02x); "
			 "closing the old one", initiator, isid[0], isid[1], isid[2], isid[3],
			 isid[4], isid[5]);
		if (old->worker && old->worker != worker_self()) {
			if (worker_post(old->worker, sess_kill, old) < 0)
				iscsi_sess_put(old); /* cannot reach it; it dies with its socket */
		} else {
			sess_kill(old);
		}
	}
	return s;
}

void iscsi_sess_conn_gone(struct iscsi_sess *s)
{
	bool drop_table = false;

	if (s->nexus) {
		scsi_nexus_close(s->nexus);
		s->nexus = NULL;
	}
	free(s->pool);
	s->pool = NULL;
	s->conn = NULL;
	pthread_mutex_lock(&table_lock);
	if (s->in_table) {
		for (struct iscsi_sess **pp = &table; *pp; pp = &(*pp)->tbl_next) {
			if (*pp == s) {
				*pp = s->tbl_next;
				break;
			}
		}
		s->in_table = false;
		drop_table = true;
	}
	pthread_mutex_unlock(&table_lock);
	if (drop_table)
		iscsi_sess_put(s);
	iscsi_sess_put(s);
}

void iscsi_sess_update_max_cmdsn(struct iscsi_sess *s)
{
	unsigned free_slots = ISCSI_QUEUE_DEPTH - s->active_nonimm;
	uint32_t max = s->exp_cmdsn + free_slots - 1;
	/* MaxCmdSN never moves backwards (RFC 7143 4.2.2.1). */
	if (sn_lt(s->max_cmdsn, max))
		s->max_cmdsn = max;
}

bool iscsi_sess_cmdsn_accept(struct iscsi_sess *s, uint32_t cmdsn, bool immediate)
{
	if (immediate)
		return true;
	/* Against the MaxCmdSN we last advertised, not what we could offer now. */
	if (sn_lt(cmdsn, s->exp_cmdsn) || sn_lt(s->max_cmdsn, cmdsn)) {
		log_debug("iSCSI: %s: CmdSN %u outside window [%u, %u]; ignored", s->initiator,
			  cmdsn, s->exp_cmdsn, s->max_cmdsn);
		return false;
	}
	/* One connection per session: requests arrive in CmdSN order. A gap
	 * can only be an initiator bug; resynchronise rather than stall. */
	s->exp_cmdsn = cmdsn + 1;
	return true;
}

struct iscsi_cmd *iscsi_cmd_get(struct iscsi_sess *s, bool immediate)
{
	struct iscsi_cmd *cmd;

	if (!s->free_list)
		return NULL;
	if (!immediate && s->active_nonimm >= ISCSI_QUEUE_DEPTH)
		return NULL;
	if (immediate && s->nfree <= ISCSI_QUEUE_DEPTH - s->active_nonimm)
		return NULL; /* the rest is promised to the CmdSN window */
	cmd = s->free_list;
	s->free_list = cmd->next;
	s->nfree--;
	if (!immediate)
		s->active_nonimm++;
	cmd->immediate = immediate;
	/* every flag of the command's last life: one left overdue would
	 * have the next command's answer dropped (cmd_done) */
	cmd->aborted = cmd->failed = cmd->status_sent = cmd->overdue = false;
	cmd->nbufs = 0;
	cmd->received = cmd->unsol_expected = cmd->unsol_received = cmd->unsol_datasn = 0;
	cmd->unsol_final = false;
	cmd->r2t_next = cmd->r2tsn = 0;
	memset(cmd->r2t, 0, sizeof(cmd->r2t));
	cmd->datain_off = cmd->datain_len = cmd->datasn = cmd->burst_left = 0;
	cmd->remote_tok = NULL;
	cmd->tx.queued = false;
	cmd->tx.sent_cb = NULL;
	/* link into the active list */
	cmd->next = &s->active;
	cmd->prev = s->active.prev;
	s->active.prev->next = cmd;
	s->active.prev = cmd;
	return cmd;
}

void iscsi_cmd_put(struct iscsi_cmd *cmd)
{
	struct iscsi_sess *s = cmd->sess;

	cmd->prev->next = cmd->next;
	cmd->next->prev = cmd->prev;
	cmd->state = CMD_FREE;
	if (!cmd->immediate)
		s->active_nonimm--;
	cmd->next = s->free_list;
	s->free_list = cmd;
	s->nfree++;
}

void iscsi_sess_for_others(struct iscsi_sess *s, void (*fn)(struct iscsi_sess *o, void *arg),
			   void *arg)
{
	pthread_mutex_lock(&table_lock);
	for (struct iscsi_sess *o = table; o; o = o->tbl_next) {
		if (o == s || o->discovery || !iscsi_same_target(o->tgt, s->tgt) || !o->worker)
			continue;
		atomic_fetch_add(&o->refs, 1);
		fn(o, arg);
	}
	pthread_mutex_unlock(&table_lock);
}

struct iscsi_cmd *iscsi_cmd_by_itt(struct iscsi_sess *s, uint32_t itt)
{
	for (struct iscsi_cmd *cmd = s->active.next; cmd != &s->active; cmd = cmd->next)
		if (cmd->itt == itt && !cmd->aborted)
			return cmd;
	return NULL;
}
