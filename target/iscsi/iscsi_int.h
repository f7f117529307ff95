/*
 * iscsi_int.h - what the files of the iSCSI portal share with each other.
 *
 * One connection (struct iscsi_conn, conn.c) lives on one worker thread for
 * its whole life. Login (login.c) turns it into a session (session.c);
 * we negotiate MaxConnections=1, so a session has exactly one connection
 * and both die together. A session owns a preallocated pool of commands
 * (struct iscsi_cmd: the SCSI command handed to the backstore, the
 * per-command R2T/Data-In state and an embedded transmit slot), so the
 * per-command path never calls malloc: data buffers come from bufpool,
 * Data-Out lands in them (straight from the socket when it is long; short
 * segments are copied once from the connection's receive stage, which
 * saves a read per PDU), and Data-In is written from them with sendmsg,
 * every response of a loop iteration in one call (conn_tx.c), or, for a READ
 * the backstore answered with a page-cached file range (scsi_cmd.data_fd),
 * its header with sendmsg and its data with sendfile.
 *
 * Transmit model: a connection has a FIFO of struct iscsi_tx. A control
 * PDU (login/text/NOP-In/TMF/logout/reject/async response) is a malloc'd
 * iscsi_tx freed when written. A command's PDUs (R2Ts, Data-Ins, SCSI
 * Response) reuse the command's embedded iscsi_tx one PDU at a time: when
 * one is fully written its sent callback builds and queues the next, so
 * StatSN order on the wire equals queue order.
 *
 * Threading: everything here runs on the owning worker thread, except the
 * session table (session.c), which login on any worker consults under a
 * mutex, and the portal counters (portal.c), which are atomics.
 */
#ifndef TC_ISCSI_INT_H
#define TC_ISCSI_INT_H

#include "backstore/scsi.h"
#include "common/worker.h"
#include "target/iscsi/chap.h"
#include "target/iscsi/param.h"
#include "target/iscsi/pdu.h"
#include "target/iscsi/portal.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/epoll.h>
#include <sys/uio.h>

#define ISCSI_QUEUE_DEPTH 128      /* non-immediate commands per session */
#define ISCSI_IMMEDIATE_SLOTS 16   /* extra slots for immediate commands */
#define ISCSI_POOL_SIZE (ISCSI_QUEUE_DEPTH + ISCSI_IMMEDIATE_SLOTS)
#define ISCSI_CMD_MAX_BUFS 4       /* x BUF_MAX: largest transfer, 64 MiB */
#define ISCSI_TX_DATA_IOV (ISCSI_CMD_MAX_BUFS + 1)
#define ISCSI_MAX_R2T 8            /* MaxOutstandingR2T we offer */
#define ISCSI_AHS_MAX 1020
#define ISCSI_TX_HIGH_WATER (64u << 20) /* stop reading above this much queued */

struct iscsi_conn;
struct iscsi_sess;

enum iscsi_tx_kind {
	ISCSI_TX_CTRL,  /* malloc'd control PDU: freed once written */
	ISCSI_TX_CMD,   /* embedded in an iscsi_cmd */
};

struct iscsi_tx {
	struct iscsi_tx *next;
	enum iscsi_tx_kind kind;
	bool queued;
	bool close_after;        /* close the connection once this is written */
	uint8_t hdr[ISCSI_BHS_LEN + ISCSI_DIGEST_LEN];
	uint32_t hdr_len;
	struct iovec data[ISCSI_TX_DATA_IOV];
	int data_iovcnt;
	uint32_t data_len;
	/* >= 0: the data segment is data_len bytes of this file at file_off
	 * (sendfile; never with a data digest), data_iovcnt is 0 */
	int file_fd;
	uint64_t file_off;
	uint8_t trailer[3 + ISCSI_DIGEST_LEN]; /* pad + data digest */
	uint32_t trailer_len;
	size_t total, sent;
	/* Called (on the worker) once the PDU is fully written. */
	void (*sent_cb)(struct iscsi_conn *c, struct iscsi_tx *tx);
	uint8_t *payload;        /* control PDUs: their data segment, after the struct */
};

