/*
 * tcmu.c - the ring-facing half of the LIO front end (libtcmu glue).
 *
 * Everything here talks to libtcmu.so.2 (declared in libtcmu_abi.h) and to
 * the worker threads; the translation of a command lives in xlate.c.
 *
 *   tc-tcmu thread        poll(libtcmu's netlink fd) -> tcmulib_master_fd_ready
 *                         -> on_added / on_removed / on_reconfig, which post
 *                            work to the device's worker and wait for it
 *   device's worker       uio fd readable -> on_ring: processing_start,
 *                         get_next_command ... -> tcmu_xlate_submit;
 *                         backstore done -> ring_done: command_complete,
 *                         processing_complete (batched while in on_ring)
 *   tc-dbus thread        ([tcmu] dbus = yes) tcmulib_register, then GLib's
 *                         default main context: targetcli's CheckConfig
 *
 * A device is attached only after a READ CAPACITY(16) through the backstore
 * agrees with LIO's size and block size for it; a mismatch refuses the
 * device (LIO's enable fails, when LIO waits for the handler's answer)
 * with a sentence naming the fix.
 */
#include "target/tcmu/tcmu.h"

#include "backstore/scsi.h"
#include "common/log.h"
#include "common/worker.h"
#include "target/tcmu/glib_abi.h"
#include "target/tcmu/libtcmu_abi.h"
#include "target/tcmu/xlate.h"

#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#define SUBTYPE "tiercache"
/* libtcmu puts the handler space right after the CDB, so it may be
 * misaligned: ask for slack and align the command state ourselves. */
#define HM_ALIGN 16u
#define HM_CMD_SIZE ((int)(sizeof(struct tcmu_xcmd) + HM_ALIGN))

enum wce_step { WCE_SENSE, WCE_SELECT };

struct tdev {
	struct tcmu_xdev xd;        /* first: ring_done gets &xd */
	struct tcmu_device *dev;
	struct worker *w;
	struct ev_handler ev;
	char lio_name[128];
	char uio[32];
	char lun[65];
	uint64_t blocks;
	uint32_t block_size;
	uint64_t lio_bytes;         /* LIO's dev_size and hw_block_size (configfs) */
	uint32_t lio_block_size;
	bool wce;                   /* the LU's write cache bit as last seen */
	/* worker-side state */
	bool in_batch, kick, detaching, first_logged;
	struct worker_call detach_call; /* detach_finish, once the last command is back */
	/* handshake with the tc-tcmu thread (attach, detach, reconfig) */
	sem_t sem;
	int op_result;
	char reason[320];
	bool want_wce;
	enum wce_step wce_step;
	struct tdev *next;
	_Alignas(64) uint8_t scratch[256];
};

static struct tcmulib_context *ctx;
static struct tcmulib_handler handler;
static pthread_t thread;
static int stop_pipe[2] = { -1, -1 };
static struct scsi_lu *const *config_lus;
static int config_nlus;
static pthread_mutex_t devs_lock = PTHREAD_MUTEX_INITIALIZER;
static struct tdev *devs;
/* optional D-Bus registration (targetcli): a thread iterating GLib's loop */
static pthread_t dbus_thread;
static bool dbus_running;
static atomic_bool dbus_stop;

static uint64_t be64_get(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 0; i < 8; i++)
		v = v << 8 | p[i];
	return v;
}

static uint32_t be32_get(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static struct scsi_lu *find_lu(const char *name)
{
	for (int i = 0; i < config_nlus; i++)
		if (!strcmp(scsi_lu_name(config_lus[i]), name))
			return config_lus[i];
	return NULL;
}

/* "a, b, c" of the configured LUN names, for refusals. */
static void lun_names(char *buf, size_t len)
{
	size_t used = 0;
	buf[0] = '\0';
	for (int i = 0; i < config_nlus && used < len; i++) {
		int n = snprintf(buf + used, len - used, "%s%s", i ? ", " : "", scsi_lu_name(config_lus[i]));
		if (n < 0)
			break;
		used += (size_t)n;
	}
	if (!config_nlus)
		snprintf(buf, len, "(none)");
}

static int read_sysfs(const char *path, char *buf, size_t len)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return -errno;
	int ok = fgets(buf, (int)len, f) != NULL;
	fclose(f);
	if (!ok)
		return -EIO;
	buf[strcspn(buf, "\n")] = '\0';
	return 0;
}

