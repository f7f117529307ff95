/*
 * main.c - tiercached: read the config, open the LUNs, serve, drain, exit.
 *
 * The main thread owns startup and shutdown only: it validates the config,
 * opens every backing store and logical unit, starts one worker per core
 * and the iSCSI portal, then waits for a signal. SIGTERM/SIGINT drain the
 * portal (in-flight commands complete and their status goes out) before the
 * workers stop and the stores are closed (and flushed). SIGHUP re-reads
 * the configuration (reload.c). A LUN is opened by open.c, for a reload
 * too; tierctl status is status.c (daemon.h says who calls whom).
 */
#include "backstore/scsi.h"
#include "cache/cache.h"
#include "common/log.h"
#include "common/worker.h"
#include "config/config.h"
#include "daemon/control.h"
#include "daemon/ctl_cache.h"
#include "daemon/daemon.h"
#include "daemon/leg_health.h"
#include "daemon/metrics.h"
#include "daemon/watchdog.h"
#include "target/iscsi/portal.h"
#include "target/tcmu/tcmu.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

static int mkdir_p(const char *path);

/* Create the directory that will hold path (the control socket). */
static int mkdir_parent(const char *path)
{
	char dir[PATH_MAX];
	snprintf(dir, sizeof(dir), "%s", path);
	char *slash = strrchr(dir, '/');
	if (!slash || slash == dir)
		return 0;
	*slash = '\0';
	return mkdir_p(dir);
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: tiercached -c FILE [--check] [--debug]\n"
		"  -c, --config FILE  configuration file (INI; see README.md)\n"
		"      --check        validate the configuration and exit\n"
		"  -d, --debug        log debug messages\n"
		"  -V, --version      print the version\n");
}

/* mkdir -p with mode 0700 for new components. */
static int mkdir_p(const char *path)
{
	char buf[PATH_MAX];
	snprintf(buf, sizeof(buf), "%s", path);
	for (char *p = buf + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdir(buf, 0700) < 0 && errno != EEXIST)
			return -1;
		*p = '/';
	}
	if (mkdir(buf, 0700) < 0 && errno != EEXIST)
		return -1;
	return 0;
}

/* Open (format or recover) every [cache] set. Workers must be running. */
static int open_caches(struct daemon *d)
{
	struct config *cfg = d->cfg;
	char err[1024];

	d->sets = calloc(cfg->ncaches ? cfg->ncaches : 1, sizeof(*d->sets));
	if (!d->sets)
		return -1;
	for (int i = 0; i < cfg->ncaches; i++) {
		struct cfg_cache *c = &cfg->caches[i];
		struct cache_set_cfg csc = {
			.name = c->name,
			.legs = { c->legs[0], c->legs[1] },
			.nlegs = c->nlegs,
			.allow_single_leg = c->allow_single_leg,
			.size = c->size,
			.extent_size = c->extent,
			.mode = (enum cache_mode)c->mode,
			.admit_hits = c->admit_hits,
			.seq_cutoff = c->seq_cutoff,
			.dirty_target = c->dirty_target,
			.destage_max = c->destage_max,
			.destage_max_iops = c->destage_max_iops,
			.leg_timeout_ms = c->leg_timeout * 1000u,
			.max_read_errors = c->max_read_errors,
			.fault_injection = c->fault_injection,
		};
		for (int k = 0; k < c->nlegs; k++)
			if (c->size && mkdir_parent(c->legs[k]) < 0) {
				log_err("%s:%d: [cache %s]: cannot create the directory of %s: %s", cfg->path, c->line,
					c->name, c->legs[k], strerror(errno));
				return -1;
			}
		d->sets[i] = cache_set_open(&csc, err, sizeof(err));
		if (!d->sets[i]) {
			log_err("%s:%d: [cache %s]: %s", cfg->path, c->line, c->name, err);
			return -1;
		}
	}
	return 0;
}

/* Clean stop of every set: destage nothing, checkpoint metadata. Before workers_stop. */
static void shutdown_caches(struct daemon *d)
{
	for (int i = 0; d->sets && i < d->cfg->ncaches; i++)
		if (d->sets[i])
			cache_set_shutdown(d->sets[i]);
}

