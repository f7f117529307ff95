/*
 * pdu.h - the iSCSI wire format (RFC 7143 section 11), declared once.
 *
 * Every PDU starts with a 48-byte Basic Header Segment (BHS). Its first
 * 20 bytes are common (opcode, flags, lengths, LUN, Initiator Task Tag);
 * the remaining 28 bytes are laid out per opcode. Each layout below is a
 * packed struct of byte arrays - never host integers - so the compiler
 * cannot pad or reorder, and every multi-byte field is read and written
 * through the big-endian helpers at the end of this file. A
 * _Static_assert pins each view at exactly 48 bytes.
 *
 * A PDU on the wire: BHS | AHS (TotalAHSLength words) | header digest |
 * data segment | pad to 4 | data digest. Digests are CRC32C (ISA-L
 * crc32_iscsi) and travel least-significant byte first.
 *
 * Header only; no state. Usable from any thread.
 */
#ifndef TC_ISCSI_PDU_H
#define TC_ISCSI_PDU_H

#include <stdint.h>
#include <string.h>

#include "common/endian.h"

#define ISCSI_BHS_LEN 48
#define ISCSI_DIGEST_LEN 4
#define ISCSI_RSVD_TAG 0xffffffffu

/* Opcodes, initiator to target */
#define ISCSI_OP_NOP_OUT 0x00
#define ISCSI_OP_SCSI_CMD 0x01
#define ISCSI_OP_TMF_REQ 0x02
#define ISCSI_OP_LOGIN_REQ 0x03
#define ISCSI_OP_TEXT_REQ 0x04
#define ISCSI_OP_DATA_OUT 0x05
#define ISCSI_OP_LOGOUT_REQ 0x06
#define ISCSI_OP_SNACK 0x10
/* Opcodes, target to initiator */
#define ISCSI_OP_NOP_IN 0x20
#define ISCSI_OP_SCSI_RSP 0x21
#define ISCSI_OP_TMF_RSP 0x22
#define ISCSI_OP_LOGIN_RSP 0x23
#define ISCSI_OP_TEXT_RSP 0x24
#define ISCSI_OP_DATA_IN 0x25
#define ISCSI_OP_LOGOUT_RSP 0x26
#define ISCSI_OP_R2T 0x31
#define ISCSI_OP_ASYNC 0x32
#define ISCSI_OP_REJECT 0x3f

#define ISCSI_OPCODE_MASK 0x3f
#define ISCSI_IMMEDIATE 0x40 /* byte 0: I bit */
#define ISCSI_FLAG_FINAL 0x80 /* byte 1: F bit */

/* SCSI Command flags (byte 1) */
#define ISCSI_CMD_READ 0x40
#define ISCSI_CMD_WRITE 0x20
#define ISCSI_CMD_ATTR_MASK 0x07

/* SCSI Response / Data-In flags (byte 1) */
#define ISCSI_RSP_BIDI_OVERFLOW 0x10
#define ISCSI_RSP_BIDI_UNDERFLOW 0x08
#define ISCSI_RSP_OVERFLOW 0x04
#define ISCSI_RSP_UNDERFLOW 0x02
#define ISCSI_DATAIN_ACK 0x40
#define ISCSI_DATAIN_STATUS 0x01

/* Login flags (byte 1) */
#define ISCSI_LOGIN_TRANSIT 0x80
#define ISCSI_LOGIN_CONTINUE 0x40
#define ISCSI_LOGIN_CSG(f) (((f) >> 2) & 3)
#define ISCSI_LOGIN_NSG(f) ((f) & 3)
#define ISCSI_STAGE_SECURITY 0
#define ISCSI_STAGE_OPERATIONAL 1
#define ISCSI_STAGE_FULL_FEATURE 3

/* Text flags (byte 1) */
#define ISCSI_TEXT_CONTINUE 0x40

