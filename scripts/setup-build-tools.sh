#!/usr/bin/env bash
# What checking pyfleet's build needs beyond cargo: clang, to rebuild the kernel capture's
# program (bpf/capture.bpf.c) and compare it with the one kept built beside it
# (scripts/build-bpf.sh --check), and to rebuild it after editing the source. Building pyfleet
# itself needs no clang. Idempotent. Needs root for apt-get.
set -euo pipefail
cd "$(dirname "$0")/.."

have_clang() {
    command -v clang >/dev/null 2>&1 && return 0
    local v
    for v in 20 19 18 17 16 15 14; do
        command -v "clang-$v" >/dev/null 2>&1 && return 0
    done
    return 1
}

have_clang || scripts/apt-install.sh clang
have_clang || { echo "setup-build-tools: error: clang is still missing after the install" >&2; exit 1; }
