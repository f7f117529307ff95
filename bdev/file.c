/*
 * file.c - a bdev on a regular file or a block device, via io_uring.
 *
 * The file is opened with O_DIRECT when the filesystem allows it, so the
 * page cache neither doubles memory nor hides a lost write; writes flagged
 * BDEV_F_FUA carry RWF_DSYNC and are durable when they complete. With
 * BDEV_FILE_BUFFERED (an uncached LUN's backing_io = buffered) it goes
 * through the page cache instead: the same flags keep the same promise
 * (RWF_DSYNC for FUA and write cache off, fdatasync for FLUSH, whose error
 * also reports a failed background write-back). UNMAP
 * punches holes (files stay sparse, thin provisioning is real) and
 * WRITE_ZEROES uses FALLOC_FL_ZERO_RANGE. Short transfers are resumed until
 * the whole range is done.
 */
#include "bdev/file.h"

#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

struct file_bdev {
	struct bdev dev;
	int fd;
	bool is_blockdev;
	bool buffered;        /* BDEV_FILE_BUFFERED: no O_DIRECT */
	bool via_io_wq;       /* a filesystem that may block io_uring_enter: see below */
	char path[];
};

/*
 * Buffered writes that need no durability (write cache on, no FUA) and
 * are small go straight into the page cache with pwritev on the worker:
 * io_uring cannot do them without blocking on ext4 (no RWF_NOWAIT for
 * buffered writes there), so it hands each one to an io-wq thread, which
 * costs a few context switches per 4K write. A page-cache copy of up to
 * INLINE_MAX bytes is cheaper than that hand-off. done() still runs later,
 * at the end of the worker's loop iteration (bdev.h: never inside submit).
 * Larger writes, FUA writes and anything that fails or comes up short go
 * through io_uring as before.
 */
#define INLINE_MAX (64u << 10)

static __thread struct bdev_req *inline_head, *inline_last; /* linked through req->link */
static __thread struct worker_batch_end inline_be;

static void inline_complete(struct worker_batch_end *b)
{
	struct bdev_req *req = inline_head;
	inline_head = inline_last = NULL;
	while (req) {
		struct bdev_req *next = req->link;
		req->done(req, 0);
		req = next;
	}
}

static bool file_write_inline(struct file_bdev *fb, struct bdev_req *req)
{
	if (!fb->buffered || fb->via_io_wq || req->op != BDEV_WRITE || (req->flags & BDEV_F_FUA) || req->len > INLINE_MAX ||
	    !worker_self())
		return false;
	ssize_t r = pwritev(fb->fd, req->iov, req->iovcnt, (off_t)req->offset);
	if (r <= 0)
		return false; /* io_uring reports the error */
	req->done_bytes = (uint64_t)r;
	if (req->done_bytes < req->len)
		return false; /* the rest through io_uring */
	req->link = NULL;
	if (inline_last)
		inline_last->link = req;
	else
		inline_head = req;
	inline_last = req;
	inline_be.fn = inline_complete;
	worker_at_batch_end(&inline_be);
	return true;
}

static void file_issue(struct file_bdev *fb, struct bdev_req *req);

/*
 * Filesystems served by another process or host (FUSE, NFS, SMB, CephFS,
 * 9p) can keep a request inside io_uring_enter when they stop answering:
 * the kernel issues it inline and it sleeps there (an O_DIRECT write to a
 * FUSE file waits for the file's lock held by a stuck fsync), and with it
 * the worker and every session on it. On those, every request carries
 * IOSQE_ASYNC, so that it waits on an io-wq thread instead, and no write
 * is made inline. A few microseconds per request, on what is the slow
 * tier anyway; local filesystems and block devices keep the inline path.
 */
