/*
 * spc_vpd.c - INQUIRY (SPC-4 6.6): the standard data, and the vital
 * product data pages that say who the LU is and what it can do.
 *
 * Pages: supported pages (00h), unit serial number (80h), device
 * identification (83h: the LU's NAA 3 designator and T10 vendor ID, the
 * relative target port and target port group, the target port and target
 * names), extended INQUIRY data (86h), block limits (B0h), block device
 * characteristics (B1h) and logical block provisioning (B2h). An INQUIRY
 * to an unmapped LUN gets standard data with peripheral qualifier 3.
 *
 * Threading: on the submitting worker; takes no lock.
 */
#include "backstore/lu.h"

#define INQ_STD_LEN 96
#define VPD_SUPPORTED 0x00
#define VPD_SERIAL 0x80
#define VPD_DEVICE_ID 0x83
#define VPD_EXTENDED 0x86
#define VPD_BLOCK_LIMITS 0xb0
#define VPD_BLOCK_CHARS 0xb1
#define VPD_LBP 0xb2
#define VPD_TPC 0x8f

#define PERIPH_DISK 0x00
#define PERIPH_NO_LU 0x7f  /* qualifier 3, type 0x1f */
#define INQ_VERSION_SPC4 0x06
#define INQ_HISUP 0x10
#define INQ_RDF_2 0x02
#define INQ_TPGS_IMPLICIT 0x10
#define INQ_3PC 0x08
#define INQ_CMDQUE 0x02

#define VERSION_SAM5 0x00a0
#define VERSION_SPC4 0x0460
#define VERSION_SBC3 0x04c0
#define VERSION_ISCSI 0x0960

#define DESIG_CODE_BINARY 1
#define DESIG_CODE_ASCII 2
#define DESIG_CODE_UTF8 3
#define DESIG_ASSOC_LU 0x00
#define DESIG_ASSOC_PORT 0x10
#define DESIG_ASSOC_TARGET 0x20
#define DESIG_PIV 0x80
#define DESIG_T10 1
#define DESIG_NAA 3
#define DESIG_REL_PORT 4
#define DESIG_TPG 5
#define DESIG_SCSI_NAME 8
#define PROTO_ISCSI 0x50

/* ---------------------------------------------------------------- */
/* INQUIRY                                                           */

static void pad_ascii(uint8_t *dst, const char *src, size_t n)
{
	size_t l = strlen(src);
	memset(dst, ' ', n);
	memcpy(dst, src, l < n ? l : n);
}

static size_t inquiry_standard(const struct scsi_lu *lu, uint8_t *b)
{
	memset(b, 0, INQ_STD_LEN);
	b[0] = lu ? PERIPH_DISK : PERIPH_NO_LU;
	b[2] = INQ_VERSION_SPC4;
	b[3] = INQ_HISUP | INQ_RDF_2;
	b[4] = INQ_STD_LEN - 5;
	b[5] = INQ_TPGS_IMPLICIT | INQ_3PC;
	b[7] = INQ_CMDQUE;
	pad_ascii(b + 8, lu ? lu->vendor : "TIERCACH", 8);
	pad_ascii(b + 16, lu ? lu->product : "tiercache", 16);
	pad_ascii(b + 32, lu ? lu->revision : "0001", 4);
	be16_put(b + 58, VERSION_SAM5);
	be16_put(b + 60, VERSION_ISCSI);
	be16_put(b + 62, VERSION_SPC4);
	be16_put(b + 64, VERSION_SBC3);
	return INQ_STD_LEN;
}

enum scsi_rc spc_inquiry_unmapped(struct scsi_cmd *cmd)
{
	uint8_t b[INQ_STD_LEN];
	uint16_t alloc = be16_get(cmd->cdb + 3);

	if (cmd->cdb[1] & 0x01) {
		/* No VPD for an LU that does not exist. */
		return scsi_fail(cmd, SK_ILLEGAL_REQUEST, ASC_LU_NOT_SUPPORTED);
	}
	inquiry_standard(NULL, b);
	scsi_data_in(cmd, b, sizeof(b), alloc);
	return SCSI_RC_DONE;
}

/* Append one designation descriptor; returns new length. */
static size_t desig(uint8_t *b, size_t off, uint8_t code_set, uint8_t assoc_type,
		    const void *id, size_t len)
{
	b[off] = code_set;
	b[off + 1] = assoc_type;
	b[off + 2] = 0;
	b[off + 3] = (uint8_t)len;
	memcpy(b + off + 4, id, len);
	return off + 4 + len;
}

/* SCSI name strings are null-terminated and padded to a multiple of 4. */
static size_t desig_name(uint8_t *b, size_t off, uint8_t assoc, const char *name)
{
	uint8_t tmp[PORT_NAME_MAX + 4];
	size_t l = strlen(name);
	if (l > PORT_NAME_MAX - 1)
		l = PORT_NAME_MAX - 1;
	size_t padded = (l + 1 + 3) & ~(size_t)3;
	memset(tmp, 0, sizeof(tmp));
	memcpy(tmp, name, l);
	return desig(b, off, PROTO_ISCSI | DESIG_CODE_UTF8, DESIG_PIV | assoc | DESIG_SCSI_NAME, tmp, padded);
}

