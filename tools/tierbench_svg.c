/*
 * tierbench_svg.c - charts from tierbench JSON documents.
 *
 * Two kinds of figure, as in the NAS cache reviews:
 *   - the load sweep: IOPS against load (2T2Q ... 16T16Q) and latency
 *     (average solid, p99.9 dashed, log scale) against load, one line per
 *     label ("cache off", "cache on (write-back)", "tgtd", ...);
 *   - per workload, horizontal bars side by side for every label: throughput
 *     (IOPS, or MB/s for blocks of 64 KiB and more) and average latency.
 *   - the open-loop sweep (--rates): latency (average solid, p99 dashed, log
 *     scale) against the offered rate, one line per label: where a line
 *     turns up steeply is the load the target can really carry (the
 *     "hockey stick").
 * The input is a list of documents as printed by --json; a run's label is
 * its own "label", else its document's, else "run N".
 */
#include "tools/tierbench.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define W 960
#define MAX_RUNS 1024
#define MAX_NAMES 32

struct run {
	const char *label, *workload, *load;
	char key[96];            /* "workload load": one bar panel each */
	bool sweep;
	bool rate_sweep;
	int bs;
	double iops, mbs, avg_us, p99_us, p999_us;
	double offered;          /* open loop: commands per second offered */
};

static const char *palette[] = { "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2",
				 "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac" };
#define NCOLORS (sizeof(palette) / sizeof(palette[0]))

static double jget(struct json_object *o, const char *k)
{
	struct json_object *v;
	return json_object_object_get_ex(o, k, &v) ? json_object_get_double(v) : 0.0;
}

static const char *jstr(struct json_object *o, const char *k)
{
	struct json_object *v;
	return json_object_object_get_ex(o, k, &v) ? json_object_get_string(v) : NULL;
}

static void xml_text(FILE *f, const char *s)
{
	for (; *s; s++) {
		if (*s == '&')
			fputs("&amp;", f);
		else if (*s == '<')
			fputs("&lt;", f);
		else if (*s == '>')
			fputs("&gt;", f);
		else
			fputc(*s, f);
	}
}

static int index_of(const char **names, int *n, const char *s)
{
	for (int i = 0; i < *n; i++)
		if (!strcmp(names[i], s))
			return i;
	if (*n >= MAX_NAMES)
		return MAX_NAMES - 1;
	names[*n] = s;
	return (*n)++;
}

/* A round number at or above v, for axis tops. */
static double nice_top(double v)
{
	if (v <= 0)
		return 1;
	double p = pow(10, floor(log10(v)));
	for (double m = 1; m <= 10; m += (m < 2 ? 0.5 : 1))
		if (m * p >= v)
			return m * p;
	return 10 * p;
}

static void fmt_num(char *buf, size_t len, double v)
{
	if (v >= 1e6)
		snprintf(buf, len, "%.3gM", v / 1e6);
	else if (v >= 1e3)
		snprintf(buf, len, "%.3gk", v / 1e3);
	else if (v >= 100)
		snprintf(buf, len, "%.0f", v);
	else
		snprintf(buf, len, "%.3g", v);
}

static void fmt_us(char *buf, size_t len, double us)
{
	if (us >= 1e6)
		snprintf(buf, len, "%.2f s", us / 1e6);
	else if (us >= 1e3)
		snprintf(buf, len, "%.3g ms", us / 1e3);
	else
		snprintf(buf, len, "%.3g us", us);
}

static void legend(FILE *f, int y, const char **labels, int nlabels)
{
	int x = 70;
	for (int i = 0; i < nlabels; i++) {
		fprintf(f, "<rect x='%d' y='%d' width='14' height='14' fill='%s'/>\n", x, y - 11,
			palette[i % NCOLORS]);
		fprintf(f, "<text x='%d' y='%d'>", x + 20, y);
		xml_text(f, labels[i]);
		fprintf(f, "</text>\n");
		x += 30 + 8 * (int)strlen(labels[i]);
	}
}

