#!/usr/bin/env bash
# device_run.sh — tools/device_check.sh on a lent GPU machine that cannot
# reach a package registry (issue 20): the build's Debian packages travel
# as .debs and are unpacked into a prefix there, never over its own /.
#
#   tools/device_run.sh --fetch        (here: the .debs into .devdebs/,
#                                       about 4 MB; ignore it in git)
#   tools/device_run.sh [REPORT]       (there, with .devdebs carried:
#                                       unpack, set the search paths, run
#                                       tools/device_check.sh REPORT)
#
# The machine's own libraries come first (LD_LIBRARY_PATH lists its
# directories before the prefix's), so its tools keep theirs and the
# prefix only fills what it lacks; the build links against the prefix
# (pkg-config's sysroot).
set -u
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
PKGS=(libluajit2-5.1-dev libluajit2-5.1-2 libuv1-dev libuv1 libmsgpack-dev libmsgpackc2 libutf8proc-dev
      libutf8proc2 libcjson-dev libcjson1 libjansson-dev libjansson4 libxxhash-dev libxxhash0 libhttp-parser-dev
      libhttp-parser2.9 libedit-dev libedit2 libbsd-dev libbsd0 libmd-dev libmd0 libncurses-dev libncurses6
      libncursesw6 libtinfo6 zlib1g-dev zlib1g pkgconf pkgconf-bin libpkgconf3)
if [ "${1:-}" = "--fetch" ]; then
    rm -rf .devdebs && mkdir -p .devdebs && (cd .devdebs && apt-get download "${PKGS[@]}") || exit 1
    du -sh .devdebs
    exit 0
fi
echo "machine: $(. /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-unknown}"), $(ldd --version 2>/dev/null | head -1)"
P="${LI_DEPS_PREFIX:-/opt/luainfer-deps}"
if ls .devdebs/*.deb > /dev/null 2>&1; then
    mkdir -p "$P"
    for f in .devdebs/*.deb; do
        # ar + tar: no dpkg needed; a member data.tar.{xz,zst,gz}
        m="$(ar t "$f" | grep '^data\.tar')"
        case "$m" in
            *.xz) ar p "$f" "$m" | tar -xJ -C "$P" ;;
            *.zst) ar p "$f" "$m" | zstd -dc | tar -x -C "$P" ;;
            *) ar p "$f" "$m" | tar -xz -C "$P" ;;
        esac || echo "device_run: cannot unpack $f" >&2
    done
    export PATH="$PATH:$P/usr/bin:/usr/local/cuda/bin"
    export PKG_CONFIG_SYSROOT_DIR="$P"
    export PKG_CONFIG_LIBDIR="$P/usr/lib/x86_64-linux-gnu/pkgconfig:$P/usr/share/pkgconfig"
    export LIBRARY_PATH="$P/usr/lib/x86_64-linux-gnu:$P/lib/x86_64-linux-gnu${LIBRARY_PATH:+:$LIBRARY_PATH}" # a .pc whose libdir is not the multiarch one
    export LD_LIBRARY_PATH="/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$P/usr/lib/x86_64-linux-gnu:$P/lib/x86_64-linux-gnu"
    command -v pkg-config > /dev/null || ln -sf "$P/usr/bin/pkgconf" "$P/usr/bin/pkg-config"
else
    echo "device_run: no .devdebs/ carried: the machine's own packages must do" >&2
    export PATH="$PATH:/usr/local/cuda/bin"
fi
command -v nvcc > /dev/null && export CUDACXX="$(command -v nvcc)"
exec tools/device_check.sh "$@"
