"""Video decoding, frame sampling and token budgets for Qwen-VL-style models.

A video part ``{"type": "video", "video": "/abs/clip.mp4"}`` (or a list of frame image paths)
becomes a ``[T, C, H, W]`` uint8 frame tensor plus the metadata the Hugging Face processor needs
to place the frames in time (mRoPE temporal positions, Qwen3-VL timestamps). The rules follow
qwen-vl-utils (``fetch_video``) so that a model sees what it was trained on:

* **Frames.** ``T = duration_s × fps`` clamped to ``[min_frames, max_frames]`` and to the number
  of frames in the file, rounded *down* to a multiple of the temporal patch size (2); at least 2
  (a 1-frame video is repeated). Frames are taken uniformly: indices
  ``linspace(0, total_frames − 1, T).round()``.
* **Sampled fps.** ``sample_fps = T / total_frames × native_fps`` (= ``T / duration_s``), exactly
  what transformers' ``VideoMetadata.sampled_fps`` computes from the metadata we hand it
  (``fps`` = native fps, ``total_num_frames``, ``frames_indices``), so Qwen2.5-VL's
  ``second_per_grid_ts = 2 / sample_fps`` and Qwen3-VL's frame timestamps
  (``frames_indices / fps``, in seconds) agree with the frames actually sampled.
* **Pixels.** Every frame is resized with qwen-vl-utils' ``smart_resize`` (sides multiples of
  ``factor = patch_size × merge_size``, area in ``[min_pixels, cap]``) with the per-frame cap
  ``min(max_pixels, total_pixels × 2 / T)`` (qwen-vl-utils' ``total_pixels`` rule), bicubic with
  antialiasing as qwen-vl-utils does. The processor is then told not to resize again.
* **Visual tokens.** ``T/2 × (H/factor) × (W/factor)`` per video (+ ``step_tokens`` of text per
  temporal step for Qwen3-VL's ``<t seconds>`` timestamps).

**Prompt budget** (:func:`fit_budget`). With ``max_prompt_tokens`` set, a video that would make
the prompt longer first gets a *lower fps* (fewer frames, down to ``min_frames``) and then
*fewer pixels per frame* (down to one ``factor × factor`` patch group, below ``min_pixels`` if it
must), instead of the prompt being truncated (which cuts visual tokens: "image features and
image tokens do not match") or the sample being dropped. Every reduction is reported: in the
returned :class:`BudgetFit`, in the frame metadata (``meta["fit"]``), as a log warning on decode
and in :func:`video_stats`. Only a prompt whose text alone leaves no room for
``min_frames / 2`` tokens raises :class:`~mmrft.data.DataError`.

**Decoders**, first usable one wins (``MMRFT_VIDEO_BACKEND`` or ``backend=`` forces one):

1. ``decord`` — pip wheel with FFmpeg bundled (nothing to apt-get), fast random access
   (``get_batch`` seeks to the sampled frames), the decoder Video-R1 and qwen-vl-utils were
   written against. x86-64 only and unmaintained, hence not the only option.
2. ``torchcodec`` — PyTorch's decoder, exact seeking, but it needs the system's FFmpeg shared
   libraries (``apt-get install ffmpeg``) and a build matching the installed torch, and
   importing it takes seconds; it is tried only when decord is missing or fails, and only when
   its FFmpeg libraries actually load.
3. ``pyav`` — pip wheel with FFmpeg bundled, always works, but decodes sequentially up to the
   last sampled frame (slower for long videos; memory stays bounded: only sampled frames are
   kept and each is resized as soon as it is decoded).

A backend that fails on a file hands over to the next one; when all fail the file is corrupt,
truncated or empty and :class:`~mmrft.data.DataError` names it. No backend ever decodes the whole
video into memory (the "host-RAM OOM with video" complaint): only the sampled frames are
decoded, each chunk is resized at once, and the decoded-frame cache (:class:`VideoCache`) is
bounded in **bytes**.

**Cache.** Decoded, resized frames are kept in a process-wide LRU cache keyed by the file
(path, mtime, size), the backend and the sampling decision (frame indices and size), so the G
completions of a GRPO group (and later epochs) decode a video once; :func:`decode_frames` decodes
given frame indices through such a cache (a tool fetching the same window for a whole group).
Cached tensors are shared: treat them as read-only.

**Frame lists.** ``{"type": "video", "video": ["f0.png", "f1.png", ...], "sample_fps": 2.0}``:
the list is a video whose native rate is ``sample_fps`` (qwen-vl-utils' key; default 2.0
frames/s) and goes through the same sampling, budget and resize rules. Frames are resized to the
size fitted for the first frame.

**Shuffled frames** (Video-R1's T-GRPO temporal contrast, arXiv:2503.21776). A video part
carrying ``"frame_shuffle_seed": <int>`` (:func:`with_shuffled_frames` adds it) is decoded,
sampled and resized exactly as without it, then its *whole frames* are permuted by
:func:`shuffled_order` (a pure function of the seed and the frame count, never the identity),
before the processor merges frames into temporal patches of 2, as Video-R1 does
(``video_inputs[0][torch.randperm(T)]``). Frame count, sizes, visual tokens and the metadata
handed to the processor are unchanged, so the temporal positions (Qwen2.5-VL's mRoPE time
steps, Qwen3-VL's timestamps) still run in order over frames that no longer do. The cache keeps
the ordered frames; the permuted copy is not cached.

**Hook for the Qwen-VL families.** :func:`process_vision_info` is a drop-in replacement for
qwen-vl-utils' function of that name: images go through qwen-vl-utils' ``fetch_image`` as
before, videos through :func:`read_video` with the family's :class:`VideoBudget`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import math
import os
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from mmrft.data.sample import (
    DataError,
    image_size,
    local_media_path,
    media_file_key,
    read_image,
)

log = logging.getLogger(__name__)

TEMPORAL_PATCH = 2
"""Frames merged into one temporal step by Qwen-VL vision towers (frames per step)."""

BACKENDS = ("decord", "torchcodec", "pyav")
"""Video decoders in order of preference (see the module docstring)."""

FRAME_LIST_FPS = 2.0
"""Default native rate (frames/s) of a video given as a list of frames (qwen-vl-utils' default)."""

SHUFFLE_KEY = "frame_shuffle_seed"
"""Video part key: permute the sampled frames with :func:`shuffled_order` of this seed."""

PERTURB_KEY = "media_perturb"
"""Video part key: distort the sampled frames (:func:`mmrft.rollout.perturb.distort_frames` of its
``kinds``, ``strength`` and ``seed``; NoisyRollout, :mod:`mmrft.rollout.perturb`)."""

# Part keys of qwen-vl-utils this module does not implement; refusing them beats ignoring them.
UNSUPPORTED_PART_KEYS = ("video_start", "video_end", "resized_height", "resized_width")

_STATS: Counter[str] = Counter()
_STATS_LOCK = threading.Lock()


def _count(key: str, n: int = 1) -> None:
    with _STATS_LOCK:
        _STATS[key] += n


def video_stats() -> dict[str, int]:
    """Counters since start-up: ``decoded`` (videos decoded), ``cache_hits``, ``fps_lowered`` and
    ``pixels_lowered`` (decoded videos the prompt budget reduced), ``decode_failures`` (a
    decoder failed on a file; the next one was tried)."""
    with _STATS_LOCK:
        return dict(_STATS)


# -- budgets ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class VideoBudget:
    """How much of a video a model sees.

    Attributes:
        fps: frames sampled per second of video (frames/s); qwen-vl-utils' and Video-R1's 2.0.
        min_frames: fewest frames per video (frames; rounded up to a multiple of 2).
        max_frames: most frames per video (frames; rounded down to a multiple of 2). Video-R1
            trains with 16.
        min_pixels: lower bound on the resized H·W of one frame (pixels); only the prompt budget
            may go below it.
        max_pixels: upper bound on the resized H·W of one frame (pixels); 100352 = 128·28·28 is
            Video-R1's training setting.
        total_pixels: bound on the pixels of the whole video counted per temporal step
            (``T/2 × H·W``, pixels) as in qwen-vl-utils, i.e. ``total_pixels / factor²`` visual
            tokens; per-frame cap ``total_pixels × 2 / T``. None = no bound.
        max_prompt_tokens: bound on the whole prompt (text + image + video tokens); videos that
            do not fit get fewer frames, then fewer pixels (see :func:`fit_budget`). None = no
            bound.
    """

    fps: float = 2.0
    min_frames: int = 4
    max_frames: int = 16
    min_pixels: int = 3136
    max_pixels: int = 100352
    total_pixels: int | None = None
    max_prompt_tokens: int | None = None

    def __post_init__(self) -> None:
        if not self.fps > 0:
            raise ValueError(f"video fps must be > 0, got {self.fps}")
        if self.min_frames < 1 or self.max_frames < TEMPORAL_PATCH:
            raise ValueError(
                f"video frames must satisfy min_frames ≥ 1 and max_frames ≥ {TEMPORAL_PATCH}, "
                f"got {self.min_frames}, {self.max_frames}"
            )
        if self.min_frames > self.max_frames:
            raise ValueError(f"min_frames ({self.min_frames}) > max_frames ({self.max_frames})")
        if not 0 < self.min_pixels <= self.max_pixels:
            raise ValueError(
                f"video pixels must satisfy 0 < min_pixels ≤ max_pixels, got "
                f"{self.min_pixels}, {self.max_pixels}"
            )
        if self.total_pixels is not None and self.total_pixels <= 0:
            raise ValueError(f"total_pixels must be > 0 or None, got {self.total_pixels}")
        if self.max_prompt_tokens is not None and self.max_prompt_tokens <= 0:
            raise ValueError(f"max_prompt_tokens must be > 0 or None, got {self.max_prompt_tokens}")

    def override(self, part: Mapping[str, Any]) -> VideoBudget:
        """This budget with a video part's own qwen-vl-utils keys applied: ``fps``,
        ``min_frames``, ``max_frames``, ``nframes`` (a fixed frame count), ``min_pixels``,
        ``max_pixels``, ``total_pixels``, ``max_prompt_tokens``. Keys this module does not
        implement (``video_start``, ``video_end``, ``resized_height``, ``resized_width``) raise
        ValueError rather than being ignored."""
        bad = [k for k in UNSUPPORTED_PART_KEYS if k in part]
        if bad:
            raise ValueError(
                f"video part keys {', '.join(bad)} are not supported by mmrft.data.video: cut or "
                "resize the clip beforehand, or bound it with fps / nframes / max_pixels"
            )
        if "fps" in part and "nframes" in part:
            raise ValueError("a video part takes either 'fps' or 'nframes', not both")
        changes: dict[str, Any] = {}
        for key in (
            "fps",
            "min_frames",
            "max_frames",
            "min_pixels",
            "max_pixels",
            "total_pixels",
            "max_prompt_tokens",
        ):
            if key in part and part[key] is not None:
                changes[key] = part[key]
        if "nframes" in part:
            n = max(TEMPORAL_PATCH, round(part["nframes"] / TEMPORAL_PATCH) * TEMPORAL_PATCH)
            changes.update(min_frames=n, max_frames=n)
        if not changes:
            return self
        if "min_pixels" in changes and "max_pixels" not in changes:
            changes["max_pixels"] = max(self.max_pixels, int(changes["min_pixels"]))
        if "max_pixels" in changes and "min_pixels" not in changes:
            changes["min_pixels"] = min(self.min_pixels, int(changes["max_pixels"]))
        return replace(self, **changes)


class VideoBudgetError(DataError):
    """A prompt whose text leaves no room for the video's fewest frames (names the file)."""


@dataclass(frozen=True)
class BudgetFit:
    """The sampling decision for one video.

    Unpacks as ``fps, pixels_per_frame = fit_budget(...)``.

    Attributes:
        fps: sampling rate (frames/s of video) that yields ``frames`` frames.
        pixels_per_frame: resized H·W of each frame (pixels).
        frames: sampled frames T (a multiple of 2).
        height, width: resized frame size (pixels; multiples of ``factor``).
        visual_tokens: tokens the video occupies in the prompt (``T/2 × H·W / factor²``, plus
            ``step_tokens`` per temporal step).
        requested_fps, requested_frames, requested_pixels: what the budget asked for before
            the prompt limit was applied.
        lowered_fps, lowered_pixels: whether ``max_prompt_tokens`` forced fewer frames / pixels.
    """

    fps: float
    pixels_per_frame: int
    frames: int
    height: int
    width: int
    visual_tokens: int
    requested_fps: float
    requested_frames: int
    requested_pixels: int
    lowered_fps: bool = False
    lowered_pixels: bool = False

    def __iter__(self) -> Iterator[float | int]:
        yield self.fps
        yield self.pixels_per_frame

    @property
    def reduced(self) -> bool:
        """True when the prompt budget lowered fps or pixels."""
        return self.lowered_fps or self.lowered_pixels


def _floor_even(x: float) -> int:
    return math.floor(x / TEMPORAL_PATCH + 1e-9) * TEMPORAL_PATCH


def _ceil_even(x: float) -> int:
    return math.ceil(x / TEMPORAL_PATCH - 1e-9) * TEMPORAL_PATCH


def frame_count(duration_s: float, total_frames: int, fps: float, budget: VideoBudget) -> int:
    """Frames T sampled from a video of ``duration_s`` seconds holding ``total_frames`` frames
    at ``fps`` frames/s: ``duration_s × fps`` clamped to ``[min_frames, max_frames]`` and to
    ``total_frames``, rounded down to a multiple of 2, at least 2 (qwen-vl-utils'
    ``smart_nframes``)."""
    lo, hi = _ceil_even(budget.min_frames), _floor_even(budget.max_frames)
    n = min(max(duration_s * fps, lo), hi, max(total_frames, 1))
    return max(TEMPORAL_PATCH, _floor_even(n))


def frame_indices(total_frames: int, frames: int) -> list[int]:
    """``frames`` indices spread uniformly over ``[0, total_frames − 1]`` (repeats when the
    video has fewer frames): ``torch.linspace(0, total_frames − 1, frames).round()`` exactly as
    qwen-vl-utils (round half to even)."""
    import torch

    return torch.linspace(0, max(total_frames - 1, 0), frames).round().long().tolist()


def resize_dims(
    height: int, width: int, factor: int, min_pixels: int, max_pixels: int
) -> tuple[int, int]:
    """``(h, w)`` in pixels by qwen-vl-utils ``smart_resize`` (sides multiples of ``factor``,
    area in ``[min_pixels, max_pixels]``, aspect ratio kept), made safe for tiny caps: no side
    below ``factor`` and the area never above ``max_pixels`` when ``max_pixels ≥ factor²``."""
    from qwen_vl_utils.vision_process import smart_resize

    min_pixels = min(min_pixels, max_pixels)
    h, w = smart_resize(
        int(height), int(width), factor=factor, min_pixels=min_pixels, max_pixels=max_pixels
    )
    h, w = max(factor, int(h)), max(factor, int(w))
    while h * w > max_pixels and (h > factor or w > factor):
        if h >= w and h > factor:
            h -= factor
        else:
            w -= factor
    return h, w


def visual_tokens(frames: int, height: int, width: int, factor: int, step_tokens: int = 0) -> int:
    """Prompt tokens of a video of ``frames`` frames of ``height × width`` pixels:
    ``frames/2`` temporal steps × ``(height/factor)·(width/factor)`` tokens (+ ``step_tokens``
    per step)."""
    steps = math.ceil(frames / TEMPORAL_PATCH)
    return steps * ((height // factor) * (width // factor) + step_tokens)


def _pixel_cap(budget: VideoBudget, frames: int) -> int:
    cap = budget.max_pixels
    if budget.total_pixels is not None:
        cap = min(cap, int(budget.total_pixels * TEMPORAL_PATCH / frames))
    return max(cap, budget.min_pixels)


def fit_budget(
    duration_s: float,
    width: int,
    height: int,
    budget: VideoBudget,
    text_tokens: int = 0,
    factor: int = 28,
    *,
    total_frames: int | None = None,
    step_tokens: int = 0,
    source: str = "video",
) -> BudgetFit:
    """Choose fps and pixels per frame for a ``width × height`` (pixels) video of
    ``duration_s`` seconds so that the prompt fits ``budget.max_prompt_tokens``.

    Args:
        duration_s: video length (seconds).
        width, height: native frame size (pixels).
        budget: the :class:`VideoBudget`.
        text_tokens: prompt tokens that are not this video's (text, images, other videos).
        factor: side multiple of the resized frames (``patch_size × merge_size``, pixels).
        total_frames: frames in the file; default ``round(duration_s × budget.fps)`` or more.
        step_tokens: extra text tokens per temporal step (Qwen3-VL timestamps: see
            :func:`timestamp_step_tokens`).
        source: the file, named in errors.

    Returns:
        A :class:`BudgetFit`; ``fps, pixels_per_frame = fit_budget(...)`` also works. Without
        a prompt bound (or when the video fits) it is the budget's own choice. Otherwise the
        frame count is lowered first (down to ``min_frames``), then the pixels per frame (down
        to one ``factor × factor`` group), and ``lowered_fps`` / ``lowered_pixels`` say so.

    Raises:
        VideoBudgetError: (a DataError) naming ``source``, when even ``min_frames`` frames of
            ``factor²`` pixels do not fit beside ``text_tokens``.
    """
    if duration_s <= 0 or width <= 0 or height <= 0:
        raise DataError(
            f"{source}: video has no frames or no size "
            f"(duration {duration_s} s, {width}×{height} pixels)"
        )
    if total_frames is None:
        total_frames = max(1, math.ceil(duration_s * max(budget.fps, 1.0)))
    n = frame_count(duration_s, total_frames, budget.fps, budget)
    h, w = resize_dims(height, width, factor, budget.min_pixels, _pixel_cap(budget, n))
    tokens = visual_tokens(n, h, w, factor, step_tokens)

    def result(n_: int, h_: int, w_: int, lowered_fps: bool, lowered_pixels: bool) -> BudgetFit:
        return BudgetFit(
            fps=n_ / duration_s,
            pixels_per_frame=h_ * w_,
            frames=n_,
            height=h_,
            width=w_,
            visual_tokens=visual_tokens(n_, h_, w_, factor, step_tokens),
            requested_fps=budget.fps,
            requested_frames=n,
            requested_pixels=h * w,
            lowered_fps=lowered_fps,
            lowered_pixels=lowered_pixels,
        )

    limit = budget.max_prompt_tokens
    if limit is None or text_tokens + tokens <= limit:
        return result(n, h, w, False, False)
    room = limit - text_tokens
    # 1. fewer frames (a lower fps), keeping the per-frame size rules
    n_min = min(n, frame_count(duration_s, total_frames, 0.0, budget))
    for n_try in range(n - TEMPORAL_PATCH, n_min - 1, -TEMPORAL_PATCH):
        h_try, w_try = resize_dims(
            height, width, factor, budget.min_pixels, _pixel_cap(budget, n_try)
        )
        if visual_tokens(n_try, h_try, w_try, factor, step_tokens) <= room:
            return result(n_try, h_try, w_try, True, False)
    # 2. the fewest frames, fewer pixels per frame
    steps = math.ceil(n_min / TEMPORAL_PATCH)
    per_step = room // steps - step_tokens if room > 0 else 0
    if per_step < 1:
        raise VideoBudgetError(
            f"{source}: the video cannot fit max_prompt_tokens={limit}: the prompt has "
            f"{text_tokens} other tokens and {n_min} frames need at least "
            f"{steps * (1 + step_tokens)} tokens; raise max_prompt_tokens or shorten the text"
        )
    h2, w2 = resize_dims(height, width, factor, factor * factor, per_step * factor * factor)
    return result(n_min, h2, w2, n_min < n, True)


# -- decoders --------------------------------------------------------------------------------
@dataclass(frozen=True)
class VideoInfo:
    """What a decoder reports about a file before decoding.

    Attributes:
        path: the file.
        backend: the decoder that read it (frame counts can differ between decoders).
        fps: native frame rate (frames/s).
        total_frames: frames in the stream (frames).
        width, height: native frame size (pixels).
    """

    path: str
    backend: str
    fps: float
    total_frames: int
    width: int
    height: int

    @property
    def duration_s(self) -> float:
        """``total_frames / fps`` (seconds), the duration the sampled fps is measured against."""
        return self.total_frames / self.fps

    def fit(
        self, budget: VideoBudget, text_tokens: int, factor: int, step_tokens: int, source: str
    ) -> BudgetFit:
        """:func:`fit_budget` of this video (its duration, frame size and frame count)."""
        return fit_budget(
            self.duration_s,
            self.width,
            self.height,
            budget,
            text_tokens,
            factor,
            total_frames=self.total_frames,
            step_tokens=step_tokens,
            source=source,
        )


def _usable(name: str) -> bool:
    """Whether decoder ``name`` is installed and can run here (torchcodec: its FFmpeg
    libraries load)."""
    try:
        if name == "decord":
            if importlib.util.find_spec("decord") is None:
                return False
            import decord  # noqa: F401
        elif name == "torchcodec":
            if importlib.util.find_spec("torchcodec") is None:
                return False
            import torchcodec.decoders  # noqa: F401
            from torchcodec._core import ops

            return bool(getattr(ops, "_FFMPEG_AVAILABLE", True))
        elif name == "pyav":
            if importlib.util.find_spec("av") is None:
                return False
            import av  # noqa: F401
        else:
            return False
    except Exception:  # a broken install is an unusable one
        return False
    return True


_USABLE: dict[str, bool] = {}


def _is_usable(name: str) -> bool:
    if name not in _USABLE:
        _USABLE[name] = _usable(name)
    return _USABLE[name]


def _preferred() -> tuple[str, ...]:
    forced = os.environ.get("MMRFT_VIDEO_BACKEND")
    if not forced:
        return BACKENDS
    if forced not in BACKENDS:
        raise ValueError(f"MMRFT_VIDEO_BACKEND={forced!r} is not one of {', '.join(BACKENDS)}")
    return (forced,)


def available_backends() -> list[str]:
    """Usable decoders in order of preference; ``MMRFT_VIDEO_BACKEND`` narrows it to one.

    Checks every decoder (importing torchcodec takes seconds); reading a video checks them
    lazily, in order, and stops at the first that works.
    """
    return [n for n in _preferred() if _is_usable(n)]


def require_backend() -> None:
    """Raise RuntimeError with the install hint when no decoder can run (frame lists need
    none)."""
    if not available_backends():
        raise RuntimeError(
            "reading video files needs a decoder: pip install av (or decord; torchcodec also "
            "needs FFmpeg: apt-get install ffmpeg), or give the video as a list of frames"
        )


def _chunks(items: Sequence[int], size: int) -> Iterator[list[int]]:
    for start in range(0, len(items), size):
        yield list(items[start : start + size])


def _probe_decord(path: str) -> VideoInfo:
    import decord

    reader = decord.VideoReader(path, num_threads=1)
    total, fps = len(reader), float(reader.get_avg_fps())
    height, width = reader[0].shape[:2]
    return VideoInfo(path, "decord", fps, int(total), int(width), int(height))


def _frames_decord(path: str, indices: Sequence[int]) -> Iterator[Any]:
    import decord
    import torch

    reader = decord.VideoReader(path, num_threads=0)
    try:
        for chunk in _chunks(indices, 8):
            yield torch.from_numpy(reader.get_batch(chunk).asnumpy()).permute(0, 3, 1, 2)
    finally:
        del reader


def _probe_torchcodec(path: str) -> VideoInfo:
    from torchcodec.decoders import VideoDecoder

    meta = VideoDecoder(path).metadata
    if not meta.num_frames or not meta.average_fps:
        raise ValueError("stream reports no frame count or frame rate")
    return VideoInfo(
        path,
        "torchcodec",
        float(meta.average_fps),
        int(meta.num_frames),
        int(meta.width),
        int(meta.height),
    )


def _frames_torchcodec(path: str, indices: Sequence[int]) -> Iterator[Any]:
    from torchcodec.decoders import VideoDecoder

    decoder = VideoDecoder(path)
    for chunk in _chunks(indices, 8):
        yield decoder.get_frames_at(indices=chunk).data


def _probe_pyav(path: str) -> VideoInfo:
    import av

    with av.open(path) as container:
        if not container.streams.video:
            raise ValueError("no video stream")
        stream = container.streams.video[0]
        width, height = stream.codec_context.width, stream.codec_context.height
        duration = None
        if stream.duration is not None and stream.time_base is not None:
            duration = float(stream.duration * stream.time_base)
        elif container.duration is not None:
            duration = container.duration / 1_000_000  # microseconds
        rate = stream.average_rate or stream.guessed_rate
        total = int(stream.frames or 0)
        if total <= 0:  # the container keeps no count: count the packets (no decoding)
            total = sum(1 for packet in container.demux(stream) if packet.size)
        if rate:
            fps = float(rate)
        elif duration:
            fps = total / duration
        else:
            raise ValueError("stream reports no frame rate or duration")
    if total <= 0 or not width or not height:
        raise ValueError(f"no frames ({total}) or no size ({width}×{height})")
    return VideoInfo(path, "pyav", fps, total, int(width), int(height))


def _frames_pyav(path: str, indices: Sequence[int]) -> Iterator[Any]:
    """Decode sequentially up to the last wanted frame, keeping only the wanted ones.

    A stream that ends early by at most 5 % of its announced frames (headers round) repeats its
    last frame; one that ends earlier is truncated and raises DataError.
    """
    import av
    import torch

    wanted = list(indices)
    pos, decoded, last = 0, 0, None
    with av.open(path) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        total = int(stream.frames or 0)
        for i, frame in enumerate(container.decode(stream)):
            decoded = i + 1
            if i == wanted[pos]:
                last = torch.from_numpy(frame.to_ndarray(format="rgb24")).permute(2, 0, 1)
                yield last[None]
                pos += 1
                if pos == len(wanted):
                    return
    if last is not None and decoded >= 0.95 * max(total, wanted[-1] + 1):
        for _ in wanted[pos:]:
            yield last[None]
        return
    raise DataError(f"{path}: truncated video: {decoded} of {total or '?'} frames decodable")


_PROBES: dict[str, Callable[[str], VideoInfo]] = {
    "decord": _probe_decord,
    "torchcodec": _probe_torchcodec,
    "pyav": _probe_pyav,
}
_FRAMES: dict[str, Callable[[str, Sequence[int]], Iterator[Any]]] = {
    "decord": _frames_decord,
    "torchcodec": _frames_torchcodec,
    "pyav": _frames_pyav,
}


def _resize(frames: Any, height: int, width: int) -> Any:
    """``[k, C, H, W]`` uint8 frames resized to ``height × width`` pixels (bicubic,
    antialiased: qwen-vl-utils' resize)."""
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import functional as F

    if tuple(frames.shape[-2:]) == (height, width):
        return frames.contiguous()
    return F.resize(
        frames.contiguous(),
        [height, width],
        interpolation=InterpolationMode.BICUBIC,
        antialias=True,
    )


def _decode(info: VideoInfo, indices: Sequence[int], height: int, width: int) -> Any:
    """The frames at ``indices`` of ``info.path`` as ``[T, C, height, width]`` uint8, decoded
    by ``info.backend`` (each distinct frame once), resized chunk by chunk."""
    import torch

    unique = sorted(set(indices))
    frames: dict[int, Any] = {}
    for chunk in _FRAMES[info.backend](info.path, unique):
        for frame in _resize(chunk, height, width):
            if len(frames) == len(unique):
                break
            frames[unique[len(frames)]] = frame
    if len(frames) < len(unique):
        raise DataError(
            f"{info.path}: truncated video: frame {unique[len(frames)]} of "
            f"{info.total_frames} could not be decoded"
        )
    return torch.stack([frames[i] for i in indices])


def decode_frames(
    info: VideoInfo,
    indices: Sequence[int],
    height: int,
    width: int,
    cache: VideoCache | None = None,
) -> Any:
    """The frames at ``indices`` of ``info.path`` as ``[T, C, height, width]`` uint8 (resized as
    :func:`read_video` resizes), through ``cache`` (default :data:`VIDEO_CACHE`) keyed by the
    file (path, mtime, size), the decoder, the indices and the size: a tool fetching the same
    window for every completion of a group decodes it once. The tensor may be the cache's:
    treat it as read-only."""
    cache = VIDEO_CACHE if cache is None else cache
    _, file_key = _source_key(info.path)
    key = ("frames", *file_key, info.backend, tuple(indices), height, width)
    frames, _, _ = cache.get_or_load(key, lambda: (_decode(info, indices, height, width), 0.0, {}))
    return frames


# -- frame lists -------------------------------------------------------------------------------


def _open_frame(source: Any) -> Any:
    """A frame of a frame list as an RGB PIL image; DataError naming a bad file."""
    from PIL import Image
    from qwen_vl_utils.vision_process import to_rgb

    if isinstance(source, Image.Image):
        return to_rgb(source)
    path = local_media_path(str(source))
    if path is None:
        raise DataError(f"{source}: video frames must be local image files or PIL images")
    return read_image(path, "video frame", "video frame")


def _frame_size(source: Any) -> tuple[int, int]:
    from PIL import Image

    if isinstance(source, Image.Image):
        return source.size
    path = local_media_path(str(source)) or str(source)
    return image_size(path, "video frame", "video frame")


def _decode_frame_list(
    sources: Sequence[Any], indices: Sequence[int], height: int, width: int
) -> Any:
    import numpy as np
    import torch

    loaded: dict[int, Any] = {}
    for i in sorted(set(indices)):
        image = np.array(_open_frame(sources[i]))  # a writable copy
        loaded[i] = _resize(torch.from_numpy(image).permute(2, 0, 1)[None], height, width)[0]
    return torch.stack([loaded[i] for i in indices])


# -- the cache ---------------------------------------------------------------------------------
def _default_cache_bytes() -> int:
    return int(float(os.environ.get("MMRFT_VIDEO_CACHE_MB", "512")) * 2**20)


class VideoCache:
    """Thread-safe LRU cache of decoded videos, bounded in bytes of frame data.

    Values are ``(frames, sample_fps, meta)``; an entry larger than the whole bound is not
    kept. Concurrent requests for the same key decode once (the others wait).

    Args:
        max_bytes: bound on the frame bytes held (bytes); default ``MMRFT_VIDEO_CACHE_MB``
            (512 MiB). 0 disables caching.
    """

    def __init__(self, max_bytes: int | None = None) -> None:
        self.max_bytes = _default_cache_bytes() if max_bytes is None else int(max_bytes)
        self._items: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._loading: dict[Hashable, threading.Lock] = {}
        self._lock = threading.Lock()
        self.nbytes = 0
        self.hits = 0
        self.misses = 0

    def _lookup(self, key: Hashable) -> Any | None:
        item = self._items.get(key)
        if item is None:
            return None
        self._items.move_to_end(key)
        return item[0]

    def get_or_load(self, key: Hashable, load: Callable[[], tuple[Any, float, dict]]) -> Any:
        """The cached value of ``key``, or ``load()`` (called once per key at a time) stored."""
        with self._lock:
            value = self._lookup(key)
            if value is not None:
                self.hits += 1
                _count("cache_hits")
                return value
            key_lock = self._loading.setdefault(key, threading.Lock())
        with key_lock:
            with self._lock:
                value = self._lookup(key)
            if value is not None:
                with self._lock:
                    self.hits += 1
                _count("cache_hits")
                return value
            try:
                value = load()
            finally:
                with self._lock:
                    self._loading.pop(key, None)
            with self._lock:
                self.misses += 1
                self._put(key, value)
            return value

    def _put(self, key: Hashable, value: tuple[Any, float, dict]) -> None:
        frames = value[0]
        size = int(frames.numel() * frames.element_size())
        if size > self.max_bytes:
            return
        if key in self._items:
            self.nbytes -= self._items.pop(key)[1]
        self._items[key] = (value, size)
        self.nbytes += size
        while self.nbytes > self.max_bytes and self._items:
            _, (_, old) = self._items.popitem(last=False)
            self.nbytes -= old

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.nbytes = self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._items)


VIDEO_CACHE = VideoCache()
"""The process-wide decoded-video cache used by :func:`read_video`."""

_PROBE_CACHE: OrderedDict[Hashable, VideoInfo] = OrderedDict()
_PROBE_LOCK = threading.Lock()


def _probe(key: Hashable, path: str, backend: str) -> VideoInfo:
    """``_PROBES[backend](path)`` memoised under ``(key, backend)``; raises what it raises."""
    with _PROBE_LOCK:
        info = _PROBE_CACHE.get((key, backend))
    if info is None:
        info = _PROBES[backend](path)
        with _PROBE_LOCK:
            _PROBE_CACHE[(key, backend)] = info
            while len(_PROBE_CACHE) > 4096:
                _PROBE_CACHE.popitem(last=False)
    return info


def _source_key(source: str) -> tuple[str, tuple[Any, ...]]:
    """``(path, (path, mtime_ns, size))`` of a local video (DataError if missing or empty), or
    ``(url, (url, 0, 0))``."""
    local = local_media_path(source)
    if local is None:
        return source, (source, 0, 0)
    key = media_file_key(local, "video file")
    if key[2] == 0:
        raise DataError(f"{local}: empty video file (0 bytes)")
    return local, key


def _backends(backend: str | None) -> Iterator[str]:
    """``backend`` alone, or the usable decoders in order, each checked only when reached;
    RuntimeError when none is usable."""
    if backend is not None:
        if backend not in BACKENDS:
            raise ValueError(f"video backend {backend!r} is not one of {', '.join(BACKENDS)}")
        yield backend
        return
    found = False
    for name in _preferred():
        if _is_usable(name):
            found = True
            yield name
    if not found:
        require_backend()


def probe_video(path: str, backend: str | None = None) -> VideoInfo:
    """Frame count, rate and size of a video file, read by ``backend`` (default: the first
    usable decoder that can open it). Cheap (headers; decord decodes one frame), memoised per
    (file, mtime, size); usable by dataset checks to reject bad files early.

    Raises:
        DataError: naming the file when it is missing, empty, corrupt or truncated.
    """
    path, key = _source_key(path)
    errors = []
    for name in _backends(backend):
        try:
            return _probe(key, path, name)
        except Exception as exc:
            errors.append(f"{name}: {_short(exc)}")
    raise DataError(f"{path}: corrupt or unreadable video ({'; '.join(errors)})")


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:200]}"


