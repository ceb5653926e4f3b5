"""GRPO-family algorithms as pure tensor functions.

Everything here is stateless: tensors in, tensors out, no model, no optimizer, no process
group. The trainer composes them; the tests check them against hand-computed numbers and
against TRL's own loss code.

Shapes: ``N`` completions in a step, group-contiguous (``N = num_groups × G``, the ``G``
completions of one prompt side by side); ``B`` completions in a micro-batch, ``T`` completion
positions (right-padded), ``V`` vocabulary. ``mask`` is 1 on the completion tokens that count
and 0 on padding; it may be bool, int or float.

The per-token objective that :func:`grpo_loss` minimises, for completion ``i`` and token ``t``::

    ℓ_{i,t} = −min(ρ_{i,t}·A_i, clip(ρ_{i,t}, 1−ε_low, 1+ε_high)·A_i)   clipped surrogate
              + β·KL_{i,t}                                               penalty to π_ref
              − c_H·H_{i,t}                                              entropy bonus
    ρ_{i,t} = π_θ(y_{i,t} | ·) / π_old(y_{i,t} | ·)   (token level; GSPO: one ratio per sequence)

and the loss is ``aggregate_loss(ℓ, mask, agg_mode, ...)``: a token mean, a mean over
sequences of token means, or Dr.GRPO's token sum over a constant. The papers' variants are
combinations of these switches (:data:`LOSS_PRESETS`):

=======  =======================  =========  ==============  ========  ==========
preset   aggregation              advantage  ε_low / ε_high  ratio     paper
=======  =======================  =========  ==============  ========  ==========
grpo     seq-mean-token-mean      grpo       0.2 / 0.2       token     2402.03300
dr_grpo  seq-mean-token-sum-norm  dr_grpo    0.2 / 0.2       token     2503.20783
dapo     token-mean               grpo       0.2 / 0.28      token     2503.14476
bnpo     token-mean               grpo       0.2 / 0.2       token     (TRL name)
gspo     seq-mean-token-mean      grpo       3e-4 / 4e-4     sequence  2507.18071
=======  =======================  =========  ==============  ========  ==========

References (arXiv ids): PPO 1707.06347; GRPO (DeepSeekMath) 2402.03300; DAPO 2503.14476;
Dr.GRPO 2503.20783; GSPO 2507.18071; RLOO 2402.14740; REINFORCE++ 2501.03262; dual-clip PPO
1912.09729; Video-R1's T-GRPO temporal contrast 2503.21776; KL estimators: J. Schulman,
"Approximating KL Divergence" (2020, blog note), and Tang & Munos 2506.09477 on their gradients.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import MappingProxyType
from typing import Any, Literal

import torch
from torch import Tensor

AdvantageMode = Literal["grpo", "dr_grpo", "rloo", "reinforce_pp"]
RewardScale = Literal["group", "batch", "none"]
RatioLevel = Literal["token", "sequence"]
KLEstimator = Literal["k1", "k2", "k3"]
AggMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]

ADVANTAGE_MODES: tuple[str, ...] = ("grpo", "dr_grpo", "rloo", "reinforce_pp")
REWARD_SCALES: tuple[str, ...] = ("group", "batch", "none")
RATIO_LEVELS: tuple[str, ...] = ("token", "sequence")
KL_ESTIMATORS: tuple[str, ...] = ("k1", "k2", "k3")
AGG_MODES: tuple[str, ...] = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def _preset(
    agg_mode: AggMode,
    advantage: AdvantageMode,
    clip_low: float,
    clip_high: float,
    ratio_level: RatioLevel,
) -> MappingProxyType[str, Any]:
    return MappingProxyType(
        {
            "agg_mode": agg_mode,
            "advantage": advantage,
            "clip_low": clip_low,
            "clip_high": clip_high,
            "ratio_level": ratio_level,
        }
    )


LOSS_PRESETS: dict[str, MappingProxyType[str, Any]] = {
    # GRPO, DeepSeekMath (arXiv:2402.03300) = TRL loss_type="grpo": token mean inside each
    # completion, then mean over completions; group-std advantages; symmetric PPO clip 0.2.
    # (The paper also uses β = 0.04 with the k3 estimator; β is set separately.)
    "grpo": _preset("seq-mean-token-mean", "grpo", 0.2, 0.2, "token"),
    # Dr.GRPO (arXiv:2503.20783) = TRL loss_type="dr_grpo" + scale_rewards="none": no std in the
    # advantage (difficulty bias) and a token *sum* over the constant max_len · num_seqs
    # (length bias). TRL's loss_type alone leaves the std in; this preset removes both biases.
    "dr_grpo": _preset("seq-mean-token-sum-norm", "dr_grpo", 0.2, 0.2, "token"),
    # DAPO (arXiv:2503.14476) = TRL loss_type="dapo" + epsilon_high=0.28: token mean over the
    # whole step (token-level policy gradient) and clip-higher ε_high = 0.28. DAPO's dynamic
    # sampling and overlong shaping are separate: filter_zero_variance_groups, overlong_penalty.
    "dapo": _preset("token-mean", "grpo", 0.2, 0.28, "token"),
    # TRL loss_type="bnpo": a token mean like DAPO's with the symmetric clip. TRL divides by the
    # tokens of each *micro-batch* (then by the accumulation steps); mmrft always uses the
    # step's token count, so it equals TRL's bnpo with one micro-batch per step, and DAPO's
    # aggregation otherwise. The name comes from BNPO (arXiv:2506.02864), whose actual method,
    # Beta-distribution reward normalisation, neither TRL nor mmrft implements.
    "bnpo": _preset("token-mean", "grpo", 0.2, 0.2, "token"),
    # GSPO (arXiv:2507.18071, §5.1) = TRL importance_sampling_level="sequence", loss_type="grpo",
    # epsilon=3e-4, epsilon_high=4e-4: one length-normalised ratio per completion, clipped as a
    # whole; the paper uses no KL term (β = 0).
    "gspo": _preset("seq-mean-token-mean", "grpo", 3e-4, 4e-4, "sequence"),
}
"""Named recipes for ``algorithm.preset``: each maps config field names to values."""


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r}; expected one of {', '.join(choices)}")


def _masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``x`` over the positions where ``mask`` is non-zero (0 when there are none)."""
    m = mask.to(x.dtype)
    return (x * m).sum() / m.sum().clamp(min=1.0)


