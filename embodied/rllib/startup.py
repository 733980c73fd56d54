"""Ray start-up for a training run: start or join the cluster, check that it holds the GPUs asked
for, and describe where the env runners and learners were placed."""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path
from typing import Any, Optional, Protocol


class RayRuntime(Protocol):
    """What start-up reads of a runtime config (``embodied.runners.train.RuntimeConfig``)."""

    address: Optional[str]
    num_cpus: Optional[int]
    num_env_runners: int
    num_learners: int
    num_gpus_per_env_runner: float


class GPUShortageError(ValueError):
    """The Ray cluster has fewer GPUs than the run asks for."""


def start_ray(runtime: RayRuntime, out: Path) -> bool:
    """Start (or join) Ray with the dashboard off and the session files in the run folder; True if
    this process started it."""
    import ray

    if ray.is_initialized():
        return False
    env_vars = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    if runtime.address:
        ray.init(address=runtime.address, runtime_env={"env_vars": env_vars}, log_to_driver=False)
        return True
    ray_dir = short_ray_dir(out / "ray")
    num_cpus = runtime.num_cpus or runtime.num_env_runners + runtime.num_learners + 1
    ray.init(
        num_cpus=num_cpus,
        include_dashboard=False,
        _temp_dir=str(ray_dir),
        log_to_driver=False,
        runtime_env={"env_vars": env_vars},
        configure_logging=False,
    )
    return True


def short_ray_dir(folder: Path) -> Path:
    """``folder`` (created) as Ray's temp dir: itself, or a short symlink to it in the system's temp
    dir when its path is too long for Ray's unix sockets (temp dir + ~65 bytes under 108)."""
    temp = folder.resolve()
    temp.mkdir(parents=True, exist_ok=True)
    if len(str(temp)) <= 40:
        return temp
    link = Path(tempfile.gettempdir()) / f"ray-{hashlib.sha1(str(temp).encode()).hexdigest()[:10]}"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(temp, target_is_directory=True)
    return link


def check_gpus(runtime: RayRuntime, gpus_per_learner: float) -> None:
    """Raise :class:`GPUShortageError` when the Ray cluster cannot hold the GPUs asked for (Ray would
    otherwise wait for them forever)."""
    import ray

    need = gpus_per_learner * max(runtime.num_learners, 1) + runtime.num_gpus_per_env_runner * runtime.num_env_runners
    have = float(ray.cluster_resources().get("GPU", 0.0))
    if need > have + 1e-9:
        raise GPUShortageError(
            f"the run asks for {need:g} GPUs (learners {gpus_per_learner:g} x "
            f"{max(runtime.num_learners, 1)}, env runners {runtime.num_gpus_per_env_runner:g} x "
            f"{runtime.num_env_runners}) but the Ray cluster has {have:g}: lower "
            "runtime.num_gpus_per_learner / runtime.num_gpus_per_env_runner, or use device=cpu"
        )


def describe_placement(placement: dict[str, Any]) -> str:
    """One line on where the env runners and learners run (Ray nodes by IP and short node id)."""

    def node(where: dict[str, Any]) -> str:
        return f"{where['ip']}/{where['node_id'][:8]}"

    parts = placement["env_runners"] + placement["learners"] + [placement["driver"]]
    nodes = {p["node_id"] for p in parts}
    return (
        f"placement on {len(nodes)} Ray node(s): env runners on "
        f"{', '.join(node(w) for w in placement['env_runners'])}; learners on "
        f"{', '.join(node(w) for w in placement['learners'])}; driver on {node(placement['driver'])}"
    )
