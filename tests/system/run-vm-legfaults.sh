#!/bin/bash
# tests/system/run-vm-legfaults.sh - real faults on a real NVMe leg, under load.
#
# The host tests fail legs through the daemon's own fault device. Here the
# faults come from below the guest kernel, so tiercached sees what it would
# see on a real machine: the NVMe driver's errors, and a command the drive
# never answers. Debian 12's kernel boots under qemu (TCG) with two QEMU
# NVMe controllers as the cache set's mirrored legs and a virtio disk as
# the backing store; leg 1's drive sits on a QEMU blkdebug node:
#   - latent sector errors: one 512-byte sector in every eighth 256 KiB slot
#     of leg 1's data area (31, fewer than max_read_errors) fails its first
#     read (blkdebug inject-error, iotype read, once; the guest's nvme_core
#     does not retry), as a drive's unreadable sector does until rewritten;
#   - a hang: a blkdebug breakpoint holds one write to leg 1 with no answer
#     (HMP qemu-io "break write_aio"), until the test resumes it;
#   - death: after an HMP qemu-io write-zeroes to leg 1 (its last, unused
#     sector) blkdebug moves to state 2, where every read, write and flush
#     of leg 1 fails with EIO.
# tiercached runs in the guest with its own portal (no LIO), reached from
# the host through a user-mode port forward; tierbench --verify (stamped
# blocks, every read checked, all read back at the end) and
# tests/tools/lba_io (known 4 MiB ranges) run on the host. Expected:
#   1. latent errors: reads of the bad sectors come from leg 0, leg 1 is
#      rewritten (status: leg_repairs > 0, leg 1's error count > 0) and
#      stays healthy; 0 initiator errors, 0 mismatches;
#   2. hang (leg_timeout = 3): leg 1 is failed (leg_timeouts = 1), the held
#      write finishes on leg 0; 0 initiator errors, 0 mismatches; then the
#      held write is released, leg 1 is replaced with itself and resynced
#      under load;
#   3. death: leg 1 is failed, status degraded, 0 initiator errors, 0
#      mismatches, the known ranges read back.
# The guest runs lib-vm.sh's NVMe doorbell kick: without it QEMU 7.2's NVMe
# controller misses submissions under this load and a leg stalls for good,
# which fails it by leg_timeout in part 1 for reasons of QEMU's own.
# And before the faults: status reports each leg's logical block and power-
# fail atomic write unit (libnvme), and the daemon puts the second LUN's
# 4 KiB blocks, which could tear on those 512-byte-atomic legs, under the
# torn-write guard (the block log), and not the first's 512-byte ones.
#
# Usage: tests/system/run-vm-legfaults.sh [build|boot|check|stop|all]  (default all)
# Env: TC_VM_DIR (work dir, default /var/tmp/tiercache-vm; shares the
#      kernel that run-vm-tcmu.sh setup unpacks), BUILD (default build),
#      PORT=13263 DBGPORT=12326 MEM=1024 KEEP=1 (leave the VM running)
# Exit: 0 pass, 1 fail, 77 skip (no qemu-system-x86_64 and cannot install it).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
BUILD=${BUILD:-build}
VMDIR=${TC_VM_DIR:-/var/tmp/tiercache-vm}
W=$VMDIR/legfaults
PORT=${PORT:-13263}
DBGPORT=${DBGPORT:-12326}
MEM=${MEM:-1024}
IQN=iqn.2026-11.io.tiercache:legfaults
URL=iscsi://127.0.0.1:$PORT/$IQN/0
LEG_SIZE=67108864
BACKING_SIZE=67108864
EXTENT=262144
# the layout of a 64 MiB leg with 256 KiB extents (checked against the leg after the format)
DATA_OFF=4456448
NSLOTS=238
mkdir -p "$W"
. tests/system/lib-vm.sh