# -- reading -----------------------------------------------------------------------------------
def read_video(
    video: str | os.PathLike[str] | Sequence[Any],
    budget: VideoBudget | None = None,
    factor: int = 28,
    *,
    text_tokens: int = 0,
    step_tokens: int = 0,
    frames_fps: float | None = None,
    backend: str | None = None,
    cache: VideoCache | None = None,
) -> tuple[Any, float, dict[str, Any]]:
    """Decode, sample and resize a video for a Qwen-VL-style model.

    Args:
        video: a video file (path, ``file://`` path or URL), or a list of frame images (paths or
            PIL images) forming a video at ``frames_fps`` frames/s.
        budget: frames, fps and pixel bounds (default :class:`VideoBudget`).
        factor: side multiple of the resized frames, ``patch_size × merge_size`` (pixels; 28
            for Qwen2/2.5-VL, 32 for Qwen3-VL).
        text_tokens: the prompt's other tokens, for ``budget.max_prompt_tokens``.
        step_tokens: extra text tokens per temporal step (Qwen3-VL timestamps).
        frames_fps: native rate of a frame list (frames/s); default 2.0.
        backend: force a decoder (``"decord"``, ``"torchcodec"``, ``"pyav"``).
        cache: the decoded-frame cache (default :data:`VIDEO_CACHE`).

    Returns:
        ``(frames, sample_fps, meta)``: frames ``[T, 3, H, W]`` uint8 (shared with the cache:
        read-only), the sampling rate ``T / duration_s`` (frames/s), and a dict with
        ``source``, ``backend``, ``fps`` (native frames/s), ``total_num_frames``, ``duration``
        (seconds), ``width`` / ``height`` (native pixels), ``frames_indices``, ``sample_fps``,
        ``resized_height`` / ``resized_width`` (pixels), ``visual_tokens`` and ``fit`` (the
        :class:`BudgetFit` as a dict: ``lowered_fps`` / ``lowered_pixels`` report budget
        reductions). :func:`processor_metadata` turns it into the processor's
        ``video_metadata``.

    Raises:
        DataError: naming the file when it is missing, empty, corrupt or truncated, or when the
            prompt budget cannot hold its fewest frames (:class:`VideoBudgetError`).
    """
    budget = budget or VideoBudget()
    cache = VIDEO_CACHE if cache is None else cache
    if not isinstance(video, (str, os.PathLike)):
        return _read_frame_list(
            list(video), budget, factor, text_tokens, step_tokens, frames_fps, cache
        )
    source, file_key = _source_key(os.fspath(video))
    errors: list[str] = []
    for name in _backends(backend):
        try:
            info = _probe(file_key, source, name)
            fit = info.fit(budget, text_tokens, factor, step_tokens, source)
        except VideoBudgetError:
            raise
        except Exception as exc:
            errors.append(f"{name}: {_short(exc)}")
            continue
        indices = frame_indices(info.total_frames, fit.frames)
        key = (*file_key, name, tuple(indices), fit.height, fit.width)

        def load(info: VideoInfo = info, fit: BudgetFit = fit, indices: list[int] = indices):
            frames = _decode(info, indices, fit.height, fit.width)
            return frames, *_describe(source, info, indices, fit, budget)

        try:
            frames, sample_fps, meta = cache.get_or_load(key, load)
        except Exception as exc:
            errors.append(f"{name}: {_short(exc)}")
            _count("decode_failures")
            continue
        return frames, sample_fps, dict(meta)
    raise DataError(f"{source}: corrupt or unreadable video ({'; '.join(errors)})")


