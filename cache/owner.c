/*
 * owner.c - a cache volume over a backing store several gateways share (an
 * RBD image): the backing's ownership passed up to the LU, and the cached
 * copies dropped when another gateway may have written the image.
 *
 * Threading: see each function; the drop runs on the main thread while
 * the volume serves no I/O.
 */
#include "cache/cache_int.h"
#include "cache/vol_int.h"

#include "common/log.h"
#include "common/statefile.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* ---- ownership of a shared backing store -------------------------------------------------- */

/*
 * An RBD image several gateways export (bdev.h "Ownership"): the volume
 * passes the backing's owner ops up to the LU, and on every gain drops the
 * copies it holds of the image unless nobody else can have written it
 * since: the previous owner was this gateway and the generation before the
 * gain is the one recorded at our own last gain (kept in gen_path, a small
 * file in the state_dir written after the drop is durable and before the
 * LU is told, so a warm restart of a single-gateway write-back LUN keeps
 * its cache, and a gateway that served in between makes us drop it).
 * The drop runs while the backing's state still reads TRANSITION, so no
 * I/O of this volume's extents runs meanwhile (the LU serves media access
 * only when OWNED, but for BDEV_F_UNOWNED reads, which pass the extents
 * by); fills already in flight are cancelled (SB_CANCEL) so they cannot
 * bring old data back, and slots being evicted are waited for until they
 * are free (their FREE records durable).
 */

struct vol_inval {
	struct cache_vol *v;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool pass_done;
	int pending;                /* INVALIDATE records not yet durable */
	uint32_t busy;              /* slots skipped: a destage runs on them, they are being evicted, or
				     * the pass ran out of records */
	uint64_t slots, dirty;      /* dropped in this pass */
	struct jwait *jw;
	uint32_t njw;
	int err;
};

static void inval_finish(struct vol_inval *iv)
{
	pthread_mutex_lock(&iv->mu);
	iv->pass_done = true;
	pthread_cond_signal(&iv->cv);
	pthread_mutex_unlock(&iv->mu);
}

static void inval_rec_done(struct jwait *w, int err)
{
	struct vol_inval *iv = *(struct vol_inval **)((char *)w - sizeof(void *));
	if (err && !iv->err)
		iv->err = err;
	if (--iv->pending == 0)
		inval_finish(iv);
}

/* Worker thread: one pass over the set's slots for this volume's extents. */
static void inval_pass(void *arg)
{
	struct vol_inval *iv = arg;
	struct cache_vol *v = iv->v;
	struct cache_set *cs = v->cs;
	size_t per = sizeof(void *) + sizeof(struct jwait);
	uint32_t n = 0;

	iv->pending = 1; /* guard */
	for (uint32_t s = 0; s < cs->lay.nslots; s++) {
		struct slot *sl = &cs->slots[s];
		uint64_t key = atomic_load(&sl->key);
		if (key == CACHE_KEY_NONE || key_bid(key) != v->bid)
			continue;
		slot_lock(sl);
		uint32_t bits = atomic_load(&sl->bits);
		uint32_t st = bits & SB_STATE_MASK;
		if (atomic_load(&sl->key) != key) {
			slot_unlock(sl);
			continue;
		}
		if (st == SB_FILLING || (st == SB_READY && (bits & SB_TOPUP)))
			atomic_fetch_or(&sl->bits, SB_CANCEL); /* the fill or top-up is dropped */
		if (st == SB_FILLING) {
			slot_unlock(sl);
			continue;
		}
		if (st == SB_RETIRED) {
			/*
			 * Being evicted: until its FREE record is durable (the key
			 * stays on the slot until then), a power cut brings the slot
			 * back with what it held, which may be older than another
			 * gateway's writes; the generation recorded after this pass
			 * would then keep it at the next gain. Wait for it.
			 */
			iv->busy++;
			slot_unlock(sl);
			continue;
		}
		bool valid;
		if (st != SB_READY || (slot_valid_run(cs, s, 0, cs->lay.bpe, &valid) == cs->lay.bpe && !valid)) {
			/* nothing cached (an INVALIDATE of an earlier pass leaves the slot READY, SB_HAS_BM set) */
			slot_unlock(sl);
			continue;
		}
		if (bits & SB_DESTAGING) {
			iv->busy++;
			slot_unlock(sl);
			continue;
		}
		if (n == iv->njw) {
			slot_unlock(sl);
			iv->busy++; /* out of records for this pass: the next pass takes it */
			break;
		}
		char *e = (char *)iv->jw + (size_t)n * per;
		*(struct vol_inval **)e = iv;
		struct jwait *w = (struct jwait *)(e + sizeof(void *));
		w->done = inval_rec_done;
		if (bits & SB_DIRTY)
			iv->dirty++;
		cache_record_locked(cs, s, key, JOP_INVALIDATE, 0, cs->lay.bpe, w);
		slot_unlock(sl);
		iv->slots++;
		iv->pending++;
		n++;
		journal_append(cs, w);
	}
	if (--iv->pending == 0)
		inval_finish(iv);
}

