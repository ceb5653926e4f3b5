"""The ``hf`` engine: transformers ``generate`` on the policy itself (CPU and GPU, KV cache on).

Completions are generated in chunks of ``rollout.batch_size``. Each conversation is repeated
``n`` times so a group's completions sit next to each other. The engine samples from the
policy's own parameters, so there are no weights to push after an optimizer step.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from mmrft.policy import Policy
from mmrft.rollout.base import Rollouts, Sampling, cut_at_stop, stop_token_ids


class HFEngine:
    """Generation with transformers ``generate`` on the policy itself (no weight sync needed)."""

    name = "hf"

    def __init__(self, policy: Policy, batch_size: int, timeout_s: float = 0.0) -> None:
        self.policy = policy
        self.batch_size = batch_size
        self.timeout_s = timeout_s
        self.stop_ids = stop_token_ids(policy)
        # A model must never write a media placeholder: the training forward would then count
        # more image tokens than images ("Image features and image tokens do not match").
        self.suppress_ids = policy.family.suppress_token_ids(policy.processor)

    def sync_weights(self) -> None:
        """Nothing to do: ``generate`` runs on the policy's own parameters."""

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
                generated = policy.model.generate(**inputs, **self._generate_kwargs(sampling))
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

    def _generate_kwargs(self, sampling: Sampling) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "max_new_tokens": sampling.max_new_tokens,
            "eos_token_id": self.stop_ids,
            "pad_token_id": self.policy.pad_token_id,
            "use_cache": True,
            # transformers turns synced generation on for FSDP models (an all-reduce per token
            # so every rank runs as many forwards); a sharded mmrft policy generates with its
            # parameters gathered (distributed.gathered) and no collective, so ranks generate
            # independently and rank 0 may evaluate alone.
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
        return kwargs
