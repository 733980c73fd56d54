"""One setting, one name, one place: the typed configs ``embodied-train``'s parts receive, the YAML keys
that reach them under the same names and defaults, their own checks, and the deprecated dict forms.
No Ray is started here."""

from __future__ import annotations

import ast
import dataclasses
import pickle
from pathlib import Path

import pytest
import yaml
from conftest import compose

from embodied.algorithms.batch import AdvantageConfig
from embodied.algorithms.critic import CriticConfig
from embodied.algorithms.loss import LossConfig
from embodied.algorithms.sampling import EnvRunnerSettings
from embodied.algorithms.update import UpdateConfig
from embodied.runners.train import AlgoConfig, RuntimeConfig, TrainConfig, TrainError, check_config

ROOT = Path(__file__).resolve().parents[2]
RUN = ["out=unused", "suite=goal", "tasks=[2,3]", "num_envs=2", "image_size=32", "chunks_per_iter=3"]
#: fields of the parts' configs that no YAML key sets: derived by embodied-train, or left at their default
DERIVED = {"use_critic", "advantages", "inference_device", "torch_threads", "num_threads"}


def _defaults(cls: type) -> dict[str, object]:
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


@pytest.mark.parametrize(
    "part,schema",
    [
        (AdvantageConfig, AlgoConfig),
        (UpdateConfig, AlgoConfig),
        (LossConfig, AlgoConfig),
        (CriticConfig, AlgoConfig),
        (EnvRunnerSettings, TrainConfig),
    ],
)
def test_each_setting_is_a_yaml_key_of_the_same_name_and_default(part, schema):
    """Every field of a part's config is the YAML key of the same name, whose default is the part's own
    (the schema refers to it): adding a setting is a field in the part's config and its line in the schema."""
    keys, defaults = _defaults(schema), _defaults(part)
    for f in dataclasses.fields(part):
        if f.name in DERIVED:
            continue
        assert f.name in keys, f"{part.__name__}.{f.name} is no {schema.__name__} key"
        if f.name in defaults:
            default = defaults[f.name]
            assert keys[f.name] == (list(default) if isinstance(default, tuple) else default), f.name


def test_every_algo_key_reaches_a_part():
    parts = {
        f.name for cls in (AdvantageConfig, UpdateConfig, LossConfig, CriticConfig) for f in dataclasses.fields(cls)
    }
    rollout = {"temperature", "sde_steps", "sampler"}  # the policy's sampling, set on the policy itself
    assert {f.name for f in dataclasses.fields(AlgoConfig)} - parts == rollout


@pytest.mark.parametrize("pattern,schema", [("algo/*.yaml", AlgoConfig), ("runtime/*.yaml", RuntimeConfig)])
def test_yaml_only_selects_and_overrides(pattern, schema):
    """A config group's file sets only what differs from the schema's defaults (and its own name)."""
    defaults = _defaults(schema)
    files = sorted((ROOT / "configs").glob(pattern))
    assert files
    for path in files:
        values = {k: v for k, v in yaml.safe_load(path.read_text()).items() if k not in ("defaults", "name")}
        repeated = [k for k, v in values.items() if k in defaults and defaults[k] == v]
        assert not repeated, f"{path.name} repeats the defaults of {repeated}"
    top = yaml.safe_load((ROOT / "configs" / "train.yaml").read_text())
    assert set(top) == {"defaults", "hydra"}


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda: UpdateConfig(epochs=0), "epochs=0 must be >= 1"),
        (lambda: UpdateConfig(target_kl=0.0), "target_kl=0.0 must be > 0"),
        (lambda: UpdateConfig(critic_warmup=-1), "critic_warmup=-1"),
        (lambda: LossConfig(dual_clip=1.0), "dual_clip=1.0 must be > 1"),
        (lambda: LossConfig(ratio="token"), "ratio='token': choose chunk or per_dim"),
        (lambda: AdvantageConfig(name="sac"), "name='sac': unknown algo"),
        (lambda: AdvantageConfig(name="grpo", group_size=1), "group_size=1 must be >= 2"),
        (lambda: AdvantageConfig(name="ppo", lam=1.5), "lam=1.5 must lie in"),
        (lambda: CriticConfig(critic="privileged", critic_hidden=[]), "critic_hidden=\\[\\] must list"),
        (
            lambda: EnvRunnerSettings(
                suite="goal", num_envs=3, image_size=32, chunks_per_iter=2, advantages=AdvantageConfig(name="grpo")
            ),
            "multiple of its group_size",
        ),
        (
            lambda: EnvRunnerSettings(
                suite="goal",
                num_envs=2,
                image_size=32,
                chunks_per_iter=2,
                advantages=AdvantageConfig(name="ppo"),
                init_states=3,
            ),
            "continues episodes across iterations",
        ),
        (
            lambda: EnvRunnerSettings(
                suite="goal",
                num_envs=2,
                image_size=32,
                chunks_per_iter=2,
                advantages=AdvantageConfig(name="ppo"),
                tasks=[10],
            ),
            "out of range",
        ),
    ],
)
def test_part_configs_check_themselves_when_made(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_env_runner_settings_are_frozen_and_travel_as_made():
    """What a remote runner receives is the driver's object, pickled: no dict, no key read back by name."""
    s = EnvRunnerSettings(
        suite="goal",
        num_envs=2,
        image_size=32,
        chunks_per_iter=2,
        advantages=AdvantageConfig(name="ppo"),
        latency_delays=[1],
    )
    assert s.tasks == tuple(range(10)) and s.latency_delays == (1,) and not s.grouped
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.num_envs = 4  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(s)) == s
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_steps'"):
        EnvRunnerSettings(
            suite="goal", num_envs=2, image_size=32, chunks_per_iter=2, advantages=s.advantages, max_steps=3
        )


