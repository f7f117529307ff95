#!/usr/bin/env bash
# tests/fuzz/make_corpus.sh - rebuild the seed corpora of fuzz_pdu and
# fuzz_login from real initiators.
#
# Starts tiercached on a free loopback port (a plain target, a write-back
# cached one and a CHAP one), captures its traffic with dumpcap (capture
# filter on the port), and drives it with libiscsi's tools (iscsi-ls,
# iscsi-inq, iscsi-readcapacity16, a few iscsi-test-cu suites, iscsi-perf
# for two seconds) and QEMU (qemu-img info / convert, qemu-io). Then each
# TCP connection's initiator->target byte stream is cut into PDUs (the BHS
# says how long each is; the login answers say whether digests follow) and
# written out in the harnesses' input formats:
#
#   fuzz_login   one record per Login Request of a connection: flags byte,
#                variation byte (ISID/TSIH/CID/version bits the harness
#                knows), two bytes of length, the key=value text; names
#                rewritten to the harness's initiator and targets
#   fuzz_pdu     a mode byte (the session's digests, InitialR2T and
#                ImmediateData, as fuzz_pdu.c reads it) and the
#                full-feature-phase PDUs after login: whole sessions (cut
#                at 16 KiB) and every distinct PDU alone
#
# The raw split is minimized with libFuzzer's -merge=1 into a fresh
# tests/fuzz/corpus/NAME (build the harnesses first: make fuzz).
#
# usage: tests/fuzz/make_corpus.sh          (from the top of the repository)
#        TC_KEEP=1 keeps the capture and the raw split in the scratch dir.
set -u
cd "$(dirname "$0")/../.."
. tests/lib.sh
tc_tmpdir
for t in dumpcap tshark iscsi-ls iscsi-inq iscsi-test-cu iscsi-perf qemu-img qemu-io python3; do
	command -v "$t" >/dev/null || fail "$t is needed (apt-get install tshark libiscsi-bin qemu-utils qemu-block-extra)"
done
[ -x build/tiercached ] || fail "build/tiercached missing: make"
for h in fuzz_pdu fuzz_login; do
	[ -x "build/fuzz/$h" ] || fail "build/fuzz/$h missing: make fuzz"
done

port=$(tc_free_port)
base=iqn.2026-11.io.tiercache
{
	tc_conf_head "$port"
	cat <<CONF

[target $base:plain]
lun0 = disk0

[target $base:cached]
lun0 = disk1

[target $base:chap]
lun0 = disk2
chap_user = user
chap_secret = secretsecret12

[lun disk0]
backing = $T/disk0.img
size = 16M

[lun disk1]
backing = $T/disk1.img
size = 16M
cache = fast

[lun disk2]
backing = $T/disk2.img
size = 4M

[cache fast]
legs = $T/leg0.img $T/leg1.img
size = 32M
extent = 64K
mode = write-back
CONF
} >"$T/t.conf"

dumpcap -q -i lo -f "tcp port $port" -w "$T/cap.pcapng" >"$T/dumpcap.log" 2>&1 &
cap=$!
sleep 1
tc_start "$T/t.conf"

u=iscsi://127.0.0.1:$port
run() { timeout 120 "$@" >>"$T/clients.log" 2>&1 || echo "note: $* exited $?" >>"$T/clients.log"; }
run iscsi-ls -s "$u/"
run iscsi-ls -s "iscsi://user%secretsecret12@127.0.0.1:$port/"
run iscsi-inq "$u/$base:plain/0"
run iscsi-inq -e 1 -c 0x80 "$u/$base:plain/0"
run iscsi-inq -e 1 -c 0x83 "$u/$base:cached/0"
run iscsi-inq -e 1 -c 0xb0 "$u/$base:plain/0"
run iscsi-inq "iscsi://user%secretsecret12@127.0.0.1:$port/$base:chap/0"
run iscsi-inq "iscsi://user%wrongsecret99@127.0.0.1:$port/$base:chap/0"
run iscsi-readcapacity16 "$u/$base:cached/0"
for t in SCSI.TestUnitReady SCSI.Inquiry SCSI.ReadCapacity16 SCSI.Read10 SCSI.Write10 SCSI.ModeSense6 \
	SCSI.ReportSupportedOpcodes SCSI.Unmap SCSI.CompareAndWrite iSCSI.iSCSIcmdsn iSCSI.iSCSIdatasn; do
	run iscsi-test-cu --dataloss -i "iqn.2026-11.test:cu-a" -I "iqn.2026-11.test:cu-b" -t "$t" "$u/$base:plain/0"
done
run timeout -s INT 2 iscsi-perf "$u/$base:cached/0"
run qemu-img info "$u/$base:plain/0"
run qemu-io -f raw -c 'write -P 0xab 0 64k' -c 'read -P 0xab 0 64k' -c 'write -z 1M 64k' -c 'discard 2M 64k' \
	-c 'flush' "$u/$base:cached/0"
head -c 1M /dev/urandom >"$T/rand.img"
run qemu-img convert -n -f raw -O raw "$T/rand.img" "$u/$base:plain/0"
run qemu-img convert -f raw -O raw "$u/$base:cached/0" "$T/back.img"
tc_stop
sleep 1
kill -INT "$cap"
wait "$cap"

raw=$T/raw
mkdir -p "$raw/pdu" "$raw/login"
nstreams=$(tshark -r "$T/cap.pcapng" -T fields -e tcp.stream 2>/dev/null | sort -n | tail -n 1)
[ -n "$nstreams" ] || fail "nothing captured (see $T/dumpcap.log)"
for ((i = 0; i <= nstreams; i++)); do
	tshark -r "$T/cap.pcapng" -q -z "follow,tcp,raw,$i" >"$T/stream-$i.txt" 2>/dev/null
