"""Parse the human units used in spec files: sizes, rates and times (and the strings they take,
as JSON Schema patterns)."""

from __future__ import annotations

import re

_NUMBER = r"(?P<num>\d+(?:\.\d+)?)\s*"

_SIZE_UNITS = {
    "b": 1, "": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9,
    "kib": 2**10, "mib": 2**20, "gib": 2**30,
}
_RATE_UNITS = {"bps": 1, "kbps": 10**3, "mbps": 10**6, "gbps": 10**9, "tbps": 10**12}
_TIME_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}

SIZE_HELP = "a byte count or a size such as 64KB, 8MB, 1GiB"
RATE_HELP = "a rate such as 100Gbps or 400Mbps"
TIME_HELP = "a time such as 50us, 2ms or 1.5s"


def _parse(value: object, units: dict[str, float], what: str) -> float:
    if isinstance(value, bool):
        raise ValueError(what)
    if isinstance(value, (int, float)):
        return float(value)
    if not isinstance(value, str):
        raise ValueError(what)
    m = re.fullmatch(_NUMBER + r"(?P<unit>[a-zA-Zµ]*)", value.strip())
    if not m or m.group("unit").lower() not in units:
        raise ValueError(what)
    return float(m.group("num")) * units[m.group("unit").lower()]


def _json_pattern(units: dict[str, float]) -> str:
    """The strings _parse takes, as an ECMAScript regex for JSON Schema (which has no flag for case)."""
    def either_case(unit: str) -> str:  # the tables' keys are lower case; µ has no upper case here
        return "".join(f"[{c}{c.upper()}]" if c.upper().lower() == c != c.upper() else c for c in unit)
    alternatives = "|".join(either_case(u) for u in sorted(units, key=len, reverse=True) if u)
    return rf"^\s*[0-9]+(\.[0-9]+)?\s*({alternatives})?\s*$"


SIZE_PATTERN = _json_pattern(_SIZE_UNITS)
RATE_PATTERN = _json_pattern(_RATE_UNITS)
TIME_PATTERN = _json_pattern(_TIME_UNITS)


def parse_size(value: object) -> int:
    """Bytes from an int or a string like '8MB' (SI) or '8MiB' (binary)."""
    n = _parse(value, _SIZE_UNITS, SIZE_HELP)
    if n != int(n):
        raise ValueError(SIZE_HELP)
    return int(n)


def parse_rate_bps(value: object) -> float:
    """Bits per second from a string like '100Gbps'; a bare number means bits per second."""
    return _parse(value, _RATE_UNITS, RATE_HELP)


def parse_time_s(value: object) -> float:
    """Seconds from a string like '50us'; a bare number means seconds."""
    return _parse(value, _TIME_UNITS, TIME_HELP)


def format_size(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{int(n)}B"


def format_time(s: float) -> str:
    """Seconds as a spec writes them: 400us, 200ms, 1.5s."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3)):
        if s >= scale:
            return f"{s / scale:g}{unit}"
    return f"{s * 1e6:g}us"


def format_rate(bps: float) -> str:
    for unit, scale in (("Gbps", 1e9), ("Mbps", 1e6), ("Kbps", 1e3)):
        if bps >= scale:
            return f"{bps / scale:.4g}{unit}"
    return f"{bps:.4g}bps"
