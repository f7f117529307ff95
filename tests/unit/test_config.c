/*
 * test_config.c - the config parser accepts what the docs show and refuses
 * every bad file with "NAME:LINE:" and a sentence naming the fix.
 */
#include "tests/unit/check.h"
#include "cache/cache.h"
#include "config/config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


static const char *good =
	"; comment\n"
	"[daemon]\n"
	"state_dir = /tmp/tc-state\n"
	"workers = 2\n"
	"\n"
	"[portal]\n"
	"listen = 127.0.0.1:3260          ; inline comment\n"
	"listen = [::1]:3261\n"
	"\n"
	"[target iqn.2026-11.io.tiercache:quickstart]\n"
	"lun0 = quick\n"
	"lun7 = second\n"
	"allow = iqn.1994-05.com.redhat:a iqn.1991-05.com.microsoft:b\n"
	"chap_user = alice\n"
	"chap_secret = 12-to-16-char-s\n"
	"mutual_user = target1\n"
	"mutual_secret = another-secret-1\n"
	"\n"
	"[lun quick]\n"
	"backing = var/quickstart/hdd.img\n"
	"size = 1G\n"
	"block_size = 512\n"
	"serial = auto\n"
	"\n"
	"[lun second]\n"
	"backing = /dev/null-ish\n"
	"size = 1.5G\n"
	"block_size = 4096\n"
	"serial = ABC123\n"
	"write_cache = yes\n";

static void test_good(void)
{
	struct config *cfg = NULL;
	char err[512] = "";
	int r = config_parse_string(good, "good.conf", &cfg, err, sizeof(err));
	CHECK(r == 0, "documented example parses (%s)", err);
	if (r)
		return;
	CHECK(cfg->nlisten == 2 && !strcmp(cfg->listen[0].addr, "127.0.0.1") && cfg->listen[0].port == 3260,
	      "first listen is 127.0.0.1:3260");
	CHECK(!strcmp(cfg->listen[1].addr, "::1") && cfg->listen[1].port == 3261, "IPv6 listen in brackets");
	CHECK(cfg->ntargets == 1 && cfg->targets[0].nluns == 2, "one target with two LUNs");
	CHECK(cfg->targets[0].luns[1].lun == 7 && cfg->targets[0].luns[1].lu == &cfg->luns[1],
	      "lun7 resolves to [lun second]");
	CHECK(cfg->targets[0].nallow == 2 && !strcmp(cfg->targets[0].allow[1], "iqn.1991-05.com.microsoft:b"),
	      "allow list split on spaces");
	CHECK(cfg->luns[0].size == (1ULL << 30) && cfg->luns[0].block_size == 512, "1G / 512");
	CHECK(cfg->luns[1].size == 3ULL << 29 && cfg->luns[1].block_size == 4096 && cfg->luns[1].write_cache,
	      "1.5G / 4096 / write_cache");
	CHECK(!strcmp(cfg->luns[0].serial, "auto") && !strcmp(cfg->luns[1].serial, "ABC123"), "serials");
	CHECK(cfg->workers == 2 && !strcmp(cfg->state_dir, "/tmp/tc-state"), "daemon section");
	config_free(cfg);
}

struct bad_case {
	const char *text;
	const char *want; /* substring of the message, starting with name:line */
};

