"""mmrft.algorithms: hand-computed values, gradient accumulation, and parity with TRL's loss.

The TRL parity tests run TRL's own ``GRPOTrainer._compute_loss`` on a bare trainer object
(``GRPOTrainer.__new__``, only the attributes the method reads) whose
``_get_per_token_logps_and_entropies`` returns our tensors, so both libraries see the same
log-probs, old and reference log-probs, advantages and mask; losses and gradients w.r.t. the
log-probs must agree.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch
from torch.testing import assert_close

from mmrft.algorithms import (
    LOSS_PRESETS,
    aggregate_loss,
    entropy_from_logits,
    filter_zero_variance_groups,
    group_advantages,
    group_stats,
    grpo_loss,
    kl_penalty,
    overlong_penalty,
    policy_loss,
    selective_log_softmax,
    temporal_contrast_bonus,
    temporal_contrast_decided,
    truncated_importance_weights,
)

# --------------------------------------------------------------------------- log-probs


def test_selective_log_softmax_matches_log_softmax_and_its_gradient():
    torch.manual_seed(0)
    logits = torch.randn(3, 4, 11, requires_grad=True)
    ids = torch.randint(0, 11, (3, 4))
    ours = selective_log_softmax(logits, ids)
    (g_ours,) = torch.autograd.grad(ours.sum(), logits)
    ref = torch.log_softmax(logits, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    (g_ref,) = torch.autograd.grad(ref.sum(), logits)
    assert_close(ours, ref)
    assert_close(g_ours, g_ref)


def test_selective_log_softmax_bf16_is_computed_in_float32():
    torch.manual_seed(0)
    logits = (torch.randn(2, 5, 50) * 4).to(torch.bfloat16)
    ids = torch.randint(0, 50, (2, 5))
    ours = selective_log_softmax(logits, ids)
    assert ours.dtype == torch.float32
    ref = torch.log_softmax(logits.float(), -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    assert_close(ours, ref)


def test_entropy_from_logits():
    # uniform over V = 8 tokens: H = log 8 = 2.0794; a near one-hot row: H ≈ 0
    logits = torch.zeros(1, 2, 8)
    logits[0, 1, 3] = 100.0
    assert_close(entropy_from_logits(logits), torch.tensor([[math.log(8), 0.0]]))
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 7)
    expected = torch.distributions.Categorical(logits=logits).entropy()
    assert_close(entropy_from_logits(logits), expected)


# --------------------------------------------------------------------------- advantages

# Two groups of G = 4: g1 = [1, 0, 0, 0] (mean 0.25, unbiased std 0.5),
# g2 = [1, 1, 0, 0] (mean 0.5, unbiased std sqrt(1/3) = 0.57735).
REWARDS = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0])


def test_grpo_advantage():
    # (r − μ_g)/σ_g: g1: 0.75/0.5 = 1.5, −0.25/0.5 = −0.5; g2: ±0.5/0.57735 = ±0.866025
    expected = torch.tensor([1.5, -0.5, -0.5, -0.5, 0.866025, 0.866025, -0.866025, -0.866025])
    assert_close(group_advantages(REWARDS, 4, "grpo", eps=0.0), expected)
    # the default eps = 1e-4 joins the std: 0.75 / 0.5001 = 1.49970
    assert_close(group_advantages(REWARDS, 4)[0], torch.tensor(1.4997000))


def test_dr_grpo_advantage():
    # r − μ_g
    expected = torch.tensor([0.75, -0.25, -0.25, -0.25, 0.5, 0.5, -0.5, -0.5])
    assert_close(group_advantages(REWARDS, 4, "dr_grpo"), expected)


def test_rloo_advantage():
    # r_i − mean of the other three: g1: 1 − 0 = 1, 0 − 1/3; g2: 1 − 1/3 = 2/3, 0 − 2/3
    third = 1 / 3
    expected = torch.tensor(
        [1.0, -third, -third, -third, 2 * third, 2 * third, -2 * third, -2 * third]
    )
    assert_close(group_advantages(REWARDS, 4, "rloo"), expected)


def test_reinforce_pp_advantage():
    # a = r − μ_g = [.75, −.25, −.25, −.25, .5, .5, −.5, −.5]: batch mean 0, unbiased batch
    # std sqrt((.5625 + 3·.0625 + 4·.25)/7) = sqrt(0.25) = 0.5, so A = 2a
    expected = torch.tensor([1.5, -0.5, -0.5, -0.5, 1.0, 1.0, -1.0, -1.0])
    assert_close(group_advantages(REWARDS, 4, "reinforce_pp", eps=0.0), expected)


def test_scale_override():
    # "batch": (r − μ_g) / std(all rewards); std of [1,0,0,0,1,1,0,0] (mean 3/8) is
    # sqrt((3·(5/8)² + 5·(3/8)²)/7) = sqrt(120/448) = 0.517549
    centred = torch.tensor([0.75, -0.25, -0.25, -0.25, 0.5, 0.5, -0.5, -0.5])
    assert_close(group_advantages(REWARDS, 4, "grpo", eps=0.0, scale="batch"), centred / 0.517549)
    assert_close(group_advantages(REWARDS, 4, "grpo", scale="none"), centred)
    assert_close(
        group_advantages(REWARDS, 4, "dr_grpo", eps=0.0, scale="group"),
        group_advantages(REWARDS, 4, "grpo", eps=0.0),
    )
    assert_close(group_advantages(REWARDS, 4, "reinforce_pp", scale="none"), centred)


def test_constant_group_has_zero_advantage_in_every_mode():
    rewards = torch.tensor([0.5, 0.5, 0.5, 1.0, 0.0, 1.0])
    for mode in ("grpo", "dr_grpo", "rloo", "reinforce_pp"):
        assert_close(group_advantages(rewards, 3, mode)[:3], torch.zeros(3))


def test_advantage_input_errors():
    with pytest.raises(ValueError, match="groups of 3"):
        group_advantages(torch.zeros(8), 3)
    with pytest.raises(ValueError, match="≥ 2"):
        group_advantages(torch.zeros(4), 1)
    with pytest.raises(ValueError, match="mode='grop'"):
        group_advantages(torch.zeros(4), 2, "grop")  # type: ignore[arg-type]


def test_group_stats_and_dynamic_sampling_filter():
    # groups [1,1,1] (constant), [0,1,0] (std sqrt(1/3) = 0.57735), [0,0,0] (constant)
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    stats = group_stats(rewards, 3)
    assert stats["frac_zero_std"] == pytest.approx(2 / 3)
    assert stats["reward_mean"] == pytest.approx(4 / 9)
    assert stats["group_std_mean"] == pytest.approx(math.sqrt(1 / 3) / 3, rel=1e-6)
    assert filter_zero_variance_groups(rewards, 3).tolist() == [False, True, False]


def test_overlong_penalty():
    # L = 100, C = 20: soft zone (80, 100]; 90 → (80 − 90)/20 = −0.5; beyond 100 → −1
    lengths = torch.tensor([50, 80, 90, 100, 120])
    assert_close(overlong_penalty(lengths, 100, 20), torch.tensor([0.0, 0.0, -0.5, -1.0, -1.0]))
    assert_close(overlong_penalty(lengths, 100, 20, 0.5), torch.tensor([0, 0, -0.25, -0.5, -0.5]))
    assert_close(overlong_penalty(lengths, 100, 0), torch.tensor([0.0, 0.0, 0.0, 0.0, -1.0]))


def test_temporal_contrast_bonus_hand_computed():
    """Video-R1's T-GRPO: +α to the correct ordered completions when p ≥ μ·p̃ (α 0.3, μ 0.8)."""
    ordered = torch.tensor(
        [
            [1.0, 0.0, 1.0, 1.0],  # p 0.75 < 0.8·1.0: no bonus
            [1.0, 0.0, 0.0, 0.0],  # p 0.25 ≥ 0.8·0: bonus to the one correct completion
            [1.0, 1.0, 0.0, 0.0],  # p 0.5 = 0.8·0.625: a tie grants the bonus
            [0.0, 0.0, 0.0, 0.0],  # p 0 ≥ 0.8·0 holds, but nothing is correct
            [0.05, 0.5, 1.0, 0.0],  # graded: p 0.3875 ≥ 0; correct = score > 0.1
        ]
    )
    shuffled = torch.tensor([[1.0, 1.0], [0.0, 0.0], [1.0, 0.25], [0.0, 0.0], [0.0, 0.0]])

    def bonus_at(value: float, cells: list[tuple[int, int]]) -> torch.Tensor:
        """The expected bonuses: ``value`` at each (prompt, completion) cell, 0 elsewhere."""
        out = torch.zeros_like(ordered)
        for row, col in cells:
            out[row, col] = value
        return out.flatten()

    expected = bonus_at(0.3, [(1, 0), (2, 0), (2, 1), (4, 1), (4, 2)])
    assert_close(temporal_contrast_bonus(ordered, shuffled), expected)
    # μ = 0.5, α = 1: row 0 now holds (0.75 ≥ 0.5); τ = 0.6 leaves row 4's 0.5 incorrect
    expected = bonus_at(1.0, [(0, 0), (0, 2), (0, 3), (1, 0), (2, 0), (2, 1), (4, 2)])
    got = temporal_contrast_bonus(ordered, shuffled, ratio=0.5, bonus=1.0, correct_above=0.6)
    assert_close(got, expected)
    # G' ≠ G and no prompts at all
    assert_close(
        temporal_contrast_bonus(torch.tensor([[1.0, 0.0]]), torch.tensor([[1.0, 1.0, 0.0, 0.0]])),
        torch.tensor([0.3, 0.0]),  # 0.5 ≥ 0.8·0.5
    )
    assert temporal_contrast_bonus(torch.zeros(0, 4), torch.zeros(0, 2)).shape == (0,)
    with pytest.raises(ValueError, match="ordered"):
        temporal_contrast_bonus(torch.zeros(2, 4), torch.zeros(3, 2))
    with pytest.raises(ValueError, match="ratio"):
        temporal_contrast_bonus(torch.zeros(1, 4), torch.zeros(1, 2), ratio=-1.0)
    with pytest.raises(ValueError, match="bonus"):
        temporal_contrast_bonus(torch.zeros(1, 4), torch.zeros(1, 2), bonus=float("nan"))


