/*
 * rbd_space.c - how much room an RBD image's pool has left (bdev_space),
 * and what a write meets when it has none.
 *
 * The pool an image allocates from is its RADOS pool, shared with every
 * other image there. Its limit is the pool's quota when one is set
 * (`ceph osd pool set-quota POOL max_bytes N`), else what the cluster
 * could still store in it (`ceph df`'s MAX AVAIL: free OSD space to the
 * full ratio, divided by the replication). Both come from the monitors
 * (`osd pool get-quota` and `df`), which learn the pool's usage from the
 * manager's statistics a few seconds late, as Ceph itself enforces quotas.
 * What the image itself has allocated is counted only where it is cheap:
 * images with the fast-diff feature (the object map says which objects
 * exist); elsewhere it is left unknown rather than listing every object.
 *
 * Out of space: when a pool reaches its quota (or the cluster its full
 * ratio), Ceph marks it full and librados holds every write to it, overwrites
 * and discards included, until the mark goes: librbd's writes would hang
 * until ceph_timeout and then end BUSY, and a host would retry them forever.
 * So while the last look saw the pool full, writes, discards and zeroing
 * fail at once with -EDQUOT, which the backstore answers with DATA PROTECT,
 * SPACE ALLOCATION FAILED WRITE PROTECT (07/27/07) and the write-back cache
 * takes as "keep the data dirty, take only overwrites of cached blocks";
 * a write that was already held and timed out while the pool is full ends
 * the same way. Reads go on. The next look that finds room (quota raised,
 * images or snapshots removed) lets writes through again, with no restart.
 *
 * Threading: rbd_space runs on the space monitor's thread (it may block, up
 * to the cluster's operation timeout) inside the handles; pool_full is an
 * atomic read by the I/O path.
 */
#include "bdev/rbd_int.h"

#include "common/log.h"

#include <errno.h>
#include <json-c/json.h>
#include <string.h>

/* Run a monitor command {"prefix": PREFIX, "format": "json"[, "pool": POOL]}
 * and parse its answer: 0 and *out (json_object_put it), or -errno. */
static int mon_json(rados_t cluster, const char *prefix, const char *pool, struct json_object **out)
{
	struct json_object *c = json_object_new_object();
	if (!c)
		return -ENOMEM;
	json_object_object_add(c, "prefix", json_object_new_string(prefix));
	json_object_object_add(c, "format", json_object_new_string("json"));
	if (pool)
		json_object_object_add(c, "pool", json_object_new_string(pool));
	const char *cmd[1] = {json_object_to_json_string_ext(c, JSON_C_TO_STRING_PLAIN)};
	char *outbuf = NULL, *outs = NULL;
	size_t outlen = 0, outslen = 0;
	int r = rados_mon_command(cluster, cmd, 1, "", 0, &outbuf, &outlen, &outs, &outslen);
	json_object_put(c);
	if (r >= 0) {
		struct json_tokener *tok = json_tokener_new();
		*out = tok ? json_tokener_parse_ex(tok, outbuf ? outbuf : "", (int)outlen) : NULL;
		if (tok)
			json_tokener_free(tok);
		r = *out ? 0 : -EBADMSG;
	}
	if (outbuf)
		rados_buffer_free(outbuf);
	if (outs)
		rados_buffer_free(outs);
	return r;
}

/* an unsigned member of o, or def when absent */
static uint64_t json_u64(struct json_object *o, const char *key, uint64_t def)
{
	struct json_object *v;
	if (!o || !json_object_object_get_ex(o, key, &v))
		return def;
	int64_t n = json_object_get_int64(v);
	return n > 0 ? (uint64_t)n : 0;
}

/* `ceph df`'s stats of the pool named pool, or NULL */
static struct json_object *df_pool_stats(struct json_object *df, const char *pool)
{
	struct json_object *pools, *name, *stats;
	if (!json_object_object_get_ex(df, "pools", &pools) || !json_object_is_type(pools, json_type_array))
		return NULL;
	for (size_t i = 0; i < json_object_array_length(pools); i++) {
		struct json_object *p = json_object_array_get_idx(pools, i);
		if (json_object_object_get_ex(p, "name", &name) && json_object_is_type(name, json_type_string) &&
		    !strcmp(json_object_get_string(name), pool) &&
		    json_object_object_get_ex(p, "stats", &stats))
			return stats;
	}
	return NULL;
}

