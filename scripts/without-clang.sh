#!/usr/bin/env bash
# Runs a command as on a machine without clang: in a mount namespace of its own where every
# clang on PATH (clang, clang-NN, and what they link to) is covered by an empty,
# non-executable file. scripts/test.sh and the tests use it to show that building pyfleet
# (cargo build, cargo install) needs no clang: the kernel capture's program is kept built in
# bpf/. Needs root (unshare -m).
#   scripts/without-clang.sh cargo build --release
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: $0 COMMAND [ARG...]" >&2; exit 2; }
if [ "${PYFLEET_CLANG_HIDDEN:-}" != 1 ]; then
    exec env PYFLEET_CLANG_HIDDEN=1 unshare --mount --propagation private "$0" "$@"
fi
# The empty file lives on a tmpfs mounted in this namespace only (over /mnt here): it goes
# with the namespace and leaves nothing behind.
mount -t tmpfs -o size=64k,mode=0755 pyfleet-no-clang /mnt
empty=/mnt/no-clang
: > "$empty"
IFS=: read -r -a dirs <<< "$PATH"
for dir in "${dirs[@]}"; do
    for c in "$dir"/clang "$dir"/clang-[0-9]*; do
        [ -e "$c" ] || continue
        mount --bind "$empty" "$(readlink -f "$c")"
    done
done
if command -v clang >/dev/null 2>&1 && clang --version >/dev/null 2>&1; then
    echo "without-clang: clang still runs" >&2
    exit 1
fi
exec "$@"