done

python3 - "$T" "$raw" "$nstreams" <<'PY'
import hashlib, os, re, sys

tdir, raw, nstreams = sys.argv[1], sys.argv[2], int(sys.argv[3])

def follow(path):
    """tshark's follow,tcp,raw: client->server lines unindented, answers indented."""
    c2s, s2c = bytearray(), bytearray()
    body = False
    for line in open(path):
        if line.startswith("====="):
            body = not body if not body else False
            continue
        if not body or line.startswith(("Follow:", "Filter:", "Node ")):
            continue
        s = line.rstrip("\n")
        dst = s2c if s.startswith("\t") else c2s
        s = s.strip()
        if re.fullmatch(r"[0-9a-fA-F]+", s):
            dst += bytes.fromhex(s)
    return bytes(c2s), bytes(s2c)

def pdus(stream, hd, dd):
    """Split a byte stream into PDUs; hd/dd(i) say whether digests follow PDU i."""
    out, off, i = [], 0, 0
    while off + 48 <= len(stream):
        bhs = stream[off:off + 48]
        ahs = bhs[4] * 4
        dsl = int.from_bytes(bhs[5:8], "big")
        n = 48 + ahs + (4 if hd(i) else 0)
        if dsl:
            n += (dsl + 3) & ~3
            n += 4 if dd(i) else 0
        if off + n > len(stream):
            break
        out.append(stream[off:off + n])
        off += n
        i += 1
    return out

def text(pdu):
    dsl = int.from_bytes(pdu[5:8], "big")
    return pdu[48 + pdu[4] * 4:48 + pdu[4] * 4 + dsl]

def write(d, data):
    name = hashlib.sha1(data).hexdigest()[:16]
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)

FUZZ_TARGETS = [b"iqn.2026-11.fuzz:open", b"iqn.2026-11.fuzz:acl", b"iqn.2026-11.fuzz:chap"]
nlogin = npdu = 0
for i in range(nstreams + 1):
    c2s, s2c = follow(os.path.join(tdir, "stream-%d.txt" % i))
    if len(c2s) < 48:
        continue
    # Login PDUs (opcode 0x03 / 0x23) never carry digests; answers tell what follows.
    tpdus = pdus(s2c, lambda k: False, lambda k: False)
    keys = {}
    for p in tpdus:
        if p[0] & 0x3f != 0x23:
            break
        for kv in text(p).split(b"\0"):
            if b"=" in kv:
                k, v = kv.split(b"=", 1)
                keys[k] = v
    hd = keys.get(b"HeaderDigest") == b"CRC32C"
    dd = keys.get(b"DataDigest") == b"CRC32C"
    # initiator stream: login PDUs without digests, then full feature phase
    logins, off = [], 0
    while off + 48 <= len(c2s) and c2s[off] & 0x3f == 0x03:
        p = pdus(c2s[off:], lambda k: False, lambda k: False)[:1]
        if not p:
            break
        logins.append(p[0])
        off += len(p[0])
    ffp = pdus(c2s[off:], lambda k: hd, lambda k: dd)
    if logins:
        for tgt in FUZZ_TARGETS:
            rec = bytearray()
            for p in logins:
                t = re.sub(rb"InitiatorName=[^\0]*", b"InitiatorName=iqn.2026-11.fuzz:init", text(p))
                t = re.sub(rb"TargetName=[^\0]*", b"TargetName=" + tgt, t)
                isid5 = p[8 + 5]
                var = (isid5 & 3) | (0x04 if p[14:16] != b"\0\0" else 0) | (0x08 if p[20:22] != b"\0\0" else 0)
                var |= 0x80 if p[3] else 0
                rec += bytes([p[1], var]) + len(t).to_bytes(2, "big") + t
            write(os.path.join(raw, "login"), bytes(rec))
            nlogin += 1
    if ffp:
        ir2t = keys.get(b"InitialR2T", b"Yes") == b"No"
        imm = keys.get(b"ImmediateData", b"Yes") == b"No"
        mode = bytes([(1 if hd else 0) | (2 if dd else 0) | (4 if ir2t else 0) | (8 if imm else 0)])
        sess = bytearray(mode)
        for p in ffp:
            if len(sess) + len(p) > 16384:
                break
            sess += p
        write(os.path.join(raw, "pdu"), bytes(sess))
        npdu += 1
        for p in ffp:
            if len(p) <= 8192:
                write(os.path.join(raw, "pdu"), mode + p)
                npdu += 1
print("split %d streams: %d login inputs, %d pdu inputs (before dedup)" % (nstreams + 1, nlogin, npdu))
PY
[ $? = 0 ] || fail "split failed"

for h in pdu login; do
	out=tests/fuzz/corpus/$h
	fresh=$T/merged-$h
	mkdir -p "$fresh"
	"build/fuzz/fuzz_$h" -merge=1 -timeout=10 -rss_limit_mb=2048 "$fresh" "$raw/$h" >"$T/merge-$h.log" 2>&1 ||
		fail "merge for fuzz_$h failed: $(tail -n 5 "$T/merge-$h.log")"
	rm -rf "$out"
	mkdir -p "$out"
	cp "$fresh"/* "$out"/
	echo "corpus/$h: $(ls "$raw/$h" | wc -l) split inputs, $(ls "$out" | wc -l) after -merge=1, $(du -sk "$out" | cut -f1) KiB"
done