/*
 * LIO's name and geometry for a device. libtcmu 1.5.4 leaves num_lbas and
 * block_size to the handler (tcmu-runner reads them from configfs), so we
 * do the same: the uio device's name is "tcm-user/HBA/NAME/SUBTYPE/CFG",
 * and core/user_HBA/NAME/attrib/{dev_size,hw_block_size} hold the numbers.
 * Blocking file reads: tc-tcmu thread only.
 */
static int lio_geometry(struct tdev *td)
{
	char path[512], buf[512], val[64];
	unsigned hba;
	char name[128];

	snprintf(path, sizeof(path), "/sys/class/uio/%s/name", td->uio);
	if (read_sysfs(path, buf, sizeof(buf)) < 0 || sscanf(buf, "tcm-user/%u/%127[^/]/", &hba, name) != 2) {
		snprintf(td->reason, sizeof(td->reason), "cannot tell the LIO device behind %s (%.200s)", td->uio, path);
		return -ENOENT;
	}
	snprintf(td->lio_name, sizeof(td->lio_name), "core/user_%u/%.100s", hba, name);
	snprintf(path, sizeof(path), "/sys/kernel/config/target/core/user_%u/%s/attrib/hw_block_size", hba, name);
	if (read_sysfs(path, val, sizeof(val)) < 0) {
		snprintf(td->reason, sizeof(td->reason), "cannot read %.200s (is configfs mounted?)", path);
		return -ENOENT;
	}
	td->lio_block_size = (uint32_t)strtoul(val, NULL, 10);
	snprintf(path, sizeof(path), "/sys/kernel/config/target/core/user_%u/%s/attrib/dev_size", hba, name);
	if (read_sysfs(path, val, sizeof(val)) < 0) {
		snprintf(td->reason, sizeof(td->reason), "cannot read %.200s (is configfs mounted?)", path);
		return -ENOENT;
	}
	td->lio_bytes = strtoull(val, NULL, 10);
	return 0;
}

/*
 * LIO's bound on a ring command (attrib/cmd_time_out, seconds, 0 = none):
 * past it the kernel fails the command to LIO, whose own task management
 * then finishes, and keeps its data pages until we complete it. It is set
 * from the LU's io_timeout, TCMU_CMD_TIME_OUT_MARGIN_S longer, so that the
 * backstore has fenced the command (xlate.c's tick) before the host hears
 * of it. The kernel refuses a change while the device is exported (a
 * daemon restart under a mapped LUN): the value set before stays, and the
 * log says what it is. Blocking file I/O: tc-tcmu thread only.
 */
#define TCMU_CMD_TIME_OUT_MARGIN_S 2

static void lio_cmd_time_out(struct tdev *td)
{
	struct scsi_lu *lu = find_lu(td->lun);
	struct scsi_lu_overdue o;
	char path[512], val[32];

	if (!lu)
		return;
	scsi_lu_overdue(lu, &o);
	unsigned want = o.io_timeout_ms ? (o.io_timeout_ms + 999) / 1000 + TCMU_CMD_TIME_OUT_MARGIN_S : 0;
	snprintf(path, sizeof(path), "/sys/kernel/config/target/%s/attrib/cmd_time_out", td->lio_name);
	if (read_sysfs(path, val, sizeof(val)) < 0) {
		log_warn("tcmu %s: cannot read %s: LIO's own command timeout is unknown", td->uio, path);
		return;
	}
	unsigned have = (unsigned)strtoul(val, NULL, 10);
	if (have == want)
		return;
	FILE *f = fopen(path, "w");
	bool ok = f && fprintf(f, "%u", want) > 0;
	if (f && fclose(f) != 0)
		ok = false;
	if (ok)
		log_info("tcmu %s: LIO's cmd_time_out set to %u s (io_timeout of [lun %s] + %d s)", td->uio, want, td->lun,
			 TCMU_CMD_TIME_OUT_MARGIN_S);
	else
		log_warn("tcmu %s: LIO's cmd_time_out stays %u s (wanted %u for the io_timeout of [lun %s]: the kernel "
			 "takes it only before the device is mapped to a LUN; targetcli: set attribute cmd_time_out=%u)",
			 td->uio, have, want, td->lun, want);
}