enum iscsi_cmd_state {
	CMD_FREE,
	CMD_RECV_DATA,     /* waiting for immediate/unsolicited/solicited data */
	CMD_BACKSTORE,     /* submitted, waiting for done() */
	CMD_SENDING,       /* Data-In / R2T / response PDUs going out */
};

struct iscsi_r2t_slot {
	bool active;
	uint32_t ttt;
	uint32_t offset, len, received;
	uint32_t next_datasn;
	bool sent;           /* R2T PDU queued */
	uint32_t r2tsn;
};

struct iscsi_cmd {
	struct scsi_cmd sc;
	struct iscsi_tx tx;
	struct iscsi_sess *sess;
	struct iscsi_cmd *next, *prev;   /* active list or free list */
	uint16_t idx;
	enum iscsi_cmd_state state;
	bool immediate;
	bool aborted;        /* a TMF took it: drop its response */
	bool failed;         /* answer with the sense already in sc */
	bool overdue;        /* past io_timeout: answered (or its TMF let go), the
			      * backstore still holds it; freed when it is back */
	uint32_t sent_tick;  /* the connection's tick count when submitted */
	uint8_t lun_raw[8];
	uint32_t itt, cmdsn, edtl;
	/* data buffer: nbufs pooled buffers, iov describes edtl bytes */
	void *bufs[ISCSI_CMD_MAX_BUFS];
	size_t buf_req[ISCSI_CMD_MAX_BUFS];
	struct iovec iov[ISCSI_CMD_MAX_BUFS];
	int nbufs;
	/* write side */
	uint32_t received;       /* Data-Out bytes received so far */
	uint32_t unsol_expected; /* immediate + unsolicited bytes to expect */
	uint32_t unsol_received;
	uint32_t unsol_datasn;
	bool unsol_final;
	uint32_t r2t_next;       /* next offset to solicit */
	uint32_t r2tsn;
	struct iscsi_r2t_slot r2t[ISCSI_MAX_R2T];
	/* read side / response */
	uint32_t datain_off, datain_len, datasn, burst_left;
	bool status_sent;
	struct iscsi_remote_abort *remote_tok; /* another session's reset waits for it */
	uint8_t rsp_data[2 + SCSI_SENSE_MAX]; /* SenseLength + sense for the response */
};

struct iscsi_sess {
	uint8_t isid[6];
	uint16_t tsih;
	char initiator[ISCSI_NAME_MAX];
	const struct iscsi_target_cfg *tgt;   /* NULL for discovery */
	bool discovery;
	struct iscsi_params params;
	struct iscsi_conn *conn;   /* NULL once the connection is gone */
	struct worker *worker;
	struct scsi_nexus *nexus;
	atomic_int refs;
	bool in_table;
	struct iscsi_sess *tbl_next;
	/* CmdSN window */
	uint32_t exp_cmdsn;
	uint32_t max_cmdsn;
	unsigned active_nonimm;
	/* command pool */
	struct iscsi_cmd *pool;
	struct iscsi_cmd *free_list;
	unsigned nfree;
	struct iscsi_cmd active;   /* list head */
	unsigned in_backstore;     /* commands the backstore still holds */
	unsigned aborted_inflight; /* aborted ones still in the backstore */
	unsigned remote_pending;   /* resets waiting for other sessions' aborts */
	uint16_t ttt_gen;
	struct iscsi_tmf_wait *tmf_head, *tmf_tail; /* responses waiting for aborts */
};

enum iscsi_conn_state {
	CONN_LOGIN,
	CONN_FULL_FEATURE,
	CONN_CLOSING,      /* socket gone; waiting for the backstore to return commands */
};

enum iscsi_rx_phase {
	RX_BHS,
	RX_AHS,            /* AHS + header digest */
	RX_DATA,           /* data segment + pad + data digest */
};

struct iscsi_login;

