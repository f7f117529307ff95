/*
 * config.c - read the INI file with inih and turn it into struct config.
 *
 * inih hands us (section, key, value) triples in file order. We feed it
 * through ini_parse_stream with our own line reader, so the reader's line
 * counter is the line of the key being handled, and every message can say
 * "FILE:LINE". Parsing stops at the first error. Cross-references (a target's
 * lunN naming a [lun] section, duplicate names) are checked after the whole
 * file is read, still naming the line that is wrong.
 */
#include "config/config.h"

#include "cache/cache.h"

#include <ctype.h>
#include <errno.h>
#include <ini.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static void fail_at(struct parse_state *ps, int line, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void fail_at(struct parse_state *ps, int line, const char *fmt, ...)
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
		fail_at(ps, ps->line, "this line is longer than %d characters; shorten it "
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

int config_parse_size(const char *s, uint64_t *out)
{
	char *end;
	double v;
	uint64_t mult = 1;

	while (isspace((unsigned char)*s))
		s++;
	if (!isdigit((unsigned char)*s))
		return -1;
	errno = 0;
	v = strtod(s, &end);
	if (errno || v < 0)
		return -1;
	while (isspace((unsigned char)*end))
		end++;
	switch (toupper((unsigned char)*end)) {
	case '\0': break;
	case 'K': mult = 1ULL << 10; end++; break;
	case 'M': mult = 1ULL << 20; end++; break;
	case 'G': mult = 1ULL << 30; end++; break;
	case 'T': mult = 1ULL << 40; end++; break;
	case 'P': mult = 1ULL << 50; end++; break;
	case 'B': break;
	default: return -1;
	}
	if (mult > 1 && (*end == 'i' || *end == 'I'))
		end++;
	if (*end == 'B' || *end == 'b')
		end++;
	while (isspace((unsigned char)*end))
		end++;
	if (*end)
		return -1;
	double bytes = v * (double)mult;
	if (bytes >= 18446744073709551615.0)
		return -1;
	*out = (uint64_t)bytes;
	if ((double)*out != bytes)
		return -1; /* fractional bytes */
	return 0;
}

static int parse_bool(const char *v, bool *out)
{
	if (!strcasecmp(v, "yes") || !strcasecmp(v, "true") || !strcasecmp(v, "on") || !strcmp(v, "1")) {
		*out = true;
		return 0;
	}
	if (!strcasecmp(v, "no") || !strcasecmp(v, "false") || !strcasecmp(v, "off") || !strcmp(v, "0")) {
		*out = false;
		return 0;
	}
	return -1;
}

static int parse_uint(const char *v, unsigned long max, unsigned long *out)
{
	char *end;
	if (!isdigit((unsigned char)*v))
		return -1;
	errno = 0;
	unsigned long r = strtoul(v, &end, 10);
	if (errno || *end || r > max)
		return -1;
	*out = r;
	return 0;
}

/* iqn.yyyy-mm.reversed.domain[:anything], eui.16hex, naa.16or32hex */
static bool valid_iscsi_name(const char *n)
{
	size_t len = strlen(n);
	if (len > 223)
		return false;
	if (!strncmp(n, "iqn.", 4)) {
		if (len < 12 || !isdigit((unsigned char)n[4]) || !isdigit((unsigned char)n[5]) ||
		    !isdigit((unsigned char)n[6]) || !isdigit((unsigned char)n[7]) || n[8] != '-' ||
		    !isdigit((unsigned char)n[9]) || !isdigit((unsigned char)n[10]) || n[11] != '.')
			return false;
	} else if (!strncmp(n, "eui.", 4)) {
		if (len != 20)
			return false;
	} else if (!strncmp(n, "naa.", 4)) {
		if (len != 20 && len != 36)
			return false;
	} else {
		return false;
	}
	for (const char *p = n; *p; p++) {
		unsigned char c = (unsigned char)*p;
		if (!(islower(c) || isdigit(c) || c == '.' || c == '-' || c == ':'))
			return false;
	}
	return true;
}

static char *xstrdup(struct parse_state *ps, const char *s)
{
	char *d = strdup(s);
	if (!d)
		fail_at(ps, ps->line, "out of memory");
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
		if (!valid_iscsi_name(arg)) {
			fail_at(ps, line,
				"[target %s]: \"%s\" is not a valid iSCSI name; use the form "
				"iqn.YYYY-MM.reversed.domain:name in lower case (RFC 7143 section 4.2.7)",
				arg, arg);
			return 0;
		}
		for (int i = 0; i < cfg->ntargets; i++)
			if (!strcmp(cfg->targets[i].iqn, arg)) {
				fail_at(ps, line, "[target %s] is defined twice (first at line %d); merge the two sections",
					arg, cfg->targets[i].line);
				return 0;
			}
		struct cfg_target *t = grow(cfg->targets, cfg->ntargets, sizeof(*t));
		if (!t) {
			fail_at(ps, line, "out of memory");
			return 0;
		}
		cfg->targets = t;
		t = &cfg->targets[cfg->ntargets++];
		t->iqn = xstrdup(ps, arg);
		t->line = line;
		ps->sec = SEC_TARGET;
	} else if (!strncmp(section, "lun", 3) && (section[3] == ' ' || section[3] == '\t')) {
		arg = section + 4;
		while (*arg == ' ' || *arg == '\t')
			arg++;
		if (!*arg || strlen(arg) > 64 || strpbrk(arg, " \t/")) {
			fail_at(ps, line,
				"[lun %s]: a LUN name is 1 to 64 characters without spaces or '/'; rename it", arg);
			return 0;
		}
		for (int i = 0; i < cfg->nluns; i++)
			if (!strcmp(cfg->luns[i].name, arg)) {
				fail_at(ps, line, "[lun %s] is defined twice (first at line %d); give each LUN its own name",
					arg, cfg->luns[i].line);
				return 0;
			}
		struct cfg_lun *l = grow(cfg->luns, cfg->nluns, sizeof(*l));
		if (!l) {
			fail_at(ps, line, "out of memory");
			return 0;
		}
		cfg->luns = l;
		l = &cfg->luns[cfg->nluns++];
		l->name = xstrdup(ps, arg);
		l->block_size = 512;
		l->line = line;
		ps->sec = SEC_LUN;
	} else if (!strncmp(section, "cache", 5) && (section[5] == ' ' || section[5] == '\t')) {
		arg = section + 6;
		while (*arg == ' ' || *arg == '\t')
			arg++;
		if (!*arg || strlen(arg) > 63 || strpbrk(arg, " \t/")) {
			fail_at(ps, line,
				"[cache %s]: a cache set name is 1 to 63 characters without spaces or '/'; rename it", arg);
			return 0;
		}
		for (int i = 0; i < cfg->ncaches; i++)
			if (!strcmp(cfg->caches[i].name, arg)) {
				fail_at(ps, line, "[cache %s] is defined twice (first at line %d); merge the two sections",
					arg, cfg->caches[i].line);
				return 0;
			}
		struct cfg_cache *c = grow(cfg->caches, cfg->ncaches, sizeof(*c));
		if (!c) {
			fail_at(ps, line, "out of memory");
			return 0;
		}
		cfg->caches = c;
		c = &cfg->caches[cfg->ncaches++];
		c->name = xstrdup(ps, arg);
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
		fail_at(ps, line,
			"unknown section [%s]; sections are [daemon], [portal], [target IQN], [lun NAME], "
			"[cache NAME] and [tcmu]",
			section);
		return 0;
	}
	return 1;
}

