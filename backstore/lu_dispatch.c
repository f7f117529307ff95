/*
 * lu_dispatch.c - the command table and the path every command takes to
 * its handler, and back.
 *
 * scsi_cmd_submit finds the (nexus, LU) pair for the LUN, looks the
 * opcode (and service action) up in the command table, rejects reserved
 * bits with the table's CDB usage mask, reports a pending unit attention,
 * refuses media access while a sanitize runs or while another gateway owns
 * a shared backing store, checks reservations (only when the LU's atomic
 * resv_held hint says there is one) and refuses writes to a
 * write-protected LU. Then the handler runs, and whatever it returns
 * SCSI_RC_DONE for is completed here, in one place. The table is data:
 * handler, data direction, CDB length, usage bits and a few flags; REPORT
 * SUPPORTED OPERATION CODES is generated from the same table.
 *
 * It also holds the helpers that move data between a command's buffer
 * and a handler (scsi_data_in, scsi_data_out).
 *
 * Threading: scsi_cmd_submit on the submitting worker; the table and its
 * index are read-only once built (lu_dispatch_init, from scsi_lu_open).
 */
#include "backstore/lu.h"

#include "common/log.h"

#include <stdlib.h>

/* ------------------------------------------------------------------ */
/* The command table                                                   */

#define CTL 0x00 /* control byte: NACA and LINK unsupported */
#define RW (CMDF_READS)
#define WR (CMDF_WRITES)
#define R SCSI_DIR_READ
#define W SCSI_DIR_WRITE

