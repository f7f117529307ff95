/*
 * freeze_fs.c - a FUSE file system of one file that can stop answering:
 * a backing store that hangs, for the tests (a dead NFS server, a frozen
 * array), through the kernel like any other file.
 *
 *   freeze_fs IMAGE MOUNTPOINT [fuse options]
 *
 * MOUNTPOINT/disk passes reads, writes, fsync, fallocate and lseek through
 * to IMAGE. After SIGUSR1 every read, write, fsync and fallocate of it
 * waits, unanswered, until SIGUSR2; MOUNTPOINT/held (never frozen) reads
 * as "FROZEN HELD PASSED": 1 or 0, the requests waiting now, and the ones
 * passed through so far. Run it with -f (foreground) and -o max_threads=N
 * above the requests that may be held at once.
 */
#define _GNU_SOURCE
#define FUSE_USE_VERSION 35
#include <fuse3/fuse.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int img_fd = -1;
static atomic_int frozen;
static atomic_long held, passed;

static void on_usr1(int sig) { (void)sig; atomic_store(&frozen, 1); }
static void on_usr2(int sig) { (void)sig; atomic_store(&frozen, 0); }

/* Wait while frozen: a held request (polled; a test tool). */
static void gate(void)
{
	if (!atomic_load(&frozen)) {
		atomic_fetch_add(&passed, 1);
		return;
	}
	atomic_fetch_add(&held, 1);
	while (atomic_load(&frozen))
		usleep(5000);
	atomic_fetch_sub(&held, 1);
	atomic_fetch_add(&passed, 1);
}

static int held_text(char *buf, size_t len)
{
	return snprintf(buf, len, "%d %ld %ld\n", atomic_load(&frozen), atomic_load(&held), atomic_load(&passed));
}

static int ff_getattr(const char *path, struct stat *st, struct fuse_file_info *fi)
{
	(void)fi;
	memset(st, 0, sizeof(*st));
	if (!strcmp(path, "/")) {
		st->st_mode = S_IFDIR | 0755;
		st->st_nlink = 2;
		return 0;
	}
	if (!strcmp(path, "/held")) {
		char b[64];
		st->st_mode = S_IFREG | 0444;
		st->st_nlink = 1;
		st->st_size = held_text(b, sizeof(b));
		return 0;
	}
	if (strcmp(path, "/disk"))
		return -ENOENT;
	if (fstat(img_fd, st) < 0)
		return -errno;
	return 0;
}

static int ff_readdir(const char *path, void *buf, fuse_fill_dir_t fill, off_t off, struct fuse_file_info *fi,
		      enum fuse_readdir_flags flags)
{
	(void)off; (void)fi; (void)flags;
	if (strcmp(path, "/"))
		return -ENOENT;
	fill(buf, ".", NULL, 0, 0);
	fill(buf, "..", NULL, 0, 0);
	fill(buf, "disk", NULL, 0, 0);
	fill(buf, "held", NULL, 0, 0);
	return 0;
}

static int ff_open(const char *path, struct fuse_file_info *fi)
{
	if (!strcmp(path, "/held")) {
		fi->direct_io = 1; /* its size changes: no page cache */
		return (fi->flags & O_ACCMODE) == O_RDONLY ? 0 : -EACCES;
	}
	if (strcmp(path, "/disk"))
		return -ENOENT;
	fi->direct_io = 1; /* every read and write reaches us, so a freeze holds them */
	return 0;
}

static int ff_read(const char *path, char *buf, size_t size, off_t off, struct fuse_file_info *fi)
{
	(void)fi;
	if (!strcmp(path, "/held")) {
		char b[64];
		int n = held_text(b, sizeof(b));
		if (off >= n)
			return 0;
		if ((size_t)(n - off) < size)
			size = (size_t)(n - off);
		memcpy(buf, b + off, size);
		return (int)size;
	}
	gate();
	ssize_t r = pread(img_fd, buf, size, off);
	return r < 0 ? -errno : (int)r;
}

static int ff_write(const char *path, const char *buf, size_t size, off_t off, struct fuse_file_info *fi)
{
	(void)path; (void)fi;
	gate();
	ssize_t r = pwrite(img_fd, buf, size, off);
	return r < 0 ? -errno : (int)r;
}

static int ff_fsync(const char *path, int datasync, struct fuse_file_info *fi)
{
	(void)path; (void)fi;
	gate();
	return (datasync ? fdatasync(img_fd) : fsync(img_fd)) < 0 ? -errno : 0;
}

static int ff_flush(const char *path, struct fuse_file_info *fi)
{
	(void)path; (void)fi;
	return 0;
}

static int ff_fallocate(const char *path, int mode, off_t off, off_t len, struct fuse_file_info *fi)
{
	(void)path; (void)fi;
	gate();
	return fallocate(img_fd, mode, off, len) < 0 ? -errno : 0;
}

static int ff_truncate(const char *path, off_t size, struct fuse_file_info *fi)
{
	(void)fi;
	if (strcmp(path, "/disk"))
		return -EACCES;
	return ftruncate(img_fd, size) < 0 ? -errno : 0;
}

static off_t ff_lseek(const char *path, off_t off, int whence, struct fuse_file_info *fi)
{
	(void)path; (void)fi;
	gate();
	off_t r = lseek(img_fd, off, whence);
	return r < 0 ? -errno : r;
}

static int ff_statfs(const char *path, struct statvfs *st)
{
	(void)path;
	return fstatvfs(img_fd, st) < 0 ? -errno : 0;
}

static const struct fuse_operations ops = {
	.getattr = ff_getattr,
	.readdir = ff_readdir,
	.open = ff_open,
	.read = ff_read,
	.write = ff_write,
	.fsync = ff_fsync,
	.flush = ff_flush,
	.fallocate = ff_fallocate,
	.truncate = ff_truncate,
	.lseek = ff_lseek,
	.statfs = ff_statfs,
};

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: %s IMAGE MOUNTPOINT [fuse options]\n", argv[0]);
		return 2;
	}
	img_fd = open(argv[1], O_RDWR);
	if (img_fd < 0) {
		perror(argv[1]);
		return 1;
	}
	struct sigaction sa = { .sa_handler = on_usr1 };
	sigaction(SIGUSR1, &sa, NULL);
	sa.sa_handler = on_usr2;
	sigaction(SIGUSR2, &sa, NULL);
	/* fuse_main sees: prog MOUNTPOINT [options] */
	argv[1] = argv[0];
	return fuse_main(argc - 1, argv + 1, &ops, NULL);
}
