/*
 * ctl_cache.c - the control-socket side of tierctl's cache commands.
 *
 * flush is asynchronous: it starts one thread that destages every set and
 * returns at once, so tierctl can poll flush-progress and draw its bar while
 * the cleaner works. mode and detach switch the LUN at once; leaving
 * write-back, a thread then destages the LUN's dirty data and tierctl
 * polls mode-progress (the control socket keeps answering meanwhile, as
 * it does during leg replace, whose resync tierctl follows through
 * leg-progress). Every refusal is a sentence naming the object and what
 * to do.
 */
#include "daemon/ctl_cache.h"

#include "cache/advisor.h"
#include "cache/cache.h"
#include "cache/status.h"
#include "cache/trace.h"
#include "bdev/fault.h"
#include "common/log.h"
#include "config/config.h"
#include "daemon/control.h"
#include "daemon/daemon.h"

#include <errno.h>
#include <json-c/json.h>
#include <pthread.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static const struct config *g_cfg;
static struct cache_set **g_sets;
static struct bdev **g_vols;

static atomic_bool flush_running;
static uint64_t flush_start_dirty;
static int flush_result;
static pthread_t flush_thread;
static bool flush_thread_valid;

static uint64_t total_dirty(void)
{
	uint64_t sum = 0;
	for (int i = 0; i < g_cfg->ncaches; i++) {
		struct cache_set_status st;
		if (!g_sets[i])
			continue;
		cache_set_status(g_sets[i], &st);
		sum += st.dirty_bytes;
	}
	return sum;
}

/* What a flush waits for, if a LUN's destage fails (buf empty if none). */
static void flush_blocker(char *buf, size_t n)
{
	buf[0] = 0;
	for (int i = 0; i < g_cfg->ncaches && !buf[0]; i++) {
		struct cache_set_status st;
		if (!g_sets[i])
			continue;
		cache_set_status(g_sets[i], &st);
		for (int k = 0; k < st.nluns; k++)
			if (st.lun_destage_err[k]) {
				snprintf(buf, n, "destage to LUN %s fails: %s (%llu MiB wait; next try in %llu s)",
					 st.luns[k], strerror(-st.lun_destage_err[k]),
					 (unsigned long long)(st.lun_dirty_waiting[k] >> 20),
					 (unsigned long long)((st.lun_destage_retry_ms[k] + 999) / 1000));
				break;
			}
	}
}

static void *flush_main(void *arg)
{
	/* the count, not g_cfg: a reload may swap g_cfg (never the sets) */
	int ncaches = (int)(intptr_t)arg;
	int r = 0;
	for (int i = 0; i < ncaches; i++)
		if (g_sets[i]) {
			int e = cache_set_flush(g_sets[i], 0);
			if (e && !r)
				r = e;
		}
	flush_result = r;
	log_info("tierctl flush: %s", r ? "failed" : "all dirty data destaged");
	atomic_store(&flush_running, false);
	return NULL;
}

static int ctl_flush(struct json_object *req, struct json_object *resp, void *arg)
{
	(void)req;
	(void)arg;
	if (g_cfg->ncaches == 0)
		return control_error(resp, "no cache set is configured; there is nothing to flush");
	if (!atomic_load(&flush_running)) {
		if (flush_thread_valid)
			pthread_join(flush_thread, NULL);
		flush_start_dirty = total_dirty();
		flush_result = 0;
		atomic_store(&flush_running, true);
		if (pthread_create(&flush_thread, NULL, flush_main, (void *)(intptr_t)g_cfg->ncaches)) {
			atomic_store(&flush_running, false);
			flush_thread_valid = false;
			return control_error(resp, "cannot start the flush thread");
		}
		flush_thread_valid = true;
	}
	json_object_object_add(resp, "start_dirty_bytes", json_object_new_int64((int64_t)flush_start_dirty));
	json_object_object_add(resp, "flushing", json_object_new_boolean(true));
	return 0;
}