static const struct bad_case bad[] = {
	{ "[portal]\nlisten = 127.0.0.1:99999\n", "bad.conf:2: listen = 127.0.0.1:99999: the port" },
	{ "[portal]\nlisten = ::1:3260\n", "bad.conf:2: listen = ::1:3260: write an IPv6 address in brackets" },
	{ "[portal]\nbogus = 1\n", "bad.conf:2: [portal] has no key \"bogus\"" },
	{ "[frobnicate]\nx = 1\n", "bad.conf:1: unknown section [frobnicate]" },
	{ "[target IQN.bad]\nlun0 = a\n", "is not a valid iSCSI name" },
	{ "[target iqn.2026-11.io.t:x]\nlun0 = missing\n", "bad.conf:2: lun0 = missing: there is no [lun missing] section" },
	{ "[lun a]\nbacking = /x\nsize = lots\n", "bad.conf:3: [lun a] size = lots" },
	{ "[lun a]\nbacking = /x\nblock_size = 1024\n", "bad.conf:3: [lun a] block_size = 1024: use 512 or 4096" },
	{ "[lun a]\nsize = 1G\n", "[lun a] has no backing" },
	{ "[lun a]\nbacking = /x\n[lun a]\nbacking = /y\n", "[lun a] is defined twice" },
	{ "[lun a]\nbacking = /x\n[lun b]\nbacking = /x\n", "uses backing /x, which [lun a]" },
	{ "[target iqn.2026-11.io.t:x]\nchap_user = u\nchap_secret = short\n", "bad.conf:3: chap_secret is 5 characters long" },
	{ "[target iqn.2026-11.io.t:x]\nchap_user = u\n", "sets chap_user without chap_secret" },
	{ "[target iqn.2026-11.io.t:x]\nmutual_user = u\nmutual_secret = 0123456789abc\n",
	  "mutual CHAP without one-way CHAP" },
	{ "[portal]\ndiscovery_chap_user = d\ndiscovery_chap_secret = short\n",
	  "bad.conf:3: discovery_chap_secret is 5 characters long" },
	{ "[portal]\ndiscovery_chap_user = d\n", "bad.conf:2: [portal] sets discovery_chap_user without discovery_chap_secret" },
	{ "[portal]\ndiscovery_mutual_user = m\ndiscovery_mutual_secret = 0123456789abc\n",
	  "[portal] sets mutual CHAP without one-way CHAP; add discovery_chap_user" },
	{ "[portal]\ndiscovery_chap_user = d\ndiscovery_chap_secret = 0123456789abc\ndiscovery_mutual_user = m\n"
	  "discovery_mutual_secret = 0123456789abc\n", "discovery_mutual_secret equals discovery_chap_secret" },
	{ "[portal]\ndiscovery_user = d\n", "[portal] has no key \"discovery_user\"" },
	{ "[target iqn.2026-11.io.t:x]\nlun0 = a\nlun0 = a\n[lun a]\nbacking = /x\n", "bad.conf:3: lun0 is mapped twice" },
	{ "[target iqn.2026-11.io.t:x]\nallow = notaname\n", "bad.conf:2: allow: \"notaname\" is not a valid" },
	{ "[lun a]\nbacking = /x\nsize = 1000\nblock_size = 512\n", "is not a multiple of block_size 512" },
	{ "[daemon]\nworkers = many\n", "bad.conf:2: [daemon] workers = many" },
	{ "[lun a]\nbacking = /x\nserial = has space\n", "bad.conf:3: [lun a] serial = has space" },
	{ "[lun a]\nthis line is not a key value\n", "bad.conf:2: cannot parse this line" },
	{ "x = 1\n", "bad.conf:1: \"x\" appears before any section" },
	{ "[cache c]\nsize = 1G\n", "bad.conf:1: [cache c] has no legs" },
	{ "[cache c]\nlegs = /a\n", "bad.conf:1: [cache c] has one leg" },
	{ "[cache c]\nlegs = /a /b /c\n", "bad.conf:2: [cache c] legs lists more than two" },
	{ "[cache c]\nlegs = /a /a\n", "bad.conf:2: [cache c] legs lists /a twice" },
	{ "[cache c]\nlegs = /a /b\nextent = 100K\n", "bad.conf:3: [cache c] extent = 100K: use a power of two" },
	{ "[cache c]\nlegs = /a /b\nextent = 8M\n", "bad.conf:3: [cache c] extent = 8M" },
	{ "[cache c]\nlegs = /a /b\nmode = write-sometimes\n", "bad.conf:3: [cache c] mode = write-sometimes: use write-back" },
	{ "[cache c]\nlegs = /a /b\nadmit_hits = 0\n", "bad.conf:3: [cache c] admit_hits = 0" },
	{ "[cache c]\nlegs = /a /b\nspeed = fast\n", "bad.conf:3: [cache c] has no key \"speed\"" },
	{ "[cache c]\nlegs = /a /b\nleg_timeout = 5m\n", "bad.conf:3: [cache c] leg_timeout = 5m: give the seconds" },
	{ "[cache c]\nlegs = /a /b\nleg_timeout = 3601\n", "bad.conf:3: [cache c] leg_timeout = 3601" },
	{ "[cache c]\nlegs = /a /b\nmax_read_errors = many\n", "bad.conf:3: [cache c] max_read_errors = many: give how many" },
	{ "[cache c]\nlegs = /a /b\nmax_read_errors = 1000001\n", "bad.conf:3: [cache c] max_read_errors = 1000001" },
	{ "[cache c]\nlegs = /a /b\n[cache c]\nlegs = /d /e\n", "bad.conf:3: [cache c] is defined twice" },
	{ "[lun a]\nbacking = /x\ncache = nope\n", "bad.conf:3: [lun a] cache = nope: there is no [cache nope]" },
	{ "[lun a]\nbacking = /x\n[cache c]\nlegs = /x /y\n", "bad.conf:3: [cache c] leg /x is the backing store of [lun a]" },
	{ "[cache c]\nlegs = /a /b\n[cache d]\nlegs = /b /e\n", "bad.conf:3: [cache d] leg /b is also a leg of [cache c]" },
	/* RBD backing stores */
	{ "[lun a]\nbacking = rbd:poolonly\n", "bad.conf:1: [lun a] backing = rbd:poolonly: write an RBD image as rbd:POOL/IMAGE" },
	{ "[lun a]\nbacking = rbd:/img\n", "bad.conf:1: [lun a] backing = rbd:/img: write an RBD image" },
	{ "[lun a]\nbacking = rbd:p/\n", "bad.conf:1: [lun a] backing = rbd:p/: write an RBD image" },
	{ "[lun a]\nbacking = rbd:p/ns/img\n", "bad.conf:1: [lun a] backing = rbd:p/ns/img: write an RBD image" },
	{ "[lun a]\nbacking = rbd:p/img@snap\n", "bad.conf:1: [lun a] backing = rbd:p/img@snap: write an RBD image" },
	{ "[lun a]\nbacking = /x\nceph_conf = /etc/ceph/ceph.conf\n",
	  "bad.conf:3: [lun a] ceph_conf, ceph_user and ceph_timeout are for backing = rbd:POOL/IMAGE" },
	{ "[lun a]\nbacking = /x\nsize = 1G\nceph_timeout = 5\n", "bad.conf:4: [lun a] ceph_conf, ceph_user and ceph_timeout" },
	{ "[lun a]\nbacking = rbd:p/i\nceph_timeout = 0\n", "bad.conf:3: [lun a] ceph_timeout = 0: give seconds, 1 to 3600" },
	{ "[lun a]\nbacking = rbd:p/i\nceph_timeout = soon\n", "bad.conf:3: [lun a] ceph_timeout = soon" },
	{ "[lun a]\nbacking = rbd:p/i\nceph_user = client.\n", "bad.conf:3: [lun a] ceph_user = client.: give a cephx user name" },
	{ "[lun a]\nbacking = rbd:p/i\nceph_conf = \n", "bad.conf:3: [lun a] ceph_conf = : give the path of a ceph.conf" },
	{ "[lun a]\nbacking = rbd:p/i\n[lun b]\nbacking = rbd:p/i\n", "uses backing rbd:p/i, which [lun a]" },
	{ "[lun a]\nbacking = /x\nsize = 1G\nbacking_io = cached\n",
	  "bad.conf:4: [lun a] backing_io = cached: use direct (O_DIRECT, the default) or buffered" },
	{ "[lun a]\nbacking = rbd:p/i\nbacking_io = buffered\n",
	  "bad.conf:3: [lun a] backing_io = buffered is for a file or block device without a cache set: librbd" },
	{ "[cache c]\nlegs = /l0 /l1\n[lun a]\nbacking = /x\nsize = 1G\nbacking_io = buffered\ncache = c\n",
	  "bad.conf:6: [lun a] backing_io = buffered is for a file or block device without a cache set: the cache set" },
};

