#!/usr/bin/env bash
# The inner loop (CONTRIBUTING.md): formatting, clippy, the unit tests, and the integration
# tests that need no timing, no contention and no tool beyond the interpreters: about two
# minutes on two cores once the release build is there (after scripts/demo.sh). It uses what
# scripts/test.sh set up once on this machine (the interpreters 3.11-3.15 above all); CI runs
# scripts/test.sh, the whole suite, which is what an issue is resolved by.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*"; }

# Modules of tests/it that fit, and the check that every test takes the machine: error
# contracts, exact dumps, labels, hostile memory, output files' permissions, record.
modules=(every_test_takes_the_machine dump_errors:: dump_exact:: labels:: hostile_memory::
    file_modes:: record::)

step "cargo fmt"
cargo fmt --all -- --check

step "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "unit tests (pyfleet, actors, policies)"
cargo test --release --workspace --locked --lib --bins
cargo test --release --locked -p pyfleet-actors --test '*'

step "integration tests: ${modules[*]}"
PYFLEET_EXACTNESS_BIN="$PWD/target/release/pyfleet" \
    cargo test --release --locked --test it -- "${modules[@]}"
