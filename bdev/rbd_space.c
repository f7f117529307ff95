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
 * Out of space: when a pool reaches its quota (or its OSDs their full
 * ratio), Ceph marks it full in the OSD map (flags full_quota, full) and
 * librados holds every write to it, overwrites and discards included, until
 * the mark goes: librbd's writes would hang until ceph_timeout and then end
 * BUSY, and a host would retry them forever. So while the last look found
 * that mark (osd pool ls detail: the flags, not the statistics, which lag
 * and read zero after a manager fails over), writes, discards and zeroing
 * fail at once with -EDQUOT, which the backstore answers with DATA PROTECT,
 * SPACE ALLOCATION FAILED WRITE PROTECT (07/27/07) and the write-back cache
 * takes as "keep the data dirty, take only overwrites of cached blocks";
 * a write that was already held and timed out while the pool is full ends
 * the same way. Reads go on. The next look that finds the mark gone (quota
 * raised, images or snapshots removed) lets writes through again, with no
 * restart; a look that cannot tell drops the verdict, and Ceph decides.
 * The pool is found by its id, so a rename is followed.
 *
 * Threading: rbd_space runs on the space monitor's thread (it may block, up
 * to the cluster's operation timeout per monitor command); each cluster call
 * is inside the handles on its own, so a handle swap waits for one call at
 * most. pool_full is an atomic read by the I/O path.
 */
#include "bdev/rbd_int.h"

#include "common/log.h"

#include <errno.h>
#include <json-c/json.h>
#include <string.h>

/* Run a monitor command {"prefix": PREFIX, "format": "json"[, KEY: VAL]}
 * and parse its answer: 0 and *out (json_object_put it), or -errno. */