def _describe(
    source: Any, info: VideoInfo, indices: list[int], fit: BudgetFit, budget: VideoBudget
) -> tuple[float, dict[str, Any]]:
    """``(sample_fps, meta)`` of a freshly decoded video; logs and counts budget reductions."""
    sample_fps = len(indices) / info.total_frames * info.fps
    _count("decoded")
    if fit.lowered_fps:
        _count("fps_lowered")
    if fit.lowered_pixels:
        _count("pixels_lowered")
    if fit.reduced:
        log.warning(
            "%s: max_prompt_tokens=%s: %d frames (%.3g frames/s) of %d×%d pixels instead of "
            "%d frames (%.3g frames/s) of %d pixels",
            source,
            budget.max_prompt_tokens,
            fit.frames,
            fit.fps,
            fit.width,
            fit.height,
            fit.requested_frames,
            min(fit.requested_fps, fit.requested_frames / info.duration_s),
            fit.requested_pixels,
        )
    meta = {
        "source": source,
        "backend": info.backend,
        "fps": info.fps,
        "total_num_frames": info.total_frames,
        "duration": info.duration_s,
        "width": info.width,
        "height": info.height,
        "frames_indices": list(indices),
        "sample_fps": sample_fps,
        "resized_height": fit.height,
        "resized_width": fit.width,
        "visual_tokens": fit.visual_tokens,
        "fit": asdict(fit),
    }
    return sample_fps, meta


