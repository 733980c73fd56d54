"""The training runs' metrics log (embodied/metrics_log.py): columns, resume after a torn row, TensorBoard's
curve continuing from the checkpoint."""

from __future__ import annotations

import csv

import pytest


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


def test_wandb_logs_offline_into_the_run_folder_and_a_resume_continues_the_run(tmp_path, monkeypatch):
    """logger=both: the scalars also go to an offline W&B run in out/wandb (no key configured), which a
    resumed run continues under the same id; logger=wandb writes no TensorBoard events."""
    from embodied.metrics_log import MetricsLog

    for var in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.netrc key
    log = MetricsLog(tmp_path, ["step", "loss"], "step", tb_prefix="sft", logger="both", config={"lr": 3e-4})
    for step in (1, 2):
        log.row({"step": step, "loss": "0.5"})
        log.scalars({"loss": 0.5 / step}, step)
    log.close()
    run_id = (tmp_path / "wandb" / "run_id").read_text()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and runs[0].name.endswith(run_id) and list(runs[0].glob("*.wandb"))
    assert (tmp_path / "tb").is_dir()
    MetricsLog(tmp_path, ["step", "loss"], "step", resume_upto=2, tb_prefix="sft", logger="wandb").close()
    assert (tmp_path / "wandb" / "run_id").read_text() == run_id
    with pytest.raises(ValueError, match="logger='mlflow': choose one of tensorboard, wandb, both"):
        MetricsLog(tmp_path / "x", ["step"], "step", tb_prefix="sft", logger="mlflow")


def test_a_finished_runs_plots_and_videos_go_to_its_offline_wandb_run(tmp_path, monkeypatch):
    """publish_media: a real PNG and a real H.264 video land in the offline W&B run of the folder (the same
    run its scalars went to), under their paths in the run folder; logger=tensorboard sends nothing."""
    import cv2
    import numpy as np

    from embodied.metrics_log import MetricsLog, publish_media
    from embodied.video import VideoWriter

    for var in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    log = MetricsLog(tmp_path, ["step", "loss"], "step", tb_prefix="rl", logger="wandb")
    log.scalars({"loss": 1.0}, 1)
    log.close()
    png = tmp_path / "plots" / "pipeline.png"
    png.parent.mkdir()
    cv2.imwrite(str(png), np.full((24, 32, 3), 200, np.uint8))
    mp4 = tmp_path / "eval_rl" / "videos" / "task0_success.mp4"
    video = VideoWriter(mp4, fps=10)
    for i in range(6):
        video.write(np.full((32, 32, 3), 40 * i, np.uint8))
    video.close()
    assert publish_media(tmp_path, "tensorboard", [png], [mp4]) == 0
    assert publish_media(tmp_path, "wandb", [png], [mp4, tmp_path / "missing.mp4"]) == 2
    # offline, each part of a run is a folder of the same id (``wandb sync`` joins them): the scalars', then
    # the media's (named ``...-<id>-1`` when both start within the same second)
    run_id = (tmp_path / "wandb" / "run_id").read_text()
    parts = sorted((tmp_path / "wandb").glob("offline-run-*"))
    assert len(parts) == 2 and all(run_id in p.name for p in parts)
    images = [f for p in parts for f in (p / "files" / "media" / "images").rglob("*.png")]
    videos = [f for p in parts for f in (p / "files" / "media" / "videos").rglob("*.mp4")]
    assert len(images) == 1 and len(videos) == 1
    assert videos[0].read_bytes() == mp4.read_bytes()  # the playable H.264 file itself, not a re-encoding
