/*
 * tierctl - talk to a running tiercached over its control socket.
 *
 *   tierctl [-s SOCKET | -c CONFIG] [--json] COMMAND [ARGS]
 *   (the options in brackets may also follow the command)
 *
 * Commands are sent as one JSON request; the daemon answers with one JSON
 * object. By default the answer is shown for people (nested keys indented,
 * lists numbered); --json prints it unchanged for scripts. The exit status
 * is 0 when the daemon said ok, 1 when it refused (the reason is printed),
 * 2 for usage errors and 3 when the daemon cannot be reached.
 */
#include "config/config.h"
#include "config/targetcli.h"
#include "tools/tierctl.h"

#include <errno.h>
#include <getopt.h>
#include <json-c/json.h>
#include <limits.h>
#include <stdint.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_SOCKET "/run/tiercache/control.sock"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: tierctl [-s SOCKET | -c CONFIG] [--json] COMMAND [ARGS]\n"
		"commands:\n"
		"  status                     targets, LUNs (RBD: pool/image, cluster, lock owner, ALUA state),\n"
		"                             cache sets, legs and health\n"
		"  stats [--watch [SECS]]     I/O and cache counters (repeat every SECS)\n"
		"  top [--interval S] [--count N]\n"
		"                             per LUN IOPS, MB/s, latency percentiles, hit ratio;\n"
		"                             per set dirty data, destage rate, legs (every S s)\n"
		"  flush [--wait]             destage all dirty data (and wait for it)\n"
		"  advise [SET] [--target PCT] [--reset]\n"
		"                             the read hit ratio each set and LUN would have at 1/4 to 8\n"
		"                             times today's cache size (--target: the size that reaches\n"
		"                             PCT; --reset: then start a fresh curve)\n"
		"  trace SET start FILE [--max N] | trace SET stop | trace SET\n"
		"                             record every read and write SET serves to FILE (created\n"
		"                             by the daemon, in its state_dir unless absolute; \"R|W\n"
		"                             LUN OFFSET LEN USEC\" a line, for replay and sizing;\n"
		"                             --max: stop recording after N requests)\n"
		"  mode LUN MODE              write-back | write-through | write-around | pass-through\n"
		"  detach LUN                 run the LUN uncached from now on, and destage its dirty\n"
		"                             data (bytes left, rate and ETA until done)\n"
		"  set SET KEY VALUE          change a running cache set: destage_max (bytes per\n"
		"                             second, like 50M; 0 = no cap) or destage_max_iops\n"
		"  leg replace SET OLD NEW [--wait]\n"
		"                             resync a new leg in place of a failed OLD, online\n"
		"                             (--wait: follow it, bytes left, rate and ETA)\n"
		"  leg fail SET LEG           take a healthy leg out of service (to replace it)\n"
		"  leg fault SET LEG MODE [OFFSET LENGTH | USEC]\n"
		"                             tests only (a set with fault_injection = yes): make a\n"
		"                             leg fail: eio, hang, range OFFSET LENGTH (reads), stuck\n"
		"                             OFFSET LENGTH (reads, never healed), or ok; or slow:\n"
		"                             delay USEC (one request at a time, USEC each)\n"
		"  targetcli                  print targetcli commands for LIO (needs -c CONFIG;\n"
		"                             no daemon needed): pipe them into targetcli\n"
		"options (before or after the command):\n"
		"  -s, --socket PATH          control socket (default " DEFAULT_SOCKET ")\n"
		"  -c, --config FILE          take the socket path from the daemon's config\n"
		"      --json                 print the daemon's JSON answer as it is\n");
}

static struct json_object *call(const char *path, struct json_object *req, int *rc)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		fprintf(stderr, "tierctl: cannot reach tiercached at %s: %s (is the daemon running? "
			"give the socket with -s or the config with -c)\n", path, strerror(errno));
		*rc = 3;
		if (fd >= 0)
			close(fd);
		return NULL;
	}
	const char *s = json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN);
	size_t len = strlen(s);
	if (write(fd, s, len) != (ssize_t)len || write(fd, "\n", 1) != 1) {
		fprintf(stderr, "tierctl: sending to %s failed: %s\n", path, strerror(errno));
		close(fd);
		*rc = 3;
		return NULL;
	}
	shutdown(fd, SHUT_WR);
	struct json_tokener *tok = json_tokener_new();
	struct json_object *resp = NULL;
	char buf[65536];
	ssize_t n;
	while (!resp && (n = read(fd, buf, sizeof(buf))) > 0) {
		resp = json_tokener_parse_ex(tok, buf, (int)n);
		if (!resp && json_tokener_get_error(tok) != json_tokener_continue)
			break;
	}
	json_tokener_free(tok);
	close(fd);
	if (!resp) {
		fprintf(stderr, "tierctl: the daemon's answer was not JSON\n");
		*rc = 3;
	}
	return resp;
}

