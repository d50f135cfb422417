#!/usr/bin/env bash
# Install headless Chromium for the browser tests (pytest -m browser) when it is missing.
# Debian/Ubuntu: the distribution's `chromium` package. Set INTERP_CHROMIUM to use another
# binary instead (the tests look there first).
set -euo pipefail

if [[ -n "${INTERP_CHROMIUM:-}" && -x "${INTERP_CHROMIUM}" ]]; then
    echo "using INTERP_CHROMIUM=${INTERP_CHROMIUM}"
    exit 0
fi
for candidate in /usr/lib/chromium/chromium chromium chromium-browser google-chrome; do
    if command -v "$candidate" >/dev/null 2>&1; then
        echo "chromium found: $(command -v "$candidate")"
        exit 0
    fi
done

if ! command -v apt-get >/dev/null 2>&1; then
    echo "no chromium and no apt-get: install Chromium yourself and set INTERP_CHROMIUM" >&2
    exit 1
fi
SUDO=""
if [[ "$(id -u)" != 0 ]]; then
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq chromium fonts-dejavu-core >/dev/null
command -v chromium >/dev/null
echo "installed: $(chromium --version 2>/dev/null || echo chromium)"