write_init() {
{ vm_init_head; vm_nvme_kick_sh; cat <<'EOF'; } >"$1"
log init-start
# nvme_core: no controller reset while the test holds a command (it resumes it within seconds);
# no retry of a failed command (QEMU's EIO status has no DNR bit, a drive's unrecovered read error has)
for ko in $(cat /etc/modlist); do
	case $ko in
	*/nvme-core.ko*|*/nvme_core.ko*) insmod "$ko" io_timeout=600 max_retries=0 || log "insmod failed: $ko" ;;
	*) insmod "$ko" 2>/dev/null || log "insmod failed: $ko" ;;
	esac
done
ip link set lo up; ip link set eth0 up
ip addr add 10.0.2.15/24 dev eth0; ip route add default via 10.0.2.2
nc -ll -p 2323 -e /bin/sh &
for i in $(seq 1 100); do [ -b /dev/nvme1n1 ] && [ -b /dev/vdb ] && break; sleep 0.1; done
log "devices: $(ls /dev | grep -E '^(nvme|vd)' | tr '\n' ' ')"
nvme_kick &
tiercached -c /etc/tiercached.conf > /var/log/tiercached.log 2>&1 &
for i in $(seq 1 600); do [ -S /run/tiercache/control.sock ] && break; sleep 0.1; done
[ -S /run/tiercache/control.sock ] && log TARGET-READY || { log "TARGET-FAILED"; cat /var/log/tiercached.log; }
sleep 100000
EOF
}

write_conf() {
{ vm_conf_head leg-fault "$IQN" 0.0.0.0:3261; cat <<EOF; } >"$1"
lun1 = disk1

[lun disk0]
backing = /dev/vda
block_size = 512
cache = fast

; 4 KiB blocks on legs that write 512 bytes atomically: the daemon must guard them
[lun disk1]
backing = /dev/vdb
block_size = 4096
cache = fast

[cache fast]
legs = /dev/nvme0n1 /dev/nvme1n1
extent = 256K
mode = write-back
seq_cutoff = 0
leg_timeout = 3
EOF
}

# blkdebug rules of leg 1: latent sectors (any state, once each), death (state 2)
write_rules() {
	local k
	: >"$1"
	for ((k = 0; k < NSLOTS; k += 8)); do
		printf '[inject-error]\nevent = "read_aio"\niotype = "read"\nsector = "%d"\nerrno = "5"\nonce = "on"\n\n' \
			$(((DATA_OFF + k * EXTENT + 4096) / 512)) >>"$1"
	done
	cat >>"$1" <<'EOF'
[set-state]
state = "1"
event = "pwritev_zero"
new_state = "2"

[inject-error]
state = "2"
event = "read_aio"
errno = "5"
once = "off"

[inject-error]
state = "2"
event = "write_aio"
errno = "5"
once = "off"
EOF
}

build() {
	[ -x "$BUILD/tiercached" ] && [ -x "$BUILD/tierctl" ] || { echo "FAIL: build $BUILD/tiercached first (make)"; exit 1; }
	write_init "$W/init"
	write_conf "$W/tiercached.conf"
	vm_initrd "$W/initrd-root" "$W/init" "$W/tiercached.conf" "virtio_pci virtio_net virtio_blk nvme crc32c_generic" \
		"$BUILD/tiercached" "$BUILD/tierctl"
	write_rules "$W/leg1.rules"
	rm -f "$W/backing.img" "$W/backing2.img" "$W/nvme0.img" "$W/nvme1.img"
	truncate -s $BACKING_SIZE "$W/backing.img"
	truncate -s 16M "$W/backing2.img"
	truncate -s $LEG_SIZE "$W/nvme0.img"
	truncate -s $LEG_SIZE "$W/nvme1.img"
	cc -std=gnu11 -O2 -Wall -Wextra -o "$W/lba_io" tests/tools/lba_io.c -liscsi 2>"$W/cc.log" ||
		{ echo "FAIL: cannot build tests/tools/lba_io.c: $(head -5 "$W/cc.log")"; exit 1; }
	echo "initrd: $(stat -c %s "$W/initrd.cpio") bytes, $(wc -l <"$W/modlist.txt") modules; leg 1: $(grep -c read_aio "$W/leg1.rules") blkdebug read rules"
}

