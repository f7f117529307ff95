# tiercache - GNU Makefile
#
#   make            build build/tiercached and build/tierctl
#   make run        install deps if missing, build, start the quickstart daemon
#   make check      every test (unit, integration over loopback, conformance, fuzz)
#   make check-long longer soaks
#   make bench      benchmarks (print numbers, assert nothing about speed)
#   make conformance  libiscsi's suite against tiercached and tgtd
#   make deps       install the Debian packages the build and tests need
#   make clean
#
# CC=clang works too; both must build warning-free.

CC ?= cc
BUILD ?= build
PKGS := liburing liburcu liburcu-cds libisal libcrypto inih json-c libsystemd

PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS := $(shell pkg-config --libs $(PKGS) 2>/dev/null)

OPT ?= -O2
CFLAGS ?= $(OPT) -g
CFLAGS += -std=gnu11 -Wall -Wextra -Werror -Wno-unused-parameter \
	  -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
	  -D_GNU_SOURCE -I. $(PKG_CFLAGS) -MMD -MP
LDLIBS += $(PKG_LIBS) -lpthread

# Every .c under these folders is part of the engine library; the programs
# add their own main.
LIB_DIRS := common config backstore cache target/iscsi
LIB_SRCS := $(foreach d,$(LIB_DIRS),$(wildcard $(d)/*.c))
LIB_OBJS := $(LIB_SRCS:%.c=$(BUILD)/obj/%.o)

DAEMON_SRCS := $(wildcard daemon/*.c)
DAEMON_OBJS := $(DAEMON_SRCS:%.c=$(BUILD)/obj/%.o)

UNIT_SRCS := $(wildcard tests/unit/test_*.c)
UNIT_BINS := $(UNIT_SRCS:tests/unit/%.c=$(BUILD)/tests/%)

BENCH_SRCS := $(wildcard tests/bench/bench_*.c)
BENCH_BINS := $(BENCH_SRCS:tests/bench/%.c=$(BUILD)/bench/%)

FUZZ_SRCS := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BINS := $(FUZZ_SRCS:tests/fuzz/%.c=$(BUILD)/fuzz/%)

PROGS := $(BUILD)/tiercached $(BUILD)/tierctl

.PHONY: all deps run check check-long conformance bench fuzz unit clean
all: $(PROGS) $(UNIT_BINS) $(BENCH_BINS)

deps:
	@sh tools/deps.sh

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/libtiercache.a: $(LIB_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@
	ar rcs $@ $^

$(BUILD)/tiercached: $(DAEMON_OBJS) $(BUILD)/libtiercache.a
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tierctl: $(BUILD)/obj/tools/tierctl.o $(BUILD)/libtiercache.a
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: tests/unit/%.c $(BUILD)/libtiercache.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libtiercache.a $(LDLIBS)

$(BUILD)/bench/%: tests/bench/%.c $(BUILD)/libtiercache.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libtiercache.a $(LDLIBS) -lm

# Benchmarks print numbers and ratios against a peer measured in the same
# run; they assert nothing about speed.
bench: all
	@for b in $(BENCH_BINS); do echo "== $$b"; $$b || exit 1; done

# libFuzzer harnesses: clang, ASan + UBSan, linked against the library
# sources compiled again with the same instrumentation.
FUZZ_CFLAGS := -std=gnu11 -g -O1 -D_GNU_SOURCE -I. $(PKG_CFLAGS) \
	-fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -DTC_FUZZ
$(BUILD)/fuzz/%: tests/fuzz/%.c $(LIB_SRCS)
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -o $@ $< $(LIB_SRCS) $(LDLIBS)

fuzz: $(FUZZ_BINS)

run: deps
	@$(MAKE) --no-print-directory all
	@mkdir -p var/quickstart/state
	./$(BUILD)/tiercached -c config/examples/quickstart.conf

unit: $(UNIT_BINS)

check: deps
	@$(MAKE) --no-print-directory all fuzz
	@tests/run.sh

check-long: deps
	@$(MAKE) --no-print-directory all fuzz
	@TC_LONG=1 tests/run.sh

# The libiscsi conformance suite against tiercached and tgtd, both counts printed.
conformance: deps
	@$(MAKE) --no-print-directory all
	@TC_KEEP= bash tests/test_conformance_libiscsi.sh

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
