#!/usr/bin/env bash
# Builds clink's static C library as LLVM bitcode, for cross-language link-time
# optimisation: a C program compiled with `-flto` and linked with it becomes one
# optimisation unit with clink, as a Rust program is (its calls into clink inlined, a
# message's constant length propagated into the copy).
#
#   clink-c/lto.sh CC          # CC: a clang whose LLVM is at least rustc's, with lld
#                              # (for example "python3 -m ziglang cc" after
#                              # `pip install ziglang`: clang 22 in ziglang 0.17)
#   CC -O2 -flto app.c -Iclink-c/include TARGET/lto/release/libclink.a -lgcc_s -lpthread -ldl -lm
#
# TARGET is CARGO_TARGET_DIR or the workspace's target/; the bitcode build has its own
# directory (TARGET/lto) because its RUSTFLAGS differ from the ordinary build's. An older
# LLVM cannot read rustc's bitcode: the script refuses it, saying which versions it found.
set -euo pipefail
if [ $# -ne 1 ]; then
    echo "usage: $0 CC   (a clang of LLVM >= rustc's, e.g. \"python3 -m ziglang cc\")" >&2
    exit 2
fi
cc=($1)
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
target="${CARGO_TARGET_DIR:-$root/target}/lto"

major() { sed -n 's/.*\(clang\|LLVM\) version:\{0,1\} \([0-9]*\)\..*/\2/p' | head -n1; }
rust_llvm="$(rustc -vV | major)"
cc_llvm="$("${cc[@]}" --version 2>/dev/null | major)"
if [ -z "$rust_llvm" ] || [ -z "$cc_llvm" ]; then
    echo "lto.sh: cannot tell the LLVM versions (rustc: '${rust_llvm}', $1: '${cc_llvm}'; is $1 a clang?)" >&2
    exit 1
fi
if [ "$cc_llvm" -lt "$rust_llvm" ]; then
    echo "lto.sh: $1 is LLVM $cc_llvm, rustc is LLVM $rust_llvm: it cannot read rustc's bitcode" >&2
    exit 1
fi
(cd "$root" && RUSTFLAGS="-Clinker-plugin-lto" CARGO_TARGET_DIR="$target" \
    cargo build --release -p clink-c)
echo "$target/release/libclink.a (clink as LLVM $rust_llvm bitcode; link with $1 -flto)"
