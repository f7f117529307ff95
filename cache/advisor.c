/*
 * advisor.c - miniature simulations of the cache at six sizes (advisor.h).
 *
 * A copy is the real policy (cache/policy.c) over its own small slot array,
 * driven the way the engine drives it: a resident extent is a hit and is
 * touched; a miss asks the policy, and an admitted extent takes a free slot
 * or the policy's victim. The copy never holds data; a slot is a key, and
 * an open-addressing table finds the slot of a key.
 *
 * The estimate is corrected for how many reads the sample happened to get
 * (SHARDS' adjustment, Waldspurger et al., FAST'15): with R, a group that
 * saw N reads in all should have sampled E = N x R of them; a sample that
 * caught a very hot extent has many more, and every copy counts them as
 * hits. So each copy's ratio is (hits + E - sampled reads) / E: the
 * surplus (or shortfall) is taken off (or added to) the hits of every size
 * alike. In the Zipf test this takes the error from up to 14 points to 1.
 * N is counted per group in per-thread stripes (no shared line written).
 *
 * A sampled access goes into its thread's ring first; then, if the lock
 * is free, the thread takes it and runs the rings' oldest accesses, its
 * own and the other threads', through the copies (RUN_BATCH at most, so
 * no host command carries much of the others' work: a sampled access
 * costs 0.2 to 2 us, hits to misses). A try-lock alone
 * would starve a thread: with every access sampled, one worker kept
 * winning and the other's accesses were all dropped, and with them the
 * curve of the LUN it serves. An access is dropped only when its ring is
 * full, or for a thread past the STRIPES with rings of their own, when
 * the lock is taken (hosts with more than 8 workers: their later workers'
 * samples may be thinned under load; counted in dropped).
 *
 * Counts decay: when a group has counted ADVISOR_WINDOW sampled reads, its
 * counts (N included) are halved, so the curve follows the workload of the
 * last few windows rather than everything since the daemon started.
 */
#include "cache/advisor.h"
#include "common/hash.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define ADVISOR_WINDOW   (1u << 20)   /* sampled reads per halving */
#define SAMPLE_SALT      0x2545f4914f6cdd1dull
#define NO_SLOT          POLICY_NO_SLOT

const double advisor_scale[ADVISOR_SIZES] = { 0.25, 0.5, 1, 2, 4, 8 };

struct copy {
	struct policy *p;
	uint32_t nslots, used;
	uint64_t *key;          /* per slot */
	uint32_t *tab;          /* slot + 1, 0 = empty; linear probing */
	uint32_t mask;
	uint64_t hits;          /* read hits (decayed with the group's reads) */
};

struct group {
	struct copy c[ADVISOR_SIZES];
	uint64_t reads;         /* sampled reads */
	uint64_t all_base;      /* the group's read count at the last halving */
	uint64_t all_carry;     /* reads before it, halved at each halving */
	uint64_t lost_base, lost_carry; /* the same for sampled reads dropped */
};

#define STRIPES 8u              /* read counters, one per thread (mod STRIPES) */
#define NGROUPS (ADVISOR_MAX_LUNS + 1) /* [0] the set, [1 + bid] a LUN */

#define RING 512u               /* sampled accesses waiting per thread */
#define RUN_BATCH 4u            /* run by one note at most: a few microseconds */

struct sample {
	uint64_t key, offset;
	struct policy_run run;
	bool is_write;
	bool may_admit;
};

struct stripe {
	_Alignas(64) _Atomic uint64_t reads[NGROUPS];
	/* single producer (the thread), single consumer (the lock holder) */
	_Alignas(64) _Atomic uint32_t tail;
	_Alignas(64) _Atomic uint32_t head;
	struct sample ring[RING];
};

struct advisor {
	struct policy_cfg pcfg;
	uint32_t nslots;
	uint64_t thresh;        /* sampled when the key's 32-bit hash is below */
	double rate;
	uint32_t copy_slots[ADVISOR_SIZES];
	struct stripe stripe[STRIPES];
	_Atomic uint64_t lost[NGROUPS]; /* sampled reads dropped, per group (rare: atomics) */
	pthread_mutex_t lock;
	unsigned turn;          /* the ring run_rings starts with */   /* the copies and counts below */
	struct group set;
	struct group *lun[ADVISOR_MAX_LUNS];
	uint64_t sampled;
	_Atomic uint64_t dropped;
};

