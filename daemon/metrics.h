/*
 * metrics.h - Prometheus /metrics over HTTP ([daemon] metrics, metrics.c).
 */
#ifndef TC_DAEMON_METRICS_H
#define TC_DAEMON_METRICS_H

struct daemon;

/* Listen on every [daemon] metrics address of d->cfg (none: nothing to
 * do). d must outlive metrics_stop. 0, or -1 after logging why. Main thread. */
int metrics_start(struct daemon *d);
/* Stop listening and wait for scrapes in progress. Main thread. */
void metrics_stop(void);

#endif
