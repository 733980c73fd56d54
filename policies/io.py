"""The one mapping from an observation to what a policy reads, for training and serving alike.

Every family reads the same input dict (:class:`policies.base.Policy`):

- ``rgb``: uint8 ``[N, V, H, W, 3]``, the views in the order of ``config.cameras``
  (``[N, 0, 1, 1, 3]`` for a policy without vision);
- ``state``: float ``[N, S]``;
- ``instruction``: a list of N strings;
- ``time_left`` (optional, RL only): float ``[N]``, see :func:`policies.base.obs_time_left`.

The callers differ only in where the rows come from:

- :func:`env_inputs`: an observation of the simulation contract (:mod:`sims.core`), whose
  ``task_id [N]`` indexes the env's tasks (:func:`task_instructions`);
- :func:`indexed_inputs`: batched columns whose instructions are ids into a list of texts
  (demonstrations, rollout and training batches);
- :func:`policy_inputs`: decoded batched arrays with one text per row (the policy server, after
  ``real_robot`` has decoded and validated its wire format).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from policies.base import TIME_LEFT
from sims.core import obs_views

RGB = "rgb"
STATE = "state"
INSTRUCTION = "instruction"
#: the keys every policy input holds (``time_left`` may be added)
INPUT_KEYS = (RGB, STATE, INSTRUCTION)

PolicyInputs = dict[str, Any]
Array = torch.Tensor | np.ndarray


def policy_inputs(
    rgb: Array, state: Array, instructions: Sequence[str], *, time_left: torch.Tensor | None = None
) -> PolicyInputs:
    """The input dict of decoded batched arrays: ``rgb [N, V, H, W, 3]`` uint8, ``state [N, S]``,
    ``instructions`` N strings, ``time_left [N]`` (omitted when None).

    Arrays become tensors without a copy (a tensor is kept as it is, a numpy array is shared)."""
    out: PolicyInputs = {RGB: torch.as_tensor(rgb), STATE: torch.as_tensor(state), INSTRUCTION: list(instructions)}
    if time_left is not None:
        out[TIME_LEFT] = time_left
    return out


def instruction_texts(ids: torch.Tensor | Sequence[int], texts: Sequence[str]) -> list[str]:
    """``texts[ids[i]]`` for every row of ``ids [N]``."""
    rows = ids.tolist() if isinstance(ids, (torch.Tensor, np.ndarray)) else ids
    return [texts[int(i)] for i in rows]


def indexed_inputs(
    rgb: Array,
    state: Array,
    ids: torch.Tensor | Sequence[int],
    texts: Sequence[str],
    *,
    time_left: torch.Tensor | None = None,
) -> PolicyInputs:
    """The input dict of batched columns whose instruction of row i is ``texts[ids[i]]``
    (``rgb [N, V, H, W, 3]``, ``state [N, S]``, ``ids [N]``, ``time_left [N]``)."""
    return policy_inputs(rgb, state, instruction_texts(ids, texts), time_left=time_left)


def task_instructions(env: Any) -> list[str]:
    """The instruction of each of ``env.tasks``, indexed as ``obs["task_id"]``."""
    return [task.instruction for task in env.tasks]


def env_inputs(
    obs: dict[str, torch.Tensor], instructions: Sequence[str], *, time_left: torch.Tensor | None = None
) -> PolicyInputs:
    """The input dict of a simulation observation: its views (:func:`sims.core.obs_views`),
    ``obs["state"] [N, S]`` and the instruction of ``obs["task_id"] [N]`` in ``instructions``
    (:func:`task_instructions` of the env)."""
    return indexed_inputs(obs_views(obs), obs["state"], obs["task_id"], instructions, time_left=time_left)
