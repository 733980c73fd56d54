"""Typed configuration schemas shared by the Hydra apps.

Dataclasses hold the fields and their documentation; YAML under ``configs/`` only selects and
overrides. Each app stores its top-level schema in Hydra's ConfigStore under ``<app>_schema`` and
its YAML starts with ``defaults: [<app>_schema, ...]``, so an unknown key or a value of the
wrong type fails before anything runs. The members of a config group extend their group's schema,
stored at the root of the ConfigStore so that it is no option of the group (``algo/ppo.yaml``:
``defaults: [/algo_schema@_here_]``). Every command is declared with :func:`hydra_app`, which
also refuses keys that Hydra would let in with ``+`` / ``++``, naming the closest valid key.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, NoReturn, Optional

from hydra.core.config_store import ConfigStore

from sims.registry import closest_key


@dataclass
class SimConfig:
    """Which simulator and scene (config group ``sim``)."""

    backend: str = "mujoco"  # mujoco | mujoco_gpu | maniskill
    suite: Optional[str] = "spatial"  # a task suite (sims.suites.names()), or null with a task
    task: Optional[str] = None  # a stand-alone task (sims.tasks()), used when suite is null
    num_envs: int = 8  # envs stepped together
    cameras: list[str] = field(default_factory=lambda: ["agentview", "wrist"])  # [] for state only
    image_size: int = 128  # square camera images (pixels)
    num_threads: int = 0  # MuJoCo C threads stepping the batch; 0 = all cores
    control_hz: float = 20.0  # control rate of one env step
    action_mode: str = "ee_delta"  # ee_delta (7-D) | joint_pos (8-D)
    reward_type: str = "sparse"  # sparse success | dense shaped terms


def make_env(sim: SimConfig, *, seed: int = 0, device: str = "cpu", **overrides: Any):
    """Build the :class:`sims.VecEnv` a :class:`SimConfig` describes."""
    import sims

    kwargs: dict[str, Any] = dict(
        num_envs=sim.num_envs,
        cameras=tuple(sim.cameras),
        image_size=sim.image_size,
        num_threads=sim.num_threads or None,
        control_hz=sim.control_hz,
        action_mode=sim.action_mode,
        reward_type=sim.reward_type,
    )
    kwargs.update(overrides)
    if (sim.suite is None) == (sim.task is None):
        raise ValueError("set exactly one of sim.suite and sim.task (the other to null)")
    return sims.make(sim.backend, suite=sim.suite, task=sim.task, seed=seed, device=device, **kwargs)


def store(name: str, node: Any, group: str | None = None) -> None:
    """Register a schema in Hydra's ConfigStore (idempotent)."""
    ConfigStore.instance().store(name=name, node=node, group=group)


def register_policy_schemas() -> None:
    """Store each family's typed config (plus a ``family`` field) as ``policy_<family>_schema``.

    ``configs/policy/<family>.yaml`` extends it (``defaults: [/policy_<family>_schema@_here_]``), so
    every model field is a typed override: ``policy=flow policy.num_steps=4``. The schemas sit at
    the root of the ConfigStore, outside the group ``policy``, so they are no option of it.
    """
    from dataclasses import field as dc_field
    from dataclasses import make_dataclass

    import policies

    for family in policies.families():
        try:
            cls = policies.config_class(family)
        except ImportError:  # a family whose code is not installed is simply not offered
            continue
        node = make_dataclass(f"{cls.__name__}Node", [("family", str, dc_field(default=family))], bases=(cls,))
        store(f"policy_{family}_schema", node)


def policy_overrides(node: Any) -> tuple[str, dict[str, Any]]:
    """``(family, config fields)`` of a policy node from the ``policy`` config group."""
    from dataclasses import asdict, is_dataclass

    data = asdict(node) if is_dataclass(node) else dict(node)
    family = data.pop("family", None)
    if family is None:
        raise ValueError("policy.family is missing: use policy=flow|autoregressive|diffusion")
    return family, data


# --- unknown keys on the command line -------------------------------------------------------------
# Hydra answers a mistyped key with "To append to your config use +key=value", and then accepts the
# '+' form: the key is added to the config and silently ignored by the app. Every embodied-* command
# is declared with :func:`hydra_app` instead of ``hydra.main``, which refuses keys that no schema
# declares, naming the closest one, before Hydra starts (and so before the run folder is made).


