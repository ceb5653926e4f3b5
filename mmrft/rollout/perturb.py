"""Rollout perturbation: NoisyRollout (Liu et al. 2025, arXiv:2504.13055).

A share of each GRPO group's completions is sampled on a *distorted copy* of the prompt's media,
and trained on like the others: the group's advantages are computed over the clean and the
perturbed completions together, and the policy update conditions every completion on the
**clean** prompt (the paper's "rollouts from clean and distorted images, update on the clean
image"). Only the rollout sees the distortion.

**Group assembly** (:func:`assemble_groups`). With ``G = rollout.group_size`` and
``m = perturbed_count(share, G)``, the engine samples ``G − m`` completions of every clean
conversation and ``m`` of every distorted one (two ``generate`` calls, each group-shared); one
group of ``G`` is then assembled per prompt, clean completions first, whose completions all
point (``prompt_index``) at the clean prepared prompt row. A distortion keeps the media sizes
(crop then resize back, frame drop repeats a frame, audio noise keeps the length), so the clean
row's media placeholder tokens fit; :func:`assemble_groups` checks that the distorted row has
the same token ids and media tensor shapes and raises :class:`PerturbError` otherwise. The
sampler log-probs of perturbed completions are under the noisy media, not the clean policy's:
an assembled round that contains perturbed completions reports no sampler log-probs
(``Rollouts.logprobs = None``), so ``algorithm.tis_cap`` has no effect on such steps and the
``rollout/logp_gap_*`` metrics are not logged for them.

**Distortions** (``rollout.perturb.kinds``), each of strength ``s ∈ [0, 1]`` where ``s = 0`` is
the identity (bit-exact: the operation is skipped):

========================  =======  ==========================================================
kind                      media    what ``s`` sets
========================  =======  ==========================================================
``noise``                 image    x' = clip(x + 255·s·ε, 0, 255), ε ~ N(0, 1) per pixel and
                                   channel (uint8 pixels; NoisyRollout's distortion)
``blur``                  image    Gaussian blur, σ = s·max(H, W)/20 pixels, kernel 2⌈3σ⌉+1
``crop``                  image    a random crop of side fraction 1 − s/2 (position uniform),
                                   resized back to H×W (bilinear, antialiased)
``jitter``                image    brightness, contrast and saturation factors each uniform in
                                   [1 − s, 1 + s] (torchvision's colour adjustments)
``frame_drop``            video    each frame after the first is dropped with probability s,
                                   the previous kept frame shown in its place (T unchanged)
``frame_jitter``          video    frame i shows frame clip(i + δ_i, 0, T − 1), δ_i uniform in
                                   {−k … k}, k = round(s·(T − 1)/2)
``audio_noise``           audio    w' = clip(w + s·rms(w)·ε, −1, 1), ε ~ N(0, 1) per sample
========================  =======  ==========================================================

Image kinds also apply to every frame of a video (one set of parameters for the whole clip).
Several kinds apply in the order listed above. Every random draw is seeded by
:func:`prompt_seed` of ``(run seed, data position, step)`` and the media's rank in the prompt,
the mechanism T-GRPO's shuffled frames use (:func:`mmrft.rollout.collector.shuffle_seed`,
:func:`mmrft.data.video.map_media_parts`): an exact resume and any world size distort alike.

**Annealing** (:func:`strength_at`): ``s(t) = s_end + (s_0 − s_end)·(1 − λ(min(t/T, 1)))``
with ``T = rollout.perturb.anneal_steps`` and λ the schedule: ``constant`` λ = 0, ``linear``
λ(x) = x, ``cosine`` λ(x) = (1 − cos πx)/2, ``sigmoid`` (NoisyRollout's shape)
λ(x) = (σ(k(x − ½)) − σ(−k/2)) / (σ(k/2) − σ(−k/2)) with k = :data:`SIGMOID_SHARPNESS`, so
λ(0) = 0, λ(½) = ½, λ(1) = 1.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from mmrft.config import IMAGE_KINDS, VIDEO_KINDS
from mmrft.data.distort import distort_audio, distort_image, prompt_seed
from mmrft.data.video import PERTURB_KEY
from mmrft.runtime import distributed
from mmrft.typecheck import ConfigError

if TYPE_CHECKING:
    from mmrft.config import PerturbConfig
    from mmrft.rollout.base import Engine, Rollouts, Sampling

Conversation = list[dict[str, Any]]

"""Every distortion, in the order they apply."""

SCHEDULES = ("constant", "linear", "cosine", "sigmoid")
SIGMOID_SHARPNESS = 10.0
"""k of the ``sigmoid`` annealing schedule: λ(0.1) ≈ 0.011, λ(0.25) ≈ 0.070, λ(0.5) = 0.5 (a
slow start, the strength held near s₀ for the first fifth of the run)."""


class PerturbError(ConfigError):
    """A distorted prompt that does not fit the clean prompt's row (different tokens or media
    shapes: a distortion changed the media size), or a distortion the model cannot take: a
    setting of ``rollout.perturb`` that only shows on the data, printed as one line."""


# ---------------------------------------------------------------------------------------------
# Seeds and schedule


def perturbed_count(share: float, group_size: int) -> int:
    """m, the perturbed completions of a group of ``group_size``: 0 when ``share`` is 0, else
    round(share·G) clipped to [1, G − 1] (a group always keeps one clean completion)."""
    if share <= 0:
        return 0
    return min(group_size - 1, max(1, round(share * group_size)))


def strength_at(step: int, start: float, end: float, schedule: str, steps: int) -> float:
    """The distortion strength at ``step`` (module docstring: s(t) = s_end + (s_0 − s_end)·
    (1 − λ(min(t/T, 1)))); ``steps`` = T ≤ 0 means no annealing (s_0 throughout).

    >>> strength_at(50, 0.4, 0.0, "linear", 100), strength_at(50, 0.4, 0.0, "sigmoid", 100)
    (0.2, 0.2)
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown anneal schedule {schedule!r}; valid: {', '.join(SCHEDULES)}")
    if schedule == "constant" or steps <= 0:
        return float(start)
    x = min(max(step / steps, 0.0), 1.0)
    if schedule == "linear":
        lam = x
    elif schedule == "cosine":
        lam = (1 - math.cos(math.pi * x)) / 2
    else:
        k = SIGMOID_SHARPNESS

        def sig(z: float) -> float:
            return 1 / (1 + math.exp(-z))

        lam = (sig(k * (x - 0.5)) - sig(-k / 2)) / (sig(k / 2) - sig(-k / 2))
    return float(end + (start - end) * (1 - lam))


