"""``embodied-serve`` and ``embodied-deploy``: the deployment bridge's two commands (Hydra apps).

    embodied-serve checkpoint=runs/pipeline/rl/checkpoint/policy port=8000 [api_key=KEY]
    embodied-deploy server=ws://127.0.0.1:8000 robot=sim sim.task=8 episodes=3 out=runs/deploy [mode=rtc]
    embodied-deploy server=ws://HOST:8000 robot=network robot_address=ws://ROBOT_PC:8765 instruction="..." out=...
    embodied-deploy check=true robot=franka franka.host=172.16.0.2 out=runs/check     # no motion: run first

The API key may also come from the environment (``EMBODIED_API_KEY``), which keeps it out of the
shell history and the run folder's saved config.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional

import numpy as np
from omegaconf import MISSING, OmegaConf

from embodied.config import hydra_app, store
from real_robot.cameras.base import CameraConfig
from real_robot.policy_client import ReconnectPolicy
from real_robot.robots.franka import FrankaConfig
from real_robot.robots.ur import URConfig
from sims.registry import Registry

log = logging.getLogger(__name__)


@dataclass
class ServeConfig:
    """Schema of ``embodied-serve``."""

    checkpoint: str = MISSING  # a policy bundle (policies.save)
    host: str = "127.0.0.1"  # 0.0.0.0 to accept other machines (use api_key then)
    port: int = 8000
    api_key: Optional[str] = None  # required from clients when set (or EMBODIED_API_KEY)
    device: str = "cpu"
    max_message_mb: float = 8.0  # larger requests close their connection
    max_batch: int = 8  # concurrent requests batched through the model at most
    batch_window_ms: float = 0.0  # extra wait for more requests to batch (0: batch what is already waiting)
    seed: int = 0
    idle_timeout_s: float = 300.0  # a connection that starts no message this long after its last reply is closed
    message_timeout_s: float = 10.0  # ... and one that takes longer to finish a message or take a reply
    open_timeout_s: float = 10.0  # the websocket handshake's deadline
    max_connections: int = 32  # more open connections are refused (HTTP 503)
    precision: str = "fp32"  # fp32 | bf16: the weights held in bfloat16 and inference under bf16 autocast
    compile: bool = False  # torch.compile the policy's heavy submodules (eager, with a warning, where it cannot)
    default_prompt: Optional[str] = None  # the instruction of a request without one (openpi's ALOHA client)


@dataclass
class SimRobotOptions:
    """``robot=sim``: the MuJoCo rehearsal robot (real_robot/robots/sim_robot.py)."""

    suite: str = "goal"
    task: int = 8
    init_id: int = 0  # fixed initial state of the first episode (the next episodes take the following ids)
    image_size: int = 64
    realtime: bool = True
    obs_latency_steps: int = 0
    action_delay_steps: int = 0
    camera_noise_std: float = 0.0
    color_shift: float = 0.0
    mass_scale: float = 1.0
    friction_scale: float = 1.0
    damping_scale: float = 1.0


@dataclass
class DeployAppConfig:
    """Schema of ``embodied-deploy``."""

    out: str = MISSING  # run folder: deploy.json, dataset/ (the episodes, demonstration format)
    server: str = "ws://127.0.0.1:8000"
    api_key: Optional[str] = None  # or EMBODIED_API_KEY
    robot: str = "sim"  # sim | network | franka | ur (ROBOTS)
    robot_address: Optional[str] = None  # robot=network: ws://ROBOT_PC:PORT of the robot adapter
    sim: SimRobotOptions = field(default_factory=SimRobotOptions)
    franka: FrankaConfig = field(default_factory=FrankaConfig)  # robot=franka (real_robot/robots/franka.py)
    ur: URConfig = field(default_factory=URConfig)  # robot=ur (real_robot/robots/ur.py)
    # robot=franka|ur: cameras=[{name: agentview, kind: opencv, source: "0"}, {name: wrist, kind: realsense}]
    cameras: list[CameraConfig] = field(default_factory=list)
    check: bool = False  # connect, read and verify the robot, hold, disconnect (no motion, no policy server)
    instruction: Optional[str] = None  # default: the sim task's instruction (required for robot=network)
    mode: str = "async"  # sync | async | rtc | aware (a policy trained with latency_delays)
    threshold: Optional[int] = None
    episodes: int = 1
    max_steps: int = 300
    hold_timeout_s: float = 0.25
    stop_timeout_s: float = 1.0
    stall_timeout_s: float = 0.5
    record: bool = True
    estop_keyboard: bool = False  # 'e' + Enter on stdin triggers the emergency stop
    # when the policy server goes away mid-episode: the robot holds while the client reconnects with this
    # backoff; past it the episode ends as server_lost and the deployment stops
    reconnect: ReconnectPolicy = field(default_factory=ReconnectPolicy)


store("serve_schema", ServeConfig)
store("deploy_schema", DeployAppConfig)


@hydra_app("embodied-serve", "serve")
def serve_main(cfg) -> None:
    import policies
    from policies.precision import PRECISIONS, compile_policy
    from real_robot.server import PolicyServer

    c: ServeConfig = OmegaConf.to_object(cfg)  # type: ignore[assignment]
    if c.precision not in PRECISIONS:
        raise SystemExit(f"embodied-serve: precision={c.precision!r}: {PRECISIONS.unknown(c.precision)}")
    try:
        policy = policies.load(c.checkpoint, device=c.device)
    except (policies.CheckpointError, FileNotFoundError) as err:
        raise SystemExit(f"embodied-serve: {err}") from None
    server = PolicyServer(
        policy,
        api_key=c.api_key or os.environ.get("EMBODIED_API_KEY"),
        max_message_bytes=int(c.max_message_mb * 1024 * 1024),
        max_batch=c.max_batch,
        batch_window_ms=c.batch_window_ms,
        seed=c.seed,
        idle_timeout_s=c.idle_timeout_s,
        message_timeout_s=c.message_timeout_s,
        open_timeout_s=c.open_timeout_s,
        max_connections=c.max_connections,
        precision=c.precision,
        default_prompt=c.default_prompt,
    )
    numerics = f"precision {c.precision}" + (f", compiled {compile_policy(policy) or 'nothing'}" if c.compile else "")
    print(
        f"embodied-serve: {policy.family} policy {c.checkpoint} on ws://{c.host}:{c.port} "
        f"(API key {'required' if server.api_key else 'off'}; {numerics}); warming up ...",
        flush=True,
    )
    try:
        asyncio.run(server.serve(c.host, c.port, announce=True))
    except KeyboardInterrupt:
        pass
    except OSError as err:
        raise SystemExit(f"embodied-serve: cannot listen on {c.host}:{c.port}: {err}") from None


def _sim_robot(c: DeployAppConfig) -> Any:
    from real_robot.robots.sim_robot import SimRobot, SimRobotConfig

    return SimRobot(SimRobotConfig(**asdict(c.sim)))


def _network_robot(c: DeployAppConfig) -> Any:
    from real_robot.robots.network import NetworkRobot

    if not c.robot_address:
        raise SystemExit("embodied-deploy: robot=network needs robot_address=ws://ROBOT_PC:PORT")
    return NetworkRobot(c.robot_address, api_key=c.api_key or os.environ.get("EMBODIED_API_KEY"))


def _cameras(c: DeployAppConfig) -> dict[str, Any]:
    from real_robot.cameras.base import make_cameras

    return make_cameras(c.cameras)


def _franka_robot(c: DeployAppConfig) -> Any:
    from real_robot.robots.franka import FrankaRobot

    return FrankaRobot(c.franka, _cameras(c))


def _ur_robot(c: DeployAppConfig) -> Any:
    from real_robot.robots.ur import URRobot

    return URRobot(c.ur, _cameras(c))


#: ``robot=`` of embodied-deploy: the robot each name builds from the app's config
ROBOTS: Registry[Callable[[DeployAppConfig], Any]] = Registry(
    "robot", {"sim": _sim_robot, "network": _network_robot, "franka": _franka_robot, "ur": _ur_robot}
)


def _make_robot(c: DeployAppConfig) -> Any:
    try:
        return ROBOTS.lookup(c.robot)(c)
    except ValueError as err:  # an unknown robot or camera kind, an unsound spec
        raise SystemExit(f"embodied-deploy: {err}") from None


def _check(c: DeployAppConfig, robot: Any, out: Any) -> None:
    """``check=true``: :func:`~real_robot.robots.check.check_robot`, its report printed and written to
    ``out/check.json``; exits non-zero when anything failed."""
    from embodied.runs import write_json
    from real_robot.robots.check import check_robot

    try:
        report = check_robot(robot)
    except Exception as err:  # a robot that cannot be reached or read fails the check, with the reason
        raise SystemExit(f"embodied-deploy check: robot={c.robot}: {type(err).__name__}: {err}") from None
    write_json(out / "check.json", {"robot": c.robot, "ok": report.ok, **asdict(report)})
    print(f"check robot={c.robot} ({report.robot}): {'passed' if report.ok else 'FAILED'}", *report.lines(), sep="\n")
    if not report.ok:
        raise SystemExit(f"embodied-deploy check: {len(report.failures)} problem(s); {out / 'check.json'}")


def _connected_deployer(c: DeployAppConfig, robot: Any) -> tuple[Any, str]:
    """The robot connected and its :class:`~real_robot.client.Deployer` with the instruction it runs;
    a robot that cannot be reached or a deployer that cannot start exits with the reason."""
    from real_robot.client import DeployConfig, Deployer, DeployError
    from real_robot.policy_client import PolicyClient

    try:
        robot.connect()
    except Exception as err:
        raise SystemExit(f"embodied-deploy: cannot connect to the robot: {err}") from None
    instruction = c.instruction or getattr(robot, "instruction", None)
    if not instruction:
        robot.disconnect()
        raise SystemExit('embodied-deploy: give instruction="..." (the task the policy should do)')
    client = PolicyClient(c.server, api_key=c.api_key or os.environ.get("EMBODIED_API_KEY"), reconnect=c.reconnect)
    timeouts = ("hold_timeout_s", "stop_timeout_s", "stall_timeout_s")
    dcfg = DeployConfig(
        mode=c.mode, threshold=c.threshold, max_steps=c.max_steps, **{k: getattr(c, k) for k in timeouts}
    )
    try:
        deployer = Deployer(robot, client, dcfg, instruction)
    except (DeployError, ConnectionError, ValueError) as err:
        robot.disconnect()
        raise SystemExit(f"embodied-deploy: {err}") from None
    deployer.install_signal_handler()
    if c.estop_keyboard:
        deployer.watch_keyboard()
    return deployer, instruction


def _dataset_writer(c: DeployAppConfig, robot: Any, out: Any) -> Any:
    """``record=true``: the LeRobot-format writer of the run's episodes (``out/dataset``), else None."""
    from embodied.data.lerobot_format import DatasetWriter

    if not c.record:
        return None
    cams = list(robot.spec.cameras)
    state_names, action_names = robot.spec.names()
    return DatasetWriter(
        out / "dataset",
        fps=robot.spec.control_hz,
        cameras=cams,
        image_size=robot.spec.cameras[cams[0]][0] if cams else 0,
        state_names=state_names,
        action_names=action_names,
        privileged_dim=0,
        extra_info={"source": "embodied-deploy", "robot": c.robot, "mode": c.mode},
    )


