"""Benchmarks of the whole stack: the ``embodied-bench`` app (:mod:`benchmarks.cli`) and
stand-alone scripts such as ``python benchmarks/rl_lift.py``.

The top floor of the project: a benchmark may import sims, policies, embodied and real_robot;
nothing imports it.
"""
