"""Verifiers of multi-turn tool rollouts: they read the trajectory (``trajectories``, the third
positional parameter, :mod:`mmrft.rewards`), not only the last turn's text.

* ``tool_bonus``: DeepEyes' tool term (Zheng et al. 2025, arXiv:2505.14362): 1 when the
  trajectory made at least one successful call *and* the final answer is right (the
  ``accuracy`` verifier's rule, score ≥ ``correct_at``), else 0. Its paper weights:
  ``0.8·accuracy + 0.2·format + 1.2·tool_bonus``.
* ``crop_contains_target``: a grounding check after MGPO (Huang et al. 2025, arXiv:2507.05920): 1
  when a successful crop of the original image (image 0) contains the sample's
  ``meta.target_box`` (pixels of the original image; containment of at least ``min_cover``
  of the box's area), else 0; ``None`` for samples without a target box.
* ``clip_overlap``: Video-MTR's frame-overlap bonus (Xie et al. 2025, arXiv:2508.20478):
  the best temporal IoU between a successful ``video_frames`` (or ``audio_clip``) interval and
  the sample's ``meta.target_span`` (seconds), paid only when the answer is right
  (``only_when_correct``); ``None`` for samples without a target span.
* ``span_contains_target``: ``crop_contains_target`` in time: 1 when a successful
  ``video_frames`` or ``audio_clip`` interval covers at least ``min_cover`` of
  ``meta.target_span``, else 0; ``None`` for samples without a target span.
* ``tool_failures``: a penalty per failed call (broken JSON, unknown tool, a refused box, …):
  ``−min(1, per_call × failed calls)``, range [−1, 0].
* ``environment_reward``: the reward in [0, 1] a stateful environment gave the episode when it
  ended it (:mod:`mmrft.rollout.environment`), 0 for an episode it did not end (reason ``not
  finished``, or ``environment lost``).
* ``environment_progress``: the share of the way an episode covered, finished or not, as the
  environment reports it in its state (``state["progress"]`` in [0, 1]; ``grid_walk``: 1 −
  distance / shortest): a shaping term beside ``environment_reward`` for episodes that a
  budget ends short of the goal; ``None`` where the environment reports no progress.

Single-turn completions (``None`` trajectories) score 0 on all of them (``None`` where the
sample has no target), with the reason ``no tool rollout``.
"""

from __future__ import annotations

from typing import Any

from mmrft.data import Sample
from mmrft.rewards import Score, verifier


def _crops(trajectory: Any, tools: tuple[str, ...] = ("crop", "image_zoom_in")) -> list[list[int]]:
    """Pixel boxes of the successful crops of the original image (image 0)."""
    return [
        call["info"]["box_px"]
        for call in trajectory.calls
        if call["ok"]
        and call["name"] in tools
        and "box_px" in call.get("info", {})
        and call["info"].get("image_index", 0) == 0
    ]


@verifier("tool_bonus", low=0.0, high=1.0)
def tool_bonus(
    completions: list[str],
    samples: list[Sample],
    trajectories: list[Any],
    *,
    correct_at: float = 1.0,
    tools: list[str] | None = None,
) -> list[Score]:
    """DeepEyes' tool bonus: 1 when a call of ``tools`` (default: any tool) succeeded *and*
    the last turn's answer is right (``accuracy`` in its ``auto`` mode scores ≥
    ``correct_at``), else 0. Range [0, 1]."""
    from mmrft.verifiers.accuracy import accuracy

    if not 0.0 < correct_at <= 1.0:
        raise ValueError(f"correct_at must be in (0, 1], got {correct_at}")
    correct = accuracy(completions, samples)  # its auto mode, per sample
    out = []
    for score, trajectory in zip(correct, trajectories):
        if trajectory is None:
            out.append(Score(0.0, reason="no tool rollout"))
            continue
        used = any(c["ok"] and (not tools or c["name"] in tools) for c in trajectory.calls)
        if not used:
            out.append(Score(0.0, reason="no successful tool call"))
        elif score.value < correct_at:
            out.append(Score(0.0, reason="tool used, answer wrong"))
        else:
            out.append(Score(1.0))
    return out


def _covered(box: list[float], target: list[float]) -> float:
    """Share of ``target``'s area inside ``box`` (pixels, ``[x1, y1, x2, y2]``)."""
    w = min(box[2], target[2]) - max(box[0], target[0])
    h = min(box[3], target[3]) - max(box[1], target[1])
    area = max(target[2] - target[0], 0.0) * max(target[3] - target[1], 0.0)
    if w <= 0 or h <= 0 or area <= 0:
        return 0.0
    return w * h / area