static size_t vpd_device_id(struct scsi_cmd *cmd, uint8_t *b)
{
	const struct scsi_lu *lu = cmd->lu;
	size_t off = 4;
	uint8_t t10[8 + 32 + 1];
	uint8_t port[4] = { 0 };

	off = desig(b, off, DESIG_CODE_BINARY, DESIG_ASSOC_LU | DESIG_NAA, lu->naa, sizeof(lu->naa));
	pad_ascii(t10, lu->vendor, 8);
	size_t sl = strlen(lu->serial);
	memcpy(t10 + 8, lu->serial, sl);
	off = desig(b, off, DESIG_CODE_ASCII, DESIG_ASSOC_LU | DESIG_T10, t10, 8 + sl);
	be16_put(port + 2, lu->rel_port);
	off = desig(b, off, PROTO_ISCSI | DESIG_CODE_BINARY, DESIG_PIV | DESIG_ASSOC_PORT | DESIG_REL_PORT,
		    port, 4);
	be16_put(port + 2, (uint16_t)lu->tpg);
	off = desig(b, off, PROTO_ISCSI | DESIG_CODE_BINARY, DESIG_PIV | DESIG_ASSOC_PORT | DESIG_TPG, port, 4);
	if (cmd->nexus) {
		off = desig_name(b, off, DESIG_ASSOC_PORT, cmd->nexus->t_port);
		off = desig_name(b, off, DESIG_ASSOC_TARGET, cmd->nexus->tgt->iqn);
	}
	return off;
}

static size_t vpd_page(struct scsi_cmd *cmd, uint8_t page, uint8_t *b)
{
	struct scsi_lu *lu = cmd->lu;
	static const uint8_t supported[] = { VPD_SUPPORTED, VPD_SERIAL, VPD_DEVICE_ID, VPD_EXTENDED,
					     VPD_TPC, VPD_BLOCK_LIMITS, VPD_BLOCK_CHARS, VPD_LBP };
	size_t len;

	b[0] = PERIPH_DISK;
	b[1] = page;
	switch (page) {
	case VPD_SUPPORTED:
		memcpy(b + 4, supported, sizeof(supported));
		len = 4 + sizeof(supported);
		break;
	case VPD_SERIAL:
		len = strlen(lu->serial);
		memcpy(b + 4, lu->serial, len);
		len += 4;
		break;
	case VPD_DEVICE_ID:
		len = vpd_device_id(cmd, b);
		break;
	case VPD_EXTENDED:
		len = 64;
		b[5] = 0x07; /* HEADSUP, ORDSUP, SIMPSUP */
		b[6] = 0x01; /* V_SUP: a volatile cache exists */
		break;
	case VPD_TPC:
		len = odx_vpd_tpc(lu, b);
		break;
	case VPD_BLOCK_LIMITS: {
		uint32_t gran = 4096 / lu->block_size;
		len = 64;
		b[5] = LU_MAX_CAW_BLOCKS;
		be16_put(b + 6, (uint16_t)(gran ? gran : 1));
		be32_put(b + 8, LU_MAX_XFER_BYTES / lu->block_size);
		be32_put(b + 12, (128u << 10) / lu->block_size);
		be32_put(b + 16, 0);
		if (lu->dev->can_unmap) {
			be32_put(b + 20, LU_MAX_UNMAP_BLOCKS);
			be32_put(b + 24, LU_MAX_UNMAP_DESCS);
			be32_put(b + 28, gran ? gran : 1);
		}
		be64_put(b + 36, lu_max_ws_blocks(lu));
		break;
	}
	case VPD_BLOCK_CHARS:
		len = 64;
		be16_put(b + 4, lu->dev->rotational ? 7200 : 1);
		b[7] = 0x40; /* WABEREQ 01b: reads after BLOCK ERASE succeed (zeroes) */
		break;
	case VPD_LBP:
		len = 8;
		b[4] = lu->space_warn ? lu->thr_exp : 0; /* THRESHOLD EXPONENT: 0 = no thresholds */
		if (lu->dev->can_unmap)
			b[5] = 0x80 | 0x40 | 0x20 | 0x04; /* LBPU LBPWS LBPWS10 LBPRZ */
		b[6] = lu->dev->can_unmap ? 0x02 : 0x00; /* thin : full */
		break;
	default:
		return 0;
	}
	be16_put(b + 2, (uint16_t)(len - 4));
	return len;
}

enum scsi_rc spc_inquiry(struct scsi_cmd *cmd)
{
	uint8_t b[1024];
	uint16_t alloc = be16_get(cmd->cdb + 3);
	size_t len;

	memset(b, 0, sizeof(b));
	if (!(cmd->cdb[1] & 0x01)) {
		if (cmd->cdb[2])
			return scsi_fail_cdb(cmd, 2, 7);
		len = inquiry_standard(cmd->lu, b);
	} else {
		len = vpd_page(cmd, cmd->cdb[2], b);
		if (!len)
			return scsi_fail_cdb(cmd, 2, 7);
	}
	scsi_data_in(cmd, b, len, alloc);
	return SCSI_RC_DONE;
}
