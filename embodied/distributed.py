"""Data-parallel training on several processes (PyTorch DistributedDataParallel).

One run, ``world`` processes: each rank holds the whole model and the whole dataset, takes its own slice
of every global batch (:func:`rank_indices`), draws its own noise (:func:`rank_seed`), and DDP averages the
gradients in ``backward`` (:func:`data_parallel`), so every rank applies the same update. Rank 0 alone
writes; the others only compute.

Two ways in, one process group (``env://`` rendezvous, gloo on CPU, NCCL with one GPU per rank):
- launched by ``torchrun`` (or anything that sets its ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` /
  ``MASTER_ADDR`` / ``MASTER_PORT``): :func:`launched_rank` reads them;
- ``nproc=N`` in a plain command: :func:`spawn` starts N local processes on a free localhost port.
"""

from __future__ import annotations

import os
import socket
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Callable, ClassVar, Iterator, Optional

import numpy as np
import torch


@dataclass(frozen=True)
class Rank:
    """This process's place in a run: its ``rank`` of ``world``, on this machine ``local_rank`` of
    ``local_world``, and the ``device`` it trains on."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    local_world: int = 1
    device: str = "cpu"

    @property
    def is_main(self) -> bool:
        """Whether this rank writes (the run folder, logs, progress)."""
        return self.rank == 0


# --- backends: one registered class per device type ------------------------------------------------


class Backend:
    """A ``torch.distributed`` backend and the device type it runs on."""

    name: ClassVar[str]
    device_type: ClassVar[str]

    def check(self, device: str, local_world: int) -> None:
        """Raise ``ValueError`` saying what to change when ``local_world`` ranks cannot train on ``device`` here."""
        if not (torch.distributed.is_available() and _has_backend(self.name)):
            raise ValueError(f"this torch build has no {self.name} backend, which several processes on {device} need")

    def device(self, local_rank: int) -> str:
        """The device of the rank ``local_rank`` on its machine."""
        return self.device_type


_BACKENDS: dict[str, Backend] = {}


def register(cls: type[Backend]) -> type[Backend]:
    """Class decorator: make ``cls`` the backend of its ``device_type``."""
    _BACKENDS[cls.device_type] = cls()
    return cls


def _has_backend(name: str) -> bool:
    return bool(getattr(torch.distributed, f"is_{name}_available")())


@register
class Gloo(Backend):
    name = "gloo"
    device_type = "cpu"


@register
class Nccl(Backend):
    name = "nccl"
    device_type = "cuda"

    def check(self, device: str, local_world: int) -> None:
        if not torch.cuda.is_available():
            raise ValueError(f"device={device} but CUDA is not available: use device=cpu (gloo) for several processes")
        super().check(device, local_world)
        if torch.device(device).index is not None:
            raise ValueError(f"device={device}: with several processes each rank takes its own GPU, pass device=cuda")
        if local_world > torch.cuda.device_count():
            raise ValueError(
                f"{local_world} processes on this machine but {torch.cuda.device_count()} GPU(s): "
                "NCCL needs one GPU per process; lower nproc (or torchrun's --nproc-per-node)"
            )

    def device(self, local_rank: int) -> str:
        return f"cuda:{local_rank}"


def backend_for(device: str) -> Backend:
    """The backend that trains on ``device`` (``cpu``: gloo, ``cuda``: NCCL)."""
    kind = torch.device(device).type
    if kind not in _BACKENDS:
        choices = ", ".join(f"device={k} ({b.name})" for k, b in _BACKENDS.items())
        raise ValueError(f"several processes train on {choices}, not device={device}")
    return _BACKENDS[kind]


def check(nproc: int, device: str) -> None:
    """Refuse, with what to change, an ``nproc`` that cannot run on ``device`` here."""
    if nproc < 1:
        raise ValueError(f"nproc must be >= 1 (processes training together), got {nproc}")
    if nproc > 1:
        backend_for(device).check(device, nproc)


# --- launch ------------------------------------------------------------------------------------------


def launched_rank() -> Optional[Rank]:
    """This process's rank when a launcher such as torchrun started several (``WORLD_SIZE`` > 1), else None."""
    if "RANK" not in os.environ or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    return Rank(rank, world, local, int(os.environ.get("LOCAL_WORLD_SIZE", world)))


@contextmanager
def process_group(rank: Rank, device: str) -> Iterator[Rank]:
    """Join the process group of ``rank.world`` ranks (rendezvous at ``MASTER_ADDR:MASTER_PORT``) for
    training on ``device``; yields ``rank`` with its own device (``cuda:<local_rank>`` with NCCL)."""
    backend = backend_for(device)
    backend.check(device, rank.local_world)
    rank = replace(rank, device=backend.device(rank.local_rank))
    if rank.device.startswith("cuda"):
        torch.cuda.set_device(rank.device)
    torch.distributed.init_process_group(backend.name, rank=rank.rank, world_size=rank.world)
    try:
        yield rank
    finally:
        torch.distributed.destroy_process_group()


