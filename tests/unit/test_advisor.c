/*
 * test_advisor.c - the cache-sizing advisor (cache/advisor.c) against the
 * truth: the same trace replayed through the real policy at each full size.
 *
 * The replay drives cache/policy.c the way the engine does (a resident
 * extent is a hit and is touched, a miss asks policy_admit, an admitted
 * extent takes a free slot or a victim); the advisor sees the same accesses
 * through advisor_note, as the daemon feeds it. For every size (1/4 .. 8
 * times today's) the advisor's read hit ratio must be within 5 points of
 * the replay's, for the set and for each LUN alone in a private cache; and
 * each workload's replay must span at least 30 points across the sizes (a
 * flat curve would make any estimate look good).
 *
 * Workloads (256 KiB extents, today's cache 40,000 extents, so the advisor
 * samples about one extent in ten):
 *   zipf+scans  two LUNs: LUN 1 Zipf(0.9) over 400k extents, 4 KiB, 20%
 *               writes, with a sequential scan of 50k extents after every
 *               200k requests (a backup beside the hot set); LUN 2 a loop
 *               over 30k extents in a fixed random order plus one-touch
 *               random reads.
 *   TRACE [N [S]]  with an argument: a recorded trace ("R|W LUN OFFSET
 *               LEN" per line, bytes; tierctl trace writes them;
 *               tests/data/advisor/), at the size its header names
 *               ("# nslots N") or N slots; S: the advisor's copies at 1x
 *               have S slots (sampling rate S/N) instead of 4096.
 *
 * Prints the curves side by side, the advisor's memory, and its CPU time per
 * million accesses (not asserted: this machine is noisy).
 */
#include "tests/unit/check.h"
#include "cache/advisor.h"
#include "cache/policy.h"
#include "tests/unit/zipf.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint32_t EXTENT = 256u * 1024; /* a trace may name another ("# extent N") */
/* the set's policy settings; a trace may name others ("# admit_hits N", "# seq_cutoff N") */
static uint32_t ADMIT_HITS = 1;
static uint64_t SEQ_CUTOFF = 4u << 20;
#define NSLOTS     40000u
#define MAX_POINTS 0.05
#define MIN_SPAN   0.30
#define NLUNS      3           /* backing ids 1 and 2 */
/* per LUN: writes may be admitted (write-back); a trace names each LUN's mode */
static bool WRITES_ADMIT[NLUNS] = { true, true, true };

struct acc {
	uint64_t off;
	uint32_t len;
	uint8_t lun;
	uint8_t write;
};

struct trace {
	struct acc *a;
	size_t n, cap;
	uint64_t max_ext;
	bool has_lun[NLUNS];
};

static void push(struct trace *t, uint8_t lun, bool write, uint64_t off, uint32_t len)
{
	if (t->n == t->cap) {
		t->cap = t->cap ? 2 * t->cap : 1 << 20;
		t->a = realloc(t->a, t->cap * sizeof(*t->a));
		if (!t->a) {
			perror("realloc");
			exit(2);
		}
	}
	t->a[t->n++] = (struct acc){ off, len, lun, write };
	t->has_lun[lun] = true;
	if ((off + len - 1) / EXTENT > t->max_ext)
		t->max_ext = (off + len - 1) / EXTENT;
}

static void small_io(struct trace *t, uint8_t lun, bool write, uint64_t ext, uint64_t *rng)
{
	push(t, lun, write, ext * EXTENT + (splitmix(rng) % (EXTENT / 4096)) * 4096, 4096);
}

static void make_zipf_scans(struct trace *t, size_t nreq)
{
	uint64_t rng = 0xad715e5;
	struct zipf z;
	const uint32_t zn = 400000, loop_n = 30000;
	zipf_init(&z, zn, 0.9, &rng);
	uint32_t *loop = malloc(loop_n * sizeof(uint32_t));
	for (uint32_t i = 0; i < loop_n; i++)
		loop[i] = i;
	shuffle32(loop, loop_n, &rng);
	uint64_t one_touch = 1000000, loop_pos = 0;
	for (size_t i = 0; t->n < nreq; i++) {
		if (i % 200000 == 199999) {
			uint64_t start = splitmix(&rng) % zn;
			for (uint32_t k = 0; k < 50000; k++)
				push(t, 1, false, ((start + k) % zn) * EXTENT, EXTENT);
			continue;
		}
		uint64_t d = splitmix(&rng) % 100;
		if (d < 70)
			small_io(t, 1, d < 14, zipf_next(&z, &rng), &rng);
		else if (d < 92)
			small_io(t, 2, false, loop[loop_pos++ % loop_n], &rng);
		else
			small_io(t, 2, false, one_touch++, &rng);
	}
	free(loop);
	zipf_free(&z);
}

