"""mujoco 2.3.7's box-box contact depth in MuJoCo 4, for LIBERO's scenes.

LIBERO's objects are built from many box collision geoms, and the reference env runs mujoco 2.3.7,
whose box-box collider reports half the penetration depth that MuJoCo 4's does (two boxes 2 cm into
each other: ``dist = -0.01`` there, ``-0.02`` here). :func:`add_reference_box_pairs` makes every
box-box contact of a scene respond to a depth ``r`` as mujoco 2.3.7's responds to ``r / 2``: it adds
one explicit ``<pair>`` per box-box geom pair that MuJoCo would collide (an explicit pair replaces
the dynamic one, so nothing is counted twice), with the parameters MuJoCo would mix from the two
geoms, except

- ``solref = (timeconst, dampratio * sqrt(2))``: the stiffness ``k = 1 / (dmax^2 timeconst^2
  dampratio^2)`` halves and the damping ``b = 2 / (dmax timeconst)`` stays (a direct
  ``solref = (-stiffness, -damping)`` gets its stiffness halved);
- ``solimp``'s ``width`` doubled: the impedance at depth ``r`` is the reference's at ``r / 2``.

So the reference acceleration ``-b v - k imp(r) r`` and the regulariser ``(1 - imp) / imp`` equal the
reference's at half the depth (tested on a box at rest on a box). What it cannot reproduce: contacts
that mujoco 2.3.7's box-box collider reports and MuJoCo 4's does not find at all (edges of tilted
boxes a fraction of a millimetre apart); docs/results/libero-scenes.md measures both.
"""

from __future__ import annotations

import mujoco
import numpy as np

#: mujoco 2.3.7's box-box depth relative to MuJoCo 4's
REFERENCE_DEPTH_SCALE = 0.5


def collidable_box_pairs(model: mujoco.MjModel) -> list[tuple[int, int]]:
    """Geom id pairs ``(g1, g2)``, ``g1 < g2``, of two boxes that MuJoCo's dynamic collision would test:
    bodies of different weld groups, not a weld parent and child (unless ``filterparent`` is
    disabled), compatible ``contype``/``conaffinity``, body pair not excluded."""
    box = np.flatnonzero(model.geom_type == mujoco.mjtGeom.mjGEOM_BOX)
    weld = model.body_weldid
    weld_parent = weld[model.body_parentid[weld]]
    filter_parent = not model.opt.disableflags & mujoco.mjtDisableBit.mjDSBL_FILTERPARENT
    excluded = {int(s) for s in model.exclude_signature}
    body = model.geom_bodyid
    pairs = []
    for i, g1 in enumerate(box):
        w1 = weld[body[g1]]
        for g2 in box[i + 1 :]:
            w2 = weld[body[g2]]
            if w1 == w2:
                continue
            if filter_parent and w1 != 0 and w2 != 0 and (w1 == weld_parent[w2] or w2 == weld_parent[w1]):
                continue
            if not (
                model.geom_contype[g1] & model.geom_conaffinity[g2]
                or model.geom_contype[g2] & model.geom_conaffinity[g1]
            ):
                continue
            b1, b2 = sorted((int(body[g1]), int(body[g2])))
            if (b1 << 16) + b2 in excluded:
                continue
            pairs.append((int(g1), int(g2)))
    return pairs


def mixed_contact_params(model: mujoco.MjModel, g1: int, g2: int) -> dict:
    """The contact parameters MuJoCo uses for a dynamic contact of geoms ``g1`` and ``g2``
    (``mj_contactParam``): the higher priority's, else condim and friction maxima and
    ``solmix``-weighted ``solref``/``solimp`` (element-wise minimum of a direct ``solref``);
    margin and gap maxima. Friction as a pair's 5 values."""
    p1, p2 = model.geom_priority[g1], model.geom_priority[g2]
    if p1 != p2:
        g = g1 if p1 > p2 else g2
        condim, solref, solimp = int(model.geom_condim[g]), model.geom_solref[g].copy(), model.geom_solimp[g].copy()
        f = model.geom_friction[g]
    else:
        s1, s2 = model.geom_solmix[g1], model.geom_solmix[g2]
        if s1 < mujoco.mjMINVAL and s2 < mujoco.mjMINVAL:
            w = 0.5
        elif s1 < mujoco.mjMINVAL:
            w = 0.0
        elif s2 < mujoco.mjMINVAL:
            w = 1.0
        else:
            w = s1 / (s1 + s2)
        r1, r2 = model.geom_solref[g1], model.geom_solref[g2]
        solref = w * r1 + (1 - w) * r2 if r1[0] > 0 and r2[0] > 0 else np.minimum(r1, r2)
        solimp = w * model.geom_solimp[g1] + (1 - w) * model.geom_solimp[g2]
        condim = int(max(model.geom_condim[g1], model.geom_condim[g2]))
        f = np.maximum(model.geom_friction[g1], model.geom_friction[g2])
    return {
        "condim": condim,
        "solref": np.asarray(solref, dtype=float),
        "solimp": np.asarray(solimp, dtype=float),
        "friction": np.array([f[0], f[0], f[1], f[2], f[2]], dtype=float),
        "margin": float(max(model.geom_margin[g1], model.geom_margin[g2])),
        "gap": float(max(model.geom_gap[g1], model.geom_gap[g2])),
    }


def add_reference_box_pairs(spec: mujoco.MjSpec, depth_scale: float = REFERENCE_DEPTH_SCALE) -> int:
    """Add to ``spec`` one explicit contact pair per collidable box-box geom pair whose contacts respond
    to a depth ``r`` as MuJoCo's default ones to ``depth_scale * r`` (see the module doc; 1.0 adds
    pairs that change nothing). Unnamed geoms get names. Returns the number of pairs added.

    Raises ``ValueError`` for a model with adhesion or existing explicit pairs (not emulated)."""
    if not 0 < depth_scale <= 1:
        raise ValueError(f"depth_scale={depth_scale}: must be in (0, 1]")
    model = spec.compile()
    if np.any(model.geom_adhesion):
        raise ValueError("the model has geoms with adhesion, whose mixing this emulation does not reproduce")
    if model.npair:
        raise ValueError(
            f"the model already has {model.npair} explicit contact pairs; the emulation adds its own "
            "and would override theirs"
        )
    geoms = spec.geoms
    if len(geoms) != model.ngeom:
        raise ValueError(f"the spec lists {len(geoms)} geoms, its model {model.ngeom}")
    names = []
    for i, geom in enumerate(geoms):
        if geom.name != (model.geom(i).name or ""):
            raise ValueError(f"geom {i}: spec name {geom.name!r}, model name {model.geom(i).name!r}")
        if not geom.name:
            geom.name = f"_box_pair_geom{i}"
        names.append(geom.name)
    scale = 1.0 / depth_scale
    pairs = collidable_box_pairs(model)
    for g1, g2 in pairs:
        p = mixed_contact_params(model, g1, g2)
        solref, solimp = p["solref"], p["solimp"]
        if solref[0] > 0:
            solref[1] *= np.sqrt(scale)
        else:
            solref[0] /= scale
        solimp[2] *= scale
        spec.add_pair(
            geomname1=names[g1],
            geomname2=names[g2],
            condim=p["condim"],
            friction=p["friction"],
            solref=solref,
            solimp=solimp,
            margin=p["margin"],
            gap=p["gap"],
        )
    return len(pairs)
