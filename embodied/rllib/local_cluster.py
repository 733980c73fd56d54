"""A Ray cluster of two nodes on one machine, for failure drills (``tests/embodied/test_node_loss.py``,
``benchmarks/node_loss.py``): a head and a worker node, each its own raylet and object store, joined
by address as ``ray start --head`` / ``ray start --address`` nodes are, and a way to lose the worker
node as a machine would (every process of it killed at once)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class LocalCluster:
    """``address`` for ``runtime.address``; ``head_id`` and ``worker_id`` the two nodes' Ray ids."""

    cluster: Any  # ray.cluster_utils.Cluster
    worker: Any  # the worker node (ray._private.node.Node)

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    @property
    def head_id(self) -> str:
        return str(self.cluster.head_node.node_id)

    @property
    def worker_id(self) -> str:
        return str(self.worker.node_id)

    def kill_worker_node(self) -> list[int]:
        """SIGKILL every process of the worker node at once (its raylet and the Ray workers it started:
        the env runners placed there); returns their pids."""
        import psutil
        from ray._private import ray_constants

        raylet = self.worker.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid
        own = [info.process.pid for infos in self.worker.all_processes.values() for info in infos]
        children = [p.pid for p in psutil.Process(raylet).children(recursive=True)]
        pids = sorted(set(own + children))
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.cluster.remove_node(self.worker, allow_graceful=False)  # reaps what it started
        return pids


@contextmanager
def local_cluster(
    folder: Path, *, head_cpus: int, worker_cpus: int, system_config: dict[str, Any] | None = None
) -> Iterator[LocalCluster]:
    """A head with ``head_cpus`` CPUs and a worker node with ``worker_cpus``, no dashboard, Ray's
    files in ``folder``; shut down on exit. ``system_config``: Ray's internal settings for the
    cluster (e.g. ``health_check_period_ms``, as ``RAY_<name>=...`` before ``ray start --head``)."""
    import ray._private.utils
    from ray.cluster_utils import Cluster

    from embodied.rllib.startup import short_ray_dir

    temp = short_ray_dir(folder)
    write_address = ray._private.utils.write_ray_address
    # the helper records its address in /tmp/ray for a later bare `ray.init()` on this machine, which
    # another run there would then join: nothing here needs it
    ray._private.utils.write_ray_address = lambda *args, **kwargs: None
    try:
        head: dict[str, Any] = {"num_cpus": head_cpus, "include_dashboard": False, "temp_dir": str(temp)}
        if system_config:
            head["_system_config"] = dict(system_config)
        cluster = Cluster(initialize_head=True, head_node_args=head)
    finally:
        ray._private.utils.write_ray_address = write_address
    try:
        worker = cluster.add_node(num_cpus=worker_cpus)
        yield LocalCluster(cluster, worker)
    finally:
        cluster.shutdown()
