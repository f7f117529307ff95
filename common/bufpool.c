/*
 * bufpool.c - per-thread free lists of aligned buffers by size class.
 *
 * A thread caches at most CACHE_BYTES per class (and at least two buffers),
 * so a burst of large transfers cannot pin memory forever.
 */
#include "common/bufpool.h"

#include <stdint.h>
#include <stdlib.h>

#define MIN_SHIFT 12
#define NCLASS 13 /* 4 KiB .. 16 MiB */
#define CACHE_BYTES (32u << 20)

struct free_buf {
	struct free_buf *next;
};

struct class_cache {
	struct free_buf *head;
	unsigned count;
};

static __thread struct class_cache caches[NCLASS];

static int class_of(size_t len)
{
	int c = 0;
	size_t cap = (size_t)1 << MIN_SHIFT;
	while (cap < len) {
		cap <<= 1;
		c++;
	}
	return c;
}

size_t buf_cap(size_t len) { return (size_t)1 << (MIN_SHIFT + class_of(len)); }

void *buf_get(size_t len)
{
	if (len > BUF_MAX)
		return NULL;
	int c = class_of(len ? len : 1);
	struct class_cache *cc = &caches[c];
	if (cc->head) {
		struct free_buf *b = cc->head;
		cc->head = b->next;
		cc->count--;
		return b;
	}
	void *p = NULL;
	if (posix_memalign(&p, 4096, buf_cap(len)))
		return NULL;
	return p;
}

void buf_thread_release(void)
{
	for (int c = 0; c < NCLASS; c++) {
		while (caches[c].head) {
			struct free_buf *b = caches[c].head;
			caches[c].head = b->next;
			free(b);
		}
		caches[c].count = 0;
	}
}

void buf_put(void *p, size_t len)
{
	if (!p)
		return;
	int c = class_of(len ? len : 1);
	struct class_cache *cc = &caches[c];
	unsigned limit = CACHE_BYTES >> (MIN_SHIFT + c);
	if (limit < 2)
		limit = 2;
	if (cc->count >= limit) {
		free(p);
		return;
	}
	struct free_buf *b = p;
	b->next = cc->head;
	cc->head = b;
	cc->count++;
}
