/*
 * spc.c - SCSI primary commands (SPC-4) for a direct-access LU.
 *
 * What an initiator asks before it does any I/O: INQUIRY and its VPD
 * pages (identity, block limits, provisioning), REPORT LUNS, REQUEST
 * SENSE, MODE SENSE / MODE SELECT (caching, control, informational
 * exceptions pages; WCE, D_SENSE and SWP are changeable and honoured),
 * REPORT SUPPORTED OPERATION CODES (generated from lu.c's command table),
 * REPORT TARGET PORT GROUPS (implicit ALUA: one active/optimized group, or
 * one group per gateway for a LU over a shared store),
 * and the no-op-ish START STOP UNIT / PREVENT ALLOW / SEND DIAGNOSTIC.
 *
 * Threading: every handler runs on the submitting worker and has its answer
 * ready when it returns (SCSI_RC_DONE: scsi_cmd_submit completes). Mode
 * parameters other than the atomics are read and written under lu->mutex.
 */
#include "backstore/lu.h"

#include <stdio.h>
#include <stdlib.h>

#define INQ_STD_LEN 96
#define VPD_SUPPORTED 0x00
#define VPD_SERIAL 0x80
#define VPD_DEVICE_ID 0x83
#define VPD_EXTENDED 0x86
#define VPD_BLOCK_LIMITS 0xb0
#define VPD_BLOCK_CHARS 0xb1
#define VPD_LBP 0xb2

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

enum scsi_rc spc_test_unit_ready(struct scsi_cmd *cmd)
{
	return SCSI_RC_DONE;
}

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
					     VPD_BLOCK_LIMITS, VPD_BLOCK_CHARS, VPD_LBP };
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

/* ---------------------------------------------------------------- */
/* REPORT LUNS                                                       */

#define RL_SELECT_ALL 0x00
#define RL_SELECT_WELL_KNOWN 0x01
#define RL_SELECT_ALL_BOTH 0x02
#define RL_SELECT_ADMIN 0x10
#define RL_SELECT_SUBSIDIARY 0x11
#define RL_SELECT_ADMIN_AND_SUB 0x12

static void encode_lun(uint64_t lun, uint8_t *out)
{
	memset(out, 0, 8);
	if (lun < 256) {
		out[1] = (uint8_t)lun; /* peripheral device addressing */
	} else {
		out[0] = (uint8_t)(0x40 | ((lun >> 8) & 0x3f)); /* flat space */
		out[1] = (uint8_t)lun;
	}
}

enum scsi_rc spc_report_luns(struct scsi_cmd *cmd)
{
	uint32_t alloc = be32_get(cmd->cdb + 6);
	uint8_t select = cmd->cdb[2];
	/* the nexus's own view of the map: what its commands reach */
	struct scsi_nexus *nx = cmd->nexus;

	if (alloc < 16)
		return scsi_fail_cdb(cmd, 6, -1);
	int n = 0;
	switch (select) {
	case RL_SELECT_ALL:
	case RL_SELECT_ALL_BOTH:
		n = nx ? nx->nlus : 0;
		break;
	case RL_SELECT_WELL_KNOWN:
		n = 0;
		break;
	case RL_SELECT_ADMIN:
	case RL_SELECT_SUBSIDIARY:
	case RL_SELECT_ADMIN_AND_SUB:
		/* No administrative LU and no subsidiary LUNs: empty list
		 * (SPC-5 says report LUN 0's conglomerate only when it is one). */
		n = 0;
		break;
	default:
		return scsi_fail_cdb(cmd, 2, 7);
	}
	size_t len = 8 + (size_t)n * 8;
	uint8_t small[8 + 8 * 16];
	uint8_t *b = len <= sizeof(small) ? small : malloc(len);
	if (!b)
		return scsi_fail(cmd, SK_HARDWARE_ERROR, ASC_INTERNAL_TARGET_FAILURE);
	memset(b, 0, 8);
	be32_put(b, (uint32_t)(n * 8));
	for (int i = 0; i < n; i++)
		encode_lun(nx->lus[i]->lun, b + 8 + i * 8);
	scsi_data_in(cmd, b, len, alloc);
	if (b != small)
		free(b);
	/* Reading the list clears REPORTED LUNS DATA HAS CHANGED. */
	struct nexus_lu *nl = scsi_cmd_nlu(cmd);
	if (nl)
		atomic_fetch_and(&nl->ua, ~(unsigned)UA_LUNS_CHANGED);
	return SCSI_RC_DONE;
}