static int mon_json(rados_t cluster, const char *prefix, const char *key, const char *val, struct json_object **out)
{
	struct json_object *c = json_object_new_object();
	if (!c)
		return -ENOMEM;
	json_object_object_add(c, "prefix", json_object_new_string(prefix));
	json_object_object_add(c, "format", json_object_new_string("json"));
	if (key)
		json_object_object_add(c, key, json_object_new_string(val));
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

/* Does the OSD map mark pool id full (its quota, or OSDs at their full
 * ratio)? 1, 0, or -ENOENT when the pool is not listed. These flags are
 * what makes librados hold writes, so they decide, not the statistics. */
static int pool_marked_full(struct json_object *ls, int64_t id, bool *quota)
{
	if (!json_object_is_type(ls, json_type_array))
		return -EBADMSG;
	for (size_t i = 0; i < json_object_array_length(ls); i++) {
		struct json_object *p = json_object_array_get_idx(ls, i), *v;
		if (!json_object_object_get_ex(p, "pool_id", &v) || json_object_get_int64(v) != id)
			continue;
		const char *names = json_object_object_get_ex(p, "flags_names", &v) ? json_object_get_string(v) : NULL;
		bool full = false;
		*quota = false;
		for (const char *f = names; f && *f;) {
			size_t n = strcspn(f, ",");
			if ((n == 4 && !strncmp(f, "full", 4)) || (n == 10 && !strncmp(f, "full_quota", 10)))
				full = true;
			if (n == 10 && !strncmp(f, "full_quota", 10))
				*quota = true;
			f += n + (f[n] == ',');
		}
		return full;
	}
	return -ENOENT;
}

static void set_full(struct rbd_bdev *rb, const char *pool, bool full, bool by_quota)
{
	if (atomic_exchange(&rb->pool_full, full) == full)
		return;
	if (!full)
		log_info("rbd %s: pool %s has room again; writes are taken again", rb->spec, pool);
	else if (by_quota)
		log_err("rbd %s: pool %s is full (its quota): writes fail with SPACE ALLOCATION FAILED until the "
			"quota is raised (ceph osd pool set-quota %s max_bytes N) or data is removed",
			rb->spec, pool, pool);
	else
		log_err("rbd %s: pool %s is full (its OSDs are): writes fail with SPACE ALLOCATION FAILED until "
			"OSD space is added or data is removed",
			rb->spec, pool);
}

/* Run one monitor command inside the handles (never across a handle swap). */
static int mon_json_in(struct rbd_bdev *rb, const char *prefix, const char *key, const char *val,
		       struct json_object **out)
{
	*out = NULL;
	if (!rbd_handles_enter(rb))
		return -ENOTCONN;
	int r = mon_json(rb->cluster, prefix, key, val, out);
	rbd_handles_exit(rb);
	return r;
}

/* The image's allocation, recounted at most once per 20 times what the
 * last count took (an object map walk is cheap on small images, not on a
 * 100 TiB one, and one thread serves every LU). */
static int image_alloc_paced(struct rbd_bdev *rb, uint64_t *alloc)
{
	uint64_t t0 = now_ms();
	if (rb->alloc_known && t0 - rb->alloc_at_ms < 20 * rb->alloc_cost_ms) {
		*alloc = rb->alloc_bytes;
		return 0;
	}
	if (!rbd_handles_enter(rb))
		return -ENOTCONN;
	int r = image_alloc(rb, alloc);
	rbd_handles_exit(rb);
	rb->alloc_known = r == 0;
	rb->alloc_bytes = *alloc;
	rb->alloc_at_ms = now_ms();
	rb->alloc_cost_ms = rb->alloc_at_ms - t0;
	return r;
}

int rbd_space(struct bdev *dev, struct bdev_space *out)
{
	struct rbd_bdev *rb = rbd_bdev_of(dev);
	struct json_object *ls = NULL, *quota = NULL, *df = NULL, *st = NULL, *v;
	char pool[RBD_NAME_MAX];
	bool by_quota = false;

	/* the pool by its id: a renamed pool keeps it, and a new pool that
	 * takes the old name is not ours */
	if (!rbd_handles_enter(rb))
		return -ENOTCONN;
	int64_t id = rados_ioctx_get_id(rb->ioctx);
	int r = rados_pool_reverse_lookup(rb->cluster, id, pool, sizeof(pool));
	rbd_handles_exit(rb);
	if (r >= 0)
		r = mon_json_in(rb, "osd pool ls", "detail", "detail", &ls);
	int full = r >= 0 ? pool_marked_full(ls, id, &by_quota) : r;
	if (full < 0) {
		/* no verdict: let the cluster hold writes rather than refuse them
		 * on an old one */
		if (atomic_exchange(&rb->pool_full, false))
			log_warn("rbd %s: cannot tell whether its pool is still full (%s); writes go to the cluster "
				 "again", rb->spec, strerror(-full));
		r = full;
		goto out;
	}
	set_full(rb, pool, full, by_quota);

	r = mon_json_in(rb, "osd pool get-quota", "pool", pool, &quota);
	if (r == 0)
		r = mon_json_in(rb, "df", NULL, NULL, &df);
	st = df ? df_pool_stats(df, pool) : NULL;
	if (r == 0 && (!st || !json_object_object_get_ex(st, "max_avail", &v)))
		r = -ENOENT;
	if (r == -ENOENT) {
		/* the monitors have no usage statistics for the pool: no manager
		 * runs (they come from ceph-mgr), or it has not reported yet */
		if (!rb->space_unknown_logged)
			log_info("rbd %s: the cluster has no usage statistics for pool %s (is a ceph-mgr running?): "
				 "its space is unknown until it has",
				 rb->spec, pool);
		rb->space_unknown_logged = true;
		r = -ENOTSUP;
		goto out;
	}
	if (r < 0)
		goto out;
	rb->space_unknown_logged = false;

	uint64_t qbytes = json_u64(quota, "quota_max_bytes", 0);
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
	out->alloc_known = image_alloc_paced(rb, &out->alloc) == 0;
out:
	if (ls)
		json_object_put(ls);
	if (quota)
		json_object_put(quota);
	if (df)
		json_object_put(df);
	return r;
}
