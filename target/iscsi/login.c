/*
 * login.c - the login phase (RFC 7143 6.3, 11.12, 11.13): identity,
 * authorization, CHAP, operational negotiation, transition to full feature
 * phase.
 *
 * A connection starts here. Each Login Request is checked against the
 * first one (ISID, TSIH, CID must not change), its text is accumulated
 * across C-bit PDUs, then:
 *  - first request: InitiatorName (else 0207 missing parameter),
 *    SessionType, TargetName for normal sessions (else 0207); an unknown
 *    target is 0203 not found, an initiator outside the target's allow list
 *    0202 authorization failure; a non-zero TSIH would add a connection to
 *    a session (we support one connection per session: 0206 too many
 *    connections) or names no session (020a); VersionMin above 0 is 0205.
 *  - security stage: AuthMethod, then CHAP_A -> CHAP_I/CHAP_C challenge ->
 *    CHAP_N/CHAP_R response checked (chap.c), plus the mutual answer when
 *    the initiator sends its own CHAP_I/CHAP_C. Any failure is 0201
 *    authentication failure. A target with CHAP configured cannot be
 *    reached by skipping the security stage.
 *  - operational stage: keys go to param.c; a protocol error there (a key
 *    offered twice, a malformed text) is 0200 initiator error.
 *  - transit to full feature phase: the session is created (session.c,
 *    which also reinstates an older session with the same ISID) and the
 *    final response carries its TSIH. Digests take effect on the next PDU.
 * Internal failures are 0300 target error / 0302 out of resources. Every
 * refusal is logged with the initiator and the reason, never a secret;
 * the connection closes once the refusal has been written.
 *
 * Threading: the connection's worker thread; the session table and the
 * portal configuration are read through session.c / portal.c.
 */
#include "target/iscsi/iscsi_int.h"

#include "common/log.h"

#include <openssl/crypto.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define LOGIN_MAX_KEYS 64

enum chap_state { CHAP_NONE, CHAP_WAIT_A, CHAP_WAIT_R, CHAP_DONE };

struct iscsi_login {
	bool first_seen;
	bool names_set;
	uint8_t isid[6];
	uint16_t tsih;
	uint16_t cid;
	uint32_t cmdsn;
	int stage;                 /* -1 until the first request is accepted */
	bool auth_required;
	/* the credentials this login is checked against: the target's, or
	 * the portal's discovery CHAP (strings of a configuration kept while
	 * any login may read it) */
	const char *chap_user, *chap_secret, *mutual_user, *mutual_secret;
	bool authenticated;
	bool mutual_done;          /* we proved ourselves to the initiator too */
	enum chap_state chap;
	struct iscsi_chap chal;
	char initiator[ISCSI_NAME_MAX];
	const struct iscsi_target_cfg *tgt;
	bool discovery;
	struct iscsi_params params;
	struct iscsi_neg_ctx neg;
	bool mrdsl_declared;
	bool first_response_sent;
	char *acc;
	size_t acc_len;
	/* a CHAP proof waiting for its turn to be judged (auth_guard.c):
	 * iscsi_login_tick processes its PDU at hold_until; PDUs that come
	 * meanwhile are dropped */
	uint64_t hold_until;
	uint8_t hold_req[48];
};

bool iscsi_acl_allows(const struct iscsi_target_cfg *t, const char *initiator)
{
	if (t->nallow == 0)
		return true;
	for (int i = 0; i < t->nallow; i++)
		if (strcasecmp(t->allow[i], initiator) == 0)
			return true;
	return false;
}

const struct iscsi_target_cfg *iscsi_find_target(const char *iqn)
{
	const struct iscsi_portal_cfg *cfg = iscsi_portal_cfg();
	if (!cfg)
		return NULL;
	for (int i = 0; i < cfg->ntargets; i++)
		if (strcasecmp(cfg->targets[i].iqn, iqn) == 0)
			return &cfg->targets[i];
	return NULL;
}

int iscsi_login_init(struct iscsi_conn *c)
{
	struct iscsi_login *L = calloc(1, sizeof(*L));
	if (!L)
		return -1;
	L->stage = -1;
	iscsi_params_default(&L->params);
	L->neg.leading = true;
	c->login = L;
	return 0;
}