/* ---- the truth: the real policy at full size --------------------------- */

struct replay {
	uint64_t reads, hits;
};

static bool always_clean(uint32_t slot, void *arg)
{
	(void)slot;
	(void)arg;
	return true;
}

static struct policy_cfg set_policy(void)
{
	/* as cache/set.c configures the set's policy by default */
	return (struct policy_cfg){ .admit_hits = ADMIT_HITS, .seq_cutoff = SEQ_CUTOFF, .extent_size = EXTENT,
				    .write_admit_hits = 1 };
}

/* Replay the accesses of lun (0: all) through the policy with nslots slots. */
static struct replay replay(const struct trace *t, int lun, uint32_t nslots)
{
	struct policy_cfg pc = set_policy();
	pc.nslots = nslots;
	struct policy *p = policy_new(&pc);
	uint64_t universe = (t->max_ext + 1) * NLUNS;
	int32_t *slot_of = malloc(universe * sizeof(int32_t));
	uint64_t *key_of = malloc((size_t)nslots * sizeof(uint64_t));
	uint32_t used = 0;
	struct replay r = { 0, 0 };

	if (!p || !slot_of || !key_of) {
		fprintf(stderr, "out of memory\n");
		exit(2);
	}
	memset(slot_of, 0xff, universe * sizeof(int32_t));
	for (size_t i = 0; i < t->n; i++) {
		const struct acc *a = &t->a[i];
		if (lun && a->lun != lun)
			continue;
		/* one piece per extent, as the engine splits a request */
		for (uint64_t off = a->off, end = a->off + a->len; off < end;) {
			uint64_t e = off / EXTENT, stop = (e + 1) * EXTENT < end ? (e + 1) * EXTENT : end;
			uint64_t key = (uint64_t)a->lun << 40 | e, idx = e * NLUNS + a->lun;
			struct policy_run run;
			/* every piece, hit or miss, is a step of its stream */
			policy_stream(p, a->lun, off, (uint32_t)(stop - off), &run);
			r.reads += !a->write;
			if (slot_of[idx] >= 0) {
				r.hits += !a->write;
				policy_touch(p, (uint32_t)slot_of[idx]);
			} else if ((!a->write || WRITES_ADMIT[a->lun]) && policy_admit_run(p, key, off, &run, a->write)) {
				uint32_t s;
				if (used < nslots) {
					s = used++;
				} else {
					s = policy_victim(p, always_clean, NULL);
					if (s == POLICY_NO_SLOT)
						goto next;
					uint64_t old = key_of[s];
					slot_of[(old & ((1ull << 40) - 1)) * NLUNS + (old >> 40)] = -1;
				}
				key_of[s] = key;
				slot_of[idx] = (int32_t)s;
				policy_insert(p, s, key);
			}
next:
			off = stop;
		}
	}
	policy_free(p);
	free(slot_of);
	free(key_of);
	return r;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static uint32_t SAMPLE_SLOTS; /* the advisor's slots per copy at 1x (0: its default) */

/* Feed the advisor the trace as the daemon does: one note per piece. */
static struct advisor *advise(const struct trace *t, uint32_t nslots, uint64_t *notes, double *secs)
{
	struct advisor_cfg cfg = { .nslots = nslots, .policy = set_policy(), .sample_slots = SAMPLE_SLOTS };
	struct advisor *a = advisor_new(&cfg);
	struct policy_cfg sc = set_policy();
	sc.nslots = nslots;
	struct policy *streams = policy_new(&sc); /* the set's policy: its stream table */
	if (!a || !streams || advisor_add(a, 1) < 0 || advisor_add(a, 2) < 0) {
		fprintf(stderr, "advisor_new failed\n");
		exit(2);
	}
	*notes = 0;
	double t0 = now_s();
	for (size_t i = 0; i < t->n; i++) {
		const struct acc *x = &t->a[i];
		for (uint64_t off = x->off, end = x->off + x->len; off < end;) {
			uint64_t e = off / EXTENT, stop = (e + 1) * EXTENT < end ? (e + 1) * EXTENT : end;
			struct policy_run run;
			policy_stream(streams, x->lun, off, (uint32_t)(stop - off), &run);
			advisor_note(a, (uint64_t)x->lun << 40 | e, off, &run, x->write, !x->write || WRITES_ADMIT[x->lun]);
			(*notes)++;
			off = stop;
		}
	}
	*secs = now_s() - t0;
	policy_free(streams);
	return a;
}

/* Compare one curve with the replays of the same accesses. */
static void compare(const char *what, const struct trace *t, int lun, uint32_t nslots,
		    const struct advisor_curve *c)
{
	double worst = 0, lo = 1, hi = 0;
	printf("%s: size   replay  advisor\n", what);
	for (int i = 0; i < ADVISOR_SIZES; i++) {
		struct replay r = replay(t, lun, (uint32_t)llround(advisor_scale[i] * nslots));
		double truth = r.reads ? (double)r.hits / (double)r.reads : 0;
		double d = fabs(truth - c->ratio[i]);
		printf("  %5.2fx  %6.1f%%  %6.1f%%  (%+.1f)\n", advisor_scale[i], 100 * truth, 100 * c->ratio[i],
		       100 * (c->ratio[i] - truth));
		if (d > worst)
			worst = d;
		if (truth < lo)
			lo = truth;
		if (truth > hi)
			hi = truth;
	}
	CHECK(worst <= MAX_POINTS, "%s: the advisor is within %.1f points of the replay at every size (want %.0f)",
	      what, 100 * worst, 100 * MAX_POINTS);
	CHECK(hi - lo >= MIN_SPAN, "%s: the replay spans %.1f points across the sizes (want %.0f or more)", what,
	      100 * (hi - lo), 100 * MIN_SPAN);
}

static void run_workload(const char *name, const struct trace *t, uint32_t nslots, bool per_lun)
{
	uint64_t notes;
	double secs;
	struct advisor *a = advise(t, nslots, &notes, &secs);
	struct advisor_report r;
	advisor_get(a, &r);
	printf("%s: %zu requests, %llu accesses, sampling rate %.4f, %llu sampled, copies of %u..%u slots, "
	       "%.1f MiB; %.0f ms of CPU per million accesses\n",
	       name, t->n, (unsigned long long)notes, r.rate, (unsigned long long)r.sampled, r.copy_slots[0],
	       r.copy_slots[ADVISOR_SIZES - 1], (double)r.mem_bytes / (1 << 20), secs * 1e9 / (double)notes);
	CHECK(r.dropped == 0, "%s: no sample was dropped (one thread)", name);
	char what[128];
	snprintf(what, sizeof(what), "%s, the set", name);
	compare(what, t, 0, nslots, &r.set);
	for (int l = 1; per_lun && l < NLUNS; l++) {
		if (!t->has_lun[l])
			continue; /* a trace of one LUN */
		snprintf(what, sizeof(what), "%s, LUN %d alone", name, l);
		CHECK(r.lun[l].on, "%s: a curve", what);
		compare(what, t, l, nslots, &r.lun[l]);
	}
	advisor_free(a);
}

static int load_trace(const char *path, struct trace *t, uint32_t *nslots)
{
	char cmd[4096], line[256];
	snprintf(cmd, sizeof(cmd), "xz -dcf '%s'", path);
	FILE *f = popen(cmd, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		char op, mode[32];
		unsigned lun;
		unsigned long long off;
		unsigned len;
		/* tierctl trace (cache/trace.h) numbers LUNs by backing id from 0:
		 * here they are 1 and 2 */
		if (sscanf(line, "# nslots %u", nslots) == 1 || sscanf(line, "# extent %u", &EXTENT) == 1 ||
		    sscanf(line, "# admit_hits %u", &ADMIT_HITS) == 1)
			continue;
		if (sscanf(line, "# seq_cutoff %llu", &off) == 1) {
			SEQ_CUTOFF = off;
			continue;
		}
		if (sscanf(line, "# lun %u %*s %31s", &lun, mode) == 2 && lun + 1 < NLUNS)
			WRITES_ADMIT[lun + 1] = !strcmp(mode, "write-back");
		if (line[0] == '#')
			continue;
		if (sscanf(line, "%c %u %llu %u", &op, &lun, &off, &len) == 4 && lun + 1 < NLUNS && len)
			push(t, (uint8_t)(lun + 1), op == 'W', off, len);
	}
	return pclose(f) == 0 && t->n ? 0 : -1;
}

static void unit_checks(void)
{
	struct advisor_curve c = { .on = true, .ratio = { 0.2, 0.3, 0.5, 0.7, 0.8, 0.85 } };
	CHECK(advisor_size_for(&c, 0.5) == 1.0, "size for 50%% on a curve through 50%% at 1x: %.2fx",
	      advisor_size_for(&c, 0.5));
	double s = advisor_size_for(&c, 0.6);
	CHECK(s > 1.0 && s < 2.0 && fabs(s - sqrt(2.0)) < 1e-9, "size for 60%%, halfway from 1x to 2x on a log scale: %.3fx", s);
	CHECK(advisor_size_for(&c, 0.9) == 0, "90%% is out of reach at 8x: 0");
	CHECK(advisor_size_for(&c, 0.1) == 0.25, "10%% is reached at 1/4 already: 0.25");

	/* a tiny cache is simulated whole: rate 1, copies of the full sizes */
	struct advisor_cfg cfg = { .nslots = 100, .policy = set_policy() };
	struct advisor *a = advisor_new(&cfg);
	struct advisor_report r;
	advisor_get(a, &r);
	CHECK(r.rate == 1.0 && r.copy_slots[0] == 25 && r.copy_slots[5] == 800,
	      "100 slots: rate %.2f, copies of %u..%u slots", r.rate, r.copy_slots[0], r.copy_slots[5]);
	/* 50 extents read twice: the second pass hits at 1x and above, and
	 * in part at 1/4 (25 slots) */
	advisor_add(a, 1);
	const struct policy_run alone = { 8, 0 }; /* 8 sectors, no stream before */
	for (int pass = 0; pass < 2; pass++)
		for (uint64_t e = 0; e < 50; e++)
			advisor_note(a, 1ull << 40 | e * 7, e * 7 * EXTENT, &alone, false, true);
	advisor_get(a, &r);
	CHECK(r.set.reads == 100 && r.set.ratio[2] == 0.5 && r.lun[1].on && r.lun[1].ratio[2] == 0.5 &&
		      !r.lun[2].on,
	      "two passes over 50 extents: %llu reads, ratio at 1x %.2f (LUN 1: %.2f; LUN 2 not added)",
	      (unsigned long long)r.set.reads, r.set.ratio[2], r.lun[1].ratio[2]);
	CHECK(r.set.ratio[0] < 0.5, "at 1/4 (25 slots) fewer hit: %.2f", r.set.ratio[0]);
	advisor_reset(a);
	advisor_get(a, &r);
	CHECK(r.set.reads == 0 && r.sampled == 0, "reset forgets the counts");
	for (uint64_t e = 0; e < 50; e++)
		advisor_note(a, 1ull << 40 | e * 7, e * 7 * EXTENT, &alone, false, true);
	advisor_get(a, &r);
	CHECK(r.set.ratio[5] == 0, "and empties the copies: a pass after it hits nothing (%.2f)", r.set.ratio[5]);
	advisor_drop(a, 1);
	advisor_get(a, &r);
	CHECK(!r.lun[1].on, "a dropped LUN has no curve");
	advisor_free(a);

	/* a write-through LUN: its write misses are not promoted, so a read
	 * after them misses too; in write-back they would be, and it hits */
	for (int wb = 0; wb < 2; wb++) {
		a = advisor_new(&cfg);
		for (uint64_t e = 0; e < 50; e++)
			advisor_note(a, 1ull << 40 | e * 7, e * 7 * EXTENT, &alone, true, wb);
		for (uint64_t e = 0; e < 50; e++)
			advisor_note(a, 1ull << 40 | e * 7, e * 7 * EXTENT, &alone, false, true);
		advisor_get(a, &r);
		CHECK(r.set.ratio[2] == (wb ? 1.0 : 0.0), "reads after 50 writes in %s: %.2f hit at 1x",
		      wb ? "write-back (writes promoted)" : "write-through (writes not promoted)", r.set.ratio[2]);
		advisor_free(a);
	}
}

/* ---- workers feeding one advisor while the control thread reads it ---- */

struct feeder {
	struct advisor *a;
	uint32_t bid;
	unsigned n;
};

static void *feed(void *arg)
{
	struct feeder *f = arg;
	struct policy_cfg sc = set_policy();
	sc.nslots = 64;
	struct policy *streams = policy_new(&sc);
	uint64_t rng = 0xfeed0000u + f->bid;
	for (unsigned i = 0; i < f->n; i++) {
		uint64_t e = splitmix(&rng) % 500, off = e * EXTENT;
		struct policy_run run;
		policy_stream(streams, f->bid, off, 4096, &run);
		advisor_note(f->a, (uint64_t)f->bid << 40 | e, off, &run, i % 5 == 0, true);
		/* the rest of a host command: about what one costs the daemon */
		for (volatile unsigned k = 0; k < 6000; k++)
			;
	}
	policy_free(streams);
	return NULL;
}

/*
 * Counts decay: a window's worth of sampled reads (2^20) that all hit, then
 * three windows of reads that all miss. A group's counts halve whenever its
 * read count reaches a window, which halves too: once after the first
 * window, then every half window, six times during the misses. The curve
 * follows the new workload: 2^20 / 2^7 old hits against 2^19 reads, 1.6%
 * at 1x; without the halving it would say 25%.
 */
static void decay_checks(void)
{
	struct advisor_cfg cfg = { .nslots = 100, .policy = set_policy() };
	struct advisor *a = advisor_new(&cfg);
	struct advisor_report r;
	const struct policy_run alone = { 8, 0 };
	const uint64_t window = 1u << 20;
	for (uint64_t i = 0; i < window; i++) {
		uint64_t e = (i % 50) * 7;
		advisor_note(a, 1ull << 40 | e, e * EXTENT, &alone, false, true);
	}
	advisor_get(a, &r);
	CHECK(r.set.ratio[2] > 0.99, "a window of reads over 50 extents: %.3f hit at 1x", r.set.ratio[2]);
	for (uint64_t i = 0; i < 3 * window; i++) {
		uint64_t e = 1000 + i * 7; /* never read again */
		advisor_note(a, 1ull << 40 | e, e * EXTENT, &alone, false, true);
	}
	advisor_get(a, &r);
	CHECK(r.set.ratio[2] > 0.01 && r.set.ratio[2] < 0.03,
	      "then three windows of one-touch reads: %.3f hit at 1x (decayed: 0.016; without decay 0.25)",
	      r.set.ratio[2]);
	advisor_free(a);
}

static void concurrency_checks(void)
{
	/* rate 1: every access is sampled, so each either reaches the copies
	 * or is counted as dropped (its ring was full); nothing is lost or
	 * counted twice */
	struct advisor_cfg cfg = { .nslots = 200, .policy = set_policy() };
	struct advisor *a = advisor_new(&cfg);
	struct feeder f[3] = { { a, 1, 100000 }, { a, 2, 100000 }, { a, 3, 50000 } };
	pthread_t t[3];
	advisor_add(a, 1);
	advisor_add(a, 2);
	for (int i = 0; i < 3; i++)
		pthread_create(&t[i], NULL, feed, &f[i]);
	struct advisor_report r;
	for (int k = 0; k < 200; k++) {
		advisor_get(a, &r);
		/* a LUN attached and detached while its worker feeds it */
		if (k % 2)
			advisor_drop(a, 3);
		else
			advisor_add(a, 3);
	}
	for (int i = 0; i < 3; i++)
		pthread_join(t[i], NULL);
	advisor_get(a, &r);
	CHECK(r.sampled + r.dropped == 250000,
	      "three workers, 250000 accesses: %llu reached the copies, %llu were dropped (%.1f%%: a ring was full)",
	      (unsigned long long)r.sampled, (unsigned long long)r.dropped, 100.0 * (double)r.dropped / 250000);
	/* Both workers' LUNs reached the copies (a bare try-lock once gave
	 * one of them nothing at all). How evenly depends on the scheduler
	 * of a busy machine, so it is printed, not held to a bound. */
	CHECK(r.lun[1].reads > 0 && r.lun[2].reads > 0, "each worker's LUN reached the copies: %llu and %llu sampled reads",
	      (unsigned long long)r.lun[1].reads, (unsigned long long)r.lun[2].reads);
	CHECK(r.lun[1].on && r.lun[2].on && !r.lun[3].on && r.set.ratio[5] > 0.5,
	      "LUNs 1 and 2 have their curves, LUN 3 was dropped last; the set hits %.0f%% at 8x",
	      100 * r.set.ratio[5]);
	advisor_free(a);
}

int main(int argc, char **argv)
{
	unit_checks();
	concurrency_checks();
#ifdef TC_TSAN
	return check_failures ? 1 : 0; /* the replays take minutes under TSan (and so would the decay's 4M reads) */
#endif
	decay_checks();
	if (argc > 1) {
		struct trace t = { 0 };
		uint32_t nslots = 0;
		if (load_trace(argv[1], &t, &nslots) < 0 || !nslots) {
			fprintf(stderr, "%s: not a trace with a '# nslots N' line\n", argv[1]);
			return 2;
		}
		if (argc > 2) /* "today's" size other than the recording set's */
			nslots = (uint32_t)strtoul(argv[2], NULL, 0);
		if (argc > 3) /* a copy at 1x this small: a sample of the extents even on a small trace */
			SAMPLE_SLOTS = (uint32_t)strtoul(argv[3], NULL, 0);
		run_workload(argv[1], &t, nslots, true);
		free(t.a);
	} else {
		struct trace t = { 0 };
		make_zipf_scans(&t, 3000000);
		run_workload("zipf+scans", &t, NSLOTS, true);
		free(t.a);
	}
	return check_failures ? 1 : 0;
}
