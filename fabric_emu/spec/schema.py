"""JSON Schemas (draft 2020-12) of experiment and topology files, from the models, for editors
(the YAML language server: `# yaml-language-server: $schema=...`) and `fabric-emu schema`.

They describe the files as written: sizes, rates and times may be strings in human units, an
experiment's `topology` may be a path, `dilation` may be `auto`. Checks across fields (one of
workload and workloads, thresholds within the buffer, names of hosts and links) are the
loader's alone.
"""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter

from fabric_emu.spec.experiment import ExperimentSpec
from fabric_emu.spec.topology import Topology

DIALECT = "https://json-schema.org/draft/2020-12/schema"

# pydantic writes a bound of an Optional of an annotated type (Optional[Bytes] = Field(ge=0)) on the
# union, under its own name; JSON Schema knows it as these, on the number.
_BOUNDS = {"ge": "minimum", "gt": "exclusiveMinimum", "le": "maximum", "lt": "exclusiveMaximum"}
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "$defs")


def _standard_bounds(schema: Any) -> None:
    """Rename pydantic's bound keys to JSON Schema's and move them to the numbers they bound, in
    place, in every subschema."""
    if not isinstance(schema, dict):
        return
    bounds = {name: schema.pop(key) for key, name in _BOUNDS.items() if key in schema}
    if bounds:
        numbers = [s for s in _numbers(schema) if s.get("type") in ("integer", "number")]
        if not numbers:
            raise ValueError(f"bounds {bounds} on a schema without numbers: {schema}")
        for s in numbers:
            s.update(bounds)
    for key in _SUBSCHEMA_LISTS:
        for sub in schema.get(key, []):
            _standard_bounds(sub)
    for key in _SUBSCHEMA_MAPS:
        for sub in schema.get(key, {}).values():
            _standard_bounds(sub)
    for key in ("items", "additionalProperties"):
        _standard_bounds(schema.get(key))


def _numbers(schema: dict) -> list[dict]:
    """The schema and every alternative below it."""
    alternatives = [s for key in ("anyOf", "oneOf") for s in schema.get(key, [])]
    return [schema, *[n for s in alternatives for n in _numbers(s)]]


def _document(schema: dict, title: str, description: str) -> dict:
    _standard_bounds(schema)
    return {"$schema": DIALECT, "title": title, "description": description,
            **{k: v for k, v in schema.items() if k not in ("title", "description")}}


def topology_schema() -> dict:
    """The schema of a topology file (topologies/*.yaml)."""
    schema = TypeAdapter(Topology).json_schema(mode="validation")
    return _document(schema, "fabric-emu topology",
                     "A fabric: its kind (leaf-spine, fat-tree, rail-optimized or custom), size, links, "
                     "dilation, MTU and port buffers.")


def experiment_schema() -> dict:
    """The schema of an experiment file (experiments/*.yaml)."""
    schema = ExperimentSpec.model_json_schema(mode="validation")
    topology = schema["properties"]["topology"]
    schema["properties"]["topology"] = {
        "description": topology.pop("description"),
        "anyOf": [{"type": "string", "description": "a topology file's path, relative to this file"}, topology]}
    return _document(schema, "fabric-emu experiment", ExperimentSpec.__doc__)
