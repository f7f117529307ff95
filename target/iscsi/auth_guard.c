/*
 * auth_guard.c - slowing down CHAP guessing from one address.
 *
 * Without it, one address could try hundreds of secrets a second and fill
 * the log with a line per try. For each peer address we count the CHAP
 * proofs that failed in the last ten minutes. From the third failure on,
 * proofs from that address are judged no more often than once per hold
 * (1 s after the third failure, 2 s after the fourth, 4 s from the fifth):
 * a proof that arrives earlier waits, unjudged, for its turn. Holding the
 * judgement and not just the refusal matters: if only refusals were held,
 * a guesser would read "no answer yet" as "wrong" and go on at full speed,
 * on as many connections as it likes.
 *
 * Waiting is a state of the login (login.c) that the connection's 1 s tick
 * ends, never a sleep: the worker goes on serving everything else. Proofs
 * already waiting more than GUARD_QUEUE_MAX_MS ahead are not queued: the
 * login is answered 0301 (service unavailable, try again) at once, so a
 * flood of parallel guesses from one address costs it its logins, not us
 * memory, and the queue never makes a right proof wait longer than that.
 * A right proof is judged at its turn like any other, and passes: after any
 * number of failures the host that knows the secret logs in within a few
 * seconds (README, "CHAP").
 *
 * The log gets one line per address per minute: the first failure of the
 * minute, with how many failed or were turned away since the last line.
 *
 * The table has a fixed number of entries; when it is full the one that
 * failed longest ago is reused (an attacker with many addresses gets less
 * slowing, never more memory).
 *
 * Threading: any worker; one mutex, taken for CHAP proofs only.
 */
#include "target/iscsi/iscsi_int.h"

#include "common/log.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define GUARD_ENTRIES 256
#define GUARD_WINDOW_MS (10 * 60 * 1000)
#define GUARD_FREE_TRIES 2      /* failures judged at once; holds start after the third */
#define GUARD_HOLD_MAX_MS 4000
#define GUARD_QUEUE_MAX_MS 6000
#define GUARD_LOG_MS 60000

struct guard_ent {
	char addr[64];
	uint32_t fails;       /* in the window */
	uint64_t last_ms;     /* last failure */
	uint64_t next_ms;     /* the next proof is judged no earlier */
	uint32_t unlogged;    /* failures and turned-away logins since the last log line */
	uint64_t logged_ms;   /* when that line was written (0: never) */
};

static struct guard_ent tab[GUARD_ENTRIES];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* The address of peer ("1.2.3.4:port", "[v6]:port"), without the port. */
static void peer_addr(const char *peer, char *out, size_t len)
{
	const char *colon = strrchr(peer, ':');
	size_t n = colon ? (size_t)(colon - peer) : strlen(peer);
	if (n >= len)
		n = len - 1;
	memcpy(out, peer, n);
	out[n] = 0;
}

/* The entry of peer's address (caller holds lock); create: reuse the oldest. */
static struct guard_ent *lookup(const char *peer, bool create, uint64_t now)
{
	char addr[64];
	peer_addr(peer, addr, sizeof(addr));
	struct guard_ent *e = NULL, *oldest = &tab[0];
	for (int i = 0; i < GUARD_ENTRIES; i++) {
		if (tab[i].addr[0] && !strcmp(tab[i].addr, addr)) {
			e = &tab[i];
			break;
		}
		if (tab[i].last_ms < oldest->last_ms)
			oldest = &tab[i];
	}
	if (!e && !create)
		return NULL;
	if (!e) {
		e = oldest;
		memset(e, 0, sizeof(*e));
		snprintf(e->addr, sizeof(e->addr), "%s", addr);
	}
	if (now - e->last_ms > GUARD_WINDOW_MS) {
		e->fails = 0;
		e->next_ms = 0;
	}
	return e;
}

/* How long proofs wait between judgements after `fails` failures. */
static uint32_t hold_ms(uint32_t fails)
{
	if (fails <= GUARD_FREE_TRIES)
		return 0;
	uint32_t k = fails - GUARD_FREE_TRIES - 1;
	return k >= 2 ? GUARD_HOLD_MAX_MS : 1000u << k;
}

int iscsi_auth_guard_admit(const char *peer, uint32_t *wait_ms)
{
	uint64_t now = now_ms();
	int rc = 0;
	*wait_ms = 0;
	pthread_mutex_lock(&lock);
	struct guard_ent *e = lookup(peer, false, now);
	if (e && e->fails > GUARD_FREE_TRIES) {
		uint64_t slot = e->next_ms > now ? e->next_ms : now;
		if (slot - now > GUARD_QUEUE_MAX_MS) {
			e->unlogged++;
			rc = -1;
		} else {
			e->next_ms = slot + hold_ms(e->fails);
			*wait_ms = (uint32_t)(slot - now);
		}
	}
	pthread_mutex_unlock(&lock);
	return rc;
}

void iscsi_auth_guard_fail(const char *peer, bool *log_now, uint32_t *unlogged)
{
	uint64_t now = now_ms();
	pthread_mutex_lock(&lock);
	struct guard_ent *e = lookup(peer, true, now);
	e->fails++;
	e->last_ms = now;
	uint64_t next = now + hold_ms(e->fails);
	if (next > e->next_ms)
		e->next_ms = next;
	*log_now = !e->logged_ms || now - e->logged_ms >= GUARD_LOG_MS;
	*unlogged = e->unlogged;
	if (*log_now) {
		e->logged_ms = now;
		e->unlogged = 0;
	} else {
		e->unlogged++;
	}
	pthread_mutex_unlock(&lock);
}
