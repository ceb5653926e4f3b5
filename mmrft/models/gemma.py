"""Model-family adapter for Gemma 3 (``gemma3``: ``Gemma3ForConditionalGeneration``, the 4B /
12B / 27B instruction-tuned checkpoints).

Inputs. The chat template writes ``<start_of_image>`` per image part; ``Gemma3Processor``
resizes every image to the SigLIP input (896 × 896 for the released models; pan-and-scan off)
and expands the placeholder to ``\\n\\n<start_of_image>`` + ``<image_soft_token>`` × 256 +
``<end_of_image>\\n\\n``, returning ``pixel_values`` ``[#images, 3, S, S]`` and
``token_type_ids`` (1 on soft tokens). The template writes ``<bos>`` itself, so the prompts are
tokenised without special tokens.

Attention. Gemma 3 is not plain causal over the prompt: the soft tokens of one image attend
to each other bidirectionally (``token_type_ids`` blocks), and 5 of every 6 layers attend
only within a sliding window (1024 tokens for the released models) while the others attend
globally. :meth:`Gemma3.prompt_attention` gives the prompt's own pattern and
:meth:`Gemma3.attention_layers` each layer type's window, so the group-shared forward
(:mod:`mmrft.group`) and the hf engine's prefill build the model's own masks, one per layer
type: a packed completion sees the same keys through the same windows as in its own
sequence. Positions are 1-D (RoPE θ 10⁶ global, 10⁴ local).

Boxes. Gemma 3's model card documents no box output format (asked on the gemma-3-4b-it
discussion #38, the Gemma team answered that it is not explicitly trained to output boxes, and
pointed to Gemini's ``[y_min, x_min, y_max, x_max]`` normalised to 0–1000). mmrft asks for
``norm1000`` boxes as Qwen2-VL's JSON ``{"bbox_2d": [x1, y1, x2, y2]}`` (x first) and says so in
the prompt; RL teaches the format.
"""

from __future__ import annotations

from typing import Any, ClassVar

from mmrft.data import DataError, Sample, local_media_path, media_file_key
from mmrft.family import BoxFrame, ModelFamily, count_runs, model_family
from mmrft.models import qwen_vl

GEMMA3_MEDIA_TOKENS = ("<start_of_image>", "<end_of_image>", "<image_soft_token>")


