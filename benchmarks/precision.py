"""fp32 against bf16 against torch.compile on the flow VLA at its default size: SFT speed, loss and the trained
bundles' greedy success, and the chunk latency of serving, on one machine in one run.

    .venv/bin/embodied-collect suite=goal 'tasks=[8]' episodes_per_task=10 out=runs/precision/data
    .venv/bin/python benchmarks/precision.py --data runs/precision/data --out runs/precision \\
        [--steps 300] [--variants fp32 bf16 compile] [--device cpu] [--threads 1] [--sections sft speed latency]
    .venv-lerobot/bin/python benchmarks/precision.py --smolvla --data runs/precision/data --out runs/precision

Sections (``OUT/precision.json``):

- ``sft``: one ``embodied-sft`` run per variant (``batch_size`` 64, the same seed) with its ``precision`` /
  ``compile`` settings, evaluated after training (greedy, float32 from the saved bundle, on the first
  ``--eval-states`` fixed initial states of ``--task``): final loss, greedy success, and the run's own
  steps/s after its first logged interval (which holds torch.compile's compilation: ``first_interval_s``).
  The runs follow each other: on a shared machine their speeds saw different loads.
- ``speed``: steps/s of every variant measured in turns within one process (the same steps as SFT), so
  that all see the same load: the figure to compare.
- ``latency``: one greedy chunk at batch 1 and 32 as the server runs it, every variant in turn.

``--smolvla`` (in ``.venv-lerobot``) instead times SmolVLA at its published size (random weights, built
offline) with the VLM frozen: two SFT steps per precision (``--smolvla-rl``: and one Flow-SDE iteration),
seconds and peak memory (``OUT/smolvla.json``). One SFT run per variant: a loss or success difference within the spread of
SFT seeds says nothing.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

#: the settings of each variant, as embodied-sft arguments
VARIANTS = {
    "fp32": [],
    "bf16": ["precision=bf16"],
    "compile": ["compile=true"],
    "bf16_compile": ["precision=bf16", "compile=true"],
}


def _sft(args: argparse.Namespace, name: str) -> dict[str, Any]:
    """One ``embodied-sft`` run of variant ``name`` into ``OUT/<name>``; its figures."""
    out = Path(args.out) / name
    cmd = [
        str(Path(sys.executable).parent / "embodied-sft"),
        f"data={args.data}",
        f"out={out}",
        "policy=flow",
        f"steps={args.steps}",
        f"save_every={args.steps}",
        f"log_every={args.log_every}",
        f"warmup_steps={min(100, args.steps // 3)}",
        f"device={args.device}",
        f"threads={args.threads}",
        "seed=0",
        *VARIANTS[name],
    ]
    if args.eval_states:
        cmd += ["eval.suite=goal", f"eval.tasks=[{args.task}]", f"eval.episodes_per_task={args.eval_states}"]
        cmd += [f"eval.num_envs={args.eval_states}"]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"benchmarks/precision.py: {name} failed:\n{proc.stderr[-3000:]}")
    rows = list(csv.DictReader(open(out / "metrics.csv")))
    first, last = rows[0], rows[-1]
    summary = json.loads((out / "sft.json").read_text())
    return {
        "command": " ".join(cmd[1:]),
        "final_loss": summary["final_loss"],
        "run_steps_per_s": (int(last["step"]) - int(first["step"]))
        / (float(last["seconds"]) - float(first["seconds"])),
        "first_interval_s": float(first["seconds"]),
        "train_seconds": summary["train_seconds"],
        "wall_s": round(wall, 1),
        "compiled": summary["compiled"],
        "train_peak_memory_gb": summary.get("peak_memory_gb"),
        "greedy_success": summary.get("eval_success_rate"),
        "checkpoint": summary["checkpoint"],
    }


def _variant_policy(name: str, device: str, seed: int = 0) -> tuple[Any, Any]:
    """A fresh flow policy at its default size for variant ``name`` and its precision (compiled for
    ``compile``, ``bf16_compile``)."""
    import torch

    import policies
    from policies.precision import compile_policy, lookup

    torch.manual_seed(seed)
    policy = policies.make("flow").to(device)
    if "compile" in name and not compile_policy(policy):
        return None, None
    return policy, lookup("bf16" if "bf16" in name else "fp32")


def _timed(device: str, fn: Any) -> float:
    import torch

    t0 = time.perf_counter()
    fn()
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def _speed(args: argparse.Namespace) -> dict[str, float]:
    """SFT steps/s of each variant, measured in turns (``--rounds`` rounds of ``--round-steps`` steps of each
    variant in turn, after 3 warm-up steps each) so that all see the same load; the median round."""
    import numpy as np
    import torch

    from embodied.data.training import load_demonstrations

    demos = load_demonstrations(args.data, chunk_size=5, image_size=64, cameras=["agentview", "wrist"])
    runs = {}
    for name in args.variants:
        policy, precision = _variant_policy(name, args.device)
        if policy is not None:
            opt = torch.optim.AdamW(policy.parameters(), lr=1e-4)
            runs[name] = (policy, precision, opt, torch.Generator().manual_seed(0))

    def steps(name: str, n: int) -> None:
        policy, precision, opt, gen = runs[name]
        for _ in range(n):
            obs, chunks = demos.batch(torch.randint(0, len(demos), (64,), generator=gen))
            with precision.autocast(args.device):
                loss = policy.sft_loss(obs, chunks.to(args.device))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
            opt.step()

    for name in runs:
        steps(name, 3)
    rounds: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name in runs:
            rounds[name].append(_timed(args.device, lambda: steps(name, args.round_steps)))
    return {name: args.round_steps / float(np.median(r)) for name, r in rounds.items()}


def _latency(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Median seconds of one greedy chunk at batch 1 and 32 as the server runs it
    (:meth:`~policies.precision.Precision.for_inference` + autocast): each variant in turn, ``--repeats``
    times, after two warm-up calls (compilation)."""
    import numpy as np
    import torch

    served = {}
    for name in args.variants:
        policy, precision = _variant_policy(name, args.device)
        if policy is not None:
            served[name] = (precision.for_inference(policy), precision)
    out: dict[str, dict[str, float]] = {}
    for n in (1, 32):
        obs = {
            "rgb": torch.randint(0, 256, (n, 2, 64, 64, 3), dtype=torch.uint8),
            "state": torch.zeros(n, 15),
            "instruction": ["put the bowl on the plate"] * n,
        }

        def call(name: str, i: int) -> None:
            policy, precision = served[name]
            with precision.autocast(args.device):
                policy.act(obs, generator=torch.Generator().manual_seed(i))

        times: dict[str, list[float]] = {name: [] for name in served}
        for i in range(args.repeats + 2):
            for name in served:
                times[name].append(_timed(args.device, lambda: call(name, i)))
        for name, t in times.items():
            out.setdefault(name, {})[f"batch_{n}_s"] = float(np.median(t[2:]))
    return out