static void test_bad(void)
{
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct config *cfg = NULL;
		char err[512] = "";
		int r = config_parse_string(bad[i].text, "bad.conf", &cfg, err, sizeof(err));
		CHECK(r < 0 && strstr(err, bad[i].want), "refused with \"%s\" (got \"%s\")", bad[i].want, err);
		if (!r)
			config_free(cfg);
	}
}

/* inih cuts section names at 50 characters; IQNs may be 223 long. */
static void test_long_names_and_lines(void)
{
	const char *iqn = "iqn.2026-11.io.tiercache:a-rather-long-target-name-for-the-finance-cluster-vm-store-01";
	char text[1024];
	struct config *cfg = NULL;
	char err[512] = "";
	snprintf(text, sizeof(text), "[target %s]\nlun0 = a\n[lun a]\nbacking = /x\n", iqn);
	int r = config_parse_string(text, "long.conf", &cfg, err, sizeof(err));
	CHECK(r == 0 && !strcmp(cfg->targets[0].iqn, iqn), "a %zu-character IQN is kept whole (%s)", strlen(iqn), err);
	if (!r)
		config_free(cfg);
	char line[600];
	memset(line, 'x', sizeof(line));
	line[sizeof(line) - 1] = '\0';
	snprintf(text, sizeof(text), "[lun a]\nbacking = /%s\n", line);
	r = config_parse_string(text, "long.conf", &cfg, err, sizeof(err));
	CHECK(r < 0 && strstr(err, "long.conf:2: this line is longer than"), "an overlong line is refused, not split (%s)", err);
	if (!r)
		config_free(cfg);
}

