/*
 * lu.h - what the backstore's files share among themselves (not a public
 * surface: front ends include scsi.h only).
 *
 * The backstore is split like LIO / SPDK: lu.c owns the objects (LU,
 * target, nexus) and unit attentions; lu_dispatch.c the opcode table and
 * the path of a CDB to its handler and of the answer back; sense.c builds
 * every sense buffer; spc.c, spc_vpd.c (INQUIRY) and spc_mode.c (mode
 * pages) answer the primary commands (SPC-4); sbc.c, sbc_rw.c and
 * sbc_prov.c the block commands (SBC-3; sbc_io.h is what those three
 * share); pr.c reservations (SPC-2 RESERVE/RELEASE and persistent
 * reservations); xcopy.c EXTENDED COPY. This header declares the state
 * they share and the SCSI constants, so no file spells a sense code or an
 * opcode as a bare number.
 *
 * Locking, in one place:
 *  - lu->mutex guards the mode parameters that are not atomics, the PR and
 *    SPC-2 reservation state, the list of nexus attachments and the CAW
 *    range list. It is never held across a bdev_submit callback boundary
 *    (bdev_submit never completes inline, but we still drop it first).
 *  - The hot path (READ/WRITE) reads only atomics: lu->resv_held,
 *    lu->caw_active, lu->wce, and the per-(nexus, LU) pending UA mask.
 *  - A command runs entirely on the worker that submitted it.
 */
#ifndef TC_BACKSTORE_LU_H
#define TC_BACKSTORE_LU_H

#include "backstore/scsi.h"

#include "bdev/bdev.h"
#include "common/endian.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------------ */
/* Opcodes (SPC-4, SBC-3)                                              */

#define OP_TEST_UNIT_READY 0x00
#define OP_REQUEST_SENSE 0x03
#define OP_READ_6 0x08
#define OP_WRITE_6 0x0a
#define OP_INQUIRY 0x12
#define OP_MODE_SELECT_6 0x15
#define OP_RESERVE_6 0x16
#define OP_RELEASE_6 0x17
#define OP_MODE_SENSE_6 0x1a
#define OP_START_STOP_UNIT 0x1b
#define OP_SEND_DIAGNOSTIC 0x1d
#define OP_PREVENT_ALLOW 0x1e
#define OP_READ_CAPACITY_10 0x25
#define OP_READ_10 0x28
#define OP_WRITE_10 0x2a
#define OP_WRITE_VERIFY_10 0x2e
#define OP_VERIFY_10 0x2f
#define OP_PREFETCH_10 0x34
#define OP_READ_DEFECT_DATA_10 0x37
#define OP_SYNC_CACHE_10 0x35
#define OP_WRITE_BUFFER 0x3b
#define OP_READ_BUFFER 0x3c
#define OP_WRITE_SAME_10 0x41
#define OP_UNMAP 0x42
#define OP_SANITIZE 0x48
#define OP_LOG_SENSE 0x4d
#define OP_MODE_SELECT_10 0x55
#define OP_RESERVE_10 0x56
#define OP_RELEASE_10 0x57
#define OP_MODE_SENSE_10 0x5a
#define OP_PR_IN 0x5e
#define OP_PR_OUT 0x5f
#define OP_EXTENDED_COPY 0x83
#define OP_RECEIVE_COPY_RESULTS 0x84
#define OP_READ_16 0x88
#define OP_COMPARE_AND_WRITE 0x89
#define OP_WRITE_16 0x8a
#define OP_ORWRITE_16 0x8b
#define OP_WRITE_VERIFY_16 0x8e
#define OP_VERIFY_16 0x8f
#define OP_PREFETCH_16 0x90
#define OP_SYNC_CACHE_16 0x91
#define OP_WRITE_SAME_16 0x93
#define OP_SERVICE_ACTION_IN_16 0x9e
#define OP_REPORT_LUNS 0xa0
#define OP_MAINTENANCE_IN 0xa3
#define OP_READ_12 0xa8
#define OP_WRITE_12 0xaa
#define OP_WRITE_VERIFY_12 0xae
#define OP_READ_DEFECT_DATA_12 0xb7
#define OP_VERIFY_12 0xaf

/* service actions */
#define SAI_READ_CAPACITY_16 0x10
#define SAI_GET_LBA_STATUS 0x12
#define MI_REPORT_TARGET_PGS 0x0a
#define MI_REPORT_SUPPORTED_OPCODES 0x0c
#define RCR_OPERATING_PARAMETERS 0x03
#define RCR_COPY_STATUS 0x00
#define SANITIZE_OVERWRITE 0x01
#define SANITIZE_BLOCK_ERASE 0x02
#define SANITIZE_CRYPTO_ERASE 0x03
#define SANITIZE_EXIT_FAILURE_MODE 0x1f