static const struct cmd_desc cmd_table[] = {
	{ OP_TEST_UNIT_READY, 0, 6, 0, CMDF_PR_ALLOWED, spc_test_unit_ready, "TEST UNIT READY",
	  { OP_TEST_UNIT_READY, 0, 0, 0, 0, CTL } },
	{ OP_REQUEST_SENSE, 0, 6, R, CMDF_NO_UA | CMDF_UNMAPPED_OK | CMDF_PR_ALLOWED | CMDF_SANITIZE_OK | CMDF_RESV_SPC2_OK,
	  spc_request_sense, "REQUEST SENSE", { OP_REQUEST_SENSE, 0x01, 0, 0, 0xff, CTL } },
	{ OP_READ_6, 0, 6, R, RW, sbc_read, "READ(6)", { OP_READ_6, 0x1f, 0xff, 0xff, 0xff, CTL } },
	{ OP_WRITE_6, 0, 6, W, WR, sbc_write, "WRITE(6)", { OP_WRITE_6, 0x1f, 0xff, 0xff, 0xff, CTL } },
	{ OP_INQUIRY, 0, 6, R, CMDF_NO_UA | CMDF_UNMAPPED_OK | CMDF_PR_ALLOWED | CMDF_SANITIZE_OK | CMDF_RESV_SPC2_OK,
	  spc_inquiry, "INQUIRY", { OP_INQUIRY, 0x01, 0xff, 0xff, 0xff, CTL } },
	{ OP_MODE_SELECT_6, 0, 6, W, 0, spc_mode_select, "MODE SELECT(6)",
	  { OP_MODE_SELECT_6, 0x11, 0, 0, 0xff, CTL } },
	{ OP_RESERVE_6, 0, 6, 0, 0, pr_reserve, "RESERVE(6)", { OP_RESERVE_6, 0, 0, 0, 0, CTL } },
	{ OP_RELEASE_6, 0, 6, 0, CMDF_RESV_SPC2_OK, pr_release, "RELEASE(6)", { OP_RELEASE_6, 0, 0, 0, 0, CTL } },
	{ OP_MODE_SENSE_6, 0, 6, R, 0, spc_mode_sense, "MODE SENSE(6)",
	  { OP_MODE_SENSE_6, 0x08, 0xff, 0xff, 0xff, CTL } },
	{ OP_START_STOP_UNIT, 0, 6, 0, 0, spc_start_stop_unit, "START STOP UNIT",
	  { OP_START_STOP_UNIT, 0x01, 0, 0x0f, 0xf7, CTL } },
	{ OP_SEND_DIAGNOSTIC, 0, 6, W, 0, spc_send_diagnostic, "SEND DIAGNOSTIC",
	  { OP_SEND_DIAGNOSTIC, 0xf7, 0, 0xff, 0xff, CTL } },
	{ OP_PREVENT_ALLOW, 0, 6, 0, CMDF_PR_ALLOWED, spc_prevent_allow, "PREVENT ALLOW MEDIUM REMOVAL",
	  { OP_PREVENT_ALLOW, 0, 0, 0, 0x03, CTL } },
	{ OP_READ_CAPACITY_10, 0, 10, R, CMDF_PR_ALLOWED, sbc_read_capacity_10, "READ CAPACITY(10)",
	  { OP_READ_CAPACITY_10, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0x01, CTL } },
	{ OP_READ_10, 0, 10, R, RW, sbc_read, "READ(10)",
	  { OP_READ_10, 0xfe, 0xff, 0xff, 0xff, 0xff, 0x1f, 0xff, 0xff, CTL } },
	{ OP_WRITE_10, 0, 10, W, WR, sbc_write, "WRITE(10)",
	  { OP_WRITE_10, 0xfa, 0xff, 0xff, 0xff, 0xff, 0x1f, 0xff, 0xff, CTL } },
	{ OP_WRITE_VERIFY_10, 0, 10, W, WR, sbc_write_verify, "WRITE AND VERIFY(10)",
	  { OP_WRITE_VERIFY_10, 0xf6, 0xff, 0xff, 0xff, 0xff, 0x1f, 0xff, 0xff, CTL } },
	{ OP_VERIFY_10, 0, 10, W, RW, sbc_verify, "VERIFY(10)",
	  { OP_VERIFY_10, 0xf6, 0xff, 0xff, 0xff, 0xff, 0x1f, 0xff, 0xff, CTL } },
	{ OP_PREFETCH_10, 0, 10, 0, RW, sbc_prefetch, "PRE-FETCH(10)",
	  { OP_PREFETCH_10, 0x02, 0xff, 0xff, 0xff, 0xff, 0x1f, 0xff, 0xff, CTL } },
	{ OP_READ_DEFECT_DATA_10, 0, 10, R, 0, sbc_read_defect_data, "READ DEFECT DATA(10)",
	  { OP_READ_DEFECT_DATA_10, 0, 0x1f, 0, 0, 0, 0, 0xff, 0xff, CTL } },
	{ OP_SYNC_CACHE_10, 0, 10, 0, WR, sbc_sync_cache, "SYNCHRONIZE CACHE(10)",
	  { OP_SYNC_CACHE_10, 0x06, 0xff, 0xff, 0xff, 0xff, 0x1f, 0xff, 0xff, CTL } },
	{ OP_WRITE_SAME_10, 0, 10, W, WR, sbc_write_same, "WRITE SAME(10)",
	  { OP_WRITE_SAME_10, 0xf8, 0xff, 0xff, 0xff, 0xff, 0x1f, 0xff, 0xff, CTL } },
	{ OP_UNMAP, 0, 10, W, WR, sbc_unmap, "UNMAP",
	  { OP_UNMAP, 0x01, 0, 0, 0, 0, 0x1f, 0xff, 0xff, CTL } },
	{ OP_SANITIZE, SANITIZE_BLOCK_ERASE, 10, 0, WR | CMDF_SA, sbc_sanitize, "SANITIZE BLOCK ERASE",
	  { OP_SANITIZE, 0xbf, 0, 0, 0, 0, 0, 0xff, 0xff, CTL } },
	{ OP_SANITIZE, SANITIZE_EXIT_FAILURE_MODE, 10, 0, WR | CMDF_SA, sbc_sanitize,
	  "SANITIZE EXIT FAILURE MODE", { OP_SANITIZE, 0xbf, 0, 0, 0, 0, 0, 0xff, 0xff, CTL } },
	{ OP_LOG_SENSE, 0, 10, R, CMDF_PR_ALLOWED, spc_log_sense, "LOG SENSE",
	  { OP_LOG_SENSE, 0x01, 0xff, 0xff, 0, 0xff, 0xff, 0xff, 0xff, CTL } },
	{ OP_MODE_SELECT_10, 0, 10, W, 0, spc_mode_select, "MODE SELECT(10)",
	  { OP_MODE_SELECT_10, 0x11, 0, 0, 0, 0, 0, 0xff, 0xff, CTL } },
	{ OP_RESERVE_10, 0, 10, 0, 0, pr_reserve, "RESERVE(10)",
	  { OP_RESERVE_10, 0, 0, 0, 0, 0, 0, 0, 0, CTL } },
	{ OP_RELEASE_10, 0, 10, 0, CMDF_RESV_SPC2_OK, pr_release, "RELEASE(10)",
	  { OP_RELEASE_10, 0, 0, 0, 0, 0, 0, 0, 0, CTL } },
	{ OP_MODE_SENSE_10, 0, 10, R, 0, spc_mode_sense, "MODE SENSE(10)",
	  { OP_MODE_SENSE_10, 0x18, 0xff, 0xff, 0, 0, 0, 0xff, 0xff, CTL } },
	{ OP_PR_IN, 0x00, 10, R, CMDF_SA | CMDF_PR_ALLOWED, pr_in, "PERSISTENT RESERVE IN READ KEYS",
	  { OP_PR_IN, 0x1f, 0, 0, 0, 0, 0, 0xff, 0xff, CTL } },
	{ OP_PR_IN, 0x01, 10, R, CMDF_SA | CMDF_PR_ALLOWED, pr_in, "PERSISTENT RESERVE IN READ RESERVATION",
	  { OP_PR_IN, 0x1f, 0, 0, 0, 0, 0, 0xff, 0xff, CTL } },
	{ OP_PR_IN, 0x02, 10, R, CMDF_SA | CMDF_PR_ALLOWED, pr_in, "PERSISTENT RESERVE IN REPORT CAPABILITIES",
	  { OP_PR_IN, 0x1f, 0, 0, 0, 0, 0, 0xff, 0xff, CTL } },
	{ OP_PR_IN, 0x03, 10, R, CMDF_SA | CMDF_PR_ALLOWED, pr_in, "PERSISTENT RESERVE IN READ FULL STATUS",
	  { OP_PR_IN, 0x1f, 0, 0, 0, 0, 0, 0xff, 0xff, CTL } },
#define PROUT(sa, nm)                                                                          \
	{ OP_PR_OUT, sa, 10, W, CMDF_SA | CMDF_PR_ALLOWED, pr_out, "PERSISTENT RESERVE OUT " nm, \
	  { OP_PR_OUT, 0x1f, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, CTL } }
	PROUT(0x00, "REGISTER"),
	PROUT(0x01, "RESERVE"),
	PROUT(0x02, "RELEASE"),
	PROUT(0x03, "CLEAR"),
	PROUT(0x04, "PREEMPT"),
	PROUT(0x05, "PREEMPT AND ABORT"),
	PROUT(0x06, "REGISTER AND IGNORE EXISTING KEY"),
	PROUT(0x07, "REGISTER AND MOVE"),
	{ OP_EXTENDED_COPY, 0x00, 16, W, CMDF_SA | WR, xcopy_extended_copy, "EXTENDED COPY(LID1)",
	  { OP_EXTENDED_COPY, 0x1f, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, CTL } },
	{ OP_EXTENDED_COPY, 0x10, 16, W, CMDF_SA | RW, odx_populate_token, "POPULATE TOKEN",
	  { OP_EXTENDED_COPY, 0x1f, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x3f, CTL } },
	{ OP_EXTENDED_COPY, 0x11, 16, W, CMDF_SA | WR, odx_write_using_token, "WRITE USING TOKEN",
	  { OP_EXTENDED_COPY, 0x1f, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x3f, CTL } },
	{ OP_RECEIVE_COPY_RESULTS, RCR_COPY_STATUS, 16, R, CMDF_SA, xcopy_receive_copy_results,
	  "RECEIVE COPY STATUS(LID1)",
	  { OP_RECEIVE_COPY_RESULTS, 0x1f, 0xff, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, CTL } },
	{ OP_RECEIVE_COPY_RESULTS, RCR_OPERATING_PARAMETERS, 16, R, CMDF_SA, xcopy_receive_copy_results,
	  "RECEIVE COPY OPERATING PARAMETERS",
	  { OP_RECEIVE_COPY_RESULTS, 0x1f, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, CTL } },
	{ OP_RECEIVE_COPY_RESULTS, 0x07, 16, R, CMDF_SA, odx_receive_rod_token_info, "RECEIVE ROD TOKEN INFORMATION",
	  { OP_RECEIVE_COPY_RESULTS, 0x1f, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, CTL } },
	{ OP_READ_16, 0, 16, R, RW, sbc_read, "READ(16)",
	  { OP_READ_16, 0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f, CTL } },
	{ OP_COMPARE_AND_WRITE, 0, 16, W, WR | RW, sbc_compare_and_write, "COMPARE AND WRITE",
	  { OP_COMPARE_AND_WRITE, 0xfa, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0xff, 0x1f, CTL } },
	{ OP_WRITE_16, 0, 16, W, WR, sbc_write, "WRITE(16)",
	  { OP_WRITE_16, 0xfa, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f, CTL } },
	{ OP_ORWRITE_16, 0, 16, W, WR | RW, sbc_orwrite, "ORWRITE(16)",
	  { OP_ORWRITE_16, 0xfa, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f, CTL } },
	{ OP_WRITE_VERIFY_16, 0, 16, W, WR, sbc_write_verify, "WRITE AND VERIFY(16)",
	  { OP_WRITE_VERIFY_16, 0xf6, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f, CTL } },
	{ OP_VERIFY_16, 0, 16, W, RW, sbc_verify, "VERIFY(16)",
	  { OP_VERIFY_16, 0xf6, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f, CTL } },
	{ OP_PREFETCH_16, 0, 16, 0, RW, sbc_prefetch, "PRE-FETCH(16)",
	  { OP_PREFETCH_16, 0x02, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f, CTL } },
	{ OP_SYNC_CACHE_16, 0, 16, 0, WR, sbc_sync_cache, "SYNCHRONIZE CACHE(16)",
	  { OP_SYNC_CACHE_16, 0x06, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f, CTL } },
	{ OP_WRITE_SAME_16, 0, 16, W, WR, sbc_write_same, "WRITE SAME(16)",
	  { OP_WRITE_SAME_16, 0xf9, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f, CTL } },
	{ OP_SERVICE_ACTION_IN_16, SAI_READ_CAPACITY_16, 16, R, CMDF_SA | CMDF_PR_ALLOWED, sbc_read_capacity_16,
	  "READ CAPACITY(16)",
	  { OP_SERVICE_ACTION_IN_16, 0x1f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, CTL } },
	{ OP_SERVICE_ACTION_IN_16, SAI_GET_LBA_STATUS, 16, R, CMDF_SA | RW, sbc_get_lba_status, "GET LBA STATUS",
	  { OP_SERVICE_ACTION_IN_16, 0x1f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, CTL } },
	{ OP_REPORT_LUNS, 0, 12, R, CMDF_NO_UA | CMDF_UNMAPPED_OK | CMDF_PR_ALLOWED | CMDF_SANITIZE_OK | CMDF_RESV_SPC2_OK,
	  spc_report_luns, "REPORT LUNS", { OP_REPORT_LUNS, 0, 0xff, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, CTL } },
	{ OP_MAINTENANCE_IN, MI_REPORT_TARGET_PGS, 12, R, CMDF_SA | CMDF_PR_ALLOWED | CMDF_RESV_SPC2_OK,
	  spc_report_target_pgs, "REPORT TARGET PORT GROUPS",
	  { OP_MAINTENANCE_IN, 0xff, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, CTL } },
	{ OP_MAINTENANCE_IN, MI_REPORT_SUPPORTED_OPCODES, 12, R, CMDF_SA | CMDF_PR_ALLOWED | CMDF_RESV_SPC2_OK,
	  spc_report_supported_opcodes, "REPORT SUPPORTED OPERATION CODES",
	  { OP_MAINTENANCE_IN, 0x1f, 0x87, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, CTL } },
	{ OP_READ_12, 0, 12, R, RW, sbc_read, "READ(12)",
	  { OP_READ_12, 0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f, CTL } },
	{ OP_WRITE_12, 0, 12, W, WR, sbc_write, "WRITE(12)",
	  { OP_WRITE_12, 0xfa, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f, CTL } },
	{ OP_READ_DEFECT_DATA_12, 0, 12, R, 0, sbc_read_defect_data, "READ DEFECT DATA(12)",
	  { OP_READ_DEFECT_DATA_12, 0x1f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, CTL } },
	{ OP_WRITE_VERIFY_12, 0, 12, W, WR, sbc_write_verify, "WRITE AND VERIFY(12)",
	  { OP_WRITE_VERIFY_12, 0xf6, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f, CTL } },
	{ OP_VERIFY_12, 0, 12, W, RW, sbc_verify, "VERIFY(12)",
	  { OP_VERIFY_12, 0xf6, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f, CTL } },
};