static void test_secret_never_echoed(void)
{
	struct config *cfg = NULL;
	char err[512] = "";
	config_parse_string("[target iqn.2026-11.io.t:x]\nchap_user = u\nchap_secret = sup3rs3cr3t!!too-long-x\n",
			    "s.conf", &cfg, err, sizeof(err));
	CHECK(!strstr(err, "sup3rs3cr3t"), "a rejected secret is not echoed in the message (%s)", err);
}

static void test_sizes(void)
{
	uint64_t v;
	CHECK(config_parse_size("4096", &v) == 0 && v == 4096, "plain bytes");
	CHECK(config_parse_size("256K", &v) == 0 && v == 262144, "256K");
	CHECK(config_parse_size("2GiB", &v) == 0 && v == 2ULL << 30, "2GiB");
	CHECK(config_parse_size("1T", &v) == 0 && v == 1ULL << 40, "1T");
	CHECK(config_parse_size("1.5X", &v) < 0, "unknown suffix refused");
	CHECK(config_parse_size("-1G", &v) < 0, "negative refused");
	CHECK(config_parse_size("0.3", &v) < 0, "fractional bytes refused");
}

static void test_cache_sections(void)
{
	struct config *cfg = NULL;
	char err[512] = "";
	const char *text =
		"[cache fast]\n"
		"legs = var/a.img var/b.img\n"
		"size = 256M\n"
		"extent = 1M\n"
		"mode = write-through\n"
		"admit_hits = 3\n"
		"seq_cutoff = 0\n"
		"leg_timeout = 3s\n"
		"max_read_errors = 0\n"
		"[cache one]\n"
		"legs = var/c.img\n"
		"allow_single_leg = yes\n"
		"[lun a]\nbacking = /x\ncache = fast\n"
		"[lun b]\nbacking = /y\ncache = fast\n"
		"[lun c]\nbacking = /z\n";
	int r = config_parse_string(text, "cache.conf", &cfg, err, sizeof(err));
	CHECK(r == 0, "cache sections parse (%s)", err);
	if (r)
		return;
	struct cfg_cache *f = config_find_cache(cfg, "fast");
	CHECK(cfg->ncaches == 2 && f && f->nlegs == 2 && !strcmp(f->legs[1], "var/b.img"), "two sets, two legs");
	CHECK(f->size == 256u << 20 && f->extent == 1u << 20 && f->admit_hits == 3 && f->seq_cutoff == 0,
	      "size, extent, admit_hits, seq_cutoff");
	CHECK(f->mode == CACHE_WRITE_THROUGH, "mode = write-through");
	CHECK(f->leg_timeout == 3, "leg_timeout = 3s (got %u)", f->leg_timeout);
	CHECK(f->max_read_errors == 0, "max_read_errors = 0 (no limit)");
	struct cfg_cache *o = config_find_cache(cfg, "one");
	CHECK(o && o->nlegs == 1 && o->allow_single_leg && o->extent == 256u << 10 && o->mode == CACHE_WRITE_BACK &&
	      o->seq_cutoff == 4u << 20 && o->leg_timeout == 10 && o->max_read_errors == 50,
	      "defaults: 256K extents, write-back, 4M sequential cutoff, leg_timeout 10 s, max_read_errors 50");
	CHECK(cfg->luns[0].cache_set == f && cfg->luns[1].cache_set == f && !cfg->luns[2].cache_set,
	      "two LUNs share one set, the third is uncached");
	config_free(cfg);
}

