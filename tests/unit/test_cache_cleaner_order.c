/*
 * test_cache_cleaner_order.c - an extent the cleaner starts is finished
 * before the next one, also when the host being busy cuts its destage into
 * parts.
 *
 * While the host has I/O in flight a destage takes at most 128 KiB of an
 * extent (cleaner.c, CLEAN_BYTES_BUSY). The rest used to wait for the next
 * gather of dirty slots, that is behind every extent after it in the sorted
 * list, of every LUN: `tierctl detach` of one LUN then waited for the
 * others' dirty data as well (test_tierctl_progress failed so when the
 * list was gathered while the other LUN was being written).
 *
 * Two LUNs on one set (LUN a sorts first), four extents of 256 KiB each,
 * all dirty; the cleaner capped at 1 byte/s while they are written (so it
 * starts at most one destage part), the host kept busy (a request counted
 * in flight), then the cap lifted and the set flushed. Every backing write
 * of LUN a must come before the first of LUN b, and each extent's parts
 * must follow each other (no extent is left and come back to).
 */
#include "cache/cache_int.h" /* fg_inflight: the host busy without timing */
#include "tests/unit/cache_test_util.h"

#define LEG_SIZE (16u << 20)
#define BACK_SIZE (4u << 20)
#define EXT (256u << 10)
#define NEXT 4

static struct cache_set_cfg cfg = {
	.name = "co",
	.nlegs = 2,
	.extent_size = EXT,
	.mode = CACHE_WRITE_BACK,
	.admit_hits = 1,
	.dirty_target = 90,
	.destage_max = 1,
};

struct flush_arg {
	struct cache_set *cs;
	int r;
};

static void *flush_main(void *arg)
{
	struct flush_arg *f = arg;
	f->r = cache_set_flush(f->cs, 60000);
	return NULL;
}

int main(void)
{
	REQUIRE(workers_start(2) == 0, "workers");
	enum { DEV_A, DEV_B, DEV_LEG0, DEV_LEG1, NDEV };
	uint64_t sizes[NDEV] = { BACK_SIZE, BACK_SIZE, LEG_SIZE, LEG_SIZE };
	struct mem_bdev *d[NDEV];
	for (int i = 0; i < NDEV; i++)
		d[i] = mem_new(i, sizes[i], NULL);
	struct cache_set *cs = test_set_open(&cfg, d[DEV_LEG0], d[DEV_LEG1]);
	struct bdev *va = test_vol_open(cs, "a", d[DEV_A], CACHE_WRITE_BACK);
	struct bdev *vb = test_vol_open(cs, "b", d[DEV_B], CACHE_WRITE_BACK);

	/* the host busy throughout: every destage part is at most 128 KiB */
	atomic_fetch_add(&cs->fg_inflight, 1);
	uint8_t *buf = buf_get(EXT);
	memset(buf, 0xa5, EXT);
	pthread_mutex_lock(&g_log.lock);
	g_log.on = true;
	pthread_mutex_unlock(&g_log.lock);
	/*
	 * a's extents first: wherever the first tick gathers the dirty list
	 * (it may fall between these writes and take one part), a's extents
	 * sort before b's in it, and so in every later one
	 */
	for (int e = 0; e < NEXT; e++)
		REQUIRE(tio_sync(va, BDEV_WRITE, (uint64_t)e * EXT, buf, EXT, 0) == 0, "write a %d", e);
	for (int e = 0; e < NEXT; e++)
		REQUIRE(tio_sync(vb, BDEV_WRITE, (uint64_t)e * EXT, buf, EXT, 0) == 0, "write b %d", e);
	/* (the cap lets one part through at most, at the first tick) */
	REQUIRE(atomic_load(&cs->dirty_blocks) * CACHE_SECTOR >= 2ull * NEXT * EXT - (128u << 10),
		"%llu bytes dirty of %u written", (unsigned long long)(atomic_load(&cs->dirty_blocks) * CACHE_SECTOR),
		2 * NEXT * EXT);

	cache_set_destage_max(cs, 0, 0);
	struct flush_arg f = { .cs = cs, .r = -1 };
	pthread_t t;
	REQUIRE(pthread_create(&t, NULL, flush_main, &f) == 0, "thread");
	pthread_join(t, NULL);
	REQUIRE(f.r == 0, "the flush did not finish: %d", f.r);
	atomic_fetch_sub(&cs->fg_inflight, 1);

	/* the backing writes, in the order they were sent */
	pthread_mutex_lock(&g_log.lock);
	g_log.on = false;
	int seq_dev[64], seq_ext[64], n = 0, parts = 0;
	for (size_t i = 0; i < g_log.n; i++) {
		struct wlog_ent *x = &g_log.e[i];
		if (x->kind != WL_SUBMIT || x->flush || (x->dev != DEV_A && x->dev != DEV_B))
			continue;
		REQUIRE(n < 64, "more backing writes than expected");
		REQUIRE(x->len <= (128u << 10), "a destage of %llu bytes while the host was busy",
			(unsigned long long)x->len);
		seq_dev[n] = x->dev;
		seq_ext[n] = (int)(x->off / EXT);
		n++;
		parts++;
	}
	pthread_mutex_unlock(&g_log.lock);
	REQUIRE(n >= 2 * NEXT * 2, "%d backing writes for %d extents of 256 KiB cut at 128 KiB", n, 2 * NEXT);
	char order[512];
	size_t o = 0;
	for (int i = 0; i < n; i++)
		o += (size_t)snprintf(order + o, sizeof(order) - o, "%s%c%d", i ? " " : "", seq_dev[i] == DEV_A ? 'a' : 'b',
				      seq_ext[i]);
	printf("backing writes in order: %s\n", order);
	int first_b = -1, last_a = -1;
	for (int i = 0; i < n; i++) {
		if (seq_dev[i] == DEV_B && first_b < 0)
			first_b = i;
		if (seq_dev[i] == DEV_A)
			last_a = i;
	}
	REQUIRE(first_b > last_a, "LUN b's destage began (write %d) before LUN a's ended (write %d): the rest of a "
		"clipped extent waited behind other extents", first_b, last_a);
	/* each extent's parts one after another */
	for (int i = 0; i < n; i++)
		for (int j = i + 2; j < n; j++)
			REQUIRE(!(seq_dev[j] == seq_dev[i] && seq_ext[j] == seq_ext[i] &&
				  (seq_dev[j - 1] != seq_dev[i] || seq_ext[j - 1] != seq_ext[i])),
				"extent %c%d was left after write %d and came back at write %d",
				seq_dev[i] == DEV_A ? 'a' : 'b', seq_ext[i], i, j);
	printf("ok: %d extents destaged in %d parts of at most 128 KiB, each extent whole before the next, "
	       "LUN a before LUN b\n", 2 * NEXT, parts);
	for (int e = 0; e < NEXT; e++) {
		REQUIRE(!memcmp(d[DEV_A]->data + (uint64_t)e * EXT, buf, EXT), "a's backing store lacks extent %d", e);
		REQUIRE(!memcmp(d[DEV_B]->data + (uint64_t)e * EXT, buf, EXT), "b's backing store lacks extent %d", e);
	}
	buf_put(buf, EXT);
	cache_set_shutdown(cs);
	bdev_close(va);
	bdev_close(vb);
	cache_set_close(cs);
	workers_stop();
	return 0;
}