/* ---------------------------------------------------------------- */
/* REQUEST SENSE                                                     */

enum scsi_rc spc_request_sense(struct scsi_cmd *cmd)
{
	uint8_t b[SCSI_SENSE_MAX];
	bool desc = cmd->cdb[1] & 0x01;
	uint8_t alloc = cmd->cdb[4];
	struct nexus_lu *nl = scsi_cmd_nlu(cmd);
	size_t len;

	if (!cmd->lu) {
		len = scsi_sense_format(b, sizeof(b), desc, SK_ILLEGAL_REQUEST, ASC_LU_NOT_SUPPORTED, NULL);
	} else if (atomic_load(&cmd->lu->sanitizing)) {
		struct sense_extra x = { .sksv = true, .sks = { 0x80, 0, 0 } };
		len = scsi_sense_format(b, sizeof(b), desc, SK_NOT_READY, ASC_LU_NOT_READY_SANITIZE, &x);
	} else {
		uint16_t asc = nl ? lu_ua_take(nl) : 0;
		if (asc)
			len = scsi_sense_format(b, sizeof(b), desc, SK_UNIT_ATTENTION, asc, NULL);
		else
			len = scsi_sense_format(b, sizeof(b), desc, SK_NO_SENSE, ASC_NO_ADDITIONAL_SENSE, NULL);
	}
	scsi_data_in(cmd, b, len, alloc);
	return SCSI_RC_DONE;
}

/* ---------------------------------------------------------------- */
/* Mode pages                                                        */

#define MP_RW_ERROR_RECOVERY 0x01
#define MP_CACHING 0x08
#define MP_CONTROL 0x0a
#define MP_INFO_EXCEPTIONS 0x1c
#define MP_ALL 0x3f
#define MP_PC_CURRENT 0
#define MP_PC_CHANGEABLE 1
#define MP_PC_DEFAULT 2
#define MP_PC_SAVED 3

#define CACHING_WCE 0x04
#define CONTROL_D_SENSE 0x04
#define CONTROL_SWP 0x08
#define DEVSPEC_WP 0x80
#define DEVSPEC_DPOFUA 0x10

static const uint8_t mode_pages[] = { MP_RW_ERROR_RECOVERY, MP_CACHING, MP_CONTROL, MP_INFO_EXCEPTIONS };

/* Build one page for pc into b; returns its length (0 = no such page).
 * Caller holds lu->mutex. */
static size_t mode_page(struct scsi_lu *lu, uint8_t page, int pc, uint8_t *b)
{
	bool changeable = pc == MP_PC_CHANGEABLE;
	bool dflt = pc == MP_PC_DEFAULT;
	size_t len;

	switch (page) {
	case MP_RW_ERROR_RECOVERY:
		len = 12;
		memset(b, 0, len);
		if (!changeable)
			b[2] = 0xc0; /* AWRE, ARRE */
		break;
	case MP_CACHING:
		len = 20;
		memset(b, 0, len);
		if (changeable)
			b[2] = CACHING_WCE;
		else if (dflt ? lu->wce_default : atomic_load(&lu->wce))
			b[2] = CACHING_WCE;
		break;
	case MP_CONTROL:
		len = 12;
		memset(b, 0, len);
		if (changeable) {
			b[2] = CONTROL_D_SENSE;
			b[4] = CONTROL_SWP;
		} else {
			if (!dflt && atomic_load(&lu->d_sense))
				b[2] |= CONTROL_D_SENSE;
			b[3] = 0x10; /* queue algorithm modifier: unrestricted */
			if (!dflt && atomic_load(&lu->swp))
				b[4] |= CONTROL_SWP;
			be16_put(b + 8, 0xffff); /* busy timeout: unlimited */
		}
		break;
	case MP_INFO_EXCEPTIONS:
		len = 12;
		memset(b, 0, len);
		if (!changeable)
			b[2] = 0x08; /* DEXCPT: no informational exceptions reported */
		break;
	default:
		return 0;
	}
	b[0] = page;
	b[1] = (uint8_t)(len - 2);
	return len;
}

