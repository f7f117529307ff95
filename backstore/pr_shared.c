/*
 * pr_shared.c - persistent reservations of a LU that several gateways
 * export (an RBD image with gateways > 1), kept alike on every gateway.
 *
 * The state lives in the cluster, as one blob of the shared device
 * (bdev.h "struct bdev_shared_ops"): the text of the state file (pr.c),
 * whose first line carries a version. Each gateway holds a copy in
 * lu->pr, which every command is checked against on the hot path as on a
 * single gateway.
 *
 * A PERSISTENT RESERVE OUT goes to this LU's thread, which
 *  1. reads the blob and installs it (the latest state, whoever made it),
 *  2. applies the service action to it (pr.c, as on one gateway), keeping
 *     the unit attentions it raises aside, and puts the cluster's state
 *     back in lu->pr until step 3 succeeds,
 *  3. writes the new state, version + 1, only if the blob's version line
 *     is still the one read (compare and write in one cluster operation);
 *     when another gateway changed it first, starts again at 1,
 *  4. installs it here and raises the unit attentions for this gateway's
 *     nexuses, then announces the change with the same unit attentions to
 *     every other gateway and waits until each has read the new state and
 *     raised them for its own nexuses, or, past PR_ANNOUNCE_MS, has been
 *     fenced from the image (the cluster blocklists it: it can serve
 *     nothing more until it has a fresh client, and it reads the state
 *     again before serving then, rbd_shared.c),
 *  5. answers GOOD (or the service action's error). A failure to reach
 *     the cluster answers BUSY, which hosts retry.
 * So once a host has its GOOD, every gateway that still serves decides
 * with the new state.
 *
 * The copy is "synced" while this gateway watches the blob and has read
 * it since the last time it may have missed a change; while it is not,
 * media commands are refused as on a gateway that lost the image (NOT
 * READY) and PERSISTENT RESERVE IN answers BUSY.
 *
 * APTPL: the state persists in the cluster either way. Registrations made
 * with APTPL clear are lost only when every gateway restarts: a gateway
 * that starts asks the others (an announcement nobody is fenced for) and,
 * when none answers, drops such a state, as a power loss would.
 *
 * PREEMPT AND ABORT: every gateway, this one before it announces and the
 * others before they acknowledge, waits until no command of a preempted
 * nexus is in flight there (up to PR_DRAIN_MS; they are let finish, not
 * aborted), so none lands after the host has its GOOD; those that come
 * later meet the new state and are refused.
 *
 * Not kept alike: SPC-2 RESERVE / RELEASE (one gateway's, as before).
 */
#include "backstore/pr_int.h"

#include "common/log.h"
#include "common/worker.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PR_BLOB "pr"
#define PR_HDR_LEN 32               /* "tiercache-pr 1 %016llx\n" */
#define PR_BLOB_MAX (1u << 20)
#define PR_ANNOUNCE_MS 10000u
#define PR_HELLO_MS 3000u
#define PR_CAS_TRIES 50
#define PR_EV_MAX 16384

struct pr_job {
	struct pr_job *next;
	struct scsi_cmd *cmd;
	struct worker *w;
	struct worker_call call;
	uint8_t sa, type, flags;
	uint64_t key, sa_key;
	uint32_t plen;
	uint8_t p[PR_PARAM_MAX];
	enum pr_result res;
	bool busy;                  /* the cluster could not be reached: BUSY */
};

struct pr_shared {
	struct scsi_lu *lu;
	struct bdev *dev;           /* the device whose blob it is */
	const struct bdev_shared_ops *ops;
	pthread_t thr;
	bool thr_started;
	pthread_mutex_t mu;         /* the job queue */
	pthread_cond_t cv;
	struct pr_job *head, **tail;
	bool stopping;
	/* synced while synced_gen == stale_gen: stale() counts the changes on
	 * their way, a read records the count it started from */
	_Atomic uint64_t stale_gen, synced_gen;
	/* under lu->mutex */
	uint64_t ver;               /* of the state in lu->pr */
	bool capturing;
	bool owed;                  /* PR thread: a change of ours is in the cluster, not yet announced */
	char ev[PR_EV_MAX];         /* "ua ASC I_PORT T_PORT|*" lines */
	size_t evlen;
	bool ev_lost;
};

