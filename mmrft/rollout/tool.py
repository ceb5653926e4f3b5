"""The tool API of multi-turn ("thinking with images") rollouts.

A tool is a plain function registered with :func:`tool`, with a JSON schema of its arguments
(the ``parameters`` of an OpenAI / Qwen function description)::

    @tool("crop", aliases=("image_zoom_in",), timeout_s=10.0, parameters={
        "type": "object",
        "properties": {"bbox_2d": {"type": "array", "items": {"type": "number"},
                                   "minItems": 4, "maxItems": 4}},
        "required": ["bbox_2d"],
    })
    def crop(context: ToolContext, *, bbox_2d: list[float]) -> Observation:
        \"\"\"Zoom into a region of an image.\"\"\"
        ...

Built-in tools live in the repository's ``tools/`` folder (shipped as ``mmrft.tools``) and
register themselves exactly like a user's tool (a plugin file, a dotted module or an entry
point, :mod:`mmrft.plugins`). An alias is one more registered name of the same tool; its
schema (:func:`tool_schemas`) carries the alias, so a model is told the name it was trained on
(DeepEyes' ``image_zoom_in``) and the call resolves to the same function.

The model calls a tool in Qwen's hermes form, ``<tool_call>{"name": ..., "arguments": {...}}
</tool_call>``, or in its family's own syntax where its chat template writes one (Gemma 4's
``<|tool_call>call:NAME{...}<tool_call|>``): :class:`CallSyntax`, :func:`parse_tool_calls`;
:func:`run_tool_call` turns the call into an :class:`Observation`. Contract: **nothing the model writes raises**. Unparsable calls, unknown
tools, arguments that break the schema (a missing key, a wrong type, NaN/inf, a value out of
range), a tool that refuses (:class:`ToolFailure`), raises or overruns its time budget, all
come back as ``Observation(ok=False, reason=...)`` with a short text telling the model what
went wrong. Reasons are machine-readable (counted by :func:`tool_stats`):

==========================  ===================================================================
reason                      when
==========================  ===================================================================
``bad_json``                the call is not a JSON object ``{"name": str, "arguments": object}``
                            (Gemma 4's syntax: not ``call:NAME{arguments}`` in its grammar)
``payload_too_large``       one call's text is over ``max_call_bytes`` (checked before parsing)
``unterminated_tag``        a ``<tool_call>`` without its ``</tool_call>`` (or Gemma 4's tags)
``too_many_calls``          more than ``max_calls`` calls in one turn (the rest are dropped)
``unknown_tool``            no tool of that name is enabled
``missing_argument``        a required argument is absent
``bad_argument``            an argument of the wrong type, non-finite, out of range, or unknown
``timeout``                 the tool ran past its ``timeout_s``
``memory``                  the tool went over its worker's memory cap (or raised MemoryError)
``tool_error``              the tool raised, ended its worker, or returned something that is not
                            a well-formed Observation (a non-image, an empty clip, a wrong type)
tool-specific               a :class:`ToolFailure` raised by the tool (``box_outside_image``,
                            ``box_too_small``, ``box_aspect_ratio``, ``too_many_frames``, ...)
==========================  ===================================================================

**Budgets.** In a rollout (:class:`mmrft.rollout.tool_loop.ToolLoop`) a tool runs in a tool
worker process (:func:`tool_pool`, the verifiers' machinery: :class:`mmrft.rewards.pool.WorkerPool`):
one process per loop, started at the first call and kept for the run, SIGKILLed and replaced
when a call runs past ``timeout_s`` (reported ``timeout``: a tool stuck in C code or holding
the GIL cannot stall the rollout), its address space capped at what it holds after loading
the tools plus ``rollout.tools.worker_memory_mb`` (a call past it is ``memory``). What it
returns is checked and bounded in the worker before it is sent back (:func:`_checked`: media
downscaled, text cut to what the trajectory's remaining tokens can hold), so a result of tens
of MB costs neither the transfer nor a tokenisation. The call and its context are pickled:
the context's images go with every call (a 1536² RGB image: about 7 MB, some ms; the measured
cost is in ``docs/tools.md``). Tools that run untrusted code belong in the sandbox
(:mod:`mmrft.rewards.sandbox`) too, which isolates their files and network.

A tool declared ``@tool(..., isolate=False)`` (it needs the policy's process: its model, a
GPU tensor, an open handle), one defined in ``__main__`` or inside a function (a worker cannot
re-create it; warned), and every call of :func:`run_tool_call` without a ``pool`` run in a
daemon thread of this process instead, waited for at most ``timeout_s`` seconds. A Python
thread cannot be killed: a timed-out thread is *abandoned*, it keeps running until its
function returns (or the process ends) and its result is dropped, and one holding the GIL
stalls the caller until it lets go (its call is then ``timeout`` too, however it ended). :func:`tool_stats` counts ``timeout`` and reports
``abandoned_running`` (abandoned threads still alive).

**Boxes.** A tool reads boxes in the model family's own frame (:mod:`mmrft.rewards.boxes`,
``ToolContext.box_frame``) and maps them to pixels of the ORIGINAL full-resolution image with
:meth:`ToolContext.to_image_pixels`: ``norm1000`` (Qwen2-VL, Qwen3-VL) scales by ``W / 1000,
H / 1000``, ``input_pixels`` (Qwen2.5-VL) by ``W / w, H / h`` with ``(w, h)`` the processor's
resized input size (``ModelFamily.input_size``: ``smart_resize`` with the family's
``min_pixels`` / ``max_pixels``).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import math
import re
import threading
import time
import weakref
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from mmrft.data.video import VideoBudget
from mmrft.plugins import TOOLS, Registry, UnknownNameError, did_you_mean, first_paragraph
from mmrft.rewards.boxes import to_pixels
from mmrft.rewards.pool import WORKER_MEMORY_MB

if TYPE_CHECKING:
    from PIL import Image

    from mmrft.data import Sample
    from mmrft.models.family import ModelFamily

log = logging.getLogger(__name__)

MAX_CALL_BYTES = 8192
"""Largest text of one call's body (UTF-8 bytes, between its tags) that is handed to a parser."""

MAX_CALLS = 8
"""Most tool calls read from one model turn; further ones are one ``too_many_calls`` error."""

OPEN_TAG, CLOSE_TAG = "<tool_call>", "</tool_call>"
THINK_CLOSE = "</think>"

MAX_INFO_CHARS = 16384
"""Largest JSON text of an observation's ``info`` (characters); a larger one is a
``tool_error``."""

_REASON = re.compile(r"[a-z][a-z0-9_]{0,39}")
"""A failure reason: a short identifier (it names a metric, ``failed/<reason>``)."""

# JSON-schema keywords the argument validator implements; a schema using others is refused at
# registration (rather than silently not enforced).
_SCHEMA_KEYS = {
    "type",
    "description",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "minItems",
    "maxItems",
    "maxLength",
    "enum",
    "minimum",
    "maximum",
    "default",
}
_TYPES = ("object", "array", "number", "integer", "boolean", "string")


# -- observations ---------------------------------------------------------------------------
@dataclass
class VideoClip:
    """A video returned by a tool: frames to be rendered as a *video* (video tokens, temporal
    positions), not as loose images.

    Attributes:
        frames: RGB PIL images in time order (a frame list, :mod:`mmrft.data.video`).
        timestamps_s: the time of each frame in the source video (seconds from its start).
        fps: the clip's sampling rate (frames/s): ``(T − 1) / (t_last − t_first)`` for T ≥ 2
            frames, the source's native fps for one frame.
        source: the video file the frames come from.
    """

    frames: list[Image.Image]
    timestamps_s: list[float]
    fps: float
    source: str = ""

    def part(self) -> dict[str, Any]:
        """The chat content part: a frame-list video at ``sample_fps = fps`` with
        ``nframes = T``, so a Qwen-VL family samples every frame once (:mod:`mmrft.data.video`).
        The processor's own timestamps (Qwen3-VL) count from the clip's first frame; the
        observation text states the times in the source video."""
        return {
            "type": "video",
            "video": list(self.frames),
            "sample_fps": self.fps,
            "nframes": len(self.frames),
        }


