#!/usr/bin/env bash
# Venvs with gunicorn for the fleet daemon's end-to-end test, cached outside the repo:
#   $PYFLEET_VENVS/gunicorn-3.15 (Debian unstable's 3.15, set up by setup-pythons.sh), with
#     uvicorn too (who is who among an ASGI server's workers) and Starlette (asyncio task
#     stacks of a real ASGI app)
#   $PYFLEET_VENVS/asgi-3.14 (Debian unstable's 3.14): uvicorn and Starlette, for the asyncio
#     views on 3.14 too
#   $PYFLEET_VENVS/gunicorn-3.11 (pyenv's newest 3.11)
# PYFLEET_VENVS defaults to ~/.cache/pyfleet/venvs. Idempotent: seconds when cached.
set -euo pipefail
cd "$(dirname "$0")/.."

VENVS=${PYFLEET_VENVS:-$HOME/.cache/pyfleet/venvs}
PYTHONS=${PYFLEET_PYTHONS:-$HOME/.cache/pyfleet/pythons}
GUNICORN_SPEC=${PYFLEET_GUNICORN:-gunicorn>=23,<24}
UVICORN_SPEC=${PYFLEET_UVICORN:-uvicorn>=0.30,<1}
STARLETTE_SPEC=${PYFLEET_STARLETTE:-starlette>=0.37,<1}

say() { echo "setup-venvs: $*" >&2; }
die() { say "error: $*"; exit 1; }

ready() { [ -f "$1/.ready" ] && "$1/bin/python" -c 'import gunicorn' >/dev/null 2>&1; }

install_gunicorn() {
    local dir=$1
    say "installing $GUNICORN_SPEC into $dir"
    "$dir/bin/python" -m pip install -q --disable-pip-version-check "$GUNICORN_SPEC" \
        || die "pip could not install $GUNICORN_SPEC into $dir"
    touch "$dir/.ready"
    say "$dir ready ($("$dir/bin/python" -m gunicorn --version 2>&1 | head -n 1))"
}

mkdir -p "$VENVS"

dir="$VENVS/gunicorn-3.15"
if ready "$dir"; then
    say "$dir ready"
else
    rm -rf "$dir"
    scripts/setup-pythons.sh --venv 3.15 "$dir"
    install_gunicorn "$dir"
fi
if ! "$dir/bin/python" -c 'import uvicorn' >/dev/null 2>&1; then
    say "installing $UVICORN_SPEC into $dir"
    "$dir/bin/python" -m pip install -q --disable-pip-version-check "$UVICORN_SPEC" \
        || die "pip could not install $UVICORN_SPEC into $dir"
fi
if ! "$dir/bin/python" -c 'import starlette' >/dev/null 2>&1; then
    say "installing $STARLETTE_SPEC into $dir"
    "$dir/bin/python" -m pip install -q --disable-pip-version-check "$STARLETTE_SPEC" \
        || die "pip could not install $STARLETTE_SPEC into $dir"
fi

dir="$VENVS/asgi-3.14"
if ! "$dir/bin/python" -c 'import uvicorn, starlette' >/dev/null 2>&1; then
    rm -rf "$dir"
    scripts/setup-pythons.sh --venv 3.14 "$dir"
    say "installing $UVICORN_SPEC and $STARLETTE_SPEC into $dir"
    "$dir/bin/python" -m pip install -q --disable-pip-version-check "$UVICORN_SPEC" "$STARLETTE_SPEC" \
        || die "pip could not install $UVICORN_SPEC and $STARLETTE_SPEC into $dir"
fi
say "$dir ready"

dir="$VENVS/gunicorn-3.11"
if ready "$dir"; then
    say "$dir ready"
else
    py=$(ls -d "$HOME"/.pyenv/versions/3.11.*/bin/python3.11 2>/dev/null | sort -V | tail -n 1)
    [ -n "$py" ] || die "no pyenv 3.11 under ~/.pyenv/versions (needed for the two-version fleet test)"
    rm -rf "$dir"
    "$py" -m venv "$dir" || die "$py could not make a venv"
    install_gunicorn "$dir"
fi
