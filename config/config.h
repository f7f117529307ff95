/*
 * config.h - the tiercached configuration file: parse, validate, defaults.
 *
 * The file is INI (parsed with inih). Every error names the file and line and
 * says how to fix it: "FILE:LINE: what is wrong; what to do". Validation is
 * complete before anything is opened, so `tiercached --check` and a real start
 * refuse exactly the same files.
 *
 * Sections:
 *   [daemon]        state_dir, control_socket, workers, poll_us, log_level, metrics,
 *                   nop_interval, nop_timeout, space_interval
 *   [portal]        listen (repeatable; host:port, [v6]:port), port_group,
 *                   discovery_chap_user/_secret, discovery_mutual_user/_secret
 *   [target IQN]    lunN = LUN-NAME, allow, chap_user/chap_secret,
 *                   mutual_user/mutual_secret
 *   [lun NAME]      backing, size, block_size, serial, write_cache, read_only,
 *                   cache (the [cache NAME] set in front of the backing store),
 *                   ceph_conf, ceph_user, ceph_timeout (backing = rbd:POOL/IMAGE),
 *                   gateways (how many gateways export the image: implicit ALUA),
 *                   space_warn (thin provisioning soft threshold), io_timeout
 *   [cache NAME]    legs = A [B], allow_single_leg, size, extent, mode,
 *                   admit_hits, seq_cutoff, dirty_target (cache/cache.h)
 *   [tcmu]          enable (serve LIO's user:tiercache backstores through
 *                   target_core_user; see target/tcmu/tcmu.h), dbus,
 *                   portal (LIO's portals, for tierctl targetcli)
 *
 * Relative paths are taken relative to the daemon's working directory.
 * Not thread-safe; called from the main thread only.
 */
#ifndef TC_CONFIG_H
#define TC_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CFG_MAX_LISTEN 16
#define CFG_MAX_LUNS_PER_TARGET 256
#define CFG_MAX_ALLOW 64
#define CFG_MAX_GATEWAYS 32

struct cfg_lun {
	char *name;
	char *backing;
	uint64_t size;        /* bytes; 0 = size of an existing backing store */
	uint32_t block_size;  /* 512 or 4096 */
	char *serial;         /* "auto" or up to 32 printable ASCII chars */
	bool write_cache;     /* initial WCE bit (default off: durable on status) */
	bool read_only;
	bool backing_buffered; /* backing_io = buffered: a file through the page cache */
	int backing_io_line;
	char *cache;          /* [cache NAME] in front of it, or NULL */
	struct cfg_cache *cache_set; /* resolved after parsing */
	int cache_line;
	/* backing = rbd:POOL/IMAGE only (bdev/rbd.c) */
	char *ceph_conf;      /* NULL: /etc/ceph/ceph.conf */
	char *ceph_user;      /* cephx id without "client."; NULL: admin */
	unsigned ceph_timeout; /* seconds before a cluster operation fails; 0: 30 */
	int ceph_line;        /* first ceph_* key, 0 if none */
	/* gateways exporting this LUN (implicit ALUA over an RBD image's lock);
	 * 1 = this one only (default) */
	unsigned gateways;
	int gateways_line;
	/* thin provisioning soft threshold, percent used (1..99); 0 = off */
	unsigned space_warn;
	/* seconds a command may wait on the backing store before the host is
	 * answered ABORTED COMMAND (default 30; 0 = never) */
	unsigned io_timeout;
	int line;             /* where the section starts */
};

struct cfg_cache {
	char *name;
	char *legs[2];
	int nlegs;
	bool allow_single_leg;
	uint64_t size;         /* bytes per leg; 0 = existing size */
	uint32_t extent;       /* bytes, power of two, 64 KiB .. 4 MiB (default 256 KiB) */
	int mode;              /* enum cache_mode (default write-back) */
	uint32_t admit_hits;   /* misses before promotion (default 2) */
	uint64_t seq_cutoff;   /* sequential bypass (default 4 MiB; 0 = off) */
	uint32_t dirty_target; /* percent (default 10) */
	uint64_t destage_max;  /* bytes per second, 0 = no cap */
	uint32_t destage_max_iops; /* backing writes per second, 0 = no cap */
	unsigned leg_timeout;  /* seconds before a leg that does not answer is failed (default 10; 0 = never) */
	uint32_t max_read_errors; /* rewritten unreadable ranges per leg and hour before it is failed (default 50; 0 = no limit) */
	bool fault_injection;  /* tests only: tierctl leg fault may fail the legs */
	int line;
};

