"""Evaluation metrics shared by tasks: COCO-style detection mAP and temporal-grounding recall.

Both are plain numpy, deterministic, and take already-parsed predictions (a task's strict
evaluation parser produces them; an unparsable answer is an empty prediction list or an IoU of
0, and the task reports format failures separately, docs/reference.md pitfall 10).

:func:`coco_map` reproduces ``pycocotools.cocoeval.COCOeval`` for boxes (area range "all", at
most ``max_dets`` detections per image, no crowd regions) to floating-point precision;
``tests/test_metrics.py`` checks it against pycocotools on random data.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

COCO_IOU_THRESHOLDS = np.round(np.arange(0.5, 0.96, 0.05), 12)
"""0.50, 0.55, …, 0.95: the ten IoU thresholds of COCO's mAP."""

RECALL_THRESHOLDS = np.linspace(0.0, 1.0, 101)
"""The 101 recall points of COCO's interpolated precision."""


# -- inputs ------------------------------------------------------------------------------------
def _as_detection(item: Any, where: str) -> tuple[list[float], float, Any]:
    """``(box, score, label)`` of one prediction or target item (mapping or plain 4-list)."""
    if isinstance(item, Mapping):
        box = next((item[k] for k in ("box", "bbox", "bbox_2d") if k in item), None)
        score, label = item.get("score", 1.0), item.get("label")
    else:
        box, score, label = item, 1.0, None
    if not (
        isinstance(box, (list, tuple, np.ndarray))
        and len(box) == 4
        and all(isinstance(v, (int, float, np.number)) and math.isfinite(v) for v in box)
    ):
        raise ValueError(f"{where}: expected a box [x1, y1, x2, y2] of finite numbers, got {box!r}")
    if not isinstance(score, (int, float, np.number)) or not math.isfinite(score):
        raise ValueError(f"{where}: score must be a finite number, got {score!r}")
    return [float(v) for v in box], float(score), label


def iou_matrix(boxes_a: np.ndarray, boxes_b: np.ndarray) -> np.ndarray:
    """Pairwise IoU of ``[N, 4]`` and ``[M, 4]`` boxes ``[x1, y1, x2, y2]`` → ``[N, M]``.

    Inverted or empty boxes have area 0; a pair with an empty union has IoU 0.

    >>> iou_matrix(np.array([[0, 0, 10, 10]]), np.array([[5, 0, 15, 10], [20, 20, 30, 30]]))
    array([[0.33333333, 0.        ]])
    """
    a = np.asarray(boxes_a, dtype=float).reshape(-1, 4)
    b = np.asarray(boxes_b, dtype=float).reshape(-1, 4)
    area_a = np.clip(a[:, 2] - a[:, 0], 0, None) * np.clip(a[:, 3] - a[:, 1], 0, None)
    area_b = np.clip(b[:, 2] - b[:, 0], 0, None) * np.clip(b[:, 3] - b[:, 1], 0, None)
    w = np.minimum(a[:, None, 2], b[None, :, 2]) - np.maximum(a[:, None, 0], b[None, :, 0])
    h = np.minimum(a[:, None, 3], b[None, :, 3]) - np.maximum(a[:, None, 1], b[None, :, 1])
    inter = np.clip(w, 0, None) * np.clip(h, 0, None)
    union = area_a[:, None] + area_b[None, :] - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)


# -- matching and AP ---------------------------------------------------------------------------
def coco_match(ious: np.ndarray, thresholds: Sequence[float]) -> np.ndarray:
    """COCO's per-image matching: ``[T, D]`` booleans, True where detection d is a true positive.

    ``ious`` is ``[D, G]`` with detections already sorted by descending score. At each
    threshold t, each detection in order takes the still-unmatched ground truth of highest IoU
    provided that IoU ≥ t (ties go to the later ground truth, as in pycocotools).
    """
    ious = np.asarray(ious, dtype=float)
    n_det, n_gt = ious.shape if ious.ndim == 2 else (0, 0)
    matched = np.zeros((len(thresholds), n_det), dtype=bool)
    if n_det == 0 or n_gt == 0:
        return matched
    for ti, t in enumerate(thresholds):
        floor = min(float(t), 1 - 1e-10)
        free = np.ones(n_gt, dtype=bool)
        for d in range(n_det):
            row = np.where(free, ious[d], -1.0)
            best = row.max()
            if best < floor:
                continue
            g = n_gt - 1 - int(np.argmax(row[::-1] == best))  # the last of equal bests
            free[g] = False
            matched[ti, d] = True
    return matched


