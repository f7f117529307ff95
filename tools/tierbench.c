/*
 * tierbench - measure an iSCSI LUN the way NAS cache reviews do.
 *
 *   tierbench [OPTIONS] iscsi://[user[%secret]@]host[:port]/target-iqn/lun
 *   tierbench --svg FILE --from RESULT.json [--from RESULT.json ...]
 *
 * Workloads come by name (the StorageReview profiles in workloads.md) or by
 * flag; several names separated by commas run one after the other over the
 * same sessions. Each run reports IOPS, MB/s (10^6 bytes) and the latency
 * distribution (average, p50, p99, p99.9, maximum, standard deviation) for
 * all commands and, in mixed workloads, for reads and writes apart. Latency
 * is measured per command from submission to completion, so it includes
 * the time a command waits in the client; nothing is derived from Little's
 * law.
 *
 * That is a closed loop: each slot sends its next command when the last one
 * ends, so a slow target lowers the load it is offered and hides its own
 * tail (coordinated omission). --rate IOPS is the open loop hosts impose:
 * commands arrive on a schedule (Poisson, or evenly spaced) whatever the
 * target does, sessions x QD only caps what is in flight, and latency runs
 * from each command's intended start. --rates R1,R2,... sweeps the offered
 * load and --svg draws latency against it (the "hockey stick");
 * --compare URL2 runs every row on a second target too, alternately, and
 * prints the ratio.
 *
 * Output: a table for people, --json for scripts, and a live progress line
 * when stdout is a terminal. --svg draws the sweep and cache on/off bars,
 * from this run or from saved --json documents (--from).
 *
 * Exit status: 0 done, 1 verification found mismatches, 2 usage error, bad
 * URL, refused login, lost connection or a target error (one line on stderr).
 */
#include "tools/tierbench.h"

#include <errno.h>
#include <getopt.h>
#include <json-c/json.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#define DEFAULT_INITIATOR "iqn.2026-11.io.tiercache:tierbench"
#define MAX_JOBS 256
#define MAX_FROM 64

struct workload {
	const char *name;
	uint32_t bs;
	int read_pct;
	bool sequential;
	bool sweep;
	const char *what;
};

/* StorageReview's profiles run at 16 threads x 16 outstanding commands. */
static const struct workload workloads[] = {
	{ "4k-randread", 4096, 100, false, false, "4 KiB random, 100% read" },
	{ "4k-randwrite", 4096, 0, false, false, "4 KiB random, 100% write" },
	{ "8k-7030", 8192, 70, false, false, "8 KiB random, 70% read / 30% write" },
	{ "8k-seqread", 8192, 100, true, false, "8 KiB sequential, 100% read" },
	{ "8k-seqwrite", 8192, 0, true, false, "8 KiB sequential, 100% write" },
	{ "128k-seqread", 131072, 100, true, false, "128 KiB sequential, 100% read" },
	{ "128k-seqwrite", 131072, 0, true, false, "128 KiB sequential, 100% write" },
	{ "sweep", 8192, 70, false, true, "8 KiB 70/30 random at 2T2Q, 2T4Q ... 16T16Q" },
};

static const int sweep_axis[] = { 2, 4, 8, 16 };

struct opts {
	const char *url;
	char workload_list[256];
	long bs;                 /* -1 = from the workload */
	int read_pct;            /* -1 = from the workload */
	int sequential;          /* -1 = from the workload */
	uint64_t offset, size;
	int sessions, qd;        /* 0 = from the workload */
	char loads[512];
	double seconds;
	uint64_t count;
	double precondition;
	bool verify;
	bool json;
	const char *svg;
	const char *label;
	bool progress;
	const char *initiator;
	int login_timeout, io_timeout;
	bool digest;
	uint64_t seed;
	const char *from[MAX_FROM];
	int nfrom;
	double rate;             /* --rate: open loop */
	char rates[512];         /* --rates: an open-loop sweep */
	bool fixed_arrivals;
	bool from_issue;
	const char *compare;     /* --compare URL2 */
	const char *label2;
	const char *io_log;      /* --io-log FILE */
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: tierbench [OPTIONS] iscsi://[user[%%secret]@]host[:port]/target-iqn/lun\n"
		"       tierbench --svg FILE --from RESULT.json [--from RESULT.json ...]\n"
		"workload:\n"
		"  -w, --workload NAME[,NAME...]  named profile(s), default 4k-randread:\n");
	for (size_t i = 0; i < sizeof(workloads) / sizeof(workloads[0]); i++)
		fprintf(f, "      %-14s %s%s\n", workloads[i].name, workloads[i].what,
			workloads[i].sweep ? "" : ", 16T16Q");
	fprintf(f,
		"  -b, --bs SIZE            bytes per command (4k, 128k, ...)\n"
		"  -r, --read-pct PCT       share of reads, 0..100\n"
		"      --seq | --rand       sequential (one stream per session) or uniform random\n"
		"      --offset SIZE        start of the range used on the LUN (default 0)\n"
		"      --size SIZE          length of that range (default: to the end of the LUN)\n"
		"  -t, --sessions N         sessions (the reviews' threads)\n"
		"  -q, --qd N               outstanding commands per session\n"
		"      --loads TxQ,...      a load sweep, e.g. 2x2,4x4,16x16\n"
		"  -T, --time SEC           measured seconds per run (default 10)\n"
		"  -n, --count N            stop after N commands instead\n"
		"      --precondition SEC   run the workload SEC seconds unmeasured first\n"
		"                           (sweeps: once, at the highest load)\n"
		"      --verify             write stamped blocks, check every read, read all\n"
		"                           written blocks back at the end (exit 1 on mismatch)\n"
		"      --seed N             random seed (stamps, offsets and arrivals)\n"
		"open loop (latency as hosts feel it):\n"
		"      --rate IOPS          commands arrive at IOPS per second whatever the target\n"
		"                           does; -t x -q caps what is in flight (default 1x64);\n"
		"                           latency runs from each command's intended start\n"
		"      --rates R1,R2,...    one run per offered rate (latency vs load, --svg draws it)\n"
		"      --arrivals poisson|fixed  random (default) or evenly spaced arrivals\n"
		"      --latency-from intended|issue  issue: measure from the send instead (the\n"
		"                           coordinated-omission error of closed-loop tools)\n"
		"      --compare URL2       run every row on URL2 too, alternately, with ratios\n"
		"      --label2 TEXT        name of URL2's configuration (default \"B\")\n"
		"output:\n"
		"      --json               JSON on stdout instead of the table\n"
		"      --io-log FILE        every command: DUE SENT DONE (ns from its run's start),\n"
		"                           r|w and LBA; a \"# run N LABEL WORKLOAD TxQ rate R\"\n"
		"                           line opens each run (N as in the JSON runs array)\n"
		"      --svg FILE           charts: sweep (IOPS and latency vs load), bars per\n"
		"                           workload and label; with --from, from saved JSON\n"
		"      --from FILE          a saved --json document to chart (repeatable)\n"
		"      --label TEXT         name of this configuration (e.g. \"cache on\")\n"
		"      --no-progress        no live line even on a terminal\n"
		"connection:\n"
		"      --initiator IQN      initiator name (default " DEFAULT_INITIATOR ")\n"
		"      --login-timeout SEC  default 10\n"
		"      --io-timeout SEC     a command unanswered this long is an error (default 120)\n"
		"      --digest             CRC32C header digest\n"
		"CHAP: user%%secret@ in the URL, or LIBISCSI_CHAP_USERNAME/LIBISCSI_CHAP_PASSWORD.\n"
		"Exit: 0 ok, 1 verify mismatch, 2 usage / connection / target error.\n");
}

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	/* libiscsi's messages can span lines; the user gets one */
	fputs("tierbench: ", stderr);
	for (const char *p = msg; *p; p++) {
		if (*p == '\n') {
			if (p[1])
				fputs("; ", stderr);
		} else {
			fputc(*p, stderr);
		}
	}
	fputc('\n', stderr);
	exit(2);
}