static int ctl_flush_progress(struct json_object *req, struct json_object *resp, void *arg)
{
	(void)req;
	(void)arg;
	bool running = atomic_load(&flush_running);
	uint64_t dirty = total_dirty();
	if (!running && flush_result)
		return control_error(resp, "the flush failed (%s); see the daemon log for the leg or backing store at fault",
				     strerror(-flush_result));
	/* The cleaner may leave a few bytes in flight; report done when it stopped. */
	json_object_object_add(resp, "dirty_bytes", json_object_new_int64(running ? (int64_t)(dirty ? dirty : 1) : 0));
	json_object_object_add(resp, "start_dirty_bytes", json_object_new_int64((int64_t)flush_start_dirty));
	json_object_object_add(resp, "flushing", json_object_new_boolean(running));
	char why[256];
	if (running && (flush_blocker(why, sizeof(why)), why[0]))
		json_object_object_add(resp, "waiting_for", json_object_new_string(why));
	return 0;
}

static int find_lun(const char *name)
{
	for (int i = 0; i < g_cfg->nluns; i++)
		if (!strcmp(g_cfg->luns[i].name, name))
			return i;
	return -1;
}

static const char *req_str(struct json_object *req, const char *key)
{
	struct json_object *v;
	if (!json_object_object_get_ex(req, key, &v) || !json_object_is_type(v, json_type_string))
		return NULL;
	return json_object_get_string(v);
}

/*
 * The destage a mode change leaves behind (leaving write-back): one at a
 * time. The thread runs the set's cleaner at full rate (cache_set_flush in
 * half-second rounds) until the LUN has no dirty data left, which does not
 * wait for the set's other write-back LUNs to be clean.
 */
static struct {
	/* lock: the thread decides to end, and set_mode switches a mode and
	 * decides whether a thread must start, each under it, so a switch
	 * never lands between the thread's last look and its end */
	pthread_mutex_t lock;
	atomic_bool running;
	atomic_bool stop;   /* the daemon stops: leave the rest dirty (it is safe there) */
	bool valid;
	pthread_t thread;
	struct cache_set *cs;
	char lun[65];
	uint64_t start_dirty;
	int result;
} mj = { .lock = PTHREAD_MUTEX_INITIALIZER };

/* The LUN's dirty bytes in cs, and whether it is in write-back. */
static uint64_t lun_dirty(struct cache_set *cs, const char *lun, bool *write_back)
{
	struct cache_set_status *st = malloc(sizeof(*st));
	uint64_t d = 0;
	if (write_back)
		*write_back = false;
	if (!st)
		return 1; /* not known: not done */
	cache_set_status(cs, st);
	for (int k = 0; k < st->nluns; k++)
		if (!strcmp(st->luns[k], lun)) {
			d = st->lun_dirty_bytes[k];
			if (write_back)
				*write_back = st->lun_mode[k] == CACHE_WRITE_BACK;
		}
	free(st);
	return d;
}

static bool lun_in_write_back(struct cache_set *cs, const char *lun)
{
	bool wb;
	lun_dirty(cs, lun, &wb);
	return wb;
}

static void *mode_flush_main(void *arg)
{
	(void)arg;
	int r = 0;
	bool wb = false;
	for (;;) {
		pthread_mutex_lock(&mj.lock);
		bool done = atomic_load(&mj.stop) || !lun_dirty(mj.cs, mj.lun, &wb) || wb;
		if (done) {
			mj.result = 0;
			atomic_store(&mj.running, false);
		}
		pthread_mutex_unlock(&mj.lock);
		if (done)
			break;
		r = cache_set_flush(mj.cs, 500);
		if (r == -ETIMEDOUT) {
			r = 0;
		} else if (r) {
			pthread_mutex_lock(&mj.lock);
			mj.result = r;
			atomic_store(&mj.running, false);
			pthread_mutex_unlock(&mj.lock);
			break;
		}
	}
	if (r)
		log_err("LUN %s: destaging its dirty data failed: %s", mj.lun, strerror(-r));
	else
		log_info("LUN %s: %s", mj.lun, wb ? "back in write-back, destage stopped" : "all dirty data destaged");
	return NULL;
}

