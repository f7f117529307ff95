/*
 * trace.c - recording a cache set's reads and writes to a file (trace.h).
 *
 * Each worker has a ring of its own (single producer: the worker; single
 * consumer: the trace's thread). The thread wakes every DRAIN_MS, takes
 * what every ring holds at that moment and writes it merged by timestamp,
 * so lines from two workers interleave as the requests arrived. A worker
 * reads the clock just before it publishes its record; one preempted in
 * between can publish after the thread drained newer records of other
 * workers, and its line then comes a little late (its timestamp says so).
 *
 * cs->trace is published and retired like an RCU pointer: cache_trace_stop
 * clears it and waits a grace period (no worker can still be pushing), then
 * the thread drains the rest, writes the footer, syncs and closes the file,
 * and ends. Everything that touches the file or looks up a volume runs on
 * that thread, an RCU reader of its own.
 *
 * Threading: cache_trace_note on workers, under rcu_read_lock; start, stop
 * and get on the control or main thread, serialised by trace_mu.
 */
#include "cache/trace.h"

#include "cache/cache_int.h"
#include "common/log.h"
#include "common/worker.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define RING 16384u                     /* records per worker, a power of two */
#define DRAIN_MS 20
#define DEFAULT_MAX_RECORDS 50000000ull /* about 1.5 GB of text */

struct trace_rec {
	uint64_t t_ns;
	uint64_t off;
	uint32_t len;
	uint16_t bid;
	uint8_t write;
};

struct trace_ring {
	/* written by the worker */
	_Atomic uint32_t head;
	_Atomic uint64_t dropped; /* the ring was full */
	_Atomic uint64_t over;    /* requests after the trace was full */
	char pad[64 - 24];
	/* written by the trace's thread */
	_Atomic uint32_t tail;
	char pad2[60];
	struct trace_rec rec[RING];
};

struct cache_trace {
	/* read by the workers on every request: never written while they run
	 * but for full, once */
	struct trace_ring *rings;    /* nrings of them */
	unsigned nrings;
	_Atomic bool full;           /* max_records written: record no more */
	uint64_t max_records;
	/* the trace's thread and the control thread */
	_Alignas(64) _Atomic uint64_t written;
	_Atomic uint64_t off_worker; /* requests from a thread that is no worker (none today) */
	struct cache_set *cs;
	FILE *f;
	char path[256];
	uint64_t t0_ns;
	int err;                     /* the first error writing or closing the file */
	uint32_t *at, *end;          /* drain's cursors, per ring */
	bool lun_named[CACHE_SET_MAX_VOLS];
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cond;
	bool stopping;
	struct cache_trace_info final; /* filled by the thread before it ends */
};

static pthread_mutex_t trace_mu = PTHREAD_MUTEX_INITIALIZER;

static uint64_t mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void cache_trace_note(struct cache_set *cs, uint32_t bid, bool write, uint64_t offset, uint32_t len)
{
	rcu_read_lock();
	struct cache_trace *t = atomic_load_explicit(&cs->trace, memory_order_acquire);
	if (!t)
		goto out;
	struct worker *w = worker_self();
	unsigned i = w ? worker_index(w) : UINT32_MAX;
	if (i >= t->nrings) {
		atomic_fetch_add_explicit(&t->off_worker, 1, memory_order_relaxed);
		goto out;
	}
	struct trace_ring *r = &t->rings[i];
	if (atomic_load_explicit(&t->full, memory_order_relaxed)) {
		atomic_fetch_add_explicit(&r->over, 1, memory_order_relaxed);
		goto out;
	}
	uint32_t h = atomic_load_explicit(&r->head, memory_order_relaxed);
	if (h - atomic_load_explicit(&r->tail, memory_order_acquire) >= RING) {
		atomic_fetch_add_explicit(&r->dropped, 1, memory_order_relaxed);
		goto out;
	}
	struct trace_rec *e = &r->rec[h & (RING - 1)];
	e->t_ns = mono_ns();
	e->off = offset;
	e->len = len;
	e->bid = (uint16_t)bid;
	e->write = write;
	atomic_store_explicit(&r->head, h + 1, memory_order_release);
out:
	rcu_read_unlock();
}

