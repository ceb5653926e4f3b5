"""Evaluation metrics: coco_map against pycocotools' COCOeval, temporal recall, doctests."""

from __future__ import annotations

import contextlib
import doctest
import io
import math

import numpy as np
import pytest

from mmrft import metrics
from mmrft.rewards.metrics import average_precision, coco_map, iou_matrix, temporal_recall

pycocotools = pytest.importorskip("pycocotools")
from pycocotools.coco import COCO  # noqa: E402
from pycocotools.cocoeval import COCOeval  # noqa: E402


def test_docstring_examples_run():
    result = doctest.testmod(metrics)
    assert result.attempted > 0
    assert result.failed == 0


# -- reference: pycocotools ---------------------------------------------------------------------
def pycoco_stats(predictions, targets, labels, use_cats=True):
    """COCOeval's (mAP, AP50, AP75) and per-class AP for the same data (boxes xyxy → xywh)."""
    images, annotations, results = [], [], []
    for i, (preds, gts) in enumerate(zip(predictions, targets)):
        images.append({"id": i + 1, "width": 1000, "height": 1000})
        for g in gts:
            x1, y1, x2, y2 = g["box"]
            annotations.append(
                {
                    "id": len(annotations)
                    + 1,  # ids start at 1: COCOeval treats id 0 as "no match"
                    "image_id": i + 1,
                    "category_id": labels.index(g["label"]) + 1,
                    "bbox": [x1, y1, x2 - x1, y2 - y1],
                    "area": (x2 - x1) * (y2 - y1),
                    "iscrowd": 0,
                }
            )
        for p in preds:
            x1, y1, x2, y2 = p["box"]
            results.append(
                {
                    "image_id": i + 1,
                    "category_id": labels.index(p["label"]) + 1,
                    "bbox": [x1, y1, x2 - x1, y2 - y1],
                    "score": p["score"],
                }
            )
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO()
        gt.dataset = {
            "images": images,
            "annotations": annotations,
            "categories": [{"id": k + 1, "name": str(n)} for k, n in enumerate(labels)],
        }
        gt.createIndex()
        dt = gt.loadRes(results)
        ev = COCOeval(gt, dt, "bbox")
        ev.params.useCats = int(use_cats)
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    precision = ev.eval["precision"][:, :, :, 0, -1]  # area "all", maxDets 100
    per_class = {}
    for k, name in enumerate(labels if use_cats else []):
        p = precision[:, :, k]
        if (p > -1).any():
            per_class[f"AP/{name}"] = float(p[p > -1].mean())
    return {"mAP": ev.stats[0], "AP50": ev.stats[1], "AP75": ev.stats[2]}, per_class


def valid(box: np.ndarray) -> np.ndarray:
    """Keep a jittered box well-formed (x1 < x2, y1 < y2): COCO gives inverted boxes a negative
    area and ignores them, mmrft counts them as false positives."""
    x1, y1, x2, y2 = box
    return np.array([min(x1, x2), min(y1, y2), max(x1, x2) + 1, max(y1, y2) + 1])