#undef R
#undef W

const struct cmd_desc *scsi_cmd_table(size_t *n)
{
	*n = sizeof(cmd_table) / sizeof(cmd_table[0]);
	return cmd_table;
}

/* Index of the first table entry per opcode, +1 (0 = unsupported). */
static uint8_t op_first[256];
/* Per entry: the reserved bits of CDB bytes 0..15 (the complement of the
 * usage mask over bytes 1..cdb_len-1, vendor bits of the control byte
 * allowed), so dispatch checks a CDB with two 64-bit ANDs. */
static uint64_t cdb_reserved[sizeof(cmd_table) / sizeof(cmd_table[0])][2];
static pthread_once_t op_once = PTHREAD_ONCE_INIT;

static void op_index_build(void)
{
	size_t n = sizeof(cmd_table) / sizeof(cmd_table[0]);
	for (size_t i = n; i-- > 0;) {
		const struct cmd_desc *d = &cmd_table[i];
		uint8_t rsv[16] = { 0 };
		op_first[d->opcode] = (uint8_t)(i + 1);
		for (unsigned b = 1; b < d->cdb_len && b < 16; b++)
			rsv[b] = (uint8_t)~(d->usage[b] | (b == d->cdb_len - 1u ? 0xc0 : 0));
		if (d->cdb_len > 16)
			rsv[0] = 0xff; /* longer CDBs: always the byte loop */
		memcpy(cdb_reserved[i], rsv, sizeof(rsv));
	}
}

