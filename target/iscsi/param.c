/*
 * param.c - text key parsing and operational parameter negotiation.
 *
 * The key table below is the whole of our negotiation policy: for each
 * standard key its kind (how the two offers combine, RFC 7143 6.2), its
 * legal range, our own value, and whether it may be renegotiated in the
 * full feature phase. iscsi_param_negotiate looks a key up, checks phase
 * and range, combines the initiator's offer with ours, stores the result
 * in struct iscsi_params and appends the answer. Identity and security
 * keys (names, SessionType, AuthMethod, CHAP_*, SendTargets) belong to
 * login.c / text.c and are handed back as ISCSI_NEG_NOT_MINE.
 *
 * Threading: no globals written; any thread.
 */
#include "target/iscsi/param.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OUR_MAX_BURST 16776192u      /* 16 MiB - 1 KiB: fits one pooled buffer */
#define OUR_FIRST_BURST 16776192u
#define OUR_MAX_OUTSTANDING_R2T 8u
#define OUR_TIME2RETAIN 20u
#define ISCSI_DSL_MIN 512u
#define ISCSI_DSL_MAX 16777215u

void iscsi_params_default(struct iscsi_params *p)
{
	p->header_digest = false;
	p->data_digest = false;
	p->max_connections = 1;
	p->initial_r2t = true;
	p->immediate_data = true;
	p->initiator_mrdsl = 8192;
	p->target_mrdsl = ISCSI_OUR_MAX_RECV_DSL;
	p->max_burst = 262144;
	p->first_burst = 65536;
	p->time2wait = 2;
	p->time2retain = 20;
	p->max_outstanding_r2t = 1;
	p->data_pdu_in_order = true;
	p->data_seq_in_order = true;
	p->erl = 0;
}

int iscsi_text_parse(char *buf, size_t len, struct iscsi_kv *kv, int max)
{
	size_t i = 0;
	int n = 0;

	if (len && buf[len - 1] != '\0')
		buf[len] = '\0'; /* the caller guarantees room for it */
	while (i < len) {
		char *pair = buf + i;
		size_t plen = strlen(pair);
		i += plen + 1;
		if (plen == 0)
			continue; /* tolerate padding NULs */
		char *eq = strchr(pair, '=');
		if (!eq || eq == pair || eq - pair > 63 || strlen(eq + 1) > 8192)
			return -1;
		if (n == max)
			return -2;
		*eq = '\0';
		kv[n].key = pair;
		kv[n].value = eq + 1;
		n++;
	}
	return n;
}

const char *iscsi_kv_get(const struct iscsi_kv *kv, int n, const char *key)
{
	for (int i = 0; i < n; i++)
		if (strcmp(kv[i].key, key) == 0)
			return kv[i].value;
	return NULL;
}

void iscsi_text_add(struct iscsi_text_out *o, const char *key, const char *value)
{
	size_t kl = strlen(key), vl = strlen(value);

	if (o->len + kl + vl + 2 > o->cap) {
		o->full = true;
		return;
	}
	memcpy(o->buf + o->len, key, kl);
	o->buf[o->len + kl] = '=';
	memcpy(o->buf + o->len + kl + 1, value, vl);
	o->buf[o->len + kl + 1 + vl] = '\0';
	o->len += kl + vl + 2;
}

