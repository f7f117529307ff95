/*
 * check.h - the assertions the unit tests share, and a bounded wait.
 *
 * CHECK(cond, fmt, ...) prints "ok: ..." or "FAIL: ..." and counts failures;
 * a test's main returns check_failures ? 1 : 0, so tests/run.sh sees every
 * failed check and the log shows which. Single-threaded use (the counter is
 * not atomic): call CHECK from the test's main thread.
 */
#ifndef TC_TESTS_CHECK_H
#define TC_TESTS_CHECK_H

#include <errno.h>
#include <semaphore.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static int check_failures __attribute__((unused));

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

/*
 * REQUIRE(cond, fmt, ...): stop the test at the first broken expectation,
 * naming the file, line and condition (for tests whose later steps make no
 * sense once one has failed). Any thread.
 */
#define REQUIRE(cond, ...)                                                        \
	do {                                                                      \
		if (!(cond)) {                                                    \
			fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
			fprintf(stderr, __VA_ARGS__);                             \
			fprintf(stderr, "\n");                                    \
			exit(1);                                                  \
		}                                                                 \
	} while (0)

/* Wait for s at most secs seconds: false on timeout (a bounded wait for a
 * condition, so a test that would hang fails instead). */
static inline bool sem_wait_secs(sem_t *s, int secs)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += secs;
	while (sem_timedwait(s, &ts) < 0)
		if (errno != EINTR)
			return false;
	return true;
}

#endif
