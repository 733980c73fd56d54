"""The official LIBERO protocol in the reference simulator, against a policy server.

    python -m reference.client --port 8000 --suite libero_spatial --out DIR [--tasks 0 1]
        [--episodes 50] [--first-state 0] [--max-steps N] [--action-steps K] [--image-size 128] [--cache DIR]

Runs in ``.venv-libero`` (numpy, libero, openpi-client); ``embodied-eval ... simulator=robosuite``
starts it beside ``embodied-serve``. The protocol is openpi's LIBERO example: per task, its
official initial states in order (one episode each; ``--first-state 50``: the held-out states 50..99
that LIBERO's placement initializer sampled, read from the scene cache at ``--cache``, default
``$EMBODIED_LIBERO_CACHE``, exported there first when missing), the env seeded with 7, 10 open-gripper wait
steps, then the policy acts until the goal holds or for the suite's step limit (spatial 220,
object 280, goal 300, libero_10 520, libero_90 400); images rotated by 180 degrees; the 8-D state
(eef position, axis-angle, gripper); a new chunk is asked for after every ``action_steps``
actions (default: the whole chunk).

Any openpi-compatible server works. The request's keys follow the server's metadata: ours lists
``request_keys`` (``observation/images/<camera>`` per camera of the policy: the one named like
``wrist`` / ``hand`` gets the wrist view, the other the agent view); a server without them gets
openpi's LIBERO keys (``observation/image``, ``observation/wrist_image``, both padded to 224 px).

Outputs in ``out``: ``episodes.jsonl`` (one line per finished episode, the fields of
``embodied.eval.harness.EpisodeRecord``; the episodes already there are skipped, so a rerun
resumes), ``tasks.json`` (every task's name and instruction) and, per filmed episode, ``frames/<suite>/<task>_<init>.npz`` (``agentview``, ``wrist``
``[T, H, W, 3]`` uint8) for the caller to encode. A progress line per episode goes to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from .env import ReferenceTask

OPENPI_SIZE = 224
WRIST_WORDS = ("wrist", "hand")


def request_builder(metadata: dict[str, Any]) -> Any:
    """A function ``(observation, prompt) -> request dict`` for the server that sent ``metadata``."""
    keys = metadata.get("request_keys")
    if keys:  # embodied-serve: its own keys, checked against what the policy reads
        state_dim = int(metadata.get("state_dim", 8))
        if state_dim != 8:
            raise SystemExit(
                f"the policy reads a {state_dim}-D state; LIBERO's protocol gives the 8-D state "
                "(eef position, axis-angle, gripper): serve a policy trained on LIBERO's state"
            )
        if int(metadata.get("action_dim", 7)) != 7:
            raise SystemExit(f"the policy acts in {metadata['action_dim']} dimensions; LIBERO's OSC_POSE takes 7")
        cams = list(metadata.get("cameras", []))
        if len(cams) > 2:
            raise SystemExit(f"the policy reads {len(cams)} cameras {cams}; LIBERO has two (agent view, wrist)")
        view = {c: ("wrist" if any(w in c.lower() for w in WRIST_WORDS) else "agentview") for c in cams}
        if len(cams) == 2 and len(set(view.values())) == 1:
            view = {cams[0]: "agentview", cams[1]: "wrist"}

        def build(obs: dict[str, Any], prompt: str) -> dict[str, Any]:
            req: dict[str, Any] = {"observation/state": obs["state"], "prompt": prompt}
            for cam, src in view.items():
                req[f"observation/images/{cam}"] = obs[src]
            return req
    else:  # an openpi server (its LIBERO policy config)
        from openpi_client import image_tools

        def build(obs: dict[str, Any], prompt: str) -> dict[str, Any]:
            return {
                "observation/image": image_tools.resize_with_pad(obs["agentview"], OPENPI_SIZE, OPENPI_SIZE),
                "observation/wrist_image": image_tools.resize_with_pad(obs["wrist"], OPENPI_SIZE, OPENPI_SIZE),
                "observation/state": obs["state"].astype(np.float64),
                "prompt": prompt,
            }

    return build


def done_episodes(path: Path) -> set[tuple[int, int]]:
    """``(task, init_id)`` already recorded in ``episodes.jsonl`` (a torn last line is ignored)."""
    done = set()
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
                done.add((int(rec["task"]), int(rec["init_id"])))
            except (ValueError, KeyError, TypeError):
                continue
    return done


def play(
    task: ReferenceTask, init_id: int, policy: Any, build: Any, *, max_steps: int, action_steps: int | None, film: bool
) -> tuple[bool, int, dict[str, list[np.ndarray]]]:
    """One episode: ``(success, policy steps taken, frames)``."""
    task.reset(init_id)
    frames: dict[str, list[np.ndarray]] = {"agentview": [], "wrist": []}
    plan: list[np.ndarray] = []
    steps, success = 0, task.success()
    while not success and steps < max_steps:
        obs = task.observation()
        if film:
            frames["agentview"].append(obs["agentview"])
            frames["wrist"].append(obs["wrist"])
        if not plan:
            chunk = np.asarray(policy.infer(build(obs, task.language))["actions"], dtype=np.float64)
            if chunk.ndim != 2 or chunk.shape[1] != 7:
                raise SystemExit(f"the server answered actions of shape {list(chunk.shape)}, expected [H, 7]")
            plan = list(chunk[: action_steps or len(chunk)])
        success = task.step(plan.pop(0))
        steps += 1
    return success, steps, frames


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--api-key", default=os.environ.get("EMBODIED_API_KEY"))
    p.add_argument("--suite", required=True)
    p.add_argument("--tasks", type=int, nargs="*", default=None, help="task indices (default: all)")
    p.add_argument("--episodes", type=int, default=50, help="initial states per task")
    p.add_argument("--first-state", type=int, default=0, help="0..49 official, 50..99 the sampled held-out states")
    p.add_argument(
        "--cache",
        default=None,
        help="the scene cache root of the sampled states (default $EMBODIED_LIBERO_CACHE or ~/.cache/embodied/libero)",
    )
    p.add_argument("--max-steps", type=int, default=None, help="policy steps per episode (default: the suite's)")
    p.add_argument("--action-steps", type=int, default=None, help="actions executed per chunk (default: all)")
    p.add_argument("--image-size", type=int, default=128)
    p.add_argument("--hard-reset", action="store_true", help="rebuild the model at every reset (robosuite's default)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--videos", choices=("failures", "all", "none"), default="failures")
    p.add_argument("--video-max", type=int, default=10)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)

    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    from .env import instruction, load_suite

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    suite = load_suite(args.suite)
    n_tasks = suite.n_tasks
    listing = {
        "suite": args.suite,
        "tasks": [
            {"name": suite.get_task(i).name, "language": instruction(args.suite, suite.get_task(i))}
            for i in range(n_tasks)
        ],
    }
    (out / "tasks.json.tmp").write_text(json.dumps(listing, indent=1))
    os.replace(out / "tasks.json.tmp", out / "tasks.json")
    tasks = list(range(n_tasks)) if args.tasks is None else args.tasks
    bad = [t for t in tasks if not 0 <= t < n_tasks]
    if bad:
        raise SystemExit(f"task index(es) {bad} out of range for {args.suite} (0..{n_tasks - 1})")
    episodes_path = out / "episodes.jsonl"
    done = done_episodes(episodes_path)
    filmed = sum(1 for _ in (out / "frames" / args.suite).glob("*.npz")) if (out / "frames").is_dir() else 0
    policy = WebsocketClientPolicy(args.host, args.port, api_key=args.api_key)
    build = request_builder(policy.get_server_metadata())
    with open(episodes_path, "a") as log:
        for t in tasks:
            todo = [i for i in range(args.first_state, args.first_state + args.episodes) if (t, i) not in done]
            if not todo:
                continue
            t0 = time.perf_counter()
            task = ReferenceTask(
                args.suite, t, image_size=args.image_size, hard_reset=args.hard_reset, seed=args.seed, cache=args.cache
            )
            if todo[0] < 0 or todo[-1] >= task.num_states:
                raise SystemExit(
                    f"{args.suite} task {t} has init ids {task.init_ids_help()}; asked for {todo[0]}..{todo[-1]}"
                )
            task.state_of(todo[-1])  # a sampled state's cache read (exported if missing) before the first episode
            print(
                f"[libero] {args.suite} task {t} {task.name}: env ready in {time.perf_counter() - t0:.1f} s", flush=True
            )
            try:
                for init_id in todo:
                    t1 = time.perf_counter()
                    film = args.videos != "none" and args.image_size > 0 and filmed < args.video_max
                    success, length, frames = play(
                        task,
                        init_id,
                        policy,
                        build,
                        max_steps=args.max_steps or task.max_steps,
                        action_steps=args.action_steps,
                        film=film,
                    )
                    if film and (args.videos == "all" or not success) and frames["agentview"]:
                        path = out / "frames" / args.suite / f"{t:02d}_{init_id:02d}_{'ok' if success else 'fail'}.npz"
                        path.parent.mkdir(parents=True, exist_ok=True)
                        np.savez_compressed(
                            path.with_suffix(".tmp.npz"),
                            agentview=np.stack(frames["agentview"]),
                            wrist=np.stack(frames["wrist"]),
                        )
                        os.replace(path.with_suffix(".tmp.npz"), path)
                        filmed += 1
                    rec = {
                        "suite": args.suite,
                        "task": t,
                        "name": task.name,
                        "init_id": init_id,
                        "wave": t,
                        "success": success,
                        "length": length,
                        "diverged": False,
                        "attempt": 0,
                    }
                    log.write(json.dumps(rec) + "\n")
                    log.flush()
                    print(
                        f"[libero] task {t} init {init_id}: {'success' if success else 'failure'} in {length} steps "
                        f"({time.perf_counter() - t1:.1f} s)",
                        flush=True,
                    )
            finally:
                task.close()


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(130)
