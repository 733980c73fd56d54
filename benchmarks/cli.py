"""``embodied-bench``: the benchmark app (Hydra).

    embodied-bench bench=sim out=runs/bench                  # -> runs/bench/sim.json, sim.csv
    embodied-bench bench=sim out=/tmp/b num_envs=[1,8] steps=20 repeats=3

``bench`` selects the benchmark (an option of the config group ``configs/bench/``; available
now: ``sim``, ``experts``, ``policy``, ``train``, ``latency``, ``serve``); ``out`` is the run folder and is
required. Hydra writes its own files (``.hydra/``, ``bench.log``) into the run folder too. Each
benchmark prints a table and writes ``<out>/<bench>.json`` and ``<out>/<bench>.csv``. Schemas:
:mod:`benchmarks.config`.
"""

from __future__ import annotations

import importlib
import logging
import sys
from typing import NoReturn

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from benchmarks.config import BenchError, register
from embodied.config import hydra_app
from embodied.runs import prepare_run_dir

register()

#: benchmark name -> "module:function"; the function takes (typed config, run folder).
BENCHES: dict[str, str] = {
    "sim": "benchmarks.sim:run",
    "experts": "benchmarks.experts:run",
    "policy": "benchmarks.policy:run",
    "train": "benchmarks.train:run",
    "latency": "benchmarks.latency:run",
    "serve": "benchmarks.serve:run",
}
#: named by the design, not built yet.
PLANNED: tuple[str, ...] = ()

log = logging.getLogger(__name__)


def _fail(message: str, code: int = 2) -> NoReturn:
    print(f"embodied-bench: error: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


@hydra_app("embodied-bench", "bench")
def main(cfg: DictConfig) -> None:
    """Run the benchmark that ``bench=`` selects; see the module docstring."""
    name = HydraConfig.get().runtime.choices.get("bench")
    if name not in BENCHES:
        planned = [p for p in PLANNED if p not in BENCHES]
        _fail(
            f"unknown benchmark bench={name!r}; available: {', '.join(sorted(BENCHES))}"
            + (f" (planned, not built yet: {', '.join(planned)})" if planned else "")
        )
    if OmegaConf.is_missing(cfg, "out"):
        _fail(
            f"out=DIR is required: the run folder that receives {name}.json and {name}.csv, "
            f"e.g. embodied-bench bench={name} out=runs/bench"
        )
    out = prepare_run_dir(cfg.out)
    typed = OmegaConf.to_object(cfg)  # the benchmark's schema dataclass, validated by Hydra
    module, _, attr = BENCHES[name].partition(":")
    runner = getattr(importlib.import_module(module), attr)
    try:
        runner(typed, out)
    except BenchError as err:
        _fail(str(err))
    log.info("wrote %s and %s", out / f"{name}.json", out / f"{name}.csv")


if __name__ == "__main__":
    main()
