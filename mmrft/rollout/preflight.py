"""What a run's start-up can check without a model (:func:`preflight`), in about a second.

A training or evaluation run imports torch and transformers (seconds), creates its run folder,
reads its data and loads its weights (minutes on a real model). Every mistake that needs none
of that is found here first, before those imports and before the run folder exists, with the
same one-line error the later step would give: the config's keys and types (already checked by
``load_config``), the plugins, the task and its parameters, each verifier with its parameters,
the prompt sampler with its parameters, the tools, that the data files exist, that the extras
the settings need are installed, that ``model.path`` is a checkpoint folder or a hub id that
can be had (its family found from ``config.json``), and that a CUDA device asked for exists.

This module imports nothing heavy (no torch, no transformers: a test keeps it so); the device
check alone imports torch, and only when ``device`` names CUDA.
"""

from __future__ import annotations

import importlib.util
from typing import Any, NamedTuple

from mmrft.config import RunConfig, resolve_path
from mmrft.data import DataError
from mmrft.models.family import ModelFamily, resolve_family
from mmrft.plugins import TASKS, load_plugins
from mmrft.rewards.reward import bind_verifiers
from mmrft.rewards.task import Task, build_task
from mmrft.rollout.sampling import build_sampler
from mmrft.rollout.tool import ToolSpec, enabled_tools
from mmrft.typecheck import ConfigError


class Checked(NamedTuple):
    """What :func:`preflight` built on the way: the run's task and model family adapter."""

    task: Task
    family: ModelFamily


def preflight(cfg: RunConfig, training: bool = True) -> Checked:
    """Check ``cfg`` against the plugins, the files and this installation (module docstring);
    the task and model family it names. ``training=False`` (an evaluation): the training split, the
    reward and the sampler are not needed and not checked. Raises ConfigError, DataError or
    UnknownNameError with one line naming the key or file."""
    load_plugins(cfg.plugins)
    task = build_task(
        cfg.task.name, cfg.task.params, cfg.task.system_prompt, cfg.task.param_sources
    )
    if training:
        bind_verifiers(cfg.reward.verifiers or task.default_verifiers())
        build_sampler(cfg.data.sampler, cfg.data.sampler_params, [])
    if cfg.eval.verifiers:
        bind_verifiers(cfg.eval.verifiers, key="eval.verifiers")
    elif not training and TASKS.get(cfg.task.name).scored_by_reward and cfg.reward.verifiers:
        bind_verifiers(cfg.reward.verifiers)
    configured_tools(cfg)
    splits = {"data.train": cfg.data.train if training else None, "data.test": cfg.data.test}
    for key, path in splits.items():
        if path and not resolve_path(path).exists():
            raise DataError(f"dataset file not found: {resolve_path(path)} ({key})")
    check_extras(cfg, training)
    family = resolve_family(cfg.model)
    check_device(cfg.device)
    return Checked(task, family)


def configured_tools(cfg: RunConfig) -> dict[str, ToolSpec]:
    """The tools ``rollout.tools.names`` enables by name, or the methods of the environment
    ``rollout.tools.environment`` (``{}``: none); an unknown name is a :class:`ConfigError`
    naming the key and the closest registered names."""
    if cfg.rollout.tools.environment:
        try:
            return configured_environment(cfg).tools
        except TypeError as exc:  # a method whose schema cannot be built
            raise ConfigError(f"rollout.tools.environment: {exc}") from None
    try:
        return enabled_tools(cfg.rollout.tools.names)
    except KeyError as exc:
        raise ConfigError(f"rollout.tools.names: {exc.args[0]}") from None


def configured_environment(cfg: RunConfig) -> Any:
    """The :class:`~mmrft.rollout.environment.EnvironmentSpec` of ``rollout.tools.environment``
    (None when unset); an unknown name is a :class:`ConfigError` with the closest names."""
    from mmrft.plugins import ENVIRONMENTS

    name = cfg.rollout.tools.environment
    if not name:
        return None
    try:
        return ENVIRONMENTS.get(name)
    except KeyError as exc:
        raise ConfigError(f"rollout.tools.environment: {exc.args[0]}") from None


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


#: The one line for a vLLM engine without vLLM in this Python (rollout.engine), here and where
#: the engine starts.
VLLM_MISSING = {
    "vllm": (
        "rollout.engine=vllm needs vLLM: pip install 'mmrft[vllm]' (GPU), or the CPU build in "
        "its own virtualenv (make test-vllm shows how); or rollout.engine=hf"
    ),
    "vllm_server": (
        "rollout.engine=vllm_server starts vLLM's server from this Python, which has no vLLM: "
        "pip install 'mmrft[vllm]' (GPU) or use the CPU build's virtualenv (make test-vllm); or "
        "give rollout.server.url of a server started elsewhere"
    ),
}


def check_extras(cfg: RunConfig, training: bool = True) -> None:
    """ConfigError naming the setting and the pip line when a package the settings need is not
    installed (found by name, nothing imported): vLLM for ``rollout.engine=vllm`` and for a
    ``vllm_server`` that mmrft starts; the trackers of ``train.trackers`` (DeepSpeed for
    ``train.sharding``: :func:`mmrft.config.check_config`)."""
    engine = cfg.rollout.engine
    started_here = engine == "vllm" or (engine == "vllm_server" and not cfg.rollout.server.url)
    if started_here and not _installed("vllm"):
        raise ConfigError(VLLM_MISSING[engine])
    for tracker in cfg.train.trackers if training else []:
        if not _installed(tracker):  # the packages are named as the trackers
            raise ConfigError(
                f"train.trackers: '{tracker}' needs the '{tracker}' package: "
                "pip install 'mmrft[track]'"
            )


def check_device(name: str) -> None:
    """ConfigError when ``device`` names CUDA and this machine has none (imports torch, ~2 s:
    only then)."""
    if name == "cuda":
        from mmrft.runtime.device import pick_device

        pick_device(name)