/* One line chart panel over the sweep's loads; returns the height used. */
static int sweep_panel(FILE *f, int y0, const struct run *runs, int nruns, const char **labels,
		       int nlabels, const char **loads, int nloads, bool latency)
{
	const int h = 300, left = 80, right = W - 30, top = y0 + 30, bottom = y0 + h - 70;
	double ymax = 0, ymin = 1e300;
	for (int i = 0; i < nruns; i++) {
		if (!runs[i].sweep)
			continue;
		double a = latency ? runs[i].p999_us : runs[i].iops;
		double c = latency ? runs[i].avg_us : runs[i].iops;
		if (a > ymax)
			ymax = a;
		if (c > 0 && c < ymin)
			ymin = c;
	}
	double lo = 0, hi = nice_top(ymax);
	if (latency) {
		lo = floor(log10(ymin > 0 && ymin < 1e300 ? ymin : 1));
		hi = ceil(log10(ymax > 0 ? ymax : 10));
		if (hi <= lo)
			hi = lo + 1;
	}
	fprintf(f, "<text x='%d' y='%d' class='t'>%s</text>\n", left, y0 + 16,
		latency ? "Sweep: latency vs load (average solid, p99.9 dashed; log scale)" :
			  "Sweep: IOPS vs load");
	/* grid and y labels */
	int ticks = latency ? (int)(hi - lo) : 5;
	for (int t = 0; t <= ticks; t++) {
		int y = bottom - (bottom - top) * t / ticks;
		char lab[32];
		if (latency)
			fmt_us(lab, sizeof(lab), pow(10, lo + t));
		else
			fmt_num(lab, sizeof(lab), hi * t / ticks);
		fprintf(f, "<line x1='%d' y1='%d' x2='%d' y2='%d' class='g'/>\n", left, y, right, y);
		fprintf(f, "<text x='%d' y='%d' text-anchor='end'>%s</text>\n", left - 6, y + 4, lab);
	}
	double step = nloads > 1 ? (double)(right - left - 40) / (nloads - 1) : 0;
	for (int i = 0; i < nloads; i++) {
		int x = left + 20 + (int)(step * i);
		fprintf(f, "<text x='%d' y='%d' text-anchor='end' transform='rotate(-40 %d %d)'>%s</text>\n",
			x, bottom + 16, x, bottom + 16, loads[i]);
	}
	for (int l = 0; l < nlabels; l++) {
		for (int pass = 0; pass < (latency ? 2 : 1); pass++) {
			fprintf(f, "<polyline fill='none' stroke='%s' stroke-width='2'%s points='",
				palette[l % NCOLORS], pass ? " stroke-dasharray='6 4'" : "");
			for (int i = 0; i < nruns; i++) {
				if (!runs[i].sweep || strcmp(runs[i].label, labels[l]))
					continue;
				int li = 0;
				while (li < nloads && strcmp(loads[li], runs[i].load))
					li++;
				double v = latency ? (pass ? runs[i].p999_us : runs[i].avg_us) : runs[i].iops;
				double fy;
				if (latency)
					fy = v > 0 ? (log10(v) - lo) / (hi - lo) : 0;
				else
					fy = v / hi;
				if (fy < 0)
					fy = 0;
				fprintf(f, "%d,%d ", left + 20 + (int)(step * li),
					bottom - (int)((bottom - top) * fy));
			}
			fprintf(f, "'/>\n");
		}
	}
	return h;
}

static int by_offered(const void *a, const void *b)
{
	const struct run *x = *(const struct run *const *)a, *y = *(const struct run *const *)b;
	return x->offered < y->offered ? -1 : x->offered > y->offered;
}

