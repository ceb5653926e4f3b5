"""Video temporal grounding: when does the described event happen (TimeZero, Time-R1)?

A sample holds one video and a query (a question such as "When does the red square appear?",
or a Charades-STA sentence). The target is the event's interval ``[start, end]`` in seconds
with ``0 ≤ start < end``, and ``meta["duration"]`` is the video's length in seconds. The prompt
states the duration (Time-R1 does: a model that sees a handful of sampled frames cannot know
the clip's length otherwise) and asks for ``start to end`` in seconds, TimeZero's answer format
(``"12.54 to 17.83"``); the parser (:func:`mmrft.verifiers.temporal.parse_interval`) also reads
``[12.5, 17.8]``, ``12.5s - 17.8s``, ``mm:ss`` clocks and units.

Dataset formats:

* ``mmrft``: the project JSONL::

      {"id": "video_temporal-test-0000",
       "messages": [{"role": "user", "content": [
           {"type": "video", "video": "videos/test-0000.mp4"},
           {"type": "text", "text": "When does the green circle appear?"}]}],
       "target": [0.0, 1.8],
       "meta": {"duration": 4.0, "fps": 5}}

  ``meta.duration`` is read from the video's header when the line does not give it.
* ``charades``: Charades-STA's annotation files (``charades_sta_train.txt``,
  ``charades_sta_test.txt``), one moment per line::

      3MSZA 24.3 30.4##person turn a light on.

  The video is ``<video_root>/<id><video_ext>`` (task parameters; default root: the ``videos``
  folder beside the annotation file, extension ``.mp4``), its duration comes from the video's
  header (:func:`mmrft.data.video.probe_video`, memoised per file, so the several moments of one
  video probe it once), and the query text is ``When does the event "<sentence>" happen?``.
  Sample ids are ``<video id>-<line>``.

Both formats: an interval must satisfy ``0 ≤ start < end`` and ``start < duration``; an end past
the duration is clipped to it (Charades-STA has annotations that overrun the video by a few
tenths of a second) and the sample keeps ``meta["end_clipped"] = true``.

Metrics (TimeZero / Time-R1): ``R1@0.3``, ``R1@0.5`` (primary, the number the papers headline),
``R1@0.7`` (share of samples whose one predicted interval has tIoU ≥ t) and ``mIoU``, through
:func:`mmrft.rewards.metrics.temporal_recall`; an unparsable answer counts as tIoU 0 and is reported in
``format_fail``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

from mmrft.tasks.video_qa import user_turn
from mmrft.verifiers.temporal import parse_interval, temporal_iou

from mmrft.data import DataError, OnError, ReadStats, Sample, collect_samples
from mmrft.data.video import probe_video
from mmrft.rewards.answers import extract_answer
from mmrft.rewards.metrics import temporal_recall
from mmrft.rewards.task import EvalRecord, ExampleData, Task, ThinkMode, task
from mmrft.typecheck import ConfigError

THRESHOLDS = (0.3, 0.5, 0.7)
"""The tIoU thresholds of ``R1@t``."""


def format_seconds(value: float) -> str:
    """Seconds with at most two decimals and at least one: ``12.5``, ``12.54``, ``0.0``."""
    text = f"{value:.2f}".rstrip("0")
    return text + "0" if text.endswith(".") else text


def video_duration(path: str, where: str) -> float:
    """Duration in seconds of a local video from its header (memoised by
    :func:`mmrft.data.video.probe_video`); DataError naming ``where`` and the file."""
    if not Path(path).is_file():
        raise DataError(f"{where}: video not found ({path})")
    try:
        return probe_video(path).duration_s
    except DataError as exc:
        raise DataError(f"{where}: unreadable video ({exc})") from None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_interval(target: Any, duration: float, where: str, meta: dict[str, Any]) -> list[float]:
    """A valid ``[start, end]`` in seconds inside a video of ``duration`` s (end clipped, see
    the module docstring), else DataError naming ``where``."""
    if not (isinstance(target, list) and len(target) == 2 and all(_is_number(v) for v in target)):
        raise DataError(f"{where}: target must be [start, end] in seconds, got {target!r}")
    start, end = float(target[0]), float(target[1])
    if not 0 <= start < end:
        raise DataError(f"{where}: target {target} needs 0 ≤ start < end")
    if start >= duration:
        raise DataError(f"{where}: target {target} starts after the video's end ({duration:g} s)")
    if end > duration:
        end = duration
        meta["end_clipped"] = True
    return [start, end]


def _iter_lines(path: Path) -> Iterator[tuple[str, str]]:
    if not path.is_file():
        raise DataError(f"dataset file not found: {path}")
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if line.strip():
                yield line.rstrip("\n"), f"{path}:{number}"


@task("temporal_grounding")
class TemporalGroundingTask(Task):
    """Find the interval of the event the query describes, in seconds.

    Template fields: ``{question}`` (``The video lasts <duration> seconds. <query>``) and
    ``{format_instruction}``; the template asks for ``start to end`` in seconds. Reward: format
    + temporal_iou (weights 1, 1; TimeZero's continuous tIoU in [0, 1]; Time-R1's
    boundary-weighted variant is ``{name: temporal_iou, params: {variant: time_r1}}``).
    Metrics: ``R1@0.3``, ``R1@0.5`` (primary), ``R1@0.7``, ``mIoU``.
    """

    template = (
        "{question}\nAnswer with the start and end time of the event in seconds, as "
        '"start to end" (for example "12.5 to 17.8").\n{format_instruction}'
    )
    primary_metric = "R1@0.5"
    formats = ("mmrft", "charades")
    example_data: ClassVar[ExampleData] = {
        "mmrft": ("video_temporal/train.jsonl", "video_temporal/test.jsonl", {}),
        "charades": (
            "video_temporal/charades_sta_train.txt",
            "video_temporal/charades_sta_test.txt",
            {"video_root": "video_temporal/videos"},
        ),
    }

    def __init__(
        self,
        *,
        think: ThinkMode = "required",
        template: str | None = None,
        video_root: str | None = None,
        video_ext: str = ".mp4",
    ) -> None:
        """
        Args:
            think: whether the answer format asks for a ``<think>`` block first.
            template: replaces the prompt template (same fields).
            video_root: folder of the ``charades`` format's videos (Charades' ``Charades_v1_480``);
                default: ``videos/`` beside the annotation file. The ``mmrft`` format always
                resolves media against its JSONL file.
            video_ext: extension of the ``charades`` videos, with its dot.
        """
        super().__init__(think=think, template=template)
        if not video_ext.startswith("."):
            raise ConfigError(
                f"task '{self.name}'.video_ext must start with '.', got {video_ext!r}"
            )
        self.video_root = video_root
        self.video_ext = video_ext

    # -- data ---------------------------------------------------------------------------------
    def read_format(
        self, path: Path, fmt: str, on_error: OnError, check: Callable[[Sample], None] | None
    ) -> tuple[list[Sample], ReadStats]:
        """Read ``path`` in this task's other formats (module docstring)."""
        if fmt == "charades":
            root = Path(self.video_root).expanduser() if self.video_root else path.parent / "videos"

            def parse(line: str, where: str) -> Sample:
                return self._parse_charades(line, root, where)

            return collect_samples(path, _iter_lines(path), parse, on_error, check)
        return super().read_format(path, fmt, on_error, check)

    def parse_record(self, record: Any, base: Path, where: str) -> Sample:
        sample = super().parse_record(record, base, where)
        videos = sample.media("video")
        if len(videos) != 1:
            raise DataError(f"{where}: a temporal-grounding sample needs exactly one video part")
        duration = sample.meta.get("duration")
        if duration is None:
            if not isinstance(videos[0], str) or "://" in videos[0]:
                raise DataError(f"{where}: meta.duration is needed for a remote video")
            duration = video_duration(videos[0], where)
        elif not (_is_number(duration) and duration > 0):
            raise DataError(f"{where}: meta.duration must be a positive number of seconds")
        sample.meta["duration"] = float(duration)
        sample.target = check_interval(sample.target, float(duration), where, sample.meta)
        return sample

    def _parse_charades(self, line: str, root: Path, where: str) -> Sample:
        head, sep, sentence = line.partition("##")
        fields = head.split()
        if not sep or len(fields) != 3 or not sentence.strip():
            raise DataError(f"{where}: expected '<video id> <start> <end>##<sentence>'")
        video_id, start_text, end_text = fields
        try:
            start, end = float(start_text), float(end_text)
        except ValueError:
            raise DataError(f"{where}: start and end must be seconds, got {head!r}") from None
        video = root / f"{video_id}{self.video_ext}"
        duration = video_duration(str(video), where)
        meta: dict[str, Any] = {"duration": duration, "video_id": video_id}
        target = check_interval([start, end], duration, where, meta)
        query = f'When does the event "{sentence.strip().rstrip(".")}" happen?'
        messages = user_turn("video", f"{video_id}{self.video_ext}", query, root, where)
        line_number = where.rsplit(":", 1)[1]
        return Sample(id=f"{video_id}-{line_number}", messages=messages, target=target, meta=meta)

    # -- prompts ------------------------------------------------------------------------------
    def question(self, sample: Sample) -> str:
        """``The video lasts <duration> seconds. <query>``."""
        return f"The video lasts {format_seconds(sample.meta['duration'])} seconds. {sample.text()}"

    # -- rewards and metrics --------------------------------------------------------------------
    def default_verifiers(self) -> list[dict[str, Any]]:
        return self.format_and("temporal_iou")

    def reference_answer(self, sample: Sample) -> str:
        """The target as ``"12.5 to 17.8"`` (seconds, at most two decimals)."""
        start, end = sample.target
        return f"{format_seconds(start)} to {format_seconds(end)}"

    def evaluate_one(self, completion: str, sample: Sample) -> EvalRecord:
        """Strict parse: exactly one answer block holding exactly one interval inside the video
        (:func:`~mmrft.verifiers.temporal.parse_interval` with ``meta["duration"]``, 1 s of
        tolerance at the end, as the reward).

        Values: ``mIoU`` (this sample's tIoU in [0, 1]) and ``R1@0.3`` / ``R1@0.5`` / ``R1@0.7``
        (1 if tIoU ≥ t). ``score`` is ``R1@0.5``. Unparsable answers score 0 with the parser's
        reason (``no answer tag``, ``no interval``, ``reversed interval``, ``outside video``,
        ...); ``parsed`` is ``[start, end]`` in seconds.
        """
        answer, reason = extract_answer(completion)
        interval = None
        if answer is not None:
            interval, reason = parse_interval(answer, sample.meta["duration"])
        tiou = 0.0 if interval is None else temporal_iou(interval, tuple(sample.target))
        values = {f"R1@{t:g}": float(tiou >= t) for t in THRESHOLDS}
        values["mIoU"] = tiou
        parsed = None if interval is None else [round(interval[0], 3), round(interval[1], 3)]
        return EvalRecord(sample.id, completion, parsed, values["R1@0.5"], reason, values)

    def aggregate(self, records: list[EvalRecord]) -> dict[str, float]:
        """:func:`mmrft.rewards.metrics.temporal_recall` of the per-sample tIoUs (``R1@t``, ``mIoU``),
        plus ``format_fail`` (share of answers without a usable interval)."""
        if not records:
            return {}
        out = temporal_recall([r.values.get("mIoU") for r in records], THRESHOLDS)
        out["format_fail"] = sum(r.reason is not None for r in records) / len(records)
        return out