def _read_frame_list(
    sources: list[Any],
    budget: VideoBudget,
    factor: int,
    text_tokens: int,
    step_tokens: int,
    frames_fps: float | None,
    cache: VideoCache,
) -> tuple[Any, float, dict[str, Any]]:
    if not sources:
        raise DataError("video given as an empty list of frames")
    fps = float(frames_fps or FRAME_LIST_FPS)
    width, height = _frame_size(sources[0])
    name = sources[0] if isinstance(sources[0], str) else "frame list"
    info = VideoInfo(str(name), "frames", fps, len(sources), int(width), int(height))
    fit = info.fit(budget, text_tokens, factor, step_tokens, str(name))
    indices = frame_indices(info.total_frames, fit.frames)

    def load() -> tuple[Any, float, dict[str, Any]]:
        frames = _decode_frame_list(sources, indices, fit.height, fit.width)
        return frames, *_describe(name, info, indices, fit, budget)

    if all(isinstance(s, str) for s in sources):
        keys = tuple(
            media_file_key(local_media_path(s) or s, "video frame")
            if local_media_path(s)
            else (s, 0, 0)
            for s in sources
        )
        frames, sample_fps, meta = cache.get_or_load(
            ("frames", keys, fps, tuple(indices), fit.height, fit.width), load
        )
    else:
        frames, sample_fps, meta = load()
    return frames, sample_fps, dict(meta)