enum scsi_rc spc_mode_sense(struct scsi_cmd *cmd)
{
	struct scsi_lu *lu = cmd->lu;
	bool ten = cmd->cdb[0] == OP_MODE_SENSE_10;
	bool dbd = cmd->cdb[1] & 0x08;
	bool llbaa = ten && (cmd->cdb[1] & 0x10);
	int pc = cmd->cdb[2] >> 6;
	uint8_t page = cmd->cdb[2] & 0x3f;
	uint8_t subpage = cmd->cdb[3];
	uint32_t alloc = ten ? be16_get(cmd->cdb + 7) : cmd->cdb[4];
	uint8_t b[512];
	size_t hdr = ten ? 8 : 4;
	size_t off;

	if (pc == MP_PC_SAVED)
		return scsi_fail(cmd, SK_ILLEGAL_REQUEST, ASC_SAVING_PARAMS_NOT_SUPPORTED);
	if (subpage != 0 && !(page == MP_ALL && subpage == 0xff))
		return scsi_fail_cdb(cmd, 3, 7);
	memset(b, 0, sizeof(b));
	off = hdr;
	if (!dbd) {
		size_t bdl = llbaa ? 16 : 8;
		uint8_t *d = b + off;
		if (llbaa) {
			be64_put(d, lu->nblocks);
			be32_put(d + 12, lu->block_size);
			b[4] |= 0x01; /* LONGLBA */
		} else {
			be32_put(d, lu->nblocks > 0xffffffffull ? 0xffffffffu : (uint32_t)lu->nblocks);
			be32_put(d + 4, lu->block_size & 0xffffff);
		}
		if (ten)
			be16_put(b + 6, (uint16_t)bdl);
		else
			b[3] = (uint8_t)bdl;
		off += bdl;
	}
	pthread_mutex_lock(&lu->mutex);
	if (page == MP_ALL) {
		for (size_t i = 0; i < sizeof(mode_pages); i++)
			off += mode_page(lu, mode_pages[i], pc, b + off);
	} else {
		size_t l = mode_page(lu, page, pc, b + off);
		if (!l) {
			pthread_mutex_unlock(&lu->mutex);
			return scsi_fail_cdb(cmd, 2, 5);
		}
		off += l;
	}
	pthread_mutex_unlock(&lu->mutex);
	uint8_t devspec = DEVSPEC_DPOFUA;
	if (lu->read_only || atomic_load(&lu->swp))
		devspec |= DEVSPEC_WP;
	if (ten) {
		be16_put(b, (uint16_t)(off - 2));
		b[3] = devspec;
	} else {
		b[0] = (uint8_t)(off - 1);
		b[2] = devspec;
	}
	scsi_data_in(cmd, b, off, alloc);
	return SCSI_RC_DONE;
}

/* Apply one page of MODE SELECT data; po is the page's offset in the
 * parameter list (for the field pointer). False after failing cmd. */
