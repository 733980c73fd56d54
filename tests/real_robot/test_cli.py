"""The commands (real_robot/cli.py): embodied-serve as a process, killed mid-episode, and
embodied-serve with embodied-deploy recording a dataset."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
from conftest import SERVED_TINY as TINY

import policies
from real_robot.client import DeployConfig, Deployer
from real_robot.policy_client import PolicyClient, ReconnectPolicy
from real_robot.robots.sim_robot import SimRobot

BIN = Path(sys.executable).parent


def test_killing_the_server_mid_episode_holds_then_stops(tmp_path):
    """embodied-serve as a process, SIGKILLed mid-episode: the client holds from the next control
    period while it tries to reconnect, then gives up and stops (and disconnects) the robot."""
    ckpt = policies.save(policies.make("flow", chunk_size=6, **TINY), tmp_path / "ckpt")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        [str(BIN / "embodied-serve"), f"checkpoint={ckpt}", "port=0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        port = _port_of(proc)
        robot = SimRobot(suite="goal", task=8, image_size=32, realtime=True)
        robot.connect()
        dep = Deployer(
            robot,
            PolicyClient(f"ws://127.0.0.1:{port}", reconnect=ReconnectPolicy(max_total_s=1.0)),
            DeployConfig(mode="async", max_steps=400, hold_timeout_s=0.2, stop_timeout_s=0.8),
            robot.instruction,
        )
        killed_at: list[int] = []

        def kill(step, obs, sent):
            if step == 15:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                killed_at.append(step)

        res = dep.run_episode(on_step=kill)
        dep.close()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert res.reason == "server_lost" and not robot.connected and res.steps < 400
    assert res.server_hold_s > 0 and "gave up reconnecting" in dep.last_error
    after = res.actions[killed_at[0] + 2 :]
    assert after and all(np.abs(a[:6]).max() == 0 for a in after)  # holding still


def _port_of(proc: subprocess.Popen) -> int:
    deadline = time.time() + 120
    port = None
    while time.time() < deadline and port is None:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            raise RuntimeError("embodied-serve exited")
        if "listening on port" in line:
            port = int(line.rsplit(" ", 1)[-1])
    assert port is not None, "embodied-serve did not report its port"
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz")
            return port
        except urllib.error.HTTPError:
            time.sleep(0.2)
    raise RuntimeError("embodied-serve never became ready")


def test_serve_and_deploy_commands_record_a_dataset(tmp_path):
    from embodied.data.lerobot_format import Dataset

    ckpt = policies.save(policies.make("flow", chunk_size=6, **TINY), tmp_path / "ckpt")
    env = dict(os.environ, OMP_NUM_THREADS="1", EMBODIED_API_KEY="k3y")
    proc = subprocess.Popen(
        [str(BIN / "embodied-serve"), f"checkpoint={ckpt}", "port=0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        port = _port_of(proc)
        out = tmp_path / "deploy"
        run = subprocess.run(
            [
                str(BIN / "embodied-deploy"),
                f"server=ws://127.0.0.1:{port}",
                f"out={out}",
                "sim.image_size=32",
                "episodes=2",
                "max_steps=12",
                "mode=rtc",
                "reconnect.max_total_s=5",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
            check=False,
        )
        assert run.returncode == 0, run.stderr[-3000:]
        wrong = subprocess.run(
            [
                str(BIN / "embodied-deploy"),
                f"server=ws://127.0.0.1:{port}",
                f"out={tmp_path / 'd2'}",
                "api_key=nope",
                "sim.image_size=32",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
            check=False,
        )
        assert wrong.returncode != 0 and "401" in wrong.stderr
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
    summary = json.loads((out / "deploy.json").read_text())
    assert [e["steps"] for e in summary["episodes"]] == [12, 12] and "api_key" not in summary["config"]
    assert [(e["server_hold_s"], e["reconnects"]) for e in summary["episodes"]] == [(0.0, 0), (0.0, 0)]
    assert summary["config"]["reconnect"]["max_total_s"] == 5
    data = Dataset(out / "dataset")
    assert data.num_episodes == 2 and len(data) == 24
    ep = data.episode(0)
    assert ep["action"].shape == (12, 7)
