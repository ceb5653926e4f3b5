"""The detection verifier: a list of predicted boxes against a list of target boxes.

Two scoring modes, after the papers (docs/reference.md): Visual-RFT's greedy IoU + confidence reward
(``visual_rft``) and VLM-R1's OVD reward, AP × min(1, #gt / #pred) (``ap``). The parser,
:func:`parse_detections`, is shared with detection tasks' evaluation.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from mmrft.data import Sample
from mmrft.rewards import Score, verifier
from mmrft.rewards.answers import check_answer_tag, extract_answer, normalise_text
from mmrft.rewards.boxes import _BOX as BOX_PATTERN
from mmrft.rewards.boxes import clip_box, is_degenerate, outside_image, parse_boxes, to_pixels
from mmrft.rewards.metrics import coco_match, interpolated_precision, iou_matrix

Frame = Literal["auto", "norm1000", "input_pixels", "norm1", "pixels"]

MAX_CHARS_PER_BOX = 200
"""Answers longer than 1000 + ``MAX_CHARS_PER_BOX`` × ``max_boxes`` characters (21 kB by default)
score 0 (``answer too long``) unparsed: a verbose labelled box takes under 100, and the bound
keeps the parse of adversarial junk (bracket runs, digit lists) to a few milliseconds."""


@dataclass(frozen=True)
class Detection:
    """One predicted box as written: ``box`` in the model's frame, ``confidence`` in [0, 1]
    (``None`` when not given) and ``label`` (``None`` when not given)."""

    box: tuple[float, float, float, float]
    confidence: float | None = None
    label: str | None = None


_KEY = r"""["']?\b{}\b["']?\s*[:=]\s*"""
_CONFIDENCE = re.compile(
    _KEY.format("(?:confidence|conf|score)") + r"""("[^"]*"|'[^']*'|[^,}\s]+)""", re.IGNORECASE
)
_LABEL = re.compile(
    _KEY.format("(?:label|category|class|name)") + r"""(?:"([^"]*)"|'([^']*)')""", re.IGNORECASE
)
# One JSON / Python object without nested braces ({"bbox_2d": [...], "label": "cat"}) or, outside
# objects, a box (mmrft.rewards.boxes' box pattern), scanned left to right in one pass.
_SCAN = re.compile(r"\{[^{}]*\}|" + BOX_PATTERN.pattern)
# An explicit "no objects" answer: [] (optionally in a ```json fence), null, none, no objects.
_EMPTY = re.compile(
    r"(?:```(?:json|python)?\s*)?(?:\[\s*\]|null|none|no objects?)\s*(?:```)?\.?", re.IGNORECASE
)


def _confidence(obj: str) -> tuple[float | None, str | None]:
    found = _CONFIDENCE.findall(obj)
    if not found:
        return None, None
    if len(found) > 1:
        return None, "bad confidence"
    try:
        value = float(found[0].strip("\"' "))
    except ValueError:
        return None, "bad confidence"
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        return None, "bad confidence"
    return value, None


def parse_detections(
    answer: str, limit: int | None = None
) -> tuple[list[Detection] | None, str | None]:
    """The boxes of an answer, each with its confidence and label, in the order written.

    Accepted forms (keys in any case, single or double quotes, ints or floats, inside a ```json
    fence or prose):

    * Visual-RFT: ``[{'Position': [x1, y1, x2, y2], 'Confidence': 0.9}, ...]``;
    * Qwen2.5-VL: ``[{"bbox_2d": [x1, y1, x2, y2], "label": "cat"}, ...]``;
    * plain boxes: ``[[x1, y1, x2, y2], ...]`` or any box form of :func:`mmrft.rewards.boxes.parse_boxes`
      (confidence and label ``None``);
    * "no objects": ``[]``, ``null``, ``none``, ``no objects`` → an empty list.

    Inside one ``{...}`` object: exactly one box (the value of any key), an optional confidence
    (key ``confidence`` / ``conf`` / ``score``; a number in [0, 1], quoted or not) and an optional
    label (key ``label`` / ``category`` / ``class`` / ``name``, a quoted string). Boxes outside
    objects are plain boxes. Coordinates are not checked here. Reading stops after ``limit``
    boxes (``"too many boxes"``), so box spam costs no more than ``limit`` boxes.

    Returns ``(detections, None)`` or ``(None, reason)``, reason one of ``"no box"`` (no box and
    not an explicit "no objects"), ``"several boxes in one object"``, ``"bad confidence"``
    (not a number, NaN, outside [0, 1], or given twice), ``"several labels in one object"``,
    ``"too many boxes"``.

    >>> parse_detections("[{'Position': [10, 20, 30, 40], 'Confidence': 0.9}]")
    ([Detection(box=(10.0, 20.0, 30.0, 40.0), confidence=0.9, label=None)], None)
    >>> parse_detections('```json\\n[{"bbox_2d": [1, 2, 3, 4], "label": "cat"}]\\n```')[0]
    [Detection(box=(1.0, 2.0, 3.0, 4.0), confidence=None, label='cat')]
    >>> parse_detections("[]"), parse_detections("I see a cat")
    (([], None), (None, 'no box'))
    """
    if _EMPTY.fullmatch(answer.strip()):
        return [], None
    found: list[Detection] = []
    for m in _SCAN.finditer(answer):  # objects and plain boxes, left to right, no overlaps
        text = m.group(0)
        boxes = parse_boxes(text)
        if text[0] != "{":
            found.append(Detection(tuple(boxes[0])))
        elif not boxes:
            continue  # an object without a box ({"count": 2}): not a detection, not an error
        elif len(boxes) > 1:
            return None, "several boxes in one object"
        else:
            confidence, reason = _confidence(text)
            if reason:
                return None, reason
            labels = _LABEL.findall(text)
            if len(labels) > 1:
                return None, "several labels in one object"
            label = (labels[0][0] or labels[0][1]) if labels else None
            found.append(Detection(tuple(boxes[0]), confidence, label))
        if limit is not None and len(found) > limit:
            return None, "too many boxes"
    if not found:
        return None, "no box"
    return found, None


# -- targets -----------------------------------------------------------------------------------
def _target(value: Any) -> tuple[list[tuple[list[float], str | None]] | None, str | None]:
    """The target as ``[(box_pixels, normalised_label | None)]``, else ``(None, "bad target")``."""
    if not isinstance(value, (list, tuple)):
        return None, "bad target"
    out = []
    for item in value:
        label = None
        if isinstance(item, Mapping):
            box = next((item[k] for k in ("box", "bbox", "bbox_2d") if k in item), None)
            if item.get("label") is not None:
                label = normalise_text(str(item["label"]))
        else:
            box = item
        if not (
            isinstance(box, (list, tuple))
            and len(box) == 4
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in box)
            and not is_degenerate(box)
        ):
            return None, "bad target"
        out.append(([float(v) for v in box], label))
    return out, None


