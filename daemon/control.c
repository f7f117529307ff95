/*
 * control.c - serve the control socket on a thread of its own.
 *
 * Control traffic is rare and small, so a blocking accept loop on one
 * thread is the simplest correct design; it never touches the I/O path
 * except through the thread-safe calls the handlers make. A request is
 * limited to 64 KiB and 5 seconds, so a stuck client cannot wedge it.
 */
#include "daemon/control.h"

#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define MAX_CMDS 32
#define MAX_REQ (64 * 1024)

struct command {
	const char *name;
	control_fn fn;
	void *arg;
};

static struct command commands[MAX_CMDS];
static int ncommands;
static int listen_fd = -1;
static int stop_pipe[2] = { -1, -1 };
static pthread_t thread;
static char sock_path[108];
/* Held while a command runs; a configuration reload takes it to swap what
 * the handlers read (control_lock). */
static pthread_mutex_t handler_lock = PTHREAD_MUTEX_INITIALIZER;

void control_lock(void) { pthread_mutex_lock(&handler_lock); }
void control_unlock(void) { pthread_mutex_unlock(&handler_lock); }

int control_register(const char *cmd, control_fn fn, void *arg)
{
	if (ncommands >= MAX_CMDS)
		return -1;
	commands[ncommands++] = (struct command){ cmd, fn, arg };
	return 0;
}

int control_error(struct json_object *resp, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	json_object_object_add(resp, "error", json_object_new_string(msg));
	return -1;
}

static bool peer_allowed(int fd)
{
	struct ucred cred;
	socklen_t len = sizeof(cred);
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0)
		return false;
	return cred.uid == 0 || cred.uid == geteuid();
}

/* Read until newline or EOF, with a deadline. Returns length or -1. */
static int read_request(int fd, char *buf, int cap)
{
	int n = 0;
	while (n < cap - 1) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		if (poll(&p, 1, 5000) <= 0)
			return -1;
		ssize_t r = read(fd, buf + n, cap - 1 - n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		n += (int)r;
		if (memchr(buf + n - r, '\n', r))
			break;
	}
	buf[n] = '\0';
	return n;
}

static void write_all(int fd, const char *s, size_t len)
{
	while (len) {
		ssize_t w = write(fd, s, len);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return;
		s += w;
		len -= (size_t)w;
	}
}

static void serve_one(int fd)
{
	static char buf[MAX_REQ];
	struct json_object *resp = json_object_new_object();
	struct json_object *req = NULL;
	int ok = -1;

	if (!peer_allowed(fd)) {
		control_error(resp, "permission denied: the control socket is for root only");
		goto out;
	}
	if (read_request(fd, buf, sizeof(buf)) <= 0) {
		control_error(resp, "empty or incomplete request");
		goto out;
	}
	req = json_tokener_parse(buf);
	struct json_object *cmd;
	if (!req || !json_object_is_type(req, json_type_object) ||
	    !json_object_object_get_ex(req, "cmd", &cmd) || !json_object_is_type(cmd, json_type_string)) {
		control_error(resp, "a request is a JSON object with a \"cmd\" string");
		goto out;
	}
	const char *name = json_object_get_string(cmd);
	for (int i = 0; i < ncommands; i++)
		if (!strcmp(commands[i].name, name)) {
			control_lock();
			ok = commands[i].fn(req, resp, commands[i].arg);
			control_unlock();
			goto out;
		}
	control_error(resp, "unknown command \"%.64s\"", name);
out:
	json_object_object_add(resp, "ok", json_object_new_boolean(ok == 0));
	const char *s = json_object_to_json_string_ext(resp, JSON_C_TO_STRING_PLAIN);
	write_all(fd, s, strlen(s));
	write_all(fd, "\n", 1);
	json_object_put(resp);
	if (req)
		json_object_put(req);
}

static void *control_main(void *arg)
{
	(void)arg;
	pthread_setname_np(pthread_self(), "tc-control");
	for (;;) {
		struct pollfd p[2] = { { .fd = listen_fd, .events = POLLIN }, { .fd = stop_pipe[0], .events = POLLIN } };
		if (poll(p, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		if (p[1].revents)
			break;
		if (!(p[0].revents & POLLIN))
			continue;
		int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
		if (fd < 0)
			continue;
		serve_one(fd);
		close(fd);
	}
	return NULL;
}

int control_start(const char *path, char *err, size_t errlen)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };

	if (strlen(path) >= sizeof(sa.sun_path)) {
		snprintf(err, errlen, "control socket path %s is longer than %zu characters; choose a shorter control_socket",
			 path, sizeof(sa.sun_path) - 1);
		return -1;
	}
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	snprintf(sock_path, sizeof(sock_path), "%s", path);
	listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (listen_fd < 0) {
		snprintf(err, errlen, "control socket: %s", strerror(errno));
		return -1;
	}
	/* A socket file left by a killed daemon: remove it if nobody answers. */
	if (connect(listen_fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
		snprintf(err, errlen, "another tiercached already answers on %s; stop it first", path);
		close(listen_fd);
		listen_fd = -1;
		return -1;
	}
	close(listen_fd);
	unlink(path);
	listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	mode_t old = umask(0077);
	int r = bind(listen_fd, (struct sockaddr *)&sa, sizeof(sa));
	umask(old);
	if (r < 0 || chmod(path, 0600) < 0 || listen(listen_fd, 16) < 0) {
		snprintf(err, errlen, "cannot create the control socket %s: %s; check that its directory exists",
			 path, strerror(errno));
		close(listen_fd);
		listen_fd = -1;
		return -1;
	}
	if (pipe2(stop_pipe, O_CLOEXEC) < 0 || pthread_create(&thread, NULL, control_main, NULL)) {
		snprintf(err, errlen, "cannot start the control thread: %s", strerror(errno));
		close(listen_fd);
		listen_fd = -1;
		return -1;
	}
	return 0;
}

void control_stop(void)
{
	if (listen_fd < 0)
		return;
	ssize_t w = write(stop_pipe[1], "x", 1);
	(void)w;
	pthread_join(thread, NULL);
	close(listen_fd);
	close(stop_pipe[0]);
	close(stop_pipe[1]);
	unlink(sock_path);
	listen_fd = -1;
}
