"""Shareable reports: one self-contained HTML page of a results folder (`fabric-emu report`).

The page needs nothing but itself: plots are embedded as data: URIs, the CSS is inline, there
is no JavaScript, and its Content-Security-Policy forbids any fetch, so it can be mailed or
attached to an issue as it is. A run's page leads with the headline and the fidelity verdict,
then the summary figures (modelled beside emulated), every plot, every CSV table, the resolved
spec and the environment. A sweep's folder, or an experiment's folder of runs, gets an index
page: the comparison, then each run's headline figures and verdict.

Reading the folder is `load_*`; building the page from what was read is pure (`render_*`),
through jinja2 with autoescaping on, so no value read from a file reaches the page unescaped.
"""

from __future__ import annotations

import base64
import csv
import io
import json
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from fabric_emu.spec.errors import SpecError
from fabric_emu.spec.load import read_yaml
from fabric_emu.state.records import write_atomic
from fabric_emu.results.table import summary_rows, summary_title

REPORT_NAME = "report.html"
EXPECTED = ("expected a results folder: a run's folder with summary.json, a sweep folder with "
            "sweep.json and runs.csv, or an experiment's folder of runs")
PLOT_TYPES = {".png": "image/png", ".svg": "image/svg+xml"}
OPEN_ROWS = 25  # tables up to this long are shown open; longer ones start collapsed
MAX_ROWS = 1000  # rows embedded per table: queues.csv of a long run has hundreds of thousands
MAX_DOWNLOAD_BYTES = 2_000_000  # a CSV up to this size is also embedded whole, to download
TEMPLATES = Path(__file__).resolve().parent / "templates"
RECORD_LISTS = ("per_iteration", "jobs", "flows")  # summary.json lists of rows, shown as tables


# ---------------------------------------------------------------------------- what a page holds
@dataclass
class TableData:
    """One CSV file, as text cells (the page shows them as the file has them)."""
    name: str  # path inside the results folder
    header: list[str]
    rows: list[list[str]]  # at most MAX_ROWS of them
    total_rows: int
    download: str | None = None  # the whole file as a data: URI, when small enough
    problem: str | None = None  # why it could not be read

    @property
    def numeric(self) -> list[bool]:
        """Columns whose shown cells are all numbers (or empty), to right-align them."""
        return [all(_is_number(r[i]) for r in self.rows if i < len(r)) and bool(self.rows)
                for i in range(len(self.header))]


@dataclass
class Plot:
    name: str
    data_uri: str


@dataclass
class RunData:
    """Everything a run's page shows, read from its folder."""
    path: str
    summary: dict
    spec: dict  # experiment.yaml, parsed ({} if missing)
    spec_text: str | None
    metadata: dict | None
    tables: list[TableData] = field(default_factory=list)
    plots: list[Plot] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # files that are there but unreadable


@dataclass
class RunEntry:
    """One run on an index page: where it is, its summary, and the link to its own page."""
    label: str
    link: str  # relative to the index page
    summary: dict
    has_report: bool


@dataclass
class IndexData:
    """A sweep's folder or an experiment's folder of runs."""
    path: str
    kind: str  # "sweep" | "runs"
    title: str
    manifest: dict | None  # sweep.json
    comparison: TableData | None
    tables: list[TableData] = field(default_factory=list)
    plots: list[Plot] = field(default_factory=list)
    runs: list[RunEntry] = field(default_factory=list)


# ---------------------------------------------------------------------------- pure helpers
def _is_number(text: str) -> bool:
    if text == "":
        return True
    try:
        float(text)
    except ValueError:
        return False
    return True


def fmt(value: Any) -> str:
    """A value read from a file, as text: floats to 6 significant digits, lists joined."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):  # large ones are timestamps or counts: keep their digits
        return f"{value:.6g}" if abs(value) < 1e6 else f"{value:,.3f}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, list) and all(not isinstance(v, (dict, list)) for v in value):
        return ", ".join(fmt(v) for v in value)
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=False)
    return str(value)


def key_values(data: dict) -> list[tuple[str, str]]:
    """A JSON file's figures as (dotted.key, text); a command line reads as one, shell-quoted."""
    return [(k, shlex.join(map(str, v)) if k.endswith("command") and isinstance(v, list) else fmt(v))
            for k, v in flatten(data)]


def flatten(data: dict, prefix: str = "") -> list[tuple[str, Any]]:
    """Nested dicts as (dotted.key, value) pairs, in file order; lists stay values."""
    out: list[tuple[str, Any]] = []
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out += flatten(value, dotted + ".")
        else:
            out.append((dotted, value))
    return out


