/*
 * test_cache_btab.c - the set's table of LUNs (version 4: its own pages,
 * CACHE_MAX_BACKINGS entries) and forgetting LUNs that are gone.
 *
 * 1. A set takes CACHE_MAX_BACKINGS LUNs and refuses one more, saying why;
 *    closed and opened again, every one of them attaches again (in the
 *    other order: matched by name, no new entry), and so does none more.
 * 2. A table change (lun B attached, then given dirty data) is cut by a
 *    power failure at each of its writes, whole or torn after the first
 *    page, and at every pair of points where each leg's own writes stop
 *    (the legs finish their writes independently): every image opens;
 *    a new lun Z attached first reads its own zeros (had B's entry been
 *    lost, Z would take B's id and read B's dirty data); A and B read
 *    their data; and after that one clean open, EACH LEG ALONE opens with
 *    A's and B's data (a leg whose write of the table was cut got it again).
 * 3. cache_set_prune: with lun A (dirty data) and lun B (clean data only)
 *    not attached, B's entry is freed and A's is kept; a new lun C then
 *    takes B's backing id and reads C's own data, never B's; A still
 *    reads its dirty data. The prune, C's attach and C's reads are cut by
 *    a power failure at every write: in every image C reads its own data
 *    and A its dirty data (B's slots are freed, durably, before the table
 *    that frees B's entry is written).
 */
#include "cache/cache_int.h"
#include "cache/meta.h"
#include "tests/unit/cache_test_util.h"

#define BACK_SIZE (1u << 20)
#define LEG_SIZE (16u << 20)
#define BLK 4096u

static struct cache_set_cfg cfg = {
	.name = "btab", .nlegs = 2, .extent_size = 64u << 10, .mode = CACHE_WRITE_BACK,
	.admit_hits = 1, .dirty_target = 90,
	.destage_max = 1, /* the cleaner leaves A's dirty data where it is (one extent at most goes) */
};

static uint64_t seq_of(const uint8_t *b, uint64_t lba)
{
	uint64_t s = 0;
	int k = stamp_check(b, lba, &s);
	return k == 1 ? s : k == 0 ? 0 : UINT64_MAX;
}

/* Leg alone (a copy of it), as after losing the other; checks A's data and B's. */
static void alone_check(const uint8_t *leg, const char *what);

static struct cache_set *open_set(uint8_t *leg0, uint8_t *leg1, const char *what)
{
	char err[512];
	struct mem_bdev *l[2] = { mem_borrow(1, LEG_SIZE, leg0), mem_borrow(2, LEG_SIZE, leg1) };
	struct bdev *legs[2] = { &l[0]->dev, &l[1]->dev };
	struct cache_set *cs = cache_set_open_devs(&cfg, legs, err, sizeof(err));
	REQUIRE(cs, "%s: the set does not open: %s", what, err);
	return cs;
}

static struct bdev *attach(struct cache_set *cs, const char *lun, uint8_t *data, int id, const char *what)
{
	char err[512];
	struct mem_bdev *b = mem_borrow(id, BACK_SIZE, data);
	struct bdev *v = cache_vol_open(cs, lun, &b->dev, NULL, CACHE_WRITE_BACK, err, sizeof(err));
	REQUIRE(v, "%s: lun %s does not attach: %s", what, lun, err);
	return v;
}

static void close_set(struct cache_set *cs, struct bdev **vols, int n)
{
	cache_set_shutdown(cs);
	for (int i = 0; i < n; i++)
		if (vols[i])
			bdev_close(vols[i]);
	cache_set_close(cs);
}

