#!/usr/bin/env bash
# Provides CPython 3.14 and 3.15 from Debian unstable's binary packages, for pyfleet's tests.
#
#   scripts/setup-pythons.sh                 # set up both (idempotent; seconds when cached)
#   scripts/setup-pythons.sh --venv 3.15 DIR # also make a venv with pip from that interpreter
#
# Result: $PYFLEET_PYTHONS/3.X/usr/bin/python3.X (default PYFLEET_PYTHONS=~/.cache/pyfleet/pythons),
# one root per version, with the version's internal headers under usr/include/python3.X.
# The machine's own apt state is untouched: a private sources list and lists directory point
# at the mirror already configured in /etc/apt, with suite "unstable". The binaries are
# patched (patchelf) to use the unstable libc they were built for, with DT_RPATH so that
# extension modules find the same libraries.
set -euo pipefail

PYTHONS=${PYFLEET_PYTHONS:-$HOME/.cache/pyfleet/pythons}
VERSIONS=(3.14 3.15)
APT_DIR="$PYTHONS/.apt"

say() { echo "setup-pythons: $*" >&2; }
die() { say "error: $*"; exit 1; }

# The Debian mirror this machine already uses (deb822 or one-line format), not a security one.
mirror() {
    local uri=""
    if [ -f /etc/apt/sources.list.d/debian.sources ]; then
        uri=$(awk '/^URIs:/ { for (i = 2; i <= NF; i++) if ($i !~ /security/) { print $i; exit } }' \
            /etc/apt/sources.list.d/debian.sources)
    fi
    if [ -z "$uri" ] && [ -f /etc/apt/sources.list ]; then
        uri=$(awk '$1 == "deb" && $0 !~ /security/ { for (i = 2; i <= NF; i++) if ($i ~ /:\/\//) { print $i; exit } }' \
            /etc/apt/sources.list)
    fi
    [ -n "$uri" ] || die "no Debian mirror found in /etc/apt/sources.list.d/debian.sources or /etc/apt/sources.list"
    echo "$uri"
}

APT_OPTS=()
apt_setup() {
    [ ${#APT_OPTS[@]} -eq 0 ] || return 0
    mkdir -p "$APT_DIR/lists/partial" "$APT_DIR/cache/archives/partial" "$APT_DIR/debs"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $(mirror) unstable main" \
        > "$APT_DIR/sources.list"
    APT_OPTS=(-o "Dir::Etc::SourceList=$APT_DIR/sources.list" -o Dir::Etc::SourceParts=/dev/null
        -o "Dir::State::Lists=$APT_DIR/lists" -o "Dir::Cache=$APT_DIR/cache"
        -o Debug::NoLocking=1 -o APT::Sandbox::User=root)
    say "reading Debian unstable's package lists"
    apt-get "${APT_OPTS[@]}" -q update >/dev/null \
        || die "apt-get update of Debian unstable failed (network or keyring?)"
}

ensure_patchelf() {
    command -v patchelf >/dev/null && return 0
    say "installing patchelf"
    (apt-get install -y -q patchelf >/dev/null 2>&1) \
        || { apt-get update -q >/dev/null && apt-get install -y -q patchelf >/dev/null; } \
        || die "could not install patchelf"
}

# Unstable's runtime libraries the interpreter links against, plus the interpreter itself.
packages_for() {
    local v=$1
    echo "python$v python$v-minimal libpython$v libpython$v-minimal libpython$v-stdlib" \
        "libpython$v-dev python3-pip-whl" \
        "libc6 libexpat1 libzstd1 zlib1g libgcc-s1 libssl3t64 libffi8 libbz2-1.0 liblzma5" \
        "libsqlite3-0 libncursesw6 libtinfo6 libreadline8t64 libuuid1 libmpdec4"
}

verify() {
    local v=$1 py=$2
    "$py" -c 'import sys, ssl, sqlite3, json, threading, asyncio, ctypes; print(sys.version.split()[0])' \
        || return 1
    "$py" -c 'import concurrent.interpreters as ci; ci.create().exec("x = 1")' || return 1
    if [ "$v" = 3.15 ]; then
        "$py" -c 'import _remote_debugging; _remote_debugging.RemoteUnwinder' || return 1
    fi
    [ -f "$(dirname "$py")/../include/python$v/internal/pycore_debug_offsets.h" ] || return 1
}

setup_version() {
    local v=$1
    local root="$PYTHONS/$v" py="$PYTHONS/$v/usr/bin/python$v"
    if [ -f "$root/.ready" ] && verify "$v" "$py" >/dev/null 2>&1; then
        say "python$v ready ($py)"
        return 0
    fi
    apt_setup
    ensure_patchelf
    local debs="$APT_DIR/debs/$v"
    rm -rf "$debs" "$root"
    mkdir -p "$debs" "$root"
    say "downloading python$v and its libraries from Debian unstable"
    # shellcheck disable=SC2046
    (cd "$debs" && apt-get "${APT_OPTS[@]}" -q download $(packages_for "$v") >/dev/null) \
        || die "apt-get download failed for python$v"
    for deb in "$debs"/*.deb; do
        dpkg -x "$deb" "$root"
    done
    local libdir="$root/usr/lib/x86_64-linux-gnu"
    local ld="$libdir/ld-linux-x86-64.so.2"
    [ -e "$ld" ] || ld="$root/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
    [ -e "$ld" ] || die "no dynamic loader in unstable's libc6 under $root"
    patchelf --set-interpreter "$ld" --force-rpath --set-rpath "$libdir" "$py"
    verify "$v" "$py" || die "python$v from Debian unstable does not run (see above)"
    rm -rf "$debs"
    touch "$root/.ready"
    say "python$v ready ($py, $("$py" -c 'import sys; print(sys.version.split()[0])'))"
}

make_venv() {
    local v=$1 dir=$2 py="$PYTHONS/$1/usr/bin/python$1"
    [ -x "$py" ] || die "python$v is not set up"
    local wheel
    wheel=$(ls "$PYTHONS/$v"/usr/share/python-wheels/pip-*.whl 2>/dev/null | sed -n 1p)
    [ -n "$wheel" ] || die "no pip wheel in $PYTHONS/$v/usr/share/python-wheels"
    "$py" -m venv --without-pip "$dir"
    "$dir/bin/python" "$wheel/pip" install -q --no-index "$wheel"
    say "venv with pip at $dir"
}

for v in "${VERSIONS[@]}"; do
    setup_version "$v"
done
if [ "${1:-}" = "--venv" ]; then
    [ $# -eq 3 ] || die "usage: $0 --venv 3.X DIR"
    make_venv "$2" "$3"
fi