/* ---- one copy ---------------------------------------------------------- */

static uint32_t tab_home(const struct copy *c, uint64_t key)
{
	return (uint32_t)hash_mix64(key) & c->mask;
}

static uint32_t copy_find(const struct copy *c, uint64_t key)
{
	for (uint32_t i = tab_home(c, key);; i = (i + 1) & c->mask) {
		uint32_t e = c->tab[i];
		if (!e)
			return NO_SLOT;
		if (c->key[e - 1] == key)
			return e - 1;
	}
}

static void tab_put(struct copy *c, uint64_t key, uint32_t slot)
{
	uint32_t i = tab_home(c, key);
	while (c->tab[i])
		i = (i + 1) & c->mask;
	c->tab[i] = slot + 1;
}

/* Remove key's entry; later entries of its run shift back (no tombstones). */
static void tab_del(struct copy *c, uint64_t key)
{
	uint32_t i = tab_home(c, key);
	while (c->tab[i] && c->key[c->tab[i] - 1] != key)
		i = (i + 1) & c->mask;
	if (!c->tab[i])
		return;
	for (uint32_t j = i;;) {
		c->tab[i] = 0;
		for (;;) {
			j = (j + 1) & c->mask;
			if (!c->tab[j])
				return;
			uint32_t h = tab_home(c, c->key[c->tab[j] - 1]);
			/* move j back to i unless its home lies cyclically in (i, j] */
			if (i <= j ? (h <= i || h > j) : (h <= i && h > j))
				break;
		}
		c->tab[i] = c->tab[j];
		i = j;
	}
}

static bool always_clean(uint32_t slot, void *arg)
{
	(void)slot;
	(void)arg;
	return true;
}

static void copy_access(struct copy *c, const struct sample *x)
{
	uint64_t key = x->key;
	uint32_t s = copy_find(c, key);
	if (s != NO_SLOT) {
		c->hits += !x->is_write;
		policy_touch(c->p, s);
		return;
	}
	if (!x->may_admit || !policy_admit_run(c->p, key, x->offset, &x->run, x->is_write))
		return;
	if (c->used < c->nslots) {
		s = c->used++;
	} else {
		s = policy_victim(c->p, always_clean, NULL);
		if (s == NO_SLOT)
			return;
		tab_del(c, c->key[s]);
	}
	c->key[s] = key;
	tab_put(c, key, s);
	policy_insert(c->p, s, key);
}

static void copy_free(struct copy *c)
{
	policy_free(c->p);
	free(c->key);
	free(c->tab);
	memset(c, 0, sizeof(*c));
}

static int copy_init(struct copy *c, const struct policy_cfg *pcfg, uint32_t nslots)
{
	struct policy_cfg pc = *pcfg;
	uint32_t cap = 16;

	memset(c, 0, sizeof(*c));
	while (cap < 2 * nslots)
		cap *= 2;
	pc.nslots = nslots;
	c->nslots = nslots;
	c->mask = cap - 1;
	c->p = policy_new(&pc);
	c->key = calloc(nslots, sizeof(*c->key));
	c->tab = calloc(cap, sizeof(*c->tab));
	if (!c->p || !c->key || !c->tab) {
		copy_free(c);
		return -ENOMEM;
	}
	return 0;
}

static uint64_t copy_mem(const struct copy *c)
{
	return c->p ? policy_mem_bytes(c->p) + (uint64_t)c->nslots * sizeof(*c->key) +
			      ((uint64_t)c->mask + 1) * sizeof(*c->tab)
		    : 0;
}

/* ---- groups ------------------------------------------------------------ */

/* Sampled reads of group gi dropped since the advisor started. */
static uint64_t lost_reads(const struct advisor *a, unsigned gi)
{
	return atomic_load_explicit(&a->lost[gi], memory_order_relaxed);
}

/* Reads of group gi (all, sampled or not) since the advisor started. */
static uint64_t all_reads(const struct advisor *a, unsigned gi)
{
	uint64_t n = 0;
	for (unsigned i = 0; i < STRIPES; i++)
		n += atomic_load_explicit(&a->stripe[i].reads[gi], memory_order_relaxed);
	return n;
}

static void group_free(struct group *g)
{
	for (int i = 0; i < ADVISOR_SIZES; i++)
		copy_free(&g->c[i]);
	g->reads = 0;
}

