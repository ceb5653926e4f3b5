"""The teacher of on-policy distillation (``teacher.path``): a frozen model of the policy's
family and tokenizer that scores the policy's own sampled tokens.

The teacher reads the very rows the policy's processor prepared for training (token ids,
patches, audio features): its forward is the policy's training forward
(:func:`mmrft.policy.group.rollout_logps`, group-shared or per completion) with another model.
So the two must agree on what a token id and a patch mean; :func:`check_teacher` refuses at
start-up a teacher of another family, another vocabulary or other preprocessing, naming the
first difference.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from mmrft.config import LoraConfig, RunConfig
from mmrft.models.family import resolve_family
from mmrft.policy.model import Policy, load_policy
from mmrft.typecheck import ConfigError

# What a processor turns media into, per sub-processor: a teacher must read the policy's
# prepared patches and features exactly as the policy does.
PREPROCESSING_KEYS = (
    "patch_size",
    "merge_size",
    "temporal_patch_size",
    "image_mean",
    "image_std",
    "rescale_factor",
    "do_normalize",
    "sampling_rate",
    "feature_size",
    "hop_length",
    "n_fft",
)
SUB_PROCESSORS = ("image_processor", "video_processor", "feature_extractor")


def teacher_family(cfg: RunConfig, policy: Policy, path: str, key: str = "teacher.path") -> Any:
    """The model family of the teacher checkpoint ``path`` (its config only), refused with a
    :class:`ConfigError` naming ``key`` unless it is the policy's."""
    family = resolve_family(
        dataclasses.replace(cfg.model, path=path, lora=LoraConfig(enabled=False))
    )
    if family.name != policy.family.name:
        raise ConfigError(
            f"{key}: a {family.name} model, the policy ({cfg.model.path}) is {policy.family.name}; "
            "on-policy distillation needs a teacher of the policy's family (the same token ids "
            "and media preprocessing)"
        )
    return family


def load_teacher(cfg: RunConfig, policy: Policy, device: torch.device) -> Policy:
    """``teacher.path`` loaded frozen (eval mode, no gradients) in ``teacher.dtype`` (default
    ``model.dtype``), checked against ``policy`` (:func:`check_teacher`). Returned with the
    policy's family adapter, which prepares the rows both models read."""
    model_cfg = dataclasses.replace(
        cfg.model,
        path=cfg.teacher.path,
        dtype=cfg.teacher.dtype or cfg.model.dtype,
        attn_implementation=cfg.teacher.attn_implementation or cfg.model.attn_implementation,
        lora=LoraConfig(enabled=False),
        gradient_checkpointing=False,
    )
    family = teacher_family(cfg, policy, str(cfg.teacher.path))
    teacher = load_policy(model_cfg, device, trainable=False, family=family)
    try:
        check_teacher(policy.processor, teacher.processor)
    except ValueError as exc:
        raise ConfigError(f"teacher.path: {exc}") from None
    return Policy(policy.family, teacher.model, teacher.processor)


def check_teacher(policy: Any, teacher: Any) -> None:
    """Raise ``ValueError`` naming the first difference when token ids or media preprocessing
    mean something else to the ``teacher``'s processor than to the ``policy``'s: the vocabulary
    (every token's id, special tokens included) and the :data:`PREPROCESSING_KEYS` of each
    sub-processor."""
    mine, theirs = policy.tokenizer.get_vocab(), teacher.tokenizer.get_vocab()
    if mine != theirs:
        moved = sorted(t for t in mine.keys() & theirs.keys() if mine[t] != theirs[t])
        only_mine, only_theirs = (
            sorted(mine.keys() - theirs.keys()),
            sorted(theirs.keys() - mine.keys()),
        )
        if moved:
            token = moved[0]
            detail = f"{len(moved)} tokens have other ids, e.g. {token!r}: {mine[token]} vs {theirs[token]}"
        elif only_mine:
            detail = f"{len(only_mine)} of the policy's tokens are missing, e.g. {only_mine[0]!r}"
        else:
            detail = f"{len(only_theirs)} tokens the policy lacks, e.g. {only_theirs[0]!r}"
        raise ValueError(
            f"the teacher's vocabulary differs from the policy's ({len(theirs)} vs {len(mine)} "
            f"tokens; {detail}): the teacher must score the policy's token ids as the same text"
        )
    for name in SUB_PROCESSORS:
        a, b = getattr(policy, name, None), getattr(teacher, name, None)
        if a is None or b is None:
            continue
        for key in PREPROCESSING_KEYS:
            x, y = _setting(a, key), _setting(b, key)
            if x != y:
                raise ValueError(
                    f"the teacher's {name}.{key} is {y!r}, the policy's {x!r}: the teacher reads "
                    "the media the policy's processor prepared"
                )


def _setting(processor: Any, key: str) -> Any:
    value = getattr(processor, key, None)
    return list(value) if isinstance(value, (tuple, list)) else value