static void test_backing_io(void)
{
	struct config *cfg = NULL;
	char err[512] = "";
	const char *text = "[lun b]\nbacking = /b\nsize = 1G\nbacking_io = buffered\n"
			   "[lun d]\nbacking = /d\nsize = 1G\nbacking_io = direct\n"
			   "[lun n]\nbacking = /n\nsize = 1G\n";
	int r = config_parse_string(text, "io.conf", &cfg, err, sizeof(err));
	CHECK(r == 0, "backing_io parses (%s)", err);
	if (r)
		return;
	CHECK(config_find_lun(cfg, "b")->backing_buffered && !config_find_lun(cfg, "d")->backing_buffered &&
	      !config_find_lun(cfg, "n")->backing_buffered, "backing_io: buffered, direct, and direct by default");
	config_free(cfg);
}

/* NOP-In pings: every 30 s by default, off with nop_interval = 0 alone (the man page's "0 = never") */
static void test_nop(void)
{
	static const struct {
		const char *text;
		unsigned interval, timeout;
	} cases[] = {
		{ "[daemon]\nworkers = 1\n", 30, 30 },
		{ "[daemon]\nnop_interval = 0\n", 0, 30 },
		{ "[daemon]\nnop_interval = 0\nnop_timeout = 0\n", 0, 30 },
		{ "[daemon]\nnop_interval = 5\n", 5, 30 },
		{ "[daemon]\nnop_timeout = 7\n", 30, 7 },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct config *cfg = NULL;
		char err[512] = "";
		int r = config_parse_string(cases[i].text, "nop.conf", &cfg, err, sizeof(err));
		CHECK(r == 0, "nop case %zu parses (%s)", i, err);
		if (r)
			continue;
		CHECK(cfg->nop_interval == cases[i].interval && cfg->nop_timeout == cases[i].timeout,
		      "nop case %zu: interval %u timeout %u, expected %u %u", i, cfg->nop_interval, cfg->nop_timeout,
		      cases[i].interval, cases[i].timeout);
		config_free(cfg);
	}
}

static void test_space_warn(void)
{
	static const struct {
		const char *val;
		int want; /* -1: refused */
	} cases[] = {
		{ "90%", 90 }, { "90", 90 }, { "1%", 1 }, { "99%", 99 }, { "off", 0 },
		{ "0", -1 },   { "100%", -1 }, { "%", -1 }, { "", -1 }, { "90%%", -1 }, { "-5%", -1 },
	};
	static const struct {
		const char *val;
		int want;
	} tcases[] = { { "30", 30 }, { "5s", 5 }, { "off", 0 }, { "0", -1 }, { "3601", -1 }, { "s", -1 }, { "5m", -1 } };
	for (size_t i = 0; i < sizeof(tcases) / sizeof(tcases[0]); i++) {
		char text[256];
		snprintf(text, sizeof(text), "[target iqn.2026-11.test:t]\nlun0 = d\n[lun d]\nbacking = /tmp/x.img\n"
			 "size = 1M\nio_timeout = %s\n", tcases[i].val);
		struct config *cfg = NULL;
		char err[512] = "";
		int r = config_parse_string(text, "t.conf", &cfg, err, sizeof(err));
		if (tcases[i].want < 0)
			CHECK(r != 0 && strstr(err, "io_timeout"), "io_timeout = %s refused (%s)", tcases[i].val, err);
		else
			CHECK(r == 0 && cfg->luns[0].io_timeout == (unsigned)tcases[i].want, "io_timeout = %s parses to %d (%s)",
			      tcases[i].val, tcases[i].want, err);
		config_free(cfg);
	}
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char text[256];
		snprintf(text, sizeof(text),
			 "[daemon]\nspace_interval = 2\n[target iqn.2026-11.test:t]\nlun0 = d\n"
			 "[lun d]\nbacking = /tmp/x.img\nsize = 1M\nspace_warn = %s\n",
			 cases[i].val);
		struct config *cfg = NULL;
		char err[512] = "";
		int r = config_parse_string(text, "space.conf", &cfg, err, sizeof(err));
		if (cases[i].want < 0) {
			CHECK(r != 0 && strstr(err, "space_warn"), "space_warn = %s refused (%s)", cases[i].val, err);
		} else {
			CHECK(r == 0 && cfg->luns[0].space_warn == (unsigned)cases[i].want && cfg->space_interval == 2,
			      "space_warn = %s parses to %d (%s)", cases[i].val, cases[i].want, err);
		}
		config_free(cfg);
	}
	struct config *cfg = NULL;
	char err[512] = "";
	CHECK(config_parse_string("[daemon]\nworkers = 1\n", "d.conf", &cfg, err, sizeof(err)) == 0 &&
		      cfg->space_interval == 10,
	      "space_interval defaults to 10 s");
	config_free(cfg);
}