def _emulated_twin(key: str) -> str | None:
    """The summary's emulated counterpart of a modelled figure's key, by its naming scheme
    (jct_fabric_s / jct_s, busbw_gbps / busbw_emulated_gbps)."""
    for modelled, emulated in (("_fabric_s", "_s"), ("_fabric_us", "_us")):
        if key.endswith(modelled):
            return key[: -len(modelled)] + emulated
    if key.endswith("_gbps") and not key.endswith("_emulated_gbps"):
        return key[: -len("_gbps")] + "_emulated_gbps"
    return None


def summary_figures(summary: dict) -> list[tuple[str, str, str]]:
    """Every figure of summary.json as (key, value, emulated value): a modelled figure with
    an emulated twin in the summary gets it beside it, and the twin's own row goes."""
    skip = {*RECORD_LISTS, "fidelity"}  # shown as their own tables and box
    flat = flatten({k: v for k, v in summary.items() if k not in skip})
    values = dict(flat)
    twins = {k: t for k, _ in flat if (t := _emulated_twin(k)) in values}
    shown_as_twin = set(twins.values())
    return [(k, fmt(v), fmt(values[twins[k]]) if k in twins else "")
            for k, v in flat if k not in shown_as_twin]


def records_table(name: str, records: list[dict]) -> TableData:
    """A list of dicts from summary.json (per_iteration, flows) as a table."""
    header: list[str] = []
    for r in records:
        header += [k for k in r if k not in header]
    rows = [[fmt(r.get(k)) if r.get(k) is not None else "" for k in header] for r in records]
    return TableData(name, header, rows[:MAX_ROWS], len(rows))


def fabric_line(spec: dict) -> str:
    """The topology in one line, from the resolved spec."""
    topo = spec.get("topology")
    if not isinstance(topo, dict):
        return "-"
    name, kind = topo.get("name", "?"), topo.get("kind", "?")
    if kind == "leaf-spine":
        shape = (f"{topo.get('spines')} spines x {topo.get('leaves')} leaves x "
                 f"{topo.get('hosts_per_leaf')} hosts per leaf")
    elif kind == "custom":
        shape = ", ".join(f"{len(topo.get(k) or [])} {k}" for k in ("switches", "hosts", "links"))
        rates = [f"{label} {_custom_rates(topo, items, default)}" for items, default, label in
                 (("hosts", "host_link", "host links"), ("links", "fabric_link", "fabric links"))]
        return f"{name} ({kind}): " + "; ".join([shape, *rates])
    else:
        shape = ", ".join(f"{k} {fmt(v)}" for k, v in topo.items()
                          if k not in ("name", "kind", "dilation") and not isinstance(v, (dict, list)))
    rates = [f"{label} {fmt(topo[key]['gbps'])} Gb/s" for key, label in (("host_link", "host links"),
                                                                          ("fabric_link", "fabric links"))
             if isinstance(topo.get(key), dict) and "gbps" in topo[key]]
    return f"{name} ({kind}): " + "; ".join([shape, *rates])


def _custom_rates(topo: dict, items: str, default: str) -> str:
    """A custom fabric's host or switch links' rates (each its own, or the default): 'a-b Gb/s'."""
    base = (topo.get(default) or {}).get("gbps")
    rates = sorted({x.get("gbps") or base for x in topo.get(items) or [] if isinstance(x, dict)} - {None})
    if not rates:
        return "-"
    return "-".join(dict.fromkeys(fmt(r) for r in (rates[0], rates[-1]))) + " Gb/s"


def headline(summary: dict, spec: dict, metadata: dict | None) -> list[tuple[str, str]]:
    """What ran and how it ended, as (label, text) pairs for the top of the page."""
    s, meta = summary, metadata or {}
    dilation = s.get("dilation", meta.get("dilation"))
    dil = "-" if dilation is None else f"{fmt(dilation)} (the emulation runs {fmt(dilation)} times slower)"
    if s.get("dilation_auto"):
        dil += ", chosen automatically: " + fmt(s["dilation_auto"].get("reason", ""))
    lb = fmt(s.get("load_balancing", spec.get("load_balancing")))
    if s.get("load_balancing_final") and s["load_balancing_final"] != s.get("load_balancing"):
        lb += f", changed during the run to {fmt(s['load_balancing_final'])}"
    workload = fmt(s.get("workload"))
    if "ranks" in s:
        workload += f", {fmt(s['ranks'])} {'ranks' if str(s.get('workload', '')).startswith('allreduce') else 'hosts'}"
    if "size_bytes" in s:
        workload += f", {fmt(s['size_bytes'])} B"
    outcome = fmt(s.get("status"))
    if "jct_fabric_s" in s:
        outcome += f": completed in {s['jct_fabric_s'] * 1e6:,.0f} us of fabric time"
        if "jct_s" in s:
            outcome += f" ({s['jct_s']:.3f} s emulated)"
    if "busbw_fraction" in s:
        outcome += f", bus bandwidth {s['busbw_fraction']:.1%} of the host link"
    if s.get("error"):
        outcome += f"; error: {fmt(s['error'])}"
    rows = [("experiment", fmt(s.get("experiment", spec.get("name")))),
            ("fabric", fabric_line(spec)),
            ("dilation", dil),
            ("load balancing", lb),
            ("congestion control", fmt(s.get("congestion_control", spec.get("congestion_control")))),
            ("workload", workload),
            ("outcome", outcome)]
    if meta.get("start"):
        rows.append(("ran", f"{fmt(meta['start'])} to {fmt(meta.get('end'))}"))
    return rows


