/*
 * test_worker_watch.c - watched descriptors behave alike in both waits.
 *
 * A worker waits either in io_uring (each watched descriptor is a one-shot
 * poll in the ring, armed again after its handler) or in epoll (older
 * kernels, TIERCACHE_RING_WAIT=0). Handlers are written for epoll's level
 * semantics; each case below runs under both waits and fails when the ring
 * wait departs from them:
 *   level     a handler that reads one byte per event is called until the
 *             socket is drained (a poll not armed again would stall);
 *   widen     rewatch adding EPOLLOUT to a poll waiting for EPOLLIN alone
 *             delivers EPOLLOUT (a poll left with its old mask would not);
 *   narrow    rewatch dropping EPOLLOUT while a poll for both is in flight
 *             delivers no EPOLLOUT afterwards;
 *   unwatch   a handler that unwatches, closes and frees itself, and one
 *             that frees another handler whose event is already collected,
 *             and an unwatch from a posted call with a poll in flight:
 *             nothing touches the freed handler (the ASan build checks)
 *             and no watch is left behind (LeakSanitizer at the end).
 *   rdhup     a socket watched for nothing (a connection not reading) whose
 *             peer shuts down its side: the worker stays idle (the ring's
 *             polls report EPOLLRDHUP, which epoll does only when asked, so
 *             a poll armed again would complete for ever), and a later
 *             rewatch for EPOLLIN sees the end of the stream.
 * Each case runs twice per wait: with worker_watch, and with
 * worker_watch_file (under the ring wait, the epoll set the ring polls).
 * Every wait is for a condition, with a 10 s limit.
 */
#include "common/worker.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static int failures;

#define CHECK(cond, ...)                                                                           \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                       \
			fprintf(stderr, __VA_ARGS__);                                              \
			fprintf(stderr, "\n");                                                     \
			failures++;                                                                \
		}                                                                                  \
	} while (0)

struct probe {
	struct ev_handler ev;
	int peer;
	atomic_uint in_calls, out_calls, bytes;
	atomic_uint out_since_narrow;
	atomic_bool narrowed;
	atomic_bool gone;           /* unwatched, closed and freed by its handler */
	struct probe *victim;       /* freed by this one's handler */
	bool free_self;             /* the handler unwatches, closes and frees us */
	bool defer;                 /* free through worker_defer_free (epoll's rule) */
};

static atomic_uint gone_count;

static void on_probe(struct ev_handler *h, uint32_t events)
{
	struct probe *p = (struct probe *)h;
	if (events & EPOLLOUT) {
		atomic_fetch_add(&p->out_calls, 1);
		if (atomic_load(&p->narrowed))
			atomic_fetch_add(&p->out_since_narrow, 1);
	}
	if (!(events & EPOLLIN))
		return;
	atomic_fetch_add(&p->in_calls, 1);
	char c;
	if (read(p->ev.fd, &c, 1) == 1)
		atomic_fetch_add(&p->bytes, 1);
	if (p->victim) {
		struct probe *v = p->victim;
		p->victim = NULL;
		worker_unwatch(&v->ev);
		close(v->ev.fd);
		close(v->peer);
		atomic_fetch_add(&gone_count, 1);
		if (v->defer)
			worker_defer_free(v);
		else
			free(v);
	}
	if (p->free_self) {
		worker_unwatch(&p->ev);
		close(p->ev.fd);
		close(p->peer);
		atomic_fetch_add(&gone_count, 1);
		if (p->defer)
			worker_defer_free(p);
		else
			free(p);
	}
}

static struct probe *probe_new(void)
{
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) < 0) {
		perror("socketpair");
		exit(2);
	}
	struct probe *p = calloc(1, sizeof(*p));
	p->ev.fd = sv[0];
	p->ev.on_event = on_probe;
	p->peer = sv[1];
	return p;
}