bool pr_shared_trying(const struct scsi_lu *lu)
{
	return lu->prs->capturing;
}

bool pr_shared_capture(struct scsi_lu *lu, unsigned ua, const char *i_port, const char *t_port)
{
	struct pr_shared *s = lu->prs;
	if (!s->capturing)
		return false;
	int n = snprintf(s->ev + s->evlen, sizeof(s->ev) - s->evlen, "ua %u %s %s\n", ua, i_port,
			 t_port ? t_port : "*");
	if (n < 0 || (size_t)n >= sizeof(s->ev) - s->evlen) {
		s->ev[s->evlen] = 0;
		s->ev_lost = true;
	} else {
		s->evlen += (size_t)n;
	}
	return true;
}

/*
 * Each "ua ASC I_PORT T_PORT|*" line of an announcement: fn(ctx, ua,
 * i_port, t_port or NULL). Other lines ("change", "drain") are skipped.
 */
static void each_ua(const char *ev, size_t len, void (*fn)(void *ctx, unsigned ua, const char *ip, const char *tp),
		    void *ctx)
{
	char line[2 * PORT_NAME_MAX + 32];
	size_t at = 0;
	while (at < len) {
		size_t n = 0;
		while (at + n < len && ev[at + n] != '\n')
			n++;
		if (n < sizeof(line)) {
			memcpy(line, ev + at, n);
			line[n] = 0;
			unsigned ua;
			char ip[PORT_NAME_MAX], tp[PORT_NAME_MAX];
			if (sscanf(line, "ua %u %255s %255s", &ua, ip, tp) == 3)
				fn(ctx, ua, ip, strcmp(tp, "*") ? tp : NULL);
		}
		at += n + 1;
	}
}

static void deliver_one(void *ctx, unsigned ua, const char *ip, const char *tp)
{
	lu_ua_port_locked(ctx, ua, ip, tp);
}

/* Raise the unit attentions of an announcement for this gateway's nexuses. Locked. */
static void deliver(struct scsi_lu *lu, const char *ev, size_t len)
{
	each_ua(ev, len, deliver_one, lu);
}

/* The version on a blob's first line (0 when it has none). */
static uint64_t blob_ver(const char *buf, size_t len)
{
	char hdr[PR_HDR_LEN + 1];
	unsigned long long v = 0;
	if (len < PR_HDR_LEN)
		return 0;
	memcpy(hdr, buf, PR_HDR_LEN);
	hdr[PR_HDR_LEN] = 0;
	if (sscanf(hdr, "tiercache-pr 1 %llx", &v) != 1)
		return 0;
	return v;
}

struct drain_ctx {
	struct scsi_lu *lu;
	const struct scsi_nexus *skip;
	uint64_t end_ns; /* one limit for all the nexuses preempted */
	int ep;          /* the epoch whose commands are waited for */
	bool all;
};

static void drain_one(void *ctx, unsigned ua, const char *ip, const char *tp)
{
	struct drain_ctx *d = ctx;
	if (ua != UA_REGISTRATIONS_PREEMPTED || lu_drain_port(d->lu, ip, tp, d->skip, d->ep, d->end_ns))
		return;
	log_warn("lun \"%s\": commands of %s preempted with abort still run after %u s", d->lu->name, ip,
		 PR_DRAIN_MS / 1000);
	d->all = false;
}

/* PREEMPT AND ABORT (the announcement's "drain" line): wait for the
 * commands in flight here of each nexus it preempted. Not locked. */
