"""Generate the bundled synthetic benchmarks under ``assets/benchmarks/`` (deterministic).

    python scripts/make_benchmarks.py                    # (re)write every benchmark
    python scripts/make_benchmarks.py --only shapes_colour
    python scripts/make_benchmarks.py --check            # regenerate in a temp dir, compare

Every benchmark is ``<name>/{train,test}.jsonl`` in the project's JSONL format (media paths
relative to the JSONL file) plus its media, and for some the same split in a peer's format.
Units: pixels (x right, y down, pixel ``x`` spans ``[x, x + 1)``), seconds, Hz.

Images (``<name>/images/<split>-NNNN.png``, ``meta.image_size = [W, H]``):

* ``shapes_colour`` (task ``classification``, the CPU demo): one big shape (circle, square or
  triangle, side 20–38 px) of one of 4 saturated colours on a white or light-gray speckled
  56×56 background; target the colour name; classes balanced.
* ``shapes_kind`` (``classification``): one shape among circle/square/triangle/cross, random
  colour, 56×56; target the kind; classes balanced.
* ``shapes_counting`` (``counting``): 1–6 non-overlapping shapes of one kind on 84×84; target
  the count (int); counts balanced; ``meta.count_range = [1, 6]``.
* ``shapes_grounding`` (``grounding``): 2–4 non-overlapping shapes with distinct
  (colour, kind) on 112×112; the question is the expression ("the red circle"); target the
  tight box of that shape, absolute pixels ``[x1, y1, x2, y2]`` of the image, edges inclusive
  of the drawn pixels (pixel ``x`` spans ``[x, x + 1)``); ``meta.other_boxes`` the boxes of the
  image's other shapes (the grounding task's ``wrong_object``: a box on one of them).
* ``shapes_detection`` (``detection``): 0–4 shapes of the asked-for kind among 1–3 shapes of
  other kinds on 112×112 ("Find every triangle in the image."); target the list of their tight
  boxes (same frame as grounding) sorted by ``(x1, y1)``, ``[]`` when there is none;
  ``meta.category``, ``meta.count_range = [0, 4]``; (count, kind) pairs balanced.
* ``charts`` (``chart_qa`` in ``{train,test}.jsonl``, ``chart_to_code`` in
  ``code_{train,test}.jsonl``, one image per chart shared by both): a bar or line chart of 3–5
  categories ``A``… with integer values 5–95 (the largest unique), each value written on the
  chart, 160×120 px (2.0×1.5 in at 80 dpi; ~128×96 left the digits unreadable). QA: "What is
  the value of B?" (target int) or "Which category has the largest value?" (target the letter,
  ``meta.choices`` the categories), ``meta.question_type`` ``value``/``largest``, balanced.
  Chart-to-code: target the matplotlib script that drew the image, exactly: the generator
  runs that string and stores what it wrote, so executing the target reproduces the image
  pixel for pixel (same matplotlib); it writes ``chart.png`` into the working directory
  (``meta.output_file``). ``meta.kind``, ``categories``, ``values``, ``colour``, ``title``.
* ``zoom_marks`` (``classification``; "looking closer", for crop/zoom tool rollouts): large
  images, 1024–1536 px per side, of neutral gray clutter (gray rectangles and discs) with one
  small mark: a ring (outer diameter 16–20 px) of a random one of the 4 colours around a dark
  gap and a centre dot (7–8.8 px) of the asked colour. "What colour is the dot in the middle of
  the small ring?"; ``meta.choices`` the 4 colours (fixed order), target the dot's colour,
  balanced; the ring's colour is drawn independently (``meta.ring_colour``).
  ``meta.target_box`` the ring's tight box (the region to zoom into), ``meta.dot_box`` the
  dot's, both ``[x1, y1, x2, y2]`` in original pixels. At the small budgets of the tiny
  recipes (56–112 px per side) the dot is under one input pixel, blended with its ring, and
  its colour unreadable; a crop twice the ring's size, resized to the same budget, shows it
  (``benchmarks/zoom_oracle.py`` measures both).

* ``zoom_sites`` (``classification``; "looking closer" where the region is plain): 840×840 px
  images, each quadrant its own light gray, gray clutter, and a dark disc (270 px) over one
  of four fixed sites (one per quadrant) holding a ``zoom_marks``-style mark (ring 18–20 px of
  a random colour, dot 9.9–11 px of the asked colour); same question, choices and balance,
  sites balanced too. ``meta.zoom_box`` the site's 30-px square (the crop that shows the
  dot), ``meta.target_box`` the ring's box, ``meta.dot_box``, ``meta.site``.

Videos (``<name>/videos/<id>.mp4``: H.264 yuv420p in MP4, 64×64, frame ``i`` shown over
``[i / fps, (i + 1) / fps)`` s, ``meta.duration`` s, ``meta.fps``, ``meta.frame_size = [W, H]``):

* ``video_temporal`` (``temporal_grounding``, Charades-STA style): 4–8 s at 5 fps; a shape of
  one (colour, kind) is visible during one interval and absent otherwise; half the clips also
  show a shape of another colour during another interval. Question "When does the red square
  appear?"; target ``[start, end]`` s (multiples of 0.2 s: the shape is on frames
  ``start·fps … end·fps − 1``); target colours balanced. Also ``charades_sta_<split>.txt`` in
  the Charades-STA annotation format, one ``<video_id> <start> <end>##<sentence>`` line per
  clip (times with one decimal, sentence "the red square appears."), videos found as
  ``videos/<video_id>.mp4`` next to it (Charades keeps them in one folder, ``<id>.mp4``).
* ``video_direction`` (``classification`` over ``meta.choices``): 4 s at 6 fps; a shape moves
  1 or 2 px per frame left, right, up or down (half the clips add a static shape of another
  colour). "Which direction does the blue circle move?"; ``meta.choices`` the 4 directions in a
  per-clip shuffled order, target the direction's text; directions balanced. Also
  ``video_r1_<split>.json`` in Video-R1's format (a JSON list as in Video-R1-260k.json; the
  fields its loader and reward read): ``problem_id`` (int), ``problem`` (the question; Video-R1
  appends the options itself), ``data_type`` ``"video"``, ``problem_type``
  ``"multiple choice"``, ``options`` (``["A. left", …]``), ``solution``
  (``"<answer>B</answer>"``), ``path`` (``"./videos/<id>.mp4"``, relative to the JSON file as
  Video-R1's paths are to its data root), ``data_source``; no ``process`` (the chain of thought
  only Video-R1-COT-165k, the SFT file, carries).
* ``zoom_video`` (``video_qa``, multiple choice; "looking closer" in time): 112×112 px, 8–10 s
  at 20 fps, a static neutral background; a disc (40–56 px) of one of the 4 colours flashes on
  6–10 frames (0.3–0.5 s). "What colour is the dot that flashes briefly at about 5.2 s?"
  (``meta.asked_time``, the flash's start rounded to 0.1 s, 1.2 s or more from the clip's
  ends; ``meta.zoom_span`` the window ``[t, t + 1]``); ``meta.choices`` the 4 colours (fixed
  order), target the colour, balanced;
  ``meta.target_span`` ``[start, end]`` s of the flash (frames ``start·fps … end·fps − 1``),
  ``meta.target_box`` its box in frame pixels. The flash always falls between the frames of the
  8-frame (the tiny video recipes) and the 16-frame (``VideoBudget``'s default, Video-R1's)
  uniform samplings, at least one frame to spare, so it is never sampled at those counts;
  sampling densely inside the span shows it.
* ``zoom_slots`` (``video_qa``, as ``zoom_video``; the moment to look at visible): 112×112 px,
  8 s at 20 fps in four 2-s slots, each with its own background gray; a dark disc (84 px)
  stays on screen through one slot (balanced) and a disc of one of the 4 colours (40–56 px)
  flashes on it for 17–20 frames through the slot's 1-s window between its two sampled frames
  (``meta.zoom_span`` ``[s, s + 1]``, s = 0.1, 2.4, 4.7, 6.9 for slot k = 0–3;
  ``meta.zoom_choices`` the four slots' windows, ``meta.slot`` k), never on the 8 uniformly
  sampled frames, which show the dark disc on the marked slot's two.
  "What colour is the dot that flashes briefly on the dark disc?"

Audio (``<name>/audio/<id>.wav``: 16 kHz mono 16-bit PCM WAV; ``meta.duration`` s,
``meta.sample_rate`` Hz; faint white noise under the tones):

* ``audio_beeps`` (``counting``): 1.0–1.5 s clips with 1–5 equal beeps (500–1500 Hz, 50–100 ms,
  ≥ 80 ms apart); "How many beeps are there?"; target the count; counts balanced;
  ``meta.count_range = [1, 5]``, ``meta.beeps`` the ``[start, end]`` s of each.
* ``audio_pitch`` (``classification``, R1-AQA style): 1.0–1.2 s exponential sweep between
  f and 2–3·f (f 250–500 Hz), rising or falling (balanced). "How does the pitch of the tone
  change?"; ``meta.choices`` 4 option texts in a per-clip shuffled order ("rising",
  "falling", and the never-correct "steady" and "rising then falling"), target the option
  text. Also ``r1_aqa_<split>.jsonl`` in R1-AQA's training format (its converted AVQA lines:
  ``id`` int, ``question_text``, ``multi_choice`` the option texts, ``answer`` the option's
  index, ``dataset_name`` ``"AVQA"`` so that its loader builds the prompt and the
  ``<answer>text</answer>`` solution, ``audio_path`` relative to the file; AVQA's
  ``video_name``/``video_id``/``question_relation``/``question_type`` are left out, the loader
  never reads them), and ``mmau_test.json`` for the test split in MMAU's benchmark-file format
  (a JSON list of ``id``, ``audio_id`` ``"./audio/<id>.wav"``, ``question``, ``choices``,
  ``answer`` the option text, ``dataset``, ``task`` ``"sound"``, ``split`` ``"test-mini"`` (the
  answered split MMAU's evaluation.py scores), ``category`` ``"Information Extraction"``,
  ``sub-category`` ``"Pitch Contour"``, ``difficulty`` ``"easy"``).
* ``audio_zoom`` (``classification``; "looking closer" in audio, for ``audio_clip`` tool
  rollouts): 8–10 s clips stored as FLAC (``audio/<id>.flac``, 16 kHz mono 16-bit; digital
  silence between the sounds, no noise floor: a WAV or a noise floor would not fit the size
  budget, see :func:`write_audio_zoom`), 1–2 pitchless knocks anywhere and one short tone
  (0.2–0.4 s) starting 2.5 s or later, after ``meta.base_seconds`` = 2.0 s (the base view a
  family keeps at ``max_seconds: 2.0``, truncate policy). "What is the pitch of the short tone
  at about 6.3 s?" (a multiple of 0.1 s within 0.25 s of the onset; ``meta.asked_time``);
  ``meta.choices`` ``low``/``middle``/``high``/``very high`` (300/600/1200/2400 Hz ± 5 %, fixed
  order), target the tone's class, balanced; ``meta.target_span`` ``[start, end]`` s of the
  tone, ``meta.frequency_hz``, ``meta.knocks``. The truncated base view never holds the tone;
  ``[t − 1, t + 1]`` around the stated time always holds all of it
  (``benchmarks/zoom_oracle.py`` measures both).

Environment starts (no media: the ``grid_walk`` environment of ``tools/grid.py`` draws the
grid at its reset):

* ``grid_walk`` (task ``prompt``, scored by the environment): a 3 × 3 grid, ``meta.walker``
  and ``meta.goal`` cells (``[column, row]`` from the top-left) at a shortest walk of 1, 2 or 3
  moves (balanced), ``meta.shortest``; target an optimal first move, ``meta.choices`` the four
  directions (:func:`write_grid_walk`).

Shapes are rasterised with numpy (pixel-centre tests), not PIL's drawing, so pixels depend on
the seeds only. PNGs are written by Pillow with fixed parameters and no metadata chunks
(palette PNGs when at most 256 colours are used), so a rerun gives identical bytes with the
same Pillow/zlib; chart pixels additionally depend on the matplotlib version (fonts: its
bundled DejaVu Sans). MP4s come from libx264 with fixed settings (CRF 18, preset medium, no
B-frames, one thread, bitexact muxing): identical bytes with the same FFmpeg/x264 build. WAVs
are written by the standard library from rounded int16 samples, FLACs by libsndfile (level 8)
from the same: identical bytes with the same libFLAC. ``--check`` compares JSONL and
peer-format files by bytes, PNGs by decoded RGB pixels, MP4s by decoded frames (count, size
and timestamps equal, mean absolute difference ≤ 1 grey level per frame, so another x264 build
passes) and WAVs and FLACs by samples (±1 LSB, for libm differences in ``sin``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import wave
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "assets" / "benchmarks"

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 170, 50),
    "blue": (30, 70, 225),
    "yellow": (240, 200, 0),
}
KINDS = ("circle", "square", "triangle", "cross")
SPLITS = {"train": 800, "test": 200}
SAMPLE_RATE = 16_000  # Hz, every audio benchmark
VIDEO_SIZE = 64  # px, square frames
Array = np.ndarray


# -- drawing ---------------------------------------------------------------------------------
def shape_mask(kind: str, x0: int, y0: int, side: int, width: int, height: int) -> Array:
    """Boolean ``(height, width)`` mask of a shape inscribed in the square
    ``[x0, x0 + side) × [y0, y0 + side)`` (pixels, x right, y down), by pixel-centre tests."""
    ys, xs = np.mgrid[0:height, 0:width]
    px, py = xs + 0.5, ys + 0.5
    cx, cy, half = x0 + side / 2, y0 + side / 2, side / 2
    dx, dy = np.abs(px - cx), np.abs(py - cy)
    if kind == "circle":
        return dx**2 + dy**2 <= half**2
    if kind == "square":
        return (dx <= half) & (dy <= half)
    if kind == "triangle":  # apex up, base at the bottom of the square
        depth = py - y0  # 0 at the apex, side at the base
        return (depth >= 0) & (depth <= side) & (dx <= depth / 2)
    if kind == "cross":
        arm = side / 6
        return ((dx <= half) & (dy <= arm)) | ((dx <= arm) & (dy <= half))
    raise ValueError(f"unknown shape kind {kind!r}")


def tight_box(mask: Array) -> list[int]:
    """``[x1, y1, x2, y2]`` in pixels with ``x2``/``y2`` exclusive (pixel x spans [x, x+1))."""
    ys, xs = np.nonzero(mask)
    return [int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1]


def background(rng: np.random.Generator, width: int, height: int) -> Array:
    """White or light-gray canvas with sparse gray speckles (≈3 % of pixels)."""
    base = 255 if rng.random() < 0.5 else int(rng.integers(215, 236))
    gray = np.full((height, width), base, dtype=np.int16)
    speckle = rng.random((height, width)) < 0.03
    gray[speckle] -= rng.integers(10, 41, size=int(speckle.sum()), dtype=np.int16)
    return np.repeat(np.clip(gray, 0, 255).astype(np.uint8)[:, :, None], 3, axis=2)


def paint(image: Array, mask: Array, colour: str, rng: np.random.Generator) -> None:
    """Fill ``mask`` with ``colour`` jittered by up to ±15 per channel (stays saturated)."""
    jitter = rng.integers(-15, 16, size=3)
    image[mask] = np.clip(np.array(COLOURS[colour]) + jitter, 0, 255).astype(np.uint8)


def place(
    rng: np.random.Generator, sides: list[int], width: int, height: int, gap: int = 3
) -> list[tuple[int, int]]:
    """Top-left corners for squares of the given sides, inside the image and ``gap`` px apart."""
    while True:  # restart when a layout gets stuck; a few tries suffice at these densities
        corners: list[tuple[int, int]] = []
        for side in sides:
            for _ in range(200):
                x0 = int(rng.integers(1, width - side))
                y0 = int(rng.integers(1, height - side))
                if all(
                    x0 + side + gap <= x
                    or x + s + gap <= x0
                    or y0 + side + gap <= y
                    or y + s + gap <= y0
                    for (x, y), s in zip(corners, sides)
                ):
                    corners.append((x0, y0))
                    break
            else:
                break
        if len(corners) == len(sides):
            return corners


def balanced(rng: np.random.Generator, values: list, n: int) -> list:
    """``n`` labels cycling through ``values`` (counts differ by at most 1), shuffled."""
    labels = [values[i % len(values)] for i in range(n)]
    return [labels[i] for i in rng.permutation(n)]


# -- benchmarks ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Item:
    """One generated sample before it is written: pixels, question, target, extra meta."""

    pixels: Array
    question: str
    target: object
    meta: dict


def single_shape(
    rng: np.random.Generator, size: int, kind: str, colour: str, sides: tuple[int, int]
) -> Array:
    image = background(rng, size, size)
    side = int(rng.integers(sides[0], sides[1] + 1))
    ((x0, y0),) = place(rng, [side], size, size)
    paint(image, shape_mask(kind, x0, y0, side, size, size), colour, rng)
    return image


def make_colour(rng: np.random.Generator, n: int) -> list[Item]:
    colours = list(COLOURS)
    items = []
    for colour in balanced(rng, colours, n):
        kind = KINDS[int(rng.integers(0, 3))]  # circle, square, triangle
        pixels = single_shape(rng, 56, kind, colour, (20, 38))
        items.append(Item(pixels, "What colour is the shape?", colour, {"choices": colours}))
    return items


def make_kind(rng: np.random.Generator, n: int) -> list[Item]:
    kinds = list(KINDS)
    items = []
    for kind in balanced(rng, kinds, n):
        colour = list(COLOURS)[int(rng.integers(0, len(COLOURS)))]
        pixels = single_shape(rng, 56, kind, colour, (22, 40))
        items.append(Item(pixels, "What kind of shape is in the image?", kind, {"choices": kinds}))
    return items


def make_counting(rng: np.random.Generator, n: int) -> list[Item]:
    items = []
    for count in balanced(rng, [1, 2, 3, 4, 5, 6], n):
        size = 84
        kind = KINDS[int(rng.integers(0, len(KINDS)))]
        image = background(rng, size, size)
        sides = [int(s) for s in rng.integers(12, 21, size=count)]
        for (x0, y0), side in zip(place(rng, sides, size, size), sides):
            colour = list(COLOURS)[int(rng.integers(0, len(COLOURS)))]
            paint(image, shape_mask(kind, x0, y0, side, size, size), colour, rng)
        items.append(
            Item(image, "How many shapes are in the image?", count, {"count_range": [1, 6]})
        )
    return items


def make_grounding(rng: np.random.Generator, n: int) -> list[Item]:
    pairs = [(c, k) for c in COLOURS for k in KINDS]
    items = []
    for count in balanced(rng, [2, 3, 4], n):
        size = 112
        image = background(rng, size, size)
        chosen = [pairs[i] for i in rng.choice(len(pairs), size=count, replace=False)]
        sides = [int(s) for s in rng.integers(18, 35, size=count)]
        boxes = []
        for (x0, y0), side, (colour, kind) in zip(place(rng, sides, size, size), sides, chosen):
            mask = shape_mask(kind, x0, y0, side, size, size)
            paint(image, mask, colour, rng)
            boxes.append(tight_box(mask))
        target = int(rng.integers(0, count))
        colour, kind = chosen[target]
        others = [box for i, box in enumerate(boxes) if i != target]  # for `wrong_object`
        items.append(Item(image, f"the {colour} {kind}", boxes[target], {"other_boxes": others}))
    return items


def save_png(pixels: Array, path: Path) -> None:
    """Save RGB ``pixels`` as a palette PNG (lossless: the palette holds every colour used,
    sorted) with fixed zlib settings and no metadata, so the bytes depend on the pixels only."""
    flat = pixels.reshape(-1, 3).astype(np.uint32)
    keys = (flat[:, 0] << 16) | (flat[:, 1] << 8) | flat[:, 2]
    colours, index = np.unique(keys, return_inverse=True)
    if len(colours) > 256:
        raise ValueError(f"{path}: {len(colours)} colours do not fit a palette")
    palette = np.stack([colours >> 16, (colours >> 8) & 255, colours & 255], axis=1)
    image = Image.fromarray(index.reshape(pixels.shape[:2]).astype(np.uint8), "P")
    image.putpalette(palette.astype(np.uint8).tobytes())
    image.save(path, format="PNG", optimize=False, compress_level=9)


def save_rgb_png(pixels: Array, path: Path) -> None:
    """Save RGB ``pixels`` as a palette PNG when they use at most 256 colours (see
    :func:`save_png`), else as an RGB PNG with the same fixed settings and no metadata."""
    if len(np.unique(pixels.reshape(-1, 3), axis=0)) <= 256:
        save_png(pixels, path)
    else:
        Image.fromarray(pixels, "RGB").save(path, format="PNG", optimize=False, compress_level=9)


def save_mp4(frames: Array, fps: int, path: Path) -> None:
    """Encode ``frames`` (``(T, H, W, 3)`` uint8 RGB, H and W even) as H.264 in MP4.

    Frame ``i`` gets pts ``i`` in a ``1 / fps`` s time base, so it is shown over
    ``[i / fps, (i + 1) / fps)`` s and the clip lasts ``T / fps`` s. Fixed settings for
    reproducible bytes: libx264, yuv420p, CRF 18, preset medium, no B-frames (pts = dts, no
    edit list), one thread; ``fflags=+bitexact`` keeps libavformat's version string out of the
    container (x264 still names its own version in the stream's SEI).
    """
    import av  # the `video` extra; only the video benchmarks need it

    with av.open(str(path), "w", format="mp4", options={"fflags": "+bitexact"}) as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "yuv420p"
        stream.thread_count = 1
        stream.options = {"crf": "18", "preset": "medium", "bframes": "0", "threads": "1"}
        for i, pixels in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(pixels), format="rgb24")
            frame.pts, frame.time_base = i, Fraction(1, fps)
            container.mux(stream.encode(frame))
        container.mux(stream.encode())


def read_mp4(path: Path) -> tuple[Array, list[float], float]:
    """Decode a video: ``(frames (T, H, W, 3) uint8 RGB, start time of each frame in s, fps)``."""
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        fps = float(stream.average_rate)
        frames, times = [], []
        for frame in container.decode(stream):
            frames.append(frame.to_ndarray(format="rgb24"))
            times.append(float(frame.time))
    return np.stack(frames), times, fps


def save_wav(samples: Array, path: Path) -> None:
    """Write float ``samples`` in ``[-1, 1]`` as a 16 kHz mono 16-bit PCM WAV (standard-library
    writer: a plain 44-byte RIFF header, so the bytes depend on the samples only)."""
    pcm = np.clip(np.round(samples * 32767), -32768, 32767).astype("<i2")
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(SAMPLE_RATE)
        f.writeframes(pcm.tobytes())


def read_wav(path: Path) -> tuple[Array, int]:
    """``(int16 samples, sample rate in Hz)`` of a mono 16-bit WAV."""
    with wave.open(str(path), "rb") as f:
        if f.getnchannels() != 1 or f.getsampwidth() != 2:
            raise ValueError(f"{path}: expected mono 16-bit PCM")
        return np.frombuffer(f.readframes(f.getnframes()), dtype="<i2"), f.getframerate()


def save_flac(samples: Array, path: Path) -> None:
    """Write float ``samples`` in ``[-1, 1]`` as a 16 kHz mono 16-bit FLAC (libsndfile through
    ``soundfile``, the project's audio reader; FLAC level 8), from the same rounded int16
    samples as :func:`save_wav`. The bytes depend on the samples and the libFLAC build (its
    version string is in the file), so ``--check`` compares FLACs by samples."""
    import soundfile  # the `audio` extra; only audio_zoom needs it

    pcm = np.clip(np.round(samples * 32767), -32768, 32767).astype("<i2")
    soundfile.write(
        str(path), pcm, SAMPLE_RATE, format="FLAC", subtype="PCM_16", compression_level=1.0
    )


def read_pcm(path: Path) -> tuple[Array, int]:
    """``(int16 samples, sample rate in Hz)`` of a mono 16-bit WAV or FLAC."""
    if path.suffix == ".wav":
        return read_wav(path)
    import soundfile

    samples, rate = soundfile.read(str(path), dtype="int16", always_2d=True)
    if samples.shape[1] != 1:
        raise ValueError(f"{path}: expected mono")
    return samples[:, 0], int(rate)


def user_record(
    sample_id: str, media: str, path: str, question: str, target: object, meta: dict
) -> dict:
    """One line of the project's JSONL format: a user turn with one media part, then the text."""
    return {
        "id": sample_id,
        "messages": [
            {
                "role": "user",
                "content": [{"type": media, media: path}, {"type": "text", "text": question}],
            }
        ],
        "target": target,
        "meta": meta,
    }


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def write_json(path: Path, value: object) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")


def write_images(make: Callable[[np.random.Generator, int], list[Item]]) -> Writer:
    """A writer for the image benchmarks built from :class:`Item` lists (the shapes family)."""

    def write(folder: Path, split: str, n: int, rng: np.random.Generator) -> None:
        (folder / "images").mkdir(exist_ok=True)
        records = []
        for i, item in enumerate(make(rng, n)):
            relative = f"images/{split}-{i:04d}.png"
            save_png(item.pixels, folder / relative)
            height, width = item.pixels.shape[:2]
            meta = {**item.meta, "image_size": [width, height]}
            records.append(
                user_record(
                    f"{folder.name}-{split}-{i:04d}",
                    "image",
                    relative,
                    item.question,
                    item.target,
                    meta,
                )
            )
        write_jsonl(folder / f"{split}.jsonl", records)

    return write


# -- new image benchmarks --------------------------------------------------------------------
def write_detection(folder: Path, split: str, n: int, rng: np.random.Generator) -> None:
    """``shapes_detection``: 0–4 shapes of the asked kind (side 14–22 px) among 1–3 shapes of
    other kinds on 112×112 px; target their tight boxes in pixels, sorted by ``(x1, y1)``."""
    (folder / "images").mkdir(exist_ok=True)
    size, records = 112, []
    pairs = [(count, kind) for count in range(5) for kind in KINDS]
    for i, (count, kind) in enumerate(balanced(rng, pairs, n)):
        others = [k for k in KINDS if k != kind]
        kinds = [kind] * count + [others[j] for j in rng.integers(0, 3, size=rng.integers(1, 4))]
        image = background(rng, size, size)
        sides = [int(s) for s in rng.integers(14, 23, size=len(kinds))]
        boxes = []
        for (x0, y0), side, shape in zip(place(rng, sides, size, size), sides, kinds):
            mask = shape_mask(shape, x0, y0, side, size, size)
            paint(image, mask, list(COLOURS)[int(rng.integers(0, len(COLOURS)))], rng)
            if shape == kind:
                boxes.append(tight_box(mask))
        relative = f"images/{split}-{i:04d}.png"
        save_png(image, folder / relative)
        meta = {"category": kind, "count_range": [0, 4], "image_size": [size, size]}
        records.append(
            user_record(
                f"{folder.name}-{split}-{i:04d}",
                "image",
                relative,
                f"Find every {kind} in the image.",
                sorted(boxes),
                meta,
            )
        )
    write_jsonl(folder / f"{split}.jsonl", records)


CHART_DPI = 80
CHART_SIZE = (160, 120)  # px: figsize 2.0 × 1.5 in at CHART_DPI
CHART_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd")
CHART_TITLES = ("Sales", "Visitors", "Rainfall", "Orders", "Scores", "Downloads")
CHART_OUTPUT = "chart.png"


def chart_code(kind: str, categories: list[str], values: list[int], colour: str, title: str) -> str:
    """The matplotlib script of one chart (the chart-to-code target); it writes
    ``chart.png`` (160×120 px) into the working directory."""
    width, height = (side / CHART_DPI for side in CHART_SIZE)
    lines = [
        "import matplotlib.pyplot as plt",
        "",
        'plt.rcParams.update({"font.family": "DejaVu Sans", "font.size": 7})',
        f"categories = {json.dumps(categories)}",
        f"values = {json.dumps(values)}",
        f"fig, ax = plt.subplots(figsize=({width}, {height}), dpi={CHART_DPI})",
    ]
    if kind == "bar":
        lines += [
            f'bars = ax.bar(categories, values, color="{colour}")',
            "ax.bar_label(bars, padding=1)",
        ]
    else:
        lines += [
            f'ax.plot(categories, values, color="{colour}", marker="o", markersize=3)',
            "for x, y in zip(categories, values):",
            '    ax.annotate(str(y), (x, y), textcoords="offset points", xytext=(0, 3), ha="center")',
            "ax.margins(x=0.15)",
        ]
    lines += [
        "ax.set_ylim(0, 115)",
        "ax.set_yticks([0, 25, 50, 75, 100])",
        f'ax.set_title("{title}")',
        "fig.subplots_adjust(left=0.18, right=0.97, bottom=0.14, top=0.87)",
        f'fig.savefig("{CHART_OUTPUT}", dpi={CHART_DPI})',
    ]
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def working_directory(path: Path) -> Iterator[None]:
    before = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def render_chart_code(code: str) -> Array:
    """Run a chart script (Agg backend, matplotlib settings restored afterwards) in a temp dir and
    return the RGB pixels of the ``chart.png`` it wrote."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with (
        tempfile.TemporaryDirectory() as tmp,
        working_directory(Path(tmp)),
        matplotlib.rc_context(),
    ):
        try:
            exec(compile(code, "<chart code>", "exec"), {"__name__": "__chart__"})
        finally:
            plt.close("all")
        with Image.open(CHART_OUTPUT) as image:
            rgba = np.asarray(image.convert("RGBA"))
    if (rgba[:, :, 3] != 255).any():
        raise ValueError("chart image is not opaque")
    return np.ascontiguousarray(rgba[:, :, :3])


def write_charts(folder: Path, split: str, n: int, rng: np.random.Generator) -> None:
    """``charts``: ``n`` bar/line charts (160×120 px) of 3–5 categories with integer values
    5–95 (largest unique); one QA record (``{split}.jsonl``) and one chart-to-code record
    (``code_{split}.jsonl``) per chart."""
    (folder / "images").mkdir(exist_ok=True)
    qa, code_records = [], []
    kinds = balanced(rng, ["bar", "line"], n)
    questions = balanced(rng, ["value", "largest"], n)
    for i, (kind, question_type) in enumerate(zip(kinds, questions)):
        categories = list("ABCDE"[: int(rng.integers(3, 6))])
        while True:
            values = [int(v) for v in rng.integers(5, 96, size=len(categories))]
            if values.count(max(values)) == 1:
                break
        colour = CHART_COLOURS[int(rng.integers(0, len(CHART_COLOURS)))]
        title = CHART_TITLES[int(rng.integers(0, len(CHART_TITLES)))]
        code = chart_code(kind, categories, values, colour, title)
        pixels = render_chart_code(code)
        relative = f"images/{split}-{i:04d}.png"
        save_rgb_png(pixels, folder / relative)
        size = [pixels.shape[1], pixels.shape[0]]
        if question_type == "value":
            asked = int(rng.integers(0, len(categories)))
            question = f"What is the value of {categories[asked]}?"
            target: object = values[asked]
            meta: dict = {"question_type": "value"}
        else:
            question = "Which category has the largest value?"
            target = categories[values.index(max(values))]
            meta = {"question_type": "largest", "choices": categories}
        meta |= {"kind": kind, "image_size": size}
        sample_id = f"{folder.name}-{split}-{i:04d}"
        qa.append(user_record(sample_id, "image", relative, question, target, meta))
        code_meta = {
            "kind": kind,
            "image_size": size,
            "categories": categories,
            "values": values,
            "colour": colour,
            "title": title,
            "output_file": CHART_OUTPUT,
        }
        code_records.append(
            user_record(
                f"{folder.name}-code-{split}-{i:04d}",
                "image",
                relative,
                "Write Python matplotlib code that reproduces this chart.",
                code,
                code_meta,
            )
        )
    write_jsonl(folder / f"{split}.jsonl", qa)
    write_jsonl(folder / f"code_{split}.jsonl", code_records)


# -- video -----------------------------------------------------------------------------------
def colour_value(colour: str, rng: np.random.Generator) -> Array:
    """``colour``'s RGB jittered by up to ±15 per channel (uint8), as :func:`paint` fills."""
    jitter = rng.integers(-15, 16, size=3)
    return np.clip(np.array(COLOURS[colour]) + jitter, 0, 255).astype(np.uint8)


def write_video_temporal(folder: Path, split: str, n: int, rng: np.random.Generator) -> None:
    """``video_temporal``: 64×64 px clips, 4–8 s at 5 fps; the asked shape (side 16–24 px) is
    visible during ``[start, end)`` s (≥ 1 s, ≤ 60 % of the clip, multiples of 1 / fps)."""
    (folder / "videos").mkdir(exist_ok=True)
    fps, size = 5, VIDEO_SIZE
    records, charades = [], []
    for i, colour in enumerate(balanced(rng, list(COLOURS), n)):
        duration = int(rng.integers(4, 9))  # s
        n_frames = duration * fps
        kind = KINDS[int(rng.integers(0, len(KINDS)))]
        shapes = [(colour, kind)]
        if rng.random() < 0.5:  # a distractor of another colour, during its own interval
            others = [c for c in COLOURS if c != colour]
            shapes.append((others[int(rng.integers(0, 3))], KINDS[int(rng.integers(0, 4))]))
        sides = [int(s) for s in rng.integers(16, 25, size=len(shapes))]
        corners = place(rng, sides, size, size)
        base = background(rng, size, size)
        frames = np.repeat(base[None], n_frames, axis=0)
        spans = []
        for (shape_colour, shape_kind), (x0, y0), side in zip(shapes, corners, sides):
            length = int(rng.integers(fps, int(0.6 * n_frames) + 1))  # frames
            first = int(rng.integers(0, n_frames - length + 1))
            mask = shape_mask(shape_kind, x0, y0, side, size, size)
            frames[first : first + length, mask] = colour_value(shape_colour, rng)
            spans.append((first, first + length))
        video_id = f"{split}-{i:04d}"
        relative = f"videos/{video_id}.mp4"
        save_mp4(frames, fps, folder / relative)
        start, end = round(spans[0][0] / fps, 1), round(spans[0][1] / fps, 1)
        meta = {"duration": float(duration), "fps": fps, "frame_size": [size, size]}
        records.append(
            user_record(
                f"{folder.name}-{video_id}",
                "video",
                relative,
                f"When does the {colour} {kind} appear?",
                [start, end],
                meta,
            )
        )
        charades.append(f"{video_id} {start:.1f} {end:.1f}##the {colour} {kind} appears.\n")
    write_jsonl(folder / f"{split}.jsonl", records)
    (folder / f"charades_sta_{split}.txt").write_text("".join(charades), encoding="utf-8")


def overlaps(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> bool:
    """Whether boxes ``[x1, y1, x2, y2)`` (pixels) share a pixel."""
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


DIRECTIONS: dict[str, tuple[int, int]] = {
    "left": (-1, 0),
    "right": (1, 0),
    "up": (0, -1),
    "down": (0, 1),
}


def write_video_direction(folder: Path, split: str, n: int, rng: np.random.Generator) -> None:
    """``video_direction``: 64×64 px clips, 4 s at 6 fps; a shape (side 12–16 px) moves 1 or
    2 px per frame in one direction (23 or 46 px in all); half the clips add a static shape of
    another colour away from the moving shape's path."""
    (folder / "videos").mkdir(exist_ok=True)
    fps, duration, size = 6, 4, VIDEO_SIZE
    n_frames = fps * duration
    records, video_r1 = [], []
    for i, direction in enumerate(balanced(rng, list(DIRECTIONS), n)):
        colour = list(COLOURS)[int(rng.integers(0, len(COLOURS)))]
        kind = KINDS[int(rng.integers(0, len(KINDS)))]
        side = int(rng.integers(12, 17))
        step = int(rng.integers(1, 3))  # px per frame
        travel = step * (n_frames - 1)
        dx, dy = DIRECTIONS[direction]
        along = int(rng.integers(1, size - side - travel))  # where the path starts on its axis
        across = int(rng.integers(1, size - side))
        if dx:
            x_start = along if dx > 0 else size - side - along
            path = [(x_start + dx * step * f, across) for f in range(n_frames)]
        else:
            y_start = along if dy > 0 else size - side - along
            path = [(across, y_start + dy * step * f) for f in range(n_frames)]
        base = background(rng, size, size)
        if rng.random() < 0.5:  # a static distractor of another colour, 2 px off the path
            swept = (
                min(x for x, _ in path) - 2,
                min(y for _, y in path) - 2,
                max(x for x, _ in path) + side + 2,
                max(y for _, y in path) + side + 2,
            )
            other_side = int(rng.integers(12, 17))
            for _ in range(100):
                ox, oy = (int(v) for v in rng.integers(1, size - other_side, size=2))
                if not overlaps((ox, oy, ox + other_side, oy + other_side), swept):
                    other = [c for c in COLOURS if c != colour][int(rng.integers(0, 3))]
                    mask = shape_mask(
                        KINDS[int(rng.integers(0, 4))], ox, oy, other_side, size, size
                    )
                    base[mask] = colour_value(other, rng)
                    break
        fill = colour_value(colour, rng)
        frames = np.repeat(base[None], n_frames, axis=0)
        for f, (x0, y0) in enumerate(path):
            frames[f, shape_mask(kind, x0, y0, side, size, size)] = fill
        video_id = f"{split}-{i:04d}"
        relative = f"videos/{video_id}.mp4"
        save_mp4(frames, fps, folder / relative)
        choices = [list(DIRECTIONS)[j] for j in rng.permutation(len(DIRECTIONS))]
        question = f"Which direction does the {colour} {kind} move?"
        meta = {
            "choices": choices,
            "duration": float(duration),
            "fps": fps,
            "frame_size": [size, size],
        }
        records.append(
            user_record(f"{folder.name}-{video_id}", "video", relative, question, direction, meta)
        )
        letters = "ABCD"
        video_r1.append(
            {
                "problem_id": i,
                "problem": question,
                "data_type": "video",
                "problem_type": "multiple choice",
                "options": [f"{letters[j]}. {c}" for j, c in enumerate(choices)],
                "solution": f"<answer>{letters[choices.index(direction)]}</answer>",
                "path": f"./{relative}",
                "data_source": f"mmrft/{folder.name}",
            }
        )
    write_jsonl(folder / f"{split}.jsonl", records)
    write_json(folder / f"video_r1_{split}.json", video_r1)


# -- audio -----------------------------------------------------------------------------------
def fade(n: int, ramp: int) -> Array:
    """Envelope of ``n`` samples: raised-cosine ramps of ``ramp`` samples in and out, 1 between."""
    envelope = np.ones(n)
    rise = 0.5 - 0.5 * np.cos(np.pi * (np.arange(ramp) + 0.5) / ramp)
    envelope[:ramp], envelope[n - ramp :] = rise, rise[::-1]
    return envelope


def noise_floor(rng: np.random.Generator, n: int) -> Array:
    """White Gaussian noise, standard deviation 0.003 of full scale (about −50 dBFS)."""
    return rng.normal(0.0, 0.003, size=n)


def write_audio_beeps(folder: Path, split: str, n: int, rng: np.random.Generator) -> None:
    """``audio_beeps``: 1.0–1.5 s at 16 kHz; 1–5 equal sine beeps (500–1500 Hz, 50–100 ms,
    amplitude 0.3–0.6, 5 ms ramps) at least 80 ms apart and 50 ms from the clip's ends."""
    (folder / "audio").mkdir(exist_ok=True)
    records = []
    for i, count in enumerate(balanced(rng, [1, 2, 3, 4, 5], n)):
        duration = round(float(rng.uniform(1.0, 1.5)), 1)  # s
        length = round(float(rng.uniform(0.05, 0.1)), 3)  # s per beep
        frequency = int(rng.integers(500, 1501))  # Hz
        amplitude = float(rng.uniform(0.3, 0.6))
        margin, gap = 0.05, 0.08  # s
        slack = duration - 2 * margin - count * length - (count - 1) * gap
        spare = slack * rng.dirichlet(np.ones(count + 1))
        onsets = [margin + float(spare[: j + 1].sum()) + j * (length + gap) for j in range(count)]
        samples = noise_floor(rng, round(duration * SAMPLE_RATE))
        beep_n = round(length * SAMPLE_RATE)
        t = np.arange(beep_n) / SAMPLE_RATE
        beep = amplitude * np.sin(2 * np.pi * frequency * t) * fade(beep_n, 80)
        beeps = []
        for onset in onsets:
            first = round(onset * SAMPLE_RATE)
            samples[first : first + beep_n] += beep
            beeps.append([round(first / SAMPLE_RATE, 4), round((first + beep_n) / SAMPLE_RATE, 4)])
        audio_id = f"{split}-{i:04d}"
        relative = f"audio/{audio_id}.wav"
        save_wav(samples, folder / relative)
        meta = {
            "count_range": [1, 5],
            "duration": duration,
            "sample_rate": SAMPLE_RATE,
            "beeps": beeps,
        }
        records.append(
            user_record(
                f"{folder.name}-{audio_id}",
                "audio",
                relative,
                "How many beeps are there?",
                count,
                meta,
            )
        )
    write_jsonl(folder / f"{split}.jsonl", records)


PITCH_OPTIONS = ("rising", "falling", "steady", "rising then falling")


def write_audio_pitch(folder: Path, split: str, n: int, rng: np.random.Generator) -> None:
    """``audio_pitch``: 1.0–1.2 s at 16 kHz; one exponential sweep between f and r·f
    (f 250–500 Hz, r 2–3), rising or falling, amplitude 0.3–0.5, 20 ms ramps."""
    (folder / "audio").mkdir(exist_ok=True)
    records, r1_aqa, mmau = [], [], []
    question = "How does the pitch of the tone change?"
    for i, contour in enumerate(balanced(rng, ["rising", "falling"], n)):
        duration = round(float(rng.uniform(1.0, 1.2)), 1)  # s
        low = float(rng.uniform(250.0, 500.0))  # Hz
        ratio = float(rng.uniform(2.0, 3.0))
        start, end = (low, low * ratio) if contour == "rising" else (low * ratio, low)
        amplitude = float(rng.uniform(0.3, 0.5))
        n_samples = round(duration * SAMPLE_RATE)
        t = np.arange(n_samples) / SAMPLE_RATE
        k = end / start  # f(t) = start · k^(t / duration); the phase is its integral
        phase = 2 * np.pi * start * duration / np.log(k) * (k ** (t / duration) - 1)
        tone = amplitude * np.sin(phase) * fade(n_samples, 320)
        samples = tone + noise_floor(rng, n_samples)
        audio_id = f"{split}-{i:04d}"
        relative = f"audio/{audio_id}.wav"
        save_wav(samples, folder / relative)
        choices = [PITCH_OPTIONS[j] for j in rng.permutation(len(PITCH_OPTIONS))]
        meta = {
            "choices": choices,
            "duration": duration,
            "sample_rate": SAMPLE_RATE,
            "start_hz": round(start, 1),
            "end_hz": round(end, 1),
        }
        records.append(
            user_record(f"{folder.name}-{audio_id}", "audio", relative, question, contour, meta)
        )
        r1_aqa.append(
            {
                "id": i,
                "question_text": question,
                "multi_choice": choices,
                "answer": choices.index(contour),
                "dataset_name": "AVQA",
                "audio_path": relative,
            }
        )
        mmau.append(
            {
                "id": f"{folder.name}-{audio_id}",
                "audio_id": f"./{relative}",
                "question": question,
                "choices": choices,
                "answer": contour,
                "dataset": f"mmrft/{folder.name}",
                "task": "sound",
                "split": "test-mini",
                "category": "Information Extraction",
                "sub-category": "Pitch Contour",
                "difficulty": "easy",
            }
        )
    write_jsonl(folder / f"{split}.jsonl", records)
    write_jsonl(folder / f"r1_aqa_{split}.jsonl", r1_aqa)
    if split == "test":
        write_json(folder / "mmau_test.json", mmau)


# -- zoom benchmarks ("looking closer": crop / zoom tool rollouts) -----------------------------
ZOOM_SIDES = (1024, 1536)  # px, range of each side of a zoom_marks image
ZOOM_RING = (16, 20)  # px, range of the ring mark's outer diameter
ZOOM_GAP = 0.64  # the dark gap's diameter / the ring's outer diameter
ZOOM_DOT = 0.44  # the centre dot's diameter / the ring's outer diameter (7–8.8 px)
ZOOM_CELL_GREYS = (200, 208, 216, 224, 232)  # background cells: few grays keep the PNG 4-bit
ZOOM_DISC_GREYS = (100, 130, 160)  # neutral distractor discs
ZOOM_GAP_GREY = 40
ZOOM_QUESTION = "What colour is the dot in the middle of the small ring?"
ZOOM_VIDEO_FPS = 20  # frames/s stored
ZOOM_VIDEO_SIZE = 112  # px, square frames
# Uniform samplings the flash avoids: 8 frames (the tiny video recipes, configs/learn/video_*.yaml)
# and 16 (mmrft.data.video.VideoBudget's default at 2 fps, Video-R1's training setting).
ZOOM_VIDEO_BASE_FRAMES = (8, 16)
ZOOM_VIDEO_QUESTION = "What colour is the dot that flashes briefly at about {time:.1f} s?"
ZOOM_VIDEO_DISC = (40, 56)  # px, the flashing disc's diameter (of 112: 20–28 px at 56 × 56)
ZOOM_VIDEO_EDGE = 1.2  # s, the flash starts this far from the clip's ends: [t, t + 1] fits


def draw_disc(image: Array, cx: float, cy: float, diameter: float, rgb: Array) -> list[int]:
    """Fill the disc of ``diameter`` px centred at ``(cx, cy)`` px with ``rgb`` (pixel-centre
    test over the disc's window only; the disc must lie inside ``image``). Returns its tight
    box ``[x1, y1, x2, y2]`` in pixels, ``x2``/``y2`` exclusive."""
    r = diameter / 2
    x0, y0 = int(np.floor(cx - r)), int(np.floor(cy - r))
    x1, y1 = int(np.ceil(cx + r)), int(np.ceil(cy + r))
    ys, xs = np.mgrid[y0:y1, x0:x1]
    mask = (xs + 0.5 - cx) ** 2 + (ys + 0.5 - cy) ** 2 <= r**2
    image[y0:y1, x0:x1][mask] = rgb
    bx1, by1, bx2, by2 = tight_box(mask)
    return [bx1 + x0, by1 + y0, bx2 + x0, by2 + y0]


def guillotine(
    rng: np.random.Generator, width: int, height: int, min_side: int, max_side: int
) -> list[tuple[int, int, int, int]]:
    """Cut a ``width × height`` px canvas into rectangles ``(x1, y1, x2, y2)`` (exclusive
    ends) by random straight cuts across the longer side, until each is at most ``max_side``
    px (then kept with probability 1/2 per round) or too short to cut into two of at least
    ``min_side`` px. Needs ``max_side ≥ 2·min_side``."""
    cells, stack = [], [(0, 0, width, height)]
    while stack:
        x1, y1, x2, y2 = stack.pop()
        longest = max(x2 - x1, y2 - y1)
        if longest < 2 * min_side or (longest <= max_side and rng.random() < 0.5):
            cells.append((x1, y1, x2, y2))
        elif x2 - x1 >= y2 - y1:
            cut = int(rng.integers(x1 + min_side, x2 - min_side + 1))
            stack += [(x1, y1, cut, y2), (cut, y1, x2, y2)]
        else:
            cut = int(rng.integers(y1 + min_side, y2 - min_side + 1))
            stack += [(x1, y1, x2, cut), (x1, cut, x2, y2)]
    return cells


def neutral_canvas(
    rng: np.random.Generator,
    width: int,
    height: int,
    cells: tuple[int, int],
    discs: int,
    disc_sizes: tuple[int, int],
) -> Array:
    """Mild neutral clutter, ``(height, width, 3)`` uint8: the canvas cut into rectangles
    (:func:`guillotine` with sides ``cells`` px) of light grays (``ZOOM_CELL_GREYS``), then
    ``discs`` darker gray discs (``ZOOM_DISC_GREYS``, diameters ``disc_sizes`` px) at random
    positions. No colour anywhere: only the mark is saturated."""
    image = np.empty((height, width, 3), dtype=np.uint8)
    for x1, y1, x2, y2 in guillotine(rng, width, height, *cells):
        image[y1:y2, x1:x2] = ZOOM_CELL_GREYS[int(rng.integers(0, len(ZOOM_CELL_GREYS)))]
    for _ in range(discs):
        diameter = int(rng.integers(disc_sizes[0], disc_sizes[1] + 1))
        cx = float(rng.uniform(diameter, width - diameter))
        cy = float(rng.uniform(diameter, height - diameter))
        grey = ZOOM_DISC_GREYS[int(rng.integers(0, len(ZOOM_DISC_GREYS)))]
        draw_disc(image, cx, cy, diameter, np.full(3, grey, dtype=np.uint8))
    return image


def write_zoom_marks(folder: Path, split: str, n: int, rng: np.random.Generator) -> None:
    """``zoom_marks``: images of 1024–1536 px per side (each side drawn apart) with neutral
    clutter (:func:`neutral_canvas`: cells 200–800 px, 40 discs of 8–40 px) and one mark at a
    random position (≥ its diameter + 4 px from the edges, so a crop twice its size fits): a
    ring of outer diameter 16–20 px in a random one of the 4 colours, a dark gap, and a centre
    dot (0.44 × the diameter, 7–8.8 px) of the asked colour (jittered ±15 per channel; targets
    balanced, the ring's colour drawn independently, so it says nothing about the dot's)."""
    (folder / "images").mkdir(exist_ok=True)
    colours = list(COLOURS)
    records = []
    for i, colour in enumerate(balanced(rng, colours, n)):
        width, height = (int(v) for v in rng.integers(ZOOM_SIDES[0], ZOOM_SIDES[1] + 1, size=2))
        image = neutral_canvas(rng, width, height, (200, 800), 40, (8, 40))
        diameter = int(rng.integers(ZOOM_RING[0], ZOOM_RING[1] + 1))
        margin = diameter + 4
        cx = float(rng.uniform(margin, width - margin))
        cy = float(rng.uniform(margin, height - margin))
        ring = colours[int(rng.integers(0, len(colours)))]
        box = draw_disc(image, cx, cy, diameter, colour_value(ring, rng))
        draw_disc(image, cx, cy, ZOOM_GAP * diameter, np.full(3, ZOOM_GAP_GREY, dtype=np.uint8))
        dot = draw_disc(image, cx, cy, ZOOM_DOT * diameter, colour_value(colour, rng))
        relative = f"images/{split}-{i:04d}.png"
        save_png(image, folder / relative)
        meta = {
            "choices": colours,
            "image_size": [width, height],
            "target_box": box,
            "dot_box": dot,
            "ring_colour": ring,
        }
        records.append(
            user_record(
                f"{folder.name}-{split}-{i:04d}", "image", relative, ZOOM_QUESTION, colour, meta
            )
        )
    write_jsonl(folder / f"{split}.jsonl", records)


# zoom_sites: the region to zoom into is plain at the base view, the detail in it is not.
ZOOM_SITES_SIZE = 840  # px, square images: 56×56 at the tiny recipe's 3136-pixel budget
ZOOM_SITES_INPUT = 56  # px, the side of that base view (Qwen2.5-VL's input frame)
ZOOM_SITES_BOXES = tuple(
    (x, y, x + 2, y + 2) for y in (13, 41) for x in (13, 41)
)  # input px: the four sites' crops, one in each quadrant (15 original px per input px)
ZOOM_SITES_QUADRANT_GREYS = (236, 212, 188, 164)  # top left, top right, bottom left, bottom right
ZOOM_SITES_DISC = 270  # px, the dark disc that marks the site (18 px of the base view)
ZOOM_SITES_DISC_GREY = 60
ZOOM_SITES_DISC_SHIFT = 40  # px, the disc's centre within ± this of its site's centre
ZOOM_SITES_RING = (18, 20)  # px, the mark's ring, outer diameter
ZOOM_SITES_HOLE = 0.65  # the ring's inner diameter / its outer diameter
ZOOM_SITES_DOT = 0.55  # the centre dot's diameter / the ring's outer diameter (9.9–11 px)
ZOOM_SITES_SHIFT = 4  # px, the mark's centre within ± this of its site's centre


def zoom_sites_box(site: int) -> list[int]:
    """Site ``site``'s (0–3: top left, top right, bottom left, bottom right) crop in pixels of
    the original image, ``[x1, y1, x2, y2]`` (30 px a side: ``ZOOM_SITES_BOXES`` × 15)."""
    scale = ZOOM_SITES_SIZE // ZOOM_SITES_INPUT
    return [v * scale for v in ZOOM_SITES_BOXES[site]]


def write_zoom_sites(folder: Path, split: str, n: int, rng: np.random.Generator) -> None:
    """``zoom_sites``: 840×840 px images whose quadrants have their own gray
    (``ZOOM_SITES_QUADRANT_GREYS``: a coordinate code for the tiny model, whose rotary
    positions barely tell its 4 visual tokens apart) under neutral clutter (40 gray discs of
    8–40 px), with a dark disc (270 px, gray 60) over one of four fixed sites, one per
    quadrant (sites balanced), and on it, within ±4 px of the site's centre, a mark as
    ``zoom_marks``'s: a ring (outer diameter 18–20 px, inner 0.65 of it) of a random one of
    the 4 colours around a centre dot (0.55 of the diameter, 9.9–11 px) of the asked colour
    (targets balanced, the ring's colour independent of it). At the tiny recipe's base view
    (56×56 px, 15 px per input pixel) the disc is 18 px wide and the dot 0.7 px under its
    ring's colour; ``meta.zoom_box``, the site's 30-px square (2 input pixels), resized to the
    same view, shows the dot 18–21 px wide in a 34–37 px ring. ``meta.target_box`` is the
    ring's tight box, ``meta.dot_box`` the dot's, ``meta.site`` 0–3 (top left, top right,
    bottom left, bottom right), ``meta.zoom_choices`` the four sites' squares (where a
    ``warm_start.calls: random`` demonstration crops: one of them at random), all boxes
    ``[x1, y1, x2, y2]`` in original pixels."""
    (folder / "images").mkdir(exist_ok=True)
    colours = list(COLOURS)
    size = ZOOM_SITES_SIZE
    records = []
    # (colour, site) pairs in an order whose every run of 4 has each colour and each site once
    pairs = [(colours[k % 4], (k + k // 4) % 4) for k in range(16)]
    for i, (colour, site) in enumerate(balanced(rng, pairs, n)):
        image = np.empty((size, size, 3), dtype=np.uint8)
        half = size // 2
        for quadrant, grey in enumerate(ZOOM_SITES_QUADRANT_GREYS):
            top, left = quadrant // 2 * half, quadrant % 2 * half
            image[top : top + half, left : left + half] = grey
        for _ in range(40):  # neutral clutter: gray discs of 8–40 px
            diameter = int(rng.integers(8, 41))
            x, y = (float(v) for v in rng.uniform(diameter, size - diameter, 2))
            disc_grey = ZOOM_DISC_GREYS[int(rng.integers(0, len(ZOOM_DISC_GREYS)))]
            draw_disc(image, x, y, diameter, np.full(3, disc_grey, dtype=np.uint8))
        x1, y1, x2, y2 = zoom_sites_box(site)
        sx, sy = (x1 + x2) / 2, (y1 + y2) / 2
        dx, dy = (float(v) for v in rng.uniform(-ZOOM_SITES_DISC_SHIFT, ZOOM_SITES_DISC_SHIFT, 2))
        grey = np.full(3, ZOOM_SITES_DISC_GREY, dtype=np.uint8)
        draw_disc(image, sx + dx, sy + dy, ZOOM_SITES_DISC, grey)
        cx, cy = (float(v) for v in rng.uniform(-ZOOM_SITES_SHIFT, ZOOM_SITES_SHIFT, 2))
        cx, cy = sx + cx, sy + cy
        diameter = int(rng.integers(ZOOM_SITES_RING[0], ZOOM_SITES_RING[1] + 1))
        ring = colours[int(rng.integers(0, len(colours)))]
        box = draw_disc(image, cx, cy, diameter, colour_value(ring, rng))
        draw_disc(image, cx, cy, ZOOM_SITES_HOLE * diameter, grey)
        dot = draw_disc(image, cx, cy, ZOOM_SITES_DOT * diameter, colour_value(colour, rng))
        relative = f"images/{split}-{i:04d}.png"
        save_png(image, folder / relative)
        meta = {
            "choices": colours,
            "image_size": [size, size],
            "target_box": box,
            "dot_box": dot,
            "zoom_box": [x1, y1, x2, y2],
            "zoom_choices": [zoom_sites_box(k) for k in range(4)],
            "site": site,
            "ring_colour": ring,
        }
        records.append(
            user_record(
                f"{folder.name}-{split}-{i:04d}", "image", relative, ZOOM_QUESTION, colour, meta
            )
        )
    write_jsonl(folder / f"{split}.jsonl", records)


def uniform_frame_indices(total_frames: int, frames: int) -> list[int]:
    """The ``frames`` frame indices spread uniformly over ``[0, total_frames − 1]`` that
    qwen-vl-utils and :func:`mmrft.data.video.frame_indices` sample (``linspace``, rounded)."""
    return [int(i) for i in np.round(np.linspace(0, total_frames - 1, frames))]


def clear_starts(
    earliest: int, latest: int, end: int, length: int, shortest: int, sampled: set[int]
) -> tuple[list[int], int]:
    """(starts, length) of a flash of ``length`` frames: the starts ``f`` in
    ``[earliest, latest]`` with the flash ending by frame ``end`` (``f + length ≤ end``) whose
    frames ``f … f + length − 1`` keep one frame clear of every ``sampled`` frame index on
    each side; the length shortened by one frame while none fits, down to ``shortest`` (then
    possibly no start)."""
    while True:
        candidates = range(earliest, min(latest, end - length) + 1)
        starts = [f for f in candidates if not any(f - 1 <= s <= f + length for s in sampled)]
        if starts or length == shortest:
            return starts, length
        length -= 1


def write_zoom_video(folder: Path, split: str, n: int, rng: np.random.Generator) -> None:
    """``zoom_video``: 112×112 px clips of 8, 9 or 10 s at 20 fps over a static neutral
    background (:func:`neutral_canvas`: cells 16–64 px, 6 discs of 6–14 px); a disc of
    40–56 px in one of the 4 colours (targets balanced) flashes on 6–10 frames (0.3–0.5 s)
    at a random position. The flash lies between the frames of the 8- and the 16-frame
    uniform samplings (:func:`uniform_frame_indices`) with at least one frame to spare on
    each side and starting ``ZOOM_VIDEO_EDGE`` = 1.2 s or more from either end of the clip, its
    start drawn uniformly among such places (the length drawn again, one frame shorter, while
    none fits): sampled at either count, it is never seen.

    The question states the time ``t`` = the flash's start rounded to 0.1 s
    (``meta.asked_time``; ``|t − start| ≤ 0.05`` s), and ``meta.zoom_span`` is the window
    ``[t, t + 1]`` s (what the question lets a policy find: the scripted warm-start call
    fetches it; ``t + 1`` is the one sum a byte-level model writes by changing one digit). It
    lies in the clip and holds the flash but at most its first frame, and 2–4 of the 8 frames
    ``video_frames`` samples over it show the flash.

    Why these sizes, measured (2026-11-30, 2-core AMD EPYC; the tiny Qwen2.5-VL of
    ``configs/tools/zoom_video.yaml`` trained single-turn by RL, 600 steps, on clips cut from
    the videos, 8 frames at 56 × 56): with a 20–28 px disc it stayed at 0.28–0.32 held-out
    whether the clip was the 2-s window ``[t − 1, t + 1]``, a 1-s one or the flash's frames
    alone, and 0.30 on one flash frame as an image; with a 40–56 px disc it read the flash's
    frames alone at 1.00 from step 200 and a 1-s window from the flash's start at 1.00 from
    step 400, but the 2-s window not at all (0.26 at step 600: the flash on 1–2 of 8 frames)."""
    (folder / "videos").mkdir(exist_ok=True)
    fps, size = ZOOM_VIDEO_FPS, ZOOM_VIDEO_SIZE
    colours = list(COLOURS)
    edge = round(ZOOM_VIDEO_EDGE * fps)  # frames
    records = []
    for i, colour in enumerate(balanced(rng, colours, n)):
        duration = int(rng.integers(8, 11))  # s
        n_frames = duration * fps
        base = neutral_canvas(rng, size, size, (16, 64), 6, (6, 14))
        length = int(rng.integers(6, 11))  # frames
        sampled = {i for k in ZOOM_VIDEO_BASE_FRAMES for i in uniform_frame_indices(n_frames, k)}
        starts, length = clear_starts(edge, n_frames - edge, n_frames, length, 6, sampled)
        first = starts[int(rng.integers(0, len(starts)))]
        diameter = int(rng.integers(ZOOM_VIDEO_DISC[0], ZOOM_VIDEO_DISC[1] + 1))
        cx, cy = (float(v) for v in rng.uniform(diameter / 2 + 2, size - diameter / 2 - 2, 2))
        flash = base.copy()
        box = draw_disc(flash, cx, cy, diameter, colour_value(colour, rng))
        frames = np.repeat(base[None], n_frames, axis=0)
        frames[first : first + length] = flash
        video_id = f"{split}-{i:04d}"
        relative = f"videos/{video_id}.mp4"
        save_mp4(frames, fps, folder / relative)
        asked = round(first / fps, 1)
        meta = {
            "choices": colours,
            "duration": float(duration),
            "fps": fps,
            "frame_size": [size, size],
            "target_span": [round(first / fps, 3), round((first + length) / fps, 3)],
            "target_box": box,
            "asked_time": asked,
            "zoom_span": [asked, round(asked + 1.0, 1)],
        }
        question = ZOOM_VIDEO_QUESTION.format(time=asked)
        records.append(
            user_record(f"{folder.name}-{video_id}", "video", relative, question, colour, meta)
        )
    write_jsonl(folder / f"{split}.jsonl", records)


# zoom_slots: zoom_sites in time. The slot to fetch is plain at the base view (8 uniform
# frames), the flash in it is not.
ZOOM_SLOTS_SECONDS = 8  # s, every clip: 4 slots of 2 s
ZOOM_SLOTS_BASE_FRAMES = 8  # the tiny recipe's uniform sampling: 2 frames a slot, 1 temporal patch
ZOOM_SLOTS_GREYS = (
    236,
    212,
    188,
    164,
)  # each slot's background gray: a time code, as the quadrants'
ZOOM_SLOTS_MARKER = 84  # px, the dark disc shown through the marked slot (42 px of the base view)
ZOOM_SLOTS_MARKER_GREY = 60
ZOOM_SLOTS_STARTS = (0.1, 2.4, 4.7, 6.9)  # s, each slot's 1-s window, between its 2 base frames
ZOOM_SLOTS_CUT = 2  # frames: the flash ends 0–2 frames before its window's last clear frame
ZOOM_SLOTS_QUESTION = "What colour is the dot that flashes briefly on the dark disc?"


def zoom_slots_span(slot: int) -> list[float]:
    """Slot ``slot``'s (0–3) window to fetch, ``[start, start + 1]`` s with ``start`` =
    ``ZOOM_SLOTS_STARTS[slot]`` (0.1, 2.4, 4.7, 6.9): the 1 s between the slot's two frames of
    the 8-frame uniform sampling (frames 0 | 23, 45 | 68, 91 | 114, 136 | 159 of 160), where
    its flash always lies."""
    start = ZOOM_SLOTS_STARTS[slot]
    return [start, round(start + 1.0, 1)]


def write_zoom_slots(folder: Path, split: str, n: int, rng: np.random.Generator) -> None:
    """``zoom_slots``: 112×112 px clips of ``ZOOM_SLOTS_SECONDS`` = 8 s at 20 fps cut into
    four 2-s slots, each with its own background gray (``ZOOM_SLOTS_GREYS``: a time code for
    the tiny model, as zoom_sites' quadrants are a place code) under the same static gray
    clutter (12 discs of 6–14 px). A dark disc (84 px, gray 60, at a random place) stays on
    screen through one slot (slots balanced), and on it a disc of one of the 4 colours (40–56
    px, targets balanced) flashes through the slot's 1-s window (``meta.zoom_span`` =
    :func:`zoom_slots_span`, between the slot's two frames of the 8 uniformly sampled ones,
    :func:`uniform_frame_indices`): from the window's first frame to its last frame that keeps
    one frame clear of a sampled one, less 0–2 frames (``ZOOM_SLOTS_CUT``), 17–20 frames in
    all. The base view shows which slot holds the dark disc (it is on both of the slot's
    sampled frames, one temporal patch of Qwen2.5-VL) and never the flash; ``video_frames``
    over the window (8 frames, every 2.9 frames) shows it on its first 6–7 frames, at the same
    places for every slot. (The first version drew 6–10 frames anywhere in the slot's middle
    second, 2–4 of the fetched frames at a place that varied: the tiny reader did not learn to
    read it in 1,200 steps, while zoom_video's, whose flash always opens its window, did in
    860.) ``meta.zoom_choices`` the four slots' windows,
    ``meta.slot`` 0–3, ``meta.target_span`` the flash's ``[start, end]`` s (frames
    ``start·fps … end·fps − 1``), ``meta.target_box`` its box in frame pixels."""
    (folder / "videos").mkdir(exist_ok=True)
    fps, size = ZOOM_VIDEO_FPS, ZOOM_VIDEO_SIZE
    colours = list(COLOURS)
    n_frames = ZOOM_SLOTS_SECONDS * fps
    sampled = set(uniform_frame_indices(n_frames, ZOOM_SLOTS_BASE_FRAMES))
    slot_frames = n_frames // 4
    records = []
    pairs = [(colours[k % 4], (k + k // 4) % 4) for k in range(16)]  # as zoom_sites' pairs
    for i, (colour, slot) in enumerate(balanced(rng, pairs, n)):
        clutter = []  # (x, y, diameter, gray) of each clutter disc, the same in every slot
        for _ in range(12):
            diameter = int(rng.integers(6, 15))
            x, y = (float(v) for v in rng.uniform(diameter, size - diameter, 2))
            clutter.append((x, y, diameter, ZOOM_DISC_GREYS[int(rng.integers(0, 3))]))
        slots = []
        for grey in ZOOM_SLOTS_GREYS:
            frame = np.full((size, size, 3), grey, dtype=np.uint8)
            for x, y, diameter, disc_grey in clutter:
                draw_disc(frame, x, y, diameter, np.full(3, disc_grey, dtype=np.uint8))
            slots.append(frame)
        frames = np.repeat(np.stack(slots), slot_frames, axis=0)
        first, end = (round(v * fps) for v in zoom_slots_span(slot))  # frames first … end
        starts, longest = clear_starts(first, first, end + 1, end + 1 - first, 1, sampled)
        assert starts == [first], (slot, starts)  # ZOOM_SLOTS_STARTS opens clear of the base
        length = longest - int(rng.integers(0, ZOOM_SLOTS_CUT + 1))
        margin = ZOOM_SLOTS_MARKER / 2 + 2
        mx, my = (float(v) for v in rng.uniform(margin, size - margin, 2))
        marker = np.full(3, ZOOM_SLOTS_MARKER_GREY, dtype=np.uint8)
        for f in range(slot * slot_frames, (slot + 1) * slot_frames):
            draw_disc(frames[f], mx, my, ZOOM_SLOTS_MARKER, marker)
        diameter = int(rng.integers(ZOOM_VIDEO_DISC[0], ZOOM_VIDEO_DISC[1] + 1))
        rgb = colour_value(colour, rng)
        for f in range(first, first + length):
            box = draw_disc(frames[f], mx, my, diameter, rgb)
        video_id = f"{split}-{i:04d}"
        relative = f"videos/{video_id}.mp4"
        save_mp4(frames, fps, folder / relative)
        meta = {
            "choices": colours,
            "duration": float(ZOOM_SLOTS_SECONDS),
            "fps": fps,
            "frame_size": [size, size],
            "target_span": [round(first / fps, 3), round((first + length) / fps, 3)],
            "target_box": box,
            "zoom_span": zoom_slots_span(slot),
            "zoom_choices": [zoom_slots_span(k) for k in range(4)],
            "slot": slot,
        }
        records.append(
            user_record(
                f"{folder.name}-{video_id}", "video", relative, ZOOM_SLOTS_QUESTION, colour, meta
            )
        )
    write_jsonl(folder / f"{split}.jsonl", records)


# audio_zoom: "looking closer" in audio. The model's view of a long clip is cut to its first
# seconds (model.audio.max_seconds, policy truncate); the asked event comes later.
AUDIO_ZOOM_PITCHES: dict[str, float] = {
    "low": 300.0,
    "middle": 600.0,
    "high": 1200.0,
    "very high": 2400.0,
}
"""audio_zoom's classes (the order of ``meta.choices``) and their centre frequencies (Hz)."""
AUDIO_ZOOM_JITTER = 0.05  # a tone's frequency is its class's centre × [0.95, 1.05]
AUDIO_ZOOM_BASE_SECONDS = 2.0  # the base view (the recipe's max_seconds): the tone comes after
AUDIO_ZOOM_EARLIEST = 2.5  # s, the earliest onset (stated times are then ≥ 2.3 s)
AUDIO_ZOOM_TAIL = 1.3  # s, the latest onset's distance to the clip's end ([t − 1, t + 1] fits)
AUDIO_ZOOM_SAY = 0.2  # s, the stated time is round(onset + U(±this), 1): within ±0.25 s
AUDIO_ZOOM_KNOCK = 0.012  # s, a distractor knock: white noise decaying with τ = 2 ms
AUDIO_ZOOM_QUESTION = "What is the pitch of the short tone at about {time:.1f} s?"


def write_audio_zoom(folder: Path, split: str, n: int, rng: np.random.Generator) -> None:
    """``audio_zoom``: mono clips of 8.0–10.0 s at 16 kHz, FLAC (``audio/<id>.flac``). Digital
    silence, 1–2 knocks (``AUDIO_ZOOM_KNOCK``: 12 ms of white noise decaying with τ = 2 ms,
    amplitude 0.1–0.25, no pitch; starting on a 10 ms grid anywhere in ``[0.1, duration −
    0.2]`` s, the base view included, ≥ 0.5 s from the tone and 0.3 s from each other;
    ``meta.knocks`` their ``[start, end]`` s) and one tone: a sine
    (amplitude 0.15–0.3, random phase, 10 ms raised-cosine fades) of 0.20–0.40 s whose
    frequency is its class's centre (``AUDIO_ZOOM_PITCHES``) × 0.95–1.05 (targets balanced),
    starting on a 10 ms grid in ``[2.5, duration − 1.3]`` s: always after the base view (the
    first ``meta.base_seconds`` = 2.0 s, what a family keeps at ``max_seconds: 2.0`` under the
    truncate policy), and the window ``[t − 1, t + 1]`` around the stated time ``t`` lies in
    the clip and holds the whole tone. The question states ``t`` = the onset plus
    U(−0.2, 0.2) s, rounded to 0.1 s (``meta.asked_time``; ``|t − onset| ≤ 0.25`` s).
    ``meta.target_span`` the tone's ``[start, end]`` s, ``meta.frequency_hz``;
    ``meta.zoom_span`` the window ``[t − 1, t + 1]`` s (what the question lets a policy find:
    the scripted warm-start call fetches it).

    Why FLAC over silence (sizes measured with libsndfile 1.2.2 / libFLAC 1.4.3, level 8, per
    9 s clip): the other audio benchmarks' WAV is 288 KB (71 MB for 248 clips), and FLAC
    cannot shrink a noise floor: ``noise_floor``'s (σ = 0.003, about 98 LSB) costs 158 KB,
    even a 1-LSB one 40 KB and a 0.5-LSB one 27 KB (FLAC spends ≥ 1 bit per sample on any
    block that is not constant: 10 and 6.7 MB for 248 clips). Digital silence costs 0.5 KB,
    the tone 2.2–2.6 KB, a knock (one 4096-sample block) about 0.7 KB: about 4 KB per clip,
    1.18 MB for the folder, which fits beside the other bundled benchmarks (28.3 MB of
    ``tests/test_benchmarks.py``'s 30 MB). A lower stored rate (8 kHz, resampled by
    ``load_audio``) would save only about 20 % (FLAC's blocks, not the samples, dominate).
    So these clips, unlike the other audio benchmarks', have no noise floor: between the
    sounds the samples are exactly 0."""
    (folder / "audio").mkdir(exist_ok=True)
    choices = list(AUDIO_ZOOM_PITCHES)
    ramp = round(0.01 * SAMPLE_RATE)
    knock_n = round(AUDIO_ZOOM_KNOCK * SAMPLE_RATE)
    records = []
    for i, pitch in enumerate(balanced(rng, choices, n)):
        duration = round(float(rng.uniform(8.0, 10.0)), 1)  # s
        samples = np.zeros(round(duration * SAMPLE_RATE))
        latest = round((duration - AUDIO_ZOOM_TAIL) * 100)  # centiseconds
        onset_cs = int(rng.integers(round(AUDIO_ZOOM_EARLIEST * 100), latest + 1))
        length_cs = int(rng.integers(20, 41))  # centiseconds
        start, end = onset_cs / 100, (onset_cs + length_cs) / 100
        frequency = round(
            AUDIO_ZOOM_PITCHES[pitch]
            * float(rng.uniform(1 - AUDIO_ZOOM_JITTER, 1 + AUDIO_ZOOM_JITTER)),
            1,
        )
        amplitude = float(rng.uniform(0.15, 0.3))
        phase = float(rng.uniform(0.0, 2 * np.pi))
        tone_n = length_cs * SAMPLE_RATE // 100
        t = np.arange(tone_n) / SAMPLE_RATE
        first = onset_cs * SAMPLE_RATE // 100
        samples[first : first + tone_n] = (
            amplitude * np.sin(2 * np.pi * frequency * t + phase) * fade(tone_n, ramp)
        )
        knocks: list[list[float]] = []
        for _ in range(int(rng.integers(1, 3))):
            for _ in range(100):
                at = int(rng.integers(10, round((duration - 0.2) * 100) + 1)) / 100
                if at + AUDIO_ZOOM_KNOCK > start - 0.5 and at < end + 0.5:
                    continue
                if any(abs(at - k) < 0.3 for k, _ in knocks):
                    continue
                decay = np.exp(-np.arange(knock_n) / (0.002 * SAMPLE_RATE))
                burst = float(rng.uniform(0.1, 0.25)) * decay * rng.normal(0.0, 1.0, knock_n)
                k0 = round(at * SAMPLE_RATE)
                samples[k0 : k0 + knock_n] += burst
                knocks.append([at, round(at + AUDIO_ZOOM_KNOCK, 3)])
                break
        asked = round(start + float(rng.uniform(-AUDIO_ZOOM_SAY, AUDIO_ZOOM_SAY)), 1)
        audio_id = f"{split}-{i:04d}"
        relative = f"audio/{audio_id}.flac"
        save_flac(samples, folder / relative)
        meta = {
            "choices": choices,
            "duration": duration,
            "sample_rate": SAMPLE_RATE,
            "base_seconds": AUDIO_ZOOM_BASE_SECONDS,
            "target_span": [start, end],
            "frequency_hz": frequency,
            "asked_time": asked,
            "zoom_span": [round(asked - 1.0, 1), round(asked + 1.0, 1)],
            "knocks": sorted(knocks),
        }
        question = AUDIO_ZOOM_QUESTION.format(time=asked)
        records.append(
            user_record(f"{folder.name}-{audio_id}", "audio", relative, question, pitch, meta)
        )
    write_jsonl(folder / f"{split}.jsonl", records)


GRID = 3
"""Side of a grid_walk grid (cells)."""
GRID_MOVES = {"up": (0, -1), "down": (0, 1), "left": (-1, 0), "right": (1, 0)}
"""grid_walk's moves (``tools/grid.py``), in the order of ``meta.choices``."""


def write_grid_walk(folder: Path, split: str, n: int, rng: np.random.Generator) -> None:
    """``grid_walk``: episodes of the ``grid_walk`` environment (``tools/grid.py``), text
    records whose ``meta`` names the start: a 3 × 3 grid, ``walker`` and ``goal`` cells
    (``[column, row]``) at a shortest walk of 1, 2 or 3 moves (balanced), ``shortest``; the
    target an optimal first move (one of two at random when both axes differ), ``meta.choices``
    the four directions."""
    distances = balanced(rng, [1, 2, 3], n)
    cells = [(x, y) for x in range(GRID) for y in range(GRID)]
    records = []
    for i, distance in enumerate(distances):
        pairs = [
            (a, b) for a in cells for b in cells if abs(a[0] - b[0]) + abs(a[1] - b[1]) == distance
        ]
        walker, goal = pairs[int(rng.integers(len(pairs)))]
        dx, dy = goal[0] - walker[0], goal[1] - walker[1]
        moves = [
            d for d, (sx, sy) in GRID_MOVES.items() if (sx and sx * dx > 0) or (sy and sy * dy > 0)
        ]
        target = moves[int(rng.integers(len(moves)))]
        text = (
            "The image shows a grid. Move the red square onto the green square: each call of "
            "the move tool moves it one cell."
        )
        records.append(
            {
                "id": f"grid-{split}-{i:04d}",
                "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}],
                "target": target,
                "meta": {
                    "grid": GRID,
                    "walker": list(walker),
                    "goal": list(goal),
                    "shortest": distance,
                    "choices": list(GRID_MOVES),
                },
            }
        )
    write_jsonl(folder / f"{split}.jsonl", records)


# -- registry --------------------------------------------------------------------------------
Writer = Callable[[Path, str, int, np.random.Generator], None]


@dataclass(frozen=True)
class Benchmark:
    """A bundled benchmark: its seed, the task that reads it, the function that writes one split
    (``write(folder, split, n, rng)``) and the number of samples per split."""

    seed: int
    task: str
    write: Writer
    splits: dict[str, int] = field(default_factory=lambda: dict(SPLITS))


BENCHMARKS: dict[str, Benchmark] = {
    "shapes_colour": Benchmark(101, "classification", write_images(make_colour)),
    "shapes_kind": Benchmark(102, "classification", write_images(make_kind)),
    "shapes_counting": Benchmark(103, "counting", write_images(make_counting)),
    "shapes_grounding": Benchmark(104, "grounding", write_images(make_grounding)),
    "shapes_detection": Benchmark(105, "detection", write_detection),
    "charts": Benchmark(106, "chart_qa", write_charts, {"train": 300, "test": 100}),
    "video_temporal": Benchmark(
        107, "temporal_grounding", write_video_temporal, {"train": 400, "test": 100}
    ),
    "video_direction": Benchmark(
        108, "classification", write_video_direction, {"train": 320, "test": 80}
    ),
    "audio_beeps": Benchmark(109, "counting", write_audio_beeps, {"train": 80, "test": 40}),
    "audio_pitch": Benchmark(110, "classification", write_audio_pitch, {"train": 64, "test": 32}),
    "zoom_marks": Benchmark(111, "classification", write_zoom_marks, {"train": 400, "test": 100}),
    "zoom_video": Benchmark(112, "video_qa", write_zoom_video, {"train": 200, "test": 50}),
    "zoom_sites": Benchmark(113, "classification", write_zoom_sites, {"train": 400, "test": 112}),
    "zoom_slots": Benchmark(116, "video_qa", write_zoom_slots, {"train": 200, "test": 64}),
    "grid_walk": Benchmark(114, "classification", write_grid_walk, {"train": 600, "test": 150}),
    "audio_zoom": Benchmark(115, "classification", write_audio_zoom, {"train": 200, "test": 48}),
}


def generate(name: str, out: Path, splits: list[str] | None = None) -> None:
    """Write benchmark ``name`` to ``out/<name>/``: every split (replacing the folder), or only
    ``splits`` into the existing folder. Each split draws from its own seed
    ``[benchmark.seed, split index]``, so one split regenerates alone."""
    benchmark = BENCHMARKS[name]
    folder = out / name
    if splits is None and folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for split_index, (split, n) in enumerate(benchmark.splits.items()):
        if splits is None or split in splits:
            benchmark.write(folder, split, n, np.random.default_rng([benchmark.seed, split_index]))


# -- checking --------------------------------------------------------------------------------
def same_video(a: Path, b: Path, tolerance: float = 1.0) -> bool:
    """Same frame count, size and timestamps, and every frame's mean absolute difference (grey
    levels, 0–255) at most ``tolerance``: exact with the same x264, close with another."""
    frames_a, times_a, fps_a = read_mp4(a)
    frames_b, times_b, fps_b = read_mp4(b)
    if frames_a.shape != frames_b.shape or times_a != times_b or fps_a != fps_b:
        return False
    diff = np.abs(frames_a.astype(np.int16) - frames_b.astype(np.int16))
    return bool(diff.reshape(len(diff), -1).mean(axis=1).max() <= tolerance)


def same_audio(a: Path, b: Path) -> bool:
    """Same sample rate and length, samples within ±1 LSB (WAV or FLAC)."""
    samples_a, rate_a = read_pcm(a)
    samples_b, rate_b = read_pcm(b)
    if rate_a != rate_b or samples_a.shape != samples_b.shape:
        return False
    return bool(np.abs(samples_a.astype(np.int32) - samples_b.astype(np.int32)).max() <= 1)


def differences(expected: Path, actual: Path, partial: bool = False) -> list[str]:
    """Files that differ between two benchmark folders: PNG by decoded pixels, MP4 by decoded
    frames, WAV and FLAC by samples (see the module docstring), everything else by bytes. With
    ``partial``, only the files present in ``actual`` (a regenerated subset) are compared."""
    names = {p.relative_to(actual) for p in actual.rglob("*") if p.is_file()}
    if not partial:
        names |= {p.relative_to(expected) for p in expected.rglob("*") if p.is_file()}
    out = []
    for name in sorted(names):
        a, b = expected / name, actual / name
        if not (a.is_file() and b.is_file()):
            out.append(
                f"{name}: only in {'the committed files' if a.is_file() else 'the new files'}"
            )
        elif name.suffix == ".png":
            with Image.open(a) as ia, Image.open(b) as ib:
                if ia.size != ib.size or ia.convert("RGB").tobytes() != ib.convert("RGB").tobytes():
                    out.append(f"{name}: pixels differ")
        elif name.suffix == ".mp4":
            if a.read_bytes() != b.read_bytes() and not same_video(a, b):
                out.append(f"{name}: frames differ")
        elif name.suffix in (".wav", ".flac"):
            if a.read_bytes() != b.read_bytes() and not same_audio(a, b):
                out.append(f"{name}: samples differ")
        elif a.read_bytes() != b.read_bytes():
            out.append(f"{name}: bytes differ")
    return out


def check(names: list[str], out: Path) -> list[str]:
    """Regenerate ``names`` in a temp dir and list differences from ``out``."""
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            generate(name, Path(tmp))
            problems += [f"{name}/{d}" for d in differences(out / name, Path(tmp) / name)]
    return problems


def folder_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="benchmarks folder")
    parser.add_argument("--only", nargs="+", choices=sorted(BENCHMARKS), help="benchmarks to make")
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    names = args.only or list(BENCHMARKS)
    if args.check:
        problems = check(names, args.out)
        for line in problems:
            print(line)
        print("unchanged" if not problems else f"{len(problems)} file(s) differ")
        return 1 if problems else 0
    for name in names:
        generate(name, args.out)
        print(f"{name}: {folder_size(args.out / name) / 1e6:.2f} MB")
    print(f"total: {folder_size(args.out) / 1e6:.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
