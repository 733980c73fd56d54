"""``embodied-bench``: the benchmark app (Hydra).

    embodied-bench bench=sim out=runs/bench                  # -> runs/bench/sim.json, sim.csv
    embodied-bench bench=sim out=/tmp/b num_envs=[1,8] steps=20 repeats=3

``bench`` selects the benchmark (an option of the config group ``configs/bench/``; available
now: ``sim``, ``experts``, ``policy``, ``train``, ``latency``, ``serve``); ``out`` is the run folder and is
required. Hydra writes its own files (``.hydra/``, ``bench.log``) into the run folder too. Each
benchmark prints a table and writes ``<out>/<bench>.json`` and ``<out>/<bench>.csv``. Schemas:
:mod:`benchmarks.config` (shared keys) and each benchmark's module (:mod:`benchmarks.registry`).
"""

from __future__ import annotations

import logging
import sys
from typing import NoReturn

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from benchmarks.config import BenchError
from benchmarks.registry import bench_module, register_schemas
from embodied.config import hydra_app
from embodied.runs import prepare_run_dir

register_schemas()

log = logging.getLogger(__name__)


def _fail(message: str, code: int = 2) -> NoReturn:
    print(f"embodied-bench: error: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


@hydra_app("embodied-bench", "bench")
def main(cfg: DictConfig) -> None:
    """Run the benchmark that ``bench=`` selects; see the module docstring."""
    name = HydraConfig.get().runtime.choices.get("bench")
    try:
        bench = bench_module(name)
    except BenchError as err:
        _fail(str(err))
    if OmegaConf.is_missing(cfg, "out"):
        _fail(
            f"out=DIR is required: the run folder that receives {name}.json and {name}.csv, "
            f"e.g. embodied-bench bench={name} out=runs/bench"
        )
    out = prepare_run_dir(cfg.out)
    typed = OmegaConf.to_object(cfg)  # the benchmark's schema dataclass, validated by Hydra
    try:
        bench.run(typed, out)
    except BenchError as err:
        _fail(str(err))
    log.info("wrote %s and %s", out / f"{name}.json", out / f"{name}.csv")


if __name__ == "__main__":
    main()