void lu_dispatch_init(void)
{
	pthread_once(&op_once, op_index_build);
}

/* Find the descriptor; *bad_sa set when the opcode exists but not the SA. */
static const struct cmd_desc *cmd_lookup(const uint8_t *cdb, bool *bad_sa)
{
	size_t n = sizeof(cmd_table) / sizeof(cmd_table[0]);
	unsigned i = op_first[cdb[0]];

	*bad_sa = false;
	if (!i)
		return NULL;
	const struct cmd_desc *d = &cmd_table[i - 1];
	if (!(d->flags & CMDF_SA))
		return d;
	uint8_t sa = cdb[1] & 0x1f;
	for (; d < cmd_table + n && d->opcode == cdb[0]; d++)
		if (d->sa == sa)
			return d;
	*bad_sa = true;
	return NULL;
}

/* ------------------------------------------------------------------ */
/* Data buffers                                                        */

size_t scsi_iov_len(const struct scsi_cmd *cmd)
{
	size_t n = 0;
	for (int i = 0; i < cmd->iovcnt; i++)
		n += cmd->iov[i].iov_len;
	return n;
}

void scsi_data_in(struct scsi_cmd *cmd, const void *src, size_t len, size_t alloc_len)
{
	size_t n = len < alloc_len ? len : alloc_len;
	size_t done = 0;

	if (n > cmd->read_len)
		n = cmd->read_len;
	for (int i = 0; i < cmd->iovcnt && done < n; i++) {
		size_t c = cmd->iov[i].iov_len;
		if (c > n - done)
			c = n - done;
		memcpy(cmd->iov[i].iov_base, (const uint8_t *)src + done, c);
		done += c;
	}
	cmd->data_in_len = (uint32_t)done;
	cmd->cdb_xfer_len = (uint32_t)alloc_len;
}