/* Would cfgstring attach? NULL, or a malloc'ed sentence saying why not. */
static char *cfgstring_problem(const char *cfgstring)
{
	char names[512], *reason = NULL;
	const char *lun = tcmu_cfgstring_lun(cfgstring);

	lun_names(names, sizeof(names));
	if (!lun) {
		if (asprintf(&reason, "cfgstring \"%s\" names no LUN; give the name of a [lun NAME] section of "
			     "tiercached.conf (configured: %s)", cfgstring, names) < 0)
			reason = NULL;
	} else if (!find_lu(lun)) {
		if (asprintf(&reason, "tiercached has no [lun %s]; add it to tiercached.conf and restart, or use one "
			     "of: %s", lun, names) < 0)
			reason = NULL;
	}
	return reason;
}

/* ---- worker side: the ring ---- */

static void detach_finish(void *arg)
{
	struct tdev *td = arg;
	tcmu_xdev_close(&td->xd);
	sem_post(&td->sem);
}

/* The backstore finished a ring command (xlate.c's hook). Device's worker. */
static void ring_done(struct tcmu_xdev *xd, struct tcmu_xcmd *xc, void *ring_cmd, int result)
{
	struct tdev *td = (struct tdev *)xd;

	(void)xc; /* lives inside ring_cmd, which the next call frees */
	log_debug("tcmu %s: command done, result %d", td->xd.name, result);
	tcmulib_command_complete(td->dev, ring_cmd, result);
	if (td->in_batch)
		td->kick = true;
	else
		tcmulib_processing_complete(td->dev);
	/* finish a pending detach once the stack has unwound out of the backstore */
	if (td->detaching && xd->inflight == 0)
		worker_post_call(td->w, &td->detach_call, detach_finish, td); /* inflight reaches 0 once */
}

static void on_ring(struct ev_handler *h, uint32_t events)
{
	struct tdev *td = (struct tdev *)((char *)h - offsetof(struct tdev, ev));
	struct tcmulib_cmd *c;

	if (events & (EPOLLERR | EPOLLHUP)) {
		/* the uio device went away under us (LIO failed or dropped it
		 * without telling us): stop watching rather than spin */
		log_err("tcmu %s: the TCMU ring's device reports an error; no longer serving it", td->xd.name);
		worker_unwatch(&td->ev);
		return;
	}
	tcmulib_processing_start(td->dev);
	td->in_batch = true;
	while (!td->detaching && (c = tcmulib_get_next_command(td->dev, HM_CMD_SIZE)) != NULL) {
		struct tcmu_xcmd *xc = (struct tcmu_xcmd *)(((uintptr_t)c->hm_private + HM_ALIGN - 1) &
							      ~(uintptr_t)(HM_ALIGN - 1));
		if (!td->first_logged) {
			td->first_logged = true;
			log_info("tcmu %s: first command from LIO through the TCMU ring (opcode 0x%02x)",
				 td->xd.name, c->cdb[0]);
		}
		log_debug("tcmu %s: ring command %u opcode 0x%02x, %zu iovec(s)", td->xd.name, c->cmd_id, c->cdb[0],
			  c->iov_cnt);
		tcmu_xlate_submit(&td->xd, xc, c, c->cdb, c->iovec, (int)c->iov_cnt, c->sense_buf);
	}
	td->in_batch = false;
	if (td->kick) {
		td->kick = false;
		tcmulib_processing_complete(td->dev);
	}
}

static void attach_fail(struct tdev *td)
{
	tcmu_xdev_close(&td->xd);
	td->op_result = -EINVAL;
	sem_post(&td->sem);
}

static void attach_mode_done(struct scsi_cmd *sc, void *arg)
{
	struct tdev *td = arg;
	/* MODE SENSE(6), DBD: 4-byte header, then the caching page; WCE is bit 2 of its byte 2 */
	if (sc->status == SAM_STAT_GOOD && sc->data_in_len >= 7 && (td->scratch[4] & 0x3f) == 0x08)
		td->wce = td->scratch[6] & 0x04;
	tcmu_dev_set_write_cache_enabled(td->dev, td->wce);
	td->ev.fd = tcmu_dev_get_fd(td->dev);
	td->ev.on_event = on_ring;
	int r = worker_watch_file(&td->ev, EPOLLIN);
	if (r < 0) {
		snprintf(td->reason, sizeof(td->reason), "cannot watch %s: %s", td->uio, strerror(-r));
		attach_fail(td);
		return;
	}
	td->op_result = 0;
	sem_post(&td->sem);
}

