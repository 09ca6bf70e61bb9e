#!/usr/bin/env bash
# Derive the CPython struct offsets pyfleet needs by compiling small C
# programs against one CPython version's own internal headers.
#
#   tools/offsets/derive.sh VERSION         # 3.11 3.12 3.13 3.14 3.15 3.11-debian
#   tools/offsets/derive.sh VERSION > tools/offsets/derived-VERSION.txt
#
# Header locations (override with PY_INC=<dir with Python.h> and, if the
# pyconfig.h there is only a Debian multiarch wrapper, PY_MULTIARCH_INC=<dir
# that contains x86_64-linux-gnu/python3.X/pyconfig.h>):
#   3.11 3.12 3.13  $HOME/.pyenv/versions/3.X.*/include/python3.X
#   3.11-debian     /usr/include/python3.11 (+ /usr/include/x86_64-linux-gnu)
#   3.14 3.15       $PYFLEET_PYTHONS/3.X/usr/include/python3.X
#                   (PYFLEET_PYTHONS defaults to $HOME/.cache/pyfleet/pythons)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ver="${1:?usage: derive.sh VERSION (3.11 3.12 3.13 3.14 3.15 3.11-debian)}"
pythons="${PYFLEET_PYTHONS:-$HOME/.cache/pyfleet/pythons}"
CC="${CC:-gcc}"

minor_of() { echo "${1%%-*}"; }
mm="$(minor_of "$ver")"          # e.g. 3.11
case "$mm" in 3.1[1-9]) ;; *) echo "unsupported version: $ver" >&2; exit 2 ;; esac

inc="${PY_INC:-}"
multi="${PY_MULTIARCH_INC:-}"
if [[ -z "$inc" ]]; then
    case "$ver" in
    *-debian)
        inc="/usr/include/python$mm"
        multi="/usr/include"
        ;;
    3.11|3.12|3.13)
        # newest installed pyenv patch release of that minor version
        pv="$(ls -d "$HOME/.pyenv/versions/$mm".* 2>/dev/null | sort -V | tail -n1 || true)"
        [[ -n "$pv" ]] || { echo "no pyenv $mm found" >&2; exit 1; }
        inc="$pv/include/python$mm"
        ;;
    *)
        inc="$pythons/$mm/usr/include/python$mm"
        multi="$pythons/$mm/usr/include"
        ;;
    esac
fi
[[ -f "$inc/Python.h" ]] || { echo "no Python.h in $inc" >&2; exit 1; }
[[ -d "$inc/internal" ]] || { echo "no internal/ headers in $inc" >&2; exit 1; }

flags=(-std=gnu11 -O0 -w -DPy_BUILD_CORE -DPy_BUILD_CORE_BUILTIN
       -I"$inc" -I"$inc/internal")
[[ -d "$inc/internal/mimalloc" ]] && flags+=(-I"$inc/internal/mimalloc")
if [[ -n "$multi" ]]; then
    flags+=(-I"$multi")
    [[ -d "$multi/x86_64-linux-gnu/python$mm" ]] && \
        flags+=(-I"$multi/x86_64-linux-gnu/python$mm")
fi

# Build-configuration defines that change struct layout but are passed on the
# compiler command line rather than recorded in pyconfig.h (e.g. Debian's
# 3.14/3.15 use --enable-experimental-jit=yes-off => -D_Py_TIER2=3 -D_Py_JIT,
# and 3.15's _PyThreadStateImpl has an `#if _Py_TIER2` pointer).  Taken from
# that installation's _sysconfigdata (PY_CORE_CFLAGS) unless PY_BUILD_DEFINES
# is set.
prefix="$(cd "$inc/../.." && pwd)"
if [[ -n "${PY_BUILD_DEFINES+set}" ]]; then
    read -r -a bdefs <<< "$PY_BUILD_DEFINES"
    bsrc="PY_BUILD_DEFINES"
