/*
 * config.c - read the INI file with inih and turn it into struct config.
 *
 * inih hands us (section, key, value) triples in file order. We feed it
 * through ini_parse_stream with our own line reader, so the reader's line
 * counter is the line of the key being handled, and every message can say
 * "FILE:LINE". Parsing stops at the first error. Cross-references (a target's
 * lunN naming a [lun] section, duplicate names) are checked after the whole
 * file is read, still naming the line that is wrong.
 *
 * This file is the reader, the sections and the lifetime of struct config;
 * the keys of each section are config_keys.c and config_lun.c, the checks
 * after the whole file config_validate.c (config_int.h).
 */
#include "config/config_int.h"

#include "cache/cache.h"

#include <errno.h>
#include <ini.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void cfg_fail_at(struct parse_state *ps, int line, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (ps->failed)
		return;
	ps->failed = true;
	n = snprintf(ps->err, ps->errlen, "%s:%d: ", ps->name, line);
	if (n < 0 || (size_t)n >= ps->errlen)
		return;
	va_start(ap, fmt);
	vsnprintf(ps->err + n, ps->errlen - n, fmt, ap);
	va_end(ap);
}

static char *reader(char *buf, int size, void *stream)
{
	struct parse_state *ps = stream;

	if (ps->fp) {
		if (!fgets(buf, size, ps->fp))
			return NULL;
	} else {
		if (!*ps->str)
			return NULL;
		int n = 0;
		while (n < size - 1 && ps->str[n] && ps->str[n] != '\n')
			n++;
		if (n < size - 1 && ps->str[n] == '\n')
			n++;
		memcpy(buf, ps->str, n);
		buf[n] = '\0';
		ps->str += n;
	}
	ps->line++;
	size_t len = strlen(buf);
	bool more = ps->fp ? !feof(ps->fp) : *ps->str != '\0';
	if (len && buf[len - 1] != '\n' && more) {
		/* inih would silently take the rest as a new line */
		cfg_fail_at(ps, ps->line, "this line is longer than %d characters; shorten it "
			"(allow may be given on several lines)", size - 2);
		return NULL;
	}
	const char *p = buf;
	while (*p == ' ' || *p == '\t')
		p++;
	if (*p == '[') {
		ps->header_line = ps->line;
		const char *end = strchr(p, ']');
		size_t n = end ? (size_t)(end - p - 1) : 0;
		if (n >= sizeof(ps->header_text))
			n = sizeof(ps->header_text) - 1;
		memcpy(ps->header_text, p + 1, n);
		ps->header_text[n] = '\0';
		while (n && (ps->header_text[n - 1] == ' ' || ps->header_text[n - 1] == '\t'))
			ps->header_text[--n] = '\0';
		char *q = ps->header_text;
		while (*q == ' ' || *q == '\t')
			q++;
		memmove(ps->header_text, q, strlen(q) + 1);
	}
	return buf;
}

char *cfg_xstrdup(struct parse_state *ps, const char *s)
{
	char *d = strdup(s);
	if (!d)
		cfg_fail_at(ps, ps->line, "out of memory");
	return d;
}

static void *grow(void *arr, int count, size_t elem)
{
	/* grow geometrically: capacity is the next power of two >= count+1 */
	if (count & (count - 1) && count != 0)
		return arr;
	size_t cap = count ? (size_t)count * 2 : 1;
	void *n = realloc(arr, cap * elem);
	if (n && count)
		memset((char *)n + (size_t)count * elem, 0, ((size_t)cap - count) * elem);
	else if (n)
		memset(n, 0, elem);
	return n;
}

