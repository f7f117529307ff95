/*
 * pr.c - reservations: SPC-2 RESERVE/RELEASE and SPC-4 persistent
 * reservations (PERSISTENT RESERVE IN / OUT).
 *
 * Registrations belong to I_T nexuses identified by name (initiator port
 * "iqn,i,0x<isid>" and target port "iqn,t,0x<tpgt>"), not by the
 * scsi_nexus object, so they survive a logout and a relogin with the same
 * ISID, as SPC requires. When the last PERSISTENT RESERVE OUT asked for
 * APTPL, the whole state is written to <state_dir>/<lun>.pr atomically
 * (temporary file, fsync, rename, fsync of the directory) and read back
 * at scsi_lu_open; with APTPL clear the file is removed.
 *
 * The hot path never looks at this state: lu->resv_held is set while a
 * reservation of either kind exists, and only then does dispatch call
 * pr_conflicts() under lu->mutex.
 *
 * PREEMPT AND ABORT is answered only once no command of a nexus it
 * preempted is in flight (preempt_abort below; on a LU several gateways
 * export, pr_shared.c does the same on every gateway): a cluster fences
 * a node with it and then trusts that none of that node's writes lands
 * after the GOOD.
 *
 * Threading: every function takes lu->mutex itself; PR OUT writes the
 * state file on the worker (rare, small, and the command must not
 * complete before it is durable).
 */
#include "backstore/lu.h"
#include "backstore/pr_int.h"

#include "common/log.h"
#include "common/statefile.h"
#include "common/worker.h"

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define PR_WE 1
#define PR_EA 3
#define PR_WE_RO 5
#define PR_EA_RO 6
#define PR_WE_AR 7
#define PR_EA_AR 8

#define PRO_REGISTER 0
#define PRO_RESERVE 1
#define PRO_RELEASE 2
#define PRO_CLEAR 3
#define PRO_PREEMPT 4
#define PRO_PREEMPT_ABORT 5
#define PRO_REGISTER_IGNORE 6
#define PRO_REGISTER_MOVE 7

#define PRI_READ_KEYS 0
#define PRI_READ_RESERVATION 1
#define PRI_REPORT_CAPABILITIES 2
#define PRI_READ_FULL_STATUS 3

#define PRO_PARAM_LEN 24
#define PRO_SPEC_I_PT 0x08
#define PRO_ALL_TG_PT 0x04
#define PRO_APTPL 0x01


#define TRANSPORTID_ISCSI_ISID 0x45 /* format 01b, protocol iSCSI (5) */

static bool type_valid(uint8_t t)
{
	return t == PR_WE || t == PR_EA || t == PR_WE_RO || t == PR_EA_RO || t == PR_WE_AR || t == PR_EA_AR;
}

static bool type_all_registrants(uint8_t t)
{
	return t == PR_WE_AR || t == PR_EA_AR;
}

static bool type_registrants_only(uint8_t t)
{
	return t == PR_WE_RO || t == PR_EA_RO || type_all_registrants(t);
}

static bool type_exclusive_access(uint8_t t)
{
	return t == PR_EA || t == PR_EA_RO || t == PR_EA_AR;
}

/* Locked. */
static void update_hint(struct scsi_lu *lu)
{
	/* a change being tried on a shared LU keeps it set: see pr_shared.c */
	atomic_store_explicit(&lu->resv_held,
			      lu->pr.type != 0 || lu->spc2_holder != NULL || (lu->prs && pr_shared_trying(lu)),
			      memory_order_release);
}

static bool reg_matches(const struct pr_reg *r, const char *i_port, const char *t_port)
{
	return !strcmp(r->i_port, i_port) && (r->all_tg_pt || !strcmp(r->t_port, t_port));
}

static struct pr_reg *reg_find(struct scsi_lu *lu, const struct scsi_nexus *nx)
{
	for (struct pr_reg *r = lu->pr.regs; r; r = r->next)
		if (reg_matches(r, nx->i_port, nx->t_port))
			return r;
	return NULL;
}

static bool is_holder(struct scsi_lu *lu, const struct pr_reg *r)
{
	if (!r || !lu->pr.type)
		return false;
	return type_all_registrants(lu->pr.type) || lu->pr.holder == r;
}

/* ---------------------------------------------------------------- */
/* Conflicts                                                         */

static bool cmd_is_write(const struct cmd_desc *d)
{
	return (d->flags & CMDF_WRITES) || d->opcode == OP_MODE_SELECT_6 || d->opcode == OP_MODE_SELECT_10 ||
	       d->opcode == OP_START_STOP_UNIT || d->opcode == OP_RESERVE_6 || d->opcode == OP_RESERVE_10 ||
	       d->opcode == OP_RELEASE_6 || d->opcode == OP_RELEASE_10;
}

bool pr_conflicts(struct scsi_cmd *cmd, const struct cmd_desc *d)
{
	return pr_conflicts_lu(cmd->lu, cmd->nexus, d);
}

