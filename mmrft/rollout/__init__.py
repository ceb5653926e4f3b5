"""Rollout engines: prompts in, completions out, behind one small interface (:class:`Engine`).

``hf`` (:class:`HFEngine`) samples with the policy itself; ``vllm``
(:class:`mmrft.rollout.vllm.VLLMEngine`, imported only when chosen) runs vLLM in the same
process with the policy's weights pushed after every optimizer step; ``vllm_server``
(:class:`mmrft.rollout.served.ServedEngine`) talks HTTP to vLLM's own server process, started
by mmrft or reached at ``rollout.server.url``, and pushes the weights through a safetensors
directory. The collector (:mod:`mmrft.collector`) never looks past the protocol.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mmrft.policy import Policy
from mmrft.rollout.base import Engine, Rollouts, Sampling, cut_at_stop, stop_token_ids
from mmrft.rollout.hf import HFEngine

ENGINES = ("hf", "vllm", "vllm_server")

__all__ = [
    "ENGINES",
    "Engine",
    "HFEngine",
    "Rollouts",
    "Sampling",
    "build_engine",
    "cut_at_stop",
    "stop_token_ids",
]


def build_engine(
    rollout: Any,
    policy: Policy,
    *,
    model_path: str = "",
    limits: dict[str, int] | None = None,
    seed: int = 0,
) -> Engine:
    """The engine named by ``rollout.engine`` (``rollout``: :class:`mmrft.config.RolloutConfig`).

    For ``vllm`` and ``vllm_server``: ``model_path`` is the checkpoint it loads first, ``limits``
    the most media of each kind one prompt holds, ``seed`` its global seed when
    ``rollout.vllm.seed`` is unset.
    """
    if rollout.engine == "hf":
        return HFEngine(policy, rollout.batch_size, rollout.timeout_s, rollout.group_shared)
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
