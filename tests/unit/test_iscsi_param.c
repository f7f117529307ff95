/*
 * test_iscsi_param.c - the iSCSI text-key negotiation and CHAP helpers,
 * driven directly (no socket): every rule here is one an initiator relies
 * on, so each check fails if the rule breaks.
 *
 * Covered: key=value parsing, list/boolean/numeric/declarative
 * negotiation, Reject / Irrelevant / NotUnderstood answers, duplicate keys,
 * phase restrictions, FirstBurstLength <= MaxBurstLength, our declared
 * MaxRecvDataSegmentLength; CHAP hex and base64 decoding, MD5 responses
 * against an independently computed value, constant-time verification,
 * mutual CHAP and the reflection refusal; CRC32C against the standard
 * check value.
 *
 * Single-threaded; exit status 0 when every check passes.
 */
#include "target/iscsi/chap.h"
#include "target/iscsi/iscsi_int.h"
#include "target/iscsi/param.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;

#define CHECK(cond)                                                              \
	do {                                                                     \
		if (!(cond)) {                                                   \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__,   \
				__LINE__, #cond);                                \
			failures++;                                              \
		}                                                                \
	} while (0)

/* Look key up in an answer buffer. */
static const char *answer(const struct iscsi_text_out *o, const char *key)
{
	size_t kl = strlen(key);
	for (size_t i = 0; i < o->len; i += strlen(o->buf + i) + 1)
		if (strncmp(o->buf + i, key, kl) == 0 && o->buf[i + kl] == '=')
			return o->buf + i + kl + 1;
	return NULL;
}

struct neg {
	struct iscsi_params p;
	struct iscsi_neg_ctx ctx;
	char buf[4096];
	struct iscsi_text_out out;
};

static void neg_init(struct neg *n, enum iscsi_neg_phase phase, bool discovery)
{
	memset(n, 0, sizeof(*n));
	iscsi_params_default(&n->p);
	n->ctx.phase = phase;
	n->ctx.discovery = discovery;
	n->ctx.leading = true;
	n->out.buf = n->buf;
	n->out.cap = sizeof(n->buf);
}

static enum iscsi_neg_result offer(struct neg *n, const char *key, const char *value)
{
	return iscsi_param_negotiate(&n->p, &n->ctx, key, value, &n->out);
}

static void test_text_parse(void)
{
	char buf[64] = "InitiatorName=iqn.x\0SessionType=Normal\0";
	struct iscsi_kv kv[8];
	CHECK(iscsi_text_parse(buf, 40, kv, 8) == 2);
	CHECK(strcmp(iscsi_kv_get(kv, 2, "SessionType"), "Normal") == 0);
	CHECK(iscsi_kv_get(kv, 2, "TargetName") == NULL);

	char bad[32] = "NoEqualsSign\0";
	CHECK(iscsi_text_parse(bad, 13, kv, 8) == -1);
	char empty_key[32] = "=value\0";
	CHECK(iscsi_text_parse(empty_key, 7, kv, 8) == -1);
	/* A final pair without its NUL is terminated in place. */
	char unterminated[32] = "A=1";
	CHECK(iscsi_text_parse(unterminated, 3, kv, 8) == 1 && strcmp(kv[0].value, "1") == 0);
	char many[64] = "A=1\0B=2\0C=3\0";
	CHECK(iscsi_text_parse(many, 12, kv, 2) == -2);
}

static void test_digests_and_booleans(void)
{
	struct neg n;
	neg_init(&n, ISCSI_NEG_OPERATIONAL, false);
	CHECK(offer(&n, "HeaderDigest", "CRC32C,None") == ISCSI_NEG_OK);
	CHECK(strcmp(answer(&n.out, "HeaderDigest"), "CRC32C") == 0 && n.p.header_digest);
	CHECK(offer(&n, "DataDigest", "None,CRC32C") == ISCSI_NEG_OK);
	CHECK(strcmp(answer(&n.out, "DataDigest"), "None") == 0 && !n.p.data_digest);
	/* InitialR2T is OR: our No leaves the initiator's choice. */
	CHECK(offer(&n, "InitialR2T", "No") == ISCSI_NEG_OK);
	CHECK(strcmp(answer(&n.out, "InitialR2T"), "No") == 0 && !n.p.initial_r2t);
	/* ImmediateData is AND: our Yes leaves the initiator's choice. */
	CHECK(offer(&n, "ImmediateData", "No") == ISCSI_NEG_OK);
	CHECK(strcmp(answer(&n.out, "ImmediateData"), "No") == 0 && !n.p.immediate_data);
	CHECK(offer(&n, "DataPDUInOrder", "No") == ISCSI_NEG_OK);
	CHECK(strcmp(answer(&n.out, "DataPDUInOrder"), "Yes") == 0 && n.p.data_pdu_in_order);
	/* Not a boolean: Reject, value unchanged. */
	CHECK(offer(&n, "DataSequenceInOrder", "Maybe") == ISCSI_NEG_OK);
	CHECK(strcmp(answer(&n.out, "DataSequenceInOrder"), "Reject") == 0);
	/* Offered twice in one negotiation: protocol error. */
	CHECK(offer(&n, "InitialR2T", "Yes") == ISCSI_NEG_PROTOCOL);

	neg_init(&n, ISCSI_NEG_OPERATIONAL, false);
	CHECK(offer(&n, "HeaderDigest", "MD5") == ISCSI_NEG_OK);
	CHECK(strcmp(answer(&n.out, "HeaderDigest"), "Reject") == 0 && !n.p.header_digest);
}

