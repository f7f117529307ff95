/*
 * check.h - the one assertion the unit tests share.
 *
 * CHECK(cond, fmt, ...) prints "ok: ..." or "FAIL: ..." and counts failures;
 * a test's main returns check_failures ? 1 : 0, so tests/run.sh sees every
 * failed check and the log shows which. Single-threaded use (the counter is
 * not atomic): call CHECK from the test's main thread.
 */
#ifndef TC_TESTS_CHECK_H
#define TC_TESTS_CHECK_H

#include <stdio.h>

static int check_failures;

#define CHECK(cond, ...)                                          \
	do {                                                      \
		if (cond) {                                       \
			printf("ok: ");                           \
		} else {                                          \
			printf("FAIL: ");                         \
			check_failures++;                         \
		}                                                 \
		printf(__VA_ARGS__);                              \
		printf("\n");                                     \
	} while (0)

#endif
