"""Choice of the OpenGL platform for MuJoCo's offscreen renderer (EGL, OSMesa fallback)."""

from __future__ import annotations

import os
import subprocess
import sys

_PROBE = "import mujoco\nfrom mujoco.egl import GLContext\nctx = GLContext(64, 64); ctx.make_current(); ctx.free()\n"


def select_gl_backend() -> str:
    """Set ``MUJOCO_GL`` (and ``PYOPENGL_PLATFORM``) if unset; return the backend in use.

    Must run before ``mujoco`` is first imported in this process. The choice is inherited by
    child processes (Ray workers, data loaders) through the environment, so the probe runs once.
    """
    chosen = os.environ.get("MUJOCO_GL", "").strip().lower()
    if not chosen:
        env = dict(os.environ, MUJOCO_GL="egl", PYOPENGL_PLATFORM="egl")
        try:
            ok = (
                subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, timeout=60).returncode == 0
            )
        except (OSError, subprocess.TimeoutExpired):
            ok = False
        chosen = "egl" if ok else "osmesa"
        os.environ["MUJOCO_GL"] = chosen
    if chosen in ("egl", "osmesa"):
        os.environ.setdefault("PYOPENGL_PLATFORM", chosen)
    return chosen