static int set_mode(struct json_object *resp, const char *lun, enum cache_mode mode)
{
	int i = find_lun(lun);
	if (i < 0)
		return control_error(resp, "there is no LUN named \"%s\"; tierctl status lists them", lun);
	if (!g_vols[i])
		return control_error(resp, "LUN %s has no cache set; add cache = NAME to its [lun] section", lun);
	if (mode == CACHE_WRITE_BACK && g_cfg->luns[i].gateways > 1)
		return control_error(resp, "LUN %s is exported by %u gateways: write-back would strand a dead "
				     "gateway's dirty data; it stays write-through (hot reads still come "
				     "from the cache)", lun, g_cfg->luns[i].gateways);
	int set = 0;
	while (set < g_cfg->ncaches && strcmp(g_cfg->caches[set].name, g_cfg->luns[i].cache))
		set++;
	if (set == g_cfg->ncaches || !g_sets[set])
		return control_error(resp, "LUN %s: cache set %s is not open", lun, g_cfg->luns[i].cache);
	pthread_mutex_lock(&mj.lock);
	bool busy = atomic_load(&mj.running);
	if (busy && strcmp(mj.lun, lun) && mode != CACHE_WRITE_BACK && lun_in_write_back(g_sets[set], lun)) {
		pthread_mutex_unlock(&mj.lock);
		return control_error(resp, "LUN %s is still destaging after its mode change; wait for it "
				     "(tierctl status shows its dirty_bytes), then take %s out of write-back", mj.lun, lun);
	}
	if (cache_vol_switch_mode(g_vols[i], mode) == 1 && !busy) {
		if (mj.valid)
			pthread_join(mj.thread, NULL); /* it ended: running went false under the lock */
		mj.cs = g_sets[set];
		snprintf(mj.lun, sizeof(mj.lun), "%s", lun);
		mj.start_dirty = lun_dirty(mj.cs, lun, NULL);
		mj.result = 0;
		atomic_store(&mj.running, true);
		if (pthread_create(&mj.thread, NULL, mode_flush_main, NULL)) {
			atomic_store(&mj.running, false);
			mj.valid = false;
			pthread_mutex_unlock(&mj.lock);
			return control_error(resp, "LUN %s runs %s but its dirty data could not be destaged now (no "
					     "thread); tierctl flush destages it", lun, cache_mode_name(mode));
		}
		mj.valid = true;
	}
	pthread_mutex_unlock(&mj.lock);
	log_info("LUN %s now runs %s (tierctl)", lun, cache_mode_name(mode));
	json_object_object_add(resp, "lun", json_object_new_string(lun));
	json_object_object_add(resp, "mode", json_object_new_string(cache_mode_name(mode)));
	bool running = atomic_load(&mj.running) && !strcmp(mj.lun, lun);
	json_object_object_add(resp, "flushing", json_object_new_boolean(running));
	if (running)
		json_object_object_add(resp, "start_dirty_bytes", json_object_new_int64((int64_t)mj.start_dirty));
	return 0;
}

/* tierctl mode/detach, while the destage runs: the LUN's dirty bytes left */
static int ctl_mode_progress(struct json_object *req, struct json_object *resp, void *arg)
{
	(void)arg;
	const char *lun = req_str(req, "lun");
	if (!lun)
		return control_error(resp, "mode-progress needs a LUN name");
	if (!mj.valid || strcmp(mj.lun, lun)) {
		json_object_object_add(resp, "dirty_bytes", json_object_new_int64(0));
		json_object_object_add(resp, "flushing", json_object_new_boolean(false));
		return 0;
	}
	bool running = atomic_load(&mj.running);
	if (!running && mj.result)
		return control_error(resp, "LUN %s: destaging its dirty data failed (%s); see the daemon log for the "
				     "leg or backing store at fault", lun, strerror(-mj.result));
	uint64_t dirty = running ? lun_dirty(mj.cs, lun, NULL) : 0;
	if (running && !dirty)
		dirty = 1; /* the last blocks are in flight */
	json_object_object_add(resp, "dirty_bytes", json_object_new_int64((int64_t)dirty));
	json_object_object_add(resp, "start_dirty_bytes", json_object_new_int64((int64_t)mj.start_dirty));
	json_object_object_add(resp, "flushing", json_object_new_boolean(running));
	char why[256];
	if (running && (flush_blocker(why, sizeof(why)), why[0]))
		json_object_object_add(resp, "waiting_for", json_object_new_string(why));
	return 0;
}

