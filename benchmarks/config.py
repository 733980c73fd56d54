"""Typed schemas of ``embodied-bench`` (see :mod:`benchmarks.cli`).

The top-level schema :class:`BenchConfig` (ConfigStore name ``bench_schema``) holds the keys every
benchmark shares; each benchmark extends it with its own keys in a subclass stored at the root of
the ConfigStore as ``bench_<name>_schema``. ``configs/bench.yaml`` selects one option of the config
group ``bench`` (``configs/bench/<name>.yaml``, package ``_global_``), which pulls in that subclass,
so the benchmark's keys are top-level overrides: ``embodied-bench bench=sim out=DIR num_envs=[1,8]``.
An unknown key or a value of the wrong type fails before anything runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING

from embodied.config import store


class BenchError(ValueError):
    """A configuration a benchmark cannot run; ``embodied-bench`` prints it without a traceback."""


@dataclass
class BenchConfig:
    """Keys shared by every benchmark (``configs/bench.yaml``)."""

    out: str = MISSING  # run folder: <bench>.json, <bench>.csv and Hydra's .hydra/ go here
    seed: int = 0  # seeds the random actions and the envs' streams
    device: str = "cpu"  # where the env returns tensors


@dataclass
class SimBenchConfig(BenchConfig):
    """``bench=sim``: our batched MuJoCo env against the raw library on the same physics.

    Every case (num_envs N x thread count T) times, interleaved inside each repeat: our env
    without cameras, ``mujoco.batch.Batch`` and ``mujoco.rollout`` stepping the env's compiled
    model with the same substeps and threads, and our env rendering ``cameras``.
    """

    task: str = "pick_cube"  # a stand-alone task of the mujoco backend
    num_envs: list[int] = field(default_factory=lambda: [1, 8, 64])  # batch sizes N
    num_threads: list[int] = field(default_factory=lambda: [1, 2])  # MuJoCo C threads T
    cameras: list[str] = field(default_factory=lambda: ["agentview", "wrist"])  # [] skips rendering
    image_size: int = 128  # square camera images (pixels)
    rollout: bool = True  # also time mujoco.rollout as a second raw baseline
    repeats: int = 7  # timed repeats per case; medians are quoted
    # Control steps per timed repeat. Unset: state_env_steps // N without cameras and
    # rgb_env_steps // N with them, clamped to [min_steps, max_steps]; set: that many everywhere.
    steps: int | None = None
    state_env_steps: int = 1600  # env-steps (control steps x N) per repeat, state-only cases
    rgb_env_steps: int = 160  # env-steps per repeat, rendering cases
    min_steps: int = 5
    max_steps: int = 2000
    warmup_steps: int = 5  # untimed control steps per variant before the first repeat
    # Targets reported as booleans in sim.json (never asserted by tests).
    target_env_vs_raw: float = 0.85  # our env / raw Batch, state-only, every N and T
    target_thread_scaling: float = 1.7  # env-steps/s at 2 threads / 1 thread, state-only, N >= 8
    # GPU backends (benchmarks/sim_gpu.py), run only when listed: mujoco_gpu, maniskill
    gpu_backends: list[str] = field(default_factory=list)
    gpu_num_envs: list[int] = field(default_factory=lambda: [256, 1024, 4096, 8192])
    gpu_image_size: int = 128
    gpu_renderer: str = "auto"  # mujoco_gpu camera rows: auto (warp on cuda, else gl) | gl | warp
    # mujoco_gpu rows per task-logic placement: device (torch on the Warp device) | host (numpy mirrors)
    gpu_task_logic: list[str] = field(default_factory=lambda: ["device", "host"])
    gpu_steps: int = 50  # control steps per timed repeat
    gpu_repeats: int = 3


@dataclass
class ExpertsBenchConfig(BenchConfig):
    """``bench=experts``: each scripted expert on the fixed evaluation initial states of every task."""

    suites: list[str] = field(default_factory=list)  # [] = every suite
    init_states: int = 50  # evaluation initial states per task (the protocol's 50)
    num_envs: int = 50  # parallel envs (one wave per task with the default)
    num_threads: int = 0  # MuJoCo C threads; 0 = all cores
    target_success: float = 0.95  # every task must reach this; reported, never asserted by tests


def register() -> None:
    """Store the schemas in Hydra's ConfigStore (idempotent)."""
    store("bench_schema", BenchConfig)
    store("bench_sim_schema", SimBenchConfig)
    store("bench_experts_schema", ExpertsBenchConfig)
    from benchmarks.policy import PolicyBenchConfig

    store("bench_policy_schema", PolicyBenchConfig)
    from benchmarks.train import TrainBenchConfig

    store("bench_train_schema", TrainBenchConfig)
    from benchmarks.latency import LatencyBenchConfig

    store("bench_latency_schema", LatencyBenchConfig)
    from benchmarks.serve import ServeBenchConfig

    store("bench_serve_schema", ServeBenchConfig)