bool pr_conflicts_lu(struct scsi_lu *lu, struct scsi_nexus *nx, const struct cmd_desc *d)
{
	bool conflict = false;

	if (!atomic_load_explicit(&lu->resv_held, memory_order_acquire))
		return false;
	pthread_mutex_lock(&lu->mutex);
	if (lu->spc2_holder && lu->spc2_holder != nx) {
		conflict = !(d->flags & CMDF_RESV_SPC2_OK);
	} else if (lu->pr.type && !(d->flags & CMDF_PR_ALLOWED)) {
		struct pr_reg *r = reg_find(lu, nx);
		bool access = is_holder(lu, r) || (r && type_registrants_only(lu->pr.type));
		if (!access)
			conflict = type_exclusive_access(lu->pr.type) || cmd_is_write(d);
	}
	pthread_mutex_unlock(&lu->mutex);
	return conflict;
}

/* ---------------------------------------------------------------- */
/* Persistence                                                       */

static void state_path(const struct scsi_lu *lu, char *out, size_t cap, const char *suffix)
{
	char name[128];
	size_t i;
	for (i = 0; lu->name[i] && i < sizeof(name) - 1; i++) {
		char c = lu->name[i];
		name[i] = (c == '/' || c == ' ') ? '_' : c;
	}
	name[i] = 0;
	snprintf(out, cap, "%s/%s.pr%s", lu->state_dir, name, suffix);
}

char *pr_encode(const struct scsi_lu *lu, uint64_t ver, bool shared, size_t *len)
{
	char *buf = NULL;
	size_t n = 0;
	FILE *f = open_memstream(&buf, &n);
	if (!f)
		return NULL;
	int idx = 0, holder = -1;
	fprintf(f, "tiercache-pr 1 %016llx\ngeneration %u\n", (unsigned long long)ver, lu->pr.generation);
	if (shared)
		fprintf(f, "aptpl %d\n", lu->pr.aptpl ? 1 : 0);
	for (const struct pr_reg *r = lu->pr.regs; r; r = r->next, idx++)
		if (r == lu->pr.holder)
			holder = idx;
	fprintf(f, "reservation %u %d\n", lu->pr.type, holder);
	for (const struct pr_reg *r = lu->pr.regs; r; r = r->next)
		fprintf(f, "reg %016llx %d %u %s %s\n", (unsigned long long)r->key, r->all_tg_pt ? 1 : 0,
			r->rel_port, r->i_port, r->t_port);
	if (fclose(f) != 0) {
		free(buf);
		return NULL;
	}
	*len = n;
	return buf;
}

/* Locked. Returns 0 or -errno. */
static int pr_save(struct scsi_lu *lu)
{
	char path[4096];

	if (!lu->state_dir || lu->prs)
		return 0; /* shared across gateways: the cluster keeps it (pr_shared.c) */
	state_path(lu, path, sizeof(path), "");
	if (!lu->pr.aptpl) {
		if (unlink(path) < 0 && errno != ENOENT)
			return -errno;
		return 0;
	}
	size_t len = 0;
	char *text = pr_encode(lu, 0, false, &len);
	if (!text)
		return -ENOMEM;
	int err = state_file_replace(path, text, len);
	free(text);
	return err;
}

static void reg_list_free(struct pr_reg *r)
{
	while (r) {
		struct pr_reg *n = r->next;
		free(r);
		r = n;
	}
}

/*
 * Parse the state text into st (zeroed by the caller; aptpl is left as it
 * is unless an aptpl line says). 0, or the number of the first bad line.
 */
static int pr_parse(FILE *f, struct pr_state *st, uint64_t *ver)
{
	char line[1024];
	unsigned type = 0;
	int holder = -1, lineno = 0;
	struct pr_reg **tail = &st->regs;

	*ver = 0;
	while (fgets(line, sizeof(line), f)) {
		unsigned long long key, v;
		int all, ap;
		unsigned rel, gen;
		char ip[PORT_NAME_MAX], tp[PORT_NAME_MAX];

		lineno++;
		if (lineno == 1) {
			if (strncmp(line, "tiercache-pr 1", 14))
				goto bad;
			if (sscanf(line + 14, " %llx", &v) == 1)
				*ver = v;
			continue;
		}
		if (sscanf(line, "generation %u", &gen) == 1) {
			st->generation = gen;
		} else if (sscanf(line, "aptpl %d", &ap) == 1) {
			st->aptpl = ap != 0;
		} else if (sscanf(line, "reservation %u %d", &type, &holder) == 2) {
			if (type && !type_valid((uint8_t)type))
				goto bad;
		} else if (sscanf(line, "reg %llx %d %u %255s %255s", &key, &all, &rel, ip, tp) == 5) {
			struct pr_reg *r = calloc(1, sizeof(*r));
			if (!r)
				goto bad;
			r->key = key;
			r->all_tg_pt = all;
			r->rel_port = (uint16_t)rel;
			snprintf(r->i_port, sizeof(r->i_port), "%s", ip);
			snprintf(r->t_port, sizeof(r->t_port), "%s", tp);
			*tail = r;
			tail = &r->next;
		} else if (line[0] != '\n') {
			goto bad;
		}
	}
	if (!lineno)
		goto bad;
	st->type = (uint8_t)type;
	if (type) {
		int i = 0;
		struct pr_reg *r = st->regs;
		for (; r && i < holder; r = r->next)
			i++;
		st->holder = holder >= 0 ? r : NULL;
		if (!type_all_registrants((uint8_t)type) && !st->holder)
			st->type = 0;
	}
	return 0;
bad:
	reg_list_free(st->regs);
	st->regs = NULL;
	return lineno ? lineno : 1;
}