static bool fs_may_block_submit(int fd)
{
	struct statfs sf;
	if (fstatfs(fd, &sf) < 0)
		return false;
	switch ((unsigned long)sf.f_type) {
	case 0x65735546UL: /* FUSE */
	case 0x6969UL:     /* NFS */
	case 0xFF534D42UL: /* CIFS */
	case 0xFE534D42UL: /* SMB2 */
	case 0x00C36400UL: /* CephFS */
	case 0x01021997UL: /* 9p */
		return true;
	default:
		return false;
	}
}

/* Advance an iovec array past n bytes into a scratch copy. */
static int iov_skip(const struct iovec *iov, int iovcnt, uint64_t n, struct iovec *out)
{
	int k = 0;
	for (int i = 0; i < iovcnt; i++) {
		if (n >= iov[i].iov_len) {
			n -= iov[i].iov_len;
			continue;
		}
		out[k].iov_base = (char *)iov[i].iov_base + n;
		out[k].iov_len = iov[i].iov_len - n;
		n = 0;
		k++;
	}
	return k;
}

static void file_io_done(struct io_op *op, int res)
{
	struct bdev_req *req = (struct bdev_req *)((char *)op - offsetof(struct bdev_req, io));
	struct file_bdev *fb = (struct file_bdev *)req->dev;

	if (res < 0) {
		req->done(req, res);
		return;
	}
	if (req->op == BDEV_READ || req->op == BDEV_WRITE) {
		if (res == 0 && req->op == BDEV_READ) {
			/* Past the end of a file that shrank under us: zero-fill. */
			struct iovec rest[64];
			int n = iov_skip(req->iov, req->iovcnt, req->done_bytes, rest);
			for (int i = 0; i < n; i++)
				memset(rest[i].iov_base, 0, rest[i].iov_len);
			req->done(req, 0);
			return;
		}
		if (res == 0) {
			req->done(req, -EIO);
			return;
		}
		req->done_bytes += (uint64_t)res;
		if (req->done_bytes < req->len) {
			file_issue(fb, req);
			return;
		}
	}
	req->done(req, 0);
}

static void file_issue(struct file_bdev *fb, struct bdev_req *req)
{
	struct io_uring_sqe *sqe = worker_sqe();
	uint64_t off = req->offset + req->done_bytes;

	/*
	 * The SQE names its request before anything can submit it: a resumed
	 * transfer is submitted below, inside this call, and io_uring_prep_*
	 * leave user_data alone, so a slot filled later would go out with the
	 * user_data of the request that used the slot last time round the
	 * ring, whose done() would then run a second time.
	 */
	req->io.done = file_io_done;
	io_uring_sqe_set_data(sqe, &req->io);

	switch (req->op) {
	case BDEV_READ:
	case BDEV_WRITE: {
		const struct iovec *iov = req->iov;
		int iovcnt = req->iovcnt;
		struct iovec rest[64];
		if (req->done_bytes) {
			/* Rare resumption of a short transfer: the scratch copy must
			 * outlive submission, which happens before we return. */
			iovcnt = iov_skip(req->iov, req->iovcnt, req->done_bytes, rest);
			iov = rest;
		}
		if (req->op == BDEV_READ)
			io_uring_prep_readv(sqe, fb->fd, iov, iovcnt, off);
		else
			io_uring_prep_writev(sqe, fb->fd, iov, iovcnt, off);
		if (req->op == BDEV_WRITE && (req->flags & BDEV_F_FUA))
			sqe->rw_flags = RWF_DSYNC;
		if (fb->via_io_wq)
			sqe->flags |= IOSQE_ASYNC;
		if (req->done_bytes)
			worker_flush(); /* rest[] lives on this stack frame */
		return;
	}
	case BDEV_FLUSH:
		io_uring_prep_fsync(sqe, fb->fd, IORING_FSYNC_DATASYNC);
		break;
	case BDEV_UNMAP:
		io_uring_prep_fallocate(sqe, fb->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
					off, req->len);
		break;
	case BDEV_WRITE_ZEROES:
		io_uring_prep_fallocate(sqe, fb->fd, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE,
					off, req->len);
		break;
	}
	if (fb->via_io_wq)
		sqe->flags |= IOSQE_ASYNC; /* reads and writes set it above, before a flush */
}

