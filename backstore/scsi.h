/*
 * scsi.h - the one boundary between front ends and SCSI emulation.
 *
 * A front end (target/iscsi, later target/tcmu) turns what arrives on its
 * transport into a struct scsi_cmd: the CDB, the addressed LUN, the I_T
 * nexus it came on and a data buffer (the Data-Out payload for writes,
 * room for the Data-In payload for reads). It calls scsi_cmd_submit() and
 * gets the command back through cmd->done with status, sense and the number
 * of Data-In bytes produced. The backstore never parses PDUs; the front
 * end never decodes a CDB.
 *
 * Objects:
 *  - scsi_lu: a logical unit (one [lun] section) over a struct bdev.
 *  - scsi_target: an ordered set of LU mappings (LUN number -> scsi_lu),
 *    what REPORT LUNS lists. Built at startup.
 *  - scsi_nexus: an I_T nexus (initiator port x target port), created by the
 *    front end when a session logs in, destroyed on logout. Carries the
 *    identity used by reservations, persistent reservations and unit
 *    attentions.
 *
 * Threading contract:
 *  - scsi_cmd_submit: on a worker thread. done() is called on the same
 *    worker thread, possibly before scsi_cmd_submit returns.
 *  - scsi_nexus_open/close, scsi_task_mgmt: on a worker thread.
 *  - scsi_lu_open/close, scsi_target_*: main thread (startup, shutdown and
 *    configuration reload).
 */
#ifndef TC_SCSI_H
#define TC_SCSI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

struct bdev;
struct scsi_lu;
struct scsi_nexus;

/* SAM status codes */
#define SAM_STAT_GOOD 0x00
#define SAM_STAT_CHECK_CONDITION 0x02
#define SAM_STAT_CONDITION_MET 0x04
#define SAM_STAT_BUSY 0x08
#define SAM_STAT_RESERVATION_CONFLICT 0x18
#define SAM_STAT_TASK_SET_FULL 0x28
#define SAM_STAT_ACA_ACTIVE 0x30
#define SAM_STAT_TASK_ABORTED 0x40

#define SCSI_SENSE_MAX 96
#define SCSI_CDB_MAX 32

/* ---- sense keys and additional sense codes (ASC << 8 | ASCQ), for the
 * backstore and for front ends that fail a command before it reaches it ---- */