/* tierctl leg replace, while the new leg resyncs: bytes left to copy */
static int ctl_leg_progress(struct json_object *req, struct json_object *resp, void *arg)
{
	(void)arg;
	const char *set = req_str(req, "set"), *leg = req_str(req, "leg");
	if (!set || !leg)
		return control_error(resp, "leg-progress needs SET LEG");
	for (int i = 0; i < g_cfg->ncaches; i++) {
		if (strcmp(g_cfg->caches[i].name, set) || !g_sets[i])
			continue;
		struct cache_set_status *st = malloc(sizeof(*st));
		if (!st)
			return control_error(resp, "out of memory");
		cache_set_status(g_sets[i], st);
		for (int k = 0; k < st->nlegs; k++) {
			if (strcmp(st->legs[k].path, leg))
				continue;
			enum cache_leg_health h = st->legs[k].health;
			uint64_t total = st->legs[k].resync_total, done = st->legs[k].resync_done;
			free(st);
			if (h == LEG_FAILED)
				return control_error(resp, "leg %s of cache %s failed during its resync; tierctl status "
						     "and the daemon log say why", leg, set);
			bool running = h == LEG_RESYNCING;
			uint64_t left = running ? (total > done ? total - done : 1) : 0;
			json_object_object_add(resp, "left_bytes", json_object_new_int64((int64_t)left));
			json_object_object_add(resp, "total_bytes", json_object_new_int64((int64_t)total));
			json_object_object_add(resp, "running", json_object_new_boolean(running));
			return 0;
		}
		free(st);
		return control_error(resp, "cache %s has no leg %s", set, leg);
	}
	return control_error(resp, "there is no open cache set named \"%s\"", set);
}

static int ctl_mode(struct json_object *req, struct json_object *resp, void *arg)
{
	(void)arg;
	const char *lun = req_str(req, "lun"), *m = req_str(req, "mode");
	enum cache_mode mode;
	if (!lun || !m)
		return control_error(resp, "mode needs a LUN name and a mode");
	if (cache_mode_parse(m, &mode))
		return control_error(resp, "unknown mode \"%s\"; use write-back, write-through, write-around or pass-through", m);
	return set_mode(resp, lun, mode);
}

static int ctl_detach(struct json_object *req, struct json_object *resp, void *arg)
{
	(void)arg;
	const char *lun = req_str(req, "lun");
	if (!lun)
		return control_error(resp, "detach needs a LUN name");
	return set_mode(resp, lun, CACHE_PASS_THROUGH);
}

/* The index of the configured cache set named name, or -1. */
static int cache_index(const char *name)
{
	for (int i = 0; i < g_cfg->ncaches; i++)
		if (!strcmp(g_cfg->caches[i].name, name))
			return i;
	return -1;
}

/*
 * tierctl set CACHE KEY VALUE: the settings a set changes while running,
 * destage_max (bytes per second, 0 = no cap) and destage_max_iops. Until
 * the next restart or a reload whose file changes them.
 */
static int ctl_set(struct json_object *req, struct json_object *resp, void *arg)
{
	(void)arg;
	const char *set = req_str(req, "set"), *key = req_str(req, "key"), *val = req_str(req, "value");
	if (!set || !key || !val)
		return control_error(resp, "set needs CACHE KEY VALUE");
	int i = cache_index(set);
	if (i < 0 || !g_sets[i])
		return control_error(resp, "no open cache set %s", set);
	struct cache_set_status st;
	cache_set_status(g_sets[i], &st);
	uint64_t bps = st.destage_max_bps, v;
	uint32_t iops = st.destage_max_iops;
	if (!strcmp(key, "destage_max")) {
		if (config_parse_size(val, &v) || (v && v < (64u << 10)))
			return control_error(resp, "destage_max %s: give bytes per second, at least 64K (like 50M), "
					     "or 0 for no cap", val);
		bps = v;
	} else if (!strcmp(key, "destage_max_iops")) {
		char *end;
		errno = 0;
		unsigned long u = strtoul(val, &end, 10);
		if (errno || end == val || *end || u > 10000000)
			return control_error(resp, "destage_max_iops %s: give backing writes per second, or 0 for no cap",
					     val);
		iops = (uint32_t)u;
	} else {
		return control_error(resp, "set %s: the keys a running set changes are destage_max and "
				     "destage_max_iops", key);
	}
	cache_set_destage_max(g_sets[i], bps, iops);
	log_info("cache %s: destage_max %llu B/s, destage_max_iops %u (0: no cap; tierctl set)", set,
		 (unsigned long long)bps, iops);
	json_object_object_add(resp, "set", json_object_new_string(set));
	json_object_object_add(resp, "destage_max", json_object_new_int64((int64_t)bps));
	json_object_object_add(resp, "destage_max_iops", json_object_new_int64(iops));
	return 0;
}