/* Run fn(arg) on worker 0 and wait until it ran. */
struct call {
	void (*fn)(void *);
	void *arg;
	atomic_bool done;
};
static void run_call(void *arg)
{
	struct call *c = arg;
	c->fn(c->arg);
	atomic_store(&c->done, true);
}
static void on_worker(void (*fn)(void *), void *arg)
{
	struct call c = { .fn = fn, .arg = arg };
	if (worker_post(worker_get(0), run_call, &c) < 0) {
		fprintf(stderr, "worker_post failed\n");
		exit(2);
	}
	while (!atomic_load(&c.done))
		usleep(100);
}

static bool wait_for(atomic_uint *v, unsigned at_least)
{
	for (int i = 0; i < 10000; i++) {
		if (atomic_load(v) >= at_least)
			return true;
		usleep(1000);
	}
	return false;
}

static uint32_t want;
static bool as_file; /* worker_watch_file: through the worker's epoll set */
static void do_watch(void *arg)
{
	struct probe *p = arg;
	int r = as_file ? worker_watch_file(&p->ev, want) : worker_watch(&p->ev, want);
	CHECK(r == 0, "worker_watch%s: %s", as_file ? "_file" : "", strerror(-r));
}
static void do_rewatch(void *arg)
{
	struct probe *p = arg;
	int r = worker_rewatch(&p->ev, want);
	CHECK(r == 0, "worker_rewatch: %s", strerror(-r));
}
static void do_unwatch_free(void *arg)
{
	struct probe *p = arg;
	worker_unwatch(&p->ev);
	close(p->ev.fd);
	close(p->peer);
	/* deferred: an event of p may sit in the same epoll batch as this post */
	worker_defer_free(p);
}

static void watch(struct probe *p, uint32_t ev) { want = ev; on_worker(do_watch, p); }
static void rewatch(struct probe *p, uint32_t ev) { want = ev; on_worker(do_rewatch, p); }

static void put(int fd, unsigned n)
{
	char buf[256];
	memset(buf, 'x', sizeof(buf));
	while (n) {
		ssize_t w = write(fd, buf, n < sizeof(buf) ? n : sizeof(buf));
		if (w <= 0) {
			perror("write");
			exit(2);
		}
		n -= (unsigned)w;
	}
}

/* Fill fd's send buffer (the peer does not read): fd is then not writable. */
static size_t fill(int fd)
{
	static char buf[65536];
	size_t total = 0;
	for (;;) {
		ssize_t w = write(fd, buf, sizeof(buf));
		if (w < 0)
			break;
		total += (size_t)w;
	}
	return total;
}

static void drain(int fd, size_t n)
{
	static char buf[65536];
	while (n) {
		ssize_t r = read(fd, buf, n < sizeof(buf) ? n : sizeof(buf));
		if (r < 0 && errno == EAGAIN) {
			usleep(100);
			continue;
		}
		if (r <= 0)
			break;
		n -= (size_t)r;
	}
}

/* CPU seconds the process used so far */
static double cpu_now(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
	       ru.ru_stime.tv_usec / 1e6;
}

static void case_rdhup(void)
{
	struct probe *p = probe_new();
	watch(p, 0); /* not reading: a connection draining or held back */
	shutdown(p->peer, SHUT_WR);
	double c0 = cpu_now();
	usleep(500000);
	double used = cpu_now() - c0;
	CHECK(used < 0.2, "rdhup: the worker used %.2f s of CPU in 0.5 s over a half-closed socket nobody reads", used);
	rewatch(p, EPOLLIN);
	CHECK(wait_for(&p->in_calls, 1), "rdhup: no EPOLLIN (end of stream) after rewatch(EPOLLIN)");
	printf("rdhup: %.2f s of CPU in 0.5 s over a half-closed idle socket; EPOLLIN after rewatch\n", used);
	on_worker(do_unwatch_free, p);
}

