#!/bin/sh
# Probe the optional libraries the C core can use (zstd, io_uring) and write
# what was found as make assignments to OUT:
#
#   PROBE_CPPFLAGS := -DTF_HAVE_ZSTD=1 ...     macros and include flags
#   PROBE_LIBS     := -lzstd ...               link flags
#   PROBE_SUMMARY  := zstd: found (pkg-config); io_uring: not found: install ...
#
# This is the only probe: csrc/Makefile runs it on every build, and setup.py
# builds the core through the Makefile, so both always agree. OUT is rewritten
# only when its content changes, so that its date can serve as a dependency.
#
# Usage: CC=cc sh csrc/configure.sh OUT
# Environment: NO_ZSTD=1 or TOKENFEED_NO_ZSTD=1 leaves zstd out;
#              NO_IO_URING=1 or TOKENFEED_NO_IO_URING=1 leaves io_uring out.
#
# Each library: pkg-config first (its flags are kept only if a test program
# compiles and links with them), then a plain -l<name> with the compiler's
# default paths. The summary of a library not found names the packages that
# provide it; tokenfeed.build_info() and `tokenfeed build-info` show it.
set -u
out=${1:?usage: configure.sh OUT}
CC=${CC:-cc}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tokenfeed-probe.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT

cppflags=
libs=
summary=

# links CODE FLAGS...: whether CODE compiles and links with FLAGS.
links() {
    code=$1
    shift
    printf '%s\n' "$code" >"$tmp/probe.c"
    # shellcheck disable=SC2086
    $CC "$tmp/probe.c" -o "$tmp/probe" "$@" >/dev/null 2>&1
}

# probe NAME DISABLED PKGCONFIG MACRO LIB PACKAGES CODE
probe() {
    name=$1 disabled=$2 pc=$3 macro=$4 lib=$5 packages=$6 code=$7
    if [ -n "$disabled" ] && [ "$disabled" != 0 ]; then
        status="disabled by TOKENFEED_NO_$(echo "$name" | tr a-z A-Z)=1"
    elif pcflags=$(pkg-config --cflags "$pc" 2>/dev/null) && pclibs=$(pkg-config --libs "$pc" 2>/dev/null) &&
        # shellcheck disable=SC2086
        links "$code" $pcflags $pclibs; then
        status="found (pkg-config)"
        cppflags="$cppflags -D$macro=1 $pcflags"
        libs="$libs $pclibs"
    elif links "$code" "-l$lib"; then
        status="found (compiler search path)"
        cppflags="$cppflags -D$macro=1"
        libs="$libs -l$lib"
    else
        status="not found: install $packages, then rebuild"
    fi
    summary="$summary${summary:+; }$name: $status"
}

probe zstd "${NO_ZSTD:-${TOKENFEED_NO_ZSTD:-}}" libzstd TF_HAVE_ZSTD zstd \
    "libzstd-dev (Debian/Ubuntu) or libzstd-devel (Fedora/RHEL)" \
    '#include <zstd.h>
int main(void) { return ZSTD_versionNumber() == 0; }'
probe io_uring "${NO_IO_URING:-${TOKENFEED_NO_IO_URING:-}}" liburing TF_HAVE_IO_URING uring \
    "liburing-dev (Debian/Ubuntu) or liburing-devel (Fedora/RHEL)" \
    '#include <liburing.h>
int main(void) { struct io_uring r; return io_uring_queue_init(1, &r, 0) == 12345; }'

{
    echo "PROBE_CPPFLAGS :=$cppflags"
    echo "PROBE_LIBS :=$libs"
    echo "PROBE_SUMMARY := $summary"
} >"$tmp/out"
mkdir -p "$(dirname "$out")"
if ! cmp -s "$tmp/out" "$out"; then
    mv "$tmp/out" "$out.new" && mv "$out.new" "$out"
fi
