"""The policy layer: the model being trained, as the engines and the update both use it.

What it is: loading (LoRA, frozen vision tower, gradient checkpointing) and the per-completion
log-probs (:mod:`.model`), the group-shared packed forward (:mod:`.group`: G completions behind one
prompt pass), and the rows it scores, prompt plus multi-turn trajectory (:mod:`.trajectory`).
The ``hf`` engine samples with it and the trainer updates it, so it sits under both
:mod:`mmrft.rollout` and :mod:`mmrft.training`.

May import: the base, :mod:`mmrft.runtime`, :mod:`mmrft.data`, :mod:`mmrft.models`. It knows
nothing of rewards (the two layers are independent).

Exports: the names of :mod:`.model` (``from mmrft.policy import Policy, load_policy``).
"""

from mmrft.models.family import build_family, go_offline_if_unreachable
from mmrft.policy.model import (
    DTYPES,
    PEFT_PREFIX,
    Policy,
    completion_logps,
    is_lora,
    load_policy,
    lora_targets,
    merged_weights,
    pad_completions,
    resolve_family,
    save_pretrained,
)

__all__ = [
    "DTYPES",
    "PEFT_PREFIX",
    "Policy",
    "build_family",
    "completion_logps",
    "go_offline_if_unreachable",
    "is_lora",
    "load_policy",
    "lora_targets",
    "merged_weights",
    "pad_completions",
    "resolve_family",
    "save_pretrained",
]