#define SK_NO_SENSE 0x0
#define SK_RECOVERED_ERROR 0x1
#define SK_NOT_READY 0x2
#define SK_MEDIUM_ERROR 0x3
#define SK_HARDWARE_ERROR 0x4
#define SK_ILLEGAL_REQUEST 0x5
#define SK_UNIT_ATTENTION 0x6
#define SK_DATA_PROTECT 0x7
#define SK_COPY_ABORTED 0xa
#define SK_ABORTED_COMMAND 0xb
#define SK_MISCOMPARE 0xe
#define ASC_NO_ADDITIONAL_SENSE 0x0000
#define ASC_LU_NOT_READY_SANITIZE 0x041b
#define ASC_LU_NOT_ACCESSIBLE_TRANSITION 0x040a  /* asymmetric access state transition */
#define ASC_LU_NOT_ACCESSIBLE_STANDBY 0x040b     /* target port in standby state */
#define ASC_LU_NOT_ACCESSIBLE_UNAVAILABLE 0x040c /* target port in unavailable state */
#define ASC_WRITE_ERROR 0x0c00
#define ASC_INVALID_FIELD_IN_IU 0x0e03
#define ASC_UNRECOVERED_READ_ERROR 0x1100
#define ASC_MISCOMPARE_DURING_VERIFY 0x1d00
#define ASC_PARAM_LIST_LENGTH_ERROR 0x1a00
#define ASC_INVALID_OPCODE 0x2000
#define ASC_LBA_OUT_OF_RANGE 0x2100
#define ASC_INVALID_FIELD_IN_CDB 0x2400
#define ASC_LU_NOT_SUPPORTED 0x2500
#define ASC_INVALID_FIELD_IN_PARAM_LIST 0x2600
#define ASC_TOO_MANY_TARGET_DESCRIPTORS 0x2606
#define ASC_UNSUPPORTED_TARGET_DESC_TYPE 0x2607
#define ASC_TOO_MANY_SEGMENT_DESCRIPTORS 0x2608
#define ASC_UNSUPPORTED_SEGMENT_DESC_TYPE 0x2609
#define ASC_WRITE_PROTECTED 0x2700
#define ASC_POWER_ON_RESET 0x2900
#define ASC_BUS_DEVICE_RESET 0x2903
#define ASC_I_T_NEXUS_LOSS 0x2907
#define ASC_MODE_PARAMETERS_CHANGED 0x2a01
#define ASC_RESERVATIONS_PREEMPTED 0x2a03
#define ASC_RESERVATIONS_RELEASED 0x2a04
#define ASC_REGISTRATIONS_PREEMPTED 0x2a05
#define ASC_CAPACITY_DATA_CHANGED 0x2a09
#define ASC_ASYMMETRIC_ACCESS_STATE_CHANGED 0x2a06
#define ASC_COMMANDS_CLEARED_BY_ANOTHER 0x2f00
#define ASC_SAVING_PARAMS_NOT_SUPPORTED 0x3900
#define ASC_MEDIUM_REMOVAL_PREVENTED 0x5302
#define ASC_REPORTED_LUNS_CHANGED 0x3f0e
#define ASC_THIN_PROV_SOFT_THRESHOLD 0x3807
#define ASC_INTERNAL_TARGET_FAILURE 0x4400
#define ASC_INSUFFICIENT_REGISTRATION_RESOURCES 0x5504
#define ASC_COPY_TARGET_DEVICE_NOT_REACHABLE 0x0d02
#define ASC_SPACE_ALLOCATION_FAILED 0x2707
#define ASC_UNREACHABLE_COPY_TARGET 0x0804
#define ASC_INVALID_RELEASE_OF_PR 0x2604
#define ASC_DATA_PHASE_CRC_ERROR 0x4701     /* iSCSI data digest error */
#define ASC_DATA_PHASE_ERROR 0x4b00
#define ASC_TOO_MUCH_WRITE_DATA 0x4b02
#define ASC_DATA_OFFSET_ERROR 0x4b05
#define ASC_COMMAND_TIMEOUT_DURING_PROCESSING 0x2e02

/*
 * The length of a CDB, from its operation code (SPC-4 4.2.5.1): the group
 * code gives 6, 10, 12 or 16 bytes, the reserved group 3 counting as 12
 * and the vendor-specific groups 6 and 7 as 10 (the sizes Linux gives
 * them, so TCMU's ring holds exactly this many); a variable-length CDB
 * (7Fh) is 8 + its ADDITIONAL CDB LENGTH (byte 7), and may pass
 * SCSI_CDB_MAX. Both front ends use this one rule. cdb holds 8 bytes.
 */
static inline unsigned scsi_cdb_len(const uint8_t *cdb)
{
	if (cdb[0] == 0x7f)
		return 8u + cdb[7];
	switch (cdb[0] >> 5) {
	case 0: return 6;
	case 3:
	case 5: return 12;
	case 4: return 16;
	default: return 10;
	}
}

/* Task attributes (SAM-5), as carried by iSCSI's ATTR field. */
enum scsi_task_attr {
	SCSI_TASK_UNTAGGED = 0,
	SCSI_TASK_SIMPLE = 1,
	SCSI_TASK_ORDERED = 2,
	SCSI_TASK_HEAD_OF_QUEUE = 3,
	SCSI_TASK_ACA = 4,
};

/* Data direction the initiator declared (iSCSI R/W bits). */
#define SCSI_DIR_READ 0x1
#define SCSI_DIR_WRITE 0x2