int pr_install(struct scsi_lu *lu, const char *text, size_t len, uint64_t *ver)
{
	struct pr_state st = { 0 };
	FILE *f = fmemopen((void *)text, len, "r");
	if (!f)
		return -ENOMEM;
	int bad = pr_parse(f, &st, ver);
	fclose(f);
	if (bad)
		return -EINVAL;
	reg_list_free(lu->pr.regs);
	lu->pr = st;
	update_hint(lu);
	return 0;
}

void pr_clear_state(struct scsi_lu *lu)
{
	reg_list_free(lu->pr.regs);
	memset(&lu->pr, 0, sizeof(lu->pr));
	update_hint(lu);
}

int pr_load(struct scsi_lu *lu, char *err, size_t errlen)
{
	char path[4096];

	if (!lu->state_dir)
		return 0;
	state_path(lu, path, sizeof(path), "");
	FILE *f = fopen(path, "r");
	if (!f) {
		if (errno == ENOENT)
			return 0;
		snprintf(err, errlen, "lun \"%s\": cannot read persistent reservations from %s: %s",
			 lu->name, path, strerror(errno));
		return -1;
	}
	struct pr_state st = { .aptpl = true };
	uint64_t ver;
	int bad = pr_parse(f, &st, &ver);
	fclose(f);
	if (bad) {
		snprintf(err, errlen, "lun \"%s\": %s line %d is not valid persistent reservation state; "
			 "move the file away to start without reservations", lu->name, path, bad);
		return -1;
	}
	lu->pr = st;
	update_hint(lu);
	return 0;
}

static void pa_forget(struct scsi_lu *lu);

void pr_free(struct scsi_lu *lu)
{
	pa_forget(lu);
	reg_list_free(lu->pr.regs);
	lu->pr.regs = NULL;
	lu->pr.holder = NULL;
	lu->pr.type = 0;
}

void pr_nexus_gone(struct scsi_lu *lu, struct scsi_nexus *nx)
{
	pthread_mutex_lock(&lu->mutex);
	if (lu->spc2_holder == nx) {
		lu->spc2_holder = NULL;
		update_hint(lu);
	}
	pthread_mutex_unlock(&lu->mutex);
}

void pr_lu_reset(struct scsi_lu *lu)
{
	pthread_mutex_lock(&lu->mutex);
	lu->spc2_holder = NULL;
	update_hint(lu);
	pthread_mutex_unlock(&lu->mutex);
}

/* ---------------------------------------------------------------- */
/* SPC-2 RESERVE / RELEASE                                           */

enum scsi_rc pr_reserve(struct scsi_cmd *cmd)
{
	struct scsi_lu *lu = cmd->lu;

	pthread_mutex_lock(&lu->mutex);
	if (lu->pr.regs || lu->pr.type || (lu->spc2_holder && lu->spc2_holder != cmd->nexus)) {
		cmd->status = SAM_STAT_RESERVATION_CONFLICT;
	} else {
		lu->spc2_holder = cmd->nexus;
		update_hint(lu);
	}
	pthread_mutex_unlock(&lu->mutex);
	return SCSI_RC_DONE;
}

enum scsi_rc pr_release(struct scsi_cmd *cmd)
{
	struct scsi_lu *lu = cmd->lu;

	pthread_mutex_lock(&lu->mutex);
	if (lu->pr.regs || lu->pr.type) {
		cmd->status = SAM_STAT_RESERVATION_CONFLICT;
	} else if (lu->spc2_holder == cmd->nexus) {
		lu->spc2_holder = NULL;
		update_hint(lu);
	}
	pthread_mutex_unlock(&lu->mutex);
	return SCSI_RC_DONE;
}

/* ---------------------------------------------------------------- */
/* PERSISTENT RESERVE IN                                             */

static size_t transport_id(const char *i_port, uint8_t *out)
{
	size_t l = strlen(i_port);
	size_t padded = (l + 1 + 3) & ~(size_t)3;
	memset(out, 0, 4 + padded);
	out[0] = TRANSPORTID_ISCSI_ISID;
	be16_put(out + 2, (uint16_t)padded);
	memcpy(out + 4, i_port, l);
	return 4 + padded;
}

enum scsi_rc pr_in(struct scsi_cmd *cmd)
{
	struct scsi_lu *lu = cmd->lu;
	uint8_t sa = cmd->cdb[1] & 0x1f;
	uint16_t alloc = be16_get(cmd->cdb + 7);
	size_t cap = 8 + 64 * 1024;
	uint8_t *b = calloc(1, cap);
	size_t off = 8;