/* Every block of [0, nblk) of v reads seq base + block. */
static void expect(struct bdev *v, uint64_t nblk, uint64_t base, const char *lun, const char *what)
{
	uint8_t *buf = buf_get(nblk * BLK);
	REQUIRE(tio_sync(v, BDEV_READ, 0, buf, nblk * BLK, 0) == 0, "%s: read lun %s", what, lun);
	for (uint64_t b = 0; b < nblk; b++)
		for (uint64_t s = 0; s < 8; s += 7)
			REQUIRE(seq_of(buf + b * BLK + s * 512, b * 8 + s) == base + b,
				"%s: lun %s block %llu reads seq %llu, want %llu", what, lun, (unsigned long long)b,
				(unsigned long long)seq_of(buf + b * BLK + s * 512, b * 8 + s),
				(unsigned long long)(base + b));
	buf_put(buf, nblk * BLK);
}

static void stamp_store(uint8_t *data, uint64_t nblk, uint64_t base)
{
	for (uint64_t b = 0; b < nblk; b++)
		stamp_fill(data + b * BLK, b * 8, 8, base + b);
}

/* ---- 1: CACHE_MAX_BACKINGS LUNs ---- */

static void many(void)
{
	char err[512];
	uint8_t *leg[2] = { calloc(1, LEG_SIZE), calloc(1, LEG_SIZE) };
	enum { N = CACHE_MAX_BACKINGS };
	static struct bdev *v[N];
	static uint8_t *data[N + 1];
	for (int i = 0; i <= N; i++)
		data[i] = calloc(1, BACK_SIZE);
	struct cache_set *cs = open_set(leg[0], leg[1], "new set");
	for (int i = 0; i < N; i++) {
		char name[16];
		snprintf(name, sizeof(name), "lun%d", i);
		v[i] = attach(cs, name, data[i], 10 + i, "new set");
	}
	struct mem_bdev *x = mem_borrow(9, BACK_SIZE, data[N]);
	REQUIRE(!cache_vol_open(cs, "one-more", &x->dev, NULL, CACHE_WRITE_BACK, err, sizeof(err)) &&
		strstr(err, "more than 256 LUNs"), "LUN %d was taken, or refused without saying why: %s", N + 1, err);
	bdev_close(&x->dev);
	close_set(cs, v, N);

	cs = open_set(leg[0], leg[1], "opened again");
	for (int i = N - 1; i >= 0; i--) {
		char name[16];
		snprintf(name, sizeof(name), "lun%d", i);
		v[i] = attach(cs, name, data[i], 10 + i, "opened again");
		REQUIRE(cache_vol_bid((struct cache_vol *)v[i]) == (uint32_t)i, "lun%d came back as backing id %u", i,
			cache_vol_bid((struct cache_vol *)v[i]));
	}
	x = mem_borrow(9, BACK_SIZE, data[N]);
	REQUIRE(!cache_vol_open(cs, "one-more", &x->dev, NULL, CACHE_WRITE_BACK, err, sizeof(err)),
		"LUN %d was taken after a reopen", N + 1);
	bdev_close(&x->dev);
	close_set(cs, v, N);
	for (int i = 0; i <= N; i++)
		free(data[i]);
	free(leg[0]);
	free(leg[1]);
	printf("ok: %d LUNs in one set, one more refused; all %d found again by name after a reopen\n", N, N);
}

/* ---- power cuts ---- */

/* Leg images as a power cut before log entry cut leaves them (torn: entry cut reached its device as far
 * as its first page). */
static void cut_legs(uint8_t *const base[2], size_t cut, bool torn, uint8_t *out[2])
{
	for (int l = 0; l < 2; l++) {
		wlog_image(1 + l, base[l], LEG_SIZE, cut, out[l]);
		pthread_mutex_lock(&g_log.lock);
		struct wlog_ent *x = cut < g_log.n ? &g_log.e[cut] : NULL;
		if (torn && x && x->dev == 1 + l && x->kind == WL_SUBMIT && x->data)
			memcpy(out[l] + x->off, x->data, x->len < 4096 ? x->len : 4096);
		pthread_mutex_unlock(&g_log.lock);
	}
}

static void log_on(bool on)
{
	if (on)
		wlog_reset(&g_log);
	pthread_mutex_lock(&g_log.lock);
	g_log.on = on;
	pthread_mutex_unlock(&g_log.lock);
}

