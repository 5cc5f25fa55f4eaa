"""Every ```yaml block of README.md and docs/**/*.md is a valid spec, by one rule:

- a block with a top-level `workload` or `workloads` is an experiment (a relative `topology:`
  path is resolved against experiments/, where the shipped experiments are);
- one with a top-level `kind` and no workload is a topology;
- anything else is a fragment of an experiment, its keys put over experiments/quickstart.yaml's.

Each must pass the loader (with the plan's checks of host and link names) and the JSON Schema
of its kind of file. Blocks that are not specs (lab commands, shell) are not fenced as yaml.
"""

from __future__ import annotations

import re
from pathlib import Path

import jsonschema
import pytest
from ruamel.yaml import YAML

from fabric_emu.run.prepare import load_checked
from fabric_emu.spec.load import load_topology
from fabric_emu.spec.schema import experiment_schema, topology_schema

REPO = Path(__file__).resolve().parents[2]
EXPERIMENTS = REPO / "experiments"
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("**/*.md"))]
FENCE = re.compile(r"^```yaml[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)

_yaml = YAML(typ="safe", pure=True)
_yaml.allow_duplicate_keys = False


def blocks() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        text = page.read_text()
        for m in FENCE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            found.append((f"{page.relative_to(REPO)}:{line}", m.group(1)))
    return found


BLOCKS = blocks()


def _resolved(data: dict) -> dict:
    """The experiment with a relative topology path made absolute, as if it were in experiments/."""
    topo = data.get("topology")
    if isinstance(topo, str) and not Path(topo).is_absolute():
        data = {**data, "topology": str((EXPERIMENTS / topo).resolve())}
    return data


def _check_schema(schema: dict, data: dict, where: str) -> None:
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
              for e in jsonschema.Draft202012Validator(schema).iter_errors(data)]
    assert errors == [], f"{where}: not valid under the JSON Schema: {errors}"


def test_there_are_yaml_blocks():
    assert len(BLOCKS) >= 5


@pytest.mark.parametrize("where, text", BLOCKS, ids=[w for w, _ in BLOCKS])
def test_every_yaml_block_is_a_valid_spec(where, text, tmp_path):
    data = _yaml.load(text)
    assert isinstance(data, dict), f"{where}: a yaml block is a mapping of spec keys"
    path = tmp_path / "block.yaml"
    if "workload" in data or "workloads" in data:
        data = _resolved(data)
    elif "kind" in data:
        path.write_text(text)
        load_topology(path)
        _check_schema(topology_schema(), data, where)
        return
    else:
        data = {**_resolved(_yaml.load((EXPERIMENTS / "quickstart.yaml").read_text())), **_resolved(data)}
    with path.open("w") as f:
        _yaml.dump(data, f)
    load_checked(path, [], plan_only=True)  # valid: what `fabric-emu show` accepts
    _check_schema(experiment_schema(), data, where)
