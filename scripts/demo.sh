#!/usr/bin/env bash
# pyfleet's main job, from a fresh checkout: build, start a sample workload, list the Python
# processes on this host, and dump the workload's stacks (as text, then as JSON).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-/usr/bin/python3.11}
cargo build --release --locked
"$python" examples/busy.py &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
sleep 1
target/release/pyfleet list
target/release/pyfleet dump --pid "$pid"
target/release/pyfleet dump --pid "$pid" --json
