/*
 * backing.c - a [lun]'s backing store, by the driver its name asks for.
 */
#include "bdev/backing.h"

#include <string.h>

struct bdev *bdev_open_backing(const char *backing, const struct bdev_rbd_opts *rbd, uint64_t size,
			       uint32_t block_size, bool create, char *err, size_t errlen)
{
	if (bdev_backing_is_rbd(backing))
		return bdev_rbd_open(backing + strlen(BDEV_RBD_PREFIX), rbd, size, block_size, err, errlen);
	return bdev_file_open(backing, size, block_size, create, err, errlen);
}
