"""Model-family adapters for Qwen2-VL, Qwen2.5-VL and Qwen3-VL.

Inputs are built the way the Qwen model cards do it: the processor's own chat template renders
the text (one ``<|vision_start|><|image_pad|><|vision_end|>`` per image part), then
``qwen_vl_utils.process_vision_info`` loads and resizes the media, then the processor expands the
placeholders and patchifies. Prompts are left-padded and never truncated (truncation would cut
image tokens and break the image-feature/token match).

Coordinate frames (see ``mmrft.models.family``):

* Qwen2-VL: ``norm1000``, integers 0–1000 relative to the image (Qwen2-VL paper).
* Qwen2.5-VL: ``input_pixels``, absolute pixels of the *resized* input image, whose sides are
  multiples of 28 (``image_grid_thw × 14``); :meth:`QwenVLFamily.input_size` gives that size.
* Qwen3-VL: ``norm1000``. Qwen3-VL went back to relative 0–1000 coordinates (Qwen3-VL
  cookbooks: "Qwen3-VL uses relative coordinates ranging from 0 to 1000"); its resized input
  has sides that are multiples of 32 (patch 16 × merge 2).

Media. Image parts are ``{"type": "image", "image": "/abs/path.png"}`` (``file://`` paths,
URLs and PIL images also work). Each image is decoded and resized once and kept in a
process-wide LRU cache keyed by path, modification time, file size and the pixel budget, so the
G copies of a prompt in a GRPO group (and later epochs) do not reread the file. A missing or
corrupt file raises :class:`mmrft.data.DataError` naming it. Videos (files or lists of frames) go
through :mod:`mmrft.data.video` with the family's :class:`~mmrft.data.video.VideoBudget` (the part's own
``fps`` / ``nframes`` / ``min_frames`` / ``max_frames`` / ``min_pixels`` / ``max_pixels`` /
``total_pixels`` keys win): decoded once per group (decoded-frame cache), sampled and resized by
qwen-vl-utils' rules, fitted to ``max_prompt_tokens`` by lowering fps then pixels, and handed to
the processor with metadata that matches the sampled frames (``second_per_grid_ts``, Qwen3-VL
timestamps).

mRoPE positions. In transformers ≥ 5 these models compute their 3-D (time, height, width)
rotary positions only when ``mm_token_type_ids`` is passed; without it they silently fall back
to 1-D text positions. :meth:`QwenVLFamily.load_model` therefore installs a forward pre-hook
that derives ``mm_token_type_ids`` from ``input_ids`` whenever a caller leaves it out (the
training forward over prompt + completion, re-collated rows), so generation and training see the
same positions.
"""

from __future__ import annotations

import logging
import math
import threading
import types
from collections import OrderedDict
from collections.abc import Hashable
from pathlib import Path
from typing import Any, ClassVar

from mmrft.data import DataError, Sample, local_media_path, media_file_key, read_image
from mmrft.data.video import VideoBudget, map_media_parts
from mmrft.models.family import (
    BoxFrame,
    Conversation,
    MediaBudget,
    ModelFamily,
    model_family,
    one_box_instruction,
    submodule,
    unexpanded_ids,
)

log = logging.getLogger(__name__)


# Placeholder tokens a model must never generate: a completion holding one would desynchronise
# image features and image tokens in the training forward.
MEDIA_SPECIAL_TOKENS = (
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)


def _transformers_major() -> int:
    from importlib.metadata import version

    return int(version("transformers").split(".")[0])


_TRANSFORMERS_5 = _transformers_major() >= 5


def require_video_reader() -> None:
    """Raise a clear RuntimeError when no video decoder can run here (video files need one of
    decord, torchcodec, PyAV; a video given as a list of frame images does not)."""
    from mmrft.data.video import require_backend

    require_backend()


# -- image loading and cache -------------------------------------------------------------------
class ImageCache:
    """Thread-safe LRU cache of decoded (and resized) PIL images.

    Keys hold the file's ``(path, mtime_ns, size)`` so an edited file is reloaded.
    """

    def __init__(self, max_items: int = 256) -> None:
        self.max_items = max_items
        self._items: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable) -> Any | None:
        with self._lock:
            value = self._items.get(key)
            if value is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return value

    def put(self, key: Hashable, value: Any) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.max_items:
                self._items.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._items)


IMAGE_CACHE = ImageCache()


def decoded_image(source: Any, tag: str) -> Any:
    """An image part's source decoded to RGB (PIL) and not resized, for families whose
    processor resizes (InternVL's tiles, Gemma's fixed or aspect-kept sizes): files are cached
    by path, mtime and size under ``tag``; URLs are not fetched."""
    if not isinstance(source, str):
        return source.convert("RGB")
    path = local_media_path(source)
    if path is None:
        raise DataError(f"{source}: only local images are read (mmrft runs offline)")
    key = (media_file_key(path, "image file"), tag)
    image = IMAGE_CACHE.get(key)
    if image is None:
        image = read_image(path)
        IMAGE_CACHE.put(key, image)
    return image