/* ------------------------------------------------------------------ */
/* Unit attention conditions, one bit each; the lowest set bit is the  */
/* one reported first (SAM-5 priority: resets before parameter news).  */

enum {
	UA_POWER_ON = 1u << 0,
	UA_LU_RESET = 1u << 1,
	UA_NEXUS_LOSS = 1u << 2,
	UA_COMMANDS_CLEARED = 1u << 3,
	UA_RESERVATIONS_PREEMPTED = 1u << 4,
	UA_RESERVATIONS_RELEASED = 1u << 5,
	UA_REGISTRATIONS_PREEMPTED = 1u << 6,
	UA_MODE_CHANGED = 1u << 7,
	UA_CAPACITY_CHANGED = 1u << 8,
	UA_LUNS_CHANGED = 1u << 9,
	UA_ALUA_CHANGED = 1u << 10, /* ASYMMETRIC ACCESS STATE CHANGED */
	UA_SPACE_SOFT = 1u << 11,   /* THIN PROVISIONING SOFT THRESHOLD REACHED */
};

/* ------------------------------------------------------------------ */
/* Objects                                                             */

#define LU_MAX_XFER_BYTES (32u << 20) /* MAXIMUM TRANSFER LENGTH, in bytes */
#define LU_MAX_UNMAP_BLOCKS 0x100000u
#define LU_MAX_UNMAP_DESCS 256u
#define LU_MAX_CAW_BLOCKS 1u         /* MAXIMUM COMPARE AND WRITE LENGTH */
#define PORT_NAME_MAX 256

struct scsi_nexus;
struct nexus_lu;

/* One persistent reservation registration (an I_T nexus and its key). */
struct pr_reg {
	struct pr_reg *next;
	uint64_t key;
	char i_port[PORT_NAME_MAX];  /* "iqn...,i,0x<isid>" */
	char t_port[PORT_NAME_MAX];  /* "target-iqn,t,0x<tpgt>" */
	uint16_t rel_port;
	bool all_tg_pt;
};

struct pr_state {
	struct pr_reg *regs;
	uint32_t generation;
	bool aptpl;
	/* the reservation: type 0 = none */
	uint8_t type;
	struct pr_reg *holder;   /* NULL for all-registrants types */
};

/*
 * A writer's or a COMPARE AND WRITE's place in the interlock (sbc.c): a
 * fast write in its worker's list of writes in flight, or an entry of
 * lu->ranges (a CAW, or a write that came while one was active).
 */
#define LU_SCAN_WORDS 4 /* bits for WORKERS_MAX workers */
struct range_lock {
	struct range_lock *next;
	struct scsi_lu *lu;
	uint64_t lba, nblocks;
	bool is_caw;
	bool granted;
	bool fast;                  /* took the lock-free path */
	bool awaited;               /* fast write a CAW counted (sbc.c) */
	bool is_fence;              /* a write its host was told failed: later
				     * overlapping writes wait for its end */
	struct range_lock *fence;   /* a fast write's fence entry in lu->ranges */
	struct scsi_cmd *cmd;       /* the command holding it (cmd->wlock) */
	struct worker *worker;      /* where to resume a deferred command */
	void (*resume)(struct range_lock *rl);
	/* set by an owner whose deferred command can end without ever
	 * reaching the device (scsi_cmd_cancel): it then runs on worker
	 * instead of resume; NULL = not cancellable */
	void (*cancelled)(struct range_lock *rl);
	union {
		struct range_lock *prev; /* fast write: in its worker's list */
		struct {                /* CAW, under lu->mutex */
			uint32_t blockers;   /* overlapping fast writes counted, still in flight */
			uint32_t scans_left; /* workers whose list is still to be looked at */
			uint64_t scanned[LU_SCAN_WORDS]; /* workers whose list was */
		} caw;
	};
};

/* One thread's counts of completed commands (lu_stats.c); slot i is worker
 * i's alone (plain stores), the last one is shared by other threads (atomic adds). */
struct lu_stat_slot {
	_Atomic uint64_t cmds[SCSI_IO_KINDS];
	_Atomic uint64_t bytes[2];
	_Atomic uint64_t sense_keys[16];
	_Atomic uint64_t busy, resv_conflicts, task_set_full, aborted;
	_Atomic uint64_t lat[SCSI_IO_KINDS][SCSI_OUTCOMES][SCSI_LAT_BUCKETS];
	_Atomic uint64_t lat_sum_ns[SCSI_IO_KINDS][SCSI_OUTCOMES];
} __attribute__((aligned(64)));

/* One worker's count of commands in flight on an LU, alone on its 64 bytes. */
#define LU_INFLIGHT_SLOTS 64
struct lu_inflight {
	atomic_uint n;
	char pad[64 - sizeof(atomic_uint)];
};

