"""RL on a real LIBERO task in our batched simulator: Flow-SDE PPO with ``embodied-train``.

What it shows: a LIBERO task (its scene exported from LIBERO's own env into the scene cache on first
use, about 35 s a task) stepped as ``num_envs`` batched MuJoCo envs, chunk-level PPO of a flow VLA on
it, and the run folder it writes (``metrics.csv``, ``checkpoint/policy``; rerunning resumes).

    python examples/libero_rl.py --init runs/lib/sft/ckpt --task 0 --num-envs 16 --iterations 50 --out runs/ex_rl
    python examples/libero_rl.py --tiny --out /tmp/ex_rl          # a tiny fresh policy, 2 envs, 1 iteration
    python examples/libero_rl.py ... -- algo.lr=1e-5 save_every=5  # any other embodied-train key

Start from an SFT checkpoint of the task (docs/guide/real-libero.md: collect, then SFT); without
``--init`` a fresh flow policy learns from scratch, which only shows the machinery. The cache is
``--cache`` or ``$EMBODIED_LIBERO_CACHE`` (default ``~/.cache/embodied/libero``).
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
from pathlib import Path

from _helpers import BIN, TINY_POLICY

import sims


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", default="libero_spatial")
    p.add_argument("--task", type=int, default=0)
    p.add_argument("--init", help="an SFT checkpoint bundle (default: a fresh flow policy)")
    p.add_argument("--num-envs", type=int, default=16)
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--image-size", type=int, default=128)
    p.add_argument("--cache", help="the LIBERO scene cache (default $EMBODIED_LIBERO_CACHE)")
    p.add_argument("--tiny", action="store_true", help="test size: tiny policy, 2 envs, 1 short iteration")
    p.add_argument("--out", required=True)
    p.add_argument("overrides", nargs="*", help="more embodied-train keys (after --)")
    args = p.parse_args(argv)
    if args.cache:
        os.environ["EMBODIED_LIBERO_CACHE"] = args.cache

    task = sims.suites.tasks(args.suite)[args.task]  # LIBERO's task table: no export needed to read it
    print(f"{args.suite} task {args.task}: {task.instruction!r}")
    if args.init:
        start = [f"init={args.init}"]
    else:  # a fresh flow policy reading LIBERO's 8-D state
        tiny = [f"policy.{k}={v}".replace(" ", "") for k, v in TINY_POLICY.items()] if args.tiny else []
        start = ["policy=flow", "policy.state_dim=8", *tiny]
    if args.tiny:
        size = ["num_envs=2", "image_size=32", "iterations=1", "chunks_per_iter=2", "max_episode_steps=8"]
        size += ["algo.minibatch_size=4"]
    else:
        size = [f"num_envs={args.num_envs}", f"image_size={args.image_size}", f"iterations={args.iterations}"]
    command = [str(BIN / "embodied-train"), *start, "algo=flow_sde", f"suite={args.suite}", f"tasks=[{args.task}]"]
    subprocess.run([*command, *size, f"out={args.out}", *args.overrides], check=True)

    rows = list(csv.DictReader(open(Path(args.out) / "metrics.csv")))
    for row in rows[-3:]:
        print(
            f"iteration {row['iteration']}: {row['env_steps']} env steps, success rate {float(row['success_rate']):.2f}"
        )
    print(f"the policy: {args.out}/checkpoint/policy; score it in LIBERO's own env with")
    print(f"  embodied-eval checkpoint={args.out}/checkpoint/policy suite={args.suite} simulator=robosuite out=...")


if __name__ == "__main__":
    main()
