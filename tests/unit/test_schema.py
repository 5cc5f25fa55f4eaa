"""The JSON Schemas of spec files (`fabric-emu schema`) take every shipped file and reject broken
ones; docs/spec-reference.md is what the generator writes now."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from fabric_emu.spec.load import read_yaml
from fabric_emu.spec.reference import COMMAND, render
from fabric_emu.spec.schema import experiment_schema, topology_schema

REPO = Path(__file__).resolve().parents[2]
EXPERIMENTS = sorted((REPO / "experiments").glob("*.yaml"))
TOPOLOGIES = sorted((REPO / "topologies").glob("*.yaml"))


def validator(schema: dict) -> jsonschema.Draft202012Validator:
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


EXPERIMENT = validator(experiment_schema())
TOPOLOGY = validator(topology_schema())


def problems(v: jsonschema.Draft202012Validator, data: dict) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in v.iter_errors(data)]


def test_shipped_files_are_there():
    assert len(EXPERIMENTS) >= 10 and len(TOPOLOGIES) >= 3


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.name)
def test_every_shipped_experiment_validates(path):
    data = read_yaml(path)
    assert problems(EXPERIMENT, data) == []
    if isinstance(data["topology"], str):  # a path, relative to the file; the same inline
        data["topology"] = read_yaml(path.parent / data["topology"])
        assert problems(EXPERIMENT, data) == []


def test_shipped_experiments_give_topologies_both_ways():
    kinds = {type(read_yaml(p)["topology"]) for p in EXPERIMENTS}
    assert kinds == {str, dict}


@pytest.mark.parametrize("path", TOPOLOGIES, ids=lambda p: p.name)
def test_every_shipped_topology_validates(path):
    assert problems(TOPOLOGY, read_yaml(path)) == []


QUICKSTART = REPO / "experiments" / "quickstart.yaml"


def put(data: dict, field: str, value) -> None:
    """Set a dotted field, as --set does."""
    *parents, last = field.split(".")
    for key in parents:
        data = data.setdefault(key, {})
    data[last] = value


@pytest.mark.parametrize("field, value", [
    ("workload.size", "8 MiB"), ("workload.size", 8_000_000), ("timeout", "1.5s"), ("timeout", 2),
    ("dcqcn.rate_ai", "10Mbps"), ("ecn.kmin", "100KB"), ("topology.dilation", "auto"),
    ("topology.port_buffer", "512KiB"), ("events", [{"at": "300us", "link": "leaf1-spine2", "state": "down"}]),
])
def test_the_schema_takes_what_the_loader_takes(field, value):
    data = read_yaml(QUICKSTART)
    data["topology"] = read_yaml(QUICKSTART.parent / data["topology"])
    put(data, field, value)
    assert problems(EXPERIMENT, data) == []


@pytest.mark.parametrize("field, value, expected", [
    ("extra", 1, "Additional properties are not allowed ('extra' was unexpected)"),
    ("workload.colour", "red", "workload: "),
    ("workload.iterations", "many", "workload: "),
    ("workload.size", "eight megabytes", "workload: "),
    ("seed", -1, "seed: -1 is less than the minimum of 0"),
    ("ecn.kmin", -5, "ecn.kmin: "),
    ("load_balancing", "random", "load_balancing: 'random' is not one of"),
    ("topology", 4, "topology: 4 is not valid"),
])
def test_a_broken_experiment_fails(field, value, expected):
    data = read_yaml(QUICKSTART)
    put(data, field, value)
    found = problems(EXPERIMENT, data)
    assert any(p.startswith(expected) or expected in p for p in found), found


@pytest.mark.parametrize("field, value", [
    ("colour", "red"), ("spines", "two"), ("spines", 0), ("kind", "torus"), ("dilation", "fast"),
    ("host_link", {"gbps": 100, "lanes": 4}), ("port_buffer", "1 megabyte"),
])
def test_a_broken_topology_fails(field, value):
    data = read_yaml(REPO / "topologies" / "ls-2x4x2.yaml")
    data[field] = value
    assert problems(TOPOLOGY, data)


def test_every_key_has_a_description():
    def walk(schema: dict, where: str) -> list[str]:
        missing = []
        for name, prop in schema.get("properties", {}).items():
            if not prop.get("description"):
                missing.append(f"{where}.{name}")
        return missing

    for schema in (experiment_schema(), topology_schema()):
        missing = [m for name, model in schema["$defs"].items() for m in walk(model, name)] + walk(schema, "")
        assert missing == []


def run_schema(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "80"}
    return subprocess.run([sys.executable, "-m", "fabric_emu", "schema", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)


def test_the_command_prints_the_schemas():
    r = run_schema()
    assert r.returncode == 0 and json.loads(r.stdout) == experiment_schema()
    r = run_schema("--topology")
    assert r.returncode == 0 and json.loads(r.stdout) == topology_schema()


def test_the_spec_reference_is_up_to_date():
    page = REPO / "docs" / "spec-reference.md"
    assert page.read_text() == render(), f"docs/spec-reference.md is stale: regenerate it with `{COMMAND}`"


def test_the_reference_names_every_key():
    page = render()
    schema = experiment_schema()
    for name in schema["properties"]:
        assert f"| `{name}` |" in page
    for name in schema["$defs"]["PfcSpec"]["properties"]:
        assert f"| `pfc.{name}` |" in page
    for name in schema["$defs"]["FatTreeSpec"]["properties"]:
        assert f"| `{name}` |" in page