static bool drain(struct scsi_lu *lu, const char *ev, size_t len, const struct scsi_nexus *skip)
{
	struct drain_ctx d = { .lu = lu, .skip = skip, .end_ns = lu_now_ns() + PR_DRAIN_MS * 1000000ull, .all = true };
	/* the commands here before the change, not those after it, which
	 * meet the new state (as in pr.c) */
	pthread_mutex_lock(&lu->mutex);
	d.ep = lu_pa_epoch_next_locked(lu);
	pthread_mutex_unlock(&lu->mutex);
	each_ua(ev, len, drain_one, &d);
	return d.all;
}

static bool wants_drain(const char *ev, size_t len)
{
	return len >= 13 && !memcmp(ev, "change\ndrain\n", 13);
}

/* Read the blob and install it (empty when there is none). 0 or -errno. Any thread but a worker. */
static int reload(struct pr_shared *s)
{
	struct scsi_lu *lu = s->lu;
	uint64_t g0 = atomic_load(&s->stale_gen);
	char *buf = malloc(PR_BLOB_MAX);
	if (!buf)
		return -ENOMEM;
	size_t len = 0;
	int r = s->ops->get(s->dev, PR_BLOB, buf, PR_BLOB_MAX, &len);
	pthread_mutex_lock(&lu->mutex);
	if (r == -ENOENT) {
		if (s->ver == 0) /* else read before our first blob was there: keep it */
			pr_clear_state(lu);
		r = 0;
	} else if (r == 0 && blob_ver(buf, len) < s->ver) {
		/* older than the copy (a change of ours got in between): keep ours */
	} else if (r == 0) {
		uint64_t ver;
		r = pr_install(lu, buf, len, &ver);
		if (r == 0)
			s->ver = ver;
		else
			log_err("lun \"%s\": the reservation state in the cluster is not valid; keeping the last "
				"good one", lu->name);
	}
	pthread_mutex_unlock(&lu->mutex);
	free(buf);
	uint64_t cur = atomic_load(&s->synced_gen);
	while (r == 0 && cur < g0 && !atomic_compare_exchange_weak(&s->synced_gen, &cur, g0))
		;
	return r;
}

/* Any thread, never blocks: a change is on its way (or may have been missed). */
static void stale(void *arg)
{
	struct pr_shared *s = arg;
	atomic_fetch_add(&s->stale_gen, 1);
}

/* The driver's thread: another gateway changed the state (msg), or we may have missed a change (NULL). */
static int changed(void *arg, const void *msg, size_t len)
{
	struct pr_shared *s = arg;
	int r = reload(s);
	if (r < 0) {
		log_warn("lun \"%s\": cannot read the reservation state from the cluster (%s); media commands wait",
			 s->lu->name, strerror(-r));
		return r; /* unanswered: the announcer fences us; we read it again on the fresh client */
	}
	if (msg && len) {
		pthread_mutex_lock(&s->lu->mutex);
		deliver(s->lu, msg, len);
		pthread_mutex_unlock(&s->lu->mutex);
		if (wants_drain(msg, len) && !drain(s->lu, msg, len, NULL))
			return -ETIMEDOUT; /* unanswered: the announcer fences us, which stops those commands too */
	}
	return 0;
}

static void job_complete(void *arg)
{
	struct pr_job *j = arg;
	struct scsi_cmd *cmd = j->cmd;
	if (j->busy)
		cmd->status = SAM_STAT_BUSY;
	else
		pr_answer(cmd, j->res);
	free(j);
	scsi_cmd_complete(cmd);
}

/* The LU's PR thread: a change of ours went to the cluster but not to
 * every gateway: tell them (or fence them) now. 0 once done. */
static int announce_owed(struct pr_shared *s)
{
	unsigned others = 0;
	int r = s->ops->announce(s->dev, PR_BLOB, "change\n", 7, PR_ANNOUNCE_MS, true, &others);
	if (r == 0)
		s->owed = false;
	return r;
}