def test_temporal_contrast_decided_rows_ignore_the_shuffled_scores():
    ordered = torch.tensor(
        [
            [0.0, 0.0, 0.0, 0.0, 0.0],  # nothing correct: no bonus whatever p̃
            [1.0, 1.0, 1.0, 1.0, 1.0],  # p 1 ≥ 0.8·1: granted whatever p̃
            [1.0, 1.0, 1.0, 1.0, 0.0],  # p 0.8 = 0.8·1: still granted (tie)
            [1.0, 1.0, 1.0, 0.0, 0.0],  # p 0.6: depends on p̃
            [0.05, 0.0, 0.0, 0.0, 0.0],  # below τ = 0.1: nothing correct
        ]
    )
    assert temporal_contrast_decided(ordered).tolist() == [True, True, True, False, True]
    assert temporal_contrast_decided(ordered, ratio=0.9).tolist() == [
        True,
        True,
        False,
        False,
        True,
    ]
    assert temporal_contrast_decided(ordered, high=2.0).tolist() == [
        True,
        False,
        False,
        False,
        True,
    ]
    # on decided rows the bonus is the same for every shuffled outcome in [0, 1]
    generator = torch.Generator().manual_seed(0)
    for _ in range(50):
        ordered = torch.randint(0, 2, (6, 4), generator=generator).float()
        shuffled = torch.randint(0, 2, (6, 2), generator=generator).float()
        decided = temporal_contrast_decided(ordered)
        bonus = temporal_contrast_bonus(ordered, shuffled).view(6, 4)
        filled = temporal_contrast_bonus(ordered, torch.zeros(6, 2)).view(6, 4)
        assert_close(bonus[decided], filled[decided])


