#!/usr/bin/env bash
# Sets up (if needed) and runs the whole test suite: the fast core tests and the
# integration tests against real hosts. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"