def random_scene(rng, n_images, labels, max_gt=6, spam_image=False):
    """Ground truth boxes and detections: jittered copies of the truth, misses, false positives,
    wrong classes, duplicates, images with no truth and images with no detections."""
    predictions, targets = [], []
    for i in range(n_images):
        gts = []
        for _ in range(rng.integers(0, max_gt + 1)):
            x, y = rng.uniform(0, 800, 2)
            w, h = rng.uniform(10, 200, 2)
            gts.append({"box": [x, y, x + w, y + h], "label": labels[rng.integers(len(labels))]})
        preds = []
        for g in gts:
            if rng.random() < 0.8:  # detected, with a jitter that spans every IoU threshold
                box = valid(np.array(g["box"]) + rng.normal(0, rng.uniform(0, 25), 4))
                label = g["label"] if rng.random() < 0.9 else labels[rng.integers(len(labels))]
                preds.append({"box": box.tolist(), "score": float(rng.random()), "label": label})
                if rng.random() < 0.3:  # duplicate detection
                    dup = valid(np.array(g["box"]) + rng.normal(0, 5, 4))
                    preds.append(
                        {"box": dup.tolist(), "score": float(rng.random()), "label": label}
                    )
        for _ in range(rng.integers(0, 4)):  # false positives
            x, y = rng.uniform(0, 800, 2)
            w, h = rng.uniform(10, 200, 2)
            preds.append(
                {
                    "box": [x, y, x + w, y + h],
                    "score": float(rng.random()),
                    "label": labels[rng.integers(len(labels))],
                }
            )
        if spam_image and i == 0:  # more than max_dets=100 detections of one class
            for _ in range(130):
                x, y = rng.uniform(0, 800, 2)
                preds.append(
                    {
                        "box": [x, y, x + 50, y + 50],
                        "score": float(rng.random()),
                        "label": labels[0],
                    }
                )
        order = rng.permutation(len(preds))
        predictions.append([preds[k] for k in order])
        targets.append(gts)
    return predictions, targets


@pytest.mark.parametrize("seed", range(6))
def test_coco_map_matches_pycocotools(seed):
    rng = np.random.default_rng(seed)
    labels = ["cat", "dog", "car", "person"]
    predictions, targets = random_scene(rng, n_images=12, labels=labels, spam_image=seed % 2 == 0)
    ours = coco_map(predictions, targets, iou_thresholds=np.arange(0.5, 0.96, 0.05))
    ref, ref_per_class = pycoco_stats(predictions, targets, labels)
    for key in ("mAP", "AP50", "AP75"):
        assert ours[key] == pytest.approx(ref[key], abs=1e-6), key
    assert {k: v for k, v in ours.items() if k.startswith("AP/")} == pytest.approx(
        ref_per_class, abs=1e-6
    )
    assert 0.05 < ours["mAP"] < 0.95  # the data is neither trivial nor hopeless


@pytest.mark.parametrize("seed", range(3))
def test_coco_map_class_agnostic_matches_pycocotools_use_cats_0(seed):
    rng = np.random.default_rng(100 + seed)
    labels = ["cat", "dog"]
    predictions, targets = random_scene(rng, n_images=10, labels=labels)
    ref, _ = pycoco_stats(predictions, targets, labels, use_cats=False)
    strip = [[{**d, "label": None} for d in image] for image in predictions]
    strip_t = [[{**d, "label": None} for d in image] for image in targets]
    ours = coco_map(strip, strip_t)
    for key in ("mAP", "AP50", "AP75"):
        assert ours[key] == pytest.approx(ref[key], abs=1e-6), key
    assert not any(k.startswith("AP/") for k in ours)


def test_coco_map_integer_boxes_at_exact_thresholds_match_pycocotools():
    """IoUs that land exactly on a threshold (0.5, 0.75) count as matches in both."""
    labels = ["a"]
    gt = {"box": [0.0, 0.0, 100.0, 100.0], "label": "a"}
    preds = [
        [{"box": [0.0, 0.0, 100.0, 50.0], "score": 0.9, "label": "a"}],  # IoU 0.5 exactly
        [{"box": [0.0, 0.0, 100.0, 75.0], "score": 0.8, "label": "a"}],  # IoU 0.75 exactly
    ]
    targets = [[gt], [gt]]
    ours = coco_map(preds, targets)
    ref, _ = pycoco_stats(preds, targets, labels)
    for key in ("mAP", "AP50", "AP75"):
        assert ours[key] == pytest.approx(ref[key], abs=1e-6), key
    assert ours["AP50"] == pytest.approx(1.0)


