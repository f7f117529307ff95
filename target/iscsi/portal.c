/*
 * portal.c - listening sockets, accepting, spreading connections over the
 * workers, and draining on shutdown.
 *
 * iscsi_portal_start binds every configured address (IPv4 or IPv6; an
 * IPv6 socket is v6-only so "0.0.0.0" and "::" can both be listed) on the
 * main thread, so a bind error reaches the operator as a sentence before
 * the daemon reports ready. The listening sockets are then watched by
 * worker 0; each accepted socket goes to the next worker in round-robin
 * order (worker_post carries the fd, no allocation of ours) and lives
 * there until it closes.
 *
 * iscsi_portal_drain stops accepting, asks every worker to stop reading
 * new requests on its connections, to send each normal session an
 * Asynchronous Message requesting logout, and to close each connection
 * once its in-flight commands have answered and its queue is written; waits for the count of live
 * connections to reach zero, and after a few seconds closes whatever is
 * left (an initiator that stopped reading).
 *
 * Threading: start/drain on the main thread; the accept handler and the
 * posted calls on workers; live_conns and draining are atomics.
 */
#include "target/iscsi/iscsi_int.h"

#include "common/log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_LISTEN 16
#define DRAIN_GRACE_MS 5000
#define DRAIN_FORCE_MS 2000

static void sleep_ms(unsigned ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000 };
	nanosleep(&ts, NULL);
}

/* Swapped by a reload (iscsi_portal_update); readers load it once. */
static const struct iscsi_portal_cfg *_Atomic g_cfg;
static struct ev_handler listeners[MAX_LISTEN];
static int nlisteners;
static atomic_int live_conns;
static atomic_bool draining;
static atomic_int listeners_closed;

const struct iscsi_portal_cfg *iscsi_portal_cfg(void) { return atomic_load(&g_cfg); }
void iscsi_portal_set_cfg(const struct iscsi_portal_cfg *cfg) { atomic_store(&g_cfg, cfg); }
void iscsi_portal_update(const struct iscsi_portal_cfg *cfg) { atomic_store(&g_cfg, cfg); }

bool iscsi_same_target(const struct iscsi_target_cfg *a, const struct iscsi_target_cfg *b)
{
	return a == b || (a && b && a->scsi && a->scsi == b->scsi);
}

static void close_target_worker(void *arg)
{
	const struct scsi_target *scsi = arg;
	struct iscsi_conn *c = iscsi_conn_first(), *next;
	for (; c; c = next) {
		next = c->next;
		if (c->sess && !c->sess->discovery && c->sess->tgt && c->sess->tgt->scsi == scsi) {
			log_info("iSCSI %s: %s: target %s was removed from the configuration; asking "
				 "the initiator to log out", c->peer, c->sess->initiator, c->sess->tgt->iqn);
			iscsi_conn_drain(c);
		}
	}
}

void iscsi_portal_close_target(const struct scsi_target *scsi)
{
	for (unsigned i = 0; i < workers_count(); i++)
		worker_post_wait(worker_get(i), close_target_worker, (void *)scsi);
}

void iscsi_portal_conn_gone(void) { atomic_fetch_sub(&live_conns, 1); }

static void peer_name(int fd, char *out, size_t outlen)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	char host[INET6_ADDRSTRLEN] = "?";
	unsigned port = 0;

	if (getpeername(fd, (struct sockaddr *)&ss, &sl) == 0) {
		if (ss.ss_family == AF_INET) {
			struct sockaddr_in *a = (struct sockaddr_in *)&ss;
			inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
			port = ntohs(a->sin_port);
			snprintf(out, outlen, "%s:%u", host, port);
			return;
		}
		if (ss.ss_family == AF_INET6) {
			struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
			inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
			port = ntohs(a->sin6_port);
			snprintf(out, outlen, "[%s]:%u", host, port);
			return;
		}
	}
	snprintf(out, outlen, "fd %d", fd);
}

/* Runs on the worker that will own the connection. */
static void conn_start(void *arg)
{
	int fd = (int)(intptr_t)arg;
	struct iscsi_conn *c;

	if (atomic_load(&draining)) {
		close(fd);
		atomic_fetch_sub(&live_conns, 1);
		return;
	}
	c = iscsi_conn_new(fd);
	if (!c) {
		log_err("iSCSI: cannot set up a connection (out of memory); closing it");
		close(fd);
		atomic_fetch_sub(&live_conns, 1);
		return;
	}
	peer_name(fd, c->peer, sizeof(c->peer));
	log_debug("iSCSI %s: connection accepted on worker %u", c->peer,
		  worker_index(worker_self()));
}

static void on_accept(struct ev_handler *h, uint32_t events)
{
	(void)events;
	for (int i = 0; i < 64; i++) {
		int fd = accept4(h->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EMFILE || errno == ENFILE)
				log_warn("iSCSI: cannot accept a connection: %s; raise the open file "
					 "limit (LimitNOFILE)", strerror(errno));
			return;
		}
		int one = 1;
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		atomic_fetch_add(&live_conns, 1);
		struct worker *w = worker_next();
		if (w == worker_self()) {
			conn_start((void *)(intptr_t)fd);
		} else if (worker_post(w, conn_start, (void *)(intptr_t)fd) < 0) {
			close(fd);
			atomic_fetch_sub(&live_conns, 1);
		}
	}
}

