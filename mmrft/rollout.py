"""Rollout engines: ``generate(conversations, n, sampling) -> Rollouts``.

``hf`` runs transformers ``generate`` (CPU and GPU, KV cache on), in chunks of
``rollout.batch_size`` completions. Each conversation is repeated ``n`` times so a group's
completions sit next to each other (group-contiguous order, which the advantage functions
expect). The prepared prompt of every completion is kept (``prompt_rows``) so the training
forward sees exactly the tokens and pixels the sampler saw.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from mmrft.policy import Policy


@dataclass(frozen=True)
class Sampling:
    """Decoding settings; ``greedy`` ignores the others."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    greedy: bool = False


@dataclass
class Rollouts:
    """``len(conversations) × n`` completions, group-contiguous.

    Attributes:
        prompt_rows: prepared prompt inputs per completion (see ``ModelFamily.split_rows``).
        completion_ids: generated ids per completion, through the first end-of-turn token.
        texts: decoded completions without special tokens.
        truncated: True where the length limit cut the completion (no end-of-turn token).
    """

    prompt_rows: list[dict[str, Any]] = field(default_factory=list)
    completion_ids: list[list[int]] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    truncated: list[bool] = field(default_factory=list)
    seconds: float = 0.0

    def select(self, indices: list[int]) -> Rollouts:
        """The completions at ``indices``, in that order."""
        return Rollouts(
            [self.prompt_rows[i] for i in indices],
            [self.completion_ids[i] for i in indices],
            [self.texts[i] for i in indices],
            [self.truncated[i] for i in indices],
            self.seconds,
        )

    def extend(self, other: Rollouts) -> None:
        self.prompt_rows += other.prompt_rows
        self.completion_ids += other.completion_ids
        self.texts += other.texts
        self.truncated += other.truncated
        self.seconds += other.seconds


def stop_token_ids(policy: Policy) -> list[int]:
    """End-of-turn tokens: the tokenizer's eos plus the chat template's ``<|im_end|>``."""
    tok = policy.tokenizer
    ids = {tok.eos_token_id}
    for token in ("<|im_end|>", "<|endoftext|>"):
        token_id = tok.convert_tokens_to_ids(token)
        if isinstance(token_id, int) and token_id != tok.unk_token_id:
            ids.add(token_id)
    return sorted(i for i in ids if i is not None)


class HFEngine:
    """Generation with transformers ``generate`` on the policy itself (no weight sync needed)."""

    def __init__(self, policy: Policy, batch_size: int, timeout_s: float = 0.0) -> None:
        self.policy = policy
        self.batch_size = batch_size
        self.timeout_s = timeout_s
        self.stop_ids = stop_token_ids(policy)
        # A model must never write a media placeholder: the training forward would then count
        # more image tokens than images ("Image features and image tokens do not match").
        self.suppress_ids = policy.family.suppress_token_ids(policy.processor)

    @torch.no_grad()
    def generate(
        self, conversations: list[list[dict[str, Any]]], n: int, sampling: Sampling
    ) -> Rollouts:
        policy = self.policy
        start = time.perf_counter()
        expanded = [conv for conv in conversations for _ in range(n)]
        out = Rollouts()
        was_training = policy.model.training
        policy.model.eval()
        try:
            for begin in range(0, len(expanded), self.batch_size):
                chunk = expanded[begin : begin + self.batch_size]
                batch = policy.family.prepare(policy.processor, chunk, add_generation_prompt=True)
                rows = policy.family.split_rows(batch, policy.processor)
                inputs = {
                    k: v.to(policy.device) for k, v in batch.items() if isinstance(v, torch.Tensor)
                }
                for key in policy.family.media_keys:
                    if key in inputs:
                        inputs[key] = inputs[key].to(policy.model.dtype)
                kwargs: dict[str, Any] = {
                    "max_new_tokens": sampling.max_new_tokens,
                    "eos_token_id": self.stop_ids,
                    "pad_token_id": policy.pad_token_id,
                    "use_cache": True,
                    # transformers turns synced generation on for FSDP models (an all-reduce
                    # per token so every rank runs as many forwards); a sharded mmrft policy
                    # generates with its parameters gathered (distributed.gathered) and no
                    # collective, so ranks generate independently and rank 0 may evaluate alone.
                    "synced_gpus": False,
                }
                if self.suppress_ids:
                    kwargs["suppress_tokens"] = self.suppress_ids
                if self.timeout_s:  # generation stops here; the completions count as truncated
                    kwargs["max_time"] = self.timeout_s
                if sampling.greedy:
                    kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
                else:
                    kwargs.update(
                        do_sample=True,
                        temperature=sampling.temperature,
                        top_p=sampling.top_p,
                        top_k=sampling.top_k,
                    )
                generated = policy.model.generate(**inputs, **kwargs)
                new_tokens = generated[:, inputs["input_ids"].shape[1] :].tolist()
                for row, ids in zip(rows, new_tokens):
                    ids, truncated = cut_at_stop(ids, self.stop_ids)
                    out.prompt_rows.append(row)
                    out.completion_ids.append(ids)
                    out.truncated.append(truncated)
                    out.texts.append(policy.tokenizer.decode(ids, skip_special_tokens=True))
        finally:
            policy.model.train(was_training)
        out.seconds = time.perf_counter() - start
        return out


def cut_at_stop(ids: list[int], stop_ids: list[int]) -> tuple[list[int], bool]:
    """Keep tokens through the first stop token; ``truncated`` when there is none."""
    for i, token in enumerate(ids):
        if token in stop_ids:
            return ids[: i + 1], False
    return ids, True


def build_engine(name: str, policy: Policy, batch_size: int, timeout_s: float = 0.0) -> HFEngine:
    if name == "hf":
        return HFEngine(policy, batch_size, timeout_s)
    raise ValueError(f"rollout.engine: unknown engine '{name}'")