def _valid_size(size: Any) -> bool:
    return (
        isinstance(size, (list, tuple))
        and len(size) == 2
        and all(isinstance(v, (int, float)) and v > 0 for v in size)
    )


# -- scoring -----------------------------------------------------------------------------------
def _greedy_match(
    ious: np.ndarray, confidences: list[float], same_class: np.ndarray, threshold: float
) -> list[float]:
    """Visual-RFT matching: predictions by descending confidence (ties: answer order) each take
    the unused target of highest IoU (ties: the first); kept when that IoU > ``threshold``.
    Returns the matched IoU per prediction, 0 for unmatched ones."""
    n_pred, n_gt = ious.shape
    matched = [0.0] * n_pred
    free = np.ones(n_gt, dtype=bool)
    for p in sorted(range(n_pred), key=lambda i: -confidences[i]):
        row = np.where(free & same_class[p], ious[p], -1.0)
        g = int(np.argmax(row))
        if row[g] > threshold:
            matched[p] = float(row[g])
            free[g] = False
    return matched


def _score_visual_rft(
    ious: np.ndarray,
    confidences: list[float],
    same_class: np.ndarray,
    threshold: float,
    weight: float,
    combine: str,
) -> Score:
    n_pred, n_gt = ious.shape
    matched = _greedy_match(ious, confidences, same_class, threshold)
    hits = sum(m > 0 for m in matched)
    iou_part = sum(matched) / max(n_gt, n_pred)
    confidence_part = sum(c if m > 0 else 1.0 - c for m, c in zip(matched, confidences)) / n_pred
    if combine == "sum":
        value = (iou_part + weight * confidence_part) / (1.0 + weight)
    else:
        value = iou_part * (1.0 + weight * confidence_part) / (1.0 + weight)
    return _matched(value, {"iou": iou_part, "confidence": confidence_part}, hits, n_pred, n_gt)