/*
 * Drop every cached extent of v durably. The backing's driver thread (may
 * block). Bounded: when the workers are gone (a gain racing the daemon's
 * stop) or the journal hangs, it gives up with -ETIMEDOUT and leaves the
 * pass's memory behind for a worker that might still run it; and when
 * slots stay busy (being destaged or evicted) for vol_drop_timeout_s with
 * no pass dropping anything, it gives up with -ETIMEDOUT too. With no leg
 * left it returns 1: nothing stale can be read now (with no leg the LUN is
 * served from the backing store), but FREE records of this LUN's
 * evictions may have failed (a failed FREE still frees its slot), so a
 * restart with the legs back could bring such a slot back, and no
 * generation may say the cache is current.
 */
unsigned vol_drop_timeout_s = 60; /* tests shorten it */
static int vol_drop_all(struct cache_vol *v, uint64_t *slots, uint64_t *dirty)
{
	struct vol_inval *iv = calloc(1, sizeof(*iv));
	size_t per = sizeof(void *) + sizeof(struct jwait);
	int r = 0;

	if (!iv)
		return -ENOMEM;
	iv->v = v;
	iv->njw = 4096;
	iv->jw = calloc(iv->njw, per);
	if (!iv->jw) {
		free(iv);
		return -ENOMEM;
	}
	pthread_mutex_init(&iv->mu, NULL);
	pthread_cond_init(&iv->cv, NULL);
	uint64_t progress = 0, deadline_ms = now_ms() + vol_drop_timeout_s * 1000ull;
	for (;;) {
		iv->pass_done = false;
		iv->busy = 0;
		int tries = 0;
		while (worker_post(worker_get(0), inval_pass, iv) < 0 && ++tries < 1000)
			usleep(1000);
		if (tries == 1000) {
			r = -ESHUTDOWN;
			break;
		}
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += vol_drop_timeout_s;
		pthread_mutex_lock(&iv->mu);
		while (!iv->pass_done && r == 0)
			if (pthread_cond_timedwait(&iv->cv, &iv->mu, &ts) == ETIMEDOUT)
				r = -ETIMEDOUT;
		pthread_mutex_unlock(&iv->mu);
		if (r == -ETIMEDOUT)
			return r; /* iv stays: a late pass may still touch it */
		if (!iv->busy || iv->err)
			break;
		if (iv->slots != progress) {
			progress = iv->slots;
			deadline_ms = now_ms() + vol_drop_timeout_s * 1000ull;
		} else if (now_ms() > deadline_ms) {
			r = -ETIMEDOUT; /* no pass is in flight: iv can go */
			break;
		}
		usleep(10000); /* a destage or an eviction runs on some slot: let it end */
	}
	if (!r && !iv->err && mirror_all_failed(&v->cs->mirror))
		r = 1; /* FREE records failed, yet released their slots (slots.c), maybe before a pass saw them */
	pthread_cond_destroy(&iv->cv);
	pthread_mutex_destroy(&iv->mu);
	*slots = iv->slots;
	*dirty = iv->dirty;
	if (!r)
		r = iv->err;
	free(iv->jw);
	free(iv);
	return r;
}

