/*
 * sense.c - the one place sense data is built.
 *
 * Every CHECK CONDITION in the backstore goes through scsi_sense_build(),
 * which writes fixed-format (0x70) sense, or descriptor-format (0x72)
 * sense when the control mode page of the LU has D_SENSE set. Callers
 * name the sense key and the ASC/ASCQ pair with the constants in lu.h and
 * may add the INFORMATION field (MISCOMPARE offsets, LBAs) and a sense-key
 * specific field pointer (which CDB or parameter byte was wrong).
 *
 * Threading: all functions touch only the command (and read the LU's
 * d_sense atomic); any thread.
 */
#include "backstore/lu.h"

#include <errno.h>

#define SENSE_FIXED_CURRENT 0x70
#define SENSE_DESC_CURRENT 0x72
#define SENSE_FIXED_LEN 18
#define SENSE_FIXED_VALID 0x80
#define SENSE_DESC_INFO 0x00
#define SENSE_DESC_SKS 0x02
#define SKS_VALID 0x80
#define SKS_CD 0x40
#define SKS_BPV 0x08

size_t scsi_sense_format(uint8_t *buf, size_t cap, bool d_sense, uint8_t key,
			 uint16_t asc_ascq, const struct sense_extra *x)
{
	uint8_t s[SCSI_SENSE_MAX];
	size_t len;

	memset(s, 0, sizeof(s));
	if (!d_sense) {
		s[0] = SENSE_FIXED_CURRENT;
		s[2] = key & 0x0f;
		s[7] = SENSE_FIXED_LEN - 8;
		s[12] = (uint8_t)(asc_ascq >> 8);
		s[13] = (uint8_t)asc_ascq;
		if (x && x->info_valid) {
			s[0] |= SENSE_FIXED_VALID;
			be32_put(s + 3, (uint32_t)x->info);
		}
		if (x && x->sksv)
			memcpy(s + 15, x->sks, 3);
		len = SENSE_FIXED_LEN;
	} else {
		s[0] = SENSE_DESC_CURRENT;
		s[1] = key & 0x0f;
		s[2] = (uint8_t)(asc_ascq >> 8);
		s[3] = (uint8_t)asc_ascq;
		len = 8;
		if (x && x->info_valid) {
			s[len] = SENSE_DESC_INFO;
			s[len + 1] = 0x0a;
			s[len + 2] = 0x80;
			be64_put(s + len + 4, x->info);
			len += 12;
		}
		if (x && x->sksv) {
			s[len] = SENSE_DESC_SKS;
			s[len + 1] = 0x06;
			memcpy(s + len + 4, x->sks, 3);
			len += 8;
		}
		s[7] = (uint8_t)(len - 8);
	}
	if (len > cap)
		len = cap;
	memcpy(buf, s, len);
	return len;
}

void scsi_sense_build(struct scsi_cmd *cmd, uint8_t key, uint16_t asc_ascq,
		      const struct sense_extra *x)
{
	bool d_sense = cmd->lu ? atomic_load_explicit(&cmd->lu->d_sense, memory_order_relaxed) : false;

	cmd->status = SAM_STAT_CHECK_CONDITION;
	cmd->sense_len = (uint8_t)scsi_sense_format(cmd->sense, sizeof(cmd->sense), d_sense,
						    key, asc_ascq, x);
}

enum scsi_rc scsi_fail(struct scsi_cmd *cmd, uint8_t key, uint16_t asc_ascq)
{
	scsi_sense_build(cmd, key, asc_ascq, NULL);
	cmd->data_in_len = 0;
	return SCSI_RC_DONE;
}

static enum scsi_rc fail_pointer(struct scsi_cmd *cmd, uint16_t asc, bool in_cdb, unsigned byte, int bit)
{
	struct sense_extra x = { .sksv = true };

