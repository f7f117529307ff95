/*
 * statefile.h - small files in state_dir replaced whole and durably.
 *
 * A LUN's serial, its reservations (APTPL) and the generation of the image
 * its cached copies belong to are each one small file that must read back
 * as either the old or the new contents after a kill -9 or a power cut,
 * never as nothing or a part. state_file_replace writes PATH.tmp, fsyncs
 * it, renames it over PATH and fsyncs the directory (without that last
 * step the rename itself may be lost in a power cut: a LUN would come back
 * with a new serial, and a host would take it for another disk). Any
 * thread; blocks on the file system.
 */
#ifndef TC_COMMON_STATEFILE_H
#define TC_COMMON_STATEFILE_H

#include <stddef.h>

/* 0, or -errno with PATH untouched and no PATH.tmp left. */
int state_file_replace(const char *path, const void *data, size_t len);

#endif
