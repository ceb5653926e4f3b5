"""``model.attn_implementation=block_sparse``: SDPA everywhere, and FlexAttention where a
packed group row hands a block mask.

The group-shared training forward (:mod:`mmrft.policy.group`) packs ``[prompt | c_1 | … | c_k]`` in one
row with a block mask. As a dense ``[rows, 1, L, L]`` tensor that mask costs ``L²`` per row
before any attention work, and SDPA computes every masked block anyway; at Video-R1's lengths
(a 4 k-token prompt of 16 frames and 8 completions of 1 k tokens: L = 12 k) that is 144 M
mask entries per row, of which 44 M may attend: more than two thirds of SDPA's work is on
masked entries, most of it in blocks masked entirely (completion ``i`` on completion ``j``). With this implementation the packed forward builds a
:class:`torch.nn.attention.flex_attention.BlockMask` instead (:func:`mmrft.policy.group.pack`): a
per-block summary computed from each token's segment (prompt, completion ``j``, padding), with
which FlexAttention skips the fully masked blocks and never materialises the ``L × L`` mask.

transformers takes custom attention kernels by name (``AttentionInterface.register``); the
name registered here, :data:`REGISTERED`, dispatches on the mask it is given: a ``BlockMask``
goes to FlexAttention (compiled, on CUDA; elsewhere, where FlexAttention has no backward, SDPA
computes the same function on the mask as the kernel reads it, :func:`dense_mask`: the tests'
exactness check of the block summary), anything else to transformers' own
SDPA function, so the vision and audio towers, generation and every other forward run exactly
as under ``sdpa``. Masks that transformers builds itself (generation) are SDPA's
(``sdpa_mask``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where used: plugin loading imports this module in
    import torch  # verifier worker processes, which need no torch

NAME = "block_sparse"  # the value of model.attn_implementation
REGISTERED = "mmrft_block_sparse"  # the name transformers knows the kernel by

_compiled: dict[str, Any] = {}


def _flex(device: torch.device) -> Any:
    """FlexAttention ``torch.compile``d once (the fused block-sparse kernel; eager FlexAttention
    materialises the whole score matrix)."""
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    if "cuda" not in _compiled:
        _compiled["cuda"] = torch.compile(flex_attention, dynamic=False)
    return _compiled["cuda"]


def block_sparse_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature (``query [B, H, Lq, D]``, ``key``/``value``
    ``[B, H_kv, Lk, D]``; returns ``[B, Lq, H, D]``): FlexAttention under a ``BlockMask``,
    transformers' SDPA function otherwise."""
    from torch.nn.attention.flex_attention import BlockMask
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if not isinstance(attention_mask, BlockMask):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    if dropout or kwargs.get("softcap") is not None or kwargs.get("s_aux") is not None:
        raise ValueError(
            "model.attn_implementation=block_sparse: attention dropout, logit soft-capping and "
            "attention sinks are not supported; use sdpa"
        )
    if query.device.type != "cuda":
        # FlexAttention has no backward off CUDA: compute the same function with SDPA on the
        # mask as the kernel reads it (the block summary, the rule in partial blocks)
        dense = dense_mask(attention_mask, query.device)
        return sdpa_attention_forward(
            module, query, key, value, dense, dropout=dropout, scaling=scaling, **kwargs
        )
    out = _flex(query.device)(
        query,
        key,
        value,
        block_mask=attention_mask,
        scale=scaling,
        enable_gqa=query.shape[1] != key.shape[1],
    )
    return out.transpose(1, 2).contiguous(), None


def dense_mask(block_mask: Any, device: torch.device | str = "cpu") -> torch.Tensor:
    """``[B, 1, Lq, Lk]`` bool: what FlexAttention computes under ``block_mask``: tiles not
    listed are masked, *full* tiles attend everywhere without the rule, *partial* tiles where
    the rule (``mask_mod``) says. ``L²`` memory: for CPU runs and checks only."""
    import torch

    Lq, Lk = block_mask.seq_lengths
    bq, bk = block_mask.BLOCK_SIZE
    kv_num = block_mask.kv_num_blocks[:, 0].cpu()
    B, nq = kv_num.shape
    nk = -(-Lk // bk)
    partial = torch.zeros((B, nq, nk + 1), dtype=torch.bool)
    full = torch.zeros((B, nq, nk + 1), dtype=torch.bool)
    for listed, counts, indices in (
        (partial, block_mask.kv_num_blocks, block_mask.kv_indices),
        (full, block_mask.full_kv_num_blocks, block_mask.full_kv_indices),
    ):
        if counts is None:
            continue
        counts, indices = counts[:, 0].cpu(), indices[:, 0].cpu().long()
        used = torch.arange(indices.shape[-1]) < counts[..., None]
        listed.scatter_(-1, torch.where(used, indices, nk), used)
    b = torch.arange(B)[:, None, None]
    q, k = torch.arange(Lq)[:, None], torch.arange(Lk)[None, :]
    tile_partial, tile_full = partial[b, q // bq, k // bk], full[b, q // bq, k // bk]
    rule = block_mask.mask_mod(
        b.to(device), torch.zeros((), dtype=torch.long, device=device), q.to(device), k.to(device)
    ).cpu()
    return (tile_full | (tile_partial & rule))[:, None].to(device)


def register() -> str:
    """Register the kernel and its generation masks with transformers (idempotent); returns the
    registered name, to pass as ``attn_implementation``."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(REGISTERED, block_sparse_attention)
    AttentionMaskInterface.register(REGISTERED, sdpa_mask)
    return REGISTERED


def transformers_name(attn_implementation: str | None) -> str | None:
    """What to hand ``from_pretrained`` for ``model.attn_implementation``: the registered name
    for ``block_sparse`` (registering it), the value itself otherwise."""
    return register() if attn_implementation == NAME else attn_implementation
