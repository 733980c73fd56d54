"""Policy inference benchmark (``embodied-bench bench=policy``): chunk latency of every family.

What one run measures, for every family in ``families`` (default: flow, autoregressive,
diffusion; LeRobot's ``pi0``, ``pi05``, ``smolvla`` when named, in .venv-lerobot, at a tiny size),
each of its samplers, and every batch size N in ``batch_sizes`` (a *case*):

- ``flow``: ``policies.make("flow", sampler=S)`` then ``sample(obs, mode="explore")`` for the
  samplers ``ode`` (deterministic Euler ODE), ``sde`` (accelerated Flow-SDE: one stochastic step
  per chunk), ``sde_full`` (Flow-SDE on the full chain) and ``noise`` (Flow-Noise, learned noise
  head); greedy flow sampling is the ODE, so it is not timed twice;
- ``autoregressive``: ``sample(obs, mode="greedy")`` (``greedy``) and ``mode="explore"``
  (``explore``), H*A tokens decoded with the KV cache;
- ``diffusion``: ``sample(obs, mode="explore")`` (``ddim``: ``inference_steps`` DDIM steps);
- ``pi0``, ``pi05``, ``smolvla``: ``sample(obs, mode="explore")`` with the samplers ``ode``, ``sde``,
  ``sde_full``, ``noise``, LeRobot's models at the sizes of :func:`policies.lerobot.tiny.tiny_config` (image size
  32 unless ``image_size`` is set, chunk 4, 4 denoising steps; ``policy_overrides`` apply on top).

Every policy is built from its family's *default* config (``policies.make``), updated by
``image_size`` / ``cameras`` when set and by ``policy_overrides``; the weights are random (seeded
with ``seed`` before each build, so the samplers of one family share their weights). Latency does
not depend on the weights' values. Observations are synthetic: random uint8 images
``[N, V, s, s, 3]`` (V = the policy's cameras, s = ``obs_image_size`` or, when 0, the policy's
``image_size``, so the processor does not resize), random states ``[N, state_dim]`` and one
instruction string per row.

Timing: each case gets ``warmup`` untimed calls, then ``repeats`` timed calls; the cases of one
batch size are interleaved inside every repeat, so slow drifts of the machine hit them alike.
A call is ``policy.sample`` under ``torch.no_grad()`` (prefix encoding + the whole sampler +
unnormalisation), timed with ``time.perf_counter`` (with ``torch.cuda.synchronize`` on CUDA).
Medians over repeats are quoted, in ms per chunk (the whole batch). The ratio ``flow sde / flow
ode`` is the median of the per-repeat ratios of the two samplers timed in the same repeat; its
target (``<= target_sde_vs_ode``, default 1.25: the accelerated Flow-SDE sampler costs at most
25% more than the ODE) is reported as a boolean per batch size and overall, never asserted.

Memory (``peak_mem_mb``): on CPU, the peak of the bytes held by torch's CPU allocator during one
extra (untimed) ``sample`` call, above what was held when the call started (weights and inputs
excluded: the call's working memory: activations, KV caches, samplers' buffers), computed from
the allocation events that ``torch.profiler`` records with ``profile_memory=True``. On CUDA:
``torch.cuda.max_memory_allocated`` during the call minus ``torch.cuda.memory_allocated`` before
it. Memory outside torch's allocator (Python objects, the interpreter) is not counted;
``process_peak_rss_mb`` (``ru_maxrss``) in the JSON is the whole process's peak for reference.
``params`` counts every parameter of the module (encoders, heads, value head, noise head).

Outputs: ``<out>/policy.json`` (config, machine, runtime, per family: availability, parameter
count, policy config and per-sampler, per-batch latency samples, medians, memory; the ratios;
the target; notes on skipped families or samplers), ``<out>/policy.csv`` (one row per family,
sampler and batch size) and a table on stdout. A family whose code does not import (or whose
config rejects the sampler) is skipped with a note in the JSON instead of failing the run.
"""