static int handle_daemon(struct parse_state *ps, const char *key, const char *val)
{
	struct config *cfg = ps->cfg;
	unsigned long u;

	if (!strcmp(key, "state_dir")) {
		free(cfg->state_dir);
		cfg->state_dir = xstrdup(ps, val);
	} else if (!strcmp(key, "control_socket")) {
		if (!*val || strlen(val) > 107) {
			fail_at(ps, ps->line, "[daemon] control_socket must be a path of 1 to 107 characters");
			return 0;
		}
		free(cfg->control_socket);
		cfg->control_socket = xstrdup(ps, val);
	} else if (!strcmp(key, "workers")) {
		if (parse_uint(val, 256, &u)) {
			fail_at(ps, ps->line, "[daemon] workers = %s: give a number of threads from 0 (one per core) to 256", val);
			return 0;
		}
		cfg->workers = (unsigned)u;
	} else if (!strcmp(key, "log_level")) {
		if (strcmp(val, "error") && strcmp(val, "warning") && strcmp(val, "info") && strcmp(val, "debug")) {
			fail_at(ps, ps->line, "[daemon] log_level = %s: use error, warning, info or debug", val);
			return 0;
		}
		free(cfg->log_level);
		cfg->log_level = xstrdup(ps, val);
	} else if (!strcmp(key, "nop_interval") || !strcmp(key, "nop_timeout")) {
		if (parse_uint(val, 3600, &u)) {
			fail_at(ps, ps->line, "[daemon] %s = %s: give seconds from 0 to 3600", key, val);
			return 0;
		}
		if (!strcmp(key, "nop_interval"))
			cfg->nop_interval = (unsigned)u;
		else
			cfg->nop_timeout = (unsigned)u;
	} else {
		fail_at(ps, ps->line,
			"[daemon] has no key \"%s\"; known keys: state_dir, control_socket, workers, log_level, "
			"nop_interval, nop_timeout",
			key);
		return 0;
	}
	return 1;
}

