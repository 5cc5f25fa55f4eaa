"""Mininet on Python 3.12 and later (Ubuntu 24.04's): Debian's mininet 2.3 imports
distutils.version.StrictVersion (mininet.node, and Cluster Edition), and distutils is gone from
the standard library. Call install() before importing any of Mininet: where distutils is
missing, it provides the one class Mininet uses (version comparisons of Open vSwitch and
Mininet itself)."""

from __future__ import annotations

import importlib
import re
import sys
import types


class StrictVersion:
    """The comparisons Mininet makes of dotted versions ("2.17.90" < "2.3" is False)."""

    def __init__(self, text: str) -> None:
        self.parts = tuple(int(p) for p in re.findall(r"\d+", str(text))[:3])

    def __lt__(self, other: "StrictVersion | str") -> bool:
        return self.parts < _version(other).parts

    def __le__(self, other: "StrictVersion | str") -> bool:
        return self.parts <= _version(other).parts

    def __gt__(self, other: "StrictVersion | str") -> bool:
        return self.parts > _version(other).parts

    def __ge__(self, other: "StrictVersion | str") -> bool:
        return self.parts >= _version(other).parts

    def __eq__(self, other: object) -> bool:
        return isinstance(other, (StrictVersion, str)) and self.parts == _version(other).parts


def _version(v: "StrictVersion | str") -> StrictVersion:
    return v if isinstance(v, StrictVersion) else StrictVersion(v)


def install() -> None:
    try:
        importlib.import_module("distutils.version")  # Python <= 3.11, or setuptools' copy
        return
    except ImportError:
        pass
    package, version = types.ModuleType("distutils"), types.ModuleType("distutils.version")
    version.StrictVersion = StrictVersion  # type: ignore[attr-defined]
    package.version = version  # type: ignore[attr-defined]
    sys.modules["distutils"], sys.modules["distutils.version"] = package, version
