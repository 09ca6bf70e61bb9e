#!/usr/bin/env bash
# pyfleet's test command: sets up everything a fresh machine lacks, then runs every check.
#   - Python 3.14 and 3.15 from Debian unstable (cached under ~/.cache/pyfleet), patchelf;
#   - venvs with gunicorn from PyPI for the fleet test (cached under ~/.cache/pyfleet/venvs);
#   - venvs with real pure-Python libraries (sympy, jinja2, pyparsing) for 3.11-3.15 and py-spy,
#     for the real-code exactness test (same cache);
#   - prometheus/promtool (Debian), kubernetes-validate (PyPI venv) for the deploy/ test;
#   - chromium, go tool pprof (Debian), speedscope's schema (npm), jsonschema (PyPI venv) for
#     the output formats' test; tmux (Debian) for `top`'s;
#   - clang (Debian) to check that bpf/capture.bpf.o is what bpf/capture.bpf.c builds (pyfleet
#     itself builds without clang: the release build below runs with clang hidden);
#   - Rust dependencies (cargo fetches them);
#   - formatting, clippy, unit and integration tests against real interpreters 3.11-3.15
#     (the real-code exactness test measures the release build);
#   - cargo-fuzz (crates.io) and a short run of every fuzz target (scripts/fuzz.sh).
# Every interpreter and tool must be present: a missing one fails the run, it is not skipped
# (this script does not set PYFLEET_ALLOW_MISSING, which skips what needs a missing one).
set -euo pipefail
cd "$(dirname "$0")/.."

# Each step says when it began (the machine's clock): where a slow run spent its time.
step() { printf '\n== %s (%s)\n' "$*" "$(date +%T)"; }

step "build tools (clang: to check the kernel capture's kept program)"
scripts/setup-build-tools.sh

step "the kernel capture's program: bpf/capture.bpf.o is bpf/capture.bpf.c built"
scripts/build-bpf.sh --check

step "interpreters"
scripts/setup-pythons.sh

step "venvs (gunicorn for the fleet test)"
scripts/setup-venvs.sh

step "real libraries from PyPI (sympy, jinja2, pyparsing for 3.11-3.15; py-spy)"
scripts/setup-libs.sh

step "deploy tools (prometheus, promtool, systemd-analyze, kubernetes-validate)"
scripts/setup-deploy-tools.sh

step "format tools (chromium, go tool pprof, speedscope schema, jsonschema, tmux)"
scripts/setup-format-tools.sh

step "cargo fmt"
cargo fmt --all -- --check

step "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "release build with clang hidden (the binary tests/it/real_code.rs measures: the one users run)"
scripts/without-clang.sh cargo build --release --locked --bin pyfleet
export PYFLEET_EXACTNESS_BIN="$PWD/target/release/pyfleet"

step "cargo test"
# Each integration test appends its time here (tests/it/common/machine.rs).
durations=target/tmp/it-durations.tsv
rm -f "$durations"
# Every process the tests start inherits this mark: none may be left once they ended.
export PYFLEET_TEST_RUN="$$-$(date +%s%N)"
status=0
cargo test --workspace --locked "$@" || status=$?
step "the slowest integration tests (seconds, how each held the machine)"
sort -rn "$durations" 2>/dev/null | head -20 || true
step "processes the tests left behind"
scripts/left-behind.sh "PYFLEET_TEST_RUN=$PYFLEET_TEST_RUN" $$ || status=1
[ "$status" -eq 0 ] || exit "$status"

step "fuzzing (cargo-fuzz, each target's corpus and ${FUZZ_SECONDS:-10} s more)"
scripts/fuzz.sh
step "done"