/* Login status: class << 8 | detail (RFC 7143 11.13.5) */
#define ISCSI_LOGIN_OK 0x0000
#define ISCSI_LOGIN_TARGET_MOVED_TEMP 0x0101
#define ISCSI_LOGIN_INITIATOR_ERROR 0x0200
#define ISCSI_LOGIN_AUTH_FAILED 0x0201
#define ISCSI_LOGIN_AUTHORIZATION_FAILED 0x0202
#define ISCSI_LOGIN_NOT_FOUND 0x0203
#define ISCSI_LOGIN_TARGET_REMOVED 0x0204
#define ISCSI_LOGIN_UNSUPPORTED_VERSION 0x0205
#define ISCSI_LOGIN_TOO_MANY_CONNECTIONS 0x0206
#define ISCSI_LOGIN_MISSING_PARAMETER 0x0207
#define ISCSI_LOGIN_CANT_INCLUDE_IN_SESSION 0x0208
#define ISCSI_LOGIN_SESSION_TYPE_UNSUPPORTED 0x0209
#define ISCSI_LOGIN_SESSION_DOES_NOT_EXIST 0x020a
#define ISCSI_LOGIN_INVALID_DURING_LOGIN 0x020b
#define ISCSI_LOGIN_TARGET_ERROR 0x0300
#define ISCSI_LOGIN_SERVICE_UNAVAILABLE 0x0301
#define ISCSI_LOGIN_OUT_OF_RESOURCES 0x0302

/* Task management functions and responses (11.5.1, 11.6.1) */
#define ISCSI_TMF_FUNC_MASK 0x7f
#define ISCSI_TMF_ABORT_TASK 1
#define ISCSI_TMF_ABORT_TASK_SET 2
#define ISCSI_TMF_CLEAR_ACA 3
#define ISCSI_TMF_CLEAR_TASK_SET 4
#define ISCSI_TMF_LOGICAL_UNIT_RESET 5
#define ISCSI_TMF_TARGET_WARM_RESET 6
#define ISCSI_TMF_TARGET_COLD_RESET 7
#define ISCSI_TMF_TASK_REASSIGN 8
#define ISCSI_TMF_RSP_COMPLETE 0
#define ISCSI_TMF_RSP_NO_TASK 1
#define ISCSI_TMF_RSP_NO_LUN 2
#define ISCSI_TMF_RSP_TASK_ALLEGIANT 3
#define ISCSI_TMF_RSP_NO_REASSIGN 4
#define ISCSI_TMF_RSP_NOT_SUPPORTED 5
#define ISCSI_TMF_RSP_AUTH_FAILED 6
#define ISCSI_TMF_RSP_REJECTED 255

/* Logout reasons and responses (11.14.1, 11.15.1) */
#define ISCSI_LOGOUT_REASON_MASK 0x7f
#define ISCSI_LOGOUT_CLOSE_SESSION 0
#define ISCSI_LOGOUT_CLOSE_CONNECTION 1
#define ISCSI_LOGOUT_REMOVE_FOR_RECOVERY 2
#define ISCSI_LOGOUT_RSP_OK 0
#define ISCSI_LOGOUT_RSP_CID_NOT_FOUND 1
#define ISCSI_LOGOUT_RSP_NO_RECOVERY 2
#define ISCSI_LOGOUT_RSP_CLEANUP_FAILED 3

/* Reject reasons (11.17.1) */
#define ISCSI_REJECT_DATA_DIGEST 0x02
#define ISCSI_REJECT_SNACK 0x03
#define ISCSI_REJECT_PROTOCOL_ERROR 0x04
#define ISCSI_REJECT_CMD_NOT_SUPPORTED 0x05
#define ISCSI_REJECT_IMMEDIATE_CMD 0x06
#define ISCSI_REJECT_TASK_IN_PROGRESS 0x07
#define ISCSI_REJECT_INVALID_DATA_ACK 0x08
#define ISCSI_REJECT_INVALID_PDU_FIELD 0x09
#define ISCSI_REJECT_LONG_OP 0x0a
#define ISCSI_REJECT_WAITING_FOR_LOGOUT 0x0c

/* Asynchronous events (11.9.1) */
#define ISCSI_ASYNC_SCSI_EVENT 0
#define ISCSI_ASYNC_REQUEST_LOGOUT 1
#define ISCSI_ASYNC_DROP_CONNECTION 2
#define ISCSI_ASYNC_DROP_SESSION 3

