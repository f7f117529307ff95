/*
 * libtcmu_abi.h - the part of libtcmu.so.2 (version 1.5.4) that we use.
 *
 * Why this file exists: Debian 12 ships libtcmu.so.2 (package libtcmu2)
 * without a header, so we declare the few structs, constants and functions
 * target/tcmu calls, exactly as the 1.5.4 ABI has them, and nothing else.
 *
 * Sources of the facts, for each item below:
 *  [src] the Debian source package tcmu 1.5.4 (libtcmu.h, libtcmu_common.h),
 *        as summarised in our team's notes on the libtcmu 1.5.4 ABI;
 *  [nm]  the symbols exported by /usr/lib/x86_64-linux-gnu/libtcmu.so.2.2
 *        of libtcmu2 1.5.4-4.1 (`nm -D --defined-only`).
 * Upstream headers newer than 1.5.4 differ (e.g. tcmulib_get_next_command
 * takes one argument there, two here; the handler struct has
 * update_logdir here): do not "update" this file from them.
 *
 * Threading (libtcmu's own rules, [src]): tcmulib_master_fd_ready runs the
 * added/removed/reconfig callbacks on the calling thread; everything that
 * touches one device's ring (processing_start, get_next_command,
 * command_complete, processing_complete) must run on one thread per device.
 */
#ifndef TC_TCMU_LIBTCMU_ABI_H
#define TC_TCMU_LIBTCMU_ABI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

/* Opaque to users of the library [src]. */
struct tcmu_device;
struct tcmulib_context;

/* Size of tcmulib_cmd.sense_buf; the library copies this many bytes of it
 * into the ring on CHECK CONDITION [src: TCMU_SENSE_BUFFERSIZE]. */
#define TCMU_SENSE_BUFFERSIZE 96

/* One command taken off the ring; malloc'ed by tcmulib_get_next_command
 * with hm_cmd_size bytes of handler space (hm_private), freed by
 * tcmulib_command_complete [src: struct tcmulib_cmd, field order]. */
struct tcmulib_cmd {
	uint16_t cmd_id;
	uint8_t *cdb;
	struct iovec *iovec;
	size_t iov_cnt;
	uint8_t sense_buf[TCMU_SENSE_BUFFERSIZE];
	void *hm_private;
};

/* What a reconfig netlink event changes [src: enum tcmulib_cfg_type]. */
enum tcmulib_cfg_type {
	TCMULIB_CFG_DEV_CFGSTR,
	TCMULIB_CFG_DEV_SIZE,
	TCMULIB_CFG_WRITE_CACHE,
};

/* [src: struct tcmulib_cfg_info] */
struct tcmulib_cfg_info {
	enum tcmulib_cfg_type type;
	union {
		uint64_t dev_size;
		char *dev_cfgstring;
		bool write_cache;
	} data;
};

/* A handler claims one subtype (the part of LIO's dev_config before the
 * first '/') [src: struct tcmulib_handler, 1.5.4 field order, including
 * update_logdir]. ctx, hm_private and connection are the library's. */
struct tcmulib_handler {
	const char *name;
	const char *subtype;
	const char *cfg_desc;
	struct tcmulib_context *ctx;
	/* true if cfgstring would work; else *reason = malloc'ed sentence,
	 * which the library free()s and targetcli shows. */
	bool (*check_config)(const char *cfgstring, char **reason);
	int (*reconfig)(struct tcmu_device *dev, struct tcmulib_cfg_info *cfg);
	bool (*update_logdir)(void);
	int (*added)(struct tcmu_device *dev);
	void (*removed)(struct tcmu_device *dev);
	void *hm_private;
	void *connection;
};

/* Result codes for tcmulib_command_complete [src: enum in
 * libtcmu_common.h, 1.5.4 values]. All but OK, NO_RESOURCE (TASK SET
 * FULL), BUSY and TIMEOUT complete with CHECK CONDITION; PASSTHROUGH_ERR
 * sends the sense the handler wrote into cmd->sense_buf unchanged. */
enum {
	TCMU_STS_ASYNC_HANDLED = -2,
	TCMU_STS_NOT_HANDLED = -1,
	TCMU_STS_OK = 0,
	TCMU_STS_NO_RESOURCE = 1,
	TCMU_STS_PASSTHROUGH_ERR = 2,
	TCMU_STS_BUSY = 3,
	TCMU_STS_WR_ERR = 4,
	TCMU_STS_RD_ERR = 5,
	TCMU_STS_MISCOMPARE = 6,
	TCMU_STS_INVALID_CMD = 7,
	TCMU_STS_INVALID_CDB = 8,
	TCMU_STS_INVALID_PARAM_LIST = 9,
	TCMU_STS_INVALID_PARAM_LIST_LEN = 10,
	TCMU_STS_TIMEOUT = 11,
	TCMU_STS_FENCED = 12,
	TCMU_STS_HW_ERR = 13,
	TCMU_STS_RANGE = 14,
};

/* ---- context [src signatures; symbols present per nm] ---- */
struct tcmulib_context *tcmulib_initialize(struct tcmulib_handler *handlers, size_t handler_count);
/* Ask the handler manager (tcmu-runner) on the system bus to list our
 * subtypes; asynchronous GDBus, needs GLib's default context iterated. */
void tcmulib_register(struct tcmulib_context *ctx);
int tcmulib_get_master_fd(struct tcmulib_context *ctx);
int tcmulib_master_fd_ready(struct tcmulib_context *ctx);
void tcmulib_close(struct tcmulib_context *ctx);

/* ---- one device's ring [src; 1.5.4's get_next_command takes hm_cmd_size] ---- */
void tcmulib_processing_start(struct tcmu_device *dev);
struct tcmulib_cmd *tcmulib_get_next_command(struct tcmu_device *dev, int hm_cmd_size);
void tcmulib_command_complete(struct tcmu_device *dev, struct tcmulib_cmd *cmd, int result);
void tcmulib_processing_complete(struct tcmu_device *dev);

/* ---- device accessors [src signatures; nm] ---- */
void *tcmu_dev_get_private(struct tcmu_device *dev);
void tcmu_dev_set_private(struct tcmu_device *dev, void *priv);
int tcmu_dev_get_fd(struct tcmu_device *dev);
char *tcmu_dev_get_cfgstring(struct tcmu_device *dev);
/* The handler fills these in (tcmu-runner reads them from configfs);
 * the library does not, so its getters return 0 until we set them. */
void tcmu_dev_set_num_lbas(struct tcmu_device *dev, uint64_t num_lbas);
void tcmu_dev_set_block_size(struct tcmu_device *dev, uint32_t block_size);
const char *tcmu_dev_get_uio_name(struct tcmu_device *dev);
void tcmu_dev_set_write_cache_enabled(struct tcmu_device *dev, bool enabled);
void tcmu_dev_set_solid_state_media(struct tcmu_device *dev, bool solid_state);

#endif
