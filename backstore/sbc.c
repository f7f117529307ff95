/*
 * sbc.c - SCSI block commands (SBC-3): what the block commands share, and
 * the small ones.
 *
 * The block commands are split by concern: sbc_rw.c moves data (READ,
 * WRITE, VERIFY, COMPARE AND WRITE, ORWRITE), sbc_prov.c provisions it
 * (WRITE SAME, UNMAP, GET LBA STATUS, SANITIZE). This file holds what
 * they share - the COMPARE AND WRITE interlock and the helpers of
 * sbc_io.h - and READ CAPACITY, SYNCHRONIZE CACHE, PRE-FETCH and READ
 * DEFECT DATA.
 *
 * COMPARE AND WRITE (VMware ATS) must be atomic against every other writer
 * of the same LBAs. Plain writes stay lock-free while no CAW is active:
 *
 *   writer:  fast_writes++ ; if caw_active == 0 -> go (lock-free)
 *                            else fast_writes-- and take the slow path
 *   CAW:     caw_active++  ; then, under lu->mutex, wait until
 *                            fast_writes == 0 and no overlapping entry is
 *                            ahead of it in lu->ranges
 *
 * Both counters are sequentially consistent, so at least one side sees the
 * other (Dekker). On the slow path every writer appends a range_lock to
 * lu->ranges; an entry may run when no entry ahead of it overlaps it with
 * a CAW on either side (writes never wait for writes). A deferred command
 * is resumed on its own worker through worker_post. The last fast writer
 * to finish while a CAW waits, and every slow-path release, re-evaluate
 * the queue.
 *
 * Threading: handlers run on the submitting worker; bdev completions come
 * back on the same worker. lu->mutex is taken only on the CAW slow path
 * and is never held across bdev_submit.
 */
#include "backstore/lu.h"
#include "backstore/sbc_io.h"

#include "common/bufpool.h"
#include "common/log.h"

/* ---------------------------------------------------------------- */
/* CAW interlock                                                     */

static bool ranges_overlap(const struct range_lock *a, const struct range_lock *b)
{
	return a->lba < b->lba + b->nblocks && b->lba < a->lba + a->nblocks;
}

/* May e run now? Caller holds lu->mutex. */
static bool range_eligible(struct scsi_lu *lu, struct range_lock *e)
{
	if (e->is_caw && atomic_load(&lu->fast_writes) != 0)
		return false;
	for (struct range_lock *a = lu->ranges; a && a != e; a = a->next)
		if ((a->is_caw || e->is_caw) && ranges_overlap(a, e))
			return false;
	return true;
}

static void range_resume(void *arg)
{
	struct range_lock *rl = arg;
	rl->resume(rl);
}

/* Grant every waiting entry that became eligible. Locked. */
static void ranges_wake_locked(struct scsi_lu *lu)
{
	for (struct range_lock *e = lu->ranges; e; e = e->next) {
		if (e->granted || !range_eligible(lu, e))
			continue;
		e->granted = true;
		if (worker_post(e->worker, range_resume, e) < 0)
			log_err("lun \"%s\": cannot resume a deferred write (out of memory)", lu->name);
	}
}

static void range_append_locked(struct scsi_lu *lu, struct range_lock *rl)
{
	struct range_lock **pp = &lu->ranges;
	while (*pp)
		pp = &(*pp)->next;
	rl->next = NULL;
	*pp = rl;
}

static void range_remove_locked(struct scsi_lu *lu, struct range_lock *rl)
{
	for (struct range_lock **pp = &lu->ranges; *pp; pp = &(*pp)->next)
		if (*pp == rl) {
			*pp = rl->next;
			break;
		}
}

static void fast_write_done(struct scsi_lu *lu)
{
	if (atomic_fetch_sub(&lu->fast_writes, 1) == 1 && atomic_load(&lu->caw_active)) {
		pthread_mutex_lock(&lu->mutex);
		ranges_wake_locked(lu);
		pthread_mutex_unlock(&lu->mutex);
	}
}

