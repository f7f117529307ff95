/*
 * config_validate.c - the checks that need the whole file, and the
 * defaults of what it left out.
 *
 * Run once every line is read (config.c): every [lun] has a backing store
 * of its own, cache = and lunN = name sections that exist, cache legs are
 * nobody else's, several gateways only over an RBD image with a fixed
 * serial, CHAP settings come in pairs. Each message names the line to fix.
 */
#include "config/config_int.h"

#include "cache/cache.h"

#include <ctype.h>
#include <string.h>

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

static int validate_caches(struct parse_state *ps)
{
	struct config *cfg = ps->cfg;

	for (int i = 0; i < cfg->ncaches; i++) {
		struct cfg_cache *c = &cfg->caches[i];
		if (c->nlegs == 0) {
			cfg_fail_at(ps, c->line, "[cache %s] has no legs; add legs = /dev/nvme0n1 /dev/nvme1n1 (two "
				"devices or files, mirrored)", c->name);
			return -1;
		}
		if (c->nlegs == 1 && !c->allow_single_leg) {
			cfg_fail_at(ps, c->line, "[cache %s] has one leg; with a single device, data in the cache "
				"(dirty data in write-back mode) is lost when it dies: add a second leg, or set "
				"allow_single_leg = yes to accept that", c->name);
			return -1;
		}
		for (int k = 0; k < c->nlegs; k++) {
			for (int j = 0; j < cfg->nluns; j++)
				if (!strcmp(cfg->luns[j].backing, c->legs[k])) {
					cfg_fail_at(ps, c->line, "[cache %s] leg %s is the backing store of [lun %s]; "
						"a cache leg needs a device of its own", c->name, c->legs[k],
						cfg->luns[j].name);
					return -1;
				}
			for (int j = 0; j < i; j++)
				for (int m = 0; m < cfg->caches[j].nlegs; m++)
					if (!strcmp(cfg->caches[j].legs[m], c->legs[k])) {
						cfg_fail_at(ps, c->line, "[cache %s] leg %s is also a leg of [cache %s] "
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
			cfg_fail_at(ps, l->cache_line, "[lun %s] cache = %s: there is no [cache %s] section; add one "
				"or fix the name", l->name, l->cache, l->cache);
			return -1;
		}
	}
	return 0;
}

/* The CHAP keys of a [target] (prefix "") or of [portal]'s discovery
 * ("discovery_"): in pairs, mutual only with one-way, the two secrets
 * different. 0 or -1 (reported). */
static int check_chap_keys(struct parse_state *ps, int line, const char *where, const char *pfx, const char *cu,
			   const char *cs, const char *mu, const char *ms)
{
	if (!!cu != !!cs) {
		cfg_fail_at(ps, line, "%s sets %s%s without %s%s; CHAP needs both", where, pfx,
			    cu ? "chap_user" : "chap_secret", pfx, cu ? "chap_secret" : "chap_user");
		return -1;
	}
	if (!!mu != !!ms) {
		cfg_fail_at(ps, line, "%s sets %s%s without %s%s; mutual CHAP needs both", where, pfx,
			    mu ? "mutual_user" : "mutual_secret", pfx, mu ? "mutual_secret" : "mutual_user");
		return -1;
	}
	if (mu && !cu) {
		cfg_fail_at(ps, line, "%s sets mutual CHAP without one-way CHAP; add %schap_user and %schap_secret",
			    where, pfx, pfx);
		return -1;
	}
	if (ms && cs && !strcmp(ms, cs)) {
		cfg_fail_at(ps, line, "%s: %smutual_secret equals %schap_secret; initiators (and RFC 7143) "
			    "require the two to differ", where, pfx, pfx);
		return -1;
	}
	return 0;
}

int cfg_validate(struct parse_state *ps)
{
	struct config *cfg = ps->cfg;

	if (!cfg->state_dir)
		cfg->state_dir = cfg_xstrdup(ps, "/var/lib/tiercache");
	if (!cfg->control_socket)
		cfg->control_socket = cfg_xstrdup(ps, "/run/tiercache/control.sock");
	if (!cfg->log_level)
		cfg->log_level = cfg_xstrdup(ps, "info");
	for (int i = 0; i < cfg->nluns; i++) {
		struct cfg_lun *l = &cfg->luns[i];
		if (!l->backing) {
			cfg_fail_at(ps, l->line, "[lun %s] has no backing; add backing = /path/to/file-or-device", l->name);
			return -1;
		}
		if (l->size % l->block_size) {
			cfg_fail_at(ps, l->line, "[lun %s] size %llu is not a multiple of block_size %u; round it",
				l->name, (unsigned long long)l->size, l->block_size);
			return -1;
		}
		if (l->backing_buffered && (l->cache || !strncmp(l->backing, "rbd:", 4))) {
			cfg_fail_at(ps, l->backing_io_line, "[lun %s] backing_io = buffered is for a file or block "
				"device without a cache set: %s; remove the line", l->name,
				l->cache ? "the cache set is the fast copy, and the page cache under it would only "
					   "double the memory and hide the backing store's errors from the cleaner"
					 : "librbd does its own caching");
			return -1;
		}
		if (!strncmp(l->backing, "rbd:", 4)) {
			if (!valid_rbd_spec(l->backing + 4)) {
				cfg_fail_at(ps, l->line, "[lun %s] backing = %s: write an RBD image as rbd:POOL/IMAGE "
					"(names of letters, digits, '.', '_' and '-')", l->name, l->backing);
				return -1;
			}
		} else if (l->ceph_line) {
			cfg_fail_at(ps, l->ceph_line, "[lun %s] ceph_conf, ceph_user and ceph_timeout are for "
				"backing = rbd:POOL/IMAGE; remove them or make the backing an RBD image", l->name);
			return -1;
		}
		if (!l->serial)
			l->serial = cfg_xstrdup(ps, "auto");
		for (int j = 0; j < i; j++)
			if (!strcmp(cfg->luns[j].backing, l->backing)) {
				cfg_fail_at(ps, l->line, "[lun %s] uses backing %s, which [lun %s] (line %d) uses already; "
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
			cfg_fail_at(ps, l->gateways_line, "[lun %s] gateways = %u: only an RBD image can be exported "
				"by several gateways (backing = rbd:POOL/IMAGE); remove gateways or change the "
				"backing", l->name, l->gateways);
			return -1;
		}
		if (!strcmp(l->serial, "auto")) {
			cfg_fail_at(ps, l->gateways_line, "[lun %s] gateways = %u with serial = auto: each gateway "
				"would make up its own serial and hosts would see different disks; set serial = "
				"NAME, the same on every gateway", l->name, l->gateways);
			return -1;
		}
		if (l->cache_set && l->cache_set->mode == CACHE_WRITE_BACK) {
			cfg_fail_at(ps, l->gateways_line, "[lun %s] gateways = %u with [cache %s] in write-back mode: "
				"the dirty data a dead gateway holds would be stranded on its NVMe while another "
				"serves the image; use mode = write-through (hot reads still come from NVMe)",
				l->name, l->gateways, l->cache_set->name);
			return -1;
		}
		if (cfg->port_group > l->gateways) {
			cfg_fail_at(ps, cfg->port_group_line, "[portal] port_group = %u but [lun %s] (line %d) has "
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
				cfg_fail_at(ps, t->luns[j].line, "lun%llu = %s: there is no [lun %s] section; add one or fix the name",
					(unsigned long long)t->luns[j].lun, t->luns[j].lun_name, t->luns[j].lun_name);
				return -1;
			}
		}
		char where[300];
		snprintf(where, sizeof(where), "[target %s]", t->iqn);
		if (check_chap_keys(ps, t->line, where, "", t->chap_user, t->chap_secret, t->mutual_user,
				    t->mutual_secret) < 0)
			return -1;
	}
	if (check_chap_keys(ps, cfg->disc_chap_line, "[portal]", "discovery_", cfg->disc_chap_user,
			    cfg->disc_chap_secret, cfg->disc_mutual_user, cfg->disc_mutual_secret) < 0)
		return -1;
	if (cfg->nlisten == 0) {
		cfg->listen[0].addr = cfg_xstrdup(ps, "0.0.0.0");
		cfg->listen[0].port = 3260;
		cfg->nlisten = 1;
	}
	/* nop_interval = 0 turns the pings off; without the key they go every 30 s */
	if (!cfg->nop_interval_set)
		cfg->nop_interval = 30;
	if (!cfg->space_interval)
		cfg->space_interval = 10;
	if (cfg->nop_timeout == 0)
		cfg->nop_timeout = 30;
	return ps->failed ? -1 : 0;
}
