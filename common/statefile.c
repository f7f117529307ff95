/*
 * statefile.c - small files in state_dir replaced whole and durably
 * (statefile.h).
 */
#include "common/statefile.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int write_all(int fd, const char *p, size_t len)
{
	while (len) {
		ssize_t n = write(fd, p, len);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

int state_file_replace(const char *path, const void *data, size_t len)
{
	char tmp[PATH_MAX], dir[PATH_MAX];
	if (snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= (int)sizeof(tmp) ||
	    snprintf(dir, sizeof(dir), "%s", path) >= (int)sizeof(dir))
		return -ENAMETOOLONG;
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	int err = write_all(fd, data, len);
	if (!err && fsync(fd) < 0)
		err = -errno;
	if (close(fd) < 0 && !err)
		err = -errno;
	if (!err && rename(tmp, path) < 0)
		err = -errno;
	if (err) {
		unlink(tmp);
		return err;
	}
	char *slash = strrchr(dir, '/');
	if (slash == dir)
		slash[1] = '\0'; /* a file in / */
	else if (slash)
		*slash = '\0';
	int dfd = open(slash ? dir : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return -errno;
	err = fsync(dfd) < 0 ? -errno : 0;
	close(dfd);
	return err;
}
