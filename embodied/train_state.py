"""Resumable training state without pickle: optimizer tensors and RNG states in safetensors,
the rest (step counters, optimizer hyper-parameters, numpy RNG) in JSON.

Layout of a state folder: ``state.safetensors``, ``state.json`` (written last, atomically: a
folder without ``state.json`` holds no usable state).
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from embodied.runs import write_json


def _flatten_optimizer(opt: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    sd = opt.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for pid, st in sd["state"].items():
        for key, val in st.items():
            if isinstance(val, torch.Tensor):
                tensors[f"opt.{pid}.{key}"] = val.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(pid), {})[key] = val
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def save_train_state(folder: str | os.PathLike, *, optimizer: torch.optim.Optimizer, step: int,
                     extra: dict[str, Any] | None = None, scheduler: Any = None) -> Path:
    """Write optimizer state, counters and RNG states into ``folder``."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors, opt_meta = _flatten_optimizer(optimizer)
    tensors["rng.torch"] = torch.get_rng_state()
    tmp = folder / ".state.safetensors.tmp"
    save_file(tensors, str(tmp))
    os.replace(tmp, folder / "state.safetensors")
    np_state = np.random.get_state()
    meta = {
        "step": int(step),
        "optimizer": opt_meta,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "rng": {"python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]], "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]]},
        "extra": extra or {},
    }
    write_json(folder / "state.json", meta)
    return folder


def load_train_state(folder: str | os.PathLike, *, optimizer: torch.optim.Optimizer,
                     scheduler: Any = None) -> dict[str, Any]:
    """Restore what :func:`save_train_state` wrote; returns the JSON part (``step``, ``extra``)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    if not (folder / "state.json").is_file():
        raise FileNotFoundError(f"no training state in {folder} (state.json missing): cannot resume")
    meta = json.loads((folder / "state.json").read_text())
    tensors = load_file(str(folder / "state.safetensors"))
    state: dict[int, dict[str, Any]] = {}
    for name, val in tensors.items():
        if name.startswith("opt."):
            _, pid, key = name.split(".", 2)
            state.setdefault(int(pid), {})[key] = val
    for pid, scal in meta["optimizer"]["scalars"].items():
        state.setdefault(int(pid), {}).update(scal)
    optimizer.load_state_dict({"state": state, "param_groups": meta["optimizer"]["param_groups"]})
    if scheduler is not None and meta.get("scheduler") is not None:
        scheduler.load_state_dict(meta["scheduler"])
    torch.set_rng_state(tensors["rng.torch"])
    np_state = meta["rng"]["numpy"]
    np.random.set_state((np_state[0], np.array(np_state[1], dtype=np.uint32), *np_state[2:]))
    py = meta["rng"]["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    return meta