_METADATA_KEYS = ("fps", "total_num_frames", "frames_indices", "duration", "width", "height")


def processor_metadata(meta: Mapping[str, Any]) -> dict[str, Any]:
    """The ``video_metadata`` entry for a Hugging Face video processor (transformers
    ``VideoMetadata`` fields only): native ``fps``, ``total_num_frames``, ``frames_indices``,
    ``duration`` (seconds), native ``width`` / ``height`` and ``video_backend``. From these
    transformers derives ``sampled_fps = len(frames_indices) / total_num_frames × fps`` (=
    :func:`read_video`'s ``sample_fps``) and Qwen3-VL's timestamps ``frames_indices / fps``."""
    out = {key: meta[key] for key in _METADATA_KEYS}
    out["frames_indices"] = list(out["frames_indices"])
    out["video_backend"] = meta.get("backend")
    return out


# -- shuffled frames (T-GRPO) ----------------------------------------------------------------
def shuffled_order(frames: int, seed: int) -> list[int]:
    """A permutation of ``range(frames)`` drawn from numpy's PCG64 seeded with ``seed``: the same
    for the same (frames, seed) on every machine and run, so an exactly resumed run shuffles the
    same way. Never the identity when ``frames ≥ 2`` (an unshuffled "shuffled" video would make
    the ordered-vs-shuffled contrast void; with 16 frames a redraw is needed once in 2·10¹³)."""
    import numpy as np

    if frames < 0:
        raise ValueError(f"frames must be ≥ 0, got {frames}")
    rng = np.random.default_rng(seed)
    identity = list(range(frames))
    while True:
        order = [int(i) for i in rng.permutation(frames)]
        if frames < 2 or order != identity:
            return order