def _contains_target(
    samples: list[Sample],
    trajectories: list[Any],
    key: str,
    fetched: Any,
    share: Any,
    min_cover: float,
    reasons: tuple[str, str],
) -> list[Score | None]:
    """1 when one of ``fetched(trajectory)`` covers at least ``min_cover`` of the sample's
    ``meta[key]`` (``share(item, target)`` in [0, 1]), else 0 with ``reasons`` (nothing
    fetched, nothing covering); ``None`` where the sample has no ``key``."""
    if not 0.0 < min_cover <= 1.0:
        raise ValueError(f"min_cover must be in (0, 1], got {min_cover}")
    out: list[Score | None] = []
    for sample, trajectory in zip(samples, trajectories):
        target = sample.meta.get(key)
        if not target:
            out.append(None)
        elif trajectory is None:
            out.append(Score(0.0, reason="no tool rollout"))
        else:
            items = fetched(trajectory)
            if not items:
                out.append(Score(0.0, reason=reasons[0]))
            elif max(share(item, target) for item in items) >= min_cover - 1e-9:
                out.append(Score(1.0))
            else:
                out.append(Score(0.0, reason=reasons[1]))
    return out


@verifier("crop_contains_target", low=0.0, high=1.0)
def crop_contains_target(
    completions: list[str],
    samples: list[Sample],
    trajectories: list[Any],
    *,
    min_cover: float = 1.0,
) -> list[Score | None]:
    """MGPO's check: 1 when a successful crop of the original image covers at least
    ``min_cover`` of ``meta.target_box``'s area, else 0; ``None`` without a target box.
    Range [0, 1]."""
    reasons = ("no crop", "crop misses the target")
    return _contains_target(
        samples, trajectories, "target_box", _crops, _covered, min_cover, reasons
    )


@verifier("tool_failures", low=-1.0, high=0.0)
def tool_failures(
    completions: list[str],
    samples: list[Sample],
    trajectories: list[Any],
    *,
    per_call: float = 0.25,
) -> list[Score]:
    """−min(1, ``per_call`` × the number of failed calls): a penalty for calls the tools
    refused (their reasons are counted under ``rollout/tools/failed/<reason>``). Range
    [−1, 0]."""
    if not per_call > 0:
        raise ValueError(f"per_call must be positive, got {per_call}")
    out = []
    for trajectory in trajectories:
        if trajectory is None:
            out.append(Score(0.0, reason="no tool rollout"))
            continue
        failed = trajectory.failed_calls
        value = -min(1.0, per_call * failed)
        out.append(Score(value, reason="failed calls" if failed else None))
    return out


def _tiou(a: list[float], b: list[float]) -> float:
    """Temporal IoU of two intervals ``[start, end]`` (seconds)."""
    inter = max(0.0, min(a[1], b[1]) - max(a[0], b[0]))
    union = max(a[1], b[1]) - min(a[0], b[0])
    return inter / union if union > 0 else 0.0


CLIP_TOOLS = ("video_frames", "audio_clip")
"""Tools whose successful calls fetch an interval of the sample's media (``info["span_s"]``,
seconds of the source)."""


def _spans(trajectory: Any) -> list[list[float]]:
    """``[start, end]`` (seconds) of the successful :data:`CLIP_TOOLS` calls."""
    return [
        [float(v) for v in call["info"]["span_s"]]
        for call in trajectory.calls
        if call["ok"] and call["name"] in CLIP_TOOLS and "span_s" in call.get("info", {})
    ]


