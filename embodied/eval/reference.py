"""Real LIBERO in its reference simulator: ``embodied-eval ... simulator=robosuite``.

    embodied-eval checkpoint=CKPT suite=libero_spatial simulator=robosuite out=DIR [tasks=[0]]
        [episodes=50] [max_steps=M] [action_steps=K] [image_size=256]
    embodied-eval server=HOST:PORT suite=libero_goal simulator=robosuite out=DIR   # any openpi server

The policy runs behind ``embodied-serve`` (started here on a free local port; or the openpi-compatible
server at ``server=``), and LIBERO's own env plays the official protocol against it in the reference
venv ``.venv-libero`` (:mod:`sims.libero.reference.client`): the suite's initial states in order,
seed 7, 10 wait steps, the suite's step limit, images rotated by 180 degrees, the 8-D state. The
outputs are those of every evaluation (``results.json``, ``results.csv``, ``report.md``, plots,
videos, ``episodes.jsonl``); an interrupted run resumes with the same command.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable

import numpy as np

#: keys of ``embodied-eval`` that the reference simulator does not take, with why
UNSUPPORTED = {
    "workers": (1, "the reference env plays its episodes one after another in one process"),
    "attempts": (1, "the server's policy acts greedily, so a second attempt repeats the first"),
    "execution": ("sync", "the reference client executes chunks synchronously"),
    "delay": (0, "the reference client executes chunks synchronously"),
    "mode": ("greedy", "embodied-serve samples greedily"),
    "action_offset": (0, "a diagnostic of the batched harness"),
    "meshes": ("decimated", "the reference env draws the scenes' meshes as they are"),
}


class ReferenceEvalError(ValueError):
    """A configuration the reference simulator cannot run; printed as one line."""


def check_config(cfg: Any) -> None:
    """Refuse keys the reference path does not honour (rather than ignoring them)."""
    import sims.libero as libero

    suites = ([cfg.suite] if cfg.suite else []) + [s for s in cfg.suites if s != cfg.suite]
    if len(suites) != 1:
        raise ReferenceEvalError(
            "simulator=robosuite evaluates one suite per run: give suite=libero_spatial (or "
            "another of " + ", ".join(libero.suite_names()[:5]) + ", or a LIBERO-PRO variant)"
        )
    try:
        libero.base_suite(suites[0])
    except ValueError as err:
        raise ReferenceEvalError(str(err)) from None
    for key, (default, why) in UNSUPPORTED.items():
        if getattr(cfg, key) != default:
            raise ReferenceEvalError(f"{key}={getattr(cfg, key)} is not available with simulator=robosuite ({why})")
    if (cfg.checkpoint is None) == (cfg.server is None):
        raise ReferenceEvalError(
            "give exactly one of checkpoint=PATH (served here by embodied-serve) or "
            "server=HOST:PORT (an openpi-compatible policy server already running)"
        )
    if cfg.policy is not None:
        raise ReferenceEvalError("policy=expert runs our suites' scripted experts; LIBERO's reference env has none")
    if not 1 <= cfg.episodes or cfg.first_state < 0 or cfg.first_state + cfg.episodes > libero.NUM_STATES:
        raise ReferenceEvalError(
            f"first_state + episodes must stay within LIBERO's {libero.NUM_STATES} initial "
            f"states per task: {libero.INIT_IDS} (a LIBERO-PRO variant: 0..49)"
        )
    if cfg.max_steps is not None and cfg.max_steps < 1:
        raise ReferenceEvalError(f"max_steps must be >= 1, got {cfg.max_steps}")
    if cfg.image_size < 16:
        raise ReferenceEvalError(f"image_size must be >= 16 (the server's smallest image), got {cfg.image_size}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_healthy(port: int, proc: subprocess.Popen, log: Path, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ReferenceEvalError(
                f"embodied-serve exited with status {proc.returncode} before it was ready: "
                + log.read_text()[-1500:].strip()
            )
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        time.sleep(0.5)
    raise ReferenceEvalError(f"embodied-serve was not ready within {timeout_s:.0f} s (log: {log})")


def start_server(checkpoint: str, *, port: int, device: str, seed: int, log: Path) -> subprocess.Popen:
    """``embodied-serve`` on ``127.0.0.1:port`` in its own process (the policy stays in the main venv)."""
    exe = Path(sys.executable).parent / "embodied-serve"
    if not exe.is_file():
        raise ReferenceEvalError(f"{exe} is missing: install the project (bash scripts/setup.sh)")
    args = [
        str(exe),
        f"checkpoint={checkpoint}",
        "host=127.0.0.1",
        f"port={port}",
        f"device={device}",
        f"seed={seed}",
        f"hydra.run.dir={log.parent / 'serve'}",
    ]
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    proc = subprocess.Popen(args, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
    _wait_healthy(port, proc, log)
    return proc


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def client_args(cfg: Any, suite: str, host: str, port: int, out: Path) -> list[str]:
    args = [
        "--host",
        host,
        "--port",
        str(port),
        "--suite",
        suite,
        "--episodes",
        str(cfg.episodes),
        "--first-state",
        str(cfg.first_state),
        "--image-size",
        str(cfg.image_size),
        "--videos",
        cfg.videos,
        "--video-max",
        str(cfg.video_max),
        "--out",
        str(out),
    ]
    if cfg.tasks is not None:
        args += ["--tasks", *map(str, cfg.tasks)]
    if cfg.max_steps is not None:
        args += ["--max-steps", str(cfg.max_steps)]
    if cfg.action_steps is not None:
        args += ["--action-steps", str(cfg.action_steps)]
    if cfg.hard_reset:
        args.append("--hard-reset")
    return args


def run_client(args: list[str], on_line: Callable[[str], None], log: Path) -> int:
    """The reference client in ``.venv-libero``; each line it prints goes to ``on_line`` and ``log``."""
    from sims.libero import reference_command

    argv, env = reference_command("client", args)
    with log.open("a") as f:
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True, start_new_session=True
        )
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                f.write(line)
                f.flush()
                on_line(line.rstrip("\n"))
            return proc.wait()
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGINT)
            proc.wait()
            raise
        finally:
            if proc.poll() is None:
                proc.kill()


def encode_videos(out: Path, suite: str, language: dict[int, str], fps: float = 20.0) -> None:
    """Turn the client's ``frames/<suite>/*.npz`` into annotated mp4s under ``videos/`` (then drop them)."""
    from embodied.video import VideoWriter, annotate_frame

    for path in sorted((out / "frames" / suite).glob("*.npz")):
        if path.name.endswith(".tmp.npz"):
            continue
        task, init_id, verdict = path.stem.split("_")
        with np.load(path) as z:
            views = [z["agentview"], z["wrist"]]
        rel = out / "videos" / suite / f"{path.stem}.mp4"
        rel.parent.mkdir(parents=True, exist_ok=True)
        with VideoWriter(rel, fps=fps) as writer:
            for step in range(len(views[0])):
                writer.write(
                    annotate_frame(
                        [v[step] for v in views],
                        [
                            language.get(int(task), ""),
                            f"{suite} task {int(task)} init {int(init_id)} "
                            f"step {step}/{len(views[0])} {'success' if verdict == 'ok' else ''}",
                        ],
                    )
                )
        path.unlink()
    for folder in (out / "frames" / suite, out / "frames"):
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()


