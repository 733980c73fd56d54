"""How much of one policy-gradient step is signal? Every chunk's gradient of one RL batch, taken apart.

    .venv/bin/python benchmarks/gradient_signal.py --checkpoint RUN/rl/checkpoint/policy \\
        --suite spatial --tasks 1 8 --num-envs 40 --chunks 16 --protocol --out runs/gradient_signal

Samples one batch as an RL iteration does, after ``--warmup`` chunks per env (RL keeps episodes running
across iterations: a batch right after a reset holds no late episode steps) (``collect_chunks`` with the
policy's exploring sampler, chunk
GAE from its value head with ``truncation=fail``, advantages normalised), then takes each chunk's
gradient of its PPO surrogate at ratio 1, ``-A_i * logprob_i``, with respect to the weights RL trains
(the action expert and heads; the observation encoder frozen, as by default). From the per-chunk
gradients ``g_i`` of the ``n`` chunks:

- ``noise_scale``: ``tr(Sigma) / |G|^2``, the batch size at which a mean gradient's noise equals its
  signal (``tr(Sigma)`` the per-chunk variance, ``|G|^2`` the unbiased squared norm of the mean);
- ``effective_chunks``: ``(sum |g_i|)^2 / sum |g_i|^2`` (``n`` when every chunk pulls as hard);
- ``top_share``: the share of ``sum |g_i|^2`` carried by the largest 1% and 10% of the chunks;
- ``halves_cosine``: the cosine between the mean gradients of two disjoint random halves;
- for Flow-SDE chunks, the median gradient norm and its share of ``sum |g_i|^2`` by the denoising step
  that was sampled stochastically (its noise level differs by step).

Writes ``OUT/gradient_signal.json``. One batch: run it on several checkpoints or seeds before reading a
difference.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch


def signal_summary(grads: torch.Tensor, generator: torch.Generator | None = None) -> dict[str, float]:
    """The statistics of the module docstring from per-chunk gradients ``grads [n, P]`` (n >= 4)."""
    n = grads.shape[0]
    if n < 4:
        raise ValueError(f"need at least 4 chunk gradients, got {n}")
    sq = (grads * grads).sum(1)  # |g_i|^2 [n]
    signal, trace = unbiased_signal(grads)
    norms = sq.sqrt()
    ordered = torch.sort(sq, descending=True).values
    top = {
        f"top_share_{int(p * 100)}pct": float(ordered[: max(1, int(round(p * n)))].sum() / sq.sum())
        for p in (0.01, 0.1)
    }
    perm = torch.randperm(n, generator=generator)
    a, b = grads[perm[: n // 2]].mean(0), grads[perm[n // 2 : 2 * (n // 2)]].mean(0)
    return {
        "chunks": n,
        "noise_scale": trace / signal if signal > 0 else float("inf"),
        "signal_sq_norm": signal,
        "trace_sigma": trace,
        "effective_chunks": float(norms.sum() ** 2 / sq.sum()),
        "norm_median": float(norms.median()),
        "norm_max": float(norms.max()),
        **top,
        "halves_cosine": float(torch.nn.functional.cosine_similarity(a, b, dim=0)),
    }


def unbiased_signal(grads: torch.Tensor) -> tuple[float, float]:
    """``(|G|^2, tr(Sigma))`` of the chunks' mean gradient: the squared norm of the mean less its
    expected noise ``tr(Sigma) / n`` (negative when the signal is below what n chunks can measure)."""
    n = grads.shape[0]
    sq = (grads * grads).sum(1)
    mean = grads.mean(0)
    trace = float((sq.sum() - n * (mean * mean).sum()) / (n - 1))
    return float((mean * mean).sum()) - trace / n, trace


def by_step(grads: torch.Tensor, steps: torch.Tensor) -> dict[str, dict[str, float]]:
    """Per stochastic denoising step ``k``: chunks, median gradient norm, share of ``sum |g_i|^2``, and the
    unbiased ``|G_k|^2`` and ``tr(Sigma_k)`` of those chunks alone (where there are 4 or more)."""
    sq = (grads * grads).sum(1)
    out = {}
    for k in sorted(int(s) for s in steps.unique()):
        mine = steps == k
        out[str(k)] = {
            "chunks": int(mine.sum()),
            "norm_median": float(sq[mine].sqrt().median()),
            "share": float(sq[mine].sum() / sq.sum()),
        }
        if int(mine.sum()) >= 4:
            out[str(k)]["signal_sq_norm"], out[str(k)]["trace_sigma"] = unbiased_signal(grads[mine])
    return out


def chunk_gradients(
    policy: Any, rollout: Any, advantages: torch.Tensor, params: list[torch.nn.Parameter]
) -> torch.Tensor:
    """``[n, P]``: each chunk's gradient of ``-A_i * logprob_i`` over ``params``, one chunk at a time."""
    rows = []
    for i in range(advantages.shape[0]):
        index = torch.tensor([i])
        logprob, _, _ = policy.logprob(rollout.policy_obs(index), rollout.flat_extras(index))
        loss = -(advantages[i] * logprob).sum()
        got = torch.autograd.grad(loss, params, allow_unused=True)
        rows.append(torch.cat([(g if g is not None else torch.zeros_like(p)).flatten() for g, p in zip(got, params)]))
    return torch.stack(rows)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", required=True, help="a policy checkpoint folder (RUN/rl/checkpoint/policy)")
    ap.add_argument("--suite", default="spatial")
    ap.add_argument("--tasks", type=int, nargs="+", required=True)
    ap.add_argument("--num-envs", type=int, default=40)
    ap.add_argument("--chunks", type=int, default=16, help="chunks per env (RL's chunks_per_iter)")
    ap.add_argument("--warmup", type=int, default=16, help="chunks per env sampled first and not scored")
    ap.add_argument("--max-steps", type=int, default=120, help="the training step limit per episode")
    ap.add_argument(
        "--protocol", action="store_true", help="start from the protocol's initial states (rl.init_states=protocol)"
    )
    ap.add_argument(
        "--sde-steps",
        type=int,
        default=None,
        help="Flow-SDE: draw the stochastic step from the first N denoising steps (algo.sde_steps)",
    )
    ap.add_argument("--gamma", type=float, default=0.99)
    ap.add_argument("--lam", type=float, default=0.95)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.num_envs < 1 or args.chunks < 1 or args.num_envs * args.chunks < 4 or args.warmup < 0:
        ap.error("--num-envs and --chunks must be at least 1 and give at least 4 chunks; --warmup at least 0")

    import policies
    import sims
    from embodied.algorithms.batch import ppo_batch
    from embodied.algorithms.params import split_parameters
    from embodied.algorithms.rollout import collect_chunks
    from policies.errors import CheckpointError
    from sims.protocol import NUM_INIT_STATES

    try:
        policy = policies.load(args.checkpoint, device="cpu")
    except CheckpointError as e:
        ap.error(f"--checkpoint: {e}")
    try:
        specs = sims.suites.tasks(args.suite)  # ours or a real LIBERO suite (its exported scenes)
    except ValueError as e:
        ap.error(f"--suite: {e}")
    if any(not 0 <= t < len(specs) for t in args.tasks):
        ap.error(f"--tasks: {args.suite!r} has tasks 0..{len(specs) - 1}, got {args.tasks}")
    if args.sde_steps is not None:
        try:
            policy.config.sde_steps = args.sde_steps
            policy.config.__post_init__()
        except (AttributeError, ValueError) as e:
            ap.error(f"--sde-steps: {e}")
    actor, _ = split_parameters(policy, freeze_prefix=True)
    torch.manual_seed(args.seed)
    env = sims.make(
        sims.suites.backend(args.suite),
        suite=args.suite,
        num_envs=args.num_envs,
        seed=args.seed,
        cameras=tuple(policy.config.cameras),
        image_size=int(getattr(policy.config, "image_size", 64)),
        max_steps=args.max_steps,
        state_obs=policy.config.state_obs,
    )
    try:
        if args.protocol:
            env.set_init_pool(range(NUM_INIT_STATES))
        obs = env.reset(seed=args.seed, task_ids=[args.tasks[i % len(args.tasks)] for i in range(args.num_envs)])
        policy.eval()
        gen = torch.Generator().manual_seed(args.seed)
        if args.warmup:
            _, obs = collect_chunks(env, policy, obs, args.warmup, generator=gen)
        rollout, _ = collect_chunks(env, policy, obs, args.chunks, generator=gen)
    finally:
        env.close()
    batch = ppo_batch(rollout, args.gamma, args.lam, normalize=True, truncation="fail")
    print(
        f"sampled {batch['advantages'].shape[0]} chunks, {len(rollout.episode_success)} episodes ended "
        f"({float(np.mean(rollout.episode_success)) if rollout.episode_success else float('nan'):.2f} success); "
        f"gradients of {sum(p.numel() for p in actor):,} weights, chunk by chunk",
        flush=True,
    )
    grads = chunk_gradients(policy, rollout, batch["advantages"], actor)
    ended = rollout.episode_success
    summary: dict[str, Any] = {
        "checkpoint": str(args.checkpoint),
        "suite": args.suite,
        "tasks": args.tasks,
        "num_envs": args.num_envs,
        "chunks_per_env": args.chunks,
        "warmup": args.warmup,
        "protocol": args.protocol,
        "seed": args.seed,
        "sde_steps": args.sde_steps,
        "episodes_ended": len(ended),
        "episode_success": float(np.mean(ended)) if ended else None,
        **signal_summary(grads, torch.Generator().manual_seed(args.seed)),
    }
    steps = rollout.flat_extras(torch.arange(grads.shape[0])).get("step")
    if steps is not None:
        summary["by_step"] = by_step(grads, steps)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gradient_signal.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: v for k, v in summary.items() if k != "by_step"}, indent=1))
    for k, v in summary.get("by_step", {}).items():
        nan = float("nan")
        print(
            f"stochastic step {k}: {v['chunks']} chunks, median |g| {v['norm_median']:.3g}, share of sum |g|^2 "
            f"{v['share']:.2f}, |G|^2 {v.get('signal_sq_norm', nan):.3g}, tr(Sigma) {v.get('trace_sigma', nan):.3g}"
        )
    print(f"wrote {out / 'gradient_signal.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