# --------------------------------------------------------------------------- log-probs


def selective_log_softmax(logits: Tensor, ids: Tensor) -> Tensor:
    """Log-probability of the chosen tokens, ``log softmax(logits)[..., ids]``.

    ``log p(y_t) = z_{t, y_t} − logsumexp_v z_{t, v}``, computed one sequence at a time so that
    no ``[B, T, V]`` log-softmax is materialised (peak extra memory: one ``[T, V]`` slice).
    Half-precision logits (fp16 / bf16) are upcast slice by slice to float32, where logsumexp
    is accurate; the result is float32 for them and the logits' dtype otherwise.

    Args:
        logits: ``[B, T, V]`` unnormalised scores.
        ids: ``[B, T]`` token ids (int64) in ``[0, V)``.

    Returns:
        ``[B, T]`` log-probabilities, ``≤ 0``. Differentiable w.r.t. ``logits``.
    """
    if logits.dim() != 3 or ids.shape != logits.shape[:2]:
        raise ValueError(
            f"expected logits [B, T, V] and ids [B, T], got {logits.shape} and {ids.shape}"
        )
    rows = []
    for row, row_ids in zip(logits, ids):
        if row.dtype in (torch.float16, torch.bfloat16):
            row = row.float()
        rows.append(row.gather(-1, row_ids.unsqueeze(-1)).squeeze(-1) - row.logsumexp(-1))
    if not rows:
        dtype = torch.float32 if logits.dtype in (torch.float16, torch.bfloat16) else logits.dtype
        return logits.new_zeros(ids.shape, dtype=dtype)
    return torch.stack(rows)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of the next-token distribution at each position.

    ``H_t = −Σ_v p_{t,v} log p_{t,v} = logsumexp_v z_{t,v} − Σ_v p_{t,v} z_{t,v}``, one sequence
    at a time (see :func:`selective_log_softmax` for memory and dtype).

    Args:
        logits: ``[B, T, V]``.

    Returns:
        ``[B, T]`` entropies in nats, in ``[0, log V]``. Differentiable (for an entropy bonus).
    """
    if logits.dim() != 3:
        raise ValueError(f"expected logits [B, T, V], got {logits.shape}")
    rows = []
    for row in logits:
        if row.dtype in (torch.float16, torch.bfloat16):
            row = row.float()
        logp = row.log_softmax(-1)
        rows.append(-(logp.exp() * logp).sum(-1))
    if not rows:
        dtype = torch.float32 if logits.dtype in (torch.float16, torch.bfloat16) else logits.dtype
        return logits.new_zeros(logits.shape[:2], dtype=dtype)
    return torch.stack(rows)


TokenStat = Callable[[Tensor, Tensor], Tensor]
"""A per-position statistic of a forward's logits ``[B, T, V]`` and the completion's token ids
``[B, T]``, ``[B, T]`` out: what the training forward returns beside the log-probs."""


def token_entropy(logits: Tensor, ids: Tensor) -> Tensor:
    """:func:`entropy_from_logits` as a :data:`TokenStat` (the ids are not needed)."""
    return entropy_from_logits(logits)


def argmax_match(logits: Tensor, ids: Tensor) -> Tensor:
    """1.0 where the model's most likely next token is the completion's token, else 0.0
    (``[B, T]``, no gradient): e.g. the student's samples' agreement with a teacher's argmax."""
    return (logits.detach().argmax(-1) == ids.to(logits.device)).float()


# --------------------------------------------------------------------------- advantages


def _grouped(rewards: Tensor, group_size: int) -> Tensor:
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [N], got shape {tuple(rewards.shape)}")
    if group_size < 2:
        raise ValueError(f"group_size={group_size}; a group needs ≥ 2 completions for a baseline")
    if rewards.numel() % group_size:
        raise ValueError(
            f"{rewards.numel()} rewards do not split into groups of {group_size} "
            "(rewards must be group-contiguous, N = num_groups × group_size)"
        )
    if not rewards.is_floating_point():
        rewards = rewards.float()
    return rewards.view(-1, group_size)


