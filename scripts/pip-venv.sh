#!/usr/bin/env bash
# A venv with one PyPI requirement, for the test setup scripts:
#   scripts/pip-venv.sh DIR SPEC CHECK...
# Does nothing when DIR/.ready exists and CHECK (a command run in DIR, e.g. `bin/python -c
# 'import x'`) succeeds; otherwise makes DIR afresh with pyenv's newest 3.11, pip-installs
# SPEC (from the machine's configured index) and runs CHECK before marking DIR ready.
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: $0 DIR SPEC CHECK..." >&2; exit 2; }
dir=$1 spec=$2
shift 2
say() { echo "pip-venv: $*" >&2; }
die() { say "error: $*"; exit 1; }
check() { (cd "$dir" && "$@") >/dev/null 2>&1; }

if [ -f "$dir/.ready" ] && check "$@"; then
    say "$dir ready"
    exit 0
fi
py=$(ls -d "$HOME"/.pyenv/versions/3.11.*/bin/python3.11 2>/dev/null | sort -V | tail -n 1 || true)
[ -n "$py" ] || die "no pyenv 3.11 under ~/.pyenv/versions (needed for the venv $dir)"
mkdir -p "$(dirname "$dir")"
rm -rf "$dir"
"$py" -m venv "$dir" || die "$py could not make a venv in $dir"
say "installing $spec into $dir"
"$dir/bin/python" -m pip install -q --disable-pip-version-check "$spec" \
    || die "pip could not install $spec into $dir"
check "$@" || die "'$*' fails in $dir after installing $spec"
touch "$dir/.ready"
say "$dir ready"
