"""Group-shared compute for the training forward: one prompt pass for the completions of a group.

GRPO samples ``G`` completions of every prompt. Forwarding ``[prompt | completion]`` once per
completion (what TRL, verl, EasyR1, ms-swift and OpenRLHF do) runs the media encoder and the
prompt's layers ``G`` times for the same result. Here the completions of a prompt are packed
behind one copy of it::

    row = [ prompt (Lp tokens, with its media) | c_1 | c_2 | … | c_k | padding ]

with a block attention mask: the prompt attends causally to itself; each token of ``c_j``
attends to the whole prompt and causally to the earlier tokens of ``c_j``, never to another
completion. Positions: the prompt keeps its own (the family's 1-D or multimodal RoPE,
:meth:`mmrft.family.ModelFamily.rope_positions`); every completion starts at the prompt's next
text position ``max(prompt positions) + 1`` on every axis, as if it were the only continuation.
So each completion token sees the same keys, values and positions as in its own
``[prompt | c_j]`` forward, and masked entries weigh exactly 0 in the softmax: the log-probs are
the per-completion ones up to float summation order, and in the backward the gradient through
the prompt (media encoder included) is the sum over the ``k`` completions, accumulated once.

A packed row holds at most ``rollout.micro_group`` completions; a larger group is split into
rounds that each carry their own copy of the prompt (Infinite Sampling's micro groups,
arXiv:2506.22950), so activation memory is set by the round, not by ``G``.

The mask is a dense ``[rows, 1, L, L]`` tensor: boolean for SDPA, additive for eager attention.
Kernels that take no arbitrary mask (flash-attention 2) cannot run this layout;
:func:`check_attention` says so at start-up.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from mmrft import distributed
from mmrft.algorithms import entropy_from_logits, selective_log_softmax

GROUP_ATTENTION = ("sdpa", "eager")


def attention_implementation(model: Any) -> str:
    """The attention kernel name of a (possibly wrapped) transformers model."""
    for module in model.modules():
        config = getattr(module, "config", None)
        name = getattr(config, "_attn_implementation", None)
        if name:
            return str(name)
    return "sdpa"


def check_attention(model: Any) -> None:
    """Raise ``ValueError`` when the model's attention kernel cannot take the group mask."""
    name = attention_implementation(model)
    if name not in GROUP_ATTENTION:
        raise ValueError(
            f"rollout.group_shared needs model.attn_implementation 'sdpa' or 'eager' "
            f"(the group mask is a dense block mask), not '{name}'; set "
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
) -> tuple[dict[str, Any], torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Model inputs of packed rows: row ``r`` is ``prompts[r]`` followed by the completions
    ``completions[r]`` (see the module docstring).

    Returns ``(inputs, rows, cols, ids, mask, keep)``: the keyword arguments of the model call
    (without ``logits_to_keep``); for every completion (in order, row by row) the row index and
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
    allowed = torch.eye(L, dtype=torch.bool).repeat(R, 1, 1)  # padding attends to itself only
    first = min(prompt_lengths) - 1  # the first position whose logits are kept
    spans: list[tuple[int, int, int, int]] = []  # (row, prompt length, start, length)
    for r, (row, comps) in enumerate(zip(prompts, completions)):
        lp = prompt_lengths[r]
        input_ids[r, :lp] = row["input_ids"]
        position_ids[:, r, :lp] = positions[r]
        allowed[r, :lp, :lp] = torch.ones(lp, lp, dtype=torch.bool).tril()
        after = int(positions[r].max()) + 1
        start = lp
        for comp in comps:
            n = len(comp)
            input_ids[r, start : start + n] = torch.as_tensor(list(comp), dtype=torch.long)
            position_ids[:, r, start : start + n] = after + torch.arange(n)
            allowed[r, start : start + n, :lp] = True
            allowed[r, start : start + n, start : start + n] = torch.ones(
                n, n, dtype=torch.bool
            ).tril()
            spans.append((r, lp, start, n))
            start += n
    C = max(1, max(n for *_, n in spans))
    rows = torch.zeros((len(spans), C), dtype=torch.long)
    cols = torch.zeros((len(spans), C), dtype=torch.long)
    ids = torch.full((len(spans), C), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(spans), C), dtype=torch.long)
    for j, (r, lp, start, n) in enumerate(spans):
        if not n:
            continue
        # token t of the completion is predicted at position lp - 1 (t = 0), else start + t - 1
        predict = torch.cat([torch.tensor([lp - 1]), start + torch.arange(n - 1)])
        rows[j, :n] = r
        cols[j, :n] = predict - first
        ids[j, :n] = input_ids[r, start : start + n]
        mask[j, :n] = 1

    media = family.collate_rows(list(prompts), pad_token_id)
    for key in ("input_ids", "attention_mask", *family.token_keys):
        media.pop(key, None)
    inputs = {
        "input_ids": input_ids,
        "position_ids": position_ids[0] if axes == 1 else position_ids,
        "attention_mask": block_mask(allowed, model),
        **media,
    }
    return inputs, rows, cols, ids, mask, L - first


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
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """log π(c_t | prompt, c_<t) of ``completions[i]`` given ``prompts[prompt_index[i]]``, the
    completions of one prompt sharing packed rows of at most ``micro_group`` (0 = the whole
    group) in one forward.

    Returns ``(logps [n, C], mask [n, C], entropy [n, C] or None)`` on the policy's device, in
    the order of ``completions``: the same as :func:`mmrft.policy.completion_logps` on the
    per-completion prompts, computed with one prompt pass per round.
    """
    device, family, model = policy.device, policy.family, policy.model
    order = rounds(prompt_index, micro_group)
    inputs, rows, cols, ids, mask, keep = pack(
        family,
        model,
        [prompts[prompt_index[members[0]]] for members in order],
        [[completions[i] for i in members] for members in order],
        policy.pad_token_id,
    )
    inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    for key in family.media_keys:  # patch values follow the model's dtype
        if key in inputs:
            inputs[key] = inputs[key].to(model.dtype)
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
    logits = kept.index_select(0, flat).view(*rows.shape, -1).float()
    ids, mask = ids.to(device), mask.to(device)
    logps = selective_log_softmax(logits, ids)
    entropy = entropy_from_logits(logits) if with_entropy else None
    # back to the order of `completions`
    packed = [i for members in order for i in members]
    inverse = torch.empty(len(packed), dtype=torch.long)
    inverse[torch.tensor(packed, dtype=torch.long)] = torch.arange(len(packed))
    inverse = inverse.to(device)
    return (
        logps[inverse],
        mask[inverse],
        entropy[inverse] if entropy is not None else None,
    )


def rollout_logps(
    policy: Any,
    rollouts: Any,
    indices: Sequence[int],
    *,
    group_shared: bool,
    micro_group: int = 0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The training forward of the completions ``indices`` of ``rollouts``
    (:class:`mmrft.rollout.Rollouts`): packed behind one prompt per round (:func:`group_logps`)
    or one ``[prompt | completion]`` sequence each (:func:`mmrft.policy.completion_logps`)."""
    from mmrft.policy import completion_logps

    completions = [rollouts.completion_ids[i] for i in indices]
    if group_shared:
        prompt_index = [rollouts.prompt_index[i] for i in indices]
        return group_logps(
            policy, rollouts.prompts, prompt_index, completions, micro_group, with_entropy
        )
    rows = [rollouts.prompts[rollouts.prompt_index[i]] for i in indices]
    return completion_logps(policy, rows, completions, with_entropy=with_entropy)
