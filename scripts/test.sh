#!/usr/bin/env bash
# Sets up (if needed) and runs the whole test suite: the fast core tests and the
# integration tests against real hosts. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
if ! command -v chromium >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  # The quickstart's integration test opens its HTML page in headless Chromium.
  echo "[test] installing chromium from Debian"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; } \
    >/dev/null 2>&1 || echo "[test] could not install chromium: the page check will be skipped"
fi
exec .venv/bin/python -m pytest -q "$@"