/*
 * A LUN that takes its image's lock at start (an RBD LUN of this gateway
 * alone) reads TRANSITION until it holds it; after a crash that includes
 * breaking the old client's lock and waiting out its lease (3.5 s). The
 * LUNs' lock work does that side by side; the portal opens once they are
 * done, so a host's first commands find the LUNs serving. Bounded: a LUN
 * still waiting after that answers NOT READY (transition), which hosts
 * retry.
 */
#define TAKEOVER_WAIT_MAX_MS 15000

static void wait_takeovers(struct daemon *d)
{
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		int waiting = 0;
		for (int i = 0; i < d->cfg->nluns; i++) {
			struct scsi_lu_ownership o;
			if (d->lus[i] && scsi_lu_ownership(d->lus[i], &o) && o.state == BDEV_OWNER_TRANSITION)
				waiting++;
		}
		clock_gettime(CLOCK_MONOTONIC, &t);
		long ms = (t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000;
		if (!waiting) {
			if (ms >= 100)
				log_info("start: every LUN that takes its image's lock holds it, after %ld ms", ms);
			return;
		}
		if (ms >= TAKEOVER_WAIT_MAX_MS) {
			log_warn("start: %d LUN(s) still taking their image's lock after %ld ms; the portal "
				 "opens, and they answer NOT READY (transition) until they serve", waiting, ms);
			return;
		}
		usleep(20 * 1000);
	}
}

static int open_luns(struct daemon *d)
{
	struct config *cfg = d->cfg;

	if (open_caches(d) < 0)
		return -1;

	d->lus = calloc(cfg->nluns ? cfg->nluns : 1, sizeof(*d->lus));
	d->serials = calloc(cfg->nluns ? cfg->nluns : 1, sizeof(*d->serials));
	d->vols = calloc(cfg->nluns ? cfg->nluns : 1, sizeof(*d->vols));
	if (!d->lus || !d->serials || !d->vols)
		return -1;
	for (int i = 0; i < cfg->nluns; i++)
		if (daemon_open_lun(cfg, &cfg->luns[i], d->sets, d->serials[i], &d->lus[i], &d->vols[i]) < 0)
			return -1;
	wait_takeovers(d);
	/* every configured LUN is attached: the sets forget the LUNs removed
	 * from the configuration whose data in them is all clean */
	for (int i = 0; i < cfg->ncaches; i++) {
		int r = d->sets[i] ? cache_set_prune(d->sets[i]) : 0;
		if (r < 0)
			log_warn("[cache %s]: cannot record the LUNs it forgot: %s", cfg->caches[i].name, strerror(-r));
	}
	return 0;
}

static int build_targets(struct daemon *d)
{
	struct config *cfg = d->cfg;
	int nt = cfg->ntargets;

	d->targets = calloc(nt ? nt : 1, sizeof(*d->targets));
	d->portal_targets = calloc(nt ? nt : 1, sizeof(*d->portal_targets));
	d->portal_listen = calloc(cfg->nlisten, sizeof(*d->portal_listen));
	if (!d->targets || !d->portal_targets || !d->portal_listen)
		return -1;
	for (int i = 0; i < nt; i++) {
		struct cfg_target *t = &cfg->targets[i];
		d->targets[i] = scsi_target_new(t->iqn);
		if (!d->targets[i])
			return -1;
		for (int j = 0; j < t->nluns; j++) {
			int idx = (int)(t->luns[j].lu - cfg->luns);
			scsi_target_map(d->targets[i], t->luns[j].lun, d->lus[idx]);
		}
		d->portal_targets[i] = daemon_portal_target(t, d->targets[i]);
		log_info("target %s: %d LUN(s), %s, %s", t->iqn, t->nluns,
			 t->nallow ? "initiators restricted by allow" : "any initiator",
			 t->mutual_user ? "mutual CHAP" : t->chap_user ? "CHAP" : "no CHAP");
	}
	for (int i = 0; i < cfg->nlisten; i++) {
		d->portal_listen[i].addr = cfg->listen[i].addr;
		d->portal_listen[i].port = cfg->listen[i].port;
	}
	return 0;
}

