# tiercache - GNU Makefile
#
#   make            build build/tiercached and build/tierctl
#   make run        install deps if missing, build, start the quickstart daemon
#   make check      every test (unit, integration over loopback, conformance, fuzz,
#                   and the ASan + UBSan build of make asan)
#   make check-long longer soaks (each fuzzer max(20 min, 1M executions))
#   make bench      benchmarks (print numbers, assert nothing about speed)
#   make conformance  libiscsi's suite against tiercached and tgtd
#   make deps       install the Debian packages the build and tests need
#   make check-system  LIO + TCMU + NVMe + targetcli, faults on a guest NVMe leg, and power cuts
#                   replayed from a guest's write log, on Debian's kernel under qemu (10-15 minutes);
#                   and the kernel's iSCSI initiator (open-iscsi, dm-multipath) on our portal:
#                   discard, fsck, reservations, kill -9 under fio, path loss, CHAP (about 5 more);
#                   and the Debian package (debian/) built, installed, upgraded, purged in a chroot
#   make install    binaries, systemd unit, example config, man pages
#                   (PREFIX=/usr/local, DESTDIR= for staging)
#   make clean
#
# CC=clang works too; both must build warning-free.

CC ?= cc
BUILD ?= build
PKGS := liburing liburcu liburcu-cds libisal libcrypto inih json-c libsystemd libnvme libmicrohttpd

PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS := $(shell pkg-config --libs $(PKGS) 2>/dev/null)

OPT ?= -O2
CFLAGS ?= $(OPT) -g
# everything but the optimisation and debug flags, shared with make asan
BASE_CFLAGS := -std=gnu11 -Wall -Wextra -Werror -Wno-unused-parameter \
	  -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
	  -D_GNU_SOURCE -I. $(PKG_CFLAGS) -MMD -MP
# what every compile gets: the required flags, then the user's (make
# CFLAGS=-O0 replaces only the optimisation and debug flags, never these;
# tests/test_layering.sh checks)
TC_CFLAGS = $(BASE_CFLAGS) $(CFLAGS)
# libtcmu2 ships only libtcmu.so.2 (no -dev symlink, no header): link it by
# name, and GLib (its dependency) for the main loop its D-Bus registration needs.
LDLIBS += $(PKG_LIBS) -l:libtcmu.so.2 -l:libglib-2.0.so.0 -lpthread -lm
# librbd / librados (the RBD capacity tier, bdev/rbd*.c): Debian's
# librbd-dev ships no .pc file, so fall back to the plain library names.
RBD_LIBS := $(shell pkg-config --libs librbd librados 2>/dev/null || echo -lrbd -lrados)
LDLIBS += $(RBD_LIBS)

