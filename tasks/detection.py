"""Object detection of one category: every instance, as a list of boxes with confidences
(Visual-RFT detection, VLM-R1 OVD).

A sample holds one image and, as its question, what to find ("Find every circle in the
image."). The target is the list of the instances' boxes ``[[x1, y1, x2, y2], ...]`` in
absolute pixels of the *original* image (x right, y down), ``[]`` when there is none, with
``meta["image_size"] = [W, H]`` (read from the image header when absent) and optionally
``meta["category"]`` and ``meta["count_range"] = [lo, hi]`` (inclusive bounds on the number of
instances, checked against the target)::

    {"id": "shapes_detection-test-0000",
     "messages": [{"role": "user", "content": [
         {"type": "image", "image": "images/test-0000.png"},
         {"type": "text", "text": "Find every circle in the image."}]}],
     "target": [[33, 93, 47, 107]],
     "meta": {"category": "circle", "count_range": [0, 4], "image_size": [112, 112]}}

The model writes a JSON list in its family's box frame (``meta["box_frame"]``, with
``meta["input_size"]`` for ``input_pixels``; both set by
:meth:`~mmrft.models.family.ModelFamily.annotate`)::

    [{"bbox_2d": [x1, y1, x2, y2], "confidence": 0.9}, ...]      or  []

and the prompt's ``{box_instruction}`` asks for exactly that in the family's frame (the
family's own one-box instruction is replaced by the list form). The parser
(:func:`mmrft.verifiers.detection.parse_detections`) also reads Visual-RFT's
``[{'Position': [...], 'Confidence': c}]`` and plain box lists; a box without a confidence
ranks with confidence 1. Predictions are converted to original pixels and clipped to the
image before any comparison, so frames are never mixed.

Metrics: COCO box AP over the whole split (:func:`mmrft.rewards.metrics.coco_map`, pycocotools'
numbers): ``AP50`` (primary), ``mAP`` (AP@[.50:.95]) and ``AP75``; per image, ``image_ap50``
(AP@0.5 of that image's ranked boxes; 1 for a correct "none" and 0 for boxes on an empty image)
and ``detection`` (the training reward's detection score, Visual-RFT's IoU × confidence term,
in [0, 1]). **Why AP50 is primary:** the reward matches a box at IoU > 0.5 (Visual-RFT), so AP50
measures what RL optimises — finding each instance once, without false positives, ranked by
confidence; mAP also grades pixel-exact boundaries, which for the small objects of the bundled
benchmark (14–22 px on 112 px images) and 0–1000 integer coordinates is dominated by
quantisation and box-edge conventions (a one-pixel shift on a 14 px box costs IoU 0.13), so
its changes say little about whether RL taught the model to detect. mAP is reported next to it
(the COCO / LVIS number Visual-RFT headlines) for comparison with the papers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from mmrft.tasks.grounding import _check_box, box_frame, image_size_of
from mmrft.verifiers.detection import MAX_CHARS_PER_BOX, parse_detections
from mmrft.verifiers.detection import detection as detection_reward

from mmrft.data import DataError, Sample
from mmrft.models.family import FRAME_PHRASES, ModelFamily
from mmrft.rewards.answers import extract_answer
from mmrft.rewards.boxes import clip_box, from_pixels, is_degenerate, outside_image, to_pixels
from mmrft.rewards.metrics import average_precision, coco_map
from mmrft.rewards.task import EvalRecord, ExampleData, Task, ThinkMode, task
from mmrft.typecheck import ConfigError


def list_box_instruction(frame: str) -> str:
    """The prompt phrase asking for a JSON list of boxes with confidences in ``frame``."""
    if frame not in FRAME_PHRASES:
        raise ValueError(f"unknown box frame '{frame}'; valid: {', '.join(FRAME_PHRASES)}")
    return (
        'Output a JSON list with one object per instance, [{"bbox_2d": [x1, y1, x2, y2], '
        f'"confidence": c}}, ...], {FRAME_PHRASES[frame]}, and c your confidence from 0 to 1; '
        "output [] if there is none."
    )


class _ListBoxes:
    """A model family seen through the prompt: the same family with the list instruction."""

    def __init__(self, family: ModelFamily) -> None:
        self._family = family
        self.box_instruction = list_box_instruction(family.box_frame)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._family, name)


@dataclass
class DetectionRecord(EvalRecord):
    """An :class:`~mmrft.rewards.task.EvalRecord` that carries its image's ground-truth boxes
    (original pixels), so that :meth:`DetectionTask.aggregate` can compute AP over the split."""

    target: list[list[float]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "target": self.target}


def _format_value(value: float, frame: str) -> str:
    return f"{value:.3f}" if frame == "norm1" else str(round(value))


@task("detection")
class DetectionTask(Task):
    """Every instance of one category as a list of boxes with confidences.

    Template fields: ``{question}`` (what to find), ``{box_instruction}`` (a JSON list of
    ``{"bbox_2d": [...], "confidence": c}`` in the family's frame, ``[]`` for none) and
    ``{format_instruction}``. Reward: format + detection (weights 1, 1; Visual-RFT's greedy
    IoU > 0.5 matching with the confidence term, combined so that unmatched boxes never add,
    range [0, 1]). Metrics: ``AP50`` (primary), ``mAP``, ``AP75`` over the split, and the
    per-image means ``image_ap50`` and ``detection``.
    """

    template = "{question} {box_instruction}\n{format_instruction}"
    primary_metric = "AP50"
    formats = ("mmrft",)
    example_data: ClassVar[ExampleData] = {
        "mmrft": ("shapes_detection/train.jsonl", "shapes_detection/test.jsonl", {})
    }

    def __init__(
        self,
        *,
        think: ThinkMode = "required",
        template: str | None = None,
        max_boxes: int = 100,
    ) -> None:
        """
        Args:
            think: whether the answer format asks for a ``<think>`` block first.
            template: replaces the prompt template (same fields).
            max_boxes: most boxes read from one answer (COCO's ``maxDets``); an answer with
                more fails to parse (``too many boxes``), so box spam buys nothing.
        """
        super().__init__(think=think, template=template)
        if max_boxes < 1:
            raise ConfigError(f"task '{self.name}'.max_boxes must be ≥ 1, got {max_boxes}")
        self.max_boxes = max_boxes

    # -- data ---------------------------------------------------------------------------------
    def parse_record(self, record: Any, base: Path, where: str) -> Sample:
        sample = super().parse_record(record, base, where)
        size = image_size_of(sample, where, "detection")
        if not isinstance(sample.target, list):
            raise DataError(
                f"{where}: target must be a list of boxes [x1, y1, x2, y2] in pixels ([] for "
                f"none), got {sample.target!r}"
            )
        sample.target = [
            _check_box(box, size, where, field=f"target[{i}]")
            for i, box in enumerate(sample.target)
        ]
        bounds = sample.meta.get("count_range")
        if bounds is not None:
            if not (
                isinstance(bounds, list)
                and len(bounds) == 2
                and all(isinstance(b, int) and not isinstance(b, bool) and b >= 0 for b in bounds)
                and bounds[0] <= bounds[1]
            ):
                raise DataError(f"{where}: meta.count_range must be [lo, hi] with 0 ≤ lo ≤ hi")
            if not bounds[0] <= len(sample.target) <= bounds[1]:
                raise DataError(
                    f"{where}: {len(sample.target)} target boxes, outside count_range {bounds}"
                )
        return sample

    # -- prompts ------------------------------------------------------------------------------
    def prompt(self, sample: Sample, family: ModelFamily) -> list[dict[str, Any]]:
        """As :meth:`Task.prompt`, with ``{box_instruction}`` asking for a list of boxes with
        confidences in the family's frame (:func:`list_box_instruction`)."""
        return super().prompt(sample, _ListBoxes(family))  # type: ignore[arg-type]

    # -- rewards and metrics --------------------------------------------------------------------
    def default_verifiers(self) -> list[dict[str, Any]]:
        return self.format_and("detection", {"max_boxes": self.max_boxes})

    def reference_answer(self, sample: Sample) -> str:
        """The target boxes in ``meta["box_frame"]`` (rounded as the families write them) with
        confidence 1, e.g. ``[{"bbox_2d": [33, 93, 47, 107], "confidence": 1.0}]``; ``[]`` for
        none."""
        frame = box_frame(sample)
        items = []
        for box in sample.target:
            values = ", ".join(
                _format_value(v, frame) for v in from_pixels(box, frame, sample.meta)
            )
            items.append('{"bbox_2d": [' + values + '], "confidence": 1.0}')
        return "[" + ", ".join(items) + "]"

    def evaluate_one(self, completion: str, sample: Sample) -> DetectionRecord:
        """Strict parse: exactly one answer block read by
        :func:`~mmrft.verifiers.detection.parse_detections` (at most ``max_boxes`` boxes), each box
        read in ``meta["box_frame"]``, converted to original pixels and clipped to the image (a
        box past the edge tolerance :data:`mmrft.rewards.boxes.EDGE_TOLERANCE` or wholly outside the
        image fails the answer: ``box outside image``).

        ``parsed`` is the list of ``{"box": [x1, y1, x2, y2] (original pixels), "score":
        confidence}`` (``[]`` for an explicit "none"; ``None`` when unparsable). Values:
        ``image_ap50`` (AP@0.5 of this image; for an image without instances 1 when no box is
        given, else 0; ``score`` is this value) and ``detection`` (the detection reward). An
        unparsable answer scores 0 with the reason (``no answer tag``, ``no box``, ``too many
        boxes``, ``bad confidence``, ``degenerate box``, ``box outside image``, ...) and counts as no detections in
        the split's AP. Raises ``ValueError`` for a sample without ``box_frame`` (a setup error).
        """
        frame = box_frame(sample)
        target = [list(map(float, box)) for box in sample.target]
        reward = detection_reward([completion], [sample], max_boxes=self.max_boxes)[0].value

        def failed(reason: str | None) -> DetectionRecord:
            values = {"image_ap50": 0.0, "detection": reward}
            return DetectionRecord(sample.id, completion, None, 0.0, reason, values, target=target)

        answer, reason = extract_answer(completion)
        if answer is None:
            return failed(reason)
        if len(answer) > 1000 + MAX_CHARS_PER_BOX * self.max_boxes:
            return failed("answer too long")
        detections, reason = parse_detections(answer, limit=self.max_boxes)
        if detections is None:
            return failed(reason)
        width, height = sample.meta["image_size"]
        parsed = []
        for d in detections:
            pixels = to_pixels(d.box, frame, sample.meta)
            if is_degenerate(pixels):
                return failed("degenerate box")
            if outside_image(pixels, float(width), float(height)):
                return failed("box outside image")
            score = 1.0 if d.confidence is None else d.confidence
            parsed.append({"box": clip_box(pixels, float(width), float(height)), "score": score})
        if target:
            ap50 = average_precision(parsed, target, 0.5) if parsed else 0.0
        else:
            ap50 = float(not parsed)
        values = {"image_ap50": ap50, "detection": reward}
        return DetectionRecord(sample.id, completion, parsed, ap50, None, values, target=target)

    def aggregate(self, records: list[EvalRecord]) -> dict[str, float]:
        """COCO AP over the split (:func:`mmrft.rewards.metrics.coco_map` of every record's parsed boxes
        against its target; unparsable answers are empty prediction lists): ``mAP``, ``AP50``,
        ``AP75`` (``nan`` when no image has an instance); plus the means of ``image_ap50`` and
        ``detection`` and ``format_fail``. Records must come from :meth:`evaluate_one`
        (they carry the targets)."""
        if not records:
            return {}
        if not all(isinstance(r, DetectionRecord) for r in records):
            raise TypeError("detection aggregate needs DetectionRecord s from evaluate_one")
        out = super().aggregate(records)
        predictions = [r.parsed or [] for r in records]
        targets = [r.target for r in records]  # type: ignore[attr-defined]
        coco = coco_map(predictions, targets)
        for key in ("mAP", "AP50", "AP75"):
            out[key] = coco.get(key, math.nan)
        return out
