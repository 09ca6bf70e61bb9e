#!/usr/bin/env bash
# pyfleet's test command: sets up everything a fresh machine lacks, then runs every check.
#   - Python 3.14 and 3.15 from Debian unstable (cached under ~/.cache/pyfleet), patchelf;
#   - Rust dependencies (cargo fetches them);
#   - formatting, clippy, unit and integration tests against real interpreters 3.11-3.15.
# Every interpreter must be present: a missing one fails the run, it is not skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*"; }

step "interpreters"
scripts/setup-pythons.sh

step "cargo fmt"
cargo fmt --all -- --check

step "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo test"
cargo test --workspace --locked "$@"
