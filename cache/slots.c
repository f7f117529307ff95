/*
 * slots.c - slot allocation and eviction.
 *
 * A slot is evicted only when it is clean and unpinned; it leaves the map
 * at once, but is handed out again only when (a) its FREE record is
 * durable (else a crash would replay the old owner's records over the new
 * owner's data) and (b) an RCU grace period has passed (so no reader that
 * found it in the map is still pinning it). Eviction runs ahead of need,
 * keeping a small free pool, so a miss never waits for a grace period.
 * Until that FREE is durable a power cut brings the old slot back, clean,
 * with the extent's data as of the eviction. So meanwhile the extent is
 * not cached again, in any slot (the new slot's records, in another
 * journal ring, could land first: the extent in two slots on disk;
 * recovery keeps the one with the newer record, recover.c, but a new
 * slot written, destaged and evicted meanwhile would leave the old one
 * alone), and a host's write to it, which would go to the backing store,
 * waits (cache_evicted_wait): once acknowledged, the old slot would be
 * older than the backing store.
 *
 * Threading: cache_alloc_slot/cache_drop_slot/cache_reclaim: worker
 * threads, take alloc_lock briefly, never sleep or wait for a grace period.
 */
#include "cache/cache_int.h"

/* ---- slot allocation and reclaim ------------------------------------------------- */

struct evict_batch {
	struct rcu_head rcu;
	struct cache_set *cs;
	struct evict_batch *next; /* alloc.evicting, while its keys are held back */
	uint64_t *keys;           /* cache_reclaim's: the keys it frees (n of them) */
	_Atomic int refs;       /* FREE records outstanding + 1 for the grace period */
	uint32_t n;             /* slots, all counted in alloc.nfreeing until released */
	uint32_t *slots;
	struct jwait *jw;
	void (*done)(void *arg); /* cache_purge_bid's: the slots are free */
	void *done_arg;
};

#define BATCH_JW_SIZE (sizeof(void *) + sizeof(struct jwait)) /* a back pointer, then the jwait */

/* alloc.lock held: key was just evicted and its FREE record is not durable yet */
static bool key_evicting(struct cache_set *cs, uint64_t key)
{
	for (struct evict_batch *b = cs->alloc.evicting; b; b = b->next)
		for (uint32_t i = 0; i < b->n; i++)
			if (b->keys[i] == key)
				return true;
	return false;
}

static void batch_release(struct evict_batch *b)
{
	if (atomic_fetch_sub(&b->refs, 1) != 1)
		return;
	struct cache_set *cs = b->cs;
	struct slot_wait *wake = NULL;
	pthread_mutex_lock(&cs->alloc.lock);
	if (b->keys) {
		for (struct evict_batch **pp = &cs->alloc.evicting; *pp; pp = &(*pp)->next)
			if (*pp == b) {
				*pp = b->next;
				break;
			}
		atomic_fetch_sub(&cs->alloc.nevicting, b->n);
		for (struct slot_wait **pp = &cs->alloc.evict_waiters; *pp;) {
			struct slot_wait *w = *pp;
			if (!key_evicting(cs, w->key)) {
				*pp = w->next;
				w->next = wake;
				wake = w;
			} else {
				pp = &w->next;
			}
		}
	}
	for (uint32_t i = 0; i < b->n; i++) {
		struct slot *sl = &cs->slots[b->slots[i]];
		atomic_store(&sl->key, CACHE_KEY_NONE);
		atomic_store(&sl->bits, SB_FREE);
		free_push(cs, b->slots[i]);
	}
	atomic_store(&cs->alloc.nfreeing, atomic_load(&cs->alloc.nfreeing) - b->n);
	pthread_mutex_unlock(&cs->alloc.lock);
	while (wake) {
		struct slot_wait *w = wake;
		wake = w->next; /* w's piece may be gone once it runs */
		worker_post_call(w->w, &w->call, w->fn, w->arg);
	}
	if (b->done)
		b->done(b->done_arg);
	free(b);
	atomic_fetch_sub(&cs->bg_inflight, 1);
}

static void batch_graced(struct rcu_head *h)
{
	batch_release(caa_container_of(h, struct evict_batch, rcu));
}