	if (!b)
		return scsi_fail(cmd, SK_HARDWARE_ERROR, ASC_INTERNAL_TARGET_FAILURE);
	if (!pr_shared_synced(lu)) {
		free(b);
		cmd->status = SAM_STAT_BUSY; /* not the cluster's latest: the host asks again */
		return SCSI_RC_DONE;
	}
	pthread_mutex_lock(&lu->mutex);
	be32_put(b, lu->pr.generation);
	switch (sa) {
	case PRI_READ_KEYS:
		for (struct pr_reg *r = lu->pr.regs; r && off + 8 <= cap; r = r->next, off += 8)
			be64_put(b + off, r->key);
		be32_put(b + 4, (uint32_t)(off - 8));
		break;
	case PRI_READ_RESERVATION:
		if (lu->pr.type) {
			uint64_t key = type_all_registrants(lu->pr.type) ? 0 : lu->pr.holder->key;
			be64_put(b + 8, key);
			b[8 + 13] = lu->pr.type; /* scope 0 = LU */
			off += 16;
		}
		be32_put(b + 4, (uint32_t)(off - 8));
		break;
	case PRI_REPORT_CAPABILITIES:
		memset(b, 0, 8);
		be16_put(b, 8);
		b[2] = 0x10 | 0x04 | 0x01;     /* CRH, ATP_C, PTPL_C */
		b[3] = 0x80 | (lu->pr.aptpl ? 0x01 : 0); /* TMV, PTPL_A */
		b[4] = 0x80 | 0x40 | 0x20 | 0x08 | 0x02;
		b[5] = 0x01;
		off = 8;
		break;
	case PRI_READ_FULL_STATUS:
		for (struct pr_reg *r = lu->pr.regs; r; r = r->next) {
			uint8_t *d = b + off;
			if (off + 24 + 4 + PORT_NAME_MAX + 4 > cap)
				break;
			be64_put(d, r->key);
			if (r->all_tg_pt)
				d[12] |= 0x02;
			if (is_holder(lu, r)) {
				d[12] |= 0x01;
				d[13] = lu->pr.type;
			}
			be16_put(d + 18, r->rel_port);
			size_t tl = transport_id(r->i_port, d + 24);
			be32_put(d + 20, (uint32_t)tl);
			off += 24 + tl;
		}
		be32_put(b + 4, (uint32_t)(off - 8));
		break;
	}
	pthread_mutex_unlock(&lu->mutex);
	scsi_data_in(cmd, b, off, alloc);
	free(b);
	return SCSI_RC_DONE;
}

/* ---------------------------------------------------------------- */
/* PERSISTENT RESERVE OUT                                            */

/* UA for the nexuses behind registration r. Locked. */
static void ua_reg(struct scsi_lu *lu, const struct pr_reg *r, unsigned ua)
{
	if (lu->prs && pr_shared_capture(lu, ua, r->i_port, r->all_tg_pt ? NULL : r->t_port))
		return; /* delivered once the change is the cluster's, on every gateway */
	lu_ua_port_locked(lu, ua, r->i_port, r->all_tg_pt ? NULL : r->t_port);
}

/* Drop registration r (and the reservation it holds, SPC-4 5.13.11.2.3). */
static void reg_remove(struct scsi_lu *lu, struct pr_reg *r, bool release_ua)
{
	for (struct pr_reg **pp = &lu->pr.regs; *pp; pp = &(*pp)->next)
		if (*pp == r) {
			*pp = r->next;
			break;
		}
	if (lu->pr.type) {
		bool release = false;
		if (type_all_registrants(lu->pr.type))
			release = lu->pr.regs == NULL;
		else
			release = lu->pr.holder == r;
		if (release) {
			uint8_t old = lu->pr.type;
			lu->pr.type = 0;
			lu->pr.holder = NULL;
			/* registrants-only types tell the others it went away */
			if (release_ua && (old == PR_WE_RO || old == PR_EA_RO))
				for (struct pr_reg *o = lu->pr.regs; o; o = o->next)
					ua_reg(lu, o, UA_RESERVATIONS_RELEASED);
		}
	}
	free(r);
}

static struct pr_reg *reg_add(struct scsi_lu *lu, const struct scsi_nexus *nx, uint64_t key, bool all_tg_pt)
{
	struct pr_reg *r = calloc(1, sizeof(*r));
	if (!r)
		return NULL;
	r->key = key;
	r->all_tg_pt = all_tg_pt;
	r->rel_port = lu->rel_port;
	snprintf(r->i_port, sizeof(r->i_port), "%s", nx->i_port);
	snprintf(r->t_port, sizeof(r->t_port), "%s", nx->t_port);
	struct pr_reg **pp = &lu->pr.regs;
	while (*pp)
		pp = &(*pp)->next;
	*pp = r;
	return r;
}


static enum pr_result do_register(struct scsi_lu *lu, struct scsi_nexus *nx, bool ignore, uint64_t key,
				  uint64_t sa_key, bool all_tg_pt)
{
	struct pr_reg *r = reg_find(lu, nx);

	if (!r) {
		if (!ignore && key != 0)
			return PR_CONFLICT;
		if (sa_key == 0)
			return PR_OK;
		if (!reg_add(lu, nx, sa_key, all_tg_pt))
			return PR_NO_RESOURCES;
	} else {
		if (!ignore && key != r->key)
			return PR_CONFLICT;
		if (sa_key == 0)
			reg_remove(lu, r, true);
		else
			r->key = sa_key;
	}
	lu->pr.generation++;
	return PR_OK;
}