void iscsi_text_addf(struct iscsi_text_out *o, const char *key, const char *fmt, ...)
{
	char v[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(v, sizeof(v), fmt, ap);
	va_end(ap);
	iscsi_text_add(o, key, v);
}

int iscsi_parse_number(const char *s, uint64_t *out)
{
	char *end;
	int base = 10;

	if (!*s)
		return -1;
	if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
		base = 16;
		s += 2;
		if (!*s)
			return -1;
	}
	for (const char *c = s; *c; c++)
		if (!(base == 16 ? (*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f') ||
				     (*c >= 'A' && *c <= 'F')
				   : (*c >= '0' && *c <= '9')))
			return -1;
	if (strlen(s) > 16)
		return -1;
	*out = strtoull(s, &end, base);
	return *end ? -1 : 0;
}

/* ---- the key table ---- */

enum key_kind {
	K_DIGEST,      /* list: CRC32C / None */
	K_AND,         /* boolean, result = ours AND theirs */
	K_OR,          /* boolean, result = ours OR theirs */
	K_MIN,         /* numeric, result = min(ours, theirs) */
	K_MAX,         /* numeric, result = max(ours, theirs) */
	K_MRDSL,       /* declarative: the initiator's receive limit */
	K_DECLARE,     /* declarative, nothing to answer */
	K_MARKER,      /* obsolete RFC 3720 marker keys: answer No */
	K_MARKINT,     /* obsolete marker intervals: Irrelevant */
};

enum key_field {
	F_NONE, F_HDIGEST, F_DDIGEST, F_MAXCONN, F_INITIAL_R2T, F_IMMEDIATE, F_MAXBURST,
	F_FIRSTBURST, F_T2W, F_T2R, F_MAXR2T, F_PDU_ORDER, F_SEQ_ORDER, F_ERL, F_MRDSL,
};

struct key_def {
	const char *name;
	enum key_kind kind;
	enum key_field field;
	uint32_t min, max;      /* legal range of numeric values */
	uint32_t ours;          /* our offer (numeric) or 1/0 (boolean) */
	bool ffp_ok;            /* may appear in a Text request in full feature phase */
	bool irrelevant_in_discovery;
};

static const struct key_def keys[] = {
	{ "HeaderDigest", K_DIGEST, F_HDIGEST, 0, 0, 0, false, false },
	{ "DataDigest", K_DIGEST, F_DDIGEST, 0, 0, 0, false, false },
	{ "MaxConnections", K_MIN, F_MAXCONN, 1, 65535, 1, false, true },
	{ "InitialR2T", K_OR, F_INITIAL_R2T, 0, 1, 0, false, true },
	{ "ImmediateData", K_AND, F_IMMEDIATE, 0, 1, 1, false, true },
	{ "MaxRecvDataSegmentLength", K_MRDSL, F_MRDSL, ISCSI_DSL_MIN, ISCSI_DSL_MAX, 0, true, false },
	{ "MaxBurstLength", K_MIN, F_MAXBURST, ISCSI_DSL_MIN, ISCSI_DSL_MAX, OUR_MAX_BURST, false, true },
	{ "FirstBurstLength", K_MIN, F_FIRSTBURST, ISCSI_DSL_MIN, ISCSI_DSL_MAX, OUR_FIRST_BURST, false, true },
	{ "DefaultTime2Wait", K_MAX, F_T2W, 0, 3600, 0, false, false },
	{ "DefaultTime2Retain", K_MIN, F_T2R, 0, 3600, OUR_TIME2RETAIN, false, false },
	{ "MaxOutstandingR2T", K_MIN, F_MAXR2T, 1, 65535, OUR_MAX_OUTSTANDING_R2T, false, true },
	{ "DataPDUInOrder", K_OR, F_PDU_ORDER, 0, 1, 1, false, true },
	{ "DataSequenceInOrder", K_OR, F_SEQ_ORDER, 0, 1, 1, false, true },
	{ "ErrorRecoveryLevel", K_MIN, F_ERL, 0, 2, 0, false, false },
	{ "InitiatorAlias", K_DECLARE, F_NONE, 0, 0, 0, true, false },
	{ "OFMarker", K_MARKER, F_NONE, 0, 1, 0, false, false },
	{ "IFMarker", K_MARKER, F_NONE, 0, 1, 0, false, false },
	{ "OFMarkInt", K_MARKINT, F_NONE, 0, 0, 0, false, false },
	{ "IFMarkInt", K_MARKINT, F_NONE, 0, 0, 0, false, false },
};
#define NKEYS (int)(sizeof(keys) / sizeof(keys[0]))

/* Keys login.c and text.c own. */
static const char *const login_keys[] = {
	"InitiatorName", "TargetName", "SessionType", "AuthMethod", "SendTargets",
	"TargetAlias", "TargetAddress", "TargetPortalGroupTag",
	"CHAP_A", "CHAP_I", "CHAP_C", "CHAP_N", "CHAP_R",
};

static void store(struct iscsi_params *p, enum key_field f, uint32_t v)
{
	switch (f) {
	case F_HDIGEST: p->header_digest = v; break;
	case F_DDIGEST: p->data_digest = v; break;
	case F_MAXCONN: p->max_connections = v; break;
	case F_INITIAL_R2T: p->initial_r2t = v; break;
	case F_IMMEDIATE: p->immediate_data = v; break;
	case F_MAXBURST: p->max_burst = v; break;
	case F_FIRSTBURST: p->first_burst = v; break;
	case F_T2W: p->time2wait = v; break;
	case F_T2R: p->time2retain = v; break;
	case F_MAXR2T: p->max_outstanding_r2t = v; break;
	case F_PDU_ORDER: p->data_pdu_in_order = v; break;
	case F_SEQ_ORDER: p->data_seq_in_order = v; break;
	case F_ERL: p->erl = v; break;
	case F_MRDSL: p->initiator_mrdsl = v; break;
	case F_NONE: break;
	}
}

static int parse_bool(const char *v)
{
	if (strcmp(v, "Yes") == 0)
		return 1;
	if (strcmp(v, "No") == 0)
		return 0;
	return -1;
}

/* First of the initiator's comma-separated choices we support. */
static int pick_digest(const char *list, const char **chosen)
{
	char tmp[256];
	char *save = NULL;

	if (strlen(list) >= sizeof(tmp))
		return -1;
	strcpy(tmp, list);
	for (char *t = strtok_r(tmp, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		if (strcmp(t, "CRC32C") == 0) {
			*chosen = "CRC32C";
			return 1;
		}
		if (strcmp(t, "None") == 0) {
			*chosen = "None";
			return 0;
		}
	}
	return -1;
}

enum iscsi_neg_result iscsi_param_negotiate(struct iscsi_params *p, struct iscsi_neg_ctx *ctx,
					    const char *key, const char *value,
					    struct iscsi_text_out *out)
{
	const struct key_def *k = NULL;
	int idx;

	for (size_t i = 0; i < sizeof(login_keys) / sizeof(login_keys[0]); i++)
		if (strcmp(key, login_keys[i]) == 0)
			return ISCSI_NEG_NOT_MINE;
	for (idx = 0; idx < NKEYS; idx++) {
		if (strcmp(keys[idx].name, key) == 0) {
			k = &keys[idx];
			break;
		}
	}
	if (!k) {
		/* Private/extension keys (X-..., X#...) and anything unknown. */
		iscsi_text_add(out, key, "NotUnderstood");
		return ISCSI_NEG_OK;
	}
	if (ctx->seen & (1ull << idx))
		return ISCSI_NEG_PROTOCOL; /* offered twice in one negotiation */
	ctx->seen |= 1ull << idx;

	if (ctx->phase == ISCSI_NEG_FULL_FEATURE && !k->ffp_ok) {
		iscsi_text_add(out, key, "Reject");
		return ISCSI_NEG_OK;
	}
	if (!ctx->leading && k->kind != K_DIGEST && k->kind != K_MRDSL &&
	    k->kind != K_DECLARE && k->kind != K_MARKER && k->kind != K_MARKINT) {
		iscsi_text_add(out, key, "Irrelevant");
		return ISCSI_NEG_OK;
	}
	if (ctx->discovery && k->irrelevant_in_discovery) {
		iscsi_text_add(out, key, "Irrelevant");
		return ISCSI_NEG_OK;
	}

	switch (k->kind) {
	case K_DIGEST: {
		const char *chosen;
		int r = pick_digest(value, &chosen);
		if (r < 0) {
			iscsi_text_add(out, key, "Reject");
		} else {
			store(p, k->field, (uint32_t)r);
			iscsi_text_add(out, key, chosen);
		}
		return ISCSI_NEG_OK;
	}
	case K_AND:
	case K_OR: {
		int b = parse_bool(value);
		if (b < 0) {
			iscsi_text_add(out, key, "Reject");
			return ISCSI_NEG_OK;
		}
		int r = k->kind == K_AND ? (b && k->ours) : (b || k->ours);
		store(p, k->field, (uint32_t)r);
		iscsi_text_add(out, key, r ? "Yes" : "No");
		return ISCSI_NEG_OK;
	}
	case K_MIN:
	case K_MAX: {
		uint64_t v;
		if (iscsi_parse_number(value, &v) < 0 || v < k->min || v > k->max) {
			iscsi_text_add(out, key, "Reject");
			return ISCSI_NEG_OK;
		}
		uint32_t r = k->kind == K_MIN ? (v < k->ours ? (uint32_t)v : k->ours)
					      : (v > k->ours ? (uint32_t)v : k->ours);
		store(p, k->field, r);
		if (k->field == F_FIRSTBURST)
			ctx->fbl_offered = true; /* answered in finish, after MaxBurstLength */
		else
			iscsi_text_addf(out, key, "%u", r);
		return ISCSI_NEG_OK;
	}
	case K_MRDSL: {
		uint64_t v;
		if (iscsi_parse_number(value, &v) < 0 || v < k->min || v > k->max) {
			iscsi_text_add(out, key, "Reject");
			return ISCSI_NEG_OK;
		}
		store(p, k->field, (uint32_t)v);
		return ISCSI_NEG_OK; /* declarative: no answer needed */
	}
	case K_DECLARE:
		return ISCSI_NEG_OK;
	case K_MARKER:
		iscsi_text_add(out, key, "No");
		return ISCSI_NEG_OK;
	case K_MARKINT:
		iscsi_text_add(out, key, "Irrelevant");
		return ISCSI_NEG_OK;
	}
	return ISCSI_NEG_OK;
}

void iscsi_param_finish(struct iscsi_params *p, struct iscsi_neg_ctx *ctx,
			struct iscsi_text_out *out, bool declare_mrdsl)
{
	if (p->first_burst > p->max_burst)
		p->first_burst = p->max_burst;
	if (ctx->fbl_offered) {
		ctx->fbl_offered = false;
		if (p->initial_r2t && !p->immediate_data)
			iscsi_text_add(out, "FirstBurstLength", "Irrelevant");
		else
			iscsi_text_addf(out, "FirstBurstLength", "%u", p->first_burst);
	}
	if (declare_mrdsl)
		iscsi_text_addf(out, "MaxRecvDataSegmentLength", "%u", p->target_mrdsl);
}
