/*
 * config_lun.c - the keys of [lun NAME] (what a LUN is served from and
 * how) and of [cache NAME] (the mirrored NVMe set in front of it).
 *
 * As in config_keys.c, each handler takes one key and checks its value on
 * its own; a cache = naming no [cache], a leg that is also a backing store,
 * or an rbd: backing that is malformed are for config_validate.c.
 */
#include "config/config_int.h"

#include "cache/cache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* "off" (0), or 1..max with an optional unit suffix ('%', 's'): 0 or -1. */
static int parse_off_or_uint(const char *val, char suffix, unsigned long max, unsigned long *out)
{
	char num[16];
	size_t n = strlen(val);
	*out = 0;
	if (!strcmp(val, "off"))
		return 0;
	if (!n || n >= sizeof(num))
		return -1;
	memcpy(num, val, n + 1);
	if (num[n - 1] == suffix)
		num[n - 1] = 0;
	return !cfg_parse_uint(num, max, out) && *out > 0 ? 0 : -1;
}

int cfg_handle_lun(struct parse_state *ps, const char *key, const char *val)
{
	struct cfg_lun *l = &ps->cfg->luns[ps->cfg->nluns - 1];

	if (!strcmp(key, "backing")) {
		if (!*val) {
			cfg_fail_at(ps, ps->line, "[lun %s] backing is empty; give a file or block device path", l->name);
			return 0;
		}
		free(l->backing);
		l->backing = cfg_xstrdup(ps, val);
	} else if (!strcmp(key, "size")) {
		if (config_parse_size(val, &l->size) || l->size == 0) {
			cfg_fail_at(ps, ps->line, "[lun %s] size = %s: write a size like 1G, 500M or 2T", l->name, val);
			return 0;
		}
	} else if (!strcmp(key, "block_size")) {
		if (strcmp(val, "512") && strcmp(val, "4096")) {
			cfg_fail_at(ps, ps->line, "[lun %s] block_size = %s: use 512 or 4096", l->name, val);
			return 0;
		}
		l->block_size = (uint32_t)atoi(val);
	} else if (!strcmp(key, "serial")) {
		size_t n = strlen(val);
		bool ok = n >= 1 && n <= 32;
		for (size_t i = 0; ok && i < n; i++)
			ok = val[i] > 0x20 && val[i] < 0x7f;
		if (!ok) {
			cfg_fail_at(ps, ps->line,
				"[lun %s] serial = %s: use auto, or 1 to 32 printable ASCII characters without spaces",
				l->name, val);
			return 0;
		}
		free(l->serial);
		l->serial = cfg_xstrdup(ps, val);
	} else if (!strcmp(key, "write_cache") || !strcmp(key, "read_only")) {
		bool b;
		if (cfg_parse_bool(val, &b)) {
			cfg_fail_at(ps, ps->line, "[lun %s] %s = %s: use yes or no", l->name, key, val);
			return 0;
		}
		if (!strcmp(key, "write_cache"))
			l->write_cache = b;
		else
			l->read_only = b;
	} else if (!strcmp(key, "backing_io")) {
		if (strcmp(val, "direct") && strcmp(val, "buffered")) {
			cfg_fail_at(ps, ps->line, "[lun %s] backing_io = %s: use direct (O_DIRECT, the default) or "
				"buffered (through the page cache)", l->name, val);
			return 0;
		}
		l->backing_buffered = !strcmp(val, "buffered");
		l->backing_io_line = ps->line;
	} else if (!strcmp(key, "cache")) {
		if (!*val) {
			cfg_fail_at(ps, ps->line, "[lun %s] cache is empty; name a [cache NAME] section", l->name);
			return 0;
		}
		free(l->cache);
		l->cache = cfg_xstrdup(ps, val);
		l->cache_line = ps->line;
	} else if (!strcmp(key, "ceph_conf") || !strcmp(key, "ceph_user")) {
		const char *v = val;
		if (!strcmp(key, "ceph_user") && !strncmp(v, "client.", 7))
			v += 7; /* librados wants the id; accept the full name too */
		bool ok = *v != 0;
		for (const char *c = v; ok && *c; c++)
			ok = *c > 0x20 && *c < 0x7f;
		if (!ok) {
			cfg_fail_at(ps, ps->line, "[lun %s] %s = %s: give %s", l->name, key, val,
				!strcmp(key, "ceph_conf") ? "the path of a ceph.conf (without spaces)"
							  : "a cephx user name like admin or client.iscsi");
			return 0;
		}
		char **dst = !strcmp(key, "ceph_conf") ? &l->ceph_conf : &l->ceph_user;
		free(*dst);
		*dst = cfg_xstrdup(ps, v);
		if (!l->ceph_line)
			l->ceph_line = ps->line;
	} else if (!strcmp(key, "ceph_timeout")) {
		unsigned long u;
		if (cfg_parse_uint(val, 3600, &u) || u == 0) {
			cfg_fail_at(ps, ps->line, "[lun %s] ceph_timeout = %s: give seconds, 1 to 3600 (default 30)",
				l->name, val);
			return 0;
		}
		l->ceph_timeout = (unsigned)u;
		if (!l->ceph_line)
			l->ceph_line = ps->line;
	} else if (!strcmp(key, "gateways")) {
		unsigned long u;
		if (cfg_parse_uint(val, CFG_MAX_GATEWAYS, &u) || u == 0) {
			cfg_fail_at(ps, ps->line, "[lun %s] gateways = %s: give how many gateways export this LUN, "
				"1 to %d (default 1)", l->name, val, CFG_MAX_GATEWAYS);
			return 0;
		}
		l->gateways = (unsigned)u;
		l->gateways_line = ps->line;
	} else if (!strcmp(key, "space_warn")) {
		unsigned long u = 0;
		if (parse_off_or_uint(val, '%', 99, &u)) {
			cfg_fail_at(ps, ps->line, "[lun %s] space_warn = %s: give the percentage of space used at "
				"which hosts are warned, 1%% to 99%% (e.g. 90%%), or off", l->name, val);
			return 0;
		}
		l->space_warn = (unsigned)u;
	} else if (!strcmp(key, "io_timeout")) {
		unsigned long u = 0;
		if (parse_off_or_uint(val, 's', 3600, &u)) {
			cfg_fail_at(ps, ps->line, "[lun %s] io_timeout = %s: give the seconds a command may wait on the "
				"backing store before the host is told it failed, 1 to 3600 (default 30), or off",
				l->name, val);
			return 0;
		}
		l->io_timeout = (unsigned)u;
	} else {
		cfg_fail_at(ps, ps->line,
			"[lun %s] has no key \"%s\"; known keys: backing, size, block_size, serial, write_cache, "
			"read_only, backing_io, cache, ceph_conf, ceph_user, ceph_timeout, gateways, space_warn, io_timeout",
			l->name, key);
		return 0;
	}
	return 1;
}