def run_reference(
    cfg: Any, out: Path, agent_info: dict[str, Any], identity_check: Callable[[], None], progress: Any
) -> dict[str, Any]:
    """Evaluate on the reference simulator; returns the results dict (the caller writes the outputs)."""
    import sims.libero as libero
    from embodied.eval.harness import load_records
    from embodied.eval.report import aggregate

    suite = cfg.suite or cfg.suites[0]
    identity_check()
    server, host, port = None, "127.0.0.1", 0
    if cfg.server is not None:
        host, _, p = str(cfg.server).rpartition(":")
        if not host or not p.isdigit():
            raise ReferenceEvalError(f"server must be HOST:PORT, got {cfg.server!r}")
        port = int(p)
    start, interrupted = time.perf_counter(), False
    libero.venv_python()  # a clear error before a server starts
    try:
        if cfg.checkpoint is not None:
            port = free_port()
            server = start_server(cfg.checkpoint, port=port, device=cfg.device, seed=cfg.seed, log=out / "serve.log")

        def on_line(line: str) -> None:
            if line.startswith("[libero] task") and progress is not None:
                progress.update(1)
            elif line.startswith("[libero]") and progress is not None:
                progress.write(line)

        code = run_client(client_args(cfg, suite, host, port, out), on_line, out / "client.log")
        if code != 0:
            tail = (out / "client.log").read_text()[-2000:].strip()
            raise ReferenceEvalError(
                f"the reference LIBERO client failed (status {code}): {tail.splitlines()[-1] if tail else ''}"
                f" (full log: {out / 'client.log'})"
            )
    except KeyboardInterrupt:
        interrupted = True
    finally:
        _stop(server)
    meta = json.loads((out / "tasks.json").read_text()) if (out / "tasks.json").is_file() else {"tasks": []}
    names = {suite: [t["name"] for t in meta["tasks"]]}
    language = {i: t["language"] for i, t in enumerate(meta["tasks"])}
    tasks = list(range(len(names[suite]))) if cfg.tasks is None else list(cfg.tasks)
    records = [r for r in load_records(out / "episodes.jsonl") if r.suite == suite]
    if cfg.videos != "none":
        encode_videos(out, suite, language)
    steps = sum(r.length for r in records)
    return {
        "suites": aggregate(records, [suite], {suite: tasks}, names),
        "agent": agent_info,
        "simulator": "robosuite",
        "protocol": (
            f"Protocol: real LIBERO in its reference simulator (robosuite, `.venv-libero`): "
            f"{cfg.episodes} initial states per task from state {cfg.first_state} (0..49 official, 50..99 "
            f"sampled by LIBERO's placement initializer), one episode each, "
            f"env seed {libero.SEED}, {libero.NUM_WAIT_STEPS} wait steps, at most "
            f"{cfg.max_steps or libero.max_steps(suite)} policy steps, images {cfg.image_size} px rotated "
            f"by 180 degrees, 8-D state, a new chunk every "
            f"{cfg.action_steps or 'chunk'}{' actions' if cfg.action_steps else ''}; "
            f"policy from {cfg.server or 'embodied-serve'}."
        ),
        "config": {k: v for k, v in cfg.__dict__.items()} | {"suites": [suite]},
        "device": cfg.device,
        "wall_s": round(time.perf_counter() - start, 1),
        "env_steps": steps,
        "latency": {},
        "env_steps_per_s": round(steps / max(time.perf_counter() - start, 1e-9), 2),
        "interrupted": interrupted,
    }