static void batch_recorded(struct jwait *w, int err)
{
	/* jw[] follows the header: find the batch from the record's index */
	struct evict_batch *b = *(struct evict_batch **)((char *)w - sizeof(void *));
	(void)err;
	batch_release(b);
}

static struct evict_batch *batch_new(struct cache_set *cs, uint32_t n)
{
	/* layout: header, slots[n], then n x { back pointer, jwait }, then keys[n] (cache_reclaim's) */
	struct evict_batch *b = calloc(1, sizeof(*b) + n * sizeof(uint32_t) + n * BATCH_JW_SIZE + 16 + n * sizeof(uint64_t));
	if (!b)
		return NULL;
	b->cs = cs;
	b->slots = (uint32_t *)(b + 1);
	atomic_fetch_add(&cs->bg_inflight, 1);
	return b;
}

/* A batch that took no slot: gone, and no longer counted. */
static void batch_drop(struct evict_batch *b)
{
	struct cache_set *cs = b->cs;
	free(b);
	atomic_fetch_sub(&cs->bg_inflight, 1);
}

/*
 * alloc.lock held. Take a clean, ready, unpinned slot out of service
 * (SB_RETIRED) for an eviction; false (and the slot as it was) if it is
 * not one, or a reader pinned it meanwhile. *bits (if given): its bits as
 * looked at.
 */
static bool slot_retire(struct slot *sl, uint32_t *bits_out)
{
	slot_lock(sl);
	uint32_t bits = atomic_load(&sl->bits);
	bool ok = (bits & SB_STATE_MASK) == SB_READY && !(bits & (SB_DIRTY | SB_DESTAGING));
	if (ok) {
		atomic_fetch_and(&sl->bits, ~SB_STATE_MASK);
		atomic_fetch_or(&sl->bits, SB_RETIRED);
		/* Dekker with pin_lookup: users after state */
		if (atomic_load(&sl->users)) {
			atomic_fetch_and(&sl->bits, ~SB_STATE_MASK);
			atomic_fetch_or(&sl->bits, SB_READY);
			ok = false;
		}
	}
	slot_unlock(sl);
	if (bits_out)
		*bits_out = bits;
	return ok;
}

/* Element i of the jwait area after slots[cap] (batch_new's layout); i == cap: just past it */
static char *batch_area(struct evict_batch *b, uint32_t cap, uint32_t i)
{
	uintptr_t base = ((uintptr_t)(b->slots + cap) + 7) & ~(uintptr_t)7;
	return (char *)(base + i * BATCH_JW_SIZE);
}

static struct jwait *batch_jw(struct evict_batch *b, uint32_t cap, uint32_t i)
{
	char *e = batch_area(b, cap, i);
	*(struct evict_batch **)e = b;
	return (struct jwait *)(e + sizeof(void *));
}

_Static_assert(BATCH_JW_SIZE % 8 == 0, "keys[] after the jwaits stays aligned");

/* keys[cap] after the jwaits (batch_new's layout) */
static uint64_t *batch_keys(struct evict_batch *b, uint32_t cap)
{
	return (uint64_t *)(void *)batch_area(b, cap, cap);
}

/* The batch's FREE records (keys[i] for b->slots[i]) journaled, and its grace period asked for: each
 * slot is free once both are done. cap: the batch's capacity (batch_new). */
static void batch_record(struct evict_batch *b, uint32_t cap, const uint64_t *keys)
{
	struct cache_set *cs = b->cs;
	atomic_store(&b->refs, (int)b->n + 1);
	for (uint32_t i = 0; i < b->n; i++) {
		struct jwait *w = batch_jw(b, cap, i);
		struct slot *sl = &cs->slots[b->slots[i]];
		w->done = batch_recorded;
		slot_lock(sl);
		cache_record_locked(cs, b->slots[i], keys[i], JOP_FREE, 0, cs->lay.bpe, w);
		slot_unlock(sl);
		journal_append(cs, w);
	}
	call_rcu(&b->rcu, batch_graced);
}

