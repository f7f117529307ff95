/*
 * worker.c - per-core event loops: epoll for sockets, io_uring for block I/O.
 *
 * The loop: wait (bounded so ticks run), dispatch ready handlers (sockets,
 * posted calls, block I/O completions), then until nothing is left:
 * submit every SQE queued during the iteration in one io_uring_submit,
 * handle the completions already posted (page-cache hits complete inside
 * the submit: no second wait, no eventfd round trip), and run the batch-end
 * calls (connections write their queued responses, one writev each).
 * Completions of block I/O are therefore processed on the same thread that
 * submitted them.
 *
 * The wait has one point, io_uring_enter (the ring wait). Each watched file
 * descriptor has a one-shot poll in the ring, armed again after its handler
 * ran (arming looks at the file's state, so a level-triggered socket a
 * handler did not drain completes it at once: epoll's level semantics).
 * A socket that becomes readable and a leg read that completes both end the
 * same sleep, the iteration's SQEs are submitted by the same call that
 * waits, and no epoll_wait is left on the command path. The ring runs its
 * completion work cooperatively (IORING_SETUP_COOP_TASKRUN, Linux 5.19): a
 * completion wakes a sleeping worker but does not interrupt a running one,
 * whose next entry to the kernel picks it up (IORING_SQ_TASKRUN says so).
 *
 * A polled file stays open until the ring lets go of its poll, which
 * after a kill -9 is some milliseconds after the process is gone: a
 * listening socket would still accept connections, and bind() by the next
 * daemon fail, meanwhile. So descriptors that must close with the process
 * (listening sockets, device files: worker_watch_file) stay in the
 * worker's epoll set, which holds no reference to them, and the ring polls
 * that set.
 *
 * The older loop is kept for kernels without the ring's timed wait (5.11)
 * and where TIERCACHE_RING_WAIT=0 asks for it: epoll_wait is the wait, and
 * completions reach it through an eventfd registered with the ring, watched
 * edge-triggered and never read (the kernel wakes epoll on every signal,
 * and the completion queue itself says what is there, so reading the
 * counter would be one syscall for nothing).
 */
#include "common/worker.h"

#include "common/bufpool.h"
#include "common/log.h"
#include "common/offload.h"

#include <errno.h>
#include <liburing.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>
#include <urcu.h>
#include <urcu/wfcqueue.h>

#define RING_ENTRIES 1024
#define MAX_EVENTS 128
#define BATCH_ROUNDS 8 /* submit / complete / batch-end rounds per iteration */

struct worker {
	unsigned idx;
	pthread_t thread;
	int epfd;
	struct io_uring ring;
	unsigned sq_pending;
	unsigned inflight;         /* SQEs taken whose CQE is not reaped yet */
	struct ev_handler ring_ev; /* eventfd signalled by io_uring completions (epoll wait) */
	struct ev_watch *watches;  /* ring wait: every watch slot not freed yet */
	struct io_op epoll_op;     /* ring wait: the poll of epfd (worker_watch_file's descriptors) */
	struct ev_handler post_ev; /* eventfd signalled by worker_post */
	struct cds_wfcq_head post_head;
	struct cds_wfcq_tail post_tail;
	struct worker_tick ticks; /* list head */
	struct worker_batch_end *batch_head, *batch_tail; /* worker_at_batch_end */
	void **deferred;          /* worker_defer_free, freed after each iteration */
	unsigned ndeferred, deferred_cap;
	uint64_t next_tick_ms;
	uint64_t last_event_ns;   /* when epoll last returned events (the poll budget's start) */
	atomic_bool stop;
};

#define MAX_EXIT_HOOKS 8

static struct worker *workers;
static pthread_mutex_t hooks_lock = PTHREAD_MUTEX_INITIALIZER;
static void (*exit_hooks[MAX_EXIT_HOOKS])(void);
static unsigned nexit_hooks;
static unsigned nworkers;
static atomic_uint rr_next;
static __thread struct worker *self;
static _Atomic uint64_t poll_ns; /* worker_set_poll_us */
static bool ring_wait;           /* one wait point, in io_uring_enter */
static struct ev_watch *const IN_EPOLL = (struct ev_watch *)&ring_wait; /* h->watch of a file in epfd */