static enum pr_result do_reserve(struct scsi_lu *lu, struct scsi_nexus *nx, uint64_t key, uint8_t type)
{
	struct pr_reg *r = reg_find(lu, nx);

	if (!r || r->key != key)
		return PR_CONFLICT;
	if (lu->pr.type) {
		if (!is_holder(lu, r))
			return PR_CONFLICT;
		return lu->pr.type == type ? PR_OK : PR_CONFLICT;
	}
	lu->pr.type = type;
	lu->pr.holder = type_all_registrants(type) ? NULL : r;
	return PR_OK;
}

static enum pr_result do_release(struct scsi_lu *lu, struct scsi_nexus *nx, uint64_t key, uint8_t type)
{
	struct pr_reg *r = reg_find(lu, nx);

	if (!r || r->key != key)
		return PR_CONFLICT;
	if (!lu->pr.type || !is_holder(lu, r))
		return PR_OK;
	if (lu->pr.type != type)
		return PR_BAD_RELEASE;
	uint8_t old = lu->pr.type;
	lu->pr.type = 0;
	lu->pr.holder = NULL;
	if (old != PR_WE && old != PR_EA)
		for (struct pr_reg *o = lu->pr.regs; o; o = o->next)
			if (o != r)
				ua_reg(lu, o, UA_RESERVATIONS_RELEASED);
	return PR_OK;
}

static enum pr_result do_clear(struct scsi_lu *lu, struct scsi_nexus *nx, uint64_t key)
{
	struct pr_reg *r = reg_find(lu, nx);

	if (!r || r->key != key)
		return PR_CONFLICT;
	for (struct pr_reg *o = lu->pr.regs; o; o = o->next)
		if (o != r)
			ua_reg(lu, o, UA_RESERVATIONS_PREEMPTED);
	lu->pr.type = 0;
	lu->pr.holder = NULL;
	reg_list_free(lu->pr.regs);
	lu->pr.regs = NULL;
	lu->pr.generation++;
	return PR_OK;
}

/* Remove every registration with key k except keep; UA each. Returns count. */
static int remove_by_key(struct scsi_lu *lu, uint64_t k, struct pr_reg *keep, bool all_others)
{
	int n = 0;
	struct pr_reg *o = lu->pr.regs;
	while (o) {
		struct pr_reg *next = o->next;
		if (o != keep && (all_others || o->key == k)) {
			ua_reg(lu, o, UA_REGISTRATIONS_PREEMPTED);
			reg_remove(lu, o, false);
			n++;
		}
		o = next;
	}
	return n;
}

static enum pr_result do_preempt(struct scsi_lu *lu, struct scsi_nexus *nx, uint64_t key, uint64_t sa_key,
				 uint8_t type)
{
	struct pr_reg *r = reg_find(lu, nx);

	if (!r || r->key != key)
		return PR_CONFLICT;
	if (!lu->pr.type) {
		if (sa_key == 0)
			return PR_BAD_PARAM_KEY;
		if (!remove_by_key(lu, sa_key, r, false))
			return PR_CONFLICT;
	} else if (type_all_registrants(lu->pr.type)) {
		if (sa_key == 0) {
			remove_by_key(lu, 0, r, true);
			lu->pr.type = type;
			lu->pr.holder = type_all_registrants(type) ? NULL : r;
		} else if (!remove_by_key(lu, sa_key, r, false)) {
			return PR_CONFLICT;
		}
	} else if (lu->pr.holder->key == sa_key) {
		uint8_t old = lu->pr.type;
		struct pr_reg *old_holder = lu->pr.holder;
		/* keep the reservation alive across removing its holder */
		lu->pr.type = 0;
		lu->pr.holder = NULL;
		remove_by_key(lu, sa_key, r, false);
		lu->pr.type = type;
		lu->pr.holder = type_all_registrants(type) ? NULL : r;
		if (old != type || old_holder == r)
			for (struct pr_reg *o = lu->pr.regs; o; o = o->next)
				if (o != r)
					ua_reg(lu, o, UA_RESERVATIONS_RELEASED);
	} else {
		if (sa_key == 0)
			return PR_BAD_PARAM_KEY;
		if (!remove_by_key(lu, sa_key, r, false))
			return PR_CONFLICT;
	}
	lu->pr.generation++;
	return PR_OK;
}

/* REGISTER AND MOVE: hand our reservation to the I_T nexus named by the
 * TransportID in the parameter list. */