struct scsi_lu {
	char *name;
	char serial[33];
	char vendor[9];
	char product[17];
	char revision[5];
	char *state_dir;
	struct bdev *dev;
	uint32_t block_size;
	unsigned block_shift;
	uint64_t nblocks;
	bool read_only;
	uint8_t naa[8];             /* NAA 3 (locally assigned), from the serial */
	uint32_t tpg;
	uint16_t rel_port;
	/*
	 * Shared backing store (bdev_is_shared): the owner ops of dev, else
	 * NULL. Implicit ALUA across alua_groups gateways: gateway N is
	 * target port group N with relative target port N; the lock owner's
	 * group is active/optimized, the others active/non-optimized. The
	 * hot path reads owner's state (one atomic load) only when non-NULL.
	 */
	const struct bdev_owner_ops *owner;
	uint16_t alua_groups;
	/* READs served while another gateway owned the store (lu_dispatch.c) */
	_Atomic uint64_t unowned_reads;

	/* mode parameters: hot ones are atomics, the rest under mutex */
	atomic_bool wce;
	bool wce_default;           /* the configured write_cache */
	atomic_bool d_sense;
	atomic_bool swp;            /* software write protect (control page) */
	uint8_t qerr, tst, tas;
	uint8_t ie_mrie;            /* informational exceptions page */
	bool ie_dexcpt;

	pthread_mutex_t mutex;
	struct nexus_lu *attached;   /* every nexus mapping this LU */

	/* reservations: resv_held is the hot-path hint */
	atomic_bool resv_held;
	struct pr_state pr;
	struct pr_shared *prs;          /* kept alike by several gateways (pr_shared.c), else NULL */
	struct scsi_nexus *spc2_holder; /* RESERVE(6/10) holder, NULL if none */
	/* PREEMPT AND ABORTs waiting for preempted commands (pr.c): the list
	 * under mutex; pa_waiting, their number, read by every completion
	 * that takes a nexus's count to 0 (then lu_pa_poke); pa_epoch, read
	 * by every submit, moved on by each PREEMPT AND ABORT (nexus_lu) */
	struct pa_wait *pa_waits;
	atomic_uint pa_waiting;
	atomic_uint pa_epoch;

	/* COMPARE AND WRITE vs. writers, see sbc.c: written by CAWs and
	 * fences on any worker, so on a line of their own, away from what
	 * every command reads */
	_Alignas(64) atomic_uint caw_active; /* CAWs queued or running, and fences */
	struct range_lock *ranges;   /* granted + waiting, under mutex */
	/* one call per worker that looks at its fast writes for waiting
	 * CAWs; scan_posted: those in flight (under mutex) */
	struct worker_call *scan_call;
	uint64_t scan_posted[LU_SCAN_WORDS];

	/* io_timeout (lu_timeout.c): commands overdue now, and ever */
	_Atomic uint32_t io_timeout_ms; /* scsi_lu_set_io_timeout: a reload may change it */
	atomic_uint overdue_now;
	_Atomic uint64_t overdue_total;

	/* ODX tokens whose source is this LU (odx.c): while 0, writes skip
	 * looking for tokens to cancel */
	atomic_uint odx_tokens;

	/* sanitize in progress: everything else answers NOT READY */
	atomic_bool sanitizing;

	/*
	 * Thin provisioning threshold (lu_space.c). Counts are in threshold
	 * sets of 2^thr_exp blocks, as the last look found them; the monitor
	 * thread writes them, LOG SENSE and MODE SENSE read them.
	 */
	uint8_t space_warn;          /* percent used; 0: no threshold */
	uint8_t thr_exp;             /* VPD B2 THRESHOLD EXPONENT */
	atomic_bool lbpere;          /* read-write error recovery page: notify */
	atomic_bool space_known;
	_Atomic uint64_t space_pool, space_free, space_alloc; /* bytes */
	atomic_bool space_alloc_known;
	atomic_bool space_tripped;
	_Atomic uint32_t space_ua_info; /* INFORMATION of the UA: its descriptor's offset */
	bool space_err_logged;       /* monitor thread only */

	/* commands submitted to this LU and not yet completed (plus EXTENDED
	 * COPY segments that use it as source or destination): a LUN removed
	 * by a configuration reload is closed once the sum reaches zero. One
	 * padded counter per worker, so the hot path never bounces a shared
	 * cache line between cores; see lu_inflight_add. */
	struct lu_inflight inflight[LU_INFLIGHT_SLOTS];

	/* completed commands, per worker (lu_stats.c): nstat slots, the last shared */
	struct lu_stat_slot *stat;
	unsigned nstat;

	/* xcopy: registry of open LUs */
	struct scsi_lu *next_open;
};

struct tgt_map {
	uint64_t lun;
	struct scsi_lu *lu;
};

