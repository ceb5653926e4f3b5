"""The policy: loading a checkpoint through its model family, and the training forward pass.

``completion_logps`` is the one forward used for the policy, the reference model and the
supervised warm start: prompts left-padded, completions right-padded, concatenated; the model
sees the whole sequence with its media and returns per-token log-probabilities of the
completion tokens only (``logits_to_keep`` limits the vocabulary projection to them).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mmrft.algorithms import TokenStat, selective_log_softmax
from mmrft.config import ModelConfig, resolve_path
from mmrft.models.family import ModelFamily, no_weight_bars, resolve_family
from mmrft.runtime import distributed
from mmrft.typecheck import ConfigError

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class Policy:
    """A loaded model with its processor and family adapter."""

    family: ModelFamily
    model: Any
    processor: Any

    @property
    def tokenizer(self) -> Any:
        return self.processor.tokenizer

    @property
    def pad_token_id(self) -> int:
        tok = self.tokenizer
        return tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device


def load_policy(
    cfg: ModelConfig,
    device: torch.device,
    trainable: bool = True,
    family: ModelFamily | None = None,
) -> Policy:
    """Load model + processor; apply vision freezing, gradient checkpointing and LoRA.
    ``family``: an adapter already built for ``cfg`` (e.g. to read the data first)."""
    family = family or resolve_family(cfg)
    path = str(resolve_path(cfg.path))
    processor = family.load_processor(path)
    with no_weight_bars():
        model = family.load_model(
            path, dtype=cfg.dtype, attn_implementation=cfg.attn_implementation
        )
    model.to(device)
    if not trainable:
        model.eval().requires_grad_(False)
        return Policy(family, model, processor)
    if cfg.freeze_vision:
        for p in family.vision_parameters(model):
            p.requires_grad_(False)
    if cfg.gradient_checkpointing:
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):  # transformers ≥ 5.x name
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        model.config.use_cache = False
    if cfg.lora.enabled:
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(
            r=cfg.lora.r,
            lora_alpha=cfg.lora.alpha,
            lora_dropout=cfg.lora.dropout,
            target_modules=lora_targets(model, family, cfg),
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(model, lora)
    model.train()
    return Policy(family, model, processor)


def lora_targets(model: Any, family: ModelFamily, cfg: ModelConfig) -> list[str]:
    """Full names of the modules that get LoRA adapters: those whose name ends with one of
    ``lora.target_modules``, outside the vision tower when ``freeze_vision`` is set (the
    vision MLP has the same ``*_proj`` names as the language model's). A matched module that
    wraps its ``torch.nn.Linear`` as ``.linear`` (Gemma 4's clipped linears in the vision and
    audio encoders), which peft cannot adapt, gets the adapter on that inner linear."""
    skip = {id(m) for m in family.vision_tower(model).modules()} if cfg.freeze_vision else set()
    names = []
    for name, module in model.named_modules():
        if id(module) in skip or not any(
            name == t or name.endswith("." + t) for t in cfg.lora.target_modules
        ):
            continue
        if not isinstance(module, torch.nn.Linear) and isinstance(
            getattr(module, "linear", None), torch.nn.Linear
        ):
            name += ".linear"
        names.append(name)
    if not names:
        raise ConfigError(f"model.lora.target_modules: no module matches {cfg.lora.target_modules}")
    return names


def pad_completions(
    completions: list[list[int]], pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad completion id lists to ``[B, C]`` with a 0/1 mask."""
    length = max(1, max(len(c) for c in completions))
    ids = torch.full((len(completions), length), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(completions), length), dtype=torch.long)
    for i, c in enumerate(completions):
        ids[i, : len(c)] = torch.as_tensor(c, dtype=torch.long)
        mask[i, : len(c)] = 1
    return ids, mask