static int begin_section(struct parse_state *ps, const char *section)
{
	struct config *cfg = ps->cfg;
	const char *arg;

	int line = ps->header_line;
	ps->section_line = line;
	if (!strcmp(section, "daemon")) {
		ps->sec = SEC_DAEMON;
	} else if (!strcmp(section, "portal")) {
		ps->sec = SEC_PORTAL;
	} else if (!strcmp(section, "tcmu")) {
		ps->sec = SEC_TCMU;
	} else if (!strncmp(section, "target", 6) && (section[6] == ' ' || section[6] == '\t')) {
		arg = section + 7;
		while (*arg == ' ' || *arg == '\t')
			arg++;
		if (!cfg_valid_iscsi_name(arg)) {
			cfg_fail_at(ps, line,
				"[target %s]: \"%s\" is not a valid iSCSI name; use the form "
				"iqn.YYYY-MM.reversed.domain:name in lower case (RFC 7143 section 4.2.7)",
				arg, arg);
			return 0;
		}
		for (int i = 0; i < cfg->ntargets; i++)
			if (!strcmp(cfg->targets[i].iqn, arg)) {
				cfg_fail_at(ps, line, "[target %s] is defined twice (first at line %d); merge the two sections",
					arg, cfg->targets[i].line);
				return 0;
			}
		struct cfg_target *t = grow(cfg->targets, cfg->ntargets, sizeof(*t));
		if (!t) {
			cfg_fail_at(ps, line, "out of memory");
			return 0;
		}
		cfg->targets = t;
		t = &cfg->targets[cfg->ntargets++];
		t->iqn = cfg_xstrdup(ps, arg);
		t->line = line;
		ps->sec = SEC_TARGET;
	} else if (!strncmp(section, "lun", 3) && (section[3] == ' ' || section[3] == '\t')) {
		arg = section + 4;
		while (*arg == ' ' || *arg == '\t')
			arg++;
		if (!*arg || strlen(arg) > 64 || strpbrk(arg, " \t/")) {
			cfg_fail_at(ps, line,
				"[lun %s]: a LUN name is 1 to 64 characters without spaces or '/'; rename it", arg);
			return 0;
		}
		for (int i = 0; i < cfg->nluns; i++)
			if (!strcmp(cfg->luns[i].name, arg)) {
				cfg_fail_at(ps, line, "[lun %s] is defined twice (first at line %d); give each LUN its own name",
					arg, cfg->luns[i].line);
				return 0;
			}
		struct cfg_lun *l = grow(cfg->luns, cfg->nluns, sizeof(*l));
		if (!l) {
			cfg_fail_at(ps, line, "out of memory");
			return 0;
		}
		cfg->luns = l;
		l = &cfg->luns[cfg->nluns++];
		l->name = cfg_xstrdup(ps, arg);
		l->block_size = 512;
		l->io_timeout = 30;
		l->line = line;
		ps->sec = SEC_LUN;
	} else if (!strncmp(section, "cache", 5) && (section[5] == ' ' || section[5] == '\t')) {
		arg = section + 6;
		while (*arg == ' ' || *arg == '\t')
			arg++;
		if (!*arg || strlen(arg) > 63 || strpbrk(arg, " \t/")) {
			cfg_fail_at(ps, line,
				"[cache %s]: a cache set name is 1 to 63 characters without spaces or '/'; rename it", arg);
			return 0;
		}
		for (int i = 0; i < cfg->ncaches; i++)
			if (!strcmp(cfg->caches[i].name, arg)) {
				cfg_fail_at(ps, line, "[cache %s] is defined twice (first at line %d); merge the two sections",
					arg, cfg->caches[i].line);
				return 0;
			}
		struct cfg_cache *c = grow(cfg->caches, cfg->ncaches, sizeof(*c));
		if (!c) {
			cfg_fail_at(ps, line, "out of memory");
			return 0;
		}
		cfg->caches = c;
		c = &cfg->caches[cfg->ncaches++];
		c->name = cfg_xstrdup(ps, arg);
		c->extent = 256u << 10;
		c->mode = CACHE_WRITE_BACK;
		c->admit_hits = 2;
		c->seq_cutoff = 4u << 20;
		c->dirty_target = 10;
		c->leg_timeout = 10;
		c->max_read_errors = 50;
		c->line = line;
		ps->sec = SEC_CACHE;
	} else {
		cfg_fail_at(ps, line,
			"unknown section [%s]; sections are [daemon], [portal], [target IQN], [lun NAME], "
			"[cache NAME] and [tcmu]",
			section);
		return 0;
	}
	return 1;
}

