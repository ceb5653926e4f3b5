"""Image tools: ``crop`` (alias ``image_zoom_in``) and ``rotate``.

Boxes arrive in the model family's own frame (``ToolContext.box_frame``) and are mapped to
pixels of the ORIGINAL full-resolution image (:meth:`~mmrft.rollout.tool.ToolContext.to_image_pixels`)
before anything is cut, so a zoom shows the original detail rather than the downscaled model
input. Crop rules (DeepEyes' "refused below about 30 px or past aspect 100"):

* a box reaching more than 5 % of the image side past an edge, or wholly outside the image, is
  refused (``box_outside_image``, the verifiers' rule :func:`mmrft.rewards.boxes.outside_image`); one
  within that tolerance is clamped to the image;
* ``x1 < x2`` and ``y1 < y2`` in the frame, else ``bad_argument``;
* after mapping and clamping, a side under :data:`MIN_SIDE` = 28 original pixels is refused
  (``box_too_small``), as is a long/short side ratio over :data:`MAX_ASPECT` = 100 or over
  ``max_pixels / factor²`` (``box_aspect_ratio``: at a small pixel budget such a crop cannot
  keep one patch group across its short side; 4 at 3136 pixels and a 28-px factor);
* the crop is cut on whole pixels (``floor(x1), floor(y1), ceil(x2), ceil(y2)``) and downscaled
  to at most ``ToolContext.max_pixels`` of area, aspect kept (:func:`mmrft.rollout.tool.fit_pixels`).
"""

from __future__ import annotations

import math
from typing import Any

from mmrft.rewards.boxes import clip_box, from_pixels, outside_image
from mmrft.rollout.tool import Observation, ToolContext, ToolFailure, fit_pixels, tool

MIN_SIDE = 28
"""Shortest side of a crop (pixels of the original image)."""

MAX_ASPECT = 100.0
"""Largest long-side / short-side ratio of a crop."""

_IMAGE_INDEX = {
    "type": "integer",
    "minimum": 0,
    "description": "which image: 0 is the original image (default), then images returned "
    "by earlier tool calls in order",
}


def crop_example(context: ToolContext) -> dict[str, Any] | None:
    """One valid ``crop`` of image 0 (a smoke run's scripted call): its centre half, the whole
    image when that would be under ``2 × MIN_SIDE`` pixels a side, in the context's box frame
    (integers; 3 decimals for ``norm1``); ``None`` without an image."""
    if not context.images:
        return None
    width, height = context.images[0].size
    if min(width, height) >= 4 * MIN_SIDE:
        box = [width / 4, height / 4, 3 * width / 4, 3 * height / 4]
    else:
        box = [0.0, 0.0, float(width), float(height)]
    meta: dict[str, Any] = {"image_size": [width, height]}
    if context.input_sizes and context.input_sizes[0] is not None:
        meta["input_size"] = list(context.input_sizes[0])
    framed = from_pixels(box, context.box_frame, meta)
    digits = 3 if context.box_frame == "norm1" else 0
    return {"bbox_2d": [round(v, digits) if digits else round(v) for v in framed]}


def rotate_example(context: ToolContext) -> dict[str, Any] | None:
    """One valid ``rotate`` (90 degrees of image 0); ``None`` without an image."""
    return {"angle": 90} if context.images else None


@tool(
    "crop",
    aliases=("image_zoom_in", "image_zoom_in_tool"),
    timeout_s=10.0,
    example=crop_example,
    parameters={
        "type": "object",
        "properties": {
            "bbox_2d": {
                "type": "array",
                "items": {"type": "number"},
                "minItems": 4,
                "maxItems": 4,
                "description": "the region [x1, y1, x2, y2] in the same coordinates as the "
                "boxes you output",
            },
            "image_index": _IMAGE_INDEX,
            "label": {
                "type": "string",
                "maxLength": 200,
                "description": "what the region shows (optional; DeepEyes' prompts ask for it)",
            },
        },
        "required": ["bbox_2d"],
    },
)
def crop(
    context: ToolContext, *, bbox_2d: list[float], image_index: int = 0, label: str = ""
) -> Observation:
    """Zoom in on a region of an image: returns the region [x1, y1, x2, y2] at full
    resolution."""
    image = context.image(image_index)
    width, height = image.size
    if not (bbox_2d[0] < bbox_2d[2] and bbox_2d[1] < bbox_2d[3]):
        raise ToolFailure("bad_argument", "bbox_2d must satisfy x1 < x2 and y1 < y2")
    box = context.to_image_pixels(bbox_2d, image_index)
    if not all(math.isfinite(v) for v in box) or outside_image(box, width, height):
        raise ToolFailure(
            "box_outside_image",
            f"bbox_2d {_fmt(bbox_2d)} lies outside image {image_index}; give a box inside it",
        )
    x1, y1, x2, y2 = clip_box(box, width, height)
    left, top = math.floor(x1), math.floor(y1)
    right, bottom = min(math.ceil(x2), width), min(math.ceil(y2), height)
    w, h = right - left, bottom - top
    if min(w, h) < MIN_SIDE:
        raise ToolFailure(
            "box_too_small",
            f"bbox_2d {_fmt(bbox_2d)} is {w}×{h} pixels of the image; each side needs at "
            f"least {MIN_SIDE} pixels, give a larger box",
        )
    # a crop past max_pixels / factor² (4 at a 3136-pixel budget) cannot keep a side of one
    # patch group within the budget: Qwen's smart_resize would floor that side to 0 px
    longest = min(MAX_ASPECT, context.max_pixels / context.factor**2)
    if max(w, h) / min(w, h) > longest:
        raise ToolFailure(
            "box_aspect_ratio",
            f"bbox_2d {_fmt(bbox_2d)} is {w}×{h} pixels, longer than {longest:g} times "
            "its width; give a less elongated box",
        )
    region = fit_pixels(image.crop((left, top, right, bottom)), context.max_pixels)
    text = f"Zoomed-in region {_fmt(bbox_2d)} of image {image_index}."
    info = {"box_px": [left, top, right, bottom], "image_index": image_index}
    return Observation(ok=True, text=text, images=[region], info=info)


@tool(
    "rotate",
    timeout_s=10.0,
    example=rotate_example,
    parameters={
        "type": "object",
        "properties": {
            "angle": {
                "type": "integer",
                "enum": [90, 180, 270],
                "description": "degrees counter-clockwise",
            },
            "image_index": _IMAGE_INDEX,
        },
        "required": ["angle"],
    },
)
def rotate(context: ToolContext, *, angle: int, image_index: int = 0) -> Observation:
    """Rotate an image by 90, 180 or 270 degrees counter-clockwise (to read sideways or
    upside-down content)."""
    from PIL import Image

    image = context.image(image_index)
    turn = {
        90: Image.Transpose.ROTATE_90,
        180: Image.Transpose.ROTATE_180,
        270: Image.Transpose.ROTATE_270,
    }[angle]
    rotated = fit_pixels(image.transpose(turn), context.max_pixels)
    text = f"Image {image_index} rotated by {angle} degrees counter-clockwise."
    return Observation(ok=True, text=text, images=[rotated])


def _fmt(box: list[float]) -> str:
    return "[" + ", ".join(f"{v:g}" for v in box) + "]"