/* One ADDRESS:PORT / [V6]:PORT line into arr (the portal's listen lines,
 * or the LIO portals of [tcmu]); key names the line in messages. */
static int add_address(struct parse_state *ps, const char *key, const char *val, struct cfg_listen *arr, int *n)
{
	if (*n >= CFG_MAX_LISTEN) {
		fail_at(ps, ps->line, "more than %d %s lines; remove some", CFG_MAX_LISTEN, key);
		return 0;
	}
	char host[256];
	const char *port_s;
	if (val[0] == '[') {
		const char *close = strchr(val, ']');
		if (!close || (size_t)(close - val - 1) >= sizeof(host)) {
			fail_at(ps, ps->line, "%s = %s: an IPv6 address is written [ADDRESS]:PORT, e.g. [::1]:3260", key, val);
			return 0;
		}
		memcpy(host, val + 1, close - val - 1);
		host[close - val - 1] = '\0';
		port_s = close[1] == ':' ? close + 2 : (close[1] ? NULL : "3260");
	} else {
		const char *colon = strrchr(val, ':');
		if (colon && strchr(val, ':') != colon) {
			fail_at(ps, ps->line, "%s = %s: write an IPv6 address in brackets, e.g. [%s]:3260", key, val, val);
			return 0;
		}
		size_t hl = colon ? (size_t)(colon - val) : strlen(val);
		if (hl == 0 || hl >= sizeof(host)) {
			fail_at(ps, ps->line, "%s = %s: give ADDRESS:PORT, e.g. 127.0.0.1:3260 or 0.0.0.0:3260", key, val);
			return 0;
		}
		memcpy(host, val, hl);
		host[hl] = '\0';
		port_s = colon ? colon + 1 : "3260";
	}
	unsigned long port;
	if (!port_s || parse_uint(port_s, 65535, &port) || port == 0) {
		fail_at(ps, ps->line, "%s = %s: the port must be a number from 1 to 65535", key, val);
		return 0;
	}
	for (int i = 0; i < *n; i++)
		if (!strcmp(arr[i].addr, host) && arr[i].port == port) {
			fail_at(ps, ps->line, "%s = %s repeats line %d; remove one", key, val, arr[i].line);
			return 0;
		}
	struct cfg_listen *l = &arr[(*n)++];
	l->addr = xstrdup(ps, host);
	l->port = (uint16_t)port;
	l->line = ps->line;
	return 1;
}

static int handle_portal(struct parse_state *ps, const char *key, const char *val)
{
	if (!strcmp(key, "port_group")) {
		unsigned long u;
		if (parse_uint(val, CFG_MAX_GATEWAYS, &u) || u == 0) {
			fail_at(ps, ps->line, "[portal] port_group = %s: give this gateway's number, 1 to %d "
				"(each gateway of a shared LUN its own)", val, CFG_MAX_GATEWAYS);
			return 0;
		}
		ps->cfg->port_group = (unsigned)u;
		ps->cfg->port_group_line = ps->line;
		return 1;
	}
	if (strcmp(key, "listen")) {
		fail_at(ps, ps->line, "[portal] has no key \"%s\"; the portal takes listen = ADDRESS:PORT "
			"lines and port_group = N", key);
		return 0;
	}
	return add_address(ps, "listen", val, ps->cfg->listen, &ps->cfg->nlisten);
}

static int check_secret(struct parse_state *ps, const char *key, const char *val)
{
	size_t n = strlen(val);
	/* RFC 7143 12.1.3 wants at least 96 bits; Windows insists on 12..16 chars. */
	if (n < 12 || n > 16) {
		/* never echo the secret itself */
		fail_at(ps, ps->line,
			"%s is %zu characters long; CHAP secrets must be 12 to 16 characters "
			"(RFC 7143 and the Windows initiator require it)", key, n);
		return 0;
	}
	return 1;
}

/* [tcmu]: the LIO front end (target/tcmu). */
static int handle_tcmu(struct parse_state *ps, const char *key, const char *val)
{
	bool *dst;
	if (!strcmp(key, "portal"))
		return add_address(ps, "portal", val, ps->cfg->tcmu_portal, &ps->cfg->ntcmu_portal);
	if (!strcmp(key, "enable")) {
		dst = &ps->cfg->tcmu_enable;
	} else if (!strcmp(key, "dbus")) {
		dst = &ps->cfg->tcmu_dbus;
	} else {
		fail_at(ps, ps->line, "[tcmu] has no key \"%s\"; known keys: enable, dbus, portal", key);
		return 0;
	}
	if (parse_bool(val, dst)) {
		fail_at(ps, ps->line, "[tcmu] %s = %s: use yes or no", key, val);
		return 0;
	}
	return 1;
}

