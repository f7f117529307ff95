/*
 * fuzz_pdu.c - arbitrary bytes as PDUs into a logged-in iSCSI connection.
 *
 * A real connection object (target/iscsi/conn.c) owns one end of a
 * socketpair. The harness logs in properly (so the bytes reach the full
 * feature phase parsers: SCSI Command, Data-Out, TMF, Text, NOP, Logout,
 * SNACK, unknown opcodes), with digests and R2T policy chosen by the
 * first input byte, then writes the rest of the input to the other end and
 * lets the connection read it, reading back and discarding whatever it
 * answers. Finally the peer closes and the connection must tear down
 * cleanly: ASan/UBSan/LeakSanitizer catch any memory error or leak.
 *
 * The target maps no LUN, so every command completes inside the backstore
 * synchronously with "LUN not supported" and no block I/O is needed.
 *
 * Single-threaded; no worker threads (the connection runs without epoll).
 */
#include "backstore/scsi.h"
#include "target/iscsi/iscsi_int.h"

#include "common/log.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const tgt_iqn = "iqn.2026-11.fuzz:pdu";
static struct iscsi_target_cfg tgt;
static struct iscsi_listen_cfg lst = { "127.0.0.1", 3260 };
static struct iscsi_portal_cfg cfg;

static void setup(void)
{
	static int done;
	if (done)
		return;
	done = 1;
	log_set_level(LOG_LVL_ERR);
	tgt.iqn = tgt_iqn;
	tgt.scsi = scsi_target_new(tgt_iqn);
	cfg.listen = &lst;
	cfg.nlisten = 1;
	cfg.targets = &tgt;
	cfg.ntargets = 1;
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

/* Pump: let the connection read whatever is pending. */
static void pump(struct iscsi_conn *c, int peer)
{
	for (int i = 0; i < 64 && alive(); i++) {
		unsigned before = c->rx_pdus;
		iscsi_conn_on_readable(c);
		drain_peer(peer);
		if (!alive() || c->rx_pdus == before)
			break;
	}
}

static size_t login_pdu(uint8_t *out, uint8_t mode)
{
	char text[512];
	int n = snprintf(text, sizeof(text),
			 "InitiatorName=iqn.2026-11.fuzz:init%cSessionType=Normal%cTargetName=%s%c"
			 "HeaderDigest=%s%cDataDigest=%s%cInitialR2T=%s%cImmediateData=%s%c"
			 "MaxBurstLength=16384%cFirstBurstLength=8192%cMaxOutstandingR2T=4%c"
			 "MaxRecvDataSegmentLength=4096%c",
			 0, 0, tgt_iqn, 0, (mode & 1) ? "CRC32C" : "None", 0,
			 (mode & 2) ? "CRC32C" : "None", 0, (mode & 4) ? "No" : "Yes", 0,
			 (mode & 8) ? "No" : "Yes", 0, 0, 0, 0, 0);
	struct iscsi_login_req_hdr *h = (struct iscsi_login_req_hdr *)out;
	memset(h, 0, ISCSI_BHS_LEN);
	h->opcode = ISCSI_OP_LOGIN_REQ | ISCSI_IMMEDIATE;
	h->flags = ISCSI_LOGIN_TRANSIT | (ISCSI_STAGE_OPERATIONAL << 2) | ISCSI_STAGE_FULL_FEATURE;
	h->isid[0] = 0x80;
	h->isid[5] = mode;
	be24_put(h->dsl, (uint32_t)n);
	be32_put(h->itt, 1);
	memcpy(out + ISCSI_BHS_LEN, text, (size_t)n);
	size_t len = ISCSI_BHS_LEN + (size_t)n;
	while (len & 3)
		out[len++] = 0;
	return len;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int sv[2];
	uint8_t login[1024];

	setup();
	if (size < 1 || socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) < 0)
		return 0;
	struct iscsi_conn *c = iscsi_conn_new(sv[0]);
	if (!c) {
		close(sv[0]);
		close(sv[1]);
		return 0;
	}
	size_t ll = login_pdu(login, data[0]);
	if (write(sv[1], login, ll) != (ssize_t)ll)
		abort();
	pump(c, sv[1]);
	if (!alive() || c->state != CONN_FULL_FEATURE)
		abort(); /* the well-formed login must succeed */

	const uint8_t *p = data + 1;
	size_t left = size - 1;
	while (left && alive() && c->state != CONN_CLOSING) {
		ssize_t w = write(sv[1], p, left);
		if (w <= 0) {
			unsigned before = c->rx_pdus;
			pump(c, sv[1]);
			if (!alive() || c->closing_after_tx || c->rx_pdus == before)
				break;
			continue;
		}
		p += w;
		left -= (size_t)w;
		pump(c, sv[1]);
	}
	close(sv[1]);
	for (int i = 0; i < 1000 && alive(); i++)
		iscsi_conn_on_readable(c); /* reads what is left, then EOF: closes */
	/* Freed by now: the backstore holds no command without a LUN. */
	if (alive())
		abort();
	return 0;
}
