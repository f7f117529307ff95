/*
 * scsi_test_util.h - a SCSI command set up the way a front end does, for
 * the backstore's unit tests (header-only).
 */
#ifndef TC_SCSI_TEST_UTIL_H
#define TC_SCSI_TEST_UTIL_H

#include "backstore/scsi.h"

#include <string.h>
#include <sys/uio.h>

/* cmd for lun on nexus, with one data buffer of write_len bytes out or
 * read_len bytes in; done(cmd) with priv as fe_priv. */
static inline void scsi_cmd_prepare(struct scsi_cmd *cmd, struct iovec *iov, struct scsi_nexus *nexus, uint64_t lun,
				    const uint8_t *cdb, size_t cdb_len, void *data, uint32_t write_len,
				    uint32_t read_len, void (*done)(struct scsi_cmd *), void *priv)
{
	memcpy(cmd->cdb, cdb, cdb_len);
	cmd->cdb_len = (uint8_t)cdb_len;
	cmd->lun = lun;
	cmd->nexus = nexus;
	iov->iov_base = data;
	iov->iov_len = write_len ? write_len : read_len;
	cmd->iov = iov;
	cmd->iovcnt = 1;
	cmd->write_len = write_len;
	cmd->read_len = read_len;
	cmd->dir = (write_len ? SCSI_DIR_WRITE : 0) | (read_len ? SCSI_DIR_READ : 0);
	cmd->done = done;
	cmd->fe_priv = priv;
}

#endif