static enum pr_result do_register_move(struct scsi_lu *lu, struct scsi_nexus *nx, uint64_t key,
				       uint64_t sa_key, const uint8_t *p, size_t plen, uint8_t type)
{
	struct pr_reg *r = reg_find(lu, nx);
	char ip[PORT_NAME_MAX];

	if (!r || r->key != key)
		return PR_CONFLICT;
	if (!lu->pr.type || type_all_registrants(lu->pr.type) || lu->pr.holder != r)
		return PR_CONFLICT;
	if (sa_key == 0)
		return PR_BAD_PARAM_KEY;
	uint32_t tlen = be32_get(p + 20);
	if (tlen < 8 || 24 + (size_t)tlen > plen)
		return PR_BAD_PARAM_LEN;
	const uint8_t *tid = p + 24;
	if ((tid[0] & 0x0f) != 0x05) /* iSCSI only */
		return PR_BAD_TID;
	size_t nl = be16_get(tid + 2);
	if (nl + 4 > tlen || nl == 0)
		return PR_BAD_TID;
	size_t l = strnlen((const char *)tid + 4, nl);
	if (l >= sizeof(ip))
		return PR_BAD_TID;
	memcpy(ip, tid + 4, l);
	ip[l] = 0;
	if ((tid[0] & 0xc0) == 0) /* format 00: name only; we require the ISID form */
		return PR_BAD_TID;
	if (!strcmp(ip, nx->i_port))
		return PR_BAD_TID; /* moving to ourselves */
	struct pr_reg *dst = NULL;
	for (struct pr_reg *o = lu->pr.regs; o; o = o->next)
		if (reg_matches(o, ip, nx->t_port))
			dst = o;
	if (!dst) {
		dst = calloc(1, sizeof(*dst));
		if (!dst)
			return PR_NO_RESOURCES;
		snprintf(dst->i_port, sizeof(dst->i_port), "%s", ip);
		snprintf(dst->t_port, sizeof(dst->t_port), "%s", nx->t_port);
		dst->rel_port = lu->rel_port;
		struct pr_reg **pp = &lu->pr.regs;
		while (*pp)
			pp = &(*pp)->next;
		*pp = dst;
	}
	dst->key = sa_key;
	lu->pr.holder = dst;
	lu->pr.type = type;
	if (p[17] & 0x02) /* UNREG */
		reg_remove(lu, r, false);
	lu->pr.generation++;
	return PR_OK;
}

/*
 * PREEMPT AND ABORT on a LU of one gateway. The preempted nexuses' commands
 * in flight are let finish, not aborted (what reached a device cannot be
 * called back), and the answer waits for them: every command but a PR OUT
 * is counted per nexus from submit to completion (nexus_lu.inflight), in
 * the count of the LU's epoch when it came. The PREEMPT AND ABORT moves
 * the epoch on as it applies the change, and waits for the old epoch's
 * count of each nexus it preempted: what a busy host sends after it meets
 * the new state and is not waited for. The completion that takes such a
 * count to 0 while a PREEMPT AND ABORT waits (lu->pa_waiting) calls
 * lu_pa_poke, which answers each waiting one that has nothing left to
 * wait for, on its own worker. Announcing the wait before counting, as
 * the completion decrements before it reads pa_waiting (both seq_cst),
 * means one of the two sees the other.
 *
 * The wait ends after PR_DRAIN_MS in all, with a warning (the worker's
 * tick, about once a second, checks, so it is answered within a second
 * after): a device that keeps a command for good must not keep the
 * cluster from failing over. io_timeout does not apply
 * to the PR OUT itself (lu_timeout.c): it never reaches the backing store,
 * and an ABORTED COMMAND for a preemption already made would have the host
 * send it again and meet RESERVATION CONFLICT.
 */
struct pa_port {
	char i_port[PORT_NAME_MAX];
	char t_port[PORT_NAME_MAX];
	bool all_tg_pt;
};

struct pa_wait {
	struct scsi_cmd *cmd;
	struct worker *w;
	struct worker_call call;
	struct worker_tick tick;
	struct pa_wait *next; /* lu->pa_waits, under lu->mutex */
	bool listed;          /* on it: whoever takes it off answers */
	int ep;               /* the epoch parity waited for */
	uint64_t end_ns;
	unsigned n;
	struct pa_port port[];
};

/* Waits the workers stopped before they could end (at exit): their
 * commands are not answered any more. */
static void pa_forget(struct scsi_lu *lu)
{
	while (lu->pa_waits) {
		struct pa_wait *pw = lu->pa_waits;
		lu->pa_waits = pw->next;
		free(pw);
	}
}

/* The target port a preempted registration names: NULL (any) for ALL_TG_PT. */
static const char *pa_tport(const struct pa_port *pp)
{
	return pp->all_tg_pt ? NULL : pp->t_port;
}

/* Locked. */
static unsigned pa_busy(struct scsi_lu *lu, const struct pa_wait *pw)
{
	unsigned busy = 0;
	for (unsigned i = 0; i < pw->n; i++)
		busy += lu_port_inflight_locked(lu, pw->port[i].i_port, pa_tport(&pw->port[i]), pw->cmd->nexus, pw->ep);
	return busy;
}

/* Locked. */
static void pa_unlist(struct scsi_lu *lu, struct pa_wait *pw)
{
	for (struct pa_wait **pp = &lu->pa_waits; *pp; pp = &(*pp)->next)
		if (*pp == pw) {
			*pp = pw->next;
			break;
		}
	pw->listed = false;
	atomic_fetch_sub(&lu->pa_waiting, 1);
}

/* On pw's worker, once it is off the list. */
static void pa_answer(void *arg)
{
	struct pa_wait *pw = arg;
	struct scsi_cmd *cmd = pw->cmd;
	worker_tick_del(&pw->tick);
	free(pw);
	scsi_cmd_complete(cmd);
}