size_t scsi_data_out(struct scsi_cmd *cmd, size_t off, void *dst, size_t len)
{
	size_t avail = cmd->write_len;
	size_t done = 0, pos = 0;

	if (off >= avail)
		return 0;
	if (len > avail - off)
		len = avail - off;
	for (int i = 0; i < cmd->iovcnt && done < len; i++) {
		size_t c = cmd->iov[i].iov_len;
		if (pos + c <= off) {
			pos += c;
			continue;
		}
		size_t skip = off > pos ? off - pos : 0;
		size_t take = c - skip;
		if (take > len - done)
			take = len - done;
		memcpy((uint8_t *)dst + done, (const uint8_t *)cmd->iov[i].iov_base + skip, take);
		done += take;
		pos += c;
	}
	return done;
}

/* ------------------------------------------------------------------ */
/* Dispatch                                                            */

/* Reserved bits per the usage mask; vendor bits of the control byte are
 * ignored. Returns false after failing the command. */
static bool cdb_reserved_ok(struct scsi_cmd *cmd, const struct cmd_desc *d)
{
	const uint64_t *rsv = cdb_reserved[d - cmd_table];
	uint64_t lo, hi;

	memcpy(&lo, cmd->cdb, 8);
	memcpy(&hi, cmd->cdb + 8, 8);
	if (!(lo & rsv[0]) && !(hi & rsv[1]))
		return true; /* the usual case; else find the first bad bit */
	for (unsigned i = 1; i < d->cdb_len; i++) {
		uint8_t allowed = d->usage[i];
		if (i == (unsigned)d->cdb_len - 1)
			allowed |= 0xc0;
		uint8_t bad = cmd->cdb[i] & (uint8_t)~allowed;
		if (bad) {
			scsi_fail_cdb(cmd, i, 31 - __builtin_clz(bad));
			return false;
		}
	}
	return true;
}

