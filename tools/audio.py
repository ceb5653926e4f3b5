"""Audio tool: ``audio_clip``, an interval of the sample's ORIGINAL audio, as audio.

The model hears the prompt's audio as its family loads it: cut to the audio budget
(``model.audio.max_seconds``, policy ``truncate``: the first seconds only) and capped by the
feature extractor's window (30 s for the released Qwen2-Audio and Omni thinkers). The tool
returns any interval of the whole recording at the model's rate, so a policy can listen to
the part the prompt cut off, or listen again to a short event on its own.

* times are seconds of the source recording; the interval must satisfy ``0 ≤ start_s <
  end_s`` and ``start_s < duration`` (``bad_argument`` / ``interval_outside_audio``); an
  ``end_s`` past the end is cut to the end (the text says so);
* an interval longer than the family's clip bound (``ToolContext.max_audio_seconds``) is
  **refused** (``clip_too_long``, the text names the limit) rather than silently cut, as
  ``video_frames`` refuses too many frames;
* samples: the file decoded and resampled once per worker (:func:`mmrft.data.audio.load_audio`:
  soundfile + soxr, mono, cached), then ``[round(start_s·rate), round(end_s·rate))``.

The clip comes back as an :class:`~mmrft.rollout.tool.AudioClip` (mono float32 at the model's
rate), which the family renders as an audio part of the tool turn (its audio tokens, 25 per
second for Qwen2-Audio). No peer trainer returns audio from a tool.
"""

from __future__ import annotations

import math
from typing import Any

from mmrft.data import DataError
from mmrft.data.audio import audio_duration, load_audio
from mmrft.rollout.tool import AudioClip, Observation, ToolContext, ToolFailure, tool


def audio_clip_example(context: ToolContext) -> dict[str, Any] | None:
    """One valid ``audio_clip`` call (a smoke run's scripted call): the first second of the
    recording (all of it when shorter, end rounded down to 0.01 s); ``None`` without audio."""
    if context.audio is None:
        return None
    try:
        duration = audio_duration(context.audio)
    except DataError:
        return None
    end = math.floor(min(duration, 1.0, context.max_audio_seconds or 1.0) * 100) / 100
    return {"start_s": 0.0, "end_s": end} if end > 0 else None


@tool(
    "audio_clip",
    timeout_s=20.0,
    example=audio_clip_example,
    parameters={
        "type": "object",
        "properties": {
            "start_s": {"type": "number", "minimum": 0, "description": "start (seconds)"},
            "end_s": {"type": "number", "minimum": 0, "description": "end (seconds)"},
        },
        "required": ["start_s", "end_s"],
    },
)
def audio_clip(context: ToolContext, *, start_s: float, end_s: float) -> Observation:
    """Listen closer to a time interval of the audio: returns the recording from start_s to
    end_s (seconds) as audio."""
    if context.audio is None:
        raise ToolFailure("bad_argument", "this conversation has no audio")
    if not start_s < end_s:
        raise ToolFailure("bad_argument", "start_s must be smaller than end_s")
    limit = context.max_audio_seconds
    if limit is not None and end_s - start_s > limit + 1e-9:
        raise ToolFailure(
            "clip_too_long",
            f"[{start_s:g}, {end_s:g}] s is {end_s - start_s:g} s; ask for at most {limit:g} s",
        )
    try:
        waveform = load_audio(context.audio, context.audio_rate)
    except DataError as exc:
        raise RuntimeError(f"cannot read the audio: {exc}") from None
    rate = context.audio_rate
    duration = len(waveform) / rate
    if start_s >= duration:
        raise ToolFailure(
            "interval_outside_audio",
            f"[{start_s:g}, {end_s:g}] s is outside the audio, which lasts {duration:.2f} s",
        )
    first, last = round(start_s * rate), min(round(end_s * rate), len(waveform))
    if last <= first:
        raise ToolFailure("bad_argument", f"[{start_s:g}, {end_s:g}] s holds no sample")
    end = last / rate
    note = f" (the audio ends at {duration:.2f} s)" if end < end_s - 1e-9 else ""
    return Observation(
        ok=True,
        text=f"Audio of [{start_s:g}, {end:g}] s{note}.",
        audios=[
            AudioClip(
                waveform=waveform[first:last].copy(),
                sampling_rate=rate,
                start_s=first / rate,
                source=str(context.audio),
            )
        ],
        info={"span_s": [float(start_s), float(end)]},
    )
