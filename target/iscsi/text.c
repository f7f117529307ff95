/*
 * text.c - Text Request / Response in full feature phase (RFC 7143 11.10,
 * 11.11): SendTargets and renegotiation of the keys allowed there.
 *
 * SendTargets=All lists every target this initiator's IQN may reach (the
 * same ACL as login, so a target is invisible to an initiator outside its
 * allow list), each with a TargetAddress for every portal it can be
 * reached on: the address the initiator is connected to first, then every
 * other listen address (a wildcard one stands for the connection's own),
 * so that a multipath host that discovers through one portal learns of
 * all. SendTargets=<iqn> lists that one target; an empty value in a normal
 * session lists the session's own target.
 *
 * Long text crosses PDUs with the C bit in both directions: a request with
 * C=1 is accumulated and answered with an empty response carrying a Target
 * Transfer Tag; a response longer than the initiator's
 * MaxRecvDataSegmentLength is sent in pieces, each next piece asked for by
 * an empty request echoing our TTT.
 *
 * Threading: the connection's worker thread.
 */
#include "target/iscsi/iscsi_int.h"

#include "common/log.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

static uint32_t new_ttt(struct iscsi_conn *c)
{
	c->text_ttt = (c->text_ttt + 1) & 0x7fffffff;
	if (c->text_ttt == 0)
		c->text_ttt = 1;
	return c->text_ttt;
}

static void send_text_rsp(struct iscsi_conn *c, const uint8_t *req, const char *data,
			  uint32_t len, bool more)
{
	struct iscsi_tx *tx = iscsi_tx_new(len);
	if (!tx) {
		iscsi_conn_close(c, "out of memory");
		return;
	}
	const struct iscsi_text_hdr *q = (const struct iscsi_text_hdr *)req;
	struct iscsi_text_hdr *r = (struct iscsi_text_hdr *)tx->hdr;
	r->opcode = ISCSI_OP_TEXT_RSP;
	r->flags = more ? ISCSI_TEXT_CONTINUE : ISCSI_FLAG_FINAL;
	memcpy(r->lun, q->lun, 8);
	be32_put(r->itt, bhs_itt(req));
	be32_put(r->ttt, more ? new_ttt(c) : ISCSI_RSVD_TAG);
	iscsi_conn_fill_sn(c, tx->hdr, true);
	if (len)
		memcpy(tx->payload, data, len);
	iscsi_conn_send(c, tx);
}

/* Send the next piece of the pending response. */
static void send_pending(struct iscsi_conn *c, const uint8_t *req)
{
	size_t left = c->text_out_len - c->text_out_off;
	size_t chunk = left > c->params.initiator_mrdsl ? c->params.initiator_mrdsl : left;
	bool more = chunk < left;

	send_text_rsp(c, req, c->text_out + c->text_out_off, (uint32_t)chunk, more);
	c->text_out_off += chunk;
	if (!more) {
		free(c->text_out);
		c->text_out = NULL;
		c->text_out_len = c->text_out_off = 0;
	}
}

/*
 * The connection's own address: "host:port" or "[v6host]:port" into host
 * (without the port) and its port; its family (AF_INET for v4-mapped
 * ones too), or 0 if the socket cannot tell.
 */
static int conn_host(struct iscsi_conn *c, char *host, size_t hostlen, unsigned *port)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	char h[INET6_ADDRSTRLEN];

	if (getsockname(c->ev.fd, (struct sockaddr *)&ss, &sl) != 0)
		return 0;
	if (ss.ss_family == AF_INET) {
		struct sockaddr_in *a = (struct sockaddr_in *)&ss;
		inet_ntop(AF_INET, &a->sin_addr, h, sizeof(h));
		snprintf(host, hostlen, "%s", h);
		*port = ntohs(a->sin_port);
		return AF_INET;
	}
	if (ss.ss_family == AF_INET6) {
		struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
		*port = ntohs(a->sin6_port);
		if (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr)) {
			inet_ntop(AF_INET, &a->sin6_addr.s6_addr[12], h, sizeof(h));
			snprintf(host, hostlen, "%s", h);
			return AF_INET;
		}
		inet_ntop(AF_INET6, &a->sin6_addr, h, sizeof(h));
		snprintf(host, hostlen, "[%s]", h);
		return AF_INET6;
	}
	return 0;
}