/* The log indices where device id got a write into the first 64 KiB (superblocks, table), and the end. */
static size_t meta_points(int id, size_t *pts, size_t max)
{
	size_t k = 0, n = wlog_len();
	pts[k++] = 0;
	for (size_t i = 0; i < n && k + 1 < max; i++)
		if (g_log.e[i].kind == WL_SUBMIT && g_log.e[i].dev == id && g_log.e[i].data && g_log.e[i].off < (64u << 10))
			pts[k++] = i + 1;
	pts[k++] = n;
	return k;
}

/* check(legs) for leg 0 cut at one of its metadata points and leg 1 at one of its own: legs that stop
 * independently. Returns how many pairs. */
static unsigned each_pair(uint8_t *const base[2], void (*check)(uint8_t *legs[2], const char *what))
{
	size_t p0[64], p1[64];
	size_t n0 = meta_points(1, p0, 64), n1 = meta_points(2, p1, 64);
	uint8_t *img[2] = { malloc(LEG_SIZE), malloc(LEG_SIZE) };
	unsigned pairs = 0;
	for (size_t a = 0; a < n0; a++)
		for (size_t b = 0; b < n1; b++) {
			wlog_image(1, base[0], LEG_SIZE, p0[a], img[0]);
			wlog_image(2, base[1], LEG_SIZE, p1[b], img[1]);
			char what[96];
			snprintf(what, sizeof(what), "leg 0 cut at write %zu, leg 1 at %zu", p0[a], p1[b]);
			check(img, what);
			pairs++;
		}
	free(img[0]);
	free(img[1]);
	return pairs;
}

/* Calls check(legs, cut, torn) for every cut point of the log, whole and torn; returns how many. */
static unsigned each_cut(uint8_t *const base[2], void (*check)(uint8_t *legs[2], const char *what))
{
	uint8_t *img[2] = { malloc(LEG_SIZE), malloc(LEG_SIZE) };
	size_t n = wlog_len();
	unsigned cuts = 0;
	for (size_t cut = 0; cut <= n; cut++) {
		if (cut < n && g_log.e[cut].kind != WL_SUBMIT)
			continue;
		for (int torn = 0; torn < 2; torn++) {
			if (torn && (cut == n || !g_log.e[cut].data || g_log.e[cut].len <= 4096))
				continue;
			cut_legs(base, cut, torn, img);
			char what[96];
			snprintf(what, sizeof(what), "cut at write %zu of %zu%s", cut, n, torn ? " (torn)" : "");
			check(img, what);
			cuts++;
		}
	}
	free(img[0]);
	free(img[1]);
	return cuts;
}

/* ---- 2 and 3: a table change, and the prune, cut ---- */

enum { A_BLK = 32, B_BLK = 8, C_BLK = 8 }; /* A: two extents dirty; B, C: one extent */
static uint8_t *a_data, *c_data;

/* B's blocks: each reads its seq (500 + block) or zeros (its write had not landed) */
static void expect_b(struct bdev *v, const char *what)
{
	uint8_t *buf = buf_get(B_BLK * BLK);
	REQUIRE(tio_sync(v, BDEV_READ, 0, buf, B_BLK * BLK, 0) == 0, "%s: read lun B", what);
	for (uint64_t b = 0; b < B_BLK; b++) {
		uint64_t s = seq_of(buf + b * BLK, b * 8);
		REQUIRE(s == 500 + b || s == 0, "%s: lun B block %llu reads seq %llu", what, (unsigned long long)b,
			(unsigned long long)s);
	}
	buf_put(buf, B_BLK * BLK);
}

