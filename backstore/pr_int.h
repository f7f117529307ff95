/*
 * pr_int.h - what pr.c (one gateway's reservations) and pr_shared.c (the
 * same state kept alike by every gateway of a shared LU) share.
 */
#ifndef TC_BACKSTORE_PR_INT_H
#define TC_BACKSTORE_PR_INT_H

#include "backstore/lu.h"

/* Outcome of one service action: status or sense to set. */
enum pr_result { PR_OK, PR_CONFLICT, PR_BAD_CDB_TYPE, PR_BAD_CDB_SCOPE, PR_BAD_PARAM_KEY,
		 PR_BAD_RELEASE, PR_NO_RESOURCES, PR_BAD_PARAM_LEN, PR_BAD_PARAM_FLAGS, PR_BAD_TID };

/* PREEMPT AND ABORT waits at most this long, in all, for the preempted
 * nexuses' commands in flight (pr.c; pr_shared.c, where it is within
 * PR_ANNOUNCE_MS: past that a gateway is fenced anyway). */
#define PR_DRAIN_MS 8000u

/* The longest PERSISTENT RESERVE OUT parameter list taken (REGISTER AND MOVE's). */
#define PR_PARAM_MAX (24 + 4 + PORT_NAME_MAX + 8)

/* pr.c, lu->mutex held by the caller for each. */
/* The state as text (the state file's format), version ver on its first
 * line; shared: with the aptpl line. malloc'd, NULL without memory. */
char *pr_encode(const struct scsi_lu *lu, uint64_t ver, bool shared, size_t *len);
/* Replace the state with the text's: 0 (*ver its version), or -EINVAL / -ENOMEM and the state unchanged. */
int pr_install(struct scsi_lu *lu, const char *text, size_t len, uint64_t *ver);
/* No registration, no reservation. */
void pr_clear_state(struct scsi_lu *lu);
/* One service action of a PERSISTENT RESERVE OUT by nx, on lu->pr. */
enum pr_result pr_apply(struct scsi_lu *lu, struct scsi_nexus *nx, uint8_t sa, uint8_t type, uint64_t key,
			uint64_t sa_key, uint8_t flags, const uint8_t *p, uint32_t plen);
/* Set cmd's status or sense for res. No lock needed. */
void pr_answer(struct scsi_cmd *cmd, enum pr_result res);

/* pr_shared.c */
/* While a change is being made on a shared LU: keep the unit attention
 * for every gateway (true), or deliver it here now (false). Locked. */
bool pr_shared_capture(struct scsi_lu *lu, unsigned ua, const char *i_port, const char *t_port);
/* A change is being tried on lu->pr (not the cluster's yet). Locked. */
bool pr_shared_trying(const struct scsi_lu *lu);
/* A PERSISTENT RESERVE OUT on a shared LU: made in the cluster, answered later. */
enum scsi_rc pr_shared_out(struct scsi_cmd *cmd, uint8_t sa, uint8_t type, uint64_t key, uint64_t sa_key,
			   uint8_t flags, const uint8_t *p, uint32_t plen);

#endif