static int handle_target(struct parse_state *ps, const char *key, const char *val)
{
	struct cfg_target *t = &ps->cfg->targets[ps->cfg->ntargets - 1];

	if (!strncmp(key, "lun", 3) && isdigit((unsigned char)key[3])) {
		unsigned long n;
		if (parse_uint(key + 3, 16383, &n)) {
			fail_at(ps, ps->line, "%s: LUN numbers go from lun0 to lun16383", key);
			return 0;
		}
		if (t->nluns >= CFG_MAX_LUNS_PER_TARGET) {
			fail_at(ps, ps->line, "[target %s] maps more than %d LUNs; split it into several targets",
				t->iqn, CFG_MAX_LUNS_PER_TARGET);
			return 0;
		}
		for (int i = 0; i < t->nluns; i++)
			if (t->luns[i].lun == n) {
				fail_at(ps, ps->line, "%s is mapped twice in [target %s] (also line %d); use another number",
					key, t->iqn, t->luns[i].line);
				return 0;
			}
		struct cfg_target_lun *m = &t->luns[t->nluns++];
		m->lun = n;
		m->lun_name = xstrdup(ps, val);
		m->line = ps->line;
	} else if (!strcmp(key, "allow")) {
		char buf[4096];
		snprintf(buf, sizeof(buf), "%s", val);
		for (char *save = NULL, *tok = strtok_r(buf, " \t,", &save); tok; tok = strtok_r(NULL, " \t,", &save)) {
			if (!valid_iscsi_name(tok)) {
				fail_at(ps, ps->line, "allow: \"%s\" is not a valid initiator name (iqn.YYYY-MM.domain:name, lower case)", tok);
				return 0;
			}
			if (t->nallow >= CFG_MAX_ALLOW) {
				fail_at(ps, ps->line, "allow lists more than %d initiators; split the target", CFG_MAX_ALLOW);
				return 0;
			}
			t->allow[t->nallow++] = xstrdup(ps, tok);
		}
	} else if (!strcmp(key, "chap_user") || !strcmp(key, "mutual_user")) {
		if (!*val || strlen(val) > 255) {
			fail_at(ps, ps->line, "%s must be 1 to 255 characters", key);
			return 0;
		}
		char **dst = !strcmp(key, "chap_user") ? &t->chap_user : &t->mutual_user;
		free(*dst);
		*dst = xstrdup(ps, val);
	} else if (!strcmp(key, "chap_secret") || !strcmp(key, "mutual_secret")) {
		if (!check_secret(ps, key, val))
			return 0;
		char **dst = !strcmp(key, "chap_secret") ? &t->chap_secret : &t->mutual_secret;
		free(*dst);
		*dst = xstrdup(ps, val);
	} else {
		fail_at(ps, ps->line,
			"[target %s] has no key \"%s\"; known keys: lunN, allow, chap_user, chap_secret, "
			"mutual_user, mutual_secret", t->iqn, key);
		return 0;
	}
	return 1;
}

/* POOL/IMAGE: two non-empty names; no snapshots (@), no namespaces */
static bool valid_rbd_spec(const char *spec)
{
	const char *slash = strchr(spec, '/');
	if (!slash || slash == spec || !slash[1] || slash - spec > 255 || strlen(slash + 1) > 255)
		return false;
	for (const char *c = spec; *c; c++)
		if (c != slash && !isalnum((unsigned char)*c) && *c != '.' && *c != '_' && *c != '-')
			return false;
	return true;
}

