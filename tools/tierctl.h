/*
 * tierctl.h - what tierctl's files share.
 */
#ifndef TC_TIERCTL_H
#define TC_TIERCTL_H

struct json_object;

/* Send req to the daemon at path, return its answer (NULL: *rc set, and
 * the reason printed). */
struct json_object *tierctl_call(const char *path, struct json_object *req, int *rc);

/* tierctl top (tierctl_top.c): every interval seconds, count times (0: until
 * Ctrl-C). The exit status. */
int tierctl_top(const char *path, int interval, int count);

#endif
