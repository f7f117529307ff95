/*
 * config_keys.c - the keys of [daemon], [portal], [tcmu] and [target IQN],
 * and the parsers of the values every section shares (sizes, numbers,
 * yes/no, iSCSI names).
 *
 * Each handler takes one key of its section (config.c hands it over),
 * checks its value and stores it, or says with cfg_fail_at what is wrong
 * and what to write instead. Checks that need more than the one line
 * (CHAP pairs, a lunN naming a [lun]) wait for config_validate.c.
 */
#include "config/config_int.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int cfg_parse_bool(const char *v, bool *out)
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

int cfg_parse_uint(const char *v, unsigned long max, unsigned long *out)
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
bool cfg_valid_iscsi_name(const char *n)
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

static int add_address(struct parse_state *ps, const char *key, const char *val, struct cfg_listen *arr, int *n);

int cfg_handle_daemon(struct parse_state *ps, const char *key, const char *val)
{
	struct config *cfg = ps->cfg;
	unsigned long u;

	if (!strcmp(key, "state_dir")) {
		free(cfg->state_dir);
		cfg->state_dir = cfg_xstrdup(ps, val);
	} else if (!strcmp(key, "control_socket")) {
		if (!*val || strlen(val) > 107) {
			cfg_fail_at(ps, ps->line, "[daemon] control_socket must be a path of 1 to 107 characters");
			return 0;
		}
		free(cfg->control_socket);
		cfg->control_socket = cfg_xstrdup(ps, val);
	} else if (!strcmp(key, "workers")) {
		if (cfg_parse_uint(val, 256, &u)) {
			cfg_fail_at(ps, ps->line, "[daemon] workers = %s: give a number of threads from 0 (one per core) to 256", val);
			return 0;
		}
		cfg->workers = (unsigned)u;
	} else if (!strcmp(key, "poll_us")) {
		if (cfg_parse_uint(val, 1000, &u)) {
			cfg_fail_at(ps, ps->line, "[daemon] poll_us = %s: give microseconds from 0 (never poll) to 1000", val);
			return 0;
		}
		cfg->poll_us = (unsigned)u;
	} else if (!strcmp(key, "log_level")) {
		if (strcmp(val, "error") && strcmp(val, "warning") && strcmp(val, "info") && strcmp(val, "debug")) {
			cfg_fail_at(ps, ps->line, "[daemon] log_level = %s: use error, warning, info or debug", val);
			return 0;
		}
		free(cfg->log_level);
		cfg->log_level = cfg_xstrdup(ps, val);
	} else if (!strcmp(key, "nop_interval") || !strcmp(key, "nop_timeout")) {
		if (cfg_parse_uint(val, 3600, &u)) {
			cfg_fail_at(ps, ps->line, "[daemon] %s = %s: give seconds from 0 to 3600", key, val);
			return 0;
		}
		if (!strcmp(key, "nop_interval")) {
			cfg->nop_interval = (unsigned)u;
			cfg->nop_interval_set = true;
		}
		else
			cfg->nop_timeout = (unsigned)u;
	} else if (!strcmp(key, "metrics")) {
		/* the port is not optional here: 3260 (the portal's default) would be wrong */
		const char *close = val[0] == '[' ? strchr(val, ']') : val;
		if (!close || !strchr(close, ':')) {
			cfg_fail_at(ps, ps->line, "[daemon] metrics = %s: give ADDRESS:PORT, e.g. 127.0.0.1:9642", val);
			return 0;
		}
		return add_address(ps, "[daemon] metrics", val, cfg->metrics, &cfg->nmetrics);
	} else if (!strcmp(key, "space_interval")) {
		if (cfg_parse_uint(val, 3600, &u) || u == 0) {
			cfg_fail_at(ps, ps->line, "[daemon] space_interval = %s: give seconds from 1 to 3600", val);
			return 0;
		}
		cfg->space_interval = (unsigned)u;
	} else {
		cfg_fail_at(ps, ps->line,
			"[daemon] has no key \"%s\"; known keys: state_dir, control_socket, workers, poll_us, "
			"log_level, metrics, nop_interval, nop_timeout, space_interval",
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
		cfg_fail_at(ps, ps->line, "more than %d %s lines; remove some", CFG_MAX_LISTEN, key);
		return 0;
	}
	char host[256];
	const char *port_s;
	if (val[0] == '[') {
		const char *close = strchr(val, ']');
		if (!close || (size_t)(close - val - 1) >= sizeof(host)) {
			cfg_fail_at(ps, ps->line, "%s = %s: an IPv6 address is written [ADDRESS]:PORT, e.g. [::1]:3260", key, val);
			return 0;
		}
		memcpy(host, val + 1, close - val - 1);
		host[close - val - 1] = '\0';
		port_s = close[1] == ':' ? close + 2 : (close[1] ? NULL : "3260");
	} else {
		const char *colon = strrchr(val, ':');
		if (colon && strchr(val, ':') != colon) {
			cfg_fail_at(ps, ps->line, "%s = %s: write an IPv6 address in brackets, e.g. [%s]:3260", key, val, val);
			return 0;
		}
		size_t hl = colon ? (size_t)(colon - val) : strlen(val);
		if (hl == 0 || hl >= sizeof(host)) {
			cfg_fail_at(ps, ps->line, "%s = %s: give ADDRESS:PORT, e.g. 127.0.0.1:3260 or 0.0.0.0:3260", key, val);
			return 0;
		}
		memcpy(host, val, hl);
		host[hl] = '\0';
		port_s = colon ? colon + 1 : "3260";
	}
	unsigned long port;
	if (!port_s || cfg_parse_uint(port_s, 65535, &port) || port == 0) {
		cfg_fail_at(ps, ps->line, "%s = %s: the port must be a number from 1 to 65535", key, val);
		return 0;
	}
	for (int i = 0; i < *n; i++)
		if (!strcmp(arr[i].addr, host) && arr[i].port == port) {
			cfg_fail_at(ps, ps->line, "%s = %s repeats line %d; remove one", key, val, arr[i].line);
			return 0;
		}
	struct cfg_listen *l = &arr[(*n)++];
	l->addr = cfg_xstrdup(ps, host);
	l->port = (uint16_t)port;
	l->line = ps->line;
	return 1;
}

static int check_secret(struct parse_state *ps, const char *key, const char *val);

int cfg_handle_portal(struct parse_state *ps, const char *key, const char *val)
{
	if (!strcmp(key, "port_group")) {
		unsigned long u;
		if (cfg_parse_uint(val, CFG_MAX_GATEWAYS, &u) || u == 0) {
			cfg_fail_at(ps, ps->line, "[portal] port_group = %s: give this gateway's number, 1 to %d "
				"(each gateway of a shared LUN its own)", val, CFG_MAX_GATEWAYS);
			return 0;
		}
		ps->cfg->port_group = (unsigned)u;
		ps->cfg->port_group_line = ps->line;
		return 1;
	}
	char **disc = !strcmp(key, "discovery_chap_user")     ? &ps->cfg->disc_chap_user
		      : !strcmp(key, "discovery_chap_secret")   ? &ps->cfg->disc_chap_secret
		      : !strcmp(key, "discovery_mutual_user")   ? &ps->cfg->disc_mutual_user
		      : !strcmp(key, "discovery_mutual_secret") ? &ps->cfg->disc_mutual_secret
								: NULL;
	if (disc) {
		if (strstr(key, "secret") && !check_secret(ps, key, val))
			return 0;
		free(*disc);
		*disc = cfg_xstrdup(ps, val);
		ps->cfg->disc_chap_line = ps->line;
		return 1;
	}
	if (strcmp(key, "listen")) {
		cfg_fail_at(ps, ps->line, "[portal] has no key \"%s\"; the portal takes listen = ADDRESS:PORT "
			"lines, port_group = N and discovery_chap_user, discovery_chap_secret, discovery_mutual_user, "
			"discovery_mutual_secret", key);
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
		cfg_fail_at(ps, ps->line,
			"%s is %zu characters long; CHAP secrets must be 12 to 16 characters "
			"(RFC 7143 and the Windows initiator require it)", key, n);
		return 0;
	}
	return 1;
}

/* [tcmu]: the LIO front end (target/tcmu). */
int cfg_handle_tcmu(struct parse_state *ps, const char *key, const char *val)
{
	bool *dst;
	if (!strcmp(key, "portal"))
		return add_address(ps, "portal", val, ps->cfg->tcmu_portal, &ps->cfg->ntcmu_portal);
	if (!strcmp(key, "enable")) {
		dst = &ps->cfg->tcmu_enable;
	} else if (!strcmp(key, "dbus")) {
		dst = &ps->cfg->tcmu_dbus;
	} else {
		cfg_fail_at(ps, ps->line, "[tcmu] has no key \"%s\"; known keys: enable, dbus, portal", key);
		return 0;
	}
	if (cfg_parse_bool(val, dst)) {
		cfg_fail_at(ps, ps->line, "[tcmu] %s = %s: use yes or no", key, val);
		return 0;
	}
	return 1;
}

int cfg_handle_target(struct parse_state *ps, const char *key, const char *val)
{
	struct cfg_target *t = &ps->cfg->targets[ps->cfg->ntargets - 1];

	if (!strncmp(key, "lun", 3) && isdigit((unsigned char)key[3])) {
		unsigned long n;
		if (cfg_parse_uint(key + 3, 16383, &n)) {
			cfg_fail_at(ps, ps->line, "%s: LUN numbers go from lun0 to lun16383", key);
			return 0;
		}
		if (t->nluns >= CFG_MAX_LUNS_PER_TARGET) {
			cfg_fail_at(ps, ps->line, "[target %s] maps more than %d LUNs; split it into several targets",
				t->iqn, CFG_MAX_LUNS_PER_TARGET);
			return 0;
		}
		for (int i = 0; i < t->nluns; i++)
			if (t->luns[i].lun == n) {
				cfg_fail_at(ps, ps->line, "%s is mapped twice in [target %s] (also line %d); use another number",
					key, t->iqn, t->luns[i].line);
				return 0;
			}
		struct cfg_target_lun *m = &t->luns[t->nluns++];
		m->lun = n;
		m->lun_name = cfg_xstrdup(ps, val);
		m->line = ps->line;
	} else if (!strcmp(key, "allow")) {
		char buf[4096];
		snprintf(buf, sizeof(buf), "%s", val);
		for (char *save = NULL, *tok = strtok_r(buf, " \t,", &save); tok; tok = strtok_r(NULL, " \t,", &save)) {
			if (!cfg_valid_iscsi_name(tok)) {
				cfg_fail_at(ps, ps->line, "allow: \"%s\" is not a valid initiator name (iqn.YYYY-MM.domain:name, lower case)", tok);
				return 0;
			}
			if (t->nallow >= CFG_MAX_ALLOW) {
				cfg_fail_at(ps, ps->line, "allow lists more than %d initiators; split the target", CFG_MAX_ALLOW);
				return 0;
			}
			t->allow[t->nallow++] = cfg_xstrdup(ps, tok);
		}
	} else if (!strcmp(key, "chap_user") || !strcmp(key, "mutual_user")) {
		if (!*val || strlen(val) > 255) {
			cfg_fail_at(ps, ps->line, "%s must be 1 to 255 characters", key);
			return 0;
		}
		char **dst = !strcmp(key, "chap_user") ? &t->chap_user : &t->mutual_user;
		free(*dst);
		*dst = cfg_xstrdup(ps, val);
	} else if (!strcmp(key, "chap_secret") || !strcmp(key, "mutual_secret")) {
		if (!check_secret(ps, key, val))
			return 0;
		char **dst = !strcmp(key, "chap_secret") ? &t->chap_secret : &t->mutual_secret;
		free(*dst);
		*dst = cfg_xstrdup(ps, val);
	} else {
		cfg_fail_at(ps, ps->line,
			"[target %s] has no key \"%s\"; known keys: lunN, allow, chap_user, chap_secret, "
			"mutual_user, mutual_secret", t->iqn, key);
		return 0;
	}
	return 1;
}
