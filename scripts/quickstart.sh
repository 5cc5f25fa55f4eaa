#!/usr/bin/env bash
# Set up this machine if needed, then run the quickstart experiment (extra args go to `run`).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$here/scripts/setup.sh"
cd "$here"
exec "$here/.venv/bin/fabric-emu" run experiments/quickstart.yaml "$@"