from __future__ import annotations

import csv
import os
import resource
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from benchmarks.config import BenchConfig, BenchError
from embodied.runs import machine_info, write_json
from policies.files import atomic_path
from policies.io import policy_inputs

FAMILIES = ("flow", "autoregressive", "diffusion")
#: LeRobot's families (in .venv-lerobot), benchmarked at the ``tiny`` size of
#: :func:`policies.lerobot.tiny.tiny_config` (their published sizes need a GPU and downloaded weights)
LEROBOT_FAMILIES = ("pi0", "pi05", "smolvla")

#: family -> [(sampler name, extra ``policies.make`` kwargs, sample mode)]
SAMPLERS: dict[str, list[tuple[str, dict[str, Any], str]]] = {
    "flow": [
        ("ode", {"sampler": "ode"}, "explore"),
        ("sde", {"sampler": "sde"}, "explore"),
        ("sde_full", {"sampler": "sde_full"}, "explore"),
        ("noise", {"sampler": "noise"}, "explore"),
    ],
    "autoregressive": [
        ("greedy", {}, "greedy"),
        ("explore", {}, "explore"),
    ],
    "diffusion": [
        ("ddim", {}, "explore"),
    ],
    **{
        fam: [
            ("ode", {"sampler": "ode"}, "explore"),
            ("sde", {"sampler": "sde"}, "explore"),
            ("sde_full", {"sampler": "sde_full"}, "explore"),
            ("noise", {"sampler": "noise"}, "explore"),
        ]
        for fam in LEROBOT_FAMILIES
    },
}

CSV_FIELDS = (
    "family",
    "sampler",
    "mode",
    "batch",
    "repeats",
    "latency_ms_median",
    "latency_ms_min",
    "latency_ms_max",
    "ms_per_item",
    "chunks_per_s",
    "ratio_vs_flow_ode",
    "params",
    "peak_mem_mb",
    "chunk_size",
    "action_dim",
    "error",
)

MEMORY_METHOD = {
    "cpu": "peak bytes held by torch's CPU allocator during one sample() call above those held at its start "
    "(torch.profiler allocation events, profile_memory=True); weights and inputs excluded",
    "cuda": "torch.cuda.max_memory_allocated during one sample() call minus torch.cuda.memory_allocated before it",
}


@dataclass
class PolicyBenchConfig(BenchConfig):
    """``bench=policy``: chunk inference latency, parameters and peak memory of every policy family.

    ``device`` (from :class:`BenchConfig`) is where the policies run (``cpu`` by default).
    """

    families: list[str] = field(default_factory=list)  # [] = flow, autoregressive, diffusion
    batch_sizes: list[int] = field(default_factory=lambda: [1, 64])  # observations per sample() call N
    repeats: int = 5  # timed sample() calls per case; medians are quoted
    warmup: int = 2  # untimed sample() calls per case before the first repeat
    image_size: int = 0  # the policies' image_size; 0 = each family's default
    cameras: list[str] = field(default_factory=list)  # the policies' camera keys; [] = each family's default
    obs_image_size: int = 0  # size of the synthetic camera images; 0 = the policy's image_size (no resize)
    # More config keys for every family, e.g. +policy_overrides.d_model=32 on the command line
    # (the leading '+' adds a key to the empty dict).
    policy_overrides: dict[str, Any] = field(default_factory=dict)
    num_threads: int = 0  # torch intra-op threads; 0 = leave torch's default (OMP_NUM_THREADS)
    memory: bool = True  # measure peak memory (one extra, untimed call per case)
    target_sde_vs_ode: float = 1.25  # flow sde / flow ode latency must be <= this (reported, never asserted)


SCHEMA = PolicyBenchConfig