static void test_numbers(void)
{
	struct neg n;
	neg_init(&n, ISCSI_NEG_OPERATIONAL, false);
	CHECK(offer(&n, "MaxBurstLength", "1048576") == ISCSI_NEG_OK);
	CHECK(strcmp(answer(&n.out, "MaxBurstLength"), "1048576") == 0 && n.p.max_burst == 1048576);
	CHECK(offer(&n, "FirstBurstLength", "0x200000") == ISCSI_NEG_OK);
	CHECK(answer(&n.out, "FirstBurstLength") == NULL); /* deferred */
	CHECK(offer(&n, "MaxConnections", "8") == ISCSI_NEG_OK);
	CHECK(strcmp(answer(&n.out, "MaxConnections"), "1") == 0 && n.p.max_connections == 1);
	CHECK(offer(&n, "ErrorRecoveryLevel", "2") == ISCSI_NEG_OK);
	CHECK(strcmp(answer(&n.out, "ErrorRecoveryLevel"), "0") == 0 && n.p.erl == 0);
	CHECK(offer(&n, "DefaultTime2Wait", "5") == ISCSI_NEG_OK);
	CHECK(strcmp(answer(&n.out, "DefaultTime2Wait"), "5") == 0);
	CHECK(offer(&n, "MaxOutstandingR2T", "0") == ISCSI_NEG_OK);
	CHECK(strcmp(answer(&n.out, "MaxOutstandingR2T"), "Reject") == 0);
	CHECK(offer(&n, "MaxRecvDataSegmentLength", "65536") == ISCSI_NEG_OK);
	CHECK(answer(&n.out, "MaxRecvDataSegmentLength") == NULL); /* declarative */
	CHECK(n.p.initiator_mrdsl == 65536);
	iscsi_param_finish(&n.p, &n.ctx, &n.out, true);
	/* FirstBurstLength never exceeds MaxBurstLength. */
	CHECK(n.p.first_burst == 1048576);
	CHECK(strcmp(answer(&n.out, "FirstBurstLength"), "1048576") == 0);
	CHECK(strtoul(answer(&n.out, "MaxRecvDataSegmentLength"), NULL, 10) == ISCSI_OUR_MAX_RECV_DSL);

	neg_init(&n, ISCSI_NEG_OPERATIONAL, false);
	CHECK(offer(&n, "MaxRecvDataSegmentLength", "100") == ISCSI_NEG_OK);
	CHECK(strcmp(answer(&n.out, "MaxRecvDataSegmentLength"), "Reject") == 0);
	CHECK(n.p.initiator_mrdsl == 8192);
	CHECK(offer(&n, "MaxBurstLength", "12x") == ISCSI_NEG_OK);
	CHECK(strcmp(answer(&n.out, "MaxBurstLength"), "Reject") == 0);

	/* FirstBurstLength is irrelevant when no unsolicited data can flow. */
	neg_init(&n, ISCSI_NEG_OPERATIONAL, false);
	offer(&n, "InitialR2T", "Yes");
	offer(&n, "ImmediateData", "No");
	offer(&n, "FirstBurstLength", "65536");
	iscsi_param_finish(&n.p, &n.ctx, &n.out, false);
	CHECK(strcmp(answer(&n.out, "FirstBurstLength"), "Irrelevant") == 0);
	CHECK(answer(&n.out, "MaxRecvDataSegmentLength") == NULL);
}