/*
 * Ring wait: the watch of one file descriptor. Owned by the worker, not by
 * the handler, so that a poll completing after worker_unwatch (its handler
 * may be freed by then) finds memory that is still ours: the slot is freed
 * only once no poll of it is in flight.
 */
struct ev_watch {
	struct io_op op;        /* the poll's user_data */
	struct ev_handler *h;   /* NULL once unwatched */
	uint32_t events;        /* what the handler asked for */
	uint32_t armed_mask;    /* what the poll in flight waits for */
	bool armed;             /* a poll is in flight */
	bool removing;          /* a POLL_REMOVE of it is queued or in flight */
	bool dispatching;       /* its handler runs: unwatch must not free it */
	struct ev_watch *prev, *next; /* worker->watches */
};

uint64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t now_us(void)
{
	return now_ns() / 1000;
}

void worker_set_poll_us(unsigned us)
{
	atomic_store_explicit(&poll_ns, (uint64_t)us * 1000, memory_order_relaxed);
}

/*
 * The loop's one wait. With a poll budget, a worker that had events less
 * than the budget ago asks epoll without sleeping until some come or the
 * budget since the last ones runs out, and only then sleeps: at low queue
 * depth the next command or the leg's completion usually comes within
 * tens of microseconds, and a sleep and a wakeup cost about as much again
 * (the scheduler's switch, the wakeup's IPI). An idle worker stops
 * polling after one budget, so it costs nothing when nothing happens. Only
 * with at most POLL_MAX_INFLIGHT ring operations in flight (a QD1 write-back
 * write has four: data and record on two legs): deeper, events come often
 * enough without it, and polling only splits the batches they would have
 * formed (4K write-back at QD32 lost 20% of its IOPS to that).
 */
#define POLL_MAX_INFLIGHT 4

static int worker_wait_epoll(struct worker *w, struct epoll_event *evs, int timeout)
{
	uint64_t budget = atomic_load_explicit(&poll_ns, memory_order_relaxed);
	int n;
	if (budget && timeout && w->inflight <= POLL_MAX_INFLIGHT) {
		for (uint64_t t = now_ns(); t - w->last_event_ns < budget; t = now_ns()) {
			n = epoll_wait(w->epfd, evs, MAX_EVENTS, 0);
			if (n > 0)
				w->last_event_ns = t;
			if (n != 0)
				return n;
		}
	}
	n = epoll_wait(w->epfd, evs, MAX_EVENTS, timeout);
	if (n > 0 && budget)
		w->last_event_ns = now_ns();
	return n;
}

const char *worker_wait_kind(void)
{
	return ring_wait ? "io_uring" : "epoll";
}

/* Completions posted, or completion work the kernel holds for our next entry. */
static bool ring_has_work(struct worker *w)
{
	return io_uring_cq_ready(&w->ring) ||
	       (IO_URING_READ_ONCE(*w->ring.sq.kflags) & IORING_SQ_TASKRUN);
}

static unsigned reap(struct worker *w);

/*
 * The ring wait: submit what the iteration queued and sleep until a
 * completion (block I/O, or a watched descriptor's poll) or the timeout,
 * in one io_uring_enter; then handle the completions, which runs the
 * handlers of ready descriptors. Same poll budget as the epoll wait.
 */
static int worker_wait_ring(struct worker *w, int timeout)
{
	uint64_t budget = atomic_load_explicit(&poll_ns, memory_order_relaxed);
	struct io_uring_cqe *cqe;

	if (budget && timeout && w->inflight <= POLL_MAX_INFLIGHT) {
		worker_flush();
		for (uint64_t t = now_ns(); t - w->last_event_ns < budget; t = now_ns())
			if (ring_has_work(w)) {
				timeout = 0;
				break;
			}
	}
	if (timeout) {
		struct __kernel_timespec ts = {
			.tv_sec = timeout / 1000, .tv_nsec = (long long)(timeout % 1000) * 1000000,
		};
		int r = io_uring_submit_and_wait_timeout(&w->ring, &cqe, 1, &ts, NULL);
		if (r < 0 && r != -ETIME && r != -EINTR)
			log_err("io_uring wait failed: %s", strerror(-r));
		w->sq_pending = 0;
	} else {
		worker_flush();
	}
	if (reap(w) && budget)
		w->last_event_ns = now_ns();
	return 0;
}

