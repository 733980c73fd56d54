"""What every benchmark of ``embodied-bench`` shares (see :mod:`benchmarks.cli`).

The top-level schema :class:`BenchConfig` (ConfigStore name ``bench_schema``) holds the keys every
benchmark shares; each benchmark extends it with its own keys in a subclass defined in its own
module (``SCHEMA`` there) and stored at the root of the ConfigStore as ``bench_<name>_schema``
(:func:`benchmarks.registry.register_schemas`). ``configs/bench.yaml`` selects one option of the
config group ``bench`` (``configs/bench/<name>.yaml``, package ``_global_``), which pulls in that
subclass, so the benchmark's keys are top-level overrides:
``embodied-bench bench=sim out=DIR num_envs=[1,8]``. An unknown key or a value of the wrong type
fails before anything runs.

This module imports no benchmark, so every benchmark can import it.
"""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import MISSING


class BenchError(ValueError):
    """A configuration a benchmark cannot run; ``embodied-bench`` prints it without a traceback."""


@dataclass
class BenchConfig:
    """Keys shared by every benchmark (``configs/bench.yaml``)."""

    out: str = MISSING  # run folder: <bench>.json, <bench>.csv and Hydra's .hydra/ go here
    seed: int = 0  # seeds the random actions and the envs' streams
    device: str = "cpu"  # where the env returns tensors
