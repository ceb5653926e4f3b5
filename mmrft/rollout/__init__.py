"""Rollout engines: prompts in, completions out, behind one small interface (:class:`Engine`).

``hf`` (:class:`HFEngine`) runs transformers ``generate`` on the policy itself. A second engine
(vLLM) implements the same :class:`Engine` protocol in its own module here; the collector
(:mod:`mmrft.collector`) never looks past the protocol.
"""

from __future__ import annotations

from mmrft.policy import Policy
from mmrft.rollout.base import Engine, Rollouts, Sampling, cut_at_stop, stop_token_ids
from mmrft.rollout.hf import HFEngine

ENGINES = ("hf",)

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
    name: str,
    policy: Policy,
    batch_size: int,
    timeout_s: float = 0.0,
    group_shared: bool = True,
) -> Engine:
    """The engine named by ``rollout.engine``."""
    if name == "hf":
        return HFEngine(policy, batch_size, timeout_s, group_shared)
    raise ValueError(f"rollout.engine: unknown engine '{name}' (known: {', '.join(ENGINES)})")
