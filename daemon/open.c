/*
 * open.c - putting a configuration into service, the part that startup
 * (main.c), a reload (reload.c) and tierctl leg replace (ctl_cache.c)
 * share: open a [lun]'s logical unit over its backing store and cache
 * volume, put that volume under the torn-write guard when a leg may tear
 * a block, turn a [target] into the portal's entry, read log_level.
 *
 * It calls nothing else of daemon/: the files above call into it, never
 * the other way, so main.c is called by no one. Main thread, except
 * daemon_guard_torn (also the control thread).
 */
#include "daemon/daemon.h"

#include "backstore/scsi.h"
#include "bdev/backing.h"
#include "cache/cache.h"
#include "cache/nvme_health.h"
#include "common/log.h"
#include "config/config.h"

#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

struct iscsi_target_cfg daemon_portal_target(const struct cfg_target *t, struct scsi_target *s)
{
	return (struct iscsi_target_cfg){
		.iqn = t->iqn,
		.scsi = s,
		.allow = (const char *const *)t->allow,
		.nallow = t->nallow,
		.chap_user = t->chap_user,
		.chap_secret = t->chap_secret,
		.mutual_user = t->mutual_user,
		.mutual_secret = t->mutual_secret,
	};
}

enum log_level daemon_parse_level(const char *s)
{
	if (!strcmp(s, "error"))
		return LOG_LVL_ERR;
	if (!strcmp(s, "warning"))
		return LOG_LVL_WARN;
	if (!strcmp(s, "debug"))
		return LOG_LVL_DEBUG;
	return LOG_LVL_INFO;
}

/*
 * The bdev under an LU changed size (bdev_set_resize_listener; the driver's
 * thread): the LU takes the new block count and every I_T nexus gets the
 * CAPACITY DATA HAS CHANGED unit attention (SBC-3 4.6).
 */
static void lun_capacity_changed(void *arg, uint64_t size)
{
	scsi_lu_set_capacity(arg, size);
}

/*
 * A LUN whose blocks are larger than what a leg writes atomically across a
 * power failure (or than what it is known to: a file, or a drive that does
 * not say): a cut during an overwrite in place could leave a block part
 * old, part new. Turn on the cache's torn-write guard (overwrites of dirty
 * data go through the set's block log first); a set made before the block
 * log cannot, so say what to do.
 */
void daemon_guard_torn(const struct cfg_cache *cc, const struct cfg_lun *l, struct bdev *vol,
		       char *const *legs, int nlegs)
{
	if (l->block_size <= 512)
		return; /* a sector is written whole */
	unsigned smallest = 0;
	const char *leg = NULL;
	char kind[sizeof(((struct nvme_health *)0)->kind)] = "";
	for (int k = 0; k < nlegs; k++) {
		struct nvme_health h;
		unsigned unit = nvme_health_read(legs[k], &h) < 0 ? 0 : h.atomic_write_bytes;
		if (unit >= l->block_size)
			continue;
		if (!leg || unit < smallest) {
			smallest = unit;
			leg = legs[k];
			snprintf(kind, sizeof(kind), "%s", unit ? h.kind : "its atomic write unit not known");
		}
	}
	if (!leg)
		return;
	bool wb = (enum cache_mode)cc->mode == CACHE_WRITE_BACK;
	char unit[32];
	if (smallest)
		snprintf(unit, sizeof(unit), "%u bytes", smallest);
	else
		snprintf(unit, sizeof(unit), "an unknown size");
	if (cache_vol_guard_torn(vol, true)) {
		if (wb)
			log_info("[lun %s]: %u-byte blocks; cache leg %s (%s) writes %s atomically: overwrites of dirty "
				 "data go through the block log first, so a power cut never leaves a block part old, part "
				 "new", l->name, l->block_size, leg, kind, unit);
		return;
	}
	log_warn("[lun %s]: %u-byte blocks, but cache leg %s (%s) writes %s atomically across a power failure, "
		 "and cache %s was made before the block log (format version 2): a power cut during an overwrite "
		 "of dirty data can leave a block part old, part new; flush the cache and re-create its legs, "
		 "format the legs with %u-byte sectors (nvme format --lbaf), or give the LUN 512-byte blocks",
		 l->name, l->block_size, leg, kind, unit, cc->name, l->block_size);
}

/*
 * Open the LU of [lun] l (its serial, backing store, cache volume on a set
 * already running, and the logical unit). cfg is the configuration in
 * effect: its state_dir, and its [cache] sections, parallel to sets (on a
 * reload, l belongs to the new file). 0, or -1 after logging why.
 */