# ---------------------------------------------------------------------------------------------
# The distortions


def perturbed_conversation(
    conversation: Conversation,
    kinds: list[str],
    strength: float,
    seed: int,
    *,
    load_image: Callable[[Any], Any] | None = None,
    load_audio: Callable[[Any], np.ndarray] | None = None,
) -> tuple[Conversation, bool]:
    """A copy of ``conversation`` whose media the ``kinds`` distort, and whether any was
    touched. The k-th media part of a kind (in prompt order) uses the seed
    ``prompt_seed(seed, k, i)``, i = 0, 1, 2 for image, video, audio.
    Images are decoded (``load_image(source)``: an RGB PIL image at its stored size; default
    :func:`mmrft.models.qwen_vl.decoded_image`) and replaced by their distorted copy; videos
    get :data:`PERTURB_KEY` (applied after frame sampling, :func:`mmrft.data.video.fetch_video`);
    audio is decoded (``load_audio(source)``, a mono waveform at the model's rate) and replaced
    by its noisy copy. The input is not modified."""
    from mmrft.data.video import map_media_parts

    image_kinds = [k for k in kinds if k in IMAGE_KINDS]
    video_kinds = [k for k in kinds if k in IMAGE_KINDS + VIDEO_KINDS]
    touched = False

    def distort(part: dict[str, Any], kind: str, k: int) -> dict[str, Any]:
        nonlocal touched
        media_seed = prompt_seed(seed, k, ("image", "video", "audio").index(kind))
        if kind == "image" and image_kinds:
            source = part.get("image", part.get("image_url"))
            loader = load_image or _decoded_image
            image = distort_image(loader(source), image_kinds, strength, media_seed)
            touched = True
            rest = {key: v for key, v in part.items() if key not in ("image", "image_url")}
            return {**rest, "type": "image", "image": image}
        if kind == "video" and video_kinds:
            touched = True
            spec = {"kinds": video_kinds, "strength": float(strength), "seed": media_seed}
            return {**part, PERTURB_KEY: spec}
        if kind == "audio" and "audio_noise" in kinds:
            if load_audio is None:
                raise PerturbError("rollout.perturb.kinds: audio_noise needs an audio model family")
            source = part.get("audio", part.get("audio_url"))
            touched = True
            rest = {key: v for key, v in part.items() if key not in ("audio", "audio_url")}
            return {
                **rest,
                "type": "audio",
                "audio": distort_audio(load_audio(source), strength, media_seed),
            }
        return part

    return map_media_parts(conversation, distort), touched


