"""Sweeps and comparisons of runs, as pure data: the grid, the runs' results, the table rows.

`fabric-emu sweep` turns `--over KEY=V1,V2` and `--seeds 1-5` into grid points (each a list
of `--set` overrides) times seeds; `fabric-emu compare` groups existing runs into points by the
spec keys that differ between them. Either way every point's runs are aggregated over seeds
into one row of comparison.csv. No files, no root: the CLI and fabric_emu.results.compare do the I/O.
"""

from __future__ import annotations

import itertools
import json
import re
import statistics
from dataclasses import dataclass
from typing import Any, Iterable

from fabric_emu.spec.errors import SpecError

MAX_RUNS = 1000  # a typo like --seeds 1-100000 must not spend minutes validating
SEEDS_HELP = "a seed like 4, a range like 1-5, a list like 1,3,7, or both: 1-3,7"
DOTTED_RE = r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*"
# Keys the resolved spec fills in from others (timeout from the workload, thresholds from the
# buffer, an auto dilation from both): shown only when they alone tell two groups apart.
DERIVED_KEYS = ("timeout", "topology.dilation", "ecn.kmin", "ecn.kmax",
                "pfc.headroom", "pfc.xoff", "pfc.xon")
METRICS = ("jct_fabric_s", "busbw_fraction")  # from each run's summary.json
STATS = ("mean", "min", "max", "stdev")


# ---------------------------------------------------------------------------- the grid
@dataclass(frozen=True)
class Axis:
    """One --over: a dotted spec key and the values it takes, as the user wrote them."""
    key: str
    values: tuple[str, ...]


@dataclass(frozen=True)
class Point:
    """One grid point: a value per swept key (empty when nothing is swept)."""
    index: int  # 1-based, in grid order
    values: tuple[tuple[str, str], ...]

    @property
    def label(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.values) or "as specified"

    def sets(self) -> list[str]:
        """The `--set` overrides that make this point out of the experiment."""
        return [f"{k}={v}" for k, v in self.values]


def parse_seeds(text: str) -> list[int]:
    """'1-5', '1,3,7', '4' or '1-3,7' into seeds, in the order given."""
    seeds: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        m = re.fullmatch(r"(\d+)(?:\s*-\s*(\d+))?", part)
        if not m:
            raise SpecError([("--seeds", "", f"got {text!r} ({SEEDS_HELP})")])
        first, last = int(m.group(1)), int(m.group(2) or m.group(1))
        if last < first:
            raise SpecError([("--seeds", "", f"the range {part} runs backwards ({SEEDS_HELP})")])
        if len(seeds) + last - first + 1 > MAX_RUNS:
            raise SpecError([("--seeds", "", f"{text} is more than {MAX_RUNS} seeds (at most {MAX_RUNS} runs a sweep)")])
        seeds.extend(range(first, last + 1))
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise SpecError([("--seeds", "", f"seed {repeated[0]} is given twice")])
    return seeds


def split_values(text: str) -> list[str]:
    """Split on the commas outside brackets and quotes, so [h1,h3],[h5,h7] is two values."""
    values, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            values.append(text[start:i].strip())
            start = i + 1
    values.append(text[start:].strip())
    return values


def parse_over(items: Iterable[str]) -> list[Axis]:
    """Each 'KEY=V1,V2,...' into an Axis; the values stay text, parsed later like --set's."""
    axes: list[Axis] = []
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not re.fullmatch(DOTTED_RE, key):
            raise SpecError([("--over", item, "expected dotted.key=value1,value2,... (like workload.size=1MB,8MB)")])
        if key == "seed":
            raise SpecError([("--over", key, "sweep seeds with --seeds (like --seeds 1-5)")])
        if any(a.key == key for a in axes):
            raise SpecError([("--over", key, "given twice; list all its values in one --over")])
        values = split_values(raw)
        if "" in values:
            raise SpecError([("--over", key, f"empty value in {raw!r} (values are separated by commas)")])
        twice = [v for v in values if values.count(v) > 1]
        if twice:
            raise SpecError([("--over", key, f"value {twice[0]!r} is given twice")])
        axes.append(Axis(key, tuple(values)))
    return axes


def _overlaps(a: str, b: str) -> bool:
    """Whether setting one dotted key can change the other (equal, or one inside the other)."""
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def check_overrides(axes: list[Axis], sets: list[str], seeds_given: bool) -> None:
    """A key given by both --set and --over (or seed by --set and --seeds) is ambiguous."""
    set_keys = [s.partition("=")[0].strip() for s in sets]
    for axis in axes:
        for key in set_keys:
            if _overlaps(axis.key, key):
                raise SpecError([("--over", axis.key, f"also given by --set {key}=...; give it once")])
    if seeds_given and "seed" in set_keys:
        raise SpecError([("--seeds", "", "seed is also given by --set seed=...; give it once")])


def grid(axes: list[Axis]) -> list[Point]:
    """The cartesian product of the axes, the first axis varying slowest."""
    combos = itertools.product(*[[(a.key, v) for v in a.values] for a in axes])
    return [Point(i, tuple(c)) for i, c in enumerate(combos, 1)]


def check_size(points: list[Point], seeds: list[int] | None) -> None:
    """Refuse a grid too big to be meant before validating each of its runs."""
    runs = len(points) * (len(seeds) if seeds else 1)
    if runs > MAX_RUNS:
        raise SpecError([("--over", "", f"{runs} runs (points x seeds) are too many (at most {MAX_RUNS} a sweep)")])


# ---------------------------------------------------------------------------- results
def _float(value: Any) -> float | None:
    try:
        return None if value in (None, "") else float(value)
    except (TypeError, ValueError):
        return None


