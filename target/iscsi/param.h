/*
 * param.h - iSCSI text keys: parsing key=value lists and negotiating the
 * operational parameters (RFC 7143 sections 6 and 13).
 *
 * Login and Text PDUs carry "key=value\0" pairs. iscsi_text_parse splits a
 * data segment into pairs in place; iscsi_text_add builds an answer. The
 * negotiation itself (iscsi_param_negotiate) is a table of keys, each with
 * its kind (list, boolean AND/OR, numeric min/max, declarative), range,
 * our own offer and the phases in which it may appear. It never touches a
 * socket, so the unit test drives it directly.
 *
 * Threading: pure functions over caller-owned state; any thread.
 */
#ifndef TC_ISCSI_PARAM_H
#define TC_ISCSI_PARAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Our receive limit for one data segment (declared to the initiator). */
#define ISCSI_OUR_MAX_RECV_DSL 262144u
/* Data segment limit during login, before anything is declared. */
#define ISCSI_LOGIN_MAX_DSL 8192u
/* Largest text a Login or Text request may accumulate across C-bit PDUs. */
#define ISCSI_TEXT_MAX 65536u
#define ISCSI_NAME_MAX 224

struct iscsi_params {
	bool header_digest;           /* CRC32C on headers */
	bool data_digest;             /* CRC32C on data segments */
	uint32_t max_connections;
	bool initial_r2t;
	bool immediate_data;
	uint32_t initiator_mrdsl;     /* what the initiator can receive: cap on our Data-In */
	uint32_t target_mrdsl;        /* what we declared we can receive */
	uint32_t max_burst;
	uint32_t first_burst;
	uint32_t time2wait;
	uint32_t time2retain;
	uint32_t max_outstanding_r2t;
	bool data_pdu_in_order;
	bool data_seq_in_order;
	uint32_t erl;
};

/* RFC defaults (13.x), with our own declared receive limit. */
void iscsi_params_default(struct iscsi_params *p);

/* One key=value pair pointing into a parsed buffer. */
struct iscsi_kv {
	const char *key;
	const char *value;
};

/*
 * Split buf (len bytes, NUL-separated pairs; a missing final NUL is
 * tolerated only if buf has room for it at buf[len]) into at most max
 * pairs. Returns the count, or -1 when a pair has no '=', an empty key, a
 * key longer than 63 bytes or a value longer than 8192 bytes (a protocol
 * error: the initiator's text is malformed), or -2 on too many pairs.
 */
int iscsi_text_parse(char *buf, size_t len, struct iscsi_kv *kv, int max);

/* Find key in a parsed list; NULL if absent. */
const char *iscsi_kv_get(const struct iscsi_kv *kv, int n, const char *key);

/* A growing answer: "key=value\0" appended; overflow sets full. */
struct iscsi_text_out {
	char *buf;
	size_t len;
	size_t cap;
	bool full;
};
void iscsi_text_add(struct iscsi_text_out *o, const char *key, const char *value);
void iscsi_text_addf(struct iscsi_text_out *o, const char *key, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Where a key is being negotiated. */
enum iscsi_neg_phase {
	ISCSI_NEG_SECURITY,     /* login, security stage */
	ISCSI_NEG_OPERATIONAL,  /* login, operational stage */
	ISCSI_NEG_FULL_FEATURE, /* Text request in full feature phase */
};

struct iscsi_neg_ctx {
	enum iscsi_neg_phase phase;
	bool discovery;         /* SessionType=Discovery */
	bool leading;           /* leading connection of the session */
	uint64_t seen;          /* bitmap of table keys already offered */
	bool fbl_offered;       /* FirstBurstLength answer deferred to finish */
};

/* Outcome of one key. */
enum iscsi_neg_result {
	ISCSI_NEG_OK = 0,       /* answered (or declarative, nothing to answer) */
	ISCSI_NEG_NOT_MINE,     /* identity/security key: the caller handles it */
	ISCSI_NEG_PROTOCOL,     /* protocol error (duplicate key, key in wrong phase):
				   login fails with initiator error */
};

/*
 * Negotiate one operational key offered by the initiator: update p and
 * append the answer to out (value, Reject, Irrelevant or NotUnderstood).
 * Keys the login layer owns (InitiatorName, TargetName, SessionType,
 * AuthMethod, CHAP_*, SendTargets, ...) return ISCSI_NEG_NOT_MINE.
 */
enum iscsi_neg_result iscsi_param_negotiate(struct iscsi_params *p, struct iscsi_neg_ctx *ctx,
					    const char *key, const char *value,
					    struct iscsi_text_out *out);

/*
 * After all keys of a request: answer deferred keys and add what we must
 * declare ourselves (MaxRecvDataSegmentLength once per connection when
 * leaving the operational stage; keys whose result differs from the
 * default the initiator assumes). Clamps FirstBurstLength to MaxBurstLength.
 */
void iscsi_param_finish(struct iscsi_params *p, struct iscsi_neg_ctx *ctx,
			struct iscsi_text_out *out, bool declare_mrdsl);

/* Parse a numeric value: decimal, or hex with 0x. -1 if malformed. */
int iscsi_parse_number(const char *s, uint64_t *out);

#endif
