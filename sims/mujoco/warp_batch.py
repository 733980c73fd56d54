"""MuJoCo Warp physics behind the interface of ``mujoco.batch.Batch`` that :class:`MujocoVecEnv` uses.

The worlds live on a Warp device (``cuda`` with a GPU, ``cpu`` otherwise: slow, and the kernels
compile once on first use, cached in Warp's kernel cache). Each field the env uses has a host
mirror (``bind``, numpy) and a device view (``torch_view``, a torch tensor on the Warp device
sharing the Warp array's memory). On the ``cpu`` device the two are the same memory.

Two ways to keep them in step (``auto_sync``):

- ``True`` (the env's ``task_logic="host"``): before a physics call the state fields the env may
  have written (qpos, qvel, act, ctrl, mocap, time) are uploaded, after it every field the env
  reads is downloaded; the task logic runs on the mirrors.
- ``False`` (``task_logic="device"``): physics calls touch the device only; the env's task logic
  reads and writes the device views during a control step and copies itself around host work:
  :meth:`download_rows` / :meth:`upload_rows` for the envs an episode reset draws new states for,
  :meth:`download` before GL rendering or host code reading a field.

Only the calls the env makes are implemented: ``bind``, ``torch_view``, ``step``, ``forward``,
``reset``, ``get_data`` (for rendering), ``warning`` (zeros: divergence is caught by the env's
bounds checks).
"""

from __future__ import annotations

import warnings
from typing import Any, Optional

import mujoco
import numpy as np

#: written by the env (resets, controls, task motions) -> uploaded before physics
STATE_FIELDS = ("qpos", "qvel", "act", "ctrl", "mocap_pos", "mocap_quat", "time")
#: read by the env -> downloaded after physics
DERIVED_FIELDS = ("xpos", "xquat", "site_xpos", "site_xmat", "xanchor", "xaxis")


def _import_warp() -> tuple[Any, Any]:
    try:
        import mujoco_warp as mjw
        import warp as wp
    except ImportError as err:
        raise ImportError(
            f"the mujoco_gpu backend needs MuJoCo Warp: pip install mujoco-warp warp-lang (missing: {err.name})"
        ) from None
    return wp, mjw