static void check_change(uint8_t *legs[2], const char *what)
{
	uint8_t *a = malloc(BACK_SIZE), *b = calloc(1, BACK_SIZE), *z = calloc(1, BACK_SIZE);
	memcpy(a, a_data, BACK_SIZE);
	/* one clean open that changes nothing (no LUN attached), then each leg alone */
	struct cache_set *cs = open_set(legs[0], legs[1], what);
	close_set(cs, NULL, 0);
	alone_check(legs[0], what);
	alone_check(legs[1], what);
	cs = open_set(legs[0], legs[1], what);
	struct bdev *v[3] = { attach(cs, "Z", z, 6, what), attach(cs, "B", b, 4, what), attach(cs, "A", a, 3, what) };
	uint8_t *zb = buf_get(B_BLK * BLK);
	REQUIRE(tio_sync(v[0], BDEV_READ, 0, zb, B_BLK * BLK, 0) == 0, "%s: read lun Z", what);
	for (uint64_t k = 0; k < B_BLK; k++)
		REQUIRE(seq_of(zb + k * BLK, k * 8) == 0, "%s: new lun Z block %llu reads seq %llu, not its own zeros "
			"(it took a backing id whose data is another LUN's)", what, (unsigned long long)k,
			(unsigned long long)seq_of(zb + k * BLK, k * 8));
	buf_put(zb, B_BLK * BLK);
	expect(v[2], A_BLK, 700, "A", what);
	expect_b(v[1], what);
	close_set(cs, v, 3);
	free(a);
	free(b);
	free(z);
}

static void alone_check(const uint8_t *leg, const char *what)
{
	char err[512], w[160];
	uint8_t *copy = malloc(LEG_SIZE), *a = malloc(BACK_SIZE), *b = calloc(1, BACK_SIZE);
	memcpy(copy, leg, LEG_SIZE);
	memcpy(a, a_data, BACK_SIZE);
	snprintf(w, sizeof(w), "%s, then one leg alone", what);
	struct cache_set_cfg one = cfg;
	one.nlegs = 1;
	one.allow_single_leg = true;
	struct mem_bdev *l = mem_borrow(1, LEG_SIZE, copy);
	struct bdev *legs[1] = { &l->dev };
	struct cache_set *cs = cache_set_open_devs(&one, legs, err, sizeof(err));
	REQUIRE(cs, "%s: one leg alone does not open: %s", what, err);
	struct bdev *v[2] = { attach(cs, "A", a, 3, w), attach(cs, "B", b, 4, w) };
	expect(v[0], A_BLK, 700, "A", w);
	expect_b(v[1], w);
	close_set(cs, v, 2);
	free(copy);
	free(a);
	free(b);
}

static void check_prune(uint8_t *legs[2], const char *what)
{
	uint8_t *a = malloc(BACK_SIZE), *c = malloc(BACK_SIZE);
	memcpy(a, a_data, BACK_SIZE);
	memcpy(c, c_data, BACK_SIZE);
	struct cache_set *cs = open_set(legs[0], legs[1], what);
	struct bdev *v[2] = { attach(cs, "C", c, 5, what), attach(cs, "A", a, 3, what) };
	expect(v[0], C_BLK, 900, "C", what);
	expect(v[1], A_BLK, 700, "A", what);
	close_set(cs, v, 2);
	free(a);
	free(c);
}