def _decoded_image(source: Any) -> Any:
    from mmrft.models.qwen_vl import decoded_image

    return decoded_image(source, "perturb")


# ---------------------------------------------------------------------------------------------
# Group assembly


def _same_row(clean: dict[str, Any], noisy: dict[str, Any]) -> str | None:
    """Why the distorted prompt row does not fit the clean one (``None`` when it does): token
    ids and every tensor's shape must be equal."""
    if set(clean) != set(noisy):
        return f"keys {sorted(noisy)} instead of {sorted(clean)}"
    for key, value in clean.items():
        other = noisy[key]
        if isinstance(value, torch.Tensor) and isinstance(other, torch.Tensor):
            if value.shape != other.shape:
                return f"'{key}' of shape {tuple(other.shape)} instead of {tuple(value.shape)}"
            if key == "input_ids" and not torch.equal(value, other):
                return "different token ids (the media placeholders changed)"
    return None


def assemble_groups(
    clean: Rollouts,
    noisy: Rollouts,
    n_clean: int,
    n_noisy: int,
    touched: list[bool],
    sample_ids: list[str] | None = None,
) -> tuple[Rollouts, list[bool]]:
    """One group of ``n_clean + n_noisy`` completions per prompt from ``clean`` (``n_clean``
    per prompt) and ``noisy`` (``n_noisy`` per prompt, sampled on the distorted conversations),
    group-contiguous, clean completions first. Every completion of group g points at the clean
    prepared row of g (its first clean completion's row); the noisy rows are dropped after
    checking that they fit (same token ids and tensor shapes; :class:`PerturbError` naming the
    sample otherwise). Returns the rollouts and, per completion, whether it was sampled on
    distorted media (``touched[g]``: the prompt had media the kinds distort). Sampler log-probs
    are dropped when any completion is perturbed (they are under the noisy media)."""
    from mmrft.rollout.base import Rollouts

    groups = len(touched)
    if len(clean.texts) != groups * n_clean or len(noisy.texts) != groups * n_noisy:
        raise ValueError(
            f"expected {groups}×{n_clean} clean and {groups}×{n_noisy} perturbed completions, "
            f"got {len(clean.texts)} and {len(noisy.texts)}"
        )
    if clean.trajectories is not None or noisy.trajectories is not None:
        raise ValueError("rollout.perturb does not assemble tool trajectories")
    out = Rollouts(prompts=list(clean.prompts))
    perturbed: list[bool] = []
    clean_lp, noisy_lp = clean.logprobs, noisy.logprobs
    keep_logprobs = clean_lp is not None and noisy_lp is not None and not any(touched)
    logprobs: list[list[float]] = []
    for g in range(groups):
        row = clean.prompt_index[g * n_clean]
        for j in range(n_noisy):
            reason = _same_row(
                clean.prompts[row], noisy.prompts[noisy.prompt_index[g * n_noisy + j]]
            )
            if reason is not None:
                name = f"sample '{sample_ids[g]}'" if sample_ids else f"group {g}"
                raise PerturbError(
                    f"rollout.perturb: the distorted prompt of {name} does not fit its clean "
                    f"prompt row ({reason}); a distortion must keep every media size"
                )
        for source, n, offset, lp in (
            (clean, n_clean, g * n_clean, clean_lp),
            (noisy, n_noisy, g * n_noisy, noisy_lp),
        ):
            for i in range(offset, offset + n):
                out.prompt_index.append(clean.prompt_index[i] if source is clean else row)
                out.completion_ids.append(source.completion_ids[i])
                out.texts.append(source.texts[i])
                out.truncated.append(source.truncated[i])
                perturbed.append(source is noisy and touched[g])
                if keep_logprobs and lp is not None:
                    logprobs.append(lp[i])
    out.logprobs = logprobs if keep_logprobs else None
    out.seconds = clean.seconds + noisy.seconds
    for part in (clean.timings, noisy.timings):
        for key, value in part.items():
            out.timings[key] = out.timings.get(key, 0.0) + value
    return out, perturbed


