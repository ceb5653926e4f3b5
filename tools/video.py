"""Video tool: ``video_frames``, n frames of an interval of the sample's ORIGINAL video.

Frames (all times in seconds of the source video, ``fps`` its native rate in frames/s,
``total`` its frame count):

* the interval must satisfy ``0 ≤ start_s < end_s`` and ``start_s < duration`` and
  ``end_s ≤ duration + 1/fps`` (one frame of slack for rounding), else ``bad_argument`` /
  ``interval_outside_video``;
* ``n`` above the clip budget ``ToolContext.video_budget.max_frames`` is **refused**
  (``too_many_frames``, the text names the limit) rather than silently capped, so a policy
  learns the limit instead of being rewarded for ignoring it; an odd ``n`` is rounded up to
  the next even number (down when that passes the budget) because Qwen-VL towers merge frames
  in pairs (:data:`mmrft.data.video.TEMPORAL_PATCH`);
* frame indices: ``i_first = ceil(start_s·fps)``, ``i_last = min(floor(end_s·fps), total − 1)``,
  ``indices = round(linspace(i_first, i_last, n))`` (repeats when the interval holds fewer
  than n frames), timestamps ``index / fps``;
* frame size: qwen-vl-utils' ``smart_resize`` (:func:`mmrft.data.video.resize_dims`) with the
  per-frame cap ``min(max_pixels, total_pixels·2/n, ⌊max_video_tokens / ⌈n/2⌉⌋·factor²)``;
  when not even one ``factor × factor`` patch group fits, ``too_many_frames``.

The frames come back as a :class:`~mmrft.rollout.tool.VideoClip` (a frame-list video with its
timestamps), which the family renders as a video (video tokens), not as loose images.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from mmrft.data import DataError
from mmrft.data.video import (
    TEMPORAL_PATCH,
    VideoCache,
    VideoInfo,
    decode_frames,
    frame_indices,
    probe_video,
    resize_dims,
)
from mmrft.rollout.tool import Observation, ToolContext, ToolFailure, VideoClip, tool

if TYPE_CHECKING:
    from PIL import Image


DEFAULT_SPAN_S = 1.0  # s, the interval of a call without end_s
DEFAULT_FRAMES = 8  # frames of a call without n (at most the video budget's)

CLIP_CACHE = VideoCache(max_bytes=64 * 2**20)
"""Decoded clips of this process's calls (64 MiB; the tool worker's, whose memory is capped):
the G completions of a group mostly fetch the same window, which is then decoded once."""


def video_frames_example(context: ToolContext) -> dict[str, Any] | None:
    """One valid ``video_frames`` call (a smoke run's scripted call): the first two seconds of
    the video (all of it when shorter, end rounded down to 0.01 s), 2 frames; ``None``
    without a video."""
    if context.video is None:
        return None
    end = math.floor(min(context.duration_s(), 2.0) * 100) / 100
    return {"start_s": 0.0, "end_s": end, "n": TEMPORAL_PATCH} if end > 0 else None


@tool(
    "video_frames",
    timeout_s=30.0,
    example=video_frames_example,
    parameters={
        "type": "object",
        "properties": {
            "start_s": {"type": "number", "minimum": 0, "description": "start (seconds)"},
            "end_s": {
                "type": "number",
                "minimum": 0,
                "description": f"end (seconds); default start_s + {DEFAULT_SPAN_S:g}",
            },
            "n": {
                "type": "integer",
                "minimum": 1,
                "description": f"number of frames; default {DEFAULT_FRAMES}",
            },
        },
        "required": ["start_s"],
    },
)
def video_frames(
    context: ToolContext, *, start_s: float, end_s: float | None = None, n: int | None = None
) -> Observation:
    """Look closer at a time interval of the video: returns n frames spread evenly from start_s
    to end_s (seconds). Without ``end_s`` the interval is ``DEFAULT_SPAN_S`` = 1 s from
    start_s (cut at the video's end); without ``n``, ``DEFAULT_FRAMES`` = 8 frames (at most the
    video budget's): a short call, ``{"start_s": 4.3}``, looks at one moment."""
    if context.video is None:
        raise ToolFailure("bad_argument", "this conversation has no video")
    budget = context.video_budget
    cap = max(TEMPORAL_PATCH, budget.max_frames // TEMPORAL_PATCH * TEMPORAL_PATCH)
    if n is None:
        n = min(DEFAULT_FRAMES, cap)
    if n > cap:
        raise ToolFailure("too_many_frames", f"n={n} is over the limit; ask for at most {cap}")
    if end_s is not None and not start_s < end_s:
        raise ToolFailure("bad_argument", "start_s must be smaller than end_s")
    try:
        info = probe_video(context.video)
    except DataError as exc:
        raise RuntimeError(f"cannot read the video: {exc}") from None
    duration = context.video_duration_s or info.duration_s
    if end_s is None:
        end_s = min(start_s + DEFAULT_SPAN_S, duration)  # start_s past the end: refused below
    if start_s >= duration or end_s > duration + 1.0 / info.fps:
        raise ToolFailure(
            "interval_outside_video",
            f"[{start_s:g}, {end_s:g}] s is outside the video, which lasts {duration:.2f} s",
        )
    frames = n + n % 2
    if frames > cap:
        frames = n - 1
    first = math.ceil(start_s * info.fps - 1e-9)
    last = min(math.floor(end_s * info.fps + 1e-9), info.total_frames - 1)
    if last < first:
        raise ToolFailure(
            "bad_argument", f"[{start_s:g}, {end_s:g}] s holds no frame; give a longer interval"
        )
    indices = [first + i for i in frame_indices(last - first + 1, frames)]
    pixels = budget.max_pixels
    if budget.total_pixels is not None:
        pixels = min(pixels, budget.total_pixels * TEMPORAL_PATCH // frames)
    if context.max_video_tokens is not None:
        steps = math.ceil(frames / TEMPORAL_PATCH)
        pixels = min(pixels, context.max_video_tokens // steps * context.factor**2)
    if pixels < context.factor**2:
        raise ToolFailure(
            "too_many_frames", f"n={n} frames do not fit the video token budget; ask for fewer"
        )
    height, width = resize_dims(info.height, info.width, context.factor, budget.min_pixels, pixels)
    clip = _decode(info, indices, height, width)
    times = [i / info.fps for i in indices]
    span = times[-1] - times[0]
    fps = (len(times) - 1) / span if span > 0 else info.fps
    note = f" (n rounded to {frames}: frames go in pairs)" if frames != n else ""
    text = (
        f"{frames} frames of [{start_s:g}, {end_s:g}] s{note}, at "
        + ", ".join(f"{t:.2f}" for t in times)
        + " s."
    )
    return Observation(
        ok=True,
        text=text,
        videos=[VideoClip(frames=clip, timestamps_s=times, fps=fps, source=str(context.video))],
        info={"span_s": [float(start_s), float(end_s)], "frames": frames},
    )


def _decode(info: VideoInfo, indices: list[int], height: int, width: int) -> list[Image.Image]:
    """The frames at ``indices`` as RGB PIL images of ``width × height`` pixels, decoded by
    :mod:`mmrft.data.video`'s decoder (only these frames, resized as they are decoded) or
    taken from :data:`CLIP_CACHE`."""
    from PIL import Image

    tensor = decode_frames(info, indices, height, width, CLIP_CACHE)
    return [Image.fromarray(frame.permute(1, 2, 0).numpy()) for frame in tensor]