struct scsi_target {
	char *iqn;
	/* lock: the map and the nexus list. Taken at login (nexus open), on
	 * logout, and by a reload; never on the per-command path, which reads
	 * the nexus's own copy of the map. Ordered before lu->mutex. */
	pthread_mutex_t lock;
	struct tgt_map *maps;   /* sorted by lun */
	int nmaps;
	bool retired;           /* removed from the configuration: no new nexus */
	struct scsi_nexus *nexuses; /* every open nexus, linked by tgt_next */
	_Atomic uint64_t logins_refused; /* scsi_target_count_refused */
};

/* One (nexus, LU) pair: where unit attentions wait. */
#define NL_DEAD 0x80000000u
#define NL_ODD_SHIFT 15 /* the odd epoch's count; each 15 bits, far above any queue depth */
#define NL_COUNT_MASK 0x7fffu
struct nexus_lu {
	/* valid while the entry is: a nexus closes only after its commands */
	struct scsi_nexus *nx;
	struct scsi_lu *lu;
	uint64_t lun;
	atomic_uint ua;
	/* commands of this nexus on this LU (all but PERSISTENT RESERVE OUT,
	 * and an EXTENDED COPY's writes into it), from submit to completion,
	 * two counts in one word: those that came in an even and in an odd
	 * lu->pa_epoch. A PREEMPT AND ABORT moves the epoch on and waits for
	 * the preempted nexuses' count of the old one (pr.c, pr_shared.c):
	 * the commands that were there before it, not those a busy host
	 * keeps sending after. NL_DEAD is set once the nexus no longer maps
	 * the LUN (a reload, a logout): the entry then stays on lu->attached,
	 * still counted, until its last command completes and frees it
	 * (nexus_lu_put), so a command never touches freed memory and a wait
	 * still sees it. */
	atomic_uint inflight;
	struct nexus_lu *next_in_lu; /* lu->attached list, under lu->mutex */
	bool prevent;                /* PREVENT ALLOW MEDIUM REMOVAL state */
	/* lu_mode_state() as this nexus last knew it: a pending MODE
	 * PARAMETERS CHANGED that finds the parameters back at this value is
	 * dropped, since nothing changed from this nexus's point of view */
	unsigned mode_seen;
};

struct scsi_nexus {
	struct scsi_target *tgt;
	char i_port[PORT_NAME_MAX];
	char t_port[PORT_NAME_MAX];
	char initiator_name[224];
	uint8_t isid[6];
	uint16_t tpgt;
	/* The nexus's view of the target's map, sorted by lun: read and
	 * replaced only on the nexus's worker (commands look LUNs up here
	 * without a lock; a reload posts the update to that worker). */
	int nlus;
	struct nexus_lu **lus;
	struct worker *worker;          /* the thread that opened it (NULL: none) */
	struct scsi_nexus *tgt_next;    /* tgt->nexuses, under tgt->lock */
};

/* ------------------------------------------------------------------ */
/* Command dispatch                                                    */

/*
 * What a handler returns. scsi_cmd_submit completes the command in one
 * place when the answer is ready, so a handler never completes it itself:
 *  - SCSI_RC_DONE: the answer is in the command (GOOD, maybe with Data-In,
 *    or the status and sense the scsi_fail* helpers set, which return
 *    SCSI_RC_DONE so that a handler can `return scsi_fail_cdb(cmd, 2, 7);`).
 *  - SCSI_RC_PENDING: the command was handed to an asynchronous path (a
 *    bdev request, a deferred write, an EXTENDED COPY) that calls
 *    scsi_cmd_complete exactly once, maybe before the handler returns:
 *    from the hand-over on, the handler does not touch the command.
 * The sense itself stays in the command rather than in the return value
 * (as LIO's sense_reason_t carries it) because its bytes depend on the LU's
 * D_SENSE and on extras no small code holds: the field pointer of an
 * INVALID FIELD, the INFORMATION of a MISCOMPARE.
 */
enum scsi_rc {
	SCSI_RC_DONE,
	SCSI_RC_PENDING,
};

typedef enum scsi_rc (*cmd_handler)(struct scsi_cmd *cmd);

/* properties of one opcode (and service action) */
#define CMDF_NO_UA 0x01        /* runs despite a pending unit attention */
#define CMDF_UNMAPPED_OK 0x02  /* valid for a LUN that is not mapped */
#define CMDF_WRITES 0x04       /* modifies the medium (read-only, PR checks) */
#define CMDF_READS 0x08        /* reads the medium (exclusive access PR) */
#define CMDF_PR_ALLOWED 0x10   /* allowed under any reservation (SPC-4 5.13.1 table) */
#define CMDF_SA 0x20           /* service action in byte 1 bits 0..4 */
#define CMDF_SANITIZE_OK 0x40  /* allowed while a sanitize runs */
#define CMDF_RESV_SPC2_OK 0x80 /* allowed under an SPC-2 reservation held by another */