@dataclass
class UnknownKey:
    """A key that no schema declares: its dotted ``path`` and the keys valid at its place."""

    path: str
    valid: list[str]  # keys of the node that lacks it (unselected: the group's options)
    depth: int  # index of the unknown component in ``path``
    unselected: bool = False  # the path runs into a config group that nothing selects (e.g. policy: null)

    def message(self, command: str) -> str:
        """``"<command>: unknown key 'a.b'; did you mean 'a.c'?"`` (or the valid keys when none is close)."""
        parts = self.path.split(".")
        if self.unselected:
            group = ".".join(parts[: self.depth])
            return (
                f"{command}: unknown key {self.path!r}: no {group} is selected, so it has no keys; "
                f"select one first: {group}={'|'.join(self.valid)}"
            )
        guess = closest_key(parts[self.depth], self.valid)
        where = ".".join(parts[: self.depth])
        if guess is not None:
            hint = f"did you mean {'.'.join(parts[: self.depth] + [guess] + parts[self.depth + 1 :])!r}?"
        else:
            hint = f"valid keys{' of ' + where if where else ''}: {', '.join(self.valid)}"
        return f"{command}: unknown key {self.path!r}; {hint}"


def _schema_type(node: Any) -> Optional[type]:
    """The dataclass a composed config node is typed by, or None for a plain dict."""
    import dataclasses

    from omegaconf import DictConfig, OmegaConf

    if not isinstance(node, DictConfig) or node._is_none() or node._is_missing():
        return None
    kind = OmegaConf.get_type(node)
    return kind if kind is not None and dataclasses.is_dataclass(kind) else None


def unknown_keys(cfg: Any, prefix: str = "") -> list[UnknownKey]:
    """Keys of a composed config that its schemas do not declare, at any depth.

    A node typed by a dataclass (an app's schema, ``algo``, ``runtime``, the selected ``policy``
    family, a benchmark's subclass, ...) may hold only that dataclass's fields; plain dicts (fields
    typed ``dict``, ``policy=expert``) hold any key. Hydra refuses such keys itself unless they
    come with ``+`` / ``++``, which is how they get in.
    """
    import dataclasses

    from omegaconf import DictConfig, ListConfig

    found: list[UnknownKey] = []
    if cfg._is_none() or cfg._is_missing():
        return found
    kind = _schema_type(cfg)
    keys = [str(k) for k in cfg.keys()] if isinstance(cfg, DictConfig) else []
    declared = [f.name for f in dataclasses.fields(kind)] if kind is not None else None
    for key in keys:
        if not prefix and key == "hydra":
            continue
        path = f"{prefix}{key}"
        if declared is not None and key not in declared:
            found.append(UnknownKey(path, declared, path.count(".")))
            continue
        child = cfg._get_node(key)
        if isinstance(child, (DictConfig, ListConfig)):
            found += unknown_keys(child, path + ".")
    if isinstance(cfg, ListConfig):
        for i in range(len(cfg)):
            child = cfg._get_node(i)
            if isinstance(child, (DictConfig, ListConfig)):
                found += unknown_keys(child, f"{prefix}{i}.")
    return found


def check_key_paths(cfg: Any, paths: Iterable[str], groups: Optional[dict[str, list[str]]] = None) -> list[UnknownKey]:
    """Dotted key paths (of command-line overrides) that do not exist in the composed config ``cfg``
    where a schema fixes the keys. ``groups``: config group -> its options; a path into a group
    left unselected (null) is refused too. A path that runs into a plain dict, a list or another
    empty value is left to Hydra."""
    from omegaconf import DictConfig

    found = []
    for path in paths:
        node = cfg
        parts = path.split(".")
        for depth, part in enumerate(parts):
            if not isinstance(node, DictConfig) or node._is_none() or node._is_missing():
                group = ".".join(parts[:depth])
                if depth and groups and group in groups and (node is None or node._is_none()):
                    found.append(UnknownKey(path, groups[group], depth, unselected=True))
                break
            keys = [str(k) for k in node.keys()]
            if part in keys:
                node = node._get_node(part)
                continue
            kind = _schema_type(node)
            if kind is not None:
                found.append(UnknownKey(path, [k for k in keys if not (depth == 0 and k == "hydra")], depth))
            break
    return found


