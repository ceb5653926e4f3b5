"""The engine interface: what a rollout engine takes and what it hands back.

An engine runs *one turn*: conversations in, ``n`` sampled completions per conversation out,
group-contiguous (the ``n`` completions of conversation ``k`` are rows ``k·n … k·n + n − 1``,
the order the advantage functions expect). A multi-turn tool loop
(:class:`mmrft.rollout.tool_loop.ToolLoop`) is a collector stage: turn 1 is ``generate``, and every
later turn is ``continue_rows``, which continues each trajectory from its exact token ids and
media (a prompt row plus everything appended since, never re-rendered or re-tokenised).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from mmrft.policy.model import Policy


@dataclass(frozen=True)
class Sampling:
    """Decoding settings; ``greedy`` ignores the others.

    Attributes:
        max_new_tokens: the length limit of a completion (tokens).
        temperature: softmax temperature (> 0).
        top_p: nucleus sampling mass in (0, 1]; 1 = off.
        top_k: keep the k most likely tokens; 0 = off.
        min_p: keep the tokens whose probability is at least ``min_p`` × the most likely
            token's (after temperature, top-k and top-p, transformers' order); 0 = off.
        repetition_penalty: CTRL's penalty (Keskar et al. 2019, transformers' and vLLM's
            ``repetition_penalty``) on every token already in the prompt or the completion so
            far: a positive logit is divided by it, a negative one multiplied, before
            temperature; 1 = off, > 1 discourages repeats. Sampling only: the reported
            log-probs stay the model's raw ones.
        greedy: argmax decoding (evaluation).
        ignore_eos: end-of-turn tokens are never sampled: every completion is
            ``max_new_tokens`` long (benchmarks).
        stop_token_ids: more tokens that end a completion (kept, like end-of-turn tokens):
            ``</tool_call>`` in tool rollouts.
    """

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    greedy: bool = False
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()


def penalise_repeats(scores: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """``scores`` ``[B, V]`` with the repetition penalty on the tokens ``seen`` (bool
    ``[B, V]``): s / penalty where s > 0, s · penalty where s ≤ 0, unchanged elsewhere (the
    rule of transformers' ``RepetitionPenaltyLogitsProcessor`` and vLLM's)."""
    penalised = torch.where(scores > 0, scores / penalty, scores * penalty)
    return torch.where(seen, penalised, scores)


@dataclass
class Rollouts:
    """``len(conversations) × n`` completions, group-contiguous.

    Attributes:
        prompts: prepared prompt rows (``ModelFamily.split_rows`` output: token ids and media
            tensors), so the training forward sees exactly the tokens and pixels the sampler
            saw. A group-shared engine keeps one row per conversation; the per-completion path
            one row per completion.
        prompt_index: for each completion, the index of its row in ``prompts``.
        completion_ids: generated ids per completion, through the first end-of-turn token.
        texts: decoded completions without special tokens.
        truncated: True where the length limit cut the completion (no end-of-turn token).
        logprobs: the sampler's log-probability of each completion token under the model
            (log-softmax of the raw logits: no temperature, no filtering, the quantity the
            training forward computes), when the engine reports them; ``None`` otherwise.
        seconds: wall-clock generation time.
        timings: a breakdown of ``seconds`` where the engine measures one
            (``encode_s`` media encoders, ``prefill_s`` prompt passes without the encoders,
            ``decode_s`` token-by-token decoding; tool rollouts add ``tool_s``).
        trajectories: multi-turn tool rollouts only (:mod:`mmrft.rollout.tool_loop`): per completion
            its :class:`~mmrft.rollout.tool_loop.Trajectory`, whose ``loss_mask`` marks the model's own
            tokens among ``completion_ids`` (observations: 0) and whose ``media`` are the
            observations' media tensors, after the prompt's; ``texts`` then holds each
            trajectory's last turn. ``None`` for single-turn rollouts.
        token_versions: per completion, the version of the weights that sampled each of its
            tokens (the number of RL updates they include, :mod:`mmrft.rollout.ahead`), where the
            engine records them; ``None`` otherwise.
    """

    prompts: list[dict[str, Any]] = field(default_factory=list)
    prompt_index: list[int] = field(default_factory=list)
    completion_ids: list[list[int]] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    truncated: list[bool] = field(default_factory=list)
    logprobs: list[list[float]] | None = None
    seconds: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)
    trajectories: list[Any] | None = None
    token_versions: list[list[int]] | None = None

    def loss_tokens(self, i: int) -> int:
        """Tokens of completion ``i`` that the loss counts: the model's own."""
        if self.trajectories is None:
            return len(self.completion_ids[i])
        return sum(self.trajectories[i].loss_mask)

    @property
    def prompt_rows(self) -> list[dict[str, Any]]:
        """The prepared prompt of every completion (rows shared within a group)."""
        return [self.prompts[i] for i in self.prompt_index]

    def add(
        self,
        prompt: int,
        ids: list[int],
        text: str,
        truncated: bool,
        logprobs: list[float] | None = None,
        versions: list[int] | None = None,
    ) -> None:
        """Append one completion of ``prompts[prompt]`` (``versions``: its tokens' weight
        versions, kept only while every completion has them)."""
        if not self.completion_ids:
            self.logprobs = [] if logprobs is not None else None
            self.token_versions = [] if versions is not None else None
        if self.token_versions is not None and versions is not None:
            self.token_versions.append(versions)
        else:
            self.token_versions = None
        self.prompt_index.append(prompt)
        self.completion_ids.append(ids)
        self.texts.append(text)
        self.truncated.append(truncated)
        if self.logprobs is not None and logprobs is not None:
            self.logprobs.append(logprobs)
        else:
            self.logprobs = None

    def select(self, indices: list[int]) -> Rollouts:
        """The completions at ``indices``, in that order (with only the prompts they use)."""
        remap: dict[int, int] = {}
        for i in indices:
            remap.setdefault(self.prompt_index[i], len(remap))
        return Rollouts(
            prompts=[self.prompts[p] for p in remap],
            prompt_index=[remap[self.prompt_index[i]] for i in indices],
            completion_ids=[self.completion_ids[i] for i in indices],
            texts=[self.texts[i] for i in indices],
            truncated=[self.truncated[i] for i in indices],
            logprobs=None if self.logprobs is None else [self.logprobs[i] for i in indices],
            seconds=self.seconds,
            timings=dict(self.timings),
            trajectories=None
            if self.trajectories is None
            else [self.trajectories[i] for i in indices],
            token_versions=None
            if self.token_versions is None
            else [self.token_versions[i] for i in indices],
        )

    def extend(self, other: Rollouts) -> None:
        """Append ``other``'s completions and prompts (and add its seconds and timings).
        Sampler log-probs are kept only when both sides have them."""
        had_any = bool(self.completion_ids)
        if had_any and (self.trajectories is None) != (other.trajectories is None):
            raise ValueError("cannot mix single-turn rollouts and tool trajectories")
        if other.trajectories is not None:
            self.trajectories = (self.trajectories or []) + other.trajectories
        offset = len(self.prompts)
        self.prompts += other.prompts
        self.prompt_index += [offset + i for i in other.prompt_index]
        self.completion_ids += other.completion_ids
        self.texts += other.texts
        self.truncated += other.truncated
        if other.logprobs is not None and (self.logprobs is not None or not had_any):
            self.logprobs = (self.logprobs or []) + other.logprobs
        else:
            self.logprobs = None
        if other.token_versions is not None and (self.token_versions is not None or not had_any):
            self.token_versions = (self.token_versions or []) + other.token_versions
        else:
            self.token_versions = None
        self.seconds += other.seconds
        for key, value in other.timings.items():
            self.timings[key] = self.timings.get(key, 0.0) + value


