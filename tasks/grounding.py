"""Referring-expression grounding: one expression in, one box out (RefCOCO/+/g, VLM-R1 REC).

A sample holds one image and, as its question text, the referring expression ("the man on
the left"). The target is the referred box ``[x1, y1, x2, y2]`` in absolute pixels of the
*original* image (x right, y down; COCO's ``[x, y, x + w, y + h]``), and
``meta["image_size"] = [W, H]``. The model answers in its family's frame
(``meta["box_frame"]``, with ``meta["input_size"]`` for ``input_pixels``, both set by
:meth:`~mmrft.models.family.ModelFamily.annotate`); predictions are converted to original pixels before
any comparison, so frames are never mixed.

Dataset formats:

* ``mmrft``: the project JSONL (:mod:`mmrft.data`) with the target as above.
  ``meta.image_size`` is read from the image header when the line does not give it.
* ``refcoco``: VLM-R1's REC annotations (``rec_jsons_processed``: ``refcoco_train``,
  ``refcocop_val``, ``refcocog_test``, ...), a JSON list as VLM-R1 ships them or one object per
  line (any container of :func:`mmrft.data.iter_records`)::

      {"image": "COCO_train2014_000000xxxxxx.jpg", "problem": "...",
       "normal_caption": "the man on the left", "solution": [x1, y1, x2, y2],
       "normalized_solution": [...]}

  ``image`` is relative to the task parameter ``image_root`` (default: the file's folder),
  ``normal_caption`` is the expression and ``solution`` the box in original pixels.
  ``problem`` (VLM-R1's own prompt) and ``normalized_solution`` are not used: the prompt is this
  task's template. ``image_size`` is read from each image's header (size only, no pixels
  decoded; cached per path). VLM-R1's newer ``conversations`` files (``from: human / gpt``)
  are read by the layout every task has, ``data.format: conversations``.

Metrics (:meth:`GroundingTask.evaluate_one`): ``acc@0.5`` (IoU ≥ 0.5, the RefCOCO metric,
primary) and ``iou``; with ``meta["other_boxes"]`` (the boxes of the image's *other* objects,
original pixels, optional) also ``wrong_object``: the share of answers that miss the referred
object but box another one (IoU ≥ 0.5 with it), the error of a model that localises objects
but does not bind the expression to the right one.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar

from mmrft.tasks.video_qa import user_turn
from PIL import Image, UnidentifiedImageError

from mmrft.data import (
    DataError,
    OnError,
    ReadStats,
    Sample,
    default_id,
    read_records,
    require_fields,
)
from mmrft.rewards.answers import extract_answer
from mmrft.rewards.boxes import (
    box_iou,
    clip_box,
    format_box,
    is_degenerate,
    outside_image,
    parse_one_box,
    to_pixels,
)
from mmrft.rewards.task import EvalRecord, ExampleData, Task, ThinkMode, task

ACC_IOU = 0.5
"""IoU at or above which a box counts as correct for ``acc@0.5``."""


@lru_cache(maxsize=65536)
def image_size(path: str) -> tuple[int, int]:
    """``(W, H)`` in pixels from the image header; PIL opens lazily, no pixels are decoded.

    Raises ``FileNotFoundError`` or ``PIL.UnidentifiedImageError`` / ``OSError``.
    """
    with Image.open(path) as image:
        return image.size


def _read_image_size(path: str, where: str) -> list[int]:
    if "://" in path or path.startswith("data:"):
        raise DataError(f"{where}: meta.image_size is needed for a remote image ({path})")
    try:
        return list(image_size(path))
    except FileNotFoundError:
        raise DataError(f"{where}: image not found ({path})") from None
    except (UnidentifiedImageError, OSError) as exc:
        raise DataError(f"{where}: unreadable image ({path}: {exc})") from None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_box(box: Any, size: list[int], where: str, field: str = "target") -> list[float]:
    """A valid box in pixels of an image of ``size`` (1 px of slack at the edges), else DataError."""
    if not (isinstance(box, list) and len(box) == 4 and all(_is_number(v) for v in box)):
        raise DataError(f"{where}: '{field}' must be a box [x1, y1, x2, y2] in pixels, got {box!r}")
    x1, y1, x2, y2 = box
    if not (x1 < x2 and y1 < y2):
        raise DataError(f"{where}: '{field}' box {box} needs x1 < x2 and y1 < y2")
    width, height = size
    if x1 < -1 or y1 < -1 or x2 > width + 1 or y2 > height + 1:
        raise DataError(f"{where}: '{field}' box {box} lies outside the {width}×{height} image")
    return box


def _check_size(size: Any, where: str) -> list[int]:
    if not (
        isinstance(size, list)
        and len(size) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in size)
    ):
        raise DataError(f"{where}: meta.image_size must be [W, H] in pixels, got {size!r}")
    return size


def image_size_of(sample: Sample, where: str, kind: str) -> list[int]:
    """The sample's ``meta["image_size"]`` ``[W, H]`` checked, or read from its first image's
    header when absent, and stored there; a DataError naming ``where`` when the ``kind`` sample
    has no image or a bad size."""
    images = sample.media("image")
    if not images:
        raise DataError(f"{where}: a {kind} sample needs an image")
    if "image_size" in sample.meta:
        size = _check_size(sample.meta["image_size"], where)
    else:
        size = _read_image_size(images[0], where)
    sample.meta["image_size"] = size
    return size


def box_frame(sample: Sample) -> str:
    """The sample's ``meta["box_frame"]``; ValueError when the model family has not annotated
    it (a setup error, not the model's)."""
    frame = sample.meta.get("box_frame")
    if frame is None:
        raise ValueError(
            f"sample '{sample.id}' has no meta['box_frame']; annotate it with the model family "
            "first (ModelFamily.annotate)"
        )
    return frame


# An instruction that names a box or region and ends in ": <expression>".
_INSTRUCTION = re.compile(r"(?is)^.*\b(?:bounding box|box|region|locate)\b[^:]*:\s*(.+)$")


@task("grounding")
class GroundingTask(Task):
    """Referring-expression comprehension: the box of the object the expression names.

    Template fields: ``{question}`` (the expression), ``{box_instruction}`` (the model family's
    box format and frame), ``{format_instruction}``. Reward: format + iou (weights 1, 1; the iou
    verifier reads ``meta["box_frame"]``, continuous IoU in [0, 1] as VLM-R1). Metrics:
    ``acc@0.5`` (primary) and ``iou``.
    """

    template = "Locate {question} in the image. {box_instruction}\n{format_instruction}"
    primary_metric = "acc@0.5"
    formats = ("mmrft", "refcoco")
    example_data: ClassVar[ExampleData] = {
        "mmrft": ("shapes_grounding/train.jsonl", "shapes_grounding/test.jsonl", {})
    }

    def __init__(
        self,
        *,
        think: ThinkMode = "required",
        template: str | None = None,
        image_root: str | None = None,
    ) -> None:
        """
        Args:
            think: whether the answer format asks for a ``<think>`` block first.
            template: replaces the prompt template (same fields).
            image_root: folder the ``refcoco`` format's ``image`` paths are relative to
                (COCO ``train2014/``); default: the annotation file's folder. The ``mmrft``
                format always resolves media against its JSONL file.
        """
        super().__init__(think=think, template=template)
        self.image_root = image_root

    # -- data ---------------------------------------------------------------------------------
    def read_format(
        self, path: Path, fmt: str, on_error: OnError, check: Callable[[Sample], None] | None
    ) -> tuple[list[Sample], ReadStats]:
        """Read ``path`` in this task's other formats (module docstring)."""
        if fmt == "refcoco":
            root = Path(self.image_root).expanduser() if self.image_root else path.parent

            def parse(record: Any, base: Path, where: str) -> Sample:
                return self._parse_refcoco(record, root, where)

            return read_records(path, parse, on_error=on_error, check=check)
        return super().read_format(path, fmt, on_error, check)

    def parse_record(self, record: Any, base: Path, where: str) -> Sample:
        sample = super().parse_record(record, base, where)
        size = image_size_of(sample, where, "grounding")
        sample.target = _check_box(sample.target, size, where)
        others = sample.meta.get("other_boxes")
        if others is not None:
            if not isinstance(others, list):
                raise DataError(
                    f"{where}: meta.other_boxes must be a list of boxes, got {others!r}"
                )
            for box in others:
                _check_box(box, size, where, field="meta.other_boxes")
        return sample

    def _parse_refcoco(self, record: Any, root: Path, where: str) -> Sample:
        record = require_fields(record, ("image", "normal_caption", "solution"), where)
        image, caption = record["image"], record["normal_caption"]
        if not isinstance(image, str) or not image:
            raise DataError(f"{where}: 'image' must be a path string, got {image!r}")
        if not isinstance(caption, str) or not caption.strip():
            raise DataError(f"{where}: 'normal_caption' must be a non-empty string")
        messages = user_turn("image", image, caption.strip(), root, where)
        image_path = messages[0]["content"][0]["image"]
        size = _read_image_size(image_path, where)
        target = _check_box(record["solution"], size, where, field="solution")
        sample_id = str(record["id"]) if "id" in record else default_id(where)
        return Sample(id=sample_id, messages=messages, target=target, meta={"image_size": size})

    # -- rewards and metrics --------------------------------------------------------------------
    def question(self, sample: Sample) -> str:
        """The referring expression. A question that is a whole instruction ending in the
        expression (VLM-R1's conversations: "Please provide the bounding box coordinate of the
        region this sentence describes: the man on the left.") gives the part after its
        colon, so the template does not wrap an instruction in another ("Locate Please
        provide ...")."""
        text = sample.text().strip()
        found = _INSTRUCTION.match(text)
        return found.group(1).strip().rstrip(".") if found else text

    def default_verifiers(self) -> list[dict[str, Any]]:
        return self.format_and("iou")

    def reference_answer(self, sample: Sample) -> str:
        """The target box written in the sample's ``meta["box_frame"]`` (rounded as the
        family writes it), e.g. ``{"bbox_2d": [55, 58, 88, 91]}``."""
        return format_box(sample.target, box_frame(sample), sample.meta)

    def evaluate_one(self, completion: str, sample: Sample) -> EvalRecord:
        """Strict parse: exactly one answer block holding exactly one box, read in
        ``meta["box_frame"]``, converted to original pixels and clipped to the image (a box
        reaching further past an edge than :data:`mmrft.rewards.boxes.EDGE_TOLERANCE`, 5 % of the image
        side, or wholly outside it, scores 0 with ``box outside image``).

        Values: ``iou`` in [0, 1] and ``acc@0.5`` = 1 if IoU ≥ 0.5 else 0; with
        ``meta["other_boxes"]``, ``wrong_object`` = 1 if the box misses the target but has
        IoU ≥ 0.5 with one of them, else 0. Unparsable answers score 0 with the parser's reason
        (``no answer tag``, ``no box``, ``several boxes``, ``degenerate box``, ``box outside
        image``); ``parsed`` is the predicted box in original pixels.
        Raises ``ValueError`` for a sample without ``box_frame`` (a setup error, not the model's).
        """
        frame = box_frame(sample)
        others = sample.meta.get("other_boxes")

        def failed(reason: str | None) -> EvalRecord:
            values = {"acc@0.5": 0.0, "iou": 0.0}
            if others is not None:
                values["wrong_object"] = 0.0
            return EvalRecord(sample.id, completion, None, 0.0, reason, values)

        answer, reason = extract_answer(completion)
        if answer is None:
            return failed(reason)
        box, reason = parse_one_box(answer)
        if box is None:
            return failed(reason)
        pixels = to_pixels(box, frame, sample.meta)
        if is_degenerate(pixels):
            return failed("degenerate box")
        width, height = float(sample.meta["image_size"][0]), float(sample.meta["image_size"][1])
        if outside_image(pixels, width, height):
            return failed("box outside image")
        clipped = clip_box(pixels, width, height)
        iou = box_iou(clipped, sample.target)
        correct = float(iou >= ACC_IOU)
        values = {"acc@0.5": correct, "iou": iou}
        if others is not None:
            values["wrong_object"] = float(
                not correct and any(box_iou(clipped, box) >= ACC_IOU for box in others)
            )
        parsed = [round(v, 2) for v in pixels]
        return EvalRecord(sample.id, completion, parsed, correct, None, values)
