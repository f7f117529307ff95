/*
 * leg_health.h - the cache legs' device health: shown and acted on.
 *
 * leg_health_json: a leg's device health as JSON for `tierctl status` (the
 * adapter between the JSON control socket and cache/nvme_health.c, which
 * deliberately speaks no JSON). Control or main thread; it issues NVMe admin
 * commands, which may block for the driver's admin timeout.
 *
 * The monitor: a thread reads every healthy leg's SMART log at start and
 * then every interval; a leg whose drive says it is about to lose data
 * (critical warning, spare below threshold) is taken out of service with
 * cache_set_fail_leg, the drive's reason in the log, while the other leg
 * still holds every dirty block. Files and non-NVMe devices are skipped.
 * leg_health_start/stop from the main thread.
 */
#ifndef TC_DAEMON_LEG_HEALTH_H
#define TC_DAEMON_LEG_HEALTH_H

struct json_object;
struct cache_set;

/* Add a "device" object describing path to leg. */
void leg_health_json(struct json_object *leg, const char *path);

/* sets: n open cache sets (NULL entries skipped); must outlive the monitor. */
int leg_health_start(struct cache_set **sets, int n, unsigned interval_s);
void leg_health_stop(void);

/* One pass over every leg (the monitor's body). Returns how many legs it failed. */
int leg_health_check_once(struct cache_set **sets, int n);

#endif
