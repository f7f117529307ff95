/*
 * watchdog.h - systemd's service watchdog, fed only while the event loops turn.
 *
 * Why: WatchdogSec= in tiercached.service asks for a WATCHDOG=1 ping at
 * least every WATCHDOG_USEC. Pinging from a timer alone would keep a daemon
 * whose workers are wedged (a stuck io_uring completion, a deadlock) alive
 * forever. So every worker bumps a heartbeat from its once-a-second tick,
 * and the main thread pings only when every heartbeat is fresh; a stalled
 * worker makes the daemon miss its pings and systemd restarts it.
 *
 * Threading contract: all three functions are main-thread calls.
 * watchdog_start after workers_start; watchdog_poll_ms/watchdog_feed from
 * the main thread's signal loop; watchdog_stop before workers_stop.
 */
#ifndef TC_DAEMON_WATCHDOG_H
#define TC_DAEMON_WATCHDOG_H

#include <stdbool.h>

/* Read WATCHDOG_USEC (sd_watchdog_enabled) and start the worker heartbeats.
 * Returns true when systemd wants pings. */
bool watchdog_start(void);
/* How long the main thread may sleep between feeds, in milliseconds
 * (half the watchdog interval); -1 when the watchdog is off. */
int watchdog_poll_ms(void);
/* Ping systemd if every worker's heartbeat is recent; otherwise log once
 * which worker is stalled and withhold the ping. */
void watchdog_feed(void);
void watchdog_stop(void);

#endif