def image_parts(conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The image parts of a conversation, in order."""
    return [
        part
        for message in conversation
        if isinstance(message.get("content"), list)
        for part in message["content"]
        if part.get("type") == "image" or "image" in part
    ]


def load_image(source: Any, tag: str) -> Any:
    """A decoded RGB image (PIL), files cached by path, mtime and size under ``tag``; the
    processor resizes it."""
    if not isinstance(source, str):
        return source.convert("RGB")
    path = local_media_path(source)
    if path is None:
        raise DataError(f"{source}: only local images are read (mmrft runs offline)")
    key = (media_file_key(path, "image file"), tag)
    image = qwen_vl.IMAGE_CACHE.get(key)
    if image is None:
        image = qwen_vl.decode_image(path)
        qwen_vl.IMAGE_CACHE.put(key, image)
    return image


def base_model(model: Any) -> Any:
    """The transformers model under a peft wrapper."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def submodule(model: Any, name: str) -> Any:
    """``model.model.<name>`` or ``model.<name>`` of a (possibly peft-wrapped) model."""
    base = base_model(model)
    for owner in (getattr(base, "model", None), base):
        found = getattr(owner, name, None)
        if found is not None:
            return found
    raise AttributeError(f"{type(base).__name__} has no {name}")


@model_family("gemma3")
class Gemma3(ModelFamily):
    """Gemma 3: images at a fixed size, bidirectional attention within each image, sliding
    window layers (see the module docstring). :meth:`vision_tower` is SigLIP
    (``model.vision_tower``); the projector stays trainable."""

    model_types = ("gemma3",)
    box_frame: ClassVar[BoxFrame] = "norm1000"
    box_instruction = qwen_vl.Qwen2VL.box_instruction
    token_keys: ClassVar[tuple[str, ...]] = ("token_type_ids",)
    media_keys: ClassVar[dict[str, str]] = {"pixel_values": "images"}
    media_tokens: ClassVar[dict[str, str]] = {"images": "<image_soft_token>"}
    image_type: ClassVar[int] = 1  # token_type_ids value of the soft tokens

    def load_model(
        self, path: str, dtype: str = "float32", attn_implementation: str | None = None
    ) -> Any:
        return self.load_checkpoint(path, dtype, attn_implementation)

    def load_processor(self, path: str) -> Any:
        """``AutoProcessor``, left padding."""
        from transformers import AutoProcessor

        processor = AutoProcessor.from_pretrained(path)
        processor.tokenizer.padding_side = "left"
        return processor

    def input_size(self, width: int, height: int) -> tuple[int, int]:
        """The image's own size: boxes are 0–1000 relative."""
        return int(width), int(height)

    def check_media(self, sample: Sample) -> None:
        qwen_vl.check_media(sample)

    def prepare(
        self,
        processor: Any,
        conversations: list[list[dict[str, Any]]],
        add_generation_prompt: bool = True,
    ) -> Any:
        """``input_ids`` / ``attention_mask`` / ``token_type_ids`` ``[B, L]`` left-padded and,
        with images, ``pixel_values`` ``[#images, 3, S, S]`` in prompt order."""
        for conv in conversations:
            for message in conv:
                content = message.get("content")
                for part in content if isinstance(content, list) else ():
                    if part.get("type") in ("video", "audio") or "video" in part:
                        raise DataError(
                            f"{self.name} takes images and text, got a video/audio part"
                        )
        texts = self.render(processor, conversations, add_generation_prompt)
        images = [
            [load_image(part.get("image"), self.name) for part in image_parts(conv)]
            for conv in conversations
        ]
        kwargs: dict[str, Any] = {}
        if any(images):
            kwargs["images"] = images
        return processor(
            text=texts,
            padding=True,
            padding_side="left",
            return_tensors="pt",
            add_special_tokens=False,
            **kwargs,
        )

    def suppress_token_ids(self, processor: Any) -> list[int]:
        """Ids of ``<start_of_image>``, ``<end_of_image>`` and ``<image_soft_token>``."""
        tokenizer = getattr(processor, "tokenizer", processor)
        ids = tokenizer.convert_tokens_to_ids(list(GEMMA3_MEDIA_TOKENS))
        return [i for i in ids if i is not None and i != tokenizer.unk_token_id]

    # -- re-collation ------------------------------------------------------------------------
    def split_rows(self, batch: Any, processor: Any) -> list[dict[str, Any]]:
        """One dict per conversation: ``input_ids`` and ``token_type_ids`` without padding and
        its images' ``pixel_values`` (one run of soft tokens per image)."""
        rows = []
        position = 0
        values = batch.get("pixel_values")
        for ids, types, mask in zip(
            batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]
        ):
            keep = mask.bool()
            row = {"input_ids": ids[keep].clone(), "token_type_ids": types[keep].clone()}
            n = count_runs((row["token_type_ids"] == self.image_type).long(), 1)
            if values is not None:
                row["pixel_values"] = values[position : position + n].clone()
            position += n
            rows.append(row)
        if position != (0 if values is None else len(values)):
            raise RuntimeError("could not split pixel_values: image counts do not add up")
        return rows

    def collate_rows(self, rows: list[dict[str, Any]], pad_token_id: int) -> dict[str, Any]:
        """Left-pad ``input_ids`` / ``token_type_ids`` and concatenate the rows' images."""
        import torch

        out = super().collate_rows(
            [{k: r[k] for k in ("input_ids", *self.token_keys)} for r in rows], pad_token_id
        )
        images = [r["pixel_values"] for r in rows if len(r.get("pixel_values", ()))]
        if images:
            out["pixel_values"] = torch.cat(images)
        return out

    # -- attention ---------------------------------------------------------------------------
    def prompt_attention(self, row: dict[str, Any]) -> Any:
        """Causal, plus bidirectional within each run of an image's soft tokens (as
        ``Gemma3Model`` builds from ``token_type_ids``)."""
        import torch

        image = row["token_type_ids"] == self.image_type
        starts = image & ~torch.cat([image.new_zeros(1), image[:-1]])
        block = torch.where(
            image, starts.long().cumsum(0), torch.zeros_like(starts, dtype=torch.long)
        )
        same = (block[:, None] == block[None, :]) & image[:, None] & image[None, :]
        n = len(image)
        return torch.ones(n, n, dtype=torch.bool).tril() | same

    def attention_layers(self, model: Any) -> dict[str, int | None]:
        """``{"full_attention": None, "sliding_attention": window}`` from the text config."""
        config = base_model(model).config.get_text_config()
        return {
            kind: (config.sliding_window if kind == "sliding_attention" else None)
            for kind in sorted(set(config.layer_types))
        }

    # -- training helpers --------------------------------------------------------------------
    def vision_tower(self, model: Any) -> Any:
        """SigLIP (``model.vision_tower``)."""
        return submodule(model, "vision_tower")
