/*
 * ctl_cache.h - tierctl's cache commands: stats, flush, mode, detach, leg replace/fail.
 *
 * Registered on the control socket (daemon/control.h); they act on the
 * cache sets and volumes the daemon opened. Threading: handlers run on the
 * control thread and call the engine's main/control-thread APIs, which may
 * sleep (a mode switch out of write-back flushes first).
 */
#ifndef TC_DAEMON_CTL_CACHE_H
#define TC_DAEMON_CTL_CACHE_H

struct config;
struct cache_set;
struct bdev;
struct cache_set_status;
struct json_object;

/* Add a set's counters (hit ratio, hits/misses, dirty bytes, slots, cleaner)
 * to o: the part `status` and `stats` share. Any thread. */
void ctl_cache_counters_json(struct json_object *o, const struct cache_set_status *st);

/*
 * sets parallels cfg->caches; vols parallels cfg->luns (NULL for a LUN
 * without cache). The arrays must outlive the control socket.
 */
void ctl_cache_register(const struct config *cfg, struct cache_set **sets, struct bdev **vols);

/* Configuration reload, under control_lock: the new cfg and its vols. The
 * cache sets do not change (the new cfg->caches parallels the old). */
void ctl_cache_update(const struct config *cfg, struct bdev **vols);

/* After control_stop: wait for a flush tierctl started. Main thread. */
void ctl_cache_stop(void);

#endif
