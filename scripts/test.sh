#!/usr/bin/env bash
# Set up this machine if needed, then run the whole test suite (extra args go to pytest).
set -euo pipefail
# Root is needed (Mininet, Open vSwitch); re-run through sudo when it exists.
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then exec sudo -- bash "$(readlink -f "${BASH_SOURCE[0]}")" "$@"; fi
  echo "error: $(basename "$0") must run as root (Mininet and Open vSwitch need it) and sudo is not installed" >&2
  exit 2
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$here/scripts/setup.sh"
cd "$here"
exec "$here/.venv/bin/python" -m pytest -ra "$@"
