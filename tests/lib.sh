# tests/lib.sh - shared helpers for the shell tests (source it).
#
# Each test script is run from the top of the repository by tests/run.sh.
# Exit status: 0 pass, 77 skip, anything else fail. Helpers:
#   tc_tmpdir            -> $T, a scratch directory removed at exit
#   tc_free_port         -> prints a free TCP port on 127.0.0.1
#   tc_start CONF [ARGS] -> starts build/tiercached on CONF in the background,
#                           log in $T/daemon.log, waits (up to 60 s) until
#                           every listen port accepts; sets TC_PID
#   tc_stop              -> SIGTERM, waits; fails the test if the daemon did
#                           not exit 0 within 60 s, or its log holds a
#                           sanitizer report
#   tc_wait_for SECS WHAT CMD [ARGS] -> runs CMD every 0.1 s until it
#                           succeeds; fails the test with WHAT after SECS s
#   tc_until SECS CMD [ARGS] -> the same, but returns 1 on timeout (for
#                           callers that must clean up before failing)
#   tc_check_sanitizers [LOG] -> fails the test if LOG ($T/daemon.log) holds
#                           an ASan, LSan or UBSan report; the exit trap
#                           checks $T/daemon.log too, after any kill -9
#   tc_cu_target_conf IQN KIND [SERIAL] -> the config of a target for
#                           libiscsi's suite (see below)
#   fail MSG / skip MSG / pass MSG
#   expect_eq A B WHAT   -> fail unless A = B
#
# Waits: a test waits for the thing it needs (a log line, a file's content,
# a process gone) with tc_wait_for, never with a fixed sleep, and bounds
# the wait generously (30-60 s): two busy cores make anything slow, and
# only a wait that never ends is a failure. A sleep is for letting a load
# run for a while on purpose.