static void attach_capacity_done(struct scsi_cmd *sc, void *arg)
{
	struct tdev *td = arg;

	if (sc->status != SAM_STAT_GOOD || sc->data_in_len < 12) {
		snprintf(td->reason, sizeof(td->reason), "[lun %s] did not answer READ CAPACITY(16) (status 0x%02x)",
			 td->lun, sc->status);
		attach_fail(td);
		return;
	}
	td->blocks = be64_get(td->scratch) + 1;
	td->block_size = be32_get(td->scratch + 8);
	uint32_t lio_bs = td->lio_block_size;
	uint64_t lio_blocks = lio_bs ? td->lio_bytes / lio_bs : 0;
	if (lio_bs != td->block_size) {
		snprintf(td->reason, sizeof(td->reason),
			 "LIO device %s has %u-byte blocks but [lun %s] has %u-byte blocks; re-create it with "
			 "control=hw_block_size=%u", td->lio_name, lio_bs, td->lun, td->block_size, td->block_size);
		attach_fail(td);
		return;
	}
	if (lio_blocks != td->blocks) {
		snprintf(td->reason, sizeof(td->reason),
			 "LIO device %s is %llu bytes but [lun %s] is %llu bytes; re-create it with size=%llu",
			 td->lio_name, (unsigned long long)(lio_blocks * lio_bs), td->lun,
			 (unsigned long long)(td->blocks * td->block_size),
			 (unsigned long long)(td->blocks * td->block_size));
		attach_fail(td);
		return;
	}
	static const uint8_t mode_sense[6] = { 0x1a, 0x08, 0x08, 0, 255, 0 };
	memset(td->scratch, 0, sizeof(td->scratch));
	if (tcmu_xlate_internal(&td->xd, mode_sense, td->scratch, 255, false, attach_mode_done, td) < 0) {
		snprintf(td->reason, sizeof(td->reason), "out of memory");
		attach_fail(td);
	}
}

static void attach_tur_done(struct scsi_cmd *sc, void *arg)
{
	struct tdev *td = arg;
	static const uint8_t read_capacity16[16] = { 0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0 };

	(void)sc; /* GOOD or the unit attention: either way the LU answered */
	memset(td->scratch, 0, sizeof(td->scratch));
	if (tcmu_xlate_internal(&td->xd, read_capacity16, td->scratch, 32, false, attach_capacity_done, td) < 0) {
		snprintf(td->reason, sizeof(td->reason), "out of memory");
		attach_fail(td);
	}
}

static void attach_on_worker(void *arg)
{
	struct tdev *td = arg;
	char label[sizeof(td->xd.name)];

	snprintf(label, sizeof(label), "%s (%s)", td->lio_name, td->uio);
	if (tcmu_xdev_open(&td->xd, find_lu(td->lun), label, ring_done) < 0) {
		snprintf(td->reason, sizeof(td->reason), "out of memory");
		td->op_result = -ENOMEM;
		sem_post(&td->sem);
		return;
	}
	/* Our private nexus is new, so the backstore owes it a POWER ON unit
	 * attention; LIO reports its own to the real initiators. Take ours
	 * with a TEST UNIT READY, then ask the capacity. */
	static const uint8_t tur[6] = { 0 };
	if (tcmu_xlate_internal(&td->xd, tur, NULL, 0, false, attach_tur_done, td) < 0) {
		snprintf(td->reason, sizeof(td->reason), "out of memory");
		attach_fail(td);
	}
}

static void detach_on_worker(void *arg)
{
	struct tdev *td = arg;
	worker_unwatch(&td->ev);
	td->detaching = true;
	if (td->xd.inflight == 0)
		detach_finish(td);
}