void iscsi_login_free(struct iscsi_conn *c)
{
	struct iscsi_login *L = c->login;
	if (!L)
		return;
	free(L->acc);
	OPENSSL_cleanse(L, sizeof(*L));
	free(L);
	c->login = NULL;
}

/* Build and queue a Login Response. */
static void send_login_rsp(struct iscsi_conn *c, const uint8_t *req, uint8_t flags,
			   uint16_t status, uint16_t tsih, const char *text, size_t len,
			   bool close_after)
{
	struct iscsi_login *L = c->login;
	struct iscsi_tx *tx = iscsi_tx_new(len);
	if (!tx) {
		iscsi_conn_close(c, "out of memory");
		return;
	}
	struct iscsi_login_rsp_hdr *r = (struct iscsi_login_rsp_hdr *)tx->hdr;
	r->opcode = ISCSI_OP_LOGIN_RSP;
	r->flags = flags;
	r->version_max = 0;
	r->version_active = 0;
	memcpy(r->isid, req + 8, 6);
	be16_put(r->tsih, tsih);
	be32_put(r->itt, bhs_itt(req));
	be32_put(r->statsn, c->statsn++);
	be32_put(r->exp_cmdsn, L->cmdsn);
	be32_put(r->max_cmdsn, L->cmdsn + ISCSI_QUEUE_DEPTH - 1);
	r->status_class = (uint8_t)(status >> 8);
	r->status_detail = (uint8_t)status;
	if (len)
		memcpy(tx->payload, text, len);
	tx->close_after = close_after;
	iscsi_conn_send(c, tx);
	L->first_response_sent = true;
}

/* Logins since start, for metrics: accepted, refused (class 2: the
 * initiator's fault), failed (class 3: ours). */
static _Atomic uint64_t logins_ok, logins_refused, logins_failed;

void iscsi_login_counts(uint64_t *ok, uint64_t *refused, uint64_t *failed)
{
	*ok = atomic_load_explicit(&logins_ok, memory_order_relaxed);
	*refused = atomic_load_explicit(&logins_refused, memory_order_relaxed);
	*failed = atomic_load_explicit(&logins_failed, memory_order_relaxed);
}

static void count_refused(const struct iscsi_login *L, bool ours)
{
	if (ours) {
		atomic_fetch_add_explicit(&logins_failed, 1, memory_order_relaxed);
		return;
	}
	atomic_fetch_add_explicit(&logins_refused, 1, memory_order_relaxed);
	if (L->tgt && L->tgt->scsi)
		scsi_target_count_refused(L->tgt->scsi);
}

static void login_fail(struct iscsi_conn *c, const uint8_t *req, uint16_t status, const char *why)
{
	struct iscsi_login *L = c->login;
	const char *who = L->initiator[0] ? L->initiator : "an initiator";
	count_refused(L, status >> 8 == 3);

	if (status >> 8 == 3)
		log_err("iSCSI %s: login of %s failed: %s (status 0x%04x)", c->peer, who, why, status);
	else
		log_warn("iSCSI %s: login of %s refused: %s (status 0x%04x)", c->peer, who, why, status);
	uint8_t flags = (uint8_t)((L->stage < 0 ? 0 : L->stage) << 2);
	send_login_rsp(c, req, flags, status, 0, NULL, 0, true);
}

/*
 * A CHAP proof failed (wrong secret or user, a bad mutual challenge): one
 * log line per address per minute (auth_guard.c), which also makes the
 * next proofs from this address wait for their turn.
 */
static void chap_refused(struct iscsi_conn *c, const uint8_t *req, uint16_t status, const char *why)
{
	struct iscsi_login *L = c->login;
	bool log_now;
	uint32_t unlogged;
	iscsi_auth_guard_fail(c->peer, &log_now, &unlogged);
	count_refused(L, false);
	const char *who = L->initiator[0] ? L->initiator : "an initiator";
	if (log_now && unlogged)
		log_warn("iSCSI %s: login of %s refused: %s (status 0x%04x); %u more failed or were turned away "
			 "from this address since the last line", c->peer, who, why, status, unlogged);
	else if (log_now)
		log_warn("iSCSI %s: login of %s refused: %s (status 0x%04x)", c->peer, who, why, status);
	uint8_t flags = (uint8_t)((L->stage < 0 ? 0 : L->stage) << 2);
	send_login_rsp(c, req, flags, status, 0, NULL, 0, true);
}