/* Latency against offered load for the open-loop sweeps; returns the height. */
static int rate_panel(FILE *f, int y0, const struct run *runs, int nruns, const char **labels, int nlabels)
{
	const int h = 320, left = 80, right = W - 30, top = y0 + 30, bottom = y0 + h - 50;
	double xmax = 0, ymax = 0, ymin = 1e300;
	for (int i = 0; i < nruns; i++) {
		if (!runs[i].rate_sweep)
			continue;
		if (runs[i].offered > xmax)
			xmax = runs[i].offered;
		if (runs[i].p99_us > ymax)
			ymax = runs[i].p99_us;
		if (runs[i].avg_us > 0 && runs[i].avg_us < ymin)
			ymin = runs[i].avg_us;
	}
	double xhi = nice_top(xmax);
	double lo = floor(log10(ymin > 0 && ymin < 1e300 ? ymin : 1));
	double hi = ceil(log10(ymax > 0 ? ymax : 10));
	if (hi <= lo)
		hi = lo + 1;
	fprintf(f, "<text x='%d' y='%d' class='t'>Latency vs offered load, open loop (average solid, p99 dashed; "
		"log scale)</text>\n", left, y0 + 16);
	for (int t = 0; t <= (int)(hi - lo); t++) {
		int y = bottom - (int)((bottom - top) * t / (hi - lo));
		char lab[32];
		fmt_us(lab, sizeof(lab), pow(10, lo + t));
		fprintf(f, "<line x1='%d' y1='%d' x2='%d' y2='%d' class='g'/>\n", left, y, right, y);
		fprintf(f, "<text x='%d' y='%d' text-anchor='end'>%s</text>\n", left - 6, y + 4, lab);
	}
	for (int t = 0; t <= 5; t++) {
		int x = left + (right - left) * t / 5;
		char lab[32];
		fmt_num(lab, sizeof(lab), xhi * t / 5);
		fprintf(f, "<text x='%d' y='%d' text-anchor='middle'>%s</text>\n", x, bottom + 16, lab);
	}
	fprintf(f, "<text x='%d' y='%d' text-anchor='middle'>offered IOPS</text>\n", (left + right) / 2,
		bottom + 34);
	const struct run *pts[MAX_RUNS];
	for (int l = 0; l < nlabels; l++) {
		int n = 0;
		for (int i = 0; i < nruns; i++)
			if (runs[i].rate_sweep && !strcmp(runs[i].label, labels[l]))
				pts[n++] = &runs[i];
		qsort(pts, (size_t)n, sizeof(pts[0]), by_offered);
		for (int pass = 0; pass < 2; pass++) {
			fprintf(f, "<polyline class='rate' fill='none' stroke='%s' stroke-width='2'%s points='",
				palette[l % NCOLORS], pass ? " stroke-dasharray='6 4'" : "");
			for (int i = 0; i < n; i++) {
				double v = pass ? pts[i]->p99_us : pts[i]->avg_us;
				double fy = v > 0 ? (log10(v) - lo) / (hi - lo) : 0;
				if (fy < 0)
					fy = 0;
				fprintf(f, "%d,%d ", left + (int)((right - left) * pts[i]->offered / xhi),
					bottom - (int)((bottom - top) * fy));
			}
			fprintf(f, "'/>\n");
		}
	}
	return h;
}

/* Bars for one workload: throughput on the left, average latency on the right. */
static int bar_panel(FILE *f, int y0, const char *workload, const struct run *runs, int nruns,
		     const char **labels, int nlabels)
{
	const struct run *row[MAX_NAMES] = { 0 };
	for (int i = 0; i < nruns; i++) {
		if (runs[i].sweep || runs[i].rate_sweep || strcmp(runs[i].key, workload))
			continue;
		for (int l = 0; l < nlabels; l++)
			if (!strcmp(runs[i].label, labels[l]))
				row[l] = &runs[i];   /* the last run of a label wins */
	}
	bool mb = false;
	for (int l = 0; l < nlabels; l++)
		if (row[l] && row[l]->bs >= 65536)
			mb = true;
	double tmax = 0, lmax = 0;
	for (int l = 0; l < nlabels; l++) {
		if (!row[l])
			continue;
		double t = mb ? row[l]->mbs : row[l]->iops;
		if (t > tmax)
			tmax = t;
		if (row[l]->avg_us > lmax)
			lmax = row[l]->avg_us;
	}
	const int barh = 18, gap = 6, half = (W - 60) / 2, labw = 170;
	int y = y0 + 30;
	fprintf(f, "<text x='20' y='%d' class='t'>", y0 + 16);
	xml_text(f, workload);
	fprintf(f, ": %s (longer is better) and average latency (shorter is better)</text>\n",
		mb ? "MB/s" : "IOPS");
	for (int l = 0; l < nlabels; l++) {
		if (!row[l])
			continue;
		double t = mb ? row[l]->mbs : row[l]->iops;
		int tw = tmax > 0 ? (int)((half - labw - 70) * t / tmax) : 0;
		int lw = lmax > 0 ? (int)((half - labw - 70) * row[l]->avg_us / lmax) : 0;
		char tv[32], lv[32];
		fmt_num(tv, sizeof(tv), t);
		fmt_us(lv, sizeof(lv), row[l]->avg_us);
		for (int side = 0; side < 2; side++) {
			int x0 = 20 + side * half;
			fprintf(f, "<text x='%d' y='%d' text-anchor='end'>", x0 + labw - 6, y + 13);
			xml_text(f, labels[l]);
			fprintf(f, "</text>\n<rect x='%d' y='%d' width='%d' height='%d' fill='%s'/>\n",
				x0 + labw, y, side ? lw : tw, barh, palette[l % NCOLORS]);
			fprintf(f, "<text x='%d' y='%d'>%s</text>\n", x0 + labw + (side ? lw : tw) + 4,
				y + 13, side ? lv : tv);
		}
		y += barh + gap;
	}
	return y - y0 + 14;
}