static int ctl_leg_replace(struct json_object *req, struct json_object *resp, void *arg)
{
	(void)arg;
	const char *set = req_str(req, "set"), *old = req_str(req, "old"), *new_path = req_str(req, "new");
	char err[512];
	if (!set || !old || !new_path)
		return control_error(resp, "leg replace needs SET OLD NEW");
	for (int i = 0; i < g_cfg->ncaches; i++) {
		if (strcmp(g_cfg->caches[i].name, set))
			continue;
		if (!g_sets[i])
			return control_error(resp, "cache set %s is not open", set);
		if (cache_set_leg_replace_path(g_sets[i], old, new_path, err, sizeof(err)))
			return control_error(resp, "%s", err);
		log_info("cache %s: leg %s replaced by %s, resync started (tierctl)", set, old, new_path);
		/* a new drive may write less atomically than the one it replaces */
		char *np = (char *)new_path;
		for (int k = 0; k < g_cfg->nluns; k++)
			if (g_vols[k] && g_cfg->luns[k].cache && !strcmp(g_cfg->luns[k].cache, set))
				daemon_guard_torn(&g_cfg->caches[i], &g_cfg->luns[k], g_vols[k], &np, 1);
		json_object_object_add(resp, "resync", json_object_new_string("started; tierctl status shows progress"));
		return 0;
	}
	return control_error(resp, "there is no cache set named \"%s\"; tierctl status lists them", set);
}

static int ctl_leg_fail(struct json_object *req, struct json_object *resp, void *arg)
{
	(void)arg;
	const char *set = req_str(req, "set"), *leg = req_str(req, "leg");
	char err[512];
	if (!set || !leg)
		return control_error(resp, "leg fail needs SET LEG");
	for (int i = 0; i < g_cfg->ncaches; i++) {
		if (strcmp(g_cfg->caches[i].name, set))
			continue;
		if (!g_sets[i])
			return control_error(resp, "cache set %s is not open", set);
		if (cache_set_fail_leg(g_sets[i], leg, "taken out by the administrator (tierctl leg fail)", err,
				       sizeof(err)))
			return control_error(resp, "%s", err);
		json_object_object_add(resp, "leg", json_object_new_string("out of service; replace it with tierctl leg replace"));
		return 0;
	}
	return control_error(resp, "there is no cache set named \"%s\"; tierctl status lists them", set);
}

/* tests only: tierctl leg fault SET LEG MODE [OFFSET LENGTH | MICROSECONDS] */
static int ctl_leg_fault(struct json_object *req, struct json_object *resp, void *arg)
{
	(void)arg;
	const char *set = req_str(req, "set"), *leg = req_str(req, "leg"), *mode = req_str(req, "fault");
	const char *off_s = req_str(req, "offset"), *len_s = req_str(req, "length");
	char err[512];
	if (!set || !leg || !mode)
		return control_error(resp, "leg fault needs SET LEG MODE [OFFSET LENGTH]");
	enum bdev_fault f;
	if (!strcmp(mode, "ok"))
		f = BDEV_FAULT_NONE;
	else if (!strcmp(mode, "eio"))
		f = BDEV_FAULT_EIO;
	else if (!strcmp(mode, "hang"))
		f = BDEV_FAULT_HANG;
	else if (!strcmp(mode, "range"))
		f = BDEV_FAULT_RANGE;
	else if (!strcmp(mode, "stuck"))
		f = BDEV_FAULT_STUCK;
	else if (!strcmp(mode, "delay"))
		f = BDEV_FAULT_DELAY;
	else
		return control_error(resp, "unknown fault \"%s\"; use eio, hang, range OFFSET LENGTH, stuck OFFSET "
				     "LENGTH, delay MICROSECONDS, or ok", mode);
	uint64_t off = 0, len = 0;
	if (f == BDEV_FAULT_DELAY) {
		char *end = NULL;
		unsigned long long us = off_s ? strtoull(off_s, &end, 10) : 0;
		if (!off_s || !*off_s || *end || !us || us > 10000000u)
			return control_error(resp, "leg fault delay needs MICROSECONDS, 1 to 10000000: the fixed "
					     "time each request takes, one at a time");
		off = us;
	}
	if (bdev_fault_has_range(f) &&
	    (!off_s || !len_s || config_parse_size(off_s, &off) || config_parse_size(len_s, &len) || !len))
		return control_error(resp, "leg fault %s needs OFFSET LENGTH (bytes of the leg, like 1M 64K)", mode);
	for (int i = 0; i < g_cfg->ncaches; i++) {
		if (strcmp(g_cfg->caches[i].name, set))
			continue;
		if (!g_sets[i])
			return control_error(resp, "cache set %s is not open", set);
		if (!g_cfg->caches[i].fault_injection)
			return control_error(resp, "cache set %s was not configured with fault_injection = yes (a key "
					     "for tests only)", set);
		struct bdev_fault_counts c;
		if (cache_set_leg_fault(g_sets[i], leg, f, off, len, &c, err, sizeof(err)))
			return control_error(resp, "%s", err);
		json_object_object_add(resp, "reads", json_object_new_int64((int64_t)c.reads));
		json_object_object_add(resp, "writes", json_object_new_int64((int64_t)c.writes));
		json_object_object_add(resp, "errors", json_object_new_int64((int64_t)c.errors));
		json_object_object_add(resp, "held_reads", json_object_new_int64((int64_t)c.held_reads));
		json_object_object_add(resp, "held_writes", json_object_new_int64((int64_t)c.held_writes));
		return 0;
	}
	return control_error(resp, "there is no cache set named \"%s\"; tierctl status lists them", set);
}

