#!/usr/bin/env bash
# What building pyfleet needs beyond cargo: clang, which build.rs uses to build the kernel
# capture (bpf/capture.bpf.c, `record --capture kernel`). Without it pyfleet builds, without
# the capture; the tests require it (tests/it/real_code.rs). Idempotent. Needs root for apt-get.
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
