"""Policy-server latency (``embodied-bench bench=serve``): websocket round trip against in-process inference.

An ``embodied-serve`` process serves a bundle (``checkpoint``, or the default flow policy saved
into the run folder) on localhost. ``rounds * requests`` timed calls, alternating one by one:
in-process ``policy.sample`` on the same observation (batch 1, greedy, the preprocessing the
server does included) and the round trip through :class:`real_robot.policy_client.PolicyClient`
(encode, send, server decode/validate/infer/encode, receive, decode). Quoted: p50 / p95 of both and
the overhead (round trip p50 - in-process p50; target <= ``target_overhead_ms``). Then
``clients`` concurrent clients (threads) send requests for ``concurrency_seconds``: requests/s
against one client, and the server's batch sizes. Outputs ``serve.json`` and ``serve.csv``.
"""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from benchmarks.config import BenchConfig, BenchError
from embodied.runs import machine_info, write_json


@dataclass
class ServeBenchConfig(BenchConfig):
    """``bench=serve``: round-trip latency over localhost and requests/s with concurrent clients."""

    checkpoint: Optional[str] = None  # a bundle; default: the default flow policy (random weights)
    image_size: int = 64  # camera frames sent per request (square)
    requests: int = 50  # timed requests per round and path
    rounds: int = 3
    warmup: int = 5
    clients: int = 4
    concurrency_seconds: float = 5.0
    target_overhead_ms: float = 2.0
    port: int = 0  # 0: any free port


SCHEMA = ServeBenchConfig


def _observation(spec: Any, size: int, rng: np.random.Generator) -> dict[str, Any]:
    from real_robot.spec import IMAGE_PREFIX, PROMPT_KEY, STATE_KEY

    obs = {STATE_KEY: rng.standard_normal(spec.state_dim).astype(np.float32), PROMPT_KEY: "lift the can"}
    for cam in spec.cameras:
        obs[IMAGE_PREFIX + cam] = rng.integers(0, 255, (size, size, 3), dtype=np.uint8)
    return obs


def _start_server(ckpt: Path, port: int) -> tuple[subprocess.Popen, int]:
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "embodied-serve"), f"checkpoint={ckpt}", f"port={port}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    deadline = time.time() + 180
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            raise BenchError("embodied-serve exited before it was ready")
        if "listening on port" in line:
            bound = int(line.rsplit(" ", 1)[-1])
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{bound}/healthz")
                return proc, bound
            except urllib.error.URLError:
                pass
    proc.kill()
    raise BenchError("embodied-serve did not become ready within 180 s")


def run(cfg: ServeBenchConfig, out: Path) -> dict[str, Any]:
    import torch

    import policies
    from policies.io import policy_inputs
    from real_robot.policy_client import PolicyClient
    from real_robot.spec import PolicySpec

    torch.set_num_threads(1)
    if cfg.checkpoint:
        ckpt = Path(cfg.checkpoint)
    else:
        ckpt = policies.save(policies.make("flow"), out / "bench_policy")
    policy = policies.load(ckpt).eval()
    spec = PolicySpec.from_policy(policy)
    rng = np.random.default_rng(cfg.seed)
    obs = _observation(spec, cfg.image_size, rng)
    validated = spec.validate(obs)
    gen = torch.Generator().manual_seed(0)

    def in_process() -> float:
        t0 = time.perf_counter()
        batch = policy_inputs(validated["rgb"][None], validated["state"][None], [validated["prompt"]])
        with torch.no_grad():
            policy.sample(batch, mode="greedy", generator=gen).actions.numpy()
        return time.perf_counter() - t0

    proc, port = _start_server(ckpt, cfg.port)
    try:
        client = PolicyClient(f"ws://127.0.0.1:{port}")
        client.connect()

        def round_trip() -> float:
            t0 = time.perf_counter()
            client.infer(obs)
            return time.perf_counter() - t0

        for _ in range(cfg.warmup):
            in_process()
            round_trip()
        local, remote, server_infer = [], [], []
        for _ in range(cfg.rounds * cfg.requests):  # interleaved: drifts of the machine hit both alike
            local.append(in_process())
            t0 = time.perf_counter()
            _, timing = client.infer(obs)
            remote.append(time.perf_counter() - t0)
            server_infer.append(timing["infer_ms"] / 1e3)
        client.close()

        def hammer(n_clients: int) -> dict[str, Any]:
            counts = [0] * n_clients
            batches: list[int] = []
            stop = time.perf_counter() + cfg.concurrency_seconds

            def worker(i: int) -> None:
                c = PolicyClient(f"ws://127.0.0.1:{port}")
                c.connect()
                while time.perf_counter() < stop:
                    _, timing = c.infer(obs)
                    counts[i] += 1
                    batches.append(int(timing["batch_size"]))
                c.close()

            threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_clients)]
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            secs = time.perf_counter() - t0
            return {
                "clients": n_clients,
                "requests": sum(counts),
                "seconds": round(secs, 2),
                "requests_per_s": round(sum(counts) / secs, 1),
                "mean_batch": float(np.mean(batches)),
            }

        single = hammer(1)
        many = hammer(cfg.clients)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)

    def pct(v: list[float], q: float) -> float:
        return round(float(np.percentile(v, q)) * 1e3, 3)

    result = {
        "config": asdict(cfg),
        "machine": machine_info(),
        "checkpoint": str(ckpt),
        "in_process_ms": {"p50": pct(local, 50), "p95": pct(local, 95)},
        "round_trip_ms": {"p50": pct(remote, 50), "p95": pct(remote, 95)},
        "server_infer_ms": {"p50": pct(server_infer, 50), "p95": pct(server_infer, 95)},
        "concurrency": {
            "single": single,
            "many": many,
            "speedup": round(many["requests_per_s"] / max(single["requests_per_s"], 1e-9), 2),
        },
    }
    result["overhead_ms_p50"] = round(result["round_trip_ms"]["p50"] - result["in_process_ms"]["p50"], 3)
    result["meets_target"] = result["overhead_ms_p50"] <= cfg.target_overhead_ms
    write_json(out / "serve.json", result)
    with open(out / "serve.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["path", "p50_ms", "p95_ms"])
        w.writerow(["in_process", result["in_process_ms"]["p50"], result["in_process_ms"]["p95"]])
        w.writerow(["round_trip", result["round_trip_ms"]["p50"], result["round_trip_ms"]["p95"]])
        w.writerow(["clients_1_req_per_s", single["requests_per_s"], ""])
        w.writerow([f"clients_{cfg.clients}_req_per_s", many["requests_per_s"], ""])
    print(
        f"in-process p50 {result['in_process_ms']['p50']:.2f} ms, round trip p50 "
        f"{result['round_trip_ms']['p50']:.2f} ms (p95 {result['round_trip_ms']['p95']:.2f}): overhead {result['overhead_ms_p50']:.2f} ms "
        f"(target <= {cfg.target_overhead_ms}); 1 client {single['requests_per_s']} req/s, {cfg.clients} clients "
        f"{many['requests_per_s']} req/s (mean batch {many['mean_batch']:.2f})",
        flush=True,
    )
    return result