static void note_err(struct cache_trace *t, int e)
{
	if (!t->err)
		t->err = e ? e : EIO;
}

/* The trace's thread: "# lun ID NAME MODE" once per LUN, before its first line. */
static void write_lun_name(struct cache_trace *t, uint32_t bid)
{
	if (bid >= CACHE_SET_MAX_VOLS || t->lun_named[bid])
		return;
	char name[72] = "";
	const char *mode = "";
	rcu_read_lock(); /* vol_close waits a grace period before it frees the volume */
	struct cache_vol *v = cache_vol_of(t->cs, bid);
	if (v) {
		snprintf(name, sizeof(name), "%s", cache_vol_name(v));
		mode = cache_mode_name(cache_vol_mode(v));
	}
	rcu_read_unlock();
	if (!name[0])
		return; /* closed meanwhile: the header named it, if it was there at the start */
	t->lun_named[bid] = true;
	/* the mode decides whether writes are admitted: a replay needs it */
	if (fprintf(t->f, "# lun %u %s %s\n", bid, name, mode) < 0)
		note_err(t, errno);
}

/* The trace's thread: write what the rings hold now, merged by time. */
static void drain(struct cache_trace *t)
{
	unsigned n = t->nrings;
	uint64_t written = atomic_load_explicit(&t->written, memory_order_relaxed);
	for (unsigned i = 0; i < n; i++) {
		t->at[i] = atomic_load_explicit(&t->rings[i].tail, memory_order_relaxed);
		t->end[i] = atomic_load_explicit(&t->rings[i].head, memory_order_acquire);
	}
	for (;;) {
		int best = -1;
		uint64_t best_t = UINT64_MAX;
		for (unsigned i = 0; i < n; i++)
			if (t->at[i] != t->end[i] && t->rings[i].rec[t->at[i] & (RING - 1)].t_ns < best_t) {
				best = (int)i;
				best_t = t->rings[i].rec[t->at[i] & (RING - 1)].t_ns;
			}
		if (best < 0)
			break;
		struct trace_ring *r = &t->rings[best];
		const struct trace_rec *e = &r->rec[t->at[best] & (RING - 1)];
		if (written >= t->max_records) {
			/* full: the rest is counted, not written */
			atomic_store_explicit(&t->full, true, memory_order_relaxed);
			atomic_fetch_add_explicit(&r->over, 1, memory_order_relaxed);
		} else {
			write_lun_name(t, e->bid);
			/* the fifth field, microseconds since the start, is for
			 * whoever wants the arrival times; the replay reads four */
			if (fprintf(t->f, "%c %u %llu %u %llu\n", e->write ? 'W' : 'R', e->bid,
				    (unsigned long long)e->off, e->len,
				    (unsigned long long)(e->t_ns > t->t0_ns ? (e->t_ns - t->t0_ns) / 1000 : 0)) < 0)
				note_err(t, errno);
			written++;
		}
		t->at[best]++;
		/* the slot is free again once the line is formatted */
		atomic_store_explicit(&r->tail, t->at[best], memory_order_release);
	}
	atomic_store_explicit(&t->written, written, memory_order_relaxed);
	if (fflush(t->f))
		note_err(t, errno);
}

static uint64_t dropped_of(const struct cache_trace *t)
{
	uint64_t d = atomic_load(&t->off_worker);
	for (unsigned i = 0; i < t->nrings; i++)
		d += atomic_load(&t->rings[i].dropped) + atomic_load(&t->rings[i].over);
	return d;
}