/* ---- the common part of every BHS ---- */
struct iscsi_bhs {
	uint8_t opcode;     /* I bit | opcode */
	uint8_t flags;
	uint8_t spec2[2];
	uint8_t total_ahs_len; /* in 4-byte words */
	uint8_t dsl[3];     /* DataSegmentLength */
	uint8_t lun[8];
	uint8_t itt[4];
	uint8_t spec20[28];
} __attribute__((packed));

struct iscsi_scsi_cmd_hdr {
	uint8_t opcode, flags, rsvd2[2];
	uint8_t total_ahs_len, dsl[3];
	uint8_t lun[8];
	uint8_t itt[4];
	uint8_t edtl[4];    /* Expected Data Transfer Length */
	uint8_t cmdsn[4];
	uint8_t exp_statsn[4];
	uint8_t cdb[16];
} __attribute__((packed));

struct iscsi_scsi_rsp_hdr {
	uint8_t opcode, flags, response, status;
	uint8_t total_ahs_len, dsl[3];
	uint8_t rsvd8[8];
	uint8_t itt[4];
	uint8_t snack_tag[4];
	uint8_t statsn[4];
	uint8_t exp_cmdsn[4];
	uint8_t max_cmdsn[4];
	uint8_t exp_datasn[4];
	uint8_t bidi_residual[4];
	uint8_t residual[4];
} __attribute__((packed));

struct iscsi_tmf_req_hdr {
	uint8_t opcode, function, rsvd2[2];
	uint8_t total_ahs_len, dsl[3];
	uint8_t lun[8];
	uint8_t itt[4];
	uint8_t ref_itt[4]; /* Referenced Task Tag */
	uint8_t cmdsn[4];
	uint8_t exp_statsn[4];
	uint8_t ref_cmdsn[4];
	uint8_t exp_datasn[4];
	uint8_t rsvd40[8];
} __attribute__((packed));

struct iscsi_tmf_rsp_hdr {
	uint8_t opcode, flags, response, rsvd3;
	uint8_t total_ahs_len, dsl[3];
	uint8_t rsvd8[8];
	uint8_t itt[4];
	uint8_t rsvd20[4];
	uint8_t statsn[4];
	uint8_t exp_cmdsn[4];
	uint8_t max_cmdsn[4];
	uint8_t rsvd36[12];
} __attribute__((packed));

struct iscsi_data_out_hdr {
	uint8_t opcode, flags, rsvd2[2];
	uint8_t total_ahs_len, dsl[3];
	uint8_t lun[8];
	uint8_t itt[4];
	uint8_t ttt[4];
	uint8_t rsvd24[4];
	uint8_t exp_statsn[4];
	uint8_t rsvd32[4];
	uint8_t datasn[4];
	uint8_t buffer_offset[4];
	uint8_t rsvd44[4];
} __attribute__((packed));

struct iscsi_data_in_hdr {
	uint8_t opcode, flags, rsvd2, status;
	uint8_t total_ahs_len, dsl[3];
	uint8_t lun[8];
	uint8_t itt[4];
	uint8_t ttt[4];
	uint8_t statsn[4];
	uint8_t exp_cmdsn[4];
	uint8_t max_cmdsn[4];
	uint8_t datasn[4];
	uint8_t buffer_offset[4];
	uint8_t residual[4];
} __attribute__((packed));

struct iscsi_r2t_hdr {
	uint8_t opcode, flags, rsvd2[2];
	uint8_t total_ahs_len, dsl[3];
	uint8_t lun[8];
	uint8_t itt[4];
	uint8_t ttt[4];
	uint8_t statsn[4];
	uint8_t exp_cmdsn[4];
	uint8_t max_cmdsn[4];
	uint8_t r2tsn[4];
	uint8_t buffer_offset[4];
	uint8_t desired_len[4];
} __attribute__((packed));

