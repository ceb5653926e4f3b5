"""Model-family adapter for InternVL 3.x (``internvl``: the transformers-native
``InternVLForConditionalGeneration`` of the ``OpenGVLab/InternVL3-*-hf`` /
``InternVL3_5-*-HF`` releases).

Inputs. The processor's chat template writes ``<IMG_CONTEXT>`` per image part and ``<video>``
per video part; ``InternVLProcessor`` tiles each image (dynamic resolution: the aspect ratio
closest to the image among grids of ``min_patches`` … ``max_patches`` tiles, plus a thumbnail
tile when there is more than one) and expands the placeholder to ``<img>`` + ``<IMG_CONTEXT>`` ×
``image_seq_length`` per tile + ``</img>``; a video becomes one ``FrameN: <img>…</img>`` tile per
frame. All tiles of a batch, images and frames in prompt order, are one ``pixel_values`` tensor
``[tiles, 3, S, S]``; a run of ``<IMG_CONTEXT>`` tokens of length ``n · image_seq_length`` owns
the next ``n`` tiles, which is how :meth:`InternVL.split_rows` assigns tiles to prompts.
Positions are 1-D (the language model is Qwen2.5 for InternVL3, Qwen3 for InternVL3.5), so
:meth:`~mmrft.models.family.ModelFamily.rope_positions` keeps its default.

Budgets. An image gets at most ``max(1, max_pixels // S²)`` tiles (the model card's default
``max_num = 12`` tiles of 448² is ``model.max_pixels = 2408448``); videos follow
``model.video`` (:class:`~mmrft.data.video.VideoBudget`: frames and fps; each frame is one tile, the
model card samples 8–32 frames).

Boxes are ``norm1000``: InternVL's grounding format is
``<ref>expression</ref><box>[[x1, y1, x2, y2]]</box>`` with coordinates normalised to
``[0, 1000)`` relative to the image (InternVL chat-data documentation, "Grounding");
:func:`mmrft.rewards.boxes.parse_boxes` reads the inner ``[x1, y1, x2, y2]``. The prompt asks for
Qwen2-VL's JSON ``{"bbox_2d": [x1, y1, x2, y2]}`` in that frame (the warm-start targets'
layout).
"""

from __future__ import annotations

from typing import Any, ClassVar

from mmrft.data.video import VideoBudget
from mmrft.models import qwen_vl
from mmrft.models.family import (
    Conversation,
    MediaBudget,
    model_family,
    submodule,
)

INTERNVL_MEDIA_TOKENS = ("<img>", "</img>", "<IMG_CONTEXT>", "<video>")


@model_family("internvl")
class InternVL(qwen_vl.RelativeBoxFamily):
    """InternVL 3.x (images as dynamic tiles, videos as one tile per frame; 1-D RoPE).

    :meth:`vision_tower` is InternViT (``model.vision_tower``); the MLP projector stays
    trainable, as LLaVA-style recipes do.
    """

    model_types = ("internvl",)
    processor_class = "InternVLProcessor"
    token_keys: ClassVar[tuple[str, ...]] = ()
    media_keys: ClassVar[dict[str, str]] = {"pixel_values": "tiles"}
    media_tokens: ClassVar[dict[str, str]] = {"tiles": "<IMG_CONTEXT>"}

    def __init__(self, media: MediaBudget | None = None, video: VideoBudget | None = None) -> None:
        super().__init__(media)
        self.video = video or VideoBudget()

    def max_tiles(self, processor: Any) -> int:
        """Tiles per image: ``max(1, max_pixels // tile²)`` (see the module docstring)."""
        side = processor.image_processor.size["height"]
        return max(1, self.media.max_pixels // (side * side))

    # -- inputs ------------------------------------------------------------------------------
    def process(self, processor: Any, texts: list[str], conversations: list[Conversation]) -> Any:
        """Tokenise conversations with their images and videos: ``input_ids`` /
        ``attention_mask`` ``[B, L]`` left-padded and, with media, ``pixel_values``
        ``[tiles, 3, S, S]`` (see the module docstring)."""
        images, videos = [], []
        for conv in conversations:
            for part in qwen_vl.media_parts(conv, "image"):
                images.append(qwen_vl.decoded_image(part.get("image"), self.name))
            for part in qwen_vl.media_parts(conv, "video"):
                videos.append(qwen_vl.load_video(part, self.video, 28)[0])
        kwargs: dict[str, Any] = {}
        if images:
            kwargs.update(images=images, max_patches=self.max_tiles(processor))
        if videos:
            kwargs["videos"] = videos
        return processor(
            text=texts, padding=True, padding_side="left", return_tensors="pt", **kwargs
        )

    def suppress_token_ids(self, processor: Any) -> list[int]:
        """Ids of ``<img>``, ``</img>``, ``<IMG_CONTEXT>`` and ``<video>``."""
        tokenizer = getattr(processor, "tokenizer", processor)
        ids = tokenizer.convert_tokens_to_ids(list(INTERNVL_MEDIA_TOKENS))
        return [i for i in ids if i is not None and i != tokenizer.unk_token_id]

    # -- re-collation ------------------------------------------------------------------------
    def split_rows(self, batch: Any, processor: Any) -> list[dict[str, Any]]:
        """One dict per conversation: ``input_ids`` without padding and its ``pixel_values``
        tiles (each ``<IMG_CONTEXT>`` run of ``n · image_seq_length`` tokens owns ``n``)."""
        from mmrft.models.qwen_audio import run_lengths

        context = processor.tokenizer.convert_tokens_to_ids("<IMG_CONTEXT>")
        per_tile = int(processor.image_seq_length)
        rows: list[dict[str, Any]] = [
            {"input_ids": ids[mask.bool()].clone()}
            for ids, mask in zip(batch["input_ids"], batch["attention_mask"])
        ]
        values = batch.get("pixel_values")
        position = 0
        for row in rows:
            runs = run_lengths(row["input_ids"], context)
            if any(n % per_tile for n in runs):
                raise RuntimeError(f"image token runs {runs} are not whole tiles of {per_tile}")
            tiles = sum(runs) // per_tile
            if values is not None:
                row["pixel_values"] = values[position : position + tiles].clone()
            position += tiles
        if position != (0 if values is None else len(values)):
            raise RuntimeError("could not split pixel_values: tile counts do not add up")
        return rows

    def collate_rows(self, rows: list[dict[str, Any]], pad_token_id: int) -> dict[str, Any]:
        """Left-pad ``input_ids`` (:meth:`ModelFamily.collate_rows`) and concatenate the rows'
        tiles."""
        import torch

        out = super().collate_rows([{"input_ids": r["input_ids"]} for r in rows], pad_token_id)
        tiles = [r["pixel_values"] for r in rows if len(r.get("pixel_values", ()))]
        if tiles:
            out["pixel_values"] = torch.cat(tiles)
        return out

    # -- training helpers --------------------------------------------------------------------
    def vision_tower(self, model: Any) -> Any:
        """InternViT (``model.vision_tower``)."""
        return submodule(model, "vision_tower")