struct json_object *tierctl_call(const char *path, struct json_object *req, int *rc)
{
	return call(path, req, rc);
}

static void print_value(struct json_object *v, int indent);

static void print_object(struct json_object *o, int indent)
{
	json_object_object_foreach(o, key, val)
	{
		if (!strcmp(key, "ok"))
			continue;
		enum json_type t = json_object_get_type(val);
		printf("%*s%s:", indent, "", key);
		if (t == json_type_object || t == json_type_array) {
			printf("\n");
			print_value(val, indent + 2);
		} else {
			printf(" %s\n", json_object_get_string(val));
		}
	}
}

static void print_value(struct json_object *v, int indent)
{
	if (json_object_is_type(v, json_type_object)) {
		print_object(v, indent);
	} else if (json_object_is_type(v, json_type_array)) {
		size_t n = json_object_array_length(v);
		if (n == 0)
			printf("%*s(none)\n", indent, "");
		for (size_t i = 0; i < n; i++) {
			struct json_object *e = json_object_array_get_idx(v, i);
			if (json_object_is_type(e, json_type_object)) {
				printf("%*s- \n", indent, "");
				print_object(e, indent + 2);
			} else {
				printf("%*s- %s\n", indent, "", json_object_get_string(e));
			}
		}
	} else {
		printf("%*s%s\n", indent, "", json_object_get_string(v));
	}
}

static int show(struct json_object *resp, bool json);
static void show_advice(struct json_object *resp);

/*
 * Follow a job (flush, a LUN's destage after detach or mode, a leg's
 * resync) until nothing is left: preq asks the daemon for bytes left
 * ("left_bytes" or "dirty_bytes") and the total ("total_bytes" or
 * "start_dirty_bytes"). The rate is measured over the last few seconds of
 * samples (a ring of them), the ETA is what is left at that rate. On a
 * terminal one line is redrawn; otherwise a plain line a second; with
 * --json a JSON object per sample on stdout.
 */
static int follow_progress(const char *path, struct json_object *preq, bool json, const char *what,
			   const char *done)
{
	enum { NS = 25 }; /* 5 s of 200 ms samples */
	double st[NS];
	int64_t sd[NS];
	int ns = 0, rc = 0;
	double last_line = 0;
	bool tty = isatty(2);
	for (;;) {
		struct json_object *resp = call(path, preq, &rc);
		if (!resp)
			return rc;
		struct json_object *ok, *d, *t, *why;
		if (json_object_object_get_ex(resp, "ok", &ok) && !json_object_get_boolean(ok)) {
			if (!json && !tty)
				fprintf(stderr, "\n");
			rc = show(resp, json);
			json_object_put(resp);
			return rc ? rc : 1;
		}
		/* the daemon's names: dirty bytes for a destage, left bytes for a resync */
		const char *lk = "left_bytes", *tk = "total_bytes";
		if (!json_object_object_get_ex(resp, lk, &d)) {
			lk = "dirty_bytes";
			tk = "start_dirty_bytes";
		}
		int64_t left = json_object_object_get_ex(resp, lk, &d) ? json_object_get_int64(d) : 0;
		int64_t total = json_object_object_get_ex(resp, tk, &t) ? json_object_get_int64(t) : 0;
		char blocked[300] = "";
		if (json_object_object_get_ex(resp, "waiting_for", &why))
			snprintf(blocked, sizeof(blocked), "  waiting: %s", json_object_get_string(why));
		json_object_put(resp);
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		double now = (double)ts.tv_sec + ts.tv_nsec / 1e9;
		st[ns % NS] = now;
		sd[ns % NS] = left;
		ns++;
		int oldest = ns > NS ? ns % NS : 0;
		double span = now - st[oldest];
		double rate = span > 0.5 ? (double)(sd[oldest] - left) / span : 0; /* bytes per second */
		int64_t eta = rate > 0 ? (int64_t)((double)left / rate + 0.5) : -1;
		char eta_s[32] = "unknown";
		if (eta >= 0)
			snprintf(eta_s, sizeof(eta_s), "%lld:%02lld", (long long)(eta / 60), (long long)(eta % 60));
		if (json) {
			printf("{\"%s\": %lld, \"%s\": %lld, \"rate_bytes_per_second\": %.0f, \"eta_seconds\": %lld}\n",
			       lk, (long long)left, tk, (long long)total, rate < 0 ? 0 : rate, (long long)eta);
			fflush(stdout);
		} else if (total > 0 && (tty || left <= 0 || now - last_line >= 1.0)) {
			int pct = total > left ? (int)(100 - (left * 100) / total) : 0;
			char line[512];
			snprintf(line, sizeof(line), "%3d%%  %lld MiB left  %.1f MiB/s  ETA %s%s", pct,
				 (long long)(left >> 20), rate < 0 ? 0 : rate / 1048576.0, eta_s, blocked);
			if (tty) /* \033[K: a shorter line than the last leaves no tail */
				fprintf(stderr, "\r%s [%-25.*s] %s\033[K", what, pct / 4, "#########################",
					line);
			else
				fprintf(stderr, "%s: %s\n", what, line);
			last_line = now;
		}
		if (left <= 0)
			break;
		usleep(200000);
	}
	if (!json)
		fprintf(stderr, "%s%s\n", tty ? "\n" : "", done);
	return 0;
}

