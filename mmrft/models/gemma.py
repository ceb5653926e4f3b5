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
(:mod:`mmrft.policy.group`) and the hf engine's prefill build the model's own masks, one per layer
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

from mmrft.data import DataError, Sample
from mmrft.data.video import VideoBudget
from mmrft.models import qwen_vl
from mmrft.models.family import (
    Conversation,
    MediaBudget,
    ModelFamily,
    base_model,
    count_runs,
    install_mask_positions,
    model_family,
    submodule,
)

GEMMA3_MEDIA_TOKENS = ("<start_of_image>", "<end_of_image>", "<image_soft_token>")


def bidirectional_runs(vision: Any) -> Any:
    """``[L, L]`` bool: causal, plus full attention within each run of consecutive ``vision``
    tokens (one image, one video frame)."""
    import torch

    starts = vision & ~torch.cat([vision.new_zeros(1), vision[:-1]])
    block = starts.long().cumsum(0)
    same = (block[:, None] == block[None, :]) & vision[:, None] & vision[None, :]
    n = len(vision)
    return torch.ones(n, n, dtype=torch.bool).tril() | same


@model_family("gemma3")
class Gemma3(qwen_vl.RelativeBoxFamily):
    """Gemma 3: images at a fixed size, bidirectional attention within each image, sliding
    window layers (see the module docstring). :meth:`vision_tower` is SigLIP
    (``model.vision_tower``); the projector stays trainable."""

    model_types = ("gemma3",)
    processor_class = "Gemma3Processor"
    token_keys: ClassVar[tuple[str, ...]] = ("token_type_ids",)
    media_keys: ClassVar[dict[str, str]] = {"pixel_values": "images"}
    media_tokens: ClassVar[dict[str, str]] = {"images": "<image_soft_token>"}
    image_type: ClassVar[int] = 1  # token_type_ids value of the soft tokens

    def process(self, processor: Any, texts: list[str], conversations: list[Conversation]) -> Any:
        """``input_ids`` / ``attention_mask`` / ``token_type_ids`` ``[B, L]`` left-padded and
        the processor's media tensors (Gemma 3: ``pixel_values`` ``[#images, 3, S, S]``), media
        in prompt order across the batch (:meth:`media_inputs`)."""
        return processor(
            text=texts,
            padding=True,
            padding_side="left",
            return_tensors="pt",
            add_special_tokens=False,  # the chat template writes <bos>
            **self.media_inputs(processor, conversations),
        )

    def media_inputs(self, processor: Any, conversations: list[Conversation]) -> dict:
        """The processor's media arguments: ``images``, one list per conversation (a video or
        audio part raises DataError: Gemma 3 takes images and text)."""
        for conv in conversations:
            if qwen_vl.media_parts(conv, "video") or qwen_vl.media_parts(conv, "audio"):
                raise DataError(f"{self.name} takes images and text, got a video/audio part")
        images = [
            [
                qwen_vl.decoded_image(p.get("image"), self.name)
                for p in qwen_vl.media_parts(conv, "image")
            ]
            for conv in conversations
        ]
        return {"images": images} if any(images) else {}

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
    def prompt_attention(self, model: Any, row: dict[str, Any]) -> Any:
        """Causal, plus bidirectional within each run of :meth:`bidirectional_tokens` (as
        ``Gemma3Model`` builds from ``token_type_ids``)."""
        vision = self.bidirectional_tokens(model, row[self.token_keys[0]])
        return None if vision is None else bidirectional_runs(vision)

    def bidirectional_tokens(self, model: Any, token_types: Any) -> Any:
        """An image's soft tokens (``token_type_ids`` 1)."""
        return token_types == self.image_type

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


GEMMA4_MEDIA_TOKENS = (
    "<|image>",
    "<image|>",
    "<|image|>",
    "<|video|>",
    "<|audio>",
    "<audio|>",
    "<|audio|>",
)


