#!/usr/bin/env bash
# `make install` lays out the expected tree under DESTDIR (binaries, unit,
# man pages, example config that is never overwritten), the unit asks for
# what the daemon relies on (Type=notify, watchdog, restart, sandbox), and
# `systemd-analyze verify` finds nothing to complain about in it.
. "$(dirname "$0")/lib.sh"
tc_tmpdir
cd "$TC_ROOT"

stage=$T/stage
make -s install DESTDIR="$stage" PREFIX=/usr >"$T/install.log" 2>&1 || fail "make install failed: $(tail -5 "$T/install.log")"
expected="/etc/tiercache/tiercached.conf 640
/usr/lib/systemd/system/tiercached.service 644
/usr/sbin/tiercached 755
/usr/sbin/tierctl 755
/usr/share/doc/tiercache/examples/quickstart.conf 644
/usr/share/doc/tiercache/examples/tiercached.conf 644
/usr/share/man/man5/tiercached.conf.5 644
/usr/share/man/man8/tiercached.8 644
/usr/share/man/man8/tierctl.8 644"
got=$(cd "$stage" && find . -type f -printf '/%P %m\n' | sort)
[ "$got" = "$expected" ] || fail "installed tree differs:
$got
--- expected ---
$expected"
pass "make install DESTDIR=... PREFIX=/usr installs exactly the expected files and modes"

grep -q '^ExecStart=/usr/sbin/tiercached -c /etc/tiercache/tiercached.conf$' "$stage/usr/lib/systemd/system/tiercached.service" ||
	fail "installed unit does not start /usr/sbin/tiercached"
"$stage/usr/sbin/tiercached" -c "$stage/etc/tiercache/tiercached.conf" --check >/dev/null ||
	fail "the installed example configuration does not pass --check"
pass "installed unit starts /usr/sbin/tiercached; the installed config passes --check"

echo "; edited by the admin" >>"$stage/etc/tiercache/tiercached.conf"
make -s install DESTDIR="$stage" PREFIX=/usr >/dev/null 2>&1 || fail "second make install failed"
grep -q "edited by the admin" "$stage/etc/tiercache/tiercached.conf" || fail "make install overwrote the admin's config"
pass "a second make install keeps the admin's configuration"

make -s install DESTDIR="$T/local" >/dev/null 2>&1 || fail "make install with the default PREFIX failed"
grep -q '^ExecStart=/usr/local/sbin/tiercached ' "$T/local/usr/local/lib/systemd/system/tiercached.service" ||
	fail "with PREFIX=/usr/local the unit does not point at /usr/local/sbin"
[ -x "$T/local/usr/local/sbin/tiercached" ] && [ -f "$T/local/usr/local/share/man/man8/tierctl.8" ] ||
	fail "default PREFIX tree incomplete"
pass "default PREFIX=/usr/local: unit rewritten to /usr/local/sbin/tiercached"

unit=systemd/tiercached.service
for want in '^Type=notify$' '^WatchdogSec=' '^Restart=on-failure$' '^After=.*network-online.target' \
	'^After=.*target.service' '^Wants=network-online.target' '^ExecReload=/bin/kill -HUP \$MAINPID$' \
	'^ProtectSystem=strict$' '^StateDirectory=tiercache$' '^RuntimeDirectory=tiercache$' '^NoNewPrivileges=yes$' \
	'^CapabilityBoundingSet=.*CAP_SYS_ADMIN' '^CapabilityBoundingSet=.*CAP_NET_BIND_SERVICE' \
	'^DeviceAllow=block-\* rw$' '^DeviceAllow=char-uio rw$' '^DeviceAllow=char-nvme rw$'; do
	grep -qE "$want" "$unit" || fail "$unit lacks $want"
done
pass "unit: notify + watchdog + restart, ordering, reload, sandbox, capabilities, devices"

if ! command -v systemd-analyze >/dev/null; then
	skip "systemd-analyze is not installed; the install tree checks passed"
fi
# verify resolves ExecStart= and the man: links, so point it at an install
# whose paths exist on this machine
make -s install PREFIX="$T/v/usr" SYSCONFDIR="$T/v/etc" >/dev/null 2>&1 || fail "make install PREFIX=$T/v/usr failed"
out=$(cd "$T" && MANPATH="$T/v/usr/share/man" systemd-analyze verify "$T/v/usr/lib/systemd/system/tiercached.service" 2>&1)
rc=$?
[ $rc = 0 ] && [ -z "$out" ] || fail "systemd-analyze verify (rc $rc): $out"
pass "systemd-analyze verify: clean"
# the repository copy differs only in paths: everything else it says must be about them
out=$(cd "$T" && systemd-analyze verify --man=no "$TC_ROOT/$unit" 2>&1 | grep -v 'Command /usr/sbin/tiercached is not executable')
[ -z "$out" ] || fail "systemd-analyze verify $unit: $out"
pass "systemd-analyze verify systemd/tiercached.service: nothing beyond the not-yet-installed binary"
