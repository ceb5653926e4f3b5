"""Model-family adapter for GLM-4.1V (``glm4v``; GLM-4.1V-9B-Base/-Thinking).

GLM-4.1V is a Qwen2-VL-style model: a ViT with patch 14 and 2 × 2 token merging, images and
videos flattened into patch rows with ``image_grid_thw`` / ``video_grid_thw``, and a decoder
with 3-D mRoPE computed by ``get_rope_index`` from ``mm_token_type_ids``. So the adapter is
:class:`~mmrft.models.qwen_vl.QwenVLFamily` (qwen-vl-utils resizing to multiples of 28, the
image cache, video budgets, ``split_rows`` / ``collate_rows``, ``rope_positions``) with GLM's
differences:

* placeholders: ``<|begin_of_image|><|image|><|end_of_image|>`` per image; a video part is
  ``<|begin_of_video|>…<|end_of_video|>`` holding one ``<|begin_of_image|>`` +
  ``<|image|>`` × tokens + ``<|end_of_image|>{seconds}`` block per temporal patch (2 frames),
  so video frames use the *image* token and only ``mm_token_type_ids`` (2 inside a video
  block, computed by the processor) tells them apart; :meth:`GLM4V.token_types` derives the
  same types from the token ids for callers that pass none;
* the processor needs frame timestamps, so videos carry their sampling metadata;
* boxes are ``norm1000``: "GLM-V outputs coordinates where x and y are relative coordinates
  normalized from pixel coordinates … using image width W and height H (range 0-1000),
  x = round(x_pixel / W · 1000)" (zai-org GLM-V grounding guide); the model writes them as
  ``<|begin_of_box|>[x1, y1, x2, y2]<|end_of_box|>``, which :func:`mmrft.rewards.boxes.parse_boxes`
  reads like any ``[x1, y1, x2, y2]``; the prompt asks for Qwen2-VL's JSON
  ``{"bbox_2d": [x1, y1, x2, y2]}`` in that frame (the warm-start targets' layout).

The model card's pixel settings (GLM-V README / vLLM example): images between 112 × 112 and
``28 · 28 · 15000`` pixels, videos at 1–2 fps.
"""

from __future__ import annotations

from typing import Any, ClassVar

from mmrft.data.video import TEMPORAL_PATCH
from mmrft.models.family import BoxFrame, model_family
from mmrft.models.qwen_vl import Qwen2VL, QwenVLFamily

GLM_MEDIA_TOKENS = (
    "<|begin_of_image|>",
    "<|end_of_image|>",
    "<|begin_of_video|>",
    "<|end_of_video|>",
    "<|image|>",
    "<|video|>",
)


@model_family("glm4v")
class GLM4V(QwenVLFamily):
    """GLM-4.1V: boxes 0–1000 relative to the image; patch 14, merge 2; timestamped video
    frames (see the module docstring). :meth:`vision_tower` is ``model.visual``."""

    model_types = ("glm4v",)
    box_frame: ClassVar[BoxFrame] = "norm1000"
    box_instruction = Qwen2VL.box_instruction
    patch_size: ClassVar[int] = 14
    video_metadata: ClassVar[bool] = True
    media_tokens: ClassVar[dict[str, str]] = {
        "image_grid_thw": "<|image|>",
        "video_grid_thw": "<|image|>",
    }

    def runs_per_item(self, grid_key: str, grid_row: Any) -> int:
        """One run of image tokens per temporal patch of a video (timestamps between)."""
        return int(grid_row[0]) if grid_key == "video_grid_thw" else 1

    def token_types(self, input_ids: Any, config: Any) -> Any:
        """As ``Glm4vProcessor.create_mm_token_type_ids``: an image token inside a
        ``<|begin_of_video|>`` … ``<|end_of_video|>`` block is a video token (2), else 1."""
        import torch

        image = input_ids == config.image_token_id
        starts = (input_ids == config.video_start_token_id).long().cumsum(-1)
        ends = (input_ids == config.video_end_token_id).long().cumsum(-1)
        in_video = starts > ends
        types = torch.zeros_like(input_ids, dtype=torch.int)
        types[image & in_video] = 2
        types[image & ~in_video] = 1
        return types

    def engine_processor_kwargs(self) -> dict[str, Any]:
        """The Qwen-VL bounds (:meth:`QwenVLFamily.engine_processor_kwargs`) in
        ``Glm4vImageProcessor``'s terms: ``size`` ``{"shortest_edge", "longest_edge"}``
        (it takes no ``min_pixels`` / ``max_pixels``), each times the temporal patch (2),
        since its ``smart_resize`` bounds ``t·h·w`` and an image is 2 frames: with the
        budget itself a 112 × 112 image came back 56 × 56 (4 image tokens, the trainer's
        16)."""
        bounds = super().engine_processor_kwargs()
        return {
            "size": {
                "shortest_edge": TEMPORAL_PATCH * bounds["min_pixels"],
                "longest_edge": TEMPORAL_PATCH * bounds["max_pixels"],
            }
        }

    def suppress_token_ids(self, processor: Any) -> list[int]:
        """Ids of the image/video placeholder and boundary tokens."""
        tokenizer = getattr(processor, "tokenizer", processor)
        ids = tokenizer.convert_tokens_to_ids(list(GLM_MEDIA_TOKENS))
        return [i for i in ids if i is not None and i != tokenizer.unk_token_id]
