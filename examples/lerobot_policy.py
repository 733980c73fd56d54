"""Bring a LeRobot policy (pi0, pi0.5, SmolVLA): load its checkpoint folder and run it in our simulator.

What it shows: a folder LeRobot's ``save_pretrained`` wrote loads with ``policies.load`` (LeRobot's own
model class inside, its cameras renamed to ours), acts in ``sims.make`` envs through the contract of our
own families (``policy.sample`` -> a chunk ``[N, H, A]``, ``env.step_chunk``) and saves as our bundle,
which every command takes (``embodied-serve``, ``embodied-eval``, ``embodied-train init=...``;
``embodied-sft init=FOLDER`` fine-tunes the folder itself). Runs in ``.venv-lerobot``.

    .venv-lerobot/bin/python examples/lerobot_policy.py --checkpoint ckpts/pi0_goal --cameras agentview wrist --out runs/ex_lr
    .venv-lerobot/bin/python examples/lerobot_policy.py --tiny pi0 --out /tmp/ex_lerobot   # tiny, random weights

``--tiny FAMILY`` first writes a tiny randomly initialised checkpoint in LeRobot's format (its made-up
tokenizer beside it), as the tests build them offline. Nothing is downloaded: copy a real checkpoint and
its tokenizer over first (docs/guide/pretrained-vlas.md). A LIBERO fine-tune: score the saved bundle with
``embodied-eval checkpoint=OUT/bundle suite=libero_spatial simulator=robosuite``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import policies
import sims
from policies.io import env_inputs, task_instructions


def tiny_lerobot_checkpoint(family: str, out: Path) -> Path:
    """A tiny ``family`` policy with random weights, written in LeRobot's format under ``out``."""
    from policies.lerobot.tiny import tiny_config

    torch.manual_seed(0)
    policy = policies.make(family, **tiny_config(family, out / "tokenizer"))
    return policies.lerobot.export_lerobot(policy, out / f"{family}_lerobot")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", help="a LeRobot checkpoint folder (config.json + model.safetensors)")
    p.add_argument("--cameras", nargs="*", help="our names of its cameras, in its order (default: its own)")
    p.add_argument("--suite", default="goal", help="one of our suites (sims.suites.all_names())")
    p.add_argument("--task", type=int, default=2)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--max-chunks", type=int, default=100, help="action chunks of the episode at most")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", choices=("pi0", "pi05", "smolvla"), help="test size: a tiny random checkpoint")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if not args.checkpoint and not args.tiny:
        p.error("give --checkpoint FOLDER (or --tiny FAMILY)")
    out = Path(args.out)
    folder = args.checkpoint or tiny_lerobot_checkpoint(args.tiny, out)
    size, max_chunks = (32, 2) if args.tiny else (args.image_size, args.max_chunks)

    policy = policies.load(folder, device=args.device, cameras=args.cameras)
    c = policy.config
    print(f"{policy.family}: cameras {c.cameras}, state [{c.state_dim}], chunk [{c.chunk_size}, {c.action_dim}]")
    with sims.make("mujoco", suite=args.suite, num_envs=1, cameras=tuple(c.cameras), image_size=size) as env:
        obs, texts = env.reset(task_ids=[args.task]), task_instructions(env)
        print(f"{args.suite} task {args.task}: {texts[args.task]!r}")
        for chunks in range(1, max_chunks + 1):
            with torch.no_grad():
                chunk = policy.sample(env_inputs(obs, texts), mode="greedy").actions  # [1, H, A]
            result = env.step_chunk(chunk.cpu())
            obs = result.obs
            if bool(result.terminated[0] | result.truncated[0]):
                break
        print(f"after {chunks} chunks: {'success' if bool(result.success[0]) else 'no success'}")
    policies.save(policy, out / "bundle")
    print(f"our bundle: {out / 'bundle'}")


if __name__ == "__main__":
    main()