static int worker_wait(struct worker *w, struct epoll_event *evs, int timeout)
{
	return ring_wait ? worker_wait_ring(w, timeout) : worker_wait_epoll(w, evs, timeout);
}

unsigned workers_count(void) { return nworkers; }
struct worker *worker_get(unsigned idx) { return idx < nworkers ? &workers[idx] : NULL; }
struct worker *worker_self(void) { return self; }
unsigned worker_index(const struct worker *w) { return w->idx; }

struct worker *worker_next(void)
{
	return &workers[atomic_fetch_add(&rr_next, 1) % nworkers];
}

static void drain_eventfd(int fd)
{
	uint64_t v;
	ssize_t r = read(fd, &v, sizeof(v));
	(void)r;
}

static void on_watch_cqe(struct io_op *op, int res);
static void on_epoll_cqe(struct io_op *op, int res);
/* The user_data of POLL_REMOVEs: their own CQE means nothing (the poll's says it all). */
static void poll_remove_done(struct io_op *op, int res) { (void)op; (void)res; }
static struct io_op poll_remove_op = { .done = poll_remove_done };

/* Handle every completion posted so far; how many there were. */
static unsigned reap(struct worker *w)
{
	struct io_uring_cqe *cqe;
	unsigned n = 0;

	while (io_uring_peek_cqe(&w->ring, &cqe) == 0) {
		struct io_op *op = io_uring_cqe_get_data(cqe);
		int res = cqe->res;
		/* Release the slot before the callback, which may submit more. */
		io_uring_cqe_seen(&w->ring, cqe);
		if (!op || (op->done != on_watch_cqe && op != &poll_remove_op && op->done != on_epoll_cqe))
			w->inflight--;
		n++;
		if (op)
			op->done(op, res);
	}
	return n;
}

/* Edge-triggered: the counter is never read (see the top of the file). */
static void on_ring_event(struct ev_handler *h, uint32_t events)
{
	(void)events;
	reap((struct worker *)((char *)h - offsetof(struct worker, ring_ev)));
}

void worker_at_batch_end(struct worker_batch_end *b)
{
	struct worker *w = self;

	if (b->queued)
		return;
	b->queued = true;
	b->next = NULL;
	if (w->batch_tail)
		w->batch_tail->next = b;
	else
		w->batch_head = b;
	w->batch_tail = b;
}

/* Run the calls queued so far; those they queue wait for the next round. */
static void run_batch_end(struct worker *w)
{
	struct worker_batch_end *b = w->batch_head;

	w->batch_head = w->batch_tail = NULL;
	while (b) {
		struct worker_batch_end *next = b->next;
		b->queued = false;
		b->fn(b);
		b = next;
	}
}

/* Submit, handle what completed, let connections write: until quiet. */
static void finish_iteration(struct worker *w)
{
	if (ring_wait) {
		/*
		 * The wait submits: what completes inline (page-cache hits)
		 * completes in it and ends it at once, and what does not is
		 * waited for in the same system call.
		 */
		for (int round = 0; round < BATCH_ROUNDS && w->batch_head; round++) {
			run_batch_end(w);
			reap(w);
		}
		return;
	}
	for (int round = 0; round < BATCH_ROUNDS; round++) {
		worker_flush();
		reap(w);
		if (!w->batch_head)
			break;
		run_batch_end(w);
	}
	worker_flush();
}

static void run_posts(struct worker *w)
{
	struct cds_wfcq_node *node;

	while ((node = __cds_wfcq_dequeue_blocking(&w->post_head, &w->post_tail)) != NULL) {
		struct worker_call *c = caa_container_of(node, struct worker_call, node);
		bool heap = c->heap; /* an embedded call may be reused or freed by fn */
		c->fn(c->arg);
		if (heap)
			free(c);
	}
}

static void on_post_event(struct ev_handler *h, uint32_t events)
{
	struct worker *w = (struct worker *)((char *)h - offsetof(struct worker, post_ev));
	(void)events;
	drain_eventfd(h->fd);
	run_posts(w);
}

