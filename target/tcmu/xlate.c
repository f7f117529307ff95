/*
 * xlate.c - turn TCMU ring commands into backstore SCSI commands and back.
 *
 * See xlate.h for why this half exists. The pieces:
 *  - tcmu_xdev_open/close: the private target + nexus a device's commands
 *    arrive on;
 *  - tcmu_xlate_submit: CDB + ring iovec -> struct scsi_cmd, with a bounce
 *    buffer when the ring's buffer does not meet the bdev alignment rule
 *    (4096-byte aligned data for READ/WRITE, see bdev/bdev.h);
 *  - command_done -> tcmu_xlate_result: status + sense -> libtcmu code;
 *  - tcmu_xlate_internal: our own CDBs (capacity check at attach, write
 *    cache toggles) through the very same path.
 */
#include "target/tcmu/xlate.h"

#include "target/tcmu/libtcmu_abi.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XLATE_ALIGN 4096u
#define XLATE_SUBTYPE "tiercache/"

_Static_assert(TCMU_XLATE_SENSE_LEN == TCMU_SENSE_BUFFERSIZE, "ring sense buffer size");
_Static_assert(SCSI_SENSE_MAX <= TCMU_XLATE_SENSE_LEN, "backstore sense fits the ring's buffer");

/* The CDB's own length, and no more than a struct scsi_cmd holds: the
 * backstore knows no command longer than SCSI_CDB_MAX and refuses the
 * operation code of one. */
static unsigned ring_cdb_len(const uint8_t *cdb)
{
	unsigned n = scsi_cdb_len(cdb);
	return n > SCSI_CDB_MAX ? SCSI_CDB_MAX : n;
}

const char *tcmu_cfgstring_lun(const char *cfgstring)
{
	const char *s = cfgstring;
	for (int i = 0; i < 2 && !strncmp(s, XLATE_SUBTYPE, strlen(XLATE_SUBTYPE)); i++)
		s += strlen(XLATE_SUBTYPE);
	if (!*s || strchr(s, '/'))
		return NULL;
	return s;
}

/*
 * io_timeout through TCMU. The kernel bounds what LIO waits for: at the
 * device's cmd_time_out it fails a ring command to LIO (so LIO's own task
 * management finishes) and keeps the command's data pages until we
 * complete it, so the store may still read or fill them. What the kernel
 * cannot do is keep a later write from landing under the failed one:
 * that is the backstore's fence, which a command gets when it is
 * declared overdue. So every second the commands held past io_timeout
 * are declared overdue here, and tcmu.c sets cmd_time_out a little
 * longer than io_timeout (TCMU_CMD_TIME_OUT_S): the fence is up before
 * the host hears of the failure and can send the write that must win.
 */
static void xdev_tick(struct worker_tick *t)
{
	struct tcmu_xdev *xd = (struct tcmu_xdev *)((char *)t - offsetof(struct tcmu_xdev, tick));

	xd->ticks++;
	for (struct tcmu_xcmd *xc = xd->live_head; xc; xc = xc->live_next) {
		/* whole ticks since the one before it was submitted: never
		 * more than its age */
		uint32_t n = xd->ticks - xc->sent_tick;
		uint64_t age_ms = n > 1 ? (uint64_t)(n - 1) * 1000 : 0;
		if (xc->sc.overdue)
			continue;
		if (!scsi_cmd_overdue(&xc->sc, age_ms)) {
			if (!scsi_cmd_timed(&xc->sc))
				continue; /* never overdue: not a sign the rest are young */
			break; /* oldest first: the rest are younger */
		}
	}
}

static void live_unlink(struct tcmu_xdev *xd, struct tcmu_xcmd *xc)
{
	if (xc->live_prev)
		xc->live_prev->live_next = xc->live_next;
	else
		xd->live_head = xc->live_next;
	if (xc->live_next)
		xc->live_next->live_prev = xc->live_prev;
	else
		xd->live_tail = xc->live_prev;
	xc->live_prev = xc->live_next = NULL;
}

int tcmu_xdev_open(struct tcmu_xdev *xd, struct scsi_lu *lu, const char *name, tcmu_xlate_done_fn done)
{
	static const uint8_t isid[6] = { 0 };
	char tname[160];

	memset(xd, 0, sizeof(*xd));
	snprintf(xd->name, sizeof(xd->name), "%s", name);
	xd->lu = lu;
	xd->done = done;
	/* LIO's own target name is what initiators see; ours only labels
	 * the private LUN map this device's commands are routed through. */
	snprintf(tname, sizeof(tname), "iqn.2026-11.io.tiercache:tcmu.%s", scsi_lu_name(lu));
	xd->target = scsi_target_new(tname);
	if (!xd->target)
		return -ENOMEM;
	if (scsi_target_map(xd->target, 0, lu) < 0) {
		scsi_target_free(xd->target);
		xd->target = NULL;
		return -ENOMEM;
	}
	xd->nexus = scsi_nexus_open(xd->target, "iqn.2026-11.io.tiercache:lio-tcmu", isid, 1);
	if (!xd->nexus) {
		scsi_target_free(xd->target);
		xd->target = NULL;
		return -ENOMEM;
	}
	xd->tick.fn = xdev_tick;
	worker_tick_add(&xd->tick);
	return 0;
}