def _record(writer: Any, res: Any, cams: list[str], instruction: str) -> None:
    """One episode's states, actions and frames ``[T, C, H, W, 3]`` into the dataset, success on its last frame."""
    from embodied.data.lerobot_format import Episode

    t = len(res.actions)
    done, succ = np.zeros(t, bool), np.zeros(t, bool)
    done[-1], succ[-1] = True, res.success
    writer.add_episode(
        Episode(
            task_index=0,
            instruction=instruction,
            state=np.stack(res.states),
            privileged=np.zeros((t, 0), np.float32),
            action=np.stack(res.actions),
            reward=succ.astype(np.float32),
            done=done,
            success=succ,
            rgb=np.stack([np.stack([im[c_] for c_ in cams]) for im in res.images]) if cams else None,
            meta={"reason": res.reason},
        )
    )


def _episode_row(e: int, res: Any) -> dict[str, Any]:
    """``deploy.json``'s record of episode ``e``, printed as one line."""
    print(
        f"episode {e}: {'success' if res.success else 'no success'} ({res.reason}) in {res.steps} steps, "
        f"held {res.held_steps}, safety clips {res.safety_counts}"
        + (
            f", held {res.server_hold_s:.1f} s for the policy server ({res.reconnects} reconnects)"
            if res.server_hold_s
            else ""
        ),
        flush=True,
    )
    trips = res.latency.get("round_trip", {})
    return {
        "episode": e,
        "success": res.success,
        "reason": res.reason,
        "steps": res.steps,
        "held_steps": res.held_steps,
        "starved_steps": res.starved_steps,
        "safety_counts": res.safety_counts,
        "server_hold_s": round(res.server_hold_s, 3),
        "reconnects": res.reconnects,
        "round_trip_ms": {k: round(v * 1e3, 2) for k, v in trips.items() if k != "count"},
    }