static bool mode_select_page(struct scsi_cmd *cmd, const uint8_t *p, size_t plen, size_t po,
			     unsigned *changed)
{
	struct scsi_lu *lu = cmd->lu;
	uint8_t cur[64], chg[64];
	uint8_t page = p[0] & 0x3f;

	if (p[0] & 0x40) { /* SPF: no subpages here */
		scsi_fail_param(cmd, (unsigned)po, 6);
		return false;
	}
	size_t len = mode_page(lu, page, MP_PC_CURRENT, cur);
	if (!len) {
		scsi_fail_param(cmd, (unsigned)po, 5);
		return false;
	}
	mode_page(lu, page, MP_PC_CHANGEABLE, chg);
	if (plen != len || p[1] != cur[1]) {
		scsi_fail_param(cmd, (unsigned)po + 1, 7);
		return false;
	}
	for (size_t i = 2; i < len; i++) {
		uint8_t diff = (p[i] ^ cur[i]) & (uint8_t)~chg[i];
		if (diff) {
			scsi_fail_param(cmd, (unsigned)(po + i), 31 - __builtin_clz(diff));
			return false;
		}
	}
	switch (page) {
	case MP_CACHING: {
		bool wce = p[2] & CACHING_WCE;
		if (wce != atomic_load(&lu->wce)) {
			atomic_store(&lu->wce, wce);
			*changed |= 1;
		}
		break;
	}
	case MP_CONTROL: {
		bool ds = p[2] & CONTROL_D_SENSE;
		bool swp = p[4] & CONTROL_SWP;
		if (ds != atomic_load(&lu->d_sense) || swp != atomic_load(&lu->swp)) {
			atomic_store(&lu->d_sense, ds);
			atomic_store(&lu->swp, swp);
			*changed |= 1;
		}
		break;
	}
	default:
		break;
	}
	return true;
}

enum scsi_rc spc_mode_select(struct scsi_cmd *cmd)
{
	struct scsi_lu *lu = cmd->lu;
	bool ten = cmd->cdb[0] == OP_MODE_SELECT_10;
	uint32_t plen = ten ? be16_get(cmd->cdb + 7) : cmd->cdb[4];
	size_t hdr = ten ? 8 : 4;
	uint8_t buf[512];
	unsigned changed = 0;

	cmd->cdb_xfer_len = plen;
	if (cmd->cdb[1] & 0x01) /* SP: nothing is savable */
		return scsi_fail_cdb(cmd, 1, 0);
	if (plen == 0)
		return SCSI_RC_DONE;
	if (plen < hdr || plen > sizeof(buf))
		return scsi_fail(cmd, SK_ILLEGAL_REQUEST, ASC_PARAM_LIST_LENGTH_ERROR);
	if (scsi_data_out(cmd, 0, buf, plen) < plen)
		return scsi_fail(cmd, SK_ILLEGAL_REQUEST, ASC_PARAM_LIST_LENGTH_ERROR);
	size_t bdl = ten ? be16_get(buf + 6) : buf[3];
	size_t off = hdr;
	if (bdl) {
		bool longlba = ten && (buf[4] & 0x01);
		size_t one = longlba ? 16 : 8;
		if (bdl != one || off + bdl > plen)
			return scsi_fail_param(cmd, ten ? 6 : 3, -1);
		uint32_t blen = longlba ? be32_get(buf + off + 12) : be24_get(buf + off + 5);
		if (blen != lu->block_size)
			return scsi_fail_param(cmd, (unsigned)(off + (longlba ? 12 : 5)), -1);
		off += bdl;
	}
	pthread_mutex_lock(&lu->mutex);
	while (off < plen) {
		if (off + 2 > plen) {
			pthread_mutex_unlock(&lu->mutex);
			return scsi_fail(cmd, SK_ILLEGAL_REQUEST, ASC_PARAM_LIST_LENGTH_ERROR);
		}
		size_t pl = (size_t)buf[off + 1] + 2;
		if (off + pl > plen) {
			pthread_mutex_unlock(&lu->mutex);
			return scsi_fail(cmd, SK_ILLEGAL_REQUEST, ASC_PARAM_LIST_LENGTH_ERROR);
		}
		if (!mode_select_page(cmd, buf + off, pl, off, &changed)) {
			pthread_mutex_unlock(&lu->mutex);
			return SCSI_RC_DONE;
		}
		off += pl;
	}
	if (changed)
		lu_ua_all_locked(lu, UA_MODE_CHANGED, cmd->nexus);
	/* the nexus that selected knows the values it set */
	struct nexus_lu *self_nl = scsi_cmd_nlu(cmd);
	if (self_nl)
		self_nl->mode_seen = lu_mode_state(lu);
	pthread_mutex_unlock(&lu->mutex);
	return SCSI_RC_DONE;
}

/* ---------------------------------------------------------------- */
/* REPORT SUPPORTED OPERATION CODES                                  */