/* Whether the collected login text holds a CHAP proof (CHAP_N or CHAP_R),
 * read without parsing (parsing writes into the text). */
static bool acc_has_chap_proof(const struct iscsi_login *L)
{
	size_t i = 0;
	while (i < L->acc_len) {
		const char *pair = L->acc + i;
		size_t left = L->acc_len - i, plen = strnlen(pair, left);
		if (plen >= 7 && (!memcmp(pair, "CHAP_N=", 7) || !memcmp(pair, "CHAP_R=", 7)))
			return true;
		i += plen + 1;
	}
	return false;
}

static void login_process(struct iscsi_conn *c, const uint8_t *bhs);

void iscsi_login_tick(struct iscsi_conn *c)
{
	struct iscsi_login *L = c->login;
	if (!L || !L->hold_until || now_ms() < L->hold_until)
		return;
	L->hold_until = 0;
	login_process(c, L->hold_req);
}

static bool list_has(const char *list, const char *item)
{
	size_t il = strlen(item);
	const char *p = list;
	while (*p) {
		size_t n = strcspn(p, ",");
		if (n == il && strncmp(p, item, n) == 0)
			return true;
		p += n;
		if (*p == ',')
			p++;
	}
	return false;
}

/* First request: who is this, and may they come in? 0 or a login status. */
static uint16_t check_identity(struct iscsi_conn *c, const struct iscsi_kv *kv, int n,
			       const char **why)
{
	struct iscsi_login *L = c->login;
	const char *iname = iscsi_kv_get(kv, n, "InitiatorName");
	const char *stype = iscsi_kv_get(kv, n, "SessionType");
	const char *tname = iscsi_kv_get(kv, n, "TargetName");

	if (!iname || !*iname) {
		*why = "no InitiatorName key in the first Login Request";
		return ISCSI_LOGIN_MISSING_PARAMETER;
	}
	if (strlen(iname) >= ISCSI_NAME_MAX) {
		*why = "InitiatorName longer than 223 bytes";
		return ISCSI_LOGIN_INITIATOR_ERROR;
	}
	snprintf(L->initiator, sizeof(L->initiator), "%s", iname);
	if (!stype || strcmp(stype, "Normal") == 0) {
		L->discovery = false;
	} else if (strcmp(stype, "Discovery") == 0) {
		L->discovery = true;
	} else {
		*why = "SessionType is neither Normal nor Discovery";
		return ISCSI_LOGIN_INITIATOR_ERROR;
	}
	if (!L->discovery) {
		if (!tname || !*tname) {
			*why = "no TargetName key in a normal session's first Login Request";
			return ISCSI_LOGIN_MISSING_PARAMETER;
		}
		L->tgt = iscsi_find_target(tname);
		if (!L->tgt) {
			*why = "no such target";
			log_info("iSCSI %s: %s asked for unknown target %.223s", c->peer, iname, tname);
			return ISCSI_LOGIN_NOT_FOUND;
		}
		if (!iscsi_acl_allows(L->tgt, iname)) {
			*why = "initiator not in the target's allow list";
			return ISCSI_LOGIN_AUTHORIZATION_FAILED;
		}
		L->chap_user = L->tgt->chap_user;
		L->chap_secret = L->tgt->chap_secret;
		L->mutual_user = L->tgt->mutual_user;
		L->mutual_secret = L->tgt->mutual_secret;
	} else {
		const struct iscsi_portal_cfg *pc = iscsi_portal_cfg();
		if (pc) {
			L->chap_user = pc->disc_chap_user;
			L->chap_secret = pc->disc_chap_secret;
			L->mutual_user = pc->disc_mutual_user;
			L->mutual_secret = pc->disc_mutual_secret;
		}
	}
	L->auth_required = L->chap_user != NULL;
	if (L->tsih != 0) {
		if (iscsi_sess_tsih_exists(L->tsih)) {
			*why = "adding a connection to a session (MaxConnections=1)";
			return ISCSI_LOGIN_TOO_MANY_CONNECTIONS;
		}
		*why = "TSIH names no session";
		return ISCSI_LOGIN_SESSION_DOES_NOT_EXIST;
	}
	L->names_set = true;
	return 0;
}