static void test_special_answers(void)
{
	struct neg n;
	neg_init(&n, ISCSI_NEG_OPERATIONAL, false);
	CHECK(offer(&n, "X-com.example.Frobnicate", "7") == ISCSI_NEG_OK);
	CHECK(strcmp(answer(&n.out, "X-com.example.Frobnicate"), "NotUnderstood") == 0);
	CHECK(offer(&n, "InitiatorName", "iqn.x") == ISCSI_NEG_NOT_MINE);
	CHECK(offer(&n, "CHAP_A", "5") == ISCSI_NEG_NOT_MINE);
	CHECK(offer(&n, "IFMarker", "Yes") == ISCSI_NEG_OK);
	CHECK(strcmp(answer(&n.out, "IFMarker"), "No") == 0);

	neg_init(&n, ISCSI_NEG_OPERATIONAL, true);
	CHECK(offer(&n, "MaxBurstLength", "65536") == ISCSI_NEG_OK);
	CHECK(strcmp(answer(&n.out, "MaxBurstLength"), "Irrelevant") == 0);
	CHECK(offer(&n, "HeaderDigest", "None") == ISCSI_NEG_OK);
	CHECK(strcmp(answer(&n.out, "HeaderDigest"), "None") == 0);

	/* Full feature phase: only the declarative receive limit may change. */
	neg_init(&n, ISCSI_NEG_FULL_FEATURE, false);
	CHECK(offer(&n, "MaxBurstLength", "65536") == ISCSI_NEG_OK);
	CHECK(strcmp(answer(&n.out, "MaxBurstLength"), "Reject") == 0);
	CHECK(n.p.max_burst == 262144);
	CHECK(offer(&n, "MaxRecvDataSegmentLength", "16384") == ISCSI_NEG_OK);
	CHECK(n.p.initiator_mrdsl == 16384);
}

static void test_chap(void)
{
	static const uint8_t chal[16] = { 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15 };
	uint8_t out[64];
	char hex[64];

	CHECK(chap_decode("0x000102", out, sizeof(out)) == 3 && out[2] == 2);
	CHECK(chap_decode("0X1", out, sizeof(out)) == 1 && out[0] == 1);
	CHECK(chap_decode("0bAAECAwQFBgcICQoLDA0ODw==", out, sizeof(out)) == 16);
	CHECK(memcmp(out, chal, 16) == 0);
	CHECK(chap_decode("0x0g", out, sizeof(out)) == -1);
	CHECK(chap_decode("0x", out, sizeof(out)) == -1);
	CHECK(chap_decode("1234", out, sizeof(out)) == -1);
	CHECK(chap_decode("0bAA=E", out, sizeof(out)) == -1);
	CHECK(chap_decode("0x00010203", out, 2) == -1);
	chap_encode_hex(chal, 3, hex);
	CHECK(strcmp(hex, "0x000102") == 0);

	/* the strongest offered wins; unknown codes are skipped */
	CHECK(chap_pick_algorithm("5") == CHAP_ALG_MD5);
	CHECK(chap_pick_algorithm("7,5") == CHAP_ALG_SHA256);
	CHECK(chap_pick_algorithm("5,7,8") == CHAP_ALG_SHA3_256);
	CHECK(chap_pick_algorithm("8,6,5") == CHAP_ALG_SHA3_256);
	CHECK(chap_pick_algorithm("6,5") == CHAP_ALG_MD5);
	CHECK(chap_pick_algorithm("6,15,55,77") == CHAP_ALG_NONE);
	CHECK(chap_pick_algorithm("") == CHAP_ALG_NONE);

	struct iscsi_chap c = { .alg = CHAP_ALG_MD5, .id = 7, .challenge_len = 16 };
	memcpy(c.challenge, chal, 16);
	/* MD5(0x07 | "topsecret123" | 00..0f), computed independently. */
	CHECK(chap_verify(&c, "topsecret123", "0xa3cbca2536ef3478b4ed8540649ca5bb"));
	CHECK(chap_verify(&c, "topsecret123", "0xA3CBCA2536EF3478B4ED8540649CA5BB"));
	CHECK(chap_verify(&c, "topsecret123", "0bo8vKJTbvNHi07YVAZJyluw=="));
	CHECK(!chap_verify(&c, "topsecret124", "0xa3cbca2536ef3478b4ed8540649ca5bb"));
	CHECK(!chap_verify(&c, "topsecret123", "0xa3cbca2536ef3478b4ed8540649ca5"));
	CHECK(!chap_verify(&c, "topsecret123", "garbage"));

	/* Mutual: our answer to the initiator's challenge... */
	char rsp[2 * CHAP_DIGEST_MAX + 3];
	struct iscsi_chap other = { .alg = CHAP_ALG_MD5, .id = 1, .challenge_len = 16 };
	memset(other.challenge, 0xee, 16);
	CHECK(chap_mutual_response(&other, "topsecret123", "7", "0x000102030405060708090a0b0c0d0e0f",
				   rsp) == 0);
	CHECK(strcmp(rsp, "0xa3cbca2536ef3478b4ed8540649ca5bb") == 0);
	/* ...refused when it reflects the challenge we sent. */
	CHECK(chap_mutual_response(&c, "topsecret123", "7", "0x000102030405060708090a0b0c0d0e0f",
				   rsp) == -1);
	CHECK(chap_mutual_response(&c, "topsecret123", "7", "0bAAECAwQFBgcICQoLDA0ODw==", rsp) == -1);
	CHECK(chap_mutual_response(&other, "topsecret123", "256", "0x00", rsp) == -1);
	CHECK(chap_mutual_response(&other, "topsecret123", "x", "0x00", rsp) == -1);

	/* SHA-256 and SHA3-256 over a 32-byte challenge, computed independently (hashlib) */
	uint8_t chal32[32];
	for (int i = 0; i < 32; i++)
		chal32[i] = (uint8_t)i;
	struct iscsi_chap s2 = { .alg = CHAP_ALG_SHA256, .id = 7, .challenge_len = 32 };
	memcpy(s2.challenge, chal32, 32);
	CHECK(chap_verify(&s2, "topsecret123", "0x4e9c144229fb1a5ad6a09f5f660d1cef0d4b0a8bf9300f9473fadccc0976e080"));
	CHECK(!chap_verify(&s2, "topsecret124", "0x4e9c144229fb1a5ad6a09f5f660d1cef0d4b0a8bf9300f9473fadccc0976e080"));
	/* an MD5-length answer to a SHA-256 challenge is refused */
	CHECK(!chap_verify(&s2, "topsecret123", "0xa3cbca2536ef3478b4ed8540649ca5bb"));
	struct iscsi_chap s3 = s2;
	s3.alg = CHAP_ALG_SHA3_256;
	CHECK(chap_verify(&s3, "topsecret123", "0xaf4765c5c03f3b26ccf0be9dd45744245cd49fa4a803e1c60cf6af12acdbc371"));
	CHECK(!chap_verify(&s3, "topsecret123", "0x4e9c144229fb1a5ad6a09f5f660d1cef0d4b0a8bf9300f9473fadccc0976e080"));
	/* mutual with SHA-256: the digest of the initiator's 16-byte challenge */
	struct iscsi_chap o2 = { .alg = CHAP_ALG_SHA256, .id = 1, .challenge_len = 32 };
	memset(o2.challenge, 0xee, 32);
	CHECK(chap_mutual_response(&o2, "topsecret123", "7", "0x000102030405060708090a0b0c0d0e0f", rsp) == 0);
	CHECK(strcmp(rsp, "0x3312fea9ffe9d9dfd633a7afffa6679689e8e8c376d4c6decf1e96814b738a9d") == 0);

	struct iscsi_chap a, b;
	CHECK(chap_new_challenge(&a, CHAP_ALG_MD5) == 0 && chap_new_challenge(&b, CHAP_ALG_MD5) == 0);
	CHECK(a.challenge_len == 16 && memcmp(a.challenge, b.challenge, 16) != 0);
	CHECK(chap_new_challenge(&a, CHAP_ALG_SHA3_256) == 0 && a.challenge_len == 32 && a.alg == CHAP_ALG_SHA3_256);
	CHECK(chap_new_challenge(&a, CHAP_ALG_NONE) == -1);
}