#: SmolVLM2-500M-Video-Instruct's sizes (its config.json), the VLM SmolVLA builds on (LeRobot keeps its first
#: ``num_vlm_layers`` = 16 text layers and adds an expert of 0.75 of its width)
SMOLVLM_500M = dict(
    text_config=dict(
        model_type="llama",
        hidden_size=960,
        intermediate_size=2560,
        num_hidden_layers=32,
        num_attention_heads=15,
        num_key_value_heads=5,
        head_dim=64,
        vocab_size=49280,
        rms_norm_eps=1e-5,
        rope_theta=100000.0,
        max_position_embeddings=8192,
    ),
    vision_config=dict(
        hidden_size=768,
        intermediate_size=3072,
        num_hidden_layers=12,
        num_attention_heads=12,
        patch_size=16,
        image_size=512,
    ),
    scale_factor=4,
    vocab_size=49280,
)


def published_smolvlm(folder: Path) -> str:
    """A SmolVLM folder at SmolVLM2-500M's sizes: config, processor and a word-level tokenizer, no weights
    (SmolVLA builds its VLM with random weights from it; nothing is downloaded)."""
    from transformers import SmolVLMConfig

    from policies.lerobot.tiny import make_tiny_smolvlm

    if (folder / "config.json").is_file() and SmolVLMConfig.from_pretrained(str(folder)).scale_factor == 4:
        return str(folder)
    make_tiny_smolvlm(folder)  # the processor and the tokenizer
    image_token_id = SmolVLMConfig.from_pretrained(str(folder)).image_token_id
    SmolVLMConfig(**SMOLVLM_500M, image_token_id=image_token_id).save_pretrained(str(folder))
    return str(folder)


def _memory_guard(min_available_gb: float) -> None:
    """Stop this process (exit 3) when the machine's available memory falls below ``min_available_gb``:
    on a shared machine the kernel's OOM killer would pick the largest process, not this one."""
    import threading

    def watch() -> None:
        while True:
            with open("/proc/meminfo") as fh:
                info = {line.split(":")[0]: int(line.split()[1]) for line in fh}
            if info["MemAvailable"] / 2**20 < min_available_gb:
                print(f"stopped: less than {min_available_gb} GB of memory available", flush=True)
                os._exit(3)
            time.sleep(0.1)

    threading.Thread(target=watch, daemon=True).start()


