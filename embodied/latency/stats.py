"""Latency measured, not guessed: per-stage timing statistics and the delay they imply."""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from typing import Iterator

import numpy as np


def delay_steps(seconds: float, control_hz: float) -> int:
    """Control steps that pass during ``seconds`` of inference: ``ceil(seconds * hz)``."""
    if seconds < 0 or control_hz <= 0:
        raise ValueError(f"need seconds >= 0 and control_hz > 0, got {seconds}, {control_hz}")
    return int(math.ceil(seconds * control_hz - 1e-9))


class LatencyStats:
    """Durations (seconds) per stage, e.g. ``decode``, ``preprocess``, ``inference``, ``encode``."""

    def __init__(self) -> None:
        self.samples: dict[str, list[float]] = {}

    def record(self, stage: str, seconds: float) -> None:
        self.samples.setdefault(stage, []).append(float(seconds))

    @contextmanager
    def time(self, stage: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.record(stage, time.perf_counter() - start)

    def summary(self) -> dict[str, dict[str, float]]:
        """Per stage: ``count``, ``mean``, ``p50``, ``p95``, ``max`` (seconds)."""
        out = {}
        for stage, values in self.samples.items():
            v = np.asarray(values)
            out[stage] = {
                "count": int(v.size),
                "mean": float(v.mean()),
                "p50": float(np.percentile(v, 50)),
                "p95": float(np.percentile(v, 95)),
                "max": float(v.max()),
            }
        return out

    def delay(self, control_hz: float, stage: str = "inference", quantile: float = 95.0) -> int:
        """The delay ``d`` (control steps) to plan for: ``stage``'s ``quantile`` percentile."""
        if not self.samples.get(stage):
            raise ValueError(f"no {stage!r} timings recorded yet")
        return delay_steps(float(np.percentile(self.samples[stage], quantile)), control_hz)