static void test_poll(void)
{
	static const struct {
		const char *text;
		int ok;
		unsigned us;
	} cases[] = {
		{ "[daemon]\nworkers = 1\n", 1, 0 },
		{ "[daemon]\npoll_us = 0\n", 1, 0 },
		{ "[daemon]\npoll_us = 50\n", 1, 50 },
		{ "[daemon]\npoll_us = 1000\n", 1, 1000 },
		{ "[daemon]\npoll_us = 1001\n", 0, 0 },
		{ "[daemon]\npoll_us = -1\n", 0, 0 },
		{ "[daemon]\npoll_us = 20us\n", 0, 0 },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct config *cfg = NULL;
		char err[512] = "";
		int r = config_parse_string(cases[i].text, "poll.conf", &cfg, err, sizeof(err));
		CHECK((r == 0) == cases[i].ok, "poll case %zu: parse %s (%s)", i, r ? "refused" : "accepted", err);
		if (!cases[i].ok)
			CHECK(strstr(err, "poll_us") != NULL, "poll case %zu: the error names the key: %s", i, err);
		if (r)
			continue;
		CHECK(cfg->poll_us == cases[i].us, "poll case %zu: poll_us %u, expected %u", i, cfg->poll_us, cases[i].us);
		config_free(cfg);
	}
}

static void test_metrics(void)
{
	static const struct {
		const char *text;
		int ok;
		const char *addr;
		unsigned port;
	} cases[] = {
		{ "[daemon]\nworkers = 1\n", 1, NULL, 0 },
		{ "[daemon]\nmetrics = 127.0.0.1:9642\n", 1, "127.0.0.1", 9642 },
		{ "[daemon]\nmetrics = [::1]:9100\n", 1, "::1", 9100 },
		{ "[daemon]\nmetrics = 127.0.0.1\n", 0, NULL, 0 },   /* no port: not the portal's 3260 */
		{ "[daemon]\nmetrics = [::1]\n", 0, NULL, 0 },
		{ "[daemon]\nmetrics = 127.0.0.1:0\n", 0, NULL, 0 },
		{ "[daemon]\nmetrics = 127.0.0.1:70000\n", 0, NULL, 0 },
		{ "[daemon]\nmetrics = 127.0.0.1:9642\nmetrics = 127.0.0.1:9642\n", 0, NULL, 0 },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct config *cfg = NULL;
		char err[512] = "";
		int r = config_parse_string(cases[i].text, "metrics.conf", &cfg, err, sizeof(err));
		CHECK((r == 0) == cases[i].ok, "metrics case %zu: parse %s (%s)", i, r ? "refused" : "accepted", err);
		if (!cases[i].ok)
			CHECK(strstr(err, "metrics") != NULL, "metrics case %zu: the error names the key: %s", i, err);
		if (r)
			continue;
		if (cases[i].addr)
			CHECK(cfg->nmetrics == 1 && !strcmp(cfg->metrics[0].addr, cases[i].addr) &&
				      cfg->metrics[0].port == cases[i].port,
			      "metrics case %zu: %d address(es), %s:%u", i, cfg->nmetrics,
			      cfg->nmetrics ? cfg->metrics[0].addr : "-", cfg->nmetrics ? cfg->metrics[0].port : 0);
		else
			CHECK(cfg->nmetrics == 0, "metrics case %zu: off by default", i);
		config_free(cfg);
	}
}

