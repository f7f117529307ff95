/*
 * config_int.h - what the files of the configuration parser share.
 *
 * config.c reads the file and hands each key to its section's handler:
 * config_keys.c ([daemon], [portal], [tcmu], [target], and the value
 * parsers), config_lun.c ([lun], [cache]); config_validate.c checks the
 * whole once it is read and fills in the defaults. All of them report
 * through cfg_fail_at, so every message has the same "FILE:LINE: " form
 * and only the first error is kept. Main thread only (config.h).
 */
#ifndef TC_CONFIG_INT_H
#define TC_CONFIG_INT_H

#include "config/config.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

struct parse_state {
	struct config *cfg;
	const char *name;   /* file name for messages */
	int line;           /* line the reader handed out last */
	char *err;
	size_t errlen;
	bool failed;
	/* the reader's source: a FILE or a string */
	FILE *fp;
	const char *str;
	/* current section */
	enum { SEC_NONE, SEC_DAEMON, SEC_PORTAL, SEC_TARGET, SEC_LUN, SEC_TCMU, SEC_CACHE } sec;
	int header_line;    /* line of the last "[section]" the reader saw */
	char header_text[256]; /* its name, whole: inih cuts section names at 50 */
	int section_line;   /* line of the section keys currently go to */
};

/* ---- config.c ---- */

/* Record the first error, "NAME:LINE: " and the sentence; later ones are
 * dropped (parsing stops at the first). */
void cfg_fail_at(struct parse_state *ps, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* strdup, or NULL after cfg_fail_at(out of memory) at the current line. */
char *cfg_xstrdup(struct parse_state *ps, const char *s);

/* ---- config_keys.c ---- */

/* yes/true/on/1 or no/false/off/0. 0, or -1 if neither. */
int cfg_parse_bool(const char *v, bool *out);
/* A decimal number up to max. 0, or -1 if malformed or too big. */
int cfg_parse_uint(const char *v, unsigned long max, unsigned long *out);
/* iqn.yyyy-mm.reversed.domain[:anything], eui.16hex, naa.16or32hex */
bool cfg_valid_iscsi_name(const char *n);
/* One key of the current section: 1, or 0 after cfg_fail_at. */
int cfg_handle_daemon(struct parse_state *ps, const char *key, const char *val);
int cfg_handle_portal(struct parse_state *ps, const char *key, const char *val);
int cfg_handle_tcmu(struct parse_state *ps, const char *key, const char *val);
int cfg_handle_target(struct parse_state *ps, const char *key, const char *val);

/* ---- config_lun.c ---- */

int cfg_handle_lun(struct parse_state *ps, const char *key, const char *val);
int cfg_handle_cache(struct parse_state *ps, const char *key, const char *val);

/* ---- config_validate.c ---- */

/* The whole file is read: check what spans sections, resolve names, fill
 * in the defaults. 0, or -1 after cfg_fail_at. */
int cfg_validate(struct parse_state *ps);

#endif