static void pa_tick(struct worker_tick *t)
{
	struct pa_wait *pw = (struct pa_wait *)((char *)t - offsetof(struct pa_wait, tick));
	struct scsi_lu *lu = pw->cmd->lu;
	bool late = false;
	unsigned busy = 0;
	pthread_mutex_lock(&lu->mutex);
	if (pw->listed && lu_now_ns() >= pw->end_ns) {
		busy = pa_busy(lu, pw);
		pa_unlist(lu, pw);
		late = true;
	}
	pthread_mutex_unlock(&lu->mutex);
	if (!late)
		return;
	if (busy)
		log_warn("lun \"%s\": %u command(s) of the nexuses preempted with abort still run after %u s; the "
			 "PREEMPT AND ABORT is answered anyway", lu->name, busy, PR_DRAIN_MS / 1000);
	/* posted, not here: the host's answer must not run inside the tick walk */
	worker_post_call(pw->w, &pw->call, pa_answer, pw);
}

void lu_pa_poke(struct scsi_lu *lu)
{
	pthread_mutex_lock(&lu->mutex);
	for (struct pa_wait *pw = lu->pa_waits, *next; pw; pw = next) {
		next = pw->next;
		if (pa_busy(lu, pw))
			continue;
		pa_unlist(lu, pw);
		worker_post_call(pw->w, &pw->call, pa_answer, pw);
	}
	pthread_mutex_unlock(&lu->mutex);
}

/* Locked. */
static bool reg_present(const struct scsi_lu *lu, const struct pa_port *pp)
{
	for (const struct pr_reg *r = lu->pr.regs; r; r = r->next)
		if (r->all_tg_pt == pp->all_tg_pt && !strcmp(r->i_port, pp->i_port) && !strcmp(r->t_port, pp->t_port))
			return true;
	return false;
}

static enum scsi_rc preempt_abort(struct scsi_cmd *cmd, uint8_t type, uint64_t key, uint64_t sa_key, uint8_t flags,
				  const uint8_t *p, uint32_t plen)
{
	struct scsi_lu *lu = cmd->lu;
	pthread_mutex_lock(&lu->mutex);
	unsigned n = 0;
	for (const struct pr_reg *r = lu->pr.regs; r; r = r->next)
		n++;
	struct pa_wait *pw = calloc(1, sizeof(*pw) + n * sizeof(pw->port[0]));
	if (!pw) {
		pthread_mutex_unlock(&lu->mutex);
		cmd->status = SAM_STAT_BUSY; /* nothing changed: the host sends it again */
		return SCSI_RC_DONE;
	}
	unsigned i = 0;
	for (const struct pr_reg *r = lu->pr.regs; r; r = r->next, i++) {
		snprintf(pw->port[i].i_port, sizeof(pw->port[i].i_port), "%s", r->i_port);
		snprintf(pw->port[i].t_port, sizeof(pw->port[i].t_port), "%s", r->t_port);
		pw->port[i].all_tg_pt = r->all_tg_pt;
	}
	enum pr_result res = pr_apply(lu, cmd->nexus, PRO_PREEMPT_ABORT, type, key, sa_key, flags, p, plen);
	unsigned busy = 0;
	if (res == PR_OK) {
		/* the registrations it removed, whose nexuses it waits for */
		for (i = 0; i < n; i++)
			if (!reg_present(lu, &pw->port[i]))
				pw->port[pw->n++] = pw->port[i];
		pw->cmd = cmd;
		pw->ep = lu_pa_epoch_next_locked(lu);
		atomic_fetch_add(&lu->pa_waiting, 1);
		busy = pw->n ? pa_busy(lu, pw) : 0;
		pw->w = busy ? worker_self() : NULL;
		if (pw->w) {
			pw->end_ns = lu_now_ns() + PR_DRAIN_MS * 1000000ull;
			pw->listed = true;
			pw->next = lu->pa_waits;
			lu->pa_waits = pw;
		} else {
			atomic_fetch_sub(&lu->pa_waiting, 1);
		}
	}
	pthread_mutex_unlock(&lu->mutex);
	pr_answer(cmd, res);
	if (!pw->w) {
		/* off a worker (a tool's nexus): this thread may sleep */
		uint64_t end = lu_now_ns() + PR_DRAIN_MS * 1000000ull;
		for (i = 0; busy && i < pw->n; i++)
			lu_drain_port(lu, pw->port[i].i_port, pa_tport(&pw->port[i]), cmd->nexus, pw->ep, end);
		free(pw);
		return SCSI_RC_DONE;
	}
	pw->tick.fn = pa_tick;
	worker_tick_add(&pw->tick);
	return SCSI_RC_PENDING;
}

enum scsi_rc pr_out(struct scsi_cmd *cmd)
{
	struct scsi_lu *lu = cmd->lu;
	uint8_t sa = cmd->cdb[1] & 0x1f;
	uint8_t scope = cmd->cdb[2] >> 4;
	uint8_t type = cmd->cdb[2] & 0x0f;
	uint32_t plen = be32_get(cmd->cdb + 5);
	uint8_t p[PR_PARAM_MAX];