struct iscsi_conn {
	struct ev_handler ev;
	enum iscsi_conn_state state;
	struct iscsi_conn *next, *prev;  /* the worker's connection list */
	char peer[64];                   /* "addr:port" for log lines */
	struct iscsi_sess *sess;
	struct iscsi_login *login;       /* during login only */
	struct iscsi_params params;      /* negotiated (copied into sess at login) */
	uint16_t cid;
	uint32_t statsn;
	bool closing_after_tx;           /* a close_after PDU is queued: read no more */
	bool draining;
	bool reading;                    /* EPOLLIN watched */
	bool writing;                    /* EPOLLOUT watched */
	unsigned in_handler;              /* nesting depth of entry points */
	struct worker_batch_end batch;   /* queued: holds one in_handler count */
	uint64_t last_rx_ms;
	uint32_t ping_ttt;               /* outstanding target ping, 0 = none */
	uint32_t ticks;                  /* 1 s ticks so far: the clock of io_timeout */
	uint64_t ping_sent_ms;
	struct worker_tick tick;
	/* receive: the socket is read into rx_stage (many PDUs per read); a
	 * long data segment is read straight into its buffer */
	uint8_t *rx_stage;
	uint32_t rx_stage_pos, rx_stage_len;
	uint32_t rx_want;                /* bytes to ask for when refilling it */
	bool rx_dry;                     /* the last read came up short */
	enum iscsi_rx_phase rx_phase;
	uint8_t rx_hdr[ISCSI_BHS_LEN + ISCSI_AHS_MAX + ISCSI_DIGEST_LEN];
	uint32_t rx_hdr_len;             /* BHS + AHS + digest expected */
	uint32_t rx_got;
	struct iovec rx_iov[ISCSI_CMD_MAX_BUFS + 2];
	struct iovec rx_view[ISCSI_CMD_MAX_BUFS + 2]; /* the data part, unadvanced */
	int rx_viewcnt;
	unsigned rx_pdus;
	int rx_iovcnt, rx_iovidx;
	size_t rx_left;
	bool rx_discard;                 /* data segment goes to the sink */
	bool rx_ignore;                  /* drop the PDU silently once read */
	uint8_t rx_reject;               /* reject it (reason) once read; 0 = no */
	uint32_t rx_dsl;
	uint8_t rx_trailer[3 + ISCSI_DIGEST_LEN];
	uint32_t rx_trailer_len;
	struct iscsi_cmd *rx_cmd;        /* command the data segment belongs to */
	struct iscsi_r2t_slot *rx_slot;  /* its R2T, NULL for unsolicited */
	char *rx_buf;                    /* control PDUs' data segment */
	size_t rx_buf_cap;
	/* text across PDUs (C bit), both directions */
	char *text_acc;
	size_t text_acc_len;
	char *text_out;
	size_t text_out_len, text_out_off;
	uint32_t text_ttt;
	/* transmit */
	struct iscsi_tx *tx_head, *tx_tail;
	size_t tx_queued_bytes;
};

/* ---- portal.c ---- */
const struct iscsi_portal_cfg *iscsi_portal_cfg(void);
/* Use cfg without listening (fuzzers and unit tests drive connections). */
void iscsi_portal_set_cfg(const struct iscsi_portal_cfg *cfg);
void iscsi_portal_conn_gone(void);
/* The same target (a reload replaces the entries, not the scsi targets). */
bool iscsi_same_target(const struct iscsi_target_cfg *a, const struct iscsi_target_cfg *b);

/* ---- conn.c ---- */
/* Take over an accepted socket on the calling worker (or no worker: tests). */
struct iscsi_conn *iscsi_conn_new(int fd);
/* Bracket work done outside the socket handler (backstore completions,
 * posted calls): the outermost leave flushes and frees a closed conn. */