#define RSOC_ALL 0
#define RSOC_ONE_NO_SA 1
#define RSOC_ONE_SA 2
#define RSOC_ONE_ANY 3
#define RSOC_CTDP 0x02
#define RSOC_SERVACTV 0x01
#define RSOC_SUPPORTED 0x03
#define RSOC_NOT_SUPPORTED 0x01
#define TIMEOUT_DESC_LEN 12

static size_t timeouts_desc(uint8_t *b)
{
	memset(b, 0, TIMEOUT_DESC_LEN);
	be16_put(b, TIMEOUT_DESC_LEN - 2);
	be32_put(b + 4, 0);   /* nominal: not specified */
	be32_put(b + 8, 30);  /* recommended: 30 s */
	return TIMEOUT_DESC_LEN;
}

enum scsi_rc spc_report_supported_opcodes(struct scsi_cmd *cmd)
{
	bool rctd = cmd->cdb[2] & 0x80;
	uint8_t opts = cmd->cdb[2] & 0x07;
	uint8_t req_op = cmd->cdb[3];
	uint16_t req_sa = be16_get(cmd->cdb + 4);
	uint32_t alloc = be32_get(cmd->cdb + 6);
	size_t n;
	const struct cmd_desc *tab = scsi_cmd_table(&n);
	uint8_t b[4096];
	size_t off;

	memset(b, 0, sizeof(b));
	if (opts == RSOC_ALL) {
		off = 4;
		for (size_t i = 0; i < n; i++) {
			uint8_t *d = b + off;
			d[0] = tab[i].opcode;
			if (tab[i].flags & CMDF_SA) {
				be16_put(d + 2, tab[i].sa);
				d[5] |= RSOC_SERVACTV;
			}
			if (rctd)
				d[5] |= RSOC_CTDP;
			be16_put(d + 6, tab[i].cdb_len);
			off += 8;
			if (rctd)
				off += timeouts_desc(b + off);
		}
		be32_put(b, (uint32_t)(off - 4));
	} else if (opts <= RSOC_ONE_ANY) {
		const struct cmd_desc *found = NULL;
		bool has_sa_form = false;
		for (size_t i = 0; i < n; i++) {
			if (tab[i].opcode != req_op)
				continue;
			has_sa_form = tab[i].flags & CMDF_SA;
			if (!has_sa_form || tab[i].sa == req_sa) {
				found = &tab[i];
				break;
			}
		}
		if (opts == RSOC_ONE_NO_SA && has_sa_form)
			return scsi_fail_cdb(cmd, 2, 2);
		if (opts == RSOC_ONE_SA && found && !(found->flags & CMDF_SA))
			return scsi_fail_cdb(cmd, 2, 2);
		if (opts == RSOC_ONE_SA && !found && !has_sa_form) {
			bool exists = false;
			for (size_t i = 0; i < n; i++)
				exists |= tab[i].opcode == req_op;
			if (exists)
				return scsi_fail_cdb(cmd, 2, 2);
		}
		if (!found) {
			b[1] = RSOC_NOT_SUPPORTED;
			off = 4;
		} else {
			b[1] = RSOC_SUPPORTED | (rctd ? 0x80 : 0);
			be16_put(b + 2, found->cdb_len);
			memcpy(b + 4, found->usage, found->cdb_len);
			if (found->flags & CMDF_SA)
				b[5] = found->sa | (found->usage[1] & 0xe0);
			off = 4 + found->cdb_len;
			if (rctd)
				off += timeouts_desc(b + off);
		}
	} else {
		return scsi_fail_cdb(cmd, 2, 2);
	}
	scsi_data_in(cmd, b, off, alloc);
	return SCSI_RC_DONE;
}

/* ---------------------------------------------------------------- */
/* REPORT TARGET PORT GROUPS, asymmetric access (SPC-4 5.15)          */

