/*
 * trace.c - recording a cache set's reads and writes to a file (trace.h).
 *
 * Each worker has a ring of its own (single producer: the worker; single
 * consumer: the trace's thread). The thread wakes every DRAIN_MS, takes
 * what every ring holds at that moment and writes it merged by timestamp,
 * so lines from two workers interleave as the requests arrived (up to the
 * few microseconds between a worker reading the clock and publishing the
 * record). cs->trace is published and retired like an RCU pointer:
 * cache_trace_stop clears it, waits a grace period (no worker can still
 * be pushing), then the thread drains the rest and the file is closed.
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
	struct cache_set *cs;
	FILE *f;
	char path[256];
	unsigned nrings;
	uint64_t max_records;
	_Atomic bool full;           /* max_records written: record no more */
	_Atomic uint64_t off_worker; /* requests from a thread that is no worker */
	_Atomic uint64_t written;
	uint64_t t0_ns;
	int write_err;               /* the first error writing the file */
	bool lun_named[CACHE_SET_MAX_VOLS];
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cond;
	bool stopping;
	struct trace_ring *rings;    /* nrings of them */
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

static void write_lun_name(struct cache_trace *t, uint16_t bid)
{
	if (bid >= CACHE_SET_MAX_VOLS || t->lun_named[bid])
		return;
	t->lun_named[bid] = true;
	char name[72] = "?";
	const char *mode = "?";
	rcu_read_lock(); /* vol_close waits a grace period before it frees the volume */
	struct cache_vol *v = cache_vol_of(t->cs, bid);
	if (v) {
		snprintf(name, sizeof(name), "%s", cache_vol_name(v));
		mode = cache_mode_name(cache_vol_mode(v));
	}
	rcu_read_unlock();
	/* the mode decides whether writes are admitted: a replay needs it */
	fprintf(t->f, "# lun %u %s %s\n", bid, name, mode);
}

/* The trace's thread: write what the rings hold now, merged by time. */
static void drain(struct cache_trace *t)
{
	uint32_t at[64], end[64];
	unsigned n = t->nrings < 64 ? t->nrings : 64;
	for (unsigned i = 0; i < n; i++) {
		at[i] = atomic_load_explicit(&t->rings[i].tail, memory_order_relaxed);
		end[i] = atomic_load_explicit(&t->rings[i].head, memory_order_acquire);
	}
	for (;;) {
		int best = -1;
		uint64_t best_t = UINT64_MAX;
		for (unsigned i = 0; i < n; i++)
			if (at[i] != end[i] && t->rings[i].rec[at[i] & (RING - 1)].t_ns < best_t) {
				best = (int)i;
				best_t = t->rings[i].rec[at[i] & (RING - 1)].t_ns;
			}
		if (best < 0)
			break;
		const struct trace_rec *e = &t->rings[best].rec[at[best] & (RING - 1)];
		if (atomic_load_explicit(&t->written, memory_order_relaxed) >= t->max_records) {
			/* full: the rest is counted, not written */
			atomic_store_explicit(&t->full, true, memory_order_relaxed);
			atomic_fetch_add_explicit(&t->rings[best].over, 1, memory_order_relaxed);
			at[best]++;
			atomic_store_explicit(&t->rings[best].tail, at[best], memory_order_release);
			continue;
		}
		write_lun_name(t, e->bid);
		if (fprintf(t->f, "%c %u %llu %u\n", e->write ? 'W' : 'R', e->bid, (unsigned long long)e->off,
			    e->len) < 0 &&
		    !t->write_err)
			t->write_err = errno ? errno : EIO;
		at[best]++;
		atomic_store_explicit(&t->rings[best].tail, at[best], memory_order_release);
		atomic_fetch_add_explicit(&t->written, 1, memory_order_relaxed);
	}
	if (fflush(t->f) && !t->write_err)
		t->write_err = errno ? errno : EIO;
}