def load_video(part: dict[str, Any], budget: VideoBudget, factor: int) -> tuple[Any, dict]:
    """A video part's sampled frames ``[T, 3, H, W]`` and metadata
    (:func:`mmrft.data.video.fetch_video`), a decoding failure raised as DataError naming the
    file."""
    from mmrft.data.video import fetch_video

    try:
        frames, metadata, _ = fetch_video(part, budget, factor)
    except DataError:
        raise
    except (FileNotFoundError, OSError, RuntimeError, ValueError) as exc:
        raise DataError(f"{part.get('video')}: cannot load ({exc})") from exc
    return frames, metadata


_checked_sizes: dict[tuple[str, int, int], tuple[int, int]] = {}
_checked_lock = threading.Lock()


def check_media(sample: Sample) -> None:
    """Decode each local image of ``sample`` once; raise DataError naming a missing/corrupt file.

    Used by dataset readers (``data.on_error``). A file already checked in this process (same
    path, mtime and size) is not decoded again. When ``sample.meta`` has no ``image_size``, the
    size ``[W, H]`` (pixels) of the first image is stored there. Videos are probed (headers, one
    frame with decord; a truncated file may still fail later, at decoding, naming the file);
    audio is only checked for existence here (the audio families decode it); URLs are not
    fetched.
    """
    first_size: tuple[int, int] | None = None
    for message in sample.messages:
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for part in content:
            kind = part.get("type")
            if kind not in ("image", "video", "audio"):
                continue
            source = part.get(kind)
            if kind == "video" and isinstance(source, list):  # a video given as frame images
                for frame in source:
                    frame_path = local_media_path(frame) if isinstance(frame, str) else None
                    if frame_path is not None and not Path(frame_path).is_file():
                        raise DataError(f"{frame_path}: video frame not found")
                continue
            if not isinstance(source, str):
                continue
            path = local_media_path(source)
            if path is None:
                continue
            if kind == "video":  # headers only (memoised): a corrupt or empty file is named
                from mmrft.data.video import probe_video

                probe_video(path)
                continue
            if kind != "image":
                if not Path(path).exists():
                    raise DataError(f"{path}: {kind} file not found")
                continue
            key = media_file_key(path, "image file")
            with _checked_lock:
                size = _checked_sizes.get(key)
            if size is None:
                size = read_image(path).size
                with _checked_lock:
                    _checked_sizes[key] = size
            if first_size is None:
                first_size = size
    if first_size is not None and "image_size" not in sample.meta:
        sample.meta["image_size"] = [int(first_size[0]), int(first_size[1])]