/* CHAP_N/CHAP_R (and the mutual CHAP_I/CHAP_C): 0 or a login status. */
static uint16_t check_chap_response(struct iscsi_conn *c, const struct iscsi_kv *kv, int n,
				    struct iscsi_text_out *out, const char **why)
{
	struct iscsi_login *L = c->login;
	const char *name = iscsi_kv_get(kv, n, "CHAP_N");
	const char *resp = iscsi_kv_get(kv, n, "CHAP_R");
	const char *mi = iscsi_kv_get(kv, n, "CHAP_I");
	const char *mc = iscsi_kv_get(kv, n, "CHAP_C");
	char mutual[2 * CHAP_DIGEST_MAX + 3];

	if (L->chap != CHAP_WAIT_R) {
		*why = "CHAP response without a challenge";
		return ISCSI_LOGIN_AUTH_FAILED;
	}
	if (!name || !resp) {
		*why = "CHAP_N or CHAP_R missing";
		return ISCSI_LOGIN_AUTH_FAILED;
	}
	if (strcmp(name, L->chap_user) != 0) {
		*why = "unknown CHAP user";
		return ISCSI_LOGIN_AUTH_FAILED;
	}
	if (!chap_verify(&L->chal, L->chap_secret, resp)) {
		*why = "CHAP response does not match the secret";
		return ISCSI_LOGIN_AUTH_FAILED;
	}
	if (mi || mc) {
		if (!mi || !mc) {
			*why = "mutual CHAP needs both CHAP_I and CHAP_C";
			return ISCSI_LOGIN_AUTH_FAILED;
		}
		if (!L->mutual_user || !L->mutual_secret) {
			*why = "initiator asked for mutual CHAP but the target has no mutual credentials";
			return ISCSI_LOGIN_AUTH_FAILED;
		}
		if (chap_mutual_response(&L->chal, L->mutual_secret, mi, mc, mutual) < 0) {
			*why = "mutual CHAP challenge malformed or reflecting ours";
			return ISCSI_LOGIN_AUTH_FAILED;
		}
		iscsi_text_add(out, "CHAP_N", L->mutual_user);
		iscsi_text_add(out, "CHAP_R", mutual);
		OPENSSL_cleanse(mutual, sizeof(mutual));
		L->mutual_done = true;
	}
	L->chap = CHAP_DONE;
	L->authenticated = true;
	return 0;
}

static void enter_full_feature(struct iscsi_conn *c, const uint8_t *req, uint8_t flags,
			       struct iscsi_text_out *out)
{
	struct iscsi_login *L = c->login;
	struct iscsi_sess *s;

	s = iscsi_sess_new(c, L->isid, L->initiator, L->tgt, L->discovery, L->cmdsn);
	if (!s) {
		login_fail(c, req, ISCSI_LOGIN_OUT_OF_RESOURCES, "cannot create the session");
		return;
	}
	s->params = L->params;
	c->sess = s;
	c->cid = L->cid;
	send_login_rsp(c, req, flags, ISCSI_LOGIN_OK, s->tsih, out->buf, out->len, false);
	/* The response above went out under login rules; digests start now. */
	c->params = L->params;
	c->state = CONN_FULL_FEATURE;
	atomic_fetch_add_explicit(&logins_ok, 1, memory_order_relaxed);
	const enum chap_alg alg = L->authenticated ? L->chal.alg : CHAP_ALG_NONE;
	log_info("iSCSI %s: %s logged in to %s (TSIH %u, auth %s%s, HeaderDigest %s, DataDigest %s, "
		 "MaxRecvDataSegmentLength %u/%u, MaxBurstLength %u, FirstBurstLength %u, "
		 "InitialR2T %s, ImmediateData %s)",
		 c->peer, L->initiator, L->discovery ? "discovery" : L->tgt->iqn, s->tsih,
		 alg == CHAP_ALG_SHA3_256 ? "CHAP SHA3-256"
		 : alg == CHAP_ALG_SHA256 ? "CHAP SHA-256"
		 : alg == CHAP_ALG_MD5	  ? "CHAP MD5"
					  : "None",
		 L->mutual_done ? " mutual" : "",
		 c->params.header_digest ? "CRC32C" : "None",
		 c->params.data_digest ? "CRC32C" : "None", c->params.initiator_mrdsl,
		 c->params.target_mrdsl, c->params.max_burst, c->params.first_burst,
		 c->params.initial_r2t ? "Yes" : "No", c->params.immediate_data ? "Yes" : "No");
	iscsi_login_free(c);
}

