"""The IoU verifier: overlap of the one predicted box with the target box."""

from __future__ import annotations

from typing import Any, Literal

from mmrft.data import Sample
from mmrft.rewards import Score, verifier
from mmrft.rewards.answers import check_answer_tag, extract_answer
from mmrft.rewards.boxes import (
    box_iou,
    clip_box,
    is_degenerate,
    outside_image,
    parse_one_box,
    to_pixels,
)

Frame = Literal["auto", "norm1000", "input_pixels", "norm1", "pixels"]


def _valid_box(value: Any) -> bool:
    return (
        isinstance(value, (list, tuple))
        and len(value) == 4
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
        and not is_degenerate(value)
    )


def _score_one(text: str, sample: Sample, frame: str, threshold: float | None, tag: str) -> Score:
    meta = sample.meta
    size = meta.get("image_size")
    if not _valid_box(sample.target):
        return Score(0.0, reason="bad target box")
    if not (
        isinstance(size, (list, tuple))
        and len(size) == 2
        and all(isinstance(v, (int, float)) and v > 0 for v in size)
    ):
        return Score(0.0, reason="no image size")
    sample_frame = meta.get("box_frame") if frame == "auto" else frame
    if sample_frame is None:
        return Score(0.0, reason="no box frame")

    answer, reason = extract_answer(text, tag)
    if answer is None:
        return Score(0.0, reason=reason)
    box, reason = parse_one_box(answer)
    if box is None:
        return Score(0.0, reason=reason)
    try:
        pixels = to_pixels(box, sample_frame, meta)
    except ValueError as exc:  # unknown frame or missing input_size: a data problem
        return Score(0.0, reason=str(exc))
    if is_degenerate(pixels):
        return Score(0.0, reason="degenerate box")
    width, height = float(size[0]), float(size[1])
    if outside_image(pixels, width, height):
        return Score(0.0, reason="box outside image")

    iou = box_iou(clip_box(pixels, width, height), sample.target)
    value = iou if threshold is None else float(iou >= threshold)
    return Score(value, reason=None if value > 0 else "no overlap", parts={"iou": iou})


@verifier("iou", low=0.0, high=1.0)
def iou(
    completions: list[str],
    samples: list[Sample],
    *,
    frame: Frame = "auto",
    threshold: float | None = None,
    answer_tag: str = "answer",
) -> list[Score]:
    """IoU of the one predicted box with the target box. Range [0, 1].

    score = IoU(clip(pred), target) when ``threshold`` is None, else 1 if that IoU ≥
    ``threshold`` else 0 (``threshold`` in (0, 1]). The raw IoU is logged as part ``iou``.

    Parse rules: the content of exactly one ``<answer_tag>`` block, holding exactly one box
    (:func:`mmrft.rewards.boxes.parse_boxes`: ``{"bbox_2d": [...]}``, any key case, ints or floats,
    ``(x1,y1),(x2,y2)``, ...). The box is read in ``frame`` (``auto``: the model family's
    ``meta["box_frame"]``) and converted with ``meta["image_size"]`` (and ``meta["input_size"]``
    for ``input_pixels``) to the target's frame, original-image pixels, then clipped to the
    image when it reaches at most :data:`mmrft.rewards.boxes.EDGE_TOLERANCE` (5 % of the image side:
    50 units of norm1000) past an edge; a box reaching further, or lying wholly outside the
    image, scores 0 (``box outside image``), never its clipped IoU. The target is
    ``[x1, y1, x2, y2]`` in original-image pixels.

    Score 0 with a reason: ``no answer tag`` (and the other :func:`extract_answer` reasons),
    ``no box``, ``several boxes``, ``degenerate box`` (x2 ≤ x1 or y2 ≤ y1, inverted boxes
    included), ``box outside image`` (past the edge tolerance, or no area inside the image),
    ``no overlap``; data problems: ``bad target box``,
    ``no image size``, ``no box frame``, ``meta has no valid 'input_size' [w, h]``.

    >>> from mmrft.data import Sample
    >>> s = Sample("r1", [], target=[100, 100, 200, 200],
    ...            meta={"image_size": [400, 400], "box_frame": "norm1000"})
    >>> iou(['<answer>{"bbox_2d": [250, 250, 500, 500]}</answer>'], [s])[0].value
    1.0
    >>> iou(['<answer>{"bbox_2d": [0, 0, 1000, 1000]}</answer>'], [s])[0].value
    0.0625
    >>> iou(['<answer>[250, 250, 500, 500] or [0, 0, 10, 10]</answer>'], [s])[0].reason
    'several boxes'
    """
    if threshold is not None and not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must be in (0, 1] or null, got {threshold}")
    check_answer_tag(answer_tag)
    return [
        _score_one(text, sample, frame, threshold, answer_tag)
        for text, sample in zip(completions, samples)
    ]