@model_family("gemma4")
class Gemma4(Gemma3):
    """Gemma 4 (``gemma4``: ``Gemma4ForConditionalGeneration``; images, videos, and audio on
    the E2B/E4B checkpoints).

    Inputs. The chat template writes ``<|image|>`` / ``<|video|>`` / ``<|audio|>`` per part;
    ``Gemma4Processor`` resizes each image keeping its aspect ratio to at most
    ``max_soft_tokens`` × 3² patches of 16 px (280 soft tokens by default) and expands the
    placeholder to ``<|image>`` + ``<|image|>`` × soft tokens + ``<image|>``; a video becomes one
    such block per frame (``<|video|>`` tokens, each frame preceded by its ``mm:ss`` timestamp),
    an audio clip ``<|audio>`` + ``<|audio|>`` per 40 ms + ``<audio|>``. Tensors: per image
    ``pixel_values`` ``[max_patches, 3·16²]`` and ``image_position_ids`` (−1 on padding
    patches), per frame ``pixel_values_videos`` / ``video_position_ids`` with
    ``num_frames_per_video``, per clip ``input_features`` / ``input_features_mask`` (padded to
    the batch's longest), and ``mm_token_type_ids`` (1 image, 2 video, 3 audio). Positions are
    1-D. Videos follow ``model.video``; audio is read at 16 kHz and cut at
    ``model.audio.max_seconds`` (the processor caps a clip at 750 tokens = 30 s).

    Attention. Sliding-window layers as Gemma 3 (512 tokens for the released models), and on
    the checkpoints whose text config says ``use_bidirectional_attention = "vision"`` the tokens
    of each image or video frame attend to each other bidirectionally
    (:meth:`prompt_attention`; causal on the others). The last layers reuse the keys and values
    of earlier ones (KV sharing) and every layer adds a per-layer embedding of the token: both
    are per-token or per-layer, so packing and the prefix cache keep them exact.

    Boxes as :class:`Gemma3` (the model card documents no box format). :meth:`vision_tower`
    is both encoders, vision and audio.
    """

    model_types = ("gemma4",)
    processor_class = "Gemma4Processor"

    def load_model(
        self, path: str, dtype: str = "float32", attn_implementation: str | None = None
    ) -> Any:
        """Load; positions from the attention mask when a caller passes none: Gemma 4's
        forward counts positions from the first column, so a left-padded forward would shift
        every position (and its proportional RoPE is not shift-invariant); ``generate`` and
        mmrft's own paths give the unpadded positions."""
        model = self.load_checkpoint(path, dtype, attn_implementation)
        install_mask_positions(getattr(model, "model", model))
        return model

    token_keys: ClassVar[tuple[str, ...]] = ("mm_token_type_ids",)
    media_keys: ClassVar[dict[str, str]] = {
        "pixel_values": "image_position_ids",
        "pixel_values_videos": "video_position_ids",
        "input_features": "input_features_mask",
    }
    media_tokens: ClassVar[dict[str, str]] = {"image_position_ids": "<|image|>"}

    def __init__(
        self,
        media: MediaBudget | None = None,
        video: VideoBudget | None = None,
        audio: Any = None,
    ) -> None:
        from mmrft.data.audio import AudioBudget

        super().__init__(media)
        self.video = video or VideoBudget()
        self.audio = audio or AudioBudget()

    def media_inputs(self, processor: Any, conversations: list[Conversation]) -> dict:
        """The processor's media arguments: images (one list per conversation), videos (the
        sampled frames, their metadata) and audio clips at the feature extractor's rate, each
        in prompt order across the batch."""
        from mmrft.data.audio import load_audio
        from mmrft.models.qwen_audio import _local_audio_path, audio_parts

        images, videos, metadata, audios = [], [], [], []
        rate = int(processor.feature_extractor.sampling_rate)
        for conv in conversations:
            images.append(
                [
                    qwen_vl.decoded_image(p.get("image"), self.name)
                    for p in qwen_vl.media_parts(conv, "image")
                ]
            )
            for part in qwen_vl.media_parts(conv, "video"):
                frames, meta = qwen_vl.load_video(part, self.video, 28)
                videos.append(frames)
                metadata.append(meta)
            for part in audio_parts(conv):
                path = _local_audio_path(part.get("audio", part.get("audio_url")))
                if path is None:
                    raise DataError(f"{part}: only local audio files are read (mmrft runs offline)")
                audios.append(
                    load_audio(
                        path, rate, max_seconds=self.audio.max_seconds, policy=self.audio.policy
                    )
                )
        kwargs: dict[str, Any] = {}
        if any(images):
            kwargs["images"] = images
        if videos:
            kwargs.update(videos=videos, video_metadata=metadata, do_sample_frames=False)
        if audios:
            kwargs["audio"] = audios
        return kwargs

    def check_media(self, sample: Sample) -> None:
        from mmrft.models.qwen_audio import check_media

        check_media(sample)

    def suppress_token_ids(self, processor: Any) -> list[int]:
        """Ids of the image, video and audio boundary and placeholder tokens."""
        tokenizer = getattr(processor, "tokenizer", processor)
        ids = tokenizer.convert_tokens_to_ids(list(GEMMA4_MEDIA_TOKENS))
        return [i for i in ids if i is not None and i != tokenizer.unk_token_id]

    # -- re-collation ------------------------------------------------------------------------
    def split_rows(self, batch: Any, processor: Any) -> list[dict[str, Any]]:
        """One dict per conversation: ``input_ids`` and ``mm_token_type_ids`` without padding,
        and its images (one run of type-1 tokens each), video frames (one run of type-2 tokens
        each, grouped into videos by ``num_frames_per_video``) and audio clips (one run of
        type-3 tokens each; features cut to the clip's own length)."""
        import torch

        rows: list[dict[str, Any]] = []
        for ids, types, mask in zip(
            batch["input_ids"], batch["mm_token_type_ids"], batch["attention_mask"]
        ):
            keep = mask.bool()
            rows.append({"input_ids": ids[keep].clone(), "mm_token_type_ids": types[keep].clone()})
        runs = [
            {kind: count_runs((r["mm_token_type_ids"] == kind).long(), 1) for kind in (1, 2, 3)}
            for r in rows
        ]
        image = video = frame = audio = 0
        per_video = batch.get("num_frames_per_video")
        per_video = per_video.tolist() if per_video is not None else []
        for row, n in zip(rows, runs):
            if batch.get("pixel_values") is not None:
                row["pixel_values"] = batch["pixel_values"][image : image + n[1]].clone()
                row["image_position_ids"] = batch["image_position_ids"][
                    image : image + n[1]
                ].clone()
            image += n[1]
            frames, first = 0, video
            while frames < n[2]:
                frames += int(per_video[video])
                video += 1
            if frames != n[2]:
                raise RuntimeError(
                    "could not split pixel_values_videos: frame counts do not add up"
                )
            if per_video:
                row["pixel_values_videos"] = batch["pixel_values_videos"][
                    frame : frame + frames
                ].clone()
                row["video_position_ids"] = batch["video_position_ids"][
                    frame : frame + frames
                ].clone()
                row["num_frames_per_video"] = torch.tensor(per_video[first:video], dtype=torch.long)
            frame += frames
            if batch.get("input_features") is not None:
                clips = batch["input_features_mask"][audio : audio + n[3]]
                width = int(clips.sum(-1).max()) if len(clips) else 0
                row["input_features"] = batch["input_features"][
                    audio : audio + n[3], :width
                ].clone()
                row["input_features_mask"] = clips[:, :width].clone()
            audio += n[3]
        for key, used in (
            ("pixel_values", image),
            ("pixel_values_videos", frame),
            ("input_features", audio),
        ):
            if batch.get(key) is not None and len(batch[key]) != used:
                raise RuntimeError(f"could not split {key}: media counts do not add up")
        return rows

    def collate_rows(self, rows: list[dict[str, Any]], pad_token_id: int) -> dict[str, Any]:
        """Left-pad ``input_ids`` / ``mm_token_type_ids``; concatenate images and frames, and
        audio features padded to the longest clip (mask 0)."""
        import torch

        out = ModelFamily.collate_rows(
            self, [{k: r[k] for k in ("input_ids", *self.token_keys)} for r in rows], pad_token_id
        )
        for keys in (
            ("pixel_values", "image_position_ids"),
            ("pixel_values_videos", "video_position_ids", "num_frames_per_video"),
        ):
            present = [r for r in rows if len(r.get(keys[0], ()))]
            if present:
                out.update({k: torch.cat([r[k] for r in present]) for k in keys})
        clips = [r for r in rows if len(r.get("input_features", ()))]
        if clips:
            width = max(r["input_features"].shape[1] for r in clips)
            out["input_features"] = torch.cat(
                [
                    torch.nn.functional.pad(
                        r["input_features"], (0, 0, 0, width - r["input_features"].shape[1])
                    )
                    for r in clips
                ]
            )
            out["input_features_mask"] = torch.cat(
                [
                    torch.nn.functional.pad(
                        r["input_features_mask"], (0, width - r["input_features_mask"].shape[1])
                    )
                    for r in clips
                ]
            )
        return out

    # -- attention ---------------------------------------------------------------------------
    def bidirectional_tokens(self, model: Any, token_types: Any) -> Any:
        """With ``use_bidirectional_attention = "vision"``: the tokens of each image or video
        frame (``mm_token_type_ids`` 1 or 2, as ``Gemma4Model`` builds its mask); else none
        (``None``: plain causal)."""
        config = base_model(model).config.get_text_config()
        if config.use_bidirectional_attention != "vision":
            return None
        return (token_types == 1) | (token_types == 2)

    def vision_tower(self, model: Any) -> Any:
        """The vision encoder and, when the checkpoint has one, the audio encoder."""
        import torch

        base = base_model(model)
        inner = getattr(base, "model", base)
        towers = [getattr(inner, name, None) for name in ("vision_tower", "audio_tower")]
        return torch.nn.ModuleList([t for t in towers if t is not None])