# ---------------------------------------------------------------------------------------------
# The collector stage


@dataclass
class PerturbedRound:
    """What :meth:`NoisyRollout.generate` hands the collector: the assembled rollouts and, per
    completion, whether it was sampled on distorted media."""

    rollouts: Rollouts
    perturbed: list[bool]


class NoisyRollout:
    """The rollout perturbation stage of the collector (module docstring).

    Args:
        cfg: ``rollout.perturb``.
        group_size: G.
        seed: the run seed (``rollout.perturb.seed`` wins when set).
        steps: the run's steps (the annealing length when ``anneal_steps`` is 0).
        load_audio: source → mono waveform at the model's rate (audio families), or ``None``.
    """

    def __init__(
        self,
        cfg: PerturbConfig,
        group_size: int,
        seed: int,
        steps: int,
        load_audio: Callable[[Any], np.ndarray] | None = None,
    ) -> None:
        self.cfg = cfg
        self.group_size = group_size
        self.seed = cfg.seed if cfg.seed is not None else seed
        self.steps = cfg.anneal_steps or steps
        self.m = perturbed_count(cfg.share, group_size)
        self.load_audio = load_audio
        self.counts: Counter = Counter()
        self.strength = float(cfg.strength)

    def strength_at(self, step: int) -> float:
        """The distortion strength at ``step`` (:func:`strength_at` of the config)."""
        c = self.cfg
        return strength_at(step, c.strength, c.strength_end, c.anneal, self.steps)

    def generate(
        self,
        engine: Engine,
        conversations: list[Conversation],
        positions: list[int],
        sample_ids: list[str],
        step: int,
        sampling: Sampling,
    ) -> PerturbedRound:
        """``G − m`` completions of every clean conversation and ``m`` of its distorted copy
        (seeded by :func:`prompt_seed` of (seed, position, step)), assembled into groups of G
        (:func:`assemble_groups`)."""
        strength = self.strength_at(step)
        self.strength = strength
        noisy, touched = [], []
        for conversation, position in zip(conversations, positions):
            seed = prompt_seed(self.seed, position, step)
            copy, hit = perturbed_conversation(
                conversation, list(self.cfg.kinds), strength, seed, load_audio=self.load_audio
            )
            noisy.append(copy if hit else conversation)
            touched.append(hit)
        G, m = self.group_size, self.m
        clean_rollouts = engine.generate(conversations, G - m, sampling)
        noisy_rollouts = engine.generate(noisy, m, sampling)
        rollouts, perturbed = assemble_groups(
            clean_rollouts, noisy_rollouts, G - m, m, touched, sample_ids
        )
        return PerturbedRound(rollouts, perturbed)

    def observe(self, totals: list[float], perturbed: list[bool]) -> None:
        """Count one round's rewards (shaping included), split clean / perturbed."""
        for total, flag in zip(totals, perturbed):
            key = "perturbed" if flag else "clean"
            self.counts[f"{key}_sum"] += total
            self.counts[f"{key}_n"] += 1

    def metrics(self) -> dict[str, float]:
        """Over every rank's completions this step (one collective, identical on every rank):
        ``train/reward/clean`` and ``train/reward/perturbed`` (mean reward of the completions
        sampled on clean / distorted media, shaping included), ``train/perturbed_share`` (the
        share of completions sampled on distorted media) and ``train/perturb_strength`` (this step's s). Resets the counts."""
        counts, self.counts = self.counts, Counter()
        keys = ("clean_sum", "clean_n", "perturbed_sum", "perturbed_n")
        totals = [sum(c) for c in zip(*distributed.gather_objects([counts[k] for k in keys]))]
        total = dict(zip(keys, totals))
        n = total["clean_n"] + total["perturbed_n"]
        out = {
            "train/perturbed_share": total["perturbed_n"] / n if n else 0.0,
            "train/perturb_strength": self.strength,
        }
        for key in ("clean", "perturbed"):
            if total[f"{key}_n"]:
                out[f"train/reward/{key}"] = total[f"{key}_sum"] / total[f"{key}_n"]
        return out