set -u
TC_ROOT=${TC_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
TC_BIN=${TC_BIN:-$TC_ROOT/build/tiercached}
# where a test keeps the logs worth a look after it (tests/run.sh points the
# ASan runs at a folder of their own)
TC_LOGS=${TC_LOGS:-$TC_ROOT/build/test-logs}
TC_PID=
_tc_reported=
T=

fail() { echo "FAIL: $*" >&2; [ -n "$T" ] && [ -f "$T/daemon.log" ] && { echo "--- daemon log (tail) ---" >&2; tail -n 30 "$T/daemon.log" >&2; }; exit 1; }
skip() { echo "SKIP: $*"; exit 77; }
pass() { echo "ok: $*"; }
expect_eq() { [ "$1" = "$2" ] || fail "$3: expected '$2', got '$1'"; pass "$3"; }

# the first sanitizer report in a log, with the stack under it; status 1 if none
_tc_sanitizer_report() {
	grep -m1 -A40 -E '^==[0-9]+==ERROR: [A-Za-z]+Sanitizer|runtime error:' "$1" 2>/dev/null
}

tc_check_sanitizers() {
	local log=${1:-$T/daemon.log} report
	[ -f "$log" ] || return 0
	report=$(_tc_sanitizer_report "$log") || return 0
	_tc_reported=1
	echo "FAIL: a sanitizer report in the daemon log:" >&2
	echo "$report" >&2
	exit 1
}

_tc_cleanup() {
	# helpers the test left running in the background (a scsi_probe session,
	# a load): none outlives its test
	local j
	for j in $(jobs -p); do
		[ "$j" = "$TC_PID" ] || kill "$j" 2>/dev/null
	done
	if [ -n "$TC_PID" ] && kill -0 "$TC_PID" 2>/dev/null; then
		kill -KILL "$TC_PID" 2>/dev/null
		wait "$TC_PID" 2>/dev/null
	fi
	# a daemon of an ASan build that died of a report the test did not
	# notice (a kill -9 test takes a dead daemon for its own kill)
	local report=
	[ -n "$T" ] && [ -f "$T/daemon.log" ] && [ -z "${_tc_reported:-}" ] && report=$(_tc_sanitizer_report "$T/daemon.log")
	[ -n "$T" ] && [ -z "${TC_KEEP:-}" ] && rm -rf "$T"
	if [ -n "$report" ]; then
		echo "FAIL: a sanitizer report in the daemon log:" >&2
		echo "$report" >&2
		exit 1
	fi
	return 0
}

tc_tmpdir() {
	T=$(mktemp -d "${TMPDIR:-/tmp}/tiercache-test.XXXXXX") || { echo "FAIL: cannot make a scratch directory" >&2; exit 1; }
	[ -n "$T" ] && [ -d "$T" ] || { echo "FAIL: no scratch directory" >&2; exit 1; }
	trap _tc_cleanup EXIT
}

tc_free_port() {
	python3 - <<'PY'
import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()
PY
}

# tc_until SECS CMD [ARGS...]: run CMD (quietly is the caller's business)
# until it succeeds, every 0.1 s, for up to SECS seconds. 0 once it
# succeeded, 1 if SECS passed without (CMD has then run at least once
# after the deadline).
tc_until() {
	local secs=$1 end
	shift
	end=$((SECONDS + secs))
	until "$@"; do
		[ "$SECONDS" -lt "$end" ] || return 1
		sleep 0.1
	done
}

# tc_wait_for SECS WHAT CMD [ARGS...]: tc_until, failing the test with
# "WHAT: not within SECS s" on timeout.
tc_wait_for() {
	local secs=$1 what=$2
	shift 2
	tc_until "$secs" "$@" || fail "$what: not within $secs s"
}

# tc_gone PID: true once PID has exited (for tc_wait_for)
tc_gone() { ! kill -0 "$1" 2>/dev/null; }

# wait until host:port accepts a TCP connection (up to $2 seconds)
tc_wait_port() {
	local port=$1 secs=${2:-60} host=${3:-127.0.0.1} i
	for ((i = 0; i < secs * 10; i++)); do
		if (exec 3<>/dev/tcp/"$host"/"$port") 2>/dev/null; then
			return 0
		fi
		kill -0 "$TC_PID" 2>/dev/null || return 1
		sleep 0.1
	done
	return 1
}

tc_start() {
	local conf=$1
	shift
	"$TC_BIN" -c "$conf" "$@" >>"$T/daemon.log" 2>&1 &
	TC_PID=$!
	local port host
	# listen = HOST:PORT: an IPv4 literal is waited on where it is, anything else on 127.0.0.1
	while read -r host port; do
		[[ "$host" =~ ^[0-9.]+$ ]] && [ "$host" != 0.0.0.0 ] || host=127.0.0.1
		tc_wait_port "$port" 60 "$host" || fail "daemon did not start listening on $host:$port"
	done < <(sed -n 's/^[[:space:]]*listen[[:space:]]*=[[:space:]]*\(.*\):\([0-9][0-9]*\).*/\1 \2/p' "$conf")
}

tc_stop() {
	[ -n "$TC_PID" ] || return 0
	kill -TERM "$TC_PID" 2>/dev/null
	local i rc
	for ((i = 0; i < 600; i++)); do
		kill -0 "$TC_PID" 2>/dev/null || break
		sleep 0.1
	done
	if kill -0 "$TC_PID" 2>/dev/null; then
		# where each thread is, for the log: a hang is a bug to find
		if command -v gdb >/dev/null; then
			echo "--- threads of the daemon that did not stop (gdb) ---" >>"$T/daemon.log"
			timeout 60 gdb -p "$TC_PID" -batch -ex "thread apply all bt" >>"$T/daemon.log" 2>&1
		fi
		kill -KILL "$TC_PID"
		fail "daemon did not exit within 60 s of SIGTERM (thread stacks in its log)"
	fi
	wait "$TC_PID"
	rc=$?
	TC_PID=
	tc_check_sanitizers
	[ "$rc" = 0 ] || fail "daemon exited with status $rc after SIGTERM"
}

# A small ext4 filesystem of SIZE on a loop device, mounted at $T/fs, for
# backing stores that fill up; skips without root or a loop device. At
# exit the daemon is killed first (it holds files there open), then the
# filesystem is unmounted (lazily if it is still busy), then the rest.
# usage: tc_loop_fs SIZE
tc_loop_fs() {
	[ "$(id -u)" = 0 ] || skip "needs root to mount a loop device"
	truncate -s "$1" "$T/fs.img" && mkfs.ext4 -q -F "$T/fs.img" || fail "mkfs.ext4 failed"
	mkdir -p "$T/fs"
	mount -o loop "$T/fs.img" "$T/fs" 2>"$T/mount.log" ||
		skip "cannot mount a loop device: $(head -c 200 "$T/mount.log")"
	trap '[ -n "$TC_PID" ] && kill -KILL "$TC_PID" 2>/dev/null && wait "$TC_PID" 2>/dev/null
		umount "$T/fs" 2>/dev/null || umount -l "$T/fs" 2>/dev/null; _tc_cleanup' EXIT
}

# A backing file that can stop answering: tests/tools/freeze_fs (FUSE)
# serves $T/ff.img, SIZE bytes, as $T/ff/disk. tc_freeze holds every read,
# write, fsync and fallocate of it unanswered until tc_thaw; tc_held prints
# how many are held now. Skips without FUSE (the fuse3 library, /dev/fuse,
# a mount). At exit the file is thawed and the daemon killed, then the file
# system unmounted.
# usage: tc_freeze_fs SIZE
tc_freeze_fs() {
	[ -c /dev/fuse ] || skip "no /dev/fuse"
	pkg-config --exists fuse3 || skip "the fuse3 library is not installed (libfuse3-dev)"
	# shellcheck disable=SC2046
	cc -std=gnu11 -O2 -Wall -Wextra -o "$T/freeze_fs" "$TC_ROOT/tests/tools/freeze_fs.c" \
		$(pkg-config --cflags --libs fuse3) 2>"$T/cc-freeze_fs.log" ||
		fail "cannot build tests/tools/freeze_fs.c: $(head -5 "$T/cc-freeze_fs.log")"
	truncate -s "$1" "$T/ff.img" && mkdir -p "$T/ff" || fail "cannot make $T/ff.img"
	"$T/freeze_fs" "$T/ff.img" "$T/ff" -f -o max_threads=256 >"$T/freeze_fs.log" 2>&1 &
	TC_FF_PID=$!
	trap 'kill -USR2 "$TC_FF_PID" 2>/dev/null
		[ -n "$TC_PID" ] && kill -KILL "$TC_PID" 2>/dev/null && wait "$TC_PID" 2>/dev/null
		fusermount3 -u "$T/ff" 2>/dev/null || fusermount -u "$T/ff" 2>/dev/null || umount -l "$T/ff" 2>/dev/null
		kill "$TC_FF_PID" 2>/dev/null; wait "$TC_FF_PID" 2>/dev/null; _tc_cleanup' EXIT
	tc_until 10 test -e "$T/ff/held" ||
		skip "cannot mount the FUSE file system: $(head -c 200 "$T/freeze_fs.log")"
}
# tc_freeze returns once freeze_fs says it is frozen: the signal is handled
# when one of its threads next runs, and a request arriving before that
# would pass (a busy machine made a GET LBA STATUS pass that way)
tc_frozen() { [ "$(awk '{ print $1 }' "$T/ff/held")" = 1 ]; }
tc_freeze() { kill -USR1 "$TC_FF_PID"; tc_until 10 tc_frozen || fail "freeze_fs did not freeze within 10 s"; }
tc_thaw() { kill -USR2 "$TC_FF_PID"; }
tc_held() { awk '{ print $2 }' "$T/ff/held"; }

# scsi_probe sessions (tests/tools/scsi_probe.c) held open through two
# FIFOs while a test changes things on the target, after tc_build_tool
# scsi_probe. tc_probe_open NAME URL logs one in; tc_probe NAME COMMAND...
# runs one command and sets $reply; tc_probe_byte N / tc_probe_be32 N read
# the data of a "good HEX" reply.
declare -A TC_PROBE_IN TC_PROBE_OUT
tc_probe_open() {
	mkfifo "$T/$1.in" "$T/$1.out"
	"$T/scsi_probe" "$2" <"$T/$1.in" >"$T/$1.out" 2>&1 &
	local i o
	exec {i}>"$T/$1.in" {o}<"$T/$1.out"
	TC_PROBE_IN[$1]=$i TC_PROBE_OUT[$1]=$o
	IFS= read -r -t 60 reply <&"$o" && [ "$reply" = ready ] || fail "scsi_probe $1 did not log in: $reply"
}
tc_probe() {
	local who=$1
	shift
	echo "$*" >&"${TC_PROBE_IN[$who]}"
	IFS= read -r -t 60 reply <&"${TC_PROBE_OUT[$who]}" || fail "scsi_probe $who did not answer: $*"
}
tc_probe_close() { eval "exec ${TC_PROBE_IN[$1]}>&-"; }
tc_probe_byte() { echo $((16#${reply:$((5 + 2 * $1)):2})); }
tc_probe_be32() { echo $((16#${reply:$((5 + 2 * $1)):8})); }

# Build a test client of tests/tools against libiscsi into $T.
# usage: tc_build_tool NAME   (tests/tools/NAME.c -> $T/NAME)
tc_build_tool() {
	cc -std=gnu11 -O2 -Wall -Wextra -o "$T/$1" "$TC_ROOT/tests/tools/$1.c" -liscsi 2>"$T/cc-$1.log" ||
		fail "cannot build tests/tools/$1.c against libiscsi: $(head -5 "$T/cc-$1.log")"
}

# The [daemon] and [portal] sections of a test's config: state in $T/state,
# the portal on 127.0.0.1:PORT.   usage: tc_conf_head PORT
tc_conf_head() {
	cat <<CONF
[daemon]
state_dir = $T/state
control_socket = $T/state/control.sock
log_level = info

[portal]
listen = 127.0.0.1:$1
CONF
}

# A minimal config: one target, one LUN of SIZE on a sparse file in $T.
# usage: tc_basic_conf PORT [SIZE] [BLOCK_SIZE] > file
tc_basic_conf() {
	tc_conf_head "$1"
	cat <<CONF

[target iqn.2026-11.io.tiercache:test]
lun0 = disk0

[lun disk0]
backing = $T/disk0.img
size = ${2:-64M}
block_size = ${3:-512}
CONF
}

# The target the libiscsi suite (iscsi-test-cu) runs on, as the conformance
# test and tests/tools/replay_compare.sh set it up: target IQN-KIND, its
# LUN 0 a 256 MiB file $T/KIND.img of 512-byte blocks. KIND plain is the
# file alone; write-back and write-through put a cache set of that mode in
# front of it, two 64 MiB file legs, smaller than the LUN so that the
# suite's whole-LUN writes (WRITE SAME, SANITIZE) evict and destage, with
# every miss promoted and no sequential bypass so that the suite's I/O goes
# through the cache rather than around it. SERIAL, if given, is the LUN's
# serial (else serial = auto, a random one).
# usage: tc_cu_target_conf IQN KIND [SERIAL] >> file
tc_cu_target_conf() {
	local iqn=$1 kind=$2 serial=${3:-}
	cat <<CONF

[target $iqn-$kind]
lun0 = $kind

[lun $kind]
backing = $T/$kind.img
size = 256M
block_size = 512
CONF
	[ -n "$serial" ] && echo "serial = $serial"
	[ "$kind" = plain ] && return 0
	cat <<CONF
cache = $kind

[cache $kind]
legs = $T/$kind-leg0.img $T/$kind-leg1.img
size = 64M
extent = 256K
mode = $kind
admit_hits = 1
seq_cutoff = 0
CONF
}