static void cases(const char *mode, bool file)
{
	as_file = file;
	printf("== %s wait (worker_wait_kind: %s)%s\n", mode, worker_wait_kind(),
	       file ? ", descriptors watched with worker_watch_file" : "");
	CHECK(strcmp(worker_wait_kind(), mode) == 0, "asked for the %s wait, got %s", mode, worker_wait_kind());

	/* level: one byte per event, 64 bytes written at once */
	struct probe *p = probe_new();
	watch(p, EPOLLIN);
	put(p->peer, 64);
	CHECK(wait_for(&p->bytes, 64), "level: %u of 64 bytes read (%u events)", atomic_load(&p->bytes),
	      atomic_load(&p->in_calls));
	CHECK(atomic_load(&p->in_calls) >= 64, "level: %u events for 64 one-byte reads", atomic_load(&p->in_calls));
	printf("level: 64 bytes in %u events\n", atomic_load(&p->in_calls));

	/* widen: EPOLLIN alone is armed and idle; add EPOLLOUT (writable now) */
	rewatch(p, EPOLLIN | EPOLLOUT);
	CHECK(wait_for(&p->out_calls, 1), "widen: no EPOLLOUT after rewatch(EPOLLIN|EPOLLOUT)");
	printf("widen: EPOLLOUT delivered\n");

	/* narrow: a poll for IN|OUT in flight on a full socket; drop OUT; then
	 * let it drain (writable again) and write one byte (readable) */
	rewatch(p, EPOLLIN);
	size_t filled = fill(p->ev.fd);
	rewatch(p, EPOLLIN | EPOLLOUT); /* armed: not writable, nothing to read */
	rewatch(p, EPOLLIN);            /* narrowed with that poll in flight */
	atomic_store(&p->narrowed, true);
	unsigned in_before = atomic_load(&p->in_calls);
	drain(p->peer, filled);
	put(p->peer, 1);
	CHECK(wait_for(&p->in_calls, in_before + 1), "narrow: the byte written after narrowing was not seen");
	CHECK(atomic_load(&p->out_since_narrow) == 0, "narrow: %u EPOLLOUT events after rewatch(EPOLLIN)",
	      atomic_load(&p->out_since_narrow));
	printf("narrow: %u EPOLLOUT after dropping it (%zu bytes filled and drained)\n",
	       atomic_load(&p->out_since_narrow), filled);
	on_worker(do_unwatch_free, p);

	/* unwatch: a handler frees itself; another frees a second probe whose
	 * event is collected in the same round (freed at once under the ring
	 * wait, deferred under epoll); a posted unwatch with a poll in flight */
	atomic_store(&gone_count, 0);
	bool ring = strcmp(mode, "io_uring") == 0;
	struct probe *a = probe_new(), *b = probe_new(), *c = probe_new(), *d = probe_new();
	a->free_self = true;
	b->victim = c;
	c->defer = !ring || file; /* in an epoll batch, another handler may be freed only deferred */
	watch(a, EPOLLIN);
	watch(b, EPOLLIN);
	watch(c, EPOLLIN);
	watch(d, EPOLLIN);
	on_worker(do_unwatch_free, d); /* its poll is in flight */
	int pb = b->peer, pc = c->peer;
	/* write to c first: its event tends to be collected before b's handler frees it */
	put(pc, 1);
	put(pb, 1);
	put(a->peer, 1);
	CHECK(wait_for(&gone_count, 2), "unwatch: %u of 2 handlers freed", atomic_load(&gone_count));
	CHECK(wait_for(&b->bytes, 1), "unwatch: b did not read");
	on_worker(do_unwatch_free, b);
	printf("unwatch: freed in and across handlers, and with a poll in flight\n");
	case_rdhup();
}

static void run(const char *mode, const char *env)
{
	setenv("TIERCACHE_RING_WAIT", env, 1);
	if (workers_start(1) < 0) {
		fprintf(stderr, "cannot start a worker (io_uring unavailable?)\n");
		exit(2);
	}
	cases(mode, false);
	cases(mode, true);
	workers_stop();
}

int main(void)
{
	run("epoll", "0");
	run("io_uring", "1");
	if (failures) {
		fprintf(stderr, "%d failure(s)\n", failures);
		return 1;
	}
	printf("ok: watched descriptors behave alike under both waits\n");
	return 0;
}
