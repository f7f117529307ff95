/*
 * test_worker_post_nomem.c - a call posted with worker_post_call reaches
 * its worker when there is no memory at all.
 *
 * mirror_persisted releases writes that waited for a failed leg to be
 * recorded, each on its own worker. It used worker_post, which allocates:
 * without memory the release was dropped after a log line and the write
 * never completed. Here every malloc of the posting thread fails (the test
 * links with --wrap=malloc): worker_post says -ENOMEM, and worker_post_call,
 * with the call embedded in the caller's object, still runs fn on the
 * worker it was posted to, and again when fn posts the same call on.
 */
#include "common/worker.h"
#include "tests/unit/check.h"

#include <errno.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

void *__real_malloc(size_t size);
void *__wrap_malloc(size_t size);

static __thread bool no_memory; /* every malloc of this thread fails */

void *__wrap_malloc(size_t size)
{
	return no_memory ? NULL : __real_malloc(size);
}

#define HOPS 100

struct relay {
	struct worker_call call;
	int hops;
	struct worker *ran_on[HOPS];
	sem_t done;
};

static void not_run(void *arg) { (void)arg; }

/* on a worker: note where it ran, post the same call on to the other worker */
static void hop(void *arg)
{
	struct relay *r = arg;
	r->ran_on[r->hops++] = worker_self();
	if (r->hops == HOPS) {
		sem_post(&r->done);
		return;
	}
	no_memory = true;
	struct worker *next = worker_self() == worker_get(0) ? worker_get(1) : worker_get(0);
	worker_post_call(next, &r->call, hop, r);
	no_memory = false;
}

struct start {
	struct worker_call call;
	struct relay *r;
	int plain_rc; /* worker_post with no memory */
};

/* on worker 0, with no memory: worker_post fails, worker_post_call does not */
static void start(void *arg)
{
	struct start *s = arg;
	no_memory = true;
	s->plain_rc = worker_post(worker_get(1), not_run, NULL);
	worker_post_call(worker_get(1), &s->r->call, hop, s->r);
	no_memory = false;
}

int main(void)
{
	if (workers_start(2) < 0) {
		fprintf(stderr, "cannot start workers (io_uring unavailable?)\n");
		return 2;
	}
	struct relay r = { .hops = 0 };
	struct start s = { .r = &r, .plain_rc = 1 };
	sem_init(&r.done, 0, 0);
	worker_post_call(worker_get(0), &s.call, start, &s);
	bool done = sem_wait_secs(&r.done, 30);
	CHECK(done, "the embedded call went round %d times without memory (got %d)", HOPS, r.hops);
	CHECK(s.plain_rc == -ENOMEM, "worker_post without memory says -ENOMEM (got %d)", s.plain_rc);
	bool alternated = done;
	for (int i = 0; done && i < HOPS; i++)
		alternated &= r.ran_on[i] == worker_get(i % 2 ? 0 : 1);
	CHECK(alternated, "each hop ran on the worker it was posted to");
	workers_stop();
	printf("%s\n", check_failures ? "FAILED" : "all passed");
	return check_failures ? 1 : 0;
}