@dataclass
class AudioClip:
    """Audio returned by a tool, rendered as audio (the audio families' audio tokens).

    Attributes:
        waveform: mono samples in [-1, 1] (1-D float32 numpy array) at ``sampling_rate``.
        sampling_rate: samples per second (Hz): the model's feature extractor's rate
            (:attr:`ToolContext.audio_rate`, 16 000 for Qwen2-Audio and the Omni thinkers).
        start_s: the time of the first sample in the source recording (seconds).
        source: the audio file the samples come from.
    """

    waveform: np.ndarray
    sampling_rate: int
    start_s: float = 0.0
    source: str = ""

    @property
    def seconds(self) -> float:
        """The clip's length (seconds): samples / rate."""
        return len(self.waveform) / self.sampling_rate

    def part(self) -> dict[str, Any]:
        """The chat content part: the waveform as an audio array at the model's rate."""
        return {"type": "audio", "audio": self.waveform}


@dataclass
class Observation:
    """What a tool call gives back to the model.

    Attributes:
        ok: whether the tool ran and produced its result.
        text: what the model reads (a short description of the result, or of the failure and
            how to call the tool correctly).
        images: images to show the model (PIL, RGB), in order.
        videos: video clips to show the model (:class:`VideoClip`), in order.
        audios: audio clips to let the model hear (:class:`AudioClip`), in order.
        reason: ``None`` when ``ok``; else a short machine-readable reason (module docstring).
        info: JSON-serialisable facts about the result for records and trajectory-aware
            verifiers, not shown to the model (``crop``: ``box_px``, the region cut in pixels
            of image ``image_index``).
    """

    ok: bool
    text: str
    images: list[Image.Image] = field(default_factory=list)
    videos: list[VideoClip] = field(default_factory=list)
    reason: str | None = None
    info: dict[str, Any] = field(default_factory=dict)
    audios: list[AudioClip] = field(default_factory=list)

    @classmethod
    def fail(cls, reason: str, text: str) -> Observation:
        return cls(ok=False, text=text, reason=reason)

    @property
    def media(self) -> int:
        """Images, clips and audio clips it holds."""
        return len(self.images) + len(self.videos) + len(self.audios)

    def content(self) -> list[dict[str, Any]]:
        """The observation as chat content parts: images, videos, audio clips, then the text."""
        parts: list[dict[str, Any]] = [{"type": "image", "image": im} for im in self.images]
        parts += [clip.part() for clip in self.videos]
        parts += [clip.part() for clip in self.audios]
        parts.append({"type": "text", "text": self.text})
        return parts