int daemon_open_lun(const struct config *cfg, const struct cfg_lun *l, struct cache_set **sets,
			char serial[33], struct scsi_lu **lu_out, struct bdev **vol_out)
{
	char err[512];
	const struct cfg_cache *cc = l->cache ? config_find_cache(cfg, l->cache) : NULL;

	*lu_out = NULL;
	*vol_out = NULL;
	if (l->cache && (!cc || !sets[cc - cfg->caches])) {
		log_err("%s:%d: [lun %s]: cache %s is not a running cache set; adding a [cache] section "
			"needs a restart", cfg->path, l->cache_line, l->name, l->cache);
		return -1;
	}
	if (config_lun_serial(cfg, l, true, serial) < 0) {
		log_err("%s:%d: [lun %s]: cannot keep its serial number in %s: %s; "
			"make state_dir writable", cfg->path, l->line, l->name, cfg->state_dir,
			strerror(errno));
		return -1;
	}
	const struct bdev_rbd_opts rbd = {
		.conf = l->ceph_conf, .user = l->ceph_user, .op_timeout_s = l->ceph_timeout,
	};
	bool is_rbd = bdev_backing_is_rbd(l->backing);
	struct bdev *dev = l->backing_buffered
		? bdev_file_open_flags(l->backing, l->size, l->block_size, true, BDEV_FILE_BUFFERED, err,
				       sizeof(err))
		: bdev_open_backing(l->backing, &rbd, l->size, l->block_size, true, err, sizeof(err));
	if (!dev) {
		log_err("%s:%d: [lun %s]: %s", cfg->path, l->line, l->name, err);
		return -1;
	}
	/* an RBD image's lock: taken at open by a single gateway (the lock work
	 * takes it; the daemon waits for that before it listens), on hosts' I/O
	 * by several */
	if (is_rbd)
		bdev_rbd_set_gateway(dev, l->gateways, cfg->port_group, NULL);
	if (cc) {
		/* an RBD image has no path to stat: the cache knows it by name */
		struct bdev *vol = cache_vol_open(sets[cc - cfg->caches], l->name, dev,
						  is_rbd ? NULL : l->backing,
						  (enum cache_mode)cc->mode, err, sizeof(err));
		if (!vol) {
			log_err("%s:%d: [lun %s]: %s", cfg->path, l->cache_line, l->name, err);
			bdev_close(dev);
			return -1;
		}
		dev = vol;
		*vol_out = vol;
		daemon_guard_torn(cc, l, vol, cc->legs, cc->nlegs);
		/* which generation of the image our cached copies belong to */
		char gen_path[PATH_MAX];
		snprintf(gen_path, sizeof(gen_path), "%s/%s.owner-gen", cfg->state_dir, l->name);
		if (cache_vol_owner_track(vol, gen_path, err, sizeof(err)) < 0) {
			log_err("%s:%d: [lun %s]: %s", cfg->path, l->cache_line, l->name, err);
			bdev_close(vol);
			*vol_out = NULL;
			return -1;
		}
	}
	struct scsi_lu_config lc = {
		.name = l->name,
		.serial = serial,
		.state_dir = cfg->state_dir,
		.block_size = l->block_size,
		.write_cache = l->write_cache,
		.read_only = l->read_only,
		.vendor = "TIERCACH",
		.product = "tiercache LUN",
		.revision = "0001",
		/* gateway N: target port group N, relative target port N */
		.target_port_group = cfg->port_group,
		.rel_port_id = (uint16_t)cfg->port_group,
		.alua_groups = (uint16_t)l->gateways,
		.space_warn = l->space_warn,
		.io_timeout_ms = l->io_timeout * 1000u,
	};
	*lu_out = scsi_lu_open(&lc, dev, err, sizeof(err));
	if (!*lu_out) {
		log_err("%s:%d: [lun %s]: %s", cfg->path, l->line, l->name, err);
		bdev_close(dev);
		*vol_out = NULL;
		return -1;
	}
	/* an image resized under us: new READ CAPACITY, CAPACITY DATA HAS CHANGED */
	bdev_set_resize_listener(dev, lun_capacity_changed, *lu_out);
	log_info("lun %s: %s%s, %llu bytes, %u-byte blocks, serial %s, write cache %s", l->name, l->backing,
		 l->backing_buffered ? " (buffered)" : "", (unsigned long long)dev->size, l->block_size, serial,
		 l->write_cache ? "on" : "off");
	return 0;
}
