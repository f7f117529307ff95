/*
 * tierbench.h - the pieces of tierbench and what they share.
 *
 * tierbench measures an iSCSI LUN the way storage reviews do: N sessions
 * (the reviews' "threads") each keep QD commands outstanding, and every
 * command's latency goes into a log-linear histogram. The program is split
 * by concern:
 *
 *   tierbench.c       command line, named workloads, the table and the JSON
 *   tierbench_io.c    sessions, the one poll loop over all of them, I/O
 *                     generation, stamped-block verification
 *   tierbench_hist.c  the HDR-style latency histogram
 *   tierbench_svg.c   charts from JSON results (sweep, cache off/on bars)
 *
 * Everything runs on one thread; nothing here is thread-safe.
 */
#ifndef TIERBENCH_H
#define TIERBENCH_H

#include <json-c/json.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/*
 * Latency histogram, HDR style: values below 2*TB_HIST_SUB are exact, above
 * that each power of two is cut into TB_HIST_SUB equal buckets, so every
 * bucket is narrower than 1/TB_HIST_SUB of its value (0.8 %). Values are in
 * nanoseconds; the top bucket range reaches past 1000 seconds.
 */
#define TB_HIST_SUB_BITS 7
#define TB_HIST_SUB (1u << TB_HIST_SUB_BITS)
#define TB_HIST_MAX_SHIFT 34
#define TB_HIST_BUCKETS ((TB_HIST_MAX_SHIFT + 2) * TB_HIST_SUB)

struct tb_hist {
	uint64_t count;
	uint64_t min_ns, max_ns;
	double sum_ns, sumsq_ns;         /* exact mean and standard deviation */
	uint64_t bucket[TB_HIST_BUCKETS];
};

void tb_hist_reset(struct tb_hist *h);
void tb_hist_add(struct tb_hist *h, uint64_t ns);
void tb_hist_merge(struct tb_hist *dst, const struct tb_hist *src);
/* The value at quantile q (0..1): the highest value of the bucket holding
 * it, clamped to the exact maximum. 0 for an empty histogram. */
uint64_t tb_hist_quantile(const struct tb_hist *h, double q);
double tb_hist_mean(const struct tb_hist *h);
double tb_hist_stddev(const struct tb_hist *h);

/* One measured run: a workload at one load. */
struct tb_job {
	char name[48];        /* workload name shown in reports */
	uint32_t bs;          /* bytes per command */
	int read_pct;         /* 0..100 */
	bool sequential;
	uint64_t offset;      /* bytes into the LUN where the range starts */
	uint64_t span;        /* bytes in the range (resolved, never 0) */
	int sessions, qd;
	double seconds;       /* time bound, 0 = none */
	uint64_t count;       /* command count bound, 0 = none */
	double precondition;  /* seconds of the same workload, not recorded */
	int pre_sessions, pre_qd; /* load of the precondition, 0 = the job's */
	bool verify;          /* stamp written blocks, check what is read */
	bool in_sweep;        /* one point of a load sweep */
	/*
	 * Open loop (rate > 0): commands arrive at rate per second, Poisson or
	 * evenly spaced, whatever the target does; sessions x qd only caps how
	 * many are in flight, and an arrival finding no free slot waits for one.
	 * Latency runs from the intended start, so time spent waiting behind a
	 * slow command counts (no coordinated omission); from_issue measures
	 * from the send instead, the closed-loop error, kept to show its size.
	 */
	double rate;
	bool fixed_arrivals;
	bool from_issue;
	bool in_rate_sweep;   /* one point of a --rates sweep */
	uint64_t arrival_seed;
};

struct tb_side {              /* reads or writes of one run */
	uint64_t ios, bytes;
	struct tb_hist lat;
};

struct tb_result {
	struct tb_job job;
	double elapsed;               /* seconds of the measured window */
	double client_cpu;            /* CPU seconds tierbench itself used meanwhile */
	uint64_t session_ios_min, session_ios_max; /* fairness across sessions */
	struct tb_side rd, wr;
	uint64_t verify_checked, verify_mismatches;
	bool interrupted;             /* stopped early by SIGINT */
	/* open loop: the longest an arrival waited for a free slot, and how
	 * many had to wait at all */
	uint64_t send_late_max_ns, sent_late;
	/* open loop: each command from its send to its answer, the service
	 * time the target gave (latency minus the wait for a slot) */
	struct tb_hist service;
};

/* The connected sessions. */
struct tb_bench;

struct tb_connect_opts {
	const char *url;
	int sessions;
	const char *initiator;
	int login_timeout;            /* seconds */
	int io_timeout;               /* seconds, 0 = none */
	bool header_digest;
};

/* Parse the URL, log in all sessions, read the LUN's capacity. On failure
 * returns NULL with one sentence in err. */
struct tb_bench *tb_connect(const struct tb_connect_opts *o, char *err, size_t errlen);
void tb_close(struct tb_bench *b);
/*
 * --io-log: one line per recorded command, "DUE SENT DONE OP LBA", the
 * first three in nanoseconds from the start of its run: when it was due
 * (open loop: its intended start; closed loop: its send), when it was
 * sent, when its answer came; OP is r or w. NULL stops logging. The
 * caller writes a "# run ..." line before each run.
 */
void tb_set_io_log(struct tb_bench *b, FILE *f);
uint32_t tb_block_size(const struct tb_bench *b);
uint64_t tb_capacity(const struct tb_bench *b);   /* bytes */
const char *tb_portal(const struct tb_bench *b);

/* Prepare stamped-block tracking for [offset, offset+span) in units of bs;
 * every later job must use the same range and block size. */
int tb_verify_setup(struct tb_bench *b, uint64_t offset, uint64_t span, uint32_t bs,
		    uint64_t seed, char *err, size_t errlen);

/*
 * Run a job (its precondition first). Returns 0 with res filled, or -1 with
 * a sentence in err after a target or connection error. progress prints a
 * live line on stdout once a second.
 */
int tb_run(struct tb_bench *b, const struct tb_job *job, struct tb_result *res,
	   bool progress, char *err, size_t errlen);

/* Read back every block this process wrote and check its stamp. */
int tb_verify_readback(struct tb_bench *b, int sessions, int qd, uint64_t *checked,
		       uint64_t *mismatches, bool progress, char *err, size_t errlen);

/* Set by the SIGINT handler: stop issuing, drain, report what was measured. */
extern volatile int tb_interrupted;

/* Draw charts from tierbench JSON documents (each has a "runs" array).
 * Returns 0, or -1 with a sentence in err. */
int tb_svg_write(const char *path, struct json_object **docs, int ndocs, char *err,
		 size_t errlen);

#endif
