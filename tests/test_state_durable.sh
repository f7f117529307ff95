#!/usr/bin/env bash
# Each small state file the daemon makes (a LUN's auto serial, the image
# generation its cached copies belong to) is written whole and durably:
# under strace, every such file is written as FILE.tmp, fsynced, renamed
# over FILE, and then its directory is opened and fsynced, in that order
# on one thread. Without the directory's fsync a power cut may lose the
# rename, and the LUN comes back with a new serial: another disk, to a host.
# (The reservations file takes the same path, common/statefile.c.)
. "$(dirname "$0")/lib.sh"
tc_tmpdir
command -v strace >/dev/null || skip "strace is not installed"
port=$(tc_free_port)
iqn=iqn.2026-12.io.tiercache:state
{
	tc_conf_head "$port"
	printf '\n[target %s]\nlun0 = plain\nlun1 = cached\n' "$iqn"
	printf '\n[lun plain]\nbacking = %s/plain.img\nsize = 4M\n' "$T"
	printf '\n[lun cached]\nbacking = %s/cached.img\nsize = 4M\ncache = fast\n' "$T"
	printf '\n[cache fast]\nlegs = %s/leg0.img %s/leg1.img\nsize = 32M\nmode = write-back\n' "$T" "$T"
} >"$T/t.conf"
strace -f -qq -o "$T/trace" -e trace=openat,close,rename,renameat,renameat2,fsync,fdatasync "$TC_BIN" -c "$T/t.conf" \
	>>"$T/daemon.log" 2>&1 &
STRACE_PID=$!
trap 'kill -KILL $STRACE_PID 2>/dev/null; _tc_cleanup' EXIT
tc_until 120 grep -q 'ready:' "$T/daemon.log" || fail "the daemon did not get ready under strace: $(tail -5 "$T/daemon.log")"
TC_PID=$(pgrep -P "$STRACE_PID" -x tiercached)
[ -n "$TC_PID" ] || fail "no tiercached under strace"
kill -TERM "$TC_PID"
tc_until 60 eval '! kill -0 $STRACE_PID 2>/dev/null' || fail "the daemon did not stop"
TC_PID=
files=$(ls "$T/state" | grep -E '\.serial$|\.owner-gen$' | sort | tr '\n' ' ')
[ -n "$files" ] || fail "the daemon made no state files: $(ls "$T/state")"
echo "$files" | grep -q 'lun-plain.serial' && echo "$files" | grep -q 'lun-cached.serial' ||
	fail "the auto serials are not in state_dir: $files"
out=$(python3 - "$T/trace" "$T/state" $files <<'PY'
import re, sys
trace, state, names = sys.argv[1], sys.argv[2], sys.argv[3:]
lines = [l.rstrip("\n") for l in open(trace)]
bad = []
for name in names:
    path = state + "/" + name
    tmp = path + ".tmp"
    # per thread: openat(tmp) = fd; fsync(fd) = 0 before close(fd); rename(tmp, path) = 0;
    # openat(state, O_DIRECTORY) = d; fsync(d) = 0 before close(d)
    steps = {}
    done = False
    for l in lines:
        m = re.match(r"(\d+)\s+(.*)", l)
        if not m:
            continue
        tid, call = m.group(1), m.group(2)
        st = steps.setdefault(tid, {"stage": 0, "far": 0})
        st["far"] = max(st["far"], st["stage"])
        if st["stage"] == 0:
            m2 = re.match(r'openat\(AT_FDCWD, "%s", [^)]*O_CREAT[^)]*\) = (\d+)' % re.escape(tmp), call)
            if m2:
                st.update(stage=1, fd=m2.group(1))
        elif st["stage"] == 1 and re.match(r"f(data)?sync\(%s\) += 0" % st["fd"], call):
            st["stage"] = 2
        elif st["stage"] == 1 and re.match(r"close\(%s\)" % st["fd"], call):
            st["stage"] = 0  # closed unsynced
        elif st["stage"] == 2 and re.match(r'rename(at2?)?\(.*"%s",.*"%s".*\) = 0' % (re.escape(tmp), re.escape(path)), call):
            st["stage"] = 3
        elif st["stage"] == 3:
            m2 = re.match(r'openat\(AT_FDCWD, "%s/?", [^)]*O_DIRECTORY[^)]*\) = (\d+)' % re.escape(state), call)
            if m2:
                st.update(stage=4, dfd=m2.group(1))
        elif st["stage"] == 4 and re.match(r"f(data)?sync\(%s\) += 0" % st["dfd"], call):
            done = True
            break
        elif st["stage"] == 4 and re.match(r"close\(%s\)" % st["dfd"], call):
            st["stage"] = 3  # closed unsynced
    if not done:
        far = max((max(s["far"], s["stage"]) for s in steps.values()), default=0)
        what = ["open of the .tmp", "fsync of the .tmp", "rename", "open of the directory", "fsync of the directory"][far]
        bad.append("%s: stops before the %s" % (name, what))
print("; ".join(bad) if bad else "ok %d" % len(names))
PY
)
[ "${out%% *}" = ok ] || fail "a state file is not written durably: $out"
pass "state files written as .tmp, fsync, rename, fsync of state_dir ($files)"
