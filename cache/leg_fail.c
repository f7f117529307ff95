/*
 * leg_fail.c - take a healthy leg out of a set on purpose.
 *
 * Two callers: the NVMe health monitor, which fails a leg whose SMART log
 * says it is about to lose data (critical warning, spare below threshold)
 * before it does, and an admin who wants to pull a leg (`tierctl leg fail`)
 * to replace it. Either way the leg goes through the same path as an I/O
 * error: mirror_leg_failed on a worker, the failure recorded in the
 * surviving leg's superblock before any later write is acknowledged. The
 * last healthy leg is never failed this way: that would turn a warning into
 * data loss.
 */
#include "cache/cache_int.h"

#include "common/log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct fail_job {
	struct cache_set *cs;
	int leg;
};

/* Worker 0: the mirror's failure path expects to run on a worker. */
static void fail_on_worker(void *arg)
{
	struct fail_job *j = arg;
	mirror_leg_failed(&j->cs->mirror, j->leg, -EIO);
	free(j);
}

/* Main or control thread; does not sleep. */
int cache_set_fail_leg(struct cache_set *cs, const char *path, const char *why, char *err, size_t errlen)
{
	int leg = -1;
	for (int i = 0; i < cs->mirror.nlegs; i++)
		if (!strcmp(cs->legs[i]->name, path))
			leg = i;
	if (leg < 0) {
		snprintf(err, errlen, "cache %s has no leg %s; its legs are %s%s%s", cs->name, path,
			 cs->legs[0]->name, cs->mirror.nlegs > 1 ? " and " : "",
			 cs->mirror.nlegs > 1 ? cs->legs[1]->name : "");
		return -1;
	}
	uint32_t out = atomic_load(&cs->mirror.failed) | atomic_load(&cs->mirror.resyncing);
	if (out & (1u << leg)) {
		snprintf(err, errlen, "cache %s: leg %s is already out of service", cs->name, path);
		return -1;
	}
	int healthy_others = 0;
	for (int i = 0; i < cs->mirror.nlegs; i++)
		if (i != leg && !(out & (1u << i)))
			healthy_others++;
	if (!healthy_others) {
		snprintf(err, errlen, "cache %s: leg %s is the last healthy leg (%s); failing it would lose the dirty "
			 "data; replace the other leg first, then this one", cs->name, path, why);
		return -1;
	}
	struct fail_job *j = malloc(sizeof(*j));
	if (!j) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	j->cs = cs;
	j->leg = leg;
	log_err("cache %s: taking leg %s out of service: %s", cs->name, path, why);
	if (worker_post(worker_get(0), fail_on_worker, j) < 0) {
		free(j);
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	return 0;
}

int cache_set_leg_fault(struct cache_set *cs, const char *path, int fault, uint64_t off, uint64_t len,
			struct bdev_fault_counts *counts, char *err, size_t errlen)
{
	for (int i = 0; i < cs->mirror.nlegs; i++) {
		struct bdev *l = leg_guard_inner(cs->mirror.leg[i]);
		if (strcmp(l->name, path))
			continue;
		if (bdev_fault_set(l, (enum bdev_fault)fault, off, len) < 0) {
			snprintf(err, errlen, "cache %s: leg %s takes no faults (not opened with fault_injection)",
				 cs->name, path);
			return -1;
		}
		log_warn("cache %s: leg %s: fault injected (%d, %llu+%llu) by tierctl leg fault", cs->name, path,
			 fault, (unsigned long long)off, (unsigned long long)len);
		bdev_fault_counts(l, counts);
		return 0;
	}
	snprintf(err, errlen, "cache %s has no leg %s", cs->name, path);
	return -1;
}
