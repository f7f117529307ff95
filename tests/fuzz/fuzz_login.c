/*
 * fuzz_login.c - arbitrary login text and login PDU flags into the login
 * state machine (target/iscsi/login.c, param.c, chap.c).
 *
 * The input is a sequence of records: one flags byte (T, C, CSG, NSG bits
 * of a Login Request), one byte choosing ISID/TSIH/version variations, two
 * bytes of length, then that many bytes of key=value text. Each record
 * becomes one Login Request written to a real connection over a
 * socketpair; the connection's answers are read and discarded. Targets
 * cover the interesting policies: open, ACL-restricted, one-way and mutual
 * CHAP. At the end the peer closes; the connection must tear down without
 * a leak or memory error, whatever state login reached.
 *
 * Single-threaded; no worker threads.
 */
#include "backstore/scsi.h"
#include "target/iscsi/iscsi_int.h"

#include "common/log.h"

#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const allow[] = { "iqn.2026-11.fuzz:init" };
static struct iscsi_target_cfg tgts[4];
static struct iscsi_listen_cfg lst = { "127.0.0.1", 3260 };
static struct iscsi_portal_cfg cfg;

static void setup(void)
{
	static int done;
	if (done)
		return;
	done = 1;
	log_set_level(LOG_LVL_ERR);
	tgts[0].iqn = "iqn.2026-11.fuzz:open";
	tgts[1].iqn = "iqn.2026-11.fuzz:acl";
	tgts[1].allow = allow;
	tgts[1].nallow = 1;
	tgts[2].iqn = "iqn.2026-11.fuzz:chap";
	tgts[2].chap_user = "user";
	tgts[2].chap_secret = "secretsecret12";
	tgts[3].iqn = "iqn.2026-11.fuzz:mutual";
	tgts[3].chap_user = "user";
	tgts[3].chap_secret = "secretsecret12";
	tgts[3].mutual_user = "target";
	tgts[3].mutual_secret = "othersecret123";
	for (int i = 0; i < 4; i++)
		tgts[i].scsi = scsi_target_new(tgts[i].iqn);
	cfg.listen = &lst;
	cfg.nlisten = 1;
	cfg.targets = tgts;
	cfg.ntargets = 4;
	iscsi_portal_set_cfg(&cfg);
}

/* The connection frees itself once closed: only look at it while listed. */
static bool alive(void) { return iscsi_conn_first() != NULL; }

static void drain_peer(int fd)
{
	char buf[65536];
	while (read(fd, buf, sizeof(buf)) > 0)
		;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int sv[2];
	static uint8_t pdu[ISCSI_BHS_LEN + 65536 + 4];

	setup();
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) < 0)
		return 0;
	struct iscsi_conn *c = iscsi_conn_new(sv[0]);
	if (!c) {
		close(sv[0]);
		close(sv[1]);
		return 0;
	}
	size_t off = 0;
	while (off + 4 <= size && alive() && c->state == CONN_LOGIN && !c->closing_after_tx) {
		uint8_t flags = data[off], var = data[off + 1];
		size_t len = (size_t)data[off + 2] << 8 | data[off + 3];
		off += 4;
		if (len > size - off)
			len = size - off;
		if (len > 9000)
			len = 9000;
		struct iscsi_login_req_hdr *h = (struct iscsi_login_req_hdr *)pdu;
		memset(h, 0, ISCSI_BHS_LEN);
		h->opcode = ISCSI_OP_LOGIN_REQ | ISCSI_IMMEDIATE;
		h->flags = flags;
		h->version_min = (var & 0x80) ? 1 : 0;
		h->isid[0] = 0x80;
		h->isid[5] = var & 0x03;
		be16_put(h->tsih, (var & 0x04) ? 1 : 0);
		be16_put(h->cid, (var & 0x08) ? 1 : 0);
		be24_put(h->dsl, (uint32_t)len);
		be32_put(h->itt, 7);
		memcpy(pdu + ISCSI_BHS_LEN, data + off, len);
		off += len;
		size_t total = ISCSI_BHS_LEN + len;
		while (total & 3)
			pdu[total++] = 0;
		size_t done = 0;
		while (done < total && alive()) {
			ssize_t w = write(sv[1], pdu + done, total - done);
			if (w > 0)
				done += (size_t)w;
			iscsi_conn_on_readable(c);
			drain_peer(sv[1]);
			if (w <= 0 && (!alive() || c->closing_after_tx || c->state != CONN_LOGIN))
				break;
		}
	}
	close(sv[1]);
	for (int i = 0; i < 1000 && alive(); i++)
		iscsi_conn_on_readable(c);
	if (alive())
		abort();
	return 0;
}