static int count_extent(uint64_t off, size_t len, int exists, void *arg)
{
	(void)off;
	if (exists)
		*(uint64_t *)arg += len;
	return 0;
}

/* The image's allocated bytes when the object map makes it cheap: 0 and
 * *alloc, or -ENOTSUP. */
static int image_alloc(struct rbd_bdev *rb, uint64_t *alloc)
{
	uint64_t features = 0;
	if (rbd_get_features(rb->image, &features) < 0 || !(features & RBD_FEATURE_FAST_DIFF))
		return -ENOTSUP;
	uint64_t flags = 0;
	if (rbd_get_flags(rb->image, &flags) == 0 && (flags & RBD_FLAG_FAST_DIFF_INVALID))
		return -ENOTSUP;
	*alloc = 0;
	int r = rbd_diff_iterate2(rb->image, NULL, 0, __atomic_load_n(&rb->dev.size, __ATOMIC_RELAXED), 0, 1,
				  count_extent, alloc);
	return r < 0 ? r : 0;
}

static void set_full(struct rbd_bdev *rb, bool full, uint64_t quota, uint64_t used)
{
	if (atomic_exchange(&rb->pool_full, full) == full)
		return;
	if (!full)
		log_info("rbd %s: pool %s has room again (%llu bytes stored%s); writes are taken again", rb->spec,
			 rb->pool, (unsigned long long)used, quota ? " against its quota" : "");
	else if (quota)
		log_err("rbd %s: pool %s is full: %llu bytes stored, quota %llu; writes fail with SPACE "
			"ALLOCATION FAILED until the quota is raised (ceph osd pool set-quota %s max_bytes N) "
			"or data is removed",
			rb->spec, rb->pool, (unsigned long long)used, (unsigned long long)quota, rb->pool);
	else
		log_err("rbd %s: pool %s is full: the cluster can store nothing more in it; writes fail with SPACE "
			"ALLOCATION FAILED until OSD space is added or data is removed",
			rb->spec, rb->pool);
}

int rbd_space(struct bdev *dev, struct bdev_space *out)
{
	struct rbd_bdev *rb = rbd_bdev_of(dev);
	struct json_object *quota = NULL, *df = NULL;

	if (!rbd_handles_enter(rb))
		return -ENOTCONN;
	int r = mon_json(rb->cluster, "osd pool get-quota", rb->pool, &quota);
	if (r == 0)
		r = mon_json(rb->cluster, "df", NULL, &df);
	struct json_object *st = df ? df_pool_stats(df, rb->pool) : NULL, *v;
	if (r == 0 && (!st || !json_object_object_get_ex(st, "max_avail", &v)))
		r = -ENOENT;
	if (r == -ENOENT) {
		/* the monitors have no usage statistics for the pool: no manager
		 * runs (they come from ceph-mgr), or it has not reported yet */
		if (!rb->space_unknown_logged)
			log_info("rbd %s: the cluster has no usage statistics for pool %s (is a ceph-mgr running?): "
				 "its space is unknown until it has",
				 rb->spec, rb->pool);
		rb->space_unknown_logged = true;
		r = -ENOTSUP;
		goto out;
	}
	if (r < 0)
		goto out;
	rb->space_unknown_logged = false;

	uint64_t qbytes = json_u64(quota, "quota_max_bytes", 0);
	uint64_t qobjs = json_u64(quota, "quota_max_objects", 0);
	uint64_t objs = json_u64(quota, "current_num_objects", json_u64(st, "objects", 0));
	uint64_t used = json_u64(quota, "current_num_bytes", json_u64(st, "stored", 0));
	uint64_t max_avail = json_u64(st, "max_avail", 0);
	if (qbytes) {
		uint64_t left = qbytes > used ? qbytes - used : 0;
		out->pool_bytes = qbytes;
		out->pool_free = left < max_avail ? left : max_avail;
	} else {
		out->pool_bytes = used + max_avail;
		out->pool_free = max_avail;
	}
	out->alloc_known = image_alloc(rb, &out->alloc) == 0;
	set_full(rb, (qbytes && used >= qbytes) || (qobjs && objs >= qobjs) || !max_avail, qbytes, used);
out:
	rbd_handles_exit(rb);
	if (quota)
		json_object_put(quota);
	if (df)
		json_object_put(df);
	return r;
}
