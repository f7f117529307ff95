/*
 * bufpool.h - pooled, page-aligned data buffers for commands.
 *
 * Buffers come in power-of-two size classes from 4 KiB to 16 MiB and are
 * 4096-byte aligned, so they can be handed to O_DIRECT I/O as they are.
 * Each thread keeps its own free lists (no lock, no atomic); a buffer may
 * be returned on any thread. Only an empty list falls back to the
 * allocator, so in steady state a command allocates nothing.
 */
#ifndef TC_BUFPOOL_H
#define TC_BUFPOOL_H

#include <stddef.h>

#define BUF_MAX (16u << 20)

/* A buffer of at least len bytes (len <= BUF_MAX), or NULL. */
void *buf_get(size_t len);
/* Return a buffer obtained with buf_get(len) for the same len. */
void buf_put(void *p, size_t len);
/* Capacity actually backing a request of len bytes. */
size_t buf_cap(size_t len);
/* Free the calling thread's cached buffers (at thread exit: worker.c). */
void buf_thread_release(void);

#endif
