/*
 * endian.h - byte order, once for the whole tree.
 *
 * Wire formats (iSCSI PDUs, CDBs, parameter data) are big-endian byte
 * strings at arbitrary offsets: beNN_get/beNN_put read and write them
 * through a byte pointer, with no alignment assumed.
 *
 * The on-disk cache format is little-endian and is declared with the
 * wrapper types le16/le32/le64 (cache/meta.h), so a field cannot be used
 * without saying how: leNN_get(field) reads it, leNN_of(value) makes one.
 *
 * Threading: pure functions, any thread.
 */
#ifndef TC_COMMON_ENDIAN_H
#define TC_COMMON_ENDIAN_H

#include <stdint.h>

/* ---- big-endian byte strings ---- */
static inline uint16_t be16_get(const uint8_t *p) { return (uint16_t)(p[0] << 8 | p[1]); }
static inline uint32_t be24_get(const uint8_t *p)
{
	return (uint32_t)p[0] << 16 | (uint32_t)p[1] << 8 | p[2];
}
static inline uint32_t be32_get(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}
static inline uint64_t be64_get(const uint8_t *p) { return (uint64_t)be32_get(p) << 32 | be32_get(p + 4); }

static inline void be16_put(uint8_t *p, uint16_t v) { p[0] = (uint8_t)(v >> 8); p[1] = (uint8_t)v; }
static inline void be24_put(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 16); p[1] = (uint8_t)(v >> 8); p[2] = (uint8_t)v;
}
static inline void be32_put(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24); p[1] = (uint8_t)(v >> 16); p[2] = (uint8_t)(v >> 8); p[3] = (uint8_t)v;
}
static inline void be64_put(uint8_t *p, uint64_t v)
{
	be32_put(p, (uint32_t)(v >> 32));
	be32_put(p + 4, (uint32_t)v);
}

/* ---- little-endian fields of on-disk structures ---- */
typedef struct { uint8_t b[2]; } le16;
typedef struct { uint8_t b[4]; } le32;
typedef struct { uint8_t b[8]; } le64;

static inline uint16_t le16_get(le16 v) { return (uint16_t)(v.b[0] | v.b[1] << 8); }
static inline uint32_t le32_get(le32 v)
{
	return (uint32_t)v.b[0] | (uint32_t)v.b[1] << 8 | (uint32_t)v.b[2] << 16 | (uint32_t)v.b[3] << 24;
}
static inline uint64_t le64_get(le64 v)
{
	uint64_t r = 0;
	for (int i = 7; i >= 0; i--)
		r = r << 8 | v.b[i];
	return r;
}
static inline le16 le16_of(uint16_t x) { return (le16){ { (uint8_t)x, (uint8_t)(x >> 8) } }; }
static inline le32 le32_of(uint32_t x)
{
	return (le32){ { (uint8_t)x, (uint8_t)(x >> 8), (uint8_t)(x >> 16), (uint8_t)(x >> 24) } };
}
static inline le64 le64_of(uint64_t x)
{
	le64 v;
	for (int i = 0; i < 8; i++)
		v.b[i] = (uint8_t)(x >> (8 * i));
	return v;
}

#endif
