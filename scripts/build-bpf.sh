#!/usr/bin/env bash
# Builds the kernel capture's BPF program, bpf/capture.bpf.c, into the object every pyfleet
# build embeds: bpf/capture.bpf.o, kept in the repository beside its source so that a build
# needs no clang (build.rs copies it), with bpf/capture.bpf.o.built-from saying which source
# (FNV-1a 64 of its bytes) and which clang made it.
#
#   scripts/build-bpf.sh            rebuild bpf/capture.bpf.o and its built-from file (commit both)
#   scripts/build-bpf.sh --check    rebuild into a temporary file and fail unless it is the
#                                   committed object byte for byte (CI runs this)
#   scripts/build-bpf.sh --out F    build into F only (build.rs, when the source changed)
#
# The build is reproducible: no absolute path reaches the object (debug prefix maps), so the
# same clang gives the same bytes on every machine. PYFLEET_CLANG names the compiler; else the
# first of clang, clang-20 ... clang-14 on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "build-bpf: $*" >&2; }
die() { say "error: $*"; exit 1; }

source_file=bpf/capture.bpf.c
object=bpf/capture.bpf.o
built_from=bpf/capture.bpf.o.built-from

find_clang() {
    if [ -n "${PYFLEET_CLANG:-}" ]; then
        command -v "$PYFLEET_CLANG" >/dev/null 2>&1 || die "PYFLEET_CLANG=$PYFLEET_CLANG: not found"
        echo "$PYFLEET_CLANG"
        return
    fi
    local c
    for c in clang clang-20 clang-19 clang-18 clang-17 clang-16 clang-15 clang-14; do
        if command -v "$c" >/dev/null 2>&1; then echo "$c"; return; fi
    done
    die "no clang found (clang, clang-20 ... clang-14; or set PYFLEET_CLANG)"
}

compile() {
    local clang=$1 out=$2
    "$clang" -O2 -g -target bpf -Wall -Werror \
        -fdebug-prefix-map="$PWD"=. -fdebug-compilation-dir=. \
        -c "$source_file" -o "$out" || die "$clang failed to build $source_file"
}

# FNV-1a 64 of the source's bytes, as build.rs computes it.
source_hash() {
    python3 -c '
import sys
h = 0xcbf29ce484222325
for b in open(sys.argv[1], "rb").read():
    h = ((h ^ b) * 0x100000001b3) & 0xffffffffffffffff
print(f"{h:016x}")' "$source_file"
}

clang=$(find_clang)
version=$("$clang" --version | sed -n 1p)
case "${1:-}" in
    --out)
        [ $# = 2 ] || die "usage: $0 --out FILE"
        compile "$clang" "$2"
        ;;
    --check)
        tmp=$(mktemp -d)
        trap 'rm -rf "$tmp"' EXIT
        compile "$clang" "$tmp/capture.bpf.o"
        want="source-fnv1a64 $(source_hash)"
        grep -qxF "$want" "$built_from" \
            || die "$built_from does not name this $source_file ($want): run scripts/build-bpf.sh and commit both files"
        if ! cmp -s "$tmp/capture.bpf.o" "$object"; then
            committed_by=$(sed -n 's/^clang //p' "$built_from")
            die "$object is not what $version builds from $source_file (it was built by: $committed_by): run scripts/build-bpf.sh and commit both files"
        fi
        say "$object is $source_file as $version builds it"
        ;;
    "")
        compile "$clang" "$object.tmp"
        mv "$object.tmp" "$object"
        {
            echo "# Written by scripts/build-bpf.sh: what bpf/capture.bpf.o was built from."
            echo "source-fnv1a64 $(source_hash)"
            echo "clang $version"
        } > "$built_from"
        say "built $object with $version"
        ;;
    *) die "usage: $0 [--check | --out FILE]" ;;
esac