struct iscsi_nop_hdr { /* NOP-Out and NOP-In share one layout */
	uint8_t opcode, flags, rsvd2[2];
	uint8_t total_ahs_len, dsl[3];
	uint8_t lun[8];
	uint8_t itt[4];
	uint8_t ttt[4];
	uint8_t sn24[4];    /* Out: CmdSN; In: StatSN */
	uint8_t sn28[4];    /* Out: ExpStatSN; In: ExpCmdSN */
	uint8_t max_cmdsn[4]; /* In only */
	uint8_t rsvd36[12];
} __attribute__((packed));

struct iscsi_login_req_hdr {
	uint8_t opcode, flags, version_max, version_min;
	uint8_t total_ahs_len, dsl[3];
	uint8_t isid[6];
	uint8_t tsih[2];
	uint8_t itt[4];
	uint8_t cid[2];
	uint8_t rsvd22[2];
	uint8_t cmdsn[4];
	uint8_t exp_statsn[4];
	uint8_t rsvd32[16];
} __attribute__((packed));

struct iscsi_login_rsp_hdr {
	uint8_t opcode, flags, version_max, version_active;
	uint8_t total_ahs_len, dsl[3];
	uint8_t isid[6];
	uint8_t tsih[2];
	uint8_t itt[4];
	uint8_t rsvd20[4];
	uint8_t statsn[4];
	uint8_t exp_cmdsn[4];
	uint8_t max_cmdsn[4];
	uint8_t status_class;
	uint8_t status_detail;
	uint8_t rsvd38[10];
} __attribute__((packed));

struct iscsi_text_hdr { /* Text Request and Text Response */
	uint8_t opcode, flags, rsvd2[2];
	uint8_t total_ahs_len, dsl[3];
	uint8_t lun[8];
	uint8_t itt[4];
	uint8_t ttt[4];
	uint8_t sn24[4];    /* Req: CmdSN; Rsp: StatSN */
	uint8_t sn28[4];    /* Req: ExpStatSN; Rsp: ExpCmdSN */
	uint8_t max_cmdsn[4];
	uint8_t rsvd36[12];
} __attribute__((packed));

struct iscsi_logout_req_hdr {
	uint8_t opcode, reason, rsvd2[2];
	uint8_t total_ahs_len, dsl[3];
	uint8_t rsvd8[8];
	uint8_t itt[4];
	uint8_t cid[2];
	uint8_t rsvd22[2];
	uint8_t cmdsn[4];
	uint8_t exp_statsn[4];
	uint8_t rsvd32[16];
} __attribute__((packed));

struct iscsi_logout_rsp_hdr {
	uint8_t opcode, flags, response, rsvd3;
	uint8_t total_ahs_len, dsl[3];
	uint8_t rsvd8[8];
	uint8_t itt[4];
	uint8_t rsvd20[4];
	uint8_t statsn[4];
	uint8_t exp_cmdsn[4];
	uint8_t max_cmdsn[4];
	uint8_t rsvd36[4];
	uint8_t time2wait[2];
	uint8_t time2retain[2];
	uint8_t rsvd44[4];
} __attribute__((packed));

struct iscsi_reject_hdr {
	uint8_t opcode, flags, reason, rsvd3;
	uint8_t total_ahs_len, dsl[3];
	uint8_t rsvd8[8];
	uint8_t itt[4];     /* always 0xffffffff */
	uint8_t rsvd20[4];
	uint8_t statsn[4];
	uint8_t exp_cmdsn[4];
	uint8_t max_cmdsn[4];
	uint8_t datasn[4];
	uint8_t rsvd40[8];
} __attribute__((packed));

struct iscsi_async_hdr {
	uint8_t opcode, flags, rsvd2[2];
	uint8_t total_ahs_len, dsl[3];
	uint8_t lun[8];
	uint8_t itt[4];     /* always 0xffffffff */
	uint8_t rsvd20[4];
	uint8_t statsn[4];
	uint8_t exp_cmdsn[4];
	uint8_t max_cmdsn[4];
	uint8_t event;
	uint8_t vcode;
	uint8_t param1[2];
	uint8_t param2[2];
	uint8_t param3[2];
	uint8_t rsvd44[4];
} __attribute__((packed));