void iscsi_login_pdu(struct iscsi_conn *c, const uint8_t *bhs, char *data, uint32_t dlen)
{
	struct iscsi_login *L = c->login;
	const struct iscsi_login_req_hdr *h = (const struct iscsi_login_req_hdr *)bhs;
	uint8_t flags = h->flags;
	bool transit = flags & ISCSI_LOGIN_TRANSIT;
	int csg = ISCSI_LOGIN_CSG(flags);

	if (!L || L->hold_until)
		return; /* a proof waits for its turn: nothing else until it is judged */
	if (!L->first_seen) {
		L->first_seen = true;
		memcpy(L->isid, h->isid, 6);
		L->tsih = be16_get(h->tsih);
		L->cid = be16_get(h->cid);
		L->cmdsn = be32_get(h->cmdsn);
		c->statsn = be32_get(h->exp_statsn);
		if (h->version_min > 0) {
			login_fail(c, bhs, ISCSI_LOGIN_UNSUPPORTED_VERSION,
				   "initiator needs iSCSI version > 0");
			return;
		}
	} else if (memcmp(L->isid, h->isid, 6) != 0 || L->tsih != be16_get(h->tsih) ||
		   L->cid != be16_get(h->cid)) {
		login_fail(c, bhs, ISCSI_LOGIN_INITIATOR_ERROR, "ISID, TSIH or CID changed during login");
		return;
	}
	if (transit && (flags & ISCSI_LOGIN_CONTINUE)) {
		login_fail(c, bhs, ISCSI_LOGIN_INITIATOR_ERROR, "both T and C bits set");
		return;
	}

	/* Text split over several PDUs: collect, answer each piece empty. */
	if (L->acc_len + dlen > ISCSI_TEXT_MAX) {
		login_fail(c, bhs, ISCSI_LOGIN_INITIATOR_ERROR, "login text too long");
		return;
	}
	if (dlen) {
		char *nacc = realloc(L->acc, L->acc_len + dlen + 1);
		if (!nacc) {
			login_fail(c, bhs, ISCSI_LOGIN_OUT_OF_RESOURCES, "out of memory");
			return;
		}
		L->acc = nacc;
		memcpy(L->acc + L->acc_len, data, dlen);
		L->acc_len += dlen;
	}
	if (flags & ISCSI_LOGIN_CONTINUE) {
		send_login_rsp(c, bhs, (uint8_t)(csg << 2), ISCSI_LOGIN_OK, 0, NULL, 0, false);
		return;
	}
	if (acc_has_chap_proof(L)) {
		uint32_t wait;
		if (iscsi_auth_guard_admit(c->peer, &wait) < 0) {
			/* counted and logged with the failures (auth_guard.c) */
			count_refused(L, false); /* turned away: the address failed too often */
			send_login_rsp(c, bhs, (uint8_t)(csg << 2), ISCSI_LOGIN_SERVICE_UNAVAILABLE, 0, NULL, 0,
				       true);
			return;
		}
		if (wait) {
			L->hold_until = now_ms() + wait;
			memcpy(L->hold_req, bhs, sizeof(L->hold_req));
			return;
		}
	}
	login_process(c, bhs);
}