def verdict(summary: dict) -> dict:
    """The fidelity verdict as the page shows it: trusted, untrusted or unknown."""
    fid = summary.get("fidelity")
    if not isinstance(fid, dict):
        return {"state": "unknown", "text": "no fidelity verdict: the run recorded none "
                f"(status {fmt(summary.get('status'))})", "warnings": [], "notes": []}
    warnings = [fmt(w) for w in fid.get("warnings") or []]
    notes = [fmt(n) for n in fid.get("notes") or []]
    trusted = fid.get("trusted", not warnings)
    text = ("trusted: the emulator saw nothing that makes these numbers wrong" if trusted else
            f"NOT trusted: {len(warnings)} fidelity warning(s); the numbers below may be the emulator's, "
            "not the fabric's")
    return {"state": "trusted" if trusted else "untrusted", "text": text, "warnings": warnings, "notes": notes}


def safe_summary_rows(summary: dict) -> list[tuple[str, str, str]]:
    """The terminal's summary rows; none if the summary lacks what they need (a failed run)."""
    try:
        return summary_rows(summary)
    except (KeyError, TypeError, ValueError, AttributeError):
        return []


def safe_title(summary: dict, fallback: str) -> str:
    try:
        return summary_title(summary)
    except (KeyError, TypeError, AttributeError):
        return fallback


def _environment() -> Environment:
    env = Environment(loader=FileSystemLoader(str(TEMPLATES)), autoescape=True,
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["fmt"] = fmt
    return env


def render_run(run: RunData) -> str:
    """The page of one run (pure: everything comes from `run`)."""
    s = run.summary
    extra = [records_table(f"summary.json: {key}", s[key]) for key in RECORD_LISTS
             if isinstance(s.get(key), list) and s[key] and all(isinstance(r, dict) for r in s[key])]
    fid = s.get("fidelity") if isinstance(s.get("fidelity"), dict) else {}
    return _environment().get_template("run.html.j2").render(
        title=safe_title(s, Path(run.path).name), run=run, headline=headline(s, run.spec, run.metadata),
        verdict=verdict(s), rows=safe_summary_rows(s), figures=summary_figures(s),
        fidelity_figures=[(k, fmt(v)) for k, v in flatten(fid) if k not in ("warnings", "notes")],
        summary_tables=extra, metadata=key_values(run.metadata or {}),
        open_rows=OPEN_ROWS)


def render_index(index: IndexData) -> str:
    """The page of a sweep or a folder of runs (pure)."""
    runs = [{"entry": r, "title": safe_title(r.summary, r.label), "verdict": verdict(r.summary),
             "rows": safe_summary_rows(r.summary)} for r in index.runs]
    manifest = key_values(index.manifest or {})
    return _environment().get_template("index.html.j2").render(
        title=index.title, index=index, manifest=manifest, runs=runs, open_rows=OPEN_ROWS)


# ---------------------------------------------------------------------------- reading a folder
def _bad(path: Path, what: str) -> SpecError:
    return SpecError([(str(path), "", what)])


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise _bad(path, f"cannot read ({e.strerror})") from None
    except ValueError as e:
        raise _bad(path, f"invalid JSON ({e}); {EXPECTED}") from None
    if not isinstance(data, dict):
        raise _bad(path, f"expected a JSON object; {EXPECTED}")
    return data


def _optional_json(path: Path, problems: list[str]) -> dict | None:
    if not path.is_file():
        return None
    try:
        return _read_json(path)
    except SpecError as e:
        problems.append(str(e))
        return None


def read_table(path: Path, name: str) -> TableData:
    """A CSV file's first MAX_ROWS rows, and the whole file to download when it is small."""
    try:
        raw = path.read_bytes()
        reader = csv.reader(io.StringIO(raw.decode()))
        header = next(reader, [])
        rows, total = [], 0
        for row in reader:
            total += 1
            if total <= MAX_ROWS:
                rows.append(row)
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        return TableData(name, [], [], 0, problem=f"cannot read: {e}")
    download = (f"data:text/csv;base64,{base64.b64encode(raw).decode()}"
                if len(raw) <= MAX_DOWNLOAD_BYTES else None)
    return TableData(name, header, rows, total, download)


def read_plot(path: Path, name: str) -> Plot:
    mime = PLOT_TYPES[path.suffix.lower()]
    return Plot(name, f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode()}")


def _files(folder: Path, suffixes: tuple[str, ...]) -> list[Path]:
    """Files below the folder with these suffixes, in a stable order (top level first)."""
    found = [p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in suffixes
             and not any(part.startswith(".") for part in p.relative_to(folder).parts)]
    return sorted(found, key=lambda p: (len(p.relative_to(folder).parts), str(p.relative_to(folder))))


def _tables_and_plots(folder: Path) -> tuple[list[TableData], list[Plot], list[str]]:
    problems: list[str] = []
    tables = [read_table(p, str(p.relative_to(folder))) for p in _files(folder, (".csv",))]
    plots = []
    for p in _files(folder, tuple(PLOT_TYPES)):
        try:
            plots.append(read_plot(p, str(p.relative_to(folder))))
        except OSError as e:
            problems.append(f"{p.relative_to(folder)}: cannot read ({e.strerror})")
    return tables, plots, problems


def load_run(run_dir: Path) -> RunData:
    """Read a run's folder; SpecError if its summary.json is missing or unreadable."""
    summary = _read_json(run_dir / "summary.json")
    problems: list[str] = []
    spec_text, spec = None, {}
    spec_path = run_dir / "experiment.yaml"
    if spec_path.is_file():
        try:
            spec_text = spec_path.read_text()
            parsed = read_yaml(spec_path)
            spec = parsed if isinstance(parsed, dict) else {}
        except (OSError, UnicodeDecodeError, SpecError) as e:
            problems.append(f"experiment.yaml: {e}")
    metadata = _optional_json(run_dir / "metadata.json", problems)
    tables, plots, more = _tables_and_plots(run_dir)
    files = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*")
                   if p.is_file() and not p.name.startswith("."))
    return RunData(str(run_dir), summary, spec, spec_text, metadata, tables, plots, files, problems + more)


