"""Seeded media distortions (NoisyRollout, Liu et al. 2025, arXiv:2504.13055): pixel noise, blur,
crop and colour jitter of images, frame drop and frame jitter of videos, noise on audio. Each
keeps the media's size (crop then resize back, a dropped frame repeats its neighbour, audio noise
keeps the length), so a distorted prompt has the clean one's placeholder tokens. The kinds are
named in :mod:`mmrft.config` (``rollout.perturb.kinds``); the perturbation stage
(:mod:`mmrft.rollout.perturb`) and the video reader (:func:`mmrft.data.video.fetch_video`) call
these.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from mmrft.config import IMAGE_KINDS


def prompt_seed(seed: int, position: int, *more: int) -> int:
    """A 32-bit seed from the run seed, a prompt's data position and any more integers (the
    step): ``SeedSequence([seed mod 2³², position, *more])``. With no ``more`` it is T-GRPO's
    frame-shuffle seed (:func:`mmrft.rollout.collector.shuffle_seed`)."""
    words = [seed & 0xFFFFFFFF, int(position), *(int(m) for m in more)]
    return int(np.random.SeedSequence(words).generate_state(1)[0])


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(seed))


def distort_pixels(
    pixels: torch.Tensor, kinds: list[str], strength: float, seed: int
) -> torch.Tensor:
    """``pixels`` (uint8 ``[C, H, W]`` or ``[T, C, H, W]``, C = 3) distorted by the image
    ``kinds`` at ``strength`` ∈ [0, 1] (module docstring), deterministic under ``seed``; a new
    tensor of the same shape and dtype (the input is not modified). Strength 0 returns an equal
    copy."""
    import torchvision.transforms.functional as TF

    if pixels.dtype != torch.uint8 or pixels.dim() not in (3, 4) or pixels.shape[-3] != 3:
        raise ValueError(f"expected uint8 [C=3, H, W] or [T, 3, H, W], got {tuple(pixels.shape)}")
    s = float(strength)
    out = pixels.clone()
    if s <= 0:
        return out
    H, W = int(out.shape[-2]), int(out.shape[-1])
    gen = _generator(seed)
    rng = np.random.default_rng(seed)
    for kind in (k for k in IMAGE_KINDS if k in kinds):
        if kind == "noise":
            noise = torch.randn(out.shape, generator=gen) * (255.0 * s)
            out = (out.float() + noise).round().clamp(0, 255).to(torch.uint8)
        elif kind == "blur":
            sigma = s * max(H, W) / 20
            size = 2 * math.ceil(3 * sigma) + 1
            out = TF.gaussian_blur(out, [size, size], [sigma, sigma])
        elif kind == "crop":
            side = 1 - s / 2
            h, w = max(1, round(H * side)), max(1, round(W * side))
            top, left = int(rng.integers(0, H - h + 1)), int(rng.integers(0, W - w + 1))
            out = TF.resized_crop(out, top, left, h, w, [H, W], antialias=True)
        elif kind == "jitter":
            b, c, sat = rng.uniform(max(0.0, 1 - s), 1 + s, size=3)
            out = TF.adjust_brightness(out, float(b))
            out = TF.adjust_contrast(out, float(c))
            out = TF.adjust_saturation(out, float(sat))
    return out


def frame_order(frames: int, kinds: list[str], strength: float, seed: int) -> list[int]:
    """Which frame each of the ``frames`` positions shows after the video ``kinds``
    (``frame_drop`` then ``frame_jitter``; module docstring); the identity at strength 0.

    >>> frame_order(4, ["frame_drop"], 0.0, 1)
    [0, 1, 2, 3]
    """
    order = list(range(frames))
    s = float(strength)
    if s <= 0 or frames < 2:
        return order
    rng = np.random.default_rng(seed)
    if "frame_drop" in kinds:
        dropped = rng.random(frames) < s
        for i in range(1, frames):
            if dropped[i]:
                order[i] = order[i - 1]
    if "frame_jitter" in kinds:
        k = round(s * (frames - 1) / 2)
        shift = rng.integers(-k, k + 1, size=frames)
        order = [order[min(max(i + int(d), 0), frames - 1)] for i, d in zip(range(frames), shift)]
    return order


def distort_frames(
    frames: torch.Tensor, kinds: list[str], strength: float, seed: int
) -> torch.Tensor:
    """A video's frames (uint8 ``[T, 3, H, W]``) distorted: the video kinds re-order them
    (:func:`frame_order`), then the image kinds apply to every frame with one set of parameters
    (:func:`distort_pixels`). Same shape; the input (maybe the decode cache's) is not modified."""
    order = frame_order(int(frames.shape[0]), kinds, strength, seed)
    out = frames[torch.tensor(order, dtype=torch.long)]
    if any(k in kinds for k in IMAGE_KINDS):
        out = distort_pixels(out, kinds, strength, prompt_seed(seed, 1))
    return out


def distort_audio(waveform: np.ndarray, strength: float, seed: int) -> np.ndarray:
    """``audio_noise``: w' = clip(w + s·rms(w)·ε, −1, 1), ε ~ N(0, 1) per sample (float32, same
    length; a new array). Strength 0 returns an equal copy."""
    w = np.asarray(waveform, dtype=np.float32)
    if strength <= 0:
        return w.copy()
    rms = float(np.sqrt(np.mean(np.square(w, dtype=np.float64)))) if w.size else 0.0
    noise = np.random.default_rng(seed).standard_normal(w.shape) * (strength * rms)
    return np.clip(w + noise, -1.0, 1.0).astype(np.float32)


def distort_image(image: Any, kinds: list[str], strength: float, seed: int) -> Any:
    """A PIL image distorted by the image ``kinds`` (:func:`distort_pixels`): a new RGB PIL
    image of the same size."""
    import torchvision.transforms.functional as TF

    pixels = TF.pil_to_tensor(image.convert("RGB"))
    return TF.to_pil_image(distort_pixels(pixels, kinds, strength, seed))
