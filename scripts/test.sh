#!/usr/bin/env bash
# Set up this machine if needed, then run the whole test suite (extra args go to pytest).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$here/scripts/setup.sh"
cd "$here"
exec "$here/.venv/bin/python" -m pytest -ra "$@"