def _score_ap(
    ious: np.ndarray,
    confidences: list[float],
    pred_labels: list[str | None],
    gt_labels: list[str | None],
    threshold: float,
) -> Score:
    n_pred, n_gt = ious.shape
    order = np.argsort(-np.asarray(confidences, dtype=float), kind="mergesort")
    aps, hits = [], 0
    for cls in dict.fromkeys(gt_labels):  # one class (None) unless labels are matched
        preds = [int(i) for i in order if pred_labels[i] == cls]
        gts = [g for g in range(n_gt) if gt_labels[g] == cls]
        tp = coco_match(ious[np.ix_(preds, gts)], [threshold])
        hits += int(tp.sum())
        scores = np.asarray([confidences[i] for i in preds], dtype=float)
        aps.append(float(interpolated_precision(scores, tp, len(gts)).mean()))
    ap = float(np.mean(aps))
    length_factor = min(1.0, n_gt / n_pred)
    value = ap * length_factor
    return _matched(value, {"ap": ap, "length_factor": length_factor}, hits, n_pred, n_gt)


def _matched(value: float, parts: dict[str, float], hits: int, n_pred: int, n_gt: int) -> Score:
    """A matching's Score: ``parts`` then ``precision`` = hits / predicted boxes and ``recall``
    = hits / target boxes; reason ``no match`` when ``value`` is 0."""
    parts = {**parts, "precision": hits / n_pred, "recall": hits / n_gt}
    return Score(value, reason=None if value > 0 else "no match", parts=parts)


def _score_one(text: str, sample: Sample, p: dict[str, Any]) -> Score:
    meta = sample.meta
    target, reason = _target(sample.target)
    if target is None:
        return Score(0.0, reason=reason)
    if p["match_labels"] and any(label is None for _, label in target):
        return Score(0.0, reason="target has no labels")
    size = meta.get("image_size")
    if not _valid_size(size):
        return Score(0.0, reason="no image size")
    frame = meta.get("box_frame") if p["frame"] == "auto" else p["frame"]
    if frame is None:
        return Score(0.0, reason="no box frame")

    answer, reason = extract_answer(text, p["answer_tag"])
    if answer is None:
        return Score(0.0, reason=reason)
    if len(answer) > 1000 + MAX_CHARS_PER_BOX * p["max_boxes"]:
        return Score(0.0, reason="answer too long")
    detections, reason = parse_detections(answer, limit=p["max_boxes"])
    if detections is None:
        return Score(0.0, reason=reason)
    boxes = []
    for d in detections:
        try:
            pixels = to_pixels(d.box, frame, meta)
        except ValueError as exc:  # unknown frame or missing input_size: a data problem
            return Score(0.0, reason=str(exc))
        if is_degenerate(pixels):
            return Score(0.0, reason="degenerate box")
        if outside_image(pixels, float(size[0]), float(size[1])):
            return Score(0.0, reason="box outside image")
        boxes.append(clip_box(pixels, float(size[0]), float(size[1])))

    if not target:  # "no objects": only the empty answer is right
        if boxes:
            return Score(0.0, reason="boxes for no objects")
        return Score(1.0)
    if not boxes:
        return Score(0.0, reason="no boxes")

    ious = iou_matrix(np.array(boxes), np.array([box for box, _ in target]))
    confidences = [1.0 if d.confidence is None else d.confidence for d in detections]
    if p["match_labels"]:
        pred_labels = [None if d.label is None else normalise_text(d.label) for d in detections]
        gt_labels = [label for _, label in target]
    else:
        pred_labels = [None] * len(detections)
        gt_labels = [None] * len(target)
    if p["mode"] == "ap":
        return _score_ap(ious, confidences, pred_labels, gt_labels, p["iou_threshold"])
    same_class = np.array([[pl == gl for gl in gt_labels] for pl in pred_labels], dtype=bool)
    return _score_visual_rft(
        ious,
        confidences,
        same_class,
        p["iou_threshold"],
        p["confidence_weight"],
        p["confidence_combine"],
    )


