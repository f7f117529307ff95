/*
 * test_worker_stop.c - workers_stop while the workers are busy.
 *
 * A worker that is awake when workers_stop sets its stop flag can drain its
 * posts and leave before the stop's own wake-up post is queued; that post
 * was then never freed (LeakSanitizer in the ASan build of make check saw
 * it at the daemon's exit). Here the workers are kept busy with posts that
 * re-post themselves (to their own worker and to the other one) until the
 * stop, many times over: the ASan build of this test fails on any post
 * left unfreed.
 */
#include "common/worker.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define ROUNDS 300

static _Atomic bool stopping;
static _Atomic unsigned long ran;

/* re-posts itself, alternately to its own worker and to the other one */
static void spin(void *arg)
{
	uintptr_t n = (uintptr_t)arg;
	atomic_fetch_add(&ran, 1);
	if (!atomic_load(&stopping))
		worker_post(n % 2 ? worker_self() : worker_get((worker_self() == worker_get(0)) ? 1 : 0), spin,
			    (void *)(n + 1));
}

int main(void)
{
	for (int r = 0; r < ROUNDS; r++) {
		if (workers_start(2) < 0) {
			fprintf(stderr, "cannot start workers (io_uring unavailable?)\n");
			return 2;
		}
		atomic_store(&stopping, false);
		for (unsigned i = 0; i < 2; i++)
			worker_post(worker_get(i), spin, NULL);
		unsigned long before = atomic_load(&ran);
		while (atomic_load(&ran) < before + 50)
			usleep(10);
		atomic_store(&stopping, true);
		workers_stop();
	}
	printf("ok: %d rounds of workers_stop with busy workers, %lu posts ran\n", ROUNDS, atomic_load(&ran));
	return 0;
}
