/*
 * offload.c - the pool of threads for calls that may block (offload.h).
 *
 * OFFLOAD_THREADS threads, started by the first job, take jobs in order
 * from one queue under a mutex (jobs are rare: GET LBA STATUS, not reads
 * and writes). The threads are detached and never stopped: one may be
 * stuck in the kernel on a file that will not answer, and nothing could
 * join it; they hold no state that needs cleaning at exit. Once the
 * workers stop (offload_close), a job that ends is dropped, not posted.
 */
#include "common/offload.h"

#include "common/log.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#define OFFLOAD_THREADS 4

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static struct offload_job *head, *tail;
static int started;
static atomic_bool closing;

static void *pool_main(void *unused)
{
	(void)unused;
	for (;;) {
		pthread_mutex_lock(&lock);
		while (!head)
			pthread_cond_wait(&cond, &lock);
		struct offload_job *job = head;
		head = job->next;
		if (!head)
			tail = NULL;
		pthread_mutex_unlock(&lock);
		job->run(job->arg);
		pthread_mutex_lock(&lock); /* offload_close waits for a post in progress */
		if (!atomic_load(&closing))
			worker_post_call(job->w, &job->call, job->done, job->arg);
		pthread_mutex_unlock(&lock);
	}
	return NULL;
}

void offload_close(void)
{
	pthread_mutex_lock(&lock);
	atomic_store(&closing, true);
	pthread_mutex_unlock(&lock);
}

bool offload_closing(void)
{
	return atomic_load(&closing);
}

/* Start the pool (locked): how many threads run. */
static int start_threads(void)
{
	while (started < OFFLOAD_THREADS) {
		pthread_t t;
		pthread_attr_t a;
		pthread_attr_init(&a);
		pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
		int rc = pthread_create(&t, &a, pool_main, NULL);
		pthread_attr_destroy(&a);
		if (rc) {
			log_err("cannot start an offload thread (%d running): %s", started, strerror(rc));
			break;
		}
		pthread_setname_np(t, "tc-offload");
		started++;
	}
	return started;
}

void offload_run(struct offload_job *job, void (*run)(void *), void (*done)(void *), void *arg)
{
	job->next = NULL;
	job->run = run;
	job->done = done;
	job->arg = arg;
	job->w = worker_self();
	pthread_mutex_lock(&lock);
	if (!started && start_threads() == 0) {
		/* no thread at all: block this worker rather than lose the job */
		pthread_mutex_unlock(&lock);
		run(arg);
		worker_post_call(job->w, &job->call, done, arg);
		return;
	}
	if (tail)
		tail->next = job;
	else
		head = job;
	tail = job;
	pthread_cond_signal(&cond);
	pthread_mutex_unlock(&lock);
}