_Static_assert(sizeof(struct iscsi_bhs) == ISCSI_BHS_LEN, "BHS is 48 bytes");
_Static_assert(sizeof(struct iscsi_scsi_cmd_hdr) == ISCSI_BHS_LEN, "SCSI Command BHS");
_Static_assert(sizeof(struct iscsi_scsi_rsp_hdr) == ISCSI_BHS_LEN, "SCSI Response BHS");
_Static_assert(sizeof(struct iscsi_tmf_req_hdr) == ISCSI_BHS_LEN, "TMF Request BHS");
_Static_assert(sizeof(struct iscsi_tmf_rsp_hdr) == ISCSI_BHS_LEN, "TMF Response BHS");
_Static_assert(sizeof(struct iscsi_data_out_hdr) == ISCSI_BHS_LEN, "Data-Out BHS");
_Static_assert(sizeof(struct iscsi_data_in_hdr) == ISCSI_BHS_LEN, "Data-In BHS");
_Static_assert(sizeof(struct iscsi_r2t_hdr) == ISCSI_BHS_LEN, "R2T BHS");
_Static_assert(sizeof(struct iscsi_nop_hdr) == ISCSI_BHS_LEN, "NOP BHS");
_Static_assert(sizeof(struct iscsi_login_req_hdr) == ISCSI_BHS_LEN, "Login Request BHS");
_Static_assert(sizeof(struct iscsi_login_rsp_hdr) == ISCSI_BHS_LEN, "Login Response BHS");
_Static_assert(sizeof(struct iscsi_text_hdr) == ISCSI_BHS_LEN, "Text BHS");
_Static_assert(sizeof(struct iscsi_logout_req_hdr) == ISCSI_BHS_LEN, "Logout Request BHS");
_Static_assert(sizeof(struct iscsi_logout_rsp_hdr) == ISCSI_BHS_LEN, "Logout Response BHS");
_Static_assert(sizeof(struct iscsi_reject_hdr) == ISCSI_BHS_LEN, "Reject BHS");
_Static_assert(sizeof(struct iscsi_async_hdr) == ISCSI_BHS_LEN, "Async Message BHS");

/* Digests travel least-significant byte first (RFC 7143 13.1). */
static inline void digest_put(uint8_t *p, uint32_t crc)
{
	p[0] = (uint8_t)crc; p[1] = (uint8_t)(crc >> 8); p[2] = (uint8_t)(crc >> 16); p[3] = (uint8_t)(crc >> 24);
}
static inline uint32_t digest_get(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Serial number arithmetic (RFC 1982, 32 bits) for CmdSN and friends. */
static inline int sn_lt(uint32_t a, uint32_t b) { return a != b && (uint32_t)(b - a) < 0x80000000u; }
static inline int sn_le(uint32_t a, uint32_t b) { return a == b || sn_lt(a, b); }

/*
 * SAM LUN structure <-> LUN number: peripheral (method 0, bus 0) for
 * LUN < 256, flat space (method 1) up to 16383. Anything else decodes to
 * UINT64_MAX, a LUN no target maps.
 */
static inline uint64_t iscsi_lun_decode(const uint8_t *l)
{
	switch (l[0] >> 6) {
	case 0: return l[0] ? UINT64_MAX : l[1];
	case 1: return (uint64_t)(l[0] & 0x3f) << 8 | l[1];
	default: return UINT64_MAX;
	}
}
static inline void iscsi_lun_encode(uint8_t *l, uint64_t lun)
{
	memset(l, 0, 8);
	if (lun < 256) {
		l[1] = (uint8_t)lun;
	} else {
		l[0] = 0x40 | (uint8_t)((lun >> 8) & 0x3f);
		l[1] = (uint8_t)lun;
	}
}

static inline uint8_t bhs_opcode(const void *bhs) { return ((const uint8_t *)bhs)[0] & ISCSI_OPCODE_MASK; }
static inline int bhs_immediate(const void *bhs) { return (((const uint8_t *)bhs)[0] & ISCSI_IMMEDIATE) != 0; }
static inline uint32_t bhs_dsl(const void *bhs) { return be24_get(((const struct iscsi_bhs *)bhs)->dsl); }
static inline uint32_t bhs_itt(const void *bhs) { return be32_get(((const struct iscsi_bhs *)bhs)->itt); }

#endif
