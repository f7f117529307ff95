/*
 * log.h - the daemon's one way to tell the operator something.
 *
 * Lines go to stderr as "tiercached: LEVEL: message". When running under
 * systemd (JOURNAL_STREAM set) the level is also carried as a syslog
 * priority prefix so journald files it correctly. Safe from any thread;
 * never call it per I/O on the hot path except for errors.
 *
 * Secrets (CHAP) must never be passed to these functions.
 */
#ifndef TC_LOG_H
#define TC_LOG_H

#include <stdarg.h>

enum log_level { LOG_LVL_ERR = 3, LOG_LVL_WARN = 4, LOG_LVL_INFO = 6, LOG_LVL_DEBUG = 7 };

void log_set_level(enum log_level lvl);
enum log_level log_get_level(void);
void log_msg(enum log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void log_vmsg(enum log_level lvl, const char *fmt, va_list ap);

#define log_err(...) log_msg(LOG_LVL_ERR, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_LVL_WARN, __VA_ARGS__)
#define log_info(...) log_msg(LOG_LVL_INFO, __VA_ARGS__)
#define log_debug(...)                                                   \
	do {                                                             \
		if (log_get_level() >= LOG_LVL_DEBUG)                    \
			log_msg(LOG_LVL_DEBUG, __VA_ARGS__);             \
	} while (0)

#endif
