/*
 * test_cache_powercut.c - no acknowledged write is lost at any power cut.
 *
 * OCF's surprise-shutdown method: run a short write-back workload (writes
 * of 1..32 sectors, UNMAPs, promotions by reads, a destage by flush) on a
 * cache set whose legs and backing store are RAM devices that log every
 * write and flush. Then, for every index k of that log, rebuild the three
 * device images as a power cut after k would leave them (later writes,
 * and non-FUA writes without a later flush, dropped), open the set
 * (recovery), and read every sector back through the cache volume:
 *  - a sector whose last write (or UNMAP) was acknowledged before k must
 *    hold that write's stamp, or a later write's;
 *  - no sector may hold garbage (a stamp with a wrong checksum or LBA).
 * Writes without FUA count as acknowledged when the FLUSH after them
 * completes (SCSI's rule with the write cache on). TC_LONG=1 uses a
 * longer workload.
 */
#include "cache_test_util.h"

#define BACK_SIZE (4u << 20)
#define LEG_SIZE (8u << 20)
#define NSECT (BACK_SIZE / 512)

struct event {
	uint64_t seq;
	size_t ack;     /* log index at acknowledgement */
	bool unmap;
};

struct sector_hist {
	struct event *e;
	int n, cap;
};

static struct sector_hist hist[NSECT];
static uint8_t *init_img[3];

static void add_event(uint64_t lba, uint32_t n, uint64_t seq, size_t ack, bool unmap)
{
	for (uint32_t i = 0; i < n; i++) {
		struct sector_hist *h = &hist[lba + i];
		if (h->n == h->cap) {
			h->cap = h->cap ? h->cap * 2 : 4;
			h->e = realloc(h->e, (size_t)h->cap * sizeof(*h->e));
		}
		h->e[h->n++] = (struct event){ seq, ack, unmap };
	}
}

static struct cache_set_cfg cfg = {
	.name = "pc",
	.nlegs = 2,
	.extent_size = 64u << 10,
	.mode = CACHE_WRITE_BACK,
	.admit_hits = 1,
	.dirty_target = 10,
};

static struct cache_set *open_set(struct mem_bdev **b, struct mem_bdev **l0, struct mem_bdev **l1,
				  struct bdev **vol, const uint8_t *img[3])
{
	char err[512];
	*b = mem_new(0, BACK_SIZE, img ? img[0] : NULL);
	*l0 = mem_new(1, LEG_SIZE, img ? img[1] : NULL);
	*l1 = mem_new(2, LEG_SIZE, img ? img[2] : NULL);
	struct bdev *legs[2] = { &(*l0)->dev, &(*l1)->dev };
	struct cache_set *cs = cache_set_open_devs(&cfg, legs, err, sizeof(err));
	REQUIRE(cs, "open: %s", err);
	*vol = cache_vol_open(cs, "lun0", &(*b)->dev, NULL, CACHE_WRITE_BACK, err, sizeof(err));
	REQUIRE(*vol, "attach: %s", err);
	return cs;
}

static uint64_t rnd_state = 88172645463325252ull;
static uint64_t rnd(void) { return tc_xorshift(&rnd_state); }