# --------------------------------------------------------------------------- KL


def test_kl_estimators():
    # π = 0.5, π_ref = 0.25: d = log(π_ref/π) = −log 2 = −0.693147
    logps = torch.tensor([[math.log(0.5), math.log(0.3)]])
    ref = torch.tensor([[math.log(0.25), math.log(0.3)]])
    ln2 = math.log(2)
    # k1 = −d = 0.693147; k2 = d²/2 = 0.240227; k3 = e^d − d − 1 = 0.5 + 0.693147 − 1 = 0.193147
    assert_close(kl_penalty(logps, ref, "k1"), torch.tensor([[ln2, 0.0]]))
    assert_close(kl_penalty(logps, ref, "k2"), torch.tensor([[0.5 * ln2**2, 0.0]]))
    assert_close(kl_penalty(logps, ref, "k3"), torch.tensor([[0.5 + ln2 - 1, 0.0]]))


# --------------------------------------------------------------------------- clipping


def test_token_level_clipping_by_hand():
    # five one-token completions, ε_low = 0.2, ε_high = 0.28 (clip range [0.8, 1.28]):
    #   ρ    A   −min(ρA, clip(ρ)A)             ∂ℓ/∂logp
    #  1.5  +1   −min(1.5, 1.28) = −1.28  high   0
    #  0.5  −1   −min(−.5, −.8)  =  0.8   low    0
    #  1.1  +1   −1.1                           −ρA = −1.1
    #  0.7  +1   −min(.7, .8)    = −0.7         −0.7 (moved against A: not clipped)
    #  1.5  −1   −min(−1.5, −1.28) = 1.5         1.5
    ratios = torch.tensor([1.5, 0.5, 1.1, 0.7, 1.5])
    adv = torch.tensor([1.0, -1.0, 1.0, 1.0, -1.0])
    old = torch.full((5, 1), -1.0)
    logps = (old + ratios.log().unsqueeze(1)).requires_grad_(True)
    mask = torch.ones(5, 1)
    loss, stats = policy_loss(logps, old, adv, mask, clip_low=0.2, clip_high=0.28)
    assert_close(loss.squeeze(1), torch.tensor([-1.28, 0.8, -1.1, -0.7, 1.5]))
    (grad,) = torch.autograd.grad(loss.sum(), logps)
    assert_close(grad.squeeze(1), torch.tensor([0.0, 0.0, -1.1, -0.7, 1.5]))
    assert stats["clip_frac/low"].item() == pytest.approx(0.2)
    assert stats["clip_frac/high"].item() == pytest.approx(0.2)
    assert stats["clip_frac/total"].item() == pytest.approx(0.4)
    assert stats["ratio/mean"].item() == pytest.approx(1.06)  # 5.3 / 5

    # dual clip c = 1.4: the last row (ρ = 1.5 > c, A < 0) is capped at −cA = 1.4, no gradient
    loss, stats = policy_loss(logps, old, adv, mask, clip_low=0.2, clip_high=0.28, dual_clip=1.4)
    assert_close(loss.squeeze(1), torch.tensor([-1.28, 0.8, -1.1, -0.7, 1.4]))
    (grad,) = torch.autograd.grad(loss.sum(), logps)
    assert_close(grad.squeeze(1), torch.tensor([0.0, 0.0, -1.1, -0.7, 0.0]))
    assert stats["clip_frac/dual"].item() == pytest.approx(0.2)


