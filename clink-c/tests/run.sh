#!/usr/bin/env bash
# The C suite of clink-c: builds the library (debug), compiles every C test
# (tests/c/test_*.c) and example (examples/*.c) with `cc -Wall -Werror`, and runs each
# three ways, each run bounded by `timeout`:
#   plain     linked against libclink.so
#   asan      -fsanitize=address,undefined, linked against libclink.a, leaks detected
#   valgrind  the plain binaries under valgrind --leak-check=full --error-exitcode=1
# and the launcher test once more as three ranks under mpirun.
# Prints one line per run and "N passed, M failed"; exits 1 if any run failed or a tool
# (cc, valgrind) is missing. Run by tests/c_suite.rs (cargo test -p clink-c).
set -uo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
root="$(cd "$here/.." && pwd)"
target="${CARGO_TARGET_DIR:-$root/target}"

for tool in cc valgrind timeout; do
    if ! command -v "$tool" >/dev/null; then
        echo "run.sh: '$tool' is not installed (Debian: apt-get install -y gcc valgrind coreutils)" >&2
        exit 1
    fi
done

# Tests read the CLINK_* configuration: keep the harness's own variables out of it, and skip
# the start-up calibration (its figures do not matter here and it is slow under valgrind).
unset CLINK_BLESS
export CLINK_CALIBRATE=0

# C_SUITE_LIB_DIR: where a libclink.so and libclink.a were already built (tests/c_suite.rs
# passes cargo's own build, which a nested cargo would wait for); otherwise build here.
if [ -n "${C_SUITE_LIB_DIR:-}" ]; then
    lib="$C_SUITE_LIB_DIR"
else
    echo "run.sh: building libclink (debug)"
    if ! (cd "$root" && cargo build -q -p clink-c); then
        echo "run.sh: cargo build -p clink-c failed" >&2
        exit 1
    fi
    lib="$target/debug"
fi
for f in libclink.so libclink.a; do
    [ -f "$lib/$f" ] || { echo "run.sh: $lib/$f missing after the build" >&2; exit 1; }
done

out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
mkdir -p "$out/plain" "$out/asan"

native="-lgcc_s -lutil -lrt -lpthread -lm -ldl"
cflags=(-std=c11 -Wall -Wextra -Werror -g -O1 -I"$here/include" -I"$here/tests/c" -I"$here/examples")
passed=0
failed=0
failures=()

record() { # name variant status
    if [ "$3" -eq 0 ]; then
        passed=$((passed + 1))
        echo "ok    $2 $1"
    else
        failed=$((failed + 1))
        failures+=("$2 $1")
        echo "FAIL  $2 $1 (exit $3)"
    fi
}

srcs=("$here"/tests/c/test_*.c "$here"/examples/*.c)
names=()
for src in "${srcs[@]}"; do
    name="$(basename "$src" .c)"
    names+=("$name")
    if ! cc "${cflags[@]}" "$src" -o "$out/plain/$name" -L"$lib" -Wl,-rpath,"$lib" -lclink -pthread; then
        record "$name" compile 1
        continue
    fi
    if ! cc "${cflags[@]}" -fsanitize=address,undefined -fno-omit-frame-pointer \
        -fno-sanitize-recover=undefined "$src" -o "$out/asan/$name" "$lib/libclink.a" $native -pthread; then
        record "$name" compile-asan 1
        continue
    fi
    record "$name" compile 0
done

# Arguments per program (the ping-pong's round trips and path_cost's hops: fewer under the
# slower variants).
args_for() { # name variant
    case "$1:$2" in
        pingpong:plain) echo 20000 ;;
        pingpong:asan) echo 5000 ;;
        pingpong:valgrind) echo 300 ;;
        path_cost:plain) echo 100000 ;;
        path_cost:asan) echo 10000 ;;
        path_cost:valgrind) echo 300 ;;
        *) echo "" ;;
    esac
}

run() { # variant name command...
    local variant="$1" name="$2"
    shift 2
    local log="$out/$variant-$name.log"
    "$@" >"$log" 2>&1
    local rc=$?
    record "$name" "$variant" "$rc"
    if [ "$rc" -ne 0 ]; then
        sed 's/^/      /' "$log" | tail -n 40
    else
        grep -v '^==' "$log" | grep -E '^(clink C ping-pong|path_cost|stream_nb|epoll|apertures|launcher|rank )' | sed 's/^/      /'
    fi
}

for name in "${names[@]}"; do
    [ -x "$out/plain/$name" ] || continue
    # shellcheck disable=SC2046
    run plain "$name" timeout 60 "$out/plain/$name" $(args_for "$name" plain)
done

export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:halt_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
for name in "${names[@]}"; do
    [ -x "$out/asan/$name" ] || continue
    # shellcheck disable=SC2046
    run asan "$name" timeout 120 "$out/asan/$name" $(args_for "$name" asan)
done
unset ASAN_OPTIONS UBSAN_OPTIONS

# Valgrind follows the forked children by itself (they are the same program); every
# process's errors and definite/indirect leaks fail the run. The suppressions file holds
# only what it documents.
for name in "${names[@]}"; do
    [ -x "$out/plain/$name" ] || continue
    # shellcheck disable=SC2046
    run valgrind "$name" timeout 300 valgrind -q --error-exitcode=1 --leak-check=full \
        --errors-for-leak-kinds=definite,indirect --show-leak-kinds=definite,indirect \
        --suppressions="$here/tests/valgrind.supp" \
        "$out/plain/$name" $(args_for "$name" valgrind)
done

# The launcher test once more with three ranks under Open MPI's mpirun (its PMIx
# service carries the addresses), plain build only.
if [ -x "$out/plain/test_launcher" ]; then
    if command -v mpirun >/dev/null; then
        root_flag=()
        [ "$(id -u)" -eq 0 ] && root_flag=(--allow-run-as-root)
        run mpirun test_launcher timeout 120 mpirun "${root_flag[@]}" --oversubscribe \
            --bind-to none -np 3 "$out/plain/test_launcher"
    else
        record test_launcher mpirun 1
        echo "      mpirun is not installed (Debian: apt-get install -y openmpi-bin)"
    fi
fi

if [ "$failed" -ne 0 ]; then
    echo "failed runs: ${failures[*]}"
fi
echo "c suite: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
