/*
 * chap.c - CHAP encodings, challenge generation and responses (MD5,
 * SHA-256, SHA3-256).
 *
 * Hashing goes through OpenSSL's EVP interface, comparisons through
 * CRYPTO_memcmp (constant time), randomness through getrandom(2). Base64
 * decoding uses EVP_DecodeBlock with the padding accounted for.
 *
 * Threading: no shared state; any thread.
 */
#include "target/iscsi/chap.h"

#include <ctype.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

static int hexval(int c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	c = tolower(c);
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;
}

static int decode_hex(const char *s, uint8_t *out, size_t max)
{
	size_t n = strlen(s);
	size_t i = 0, o = 0;

	if (n == 0)
		return -1;
	if (n & 1) { /* odd digit count: leading nibble */
		int v = hexval(s[0]);
		if (v < 0 || max < 1)
			return -1;
		out[o++] = (uint8_t)v;
		i = 1;
	}
	for (; i < n; i += 2) {
		int hi = hexval(s[i]), lo = hexval(s[i + 1]);
		if (hi < 0 || lo < 0 || o >= max)
			return -1;
		out[o++] = (uint8_t)(hi << 4 | lo);
	}
	return (int)o;
}

static int decode_base64(const char *s, uint8_t *out, size_t max)
{
	size_t n = strlen(s);
	uint8_t tmp[CHAP_BIN_MAX + 4];
	int pad = 0;

	if (n == 0 || n % 4 != 0 || n / 4 * 3 > sizeof(tmp))
		return -1;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		if (c == '=') {
			if (i < n - 2)
				return -1;
			pad++;
		} else if (!(isalnum((unsigned char)c) || c == '+' || c == '/') || pad) {
			return -1;
		}
	}
	int len = EVP_DecodeBlock(tmp, (const unsigned char *)s, (int)n);
	if (len < 0)
		return -1;
	len -= pad;
	if (len <= 0 || (size_t)len > max)
		return -1;
	memcpy(out, tmp, (size_t)len);
	return len;
}

int chap_decode(const char *s, uint8_t *out, size_t max)
{
	if (s[0] != '0' || !s[1])
		return -1;
	if (s[1] == 'x' || s[1] == 'X')
		return decode_hex(s + 2, out, max);
	if (s[1] == 'b' || s[1] == 'B')
		return decode_base64(s + 2, out, max);
	return -1;
}

void chap_encode_hex(const uint8_t *in, size_t len, char *out)
{
	static const char digits[] = "0123456789abcdef";
	*out++ = '0';
	*out++ = 'x';
	for (size_t i = 0; i < len; i++) {
		*out++ = digits[in[i] >> 4];
		*out++ = digits[in[i] & 15];
	}
	*out = '\0';
}

enum chap_alg chap_pick_algorithm(const char *list)
{
	enum chap_alg best = CHAP_ALG_NONE;
	const char *p = list;
	while (*p) {
		size_t n = strcspn(p, ",");
		if (n == 1 && (p[0] == '5' || p[0] == '7' || p[0] == '8') && p[0] - '0' > (int)best)
			best = (enum chap_alg)(p[0] - '0');
		p += n;
		if (*p == ',')
			p++;
	}
	return best;
}

static const EVP_MD *chap_md(enum chap_alg alg)
{
	switch (alg) {
	case CHAP_ALG_MD5: return EVP_md5();
	case CHAP_ALG_SHA256: return EVP_sha256();
	case CHAP_ALG_SHA3_256: return EVP_sha3_256();
	default: return NULL;
	}
}

size_t chap_digest_len(enum chap_alg alg)
{
	return alg == CHAP_ALG_MD5 ? CHAP_MD5_LEN : alg == CHAP_ALG_NONE ? 0 : CHAP_DIGEST_MAX;
}

int chap_new_challenge(struct iscsi_chap *c, enum chap_alg alg)
{
	uint8_t buf[CHAP_CHALLENGE_MAX + 1];
	size_t want = chap_digest_len(alg) + 1, got = 0;

	if (want < 2)
		return -1;
	while (got < want) {
		ssize_t r = getrandom(buf + got, want - got, 0);
		if (r <= 0)
			return -1;
		got += (size_t)r;
	}
	c->alg = alg;
	c->id = buf[0];
	c->challenge_len = want - 1;
	memcpy(c->challenge, buf + 1, c->challenge_len);
	return 0;
}

int chap_digest(enum chap_alg alg, uint8_t id, const char *secret, const uint8_t *chal, size_t chal_len,
		uint8_t *out)
{
	const EVP_MD *md = chap_md(alg);
	EVP_MD_CTX *ctx = md ? EVP_MD_CTX_new() : NULL;
	unsigned int len = 0;
	int ok;

	if (!ctx)
		return -1;
	ok = EVP_DigestInit_ex(ctx, md, NULL) &&
	     EVP_DigestUpdate(ctx, &id, 1) &&
	     EVP_DigestUpdate(ctx, secret, strlen(secret)) &&
	     EVP_DigestUpdate(ctx, chal, chal_len) &&
	     EVP_DigestFinal_ex(ctx, out, &len);
	EVP_MD_CTX_free(ctx);
	return ok && len == chap_digest_len(alg) ? 0 : -1;
}

bool chap_verify(const struct iscsi_chap *c, const char *secret, const char *chap_r)
{
	uint8_t got[CHAP_BIN_MAX];
	uint8_t want[CHAP_DIGEST_MAX];
	size_t dl = chap_digest_len(c->alg);
	bool ok;

	int n = chap_decode(chap_r, got, sizeof(got));
	if (!dl || n != (int)dl)
		return false;
	if (chap_digest(c->alg, c->id, secret, c->challenge, c->challenge_len, want) < 0)
		return false;
	ok = CRYPTO_memcmp(got, want, dl) == 0;
	OPENSSL_cleanse(want, sizeof(want));
	return ok;
}

int chap_mutual_response(const struct iscsi_chap *ours, const char *secret,
			 const char *chap_i, const char *chap_c, char *out)
{
	uint8_t chal[CHAP_BIN_MAX];
	uint8_t rsp[CHAP_DIGEST_MAX];
	char *end;

	if (!*chap_i)
		return -1;
	unsigned long id = strtoul(chap_i, &end, 0);
	if (*end || id > 255)
		return -1;
	int n = chap_decode(chap_c, chal, sizeof(chal));
	if (n < 1)
		return -1;
	/* A reflected challenge: refuse to answer it. */
	if ((size_t)n == ours->challenge_len && CRYPTO_memcmp(chal, ours->challenge, ours->challenge_len) == 0)
		return -1;
	if (chap_digest(ours->alg, (uint8_t)id, secret, chal, (size_t)n, rsp) < 0)
		return -1;
	chap_encode_hex(rsp, chap_digest_len(ours->alg), out);
	return 0;
}
