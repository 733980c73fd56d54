"""Our scripted experts closed-loop in the reference env (robosuite 1.4 in ``.venv-libero``).

    python -m sims.libero.closed_loop --cache DIR --suites libero_object [--tasks 0 1] [--states 10]
        [--first-state 0] [--json OUT]

The reference env runs the episode: its reset (an init state: official 0..49, or with ``--first-state 50``
the held-out ones LIBERO's placement initializer sampled; the protocol's wait steps), its
OSC_POSE controller, its physics and its success check (:mod:`sims.libero.reference.state_server`,
a child process). Each step its simulator state comes over a pipe into a *shadow* of the exported scene
(:class:`~sims.libero.worlds.LiberoWorlds`, the reference's fixture placement applied), where
:func:`~sims.libero.experts.make_expert`'s expert reads the hand and the objects and picks the action that
goes back to the reference. The shadow never steps: nothing of our physics or controller takes part,
so the success rate is the expert's in LIBERO's own simulator (demonstrations collected this way
need no teleoperation).
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from sims.libero import reference_command, scenes
from sims.libero.experts import make_expert
from sims.libero.worlds import LiberoWorlds


class ReferenceLoop:
    """The reference env of one suite in a child process, stepped one request at a time."""

    def __init__(self, suite: str, cache: str | Path | None = None) -> None:
        cache_args = [] if cache is None else ["--cache", str(Path(cache).expanduser())]  # of the sampled states
        argv, env = reference_command("state_server", ["--suite", suite, *cache_args])
        self._log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True, bufsize=1
        )

    def request(self, payload: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(payload) + "\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.startswith("@@"):
                answer = json.loads(line[2:])
                if "error" in answer:
                    raise RuntimeError(f"the reference env refused {payload.get('cmd')}: {answer['error']}")
                return answer
        self._log.seek(0)
        raise RuntimeError(f"the reference env exited (status {self.proc.wait()}):\n{self._log.read()[-3000:]}")

    def reset(self, task: int, init: int) -> dict[str, Any]:
        return self.request({"cmd": "reset", "task": int(task), "init": int(init)})

    def step(self, action: np.ndarray) -> dict[str, Any]:
        return self.request({"cmd": "step", "action": np.asarray(action, dtype=np.float64).tolist()})

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.request({"cmd": "quit"})
            except RuntimeError:
                pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._log.close()

    def __enter__(self) -> "ReferenceLoop":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def run_closed_loop(folder: Path, ref: ReferenceLoop, init_ids: Sequence[int]) -> dict[str, Any]:
    """The expert's episodes of one exported task from ``init_ids`` in the reference env: ``success``
    and ``length`` per episode (steps until success, or the suite's limit), the phase each ended in."""
    meta = scenes.read_meta(folder)
    task = int(meta["task_index"])
    shadow = LiberoWorlds(folder, 1, box_contacts="reference")
    expert = make_expert(shadow)
    success, length, phase = [], [], []
    try:
        for init in init_ids:
            answer = ref.reset(task, int(init))
            shadow.model.body_pos[:] = np.asarray(answer["body_pos"])
            shadow.model.body_quat[:] = np.asarray(answer["body_quat"])
            shadow.continue_from(np.asarray([answer["state"]]), gripper_command=np.asarray(answer["gripper"]))
            expert.reset()
            done, steps, limit = bool(answer["success"]), 0, int(answer["max_steps"])
            while not done and steps < limit:
                answer = ref.step(expert.act()[0])
                steps += 1
                done = bool(answer["success"])
                shadow.continue_from(np.asarray([answer["state"]]))
            success.append(done)
            length.append(steps)
            phase.append(expert.phases[int(expert.phase[0])])
    finally:
        shadow.close()
    return {"success": np.array(success), "length": np.array(length), "phase": phase}


def main(argv: list[str] | None = None) -> int:
    """``python -m sims.libero.closed_loop --cache CACHE [--suites ...] [--tasks ...] [--states N] [--json FILE]``:
    the expert's success per task on init states ``F..F+N-1`` (``--first-state F``, default 0; 50..99 are the
    sampled held-out states) in the reference env, closed-loop."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__.split("\n")[0] if main.__doc__ else None)
    ap.add_argument("--cache", default=None, help="the scene cache root (default: $EMBODIED_LIBERO_CACHE)")
    ap.add_argument("--suites", nargs="+", default=["libero_spatial", "libero_object"])
    ap.add_argument("--tasks", type=int, nargs="+", default=None, help="task indices (default: every exported one)")
    ap.add_argument("--states", type=int, default=10, help="init states 0..N-1 of each task")
    ap.add_argument("--first-state", type=int, default=0, help="the first init state")
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args(argv)
    rows = []
    inits = list(range(args.first_state, args.first_state + args.states))
    for suite in args.suites:
        with ReferenceLoop(suite, args.cache) as ref:
            for folder in scenes.task_dirs(args.cache, [suite]):
                meta = scenes.read_meta(folder)
                if args.tasks is not None and int(meta["task_index"]) not in args.tasks:
                    continue
                row: dict[str, Any] = {
                    "suite": suite,
                    "task": int(meta["task_index"]),
                    "goal": meta["goal_state"],
                    "inits": inits,
                }
                t0 = time.perf_counter()
                try:
                    result = run_closed_loop(folder, ref, inits)
                except ValueError as err:  # a goal this expert does not handle
                    row["skipped"] = str(err)
                    print(f"{suite} {row['task']}: skipped ({err})", flush=True)
                else:
                    ok = result["success"]
                    row.update(
                        success=float(ok.mean()),
                        lengths=result["length"][ok].tolist(),
                        failed_in=[p for p, s in zip(result["phase"], ok) if not s],
                        failed_inits=[i for i, s in zip(inits, ok) if not s],
                        seconds=round(time.perf_counter() - t0, 1),
                        steps=int(result["length"].sum()),
                    )
                    print(
                        f"{suite} {row['task']}: {row['success']:.0%} in the reference env ({row['seconds']:.0f} s, "
                        f"{row['steps']} steps); failures {row['failed_inits'] or 'none'} end in "
                        f"{row['failed_in'] or 'none'}",
                        flush=True,
                    )
                rows.append(row)
                if args.json:  # after every task: an interrupted run keeps what it measured
                    Path(args.json).write_text(json.dumps(rows, indent=2))
    done = [r["success"] for r in rows if "success" in r]
    print(f"{len(done)} tasks, mean success {np.mean(done):.1%} in the reference env" if done else "no task run")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