static void test_crc32c(void)
{
	/* The CRC-32C check value (RFC 3720 B.4 uses the same polynomial). */
	uint32_t crc = iscsi_crc32c("123456789", 9, ISCSI_CRC_INIT);
	CHECK(ISCSI_CRC_FINAL(crc) == 0xe3069283u);
	uint8_t zeros[32] = { 0 };
	CHECK(ISCSI_CRC_FINAL(iscsi_crc32c(zeros, 32, ISCSI_CRC_INIT)) == 0x8a9136aau);
}

static void test_wire_helpers(void)
{
	uint8_t lun[8];
	iscsi_lun_encode(lun, 5);
	CHECK(lun[0] == 0 && lun[1] == 5 && iscsi_lun_decode(lun) == 5);
	iscsi_lun_encode(lun, 300);
	CHECK(lun[0] == 0x41 && lun[1] == 44 && iscsi_lun_decode(lun) == 300);
	lun[0] = 0xc0;
	CHECK(iscsi_lun_decode(lun) == UINT64_MAX);
	CHECK(sn_lt(0xfffffff0u, 5) && !sn_lt(5, 0xfffffff0u) && sn_le(7, 7));
}

int main(void)
{
	test_text_parse();
	test_digests_and_booleans();
	test_numbers();
	test_special_answers();
	test_chap();
	test_crc32c();
	test_wire_helpers();
	if (failures) {
		fprintf(stderr, "test_iscsi_param: %d check(s) failed\n", failures);
		return 1;
	}
	printf("test_iscsi_param: all checks passed\n");
	return 0;
}
