/*
 * worker.h - the daemon's threads: one event loop per core.
 *
 * Each worker thread owns an io_uring (its one wait point; an epoll set on
 * kernels without the ring's timed wait) and a queue of posted calls. Everything a connection does (PDU parsing, SCSI emulation, block
 * I/O submission and completion) runs on the one worker that owns it, so the
 * per-command path takes no lock: the thread is the lock.
 *
 * Threading contract, function by function:
 *  - workers_start/workers_stop: main thread only, once each.
 *  - worker_post: any thread; fn runs later on the target worker's thread.
 *    Wait-free enqueue (liburcu wfcqueue); it allocates one small node,
 *    so use it for control traffic, not per command.
 *  - worker_watch/rewatch/unwatch, worker_sqe, worker_tick_add/del:
 *    only on the worker's own thread.
 *  - io_op callbacks and tick callbacks run on the worker's thread.
 *
 * Submission is batched: SQEs taken with worker_sqe() are submitted to the
 * kernel once per loop iteration (or earlier if the ring fills up), and the
 * completions the kernel posted meanwhile (page-cache hits complete inside
 * the submit) are handled right after it, without another wait.
 *
 * Batch ends: work that gains from seeing the whole batch (a connection
 * writing every response of the iteration with one writev) queues a
 * struct worker_batch_end; its fn runs once after the iteration's events
 * and completions are handled and before the worker waits again.
 */
#ifndef TC_WORKER_H
#define TC_WORKER_H

#include <stdbool.h>
#include <stdint.h>
#include <urcu/wfcqueue.h>

struct io_uring_sqe;
struct worker;

/*
 * A file descriptor watched by a worker (epoll event bits; level-triggered
 * unless EPOLLET, which only the epoll wait supports). Zero-initialize it:
 * watch is the worker's, set while watched.
 */
struct ev_watch;
struct ev_handler {
	int fd;
	void (*on_event)(struct ev_handler *h, uint32_t epoll_events);
	struct ev_watch *watch;
};

/*
 * One asynchronous operation on the worker's io_uring. Embed it in the
 * request; io_uring_sqe_set_data(sqe, op) and done() is called on
 * completion with the CQE's res (bytes or -errno).
 */
struct io_op {
	void (*done)(struct io_op *op, int res);
};

/* A call queued with worker_at_batch_end (embed it; zero-initialize it). */
struct worker_batch_end {
	void (*fn)(struct worker_batch_end *b);
	struct worker_batch_end *next;
	bool queued;
};

/* A callback run about once a second on a worker (idle pings, timeouts). */
struct worker_tick {
	void (*fn)(struct worker_tick *t);
	struct worker_tick *prev, *next;
};

/* Start n worker threads (n = 0: one per online core, at most
 * WORKERS_MAX). 0 or -errno. */
#define WORKERS_MAX 256u
int workers_start(unsigned n);
/*
 * Any thread, any time: after events, a worker keeps asking for more
 * without sleeping for this long before it sleeps (0, the default: it
 * sleeps at once). Trades CPU for latency at low queue depth.
 */
void worker_set_poll_us(unsigned us);
/*
 * How the workers wait, once started: "io_uring" (one wait point: the
 * watched descriptors are polls in the ring) or "epoll" (kernels before
 * 5.11, or TIERCACHE_RING_WAIT=0 in the environment at start).
 */
const char *worker_wait_kind(void);
/* Stop all workers after their current iteration and join them. */
void workers_stop(void);
unsigned workers_count(void);
struct worker *worker_get(unsigned idx);
/* Next worker in round-robin order (any thread). */
struct worker *worker_next(void);
/* The calling thread's worker, or NULL when not on a worker thread. */
struct worker *worker_self(void);
unsigned worker_index(const struct worker *w);

/*
 * Register fn to run on every worker thread as it exits, after its loop
 * and its last posted calls: modules with per-thread free lists release
 * them there. Registering the same fn twice is a no-op. Any thread; a few
 * hooks at most (-ENOSPC past that).
 */
int worker_exit_hook(void (*fn)(void));

/* Run fn(arg) on w's thread. 0 or -ENOMEM. Any thread. */
int worker_post(struct worker *w, void (*fn)(void *arg), void *arg);
/*
 * The same for a call that must not be lost, from a thread that may wait
 * (never a worker: its loop would stop): tries again every 10 ms until
 * memory is found.
 */
void worker_post_wait(struct worker *w, void (*fn)(void *arg), void *arg);

/*
 * A posted call that needs no memory: embed one in the object the call is
 * about, and worker_post_call cannot fail. It carries one call at a time:
 * post it again only once fn has started. For what must not be lost when
 * memory runs out (a write waiting to be released on its own worker).
 */
struct worker_call {
	struct cds_wfcq_node node;
	void (*fn)(void *arg);
	void *arg;
	bool heap; /* worker_post's own: freed once fn returns */
};
void worker_post_call(struct worker *w, struct worker_call *c, void (*fn)(void *arg), void *arg);

/* Watch a descriptor on the calling worker (EPOLLIN/EPOLLOUT/...): a poll
 * in its ring, or its epoll set. Unwatch before closing the descriptor. */
int worker_watch(struct ev_handler *h, uint32_t events);
/*
 * The same for a descriptor whose file must close the moment the process
 * dies (a listening socket: the next daemon binds its port; a device file),
 * which a poll in the ring would keep open for a while after a kill -9:
 * it waits in the worker's epoll set, which the ring polls. Rewatch and
 * unwatch it as any other.
 */
int worker_watch_file(struct ev_handler *h, uint32_t events);
int worker_rewatch(struct ev_handler *h, uint32_t events);
void worker_unwatch(struct ev_handler *h);

/*
 * A free SQE on the calling worker's ring; never NULL (submits pending
 * entries to make room if needed). Worker thread only.
 */
struct io_uring_sqe *worker_sqe(void);
/* Submit pending SQEs now (normally the loop does it once per iteration). */
void worker_flush(void);

/*
 * free(p) once the calling worker has handled every event of its current
 * loop iteration: a handler that frees an object another event of the same
 * epoll batch points to (a connection closed by a completion) defers the
 * free so that event still finds readable memory (and a no-op handler the
 * owner left there). On a thread that is not a worker: free(p) now.
 */
void worker_defer_free(void *p);

/*
 * Run b->fn(b) once at the end of the current loop iteration (worker thread
 * only); queuing it again before it ran is a no-op. fn may queue it again:
 * it then runs in the next round (the worker does not sleep meanwhile).
 * The owner must keep b alive until fn ran.
 */
void worker_at_batch_end(struct worker_batch_end *b);

void worker_tick_add(struct worker_tick *t);
void worker_tick_del(struct worker_tick *t);

/* Milliseconds on CLOCK_MONOTONIC. */
uint64_t now_ms(void);
/* Microseconds on the same clock. */
uint64_t now_us(void);

#endif