static void watch_listeners(void *arg)
{
	(void)arg;
	for (int i = 0; i < nlisteners; i++)
		if (worker_watch_file(&listeners[i], EPOLLIN) < 0)
			log_err("iSCSI: cannot watch listening socket %d", listeners[i].fd);
}

static void close_listeners(void *arg)
{
	(void)arg;
	for (int i = 0; i < nlisteners; i++) {
		worker_unwatch(&listeners[i]);
		close(listeners[i].fd);
	}
	atomic_store(&listeners_closed, 1);
}

static int bind_one(const struct iscsi_listen_cfg *l, char *err, size_t errlen)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
				  .ai_flags = AI_PASSIVE | AI_NUMERICSERV };
	struct addrinfo *res = NULL;
	char port[8];
	int fd = -1, one = 1, r;

	snprintf(port, sizeof(port), "%u", l->port);
	r = getaddrinfo(l->addr, port, &hints, &res);
	if (r) {
		snprintf(err, errlen, "listen address %s:%u cannot be resolved (%s); use a numeric "
			 "address or a name this host resolves", l->addr, l->port, gai_strerror(r));
		return -1;
	}
	fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		snprintf(err, errlen, "cannot create a socket for %s:%u: %s", l->addr, l->port,
			 strerror(errno));
		freeaddrinfo(res);
		return -1;
	}
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (res->ai_family == AF_INET6)
		setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
	if (bind(fd, res->ai_addr, res->ai_addrlen) < 0) {
		int e = errno;
		if (e == EADDRINUSE)
			snprintf(err, errlen, "%s:%u is in use by another program; stop it or change "
				 "listen", l->addr, l->port);
		else if (e == EADDRNOTAVAIL)
			snprintf(err, errlen, "%s is not an address of this machine; change listen",
				 l->addr);
		else if (e == EACCES)
			snprintf(err, errlen, "no permission to listen on %s:%u; use a port above "
				 "1023 or run with CAP_NET_BIND_SERVICE", l->addr, l->port);
		else
			snprintf(err, errlen, "cannot listen on %s:%u: %s", l->addr, l->port,
				 strerror(e));
		close(fd);
		freeaddrinfo(res);
		return -1;
	}
	freeaddrinfo(res);
	if (listen(fd, 128) < 0) {
		snprintf(err, errlen, "cannot listen on %s:%u: %s", l->addr, l->port, strerror(errno));
		close(fd);
		return -1;
	}
	return fd;
}

int iscsi_portal_start(const struct iscsi_portal_cfg *cfg, char *err, size_t errlen)
{
	if (cfg->nlisten > MAX_LISTEN) {
		snprintf(err, errlen, "%d listen addresses configured; the portal supports at most %d",
			 cfg->nlisten, MAX_LISTEN);
		return -1;
	}
	if (workers_count() == 0) {
		snprintf(err, errlen, "iSCSI portal started before the worker threads");
		return -1;
	}
	g_cfg = cfg;
	atomic_store(&draining, false);
	atomic_store(&listeners_closed, 0);
	nlisteners = 0;
	for (int i = 0; i < cfg->nlisten; i++) {
		int fd = bind_one(&cfg->listen[i], err, errlen);
		if (fd < 0) {
			for (int j = 0; j < nlisteners; j++)
				close(listeners[j].fd);
			nlisteners = 0;
			return -1;
		}
		listeners[nlisteners].fd = fd;
		listeners[nlisteners].on_event = on_accept;
		nlisteners++;
	}
	if (worker_post(worker_get(0), watch_listeners, NULL) < 0) {
		snprintf(err, errlen, "out of memory starting the iSCSI portal");
		return -1;
	}
	return 0;
}

static void drain_worker(void *arg)
{
	bool force = arg != NULL;
	struct iscsi_conn *c = iscsi_conn_first(), *next;
	for (; c; c = next) {
		next = c->next;
		if (force) {
			iscsi_conn_enter(c);
			iscsi_conn_close(c, "portal shutting down");
			iscsi_conn_leave(c);
		} else {
			iscsi_conn_drain(c);
		}
	}
}


static bool wait_conns(unsigned ms)
{
	uint64_t end = now_ms() + ms;
	while (atomic_load(&live_conns) > 0 && now_ms() < end)
		sleep_ms(10);
	return atomic_load(&live_conns) <= 0;
}

void iscsi_portal_drain(void)
{
	if (!g_cfg)
		return;
	atomic_store(&draining, true);
	if (nlisteners)
		worker_post_wait(worker_get(0), close_listeners, NULL);
	for (unsigned i = 0; i < workers_count(); i++)
		worker_post_wait(worker_get(i), drain_worker, NULL);
	if (!wait_conns(DRAIN_GRACE_MS)) {
		log_warn("iSCSI: %d connection(s) still busy after %u s; closing them",
			 atomic_load(&live_conns), DRAIN_GRACE_MS / 1000);
		for (unsigned i = 0; i < workers_count(); i++)
			worker_post_wait(worker_get(i), drain_worker, (void *)1);
		if (!wait_conns(DRAIN_FORCE_MS))
			log_warn("iSCSI: %d connection(s) still wait for the backstore; giving up",
				 atomic_load(&live_conns));
	}
	uint64_t end = now_ms() + 1000;
	while (nlisteners && !atomic_load(&listeners_closed) && now_ms() < end)
		sleep_ms(5);
	log_info("iSCSI portal drained");
}