	x.sks[0] = SKS_VALID | (in_cdb ? SKS_CD : 0);
	if (bit >= 0)
		x.sks[0] |= SKS_BPV | (uint8_t)(bit & 7);
	x.sks[1] = (uint8_t)(byte >> 8);
	x.sks[2] = (uint8_t)byte;
	scsi_sense_build(cmd, SK_ILLEGAL_REQUEST, asc, &x);
	cmd->data_in_len = 0;
	return SCSI_RC_DONE;
}

enum scsi_rc scsi_fail_cdb(struct scsi_cmd *cmd, unsigned byte, int bit)
{
	return fail_pointer(cmd, ASC_INVALID_FIELD_IN_CDB, true, byte, bit);
}

enum scsi_rc scsi_fail_param(struct scsi_cmd *cmd, unsigned byte, int bit)
{
	return fail_pointer(cmd, ASC_INVALID_FIELD_IN_PARAM_LIST, false, byte, bit);
}

enum scsi_rc scsi_fail_info(struct scsi_cmd *cmd, uint8_t key, uint16_t asc_ascq, uint64_t info)
{
	struct sense_extra x = { .info_valid = true, .info = info };
	scsi_sense_build(cmd, key, asc_ascq, &x);
	cmd->data_in_len = 0;
	return SCSI_RC_DONE;
}

void scsi_cmd_good(struct scsi_cmd *cmd)
{
	cmd->status = SAM_STAT_GOOD;
	cmd->sense_len = 0;
}

/*
 * Errors of a backing store reached over the network (an RBD image) are
 * not medium errors: the data is fine, the path to it is not.
 *  - -ETIMEDOUT, -ENOTCONN, -ECONNREFUSED, -ECONNRESET, -EAGAIN: the
 *    cluster did not answer in time. BUSY, so the host retries the command
 *    (SAM-5; tcmu-runner's rbd handler answers a timeout the same way).
 *  - -ESHUTDOWN (this client was blocklisted) or -EROFS (another gateway
 *    holds the image's exclusive lock): NOT READY, LOGICAL UNIT NOT
 *    ACCESSIBLE, TARGET PORT IN STANDBY STATE (SPC-4 5.15.2.4.5): a
 *    multipathing host moves the I/O to the path of the owner; tcmu-runner
 *    reports a fenced image with the same sense.
 */
enum scsi_rc scsi_fail_errno(struct scsi_cmd *cmd, int err, bool writing)
{
	if (err == -ETIMEDOUT || err == -ENOTCONN || err == -ECONNREFUSED || err == -ECONNRESET ||
	    err == -EAGAIN) {
		cmd->status = SAM_STAT_BUSY;
		cmd->sense_len = 0;
		cmd->data_in_len = 0;
		return SCSI_RC_DONE;
	}
	if (err == -ESHUTDOWN || err == -EROFS)
		return scsi_fail(cmd, SK_NOT_READY, ASC_LU_NOT_ACCESSIBLE_STANDBY);
	if (err == -ENOSPC || err == -EDQUOT)
		return scsi_fail(cmd, SK_DATA_PROTECT, ASC_SPACE_ALLOCATION_FAILED);
	if (err == -EIO || err == -EILSEQ || err == -ENODATA)
		return scsi_fail(cmd, SK_MEDIUM_ERROR, writing ? ASC_WRITE_ERROR : ASC_UNRECOVERED_READ_ERROR);
	return scsi_fail(cmd, SK_HARDWARE_ERROR, ASC_INTERNAL_TARGET_FAILURE);
}

/* Front ends failing a command before it reaches the backstore. */
void scsi_cmd_set_sense(struct scsi_cmd *cmd, uint8_t key, uint16_t asc_ascq)
{
	/* cmd->lu is not ours to trust yet: always fixed format here. */
	cmd->status = SAM_STAT_CHECK_CONDITION;
	cmd->sense_len = (uint8_t)scsi_sense_format(cmd->sense, sizeof(cmd->sense), false, key,
						    asc_ascq, NULL);
}
