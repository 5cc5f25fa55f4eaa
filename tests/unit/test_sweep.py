"""Sweeps and comparisons without a fabric: the grid, aggregation, the files, and bad input."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest

from fabric_emu.results.compare import Comparison, load_comparison, read_sweep, write_sweep
from fabric_emu.spec.errors import SpecError
from fabric_emu.results.sweep import (
    Axis, Point, RunResult, check_overrides, check_size, comparison_rows, describe, grid,
    group_by_differences, parse_over, parse_seeds, run_rows, split_values,
)
from tests.unit.test_cli_input_errors import fabric_emu

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def one_line(e: pytest.ExceptionInfo[SpecError]) -> str:
    (line,) = e.value.lines()
    return line


# ---------------------------------------------------------------------------- grid
@pytest.mark.parametrize("text, seeds", [
    ("4", [4]), ("1-5", [1, 2, 3, 4, 5]), ("1,3,7", [1, 3, 7]), ("1-3,7", [1, 2, 3, 7]),
    (" 2 - 3 , 9", [2, 3, 9]), ("0", [0]),
])
def test_seeds(text: str, seeds: list[int]):
    assert parse_seeds(text) == seeds


@pytest.mark.parametrize("text, words", [
    ("5-1", "the range 5-1 runs backwards"), ("x", "got 'x'"), ("", "got ''"), ("1,,2", "got '1,,2'"),
    ("1-3,2", "seed 2 is given twice"), ("0-5000", "more than 1000 seeds"), ("-1", "got '-1'"),
])
def test_bad_seeds_name_the_option_and_what_is_allowed(text: str, words: str):
    with pytest.raises(SpecError) as e:
        parse_seeds(text)
    line = one_line(e)
    assert line.startswith("--seeds: ") and words in line, line


def test_values_split_on_commas_outside_brackets_and_quotes():
    assert split_values("1MB, 8MB") == ["1MB", "8MB"]
    assert split_values("[h1,h3],[h5,h7]") == ["[h1,h3]", "[h5,h7]"]
    assert split_values("{preset: paper, rate_ai: 10Mbps},{preset: mlx5}") == [
        "{preset: paper, rate_ai: 10Mbps}", "{preset: mlx5}"]
    assert split_values("'a,b',c") == ["'a,b'", "c"]


def test_over_keeps_keys_and_values_in_the_order_given():
    axes = parse_over(["congestion_control=dcqcn,none", "workload.ranks=[h1,h2],[h1,h3]"])
    assert axes == [Axis("congestion_control", ("dcqcn", "none")),
                    Axis("workload.ranks", ("[h1,h2]", "[h1,h3]"))]


@pytest.mark.parametrize("items, line", [
    (["workload.size"], "--over: workload.size: expected dotted.key=value1,value2,..."),
    (["9x=1,2"], "--over: 9x=1,2: expected dotted.key=value1,value2,..."),
    (["seed=1,2"], "--over: seed: sweep seeds with --seeds"),
    (["workload.size=1MB", "workload.size=2MB"], "--over: workload.size: given twice"),
    (["workload.size=1MB,,2MB"], "--over: workload.size: empty value in '1MB,,2MB'"),
    (["workload.size="], "--over: workload.size: empty value"),
    (["workload.size=1MB,1MB"], "--over: workload.size: value '1MB' is given twice"),
])
def test_bad_over(items: list[str], line: str):
    with pytest.raises(SpecError) as e:
        parse_over(items)
    assert one_line(e).startswith(line), one_line(e)


@pytest.mark.parametrize("over, sets, seeds, line", [
    ("workload.size=1MB,2MB", ["workload.size=4MB"], False, "--over: workload.size: also given by --set"),
    ("workload.size=1MB,2MB", ["workload={type: allreduce, size: 1MB}"], False, "also given by --set workload="),
    ("workload={type: allreduce, size: 1MB}", ["workload.size=1MB"], False, "also given by --set workload.size"),
    ("ecn.kmin=50KB,80KB", ["seed=3"], True, "--seeds: seed is also given by --set seed"),
])
def test_a_key_given_twice_is_ambiguous(over: str, sets: list[str], seeds: bool, line: str):
    with pytest.raises(SpecError) as e:
        check_overrides(parse_over([over]), sets, seeds)
    assert line in one_line(e)


def test_overrides_of_other_keys_are_fine():
    check_overrides(parse_over(["workload.size=1MB,2MB"]), ["workload.sizes=1", "seed=3"], False)


def test_grid_is_the_product_with_the_first_axis_slowest():
    points = grid(parse_over(["congestion_control=dcqcn,none", "workload.size=1MB,2MB,4MB"]))
    assert [p.index for p in points] == [1, 2, 3, 4, 5, 6]
    assert [p.sets() for p in points[:4]] == [
        ["congestion_control=dcqcn", "workload.size=1MB"], ["congestion_control=dcqcn", "workload.size=2MB"],
        ["congestion_control=dcqcn", "workload.size=4MB"], ["congestion_control=none", "workload.size=1MB"]]
    assert points[4].label == "congestion_control=none, workload.size=2MB"


def test_no_axes_is_one_point_the_spec_as_it_is():
    (point,) = grid([])
    assert point == Point(1, ()) and point.sets() == [] and point.label == "as specified"


def test_too_big_a_grid_is_refused_before_anything_is_checked():
    points = grid(parse_over([f"workload.size={','.join(f'{i}MB' for i in range(1, 101))}"]))
    check_size(points, list(range(10)))
    with pytest.raises(SpecError, match=r"1100 runs \(points x seeds\) are too many"):
        check_size(points, list(range(11)))


# ---------------------------------------------------------------------------- results
def summary(jct_us: float | None, busbw: float | None, status: str = "ok", trusted: bool = True) -> dict:
    s: dict = {"status": status, "experiment": "e", "fidelity": {"trusted": trusted, "warnings": []}}
    if jct_us is not None:
        s["jct_fabric_s"] = jct_us / 1e6
    if busbw is not None:
        s["busbw_fraction"] = busbw
    return s


def test_a_run_result_reads_its_summary():
    r = RunResult.of_summary(2, 7, "results/e/t1", summary(150.0, 0.93, trusted=False))
    assert (r.point, r.seed, r.status, r.trusted) == (2, 7, "ok", False)
    assert r.jct_fabric_s == pytest.approx(150e-6) and r.busbw_fraction == 0.93 and r.error == ""


def test_a_run_killed_early_or_without_a_folder_is_a_failure():
    placeholder = {"status": "incomplete", "error": "the run did not finish (still running, or killed)"}
    r = RunResult.of_summary(1, 1, "results/e/t1", placeholder)
    assert r.status == "incomplete" and r.trusted is None and r.jct_fabric_s is None and "killed" in r.error
    none = RunResult.of_summary(1, 1, "", {})
    assert none.status == "failed" and none.error == "no results folder"
    assert not none.interrupted
    assert RunResult.of_summary(1, 1, "d", {"status": "incomplete", "error": "interrupted (SIGINT)"}).interrupted
    assert RunResult.of_summary(1, 1, "d", summary(1.0, 0.9), error="interrupted (SIGINT)").interrupted


def test_describe_uses_the_sample_stdev():
    assert describe([1.0, 2.0, 3.0]) == {"mean": 2.0, "min": 1.0, "max": 3.0, "stdev": 1.0}
    assert describe([5.0]) == {"mean": 5.0, "min": 5.0, "max": 5.0, "stdev": None}
    assert describe([]) == {"mean": None, "min": None, "max": None, "stdev": None}


def test_comparison_aggregates_the_ok_runs_of_each_point():
    points = grid(parse_over(["congestion_control=dcqcn,none,off"]))
    runs = [
        RunResult.of_summary(1, 1, "a", summary(100.0, 0.90)),
        RunResult.of_summary(1, 2, "b", summary(120.0, 0.80, trusted=False)),
        RunResult.of_summary(1, 3, "c", summary(999.0, 0.10, status="incomplete")),  # not averaged
        RunResult.of_summary(2, 1, "d", summary(None, None, status="failed", trusted=False)),
    ]
    rows = comparison_rows(["congestion_control"], points, runs)
    assert len(rows) == 2  # point 3 never ran
    first, second = rows
    assert {k: first[k] for k in ("point", "congestion_control", "runs", "seeds", "ok", "trusted")} == {
        "point": 1, "congestion_control": "dcqcn", "runs": 3, "seeds": 3, "ok": 2, "trusted": 2}
    assert first["jct_fabric_s_mean"] == pytest.approx(110e-6)
    assert first["jct_fabric_s_min"] == pytest.approx(100e-6) and first["jct_fabric_s_max"] == pytest.approx(120e-6)
    assert first["jct_fabric_s_stdev"] == pytest.approx(14.142e-6, rel=1e-3)
    assert first["busbw_fraction_mean"] == pytest.approx(0.85)
    assert (second["ok"], second["trusted"], second["jct_fabric_s_mean"], second["busbw_fraction_stdev"]) == (
        0, 0, None, None)


def test_runs_csv_rows_round_trip(tmp_path: Path):
    from fabric_emu.results.folder import write_csv

    points = grid(parse_over(["workload.size=1MB,2MB"]))
    runs = [RunResult.of_summary(1, 1, "results/e/t1", summary(100.0, 0.9)),
            RunResult.of_summary(2, 4, "", {}, error="RuntimeError: boom")]
    rows = run_rows(["workload.size"], points, runs)
    assert list(rows[0]) == ["point", "workload.size", "seed", "run_dir", "status", "trusted",
                             "jct_fabric_s", "busbw_fraction", "error"]
    assert rows[1]["workload.size"] == "2MB" and rows[1]["error"] == "RuntimeError: boom"
    write_csv(tmp_path / "runs.csv", rows)
    with open(tmp_path / "runs.csv") as f:
        assert [RunResult.of_row(r) for r in csv.DictReader(f)] == runs


# ---------------------------------------------------------------------------- grouping
def spec(seed: int = 1, cc: str = "dcqcn", size: int = 1_000_000, timeout: float | None = None) -> dict:
    return {"name": "e", "seed": seed, "congestion_control": cc,
            "timeout": timeout if timeout is not None else 30 + size / 1e6,  # derived, as load_checked does
            "workload": {"type": "allreduce", "size": size, "ranks": ["h1", "h3"]},
            "topology": {"spines": 2, "dilation": 4000.0}}


def test_runs_are_grouped_by_the_keys_that_differ_seeds_aside():
    specs = [spec(1, "dcqcn"), spec(2, "dcqcn"), spec(1, "none"), spec(2, "none")]
    keys, points, member = group_by_differences(specs)
    assert keys == ["congestion_control"]
    assert [p.values for p in points] == [(("congestion_control", "dcqcn"),), (("congestion_control", "none"),)]
    assert member == [1, 1, 2, 2]


def test_a_derived_key_is_hidden_unless_it_alone_tells_runs_apart():
    keys, points, member = group_by_differences([spec(size=1_000_000), spec(size=2_000_000), spec(size=1_000_000)])
    assert keys == ["workload.size"] and member == [1, 2, 1]  # the timeout follows the size
    keys, _, member = group_by_differences([spec(timeout=5.0), spec(timeout=9.0)])
    assert keys == ["timeout"] and member == [1, 2]


def test_identical_specs_are_one_group_and_keys_of_other_versions_are_ignored():
    old = spec(3)
    del old["congestion_control"]  # written before the key existed
    keys, points, member = group_by_differences([spec(1), spec(2), old])
    assert keys == [] and member == [1, 1, 1] and points[0].label == "as specified"


def test_list_values_are_compared_whole():
    a, b = spec(), spec()
    b["workload"]["ranks"] = ["h1", "h5"]
    keys, points, _ = group_by_differences([a, b])
    assert keys == ["workload.ranks"] and points[1].values == (("workload.ranks", '["h1","h5"]'),)


# ---------------------------------------------------------------------------- folders
def make_run(base: Path, stamp: str, seed: int, cc: str, jct_us: float, busbw: float) -> Path:
    d = base / "e" / stamp
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps(summary(jct_us, busbw)))
    (d / "experiment.yaml").write_text(json.dumps(spec(seed, cc)))  # JSON is YAML
    return d


@pytest.fixture
def runs_on_disk(tmp_path: Path) -> list[Path]:
    return [make_run(tmp_path / "results", f"t{i}", seed, cc, jct, bw) for i, (seed, cc, jct, bw) in enumerate(
        [(1, "dcqcn", 100.0, 0.9), (2, "dcqcn", 110.0, 0.8), (1, "none", 200.0, 0.5), (2, "none", 220.0, 0.4)])]


def test_compare_groups_folders_by_their_specs(runs_on_disk: list[Path]):
    comp = load_comparison(runs_on_disk)
    assert comp.keys == ["congestion_control"]
    rows = comp.rows()
    assert [(r["congestion_control"], r["runs"], r["ok"]) for r in rows] == [("dcqcn", 2, 2), ("none", 2, 2)]
    assert rows[1]["jct_fabric_s_mean"] == pytest.approx(210e-6)
    # An experiment's folder means all its runs; a folder named twice counts once.
    again = load_comparison([runs_on_disk[0].parent, runs_on_disk[0]])
    assert again.rows() == rows


def test_compare_names_every_bad_path(tmp_path: Path, runs_on_disk: list[Path]):
    (tmp_path / "empty").mkdir()
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(SpecError) as e:
        load_comparison([runs_on_disk[0], tmp_path / "gone", tmp_path / "empty", tmp_path / "file.txt"])
    lines = e.value.lines()
    assert lines[0] == f"{tmp_path / 'gone'}: not found"
    assert lines[1].startswith(f"{tmp_path / 'empty'}: not a results folder (allowed: ")
    assert lines[2].startswith(f"{tmp_path / 'file.txt'}: not a folder (allowed: ")
    (runs_on_disk[1] / "summary.json").write_text("{oops")
    with pytest.raises(SpecError, match="summary.json: invalid JSON"):
        load_comparison(runs_on_disk)


def write_a_sweep(tmp_path: Path, runs_on_disk: list[Path]) -> tuple[Path, Comparison]:
    axes = parse_over(["congestion_control=dcqcn,none"])
    points = grid(axes)
    runs = [RunResult.of_summary(1 + i // 2, 1 + i % 2, str(d), json.loads((d / "summary.json").read_text()))
            for i, d in enumerate(runs_on_disk)]
    runs.append(RunResult.of_summary(2, 3, "", {}))  # a run that never got a folder
    comp = Comparison("e: 2 point(s) x 3 seed(s)", ["congestion_control"], points, runs)
    sweep_dir = runs_on_disk[0].parent / "sweep-t0"
    sweep_dir.mkdir()
    files = write_sweep(sweep_dir, {"name": "e", "over": {"congestion_control": ["dcqcn", "none"]},
                                    "seeds": [1, 2, 3]}, comp)
    assert files == ["sweep.json", "runs.csv", "comparison.csv", "comparison.png"]
    return sweep_dir, comp


def test_a_sweep_folder_holds_its_tables_and_plot(tmp_path: Path, runs_on_disk: list[Path]):
    sweep_dir, comp = write_a_sweep(tmp_path, runs_on_disk)
    assert (sweep_dir / "comparison.png").read_bytes().startswith(PNG_MAGIC)
    assert not list(sweep_dir.glob(".*tmp*"))  # every file written whole, then renamed
    with open(sweep_dir / "comparison.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["point"], r["congestion_control"], r["runs"], r["ok"]) for r in rows] == [
        ("1", "dcqcn", "2", "2"), ("2", "none", "3", "2")]
    assert float(rows[0]["jct_fabric_s_mean"]) == pytest.approx(105e-6)
    # compare on the sweep folder prints what the sweep printed: same keys, points and rows.
    again = read_sweep(sweep_dir)
    assert (again.title, again.keys) == (comp.title, comp.keys)
    assert [json.dumps(r, sort_keys=True) for r in again.rows()] == [
        json.dumps(r, sort_keys=True) for r in comp.rows()]


def test_a_sweep_with_other_runs_is_compared_by_specs_even_when_moved(tmp_path: Path, runs_on_disk: list[Path]):
    sweep_dir, _ = write_a_sweep(tmp_path, runs_on_disk)
    extra = make_run(tmp_path / "results", "t9", 1, "none", 240.0, 0.3)
    moved = tmp_path / "elsewhere"
    (tmp_path / "results").rename(moved)  # run_dir paths in runs.csv are stale now
    comp = load_comparison([moved / "e" / sweep_dir.name, moved / "e" / extra.name])
    assert [(r["congestion_control"], r["runs"]) for r in comp.rows()] == [("dcqcn", 2), ("none", 3)]


# ---------------------------------------------------------------------------- the command
SEEDS = ["--seeds", "1-2"]
SWEEP_BAD = {
    "not-a-mode": (["--over", "load_balancing=ecmp,flowlet", *SEEDS],
                   "error: exp.yaml: load_balancing: "),
    "unknown-key": (["--over", "workload.sizes=1MB,2MB", *SEEDS], "error: exp.yaml: workload.sizes: unknown key"),
    "bad-value": (["--over", "workload.size=1MB,lots", *SEEDS], "error: exp.yaml: workload.size: got 'lots' ("),
    "unknown-host": (["--over", "workload.ranks=[h1,h2],[h1,h9]", *SEEDS],
                     "error: exp.yaml: workload.ranks: unknown host 'h9'"),
    "bad-set": (["--over", "workload.size=1MB,2MB", "--set", "pfc.xon=900KB", *SEEDS], "error: exp.yaml: pfc.xon: "),
    "over-syntax": (["--over", "workload.size"], "error: --over: workload.size: expected dotted.key="),
    "seeds": (["--over", "workload.size=1MB,2MB", "--seeds", "3-1"], "error: --seeds: the range 3-1 runs backwards"),
    "seed-twice": (["--set", "seed=4", *SEEDS], "error: --seeds: seed is also given by --set"),
}


@pytest.mark.parametrize("case", sorted(SWEEP_BAD))
def test_sweep_checks_every_run_first_exits_2_and_creates_nothing(spec_dir: Path, case: str):
    args, expected = SWEEP_BAD[case]
    before = set(os.listdir(spec_dir))
    r = fabric_emu(["sweep", "exp.yaml", "--out", "results", *args], spec_dir)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, lines  # the same problem at every seed is said once
    assert lines[0].startswith(expected), lines[0]
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert set(os.listdir(spec_dir)) == before  # no results/, no state/


def test_sweep_of_a_missing_file(tmp_path: Path):
    r = fabric_emu(["sweep", "nope.yaml", "--over", "workload.size=1MB,2MB"], tmp_path)
    assert r.returncode == 2 and r.stderr.strip() == "error: nope.yaml: file not found"
    assert os.listdir(tmp_path) == []


def test_sweep_reports_each_bad_value_once(spec_dir: Path):
    r = fabric_emu(["sweep", "exp.yaml", "--over", "load_balancing=flowlet,ecmp", "--over", "workload.size=1MB,lots",
                    "--seeds", "1-3"], spec_dir)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 2 and "load_balancing" in lines[0] and "got 'lots'" in lines[1], lines


def test_compare_bad_path_exits_2_with_one_line(tmp_path: Path):
    r = fabric_emu(["compare", "nothing-here"], tmp_path)
    assert r.returncode == 2 and r.stderr.strip() == "error: nothing-here: not found"
    assert os.listdir(tmp_path) == []


def test_compare_prints_the_table(tmp_path: Path, runs_on_disk: list[Path]):
    r = fabric_emu(["compare", *map(str, runs_on_disk)], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "4 run(s) in 2 group(s)" in r.stdout and "congestion_control" in r.stdout
    assert "105 ± 7" in r.stdout and "210 ± 14" in r.stdout  # JCT in fabric us, mean ± sample stdev
    assert "0.850 ± 0.071" in r.stdout and "200-220" in r.stdout