# ---------------------------------------------------------------------------- helpers
def validate(cfg: PolicyBenchConfig) -> list[str]:
    """Check the config; return the families to run (raises :class:`BenchError`)."""
    families = list(cfg.families) if cfg.families else list(FAMILIES)
    known = FAMILIES + LEROBOT_FAMILIES
    unknown = [f for f in families if f not in known]
    if unknown:
        raise BenchError(
            f"unknown policy famil{'y' if len(unknown) == 1 else 'ies'} {unknown}; choose from {list(known)}"
        )
    if not cfg.batch_sizes or any(int(n) < 1 for n in cfg.batch_sizes):
        raise BenchError(f"batch_sizes must be a non-empty list of positive integers, got {list(cfg.batch_sizes)}")
    if cfg.repeats < 1:
        raise BenchError(f"repeats must be >= 1, got {cfg.repeats}")
    if cfg.warmup < 0:
        raise BenchError(f"warmup must be >= 0, got {cfg.warmup}")
    if cfg.image_size < 0 or cfg.obs_image_size < 0:
        raise BenchError("image_size and obs_image_size must be >= 0 (0 = the policy's default)")
    if cfg.num_threads < 0:
        raise BenchError(f"num_threads must be >= 0 (0 = torch's default), got {cfg.num_threads}")
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        raise BenchError(f"device={cfg.device!r} but torch sees no CUDA device; use device=cpu")
    return list(dict.fromkeys(families))


def make_obs(config: Any, batch: int, size: int, seed: int) -> dict[str, Any]:
    """Synthetic observations for a policy config.

    Returns ``rgb`` uint8 ``[N, V, size, size, 3]`` (V = ``len(config.cameras)``), ``state``
    float32 ``[N, state_dim]`` and ``instruction`` (N strings, a few distinct ones).
    """
    g = torch.Generator().manual_seed(seed)
    views = len(config.cameras)
    texts = [
        "pick up the cube next to the plate and place it on the plate",
        "open the drawer",
        "put the cube in the basket and close the drawer",
    ]
    return policy_inputs(
        torch.randint(0, 256, (batch, views, size, size, 3), dtype=torch.uint8, generator=g),
        torch.randn(batch, config.state_dim, generator=g),
        [texts[i % len(texts)] for i in range(batch)],
    )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _cpu_peak_bytes(call: Callable[[], Any]) -> int:
    """Peak bytes held by torch's CPU allocator during ``call()`` above those held at its start."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        call()
    events: list[tuple[int, int]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.typed[0] == _EventType.Allocation:
            alloc = node.typed[1]
            if alloc.device.type == "cpu":
                events.append((node.start_time_ns, int(alloc.alloc_size)))  # negative = free
        stack.extend(node.children)
    events.sort(key=lambda e: e[0])
    cur = peak = 0
    for _, size in events:
        cur += size
        peak = max(peak, cur)
    return peak


def peak_memory_mb(call: Callable[[], Any], device: torch.device) -> float:
    """Working memory (MiB) of one ``call()`` on ``device``: see the module docstring."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        call()
        torch.cuda.synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - base) / 2**20
    return _cpu_peak_bytes(call) / 2**20


def _short(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}"
    return text if len(text) <= 400 else text[:397] + "..."


@dataclass
class _Case:
    """One (family, sampler) policy and its timed samples per batch size."""

    family: str
    sampler: str
    mode: str
    policy: Any
    samples: dict[int, list[float]] = field(default_factory=dict)  # batch -> seconds per call
    memory_mb: dict[int, float | None] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)

    def call(self, obs: dict[str, Any], seed: int) -> Any:
        with torch.no_grad():
            return self.policy.sample(obs, mode=self.mode, generator=torch.Generator().manual_seed(seed))


def _paired_ratio(num: list[float] | None, den: list[float] | None) -> float | None:
    """Median over repeats of ``num / den`` measured in the same repeat."""
    if not num or not den or len(num) != len(den):
        return None
    return statistics.median(a / b for a, b in zip(num, den))


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


