/*
 * test_bdev_file_short.c - a short transfer on a file bdev is resumed and
 * completes exactly once, and no other request completes a second time.
 *
 * bdev/file.c resumes a short read or write by issuing the rest of the
 * range from its completion. That resumption submits its SQE at once (the
 * scratch iovec lives on the stack), so the SQE must be complete, with its
 * user_data, before that submit: otherwise the kernel sees whatever
 * user_data the ring slot held from an earlier request, completes that old
 * request a second time (its owner puts its context on a free list twice:
 * "double free detected in tcache"), and the resumed request never
 * completes.
 *
 * The ring is first cycled with more requests than it has slots, all using
 * one decoy request, so every slot holds the decoy's user_data. Then the
 * file is truncated behind the bdev's back and a read across the new end
 * gets a short transfer; its resumption at the end reads 0 bytes and is
 * zero-filled.
 */
#include "tests/unit/cache_test_util.h"
#include "bdev/file.h"

#include <fcntl.h>
#include <sys/stat.h>

#define FILE_SIZE (64u << 10)
#define PRIME 1100 /* more than the worker's ring has entries */

struct counted {
	struct bdev_req req;
	struct iovec iov;
	_Atomic int calls;
	int err;
};

static void counted_done(struct bdev_req *req, int err)
{
	struct counted *c = req->priv;
	c->err = err;
	atomic_fetch_add(&c->calls, 1);
}

static void counted_start(void *arg)
{
	struct counted *c = arg;
	bdev_submit(c->req.dev, &c->req);
}

static void counted_prep(struct counted *c, struct bdev *dev, enum bdev_op op, uint64_t off, void *buf,
			 uint64_t len)
{
	c->iov.iov_base = buf;
	c->iov.iov_len = len;
	c->req = (struct bdev_req){ .op = op, .offset = off, .len = len, .iov = &c->iov, .iovcnt = 1,
				    .done = counted_done, .priv = c, .dev = dev };
}

/* wait up to ms for c->calls to reach want */
static bool wait_calls(struct counted *c, int want, int ms)
{
	for (int i = 0; i < ms * 10; i++) {
		if (atomic_load(&c->calls) >= want)
			return true;
		usleep(100);
	}
	return atomic_load(&c->calls) >= want;
}

int main(void)
{
	char dir[] = "/tmp/tc-shortio-XXXXXX";
	REQUIRE(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
	char path[64];
	snprintf(path, sizeof(path), "%s/f.img", dir);

	REQUIRE(workers_start(1) == 0, "workers");
	char err[256] = "";
	struct bdev *dev = bdev_file_open(path, FILE_SIZE, 512, true, err, sizeof(err));
	REQUIRE(dev, "open: %s", err);

	uint8_t *buf = buf_get(FILE_SIZE);
	for (unsigned i = 0; i < FILE_SIZE; i++)
		buf[i] = (uint8_t)(i * 7 + 1);
	REQUIRE(tio_sync(dev, BDEV_WRITE, 0, buf, FILE_SIZE, BDEV_F_FUA) == 0, "write");

	/* every ring slot now carries the decoy's user_data */
	struct counted decoy;
	uint8_t *dbuf = buf_get(4096);
	for (int i = 0; i < PRIME; i++) {
		memset(&decoy, 0, sizeof(decoy));
		counted_prep(&decoy, dev, BDEV_READ, 0, dbuf, 4096);
		worker_post(worker_get(0), counted_start, &decoy);
		REQUIRE(wait_calls(&decoy, 1, 5000), "decoy read %d did not complete", i);
		REQUIRE(decoy.err == 0, "decoy read %d: %d", i, decoy.err);
	}

	/* shrink the file by half a 4K block behind the bdev's back */
	int fd = open(path, O_RDWR);
	REQUIRE(fd >= 0, "open %s: %s", path, strerror(errno));
	REQUIRE(ftruncate(fd, FILE_SIZE - 2048) == 0, "truncate: %s", strerror(errno));
	close(fd);

	struct counted sr;
	uint8_t *rbuf = buf_get(4096);
	memset(rbuf, 0xee, 4096);
	memset(&sr, 0, sizeof(sr));
	counted_prep(&sr, dev, BDEV_READ, FILE_SIZE - 4096, rbuf, 4096);
	int decoy_calls = atomic_load(&decoy.calls);
	worker_post(worker_get(0), counted_start, &sr);

	bool done = wait_calls(&sr, 1, 5000);
	usleep(100 * 1000); /* let a stray second completion show up */
	int extra = atomic_load(&decoy.calls) - decoy_calls;
	REQUIRE(extra == 0, "a finished request was completed %d more time(s) by the short read's resumption", extra);
	REQUIRE(done, "the short read never completed");
	REQUIRE(atomic_load(&sr.calls) == 1, "the short read completed %d times", atomic_load(&sr.calls));
	REQUIRE(sr.err == 0, "short read: %d", sr.err);
	for (unsigned i = 0; i < 4096; i++) {
		uint8_t want = i < 2048 ? (uint8_t)((FILE_SIZE - 4096 + i) * 7 + 1) : 0;
		REQUIRE(rbuf[i] == want, "byte %u of the short read: %#x, want %#x", i, rbuf[i], want);
	}

	workers_stop();
	bdev_close(dev);
	buf_put(buf, FILE_SIZE);
	buf_put(dbuf, 4096);
	buf_put(rbuf, 4096);
	unlink(path);
	rmdir(dir);
	printf("PASS short transfer resumed once, no stale completion\n");
	return 0;
}
