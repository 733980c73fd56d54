"""A training run's metrics: ``metrics.csv`` in the run folder and TensorBoard events under ``tb/``."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, Mapping, Sequence

from embodied.runs import read_complete_rows
from policies.files import atomic_path


class MetricsLog:
    """``out/metrics.csv`` with the columns ``fields``, rewritten on open, and a TensorBoard writer on
    ``out/tb`` (none when tensorboard is not installed: the CSV is always written).

    ``resume_upto``: the step (integer column ``key``) of the checkpoint a resumed run starts from;
    the file keeps the complete rows up to it (rows logged after it, or torn by a crash, go: see
    :func:`embodied.runs.read_complete_rows`), rewritten atomically, and TensorBoard drops its events
    after that step (``purge_step``), so both curves continue from the checkpoint rather than doubling
    back. None starts an empty file.
    """

    def __init__(self, out: Path, fields: Sequence[str], key: str, *, resume_upto: int | None = None, tb_prefix: str):
        path = out / "metrics.csv"
        kept = read_complete_rows(path, key, resume_upto)[1] if resume_upto is not None else []
        self.tb_prefix = tb_prefix
        with atomic_path(path) as tmp, open(tmp, "w", newline="") as fh:  # a kill here keeps the old rows
            writer = csv.DictWriter(fh, fieldnames=list(fields), extrasaction="ignore")
            writer.writeheader()
            writer.writerows(kept)
        self._file = open(path, "a", newline="")
        self._csv = csv.DictWriter(self._file, fieldnames=list(fields), extrasaction="ignore")
        try:
            from torch.utils.tensorboard import SummaryWriter

            purge = None if resume_upto is None else int(resume_upto) + 1
            self._tb: Any = SummaryWriter(str(out / "tb"), purge_step=purge)
        except ImportError:
            self._tb = None

    def row(self, values: Mapping[str, Any]) -> None:
        """Append one CSV row (values written as given, keys outside the columns left out) and flush it."""
        self._csv.writerow(values)
        self._file.flush()

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        """TensorBoard scalars ``<tb_prefix>/<name>`` at ``step``, in the order given."""
        if self._tb is not None:
            for name, value in values.items():
                self._tb.add_scalar(f"{self.tb_prefix}/{name}", value, step)

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
