"""Offscreen rendering of the envs of a ``mujoco.batch.Batch`` with ``mujoco.Renderer``.

One renderer per process: OpenGL renderers in threads of one process do not scale, so parallel
rendering comes from processes (env-runner workers) or a batched renderer (GPU backends). The GL
context is released after every call, so the env may be stepped from any one thread at a time
(e.g. a sampler thread that overlaps with learning).
"""

from __future__ import annotations

import atexit
import os
import weakref
from typing import Sequence

import mujoco
import numpy as np
from mujoco import batch as mjbatch


class BatchRenderer:
    """Renders cameras of selected envs into a uint8 buffer ``[N, V, H, W, 3]``."""

    def __init__(
        self,
        model: mujoco.MjModel,
        cameras: Sequence[str],
        height: int,
        width: int,
        *,
        shadows: bool = False,
        reflections: bool = False,
        skybox: bool = False,
        hidden_groups: Sequence[int] = (),
    ):
        missing = [c for c in cameras if mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, c) < 0]
        if missing:
            raise ValueError(
                f"unknown camera(s) {missing}; the scene has {[model.camera(i).name for i in range(model.ncam)]}"
            )
        self.model = model
        self.cameras = tuple(cameras)
        self.camera_ids = [model.camera(c).id for c in cameras]
        try:
            self._renderer = mujoco.Renderer(model, height, width)
        except Exception as err:  # noqa: BLE001 - re-raised with the fix
            raise RuntimeError(
                f"offscreen rendering failed ({err}) with MUJOCO_GL={os.environ.get('MUJOCO_GL')!r}. Install the "
                "EGL/OSMesa packages (the README's set-up does), set MUJOCO_GL=egl or osmesa before anything "
                "imports mujoco, or use cameras=() for state-only envs"
            ) from err
        flags = self._renderer.scene.flags
        flags[mujoco.mjtRndFlag.mjRND_SHADOW] = shadows
        flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = reflections
        flags[mujoco.mjtRndFlag.mjRND_SKYBOX] = skybox
        self._data = mujoco.MjData(model)
        self._option = mujoco.MjvOption()
        for group in hidden_groups:  # e.g. robosuite's collision geoms (group 0)
            self._option.geomgroup[group] = 0
        # Free the GL context before the interpreter tears PyOpenGL down (OSMesa otherwise
        # raises from Renderer.__del__ at exit).
        ref = weakref.ref(self)
        atexit.register(lambda: ref() is not None and ref().close())
        self._backend = os.environ.get("MUJOCO_GL", "")
        self._release_context()

    def _release_context(self) -> None:
        """Detach the GL context from this thread (a context current in one thread cannot be made
        current in another: EGL_BAD_ACCESS)."""
        backend = self._backend
        if backend == "egl":
            from mujoco import egl

            if egl.EGL_DISPLAY is not None:
                egl.EGL.eglMakeCurrent(
                    egl.EGL_DISPLAY, egl.EGL.EGL_NO_SURFACE, egl.EGL.EGL_NO_SURFACE, egl.EGL.EGL_NO_CONTEXT
                )
        elif backend == "osmesa":
            from mujoco import osmesa

            osmesa.osmesa.OSMesaMakeCurrent(None, None, osmesa.GL.GL_FLOAT, 0, 0)
            osmesa._current_context.ref = None

    def render(self, sim: mjbatch.Batch, ids: np.ndarray, out: np.ndarray) -> None:
        """Render every camera of envs ``ids`` into ``out[ids]`` (``[N, V, H, W, 3]`` uint8)."""
        data, model = self._data, self.model
        for i in ids:
            sim.get_data(int(i), data)
            mujoco.mj_kinematics(model, data)
            mujoco.mj_camlight(model, data)
            for v, cam in enumerate(self.camera_ids):
                self._renderer.update_scene(data, camera=cam, scene_option=self._option)
                self._renderer.render(out=out[i, v])
        self._release_context()

    def render_data(self, data: mujoco.MjData, out: np.ndarray) -> None:
        """Render every camera of one env's ``data`` as it is (its kinematics not recomputed) into
        ``out`` (``[V, H, W, 3]`` uint8)."""
        for v, cam in enumerate(self.camera_ids):
            self._renderer.update_scene(data, camera=cam, scene_option=self._option)
            self._renderer.render(out=out[v])
        self._release_context()

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