static int show(struct json_object *resp, bool json)
{
	struct json_object *ok, *err;
	bool good = json_object_object_get_ex(resp, "ok", &ok) && json_object_get_boolean(ok);
	if (json) {
		printf("%s\n", json_object_to_json_string_ext(resp, JSON_C_TO_STRING_PRETTY));
	} else if (!good && json_object_object_get_ex(resp, "error", &err)) {
		fprintf(stderr, "tierctl: %s\n", json_object_get_string(err));
	} else if (json_object_object_get_ex(resp, "advice", NULL)) {
		show_advice(resp);
	} else {
		print_object(resp, 0);
	}
	return good ? 0 : 1;
}

/* 1.5G, 256M: a size in the units admins give sizes in */
static const char *size_str(char *buf, size_t n, double bytes)
{
	static const char units[] = "KMGTP";
	double v = bytes / 1024;
	int u = 0;
	while (v >= 1024 && u < 4) {
		v /= 1024;
		u++;
	}
	snprintf(buf, n, v >= 10 || v == (int)v ? "%.0f%c" : "%.1f%c", v, units[u]);
	return buf;
}

/* tierctl advise: a row of hit ratios per set and LUN under the sizes. */
static void show_advice(struct json_object *resp)
{
	static const char *const scale_names[] = { "1/4", "1/2", "1x", "2x", "4x", "8x" };
	struct json_object *caches, *t;
	double target = json_object_object_get_ex(resp, "target", &t) ? json_object_get_double(t) : 0;
	if (!json_object_object_get_ex(resp, "advice", &caches))
		return;
	for (size_t i = 0; i < json_object_array_length(caches); i++) {
		struct json_object *c = json_object_array_get_idx(caches, i), *v, *sizes, *set, *luns;
		char b1[32], b2[32];
		const char *name = json_object_object_get_ex(c, "name", &v) ? json_object_get_string(v) : "?";
		if (json_object_object_get_ex(c, "error", &v)) {
			printf("cache %s: %s\n", name, json_object_get_string(v));
			continue;
		}
		double size = json_object_object_get_ex(c, "size_bytes", &v) ? (double)json_object_get_int64(v) : 0;
		double rate = json_object_object_get_ex(c, "sampling_rate", &v) ? json_object_get_double(v) : 1;
		double mem = json_object_object_get_ex(c, "memory_bytes", &v) ? (double)json_object_get_int64(v) : 0;
		printf("cache %s: today %s; %s, advisor memory %s\n", name, size_str(b1, sizeof(b1), size),
		       rate >= 1 ? "every extent simulated" : "sampled extents", size_str(b2, sizeof(b2), mem));
		if (rate > 0 && rate < 1)
			printf("  (one extent in %.0f)\n", 1 / rate);
		printf("  %-24s", "read hit ratio at");
		if (!json_object_object_get_ex(c, "sizes", &sizes) || !json_object_is_type(sizes, json_type_array) ||
		    !json_object_object_get_ex(c, "set", &set) || !json_object_object_get_ex(c, "luns", &luns) ||
		    !json_object_is_type(luns, json_type_array)) {
			printf("  (the daemon's answer lacks sizes, set or luns)\n");
			continue;
		}
		for (size_t k = 0; k < json_object_array_length(sizes) && k < 6; k++) {
			struct json_object *s = json_object_array_get_idx(sizes, k), *bytes;
			json_object_object_get_ex(s, "bytes", &bytes);
			char col[48];
			snprintf(col, sizeof(col), "%s %s", scale_names[k],
				 size_str(b1, sizeof(b1), (double)json_object_get_int64(bytes)));
			printf(" %11s", col);
		}
		printf("\n");
		for (size_t l = 0; l <= json_object_array_length(luns); l++) {
			struct json_object *row = l == 0 ? set : json_object_array_get_idx(luns, l - 1), *ratios, *n;
			char label[96];
			if (l == 0) {
				snprintf(label, sizeof(label), "set %s (all LUNs)", name);
			} else {
				snprintf(label, sizeof(label), "lun %s alone",
					 json_object_object_get_ex(row, "name", &n) ? json_object_get_string(n) : "?");
			}
			printf("  %-24s", label);
			if (!json_object_object_get_ex(row, "hit_ratio", &ratios) ||
			    !json_object_is_type(ratios, json_type_array))
				ratios = NULL;
			for (size_t k = 0; ratios && k < json_object_array_length(ratios); k++)
				printf(" %10.1f%%", 100 * json_object_get_double(json_object_array_get_idx(ratios, k)));
			int64_t reads = json_object_object_get_ex(row, "reads_sampled", &n) ? json_object_get_int64(n) : 0;
			printf("%s\n", reads < 1000 ? "  (few reads so far: rough)" : "");
			if (target > 0 && json_object_object_get_ex(row, "size_for_target", &n)) {
				if (n)
					printf("  %-24s %.0f%% needs about %s\n", "", 100 * target,
					       size_str(b1, sizeof(b1), (double)json_object_get_int64(n)));
				else
					printf("  %-24s %.0f%% is not reached even at 8x\n", "", 100 * target);
			}
		}
	}
}

