/*
 * leg_floor.c - what the legs alone cost a write-back write at QD1
 * (tests/bench/device.sh, after the write-back QD1 breakdown).
 *
 *   leg_floor LEG0 LEG1 OFFSET SIZE SECONDS
 *
 * Times, in rounds that alternate, three patterns of 4 KiB O_DIRECT
 * writes with RWF_DSYNC at random 4 KiB offsets in [OFFSET, OFFSET+SIZE)
 * of the two files, each iteration submitted at once and waited for whole:
 *   one    one write to LEG0: the device's own durable write (fio's QD1 job)
 *   legs   one write to each file: the least a mirrored write can send
 *   trip   two writes to each file: what a one-trip write-back write sends
 *          (its data and its journal record, on each leg)
 * and prints each one's mean in microseconds (its own timing, the system
 * calls included) and its ratio to one. With the iSCSI round trip added,
 * these are the floors of the write-back QD1 row for today's design (trip)
 * and for one write per leg (legs).
 */

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BS 4096

static double now_us(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

/* One iteration: per file, `per` writes; returns its time in us, or -1. */
static double iteration(struct io_uring *ring, const int *fd, int nfiles, int per, void *buf, uint64_t off,
			uint64_t size)
{
	double t0 = now_us();
	int n = 0;
	for (int f = 0; f < nfiles; f++)
		for (int k = 0; k < per; k++) {
			struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
			if (!sqe)
				return -1;
			uint64_t at = off + ((uint64_t)random() % (size / BS)) * BS;
			io_uring_prep_write(sqe, fd[f], buf, BS, at);
			sqe->rw_flags = RWF_DSYNC;
			n++;
		}
	int r = io_uring_submit(ring);
	if (r != n) {
		fprintf(stderr, "leg_floor: submitted %d of %d writes\n", r, n);
		return -1;
	}
	for (int i = 0; i < n; i++) {
		struct io_uring_cqe *cqe;
		/* a device that stalls ends the run instead of hanging it */
		struct __kernel_timespec limit = { .tv_sec = 30 };
		r = io_uring_wait_cqe_timeout(ring, &cqe, &limit);
		if (r < 0) {
			fprintf(stderr, "leg_floor: waiting for a write: %s\n", strerror(-r));
			return -1;
		}
		int res = cqe->res;
		io_uring_cqe_seen(ring, cqe);
		if (res != BS) {
			fprintf(stderr, "leg_floor: a write returned %d (%s)\n", res, res < 0 ? strerror(-res) : "short");
			return -1;
		}
	}
	return now_us() - t0;
}

int main(int argc, char **argv)
{
	if (argc != 6) {
		fprintf(stderr, "usage: leg_floor LEG0 LEG1 OFFSET SIZE SECONDS\n");
		return 2;
	}
	int fd[2];
	for (int i = 0; i < 2; i++) {
		fd[i] = open(argv[1 + i], O_WRONLY | O_DIRECT);
		if (fd[i] < 0) {
			fprintf(stderr, "leg_floor: %s: %s\n", argv[1 + i], strerror(errno));
			return 1;
		}
	}
	uint64_t off = strtoull(argv[3], NULL, 0), size = strtoull(argv[4], NULL, 0);
	double secs = strtod(argv[5], NULL);
	if (size < BS || off % BS || secs <= 0) {
		fprintf(stderr, "leg_floor: bad OFFSET, SIZE or SECONDS\n");
		return 2;
	}
	void *buf;
	if (posix_memalign(&buf, BS, BS))
		return 1;
	memset(buf, 0x5a, BS);
	struct io_uring ring;
	int r = io_uring_queue_init(8, &ring, 0);
	if (r < 0) {
		fprintf(stderr, "leg_floor: io_uring: %s\n", strerror(-r));
		return 1;
	}
	static const struct {
		const char *name;
		int nfiles, per;
	} pat[3] = { { "one", 1, 1 }, { "legs", 2, 1 }, { "trip", 2, 2 } };
	double sum[3] = { 0 };
	long cnt[3] = { 0 };
	/* rounds of a tenth of a second per pattern, alternating, after a warm-up round */
	double end = now_us() + secs * 1e6;
	for (int round = 0; now_us() < end || round < 2; round++)
		for (int p = 0; p < 3; p++) {
			double stop = now_us() + 1e5;
			while (now_us() < stop) {
				double t = iteration(&ring, fd, pat[p].nfiles, pat[p].per, buf, off, size);
				if (t < 0)
					return 1;
				if (round > 0) {
					sum[p] += t;
					cnt[p]++;
				}
			}
		}
	double one = sum[0] / (double)cnt[0];
	for (int p = 0; p < 3; p++)
		printf("%s %.1f %.2f %ld\n", pat[p].name, sum[p] / (double)cnt[p], sum[p] / (double)cnt[p] / one, cnt[p]);
	io_uring_queue_exit(&ring);
	close(fd[0]);
	close(fd[1]);
	return 0;
}