/* Persist gen as the generation our cached copies belong to (durable on return). */
static int gen_store(const char *path, uint64_t gen)
{
	char line[32];
	int n = snprintf(line, sizeof(line), "%llu\n", (unsigned long long)gen);
	return state_file_replace(path, line, (size_t)n);
}

/* The backing's ownership changed (its driver's thread). */
static void vol_owner_changed(void *arg, const struct bdev_owner_change *c)
{
	struct cache_vol *v = arg;

	if (c->state == BDEV_OWNER_OWNED) {
		pthread_mutex_lock(&v->own_mu);
		uint64_t recorded = v->recorded_gen;
		char *path = v->gen_path ? strdup(v->gen_path) : NULL;
		pthread_mutex_unlock(&v->own_mu);
		bool keep = c->prev_owner_us && c->prev_gen == recorded && recorded;
		bool clean = true; /* no stale copy left: the generation may be recorded */
		if (keep) {
			atomic_store(&v->drop_failed, false);
			log_info("cache lun %s: nobody else owned %s since generation %llu; the cache stays",
				 v->name, v->backing->name, (unsigned long long)recorded);
		} else {
			uint64_t slots = 0, dirty = 0;
			int r = vol_drop_all(v, &slots, &dirty);
			/* stale copies may remain: this gateway must not serve the image */
			atomic_store(&v->drop_failed, r < 0);
			clean = r == 0;
			if (r > 0)
				log_warn("cache lun %s: every cache leg has failed, so the copies this gain "
					 "dropped may come back with the legs; its generation is not recorded and "
					 "the next gain drops again", v->name);
			if (r < 0)
				log_err("cache lun %s: dropping the cached copies failed (%s); the LUN stays "
					"unavailable on this gateway until a later takeover succeeds", v->name,
					strerror(-r));
			if (dirty)
				log_err("cache lun %s: %llu extent(s) held dirty data that another gateway "
					"never saw; they are dropped, since the image was served without them",
					v->name, (unsigned long long)dirty);
			log_info("cache lun %s: generation %llu (previous %llu%s, ours %llu): %llu cached "
				 "extent(s) dropped", v->name, (unsigned long long)c->gen,
				 (unsigned long long)c->prev_gen, c->prev_owner_us ? ", this gateway" : "",
				 (unsigned long long)recorded, (unsigned long long)slots);
		}
		/* After a failed drop the generation is not recorded (in memory or in
		 * the file): a later gain, or a restart, must drop again rather than
		 * take this one for a gain that left the cache clean. */
		if (path && clean) {
			int r = gen_store(path, c->gen);
			if (r < 0)
				log_err("cache lun %s: cannot keep the owner generation in %s: %s; the next "
					"start drops this LUN's cache", v->name, path, strerror(-r));
		}
		free(path);
		if (clean) {
			pthread_mutex_lock(&v->own_mu);
			v->recorded_gen = c->gen;
			pthread_mutex_unlock(&v->own_mu);
		}
	}
	pthread_mutex_lock(&v->own_mu);
	void (*fn)(void *, const struct bdev_owner_change *) = v->up_fn;
	void *up = v->up_arg;
	pthread_mutex_unlock(&v->own_mu);
	if (fn)
		fn(up, c);
}

static struct bdev_owner_ops const *vol_bowner(struct bdev *dev)
{
	return ((struct cache_vol *)dev)->backing->ops->owner;
}

static enum bdev_owner_state vol_owner_state(struct bdev *dev, uint64_t *gen)
{
	struct cache_vol *v = (struct cache_vol *)dev;
	enum bdev_owner_state st = vol_bowner(dev)->state(v->backing, gen);
	if (st == BDEV_OWNER_OWNED && atomic_load_explicit(&v->drop_failed, memory_order_relaxed))
		return BDEV_OWNER_LOST;
	return st;
}