void ctl_cache_counters_json(struct json_object *o, const struct cache_set_status *st)
{
	struct {
		const char *key;
		uint64_t v;
	} counters[] = {
		{ "slots", st->nslots },
		{ "slots_used", st->slots_used },
		{ "sector_grain_slots", st->sector_grain_slots },
		{ "dirty_bytes", st->dirty_bytes },
		{ "read_hits", st->read_hits },
		{ "read_misses", st->read_misses },
		{ "read_partial", st->read_partial },
		{ "write_hits", st->write_hits },
		{ "write_misses", st->write_misses },
		{ "write_one_trip", st->write_one_trip },
		{ "write_no_record", st->write_no_record },
		{ "promotions", st->promotions },
		{ "admitted", st->admitted },
		{ "below_threshold", st->below_threshold },
		{ "seq_bypassed", st->seq_bypassed },
		{ "topups", st->topups },
		{ "evictions", st->evictions },
		{ "destaged_bytes", st->destaged_bytes },
		{ "cleaner_rate_bps", st->cleaner_rate_bps },
		{ "destage_max", st->destage_max_bps },
		{ "destage_max_iops", st->destage_max_iops },
		{ "destage_pause_us", st->destage_pause_us },
		{ "hit_quiet_us", st->hit_quiet_us },
		{ "destage_pauses", st->destage_pauses },
		{ "lost_ios", st->lost_ios },
		{ "leg_read_errors", st->leg_read_errors },
		{ "leg_timeouts", st->leg_timeouts },
		{ "leg_repairs", st->leg_repairs },
		{ "intent_writes", st->intent_writes },
		{ "block_log_writes", st->block_log_writes },
		{ "block_log_waits", st->block_log_waits },
		{ "checkpoints", st->checkpoints },
		{ "journal_full_waits", st->journal_full_waits },
		{ "format_version", st->version },
		{ "block_log", st->block_log },
		{ "luns_known", st->luns_known },
	};
	json_object_object_add(o, "hit_ratio", json_object_new_double(st->hit_ratio));
	for (size_t i = 0; i < sizeof(counters) / sizeof(counters[0]); i++)
		json_object_object_add(o, counters[i].key, json_object_new_int64((int64_t)counters[i].v));
}

static int ctl_stats(struct json_object *req, struct json_object *resp, void *arg)
{
	(void)req;
	(void)arg;
	struct json_object *sets = json_object_new_array();
	for (int i = 0; i < g_cfg->ncaches; i++) {
		struct cache_set_status st;
		if (!g_sets[i])
			continue;
		cache_set_status(g_sets[i], &st);
		struct json_object *o = json_object_new_object();
		json_object_object_add(o, "name", json_object_new_string(st.name));
		ctl_cache_counters_json(o, &st);
		json_object_array_add(sets, o);
	}
	json_object_object_add(resp, "caches", sets);
	return 0;
}

static struct json_object *advice_curve(const struct advisor_curve *c, const char *name, double target,
					 uint64_t size_bytes)
{
	struct json_object *o = json_object_new_object(), *a = json_object_new_array();
	if (name)
		json_object_object_add(o, "name", json_object_new_string(name));
	json_object_object_add(o, "reads_sampled", json_object_new_int64((int64_t)c->reads));
	for (int i = 0; i < ADVISOR_SIZES; i++)
		json_object_array_add(a, json_object_new_double(c->ratio[i]));
	json_object_object_add(o, "hit_ratio", a);
	if (target > 0) {
		double m = advisor_size_for(c, target);
		/* null: not reached even at 8 times today's size */
		json_object_object_add(o, "size_for_target",
				       m > 0 ? json_object_new_int64((int64_t)(m * (double)size_bytes)) : NULL);
	}
	return o;
}

