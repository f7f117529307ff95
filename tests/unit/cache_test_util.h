/*
 * cache_test_util.h - test devices and helpers for the cache engine's unit
 * tests (header-only; each test_cache_*.c is its own program).
 *
 * mem_bdev: a bdev in RAM that completes asynchronously on the calling
 * worker (like io_uring would), and can
 *  - record every write and flush into a shared log (the power-cut test
 *    rebuilds device images from a prefix of it, OCF-style), and
 *  - fail every I/O after N operations (the leg-failure test), and
 *  - complete reads late (read_hops: the completion is re-posted that many
 *    times), so requests submitted meanwhile overtake them, and writes
 *    after a random 0..write_hops re-posts with the data landing only then,
 *    so writes in flight together land in any order (race tests); with
 *    write_hops_exact, after exactly write_hops re-posts; and writes that
 *    touch [slow_lo, slow_hi) after slow_hops re-posts, landing only then
 *    (one area of a leg made slow: its journal, say), or, with slow_hold
 *    set, not before the test clears it.
 * The log holds submissions (writes with their data, flushes) and, as
 * WL_DONE entries (dev -1), completions, logged just before done() runs,
 * so an acknowledgement upward always has a later index than the
 * completions it waited for. wlog_image's durability model: a write is
 * durable at a cut if it was submitted before the cut and is FUA, or a
 * FLUSH of the same device was submitted after it and before the cut; the
 * power-cut test builds a stricter one from the completions.
 * A device logs into m->log (g_log unless the test points it elsewhere).
 */
#ifndef TC_CACHE_TEST_UTIL_H
#define TC_CACHE_TEST_UTIL_H

#include "tests/unit/check.h"
#include "bdev/bdev.h"
#include "cache/cache.h"
#include "common/bufpool.h"
#include "common/worker.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>


enum { WL_SUBMIT = 0, WL_DONE = 1 };

struct wlog_ent {
	int dev;                /* -1 for a WL_DONE entry */
	uint8_t kind;           /* WL_SUBMIT or WL_DONE */
	bool flush;
	bool fua;
	uint64_t off, len;
	uint8_t *data;
	size_t ref;             /* WL_DONE: index of the submission it completes */
};

struct wlog {
	pthread_mutex_t lock;
	struct wlog_ent *e;
	size_t n, cap;
	bool on;
};

static struct wlog g_log = { .lock = PTHREAD_MUTEX_INITIALIZER };

static inline size_t wlog_len(void)
{
	pthread_mutex_lock(&g_log.lock);
	size_t n = g_log.n;
	pthread_mutex_unlock(&g_log.lock);
	return n;
}

/* Append a submission (or, kind WL_DONE, a completion of entry ref); its index, or SIZE_MAX when off. */
static inline size_t wlog_append(struct wlog *L, int kind, int dev, bool flush, bool fua, uint64_t off,
				 uint64_t len, const void *data, size_t ref)
{
	pthread_mutex_lock(&L->lock);
	if (!L->on) {
		pthread_mutex_unlock(&L->lock);
		return SIZE_MAX;
	}
	if (L->n == L->cap) {
		L->cap = L->cap ? L->cap * 2 : 1024;
		L->e = realloc(L->e, L->cap * sizeof(*L->e));
	}
	size_t i = L->n++;
	struct wlog_ent *x = &L->e[i];
	x->dev = kind == WL_DONE ? -1 : dev;
	x->kind = (uint8_t)kind;
	x->flush = flush;
	x->fua = fua;
	x->off = off;
	x->len = len;
	x->ref = ref;
	x->data = NULL;
	if (data) {
		x->data = calloc(1, len);
		memcpy(x->data, data, len);
	}
	pthread_mutex_unlock(&L->lock);
	return i;
}

/* Empty a log (entries freed), logging off. */
static inline void wlog_reset(struct wlog *L)
{
	pthread_mutex_lock(&L->lock);
	for (size_t i = 0; i < L->n; i++)
		free(L->e[i].data);
	L->n = 0;
	L->on = false;
	pthread_mutex_unlock(&L->lock);
}