struct scsi_cmd {
	/* --- filled by the front end --- */
	uint8_t cdb[SCSI_CDB_MAX];
	uint8_t cdb_len;
	uint8_t task_attr;
	uint8_t dir;              /* SCSI_DIR_* bits */
	uint64_t lun;             /* LUN number as addressed (flat, 0..255+) */
	uint64_t tag;             /* Initiator Task Tag, for task management */
	struct scsi_nexus *nexus;
	/*
	 * Data buffer. For writes: the Data-Out payload, write_len bytes.
	 * For reads: room for read_len bytes (the initiator's expected
	 * Data-In length); the backstore fills from the start.
	 */
	struct iovec *iov;
	int iovcnt;
	uint32_t write_len;
	uint32_t read_len;
	void (*done)(struct scsi_cmd *cmd);
	void *fe_priv;            /* front end's */
	/*
	 * The front end can send Data-In straight from a file (sendfile):
	 * then it sets data_fd = -1, and a READ whose data all sits in the
	 * page cache of a buffered file LU may complete without reading,
	 * leaving data_fd >= 0: the Data-In is data_in_len bytes of that file
	 * from data_fd_off, and iov is untouched. Front ends that leave this
	 * false never see data_fd set.
	 */
	bool fe_data_fd;

	/* --- filled by the backstore before done() --- */
	uint8_t status;           /* SAM_STAT_* */
	uint8_t sense_len;
	uint8_t sense[SCSI_SENSE_MAX];
	/* Bytes of Data-In produced (<= read_len). The front end computes
	 * the residual from what the CDB asked for via data_len_cdb. */
	uint32_t data_in_len;
	int data_fd;              /* see fe_data_fd */
	uint64_t data_fd_off;
	struct scsi_lu *data_fd_lu; /* held until scsi_cmd_data_sent: the fd stays open */
	/* Transfer length the CDB itself asks for in bytes (for residual
	 * over/underflow against the iSCSI expected length); 0 = none. */
	uint32_t cdb_xfer_len;

	/* --- backstore private, untouched by front ends --- */
	struct scsi_lu *lu;
	struct scsi_lu *held_lu;  /* counted in lu->inflight until completion */
	struct nexus_lu *held_nl; /* counted in its inflight until completion */
	uint32_t held_shift;      /* in this count of it (nexus_lu_get) */
	uint32_t bs_once;         /* debug builds: in flight or completed (lu.h) */
	struct range_lock *wlock; /* its place in the write interlock, while it has one */
	bool overdue;             /* answered by the front end already (scsi_cmd_overdue) */
	bool unowned;             /* a read of a shared store this gateway does not own (lu_dispatch.c) */
	uint8_t outcome;          /* how the device served it: the worst BDEV_OUT_* of its requests */
	uint64_t start_ns;        /* submitted (CLOCK_MONOTONIC), for the latency histograms */
	void *bs_priv;
	uint64_t bs_scratch[52];
};

/* ---- logical units ---- */

struct scsi_lu_config {
	const char *name;          /* [lun NAME] */
	const char *serial;        /* unit serial number (VPD 0x80), <= 32 chars */
	const char *state_dir;     /* where PR state persists; NULL = none */
	uint32_t block_size;       /* 512 or 4096 */
	bool write_cache;          /* initial WCE */
	bool read_only;
	const char *vendor;        /* INQUIRY vendor, <= 8 chars ("TIERCACH") */
	const char *product;       /* <= 16 chars */
	const char *revision;      /* <= 4 chars */
	uint32_t target_port_group; /* for REPORT TARGET PORT GROUPS / VPD 83 */
	uint16_t rel_port_id;      /* relative target port identifier */
	/*
	 * Gateways exporting this LU over a shared backing store (its bdev
	 * has owner ops, bdev_is_shared): REPORT TARGET PORT GROUPS lists
	 * groups 1..alua_groups, gateway N being port group N with relative
	 * target port N (so target_port_group and rel_port_id are this
	 * gateway's N). 0 or 1 with a shared bdev: this gateway's group only.
	 */
	uint16_t alua_groups;
	/* thin provisioning soft threshold: percent of space used (the
	 * backing store's pool, or the LU's own allocation) at which hosts
	 * get THIN PROVISIONING SOFT THRESHOLD REACHED; 0 = none */
	unsigned space_warn;
	/* a command the backing store keeps longer is answered as failed
	 * (scsi_cmd_overdue); 0 = never */
	uint32_t io_timeout_ms;
};

