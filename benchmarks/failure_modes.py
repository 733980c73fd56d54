"""How does a pick-and-place policy fail? Every failed episode of a checkpoint, sorted by what happened.

    .venv/bin/python benchmarks/failure_modes.py --checkpoint RUN/rl/checkpoint/policy \\
        --suite spatial --tasks 1 8 --episodes 50 --attempts 4 --out runs/failure_modes

Runs the policy (greedy, like ``embodied-eval``; or the suite's scripted experts, ``--expert``) on
the tasks' initial states ``first_state .. first_state + episodes - 1``, ``attempts`` episodes each,
in the MuJoCo suite env, and follows the plan's object (``("pick_place", OBJECT, TARGET)``, the
first step of a suite task's plan) and every other movable object at every step. A failed episode
(its step limit reached) is one of:

- ``dropped``: the object was lifted (``LIFT`` above its height after the first step) and is down
  again at the end (``final_to_place`` in the CSV: how far, in x-y, from what it goes on or in);
- ``held``: the object is still lifted at the end (carried, not placed);
- ``other_object``: another object was lifted, the plan's object never;
- ``missed_grasp``: the gripper came within ``REACH`` of the object, which was never lifted;
- ``elsewhere``: neither: the gripper never came near the object.

The grasp that lifts the object is measured when it first rises ``RISE`` with the gripper within
``REACH``: the gripper centre's horizontal offset from the object's centre and the finger gap.

Writes ``OUT/failure_modes.json`` (counts per task and mode, the states of each mode, the median
grasp per mode, how centred the grasps are: :func:`grasp_precision`) and ``OUT/episodes.csv`` (one row
per episode). ``--grasp-table A/episodes.csv B/episodes.csv ...`` prints the grasp precision of earlier
runs as a Markdown table instead of running anything. The sampling noise is seeded per
wave like the evaluation's, not with its seeds: counts agree with an evaluation in distribution, not
episode by episode.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import zlib
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

#: an object counts as lifted this far (m) above its height after the first step
LIFT = 0.03
#: the gripper's centre this close (m) to the object's counts as having reached it
REACH = 0.05
#: the grasp is measured when the object first rises this far (m) with the gripper within REACH
RISE = 0.005
#: grasps this close (m) to the object's centre count as centred, this far off as off-centre
NEAR, FAR = 0.01, 0.015
MODES = ("success", "dropped", "held", "other_object", "missed_grasp", "elsewhere")
FIELDS = [
    "task",
    "init_id",
    "attempt",
    "success",
    "length",
    "mode",
    "max_lift",
    "final_lift",
    "min_reach",
    "other_lifted",
    "final_to_place",
    "grasp_offset",
    "grasp_width",
]


def classify(success: bool, max_lift: float, final_lift: float, min_reach: float, other_lifted: bool) -> str:
    """The failure mode of one episode from its object's trace (see the module docstring)."""
    if success:
        return "success"
    if max_lift > LIFT:
        return "held" if final_lift > LIFT else "dropped"
    if other_lifted:
        return "other_object"
    return "missed_grasp" if min_reach < REACH else "elsewhere"


def pick_place(task: Any) -> tuple[str, str] | None:
    """The first ``pick_place`` step's object and the object it goes on or in (None: no such step)."""
    steps = [s for s in getattr(task, "plan", ()) if s[0] == "pick_place"]
    return (steps[0][1], steps[0][2][1]) if steps else None