static int group_init(struct group *g, const struct advisor *a, unsigned gi)
{
	memset(g, 0, sizeof(*g));
	g->all_base = all_reads(a, gi);
	g->lost_base = lost_reads(a, gi);
	for (int i = 0; i < ADVISOR_SIZES; i++)
		if (copy_init(&g->c[i], &a->pcfg, a->copy_slots[i]) < 0) {
			group_free(g);
			return -ENOMEM;
		}
	return 0;
}

/* Reads of the group since its curve began, decayed like its counts. */
static uint64_t group_all(const struct advisor *a, const struct group *g, unsigned gi)
{
	return g->all_carry + (all_reads(a, gi) - g->all_base);
}

static void group_access(struct advisor *a, struct group *g, unsigned gi, const struct sample *x)
{
	for (int i = 0; i < ADVISOR_SIZES; i++)
		copy_access(&g->c[i], x);
	if (x->is_write)
		return;
	if (++g->reads >= ADVISOR_WINDOW) {
		g->reads /= 2;
		for (int i = 0; i < ADVISOR_SIZES; i++)
			g->c[i].hits /= 2;
		uint64_t now = all_reads(a, gi), lost = lost_reads(a, gi);
		g->all_carry = (g->all_carry + now - g->all_base) / 2;
		g->all_base = now;
		g->lost_carry = (g->lost_carry + lost - g->lost_base) / 2;
		g->lost_base = lost;
	}
}

/*
 * A dropped sampled read (its thread's ring was full) is counted in N but
 * never reached the copies: it is taken as hitting at each copy's own
 * ratio (the copies' hits scaled up by sampled/seen), not as a surplus of
 * the sample, which the adjustment would have counted as a hit everywhere.
 */
static void group_curve(const struct advisor *a, const struct group *g, unsigned gi, struct advisor_curve *c)
{
	double expect = (double)group_all(a, g, gi) * a->rate;
	double lost = (double)(g->lost_carry + (lost_reads(a, gi) - g->lost_base));
	double seen = (double)g->reads, sampled = seen + lost;
	double extra = expect - sampled;

	c->on = true;
	c->reads = g->reads;
	for (int i = 0; i < ADVISOR_SIZES; i++) {
		double hits = seen > 0 ? (double)g->c[i].hits * sampled / seen : 0.0;
		double r = expect >= 1 ? (hits + extra) / expect : 0.0;
		c->ratio[i] = r < 0 ? 0 : r > 1 ? 1 : r;
	}
}

/* A number per thread, the same for every advisor: its stripe while below STRIPES. */
static unsigned thread_index(void)
{
	static _Atomic unsigned next;
	static _Thread_local unsigned mine = UINT32_MAX;
	if (mine == UINT32_MAX)
		mine = atomic_fetch_add_explicit(&next, 1, memory_order_relaxed);
	return mine;
}

static uint64_t group_mem(const struct group *g)
{
	uint64_t m = sizeof(*g);
	for (int i = 0; i < ADVISOR_SIZES; i++)
		m += copy_mem(&g->c[i]);
	return m;
}

/* ---- the advisor ------------------------------------------------------- */

struct advisor *advisor_new(const struct advisor_cfg *cfg)
{
	if (!cfg || !cfg->nslots || !cfg->policy.extent_size)
		return NULL;
	size_t size = (sizeof(struct advisor) + 63) / 64 * 64;
	struct advisor *a = aligned_alloc(64, size);
	if (!a)
		return NULL;
	memset(a, 0, size);
	uint32_t want = cfg->sample_slots ? cfg->sample_slots : ADVISOR_SAMPLE_SLOTS;
	a->pcfg = cfg->policy;
	a->nslots = cfg->nslots;
	a->rate = want >= cfg->nslots ? 1.0 : (double)want / (double)cfg->nslots;
	a->thresh = (uint64_t)ldexp(a->rate, 32);
	for (int i = 0; i < ADVISOR_SIZES; i++) {
		double s = advisor_scale[i] * cfg->nslots * a->rate;
		a->copy_slots[i] = s < 1 ? 1 : (uint32_t)llround(s);
	}
	pthread_mutex_init(&a->lock, NULL);
	if (group_init(&a->set, a, 0) < 0) {
		advisor_free(a);
		return NULL;
	}
	return a;
}