/*
 * Create an LU over dev (which it then owns). NULL with a sentence in err on
 * failure (e.g. unreadable persistent reservation state).
 */
struct scsi_lu *scsi_lu_open(const struct scsi_lu_config *cfg, struct bdev *dev,
			     char *err, size_t errlen);
void scsi_lu_close(struct scsi_lu *lu);
const char *scsi_lu_name(const struct scsi_lu *lu);
/* The device under lu now holds bytes (a resized RBD image; any thread):
 * the LU takes the new block count and every I_T nexus gets the CAPACITY
 * DATA HAS CHANGED unit attention (SBC-3 4.6). */
void scsi_lu_set_capacity(struct scsi_lu *lu, uint64_t bytes);

/* An LU over a shared backing store (bdev_is_shared): this gateway's view
 * of the ownership, for status. false for any other LU. Any thread. */
struct scsi_lu_ownership {
	unsigned state;            /* enum bdev_owner_state (bdev/bdev.h) */
	uint64_t generation;       /* when OWNED */
	uint32_t port_group;       /* this gateway's target port group */
	uint32_t owner_port_group; /* the owner's, 0 = unknown */
	unsigned gateways;
	uint64_t unowned_reads;    /* reads served while another gateway owned it */
};
bool scsi_lu_ownership(const struct scsi_lu *lu, struct scsi_lu_ownership *out);

/*
 * The space under an LU as last looked at (lu_space.c): the pool its
 * backing store allocates from and the LU's own allocation, in percent
 * (-1 when unknown), the threshold (0 = none) and whether it is passed.
 * false when nobody has looked yet or the device cannot tell. Any thread.
 */
struct scsi_lu_space {
	uint64_t pool_bytes, pool_free, alloc;
	int pool_used_pct, alloc_pct;
	unsigned warn_pct;
	bool warning;
};
bool scsi_lu_space(const struct scsi_lu *lu, struct scsi_lu_space *out);
/*
 * Look at every open LU's space every interval_s seconds on a thread of
 * its own (statvfs and the like may block on a sick filesystem, which
 * must not stall a worker), and raise the soft threshold's unit attention
 * when one passes it. Main thread; stop joins the thread.
 */
int scsi_space_monitor_start(unsigned interval_s);
void scsi_space_monitor_stop(void);
/* One look at lu now (the monitor's step; tests). Not on a worker. */
void scsi_lu_space_poll(struct scsi_lu *lu);

/* ---- targets: LUN maps ---- */

struct scsi_target;

struct scsi_target *scsi_target_new(const char *iqn);
/* Map lu as lun; the target does not own the lu. 0 or -EEXIST. */
int scsi_target_map(struct scsi_target *t, uint64_t lun, struct scsi_lu *lu);
void scsi_target_free(struct scsi_target *t);
const char *scsi_target_name(const struct scsi_target *t);
/* For metrics, any thread: a login to t was refused (the front end counts
 * it); t's open sessions (I_T nexuses) and refused logins so far. */
void scsi_target_count_refused(struct scsi_target *t);
void scsi_target_counts(struct scsi_target *t, unsigned *sessions, uint64_t *refused);

/*
 * Configuration reload (main thread, workers running). scsi_target_unmap
 * removes lun from the map (0 or -ENOENT); scsi_target_retire empties the
 * map and refuses new nexuses (a login to it fails). Neither reaches the
 * open nexuses by itself: scsi_target_publish_start then brings every nexus of t
 * up to date on its own worker - new LUNs appear (with a POWER ON unit
 * attention), removed ones answer LOGICAL UNIT NOT SUPPORTED, and the
 * nexuses that keep LUNs get REPORTED LUNS DATA HAS CHANGED - and returns
 * once every worker has done so. From then on no new command reaches an
 * LU that no map holds; scsi_lu_inflight tells when the ones already
 * submitted are done, and the LU can be closed.
 */