	cmd->cdb_xfer_len = plen;
	bool needs_type = sa == PRO_RESERVE || sa == PRO_RELEASE || sa == PRO_PREEMPT ||
			  sa == PRO_PREEMPT_ABORT || sa == PRO_REGISTER_MOVE;
	if (needs_type && scope != 0)
		return scsi_fail_cdb(cmd, 2, 7);
	if (needs_type && !type_valid(type))
		return scsi_fail_cdb(cmd, 2, 3);
	if (sa == PRO_REGISTER_MOVE ? plen < PRO_PARAM_LEN || plen > sizeof(p) : plen != PRO_PARAM_LEN)
		return scsi_fail(cmd, SK_ILLEGAL_REQUEST, ASC_PARAM_LIST_LENGTH_ERROR);
	if (scsi_data_out(cmd, 0, p, plen) < plen)
		return scsi_fail(cmd, SK_ILLEGAL_REQUEST, ASC_PARAM_LIST_LENGTH_ERROR);
	uint64_t key = be64_get(p), sa_key = be64_get(p + 8);
	uint8_t flags = sa == PRO_REGISTER_MOVE ? (p[17] & PRO_APTPL) : p[20];
	if (sa != PRO_REGISTER_MOVE && (flags & PRO_SPEC_I_PT)) {
		/* SIP_C=0: we do not register other I_T nexuses on request */
		return scsi_fail_param(cmd, 20, 3);
	}
	if (sa != PRO_REGISTER && sa != PRO_REGISTER_IGNORE && sa != PRO_REGISTER_MOVE && (flags & PRO_ALL_TG_PT))
		return scsi_fail_param(cmd, 20, 2);

	if (lu->prs)
		return pr_shared_out(cmd, sa, type, key, sa_key, flags, p, plen);
	if (sa == PRO_PREEMPT_ABORT)
		return preempt_abort(cmd, type, key, sa_key, flags, p, plen);
	pthread_mutex_lock(&lu->mutex);
	enum pr_result res = pr_apply(lu, cmd->nexus, sa, type, key, sa_key, flags, p, plen);
	pthread_mutex_unlock(&lu->mutex);
	pr_answer(cmd, res);
	return SCSI_RC_DONE;
}

enum pr_result pr_apply(struct scsi_lu *lu, struct scsi_nexus *nx, uint8_t sa, uint8_t type, uint64_t key,
			uint64_t sa_key, uint8_t flags, const uint8_t *p, uint32_t plen)
{
	enum pr_result res;
	bool old_aptpl = lu->pr.aptpl;
	switch (sa) {
	case PRO_REGISTER:
	case PRO_REGISTER_IGNORE:
		res = do_register(lu, nx, sa == PRO_REGISTER_IGNORE, key, sa_key, flags & PRO_ALL_TG_PT);
		break;
	case PRO_RESERVE:
		res = do_reserve(lu, nx, key, type);
		break;
	case PRO_RELEASE:
		res = do_release(lu, nx, key, type);
		break;
	case PRO_CLEAR:
		res = do_clear(lu, nx, key);
		break;
	case PRO_PREEMPT:
	case PRO_PREEMPT_ABORT:
		res = do_preempt(lu, nx, key, sa_key, type);
		break;
	default:
		res = do_register_move(lu, nx, key, sa_key, p, plen, type);
		break;
	}
	if (res == PR_OK) {
		/* APTPL follows the last REGISTER-family command (SPC-4 5.13.5) */
		if (sa == PRO_REGISTER || sa == PRO_REGISTER_IGNORE || sa == PRO_REGISTER_MOVE)
			lu->pr.aptpl = flags & PRO_APTPL;
		if (!lu->pr.regs)
			lu->pr.aptpl = false;
		if (lu->pr.aptpl || old_aptpl) {
			int e = pr_save(lu);
			if (e < 0)
				log_err("lun \"%s\": cannot persist reservations in %s: %s; "
					"check that the state directory is writable",
					lu->name, lu->state_dir, strerror(-e));
		}
	}
	update_hint(lu);
	return res;
}

void pr_answer(struct scsi_cmd *cmd, enum pr_result res)
{
	switch (res) {
	case PR_OK:
		break;
	case PR_CONFLICT:
		cmd->status = SAM_STAT_RESERVATION_CONFLICT;
		break;
	case PR_BAD_CDB_TYPE:
		scsi_fail_cdb(cmd, 2, 3);
		break;
	case PR_BAD_CDB_SCOPE:
		scsi_fail_cdb(cmd, 2, 7);
		break;
	case PR_BAD_PARAM_KEY:
		scsi_fail_param(cmd, 8, -1);
		break;
	case PR_BAD_RELEASE:
		scsi_fail(cmd, SK_ILLEGAL_REQUEST, ASC_INVALID_RELEASE_OF_PR);
		break;
	case PR_NO_RESOURCES:
		scsi_fail(cmd, SK_ILLEGAL_REQUEST, ASC_INSUFFICIENT_REGISTRATION_RESOURCES);
		break;
	case PR_BAD_PARAM_LEN:
		scsi_fail(cmd, SK_ILLEGAL_REQUEST, ASC_PARAM_LIST_LENGTH_ERROR);
		break;
	case PR_BAD_PARAM_FLAGS:
		scsi_fail_param(cmd, 20, -1);
		break;
	case PR_BAD_TID:
		scsi_fail_param(cmd, 24, -1);
		break;
	}
}