static int verify_cut(size_t cut)
{
	const uint8_t *img[3];
	uint8_t *tmp[3];
	uint64_t sizes[3] = { BACK_SIZE, LEG_SIZE, LEG_SIZE };
	for (int d = 0; d < 3; d++) {
		tmp[d] = malloc(sizes[d]);
		wlog_image(d, init_img[d], sizes[d], cut, tmp[d]);
		img[d] = tmp[d];
	}
	struct mem_bdev *b, *l0, *l1;
	struct bdev *vol;
	struct cache_set *cs = open_set(&b, &l0, &l1, &vol, img);
	for (int d = 0; d < 3; d++)
		free(tmp[d]);
	uint8_t *buf = buf_get(64u << 10);
	int bad = 0;
	for (uint64_t off = 0; off < BACK_SIZE; off += 64u << 10) {
		int r = tio_sync(vol, BDEV_READ, off, buf, 64u << 10, 0);
		REQUIRE(r == 0, "cut %zu: read at %llu failed: %d", cut, (unsigned long long)off, r);
		for (uint32_t i = 0; i < 128; i++) {
			uint64_t lba = off / 512 + i;
			uint64_t seq = 0;
			int k = stamp_check(buf + (size_t)i * 512, lba, &seq);
			struct sector_hist *h = &hist[lba];
			int last = -1;
			for (int j = 0; j < h->n; j++)
				if (h->e[j].ack <= cut)
					last = j;
			bool ok;
			if (k < 0) {
				ok = false;
			} else if (last < 0) {
				ok = true; /* nothing acknowledged: old, new or zero */
			} else {
				/* the acknowledged state or any later event */
				ok = false;
				for (int j = last; j < h->n && !ok; j++)
					ok = h->e[j].unmap ? k == 0 : (k == 1 && seq == h->e[j].seq);
			}
			if (!ok) {
				if (bad < 5)
					fprintf(stderr, "cut %zu: lba %llu holds %s seq %llu; last acknowledged: %s seq %llu\n",
						cut, (unsigned long long)lba, k < 0 ? "garbage" : k == 0 ? "zeroes" : "stamp",
						(unsigned long long)seq,
						last < 0 ? "none" : h->e[last].unmap ? "unmap" : "write",
						last < 0 ? 0ull : (unsigned long long)h->e[last].seq);
				bad++;
			}
		}
	}
	buf_put(buf, 64u << 10);
	cache_set_shutdown(cs);
	bdev_close(vol);
	cache_set_close(cs);
	return bad;
}