static void info_of(const struct cache_trace *t, struct cache_trace_info *out)
{
	memset(out, 0, sizeof(*out));
	out->on = true;
	snprintf(out->path, sizeof(out->path), "%s", t->path);
	out->records = atomic_load(&t->written);
	out->dropped = dropped_of(t);
	out->max_records = t->max_records;
	out->seconds = (double)(mono_ns() - t->t0_ns) / 1e9;
}

/* Make the file and its name durable, and close it. The trace's thread. */
static void finish_file(struct cache_trace *t)
{
	if (fflush(t->f) || ferror(t->f))
		note_err(t, errno);
	if (fsync(fileno(t->f)))
		note_err(t, errno);
	if (fclose(t->f))
		note_err(t, errno);
	t->f = NULL;
	char dir[sizeof(t->path)];
	snprintf(dir, sizeof(dir), "%s", t->path);
	int dfd = open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd >= 0) {
		if (fsync(dfd))
			note_err(t, errno);
		close(dfd);
	}
}

static void *trace_thread(void *arg)
{
	struct cache_trace *t = arg;
	rcu_register_thread(); /* write_lun_name reads volumes under rcu_read_lock */
	/* the LUNs attached now are named in the header, before any line */
	for (uint32_t b = 0; b < CACHE_SET_MAX_VOLS; b++)
		write_lun_name(t, b);
	pthread_mutex_lock(&t->mu);
	while (!t->stopping) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += DRAIN_MS * 1000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&t->cond, &t->mu, &ts);
		pthread_mutex_unlock(&t->mu);
		drain(t);
		pthread_mutex_lock(&t->mu);
	}
	pthread_mutex_unlock(&t->mu);
	/* stopping: cache_trace_stop waited a grace period, nothing comes any more */
	drain(t);
	info_of(t, &t->final);
	t->final.on = false;
	if (fprintf(t->f, "# records %llu, dropped %llu, %.1f s\n", (unsigned long long)t->final.records,
		    (unsigned long long)t->final.dropped, t->final.seconds) < 0)
		note_err(t, errno);
	finish_file(t);
	rcu_unregister_thread();
	return NULL;
}

static void trace_free(struct cache_trace *t)
{
	if (!t)
		return;
	pthread_mutex_destroy(&t->mu);
	pthread_cond_destroy(&t->cond);
	free(t->at);
	free(t->end);
	free(t->rings);
	free(t);
}

/* A trace with a ring per worker, or NULL (out of memory). */
static struct cache_trace *trace_new(struct cache_set *cs, unsigned n)
{
	struct cache_trace *t = aligned_alloc(64, (sizeof(*t) + 63) / 64 * 64);
	if (!t)
		return NULL;
	memset(t, 0, sizeof(*t));
	pthread_mutex_init(&t->mu, NULL);
	pthread_cond_init(&t->cond, NULL);
	t->cs = cs;
	t->nrings = n;
	t->rings = aligned_alloc(64, sizeof(*t->rings) * n);
	t->at = calloc(n, sizeof(*t->at));
	t->end = calloc(n, sizeof(*t->end));
	if (!t->rings || !t->at || !t->end) {
		trace_free(t);
		return NULL;
	}
	memset(t->rings, 0, sizeof(*t->rings) * n);
	return t;
}

/* Create path (never over an existing file) and write the header: 0 or -errno. */
static int trace_create_file(struct cache_trace *t, const char *path)
{
	struct cache_set *cs = t->cs;
	int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0640);
	if (fd < 0)
		return -errno;
	if (!(t->f = fdopen(fd, "w"))) {
		int e = errno;
		close(fd);
		unlink(path); /* ours: O_EXCL made it */
		return -e;
	}
	time_t now = time(NULL);
	struct tm tm;
	char when[32];
	strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tm));
	fprintf(t->f,
		"# tiercache trace of cache %s, started %s\n"
		"# R|W LUN OFFSET LEN (bytes) MICROSECONDS (since the start), in arrival order\n",
		cs->name, when);
	fprintf(t->f, "# nslots %u\n# extent %u\n# admit_hits %u\n# seq_cutoff %llu\n", cs->lay.nslots,
		cs->lay.extent_size, cs->cfg.admit_hits ? cs->cfg.admit_hits : 1, (unsigned long long)cs->cfg.seq_cutoff);
	if (fflush(t->f) || ferror(t->f)) {
		int e = errno ? errno : EIO;
		fclose(t->f);
		t->f = NULL;
		unlink(path);
		return -e;
	}
	return 0;
}