struct cmd_desc {
	uint8_t opcode;
	uint8_t sa;
	uint8_t cdb_len;
	uint8_t dir;               /* SCSI_DIR_* of the data */
	uint16_t flags;
	cmd_handler handler;
	const char *name;
	/* CDB usage data (SPC-4 REPORT SUPPORTED OPERATION CODES): bit set =
	 * field is meaningful; a set bit in the CDB outside it is reserved. */
	uint8_t usage[16];
};

const struct cmd_desc *scsi_cmd_table(size_t *n);
/* Build the table's dispatch index, once; scsi_lu_open calls it. */
void lu_dispatch_init(void);

/* ------------------------------------------------------------------ */
/* Sense (sense.c): every failure goes through here. They fill the     */
/* command only (reading the LU's D_SENSE atomic); any thread.         */

struct sense_extra {
	bool info_valid;
	uint64_t info;
	bool sksv;
	uint8_t sks[3];
};

void scsi_sense_build(struct scsi_cmd *cmd, uint8_t key, uint16_t asc_ascq,
		      const struct sense_extra *x);
/* The scsi_fail* helpers set the answer and return SCSI_RC_DONE, for a
 * handler to return; an asynchronous path ignores it and completes. */
/* CHECK CONDITION with key/asc and nothing else. */
enum scsi_rc scsi_fail(struct scsi_cmd *cmd, uint8_t key, uint16_t asc_ascq);
/* INVALID FIELD IN CDB pointing at byte/bit (bit 0..7, or -1 = no bit). */
enum scsi_rc scsi_fail_cdb(struct scsi_cmd *cmd, unsigned byte, int bit);
/* INVALID FIELD IN PARAMETER LIST pointing at byte/bit of the data. */
enum scsi_rc scsi_fail_param(struct scsi_cmd *cmd, unsigned byte, int bit);
/* key/asc with the INFORMATION field set (MISCOMPARE offset, bad LBA). */
enum scsi_rc scsi_fail_info(struct scsi_cmd *cmd, uint8_t key, uint16_t asc_ascq, uint64_t info);
/* Build sense bytes for key/asc into buf (fixed or descriptor per
 * d_sense); returns the length. Used by REQUEST SENSE. */
size_t scsi_sense_format(uint8_t *buf, size_t cap, bool d_sense, uint8_t key,
			 uint16_t asc_ascq, const struct sense_extra *x);
void scsi_cmd_good(struct scsi_cmd *cmd);
/* map a bdev -errno to status and sense */
enum scsi_rc scsi_fail_errno(struct scsi_cmd *cmd, int err, bool writing);

/*
 * Count one user of lu in or out (delta +1 / -1) on the calling worker's
 * counter. Any thread; lock-free, and uncontended on workers. An increment
 * and its decrement may land on different counters: the sum, taken in
 * wrapping unsigned arithmetic by scsi_lu_inflight, is still exact.
 */
static inline void lu_inflight_add(struct scsi_lu *lu, int delta)
{
	struct worker *w = worker_self();
	unsigned i = w ? worker_index(w) % LU_INFLIGHT_SLOTS : 0;
	if (delta > 0)
		atomic_fetch_add_explicit(&lu->inflight[i].n, 1, memory_order_relaxed);
	else
		atomic_fetch_sub_explicit(&lu->inflight[i].n, 1, memory_order_release);
}

/*
 * Exactly once, checked in debug builds (TC_DEBUG: make asan and the fuzz
 * harnesses define it). scsi_cmd_submit sets cmd->bs_once to
 * SCSI_ONCE_LIVE; scsi_cmd_complete finds it there and sets
 * SCSI_ONCE_DONE before calling done(), so a second completion (or one of
 * a command never submitted) aborts with a message naming the command,
 * where it would otherwise send a second response for memory the front
 * end may have reused. A completion that never comes is for the tests to
 * find (tests/unit/test_scsi_complete_once.c counts done() calls), and a
 * debug build says so when an LU closes with commands still counted.
 */
#define SCSI_ONCE_LIVE 0x6c697665u /* "live": submitted, not completed */
#define SCSI_ONCE_DONE 0x646f6e65u /* "done": completed once */
/* Report the broken rule for cmd and abort(). */
void scsi_cmd_once_broken(const struct scsi_cmd *cmd) __attribute__((noreturn, cold));

/* An overdue command came back (lu_timeout.c). */
void lu_overdue_back(struct scsi_lu *lu);

/* Complete the command: calls cmd->done, then drops the command's count
 * on its LU (taken by scsi_cmd_submit). Called in three places only:
 * scsi_cmd_submit, for a handler's SCSI_RC_DONE, and the two asynchronous
 * paths a handler returns SCSI_RC_PENDING for (sbc.c's sbc_io_finish,
 * xcopy.c's xc_finish). */
static inline uint64_t lu_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
void lu_stats_count(struct scsi_lu *lu, const struct scsi_cmd *cmd);
int lu_stats_init(struct scsi_lu *lu);