int cfg_handle_cache(struct parse_state *ps, const char *key, const char *val)
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
				cfg_fail_at(ps, ps->line, "[cache %s] legs lists more than two devices; a set is a mirror "
					"of two legs", c->name);
				return 0;
			}
			c->legs[c->nlegs++] = cfg_xstrdup(ps, tok);
		}
		if (c->nlegs == 2 && !strcmp(c->legs[0], c->legs[1])) {
			cfg_fail_at(ps, ps->line, "[cache %s] legs lists %s twice; the mirror needs two different devices",
				c->name, c->legs[0]);
			return 0;
		}
	} else if (!strcmp(key, "allow_single_leg")) {
		if (cfg_parse_bool(val, &c->allow_single_leg)) {
			cfg_fail_at(ps, ps->line, "[cache %s] allow_single_leg = %s: use yes or no", c->name, val);
			return 0;
		}
	} else if (!strcmp(key, "size")) {
		if (config_parse_size(val, &c->size) || c->size < (16u << 20)) {
			cfg_fail_at(ps, ps->line, "[cache %s] size = %s: write a size of at least 16M, like 256M or 800G",
				c->name, val);
			return 0;
		}
	} else if (!strcmp(key, "extent")) {
		if (config_parse_size(val, &sz) || sz < (64u << 10) || sz > (4u << 20) || (sz & (sz - 1))) {
			cfg_fail_at(ps, ps->line, "[cache %s] extent = %s: use a power of two from 64K to 4M "
				"(256K is the default)", c->name, val);
			return 0;
		}
		c->extent = (uint32_t)sz;
	} else if (!strcmp(key, "mode")) {
		enum cache_mode m;
		if (cache_mode_parse(val, &m)) {
			cfg_fail_at(ps, ps->line, "[cache %s] mode = %s: use write-back, write-through, write-around "
				"or pass-through", c->name, val);
			return 0;
		}
		c->mode = (int)m;
	} else if (!strcmp(key, "admit_hits")) {
		if (cfg_parse_uint(val, 1000, &u) || u == 0) {
			cfg_fail_at(ps, ps->line, "[cache %s] admit_hits = %s: give the number of misses before an "
				"extent is promoted, 1 to 1000", c->name, val);
			return 0;
		}
		c->admit_hits = (uint32_t)u;
	} else if (!strcmp(key, "seq_cutoff")) {
		if (config_parse_size(val, &c->seq_cutoff)) {
			cfg_fail_at(ps, ps->line, "[cache %s] seq_cutoff = %s: write a size like 4M, or 0 to cache "
				"sequential streams too", c->name, val);
			return 0;
		}
	} else if (!strcmp(key, "dirty_target")) {
		if (cfg_parse_uint(val, 90, &u) || u == 0) {
			cfg_fail_at(ps, ps->line, "[cache %s] dirty_target = %s: give a percentage from 1 to 90",
				c->name, val);
			return 0;
		}
		c->dirty_target = (uint32_t)u;
	} else if (!strcmp(key, "destage_max")) {
		if (config_parse_size(val, &c->destage_max) || (c->destage_max && c->destage_max < (64u << 10))) {
			cfg_fail_at(ps, ps->line, "[cache %s] destage_max = %s: give bytes per second, at least 64K "
				"(like 50M), or 0 for no cap", c->name, val);
			return 0;
		}
	} else if (!strcmp(key, "destage_max_iops")) {
		if (cfg_parse_uint(val, 10000000, &u)) {
			cfg_fail_at(ps, ps->line, "[cache %s] destage_max_iops = %s: give backing writes per second, "
				"or 0 for no cap", c->name, val);
			return 0;
		}
		c->destage_max_iops = (uint32_t)u;
	} else if (!strcmp(key, "leg_timeout")) {
		const char *v = val;
		size_t n = strlen(v);
		char num[32];
		if (n && n < sizeof(num) && v[n - 1] == 's') { /* "10s" as well as "10" */
			memcpy(num, v, n - 1);
			num[n - 1] = 0;
			v = num;
		}
		if (cfg_parse_uint(v, 3600, &u)) {
			cfg_fail_at(ps, ps->line, "[cache %s] leg_timeout = %s: give the seconds a leg may take to "
				"answer before it is failed, 1 to 3600, or 0 to wait for the device however long "
				"(default 10)", c->name, val);
			return 0;
		}
		c->leg_timeout = (unsigned)u;
	} else if (!strcmp(key, "max_read_errors")) {
		if (cfg_parse_uint(val, 1000000, &u)) {
			cfg_fail_at(ps, ps->line, "[cache %s] max_read_errors = %s: give how many unreadable ranges a leg may "
				"have rewritten within an hour before it is failed, 1 to 1000000, or 0 for no limit "
				"(default 50)", c->name, val);
			return 0;
		}
		c->max_read_errors = (uint32_t)u;
	} else if (!strcmp(key, "fault_injection")) {
		if (cfg_parse_bool(val, &c->fault_injection)) {
			cfg_fail_at(ps, ps->line, "[cache %s] fault_injection = %s: use yes or no (yes is for tests: "
				"it lets tierctl leg fault fail the legs)", c->name, val);
			return 0;
		}
	} else {
		cfg_fail_at(ps, ps->line,
			"[cache %s] has no key \"%s\"; known keys: legs, allow_single_leg, size, extent, mode, "
			"admit_hits, seq_cutoff, dirty_target, destage_max, destage_max_iops, leg_timeout, "
			"max_read_errors", c->name, key);
		return 0;
	}
	return 1;
}
