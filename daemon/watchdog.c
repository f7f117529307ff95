/*
 * watchdog.c - feed systemd's watchdog from proof that the workers run.
 *
 * Each worker runs a tick about once a second (common/worker.h); ours
 * stores now_ms() in that worker's heartbeat slot. The main thread wakes
 * every half watchdog interval and sends WATCHDOG=1 only if every slot is
 * younger than the interval itself; otherwise it names the stalled worker
 * in the log and lets systemd's timer run out.
 */
#include "daemon/watchdog.h"

#include "common/log.h"
#include "common/worker.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <systemd/sd-daemon.h>

struct heartbeat {
	struct worker_tick tick;
	_Atomic uint64_t last_ms;
};

static struct heartbeat *beats;
static unsigned nbeats;
static uint64_t interval_ms;
static bool stall_logged;

/* Runs on the worker that owns the tick. */
static void beat(struct worker_tick *t)
{
	struct heartbeat *hb = (struct heartbeat *)t;
	atomic_store_explicit(&hb->last_ms, now_ms(), memory_order_relaxed);
}

/* Posted to a worker: register (or remove) its heartbeat tick there,
 * because ticks may only be touched from their own worker's thread. */
static void tick_on(void *arg)
{
	struct heartbeat *hb = arg;
	worker_tick_add(&hb->tick);
	beat(&hb->tick);
}

static void tick_off(void *arg)
{
	struct heartbeat *hb = arg;
	worker_tick_del(&hb->tick);
}

bool watchdog_start(void)
{
	uint64_t usec = 0;

	if (sd_watchdog_enabled(0, &usec) <= 0 || usec == 0)
		return false;
	nbeats = workers_count();
	beats = calloc(nbeats, sizeof(*beats));
	if (!beats) {
		nbeats = 0;
		return false;
	}
	interval_ms = usec / 1000;
	if (interval_ms < 2000)
		interval_ms = 2000; /* ticks come once a second: leave room for one late tick */
	uint64_t now = now_ms();
	for (unsigned i = 0; i < nbeats; i++) {
		beats[i].tick.fn = beat;
		atomic_store(&beats[i].last_ms, now);
		worker_post_wait(worker_get(i), tick_on, &beats[i]);
	}
	log_info("systemd watchdog: pinging every %llu ms while %u worker loop(s) tick",
		 (unsigned long long)interval_ms / 2, nbeats);
	return true;
}

int watchdog_poll_ms(void)
{
	return beats ? (int)(interval_ms / 2) : -1;
}

void watchdog_feed(void)
{
	if (!beats)
		return;
	uint64_t now = now_ms();
	for (unsigned i = 0; i < nbeats; i++) {
		uint64_t last = atomic_load_explicit(&beats[i].last_ms, memory_order_relaxed);
		if (now > last && now - last > interval_ms) {
			if (!stall_logged)
				log_err("worker %u has not run its loop for %llu ms; withholding the systemd "
					"watchdog ping so the service is restarted", i,
					(unsigned long long)(now - last));
			stall_logged = true;
			return;
		}
	}
	stall_logged = false;
	sd_notify(0, "WATCHDOG=1");
}

void watchdog_stop(void)
{
	if (!beats)
		return;
	/* workers_stop runs posted calls before the threads exit, so the
	 * ticks are gone before they could run again; the array lives until
	 * the process exits. */
	for (unsigned i = 0; i < nbeats; i++)
		worker_post_wait(worker_get(i), tick_off, &beats[i]);
}
