import json

from fabric_emu.state import records


def test_record_from_another_version_still_loads(tmp_path, monkeypatch):
    monkeypatch.setattr(records, "RUNS_DIR", tmp_path)
    (tmp_path / "old.json").write_text(json.dumps({
        "run_id": "old", "pid": 1, "pid_start_time": 0, "created": 0.0,
        "bridges": ["spine1"], "interfaces": ["leaf1-eth3"],
        "processes": [{"pid": 5, "start_time": 7, "role": "controller"}], "paths": []}))
    (rec,) = records.all_records()
    assert rec.run_id == "old" and rec.interfaces == ["leaf1-eth3"]
    assert rec.processes[0].role == "controller"


def test_a_run_folder_is_named_in_the_record_before_it_exists(tmp_path, monkeypatch):
    monkeypatch.setattr(records, "RUNS_DIR", tmp_path / "runs")
    monkeypatch.setattr(records.tempfile, "gettempdir", lambda: str(tmp_path))
    rec = records.RunRecord.new("r1")
    made = []
    save = rec.save
    monkeypatch.setattr(rec, "save", lambda: (made.append((tmp_path / "fabric-emu-r1").exists()), save()))
    workdir = rec.new_workdir()
    assert made == [False]  # saved while the folder did not exist yet
    assert workdir.is_dir() and workdir == tmp_path / "fabric-emu-r1"
    (saved,) = records.all_records()
    assert saved.paths == [str(workdir)]
