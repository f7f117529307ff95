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
 * of the same LBAs, and must wait for nothing else: ESXi drops a datastore
 * whose heartbeat takes seconds, and a write elsewhere may be stuck on the
 * backing store for that long. Plain writes stay lock-free while no CAW is
 * active:
 *
 *   writer: caw_active == 0 -> go, in its worker's list of fast writes
 *           (a thread-local list: no atomic, no lock), else the slow path
 *   CAW:    caw_active++, join lu->ranges, then have every worker look at
 *           its list (a posted call, one per LU and worker, serving every
 *           CAW waiting at the time) and count the fast writes in flight
 *           that overlap it; it runs when that count is back to zero and
 *           no overlapping entry is ahead of it in lu->ranges
 *
 * No write is missed: a worker runs its commands and its posted calls one
 * at a time, so a fast write it began before its look is in its list (if
 * still in flight), and one it begins after sees caw_active (the post
 * orders the increment before the look) and takes the slow path. A
 * counted write marks itself awaited; when it ends it takes lu->mutex and
 * uncounts itself from every waiting CAW that overlaps it and whose look
 * at this worker is done (those are exactly the ones that counted it: a
 * look after its end cannot see it, one before its start sees caw_active
 * up already). On the slow path every writer appends a range_lock to
 * lu->ranges; an entry may run when no entry ahead of it overlaps it with
 * a CAW on either side (writes never wait for writes). A deferred command
 * is resumed on its own worker through worker_post. One that a task
 * management function aborts while it still waits (scsi_cmd_cancel) leaves
 * lu->ranges and ends ABORTED COMMAND without reaching the device, so the
 * function need not wait for whatever it was queued behind.
 *
 * A write the host was already told failed (the backing store did not
 * answer within io_timeout: scsi_cmd_overdue) may still land whenever the
 * device gets to it, so it becomes a fence: an entry of lu->ranges that
 * every later overlapping write and CAW waits behind, counted in
 * caw_active so that later writes take the slow path and meet it. A slow
 * write is its own fence; a fast one gets a fence entry of its own that
 * leaves with it. Either way the newer write lands after the old one.
 *
 * Threading: handlers run on the submitting worker; bdev completions come
 * back on the same worker, so a fast write begins and ends on one. lu->mutex
 * is taken only on the CAW slow path and is never held across bdev_submit.
 */
#include "backstore/lu.h"
#include "backstore/sbc_io.h"

#include "common/bufpool.h"
#include "common/log.h"

#include <stdlib.h>

/* ---------------------------------------------------------------- */
/* CAW interlock                                                     */

static bool ranges_overlap(const struct range_lock *a, const struct range_lock *b)
{
	return a->lba < b->lba + b->nblocks && b->lba < a->lba + a->nblocks;
}

static __thread struct range_lock *fast_head; /* this worker's fast writes in flight */

static bool scan_bit(const uint64_t *set, unsigned i)
{
	return set[i / 64] >> (i % 64) & 1;
}

static void scan_set(uint64_t *set, unsigned i, bool on)
{
	if (on)
		set[i / 64] |= 1ull << (i % 64);
	else
		set[i / 64] &= ~(1ull << (i % 64));
}