int cache_trace_start(struct cache_set *cs, const char *path, uint64_t max_records, char *err, size_t errlen)
{
	if (!path || path[0] != '/' || strlen(path) >= sizeof(((struct cache_trace *)0)->path)) {
		snprintf(err, errlen, "a trace file is an absolute path of fewer than 256 bytes");
		return -EINVAL;
	}
	pthread_mutex_lock(&trace_mu);
	int r;
	struct cache_trace *t = NULL;
	if (atomic_load(&cs->trace)) {
		snprintf(err, errlen, "cache %s is being traced already (tierctl trace %s stop)", cs->name, cs->name);
		r = -EBUSY;
		goto fail;
	}
	unsigned n = workers_count();
	if (!(t = trace_new(cs, n ? n : 1))) {
		snprintf(err, errlen, "out of memory");
		r = -ENOMEM;
		goto fail;
	}
	t->max_records = max_records ? max_records : DEFAULT_MAX_RECORDS;
	snprintf(t->path, sizeof(t->path), "%s", path);
	if ((r = trace_create_file(t, path)) < 0) {
		snprintf(err, errlen, "cannot create %s: %s", path, strerror(-r));
		goto fail;
	}
	t->t0_ns = mono_ns();
	if ((r = -pthread_create(&t->thread, NULL, trace_thread, t)) < 0) {
		fclose(t->f);
		unlink(path);
		snprintf(err, errlen, "cannot start the trace's thread: %s", strerror(-r));
		goto fail;
	}
	atomic_store_explicit(&cs->trace, t, memory_order_release);
	pthread_mutex_unlock(&trace_mu);
	log_info("cache %s: tracing reads and writes to %s", cs->name, path);
	return 0;
fail:
	trace_free(t);
	pthread_mutex_unlock(&trace_mu);
	return r;
}

int cache_trace_stop(struct cache_set *cs, struct cache_trace_info *out)
{
	pthread_mutex_lock(&trace_mu);
	struct cache_trace *t = atomic_load(&cs->trace);
	if (!t) {
		pthread_mutex_unlock(&trace_mu);
		return -ENOENT;
	}
	atomic_store(&cs->trace, NULL);
	synchronize_rcu(); /* no worker pushes any more */
	pthread_mutex_lock(&t->mu);
	t->stopping = true;
	pthread_cond_signal(&t->cond);
	pthread_mutex_unlock(&t->mu);
	/* the rest of the rings, the footer, fsync: on the thread (the file
	 * was flushed every 20 ms, so what the sync waits for is bounded by
	 * the kernel's own write-back of the last seconds) */
	pthread_join(t->thread, NULL);
	int r = -t->err;
	if (r)
		log_err("cache %s: the trace %s is incomplete: %s", cs->name, t->path, strerror(-r));
	else
		log_info("cache %s: trace %s done: %llu requests, %llu not recorded", cs->name, t->path,
			 (unsigned long long)t->final.records, (unsigned long long)t->final.dropped);
	if (out)
		*out = t->final;
	trace_free(t);
	pthread_mutex_unlock(&trace_mu);
	return r;
}

void cache_trace_get(struct cache_set *cs, struct cache_trace_info *out)
{
	pthread_mutex_lock(&trace_mu);
	struct cache_trace *t = atomic_load(&cs->trace);
	if (t)
		info_of(t, out);
	else
		memset(out, 0, sizeof(*out));
	pthread_mutex_unlock(&trace_mu);
}