void advisor_free(struct advisor *a)
{
	if (!a)
		return;
	for (int i = 0; i < ADVISOR_MAX_LUNS; i++)
		if (a->lun[i]) {
			group_free(a->lun[i]);
			free(a->lun[i]);
		}
	group_free(&a->set);
	pthread_mutex_destroy(&a->lock);
	free(a);
}

static void run_rings(struct advisor *a, uint32_t max);

int advisor_add(struct advisor *a, uint32_t bid)
{
	if (bid >= ADVISOR_MAX_LUNS)
		return -EINVAL;
	int have = 0;
	pthread_mutex_lock(&a->lock);
	for (int i = 0; i < ADVISOR_MAX_LUNS; i++)
		have += a->lun[i] && i != (int)bid;
	pthread_mutex_unlock(&a->lock);
	if (have >= ADVISOR_MAX_CURVES)
		return -ENOSPC;
	struct group *g = malloc(sizeof(*g));
	if (!g || group_init(g, a, 1 + bid) < 0) {
		free(g);
		return -ENOMEM;
	}
	pthread_mutex_lock(&a->lock);
	struct group *old = a->lun[bid];
	a->lun[bid] = g;
	pthread_mutex_unlock(&a->lock);
	if (old) {
		group_free(old);
		free(old);
	}
	return 0;
}

void advisor_drop(struct advisor *a, uint32_t bid)
{
	if (bid >= ADVISOR_MAX_LUNS)
		return;
	pthread_mutex_lock(&a->lock);
	run_rings(a, UINT32_MAX); /* its queued accesses go to its group, not a successor's */
	struct group *g = a->lun[bid];
	a->lun[bid] = NULL;
	pthread_mutex_unlock(&a->lock);
	if (g) {
		group_free(g);
		free(g);
	}
}

/* Under the lock: one sampled access through the set's and its LUN's copies. */
static void run_sample(struct advisor *a, const struct sample *s)
{
	uint32_t bid = (uint32_t)(s->key >> 40);
	a->sampled++;
	group_access(a, &a->set, 0, s);
	if (bid < ADVISOR_MAX_LUNS && a->lun[bid])
		group_access(a, a->lun[bid], 1 + bid, s);
}

/* A sampled access that reaches no copy: counted, and for a read, per group. */
static void drop_sample(struct advisor *a, const struct sample *s)
{
	uint32_t bid = (uint32_t)(s->key >> 40);
	atomic_fetch_add_explicit(&a->dropped, 1, memory_order_relaxed);
	if (s->is_write)
		return;
	atomic_fetch_add_explicit(&a->lost[0], 1, memory_order_relaxed);
	if (bid < ADVISOR_MAX_LUNS)
		atomic_fetch_add_explicit(&a->lost[1 + bid], 1, memory_order_relaxed);
}

/*
 * Under the lock: run up to max waiting samples, oldest first in each
 * ring, one ring after the other in turn (taking a ring whole first would
 * starve the others' and fill them).
 */
static void run_rings(struct advisor *a, uint32_t max)
{
	uint32_t h[STRIPES], t[STRIPES];
	for (unsigned i = 0; i < STRIPES; i++) {
		h[i] = atomic_load_explicit(&a->stripe[i].head, memory_order_relaxed);
		t[i] = atomic_load_explicit(&a->stripe[i].tail, memory_order_acquire);
	}
	for (bool any = true; any && max;) {
		any = false;
		for (unsigned k = 0; k < STRIPES && max; k++) {
			unsigned i = (a->turn + k) % STRIPES;
			if (h[i] == t[i])
				continue;
			run_sample(a, &a->stripe[i].ring[h[i]++ % RING]);
			max--;
			any = true;
		}
		a->turn++;
	}
	for (unsigned i = 0; i < STRIPES; i++)
		atomic_store_explicit(&a->stripe[i].head, h[i], memory_order_release);
}

