"""MuJoCo Warp physics behind the interface of ``mujoco.batch.Batch`` that :class:`MujocoVecEnv` uses.

The worlds live on a Warp device (``cuda`` with a GPU, ``cpu`` otherwise: slow, and the kernels
compile once on first use, cached in Warp's kernel cache). The env's task logic reads and writes
host arrays (``bind``); this adapter keeps those as host mirrors: before a physics call it uploads
the state fields the env may have written (qpos, qvel, act, ctrl, mocap, time), after it
downloads the fields the env reads. On the ``cpu`` device a mirror is the device array itself
(no copy). This is the equivalence-tested physics path; the observations, rewards and success
predicates are still computed by the env on the host (see the README's GPU section).

Only the calls the env makes are implemented: ``bind``, ``step``, ``forward``, ``reset``,
``get_data`` (for rendering), ``warning`` (zeros: divergence is caught by the env's bounds checks).
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
        raise ImportError("the mujoco_gpu backend needs MuJoCo Warp: pip install mujoco-warp warp-lang "
                          f"(missing: {err.name})") from None
    return wp, mjw


class WarpBatch:
    """``nsim`` worlds of ``model`` stepped by MuJoCo Warp on ``device``."""

    def __init__(self, model: mujoco.MjModel, nsim: int, device: Optional[str] = None, cuda_graph: bool = True):
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
        self._zero_copy = wp.get_device(device).is_cpu
        # On CUDA the ``nstep`` physics steps of a control step are captured once per ``nstep`` as a CUDA
        # graph and replayed: one launch instead of hundreds of small kernel launches per physics step.
        self.cuda_graph = bool(cuda_graph) and wp.get_device(device).is_cuda
        self._graphs: dict[int, Any] = {}
        self._stepped: set[int] = set()
        self.host: dict[str, np.ndarray] = {}
        for name in STATE_FIELDS + DERIVED_FIELDS:
            arr = getattr(self.d, name).numpy()
            if name == "site_xmat":  # [N, nsite, 3, 3] -> the batch's [N, nsite, 9] (a view on the cpu device)
                arr = arr.reshape(nsim, model.nsite, 9)
            self.host[name] = arr if self._zero_copy else arr.copy()
        nwarn = int(mujoco.mjtWarning.mjNWARNING)
        self.warning = np.zeros((nsim, nwarn, 2), np.int64)

    # ------------------------------------------------------------------ host <-> device
    def _upload(self, names: tuple[str, ...] = STATE_FIELDS) -> None:
        if self._zero_copy:
            return
        for name in names:
            dev = getattr(self.d, name)
            dev.assign(self.host[name].reshape(dev.numpy().shape) if name == "site_xmat" else self.host[name])

    def _download(self, names: tuple[str, ...] = STATE_FIELDS + DERIVED_FIELDS) -> None:
        if self._zero_copy:
            return
        for name in names:
            self.host[name][...] = getattr(self.d, name).numpy().reshape(self.host[name].shape)

    # ------------------------------------------------------------------ the Batch interface used by the env
    def bind(self, name: str) -> np.ndarray:
        if name not in self.host:
            raise KeyError(f"field {name!r} is not mirrored by the Warp batch; known: {sorted(self.host)}")
        return self.host[name]

    def step(self, ids: Optional[np.ndarray] = None, nstep: int = 1, stage: Any = None) -> None:
        """``nstep`` physics steps of worlds ``ids`` (all when None); positions are made current after."""
        keep = None
        if ids is not None and len(ids) < self.nsim:
            rest = np.setdiff1d(np.arange(self.nsim), ids)
            keep = {name: self.host[name][rest].copy() for name in STATE_FIELDS}
        self._upload()
        with self.wp.ScopedDevice(self.device):
            self._physics(nstep)
            if keep is not None:  # worlds that were not stepped get their state back
                self._download(STATE_FIELDS)
                for name, values in keep.items():
                    self.host[name][rest] = values
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
                warnings.warn(f"CUDA graph capture of the MuJoCo Warp step failed ({err}); stepping without "
                              "graphs", RuntimeWarning, stacklevel=3)
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
        raise NotImplementedError("per-world model changes (dynamics randomisation) are not wired to the Warp "
                                  "backend yet; use the mujoco backend")

    def set_const(self) -> None:
        raise NotImplementedError("see expand()")