struct mem_bdev {
	struct bdev dev;
	int id;
	uint8_t *data;
	_Atomic long ops;
	_Atomic long fail_after;   /* -1: never */
	_Atomic long errors;
	_Atomic int read_hops;
	_Atomic int write_hops;
	_Atomic bool write_hops_exact;
	_Atomic uint64_t hop_rnd;
	_Atomic uint64_t slow_lo, slow_hi;
	_Atomic int slow_hops;
	_Atomic bool slow_hold; /* writes to [slow_lo, slow_hi) complete only once this is cleared */
	_Atomic uint64_t hold_lo, hold_hi; /* if hold_hi: slow_hold holds writes to this range instead */
	void (*on_submit)(struct mem_bdev *m, const struct bdev_req *req); /* a test's look at each request */
	struct wlog *log;
	bool borrowed;          /* data belongs to the caller (mem_borrow) */
	uint8_t *touched;       /* the caller's bitmap of 4 KiB pages written, or NULL */
	char name[32];
};

struct mem_done {
	struct bdev_req *req;
	int err;
	int hops;
	bool held;              /* re-posted while m->slow_hold */
	struct mem_bdev *m;
	uint8_t *wdata;         /* a late write's data, landing at completion */
	size_t logi;            /* the submission's log index, SIZE_MAX: not logged */
	struct worker_call call; /* its completion, posted without an allocation */
};

static inline void mem_complete(void *arg)
{
	struct mem_done *d = arg;
	if (d->hops > 0 || (d->held && atomic_load(&d->m->slow_hold))) {
		if (d->hops > 0)
			d->hops--;
		worker_post_call(worker_self(), &d->call, mem_complete, d);
		return;
	}
	struct bdev_req *req = d->req;
	int err = d->err;
	if (d->wdata) {
		memcpy(d->m->data + req->offset, d->wdata, req->len);
		free(d->wdata);
	}
	if (d->logi != SIZE_MAX)
		wlog_append(d->m->log, WL_DONE, -1, false, false, 0, 0, NULL, d->logi);
	free(d);
	req->done(req, err);
}

static inline void mem_touch(struct mem_bdev *m, uint64_t off, uint64_t len)
{
	if (!m->touched || !len)
		return;
	for (uint64_t p = off / 4096; p <= (off + len - 1) / 4096; p++)
		__atomic_fetch_or(&m->touched[p / 8], (uint8_t)(1u << (p % 8)), __ATOMIC_RELAXED);
}

static inline void mem_submit(struct bdev *dev, struct bdev_req *req)
{
	struct mem_bdev *m = (struct mem_bdev *)dev;
	if (m->on_submit)
		m->on_submit(m, req);
	/* calloc, never malloc: a test may refuse the mallocs of the code it tests (--wrap=malloc) */
	struct mem_done *d = calloc(1, sizeof(*d));
	long n = atomic_fetch_add(&m->ops, 1);
	long fa = atomic_load(&m->fail_after);
	d->req = req;
	d->err = 0;
	d->hops = req->op == BDEV_READ ? atomic_load(&m->read_hops) : 0;
	d->m = m;
	d->wdata = NULL;
	d->logi = SIZE_MAX;
	int wh = atomic_load(&m->write_hops);
	bool late = wh > 0;
	if (wh > 0 && req->op == BDEV_WRITE) {
		uint64_t x = atomic_fetch_add(&m->hop_rnd, 0x9e3779b97f4a7c15ull) * 0xbf58476d1ce4e5b9ull;
		d->hops = atomic_load(&m->write_hops_exact) ? wh : (int)((x >> 40) % (uint64_t)(wh + 1));
	}
	int sh = atomic_load(&m->slow_hops);
	bool hold = atomic_load(&m->slow_hold);
	uint64_t hhi = atomic_load(&m->hold_hi);
	if (hhi) {
		/* a range of its own for the hold */
		if (hold && req->op == BDEV_WRITE && req->offset < hhi && req->offset + req->len > atomic_load(&m->hold_lo)) {
			d->held = true;
			late = true;
		}
		hold = false;
	}
	if ((sh > 0 || hold) && req->op == BDEV_WRITE && req->offset < atomic_load(&m->slow_hi) &&
	    req->offset + req->len > atomic_load(&m->slow_lo)) {
		d->hops = sh;
		d->held = d->held || hold;
		late = true;
	}
	if (fa >= 0 && n >= fa) {
		d->err = -EIO;
		atomic_fetch_add(&m->errors, 1);
	} else if (req->offset + req->len > dev->size) {
		d->err = -EINVAL;
	} else {
		uint64_t at = req->offset;
		switch (req->op) {
		case BDEV_READ:
			for (int i = 0; i < req->iovcnt; i++) {
				memcpy(req->iov[i].iov_base, m->data + at, req->iov[i].iov_len);
				at += req->iov[i].iov_len;
			}
			break;
		case BDEV_WRITE: {
			mem_touch(m, req->offset, req->len);
			uint8_t *tmp = calloc(1, req->len);
			uint64_t k = 0;
			for (int i = 0; i < req->iovcnt; i++) {
				memcpy(tmp + k, req->iov[i].iov_base, req->iov[i].iov_len);
				k += req->iov[i].iov_len;
			}
			d->logi = wlog_append(m->log, WL_SUBMIT, m->id, false, req->flags & BDEV_F_FUA, req->offset,
					      req->len, tmp, 0);
			if (late) {
				d->wdata = tmp; /* lands at completion */
				break;
			}
			memcpy(m->data + req->offset, tmp, req->len);
			free(tmp);
			break;
		}
		case BDEV_FLUSH:
			d->logi = wlog_append(m->log, WL_SUBMIT, m->id, true, false, 0, 0, NULL, 0);
			break;
		case BDEV_UNMAP:
		case BDEV_WRITE_ZEROES: {
			mem_touch(m, req->offset, req->len);
			uint8_t *z = calloc(1, req->len);
			memset(m->data + req->offset, 0, req->len);
			d->logi = wlog_append(m->log, WL_SUBMIT, m->id, false, true, req->offset, req->len, z, 0);
			free(z);
			break;
		}
		}
	}
	worker_post_call(worker_self(), &d->call, mem_complete, d);
}

