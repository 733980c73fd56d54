"""Run folders (embodied/runs.py): which stored configs a run resumes from, which metrics rows it keeps."""

from __future__ import annotations


def test_same_config_lets_folders_from_before_a_new_field_resume():
    from dataclasses import dataclass

    from embodied.runs import same_config

    @dataclass
    class Schema:
        episodes: int = 50
        attempts: int = 1  # a field added after some folders were made

    old = {"episodes": 50}  # stored by a run from before ``attempts`` existed
    assert same_config(old, {"episodes": 50, "attempts": 1}, Schema)
    assert not same_config(old, {"episodes": 50, "attempts": 2}, Schema)
    assert not same_config(old, {"episodes": 20, "attempts": 1}, Schema)
    assert same_config({"episodes": 50, "attempts": 2}, {"episodes": 50, "attempts": 2}, Schema)
    assert not same_config(None, {"episodes": 50, "attempts": 1}, Schema)


def test_read_complete_rows_drops_torn_and_stale_rows(tmp_path):
    """What a resumed run keeps of its metrics.csv: complete rows up to the checkpoint."""
    from embodied.runs import read_complete_rows

    path = tmp_path / "metrics.csv"
    # rows 1..3, a row with a field missing, row 4 past the checkpoint, then row 5 cut inside its last
    # field by a crash (no line terminator, yet it parses with every field)
    path.write_text("iteration,loss,lr\n1,0.5,1e-4\n2,0.4,1e-4\n2.5,0.3\nx,0.1,1e-4\n3,0.3,1e-4\n4,0.2,1e-4\n5,0.1,1e-")
    header, rows = read_complete_rows(path, "iteration", upto=3)
    assert header == ["iteration", "loss", "lr"]
    assert [r["iteration"] for r in rows] == ["1", "2", "3"]
    assert rows[0] == {"iteration": "1", "loss": "0.5", "lr": "1e-4"}
    assert [r["iteration"] for r in read_complete_rows(path, "iteration")[1]] == ["1", "2", "3", "4"]
    path.write_text("iteration,loss,lr\n1,0.5,1e-4\n3")  # a torn row that is just an iteration number
    assert [r["iteration"] for r in read_complete_rows(path, "iteration", upto=30)[1]] == ["1"]
    path.write_text("iteration,loss,lr\r\n1,0.5,1e-4,7\r\n2,0.4,1e-4\r\n")  # too many fields; csv's \r\n
    assert [r["iteration"] for r in read_complete_rows(path, "iteration", upto=30)[1]] == ["2"]
    path.write_text("step,loss\n")  # only the header
    assert read_complete_rows(path, "step", upto=10) == (["step", "loss"], [])
    path.write_text("step,lo")  # the header itself torn
    assert read_complete_rows(path, "step", upto=10) == (None, [])
    assert read_complete_rows(tmp_path / "absent.csv", "step", upto=10) == (None, [])
