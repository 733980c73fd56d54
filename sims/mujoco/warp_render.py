"""Batched camera rendering of MuJoCo Warp worlds with MuJoCo Warp's ray tracer.

:class:`WarpBatchRenderer` has the interface of :class:`sims.mujoco.render.BatchRenderer`
(``render(sim, ids, out)``) for a :class:`sims.mujoco.warp_batch.WarpBatch`: one
``mujoco_warp.render`` launch ray-traces every requested camera of every world from the worlds'
device state (no per-env loop, no OpenGL), and a small kernel unpacks its packed pixels into a uint8
``[N, V, H, W, 3]`` device buffer. ``render`` copies the rows ``ids`` of that buffer into the env's
host array (a download on a cuda device; on Warp's cpu device the buffer is host memory, read in
place); ``render_torch`` hands the buffer to GPU consumers as a torch tensor without a copy.

Poses: the geoms' poses are those the batch's last physics call (``step``, ``forward``, ``reset``)
computed on the device. The batch's position pass runs kinematics and com_pos only, so the camera
and light poses are recomputed here (``mujoco_warp.camlight``) and the scene BVH is refit to the
geoms' current bounds before each render. Host-mirror writes made after the last physics call are not
seen (the env always renders right after one).

Differences from the OpenGL renderer, same scene and state: ray-traced Phong shading (headlight and
model lights, no shadows, black background as the GL renderer with the skybox off) agrees closely but
not pixel for pixel; sites and decor (mjvOption visualisation) are not drawn; geom groups 0-2 are
drawn, as in MuJoCo's default ``mjvOption``. Every world is rendered on each call, also when only
some ``ids`` are asked for.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import mujoco
import numpy as np

from sims.mujoco.warp_batch import _import_warp

if TYPE_CHECKING:
    import torch

    from sims.mujoco.warp_batch import WarpBatch


@functools.cache
def _unpack_kernel() -> Any:
    """Kernel ``(packed [N, P] uint32 0xAARRGGBB) -> rgb [N, P, 3] uint8`` over ``(world, pixel)``."""
    wp, _ = _import_warp()

    @wp.kernel
    def unpack_rgb(packed: wp.array2d(dtype=wp.uint32), rgb: wp.array3d(dtype=wp.uint8)):
        world, pixel = wp.tid()
        val = packed[world, pixel]
        rgb[world, pixel, 0] = wp.uint8((val >> wp.uint32(16)) & wp.uint32(0xFF))
        rgb[world, pixel, 1] = wp.uint8((val >> wp.uint32(8)) & wp.uint32(0xFF))
        rgb[world, pixel, 2] = wp.uint8(val & wp.uint32(0xFF))

    return unpack_rgb


class WarpBatchRenderer:
    """Renders cameras of all worlds of a ``WarpBatch`` in one batched ray-tracing launch.

    Args:
        sim: the worlds to render (their count and Warp device are fixed here).
        cameras: camera names of the model, in the order of the output's V axis.
        height, width: image size in pixels.
    """

    def __init__(self, sim: WarpBatch, cameras: Sequence[str], height: int, width: int):
        wp, mjw = _import_warp()
        _check_sim(sim)
        model = sim.model
        missing = [c for c in cameras if mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, c) < 0]
        if missing:
            raise ValueError(
                f"unknown camera(s) {missing}; the scene has {[model.camera(i).name for i in range(model.ncam)]}"
            )
        if not cameras:
            raise ValueError("no cameras to render; give at least one camera name")
        if height < 1 or width < 1:
            raise ValueError(f"image size must be positive, got {height}x{width}")
        self.wp, self.mjw = wp, mjw
        self.model = model
        self.cameras = tuple(cameras)
        self.camera_ids = [model.camera(c).id for c in cameras]
        self.num_worlds, self.height, self.width = sim.nsim, int(height), int(width)
        self.device = sim.device
        n, v = self.num_worlds, len(self.cameras)
        with wp.ScopedDevice(self.device):
            self._rc = mjw.create_render_context(
                model,
                nworld=n,
                cam_res=(self.width, self.height),
                render_rgb=True,
                render_depth=False,
                render_seg=False,
                cam_active=list(self.cameras),
                use_shadows=False,
                render_skybox=False,
            )
            # Warp arrays have at most 4 dims: one image per (world, camera), world-major, is the
            # memory of [N, V, H, W, 3]
            self._rgb = wp.zeros((n * v, self.height, self.width, 3), dtype=wp.uint8)
        # Every camera renders rgb at one size, so camera c's pixels start at c * H * W: the packed
        # buffer [N, V * H * W] is the image array [N, V, H, W] flattened.
        adr = self._rc.rgb_adr.numpy()
        if not np.array_equal(adr, np.arange(v) * self.height * self.width):
            raise RuntimeError(f"unexpected MuJoCo Warp rgb layout (camera offsets {adr.tolist()})")
        self._rgb_flat = self._rgb.reshape((n, v * self.height * self.width, 3))
        self._on_cpu = wp.get_device(self.device).is_cpu

    @property
    def shape(self) -> tuple[int, int, int, int, int]:
        """``(N, V, H, W, 3)``."""
        return self.num_worlds, len(self.cameras), self.height, self.width, 3

    def render_device(self, sim: WarpBatch) -> Any:
        """Ray-trace every camera of every world at the worlds' current device state.

        Returns the renderer's Warp buffer, uint8 ``[N * V, H, W, 3]`` (world-major: the memory of
        ``[N, V, H, W, 3]``) on the Warp device, overwritten by the next call.
        """
        self._check(sim)
        wp, mjw, rc = self.wp, self.mjw, self._rc
        with wp.ScopedDevice(self.device):
            mjw.camlight(sim.m, sim.d)
            mjw.refit_bvh(sim.m, sim.d, rc)
            mjw.render(sim.m, sim.d, rc)
            wp.launch(_unpack_kernel(), dim=self._rgb_flat.shape[:2], inputs=[rc.rgb_data], outputs=[self._rgb_flat])
        return self._rgb

    def render(self, sim: WarpBatch, ids: np.ndarray, out: np.ndarray) -> None:
        """Render every camera of envs ``ids`` into ``out[ids]`` (``[N, V, H, W, 3]`` uint8).

        All worlds are ray-traced in one launch; only rows ``ids`` are copied (downloaded on cuda).
        """
        if out.shape != self.shape or out.dtype != np.uint8:
            raise ValueError(f"out must be uint8 {list(self.shape)}, got {out.dtype} {list(out.shape)}")
        rgb = self.render_device(sim)
        ids = np.asarray(ids, dtype=np.int64)
        if self._on_cpu:  # numpy() is a view of the host buffer on the cpu device
            out[ids] = rgb.numpy().reshape(self.shape)[ids]
        elif len(ids) == self.num_worlds:
            out[...] = rgb.numpy().reshape(self.shape)
        else:  # gather the rows on the device, download only them
            import torch

            src = self.wp.to_torch(rgb).view(self.shape)
            out[ids] = src[torch.as_tensor(ids, device=src.device)].cpu().numpy()

    def render_torch(self, sim: WarpBatch) -> torch.Tensor:
        """Render all worlds; uint8 ``[N, V, H, W, 3]`` torch tensor on the Warp device sharing the
        renderer's buffer (no copy: clone it to keep it past the next render)."""
        return self.wp.to_torch(self.render_device(sim)).view(self.shape)

    def _check(self, sim: Any) -> None:
        if self._rc is None:
            raise RuntimeError("this renderer is closed")
        _check_sim(sim)
        if sim.nsim != self.num_worlds or sim.device != self.device:
            raise ValueError(
                f"this renderer was built for {self.num_worlds} worlds on {self.device!r}, got "
                f"{sim.nsim} on {sim.device!r}"
            )
        if sim.model is not self.model:
            raise ValueError("this renderer was built for another model")

    def close(self) -> None:
        """Release the render context and buffers (device memory)."""
        self._rc = None
        self._rgb = self._rgb_flat = None


def _check_sim(sim: Any) -> None:
    if not (hasattr(sim, "m") and hasattr(sim, "d") and hasattr(sim, "nsim")):
        raise TypeError(
            f"WarpBatchRenderer renders MuJoCo Warp worlds (a sims.mujoco.warp_batch.WarpBatch, "
            f"physics='warp'), got {type(sim).__name__}; use sims.mujoco.render.BatchRenderer"
        )
