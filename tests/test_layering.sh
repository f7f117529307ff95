#!/usr/bin/env bash
# tests/test_layering.sh - the layering rules, checked so they cannot drift.
#
#  1. backstore/ (the SCSI layer) includes of cache/ only its public header
#     cache/cache.h, and of bdev/ only the generic interface bdev/bdev.h;
#  2. target/ (the iSCSI portal and the TCMU front end) includes nothing of
#     cache/ or bdev/;
#  3. every header of the daemon compiles on its own (it includes what it
#     uses), with the project's flags;
#  4. make CFLAGS=... keeps the required flags (-I. -D_GNU_SOURCE -Werror and
#     the warnings): a user's CFLAGS replaces only optimisation and debug;
#  5. a quoted include is written one way, from the top of the tree
#     ("cache/meta.h", never "meta.h" or "../cache/meta.h"); tests/tools/
#     is the exception: standalone initiators the shell tests and the
#     guests compile by hand, without the build's -I., next to their
#     tc_iscsi.h.
. "$(dirname "$0")/lib.sh"
cd "$TC_ROOT" || exit 2
tc_tmpdir

# the quoted includes of the files under DIR: "file: path" per line, paths
# resolved against the including file's folder and the top
includes() {
	local f inc dir
	for f in $(find "$1" -name '*.[ch]' | sort); do
		dir=$(dirname "$f")
		sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f" | while read -r inc; do
			if [ -f "$dir/$inc" ]; then
				echo "$f: $(realpath --relative-to=. "$dir/$inc")"
			else
				echo "$f: $inc"
			fi
		done
	done
}

bad=$(includes backstore | grep -E ': (cache|bdev)/' | grep -vE ': (cache/cache\.h|bdev/bdev\.h)$' || true)
[ -z "$bad" ] || fail "backstore/ reaches past cache/cache.h or bdev/bdev.h:
$bad"
pass "backstore/ includes of cache/ and bdev/: only cache/cache.h and bdev/bdev.h"

bad=$(includes target | grep -E ': (cache|bdev)/' || true)
[ -z "$bad" ] || fail "target/ includes the cache or the block-device layer:
$bad"
pass "target/ includes nothing of cache/ or bdev/"

flags=$(make -s --no-print-directory -p -n 2>/dev/null | sed -n 's/^BASE_CFLAGS := //p' | head -1)
[ -n "$flags" ] || fail "cannot read BASE_CFLAGS from the Makefile"
n=0
for h in $(find backstore bdev cache common config daemon target tools -name '*.h' | sort); do
	printf '#include "%s"\n' "$h" >"$T/one.c"
	# shellcheck disable=SC2086
	out=$(${CC:-cc} $flags -fsyntax-only "$T/one.c" 2>&1) || fail "$h does not compile on its own:
$out"
	n=$((n + 1))
done
[ "$n" -gt 30 ] || fail "only $n headers found"
pass "all $n headers compile on their own"

cmd=$(make -n -B CFLAGS=-O0 build/obj/common/log.o 2>/dev/null | grep -- ' -c common/log.c')
for want in -I. -D_GNU_SOURCE -Werror -Wall -Wextra -O0; do
	case " $cmd " in
	*" $want "*) ;;
	*) fail "make CFLAGS=-O0 compiles without $want: $cmd" ;;
	esac
done
pass "make CFLAGS=-O0 keeps -I. -D_GNU_SOURCE -Werror and the warnings"

bad=$(for d in backstore bdev cache common config daemon target tools tests/unit tests/fuzz tests/bench; do
	find "$d" -name '*.[ch]'
done | sort | while read -r f; do
	sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f" | while read -r inc; do
		[ -f "$inc" ] || echo "$f: \"$inc\""
	done
done)
[ -z "$bad" ] || fail "quoted includes not written from the top of the tree:
$bad"
pass "quoted includes are written from the top of the tree"
