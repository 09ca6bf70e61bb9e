#!/usr/bin/env bash
# Venvs with real pure-Python libraries for the exactness benchmark (examples/bench/exactness.py),
# cached outside the repo:
#   $PYFLEET_VENVS/libs-3.11 ... libs-3.15   sympy (+mpmath), jinja2 (+markupsafe), pyparsing
#   $PYFLEET_VENVS/py-spy                    py-spy from PyPI, the stop-the-world reference
# PYFLEET_VENVS defaults to ~/.cache/pyfleet/venvs. Idempotent: seconds when cached.
#
#   scripts/setup-libs.sh [3.X ...]     # only these versions (default: 3.11 to 3.15)
#
# Interpreters: 3.11 Debian's /usr/bin/python3.11 (static; pyenv's newest 3.11 if Debian's has
# no venv), 3.12 and 3.13 pyenv's newest, 3.14 and 3.15 Debian unstable's from
# scripts/setup-pythons.sh (which also makes their venvs, since they have no ensurepip).
#
# Every library is pinned and pure Python on every version. markupsafe may install its C
# speedups where a wheel (or a compiler) gives them; the jinja target blocks that module before
# importing jinja2, so every version runs markupsafe's pure-Python escape.
set -euo pipefail
cd "$(dirname "$0")/.."

VENVS=${PYFLEET_VENVS:-$HOME/.cache/pyfleet/venvs}
ALL_VERSIONS=(3.11 3.12 3.13 3.14 3.15)
LIBS=(sympy==1.14.0 mpmath==1.3.0 jinja2==3.1.6 markupsafe==3.0.3 pyparsing==3.3.3)
PY_SPY=py-spy==0.4.3
# Modules that must come from .py files (not compiled extensions) for the benchmark to mean
# what it says: the hot code is Python.
PURE_MODULES="sympy sympy.core.basic sympy.core.add sympy.core.mul sympy.polys.polytools mpmath mpmath.libmp.libmpf jinja2 jinja2.runtime jinja2.environment markupsafe._native pyparsing pyparsing.core"

say() { echo "setup-libs: $*" >&2; }
die() { say "error: $*"; exit 1; }

python_for() {
    local v=$1 py
    case $v in
        3.11)
            if /usr/bin/python3.11 -c 'import venv, ensurepip' >/dev/null 2>&1; then
                echo /usr/bin/python3.11
                return
            fi
            py=$(ls -d "$HOME"/.pyenv/versions/3.11.*/bin/python3.11 2>/dev/null | sort -V | tail -n 1 || true) ;;
        3.12 | 3.13)
            py=$(ls -d "$HOME"/.pyenv/versions/$v.*/bin/python$v 2>/dev/null | sort -V | tail -n 1 || true) ;;
        3.14 | 3.15)
            py=${PYFLEET_PYTHONS:-$HOME/.cache/pyfleet/pythons}/$v/usr/bin/python$v ;;
        *) die "unsupported version $v (3.11 to 3.15)" ;;
    esac
    [ -n "$py" ] && [ -x "$py" ] || die "no python$v found (see the header of $0)"
    echo "$py"
}

# The check a cached venv must pass: right versions, importable, pure Python.
check_libs() {
    local dir=$1
    "$dir/bin/python" - "${LIBS[@]}" <<EOF
import importlib, importlib.metadata as md, sys
for spec in sys.argv[1:]:
    name, want = spec.split("==")
    got = md.version(name)
    if got != want:
        sys.exit(f"{name} {got} installed, {want} wanted")
for mod in "$PURE_MODULES".split():
    f = importlib.import_module(mod).__file__ or ""
    if not f.endswith(".py"):
        sys.exit(f"{mod} is not pure Python: {f}")
EOF
}

ready_libs() { [ -f "$1/.ready" ] && check_libs "$1" >/dev/null 2>&1; }

make_venv() {
    local v=$1 dir=$2 py
    rm -rf "$dir"
    case $v in
        3.14 | 3.15) scripts/setup-pythons.sh --venv "$v" "$dir" ;;
        *)
            py=$(python_for "$v")
            "$py" -m venv "$dir" || die "$py could not make a venv in $dir" ;;
    esac
}

setup_libs() {
    local v=$1 dir="$VENVS/libs-$1"
    if ready_libs "$dir"; then
        say "$dir ready"
        return 0
    fi
    make_venv "$v" "$dir"
    say "installing ${LIBS[*]} into $dir"
    "$dir/bin/python" -m pip install -q --disable-pip-version-check "${LIBS[@]}" \
        || die "pip could not install ${LIBS[*]} into $dir"
    check_libs "$dir" || die "the libraries in $dir fail their check (above)"
    touch "$dir/.ready"
    say "$dir ready ($("$dir/bin/python" -c 'import sys; print(sys.version.split()[0])'))"
}

setup_py_spy() {
    local dir="$VENVS/py-spy" want=${PY_SPY#*==}
    if [ -f "$dir/.ready" ] && [ "$("$dir/bin/py-spy" --version 2>/dev/null)" = "py-spy $want" ]; then
        say "$dir ready"
        return 0
    fi
    rm -rf "$dir"
    local py
    py=$(python_for 3.12)
    "$py" -m venv "$dir" || die "$py could not make a venv in $dir"
    say "installing $PY_SPY into $dir"
    "$dir/bin/python" -m pip install -q --disable-pip-version-check "$PY_SPY" \
        || die "pip could not install $PY_SPY into $dir"
    [ "$("$dir/bin/py-spy" --version 2>/dev/null)" = "py-spy $want" ] || die "$dir/bin/py-spy does not run"
    touch "$dir/.ready"
    say "$dir ready ($("$dir/bin/py-spy" --version))"
}

versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=("${ALL_VERSIONS[@]}")
mkdir -p "$VENVS"
for v in "${versions[@]}"; do
    setup_libs "$v"
done
setup_py_spy
