"""Simulation benchmark (``embodied-bench bench=sim``): our batched env against raw MuJoCo.

What one run measures, for every batch size N in ``num_envs`` and thread count T in
``num_threads`` (a *case*):

- ``env_state``: ``MujocoVecEnv.step`` without cameras, random actions in [-1, 1] from a
  seeded generator: controller, ``Batch.step(nstep=substeps, stage=mjSTAGE_POS)``, success,
  reward, divergence checks, observations, automatic resets: everything a learner pays for;
- ``raw_batch``: ``mujoco.batch.Batch`` over the *same compiled model* (``env.model``), N
  simulations, T threads, one ``step(nstep=substeps, stage=mjSTAGE_POS)`` per control step,
  constant controls equal to the env's servo targets after reset (a valid posture), no
  controller and no observations: the same physics work done by the library alone;
- ``raw_rollout``: ``mujoco.rollout.Rollout`` (T threads; 0 pool threads for T=1, so it runs
  on the caller's thread as Batch does) advancing the same states by ``substeps`` per call with
  the same constant controls, each call starting from the previous call's last state
  (``skip_checks=True``, preallocated outputs: the library's fastest path);
- ``env_rgb``: our env with ``cameras`` rendered at ``image_size`` (skipped with ``cameras=[]``).

Then the RL workload (:mod:`benchmarks.chunk_render`, skipped with ``workload_suites=[]``): for each
suite of ``workload_suites``, ``step_chunk`` with the two views at ``image_size``, ``workload_num_envs``
x ``workload_chunk_sizes``, rendering on demand against rendering every step of the same chunks
(``rl_workload`` in ``sim.json``).

The variants of a case, and the thread counts of one N, are interleaved inside every repeat,
so slow drifts of the machine hit them alike; each repeat times ``steps`` control steps after
an untimed warm-up with ``time.perf_counter``. Rates are env-steps/s (control steps x N per
second); physics steps/s = env-steps/s x substeps. Medians over repeats are quoted; a ratio is
the median of the per-repeat ratios of paired measurements (same repeat), which cancels
machine noise better than a ratio of medians.

Diagnostics beside the rates:
- ``time_split`` of our env: the env's ``Batch.step`` and renderer are wrapped with timers, so
  each step splits into physics, rendering and overhead (controller, input checks, success and
  divergence checks, observations, auto-resets, tensor conversions), with the overhead in ms
  per control step and the env-steps/s of the physics inside the env. The latter differs from
  ``raw_batch`` by the physics *content*: the env's arm moves under random actions and its
  episodes reset, the raw baseline holds still (a few % cheaper per step on this scene);
- ``cpu_util`` (process CPU seconds / wall seconds, ~T when the threads really run in
  parallel) and ``other_cores_avg`` (cores other processes used meanwhile, from
  ``/proc/stat``): on a shared machine the 2-thread figures are only meaningful when the
  latter is near 0, and the table warns when it is not.

Targets (booleans in ``sim.json``, never asserted by tests): ``env_state / raw_batch >=
target_env_vs_raw`` for every N (at every T), and ``env_state`` at 2 threads ``>=
target_thread_scaling`` x at 1 thread for every N >= 8. The env clamps T to N, so a requested
thread count that gives the same effective count as an earlier one is not measured twice.

Outputs: ``<out>/sim.json`` (config, machine, model sizes, per-case samples and medians,
ratios, thread scaling, targets) and ``<out>/sim.csv`` (one row per case and variant), and a
table on stdout.
"""

from __future__ import annotations

import csv
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

import sims
from benchmarks.config import BenchConfig, BenchError
from embodied.runs import machine_info, write_json
from policies.files import atomic_path

# mujoco is imported inside the raw runners, never here: the process's OpenGL platform is fixed
# when mujoco is first imported, and sims.mujoco (imported by validate() and by every env) must
# choose it first. Importing this module for its SCHEMA chooses nothing.


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
    # The RL workload (benchmarks/chunk_render.py): step_chunk on these suites with the two views at
    # image_size, rendering on demand against every step; [] skips it
    workload_suites: list[str] = field(default_factory=lambda: ["goal", "spatial"])
    workload_num_envs: list[int] = field(default_factory=lambda: [8, 32])
    workload_chunk_sizes: list[int] = field(default_factory=lambda: [5, 10])
    workload_control_steps: int = 40  # control steps per timed repeat (whole chunks)
    workload_repeats: int = 3


SCHEMA = SimBenchConfig

