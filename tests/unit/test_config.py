"""Every class of bad input names the file and the field, in one line each."""

from pathlib import Path

import pytest

from fabric_emu.run.prepare import load_checked
from fabric_emu.spec.errors import SpecError
from fabric_emu.spec.load import load_experiment, load_topology


def problems(exc: pytest.ExceptionInfo) -> list[tuple[str, str, str]]:
    return exc.value.problems


def test_valid_experiment_resolves_topology_relative_to_file(spec_dir: Path):
    spec = load_experiment(spec_dir / "exp.yaml")
    assert spec.topology.spines == 2
    assert spec.workload.size == 1_000_000
    assert spec.workload.ranks == "all"
    assert spec.workload.qps_per_peer == 1


def test_inline_topology(spec_dir: Path):
    (spec_dir / "exp.yaml").write_text(
        "name: e\ntopology: {name: t, kind: leaf-spine, spines: 1, leaves: 2, hosts_per_leaf: 1}\n"
        "workload: {type: allreduce, size: 1MB}\n")
    assert load_experiment(spec_dir / "exp.yaml").topology.leaves == 2


def test_set_overrides_take_dotted_paths(spec_dir: Path):
    spec = load_experiment(spec_dir / "exp.yaml", ["topology.spines=4", "workload.size=16MB",
                                                   "workload.ranks=[h1, h3]"])
    assert spec.topology.spines == 4
    assert spec.workload.size == 16_000_000
    assert spec.workload.ranks == ["h1", "h3"]


@pytest.mark.parametrize("text,file,field", [
    ("name: e\ntopology: topo.yaml\nworkload: {type: allreduce, size: 1MB\n", "exp.yaml", "line"),  # YAML syntax
    ("name: e\ntopology: topo.yaml\nworkload: {type: allreduce, size: 1MB}\ncolour: red\n", "exp.yaml", "colour"),
    ("name: e\ntopology: topo.yaml\nworkload: {type: allreduce, size: [1]}\n", "exp.yaml", "workload.size"),
    ("name: e\ntopology: topo.yaml\nworkload: {type: allreduce, size: 1MB, iterations: 0}\n", "exp.yaml",
     "workload.iterations"),
    ("name: e\ntopology: nope.yaml\nworkload: {type: allreduce, size: 1MB}\n", "exp.yaml", "topology"),
    ("name: e\ntopology: topo.yaml\nload_balancing: flowlet\nworkload: {type: allreduce, size: 1MB}\n",
     "exp.yaml", "load_balancing"),
    ("name: e\ntopology: {name: t, kind: leaf-spine, spines: 17, leaves: 2, hosts_per_leaf: 1}\n"
     "load_balancing: dlb\nworkload: {type: allreduce, size: 1MB}\n", "exp.yaml", "load_balancing"),
    ("name: e\ntopology: topo.yaml\nload_balancing: dlb\ndlb: {inactivity: 0us}\n"
     "workload: {type: allreduce, size: 1MB}\n", "exp.yaml", "dlb.inactivity"),
    ("name: e\ntopology: topo.yaml\nload_balancing: spray\nspray: {entropies: 6}\n"
     "workload: {type: allreduce, size: 1MB}\n", "exp.yaml", "spray.entropies"),
    ("name: 'bad name;rm'\ntopology: topo.yaml\nworkload: {type: allreduce, size: 1MB}\n", "exp.yaml", "name"),
    ("name: e\ntopology: topo.yaml\nworkload: {type: allreduce, size: 3B, qps_per_peer: 2}\n", "exp.yaml", ""),
    ("name: e\ntopology: topo.yaml\nworkload: {type: allreduce, size: 1MB}\nname: f\n", "exp.yaml", "line"),  # duplicate key
])
def test_bad_experiment(spec_dir: Path, text: str, file: str, field: str):
    (spec_dir / "exp.yaml").write_text(text)
    with pytest.raises(SpecError) as exc:
        load_experiment(spec_dir / "exp.yaml")
    (f, fld, msg), *_ = problems(exc)
    assert f.endswith(file)
    assert fld.startswith(field)
    assert msg and "\n" not in msg


def test_error_in_topology_names_the_topology_file(spec_dir: Path):
    (spec_dir / "topo.yaml").write_text("name: t\nkind: leaf-spine\nspines: 0\nleaves: 4\nhosts_per_leaf: 2\n")
    with pytest.raises(SpecError) as exc:
        load_experiment(spec_dir / "exp.yaml")
    (f, fld, msg), = problems(exc)
    assert f.endswith("topo.yaml") and fld == "spines" and "greater than or equal to 1" in msg


def test_wrong_kind_and_unknown_key_in_topology(spec_dir: Path):
    (spec_dir / "topo.yaml").write_text(
        "name: t\nkind: torus\nspines: 2\nleaves: 4\nhosts_per_leaf: 2\nfoo: 1\n")
    with pytest.raises(SpecError) as exc:
        load_topology(spec_dir / "topo.yaml")
    fields = {p[1] for p in problems(exc)}
    assert fields == {"kind", "foo"}


def test_missing_file():
    with pytest.raises(SpecError) as exc:
        load_experiment(Path("/nonexistent/exp.yaml"))
    assert problems(exc) == [("/nonexistent/exp.yaml", "", "file not found")]


def test_unknown_host_name_is_an_input_error(spec_dir: Path):
    with pytest.raises(SpecError) as exc:
        load_checked(spec_dir / "exp.yaml", ["workload.ranks=[h1, h42]"])
    (f, fld, msg), = problems(exc)
    assert fld == "workload.ranks" and "h42" in msg


def test_bad_set_syntax(spec_dir: Path):
    with pytest.raises(SpecError) as exc:
        load_experiment(spec_dir / "exp.yaml", ["topology.spines"])
    assert problems(exc)[0][0] == "--set"


def test_default_timeout_scales_with_the_workload(spec_dir: Path):
    # 8 ranks of 1 MB at 50 Mb/s: 1.75 MB per rank = 0.28 s at line rate.
    spec, _, _ = load_checked(spec_dir / "exp.yaml", [])
    assert spec.timeout == pytest.approx(30 + 10 * 0.28)
    spec, _, _ = load_checked(spec_dir / "exp.yaml", ["timeout=5s"])
    assert spec.timeout == 5