def interpolated_precision(
    scores: np.ndarray, tp: np.ndarray, n_gt: int, recall_thresholds: np.ndarray = RECALL_THRESHOLDS
) -> np.ndarray:
    """COCO's interpolated precision ``[T, R]`` of detections pooled over images.

    ``scores`` ``[D]`` and ``tp`` ``[T, D]`` (true-positive flags) in any order; detections are
    ranked by descending score (stable), precision is made monotone from the right, and read at
    each recall threshold r as the precision at the first rank whose recall ≥ r (0 when the
    recall is never reached). AP = the mean over the R recall points. (pycocotools adds
    ``np.spacing(1)`` to the precision's denominator, which is never 0; without it a perfect
    detector scores exactly 1 rather than 1 − 2e-16.)
    """
    order = np.argsort(-np.asarray(scores, dtype=float), kind="mergesort")
    tp = np.asarray(tp, dtype=bool)[:, order]
    tp_sum = np.cumsum(tp, axis=1).astype(float)
    fp_sum = np.cumsum(~tp, axis=1).astype(float)
    n_det = tp.shape[1]
    out = np.zeros((tp.shape[0], len(recall_thresholds)))
    if n_det == 0:
        return out
    for t in range(tp.shape[0]):
        recall = tp_sum[t] / n_gt
        precision = tp_sum[t] / (tp_sum[t] + fp_sum[t])  # ≥ 1 detection at every rank
        precision = np.maximum.accumulate(precision[::-1])[::-1]
        idx = np.searchsorted(recall, recall_thresholds, side="left")
        out[t] = np.where(idx < n_det, precision[np.minimum(idx, n_det - 1)], 0.0)
    return out


def average_precision(
    predictions: Sequence[Any], targets: Sequence[Any], iou_threshold: float = 0.5
) -> float:
    """AP at one IoU threshold for one image, class-agnostic, COCO's 101-point interpolation.

    Items as in :func:`coco_map`. An empty target gives ``nan`` (AP is undefined).

    >>> hit = {"box": [0, 0, 10, 10], "score": 0.9}
    >>> average_precision([hit, {"box": [50, 50, 60, 60], "score": 0.1}], [[0, 0, 10, 10]])
    1.0
    >>> average_precision([hit, [50, 50, 60, 60]], [[0, 0, 10, 10]])  # a plain box has score 1
    0.5
    """
    dets = [_as_detection(p, f"predictions[{i}]") for i, p in enumerate(predictions)]
    gts = [_as_detection(t, f"targets[{i}]")[0] for i, t in enumerate(targets)]
    if not gts:
        return float("nan")
    if not dets:
        return 0.0
    scores = np.array([d[1] for d in dets])
    order = np.argsort(-scores, kind="mergesort")
    ious = iou_matrix(np.array([dets[i][0] for i in order]), np.array(gts))
    tp = coco_match(ious, [iou_threshold])
    return float(interpolated_precision(scores[order], tp, len(gts)).mean())


# -- COCO mAP ----------------------------------------------------------------------------------
def _label_key(label: Any) -> str:
    return str(label)


