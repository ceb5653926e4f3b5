"""The rollout engine a config names (``rollout.engine``): ``hf`` (:class:`~mmrft.rollout.hf.HFEngine`,
the policy itself), ``vllm`` (:class:`~mmrft.rollout.vllm.VLLMEngine`, in-process) or
``vllm_server`` (:class:`~mmrft.rollout.served.ServedEngine`, HTTP to vLLM's server). The vLLM
engines are imported only when chosen."""

from __future__ import annotations

import dataclasses
from typing import Any

from mmrft.policy.model import Policy
from mmrft.rollout.base import Engine
from mmrft.rollout.hf import HFEngine

ENGINES = ("hf", "vllm", "vllm_server")


def build_engine(
    rollout: Any,
    policy: Policy,
    *,
    model_path: str = "",
    limits: dict[str, int] | None = None,
    seed: int = 0,
    keep_media: bool = False,
) -> Engine:
    """The engine named by ``rollout.engine`` (``rollout``: :class:`mmrft.config.RolloutConfig`).

    For ``vllm`` and ``vllm_server``: ``model_path`` is the checkpoint it loads first, ``limits``
    the most media of each kind one prompt holds, ``seed`` its global seed when
    ``rollout.vllm.seed`` is unset. ``keep_media``: the ``hf`` engine's prompt rows keep the
    media as loaded (``engine_media``, as the vLLM engines' do) for a served teacher.
    """
    if rollout.engine == "hf":
        return HFEngine(
            policy, rollout.batch_size, rollout.timeout_s, rollout.group_shared, keep_media
        )
    settings = rollout.vllm
    if settings.seed is None:
        settings = dataclasses.replace(settings, seed=seed)
    if rollout.engine == "vllm":
        from mmrft.rollout.vllm import VLLMEngine

        return VLLMEngine(policy, settings, limits or {}, model_path)
    if rollout.engine == "vllm_server":
        from mmrft.rollout.served import ServedEngine

        return ServedEngine(policy, settings, rollout.server, limits or {}, model_path)
    raise ValueError(
        f"rollout.engine: unknown engine '{rollout.engine}' (known: {', '.join(ENGINES)})"
    )