def run_task(
    agent: Any,
    suite: str,
    task: int,
    states: Sequence[int],
    attempts: int,
    num_envs: int,
    seed: int,
    gripper_sign: bool = False,
) -> list[dict[str, Any]]:
    """Episodes of one task ``[(state, attempt)]`` in waves of ``num_envs``, each with its trace.
    ``agent``: an :class:`embodied.eval.harness.PolicyAgent` or ``ExpertAgent`` (which reads no image);
    ``gripper_sign``: send the sign of the gripper command (+-1) instead of its value."""
    import sims
    from embodied.eval.harness import ExpertAgent

    work = [(s, a) for a in range(attempts) for s in states]
    n = min(num_envs, len(work))
    cameras = () if isinstance(agent, ExpertAgent) else tuple(agent.cameras)
    env = sims.make("mujoco", suite=suite, num_envs=n, seed=seed, cameras=cameras, state_obs=agent.state_obs)
    rows: list[dict[str, Any]] = []
    try:
        t_obj = env.task_objs[task]
        view = t_obj.view
        target, place = pick_place(t_obj)
        others = [o.name for o in t_obj.scene.movable if o.name != target]
        for w in range(0, len(work), n):
            wave = work[w : w + n]
            k = len(wave)
            padded = wave + [wave[0]] * (n - k)
            obs = env.reset(task_ids=[task] * n, init_ids=[s for s, _ in padded])
            agent.begin_wave(zlib.crc32(f"{seed}/{suite}/{task}/{w}".encode()))
            ids = np.arange(n)
            # heights read after the first step: an object a layout puts on another (the spatial suite's
            # cube on the plate) starts at table height inside it and is pushed up in that step
            z0: dict[str, np.ndarray] = {}
            max_lift = np.zeros(n)
            last_lift = np.zeros(n)
            min_reach = np.full(n, np.inf)
            other_lifted = np.zeros(n, bool)
            to_place = np.zeros(n)
            grasp_offset = np.full(n, np.nan)
            grasp_width = np.full(n, np.nan)
            active = np.zeros(n, bool)
            active[:k] = True
            success = np.zeros(n, bool)
            length = np.zeros(n, np.int64)
            while active.any():
                chunk = agent.act(obs, env)  # [N, H, A]
                if gripper_sign:
                    chunk = chunk.clone()
                    chunk[..., -1] = torch.where(chunk[..., -1] > 0, 1.0, -1.0)
                for h in range(chunk.shape[1]):
                    obs, _, _, _, info = env.step(chunk[:, h], active=torch.as_tensor(active))
                    ended = info["done"].numpy() & active
                    success |= info["success"].numpy() & active
                    live = active & ~ended  # an ended env may already hold its next reset's state
                    if not z0:
                        z0 = {name: view.pos(name, ids)[:, 2].copy() for name in [target] + others}
                    obj = view.pos(target, ids)  # [N, 3]
                    lift = obj[:, 2] - z0[target]
                    tcp_to_obj = np.asarray(env.tcp_pos())[ids] - obj
                    reach = np.linalg.norm(tcp_to_obj, axis=1)
                    grasping = live & np.isnan(grasp_offset) & (lift > RISE) & (reach < REACH)
                    grasp_offset = np.where(grasping, np.linalg.norm(tcp_to_obj[:, :2], axis=1), grasp_offset)
                    grasp_width = np.where(grasping, np.asarray(env.gripper_width())[ids], grasp_width)
                    max_lift = np.where(live, np.maximum(max_lift, lift), max_lift)
                    last_lift = np.where(live, lift, last_lift)
                    xy = np.linalg.norm(obj[:, :2] - view.pos(place, ids)[:, :2], axis=1)
                    to_place = np.where(live, xy, to_place)
                    min_reach = np.where(live, np.minimum(min_reach, reach), min_reach)
                    for name in others:
                        up = view.pos(name, ids)[:, 2] - z0[name] > LIFT
                        other_lifted |= live & up
                    for j in np.flatnonzero(ended):
                        length[j] = int(info["episode"]["length"][j])
                    active &= ~ended
                    if not active.any():
                        break
            for j, (state, attempt) in enumerate(wave):
                rows.append(
                    {
                        "task": task,
                        "init_id": state,
                        "attempt": attempt,
                        "success": bool(success[j]),
                        "length": int(length[j]),
                        "max_lift": round(float(max_lift[j]), 4),
                        "final_lift": round(float(last_lift[j]), 4),
                        "min_reach": round(float(min_reach[j]), 4),
                        "other_lifted": bool(other_lifted[j]),
                        "final_to_place": round(float(to_place[j]), 4),
                        "grasp_offset": _metres_or_blank(grasp_offset[j]),
                        "grasp_width": _metres_or_blank(grasp_width[j]),
                        "mode": classify(
                            bool(success[j]),
                            float(max_lift[j]),
                            float(last_lift[j]),
                            float(min_reach[j]),
                            bool(other_lifted[j]),
                        ),
                    }
                )
    finally:
        env.close()
    return rows