static inline void mem_close(struct bdev *dev)
{
	struct mem_bdev *m = (struct mem_bdev *)dev;
	if (!m->borrowed)
		free(m->data);
	free(m);
}

static const struct bdev_ops mem_ops = { .submit = mem_submit, .close = mem_close };

static inline struct mem_bdev *mem_new(int id, uint64_t size, const uint8_t *image)
{
	struct mem_bdev *m = calloc(1, sizeof(*m));
	m->id = id;
	m->data = calloc(1, size);
	if (image)
		memcpy(m->data, image, size);
	atomic_init(&m->fail_after, -1);
	m->log = &g_log;
	snprintf(m->name, sizeof(m->name), "mem%d", id);
	m->dev.ops = &mem_ops;
	m->dev.name = m->name;
	m->dev.size = size;
	m->dev.block_size = 512;
	m->dev.can_unmap = true;
	return m;
}

/* A device over the caller's buffer (not copied, not freed): for tests that open thousands of images. */
static inline struct mem_bdev *mem_borrow(int id, uint64_t size, uint8_t *data)
{
	struct mem_bdev *m = mem_new(id, 0, NULL);
	free(m->data);
	m->data = data;
	m->borrowed = true;
	m->dev.size = size;
	return m;
}

/* A set over the two mirror legs, or the test fails. */
static inline struct cache_set *test_set_open(const struct cache_set_cfg *cfg, struct mem_bdev *leg0,
					      struct mem_bdev *leg1)
{
	char err[512];
	struct bdev *legs[2] = { &leg0->dev, &leg1->dev };
	struct cache_set *cs = cache_set_open_devs(cfg, legs, err, sizeof(err));
	REQUIRE(cs, "open: %s", err);
	return cs;
}

/* LUN lun on backing store back, attached to cs in mode, or the test fails. */
static inline struct bdev *test_vol_open(struct cache_set *cs, const char *lun, struct mem_bdev *back,
					 enum cache_mode mode)
{
	char err[512];
	struct bdev *vol = cache_vol_open(cs, lun, &back->dev, NULL, mode, err, sizeof(err));
	REQUIRE(vol, "attach %s: %s", lun, err);
	return vol;
}

/* A set and its one volume closed the way the daemon does: a clean stop, then the volume, then the set. */
static inline void test_set_close(struct cache_set *cs, struct bdev *vol)
{
	cache_set_shutdown(cs);
	bdev_close(vol);
	cache_set_close(cs);
}

