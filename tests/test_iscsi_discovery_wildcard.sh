#!/usr/bin/env bash
# SendTargets with a wildcard listen address (issue 14 part 6): a host
# that discovers through one portal must learn every portal of the
# target. A wildcard listen (0.0.0.0:P) is reachable at whatever address
# the host reached us on, so it is named with that address and its own
# port; a specific listen address (127.0.0.2:P2) is named as it is. Two
# discoveries, through the wildcard at 127.0.0.3 and through 127.0.0.2:P2,
# must each name exactly the two portals the host can use from there.
. "$(dirname "$0")/lib.sh"
tc_tmpdir
command -v iscsi-ls >/dev/null || skip "libiscsi's iscsi-ls is not installed"

p1=$(tc_free_port)
p2=$(tc_free_port)
iqn=iqn.2026-12.io.tiercache:wild
tc_conf_head "$p1" | sed -e "s|^listen = .*|listen = 0.0.0.0:$p1\nlisten = 127.0.0.2:$p2|" >"$T/t.conf"
cat >>"$T/t.conf" <<CONF

[target $iqn]
lun0 = d

[lun d]
backing = $T/d.img
size = 16M
CONF
tc_start "$T/t.conf"

portals() { # URL: the sorted portals iscsi-ls lists for the target
	iscsi-ls -s "$1" 2>&1 | sed -n "s|^Target:$iqn Portal:||p" | sort | tr '\n' ' '
}
sorted() { printf '%s\n' "$@" | sort | tr '\n' ' '; }
got=$(portals "iscsi://127.0.0.3:$p1/")
want=$(sorted "127.0.0.3:$p1,1" "127.0.0.2:$p2,1")
[ "$got" = "$want" ] || fail "discovery through the wildcard at 127.0.0.3:$p1 lists \"$got\", not \"$want\""
pass "discovery through the wildcard (0.0.0.0:$p1) at 127.0.0.3 lists the wildcard at 127.0.0.3 and 127.0.0.2:$p2"
got=$(portals "iscsi://127.0.0.2:$p2/")
want=$(sorted "127.0.0.2:$p1,1" "127.0.0.2:$p2,1")
[ "$got" = "$want" ] || fail "discovery through 127.0.0.2:$p2 lists \"$got\", not \"$want\""
pass "discovery through 127.0.0.2:$p2 lists it and the wildcard's port at 127.0.0.2 ($p1)"