static const struct workload *find_workload(const char *name)
{
	for (size_t i = 0; i < sizeof(workloads) / sizeof(workloads[0]); i++)
		if (!strcmp(workloads[i].name, name))
			return &workloads[i];
	return NULL;
}

/* "4096", "4k", "64M", "1.5G" (powers of 1024, like the config file) */
static int parse_size(const char *s, uint64_t *out)
{
	char *end;
	double v = strtod(s, &end);
	if (end == s || !(v >= 0))
		return -1;
	double mul = 1;
	switch (*end) {
	case 'k': case 'K': mul = 1024.0; end++; break;
	case 'm': case 'M': mul = 1048576.0; end++; break;
	case 'g': case 'G': mul = 1073741824.0; end++; break;
	case 't': case 'T': mul = 1099511627776.0; end++; break;
	}
	if ((*end == 'i' || *end == 'I') && mul > 1)
		end++;
	if (*end == 'b' || *end == 'B')
		end++;
	if (*end || v * mul > 1.8e19)
		return -1;
	*out = (uint64_t)(v * mul);
	return 0;
}

static uint64_t parse_size_arg(const char *opt, const char *s)
{
	uint64_t v;
	if (parse_size(s, &v))
		die("%s \"%s\" is not a size; use bytes or K, M, G, T (e.g. 4k, 64M)", opt, s);
	return v;
}

static long parse_int_arg(const char *opt, const char *s, long lo, long hi)
{
	char *end;
	long v = strtol(s, &end, 10);
	if (!*s || *end || v < lo || v > hi)
		die("%s \"%s\" must be a whole number from %ld to %ld", opt, s, lo, hi);
	return v;
}

static double parse_secs_arg(const char *opt, const char *s)
{
	char *end;
	double v = strtod(s, &end);
	if (!*s || *end || !(v >= 0) || v > 1e6)
		die("%s \"%s\" must be a number of seconds", opt, s);
	return v;
}

/* "16T16Q", "16x16" -> sessions, qd */
static bool parse_load(const char *s, int *t, int *q)
{
	char sep1 = 0, sep2 = 0;
	int n = 0;
	if (sscanf(s, "%d%c%d%c%n", t, &sep1, q, &sep2, &n) >= 3 &&
	    (sep1 == 'x' || sep1 == 'X' || sep1 == 'T' || sep1 == 't'))
		return *t > 0 && *t <= 1024 && *q > 0 && *q <= 1024 &&
		       (sep2 == 0 || sep2 == 'Q' || sep2 == 'q');
	return false;
}

/* ---- report -------------------------------------------------------------- */

static void fmt_lat(char *buf, size_t len, double ns)
{
	if (ns < 1e6)
		snprintf(buf, len, "%.1fus", ns / 1e3);
	else if (ns < 1e9)
		snprintf(buf, len, "%.2fms", ns / 1e6);
	else
		snprintf(buf, len, "%.3fs", ns / 1e9);
}

static void print_row(const char *name, const char *load, uint64_t ios, uint64_t bytes,
		      double secs, const struct tb_hist *h, double cpu)
{
	char avg[16], p50[16], p99[16], p999[16], p9999[16], max[16], sd[16];
	fmt_lat(avg, sizeof(avg), tb_hist_mean(h));
	fmt_lat(p50, sizeof(p50), (double)tb_hist_quantile(h, 0.50));
	fmt_lat(p99, sizeof(p99), (double)tb_hist_quantile(h, 0.99));
	fmt_lat(p999, sizeof(p999), (double)tb_hist_quantile(h, 0.999));
	fmt_lat(p9999, sizeof(p9999), (double)tb_hist_quantile(h, 0.9999));
	fmt_lat(max, sizeof(max), (double)h->max_ns);
	fmt_lat(sd, sizeof(sd), tb_hist_stddev(h));
	double iops = secs > 0 ? (double)ios / secs : 0;
	double mbs = secs > 0 ? (double)bytes / secs / 1e6 : 0;
	printf("%-14s %-12s %10.0f %9.1f %9s %9s %9s %9s %9s %9s %9s", name, load, iops, mbs, avg,
	       p50, p99, p999, p9999, max, sd);
	if (cpu >= 0)
		printf(" %6.0f", secs > 0 ? 100.0 * cpu / secs : 0);
	printf("\n");
}