def _bool(value: Any) -> bool | None:
    if isinstance(value, bool) or value is None:
        return value
    return {"true": True, "false": False}.get(str(value).lower())


@dataclass(frozen=True)
class RunResult:
    """What one run of a point measured, from its summary.json (or why it has none)."""
    point: int
    seed: int | None
    run_dir: str  # "" when the run failed before creating its folder
    status: str  # ok | incomplete | failed
    trusted: bool | None
    jct_fabric_s: float | None
    busbw_fraction: float | None
    error: str = ""

    @classmethod
    def of_summary(cls, point: int, seed: int | None, run_dir: str, summary: dict,
                   error: str = "") -> "RunResult":
        fidelity = summary.get("fidelity")
        return cls(point=point, seed=seed, run_dir=run_dir, status=summary.get("status", "failed"),
                   trusted=_bool(fidelity.get("trusted")) if isinstance(fidelity, dict) else None,
                   jct_fabric_s=_float(summary.get("jct_fabric_s")),
                   busbw_fraction=_float(summary.get("busbw_fraction")),
                   error=error or summary.get("error") or ("" if run_dir else "no results folder"))

    @classmethod
    def of_row(cls, row: dict) -> "RunResult":
        """Back from a runs.csv row."""
        seed = row.get("seed")
        return cls(point=int(row["point"]), seed=int(seed) if seed else None, run_dir=row.get("run_dir", ""),
                   status=row.get("status") or "failed", trusted=_bool(row.get("trusted")),
                   jct_fabric_s=_float(row.get("jct_fabric_s")),
                   busbw_fraction=_float(row.get("busbw_fraction")), error=row.get("error", ""))

    @property
    def interrupted(self) -> bool:
        return self.error.startswith("interrupted")  # the runner's words for Ctrl-C / SIGTERM


def describe(values: list[float]) -> dict[str, float | None]:
    """mean, min, max and the sample standard deviation (None below two values)."""
    if not values:
        return dict.fromkeys(STATS)
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values),
            "stdev": statistics.stdev(values) if len(values) > 1 else None}


def _key_cells(keys: list[str], point: Point) -> dict[str, str]:
    values = dict(point.values)
    return {k: values.get(k, "") for k in keys}


def comparison_rows(keys: list[str], points: list[Point], runs: list[RunResult]) -> list[dict]:
    """One row per point that has runs: its key values, run counts, and each metric's
    statistics over its runs that finished ok (a cut-short run's figures are not comparable)."""
    rows = []
    for p in points:
        mine = [r for r in runs if r.point == p.index]
        if not mine:
            continue
        ok = [r for r in mine if r.status == "ok"]
        row: dict = {"point": p.index, **_key_cells(keys, p), "runs": len(mine),
                     "seeds": len({r.seed for r in mine}), "ok": len(ok),
                     "trusted": sum(1 for r in mine if r.trusted)}
        for metric in METRICS:
            stats = describe([v for r in ok if (v := getattr(r, metric)) is not None])
            row.update({f"{metric}_{s}": stats[s] for s in STATS})
        rows.append(row)
    return rows


def run_rows(keys: list[str], points: list[Point], runs: list[RunResult]) -> list[dict]:
    """runs.csv: one row per run, with its point's key values."""
    by_index = {p.index: p for p in points}
    return [{"point": r.point, **_key_cells(keys, by_index[r.point]), "seed": r.seed, "run_dir": r.run_dir,
             "status": r.status, "trusted": r.trusted, "jct_fabric_s": r.jct_fabric_s,
             "busbw_fraction": r.busbw_fraction, "error": r.error} for r in runs]


# ---------------------------------------------------------------------------- compare
def flatten(data: dict, prefix: str = "") -> dict[str, Any]:
    """A nested spec as {dotted.key: value}; lists stay whole values."""
    flat: dict[str, Any] = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            flat.update(flatten(v, key + "."))
        else:
            flat[key] = v
    return flat


def show_value(value: Any) -> str:
    """A spec value as a table cell: scalars as YAML would write them, lists compact."""
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(",", ":"))
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _partition(flat: list[dict[str, str]], keys: list[str]) -> list[int]:
    """Which group each run falls in, by its values of keys (groups in order of appearance)."""
    ids: dict[tuple, int] = {}
    return [ids.setdefault(tuple(f[k] for k in keys), len(ids)) for f in flat]


def group_by_differences(specs: list[dict]) -> tuple[list[str], list[Point], list[int]]:
    """Group runs by the spec keys whose values differ between them, the seed aside.

    Returns the keys (those every spec has), one Point per group (in order of first
    appearance) and each run's point index. Keys derived from others are left out when the
    grouping is the same without them."""
    flat = [{k: show_value(v) for k, v in flatten(s).items()} for s in specs]
    # A key only some specs have was added or dropped by another version of fabric-emu: its
    # absence says nothing about the value that run used, so it is not compared.
    common = set.intersection(*(set(f) for f in flat)) if flat else set()
    keys = [k for k in sorted(common) if k != "seed" and len({f[k] for f in flat}) > 1]
    groups = _partition(flat, keys)
    for derived in DERIVED_KEYS:
        rest = [k for k in keys if k != derived]
        if derived in keys and _partition(flat, rest) == groups:
            keys = rest
    first: dict[int, int] = {}
    for run, g in enumerate(groups):
        first.setdefault(g, run)
    points = [Point(g + 1, tuple((k, flat[first[g]][k]) for k in keys)) for g in sorted(first)]
    return keys, points, [g + 1 for g in groups]
