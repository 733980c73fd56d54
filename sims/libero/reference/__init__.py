"""The programs that run inside the reference venv ``.venv-libero`` (numpy, libero, openpi-client;
never torch or mujoco 4): the official-protocol client, the scene exporter and the env benchmark.

They are started from the main venv by :func:`sims.libero.reference_command`, which puts this
folder's parent on the path so that the package imports as ``reference`` there.
"""