static void local_address(struct iscsi_conn *c, char *out, size_t outlen)
{
	const struct iscsi_portal_cfg *cfg = iscsi_portal_cfg();
	unsigned tpgt = cfg && cfg->tpgt ? cfg->tpgt : 1;
	char host[INET6_ADDRSTRLEN + 2];
	unsigned port;

	if (conn_host(c, host, sizeof(host), &port)) {
		snprintf(out, outlen, "%s:%u,%u", host, port, tpgt);
		return;
	}
	if (cfg && cfg->nlisten)
		snprintf(out, outlen, "%s:%u,%u", cfg->listen[0].addr, cfg->listen[0].port, tpgt);
	else
		snprintf(out, outlen, "127.0.0.1:3260,%u", tpgt);
}

static bool wildcard(const char *a)
{
	return !*a || !strcmp(a, "0.0.0.0") || !strcmp(a, "::") || !strcmp(a, "[::]");
}

#define MAX_ADDRS 32

/* Every portal's TargetAddress value, the connection's own first, no repeats. */
static int portal_addresses(struct iscsi_conn *c, const struct iscsi_portal_cfg *cfg, char addrs[][128])
{
	unsigned tpgt = cfg && cfg->tpgt ? cfg->tpgt : 1;
	char host[INET6_ADDRSTRLEN + 2];
	unsigned port;
	int fam = conn_host(c, host, sizeof(host), &port);
	int n = 0;
	local_address(c, addrs[n++], 128);
	for (int i = 0; cfg && i < cfg->nlisten && n < MAX_ADDRS; i++) {
		const struct iscsi_listen_cfg *l = &cfg->listen[i];
		bool v6 = strchr(l->addr, ':') && l->addr[0] != '[';
		if (wildcard(l->addr)) {
			/* reachable at the address this host reached us on, if
			 * of the wildcard's family ("::" listens v6-only) */
			bool l6 = *l->addr && strcmp(l->addr, "0.0.0.0") != 0;
			if (!fam || (fam == AF_INET6) != l6)
				continue;
			snprintf(addrs[n], 128, "%s:%u,%u", host, l->port, tpgt);
		} else {
			snprintf(addrs[n], 128, "%s%s%s:%u,%u", v6 ? "[" : "", l->addr, v6 ? "]" : "", l->port, tpgt);
		}
		bool dup = false;
		for (int k = 0; k < n && !dup; k++)
			dup = !strcmp(addrs[k], addrs[n]);
		if (!dup)
			n++;
	}
	return n;
}

static void send_targets(struct iscsi_conn *c, const char *which, struct iscsi_text_out *out)
{
	const struct iscsi_portal_cfg *cfg = iscsi_portal_cfg();
	struct iscsi_sess *s = c->sess;
	char addrs[MAX_ADDRS][128];

	if (!cfg)
		return;
	int naddrs = portal_addresses(c, cfg, addrs);
	for (int i = 0; i < cfg->ntargets; i++) {
		const struct iscsi_target_cfg *t = &cfg->targets[i];
		if (!iscsi_acl_allows(t, s->initiator))
			continue;
		if (strcmp(which, "All") == 0) {
			/* listed */
		} else if (which[0] == '\0') {
			if (!iscsi_same_target(t, s->tgt))
				continue;
		} else if (strcasecmp(which, t->iqn) != 0) {
			continue;
		}
		/* a target goes in whole or not at all: never a name without its
		 * addresses, or addresses under the previous target's name */
		size_t need = sizeof("TargetName=") + strlen(t->iqn);
		for (int k = 0; k < naddrs; k++)
			need += sizeof("TargetAddress=") + strlen(addrs[k]);
		if (out->len + need > out->cap) {
			log_warn("iSCSI %s: SendTargets answer full: targets from %s on are not listed", c->peer,
				 t->iqn);
			out->full = true;
			return;
		}
		iscsi_text_add(out, "TargetName", t->iqn);
		for (int k = 0; k < naddrs; k++)
			iscsi_text_add(out, "TargetAddress", addrs[k]);
	}
}

