/*
 * log.c - stderr logging with journald priority prefixes.
 *
 * One write(2) per line so lines from different threads never interleave.
 */
#include "common/log.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static _Atomic int cur_level = LOG_LVL_INFO;
static int journal = -1;

void log_set_level(enum log_level lvl) { atomic_store(&cur_level, lvl); }
enum log_level log_get_level(void) { return (enum log_level)atomic_load(&cur_level); }

static const char *level_name(enum log_level lvl)
{
	switch (lvl) {
	case LOG_LVL_ERR: return "error";
	case LOG_LVL_WARN: return "warning";
	case LOG_LVL_INFO: return "info";
	default: return "debug";
	}
}

void log_vmsg(enum log_level lvl, const char *fmt, va_list ap)
{
	char line[1024];
	int n = 0;

	if ((int)lvl > atomic_load(&cur_level))
		return;
	if (journal < 0)
		journal = getenv("JOURNAL_STREAM") != NULL;
	if (journal)
		n = snprintf(line, sizeof(line), "<%d>", (int)lvl);
	n += snprintf(line + n, sizeof(line) - n, "tiercached: %s: ", level_name(lvl));
	if (n < (int)sizeof(line))
		n += vsnprintf(line + n, sizeof(line) - n, fmt, ap);
	if (n > (int)sizeof(line) - 2)
		n = sizeof(line) - 2;
	line[n++] = '\n';
	ssize_t w = write(STDERR_FILENO, line, n);
	(void)w;
}

void log_msg(enum log_level lvl, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	log_vmsg(lvl, fmt, ap);
	va_end(ap);
}
