"""One code path for the task logic over two array libraries.

The controller, the observations, the success predicates and the rewards are written once against
the array API: they run on numpy arrays on the host (the C backend, and the Warp backend with
``task_logic="host"``) and on torch tensors on the Warp device (``task_logic="device"``: the state
never leaves the GPU during a control step). numpy >= 2 is itself an array-API namespace; torch's
comes from ``array_api_compat``. Constants (joint limits, offsets, reference quaternions) are numpy
arrays; :func:`like` puts them beside the array they meet.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

import numpy as np


@functools.cache
def torch_namespace() -> ModuleType:
    """The array-API namespace of torch (``array_api_compat.torch``), imported on first use."""
    import array_api_compat.torch as xt

    return xt


def xp_of(x: Any) -> ModuleType:
    """The namespace of array ``x``: numpy for ``np.ndarray``, torch's array-API namespace otherwise."""
    return np if isinstance(x, np.ndarray) else torch_namespace()


def like(value: Any, ref: Any) -> Any:
    """``value`` (a number, a sequence or a numpy array) as an array of ``ref``'s library; on torch,
    on ``ref``'s device and, for floating values, in ``ref``'s dtype. numpy values are returned as they are."""
    if isinstance(ref, np.ndarray):
        return np.asarray(value)
    import torch

    arr = np.asarray(value)
    dtype = ref.dtype if arr.dtype.kind == "f" and ref.is_floating_point() else None
    return torch.as_tensor(arr, dtype=dtype, device=ref.device)


def to_numpy(x: Any) -> np.ndarray:
    """A host numpy array of ``x`` (a copy for torch tensors, ``x`` itself for numpy arrays)."""
    if isinstance(x, np.ndarray):
        return x
    return x.detach().cpu().numpy()