/*
 * A LU over a local store has one target port group, active/optimized.
 * A LU over a shared store (an RBD image exported by several gateways,
 * bdev.h "Ownership") uses implicit ALUA, one group per gateway: the
 * group of the gateway holding the image's lock is active/optimized,
 * every other one active/non-optimized. Not standby, on purpose: hosts
 * keep I/O off standby ports and, with implicit-only ALUA (TPGS 01b),
 * have no SET TARGET PORT GROUPS to wake one up (Linux scsi_dh_alua fails
 * I/O to a standby path in its prep function; VMware's VMW_SATP_ALUA and
 * Windows MSDSM also move I/O only to active groups), so a takeover
 * driven by the host's I/O needs the non-owners to be active. The host's
 * multipath prefers the optimized group; when that path dies it sends
 * I/O to a non-optimized one, which then takes the lock (TRANSITIONING,
 * NOT READY 04/0A, retried by the host) and becomes the optimized group.
 * Identification (VPD 0x83) is per gateway N: target port group N and
 * relative target port N; the LU's NAA and serial are the same everywhere.
 */
#define ALUA_ACTIVE_OPTIMIZED 0x00
#define ALUA_ACTIVE_NONOPTIMIZED 0x01
#define ALUA_UNAVAILABLE 0x03
#define ALUA_TRANSITIONING 0x0f
#define ALUA_PREF 0x80
#define ALUA_T_SUP 0x80
#define ALUA_U_SUP 0x08
#define ALUA_AN_SUP 0x02
#define ALUA_AO_SUP 0x01
#define ALUA_STATUS_IMPLICIT 0x02 /* state altered by implicit ALUA behaviour */
#define RTPG_EXTENDED 0x01
/* Implicit transition time in the extended header (seconds): taking the
 * lock of a dead gateway (break, blocklist, acquire, drop the cache) takes
 * a few seconds; a slow cluster's op timeout more. */
#define ALUA_IMPLICIT_TRANSITION_SECS 60
#define ALUA_MAX_GROUPS 32

/* This gateway's group's state as the LU's shared store says. */
static uint8_t own_alua_state(enum bdev_owner_state st)
{
	switch (st) {
	case BDEV_OWNER_OWNED: return ALUA_ACTIVE_OPTIMIZED;
	case BDEV_OWNER_TRANSITION: return ALUA_TRANSITIONING;
	case BDEV_OWNER_LOST: return ALUA_UNAVAILABLE;
	case BDEV_OWNER_STANDBY: break;
	}
	return ALUA_ACTIVE_NONOPTIMIZED;
}

enum scsi_rc spc_alua_refuse(struct scsi_cmd *cmd, enum bdev_owner_state st)
{
	struct scsi_lu *lu = cmd->lu;

	/* Never blocks: the driver takes the lock on its own thread. A host
	 * sends media access here only once its path to the owner failed, so
	 * the owner is taken to be gone (this is implicit failover). */
	if (st == BDEV_OWNER_STANDBY || st == BDEV_OWNER_LOST)
		lu->owner->acquire(lu->dev);
	return scsi_fail(cmd, SK_NOT_READY,
			 st == BDEV_OWNER_LOST ? ASC_LU_NOT_ACCESSIBLE_UNAVAILABLE : ASC_LU_NOT_ACCESSIBLE_TRANSITION);
}

/* One target port group descriptor with one target port; returns its length. */
static size_t tpg_desc(uint8_t *g, uint8_t state, uint8_t supported, uint8_t status, uint16_t group,
		       uint16_t rel_port)
{
	memset(g, 0, 12);
	g[0] = state;
	g[1] = supported;
	be16_put(g + 2, group);
	g[5] = status;
	g[7] = 1; /* one target port */
	be16_put(g + 10, rel_port);
	return 12;
}

enum scsi_rc spc_report_target_pgs(struct scsi_cmd *cmd)
{
	struct scsi_lu *lu = cmd->lu;
	uint32_t alloc = be32_get(cmd->cdb + 6);
	uint8_t fmt = cmd->cdb[1] >> 5;
	uint8_t b[8 + 12 * (ALUA_MAX_GROUPS + 1)];
	size_t off = 4;