void tcmu_xdev_close(struct tcmu_xdev *xd)
{
	worker_tick_del(&xd->tick);
	if (xd->nexus)
		scsi_nexus_close(xd->nexus);
	if (xd->target)
		scsi_target_free(xd->target);
	xd->nexus = NULL;
	xd->target = NULL;
}

int tcmu_xlate_result(const struct scsi_cmd *sc, uint8_t sense_out[TCMU_XLATE_SENSE_LEN])
{
	memset(sense_out, 0, TCMU_XLATE_SENSE_LEN);
	switch (sc->status) {
	case SAM_STAT_GOOD:
	case SAM_STAT_CONDITION_MET:
		return TCMU_STS_OK;
	case SAM_STAT_CHECK_CONDITION:
		if (sc->sense_len == 0)
			return TCMU_STS_HW_ERR; /* libtcmu builds HARDWARE ERROR sense */
		memcpy(sense_out, sc->sense, sc->sense_len);
		return TCMU_STS_PASSTHROUGH_ERR;
	case SAM_STAT_TASK_SET_FULL:
		return TCMU_STS_NO_RESOURCE;
	default:
		/* BUSY, and what libtcmu 1.5.4 cannot express (RESERVATION
		 * CONFLICT, TASK ABORTED, ACA ACTIVE): BUSY makes the
		 * initiator retry. LIO emulates reservations itself for TCMU
		 * devices, so a conflict does not reach us in practice. */
		return TCMU_STS_BUSY;
	}
}

static bool ring_buffer_aligned(const struct iovec *iov, int iovcnt)
{
	for (int i = 0; i < iovcnt; i++) {
		if ((uintptr_t)iov[i].iov_base % XLATE_ALIGN)
			return false;
		if (i < iovcnt - 1 && iov[i].iov_len % XLATE_ALIGN)
			return false;
	}
	return true;
}

static size_t iov_total(const struct iovec *iov, int iovcnt)
{
	size_t n = 0;
	for (int i = 0; i < iovcnt; i++)
		n += iov[i].iov_len;
	return n;
}

/* Copy between a flat buffer and an iovec, len bytes from the start. */
static void copy_iov(const struct iovec *iov, int iovcnt, void *flat, size_t len, bool to_flat)
{
	size_t off = 0;
	for (int i = 0; i < iovcnt && off < len; i++) {
		size_t c = iov[i].iov_len < len - off ? iov[i].iov_len : len - off;
		if (to_flat)
			memcpy((uint8_t *)flat + off, iov[i].iov_base, c);
		else
			memcpy(iov[i].iov_base, (const uint8_t *)flat + off, c);
		off += c;
	}
}

/* Zero len bytes of the iovec starting at byte offset from. */
static void zero_iov_from(const struct iovec *iov, int iovcnt, size_t from)
{
	size_t pos = 0;
	for (int i = 0; i < iovcnt; i++) {
		size_t end = pos + iov[i].iov_len;
		if (end > from) {
			size_t skip = from > pos ? from - pos : 0;
			memset((uint8_t *)iov[i].iov_base + skip, 0, iov[i].iov_len - skip);
		}
		pos = end;
	}
}

static void command_done(struct scsi_cmd *sc)
{
	struct tcmu_xcmd *xc = sc->fe_priv;
	struct tcmu_xdev *xd = xc->dev;
	void *ring_cmd = xc->ring_cmd;

	if (xc->bounce) {
		if (sc->status == SAM_STAT_GOOD && sc->data_in_len)
			copy_iov(xc->ring_iov, xc->ring_iovcnt, xc->bounce, sc->data_in_len, false);
		free(xc->bounce);
		xc->bounce = NULL;
	}
	/* The kernel returns the whole data area for a read; a short Data-In
	 * (INQUIRY answering less than its allocation length) must not carry
	 * whatever an earlier command left in the ring's pages. */
	if (sc->status == SAM_STAT_GOOD && sc->data_in_len && sc->data_in_len < sc->read_len)
		zero_iov_from(xc->ring_iov, xc->ring_iovcnt, sc->data_in_len);

	int result = tcmu_xlate_result(sc, xc->sense_out);
	live_unlink(xd, xc);
	xd->inflight--;
	xd->completed++;
	if (result != TCMU_STS_OK)
		xd->check_conditions++;
	xd->done(xd, xc, ring_cmd, result);
}