int worker_exit_hook(void (*fn)(void))
{
	int r = 0;
	pthread_mutex_lock(&hooks_lock);
	for (unsigned i = 0; i < nexit_hooks; i++)
		if (exit_hooks[i] == fn)
			goto out;
	if (nexit_hooks == MAX_EXIT_HOOKS)
		r = -ENOSPC;
	else
		exit_hooks[nexit_hooks++] = fn;
out:
	pthread_mutex_unlock(&hooks_lock);
	return r;
}

static void run_exit_hooks(void)
{
	pthread_mutex_lock(&hooks_lock);
	unsigned n = nexit_hooks;
	void (*hooks[MAX_EXIT_HOOKS])(void);
	memcpy(hooks, exit_hooks, sizeof(hooks));
	pthread_mutex_unlock(&hooks_lock);
	for (unsigned i = 0; i < n; i++)
		hooks[i]();
	buf_thread_release();
}

static void post_enqueue(struct worker *w, struct worker_call *c, void (*fn)(void *arg), void *arg)
{
	uint64_t one = 1;
	cds_wfcq_node_init(&c->node);
	c->fn = fn;
	c->arg = arg;
	cds_wfcq_enqueue(&w->post_head, &w->post_tail, &c->node);
	ssize_t r = write(w->post_ev.fd, &one, sizeof(one));
	(void)r;
}

int worker_post(struct worker *w, void (*fn)(void *arg), void *arg)
{
	struct worker_call *c = malloc(sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->heap = true;
	post_enqueue(w, c, fn, arg);
	return 0;
}

void worker_post_wait(struct worker *w, void (*fn)(void *arg), void *arg)
{
	while (worker_post(w, fn, arg) < 0) {
		struct timespec ts = { 0, 10 * 1000000L };
		nanosleep(&ts, NULL);
	}
}

void worker_post_call(struct worker *w, struct worker_call *c, void (*fn)(void *arg), void *arg)
{
	c->heap = false;
	post_enqueue(w, c, fn, arg);
}

/* An SQE that is not an operation in flight (a poll, a poll's removal). */
static struct io_uring_sqe *ring_ctl_sqe(struct worker *w)
{
	struct io_uring_sqe *sqe = worker_sqe();
	w->inflight--;
	return sqe;
}

static void watch_arm(struct worker *w, struct ev_watch *s)
{
	struct io_uring_sqe *sqe = ring_ctl_sqe(w);
	io_uring_prep_poll_add(sqe, s->h->fd, s->events);
	io_uring_sqe_set_data(sqe, &s->op);
	s->armed = true;
	s->armed_mask = s->events;
}

static void watch_remove(struct worker *w, struct ev_watch *s)
{
	if (s->removing)
		return;
	struct io_uring_sqe *sqe = ring_ctl_sqe(w);
	io_uring_prep_poll_remove(sqe, (uint64_t)(uintptr_t)&s->op);
	io_uring_sqe_set_data(sqe, &poll_remove_op);
	s->removing = true;
}

static void watch_free(struct worker *w, struct ev_watch *s)
{
	if (s->prev)
		s->prev->next = s->next;
	else
		w->watches = s->next;
	if (s->next)
		s->next->prev = s->prev;
	free(s);
}

/*
 * A watched descriptor's poll ended: run its handler with what is ready
 * (of what it asks for now), then arm the poll again unless it was
 * unwatched meanwhile. -ECANCELED is our own removal (a rewatch widening
 * the mask): arm again with the new mask.
 */
static void on_watch_cqe(struct io_op *op, int res)
{
	struct ev_watch *s = (struct ev_watch *)((char *)op - offsetof(struct ev_watch, op));
	struct worker *w = self;

	s->armed = false;
	s->removing = false;
	if (!s->h) {
		watch_free(w, s);
		return;
	}
	uint32_t ev;
	if (res == -ECANCELED) {
		ev = 0;
	} else if (res < 0) {
		log_err("worker %u: cannot poll fd %d: %s", w->idx, s->h->fd, strerror(-res));
		ev = EPOLLERR; /* the handler stops watching it; not armed again */
	} else {
		ev = (uint32_t)res & (s->events | EPOLLERR | EPOLLHUP);
	}
	if (ev) {
		s->dispatching = true;
		s->h->on_event(s->h, ev);
		s->dispatching = false;
		if (!s->h) {
			watch_free(w, s);
			return;
		}
	}
	if (res > 0 && (res & EPOLLRDHUP) && !(s->events & EPOLLRDHUP)) {
		/*
		 * The ring's polls always report EPOLLRDHUP, epoll only when asked:
		 * once the peer has shut down its side, a poll armed again would
		 * complete at once, for ever, on a socket the handler is not
		 * reading (a connection draining or held back by its transmit
		 * queue). Such a descriptor goes on in the epoll set, with
		 * epoll's exact semantics.
		 */
		struct epoll_event e = { .events = s->events, .data.ptr = s->h };
		if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, s->h->fd, &e) == 0) {
			s->h->watch = IN_EPOLL;
			watch_free(w, s);
			return;
		}
	}
	if (res >= 0 || res == -ECANCELED)
		watch_arm(w, s);
}

