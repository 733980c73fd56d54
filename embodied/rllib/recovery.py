"""One iteration's sampling on the remote env runners, surviving the loss of a runner or its node.

RLlib restarts a lost env runner (``restart_failed_env_runners``: its actor has ``max_restarts``):
Ray runs its constructor again, with the same ``worker_index`` and so the same envs, on a node
with a free CPU, the surviving ones included. The restarted runner holds random weights and fresh
envs. :class:`RemoteSample` asks every runner for its share of the iteration and, for a runner that
was lost on the way, waits for Ray to bring it back, gives it the weights the others sampled with
and asks it again for the same share (same seeds): the iteration is neither lost nor counted twice.

A runner only samples when it holds the weights version the driver sent last
(:meth:`embodied.rllib.env_runner.VecEnvRunner.sample_checked`), so a runner restarted between
two calls (its loss unseen by the driver) is caught too.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import ray

POLL_S = 1.0  # how often the driver looks at the outstanding requests while it waits
PROBE_S = 1.0  # how long a ping of a lost runner may take before the next look
SYNC_S = 60.0  # how long the driver waits for runners to take new weights (a slower one is caught by its version)
MAX_TRIES = 4  # requests for one runner's share of one iteration before the run stops


@dataclass
class Recovery:
    """One env runner lost while the driver waited for its share of ``iteration`` and brought back."""

    iteration: int
    worker_index: int
    cause: str  # "lost": its request failed (process or node gone); "stale": it answered without the weights
    lost_node_id: str  # where it ran before
    node_id: str  # where it runs now
    ip: str
    lost_at: float  # unix time the driver saw the loss
    back_at: float  # unix time it held the current weights again
    weights_version: int

    @property
    def wait_s(self) -> float:
        return self.back_at - self.lost_at

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"wait_s": round(self.wait_s, 3)}


class RunnerLostError(RuntimeError):
    """An env runner did not come back, or failed, while sampling."""


@dataclass
class Weights:
    """The weights the driver sent the runners last (an ObjectRef kept alive for restarted runners)."""

    ref: Any
    version: int


def runner_place(runner: Any) -> dict[str, Any]:
    """Where an env runner runs: its ``worker_index``, Ray node id, IP and pid."""
    import os

    return {
        "worker_index": runner.worker_index or 0,
        "node_id": ray.get_runtime_context().get_node_id(),
        "ip": ray.util.get_node_ip_address(),
        "pid": os.getpid(),
    }


def send_weights(group: Any, weights: Weights, ids: list[int] | None = None) -> list[dict[str, Any]]:
    """Give the remote runners ``ids`` (None: every healthy one) the weights; returns the places of
    those that took them within :data:`SYNC_S` (a runner lost meanwhile is marked unhealthy)."""
    ref, version = weights.ref, weights.version

    def take(runner: Any) -> dict[str, Any]:
        runner.set_weights(ref, version)
        return runner_place(runner)

    return group.foreach_env_runner(take, local_env_runner=False, remote_worker_ids=ids, timeout_seconds=SYNC_S)


def dead_nodes() -> set[str]:
    """Ids of the Ray nodes the cluster has marked dead."""
    return {n["NodeID"] for n in ray.nodes() if not n.get("Alive", False)}


class RemoteSample:
    """Every remote env runner's share of ``iteration``: :meth:`start`, then :meth:`collect`."""

    def __init__(self, group: Any, iteration: int, weights: Weights, nodes: dict[int, str], restart_timeout_s: float):
        self.group = group
        self.iteration = iteration
        self.weights = weights
        self.nodes = nodes  # worker index -> the node it ran on last (updated here)
        self.restart_timeout_s = restart_timeout_s
        self.tag = f"sample{iteration}"
        self.ids = list(range(1, group.num_remote_env_runners() + 1))  # RLlib numbers remote runners from 1
        self.results: dict[int, dict[str, Any]] = {}
        self.asked: dict[int, float] = {}  # outstanding requests: worker index -> unix time asked
        self.lost: dict[int, tuple[float, str]] = {}  # worker index -> (unix time lost, cause)
        self.tries: dict[int, int] = {i: 0 for i in self.ids}
        self.dead_since: dict[int, float] = {}  # outstanding requests on a node marked dead
        self.recoveries: list[Recovery] = []

    def start(self) -> RemoteSample:
        healthy = set(self.group.healthy_env_runner_ids())
        self._ask([i for i in self.ids if i in healthy])
        for i in self.ids:
            if i not in healthy:
                self.lost[i] = (time.time(), "lost")
        return self

    def collect(self) -> list[dict[str, Any]]:
        """The runners' results, by worker index, once every runner has sampled its share."""
        while len(self.results) < len(self.ids):
            for worker, value in self.group.fetch_ready_async_reqs(tags=self.tag, timeout_seconds=POLL_S):
                self._answer(worker, value)
            self._note_lost()
            if self.lost:
                self._bring_back()
            self._check_dead_nodes()
        return [self.results[i] for i in self.ids]

    # -- the steps ----------------------------------------------------------------------------
    def _ask(self, ids: list[int]) -> None:
        for i in ids:
            self.tries[i] += 1
            if self.tries[i] > MAX_TRIES:
                raise RunnerLostError(
                    f"env runner {i} was lost {MAX_TRIES} times while sampling iteration "
                    f"{self.iteration + 1}: see the Ray logs (the run's ray/ folder, or "
                    "/tmp/ray/session_latest/logs on a cluster) for why it keeps dying; 'killed due to memory "
                    "pressure (OOM)' in raylet.err means the runners need more memory than the node has: fewer "
                    "env runners per node, or fewer tasks per runner (each task is a simulator of its own)"
                )
            self.group.foreach_env_runner_async(
                "sample_checked",
                tag=self.tag,
                remote_worker_ids=[i],
                kwargs={"iteration": self.iteration, "weights_version": self.weights.version},
            )
            self.asked[i] = time.time()

    def _answer(self, worker: int, value: dict[str, Any]) -> None:
        self.asked.pop(worker, None)
        self.dead_since.pop(worker, None)
        if "error" in value:
            raise RunnerLostError(
                f"env runner {worker} failed while sampling iteration {self.iteration + 1}:\n{value['error']}"
            )
        if value.get("stale_weights"):  # restarted by Ray since the driver last sent weights
            self.lost[worker] = (time.time(), "stale")
            self._restore([worker])
            return
        self.nodes[worker] = value["node_id"]
        self.results[worker] = value

    def _note_lost(self) -> None:
        """Requests RLlib dropped because their runner failed (it marks the runner unhealthy)."""
        healthy = set(self.group.healthy_env_runner_ids())
        for i in list(self.asked):
            if i not in healthy:
                del self.asked[i]
                self.dead_since.pop(i, None)
                self.lost[i] = (time.time(), "lost")

    def _bring_back(self) -> None:
        """Ping the lost runners; give those Ray has restarted the weights and ask them again."""
        self.group.probe_unhealthy_env_runners(timeout_seconds=PROBE_S)
        healthy = set(self.group.healthy_env_runner_ids())
        back = [i for i in self.lost if i in healthy and i not in self.asked]
        if back:
            self._restore(back)
        now = time.time()
        for i, (since, _) in self.lost.items():
            if now - since > self.restart_timeout_s:
                raise RunnerLostError(self._not_back(i, now - since))

    def _restore(self, ids: list[int]) -> None:
        places = {p["worker_index"]: p for p in send_weights(self.group, self.weights, ids)}
        for i in ids:
            if i not in places:  # lost again, or slow to take the weights: the next look retries
                continue
            since, cause = self.lost.pop(i)
            self.recoveries.append(
                Recovery(
                    iteration=self.iteration,
                    worker_index=i,
                    cause=cause,
                    lost_node_id=self.nodes.get(i, ""),
                    node_id=places[i]["node_id"],
                    ip=places[i]["ip"],
                    lost_at=since,
                    back_at=time.time(),
                    weights_version=self.weights.version,
                )
            )
            self.nodes[i] = places[i]["node_id"]
            self._ask([i])

    def _check_dead_nodes(self) -> None:
        """A request sent to a runner whose node is gone waits for Ray to restart it elsewhere; stop
        when that takes longer than the restart timeout (no node has a free CPU for it)."""
        waiting = {i: self.nodes.get(i) for i in self.asked}
        if not waiting:
            return
        dead = dead_nodes()
        now = time.time()
        for i, node in waiting.items():
            if node in dead:
                since = self.dead_since.setdefault(i, now)
                if now - since > self.restart_timeout_s:
                    raise RunnerLostError(self._not_back(i, now - since))

    def _not_back(self, worker: int, waited: float) -> str:
        return (
            f"env runner {worker} has not come back {waited:.0f} s after it was lost (iteration "
            f"{self.iteration + 1}): Ray restarts it on a node with a free CPU (each env runner takes 1) and "
            "none has one. Add a node (`ray start --address=HEAD:6379` on another machine), or stop and "
            "continue with fewer runners (resume=true runtime.num_env_runners=N); "
            "runtime.runner_restart_timeout_s sets this wait"
        )


def describe_recovery(r: Recovery) -> str:
    """One line on a recovered env runner."""
    moved = "" if r.node_id == r.lost_node_id else f" (was on {r.lost_node_id[:8] or 'an unknown node'})"
    why = "its request failed" if r.cause == "lost" else "Ray had restarted it"
    return (
        f"env runner {r.worker_index} lost in iteration {r.iteration + 1} ({why}); back on "
        f"{r.ip}/{r.node_id[:8]}{moved} after {r.wait_s:.1f} s with weights version {r.weights_version}, "
        "sampling its share again"
    )