/* The LU's PR thread: steps 1-5 at the top of the file. */
static void job_run(struct pr_shared *s, struct pr_job *j)
{
	struct scsi_lu *lu = s->lu;
	char *cur = malloc(PR_BLOB_MAX);
	j->busy = true;
	if (cur && s->owed && announce_owed(s) < 0) {
		free(cur);
		cur = NULL; /* a change of ours is still untold: BUSY until it is */
	}
	for (int tries = 0; cur && tries < PR_CAS_TRIES; tries++) {
		size_t len = 0;
		int r = s->ops->get(s->dev, PR_BLOB, cur, PR_BLOB_MAX, &len);
		if (r < 0 && r != -ENOENT) {
			log_warn("lun \"%s\": cannot read the reservation state from the cluster: %s", lu->name,
				 strerror(-r));
			break;
		}
		bool exists = r == 0;
		uint64_t ver = 0;
		pthread_mutex_lock(&lu->mutex);
		if (exists ? blob_ver(cur, len) < s->ver : s->ver != 0) {
			pthread_mutex_unlock(&lu->mutex);
			continue; /* read before a newer one we installed: read again */
		}
		if (exists && pr_install(lu, cur, len, &ver) < 0) {
			pthread_mutex_unlock(&lu->mutex);
			log_err("lun \"%s\": the reservation state in the cluster is not valid", lu->name);
			break;
		}
		if (!exists)
			pr_clear_state(lu);
		s->ver = ver;
		size_t oldlen = 0, newlen = 0;
		char *old = pr_encode(lu, ver, true, &oldlen);
		if (!old) {
			pthread_mutex_unlock(&lu->mutex);
			break;
		}
		/*
		 * Tried on lu->pr itself, then put back: meanwhile the hint
		 * stays set (update_hint), so a worker takes the slow path and
		 * waits for the mutex, and finds the cluster's state again.
		 */
		s->capturing = true;
		s->evlen = 0;
		s->ev_lost = false;
		s->ev[0] = 0;
		s->evlen = (size_t)snprintf(s->ev, sizeof(s->ev), "change\n%s",
					    j->sa == 5 ? "drain\n" : ""); /* PREEMPT AND ABORT: all wait */
		atomic_store(&lu->resv_held, true);
		j->res = pr_apply(lu, j->cmd->nexus, j->sa, j->type, j->key, j->sa_key, j->flags, j->p, j->plen);
		char *nu = pr_encode(lu, ver + 1, true, &newlen);
		s->capturing = false;
		bool change = nu && j->res == PR_OK &&
			      (oldlen != newlen || memcmp(old + PR_HDR_LEN, nu + PR_HDR_LEN, oldlen - PR_HDR_LEN));
		uint64_t v2;
		if (pr_install(lu, old, oldlen, &v2) < 0) /* the cluster's, until ours is */
			stale(s);
		pthread_mutex_unlock(&lu->mutex);
		free(old);
		if (!nu || !change) {
			free(nu);
			j->busy = !nu;
			break;
		}
		r = s->ops->cas(s->dev, PR_BLOB, exists ? cur : NULL, exists ? PR_HDR_LEN : 0, nu, newlen);
		if (r < 0 && r != -ECANCELED) {
			/* it may have been applied all the same: look */
			size_t l2 = 0;
			if (s->ops->get(s->dev, PR_BLOB, cur, PR_BLOB_MAX, &l2) == 0 && l2 == newlen &&
			    !memcmp(cur, nu, newlen))
				r = 0;
		}
		if (r == -ECANCELED) {
			free(nu);
			continue; /* another gateway changed it first: again on its state */
		}
		if (r < 0) {
			log_warn("lun \"%s\": cannot write the reservation state to the cluster: %s", lu->name,
				 strerror(-r));
			free(nu);
			break;
		}
		char *msg = malloc(s->evlen + 1);
		size_t msglen = 0;
		pthread_mutex_lock(&lu->mutex);
		if (ver + 1 >= s->ver) { /* not if a newer one came meanwhile (reload) */
			if (pr_install(lu, nu, newlen, &v2) == 0)
				s->ver = v2;
			else
				stale(s);
		}
		deliver(lu, s->ev, s->evlen);
		if (msg) {
			memcpy(msg, s->ev, s->evlen);
			msglen = s->evlen;
		}
		if (s->ev_lost)
			log_warn("lun \"%s\": too many unit attentions for one reservation change; some are not "
				 "raised", lu->name);
		pthread_mutex_unlock(&lu->mutex);
		free(nu);
		if (!pr_shared_synced(lu))
			reload(s);
		if (msg && wants_drain(msg, msglen))
			drain(lu, msg, msglen, j->cmd->nexus);
		unsigned others = 0;
		s->owed = true;
		r = s->ops->announce(s->dev, PR_BLOB, msg ? msg : "change\n", msg ? msglen : 7, PR_ANNOUNCE_MS, true,
				     &others);
		free(msg);
		if (r < 0) {
			log_err("lun \"%s\": a gateway could be neither told of a reservation change nor fenced (%s); "
				"answering BUSY until it can", lu->name, strerror(-r));
			break;
		}
		s->owed = false;
		j->busy = false;
		break;
	}
	free(cur);
	if (j->w)
		worker_post_call(j->w, &j->call, job_complete, j);
	else
		job_complete(j);
}