void scsi_cmd_data_sent(struct scsi_cmd *cmd)
{
	struct scsi_lu *lu = cmd->data_fd_lu;
	if (lu) {
		cmd->data_fd_lu = NULL;
		lu_inflight_add(lu, -1);
	}
}

/*
 * A READ at a gateway that does not own the LU's shared store is served
 * from the store itself (BDEV_F_UNOWNED: past this gateway's cache, whose
 * copies may be older than the owner's writes), and does not take the store
 * over. The store holds everything the owner acknowledged (a LUN of several
 * gateways is write-through, config_validate.c), so the read is as current
 * as one on the owner's path. Why: hosts read every path they find (the
 * kernel's partition scan, udev's probes, LVM) before multipath groups
 * them, and if each of those reads took the image over, the gateways
 * would pass the lock back and forth for as long as a host keeps logging
 * in (a Linux host with two paths: over a minute of transitions). Writes
 * and every other media command still take it over: a host sends those
 * here only once its path to the owner failed (implicit failover).
 * Not for a LUN of one gateway (in STANDBY another client holds its image,
 * and its write-back cache may hold data the store lacks), nor while this
 * gateway's cache still holds dirty data of the LUN left from a write-back
 * run before it had several (bdev_owner_ops.unowned_reads); not while
 * taking over (TRANSITION) or cut off (LOST).
 * SYNCHRONIZE CACHE too, answered at once (sbc_sync_cache): this gateway
 * holds nothing unwritten of the LUN, and every write any gateway
 * acknowledged is durable in the store already. Hosts send it down every
 * path (Linux's sd at shutdown, for each path's disk): it took the image
 * over before.
 */
