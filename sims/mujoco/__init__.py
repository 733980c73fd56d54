"""MuJoCo backend (CPU): ``mujoco.batch`` stepping on MuJoCo's C threads, offscreen rendering.

Importing this package picks the OpenGL platform for offscreen rendering before MuJoCo is
imported: ``MUJOCO_GL`` if the user set it, else EGL when an EGL context can be made (probed
once in a subprocess), else OSMesa.
"""

from sims.mujoco.gl import select_gl_backend

select_gl_backend()