/* Write-cache toggle: MODE SENSE the caching page, flip WCE, MODE SELECT it. */
static void wce_step_done(struct scsi_cmd *sc, void *arg)
{
	struct tdev *td = arg;

	if (sc->status != SAM_STAT_GOOD) {
		snprintf(td->reason, sizeof(td->reason), "MODE %s of the caching page failed (status 0x%02x)",
			 td->wce_step == WCE_SENSE ? "SENSE" : "SELECT", sc->status);
		td->op_result = -EIO;
		sem_post(&td->sem);
		return;
	}
	if (td->wce_step == WCE_SELECT) {
		td->wce = td->want_wce;
		tcmu_dev_set_write_cache_enabled(td->dev, td->wce);
		td->op_result = 0;
		sem_post(&td->sem);
		return;
	}
	uint8_t *page = td->scratch + 4;
	unsigned plen = 2u + page[1];
	if (sc->data_in_len < 4 + plen || (page[0] & 0x3f) != 0x08 || plen > sizeof(td->scratch) - 4) {
		snprintf(td->reason, sizeof(td->reason), "the backstore returned no caching mode page");
		td->op_result = -EIO;
		sem_post(&td->sem);
		return;
	}
	td->scratch[0] = td->scratch[1] = td->scratch[2] = td->scratch[3] = 0; /* header: no block descriptors */
	page[0] &= 0x3f;                                                        /* PS is reserved in MODE SELECT */
	page[2] = td->want_wce ? (uint8_t)(page[2] | 0x04) : (uint8_t)(page[2] & ~0x04);
	uint8_t cdb[6] = { 0x15, 0x10, 0, 0, (uint8_t)(4 + plen), 0 };
	td->wce_step = WCE_SELECT;
	if (tcmu_xlate_internal(&td->xd, cdb, td->scratch, 4 + plen, true, wce_step_done, td) < 0) {
		td->op_result = -ENOMEM;
		sem_post(&td->sem);
	}
}

static void wce_on_worker(void *arg)
{
	struct tdev *td = arg;
	static const uint8_t mode_sense[6] = { 0x1a, 0x08, 0x08, 0, 255, 0 };
	memset(td->scratch, 0, sizeof(td->scratch));
	td->wce_step = WCE_SENSE;
	if (tcmu_xlate_internal(&td->xd, mode_sense, td->scratch, 255, false, wce_step_done, td) < 0) {
		td->op_result = -ENOMEM;
		sem_post(&td->sem);
	}
}

/* Run fn on the device's worker and wait for its sem_post. */
static int run_on_worker(struct tdev *td, void (*fn)(void *))
{
	td->op_result = 0;
	td->reason[0] = '\0';
	if (worker_post(td->w, fn, td) < 0)
		return -ENOMEM;
	while (sem_wait(&td->sem) < 0 && errno == EINTR)
		;
	return td->op_result;
}

/* ---- libtcmu callbacks: tc-tcmu thread (or main, inside tcmulib_initialize) ---- */

static bool on_check_config(const char *cfgstring, char **reason)
{
	char *why = cfgstring_problem(cfgstring);
	if (!why)
		return true;
	*reason = why;
	return false;
}

static int on_added(struct tcmu_device *dev)
{
	const char *cfg = tcmu_dev_get_cfgstring(dev);
	const char *uio = tcmu_dev_get_uio_name(dev);
	char *why = cfgstring_problem(cfg ? cfg : "");

	if (why) {
		log_err("tcmu %s: refusing LIO device: %s", uio ? uio : "?", why);
		free(why);
		return -ENOENT;
	}
	struct tdev *td = calloc(1, sizeof(*td));
	if (!td)
		return -ENOMEM;
	td->dev = dev;
	td->w = worker_next();
	snprintf(td->uio, sizeof(td->uio), "%s", uio ? uio : "uio?");
	snprintf(td->lun, sizeof(td->lun), "%s", tcmu_cfgstring_lun(cfg));
	sem_init(&td->sem, 0, 0);
	int r = lio_geometry(td);
	if (r == 0) {
		tcmu_dev_set_block_size(dev, td->lio_block_size);
		if (td->lio_block_size)
			tcmu_dev_set_num_lbas(dev, td->lio_bytes / td->lio_block_size);
		lio_cmd_time_out(td);
		r = run_on_worker(td, attach_on_worker);
	}
	if (r < 0) {
		log_err("tcmu %s: refusing LIO device for [lun %s]: %s", td->uio, td->lun, td->reason);
		sem_destroy(&td->sem);
		free(td);
		return r;
	}
	tcmu_dev_set_private(dev, td);
	pthread_mutex_lock(&devs_lock);
	td->next = devs;
	devs = td;
	pthread_mutex_unlock(&devs_lock);
	log_info("tcmu %s: LIO device %s attached to [lun %s]: %llu blocks of %u bytes, write cache %s, on worker %u",
		 td->uio, td->lio_name, td->lun, (unsigned long long)td->blocks, td->block_size, td->wce ? "on" : "off",
		 worker_index(td->w));
	return 0;
}

