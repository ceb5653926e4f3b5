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
:meth:`~mmrft.family.ModelFamily.rope_positions` keeps its default.

Budgets. An image gets at most ``max(1, max_pixels // S²)`` tiles (the model card's default
``max_num = 12`` tiles of 448² is ``model.max_pixels = 2408448``); videos follow
``model.video`` (:class:`~mmrft.video.VideoBudget`: frames and fps; each frame is one tile, the
model card samples 8–32 frames).

Boxes are ``norm1000``: InternVL's grounding format is
``<ref>expression</ref><box>[[x1, y1, x2, y2]]</box>`` with coordinates normalised to
``[0, 1000)`` relative to the image (InternVL chat-data documentation, "Grounding");
:func:`mmrft.boxes.parse_boxes` reads the inner ``[x1, y1, x2, y2]``. The prompt asks for
Qwen2-VL's JSON ``{"bbox_2d": [x1, y1, x2, y2]}`` in that frame (the warm-start targets'
layout).
"""

from __future__ import annotations

from typing import Any, ClassVar

from mmrft.data import DataError, Sample, local_media_path, media_file_key
from mmrft.family import BoxFrame, MediaBudget, ModelFamily, model_family
from mmrft.models import qwen_vl
from mmrft.video import VideoBudget

INTERNVL_MEDIA_TOKENS = ("<img>", "</img>", "<IMG_CONTEXT>", "<video>")


@model_family("internvl")
class InternVL(ModelFamily):
    """InternVL 3.x (images as dynamic tiles, videos as one tile per frame; 1-D RoPE).

    :meth:`vision_tower` is InternViT (``model.vision_tower``); the MLP projector stays
    trainable, as LLaVA-style recipes do.
    """

    model_types = ("internvl",)
    box_frame: ClassVar[BoxFrame] = "norm1000"
    box_instruction = qwen_vl.Qwen2VL.box_instruction
    token_keys: ClassVar[tuple[str, ...]] = ()
    media_keys: ClassVar[dict[str, str]] = {"pixel_values": "tiles"}
    media_tokens: ClassVar[dict[str, str]] = {"tiles": "<IMG_CONTEXT>"}

    def __init__(self, media: MediaBudget | None = None, video: VideoBudget | None = None) -> None:
        super().__init__(media)
        self.video = video or VideoBudget()

    def load_model(
        self, path: str, dtype: str = "float32", attn_implementation: str | None = None
    ) -> Any:
        return self.load_checkpoint(path, dtype, attn_implementation)

    def load_processor(self, path: str) -> Any:
        """``AutoProcessor`` (an ``InternVLProcessor``), left padding."""
        from transformers import AutoProcessor

        from mmrft.typecheck import ConfigError

        processor = AutoProcessor.from_pretrained(path)
        if type(processor).__name__ != "InternVLProcessor":
            raise ConfigError(
                f"model.family: family '{self.name}' needs an InternVLProcessor, but {path} has "
                f"a {type(processor).__name__}; is model.family right?"
            )
        processor.tokenizer.padding_side = "left"
        return processor

    def max_tiles(self, processor: Any) -> int:
        """Tiles per image: ``max(1, max_pixels // tile²)`` (see the module docstring)."""
        side = processor.image_processor.size["height"]
        return max(1, self.media.max_pixels // (side * side))

    # -- inputs ------------------------------------------------------------------------------
    def input_size(self, width: int, height: int) -> tuple[int, int]:
        """The image's own size: boxes are 0–1000 relative, whatever the tiling."""
        return int(width), int(height)

    def check_media(self, sample: Sample) -> None:
        qwen_vl.check_media(sample)

    def load_image(self, source: Any) -> Any:
        """The decoded RGB image (PIL; files cached by path, mtime and size). The processor
        tiles it; nothing is resized here."""
        if not isinstance(source, str):
            return source.convert("RGB")
        path = local_media_path(source)
        if path is None:
            raise DataError(f"{source}: only local images are read (mmrft runs offline)")
        key = (media_file_key(path, "image file"), "internvl")
        image = qwen_vl.IMAGE_CACHE.get(key)
        if image is None:
            image = qwen_vl.decode_image(path)
            qwen_vl.IMAGE_CACHE.put(key, image)
        return image

    def prepare(
        self,
        processor: Any,
        conversations: list[list[dict[str, Any]]],
        add_generation_prompt: bool = True,
    ) -> Any:
        """Tokenise conversations with their images and videos: ``input_ids`` /
        ``attention_mask`` ``[B, L]`` left-padded and, with media, ``pixel_values``
        ``[tiles, 3, S, S]`` (see the module docstring)."""
        from mmrft.video import fetch_video

        texts = self.render(processor, conversations, add_generation_prompt)
        images, videos = [], []
        for conv in conversations:
            for part in _media_parts(conv):
                if part.get("type") == "image" or "image" in part:
                    images.append(self.load_image(part.get("image", part.get("image_url"))))
                else:
                    try:
                        frames, _, _ = fetch_video(part, self.video, 28)
                    except DataError:
                        raise
                    except (FileNotFoundError, OSError, RuntimeError, ValueError) as exc:
                        raise DataError(f"{part.get('video')}: cannot load ({exc})") from exc
                    videos.append(frames)
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
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        for owner in (getattr(base, "model", None), base):
            tower = getattr(owner, "vision_tower", None)
            if tower is not None:
                return tower
        raise AttributeError(f"{type(base).__name__} has no vision_tower")


def _media_parts(conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Image and video parts of a conversation, in prompt order."""
    return [
        part
        for message in conversation
        if isinstance(message.get("content"), list)
        for part in message["content"]
        if part.get("type") in ("image", "video") or "image" in part or "video" in part
    ]
