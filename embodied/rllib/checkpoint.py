"""The checkpoint of an RL run, ``out/checkpoint/``: the ``policy/`` bundle, ``train_state/``
(optimizer states, counters, RNG) and, with a separate critic, :data:`CRITIC_FILE`. It is written
aside and swapped in whole (:func:`embodied.train_state.swap_in_folder`)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Mapping, Optional

#: the separate critic's weights and input statistics in a checkpoint folder (algo.critic=privileged)
CRITIC_FILE = "critic.safetensors"


def holds_checkpoint(out: Path) -> bool:
    """Whether the run folder already holds a complete checkpoint."""
    from embodied.train_state import resolve_folder

    return resolve_folder(out / "checkpoint") is not None


def resumable(out: Path) -> Optional[Path]:
    """The complete checkpoint folder a killed run continues from, or None when it holds no policy bundle."""
    from embodied.train_state import resolve_folder

    folder = resolve_folder(out / "checkpoint")
    if folder is None or not (folder / "policy" / "config.json").is_file():
        return None
    return folder


def holds_critic(folder: Path) -> bool:
    """Whether the checkpoint was trained with a separate critic."""
    return (folder / CRITIC_FILE).is_file()


def load_resumed_policy(folder: Path, overrides: Mapping[str, Any] | None = None) -> Any:
    """The policy of a checkpoint folder (see :func:`resumable`), on the CPU, its config updated by
    ``overrides`` (:func:`policies.load`)."""
    import policies

    return policies.load(folder / "policy", device="cpu", overrides=overrides)


def load_init_policy(bundle: str, overrides: Mapping[str, Any] | None = None) -> Any:
    """An SFT bundle (or a LeRobot checkpoint folder) to start RL from, on the CPU, its config updated by
    ``overrides`` (:func:`policies.load`)."""
    import policies
    from policies.lerobot.checkpoint import is_lerobot_folder

    policy = policies.load(bundle, device="cpu", overrides=overrides)
    if is_lerobot_folder(bundle):  # a pretrained LeRobot VLA: the detached value head, fresh
        return policy
    meta = policies.checkpoint.read_meta(bundle)
    if "value_features" not in meta.get("config", {}) and hasattr(policy, "use_value_features"):
        # a bundle from before the detached, time-aware critic: SFT never trained its value head,
        # so RL starts the new one fresh (a resumed run keeps the head it was trained with)
        policy.use_value_features("detached")
    return policy


def load_progress(folder: Path) -> dict[str, Any]:
    """The training state of a checkpoint folder (:func:`embodied.train_state.load_train_state`)."""
    from embodied.train_state import load_train_state

    return load_train_state(folder / "train_state")


def save_checkpoint(out: Path, algo: Any, policy: Any, *, iteration: int, env_steps: int, algo_name: str) -> Path:
    """Bundle + training state into ``out/checkpoint`` (written aside, then swapped in)."""
    import policies
    from embodied.train_state import save_train_state, swap_in_folder

    tmp = out / ".checkpoint.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    policy.load_state_dict(algo.policy_state())
    policies.save(policy, tmp / "policy", extra={"iteration": iteration, "env_steps": env_steps, "algo": algo_name})
    save_train_state(
        tmp / "train_state", optimizer_states=algo.optimizer_states(), step=iteration, extra={"env_steps": env_steps}
    )
    critic = algo.critic_state()
    if critic:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in critic.items()}, str(tmp / CRITIC_FILE))
    return swap_in_folder(tmp, out / "checkpoint")


def restore_checkpoint(algo: Any, folder: Path, train_state: dict[str, Any]) -> None:
    """Load a resumed run's separate critic (if it had one) and the learners' optimizer states
    (``train_state``: :func:`load_progress` of ``folder``) into ``algo``."""
    if holds_critic(folder):
        from safetensors.torch import load_file

        algo.load_critic_state(load_file(str(folder / CRITIC_FILE)))
    if train_state.get("optimizer_states"):
        algo.load_optimizer_states(train_state["optimizer_states"])
