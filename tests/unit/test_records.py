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
