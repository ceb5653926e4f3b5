"""The body of one GRPO policy update: micro-batches → forward → policy loss + KL → backward →
step, read top to bottom in :func:`grpo_update`.

The loss, as this module computes it (:func:`mmrft.algorithms.grpo_loss` per micro-batch).
For completion ``i`` of the step with advantage ``A_i`` and token ``t`` of its mask ``m``
(the model's own tokens):

    ρ_{i,t} = exp(log π_θ(y_{i,t}) − log π_old(y_{i,t}))
        (``algorithm.ratio_level: sequence``: GSPO's length-normalised sequence ratio)
    s_{i,t} = −min(ρ_{i,t}·A_i, clip(ρ_{i,t}, 1 − ε_low, 1 + ε_high)·A_i)
        (with a teacher, on-policy distillation: A_i becomes the per-token
        A_{i,t} = λ_R·A_i + λ_D·d_{i,t}, d_{i,t} = −(log π_old − log π_teacher)(y_{i,t}),
        ``algorithm.reward_coef`` / ``distill_coef`` / ``distill_discount``)
        (``algorithm.dual_clip`` = c: min(s_{i,t}, −c·A_i) where A_i < 0)
    ℓ_{i,t} = w_{i,t}·s_{i,t}
              + β·KL_k(π_θ ‖ π_ref)_{i,t}   (``algorithm.kl_estimator``; only with ``kl_mode: loss``)
              − c_H·H(π_θ)_{i,t}            (``algorithm.entropy_coef``)
    w_{i,t} = min(exp(log π_old − log π_sampler), ``algorithm.tis_cap``) when the cap is set
        and the engine reports its log-probs, else 1

    L = Σ over micro-batches of aggregate(ℓ, m), ``algorithm.agg_mode``:
        token-mean               Σ_{i,t} ℓ_{i,t} m_{i,t} / N_tok
        seq-mean-token-mean      Σ_i (Σ_t ℓ_{i,t} m_{i,t} / |y_i|) / N_seq
        seq-mean-token-sum-norm  Σ_{i,t} ℓ_{i,t} m_{i,t} / (``rollout.max_new_tokens`` · N_seq)

``N_tok`` (the tokens of every completion not masked by
``algorithm.mask_truncated_completions``) and ``N_seq`` (every completion) are counted over the
whole step on every rank, so the gradients summed over micro-batches and ranks equal those of
one batch holding the step. π_old is π_θ detached when μ = ``algorithm.updates_per_batch`` is 1
(ρ = 1 at the update), and the log-probs stored before the first update when μ > 1. Each of
the μ updates backward-passes every micro-batch, then clips the gradient norm to
``optim.max_grad_norm``, steps the optimizer and the LR schedule. With ``kl_mode: reward`` the
KL enters the rewards instead, before the advantages (:func:`sequence_kl`).

What this update keeps of the papers and what it drops: one optimizer update per rollout batch
by default (μ = 1, so the old policy is the current one and the ratio is 1 at the update, as in
DeepSeekMath's GRPO as run by TRL / R1-V / VLM-R1); completions whose advantage is exactly 0
are not forwarded when they cannot contribute a gradient (β = 0 and no entropy bonus): their
loss term is exactly zero, and they still count in the token/sequence denominators, so the
update is identical and cheaper.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch

from mmrft.algorithms import (
    TokenStat,
    argmax_match,
    distill_advantages,
    entropy_from_logits,
    full_reverse_kl,
    grpo_loss,
    kl_penalty,
    token_entropy,
    truncated_importance_weights,
)
from mmrft.config import RunConfig
from mmrft.policy.group import packing, rollout_logps
from mmrft.policy.model import Policy
from mmrft.rollout.base import Rollouts, pad_like
from mmrft.rollout.collector import StepBatch
from mmrft.rollout.served_teacher import ServedTeacher, TeacherScores, padded_scores
from mmrft.runtime import distributed


def grpo_update(
    policy: Policy,
    reference: Policy | None,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    batch: StepBatch,
    advantages: torch.Tensor,
    cfg: RunConfig,
    step: int,
    teacher: Policy | ServedTeacher | None = None,
) -> dict[str, float]:
    """μ = ``updates_per_batch`` optimizer updates on one rollout batch.

    Each update runs every micro-batch forward/backward with the denominators of the whole
    batch, then clips and steps. With μ = 1 the old policy *is* the current one (ratio 1 at the
    update, detached log-probs); with μ > 1 the old log-probs are computed once before the first
    update and stored, so later updates see a real ratio and the clip acts. Completions with
    advantage 0 are skipped when they cannot contribute (β = 0, no entropy bonus): their loss
    term is exactly zero and they still count in the denominators. Sharded (``train.sharding``),
    a rank with fewer micro-batches than another adds passes with loss 0 (``_padding_passes``).

    With a ``teacher`` (on-policy distillation, λ_R = ``algorithm.reward_coef``, λ_D =
    ``algorithm.distill_coef``): ``distill_loss: sampled``: its log-probs of every sampled token
    are computed once per micro-batch before the updates, and the advantage is per token,
    ``λ_R·A_i + λ_D·d_{i,t}`` (:func:`mmrft.algorithms.distill_advantages` on π_old);
    ``full``: the teacher runs beside each micro-batch's forward and λ_D·KL(π_θ ‖ π_teacher) of
    every position (:func:`mmrft.algorithms.full_reverse_kl`) joins the loss, the advantage
    staying λ_R·A_i. A :class:`~mmrft.rollout.served_teacher.ServedTeacher` scores every
    completion the update uses in one round of requests before it (``sampled`` only).
    """
    algo = cfg.algorithm
    rollouts = batch.rollouts
    n = len(rollouts.completion_ids)
    # completions left out of the loss (algorithm.mask_truncated_completions)
    masked = {i for i in range(n) if algo.mask_truncated_completions and rollouts.truncated[i]}
    # step-wide denominators over every rank, so the summed gradients equal one big batch's
    num_seqs = distributed.sum_scalar(float(n))
    num_tokens = distributed.sum_scalar(
        float(sum(rollouts.loss_tokens(i) for i in range(n) if i not in masked))
    )
    if num_seqs == 0:
        return {"active_frac": 0.0}
    needs_all = (
        (algo.beta > 0 and algo.kl_mode == "loss") or algo.entropy_coef > 0 or teacher is not None
    )
    active = [i for i in range(n) if i not in masked and (needs_all or advantages[i].item() != 0.0)]
    chunks = list(micro_batches(active, cfg.train.micro_batch_size))
    padding = _padding_passes(policy, len(chunks))

    def forward(
        model: Policy, chunk: list[int], with_grad: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        with torch.set_grad_enabled(with_grad):
            return training_forward(model, rollouts, chunk, cfg, with_entropy=with_grad)

    clock = Clock(policy.device)
    stored_old: list[torch.Tensor | None] = [None] * len(chunks)
    stored_ref: list[torch.Tensor | None] = [None] * len(chunks)
    for k, chunk in enumerate(chunks):
        if algo.updates_per_batch > 1:
            stored_old[k] = forward(policy, chunk, with_grad=False)[0]
        if reference is not None and algo.kl_mode == "loss":
            stored_ref[k] = forward(reference, chunk, with_grad=False)[0]
    for _ in range(padding):  # the same no-grad passes, in the same order, as other ranks
        with torch.no_grad():
            if algo.updates_per_batch > 1:
                _padding_pass(policy, rollouts, cfg)
            if reference is not None and algo.kl_mode == "loss":
                _padding_pass(reference, rollouts, cfg)
    clock.lap("no_grad_forward_s")
    full = teacher is not None and algo.distill_loss == "full"
    # distill_loss sampled: the teacher's log-probs of the sampled tokens and whether each is
    # its argmax, once per micro-batch (full: beside each micro-batch's forward, below)
    stored_teacher: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(chunks)
    served: dict[int, TeacherScores] | None = None  # a served teacher's, all at once
    if isinstance(teacher, ServedTeacher):
        served = teacher.score(rollouts, active)
        clock.lap("teacher_forward_s")
    elif teacher is not None and not full:
        for k, chunk in enumerate(chunks):
            stored_teacher[k] = teacher_forward(teacher, rollouts, chunk, cfg)[:2]
        for _ in range(padding):
            with torch.no_grad():
                _padding_pass(teacher, rollouts, cfg)
        clock.lap("teacher_forward_s")

    totals: Counter = Counter()
    weight = 0.0
    grad_norms = []
    gap = Counter()  # the sampler's log-probs against π_old's (engines that report them)
    distill = Counter()  # reverse KL to the teacher and argmax agreement, summed over tokens
    for update in range(algo.updates_per_batch):
        for k, chunk in enumerate(chunks):
            penalty = None  # distill_loss full: λ_D·KL(π_θ ‖ π_teacher) per position
            if full:
                with clock.part("teacher_forward_s"):
                    t_logps, agree, teacher_logp = teacher_forward(
                        teacher, rollouts, chunk, cfg, full=True
                    )
                stat = with_reverse_kl(teacher_logp)
                logps, mask, both = training_forward(policy, rollouts, chunk, cfg, token_stat=stat)
                entropy, kl = both[..., 0], both[..., 1]
                penalty = algo.distill_coef * kl
                advantage = algo.reward_coef * advantages[chunk].to(logps.device)
                if update == 0:
                    distill["kl_sum"] += float((kl.detach() * mask).sum())
            else:
                logps, mask, entropy = forward(policy, chunk, with_grad=True)
                advantage = advantages[chunk].to(logps.device)
            old = stored_old[k] if stored_old[k] is not None else logps.detach()
            if served is not None and stored_teacher[k] is None:  # once, not every update
                stored_teacher[k] = padded_scores(served, chunk, old)
            if stored_teacher[k] is not None:  # distill_loss sampled
                t_logps, agree = stored_teacher[k]
                d = distill_advantages(old, t_logps, mask, algo.distill_discount)
                advantage = algo.reward_coef * advantage.unsqueeze(1) + algo.distill_coef * d
                if update == 0:
                    distill["kl_sum"] += float(((old - t_logps) * mask).sum())
            if teacher is not None and update == 0:
                distill["agree"] += float((agree * mask).sum())
                distill["tokens"] += float(mask.sum())
            sampler = sampler_logps(rollouts, chunk, old)
            if sampler is not None and update == 0:
                diff = (old - sampler).abs() * mask
                gap["sum"] += float(diff.sum())
                gap["tokens"] += float(mask.sum())
                gap["max"] = max(gap["max"], float(diff.max()) if diff.numel() else 0.0)
            tis = (
                truncated_importance_weights(old, sampler, algo.tis_cap)
                if algo.tis_cap and sampler is not None
                else None
            )
            loss, stats = grpo_loss(
                logps,
                old,
                advantage,
                mask.float(),
                ref_logps=stored_ref[k],
                beta=algo.beta if algo.kl_mode == "loss" else 0.0,
                kl_estimator=algo.kl_estimator,
                entropy=entropy if algo.entropy_coef > 0 else entropy.detach(),
                entropy_coef=algo.entropy_coef,
                clip_low=algo.clip_low,
                clip_high=algo.clip_high,
                ratio_level=algo.ratio_level,
                dual_clip=algo.dual_clip,
                agg_mode=algo.agg_mode,
                num_tokens=num_tokens,
                num_seqs=num_seqs,
                max_len=cfg.rollout.max_new_tokens,
                token_weights=tis,
                token_penalty=penalty,
            )
            if not torch.isfinite(loss):
                ids_text = ", ".join(sorted({batch.samples[i].id for i in chunk}))
                raise FloatingPointError(f"non-finite loss at step {step} (samples: {ids_text})")
            distributed.backward(policy.model, loss)
            tokens = float(mask.sum().item())
            weight += tokens
            totals["loss"] += loss.item() / algo.updates_per_batch
            for key, value in stats.items():
                totals[key] += float(value) * tokens
        for _ in range(padding):
            if full:  # the teacher's pass beside each of the policy's
                with clock.part("teacher_forward_s"), torch.no_grad():
                    _padding_pass(teacher, rollouts, cfg)
            distributed.backward(policy.model, _padding_pass(policy, rollouts, cfg))
        clock.lap("forward_backward_s")

        def check_norm(norm: float) -> None:
            if not math.isfinite(norm):
                ids_text = ", ".join(sorted({s.id for s in batch.samples}))
                raise FloatingPointError(
                    f"non-finite gradient norm at step {step} (samples: {ids_text})"
                )

        grad_norms.append(
            distributed.clip_and_step(policy.model, optimizer, cfg.optim.max_grad_norm, check_norm)
        )
        scheduler.step()
        clock.lap("optimizer_s")
    out = {k: v / weight for k, v in totals.items() if k != "loss" and weight}
    out["loss"] = totals["loss"]
    out["grad_norm"] = float(np.mean(grad_norms)) if grad_norms else 0.0
    out["active_frac"] = len(active) / max(n, 1)
    if algo.mask_truncated_completions:
        out["masked_truncated_frac"] = len(masked) / max(n, 1)
    out.update({f"time/{k}": v for k, v in clock.totals.items()})
    if gap["tokens"]:
        out["rollout/logp_gap_mean"] = gap["sum"] / gap["tokens"]
        out["rollout/logp_gap_max"] = gap["max"]
    if teacher is not None:  # this rank's tokens; merged over ranks with the other metrics
        out["distill/reverse_kl"] = distill["kl_sum"] / max(distill["tokens"], 1.0)
        out["distill/teacher_agree"] = distill["agree"] / max(distill["tokens"], 1.0)
    return out


def training_forward(
    policy: Policy,
    rollouts: Rollouts,
    indices: list[int],
    cfg: RunConfig,
    with_entropy: bool = False,
    token_stat: TokenStat | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """log-probs, mask and entropy (``with_entropy``) or ``token_stat`` of the completions
    ``indices``: group-shared packed rows (``rollout.group_shared``, at most
    ``rollout.micro_group`` completions per prompt pass) or one sequence per completion."""
    return rollout_logps(
        policy,
        rollouts,
        indices,
        group_shared=cfg.rollout.group_shared,
        micro_group=cfg.rollout.micro_group,
        token_stat=token_stat or (token_entropy if with_entropy else None),
    )


def teacher_forward(
    teacher: Policy, rollouts: Rollouts, indices: list[int], cfg: RunConfig, full: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The teacher's training forward of the completions ``indices``, no gradient: its
    log-probs of the sampled tokens ``[n, C]``, 1.0 where a token is its argmax ``[n, C]``, and
    (``full``) its log-softmax ``[n, C, V]`` in the forward's own row order, which a policy's
    forward of the same completions shares (:func:`with_reverse_kl`)."""
    kept: dict[str, torch.Tensor] = {}

    def stat(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        if full:
            kept["logp"] = logits.log_softmax(-1)
        return argmax_match(logits, ids)

    with torch.no_grad():
        logps, _, agree = training_forward(teacher, rollouts, indices, cfg, token_stat=stat)
    return logps, agree, kept.get("logp")


def with_reverse_kl(teacher_logp: torch.Tensor) -> TokenStat:
    """A :data:`~mmrft.algorithms.TokenStat` of the policy's forward: ``[n, C, 2]``, the entropy
    and :func:`~mmrft.algorithms.full_reverse_kl` to ``teacher_logp`` (from
    :func:`teacher_forward` of the same completions) at every position."""

    def stat(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        kl = full_reverse_kl(logits, teacher_logp)
        return torch.stack([entropy_from_logits(logits), kl], dim=-1)

    return stat


def sampler_logps(rollouts: Rollouts, chunk: list[int], like: torch.Tensor) -> torch.Tensor | None:
    """The engine's log-probs of the completions ``chunk``, right-padded like ``like``
    (``[n, C]``), or None when the engine reports none."""
    if rollouts.logprobs is None:
        return None
    return pad_like([rollouts.logprobs[i] for i in chunk], like)


def sequence_kl(
    policy: Policy, reference: Policy, batch: StepBatch, cfg: RunConfig
) -> torch.Tensor:
    """Σ_t KL_t(π_θ ‖ π_ref) per completion with ``algorithm.kl_estimator``, no gradient."""
    rollouts, out = batch.rollouts, []
    chunks = list(
        micro_batches(list(range(len(rollouts.completion_ids))), cfg.train.micro_batch_size)
    )
    for chunk in chunks:
        with torch.no_grad():
            logps, mask, _ = training_forward(policy, rollouts, chunk, cfg, with_entropy=False)
            ref_logps, _, _ = training_forward(reference, rollouts, chunk, cfg, with_entropy=False)
        per_token = kl_penalty(logps, ref_logps, cfg.algorithm.kl_estimator) * mask
        out.append(per_token.sum(dim=1).cpu())
    for _ in range(_padding_passes(policy, len(chunks))):
        with torch.no_grad():
            _padding_pass(policy, rollouts, cfg)
            _padding_pass(reference, rollouts, cfg)
    return torch.cat(out) if out else torch.zeros(0)


def _padding_passes(policy: Policy, real: int) -> int:
    """Sharded: how many passes with loss 0 (``_padding_pass``) this rank adds to its ``real``
    micro-batches so that it runs as many forward/backward passes as the rank with the most:
    FSDP all-gathers in every forward and reduce-scatters in every backward, ZeRO reduces
    gradients in every backward, and each collective needs its partner on every rank.
    Unsharded: 0 (a collective-free count)."""
    if not distributed.passes_must_match(policy.model):
        return 0
    return int(distributed.max_scalar(float(real))) - real


def _padding_pass(policy: Policy, rollouts: Rollouts, cfg: RunConfig) -> torch.Tensor:
    """A forward whose loss is exactly 0 (so is its gradient). FSDP: two padding tokens, the
    cheapest pass. ZeRO needs the same modules on every rank (mmrft/runtime/zero.py), and a model
    packed by prefix (Qwen3.5) calls the model twice per pass (the prompts, then the
    completions from their cache), so FSDP's collectives pair up only with two calls there too:
    the rank's first completion again, with its media, × 0."""
    repeat = distributed.same_graph_required(policy.model) or packing(policy.model) == "prefix"
    if repeat and rollouts.completion_ids:
        logps, _, _ = training_forward(policy, rollouts, [0], cfg, with_entropy=False)
        return logps.sum() * 0.0
    return distributed.padding_loss(policy.model, policy.pad_token_id)


def micro_batches(indices: list[int], size: int) -> Iterator[list[int]]:
    for begin in range(0, len(indices), size):
        yield indices[begin : begin + size]


class Clock:
    """Seconds between laps, summed per name (CUDA work synchronised before each reading)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.totals: dict[str, float] = {}
        self.last = self._now()

    def _now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def lap(self, name: str) -> None:
        now = self._now()
        self.totals[name] = self.totals.get(name, 0.0) + now - self.last
        self.last = now

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        """Seconds of the block summed under ``name`` and left out of the next lap."""
        start = self._now()
        try:
            yield
        finally:
            spent = self._now() - start
            self.totals[name] = self.totals.get(name, 0.0) + spent
            self.last += spent