/*
 * Ring wait: the epoll set of worker_watch_file's descriptors became
 * readable. Handle what it has (its handlers run here, as the others run
 * in reap) and arm its poll again: arming looks at the set's ready list,
 * where level-triggered descriptors still ready are put back.
 */
static void epoll_arm(struct worker *w)
{
	struct io_uring_sqe *sqe = ring_ctl_sqe(w);
	io_uring_prep_poll_add(sqe, w->epfd, POLLIN);
	io_uring_sqe_set_data(sqe, &w->epoll_op);
}

static void on_epoll_cqe(struct io_op *op, int res)
{
	struct worker *w = (struct worker *)((char *)op - offsetof(struct worker, epoll_op));
	struct epoll_event evs[MAX_EVENTS];
	if (res == -ECANCELED)
		return; /* the ring is going away */
	int n = epoll_wait(w->epfd, evs, MAX_EVENTS, 0);
	for (int i = 0; i < n; i++) {
		struct ev_handler *h = evs[i].data.ptr;
		h->on_event(h, evs[i].events);
	}
	epoll_arm(w);
}

int worker_watch_file(struct ev_handler *h, uint32_t events)
{
	struct epoll_event ev = { .events = events, .data.ptr = h };
	if (epoll_ctl(self->epfd, EPOLL_CTL_ADD, h->fd, &ev))
		return -errno;
	if (ring_wait)
		h->watch = IN_EPOLL;
	return 0;
}

int worker_watch(struct ev_handler *h, uint32_t events)
{
	if (!ring_wait) {
		struct epoll_event ev = { .events = events, .data.ptr = h };
		return epoll_ctl(self->epfd, EPOLL_CTL_ADD, h->fd, &ev) ? -errno : 0;
	}
	if (h->watch)
		return -EEXIST;
	struct ev_watch *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	struct worker *w = self;
	s->op.done = on_watch_cqe;
	s->h = h;
	s->events = events;
	s->next = w->watches;
	if (s->next)
		s->next->prev = s;
	w->watches = s;
	h->watch = s;
	watch_arm(w, s);
	return 0;
}

int worker_rewatch(struct ev_handler *h, uint32_t events)
{
	if (!ring_wait) {
		struct epoll_event ev = { .events = events, .data.ptr = h };
		return epoll_ctl(self->epfd, EPOLL_CTL_MOD, h->fd, &ev) ? -errno : 0;
	}
	struct ev_watch *s = h->watch;
	if (!s)
		return -ENOENT;
	if (s == IN_EPOLL) {
		struct epoll_event ev = { .events = events, .data.ptr = h };
		return epoll_ctl(self->epfd, EPOLL_CTL_MOD, h->fd, &ev) ? -errno : 0;
	}
	s->events = events;
	/* narrower: the poll in flight stays, what it reports is filtered */
	if (s->armed && (events & ~s->armed_mask))
		watch_remove(self, s);
	return 0;
}

void worker_unwatch(struct ev_handler *h)
{
	if (!ring_wait) {
		epoll_ctl(self->epfd, EPOLL_CTL_DEL, h->fd, NULL);
		return;
	}
	struct ev_watch *s = h->watch;
	if (!s)
		return;
	h->watch = NULL;
	if (s == IN_EPOLL) {
		epoll_ctl(self->epfd, EPOLL_CTL_DEL, h->fd, NULL);
		return;
	}
	s->h = NULL;
	if (s->armed)
		watch_remove(self, s); /* freed when the poll's CQE comes */
	else if (!s->dispatching)
		watch_free(self, s);
}