def shuffle_frames(frames: Any, seed: int) -> tuple[Any, list[int]]:
    """``(frames[order], order)`` with ``order = shuffled_order(len(frames), seed)``: a new
    ``[T, C, H, W]`` tensor (the input, possibly the cache's, is left untouched)."""
    import torch

    order = shuffled_order(int(frames.shape[0]), seed)
    return frames[torch.tensor(order, dtype=torch.long)], order


def map_media_parts(
    conversation: list[dict[str, Any]], fn: Callable[[dict[str, Any], str, int], dict[str, Any]]
) -> list[dict[str, Any]]:
    """A copy of ``conversation`` whose media parts are ``fn(part, kind, k)`` (``kind`` one of
    ``image`` / ``video`` / ``audio``, ``k`` the part's rank among the conversation's media of
    that kind, in prompt order); the input is not modified and other parts are shared with it.
    The one mechanism behind T-GRPO's shuffled frames (:func:`with_shuffled_frames`) and
    NoisyRollout's distorted media (:func:`mmrft.rollout.perturb.perturbed_conversation`)."""
    out: list[dict[str, Any]] = []
    seen: Counter[str] = Counter()
    for message in conversation:
        content = message.get("content")
        if not isinstance(content, list):
            out.append(message)
            continue
        parts = []
        for part in content:
            kind = next(
                (
                    k
                    for k in ("video", "image", "audio")
                    if part.get("type") == k or k in part or f"{k}_url" in part
                ),
                None,
            )
            if kind is None:
                parts.append(part)
                continue
            parts.append(fn(part, kind, seen[kind]))
            seen[kind] += 1
        out.append({**message, "content": parts})
    return out


