"""Decimated visual meshes for rendering (sims/mujoco/meshes.py) on a tiny model: a finely tessellated
sphere drawn by a visual-only geom and the same mesh colliding."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest

import sims.mujoco  # noqa: F401  (picks the OpenGL platform before mujoco loads)
from sims.mujoco.meshes import decimated_copy, drawn_faces, drawn_only_meshes


def _sphere(rings: int = 24, segments: int = 48) -> tuple[np.ndarray, np.ndarray]:
    """A UV sphere as a triangle soup (every face its own three vertices, as many exported meshes are)."""
    theta = np.linspace(0, np.pi, rings + 1)
    phi = np.linspace(0, 2 * np.pi, segments + 1)
    grid = (
        np.stack(
            [
                np.outer(np.sin(theta), np.cos(phi)),
                np.outer(np.sin(theta), np.sin(phi)),
                np.outer(np.cos(theta), np.ones_like(phi)),
            ],
            axis=-1,
        )
        * 0.05
    )
    tris = []
    for i in range(rings):
        for j in range(segments):
            a, b, c, d = grid[i, j], grid[i + 1, j], grid[i + 1, j + 1], grid[i, j + 1]
            if i > 0:
                tris.append([a, b, d])
            if i < rings - 1:
                tris.append([b, c, d])
    verts = np.array(tris).reshape(-1, 3)
    return verts, np.arange(len(verts)).reshape(-1, 3)


def _model() -> mujoco.MjModel:
    spec = mujoco.MjSpec()
    verts, faces = _sphere()
    for name in ("ball_vis", "ball_col"):
        spec.add_mesh(name=name, uservert=verts.reshape(-1).tolist(), userface=faces.reshape(-1).tolist())
    body = spec.worldbody.add_body(name="ball", pos=[0, 0, 0.1])
    body.add_freejoint()
    body.add_geom(type=mujoco.mjtGeom.mjGEOM_MESH, meshname="ball_vis", contype=0, conaffinity=0, group=1)
    body.add_geom(type=mujoco.mjtGeom.mjGEOM_MESH, meshname="ball_col", group=0)
    spec.worldbody.add_geom(type=mujoco.mjtGeom.mjGEOM_PLANE, size=[1, 1, 0.1])
    spec.worldbody.add_camera(name="top", pos=[0, 0, 0.5])
    spec.worldbody.add_light(pos=[0, 0, 1])
    return spec.compile()


def test_only_drawn_meshes_are_decimated_and_the_model_is_untouched():
    model = _model()
    vis, col = (mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_MESH, n) for n in ("ball_vis", "ball_col"))
    assert drawn_only_meshes(model) == [vis]
    before = model.mesh_facenum.copy(), model.mesh_vert.copy()
    light = decimated_copy(model, 200)
    assert light.mesh_facenum[vis] <= 220 < model.mesh_facenum[vis]
    assert light.mesh_facenum[col] == model.mesh_facenum[col]  # collisions keep their mesh
    np.testing.assert_array_equal(model.mesh_facenum, before[0])
    np.testing.assert_array_equal(model.mesh_vert, before[1])
    # the decimated sphere still is the sphere: every vertex on it, faces indexing the kept vertices
    va, vn = light.mesh_vertadr[vis], light.mesh_vertnum[vis]
    radius = np.linalg.norm(light.mesh_vert[va : va + vn], axis=1)
    assert np.allclose(radius, radius.mean(), rtol=0.15)
    fa, fn = light.mesh_faceadr[vis], light.mesh_facenum[vis]
    assert light.mesh_face[fa : fa + fn].max() < vn
    assert drawn_faces(light) < drawn_faces(model)
    with pytest.raises(ValueError, match="max_faces must be >= 4"):
        decimated_copy(model, 2)


def test_the_decimated_copy_renders_the_same_scene():
    from sims.mujoco.render import BatchRenderer

    model = _model()
    data = mujoco.MjData(model)
    mujoco.mj_forward(model, data)
    images = []
    for m in (model, decimated_copy(model, 200)):
        renderer = BatchRenderer(m, ["top"], 64, 64)
        out = np.zeros((1, 1, 64, 64, 3), np.uint8)
        renderer.render_data(data, out[0])
        renderer.close()
        images.append(out[0, 0].astype(np.float64))
    mse = ((images[0] - images[1]) ** 2).mean()
    assert images[0].std() > 5  # the ball is in view
    assert 10 * np.log10(255**2 / max(mse, 1e-9)) > 25  # and looks the same