static void vol_owner_acquire(struct bdev *dev)
{
	struct cache_vol *v = (struct cache_vol *)dev;
	vol_bowner(dev)->acquire(v->backing);
}

/* Register with the backing once (main thread). */
static void vol_owner_attach(struct cache_vol *v)
{
	pthread_mutex_lock(&v->own_mu);
	bool first = !v->listening;
	v->listening = true;
	pthread_mutex_unlock(&v->own_mu);
	if (first)
		v->backing->ops->owner->listen(v->backing, vol_owner_changed, v);
}

static void vol_owner_listen(struct bdev *dev, void (*fn)(void *arg, const struct bdev_owner_change *c),
			     void *arg)
{
	struct cache_vol *v = (struct cache_vol *)dev;
	pthread_mutex_lock(&v->own_mu);
	v->up_fn = fn;
	v->up_arg = arg;
	pthread_mutex_unlock(&v->own_mu);
	vol_owner_attach(v);
}

static uint32_t vol_owner_group(struct bdev *dev)
{
	struct cache_vol *v = (struct cache_vol *)dev;
	const struct bdev_owner_ops *o = vol_bowner(dev);
	return o->owner_group ? o->owner_group(v->backing) : 0;
}

static struct bdev *vol_owner_lower(struct bdev *dev)
{
	return ((struct cache_vol *)dev)->backing;
}

static bool vol_owner_unowned_reads(struct bdev *dev)
{
	struct cache_vol *v = (struct cache_vol *)dev;
	const struct bdev_owner_ops *o = vol_bowner(dev);
	if (o->unowned_reads && !o->unowned_reads(v->backing))
		return false;
	return !atomic_load_explicit(&v->dirty_when_tracked, memory_order_relaxed);
}

const struct bdev_owner_ops vol_owner_ops = {
	.state = vol_owner_state,
	.acquire = vol_owner_acquire,
	.listen = vol_owner_listen,
	.owner_group = vol_owner_group,
	.lower = vol_owner_lower,
	.unowned_reads = vol_owner_unowned_reads,
};

int cache_vol_owner_track(struct bdev *vol, const char *gen_path, char *err, size_t errlen)
{
	struct cache_vol *v = (struct cache_vol *)vol;

	if (!bdev_is_shared(v->backing))
		return 0;
	uint64_t gen = 0;
	FILE *f = gen_path ? fopen(gen_path, "r") : NULL;
	if (f) {
		unsigned long long g = 0;
		if (fscanf(f, "%llu", &g) == 1)
			gen = g;
		fclose(f);
	} else if (gen_path && errno != ENOENT) {
		snprintf(err, errlen, "cannot read %s: %s", gen_path, strerror(errno));
		return -1;
	}
	pthread_mutex_lock(&v->own_mu);
	free(v->gen_path);
	v->gen_path = gen_path ? strdup(gen_path) : NULL;
	v->recorded_gen = gen;
	pthread_mutex_unlock(&v->own_mu);
	/* Dirty data of this LUN now (a write-through LUN of several gateways
	 * makes none, so it is left from a write-back run): the image lacks
	 * it, and a gateway that does not own the image must not read the
	 * image past it. Kept until the next start, as the LUN cannot be
	 * told apart from others in the set's dirty count. A set with nothing
	 * dirty (every write-through one) is not scanned. */
	struct cache_set *cs = v->cs;
	for (uint32_t s = 0; atomic_load(&cs->dirty_blocks) && s < cs->lay.nslots; s++) {
		uint64_t key = atomic_load(&cs->slots[s].key);
		if (key != CACHE_KEY_NONE && key_bid(key) == v->bid && slot_dirty_blocks(cs, s)) {
			atomic_store(&v->dirty_when_tracked, true);
			break;
		}
	}
	vol_owner_attach(v);
	return 0;
}