def test_coco_map_edge_cases():
    box = [0, 0, 10, 10]
    assert coco_map([[box]], [[box]]) == {"mAP": 1.0, "AP50": 1.0, "AP75": 1.0}
    assert coco_map([[]], [[box]])["mAP"] == 0.0  # missed everything
    assert math.isnan(coco_map([[box]], [[]])["mAP"])  # no ground truth: undefined
    assert coco_map([], []) == {"mAP": pytest.approx(float("nan"), nan_ok=True)} | {
        "AP50": pytest.approx(float("nan"), nan_ok=True),
        "AP75": pytest.approx(float("nan"), nan_ok=True),
    }
    # Only AP50 when 0.75 is not evaluated.
    assert set(coco_map([[box]], [[box]], iou_thresholds=[0.5])) == {"mAP", "AP50"}
    # Detections of a class without ground truth are ignored (pycocotools ignores categories
    # absent from the annotations); they are not a class of their own.
    out = coco_map(
        [[{"box": box, "label": "cat"}, {"box": box, "label": "unicorn"}]],
        [[{"box": box, "label": "cat"}]],
    )
    assert out == {"mAP": 1.0, "AP50": 1.0, "AP75": 1.0, "AP/cat": 1.0}


@pytest.mark.parametrize(
    ("predictions", "targets", "match"),
    [
        ([[]], [], "prediction lists"),
        ([[[0, 0, 1]]], [[[0, 0, 1, 1]]], "box"),
        ([[[0, 0, float("nan"), 1]]], [[[0, 0, 1, 1]]], "box"),
        ([[{"box": [0, 0, 1, 1], "score": "high"}]], [[[0, 0, 1, 1]]], "score"),
    ],
)
def test_coco_map_rejects_bad_inputs(predictions, targets, match):
    with pytest.raises(ValueError, match=match):
        coco_map(predictions, targets)


def test_coco_map_bad_thresholds():
    with pytest.raises(ValueError, match="iou_thresholds"):
        coco_map([[]], [[]], iou_thresholds=[0.0])
    with pytest.raises(ValueError, match="max_dets"):
        coco_map([[]], [[]], max_dets=0)


def test_average_precision_single_image():
    gt = [[0, 0, 10, 10], [20, 20, 30, 30]]
    # Both found, the false positive ranked last: AP 1.
    preds = [
        {"box": [0, 0, 10, 10], "score": 0.9},
        {"box": [20, 20, 30, 30], "score": 0.8},
        {"box": [50, 50, 60, 60], "score": 0.1},
    ]
    assert average_precision(preds, gt) == pytest.approx(1.0)
    # The false positive ranked first: precision 1/2 at recall 1/2, 2/3 at recall 1.
    preds[2]["score"] = 0.95
    assert average_precision(preds, gt) == pytest.approx(2 / 3)
    assert average_precision([], gt) == 0.0
    assert math.isnan(average_precision(preds, []))


def test_iou_matrix_degenerate_boxes():
    out = iou_matrix(np.array([[0, 0, 0, 0], [5, 5, 1, 1]]), np.array([[0, 0, 0, 0]]))
    assert out.tolist() == [[0.0], [0.0]]
    assert iou_matrix(np.zeros((0, 4)), np.zeros((3, 4))).shape == (0, 3)


# -- temporal -----------------------------------------------------------------------------------
def test_temporal_recall():
    out = temporal_recall([0.3, 0.5, 0.69, 0.7, 1.0, 0.0, None, float("nan")])
    assert out == {
        "R1@0.3": pytest.approx(5 / 8),
        "R1@0.5": pytest.approx(4 / 8),
        "R1@0.7": pytest.approx(2 / 8),
        "mIoU": pytest.approx((0.3 + 0.5 + 0.69 + 0.7 + 1.0) / 8),
    }
    assert set(temporal_recall([0.5], thresholds=(0.1, 0.9))) == {"R1@0.1", "R1@0.9", "mIoU"}
    assert all(math.isnan(v) for v in temporal_recall([]).values())
    with pytest.raises(ValueError, match="thresholds"):
        temporal_recall([0.5], thresholds=(0.0,))
