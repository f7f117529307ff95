/*
 * portal.h - the built-in iSCSI portal (RFC 7143), its public surface.
 *
 * The daemon builds the SCSI targets (backstore/scsi.h), describes how each
 * may be reached (ACL, CHAP), and starts the portal on its listen
 * addresses. Connections are spread over the worker threads
 * (common/worker.h); each connection lives on one worker for its lifetime.
 *
 * Threading contract: iscsi_portal_start and iscsi_portal_drain are called
 * from the main thread, after workers_start() and before workers_stop().
 */
#ifndef TC_ISCSI_PORTAL_H
#define TC_ISCSI_PORTAL_H

#include <stddef.h>
#include <stdint.h>

struct scsi_target;

struct iscsi_target_cfg {
	const char *iqn;
	struct scsi_target *scsi;
	const char *const *allow; /* initiator IQNs allowed; nallow == 0: any */
	int nallow;
	const char *chap_user;    /* NULL: no CHAP */
	const char *chap_secret;
	const char *mutual_user;  /* NULL: no mutual CHAP */
	const char *mutual_secret;
};

struct iscsi_listen_cfg {
	const char *addr;         /* numeric IPv4/IPv6 or host name */
	uint16_t port;
};

struct iscsi_portal_cfg {
	const struct iscsi_listen_cfg *listen;
	int nlisten;
	const struct iscsi_target_cfg *targets;
	int ntargets;
	unsigned nop_interval;    /* seconds of idle before a NOP-In ping; 0 = off */
	unsigned nop_timeout;     /* seconds to wait for the answer before dropping */
	unsigned tpgt;            /* TargetPortalGroupTag: this gateway's port group (0 = 1) */
	/* CHAP for discovery sessions, as a target's (NULL: none) */
	const char *disc_chap_user, *disc_chap_secret;
	const char *disc_mutual_user, *disc_mutual_secret;
};

/*
 * Bind every listen address and start accepting. The configuration and the
 * strings it points to must outlive the portal. 0, or -1 with a sentence in
 * err naming the address and the fix (e.g. "127.0.0.1:3260 is in use by
 * another program; stop it or change listen").
 */
int iscsi_portal_start(const struct iscsi_portal_cfg *cfg, char *err, size_t errlen);

/*
 * Configuration reload (main thread): from now on logins and SendTargets
 * use cfg's target list (listen addresses and NOP timing stay those the
 * portal started with). The old cfg is still read by logins in progress
 * and sessions keep pointers into it: keep it (and what it points to)
 * until the portal is drained. A target is the same target across the
 * switch when its entry has the same scsi target object.
 */
void iscsi_portal_update(const struct iscsi_portal_cfg *cfg);

/*
 * Reload: ask every session of target scsi to log out (Asynchronous
 * Message), closing each connection once its in-flight commands have
 * answered. Returns at once; scsi_target_nexus_count tells when they are
 * gone. Main thread.
 */
void iscsi_portal_close_target(const struct scsi_target *scsi);

/*
 * Stop accepting, let every command in flight complete and its response go
 * out, then close all connections. Blocks until done (bounded by a timeout
 * of a few seconds for initiators that stop reading).
 */
void iscsi_portal_drain(void);

/* Logins since start (any thread): accepted, refused (the initiator's
 * fault: status class 2), failed (the target's: class 3). */
void iscsi_login_counts(uint64_t *ok, uint64_t *refused, uint64_t *failed);

#endif