# Every .c under these folders is part of the engine library; the programs
# add their own main.
LIB_DIRS := common config bdev backstore cache target/iscsi target/tcmu
LIB_SRCS := $(foreach d,$(LIB_DIRS),$(wildcard $(d)/*.c))
LIB_OBJS := $(LIB_SRCS:%.c=$(BUILD)/obj/%.o)

DAEMON_SRCS := $(wildcard daemon/*.c)
DAEMON_OBJS := $(DAEMON_SRCS:%.c=$(BUILD)/obj/%.o)

UNIT_SRCS := $(wildcard tests/unit/test_*.c)
UNIT_BINS := $(UNIT_SRCS:tests/unit/%.c=$(BUILD)/tests/%)

BENCH_SRCS := $(wildcard tests/bench/bench_*.c)
BENCH_BINS := $(BENCH_SRCS:tests/bench/%.c=$(BUILD)/bench/%)
# helpers a benchmark script runs with its own arguments (not run by make bench)
BENCH_TOOLS := $(BUILD)/bench/leg_floor

FUZZ_SRCS := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BINS := $(FUZZ_SRCS:tests/fuzz/%.c=$(BUILD)/fuzz/%)

PROGS := $(BUILD)/tiercached $(BUILD)/tierctl $(BUILD)/tierbench

.PHONY: all deps run check check-long conformance bench bench-device fuzz tsan asan unit clean install check-system
all: $(PROGS) $(UNIT_BINS) $(BENCH_BINS) $(BENCH_TOOLS)

deps:
	@sh tools/deps.sh

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(TC_CFLAGS) -c $< -o $@

$(BUILD)/libtiercache.a: $(LIB_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@
	ar rcs $@ $^

$(BUILD)/tiercached: $(DAEMON_OBJS) $(BUILD)/libtiercache.a
	$(CC) $(TC_CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tierctl: $(BUILD)/obj/tools/tierctl.o $(BUILD)/obj/tools/tierctl_top.o $(BUILD)/libtiercache.a
	$(CC) $(TC_CFLAGS) -o $@ $^ $(LDLIBS)

# tierbench is the only program that links libiscsi (an initiator).
ISCSI_CFLAGS := $(shell pkg-config --cflags libiscsi 2>/dev/null)
ISCSI_LIBS := $(shell pkg-config --libs libiscsi 2>/dev/null)
JSONC_LIBS := $(shell pkg-config --libs json-c 2>/dev/null)
TIERBENCH_OBJS := $(patsubst %.c,$(BUILD)/obj/%.o,$(wildcard tools/tierbench*.c))
$(TIERBENCH_OBJS): TC_CFLAGS += $(ISCSI_CFLAGS)
$(BUILD)/tierbench: $(TIERBENCH_OBJS)
	$(CC) $(TC_CFLAGS) -o $@ $^ $(ISCSI_LIBS) $(JSONC_LIBS) -lm

$(BUILD)/tests/%: tests/unit/%.c $(BUILD)/libtiercache.a
	@mkdir -p $(dir $@)
	$(CC) $(TC_CFLAGS) -o $@ $< $(BUILD)/libtiercache.a $(LDLIBS)

# test_cache_{drop,submit}_nomem and test_worker_post_nomem refuse chosen
# allocations of the library itself
$(BUILD)/tests/test_cache_drop_nomem $(BUILD)/asan/tests/test_cache_drop_nomem: LDLIBS += -Wl,--wrap=calloc
$(BUILD)/tests/test_cache_submit_nomem $(BUILD)/asan/tests/test_cache_submit_nomem: LDLIBS += -Wl,--wrap=malloc
$(BUILD)/tests/test_worker_post_nomem $(BUILD)/asan/tests/test_worker_post_nomem: LDLIBS += -Wl,--wrap=malloc

$(BUILD)/bench/%: tests/bench/%.c $(BUILD)/libtiercache.a
	@mkdir -p $(dir $@)
	$(CC) $(TC_CFLAGS) -o $@ $< $(BUILD)/libtiercache.a $(LDLIBS) -lm

# Benchmarks print numbers and ratios against a peer measured in the same
# run; they assert nothing about speed.
bench: all
	@for b in $(BENCH_BINS); do echo "== $$b"; $$b || exit 1; done
	@bash tests/bench/compare.sh
	@bash tests/bench/torn_guard.sh
	@bash tests/bench/caw_heartbeat.sh
	@bash tests/bench/flush_foreground.sh
	@bash tests/bench/callgrind_cmd.sh
	@bash tests/bench/scale_luns.sh
	@bash tests/bench/device.sh

# The cache path against fio on the same leg files (issue 13's table).
bench-device: all
	@bash tests/bench/device.sh

# Debug builds (the fuzz harnesses and make asan) define TC_DEBUG: checks
# too costly or too fatal for the daemon one runs, e.g. that every SCSI
# command completes exactly once (backstore/lu.h), abort() when they fail.
DEBUG_CFLAGS := -DTC_DEBUG

# libFuzzer harnesses: clang, ASan + UBSan, linked against the library
# sources compiled again with the same instrumentation, once for all of
# them (each harness compiling the whole library took a few of make
# check's 30 minutes).
FUZZ_CFLAGS_BASE := -std=gnu11 -g -O1 -D_GNU_SOURCE -I. $(PKG_CFLAGS) \
	-fno-sanitize-recover=undefined -DTC_FUZZ $(DEBUG_CFLAGS)
FUZZ_CFLAGS := $(FUZZ_CFLAGS_BASE) -fsanitize=fuzzer,address,undefined
FUZZ_OBJ_DIR := $(BUILD)/fuzzobj
FUZZ_LIB_OBJS := $(LIB_SRCS:%.c=$(FUZZ_OBJ_DIR)/%.o)
$(FUZZ_OBJ_DIR)/%.o: %.c
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS_BASE) -fsanitize=fuzzer-no-link,address,undefined -MMD -MP -c $< -o $@
$(FUZZ_OBJ_DIR)/libtiercache.a: $(FUZZ_LIB_OBJS)
	rm -f $@
	ar rcs $@ $^
$(BUILD)/fuzz/%: tests/fuzz/%.c $(FUZZ_OBJ_DIR)/libtiercache.a
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -o $@ $< $(FUZZ_OBJ_DIR)/libtiercache.a $(LDLIBS)

fuzz: $(FUZZ_BINS)

# ThreadSanitizer builds of the lock-free map and policy tests: the file
# under test instrumented, the rest of the library from libtiercache.a.
# tests/unit/tsan.supp says why liburcu's deferred frees are suppressed.
TSAN_BINS := $(BUILD)/tests/tsan/test_cache_map $(BUILD)/tests/tsan/test_policy $(BUILD)/tests/tsan/test_advisor
TSAN_CFLAGS := -std=gnu11 -O1 -g -fsanitize=thread -D_GNU_SOURCE -DTC_TSAN -I. $(PKG_CFLAGS)
$(BUILD)/tests/tsan/test_cache_map: tests/unit/test_cache_map.c cache/map.c $(BUILD)/libtiercache.a
$(BUILD)/tests/tsan/test_policy: tests/unit/test_policy.c cache/policy.c $(BUILD)/libtiercache.a
$(BUILD)/tests/tsan/test_advisor: tests/unit/test_advisor.c cache/advisor.c cache/policy.c $(BUILD)/libtiercache.a
$(TSAN_BINS):
	@mkdir -p $(dir $@)
	$(CC) $(TSAN_CFLAGS) -o $@ $(filter %.c,$^) $(BUILD)/libtiercache.a $(LDLIBS)

tsan: $(TSAN_BINS)

# AddressSanitizer + UndefinedBehaviorSanitizer builds of the daemon and of
# every unit test, in $(BUILD)/asan/: the library sources compiled again with
# the instrumentation and TC_DEBUG (as for fuzz), with $(CC) (gcc or clang).
# tests/run.sh runs them as asan/NAME, the daemon under the shell tests in its
# ASAN_SHELL list; tests/unit/lsan.supp says why each leak suppression is there.
ASAN_DIR := $(BUILD)/asan
ASAN_CFLAGS := -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined \
	-fno-omit-frame-pointer $(DEBUG_CFLAGS) $(BASE_CFLAGS)
ASAN_LIB_OBJS := $(LIB_SRCS:%.c=$(ASAN_DIR)/obj/%.o)
ASAN_DAEMON_OBJS := $(DAEMON_SRCS:%.c=$(ASAN_DIR)/obj/%.o)
ASAN_UNIT_BINS := $(UNIT_SRCS:tests/unit/%.c=$(ASAN_DIR)/tests/%)

$(ASAN_DIR)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(ASAN_CFLAGS) -c $< -o $@

$(ASAN_DIR)/libtiercache.a: $(ASAN_LIB_OBJS)
	rm -f $@
	ar rcs $@ $^

$(ASAN_DIR)/tiercached: $(ASAN_DAEMON_OBJS) $(ASAN_DIR)/libtiercache.a
	$(CC) $(ASAN_CFLAGS) -o $@ $^ $(LDLIBS)

$(ASAN_DIR)/tests/%: tests/unit/%.c $(ASAN_DIR)/libtiercache.a
	@mkdir -p $(dir $@)
	$(CC) $(ASAN_CFLAGS) -o $@ $< $(ASAN_DIR)/libtiercache.a $(LDLIBS)

asan: $(ASAN_DIR)/tiercached $(ASAN_UNIT_BINS)

run: deps
	@$(MAKE) --no-print-directory all
	@mkdir -p var/quickstart/state
	./$(BUILD)/tiercached -c config/examples/quickstart.conf

unit: $(UNIT_BINS)

# The builds check needs use every core unless make was given -j already
# (its jobserver then shares them): a serial build took about 5 of make
# check's 30 minutes on 2 cores.
CHECK_JOBS = $(if $(findstring jobserver,$(MAKEFLAGS)),,-j$(shell nproc))

check: deps
	@$(MAKE) --no-print-directory $(CHECK_JOBS) all fuzz tsan asan
	@tests/run.sh

check-long: deps
	@$(MAKE) --no-print-directory $(CHECK_JOBS) all fuzz tsan asan
	@TC_LONG=1 tests/run.sh

# The libiscsi conformance suite against tiercached (plain, write-back and
# write-through LUNs) and tgtd, skip counts printed.
conformance: deps
	@$(MAKE) --no-print-directory all
	@TC_KEEP= bash tests/test_conformance_libiscsi.sh

# The real kernel: LIO + target_core_user + iscsi_target_mod + two QEMU NVMe
# drives, tiercached inside, initiators on the host (tests/system/): once with
# configfs written directly, once through targetcli + D-Bus + tcmu-runner in a
# debootstrap'ed guest. The kernel initiator's guest also takes an RBD image
# from two gateways on the host's loopback Ceph cluster (ALUA multipath, the
# owner killed under fio). The first run installs qemu-system-x86 and debootstrap,
# fetches Debian's kernel package and builds the guest root (about 2 minutes).
# Last, the Debian package: built from the committed tree, lintian-checked,
# installed, upgraded and purged in a fresh debootstrap'ed root, then upgraded
# over a running daemon with dirty data in a guest booted with systemd.
check-system: deps
	@$(MAKE) --no-print-directory $(BUILD)/tiercached $(BUILD)/tierctl $(BUILD)/tierbench
	@BUILD=$(BUILD) bash tests/system/run-vm-tcmu.sh
	@BUILD=$(BUILD) bash tests/system/run-vm-targetcli.sh
	@BUILD=$(BUILD) bash tests/system/run-vm-legfaults.sh
	@BUILD=$(BUILD) bash tests/system/run-vm-powercut.sh
	@BUILD=$(BUILD) bash tests/system/run-vm-initiator.sh
	@bash tests/system/run-pkg.sh

# Install layout (GNU-style variables). The unit names /usr/sbin; with
# another PREFIX the installed copy is rewritten to point at SBINDIR.
PREFIX ?= /usr/local
SBINDIR ?= $(PREFIX)/sbin
MANDIR ?= $(PREFIX)/share/man
DOCDIR ?= $(PREFIX)/share/doc/tiercache
UNITDIR ?= $(PREFIX)/lib/systemd/system
SYSCONFDIR ?= /etc
install: $(BUILD)/tiercached $(BUILD)/tierctl
	install -d $(DESTDIR)$(SBINDIR) $(DESTDIR)$(UNITDIR) $(DESTDIR)$(MANDIR)/man5 \
		$(DESTDIR)$(MANDIR)/man8 $(DESTDIR)$(DOCDIR)/examples $(DESTDIR)$(SYSCONFDIR)/tiercache
	install -m 0755 $(BUILD)/tiercached $(BUILD)/tierctl $(DESTDIR)$(SBINDIR)/
	sed -e 's#/usr/sbin/#$(SBINDIR)/#g' -e 's#/etc/tiercache/#$(SYSCONFDIR)/tiercache/#g' \
		systemd/tiercached.service > $(DESTDIR)$(UNITDIR)/tiercached.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/tiercached.service
	install -m 0644 man/tiercached.8 man/tierctl.8 $(DESTDIR)$(MANDIR)/man8/
	install -m 0644 man/tiercached.conf.5 $(DESTDIR)$(MANDIR)/man5/
	install -m 0644 config/examples/tiercached.conf config/examples/quickstart.conf $(DESTDIR)$(DOCDIR)/examples/
	@# never overwrite an admin's configuration
	test -e $(DESTDIR)$(SYSCONFDIR)/tiercache/tiercached.conf || \
		install -m 0640 config/examples/tiercached.conf $(DESTDIR)$(SYSCONFDIR)/tiercache/tiercached.conf

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD)/obj $(BUILD)/asan/obj $(FUZZ_OBJ_DIR) -name '*.d' 2>/dev/null)