/* Rebuild device id's image as a power cut at log index cut would leave it. */
static inline void wlog_image(int id, const uint8_t *initial, uint64_t size, size_t cut, uint8_t *out)
{
	memcpy(out, initial, size);
	pthread_mutex_lock(&g_log.lock);
	/* last flush of this device before the cut */
	size_t last_flush = 0;
	bool have_flush = false;
	for (size_t i = 0; i < cut && i < g_log.n; i++)
		if (g_log.e[i].dev == id && g_log.e[i].flush) {
			last_flush = i;
			have_flush = true;
		}
	for (size_t i = 0; i < cut && i < g_log.n; i++) {
		struct wlog_ent *x = &g_log.e[i];
		if (x->dev != id || x->flush)
			continue;
		if (!x->fua && !(have_flush && i < last_flush))
			continue;
		memcpy(out + x->off, x->data, x->len);
	}
	pthread_mutex_unlock(&g_log.lock);
}

/* xorshift64: the tests' reproducible pseudo-random sequence, one state each */
static inline uint64_t tc_xorshift(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* ---- running I/O on a worker from the test thread ---- */

struct tio {
	struct bdev_req req;
	struct iovec iov;
	_Atomic int *outstanding;
	int err;
	size_t ack_index;   /* log length when done() ran */
	_Atomic bool done;
};

static inline void tio_done(struct bdev_req *req, int err)
{
	struct tio *t = req->priv;
	_Atomic int *outstanding = t->outstanding;
	t->err = err;
	t->ack_index = wlog_len();
	/* the last touch of t: a tio_sync caller returns (and its t goes) as soon as it sees done */
	atomic_store(&t->done, true);
	if (outstanding)
		atomic_fetch_sub(outstanding, 1);
}

static inline void tio_start(void *arg)
{
	struct tio *t = arg;
	bdev_submit(t->req.dev, &t->req);
}

static inline void tio_submit(struct tio *t, struct bdev *dev, enum bdev_op op, uint64_t off, void *buf,
		       uint64_t len, unsigned flags, _Atomic int *outstanding, int worker)
{
	memset(t, 0, sizeof(*t));
	t->iov.iov_base = buf;
	t->iov.iov_len = len;
	t->req = (struct bdev_req){ .op = op, .flags = flags, .offset = off, .len = len, .iov = &t->iov,
				    .iovcnt = buf ? 1 : 0, .done = tio_done, .priv = t };
	t->req.dev = dev;
	t->outstanding = outstanding;
	if (outstanding)
		atomic_fetch_add(outstanding, 1);
	worker_post(worker_get((unsigned)worker % workers_count()), tio_start, t);
}

static inline int tio_sync(struct bdev *dev, enum bdev_op op, uint64_t off, void *buf, uint64_t len, unsigned flags)
{
	struct tio t;
	tio_submit(&t, dev, op, off, buf, len, flags, NULL, 0);
	while (!atomic_load(&t.done))
		usleep(50);
	return t.err;
}

/* ---- block stamps: every 512-byte sector says which write put it there ---- */

struct stamp {
	uint64_t lba;
	uint64_t seq;
	uint32_t crc;
};

static inline uint32_t stamp_crc(uint64_t lba, uint64_t seq)
{
	uint64_t x = lba * 0x9e3779b97f4a7c15ULL ^ seq * 0xc2b2ae3d27d4eb4fULL;
	x ^= x >> 29;
	return (uint32_t)x ^ 0x5a5a5a5au;
}

static inline void stamp_fill(uint8_t *buf, uint64_t lba, uint32_t nsect, uint64_t seq)
{
	for (uint32_t i = 0; i < nsect; i++) {
		uint8_t *s = buf + (size_t)i * 512;
		struct stamp st = { lba + i, seq, stamp_crc(lba + i, seq) };
		memset(s, (int)(seq & 0xff), 512);
		memcpy(s, &st, sizeof(st));
	}
}

/* 0 = zero sector, 1 = valid stamp (seq out), -1 = garbage */
static inline int stamp_check(const uint8_t *s, uint64_t lba, uint64_t *seq)
{
	static const uint8_t zero[512];
	struct stamp st;
	memcpy(&st, s, sizeof(st));
	if (!memcmp(s, zero, 512))
		return 0;
	if (st.lba != lba || st.crc != stamp_crc(lba, st.seq))
		return -1;
	uint8_t fill[512];
	memset(fill, (int)(st.seq & 0xff), sizeof(fill));
	if (memcmp(s + sizeof(st), fill, 512 - sizeof(st)))
		return -1;
	*seq = st.seq;
	return 1;
}

#endif
