/*
 * backing.h - open the backing store a [lun] names (backing.c), whichever
 * driver it takes.
 */
#ifndef TC_BDEV_BACKING_H
#define TC_BDEV_BACKING_H

#include "bdev/bdev.h"
#include "bdev/file.h"
#include "bdev/rbd.h"

/*
 * Open the backing store a [lun] names: rbd:POOL/IMAGE through
 * bdev_rbd_open (with rbd), anything else as a file or block device
 * through bdev_file_open (with create).
 */
struct bdev *bdev_open_backing(const char *backing, const struct bdev_rbd_opts *rbd, uint64_t size,
			       uint32_t block_size, bool create, char *err, size_t errlen);

#endif