struct cfg_target_lun {
	uint64_t lun;
	char *lun_name;
	struct cfg_lun *lu;   /* resolved after parsing */
	int line;
};

struct cfg_target {
	char *iqn;
	struct cfg_target_lun luns[CFG_MAX_LUNS_PER_TARGET];
	int nluns;
	char *allow[CFG_MAX_ALLOW]; /* empty = any initiator */
	int nallow;
	char *chap_user, *chap_secret;
	char *mutual_user, *mutual_secret;
	int line;
};

struct cfg_listen {
	char *addr;   /* literal host part, without brackets */
	uint16_t port;
	int line;
};

struct config {
	char *path;
	/* [daemon] */
	char *state_dir;
	char *control_socket;    /* tierctl's Unix socket */
	unsigned workers;        /* 0 = one per core */
	unsigned poll_us;        /* a worker polls this long after its last events before it sleeps; 0 = never */
	char *log_level;         /* error | warning | info | debug */
	unsigned nop_interval;   /* seconds between NOP-In pings on idle links; 0 = off */
	unsigned nop_timeout;    /* seconds to wait for the ping's answer */
	bool nop_interval_set;   /* given in the file (0 there means off; absent means 30) */
	unsigned space_interval; /* seconds between looks at the backing stores' space (default 10) */
	struct cfg_listen metrics[CFG_MAX_LISTEN]; /* Prometheus /metrics (daemon/metrics.c); none = off */
	int nmetrics;
	/* [portal] */
	struct cfg_listen listen[CFG_MAX_LISTEN];
	int nlisten;
	/* this gateway's target port group, 1..CFG_MAX_GATEWAYS (default 1):
	 * gateway N of a LUN with gateways = M is port group N, relative port N */
	unsigned port_group;
	int port_group_line;
	/* CHAP for discovery sessions (NULL: none), the [portal] keys
	 * discovery_chap_user/_secret and discovery_mutual_user/_secret */
	char *disc_chap_user, *disc_chap_secret;
	char *disc_mutual_user, *disc_mutual_secret;
	int disc_chap_line;
	/* [target ...] and [lun ...] */
	struct cfg_target *targets;
	int ntargets;
	struct cfg_lun *luns;
	int nluns;
	/* [cache ...] */
	struct cfg_cache *caches;
	int ncaches;
	/* [tcmu] */
	bool tcmu_enable;        /* attach LIO user:tiercache devices (default no) */
	bool tcmu_dbus;          /* register with tcmu-runner over D-Bus for targetcli (default no) */
	struct cfg_listen tcmu_portal[CFG_MAX_LISTEN]; /* LIO's portals for tierctl targetcli */
	int ntcmu_portal;        /* 0 = LIO takes the [portal] listen addresses */
};

/*
 * Parse and validate the file at path. Returns 0 and *out, or -1 with a
 * "path:line: ..." sentence in err.
 */
int config_load(const char *path, struct config **out, char *err, size_t errlen);
/* Same, from a string; name is used in messages in place of a path. */
int config_parse_string(const char *text, const char *name, struct config **out,
			char *err, size_t errlen);
void config_free(struct config *cfg);

/* "1G", "512M", "4096", "1.5T" ... -> bytes. 0 on success, -1 if malformed. */
int config_parse_size(const char *s, uint64_t *out);

/*
 * The serial LUN l is served with (<= 32 chars + NUL): the configured one,
 * or for serial = auto the one kept in state_dir, made there first when
 * create is set. 0, or -1 (errno set) when it cannot be read or kept.
 */
int config_lun_serial(const struct config *cfg, const struct cfg_lun *l, bool create, char out[33]);

struct cfg_lun *config_find_lun(const struct config *cfg, const char *name);
struct cfg_cache *config_find_cache(const struct config *cfg, const char *name);

#endif