static void file_submit(struct bdev *dev, struct bdev_req *req)
{
	struct file_bdev *fb = (struct file_bdev *)dev;
	req->done_bytes = 0;
	if (file_write_inline(fb, req))
		return;
	file_issue(fb, req);
}

/*
 * Closing makes what was written durable (fsync) first. A store that stopped
 * answering would hold that fsync, and with it the daemon's shutdown,
 * forever: it runs on a thread of its own, waited for FILE_CLOSE_WAIT_S at
 * most. Past that the file is left to that thread (it closes and frees it if
 * the store ever answers) and shutdown goes on: the process is ending, and
 * whatever the store still holds was never acknowledged as synced.
 */
#define FILE_CLOSE_WAIT_S 10

struct file_closing {
	struct file_bdev *fb;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool done;
	atomic_int refs; /* the closer and the thread */
	int err;
};

static void closing_put(struct file_closing *fc)
{
	if (atomic_fetch_sub(&fc->refs, 1) != 1)
		return;
	pthread_mutex_destroy(&fc->lock);
	pthread_cond_destroy(&fc->cond);
	free(fc);
}

static void *close_thread(void *arg)
{
	struct file_closing *fc = arg;
	struct file_bdev *fb = fc->fb;
	int err = fsync(fb->fd) < 0 ? errno : 0;
	close(fb->fd);
	free(fb);
	pthread_mutex_lock(&fc->lock);
	fc->err = err;
	fc->done = true;
	pthread_cond_signal(&fc->cond);
	pthread_mutex_unlock(&fc->lock);
	closing_put(fc);
	return NULL;
}

static void file_close(struct bdev *dev)
{
	struct file_bdev *fb = (struct file_bdev *)dev;
	struct file_closing *fc = calloc(1, sizeof(*fc));
	pthread_attr_t attr;
	pthread_t th;
	bool started = false;
	char name[256];

	snprintf(name, sizeof(name), "%s", dev->name); /* the thread frees fb */
	if (fc) {
		fc->fb = fb;
		pthread_mutex_init(&fc->lock, NULL);
		pthread_cond_init(&fc->cond, NULL);
		atomic_init(&fc->refs, 2);
		pthread_attr_init(&attr);
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		started = pthread_create(&th, &attr, close_thread, fc) == 0;
		pthread_attr_destroy(&attr);
	}
	if (!started) { /* no thread: wait here, as before */
		if (fsync(fb->fd) < 0)
			log_err("%s: fsync at close: %s", dev->name, strerror(errno));
		close(fb->fd);
		free(fb);
		free(fc);
		return;
	}
	struct timespec until;
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += FILE_CLOSE_WAIT_S;
	pthread_mutex_lock(&fc->lock);
	while (!fc->done && pthread_cond_timedwait(&fc->cond, &fc->lock, &until) == 0)
		;
	bool done = fc->done;
	int err = fc->err;
	pthread_mutex_unlock(&fc->lock);
	if (!done)
		log_err("%s: the store has not answered the fsync of its close in %d s; leaving the file to it "
			"(writes not yet synced may not be durable)", name, FILE_CLOSE_WAIT_S);
	else if (err)
		log_err("%s: fsync at close: %s (writes not yet synced may not be durable)", name, strerror(err));
	closing_put(fc);
}

