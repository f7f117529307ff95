/*
 * test_cache_ckpt_stop.c - a stop while a checkpoint is running ends.
 *
 * The final checkpoint of a stop, and the one after recovery, wait for a
 * running checkpoint to end. They used to post themselves to worker 0 again
 * until it did; worker 0 then ran only that post, round after round, never
 * reaping its io_uring ring, so the running checkpoint's writes never
 * completed and the stop hung (seen once in test_cache_destage_overwrite).
 * Here the legs are files (io_uring, unlike the RAM legs of the other
 * tests, whose completions are posts too), a thousand slots have changed
 * so the checkpoint writes many table pages, and the stop comes right after
 * a checkpoint was asked for: it must end, and the legs must then open
 * clean with every block as written.
 */
#include "bdev/file.h"
#include "cache/cache_int.h" /* cache_want_checkpoint */
#include "tests/unit/cache_test_util.h"

#include <pthread.h>

#define LEG_SIZE (80u << 20)
#define BACK_SIZE (64u << 20)
#define EXT (64u << 10)
#define NEXT 1000

static struct cache_set_cfg cfg = {
	.name = "ck", .nlegs = 2, .extent_size = EXT, .mode = CACHE_WRITE_BACK, .admit_hits = 1, .dirty_target = 90,
};

struct stop_arg {
	struct cache_set *cs;
	_Atomic bool done;
};

static void *stopper(void *p)
{
	struct stop_arg *a = p;
	cache_set_shutdown(a->cs);
	atomic_store(&a->done, true);
	return NULL;
}

static struct cache_set *open_files(const char *dir, struct bdev **vol, bool create)
{
	char err[512], p0[600], p1[600], pb[600];
	snprintf(p0, sizeof(p0), "%s/leg0.img", dir);
	snprintf(p1, sizeof(p1), "%s/leg1.img", dir);
	snprintf(pb, sizeof(pb), "%s/back.img", dir);
	struct bdev *legs[2] = { bdev_file_open(p0, LEG_SIZE, 512, create, err, sizeof(err)),
				 bdev_file_open(p1, LEG_SIZE, 512, create, err, sizeof(err)) };
	REQUIRE(legs[0] && legs[1], "legs: %s", err);
	struct bdev *back = bdev_file_open(pb, BACK_SIZE, 512, create, err, sizeof(err));
	REQUIRE(back, "backing: %s", err);
	struct cache_set *cs = cache_set_open_devs(&cfg, legs, err, sizeof(err));
	REQUIRE(cs, "open: %s", err);
	*vol = cache_vol_open(cs, "lun0", back, pb, CACHE_WRITE_BACK, err, sizeof(err));
	REQUIRE(*vol, "attach: %s", err);
	return cs;
}

int main(void)
{
	const char *tmp = getenv("TMPDIR");
	char dir[512];
	snprintf(dir, sizeof(dir), "%s/tc-ckpt-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	REQUIRE(mkdtemp(dir), "mkdtemp");
	REQUIRE(workers_start(2) == 0, "workers");
	struct bdev *vol;
	struct cache_set *cs = open_files(dir, &vol, true);
	uint8_t *buf = buf_get(4096);
	for (int i = 0; i < NEXT; i++) {
		memset(buf, (uint8_t)(i * 7 + 1), 4096);
		REQUIRE(tio_sync(vol, BDEV_WRITE, (uint64_t)i * EXT, buf, 4096, BDEV_F_FUA) == 0, "write %d", i);
	}
	for (int round = 0; round < 3; round++) {
		cache_want_checkpoint(cs);
		struct stop_arg a = { .cs = cs };
		pthread_t th;
		REQUIRE(pthread_create(&th, NULL, stopper, &a) == 0, "thread");
		for (int i = 0; i < 30000 && !atomic_load(&a.done); i++)
			usleep(1000);
		if (!atomic_load(&a.done)) {
			fprintf(stderr, "FAIL: the stop did not end within 30 s of a checkpoint request\n");
			_exit(1); /* worker 0 spins; nothing else can be done in this process */
		}
		pthread_join(th, NULL);
		bdev_close(vol);
		cache_set_close(cs);
		cs = open_files(dir, &vol, false);
		for (int i = 0; i < NEXT; i += 97) {
			REQUIRE(tio_sync(vol, BDEV_READ, (uint64_t)i * EXT, buf, 4096, 0) == 0, "read %d", i);
			REQUIRE(buf[0] == (uint8_t)(i * 7 + 1) && buf[4095] == (uint8_t)(i * 7 + 1),
				"extent %d reads %#x after the stop", i, buf[0]);
		}
		/* dirty the table again for the next round */
		for (int i = 0; i < NEXT; i++) {
			memset(buf, (uint8_t)(i * 7 + 1), 4096);
			REQUIRE(tio_sync(vol, BDEV_WRITE, (uint64_t)i * EXT + 4096, buf, 4096, BDEV_F_FUA) == 0, "rewrite");
		}
	}
	printf("ok: 3 stops right after a checkpoint request ended; the data reads back after each\n");
	buf_put(buf, 4096);
	cache_set_shutdown(cs);
	bdev_close(vol);
	cache_set_close(cs);
	workers_stop();
	char cmd[600];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	REQUIRE(system(cmd) == 0, "cleanup");
	return 0;
}