static const char *socket_from_config(const char *conf)
{
	static char path[512];
	struct config *cfg;
	char err[512];
	if (config_load(conf, &cfg, err, sizeof(err)) < 0) {
		fprintf(stderr, "tierctl: %s\n", err);
		exit(2);
	}
	snprintf(path, sizeof(path), "%s", cfg->control_socket);
	config_free(cfg);
	return path;
}

/* tierctl -c CONFIG targetcli: computed from the file, no daemon involved. */
static int print_targetcli(const char *conf, int nargs)
{
	struct config *cfg;
	char err[1024];

	if (!conf || nargs) {
		fprintf(stderr, "tierctl: targetcli takes no arguments and needs the config: tierctl -c CONFIG targetcli\n");
		return 2;
	}
	if (config_load(conf, &cfg, err, sizeof(err)) < 0) {
		fprintf(stderr, "tierctl: %s\n", err);
		return 2;
	}
	int r = config_targetcli_script(cfg, stdout, stderr, err, sizeof(err));
	if (r < 0)
		fprintf(stderr, "tierctl: %s\n", err);
	config_free(cfg);
	return r < 0 ? 1 : 0;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "config", required_argument, NULL, 'c' },
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	const char *path = DEFAULT_SOCKET;
	const char *conf = NULL;
	bool json = false;
	int c;

	while ((c = getopt_long(argc, argv, "+s:c:h", opts, NULL)) != -1) {
		switch (c) {
		case 's': path = optarg; break;
		case 'c': conf = optarg; path = socket_from_config(optarg); break;
		case 'j': json = true; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (optind >= argc) {
		usage(stderr);
		return 2;
	}
	const char *cmd = argv[optind++];
	/* The global options also work after the command, where people type
	 * them (tierctl status --json); what is left are the command's own. */
	int kept = optind;
	for (int i = optind; i < argc; i++) {
		const char *a = argv[i];
		const char *val = NULL;
		bool takes = false;
		if (!strcmp(a, "--json")) {
			json = true;
			continue;
		}
		if (!strcmp(a, "-s") || !strcmp(a, "--socket") || !strcmp(a, "-c") || !strcmp(a, "--config")) {
			takes = true;
			if (i + 1 >= argc) {
				fprintf(stderr, "tierctl: %s needs a value\n", a);
				return 2;
			}
			val = argv[++i];
		} else if (!strncmp(a, "--socket=", 9) || !strncmp(a, "--config=", 9)) {
			takes = true;
			val = a + 9;
		}
		if (!takes) {
			argv[kept++] = argv[i];
			continue;
		}
		if (a[1] == 's' || !strncmp(a, "--socket", 8)) {
			path = val;
		} else {
			conf = val;
			path = socket_from_config(val);
		}
	}
	argc = kept;
	int nargs = argc - optind;
	if (!strcmp(cmd, "targetcli"))
		return print_targetcli(conf, nargs);
	char **args = argv + optind;
	struct json_object *req = json_object_new_object();
	bool watch = false, wait = false;
	int interval = 1;

	if (!strcmp(cmd, "top")) {
		int count = 0;
		for (int i = 0; i < nargs; i++) {
			if (!strcmp(args[i], "--interval") && i + 1 < nargs && atoi(args[i + 1]) > 0) {
				interval = atoi(args[++i]);
			} else if (!strcmp(args[i], "--count") && i + 1 < nargs && atoi(args[i + 1]) > 0) {
				count = atoi(args[++i]);
			} else {
				usage(stderr);
				return 2;
			}
		}
		json_object_put(req);
		return tierctl_top(path, interval, count);
	}
	if (!strcmp(cmd, "status") && nargs == 0) {
	} else if (!strcmp(cmd, "stats")) {
		for (int i = 0; i < nargs; i++) {
			if (!strcmp(args[i], "--watch")) {
				watch = true;
				if (i + 1 < nargs && atoi(args[i + 1]) > 0)
					interval = atoi(args[++i]);
			} else {
				usage(stderr);
				return 2;
			}
		}
	} else if (!strcmp(cmd, "flush") && nargs <= 1) {
		if (nargs == 1 && strcmp(args[0], "--wait")) {
			usage(stderr);
			return 2;
		}
		wait = nargs == 1;
	} else if (!strcmp(cmd, "advise")) {
		for (int i = 0; i < nargs; i++) {
			if (!strcmp(args[i], "--target") && i + 1 < nargs) {
				char *end;
				double pct = strtod(args[++i], &end);
				if (*end == '%')
					end++;
				if (*end || pct <= 0 || pct > 100) {
					fprintf(stderr, "tierctl: advise --target takes a hit ratio in percent, like 80\n");
					return 2;
				}
				json_object_object_add(req, "target", json_object_new_double(pct / 100));
			} else if (!strcmp(args[i], "--reset")) {
				json_object_object_add(req, "reset", json_object_new_boolean(true));
			} else if (args[i][0] != '-' && !json_object_object_get_ex(req, "set", NULL)) {
				json_object_object_add(req, "set", json_object_new_string(args[i]));
			} else {
				usage(stderr);
				return 2;
			}
		}
	} else if (!strcmp(cmd, "trace") && nargs >= 1 && nargs <= 5) {
		json_object_object_add(req, "set", json_object_new_string(args[0]));
		if (nargs >= 3 && !strcmp(args[1], "start")) {
			/* the daemon creates the file: a relative name is in its state directory */
			json_object_object_add(req, "action", json_object_new_string("start"));
			json_object_object_add(req, "path", json_object_new_string(args[2]));
			if (nargs == 5 && !strcmp(args[3], "--max")) {
				char *end;
				errno = 0;
				unsigned long long m = strtoull(args[4], &end, 10);
				if (errno || *end || !m || m > INT64_MAX || args[4][0] == '-') {
					fprintf(stderr, "tierctl: trace --max takes a count of requests, like 1000000\n");
					return 2;
				}
				json_object_object_add(req, "max_records", json_object_new_int64((int64_t)m));
			} else if (nargs != 3) {
				usage(stderr);
				return 2;
			}
		} else if (nargs == 2 && !strcmp(args[1], "stop")) {
			json_object_object_add(req, "action", json_object_new_string("stop"));
		} else if (nargs != 1) {
			usage(stderr);
			return 2;
		}
	} else if (!strcmp(cmd, "mode") && nargs == 2) {
		wait = true; /* leaving write-back: follow the destage */
		json_object_object_add(req, "lun", json_object_new_string(args[0]));
		json_object_object_add(req, "mode", json_object_new_string(args[1]));
	} else if (!strcmp(cmd, "set") && nargs == 3) {
		json_object_object_add(req, "set", json_object_new_string(args[0]));
		json_object_object_add(req, "key", json_object_new_string(args[1]));
		json_object_object_add(req, "value", json_object_new_string(args[2]));
	} else if (!strcmp(cmd, "detach") && nargs == 1) {
		wait = true;
		json_object_object_add(req, "lun", json_object_new_string(args[0]));
	} else if (!strcmp(cmd, "leg") && (nargs == 4 || (nargs == 5 && !strcmp(args[4], "--wait"))) &&
		   !strcmp(args[0], "replace")) {
		wait = nargs == 5;
		cmd = "leg-replace";
		json_object_object_add(req, "set", json_object_new_string(args[1]));
		json_object_object_add(req, "old", json_object_new_string(args[2]));
		json_object_object_add(req, "new", json_object_new_string(args[3]));
	} else if (!strcmp(cmd, "leg") && nargs >= 4 && nargs <= 6 && !strcmp(args[0], "fault")) {
		cmd = "leg-fault";
		json_object_object_add(req, "set", json_object_new_string(args[1]));
		json_object_object_add(req, "leg", json_object_new_string(args[2]));
		json_object_object_add(req, "fault", json_object_new_string(args[3]));
		if (nargs == 5) /* delay USEC */
			json_object_object_add(req, "offset", json_object_new_string(args[4]));
		if (nargs == 6) {
			json_object_object_add(req, "offset", json_object_new_string(args[4]));
			json_object_object_add(req, "length", json_object_new_string(args[5]));
		}
	} else if (!strcmp(cmd, "leg") && nargs == 3 && !strcmp(args[0], "fail")) {
		cmd = "leg-fail";
		json_object_object_add(req, "set", json_object_new_string(args[1]));
		json_object_object_add(req, "leg", json_object_new_string(args[2]));
	} else {
		usage(stderr);
		return 2;
	}
	json_object_object_add(req, "cmd", json_object_new_string(cmd));

	int rc = 0;
	if (wait) {
		/* start the job, then follow it until nothing is left */
		struct json_object *resp = call(path, req, &rc);
		if (!resp)
			return rc;
		struct json_object *f;
		bool running = !strcmp(cmd, "flush") || !strcmp(cmd, "leg-replace") ||
			       (json_object_object_get_ex(resp, "flushing", &f) && json_object_get_boolean(f));
		rc = show(resp, json);
		json_object_put(resp);
		if (rc || !running)
			return rc;
		struct json_object *preq = json_object_new_object();
		const char *what = "flushing", *done = "flush complete: no dirty data left";
		char what_buf[128], done_buf[160];
		if (!strcmp(cmd, "flush")) {
			json_object_object_add(preq, "cmd", json_object_new_string("flush-progress"));
		} else if (!strcmp(cmd, "leg-replace")) {
			json_object_object_add(preq, "cmd", json_object_new_string("leg-progress"));
			json_object_object_add(preq, "set", json_object_new_string(args[1]));
			json_object_object_add(preq, "leg", json_object_new_string(args[3]));
			snprintf(what_buf, sizeof(what_buf), "resyncing %s", args[3]);
			snprintf(done_buf, sizeof(done_buf), "resync complete: leg %s is healthy", args[3]);
			what = what_buf;
			done = done_buf;
		} else { /* mode, detach: the LUN's destage */
			json_object_object_add(preq, "cmd", json_object_new_string("mode-progress"));
			json_object_object_add(preq, "lun", json_object_new_string(args[0]));
			snprintf(what_buf, sizeof(what_buf), "destaging %s", args[0]);
			snprintf(done_buf, sizeof(done_buf), "LUN %s: no dirty data left", args[0]);
			what = what_buf;
			done = done_buf;
		}
		rc = follow_progress(path, preq, json, what, done);
		json_object_put(preq);
		return rc;
	}
	do {
		struct json_object *resp = call(path, req, &rc);
		if (!resp)
			return rc;
		if (watch && !json)
			printf("\033[H\033[J");
		rc = show(resp, json);
		json_object_put(resp);
		fflush(stdout);
		if (watch)
			sleep((unsigned)interval);
	} while (watch && rc == 0);
	json_object_put(req);
	return rc;
}
