/*
 * spc.c - SCSI primary commands (SPC-4) for a direct-access LU.
 *
 * What an initiator asks before it does any I/O. INQUIRY and its VPD pages
 * are in spc_vpd.c, MODE SENSE / MODE SELECT in spc_mode.c; this file
 * answers TEST UNIT READY, REPORT LUNS, REQUEST SENSE, REPORT SUPPORTED
 * OPERATION CODES (generated from lu_dispatch.c's command table),
 * REPORT TARGET PORT GROUPS (implicit ALUA: one active/optimized group, or
 * one group per gateway for a LU over a shared store),
 * and the no-op-ish START STOP UNIT / PREVENT ALLOW / SEND DIAGNOSTIC.
 *
 * Threading: every handler runs on the submitting worker and has its answer
 * ready when it returns (SCSI_RC_DONE: scsi_cmd_submit completes).
 */
#include "backstore/lu.h"

#include <stdlib.h>

enum scsi_rc spc_test_unit_ready(struct scsi_cmd *cmd)
{
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
		struct sense_extra ux = { .info_valid = true };
		if (asc == ASC_THIN_PROV_SOFT_THRESHOLD)
			ux.info = atomic_load(&nl->lu->space_ua_info);
		if (asc)
			len = scsi_sense_format(b, sizeof(b), desc, SK_UNIT_ATTENTION, asc,
						asc == ASC_THIN_PROV_SOFT_THRESHOLD ? &ux : NULL);
		else
			len = scsi_sense_format(b, sizeof(b), desc, SK_NO_SENSE, ASC_NO_ADDITIONAL_SENSE, NULL);
	}
	scsi_data_in(cmd, b, len, alloc);
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
 * I/O to a non-optimized one, whose first write (or other media command
 * but a READ, which a non-owner serves from the store: lu_dispatch.c)
 * takes the lock (TRANSITIONING, NOT READY 04/0A, retried by the host)
 * and makes it the optimized group.
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
	 * sends writes here only once its path to the owner failed, so the
	 * owner is taken to be gone (this is implicit failover). */
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