static void *pr_thread(void *arg)
{
	struct pr_shared *s = arg;
	for (;;) {
		pthread_mutex_lock(&s->mu);
		while (!s->head && !s->stopping)
			pthread_cond_wait(&s->cv, &s->mu);
		if (!s->head) {
			pthread_mutex_unlock(&s->mu);
			break;
		}
		struct pr_job *j = s->head;
		s->head = j->next;
		if (!s->head)
			s->tail = &s->head;
		pthread_mutex_unlock(&s->mu);
		job_run(s, j);
	}
	return NULL;
}

enum scsi_rc pr_shared_out(struct scsi_cmd *cmd, uint8_t sa, uint8_t type, uint64_t key, uint64_t sa_key,
			   uint8_t flags, const uint8_t *p, uint32_t plen)
{
	struct pr_shared *s = cmd->lu->prs;
	struct pr_job *j = calloc(1, sizeof(*j));
	if (!j) {
		cmd->status = SAM_STAT_BUSY;
		return SCSI_RC_DONE;
	}
	j->cmd = cmd;
	j->w = worker_self();
	j->sa = sa;
	j->type = type;
	j->flags = flags;
	j->key = key;
	j->sa_key = sa_key;
	j->plen = plen <= sizeof(j->p) ? plen : (uint32_t)sizeof(j->p);
	memcpy(j->p, p, j->plen);
	pthread_mutex_lock(&s->mu);
	*s->tail = j;
	s->tail = &j->next;
	pthread_cond_signal(&s->cv);
	pthread_mutex_unlock(&s->mu);
	return SCSI_RC_PENDING;
}

bool pr_shared_synced(const struct scsi_lu *lu)
{
	return !lu->prs || atomic_load(&lu->prs->synced_gen) == atomic_load(&lu->prs->stale_gen);
}

