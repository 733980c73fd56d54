"""Demonstrations as in-memory training samples for supervised fine-tuning.

Each sample is one step t of an episode: the observation at t (both camera views, state,
instruction) and the expert's action chunk ``a[t : t + H]``; past the episode's end the chunk is
padded with the last action (and ``pad`` marks those entries).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import cv2
import numpy as np
import torch

from embodied.data.lerobot_format import Dataset
from policies.io import indexed_inputs
from sims.core import STATE_OBS


@dataclass
class DemoTensors:
    """All steps of a dataset. Shapes: ``rgb [T, V, s, s, 3]`` uint8, ``state [T, S]``,
    ``actions [T, A]``, ``episode [T]``, ``instruction_ids [T]`` into ``instructions``;
    ``chunk_index [T, H]`` rows of ``actions`` forming each step's chunk, ``chunk_pad [T, H]``;
    ``frame_size``: side of the frames as recorded (before resizing to ``s``); ``rgb`` is ``[T, 0, 1, 1, 3]``
    when no cameras are asked for, and ``state [T, S + P]`` holds the privileged vector too when
    loaded with ``state_obs="privileged"``. ``starts [M]``: the steps a sample starts at (every step,
    or in a policy's rollouts only those where it read its views: ``decision_every`` in the dataset's
    info, the frames between holding the last one rendered); samples are indexed ``0..M-1``."""

    rgb: torch.Tensor
    state: torch.Tensor
    actions: torch.Tensor
    episode: torch.Tensor
    instruction_ids: torch.Tensor
    instructions: list[str]
    chunk_index: torch.Tensor
    chunk_pad: torch.Tensor
    cameras: list[str]
    frame_size: int
    starts: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.starts is None:
            self.starts = torch.arange(len(self.state))

    def __len__(self) -> int:
        assert self.starts is not None
        return len(self.starts)

    def batch(self, idx: torch.Tensor) -> tuple[dict, torch.Tensor]:
        """Observations and expert chunks ``[B, H, A]`` of the samples ``idx`` (into :attr:`starts`)."""
        assert self.starts is not None
        step = self.starts[idx]
        obs = indexed_inputs(self.rgb[step], self.state[step], self.instruction_ids[step], self.instructions)
        return obs, self.actions[self.chunk_index[step]]


def load_demonstrations(
    root: str | Sequence[str],
    *,
    chunk_size: int,
    image_size: int,
    cameras: Sequence[str] | None = None,
    episodes: Sequence[int] | None = None,
    state_obs: str = "proprio",
    only_successes: bool = False,
) -> DemoTensors:
    """Decode a v3.0 dataset (or several with one layout, their episodes in turn) into
    :class:`DemoTensors` (images resized to ``image_size``).

    ``state_obs``: ``proprio`` (the recorded ``observation.state``) or ``privileged`` (that state
    followed by ``observation.privileged``, as ``sims.make(..., state_obs="privileged")`` gives it).
    ``episodes``: a subset of the episodes of a single dataset. ``only_successes``: of those, the
    episodes that succeeded (a policy's rollouts kept with their failures, filtered here).
    """
    if state_obs not in STATE_OBS:
        raise ValueError(f"state_obs must be one of {STATE_OBS}, got {state_obs!r}")
    roots = [str(root)] if isinstance(root, (str, bytes)) or hasattr(root, "__fspath__") else [str(r) for r in root]
    if not roots:
        raise ValueError("no dataset given")
    if episodes is not None and len(roots) > 1:
        raise ValueError(f"episodes= selects from one dataset, {len(roots)} were given")
    rgb, state, actions, episode, instr, chunk_index, chunk_pad, starts = [], [], [], [], [], [], [], []
    instructions: dict[str, int] = {}
    offset = 0
    first_episode = 0
    cams: list[str] = []
    frame_size = None
    for r in roots:
        ds = Dataset(r)
        cams = list(cameras) if cameras is not None else ds.cameras
        missing = [c for c in cams if c not in ds.cameras]
        if missing:
            raise ValueError(f"the dataset at {r} has cameras {ds.cameras}, the policy needs {cams}")
        ids = list(range(ds.num_episodes)) if episodes is None else list(episodes)
        if only_successes:
            ids = [e for e in ids if ds.episodes[e]["success"]]
        elif not ids:
            raise ValueError(f"no episodes selected from {r}")
        frame_size = frame_size or ds.image_size
        every = int(ds.info.get("embodied", {}).get("decision_every") or 1)
        for e in ids:
            ep = ds.episode(e, images=bool(cams))
            t = len(ep["action"])
            if not cams:  # a policy without vision
                views = np.zeros((t, 0, 1, 1, 3), np.uint8)
            else:
                views = ep["rgb"][:, [ds.cameras.index(c) for c in cams]]  # [T, V, H, W, 3]
            if cams and views.shape[2] != image_size:
                views = np.stack(
                    [
                        [cv2.resize(v, (image_size, image_size), interpolation=cv2.INTER_AREA) for v in step]
                        for step in views
                    ]
                )
            rgb.append(views)
            if state_obs == "privileged":
                if "observation.privileged" not in ep:
                    raise ValueError(
                        f"state_obs='privileged' but the dataset at {r} has no observation.privileged column"
                    )
                state.append(np.concatenate([ep["observation.state"], ep["observation.privileged"]], axis=1))
            else:
                state.append(ep["observation.state"])
            actions.append(ep["action"])
            episode.append(np.full(t, first_episode + e))
            instr.append(np.full(t, instructions.setdefault(ep["instruction"], len(instructions))))
            steps = np.arange(t)[:, None] + np.arange(chunk_size)[None]
            chunk_pad.append(steps >= t)
            chunk_index.append(offset + np.minimum(steps, t - 1))
            starts.append(offset + np.arange(0, t, every))
            offset += t
        first_episode += ds.num_episodes
    if not state:
        raise ValueError(f"no episode of {roots} succeeded: nothing to train on with only_successes")
    if len({s.shape[1] for s in state}) > 1 or len({a.shape[1] for a in actions}) > 1:
        raise ValueError(f"the datasets {roots} differ in their state or action width: train on one layout")
    return DemoTensors(
        rgb=torch.from_numpy(np.concatenate(rgb)),
        state=torch.from_numpy(np.concatenate(state)).float(),
        actions=torch.from_numpy(np.concatenate(actions)).float(),
        episode=torch.from_numpy(np.concatenate(episode)),
        instruction_ids=torch.from_numpy(np.concatenate(instr)),
        instructions=list(instructions),
        chunk_index=torch.from_numpy(np.concatenate(chunk_index)),
        chunk_pad=torch.from_numpy(np.concatenate(chunk_pad)),
        cameras=cams,
        frame_size=frame_size or image_size,
        starts=torch.from_numpy(np.concatenate(starts)),
    )
