"""The reference env stepped by another process, one request per line: the closed loop of a controller
that lives elsewhere (our scripted experts, on the reference's own state).

    python -m reference.state_server --suite libero_object [--cache DIR]

Runs in the reference venv (started by :func:`sims.libero.closed_loop.ReferenceLoop`). Reads JSON
requests from stdin, one per line, and answers each with one line on stdout that starts with
``@@`` (anything else on stdout, such as a library's print, is not an answer):

- ``{"cmd": "reset", "task": T, "init": I}``: task ``T`` of the suite (its env made on first use),
  init state ``I`` (0..49 official, 50..99 sampled: from the scene cache at ``--cache``), the protocol's
  wait steps. Answer: ``state`` (the simulator's flattened
  state ``[1 + nq + nv]``), ``body_pos`` ``[nbody, 3]`` and ``body_quat`` ``[nbody, 4]`` (the model's
  fixture placement of this reset), ``gripper`` (robosuite's accumulated gripper command),
  ``max_steps`` (the suite's step limit), ``success``.
- ``{"cmd": "step", "action": [7]}``: one control step. Answer: ``state``, ``success``.
- ``{"cmd": "quit"}``: close and exit.

Floats travel as JSON numbers (17 significant digits: exact for float64).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np

from .env import ReferenceTask


def answer(payload: dict[str, Any]) -> None:
    sys.stdout.write("@@" + json.dumps(payload) + "\n")
    sys.stdout.flush()


def snapshot(task: ReferenceTask) -> dict[str, Any]:
    sim = task.inner.sim
    return {"state": np.asarray(sim.get_state().flatten(), dtype=np.float64).tolist(), "success": task.success()}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="the reference env stepped over stdin/stdout")
    ap.add_argument("--suite", required=True)
    ap.add_argument("--cache", default=None, help="the scene cache root of the sampled states (init ids 50..99)")
    args = ap.parse_args(argv)
    task: ReferenceTask | None = None
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            cmd = req.get("cmd")
            if cmd == "quit":
                break
            if cmd == "reset":
                if task is None or task.task_id != int(req["task"]):
                    if task is not None:
                        task.close()
                    task = ReferenceTask(args.suite, int(req["task"]), image_size=0, cache=args.cache)
                task.reset(int(req["init"]))
                model = task.inner.sim.model
                answer(
                    {
                        **snapshot(task),
                        "body_pos": np.asarray(model.body_pos).tolist(),
                        "body_quat": np.asarray(model.body_quat).tolist(),
                        "gripper": np.asarray(task.inner.robots[0].gripper.current_action).tolist(),
                        "max_steps": task.max_steps,
                    }
                )
            elif cmd == "step":
                if task is None:
                    raise ValueError("step before any reset")
                task.step(np.asarray(req["action"], dtype=np.float64))
                answer(snapshot(task))
            else:
                raise ValueError(f"unknown cmd {cmd!r}: reset, step or quit")
        except Exception as err:  # noqa: BLE001 - the caller gets the reason and decides
            answer({"error": f"{type(err).__name__}: {err}"})
    if task is not None:
        task.close()


if __name__ == "__main__":
    main()