void advisor_note(struct advisor *a, uint64_t key, uint64_t offset, const struct policy_run *run,
		  bool is_write, bool may_admit)
{
	uint32_t bid = (uint32_t)(key >> 40);
	unsigned me = thread_index();
	struct stripe *st = &a->stripe[me % STRIPES];

	if (!is_write) {
		atomic_fetch_add_explicit(&st->reads[0], 1, memory_order_relaxed);
		if (bid < ADVISOR_MAX_LUNS)
			atomic_fetch_add_explicit(&st->reads[1 + bid], 1, memory_order_relaxed);
	}
	if (hash_mix64(key ^ SAMPLE_SALT) >> 32 >= a->thresh)
		return;
	struct sample s = { key, offset, *run, is_write, may_admit };
	if (me >= STRIPES) {
		/* no ring of its own: the try-lock, or the sample is dropped
		 * (a worker never waits here) */
		if (pthread_mutex_trylock(&a->lock)) {
			drop_sample(a, &s);
			return;
		}
		run_sample(a, &s);
		run_rings(a, RUN_BATCH);
		pthread_mutex_unlock(&a->lock);
		return;
	}
	uint32_t t = atomic_load_explicit(&st->tail, memory_order_relaxed);
	if (t - atomic_load_explicit(&st->head, memory_order_acquire) >= RING) {
		drop_sample(a, &s);
	} else {
		st->ring[t % RING] = s;
		atomic_store_explicit(&st->tail, t + 1, memory_order_release);
	}
	if (pthread_mutex_trylock(&a->lock))
		return; /* the holder, or the next note, runs it */
	run_rings(a, RUN_BATCH);
	pthread_mutex_unlock(&a->lock);
}

void advisor_get(struct advisor *a, struct advisor_report *r)
{
	memset(r, 0, sizeof(*r));
	r->rate = a->rate;
	r->nslots = a->nslots;
	memcpy(r->copy_slots, a->copy_slots, sizeof(r->copy_slots));
	r->dropped = atomic_load_explicit(&a->dropped, memory_order_relaxed);
	r->mem_bytes = sizeof(*a);
	pthread_mutex_lock(&a->lock);
	run_rings(a, UINT32_MAX);
	r->sampled = a->sampled;
	group_curve(a, &a->set, 0, &r->set);
	r->mem_bytes += group_mem(&a->set);
	for (int i = 0; i < ADVISOR_MAX_LUNS; i++)
		if (a->lun[i]) {
			group_curve(a, a->lun[i], 1 + (unsigned)i, &r->lun[i]);
			r->mem_bytes += group_mem(a->lun[i]);
		}
	pthread_mutex_unlock(&a->lock);
}

/* Empty a group's copies: a fresh policy each (the slot arrays are kept). */
static void group_clear(struct group *g, const struct advisor *a, unsigned gi)
{
	for (int i = 0; i < ADVISOR_SIZES; i++) {
		struct copy *c = &g->c[i];
		struct policy_cfg pc = a->pcfg;
		pc.nslots = c->nslots;
		struct policy *np = policy_new(&pc);
		if (np) {
			policy_free(c->p);
			c->p = np;
		} else {
			for (uint32_t s = 0; s < c->used; s++)
				policy_remove(c->p, s);
		}
		c->used = 0;
		c->hits = 0;
		memset(c->tab, 0, ((size_t)c->mask + 1) * sizeof(*c->tab));
	}
	g->reads = 0;
	g->all_carry = 0;
	g->all_base = all_reads(a, gi);
	g->lost_carry = 0;
	g->lost_base = lost_reads(a, gi);
}

void advisor_reset(struct advisor *a)
{
	pthread_mutex_lock(&a->lock);
	run_rings(a, UINT32_MAX); /* accesses before the reset count before it */
	group_clear(&a->set, a, 0);
	for (int i = 0; i < ADVISOR_MAX_LUNS; i++)
		if (a->lun[i])
			group_clear(a->lun[i], a, 1 + (unsigned)i);
	a->sampled = 0;
	pthread_mutex_unlock(&a->lock);
	atomic_store_explicit(&a->dropped, 0, memory_order_relaxed);
}

double advisor_size_for(const struct advisor_curve *c, double target)
{
	if (c->ratio[0] >= target)
		return advisor_scale[0];
	for (int i = 1; i < ADVISOR_SIZES; i++) {
		if (c->ratio[i] < target)
			continue;
		/* between sizes i-1 and i, linear in log2(size) */
		double lo = c->ratio[i - 1], hi = c->ratio[i];
		double f = hi > lo ? (target - lo) / (hi - lo) : 1.0;
		return advisor_scale[i - 1] * pow(2.0, f * log2(advisor_scale[i] / advisor_scale[i - 1]));
	}
	return 0;
}