/*
 * tierctl advise [SET] [--target PCT] [--reset]: each set's and LUN's read
 * hit ratio at 1/4 .. 8 times today's size (cache/advisor.h).
 */
static int ctl_advise(struct json_object *req, struct json_object *resp, void *arg)
{
	(void)arg;
	const char *set = req_str(req, "set");
	struct json_object *t, *rs;
	double target = json_object_object_get_ex(req, "target", &t) ? json_object_get_double(t) : 0;
	bool reset = json_object_object_get_ex(req, "reset", &rs) && json_object_get_boolean(rs);
	if (target < 0 || target > 1)
		return control_error(resp, "advise: the target hit ratio is a fraction from 0 to 1, not %g", target);
	struct advisor_report *r = malloc(sizeof(*r));
	char (*names)[65] = malloc(ADVISOR_MAX_LUNS * sizeof(*names));
	if (!r || !names) {
		free(r);
		free(names);
		return control_error(resp, "out of memory");
	}
	struct json_object *sets = json_object_new_array();
	bool found = false;
	for (int i = 0; i < g_cfg->ncaches; i++) {
		if (set && strcmp(g_cfg->caches[i].name, set))
			continue;
		found = true;
		if (!g_sets[i]) {
			struct json_object *o = json_object_new_object();
			json_object_object_add(o, "name", json_object_new_string(g_cfg->caches[i].name));
			json_object_object_add(o, "error", json_object_new_string("not open (see tierctl status)"));
			json_object_array_add(sets, o);
			continue;
		}
		uint32_t ext;
		struct json_object *o = json_object_new_object();
		json_object_object_add(o, "name", json_object_new_string(g_cfg->caches[i].name));
		if (cache_set_advice(g_sets[i], r, names, &ext, reset) < 0) {
			json_object_object_add(o, "error", json_object_new_string("no sizing advisor: it had no memory "
										  "when the set opened"));
			json_object_array_add(sets, o);
			continue;
		}
		uint64_t size = (uint64_t)r->nslots * ext;
		json_object_object_add(o, "size_bytes", json_object_new_int64((int64_t)size));
		json_object_object_add(o, "extent_size", json_object_new_int64(ext));
		json_object_object_add(o, "sampling_rate", json_object_new_double(r->rate));
		json_object_object_add(o, "sampled_accesses", json_object_new_int64((int64_t)r->sampled));
		json_object_object_add(o, "dropped_samples", json_object_new_int64((int64_t)r->dropped));
		json_object_object_add(o, "memory_bytes", json_object_new_int64((int64_t)r->mem_bytes));
		struct json_object *sizes = json_object_new_array();
		for (int k = 0; k < ADVISOR_SIZES; k++) {
			struct json_object *s = json_object_new_object();
			json_object_object_add(s, "scale", json_object_new_double(advisor_scale[k]));
			json_object_object_add(s, "bytes", json_object_new_int64((int64_t)(advisor_scale[k] * (double)size)));
			json_object_array_add(sizes, s);
		}
		json_object_object_add(o, "sizes", sizes);
		json_object_object_add(o, "set", advice_curve(&r->set, NULL, target, size));
		struct json_object *luns = json_object_new_array();
		for (int b = 0; b < ADVISOR_MAX_LUNS; b++)
			if (r->lun[b].on && names[b][0])
				json_object_array_add(luns, advice_curve(&r->lun[b], names[b], target, size));
		json_object_object_add(o, "luns", luns);
		json_object_array_add(sets, o);
	}
	free(r);
	free(names);
	if (set && !found) {
		json_object_put(sets);
		return control_error(resp, "advise: no cache set named %s", set);
	}
	if (target > 0)
		json_object_object_add(resp, "target", json_object_new_double(target));
	json_object_object_add(resp, "advice", sets);
	return 0;
}

