"""ManiSkill3 adapter (backend ``"maniskill"``); imported lazily by :func:`sims.make`."""
