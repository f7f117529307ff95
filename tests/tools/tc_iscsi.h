/*
 * tc_iscsi.h - the login the test clients under tests/tools share: a normal
 * session to an iscsi:// URL through libiscsi's synchronous API.
 */
#ifndef TC_TESTS_ISCSI_H
#define TC_TESTS_ISCSI_H

#include <iscsi/iscsi.h>
#include <stdbool.h>
#include <stdio.h>

/*
 * Log in to url as initiator with the given header digest and command
 * timeout (seconds); reconnect = false makes a dead target end the client
 * instead of being reconnected to forever. *lun gets the URL's LUN. NULL
 * after printing why on stderr.
 */
static inline struct iscsi_context *tc_iscsi_connect(const char *url, const char *initiator,
						     enum iscsi_header_digest digest, int timeout_s,
						     bool reconnect, int *lun)
{
	struct iscsi_context *c = iscsi_create_context(initiator);
	if (!c)
		return NULL;
	struct iscsi_url *u = iscsi_parse_full_url(c, url);
	if (!u) {
		fprintf(stderr, "bad URL %s: %s\n", url, iscsi_get_error(c));
		iscsi_destroy_context(c);
		return NULL;
	}
	iscsi_set_targetname(c, u->target);
	iscsi_set_session_type(c, ISCSI_SESSION_NORMAL);
	iscsi_set_header_digest(c, digest);
	if (!reconnect)
		iscsi_set_noautoreconnect(c, 1);
	iscsi_set_timeout(c, timeout_s);
	*lun = u->lun;
	if (iscsi_full_connect_sync(c, u->portal, u->lun) != 0) {
		fprintf(stderr, "connect %s: %s\n", url, iscsi_get_error(c));
		iscsi_destroy_url(u);
		iscsi_destroy_context(c);
		return NULL;
	}
	iscsi_destroy_url(u);
	return c;
}

#endif
