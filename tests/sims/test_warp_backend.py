"""The mujoco_gpu backend (MuJoCo Warp physics) against the CPU backend: same initial states and
actions give the same trajectory. Runs on Warp's CPU device here (kernels compile once, ~1 min)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sims

pytest.importorskip("mujoco_warp")


def test_warp_physics_matches_the_cpu_backend_on_a_contact_task():
    kw = dict(suite="goal", num_envs=2, seed=0, cameras=("agentview",), image_size=32)
    cpu, warp = sims.make("mujoco", **kw), sims.make("mujoco_gpu", **kw)
    assert warp.physics == "warp" and cpu.physics == "mujoco"
    oa = cpu.reset(task_ids=[8, 8], init_ids=[0, 1])
    ob = warp.reset(task_ids=[8, 8], init_ids=[0, 1])
    expert = sims.suites.expert("goal", num_envs=2)
    expert.reset()
    worst_state = worst_obj = 0.0
    success_cpu = success_warp = torch.zeros(2, dtype=torch.bool)
    # lift the can: approach, grasp (contacts), lift; both envs succeed at step 21 on both backends, then
    # the auto-reset, and the last steps compare the worlds of the next episode
    for _ in range(30):
        act = expert(oa)[:, 0]
        oa, _, _, _, ia = cpu.step(act)
        ob, _, _, _, ib = warp.step(act)
        worst_state = max(worst_state, float((oa["state"] - ob["state"]).abs().max()))
        worst_obj = max(worst_obj, float((oa["privileged"] - ob["privileged"]).abs().max()))
        success_cpu |= ia["success"]
        success_warp |= ib["success"]
    assert worst_state < 1e-3 and worst_obj < 1e-2  # float32 (Warp) against float64 (C)
    assert success_cpu.all() and torch.equal(success_cpu, success_warp)
    assert ob["rgb"].shape == (2, 1, 32, 32, 3) and ob["rgb"].float().std() > 0  # rendering from the Warp state
    active = torch.tensor([True, False])  # a partial step leaves the other world untouched
    before = warp.qpos[1].copy()
    warp.step(torch.zeros(2, 7), active=active)
    assert (warp.qpos[1] == before).all()
    cpu.close()
    warp.close()


def test_embodied_train_steps_warp_envs(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    import policies

    init = policies.save(
        policies.make(
            "flow", expert_layers=1, d_model=32, image_size=32, vision_channels=[8, 16], chunk_size=3, prefix_layers=1
        ),
        tmp_path / "init",
    )
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "embodied-train"),
            f"init={init}",
            f"out={tmp_path / 'rl'}",
            "suite=goal",
            "tasks=[8]",
            "num_envs=2",
            "image_size=32",
            "chunks_per_iter=2",
            "algo.minibatch_size=4",
            "iterations=1",
            "backend=mujoco_gpu",
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "rl" / "checkpoint" / "policy" / "model.safetensors").is_file()


def test_gpu_sim_bench_rows_compare_the_env_with_raw_warp_physics():
    from types import SimpleNamespace

    from benchmarks.sim_gpu import run_gpu_backends

    cfg = SimpleNamespace(
        seed=0,
        gpu_backends=["mujoco_gpu"],
        gpu_num_envs=[2],
        gpu_image_size=32,
        gpu_renderer="auto",
        warmup_steps=1,
        gpu_steps=2,
        gpu_repeats=1,
        gpu_task_logic=["device", "host"],
    )
    rows = run_gpu_backends(cfg)
    assert [(r["backend"], r["camera"], r["task_logic"]) for r in rows] == [
        ("mujoco_gpu", False, "device"),
        ("mujoco_gpu", False, "host"),
        ("mujoco_gpu", True, "device"),
        ("mujoco_gpu", True, "host"),
    ]
    for r in rows:
        assert r["env_steps_per_s"] > 0 and r["raw_physics_steps_per_s"] > 0 and r["env_vs_raw"] > 0
        assert r["device"] == ("cuda" if torch.cuda.is_available() else "cpu")
        assert r["cuda_graph"] == torch.cuda.is_available()


def _lockstep(lead, follow, steps: int, key: str, columns=None) -> tuple[float, torch.Tensor]:
    """Both envs from the first 16 initial states of goal's ``lift_the_can``, stepped with the expert's
    actions on ``lead``'s observations; returns the worst ``|obs[key][:, columns]|`` difference over
    the envs whose episode has ended in neither (after an end the auto-reset draws the next initial
    state), and that alive mask [N]."""
    n = lead.num_envs
    oa = lead.reset(task_ids=[8] * n, init_ids=list(range(n)))
    ob = follow.reset(task_ids=[8] * n, init_ids=list(range(n)))
    expert = sims.suites.expert("goal", num_envs=n)
    expert.reset()
    alive = torch.ones(n, dtype=torch.bool)
    worst = 0.0
    for _ in range(steps):
        act = expert(oa)[:, 0]
        oa, _, ta, ua, _ = lead.step(act)
        ob, _, tb, ub, _ = follow.step(act)
        alive &= ~(ta | ua | tb | ub)
        if alive.any():
            diff = oa[key] - ob[key]
            worst = max(worst, float((diff if columns is None else diff[:, columns])[alive].abs().max()))
    return worst, alive


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graph_replay_steps_like_kernel_by_kernel_launches():
    """The captured CUDA graph of a control step's physics gives the robot trajectory of launching each
    MuJoCo Warp step one by one (16 worlds, the expert's approach and grasp)."""
    kw = dict(suite="goal", num_envs=16, seed=0, cameras=())
    graph, plain = sims.make("mujoco_gpu", **kw), sims.make("mujoco_gpu", **kw)
    plain.sim.cuda_graph = False
    assert graph.sim.cuda_graph and str(graph.sim.device).startswith("cuda")
    worst, alive = _lockstep(graph, plain, 40, "state")
    assert alive.sum() >= 8 and worst < 1e-3  # float32 kernels; only atomics' order may differ
    assert graph.sim._graphs  # the replayed graph was used
    graph.close()
    plain.close()


def test_warp_objects_follow_the_cpu_backend_on_every_initial_state():
    """Object positions on 16 fixed initial states under the same expert actions (the C backend's),
    until an episode ends. On the Warp backend objects rest on a plane at the table top: with the
    table's box, MuJoCo Warp 4.0.0's convex cylinder-box collision returned a phantom contact (dist
    about -0.55 m, the table's half-width) that launched the can in 3 of these 16 states
    (``SceneOptions.table_top_plane``)."""
    from sims.mujoco.suites.base import OBJ_STRIDE

    kw = dict(suite="goal", num_envs=16, seed=0, cameras=())
    cpu, warp = sims.make("mujoco", **kw), sims.make("mujoco_gpu", **kw)
    n_obj = cpu.task.privileged_dim // OBJ_STRIDE  # object blocks first, then drawers and carriages
    positions = [k * OBJ_STRIDE + i for k in range(n_obj) for i in range(3)]
    # 24 steps: every one of the 16 episodes has ended by then (the expert's lift succeeds around step 21),
    # and the steps after the last end compared nothing
    worst, alive = _lockstep(cpu, warp, 24, "privileged", positions)
    cpu.close()
    warp.close()
    assert worst < 0.02 and not alive.any()


def _compare_task_logic(suite: str, task_ids: list[int], steps: int, **kw) -> dict[str, float]:
    """The same Warp worlds with the task logic on the host (numpy) and on the device (torch views),
    stepped with the same actions (the goal expert's on its lead env, random on the others); returns
    the worst difference per output and checks the done flags are equal at every step."""
    n = len(task_ids)
    kw = dict(suite=suite, num_envs=n, seed=0, **kw)
    host, dev = sims.make("mujoco_gpu", task_logic="host", **kw), sims.make("mujoco_gpu", **kw)
    assert (host.task_logic, dev.task_logic) == ("host", "device") and host.sim.auto_sync and not dev.sim.auto_sync
    oa = host.reset(task_ids=task_ids, init_ids=list(range(n)))
    ob = dev.reset(task_ids=task_ids, init_ids=list(range(n)))
    expert = sims.suites.expert(suite, num_envs=n)
    expert.reset()
    gen = torch.Generator().manual_seed(1)
    worst = {"state": 0.0, "privileged": 0.0, "reward": 0.0, "rgb": 0.0}
    dones = 0
    for i in range(steps):
        act = torch.rand(n, 7, generator=gen) * 2 - 1
        act[0] = expert(oa)[0, 0]
        active = None if i % 7 != 3 else torch.arange(n) % 2 == 0  # now and then a partial step
        oa, ra, ta, ua, ia = host.step(act, active=active)
        ob, rb, tb, ub, ib = dev.step(act, active=active)
        for key in ("state", "privileged"):
            worst[key] = max(worst[key], float((oa[key] - ob[key]).abs().max()))
        if "rgb" in oa:
            worst["rgb"] = max(worst["rgb"], float((oa["rgb"].float() - ob["rgb"].float()).abs().mean()))
        worst["reward"] = max(worst["reward"], float((ra - rb).abs().max()))
        for a, b in ((ta, tb), (ua, ub), (ia["success"], ib["success"]), (ia["elapsed"], ib["elapsed"])):
            assert torch.equal(a, b), i
        assert torch.equal(oa["task_id"], ob["task_id"])
        dones += int(ia["done"].sum())
        expert.reset(ia["done"])
    # host code reading a field between steps sees the device's state (pulled on first read)
    assert isinstance(dev.qpos, np.ndarray) and np.allclose(dev.qpos, host.qpos, atol=1e-5)
    assert dones > 0  # episode ends and resets happened on both sides
    host.close()
    dev.close()
    return worst


def test_task_logic_on_the_device_matches_the_host():
    """Controller, observations, shaped rewards, success and resets computed on torch views of the
    Warp arrays give what the numpy task logic gives on the host mirrors of the same worlds (float32
    rounding: the controller runs in float64 on both sides), with GL camera views from the pulled state.
    The host arrays are separate copies here (as on a CUDA device), so the row copies of a reset and
    the pulls before host reads are exercised."""
    # 20 steps: every env's episode ends (max_steps=15; the odd envs sit out the partial steps 3, 10, 17)
    # and the reset worlds run a few steps after it
    worst = _compare_task_logic(
        "goal",
        [8, 0, 3, 8],
        20,
        reward_type="shaped",
        max_steps=15,
        cameras=("agentview",),
        image_size=32,
        renderer="gl",
        warp_copy_mirrors=True,
    )
    assert worst["state"] < 1e-5 and worst["privileged"] < 1e-5 and worst["reward"] < 1e-5, worst
    assert worst["rgb"] < 0.5, worst


def test_task_logic_on_the_device_drives_moving_carriages():
    """The dynamic suite's tray servo targets (a task's before_step hook) written on the device."""
    # 12 steps: both episodes end (max_steps=8) and the reset worlds run on, through a partial step (i=10)
    worst = _compare_task_logic("dynamic", [3, 4], 12, reward_type="dense", max_steps=8, cameras=())
    assert worst["state"] < 1e-5 and worst["privileged"] < 1e-5 and worst["reward"] < 1e-5, worst


def test_task_logic_on_the_device_needs_warp_physics():
    with pytest.raises(ValueError, match="task_logic='device'.*mujoco_gpu"):
        sims.make("mujoco", task="reach", num_envs=1, task_logic="device")
    with pytest.raises(ValueError, match="task_logic must be one of"):
        sims.make("mujoco", task="reach", num_envs=1, task_logic="gpu")