def group_advantages(
    rewards: Tensor,
    group_size: int,
    mode: AdvantageMode = "grpo",
    eps: float = 1e-4,
    scale: RewardScale | None = None,
) -> Tensor:
    """Advantage of each completion relative to the other completions of its prompt.

    With ``r_{g,i}`` the reward of completion ``i`` of group ``g`` (``G = group_size``),
    ``μ_g`` / ``σ_g`` the group's mean / standard deviation and ``σ_B`` the whole batch's:

    - ``"grpo"``: ``(r − μ_g) / (σ_g + eps)`` (DeepSeekMath, arXiv:2402.03300).
    - ``"dr_grpo"``: ``r − μ_g`` (Dr.GRPO, arXiv:2503.20783: dividing by σ_g over-weights
      questions that are too easy or too hard).
    - ``"rloo"``: ``r_i − mean_{j≠i} r_j = G/(G−1)·(r_i − μ_g)``, the leave-one-out baseline
      (RLOO, Ahmadian et al., arXiv:2402.14740).
    - ``"reinforce_pp"``: ``a = r − μ_g``, then batch-normalised
      ``(a − mean_B a) / (std_B a + eps)`` (REINFORCE++ with group baseline, Hu,
      arXiv:2501.03262).

    ``scale`` overrides the normalisation of the centred rewards (``r − μ_g``, or the
    leave-one-out difference for RLOO): ``"group"`` divides by ``σ_g + eps``, ``"batch"`` by
    ``σ_B + eps`` where ``σ_B`` is the std of the raw rewards over the whole batch (TRL's
    ``scale_rewards="batch"``, after Lite PPO, arXiv:2508.08221), ``"none"`` does not divide.
    ``None`` keeps the mode's own: group for grpo, none for dr_grpo and rloo, REINFORCE++'s
    batch normalisation for reinforce_pp.

    Every std is the unbiased (Bessel-corrected, ``/(n−1)``) one, as TRL's ``nanstd`` and
    ``torch.std``. A group whose rewards are all equal gets advantage 0 in every mode.

    Args:
        rewards: ``[N]`` finite rewards, group-contiguous, ``N = num_groups × group_size``.
        group_size: ``G ≥ 2``.
        mode: the baseline / normalisation above.
        eps: added to the std in the denominator (TRL, R1-V: 1e-4).
        scale: normalisation override, see above.

    Returns:
        ``[N]`` float advantages, same order as ``rewards``.
    """
    _check_choice("mode", mode, ADVANTAGE_MODES)
    if scale is not None:
        _check_choice("scale", scale, REWARD_SCALES)
    grouped = _grouped(rewards, group_size)
    mean = grouped.mean(dim=1, keepdim=True)
    if mode == "rloo":
        centred = grouped - (grouped.sum(dim=1, keepdim=True) - grouped) / (group_size - 1)
    else:
        centred = grouped - mean
    if scale is None:
        if mode == "reinforce_pp":
            flat = centred.flatten()
            return (flat - flat.mean()) / (flat.std() + eps)
        scale = "group" if mode == "grpo" else "none"
    if scale == "group":
        centred = centred / (grouped.std(dim=1, keepdim=True) + eps)
    elif scale == "batch":
        centred = centred / (grouped.std() + eps)
    return centred.flatten()


def _all_equal(grouped: Tensor, atol: float) -> Tensor:
    return (grouped.amax(dim=1) - grouped.amin(dim=1)) <= atol


def group_stats(rewards: Tensor, group_size: int, *, atol: float = 1e-6) -> dict[str, float]:
    """Summary of a step's rewards, for logging (``rollout/<key>``).

    Args:
        rewards: ``[N]`` group-contiguous rewards.
        group_size: ``G ≥ 2``.
        atol: two rewards within ``atol`` count as equal for ``frac_zero_std``.

    Returns:
        ``reward_mean``, ``reward_std`` (over the batch, unbiased), ``group_std_mean`` (mean
        over groups of the within-group std) and ``frac_zero_std``: the share of groups, in
        ``[0, 1]``, whose rewards are all equal; they carry no learning signal (zero advantage).
    """
    grouped = _grouped(rewards, group_size)
    flat = grouped.flatten()
    values = torch.stack(
        [
            flat.mean(),
            flat.std(),
            grouped.std(dim=1).mean(),
            _all_equal(grouped, atol).float().mean(),
        ]
    ).tolist()
    return dict(zip(("reward_mean", "reward_std", "group_std_mean", "frac_zero_std"), values))


def filter_zero_variance_groups(rewards: Tensor, group_size: int, *, atol: float = 1e-6) -> Tensor:
    """Which groups to keep under DAPO's dynamic sampling (arXiv:2503.14476, §3.2).

    A group whose rewards are all equal (all solved or all failed with binary rewards) has
    advantage 0 for every completion and adds nothing but denominator weight; DAPO drops
    such groups and samples more prompts until the batch is full again:
    keep ``g`` iff ``max_i r_{g,i} − min_i r_{g,i} > atol``.

    Args:
        rewards: ``[N]`` group-contiguous rewards.
        group_size: ``G ≥ 2``.
        atol: spread at or below which a group counts as constant.

    Returns:
        ``[num_groups]`` bool, True for the groups to keep. Expand to completions with
        ``keep.repeat_interleave(group_size)``.
    """
    return ~_all_equal(_grouped(rewards, group_size), atol)