int main(void)
{
	bool long_run = getenv("TC_LONG") != NULL;
	int nbatches = long_run ? 80 : 30;
	REQUIRE(workers_start(getenv("TC_TEST_WORKERS") ? (unsigned)atoi(getenv("TC_TEST_WORKERS")) : 2) == 0, "workers");

	struct mem_bdev *b, *l0, *l1;
	struct bdev *vol;
	struct cache_set *cs = open_set(&b, &l0, &l1, &vol, NULL);
	init_img[0] = malloc(BACK_SIZE);
	init_img[1] = malloc(LEG_SIZE);
	init_img[2] = malloc(LEG_SIZE);
	/* pre-existing backing data: stamps with seq 0 in the first half */
	for (uint64_t off = 0; off < BACK_SIZE / 2; off += 512)
		stamp_fill(b->data + off, off / 512, 1, 0);
	memcpy(init_img[0], b->data, BACK_SIZE);
	memcpy(init_img[1], l0->data, LEG_SIZE);
	memcpy(init_img[2], l1->data, LEG_SIZE);
	for (uint64_t s = 0; s < NSECT / 2; s++)
		add_event(s, 1, 0, 0, false);
	pthread_mutex_lock(&g_log.lock);
	g_log.on = true;
	pthread_mutex_unlock(&g_log.lock);

	uint64_t seq = 1;
	uint8_t *bufs[8];
	for (int i = 0; i < 8; i++)
		bufs[i] = buf_get(16u << 10);
	uint8_t *rbuf = buf_get(64u << 10);
	for (int batch = 0; batch < nbatches; batch++) {
		struct tio t[8];
		uint64_t lba[8];
		uint32_t n[8];
		bool unmap[8];
		_Atomic int out = 0;
		int k = 0;
		for (int i = 0; i < 8; i++) {
			n[i] = 1 + (uint32_t)(rnd() % 32);
			lba[i] = rnd() % (NSECT - n[i]);
			unmap[i] = rnd() % 16 == 0;
			bool overlap = false;
			for (int j = 0; j < k; j++)
				if (lba[i] < lba[j] + n[j] && lba[j] < lba[i] + n[i])
					overlap = true;
			if (overlap)
				continue;
			lba[k] = lba[i];
			n[k] = n[i];
			unmap[k] = unmap[i];
			if (unmap[k]) {
				tio_submit(&t[k], vol, BDEV_WRITE_ZEROES, lba[k] * 512, NULL, n[k] * 512, 0, &out, k);
			} else {
				stamp_fill(bufs[k], lba[k], n[k], seq + (uint64_t)k);
				tio_submit(&t[k], vol, BDEV_WRITE, lba[k] * 512, bufs[k], n[k] * 512,
					   (rnd() & 1) ? BDEV_F_FUA : 0, &out, k);
			}
			k++;
		}
		while (atomic_load(&out))
			usleep(50);
		/*
		 * A write without FUA must be durable only after the next
		 * FLUSH (SYNCHRONIZE CACHE) completes: that is its ack.
		 */
		bool any_volatile = false;
		for (int i = 0; i < k; i++)
			if (!unmap[i] && !(t[i].req.flags & BDEV_F_FUA))
				any_volatile = true;
		size_t flush_ack = 0;
		if (any_volatile) {
			struct tio f;
			tio_submit(&f, vol, BDEV_FLUSH, 0, NULL, 0, 0, NULL, batch);
			while (!atomic_load(&f.done))
				usleep(50);
			REQUIRE(f.err == 0, "flush failed: %d", f.err);
			flush_ack = f.ack_index;
		}
		for (int i = 0; i < k; i++) {
			REQUIRE(t[i].err == 0, "workload write failed: %d", t[i].err);
			size_t ack = (!unmap[i] && !(t[i].req.flags & BDEV_F_FUA)) ? flush_ack : t[i].ack_index;
			add_event(lba[i], n[i], unmap[i] ? 0 : seq + (uint64_t)i, ack, unmap[i]);
		}
		seq += 8;
		if (batch % 5 == 2) {
			/* reads twice: promotion of a whole extent (fill) */
			uint64_t off = (rnd() % (BACK_SIZE / (64u << 10))) * (64u << 10);
			REQUIRE(tio_sync(vol, BDEV_READ, off, rbuf, 64u << 10, 0) == 0, "read");
			REQUIRE(tio_sync(vol, BDEV_READ, off, rbuf, 64u << 10, 0) == 0, "read");
		}
		if (batch == nbatches / 2)
			REQUIRE(cache_set_flush(cs, 20000) == 0, "flush did not finish");
	}
	/* let the last fills finish, then stop logging */
	usleep(200000);
	size_t total = wlog_len();
	pthread_mutex_lock(&g_log.lock);
	g_log.on = false;
	pthread_mutex_unlock(&g_log.lock);
	cache_set_shutdown(cs);
	bdev_close(vol);
	cache_set_close(cs);
	printf("workload: %d batches, %zu logged device writes\n", nbatches, total);

	if (getenv("PC_DEBUG")) {
		uint64_t dl = strtoull(getenv("PC_DEBUG"), NULL, 0);
		for (int j = 0; j < hist[dl].n; j++)
			fprintf(stderr, "lba %llu event seq %llu ack %zu unmap %d\n", (unsigned long long)dl,
				(unsigned long long)hist[dl].e[j].seq, hist[dl].e[j].ack, hist[dl].e[j].unmap);
		for (size_t i = 0; i < total; i++)
			fprintf(stderr, "log %zu dev %d %s fua %d off %llu len %llu\n", i, g_log.e[i].dev,
				g_log.e[i].flush ? "FLUSH" : "write", g_log.e[i].fua,
				(unsigned long long)g_log.e[i].off, (unsigned long long)g_log.e[i].len);
	}
	int failures = 0;
	size_t step = 1;
	for (size_t cut = 0; cut <= total; cut += step) {
		int bad = verify_cut(cut);
		if (bad) {
			fprintf(stderr, "cut %zu: %d sectors wrong\n", cut, bad);
			failures++;
			if (failures > 3)
				break;
		}
	}
	REQUIRE(failures == 0, "%d power-cut points lost acknowledged data", failures);
	printf("ok: %zu power-cut points recovered, 0 acknowledged writes lost, no garbage\n", total + 1);
	workers_stop();
	return 0;
}
