/*
 * tierctl_top.c - tierctl top: what every LUN and cache set does, each second.
 *
 * Asks the daemon for its status every interval and shows the difference
 * with the last answer: per LUN the commands a second (reads, writes), MB/s,
 * read and write latency percentiles (from the status's latency buckets,
 * so each is the bucket's upper bound: "<=200us"), the share of reads the
 * cache served whole, and the commands in flight; per cache set the dirty
 * data, the destage rate and each leg's state. On a terminal the screen is
 * redrawn; otherwise each sample is printed after the last (ssh, logs).
 */
#include "tools/tierctl.h"

#include <json-c/json.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define TOP_MAX 512
#define NB 16 /* latency buckets in the status (the last: above the bounds) */

struct lun_sample {
	char name[64];
	int64_t rd, wr, rb, wb, hits, reads, inflight;
	int64_t rh[NB], wh[NB];
	int64_t bound_us[NB - 1];
	int nbounds;
};

struct set_sample {
	char name[64];
	int64_t dirty, destaged;
	char legs[256];
};

struct sample {
	double t;
	int nl, ns;
	struct lun_sample l[TOP_MAX];
	struct set_sample s[TOP_MAX / 8];
};

static volatile sig_atomic_t top_stop;
static void on_sigint(int sig) { (void)sig; top_stop = 1; }

static int64_t get_i(struct json_object *o, const char *k)
{
	struct json_object *v;
	return o && json_object_object_get_ex(o, k, &v) ? json_object_get_int64(v) : 0;
}

static const char *get_s(struct json_object *o, const char *k)
{
	struct json_object *v;
	return o && json_object_object_get_ex(o, k, &v) ? json_object_get_string(v) : "";
}

static void get_arr(struct json_object *o, const char *k, int64_t *out, int max, int *n)
{
	struct json_object *a;
	int c = 0;
	if (o && json_object_object_get_ex(o, k, &a) && json_object_is_type(a, json_type_array))
		for (size_t i = 0; i < json_object_array_length(a) && c < max; i++)
			out[c++] = json_object_get_int64(json_object_array_get_idx(a, i));
	if (n)
		*n = c;
}

static int take(const char *path, struct sample *s)
{
	struct json_object *req = json_object_new_object();
	json_object_object_add(req, "cmd", json_object_new_string("status"));
	int rc = 0;
	struct json_object *resp = tierctl_call(path, req, &rc);
	json_object_put(req);
	if (!resp)
		return rc ? rc : 3;
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	s->t = (double)ts.tv_sec + ts.tv_nsec / 1e9;
	s->nl = s->ns = 0;
	struct json_object *luns, *caches;
	if (json_object_object_get_ex(resp, "luns", &luns))
		for (size_t i = 0; i < json_object_array_length(luns) && s->nl < TOP_MAX; i++) {
			struct json_object *o = json_object_array_get_idx(luns, i), *io;
			struct lun_sample *l = &s->l[s->nl++];
			memset(l, 0, sizeof(*l));
			snprintf(l->name, sizeof(l->name), "%s", get_s(o, "name"));
			if (!json_object_object_get_ex(o, "io", &io))
				continue;
			l->rd = get_i(io, "read");
			l->wr = get_i(io, "write");
			l->rb = get_i(io, "read_bytes");
			l->wb = get_i(io, "write_bytes");
			l->hits = get_i(io, "read_hits");
			l->reads = l->rd; /* every read counted lands in a latency bucket with its outcome */
			l->inflight = get_i(io, "in_flight");
			get_arr(io, "read_latency_buckets", l->rh, NB, NULL);
			get_arr(io, "write_latency_buckets", l->wh, NB, NULL);
			get_arr(io, "latency_bounds_us", l->bound_us, NB - 1, &l->nbounds);
		}
	if (json_object_object_get_ex(resp, "caches", &caches))
		for (size_t i = 0; i < json_object_array_length(caches) && s->ns < TOP_MAX / 8; i++) {
			struct json_object *o = json_object_array_get_idx(caches, i), *legs;
			struct set_sample *c = &s->s[s->ns++];
			snprintf(c->name, sizeof(c->name), "%s", get_s(o, "name"));
			c->dirty = get_i(o, "dirty_bytes");
			c->destaged = get_i(o, "destaged_bytes");
			c->legs[0] = '\0';
			if (json_object_object_get_ex(o, "legs", &legs))
				for (size_t k = 0; k < json_object_array_length(legs); k++) {
					size_t n = strlen(c->legs);
					snprintf(c->legs + n, sizeof(c->legs) - n, "%s%s", k ? " " : "",
						 get_s(json_object_array_get_idx(legs, k), "health"));
				}
		}
	json_object_put(resp);
	return 0;
}

