"""The protocol's camera views of a LIBERO task after its reset, from the reference env.

    python -m reference.views --suite libero_spatial --task 0 --inits 0 1 --image-size 128 --out V.npz

Runs in the reference venv. Each init state gets the protocol's whole reset (``env.reset()``,
``set_init_state``, the wait steps), which also re-samples the fixtures' placement. ``V.npz``:
``agentview`` and ``wrist`` ``[K, H, W, 3]`` uint8 (the policy's views: rotated by 180 degrees),
``state`` ``[K, 8]`` (the protocol's state), ``inits`` ``[K]``, and each episode's body placement
``body_pos`` ``[K, nbody, 3]`` and ``body_quat`` ``[K, nbody, 4]``.
"""

from __future__ import annotations

import argparse
from typing import Sequence

import numpy as np

from .env import ReferenceTask


def views(suite: str, task: int, inits: Sequence[int], image_size: int) -> dict[str, np.ndarray]:
    out: dict[str, list] = {"agentview": [], "wrist": [], "state": [], "body_pos": [], "body_quat": []}
    with ReferenceTask(suite, task, image_size=image_size) as ref:
        for init in inits:
            ref.reset(init)
            obs = ref.observation()
            for k in ("agentview", "wrist", "state"):
                out[k].append(obs[k])
            out["body_pos"].append(np.array(ref.inner.sim.model.body_pos))
            out["body_quat"].append(np.array(ref.inner.sim.model.body_quat))
    return {**{k: np.asarray(v) for k, v in out.items()}, "inits": np.asarray(inits)}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", required=True)
    ap.add_argument("--task", type=int, required=True)
    ap.add_argument("--inits", type=int, nargs="+", default=[0])
    ap.add_argument("--image-size", type=int, default=128)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    np.savez(args.out, **views(args.suite, args.task, args.inits, args.image_size))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
