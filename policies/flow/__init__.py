"""Flow-matching VLA (pi_0-style) with ODE, Flow-SDE and Flow-Noise samplers.

``from policies.flow.sde import sde_step`` gives the Flow-SDE transition as a pure function.
"""

from policies.flow.configuration_flow import FlowConfig

__all__ = ["FlowConfig"]