def _run_episodes(c: DeployAppConfig, robot: Any, deployer: Any, writer: Any, instruction: str) -> list[dict[str, Any]]:
    """``c.episodes`` episodes (each after the first from a reset robot), until one ends in a way that
    stops the robot (:attr:`~real_robot.loop.exits.ExitReason.stops_robot`) or Ctrl-C; the robot is held
    and disconnected, and the dataset closed, whatever happens."""
    cams = list(robot.spec.cameras)
    episodes: list[dict[str, Any]] = []
    try:
        for e in range(c.episodes):
            if e > 0:
                if not getattr(robot, "connected", True):
                    robot.connect()
                if hasattr(robot, "reset"):
                    robot.reset(c.sim.init_id + e if c.robot == "sim" else None)
            res = deployer.run_episode(record=c.record)
            episodes.append(_episode_row(e, res))
            if writer is not None and res.actions:
                _record(writer, res, cams, instruction)
            if res.exit.stops_robot:
                break
    except KeyboardInterrupt:
        print("interrupted: stopping the robot", file=sys.stderr)
    finally:
        robot.hold()
        robot.disconnect()
        deployer.close()
        if writer is not None and writer.num_episodes:
            writer.close()
    return episodes


@hydra_app("embodied-deploy", "deploy")
def deploy_main(cfg) -> None:
    from embodied.runs import prepare_run_dir, write_json

    c: DeployAppConfig = OmegaConf.to_object(cfg)  # type: ignore[assignment]
    out = prepare_run_dir(c.out)
    robot = _make_robot(c)
    if c.check:
        return _check(c, robot, out)
    deployer, instruction = _connected_deployer(c, robot)
    episodes = _run_episodes(c, robot, deployer, _dataset_writer(c, robot, out), instruction)
    summary = {
        "config": json.loads(json.dumps(OmegaConf.to_container(cfg))),
        "episodes": episodes,
        "success_rate": float(np.mean([r["success"] for r in episodes])) if episodes else 0.0,
    }
    summary["config"].pop("api_key", None)
    write_json(out / "deploy.json", summary)
    print(f"{len(episodes)} episode(s), success rate {summary['success_rate']:.0%}; {out / 'deploy.json'}")
