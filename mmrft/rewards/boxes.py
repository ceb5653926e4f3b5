"""Box parsing, geometry and coordinate frames.

Canonical frame: absolute pixels ``[x1, y1, x2, y2]`` of the *original* image, x right, y
down, with ``meta["image_size"] = [W, H]``. A model family writes boxes in its own frame
(``meta["box_frame"]``, see :mod:`mmrft.models.family`):

=================  ==========================================  ==========================
frame              meaning                                     pixels = frame value ×
=================  ==========================================  ==========================
``pixels``         original-image pixels (canonical)           1
``norm1000``       0–1000 relative to the image (Qwen2-VL)     W / 1000, H / 1000
``norm1``          0–1 relative to the image                   W, H
``input_pixels``   pixels of the resized model input           W / w, H / h
                   ``meta["input_size"] = [w, h]``
                   (Qwen2.5-VL, Qwen3-VL)
=================  ==========================================  ==========================

:func:`to_pixels` and :func:`from_pixels` are exact inverses (up to float rounding).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

FRAMES = ("norm1000", "input_pixels", "norm1", "pixels")

_NUM = r"[\"']?([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)[\"']?"
_PAIR = rf"\s*{_NUM}\s*,\s*{_NUM}\s*"
_FOUR = rf"{_PAIR},{_PAIR}"
# One alternation, scanned left to right without overlaps:
#   [x1, y1, x2, y2]   (also the value of "bbox_2d" / "bbox" / "Position" / any key)
#   [[x1, y1], [x2, y2]]
#   (x1, y1), (x2, y2)   (Qwen2-VL's <|box_start|>(x1,y1),(x2,y2)<|box_end|>)
#   (x1, y1, x2, y2)
_BOX = re.compile(
    rf"\[\s*\[{_PAIR}\]\s*,\s*\[{_PAIR}\]\s*\]"
    rf"|\[{_FOUR}\]"
    rf"|\({_PAIR}\)\s*,\s*\({_PAIR}\)"
    rf"|\({_FOUR}\)"
)


def parse_boxes(text: str) -> list[list[float]]:
    """Every box written in ``text``, in order, as ``[x1, y1, x2, y2]`` floats (frame unchanged).

    A box is a bracketed list of exactly four numbers (ints or floats, optionally quoted) —
    whatever key holds it (``bbox_2d``, ``bbox``, ``box``, ``Position``, any case) and however
    it is wrapped (a JSON object, a list of objects, Python-style single quotes, a ```json
    fence, prose) — or ``[[x1, y1], [x2, y2]]``, ``(x1, y1), (x2, y2)``, ``(x1, y1, x2, y2)``.
    Lists of other lengths (points, five numbers) are not boxes. Values are not checked here.

    >>> parse_boxes('```json\\n[{"Position": [10, 20.5, 30, 40]}, {"bbox_2d": [1,2,3,4]}]\\n```')
    [[10.0, 20.5, 30.0, 40.0], [1.0, 2.0, 3.0, 4.0]]
    >>> parse_boxes("the cup at (100,200),(300,400)")
    [[100.0, 200.0, 300.0, 400.0]]
    """
    boxes = []
    for m in _BOX.finditer(text):
        numbers = [float(g) for g in m.groups() if g is not None]
        boxes.append(numbers)
    return boxes


def parse_one_box(text: str) -> tuple[list[float] | None, str | None]:
    """The single box in ``text`` (see :func:`parse_boxes`), else ``(None, "no box")`` or
    ``(None, "several boxes")``."""
    boxes = parse_boxes(text)
    if not boxes:
        return None, "no box"
    if len(boxes) > 1:
        return None, "several boxes"
    return boxes[0], None


def _size(meta: Mapping[str, Any], key: str) -> tuple[float, float]:
    size = meta.get(key)
    if (
        not isinstance(size, (list, tuple))
        or len(size) != 2
        or not all(isinstance(v, (int, float)) and v > 0 for v in size)
    ):
        raise ValueError(f"meta has no valid '{key}' [w, h]")
    return float(size[0]), float(size[1])


def _scale(frame: str, meta: Mapping[str, Any]) -> tuple[float, float]:
    """(sx, sy) such that pixels = frame value × s."""
    if frame == "pixels":
        return 1.0, 1.0
    if frame not in FRAMES:
        raise ValueError(f"unknown box frame '{frame}'; valid: {', '.join(FRAMES)}")
    width, height = _size(meta, "image_size")
    if frame == "norm1000":
        return width / 1000.0, height / 1000.0
    if frame == "norm1":
        return width, height
    in_w, in_h = _size(meta, "input_size")
    return width / in_w, height / in_h


def to_pixels(box: Sequence[float], frame: str, meta: Mapping[str, Any]) -> list[float]:
    """Convert ``box`` from ``frame`` to original-image pixels (table in the module docstring).

    Raises ``ValueError`` for an unknown frame or when ``meta`` lacks the size it needs.

    >>> to_pixels([500, 0, 1000, 500], "norm1000", {"image_size": [640, 480]})
    [320.0, 0.0, 640.0, 240.0]
    """
    sx, sy = _scale(frame, meta)
    x1, y1, x2, y2 = box
    return [x1 * sx, y1 * sy, x2 * sx, y2 * sy]


def from_pixels(box: Sequence[float], frame: str, meta: Mapping[str, Any]) -> list[float]:
    """The inverse of :func:`to_pixels`: original-image pixels to ``frame``."""
    sx, sy = _scale(frame, meta)
    x1, y1, x2, y2 = box
    return [x1 / sx, y1 / sy, x2 / sx, y2 / sy]


def format_box(box_pixels: Sequence[float], frame: str, meta: Mapping[str, Any]) -> str:
    """The answer text a model of ``frame`` should write for ``box_pixels``.

    ``{"bbox_2d": [x1, y1, x2, y2]}`` with integers (rounded) in the frame, or 3 decimals for
    ``norm1``.

    >>> format_box([320, 0, 640, 240], "norm1", {"image_size": [640, 480]})
    '{"bbox_2d": [0.500, 0.000, 1.000, 0.500]}'
    """
    values = from_pixels(box_pixels, frame, meta)
    if frame == "norm1":
        text = ", ".join(f"{v:.3f}" for v in values)
    else:
        text = ", ".join(str(round(v)) for v in values)
    return '{"bbox_2d": [' + text + "]}"


def box_area(box: Sequence[float]) -> float:
    """(x2 − x1) · (y2 − y1), 0 for an empty or inverted box."""
    x1, y1, x2, y2 = box
    return max(0.0, x2 - x1) * max(0.0, y2 - y1)


def box_iou(a: Sequence[float], b: Sequence[float]) -> float:
    """Intersection over union, |a ∩ b| / |a ∪ b| in [0, 1]; 0 when the union is empty.

    >>> box_iou([0, 0, 10, 10], [5, 0, 15, 10])
    0.3333333333333333
    """
    inter = box_area([max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])])
    union = box_area(a) + box_area(b) - inter
    return inter / union if union > 0 else 0.0


def clip_box(box: Sequence[float], width: float, height: float) -> list[float]:
    """``box`` with x clamped to [0, width] and y to [0, height]."""
    x1, y1, x2, y2 = box
    return [
        min(max(x1, 0.0), width),
        min(max(y1, 0.0), height),
        min(max(x2, 0.0), width),
        min(max(y2, 0.0), height),
    ]


EDGE_TOLERANCE = 0.05
"""How far past the image's edges a *predicted* box may reach and still be scored, as a share
of the image side: x in [−0.05 W, 1.05 W] and y in [−0.05 H, 1.05 H] of the original image.
Every frame is a linear scale of the image, so the tolerance is the same in each: 50 units
of the norm1000 frame (Qwen2-VL, Qwen3-VL: −50 … 1050), 0.05 of norm1, 5 % of the input's
pixels (Qwen2.5-VL: 5.6 px of a 112-px input) — wide enough for rounding, the ``x2 = W`` vs
``W − 1`` edge conventions and a box drawn a little generously round an object at the
border, which are then clipped to the image (:func:`clip_box`) and scored. A box reaching
further (``[9, 9, 9111, 91]`` on a 112-px image) locates nothing in the image: verifiers and
evaluations score it the minimum with the reason ``box outside image`` rather than clip it to
a whole-width box and score that (:func:`outside_image`)."""


def outside_image(
    box: Sequence[float], width: float, height: float, tolerance: float = EDGE_TOLERANCE
) -> bool:
    """True when ``box`` (original-image pixels) reaches more than ``tolerance`` of the image
    side past any edge (:data:`EDGE_TOLERANCE`), or lies wholly outside the image.

    >>> outside_image([9, 9, 9111, 91], 112, 112), outside_image([-3, 0, 115, 112], 112, 112)
    (True, False)
    >>> outside_image([112, 0, 116, 50], 112, 112)  # within the tolerance, but no area inside
    True
    """
    x1, y1, x2, y2 = box
    mx, my = tolerance * width, tolerance * height
    if x1 < -mx or y1 < -my or x2 > width + mx or y2 > height + my:
        return True
    return box_area(clip_box(box, width, height)) <= 0


def is_degenerate(box: Sequence[float]) -> bool:
    """True unless ``box`` is four finite numbers with x1 < x2 and y1 < y2."""
    if len(box) != 4 or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in box):
        return True
    return not (box[0] < box[2] and box[1] < box[3])
