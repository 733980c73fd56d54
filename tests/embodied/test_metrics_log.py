"""The training runs' metrics log (embodied/metrics_log.py): columns, resume after a torn row, TensorBoard's
curve continuing from the checkpoint."""

from __future__ import annotations

import csv


def test_metrics_log_columns_resume_and_tensorboard(tmp_path):
    from embodied.metrics_log import MetricsLog

    log = MetricsLog(tmp_path, ["step", "loss"], "step", tb_prefix="sft")
    for step in (1, 2, 3):
        log.row({"step": step, "loss": f"{step / 10:.2f}", "extra": "left out"})
        log.scalars({"loss": step / 10}, step)
    log.close()
    with open(tmp_path / "metrics.csv", "a", newline="") as fh:
        fh.write("4,0.")  # torn by a kill
    log = MetricsLog(tmp_path, ["step", "loss"], "step", resume_upto=2, tb_prefix="sft")
    log.row({"step": 3, "loss": "0.33"})
    log.scalars({"loss": 0.33}, 3)
    log.close()
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    assert rows == [{"step": "1", "loss": "0.10"}, {"step": "2", "loss": "0.20"}, {"step": "3", "loss": "0.33"}]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = EventAccumulator(str(tmp_path / "tb")).Reload()  # the folder, as TensorBoard reads a run
    assert run.Tags()["scalars"] == ["sft/loss"]
    # the resumed writer purged what was logged after step 2, so the curve continues rather than doubling back
    assert [(s.step, round(s.value, 4)) for s in run.Scalars("sft/loss")] == [(1, 0.1), (2, 0.2), (3, 0.33)]
    MetricsLog(tmp_path, ["step", "loss"], "step", tb_prefix="sft").close()  # a fresh run starts empty
    assert (tmp_path / "metrics.csv").read_bytes() == b"step,loss\r\n"
