"""A training run's metrics: ``metrics.csv`` in the run folder, and the scalars in TensorBoard (``tb/``),
Weights & Biases (``wandb/``) or both (``logger=tensorboard|wandb|both``).

W&B runs offline unless an API key is configured (``WANDB_API_KEY``, or ``wandb login``) or
``WANDB_MODE`` says otherwise: the run folder's ``wandb/`` then holds a run that ``wandb sync`` uploads
later. A resumed run continues the same W&B run (its id is kept in ``wandb/run_id``). A finished run's plots and
videos go to the W&B run of its folder with :func:`publish_media`."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, Mapping, Sequence

from embodied.runs import read_complete_rows
from policies.files import atomic_path

#: where the scalars go besides the CSV (``logger=``)
LOGGERS = ("tensorboard", "wandb", "both")
WANDB_PROJECT = "embodied"


def check_logger(logger: str) -> None:
    if logger not in LOGGERS:
        raise ValueError(f"logger={logger!r}: choose one of {', '.join(LOGGERS)}")


def _wandb_run(out: Path, config: Mapping[str, Any] | None, resumed: bool) -> Any:
    """A W&B run in ``out/wandb`` (offline without a configured key), the same run again when resumed."""
    import os
    import uuid

    import wandb

    folder = out / "wandb"
    folder.mkdir(parents=True, exist_ok=True)
    id_file = folder / "run_id"
    run_id = id_file.read_text().strip() if resumed and id_file.is_file() else uuid.uuid4().hex[:8]
    id_file.write_text(run_id)
    keyed = (
        bool(os.environ.get("WANDB_API_KEY"))
        or (Path.home() / ".netrc").is_file()
        and "api.wandb.ai" in (Path.home() / ".netrc").read_text()
    )
    mode = os.environ.get("WANDB_MODE") or ("online" if keyed else "offline")
    return wandb.init(
        project=os.environ.get("WANDB_PROJECT", WANDB_PROJECT),
        dir=str(out),
        id=run_id,
        name=out.name,
        config=dict(config or {}),
        mode=mode,
        resume="allow",
        reinit="create_new",
    )


class MetricsLog:
    """``out/metrics.csv`` with the columns ``fields``, rewritten on open, and the scalars' ``logger``
    (:data:`LOGGERS`): a TensorBoard writer on ``out/tb`` (none when tensorboard is not installed: the CSV
    is always written) and/or a W&B run in ``out/wandb`` with ``config`` (see the module doc).

    ``resume_upto``: the step (integer column ``key``) of the checkpoint a resumed run starts from;
    the file keeps the complete rows up to it (rows logged after it, or torn by a crash, go: see
    :func:`embodied.runs.read_complete_rows`), rewritten atomically, and TensorBoard drops its events
    after that step (``purge_step``), so both curves continue from the checkpoint rather than doubling
    back. None starts an empty file.
    """

    def __init__(
        self,
        out: Path,
        fields: Sequence[str],
        key: str,
        *,
        resume_upto: int | None = None,
        tb_prefix: str,
        logger: str = "tensorboard",
        config: Mapping[str, Any] | None = None,
    ):
        check_logger(logger)  # before anything is written
        path = out / "metrics.csv"
        kept = read_complete_rows(path, key, resume_upto)[1] if resume_upto is not None else []
        self.tb_prefix = tb_prefix
        with atomic_path(path) as tmp, open(tmp, "w", newline="") as fh:  # a kill here keeps the old rows
            writer = csv.DictWriter(fh, fieldnames=list(fields), extrasaction="ignore")
            writer.writeheader()
            writer.writerows(kept)
        self._file = open(path, "a", newline="")
        self._csv = csv.DictWriter(self._file, fieldnames=list(fields), extrasaction="ignore")
        self._tb: Any = None
        if logger in ("tensorboard", "both"):
            try:
                from torch.utils.tensorboard import SummaryWriter

                purge = None if resume_upto is None else int(resume_upto) + 1
                self._tb = SummaryWriter(str(out / "tb"), purge_step=purge)
            except ImportError:
                pass
        self._wandb = _wandb_run(out, config, resume_upto is not None) if logger in ("wandb", "both") else None

    def row(self, values: Mapping[str, Any]) -> None:
        """Append one CSV row (values written as given, keys outside the columns left out) and flush it."""
        self._csv.writerow(values)
        self._file.flush()

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        """Scalars ``<tb_prefix>/<name>`` at ``step`` for TensorBoard and/or W&B, in the order given."""
        if self._tb is not None:
            for name, value in values.items():
                self._tb.add_scalar(f"{self.tb_prefix}/{name}", value, step)
        if self._wandb is not None:
            self._wandb.log({f"{self.tb_prefix}/{k}": float(v) for k, v in values.items()}, step=int(step))

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def publish_media(
    out: Path, logger: str, images: Sequence[Path], videos: Sequence[Path], config: Mapping[str, Any] | None = None
) -> int:
    """Attach ``images`` (PNG) and ``videos`` (H.264 MP4) to the W&B run of ``out`` (``out/wandb``: the same
    run again where one is there), keyed by their paths relative to ``out``; nothing unless ``logger`` sends
    to W&B. The number of files sent."""
    check_logger(logger)
    files = [p for p in (*images, *videos) if p.is_file()]
    if logger not in ("wandb", "both") or not files:
        return 0
    import wandb

    run = _wandb_run(out, config, resumed=True)
    try:
        media: dict[str, Any] = {}
        for path in images:
            if path.is_file():
                media[path.relative_to(out).with_suffix("").as_posix()] = wandb.Image(str(path))
        for path in videos:
            if path.is_file():
                media[path.relative_to(out).with_suffix("").as_posix()] = wandb.Video(str(path), format="mp4")
        run.log(media)
    finally:
        run.finish()
    return len(files)