def test_sequence_level_ratio_by_hand():
    # seq 0: token log-ratios [0.2, 0.0] (third position padding), A = +1:
    #   s = exp(0.1) = 1.105171 inside [0.8, 1.2] → ℓ = −1.105171 on each token,
    #   ∂ℓ_t/∂logp_t = −s (straight-through); seq-mean-token-mean: −s/2/2 = −0.276293 per token
    # seq 1: log-ratios [0.5, 0.5, 0.5], A = +1: s = e^0.5 = 1.6487 → clipped to 1.2, no gradient
    old = torch.zeros(2, 3)
    logps = torch.tensor([[0.2, 0.0, 0.0], [0.5, 0.5, 0.5]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    adv = torch.tensor([1.0, 1.0])
    s = math.exp(0.1)
    per_token, stats = policy_loss(logps, old, adv, mask, ratio_level="sequence")
    assert_close(per_token, torch.tensor([[-s, -s, -s], [-1.2, -1.2, -1.2]]))
    loss = aggregate_loss(per_token, mask, "seq-mean-token-mean")
    assert loss.item() == pytest.approx((-s - 1.2) / 2)
    (grad,) = torch.autograd.grad(loss, logps)
    assert_close(grad, torch.tensor([[-s / 4, -s / 4, 0.0], [0.0, 0.0, 0.0]]))
    # the same as differentiating GSPO's sequence objective −mean_i min(s_i A, clip(s_i) A)
    assert stats["clip_frac/high"].item() == pytest.approx(0.5)  # one sequence of two
    assert stats["ratio/mean"].item() == pytest.approx((s + math.exp(0.5)) / 2)


# --------------------------------------------------------------------------- aggregation


def test_aggregation_modes_by_hand():
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    # token-mean: (1 + 2 + 3 + 4) / 4 tokens = 2.5
    assert aggregate_loss(per_token, mask, "token-mean").item() == pytest.approx(2.5)
    assert aggregate_loss(per_token, mask, num_tokens=8.0).item() == pytest.approx(1.25)
    # seq-mean-token-mean: (mean(1,2,3) + mean(4)) / 2 = (2 + 4) / 2 = 3; over 4 seqs: 6/4
    assert aggregate_loss(per_token, mask, "seq-mean-token-mean").item() == pytest.approx(3.0)
    assert aggregate_loss(
        per_token, mask, "seq-mean-token-mean", num_seqs=4
    ).item() == pytest.approx(1.5)
    # seq-mean-token-sum-norm: 10 / (max_len · num_seqs) = 10 / (5 · 2) = 1; default T = 3: 10/6
    mode = "seq-mean-token-sum-norm"
    assert aggregate_loss(per_token, mask, mode, max_len=5).item() == pytest.approx(1.0)
    assert aggregate_loss(per_token, mask, mode).item() == pytest.approx(10 / 6)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_gradient_accumulation_equals_full_batch(mode):
    torch.manual_seed(0)
    lengths = torch.tensor([5, 2, 7, 1, 3])
    mask = (torch.arange(7) < lengths.unsqueeze(1)).float()
    per_token = torch.randn(5, 7, requires_grad=True)
    max_len = 8

    full = aggregate_loss(per_token, mask, mode, max_len=max_len)
    (g_full,) = torch.autograd.grad(full, per_token)

    # two micro-batches, each padded only to its own longest completion
    parts = [(slice(0, 2), 5), (slice(2, 5), 7)]
    total = sum(
        aggregate_loss(
            per_token[rows, :width],
            mask[rows, :width],
            mode,
            num_tokens=mask.sum().item(),
            num_seqs=5.0,
            max_len=max_len,
        )
        for rows, width in parts
    )
    (g_accum,) = torch.autograd.grad(total, per_token)
    assert_close(total, full)
    assert_close(g_accum, g_full)

    # per-micro-batch denominators averaged over the 2 steps are not the full-batch gradient
    if mode == "token-mean":
        local = sum(
            aggregate_loss(per_token[rows, :width], mask[rows, :width], mode) / 2
            for rows, width in parts
        )
        (g_local,) = torch.autograd.grad(local, per_token)
        assert not torch.allclose(g_local, g_full)


def test_grpo_loss_adds_kl_and_entropy_per_token():
    torch.manual_seed(0)
    logps = -torch.rand(2, 3)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    ref = logps + 0.1 * torch.randn(2, 3)
    entropy = torch.rand(2, 3)
    adv = torch.tensor([0.5, -1.0])
    loss, metrics = grpo_loss(
        logps, logps, adv, mask, ref_logps=ref, beta=0.1, entropy=entropy, entropy_coef=0.01
    )
    # at ρ = 1 the surrogate is −A on every token
    per_token = -adv.unsqueeze(1) + 0.1 * kl_penalty(logps, ref) - 0.01 * entropy
    assert_close(loss, aggregate_loss(per_token, mask))
    assert metrics["kl"] == pytest.approx(
        ((kl_penalty(logps, ref) * mask).sum() / mask.sum()).item()
    )
    assert metrics["entropy"] == pytest.approx(((entropy * mask).sum() / mask.sum()).item())
    assert metrics["clip_frac/total"] == 0.0
    assert all(isinstance(v, float) for v in metrics.values())
    with pytest.raises(ValueError, match="ref_logps"):
        grpo_loss(logps, logps, adv, mask, beta=0.1)
    with pytest.raises(ValueError, match="dual_clip"):
        grpo_loss(logps, logps, adv, mask, dual_clip=0.5)


def test_presets_use_config_field_names():
    fields = {"agg_mode", "advantage", "clip_low", "clip_high", "ratio_level"}
    assert set(LOSS_PRESETS) == {"grpo", "dr_grpo", "dapo", "bnpo", "gspo"}
    for preset in LOSS_PRESETS.values():
        assert set(preset) == fields


# --------------------------------------------------------------------------- TRL parity


@pytest.fixture(scope="module")
def trl_grpo():
    pytest.importorskip("trl", minversion="1.16")
    from trl.trainer import grpo_trainer

    return grpo_trainer


@dataclass
class Batch:
    logps: torch.Tensor
    old: torch.Tensor
    ref: torch.Tensor
    adv: torch.Tensor
    mask: torch.Tensor  # int64, as TRL builds completion_mask
    entropy: torch.Tensor


MAX_COMPLETION_LENGTH = 9


def make_batch(seed: int, lengths: tuple[int, ...] = (7, 3, 5, 1, 6, 4, 7, 2)) -> Batch:
    """Log-probs around old ones with spread 0.3, so ratios land on both sides of the clip."""
    g = torch.Generator().manual_seed(seed)
    b, t = len(lengths), max(lengths)
    mask = (torch.arange(t) < torch.tensor(lengths).unsqueeze(1)).long()
    old = -3 * torch.rand(b, t, generator=g) - 0.05
    logps = old + 0.3 * torch.randn(b, t, generator=g)
    ref = old + 0.2 * torch.randn(b, t, generator=g)
    adv = torch.randn(b, generator=g)
    entropy = 2 * torch.rand(b, t, generator=g)
    return Batch(logps, old, ref, adv, mask, entropy)


class OneProcess:
    """The accelerator surface `_compute_loss` touches, for a single process."""

    num_processes = 1
    sync_gradients = True

    def gather(self, x):
        return x

    def gather_for_metrics(self, x):
        return x

    def reduce(self, x, reduction="sum"):
        return x


def trl_loss(
    grpo_trainer,
    batch: Batch,
    *,
    loss_type: str,
    level: str,
    beta: float = 0.04,
    epsilon: float = 0.2,
    epsilon_high: float = 0.2,
    delta: float | None = None,
    entropy_coef: float = 0.0,
    grad_accum: int = 1,
    num_items_in_batch: float | None = None,
    importance_ratio: torch.Tensor | None = None,
):
    """TRL's own `_compute_loss` on our tensors: (loss, ∂loss/∂logps, ∂loss/∂entropy, metrics).
    ``importance_ratio``: TRL's vLLM importance-sampling correction (``token_truncate``).
    Defaults: β 0.04, ε 0.2 both sides."""
    logps = batch.logps.clone().requires_grad_(True)
    entropy = batch.entropy.clone().requires_grad_(True)
    trainer = grpo_trainer.GRPOTrainer.__new__(grpo_trainer.GRPOTrainer)
    attributes = {
        "args": SimpleNamespace(
            use_bias_correction_kl=False, delta=delta, steps_per_generation=grad_accum
        ),
        "loss_type": loss_type,
        "importance_sampling_level": level,
        "beta": beta,
        "epsilon_low": epsilon,
        "epsilon_high": epsilon_high,
        "top_entropy_quantile": 1.0,
        "off_policy_mask_threshold": None,
        "aux_loss_enabled": False,
        "use_vllm": importance_ratio is not None,
        "vllm_importance_sampling_correction": importance_ratio is not None,
        "vllm_importance_sampling_mode": "token_truncate",
        "model": SimpleNamespace(training=True),
        "current_gradient_accumulation_steps": grad_accum,
        "max_completion_length": MAX_COMPLETION_LENGTH,
        "accelerator": OneProcess(),
        "entropy_coef": entropy_coef,
        "use_adaptive_entropy": False,
        "_entropy_bonus_enabled": entropy_coef != 0.0,
        "_metrics": defaultdict(lambda: defaultdict(list)),
        "_get_per_token_logps_and_entropies": lambda *args, **kwargs: (logps, entropy, None),
    }
    for name, value in attributes.items():
        setattr(trainer, name, value)
    b, t = batch.mask.shape
    inputs = {
        "prompt_ids": torch.zeros(b, 1, dtype=torch.long),
        "prompt_mask": torch.ones(b, 1, dtype=torch.long),
        "completion_ids": torch.zeros(b, t, dtype=torch.long),
        "completion_mask": batch.mask,
        "advantages": batch.adv,
        "old_per_token_logps": batch.old,
        "ref_per_token_logps": batch.ref,
        "num_items_in_batch": torch.tensor(
            float(batch.mask.sum()) if num_items_in_batch is None else num_items_in_batch
        ),
    }
    if importance_ratio is not None:
        inputs["importance_sampling_ratio"] = importance_ratio
    loss = trainer._compute_loss(None, inputs)
    g_logps, g_entropy = torch.autograd.grad(loss, [logps, entropy], allow_unused=True)
    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    return loss.detach(), g_logps, g_entropy, metrics


def mmrft_loss(batch: Batch, *, beta: float, entropy_coef: float = 0.0, **kwargs):
    logps = batch.logps.clone().requires_grad_(True)
    entropy = batch.entropy.clone().requires_grad_(True)
    loss, metrics = grpo_loss(
        logps,
        batch.old,
        batch.adv,
        batch.mask,
        ref_logps=batch.ref if beta else None,
        beta=beta,
        entropy=entropy,
        entropy_coef=entropy_coef,
        max_len=MAX_COMPLETION_LENGTH,
        **kwargs,
    )
    g_logps, g_entropy = torch.autograd.grad(loss, [logps, entropy], allow_unused=True)
    return loss.detach(), g_logps, g_entropy, metrics


# mmrft preset → (TRL loss_type, TRL importance_sampling_level)
TRL_SETUP = {
    "grpo": ("grpo", "token"),
    "dr_grpo": ("dr_grpo", "token"),
    "dapo": ("dapo", "token"),
    "bnpo": ("bnpo", "token"),
    "gspo": ("grpo", "sequence"),
}


def assert_same_metrics(ours: dict[str, float], theirs: dict[str, float], beta: float) -> None:
    pairs = {
        "clip_frac/low": "clip_ratio/low_mean",
        "clip_frac/high": "clip_ratio/high_mean",
        "clip_frac/total": "clip_ratio/region_mean",
        "entropy": "entropy",
    }
    if beta:
        pairs["kl"] = "kl"
    for mine, trl_name in pairs.items():
        assert ours[mine] == pytest.approx(theirs[trl_name], abs=1e-6), mine


@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("preset", ["grpo", "dr_grpo", "dapo", "bnpo", "gspo"])
def test_trl_parity_presets(trl_grpo, preset, beta):
    p = LOSS_PRESETS[preset]
    loss_type, level = TRL_SETUP[preset]
    for clip_low, clip_high in {(p["clip_low"], p["clip_high"]), (0.1, 0.15)}:
        batch = make_batch(seed=1)
        theirs = trl_loss(
            trl_grpo,
            batch,
            loss_type=loss_type,
            level=level,
            beta=beta,
            epsilon=clip_low,
            epsilon_high=clip_high,
        )
        ours = mmrft_loss(
            batch,
            beta=beta,
            clip_low=clip_low,
            clip_high=clip_high,
            ratio_level=p["ratio_level"],
            agg_mode=p["agg_mode"],
        )
        assert_close(ours[0], theirs[0])
        assert_close(ours[1], theirs[1])
        assert_same_metrics(ours[3], theirs[3], beta)
        # not vacuous: some tokens (sequences) are clipped, some carry a gradient
        assert 0 < ours[3]["clip_frac/total"] < 1
        assert ours[1].abs().sum() > 0


def test_truncated_importance_weights_by_hand():
    old = torch.log(torch.tensor([[0.5, 0.2, 0.9]]))
    sampler = torch.log(torch.tensor([[0.25, 0.4, 0.1]]))
    w = truncated_importance_weights(old, sampler, cap=3.0)
    # π_old / π_sampler = 2, 0.5, 9 → 9 is truncated to the cap
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.5, 3.0]]))
    assert not w.requires_grad


