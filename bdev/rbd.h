/*
 * rbd.h - RBD images as bdevs (rbd.c, rbd_io.c, rbd_client.c: the bdev,
 * its I/O and the cluster connection; rbd_lock.c: the image's exclusive
 * lock). No Ceph type appears here.
 */
#ifndef TC_BDEV_RBD_H
#define TC_BDEV_RBD_H

#include "bdev/bdev.h"

/*
 * RBD images (bdev/rbd.c, through librbd): backing = rbd:POOL/IMAGE.
 * The cluster is reached with conf (NULL: /etc/ceph/ceph.conf) as the
 * cephx user "client.<user>" (NULL: admin); every cluster operation gives
 * up after op_timeout_s (0: 30 s), so a lost cluster fails I/O with
 * -ETIMEDOUT instead of hanging. size must be 0 or the image's size.
 */
struct bdev_rbd_opts {
	const char *conf;
	const char *user;
	unsigned op_timeout_s;
};
#define BDEV_RBD_PREFIX "rbd:"
#define BDEV_RBD_DEFAULT_CONF "/etc/ceph/ceph.conf"
#define BDEV_RBD_DEFAULT_USER "admin"
#define BDEV_RBD_DEFAULT_TIMEOUT 30

/* spec is "POOL/IMAGE" (without the rbd: prefix). */
struct bdev *bdev_rbd_open(const char *spec, const struct bdev_rbd_opts *opts, uint64_t size,
			   uint32_t block_size, char *err, size_t errlen);

/* What tierctl status shows of an RBD bdev. */
enum bdev_rbd_conn {
	BDEV_RBD_CONNECTED = 0, /* the last cluster operation succeeded */
	BDEV_RBD_LOST,          /* it timed out or the cluster refused us */
};
struct bdev_rbd_status {
	char pool[256];
	char image[256];
	enum bdev_rbd_conn conn;
	uint64_t size;
	bool pool_full; /* the pool is full (bdev/rbd_space.c): writes get -EDQUOT */
};
/*
 * The open RBD bdev whose backing string is backing ("rbd:POOL/IMAGE"):
 * true and *st, or false when none is open. Any thread (the status query).
 */
bool bdev_rbd_status(const char *backing, struct bdev_rbd_status *st);
const char *bdev_rbd_conn_name(enum bdev_rbd_conn c);

/*
 * Ownership of an RBD bdev (bdev/rbd_lock.c), before anything listens:
 * gateways = how many gateways export the image (1: take the lock at the
 * first listen and keep it; more: take it when a host's I/O asks, see
 * bdev_owner_ops.acquire), port_group = this gateway's target port group,
 * gateway_id = a name stable across restarts and distinct per gateway
 * (NULL: "HOSTNAME/PORT_GROUP"). 0, or -1 when dev is not an RBD bdev.
 */
int bdev_rbd_set_gateway(struct bdev *dev, unsigned gateways, uint32_t port_group, const char *gateway_id);

/* Is backing an RBD spec ("rbd:...")? */
static inline bool bdev_backing_is_rbd(const char *backing)
{
	return backing && !__builtin_strncmp(backing, BDEV_RBD_PREFIX, sizeof(BDEV_RBD_PREFIX) - 1);
}

#endif
