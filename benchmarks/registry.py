"""The benchmarks of ``embodied-bench``: name -> module, imported on use.

Each module defines ``SCHEMA``, its subclass of :class:`benchmarks.config.BenchConfig`, and
``run(cfg, out)``, which takes the typed config and the run folder and writes
``<out>/<name>.json`` and ``<out>/<name>.csv``. A new benchmark is one module, one line here and
``configs/bench/<name>.yaml`` (``defaults: [/bench_<name>_schema]``).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from benchmarks.config import BenchConfig, BenchError
from embodied.config import store

_BENCHES: dict[str, str] = {
    "sim": "benchmarks.sim",
    "experts": "benchmarks.experts",
    "policy": "benchmarks.policy",
    "train": "benchmarks.train",
    "latency": "benchmarks.latency",
    "serve": "benchmarks.serve",
    "libero": "benchmarks.libero",
}
#: named by the design, not built yet.
PLANNED: tuple[str, ...] = ()


def bench_module(name: str) -> ModuleType:
    """The module of benchmark ``name`` (its ``SCHEMA`` and ``run``)."""
    if name not in _BENCHES:
        planned = [p for p in PLANNED if p not in _BENCHES]
        raise BenchError(
            f"unknown benchmark bench={name!r}; available: {', '.join(sorted(_BENCHES))}"
            + (f" (planned, not built yet: {', '.join(planned)})" if planned else "")
        )
    return importlib.import_module(_BENCHES[name])


def register_schemas() -> None:
    """Store ``bench_schema`` and every benchmark's ``bench_<name>_schema`` in Hydra's ConfigStore
    (idempotent). Hydra composes before the app knows which benchmark was chosen, so all are stored."""
    store("bench_schema", BenchConfig)
    for name in _BENCHES:
        store(f"bench_{name}_schema", bench_module(name).SCHEMA)