boot() {
	rm -f "$W/serial.log" "$W/qmp.sock"
	local t0
	t0=$(now)
	qemu-system-x86_64 -accel tcg -cpu max -m "$MEM" -smp 1 -display none \
		-monitor none -qmp unix:"$W/qmp.sock",server=on,wait=off \
		-serial file:"$W/serial.log" -no-reboot -kernel "$W/vmlinuz" -initrd "$W/initrd.cpio" \
		-append "console=ttyS0 quiet panic=-1$(vm_nvme_append)" \
		-drive file="$W/backing.img",if=virtio,format=raw,cache=unsafe \
		-drive file="$W/backing2.img",if=virtio,format=raw,cache=unsafe \
		-drive file="$W/nvme0.img",if=none,id=nv0,format=raw,cache=unsafe \
		-device nvme,serial=tcleg0,drive=nv0 \
		-blockdev driver=file,filename="$W/nvme1.img",node-name=nv1file,cache.no-flush=on \
		-blockdev driver=blkdebug,config="$W/leg1.rules",image=nv1file,node-name=nv1dbg \
		-blockdev driver=raw,file=nv1dbg,node-name=nv1 \
		-device nvme,serial=tcleg1,drive=nv1,share-rw=on \
		-netdev user,id=n0,hostfwd=tcp:127.0.0.1:$PORT-:3261,hostfwd=tcp:127.0.0.1:$DBGPORT-:2323 \
		-device virtio-net-pci,netdev=n0 >"$W/qemu.out" 2>&1 &
	echo $! >"$W/qemu.pid"
	local rc=0
	vm_wait_ready "$W/serial.log" "$W/qemu.pid" 900 || rc=1
	echo "BOOT: qemu start -> daemon ready: $(since "$t0") s"
	grep -E 'PROBE|tiercached:' "$W/serial.log" || true
	return $rc
}

gsh() { printf '%s\nexit\n' "$*" | socat -t 120 - TCP:127.0.0.1:$DBGPORT; }
# an HMP command through QMP's human-monitor-command; prints its output
hmp() { vm_qmp "$W/qmp.sock" human-monitor-command "$(python3 -c 'import json,sys; print(json.dumps({"command-line": sys.argv[1]}))' "$*")"; }

RC=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; RC=1; }
die() { echo "FAIL: $*"; RC=1; exit 1; }

# a field of the cache set, as a Python expression on c (status) and s (stats)
cst() {
	local st sts
	st=$(gsh 'tierctl --json status') || return 1
	sts=$(gsh 'tierctl --json stats') || return 1
	python3 -c '
import json, sys
def first_doc(t):
    return json.JSONDecoder().raw_decode(t[t.index("{"):])[0]
c = first_doc(sys.argv[2])["caches"][0]
sd = first_doc(sys.argv[3])
s = (sd.get("caches") or sd.get("sets") or [{}])[0]
print(eval(sys.argv[1]))' "$1" "$st" "$sts"
}
wait_for() { # SECONDS WHAT CMD...
	local secs=$1 what=$2 t0
	shift 2
	t0=$(date +%s)
	while (($(date +%s) - t0 < secs)); do
		"$@" && return 0
		sleep 1
	done
	bad "$what: not within $secs s"
	return 1
}
# tierbench --verify in the background: bench_start SECONDS OFFSET SIZE SEED; bench_end WHAT
bench_start() {
	"$BUILD/tierbench" --verify -w 4k-randwrite -r 70 -t 2 -q 8 -T "$1" --offset "$2" --size "$3" --seed "$4" \
		--io-timeout 60 --no-progress --json "$URL" >"$W/tb.json" 2>"$W/tb.err" &
	TB=$!
}
bench_end() {
	local rc=0 ios mism rb
	wait "$TB" || rc=$?
	[ "$rc" = 0 ] || { bad "$1: tierbench exited $rc (1: mismatch, 2: a target error): $(head -c 600 "$W/tb.err")"; return; }
	read -r ios mism rb < <(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); v=d['verify']
print(sum(r['ios'] for r in d['runs']), v['mismatches'], v['read_back'])" "$W/tb.json")
	[ "$mism" = 0 ] && [ "$rb" -gt 0 ] && ok "$1: tierbench --verify: $ios I/Os, $rb blocks read back, 0 errors, 0 mismatches" ||
		bad "$1: $mism mismatches, $rb blocks read back"
}
lba_io() { "$W/lba_io" "$1" "$URL" "${@:2}"; }