@verifier("clip_overlap", low=0.0, high=1.0)
def clip_overlap(
    completions: list[str],
    samples: list[Sample],
    trajectories: list[Any],
    *,
    only_when_correct: bool = True,
    measure: str = "tiou",
    within_s: float = 3.0,
) -> list[Score | None]:
    """How well the successful ``video_frames`` and ``audio_clip`` calls fetched
    ``meta.target_span`` (seconds), the best call's, 0 without one: ``measure="tiou"`` the
    temporal IoU; ``"centre"`` 1 − |centre(fetched) − centre(target)| / ``within_s``, floored
    at 0 (how near, graded also when the interval misses the target: a signal for where to
    look while no sampled call has found it yet). With ``only_when_correct`` 0 unless the answer
    is right (``accuracy``, auto mode). ``None`` for samples without a target span. Range
    [0, 1]."""
    from mmrft.verifiers.accuracy import accuracy

    if measure not in ("tiou", "centre"):
        raise ValueError(f"measure must be 'tiou' or 'centre', got {measure!r}")
    if not within_s > 0:
        raise ValueError(f"within_s must be > 0 seconds, got {within_s}")

    def score(clip: list[float], target: list[float]) -> float:
        if measure == "tiou":
            return _tiou(clip, target)
        gap = abs((clip[0] + clip[1]) / 2 - (target[0] + target[1]) / 2)
        return max(0.0, 1.0 - gap / within_s)

    correct = accuracy(completions, samples) if only_when_correct else None
    out: list[Score | None] = []
    for i, (sample, trajectory) in enumerate(zip(samples, trajectories)):
        span = sample.meta.get("target_span")
        if not span:
            out.append(None)
            continue
        if trajectory is None:
            out.append(Score(0.0, reason="no tool rollout"))
            continue
        fetched = _spans(trajectory)
        if not fetched:
            out.append(Score(0.0, reason="no clip fetched"))
        elif correct is not None and correct[i].value < 1.0:
            out.append(Score(0.0, reason="answer wrong"))
        else:
            target = [float(span[0]), float(span[1])]
            out.append(Score(max(score(clip, target) for clip in fetched)))
    return out


def _covered_span(clip: list[float], target: list[float]) -> float:
    """Share of ``target``'s length inside ``clip`` (seconds, ``[start, end]``)."""
    start, end = float(target[0]), float(target[1])
    inter = min(clip[1], end) - max(clip[0], start)
    return inter / (end - start) if inter > 0 and end > start else 0.0


@verifier("span_contains_target", low=0.0, high=1.0)
def span_contains_target(
    completions: list[str],
    samples: list[Sample],
    trajectories: list[Any],
    *,
    min_cover: float = 1.0,
) -> list[Score | None]:
    """1 when a successful ``video_frames`` or ``audio_clip`` interval covers at least
    ``min_cover`` of ``meta.target_span``'s length (seconds), else 0; ``None`` without a target
    span. Whether the model fetched the moment it needs, right answer or not. Range [0, 1]."""
    reasons = ("no clip fetched", "clip misses the target")
    return _contains_target(
        samples, trajectories, "target_span", _spans, _covered_span, min_cover, reasons
    )


def _episode(trajectory: Any) -> tuple[dict[str, Any], None] | tuple[None, Score]:
    """A trajectory's ``environment`` record, or the 0 score of an episode that has none
    (``no environment``) or whose worker stopped (``environment lost``)."""
    episode = getattr(trajectory, "environment", None) if trajectory is not None else None
    if episode is None:
        return None, Score(0.0, reason="no environment")
    if episode.get("lost"):
        return None, Score(0.0, reason="environment lost")
    return episode, None


@verifier("environment_reward", low=0.0, high=1.0)
def environment_reward(
    completions: list[str], samples: list[Sample], trajectories: list[Any]
) -> list[Score]:
    """The reward the environment gave the episode when it ended it
    (``Trajectory.environment["reward"]``, in [0, 1]; 0 when it ended it without one), else
    0 with the reason: ``not finished`` (the model answered, or a budget ended the
    trajectory), ``environment lost`` (a call stopped its worker). Range [0, 1]."""
    out = []
    for trajectory in trajectories:
        episode, missing = _episode(trajectory)
        if missing is not None:
            out.append(missing)
        elif not episode.get("done"):
            out.append(Score(0.0, reason="not finished"))
        else:
            out.append(Score(float(episode.get("reward") or 0.0)))
    return out


@verifier("environment_progress", low=0.0, high=1.0)
def environment_progress(
    completions: list[str], samples: list[Sample], trajectories: list[Any]
) -> list[Score | None]:
    """``Trajectory.environment["state"]["progress"]``: the share of the way the episode
    covered, as its environment reports it after every call (finished or not). 0 with the
    reason ``environment lost`` when a call stopped its worker (its state is gone), a reported
    value outside [0, 1] or not a number scores 0 with the reason; ``None`` where the
    environment reports no progress. Range [0, 1]."""
    out: list[Score | None] = []
    for trajectory in trajectories:
        episode, missing = _episode(trajectory)
        if missing is not None:
            out.append(missing)
            continue
        state = episode.get("state")
        progress = state.get("progress") if isinstance(state, dict) else None
        if progress is None:
            out.append(None)
        elif isinstance(progress, bool) or not isinstance(progress, (int, float)):
            out.append(Score(0.0, reason=f"progress not a number: {str(progress)[:40]!r}"))
        elif not 0.0 <= progress <= 1.0:
            out.append(Score(0.0, reason=f"progress {progress!r} outside [0, 1]"))
        else:
            out.append(Score(float(progress)))
    return out