/* scsi_cmd_complete's rare cases: the last command of an entry no nexus
 * maps any more (frees it); a nexus's count reached 0 while a PREEMPT AND
 * ABORT waits (pr.c: answers those with nothing left to wait for). */
void nexus_lu_last_gone(struct nexus_lu *nl);
void lu_pa_poke(struct scsi_lu *lu);

/* Count a command of nl, in lu's epoch now: its count's shift, which
 * nexus_lu_put takes. */
static inline uint32_t nexus_lu_get(struct nexus_lu *nl)
{
	uint32_t shift = (atomic_load_explicit(&nl->lu->pa_epoch, memory_order_relaxed) & 1) * NL_ODD_SHIFT;
	atomic_fetch_add_explicit(&nl->inflight, 1u << shift, memory_order_relaxed);
	return shift;
}

/*
 * The command nexus_lu_get counted is done. seq_cst, and pa_waiting read
 * after it: a PREEMPT AND ABORT counts after it announced itself, so
 * either it sees this command gone or this sees it waiting (pr.c). nl may
 * be freed once the count is down, unless this was its last command; lu
 * is nl's LU, which the caller still holds.
 */
static inline void nexus_lu_put(struct scsi_lu *lu, struct nexus_lu *nl, uint32_t shift)
{
	uint32_t was = atomic_fetch_sub(&nl->inflight, 1u << shift);
	if (__builtin_expect(was == (NL_DEAD | 1u << shift), 0))
		nexus_lu_last_gone(nl);
	else if (((was >> shift) & NL_COUNT_MASK) == 1 && __builtin_expect(atomic_load(&lu->pa_waiting) != 0, 0))
		lu_pa_poke(lu);
}

static inline void scsi_cmd_complete(struct scsi_cmd *cmd)
{
	struct scsi_lu *held = cmd->held_lu;

#ifdef TC_DEBUG
	if (cmd->bs_once != SCSI_ONCE_LIVE)
		scsi_cmd_once_broken(cmd);
	cmd->bs_once = SCSI_ONCE_DONE;
#endif
	cmd->held_lu = NULL;
	if (__builtin_expect(cmd->overdue, 0))
		lu_overdue_back(cmd->lu);
	if (held)
		lu_stats_count(held, cmd);
	if (cmd->held_nl) {
		struct nexus_lu *nl = cmd->held_nl;
		cmd->held_nl = NULL;
		/* cmd->lu, not held: a read sent from the page cache moved
		 * that hold to data_fd_lu (sbc_rw.c), which keeps lu open */
		nexus_lu_put(cmd->lu, nl, cmd->held_shift);
	}
	cmd->done(cmd);
	if (held)
		lu_inflight_add(held, -1);
}

/* ------------------------------------------------------------------ */
/* Data buffer helpers (lu_dispatch.c): touch only the command; any    */
/* thread.                                                             */

/* Copy len bytes of src into the command's Data-In buffer, clipped to
 * read_len and the CDB's allocation length; sets data_in_len. */
void scsi_data_in(struct scsi_cmd *cmd, const void *src, size_t len, size_t alloc_len);
/* Copy up to len bytes of the Data-Out payload at offset into dst;
 * returns how many were available. */
size_t scsi_data_out(struct scsi_cmd *cmd, size_t off, void *dst, size_t len);
/* Total bytes in the cmd iovec. */
size_t scsi_iov_len(const struct scsi_cmd *cmd);

/* MAXIMUM WRITE SAME LENGTH in blocks: as many bytes as one transfer. */
static inline uint64_t lu_max_ws_blocks(const struct scsi_lu *lu)
{
	return LU_MAX_XFER_BYTES >> lu->block_shift;
}

/* the nexus_lu of the command (NULL if the LUN is not mapped) */
struct nexus_lu *scsi_cmd_nlu(struct scsi_cmd *cmd);

/* Establish ua on every nexus attached to lu, except skip (may be NULL).
 * Caller holds lu->mutex. */
void lu_ua_all_locked(struct scsi_lu *lu, unsigned ua, const struct scsi_nexus *skip);
/* The LU's mode parameters as one comparable word (WCE, D_SENSE, SWP). */
unsigned lu_mode_state(const struct scsi_lu *lu);
/* Establish ua on the nexuses whose initiator port is i_port. Locked. */
void lu_ua_port_locked(struct scsi_lu *lu, unsigned ua, const char *i_port, const char *t_port);
/* Commands in flight of the nexuses of i_port (and t_port, NULL: any) on
 * lu, except those of skip (nexus_lu.inflight), that came in epoch parity
 * ep (0, 1; -1: any). Locked. */
unsigned lu_port_inflight_locked(struct scsi_lu *lu, const char *i_port, const char *t_port,
				 const struct scsi_nexus *skip, int ep);