check() {
	local out e1 r0 r1
	head -c 4M /dev/urandom >"$W/a.img"
	head -c 4M /dev/urandom >"$W/b.img"

	echo "== the leg's layout is the one the blkdebug rules were written for"
	out=$(gsh 'tierctl --json status' | tr -d '\r')
	python3 - "$W/nvme1.img" "$DATA_OFF" "$NSLOTS" <<'PY' && ok "leg 1: data at $DATA_OFF, $NSLOTS slots" || die "leg 1's layout changed: update DATA_OFF/NSLOTS"
import sys
sys.path.insert(0, "tests/tools")
import leg_read
leg = leg_read.Leg(sys.argv[1])
print("leg 1:", leg.summary())
sys.exit(0 if leg.sb["data_off"] == int(sys.argv[2]) and leg.nslots == int(sys.argv[3]) else 1)
PY

	echo "== what the legs promise across a power failure (libnvme: Identify Namespace's format, AWUPF)"
	out=$(cst '[(l["device"].get("logical_block"), l["device"].get("atomic_write_bytes")) for l in c["legs"]]')
	[ "$out" = "[(512, 512), (512, 512)]" ] && ok "status: both QEMU NVMe legs have 512-byte blocks written atomically" ||
		bad "status: legs' logical block and atomic write unit: $out"
	out=$(gsh 'grep "atomically" /var/log/tiercached.log' | tr -d '\r')
	[[ "$out" == *"[lun disk1]: 4096-byte blocks; cache leg /dev/nvme"*"writes 512 bytes atomically"*"block log"* &&
		"$out" != *"[lun disk0]"* && "$out" != *"warning"* ]] &&
		ok "daemon log: the 4 KiB-block LUN is put under the torn-write guard, the 512-byte one is not" ||
		bad "no torn-write guard for [lun disk1]: $out"

	echo "== 1. latent sector errors on leg 1"
	[ "$(lba_io write 0 8192 "$W/a.img")" = good ] && ok "part 1: 4 MiB written at LBA 0" || bad "part 1: write"
	out=$(lba_io read 0 8192 --times 4 --expect "$W/a.img") || true
	[ "$out" = good ] && ok "part 1: the 4 MiB read back 4 times over the bad sectors" || bad "part 1: read: $out"
	bench_start 30 8M 24M 11
	bench_end "part 1: load over leg 1's bad sectors"
	read -r e1 r0 r1 < <(cst 'c["legs"][1]["errors"], s["leg_repairs"], c["legs"][1]["health"]' | tr -d "(),'")
	echo "leg 1: $e1 errors, $r0 repairs, $r1"
	[ "${e1:-0}" -gt 0 ] && [ "${r0:-0}" -gt 0 ] && [ "$r1" = healthy ] &&
		ok "part 1: $e1 read errors on leg 1 served from leg 0 and rewritten ($r0 repairs); leg 1 still healthy" ||
		bad "part 1: expected errors > 0, repairs > 0, leg 1 healthy"
	out=$(lba_io read 0 8192 --times 2 --expect "$W/a.img") || true
	[ "$out" = good ] && ok "part 1: the known range still reads back" || bad "part 1: read again: $out"

	echo "== 2. leg 1 holds a write with no answer"
	out=$(hmp 'qemu-io nv1 "break write_aio hang"')
	[ -z "$out" ] || bad "part 2: break: $out"
	bench_start 40 8M 24M 12
	leg1_failed() { [ "$(cst 'c["legs"][1]["health"], s["leg_timeouts"]' | tr -d "(),'")" = "failed 1" ]; }
	wait_for 120 "part 2: leg 1 failed by leg_timeout" leg1_failed && ok "part 2: leg 1 failed after leg_timeout (leg_timeouts 1)"
	out=$(hmp 'qemu-io nv1 "resume hang"')
	[ -z "$out" ] && ok "part 2: the held write released" || bad "part 2: resume: $out"
	bench_end "part 2: load across leg 1's hang"
	[ "$(cst 'c["state"]')" = degraded ] && ok "part 2: status degraded" || bad "part 2: not degraded"
	# refused while the device still holds the write the daemon gave up on: retry until answered
	replace() { out=$(gsh 'tierctl leg replace fast /dev/nvme1n1 /dev/nvme1n1 && echo REPLACED' | tr -d '\r'); [[ "$out" == *REPLACED* ]]; }
	wait_for 60 "part 2: leg replace" replace || echo "$out"
	bench_start 30 8M 24M 13
	leg1_healthy() { [ "$(cst 'c["legs"][1]["health"]')" = healthy ]; }
	wait_for 300 "part 2: leg 1 resynced" leg1_healthy && ok "part 2: leg 1 replaced with itself and resynced under load"
	bench_end "part 2: load during the resync"
	[ "$(cst 'c["state"]')" = healthy ] && ok "part 2: status healthy again" || bad "part 2: not healthy after the resync"

	echo "== 3. leg 1 dies: every I/O fails"
	local w0
	w0=$(cst 's["write_hits"] + s["write_misses"]')
	bench_start 40 8M 24M 14
	writes_past() { [ "$(cst 's["write_hits"] + s["write_misses"]')" -ge $((w0 + 200)) ]; }
	wait_for 60 "part 3: the load writing" writes_past
	out=$(hmp "qemu-io nv1 \"write -z $((LEG_SIZE - 512)) 512\"")
	# (qemu-io prints its result on QEMU's stdout, not in the reply)
	[ -z "$out" ] && grep -q "wrote 512/512 bytes at offset $((LEG_SIZE - 512))" "$W/qemu.out" &&
		ok "part 3: blkdebug on leg 1 moved to the state that fails every I/O" || bad "part 3: qemu-io write -z: $out"
	wait_for 120 "part 3: leg 1 failed" leg1_failed2 && ok "part 3: leg 1 failed"
	bench_end "part 3: load across leg 1's death"
	[ "$(cst 'c["state"], c["legs"][0]["health"]' | tr -d "(),'")" = "degraded healthy" ] &&
		ok "part 3: status degraded, leg 0 healthy" || bad "part 3: status"
	[ "$(lba_io write 8192 8192 "$W/b.img")" = good ] && ok "part 3: 4 MiB written while degraded" || bad "part 3: write"
	out=$(lba_io read 8192 8192 --times 2 --expect "$W/b.img") || true
	[ "$out" = good ] && ok "part 3: it reads back" || bad "part 3: read: $out"
	out=$(lba_io read 0 8192 --times 2 --expect "$W/a.img") || true
	[ "$out" = good ] && ok "part 3: the range written in part 1 reads back" || bad "part 3: read part 1: $out"
	gsh 'tail -40 /var/log/tiercached.log' | tr -d '\r'
}
leg1_failed2() { [ "$(cst 'c["legs"][1]["health"]')" = failed ]; }

stop() {
	[ -f "$W/qemu.pid" ] && kill "$(cat "$W/qemu.pid")" 2>/dev/null
	rm -f "$W/qemu.pid"
	true
}

case "${1:-all}" in
build) build ;;
boot) boot ;;
check) check; exit $RC ;;
stop) stop ;;
all) vm_all "leg faults on a guest NVMe drive" env TC_VM_DIR="$VMDIR" bash tests/system/run-vm-tcmu.sh setup ;;
*) echo "usage: $0 [build|boot|check|stop|all]"; exit 2 ;;
esac