int scsi_target_unmap(struct scsi_target *t, uint64_t lun);
void scsi_target_retire(struct scsi_target *t);
/* Post the update to every worker; returns a handle to poll. NULL on ENOMEM. */
struct scsi_publish;
struct scsi_publish *scsi_target_publish_start(struct scsi_target *const *t, int nt);
/* true once every worker has applied it; frees the handle then. */
bool scsi_target_publish_done(struct scsi_publish *p);
/* Open nexuses of t (a retired target is gone once this is 0). */
int scsi_target_nexus_count(struct scsi_target *t);
/* Commands in flight on lu. */
unsigned scsi_lu_inflight(struct scsi_lu *lu);

/* ---- I_T nexus ---- */

/*
 * initiator_name: the iSCSI initiator name; isid: the 6-byte ISID;
 * tpgt: target portal group tag. The initiator port name used by SPC
 * (TransportID) is "<initiator_name>,i,0x<isid hex>".
 */
struct scsi_nexus *scsi_nexus_open(struct scsi_target *t, const char *initiator_name,
				   const uint8_t isid[6], uint16_t tpgt);
void scsi_nexus_close(struct scsi_nexus *nx);

/* ---- commands ---- */

void scsi_cmd_submit(struct scsi_cmd *cmd);
/*
 * A front end that got Data-In as data_fd calls this once the data has
 * been written out or dropped (any later time on the same worker; more
 * calls, or calls for other commands, do nothing): until then the LU
 * counts the command as in flight, so a reload removing it waits and the
 * file stays open.
 */
void scsi_cmd_data_sent(struct scsi_cmd *cmd);

/*
 * The front end has waited age_ms for cmd, which the backstore still holds
 * (submitted, done() not called yet), and it is on the command's worker.
 * While age_ms is within the LU's io_timeout, nothing happens: false.
 * Past it, the command is overdue: true. The front end then answers the
 * host at once (CHECK CONDITION with scsi_cmd_overdue_sense), or, if a
 * task management function aborted the command, counts it as ended for
 * that function; either way it keeps the command and its buffers, since
 * the device may still read or fill them, until done() comes (it still
 * will, exactly once: its status is then dropped). From now until then,
 * a later write to an overlapping range, and a COMPARE AND WRITE, waits
 * for this command: a late landing never overwrites newer data.
 */
bool scsi_cmd_overdue(struct scsi_cmd *cmd, uint64_t age_ms);
/* Whether io_timeout applies to cmd at all (it never turns overdue if not). */
bool scsi_cmd_timed(const struct scsi_cmd *cmd);
/*
 * A task management function aborts cmd, which the backstore holds; on the
 * command's worker. If cmd is still waiting for its turn (a WRITE or a
 * COMPARE AND WRITE deferred in the write interlock behind a CAW or a
 * fence) and so has sent nothing to the device, it leaves the queue and
 * ends at once: true, and done() comes on this worker (posted, never from
 * inside this call) with ABORTED COMMAND, unless its turn came in the
 * meantime (then it runs as usual). Otherwise false: the device has it (or
 * it is about to run) and done() comes when the device answers. Either way
 * done() comes exactly once; call this at most once per command.
 */
bool scsi_cmd_cancel(struct scsi_cmd *cmd);
/* The sense of an overdue command (ABORTED COMMAND, COMMAND TIMEOUT DURING
 * PROCESSING) in the LU's format: its length. */
size_t scsi_cmd_overdue_sense(const struct scsi_cmd *cmd, uint8_t *buf, size_t cap);
/*
 * Per-LU statistics (lu_stats.c), for metrics: counted when a command
 * completes, by the completing worker in a slot of its own (no lock, no
 * shared cache line on the command path), summed by scsi_lu_stats on any
 * thread. Kinds by opcode: READ(6/10/12/16), WRITE(6/10/12/16), WRITE AND
 * VERIFY, WRITE SAME and COMPARE AND WRITE are reads and writes; the rest
 * "other". Outcomes of reads and writes come from the device (a cache
 * volume says hit, partial, miss or bypass; any other device is the
 * backing store); other commands have none. Latency is from submit to
 * completion, in buckets whose upper bounds are scsi_lat_bound_ns(i).
 */
