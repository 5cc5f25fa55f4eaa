"""Build a C source once per version: the output is cached under a name with the source's hash,
written to a temporary name and renamed, so concurrent builders never see half a file."""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Callable
from pathlib import Path


def build_cached(source: Path, cache: Path, stem: str, suffix: str,
                 command: Callable[[Path], list[str]]) -> Path:
    """cache/<stem>-<hash of source><suffix>, built by command(output path) if missing."""
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    out = cache / f"{stem}-{digest}{suffix}"
    if out.exists():
        return out
    cache.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    try:
        subprocess.run(command(tmp), check=True, capture_output=True, text=True)
    except subprocess.CalledProcessError as e:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"compiling {source.name} failed: {e.stderr.strip()}") from None
    os.replace(tmp, out)
    return out
