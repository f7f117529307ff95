/*
 * rbd_service.c - the threads that do the RBD images' background work, so
 * that a gateway's threads do not grow with its images.
 *
 * Every open image is an item here with a due time, and so is the watch of
 * a shared image's reservation object (rbd_shared.c); a step of it (an
 * image's lock work in rbd_lock.c and its size and connection poll in
 * rbd.c; the watch's notices) runs on one of a few service threads when
 * due, and says when it is due again. rbd_service_kick makes an item due
 * now (a takeover asked for, a fence noticed, the header changed, a
 * notice came). One item's steps never run at the same time; an image's
 * and its watch's may (the watch's may wait for a slow reader of the
 * reservations while the image's renews its lease).
 *
 * Steps wait on the cluster (each call bounded by the operation timeout),
 * and an owner's lease must be renewed every second whatever another
 * image's cluster calls are doing. So the threads are a pool that keeps
 * one idle thread in reserve whenever a step starts (up to
 * RBD_SERVICE_MAX threads), and shrinks when threads stay idle: a cluster
 * that answers costs two threads for hundreds of images, one that hangs
 * costs at most RBD_SERVICE_MAX. The pool ends when the last image
 * closes.
 */
#include "bdev/rbd_int.h"

#include "common/log.h"

#include <errno.h>
#include <string.h>
#include <time.h>

#define RBD_SERVICE_MAX 32
#define RBD_SERVICE_IDLE_MS 10000 /* idle this long, and not the last one: the thread ends */

static struct {
	pthread_mutex_t mu;
	pthread_cond_t cv;          /* work, or an item no longer busy (CLOCK_MONOTONIC) */
	bool init;
	struct rbd_svc_item *items; /* through next */
	unsigned threads, idle;
} svc = { .mu = PTHREAD_MUTEX_INITIALIZER };

static void svc_init_locked(void)
{
	if (svc.init)
		return;
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&svc.cv, &ca);
	pthread_condattr_destroy(&ca);
	svc.init = true;
}

static void *svc_thread(void *arg);

/* One more thread (svc.mu held); false when none could be started. */
static bool svc_spawn_locked(void)
{
	pthread_t th;
	pthread_attr_t a;
	pthread_attr_init(&a);
	pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
	int r = pthread_create(&th, &a, svc_thread, NULL);
	pthread_attr_destroy(&a);
	if (r) {
		log_warn("rbd: cannot start another service thread (%s); %u serve the images", strerror(r),
			 svc.threads);
		return false;
	}
	svc.threads++;
	return true;
}

/* The item due first that no thread runs, or NULL. */
static struct rbd_svc_item *svc_next_locked(void)
{
	struct rbd_svc_item *best = NULL;
	for (struct rbd_svc_item *it = svc.items; it; it = it->next)
		if (!it->busy && (!best || it->due < best->due))
			best = it;
	return best;
}

static void cv_wait_ms(uint64_t ms)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_sec += (time_t)(ms / 1000);
	ts.tv_nsec += (long)(ms % 1000) * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	pthread_cond_timedwait(&svc.cv, &svc.mu, &ts);
}

static void *svc_thread(void *arg)
{
	(void)arg;
	uint64_t idle_since = now_ms();
	pthread_mutex_lock(&svc.mu);
	for (;;) {
		if (!svc.items)
			break; /* the last image closed */
		struct rbd_svc_item *it = svc_next_locked();
		uint64_t now = now_ms();
		if (it && it->due <= now) {
			it->busy = true;
			it->kicked = false;
			/* a thread in reserve: this step may wait on the cluster */
			if (svc.idle == 0 && svc.threads < RBD_SERVICE_MAX)
				svc_spawn_locked();
			pthread_mutex_unlock(&svc.mu);
			uint64_t next = it->step(it);
			pthread_mutex_lock(&svc.mu);
			it->busy = false;
			it->due = it->kicked ? 0 : next;
			pthread_cond_broadcast(&svc.cv); /* rbd_service_remove may wait for it */
			idle_since = now_ms();
			continue;
		}
		/* idle a while: gone, unless it is the reserve (no other idle) */
		if (svc.threads > 1 && svc.idle > 0 && now - idle_since >= RBD_SERVICE_IDLE_MS)
			break;
		uint64_t wait = it ? it->due - now : 1000;
		if (wait > 1000)
			wait = 1000;
		svc.idle++;
		cv_wait_ms(wait);
		svc.idle--;
	}
	svc.threads--;
	pthread_cond_broadcast(&svc.cv);
	pthread_mutex_unlock(&svc.mu);
	return NULL;
}

int rbd_service_add(struct rbd_svc_item *it, uint64_t (*step)(struct rbd_svc_item *it))
{
	pthread_mutex_lock(&svc.mu);
	svc_init_locked();
	if (svc.threads == 0 && !svc_spawn_locked()) {
		pthread_mutex_unlock(&svc.mu);
		return -EAGAIN;
	}
	it->step = step;
	it->due = 0;
	it->busy = false;
	it->kicked = false;
	it->next = svc.items;
	svc.items = it;
	it->listed = true;
	pthread_cond_broadcast(&svc.cv);
	pthread_mutex_unlock(&svc.mu);
	return 0;
}

void rbd_service_kick(struct rbd_svc_item *it)
{
	pthread_mutex_lock(&svc.mu);
	if (it->listed) {
		it->due = 0;
		it->kicked = true; /* a step running now runs again after */
		pthread_cond_signal(&svc.cv);
	}
	pthread_mutex_unlock(&svc.mu);
}

void rbd_service_remove(struct rbd_svc_item *it)
{
	pthread_mutex_lock(&svc.mu);
	if (it->listed) {
		while (it->busy) {
			pthread_cond_broadcast(&svc.cv);
			cv_wait_ms(1000);
		}
		for (struct rbd_svc_item **pp = &svc.items; *pp; pp = &(*pp)->next)
			if (*pp == it) {
				*pp = it->next;
				break;
			}
		it->listed = false;
		pthread_cond_broadcast(&svc.cv); /* the last one: the threads end */
	}
	pthread_mutex_unlock(&svc.mu);
}