void tcmu_xlate_submit(struct tcmu_xdev *xd, struct tcmu_xcmd *xc, void *ring_cmd, const uint8_t *cdb,
		       struct iovec *iov, int iovcnt, uint8_t *sense_out)
{
	struct scsi_cmd *sc = &xc->sc;
	size_t total = iov_total(iov, iovcnt);
	unsigned len = ring_cdb_len(cdb);

	memset(xc, 0, sizeof(*xc));
	xc->dev = xd;
	xc->ring_cmd = ring_cmd;
	xc->sense_out = sense_out;
	xc->ring_iov = iov;
	xc->ring_iovcnt = iovcnt;
	/* on the live list from here: command_done takes it off */
	xc->sent_tick = xd->ticks;
	xc->live_prev = xd->live_tail;
	if (xd->live_tail)
		xd->live_tail->live_next = xc;
	else
		xd->live_head = xc;
	xd->live_tail = xc;

	memcpy(sc->cdb, cdb, len);
	sc->cdb_len = (uint8_t)len;
	sc->task_attr = SCSI_TASK_SIMPLE;
	sc->lun = 0;
	sc->tag = xd->submitted;
	sc->nexus = xd->nexus;
	sc->done = command_done;
	sc->fe_priv = xc;
	if (total > UINT32_MAX)
		total = UINT32_MAX;
	/* The ring does not say which way the data flows; the CDB does, and
	 * the backstore reads it: a write consumes write_len bytes, a read
	 * fills up to read_len. One buffer serves as either. */
	sc->dir = total ? SCSI_DIR_READ | SCSI_DIR_WRITE : 0;
	sc->write_len = sc->read_len = (uint32_t)total;
	sc->iov = iov;
	sc->iovcnt = iovcnt;
	if (total && (xd->force_bounce || !ring_buffer_aligned(iov, iovcnt))) {
		size_t cap = (total + XLATE_ALIGN - 1) / XLATE_ALIGN * XLATE_ALIGN;
		xc->bounce = aligned_alloc(XLATE_ALIGN, cap);
		if (!xc->bounce) {
			sc->status = SAM_STAT_TASK_SET_FULL;
			xd->inflight++;
			xd->submitted++;
			command_done(sc);
			return;
		}
		copy_iov(iov, iovcnt, xc->bounce, total, true);
		xc->bounce_iov.iov_base = xc->bounce;
		xc->bounce_iov.iov_len = total;
		sc->iov = &xc->bounce_iov;
		sc->iovcnt = 1;
		xd->bounced++;
	}
	xd->inflight++;
	if (xd->inflight > xd->max_inflight)
		xd->max_inflight = xd->inflight;
	xd->submitted++;
	scsi_cmd_submit(sc);
}

/* ---- our own commands ---- */

struct internal_cmd {
	struct scsi_cmd sc;
	struct iovec iov;
	tcmu_xlate_internal_fn cb;
	void *arg;
};

static void internal_done(struct scsi_cmd *sc)
{
	struct internal_cmd *ic = sc->fe_priv;
	ic->cb(sc, ic->arg);
	free(ic);
}

int tcmu_xlate_internal(struct tcmu_xdev *xd, const uint8_t *cdb, void *buf, uint32_t len, bool data_out,
			tcmu_xlate_internal_fn cb, void *arg)
{
	struct internal_cmd *ic = calloc(1, sizeof(*ic));
	if (!ic)
		return -ENOMEM;
	unsigned clen = ring_cdb_len(cdb);
	memcpy(ic->sc.cdb, cdb, clen);
	ic->sc.cdb_len = (uint8_t)clen;
	ic->sc.task_attr = SCSI_TASK_SIMPLE;
	ic->sc.nexus = xd->nexus;
	ic->sc.lun = 0;
	ic->iov.iov_base = buf;
	ic->iov.iov_len = len;
	ic->sc.iov = &ic->iov;
	ic->sc.iovcnt = len ? 1 : 0;
	ic->sc.dir = len ? (data_out ? SCSI_DIR_WRITE : SCSI_DIR_READ) : 0;
	ic->sc.write_len = data_out ? len : 0;
	ic->sc.read_len = data_out ? 0 : len;
	ic->sc.done = internal_done;
	ic->sc.fe_priv = ic;
	ic->cb = cb;
	ic->arg = arg;
	scsi_cmd_submit(&ic->sc);
	return 0;
}