def test_check_config_builds_the_parts_and_names_the_yaml_key():
    parts = check_config(compose("train", *RUN, "algo=flow_grpo", "algo.group_size=2", "max_episode_steps=30"))
    assert parts.env_runner.advantages == AdvantageConfig(name="flow_grpo", group_size=2)
    assert parts.env_runner.max_episode_steps == 30 and parts.env_runner.tasks == (2, 3)
    assert parts.update == UpdateConfig(critic_lr=None, epochs=1, minibatch_size=32)
    assert parts.loss == LossConfig(dual_clip=None, value_clip=None, vf_coef=0.0, use_critic=False)
    for args, message in (
        (("algo.gamma=2",), "^algo.gamma=2.0 must lie in \\[0, 1\\]$"),
        (("algo.epochs=0",), "^algo.epochs=0 must be >= 1$"),
        (("algo.critic=oracle",), "^algo.critic='oracle': choose one of policy, privileged$"),
        (("init_pool=held",), "^init_pool='held': choose random or protocol$"),
    ):
        with pytest.raises(TrainError, match=message):
            check_config(compose("train", *RUN, *args))
    with pytest.raises(TrainError, match="^save_every=0 must be >= 1$"):  # TrainConfig's own, when composed
        compose("train", *RUN, "save_every=0")


def test_the_dict_forms_of_before_still_work_for_one_release():
    """``make_env_config`` and ``build_algorithm(env_config=..., rl=...)`` are converted to the typed configs
    in the driver, with their old names; a misspelled key fails there, not inside a Ray actor."""
    from embodied.rllib import _from_legacy
    from embodied.rllib.env_runner import make_env_config, settings_from_env_config

    with pytest.warns(DeprecationWarning):
        env_config = make_env_config(
            suite="goal", tasks=[2], num_envs=2, image_size=32, chunks_per_iter=3, max_steps=40
        )
    settings = settings_from_env_config(dict(env_config, seed=5, num_envs_total=2))
    assert settings.max_episode_steps == 40 and settings.advantages.name == "ppo" and settings.tasks == (2,)
    with pytest.raises(ValueError, match="unknown env_config key\\(s\\) \\['max_step'\\]"):
        settings_from_env_config(dict(env_config, max_step=40))
    with pytest.warns(DeprecationWarning):
        env, update, loss, overlap = _from_legacy(
            env_config, {"num_epochs": 3, "grad_clip": 0.5, "overlap": True}, None, None, None, False
        )
    assert env == settings_from_env_config(env_config) and loss is None and overlap
    assert update == UpdateConfig(epochs=3, max_grad_norm=0.5)
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="unknown RL field\\(s\\) \\['epochs'\\]"):
        _from_legacy(None, {"epochs": 3}, settings, None, None, False)


def test_chunk_rl_config_carries_the_typed_configs():
    """RLlib's own ``lr`` and ``grad_clip`` are copies made from the update's config, in one place."""
    from embodied.rllib import ChunkRLConfig

    config = ChunkRLConfig().chunk_rl(update=UpdateConfig(lr=1e-3, max_grad_norm=0.5), overlap=True)
    assert (config.lr, config.grad_clip, config.overlap) == (1e-3, 0.5, True)
    assert config.update.max_grad_norm == 0.5 and config.loss == LossConfig()
    with pytest.raises(TypeError, match="update must be an embodied.algorithms.update.UpdateConfig"):
        config.chunk_rl(update={"lr": 1e-3})
    with pytest.raises(ValueError, match="runner_restart_timeout_s must be > 0"):
        config.chunk_rl(runner_restart_timeout_s=0)


def test_no_function_of_the_runners_the_rllib_adapter_the_robot_client_or_the_flow_policy_is_over_60_lines():
    files = [
        *sorted((ROOT / "embodied" / "runners").glob("*.py")),
        *sorted((ROOT / "embodied" / "rllib").glob("*.py")),
        ROOT / "real_robot" / "client.py",
        ROOT / "real_robot" / "cli.py",
        *sorted((ROOT / "policies" / "flow").glob("*.py")),
    ]
    long = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60:
                long.append(f"{path.name}:{node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert not long