# -- the adapters ------------------------------------------------------------------------------
class QwenVLFamily(ModelFamily):
    """Shared implementation of the Qwen-VL families.

    Class attributes:
        patch_size: vision patch side (pixels); 14 for Qwen2/2.5-VL, 16 for Qwen3-VL.
        merge_size: patches merged per side into one LLM token (2).
        video_metadata: whether the processor wants qwen-vl-utils' video metadata (Qwen3-VL; its
            prompts then carry frame timestamps, which the video token budget counts).
        video (instance): the :class:`~mmrft.data.video.VideoBudget` (frames, fps, pixels, prompt
            tokens) of video parts.
        image_cache: the LRU cache of resized images shared by all instances.
    """

    patch_size: ClassVar[int] = 14
    merge_size: ClassVar[int] = 2
    video_metadata: ClassVar[bool] = False
    # the reference mRoPE positions in place of transformers 5's (reference_rope_index): the
    # families whose videos are one run of frames (Qwen3-VL's are one run per timestamped step)
    reference_positions: ClassVar[bool] = False
    image_cache: ClassVar[ImageCache] = IMAGE_CACHE

    def __init__(self, media: MediaBudget | None = None, video: VideoBudget | None = None) -> None:
        super().__init__(media)
        self.video = video or VideoBudget()

    @property
    def factor(self) -> int:
        """Side multiple (pixels) of the resized input: ``patch_size × merge_size``."""
        return self.patch_size * self.merge_size

    # -- loading -----------------------------------------------------------------------------
    def load_model(
        self, path: str, dtype: str = "float32", attn_implementation: str | None = None
    ) -> Any:
        """Load with ``AutoModelForImageTextToText`` (:meth:`ModelFamily.load_checkpoint`);
        install the ``mm_token_type_ids`` hook (see the module docstring)."""
        model = self.load_checkpoint(path, dtype, attn_implementation)
        install_mm_token_type_hook(model, self.token_types)
        if self.reference_positions:
            owner = rope_module(model)
            owner.get_rope_index = types.MethodType(reference_rope_index, owner)
        return model

    def load_processor(self, path: str) -> Any:
        """``AutoProcessor`` with the family's :class:`MediaBudget` on the image processor,
        left padding, and a check that the checkpoint's patch geometry is the family's."""
        processor = super().load_processor(path)
        configure_vision_processor(processor, self, path)
        return processor

    # -- inputs ------------------------------------------------------------------------------
    def input_size(self, width: int, height: int) -> tuple[int, int]:
        """``(w, h)`` in pixels after qwen-vl-utils ``smart_resize`` with factor
        ``patch_size × merge_size`` and the budget: sides multiples of the factor, area in
        ``[min_pixels, max_pixels]``, aspect ratio kept as well as possible."""
        from qwen_vl_utils.vision_process import smart_resize

        h, w = smart_resize(
            int(height),
            int(width),
            factor=self.factor,
            min_pixels=self.media.min_pixels,
            max_pixels=self.media.max_pixels,
        )
        return int(w), int(h)

    def load_image(self, source: Any, part: dict[str, Any] | None = None) -> Any:
        """The image as the model sees it (RGB, resized by qwen-vl-utils ``fetch_image``).

        Local files and URLs are cached (see the module docstring); a part's own
        ``min_pixels`` / ``max_pixels`` / ``resized_height`` / ``resized_width`` win over the
        family budget, as in qwen-vl-utils.
        """
        from qwen_vl_utils.vision_process import fetch_image

        part = part or {}
        options = {"min_pixels": self.media.min_pixels, "max_pixels": self.media.max_pixels}
        options.update(
            {
                k: part[k]
                for k in ("min_pixels", "max_pixels", "resized_height", "resized_width")
                if k in part
            }
        )
        option_key = tuple(sorted(options.items()))
        if not isinstance(source, str):  # a PIL image
            return fetch_image({"image": source, **options}, image_patch_size=self.patch_size)
        path = local_media_path(source)
        if path is None and source.startswith("data:"):
            return fetch_image({"image": source, **options}, image_patch_size=self.patch_size)
        key = (
            media_file_key(path, "image file") if path is not None else source,
            self.patch_size,
            option_key,
        )
        image = self.image_cache.get(key)
        if image is None:
            decoded = read_image(path) if path is not None else source
            try:
                image = fetch_image({"image": decoded, **options}, image_patch_size=self.patch_size)
            except DataError:
                raise
            except Exception as exc:  # bad URL, impossible aspect ratio, ...
                raise DataError(f"{source}: cannot load image ({exc})") from None
            self.image_cache.put(key, image)
        return image

    def _with_loaded_media(self, conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """A shallow copy of ``conversation`` whose image parts hold the resized PIL images
        (with bounds equal to their area, so that ``fetch_image`` keeps their size) and whose
        local video paths were checked to exist."""
        return map_media_parts(conversation, lambda part, kind, k: self._loaded_part(part))

    def _loaded_part(self, part: dict[str, Any]) -> dict[str, Any]:
        """One media part of :meth:`_with_loaded_media`."""
        if part.get("type") == "image" or "image" in part or "image_url" in part:
            image = self.load_image(part.get("image", part.get("image_url")), part)
            area = image.width * image.height  # fetch_image keeps a size within bounds
            return {"type": "image", "image": image, "min_pixels": area, "max_pixels": area}
        if part.get("type") == "video" or "video" in part:
            video = part.get("video")
            if isinstance(video, str):
                path = local_media_path(video)
                if path is not None and not Path(path).exists():
                    raise DataError(f"{path}: video file not found")
                require_video_reader()
        return part

    def prepare(
        self, processor: Any, conversations: list[Conversation], add_generation_prompt: bool = True
    ) -> Any:
        """Tokenise a batch of conversations with their media.

        Returns a ``BatchFeature`` of torch tensors: ``input_ids`` and ``attention_mask``
        ``[B, L]`` left-padded with the tokenizer's pad token, ``mm_token_type_ids`` ``[B, L]``
        (0 text, 1 image, 2 video), and when there are images ``pixel_values``
        ``[Σ patches, 3·2·patch²]`` + ``image_grid_thw`` ``[#images, 3]`` (t, h, w in patches),
        when there are videos ``pixel_values_videos`` + ``video_grid_thw`` (+ Qwen2.5-VL's
        ``second_per_grid_ts``). Images are in prompt order across the batch.
        """
        return self._process(
            processor, *self.load_media(processor, conversations, add_generation_prompt)
        )

    def process(self, processor: Any, texts: list[str], conversations: list[Conversation]) -> Any:
        """:meth:`prepare` of ``texts`` already rendered."""
        return self._process(processor, texts, *self.load_vision(processor, texts, conversations))

    def load_media(
        self,
        processor: Any,
        conversations: list[Conversation],
        add_generation_prompt: bool = True,
    ) -> tuple[list[str], list[Any] | None, list[Any] | None, dict[str, Any]]:
        """The chat-template texts and the media as the model sees them: ``(texts, images,
        videos, processor kwargs)``, images resized by the pixel budget (PIL), videos sampled
        and resized by the video budget (``[T, 3, H, W]`` uint8 each, their metadata in the
        kwargs' ``video_metadata``), both in prompt order across the batch."""
        texts = self.render(processor, conversations, add_generation_prompt)
        return (texts, *self.load_vision(processor, texts, conversations))

    def load_vision(
        self, processor: Any, texts: list[str], conversations: list[Conversation]
    ) -> tuple[list[Any] | None, list[Any] | None, dict[str, Any]]:
        """``(images, videos, processor kwargs)`` of ``conversations`` as :meth:`load_media`
        describes, for ``texts`` already rendered (the video budget counts their tokens)."""
        from mmrft.data.video import count_text_tokens, timestamp_step_tokens

        with_metadata = self.video_metadata or _TRANSFORMERS_5
        text_tokens = step_tokens = None
        if self.video.max_prompt_tokens is not None:  # the budget counts every prompt token
            text_tokens = count_text_tokens(processor, texts)
            # Qwen3-VL writes "<t seconds>" and a vision start/end pair per temporal step
            step_tokens = timestamp_step_tokens(processor) if self.video_metadata else 0
        images, videos, video_kwargs = self._vision_info(
            conversations,
            text_tokens,
            return_video_metadata=with_metadata,
            step_tokens=step_tokens or 0,
        )
        kwargs: dict[str, Any] = {}
        if videos is not None:
            # Frames are sampled already (do_sample_frames=False). transformers ≥ 5 derives the
            # sampled fps (Qwen2.5-VL's second_per_grid_ts, Qwen3-VL's timestamps) from the
            # metadata; 4.x took a list of fps instead.
            kwargs.update(video_kwargs)
            if with_metadata:
                videos, metadata = (list(x) for x in zip(*videos))
                kwargs["video_metadata"] = metadata
        return images, videos, kwargs

    def _vision_info(
        self, conversations: list[Conversation], text_tokens: list[int] | None, **options: Any
    ) -> tuple[list[Any] | None, list[Any] | None, dict[str, Any]]:
        """:func:`mmrft.data.video.process_vision_info` of ``conversations`` (their images
        loaded, :meth:`_with_loaded_media`) with the family's video budget, patch and merge
        sizes and ``options``; a video that cannot be read is a DataError naming the videos."""
        from mmrft.data.video import process_vision_info

        loaded = [self._with_loaded_media(conv) for conv in conversations]
        try:
            return process_vision_info(
                loaded,
                budget=self.video,
                image_patch_size=self.patch_size,
                merge_size=self.merge_size,
                text_tokens=text_tokens,
                **options,
            )
        except DataError:
            raise
        except (FileNotFoundError, OSError, RuntimeError, ValueError) as exc:
            videos = sorted({str(p["video"]) for c in loaded for p in media_parts(c, "video")})
            raise DataError(f"{', '.join(videos) or 'media'}: cannot load ({exc})") from exc

    def observation_row(self, processor: Any, text: str, parts: list[dict[str, Any]]) -> dict:
        """One prepared row (:meth:`split_rows`) of ``text``, a chat-template fragment that
        already holds one placeholder block per media part, with the media of ``parts`` (chat
        content parts, in order: PIL images, frame-list videos) loaded by the family's own
        budgets (``smart_resize`` of the images, the video budget of the clips). Used for a
        tool's observation, which is tokenised alone and appended to a trajectory."""
        conversation = [{"role": "user", "content": parts}]
        images, videos, kwargs = self.load_vision(processor, [text], [conversation])
        batch = self._process(processor, [text], images, videos, kwargs)
        row = self.split_rows(batch, processor)[0]
        metadata = kwargs.get("video_metadata") or [None] * len(videos or [])
        row["engine_media"] = self.engine_media(images or [], videos or [], metadata)
        row["engine_ids"] = unexpanded_ids(processor, text)
        return row

    def _process(
        self,
        processor: Any,
        texts: list[str],
        images: list[Any] | None,
        videos: list[Any] | None,
        kwargs: dict[str, Any],
    ) -> Any:
        # The media are already resized to the budget by qwen-vl-utils; resizing again could
        # only move them off the size that input_size() reports.
        return processor(
            text=texts,
            images=images,
            videos=videos,
            padding=True,
            padding_side="left",
            return_tensors="pt",
            do_resize=False,
            **kwargs,
        )

    def engine_processor_kwargs(self) -> dict[str, Any]:
        """The image bounds of a rollout engine's own copy of the processor. The media arrive
        resized, so the bounds only have to keep their size. ``min_pixels``: one patch group
        (factor²), not the budget's, because ``smart_resize`` floors the sides when it scales
        an image down and can leave it below ``min_pixels`` (a 1370 × 1289 image at min = max
        = 12544 becomes 112 × 84 = 9408 px), which an engine with the budget's lower bound
        would scale up again (112 × 140: 8 more tokens than the trainer's). ``max_pixels``:
        the budget's, or more when the resize can pass it: it *ceils* the sides when it scales
        a small image up to ``min_pixels``, up to ``min + f·√min·(√R + 1/√R) + f²`` px (f the
        factor, R = 200 the largest aspect ratio qwen-vl-utils takes); a tool's crop at min =
        max = 12544 came out 140 × 112 = 15680 px, which an engine bounded by the budget
        shrank to 112 × 84 (8 tokens fewer than the trainer's)."""
        low, f, ratio = self.media.min_pixels, self.factor, 200.0
        upscaled = low + f * math.sqrt(low) * (math.sqrt(ratio) + 1 / math.sqrt(ratio)) + f * f
        return {"min_pixels": f**2, "max_pixels": max(self.media.max_pixels, math.ceil(upscaled))}

    def engine_inputs(
        self, processor: Any, conversations: list[Conversation]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The trainer's prompt rows (one processor call) and one vLLM request per
        conversation with the same text and the same loaded media: images resized, video
        frames sampled and resized, each video with its metadata (sampled fps, frame indices)
        so the engine's processor writes the same placeholder counts and time steps."""
        from mmrft.data.video import media_counts

        texts, images, videos, kwargs = self.load_media(processor, conversations)
        rows = self.split_rows(self._process(processor, texts, images, videos, kwargs), processor)
        metadata = kwargs.get("video_metadata") or [None] * len(videos or [])
        requests, image_at, video_at = [], 0, 0
        for row, text, conversation in zip(rows, texts, conversations):
            n_images, n_videos = media_counts(conversation)
            data = self.engine_media(
                (images or [])[image_at : image_at + n_images],
                (videos or [])[video_at : video_at + n_videos],
                metadata[video_at : video_at + n_videos],
            )
            image_at, video_at = image_at + n_images, video_at + n_videos
            row["engine_media"] = data  # a tool rollout's later turns send them again
            row["engine_ids"] = unexpanded_ids(processor, text)
            requests.append(
                {"prompt": text, "multi_modal_data": data} if data else {"prompt": text}
            )
        return rows, requests

    def engine_media(
        self, images: list[Any], videos: list[Any], metadata: list[Any]
    ) -> dict[str, list[Any]]:
        """A rollout engine's ``multi_modal_data`` for media as the family loaded them: the
        resized PIL images; each video as ``[T, H, W, 3]`` uint8 frames, with its metadata
        (sampled fps, frame indices) when the processor wants it."""
        data: dict[str, list[Any]] = {}
        if images:
            data["image"] = list(images)
        if videos:
            data["video"] = [
                (frames.permute(0, 2, 3, 1).numpy(), meta)
                if meta
                else frames.permute(0, 2, 3, 1).numpy()
                for frames, meta in zip(videos, metadata)
            ]
        return data

    def suppress_token_ids(self, processor: Any) -> list[int]:
        """Ids of the vision placeholder tokens; pass them as ``suppress_tokens`` to generate so
        that a (small, random) model never writes an image token into a completion."""
        tokenizer = getattr(processor, "tokenizer", processor)
        ids = tokenizer.convert_tokens_to_ids(list(MEDIA_SPECIAL_TOKENS))
        return [i for i in ids if i is not None and i != tokenizer.unk_token_id]

    # -- re-collation (keeps Qwen2.5-VL's per-video time step) --------------------------------
    def runs_per_item(self, grid_key: str, grid_row: Any) -> int:
        """Placeholder runs one image/video occupies in the prompt (1; Qwen3-VL videos: one
        run per temporal patch, the runs separated by frame timestamps)."""
        return 1

    def split_rows(self, batch: Any, processor: Any) -> list[dict[str, Any]]:
        """As :meth:`ModelFamily.split_rows` (incl. its ``token_keys``), also carrying
        ``second_per_grid_ts`` per video (Qwen2.5-VL's time step, needed for the temporal mRoPE
        positions) and counting placeholder runs with :meth:`runs_per_item`."""
        import torch

        from mmrft.models.family import count_runs

        tokenizer = getattr(processor, "tokenizer", processor)
        unpadded = [
            ids[mask.bool()] for ids, mask in zip(batch["input_ids"], batch["attention_mask"])
        ]
        rows: list[dict[str, Any]] = [{"input_ids": ids.clone()} for ids in unpadded]
        for key in getattr(self, "token_keys", ()):  # per-token tensors (mm_token_type_ids)
            if batch.get(key) is not None:
                for row, values, mask in zip(rows, batch[key], batch["attention_mask"]):
                    row[key] = values[mask.bool()].clone()
        seconds = batch.get("second_per_grid_ts")
        for values_key, grid_key in self.media_keys.items():
            if batch.get(values_key) is None:
                continue
            grids, values = batch[grid_key], batch[values_key]
            token_id = tokenizer.convert_tokens_to_ids(self.media_tokens[grid_key])
            kind = 2 if grid_key == "video_grid_thw" else 1  # its mm_token_type_ids value
            grid_pos = value_pos = 0
            for row, ids in zip(rows, unpadded):
                types = row.get("mm_token_type_ids")  # GLM: video frames use the image token
                marks = (types == kind).long() if types is not None else ids
                runs = count_runs(marks, 1 if types is not None else token_id)
                start = grid_pos
                while runs > 0 and grid_pos < len(grids):
                    runs -= self.runs_per_item(grid_key, grids[grid_pos])
                    grid_pos += 1
                if runs != 0:
                    raise RuntimeError(f"could not split {values_key}: media counts do not add up")
                n_patches = int(grids[start:grid_pos].prod(dim=-1).sum())
                row[grid_key] = grids[start:grid_pos].clone()
                row[values_key] = values[value_pos : value_pos + n_patches].clone()
                if grid_key == "video_grid_thw" and seconds is not None:
                    row["second_per_grid_ts"] = torch.as_tensor(seconds)[start:grid_pos].clone()
                value_pos += n_patches
            if grid_pos != len(grids) or value_pos != len(values):
                raise RuntimeError(f"could not split {values_key}: media counts do not add up")
        return rows

    def collate_rows(self, rows: list[dict[str, Any]], pad_token_id: int) -> dict[str, Any]:
        """As :meth:`ModelFamily.collate_rows`, also concatenating ``second_per_grid_ts``."""
        import torch

        out = super().collate_rows(rows, pad_token_id)
        seconds = [r["second_per_grid_ts"] for r in rows if len(r.get("second_per_grid_ts", ()))]
        if seconds:
            out["second_per_grid_ts"] = torch.cat(seconds)
        return out

    # -- training helpers ----------------------------------------------------------------------
    def vision_tower(self, model: Any) -> Any:
        """The vision encoder (patch embedding, blocks and the patch merger)."""
        return vision_tower(model)

    def check_media(self, sample: Sample) -> None:
        check_media(sample)

    def rope_positions(self, model: Any, row: dict[str, Any]) -> Any:
        """``[3, Lp]`` mRoPE positions (temporal, height, width) of a prompt row, from the
        model's own ``get_rope_index`` on the unpadded row: text tokens advance all three
        axes together, a media placeholder run gets its grid's (t, h, w) positions (Qwen2.5-VL:
        t scaled by ``second_per_grid_ts``)."""
        import torch

        ids = row["input_ids"][None]
        owner = rope_module(model)
        types = row.get("mm_token_type_ids")
        if types is None:  # rows prepared without it: the same types from the token ids
            types = self.token_types(ids, owner.config)
        else:
            types = types[None]
        media = {
            key: row[key]
            for key in ("image_grid_thw", "video_grid_thw", "second_per_grid_ts")
            if key in row and len(row[key])
        }
        with torch.no_grad():
            positions, _ = owner.get_rope_index(ids, types, **media)
        return positions[:, 0].long()

    def token_types(self, input_ids: Any, config: Any) -> Any:
        """``[B, L]`` modality types of ``input_ids`` (what the processor returns as
        ``mm_token_type_ids``): 0 text, 1 image placeholder, 2 video placeholder, from the
        model config's ``image_token_id`` / ``video_token_id``."""
        return _token_types(
            input_ids,
            getattr(config, "image_token_id", None),
            getattr(config, "video_token_id", None),
        )


def media_parts(conversation: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The parts of ``kind`` (``image``, ``video``, ``audio``) of a conversation, in order."""
    return [
        part
        for message in conversation
        if isinstance(message.get("content"), list)
        for part in message["content"]
        if part.get("type") == kind or kind in part
    ]


def _token_types(input_ids: Any, image_id: int | None, video_id: int | None) -> Any:
    import torch

    types = torch.zeros_like(input_ids, dtype=torch.int)
    if image_id is not None:
        types[input_ids == image_id] = 1
    if video_id is not None:
        types[input_ids == video_id] = 2
    return types


def vision_tower(model: Any) -> Any:
    """The vision encoder module of a (possibly peft-wrapped) Qwen-VL model."""
    return submodule(model, "visual")


def rope_module(model: Any) -> Any:
    """The (possibly wrapped) model's module that owns ``get_rope_index``."""
    for module in model.modules():
        if hasattr(module, "get_rope_index"):
            return module
    raise AttributeError(f"{type(model).__name__} has no module with get_rope_index")


def reference_rope_index(
    module: Any,
    input_ids: Any,
    mm_token_type_ids: Any,
    image_grid_thw: Any = None,
    video_grid_thw: Any = None,
    second_per_grid_ts: Any = None,
    attention_mask: Any = None,
    **kwargs: Any,
) -> tuple[Any, Any]:
    """Qwen2-VL's and Qwen2.5-VL's mRoPE positions as their reference code computes them
    (Qwen's, transformers 4.x, vLLM), in place of transformers 5.x's ``get_rope_index``
    (installed on the model by :meth:`QwenVLFamily.load_model`; same signature and returns:
    ``[3, B, L]`` positions, 1 on padding, and ``[B, 1]`` deltas).

    Text advances all three axes; a media run of grid (t, h, w) merged by ``m`` gets
    ``(⌊k·Δ⌋, i, j) + start`` for frame step ``k``, row ``i``, column ``j`` (Δ = 1 for
    images and Qwen2-VL, ``second_per_grid_ts · tokens_per_second`` for Qwen2.5-VL videos),
    and whatever follows starts at the largest position so far + 1. transformers 5.x starts it
    at ``start + max(h, w)`` instead, ignoring the video's temporal extent, so after a video
    whose ``(t − 1)·Δ`` passes its height and width (sampled sparsely: 4 frames of a 9-s clip,
    Δ = 9) the next text sat *inside* the video's positions, and vLLM (reference) and the
    trainer disagreed by 0.15 in log-prob on the same tokens."""
    import torch

    config = module.config
    merge = int(config.vision_config.spatial_merge_size)
    per_second = getattr(config.vision_config, "tokens_per_second", None)
    images = iter([] if image_grid_thw is None else image_grid_thw.tolist())
    videos = iter([] if video_grid_thw is None else video_grid_thw.tolist())
    seconds = iter([] if second_per_grid_ts is None else second_per_grid_ts.tolist())
    B, L = input_ids.shape
    positions = torch.ones(3, B, L, dtype=torch.long, device=input_ids.device)
    deltas = []
    for b in range(B):
        keep = (
            attention_mask[b].bool()
            if attention_mask is not None
            else torch.ones(L, dtype=torch.bool, device=input_ids.device)
        )
        kinds = mm_token_type_ids[b][keep].tolist()
        pieces, start, i = [], 0, 0
        while i < len(kinds):
            if kinds[i] == 0:
                j = i
                while j < len(kinds) and kinds[j] == 0:
                    j += 1
                pieces.append(torch.arange(j - i).expand(3, -1) + start)
                start, i = start + j - i, j
                continue
            t, h, w = next(images if kinds[i] == 1 else videos)
            h, w = h // merge, w // merge
            step = 1.0
            if kinds[i] == 2 and per_second is not None:
                step = float(next(seconds, 1.0)) * float(per_second)
            frames = (torch.arange(t) * step).long()
            grid = torch.stack(
                [
                    frames.view(-1, 1, 1).expand(t, h, w),
                    torch.arange(h).view(1, -1, 1).expand(t, h, w),
                    torch.arange(w).view(1, 1, -1).expand(t, h, w),
                ]
            ).reshape(3, -1)
            pieces.append(grid + start)
            start, i = int(pieces[-1].max()) + 1, i + t * h * w
        row = torch.cat(pieces, dim=1) if pieces else torch.zeros(3, 0, dtype=torch.long)
        positions[:, b, keep] = row.to(positions.device)
        deltas.append(int(row.max()) + 1 - len(kinds) if len(kinds) else 0)
    return positions, torch.tensor(deltas, device=input_ids.device).unsqueeze(1)


def install_mm_token_type_hook(model: Any, token_types: Any) -> None:
    """Make the inner multimodal model derive ``mm_token_type_ids`` from ``input_ids`` with
    ``token_types(input_ids, config)`` when a caller passes media grids without it
    (transformers ≥ 5 would use 1-D positions)."""
    inner = None
    for module in model.modules():
        if hasattr(module, "get_rope_index") and hasattr(module, "compute_3d_position_ids"):
            inner = module
            break
    if inner is None:  # transformers < 5 computes positions from input_ids itself
        return
    if getattr(inner, "_mmrft_token_type_hook", False):
        return
    config = model.config

    def hook(module: Any, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        if kwargs.get("mm_token_type_ids") is not None or kwargs.get("position_ids") is not None:
            return args, kwargs
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        has_media = (
            kwargs.get("image_grid_thw") is not None or kwargs.get("video_grid_thw") is not None
        )
        if input_ids is None or not has_media:
            return args, kwargs
        kwargs["mm_token_type_ids"] = token_types(input_ids, config)
        return args, kwargs

    inner.register_forward_pre_hook(hook, with_kwargs=True)
    inner._mmrft_token_type_hook = True


def configure_vision_processor(processor: Any, family: Any, path: str) -> None:
    """Check the checkpoint's patch geometry against ``family`` (patch_size × merge_size) and
    apply its pixel budget to the image processor (and the per-frame cap to the video one)."""
    from mmrft.typecheck import ConfigError

    image_processor = processor.image_processor
    geometry = (
        getattr(image_processor, "patch_size", None),
        getattr(image_processor, "merge_size", None),
    )
    if geometry != (family.patch_size, family.merge_size):
        raise ConfigError(
            f"model.family: family '{family.name}' expects patch {family.patch_size} × merge "
            f"{family.merge_size}, but the processor in {path} has patch {geometry[0]} × merge "
            f"{geometry[1]}; is model.family right?"
        )
    set_pixel_budget(image_processor, family.media.min_pixels, family.media.max_pixels)
    video_processor = getattr(processor, "video_processor", None)
    if getattr(video_processor, "cap_pixels_per_frame", False) is None:
        # qwen-vl-utils' per-frame pixel cap (the reference behaviour; frames arrive resized
        # anyway, this only settles transformers' deprecation warning)
        video_processor.cap_pixels_per_frame = True


def set_pixel_budget(image_processor: Any, min_pixels: int, max_pixels: int) -> None:
    """Set a Qwen2-VL-style image processor's resize bounds (pixels of H·W)."""
    if min_pixels > max_pixels:
        raise ValueError(f"min_pixels ({min_pixels}) > max_pixels ({max_pixels})")
    size = getattr(image_processor, "size", None)
    if isinstance(size, dict) or size is None:
        image_processor.size = {"shortest_edge": min_pixels, "longest_edge": max_pixels}
    else:  # transformers ≥ 5: SizeDict
        image_processor.size = type(size)(shortest_edge=min_pixels, longest_edge=max_pixels)
    for attr, value in (("min_pixels", min_pixels), ("max_pixels", max_pixels)):
        if hasattr(image_processor, attr):  # transformers 4.x keeps these too
            setattr(image_processor, attr, value)


@model_family("qwen2_vl")
class Qwen2VL(QwenVLFamily):
    """Qwen2-VL: boxes as integers 0–1000 relative to the image; patch 14, merge 2."""

    model_types = ("qwen2_vl",)
    box_frame: ClassVar[BoxFrame] = "norm1000"
    box_instruction = one_box_instruction("norm1000")
    reference_positions: ClassVar[bool] = True


class RelativeBoxFamily(ModelFamily):
    """Base of the families that are not Qwen-VL but box as Qwen2-VL does, in integers 0–1000
    relative to the image itself whatever size or tiles the model sees it as, and whose images
    are checked as the Qwen-VL families check them (Gemma 3/4, InternVL)."""

    box_frame: ClassVar[BoxFrame] = "norm1000"
    box_instruction = Qwen2VL.box_instruction

    def input_size(self, width: int, height: int) -> tuple[int, int]:
        """The image's own size: boxes are 0–1000 relative to it, whatever the resizing or
        tiling."""
        return int(width), int(height)

    def check_media(self, sample: Sample) -> None:
        check_media(sample)


@model_family("qwen2_5_vl")
class Qwen25VL(QwenVLFamily):
    """Qwen2.5-VL: boxes in absolute pixels of the resized input; patch 14, merge 2."""

    model_types = ("qwen2_5_vl",)
    box_frame: ClassVar[BoxFrame] = "input_pixels"
    box_instruction = one_box_instruction("input_pixels")
    reference_positions: ClassVar[bool] = True


@model_family("qwen3_vl")
class Qwen3VL(QwenVLFamily):
    """Qwen3-VL: boxes as integers 0–1000 relative to the image; patch 16, merge 2.

    The processor wants video metadata (frame timestamps). DeepStack: the vision encoder's
    intermediate features are added to the first decoder layers' hidden states at the image
    tokens' positions; those lie in the prompt, so a packed row keeps them exact.
    """

    model_types = ("qwen3_vl", "qwen3_vl_moe")
    box_frame: ClassVar[BoxFrame] = "norm1000"
    box_instruction = Qwen2VL.box_instruction
    patch_size: ClassVar[int] = 16
    video_metadata: ClassVar[bool] = True

    def runs_per_item(self, grid_key: str, grid_row: Any) -> int:
        return int(grid_row[0]) if grid_key == "video_grid_thw" else 1


@model_family("qwen3_5")
class Qwen35(Qwen3VL):
    """Qwen3.5 (natively multimodal; ``qwen3_5`` dense and ``qwen3_5_moe``): Qwen3-VL's inputs
    (patch 16, merge 2, timestamped videos, interleaved mRoPE; no DeepStack) in front of a hybrid
    decoder of Gated DeltaNet linear-attention layers and gated full-attention layers (3 : 1).
    The linear layers carry a recurrent state and a causal convolution along the sequence, so
    the group-shared forward continues each completion from the prompt's cache instead of
    packing it behind a block mask (:func:`mmrft.policy.group.packing`).

    Boxes as Qwen3-VL: integers 0–1000 relative to the image (Qwen3.5 documents no box format
    of its own; it succeeds Qwen3-VL, whose cookbooks state "Qwen3-VL uses relative coordinates
    ranging from 0 to 1000").

    The chat template opens a think block in the generation prompt by default
    (``<think>\\n``); mmrft renders it with ``enable_thinking=False`` (an empty think block)
    so that the task's own format instruction decides whether and how the completion thinks,
    and the format verifier sees both tags in the completion.
    """

    model_types = ("qwen3_5", "qwen3_5_moe")
    chat_template_kwargs: ClassVar[dict[str, Any]] = {"enable_thinking": False}