static struct json_object *trace_json(const char *set, const struct cache_trace_info *ti)
{
	struct json_object *o = json_object_new_object();
	json_object_object_add(o, "set", json_object_new_string(set));
	json_object_object_add(o, "tracing", json_object_new_boolean(ti->on));
	if (ti->path[0]) {
		json_object_object_add(o, "path", json_object_new_string(ti->path));
		json_object_object_add(o, "records", json_object_new_int64((int64_t)ti->records));
		json_object_object_add(o, "not_recorded", json_object_new_int64((int64_t)ti->dropped));
		json_object_object_add(o, "max_records", json_object_new_int64((int64_t)ti->max_records));
		json_object_object_add(o, "seconds", json_object_new_double(ti->seconds));
	}
	return o;
}

/*
 * tierctl trace SET start FILE [--max N] | stop | (nothing: its state):
 * record the set's reads and writes to FILE (cache/trace.h).
 */
static int ctl_trace(struct json_object *req, struct json_object *resp, void *arg)
{
	(void)arg;
	const char *set = req_str(req, "set"), *action = req_str(req, "action"), *path = req_str(req, "path");
	struct json_object *m;
	int64_t max = json_object_object_get_ex(req, "max_records", &m) ? json_object_get_int64(m) : 0;
	if (!set)
		return control_error(resp, "trace: which cache set?");
	int i = cache_index(set);
	if (i < 0)
		return control_error(resp, "trace: no cache set named %s", set);
	if (!g_sets[i])
		return control_error(resp, "trace: cache set %s is not open (see tierctl status)", set);
	struct cache_trace_info ti;
	if (!action) {
		cache_trace_get(g_sets[i], &ti);
	} else if (!strcmp(action, "start")) {
		char err[320], full[256];
		if (max < 0)
			return control_error(resp, "trace: --max takes a count of requests");
		if (!path || !path[0])
			return control_error(resp, "trace: start needs a file");
		/* a relative name is in the state directory: under the shipped
		 * unit the daemon can write there (and in /srv/tiercache) only */
		if (path[0] != '/' && g_cfg->state_dir) {
			if ((size_t)snprintf(full, sizeof(full), "%s/%s", g_cfg->state_dir, path) >= sizeof(full))
				return control_error(resp, "trace: %s/%s is too long", g_cfg->state_dir, path);
			path = full;
		}
		if (cache_trace_start(g_sets[i], path, (uint64_t)max, err, sizeof(err)) < 0)
			return control_error(resp, "trace: %s", err);
		cache_trace_get(g_sets[i], &ti);
	} else if (!strcmp(action, "stop")) {
		int r = cache_trace_stop(g_sets[i], &ti);
		if (r == -ENOENT)
			return control_error(resp, "trace: cache set %s is not being traced", set);
		if (r < 0)
			return control_error(resp, "trace: %s is incomplete: %s", ti.path, strerror(-r));
	} else {
		return control_error(resp, "trace: start FILE, stop, or nothing (the state), not %s", action);
	}
	json_object_object_add(resp, "trace", trace_json(set, &ti));
	return 0;
}

void ctl_cache_update(const struct config *cfg, struct bdev **vols)
{
	g_cfg = cfg;
	g_vols = vols;
}

void ctl_cache_register(const struct config *cfg, struct cache_set **sets, struct bdev **vols)
{
	g_cfg = cfg;
	g_sets = sets;
	g_vols = vols;
	control_register("stats", ctl_stats, NULL);
	control_register("advise", ctl_advise, NULL);
	control_register("trace", ctl_trace, NULL);
	control_register("flush", ctl_flush, NULL);
	control_register("flush-progress", ctl_flush_progress, NULL);
	control_register("mode", ctl_mode, NULL);
	control_register("set", ctl_set, NULL);
	control_register("detach", ctl_detach, NULL);
	control_register("mode-progress", ctl_mode_progress, NULL);
	control_register("leg-progress", ctl_leg_progress, NULL);
	control_register("leg-replace", ctl_leg_replace, NULL);
	control_register("leg-fail", ctl_leg_fail, NULL);
	control_register("leg-fault", ctl_leg_fault, NULL);
}

void ctl_cache_stop(void)
{
	if (mj.valid) {
		atomic_store(&mj.stop, true);
		pthread_join(mj.thread, NULL); /* within one half-second round */
		mj.valid = false;
	}
	if (flush_thread_valid) {
		if (atomic_load(&flush_running))
			log_info("waiting for the flush tierctl started to finish");
		pthread_join(flush_thread, NULL);
		flush_thread_valid = false;
	}
}
