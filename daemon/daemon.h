/*
 * daemon.h - the daemon's own state and what its files call in each other.
 *
 * The calls go one way, down this list; a file calls only those below it:
 *   main.c      startup, the signal loop, shutdown (called by no one)
 *   reload.c    SIGHUP: re-read the file, apply what can change
 *   status.c    tierctl status
 *   ctl_cache.c tierctl's cache commands (ctl_cache.h)
 *   open.c      open a [lun], a [target]'s portal entry, log_level: what
 *               startup, a reload and leg replace share
 * (control.c, leg_health.c and watchdog.c have headers of their own and
 * call none of these.) struct daemon is main thread only, except where a
 * field says otherwise.
 */
#ifndef TC_DAEMON_DAEMON_H
#define TC_DAEMON_DAEMON_H

#include "common/log.h"
#include "target/iscsi/portal.h"

#include <stdbool.h>

/* what tiercached -V and tierctl status report */
#define TC_VERSION "0.1.0"

struct bdev;
struct cache_set;
struct cfg_cache;
struct cfg_lun;
struct cfg_target;
struct config;
struct scsi_lu;
struct scsi_target;

struct daemon {
	struct config *cfg;
	struct scsi_lu **lus;       /* parallel to cfg->luns */
	struct scsi_target **targets; /* parallel to cfg->targets */
	char (*serials)[33];
	struct iscsi_target_cfg *portal_targets;
	struct iscsi_listen_cfg *portal_listen;
	struct cache_set **sets;    /* parallel to cfg->caches (a reload keeps them) */
	struct bdev **vols;         /* parallel to cfg->luns: cache volume or NULL */
	struct iscsi_portal_cfg *pc;
	/*
	 * What a reload replaced but must outlive the portal: configurations
	 * and arrays that logins and sessions in progress still point into,
	 * retired targets, and LUs it could not close (a cache volume, or
	 * commands that did not drain). Freed at exit, after the drain.
	 */
	void **old_mem;
	int nold_mem;
	struct config **old_cfgs;
	int nold_cfgs;
	struct scsi_target **old_targets;
	int nold_targets;
	/* LUs a reload removed but could not close yet; vol, its cache
	 * volume when it waits only for its dirty data to be destaged
	 * (daemon_release_parked closes it then; NULL otherwise), with the
	 * LUN's name and backing store, which no new LUN may take meanwhile
	 * but that LUN itself on the same set */
	struct parked_lu {
		struct scsi_lu *lu;
		struct bdev *vol;
		char name[65];
		char *backing;
		bool have_id;           /* dev, ino: the backing store's file or device */
		unsigned long long dev, ino;
	} *parked;
	int nparked;
	const char *path;
	bool debug;
};

/* ---- open.c ---- */

/*
 * Open the LU of [lun] l (its serial, backing store, cache volume on a set
 * already running, and the logical unit). cfg is the configuration in
 * effect: its state_dir, and its [cache] sections, parallel to sets (on a
 * reload, l belongs to the new file). 0, or -1 after logging why.
 */
int daemon_open_lun(const struct config *cfg, const struct cfg_lun *l, struct cache_set **sets,
		    char serial[33], struct scsi_lu **lu_out, struct bdev **vol_out);
/*
 * If any of legs (paths) may tear a block of [lun] l (its atomic write unit
 * is smaller than the LUN's blocks, or not known), put the LUN's cache
 * volume vol under the torn-write guard, and log it (or warn when the set
 * has no block log). At open for the configured legs, and for a leg put in
 * by `leg replace`. Main or control thread.
 */
void daemon_guard_torn(const struct cfg_cache *cc, const struct cfg_lun *l, struct bdev *vol,
		       char *const *legs, int nlegs);

/* The portal's view of [target] t served by the SCSI target s (the strings
 * stay t's: t must outlive the portal's use of the result). */
struct iscsi_target_cfg daemon_portal_target(const struct cfg_target *t, struct scsi_target *s);

/* log_level = error | warning | info | debug, as a level (info if unknown). */
enum log_level daemon_parse_level(const char *s);

/* ---- status.c ---- */

/*
 * Register tierctl status on the control socket, for d as it is
 * then and after every reload; uptime counts from this call. Main thread,
 * before control_start. 0, or -1 as control_register.
 */
int daemon_status_register(struct daemon *d);

/* ---- reload.c ---- */

/* Re-read d->path and apply what can change while serving. */
void daemon_reload(struct daemon *d);
/*
 * Close the LUs a reload removed whose cache volume no longer holds dirty
 * data, and free their entries in the set. Main thread, between reloads;
 * true while some still wait (call again in a few seconds).
 */
bool daemon_release_parked(struct daemon *d);

#endif
