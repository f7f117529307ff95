/*
 * chap.h - CHAP for iSCSI login (RFC 7143 12.1.3, RFC 1994) with the
 * digests hosts offer today: SHA3-256 (CHAP_A=8) and SHA-256 (7), which
 * Linux's open-iscsi and LIO negotiate, and MD5 (5), all that Windows and
 * ESXi speak. Of the initiator's CHAP_A list the strongest we know wins.
 *
 * The target sends CHAP_A, CHAP_I (one random byte) and CHAP_C (a random
 * challenge from getrandom(2), as long as the digest); the initiator
 * proves it knows the secret with CHAP_R = H(I | secret | C). For mutual
 * CHAP the initiator sends its own CHAP_I/CHAP_C and we answer with
 * CHAP_N/CHAP_R computed from the mutual secret, with the same digest. Binary values travel as hex (0x...) or base64 (0b...);
 * both are accepted and we send hex.
 *
 * Secrets pass through these functions but never reach the log: callers
 * log the user name and the outcome only.
 *
 * Threading: pure functions and caller-owned state; any thread.
 */
#ifndef TC_ISCSI_CHAP_H
#define TC_ISCSI_CHAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CHAP_MD5_LEN 16
#define CHAP_DIGEST_MAX 32 /* SHA-256, SHA3-256 */
#define CHAP_CHALLENGE_MAX CHAP_DIGEST_MAX
#define CHAP_BIN_MAX 1024 /* longest challenge or response we decode */

enum chap_alg { CHAP_ALG_NONE = 0, CHAP_ALG_MD5 = 5, CHAP_ALG_SHA256 = 7, CHAP_ALG_SHA3_256 = 8 };

struct iscsi_chap {
	enum chap_alg alg;
	uint8_t id;
	uint8_t challenge[CHAP_CHALLENGE_MAX];
	size_t challenge_len; /* the digest's length */
};

/*
 * Decode a CHAP binary value ("0x" hex or "0b" base64, case-insensitive
 * prefix) into out (at most max bytes). Returns the length, or -1 if
 * malformed, empty or too long.
 */
int chap_decode(const char *s, uint8_t *out, size_t max);

/* "0x" + lowercase hex of in; out must hold 2 * len + 3 bytes. */
void chap_encode_hex(const uint8_t *in, size_t len, char *out);

/* The strongest algorithm of the initiator's CHAP_A list that we know
 * (8, then 7, then 5), or CHAP_ALG_NONE. */
enum chap_alg chap_pick_algorithm(const char *list);

/* The digest's length in bytes (0 for an unknown one). */
size_t chap_digest_len(enum chap_alg alg);

/* Fresh identifier and challenge for alg from getrandom(2). 0 or -1. */
int chap_new_challenge(struct iscsi_chap *c, enum chap_alg alg);

/* H(id | secret | challenge) through OpenSSL EVP; out holds
 * chap_digest_len(alg) bytes. 0 or -1. */
int chap_digest(enum chap_alg alg, uint8_t id, const char *secret, const uint8_t *chal, size_t chal_len,
		uint8_t *out);

/*
 * Check the initiator's CHAP_R (encoded) against our challenge and secret
 * in constant time. true when it matches.
 */
bool chap_verify(const struct iscsi_chap *c, const char *secret, const char *chap_r);

/*
 * Mutual CHAP: compute our CHAP_R (hex, into out of 2 * CHAP_DIGEST_MAX + 3
 * bytes) with the negotiated digest for the
 * initiator's CHAP_I/CHAP_C. Refuses (-1) a malformed identifier or
 * challenge, and a challenge equal to the one we sent (a reflection attack
 * would otherwise let the initiator make us answer our own challenge).
 */
int chap_mutual_response(const struct iscsi_chap *ours, const char *secret,
			 const char *chap_i, const char *chap_c, char *out);

#endif