static int64_t file_lba_status(struct bdev *dev, uint64_t offset, bool *mapped)
{
	struct file_bdev *fb = (struct file_bdev *)dev;
	uint64_t bs = dev->block_size;

	if (fb->is_blockdev) {
		*mapped = true;
		return (int64_t)(dev->size - offset);
	}
	off_t data = lseek(fb->fd, (off_t)offset, SEEK_DATA);
	if (data < 0 && errno == ENXIO)
		data = (off_t)dev->size; /* only a hole up to the end */
	else if (data < 0)
		return -errno;
	if ((uint64_t)data > offset) {
		/* hole from offset to data, rounded to whole blocks */
		uint64_t end = (uint64_t)data / bs * bs;
		if (end <= offset) {
			*mapped = true;
			return bs;
		}
		*mapped = false;
		return (int64_t)(end - offset);
	}
	off_t hole = lseek(fb->fd, (off_t)offset, SEEK_HOLE);
	if (hole < 0)
		return -errno;
	uint64_t end = ((uint64_t)hole + bs - 1) / bs * bs;
	if (end > dev->size)
		end = dev->size;
	*mapped = true;
	return (int64_t)(end > offset ? end - offset : bs);
}

/*
 * cachestat(2) (Linux 6.5): how many pages of a range are in the page
 * cache. Declared here: Debian 12's headers predate it. Kernels without
 * it (ENOSYS), or a seccomp filter that refuses it (EPERM), are noted once
 * and every read then takes the ordinary path.
 */
#ifndef __NR_cachestat
#define __NR_cachestat 451
#endif
struct tc_cachestat_range {
	uint64_t off, len;
};
struct tc_cachestat {
	uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
};
static _Atomic bool no_cachestat;

static int file_cached_fd(struct bdev *dev, uint64_t offset, uint64_t len, uint64_t *fd_off)
{
	struct file_bdev *fb = (struct file_bdev *)dev;
	if (!fb->buffered || fb->via_io_wq || !len || atomic_load_explicit(&no_cachestat, memory_order_relaxed))
		return -1;
	struct tc_cachestat_range r = { offset, len };
	struct tc_cachestat cs;
	if (syscall(__NR_cachestat, fb->fd, &r, &cs, 0) < 0) {
		/* not in this kernel, or refused by a seccomp filter (systemd's
		 * SystemCallFilter before it knew the call): stop asking */
		if ((errno == ENOSYS || errno == EPERM) && !atomic_exchange(&no_cachestat, true))
			log_info("%s: cachestat(2) unavailable (%s): page-cached reads are copied as usual",
				 fb->path, strerror(errno));
		return -1;
	}
	uint64_t page = (uint64_t)getpagesize(), pages = (offset + len + page - 1) / page - offset / page;
	if (cs.nr_cache < pages)
		return -1;
	*fd_off = offset;
	return fb->fd;
}

/*
 * A file's pool is its filesystem, counted as df does: used plus what is
 * available to unprivileged users (ext4 keeps a reserve that only root may
 * fill). A block device is not thin: no answer.
 */
static int file_space(struct bdev *dev, struct bdev_space *out)
{
	struct file_bdev *fb = (struct file_bdev *)dev;
	struct statvfs sv;
	struct stat st;

	if (fb->is_blockdev)
		return -ENOTSUP;
	if (fstatvfs(fb->fd, &sv) < 0 || fstat(fb->fd, &st) < 0)
		return -errno;
	uint64_t fr = sv.f_frsize ? sv.f_frsize : sv.f_bsize;
	uint64_t used = sv.f_blocks >= sv.f_bfree ? (uint64_t)(sv.f_blocks - sv.f_bfree) : 0;
	out->pool_free = (uint64_t)sv.f_bavail * fr;
	out->pool_bytes = used * fr + out->pool_free;
	out->alloc = (uint64_t)st.st_blocks * 512;
	out->alloc_known = true;
	return 0;
}

static const struct bdev_ops file_ops = {
	.submit = file_submit,
	.close = file_close,
	.lba_status = file_lba_status,
	.space = file_space,
	.cached_fd = file_cached_fd,
};