static bool evictable(uint32_t s, void *arg)
{
	struct cache_set *cs = arg;
	struct slot *sl = &cs->slots[s];
	uint32_t bits = atomic_load(&sl->bits);
	return (bits & SB_STATE_MASK) == SB_READY && !(bits & (SB_DIRTY | SB_DESTAGING | SB_LOCK)) &&
	       atomic_load(&sl->users) == 0;
}

/*
 * Worker thread. Keeps about 1/64 of the slots free: evicts clean cold
 * slots (policy_victim), journals their FREE records and frees them after
 * both the records are durable and a grace period passed. Slots already
 * on that way count as free: evicting more for them would only empty the
 * cache (a miss that finds no free slot meanwhile is not admitted).
 */
void cache_reclaim(struct cache_set *cs)
{
	uint32_t want = cs->lay.nslots / 64 + 4;
	uint32_t cap = 64;
	struct evict_batch *b = NULL;

	pthread_mutex_lock(&cs->alloc.lock);
	uint32_t have = cs->alloc.nfree + atomic_load(&cs->alloc.nfreeing);
	if (have >= want) {
		pthread_mutex_unlock(&cs->alloc.lock);
		atomic_store(&cs->alloc.reclaim_pending, false);
		return;
	}
	b = batch_new(cs, cap);
	if (!b) {
		pthread_mutex_unlock(&cs->alloc.lock);
		return;
	}
	uint64_t *keys = batch_keys(b, cap);
	while (b->n < cap && have + b->n < want) {
		uint32_t s = policy_victim(cs->policy, evictable, cs);
		if (s == POLICY_NO_SLOT)
			break;
		struct slot *sl = &cs->slots[s];
		uint64_t key = atomic_load(&sl->key);
		/*
		 * Counted before the slot stops serving (retired, out of the map):
		 * a writer that then finds no slot sees the count after its own
		 * fence (cache_evicted_wait), and takes the lock this holds.
		 */
		atomic_fetch_add(&cs->alloc.nevicting, 1);
		atomic_thread_fence(memory_order_seq_cst);
		if (!slot_retire(sl, NULL)) {
			atomic_fetch_sub(&cs->alloc.nevicting, 1);
			policy_insert(cs->policy, s, key);
			break;
		}
		map_remove(&cs->map, key, s);
		keys[b->n] = key;
		b->slots[b->n++] = s;
	}
	atomic_store(&cs->alloc.nfreeing, atomic_load(&cs->alloc.nfreeing) + b->n);
	if (b->n) {
		b->keys = keys;
		b->next = cs->alloc.evicting;
		cs->alloc.evicting = b;
	}
	pthread_mutex_unlock(&cs->alloc.lock);
	atomic_store(&cs->alloc.reclaim_pending, false);
	if (!b->n) {
		batch_drop(b);
		return;
	}
	atomic_fetch_add(&cs->st.evictions, b->n);
	batch_record(b, cap, keys);
}

static void maybe_reclaim(struct cache_set *cs)
{
	if (cs->alloc.nfree + atomic_load(&cs->alloc.nfreeing) < cs->lay.nslots / 128 + 2 &&
	    !atomic_exchange(&cs->alloc.reclaim_pending, true))
		cache_reclaim(cs);
}

bool cache_evicted_wait(struct cache_set *cs, uint64_t key, struct slot_wait *w, void (*fn)(void *), void *arg)
{
	atomic_thread_fence(memory_order_seq_cst); /* after the lookup that found no slot: see cache_reclaim */
	if (!atomic_load(&cs->alloc.nevicting))
		return false;
	pthread_mutex_lock(&cs->alloc.lock);
	bool wait = key_evicting(cs, key);
	if (wait) {
		w->key = key;
		w->fn = fn;
		w->arg = arg;
		w->w = worker_self();
		w->next = cs->alloc.evict_waiters;
		cs->alloc.evict_waiters = w;
	}
	pthread_mutex_unlock(&cs->alloc.lock);
	return wait;
}

/*
 * Worker thread. Insert key with a free slot in state (SB_READY: pinned
 * for the calling writer; SB_FILLING: not pinned). If key is present
 * already, returns POLICY_NO_SLOT and, for SB_READY, *existing = that
 * slot pinned for the writer. POLICY_NO_SLOT and *existing untouched if
 * no slot is free (a reclaim is started), or key is still being evicted
 * (its FREE not durable: see the top of the file).
 */
