"""An action sequence played in the reference env, with what its OSC_POSE controller held and did.

    python -m reference.osc_trace --suite libero_spatial --task 0 --init 0 --actions A.npy --out T.npz

Runs in the reference venv (started by ``sims.libero.reference_command("osc_trace", [...])``): the
official reset of task ``--task`` from init state ``--init`` (the protocol's wait steps included),
then each action of ``A.npy`` (``[K, 7]``) as one control step. ``T.npz`` holds the controller's
hidden state after the reset, which is not part of the simulator state: ``nullspace_target``
(``[7]``: the joint posture the null-space torques pull toward, the robot's initial posture plus
robosuite's initialisation noise), ``goal_ori`` (``[3, 3]``: the orientation goal, kept while the
rotation actions are zero) and ``gripper_action`` (``[2]``: the gripper's accumulated command); the
simulator states ``start`` (``[1 + nq + nv]``, after the reset) and ``states`` (``[K, 1 + nq + nv]``,
after each step); the end-effector site's pose after each step, ``eef_pos`` (``[K, 3]``) and
``eef_mat`` (``[K, 3, 3]``); the arm torques and gripper controls sent at the last substep of each
step, ``ctrl`` (``[K, nu]``); ``success`` (``[K]``: the task's goal after each step); the protocol's
8-D state after the reset and after each step, ``start_proprio`` (``[8]``) and ``proprio`` (``[K, 8]``).
"""

from __future__ import annotations

import argparse
from typing import Sequence

import numpy as np

from .env import ReferenceTask


def trace(suite: str, task: int, init: int, actions: np.ndarray) -> dict[str, np.ndarray]:
    actions = np.asarray(actions, dtype=np.float64)
    if actions.ndim != 2 or actions.shape[1] != 7:
        raise ValueError(f"actions must be [K, 7], got {list(actions.shape)}")
    with ReferenceTask(suite, task, image_size=0) as ref:
        ref.reset(init)
        inner = ref.inner
        robot = inner.robots[0]
        ctl = robot.controller
        sim = inner.sim
        site = sim.model.site_name2id(ctl.eef_name)
        out: dict[str, list] = {"states": [], "eef_pos": [], "eef_mat": [], "ctrl": [], "success": [], "proprio": []}
        start_proprio = ref.observation()["state"]
        start = np.array(sim.get_state().flatten())
        hidden = {
            "nullspace_target": np.array(ctl.initial_joint),
            "goal_ori": np.array(ctl.goal_ori),
            "gripper_action": np.array(robot.gripper.current_action),
        }
        for a in actions:
            done = ref.step(a)
            out["states"].append(np.array(sim.get_state().flatten()))
            out["eef_pos"].append(np.array(sim.data.site_xpos[site]))
            out["eef_mat"].append(np.array(sim.data.site_xmat[site]).reshape(3, 3))
            out["ctrl"].append(np.array(sim.data.ctrl))
            out["success"].append(done)
            out["proprio"].append(ref.observation()["state"])
        return {
            "start": start,
            "start_proprio": start_proprio,
            **hidden,
            **{k: np.asarray(v) for k, v in out.items()},
            "eef_site": np.array(ctl.eef_name),
            "kp": np.array(ctl.kp),
            "kd": np.array(ctl.kd),
        }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", required=True)
    ap.add_argument("--task", type=int, required=True)
    ap.add_argument("--init", type=int, default=0)
    ap.add_argument("--actions", required=True, help=".npy file of [K, 7] actions")
    ap.add_argument("--out", required=True, help=".npz file to write")
    args = ap.parse_args(argv)
    np.savez(args.out, **trace(args.suite, args.task, args.init, np.load(args.actions)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