class ToolFailure(Exception):
    """Raised by a tool to refuse a call: becomes ``Observation(ok=False, reason=reason,
    text=message)``. Use it for failures caused by the model's arguments."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


# -- the context ----------------------------------------------------------------------------
@dataclass
class ToolContext:
    """What a tool may use: the sample's ORIGINAL media, the family's box frame and budgets.

    Attributes:
        images: full-resolution RGB images, by index: the sample's images first (index 0 is
            its first image); a rollout loop appends the images of observations with
            :meth:`add_image`, so ``image_index`` can point at a returned crop too.
        input_sizes: ``(w, h)`` in pixels of each image as the model saw it after the
            processor's resize (``ModelFamily.input_size``); needed by the ``input_pixels``
            frame. ``None`` entries where unknown.
        box_frame: the frame the model writes boxes in (``ModelFamily.box_frame``:
            ``norm1000``, ``input_pixels``, ``norm1`` or ``pixels``).
        video: path of the sample's original video file, if any.
        video_duration_s: its duration (seconds); read from the file's header when ``None``.
        max_pixels: bound on the area (pixels, W·H) of an image a tool returns; larger results
            are downscaled keeping the aspect ratio.
        video_budget: frame bounds of a returned clip: ``max_frames`` (frames) and
            ``max_pixels`` / ``min_pixels`` per frame (pixels).
        max_video_tokens: bound on the visual tokens of one returned clip (``T/2 ·
            (H/factor)·(W/factor)``, :func:`mmrft.data.video.visual_tokens`); ``None``: no bound.
        factor: side multiple of the family's resized frames (``patch_size × merge_size``,
            pixels: 28 for Qwen2/2.5-VL, 32 for Qwen3-VL).
        audio: path of the sample's original audio file, if any.
        audio_rate: the rate (Hz) a returned audio clip must have: the model's feature
            extractor's (16 000 for the audio families).
        max_audio_seconds: the longest audio clip a tool may return (seconds; the family's
            bound: its audio budget capped by the processor's window); ``None``: no bound.
    """

    images: list[Image.Image] = field(default_factory=list)
    input_sizes: list[tuple[int, int] | None] = field(default_factory=list)
    box_frame: str = "pixels"
    video: str | None = None
    video_duration_s: float | None = None
    max_pixels: int = 401408
    video_budget: VideoBudget = field(default_factory=VideoBudget)
    max_video_tokens: int | None = None
    factor: int = 28
    audio: str | None = None
    audio_rate: int = 16000
    max_audio_seconds: float | None = None

    @classmethod
    def from_sample(
        cls,
        sample: Sample,
        family: ModelFamily,
        *,
        max_pixels: int | None = None,
        video_budget: VideoBudget | None = None,
        max_video_tokens: int | None = None,
        audio_rate: int = 16000,
        max_audio_seconds: float | None = None,
    ) -> ToolContext:
        """The context of ``sample`` for a model of ``family``: the sample's images opened at
        full resolution (local files), their input sizes by ``family.input_size``, the family's
        box frame, its first video and its first audio file. ``max_pixels`` defaults to the
        family's image budget (``family.media.max_pixels``), ``video_budget`` to the family's
        when it has one."""
        from PIL import Image

        from mmrft.data import local_media_path

        images, sizes = [], []
        for source in sample.media("image"):
            if isinstance(source, Image.Image):
                image = source.convert("RGB")
            else:
                with Image.open(local_media_path(str(source)) or str(source)) as opened:
                    image = opened.convert("RGB")
            images.append(image)
            try:
                sizes.append(tuple(family.input_size(*image.size)))
            except NotImplementedError:
                sizes.append(None)
        videos = sample.media("video")
        video = videos[0] if videos and isinstance(videos[0], (str, Path)) else None
        audios = sample.media("audio")
        audio = audios[0] if audios and isinstance(audios[0], (str, Path)) else None
        return cls(
            images=images,
            input_sizes=sizes,
            box_frame=family.box_frame,
            video=str(video) if video is not None else None,
            max_pixels=max_pixels or family.media.max_pixels,
            video_budget=video_budget or getattr(family, "video", None) or VideoBudget(),
            max_video_tokens=max_video_tokens,
            factor=int(getattr(family, "factor", 28)),
            audio=str(audio) if audio is not None else None,
            audio_rate=audio_rate,
            max_audio_seconds=max_audio_seconds,
        )

    def add_image(self, image: Image.Image, input_size: tuple[int, int] | None = None) -> int:
        """Append an image the model was shown (an observation's); returns its index."""
        self.images.append(image)
        self.input_sizes.append(input_size)
        return len(self.images) - 1

    def image(self, index: int) -> Image.Image:
        """Image ``index``; :class:`ToolFailure` ``bad_argument`` when there is none."""
        if not self.images:
            raise ToolFailure("bad_argument", "this conversation has no image")
        if not 0 <= index < len(self.images):
            raise ToolFailure(
                "bad_argument",
                f"image_index {index} does not exist; images are 0 to {len(self.images) - 1}",
            )
        return self.images[index]

    def to_image_pixels(self, box: Sequence[float], index: int = 0) -> list[float]:
        """``box`` ``[x1, y1, x2, y2]`` in :attr:`box_frame` → pixels of image ``index`` at full
        resolution (:func:`mmrft.rewards.boxes.to_pixels`): ``norm1000`` × ``(W/1000, H/1000)``,
        ``norm1`` × ``(W, H)``, ``input_pixels`` × ``(W/w, H/h)`` with ``(w, h) =
        input_sizes[index]``, ``pixels`` unchanged. No clamping here."""
        width, height = self.image(index).size
        meta: dict[str, Any] = {"image_size": [width, height]}
        size = self.input_sizes[index] if index < len(self.input_sizes) else None
        if size is not None:
            meta["input_size"] = list(size)
        elif self.box_frame == "input_pixels":
            raise RuntimeError(f"image {index} has no input size for the input_pixels frame")
        return to_pixels(box, self.box_frame, meta)

    def duration_s(self) -> float:
        """The video's duration (seconds): :attr:`video_duration_s` or its header's."""
        if self.video is None:
            raise ToolFailure("bad_argument", "this conversation has no video")
        if self.video_duration_s is None:
            from mmrft.data.video import probe_video

            self.video_duration_s = probe_video(self.video).duration_s
        return self.video_duration_s


def fit_pixels(image: Image.Image, max_pixels: int) -> Image.Image:
    """``image`` downscaled to at most ``max_pixels`` pixels of area, aspect ratio kept:
    scale ``s = sqrt(max_pixels / (W·H))``, new sides ``max(1, floor(W·s))``,
    ``max(1, floor(H·s))`` (bicubic). Images within the budget are returned as they are (no
    upscaling: the processor's ``min_pixels`` does that)."""
    from PIL import Image

    width, height = image.size
    if width * height <= max_pixels:
        return image
    scale = math.sqrt(max_pixels / (width * height))
    size = (max(1, math.floor(width * scale)), max(1, math.floor(height * scale)))
    return image.resize(size, Image.Resampling.BICUBIC)


# -- registration ---------------------------------------------------------------------------
ToolFn = Callable[..., Observation]


@dataclass(frozen=True)
class ToolSpec:
    """A registered tool.

    Attributes:
        name: its registry name.
        fn: ``fn(context, **arguments) -> Observation``.
        description: one line for the model (the schema's ``description``).
        parameters: JSON schema of the arguments (an object schema).
        aliases: further registered names of the same tool.
        timeout_s: time budget of one call (seconds; 0 = no limit).
        isolate: run it in a tool worker process, killed at ``timeout_s`` (module docstring);
            ``False``: in the caller's process, under a thread's budget.
        example: ``example(context) -> arguments`` of one valid call on that context, or
            ``None`` when the context has nothing the tool can work on (what a smoke run's
            scripted call asks for); ``None``: the tool declares no example.
    """

    name: str
    fn: ToolFn
    description: str
    parameters: dict[str, Any]
    aliases: tuple[str, ...] = ()
    timeout_s: float = 10.0
    isolate: bool = True
    example: Callable[[ToolContext], dict[str, Any] | None] | None = None

    def schema(self, name: str | None = None) -> dict[str, Any]:
        """The function description for a chat template's ``tools=``:
        ``{"type": "function", "function": {"name", "description", "parameters"}}``, named
        ``name`` (an alias) when given."""
        return {
            "type": "function",
            "function": {
                "name": name or self.name,
                "description": self.description,
                "parameters": json.loads(json.dumps(self.parameters)),
            },
        }


def check_schema(schema: Any, where: str = "parameters") -> None:
    """Raise ``ValueError`` unless ``schema`` is a JSON schema the validator fully implements:
    keywords of :data:`_SCHEMA_KEYS` only, ``type`` one of object/array/number/integer/
    boolean/string, ``required`` naming properties, and JSON-serialisable."""
    if not isinstance(schema, dict):
        raise ValueError(f"{where}: a schema is a dict, got {type(schema).__name__}")
    unknown = set(schema) - _SCHEMA_KEYS
    if unknown:
        raise ValueError(f"{where}: unsupported schema keywords {sorted(unknown)}")
    kind = schema.get("type")
    if kind not in _TYPES:
        raise ValueError(f"{where}: 'type' must be one of {', '.join(_TYPES)}, got {kind!r}")
    if kind == "object":
        props = schema.get("properties", {})
        if not isinstance(props, dict):
            raise ValueError(f"{where}: 'properties' must be a dict")
        for key, sub in props.items():
            check_schema(sub, f"{where}.{key}")
        missing = [k for k in schema.get("required", []) if k not in props]
        if missing:
            raise ValueError(f"{where}: required {missing} are not properties")
    if kind == "array":
        check_schema(schema.get("items"), f"{where}[]")
    if "enum" in schema and not isinstance(schema["enum"], list):
        raise ValueError(f"{where}: 'enum' must be a list")
    json.dumps(schema, allow_nan=False)


def _check_signature(fn: ToolFn, parameters: dict[str, Any], name: str) -> None:
    """The function takes the context first, then every schema property as a keyword, and
    needs no argument the schema does not require."""
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())
    if not params or params[0].kind not in (
        params[0].POSITIONAL_ONLY,
        params[0].POSITIONAL_OR_KEYWORD,
    ):
        raise TypeError(f"tool '{name}': the function's first parameter must be the context")
    rest = {p.name: p for p in params[1:]}
    has_kwargs = any(p.kind is p.VAR_KEYWORD for p in rest.values())
    props = parameters.get("properties", {})
    required = set(parameters.get("required", []))
    for key in props:
        if key not in rest and not has_kwargs:
            raise TypeError(f"tool '{name}': schema property '{key}' is not a parameter of fn")
    for p in rest.values():
        if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
            continue
        if p.name not in props:
            raise TypeError(f"tool '{name}': parameter '{p.name}' is not in the schema")
        if p.default is p.empty and p.name not in required:
            raise TypeError(f"tool '{name}': parameter '{p.name}' has no default; require it")


def tool(
    name: str,
    *,
    parameters: dict[str, Any],
    aliases: Iterable[str] = (),
    timeout_s: float = 10.0,
    description: str | None = None,
    isolate: bool = True,
    example: Callable[[ToolContext], dict[str, Any] | None] | None = None,
) -> Callable[[ToolFn], ToolFn]:
    """Register ``fn(context, **arguments) -> Observation`` as tool ``name`` (and ``aliases``).

    Args:
        name: the registry name, the function name a model calls.
        parameters: JSON schema of the arguments (``{"type": "object", "properties": ...,
            "required": [...]}``); checked here (:func:`check_schema`), and against the
            function's keyword parameters.
        aliases: further names of the same tool.
        timeout_s: time budget of one call (seconds; 0 = no limit).
        description: one line for the model; default the docstring's first paragraph.
        isolate: in a rollout, run the tool in a worker process that is killed at
            ``timeout_s`` and whose memory is capped (the default); ``False`` keeps it in the
            policy's process under a thread's budget, which a call stuck in C code outlives
            (for a tool that needs that process's state; module docstring).
        example: ``example(context)``: the arguments of one valid call on ``context`` (e.g. a
            box inside its image), ``None`` when it has nothing to work on; a smoke run
            (``mmrft train … --smoke``) scripts one such call per group.
    """
    check_schema(parameters, f"tool '{name}' parameters")
    if parameters.get("type") != "object":
        raise ValueError(f"tool '{name}': parameters must be an object schema")
    if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s) and timeout_s >= 0):
        raise ValueError(f"tool '{name}': timeout_s must be a finite number ≥ 0")
    aliases = tuple(aliases)

    def register(fn: ToolFn) -> ToolFn:
        if not callable(fn):
            raise TypeError(f"@tool('{name}') decorates a function, got {fn!r}")
        _check_signature(fn, parameters, name)
        spec = ToolSpec(
            name=name,
            fn=fn,
            description=description or first_paragraph(fn.__doc__) or name,
            parameters=parameters,
            aliases=aliases,
            timeout_s=float(timeout_s),
            isolate=bool(isolate),
            example=example,
        )
        for key in (name, *aliases):
            TOOLS.add(key, spec)
        fn.tool_spec = spec  # type: ignore[attr-defined]
        return fn

    return register


ToolRegistry = Registry[Any] | Mapping[str, ToolSpec]


def _lookup(name: str, registry: ToolRegistry) -> ToolSpec:
    """The tool ``name`` of ``registry``; UnknownNameError with the closest names."""
    if isinstance(registry, Registry):
        return registry.get(name)
    if name not in registry:
        raise UnknownNameError(f"unknown tool '{name}'; {did_you_mean(name, registry)}")
    return registry[name]


def enabled_tools(names: Iterable[str], registry: ToolRegistry = TOOLS) -> dict[str, ToolSpec]:
    """``{name: spec}`` of the tools a rollout offers (aliases kept as given); an unknown name
    raises :class:`~mmrft.plugins.UnknownNameError` (a start-up error, never a model error)."""
    return {name: _lookup(name, registry) for name in names}


def tool_schemas(names: Iterable[str], registry: ToolRegistry = TOOLS) -> list[dict[str, Any]]:
    """The function descriptions of tools ``names``, in order, for a chat template's
    ``tools=`` argument; each named as asked (an alias keeps the alias)."""
    return [spec.schema(name) for name, spec in enabled_tools(names, registry).items()]


