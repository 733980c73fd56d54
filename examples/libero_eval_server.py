"""Evaluate any openpi-compatible policy server on real LIBERO, in LIBERO's own env (robosuite 1.4).

What it shows: ``embodied-eval server=HOST:PORT simulator=robosuite``, openpi's LIBERO protocol (each
task's official initial states in order, seed 7, 10 wait steps, the suite's step limit) played by the
reference client in ``.venv-libero`` against a running server: openpi's own ``serve_policy.py`` or
``embodied-serve``; the scores land in ``OUT/results.json`` and ``OUT/report.md``.

    python examples/libero_eval_server.py --server 127.0.0.1:8000 --suite libero_spatial --out runs/ex_eval
    python examples/libero_eval_server.py --tiny --out /tmp/ex_eval    # serves a tiny random checkpoint itself

``--tiny`` starts ``embodied-serve`` with a tiny untrained LIBERO-shaped policy (8-D state, 7-D actions,
agent view and wrist cameras) on a free port and plays one short episode of one task.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
from pathlib import Path

from _helpers import BIN, embodied_serve, tiny_checkpoint


def evaluate(server: str, args: argparse.Namespace, keys: list[str]) -> dict:
    """``embodied-eval`` of ``server`` on ``args.suite``; returns its results.json."""
    command = [str(BIN / "embodied-eval"), f"server={server}", f"suite={args.suite}", "simulator=robosuite"]
    subprocess.run([*command, f"out={args.out}", *keys], check=True)
    return json.loads((Path(args.out) / "results.json").read_text())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--server", help="HOST:PORT of a running openpi-compatible policy server")
    p.add_argument("--suite", default="libero_spatial")
    p.add_argument("--tasks", type=int, nargs="*", help="task indices (default: all)")
    p.add_argument("--episodes", type=int, default=50, help="initial states per task")
    p.add_argument("--tiny", action="store_true", help="test size: serve a tiny checkpoint, 1 task, 1 short episode")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if not args.server and not args.tiny:
        p.error("give --server HOST:PORT (or --tiny)")

    keys = [f"episodes={args.episodes}"] + ([f"tasks=[{','.join(map(str, args.tasks))}]"] if args.tasks else [])
    with contextlib.ExitStack() as stack:
        server = args.server
        if args.tiny:
            work = Path(args.out).with_name(Path(args.out).name + "_server")
            ckpt = tiny_checkpoint(work / "policy", state_dim=8, action_dim=7, cameras=["agentview", "wrist"])
            server = f"127.0.0.1:{stack.enter_context(embodied_serve(ckpt, work / 'serve.log'))}"
            keys = ["tasks=[0]", "episodes=1", "max_steps=5", "image_size=64", "videos=none"]
        results = evaluate(server, args, keys)

    for task in results["suites"][args.suite]["tasks"]:
        print(f"task {task['task']} {task['name']}: {task['successes']}/{task['episodes']} successes")
    print(f"report: {args.out}/report.md")


if __name__ == "__main__":
    main()