static void unlink_dev(struct tdev *td)
{
	pthread_mutex_lock(&devs_lock);
	for (struct tdev **pp = &devs; *pp; pp = &(*pp)->next)
		if (*pp == td) {
			*pp = td->next;
			break;
		}
	pthread_mutex_unlock(&devs_lock);
}

static void detach(struct tdev *td)
{
	run_on_worker(td, detach_on_worker);
	unlink_dev(td);
	tcmu_dev_set_private(td->dev, NULL);
	log_info("tcmu %s: LIO device for [lun %s] detached after %llu command(s) (%llu with CHECK CONDITION, "
		 "at most %u in flight)",
		 td->uio, td->lun, (unsigned long long)td->xd.completed, (unsigned long long)td->xd.check_conditions,
		 td->xd.max_inflight);
	sem_destroy(&td->sem);
	free(td);
}

static void on_removed(struct tcmu_device *dev)
{
	struct tdev *td = tcmu_dev_get_private(dev);
	if (td)
		detach(td);
}

static int on_reconfig(struct tcmu_device *dev, struct tcmulib_cfg_info *cfg)
{
	struct tdev *td = tcmu_dev_get_private(dev);
	int r;

	if (!td)
		return -EINVAL;
	switch (cfg->type) {
	case TCMULIB_CFG_DEV_CFGSTR:
		log_err("tcmu %s: refusing to re-point the live device from [lun %s] to \"%s\"; delete the backstore "
			"and create a new one", td->uio, td->lun, cfg->data.dev_cfgstring ? cfg->data.dev_cfgstring : "");
		return -EINVAL;
	case TCMULIB_CFG_DEV_SIZE:
		if (cfg->data.dev_size == td->blocks * td->block_size) {
			tcmu_dev_set_num_lbas(dev, td->blocks);
			log_info("tcmu %s: LIO size set to %llu bytes, as [lun %s] is", td->uio,
				 (unsigned long long)cfg->data.dev_size, td->lun);
			return 0;
		}
		log_err("tcmu %s: refusing LIO size %llu bytes: [lun %s] is %llu bytes; change size in "
			"tiercached.conf and restart the daemon first",
			td->uio, (unsigned long long)cfg->data.dev_size, td->lun,
			(unsigned long long)(td->blocks * td->block_size));
		return -EINVAL;
	case TCMULIB_CFG_WRITE_CACHE:
		td->want_wce = cfg->data.write_cache;
		r = run_on_worker(td, wce_on_worker);
		if (r < 0) {
			log_err("tcmu %s: cannot turn the write cache of [lun %s] %s: %s", td->uio, td->lun,
				td->want_wce ? "on" : "off", td->reason);
			return r;
		}
		log_info("tcmu %s: write cache of [lun %s] turned %s (LIO emulate_write_cache)", td->uio, td->lun,
			 td->wce ? "on" : "off");
		return 0;
	}
	return -EINVAL;
}

/* ---- the tc-tcmu thread ---- */

