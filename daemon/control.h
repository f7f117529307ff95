/*
 * control.h - the daemon's Unix control socket (tierctl talks to it).
 *
 * One request per connection: the client sends a JSON object with a "cmd"
 * member and optional arguments, ends with a newline, and reads back one
 * JSON object: {"ok": true, ...} or {"ok": false, "error": "sentence"}.
 * The socket is created mode 0600 and every peer is checked with
 * SO_PEERCRED: only root (or the daemon's own user) may talk to it.
 *
 * Threading contract: control_register before control_start, main thread.
 * Handlers run on the control thread, one at a time; they must not block
 * for long and must use thread-safe engine APIs (status snapshots, posts
 * to workers). control_stop from the main thread.
 */
#ifndef TC_DAEMON_CONTROL_H
#define TC_DAEMON_CONTROL_H

#include <stddef.h>

struct json_object;

/* Fill resp (an object). Return 0, or -1 after setting resp's "error". */
typedef int (*control_fn)(struct json_object *req, struct json_object *resp, void *arg);

int control_register(const char *cmd, control_fn fn, void *arg);
int control_start(const char *path, char *err, size_t errlen);
void control_stop(void);
/* Keep command handlers from running (any thread; a handler runs with it
 * held): a configuration reload swaps what they read under it. */
void control_lock(void);
void control_unlock(void);

/* Helper for handlers: set "error" to a formatted sentence and return -1. */
int control_error(struct json_object *resp, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