@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_trl_parity_truncated_importance_sampling(trl_grpo, beta):
    """The per-token TIS weight multiplies the policy term only, as TRL's vLLM correction."""
    batch = make_batch(seed=5)
    g = torch.Generator().manual_seed(9)
    sampler = batch.old + 0.5 * torch.randn(batch.old.shape, generator=g)
    weights = truncated_importance_weights(batch.old, sampler, cap=2.0)
    assert (weights == 2.0).any() and (weights < 1.0).any()  # both sides of the correction
    theirs = trl_loss(
        trl_grpo, batch, loss_type="grpo", level="token", beta=beta, importance_ratio=weights
    )
    ours = mmrft_loss(batch, beta=beta, agg_mode="seq-mean-token-mean", token_weights=weights)
    assert_close(ours[0], theirs[0])
    assert_close(ours[1], theirs[1])
    plain = mmrft_loss(batch, beta=beta, agg_mode="seq-mean-token-mean")
    assert not torch.allclose(ours[1], plain[1])


@pytest.mark.parametrize("loss_type", ["dapo", "bnpo", "dr_grpo"])
def test_trl_parity_sequence_ratio_with_token_sum_aggregations(trl_grpo, loss_type):
    # TRL warns that these length-weight GSPO's sequences; the straight-through ratio matches it
    batch = make_batch(seed=2)
    theirs = trl_loss(trl_grpo, batch, loss_type=loss_type, level="sequence")
    agg_mode = LOSS_PRESETS[loss_type]["agg_mode"]
    ours = mmrft_loss(batch, beta=0.04, ratio_level="sequence", agg_mode=agg_mode)
    assert_close(ours[0], theirs[0])
    assert_close(ours[1], theirs[1])


