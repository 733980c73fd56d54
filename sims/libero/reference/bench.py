"""Speed of the reference LIBERO env on this machine (``embodied-bench bench=libero`` runs this).

    python -m reference.bench --suite libero_spatial --task 0 --image-sizes 128 256 --steps 20 --resets 3

Per case (two cameras at each image size, and no rendering): env steps per second over ``steps``
steps of random actions after a reset (the median of ``repeats`` runs); and the seconds a reset
takes with ``hard_reset`` (robosuite's default: the model is rebuilt) and without. With
``--chunk-sizes``, each camera case also runs with the camera observables off and the two views
drawn directly only at every H-th step (a chunked policy's loop that renders only at chunk
boundaries; openpi's and RLinf's LIBERO loops render every step). Prints one JSON line ``RESULT {...}``.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from .env import ReferenceTask


def steps_per_s(task: ReferenceTask, steps: int, rng: np.random.Generator, chunk: int = 0) -> float:
    """Steps/s of random actions; ``chunk`` > 0: the camera observables off and both views drawn at
    every ``chunk``-th step only."""
    task.reset(0, wait_steps=0)
    if chunk:
        task.camera_observables(False)
    try:
        t0 = time.perf_counter()
        for i in range(steps):
            task.step(rng.uniform(-1, 1, 7))
            if chunk and (i + 1) % chunk == 0:
                task.render_views()
        return steps / (time.perf_counter() - t0)
    finally:
        if chunk:
            task.camera_observables(True)


def reset_s(task: ReferenceTask, resets: int) -> list[float]:
    out = []
    for i in range(resets):
        t0 = time.perf_counter()
        task.reset(i % len(task.init_states), wait_steps=0)
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--suite", default="libero_spatial")
    p.add_argument("--task", type=int, default=0)
    p.add_argument("--image-sizes", type=int, nargs="*", default=[128, 256])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--resets", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--chunk-sizes", type=int, nargs="*", default=[], help="also time rendering only at every H-th step, for each H"
    )
    args = p.parse_args()
    rng = np.random.default_rng(args.seed)
    cases = []
    for size in [*args.image_sizes, 0]:
        t0 = time.perf_counter()
        with ReferenceTask(args.suite, args.task, image_size=size) as task:
            build_s = time.perf_counter() - t0
            runs = [steps_per_s(task, args.steps, rng) for _ in range(args.repeats)]
            soft = reset_s(task, args.resets)
            chunked = {
                h: [steps_per_s(task, args.steps, rng, chunk=h) for _ in range(args.repeats)]
                for h in (args.chunk_sizes if size else [])
            }
        cases.append(
            {
                "case": f"two cameras {size} px" if size else "no rendering",
                "image_size": size,
                "build_s": round(build_s, 2),
                "steps_per_s_runs": [round(r, 3) for r in runs],
                "steps_per_s": round(float(np.median(runs)), 3),
                "soft_reset_s": round(float(np.median(soft)), 3),
            }
        )
        if chunked:
            cases[-1]["chunk_boundary_steps_per_s"] = {
                str(h): round(float(np.median(r)), 3) for h, r in chunked.items()
            }
        print(
            f"[libero bench] {cases[-1]['case']}: {cases[-1]['steps_per_s']:.2f} steps/s"
            + "".join(f", rendering every {h}th step {np.median(r):.2f}" for h, r in chunked.items()),
            flush=True,
        )
    with ReferenceTask(
        args.suite, args.task, image_size=args.image_sizes[0] if args.image_sizes else 0, hard_reset=True
    ) as task:
        hard = reset_s(task, args.resets)
    print(
        "RESULT "
        + json.dumps(
            {
                "suite": args.suite,
                "task": args.task,
                "name": task.name,
                "steps": args.steps,
                "repeats": args.repeats,
                "cases": cases,
                "hard_reset_s": round(float(np.median(hard)), 3),
                "hard_reset_runs": [round(h, 3) for h in hard],
            }
        )
    )


if __name__ == "__main__":
    main()
