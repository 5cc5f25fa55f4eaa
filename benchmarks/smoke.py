"""`--smoke` for every benchmark: one tiny round in seconds, which the tests run so that no
benchmark breaks unseen (tests/unit/test_benchmarks.py, tests/integration/test_benchmarks.py)."""

from __future__ import annotations

import argparse


def parse_args(ap: argparse.ArgumentParser, **tiny: object) -> argparse.Namespace:
    """ap's arguments plus --smoke, which makes `tiny` the defaults (options given still win)."""
    ap.add_argument("--smoke", action="store_true", help="tiny settings, seconds: shows it still works")
    args = ap.parse_args()
    if args.smoke:
        ap.set_defaults(**tiny)
        args = ap.parse_args()
    return args