def command_line_problems(config_name: str, overrides: list[str]) -> list[UnknownKey]:
    """The unknown keys among command-line ``overrides`` of the app whose primary config is
    ``configs/<config_name>.yaml``. The config is composed from the group selections alone (they
    decide which keys exist) and every other override's key, with or without ``+`` / ``++``, is
    looked up in it; ``hydra.*`` keys and groups (``hydra/job_logging=...``) are Hydra's to check.
    Anything that does not parse or compose is left to Hydra, which reports it as before."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(overrides=list(overrides))
    except Exception:  # noqa: BLE001  (Hydra prints its own parse error)
        return []
    rest = [o for o in parsed if o.key_or_group != "hydra" and not o.key_or_group.startswith(("hydra.", "hydra/"))]
    try:
        with initialize_config_module(config_module="configs", version_base="1.3"):
            loader = GlobalHydra.instance().config_loader()
            groups = {g: loader.get_group_options(g) for g in loader.list_groups("") if g != "hydra"}
            selections = [o for o in rest if "/" in o.key_or_group or o.key_or_group in groups]
            keys = [o.key_or_group for o in rest if o not in selections]
            if not keys:
                return []
            cfg = compose(config_name=config_name, overrides=[o.input_line for o in selections])
    except Exception:  # noqa: BLE001  (an unknown group option and the like: Hydra reports it)
        return []
    return check_key_paths(cfg, keys, groups)


def _refuse(command: str, problems: list[UnknownKey]) -> NoReturn:
    for problem in problems:
        print(problem.message(command), file=sys.stderr, flush=True)
    raise SystemExit(2)


def check_command_line(command: str, config_name: str, argv: list[str]) -> None:
    """Exit with status 2 and one line per unknown key if ``argv`` (the arguments after the program
    name) overrides a key that the app's schemas do not declare; see :func:`command_line_problems`."""
    import argparse

    from hydra._internal.utils import get_args_parser

    if any(a in argv for a in ("--version", "-sc", "--shell-completion", "--experimental-rerun")) or any(
        a.split("=")[0] in ("--config-path", "-cp", "--config-dir", "-cd") for a in argv
    ):
        return  # another config search path, or no composition at all: Hydra's business

    class _Unparsable(Exception):
        pass

    def _raise(message: str) -> NoReturn:
        raise _Unparsable(message)

    parser = get_args_parser()
    parser.error = _raise  # type: ignore[method-assign]
    try:
        args: argparse.Namespace = parser.parse_args(argv)
    except _Unparsable:
        return  # Hydra prints its own usage error
    problems = command_line_problems(args.config_name or config_name, list(args.overrides or []))
    if problems:
        _refuse(command, problems)


def rewrite_moved_keys(
    command: str, argv: list[str], moved: dict[str, str], rewrite: Callable[[str, str], list[str]]
) -> list[str]:
    """``argv`` with every ``key=value`` whose key (without ``+`` / ``++``) is an old key of ``moved``
    (old key -> its new place) replaced by ``rewrite(key, value)``, each with a deprecation message on
    stderr naming the new form. Other arguments pass unchanged."""
    out: list[str] = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        bare = key.lstrip("+")
        if not sep or bare not in moved:
            out.append(arg)
            continue
        new = rewrite(bare, value)
        print(
            f"{command}: {bare}= is deprecated and will be removed in the next release; use {' '.join(new)}",
            file=sys.stderr,
            flush=True,
        )
        out += new
    return out


def hydra_app(
    command: str,
    config_name: str,
    moved: Optional[tuple[dict[str, str], Callable[[str, str], list[str]]]] = None,
) -> Callable[[Callable[[Any], Any]], Callable[..., Any]]:
    """``hydra.main`` of the ``embodied-*`` command ``command`` on ``configs/<config_name>.yaml``,
    refusing unknown keys: the command line is checked before Hydra starts (exit status 2, the
    closest valid key named, nothing created), and the composed config once more against its
    schemas before the app runs. ``moved``: ``(old key -> new place, rewrite)`` for keys that moved;
    the old ones keep working through :func:`rewrite_moved_keys`."""
    import functools

    import hydra

    def decorate(task: Callable[[Any], Any]) -> Callable[..., Any]:
        @functools.wraps(task)
        def checked(cfg: Any) -> Any:
            problems = unknown_keys(cfg)
            if problems:
                _refuse(command, problems)
            return task(cfg)

        run = hydra.main(config_path="pkg://configs", config_name=config_name, version_base="1.3")(checked)

        @functools.wraps(task)
        def main(cfg_passthrough: Any = None) -> Any:
            if cfg_passthrough is None:
                if moved is not None:
                    sys.argv[1:] = rewrite_moved_keys(command, sys.argv[1:], *moved)
                check_command_line(command, config_name, sys.argv[1:])
            return run(cfg_passthrough)

        return main

    return decorate