def test_trl_parity_dual_clip_is_trl_delta(trl_grpo):
    batch = make_batch(seed=3)
    batch.adv[:4] = -batch.adv[:4].abs()
    batch.logps[:4, :2] = batch.old[:4, :2] + math.log(4.0)  # ρ = 4 > c = 3 under A < 0
    kwargs = {"loss_type": "grpo", "level": "token", "beta": 0.0, "epsilon": 0.2}
    theirs = trl_loss(trl_grpo, batch, **kwargs, epsilon_high=0.28, delta=3.0)
    ours = mmrft_loss(
        batch, beta=0.0, clip_high=0.28, agg_mode="seq-mean-token-mean", dual_clip=3.0
    )
    assert_close(ours[0], theirs[0])
    assert_close(ours[1], theirs[1])
    assert ours[3]["clip_frac/dual"] > 0
    plain = mmrft_loss(batch, beta=0.0, clip_high=0.28, agg_mode="seq-mean-token-mean")
    assert not torch.allclose(plain[1], ours[1])


@pytest.mark.parametrize("preset", ["dapo", "grpo", "dr_grpo"])
def test_trl_parity_gradient_accumulation(trl_grpo, preset):
    # two micro-batches of 4 completions, each padded to its own longest completion
    micro = [make_batch(seed=4, lengths=(7, 3, 5, 1)), make_batch(seed=5, lengths=(2, 6, 4, 2))]
    num_tokens = float(sum(b.mask.sum() for b in micro))
    p = LOSS_PRESETS[preset]
    loss_type, level = TRL_SETUP[preset]
    for batch in micro:
        theirs = trl_loss(
            trl_grpo,
            batch,
            loss_type=loss_type,
            level=level,
            grad_accum=2,
            num_items_in_batch=num_tokens,
        )
        ours = mmrft_loss(
            batch,
            beta=0.04,
            agg_mode=p["agg_mode"],
            num_tokens=num_tokens,
            num_seqs=8.0,
        )
        assert_close(ours[0], theirs[0])
        assert_close(ours[1], theirs[1])


