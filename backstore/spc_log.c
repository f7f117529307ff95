/*
 * spc_log.c - LOG SENSE: the supported log pages (00h, and 00h/FFh with
 * their subpages) and logical block provisioning (0Ch, lu_space.c).
 *
 * The counts are the space monitor's last look: a worker never asks the
 * device. Nothing is saved (SP is refused, DS is set) and nothing here is
 * resettable, so every page control answers the current values.
 *
 * Threading: on the submitting worker.
 */
#include "backstore/lu.h"

#define LP_SUPPORTED 0x00
#define LP_LBP 0x0c
#define LSP_ALL 0xff

enum scsi_rc spc_log_sense(struct scsi_cmd *cmd)
{
	struct scsi_lu *lu = cmd->lu;
	uint8_t page = cmd->cdb[2] & 0x3f;
	uint8_t subpage = cmd->cdb[3];
	uint16_t ptr = be16_get(cmd->cdb + 5);
	uint32_t alloc = be16_get(cmd->cdb + 7);
	uint8_t b[128];
	size_t len;

	if (cmd->cdb[1] & 0x01) /* SP: nothing is saved */
		return scsi_fail_cdb(cmd, 1, 0);
	if (page != LP_SUPPORTED && page != LP_LBP)
		return scsi_fail_cdb(cmd, 2, 5);
	if (subpage != 0 && !(page == LP_SUPPORTED && subpage == LSP_ALL))
		return scsi_fail_cdb(cmd, 3, -1);
	if (page != LP_LBP && ptr)
		return scsi_fail_cdb(cmd, 5, -1); /* those pages have no parameters */
	memset(b, 0, sizeof(b));
	if (page == LP_SUPPORTED && subpage == 0) {
		b[0] = LP_SUPPORTED;
		b[4] = LP_SUPPORTED;
		b[5] = LP_LBP;
		len = 6;
	} else if (page == LP_SUPPORTED) {
		static const uint8_t pairs[] = { LP_SUPPORTED, 0, LP_SUPPORTED, LSP_ALL, LP_LBP, 0 };
		b[0] = 0x40 | LP_SUPPORTED; /* SPF */
		b[1] = LSP_ALL;
		memcpy(b + 4, pairs, sizeof(pairs));
		len = 4 + sizeof(pairs);
	} else {
		/* past the largest parameter code the page has (0002h) */
		if (ptr > 2)
			return scsi_fail_cdb(cmd, 5, -1);
		len = lu_space_log_page(lu, b);
		/* PARAMETER POINTER: the parameters from that code on */
		size_t keep = 4, off = 4;
		while (off + 4 <= len) {
			size_t pl = 4 + (size_t)b[off + 3];
			if (be16_get(b + off) >= ptr) {
				memmove(b + keep, b + off, pl);
				keep += pl;
			}
			off += pl;
		}
		len = keep;
	}
	be16_put(b + 2, (uint16_t)(len - 4));
	scsi_data_in(cmd, b, len, alloc);
	return SCSI_RC_DONE;
}