	if (fmt > RTPG_EXTENDED)
		return scsi_fail_cdb(cmd, 1, 7);
	memset(b, 0, sizeof(b));
	if (fmt == RTPG_EXTENDED) {
		b[4] = 0x10;   /* format: extended header */
		b[5] = lu->owner ? ALUA_IMPLICIT_TRANSITION_SECS : 0;
		off = 8;
	}
	if (!lu->owner) {
		off += tpg_desc(b + off, ALUA_PREF | ALUA_ACTIVE_OPTIMIZED, ALUA_AO_SUP, 0, (uint16_t)lu->tpg,
				lu->rel_port);
	} else {
		uint64_t gen;
		enum bdev_owner_state st = lu->owner->state(lu->dev, &gen);
		uint32_t owner = lu->owner->owner_group ? lu->owner->owner_group(lu->dev) : 0;
		uint32_t n = lu->alua_groups ? lu->alua_groups : 1;
		const uint8_t sup = ALUA_T_SUP | ALUA_U_SUP | ALUA_AN_SUP | ALUA_AO_SUP;
		if (n > ALUA_MAX_GROUPS)
			n = ALUA_MAX_GROUPS;
		for (uint32_t g = 1; g <= n || (g == n + 1 && lu->tpg > n); g++) {
			uint32_t id = g <= n ? g : lu->tpg;
			uint8_t state;
			if (id == lu->tpg)
				state = own_alua_state(st);
			else if (id == owner && st != BDEV_OWNER_OWNED)
				state = ALUA_ACTIVE_OPTIMIZED;
			else
				state = ALUA_ACTIVE_NONOPTIMIZED;
			off += tpg_desc(b + off, state, sup,
					state == ALUA_ACTIVE_OPTIMIZED ? ALUA_STATUS_IMPLICIT : 0, (uint16_t)id,
					id == lu->tpg ? lu->rel_port : (uint16_t)id);
		}
	}
	be32_put(b, (uint32_t)(off - 4));
	scsi_data_in(cmd, b, off, alloc);
	return SCSI_RC_DONE;
}

/* ---------------------------------------------------------------- */
/* START STOP UNIT, PREVENT ALLOW MEDIUM REMOVAL, SEND DIAGNOSTIC      */

enum scsi_rc spc_start_stop_unit(struct scsi_cmd *cmd)
{
	uint8_t pc = cmd->cdb[4] >> 4;
	bool loej = cmd->cdb[4] & 0x02;
	bool start = cmd->cdb[4] & 0x01;

	/* Power conditions are accepted and have no effect (always active).
	 * Ejecting a medium that cannot be removed: refuse while prevented. */
	if (pc == 0 && loej && !start) {
		struct nexus_lu *nl;
		bool prevented = false;
		pthread_mutex_lock(&cmd->lu->mutex);
		for (nl = cmd->lu->attached; nl; nl = nl->next_in_lu)
			prevented |= nl->prevent;
		pthread_mutex_unlock(&cmd->lu->mutex);
		if (prevented)
			return scsi_fail(cmd, SK_ILLEGAL_REQUEST, ASC_MEDIUM_REMOVAL_PREVENTED);
	}
	return SCSI_RC_DONE;
}

enum scsi_rc spc_prevent_allow(struct scsi_cmd *cmd)
{
	struct nexus_lu *nl = scsi_cmd_nlu(cmd);
	uint8_t prevent = cmd->cdb[4] & 0x03;

	if (nl) {
		pthread_mutex_lock(&cmd->lu->mutex);
		nl->prevent = prevent & 0x01;
		pthread_mutex_unlock(&cmd->lu->mutex);
	}
	return SCSI_RC_DONE;
}

enum scsi_rc spc_send_diagnostic(struct scsi_cmd *cmd)
{
	uint8_t selftest = cmd->cdb[1] & 0x04;
	uint8_t code = cmd->cdb[1] >> 5;
	uint16_t plen = be16_get(cmd->cdb + 3);

	cmd->cdb_xfer_len = plen;
	/* Only the default self-test (which always passes) is offered. */
	if (!selftest || code != 0)
		return scsi_fail_cdb(cmd, 1, selftest ? 7 : 2);
	if (plen)
		return scsi_fail_cdb(cmd, 3, -1);
	return SCSI_RC_DONE;
}