@pytest.mark.parametrize("preset", ["dapo", "bnpo"])
def test_trl_parity_entropy_bonus_token_mean(trl_grpo, preset):
    # TRL adds its entropy bonus as a token mean of the micro-batch for every loss_type; with
    # token-mean aggregation (one micro-batch) that is exactly our per-token bonus
    batch = make_batch(seed=6)
    theirs = trl_loss(
        trl_grpo, batch, loss_type=preset, level="token", epsilon_high=0.28, entropy_coef=0.01
    )
    ours = mmrft_loss(batch, beta=0.04, clip_high=0.28, entropy_coef=0.01, agg_mode="token-mean")
    for mine, trl_value in zip(ours[:3], theirs[:3]):
        assert_close(mine, trl_value)


def test_trl_advantages_and_overlong_reward(trl_grpo):
    from trl.rewards import get_soft_overlong_punishment
    from trl.trainer.utils import nanstd

    g = torch.Generator().manual_seed(7)
    rewards = torch.rand(12, generator=g)
    grouped = rewards.view(-1, 4)
    centred = (grouped - grouped.mean(1, keepdim=True)).flatten()
    # TRL, scale_rewards="group": (r − mean_g) / (nanstd_g + 1e-4); "batch": nanstd of all rewards
    group_std = nanstd(grouped, dim=1).repeat_interleave(4)
    assert_close(group_advantages(rewards, 4), centred / (group_std + 1e-4))
    assert_close(group_advantages(rewards, 4, scale="batch"), centred / (nanstd(rewards) + 1e-4))

    lengths = [10, 79, 80, 81, 95, 100, 101, 150]
    trl_reward = get_soft_overlong_punishment(max_completion_len=100, soft_punish_cache=20)
    expected = torch.tensor(trl_reward([[0] * n for n in lengths]))
    assert_close(overlong_penalty(torch.tensor(lengths), 100, 20), expected)