void iscsi_conn_enter(struct iscsi_conn *c);
void iscsi_conn_leave(struct iscsi_conn *c);
/* Close now: stop I/O, return commands, free once the backstore is done. */
void iscsi_conn_close(struct iscsi_conn *c, const char *why);
/* Free the connection if it is closed and nothing refers to it any more. */
void iscsi_conn_maybe_free(struct iscsi_conn *c);
void iscsi_conn_drain(struct iscsi_conn *c);
bool iscsi_conn_drained(struct iscsi_conn *c);
/* Re-evaluate whether to read (tx backpressure, draining). */
void iscsi_conn_update_watch(struct iscsi_conn *c);
/* Worker-local list of connections (drain). */
struct iscsi_conn *iscsi_conn_first(void);
/* The epoll events c is watched for now (its reading and writing flags). */
static inline unsigned iscsi_conn_events(const struct iscsi_conn *c)
{
	return (c->reading ? EPOLLIN : 0) | (c->writing ? EPOLLOUT : 0);
}

/* ---- conn_tx.c ---- */
/* Queue a PDU whose header (and data iovecs) are filled; adds digests. */
void iscsi_conn_send(struct iscsi_conn *c, struct iscsi_tx *tx);
/* A control PDU with room for dlen data bytes, header zeroed. */
struct iscsi_tx *iscsi_tx_new(size_t dlen);
void iscsi_conn_flush(struct iscsi_conn *c);
/* Fill ExpCmdSN and MaxCmdSN at byte offsets 28 and 32 of a response. */
void iscsi_conn_fill_sn(struct iscsi_conn *c, uint8_t *hdr, bool advance_statsn);
/* Remove a not-yet-started tx from the queue; false if it is mid-write. */
bool iscsi_conn_unqueue(struct iscsi_conn *c, struct iscsi_tx *tx);

/* ---- conn_rx.c ---- */
#define ISCSI_RX_STAGE_SIZE 65536  /* a connection's receive stage (rx_stage) */
/* Process readable data (also what the fuzzers call). */
void iscsi_conn_on_readable(struct iscsi_conn *c);
/* Parse PDUs out of the stage, refilling it from the socket unless the
 * last read found it empty, at most a batch per call, inside an
 * enter/leave: the body of on_readable, and how the batch end resumes
 * PDUs left in the stage. */
void iscsi_conn_rx_run(struct iscsi_conn *c);
/* Get ready for the next PDU's header. */
void iscsi_conn_rx_reset(struct iscsi_conn *c);
/* Bytes read into the stage and not parsed yet. */
static inline size_t iscsi_conn_rx_staged(const struct iscsi_conn *c)
{
	return c->rx_stage_len - c->rx_stage_pos;
}

/* ---- login.c ---- */
/* May this initiator reach the target (its allow list)? */
bool iscsi_acl_allows(const struct iscsi_target_cfg *t, const char *initiator);
const struct iscsi_target_cfg *iscsi_find_target(const char *iqn);
int iscsi_login_init(struct iscsi_conn *c);
void iscsi_login_free(struct iscsi_conn *c);
void iscsi_login_pdu(struct iscsi_conn *c, const uint8_t *bhs, char *data, uint32_t dlen);
/* The connection's 1 s tick during login: judges a waiting CHAP proof when
 * its turn comes. */
void iscsi_login_tick(struct iscsi_conn *c);
/* auth_guard.c: before judging a CHAP proof from peer, how long it waits for
 * its turn (*wait_ms, 0: now); -1: too many are waiting, turn the login away. */
int iscsi_auth_guard_admit(const char *peer, uint32_t *wait_ms);
/* A CHAP proof from peer failed: whether to log it now, and how many failed
 * or were turned away unlogged since the last line. */
void iscsi_auth_guard_fail(const char *peer, bool *log_now, uint32_t *unlogged);

/* ---- session.c ---- */
struct iscsi_sess *iscsi_sess_new(struct iscsi_conn *c, const uint8_t isid[6],
				  const char *initiator,
				  const struct iscsi_target_cfg *tgt, bool discovery,
				  uint32_t cmdsn);
