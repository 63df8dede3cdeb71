#!/usr/bin/env bash
# The browser tests/test_web.py drives: Debian's chromium and chromium-driver, headless.
# Elsewhere install any Chromium and its chromedriver and point RASE_CHROMIUM / RASE_CHROMEDRIVER at them.
set -euo pipefail
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
    exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
$sudo apt-get update -qq
$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
chromium --version
