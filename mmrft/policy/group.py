"""Group-shared compute for the training forward: one prompt pass for the completions of a group.

GRPO samples ``G`` completions of every prompt. Forwarding ``[prompt | completion]`` once per
completion (what TRL, verl, EasyR1, ms-swift and OpenRLHF do) runs the media encoder and the
prompt's layers ``G`` times for the same result. Here the completions of a prompt are packed
behind one copy of it::

    row = [ prompt (Lp tokens, with its media) | c_1 | c_2 | … | c_k | padding ]

with a block attention mask: the prompt attends causally to itself; each token of ``c_j``
attends to the whole prompt and causally to the earlier tokens of ``c_j``, never to another
completion. Positions: the prompt keeps its own (the family's 1-D or multimodal RoPE,
:meth:`mmrft.models.family.ModelFamily.rope_positions`); every completion starts at the prompt's next
text position ``max(prompt positions) + 1`` on every axis, as if it were the only continuation.
So each completion token sees the same keys, values and positions as in its own
``[prompt | c_j]`` forward, and masked entries weigh exactly 0 in the softmax: the log-probs are
the per-completion ones up to float summation order, and in the backward the gradient through
the prompt (media encoder included) is the sum over the ``k`` completions, accumulated once.

A packed row holds at most ``rollout.micro_group`` completions; a larger group is split into
rounds that each carry their own copy of the prompt (Infinite Sampling's micro groups,
arXiv:2506.22950), so activation memory is set by the round, not by ``G``.

Who may attend to whom is held per token (:class:`RowLayout`: each token's segment, the
prompts' own patterns), never as an ``L × L`` matrix until a kernel asks for one: SDPA and eager
attention get a dense ``[rows, 1, L, L]`` mask (boolean for SDPA, additive for eager),
``model.attn_implementation=block_sparse`` a FlexAttention ``BlockMask`` that skips the blocks
masked entirely (:mod:`mmrft.models.attention`). Kernels that take no arbitrary mask
(flash-attention 2) cannot run this layout; :func:`check_attention` says so at start-up. A family whose prompt is not plain causal gives
its own block (:meth:`~mmrft.models.family.ModelFamily.prompt_attention`: Gemma's images attend to
themselves bidirectionally), and a model with sliding-window layers gets one mask per layer
type, each window counted in rotary positions (:func:`attention_masks`).

Models with recurrent layers (Qwen3.5's Gated DeltaNet: a state and a causal convolution along
the sequence, which no mask confines to one completion) take the *prefix* path instead
(:func:`packing`, :func:`prefix_logits`): the prompts run once with a cache whose keys, values
and states stay graph tensors, and the completions continue from copies of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import (
    DynamicCache,
    DynamicLayer,
    DynamicSlidingWindowLayer,
    LinearAttentionLayer,
)

try:  # transformers ≥ 5.20; the 5.19 beside vLLM's CPU build has no empty layer (and no model
    # that needs one)
    from transformers.cache_utils import DummyLayer
except ImportError:

    class DummyLayer(DynamicLayer):  # type: ignore[no-redef]
        """A layer that stores nothing (stand-in for transformers ≥ 5.20's own)."""


from mmrft.algorithms import TokenStat, selective_log_softmax
from mmrft.models.attention import REGISTERED as BLOCK_SPARSE
from mmrft.policy.trajectory import joined_row, with_media
from mmrft.runtime import distributed

GROUP_ATTENTION = ("sdpa", "eager", BLOCK_SPARSE)


def attention_implementation(model: Any) -> str:
    """The attention kernel name of a (possibly wrapped) transformers model."""
    for module in model.modules():
        config = getattr(module, "config", None)
        name = getattr(config, "_attn_implementation", None)
        if name:
            return str(name)
    return "sdpa"


def check_attention(model: Any) -> None:
    """Raise ``ValueError`` when the model cannot run the group-shared forward: its attention
    kernel cannot take the group mask, or (prefix packing, :func:`packing`) gradient
    checkpointing would drop the prompt's cache (transformers' checkpointed layers ignore
    ``past_key_values``)."""
    if packing(model) == "prefix":
        if any(getattr(m, "gradient_checkpointing", False) for m in model.modules()):
            raise ValueError(
                "rollout.group_shared: this model has recurrent (linear-attention) layers, so "
                "its completions continue from the prompt's cache, which transformers drops "
                "under gradient checkpointing; set model.gradient_checkpointing=false, or "
                "rollout.group_shared=false for the per-completion path"
            )
        return
    name = attention_implementation(model)
    shared_kv = any(
        getattr(getattr(m, "config", None), "num_kv_shared_layers", 0) for m in model.modules()
    )
    if name == BLOCK_SPARSE and shared_kv:
        raise ValueError(
            "model.attn_implementation=block_sparse: this model shares keys and values across "
            "layers (Gemma 4), and its forward then slices the attention mask by query rows, "
            "which a FlexAttention block mask cannot take; set model.attn_implementation=sdpa"
        )
    if name not in GROUP_ATTENTION:
        raise ValueError(
            f"rollout.group_shared needs model.attn_implementation 'sdpa', 'eager' or "
            f"'block_sparse' (the group mask is a block mask), not '{name}'; set "
            "model.attn_implementation=sdpa, or rollout.group_shared=false for the "
            "per-completion path"
        )


def rounds(prompt_index: Sequence[int], micro_group: int) -> list[list[int]]:
    """Positions in ``prompt_index`` grouped by prompt (in order of first appearance, each in
    its original order), split into rounds of at most ``micro_group`` (0 = no limit)."""
    by_prompt: dict[int, list[int]] = {}
    for i, p in enumerate(prompt_index):
        by_prompt.setdefault(p, []).append(i)
    out = []
    for members in by_prompt.values():
        step = micro_group or len(members)
        out += [members[b : b + step] for b in range(0, len(members), step)]
    return out


def pack(
    family: Any,
    model: Any,
    prompts: Sequence[dict[str, Any]],
    completions: Sequence[Sequence[Sequence[int]]],
    pad_token_id: int,
    trajectories: Sequence[Sequence[Any]] | None = None,
    device: torch.device | str = "cpu",
) -> tuple[dict[str, Any], torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Model inputs of packed rows: row ``r`` is ``prompts[r]`` followed by the completions
    ``completions[r]`` (see the module docstring).

    ``trajectories`` (parallel to ``completions``; tool rollouts, :mod:`mmrft.rollout.tool_loop`):
    a completion whose trajectory added media gets the positions of its own whole
    ``[prompt | trajectory]`` sequence from the family's function (mRoPE of every turn's
    images and clips), and its media join the row's after the prompt's and the earlier
    completions', the order of their placeholders in the row.

    Returns ``(inputs, rows, cols, ids, mask, keep)``: the keyword arguments of the model call
    (without ``logits_to_keep``; a FlexAttention mask is built on ``device``, the rest stays on
    the CPU); for every completion (in order, row by row) the row index and
    the column of the kept logits that predicts each of its tokens (``[n, C]``, padded with 0);
    its token ids and 0/1 mask (``[n, C]``); and how many last positions to keep logits for.
    """
    positions = [family.rope_positions(model, row) for row in prompts]
    axes = positions[0].shape[0]
    prompt_lengths = [len(row["input_ids"]) for row in prompts]
    lengths = [lp + sum(len(c) for c in comps) for lp, comps in zip(prompt_lengths, completions)]
    R, L = len(prompts), max(lengths)
    input_ids = torch.full((R, L), pad_token_id, dtype=torch.long)
    position_ids = torch.zeros((axes, R, L), dtype=torch.long)
    segment = torch.full((R, L), -1, dtype=torch.long)  # padding attends to itself only
    runs = torch.zeros((R, L), dtype=torch.long)  # bidirectional runs of observations' media
    next_run = 1
    P = max(prompt_lengths)
    prompt_attention = torch.zeros((R, P, P), dtype=torch.bool)
    first = min(prompt_lengths) - 1  # the first position whose logits are kept
    spans: list[tuple[int, int, int, int]] = []  # (row, prompt length, start, length)
    tokens: list[list[int]] = []  # each completion's token ids, in the order of spans
    media_rows = []
    # Each row's completions are gathered in Python lists and written with one tensor copy per
    # row (and one per output below): a copy per completion cost ~5 ms of Python per packed
    # batch of 64 completions, ~8% of a CPU demo step.
    for r, (row, comps) in enumerate(zip(prompts, completions)):
        lp = prompt_lengths[r]
        row_trajectories = trajectories[r] if trajectories is not None else [None] * len(comps)
        media_rows.append(with_media(row, [t for t in row_trajectories if t is not None]))
        input_ids[r, :lp] = row["input_ids"]
        position_ids[:, r, :lp] = positions[r]
        segment[r, :lp] = 0
        prompt_attention[r, :lp, :lp] = prompt_block(family, model, row)
        after = int(positions[r].max()) + 1
        start = lp
        row_ids: list[int] = []
        row_segments: list[int] = []
        row_positions: list[int] = []  # text positions: after, after + 1, … per completion
        own_positions = []  # (start, positions [axes, n]) of completions whose turns add media
        for j, (comp, trajectory) in enumerate(zip(comps, row_trajectories), start=1):
            comp = [int(t) for t in comp]
            n = len(comp)
            row_ids += comp
            row_segments += [j] * n
            row_positions += range(after, after + n)
            if trajectory is not None and trajectory.has_media:
                own = family.rope_positions(model, joined_row(row, trajectory, family.token_keys))
                own_positions.append((start, own[:, lp:]))
                numbered = numbered_runs(family, model, trajectory.token_types, next_run)
                if numbered is not None:
                    runs[r, start : start + n] = numbered
                    next_run = int(numbered.max()) + 1
            spans.append((r, lp, start, n))
            tokens.append(comp)
            start += n
        if start > lp:
            input_ids[r, lp:start] = torch.tensor(row_ids, dtype=torch.long)
            segment[r, lp:start] = torch.tensor(row_segments, dtype=torch.long)
            position_ids[:, r, lp:start] = torch.tensor(row_positions, dtype=torch.long)
        for begin, own in own_positions:
            position_ids[:, r, begin : begin + own.shape[1]] = own
    C = max(1, max(n for *_, n in spans))
    rows_of, cols_of, ids_of, mask_of = [], [], [], []
    for (r, lp, start, n), comp in zip(spans, tokens):
        pad = C - n
        # token t of the completion is predicted at position lp - 1 (t = 0), else start + t - 1
        predict = ([lp - 1 - first] if n else []) + list(
            range(start - first, start - first + n - 1)
        )
        rows_of.append([r] * n + [0] * pad)
        cols_of.append(predict + [0] * pad)
        ids_of.append(comp + [pad_token_id] * pad)
        mask_of.append([1] * n + [0] * pad)
    shape = (len(spans), C)
    rows = torch.tensor(rows_of, dtype=torch.long).reshape(shape)
    cols = torch.tensor(cols_of, dtype=torch.long).reshape(shape)
    ids = torch.tensor(ids_of, dtype=torch.long).reshape(shape)
    mask = torch.tensor(mask_of, dtype=torch.long).reshape(shape)

    media = family.collate_rows(media_rows, pad_token_id)
    for key in ("input_ids", "attention_mask", *family.token_keys):
        media.pop(key, None)
    inputs = {
        "input_ids": input_ids,
        "position_ids": position_ids[0] if axes == 1 else position_ids,
        "attention_mask": layout_masks(
            family,
            model,
            RowLayout(segment, prompt_attention, runs if next_run > 1 else None),
            position_ids[0],
            device,
        ),
        **media,
    }
    return inputs, rows, cols, ids, mask, L - first


def numbered_runs(
    family: Any, model: Any, token_types: Sequence[int], first: int
) -> torch.Tensor | None:
    """``[n]`` long: each run of a completion's :meth:`bidirectional_tokens
    <mmrft.models.family.ModelFamily.bidirectional_tokens>` numbered from ``first`` on, 0
    elsewhere; ``None`` when the family has none (causal)."""
    vision = family.bidirectional_tokens(model, torch.tensor(list(token_types), dtype=torch.long))
    if vision is None or not bool(vision.any()):
        return None
    starts = vision & ~torch.cat([vision.new_zeros(1), vision[:-1]])
    return torch.where(vision, starts.long().cumsum(0) + first - 1, 0)


@dataclass(frozen=True)
class RowLayout:
    """Who may attend to whom in packed rows, without an ``L × L`` matrix.

    ``segment [R, L]``: 0 for a prompt token (prompts start at column 0), ``j ≥ 1`` for a token
    of the row's completion ``j``, −1 for padding. ``prompt [R, P, P]`` (P = longest prompt):
    each prompt's attention on itself (:func:`prompt_block`). ``runs [R, L]``: a number > 0 on
    the tokens of each bidirectional run of a completion's observation media
    (:func:`numbered_runs`), 0 elsewhere. A prompt token attends as its prompt's pattern says;
    a completion token to its whole prompt, causally to its own completion and to every token
    of its own run; a padding token to itself only (so no softmax row is empty).
    """

    segment: torch.Tensor
    prompt: torch.Tensor
    runs: torch.Tensor | None = None

    def to(self, device: torch.device | str) -> RowLayout:
        runs = None if self.runs is None else self.runs.to(device)
        return RowLayout(self.segment.to(device), self.prompt.to(device), runs)

    def allowed(self, b: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """Whether query ``q`` of row ``b`` may attend to key ``k`` (broadcasting index tensors;
        FlexAttention's ``mask_mod`` without the head). Indices past the row (a kernel's last,
        partial block) may not attend."""
        L, last = self.segment.shape[1], self.prompt.shape[-1] - 1
        inside = (q < L) & (k < L)
        q, k = q.clamp(max=L - 1), k.clamp(max=L - 1)
        sq, sk = self.segment[b, q], self.segment[b, k]
        in_prompt = (sq == 0) & (sk == 0) & self.prompt[b, q.clamp(max=last), k.clamp(max=last)]
        order = k <= q
        if self.runs is not None:
            run = self.runs[b, q]
            order = order | ((run > 0) & (run == self.runs[b, k]))
        in_completion = (sq > 0) & ((sk == 0) | ((sk == sq) & order))
        return inside & (in_prompt | in_completion | ((sq < 0) & (q == k)))

    def dense(self) -> torch.Tensor:
        """``[R, L, L]`` bool: :meth:`allowed` at every (query, key), built from whole-row
        comparisons (bool temporaries only; gathering through :meth:`allowed` would hold
        ``R × L × L`` int64 indices, 8× the mask, on the default path)."""
        L = self.segment.shape[1]
        sq, sk = self.segment[:, :, None], self.segment[:, None, :]
        order = torch.ones(L, L, dtype=torch.bool).tril()[None]
        if self.runs is not None:
            run = self.runs[:, :, None]
            order = order | ((run > 0) & (run == self.runs[:, None, :]))
        out = (sq > 0) & ((sk == 0) | ((sk == sq) & order))
        out |= (sq < 0) & torch.eye(L, dtype=torch.bool)
        P = min(self.prompt.shape[-1], L)
        in_prompt = (self.segment[:, :P] == 0)[:, :, None] & (self.segment[:, :P] == 0)[:, None, :]
        out[:, :P, :P] |= in_prompt & self.prompt[:, :P, :P]
        return out


def layout_masks(
    family: Any,
    model: Any,
    layout: RowLayout,
    positions: torch.Tensor,
    device: torch.device | str = "cpu",
) -> Any:
    """The attention mask(s) of packed rows for the model's kernel: FlexAttention
    ``BlockMask``s on ``device`` under ``block_sparse`` (:func:`block_sparse_mask`), else
    :func:`attention_masks` of the dense layout (moved to ``device`` by the caller)."""
    if attention_implementation(model) != BLOCK_SPARSE:
        return attention_masks(family, model, layout.dense(), positions)
    layers = family.attention_layers(model)
    if layers is None:
        return block_sparse_mask(layout, positions, None, device)
    return {
        name: block_sparse_mask(layout, positions, window, device)
        for name, window in layers.items()
    }


def block_sparse_mask(
    layout: RowLayout,
    positions: torch.Tensor,
    window: int | None = None,
    device: torch.device | str = "cpu",
    block: int = 128,
) -> Any:
    """A FlexAttention ``BlockMask`` of ``layout`` (keys limited to less than ``window`` text
    positions behind the query when given; ``positions [R, L]``).

    Built one row of ``block`` queries at a time (memory ``R × block × L``, never ``L × L``):
    each ``block × block`` tile is empty (skipped by the kernel), full (computed without
    evaluating the rule) or partial (the rule, :meth:`RowLayout.allowed`, evaluated in the
    kernel)."""
    from torch.nn.attention.flex_attention import BlockMask

    def rule(b: torch.Tensor, q: torch.Tensor, k: torch.Tensor, where: RowLayout, pos: Any):
        ok = where.allowed(b, q, k)
        if window is None:
            return ok
        L = pos.shape[1]
        return ok & (pos[b, q.clamp(max=L - 1)] - pos[b, k.clamp(max=L - 1)] < window)

    R, L = layout.segment.shape
    blocks = -(-L // block)
    rows, keys = torch.arange(R)[:, None, None], torch.arange(blocks * block)
    any_, all_ = [], []
    for start in range(0, blocks * block, block):
        tile = rule(rows, torch.arange(start, start + block)[:, None], keys, layout, positions)
        tile = tile.view(R, block, blocks, block)
        any_.append(tile.any(dim=(1, 3)))
        all_.append(tile.all(dim=3).all(dim=1))
    full = torch.stack(all_, 1)  # [R, query blocks, key blocks]
    partial = torch.stack(any_, 1) & ~full

    def listed(which: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        order = torch.argsort(which.to(torch.int8), dim=-1, descending=True, stable=True)
        count = which.sum(-1).to(torch.int32)
        return count[:, None].to(device), order[:, None].to(torch.int32).to(device)

    on_device, pos_device = layout.to(device), positions.to(device)

    def mask_mod(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        return rule(b, q, k, on_device, pos_device)

    return BlockMask.from_kv_blocks(
        *listed(partial), *listed(full), BLOCK_SIZE=block, mask_mod=mask_mod, seq_lengths=(L, L)
    )


def prompt_block(family: Any, model: Any, row: dict[str, Any]) -> torch.Tensor:
    """``[Lp, Lp]`` bool attention of a prompt row on itself: the family's own pattern
    (:meth:`mmrft.models.family.ModelFamily.prompt_attention`) or causal."""
    custom = family.prompt_attention(model, row)
    if custom is not None:
        return custom
    n = len(row["input_ids"])
    return torch.ones(n, n, dtype=torch.bool).tril()


def attention_masks(
    family: Any, model: Any, allowed: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor | dict[str, torch.Tensor]:
    """The attention mask(s) of rows whose tokens may attend where ``allowed`` (``[R, L, L]``)
    says: one :func:`block_mask`, or, for a family with per-layer-type masks
    (:meth:`mmrft.models.family.ModelFamily.attention_layers`), a dict of them, each sliding type
    also limited to keys less than its window behind the query in ``positions`` (``[R, L]``,
    the text positions)."""
    layers = family.attention_layers(model)
    if layers is None:
        return block_mask(allowed, model)
    behind = positions[:, :, None] - positions[:, None, :]  # q − k
    return {
        name: block_mask(allowed if window is None else allowed & (behind < window), model)
        for name, window in layers.items()
    }


def block_mask(allowed: torch.Tensor, model: Any) -> torch.Tensor:
    """``[R, 1, L, L]`` attention mask from ``allowed`` (True = may attend): boolean for SDPA,
    additive (0 or the dtype's minimum) for eager attention."""
    if attention_implementation(model) == "eager":
        dtype = next(model.parameters()).dtype
        additive = torch.zeros(allowed.shape, dtype=dtype)
        return additive.masked_fill(~allowed, torch.finfo(dtype).min)[:, None]
    return allowed[:, None]


def group_logps(
    policy: Any,
    prompts: Sequence[dict[str, Any]],
    prompt_index: Sequence[int],
    completions: Sequence[Sequence[int]],
    micro_group: int = 0,
    token_stat: TokenStat | None = None,
    trajectories: Sequence[Any] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """log π(c_t | prompt, c_<t) of ``completions[i]`` given ``prompts[prompt_index[i]]``, the
    completions of one prompt sharing packed rows of at most ``micro_group`` (0 = the whole
    group) in one forward. ``trajectories``: the tool trajectories of the completions (their
    media and positions, :func:`pack`); the prefix path takes none with media.

    Returns ``(logps [n, C], mask [n, C], token_stat [n, C] or None)`` on the policy's device, in
    the order of ``completions``: the same as :func:`mmrft.policy.completion_logps` on the
    per-completion prompts, computed with one prompt pass per round.
    """
    device, model = policy.device, policy.model
    order = rounds(prompt_index, micro_group)
    round_prompts = [prompts[prompt_index[members[0]]] for members in order]
    round_completions = [[completions[i] for i in members] for members in order]
    round_trajectories = (
        None if trajectories is None else [[trajectories[i] for i in members] for members in order]
    )
    if packing(model) == "prefix":
        if trajectories is not None and any(t.has_media for t in trajectories):
            raise ValueError(
                "the prefix path cannot place a trajectory's media (use rollout_logps)"
            )
        logits, ids, mask = prefix_logits(policy, round_prompts, round_completions)
    else:
        logits, ids, mask = packed_logits(
            policy, round_prompts, round_completions, round_trajectories
        )
    ids, mask = ids.to(device), mask.to(device)
    logps = selective_log_softmax(logits, ids)
    stat = token_stat(logits, ids) if token_stat is not None else None
    # back to the order of `completions`
    packed = [i for members in order for i in members]
    inverse = torch.empty(len(packed), dtype=torch.long)
    inverse[torch.tensor(packed, dtype=torch.long)] = torch.arange(len(packed))
    inverse = inverse.to(device)
    return (
        logps[inverse],
        mask[inverse],
        stat[inverse] if stat is not None else None,
    )


def packed_logits(
    policy: Any,
    prompts: Sequence[dict[str, Any]],
    completions: Sequence[Sequence[Sequence[int]]],
    trajectories: Sequence[Sequence[Any]] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Logits ``[n, C, V]`` (float32) predicting each token of every completion, row by row, with
    its ids and 0/1 mask ``[n, C]``: one forward of the packed rows (:func:`pack`)."""
    device, family, model = policy.device, policy.family, policy.model
    inputs, rows, cols, ids, mask, keep = pack(
        family, model, prompts, completions, policy.pad_token_id, trajectories, device
    )
    inputs = {k: _to(v, device) for k, v in inputs.items()}
    _cast_media(inputs, family, model)
    media = tuple(
        sorted(k for k in inputs if k not in ("input_ids", "position_ids", "attention_mask"))
    )
    distributed.check_same_graph(model, media)  # DeepSpeed ZeRO only
    out = distributed.module_to_call(model)(**inputs, logits_to_keep=keep, use_cache=False)
    # the kept logits of every completion token, [n, C, V]; index_select, not advanced
    # indexing: the first-token position is read by every completion of a row, and the
    # backward of advanced indexing adds such duplicates with parallel atomics on CPU (a
    # different float sum on every run), while index_select's backward (index_add_) is ordered
    kept = out.logits.reshape(-1, out.logits.shape[-1])
    flat = (rows * out.logits.shape[1] + cols).flatten().to(device)
    return kept.index_select(0, flat).view(*rows.shape, -1).float(), ids, mask


def packing(model: Any) -> str:
    """``"block"``: the group's completions are packed behind one copy of the prompt
    (:func:`pack`); ``"prefix"``: the model's decoder has layers that are not attention
    (Qwen3.5's Gated DeltaNet linear attention: a recurrent state and a causal convolution over
    the sequence, which no attention mask can confine to one completion), so the prompt is run
    once with a cache and the completions continue from copies of it (:func:`prefix_logits`)."""
    config = model.config.get_text_config(decoder=True)
    kinds = set(getattr(config, "layer_types", None) or ())
    attention = {"full_attention", "sliding_attention", "chunked_attention"}
    return "prefix" if kinds - attention else "block"


def prefix_logits(
    policy: Any,
    prompts: Sequence[dict[str, Any]],
    completions: Sequence[Sequence[Sequence[int]]],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """As :func:`packed_logits`, for models with recurrent layers: one forward of the prompts
    (left-padded, with their media and positions) that keeps its cache — keys and values of the
    attention layers, conv and recurrent states of the linear ones, all graph tensors
    (:func:`prefix_cache`) — then one forward of all completions (right-padded) from copies of
    their prompt's cache (``index_select``), at positions ``max(prompt positions) + 1 + t``.

    The completions see exactly the prompt states of their own ``[prompt | completion]``
    sequence, and in the backward the gradients of all completions reach the prompt (and the
    media encoder) through the cache, summed once. The recurrent states of the two ways differ
    only in the chunking of the scan (float summation order)."""
    device, family, model = policy.device, policy.family, policy.model
    pad = policy.pad_token_id
    call = distributed.module_to_call(model)
    collated = family.collate_rows(list(prompts), pad)
    input_ids = collated.pop("input_ids")
    attention = collated.pop("attention_mask")
    for key in family.token_keys:
        collated.pop(key, None)
    positions = [family.rope_positions(model, row) for row in prompts]
    axes, (R, W) = positions[0].shape[0], input_ids.shape
    position_ids = torch.zeros((axes, R, W), dtype=torch.long)
    for r, prompt_positions in enumerate(positions):
        position_ids[:, r, W - prompt_positions.shape[1] :] = prompt_positions
    media = {k: _to(v, device) for k, v in collated.items()}
    _cast_media(media, family, model)
    distributed.check_same_graph(model, tuple(sorted(media)))  # DeepSpeed ZeRO only
    out = call(
        input_ids=input_ids.to(device),
        attention_mask=attention.to(device),
        position_ids=(position_ids[0] if axes == 1 else position_ids).to(device),
        **{cache_keyword(model): prefix_cache(model)},
        use_cache=True,
        logits_to_keep=1,
        **media,
    )
    owner = torch.tensor([r for r, comps in enumerate(completions) for _ in comps], device=device)
    flat = [list(c) for comps in completions for c in comps]
    width = max(1, max(len(c) for c in flat))
    steps = max(2, width)  # a one-token forward would take the in-place decoding kernels
    ids = torch.full((len(flat), steps), pad, dtype=torch.long)
    mask = torch.zeros((len(flat), steps), dtype=torch.long)
    for i, c in enumerate(flat):
        ids[i, : len(c)] = torch.as_tensor(c, dtype=torch.long)
        mask[i, : len(c)] = 1
    layers = [
        None if entry is None else {k: v.index_select(0, owner) for k, v in entry.items()}
        for entry in cache_rows(returned_cache(out))
    ]
    after = torch.tensor([int(p.max()) + 1 for p in positions], device=device)
    steps_at = after.index_select(0, owner)[:, None] + torch.arange(steps, device=device)
    step_positions = steps_at[None].expand(axes, -1, -1)
    out2 = call(
        input_ids=ids.to(device),
        attention_mask=torch.cat([attention.to(device).index_select(0, owner), mask.to(device)], 1),
        position_ids=step_positions[0] if axes == 1 else step_positions,
        **{cache_keyword(model): build_cache(layers)},
        use_cache=True,
    )
    first = out.logits[:, -1].index_select(0, owner)[:, None]
    logits = torch.cat([first, out2.logits[:, : width - 1]], dim=1).float()
    return logits, ids[:, :width], mask[:, :width]


def cache_keyword(model: Any) -> str:
    """The model forward's name for the KV cache: ``cache`` (transformers ≥ 5.2x, which warns on
    the old name) or ``past_key_values`` (older, as vLLM's CPU build pins)."""
    import inspect

    from mmrft.models.family import base_model

    forward = type(base_model(model)).forward
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def returned_cache(out: Any) -> Any:
    """The KV cache a forward returned, under either name (:func:`cache_keyword`)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def _to(value: Any, device: torch.device) -> Any:
    """A tensor, or a dict of per-layer-type masks, on ``device`` (anything else as it is)."""
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    return value.to(device) if isinstance(value, torch.Tensor) else value


def _cast_media(inputs: dict[str, Any], family: Any, model: Any) -> None:
    """Patch values (the family's media keys) follow the model's dtype."""
    for key in family.media_keys:
        if key in inputs:
            inputs[key] = inputs[key].to(model.dtype)


def rollout_logps(
    policy: Any,
    rollouts: Any,
    indices: Sequence[int],
    *,
    group_shared: bool,
    micro_group: int = 0,
    token_stat: TokenStat | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The training forward of the completions ``indices`` of ``rollouts``
    (:class:`mmrft.rollout.Rollouts`): packed behind one prompt per round (:func:`group_logps`)
    or one ``[prompt | completion]`` sequence each (:func:`mmrft.policy.completion_logps`).

    Tool trajectories (``rollouts.trajectories``): the mask returned is the loss mask (the
    model's own tokens only); trajectories with media take the per-completion path on models
    packed by prefix (Qwen3.5), whose cache copies cannot place later images (sharded: all
    tool trajectories do, so that every rank's passes call the model alike)."""
    from mmrft.policy.model import completion_logps, pad_completions

    completions = [rollouts.completion_ids[i] for i in indices]
    trajectories = (
        None if rollouts.trajectories is None else [rollouts.trajectories[i] for i in indices]
    )
    media = trajectories is not None and any(t.has_media for t in trajectories)
    if distributed.passes_must_match(policy.model):
        # sharded: every rank's passes must call the model alike (one call per completion
        # pass, two per prefix pass), whatever media its own trajectories happen to have
        media = trajectories is not None
    if group_shared and not (media and packing(policy.model) == "prefix"):
        prompt_index = [rollouts.prompt_index[i] for i in indices]
        logps, mask, stat = group_logps(
            policy,
            rollouts.prompts,
            prompt_index,
            completions,
            micro_group,
            token_stat,
            trajectories,
        )
    else:
        rows = [rollouts.prompts[rollouts.prompt_index[i]] for i in indices]
        logps, mask, stat = completion_logps(
            policy, rows, completions, token_stat=token_stat, trajectories=trajectories
        )
    if trajectories is not None:
        loss_mask, _ = pad_completions([t.loss_mask for t in trajectories], 0)
        mask = mask * loss_mask[:, : mask.shape[1]].to(mask.device)
    return logps, mask, stat


# -- prefix caches: families whose prompt cannot be packed behind a block mask -----------------
class AssignedLinearLayer(LinearAttentionLayer):
    """A linear-attention cache layer (conv and recurrent state, as transformers'
    ``LinearAttentionLayer``) that *assigns* new states instead of copying them into a fixed
    buffer: the states stay autograd graph tensors (gradients of the completions flow into the
    prompt through them), and rows can be selected."""

    def update_conv_state(
        self,
        conv_states: torch.Tensor,
        state_idx: int = 0,
        conv_kernel_size: int | None = None,
        **_: Any,
    ) -> torch.Tensor:
        if not self.is_conv_states_initialized[state_idx]:
            self.conv_kernel_size[state_idx] = conv_kernel_size or conv_states.shape[-1]
            self.device, self.dtype = conv_states.device, conv_states.dtype
            self.is_conv_states_initialized[state_idx] = True
        kernel = self.conv_kernel_size[state_idx]
        if self.has_previous_state[state_idx]:
            full = torch.cat([self.conv_states[state_idx], conv_states], dim=-1)
        else:
            full = torch.nn.functional.pad(conv_states, (max(0, kernel - conv_states.shape[-1]), 0))
            self.has_previous_state[state_idx] = True
        self.conv_states[state_idx] = full[..., -kernel:]
        return full

    def update_recurrent_state(
        self, recurrent_states: torch.Tensor, state_idx: int = 0, **_: Any
    ) -> torch.Tensor:
        self.recurrent_states[state_idx] = recurrent_states
        self.is_recurrent_states_initialized[state_idx] = True
        return recurrent_states

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        for i in range(self.number_of_states):
            for states in (self.conv_states, self.recurrent_states):
                if states[i] is not None:
                    states[i] = states[i].index_select(0, indices.to(states[i].device))


def prefix_cache(model: Any) -> DynamicCache:
    """An empty cache for a forward of ``model`` whose states are read out afterwards
    (:func:`cache_rows`): every attention layer keeps all its keys and values (a sliding-window
    layer too: the masks do the windowing), linear-attention layers are
    :class:`AssignedLinearLayer`, KV-sharing consumers store nothing."""
    cache = DynamicCache(config=model.config)
    layers = []
    for layer in cache.layers:
        if type(layer) is DynamicSlidingWindowLayer:
            layer = DynamicLayer()
        elif type(layer) is LinearAttentionLayer:
            layer = AssignedLinearLayer(number_of_states=layer.number_of_states)
        layers.append(layer)
    cache.layers = layers
    return cache


def cache_rows(cache: Any) -> list[dict[str, torch.Tensor] | None]:
    """Per layer of a filled cache its tensors, batch first: ``{"keys", "values"}``
    (``[B, heads, L, dim]``) for attention, ``{"conv", "recurrent"}`` for linear attention,
    ``None`` for a layer that stores nothing (KV-sharing consumers, unused layers)."""
    out: list[dict[str, torch.Tensor] | None] = []
    for layer in cache.layers:
        if isinstance(layer, LinearAttentionLayer):
            out.append({"conv": layer.conv_states[0], "recurrent": layer.recurrent_states[0]})
        elif isinstance(layer, DummyLayer) or getattr(layer, "keys", None) is None:
            out.append(None)
        else:
            out.append({"keys": layer.keys, "values": layer.values})
    return out


def build_cache(layers: Sequence[dict[str, torch.Tensor] | None]) -> DynamicCache:
    """A cache holding ``layers`` (:func:`cache_rows`' layout): attention layers as full
    ``DynamicLayer`` s, linear attention as :class:`AssignedLinearLayer` (conv kernel = the
    conv state's width), empty layers as ``DummyLayer``. Graph tensors stay graph tensors."""
    built: list[Any] = []
    for entry in layers:
        if entry is None:
            built.append(DummyLayer())
        elif "keys" in entry:
            layer = DynamicLayer()
            layer.update(entry["keys"], entry["values"])
            built.append(layer)
        else:
            layer = AssignedLinearLayer()
            layer.update_conv_state(entry["conv"], conv_kernel_size=entry["conv"].shape[-1])
            layer.update_recurrent_state(entry["recurrent"])
            built.append(layer)
    cache = DynamicCache()
    cache.layers = built
    return cache
