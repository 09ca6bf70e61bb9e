#!/usr/bin/env bash
# The real tools that tests/it/formats.rs checks pyfleet's output formats with:
#   - chromium (Debian): opens the fleet's flamegraph.svg headless; fonts-dejavu-core so that
#     inferno's script measures real text;
#   - go tool pprof (Debian's golang-go): reads the pprof output back;
#   - speedscope's published file-format schema, from the npm package speedscope (npm pack,
#     nothing installed), cached in ${PYFLEET_FORMAT_TOOLS:-~/.cache/pyfleet/format-tools}/speedscope;
#   - tmux (Debian): the terminal `pyfleet top` is driven in (tests/it/top.rs);
#   - puppeteer-core from npm (no browser of its own), cached in
#     ${PYFLEET_FORMAT_TOOLS:-~/.cache/pyfleet/format-tools}/puppeteer: it drives chromium
#     through the DevTools protocol for the fleet page's test (tests/web/fleet_page.cjs);
#   - jsonschema from PyPI, in a venv cached under
#     ${PYFLEET_VENVS:-~/.cache/pyfleet/venvs}/format-tools (made with pyenv's newest 3.11).
# Idempotent: about a second when everything is there. Needs root for apt-get.
set -euo pipefail
cd "$(dirname "$0")/.."

TOOLS=${PYFLEET_FORMAT_TOOLS:-$HOME/.cache/pyfleet/format-tools}
VENVS=${PYFLEET_VENVS:-$HOME/.cache/pyfleet/venvs}
VENV=$VENVS/format-tools
SPEEDSCOPE_VERSION=${PYFLEET_SPEEDSCOPE_VERSION:-1.25.0}
PUPPETEER_VERSION=${PYFLEET_PUPPETEER_VERSION:-25.16.0}
JSONSCHEMA_SPEC=${PYFLEET_JSONSCHEMA:-jsonschema>=4.17,<5}

say() { echo "setup-format-tools: $*" >&2; }
die() { say "error: $*"; exit 1; }

# --- Debian packages --------------------------------------------------------------------------
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v go >/dev/null 2>&1 || missing+=(golang-go)
[ -d /usr/share/fonts/truetype/dejavu ] || missing+=(fonts-dejavu-core)
command -v tmux >/dev/null 2>&1 || missing+=(tmux)

[ ${#missing[@]} -eq 0 ] || scripts/apt-install.sh "${missing[@]}"
command -v chromium >/dev/null 2>&1 || die "chromium is still missing after the install"
go tool pprof -h >/dev/null 2>&1 || die "go tool pprof does not run"
command -v tmux >/dev/null 2>&1 || die "tmux is still missing after the install"

# --- speedscope's file-format schema -----------------------------------------------------------
SCHEMA_DIR=$TOOLS/speedscope
if [ -s "$SCHEMA_DIR/file-format-schema.json" ] \
    && [ "$(cat "$SCHEMA_DIR/VERSION" 2>/dev/null)" = "$SPEEDSCOPE_VERSION" ]; then
    say "speedscope $SPEEDSCOPE_VERSION schema ready"
else
    command -v npm >/dev/null 2>&1 || die "npm is needed to fetch the speedscope package"
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    say "fetching the speedscope@$SPEEDSCOPE_VERSION package (npm pack)"
    (cd "$tmp" && npm pack --silent "speedscope@$SPEEDSCOPE_VERSION" >/dev/null 2>"$tmp/npm.err") \
        || die "npm pack speedscope@$SPEEDSCOPE_VERSION failed: $(tail -n 3 "$tmp/npm.err")"
    tar -xzf "$tmp"/speedscope-*.tgz -C "$tmp" package/dist/release/file-format-schema.json \
        || die "the speedscope package has no dist/release/file-format-schema.json"
    mkdir -p "$SCHEMA_DIR"
    mv "$tmp/package/dist/release/file-format-schema.json" "$SCHEMA_DIR/file-format-schema.json"
    echo "$SPEEDSCOPE_VERSION" > "$SCHEMA_DIR/VERSION"
    say "speedscope $SPEEDSCOPE_VERSION schema in $SCHEMA_DIR"
fi

# --- puppeteer-core ---------------------------------------------------------------------------
PUPPETEER_DIR=$TOOLS/puppeteer
if [ -f "$PUPPETEER_DIR/node_modules/puppeteer-core/package.json" ] \
    && [ "$(cat "$PUPPETEER_DIR/VERSION" 2>/dev/null)" = "$PUPPETEER_VERSION" ]; then
    say "puppeteer-core $PUPPETEER_VERSION ready"
else
    command -v npm >/dev/null 2>&1 || die "npm is needed to fetch puppeteer-core"
    mkdir -p "$PUPPETEER_DIR"
    (cd "$PUPPETEER_DIR" && npm install --silent --no-audit --no-fund \
        "puppeteer-core@$PUPPETEER_VERSION" >/dev/null 2>"$PUPPETEER_DIR/npm.err") \
        || die "npm install puppeteer-core@$PUPPETEER_VERSION failed: $(tail -n 3 "$PUPPETEER_DIR/npm.err")"
    echo "$PUPPETEER_VERSION" > "$PUPPETEER_DIR/VERSION"
    say "puppeteer-core $PUPPETEER_VERSION in $PUPPETEER_DIR"
fi

# --- jsonschema -------------------------------------------------------------------------------
scripts/pip-venv.sh "$VENV" "$JSONSCHEMA_SPEC" bin/python -c 'import jsonschema'
say "$(chromium --version 2>/dev/null | head -n 1), $(go version | awk '{print $3}'), jsonschema $("$VENV/bin/python" -c 'from importlib.metadata import version; print(version("jsonschema"))')"
