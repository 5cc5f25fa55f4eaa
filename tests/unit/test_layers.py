"""The import contracts in pyproject.toml ([tool.importlinter]) hold, and can fail: a copy of the
packages with an upward import and an unplaced subpackage breaks the layers contract."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """lint-imports on the packages under `root`, with the contracts in its pyproject.toml. Run
    from `root` so the packages there are the ones analysed (it puts its working folder first
    on the import path), and without a cache, which would be written there."""
    return subprocess.run([sys.executable, str(LINT_IMPORTS), "--no-cache"], cwd=root,
                          capture_output=True, text=True, timeout=60)


def test_contracts_are_kept():
    done = lint_imports(REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def test_layers_contract_can_fail(tmp_path: Path):
    for package in ("fabric_emu", "controller"):
        shutil.copytree(REPO / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    units = tmp_path / "fabric_emu" / "spec" / "units.py"
    units.write_text(units.read_text() + "\nfrom fabric_emu.run import runner\n")
    (tmp_path / "fabric_emu" / "unplaced").mkdir()
    (tmp_path / "fabric_emu" / "unplaced" / "__init__.py").write_text('"""Not in a layer."""\n')

    done = lint_imports(tmp_path)

    assert done.returncode == 1, done.stdout + done.stderr
    words = " ".join(done.stdout.split())  # long lines may be wrapped
    assert "fabric_emu layers: stages of the data flow, each importing only those below it BROKEN" \
        in words
    assert "fabric_emu.spec is not allowed to import fabric_emu.run" in done.stdout
    assert "fabric_emu.spec.units -> fabric_emu.run.runner" in done.stdout
    assert "- fabric_emu.unplaced" in done.stdout