static void test_destage_caps(void)
{
	static const struct {
		const char *line;
		int ok;
		uint64_t bps;
		uint32_t iops;
	} cases[] = {
		{ "dirty_target = 10", 1, 0, 0 },
		{ "destage_max = 50M", 1, 50u << 20, 0 },
		{ "destage_max = 0", 1, 0, 0 },
		{ "destage_max_iops = 500", 1, 0, 500 },
		{ "destage_max = 1k", 0, 0, 0 },
		{ "destage_max = fast", 0, 0, 0 },
		{ "destage_max_iops = -1", 0, 0, 0 },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char text[256];
		snprintf(text, sizeof(text), "[cache c]\nlegs = /a /b\n%s\n", cases[i].line);
		struct config *cfg = NULL;
		char err[512] = "";
		int r = config_parse_string(text, "caps.conf", &cfg, err, sizeof(err));
		CHECK((r == 0) == cases[i].ok, "caps case %zu (%s): parse %s (%s)", i, cases[i].line,
		      r ? "refused" : "accepted", err);
		if (!cases[i].ok)
			CHECK(strstr(err, "destage_max") != NULL, "caps case %zu: the error names the key: %s", i, err);
		if (r)
			continue;
		CHECK(cfg->ncaches == 1 && cfg->caches[0].destage_max == cases[i].bps &&
			      cfg->caches[0].destage_max_iops == cases[i].iops,
		      "caps case %zu: %llu B/s, %u IOPS", i, (unsigned long long)cfg->caches[0].destage_max,
		      cfg->caches[0].destage_max_iops);
		config_free(cfg);
	}
}

static void test_rbd_lun(void)
{
	struct config *cfg = NULL;
	char err[512] = "";
	const char *text =
		"[lun r]\nbacking = rbd:rbd-pool/vm_disk.1\nceph_conf = /etc/ceph/site.conf\n"
		"ceph_user = client.iscsi\nceph_timeout = 20\nsize = 10G\ncache = fast\n"
		"[lun d]\nbacking = rbd:rbd/other\n"
		"[cache fast]\nlegs = /a /b\nmode = write-through\n";
	int r = config_parse_string(text, "rbd.conf", &cfg, err, sizeof(err));
	CHECK(r == 0, "an RBD LUN parses (%s)", err);
	if (r)
		return;
	struct cfg_lun *l = config_find_lun(cfg, "r");
	CHECK(l && !strcmp(l->backing, "rbd:rbd-pool/vm_disk.1") && !strcmp(l->ceph_conf, "/etc/ceph/site.conf") &&
	      !strcmp(l->ceph_user, "iscsi") && l->ceph_timeout == 20 && l->size == 10ull << 30 && l->cache_set,
	      "rbd keys: conf, user without \"client.\", timeout, size, cache in front");
	struct cfg_lun *d = config_find_lun(cfg, "d");
	CHECK(d && !d->ceph_conf && !d->ceph_user && d->ceph_timeout == 0 && d->size == 0,
	      "defaults: the driver's (/etc/ceph/ceph.conf, admin, 30 s) and the image's size");
	config_free(cfg);
}

int main(void)
{
	test_backing_io();
	test_nop();
	test_space_warn();
	test_poll();
	test_metrics();
	test_destage_caps();
	test_rbd_lun();
	test_good();
	test_cache_sections();
	test_bad();
	test_secret_never_echoed();
	test_long_names_and_lines();
	test_sizes();
	printf("%s\n", check_failures ? "FAILED" : "all passed");
	return check_failures ? 1 : 0;
}