class WarpBatch:
    """``nsim`` worlds of ``model`` stepped by MuJoCo Warp on ``device``."""

    def __init__(
        self,
        model: mujoco.MjModel,
        nsim: int,
        device: Optional[str] = None,
        cuda_graph: bool = True,
        auto_sync: bool = True,
        copy_mirrors: bool = False,
    ):
        """``copy_mirrors``: separate host copies even on Warp's ``cpu`` device, so the copies a CUDA
        device needs run (and are tested) on a machine without a GPU."""
        wp, mjw = _import_warp()
        wp.config.quiet = True
        wp.init()
        if device is None:
            device = "cuda" if wp.is_cuda_available() else "cpu"
        self.wp, self.mjw, self.model, self.nsim, self.device = wp, mjw, model, nsim, device
        self._host_data = mujoco.MjData(model)
        mujoco.mj_forward(model, self._host_data)
        with wp.ScopedDevice(device):
            self.m = mjw.put_model(model)
            self.d = mjw.put_data(model, self._host_data, nworld=nsim, nconmax=96, njmax=512)
        self._is_cuda = wp.get_device(device).is_cuda
        self._zero_copy = not self._is_cuda and not copy_mirrors
        self.auto_sync = bool(auto_sync)
        # On CUDA the ``nstep`` physics steps of a control step are captured once per ``nstep`` as a CUDA
        # graph and replayed: one launch instead of hundreds of small kernel launches per physics step.
        self.cuda_graph = bool(cuda_graph) and self._is_cuda
        self._graphs: dict[int, Any] = {}
        self._stepped: set[int] = set()
        self.host: dict[str, np.ndarray] = {}
        self._torch_views: dict[str, Any] = {}
        for name in STATE_FIELDS + DERIVED_FIELDS:
            arr = getattr(self.d, name).numpy()
            if name == "site_xmat":  # [N, nsite, 3, 3] -> the batch's [N, nsite, 9] (a view on the cpu device)
                arr = arr.reshape(nsim, model.nsite, 9)
            self.host[name] = arr if self._zero_copy else arr.copy()
        nwarn = int(mujoco.mjtWarning.mjNWARNING)
        self.warning = np.zeros((nsim, nwarn, 2), np.int64)

    # ------------------------------------------------------------------ host <-> device
    def upload(self, names: tuple[str, ...] = STATE_FIELDS) -> None:
        """Host mirrors -> device arrays (no-op on the ``cpu`` device, where they are one memory)."""
        if self._zero_copy:
            return
        for name in names:
            dev = getattr(self.d, name)
            dev.assign(self.host[name].reshape(dev.numpy().shape) if name == "site_xmat" else self.host[name])

    def download(self, names: tuple[str, ...] = STATE_FIELDS + DERIVED_FIELDS) -> None:
        """Device arrays -> host mirrors (no-op on the ``cpu`` device)."""
        self.wp.synchronize_device(self.device)
        if self._zero_copy:
            return
        for name in names:
            self.host[name][...] = getattr(self.d, name).numpy().reshape(self.host[name].shape)

    # ------------------------------------------------------------------ the Batch interface used by the env
    def _upload(self, names: tuple[str, ...] = STATE_FIELDS) -> None:
        """Before a physics call: the host mirrors' state onto the device (``auto_sync``), or else wait
        for the torch work on the device views (torch and Warp run on different CUDA streams)."""
        if self.auto_sync:
            self.upload(names)
        elif self._is_cuda:
            import torch

            torch.cuda.synchronize(torch.device(str(self.wp.get_device(self.device))))

    def _download(self, names: tuple[str, ...] = STATE_FIELDS + DERIVED_FIELDS) -> None:
        if self.auto_sync:
            self.download(names)

    def bind(self, name: str) -> np.ndarray:
        """The host mirror of field ``name`` (``[N, ...]`` numpy)."""
        if name not in self.host:
            raise KeyError(f"field {name!r} is not mirrored by the Warp batch; known: {sorted(self.host)}")
        return self.host[name]

    def torch_view(self, name: str) -> Any:
        """Field ``name`` as a torch tensor on the Warp device sharing the Warp array's memory (no copy;
        ``site_xmat`` as ``[N, nsite, 9]`` like its mirror)."""
        if name not in self.host:
            raise KeyError(f"field {name!r} is not mirrored by the Warp batch; known: {sorted(self.host)}")
        if name not in self._torch_views:
            self._torch_views[name] = self.wp.to_torch(getattr(self.d, name)).reshape(self.host[name].shape)
        return self._torch_views[name]

    def download_rows(self, ids: np.ndarray, names: tuple[str, ...] = STATE_FIELDS) -> None:
        """Worlds ``ids``' rows of the device arrays -> their host mirrors (a copy the size of ``ids``)."""
        self.wp.synchronize_device(self.device)
        if self._zero_copy:
            return
        import torch

        for name in names:
            view = self.torch_view(name)
            self.host[name][ids] = view[torch.as_tensor(ids, dtype=torch.long, device=view.device)].cpu().numpy()

    def upload_rows(self, ids: np.ndarray, names: tuple[str, ...] = STATE_FIELDS) -> None:
        """Worlds ``ids``' rows of the host mirrors -> the device arrays."""
        if self._zero_copy:
            return
        import torch

        for name in names:
            view = self.torch_view(name)
            view[torch.as_tensor(ids, dtype=torch.long, device=view.device)] = torch.from_numpy(
                np.ascontiguousarray(self.host[name][ids])
            ).to(view.device)

    def step(self, ids: Optional[np.ndarray] = None, nstep: int = 1, stage: Any = None) -> None:
        """``nstep`` physics steps of worlds ``ids`` (all when None); positions are made current after."""
        rest = None
        if ids is not None and len(ids) < self.nsim:
            rest = np.setdiff1d(np.arange(self.nsim), ids)
        self._upload()
        with self.wp.ScopedDevice(self.device):
            if rest is None:
                self._physics(nstep)
            elif self.auto_sync:  # worlds that were not stepped get their state back
                keep = {name: self.host[name][rest].copy() for name in STATE_FIELDS}
                self._physics(nstep)
                self.download(STATE_FIELDS)
                for name, values in keep.items():
                    self.host[name][rest] = values
                self.upload()
            else:  # the same on the device views, each library waiting for the other's writes
                views = {name: self.torch_view(name) for name in STATE_FIELDS}
                keep = {name: v[rest].clone() for name, v in views.items()}
                self._upload()
                self._physics(nstep)
                self.wp.synchronize_device(self.device)
                for name, values in keep.items():
                    views[name][rest] = values
                self._upload()
            self._positions()
        self._download()

    def _physics(self, nstep: int) -> None:
        """``nstep`` steps of every world, replayed from a captured CUDA graph where there is one."""
        if not self.cuda_graph:
            for _ in range(nstep):
                self.mjw.step(self.m, self.d)
            return
        graph = self._graphs.get(nstep)
        if graph is None and nstep not in self._stepped:
            # the first call steps kernel by kernel: it compiles and loads just the modules this model's
            # step needs (capturing with every module force-loaded would compile all of MuJoCo Warp)
            self._stepped.add(nstep)
            for _ in range(nstep):
                self.mjw.step(self.m, self.d)
            return
        if graph is None:
            try:
                with self.wp.ScopedCapture(force_module_load=False) as capture:
                    for _ in range(nstep):
                        self.mjw.step(self.m, self.d)
            except Exception as err:  # noqa: BLE001 - capture unsupported here: step kernel by kernel
                warnings.warn(
                    f"CUDA graph capture of the MuJoCo Warp step failed ({err}); stepping without graphs",
                    RuntimeWarning,
                    stacklevel=3,
                )
                self.cuda_graph = False
                self._physics(nstep)
                return
            graph = self._graphs[nstep] = capture.graph
        self.wp.capture_launch(graph)

    def _positions(self) -> None:
        """Position-dependent fields at the current state (what ``mjSTAGE_POS`` gives the C batch)."""
        self.mjw.kinematics(self.m, self.d)
        self.mjw.com_pos(self.m, self.d)
        self.wp.synchronize()

    def forward(self, ids: Optional[np.ndarray] = None, stage: Any = None) -> None:
        """Position-dependent fields of every world (cheap to recompute for all)."""
        self._upload()
        with self.wp.ScopedDevice(self.device):
            self._positions()
        self._download(DERIVED_FIELDS)

    def reset(self, ids: Optional[np.ndarray] = None, stage: Any = None) -> None:
        """Worlds ``ids`` back to the model's defaults (state written before the call is discarded)."""
        mask = np.zeros(self.nsim, bool)
        mask[np.arange(self.nsim) if ids is None else ids] = True
        self._upload()
        with self.wp.ScopedDevice(self.device):
            self.mjw.reset_data(self.m, self.d, reset=self.wp.array(mask, dtype=bool))
            self.wp.synchronize()
        self._download(STATE_FIELDS)
        self.warning[mask] = 0

    def get_data(self, sim: int, data: mujoco.MjData) -> None:
        """World ``sim``'s state into ``data`` (the renderer runs kinematics on it)."""
        data.qpos[:] = self.host["qpos"][sim]
        data.qvel[:] = self.host["qvel"][sim]
        if self.model.na:
            data.act[:] = self.host["act"][sim]
        if self.model.nmocap:
            data.mocap_pos[:] = self.host["mocap_pos"][sim]
            data.mocap_quat[:] = self.host["mocap_quat"][sim]
        data.time = float(self.host["time"][sim])

    def expand(self, name: str) -> np.ndarray:
        raise NotImplementedError(
            "per-world model changes (dynamics randomisation) are not wired to the Warp "
            "backend yet; use the mujoco backend"
        )

    def set_const(self) -> None:
        raise NotImplementedError("see expand()")