void iscsi_sess_put(struct iscsi_sess *s);
/* Does a session with this TSIH exist (for an add-connection login)? */
bool iscsi_sess_tsih_exists(uint16_t tsih);
/* The connection is going away: drop table entry and the conn's ref. */
void iscsi_sess_conn_gone(struct iscsi_sess *s);
/* CmdSN check for a non-immediate request: true = process it. */
bool iscsi_sess_cmdsn_accept(struct iscsi_sess *s, uint32_t cmdsn, bool immediate);
void iscsi_sess_update_max_cmdsn(struct iscsi_sess *s);
struct iscsi_cmd *iscsi_cmd_get(struct iscsi_sess *s, bool immediate);
void iscsi_cmd_put(struct iscsi_cmd *cmd);
struct iscsi_cmd *iscsi_cmd_by_itt(struct iscsi_sess *s, uint32_t itt);
/* Call fn(o, arg) under the table lock for every other normal session of
 * s's target, with a reference taken on o (the callee owns it). */
void iscsi_sess_for_others(struct iscsi_sess *s, void (*fn)(struct iscsi_sess *o, void *arg),
			   void *arg);

/* ---- cmd.c ---- */
/* Header of a SCSI Command arrived: set up where its data goes. */
void iscsi_cmd_rx_header(struct iscsi_conn *c, const uint8_t *bhs);
void iscsi_data_out_rx_header(struct iscsi_conn *c, const uint8_t *bhs);
/* Its data segment arrived (digest_ok false on a data digest error). */
void iscsi_cmd_rx_data_done(struct iscsi_conn *c, const uint8_t *bhs, bool digest_ok);
void iscsi_data_out_rx_data_done(struct iscsi_conn *c, const uint8_t *bhs, bool digest_ok);
/* Drop a command for a TMF; true if it must still come back from the backstore. */
bool iscsi_cmd_abort(struct iscsi_cmd *cmd);
/* Connection teardown: release everything not held by the backstore. */
void iscsi_cmd_release_all(struct iscsi_sess *s);
/* On the connection's tick: answer the commands the backstore has held past
 * their LU's io_timeout (scsi_cmd_overdue). */
void iscsi_cmd_overdue_tick(struct iscsi_conn *c);

/* ---- tmf.c ---- */
struct iscsi_tmf_wait;
struct iscsi_remote_abort;
/* An aborted command that another session's reset waits for came back. */
void iscsi_tmf_remote_put(struct iscsi_remote_abort *tok);
void iscsi_tmf_pdu(struct iscsi_conn *c, const uint8_t *bhs);
/* An aborted command came back from the backstore. */
void iscsi_tmf_aborted_done(struct iscsi_sess *s);
void iscsi_tmf_free_all(struct iscsi_sess *s);

/* ---- text.c ---- */
void iscsi_text_pdu(struct iscsi_conn *c, const uint8_t *bhs, char *data, uint32_t dlen);

/* ---- logout.c ---- */
void iscsi_logout_pdu(struct iscsi_conn *c, const uint8_t *bhs);

/* ---- nop.c ---- */
void iscsi_nop_out_pdu(struct iscsi_conn *c, const uint8_t *bhs, const char *data, uint32_t dlen);
void iscsi_nop_tick(struct iscsi_conn *c);

/* ---- reject.c ---- */
void iscsi_reject(struct iscsi_conn *c, uint8_t reason, const uint8_t *bhs);
/* Reject and then close the connection (protocol errors at ERL 0). */
void iscsi_reject_close(struct iscsi_conn *c, uint8_t reason, const uint8_t *bhs, const char *why);
/* Asynchronous Message "request logout" (drain); close once written if asked. */
void iscsi_async_logout_request(struct iscsi_conn *c, uint16_t wait_seconds, bool close_after);

/* ---- digest (conn.c) ---- */
uint32_t iscsi_crc32c(const void *buf, size_t len, uint32_t crc);
#define ISCSI_CRC_INIT 0xffffffffu
#define ISCSI_CRC_FINAL(c) ((c) ^ 0xffffffffu)

#endif