VARIANTS = ("env_state", "raw_batch", "raw_rollout", "env_rgb")
CSV_FIELDS = (
    "num_envs",
    "threads",
    "variant",
    "cameras",
    "image_size",
    "substeps",
    "control_steps",
    "repeats",
    "env_steps_per_s_median",
    "env_steps_per_s_min",
    "env_steps_per_s_max",
    "physics_steps_per_s_median",
    "frames_per_s_median",
    "ratio_vs_raw_batch",
    "speedup_vs_1_thread",
    "cpu_util",
    "physics_frac",
    "render_frac",
    "overhead_ms_per_step",
)


# ---------------------------------------------------------------------------- the timed things
class _Runner:
    """One variant of one case: ``step(k)`` advances all N envs by one control step."""

    name: str
    steps: int
    physics_s = 0.0  # seconds inside Batch.step during the current repeat (our env only)
    render_s = 0.0  # seconds inside the renderer during the current repeat (our env only)

    def prepare(self, repeat: int) -> None:  # untimed, before each timed repeat
        self.physics_s = self.render_s = 0.0

    def step(self, k: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class _EnvRunner(_Runner):
    """Our ``MujocoVecEnv.step`` with seeded random actions in [-1, 1].

    The env's ``Batch.step`` and renderer are wrapped with timers (two ``perf_counter`` calls
    each, well under a microsecond) so a step's time splits into physics, rendering and the
    rest: the env's own overhead (controller, checks, observations, resets, tensors).
    """

    def __init__(self, env: Any, name: str, steps: int, seed: int):
        self.env, self.name, self.steps = env, name, steps
        self._gen = torch.Generator().manual_seed(seed)
        self._actions = torch.empty(0)
        self._wrapped: list[tuple[Any, str]] = []
        self._wrap(env.sim, "step", "physics_s")
        renderer = getattr(env, "_renderer", None)
        if renderer is not None:
            self._wrap(renderer, "render", "render_s")

    def _wrap(self, obj: Any, method: str, counter: str) -> None:
        inner = getattr(obj, method)
        clock = time.perf_counter

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = clock()
            try:
                return inner(*args, **kwargs)
            finally:
                setattr(self, counter, getattr(self, counter) + clock() - t0)

        setattr(obj, method, timed)  # an instance attribute shadowing the method
        self._wrapped.append((obj, method))

    def prepare(self, repeat: int) -> None:
        super().prepare(repeat)
        n, a = self.env.num_envs, self.env.action_spec.shape[0]
        acts = torch.rand(self.steps, n, a, generator=self._gen) * 2.0 - 1.0
        self._actions = acts.to(self.env.device)

    def step(self, k: int) -> None:
        self.env.step(self._actions[k])

    def close(self) -> None:
        for obj, method in self._wrapped:
            obj.__dict__.pop(method, None)
        self.env.close()


class _BatchRunner(_Runner):
    """``mujoco.batch.Batch`` on the env's model: same N, substeps, threads, stage."""

    name = "raw_batch"

    def __init__(self, env: Any, steps: int):
        import mujoco
        from mujoco import batch as mjbatch

        self.steps = steps
        self.substeps = env.substeps
        self.sim = mjbatch.Batch(env.model, env.num_envs, nthread=env.num_threads)
        # The env's state rows right after reset: qpos, qvel, warm start and ctrl (the servo
        # targets of the initial posture, a valid position held constant from now on).
        self.sim.state[:] = env.sim.state
        self._stage = mujoco.mjtStage.mjSTAGE_POS

    def step(self, k: int) -> None:
        self.sim.step(None, nstep=self.substeps, stage=self._stage)


class _RolloutRunner(_Runner):
    """``mujoco.rollout`` on the env's model, ``substeps`` per call, chained calls."""

    name = "raw_rollout"

    def __init__(self, env: Any, steps: int):
        import mujoco
        from mujoco import rollout as mjrollout

        m, n, threads = env.model, env.num_envs, env.num_threads
        self.steps, self.substeps = steps, env.substeps
        self._pool = mjrollout.Rollout(nthread=threads if threads > 1 else 0)
        self._models = [m] * n
        self._datas = [mujoco.MjData(m) for _ in range(threads)]
        spec = mujoco.mjtState.mjSTATE_FULLPHYSICS
        nstate = mujoco.mj_stateSize(m, spec)
        self._state0 = np.empty((n, nstate))
        data = mujoco.MjData(m)
        for i in range(n):  # set-up only, not timed
            env.sim.get_data(i, data)
            mujoco.mj_getState(m, data, self._state0[i], spec)
        ctrl = np.asarray(env.ctrl, dtype=np.float64)[:, None, :]
        self._control = np.ascontiguousarray(np.broadcast_to(ctrl, (n, self.substeps, m.nu)))
        self._out = np.empty((n, self.substeps, nstate))
        self._sensor = np.empty((n, self.substeps, m.nsensordata))

    def step(self, k: int) -> None:
        self._pool.rollout(
            self._models,
            self._datas,
            self._state0,
            self._control,
            skip_checks=True,
            nstep=self.substeps,
            state=self._out,
            sensordata=self._sensor,
        )
        self._state0[:] = self._out[:, -1]

    def close(self) -> None:
        self._pool.close()


def _time_steps(runner: _Runner, steps: int) -> tuple[float, float]:
    """Wall seconds (``time.perf_counter``) and process CPU seconds of ``steps`` control steps."""
    step = runner.step
    c0 = time.process_time()
    t0 = time.perf_counter()
    for k in range(steps):
        step(k)
    wall = time.perf_counter() - t0
    return wall, time.process_time() - c0


def _machine_cpu() -> tuple[float, float] | None:
    """(busy CPU seconds of the whole machine, CPU seconds of this process), or None off Linux."""
    try:
        with open("/proc/stat") as fh:
            fields = [int(x) for x in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal (guest time is included in user)
    busy = sum(fields[:8]) - fields[3] - fields[4]
    t = os.times()
    return busy / os.sysconf("SC_CLK_TCK"), t.user + t.system


# ---------------------------------------------------------------------------- configuration
def control_steps(cfg: SimBenchConfig, num_envs: int, rgb: bool) -> int:
    """Control steps per timed repeat of a case (see ``SimBenchConfig.steps``)."""
    if cfg.steps is not None:
        return int(cfg.steps)
    budget = cfg.rgb_env_steps if rgb else cfg.state_env_steps
    return int(min(max(budget // num_envs, cfg.min_steps), cfg.max_steps))


def validate(cfg: SimBenchConfig) -> None:
    """Raise :class:`BenchError` for values the benchmark cannot run."""
    from sims.mujoco.scene import CAMERAS
    from sims.mujoco.tasks import task_names

    def positive_list(name: str, values: list[int]) -> None:
        if not values or any(int(v) < 1 for v in values):
            raise BenchError(f"{name} must be a non-empty list of integers >= 1, got {list(values)}")

    bad_gpu = [b for b in cfg.gpu_backends if b not in ("mujoco_gpu", "maniskill")]
    if bad_gpu:
        raise BenchError(f"gpu_backends must name mujoco_gpu and/or maniskill, got {bad_gpu}")
    if cfg.gpu_backends:
        positive_list("gpu_num_envs", cfg.gpu_num_envs)
        if not cfg.gpu_task_logic or any(v not in ("device", "host") for v in cfg.gpu_task_logic):
            raise BenchError(
                f"gpu_task_logic must be a non-empty list of device and/or host, got {list(cfg.gpu_task_logic)}"
            )

    positive_list("num_envs", cfg.num_envs)
    positive_list("num_threads", cfg.num_threads)
    for name in ("repeats", "image_size", "min_steps", "max_steps"):
        if getattr(cfg, name) < 1:
            raise BenchError(f"{name} must be >= 1, got {getattr(cfg, name)}")
    if cfg.steps is not None and cfg.steps < 1:
        raise BenchError(f"steps must be >= 1 (or unset), got {cfg.steps}")
    if cfg.warmup_steps < 0:
        raise BenchError(f"warmup_steps must be >= 0, got {cfg.warmup_steps}")
    if cfg.min_steps > cfg.max_steps:
        raise BenchError(f"min_steps ({cfg.min_steps}) > max_steps ({cfg.max_steps})")
    unknown = [c for c in cfg.cameras if c not in CAMERAS]
    if unknown:
        raise BenchError(f"unknown camera(s) {unknown}; available: {list(CAMERAS)}")
    if cfg.task not in task_names():
        raise BenchError(f"unknown task {cfg.task!r}; available: {task_names()}")
    if cfg.workload_suites:
        mujoco_suites = [s for s in sims.suites.names() if not sims.suites.is_libero(s)]
        bad = [s for s in cfg.workload_suites if s not in mujoco_suites]
        if bad:
            raise BenchError(
                f"workload_suites must name our MuJoCo suites {mujoco_suites}, got {bad} (real LIBERO's "
                "workload is in bench=libero)"
            )
        positive_list("workload_num_envs", cfg.workload_num_envs)
        positive_list("workload_chunk_sizes", cfg.workload_chunk_sizes)
        positive_list("workload_control_steps / workload_repeats", [cfg.workload_control_steps, cfg.workload_repeats])


# ---------------------------------------------------------------------------- results
@dataclass
class _Series:
    """Timed samples (env-steps/s, one per repeat) of one variant of one case."""

    variant: str
    num_envs: int
    threads: int
    steps: int
    samples: list[float] = field(default_factory=list)
    cpu_util: list[float] = field(default_factory=list)  # process CPU s / wall s per repeat
    physics_frac: list[float] = field(default_factory=list)  # share of wall inside Batch.step
    render_frac: list[float] = field(default_factory=list)  # share of wall inside the renderer
    overhead_ms: list[float] = field(default_factory=list)  # the rest, ms per control step
    build_s: float | None = None

    def add(self, runner: _Runner, wall: float, cpu: float) -> None:
        self.samples.append(runner.steps * self.num_envs / wall)
        self.cpu_util.append(cpu / wall)
        if isinstance(runner, _EnvRunner):
            self.physics_frac.append(runner.physics_s / wall)
            self.render_frac.append(runner.render_s / wall)
            rest = wall - runner.physics_s - runner.render_s
            self.overhead_ms.append(1e3 * rest / runner.steps)

    def summary(self, substeps: int, views: int) -> dict[str, Any]:
        med = statistics.median(self.samples)
        out: dict[str, Any] = {
            "control_steps": self.steps,
            "env_steps_per_s": {
                "median": med,
                "min": min(self.samples),
                "max": max(self.samples),
                "samples": list(self.samples),
            },
            "physics_steps_per_s": med * substeps,
            "cpu_util": statistics.median(self.cpu_util),
        }
        if self.physics_frac:
            # Where our env's time goes: physics (inside Batch.step), rendering, and the env's
            # own overhead (controller, checks, observations, resets, tensors) per control step.
            pf = statistics.median(self.physics_frac)
            out["time_split"] = {
                "physics_frac": pf,
                "render_frac": statistics.median(self.render_frac),
                "overhead_frac": statistics.median(1.0 - p - r for p, r in zip(self.physics_frac, self.render_frac)),
                "overhead_ms_per_step": statistics.median(self.overhead_ms),
                # env-steps/s of the physics alone inside our env (compare with raw_batch: the
                # gap is the physics content, arm motion and resets, not Python overhead)
                "inner_physics_env_steps_per_s": statistics.median(
                    s / p for s, p in zip(self.samples, self.physics_frac) if p > 0
                ),
            }
        if self.variant == "env_rgb":
            out["frames_per_s"] = med * views
        if self.build_s is not None:
            out["build_s"] = self.build_s
        return out


def _paired_ratio(num: _Series | None, den: _Series | None) -> float | None:
    """Median over repeats of num/den measured in the same repeat."""
    if num is None or den is None:
        return None
    return statistics.median(a / b for a, b in zip(num.samples, den.samples))


def _fmt(x: float | None, spec: str = ".0f") -> str:
    return "-" if x is None else format(x, spec)


# ---------------------------------------------------------------------------- the benchmark
def run(cfg: SimBenchConfig, out: str | os.PathLike, *, progress: bool = True) -> dict[str, Any]:
    """Run the benchmark, write ``out/sim.json`` and ``out/sim.csv``, print the table.

    Returns the JSON payload.
    """
    from tqdm.auto import tqdm

    validate(cfg)
    out = Path(out)
    t_start = time.perf_counter()
    render = bool(cfg.cameras)
    views = len(cfg.cameras)
    torch.manual_seed(cfg.seed)
    load_start = _loadavg()
    cpu_start = _machine_cpu()  # with t_start: the machine's CPU use over the whole run

    # Effective thread counts per N (the env clamps T to N); duplicates are measured once.
    plan: list[tuple[int, list[int]]] = []
    skipped: list[dict[str, int]] = []
    for n in cfg.num_envs:
        eff: list[int] = []
        for t in cfg.num_threads:
            used = max(1, min(int(t), int(n)))
            if used in eff:
                skipped.append({"num_envs": int(n), "threads_requested": int(t), "threads": used})
            else:
                eff.append(used)
        plan.append((int(n), eff))
    per_repeat = (3 if cfg.rollout else 2) + (1 if render else 0)
    total = sum(len(ts) * per_repeat * cfg.repeats for _, ts in plan)

    series: dict[tuple[int, int, str], _Series] = {}
    other_cores: dict[int, float | None] = {}  # per N: cores other processes used meanwhile
    sizes: dict[str, Any] = {}
    bar = tqdm(total=total, desc="bench sim", unit="run", disable=not progress, dynamic_ncols=True)
    try:
        for n, threads in plan:
            runners: list[tuple[int, _Runner]] = []
            group_start = (time.perf_counter(), _machine_cpu())
            try:
                for t in threads:
                    bar.set_postfix_str(f"N={n} T={t} building")
                    steps_state = control_steps(cfg, n, rgb=False)
                    t0 = time.perf_counter()
                    env = sims.make(
                        "mujoco", task=cfg.task, num_envs=n, seed=cfg.seed, device=cfg.device, cameras=(), num_threads=t
                    )
                    build = time.perf_counter() - t0
                    runners.append((t, _EnvRunner(env, "env_state", steps_state, cfg.seed)))
                    series[(n, t, "env_state")] = _Series("env_state", n, t, steps_state, build_s=build)
                    if not sizes:
                        sizes = _model_sizes(env)
                    runners.append((t, _BatchRunner(env, steps_state)))
                    series[(n, t, "raw_batch")] = _Series("raw_batch", n, t, steps_state)
                    if cfg.rollout:
                        runners.append((t, _RolloutRunner(env, steps_state)))
                        series[(n, t, "raw_rollout")] = _Series("raw_rollout", n, t, steps_state)
                    if render:
                        steps_rgb = control_steps(cfg, n, rgb=True)
                        t0 = time.perf_counter()
                        env_rgb = sims.make(
                            "mujoco",
                            task=cfg.task,
                            num_envs=n,
                            seed=cfg.seed,
                            device=cfg.device,
                            cameras=tuple(cfg.cameras),
                            image_size=cfg.image_size,
                            num_threads=t,
                        )
                        build = time.perf_counter() - t0
                        runners.append((t, _EnvRunner(env_rgb, "env_rgb", steps_rgb, cfg.seed)))
                        series[(n, t, "env_rgb")] = _Series("env_rgb", n, t, steps_rgb, build_s=build)
                # Warm-up: first calls allocate, fault in pages and start thread pools.
                for t, r in runners:
                    if cfg.warmup_steps:
                        bar.set_postfix_str(f"N={n} T={t} {r.name} warm-up")
                        saved = r.steps
                        r.steps = cfg.warmup_steps
                        r.prepare(-1)
                        _time_steps(r, cfg.warmup_steps)
                        r.steps = saved
                for rep in range(cfg.repeats):
                    for t, r in runners:
                        bar.set_postfix_str(f"N={n} T={t} {r.name} repeat {rep + 1}/{cfg.repeats}")
                        r.prepare(rep)
                        wall, cpu = _time_steps(r, r.steps)
                        series[(n, t, r.name)].add(r, wall, cpu)
                        bar.update(1)
                other_cores[n] = _other_cores(*group_start)
            finally:
                for _, r in runners:
                    r.close()
    finally:
        bar.close()

    wall_s = time.perf_counter() - t_start
    payload = _report(cfg, plan, series, sizes, skipped, views)
    for case in payload["cases"]:
        case["other_cores_avg"] = other_cores.get(case["num_envs"])
    payload["wall_s"] = wall_s
    payload["runtime"]["loadavg_start"] = load_start
    payload["runtime"]["loadavg_end"] = _loadavg()
    payload["runtime"]["other_cores_avg"] = _other_cores(t_start, cpu_start)
    if cfg.gpu_backends:
        from benchmarks.sim_gpu import run_gpu_backends

        payload["gpu_backends"] = run_gpu_backends(cfg)
    if cfg.workload_suites:
        payload["rl_workload"] = rl_workload(cfg, progress)
    write_json(out / "sim.json", payload)
    _write_csv(out / "sim.csv", cfg, plan, series, payload, sizes, views)
    print(format_table(payload))
    if payload.get("rl_workload"):
        from benchmarks.chunk_render import format_rows

        print(format_rows(payload["rl_workload"], f"RL workload, two views {cfg.image_size} px"))
    return payload


def rl_workload(cfg: SimBenchConfig, progress: bool = True) -> list[dict[str, Any]]:
    """:func:`benchmarks.chunk_render.time_workload` on each of ``cfg.workload_suites`` (rows carry the suite)."""
    from benchmarks.chunk_render import time_workload

    rows = []
    for suite in cfg.workload_suites:

        def make(n: int, suite: str = suite) -> Any:
            return sims.make(
                "mujoco",
                suite=suite,
                num_envs=n,
                seed=cfg.seed,
                device=cfg.device,
                cameras=("agentview", "wrist"),
                image_size=cfg.image_size,
            )

        say = (
            (lambda msg, suite=suite: print(f"[bench sim] RL workload {suite}: {msg}", flush=True))
            if progress
            else None
        )
        for row in time_workload(
            make,
            num_envs=cfg.workload_num_envs,
            chunk_sizes=cfg.workload_chunk_sizes,
            control_steps=cfg.workload_control_steps,
            repeats=cfg.workload_repeats,
            seed=cfg.seed,
            progress=say,
        ):
            rows.append({"suite": suite, "cameras": ["agentview", "wrist"], "image_size": cfg.image_size, **row})
    return rows


def _other_cores(t0: float, start: tuple[float, float] | None) -> float | None:
    """Cores that *other* processes kept busy on average since ``(t0, start)``.

    Other processes competing for the cores make the thread-scaling figures (and, less, all
    figures) unreliable; the benchmark records this instead of pretending the machine was idle.
    """
    end = _machine_cpu()
    wall = time.perf_counter() - t0
    if start is None or end is None or wall <= 0:
        return None
    ours = end[1] - start[1]
    return max(0.0, (end[0] - start[0]) - ours) / wall


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _model_sizes(env: Any) -> dict[str, Any]:
    m = env.model
    return {
        "task": env.tasks[0].name,
        "physics_dt": float(m.opt.timestep),
        "control_hz": float(env.control_hz),
        "substeps": int(env.substeps),
        "nq": int(m.nq),
        "nv": int(m.nv),
        "nu": int(m.nu),
        "nbody": int(m.nbody),
        "ngeom": int(m.ngeom),
        "nmesh": int(m.nmesh),
        "batch_nstate": int(env.sim.nstate),
        "action_dim": int(env.action_spec.shape[0]),
        "state_dim": int(env.observation_spec["state"].shape[0]),
        "max_episode_steps": int(env.tasks[0].max_steps),
    }


def _report(
    cfg: SimBenchConfig,
    plan: list[tuple[int, list[int]]],
    series: dict[tuple[int, int, str], _Series],
    sizes: dict[str, Any],
    skipped: list[dict[str, int]],
    views: int,
) -> dict[str, Any]:
    substeps = sizes["substeps"]
    cases: list[dict[str, Any]] = []
    scaling: list[dict[str, Any]] = []
    env_vs_raw: dict[str, Any] = {}
    thread_target: dict[str, Any] = {}
    for n, threads in plan:
        ratios_n: dict[str, float] = {}
        for t in threads:
            got = {v: series[(n, t, v)] for v in VARIANTS if (n, t, v) in series}
            case: dict[str, Any] = {"num_envs": n, "threads": t}
            for v, s in got.items():
                case[v] = s.summary(substeps, views)
            for num, den in (
                ("env_state", "raw_batch"),
                ("env_state", "raw_rollout"),
                ("raw_batch", "raw_rollout"),
                ("env_rgb", "raw_batch"),
                ("env_rgb", "env_state"),
            ):
                key = "env" if num == "env_state" else num
                case[f"ratio_{key}_vs_{den}"] = _paired_ratio(got.get(num), got.get(den))
            cases.append(case)
            ratios_n[str(t)] = case["ratio_env_vs_raw_batch"]
        env_vs_raw[str(n)] = {
            "ratios_by_threads": ratios_n,
            "pass": all(r >= cfg.target_env_vs_raw for r in ratios_n.values()),
        }
        if 1 in threads:
            for t in threads:
                if t == 1:
                    continue
                row: dict[str, Any] = {"num_envs": n, "threads": t, "vs_threads": 1}
                for v in VARIANTS:
                    row[v] = _paired_ratio(series.get((n, t, v)), series.get((n, 1, v)))
                # cores this process kept busy at t threads (near t when the machine is idle)
                row["cpu_util"] = {
                    v: statistics.median(series[(n, t, v)].cpu_util) for v in VARIANTS if (n, t, v) in series
                }
                scaling.append(row)
                if t == 2 and n >= 8:
                    sp = row["env_state"]
                    thread_target[str(n)] = {
                        "speedup": sp,
                        "raw_batch_speedup": row["raw_batch"],
                        "pass": sp >= cfg.target_thread_scaling,
                    }
    targets = {
        "env_vs_raw_batch": {
            "description": "our env (state-only) env-steps/s / raw mujoco.batch on the same "
            f"model, >= {cfg.target_env_vs_raw} at every thread count, per N",
            "min_ratio": cfg.target_env_vs_raw,
            "by_num_envs": env_vs_raw,
            "pass": all(v["pass"] for v in env_vs_raw.values()),
        },
        "thread_scaling": {
            "description": f"our env (state-only) at 2 threads / 1 thread, >= {cfg.target_thread_scaling}, per N >= 8",
            "min_speedup": cfg.target_thread_scaling,
            "by_num_envs": thread_target,
            # None when the run measured no case the target applies to (no N >= 8 or no T=1,2)
            "pass": all(v["pass"] for v in thread_target.values()) if thread_target else None,
        },
    }
    return {
        "bench": "sim",
        "units": "env_steps_per_s = control steps x num_envs per second; physics_steps_per_s = "
        "env_steps_per_s x substeps; ratios are medians of per-repeat paired ratios",
        "config": asdict(cfg),
        "machine": machine_info(),
        "runtime": {
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "torch_num_threads": torch.get_num_threads(),
        },
        "sizes": {
            **sizes,
            "cameras": list(cfg.cameras),
            "image_size": cfg.image_size,
            "views": views,
            "repeats": cfg.repeats,
        },
        "cases": cases,
        "thread_scaling": scaling,
        "targets": targets,
        "skipped": skipped,
    }


def _write_csv(
    path: Path,
    cfg: SimBenchConfig,
    plan: list[tuple[int, list[int]]],
    series: dict[tuple[int, int, str], _Series],
    payload: dict[str, Any],
    sizes: dict[str, Any],
    views: int,
) -> None:
    substeps = sizes["substeps"]
    scaling = {(r["num_envs"], r["threads"]): r for r in payload["thread_scaling"]}
    with atomic_path(path) as tmp, tmp.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=CSV_FIELDS)
        w.writeheader()
        for n, threads in plan:
            for t in threads:
                for v in VARIANTS:
                    s = series.get((n, t, v))
                    if s is None:
                        continue
                    med = statistics.median(s.samples)
                    sc = scaling.get((n, t))
                    split = s.summary(substeps, views).get("time_split", {})
                    w.writerow(
                        {
                            "num_envs": n,
                            "threads": t,
                            "variant": v,
                            "cameras": "+".join(cfg.cameras) if v == "env_rgb" else "",
                            "image_size": cfg.image_size if v == "env_rgb" else "",
                            "substeps": substeps,
                            "control_steps": s.steps,
                            "repeats": len(s.samples),
                            "env_steps_per_s_median": f"{med:.6g}",
                            "env_steps_per_s_min": f"{min(s.samples):.6g}",
                            "env_steps_per_s_max": f"{max(s.samples):.6g}",
                            "physics_steps_per_s_median": f"{med * substeps:.6g}",
                            "frames_per_s_median": f"{med * views:.6g}" if v == "env_rgb" else "",
                            "ratio_vs_raw_batch": _fmt(_paired_ratio(s, series.get((n, t, "raw_batch"))), ".4f"),
                            "speedup_vs_1_thread": _fmt(sc[v] if sc else None, ".4f"),
                            "cpu_util": f"{statistics.median(s.cpu_util):.3f}",
                            "physics_frac": _fmt(split.get("physics_frac"), ".4f"),
                            "render_frac": _fmt(split.get("render_frac"), ".4f"),
                            "overhead_ms_per_step": _fmt(split.get("overhead_ms_per_step"), ".4f"),
                        }
                    )


def format_table(payload: dict[str, Any]) -> str:
    """A readable table of a ``sim.json`` payload."""
    sz = payload["sizes"]
    lines = [
        (
            f"sim bench: task {sz['task']}, {sz['substeps']} physics steps of {sz['physics_dt']} s "
            f"per control step ({sz['control_hz']:g} Hz), medians of {sz['repeats']} repeats, "
            f"OMP_NUM_THREADS={payload['runtime']['omp_num_threads']}"
        ),
        (
            "rates in env-steps/s (control steps x envs / s); phys/s = physics steps/s; "
            "ratios = medians of paired per-repeat ratios"
        ),
        "",
    ]
    head = (
        f"{'N':>4} {'thr':>3} | {'env state':>9} {'raw batch':>9} {'raw rollout':>11} | "
        f"{'env/batch':>9} {'env/rollout':>11} | {'env phys/s':>10} {'batch phys/s':>12} | "
        f"{'overhead':>8} {'in-env phys':>11} | {'env rgb':>7} {'rgb fps':>7} {'rgb/state':>9}"
    )
    lines += [head, "-" * len(head)]

    def med(c: dict[str, Any], v: str) -> float | None:
        return c[v]["env_steps_per_s"]["median"] if v in c else None

    def phys(c: dict[str, Any], v: str) -> float | None:
        return c[v]["physics_steps_per_s"] if v in c else None

    for c in payload["cases"]:
        split = c.get("env_state", {}).get("time_split", {})
        lines.append(
            f"{c['num_envs']:>4} {c['threads']:>3} | {_fmt(med(c, 'env_state')):>9} "
            f"{_fmt(med(c, 'raw_batch')):>9} {_fmt(med(c, 'raw_rollout')):>11} | "
            f"{_fmt(c['ratio_env_vs_raw_batch'], '.3f'):>9} "
            f"{_fmt(c['ratio_env_vs_raw_rollout'], '.3f'):>11} | "
            f"{_fmt(phys(c, 'env_state')):>10} {_fmt(phys(c, 'raw_batch')):>12} | "
            f"{_fmt(split.get('overhead_ms_per_step'), '.3f'):>5} ms "
            f"{_fmt(split.get('inner_physics_env_steps_per_s')):>11} | "
            f"{_fmt(med(c, 'env_rgb'), '.1f'):>7} "
            f"{_fmt(c['env_rgb']['frames_per_s'] if 'env_rgb' in c else None, '.1f'):>7} "
            f"{_fmt(c['ratio_env_rgb_vs_env_state'], '.3f'):>9}"
        )
    lines.append(
        "overhead = our env's time outside Batch.step per control step (controller, checks, "
        "observations, resets); in-env phys = env-steps/s of the physics inside our env"
    )
    others_by_n = {c["num_envs"]: c.get("other_cores_avg") for c in payload["cases"]}
    if payload["thread_scaling"]:
        lines += ["", "thread scaling (speedup vs 1 thread, paired medians):"]
        for r in payload["thread_scaling"]:
            lines.append(
                f"  N={r['num_envs']:<3} {r['threads']} threads: env state "
                f"{_fmt(r['env_state'], '.2f')}x, raw batch {_fmt(r['raw_batch'], '.2f')}x, "
                f"raw rollout {_fmt(r['raw_rollout'], '.2f')}x, env rgb {_fmt(r['env_rgb'], '.2f')}x"
                f"  (cores busy: env {_fmt(r['cpu_util'].get('env_state'), '.2f')}, raw batch "
                f"{_fmt(r['cpu_util'].get('raw_batch'), '.2f')}; other processes "
                f"{_fmt(others_by_n.get(r['num_envs']), '.2f')})"
            )
    t = payload["targets"]

    def verdict(p: bool | None) -> str:
        return "n/a" if p is None else ("PASS" if p else "FAIL")

    ev = t["env_vs_raw_batch"]
    lines += ["", f"target env/raw batch >= {ev['min_ratio']} (state-only): {verdict(ev['pass'])}"]
    for n, v in ev["by_num_envs"].items():
        rs = ", ".join(f"T={k}: {_fmt(x, '.3f')}" for k, x in v["ratios_by_threads"].items())
        lines.append(f"  N={n:<3} {verdict(v['pass'])}  ({rs})")
    ts = t["thread_scaling"]
    lines.append(f"target 2 threads >= {ts['min_speedup']}x 1 thread (state-only, N >= 8): {verdict(ts['pass'])}")
    for n, v in ts["by_num_envs"].items():
        lines.append(
            f"  N={n:<3} {verdict(v['pass'])}  (env {_fmt(v['speedup'], '.2f')}x, "
            f"raw batch {_fmt(v['raw_batch_speedup'], '.2f')}x)"
        )
    rt = payload["runtime"]
    others = rt.get("other_cores_avg")
    lines.append(
        f"wall time {payload.get('wall_s', float('nan')):.1f} s; other processes used "
        f"{_fmt(others, '.2f')} cores on average meanwhile (load avg at end "
        f"{rt.get('loadavg_end')})"
    )
    busy = [n for n, o in others_by_n.items() if o is not None and o > 0.25]
    if busy or (others is not None and others > 0.25):
        lines.append(
            "warning: the machine was not idle (other processes > 0.25 cores"
            + (f" during N={', '.join(map(str, busy))}" if busy else "")
            + "); multi-thread figures understate scaling"
        )
    return "\n".join(lines)


__all__ = ["SCHEMA", "BenchError", "SimBenchConfig", "control_steps", "format_table", "run", "validate"]
