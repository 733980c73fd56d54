"""States of a LIBERO task around its goal, with the reference's truth of each goal predicate.

    python -m reference.predicate_states --suite libero_goal --task 0 --out S.npz [--inits 2]

Runs in the reference venv. LIBERO re-samples the fixtures' placement at every ``env.reset()``, so the
env is reset once (the official protocol's first reset, whose placement the scene cache holds) and
each later start is ``set_init_state`` plus the protocol's wait steps. It records the state after
each of init states ``0..inits-1``; then, for each goal predicate, it builds states that straddle it:

- ``on`` / ``in`` with a movable object: the object put above its target (the target body's or
  site's position, offset by 0, 2 and 4 cm in x, 8 cm up) and left to settle for 15 control
  steps of the open-gripper dummy action; also the state right after the placing (in the air);
- ``open`` / ``close`` / ``turnon`` / ``turnoff``: each joint of the target set to 7 values across
  its range (then ``forward``).

``S.npz``: ``states`` ``[S, 1 + nq + nv]``, ``truth`` ``[S, P]`` (the reference's truth of each of
the P goal predicates in each state), ``goal`` (the predicates as ``"name arg1 [arg2]"`` strings) and
``site_pos`` ``[S, K, 3]`` (the world position of every site named in the goal, in the order of
``sites``), to check the scene geometry on both sides; ``body_pos`` ``[nbody, 3]`` and ``body_quat``
``[nbody, 4]``, the model's body placement (the fixtures' is sampled at the reset and may differ
from the cache's).
"""

from __future__ import annotations

import argparse
from typing import Sequence

import numpy as np

from .env import DUMMY_ACTION, NUM_WAIT_STEPS, ReferenceTask

SETTLE_STEPS = 15
OFFSETS = (0.0, 0.02, 0.04)
JOINT_VALUES = 7


def _target_position(ref: ReferenceTask, name: str) -> np.ndarray:
    inner = ref.inner
    if name in inner.object_sites_dict:
        return np.array(inner.sim.data.get_site_xpos(name))
    return ref.pose(name)[0]


def _joints_of(ref: ReferenceTask, name: str) -> list[str]:
    inner = ref.inner
    if name in inner.object_sites_dict:
        return list(inner.object_sites_dict[name].joints or [])
    return list(inner.get_object(name).joints)


def _start(ref: ReferenceTask, init: int) -> None:
    """Init state ``init`` and the protocol's wait steps, without a reset (the placement stays)."""
    ref.raw = ref.env.set_init_state(ref.init_states[init])
    for _ in range(NUM_WAIT_STEPS):
        ref.step(DUMMY_ACTION)


def collect(suite: str, task: int, inits: int = 2) -> dict[str, np.ndarray]:
    with ReferenceTask(suite, task, image_size=0) as ref:
        inner, sim = ref.inner, ref.inner.sim
        ref.reset(0)
        goal = [p for p, _ in ref.goal()]
        sites = sorted({a for p in goal for a in p[1:] if a in inner.object_sites_dict})
        states, truth, site_pos = [], [], []

        def record() -> None:
            states.append(np.array(sim.get_state().flatten()))
            truth.append([t for _, t in ref.goal()])
            site_pos.append([np.array(sim.data.get_site_xpos(s)) for s in sites] or np.zeros((0, 3)))

        for init in range(inits):
            _start(ref, init)
            record()
        for pred in goal:
            name, args = pred[0], pred[1:]
            if name in ("on", "in") and args[0] in inner.objects_dict:
                for dx in OFFSETS:
                    _start(ref, 0)
                    target = _target_position(ref, args[1])
                    ref.place(args[0], target + np.array([dx, 0.0, 0.08]))
                    record()
                    for _ in range(SETTLE_STEPS):
                        ref.step(DUMMY_ACTION)
                    record()
            elif name in ("open", "close", "turnon", "turnoff"):
                _start(ref, 0)
                for joint in _joints_of(ref, args[0]):
                    jid = sim.model.joint_name2id(joint)
                    lo, hi = sim.model.jnt_range[jid]
                    for q in np.linspace(lo, hi, JOINT_VALUES):
                        sim.data.set_joint_qpos(joint, q)
                        sim.forward()
                        record()
        return {
            "body_pos": np.array(sim.model.body_pos),
            "body_quat": np.array(sim.model.body_quat),
            "states": np.asarray(states),
            "truth": np.asarray(truth, dtype=bool),
            "goal": np.array([" ".join(p) for p in goal]),
            "sites": np.array(sites, dtype=str),
            "site_pos": np.asarray(site_pos, dtype=np.float64).reshape(len(states), len(sites), 3),
        }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", required=True)
    ap.add_argument("--task", type=int, required=True)
    ap.add_argument("--inits", type=int, default=2)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    np.savez(args.out, **collect(args.suite, args.task, args.inits))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
