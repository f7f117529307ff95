/*
 * offload.h - calls that may block (on a backing store that stops
 * answering) run here, off the workers (offload.c).
 *
 * A worker must never wait on a backing store: every session on it would
 * wait too. What io_uring cannot carry (lseek for GET LBA STATUS) goes to
 * a small pool of threads instead; run(arg) runs on one of them, then
 * done(arg) on the worker that queued the job. The job lives in the
 * caller's memory (no allocation, offload_run cannot fail) until done
 * starts. When every pool thread is stuck, jobs queue: their commands
 * wait, the workers do not.
 *
 * Threading: offload_run on a worker thread; run on a pool thread; done on
 * that worker.
 */
#ifndef TC_COMMON_OFFLOAD_H
#define TC_COMMON_OFFLOAD_H

#include "common/worker.h"

#include <stdbool.h>

struct offload_job {
	struct offload_job *next;
	void (*run)(void *arg);
	void (*done)(void *arg);
	void *arg;
	struct worker *w;
	struct worker_call call;
};

/* Queue job: run(arg) on a pool thread, then done(arg) on this worker. */
void offload_run(struct offload_job *job, void (*run)(void *), void (*done)(void *), void *arg);

/* From workers_stop, before the workers go: a job that ends later is
 * dropped (its command never completes: the daemon is stopping). */
void offload_close(void);
/* Whether offload_close ran: a run that waited long looks before it
 * touches what its command points to. */
bool offload_closing(void);

#endif
