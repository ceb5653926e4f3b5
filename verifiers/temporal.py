"""The temporal-grounding verifier: one predicted interval against the target interval.

TimeZero / Time-R1 (docs/reference.md): the model answers "12.54 to 17.83" (seconds); the reward is
the temporal IoU, or Time-R1's tIoU × (1 − |Δs| / D)(1 − |Δe| / D). The parser,
:func:`parse_interval`, is shared with temporal-grounding tasks' evaluation.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Literal

from mmrft.data import Sample
from mmrft.rewards import Score, verifier
from mmrft.rewards.answers import check_answer_tag, extract_answer

MAX_ANSWER_CHARS = 10_000
"""Longer answers score 0 (``answer too long``) unparsed; an interval takes a few dozen
characters, and the bound keeps the parse of adversarial junk to a few milliseconds."""

_UNITS = {
    "ms": 0.001,
    "msec": 0.001,
    "millisecond": 0.001,
    "milliseconds": 0.001,
    "s": 1.0,
    "sec": 1.0,
    "secs": 1.0,
    "second": 1.0,
    "seconds": 1.0,
    "min": 60.0,
    "mins": 60.0,
    "minute": 60.0,
    "minutes": 60.0,
    "h": 3600.0,
    "hr": 3600.0,
    "hrs": 3600.0,
    "hour": 3600.0,
    "hours": 3600.0,
}
# A time token: digits with at most two clock fields and a decimal part (12 / 12.5 / 01:05 /
# 1:02:03.25), an exponent, an optional unit. The pattern starts with a digit, which re scans for
# in C, and its first lookbehind rejects digits glued to a word or a clock field there too, so a
# long answer of junk costs no Python per character. A leading "." (".5") and a minus sign are
# read in Python, only for tokens that match.
_TIME = re.compile(
    r"\d(?<![\w:]\d)(?<![\w.:]\.\d)"  # the first digit, not glued to a word or a clock
    r"\d*(?::\d+){0,2}(?:\.\d+)?(?:[eE][-+]?\d+)?"
    r"(?![\d:]|\.\d)"  # not cut out of a longer number or clock
    r"(?:\s*(?P<unit>" + "|".join(sorted(_UNITS, key=len, reverse=True)) + r")\b)?",
    re.IGNORECASE,
)
_GLUE = frozenset(".:_")  # with letters and digits: characters a time must not follow
_SCAN_LIMIT = 5  # times read before giving up: more than 2 already fails


@dataclass(frozen=True)
class _Time:
    start: int  # position of the first character, sign included
    end: int
    value: float | None  # seconds, without the sign; None when not a valid time
    unit: str | None  # the unit written after a plain number
    plain: bool  # a plain number (not a clock)
    negative: bool


def _glued(text: str, i: int) -> bool:
    """Whether position ``i`` follows a word character, a dot or a colon."""
    return i > 0 and (text[i - 1].isalnum() or text[i - 1] in _GLUE)


def _read(text: str, m: re.Match) -> _Time | None:
    """The time of one token match, or ``None`` when it is not one (".5" glued to a word)."""
    start = m.start()
    token = text[start : m.start("unit") if m.group("unit") else m.end()].rstrip()
    if start > 0 and text[start - 1] == ".":  # ".5": the dot is the number's
        start -= 1
        if _glued(text, start) or ":" in token or "." in token:  # ".2.2" is not a number
            return None
        token = "." + token
    negative = start > 0 and text[start - 1] in "-−" and not _glued(text, start - 1)
    if negative:
        start -= 1
    fields = token.split(":")
    unit = m.group("unit")
    value: float | None
    if len(fields) == 1:
        value = float(token)
        value = value * _UNITS[unit.lower()] if unit else value
    elif "e" in token.lower() or any(
        len(f.split(".")[0]) > 2 or float(f) >= 60 for f in fields[1:]
    ):
        value = None  # 01:75, 1:123, 1:05e3 (the pattern allows a decimal part last only)
    else:
        value = sum(float(f) * 60**k for k, f in enumerate(reversed(fields)))
    if value is not None and not math.isfinite(value):
        value = None
    return _Time(
        start, m.end(), value, unit if len(fields) == 1 else None, len(fields) == 1, negative
    )


def _find_times(answer: str) -> list[_Time]:
    """Up to ``_SCAN_LIMIT`` times, left to right."""
    found: list[_Time] = []
    for m in _TIME.finditer(answer):
        time = _read(answer, m)
        if time is not None:
            found.append(time)
            if len(found) >= _SCAN_LIMIT:
                break
    return found


def parse_interval(
    answer: str, duration: float | None = None, tolerance: float = 1.0
) -> tuple[tuple[float, float] | None, str | None]:
    """The one ``(start, end)`` interval in seconds that ``answer`` states, checked.

    Accepted forms (any text around them): ``12.54 to 17.83``, ``[12.5, 17.8]``,
    ``12.5s - 17.8s``, ``12.5 - 17.8 seconds``, ``from 12.5 to 17.8``, ``12.5–17.8``, clock times
    ``mm:ss(.ff)`` and ``hh:mm:ss(.ff)`` (``01:05 to 01:12.5``), and the units ms, s, sec,
    second(s), min, minute(s), h, hour(s). A number without a unit takes the other number's
    unit (``1 to 2 minutes`` = 60–120 s), else seconds; clock times carry their own. A ``-``
    right after the first time is a separator (``12.5 - 17.8``), elsewhere a minus sign.

    Checks, each a reason: fewer than two times → ``"no interval"``; three → ``"extra
    numbers"``; four or more → ``"several intervals"``; a clock field ≥ 60 or an infinite
    value → ``"bad time"``; ``"negative time"``; start > end → ``"reversed interval"``;
    start = end → ``"empty interval"``; and, with ``duration``, a start at or after
    ``duration`` or an end beyond ``duration + tolerance`` → ``"outside video"``. An end within
    the tolerance is clipped to ``duration``. The first two times are start and end in the
    order written.

    >>> parse_interval("The event happens from 01:05 to 01:12.5.")
    ((65.0, 72.5), None)
    >>> parse_interval("12.5 - 17.8 seconds", duration=30)
    ((12.5, 17.8), None)
    >>> parse_interval("17.8 to 12.5")
    (None, 'reversed interval')
    >>> parse_interval("0 to 31", duration=30.4)
    ((0.0, 30.4), None)
    """
    times = _find_times(answer)
    if len(times) < 2:
        return None, "no interval"
    if len(times) == 3:
        return None, "extra numbers"
    if len(times) > 3:
        return None, "several intervals"
    if any(t.value is None for t in times):
        return None, "bad time"
    first, second = times
    start, end = first.value, second.value
    if first.negative:
        start = -start
    if second.negative and answer[first.end : second.start].strip():
        end = -end  # "12.5 - 17.8": a minus right after the start is a separator, not a sign
    # A unit written once applies to both plain numbers ("1 to 2 minutes").
    if first.plain and second.plain and (first.unit is None) != (second.unit is None):
        factor = _UNITS[(first.unit or second.unit).lower()]
        if first.unit is None:
            start *= factor
        else:
            end *= factor
    if not (math.isfinite(start) and math.isfinite(end)):
        return None, "bad time"
    if start < 0 or end < 0:
        return None, "negative time"
    if start > end:
        return None, "reversed interval"
    if start == end:
        return None, "empty interval"
    if duration is not None:
        if start >= duration or end > duration + tolerance:
            return None, "outside video"
        end = min(end, float(duration))
    return (start, end), None


def temporal_iou(a: tuple[float, float], b: tuple[float, float]) -> float:
    """|a ∩ b| / |a ∪ b| of two intervals ``(start, end)``; 0 when the union is empty.

    >>> temporal_iou((0, 10), (5, 15))
    0.3333333333333333
    """
    inter = max(0.0, min(a[1], b[1]) - max(a[0], b[0]))
    union = max(a[1], b[1]) - min(a[0], b[0])
    return inter / union if union > 0 else 0.0


def _target(value: Any) -> tuple[float, float] | None:
    if not (
        isinstance(value, (list, tuple))
        and len(value) == 2
        and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            for v in value
        )
        and 0 <= value[0] < value[1]
    ):
        return None
    return float(value[0]), float(value[1])


def _score_one(text: str, sample: Sample, p: dict[str, Any]) -> Score:
    target = _target(sample.target)
    if target is None:
        return Score(0.0, reason="bad target")
    duration = sample.meta.get("duration")
    if not (
        isinstance(duration, (int, float))
        and not isinstance(duration, bool)
        and math.isfinite(duration)
        and duration > 0
    ):
        return Score(0.0, reason="no duration")
    duration = float(duration)

    answer, reason = extract_answer(text, p["answer_tag"])
    if answer is None:
        return Score(0.0, reason=reason)
    if len(answer) > MAX_ANSWER_CHARS:
        return Score(0.0, reason="answer too long")
    interval, reason = parse_interval(answer, duration, p["tolerance"])
    if interval is None:
        return Score(0.0, reason=reason)

    tiou = temporal_iou(interval, target)
    start_error, end_error = abs(interval[0] - target[0]), abs(interval[1] - target[1])
    parts = {"tiou": tiou, "start_error_s": start_error, "end_error_s": end_error}
    if p["variant"] == "time_r1":
        value = tiou * max(0.0, 1.0 - start_error / duration) * max(0.0, 1.0 - end_error / duration)
    elif p["threshold"] is not None:
        value = float(tiou >= p["threshold"])
    else:
        value = tiou
    return Score(value, reason=None if value > 0 else "no overlap", parts=parts)


@verifier("temporal_iou", low=0.0, high=1.0)
def temporal_iou_verifier(
    completions: list[str],
    samples: list[Sample],
    *,
    variant: Literal["tiou", "time_r1"] = "tiou",
    threshold: float | None = None,
    tolerance: float = 1.0,
    answer_tag: str = "answer",
) -> list[Score]:
    """Temporal IoU of the one predicted interval with the target interval. Range [0, 1].

    ``tiou`` (TimeZero): score = tIoU = |pred ∩ target| / |pred ∪ target|, or, with
    ``threshold`` t in (0, 1], 1 if tIoU ≥ t else 0 (an R1@t reward).
    ``time_r1`` (Time-R1): score = tIoU × (1 − |Δs| / D) × (1 − |Δe| / D), with Δs, Δe the
    start and end errors in seconds and D = ``meta["duration"]``; it rewards close boundaries
    even when the overlap is already good. ``threshold`` does not apply to it.

    Parse rules: the content of exactly one ``<answer_tag>`` block (never the think block)
    holding exactly one interval, read by :func:`parse_interval` (``12.54 to 17.83``,
    ``[12.5, 17.8]``, ``12.5s - 17.8s``, ``from 01:05 to 01:12.5``, ``hh:mm:ss.ff``, ...).
    The interval must satisfy 0 ≤ start < end, start < D and end ≤ D + ``tolerance`` seconds
    (an end within the tolerance is clipped to D). Answers over :data:`MAX_ANSWER_CHARS`
    (10,000) characters are not parsed (``answer too long``). Target: ``[start, end]`` in
    seconds, ``meta["duration"]`` in seconds.

    Score 0 with a reason: :func:`extract_answer` reasons (``no answer tag``, ...),
    :func:`parse_interval` reasons (``no interval``, ``several intervals``, ``extra numbers``,
    ``bad time``, ``negative time``, ``reversed interval``, ``empty interval``,
    ``outside video``), ``answer too long``, ``no overlap``; data problems: ``bad target``,
    ``no duration``.
    Parts: ``tiou``, ``start_error_s``, ``end_error_s``.

    >>> from mmrft.data import Sample
    >>> s = Sample("t", [], target=[10.0, 20.0], meta={"duration": 40.0})
    >>> temporal_iou_verifier(["<answer>10.0 to 20.0</answer>"], [s])[0].value
    1.0
    >>> temporal_iou_verifier(["<answer>15s - 25s</answer>"], [s])[0].value
    0.3333333333333333
    >>> temporal_iou_verifier(["<answer>15s - 25s</answer>"], [s], variant="time_r1")[0].value
    0.2552083333333333
    >>> temporal_iou_verifier(["<answer>00:10 to 00:20</answer>"], [s], threshold=0.5)[0].value
    1.0
    >>> temporal_iou_verifier(["<answer>20 to 10</answer>"], [s])[0].reason
    'reversed interval'
    """
    if threshold is not None and not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must be in (0, 1] or null, got {threshold}")
    if threshold is not None and variant != "tiou":
        raise ValueError(f"threshold applies to variant 'tiou' only, not '{variant}'")
    if not (math.isfinite(tolerance) and tolerance >= 0.0):
        raise ValueError(f"tolerance must be a finite number of seconds ≥ 0, got {tolerance}")
    check_answer_tag(answer_tag)
    params = {
        "variant": variant,
        "threshold": threshold,
        "tolerance": tolerance,
        "answer_tag": answer_tag,
    }
    return [_score_one(text, sample, params) for text, sample in zip(completions, samples)]