static void print_table_head(void)
{
	printf("%-14s %-12s %10s %9s %9s %9s %9s %9s %9s %9s %9s %6s\n", "workload", "load", "IOPS", "MB/s",
	       "avg", "p50", "p99", "p99.9", "p99.99", "max", "stddev", "cpu%");
}

/* "16T16Q", or for the open loop "1T64Q@500" (offered commands per second) */
static void load_name(const struct tb_job *j, char *buf, size_t len)
{
	if (j->rate > 0)
		snprintf(buf, len, "%dT%dQ@%.0f", j->sessions, j->qd, j->rate);
	else
		snprintf(buf, len, "%dT%dQ", j->sessions, j->qd);
}

/* All commands of a run, reads and writes together. */
static void hist_all(const struct tb_result *r, struct tb_hist *all)
{
	tb_hist_reset(all);
	tb_hist_merge(all, &r->rd.lat);
	tb_hist_merge(all, &r->wr.lat);
}

static void print_result(const struct tb_result *r)
{
	char load[32];
	load_name(&r->job, load, sizeof(load));
	struct tb_hist all;
	hist_all(r, &all);
	print_row(r->job.name, load, r->rd.ios + r->wr.ios, r->rd.bytes + r->wr.bytes, r->elapsed,
		  &all, r->client_cpu);
	if (r->rd.ios && r->wr.ios) {
		print_row("  read", "", r->rd.ios, r->rd.bytes, r->elapsed, &r->rd.lat, -1);
		print_row("  write", "", r->wr.ios, r->wr.bytes, r->elapsed, &r->wr.lat, -1);
	}
	fflush(stdout);
}

static struct json_object *jnum(double v, int decimals)
{
	char buf[64];
	if (!isfinite(v))
		v = 0;
	snprintf(buf, sizeof(buf), "%.*f", decimals, v);
	return json_object_new_double_s(atof(buf), buf);
}

static struct json_object *json_lat(const struct tb_hist *h)
{
	struct json_object *o = json_object_new_object();
	json_object_object_add(o, "avg", jnum(tb_hist_mean(h) / 1e3, 1));
	json_object_object_add(o, "min", jnum(h->count ? (double)h->min_ns / 1e3 : 0, 1));
	json_object_object_add(o, "p50", jnum((double)tb_hist_quantile(h, 0.50) / 1e3, 1));
	json_object_object_add(o, "p99", jnum((double)tb_hist_quantile(h, 0.99) / 1e3, 1));
	json_object_object_add(o, "p99_9", jnum((double)tb_hist_quantile(h, 0.999) / 1e3, 1));
	json_object_object_add(o, "p99_99", jnum((double)tb_hist_quantile(h, 0.9999) / 1e3, 1));
	json_object_object_add(o, "max", jnum((double)h->max_ns / 1e3, 1));
	json_object_object_add(o, "stddev", jnum(tb_hist_stddev(h) / 1e3, 1));
	return o;
}

static struct json_object *json_side(uint64_t ios, uint64_t bytes, double secs,
				     const struct tb_hist *h)
{
	struct json_object *o = json_object_new_object();
	json_object_object_add(o, "ios", json_object_new_int64((int64_t)ios));
	json_object_object_add(o, "iops", jnum(secs > 0 ? (double)ios / secs : 0, 1));
	json_object_object_add(o, "mb_per_s", jnum(secs > 0 ? (double)bytes / secs / 1e6 : 0, 2));
	json_object_object_add(o, "latency_us", json_lat(h));
	return o;
}

static struct json_object *json_result(const struct tb_result *r, const char *label)
{
	const struct tb_job *j = &r->job;
	struct json_object *o = json_object_new_object();
	char load[32];
	load_name(j, load, sizeof(load));
	if (label)
		json_object_object_add(o, "label", json_object_new_string(label));
	json_object_object_add(o, "workload", json_object_new_string(j->name));
	json_object_object_add(o, "block_size", json_object_new_int64(j->bs));
	json_object_object_add(o, "read_pct", json_object_new_int(j->read_pct));
	json_object_object_add(o, "pattern", json_object_new_string(j->sequential ? "sequential" :
								       "random"));
	json_object_object_add(o, "offset", json_object_new_int64((int64_t)j->offset));
	json_object_object_add(o, "span", json_object_new_int64((int64_t)j->span));
	json_object_object_add(o, "sessions", json_object_new_int(j->sessions));
	json_object_object_add(o, "qd", json_object_new_int(j->qd));
	json_object_object_add(o, "load", json_object_new_string(load));
	json_object_object_add(o, "sweep", json_object_new_boolean(j->in_sweep));
	if (j->rate > 0) {
		json_object_object_add(o, "offered_iops", jnum(j->rate, 1));
		json_object_object_add(o, "arrivals", json_object_new_string(j->fixed_arrivals ? "fixed" :
										     "poisson"));
		json_object_object_add(o, "latency_from", json_object_new_string(j->from_issue ? "issue" :
											 "intended"));
		json_object_object_add(o, "rate_sweep", json_object_new_boolean(j->in_rate_sweep));
		/* arrivals that found every slot busy and waited (> 1 ms) for one */
		json_object_object_add(o, "sent_late", json_object_new_int64((int64_t)r->sent_late));
		json_object_object_add(o, "send_late_max_us", jnum((double)r->send_late_max_ns / 1e3, 1));
		json_object_object_add(o, "service_us", json_lat(&r->service));
	}
	json_object_object_add(o, "seconds", jnum(r->elapsed, 3));
	json_object_object_add(o, "precondition_s", jnum(j->precondition, 1));
	/* share of one CPU the client itself used: the target had the rest */
	json_object_object_add(o, "client_cpu_pct",
			       jnum(r->elapsed > 0 ? 100.0 * r->client_cpu / r->elapsed : 0, 1));
	struct tb_hist all;
	hist_all(r, &all);
	uint64_t ios = r->rd.ios + r->wr.ios, bytes = r->rd.bytes + r->wr.bytes;
	json_object_object_add(o, "ios", json_object_new_int64((int64_t)ios));
	json_object_object_add(o, "iops", jnum(r->elapsed > 0 ? (double)ios / r->elapsed : 0, 1));
	json_object_object_add(o, "mb_per_s",
			       jnum(r->elapsed > 0 ? (double)bytes / r->elapsed / 1e6 : 0, 2));
	json_object_object_add(o, "latency_us", json_lat(&all));
	/* commands completed by the least and the most served session */
	json_object_object_add(o, "session_ios_min", json_object_new_int64((int64_t)r->session_ios_min));
	json_object_object_add(o, "session_ios_max", json_object_new_int64((int64_t)r->session_ios_max));
	json_object_object_add(o, "read", json_side(r->rd.ios, r->rd.bytes, r->elapsed, &r->rd.lat));
	json_object_object_add(o, "write",
			       json_side(r->wr.ios, r->wr.bytes, r->elapsed, &r->wr.lat));
	if (j->verify) {
		struct json_object *v = json_object_new_object();
		json_object_object_add(v, "reads_checked",
				       json_object_new_int64((int64_t)r->verify_checked));
		json_object_object_add(v, "mismatches",
				       json_object_new_int64((int64_t)r->verify_mismatches));
		json_object_object_add(o, "verify", v);
	}
	if (r->interrupted)
		json_object_object_add(o, "interrupted", json_object_new_boolean(1));
	return o;
}