uint32_t cache_alloc_slot(struct cache_set *cs, uint64_t key, uint32_t state, uint32_t *existing)
{
	pthread_mutex_lock(&cs->alloc.lock);
	uint32_t s = map_lookup(&cs->map, key);
	if (s != POLICY_NO_SLOT) {
		if (state == SB_READY) {
			atomic_fetch_add(&cs->slots[s].users, SU_WRITER);
			atomic_fetch_add(&cs->slots[s].bits, SB_WGEN_ONE);
			*existing = s;
		}
		pthread_mutex_unlock(&cs->alloc.lock);
		return POLICY_NO_SLOT;
	}
	if (cs->alloc.evicting && key_evicting(cs, key)) {
		/* not admitted this time (see the top of the file); the next miss may be */
		pthread_mutex_unlock(&cs->alloc.lock);
		return POLICY_NO_SLOT;
	}
	if (!cs->alloc.nfree) {
		pthread_mutex_unlock(&cs->alloc.lock);
		if (!atomic_exchange(&cs->alloc.reclaim_pending, true))
			cache_reclaim(cs);
		return POLICY_NO_SLOT;
	}
	s = free_pop(cs);
	bm_slot_reuse(&cs->bm, s);
	struct slot *sl = &cs->slots[s];
	atomic_store(&sl->users, state == SB_READY ? SU_WRITER : 0);
	atomic_store(&sl->bits, state);
	if (map_insert(&cs->map, key, s) < 0) {
		free_push(cs, s);
		atomic_store(&sl->bits, SB_FREE);
		atomic_store(&sl->users, 0);
		pthread_mutex_unlock(&cs->alloc.lock);
		return POLICY_NO_SLOT;
	}
	policy_insert(cs->policy, s, key);
	pthread_mutex_unlock(&cs->alloc.lock);
	maybe_reclaim(cs);
	return s;
}

/*
 * Slots retired without a batch (cache_drop_slot out of memory) go to the
 * free list after a grace period of their own: retire_rcu, one at a time.
 * Under alloc_lock: if none is under way and some wait, the waiting ones
 * enter the next. The callback frees those and starts the next for slots
 * retired meanwhile. Counted in bg_inflight, so a close waits for it.
 */
static void retire_graced(struct rcu_head *h);

static void retire_start_locked(struct cache_set *cs)
{
	uint32_t words = (cs->lay.nslots + 63) / 64;
	bool any = false;

	if (cs->alloc.retire_inflight)
		return;
	for (uint32_t w = 0; w < words; w++) {
		cs->alloc.grace_bits[w] = cs->alloc.retire_bits[w];
		cs->alloc.retire_bits[w] = 0;
		any |= cs->alloc.grace_bits[w] != 0;
	}
	if (!any)
		return;
	cs->alloc.retire_inflight = true;
	atomic_fetch_add(&cs->bg_inflight, 1);
	call_rcu(&cs->alloc.retire_rcu, retire_graced);
}

static void retire_graced(struct rcu_head *h)
{
	struct cache_set *cs = caa_container_of(h, struct cache_set, alloc.retire_rcu);
	uint32_t words = (cs->lay.nslots + 63) / 64;

	pthread_mutex_lock(&cs->alloc.lock);
	for (uint32_t w = 0; w < words; w++)
		for (uint64_t m = cs->alloc.grace_bits[w]; m; m &= m - 1) {
			uint32_t s = w * 64 + (uint32_t)__builtin_ctzll(m);
			atomic_store(&cs->slots[s].key, CACHE_KEY_NONE);
			atomic_store(&cs->slots[s].bits, SB_FREE);
			free_push(cs, s);
		}
	cs->alloc.retire_inflight = false;
	retire_start_locked(cs);
	pthread_mutex_unlock(&cs->alloc.lock);
	atomic_fetch_sub(&cs->bg_inflight, 1);
}