def _smolvla_sft_step(args: argparse.Namespace, name: str) -> dict[str, Any]:
    """In this process: SmolVLA at SmolVLM2-500M's sizes with the VLM frozen (``train_expert_only``), in
    precision ``name``; the seconds of building it and of two SFT steps (batch 4, AdamW on what trains), the
    RSS once built, the peak RSS of the steps and of the whole process (building the model is its own peak:
    LeRobot builds the whole VLM, then drops its upper layers). No bundle is saved: its serialisation
    would double the weights in memory."""
    import gc
    import resource

    import torch

    import policies
    from embodied.data.training import load_demonstrations
    from policies.precision import lookup

    _memory_guard(args.min_available_gb)
    vlm = published_smolvlm(Path(args.out) / "smolvla" / "smolvlm_500m")
    t0 = time.perf_counter()
    policy = policies.make("smolvla", lerobot_config={"vlm_model_name": vlm}).train()
    c = policy.config
    # frames at the dataset's size: LeRobot resizes them to 512 x 512 itself, as for the env's frames
    demos = load_demonstrations(args.data, chunk_size=c.chunk_size, image_size=128, cameras=c.cameras)
    policy.processor.set_stats(policy.processor.stats_from_arrays(demos.state.numpy(), demos.actions.numpy()))
    precision = lookup(name)
    cast = precision.cast_frozen(policy)
    opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-5)
    row: dict[str, Any] = {"build_s": round(time.perf_counter() - t0, 1), "frozen_weights_cast": len(cast)}
    row["parameters"] = sum(p.numel() for p in policy.parameters())
    row["trainable"] = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    gc.collect()
    row["rss_built_gb"] = _status_gb("VmRSS")
    with open("/proc/self/clear_refs", "w") as fh:  # the peak below is the steps' own
        fh.write("5")
    for i in range(2):
        obs, chunks = demos.batch(torch.arange(4) + 4 * i)
        t0 = time.perf_counter()
        with precision.autocast("cpu"):
            loss = policy.sft_loss(obs, chunks)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        row[f"step{i + 1}_s"] = round(time.perf_counter() - t0, 1)
        row[f"loss{i + 1}"] = round(loss.item(), 4)
    row["peak_rss_steps_gb"] = _status_gb("VmHWM")
    row["peak_rss_gb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)  # building too
    return row


def _status_gb(key: str) -> float:
    """``/proc/self/status``'s ``key`` (VmRSS: resident now; VmHWM: the peak since the last reset) in GB."""
    with open("/proc/self/status") as fh:
        kb = next(int(line.split()[1]) for line in fh if line.startswith(key + ":"))
    return round(kb / 2**20, 2)


def _measured(cmd: list[str], log: Path, min_available_gb: float) -> dict[str, Any]:
    """Run ``cmd`` (output into ``log``), stopped when the machine's available memory falls below
    ``min_available_gb``; its exit code, wall seconds and peak RSS (GB: it and the children it waited for)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            with open("/proc/meminfo") as meminfo:
                available = next(int(line.split()[1]) for line in meminfo if line.startswith("MemAvailable:"))
            if available / 2**20 < min_available_gb:
                proc.kill()
            time.sleep(0.1)
    return {
        "exit": os.waitstatus_to_exitcode(status),
        "wall_s": round(time.perf_counter() - t0, 1),
        "peak_rss_gb": round(usage.ru_maxrss / 2**20, 2),
    }


def _smolvla_rl(args: argparse.Namespace, vlm: str, name: str) -> dict[str, Any]:
    """One Flow-SDE iteration of a fresh SmolVLA (2 envs x 2 chunks, ``embodied-train`` with runtime=local:
    the sampler and the learner in one process), the learner in precision ``name``, the VLM frozen."""
    rl = Path(args.out) / "smolvla" / f"rl_{name}"
    cmd = [str(Path(sys.executable).parent / "embodied-train"), "policy=smolvla", "algo=flow_sde", f"out={rl}"]
    cmd += [f"policy.lerobot_config={{vlm_model_name:'{vlm}'}}", "suite=goal", f"tasks=[{args.task}]"]
    cmd += ["num_envs=2", "image_size=128", "chunks_per_iter=2", "iterations=1", "max_episode_steps=10"]
    cmd += ["algo.minibatch_size=4", f"algo.precision={name}"]
    row = _measured(cmd, rl.with_suffix(".log"), args.min_available_gb)
    if row["exit"] == 0:
        last = json.loads((rl / "train.json").read_text())["last"]
        row.update({k: last[k] for k in ("iteration_s", "sample_s", "learn_s", "approx_kl_first")})
    return {**row, "command": " ".join(cmd[1:])}


def _smolvla(args: argparse.Namespace) -> dict[str, Any]:
    """SmolVLA at its published size (random weights, built offline), the VLM frozen: two SFT steps in each of
    ``--smolvla-precisions``, each in its own process (:func:`_smolvla_sft_step`: its own peak memory); with
    ``--smolvla-rl`` one Flow-SDE iteration in the first of them (:func:`_smolvla_rl`)."""
    vlm = published_smolvlm(Path(args.out) / "smolvla" / "smolvlm_500m")
    result: dict[str, Any] = {"vlm": "SmolVLM2-500M sizes, random weights", "sft": {}}
    for name in args.smolvla_precisions:
        cmd = [sys.executable, __file__, f"--data={args.data}", f"--out={args.out}", f"--smolvla-step={name}"]
        cmd += [f"--min-available-gb={args.min_available_gb}"]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
        last = (proc.stdout.strip().splitlines() or [""])[-1]
        if proc.returncode != 0:
            result["sft"][name] = {"error": last or proc.stderr[-2000:]}
        else:
            result["sft"][name] = json.loads(last)
        print("smolvla sft", name, json.dumps(result["sft"][name]), flush=True)
    if args.smolvla_rl:
        name = args.smolvla_precisions[0]
        result["rl"] = {name: _smolvla_rl(args, vlm, name)}
        print("smolvla rl", name, json.dumps(result["rl"][name]), flush=True)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="a goal-suite dataset (embodied-collect)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--log-every", type=int, default=25)
    parser.add_argument("--variants", nargs="+", default=["fp32", "bf16", "compile"], choices=list(VARIANTS))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--task", type=int, default=8, help="the goal task the dataset holds (evaluation)")
    parser.add_argument("--eval-states", type=int, default=10, help="fixed initial states evaluated (0: none)")
    parser.add_argument(
        "--sections", nargs="+", default=["sft", "speed", "latency"], choices=["sft", "speed", "latency"]
    )
    parser.add_argument("--rounds", type=int, default=5, help="speed: rounds of every variant in turn")
    parser.add_argument("--round-steps", type=int, default=10, help="speed: SFT steps of a variant per round")
    parser.add_argument("--repeats", type=int, default=10, help="latency: timed greedy chunks per batch size")
    parser.add_argument(
        "--smolvla",
        action="store_true",
        help="instead: SmolVLA at its published size (in .venv-lerobot), SFT steps in bf16 and fp32",
    )
    parser.add_argument("--smolvla-precisions", nargs="+", default=["bf16", "fp32"], choices=["bf16", "fp32"])
    parser.add_argument("--smolvla-step", choices=["bf16", "fp32"], help=argparse.SUPPRESS)  # one measurement
    parser.add_argument("--smolvla-rl", action="store_true", help="--smolvla: also one Flow-SDE iteration")
    parser.add_argument("--min-available-gb", type=float, default=1.5, help="--smolvla: stop below this much")
    args = parser.parse_args(argv)
    if args.steps < 2 * args.log_every:
        parser.error(f"--steps ({args.steps}) must cover two logged intervals of --log-every ({args.log_every})")
    import torch

    from embodied.runs import machine_info, write_json

    torch.set_num_threads(args.threads)
    if args.smolvla_step:
        print(json.dumps(_smolvla_sft_step(args, args.smolvla_step)), flush=True)
        return 0
    if args.smolvla:
        write_json(Path(args.out) / "smolvla.json", {"machine": machine_info(), **_smolvla(args)})
        return 0
    result: dict[str, Any] = {"machine": machine_info(), "steps": args.steps, "threads": args.threads}
    path = Path(args.out) / "precision.json"
    if "sft" in args.sections:
        result["sft"] = {}
        for name in args.variants:
            result["sft"][name] = _sft(args, name)
            print(name, json.dumps(result["sft"][name]), flush=True)
            write_json(path, result)
    if "speed" in args.sections:
        result["steps_per_s"] = _speed(args)
        print("steps_per_s", json.dumps(result["steps_per_s"]), flush=True)
        write_json(path, result)
    if "latency" in args.sections:
        result["latency"] = _latency(args)
        print("latency", json.dumps(result["latency"]), flush=True)
    write_json(path, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