static bool unowned_ok(const struct scsi_lu *lu, const struct cmd_desc *d, enum bdev_owner_state st)
{
	if (st != BDEV_OWNER_STANDBY || lu->alua_groups < 2)
		return false;
	if (d->opcode != OP_READ_6 && d->opcode != OP_READ_10 && d->opcode != OP_READ_12 &&
	    d->opcode != OP_READ_16 && d->opcode != OP_SYNC_CACHE_10 && d->opcode != OP_SYNC_CACHE_16)
		return false;
	/* a cache volume still holding dirty data the store lacks says no */
	return !lu->owner->unowned_reads || lu->owner->unowned_reads(lu->dev);
}

/* The checks every command passes before its handler, then the handler:
 * what it returns, or the failed check's answer (SCSI_RC_DONE). */
static enum scsi_rc dispatch(struct scsi_cmd *cmd, struct nexus_lu *nl)
{
	const struct cmd_desc *d;
	bool bad_sa;

	d = cmd_lookup(cmd->cdb, &bad_sa);
	if (!d) {
		if (!cmd->lu)
			return scsi_fail(cmd, SK_ILLEGAL_REQUEST, ASC_LU_NOT_SUPPORTED);
		if (bad_sa)
			return scsi_fail_cdb(cmd, 1, 4);
		return scsi_fail(cmd, SK_ILLEGAL_REQUEST, ASC_INVALID_OPCODE);
	}
	if (!cmd->lu) {
		if (d->opcode == OP_INQUIRY)
			return spc_inquiry_unmapped(cmd);
		if (!(d->flags & CMDF_UNMAPPED_OK))
			return scsi_fail(cmd, SK_ILLEGAL_REQUEST, ASC_LU_NOT_SUPPORTED);
		if (!cdb_reserved_ok(cmd, d))
			return SCSI_RC_DONE;
		return d->handler(cmd);
	}
	if (!cdb_reserved_ok(cmd, d))
		return SCSI_RC_DONE;
	struct scsi_lu *lu = cmd->lu;
	if (!(d->flags & CMDF_NO_UA) && atomic_load_explicit(&nl->ua, memory_order_relaxed)) {
		uint16_t asc = lu_ua_take(nl);
		if (asc == ASC_THIN_PROV_SOFT_THRESHOLD) /* INFORMATION: the threshold's descriptor */
			return scsi_fail_info(cmd, SK_UNIT_ATTENTION, asc, atomic_load(&nl->lu->space_ua_info));
		if (asc)
			return scsi_fail(cmd, SK_UNIT_ATTENTION, asc);
	}
	if (!(d->flags & CMDF_SANITIZE_OK) && atomic_load_explicit(&lu->sanitizing, memory_order_acquire))
		return scsi_fail(cmd, SK_NOT_READY, ASC_LU_NOT_READY_SANITIZE);
	/*
	 * Reservations before ownership: a command the reservation refuses
	 * gets RESERVATION CONFLICT on whichever gateway it reaches, and never
	 * moves a shared store's ownership (a non-owner would take it over).
	 * With the reservations kept by several gateways, only on a copy known
	 * to be the cluster's latest.
	 */
	if (__builtin_expect(lu->prs != NULL, 0) &&
	    ((d->flags & (CMDF_READS | CMDF_WRITES)) || !(d->flags & CMDF_PR_ALLOWED)) && !pr_shared_synced(lu))
		return scsi_fail(cmd, SK_NOT_READY, ASC_LU_NOT_ACCESSIBLE_TRANSITION); /* retried; no takeover */
	if (atomic_load_explicit(&lu->resv_held, memory_order_acquire) && pr_conflicts(cmd, d)) {
		cmd->status = SAM_STAT_RESERVATION_CONFLICT;
		return SCSI_RC_DONE;
	}
	/* shared backing store: media access only while this gateway owns it,
	 * but for READs and SYNCHRONIZE CACHE (unowned_ok) */
	if (lu->owner && (d->flags & (CMDF_READS | CMDF_WRITES))) {
		uint64_t gen;
		enum bdev_owner_state st = lu->owner->state(lu->dev, &gen);
		if (st != BDEV_OWNER_OWNED) {
			if (!unowned_ok(lu, d, st))
				return spc_alua_refuse(cmd, st);
			cmd->unowned = true;
			if (d->flags & CMDF_READS)
				atomic_fetch_add_explicit(&lu->unowned_reads, 1, memory_order_relaxed);
		}
	}
	if ((d->flags & CMDF_WRITES) && d->opcode != OP_SYNC_CACHE_10 && d->opcode != OP_SYNC_CACHE_16 &&
	    (lu->read_only || atomic_load_explicit(&lu->swp, memory_order_relaxed)))
		return scsi_fail(cmd, SK_DATA_PROTECT, ASC_WRITE_PROTECTED);
	return d->handler(cmd);
}