def coco_map(
    predictions: Sequence[Sequence[Any]],
    targets: Sequence[Sequence[Any]],
    iou_thresholds: Sequence[float] = COCO_IOU_THRESHOLDS,
    *,
    max_dets: int = 100,
) -> dict[str, float]:
    """COCO box mAP of detections over a set of images, as ``pycocotools`` computes it.

    Args:
        predictions: one list per image of detections; a detection is a mapping
            ``{"box": [x1, y1, x2, y2], "score": s, "label": l}`` (``bbox`` / ``bbox_2d`` also
            name the box; ``score`` defaults to 1, ``label`` to ``None``) or a plain box.
        targets: one list per image, aligned with ``predictions``, of ground-truth boxes (same
            forms; the score is ignored). Boxes of both are in the same frame (pixels).
        iou_thresholds: the IoU thresholds averaged over (default COCO's 0.50:0.05:0.95);
            values are rounded to 12 decimals, so ``np.arange`` and ``np.linspace`` agree.
        max_dets: detections kept per image and class, highest scores first (COCO: 100).

    Returns:
        ``mAP``: mean over classes, IoU thresholds and the 101 recall points of the
        interpolated precision (COCO's ``stats[0]``, area "all"); ``AP50`` and ``AP75`` when
        0.5 / 0.75 are among the thresholds (``stats[1]``, ``stats[2]``); and, when any label is
        not ``None``, ``AP/<label>`` per class (mean over thresholds and recall points).

    Matching is per image and class: a detection matches the unmatched ground truth of its
    class with the highest IoU ≥ t, detections taken in descending score order. A class counts
    only if it has ground truth somewhere; detections of classes without ground truth are
    ignored (as pycocotools ignores categories absent from the annotations). With every label
    ``None`` the evaluation is class-agnostic (``useCats=0``). Without any ground truth the
    values are ``nan`` (pycocotools reports −1). Crowd regions and area ranges are not modelled.

    Raises ``ValueError`` when the lists differ in length or an item is not a finite box.

    >>> preds = [[{"box": [0, 0, 10, 10], "score": 0.9, "label": "cat"},
    ...           {"box": [20, 20, 30, 30], "score": 0.8, "label": "cat"}]]
    >>> out = coco_map(preds, [[{"box": [0, 0, 10, 10], "label": "cat"}]])
    >>> out["mAP"], out["AP50"], out["AP/cat"]
    (1.0, 1.0, 1.0)
    """
    if len(predictions) != len(targets):
        raise ValueError(f"{len(predictions)} prediction lists for {len(targets)} target lists")
    if max_dets < 1:
        raise ValueError(f"max_dets must be ≥ 1, got {max_dets}")
    thresholds = np.round(np.asarray(iou_thresholds, dtype=float).reshape(-1), 12)
    if thresholds.size == 0 or not np.all((thresholds > 0) & (thresholds <= 1)):
        raise ValueError(f"iou_thresholds must be non-empty values in (0, 1], got {iou_thresholds}")

    # Group by class, then by image: {class: {image: ([(box, score)], [box])}}.
    groups: dict[Any, dict[int, tuple[list, list]]] = {}
    classes: dict[Any, None] = {}
    for i, image in enumerate(targets):
        for j, item in enumerate(image):
            box, _, label = _as_detection(item, f"targets[{i}][{j}]")
            classes.setdefault(label, None)
            groups.setdefault(label, {}).setdefault(i, ([], []))[1].append(box)
    for i, image in enumerate(predictions):
        for j, item in enumerate(image):
            box, score, label = _as_detection(item, f"predictions[{i}][{j}]")
            if label in classes:  # detections of classes without ground truth are ignored
                groups[label].setdefault(i, ([], []))[0].append((box, score))

    per_class: dict[Any, np.ndarray] = {}  # class → precision [T, R]
    for label in classes:
        pooled_scores, pooled_tp, n_gt = [], [], 0
        for i in sorted(groups[label]):
            dets, gts = groups[label][i]
            n_gt += len(gts)
            scores = np.array([s for _, s in dets], dtype=float)
            order = np.argsort(-scores, kind="mergesort")[:max_dets]
            boxes = np.array([dets[k][0] for k in order], dtype=float).reshape(-1, 4)
            ious = iou_matrix(boxes, np.array(gts, dtype=float).reshape(-1, 4))
            pooled_scores.append(scores[order])
            pooled_tp.append(coco_match(ious, thresholds))
        per_class[label] = interpolated_precision(
            np.concatenate(pooled_scores), np.concatenate(pooled_tp, axis=1), n_gt
        )

    def mean_at(index: slice | int) -> float:
        if not per_class:
            return float("nan")
        return float(np.mean([p[index].mean() for p in per_class.values()]))

    out = {"mAP": mean_at(slice(None))}
    for name, value in (("AP50", 0.5), ("AP75", 0.75)):
        hits = np.flatnonzero(np.isclose(thresholds, value, rtol=0, atol=1e-9))
        if hits.size:
            out[name] = mean_at(int(hits[0]))
    if any(label is not None for label in per_class):
        for label in sorted(per_class, key=_label_key):
            out[f"AP/{_label_key(label)}"] = float(per_class[label].mean())
    return out


# -- temporal grounding ------------------------------------------------------------------------
def temporal_recall(
    ious: Sequence[float | None], thresholds: Sequence[float] = (0.3, 0.5, 0.7)
) -> dict[str, float]:
    """Temporal-grounding recall ``R1@t`` (share of samples with tIoU ≥ t) and ``mIoU``.

    ``ious`` holds the tIoU of the one (top-1) predicted interval per sample; ``None`` or
    ``nan`` (unparsable answer) counts as 0. Values are fractions in [0, 1] (papers print
    percentages). Keys: ``R1@0.3``, ``R1@0.5``, ``R1@0.7`` (one per threshold, ``%g`` format)
    and ``mIoU``; all ``nan`` for an empty list.

    >>> temporal_recall([0.75, 0.5, None, 0.25])
    {'R1@0.3': 0.5, 'R1@0.5': 0.5, 'R1@0.7': 0.25, 'mIoU': 0.375}
    """
    for t in thresholds:
        if not 0.0 < t <= 1.0:
            raise ValueError(f"thresholds must be in (0, 1], got {t}")
    values = np.array(
        [0.0 if v is None or not math.isfinite(v) else float(v) for v in ious], dtype=float
    )
    out = {}
    for t in thresholds:
        out[f"R1@{t:g}"] = float(np.mean(values >= t)) if values.size else float("nan")
    out["mIoU"] = float(values.mean()) if values.size else float("nan")
    return out