/* The q-quantile of the bucket differences: its bucket's upper bound. */
static void quantile(const int64_t *now, const int64_t *then, const int64_t *bound_us, int nb, double q, char *out,
		     size_t cap)
{
	int64_t d[NB], tot = 0;
	for (int i = 0; i < NB; i++) {
		d[i] = now[i] - then[i];
		if (d[i] < 0)
			d[i] = 0;
		tot += d[i];
	}
	if (!tot) {
		snprintf(out, cap, "-");
		return;
	}
	int64_t want = (int64_t)(q * (double)tot + 0.999999), cum = 0;
	for (int i = 0; i < NB; i++) {
		cum += d[i];
		if (cum >= want) {
			if (i >= nb)
				snprintf(out, cap, ">%.0fms", nb ? bound_us[nb - 1] / 1000.0 : 0.0);
			else if (bound_us[i] >= 1000)
				snprintf(out, cap, "<=%.1fms", bound_us[i] / 1000.0);
			else
				snprintf(out, cap, "<=%lldus", (long long)bound_us[i]);
			return;
		}
	}
	snprintf(out, cap, "-");
}

static const struct lun_sample *find_lun(const struct sample *s, const char *name)
{
	for (int i = 0; i < s->nl; i++)
		if (!strcmp(s->l[i].name, name))
			return &s->l[i];
	return NULL;
}

static const struct set_sample *find_set(const struct sample *s, const char *name)
{
	for (int i = 0; i < s->ns; i++)
		if (!strcmp(s->s[i].name, name))
			return &s->s[i];
	return NULL;
}

static void render(const struct sample *a, const struct sample *b, bool tty, int interval)
{
	double dt = b->t - a->t;
	if (dt <= 0)
		dt = 1;
	time_t wall = time(NULL);
	struct tm tm;
	localtime_r(&wall, &tm);
	if (tty)
		printf("\033[H\033[J");
	printf("tiercache top  %02d:%02d:%02d  every %d s%s\n\n", tm.tm_hour, tm.tm_min, tm.tm_sec, interval,
	       tty ? " (Ctrl-C quits)" : "");
	printf("%-20s %8s %8s %8s %8s %9s %9s %9s %9s %5s %6s\n", "LUN", "IOPS", "read/s", "write/s", "MB/s",
	       "rd p50", "rd p99", "wr p50", "wr p99", "hit%", "queue");
	for (int i = 0; i < b->nl; i++) {
		const struct lun_sample *n = &b->l[i], *o = find_lun(a, n->name);
		struct lun_sample zero;
		if (!o) {
			memset(&zero, 0, sizeof(zero));
			o = &zero;
		}
		double rd = (double)(n->rd - o->rd) / dt, wr = (double)(n->wr - o->wr) / dt;
		double mbs = (double)(n->rb - o->rb + n->wb - o->wb) / dt / 1e6;
		char rp50[32], rp99[32], wp50[32], wp99[32], hit[8] = "-";
		quantile(n->rh, o->rh, n->bound_us, n->nbounds, 0.50, rp50, sizeof(rp50));
		quantile(n->rh, o->rh, n->bound_us, n->nbounds, 0.99, rp99, sizeof(rp99));
		quantile(n->wh, o->wh, n->bound_us, n->nbounds, 0.50, wp50, sizeof(wp50));
		quantile(n->wh, o->wh, n->bound_us, n->nbounds, 0.99, wp99, sizeof(wp99));
		int64_t reads = n->reads - o->reads;
		if (reads > 0 && n->hits >= 0)
			snprintf(hit, sizeof(hit), "%.0f", 100.0 * (double)(n->hits - o->hits) / (double)reads);
		printf("%-20.20s %8.0f %8.0f %8.0f %8.1f %9s %9s %9s %9s %5s %6lld\n", n->name, rd + wr, rd, wr, mbs,
		       rp50, rp99, wp50, wp99, hit, (long long)n->inflight);
	}
	if (b->ns) {
		printf("\n%-20s %12s %14s  %s\n", "CACHE", "dirty MiB", "destage MB/s", "legs");
		for (int i = 0; i < b->ns; i++) {
			const struct set_sample *n = &b->s[i], *o = find_set(a, n->name);
			double ds = o ? (double)(n->destaged - o->destaged) / dt / 1e6 : 0;
			printf("%-20.20s %12.1f %14.1f  %s\n", n->name, (double)n->dirty / 1048576.0, ds < 0 ? 0 : ds,
			       n->legs);
		}
	}
	if (!tty)
		printf("\n");
	fflush(stdout);
}

int tierctl_top(const char *path, int interval, int count)
{
	struct sample *a = calloc(1, sizeof(*a)), *b = calloc(1, sizeof(*b));
	if (!a || !b) {
		fprintf(stderr, "tierctl top: out of memory\n");
		free(a);
		free(b);
		return 1;
	}
	bool tty = isatty(1);
	signal(SIGINT, on_sigint);
	int rc = take(path, a);
	for (int n = 0; !rc && !top_stop && (!count || n < count); n++) {
		for (int i = 0; i < interval * 10 && !top_stop; i++)
			usleep(100000);
		if (top_stop)
			break;
		rc = take(path, b);
		if (rc)
			break;
		render(a, b, tty, interval);
		struct sample *t = a;
		a = b;
		b = t;
	}
	free(a);
	free(b);
	return rc;
}
