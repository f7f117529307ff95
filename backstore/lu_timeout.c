/*
 * lu_timeout.c - io_timeout: a command the backing store keeps too long is
 * answered as failed, and whatever it may still do is kept from newer data.
 *
 * A backing store that stops answering (a dead NFS server, an array that
 * froze, an OSD that hangs) would otherwise hold a host's command forever,
 * and with it every task management function that waits for the command:
 * hosts then drop the path or the whole target. The front end, which
 * knows how long each command has been in the backstore, asks here once
 * in a while (scsi_cmd_overdue); past the LU's io_timeout the host is
 * answered ABORTED COMMAND / COMMAND TIMEOUT DURING PROCESSING, which
 * hosts retry, and a TMF that aborted the command stops waiting for it.
 *
 * The command is not freed: the kernel (or librbd) still has its request
 * and may still read its data or fill its buffers, so the front end keeps
 * both until done() finally comes. A write that is still in the interlock
 * becomes a fence there (sbc_write_fence), so that no newer write to its
 * blocks, nor a COMPARE AND WRITE, reaches the device before it is back:
 * when the store wakes up, the old write lands first and the new one over
 * it, as the host ordered them. One that is still waiting for its turn in
 * the interlock has sent nothing: it is cancelled (scsi_cmd_cancel) and
 * never lands.
 *
 * Threading: scsi_cmd_overdue on the command's worker; the counts are
 * atomics, read by status from any thread.
 */
#include "backstore/lu.h"

#include "common/log.h"

/* A PR OUT on a LU of one gateway never reaches the backing store: it
 * waits only for a PREEMPT AND ABORT's preempted commands, for a bounded
 * time (pr.c), and answered ABORTED it would be sent again after its
 * preemption was made. */
bool scsi_cmd_timed(const struct scsi_cmd *cmd)
{
	return !(cmd->cdb[0] == OP_PR_OUT && cmd->lu && !cmd->lu->prs);
}

bool scsi_cmd_overdue(struct scsi_cmd *cmd, uint64_t age_ms)
{
	struct scsi_lu *lu = cmd->lu;
	uint32_t tmo = lu ? atomic_load_explicit(&lu->io_timeout_ms, memory_order_relaxed) : 0;
	if (!tmo || age_ms < tmo || cmd->overdue)
		return false;
	if (!scsi_cmd_timed(cmd))
		return false;
	cmd->overdue = true;
	sbc_write_fence(cmd);
	/* one still queued in the interlock never reached the device: it
	 * leaves the queue (and its fence with it) instead of landing later */
	scsi_cmd_cancel(cmd);
	atomic_fetch_add(&lu->overdue_total, 1);
	if (atomic_fetch_add(&lu->overdue_now, 1) == 0)
		log_err("lun \"%s\": the backing store has held a command longer than io_timeout (%u s); hosts "
			"are answered ABORTED COMMAND, and later writes to its blocks wait until the store "
			"gives it back", lu->name, tmo / 1000);
	return true;
}

void lu_overdue_back(struct scsi_lu *lu)
{
	if (atomic_fetch_sub(&lu->overdue_now, 1) == 1)
		log_warn("lun \"%s\": the backing store gave back every command it held past io_timeout "
			 "(%llu so far)", lu->name, (unsigned long long)atomic_load(&lu->overdue_total));
}

size_t scsi_cmd_overdue_sense(const struct scsi_cmd *cmd, uint8_t *buf, size_t cap)
{
	bool d_sense = cmd->lu ? atomic_load_explicit(&cmd->lu->d_sense, memory_order_relaxed) : false;
	return scsi_sense_format(buf, cap, d_sense, SK_ABORTED_COMMAND, ASC_COMMAND_TIMEOUT_DURING_PROCESSING,
				 NULL);
}

void scsi_lu_overdue(const struct scsi_lu *lu, struct scsi_lu_overdue *out)
{
	out->io_timeout_ms = atomic_load_explicit(&lu->io_timeout_ms, memory_order_relaxed);
	out->now = atomic_load(&lu->overdue_now);
	out->total = atomic_load(&lu->overdue_total);
}

void scsi_lu_set_io_timeout(struct scsi_lu *lu, uint32_t io_timeout_ms)
{
	atomic_store_explicit(&lu->io_timeout_ms, io_timeout_ms, memory_order_relaxed);
}