static bool range_begin(struct scsi_lu *lu, struct range_lock *rl, uint64_t lba, uint64_t nblocks,
			bool is_caw)
{
	rl->lba = lba;
	rl->nblocks = nblocks ? nblocks : 1;
	rl->is_caw = is_caw;
	rl->granted = false;
	rl->fast = false;
	rl->worker = worker_self();
	if (!is_caw) {
		atomic_fetch_add(&lu->fast_writes, 1);
		if (atomic_load(&lu->caw_active) == 0) {
			rl->fast = true;
			return true;
		}
		fast_write_done(lu);
	} else {
		atomic_fetch_add(&lu->caw_active, 1);
	}
	pthread_mutex_lock(&lu->mutex);
	range_append_locked(lu, rl);
	bool go = range_eligible(lu, rl);
	rl->granted = go;
	pthread_mutex_unlock(&lu->mutex);
	return go;
}

static void range_end(struct scsi_lu *lu, struct range_lock *rl)
{
	if (rl->fast) {
		fast_write_done(lu);
		return;
	}
	pthread_mutex_lock(&lu->mutex);
	range_remove_locked(lu, rl);
	if (rl->is_caw)
		atomic_fetch_sub(&lu->caw_active, 1);
	ranges_wake_locked(lu);
	pthread_mutex_unlock(&lu->mutex);
}

bool sbc_write_begin(struct scsi_lu *lu, struct range_lock *rl, uint64_t lba, uint64_t nblocks)
{
	return range_begin(lu, rl, lba, nblocks, false);
}

void sbc_write_end(struct scsi_lu *lu, struct range_lock *rl)
{
	range_end(lu, rl);
}

bool sbc_caw_begin(struct scsi_lu *lu, struct range_lock *rl, uint64_t lba, uint64_t nblocks)
{
	return range_begin(lu, rl, lba, nblocks, true);
}

/* ---------------------------------------------------------------- */
/* Common helpers                                                    */

void sbc_io_finish(struct sbc_io *io)
{
	struct scsi_cmd *cmd = io->cmd;
	if (io->locked) {
		range_end(cmd->lu, &io->rl);
		io->locked = false;
	}
	if (io->buf) {
		buf_put(io->buf, io->buf_len);
		io->buf = NULL;
	}
	scsi_cmd_complete(cmd);
}

void sbc_io_fail_errno(struct sbc_io *io, int err, bool writing)
{
	scsi_fail_errno(io->cmd, err, writing);
	sbc_io_finish(io);
}

/* The last step of a command whose answer is the bdev's: GOOD, or its error. */
void sbc_io_done(struct sbc_io *io, int err)
{
	if (err < 0) {
		sbc_io_fail_errno(io, err, true);
		return;
	}
	sbc_io_finish(io);
}

static void io_bdev_done(struct bdev_req *req, int err)
{
	struct sbc_io *io = req->priv;
	io->next(io, err);
}

void sbc_io_submit(struct sbc_io *io, enum bdev_op op, unsigned flags, uint64_t off, uint64_t len,
		   struct iovec *iov, int iovcnt, void (*next)(struct sbc_io *, int))
{
	io->req.op = op;
	io->req.flags = flags;
	io->req.offset = off;
	io->req.len = len;
	io->req.iov = iov;
	io->req.iovcnt = iovcnt;
	io->req.done = io_bdev_done;
	io->req.priv = io;
	io->next = next;
	bdev_submit(io->cmd->lu->dev, &io->req);
}

bool sbc_io_alloc(struct sbc_io *io, size_t len)
{
	io->buf = buf_get(len);
	if (!io->buf) {
		scsi_fail(io->cmd, SK_HARDWARE_ERROR, ASC_INTERNAL_TARGET_FAILURE);
		return false;
	}
	io->buf_len = len;
	return true;
}

/*
 * The part of the command's iovec covering [off, off + len): the iovec
 * itself when it matches exactly, else a trimmed copy of the entries in
 * io->tiov. Returns the entry count, or -1 when the data is short or too
 * fragmented to describe (the caller then bounces).
 */
int sbc_iov_window(struct sbc_io *io, size_t off, size_t len, struct iovec **out)
{
	struct scsi_cmd *cmd = io->cmd;
	size_t pos = 0;
	int k = 0;

	if (off == 0 && cmd->iovcnt > 0) {
		size_t total = scsi_iov_len(cmd);
		if (total == len) {
			*out = cmd->iov;
			return cmd->iovcnt;
		}
	}
	for (int i = 0; i < cmd->iovcnt && len; i++) {
		size_t l = cmd->iov[i].iov_len;
		if (pos + l <= off) {
			pos += l;
			continue;
		}
		size_t skip = off > pos ? off - pos : 0;
		size_t take = l - skip < len ? l - skip : len;
		if (k == SBC_TIOV)
			return -1;
		io->tiov[k].iov_base = (uint8_t *)cmd->iov[i].iov_base + skip;
		io->tiov[k].iov_len = take;
		k++;
		len -= take;
		pos += l;
		off = pos;
	}
	if (len)
		return -1;
	*out = io->tiov;
	return k;
}

