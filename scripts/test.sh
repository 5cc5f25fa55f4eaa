#!/usr/bin/env bash
# Set up this machine if needed, then run tests (extra args go to pytest). Two tiers:
#   scripts/test.sh           the whole suite: unit tests, integration tests (real Mininet, Open
#                             vSwitch, os-ken; marked `root`), the benchmarks' smoke modes and
#                             the lab VM tier (tests/vm: a Debian 12 VM booted here, the kernel
#                             datapath inside; skipped with the reason where it cannot boot).
#                             CI runs this (.ci/run).
#   scripts/test.sh --quick   unit tests plus the `smoke`-marked integration tests: one real
#                             quickstart run judged on its measurements. About a minute on a
#                             2-core machine already set up (48 s measured, setup included).
set -euo pipefail
# Root is needed (Mininet, Open vSwitch); re-run through sudo when it exists.
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then exec sudo -- bash "$(readlink -f "${BASH_SOURCE[0]}")" "$@"; fi
  echo "error: $(basename "$0") must run as root (Mininet and Open vSwitch need it) and sudo is not installed" >&2
  exit 2
fi
if [ "${1:-}" = "--quick" ]; then
  shift
  set -- -m "not root or smoke" "$@"
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$here/scripts/setup.sh"
cd "$here"
exec "$here/.venv/bin/python" -m pytest -ra --durations=25 "$@"
