"""Does the zoom benchmark need the zoom? A scripted reader at the base view and after a crop.

    python benchmarks/zoom_oracle.py                           # the bundled test splits
    python benchmarks/zoom_oracle.py --out runs/zoom_oracle.json
    python benchmarks/zoom_oracle.py --marks DIR/test.jsonl --video DIR/test.jsonl
    python benchmarks/zoom_oracle.py --audio DIR/test.jsonl    # another audio_zoom split

Two views of every test sample of ``assets/benchmarks/zoom_marks``, ``zoom_video`` and
``audio_zoom`` (``scripts/make_benchmarks.py``), each read by the same fixed rule
(:func:`read_colour` for pixels, :func:`read_pitch` for audio), no learning:

* ``zoom_marks``, per pixel budget (``min_pixels = max_pixels``, as the tiny recipes set it):
  **base**, the whole image as the model receives it (qwen-vl-utils ``fetch_image``: Qwen
  ``smart_resize``, sides multiples of 28 px, then Pillow's bicubic resize, the Qwen families'
  ``load_image``); **crop**, the square of twice the ring's size around ``meta.target_box``
  (:func:`crop_box`), cut from the original and resized to the same budget. The pixel read is
  the one under the box's centre, the dot's (not the box's most saturated pixel: the ring
  around the dot is as saturated as the dot).
* ``zoom_video``: **base**, the frames :func:`mmrft.data.video.read_video` samples at a budget
  (uniform over the clip, resized with its bicubic resize); **crop**, every frame inside
  ``meta.target_span`` given to ``read_video`` as a frame list at the stored rate (at most 8,
  the same pixel budget). The pixel read is the one under ``meta.target_box``'s centre, in the
  frame where it is most saturated.
* ``audio_zoom`` (waveforms as :func:`mmrft.data.audio.load_audio` returns them to the audio
  families, 16 kHz): **base**, the clip cut to its first ``meta.base_seconds`` (2.0 s: what a
  family keeps at ``model.audio.max_seconds: 2.0``, truncate policy), and as a second row the
  whole clip (``max_seconds`` 30, :class:`mmrft.data.audio.AudioBudget`'s default);
  **crop**, the interval ``[t − 1, t + 1]`` s around the time ``t`` the question states
  (``meta.asked_time``), cut from the whole clip: what a well-aimed ``audio_clip`` call
  returns. :func:`read_pitch` reads the view's spectral peak (the whole view, no window: the
  tone has its own fades); when under ``MIN_TONALITY`` of the view's energy lies within
  ±6 % of that peak (silence, or only the knocks, which have no pitch) it guesses the first
  option (``low``: chance on a balanced split), else it answers the class whose centre
  frequency (``AUDIO_ZOOM_PITCHES``) is nearest in log frequency. It is told nothing of where
  the tone is beyond the stated time.

The colour reader: saturation = max − min of the pixel's RGB (0–255); below
``MIN_SATURATION`` the pixel shows no colour and the reader guesses the first option (``red``:
a balanced split then scores 0.25, chance); otherwise it answers the option whose reference
colour has the nearest hue (largest cosine between the pixel's and the reference's RGB minus
their own gray mean). The reader is told where to look, which a model is not; it reads one
pixel by a fixed rule, so a subtler decoder of the blended base pixel (ring, gap and dot
mixed) might do somewhat better than chance there (the audio base view holds no tone at all,
so nothing can). Printed: a table of accuracies (base, crop) per view; ``--out`` writes the
same rows as JSON (``{"rows": [{"benchmark", "view", "n", "base", "crop"}],
"chance": 0.25}``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import logging
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "assets" / "benchmarks"
MIN_SATURATION = 32  # RGB max − min (0–255) below which a pixel shows no colour
IMAGE_BUDGETS = (
    (3136, "configs/demo.yaml"),
    (12544, "configs/learn/shapes_kind.yaml"),
    (50176, "configs/learn/shapes_grounding.yaml"),
)
"""Pixel budgets of the image views (pixels per image; min = max) and the config using each."""
CROP_SCALE = 2.0  # crop side / the target box's longer side


def load_generator() -> Any:
    """``scripts/make_benchmarks.py`` as a module (its ``COLOURS``, ``read_mp4``)."""
    if "make_benchmarks" not in sys.modules:
        path = REPO / "scripts" / "make_benchmarks.py"
        spec = importlib.util.spec_from_file_location("make_benchmarks", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["make_benchmarks"] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules["make_benchmarks"]


# -- the reader ------------------------------------------------------------------------------
def read_colour(pixels: np.ndarray, choices: list[str]) -> str:
    """The option a fixed rule reads from ``pixels`` (``(k, 3)`` RGB, 0–255, k ≥ 1): the most
    saturated pixel's nearest reference hue, or ``choices[0]`` (a guess) when its saturation
    is below ``MIN_SATURATION``."""
    rgb = np.asarray(pixels, dtype=float).reshape(-1, 3)
    saturation = rgb.max(axis=1) - rgb.min(axis=1)
    best = int(saturation.argmax())
    if saturation[best] < MIN_SATURATION:
        return choices[0]
    chroma = rgb[best] - rgb[best].mean()
    colours = load_generator().COLOURS

    def cosine(name: str) -> float:
        reference = np.array(colours[name], dtype=float)
        reference -= reference.mean()
        return float(chroma @ reference / np.linalg.norm(reference) / np.linalg.norm(chroma))

    return max(choices, key=cosine)


def pixel_under(view: np.ndarray, point: tuple[float, float], size: tuple[int, int]) -> np.ndarray:
    """The RGB pixel of ``view`` (``(h, w, 3)``, a resized copy of a ``size = (W, H)`` px
    region) that covers ``point = (x, y)`` px of that region."""
    h, w = view.shape[:2]
    x = min(int(point[0] * w / size[0]), w - 1)
    y = min(int(point[1] * h / size[1]), h - 1)
    return view[y, x]


def box_centre(box: list[int]) -> tuple[float, float]:
    """Centre ``(x, y)`` in pixels of ``[x1, y1, x2, y2]`` (``x2``/``y2`` exclusive)."""
    return (box[0] + box[2]) / 2, (box[1] + box[3]) / 2


# -- images ----------------------------------------------------------------------------------
def crop_box(
    box: list[int], image_size: tuple[int, int], scale: float = CROP_SCALE
) -> tuple[int, int, int, int]:
    """The square ``(left, top, right, bottom)`` px (exclusive ends) of side
    ``ceil(scale × the box's longer side)`` centred on ``box``, shifted to lie inside an
    ``image_size = (W, H)`` image (and cut to it when larger)."""
    width, height = image_size
    side = math.ceil(scale * max(box[2] - box[0], box[3] - box[1]))
    cx, cy = box_centre(box)
    left = min(max(round(cx - side / 2), 0), max(width - side, 0))
    top = min(max(round(cy - side / 2), 0), max(height - side, 0))
    return left, top, min(left + side, width), min(top + side, height)


def model_view(image: Image.Image, pixels: int) -> np.ndarray:
    """``image`` as a Qwen-VL model receives it at ``min_pixels = max_pixels = pixels``
    (qwen-vl-utils ``fetch_image``, 14-px patches merged 2×2: sides multiples of 28 px), as
    ``(h, w, 3)`` uint8."""
    from qwen_vl_utils.vision_process import fetch_image

    view = fetch_image({"image": image, "min_pixels": pixels, "max_pixels": pixels})
    return np.asarray(view.convert("RGB"))


def image_answers(record: dict, folder: Path, pixels: int) -> tuple[str, str]:
    """``(base answer, crop answer)`` of one ``zoom_marks`` record at a budget of ``pixels``."""
    meta, choices = record["meta"], record["meta"]["choices"]
    path = folder / record["messages"][0]["content"][0]["image"]
    with Image.open(path) as opened:
        image = opened.convert("RGB")
    box = meta["target_box"]
    base = pixel_under(model_view(image, pixels), box_centre(box), image.size)
    left, top, right, bottom = crop_box(box, image.size)
    crop = image.crop((left, top, right, bottom))
    cx, cy = box_centre(box)
    zoomed = pixel_under(model_view(crop, pixels), (cx - left, cy - top), crop.size)
    return read_colour(base, choices), read_colour(zoomed, choices)


def evaluate_marks(jsonl: Path, budgets: tuple[int, ...] | None = None) -> list[dict]:
    """One row per pixel budget of ``IMAGE_BUDGETS`` (or the given ``budgets``):
    ``{"benchmark", "view", "n", "base", "crop"}`` (accuracies)."""
    records = [json.loads(line) for line in jsonl.read_text(encoding="utf-8").splitlines()]
    rows = []
    for pixels, config in IMAGE_BUDGETS:
        if budgets is not None and pixels not in budgets:
            continue
        answers = [image_answers(r, jsonl.parent, pixels) for r in records]
        side = round(math.sqrt(pixels))
        rows.append(
            {
                "benchmark": "zoom_marks",
                "view": f"{pixels} px (~{side}x{side}, {config})",
                "n": len(records),
                "base": accuracy([a for a, _ in answers], records),
                "crop": accuracy([c for _, c in answers], records),
            }
        )
    return rows


def accuracy(answers: list[str], records: list[dict]) -> float:
    return sum(a == r["target"] for a, r in zip(answers, records)) / max(len(records), 1)


# -- videos ----------------------------------------------------------------------------------
VIDEO_VIEWS: dict[str, dict[str, Any]] = {
    "8 frames, 56x56 (the tiny Qwen2.5-VL's video recipes before the learner)": {
        "fps": 2.0,
        "min_frames": 8,
        "max_frames": 8,
        "min_pixels": 3136,
        "max_pixels": 3136,
    },
    "16 frames, 112x112 (VideoBudget default)": {},
    "32 frames, 56x56 (dense: 4x the tokens of 8)": {
        "fps": 4.0,
        "min_frames": 32,
        "max_frames": 32,
        "min_pixels": 3136,
        "max_pixels": 3136,
    },
}
"""Base views of the video: name → :class:`mmrft.data.video.VideoBudget` fields (the defaults for
the rest). The 112x112 frames are the clips' own size: the default budget keeps them."""


def video_answers(record: dict, folder: Path, budget: dict[str, Any]) -> tuple[str, str]:
    """``(base answer, crop answer)`` of one ``zoom_video`` record at a base ``budget``; the
    crop samples the span's frames (at most 8) at the base budget's pixels per frame."""
    from mmrft.data.video import VideoBudget, read_video

    meta, choices = record["meta"], record["meta"]["choices"]
    path = folder / record["messages"][0]["content"][0]["video"]
    size = tuple(meta["frame_size"])
    centre = box_centre(meta["target_box"])
    base_budget = VideoBudget(**budget)
    frames, _, _ = read_video(str(path), base_budget)
    base = [pixel_under(f.permute(1, 2, 0).numpy(), centre, size) for f in frames]
    decoded, times, fps = load_generator().read_mp4(path)
    start, end = meta["target_span"]
    inside = [
        Image.fromarray(frame) for frame, t in zip(decoded, times) if start - 1e-6 <= t < end - 1e-6
    ]
    span_budget = VideoBudget(
        fps=fps,
        min_frames=2,
        max_frames=8,
        min_pixels=base_budget.min_pixels,
        max_pixels=base_budget.max_pixels,
    )
    frames, _, _ = read_video(inside, span_budget, frames_fps=fps)
    crop = [pixel_under(f.permute(1, 2, 0).numpy(), centre, size) for f in frames]
    return read_colour(np.stack(base), choices), read_colour(np.stack(crop), choices)


def evaluate_video(jsonl: Path, views: tuple[str, ...] | None = None) -> list[dict]:
    """One row per base view in ``VIDEO_VIEWS`` (or the named ``views``):
    ``{"benchmark", "view", "n", "base", "crop"}`` (accuracies)."""
    records = [json.loads(line) for line in jsonl.read_text(encoding="utf-8").splitlines()]
    rows = []
    for name, budget in VIDEO_VIEWS.items():
        if views is not None and name not in views:
            continue
        answers = [video_answers(r, jsonl.parent, budget) for r in records]
        rows.append(
            {
                "benchmark": "zoom_video",
                "view": name,
                "n": len(records),
                "base": accuracy([a for a, _ in answers], records),
                "crop": accuracy([c for _, c in answers], records),
            }
        )
    return rows


# -- audio ---------------------------------------------------------------------------------
AUDIO_RATE = 16_000  # Hz, the Qwen2-Audio / Qwen2.5-Omni feature extractors' sampling rate
AUDIO_WINDOW = 1.0  # s, the crop: [t − this, t + this] around the stated time t
MIN_TONALITY = 0.7  # share of a view's energy within ±6 % of its spectral peak: a tone
# (bundled splits: a view with knocks only ≤ 0.36, a crop around the stated time ≥ 0.98)
PEAK_BAND = 1.06  # the band around the peak: [peak / this, peak × this]
AUDIO_VIEWS: dict[str, float | None] = {
    "first 2 s (max_seconds 2.0, truncate)": None,
    "whole clip (max_seconds 30, the default)": 30.0,
}
"""Base views of the audio: name → ``max_seconds`` (``None``: the record's
``meta.base_seconds``, 2.0 in the bundled split), truncate policy."""


def read_pitch(waveform: np.ndarray, rate: int, choices: list[str]) -> str:
    """The option a fixed rule reads from ``waveform`` (mono, ``rate`` Hz): the class whose
    centre frequency is nearest (in log frequency) to the spectral peak, or ``choices[0]`` (a
    guess) when the view is silent or less than ``MIN_TONALITY`` of its energy lies within
    ``PEAK_BAND`` of the peak (no tone: silence, knocks)."""
    x = np.asarray(waveform, dtype=float)
    if x.size < 2:
        return choices[0]
    power = np.abs(np.fft.rfft(x)) ** 2
    freqs = np.fft.rfftfreq(x.size, 1 / rate)
    power[0] = 0.0  # DC carries no pitch
    total = float(power.sum())
    if total <= 0.0:
        return choices[0]
    peak = float(freqs[int(power.argmax())])
    band = (freqs >= peak / PEAK_BAND) & (freqs <= peak * PEAK_BAND)
    if float(power[band].sum()) / total < MIN_TONALITY:
        return choices[0]
    centres = load_generator().AUDIO_ZOOM_PITCHES
    return min(choices, key=lambda c: abs(math.log(peak / centres[c])))


@contextlib.contextmanager
def quiet_truncation() -> Iterator[None]:
    """Silence ``load_audio``'s per-file truncation warning (every base view is truncated)."""
    logger = logging.getLogger("mmrft.data.audio")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def audio_answers(record: dict, folder: Path) -> tuple[dict[str, str], str]:
    """``({base view name: answer}, crop answer)`` of one ``audio_zoom`` record."""
    from mmrft.data.audio import load_audio

    meta, choices = record["meta"], record["meta"]["choices"]
    path = str(folder / record["messages"][0]["content"][0]["audio"])
    base = {}
    with quiet_truncation():
        for name, seconds in AUDIO_VIEWS.items():
            limit = meta["base_seconds"] if seconds is None else seconds
            view = load_audio(path, AUDIO_RATE, max_seconds=limit, policy="truncate")
            base[name] = read_pitch(view, AUDIO_RATE, choices)
    whole = load_audio(path, AUDIO_RATE)
    t = meta["asked_time"]
    first = max(round((t - AUDIO_WINDOW) * AUDIO_RATE), 0)
    last = min(round((t + AUDIO_WINDOW) * AUDIO_RATE), whole.size)
    return base, read_pitch(whole[first:last], AUDIO_RATE, choices)


def evaluate_audio(jsonl: Path) -> list[dict]:
    """One row per base view in ``AUDIO_VIEWS``: ``{"benchmark", "view", "n", "base",
    "crop"}`` (accuracies; the crop is the same in every row)."""
    records = [json.loads(line) for line in jsonl.read_text(encoding="utf-8").splitlines()]
    answers = [audio_answers(r, jsonl.parent) for r in records]
    crop = accuracy([c for _, c in answers], records)
    return [
        {
            "benchmark": "audio_zoom",
            "view": name,
            "n": len(records),
            "base": accuracy([b[name] for b, _ in answers], records),
            "crop": crop,
        }
        for name in AUDIO_VIEWS
    ]


def table(rows: list[dict]) -> str:
    """The rows as a Markdown table (chance 0.25: 4 balanced options)."""
    lines = [
        "| benchmark | base view | n | base acc | crop acc |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['benchmark']} | {r['view']} | {r['n']} | {r['base']:.2f} | {r['crop']:.2f} |"
        for r in rows
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--marks", type=Path, default=BENCH / "zoom_marks" / "test.jsonl")
    parser.add_argument("--video", type=Path, default=BENCH / "zoom_video" / "test.jsonl")
    parser.add_argument("--audio", type=Path, default=BENCH / "audio_zoom" / "test.jsonl")
    parser.add_argument("--out", type=Path, help="write the rows as JSON here")
    args = parser.parse_args(argv)
    rows = evaluate_marks(args.marks) + evaluate_video(args.video)
    if importlib.util.find_spec("soundfile") is not None:
        rows += evaluate_audio(args.audio)
        note = "chance: 0.25 (4 balanced colours; audio_zoom: 4 balanced pitch classes)"
    else:
        note = "chance: 0.25 (4 balanced colours); audio_zoom skipped: no soundfile (audio extra)"
    print(table(rows))
    print(note)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"rows": rows, "chance": 0.25}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