def _metres_or_blank(x: float) -> float | str:
    return "" if np.isnan(x) else round(float(x), 4)


def grasp_precision(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """How centred the grasps that lifted the object are: the offsets' quantiles (m), the share of lifts
    off-centre by more than ``FAR``, and the success of those against the lifts within ``NEAR``."""
    lifted = [r for r in rows if r.get("grasp_offset", "") != ""]
    if not lifted:
        return {"lifted": 0}
    offsets = np.array([float(r["grasp_offset"]) for r in lifted])
    far = [r for r in lifted if float(r["grasp_offset"]) > FAR]
    near = [r for r in lifted if float(r["grasp_offset"]) <= NEAR]
    rate = lambda rs: round(sum(r["mode"] == "success" for r in rs) / len(rs), 4) if rs else None  # noqa: E731
    return {
        "lifted": len(lifted),
        **{f"offset_p{q}": round(float(np.percentile(offsets, q)), 4) for q in (50, 75, 90)},
        "far_share": round(len(far) / len(lifted), 4),
        "far": len(far),
        "far_success": rate(far),
        "near": len(near),
        "near_success": rate(near),
    }


def read_episodes(path: Path) -> list[dict[str, Any]]:
    """The rows of an ``episodes.csv`` this script wrote (what :func:`grasp_precision` reads)."""
    with open(path, newline="") as f:
        return [{**r, "grasp_offset": float(r["grasp_offset"]) if r["grasp_offset"] else ""} for r in csv.DictReader(f)]


def grasp_table(paths: Sequence[Path]) -> str:
    """A Markdown table of :func:`grasp_precision` for each ``episodes.csv``, named by its path."""
    cm = lambda x: f"{100 * x:.2f}"  # noqa: E731
    lines = [
        f"| episodes | lifted | grasp offset, cm: median / p75 / p90 | lifts > {cm(FAR)} cm | success of those "
        f"| success of lifts <= {cm(NEAR)} cm |",
        "|---|---|---|---|---|---|",
    ]
    for path in paths:
        g = grasp_precision(read_episodes(path))
        if not g["lifted"]:
            lines.append(f"| {path} | 0 | - | - | - | - |")
            continue
        pct = lambda x: "-" if x is None else f"{x:.0%}"  # noqa: E731
        lines.append(
            f"| {path} | {g['lifted']} | {cm(g['offset_p50'])} / {cm(g['offset_p75'])} / {cm(g['offset_p90'])} "
            f"| {g['far_share']:.0%} | {pct(g['far_success'])} ({g['far']}) | {pct(g['near_success'])} ({g['near']}) |"
        )
    return "\n".join(lines)


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts per task and mode, and the states of each failure mode ``{mode: {state: attempts}}``."""
    out: dict[str, Any] = {
        "episodes": len(rows),
        "modes": {m: sum(r["mode"] == m for r in rows) for m in MODES},
        "grasp": {},
        "grasp_precision": grasp_precision(rows),
        "tasks": {},
    }
    for m in MODES:  # the grasp that lifted the object: horizontal offset from its centre, finger gap (m)
        got = [r for r in rows if r["mode"] == m and r.get("grasp_offset", "") != ""]
        if got:
            out["grasp"][m] = {
                "episodes": len(got),
                "offset_median": round(float(np.median([r["grasp_offset"] for r in got])), 4),
                "width_median": round(float(np.median([r["grasp_width"] for r in got])), 4),
            }
    for task in sorted({r["task"] for r in rows}):
        mine = [r for r in rows if r["task"] == task]
        states: dict[str, dict[int, int]] = {}
        for r in mine:
            if r["mode"] != "success":
                states.setdefault(r["mode"], {}).setdefault(r["init_id"], 0)
                states[r["mode"]][r["init_id"]] += 1
        out["tasks"][str(task)] = {
            "episodes": len(mine),
            "modes": {m: sum(r["mode"] == m for r in mine) for m in MODES},
            "states": {m: dict(sorted(v.items())) for m, v in states.items()},
        }
    return out


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--grasp-table"]:
        missing = [p for p in argv[1:] if not Path(p).is_file()]
        if not argv[1:] or missing:
            raise SystemExit(
                f"--grasp-table needs episodes.csv files this script wrote; not found: {missing or 'none given'}"
            )
        print(grasp_table([Path(p) for p in argv[1:]]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    who = ap.add_mutually_exclusive_group(required=True)
    who.add_argument("--checkpoint", help="a policy checkpoint folder (model.safetensors + config)")
    who.add_argument("--expert", action="store_true", help="the suite's scripted experts instead of a policy")
    ap.add_argument("--suite", default="spatial")
    ap.add_argument("--tasks", type=int, nargs="+", required=True)
    ap.add_argument("--episodes", type=int, default=50, help="initial states per task")
    ap.add_argument("--first-state", type=int, default=0, help="the first state (50: the held-out ones)")
    ap.add_argument("--attempts", type=int, default=4)
    ap.add_argument("--num-envs", type=int, default=25)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--gripper-sign",
        action="store_true",
        help="send the sign of the gripper command (+-1), as OpenVLA's LIBERO evaluation does: is a "
        "half-closed command what loses the object?",
    )
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.episodes < 1 or args.attempts < 1 or args.num_envs < 1:
        ap.error("--episodes, --attempts and --num-envs must be at least 1")

    import policies
    import sims
    from embodied.eval.harness import ExpertAgent, PolicyAgent
    from policies.errors import CheckpointError

    if sims.suites.is_libero(args.suite):
        ap.error(f"--suite {args.suite!r}: only our MuJoCo suites' tasks have the plans this follows")
    try:
        specs = sims.suites.build_tasks(args.suite)
    except ValueError as e:
        ap.error(f"--suite: {e}")
    for t in args.tasks:
        if not 0 <= t < len(specs):
            ap.error(f"--tasks: {args.suite!r} has tasks 0..{len(specs) - 1}, got {t}")
        if pick_place(specs[t]) is None:
            ap.error(
                f"--tasks: task {t} ({specs[t].name}) has no pick_place step in its plan; "
                "its failures are not sorted here"
            )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        agent = ExpertAgent(args.suite) if args.expert else PolicyAgent(policies.load(args.checkpoint, device="cpu"))
    except CheckpointError as e:
        ap.error(f"--checkpoint: {e}")
    states = list(range(args.first_state, args.first_state + args.episodes))
    rows: list[dict[str, Any]] = []
    for task in args.tasks:
        rows += run_task(agent, args.suite, task, states, args.attempts, args.num_envs, args.seed, args.gripper_sign)
        done = [r for r in rows if r["task"] == task]
        print(f"task {task}: " + ", ".join(f"{m} {sum(r['mode'] == m for r in done)}" for m in MODES), flush=True)
    with open(out / "episodes.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    summary = {
        "checkpoint": "expert" if args.expert else str(args.checkpoint),
        "suite": args.suite,
        "tasks": args.tasks,
        "states": states,
        "attempts": args.attempts,
        "seed": args.seed,
        "gripper_sign": args.gripper_sign,
        "lift_m": LIFT,
        "reach_m": REACH,
        **summarise(rows),
    }
    (out / "failure_modes.json").write_text(json.dumps(summary, indent=1))
    print(f"wrote {out / 'failure_modes.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
