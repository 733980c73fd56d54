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
from policies.files import atomic_path, fsync_dir, fsync_tree


def _flatten_optimizer(sd: dict[str, Any], prefix: str = "opt.") -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """An optimizer ``state_dict`` as flat tensors (``<prefix><param id>.<key>``) + a JSON part."""
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for pid, st in sd["state"].items():
        for key, val in st.items():
            if isinstance(val, torch.Tensor):
                tensors[f"{prefix}{pid}.{key}"] = val.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(pid), {})[key] = val
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def _unflatten_optimizer(
    tensors: dict[str, torch.Tensor], meta: dict[str, Any], prefix: str = "opt."
) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for name, val in tensors.items():
        if name.startswith(prefix):
            pid, key = name[len(prefix) :].split(".", 1)
            state.setdefault(int(pid), {})[key] = val
    for pid, scal in meta["scalars"].items():
        state.setdefault(int(pid), {}).update(scal)
    return {"state": state, "param_groups": meta["param_groups"]}


def save_train_state(
    folder: str | os.PathLike,
    *,
    optimizer: torch.optim.Optimizer | None = None,
    step: int,
    extra: dict[str, Any] | None = None,
    scheduler: Any = None,
    optimizer_states: dict[str, dict[str, Any]] | None = None,
) -> Path:
    """Write optimizer state (one ``optimizer``, or named ``optimizer_states`` as state dicts, e.g.
    from remote learners), counters and RNG states into ``folder``."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    opt_meta: dict[str, Any] | None = None
    named_meta: dict[str, Any] = {}
    if optimizer is not None:
        tensors, opt_meta = _flatten_optimizer(optimizer.state_dict())
    for name, sd in (optimizer_states or {}).items():
        t, named_meta[name] = _flatten_optimizer(sd, prefix=f"opts.{name}.")
        tensors.update(t)
    tensors["rng.torch"] = torch.get_rng_state()
    with atomic_path(folder / "state.safetensors") as tmp:
        save_file(tensors, str(tmp))
    np_state = np.random.get_state()
    meta = {
        "step": int(step),
        "optimizer": opt_meta,
        "optimizers": named_meta,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "rng": {
            "python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]],
            "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]],
        },
        "extra": extra or {},
    }
    write_json(folder / "state.json", meta)
    return folder


def saved_step(folder: str | os.PathLike) -> int:
    """The step a state folder was saved at, read from its ``state.json`` alone (nothing is restored:
    :func:`load_train_state` also resets the process's random generators)."""
    return int(json.loads((Path(folder) / "state.json").read_text())["step"])


def load_train_state(
    folder: str | os.PathLike, *, optimizer: torch.optim.Optimizer | None = None, scheduler: Any = None
) -> dict[str, Any]:
    """Restore what :func:`save_train_state` wrote; returns the JSON part (``step``, ``extra``) with
    the named optimizer state dicts under ``"optimizer_states"``."""
    from safetensors.torch import load_file

    folder = Path(folder)
    if not (folder / "state.json").is_file():
        raise FileNotFoundError(f"no training state in {folder} (state.json missing): cannot resume")
    meta = json.loads((folder / "state.json").read_text())
    tensors = load_file(str(folder / "state.safetensors"))
    if optimizer is not None:
        optimizer.load_state_dict(_unflatten_optimizer(tensors, meta["optimizer"]))
    meta["optimizer_states"] = {
        name: _unflatten_optimizer(tensors, m, prefix=f"opts.{name}.") for name, m in meta.get("optimizers", {}).items()
    }
    if scheduler is not None and meta.get("scheduler") is not None:
        scheduler.load_state_dict(meta["scheduler"])
    torch.set_rng_state(tensors["rng.torch"])
    np_state = meta["rng"]["numpy"]
    np.random.set_state((np_state[0], np.array(np_state[1], dtype=np.uint32), *np_state[2:]))
    py = meta["rng"]["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    return meta


def swap_in_folder(tmp: str | os.PathLike, final: str | os.PathLike) -> Path:
    """Replace folder ``final`` by the complete folder ``tmp`` (same file system).

    Steps: ``tmp``'s files and folders flushed to disk, ``final`` -> ``final.old``, ``tmp`` -> ``final``,
    the parent folder flushed, delete ``final.old``. A kill or a power loss at any point leaves either
    ``final`` or ``final.old`` complete; :func:`resolve_folder` finds it.
    """
    import shutil

    tmp, final = Path(tmp), Path(final)
    fsync_tree(tmp)
    old = final.with_name(final.name + ".old")
    if old.exists() and final.exists():
        shutil.rmtree(old)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    fsync_dir(final.parent)
    if old.exists():
        shutil.rmtree(old)
    return final


def resolve_folder(final: str | os.PathLike) -> Path | None:
    """The complete folder written by :func:`swap_in_folder` (``final``, else ``final.old``), or None."""
    final = Path(final)
    old = final.with_name(final.name + ".old")
    return final if final.exists() else old if old.exists() else None