static int handler(void *user, const char *section, const char *name, const char *value)
{
	struct parse_state *ps = user;

	if (ps->failed)
		return 0;
	if (!name)
		return 1;
	if (ps->header_line != ps->section_line || ps->sec == SEC_NONE) {
		if (!*section) {
			cfg_fail_at(ps, ps->line, "\"%s\" appears before any section; put it under [daemon], [portal], "
				"[target IQN] or [lun NAME]", name);
			return 0;
		}
		if (!begin_section(ps, ps->header_text))
			return 0;
	}
	switch (ps->sec) {
	case SEC_DAEMON: return cfg_handle_daemon(ps, name, value);
	case SEC_PORTAL: return cfg_handle_portal(ps, name, value);
	case SEC_TARGET: return cfg_handle_target(ps, name, value);
	case SEC_LUN: return cfg_handle_lun(ps, name, value);
	case SEC_TCMU: return cfg_handle_tcmu(ps, name, value);
	case SEC_CACHE: return cfg_handle_cache(ps, name, value);
	default: return 0;
	}
}

struct cfg_lun *config_find_lun(const struct config *cfg, const char *name)
{
	for (int i = 0; i < cfg->nluns; i++)
		if (!strcmp(cfg->luns[i].name, name))
			return &cfg->luns[i];
	return NULL;
}

struct cfg_cache *config_find_cache(const struct config *cfg, const char *name)
{
	for (int i = 0; i < cfg->ncaches; i++)
		if (!strcmp(cfg->caches[i].name, name))
			return &cfg->caches[i];
	return NULL;
}

static int parse(struct parse_state *ps, struct config **out)
{
	struct config *cfg = calloc(1, sizeof(*cfg));
	if (!cfg) {
		snprintf(ps->err, ps->errlen, "%s: out of memory", ps->name);
		return -1;
	}
	ps->cfg = cfg;
	cfg->path = strdup(ps->name);
	int r = ini_parse_stream(reader, ps, handler, ps);
	if (r != 0 && !ps->failed) {
		if (r < 0)
			cfg_fail_at(ps, 0, "cannot read the file");
		else
			cfg_fail_at(ps, r, "cannot parse this line; expected [section] or key = value");
	}
	if (!ps->failed)
		cfg_validate(ps);
	if (ps->failed) {
		config_free(cfg);
		return -1;
	}
	*out = cfg;
	return 0;
}

int config_parse_string(const char *text, const char *name, struct config **out, char *err, size_t errlen)
{
	struct parse_state ps = { .name = name, .err = err, .errlen = errlen, .str = text };
	return parse(&ps, out);
}

int config_load(const char *path, struct config **out, char *err, size_t errlen)
{
	struct parse_state ps = { .name = path, .err = err, .errlen = errlen };
	ps.fp = fopen(path, "r");
	if (!ps.fp) {
		snprintf(err, errlen, "%s: cannot open the configuration file: %s", path, strerror(errno));
		return -1;
	}
	int r = parse(&ps, out);
	fclose(ps.fp);
	return r;
}

void config_free(struct config *cfg)
{
	if (!cfg)
		return;
	for (int i = 0; i < cfg->nlisten; i++)
		free(cfg->listen[i].addr);
	for (int i = 0; i < cfg->ntcmu_portal; i++)
		free(cfg->tcmu_portal[i].addr);
	for (int i = 0; i < cfg->nmetrics; i++)
		free(cfg->metrics[i].addr);
	for (int i = 0; i < cfg->ntargets; i++) {
		struct cfg_target *t = &cfg->targets[i];
		free(t->iqn);
		for (int j = 0; j < t->nluns; j++)
			free(t->luns[j].lun_name);
		for (int j = 0; j < t->nallow; j++)
			free(t->allow[j]);
		free(t->chap_user);
		free(t->chap_secret);
		free(t->mutual_user);
		free(t->mutual_secret);
	}
	free(cfg->targets);
	for (int i = 0; i < cfg->ncaches; i++) {
		free(cfg->caches[i].name);
		for (int k = 0; k < cfg->caches[i].nlegs; k++)
			free(cfg->caches[i].legs[k]);
	}
	free(cfg->caches);
	for (int i = 0; i < cfg->nluns; i++) {
		free(cfg->luns[i].cache);
		free(cfg->luns[i].name);
		free(cfg->luns[i].backing);
		free(cfg->luns[i].serial);
		free(cfg->luns[i].ceph_conf);
		free(cfg->luns[i].ceph_user);
	}
	free(cfg->luns);
	free(cfg->state_dir);
	free(cfg->disc_chap_user);
	free(cfg->disc_chap_secret);
	free(cfg->disc_mutual_user);
	free(cfg->disc_mutual_secret);
	free(cfg->control_socket);
	free(cfg->log_level);
	free(cfg->path);
	free(cfg);
}