void worker_flush(void)
{
	struct worker *w = self;
	if (w->sq_pending) {
		int r = io_uring_submit(&w->ring);
		if (r < 0)
			log_err("io_uring_submit failed: %s", strerror(-r));
		w->sq_pending = 0;
	}
}

struct io_uring_sqe *worker_sqe(void)
{
	struct worker *w = self;
	struct io_uring_sqe *sqe;

	while ((sqe = io_uring_get_sqe(&w->ring)) == NULL) {
		w->sq_pending = 1;
		worker_flush();
	}
	w->sq_pending++;
	w->inflight++;
	return sqe;
}

void worker_defer_free(void *p)
{
	struct worker *w = self;

	if (!p)
		return;
	if (!w) {
		free(p);
		return;
	}
	if (w->ndeferred == w->deferred_cap) {
		unsigned cap = w->deferred_cap ? w->deferred_cap * 2 : 16;
		void **v = realloc(w->deferred, sizeof(*v) * cap);
		if (!v) {
			/* cannot defer: leak rather than free under a pending event */
			log_err("worker %u: out of memory deferring a free; leaking %p", w->idx, p);
			return;
		}
		w->deferred = v;
		w->deferred_cap = cap;
	}
	w->deferred[w->ndeferred++] = p;
}

static void run_deferred(struct worker *w)
{
	for (unsigned i = 0; i < w->ndeferred; i++)
		free(w->deferred[i]);
	w->ndeferred = 0;
}

void worker_tick_add(struct worker_tick *t)
{
	struct worker_tick *head = &self->ticks;
	t->next = head->next;
	t->prev = head;
	head->next->prev = t;
	head->next = t;
}

void worker_tick_del(struct worker_tick *t)
{
	if (!t->next)
		return;
	t->prev->next = t->next;
	t->next->prev = t->prev;
	t->next = t->prev = NULL;
}

static void run_ticks(struct worker *w)
{
	struct worker_tick *t = w->ticks.next, *next;
	for (; t != &w->ticks; t = next) {
		next = t->next; /* the tick may delete itself */
		t->fn(t);
	}
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	struct epoll_event evs[MAX_EVENTS];
	char name[16];

	self = w;
	/* The cache map is read under rcu_read_lock on this thread. */
	rcu_register_thread();
	snprintf(name, sizeof(name), "tc-worker%u", w->idx);
	pthread_setname_np(pthread_self(), name);
	if (!ring_wait)
		worker_watch(&w->ring_ev, EPOLLIN | EPOLLET);
	else
		epoll_arm(w);
	worker_watch(&w->post_ev, EPOLLIN);
	w->next_tick_ms = now_ms() + 1000;

	while (!atomic_load(&w->stop)) {
		uint64_t now = now_ms();
		int timeout = w->next_tick_ms > now ? (int)(w->next_tick_ms - now) : 0;
		if (w->batch_head)
			timeout = 0; /* batch-end work left over from the last rounds */
		int n = worker_wait(w, evs, timeout);
		for (int i = 0; i < n; i++) {
			struct ev_handler *h = evs[i].data.ptr;
			h->on_event(h, evs[i].events);
		}
		now = now_ms();
		if (now >= w->next_tick_ms) {
			w->next_tick_ms = now + 1000;
			run_ticks(w);
		}
		finish_iteration(w);
		run_deferred(w);
	}
	run_posts(w);
	if (ring_wait) { /* finish_iteration leaves submitting and reaping to the wait */
		worker_flush();
		reap(w);
	}
	finish_iteration(w);
	for (int i = 0; i < 64 && w->batch_head; i++)
		run_batch_end(w);
	worker_flush();
	run_exit_hooks();
	run_deferred(w);
	free(w->deferred);
	w->deferred = NULL;
	w->deferred_cap = 0;
	rcu_unregister_thread();
	return NULL;
}