static double ratio(double b, double a)
{
	return a > 0 ? b / a : 0;
}

struct cmp_row {
	double iops, avg, p50, p99, p999, p9999, max;
};

/* Second target over first, row by row: IOPS and every latency figure. */
static struct cmp_row compare_results(const struct tb_result *a, const struct tb_result *b)
{
	struct tb_hist ha, hb;
	hist_all(a, &ha);
	hist_all(b, &hb);
	double ia = a->elapsed > 0 ? (double)(a->rd.ios + a->wr.ios) / a->elapsed : 0;
	double ib = b->elapsed > 0 ? (double)(b->rd.ios + b->wr.ios) / b->elapsed : 0;
	struct cmp_row c = {
		.iops = ratio(ib, ia),
		.avg = ratio(tb_hist_mean(&hb), tb_hist_mean(&ha)),
		.p50 = ratio((double)tb_hist_quantile(&hb, 0.5), (double)tb_hist_quantile(&ha, 0.5)),
		.p99 = ratio((double)tb_hist_quantile(&hb, 0.99), (double)tb_hist_quantile(&ha, 0.99)),
		.p999 = ratio((double)tb_hist_quantile(&hb, 0.999), (double)tb_hist_quantile(&ha, 0.999)),
		.p9999 = ratio((double)tb_hist_quantile(&hb, 0.9999), (double)tb_hist_quantile(&ha, 0.9999)),
		.max = ratio((double)hb.max_ns, (double)ha.max_ns),
	};
	return c;
}

static void print_ratio(const struct cmp_row *c, const char *la, const char *lb)
{
	char name[64];
	snprintf(name, sizeof(name), "  %s/%s", lb, la);
	printf("%-27s %9.2fx %9s %8.2fx %8.2fx %8.2fx %8.2fx %8.2fx %8.2fx\n", name, c->iops, "", c->avg, c->p50,
	       c->p99, c->p999, c->p9999, c->max);
	fflush(stdout);
}

static struct json_object *json_compare(const struct cmp_row *c, const struct tb_job *j)
{
	struct json_object *o = json_object_new_object();
	char load[32];
	load_name(j, load, sizeof(load));
	json_object_object_add(o, "workload", json_object_new_string(j->name));
	json_object_object_add(o, "load", json_object_new_string(load));
	json_object_object_add(o, "iops", jnum(c->iops, 3));
	json_object_object_add(o, "avg", jnum(c->avg, 3));
	json_object_object_add(o, "p50", jnum(c->p50, 3));
	json_object_object_add(o, "p99", jnum(c->p99, 3));
	json_object_object_add(o, "p99_9", jnum(c->p999, 3));
	json_object_object_add(o, "p99_99", jnum(c->p9999, 3));
	json_object_object_add(o, "max", jnum(c->max, 3));
	return o;
}

/* The URL without its CHAP secret. */
static void redact_url(const char *url, char *out, size_t len)
{
	const char *at = strchr(url, '@');
	const char *pct = strchr(url, '%');
	const char *scheme = strstr(url, "://");
	if (at && pct && scheme && pct < at && pct > scheme)
		snprintf(out, len, "%.*s%s", (int)(pct - url), url, at);
	else
		snprintf(out, len, "%s", url);
}

static bool portal_is_local(const char *portal)
{
	return !strncmp(portal, "127.", 4) || !strncmp(portal, "localhost", 9) ||
	       !strncmp(portal, "[::1]", 5) || !strncmp(portal, "::1", 3);
}

/* ---- jobs from options ----------------------------------------------------- */

/* A seed per run from the user's: splitmix64's finaliser, so nearby seeds
 * give unrelated streams (the generator steps by a constant, and seed + k
 * steps would be the same stream shifted). */
static uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
	z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
	return z ^ (z >> 31);
}