int pr_shared_start(struct scsi_lu *lu, char *err, size_t errlen)
{
	struct bdev *base = bdev_shared_base(lu->dev);
	if (!base || lu->alua_groups <= 1)
		return 0;
	struct pr_shared *s = calloc(1, sizeof(*s));
	if (!s) {
		snprintf(err, errlen, "lun \"%s\": out of memory", lu->name);
		return -1;
	}
	s->lu = lu;
	s->dev = base;
	s->ops = base->ops->owner->shared;
	s->tail = &s->head;
	atomic_init(&s->stale_gen, 1); /* not synced until the first read */
	atomic_init(&s->synced_gen, 0);
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv, NULL);
	pthread_mutex_lock(&lu->mutex);
	pr_clear_state(lu); /* not a state file's: the cluster's, read below */
	lu->prs = s;
	pthread_mutex_unlock(&lu->mutex);
	int r = s->ops->watch(base, PR_BLOB, changed, stale, s);
	if (r < 0) {
		snprintf(err, errlen, "lun \"%s\": cannot watch the reservation state in the cluster: %s", lu->name,
			 strerror(-r));
		goto fail;
	}
	unsigned others = 0;
	int hello = s->ops->announce(base, PR_BLOB, "", 0, PR_HELLO_MS, false, &others);
	if (hello < 0 && hello != -ETIMEDOUT)
		log_warn("lun \"%s\": cannot ask the other gateways whether they run (%s)", lu->name,
			 strerror(-hello));
	r = reload(s);
	if (r < 0) {
		snprintf(err, errlen, "lun \"%s\": cannot read the reservation state from the cluster: %s", lu->name,
			 strerror(-r));
		goto fail;
	}
	pthread_mutex_lock(&lu->mutex);
	/* only when the ping was sent and no gateway but us answered it; a
	 * gateway alive answers a ping at once, whatever it is busy with (the
	 * driver does, without our handler); watches that do not answer are
	 * those of gateways gone (the cluster drops them after ~30 s) */
	bool drop = (hello == 0 || hello == -ETIMEDOUT) && !others && !lu->pr.aptpl &&
		    (lu->pr.regs || lu->pr.type);
	size_t emptylen = 0, curlen = 0;
	char *cur = drop ? pr_encode(lu, s->ver, true, &curlen) : NULL;
	char *empty = NULL;
	if (drop) {
		struct pr_state keep = lu->pr;
		memset(&lu->pr, 0, sizeof(lu->pr));
		lu->pr.generation = keep.generation;
		empty = pr_encode(lu, s->ver + 1, true, &emptylen);
		lu->pr = keep;
	}
	pthread_mutex_unlock(&lu->mutex);
	if (drop && cur && empty) {
		r = s->ops->cas(base, PR_BLOB, cur, PR_HDR_LEN, empty, emptylen);
		if (r == 0)
			log_info("lun \"%s\": no other gateway runs; registrations made without APTPL are dropped, as "
				 "after a power loss", lu->name);
		else if (r != -ECANCELED)
			log_warn("lun \"%s\": cannot drop registrations made without APTPL: %s", lu->name,
				 strerror(-r));
		reload(s);
	}
	free(cur);
	free(empty);
	if (pthread_create(&s->thr, NULL, pr_thread, s) != 0) {
		snprintf(err, errlen, "lun \"%s\": cannot start its reservation thread", lu->name);
		goto fail;
	}
	s->thr_started = true;
	log_info("lun \"%s\": persistent reservations kept in the cluster for its %u gateways (%u other(s) "
		 "running)", lu->name, lu->alua_groups, others);
	return 0;
fail:
	pr_shared_stop(lu);
	return -1;
}

void pr_shared_stop(struct scsi_lu *lu)
{
	struct pr_shared *s = lu->prs;
	if (!s)
		return;
	s->ops->unwatch(s->dev);
	if (s->thr_started) {
		pthread_mutex_lock(&s->mu);
		s->stopping = true;
		pthread_cond_signal(&s->cv);
		pthread_mutex_unlock(&s->mu);
		pthread_join(s->thr, NULL);
	}
	pthread_mutex_lock(&lu->mutex);
	lu->prs = NULL;
	pthread_mutex_unlock(&lu->mutex);
	pthread_cond_destroy(&s->cv);
	pthread_mutex_destroy(&s->mu);
	free(s);
}
