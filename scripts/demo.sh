#!/usr/bin/env bash
# pyfleet's main job, from a fresh checkout: build (no clang needed: the kernel capture's
# program is kept built), start a sample workload, check the host (doctor), list the Python
# processes on this host, dump the workload's stacks (text, then JSON), profile it with the
# fleet daemon for a few seconds (snapshots: folded stacks and a flamegraph), and record it
# into one flamegraph file. Output goes to a temporary directory that is printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-/usr/bin/python3.11}
out=$(mktemp -d "${TMPDIR:-/tmp}/pyfleet-demo.XXXXXX")
cargo build --release --locked
"$python" examples/busy.py &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
sleep 1
target/release/pyfleet doctor
target/release/pyfleet list
target/release/pyfleet dump --pid "$pid"
target/release/pyfleet dump --pid "$pid" --json

echo
echo "== the fleet daemon on pid $pid for 5 s (snapshots every 2 s, metrics off)"
target/release/pyfleet run --pid "$pid" --duration 5 --snapshot-interval 2 \
    --out "$out/snapshots" --metrics-addr off
last=$(ls -d "$out"/snapshots/*/ | sort | tail -n 1)
ls -l "$last"
echo "-- the hottest stacks of $last/all.folded:"
awk '{print $NF "\t" $0}' "$last/all.folded" | sort -rn | sed -n 1,5p | cut -f2- \
    | cut -c1-200

echo
echo "== record for 2 s into one flamegraph"
target/release/pyfleet record --pid "$pid" --duration 2 -o "$out/profile.svg"
echo
echo "demo output in $out (open profile.svg or snapshots/*/flamegraph.svg in a browser)"
