/*
 * file.h - files and block devices through io_uring (file.c).
 */
#ifndef TC_BDEV_FILE_H
#define TC_BDEV_FILE_H

#include "bdev/bdev.h"

/*
 * Open (and with create, make sparse if missing) a file or block device of
 * size bytes (0 = use its current size). On error returns NULL and writes a
 * sentence naming the path and the fix into err.
 */
struct bdev *bdev_file_open(const char *path, uint64_t size, uint32_t block_size,
			    bool create, char *err, size_t errlen);
/* The same with flags: BDEV_FILE_BUFFERED = through the page cache (no
 * O_DIRECT); durability still follows BDEV_F_FUA and BDEV_FLUSH. */
#define BDEV_FILE_BUFFERED 0x1
struct bdev *bdev_file_open_flags(const char *path, uint64_t size, uint32_t block_size, bool create,
				  unsigned flags, char *err, size_t errlen);

#endif
