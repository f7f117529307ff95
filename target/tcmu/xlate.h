/*
 * xlate.h - TCMU commands in, SCSI commands through the backstore, TCMU
 * results out. The testable half of the TCMU front end.
 *
 * Why it is split from tcmu.c: the ring-facing code needs the kernel
 * (target_core_user, a uio device, netlink); this half needs none of it.
 * It takes a CDB and the ring's iovec, builds a struct scsi_cmd for the
 * same backstore/ path the iSCSI portal uses, submits it, and when the
 * backstore calls back turns status + sense into a libtcmu result code
 * and the 96-byte sense buffer the ring carries. Unit tests drive it
 * directly (tests/unit/test_tcmu_xlate.c).
 *
 * Each TCMU device is one LU seen through one private SCSI target (LUN 0)
 * and one I_T nexus: LIO owns the real initiators, reservations and
 * REPORT LUNS, and hands us one stream of commands per device.
 *
 * Threading contract: every function runs on the worker thread that owns
 * the device (common/worker.h); the completion hook is called on that
 * same thread, possibly before tcmu_xlate_submit returns. Nothing here
 * locks.
 */
#ifndef TC_TCMU_XLATE_H
#define TC_TCMU_XLATE_H

#include "backstore/scsi.h"
#include "common/worker.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

/* The ring's sense buffer size (libtcmu 1.5.4's TCMU_SENSE_BUFFERSIZE). */
#define TCMU_XLATE_SENSE_LEN 96

struct tcmu_xdev;
struct tcmu_xcmd;

/* Called once per submitted command, on the device's worker, after the
 * sense (if any) is in the ring's sense buffer. The xcmd must not be
 * touched by the xlate layer afterwards (the ring layer frees it). */
typedef void (*tcmu_xlate_done_fn)(struct tcmu_xdev *xd, struct tcmu_xcmd *xc, void *ring_cmd, int result);

struct tcmu_xdev {
	char name[192];             /* for messages: "LIO-NAME (uioN)" */
	struct scsi_lu *lu;
	struct scsi_target *target; /* private: LUN 0 -> lu */
	struct scsi_nexus *nexus;
	tcmu_xlate_done_fn done;
	bool force_bounce;          /* copy data through an aligned buffer always */
	/* commands in the backstore, oldest first, for io_timeout: a 1 s tick
	 * declares those held too long overdue (scsi_cmd_overdue), which
	 * fences their writes before the kernel fails them at cmd_time_out */
	struct tcmu_xcmd *live_head, *live_tail;
	struct worker_tick tick;
	uint32_t ticks;
	/* counters, read by status on any thread (relaxed) */
	unsigned inflight;
	unsigned max_inflight;
	uint64_t submitted;
	uint64_t completed;
	uint64_t check_conditions;
	uint64_t bounced;
};

/* Per-command state; the ring layer gives it room (libtcmu's hm_private). */
struct tcmu_xcmd {
	struct scsi_cmd sc;
	struct tcmu_xdev *dev;
	void *ring_cmd;             /* the ring layer's command, opaque here */
	uint8_t *sense_out;         /* TCMU_XLATE_SENSE_LEN bytes, the ring's */
	struct iovec *ring_iov;     /* the ring's data buffer */
	int ring_iovcnt;
	void *bounce;               /* aligned copy when the ring's buffer is not */
	struct iovec bounce_iov;
	struct tcmu_xcmd *live_prev, *live_next;
	uint32_t sent_tick;         /* xd->ticks at submit */
};

/*
 * Prepare xd for lu: a private target mapping LUN 0 to lu and a nexus on
 * it, named after the device. 0, or -ENOMEM. Worker thread.
 */
int tcmu_xdev_open(struct tcmu_xdev *xd, struct scsi_lu *lu, const char *name, tcmu_xlate_done_fn done);
/* Release what tcmu_xdev_open made; no command may be in flight. */
void tcmu_xdev_close(struct tcmu_xdev *xd);

/*
 * Hand one ring command to the backstore. cdb: the CDB (its length comes
 * from the operation code's group, as SAM defines it); iov/iovcnt: the
 * ring's data area for this command (Data-Out for writes, room for
 * Data-In for reads; the direction is the CDB's business, which the
 * backstore knows); sense_out: where the sense for CHECK CONDITION goes.
 */
void tcmu_xlate_submit(struct tcmu_xdev *xd, struct tcmu_xcmd *xc, void *ring_cmd, const uint8_t *cdb,
		       struct iovec *iov, int iovcnt, uint8_t *sense_out);

/*
 * Run a CDB of our own (the capacity check at attach, write-cache
 * toggles on reconfig) through the same backstore path, on the device's
 * nexus. buf holds len bytes of Data-Out (data_out) or room for Data-In.
 * cb runs on this worker when the command is done; buf stays the
 * caller's. 0, or -ENOMEM (cb not called).
 */
typedef void (*tcmu_xlate_internal_fn)(struct scsi_cmd *sc, void *arg);
int tcmu_xlate_internal(struct tcmu_xdev *xd, const uint8_t *cdb, void *buf, uint32_t len, bool data_out,
			tcmu_xlate_internal_fn cb, void *arg);

/*
 * The libtcmu result for a finished SCSI command, and the sense bytes to
 * put in the ring (zero-filled to TCMU_XLATE_SENSE_LEN). Exposed for tests.
 */
int tcmu_xlate_result(const struct scsi_cmd *sc, uint8_t sense_out[TCMU_XLATE_SENSE_LEN]);

/*
 * The LUN name a cfgstring names. LIO's dev_config (and what targetcli's
 * CheckConfig passes) is "tiercache/NAME"; "tiercache/tiercache/NAME"
 * (when the admin typed the subtype into targetcli's cfgstring too) and a
 * bare "NAME" are accepted. NULL if nothing is left. Any thread.
 */
const char *tcmu_cfgstring_lun(const char *cfgstring);

#endif