def free_port() -> int:
    """A TCP port free on localhost now (for a local run's rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def threads_per_rank(nproc: int) -> int:
    """CPU threads for each of ``nproc`` local processes: the cores this process may use, shared out."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // nproc)


def _spawned(index: int, nproc: int, port: int, device: str, errors: Any, worker: Callable, args: tuple) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(index),
        WORLD_SIZE=str(nproc),
        LOCAL_RANK=str(index),
        LOCAL_WORLD_SIZE=str(nproc),
    )
    try:
        with process_group(Rank(index, nproc, index, nproc), device) as rank:
            worker(rank, *args)
    except (ValueError, FileNotFoundError, FileExistsError) as err:  # the user's to fix: the parent re-raises it
        errors.put(err)
        raise SystemExit(1) from None


def spawn(
    worker: Callable[..., None], nproc: int, device: str, args: tuple = (), threads: Optional[int] = None
) -> None:
    """Run ``worker(rank, *args)`` on ``nproc`` new local processes that form one process group on
    ``device``. Each gets ``OMP_NUM_THREADS``: ``threads``, else the caller's ``OMP_NUM_THREADS``, else
    :func:`threads_per_rank`. A ``ValueError`` / ``FileNotFoundError`` / ``FileExistsError`` in a worker
    is raised again here (the other workers are stopped); other failures raise torch's
    ``ProcessRaisedException`` with the worker's traceback."""
    import torch.multiprocessing as mp

    check(nproc, device)
    errors = mp.get_context("spawn").SimpleQueue()
    omp = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = str(threads or omp or threads_per_rank(nproc))  # the children inherit it
    try:
        mp.spawn(_spawned, args=(nproc, free_port(), device, errors, worker, args), nprocs=nproc, join=True)
    except mp.ProcessExitedException:
        if errors.empty():
            raise
        raise errors.get() from None
    finally:
        if omp is None:
            del os.environ["OMP_NUM_THREADS"]
        else:
            os.environ["OMP_NUM_THREADS"] = omp


# --- the per-rank pieces of a training step -------------------------------------------------------------


def rank_indices(num_samples: int, batch_size: int, generator: torch.Generator, rank: Rank) -> torch.Tensor:
    """This rank's ``[batch_size]`` sample indices: every rank draws the same global batch of
    ``world * batch_size`` indices in ``[0, num_samples)`` from ``generator`` (seeded alike on every rank,
    as DistributedSampler shares its epoch seed) and keeps its own slice, rank r the r-th ``batch_size``
    (as accelerate deals out batches). One process draws exactly ``batch_size``, as before."""
    drawn = torch.randint(0, num_samples, (rank.world * batch_size,), generator=generator)
    return drawn[rank.rank * batch_size : (rank.rank + 1) * batch_size]


def rank_seed(seed: int, rank: int) -> int:
    """A seed of its own for ``rank`` derived from ``seed`` (augmentation and noise differ per rank)."""
    return int(np.random.SeedSequence([seed, rank]).generate_state(1)[0])


class _Call(torch.nn.Module):
    """``model.<method>`` as a module's ``forward``, for DDP (which syncs gradients of what ``forward`` computed)."""

    def __init__(self, model: torch.nn.Module, method: str):
        super().__init__()
        self.model = model
        self.method = method

    def forward(self, *args: Any) -> Any:
        return getattr(self.model, self.method)(*args)


def data_parallel(model: torch.nn.Module, method: str, rank: Rank) -> Callable[..., torch.Tensor]:
    """``model.<method>`` (e.g. a loss) as a function whose ``backward`` averages the gradients over the
    ranks (DistributedDataParallel; the ranks' parameters are made rank 0's first); in one process the
    method itself. Parameters a step leaves unused (a value head in an SFT loss) keep no gradient, as in
    one process."""
    if rank.world == 1:
        return getattr(model, method)
    from torch.nn.parallel import DistributedDataParallel

    ids = [torch.device(rank.device).index] if rank.device.startswith("cuda") else None
    return DistributedDataParallel(_Call(model, method), device_ids=ids, find_unused_parameters=True)


def mean_over_ranks(value: float, rank: Rank) -> float:
    """The mean of ``value`` over the ranks (every rank must call it); ``value`` itself in one process."""
    if rank.world == 1:
        return value
    total = torch.tensor([value], dtype=torch.float64, device=rank.device)
    torch.distributed.all_reduce(total)
    return float(total.item()) / rank.world
