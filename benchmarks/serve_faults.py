"""The policy server and client under faults, measured: a full server that still lets the robot's client in,
and a deployment that holds through a server restart.

    .venv/bin/python benchmarks/serve_faults.py --out runs/serve_faults.json

1. Exhaustion: ``--idle`` authenticated websocket sessions that never send a request (a client that leaks
   connections) and ``--silent`` TCP sockets that never finish a handshake are held open against an
   ``embodied-serve`` server (its default cap of sessions); then the robot's client connects and asks for
   one chunk, ``--repeats`` times with new sessions each time. Reported: the seconds from connecting to
   the chunk (median, largest), and the sessions the server closed to make room (``/healthz``).
2. Restart: a simulated robot (``SimRobot``, goal task 8, 32 px) runs an episode of ``--steps`` steps against
   the server; at step 8 the server is stopped and, ``--down-s`` seconds later, started again on the same
   port. Reported: how the episode ended, the seconds the robot held, the reconnects, the commands sent
   while the server was away (must be 0).

A tiny random flow policy (the test suite's served size) on the CPU; both parts in this process, the
server in a thread (:class:`real_robot.server.ServerThread`).
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import torch

import policies
from real_robot import protocol
from real_robot.client import DeployConfig, Deployer
from real_robot.policy_client import PolicyClient
from real_robot.robots.sim_robot import SimRobot
from real_robot.server import PolicyServer, ServerThread

TINY = dict(d_model=32, image_size=32, vision_channels=[8, 16], prefix_layers=1, expert_layers=1)
KEY = "k3y"


def _server() -> PolicyServer:
    torch.manual_seed(0)
    return PolicyServer(policies.make("flow", chunk_size=6, **TINY), api_key=KEY)


def _request() -> dict[str, Any]:
    """One request as an openpi client sends it (the tiny policy's 15-D state, two 32 px views)."""
    return {
        "observation/state": np.zeros(15, np.float32),
        "observation/images/agentview": np.zeros((32, 32, 3), np.uint8),
        "observation/images/wrist": np.zeros((32, 32, 3), np.uint8),
        "prompt": "lift the can",
    }


def exhaustion(idle: int, silent: int, repeats: int) -> dict[str, Any]:
    """The robot client's connect-to-chunk seconds with ``idle`` idle sessions and ``silent`` sockets open."""
    from websockets.sync.client import connect

    srv = _server()
    seconds: list[float] = []
    with ServerThread(srv) as port:
        for _ in range(repeats):
            held, sockets = [], []
            try:
                for _ in range(idle):
                    ws = connect(
                        f"ws://127.0.0.1:{port}", compression=None, additional_headers=protocol.auth_headers(KEY)
                    )
                    ws.recv(timeout=10)  # the metadata: an authenticated session, now idle
                    held.append(ws)
                sockets = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(silent)]
                t0 = time.perf_counter()
                robot = PolicyClient(f"ws://127.0.0.1:{port}", api_key=KEY, timeout=10.0)
                robot.connect()
                actions = robot.infer(_request(), timeout=10.0)[0]
                seconds.append(time.perf_counter() - t0)
                robot.close()
                assert np.isfinite(actions).all()
            finally:
                for ws in held:
                    ws.close()
                for sock in sockets:
                    sock.close()
        health = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10).read())
    return {
        "idle_sessions": idle,
        "silent_sockets": silent,
        "max_connections": srv.max_connections,
        "repeats": repeats,
        "client_s_median": round(statistics.median(seconds), 3),
        "client_s_max": round(max(seconds), 3),
        "evicted": health["evicted_connections"],
        "refused": health["refused_connections"],
    }


def restart(steps: int, down_s: float) -> dict[str, Any]:
    """An episode through a server stopped at step 8 and started again ``down_s`` seconds later."""
    first = ServerThread(_server())
    port = first.start()
    again: list[ServerThread] = []
    sent_while_away: list[bool] = []

    def bounce() -> None:
        first.stop()
        time.sleep(down_s)
        thread = ServerThread(_server(), port=port)
        thread.start()
        again.append(thread)

    robot = SimRobot(suite="goal", task=8, image_size=32, realtime=True)
    robot.connect()
    dep = Deployer(
        robot,
        PolicyClient(f"ws://127.0.0.1:{port}", api_key=KEY),
        DeployConfig(mode="async", max_steps=steps),
        robot.instruction,
    )
    send = robot.send_action

    def watched(action: np.ndarray) -> np.ndarray:
        sent_while_away.append(dep._outage is not None)
        return send(action)

    robot.send_action = watched  # type: ignore[method-assign]

    def on_step(step: int, obs: Any, sent: Any) -> None:
        if step == 8:
            threading.Thread(target=bounce, daemon=True).start()

    try:
        res = dep.run_episode(on_step=on_step)
    finally:
        dep.close()
        robot.disconnect()
        for thread in again:
            thread.stop()
    return {
        "steps": res.steps,
        "reason": str(res.reason),
        "down_s": down_s,
        "server_hold_s": round(res.server_hold_s, 3),
        "reconnects": res.reconnects,
        "commands_while_away": int(sum(sent_while_away)),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--idle", type=int, default=50)
    ap.add_argument("--silent", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--down-s", type=float, default=2.0)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    report = {
        "exhaustion": exhaustion(args.idle, args.silent, args.repeats),
        "restart": restart(args.steps, args.down_s),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