static int handle_lun(struct parse_state *ps, const char *key, const char *val)
{
	struct cfg_lun *l = &ps->cfg->luns[ps->cfg->nluns - 1];

	if (!strcmp(key, "backing")) {
		if (!*val) {
			fail_at(ps, ps->line, "[lun %s] backing is empty; give a file or block device path", l->name);
			return 0;
		}
		free(l->backing);
		l->backing = xstrdup(ps, val);
	} else if (!strcmp(key, "size")) {
		if (config_parse_size(val, &l->size) || l->size == 0) {
			fail_at(ps, ps->line, "[lun %s] size = %s: write a size like 1G, 500M or 2T", l->name, val);
			return 0;
		}
	} else if (!strcmp(key, "block_size")) {
		if (strcmp(val, "512") && strcmp(val, "4096")) {
			fail_at(ps, ps->line, "[lun %s] block_size = %s: use 512 or 4096", l->name, val);
			return 0;
		}
		l->block_size = (uint32_t)atoi(val);
	} else if (!strcmp(key, "serial")) {
		size_t n = strlen(val);
		bool ok = n >= 1 && n <= 32;
		for (size_t i = 0; ok && i < n; i++)
			ok = val[i] > 0x20 && val[i] < 0x7f;
		if (!ok) {
			fail_at(ps, ps->line,
				"[lun %s] serial = %s: use auto, or 1 to 32 printable ASCII characters without spaces",
				l->name, val);
			return 0;
		}
		free(l->serial);
		l->serial = xstrdup(ps, val);
	} else if (!strcmp(key, "write_cache") || !strcmp(key, "read_only")) {
		bool b;
		if (parse_bool(val, &b)) {
			fail_at(ps, ps->line, "[lun %s] %s = %s: use yes or no", l->name, key, val);
			return 0;
		}
		if (!strcmp(key, "write_cache"))
			l->write_cache = b;
		else
			l->read_only = b;
	} else if (!strcmp(key, "backing_io")) {
		if (strcmp(val, "direct") && strcmp(val, "buffered")) {
			fail_at(ps, ps->line, "[lun %s] backing_io = %s: use direct (O_DIRECT, the default) or "
				"buffered (through the page cache)", l->name, val);
			return 0;
		}
		l->backing_buffered = !strcmp(val, "buffered");
		l->backing_io_line = ps->line;
	} else if (!strcmp(key, "cache")) {
		if (!*val) {
			fail_at(ps, ps->line, "[lun %s] cache is empty; name a [cache NAME] section", l->name);
			return 0;
		}
		free(l->cache);
		l->cache = xstrdup(ps, val);
		l->cache_line = ps->line;
	} else if (!strcmp(key, "ceph_conf") || !strcmp(key, "ceph_user")) {
		const char *v = val;
		if (!strcmp(key, "ceph_user") && !strncmp(v, "client.", 7))
			v += 7; /* librados wants the id; accept the full name too */
		bool ok = *v != 0;
		for (const char *c = v; ok && *c; c++)
			ok = *c > 0x20 && *c < 0x7f;
		if (!ok) {
			fail_at(ps, ps->line, "[lun %s] %s = %s: give %s", l->name, key, val,
				!strcmp(key, "ceph_conf") ? "the path of a ceph.conf (without spaces)"
							  : "a cephx user name like admin or client.iscsi");
			return 0;
		}
		char **dst = !strcmp(key, "ceph_conf") ? &l->ceph_conf : &l->ceph_user;
		free(*dst);
		*dst = xstrdup(ps, v);
		if (!l->ceph_line)
			l->ceph_line = ps->line;
	} else if (!strcmp(key, "ceph_timeout")) {
		unsigned long u;
		if (parse_uint(val, 3600, &u) || u == 0) {
			fail_at(ps, ps->line, "[lun %s] ceph_timeout = %s: give seconds, 1 to 3600 (default 30)",
				l->name, val);
			return 0;
		}
		l->ceph_timeout = (unsigned)u;
		if (!l->ceph_line)
			l->ceph_line = ps->line;
	} else if (!strcmp(key, "gateways")) {
		unsigned long u;
		if (parse_uint(val, CFG_MAX_GATEWAYS, &u) || u == 0) {
			fail_at(ps, ps->line, "[lun %s] gateways = %s: give how many gateways export this LUN, "
				"1 to %d (default 1)", l->name, val, CFG_MAX_GATEWAYS);
			return 0;
		}
		l->gateways = (unsigned)u;
		l->gateways_line = ps->line;
	} else {
		fail_at(ps, ps->line,
			"[lun %s] has no key \"%s\"; known keys: backing, size, block_size, serial, write_cache, "
			"read_only, backing_io, cache, ceph_conf, ceph_user, ceph_timeout, gateways", l->name, key);
		return 0;
	}
	return 1;
}