/* The rest of a login request whose text is all in L->acc. */
static void login_process(struct iscsi_conn *c, const uint8_t *bhs)
{
	struct iscsi_login *L = c->login;
	uint8_t flags = bhs[1];
	bool transit = flags & ISCSI_LOGIN_TRANSIT;
	int csg = ISCSI_LOGIN_CSG(flags), nsg = ISCSI_LOGIN_NSG(flags);
	const char *why = NULL;
	uint16_t st;

	struct iscsi_kv kv[LOGIN_MAX_KEYS];
	int n = L->acc_len ? iscsi_text_parse(L->acc, L->acc_len, kv, LOGIN_MAX_KEYS) : 0;
	if (n < 0) {
		login_fail(c, bhs, ISCSI_LOGIN_INITIATOR_ERROR, "malformed login text");
		return;
	}

	if (!L->names_set) {
		st = check_identity(c, kv, n, &why);
		if (st) {
			login_fail(c, bhs, st, why);
			return;
		}
		L->neg.discovery = L->discovery;
	}
	if (L->stage < 0) {
		if (csg == ISCSI_STAGE_SECURITY) {
			L->stage = ISCSI_STAGE_SECURITY;
		} else if (csg == ISCSI_STAGE_OPERATIONAL) {
			L->stage = ISCSI_STAGE_OPERATIONAL;
			if (L->auth_required) {
				login_fail(c, bhs, ISCSI_LOGIN_AUTH_FAILED,
					   "target requires CHAP but the initiator skipped authentication");
				return;
			}
		} else {
			login_fail(c, bhs, ISCSI_LOGIN_INITIATOR_ERROR, "login starts in an invalid stage");
			return;
		}
	} else if (csg != L->stage) {
		login_fail(c, bhs, ISCSI_LOGIN_INITIATOR_ERROR, "login stage out of sequence");
		return;
	}
	if (transit && (nsg == 2 || nsg <= csg)) {
		login_fail(c, bhs, ISCSI_LOGIN_INITIATOR_ERROR, "invalid next stage");
		return;
	}

	char text[ISCSI_LOGIN_MAX_DSL];
	struct iscsi_text_out out = { .buf = text, .cap = sizeof(text) };
	bool chap_keys = false;

	L->neg.phase = L->stage == ISCSI_STAGE_SECURITY ? ISCSI_NEG_SECURITY : ISCSI_NEG_OPERATIONAL;
	for (int i = 0; i < n; i++) {
		const char *key = kv[i].key, *val = kv[i].value;
		if (strcmp(key, "InitiatorName") == 0) {
			if (strcmp(val, L->initiator) != 0) {
				login_fail(c, bhs, ISCSI_LOGIN_INITIATOR_ERROR, "InitiatorName changed");
				return;
			}
		} else if (strcmp(key, "TargetName") == 0) {
			if (!L->discovery && strcasecmp(val, L->tgt->iqn) != 0) {
				login_fail(c, bhs, ISCSI_LOGIN_INITIATOR_ERROR, "TargetName changed");
				return;
			}
		} else if (strcmp(key, "SessionType") == 0) {
			if (strcmp(val, L->discovery ? "Discovery" : "Normal") != 0) {
				login_fail(c, bhs, ISCSI_LOGIN_INITIATOR_ERROR, "SessionType changed");
				return;
			}
		} else if (strcmp(key, "AuthMethod") == 0) {
			if (L->stage != ISCSI_STAGE_SECURITY) {
				iscsi_text_add(&out, key, "Irrelevant");
			} else if (L->auth_required) {
				if (!list_has(val, "CHAP")) {
					login_fail(c, bhs, ISCSI_LOGIN_AUTH_FAILED,
						   "target requires CHAP; the initiator does not offer it");
					return;
				}
				iscsi_text_add(&out, key, "CHAP");
				L->chap = CHAP_WAIT_A;
				chap_keys = true;
			} else if (list_has(val, "None")) {
				iscsi_text_add(&out, key, "None");
			} else {
				login_fail(c, bhs, ISCSI_LOGIN_AUTH_FAILED,
					   "initiator insists on authentication the target has no credentials for");
				return;
			}
		} else if (strcmp(key, "CHAP_A") == 0) {
			chap_keys = true;
			if (L->chap != CHAP_WAIT_A) {
				login_fail(c, bhs, ISCSI_LOGIN_AUTH_FAILED, "CHAP_A out of sequence");
				return;
			}
			enum chap_alg alg = chap_pick_algorithm(val);
			if (alg == CHAP_ALG_NONE) {
				login_fail(c, bhs, ISCSI_LOGIN_AUTH_FAILED,
					   "initiator offers no CHAP algorithm we support (SHA3-256 = 8, SHA-256 = 7, "
					   "MD5 = 5)");
				return;
			}
			if (chap_new_challenge(&L->chal, alg) < 0) {
				login_fail(c, bhs, ISCSI_LOGIN_TARGET_ERROR, "getrandom failed");
				return;
			}
			char hex[2 * CHAP_CHALLENGE_MAX + 3];
			chap_encode_hex(L->chal.challenge, L->chal.challenge_len, hex);
			iscsi_text_addf(&out, "CHAP_A", "%d", (int)alg);
			iscsi_text_addf(&out, "CHAP_I", "%u", L->chal.id);
			iscsi_text_add(&out, "CHAP_C", hex);
			L->chap = CHAP_WAIT_R;
		} else if (strncmp(key, "CHAP_", 5) == 0) {
			chap_keys = true; /* N, R, I, C: checked together below */
		} else {
			enum iscsi_neg_result r = iscsi_param_negotiate(&L->params, &L->neg, key, val, &out);
			if (r == ISCSI_NEG_PROTOCOL) {
				login_fail(c, bhs, ISCSI_LOGIN_INITIATOR_ERROR, "key offered twice");
				return;
			}
			/* NOT_MINE here: target-declared keys sent by an initiator; ignored. */
		}
	}
	if (iscsi_kv_get(kv, n, "CHAP_N") || iscsi_kv_get(kv, n, "CHAP_R")) {
		st = check_chap_response(c, kv, n, &out, &why);
		if (st) {
			chap_refused(c, bhs, st, why);
			return;
		}
	} else if (iscsi_kv_get(kv, n, "CHAP_I") || iscsi_kv_get(kv, n, "CHAP_C")) {
		login_fail(c, bhs, ISCSI_LOGIN_AUTH_FAILED, "CHAP_I/CHAP_C without CHAP_N/CHAP_R");
		return;
	}
	free(L->acc);
	L->acc = NULL;
	L->acc_len = 0;

	if (!L->first_response_sent && !L->discovery) {
		/* this gateway's port group (several gateways, one LUN) */
		const struct iscsi_portal_cfg *pcfg = iscsi_portal_cfg();
		char tag[12];
		snprintf(tag, sizeof(tag), "%u", pcfg && pcfg->tpgt ? pcfg->tpgt : 1);
		iscsi_text_add(&out, "TargetPortalGroupTag", tag);
	}

	uint8_t rflags = (uint8_t)(L->stage << 2);
	bool to_ffp = false;
	if (transit) {
		if (L->stage == ISCSI_STAGE_SECURITY && L->auth_required && !L->authenticated) {
			if (!chap_keys || L->chap == CHAP_NONE) {
				login_fail(c, bhs, ISCSI_LOGIN_AUTH_FAILED,
					   "initiator left the security stage without authenticating");
				return;
			}
			/* CHAP still in progress: stay in this stage (T=0). */
		} else {
			rflags |= ISCSI_LOGIN_TRANSIT | (uint8_t)nsg;
			to_ffp = nsg == ISCSI_STAGE_FULL_FEATURE;
		}
	}
	bool declare = !L->mrdsl_declared &&
		       (L->stage == ISCSI_STAGE_OPERATIONAL || to_ffp);
	iscsi_param_finish(&L->params, &L->neg, &out, declare);
	if (declare)
		L->mrdsl_declared = true;
	if (out.full) {
		login_fail(c, bhs, ISCSI_LOGIN_TARGET_ERROR, "login response does not fit");
		return;
	}
	if (to_ffp) {
		enter_full_feature(c, bhs, rflags, &out);
		return;
	}
	if (rflags & ISCSI_LOGIN_TRANSIT)
		L->stage = nsg;
	send_login_rsp(c, bhs, rflags, ISCSI_LOGIN_OK, 0, out.buf, out.len, false);
}