def with_shuffled_frames(conversation: list[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    """A copy of ``conversation`` whose video parts carry :data:`SHUFFLE_KEY` (the k-th video of
    the conversation gets a seed derived from ``(seed, k)``); the input is not modified. Parts
    other than videos are shared with the input."""
    import numpy as np

    def shuffle(part: dict[str, Any], kind: str, k: int) -> dict[str, Any]:
        if kind != "video":
            return part
        derived = int(np.random.SeedSequence([int(seed), k]).generate_state(1)[0])
        return {**part, SHUFFLE_KEY: derived}

    return map_media_parts(conversation, shuffle)


# -- the hook for the Qwen-VL families -------------------------------------------------------
def fetch_video(
    part: Mapping[str, Any],
    budget: VideoBudget | None = None,
    factor: int = 28,
    *,
    text_tokens: int = 0,
    step_tokens: int = 0,
) -> tuple[Any, dict[str, Any], float]:
    """One ``{"type": "video", "video": ...}`` part as ``(frames, video_metadata,
    sample_fps)``: the part's own qwen-vl-utils keys (``fps``, ``nframes``, ``min_frames``,
    ``max_frames``, ``min_pixels``, ``max_pixels``, ``total_pixels``; ``sample_fps`` = the rate
    of a frame list) override ``budget``; ``frame_shuffle_seed`` (:data:`SHUFFLE_KEY`) permutes
    the sampled frames (the metadata stays that of the ordered frames), then ``media_perturb``
    (:data:`PERTURB_KEY`) distorts them (same count and size)."""
    budget = (budget or VideoBudget()).override(part)
    frames, sample_fps, meta = read_video(
        part["video"],
        budget,
        factor,
        text_tokens=text_tokens,
        step_tokens=step_tokens,
        frames_fps=part.get("sample_fps"),
    )
    if part.get(SHUFFLE_KEY) is not None:
        frames, _ = shuffle_frames(frames, int(part[SHUFFLE_KEY]))
    if part.get(PERTURB_KEY) is not None:  # NoisyRollout's distorted copy (mmrft.rollout.perturb)
        from mmrft.data.distort import distort_frames

        spec = part[PERTURB_KEY]
        frames = distort_frames(
            frames, list(spec["kinds"]), float(spec["strength"]), int(spec["seed"])
        )
    return frames, processor_metadata(meta), sample_fps


def count_text_tokens(processor: Any, texts: Sequence[str]) -> list[int]:
    """Tokens of each rendered prompt before media expansion (each media placeholder counts
    1, a slight over-count that keeps :func:`fit_budget` on the safe side)."""
    tokenizer = getattr(processor, "tokenizer", processor)
    return [len(ids) for ids in tokenizer(list(texts), add_special_tokens=False)["input_ids"]]


_TIMESTAMP_PROBES = (0.0, 0.5, 1.5, 9.9, 10.5, 99.5, 123.4, 999.9, 1234.5, 9999.9)


def timestamp_step_tokens(processor: Any) -> int:
    """Text tokens a Qwen3-VL-style processor adds per temporal step of a video: the timestamp
    ``<t seconds>`` (the most tokens over timestamps up to 10⁴ seconds) plus a vision
    start/end pair. Pass it as ``step_tokens`` so the prompt budget counts them."""
    tokenizer = getattr(processor, "tokenizer", processor)
    cached = getattr(tokenizer, "_mmrft_timestamp_tokens", None)
    if cached is not None:
        return int(cached)
    texts = [f"<{t:.1f} seconds>" for t in _TIMESTAMP_PROBES]
    longest = max(len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"])
    with contextlib.suppress(AttributeError):  # a tokenizer refusing attributes: recount
        tokenizer._mmrft_timestamp_tokens = longest + 2
    return longest + 2


def _vision_parts(conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from qwen_vl_utils.vision_process import extract_vision_info

    return extract_vision_info([conversation]) if conversation else []


def media_counts(conversation: list[dict[str, Any]]) -> tuple[int, int]:
    """``(images, videos)`` of a conversation, counted as :func:`process_vision_info` reads
    them (so its flat media lists can be split per conversation)."""
    parts = _vision_parts(conversation)
    images = sum(1 for p in parts if "image" in p or "image_url" in p)
    return images, sum(1 for p in parts if "video" in p and not ("image" in p or "image_url" in p))


def process_vision_info(
    conversations: list[list[dict[str, Any]]] | list[dict[str, Any]],
    *,
    budget: VideoBudget | None = None,
    image_patch_size: int = 14,
    merge_size: int = 2,
    return_video_metadata: bool = False,
    text_tokens: Sequence[int] | None = None,
    step_tokens: int = 0,
) -> tuple[list[Any] | None, list[Any] | None, dict[str, Any]]:
    """Drop-in for qwen-vl-utils' ``process_vision_info(..., return_video_kwargs=True)``.

    Images go through qwen-vl-utils' ``fetch_image`` unchanged; videos through
    :func:`fetch_video` (decoder order, :class:`VideoBudget`, the decoded-frame cache, errors
    naming the file). With ``budget.max_prompt_tokens`` set and ``text_tokens`` given (one count
    per conversation, e.g. :func:`count_text_tokens`), each conversation's room left after its
    text and images is shared equally by its videos.

    Returns:
        ``(images, videos, video_kwargs)`` as qwen-vl-utils: images (PIL) and videos in prompt
        order across the batch (None when there are none); each video a ``[T, 3, H, W]`` uint8
        tensor, or ``(tensor, metadata)`` with ``return_video_metadata`` (pass the metadata as
        the processor's ``video_metadata``); ``video_kwargs`` holds ``do_sample_frames=False``
        and, without metadata, ``fps`` (the sampled fps per video, transformers 4.x).
    """
    from qwen_vl_utils.vision_process import fetch_image

    if conversations and isinstance(conversations[0], dict):
        conversations = [conversations]  # type: ignore[list-item]
    budget = budget or VideoBudget()
    factor = image_patch_size * merge_size
    images: list[Any] = []
    videos: list[Any] = []
    fps_list: list[float] = []
    for i, conversation in enumerate(conversations):
        parts = _vision_parts(conversation)  # type: ignore[arg-type]
        video_parts = []
        conv_images = []
        for part in parts:
            if "image" in part or "image_url" in part:
                conv_images.append(fetch_image(part, image_patch_size=image_patch_size))
            elif "video" in part:
                video_parts.append(part)
            else:
                raise ValueError("image, image_url or video should be in the content part")
        images.extend(conv_images)
        others = 0
        limit = budget.max_prompt_tokens
        if video_parts and limit is not None and text_tokens is not None:
            image_tokens = sum((im.width // factor) * (im.height // factor) for im in conv_images)
            used = int(text_tokens[i]) + image_tokens
            share = (limit - used) // len(video_parts)
            others = limit - share  # as if this video's share were all the room left
        for part in video_parts:
            frames, metadata, sample_fps = fetch_video(
                part, budget, factor, text_tokens=others, step_tokens=step_tokens
            )
            videos.append((frames, metadata) if return_video_metadata else frames)
            fps_list.append(sample_fps)
    video_kwargs: dict[str, Any] = {"do_sample_frames": False}
    if not return_video_metadata:
        video_kwargs["fps"] = fps_list
    return images or None, videos or None, video_kwargs