static int handle_cache(struct parse_state *ps, const char *key, const char *val)
{
	struct cfg_cache *c = &ps->cfg->caches[ps->cfg->ncaches - 1];
	unsigned long u;
	uint64_t sz;

	if (!strcmp(key, "legs")) {
		char buf[4096];
		snprintf(buf, sizeof(buf), "%s", val);
		for (int i = 0; i < c->nlegs; i++)
			free(c->legs[i]);
		c->nlegs = 0;
		for (char *save = NULL, *tok = strtok_r(buf, " \t,", &save); tok; tok = strtok_r(NULL, " \t,", &save)) {
			if (c->nlegs == 2) {
				fail_at(ps, ps->line, "[cache %s] legs lists more than two devices; a set is a mirror "
					"of two legs", c->name);
				return 0;
			}
			c->legs[c->nlegs++] = xstrdup(ps, tok);
		}
		if (c->nlegs == 2 && !strcmp(c->legs[0], c->legs[1])) {
			fail_at(ps, ps->line, "[cache %s] legs lists %s twice; the mirror needs two different devices",
				c->name, c->legs[0]);
			return 0;
		}
	} else if (!strcmp(key, "allow_single_leg")) {
		if (parse_bool(val, &c->allow_single_leg)) {
			fail_at(ps, ps->line, "[cache %s] allow_single_leg = %s: use yes or no", c->name, val);
			return 0;
		}
	} else if (!strcmp(key, "size")) {
		if (config_parse_size(val, &c->size) || c->size < (16u << 20)) {
			fail_at(ps, ps->line, "[cache %s] size = %s: write a size of at least 16M, like 256M or 800G",
				c->name, val);
			return 0;
		}
	} else if (!strcmp(key, "extent")) {
		if (config_parse_size(val, &sz) || sz < (64u << 10) || sz > (4u << 20) || (sz & (sz - 1))) {
			fail_at(ps, ps->line, "[cache %s] extent = %s: use a power of two from 64K to 4M "
				"(256K is the default)", c->name, val);
			return 0;
		}
		c->extent = (uint32_t)sz;
	} else if (!strcmp(key, "mode")) {
		enum cache_mode m;
		if (cache_mode_parse(val, &m)) {
			fail_at(ps, ps->line, "[cache %s] mode = %s: use write-back, write-through, write-around "
				"or pass-through", c->name, val);
			return 0;
		}
		c->mode = (int)m;
	} else if (!strcmp(key, "admit_hits")) {
		if (parse_uint(val, 1000, &u) || u == 0) {
			fail_at(ps, ps->line, "[cache %s] admit_hits = %s: give the number of misses before an "
				"extent is promoted, 1 to 1000", c->name, val);
			return 0;
		}
		c->admit_hits = (uint32_t)u;
	} else if (!strcmp(key, "seq_cutoff")) {
		if (config_parse_size(val, &c->seq_cutoff)) {
			fail_at(ps, ps->line, "[cache %s] seq_cutoff = %s: write a size like 4M, or 0 to cache "
				"sequential streams too", c->name, val);
			return 0;
		}
	} else if (!strcmp(key, "dirty_target")) {
		if (parse_uint(val, 90, &u) || u == 0) {
			fail_at(ps, ps->line, "[cache %s] dirty_target = %s: give a percentage from 1 to 90",
				c->name, val);
			return 0;
		}
		c->dirty_target = (uint32_t)u;
	} else if (!strcmp(key, "leg_timeout")) {
		const char *v = val;
		size_t n = strlen(v);
		char num[32];
		if (n && n < sizeof(num) && v[n - 1] == 's') { /* "10s" as well as "10" */
			memcpy(num, v, n - 1);
			num[n - 1] = 0;
			v = num;
		}
		if (parse_uint(v, 3600, &u)) {
			fail_at(ps, ps->line, "[cache %s] leg_timeout = %s: give the seconds a leg may take to "
				"answer before it is failed, 1 to 3600, or 0 to wait for the device however long "
				"(default 10)", c->name, val);
			return 0;
		}
		c->leg_timeout = (unsigned)u;
	} else if (!strcmp(key, "max_read_errors")) {
		if (parse_uint(val, 1000000, &u)) {
			fail_at(ps, ps->line, "[cache %s] max_read_errors = %s: give how many unreadable ranges a leg may "
				"have rewritten within an hour before it is failed, 1 to 1000000, or 0 for no limit "
				"(default 50)", c->name, val);
			return 0;
		}
		c->max_read_errors = (uint32_t)u;
	} else if (!strcmp(key, "fault_injection")) {
		if (parse_bool(val, &c->fault_injection)) {
			fail_at(ps, ps->line, "[cache %s] fault_injection = %s: use yes or no (yes is for tests: "
				"it lets tierctl leg fault fail the legs)", c->name, val);
			return 0;
		}
	} else {
		fail_at(ps, ps->line,
			"[cache %s] has no key \"%s\"; known keys: legs, allow_single_leg, size, extent, mode, "
			"admit_hits, seq_cutoff, dirty_target, leg_timeout, max_read_errors", c->name, key);
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
			fail_at(ps, ps->line, "\"%s\" appears before any section; put it under [daemon], [portal], "
				"[target IQN] or [lun NAME]", name);
			return 0;
		}
		if (!begin_section(ps, ps->header_text))
			return 0;
	}
	switch (ps->sec) {
	case SEC_DAEMON: return handle_daemon(ps, name, value);
	case SEC_PORTAL: return handle_portal(ps, name, value);
	case SEC_TARGET: return handle_target(ps, name, value);
	case SEC_LUN: return handle_lun(ps, name, value);
	case SEC_TCMU: return handle_tcmu(ps, name, value);
	case SEC_CACHE: return handle_cache(ps, name, value);
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

static int validate_caches(struct parse_state *ps)
{
	struct config *cfg = ps->cfg;

	for (int i = 0; i < cfg->ncaches; i++) {
		struct cfg_cache *c = &cfg->caches[i];
		if (c->nlegs == 0) {
			fail_at(ps, c->line, "[cache %s] has no legs; add legs = /dev/nvme0n1 /dev/nvme1n1 (two "
				"devices or files, mirrored)", c->name);
			return -1;
		}
		if (c->nlegs == 1 && !c->allow_single_leg) {
			fail_at(ps, c->line, "[cache %s] has one leg; with a single device, data in the cache "
				"(dirty data in write-back mode) is lost when it dies: add a second leg, or set "
				"allow_single_leg = yes to accept that", c->name);
			return -1;
		}
		for (int k = 0; k < c->nlegs; k++) {
			for (int j = 0; j < cfg->nluns; j++)
				if (!strcmp(cfg->luns[j].backing, c->legs[k])) {
					fail_at(ps, c->line, "[cache %s] leg %s is the backing store of [lun %s]; "
						"a cache leg needs a device of its own", c->name, c->legs[k],
						cfg->luns[j].name);
					return -1;
				}
			for (int j = 0; j < i; j++)
				for (int m = 0; m < cfg->caches[j].nlegs; m++)
					if (!strcmp(cfg->caches[j].legs[m], c->legs[k])) {
						fail_at(ps, c->line, "[cache %s] leg %s is also a leg of [cache %s] "
							"(line %d); give each set its own devices", c->name,
							c->legs[k], cfg->caches[j].name, cfg->caches[j].line);
						return -1;
					}
		}
	}
	for (int i = 0; i < cfg->nluns; i++) {
		struct cfg_lun *l = &cfg->luns[i];
		if (!l->cache)
			continue;
		l->cache_set = config_find_cache(cfg, l->cache);
		if (!l->cache_set) {
			fail_at(ps, l->cache_line, "[lun %s] cache = %s: there is no [cache %s] section; add one "
				"or fix the name", l->name, l->cache, l->cache);
			return -1;
		}
	}
	return 0;
}

static int validate(struct parse_state *ps)
{
	struct config *cfg = ps->cfg;

	if (!cfg->state_dir)
		cfg->state_dir = xstrdup(ps, "/var/lib/tiercache");
	if (!cfg->control_socket)
		cfg->control_socket = xstrdup(ps, "/run/tiercache/control.sock");
	if (!cfg->log_level)
		cfg->log_level = xstrdup(ps, "info");
	for (int i = 0; i < cfg->nluns; i++) {
		struct cfg_lun *l = &cfg->luns[i];
		if (!l->backing) {
			fail_at(ps, l->line, "[lun %s] has no backing; add backing = /path/to/file-or-device", l->name);
			return -1;
		}
		if (l->size % l->block_size) {
			fail_at(ps, l->line, "[lun %s] size %llu is not a multiple of block_size %u; round it",
				l->name, (unsigned long long)l->size, l->block_size);
			return -1;
		}
		if (l->backing_buffered && (l->cache || !strncmp(l->backing, "rbd:", 4))) {
			fail_at(ps, l->backing_io_line, "[lun %s] backing_io = buffered is for a file or block "
				"device without a cache set: %s; remove the line", l->name,
				l->cache ? "the cache set is the fast copy, and the page cache under it would only "
					   "double the memory and hide the backing store's errors from the cleaner"
					 : "librbd does its own caching");
			return -1;
		}
		if (!strncmp(l->backing, "rbd:", 4)) {
			if (!valid_rbd_spec(l->backing + 4)) {
				fail_at(ps, l->line, "[lun %s] backing = %s: write an RBD image as rbd:POOL/IMAGE "
					"(names of letters, digits, '.', '_' and '-')", l->name, l->backing);
				return -1;
			}
		} else if (l->ceph_line) {
			fail_at(ps, l->ceph_line, "[lun %s] ceph_conf, ceph_user and ceph_timeout are for "
				"backing = rbd:POOL/IMAGE; remove them or make the backing an RBD image", l->name);
			return -1;
		}
		if (!l->serial)
			l->serial = xstrdup(ps, "auto");
		for (int j = 0; j < i; j++)
			if (!strcmp(cfg->luns[j].backing, l->backing)) {
				fail_at(ps, l->line, "[lun %s] uses backing %s, which [lun %s] (line %d) uses already; "
					"two LUNs on one store would corrupt each other", l->name, l->backing,
					cfg->luns[j].name, cfg->luns[j].line);
				return -1;
			}
	}
	if (validate_caches(ps) < 0)
		return -1;
	if (!cfg->port_group)
		cfg->port_group = 1;
	for (int i = 0; i < cfg->nluns; i++) {
		struct cfg_lun *l = &cfg->luns[i];
		if (!l->gateways)
			l->gateways = 1;
		if (l->gateways == 1)
			continue;
		if (strncmp(l->backing, "rbd:", 4)) {
			fail_at(ps, l->gateways_line, "[lun %s] gateways = %u: only an RBD image can be exported "
				"by several gateways (backing = rbd:POOL/IMAGE); remove gateways or change the "
				"backing", l->name, l->gateways);
			return -1;
		}
		if (!strcmp(l->serial, "auto")) {
			fail_at(ps, l->gateways_line, "[lun %s] gateways = %u with serial = auto: each gateway "
				"would make up its own serial and hosts would see different disks; set serial = "
				"NAME, the same on every gateway", l->name, l->gateways);
			return -1;
		}
		if (l->cache_set && l->cache_set->mode == CACHE_WRITE_BACK) {
			fail_at(ps, l->gateways_line, "[lun %s] gateways = %u with [cache %s] in write-back mode: "
				"the dirty data a dead gateway holds would be stranded on its NVMe while another "
				"serves the image; use mode = write-through (hot reads still come from NVMe)",
				l->name, l->gateways, l->cache_set->name);
			return -1;
		}
		if (cfg->port_group > l->gateways) {
			fail_at(ps, cfg->port_group_line, "[portal] port_group = %u but [lun %s] (line %d) has "
				"gateways = %u; number the gateways 1 to %u", cfg->port_group, l->name, l->line,
				l->gateways, l->gateways);
			return -1;
		}
	}
	for (int i = 0; i < cfg->ntargets; i++) {
		struct cfg_target *t = &cfg->targets[i];
		for (int j = 0; j < t->nluns; j++) {
			t->luns[j].lu = config_find_lun(cfg, t->luns[j].lun_name);
			if (!t->luns[j].lu) {
				fail_at(ps, t->luns[j].line, "lun%llu = %s: there is no [lun %s] section; add one or fix the name",
					(unsigned long long)t->luns[j].lun, t->luns[j].lun_name, t->luns[j].lun_name);
				return -1;
			}
		}
		if (!!t->chap_user != !!t->chap_secret) {
			fail_at(ps, t->line, "[target %s] sets %s without %s; CHAP needs both", t->iqn,
				t->chap_user ? "chap_user" : "chap_secret", t->chap_user ? "chap_secret" : "chap_user");
			return -1;
		}
		if (!!t->mutual_user != !!t->mutual_secret) {
			fail_at(ps, t->line, "[target %s] sets %s without %s; mutual CHAP needs both", t->iqn,
				t->mutual_user ? "mutual_user" : "mutual_secret",
				t->mutual_user ? "mutual_secret" : "mutual_user");
			return -1;
		}
		if (t->mutual_user && !t->chap_user) {
			fail_at(ps, t->line, "[target %s] sets mutual CHAP without one-way CHAP; add chap_user and chap_secret",
				t->iqn);
			return -1;
		}
		if (t->mutual_secret && t->chap_secret && !strcmp(t->mutual_secret, t->chap_secret)) {
			fail_at(ps, t->line, "[target %s]: mutual_secret equals chap_secret; initiators (and RFC 7143) "
				"require the two to differ", t->iqn);
			return -1;
		}
	}
	if (cfg->nlisten == 0) {
		cfg->listen[0].addr = xstrdup(ps, "0.0.0.0");
		cfg->listen[0].port = 3260;
		cfg->nlisten = 1;
	}
	if (cfg->nop_interval == 0 && cfg->nop_timeout == 0) {
		cfg->nop_interval = 30;
		cfg->nop_timeout = 30;
	} else if (cfg->nop_timeout == 0) {
		cfg->nop_timeout = 30;
	}
	return ps->failed ? -1 : 0;
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
			fail_at(ps, 0, "cannot read the file");
		else
			fail_at(ps, r, "cannot parse this line; expected [section] or key = value");
	}
	if (!ps->failed)
		validate(ps);
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
	free(cfg->control_socket);
	free(cfg->log_level);
	free(cfg->path);
	free(cfg);
}
