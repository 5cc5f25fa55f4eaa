"""The spec reference (docs/spec-reference.md), rendered as Markdown from the files' JSON Schemas
(fabric_emu.spec.schema): every field's dotted path, type and allowed values, default and
description."""

from __future__ import annotations

from typing import Any

from fabric_emu.spec import units
from fabric_emu.spec.schema import experiment_schema, topology_schema

COMMAND = "fabric-emu schema --markdown > docs/spec-reference.md"

_HEADER = f"""# Spec reference

Every key of experiment and topology files, generated from the models in `fabric_emu/spec/`:
regenerate it with `{COMMAND}`
(a unit test fails while it differs). Sizes, rates and times take human units (`8MB`, `1GiB`, `100Gbps`, `50us`); a bare number is bytes, bits/s or seconds.
`N` in a path is a list index (`events.0.at`). Names of hosts, switches and ports follow
patterns (the JSON Schema has them); checks that involve several keys (thresholds within the
port buffer, host and link names of the fabric) are the loader's. Editors can check files
against the JSON Schema of `fabric-emu schema` (experiments) and `fabric-emu schema --topology`
(topologies).
"""


def _decimal(v: float) -> str:
    """A float without exponent or trailing zeros (1e-06 -> 0.000001)."""
    return f"{v:.12f}".rstrip("0").rstrip(".")


def _number(v: Any) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, float) and not v.is_integer():
        return _decimal(v)
    return f"{int(v):,}" if abs(v) >= 10_000 else str(int(v))


def _bounds(s: dict) -> str:
    lo = (f">= {_number(s['minimum'])}" if "minimum" in s else
          f"> {_number(s['exclusiveMinimum'])}" if "exclusiveMinimum" in s else "")
    hi = (f"<= {_number(s['maximum'])}" if "maximum" in s else
          f"< {_number(s['exclusiveMaximum'])}" if "exclusiveMaximum" in s else "")
    if "minimum" in s and "maximum" in s:
        return f"{_number(s['minimum'])} to {_number(s['maximum'])}"
    return ", ".join(b for b in (lo, hi) if b)


def _branches(s: dict) -> list[dict]:
    """A schema's alternatives, without null (an optional key's default says it)."""
    alts = s.get("anyOf") or s.get("oneOf")
    if alts is None:
        return [s]
    return [b for alt in alts if alt != {"type": "null"} for b in _branches(alt)]


def _refs(s: dict) -> list[str]:
    return [b["$ref"].rsplit("/", 1)[1] for b in _branches(s) if "$ref" in b]


def _discriminator(model: dict) -> tuple[str, list[str]]:
    """The key and values that pick this model in a union (kind: fat-tree, type: allreduce)."""
    for name, p in model["properties"].items():
        if name in model.get("required", []) and ("const" in p or "enum" in p):
            return name, [p["const"]] if "const" in p else p["enum"]
    raise ValueError(f"{model['title']} has no required const or enum key")


def _is_unit(b: dict) -> bool:
    """The string branch of a size, rate or time (fabric_emu.spec.fields)."""
    return b.get("type") == "string" and b.get("description") in (units.SIZE_HELP, units.RATE_HELP, units.TIME_HELP)


def _type(s: dict, defs: dict) -> str:
    branches = _branches(s)
    unit = next((b for b in branches if _is_unit(b)), None)
    parts = []
    for b in branches:
        if "const" in b:
            parts.append(f"`{b['const']}`")
        elif "enum" in b:
            parts.append(", ".join(f"`{v}`" for v in b["enum"]))
        elif unit is not None and b.get("type") in ("integer", "number"):
            continue  # said with the unit, below
        elif b is unit:
            bounds = next((_bounds(n) for n in branches if n.get("type") in ("integer", "number")), "")
            parts.append(unit["description"] + (f" ({bounds})" if bounds else ""))
        elif b.get("type") == "string":
            parts.append("string")
        elif b.get("type") in ("integer", "number"):
            parts.append(" ".join(x for x in (b["type"], _bounds(b)) if x))
        elif b.get("type") == "boolean":
            parts.append("`true`, `false`")
        elif b.get("type") == "array":
            size = _bounds({k: v for k, v in (("minimum", b.get("minItems")), ("maximum", b.get("maxItems")))
                            if v is not None})
            items = _type(b["items"], defs)
            parts.append(f"list of {f'({items})' if ' or ' in items else items}"
                         + (f" ({size} items)" if size else ""))
    refs = _refs(s)
    if len(refs) == 1:
        parts.append("mapping (its keys follow)")
    elif refs:
        parts.append(f"mapping by `{_discriminator(defs[refs[0]])[0]}` (below)")
    return " or ".join(parts)


def _default(name: str, s: dict, model: dict) -> str:
    if name in model.get("required", []):
        return "required"
    if "default" not in s:
        return ""
    v = s["default"]
    if v is None:
        return "none"
    if isinstance(v, dict):  # a mapping's keys have their own rows; a short one is said here too
        text = _yaml(v)
        return f"`{text}`" if len(text) <= 30 else ""
    return f"`{_yaml(v)}`"


def _yaml(v: Any) -> str:
    """A default as a spec file would write it."""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return _decimal(v)
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_yaml(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(_yaml(x) for x in v) + "]"
    return str(v)


def _cell(text: str) -> str:
    return " ".join(text.replace("|", "\\|").split())


def _rows(model: dict, prefix: str, defs: dict) -> list[str]:
    """One table row per key of the model, and of the mappings and lists of mappings below it."""
    rows = []
    for name, s in model["properties"].items():
        path = prefix + name
        rows.append(f"| `{path}` | {_cell(_type(s, defs))} | {_default(name, s, model)} | "
                    f"{_cell(s.get('description', ''))} |")
        if len(_refs(s)) == 1:
            rows += _rows(defs[_refs(s)[0]], path + ".", defs)
        elif s.get("type") == "array" and len(_refs(s["items"])) == 1:
            rows += _rows(defs[_refs(s["items"])[0]], path + ".N.", defs)
    return rows


def _table(model: dict, prefix: str, defs: dict) -> list[str]:
    return ["| Key | Type | Default | Description |", "| --- | --- | --- | --- |", *_rows(model, prefix, defs), ""]


def _union_sections(refs: list[str], prefix: str, defs: dict) -> list[str]:
    """A section per model of a union, headed by the key and values that pick it."""
    out = []
    for r in refs:
        key, values = _discriminator(defs[r])
        out += [f"### {key}: {', '.join(values)}", "", _cell(defs[r].get("description", "")), "",
                *_table(defs[r], prefix, defs)]
    return out


def render() -> str:
    """docs/spec-reference.md."""
    exp, topo = experiment_schema(), topology_schema()
    defs = exp["$defs"]
    workloads = _refs(exp["properties"]["workload"])
    jobs = _refs(exp["properties"]["workloads"]["items"])
    lines = [_HEADER, "## Experiment files", "", _cell(exp["description"]), "", *_table(exp, "", defs),
             "## Workloads", "",
             "The keys of `workload`, one mapping picked by its `type`. Each of `workloads` takes the same "
             f"keys (as `workloads.N.size`); it takes the types {', '.join(f'`{v}`' for r in jobs for v in _discriminator(defs[r])[1])}.",
             "", *_union_sections(workloads, "workload.", defs),
             "## Topology files", "",
             _cell(topo["description"]) + " An experiment's `topology` takes the same keys (as "
             "`topology.spines`), or a topology file's path.", "",
             *_union_sections(_refs(topo), "", topo["$defs"])]
    return "\n".join(lines).rstrip("\n") + "\n"
