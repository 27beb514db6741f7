#!/usr/bin/env bash
# Coverage-guided fuzzing (libFuzzer) of every parser a peer can reach: fuzz/fuzz_targets/.
#   bash scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]   (default 10 s, every target)
# Builds with the nightly toolchain and the sanitizer-coverage instrumentation cargo-fuzz
# would use (no cargo-fuzz needed); each run starts from the kept corpus fuzz/corpus/TARGET
# (read only) and grows its own in target/fuzz-corpus/TARGET across runs; a crash leaves
# its input in target/fuzz-artifacts/TARGET/ and fails the script. To refresh the kept
# corpus: TARGET -merge=1 fuzz/corpus/TARGET target/fuzz-corpus/TARGET.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(wire rendezvous rma_target datagram stream rma ipv4 text cast)
flags="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4"
flags+=" -Cllvm-args=-sanitizer-coverage-inline-8bit-counters"
flags+=" -Cllvm-args=-sanitizer-coverage-pc-table -Cllvm-args=-sanitizer-coverage-trace-compares"
flags+=" --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
# An explicit --target keeps the instrumentation off build scripts.
host=$(rustc +nightly -vV | sed -n 's/^host: //p')
RUSTFLAGS="$flags" CARGO_TARGET_DIR="$PWD/target/fuzz" \
    cargo +nightly build --release --manifest-path fuzz/Cargo.toml --bins --target "$host"
for t in "${targets[@]}"; do
    corpus=target/fuzz-corpus/$t
    artifacts=target/fuzz-artifacts/$t/
    mkdir -p "$corpus" "$artifacts"
    echo "fuzz: $t for ${secs}s"
    target/fuzz/"$host"/release/"$t" -max_total_time="$secs" -artifact_prefix="$artifacts" \
        -print_final_stats=1 "$corpus" fuzz/corpus/"$t" 2>&1 | grep -E "^(stat::number_of_executed_units|stat::new_units_added|==|SUMMARY|.*panicked)" || true
    if ls "$artifacts" | grep -q .; then
        echo "fuzz: $t crashed; inputs in $artifacts" >&2
        exit 1
    fi
done