static int worker_init(struct worker *w, unsigned idx)
{
	struct io_uring_params p;
	int r;

	memset(w, 0, sizeof(*w));
	w->idx = idx;
	w->ticks.next = w->ticks.prev = &w->ticks;
	cds_wfcq_init(&w->post_head, &w->post_tail);
	w->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (w->epfd < 0)
		return -errno;
	memset(&p, 0, sizeof(p));
	if (ring_wait)
		p.flags = IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG;
	r = io_uring_queue_init_params(RING_ENTRIES, &w->ring, &p);
	if (r == -EINVAL && p.flags) { /* before 5.19: completions interrupt the worker */
		memset(&p, 0, sizeof(p));
		r = io_uring_queue_init_params(RING_ENTRIES, &w->ring, &p);
	}
	if (r < 0) {
		log_err("io_uring setup failed (%s); tiercached needs Linux 5.6 or newer "
			"with io_uring enabled (sysctl kernel.io_uring_disabled=0)", strerror(-r));
		return r;
	}
	w->epoll_op.done = on_epoll_cqe;
	w->ring_ev.fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	w->ring_ev.on_event = on_ring_event;
	w->post_ev.fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	w->post_ev.on_event = on_post_event;
	if (w->ring_ev.fd < 0 || w->post_ev.fd < 0)
		return -errno;
	/* the ring wait passes its timeout to io_uring_enter (Linux 5.11) */
	if (!(w->ring.features & IORING_FEAT_EXT_ARG))
		ring_wait = false;
	return 0;
}

/* TIERCACHE_RING_WAIT=0 in the environment: the epoll wait, as on old kernels. */
static bool ring_wait_wanted(void)
{
	const char *e = getenv("TIERCACHE_RING_WAIT");
	return !e || strcmp(e, "0") != 0;
}

int workers_start(unsigned n)
{
	if (n == 0) {
		long c = sysconf(_SC_NPROCESSORS_ONLN);
		n = c > 0 ? (unsigned)c : 1;
	}
	if (n > WORKERS_MAX)
		n = WORKERS_MAX; /* per-LU tables are sized for it (backstore/sbc.c) */
	workers = calloc(n, sizeof(*workers));
	if (!workers)
		return -ENOMEM;
	ring_wait = ring_wait_wanted();
	for (unsigned i = 0; i < n; i++) {
		int r = worker_init(&workers[i], i);
		if (r < 0)
			return r;
	}
	for (unsigned i = 0; i < n && !ring_wait; i++) {
		int r = io_uring_register_eventfd(&workers[i].ring, workers[i].ring_ev.fd);
		if (r < 0)
			return r;
	}
	log_info("%u workers, waiting in %s", n,
		 ring_wait ? "io_uring (one wait point)" : "epoll (completions through an eventfd)");
	nworkers = n;
	for (unsigned i = 0; i < n; i++) {
		int r = pthread_create(&workers[i].thread, NULL, worker_main, &workers[i]);
		if (r)
			return -r;
	}
	return 0;
}

static void wake(void *arg) { (void)arg; }

void workers_stop(void)
{
	offload_close(); /* no job completion may reach a worker from now on */
	for (unsigned i = 0; i < nworkers; i++) {
		atomic_store(&workers[i].stop, true);
		worker_post(&workers[i], wake, NULL);
	}
	/* all of them first: a worker still running may post to one that stopped */
	for (unsigned i = 0; i < nworkers; i++)
		pthread_join(workers[i].thread, NULL);
	for (unsigned i = 0; i < nworkers; i++) {
		/*
		 * The worker may have seen stop and drained its posts before our
		 * wake-up was queued: free what is left (the wake-up, or a post
		 * that came too late to run on this worker).
		 */
		struct cds_wfcq_node *node;
		while ((node = __cds_wfcq_dequeue_blocking(&workers[i].post_head, &workers[i].post_tail))) {
			struct worker_call *c = caa_container_of(node, struct worker_call, node);
			if (c->fn != wake)
				log_warn("worker %u: a post arrived after the worker stopped; dropped", i);
			if (c->heap)
				free(c);
		}
		io_uring_queue_exit(&workers[i].ring);
		while (workers[i].watches)
			watch_free(&workers[i], workers[i].watches);
		close(workers[i].epfd);
		close(workers[i].ring_ev.fd);
		close(workers[i].post_ev.fd);
	}
	free(workers);
	workers = NULL;
	nworkers = 0;
}