enum scsi_io_kind { SCSI_IO_READ, SCSI_IO_WRITE, SCSI_IO_OTHER, SCSI_IO_KINDS };
enum scsi_outcome { SCSI_OUT_HIT, SCSI_OUT_PARTIAL, SCSI_OUT_MISS, SCSI_OUT_BYPASS, SCSI_OUT_BACKING,
		    SCSI_OUT_NONE, SCSI_OUTCOMES };
#define SCSI_LAT_BUCKETS 16 /* 25 us, 50 us, ... doubling, 409.6 ms; the last one +Inf */
static inline uint64_t scsi_lat_bound_ns(unsigned i) { return 25000ull << i; }
struct scsi_lu_stats {
	uint64_t cmds[SCSI_IO_KINDS];
	uint64_t bytes[2];                  /* read, written */
	uint64_t sense_keys[16];            /* CHECK CONDITIONs by sense key */
	uint64_t busy, resv_conflicts, task_set_full, aborted; /* other statuses */
	uint64_t lat[SCSI_IO_KINDS][SCSI_OUTCOMES][SCSI_LAT_BUCKETS]; /* per bucket, not cumulative */
	uint64_t lat_sum_ns[SCSI_IO_KINDS][SCSI_OUTCOMES];
	uint64_t inflight;
	int resv_synced;                    /* reservations kept in the cluster: 1 this copy is the latest, 0 it
					     * may not be (media commands wait); -1 kept here alone */
};
const char *scsi_io_kind_name(enum scsi_io_kind k);  /* "read", "write", "other" */
const char *scsi_outcome_name(enum scsi_outcome o);  /* "hit", ..., "backing", "none" */
void scsi_lu_stats(const struct scsi_lu *lu, struct scsi_lu_stats *out);

/* Commands of lu past io_timeout now, and since it opened (status). */
struct scsi_lu_overdue {
	uint32_t io_timeout_ms;
	uint64_t now, total;
};
void scsi_lu_overdue(const struct scsi_lu *lu, struct scsi_lu_overdue *out);
/* A new io_timeout (0 = never), a reload's: each command is measured
 * against it at its next look, those in flight too. Any thread. LIO's
 * cmd_time_out of a TCMU device keeps its value until the device is set
 * up again. */
void scsi_lu_set_io_timeout(struct scsi_lu *lu, uint32_t io_timeout_ms);

/* ---- task management (SAM-5), after the front end has dealt with its
 * own queued commands. Establishes the unit attentions the standard asks
 * for and clears reservations where required, and returns the service
 * response. The values are SAM-5's, the ones iSCSI carries in the Task
 * Management Function Response (RFC 7143 11.6.1). ---- */
enum scsi_tmf {
	SCSI_TMF_ABORT_TASK = 1,
	SCSI_TMF_ABORT_TASK_SET = 2,
	SCSI_TMF_CLEAR_ACA = 3,
	SCSI_TMF_CLEAR_TASK_SET = 4,
	SCSI_TMF_LOGICAL_UNIT_RESET = 5,
	SCSI_TMF_TARGET_WARM_RESET = 6,
	SCSI_TMF_TARGET_COLD_RESET = 7,
};
enum scsi_tmf_response {
	SCSI_TMF_RSP_COMPLETE = 0,
	SCSI_TMF_RSP_NO_TASK = 1,
	SCSI_TMF_RSP_NO_LUN = 2,
	SCSI_TMF_RSP_NOT_SUPPORTED = 5,
};
enum scsi_tmf_response scsi_task_mgmt(struct scsi_nexus *nx, enum scsi_tmf fn, uint64_t lun);

/* Does the nexus's target map this LUN? (task management, REPORT LUNS) */
bool scsi_nexus_has_lun(struct scsi_nexus *nx, uint64_t lun);

/* ---- sense helpers, shared by front ends that must fail a command
 * before it reaches the backstore (e.g. a data digest error). ---- */
void scsi_cmd_set_sense(struct scsi_cmd *cmd, uint8_t key, uint16_t asc_ascq);

#endif
