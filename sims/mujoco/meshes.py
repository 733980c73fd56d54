"""Lighter visual meshes for rendering: a copy of a model whose drawn-only meshes are decimated.

MuJoCo's OpenGL renderer on a machine without a GPU (Mesa's llvmpipe) spends its time on vertices,
not pixels: a LIBERO scene draws about 300k triangles and costs the same at 32 px as at 256 px. The
meshes that only geoms without collisions use (robosuite's ``*_vis`` geoms) can be decimated for the
renderer's copy of the model without touching the physics: quadric edge collapse
(``fast-simplification``) to a face budget after welding the corners that share a position and a
texture coordinate, each new vertex keeping the normal and texture coordinate of the vertex that
survived as it. The compiled model is edited in place within each mesh's slots, so
every pose, frame and material stays the model's.
"""

from __future__ import annotations

import copy

import mujoco
import numpy as np


def drawn_only_meshes(model: mujoco.MjModel) -> list[int]:
    """Ids of the meshes that geoms use only where they collide with nothing (contype = conaffinity = 0)."""
    mesh_geoms = np.flatnonzero(model.geom_type == mujoco.mjtGeom.mjGEOM_MESH)
    colliding = {int(model.geom_dataid[g]) for g in mesh_geoms if model.geom_contype[g] or model.geom_conaffinity[g]}
    return sorted({int(model.geom_dataid[g]) for g in mesh_geoms} - colliding)


def decimate_mesh(model: mujoco.MjModel, mesh: int, max_faces: int) -> bool:
    """Decimate mesh ``mesh`` of ``model`` in place to at most about ``max_faces`` triangles (its slots
    keep their size; the counts shrink). Whether it changed (False: already small enough, or the
    decimated mesh needs more texture coordinates or normals than the mesh has slots for)."""
    import fast_simplification

    va, vn = int(model.mesh_vertadr[mesh]), int(model.mesh_vertnum[mesh])
    fa, fn = int(model.mesh_faceadr[mesh]), int(model.mesh_facenum[mesh])
    if fn <= max_faces:
        return False
    na, ta, tn = int(model.mesh_normaladr[mesh]), int(model.mesh_texcoordadr[mesh]), int(model.mesh_texcoordnum[mesh])
    faces = model.mesh_face[fa : fa + fn].astype(np.int64)
    # one vertex per distinct (position, texture coordinate) of the faces' corners: many meshes are
    # triangle soups (no shared edge to collapse), and a texture seam must keep both sides' coordinates
    pos = model.mesh_vert[va + faces.reshape(-1)].astype(np.float64)
    normal = model.mesh_normal[na + model.mesh_facenormal[fa : fa + fn].reshape(-1)]
    uv = model.mesh_texcoord[ta + model.mesh_facetexcoord[fa : fa + fn].reshape(-1)] if tn else np.zeros((len(pos), 2))
    _, first, corner_vertex = np.unique(
        np.concatenate([pos, uv], axis=1).round(7), axis=0, return_index=True, return_inverse=True
    )
    shared = corner_vertex.reshape(fn, 3)
    shared = shared[(shared[:, 0] != shared[:, 1]) & (shared[:, 1] != shared[:, 2]) & (shared[:, 0] != shared[:, 2])]
    if len(shared) <= max_faces:
        return False
    welded = pos[first]
    _, _, collapses = fast_simplification.simplify(welded, shared, target_count=max_faces, return_collapses=True)
    new_verts, new_faces, mapping = fast_simplification.replay_simplification(welded, shared, collapses)
    v2, f2 = len(new_verts), len(new_faces)
    if f2 == 0 or f2 >= fn or v2 > vn or v2 > int(model.mesh_normalnum[mesh]) or (tn and v2 > tn):
        return False
    # each new vertex keeps the normal and texture coordinate of the welded vertex that survived as it
    survivors = np.setdiff1d(np.arange(len(welded)), collapses[:, 1])
    source = np.zeros(v2, np.int64)
    source[mapping[survivors]] = survivors
    model.mesh_vert[va : va + v2] = new_verts
    model.mesh_face[fa : fa + f2] = new_faces
    model.mesh_normal[na : na + v2] = normal[first][source]
    model.mesh_facenormal[fa : fa + f2] = new_faces
    if tn:
        model.mesh_texcoord[ta : ta + v2] = uv[first][source]
        model.mesh_facetexcoord[fa : fa + f2] = new_faces
        model.mesh_texcoordnum[mesh] = v2
    model.mesh_vertnum[mesh], model.mesh_facenum[mesh], model.mesh_normalnum[mesh] = v2, f2, v2
    return True


def decimated_copy(model: mujoco.MjModel, max_faces: int) -> mujoco.MjModel:
    """A copy of ``model`` for rendering whose drawn-only meshes have at most about ``max_faces`` faces
    each (the physics keeps using ``model``; an ``MjData`` of either serves both)."""
    if max_faces < 4:
        raise ValueError(f"max_faces must be >= 4, got {max_faces}")
    out = copy.copy(model)
    for mesh in drawn_only_meshes(out):
        decimate_mesh(out, mesh, max_faces)
    return out


def drawn_faces(model: mujoco.MjModel) -> int:
    """Triangles of the meshes that visible geoms (not in group 0) draw, counted once per geom."""
    mesh_geoms = np.flatnonzero((model.geom_type == mujoco.mjtGeom.mjGEOM_MESH) & (model.geom_group != 0))
    return int(sum(model.mesh_facenum[model.geom_dataid[g]] for g in mesh_geoms))


__all__ = ["decimate_mesh", "decimated_copy", "drawn_faces", "drawn_only_meshes"]