# ---------------------------------------------------------------------------- the benchmark
def build_cases(
    cfg: PolicyBenchConfig, families: list[str], device: torch.device, out: Path
) -> tuple[list[_Case], dict[str, dict[str, Any]], list[str]]:
    """Build one policy per (family, sampler). Returns the cases, per-family info and notes. LeRobot's
    families are built tiny (their tokenizer or VLM folder is written under ``out/lerobot_tiny``)."""
    import policies

    base: dict[str, Any] = dict(cfg.policy_overrides)
    if cfg.image_size:
        base["image_size"] = cfg.image_size
    if cfg.cameras:
        base["cameras"] = list(cfg.cameras)
    cases: list[_Case] = []
    info: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    for fam in families:
        entry: dict[str, Any] = {"available": False, "error": None, "params": None, "config": None, "samplers": {}}
        info[fam] = entry
        try:
            policies.policy_class(fam)
        except Exception as err:  # noqa: BLE001 - a family still being written must not fail the run
            entry["error"] = _short(err)
            notes.append(f"family {fam!r} skipped: its code does not import ({entry['error']})")
            continue
        fam_base = base
        if fam in LEROBOT_FAMILIES:
            from policies.lerobot.tiny import tiny_config

            size = {"image_size": cfg.image_size} if cfg.image_size else {}
            fam_base = {**tiny_config(fam, out / "lerobot_tiny", **size), **base}
            entry["size"] = "tiny (policies.lerobot.tiny)"
        for name, extra, mode in SAMPLERS[fam]:
            try:
                torch.manual_seed(cfg.seed)  # same weights for every sampler of a family
                policy = policies.make(fam, **fam_base, **extra).to(device).eval()
            except Exception as err:  # noqa: BLE001
                msg = _short(err)
                entry["samplers"][name] = {"mode": mode, "error": msg, "batches": {}}
                notes.append(f"{fam}/{name} skipped: policies.make({fam!r}, **{extra}) failed ({msg})")
                continue
            entry["available"] = True
            if entry["params"] is None:
                entry["params"] = int(sum(p.numel() for p in policy.parameters()))
                entry["config"] = policy.config.to_dict()
            entry["samplers"][name] = {
                "mode": mode,
                "make_kwargs": extra,
                "error": None,
                "batches": {},
                "params": int(sum(p.numel() for p in policy.parameters())),
            }
            cases.append(_Case(fam, name, mode, policy))
        if not entry["available"] and entry["error"] is None:
            entry["error"] = "no sampler could be built"
    return cases, info, notes


def time_cases(
    cfg: PolicyBenchConfig, cases: list[_Case], device: torch.device, notes: list[str], progress: bool = True
) -> None:
    """Warm up, then time every case (interleaved per repeat), then measure memory."""
    for n in cfg.batch_sizes:
        n = int(n)
        obs: dict[int, dict[str, Any]] = {}
        live: list[_Case] = []
        for case in cases:
            c = case.policy.config
            size = cfg.obs_image_size or c.image_size
            obs[id(case)] = make_obs(c, n, size, cfg.seed)
            try:
                for w in range(cfg.warmup):
                    case.call(obs[id(case)], cfg.seed + 1000 + w)
                out = case.call(obs[id(case)], cfg.seed)
                shape = tuple(out.actions.shape)
                want = (n, c.chunk_size, c.action_dim)
                if shape != want:
                    raise RuntimeError(f"sample returned actions {shape}, expected {want}")
            except Exception as err:  # noqa: BLE001 - one broken sampler must not hide the others
                case.errors[n] = _short(err)
                notes.append(f"{case.family}/{case.sampler} at batch {n} failed: {case.errors[n]}")
                continue
            case.samples[n] = []
            live.append(case)
        with tqdm(
            total=cfg.repeats * len(live), desc=f"policy bench, batch {n}", unit="call", disable=not progress
        ) as bar:
            for r in range(cfg.repeats):
                for case in live:
                    _sync(device)
                    t0 = time.perf_counter()
                    case.call(obs[id(case)], cfg.seed + r)
                    _sync(device)
                    case.samples[n].append(time.perf_counter() - t0)
                    bar.update(1)
        for case in live:
            case.memory_mb[n] = None
            if not cfg.memory:
                continue
            try:
                case.memory_mb[n] = peak_memory_mb(partial(case.call, obs[id(case)], cfg.seed), device)
            except Exception as err:  # noqa: BLE001 - private profiler API; report and go on
                notes.append(f"memory of {case.family}/{case.sampler} at batch {n} not measured: {_short(err)}")


