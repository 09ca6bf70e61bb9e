#!/usr/bin/env bash
# The system calls the daemon makes, as deploy/kubernetes/pyfleet-seccomp.json's first rule
# lists them: `pyfleet run` under `strace -f -c`, as root, in each of its modes (cpu, wall and
# gil from the kernel capture; reads; reads with the switch log, asyncio tasks and read-only),
# each for 7 s on a busy Python 3.15 target, serving TLS with a token, written snapshots in
# every format, answering a profile pull, the page, its API, a rendering and /metrics, and
# reading its token and certificate again on SIGHUP and on a changed file. Prints one name a
# line, sorted: the union of every mode's calls.
#
#   scripts/trace-daemon-syscalls.sh [PYFLEET] [PYTHON3.15]
#
# Needs root, strace, curl and openssl; a debug or release pyfleet (default: target/debug).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
pyfleet=${1:-$root/target/debug/pyfleet}
python=${2:-$HOME/.cache/pyfleet/pythons/3.15/usr/bin/python3.15}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=127.0.0.1 \
    -addext subjectAltName=IP:127.0.0.1 -keyout key.pem -out cert.pem 2>/dev/null
new_token() { python3 -c 'import secrets; print(secrets.token_hex(32))' >token.new; chmod 600 token.new; mv token.new token; }
new_token

trace() {
    local name=$1; shift
    "$python" -c 'while True: sum(i * i for i in range(10000))' &
    local target=$! port=$((20000 + RANDOM % 20000))
    strace -f -qq -c -S name -o "trace-$name" "$pyfleet" run --pid "$target" --out "out-$name" \
        --metrics-addr "127.0.0.1:$port" --listen-token-file token --listen-tls-cert cert.pem \
        --listen-tls-key key.pem --snapshot-interval 1 --keep 2 --duration 7 \
        --snapshot-format folded,svg,speedscope,pprof "$@" 2>"err-$name" &
    local traced=$!
    sleep 2
    for path in "/debug/pprof/profile?seconds=1" /api/fleet "/flamegraph.svg?seconds=1" /metrics / /readyz; do
        curl -s --cacert cert.pem -H "Authorization: Bearer $(cat token)" -o /dev/null "https://127.0.0.1:$port$path"
    done
    new_token
    pkill -HUP -f -- "--out out-$name" || true
    sleep 3
    wait "$traced"
    kill "$target"
    grep -q "token is read again" "err-$name" || { echo "no reload in mode $name" >&2; exit 1; }
}
trace capture
trace reads --capture reads
trace wall --mode wall
trace gil --mode gil
trace switchlog --capture reads --switch-log --mode wall
trace tasks --capture reads --read-only --async
awk 'FNR > 2 && $1 !~ /^-/ && $NF != "total" { print $NF }' trace-* | sort -u
