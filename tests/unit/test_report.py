"""`fabric-emu report`: one self-contained, escaped HTML page of a results folder; bad input
gets one line, exit 2, and nothing written. No root: the folders here are made by hand."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from fabric_emu.results.report import MAX_ROWS, OPEN_ROWS, summary_figures  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
EVIL = '<script>alert("x")</script>&'  # must reach the page as text, never as markup
EVIL_ESCAPED = "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;&amp;"

SUMMARY = {
    "status": "ok", "experiment": "tiny", "load_balancing": "ecmp", "congestion_control": "dcqcn",
    "workload": "allreduce/ring", "ranks": 4, "size_bytes": 1000000, "dilation": 2000.0,
    "host_link_gbps": 100.0, "iterations_completed": 1,
    "jct_s": 1.5, "jct_fabric_s": 0.00075, "iteration_time_s": 1.5, "iteration_time_fabric_s": 0.00075,
    "algbw_gbps": 40.0, "busbw_gbps": 60.0, "algbw_emulated_gbps": 0.02, "busbw_emulated_gbps": 0.03,
    "busbw_fraction": 0.6,
    "per_iteration": [{"iteration": 0, "time_s": 1.5, "time_fabric_s": 0.00075}],
    "fidelity": {"cpu_busy_mean": 0.5, "trusted": False,
                 "warnings": [f"CPU saturated {EVIL}"], "notes": ["a note worth reading"]},
}


def _png(path: Path) -> None:
    fig, ax = plt.subplots(figsize=(1, 1))
    ax.plot([0, 1], [0, 1])
    fig.savefig(path, format=path.suffix[1:], dpi=20)
    plt.close(fig)


def make_run(folder: Path, name: str = "tiny", long_rows: int = 3) -> Path:
    """A results folder as a run writes it, small: summary, spec, metadata, CSVs, plots."""
    (folder / "plots").mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({**SUMMARY, "experiment": name}))
    (folder / "experiment.yaml").write_text(f"name: {name}\ntopology:\n  name: ls\n  kind: leaf-spine\n"
                                            f"  spines: 2\n  leaves: 2\n  hosts_per_leaf: 2\n"
                                            f"  host_link: {{gbps: 100}}\nworkload: {{type: allreduce}}\n"
                                            f"# {EVIL}\n")
    (folder / "metadata.json").write_text(json.dumps({"git_commit": "abc123", "python": "3.11.2",
                                                      "command": ["fabric-emu", "run", EVIL]}))
    (folder / "ports.csv").write_text(f"switch,port,tx_bytes\nleaf1,1,1000\nleaf1,2,{EVIL.replace(',', ';')}\n")
    (folder / "queues.csv").write_text("t_s,backlog_bytes\n" + "".join(f"{i},{i * 10}\n" for i in range(long_rows)))
    (folder / "pauses.csv").write_text("")
    _png(folder / "plots" / "queue_depth.png")
    _png(folder / "plots" / "flow_rates.svg")
    return folder


class Page(HTMLParser):
    """What a test needs from the page: images, table cells, <details> and whether they open."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.imgs: list[str] = []
        self.cells: list[str] = []
        self.details: list[bool] = []  # open or not, in page order
        self.tags: set[str] = set()
        self._cell: list[str] | None = None
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.add(tag)
        if tag == "img":
            self.imgs.append(a["src"])
        elif tag == "details":
            self.details.append("open" in a)
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.cells.append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def fabric_emu(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "80"}
    return subprocess.run([sys.executable, "-m", "fabric_emu", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_run_page_has_everything_embedded_and_escaped(tmp_path: Path):
    run = make_run(tmp_path / "run", long_rows=OPEN_ROWS + 5)
    r = fabric_emu(["report", str(run)], tmp_path)
    assert r.returncode == 0, r.stderr
    page_path = run / "report.html"
    assert r.stdout.strip() == str(page_path)
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(".")) == []  # no temporary left
    html = page_path.read_text()
    page = Page(html)

    # every plot, embedded as a data: URI of its own bytes; nothing fetched from anywhere
    png = base64.b64encode((run / "plots" / "queue_depth.png").read_bytes()).decode()
    svg = base64.b64encode((run / "plots" / "flow_rates.svg").read_bytes()).decode()
    assert sorted(page.imgs) == sorted([f"data:image/svg+xml;base64,{svg}", f"data:image/png;base64,{png}"])
    assert "http://" not in html.replace("http://www.w3.org", "") and "https://" not in html
    assert "<script" not in html and "<link rel=\"stylesheet\"" not in html

    # escaped wherever a file's text lands: the summary's warning, a CSV cell, the spec, metadata
    assert html.count(EVIL_ESCAPED) >= 3, html.count(EVIL_ESCAPED)
    assert 'alert("x")' not in html

    # headline and verdict up front, summary figures modelled beside emulated, the tables
    assert "NOT trusted" in html and "a note worth reading" in html
    assert html.index("NOT trusted") < html.index("<h2>Summary</h2>")
    for text in ("ls (leaf-spine): 2 spines x 2 leaves x 2 hosts per leaf", "dcqcn", "ecmp", "2000"):
        assert text in html, text
    assert "750 us" in page.cells and "1.500 s" in page.cells  # the terminal's rows: completion time
    figures = {k: (v, e) for k, v, e in summary_figures(SUMMARY)}
    assert figures["jct_fabric_s"] == ("0.00075", "1.5") and "jct_s" not in figures
    assert figures["busbw_gbps"] == ("60", "0.03")
    for cell in ("switch", "tx_bytes", "leaf1", "1000", "backlog_bytes", "abc123"):
        assert cell in page.cells, cell
    assert "ports.csv (2 rows, 3 columns)" in html and "pauses.csv (0 rows)" in html
    # short tables open, long ones start collapsed
    assert html.count("<details class=\"table\" open>") >= 2
    assert f"queues.csv ({OPEN_ROWS + 5} rows" in html and "<details class=\"table\">" in html
    assert "name: tiny" in html  # the resolved spec, as written


def test_long_tables_are_cut_but_downloadable(tmp_path: Path):
    run = make_run(tmp_path / "run", long_rows=MAX_ROWS + 10)
    out = tmp_path / "elsewhere.html"
    r = fabric_emu(["report", str(run), "--out", str(out)], tmp_path)
    assert r.returncode == 0, r.stderr
    assert not (run / "report.html").exists()
    html = out.read_text()
    assert f"The first {MAX_ROWS} of {MAX_ROWS + 10} rows." in html
    whole = base64.b64encode((run / "queues.csv").read_bytes()).decode()
    assert f'href="data:text/csv;base64,{whole}"' in html


def test_folder_of_runs_gets_an_index(tmp_path: Path):
    exp = tmp_path / "tiny"
    make_run(exp / "2026-01-01T00-00-00Z")
    make_run(exp / "2026-01-01T00-01-00Z")
    assert fabric_emu(["report", str(exp / "2026-01-01T00-01-00Z")], tmp_path).returncode == 0
    r = fabric_emu(["report", str(exp)], tmp_path)
    assert r.returncode == 0, r.stderr
    html = (exp / "report.html").read_text()
    assert 'href="2026-01-01T00-00-00Z"' in html  # no page of its own yet: its folder
    assert 'href="2026-01-01T00-01-00Z/report.html"' in html
    assert "2 run(s) in 1 group(s)" in html and html.count("NOT trusted") == 2
    assert EVIL_ESCAPED in html and 'alert("x")' not in html


def test_sweep_folder_gets_an_index_with_its_plot(tmp_path: Path):
    from fabric_emu.results.compare import Comparison, write_sweep
    from fabric_emu.results.sweep import RunResult, grid, parse_over

    exp = tmp_path / "tiny"
    runs = [make_run(exp / f"2026-01-01T00-0{i}-00Z") for i in (1, 2)]
    points = grid(parse_over(["load_balancing=ecmp,spray"]))
    done = [RunResult.of_summary(p.index, 1, str(d), SUMMARY) for p, d in zip(points, runs)]
    sweep = exp / "sweep-2026-01-01T00-00-00Z"
    sweep.mkdir()
    write_sweep(sweep, {"name": "tiny", "over": {"load_balancing": ["ecmp", "spray"]}, "seeds": [1],
                        "command": ["fabric-emu", "sweep", EVIL]},
                Comparison("tiny: 2 point(s) x 1 seed(s)", ["load_balancing"], points, done))
    r = fabric_emu(["report", str(sweep)], tmp_path)
    assert r.returncode == 0, r.stderr
    html = (sweep / "report.html").read_text()
    page = Page(html)
    plot = base64.b64encode((sweep / "comparison.png").read_bytes()).decode()
    assert page.imgs == [f"data:image/png;base64,{plot}"]
    assert 'href="../2026-01-01T00-01-00Z"' in html and 'href="../2026-01-01T00-02-00Z"' in html
    assert "runs.csv" in html and "spray" in page.cells and html.count("NOT trusted") == 2
    assert EVIL_ESCAPED in html and 'alert("x")' not in html


def _bad_cases(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    (tmp_path / "empty").mkdir()
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "summary.json").write_text("{not json")
    make_run(tmp_path / "good")
    return {
        "missing": (["report", "nope"], "error: nope: no such folder (expected a results folder"),
        "empty": (["report", "empty"], "error: empty: not a results folder (expected"),
        "file": (["report", "file.txt"], "error: file.txt: not a folder (expected"),
        "broken": (["report", "broken"], "error: broken/summary.json: invalid JSON"),
        "out-folder": (["report", "good", "--out", "no/such/dir/r.html"],
                       "error: no/such/dir/r.html: --out: its folder does not exist"),
    }


@pytest.mark.parametrize("case", ["missing", "empty", "file", "broken", "out-folder"])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path: Path, case: str):
    args, expected = _bad_cases(tmp_path)[case]
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    r = fabric_emu(args, tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(expected), lines
    assert r.stdout == ""
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before