@verifier("detection", low=0.0, high=1.0)
def detection(
    completions: list[str],
    samples: list[Sample],
    *,
    mode: Literal["visual_rft", "ap"] = "visual_rft",
    frame: Frame = "auto",
    iou_threshold: float = 0.5,
    confidence_weight: float = 1.0,
    confidence_combine: Literal["product", "sum"] = "product",
    match_labels: bool = False,
    max_boxes: int = 100,
    answer_tag: str = "answer",
) -> list[Score]:
    """Detection reward: predicted boxes (confidences, labels) against target boxes. Range [0, 1].

    **visual_rft** (Visual-RFT). Predictions are taken by descending confidence (a box without
    one counts as confidence 1); each takes the unused target box of highest IoU, and is
    *matched* when that IoU > ``iou_threshold``. With P predictions and G targets::

        iou_part        = Σ matched IoU / max(G, P)
        confidence_part = mean over predictions of (conf if matched else 1 − conf)
        product (default): score = iou_part · (1 + w · confidence_part) / (1 + w)
        sum:               score = (iou_part + w · confidence_part) / (1 + w)

    with w = ``confidence_weight``. ``sum`` is the paper's reward iou_part + confidence_part
    (range [0, 2], plus a separate format reward) divided by 1 + w to keep [0, 1] (docs/reference.md
    pitfall 7): with w = 1 it is exactly half the paper's sum, so the same GRPO advantages up to
    the std normalisation. But under ``sum`` a *wrong* box with confidence 0 earns
    confidence_part = 1, i.e. w / (1 + w) = 0.5: one whole-image box, or any spam, written with
    confidence 0 scores 0.5 against 0 for no answer (pitfall 6). ``product`` keeps the same two
    parts but lets confidence only scale the IoU credit (between 1 / (1 + w) and 1 of it), so a
    box that matches nothing can never raise the score; a perfect answer (every target matched
    with IoU 1, confidence 1, nothing extra) still scores 1. Use ``sum`` only to reproduce the
    paper.

    **ap** (VLM-R1 OVD). score = AP@``iou_threshold`` × min(1, G / P): AP of this image's
    predictions ranked by confidence, COCO matching (IoU ≥ threshold) and 101-point
    interpolation (:func:`mmrft.rewards.metrics.interpolated_precision`), times VLM-R1's "odLength"
    factor, which stops box spamming from buying recall.

    Both modes: a "no objects" target (``[]``) scores 1 for an explicit empty answer (``[]``)
    and 0 for any box (``boxes for no objects``); a non-empty target with an empty answer
    scores 0 (``no boxes``). Whole-image boxes match no small object (IoU < threshold) and
    spam is divided by max(G, P) (visual_rft) or min(1, G / P) (ap).

    With ``match_labels`` a prediction can only match a target box of the same label
    (normalised equality, :func:`mmrft.rewards.answers.normalise_text`); unlabelled predictions match
    nothing and every target box needs a label. In ``ap`` mode AP is then averaged over the
    target's labels; predictions of other labels count only in P. Without it matching is
    class-agnostic (Visual-RFT prompts ask for one category at a time).

    Parse rules: the content of exactly one ``<answer_tag>`` block (never the think block),
    read by :func:`parse_detections`; at most ``max_boxes`` boxes (``too many boxes``) and
    1000 + 200 · ``max_boxes`` characters (``answer too long``, :data:`MAX_CHARS_PER_BOX`).
    Boxes are read in ``frame`` (``auto``: ``meta["box_frame"]``), converted to original-image
    pixels with ``meta["image_size"]`` (and ``meta["input_size"]`` for ``input_pixels``), and
    clipped to the image when it reaches at most :data:`mmrft.rewards.boxes.EDGE_TOLERANCE` (5 % of
    the image side: 50 units of norm1000) past an edge; an answer with a box reaching further,
    or lying wholly outside the image, scores 0 (``box outside image``), as one with a
    degenerate box does. Target:
    a list of boxes ``[x1, y1, x2, y2]`` in original pixels, or of ``{"box": [...], "label":
    "cat"}`` (``bbox`` / ``bbox_2d`` also name the box).

    Score 0 with a reason: :func:`extract_answer` reasons (``no answer tag``, ...),
    :func:`parse_detections` reasons (``no box``, ``bad confidence``, ...), ``too many boxes``,
    ``answer too long``, ``degenerate box`` (any box with x2 ≤ x1, y2 ≤ y1 or a non-finite
    value), ``box outside image`` (any box past the edge tolerance or wholly outside),
    ``no boxes``, ``boxes for no objects``, ``no match``; data problems: ``bad target``,
    ``target has no labels``, ``no image size``, ``no box frame``, ``meta has no valid
    'input_size' [w, h]``.
    Parts: ``iou``, ``confidence`` (visual_rft) or ``ap``, ``length_factor`` (ap), and
    ``precision`` / ``recall`` (share of predictions / targets matched).

    >>> from mmrft.data import Sample
    >>> s = Sample("d", [], target=[[0, 0, 100, 100], [200, 200, 300, 300]],
    ...            meta={"image_size": [400, 400], "box_frame": "norm1000"})
    >>> perfect = ("<answer>[{'Position': [0, 0, 250, 250], 'Confidence': 1.0},"
    ...            " {'Position': [500, 500, 750, 750], 'Confidence': 1.0}]</answer>")
    >>> detection([perfect], [s])[0].value
    1.0
    >>> one = "<answer>[{'Position': [0, 0, 250, 250], 'Confidence': 0.8}]</answer>"
    >>> round(detection([one], [s])[0].value, 4)  # 0.5 · (1 + 0.8) / 2
    0.45
    >>> whole = "<answer>[{'Position': [0, 0, 1000, 1000], 'Confidence': 0.0}]</answer>"
    >>> [detection([whole], [s], confidence_combine=c)[0].value for c in ("product", "sum")]
    [0.0, 0.5]
    >>> detection(["<answer>[{'Position': [0, 0, 250, 250]}]</answer>"], [s], mode="ap")[0].value
    0.504950495049505
    >>> empty = Sample("e", [], target=[], meta=s.meta)
    >>> [(x.value, x.reason) for x in detection(["<answer>[]</answer>", perfect], [empty] * 2)]
    [(1.0, None), (0.0, 'boxes for no objects')]
    """
    if not 0.0 < iou_threshold < 1.0:
        raise ValueError(f"iou_threshold must be in (0, 1), got {iou_threshold}")
    if not (math.isfinite(confidence_weight) and confidence_weight >= 0.0):
        raise ValueError(f"confidence_weight must be finite and ≥ 0, got {confidence_weight}")
    if max_boxes < 1:
        raise ValueError(f"max_boxes must be ≥ 1, got {max_boxes}")
    check_answer_tag(answer_tag)
    params = {
        "mode": mode,
        "frame": frame,
        "iou_threshold": iou_threshold,
        "confidence_weight": confidence_weight,
        "confidence_combine": confidence_combine,
        "match_labels": match_labels,
        "max_boxes": max_boxes,
        "answer_tag": answer_tag,
    }
    return [_score_one(text, sample, params) for text, sample in zip(completions, samples)]
