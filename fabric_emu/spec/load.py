"""Spec files: load YAML, apply --set overrides, validate into typed models.

Every problem becomes a SpecError that names the file, the dotted field and what is allowed,
so the CLI can print one line per problem and exit 2 before anything is created.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from fabric_emu.spec.errors import SpecError
from fabric_emu.spec.experiment import ExperimentSpec
from fabric_emu.spec.topology import TOPOLOGY_KINDS, UNKNOWN_KIND, Topology, TopologyBase
from fabric_emu.spec.workloads import WORKLOAD_TYPES

_yaml = YAML(typ="safe", pure=True)
_yaml.allow_duplicate_keys = False

_topology_adapter: TypeAdapter = TypeAdapter(Topology)


def read_yaml(path: Path) -> Any:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise SpecError([(str(path), "", "file not found")]) from None
    except OSError as e:
        raise SpecError([(str(path), "", f"cannot read ({e.strerror})")]) from None
    try:
        return _yaml.load(text)
    except YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise SpecError([(str(path), where, f"invalid YAML: {problem}")]) from None


def _set_dotted(data: dict, dotted: str, raw: str, source: str) -> None:
    """Apply one --set override; the value is parsed as YAML (so 4 is an int, [a, b] a list)."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", dotted):
        raise SpecError([(source, dotted, "not a dotted field path (like topology.spines)")])
    try:
        value = _yaml.load(raw) if raw.strip() else raw
    except YAMLError:
        value = raw
    node = data
    parts = dotted.split(".")
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise SpecError([(source, dotted, f"'{part}' is not a mapping, cannot set a field inside it")])
        node = child
    node[parts[-1]] = value


def _field_path(loc: tuple) -> str:
    # pydantic puts the discriminator tag in loc (workload.allreduce.size); users never wrote it.
    if len(loc) > 1 and loc[0] == "workload" and loc[1] in WORKLOAD_TYPES:
        loc = loc[:1] + loc[2:]
    if len(loc) > 1 and loc[0] == "topology" and loc[1] in TOPOLOGY_KINDS:
        loc = loc[:1] + loc[2:]
    elif loc and loc[0] in TOPOLOGY_KINDS:  # a topology file's own fields
        loc = loc[1:]
    parts = [str(p) for p in loc if not re.match(r"(list|literal|str|int)\[", str(p))]
    return ".".join(parts)


def _errors_to_problems(err: ValidationError, files: dict[str, str]) -> list[tuple[str, str, str]]:
    """Map pydantic errors to (file, field, message); 'files' maps a top-level key to its file."""
    problems = []
    errors = err.errors(include_url=False)
    # A topology of an unknown kind is checked as a leaf-spine: its missing fields are noise.
    def parent(path: str) -> str:  # "topology." of "topology.kind", "" of "kind"
        return path[:path.rfind(".") + 1]

    def bad_kind(e: dict) -> bool:
        return _field_path(e["loc"]).endswith("kind") and (UNKNOWN_KIND in e["msg"] or e["type"] == "missing")

    unknown_kind = {parent(_field_path(e["loc"])) for e in errors if bad_kind(e)}
    for e in errors:
        path = _field_path(e["loc"])
        if e["type"] == "missing" and parent(path) in unknown_kind and not bad_kind(e):
            continue
        top = path.split(".")[0] if path else ""
        file = files.get(top, files[""])
        if top in files and top != "" and path.startswith(top + "."):
            path = path[len(top) + 1:]
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        elif e["type"] == "missing":
            msg = "required field is missing" + (f" ({UNKNOWN_KIND})" if bad_kind(e) else "")
        elif e["type"] == "literal_error":
            msg = f"got {e.get('input')!r}; {msg[0].lower()}{msg[1:]}"
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        problems.append((file, path, msg))
    return problems


def load_topology(path: str | Path, overrides: list[str] | None = None) -> TopologyBase:
    path = Path(path)
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise SpecError([(str(path), "", "expected a mapping of fields at the top level")])
    for item in overrides or []:
        key, _, raw = item.partition("=")
        _set_dotted(data, key, raw, "--set")
    try:
        return _topology_adapter.validate_python(data)
    except ValidationError as e:
        raise SpecError(_errors_to_problems(e, {"": str(path)})) from None


def load_experiment(path: str | Path, overrides: list[str] | None = None) -> ExperimentSpec:
    """Load an experiment; its topology may be a path (relative to the file) or a mapping."""
    path = Path(path)
    return experiment_from_data(read_yaml(path), str(path), path.parent, overrides)


def experiment_from_data(data: Any, source: str, base_dir: Path,
                         overrides: list[str] | None = None) -> ExperimentSpec:
    """Validate an experiment given as data (a file's YAML, or a dict from Python). `source`
    names it in errors; a topology given as a path is read relative to `base_dir`."""
    if not isinstance(data, dict):
        raise SpecError([(source, "", "expected a mapping of fields at the top level")])
    data = copy.deepcopy(data)  # the overrides and the topology file go into a copy
    files = {"": source}
    topo = data.get("topology")
    if isinstance(topo, str):
        topo_path = (base_dir / topo).resolve() if not Path(topo).is_absolute() else Path(topo)
        if not topo_path.is_file():
            raise SpecError([(source, "topology", f"file not found: {topo}")])
        topo_data = read_yaml(topo_path)
        if not isinstance(topo_data, dict):
            raise SpecError([(str(topo_path), "", "expected a mapping of fields at the top level")])
        data["topology"] = topo_data
        files["topology"] = str(topo_path)
    for item in overrides or []:
        key, sep, raw = item.partition("=")
        if not sep:
            raise SpecError([("--set", item, "expected dotted.key=value")])
        _set_dotted(data, key, raw, "--set")
    try:
        spec = ExperimentSpec.model_validate(data)
    except ValidationError as e:
        raise SpecError(_errors_to_problems(e, files)) from None
    return spec


def resolved_dict(spec: BaseModel) -> dict:
    """The fully resolved spec (defaults filled in), as plain data for experiment.yaml."""
    return spec.model_dump(mode="json")
