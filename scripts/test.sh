#!/usr/bin/env bash
# Sets up (if needed) and runs the whole test suite: the fast core tests and the
# integration tests against real hosts, then the verl tests in the verl venv.
# Extra arguments go to pytest; paths under integration_tests/verl_venv run in .venv-verl.
set -euo pipefail
cd "$(dirname "$0")/.."
# A full run takes about 12 GB of disk (measured on 2026-11-30): the two venvs 7 GB, models, caches and
# /tmp the rest. A full disk fails tests far from their cause, so say what there is.
TMP=${TMPDIR:-/tmp}
free_gb() { df -Pk "$1" | awk 'NR == 2 { printf "%.1f", $4 / 1048576 }'; }
free_disk() { echo "[test] free disk: $(free_gb .) GB here, $(free_gb "$TMP") GB in $TMP"; }
free_disk
if awk -v here="$(free_gb .)" -v tmp="$(free_gb "$TMP")" 'BEGIN { exit !(here < 15 || tmp < 5) }'; then
  echo "[test] warning: under 15 GB free here or 5 GB in $TMP; a full run takes about 12 GB, the venvs 7 of them" >&2
fi
scripts/setup.sh
scripts/setup.sh verl
if ! { command -v chromium && command -v chromedriver; } >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  # The pages' integration tests drive headless Chromium through Selenium and Debian's chromedriver.
  echo "[test] installing chromium and chromium-driver from Debian"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium chromium-driver; } \
    >/dev/null 2>&1 || echo "[test] could not install chromium: the page checks will be skipped"
fi
echo "[test] ruff: lint and format"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
if [ $# -gt 0 ]; then
  case "$1" in
    integration_tests/verl_venv*) exec .venv-verl/bin/python -m pytest -q "$@" ;;
    *) exec .venv/bin/python -m pytest -q "$@" ;;
  esac
fi
status=0
# The slowest tests too, so that a CI run shows where its time went.
.venv/bin/python -m pytest -q --durations=40 || status=$?
echo "[test] the verl integration tests, in .venv-verl"
.venv-verl/bin/python -m pytest -q integration_tests/verl_venv || status=$?
free_disk
exit $status