void iscsi_text_pdu(struct iscsi_conn *c, const uint8_t *bhs, char *data, uint32_t dlen)
{
	const struct iscsi_text_hdr *h = (const struct iscsi_text_hdr *)bhs;
	uint32_t ttt = be32_get(h->ttt);

	if (!iscsi_sess_cmdsn_accept(c->sess, be32_get(h->sn24), bhs_immediate(bhs)))
		return;
	if (ttt != ISCSI_RSVD_TAG) {
		if (ttt != c->text_ttt) {
			iscsi_reject(c, ISCSI_REJECT_INVALID_PDU_FIELD, bhs);
			return;
		}
		if (c->text_out) {
			send_pending(c, bhs);
			return;
		}
	} else if (c->text_out) {
		/* A new request abandons the unfinished response. */
		free(c->text_out);
		c->text_out = NULL;
		c->text_out_len = c->text_out_off = 0;
	}
	if (c->text_acc_len + dlen > ISCSI_TEXT_MAX) {
		free(c->text_acc);
		c->text_acc = NULL;
		c->text_acc_len = 0;
		iscsi_reject(c, ISCSI_REJECT_PROTOCOL_ERROR, bhs);
		return;
	}
	if (dlen) {
		char *n = realloc(c->text_acc, c->text_acc_len + dlen + 1);
		if (!n) {
			iscsi_conn_close(c, "out of memory");
			return;
		}
		c->text_acc = n;
		memcpy(c->text_acc + c->text_acc_len, data, dlen);
		c->text_acc_len += dlen;
	}
	if (bhs[1] & ISCSI_TEXT_CONTINUE) {
		send_text_rsp(c, bhs, NULL, 0, true);
		return;
	}

	struct iscsi_kv kv[64];
	char *answer = malloc(ISCSI_TEXT_MAX);
	struct iscsi_text_out out = { .buf = answer, .cap = ISCSI_TEXT_MAX };
	struct iscsi_neg_ctx ctx = { .phase = ISCSI_NEG_FULL_FEATURE, .discovery = c->sess->discovery,
				     .leading = true };
	int n = c->text_acc_len ? iscsi_text_parse(c->text_acc, c->text_acc_len, kv, 64) : 0;

	if (!answer || n < 0) {
		free(answer);
		free(c->text_acc);
		c->text_acc = NULL;
		c->text_acc_len = 0;
		if (!answer)
			iscsi_conn_close(c, "out of memory");
		else
			iscsi_reject(c, ISCSI_REJECT_PROTOCOL_ERROR, bhs);
		return;
	}
	struct iscsi_params p = c->params;
	for (int i = 0; i < n; i++) {
		if (strcmp(kv[i].key, "SendTargets") == 0) {
			send_targets(c, kv[i].value, &out);
			continue;
		}
		enum iscsi_neg_result r = iscsi_param_negotiate(&p, &ctx, kv[i].key, kv[i].value, &out);
		if (r == ISCSI_NEG_NOT_MINE)
			iscsi_text_add(&out, kv[i].key, "Reject");
	}
	/* Only MaxRecvDataSegmentLength may change in full feature phase. */
	c->params.initiator_mrdsl = p.initiator_mrdsl;
	c->sess->params.initiator_mrdsl = p.initiator_mrdsl;
	free(c->text_acc);
	c->text_acc = NULL;
	c->text_acc_len = 0;
	if (out.len > c->params.initiator_mrdsl) {
		c->text_out = answer;
		c->text_out_len = out.len;
		c->text_out_off = 0;
		send_pending(c, bhs);
		return;
	}
	send_text_rsp(c, bhs, answer, (uint32_t)out.len, false);
	free(answer);
}