def completion_logps(
    policy: Policy,
    prompt_rows: list[dict[str, Any]],
    completions: list[list[int]],
    token_stat: TokenStat | None = None,
    trajectories: list[Any] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """log π(c_t | prompt, c_<t) for each completion token, and ``token_stat`` of the same
    logits (e.g. :func:`mmrft.algorithms.token_entropy`).

    Args:
        prompt_rows: one prepared prompt per completion (``ModelFamily.split_rows`` output).
        completions: completion token ids (ending with the end-of-turn token when the model
            stopped, cut at the length limit otherwise).
        trajectories: tool rollouts (:mod:`mmrft.rollout.tool_loop`), one per completion: their
            observations' media follow each prompt's media and their token types mark the
            observations' placeholders, so the model places every turn's images and computes
            the multimodal positions over the whole sequence. The mask stays the token mask
            (the caller applies the loss mask).
    Returns:
        ``(logps [B, C], mask [B, C], token_stat [B, C] or None)`` on the policy's device.
    """
    from mmrft.policy.trajectory import with_media

    device = policy.device
    if trajectories is not None:
        prompt_rows = [with_media(row, [t]) for row, t in zip(prompt_rows, trajectories)]
    prompt = policy.family.collate_rows(prompt_rows, policy.pad_token_id)
    completion_ids, completion_mask = pad_completions(completions, policy.pad_token_id)
    input_ids = torch.cat([prompt.pop("input_ids"), completion_ids], dim=1).to(device)
    attention_mask = torch.cat([prompt.pop("attention_mask"), completion_mask], dim=1).to(device)
    for key in policy.family.token_keys:  # per-token tensors: completion tokens are text (0)
        if key in prompt:
            types = torch.zeros_like(completion_ids, dtype=prompt[key].dtype)
            for i, t in enumerate(trajectories or []):  # but observations' placeholders
                types[i, : len(t.token_types)] = torch.tensor(t.token_types, dtype=types.dtype)
            prompt[key] = torch.cat([prompt[key], types], dim=1)
    media = {k: v.to(device) for k, v in prompt.items()}
    for key in policy.family.media_keys:  # patch values follow the model's dtype
        if key in media:
            media[key] = media[key].to(policy.model.dtype)
    n = completion_ids.shape[1]
    distributed.check_same_graph(policy.model, tuple(sorted(media)))  # DeepSpeed ZeRO only
    out = distributed.module_to_call(policy.model)(
        input_ids=input_ids,
        attention_mask=attention_mask,
        logits_to_keep=n + 1,
        use_cache=False,
        **media,
    )
    logits = out.logits[:, :-1, :].float()  # position t predicts token t+1
    logps = selective_log_softmax(logits, completion_ids.to(device))
    stat = token_stat(logits, completion_ids.to(device)) if token_stat is not None else None
    return logps, completion_mask.to(device), stat


PEFT_PREFIX = "base_model.model."  # what a peft model's state-dict names add to the base model's


def is_lora(model: Any) -> bool:
    """The model is a peft model (``model.lora.enabled``): trained adapters on a frozen base."""
    return hasattr(model, "peft_config") and hasattr(model, "merge_and_unload")


def merged_weights(
    model: Any, state: dict[str, torch.Tensor] | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` of the full weights under transformers' names, LoRA adapters merged
    *out of place*: ``W + s · B A`` per adapted linear (``s`` = alpha / r, peft's ``scaling``;
    ``A`` [r, in], ``B`` [out, r]), computed per layer; the trained model is not touched.

    ``state``: the model's full state dict to read instead of its own parameters (a sharded
    model's, gathered by ``distributed.full_model_state``: peft's names, prefixed with
    ``base_model.model.``); by default the model's own, read inside ``distributed.gathered``
    when it is sharded. The delta is peft's ``LoraLayer.get_delta_weight`` for a plain
    linear adapter, computed from the tensors of ``state`` (a sharded model's own adapter
    weights are shards); mmrft never configures DoRA or fan-in-fan-out layers, refused here.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if state is None:  # the live tensors (inside distributed.gathered when sharded)
        state = distributed.gathered_state(base)
    else:
        state = {k.removeprefix(PEFT_PREFIX): v for k, v in state.items()}
    lora_layers = {}
    for name, module in base.named_modules():
        if hasattr(module, "get_delta_weight") and hasattr(module, "base_layer"):
            if any(module.use_dora.values()) or getattr(module, "fan_in_fan_out", False):
                raise NotImplementedError(f"{name}: only plain LoRA layers are merged")
            lora_layers[name] = module
    for name, tensor in state.items():
        if ".lora_" in name or "lora_magnitude" in name:
            continue
        clean = name.replace(".base_layer.", ".")
        owner, _, leaf = clean.rpartition(".")
        layer = lora_layers.get(owner)
        if layer is not None and leaf == "weight" and not layer.merged:
            for adapter in layer.active_adapters:
                a = state[f"{owner}.lora_A.{adapter}.weight"].float()
                b = state[f"{owner}.lora_B.{adapter}.weight"].float()
                tensor = (tensor.float() + (b @ a) * layer.scaling[adapter]).to(tensor.dtype)
        yield clean, tensor.detach()


def save_pretrained(
    policy: Policy, directory: Path, state_dict: dict[str, torch.Tensor] | None = None
) -> None:
    """Write a checkpoint transformers loads directly; with LoRA the adapters are merged
    (:func:`merged_weights`) and also kept on their own in ``directory/adapter``.

    ``state_dict``: the full weights to write instead of the model's own (a sharded model's,
    gathered by ``distributed.full_model_state``).
    """
    model = policy.model
    with no_weight_bars():
        if is_lora(model):  # peft picks the adapter's tensors of state_dict
            model.save_pretrained(directory / "adapter", state_dict=state_dict)
            state_dict = dict(merged_weights(model, state_dict))
            model = model.get_base_model()
        model.save_pretrained(directory, safe_serialization=True, state_dict=state_dict)
    policy.processor.save_pretrained(directory)
