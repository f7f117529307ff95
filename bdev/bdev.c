/*
 * bdev.c - the generic part of the block device interface (bdev.h).
 */
#include "bdev/bdev.h"

int64_t bdev_lba_status(struct bdev *dev, uint64_t offset, bool *mapped)
{
	if (!dev->ops->lba_status) {
		*mapped = true;
		return (int64_t)(dev->size - offset);
	}
	return dev->ops->lba_status(dev, offset, mapped);
}