/* Move lu->pa_epoch on (lu->mutex held): the parity of the one that ends. */
int lu_pa_epoch_next_locked(struct scsi_lu *lu);
/*
 * Wait until lu_port_inflight is 0, until end_ns (lu_now_ns): true when it
 * is. Not on a worker: it sleeps.
 */
bool lu_drain_port(struct scsi_lu *lu, const char *i_port, const char *t_port, const struct scsi_nexus *skip,
		   int ep, uint64_t end_ns);

/* Take (and clear) the highest-priority pending UA of nl: its ASC, or 0.
 * Lock-free; any thread. */
uint16_t lu_ua_take(struct nexus_lu *nl);

/* Registry of open LUs, for EXTENDED COPY target descriptors: the LU
 * whose NAA designator is desig, or NULL. Any thread (takes the registry
 * lock); the LU stays valid while any target maps it. */
struct scsi_lu *lu_registry_find_naa(const uint8_t *desig, size_t len);
/* fn(lu, arg) for every open LU, under the registry lock (an LU is not
 * closed meanwhile). Not on a worker: fn may block. */
void lu_registry_each(void (*fn)(struct scsi_lu *lu, void *arg), void *arg);

/* Thin provisioning threshold (lu_space.c). */
#define LU_LBP_DESC_AVAIL 16 /* offset in the LBP mode page: available resources, armed decreasing */
#define LU_LBP_DESC_USED 24  /* used resources, armed increasing */
void lu_space_init(struct scsi_lu *lu, unsigned warn_pct);
/* The mode page 1Ch/02h for pc (MP_PC_*) into b: its length, 0 when lu has no threshold. */
size_t lu_space_mode_page(struct scsi_lu *lu, int pc, uint8_t *b);
/* The Logical Block Provisioning log page (0Ch) into b (at least 64 bytes): its length. */
size_t lu_space_log_page(struct scsi_lu *lu, uint8_t *b);

/* ------------------------------------------------------------------ */
/* Handlers, by file. Each is called by scsi_cmd_submit() on the       */
/* submitting worker after dispatch checks passed, and returns         */
/* SCSI_RC_DONE (scsi_cmd_submit completes) or SCSI_RC_PENDING (a bdev */
/* completion, or a deferred-write resume posted to the same worker,   */
/* completes the command exactly once).                                */

/* spc.c */
enum scsi_rc spc_test_unit_ready(struct scsi_cmd *cmd);
enum scsi_rc spc_report_luns(struct scsi_cmd *cmd);
enum scsi_rc spc_request_sense(struct scsi_cmd *cmd);
enum scsi_rc spc_report_supported_opcodes(struct scsi_cmd *cmd);
enum scsi_rc spc_report_target_pgs(struct scsi_cmd *cmd);
/* A media-access command on an LU whose shared backing store this gateway
 * does not own (state != OWNED): start taking ownership when it is free to
 * take, and fail the command with the NOT READY sense SPC-4 gives for the
 * port's asymmetric access state (the host retries). */
enum scsi_rc spc_alua_refuse(struct scsi_cmd *cmd, enum bdev_owner_state st);
enum scsi_rc spc_start_stop_unit(struct scsi_cmd *cmd);
enum scsi_rc spc_prevent_allow(struct scsi_cmd *cmd);
enum scsi_rc spc_send_diagnostic(struct scsi_cmd *cmd);

/* spc_vpd.c */
enum scsi_rc spc_inquiry(struct scsi_cmd *cmd);
/* Report INQUIRY data for an unmapped LUN (peripheral qualifier 3). */
enum scsi_rc spc_inquiry_unmapped(struct scsi_cmd *cmd);

/* spc_mode.c */
enum scsi_rc spc_mode_sense(struct scsi_cmd *cmd);
enum scsi_rc spc_mode_select(struct scsi_cmd *cmd);
enum scsi_rc spc_log_sense(struct scsi_cmd *cmd);

/* sbc.c */
enum scsi_rc sbc_read_capacity_10(struct scsi_cmd *cmd);
enum scsi_rc sbc_read_capacity_16(struct scsi_cmd *cmd);
enum scsi_rc sbc_sync_cache(struct scsi_cmd *cmd);
enum scsi_rc sbc_prefetch(struct scsi_cmd *cmd);
enum scsi_rc sbc_read_defect_data(struct scsi_cmd *cmd);

/* sbc_rw.c */
enum scsi_rc sbc_read(struct scsi_cmd *cmd);
enum scsi_rc sbc_write(struct scsi_cmd *cmd);
enum scsi_rc sbc_verify(struct scsi_cmd *cmd);
enum scsi_rc sbc_write_verify(struct scsi_cmd *cmd);
enum scsi_rc sbc_compare_and_write(struct scsi_cmd *cmd);
enum scsi_rc sbc_orwrite(struct scsi_cmd *cmd);

