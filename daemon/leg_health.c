/*
 * leg_health.c - what the daemon does with its legs' NVMe health.
 *
 * Two parts. leg_health_json turns nvme_health_read() into the "device"
 * object of a leg in `tierctl status`: kind; for NVMe also model, serial,
 * firmware, and the SMART log (critical warning in words, temperature,
 * percentage used, spare and its threshold, media errors, power-on hours,
 * unsafe shutdowns) and whether the leg should be failed by the SMART rule.
 * The monitor thread applies that rule: at start and every interval it
 * reads every healthy leg and takes a failing one out of service with
 * cache_set_fail_leg while the other leg still holds every dirty block.
 * nvme_health_read issues admin ioctls that may block for the driver's
 * timeout, so it runs on this thread, never on a worker.
 */
#include "daemon/leg_health.h"

#include "cache/cache.h"
#include "cache/nvme_health.h"
#include "cache/status.h"
#include "common/log.h"

#include <json-c/json.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <time.h>

void leg_health_json(struct json_object *leg, const char *path)
{
	struct nvme_health h;
	struct json_object *o = json_object_new_object();

	nvme_health_read(path, &h);
	json_object_object_add(o, "kind", json_object_new_string(h.kind));
	if (h.atomic_write_bytes) {
		json_object_object_add(o, "logical_block", json_object_new_int64(h.logical_block));
		json_object_object_add(o, "atomic_write_bytes", json_object_new_int64(h.atomic_write_bytes));
	}
	if (h.ident_valid) {
		json_object_object_add(o, "model", json_object_new_string(h.model));
		json_object_object_add(o, "serial", json_object_new_string(h.serial));
		json_object_object_add(o, "firmware", json_object_new_string(h.firmware));
		json_object_object_add(o, "nsid", json_object_new_int64(h.nsid));
	}
	if (h.smart_valid) {
		char text[200], why[320];
		struct json_object *s = json_object_new_object();
		nvme_health_warning_text(h.critical_warning, text, sizeof(text));
		json_object_object_add(s, "critical_warning", json_object_new_string(text));
		json_object_object_add(s, "temperature_c", json_object_new_int(h.temperature_c));
		json_object_object_add(s, "percent_used", json_object_new_int(h.percent_used));
		json_object_object_add(s, "available_spare", json_object_new_int(h.available_spare));
		json_object_object_add(s, "spare_threshold", json_object_new_int(h.spare_threshold));
		json_object_object_add(s, "media_errors", json_object_new_int64((int64_t)h.media_errors));
		json_object_object_add(s, "power_on_hours", json_object_new_int64((int64_t)h.power_on_hours));
		json_object_object_add(s, "unsafe_shutdowns", json_object_new_int64((int64_t)h.unsafe_shutdowns));
		bool failing = nvme_health_failing(&h, why, sizeof(why));
		json_object_object_add(s, "verdict", json_object_new_string(failing ? why : "healthy"));
		json_object_object_add(o, "smart", s);
	}
	if (h.error[0])
		json_object_object_add(o, "error", json_object_new_string(h.error));
	json_object_object_add(leg, "device", o);
}

static pthread_t thread;
static bool running;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static bool stopping;
static struct cache_set **g_sets;
static int g_n;
static unsigned g_interval;

int leg_health_check_once(struct cache_set **sets, int n)
{
	int failed = 0;
	for (int i = 0; i < n; i++) {
		struct cache_set_status st;
		if (!sets[i])
			continue;
		cache_set_status(sets[i], &st);
		for (int k = 0; k < st.nlegs; k++) {
			struct nvme_health h;
			char why[256], msg[300], err[512];
			if (st.legs[k].health != LEG_HEALTHY)
				continue;
			if (nvme_health_read(st.legs[k].path, &h) < 0 || !h.is_nvme)
				continue;
			if (!nvme_health_failing(&h, why, sizeof(why)))
				continue;
			snprintf(msg, sizeof(msg), "the drive reports %s", why);
			if (cache_set_fail_leg(sets[i], st.legs[k].path, msg, err, sizeof(err)) == 0)
				failed++;
			else
				log_err("%s", err);
		}
	}
	return failed;
}

static void *monitor_main(void *arg)
{
	(void)arg;
	pthread_setname_np(pthread_self(), "tc-leghealth");
	pthread_mutex_lock(&lock);
	while (!stopping) {
		pthread_mutex_unlock(&lock);
		leg_health_check_once(g_sets, g_n);
		pthread_mutex_lock(&lock);
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += g_interval;
		while (!stopping && pthread_cond_timedwait(&wake, &lock, &ts) == 0)
			;
	}
	pthread_mutex_unlock(&lock);
	return NULL;
}

int leg_health_start(struct cache_set **sets, int n, unsigned interval_s)
{
	g_sets = sets;
	g_n = n;
	g_interval = interval_s ? interval_s : 60;
	stopping = false;
	if (pthread_create(&thread, NULL, monitor_main, NULL))
		return -1;
	running = true;
	return 0;
}

void leg_health_stop(void)
{
	if (!running)
		return;
	pthread_mutex_lock(&lock);
	stopping = true;
	pthread_cond_signal(&wake);
	pthread_mutex_unlock(&lock);
	pthread_join(thread, NULL);
	running = false;
}
