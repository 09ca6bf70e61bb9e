#!/usr/bin/env bash
# Installs Debian packages for the test setup scripts: `scripts/apt-install.sh PKG...`.
# Refreshes the package lists once if one of the packages is unknown to them, and starts no
# service during the install (a policy-rc.d that denies starts, unless the machine already
# has one). Needs root. Uses the machine's own apt sources.
set -euo pipefail
[ $# -gt 0 ] || exit 0
say() { echo "apt-install: $*" >&2; }
die() { say "error: $*"; exit 1; }

[ "$(id -u)" = 0 ] || die "need root to install $* with apt-get (or install them yourself)"
say "installing $*"
for pkg in "$@"; do
    if ! apt-cache show "$pkg" >/dev/null 2>&1; then
        say "apt-get update (no $pkg in the package lists)"
        apt-get update -qq || die "apt-get update failed"
        break
    fi
done
own_policy=
if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod 0755 /usr/sbin/policy-rc.d
    own_policy=1
fi
rc=0
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null \
    || rc=$?
[ -z "$own_policy" ] || rm -f /usr/sbin/policy-rc.d
[ "$rc" = 0 ] || die "apt-get install $* failed (exit $rc)"
