"""The rewards layer: what scores an answer.

What it is: the verifier API (:mod:`.verifier`: :class:`Score`, ``@verifier``, bound verifiers
and their budgets), plain reward functions (:mod:`.functions`), the worker processes verifiers
run in (:mod:`.pool`), the weighted reward of a run (:mod:`.reward`), the task API (:mod:`.task`:
prompts, targets, evaluation metrics), and what verifiers and tasks share: answer parsing
(:mod:`.answers`), boxes and their frames (:mod:`.boxes`), metrics (:mod:`.metrics`: COCO mAP,
temporal recall), the sandbox for model-written code (:mod:`.sandbox`) and model judges
(:mod:`.judges`).

May import: the base, :mod:`mmrft.runtime`, :mod:`mmrft.data`, :mod:`mmrft.models` (the task API
names a family's box frame). It does not know the policy, the engines or the trainer: a verifier
sees text, samples and, when it asks, trajectories as plain objects.

Exports: the names of :mod:`.verifier` and :mod:`.reward` (``from mmrft.rewards import Score,
verifier``); plugins import parsing helpers from ``mmrft.rewards.answers``, ``.boxes``,
``.metrics``, ``.sandbox``, ``.judges`` and the task API from ``mmrft.rewards.task``.
"""

from mmrft.rewards.reward import (
    RewardBreakdown,
    WeightedReward,
    build_reward,
    timeout_score,
)
from mmrft.rewards.verifier import (
    RANGE_TOLERANCE,
    BoundVerifier,
    NonFiniteRewardError,
    RewardError,
    Score,
    VerifierError,
    VerifierFn,
    VerifierSpec,
    VerifierTimeoutError,
    as_score,
    call_with_budget,
    group_spans,
    verifier,
    write_failure,
)

__all__ = [
    "RANGE_TOLERANCE",
    "BoundVerifier",
    "NonFiniteRewardError",
    "RewardBreakdown",
    "RewardError",
    "Score",
    "VerifierError",
    "VerifierFn",
    "VerifierSpec",
    "VerifierTimeoutError",
    "WeightedReward",
    "as_score",
    "build_reward",
    "call_with_budget",
    "group_spans",
    "timeout_score",
    "verifier",
    "write_failure",
]