else
    bdefs=()
    bsrc="none found"
    for sc in "$prefix/lib/python$mm"/_sysconfigdata_*.py; do
        [[ -f "$sc" ]] || continue
        line="$(grep -m1 "'PY_CORE_CFLAGS'" "$sc" || true)"
        [[ -n "$line" ]] || continue
        read -r -a bdefs <<< "$(grep -oE -- '-D(_Py_TIER2(=[0-9]+)?|_Py_JIT|Py_STATS|Py_DEBUG|Py_TRACE_REFS|Py_STACKREF_DEBUG)([[:space:]]|$)' <<< "$line" | tr -d '[:space:]' | sed 's/-D/ -D/g' || true)"
        bsrc="$sc"
        break
    done
fi
flags+=(-DNDEBUG "${bdefs[@]}")

# Optional fields: detected from the headers themselves so the C code does
# not guess which alpha/beta gained or lost them.
has() { grep -rqE "$1" "$inc/cpython" "$inc/internal" 2>/dev/null; }
# (a declaration ends in "<space or *>name;")
decl() { grep -qE "[*[:space:]]$2;" "$inc/$1" 2>/dev/null; }
decl cpython/pystate.h last_profiled_frame && flags+=(-DPYFLEET_HAVE_LAST_PROFILED_FRAME)
decl cpython/pystate.h last_profiled_frame_seq && flags+=(-DPYFLEET_HAVE_LAST_PROFILED_FRAME_SEQ)
decl cpython/pystate.h base_frame && flags+=(-DPYFLEET_HAVE_TSTATE_BASE_FRAME)
decl cpython/pystate.h holds_gil && flags+=(-DPYFLEET_HAVE_TSTATE_HOLDS_GIL)
decl cpython/pystate.h gil_requested && flags+=(-DPYFLEET_HAVE_TSTATE_GIL_REQUESTED)
decl internal/pycore_tstate.h base_frame && flags+=(-DPYFLEET_HAVE_TSTATE_IMPL_BASE_FRAME)
has '[[:space:]]_code_object_generation;' && flags+=(-DPYFLEET_HAVE_CODE_OBJECT_GENERATION)
has 'FRAME_OWNED_BY_INTERPRETER[[:space:]]*=' && flags+=(-DPYFLEET_HAVE_FRAME_OWNED_BY_INTERPRETER)
has 'FRAME_OWNED_BY_CSTACK[[:space:]]*=' && flags+=(-DPYFLEET_HAVE_FRAME_OWNED_BY_CSTACK)

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

echo "# derived by tools/offsets/derive.sh $ver"
echo "# headers: $inc"
echo "# build defines: ${bdefs[*]:-(none)} (from $bsrc)"
"$CC" "${flags[@]}" "$here/offsets.c" -o "$tmp/offsets"
"$tmp/offsets" | tee "$tmp/out.txt"

hex="$(sed -n 's/^PY_VERSION_HEX = //p' "$tmp/out.txt")"
want=$(( (3 << 24) | (${mm#3.} << 16) ))
if (( (hex & 0xffff0000) != want )); then
    echo "headers in $inc are $hex, not $mm" >&2
    exit 1
fi

if (( ${mm#3.} >= 13 )); then
    "$CC" "${flags[@]}" "$here/debug_offsets.c" -o "$tmp/dbg"
    "$tmp/dbg" | tee "$tmp/dbg.txt"
    # Completeness: every member of _Py_DebugOffsets is 8 bytes (uint64_t or
    # char[8]), so the printed fields must tile [0, sizeof) with no gap.
    awk -F' = ' '
        $1 == "dbg.sizeof" { size = $2; next }
        $1 ~ /^dbg\./     { n++; seen[$2]++ }
        END {
            for (off = 0; off < size; off += 8)
                if (seen[off] != 1) { print "dbg table: offset " off " listed " seen[off]+0 " times" > "/dev/stderr"; bad = 1 }
            if (n * 8 != size) { print "dbg table: " n " fields for " size " bytes" > "/dev/stderr"; bad = 1 }
            exit bad
        }' "$tmp/dbg.txt"
    if grep -q '^dbgval\.' "$tmp/dbg.txt"; then
        # 3.14+: values from _Py_DebugOffsets_INIT must equal offsets.c's own
        python3 -B "$here/check_dbgval.py" "$tmp/out.txt" "$tmp/dbg.txt" >&2
    fi
fi