static void prune(void)
{
	uint8_t *leg[2] = { calloc(1, LEG_SIZE), calloc(1, LEG_SIZE) };
	a_data = calloc(1, BACK_SIZE);
	c_data = calloc(1, BACK_SIZE);
	uint8_t *d_data = calloc(1, BACK_SIZE);
	stamp_store(c_data, C_BLK, 900);
	stamp_store(d_data, B_BLK, 800);
	uint8_t *a = malloc(BACK_SIZE), *b = calloc(1, BACK_SIZE), *c = malloc(BACK_SIZE), *d = malloc(BACK_SIZE);
	memcpy(a, a_data, BACK_SIZE);
	memcpy(d, d_data, BACK_SIZE);

	/* A (id 0) gets dirty data */
	struct cache_set *cs = open_set(leg[0], leg[1], "first run");
	struct bdev *v[3] = { attach(cs, "A", a, 3, "first run"), NULL, NULL };
	uint8_t *buf = buf_get(A_BLK * BLK);
	stamp_store(buf, A_BLK, 700);
	REQUIRE(tio_sync(v[0], BDEV_WRITE, 0, buf, A_BLK * BLK, BDEV_F_FUA) == 0, "write A");
	close_set(cs, v, 1);

	/* 2: B (id 1) attached and given dirty data, D (id 2) clean data read in from its store: cut */
	uint8_t *base[2] = { malloc(LEG_SIZE), malloc(LEG_SIZE) };
	memcpy(base[0], leg[0], LEG_SIZE);
	memcpy(base[1], leg[1], LEG_SIZE);
	log_on(true);
	cs = open_set(leg[0], leg[1], "second run");
	v[0] = attach(cs, "A", a, 3, "second run");
	v[1] = attach(cs, "B", b, 4, "second run");
	stamp_store(buf, B_BLK, 500);
	for (uint64_t k = 0; k < B_BLK; k++)
		REQUIRE(tio_sync(v[1], BDEV_WRITE, k * BLK, buf + k * BLK, BLK, BDEV_F_FUA) == 0, "write B");
	v[2] = attach(cs, "D", d, 7, "second run");
	expect(v[2], B_BLK, 800, "D", "second run"); /* read in: clean */
	REQUIRE(cs->dirty_blocks > 0, "A's data is not dirty any more: the test cannot tell a prune from a flush");
	close_set(cs, v, 3);
	log_on(false);
	unsigned cuts = each_cut(base, check_change);
	unsigned pairs = each_pair(base, check_change);
	printf("ok: a table change cut at each of its writes, whole or torn (%u images), and with the legs stopping "
	       "apart (%u pairs): each opens, a new LUN reads its own zeros, A and B their data, and each leg "
	       "alone does too after one clean open\n", cuts, pairs);

	/* 3: none attached: prune frees D (clean), keeps A and B (dirty); C takes D's id */
	memcpy(base[0], leg[0], LEG_SIZE);
	memcpy(base[1], leg[1], LEG_SIZE);
	memcpy(c, c_data, BACK_SIZE);
	log_on(true);
	cs = open_set(leg[0], leg[1], "third run");
	REQUIRE(!strcmp(cs->backing[2].lun, "D"), "D is not backing id 2 before the prune");
	int r = cache_set_prune(cs);
	REQUIRE(r == 1, "cache_set_prune freed %d entries, want 1 (D)", r);
	REQUIRE(!cs->backing[2].lun[0] && !strcmp(cs->backing[0].lun, "A") && !strcmp(cs->backing[1].lun, "B"),
		"the prune freed the wrong entry");
	v[0] = attach(cs, "C", c, 5, "third run");
	REQUIRE(cache_vol_bid((struct cache_vol *)v[0]) == 2, "C did not take D's backing id");
	expect(v[0], C_BLK, 900, "C", "third run");
	v[1] = attach(cs, "A", a, 3, "third run");
	expect(v[1], A_BLK, 700, "A", "third run");
	close_set(cs, v, 2);
	log_on(false);
	cuts = each_cut(base, check_prune);
	printf("ok: D's entry freed, A's and B's (dirty) kept; C took D's id and reads its own data; the prune cut "
	       "at each of its writes, whole or torn: %u images, C never reads D's data, A keeps its dirty data\n",
	       cuts);
	wlog_reset(&g_log);
	buf_put(buf, A_BLK * BLK);
	free(base[0]);
	free(base[1]);
	free(a);
	free(b);
	free(c);
	free(d);
	free(a_data);
	free(c_data);
	free(d_data);
	free(leg[0]);
	free(leg[1]);
}

int main(void)
{
	REQUIRE(workers_start(2) == 0, "workers");
	many();
	prune();
	workers_stop();
	return 0;
}