static void teardown(struct daemon *d)
{
	struct config *cfg = d->cfg;
	if (d->targets)
		for (int i = 0; i < cfg->ntargets; i++)
			if (d->targets[i])
				scsi_target_free(d->targets[i]);
	if (d->lus)
		for (int i = 0; i < cfg->nluns; i++)
			if (d->lus[i])
				scsi_lu_close(d->lus[i]);
	free(d->targets);
	free(d->lus);
	free(d->serials);
	free(d->vols);
	free(d->portal_targets);
	free(d->portal_listen);
	for (int i = 0; i < d->nold_targets; i++)
		scsi_target_free(d->old_targets[i]);
	for (int i = 0; i < d->nparked; i++)
		scsi_lu_close(d->parked[i].lu);
	for (int i = 0; d->sets && i < cfg->ncaches; i++)
		cache_set_close(d->sets[i]);
	free(d->sets);
	free(d->pc);
	for (int i = 0; i < d->nold_mem; i++)
		free(d->old_mem[i]);
	for (int i = 0; i < d->nold_cfgs; i++)
		config_free(d->old_cfgs[i]);
	free(d->old_mem);
	free(d->old_cfgs);
	free(d->old_targets);
	for (int i = 0; i < d->nparked; i++)
		free(d->parked[i].backing);
	free(d->parked);
	config_free(cfg);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "config", required_argument, NULL, 'c' },
		{ "check", no_argument, NULL, 'k' },
		{ "debug", no_argument, NULL, 'd' },
		{ "version", no_argument, NULL, 'V' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	const char *path = NULL;
	bool check_only = false, debug = false;
	int c;

	while ((c = getopt_long(argc, argv, "c:dVh", opts, NULL)) != -1) {
		switch (c) {
		case 'c': path = optarg; break;
		case 'k': check_only = true; break;
		case 'd': debug = true; break;
		case 'V': printf("tiercached %s\n", TC_VERSION); return 0;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (!path || optind != argc) {
		usage(stderr);
		return 2;
	}

	struct daemon d = { .path = path, .debug = debug };
	char err[1024];
	if (config_load(path, &d.cfg, err, sizeof(err)) < 0) {
		fprintf(stderr, "%s\n", err);
		return 1;
	}
	if (check_only) {
		/* the legs' on-disk format too: a build that cannot read a set
		 * must never start on it (the unit and the package run this) */
		int bad = 0;
		for (int i = 0; i < d.cfg->ncaches; i++)
			for (int k = 0; k < d.cfg->caches[i].nlegs; k++) {
				uint32_t v;
				if (cache_leg_format(d.cfg->caches[i].legs[k], &v, err, sizeof(err)) < 0) {
					fprintf(stderr, "%s: [cache %s] %s\n", path, d.cfg->caches[i].name, err);
					bad++;
				}
			}
		if (bad) {
			config_free(d.cfg);
			return 1;
		}
		printf("%s: configuration OK: %d target(s), %d LUN(s), %d listen address(es)\n", path,
		       d.cfg->ntargets, d.cfg->nluns, d.cfg->nlisten);
		config_free(d.cfg);
		return 0;
	}
	log_set_level(debug ? LOG_LVL_DEBUG : daemon_parse_level(d.cfg->log_level));
	log_info("tiercached %s starting with %s", TC_VERSION, path);

	/* Signals are taken synchronously by the main thread only. */
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	signal(SIGPIPE, SIG_IGN);

	if (mkdir_p(d.cfg->state_dir) < 0) {
		log_err("%s: state_dir %s cannot be created: %s; create it or point state_dir elsewhere",
			path, d.cfg->state_dir, strerror(errno));
		config_free(d.cfg);
		return 1;
	}
	worker_set_poll_us(d.cfg->poll_us);
	int r = workers_start(d.cfg->workers);
	if (r < 0) {
		log_err("cannot start worker threads: %s", strerror(-r));
		config_free(d.cfg);
		return 1;
	}
	if (open_luns(&d) < 0 || build_targets(&d) < 0) {
		shutdown_caches(&d);
	workers_stop();
		teardown(&d);
		return 1;
	}
	d.pc = calloc(1, sizeof(*d.pc));
	if (!d.pc) {
		log_err("out of memory");
		shutdown_caches(&d);
		workers_stop();
		teardown(&d);
		return 1;
	}
	*d.pc = (struct iscsi_portal_cfg){
		.listen = d.portal_listen,
		.nlisten = d.cfg->nlisten,
		.targets = d.portal_targets,
		.ntargets = d.cfg->ntargets,
		.nop_interval = d.cfg->nop_interval,
		.nop_timeout = d.cfg->nop_timeout,
		.tpgt = d.cfg->port_group,
		.disc_chap_user = d.cfg->disc_chap_user,
		.disc_chap_secret = d.cfg->disc_chap_secret,
		.disc_mutual_user = d.cfg->disc_mutual_user,
		.disc_mutual_secret = d.cfg->disc_mutual_secret,
	};
	if (iscsi_portal_start(d.pc, err, sizeof(err)) < 0) {
		log_err("%s", err);
		shutdown_caches(&d);
	workers_stop();
		teardown(&d);
		return 1;
	}
	for (int i = 0; i < d.cfg->nlisten; i++)
		log_info("portal listening on %s%s%s:%u", strchr(d.cfg->listen[i].addr, ':') ? "[" : "",
			 d.cfg->listen[i].addr, strchr(d.cfg->listen[i].addr, ':') ? "]" : "",
			 d.cfg->listen[i].port);
	/* LIO through TCMU: optional; a kernel without it is not fatal. */
	if (d.cfg->tcmu_enable && tcmu_start(d.lus, d.cfg->nluns, d.cfg->tcmu_dbus, err, sizeof(err)) < 0) {
		log_err("%s", err);
		iscsi_portal_drain();
		shutdown_caches(&d);
		workers_stop();
		teardown(&d);
		return 1;
	}
	err[0] = '\0';
	daemon_status_register(&d);
	ctl_cache_register(d.cfg, d.sets, d.vols);
	if (d.cfg->ncaches && leg_health_start(d.sets, d.cfg->ncaches, 60) < 0)
		log_warn("cannot start the NVMe health monitor; legs are still failed on I/O errors");
	if (scsi_space_monitor_start(d.cfg->space_interval) < 0)
		log_warn("cannot start the space monitor; thin provisioning thresholds are not watched");
	if (mkdir_parent(d.cfg->control_socket) < 0 ||
	    control_start(d.cfg->control_socket, err, sizeof(err)) < 0) {
		log_err("%s", err[0] ? err : "cannot create the control socket directory");
		iscsi_portal_drain();
		shutdown_caches(&d);
	workers_stop();
		teardown(&d);
		return 1;
	}
	if (metrics_start(&d) < 0) { /* it said why */
		control_stop();
		leg_health_stop();
		scsi_space_monitor_stop();
		iscsi_portal_drain();
		shutdown_caches(&d);
		workers_stop();
		teardown(&d);
		return 1;
	}
	sd_notify(0, "READY=1\nSTATUS=serving");
	log_info("ready: %d target(s), %d LUN(s), %u worker thread(s)", d.cfg->ntargets, d.cfg->nluns,
		 workers_count());

	watchdog_start();
	bool parked = false; /* removed cached LUNs wait for their destage */
	for (;;) {
		int sig;
		int wd_ms = watchdog_poll_ms();
		if (parked && (wd_ms < 0 || wd_ms > 2000))
			wd_ms = 2000;
		if (wd_ms >= 0) {
			/* Wake at least every half watchdog interval to feed it. */
			struct timespec ts = { .tv_sec = wd_ms / 1000, .tv_nsec = (long)(wd_ms % 1000) * 1000000L };
			sig = sigtimedwait(&set, NULL, &ts);
			watchdog_feed();
			if (parked)
				parked = daemon_release_parked(&d);
			if (sig < 0)
				continue;
		} else if (sigwait(&set, &sig)) {
			continue;
		}
		if (sig == SIGHUP) {
			daemon_reload(&d);
			parked = daemon_release_parked(&d);
			continue;
		}
		log_info("%s received: draining in-flight commands", sig == SIGTERM ? "SIGTERM" : "SIGINT");
		break;
	}
	sd_notify(0, "STOPPING=1");
	watchdog_stop();
	metrics_stop();
	control_stop();
	ctl_cache_stop();
	leg_health_stop();
	scsi_space_monitor_stop();
	iscsi_portal_drain();
	tcmu_stop();
	shutdown_caches(&d);
	workers_stop();
	teardown(&d);
	log_info("stopped cleanly");
	return 0;
}
