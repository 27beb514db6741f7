#!/usr/bin/env bash
# Builds clink's C library (release) and installs it under PREFIX:
#   PREFIX/lib/libclink.so, PREFIX/lib/libclink.a, PREFIX/include/clink.h,
#   PREFIX/lib/pkgconfig/clink.pc
# Then: PKG_CONFIG_PATH=PREFIX/lib/pkgconfig cc app.c $(pkg-config --cflags --libs clink)
# (static: pkg-config --static --libs clink, with -l:libclink.a or without the .so).
# CARGO_TARGET_DIR is honoured.
set -euo pipefail
if [ $# -ne 1 ]; then
    echo "usage: $0 PREFIX" >&2
    exit 2
fi
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
mkdir -p "$1"
prefix="$(cd "$1" && pwd)"
target="${CARGO_TARGET_DIR:-$root/target}"
(cd "$root" && cargo build --release -p clink-c)
version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -n1)"
# The system libraries a static link needs (as rustc reports them for this target).
native="-lgcc_s -lutil -lrt -lpthread -lm -ldl -lc"
install -d "$prefix/lib/pkgconfig" "$prefix/include"
install -m 0755 "$target/release/libclink.so" "$prefix/lib/libclink.so"
install -m 0644 "$target/release/libclink.a" "$prefix/lib/libclink.a"
install -m 0644 "$here/include/clink.h" "$prefix/include/clink.h"
sed -e "s|@PREFIX@|$prefix|" -e "s|@VERSION@|$version|" -e "s|@NATIVE_LIBS@|$native|" \
    "$here/clink.pc.in" >"$prefix/lib/pkgconfig/clink.pc"
echo "installed clink $version under $prefix"
