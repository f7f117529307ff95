/*
 * trace.h - a record of the reads and writes a cache set serves, for
 * replay: `tierctl trace SET start FILE` ... `tierctl trace SET stop`.
 *
 * One text line per READ or WRITE request as the volume received it,
 * "R|W LUN OFFSET LEN USEC" (LUN is the backing id; bytes; microseconds
 * since the start), in the order the requests arrived, after a header of '#' lines: the set's slots and
 * extent size ("# nslots N", "# extent N"), its policy settings
 * ("# admit_hits N", "# seq_cutoff BYTES"), and each LUN's name and cache
 * mode ("# lun ID NAME MODE", before its first request).
 * tests/unit/test_advisor replays such a file through the real policy at
 * each size and through the sizing advisor; an admin can send one to
 * whoever sizes their cache.
 *
 * Cost: nothing while no trace runs but one load per request. While one
 * runs, a timestamp and a record in the worker's own ring (no lock, no
 * system call); a thread of the trace drains the rings every 20 ms in
 * time order and writes the lines, and at stop the rest, a footer
 * ("# records N, dropped D, S s"), and syncs the file. A record that finds its ring full is
 * counted as dropped, not waited for; the footer says how many.
 */
#ifndef TC_CACHE_TRACE_H
#define TC_CACHE_TRACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct cache_set;
struct cache_trace;

struct cache_trace_info {
	bool on;
	char path[256];
	uint64_t records;     /* lines written so far */
	uint64_t dropped;     /* requests not recorded (a full ring, or past max_records) */
	uint64_t max_records; /* the trace stops recording after this many */
	double seconds;       /* since it started */
};

/* Control thread. Creates path, absolute (O_EXCL: never over an existing file).
 * max_records 0: 50 million. -EBUSY when a trace runs already. */
int cache_trace_start(struct cache_set *cs, const char *path, uint64_t max_records, char *err, size_t errlen);
/* Control or main thread: stop, write the rest and the footer, close.
 * -ENOENT when none runs. out may be NULL. */
int cache_trace_stop(struct cache_set *cs, struct cache_trace_info *out);
/* Any thread but a worker. */
void cache_trace_get(struct cache_set *cs, struct cache_trace_info *out);

/* Worker: record one request (vol_submit, when cs->trace is set). */
void cache_trace_note(struct cache_set *cs, uint32_t bid, bool write, uint64_t offset, uint32_t len);

#endif
