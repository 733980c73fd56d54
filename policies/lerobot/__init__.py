"""Pretrained VLAs in LeRobot's format as policy families: ``pi0``, ``pi05`` and ``smolvla``.

LeRobot's own model classes run inside our :class:`~policies.base.Policy` contract: the denoising
loop is driven step by step through their pieces (the VLM prefix once per chunk, its KV cache, then
the action expert's ``denoise_step``), so the ODE matches LeRobot's ``predict_action_chunk`` with the
same noise, and Flow-SDE gets exact Gaussian log-probabilities. LeRobot needs CPython >= 3.12 and
torch < 2.12: these families run in ``.venv-lerobot`` (``scripts/setup.sh``), not in ``.venv``.

    import policies
    policy = policies.load("path/to/lerobot/checkpoint")      # a folder saved by LeRobot
    policies.lerobot.export_lerobot(policy, "out/folder")      # loads back in LeRobot itself
"""

from policies.lerobot.configuration_lerobot import LeRobotVLAConfig, Pi0Config, Pi05Config, SmolVLAConfig

__all__ = ["LeRobotVLAConfig", "Pi0Config", "Pi05Config", "SmolVLAConfig", "export_lerobot", "load_lerobot"]


def __getattr__(name: str):  # the model code (and LeRobot) only on use
    if name in ("export_lerobot", "load_lerobot"):
        from policies.lerobot import checkpoint

        return getattr(checkpoint, name)
    raise AttributeError(name)
