"""The ``hf`` engine: generation with the policy's own transformers model (CPU and GPU).

Two paths, chosen by ``rollout.group_shared``:

* **group-shared** (default): the conversations are prepared in one processor call; each
  prompt is prefilled once (media encoder and prompt layers, left-padded batches of at most
  ``rollout.batch_size`` prompts) and its KV cache kept; the ``n`` completions of a prompt are
  then decoded from copies of that cache, in rounds of at most ``rollout.batch_size``
  completions. Positions are the family's (:meth:`mmrft.models.family.ModelFamily.rope_positions`):
  completion token ``t`` sits at ``max(prompt positions) + 1 + t``, exactly as in the training
  forward. Sampling is ours (temperature, then top-k, then top-p, as transformers' warpers
  are ordered), so the sampler's log-probs come for free; rows that stop leave the batch.
  The prefill takes the family's own prompt attention and per-layer-type masks when it has
  them (Gemma: bidirectional images, sliding windows; :func:`mmrft.policy.group.attention_masks`)
  and keeps every key of every attention layer, sliding ones too, plus the conv and recurrent
  states of linear-attention layers (Qwen3.5; :func:`mmrft.policy.group.prefix_cache`); decoding
  steps get the model's own masks, whose windows count keys on the same left-padded rows.
* **per-completion**: every conversation repeated ``n`` times and run through transformers
  ``generate`` in chunks of ``rollout.batch_size`` (the prompt and its media are processed
  ``n`` times, the method of every peer); kept as the reference and behind the switch.

Both take ``on_groups`` (:data:`mmrft.rollout.base.GroupsDone`): after each round of
``rollout.batch_size`` completions, the groups whose ``n`` completions are all decoded are
handed to it (the collector scores them in the background while the next round decodes). The
callback runs between rounds and changes nothing that is sampled.

Both never sample a media placeholder token, and both stop a completion at the first
end-of-turn token. The engine samples from the policy's own parameters, so there are no
weights to push after an optimizer step.

**Scripted completions** (smoke runs only, :attr:`HFEngine.script`): the group-shared path can
write chosen completions of one ``generate`` call whole (a tool call, an answer the tiny model
cannot write by itself). Their tokens are chosen, not sampled, and may be more than
``max_new_tokens`` (truncated unless the script ends with a stop token); their log-probs are
still the model's (log-softmax of the raw logits at each chosen token, from one forward of the
script on the prompt's cache), so the sampler's and the trainer's log-probs agree. The other
completions are decoded as always; unset (``None``, every other run), nothing changes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from mmrft.policy.group import (
    attention_masks,
    build_cache,
    cache_keyword,
    cache_rows,
    prefix_cache,
    prompt_block,
    returned_cache,
)
from mmrft.policy.model import Policy
from mmrft.rollout.base import (
    GroupsDone,
    Rollouts,
    Sampling,
    cut_at_stop,
    penalise_repeats,
    stop_token_ids,
)


class HFEngine:
    """Generation on the policy itself (no weight sync needed); see the module docstring.

    Args:
        batch_size: prompts prefilled together and completions decoded together (a round).
        timeout_s: time budget of one ``generate`` call; completions cut by it are truncated.
        group_shared: one prompt prefill per group (False: the per-completion path).
        keep_media: every prompt row also holds its media as loaded (``engine_media``, as the
            vLLM engines' rows), for a served teacher that scores the completions.
    """

    name = "hf"

    def __init__(
        self,
        policy: Policy,
        batch_size: int,
        timeout_s: float = 0.0,
        group_shared: bool = True,
        keep_media: bool = False,
    ) -> None:
        self.policy = policy
        self.keep_media = keep_media
        self.batch_size = batch_size
        self.timeout_s = timeout_s
        self.group_shared = group_shared
        self.stop_ids = stop_token_ids(policy)
        # A model must never write a media placeholder: the training forward would then count
        # more image tokens than images ("Image features and image tokens do not match").
        self.suppress_ids = policy.family.suppress_token_ids(policy.processor)
        # asynchronous rollouts (mmrft.rollout.ahead): the weights' version, recorded with every token,
        # and a hook run between two decode steps that may load newer weights (partial rollouts)
        self.version = 0
        self.between_tokens: Callable[[], None] | None = None
        self.script: dict[int, list[int]] | None = None
        """Scripted completions of the next :meth:`generate` call only (smoke runs: module
        docstring): completion index in that call (group-contiguous, ``prompt × n + member``)
        → its token ids, the whole completion. ``generate`` takes it and resets it to ``None``;
        ``continue_rows`` never uses it."""

    @property
    def scriptable(self) -> bool:
        """Whether :attr:`script` applies (the group-shared path; the per-completion path
        decodes with transformers ``generate``, which takes no script)."""
        return self.group_shared

    def sync_weights(self) -> None:
        """Nothing to do: generation runs on the policy's own parameters."""

    def close(self) -> None:
        """Nothing to release."""

    @torch.no_grad()
    def generate(
        self,
        conversations: list[list[dict[str, Any]]],
        n: int,
        sampling: Sampling,
        on_groups: GroupsDone | None = None,
    ) -> Rollouts:
        """``n`` completions per conversation, group-contiguous; ``on_groups`` is called after
        each decode round with the groups it finished (module docstring)."""
        model = self.policy.model
        start = time.perf_counter()
        script, self.script = self.script, None  # one call's script only
        was_training = model.training
        model.eval()
        try:
            if self.group_shared:
                out = self._generate_shared(conversations, n, sampling, start, on_groups, script)
            else:
                out = self._generate_per_completion(conversations, n, sampling, on_groups)
        finally:
            model.train(was_training)
        out.seconds = time.perf_counter() - start
        return out

    @torch.no_grad()
    def continue_rows(self, rows: list[dict[str, Any]], sampling: Sampling) -> Rollouts:
        """One completion per prepared row (a prompt and a trajectory so far): each row is
        prefilled whole, with its media and the family's positions over the whole row
        (mRoPE: every turn's images and clips where they are), then decoded as a group-shared
        prompt with one member. Both paths use this (the per-completion one too), so every
        later turn of a tool rollout reports sampler log-probs."""
        policy, family, model = self.policy, self.policy.family, self.policy.model
        start = time.perf_counter()
        was_training = model.training
        model.eval()
        out = Rollouts(prompts=list(rows))
        try:
            encode = [0.0]
            with _timed(family.vision_tower(model), encode):
                positions = [family.rope_positions(model, row) for row in rows]
                first_logits, prefix = [], []
                for begin in range(0, len(rows), self.batch_size):
                    logits, caches = self._prefill(
                        rows[begin : begin + self.batch_size],
                        positions[begin : begin + self.batch_size],
                    )
                    first_logits += logits
                    prefix += caches
            t1 = time.perf_counter()
            for begin in range(0, len(rows), self.batch_size):
                members = list(range(begin, min(begin + self.batch_size, len(rows))))
                decoded = self._decode(
                    members, first_logits, prefix, positions, sampling, start, members, rows
                )
                for k, (ids, logprobs, truncated, versions) in zip(members, decoded):
                    text = policy.tokenizer.decode(ids, skip_special_tokens=True)
                    out.add(k, ids, text, truncated, logprobs, versions)
            out.timings = {
                "encode_s": encode[0],
                "prefill_s": t1 - start - encode[0],
                "decode_s": time.perf_counter() - t1,
            }
        finally:
            model.train(was_training)
        out.seconds = time.perf_counter() - start
        return out

    # -- group-shared ------------------------------------------------------------------------
    def _generate_shared(
        self,
        conversations: list[list[dict[str, Any]]],
        n: int,
        sampling: Sampling,
        start: float,
        on_groups: GroupsDone | None,
        script: dict[int, list[int]] | None = None,
    ) -> Rollouts:
        policy, family = self.policy, self.policy.family
        out = Rollouts()
        encode = [0.0]
        t0 = time.perf_counter()
        with _timed(family.vision_tower(policy.model), encode):
            out.prompts = self._prompt_rows(conversations)
            positions = [family.rope_positions(policy.model, row) for row in out.prompts]
            first_logits, prefix = [], []
            for begin in range(0, len(out.prompts), self.batch_size):
                chunk = list(range(begin, min(begin + self.batch_size, len(out.prompts))))
                logits, caches = self._prefill(
                    [out.prompts[k] for k in chunk], [positions[k] for k in chunk]
                )
                first_logits += logits
                prefix += caches
        t1 = time.perf_counter()
        jobs = [k for k in range(len(out.prompts)) for _ in range(n)]  # group-contiguous
        reported = 0  # groups handed to on_groups so far
        script = script or {}
        for begin in range(0, len(jobs), self.batch_size):
            index = range(begin, min(begin + self.batch_size, len(jobs)))  # completions
            sampled = [c for c in index if c not in script]
            decoded = {}
            if sampled:
                args = (first_logits, prefix, positions, sampling, start, sampled, out.prompts)
                decoded = dict(zip(sampled, self._decode([jobs[c] for c in sampled], *args)))
            for c in index:  # scripted: chosen whole, scored in one forward (smoke runs)
                if c in script:
                    decoded[c] = self._forced(
                        jobs[c], script[c], first_logits, prefix, positions, sampling
                    )
            for c in index:
                ids, logprobs, truncated, versions = decoded[c]
                text = policy.tokenizer.decode(ids, skip_special_tokens=True)
                out.add(jobs[c], ids, text, truncated, logprobs, versions)
            reported = _report_groups(on_groups, out.texts, n, reported)
        t2 = time.perf_counter()
        out.timings = {"encode_s": encode[0], "prefill_s": t1 - t0 - encode[0], "decode_s": t2 - t1}
        return out

    def _prompt_rows(self, conversations: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
        """The prepared prompt rows of ``conversations`` (one processor call); with
        ``keep_media`` each also holds its media as loaded (``engine_media``)."""
        family, processor = self.policy.family, self.policy.processor
        if self.keep_media:
            return family.engine_inputs(processor, conversations)[0]
        batch = family.prepare(processor, conversations, add_generation_prompt=True)
        return family.split_rows(batch, processor)

    def _prefill(
        self, rows: list[dict[str, Any]], positions: list[torch.Tensor]
    ) -> tuple[list[torch.Tensor], list[list[Any]]]:
        """One left-padded forward of ``rows`` with their media; per prompt the logits of its
        next token (float32, ``[V]``) and its cache without padding (per layer
        :func:`mmrft.policy.group.cache_rows`' entry of that prompt: keys and values
        ``[heads, Lp, head_dim]``, or linear-attention states)."""
        policy, family = self.policy, self.policy.family
        collated = family.collate_rows(rows, policy.pad_token_id)
        input_ids = collated.pop("input_ids")
        attention_mask = collated.pop("attention_mask")
        for key in family.token_keys:
            collated.pop(key, None)
        lengths = [len(r["input_ids"]) for r in rows]
        width, axes = input_ids.shape[1], positions[0].shape[0]
        position_ids = torch.zeros((axes, len(rows), width), dtype=torch.long)
        for i, (prompt_positions, lp) in enumerate(zip(positions, lengths)):
            position_ids[:, i, width - lp :] = prompt_positions
        device = policy.device
        inputs = {k: v.to(device) for k, v in collated.items() if isinstance(v, torch.Tensor)}
        for key in family.media_keys:
            if key in inputs:
                inputs[key] = inputs[key].to(policy.model.dtype)
        mask: Any = attention_mask.to(device)
        blocks = [family.prompt_attention(policy.model, row) for row in rows]
        if any(b is not None for b in blocks) or family.attention_layers(policy.model):
            # the prompt's own attention pattern and per-layer-type masks, as in training
            allowed = torch.eye(width, dtype=torch.bool).repeat(len(rows), 1, 1)
            for i, (row, lp) in enumerate(zip(rows, lengths)):
                allowed[i, width - lp :, width - lp :] = prompt_block(family, policy.model, row)
            mask = attention_masks(family, policy.model, allowed, position_ids[0])
            mask = {k: v.to(device) for k, v in mask.items()} if isinstance(mask, dict) else mask
        out = policy.model(
            input_ids=input_ids.to(device),
            attention_mask=mask,
            position_ids=(position_ids[0] if axes == 1 else position_ids).to(device),
            **{cache_keyword(policy.model): prefix_cache(policy.model)},
            use_cache=True,
            logits_to_keep=1,
            **inputs,
        )
        layers = cache_rows(returned_cache(out))
        logits = [out.logits[i, -1].float() for i in range(len(rows))]
        caches = [
            [_prompt_entry(entry, i, width - lp) for entry in layers]
            for i, lp in enumerate(lengths)
        ]
        return logits, caches

    def _decode(
        self,
        members: list[int],
        first_logits: list[torch.Tensor],
        prefix: list[list[Any]],
        positions: list[torch.Tensor],
        sampling: Sampling,
        start: float,
        completions: list[int] | None = None,
        prompts: list[dict[str, Any]] | None = None,
    ) -> list[tuple[list[int], list[float], bool, list[int]]]:
        """Decode one completion per entry of ``members`` (prompt indices) from copies of the
        prompts' caches; ``(ids, sampler log-probs, truncated, versions)`` per member, where
        ``versions`` is :attr:`version` when each token was sampled (:attr:`between_tokens`
        may load newer weights between two steps; the cache of earlier tokens is kept).
        ``completions``: each member's completion index in the engine call (for
        :meth:`_next_tokens`; default ``0, 1, …``). ``prompts``: the prompt rows, whose tokens
        count as seen under ``sampling.repetition_penalty``."""
        policy = self.policy
        model, device = policy.model, policy.device
        R = len(members)
        lengths = [len(positions[k][0]) for k in members]
        width = max(lengths)
        cache = build_cache(
            [
                _stack_entries([prefix[k][layer] for k in members], width)
                for layer in range(len(prefix[members[0]]))
            ]
        )
        attention = torch.zeros((R, width), dtype=torch.long, device=device)
        for i, lp in enumerate(lengths):
            attention[i, width - lp :] = 1
        axes = positions[members[0]].shape[0]
        after = torch.tensor([int(positions[k].max()) + 1 for k in members], device=device)
        logits = torch.stack([first_logits[k] for k in members])
        stops = set(self.stop_ids) | set(sampling.stop_token_ids)
        ids: list[list[int]] = [[] for _ in range(R)]
        logps: list[list[float]] = [[] for _ in range(R)]
        versions: list[list[int]] = [[] for _ in range(R)]
        done = [False] * R
        alive = torch.arange(R, device=device)  # the rows of `members` still in the batch
        seen = None  # [rows alive, V]: the tokens the repetition penalty applies to
        if sampling.repetition_penalty != 1.0 and not sampling.greedy:
            seen = torch.zeros(logits.shape, dtype=torch.bool, device=device)
            for i, k in enumerate(members):
                if prompts is not None:
                    seen[i, prompts[k]["input_ids"].to(device)] = True
        index = completions if completions is not None else list(range(R))
        for t in range(sampling.max_new_tokens):
            rows = alive.tolist()
            tokens, token_logps = self._next_tokens(
                logits, sampling, [index[r] for r in rows], t, seen
            )
            if seen is not None:
                seen[torch.arange(len(rows), device=device), tokens] = True
            for row, token, logp in zip(rows, tokens.tolist(), token_logps.tolist()):
                if not done[row]:  # a finished row waiting to leave the batch gets nothing
                    ids[row].append(token)
                    logps[row].append(logp)
                    versions[row].append(self.version)
                    done[row] = token in stops
            if t + 1 == sampling.max_new_tokens or all(done):
                break
            if self.timeout_s and time.perf_counter() - start > self.timeout_s:
                break
            finished = torch.tensor([done[row] for row in rows], device=device)
            if int(finished.sum()) * 4 >= len(rows):  # leave the batch: fewer rows to run
                keep = (~finished).nonzero().flatten()
                cache.batch_select_indices(keep)
                alive, tokens = alive[keep], tokens[keep]
                attention, after = attention[keep], after[keep]
                seen = seen[keep] if seen is not None else None
            else:  # finished rows run on padding until enough of them leave together
                tokens = tokens.masked_fill(finished, policy.pad_token_id)
            if self.between_tokens is not None:
                self.between_tokens()
            attention = torch.cat([attention, attention.new_ones((len(alive), 1))], dim=1)
            step_positions = (after + t)[None, :, None].expand(axes, -1, -1)
            out = model(
                input_ids=tokens[:, None],
                attention_mask=attention,
                position_ids=step_positions[0] if axes == 1 else step_positions,
                **{cache_keyword(model): cache},
                use_cache=True,
                logits_to_keep=1,
            )
            logits = out.logits[:, -1].float()
        return [(ids[r], logps[r], not done[r], versions[r]) for r in range(R)]

    def _forced(
        self,
        k: int,
        ids: list[int],
        first_logits: list[torch.Tensor],
        prefix: list[list[Any]],
        positions: list[torch.Tensor],
        sampling: Sampling,
    ) -> tuple[list[int], list[float], bool, list[int]]:
        """A scripted completion of prompt ``k`` (:attr:`script`): ``ids`` chosen, not sampled,
        as :meth:`_decode` returns a completion. Its log-probs are the model's (log-softmax of
        the raw logits at each forced token): the first from the prompt's prefill, the rest
        from one forward of the script's tokens on a copy of the prompt's cache (what a decode
        step per token gives, in one pass however long the script). Truncated unless it ends
        with a stop token."""
        model, device = self.policy.model, self.policy.device
        logps = [float(torch.log_softmax(first_logits[k], dim=-1)[ids[0]])]
        if len(ids) > 1:
            width = len(positions[k][0])
            cache = build_cache([_stack_entries([layer], width) for layer in prefix[k]])
            m = len(ids) - 1
            axes = positions[k].shape[0]
            after = int(positions[k].max()) + 1
            step_positions = (after + torch.arange(m, device=device))[None, None, :].expand(
                axes, 1, -1
            )
            out = model(
                input_ids=torch.tensor([ids[:-1]], device=device),
                attention_mask=torch.ones((1, width + m), dtype=torch.long, device=device),
                position_ids=step_positions[0] if axes == 1 else step_positions,
                **{cache_keyword(model): cache},
                use_cache=True,
                logits_to_keep=m,
            )
            raw = torch.log_softmax(out.logits[0, -m:].float(), dim=-1)
            logps += raw[torch.arange(m), torch.tensor(ids[1:])].tolist()
        stops = set(self.stop_ids) | set(sampling.stop_token_ids)
        return list(ids), logps, ids[-1] not in stops, [self.version] * len(ids)

    def _next_tokens(
        self,
        logits: torch.Tensor,
        sampling: Sampling,
        completions: list[int],
        t: int,
        seen: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The tokens at step ``t`` of the completions ``completions`` (their indices in this
        engine call, one per row of ``logits``): :meth:`_sample`. A subclass may choose them
        otherwise (tests script whole trajectories this way, the log-probs still the model's)."""
        return self._sample(logits, sampling, seen)

    def _sample(
        self, logits: torch.Tensor, sampling: Sampling, seen: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Next tokens ``[B]`` and their log-probability under the raw logits ``[B, V]``.

        Suppressed tokens (and with ``ignore_eos`` the stop tokens) get −inf; greedy takes the
        argmax; otherwise the repetition penalty on the ``seen`` tokens (bool ``[B, V]``,
        :func:`penalise_repeats`), then logits / temperature,
        then top-k, then top-p (keep the smallest set of most likely tokens whose probability
        reaches ``top_p``, at least one), then min-p (keep tokens with p ≥ ``min_p`` · p_max),
        then one multinomial draw per row.
        """
        raw = torch.log_softmax(logits, dim=-1)
        scores = logits.clone()
        suppress = self.suppress_ids + (self.stop_ids if sampling.ignore_eos else [])
        if suppress:
            scores[:, suppress] = float("-inf")
        if sampling.greedy:
            tokens = scores.argmax(dim=-1)
        else:
            if seen is not None and sampling.repetition_penalty != 1.0:
                scores = penalise_repeats(scores, seen, sampling.repetition_penalty)
            scores = scores / sampling.temperature
            if sampling.top_k and sampling.top_k < scores.shape[-1]:
                kth = torch.topk(scores, sampling.top_k, dim=-1).values[:, -1:]
                scores = scores.masked_fill(scores < kth, float("-inf"))
            if sampling.top_p < 1.0:
                ordered, index = torch.sort(scores, dim=-1)
                cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
                remove = cumulative <= 1.0 - sampling.top_p
                remove[:, -1] = False
                scores = scores.masked_fill(remove.scatter(1, index, remove), float("-inf"))
            if sampling.min_p > 0.0:
                probs = scores.softmax(dim=-1)
                floor = sampling.min_p * probs.max(dim=-1, keepdim=True).values
                scores = scores.masked_fill(probs < floor, float("-inf"))
            tokens = torch.multinomial(scores.softmax(dim=-1), 1)[:, 0]
        return tokens, raw.gather(1, tokens[:, None])[:, 0]

    # -- per-completion ----------------------------------------------------------------------
    def _generate_per_completion(
        self,
        conversations: list[list[dict[str, Any]]],
        n: int,
        sampling: Sampling,
        on_groups: GroupsDone | None,
    ) -> Rollouts:
        policy = self.policy
        expanded = [conv for conv in conversations for _ in range(n)]
        media = (
            [row["engine_media"] for row in self._prompt_rows(conversations) for _ in range(n)]
            if self.keep_media
            else None
        )
        out = Rollouts()
        reported = 0  # groups handed to on_groups so far
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
            for k, (row, ids) in enumerate(zip(rows, new_tokens)):
                if media is not None:
                    row["engine_media"] = media[begin + k]
                ids, truncated = cut_at_stop(ids, [*self.stop_ids, *sampling.stop_token_ids])
                out.prompts.append(row)
                out.add(
                    len(out.prompts) - 1,
                    ids,
                    policy.tokenizer.decode(ids, skip_special_tokens=True),
                    truncated,
                )
            reported = _report_groups(on_groups, out.texts, n, reported)
        return out

    def _generate_kwargs(self, sampling: Sampling) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "max_new_tokens": sampling.max_new_tokens,
            "eos_token_id": [*self.stop_ids, *sampling.stop_token_ids],
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
        if sampling.ignore_eos:  # end-of-turn tokens are masked until the length limit
            kwargs["min_new_tokens"] = sampling.max_new_tokens
        if sampling.greedy:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        else:
            kwargs.update(
                do_sample=True,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k,
                min_p=sampling.min_p or None,
                repetition_penalty=sampling.repetition_penalty,
            )
        return kwargs


def _report_groups(on_groups: GroupsDone | None, texts: list[str], n: int, reported: int) -> int:
    """Hand ``on_groups`` the groups completed since the first ``reported`` ones (``texts``: the
    completions so far, group-contiguous, ``n`` per group); returns the groups completed."""
    complete = len(texts) // n
    if on_groups is not None and complete > reported:
        on_groups(list(range(reported, complete)), texts[reported * n : complete * n])
    return complete


def _prompt_entry(entry: dict[str, torch.Tensor] | None, row: int, start: int) -> Any:
    """Row ``row`` of a cache layer entry, keys and values from column ``start`` (padding cut)."""
    if entry is None:
        return None
    if "keys" in entry:
        return {"keys": entry["keys"][row, :, start:], "values": entry["values"][row, :, start:]}
    return {name: state[row] for name, state in entry.items()}


def _stack_entries(entries: list[Any], width: int) -> Any:
    """One batch cache entry from per-prompt entries, keys and values left-padded to
    ``width``."""
    if entries[0] is None:
        return None
    if "keys" in entries[0]:
        return {
            name: torch.stack(
                [
                    torch.nn.functional.pad(e[name], (0, 0, width - e[name].shape[1], 0))
                    for e in entries
                ]
            )
            for name in ("keys", "values")
        }
    return {name: torch.stack([e[name] for e in entries]) for name in entries[0]}


@contextmanager
def _timed(modules: Any, total: list[float]) -> Iterator[None]:
    """Add the wall-clock seconds spent inside ``modules``' forwards to ``total[0]`` (a
    ``ModuleList`` stands for its members; CUDA work is synchronised at both ends)."""
    members = list(modules) if isinstance(modules, torch.nn.ModuleList) else [modules]
    started: list[float] = []

    def sync() -> None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()

    def before(module: Any, args: Any) -> None:
        sync()
        started.append(time.perf_counter())

    def after(module: Any, args: Any, output: Any) -> None:
        sync()
        total[0] += time.perf_counter() - started.pop()

    handles = [m.register_forward_pre_hook(before) for m in members]
    handles += [m.register_forward_hook(after) for m in members]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