void scsi_cmd_once_broken(const struct scsi_cmd *cmd)
{
	bool bad_sa;
	const struct cmd_desc *d = cmd_lookup(cmd->cdb, &bad_sa);

	log_err("SCSI command %s (CDB %02x %02x, LUN %llu, tag 0x%llx) %s; aborting", d ? d->name : "?",
		cmd->cdb[0], cmd->cdb[1], (unsigned long long)cmd->lun, (unsigned long long)cmd->tag,
		cmd->bs_once == SCSI_ONCE_DONE ? "completed twice" : "completed but never submitted");
	abort();
}

void scsi_cmd_submit(struct scsi_cmd *cmd)
{
	struct nexus_lu *nl;

	cmd->status = SAM_STAT_GOOD;
	cmd->sense_len = 0;
	cmd->data_in_len = 0;
	cmd->cdb_xfer_len = 0;
	cmd->bs_priv = NULL;
	cmd->data_fd_lu = NULL;
	cmd->wlock = NULL;
	cmd->overdue = false;
	cmd->unowned = false;
	cmd->outcome = 0;
	cmd->start_ns = lu_now_ns();
	nl = scsi_cmd_nlu(cmd);
	cmd->lu = nl ? nl->lu : NULL;
	cmd->held_lu = cmd->lu;
	cmd->held_nl = NULL;
	if (cmd->lu) {
		lu_inflight_add(cmd->lu, +1);
		/* every command is counted, whatever the state of reservations
		 * when it came: a PREEMPT AND ABORT waits for those of the nexus
		 * it preempts. Not a PERSISTENT RESERVE OUT: it may queue behind
		 * the very PREEMPT AND ABORT that waits (pr.c, pr_shared.c). */
		if (__builtin_expect(cmd->cdb[0] != OP_PR_OUT, 1)) {
			cmd->held_nl = nl;
			cmd->held_shift = nexus_lu_get(nl);
		}
	}
#ifdef TC_DEBUG
	cmd->bs_once = SCSI_ONCE_LIVE;
#endif
	/* the one place a synchronous answer is sent; a pending command is
	 * completed by the path it was handed to (and may be gone by now) */
	if (dispatch(cmd, nl) == SCSI_RC_DONE)
		scsi_cmd_complete(cmd);
}