def pad_like(values: list[list[float]], like: torch.Tensor) -> torch.Tensor:
    """Per-completion values (a list per row of ``like``) right-padded with 0 and cut to
    ``like``'s shape ``[n, C]`` and dtype: the sampler's or a teacher's per-token log-probs beside
    the training forward's."""
    out = torch.zeros_like(like)
    for row, row_values in enumerate(values):
        kept = row_values[: out.shape[1]]
        out[row, : len(kept)] = torch.tensor(kept, dtype=out.dtype)
    return out


GroupsDone = Callable[[list[int], list[str]], None]
"""``on_groups(groups, texts)``: the engine has finished the groups ``groups`` (conversation
indices, consecutive and ascending, each reported once, in order over the call) and ``texts``
are their ``len(groups) × n`` completions, group-contiguous (:meth:`Engine.generate`)."""


class Engine(Protocol):
    """A rollout engine.

    ``generate`` samples ``n`` completions for each conversation with the ``sampling``
    settings and returns them group-contiguous, each with its prepared prompt row, and the
    sampler log-probs if it has them. Media placeholder tokens are never sampled. An engine
    that decodes in several rounds may take the keyword ``on_groups`` (:data:`GroupsDone`) and
    call it, between rounds, with the groups a round finished, so the caller scores them
    while the next round decodes (``hf`` does; the collector checks the signature, and an
    engine without it is scored after ``generate`` returns). It must not change what is
    sampled.
    ``sync_weights`` is called after every optimizer step: an engine that holds its own copy of
    the weights (vLLM) reloads them from the policy there; one that samples from the policy
    itself (``hf``) has nothing to do. An engine with its own weights also has
    ``load_weights(weights)`` (checkpoint-format names and tensors, LoRA merged): the
    asynchronous collector (:mod:`mmrft.rollout.ahead`) pushes its snapshots through it. ``close``
    releases what the engine holds when the run ends (so another engine can start in the
    same process).
    """

    name: str

    def generate(
        self,
        conversations: list[list[dict[str, Any]]],
        n: int,
        sampling: Sampling,
        on_groups: GroupsDone | None = None,
    ) -> Rollouts: ...

    def continue_rows(self, rows: list[dict[str, Any]], sampling: Sampling) -> Rollouts:
        """One more turn of each prepared row (a prompt and a trajectory so far,
        :func:`mmrft.rollout.tool_loop.joined_row`): one completion per row, in order, continued
        from the row's exact ids and media (never re-tokenised)."""
        ...

    def sync_weights(self) -> None: ...

    def close(self) -> None: ...


def stop_token_ids(policy: Policy) -> list[int]:
    """End-of-turn tokens: the tokenizer's eos, the checkpoint's generation config's
    ``eos_token_id`` (GLM-4.1V's ``<|user|>`` and ``<|observation|>``, Gemma's
    ``<end_of_turn>``: what vLLM stops at too) and the chat template's ``<|im_end|>``."""
    tok = policy.tokenizer
    ids = {tok.eos_token_id}
    config_eos = getattr(getattr(policy.model, "generation_config", None), "eos_token_id", None)
    ids.update(config_eos if isinstance(config_eos, list) else [config_eos])
    for token in ("<|im_end|>", "<|endoftext|>"):
        token_id = tok.convert_tokens_to_ids(token)
        if isinstance(token_id, int) and token_id != tok.unk_token_id:
            ids.add(token_id)
    return sorted(i for i in ids if i is not None)


def cut_at_stop(ids: list[int], stop_ids: list[int]) -> tuple[list[int], bool]:
    """Keep tokens through the first stop token; ``truncated`` when there is none."""
    for i, token in enumerate(ids):
        if token in stop_ids:
            return ids[: i + 1], False
    return ids, True