static void *tcmu_main(void *arg)
{
	(void)arg;
	pthread_setname_np(pthread_self(), "tc-tcmu");
	int master = tcmulib_get_master_fd(ctx);
	for (;;) {
		struct pollfd p[2] = { { .fd = master, .events = POLLIN }, { .fd = stop_pipe[0], .events = POLLIN } };
		if (poll(p, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			log_err("tcmu: poll failed: %s; LIO device events are no longer handled", strerror(errno));
			break;
		}
		if (p[1].revents)
			break;
		if (p[0].revents)
			tcmulib_master_fd_ready(ctx);
	}
	return NULL;
}

/*
 * tc-dbus thread: libtcmu's registration with the TCMU handler manager
 * (tcmu-runner, bus name org.kernel.TCMUService1) is GDBus, asynchronous,
 * and its callbacks (including CheckConfig -> on_check_config) run on
 * whoever iterates GLib's default main context: this thread, and no other.
 */
static void *dbus_main(void *arg)
{
	(void)arg;
	pthread_setname_np(pthread_self(), "tc-dbus");
	tcmulib_register(ctx);
	while (!atomic_load(&dbus_stop))
		g_main_context_iteration(NULL, 1);
	return NULL;
}

static void dbus_start(void)
{
	atomic_store(&dbus_stop, false);
	if (pthread_create(&dbus_thread, NULL, dbus_main, NULL)) {
		log_warn("tcmu: cannot start the D-Bus thread; targetcli will not list user:%s", SUBTYPE);
		return;
	}
	dbus_running = true;
	log_info("tcmu: registering user:%s with the TCMU handler manager over D-Bus (for targetcli)", SUBTYPE);
}

static void dbus_stop_thread(void)
{
	if (!dbus_running)
		return;
	atomic_store(&dbus_stop, true);
	g_main_context_wakeup(NULL);
	pthread_join(dbus_thread, NULL);
	dbus_running = false;
}

int tcmu_start(struct scsi_lu *const *lus, int nlus, bool dbus, char *err, size_t errlen)
{
	config_lus = lus;
	config_nlus = nlus;
	if (access("/sys/module/target_core_user", F_OK) != 0) {
		log_warn("tcmu: [tcmu] enable = yes, but the kernel module target_core_user is not loaded "
			 "(modprobe target_core_user); LIO user:%s backstores are not served, the built-in portal is",
			 SUBTYPE);
		return 1;
	}
	handler = (struct tcmulib_handler){
		.name = "tiercache (NVMe-cached LUNs of tiercached)",
		.subtype = SUBTYPE,
		.cfg_desc = "the name of a [lun NAME] section of tiercached.conf",
		.check_config = on_check_config,
		.reconfig = on_reconfig,
		.added = on_added,
		.removed = on_removed,
	};
	ctx = tcmulib_initialize(&handler, 1);
	if (!ctx) {
		log_warn("tcmu: libtcmu could not reach target_core_user over netlink; LIO user:%s backstores "
			 "are not served, the built-in portal is", SUBTYPE);
		return 1;
	}
	if (pipe2(stop_pipe, O_CLOEXEC) < 0 || pthread_create(&thread, NULL, tcmu_main, NULL)) {
		snprintf(err, errlen, "tcmu: cannot start the netlink thread: %s", strerror(errno));
		tcmu_stop();
		return -1;
	}
	log_info("tcmu: serving LIO backstores user:%s (cfgstring = LUN name; %d LUN(s) configured)", SUBTYPE,
		 nlus);
	if (dbus)
		dbus_start();
	return 0;
}

void tcmu_stop(void)
{
	if (!ctx)
		return;
	dbus_stop_thread();
	if (stop_pipe[1] >= 0) {
		ssize_t w = write(stop_pipe[1], "x", 1);
		(void)w;
		pthread_join(thread, NULL);
		close(stop_pipe[0]);
		close(stop_pipe[1]);
		stop_pipe[0] = stop_pipe[1] = -1;
	}
	for (;;) {
		pthread_mutex_lock(&devs_lock);
		struct tdev *td = devs;
		pthread_mutex_unlock(&devs_lock);
		if (!td)
			break;
		detach(td);
	}
	tcmulib_close(ctx);
	ctx = NULL;
}

void tcmu_status_json(struct json_object *obj)
{
	struct json_object *arr = json_object_new_array();

	json_object_object_add(obj, "enabled", json_object_new_boolean(ctx != NULL));
	pthread_mutex_lock(&devs_lock);
	for (struct tdev *td = devs; td; td = td->next) {
		struct json_object *o = json_object_new_object();
		json_object_object_add(o, "uio", json_object_new_string(td->uio));
		json_object_object_add(o, "lun", json_object_new_string(td->lun));
		json_object_object_add(o, "blocks", json_object_new_int64((int64_t)td->blocks));
		json_object_object_add(o, "block_size", json_object_new_int((int)td->block_size));
		json_object_object_add(o, "worker", json_object_new_int((int)worker_index(td->w)));
		/* counters are the worker's; a relaxed read is a fair snapshot */
		json_object_object_add(o, "commands",
				       json_object_new_int64((int64_t)__atomic_load_n(&td->xd.completed, __ATOMIC_RELAXED)));
		json_object_object_add(o, "check_conditions",
				       json_object_new_int64((int64_t)__atomic_load_n(&td->xd.check_conditions,
										   __ATOMIC_RELAXED)));
		json_object_object_add(o, "inflight",
				       json_object_new_int((int)__atomic_load_n(&td->xd.inflight, __ATOMIC_RELAXED)));
		json_object_object_add(o, "max_inflight",
				       json_object_new_int((int)__atomic_load_n(&td->xd.max_inflight, __ATOMIC_RELAXED)));
		json_object_array_add(arr, o);
	}
	pthread_mutex_unlock(&devs_lock);
	json_object_object_add(obj, "devices", arr);
}