/* Worker thread. A fill that never recorded anything gives its slot back. */
void cache_drop_slot(struct cache_set *cs, uint32_t s)
{
	struct evict_batch *b = batch_new(cs, 1);
	struct slot *sl = &cs->slots[s];
	pthread_mutex_lock(&cs->alloc.lock);
	map_remove(&cs->map, atomic_load(&sl->key), s);
	policy_remove(cs->policy, s);
	slot_lock(sl);
	atomic_fetch_and(&sl->bits, ~SB_STATE_MASK);
	atomic_fetch_or(&sl->bits, SB_RETIRED);
	slot_unlock(sl);
	if (b) {
		b->n = 1;
		atomic_store(&cs->alloc.nfreeing, atomic_load(&cs->alloc.nfreeing) + 1);
	}
	pthread_mutex_unlock(&cs->alloc.lock);
	if (!b) {
		/* out of memory: wait for a grace period without a batch */
		pthread_mutex_lock(&cs->alloc.lock);
		cs->alloc.retire_bits[s / 64] |= 1ull << (s % 64);
		retire_start_locked(cs);
		pthread_mutex_unlock(&cs->alloc.lock);
		return;
	}
	b->slots[0] = s;
	atomic_store(&b->refs, 1);
	call_rcu(&b->rcu, batch_graced);
}

#define PURGE_CHUNK 4096u

/*
 * Worker thread. Free the slots of backing id bid, PURGE_CHUNK at a time
 * (the caller asks again for the rest), whose LUN is not attached (so no
 * host request and no fill reaches them): like an
 * eviction, each leaves the map at once and its FREE record is journaled;
 * done(arg) runs once every record is durable and a grace period passed.
 * Returns how many slots that is (0: none, and done is not called), or
 * -EBUSY with nothing done when one of them is dirty (the LUN's data,
 * which only the LUN's own store can take). *busy: a slot of bid could
 * not be taken now (the others go all the same; ask again later). *busy
 * and *count (what it returns) are set before done can run: done may
 * run before this returns.
 */
int cache_purge_bid(struct cache_set *cs, uint32_t bid, bool *busy, int *count, void (*done)(void *arg),
		    void *arg)
{
	*busy = false;
	*count = 0;
	uint32_t n = 0;
	for (uint32_t s = 0; s < cs->lay.nslots; s++) {
		uint64_t key = atomic_load(&cs->slots[s].key);
		uint32_t bits = atomic_load(&cs->slots[s].bits);
		if (key == CACHE_KEY_NONE || key_bid(key) != bid || (bits & SB_STATE_MASK) == SB_FREE)
			continue;
		if (bits & (SB_DIRTY | SB_DESTAGING))
			return -EBUSY;
		n++;
	}
	if (!n)
		return 0;
	if (n > PURGE_CHUNK)
		n = PURGE_CHUNK; /* the caller asks again for the rest: bounded memory */
	struct evict_batch *b = batch_new(cs, n);
	uint64_t *keys = b ? malloc(n * sizeof(*keys)) : NULL;
	if (!keys) {
		if (b)
			batch_drop(b);
		*busy = true;
		return 0;
	}
	pthread_mutex_lock(&cs->alloc.lock);
	for (uint32_t s = 0; s < cs->lay.nslots && b->n < n; s++) {
		struct slot *sl = &cs->slots[s];
		uint64_t key = atomic_load(&sl->key);
		if (key == CACHE_KEY_NONE || key_bid(key) != bid)
			continue;
		uint32_t bits;
		if (!slot_retire(sl, &bits)) {
			*busy |= (bits & SB_STATE_MASK) != SB_FREE;
			continue;
		}
		map_remove(&cs->map, key, s);
		policy_remove(cs->policy, s);
		keys[b->n] = key;
		b->slots[b->n++] = s;
	}
	atomic_store(&cs->alloc.nfreeing, atomic_load(&cs->alloc.nfreeing) + b->n);
	pthread_mutex_unlock(&cs->alloc.lock);
	uint32_t got = b->n;
	if (!got) {
		free(keys);
		batch_drop(b);
		return 0;
	}
	b->done = done;
	b->done_arg = arg;
	*count = (int)got;
	batch_record(b, n, keys);
	free(keys);
	return (int)got;
}