/* sbc_prov.c */
enum scsi_rc sbc_unmap(struct scsi_cmd *cmd);
enum scsi_rc sbc_write_same(struct scsi_cmd *cmd);
enum scsi_rc sbc_get_lba_status(struct scsi_cmd *cmd);
enum scsi_rc sbc_sanitize(struct scsi_cmd *cmd);

/*
 * Writers outside the SBC files (xcopy) go through the same CAW interlock
 * (sbc.c):
 * begin returns true when the write may go now; false when it was deferred
 * and rl->resume will be called on rl->worker later. end releases.
 */
bool sbc_write_begin(struct scsi_lu *lu, struct range_lock *rl, struct scsi_cmd *cmd, uint64_t lba,
		     uint64_t nblocks);
void sbc_write_end(struct scsi_lu *lu, struct range_lock *rl);
/*
 * cmd, which holds a place in the interlock (cmd->wlock), was answered as
 * failed while still in flight (scsi_cmd_overdue): from now until it ends,
 * every later writer of an overlapping range (and every CAW) waits for it,
 * so its late landing never overwrites a newer write. Its worker.
 */
void sbc_write_fence(struct scsi_cmd *cmd);

/* pr.c */
enum scsi_rc pr_in(struct scsi_cmd *cmd);
enum scsi_rc pr_out(struct scsi_cmd *cmd);
enum scsi_rc pr_reserve(struct scsi_cmd *cmd);
enum scsi_rc pr_release(struct scsi_cmd *cmd);
/* Slow path conflict check, called only when lu->resv_held: true if the
 * command must end with RESERVATION CONFLICT. */
bool pr_conflicts(struct scsi_cmd *cmd, const struct cmd_desc *d);
/* The same for access by nx to another LU (EXTENDED COPY targets). */
bool pr_conflicts_lu(struct scsi_lu *lu, struct scsi_nexus *nx, const struct cmd_desc *d);
/* load persisted state at open: 0 or -1 with err */
int pr_load(struct scsi_lu *lu, char *err, size_t errlen);
void pr_free(struct scsi_lu *lu);
/* A nexus went away: drop its SPC-2 reservation. */
void pr_nexus_gone(struct scsi_lu *lu, struct scsi_nexus *nx);
/* LU reset: SPC-2 reservations are released. */
void pr_lu_reset(struct scsi_lu *lu);

/*
 * pr_shared.c: a LU that several gateways export over a shared store
 * keeps its persistent reservations in the cluster. start: main thread,
 * at open (0, or -1 with err); nothing for another LU. stop: at close.
 * synced: false while this gateway may lack the cluster's latest state
 * (media commands are then refused as on a gateway that lost the store).
 */
int pr_shared_start(struct scsi_lu *lu, char *err, size_t errlen);
void pr_shared_stop(struct scsi_lu *lu);
bool pr_shared_synced(const struct scsi_lu *lu);

/* xcopy.c */
enum scsi_rc xcopy_extended_copy(struct scsi_cmd *cmd);
enum scsi_rc xcopy_receive_copy_results(struct scsi_cmd *cmd);
/* A nexus or an LU went away (either may be NULL): drop its copy results. */
void xcopy_forget(const struct scsi_nexus *nx, const struct scsi_lu *lu);

/* The copy managers' I/O (xcopy.c, odx.c): one request of len bytes of
 * buf (its iovec in *iov) at off on lu's device, done(req, err) with
 * req->priv = priv. */
static inline void lu_copy_io(struct scsi_lu *lu, struct bdev_req *req, struct iovec *iov, void *buf,
			      enum bdev_op op, unsigned flags, uint64_t off, uint64_t len,
			      void (*done)(struct bdev_req *, int), void *priv)
{
	req->op = op;
	req->flags = flags;
	req->offset = off;
	req->len = len;
	iov->iov_base = buf;
	iov->iov_len = len;
	req->iov = iov;
	req->iovcnt = 1;
	req->done = done;
	req->priv = priv;
	bdev_submit(lu->dev, req);
}

/* ODX (odx.c): POPULATE TOKEN, WRITE USING TOKEN, RECEIVE ROD TOKEN
 * INFORMATION; VPD page 8Fh into b (its length); every write to lu passes
 * its range to odx_write_seen at its start and end while lu has tokens,
 * which cancels those it reaches; odx_forget drops a nexus's results, or
 * an LU's results and tokens. */
enum scsi_rc odx_populate_token(struct scsi_cmd *cmd);
enum scsi_rc odx_write_using_token(struct scsi_cmd *cmd);
enum scsi_rc odx_receive_rod_token_info(struct scsi_cmd *cmd);
size_t odx_vpd_tpc(const struct scsi_lu *lu, uint8_t *b);
void odx_write_seen(struct scsi_lu *lu, uint64_t lba, uint64_t nblocks);
void odx_cancel_lu(struct scsi_lu *lu);
void odx_forget(const struct scsi_nexus *nx, const struct scsi_lu *lu);

#endif