# -- parsing --------------------------------------------------------------------------------
@dataclass(frozen=True)
class ToolCall:
    """One parsed call: the tool ``name`` and its ``arguments`` (a dict, not yet validated)."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ParseError:
    """A tool call that could not be read.

    Attributes:
        reason: ``bad_json``, ``payload_too_large``, ``unterminated_tag``, ``too_many_calls``.
        message: a short explanation for the model.
        raw: the start of the offending text (at most 200 characters).
        name: the tool the call named where that much could be read (Gemma 4's ``call:NAME``
            before arguments that cannot be read), else ``""``.
    """

    reason: str
    message: str
    raw: str = ""
    name: str = ""


CALL_FORMAT = (
    '<tool_call>{"name": <tool name>, "arguments": {<argument>: <value>, ...}}</tool_call>'
)


def _short(text: str, n: int = 60) -> str:
    """``text`` on one line, cut to ``n`` characters (for messages quoting model output)."""
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"


class CallSyntax:
    """How a model writes a tool call, read and written in one place: the tags around a call,
    how its body is read (:meth:`read`) and how the loop writes one (:meth:`write`: a smoke
    run's call, a demonstration). This class is Qwen's hermes form, every family's default
    (:data:`QWEN_CALLS`): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
    (``arguments`` an object or a JSON string of one). :class:`Gemma4Calls` is Gemma 4's own.
    A loop takes the one its chat template writes (:func:`mmrft.rollout.tool_loop.call_syntax`).

    Attributes:
        name: ``qwen`` or ``gemma4``.
        open_tag / close_tag: the tags around one call.
        think_close: the end of a reasoning block (an unclosed call before it is not a call,
            :func:`parse_tool_calls`).
        format: how a call is written, quoted in failure messages.
        tags: the tags a turn's text must keep where they are single tokens that decoding
            would skip as special (:meth:`mmrft.rollout.tool_loop.ToolLoop._decode`).
    """

    name = "qwen"
    open_tag = OPEN_TAG
    close_tag = CLOSE_TAG
    think_close = THINK_CLOSE
    format = CALL_FORMAT
    tags: tuple[str, ...] = (OPEN_TAG, CLOSE_TAG)

    def parse(
        self,
        text: str,
        *,
        max_call_bytes: int = MAX_CALL_BYTES,
        max_calls: int = MAX_CALLS,
        closed_by_stop: bool = False,
    ) -> list[ToolCall | ParseError]:
        """The calls in a model turn written in this syntax (:func:`parse_tool_calls`)."""
        return parse_tool_calls(
            text,
            max_call_bytes=max_call_bytes,
            max_calls=max_calls,
            closed_by_stop=closed_by_stop,
            syntax=self,
        )

    def read(self, body: str) -> ToolCall | ParseError:
        """One call's body (the text between the tags, already within ``max_call_bytes``):
        a JSON object ``{"name": str, "arguments": object | JSON string of one}``."""
        raw = body[:200]
        try:
            data = json.loads(body.strip())
        except (ValueError, RecursionError) as exc:
            return ParseError(
                "bad_json", f"the tool call is not valid JSON ({_short(exc, 80)})", raw
            )
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            return ParseError("bad_json", f"a tool call is written {CALL_FORMAT}", raw)
        arguments = data.get("arguments", {})
        if isinstance(arguments, str):  # arguments serialised as a JSON string
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except (ValueError, RecursionError) as exc:
                message = f"'arguments' is not valid JSON ({_short(exc, 80)})"
                return ParseError("bad_json", message, raw, data["name"])
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            message = f"'arguments' must be a JSON object: {CALL_FORMAT}"
            return ParseError("bad_json", message, raw, data["name"])
        return ToolCall(data["name"], arguments)

    def write(self, name: str, arguments: Mapping[str, Any]) -> str:
        """The text of a call of tool ``name`` with ``arguments``:
        ``<tool_call>{"name": "crop", "arguments": {"bbox_2d": [1, 2, 3, 4]}}</tool_call>``."""
        body = json.dumps({"name": name, "arguments": dict(arguments)}, ensure_ascii=False)
        return f"{self.open_tag}{body}{self.close_tag}"

    def rewrite(self, text: str) -> str:
        """``text`` with each readable Qwen-form call written in this syntax (:meth:`write`);
        the rest as it is. Scripted turns (demonstrations, an environment's scripted episode,
        a smoke run's call) are written in Qwen's form and rewritten so for the model."""
        if self.open_tag == OPEN_TAG:
            return text
        out, pos = [], 0
        while (start := text.find(OPEN_TAG, pos)) >= 0:
            end = text.find(CLOSE_TAG, start + len(OPEN_TAG))
            if end < 0:
                break
            call = QWEN_CALLS.read(text[start + len(OPEN_TAG) : end])
            out.append(text[pos:start])
            if isinstance(call, ToolCall):
                out.append(self.write(call.name, call.arguments))
            else:
                out.append(text[start : end + len(CLOSE_TAG)])
            pos = end + len(CLOSE_TAG)
        out.append(text[pos:])
        return "".join(out)


STRING_DELIM = '<|"|>'
"""Gemma 4's string quote: a string argument is written ``<|"|>text<|"|>``."""

MAX_NESTING = 64
"""Deepest nesting of objects and arrays in a Gemma 4 call's arguments; deeper is
``bad_json`` (read without recursing past it)."""

GEMMA4_CALL_FORMAT = (
    "<|tool_call>call:<tool name>{<argument>:<value>,...}<tool_call|> "
    '(strings written <|"|>text<|"|>)'
)

_CALL_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
_KEY = re.compile(r"[A-Za-z0-9_.\-$]+")
_WORD = re.compile(r"[^\s,:{}\[\]<>]+")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")
_NON_FINITE = {"NaN", "nan", "Infinity", "-Infinity", "inf", "-inf"}


class _Unreadable(Exception):
    """What a Gemma 4 call's arguments broke (a ``bad_json`` message)."""


class _ArgumentReader:
    """A reader of Gemma 4's argument grammar (:class:`Gemma4Calls`) over ``text`` from
    ``at``; raises :class:`_Unreadable` naming the first rule broken and where."""

    def __init__(self, text: str, at: int = 0) -> None:
        self.text, self.at = text, at

    def fail(self, what: str) -> NoReturn:
        raise _Unreadable(f"{what} at character {self.at}")

    def skip(self) -> None:
        while self.at < len(self.text) and self.text[self.at] in " \t\r\n":
            self.at += 1

    def next_is(self, char: str) -> bool:
        self.skip()
        if self.text.startswith(char, self.at):
            self.at += len(char)
            return True
        return False

    def value(self, depth: int) -> Any:
        self.skip()
        if self.text.startswith(STRING_DELIM, self.at):
            return self.string()
        if self.text.startswith("{", self.at):
            return self.object(depth + 1)
        if self.text.startswith("[", self.at):
            return self.array(depth + 1)
        word = _WORD.match(self.text, self.at)
        if word is None:
            self.fail("expected a value")
        if word.group() in ("true", "false", "null"):
            self.at = word.end()
            return {"true": True, "false": False, "null": None}[word.group()]
        number = _NUMBER.fullmatch(word.group())
        if number is None and word.group() not in _NON_FINITE:
            self.fail(
                f"'{_short(word.group(), 20)}' is not a value (a string is {STRING_DELIM}text{STRING_DELIM})"
            )
        self.at = word.end()
        if number is not None and number.group(1) is None and number.group(2) is None:
            return int(word.group())  # ValueError past Python's digit limit: bad_json
        return float(word.group())  # NaN / inf: the argument check refuses them

    def string(self) -> str:
        self.at += len(STRING_DELIM)
        end = self.text.find(STRING_DELIM, self.at)
        if end < 0:
            self.fail(f"a string opened with {STRING_DELIM} is not closed")
        value = self.text[self.at : end]
        self.at = end + len(STRING_DELIM)
        return value

    def key(self) -> str:
        self.skip()
        if self.text.startswith(STRING_DELIM, self.at):
            return self.string()
        key = _KEY.match(self.text, self.at)
        if key is None:
            self.fail("expected a key (letters, digits, _ - . $)")
        self.at = key.end()
        return key.group()

    def object(self, depth: int) -> dict[str, Any]:
        """``{key:value,...}`` from its ``{``."""
        if depth > MAX_NESTING:
            self.fail(f"nested deeper than {MAX_NESTING} levels")
        self.at += 1
        out: dict[str, Any] = {}
        if self.next_is("}"):
            return out
        while True:
            key = self.key()
            if not self.next_is(":"):
                self.fail("expected ':' after a key")
            out[key] = self.value(depth)
            if self.next_is("}"):
                return out
            if not self.next_is(","):
                self.fail("expected ',' or '}'")

    def array(self, depth: int) -> list[Any]:
        """``[value,...]`` from its ``[``."""
        if depth > MAX_NESTING:
            self.fail(f"nested deeper than {MAX_NESTING} levels")
        self.at += 1
        out: list[Any] = []
        if self.next_is("]"):
            return out
        while True:
            out.append(self.value(depth))
            if self.next_is("]"):
                return out
            if not self.next_is(","):
                self.fail("expected ',' or ']'")


def _gemma4_value(value: Any) -> str:
    """``value`` as Gemma 4's chat template writes an argument (``format_argument`` without
    quoted keys): strings between ``<|"|>``, ``true`` / ``false`` / ``null``, numbers as
    Python prints them, objects ``{key:value,...}`` in ``dictsort`` order (case-insensitive),
    arrays ``[value,...]``, no spaces."""
    if isinstance(value, str):
        return f"{STRING_DELIM}{value}{STRING_DELIM}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, Mapping):
        items = sorted(value.items(), key=lambda kv: str(kv[0]).lower())
        return "{" + ",".join(f"{k}:{_gemma4_value(v)}" for k, v in items) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_gemma4_value(v) for v in value) + "]"
    return str(value)


class Gemma4Calls(CallSyntax):
    """Gemma 4's native calls, as its released chat template writes an assistant message's
    ``tool_calls`` (and the model was trained to write them):
    ``<|tool_call>call:NAME{key:<|"|>text<|"|>,n:42,flag:true,box:[1,2,3,4],o:{k:<|"|>v<|"|>}}<tool_call|>``.

    ``NAME``: letters, digits, ``_ . -`` (at most 64). The arguments' grammar (the template's
    ``format_argument``): an object ``{key:value,...}`` whose keys are bare (letters, digits,
    ``_ - . $``) or between ``<|"|>``; a value is a string between two ``<|"|>`` (taken as it
    is: quotes, commas, braces and newlines inside are text; it cannot hold ``<|"|>``), a
    number (JSON's; NaN / Infinity / inf parse, and the argument check refuses them),
    ``true``, ``false``, ``null``, an object or an array ``[value,...]``. Whitespace between
    tokens is allowed; anything else (a JSON-quoted string, a bare word, a trailing comma,
    text after the closing brace) is ``bad_json`` naming the rule and the character, and
    nesting deeper than :data:`MAX_NESTING` is ``bad_json`` without recursing past it.

    Why not transformers' ``tokenizer.parse_response`` (TRL's ``gemma4_template`` schema):
    it rewrites the ``<|"|>`` strings and bare keys with regular expressions and hands the
    result to ``json.loads``, so one unreadable call raises for the whole response, a body is
    not bounded before it is read, deep nesting raises ``RecursionError``, and a failed call
    cannot say which rule it broke; this reader is bounded and never raises.
    """

    name = "gemma4"
    open_tag = "<|tool_call>"
    close_tag = "<tool_call|>"
    think_close = "<channel|>"
    format = GEMMA4_CALL_FORMAT
    tags = ("<|tool_call>", "<tool_call|>", STRING_DELIM, "<|channel>", "<channel|>")

    def read(self, body: str) -> ToolCall | ParseError:
        """One call's body, ``call:NAME{arguments}`` (within ``max_call_bytes``)."""
        raw = body[:200]
        text = body.strip()
        if not text.startswith("call:"):
            return ParseError("bad_json", f"a tool call is written {self.format}", raw)
        brace = text.find("{")
        name = (text[5:brace] if brace >= 0 else text[5:]).strip()
        if not _CALL_NAME.fullmatch(name):
            message = f"a tool name is letters, digits, _ . - (at most 64): {self.format}"
            return ParseError("bad_json", message, raw)
        if brace < 0:
            return ParseError(
                "bad_json", f"the call has no {{arguments}}: {self.format}", raw, name
            )
        reader = _ArgumentReader(text, brace)
        try:
            arguments = reader.object(1)
            reader.skip()
            if reader.at != len(text):
                reader.fail("text after the arguments' closing '}'")
        except _Unreadable as exc:
            message = f"the call's arguments cannot be read: {exc}; {self.format}"
            return ParseError("bad_json", message, raw, name)
        except (ValueError, RecursionError) as exc:  # an integer past Python's digit limit
            message = f"the call's arguments cannot be read ({_short(exc, 80)})"
            return ParseError("bad_json", message, raw, name)
        return ToolCall(name, arguments)

    def write(self, name: str, arguments: Mapping[str, Any]) -> str:
        """The call as the template writes it: ``<|tool_call>call:crop{bbox_2d:[1,2,3,4]}<tool_call|>``
        (keys sorted as ``dictsort``; a string holding ``<|"|>`` cannot be written)."""
        return f"{self.open_tag}call:{name}{_gemma4_value(dict(arguments))}{self.close_tag}"


QWEN_CALLS = CallSyntax()
"""Qwen's hermes calls: every family's default."""

GEMMA4_CALLS = Gemma4Calls()
"""Gemma 4's native calls, where its chat template writes them."""


def _parse_body(body: str, max_call_bytes: int, syntax: CallSyntax) -> ToolCall | ParseError:
    """``syntax.read(body)``, unless the body is over ``max_call_bytes`` UTF-8 bytes
    (``payload_too_large``, decided before anything reads it)."""
    size = len(body.encode("utf-8", errors="replace")) if len(body) <= max_call_bytes else None
    if size is None or size > max_call_bytes:
        return ParseError(
            "payload_too_large",
            f"a tool call may hold at most {max_call_bytes} bytes; this one is longer",
            body[:200],
        )
    return syntax.read(body)


def parse_tool_calls(
    text: str,
    *,
    max_call_bytes: int = MAX_CALL_BYTES,
    max_calls: int = MAX_CALLS,
    closed_by_stop: bool = False,
    syntax: CallSyntax | None = None,
) -> list[ToolCall | ParseError]:
    """The tool calls in a model turn, in order, written in ``syntax`` (default Qwen's,
    :data:`QWEN_CALLS`: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, with
    ``arguments`` an object or a JSON string of one; :data:`GEMMA4_CALLS`:
    ``<|tool_call>call:NAME{...}<tool_call|>``).

    Robust to hostile text, never raises: a body longer than ``max_call_bytes`` (UTF-8 bytes)
    is refused *before* it is read; an opening tag followed by another before its closing tag,
    or never closed, is ``unterminated_tag``; at most ``max_calls`` calls are read, then one
    ``too_many_calls``; NaN / Infinity literals parse to floats that the argument check
    (:func:`run_tool_call`) refuses. ``closed_by_stop``: the generation stopped at the closing
    tag and the stop string was cut off, so a final unclosed call is read as if it were
    closed. Text outside the tags is ignored.

    **Thinking.** An unclosed opening tag followed by the end of reasoning (``</think>``;
    Gemma 4: ``<channel|>``) before any further opening tag sits in the model's reasoning,
    which the model then closed: it is thinking aloud about a call ("I could <tool_call> zoom
    in, but ..."), not a call, and is ignored, so a turn that goes on to answer is an answer
    (what a reasoning parser in front of a tool parser gives: calls are read from the text
    after the reasoning). A *closed* call inside a think block is still a call, as before; an
    unclosed one that no end of reasoning follows is still ``unterminated_tag`` (the model
    tried to call and did not close it).
    """
    syntax = syntax or QWEN_CALLS
    open_tag, close_tag, form = syntax.open_tag, syntax.close_tag, syntax.format
    out: list[ToolCall | ParseError] = []
    pos = 0
    while True:
        start = text.find(open_tag, pos)
        if start < 0:
            return out
        if len(out) >= max_calls:
            out.append(
                ParseError("too_many_calls", f"at most {max_calls} tool calls are read per turn")
            )
            return out
        body_start = start + len(open_tag)
        end = text.find(close_tag, body_start)
        reopen = text.find(open_tag, body_start)
        reopened = reopen >= 0 and (end < 0 or reopen < end)
        open_ended = end < 0 and reopen < 0 and not closed_by_stop
        stop = reopen if reopened else len(text)
        if (reopened or open_ended) and text.find(syntax.think_close, body_start, stop) >= 0:
            if not reopened:  # reasoning about a call, closed by the end of reasoning
                return out
            pos = reopen
            continue
        if reopened:
            out.append(
                ParseError(
                    "unterminated_tag", f"close each call: {form}", text[start : start + 200]
                )
            )
            pos = reopen
            continue
        if end < 0:
            if closed_by_stop:
                out.append(_parse_body(text[body_start:], max_call_bytes, syntax))
            else:
                out.append(
                    ParseError(
                        "unterminated_tag",
                        f"the tool call has no {close_tag}: {form}",
                        text[start : start + 200],
                    )
                )
            return out
        out.append(_parse_body(text[body_start:end], max_call_bytes, syntax))
        pos = end + len(close_tag)


# -- argument validation --------------------------------------------------------------------
class _ArgumentError(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _check_value(value: Any, schema: Mapping[str, Any], where: str) -> Any:
    """``value`` checked against ``schema`` (the subset of :data:`_SCHEMA_KEYS`); returns it
    with integral floats of ``integer`` schemas made ints. Raises :class:`_ArgumentError`."""
    kind = schema.get("type")

    def bad(message: str) -> _ArgumentError:
        return _ArgumentError("bad_argument", f"{where}: {message}")

    if kind in ("number", "integer"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad(f"expected a number, got {_type_name(value)}")
        if isinstance(value, float) and not math.isfinite(value):
            raise bad(f"expected a finite number, got {value}")
        if kind == "integer" and isinstance(value, float):
            if not value.is_integer():
                raise bad(f"expected an integer, got {value}")
            value = int(value)
        if "minimum" in schema and value < schema["minimum"]:
            raise bad(f"must be ≥ {schema['minimum']}, got {_short(repr(value), 30)}")
        if "maximum" in schema and value > schema["maximum"]:
            raise bad(f"must be ≤ {schema['maximum']}, got {_short(repr(value), 30)}")
    elif kind == "boolean":
        if not isinstance(value, bool):
            raise bad(f"expected true or false, got {_type_name(value)}")
    elif kind == "string":
        if not isinstance(value, str):
            raise bad(f"expected a string, got {_type_name(value)}")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            raise bad(f"expected at most {schema['maxLength']} characters, got {len(value)}")
    elif kind == "array":
        if not isinstance(value, list):
            raise bad(f"expected an array, got {_type_name(value)}")
        if "minItems" in schema and len(value) < schema["minItems"]:
            raise bad(f"expected at least {schema['minItems']} items, got {len(value)}")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            raise bad(f"expected at most {schema['maxItems']} items, got {len(value)}")
        value = [_check_value(v, schema["items"], f"{where}[{i}]") for i, v in enumerate(value)]
    elif kind == "object":
        if not isinstance(value, dict):
            raise bad(f"expected an object, got {_type_name(value)}")
        props = schema.get("properties", {})
        for key in schema.get("required", []):
            if key not in value:
                raise _ArgumentError("missing_argument", f"missing required argument '{key}'")
        if schema.get("additionalProperties", False) is False:
            extra = [k for k in value if k not in props]
            if extra:
                hint = did_you_mean(str(extra[0]), props)
                raise _ArgumentError(
                    "bad_argument", f"unknown argument '{_short(extra[0], 40)}'; {hint}"
                )
        value = {
            k: _check_value(v, props[k], f"{where}.{k}" if where else k) if k in props else v
            for k, v in value.items()
        }
    if "enum" in schema and value not in schema["enum"]:
        choices = ", ".join(json.dumps(c) for c in schema["enum"])
        raise bad(f"must be one of {choices}, got {_short(json.dumps(value), 30)}")
    return value


def validate_arguments(arguments: Any, parameters: Mapping[str, Any]) -> dict[str, Any]:
    """``arguments`` checked against the object schema ``parameters``: required keys present,
    no unknown keys (unless ``additionalProperties``), types (a boolean is not a number; an
    integral float passes as an integer), finite numbers, ``minimum`` / ``maximum``, array
    lengths, ``enum``. Raises :class:`ToolFailure` (``missing_argument`` / ``bad_argument``)."""
    try:
        return _check_value(arguments, parameters, "")
    except _ArgumentError as exc:
        raise ToolFailure(exc.reason, exc.message.lstrip(": ")) from None


# -- running --------------------------------------------------------------------------------
_STATS: Counter[str] = Counter()
_STATS_LOCK = threading.Lock()
_ABANDONED: weakref.WeakSet[threading.Thread] = weakref.WeakSet()


def _count(key: str) -> None:
    with _STATS_LOCK:
        _STATS[key] += 1


def tool_stats() -> dict[str, int]:
    """Counters since start-up: ``calls``, ``ok``, ``failed/<reason>`` per failure reason
    (``failed/timeout``: worker processes killed and threads abandoned at their deadline), and
    ``abandoned_running``: abandoned threads (of tools run in this process) still running now."""
    with _STATS_LOCK:
        out = dict(_STATS)
        out["abandoned_running"] = sum(t.is_alive() for t in list(_ABANDONED))
    return out


def _usage(spec: ToolSpec, name: str) -> str:
    """``name(arg: type, [optional: type])`` for failure texts."""
    props = spec.parameters.get("properties", {})
    required = set(spec.parameters.get("required", []))
    args = [
        f"{k}: {s.get('type', 'any')}" if k in required else f"[{k}: {s.get('type', 'any')}]"
        for k, s in props.items()
    ]
    return f"{name}({', '.join(args)})"


def _finish(obs: Observation) -> Observation:
    _count("ok" if obs.ok else f"failed/{obs.reason}")
    return obs


def _cut_text(text: str, most: int | None) -> str:
    """``text`` cut to at most ``most`` characters, ending with a note that says it was cut
    (None: as is). Cutting twice changes nothing."""
    if most is None or len(text) <= most:
        return text
    note = f"\n[cut: {len(text)} characters are more than this conversation's token budget]"
    return text[: most - len(note)] + note if most > len(note) else text[: max(0, most)]


def _checked(
    obs: Any,
    what: str,
    context: ToolContext,
    max_text_chars: int | None = None,
    max_media: int | None = None,
) -> Observation:
    """What a tool returned (``what``: the call, as messages name it: ``Tool 'crop'``), checked
    and bounded before anything renders or tokenises it.

    A value that is not a well-formed :class:`Observation` is a ``tool_error`` (the field and
    type named): ``ok`` a bool, ``text`` a str, ``reason`` a short identifier or ``None``,
    ``info`` a dict whose JSON is at most :data:`MAX_INFO_CHARS`, ``images`` a list of
    non-empty PIL images, ``videos`` a list of :class:`VideoClip` whose ``frames`` are 1 to
    ``context.video_budget.max_frames`` PIL images of one size, ``timestamps_s`` one finite
    number per frame and ``fps`` finite and > 0, ``audios`` a list of :class:`AudioClip` whose
    ``waveform`` is a non-empty 1-D real array of finite samples at ``context.audio_rate`` and
    at most ``context.max_audio_seconds`` long. Then the bounds: media past ``max_media + 1``
    are dropped (a trajectory with ``max_media`` left still stops ``max_media``, as it would
    with all of them), images and frames are made RGB and downscaled to
    ``context.max_pixels`` / ``context.video_budget.max_pixels`` (:func:`fit_pixels`), audio
    made float32 in [-1, 1], and the text is cut to ``max_text_chars`` characters
    (:func:`_cut_text`)."""
    from PIL import Image

    def bad(returned: str) -> Observation:
        return Observation.fail("tool_error", f"{what} failed: it returned {returned}")

    if not isinstance(obs, Observation):
        return bad(f"{type(obs).__name__}, not an Observation")
    for field_name, kinds in (
        ("ok", bool),
        ("text", str),
        ("images", list),
        ("videos", list),
        ("audios", list),
        ("info", dict),
        ("reason", (str, type(None))),
    ):
        value = getattr(obs, field_name)
        if not isinstance(value, kinds):
            return bad(f"an Observation whose {field_name} is a {type(value).__name__}")
    if obs.reason is not None and not _REASON.fullmatch(obs.reason):
        return bad("an Observation whose reason is not a short identifier ([a-z0-9_], ≤ 40)")
    try:
        info_chars = len(json.dumps(obs.info))
    except (TypeError, ValueError, RecursionError):
        return bad("an Observation whose info is not JSON-serialisable")
    if info_chars > MAX_INFO_CHARS:
        return bad(f"an Observation whose info is over {MAX_INFO_CHARS} characters of JSON")
    if max_media is not None:
        keep = max(0, max_media) + 1
        obs.images = obs.images[:keep]
        obs.videos = obs.videos[: max(0, keep - len(obs.images))]
        obs.audios = obs.audios[: max(0, keep - len(obs.images) - len(obs.videos))]
    for i, image in enumerate(obs.images):
        if not isinstance(image, Image.Image) or min(image.size) < 1:
            return bad(f"images[{i}] that is not a non-empty PIL image ({type(image).__name__})")
    max_frames = context.video_budget.max_frames
    for i, clip in enumerate(obs.videos):
        if not isinstance(clip, VideoClip):
            return bad(f"videos[{i}] that is a {type(clip).__name__}, not a VideoClip")
        frames, times, fps = clip.frames, clip.timestamps_s, clip.fps
        if not isinstance(frames, list) or not frames:
            return bad(f"videos[{i}] without frames")
        if len(frames) > max_frames:
            return bad(f"a clip over {max_frames} frames")
        if not all(isinstance(f, Image.Image) and min(f.size) >= 1 for f in frames):
            return bad(f"videos[{i}] whose frames are not all non-empty PIL images")
        if len({f.size for f in frames}) != 1:
            return bad(f"videos[{i}] whose frames differ in size")
        if (
            not isinstance(times, list)
            or len(times) != len(frames)
            or not all(_finite_number(t) for t in times)
        ):
            return bad(f"videos[{i}] without one finite timestamp per frame")
        if not _finite_number(fps) or fps <= 0:
            return bad(f"videos[{i}] whose fps is not a finite number > 0")
    for i, clip in enumerate(obs.audios):
        problem = _audio_problem(clip, context)
        if problem:
            return bad(f"audios[{i}] {problem}")
        clip.waveform = np.clip(np.asarray(clip.waveform, dtype=np.float32), -1.0, 1.0)
    obs.images = [fit_pixels(_rgb(im), context.max_pixels) for im in obs.images]
    for clip in obs.videos:
        clip.frames = [fit_pixels(_rgb(f), context.video_budget.max_pixels) for f in clip.frames]
    obs.text = _cut_text(obs.text, max_text_chars)
    return obs


def _audio_problem(clip: Any, context: ToolContext) -> str:
    """What is wrong with a returned audio clip (``""``: nothing), as :func:`_checked` says it."""
    if not isinstance(clip, AudioClip):
        return f"that is a {type(clip).__name__}, not an AudioClip"
    wave = clip.waveform
    if not isinstance(wave, np.ndarray) or wave.ndim != 1 or wave.size == 0:
        return "whose waveform is not a non-empty 1-D numpy array"
    if wave.dtype.kind not in "fiu":
        return f"whose waveform holds {wave.dtype} samples, not numbers"
    if clip.sampling_rate != context.audio_rate:
        return f"at {clip.sampling_rate!r} Hz, not the model's {context.audio_rate} Hz"
    limit = context.max_audio_seconds
    if limit is not None and wave.size > math.floor(limit * context.audio_rate):
        return f"of {wave.size / context.audio_rate:.2f} s, over the {limit:g} s limit"
    if not np.isfinite(wave).all():
        return "with NaN or infinite samples"
    return ""


def _finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _rgb(image: Image.Image) -> Image.Image:
    return image if image.mode == "RGB" else image.convert("RGB")


def _invoke(
    spec: ToolSpec,
    name: str,
    arguments: dict[str, Any],
    context: ToolContext,
    max_text_chars: int | None,
    max_media: int | None,
) -> Observation:
    """Run the tool and check what it returned (:func:`_checked`): a :class:`ToolFailure` is
    its observation, any other exception a ``tool_error``; ``MemoryError`` is raised (the
    caller reports ``memory``). The same in a worker process and in a thread."""
    return call_checked(
        f"Tool '{name}'",
        lambda: spec.fn(context, **arguments),
        context,
        max_text_chars,
        max_media,
    )


def call_checked(
    what: str,
    fn: Callable[[], Any],
    context: ToolContext,
    max_text_chars: int | None,
    max_media: int | None,
) -> Observation:
    """``fn()`` (a tool's or an environment's call, ``what`` naming it: ``Tool 'crop'``) as a
    checked observation (:func:`_checked`): a :class:`ToolFailure` is its failure, any other
    exception a ``tool_error``; ``MemoryError`` is raised (the caller reports ``memory``)."""
    try:
        obs = fn()
    except ToolFailure as exc:
        reason = exc.reason if isinstance(exc.reason, str) and _REASON.fullmatch(exc.reason) else ""
        text = _cut_text(str(exc.message), max_text_chars)
        return Observation.fail(reason or "tool_error", text)
    except MemoryError:
        raise
    except Exception as exc:
        text = f"{what} failed: {type(exc).__name__}: {_short(exc, 160)}"
        return Observation.fail("tool_error", text)
    return _checked(obs, what, context, max_text_chars, max_media)


IMAGE_CACHE_BYTES = 512 * 2**20
"""Bytes of decoded context images (W·H·bands) a tool worker keeps between calls, so that the
sample's full-resolution images cross to it once, not with every call."""


class CacheMiss(Exception):
    """A worker was sent a reference to an image it no longer holds (it was replaced): the
    call is sent again with every image."""


class _ImageLRU:
    """Least-recently-used images by key, at most ``capacity`` bytes (the newest always
    kept). The tool worker holds the images; :class:`ToolPool` a mirror of the keys and sizes,
    changed by the same operations in the same order, so it knows what the worker holds."""

    def __init__(self, capacity: int = IMAGE_CACHE_BYTES) -> None:
        self.capacity = capacity
        self.items: OrderedDict[int, tuple[Any, int]] = OrderedDict()
        self.total = 0

    def touch(self, key: int) -> Any:
        """Mark ``key`` used; its value. KeyError when absent."""
        self.items.move_to_end(key)
        return self.items[key][0]

    def put(self, key: int, size: int, value: Any = None) -> None:
        if key in self.items:
            self.total -= self.items.pop(key)[1]
        self.items[key] = (value, size)
        self.total += size
        while self.total > self.capacity and len(self.items) > 1:
            self.total -= self.items.popitem(last=False)[1][1]

    def clear(self) -> None:
        self.items.clear()
        self.total = 0


def _image_bytes(image: Any) -> int:
    """The decoded size of a PIL image (W·H·bands); 0 for anything else."""
    try:
        return int(image.width) * int(image.height) * len(image.getbands())
    except Exception:
        return 0


_WORKER_IMAGES = _ImageLRU()
"""The images this process holds as a tool worker (:func:`serve_call`)."""


def serve_call(request: tuple) -> Observation:
    """One tool call in a tool worker process (the handler of :class:`ToolPool`):
    ``(name, arguments, context fields, images, reset, max_text_chars, max_media)`` → its
    checked :class:`Observation`. ``images``: per context image ``("new", key, image)`` or
    ``("ref", key)`` for one sent before (:class:`CacheMiss` when it is not held);
    ``reset``: forget the images held first."""
    name, arguments, fields, images, reset, max_text_chars, max_media = request
    if reset:
        _WORKER_IMAGES.clear()
    resolved = []
    for entry in images:
        if entry[0] == "new":
            if entry[1] >= 0:  # -1: an image the parent does not track
                _WORKER_IMAGES.put(entry[1], _image_bytes(entry[2]), entry[2])
            resolved.append(entry[2])
        else:
            try:
                resolved.append(_WORKER_IMAGES.touch(entry[1]))
            except KeyError:
                raise CacheMiss(f"image {entry[1]} is not held") from None
    context = ToolContext(images=resolved, **fields)
    return _invoke(TOOLS.get(name), name, arguments, context, max_text_chars, max_media)


class ToolPool:
    """The tool worker process of a loop (:class:`mmrft.rewards.pool.WorkerPool` with the
    handler :func:`serve_call`), started at its first call, and what it holds of the contexts'
    images: each image object crosses once (while the worker keeps it,
    :data:`IMAGE_CACHE_BYTES`), later calls send its key.

    Attributes:
        names: the tools it runs (registry names, aliases as enabled).
    """

    def __init__(self, tools: dict[str, ToolSpec], memory_mb: int | None) -> None:
        from mmrft.rewards.pool import WorkerPool

        self.pool = WorkerPool(
            tools,
            1,
            memory_mb,
            registry="tools",
            handler="mmrft.rollout.tool:serve_call",
            start=False,
            what="tool",
            hint="declare the tool with @tool(..., isolate=False)",
        )
        self.names = set(tools)
        self._held = _ImageLRU()  # the mirror of _WORKER_IMAGES in the worker
        self._held_by: int | None = None  # the worker process it mirrors
        self._keys: dict[int, tuple[weakref.ref[Any], int]] = {}  # id(image) → (image, key)
        self._next_key = 0
        self._lock = threading.Lock()

    @property
    def pids(self) -> list[int]:
        """The worker's process id (none before the first call)."""
        return self.pool.pids

    def close(self) -> None:
        """Stop the worker (idempotent)."""
        self.pool.close()

    def call(
        self,
        name: str,
        arguments: dict[str, Any],
        context: ToolContext,
        timeout_s: float,
        limits: tuple[int | None, int | None],
    ) -> tuple[str, Any]:
        """:meth:`WorkerPool.call_one` of the call: ``("ok", observation)``, ``("timeout",
        None)`` or ``("memory", None)``; raises what it raises. A worker that lost the images
        (replaced between calls) is sent them all again, once."""
        from mmrft.rewards.pool import WorkerRaised

        fields = {f.name: getattr(context, f.name) for f in dataclasses.fields(context)}
        del fields["images"]
        with self._lock:
            for attempt in (0, 1):
                pids = self.pool.pids
                reset = attempt == 1 or not pids or pids[0] != self._held_by
                if reset:
                    self._held.clear()
                images = [self._entry(image) for image in context.images]
                request = (name, arguments, fields, images, reset, *limits)
                self._held_by = None  # until the worker has answered
                try:
                    kind, value = self.pool.call_one(request, timeout_s)
                except WorkerRaised as exc:
                    if exc.kind == CacheMiss.__name__ and attempt == 0:
                        continue
                    raise
                if kind == "ok":  # else the worker was replaced: it holds nothing
                    self._held_by = self.pool.pids[0]
                return kind, value
        raise AssertionError("unreachable")  # pragma: no cover

    def _entry(self, image: Any) -> tuple:
        """``("ref", key)`` for an image the worker holds, else ``("new", key, image)``."""
        known = self._keys.get(id(image))
        if known is not None and known[0]() is image:
            key = known[1]
        else:
            try:
                ref = weakref.ref(image)
            except TypeError:  # not weak-referenceable: sent every time
                return ("new", -1, image)
            self._next_key += 1
            key = self._next_key
            if len(self._keys) > 4096:  # forget the images that are gone
                self._keys = {i: k for i, k in self._keys.items() if k[0]() is not None}
            self._keys[id(image)] = (ref, key)
        if key in self._held.items:
            self._held.touch(key)
            return ("ref", key)
        self._held.put(key, _image_bytes(image))
        return ("new", key, image)


def tool_pool(
    tools: Mapping[str, ToolSpec], memory_mb: int | None = WORKER_MEMORY_MB
) -> ToolPool | None:
    """The worker process of the ``isolate`` tools of ``tools`` (name → spec, aliases kept), or
    ``None`` when there are none; it starts at the first call and stops with
    :meth:`ToolPool.close` (or at exit). A tool a worker cannot re-create (defined in
    ``__main__`` or inside a function) stays in this process, with a warning. ``memory_mb``:
    what the worker may map beyond what it holds after loading the tools (MiB; None = no
    cap)."""
    from mmrft.rewards.pool import source

    pooled = {}
    for name, spec in tools.items():
        if not spec.isolate:
            continue
        if source(spec.fn) is None:
            log.warning(
                "tool '%s' is defined in __main__ or inside a function, where a worker process "
                "cannot re-create it: it runs in this process, where its timeout_s cannot stop "
                "a call stuck in C code (define it in a plugin file, or declare "
                "@tool(..., isolate=False))",
                name,
            )
            continue
        pooled[name] = spec
    return ToolPool(pooled, memory_mb) if pooled else None


def run_tool_call(
    call: ToolCall | ParseError,
    context: ToolContext,
    registry: ToolRegistry = TOOLS,
    *,
    timeout_s: float | None = None,
    pool: ToolPool | None = None,
    max_text_chars: int | None = None,
    max_media: int | None = None,
) -> Observation:
    """Run one parsed call and return its :class:`Observation`; never raises on model output.

    Steps: a :class:`ParseError` becomes a failed observation with its reason; the tool is
    looked up in ``registry`` (the global :data:`~mmrft.plugins.TOOLS` or the mapping of
    :func:`enabled_tools`, ``unknown_tool`` with the closest names otherwise); the arguments are
    checked against its schema (:func:`validate_arguments`); then the tool runs for at most
    ``timeout_s`` seconds (default the tool's own; 0 = no limit): in ``pool``'s worker process
    (:func:`tool_pool`) when the pool holds it, killed at the deadline; else in a daemon
    thread of this process, abandoned at the deadline (module docstring). What it returns is
    checked and bounded (:func:`_checked`): ``max_text_chars`` (characters of text; None = no
    bound), ``max_media`` (images and clips the trajectory may still add; None = no bound).
    """
    _count("calls")
    if isinstance(call, ParseError):
        return _finish(Observation.fail(call.reason, f"Tool call refused: {call.message}."))
    try:
        spec = _lookup(call.name, registry)
    except KeyError as exc:
        return _finish(Observation.fail("unknown_tool", f"{_short(exc, 200)}."))
    try:
        arguments = validate_arguments(call.arguments, spec.parameters)
    except ToolFailure as exc:
        return _finish(
            Observation.fail(exc.reason, f"{exc.message}. Usage: {_usage(spec, call.name)}.")
        )
    budget = spec.timeout_s if timeout_s is None else timeout_s
    limits = (max_text_chars, max_media)
    if pool is not None and spec.isolate and call.name in pool.names:
        return _finish(_in_worker(pool, spec, call.name, arguments, context, budget, limits))
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["value"] = _invoke(spec, call.name, arguments, context, *limits)
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=work, name=f"mmrft-tool:{spec.name}", daemon=True)
    started = time.monotonic()
    thread.start()
    thread.join(budget or None)
    if thread.is_alive():
        with _STATS_LOCK:
            _ABANDONED.add(thread)
        return _finish(_timed_out(call.name, budget))
    if budget and time.monotonic() - started > budget:  # it held the GIL past the deadline
        return _finish(_timed_out(call.name, budget))
    error = box.get("error")
    if isinstance(error, MemoryError):
        return _finish(_over_memory(call.name))
    if error is not None:
        text = f"Tool '{call.name}' failed: {type(error).__name__}: {_short(error, 160)}"
        return _finish(Observation.fail("tool_error", text))
    return _finish(box["value"])


def _timed_out(name: str, budget: float) -> Observation:
    return Observation.fail(
        "timeout", f"Tool '{name}' ran past its {budget:g} s budget and was stopped."
    )


def _over_memory(name: str) -> Observation:
    return Observation.fail(
        "memory", f"Tool '{name}' ran out of memory (its worker's cap) and was stopped."
    )


def _in_worker(
    pool: ToolPool,
    spec: ToolSpec,
    name: str,
    arguments: dict[str, Any],
    context: ToolContext,
    budget: float,
    limits: tuple[int | None, int | None],
) -> Observation:
    """The call in the pool's worker process: killed at ``budget`` seconds (``timeout``), over
    the memory cap (``memory``); a worker that raised, died or could not be sent the call is a
    ``tool_error``. The reply is checked again here (:func:`_checked`: cheap on a checked
    observation), so nothing unchecked joins a trajectory."""
    from mmrft.rewards.pool import NotSendable, PoolError, WorkerDied, WorkerRaised

    try:
        kind, value = pool.call(name, arguments, context, budget, limits)
    except NotSendable as exc:
        text = f"Tool '{name}' failed: its call could not be sent to its worker ({exc})"
        return Observation.fail("tool_error", text)
    except WorkerDied as exc:
        return Observation.fail("tool_error", f"Tool '{name}' failed: its worker ended ({exc})")
    except WorkerRaised as exc:
        text = f"Tool '{name}' failed: {exc.kind}: {_short(exc.message, 160)}"
        return Observation.fail("tool_error", text)
    except PoolError as exc:  # pragma: no cover - the pool raises only the ones above
        return Observation.fail("tool_error", f"Tool '{name}' failed: {_short(exc, 160)}")
    if kind == "timeout":
        return _timed_out(name, budget)
    if kind == "memory":
        return _over_memory(name)
    return _checked(value, f"Tool '{name}'", context, *limits)