def overlong_penalty(lengths: Tensor, max_len: int, cache_len: int, penalty: float = 1.0) -> Tensor:
    """DAPO's soft overlong punishment (arXiv:2503.14476, Eq. 13), a reward added to the task's.

    With ``L = max_len`` (the generation cap) and ``C = cache_len`` (the soft zone before it)::

        R(|y|) = 0                         if |y| ≤ L − C
                 ((L − C) − |y|) / C       if L − C < |y| ≤ L
                 −1                        if |y| > L

    scaled by ``penalty``. DAPO: ``L = 20480``, ``C = 4096``. Identical to TRL's
    ``get_soft_overlong_punishment`` for ``penalty = 1``.

    Args:
        lengths: ``[N]`` completion lengths in tokens (≥ 0).
        max_len: ``L > 0``.
        cache_len: ``0 ≤ C ≤ L``; 0 means no soft zone (−penalty only beyond ``L``).
        penalty: magnitude of the full punishment, ``≥ 0``.

    Returns:
        ``[N]`` float rewards in ``[−penalty, 0]``.
    """
    if max_len <= 0 or not 0 <= cache_len <= max_len:
        raise ValueError(
            f"need max_len > 0 and 0 ≤ cache_len ≤ max_len, got {max_len}, {cache_len}"
        )
    if penalty < 0:
        raise ValueError(f"penalty={penalty} must be ≥ 0")
    lengths = lengths.float()
    if cache_len == 0:
        frac = (lengths > max_len).float()
    else:
        frac = ((lengths - (max_len - cache_len)) / cache_len).clamp(0.0, 1.0)
        frac = torch.where(lengths > max_len, torch.ones_like(frac), frac)
    return -penalty * frac


def _check_contrast(ratio: float, bonus: float) -> None:
    if not (math.isfinite(ratio) and ratio >= 0):
        raise ValueError(f"ratio={ratio} must be a finite number ≥ 0")
    if not (math.isfinite(bonus) and bonus >= 0):
        raise ValueError(f"bonus={bonus} must be a finite number ≥ 0")


def temporal_contrast_bonus(
    ordered: Tensor,
    shuffled: Tensor,
    *,
    ratio: float = 0.8,
    bonus: float = 0.3,
    correct_above: float = 0.1,
) -> Tensor:
    """Video-R1's T-GRPO temporal reward (Feng et al. 2025, arXiv:2503.21776), per prompt.

    Row ``g`` holds the correctness scores ``s_{g,i}`` of the ``G`` completions of prompt ``g``
    sampled on its video with the frames in temporal order, and ``s̃_{g,j}`` of ``G'``
    completions of the same prompt sampled with the frames shuffled::

        p_g  = (1/G)  Σ_i s_{g,i}        p̃_g = (1/G') Σ_j s̃_{g,j}
        r_g  = α   if p_g ≥ μ·p̃_g   else 0
        bonus_{g,i} = r_g   if s_{g,i} > τ   else 0

    with α = ``bonus`` (paper: 0.3), μ = ``ratio`` (paper: 0.8) and τ = ``correct_above``. With
    0/1 accuracy scores ``p`` and ``p̃`` are the fractions of correct answers, as the paper writes
    them; Video-R1's code averages the accuracy reward itself and marks a completion correct
    when its accuracy exceeds 0.1 (``rewards_per_func[:, 0] > 0.1``), which this follows for
    graded scores too. A tie ``p = μ·p̃`` grants the bonus (``≥``, compared in float64 with a
    1e-9 tolerance so that 0.8·0.625 = 0.5 counts as a tie). Video-R1 compares per device batch,
    which is one prompt in its runs (1 prompt per GPU); here every prompt is its own row.

    Args:
        ordered: ``[P, G]`` correctness scores of the completions on the ordered frames.
        shuffled: ``[P, G']`` scores of the completions on the shuffled frames (``G'`` ≥ 1 may
            differ from ``G``; Video-R1 samples ``G' = G / 2``).
        ratio: μ ≥ 0.
        bonus: α ≥ 0.
        correct_above: τ.

    Returns:
        ``[P·G]`` bonus per ordered completion, group-contiguous, each 0 or α, in the dtype of
        ``ordered`` (float32 for integer scores).
    """
    _check_contrast(ratio, bonus)
    if ordered.dim() != 2 or shuffled.dim() != 2 or ordered.shape[0] != shuffled.shape[0]:
        raise ValueError(
            f"need ordered [P, G] and shuffled [P, G'] scores, got {tuple(ordered.shape)} and "
            f"{tuple(shuffled.shape)}"
        )
    if ordered.shape[0] and (ordered.shape[1] == 0 or shuffled.shape[1] == 0):
        raise ValueError("every prompt needs at least one ordered and one shuffled completion")
    p = ordered.double().mean(dim=1)
    p_shuffled = shuffled.double().mean(dim=1)
    holds = p >= ratio * p_shuffled - 1e-9
    correct = ordered > correct_above
    dtype = ordered.dtype if ordered.is_floating_point() else torch.float32
    return ((holds.unsqueeze(1) & correct).to(dtype) * bonus).flatten()


def temporal_contrast_decided(
    ordered: Tensor, *, ratio: float = 0.8, high: float = 1.0, correct_above: float = 0.1
) -> Tensor:
    """Which prompts' :func:`temporal_contrast_bonus` the shuffled completions cannot change.

    With scores at most ``high`` (the verifier's maximum, so ``p̃ ≤ high``), prompt ``g`` is
    decided by its ordered completions alone when

    * none is correct (``max_i s_{g,i} ≤ τ``): no completion can receive the bonus; or
    * ``p_g ≥ μ·high``: then ``p_g ≥ μ·p̃_g`` for every possible ``p̃_g``, the bonus is granted.

    For these prompts the bonus equals :func:`temporal_contrast_bonus` with *any* shuffled
    scores in ``[·, high]`` (e.g. zeros), so their shuffled completions need not be sampled.

    Args:
        ordered: ``[P, G]`` correctness scores on the ordered frames.
        ratio: μ ≥ 0.
        high: the largest score the correctness verifier gives.
        correct_above: τ.

    Returns:
        ``[P]`` bool, True where the shuffled completions are not needed.
    """
    _check_contrast(ratio, 0.0)
    if ordered.dim() != 2:
        raise ValueError(f"need ordered [P, G] scores, got {tuple(ordered.shape)}")
    none_correct = ~(ordered > correct_above).any(dim=1)
    always = ordered.double().mean(dim=1) >= ratio * high - 1e-9
    return none_correct | always