int tb_svg_write(const char *path, struct json_object **docs, int ndocs, char *err,
		 size_t errlen)
{
	static struct run runs[MAX_RUNS];
	static char run_names[MAX_RUNS][24];
	int nruns = 0;
	for (int d = 0; d < ndocs; d++) {
		struct json_object *arr;
		if (!json_object_object_get_ex(docs[d], "runs", &arr) ||
		    !json_object_is_type(arr, json_type_array)) {
			snprintf(err, errlen, "document %d is not tierbench --json output (no \"runs\")",
				 d + 1);
			return -1;
		}
		const char *doc_label = jstr(docs[d], "label");
		for (size_t i = 0; i < json_object_array_length(arr) && nruns < MAX_RUNS; i++) {
			struct json_object *r = json_object_array_get_idx(arr, i), *lat, *v;
			struct run *x = &runs[nruns];
			x->label = jstr(r, "label");
			if (!x->label)
				x->label = doc_label;
			if (!x->label) {
				snprintf(run_names[nruns], sizeof(run_names[0]), "run %d", d + 1);
				x->label = run_names[nruns];
			}
			x->workload = jstr(r, "workload");
			x->load = jstr(r, "load");
			if (!x->workload || !x->load)
				continue;
			x->sweep = json_object_object_get_ex(r, "sweep", &v) && json_object_get_boolean(v);
			x->rate_sweep = json_object_object_get_ex(r, "rate_sweep", &v) && json_object_get_boolean(v);
			x->offered = jget(r, "offered_iops");
			snprintf(x->key, sizeof(x->key), "%s %s", x->workload, x->load);
			x->bs = (int)jget(r, "block_size");
			x->iops = jget(r, "iops");
			x->mbs = jget(r, "mb_per_s");
			if (json_object_object_get_ex(r, "latency_us", &lat)) {
				x->avg_us = jget(lat, "avg");
				x->p99_us = jget(lat, "p99");
				x->p999_us = jget(lat, "p99_9");
			}
			nruns++;
		}
	}
	if (!nruns) {
		snprintf(err, errlen, "no runs to draw");
		return -1;
	}

	const char *labels[MAX_NAMES], *loads[MAX_NAMES], *wls[MAX_NAMES];
	int nlabels = 0, nloads = 0, nwls = 0;
	bool any_sweep = false, any_rate = false;
	for (int i = 0; i < nruns; i++) {
		index_of(labels, &nlabels, runs[i].label);
		if (runs[i].rate_sweep) {
			any_rate = true;
		} else if (runs[i].sweep) {
			index_of(loads, &nloads, runs[i].load);
			any_sweep = true;
		} else {
			index_of(wls, &nwls, runs[i].key);
		}
	}

	FILE *f = fopen(path, "w");
	if (!f) {
		snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
		return -1;
	}
	/* height: legend + sweep panels + one bar panel per workload */
	int height = 50 + (any_sweep ? 2 * 300 : 0) + (any_rate ? 320 : 0);
	for (int w = 0; w < nwls; w++) {
		int present = 0;
		for (int l = 0; l < nlabels; l++)
			for (int i = 0; i < nruns; i++)
				if (!runs[i].sweep && !runs[i].rate_sweep && !strcmp(runs[i].key, wls[w]) &&
				    !strcmp(runs[i].label, labels[l])) {
					present++;
					break;
				}
		height += 44 + present * 24;
	}
	fprintf(f, "<svg xmlns='http://www.w3.org/2000/svg' width='%d' height='%d' "
		"font-family='sans-serif' font-size='12'>\n", W, height);
	fprintf(f, "<style>.t{font-weight:bold;font-size:14px}.g{stroke:#ddd}</style>\n");
	fprintf(f, "<rect width='100%%' height='100%%' fill='white'/>\n");
	legend(f, 24, labels, nlabels);
	int y = 40;
	if (any_sweep) {
		y += sweep_panel(f, y, runs, nruns, labels, nlabels, loads, nloads, false);
		y += sweep_panel(f, y, runs, nruns, labels, nlabels, loads, nloads, true);
	}
	if (any_rate)
		y += rate_panel(f, y, runs, nruns, labels, nlabels);
	for (int w = 0; w < nwls; w++)
		y += bar_panel(f, y, wls[w], runs, nruns, labels, nlabels);
	fprintf(f, "</svg>\n");
	if (fclose(f)) {
		snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
		return -1;
	}
	return 0;
}