def _report_link(index_dir: Path, run_dir: Path) -> tuple[str, bool]:
    """A link from the index page to the run's own page, or to its folder if it has none."""
    page = run_dir / REPORT_NAME
    target = page if page.is_file() else run_dir
    return os.path.relpath(target, index_dir), page.is_file()


def load_index(folder: Path) -> IndexData:
    """Read a sweep's folder or a folder of runs (fabric_emu.results.compare finds the runs)."""
    from fabric_emu.results.compare import load_comparison, run_dirs

    sweep = (folder / "sweep.json").is_file() and (folder / "runs.csv").is_file()
    comp = load_comparison([folder])
    rows = comp.rows()
    header = list(rows[0]) if rows else []
    comparison = TableData("comparison (statistics over seeds)", header,
                           [[fmt(r[k]) if r[k] is not None else "" for k in header] for r in rows], len(rows))
    entries = []
    for d in run_dirs([folder]):
        link, has_report = _report_link(folder, d)
        label = d.name if d.parent == folder else os.path.relpath(d, folder)
        entries.append(RunEntry(label, link, _read_json(d / "summary.json"), has_report))
    tables, plots, _ = _tables_and_plots(folder) if sweep else ([], [], [])
    if sweep:  # its comparison.csv is what `comparison` shows
        tables = [t for t in tables if t.name != "comparison.csv"]
    manifest = _read_json(folder / "sweep.json") if sweep else None
    return IndexData(str(folder), "sweep" if sweep else "runs", comp.title, manifest, comparison,
                     tables, plots, entries)


def build_page(folder: Path) -> str:
    """The page of a results folder of any kind; SpecError naming the path if it is none."""
    if not folder.exists():
        raise _bad(folder, f"no such folder ({EXPECTED})")
    if not folder.is_dir():
        raise _bad(folder, f"not a folder ({EXPECTED})")
    if (folder / "summary.json").is_file():
        return render_run(load_run(folder))
    is_sweep = (folder / "sweep.json").is_file() and (folder / "runs.csv").is_file()
    if is_sweep or any(p.is_dir() and (p / "summary.json").is_file() for p in folder.iterdir()):
        return render_index(load_index(folder))
    raise _bad(folder, f"not a results folder ({EXPECTED})")


def write_report(folder: Path, out: Path | None = None) -> Path:
    """Write the page (atomically: a temporary name, then a rename) and return its path.
    Nothing is written when the input is bad."""
    target = out if out is not None else folder / REPORT_NAME
    if out is not None and not target.parent.is_dir():
        raise _bad(target, "--out: its folder does not exist")
    page = build_page(folder)
    write_atomic(target, page)
    return target