/* May e run now? Caller holds lu->mutex. */
static bool range_eligible(struct scsi_lu *lu, struct range_lock *e)
{
	if (e->is_caw && (e->caw.scans_left || e->caw.blockers))
		return false;
	for (struct range_lock *a = lu->ranges; a && a != e; a = a->next)
		if ((a->is_caw || a->is_fence || e->is_caw) && ranges_overlap(a, e))
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

/*
 * On worker `self`, with lu->mutex held: every CAW of lu that has not yet
 * looked at this worker's fast writes counts the ones overlapping it.
 */
static void scan_locked(struct scsi_lu *lu, unsigned self)
{
	for (struct range_lock *e = lu->ranges; e; e = e->next) {
		if (!e->is_caw || scan_bit(e->caw.scanned, self))
			continue;
		for (struct range_lock *w = fast_head; w; w = w->next)
			if (w->lu == lu && ranges_overlap(w, e)) {
				w->awaited = true;
				e->caw.blockers++;
			}
		scan_set(e->caw.scanned, self, true);
		e->caw.scans_left--;
	}
}

static void scan_posted(void *arg)
{
	struct scsi_lu *lu = arg;
	unsigned self = worker_index(worker_self());
	pthread_mutex_lock(&lu->mutex);
	scan_set(lu->scan_posted, self, false); /* a later CAW posts it again */
	scan_locked(lu, self);
	ranges_wake_locked(lu);
	pthread_mutex_unlock(&lu->mutex);
}

static void fast_write_done(struct scsi_lu *lu, struct range_lock *rl)
{
	if (rl->prev)
		rl->prev->next = rl->next;
	else
		fast_head = rl->next;
	if (rl->next)
		rl->next->prev = rl->prev;
	if (!rl->awaited)
		return;
	unsigned self = worker_index(worker_self());
	pthread_mutex_lock(&lu->mutex);
	for (struct range_lock *e = lu->ranges; e; e = e->next)
		if (e->is_caw && !e->granted && scan_bit(e->caw.scanned, self) && ranges_overlap(e, rl))
			e->caw.blockers--;
	ranges_wake_locked(lu);
	pthread_mutex_unlock(&lu->mutex);
}

static bool range_begin(struct scsi_lu *lu, struct range_lock *rl, struct scsi_cmd *cmd, uint64_t lba,
			uint64_t nblocks, bool is_caw)
{
	if (atomic_load(&lu->odx_tokens))
		odx_write_seen(lu, lba, nblocks ? nblocks : 1);
	rl->lu = lu;
	rl->cmd = cmd;
	rl->is_fence = false;
	rl->fence = NULL;
	if (cmd)
		cmd->wlock = rl;
	rl->lba = lba;
	rl->nblocks = nblocks ? nblocks : 1;
	rl->is_caw = is_caw;
	rl->granted = false;
	rl->fast = false;
	rl->awaited = false;
	rl->cancelled = NULL; /* its owner sets it once the command waits */
	rl->worker = worker_self();
	if (!is_caw) {
		if (atomic_load(&lu->caw_active) == 0) {
			rl->fast = true;
			rl->prev = NULL;
			rl->next = fast_head;
			if (fast_head)
				fast_head->prev = rl;
			fast_head = rl;
			return true;
		}
	} else {
		atomic_fetch_add(&lu->caw_active, 1);
		memset(&rl->caw, 0, sizeof(rl->caw));
		rl->caw.scans_left = workers_count();
	}
	unsigned self = worker_index(rl->worker);
	pthread_mutex_lock(&lu->mutex);
	range_append_locked(lu, rl);
	if (is_caw) {
		scan_locked(lu, self);
		for (unsigned i = 0; i < workers_count(); i++) {
			if (i == self || scan_bit(lu->scan_posted, i))
				continue;
			scan_set(lu->scan_posted, i, true);
			worker_post_call(worker_get(i), &lu->scan_call[i], scan_posted, lu);
		}
	}
	bool go = range_eligible(lu, rl);
	rl->granted = go;
	pthread_mutex_unlock(&lu->mutex);
	return go;
}

static void range_end(struct scsi_lu *lu, struct range_lock *rl)
{
	/* a write in flight when a token was made lands after it: it too
	 * cancels the token */
	if (atomic_load(&lu->odx_tokens))
		odx_write_seen(lu, rl->lba, rl->nblocks);
	if (rl->cmd && rl->cmd->wlock == rl)
		rl->cmd->wlock = NULL;
	if (rl->fast) {
		fast_write_done(lu, rl);
		struct range_lock *f = rl->fence;
		if (!f)
			return;
		rl->fence = NULL;
		pthread_mutex_lock(&lu->mutex);
		range_remove_locked(lu, f);
		atomic_fetch_sub(&lu->caw_active, 1);
		ranges_wake_locked(lu);
		pthread_mutex_unlock(&lu->mutex);
		free(f);
		return;
	}
	pthread_mutex_lock(&lu->mutex);
	range_remove_locked(lu, rl);
	if (rl->is_caw || rl->is_fence)
		atomic_fetch_sub(&lu->caw_active, 1);
	ranges_wake_locked(lu);
	pthread_mutex_unlock(&lu->mutex);
}

bool sbc_write_begin(struct scsi_lu *lu, struct range_lock *rl, struct scsi_cmd *cmd, uint64_t lba,
		     uint64_t nblocks)
{
	return range_begin(lu, rl, cmd, lba, nblocks, false);
}

void sbc_write_fence(struct scsi_cmd *cmd)
{
	struct range_lock *rl = cmd->wlock;
	if (!rl || rl->is_caw || rl->is_fence || rl->fence)
		return; /* a CAW already holds off every overlapping writer */
	struct scsi_lu *lu = rl->lu;
	if (!rl->fast) {
		pthread_mutex_lock(&lu->mutex);
		rl->is_fence = true;
		atomic_fetch_add(&lu->caw_active, 1);
		pthread_mutex_unlock(&lu->mutex);
		return;
	}
	struct range_lock *f = calloc(1, sizeof(*f));
	if (!f) {
		log_err("lun \"%s\": no memory to hold later writes behind one the host was told failed; "
			"a late landing may overwrite them", lu->name);
		return;
	}
	f->lu = lu;
	f->lba = rl->lba;
	f->nblocks = rl->nblocks;
	f->is_fence = true;
	f->granted = true;
	f->worker = rl->worker;
	rl->fence = f;
	/* raised first: a writer that misses the entry below has not looked yet */
	atomic_fetch_add(&lu->caw_active, 1);
	pthread_mutex_lock(&lu->mutex);
	range_append_locked(lu, f);
	pthread_mutex_unlock(&lu->mutex);
}

void sbc_write_end(struct scsi_lu *lu, struct range_lock *rl)
{
	range_end(lu, rl);
}

bool sbc_caw_begin(struct scsi_lu *lu, struct range_lock *rl, struct scsi_cmd *cmd, uint64_t lba,
		   uint64_t nblocks)
{
	return range_begin(lu, rl, cmd, lba, nblocks, true);
}

/*
 * On the command's worker, posted by scsi_cmd_cancel. An entry not yet
 * granted has sent nothing to the device and nobody has posted its resume
 * (granting and posting happen together, under lu->mutex): taking it out of
 * lu->ranges under the same lock ends its place in the interlock as if it
 * had run, and whatever waited behind it is looked at again; its owner's
 * cancelled() then ends the command. One granted meanwhile has its resume
 * queued behind this call on the same worker, and simply runs.
 */
static void cancel_run(void *arg)
{
	struct range_lock *rl = arg;
	struct scsi_lu *lu = rl->lu;
	pthread_mutex_lock(&lu->mutex);
	bool waiting = !rl->granted;
	if (waiting) {
		range_remove_locked(lu, rl);
		if (rl->is_caw || rl->is_fence)
			atomic_fetch_sub(&lu->caw_active, 1);
		ranges_wake_locked(lu);
	}
	pthread_mutex_unlock(&lu->mutex);
	if (!waiting)
		return;
	if (rl->cmd && rl->cmd->wlock == rl)
		rl->cmd->wlock = NULL;
	rl->cancelled(rl);
}

bool scsi_cmd_cancel(struct scsi_cmd *cmd)
{
	struct range_lock *rl = cmd->wlock;
	if (!rl || rl->fast || !rl->cancelled || rl->worker != worker_self())
		return false;
	struct scsi_lu *lu = rl->lu;
	/* posted (done() must not come from inside the front end's abort)
	 * under the lock: a grant after it posts the resume behind it, so
	 * cancel_run always runs while rl is still the command's */
	pthread_mutex_lock(&lu->mutex);
	bool posted = !rl->granted && worker_post(rl->worker, cancel_run, rl) == 0;
	pthread_mutex_unlock(&lu->mutex);
	return posted;
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
	if (req->outcome > io->cmd->outcome)
		io->cmd->outcome = req->outcome;
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
	io->req.outcome = BDEV_OUT_NONE;
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
	/* a gateway that does not own the shared store has nothing to make
	 * durable (lu_dispatch.c unowned_ok), and may not flush it */
	if (cmd->unowned)
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