static void *trace_thread(void *arg)
{
	struct cache_trace *t = arg;
	rcu_register_thread(); /* write_lun_name reads a volume under rcu_read_lock */
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
	rcu_unregister_thread();
	return NULL;
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

static void trace_free(struct cache_trace *t)
{
	pthread_mutex_destroy(&t->mu);
	pthread_cond_destroy(&t->cond);
	free(t->rings);
	free(t);
}

int cache_trace_start(struct cache_set *cs, const char *path, uint64_t max_records, char *err, size_t errlen)
{
	if (!path || path[0] != '/' || strlen(path) >= sizeof(((struct cache_trace *)0)->path)) {
		snprintf(err, errlen, "a trace file is an absolute path of fewer than 256 bytes");
		return -EINVAL;
	}
	pthread_mutex_lock(&trace_mu);
	if (atomic_load(&cs->trace)) {
		pthread_mutex_unlock(&trace_mu);
		snprintf(err, errlen, "cache %s is being traced already (tierctl trace %s stop)", cs->name, cs->name);
		return -EBUSY;
	}
	struct cache_trace *t = calloc(1, sizeof(*t));
	unsigned n = workers_count();
	if (n > 64)
		n = 64;
	if (t)
		t->rings = aligned_alloc(64, sizeof(*t->rings) * (n ? n : 1));
	if (!t || !t->rings) {
		free(t);
		pthread_mutex_unlock(&trace_mu);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	memset(t->rings, 0, sizeof(*t->rings) * (n ? n : 1));
	t->cs = cs;
	t->nrings = n;
	t->max_records = max_records ? max_records : DEFAULT_MAX_RECORDS;
	snprintf(t->path, sizeof(t->path), "%s", path);
	pthread_mutex_init(&t->mu, NULL);
	pthread_cond_init(&t->cond, NULL);
	int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0640);
	if (fd < 0 || !(t->f = fdopen(fd, "w"))) {
		int e = errno;
		if (fd >= 0)
			close(fd);
		snprintf(err, errlen, "cannot create %s: %s", path, strerror(e));
		trace_free(t);
		pthread_mutex_unlock(&trace_mu);
		return -e;
	}
	time_t now = time(NULL);
	struct tm tm;
	char when[32];
	strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tm));
	fprintf(t->f, "# tiercache trace of cache %s, started %s\n# R|W LUN OFFSET LEN (bytes), in arrival order\n",
		cs->name, when);
	fprintf(t->f, "# nslots %u\n# extent %u\n# admit_hits %u\n# seq_cutoff %llu\n", cs->lay.nslots,
		cs->lay.extent_size, cs->cfg.admit_hits ? cs->cfg.admit_hits : 1, (unsigned long long)cs->cfg.seq_cutoff);
	fflush(t->f);
	t->t0_ns = mono_ns();
	int e = pthread_create(&t->thread, NULL, trace_thread, t);
	if (e) {
		fclose(t->f);
		unlink(path);
		trace_free(t);
		pthread_mutex_unlock(&trace_mu);
		snprintf(err, errlen, "cannot start the trace's thread: %s", strerror(e));
		return -e;
	}
	atomic_store_explicit(&cs->trace, t, memory_order_release);
	pthread_mutex_unlock(&trace_mu);
	log_info("cache %s: tracing reads and writes to %s", cs->name, path);
	return 0;
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
	pthread_join(t->thread, NULL);
	drain(t);
	struct cache_trace_info info;
	info_of(t, &info);
	info.on = false;
	fprintf(t->f, "# records %llu, dropped %llu, %.1f s\n", (unsigned long long)info.records,
		(unsigned long long)info.dropped, info.seconds);
	int r = 0;
	if (fflush(t->f) || fsync(fileno(t->f)))
		r = -errno;
	if (fclose(t->f) && !r)
		r = -errno;
	if (t->write_err && !r)
		r = -t->write_err;
	if (r)
		log_err("cache %s: the trace %s is incomplete: %s", cs->name, t->path, strerror(-r));
	else
		log_info("cache %s: trace %s done: %llu requests, %llu not recorded", cs->name, t->path,
			 (unsigned long long)info.records, (unsigned long long)info.dropped);
	trace_free(t);
	pthread_mutex_unlock(&trace_mu);
	if (out)
		*out = info;
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
