/*
 * spc_mode.c - MODE SENSE and MODE SELECT (6 and 10): the mode pages.
 *
 * Pages: read-write error recovery (01h), caching (08h), control (0Ah)
 * and informational exceptions (1Ch), and with a thin provisioning
 * threshold the logical block provisioning subpage (1Ch/02h, lu_space.c).
 * WCE, D_SENSE, SWP and (with a threshold) LBPERE are changeable and
 * honoured (the LU's atomics the data path reads); nothing is savable.
 * A MODE SELECT that changes a parameter gives every other I_T nexus of
 * the LU the MODE PARAMETERS CHANGED unit attention.
 *
 * Threading: on the submitting worker. Mode parameters other than the
 * atomics are read and written under lu->mutex.
 */
#include "backstore/lu.h"

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

#define MP_SUB_LBP 0x02
#define MP_SUB_ALL 0xff
#define RWER_LBPERE 0x80
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
		/* LBPERE: threshold notification on (lu_space.c) */
		if (lu->space_warn && (changeable || dflt || atomic_load(&lu->lbpere)))
			b[7] = RWER_LBPERE;
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
	bool lbp_only = page == MP_INFO_EXCEPTIONS && subpage == MP_SUB_LBP;
	if (subpage != 0 && !lbp_only && subpage != MP_SUB_ALL)
		return scsi_fail_cdb(cmd, 3, 7);
	if (subpage == MP_SUB_ALL && page != MP_ALL && page != MP_INFO_EXCEPTIONS)
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
	if (lbp_only) {
		size_t l = lu_space_mode_page(lu, pc, b + off);
		if (!l) {
			pthread_mutex_unlock(&lu->mutex);
			return scsi_fail_cdb(cmd, 3, 7); /* no threshold: no such subpage */
		}
		off += l;
	} else if (page == MP_ALL) {
		for (size_t i = 0; i < sizeof(mode_pages); i++) {
			off += mode_page(lu, mode_pages[i], pc, b + off);
			if (subpage == MP_SUB_ALL && mode_pages[i] == MP_INFO_EXCEPTIONS)
				off += lu_space_mode_page(lu, pc, b + off);
		}
	} else {
		size_t l = mode_page(lu, page, pc, b + off);
		if (!l) {
			pthread_mutex_unlock(&lu->mutex);
			return scsi_fail_cdb(cmd, 2, 5);
		}
		off += l;
		if (subpage == MP_SUB_ALL)
			off += lu_space_mode_page(lu, pc, b + off);
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
	size_t len;

	if (p[0] & 0x40) {
		/* the one subpage: the threshold, which nothing here changes */
		len = page == MP_INFO_EXCEPTIONS && p[1] == MP_SUB_LBP ? lu_space_mode_page(lu, MP_PC_CURRENT, cur)
								       : 0;
		if (!len) {
			if (page == MP_INFO_EXCEPTIONS)
				scsi_fail_param(cmd, (unsigned)po + 1, -1); /* no such subpage */
			else
				scsi_fail_param(cmd, (unsigned)po, 5);
			return false;
		}
		if (plen != len) {
			scsi_fail_param(cmd, (unsigned)po + 2, -1);
			return false;
		}
		for (size_t i = 4; i < len; i++)
			if (p[i] != cur[i]) {
				scsi_fail_param(cmd, (unsigned)(po + i), -1);
				return false;
			}
		return true;
	}
	len = mode_page(lu, page, MP_PC_CURRENT, cur);
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
	case MP_RW_ERROR_RECOVERY: {
		bool on = p[7] & RWER_LBPERE;
		if (on != atomic_load(&lu->lbpere)) {
			atomic_store(&lu->lbpere, on);
			*changed |= 1;
		}
		break;
	}
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
		if (buf[off] & 0x40) { /* SPF: a two-byte page length at 2 */
			if (off + 4 > plen) {
				pthread_mutex_unlock(&lu->mutex);
				return scsi_fail(cmd, SK_ILLEGAL_REQUEST, ASC_PARAM_LIST_LENGTH_ERROR);
			}
			pl = (size_t)be16_get(buf + off + 2) + 4;
		}
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