/* ---------------------------------------------------------------- */
/* READ CAPACITY                                                     */

enum scsi_rc sbc_read_capacity_10(struct scsi_cmd *cmd)
{
	struct scsi_lu *lu = cmd->lu;
	uint8_t b[8];
	uint64_t last = lu->nblocks - 1;

	if (!(cmd->cdb[8] & 0x01) && be32_get(cmd->cdb + 2))
		return scsi_fail_cdb(cmd, 2, -1);
	be32_put(b, last > 0xffffffffull ? 0xffffffffu : (uint32_t)last);
	be32_put(b + 4, lu->block_size);
	scsi_data_in(cmd, b, sizeof(b), sizeof(b));
	return SCSI_RC_DONE;
}

enum scsi_rc sbc_read_capacity_16(struct scsi_cmd *cmd)
{
	struct scsi_lu *lu = cmd->lu;
	uint32_t alloc = be32_get(cmd->cdb + 10);
	uint8_t b[32];

	if (!(cmd->cdb[14] & 0x01) && be64_get(cmd->cdb + 2))
		return scsi_fail_cdb(cmd, 2, -1);
	memset(b, 0, sizeof(b));
	be64_put(b, lu->nblocks - 1);
	be32_put(b + 8, lu->block_size);
	/* LOGICAL BLOCKS PER PHYSICAL BLOCK EXPONENT stays 0: the backing
	 * store takes single-block writes atomically and unmaps by block. */
	if (lu->dev->can_unmap)
		b[14] = 0x80 | 0x40; /* LBPME, LBPRZ */
	scsi_data_in(cmd, b, sizeof(b), alloc);
	return SCSI_RC_DONE;
}

/* ---------------------------------------------------------------- */
/* SYNCHRONIZE CACHE, PRE-FETCH                                      */

enum scsi_rc sbc_sync_cache(struct scsi_cmd *cmd)
{
	struct sbc_io *io = sbc_io_of(cmd);
	bool sixteen = cmd->cdb[0] == OP_SYNC_CACHE_16;
	uint64_t lba = sixteen ? be64_get(cmd->cdb + 2) : be32_get(cmd->cdb + 2);
	uint32_t n = sixteen ? be32_get(cmd->cdb + 10) : be16_get(cmd->cdb + 7);

	if (!sbc_range_ok(cmd, lba, n))
		return SCSI_RC_DONE;
	/* IMMED is honoured by being fast enough: the flush of the whole
	 * device is what makes the range durable either way. */
	sbc_io_submit(io, BDEV_FLUSH, 0, 0, 0, NULL, 0, sbc_io_done);
	return SCSI_RC_PENDING;
}

enum scsi_rc sbc_prefetch(struct scsi_cmd *cmd)
{
	bool sixteen = cmd->cdb[0] == OP_PREFETCH_16;
	uint64_t lba = sixteen ? be64_get(cmd->cdb + 2) : be32_get(cmd->cdb + 2);
	uint32_t n = sixteen ? be32_get(cmd->cdb + 10) : be16_get(cmd->cdb + 7);

	sbc_range_ok(cmd, lba, n);
	return SCSI_RC_DONE;
}

/* ---------------------------------------------------------------- */
/* READ DEFECT DATA: the medium is a file or a RAID volume; it has no  */
/* defect list of its own, so both lists are reported, and empty.      */

#define DEFECT_PLISTV 0x10
#define DEFECT_GLISTV 0x08

enum scsi_rc sbc_read_defect_data(struct scsi_cmd *cmd)
{
	bool twelve = cmd->cdb[0] == OP_READ_DEFECT_DATA_12;
	uint8_t req = twelve ? cmd->cdb[1] : cmd->cdb[2];
	uint32_t alloc = twelve ? be32_get(cmd->cdb + 6) : be16_get(cmd->cdb + 7);
	uint8_t b[8];

	memset(b, 0, sizeof(b));
	b[1] = req & (DEFECT_PLISTV | DEFECT_GLISTV | 0x07);
	scsi_data_in(cmd, b, twelve ? 8 : 4, alloc);
	return SCSI_RC_DONE;
}