def _report(
    cfg: PolicyBenchConfig, cases: list[_Case], info: dict[str, dict[str, Any]], notes: list[str], device: torch.device
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    by_key = {(c.family, c.sampler): c for c in cases}
    ode = by_key.get(("flow", "ode"))
    rows: list[dict[str, Any]] = []
    ratios: dict[str, dict[str, float | None]] = {
        "flow_sde_vs_ode": {},
        "flow_sde_full_vs_ode": {},
        "flow_noise_vs_ode": {},
    }
    for case in cases:
        entry = info[case.family]["samplers"][case.sampler]
        cfg_p = case.policy.config
        for n in map(int, cfg.batch_sizes):
            s = case.samples.get(n)
            ratio = _paired_ratio(s, ode.samples.get(n)) if ode is not None and case.family == "flow" else None
            if s:
                med = statistics.median(s) * 1e3
                res = {
                    "latency_ms_median": med,
                    "latency_ms_min": min(s) * 1e3,
                    "latency_ms_max": max(s) * 1e3,
                    "latency_ms_samples": [x * 1e3 for x in s],
                    "ms_per_item": med / n,
                    "chunks_per_s": n / (med / 1e3),
                    "peak_mem_mb": case.memory_mb.get(n),
                    "ratio_vs_flow_ode": ratio,
                    "error": None,
                }
            else:
                res = {"latency_ms_median": None, "error": case.errors.get(n, "not run")}
            entry["batches"][str(n)] = res
            rows.append(
                {
                    "family": case.family,
                    "sampler": case.sampler,
                    "mode": case.mode,
                    "batch": n,
                    "repeats": len(s) if s else 0,
                    "params": entry["params"],
                    "chunk_size": cfg_p.chunk_size,
                    "action_dim": cfg_p.action_dim,
                    **{k: v for k, v in res.items() if k != "latency_ms_samples"},
                }
            )
    for key, name in (("flow_sde_vs_ode", "sde"), ("flow_sde_full_vs_ode", "sde_full"), ("flow_noise_vs_ode", "noise")):
        num = by_key.get(("flow", name))
        for n in map(int, cfg.batch_sizes):
            ratios[key][str(n)] = (
                _paired_ratio(num.samples.get(n), ode.samples.get(n)) if num is not None and ode is not None else None
            )
    per_batch = {n: (None if r is None else r <= cfg.target_sde_vs_ode) for n, r in ratios["flow_sde_vs_ode"].items()}
    measured = [v for v in per_batch.values() if v is not None]
    target = {
        "description": f"flow sde (accelerated Flow-SDE) / flow ode chunk latency <= {cfg.target_sde_vs_ode}, "
        "per batch size (median of paired per-repeat ratios)",
        "max_ratio": cfg.target_sde_vs_ode,
        "ratios": ratios["flow_sde_vs_ode"],
        "by_batch": per_batch,
        # None when the flow ode/sde samplers could not be measured (family missing)
        "pass": all(measured) if measured else None,
    }
    payload = {
        "bench": "policy",
        "units": "latency in ms per sample() call (one chunk for the whole batch), medians over repeats; "
        "ratios are medians of per-repeat paired ratios; memory in MiB",
        "config": asdict(cfg),
        "device": str(device),
        "memory_method": MEMORY_METHOD["cuda" if device.type == "cuda" else "cpu"] if cfg.memory else None,
        "runtime": {
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "torch_num_threads": torch.get_num_threads(),
            "process_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            # > the core count means other processes competed for the CPUs: latencies are inflated
            "loadavg_end": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        },
        "machine": machine_info(),
        "families": info,
        "ratios": ratios,
        "targets": {"sde_vs_ode": target},
        "notes": notes,
    }
    return payload, rows


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with atomic_path(path) as tmp, open(tmp, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        for r in rows:
            writer.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in CSV_FIELDS})