struct bdev *bdev_file_open(const char *path, uint64_t size, uint32_t block_size,
			    bool create, char *err, size_t errlen)
{
	return bdev_file_open_flags(path, size, block_size, create, 0, err, errlen);
}

struct bdev *bdev_file_open_flags(const char *path, uint64_t size, uint32_t block_size, bool create,
				  unsigned flags_in, char *err, size_t errlen)
{
	struct stat st;
	int flags = O_RDWR | O_CLOEXEC;
	int fd;

	if (stat(path, &st) < 0) {
		if (errno != ENOENT || !create) {
			snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
			return NULL;
		}
		if (size == 0) {
			snprintf(err, errlen, "%s does not exist; give a size so it can be created", path);
			return NULL;
		}
		fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
		if (fd < 0) {
			snprintf(err, errlen, "cannot create %s: %s (does its directory exist and is it writable?)",
				 path, strerror(errno));
			return NULL;
		}
		if (ftruncate(fd, (off_t)size) < 0) {
			snprintf(err, errlen, "cannot size %s to %llu bytes: %s", path,
				 (unsigned long long)size, strerror(errno));
			close(fd);
			unlink(path);
			return NULL;
		}
		fsync(fd);
		close(fd);
		if (stat(path, &st) < 0) {
			snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
			return NULL;
		}
	}
	bool is_blk = S_ISBLK(st.st_mode);
	if (!is_blk && !S_ISREG(st.st_mode)) {
		snprintf(err, errlen, "%s is neither a regular file nor a block device", path);
		return NULL;
	}
	fd = (flags_in & BDEV_FILE_BUFFERED) ? -1 : open(path, flags | O_DIRECT);
	if (fd < 0 && ((flags_in & BDEV_FILE_BUFFERED) || errno == EINVAL))
		fd = open(path, flags); /* asked for, or a filesystem without O_DIRECT (tmpfs) */
	if (fd < 0) {
		snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
		return NULL;
	}
	uint64_t cur = (uint64_t)st.st_size;
	if (is_blk && ioctl(fd, BLKGETSIZE64, &cur) < 0) {
		snprintf(err, errlen, "cannot read the size of %s: %s", path, strerror(errno));
		close(fd);
		return NULL;
	}
	if (size == 0)
		size = cur;
	if (size > cur) {
		if (is_blk) {
			snprintf(err, errlen, "%s holds %llu bytes but %llu were asked for; lower size or use a larger device",
				 path, (unsigned long long)cur, (unsigned long long)size);
			close(fd);
			return NULL;
		}
		if (ftruncate(fd, (off_t)size) < 0) {
			snprintf(err, errlen, "cannot grow %s to %llu bytes: %s", path,
				 (unsigned long long)size, strerror(errno));
			close(fd);
			return NULL;
		}
	}
	if (size < block_size || size % block_size) {
		snprintf(err, errlen, "%s: size %llu is not a whole number of %u-byte blocks", path,
			 (unsigned long long)size, block_size);
		close(fd);
		return NULL;
	}
	struct file_bdev *fb = calloc(1, sizeof(*fb) + strlen(path) + 1);
	if (!fb) {
		close(fd);
		snprintf(err, errlen, "out of memory opening %s", path);
		return NULL;
	}
	strcpy(fb->path, path);
	fb->fd = fd;
	fb->is_blockdev = is_blk;
	fb->buffered = (flags_in & BDEV_FILE_BUFFERED) != 0;
	fb->via_io_wq = !is_blk && fs_may_block_submit(fd);
	if (fb->via_io_wq)
		log_info("%s: on a network or FUSE filesystem: its I/O waits on io_uring's threads, never a worker",
			 path);
	fb->dev.ops = &file_ops;
	fb->dev.name = fb->path;
	fb->dev.size = size;
	fb->dev.block_size = block_size;
	fb->dev.can_unmap = true;
	fb->dev.rotational = is_blk; /* refined by sysfs for real disks later */
	return &fb->dev;
}