# --------------------------------------------------------------------------- losses


def policy_loss(
    logps: Tensor,
    old_logps: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    ratio_level: RatioLevel = "token",
    dual_clip: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token clipped surrogate loss (PPO, arXiv:1707.06347; DAPO clip-higher).

    ``ℓ_{i,t} = −min(ρ_{i,t}·A_i, clip(ρ_{i,t}, 1 − ε_low, 1 + ε_high)·A_i)``.

    Clipping removes the gradient of tokens whose ratio already moved past the trust region
    in the advantage's direction. ``ε_low ≠ ε_high`` is DAPO's clip-higher (arXiv:2503.14476:
    ε_high = 0.28 lets low-probability tokens grow, against entropy collapse).

    ``ratio_level``:

    - ``"token"``: ``ρ_{i,t} = exp(logp_{i,t} − old_{i,t})``.
    - ``"sequence"`` (GSPO, arXiv:2507.18071): the length-normalised sequence ratio
      ``s_i = exp(mean_{t∈mask} (logp_{i,t} − old_{i,t}))``, the geometric mean of the token
      ratios, in GSPO-token's straight-through form
      ``ρ_{i,t} = sg[s_i] · π_θ(y_{i,t}) / sg[π_θ(y_{i,t})]``: every token carries the value
      ``s_i`` and the gradient ``s_i·∇logp_{i,t}``. For a per-sequence advantage and any of
      the aggregations of :func:`aggregate_loss` (whose weights are equal within a sequence)
      this has the same value and gradient as GSPO's sequence objective and as TRL's
      ``importance_sampling_level="sequence"``, which keeps one ``[B, 1]`` ratio and
      differentiates through the mean (``∂s_i/∂logp_{i,t} = s_i/|y_i|``, times ``|y_i|``
      tokens); with ``[B, T]`` advantages it is GSPO-token.

    ``dual_clip = c > 1`` (dual-clip PPO, Ye et al., arXiv:1912.09729): for ``A < 0`` the loss
    is capped at ``−c·A``, i.e. ``ℓ = min(ℓ, −c·A)``, so a token whose ratio exploded
    (``ρ > c``) under a negative advantage stops pushing an unbounded gradient. Same as TRL's
    ``delta = c`` (INTELLECT-2's two-sided clip) whenever ``c ≥ 1 + ε_high``.

    Args:
        logps: ``[B, T]`` log π_θ of the sampled tokens (with grad).
        old_logps: ``[B, T]`` log π_old of the same tokens (the sampling policy; no grad).
        advantages: ``[B]`` per-completion advantages, or ``[B, T]`` per-token.
        mask: ``[B, T]`` completion mask. Positions outside it must hold finite values; their
            loss is not meaningful and :func:`aggregate_loss` ignores it.
        clip_low: ``ε_low ∈ [0, 1)``.
        clip_high: ``ε_high ≥ 0``.
        ratio_level: ``"token"`` or ``"sequence"``.
        dual_clip: ``c > 1`` or None.

    Returns:
        ``(loss [B, T], stats)``; stats (detached scalars): ``clip_frac/low`` (ρ < 1 − ε_low
        with A < 0), ``clip_frac/high`` (ρ > 1 + ε_high with A > 0), ``clip_frac/total``,
        ``clip_frac/dual`` (ρ > c with A < 0; only with ``dual_clip``), ``ratio/mean``. They are
        fractions of masked tokens, or of sequences at sequence level (as TRL logs them).
    """
    _check_choice("ratio_level", ratio_level, RATIO_LEVELS)
    if not 0 <= clip_low < 1 or clip_high < 0:
        raise ValueError(f"need 0 ≤ clip_low < 1 and clip_high ≥ 0, got {clip_low}, {clip_high}")
    if dual_clip is not None and dual_clip <= 1:
        raise ValueError(f"dual_clip={dual_clip} must be > 1")
    if logps.shape != old_logps.shape or logps.shape != mask.shape:
        raise ValueError(
            f"logps {tuple(logps.shape)}, old_logps {tuple(old_logps.shape)} and mask "
            f"{tuple(mask.shape)} must all be [B, T]"
        )
    if advantages.shape not in (logps.shape[:1], logps.shape):
        raise ValueError(f"advantages {tuple(advantages.shape)} must be [B] or [B, T]")
    adv = advantages.to(logps.dtype)
    if adv.dim() == 1:
        adv = adv.unsqueeze(1)
    m = mask.to(logps.dtype)

    log_ratio = logps - old_logps
    if ratio_level == "token":
        log_w = log_ratio
    else:
        lengths = m.sum(-1, keepdim=True).clamp(min=1.0)
        seq_log_ratio = (log_ratio * m).sum(-1, keepdim=True) / lengths
        log_w = seq_log_ratio.detach() + logps - logps.detach()
    ratio = torch.exp(log_w)
    clipped = ratio.clamp(1 - clip_low, 1 + clip_high)
    loss = -torch.min(ratio * adv, clipped * adv)
    if dual_clip is not None:
        loss = torch.where(adv < 0, torch.minimum(loss, -dual_clip * adv), loss)

    with torch.no_grad():
        if ratio_level == "sequence" and advantages.dim() == 1:
            # one ratio per sequence: count sequences (those with at least one token)
            r, a, w = ratio[:, :1], adv, (m.sum(-1, keepdim=True) > 0)
        else:
            r, a, w = ratio, adv.expand_as(ratio), m
        low = (r < 1 - clip_low) & (a < 0)
        high = (r > 1 + clip_high) & (a > 0)
        stats = {
            "clip_frac/low": _masked_mean(low.float(), w),
            "clip_frac/high": _masked_mean(high.float(), w),
            "clip_frac/total": _masked_mean((low | high).float(), w),
            "ratio/mean": _masked_mean(r.float(), w),
        }
        if dual_clip is not None:
            stats["clip_frac/dual"] = _masked_mean(((r > dual_clip) & (a < 0)).float(), w)
    return loss, stats


def full_reverse_kl(student_logits: Tensor, teacher_logp: Tensor) -> Tensor:
    """Per-position reverse KL over the whole next-token distribution:
    ``KL_t(π_S ‖ π_T) = Σ_v π_S(v | s_t) (log π_S(v | s_t) − log π_T(v | s_t))``, in nats, ≥ 0.

    The exact term of on-policy distillation at each state ``s_t`` the student reached (GKD,
    arXiv:2306.13649, with β = 1): its gradient needs no sampling of the next token, so it has
    none of the per-token estimate's variance (:func:`distill_advantages`). Summed over the
    vocabulary both models share (the first ``S = min(V_S, V_T)`` ids: a larger output layer's
    extra rows are padding that no text uses), one sequence at a time.

    The gradient is written in closed form, ``∂KL_t/∂z_j = p_j (d_j − KL_t) + p_j ([j < S] − P_S)``
    with ``d_j = log p_j − log π_T(j)`` (0 for j ≥ S) and ``P_S = Σ_{v<S} p_v``; the second term
    is dropped when ``S = V_S``, where it is 0 but autograd would leave float noise ``p_j (1 −
    Σ p)``, which Adam's normalisation turns into full-size steps: a teacher equal to the
    student must leave the student unchanged.

    Args:
        student_logits: ``[B, T, V_S]`` (with grad).
        teacher_logp: ``[B, T, V_T]`` the teacher's log-softmax at the same positions (no grad).

    Returns:
        ``[B, T]`` float32 (float64 for float64 logits), differentiable w.r.t. ``student_logits``.
    """
    if student_logits.shape[:2] != teacher_logp.shape[:2]:
        raise ValueError(
            f"student logits {tuple(student_logits.shape)} and teacher log-probs "
            f"{tuple(teacher_logp.shape)} must share [B, T]"
        )
    return _ReverseKL.apply(student_logits, teacher_logp.detach())


def _upcast(x: Tensor) -> Tensor:
    return x if x.dtype == torch.float64 else x.float()


class _ReverseKL(torch.autograd.Function):
    """:func:`full_reverse_kl` with its closed-form gradient, one sequence at a time."""

    @staticmethod
    def forward(ctx: Any, logits: Tensor, teacher_logp: Tensor) -> Tensor:
        shared = min(logits.shape[-1], teacher_logp.shape[-1])
        rows = []
        for z, t in zip(logits, teacher_logp):
            logp = _upcast(z).log_softmax(-1)[..., :shared]
            rows.append((logp.exp() * (logp - _upcast(t[..., :shared]))).sum(-1))
        ctx.save_for_backward(logits, teacher_logp)
        if not rows:
            return _upcast(logits.new_zeros(logits.shape[:2]))
        return torch.stack(rows)

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor, None]:
        logits, teacher_logp = ctx.saved_tensors
        vocab = logits.shape[-1]
        shared = min(vocab, teacher_logp.shape[-1])
        grads = []
        for z, t, g in zip(logits, teacher_logp, grad_out):
            logp = _upcast(z).log_softmax(-1)
            p = logp.exp()
            diff = torch.zeros_like(logp)
            diff[..., :shared] = logp[..., :shared] - _upcast(t[..., :shared])
            kl = (p * diff).sum(-1, keepdim=True)
            grad = p * (diff - kl)
            if shared < vocab:
                inside = torch.zeros_like(logp)
                inside[..., :shared] = 1.0
                grad = grad + p * (inside - p[..., :shared].sum(-1, keepdim=True))
            grads.append((grad * g.unsqueeze(-1)).to(logits.dtype))
        return (torch.stack(grads) if grads else torch.zeros_like(logits)), None


def distill_advantages(
    student_logps: Tensor, teacher_logps: Tensor, mask: Tensor, discount: float = 0.0
) -> Tensor:
    """Per-token advantages of on-policy distillation (reverse KL on the student's samples).

    On each sampled token ``d_{i,t} = −(log π_S(y_{i,t}) − log π_T(y_{i,t}))``: minus the
    per-token estimate of ``KL(π_S ‖ π_T)`` on the student's own sample, whose expectation
    over ``y ~ π_S`` is the reverse KL. With it as the advantage, the policy gradient
    ``E[d·∇log π_S]`` is the gradient of ``−KL(π_S ‖ π_T)`` (GKD, Agarwal et al. 2024,
    arXiv:2306.13649; Qwen3, arXiv:2505.09388; Thinking Machines, "On-policy distillation",
    2025). With a discount ``γ > 0`` token ``t`` also carries the later tokens' terms,
    ``A_{i,t} = Σ_{k≥t, m_k=1} γ^{n(t,k)} d_{i,k}`` with ``n(t, k)`` the student's tokens in
    ``(t, k]`` (a tool observation between two turns adds no discount); ``γ = 0`` is each
    token's own term, the published recipes' choice.

    Args:
        student_logps: ``[B, T]`` log π_S of the sampled tokens (the sampling policy, π_old).
        teacher_logps: ``[B, T]`` log π_T of the same tokens.
        mask: ``[B, T]`` the student's own tokens.
        discount: ``γ ∈ [0, 1]``.

    Returns:
        ``[B, T]`` advantages, detached, 0 outside the mask.
    """
    if not 0 <= discount <= 1:
        raise ValueError(f"discount={discount} must be in [0, 1]")
    if student_logps.shape != teacher_logps.shape or student_logps.shape != mask.shape:
        raise ValueError(
            f"student_logps {tuple(student_logps.shape)}, teacher_logps "
            f"{tuple(teacher_logps.shape)} and mask {tuple(mask.shape)} must all be [B, T]"
        )
    m = mask.to(student_logps.dtype)
    own = -(student_logps.detach() - teacher_logps.detach()) * m
    if discount == 0:
        return own
    out = torch.zeros_like(own)
    running = torch.zeros_like(own[:, 0])
    for t in range(own.shape[1] - 1, -1, -1):  # masked positions pass the sum on unchanged
        running = torch.where(m[:, t] > 0, own[:, t] + discount * running, running)
        out[:, t] = running * m[:, t]
    return out


def kl_penalty(logps: Tensor, ref_logps: Tensor, estimator: KLEstimator = "k3") -> Tensor:
    """Per-token estimate of KL(π_θ ‖ π_ref) from the sampled tokens (Schulman 2020).

    With ``d = ref_logps − logps = log(π_ref / π_θ)`` at the sampled token ``y ~ π_θ``:

    - ``"k1" = −d``: unbiased, high variance, can be negative.
    - ``"k2" = d² / 2``: biased, low variance, ≥ 0.
    - ``"k3" = exp(d) − d − 1``: unbiased and ≥ 0; GRPO's choice (DeepSeekMath Eq. 4) and TRL's.
      Not clamped (TRL does not clamp either); ``d`` above ~88 overflows float32.

    Used as a differentiable loss term the estimators differ in *gradient* (Tang & Munos,
    arXiv:2506.09477): on-policy, ``E[∇k1] = 0``; ``E[∇k2] = ∇KL(π_θ‖π_ref)``, the reverse-KL
    gradient; ``E[∇k3] = ∇KL(π_ref‖π_θ)``, the forward KL's.

    Args:
        logps: ``[B, T]`` log π_θ (with grad).
        ref_logps: ``[B, T]`` log π_ref (no grad).
        estimator: ``"k1"``, ``"k2"`` or ``"k3"``.

    Returns:
        ``[B, T]`` per-token KL estimates (k2, k3 ≥ 0).
    """
    _check_choice("estimator", estimator, KL_ESTIMATORS)
    d = ref_logps - logps
    if estimator == "k1":
        return -d
    if estimator == "k2":
        return 0.5 * d * d
    return torch.exp(d) - d - 1


def aggregate_loss(
    per_token: Tensor,
    mask: Tensor,
    mode: AggMode = "token-mean",
    *,
    num_tokens: float | Tensor | None = None,
    num_seqs: float | Tensor | None = None,
    max_len: int | None = None,
) -> Tensor:
    """Reduce a per-token loss to the scalar to back-propagate.

    With ``m`` the mask, ``|y_i| = Σ_t m_{i,t}``:

    - ``"token-mean"``: ``Σ_{i,t} ℓ_{i,t} m_{i,t} / num_tokens``. Every token weighs the same
      (DAPO's token-level loss, arXiv:2503.14476; TRL ``"dapo"`` / ``"bnpo"``).
    - ``"seq-mean-token-mean"``: ``Σ_i (Σ_t ℓ_{i,t} m_{i,t} / |y_i|) / num_seqs``. Every
      completion weighs the same (GRPO, arXiv:2402.03300; TRL ``"grpo"``; GSPO).
    - ``"seq-mean-token-sum-norm"``: ``Σ_{i,t} ℓ_{i,t} m_{i,t} / (max_len · num_seqs)``: a token
      sum over a constant, no length bias (Dr.GRPO, arXiv:2503.20783; TRL ``"dr_grpo"``).

    Gradient accumulation: the step's loss is the sum of its micro-batches' losses. Pass
    ``num_tokens`` (masked tokens) and ``num_seqs`` (completions) counted over the *whole*
    optimizer step, and the same ``max_len`` (the generation cap) to every micro-batch; the
    accumulated gradient then equals the gradient of one batch holding the whole step. Under
    data parallelism, where gradients are averaged over ranks, pass the global counts divided
    by the world size. ``None`` uses this batch's own count (one micro-batch per step), and
    ``max_len=None`` this batch's padded length ``T`` (not constant across micro-batches).

    Args:
        per_token: ``[B, T]`` loss per token.
        mask: ``[B, T]`` completion mask.
        mode: the aggregation above.
        num_tokens: token denominator for ``"token-mean"`` (clamped to ≥ 1).
        num_seqs: sequence denominator for the two ``seq-mean-*`` modes.
        max_len: the constant of ``"seq-mean-token-sum-norm"``.

    Returns:
        A scalar tensor.
    """
    _check_choice("mode", mode, AGG_MODES)
    if per_token.shape != mask.shape:
        raise ValueError(f"per_token {tuple(per_token.shape)} and mask {tuple(mask.shape)} differ")
    m = mask.to(per_token.dtype)
    masked = per_token * m
    if mode == "token-mean":
        denom = m.sum() if num_tokens is None else num_tokens
        if isinstance(denom, Tensor):
            return masked.sum() / denom.clamp(min=1.0)
        return masked.sum() / max(float(denom), 1.0)
    seqs = per_token.shape[0] if num_seqs is None else num_seqs
    if mode == "seq-mean-token-mean":
        return (masked.sum(-1) / m.sum(-1).clamp(min=1.0)).sum() / seqs
    length = per_token.shape[1] if max_len is None else max_len
    return masked.sum() / (length * seqs)


def truncated_importance_weights(old_logps: Tensor, sampler_logps: Tensor, cap: float) -> Tensor:
    """Truncated importance sampling (TIS; Yao et al. 2025, "Your efficient RL framework
    secretly brings you off-policy RL training"): the tokens were drawn by a sampler (vLLM)
    whose probabilities differ slightly from the trainer's π_old, so each token's policy-gradient
    term is reweighted by ``w_t = min(π_old(t) / π_sampler(t), cap) = min(exp(log π_old −
    log π_sampler), cap)``, detached; the cap bounds the variance (TRL's default: 3)."""
    return torch.exp(old_logps - sampler_logps).clamp(max=cap).detach()


def grpo_loss(
    logps: Tensor,
    old_logps: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    ref_logps: Tensor | None = None,
    beta: float = 0.0,
    kl_estimator: KLEstimator = "k3",
    entropy: Tensor | None = None,
    entropy_coef: float = 0.0,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    ratio_level: RatioLevel = "token",
    dual_clip: float | None = None,
    agg_mode: AggMode = "token-mean",
    num_tokens: float | Tensor | None = None,
    num_seqs: float | Tensor | None = None,
    max_len: int | None = None,
    token_weights: Tensor | None = None,
    token_penalty: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The GRPO-family loss of one micro-batch.

    ``loss = aggregate(policy_loss + β·kl_penalty − entropy_coef·entropy)`` per token, with
    :func:`policy_loss`, :func:`kl_penalty` and :func:`aggregate_loss` (see those for the
    formulas and papers). The KL term is per token and added inside the aggregation, as in
    DeepSeekMath (arXiv:2402.03300, Eq. 3) and TRL. The entropy bonus (Williams & Peng 1991;
    A3C, arXiv:1602.01783) follows the same aggregation. TRL instead always adds it as a token
    mean of the micro-batch, so the two agree for ``"token-mean"`` within one micro-batch.

    Args:
        logps, old_logps, advantages, mask: as in :func:`policy_loss`.
        ref_logps: ``[B, T]`` log π_ref; required when ``beta ≠ 0``, logged when given.
        beta: KL coefficient β ≥ 0 (DeepSeekMath: 0.04; DAPO, GSPO, Dr.GRPO: 0).
        kl_estimator: ``"k1"``, ``"k2"`` or ``"k3"``.
        entropy: ``[B, T]`` per-token entropy (:func:`entropy_from_logits`); with grad when
            ``entropy_coef ≠ 0``, logged when given.
        entropy_coef: coefficient of the entropy bonus (subtracted from the loss).
        clip_low, clip_high, ratio_level, dual_clip: as in :func:`policy_loss`.
        agg_mode, num_tokens, num_seqs, max_len: as in :func:`aggregate_loss`.
        token_weights: ``[B, T]`` detached weights of the policy term per token (the KL and
            entropy terms are not weighted), e.g. :func:`truncated_importance_weights`.
        token_penalty: ``[B, T]`` a term added to each token's loss (with grad) and aggregated
            like the others, e.g. ``λ_D`` × :func:`full_reverse_kl` to a teacher.

    Returns:
        ``(loss, metrics)``: the scalar loss, and floats: ``kl`` (when ``ref_logps`` is given)
        and ``entropy`` (when ``entropy`` is given) as masked token means of this micro-batch,
        plus the stats of :func:`policy_loss`.
    """
    if beta < 0:
        raise ValueError(f"beta={beta} must be ≥ 0")
    if beta != 0 and ref_logps is None:
        raise ValueError("beta ≠ 0 needs ref_logps (the reference model's log-probs)")
    if entropy_coef != 0 and entropy is None:
        raise ValueError("entropy_coef ≠ 0 needs the per-token entropy")
    per_token, stats = policy_loss(
        logps,
        old_logps,
        advantages,
        mask,
        clip_low=clip_low,
        clip_high=clip_high,
        ratio_level=ratio_level,
        dual_clip=dual_clip,
    )
    logged = dict(stats)
    if token_weights is not None:
        per_token = per_token * token_weights
        logged["tis_weight"] = _masked_mean(token_weights, mask)
    if ref_logps is not None:
        kl = kl_penalty(logps, ref_logps, kl_estimator)
        if beta != 0:
            per_token = per_token + beta * kl
        logged["kl"] = _masked_mean(kl.detach(), mask)
    if entropy is not None:
        if entropy_coef != 0:
            per_token = per_token - entropy_coef * entropy
        logged["entropy"] = _masked_mean(entropy.detach(), mask)
    if token_penalty is not None:
        per_token = per_token + token_penalty
    loss = aggregate_loss(
        per_token, mask, agg_mode, num_tokens=num_tokens, num_seqs=num_seqs, max_len=max_len
    )
    values = torch.stack([v.float() for v in logged.values()]).tolist()
    return loss, dict(zip(logged, values))
