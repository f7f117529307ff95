/*
 * tcmu.h - the LIO front end: serve user:tiercache backstores through
 * target_core_user with libtcmu.
 *
 * Why: on production Linux hosts the kernel's LIO target (configured with
 * targetcli) owns the iSCSI/FC/iSER fabrics; TCMU lets it hand SCSI
 * commands to a userspace handler, as tcmu-runner's rbd or qcow handlers
 * do. tiercached claims the handler subtype "tiercache". A LIO device
 * created with dev_config "tiercache/LUN-NAME" (targetcli:
 * /backstores/user:tiercache create name=N size=S cfgstring=LUN-NAME)
 * attaches to the config's [lun LUN-NAME], and its commands run through
 * the same backstore/ and cache/ code as the built-in portal's.
 *
 * Shape: one "tc-tcmu" thread waits on libtcmu's netlink fd and runs the
 * added/removed/reconfig callbacks; each device is pinned to one worker,
 * which watches the device's uio fd, pulls commands off the ring and
 * completes them (xlate.c does the translation). Commands are asynchronous:
 * a device has as many in flight as LIO queues. With D-Bus registration a
 * "tc-dbus" thread runs libtcmu's GDBus callbacks (targetcli's CheckConfig).
 *
 * Threading contract: tcmu_start, tcmu_stop and tcmu_status_json from the
 * main thread (status: also the control thread), workers running.
 */
#ifndef TC_TCMU_H
#define TC_TCMU_H

#include <stdbool.h>
#include <stddef.h>

struct scsi_lu;
struct json_object;

/*
 * Start serving LIO devices for the given LUs (looked up by
 * scsi_lu_name). dbus: also register the handler with the TCMU handler
 * manager (tcmu-runner) on the system bus, so targetcli lists
 * user:tiercache and shows check_config's reasons. Returns 0 when
 * serving, 1 when TCMU is not available on this machine (the reason is
 * logged in one line; the caller goes on with the built-in portal), -1 on
 * a real error with a sentence in err.
 */
int tcmu_start(struct scsi_lu *const *lus, int nlus, bool dbus, char *err, size_t errlen);

/* Detach every device (in-flight commands complete first), stop the
 * netlink thread and close libtcmu. Before workers_stop. */
void tcmu_stop(void);

/* {"enabled":bool, "devices":[{name, uio, lun, blocks, block_size,
 * submitted, completed, inflight, max_inflight, errors}]} into obj. */
void tcmu_status_json(struct json_object *obj);

#endif
