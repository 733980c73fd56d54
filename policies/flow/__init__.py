"""Flow-matching VLA (pi_0-style) with ODE, Flow-SDE and Flow-Noise samplers.

``from policies.flow.sde import sde_step`` gives the Flow-SDE transition as a pure function;
:func:`policies.flow.rtc.rtc_sample` is the real-time chunking sampler (a chunk inpainted onto the
queued plan).
"""

from policies.flow.configuration_flow import FlowConfig

__all__ = ["FlowConfig"]
