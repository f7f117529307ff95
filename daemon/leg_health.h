/*
 * leg_health.h - a cache leg's device health as JSON for `tierctl status`.
 *
 * Why: the control socket speaks JSON (json-c) and cache/nvme_health.c
 * deliberately does not; this is the small adapter between them, so
 * status shows each leg's kind and, for NVMe namespaces, the identify
 * strings and the SMART numbers libnvme read.
 *
 * Threading contract: control thread (or main). It issues NVMe admin
 * commands, which may block for the driver's admin timeout.
 */
#ifndef TC_DAEMON_LEG_HEALTH_H
#define TC_DAEMON_LEG_HEALTH_H

struct json_object;

/* Add a "device" object describing path to leg. */
void leg_health_json(struct json_object *leg, const char *path);

#endif