static int build_jobs(const struct opts *o, uint32_t lbs, uint64_t capacity, struct tb_job *jobs,
		      int max)
{
	int n = 0;
	char list[sizeof(o->workload_list)];
	snprintf(list, sizeof(list), "%s", o->workload_list);
	char *save = NULL;
	for (char *name = strtok_r(list, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
		const struct workload *w = find_workload(name);
		if (!w)
			die("no workload named \"%s\"; tierbench --help lists them", name);
		struct tb_job j;
		memset(&j, 0, sizeof(j));
		snprintf(j.name, sizeof(j.name), "%s", w->sweep ? "8k-7030" : w->name);
		j.bs = o->bs > 0 ? (uint32_t)o->bs : w->bs;
		j.read_pct = o->read_pct >= 0 ? o->read_pct : w->read_pct;
		j.sequential = o->sequential >= 0 ? o->sequential : w->sequential;
		if (j.bs != w->bs || j.read_pct != w->read_pct || j.sequential != w->sequential) {
			/* flags changed the profile: name what actually runs */
			char bs[16];
			if (j.bs % 1024 == 0)
				snprintf(bs, sizeof(bs), "%uk", j.bs / 1024);
			else
				snprintf(bs, sizeof(bs), "%u", j.bs);
			snprintf(j.name, sizeof(j.name), "%s-%s%d", bs, j.sequential ? "seq" : "rand",
				 j.read_pct);
		}
		j.offset = o->offset;
		if (o->offset >= capacity)
			die("--offset %llu is past the end of the LUN (%llu bytes)",
			    (unsigned long long)o->offset, (unsigned long long)capacity);
		j.span = o->size ? o->size : (capacity > o->offset ? capacity - o->offset : 0);
		j.seconds = o->seconds;
		j.count = o->count;
		j.precondition = o->precondition;
		j.verify = o->verify;
		if (j.bs % lbs)
			die("block size %u is not a multiple of the LUN's %u-byte blocks", j.bs, lbs);
		if (j.offset % lbs)
			die("--offset %llu is not a multiple of the LUN's %u-byte blocks",
			    (unsigned long long)j.offset, lbs);
		if (j.offset + j.span > capacity)
			die("range %llu+%llu ends past the LUN's %llu bytes",
			    (unsigned long long)j.offset, (unsigned long long)j.span,
			    (unsigned long long)capacity);
		j.span = j.span / j.bs * j.bs;

		/* loads: --loads, else -t/-q, else the profile's */
		int lt[64], lq[64], nl = 0;
		if (o->loads[0]) {
			char l2[sizeof(o->loads)];
			snprintf(l2, sizeof(l2), "%s", o->loads);
			char *s2 = NULL;
			for (char *p = strtok_r(l2, ",", &s2); p && nl < 64; p = strtok_r(NULL, ",", &s2)) {
				if (!parse_load(p, &lt[nl], &lq[nl]))
					die("--loads item \"%s\" is not a load; write TxQ like 4x16 or 4T16Q", p);
				nl++;
			}
		} else if (w->sweep && !o->sessions && !o->qd) {
			for (int a = 0; a < 4; a++)
				for (int c = 0; c < 4; c++) {
					lt[nl] = sweep_axis[a];
					lq[nl] = sweep_axis[c];
					nl++;
				}
		} else if (o->rate > 0 || o->rates[0]) {
			/* open loop: the cap on what is in flight, not the load */
			lt[0] = o->sessions ? o->sessions : 1;
			lq[0] = o->qd ? o->qd : 64;
			nl = 1;
		} else {
			lt[0] = o->sessions ? o->sessions : 16;
			lq[0] = o->qd ? o->qd : 16;
			nl = 1;
		}
		double rt[64];
		int nr = 0;
		if (o->rates[0]) {
			char r2[sizeof(o->rates)];
			snprintf(r2, sizeof(r2), "%s", o->rates);
			char *s3 = NULL;
			for (char *p = strtok_r(r2, ",", &s3); p && nr < 64; p = strtok_r(NULL, ",", &s3)) {
				char *end;
				rt[nr] = strtod(p, &end);
				if (end == p || *end || !(rt[nr] > 0) || rt[nr] > 1e7)
					die("--rates item \"%s\" is not a rate; give commands per second, like 500", p);
				nr++;
			}
			if (nl > 1)
				die("give --rates or --loads, not both: an open-loop sweep varies the offered rate");
		} else {
			rt[0] = o->rate;
			nr = 1;
		}
		int maxt = 0, maxq = 0;
		for (int i = 0; i < nl; i++) {
			if (lt[i] * lq[i] > maxt * maxq) {
				maxt = lt[i];
				maxq = lq[i];
			}
		}
		for (int i = 0; i < nl * nr; i++) {
			if (n >= max)
				die("too many runs (more than %d)", max);
			struct tb_job *jj = &jobs[n++];
			*jj = j;
			jj->rate = rt[i % nr];
			jj->fixed_arrivals = o->fixed_arrivals;
			jj->from_issue = o->from_issue;
			jj->in_rate_sweep = nr > 1;
			jj->arrival_seed = o->seed ? mix64(o->seed ^ ((uint64_t)n << 40)) : 0;
			if (nr > 1 && i > 0)
				jj->precondition = 0; /* once, before the first rate */
			int li = i / nr;
			jj->sessions = lt[li];
			jj->qd = lq[li];
			jj->in_sweep = nl > 1;
			if (nl > 1) {
				/* a sweep is preconditioned once, at its heaviest load */
				jj->precondition = li == 0 ? o->precondition : 0;
				jj->pre_sessions = maxt;
				jj->pre_qd = maxq;
			}
			uint64_t units = jj->span / jj->bs;
			uint64_t outstanding = (uint64_t)jj->sessions * (uint64_t)jj->qd;
			if (units == 0)
				die("range of %llu bytes holds no %u-byte command", (unsigned long long)jj->span,
				    jj->bs);
			if (jj->sequential && units / (uint64_t)jj->sessions < (uint64_t)jj->qd * 2)
				die("range too small for %d sequential streams of %d x %u bytes",
				    jj->sessions, jj->qd, jj->bs);
			if (o->verify && units < outstanding * 2)
				die("--verify needs a range of at least %llu blocks of %u bytes for %dT%dQ",
				    (unsigned long long)(outstanding * 2), jj->bs, jj->sessions, jj->qd);
		}
	}
	if (o->verify)
		for (int i = 1; i < n; i++)
			if (jobs[i].bs != jobs[0].bs)
				die("--verify needs one block size for all workloads (%u and %u given)",
				    jobs[0].bs, jobs[i].bs);
	return n;
}

static void on_sigint(int sig)
{
	(void)sig;
	tb_interrupted = 1;
}

/* The line that opens one run in the --io-log file. */
static void io_log_head(FILE *f, int n, const char *label, const struct tb_job *j)
{
	fprintf(f, "# run %d %s %s %dx%d rate %g\n", n, label ? label : "-", j->name, j->sessions,
		j->qd, j->rate);
}

static int svg_from_files(const struct opts *o)
{
	struct json_object *docs[MAX_FROM];
	for (int i = 0; i < o->nfrom; i++) {
		docs[i] = json_object_from_file(o->from[i]);
		if (!docs[i])
			die("cannot read tierbench JSON from %s: %s", o->from[i], json_util_get_last_err());
	}
	char err[256];
	if (tb_svg_write(o->svg, docs, o->nfrom, err, sizeof(err)))
		die("%s", err);
	for (int i = 0; i < o->nfrom; i++)
		json_object_put(docs[i]);
	return 0;
}

enum {
	OPT_SEQ = 256, OPT_RAND, OPT_OFFSET, OPT_SIZE, OPT_LOADS, OPT_PRECOND, OPT_VERIFY, OPT_SEED,
	OPT_JSON, OPT_SVG, OPT_FROM, OPT_LABEL, OPT_NOPROG, OPT_INIT, OPT_LTO, OPT_IOTO, OPT_DIGEST,
	OPT_RATE, OPT_RATES, OPT_ARRIVALS, OPT_LATFROM, OPT_COMPARE, OPT_LABEL2, OPT_IOLOG,
};

static const struct option long_opts[] = {
	{ "workload", required_argument, 0, 'w' },
	{ "bs", required_argument, 0, 'b' },
	{ "read-pct", required_argument, 0, 'r' },
	{ "seq", no_argument, 0, OPT_SEQ },
	{ "rand", no_argument, 0, OPT_RAND },
	{ "offset", required_argument, 0, OPT_OFFSET },
	{ "size", required_argument, 0, OPT_SIZE },
	{ "sessions", required_argument, 0, 't' },
	{ "qd", required_argument, 0, 'q' },
	{ "loads", required_argument, 0, OPT_LOADS },
	{ "time", required_argument, 0, 'T' },
	{ "count", required_argument, 0, 'n' },
	{ "precondition", required_argument, 0, OPT_PRECOND },
	{ "verify", no_argument, 0, OPT_VERIFY },
	{ "seed", required_argument, 0, OPT_SEED },
	{ "json", no_argument, 0, OPT_JSON },
	{ "svg", required_argument, 0, OPT_SVG },
	{ "from", required_argument, 0, OPT_FROM },
	{ "label", required_argument, 0, OPT_LABEL },
	{ "no-progress", no_argument, 0, OPT_NOPROG },
	{ "initiator", required_argument, 0, OPT_INIT },
	{ "login-timeout", required_argument, 0, OPT_LTO },
	{ "io-timeout", required_argument, 0, OPT_IOTO },
	{ "digest", no_argument, 0, OPT_DIGEST },
	{ "rate", required_argument, 0, OPT_RATE },
	{ "rates", required_argument, 0, OPT_RATES },
	{ "arrivals", required_argument, 0, OPT_ARRIVALS },
	{ "latency-from", required_argument, 0, OPT_LATFROM },
	{ "compare", required_argument, 0, OPT_COMPARE },
	{ "label2", required_argument, 0, OPT_LABEL2 },
	{ "io-log", required_argument, 0, OPT_IOLOG },
	{ "help", no_argument, 0, 'h' },
	{ 0, 0, 0, 0 },
};

static void parse_opts(int argc, char **argv, struct opts *o)
{
	memset(o, 0, sizeof(*o));
	snprintf(o->workload_list, sizeof(o->workload_list), "4k-randread");
	o->bs = -1;
	o->read_pct = -1;
	o->sequential = -1;
	o->seconds = -1;
	o->progress = true;
	o->initiator = DEFAULT_INITIATOR;
	o->login_timeout = 10;
	o->io_timeout = 120;
	int c;
	while ((c = getopt_long(argc, argv, "w:b:r:t:q:T:n:h", long_opts, NULL)) != -1) {
		switch (c) {
		case 'w':
			if (strlen(optarg) >= sizeof(o->workload_list))
				die("--workload list too long");
			snprintf(o->workload_list, sizeof(o->workload_list), "%s", optarg);
			break;
		case 'b': {
			uint64_t v = parse_size_arg("--bs", optarg);
			if (v < 512 || v > 16u << 20 || v % 512)
				die("--bs %s must be a multiple of 512 bytes up to 16M", optarg);
			o->bs = (long)v;
			break;
		}
		case 'r': o->read_pct = (int)parse_int_arg("--read-pct", optarg, 0, 100); break;
		case OPT_SEQ: o->sequential = 1; break;
		case OPT_RAND: o->sequential = 0; break;
		case OPT_OFFSET: o->offset = parse_size_arg("--offset", optarg); break;
		case OPT_SIZE: o->size = parse_size_arg("--size", optarg); break;
		case 't': o->sessions = (int)parse_int_arg("--sessions", optarg, 1, 1024); break;
		case 'q': o->qd = (int)parse_int_arg("--qd", optarg, 1, 1024); break;
		case OPT_LOADS:
			if (strlen(optarg) >= sizeof(o->loads))
				die("--loads list too long");
			snprintf(o->loads, sizeof(o->loads), "%s", optarg);
			break;
		case 'T': o->seconds = parse_secs_arg("--time", optarg); break;
		case 'n': o->count = (uint64_t)parse_int_arg("--count", optarg, 1, 2000000000L); break;
		case OPT_PRECOND: o->precondition = parse_secs_arg("--precondition", optarg); break;
		case OPT_VERIFY: o->verify = true; break;
		case OPT_SEED: o->seed = strtoull(optarg, NULL, 0); break;
		case OPT_JSON: o->json = true; break;
		case OPT_SVG: o->svg = optarg; break;
		case OPT_FROM:
			if (o->nfrom >= MAX_FROM)
				die("at most %d --from files", MAX_FROM);
			o->from[o->nfrom++] = optarg;
			break;
		case OPT_LABEL: o->label = optarg; break;
		case OPT_NOPROG: o->progress = false; break;
		case OPT_INIT: o->initiator = optarg; break;
		case OPT_LTO: o->login_timeout = (int)parse_int_arg("--login-timeout", optarg, 1, 3600); break;
		case OPT_IOTO: o->io_timeout = (int)parse_int_arg("--io-timeout", optarg, 0, 86400); break;
		case OPT_DIGEST: o->digest = true; break;
		case OPT_RATE: {
			char *end;
			o->rate = strtod(optarg, &end);
			if (end == optarg || *end || !(o->rate > 0) || o->rate > 1e7)
				die("--rate \"%s\" must be commands per second, more than 0", optarg);
			break;
		}
		case OPT_RATES:
			if (strlen(optarg) >= sizeof(o->rates))
				die("--rates list too long");
			snprintf(o->rates, sizeof(o->rates), "%s", optarg);
			break;
		case OPT_ARRIVALS:
			if (!strcmp(optarg, "poisson"))
				o->fixed_arrivals = false;
			else if (!strcmp(optarg, "fixed"))
				o->fixed_arrivals = true;
			else
				die("--arrivals \"%s\": use poisson or fixed", optarg);
			break;
		case OPT_LATFROM:
			if (!strcmp(optarg, "intended"))
				o->from_issue = false;
			else if (!strcmp(optarg, "issue"))
				o->from_issue = true;
			else
				die("--latency-from \"%s\": use intended or issue", optarg);
			break;
		case OPT_COMPARE: o->compare = optarg; break;
		case OPT_LABEL2: o->label2 = optarg; break;
		case OPT_IOLOG: o->io_log = optarg; break;
		case 'h': usage(stdout); exit(0);
		default: usage(stderr); exit(2);
		}
	}
	if (optind < argc)
		o->url = argv[optind++];
	if (optind < argc)
		die("unexpected argument \"%s\" after the URL", argv[optind]);
	if (o->nfrom && o->url)
		die("give either a URL to measure or --from files to chart, not both");
	if (o->nfrom && !o->svg)
		die("--from needs --svg FILE");
	if (!o->url && !o->nfrom) {
		usage(stderr);
		exit(2);
	}
	if (o->seconds < 0)
		o->seconds = o->count ? 0 : 10;
	if (o->seconds == 0 && !o->count)
		die("--time 0 needs --count N");
	if (o->rate > 0 && o->rates[0])
		die("give --rate or --rates, not both");
	if ((o->fixed_arrivals || o->from_issue) && !(o->rate > 0) && !o->rates[0])
		die("--arrivals and --latency-from shape the open loop: add --rate IOPS");
	if (o->compare && o->verify)
		die("--verify checks one target: leave out --compare");
	if (o->compare && o->nfrom)
		die("--compare measures; --from charts saved results: not both");
	if (o->io_log && o->nfrom)
		die("--io-log records a measurement; --from charts saved results: not both");
}

int main(int argc, char **argv)
{
	struct opts o;
	parse_opts(argc, argv, &o);
	if (o.nfrom)
		return svg_from_files(&o);

	struct sigaction sa = { .sa_handler = on_sigint };
	sigaction(SIGINT, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);

	if (!isatty(STDOUT_FILENO) || o.json)
		o.progress = false;

	/* sessions: the most any run needs (the same rules as build_jobs) */
	int maxs = o.sessions ? o.sessions : 16;
	if (strstr(o.workload_list, "sweep") && !o.sessions && !o.qd)
		maxs = sweep_axis[sizeof(sweep_axis) / sizeof(sweep_axis[0]) - 1];
	if (o.loads[0]) {
		char l2[sizeof(o.loads)];
		snprintf(l2, sizeof(l2), "%s", o.loads);
		char *s2 = NULL;
		maxs = 0;
		for (char *p = strtok_r(l2, ",", &s2); p; p = strtok_r(NULL, ",", &s2)) {
			int t, q;
			if (parse_load(p, &t, &q) && t > maxs)
				maxs = t;
		}
		if (!maxs)
			die("--loads \"%s\" has no load; write TxQ like 4x16", o.loads);
	}

	char err[768];
	struct tb_connect_opts co = {
		.url = o.url, .sessions = maxs, .initiator = o.initiator,
		.login_timeout = o.login_timeout, .io_timeout = o.io_timeout,
		.header_digest = o.digest,
	};
	struct tb_bench *b = tb_connect(&co, err, sizeof(err));
	if (!b)
		die("%s", err);
	struct tb_bench *b2 = NULL;
	if (o.compare) {
		co.url = o.compare;
		b2 = tb_connect(&co, err, sizeof(err));
		if (!b2) {
			tb_close(b);
			die("%s (the --compare target)", err);
		}
		if (tb_block_size(b2) != tb_block_size(b))
			die("the two targets have different block sizes (%u and %u bytes)", tb_block_size(b),
			    tb_block_size(b2));
	}
	FILE *iolog = NULL;
	if (o.io_log) {
		iolog = fopen(o.io_log, "w");
		if (!iolog) {
			tb_close(b);
			tb_close(b2);
			die("--io-log %s: %s", o.io_log, strerror(errno));
		}
		static char iolog_buf[1 << 20];
		setvbuf(iolog, iolog_buf, _IOFBF, sizeof(iolog_buf));
		tb_set_io_log(b, iolog);
		if (b2)
			tb_set_io_log(b2, iolog);
	}
	if (o.rate > 0 || o.rates[0])
		prctl(PR_SET_TIMERSLACK, 1UL); /* arrivals on time to the microsecond, not 50 */
	const char *label_a = o.label ? o.label : o.compare ? "A" : NULL;
	const char *label_b = o.label2 ? o.label2 : "B";

	static struct tb_job jobs[MAX_JOBS];
	uint64_t cap = tb_capacity(b);
	if (b2 && tb_capacity(b2) < cap)
		cap = tb_capacity(b2); /* the range must fit both */
	int njobs = build_jobs(&o, tb_block_size(b), cap, jobs, MAX_JOBS);
	if (o.verify && tb_verify_setup(b, jobs[0].offset, jobs[0].span, jobs[0].bs, o.seed, err,
					sizeof(err)))
		die("%s", err);

	char url[512];
	redact_url(o.url, url, sizeof(url));
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	bool local = portal_is_local(tb_portal(b));
	char note[256];
	if (local)
		snprintf(note, sizeof(note),
			 "client and target run on this host and share its %ld CPUs: every figure includes the client's own CPU cost",
			 cpus);
	else
		snprintf(note, sizeof(note), "client host has %ld CPUs", cpus);

	if (!o.json) {
		printf("tierbench  %s  (%.1f MiB, %u-byte blocks)\n", url,
		       (double)tb_capacity(b) / 1048576.0, tb_block_size(b));
		if (b2) {
			char url2[512];
			redact_url(o.compare, url2, sizeof(url2));
			printf("compare    %s  (%.1f MiB): every row runs on %s, then on %s\n", url2,
			       (double)tb_capacity(b2) / 1048576.0, label_a, label_b);
		}
		printf("note: %s (cpu%% = the client's share of one CPU)\n", note);
		if (o.label && !b2)
			printf("label: %s\n", o.label);
		print_table_head();
		fflush(stdout);
	}

	static struct tb_result results[MAX_JOBS], results2[MAX_JOBS];
	static struct cmp_row cmp[MAX_JOBS];
	int nres = 0, rc = 0;
	uint64_t mism = 0, checked = 0;
	int nlogged = 0;
	for (int i = 0; i < njobs && !tb_interrupted; i++) {
		if (iolog)
			io_log_head(iolog, nlogged++, label_a, &jobs[i]);
		if (tb_run(b, &jobs[i], &results[nres], o.progress, err, sizeof(err))) {
			tb_close(b);
			tb_close(b2);
			die("%s", err);
		}
		mism += results[nres].verify_mismatches;
		checked += results[nres].verify_checked;
		if (!o.json) {
			if (b2)
				printf("%s:\n", label_a);
			print_result(&results[nres]);
		}
		if (b2 && !tb_interrupted) {
			if (iolog)
				io_log_head(iolog, nlogged++, label_b, &jobs[i]);
			if (tb_run(b2, &jobs[i], &results2[nres], o.progress, err, sizeof(err))) {
				tb_close(b);
				tb_close(b2);
				die("%s (the --compare target)", err);
			}
			cmp[nres] = compare_results(&results[nres], &results2[nres]);
			if (!o.json) {
				printf("%s:\n", label_b);
				print_result(&results2[nres]);
				print_ratio(&cmp[nres], label_a, label_b);
			}
		} else if (b2) {
			break;
		}
		nres++;
	}
	if (iolog) {
		tb_set_io_log(b, NULL);
		if (b2)
			tb_set_io_log(b2, NULL);
		int bad = ferror(iolog);
		if (fclose(iolog) || bad) {
			tb_close(b);
			tb_close(b2);
			die("--io-log %s: %s", o.io_log, bad ? "write error" : strerror(errno));
		}
	}
	uint64_t rb_checked = 0, rb_mism = 0;
	if (o.verify && !tb_interrupted) {
		if (tb_verify_readback(b, jobs[0].sessions, jobs[0].qd, &rb_checked, &rb_mism,
				       o.progress, err, sizeof(err))) {
			tb_close(b);
			die("%s", err);
		}
		mism += rb_mism;
	}
	if (o.verify && !o.json)
		printf("verify: %llu reads checked during the runs, %llu blocks read back at the end, %llu mismatches\n",
		       (unsigned long long)checked, (unsigned long long)rb_checked,
		       (unsigned long long)mism);
	if (tb_interrupted && !o.json)
		printf("interrupted: the last run stopped early; its figures cover the time it ran\n");
	if (mism)
		rc = 1;

	struct json_object *doc = json_object_new_object();
	json_object_object_add(doc, "tool", json_object_new_string("tierbench"));
	json_object_object_add(doc, "url", json_object_new_string(url));
	if (o.label)
		json_object_object_add(doc, "label", json_object_new_string(o.label));
	struct json_object *tgt = json_object_new_object();
	json_object_object_add(tgt, "block_size", json_object_new_int64(tb_block_size(b)));
	json_object_object_add(tgt, "bytes", json_object_new_int64((int64_t)tb_capacity(b)));
	json_object_object_add(doc, "lun", tgt);
	struct json_object *host = json_object_new_object();
	json_object_object_add(host, "cpus", json_object_new_int((int)cpus));
	json_object_object_add(host, "target_on_same_host", json_object_new_boolean(local));
	json_object_object_add(host, "note", json_object_new_string(note));
	json_object_object_add(doc, "host", host);
	struct json_object *runs = json_object_new_array();
	for (int i = 0; i < nres; i++) {
		json_object_array_add(runs, json_result(&results[i], label_a));
		if (b2)
			json_object_array_add(runs, json_result(&results2[i], label_b));
	}
	json_object_object_add(doc, "runs", runs);
	if (b2) {
		char url2[512];
		redact_url(o.compare, url2, sizeof(url2));
		json_object_object_add(doc, "compare_url", json_object_new_string(url2));
		/* per row: the second target's figure over the first's */
		struct json_object *ca = json_object_new_array();
		for (int i = 0; i < nres; i++)
			json_object_array_add(ca, json_compare(&cmp[i], &jobs[i]));
		json_object_object_add(doc, "compare", ca);
	}
	if (o.verify) {
		struct json_object *v = json_object_new_object();
		json_object_object_add(v, "reads_checked", json_object_new_int64((int64_t)checked));
		json_object_object_add(v, "read_back", json_object_new_int64((int64_t)rb_checked));
		json_object_object_add(v, "mismatches", json_object_new_int64((int64_t)mism));
		json_object_object_add(doc, "verify", v);
	}
	if (tb_interrupted)
		json_object_object_add(doc, "interrupted", json_object_new_boolean(1));
	if (o.json)
		printf("%s\n", json_object_to_json_string_ext(doc, JSON_C_TO_STRING_PRETTY |
								  JSON_C_TO_STRING_NOSLASHESCAPE));
	if (o.svg) {
		struct json_object *docs[1] = { doc };
		if (tb_svg_write(o.svg, docs, 1, err, sizeof(err))) {
			tb_close(b);
			die("%s", err);
		}
	}
	json_object_put(doc);
	tb_close(b);
	tb_close(b2);
	return rc;
}
