#!/usr/bin/env bash
# Fuzzing smoke run: every cargo-fuzz target in fuzz/ replays its corpus (fuzz/corpus/<target>)
# and then mutates for FUZZ_SECONDS (default 10) more. A crash fails the run and leaves its
# input under fuzz/artifacts/<target>/ (keep it as a unit test before fixing).
#   scripts/fuzz.sh [TARGET...]
# cargo-fuzz is installed from crates.io if missing. The machine has a stable toolchain only:
# the run uses no sanitizer (`-s none`: coverage-guided, panics and overflow checks only), and
# RUSTC_BOOTSTRAP=1 lets cargo-fuzz pass its few unstable flags to the stable compiler.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
seconds="${FUZZ_SECONDS:-10}"
if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked --version 0.13.2
fi
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <(RUSTC_BOOTSTRAP=1 cargo fuzz list)
fi
export RUSTC_BOOTSTRAP=1
cargo fuzz build -s none
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t"
    echo "fuzz: $t (${seconds} s)"
    cargo fuzz run -s none "$t" -- -max_total_time="$seconds" -print_final_stats=0 2>&1 |
        grep -E "DONE|ERROR|panicked|SUMMARY|Test unit" || true
    if [ -n "$(ls -A "artifacts/$t" 2>/dev/null)" ]; then
        echo "fuzz: $t found a crash: $(ls "artifacts/$t")" >&2
        exit 1
    fi
done