def format_table(payload: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """A readable table of a ``policy.json`` payload."""
    cfg = payload["config"]
    rt = payload["runtime"]
    lines = [
        (
            f"policy bench on {payload['device']}: ms per chunk (median of {cfg['repeats']} repeats), "
            f"torch threads {rt['torch_num_threads']}, OMP_NUM_THREADS={rt['omp_num_threads']}"
        ),
        "",
    ]
    head = (
        f"{'family':14s} {'sampler':9s} {'mode':7s} {'N':>4s} | {'ms/chunk':>9s} {'min':>8s} {'ms/item':>8s} "
        f"{'vs ode':>6s} | {'params':>9s} {'peak MiB':>8s}"
    )
    lines += [head, "-" * len(head)]
    for r in rows:
        if r.get("latency_ms_median") is None:
            lines.append(
                f"{r['family']:14s} {r['sampler']:9s} {r['mode']:7s} {r['batch']:>4d} | failed: {r.get('error')}"
            )
            continue
        lines.append(
            f"{r['family']:14s} {r['sampler']:9s} {r['mode']:7s} {r['batch']:>4d} | "
            f"{r['latency_ms_median']:9.2f} {r['latency_ms_min']:8.2f} {r['ms_per_item']:8.3f} "
            f"{_fmt(r.get('ratio_vs_flow_ode'), '.3f'):>6s} | {r['params']:>9,d} {_fmt(r.get('peak_mem_mb'), '.1f'):>8s}"
        )
    t = payload["targets"]["sde_vs_ode"]
    verdict = "n/a (flow not measured)" if t["pass"] is None else ("PASS" if t["pass"] else "FAIL")
    ratios = ", ".join(f"N={n}: {_fmt(r, '.3f')}" for n, r in t["ratios"].items())
    lines += ["", f"target flow sde / ode <= {t['max_ratio']}: {verdict} ({ratios})"]
    if payload.get("memory_method"):
        lines.append(f"peak MiB = {payload['memory_method']}")
    load = rt.get("loadavg_end")
    cores = payload["machine"].get("cpu_count")
    if load and cores and load[0] > cores * 0.75:
        lines.append(
            f"warning: load average {load[0]:.2f} on {cores} cores at the end: other processes competed "
            "for the CPUs; latencies (and multi-thread figures above all) are inflated"
        )
    for note in payload["notes"]:
        lines.append(f"note: {note}")
    return "\n".join(lines)


def run(cfg: PolicyBenchConfig, out: str | os.PathLike, *, progress: bool = True) -> dict[str, Any]:
    """Run the benchmark, write ``out/policy.json`` and ``out/policy.csv``, print the table.

    Returns the JSON payload. Raises :class:`BenchError` for an invalid config, and after writing
    the files when no (family, sampler) could be measured at all.
    """
    families = validate(cfg)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device(cfg.device)
    old_threads = torch.get_num_threads()
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    start = time.perf_counter()
    try:
        cases, info, notes = build_cases(cfg, families, device, out)
        time_cases(cfg, cases, device, notes, progress=progress)
        payload, rows = _report(cfg, cases, info, notes, device)
    finally:
        torch.set_num_threads(old_threads)
    payload["wall_s"] = round(time.perf_counter() - start, 2)
    write_json(out / "policy.json", payload)
    _write_csv(out / "policy.csv", rows)
    print(format_table(payload, rows))
    if not any(r.get("latency_ms_median") is not None for r in rows):
        raise BenchError("no policy family could be benchmarked: " + "; ".join(notes or ["nothing to run"]))
    return payload
