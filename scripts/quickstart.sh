#!/usr/bin/env bash
# Sets up (if needed) and runs the main job on the embedded default kit.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/threadweaver quickstart "$@"
