"""The model-family adapter API.

A model family (Qwen2-VL, Qwen2.5-VL, ...) knows how to load a checkpoint and its processor,
how to turn chat messages with media into model inputs with the family's own Hugging Face
processor and chat template, and which coordinate frame its boxes are written in:

* ``"norm1000"``: integers 0–1000 relative to the image (Qwen2-VL, Qwen3-VL, Qwen3.5,
  Qwen3-Omni, InternVL, GLM-4.1V, Gemma 3/4);
* ``"input_pixels"``: absolute pixels of the *resized* model input, whose sides are multiples
  of ``patch_size × merge_size`` (Qwen2.5-VL, Qwen2.5-Omni).

For the group-shared forward (:mod:`mmrft.policy.group`) a family also says where the prompt's tokens
sit (:meth:`ModelFamily.rope_positions`: 1-D, or Qwen's 3-D mRoPE) and, when the prompt is not
plain causal, how it attends (:meth:`ModelFamily.prompt_attention`, one mask per layer type
with :meth:`ModelFamily.attention_layers`: Gemma's bidirectional images and sliding windows).

Tasks keep ground truth in original-image pixels and ask the family for the input size
(:meth:`ModelFamily.input_size`), which :meth:`ModelFamily.annotate` stores in a sample's meta
as ``input_size`` (``[w, h]``) beside ``box_frame``, so verifiers convert predictions
explicitly and never mix frames.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from mmrft.config import ModelConfig, resolve_path
from mmrft.data import Sample
from mmrft.plugins import MODEL_FAMILIES
from mmrft.typecheck import ConfigError

log = logging.getLogger(__name__)

BoxFrame = Literal["norm1000", "input_pixels", "norm1", "pixels"]
Conversation = list[dict[str, Any]]
"""One chat: its messages, each ``{"role", "content"}`` with the content a string or a list of
text and media parts."""
DTYPES = ("float32", "bfloat16", "float16", "auto")
FRAME_PHRASES: dict[str, str] = {
    "norm1000": "with coordinates normalised to integers from 0 to 1000 relative to the image "
    "width and height",
    "input_pixels": "in pixel coordinates of the image",
    "norm1": "with coordinates normalised to 0–1 relative to the image width and height",
    "pixels": "in pixel coordinates of the image",
}
"""How a prompt describes each box frame (:func:`one_box_instruction`, and the detection
task's list of boxes)."""


def unexpanded_ids(processor: Any, text: str) -> list[int]:
    """``text`` (chat-template text, one placeholder per medium) tokenised without expanding
    its placeholders: what a rollout engine is sent, whose own processor expands them
    (:func:`mmrft.rollout.vllm.engine_prompt_ids`)."""
    tokenizer = getattr(processor, "tokenizer", processor)
    return list(tokenizer.encode(text, add_special_tokens=False))


def cat_padded(tensors: list[Any]) -> Any:
    """``torch.cat`` along dim 0 of media tensors whose other dims may differ, each right-padded
    with zeros to the largest: audio features padded to different frame counts by different
    processor calls (Qwen3-Omni pads a batch to its longest clip), with their frame masks (0:
    no frame). The models read only the frames their masks mark, so the padding is invisible
    to them; tensors of equal shapes are concatenated as they are."""
    import torch

    shape = [max(t.shape[d] for t in tensors) for d in range(1, tensors[0].dim())]
    padded = []
    for t in tensors:
        if list(t.shape[1:]) != shape:
            out = t.new_zeros((t.shape[0], *shape))
            out[(slice(None), *(slice(0, n) for n in t.shape[1:]))] = t
            t = out
        padded.append(t)
    return torch.cat(padded)


def one_box_instruction(frame: str) -> str:
    """The prompt phrase asking for one box in ``frame``: ``Output the box as JSON {"bbox_2d":
    [x1, y1, x2, y2]}`` and the frame's :data:`FRAME_PHRASES` entry."""
    return f'Output the box as JSON {{"bbox_2d": [x1, y1, x2, y2]}} {FRAME_PHRASES[frame]}.'


TOOLS_ROLE = "tools"
"""The role of a conversation's first message ``{"role": "tools", "content": "", "tools":
[schemas]}`` that
carries tool descriptions for a chat template that writes them itself (``tools=``):
:meth:`ModelFamily.render` hands them to the template and renders the rest."""


@dataclass(frozen=True)
class MediaBudget:
    """Per-image pixel budget handed to the processor.

    Attributes:
        min_pixels: lower bound on resized H·W (pixels); images are upscaled to reach it.
        max_pixels: upper bound on resized H·W (pixels); the papers use 401408 = 512·28·28.
    """

    min_pixels: int = 3136
    max_pixels: int = 401408


class ModelFamily:
    """Base class of model-family adapters.

    Class attributes:
        name: registry name (set by ``@model_family``).
        model_types: the ``config.model_type`` values of checkpoints this family loads.
        box_frame: the frame the family's boxes are written in (see the module docstring).
        box_instruction: the prompt phrase that asks for one box in that frame.
        chat_template_kwargs: extra variables the chat template is rendered with.
    """

    name: ClassVar[str] = ""
    model_types: ClassVar[tuple[str, ...]] = ()
    # The processor class a checkpoint of the family carries ("": not checked).
    processor_class: ClassVar[str] = ""
    # Extra variables of the chat template (Qwen3.5: enable_thinking).
    chat_template_kwargs: ClassVar[dict[str, Any]] = {}
    box_frame: ClassVar[BoxFrame] = "input_pixels"
    box_instruction: ClassVar[str] = ""

    def __init__(self, media: MediaBudget | None = None) -> None:
        self.media = media or MediaBudget()

    def load_model(
        self, path: str, dtype: str = "float32", attn_implementation: str | None = None
    ) -> Any:
        """The checkpoint with ``AutoModelForImageTextToText`` (:meth:`load_checkpoint`)."""
        return self.load_checkpoint(path, dtype, attn_implementation)

    def load_processor(self, path: str) -> Any:
        """``AutoProcessor``, checked to be :attr:`processor_class` when the family names one,
        with left padding (prompts are left-padded, completions continue on the right)."""
        from transformers import AutoProcessor

        from mmrft.typecheck import ConfigError

        processor = AutoProcessor.from_pretrained(path)
        if self.processor_class and type(processor).__name__ != self.processor_class:
            raise ConfigError(
                f"model.family: family '{self.name}' needs a {self.processor_class}, but {path} "
                f"has a {type(processor).__name__}; is model.family right?"
            )
        processor.tokenizer.padding_side = "left"
        return processor

    def load_checkpoint(
        self,
        path: str,
        dtype: str,
        attn_implementation: str | None,
        class_name: str = "AutoModelForImageTextToText",
    ) -> Any:
        """``transformers.<class_name>.from_pretrained(path)`` in ``dtype`` (a name of
        :data:`DTYPES`), after checking that the checkpoint's ``model_type`` is one of
        :attr:`model_types` (a wrong family would write boxes in the wrong frame)."""
        import torch
        import transformers
        from transformers import AutoConfig

        from mmrft.typecheck import ConfigError

        if dtype not in DTYPES:
            raise ConfigError(f"model.dtype: '{dtype}' is not one of {', '.join(DTYPES)}")
        model_type = AutoConfig.from_pretrained(path).model_type
        if model_type not in self.model_types:
            raise ConfigError(
                f"model.family: family '{self.name}' loads model_type "
                f"{', '.join(self.model_types)}, but {path} has model_type '{model_type}' "
                f"(its box frame may differ); set model.family to match or 'auto'"
            )
        kwargs: dict[str, Any] = {"dtype": dtype if dtype == "auto" else getattr(torch, dtype)}
        if attn_implementation:
            from mmrft.models.attention import transformers_name

            kwargs["attn_implementation"] = transformers_name(attn_implementation)
        return getattr(transformers, class_name).from_pretrained(path, **kwargs)

    def prepare(
        self, processor: Any, conversations: list[Conversation], add_generation_prompt: bool = True
    ) -> Any:
        """Tokenise a batch of conversations with their media: a ``BatchFeature`` with
        ``input_ids`` and ``attention_mask`` left-padded, plus the family's media tensors
        (:meth:`process` of the chat template's :meth:`render`)."""
        texts = self.render(processor, conversations, add_generation_prompt)
        return self.process(processor, texts, conversations)

    def process(self, processor: Any, texts: list[str], conversations: list[Conversation]) -> Any:
        """Tokenise ``texts`` (chat-template text, one per conversation, holding one
        placeholder per media part) with the media parts of ``conversations``, loaded by the
        family's budgets: :meth:`prepare`'s ``BatchFeature``."""
        raise NotImplementedError(f"model family '{self.name}' does not tokenise media")

    def render(
        self, processor: Any, conversations: list[Conversation], add_generation_prompt: bool
    ) -> list[str]:
        """The prompt texts of ``conversations`` from the processor's chat template, with the
        family's :attr:`chat_template_kwargs`; a conversation that opens with a
        :data:`TOOLS_ROLE` message is rendered with its ``tools`` as the template's ``tools=``
        (the message itself is not rendered)."""
        if not conversations:
            raise ValueError("prepare() needs at least one conversation")
        texts = []
        for conv in conversations:
            kwargs = dict(self.chat_template_kwargs)
            if conv and conv[0].get("role") == TOOLS_ROLE:
                kwargs["tools"] = conv[0]["tools"]
                conv = conv[1:]
            texts.append(
                processor.apply_chat_template(
                    conv, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
                )
            )
        return texts

    def observation_row(self, processor: Any, text: str, parts: list[dict[str, Any]]) -> dict:
        """One prepared row (:meth:`split_rows`) of ``text``, a chat-template fragment holding
        one placeholder block per media part of ``parts`` (chat content parts: PIL images,
        frame-list videos, audio clips), with those media loaded by the family's budgets
        (:meth:`process`): a tool's observation, tokenised alone and appended to a trajectory
        (:mod:`mmrft.rollout.tool_loop`)."""
        batch = self.process(processor, [text], [[{"role": "user", "content": parts}]])
        row = self.split_rows(batch, processor)[0]
        row["engine_ids"] = unexpanded_ids(processor, text)
        return row

    def input_size(self, width: int, height: int) -> tuple[int, int]:
        """(w, h) in pixels of the image as the model sees it after resizing."""
        raise NotImplementedError

    def check_media(self, sample: Sample) -> None:
        """Load every media file of ``sample`` once; raise ``DataError`` naming a missing or
        corrupt file (the dataset reader skips and counts it under ``data.on_error=skip``)."""
        raise NotImplementedError

    def suppress_token_ids(self, processor: Any) -> list[int]:
        """Token ids generation must never produce (media placeholders); none by default."""
        return []

    def engine_processor_kwargs(self) -> dict[str, Any]:
        """Processor settings a separate rollout engine (vLLM) needs to process media as
        :meth:`prepare` does (e.g. the pixel budget); none by default."""
        return {}

    def engine_inputs(
        self, processor: Any, conversations: list[Conversation]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """``(rows, requests)``: the trainer's prepared prompt rows (:meth:`split_rows` of
        :meth:`prepare`) and one engine request per conversation (``{"prompt": text,
        "multi_modal_data": {...}}``) carrying the same media as loaded for the rows."""
        raise NotImplementedError(f"model family '{self.name}' has no rollout-engine inputs")

    def vision_tower(self, model: Any) -> Any:
        """The vision (or audio) encoder module, frozen by ``model.freeze_vision``."""
        raise NotImplementedError

    def vision_parameters(self, model: Any) -> list[Any]:
        return list(self.vision_tower(model).parameters())

    # Media tensors of a batch, each with the grid tensor that says how many of its rows belong
    # to each image/video (Qwen-style flattened patches). Families with other layouts override
    # split_rows / collate_rows.
    media_keys: ClassVar[dict[str, str]] = {
        "pixel_values": "image_grid_thw",
        "pixel_values_videos": "video_grid_thw",
    }
    # Per-token tensors aligned with input_ids (Qwen-VL: which tokens are image/video
    # placeholders; without it transformers silently skips mRoPE, so the trainer must pass it
    # exactly as generate() got it). Completion tokens get 0.
    token_keys: ClassVar[tuple[str, ...]] = ("mm_token_type_ids",)
    # The placeholder token that stands for each image (video) in the prompt; one contiguous
    # run of it per image.
    media_tokens: ClassVar[dict[str, str]] = {
        "image_grid_thw": "<|image_pad|>",
        "video_grid_thw": "<|video_pad|>",
    }

    def split_rows(self, batch: Any, processor: Any) -> list[dict[str, Any]]:
        """Split prepared prompt inputs into one dict per conversation, padding removed.

        Each row holds ``input_ids`` (1-D, no padding) and, per media key, the patch rows and
        grid rows of that conversation's images/videos, so that micro-batches can be re-collated
        in any order without re-running the processor.
        """
        import torch

        input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]
        rows: list[dict[str, Any]] = [
            {"input_ids": ids[mask.bool()].clone()} for ids, mask in zip(input_ids, attention_mask)
        ]
        for key in self.token_keys:
            if batch.get(key) is not None:
                for row, values, mask in zip(rows, batch[key], attention_mask):
                    row[key] = values[mask.bool()].clone()
        for values_key, grid_key in self.media_keys.items():
            if batch.get(values_key) is None:
                continue
            grids, values = batch[grid_key], batch[values_key]
            token_id = processor.tokenizer.convert_tokens_to_ids(self.media_tokens[grid_key])
            counts = [
                count_runs(ids[mask.bool()], token_id)
                for ids, mask in zip(input_ids, attention_mask)
            ]
            patch_counts = grids.prod(dim=-1).tolist()
            grid_pos = value_pos = 0
            for row, n in zip(rows, counts):
                n_patches = int(sum(patch_counts[grid_pos : grid_pos + n]))
                row[grid_key] = grids[grid_pos : grid_pos + n].clone()
                row[values_key] = values[value_pos : value_pos + n_patches].clone()
                grid_pos += n
                value_pos += n_patches
            if grid_pos != len(grids) or value_pos != len(values):
                raise RuntimeError(f"could not split {values_key}: media counts do not add up")
        for row in rows:
            row["input_ids"] = torch.as_tensor(row["input_ids"])
        return rows

    def collate_rows(self, rows: list[dict[str, Any]], pad_token_id: int) -> dict[str, Any]:
        """Left-pad ``input_ids`` of the rows and concatenate their media tensors."""
        import torch

        length = max(len(r["input_ids"]) for r in rows)
        ids = torch.full((len(rows), length), pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), length), dtype=torch.long)
        for i, row in enumerate(rows):
            n = len(row["input_ids"])
            ids[i, length - n :] = row["input_ids"]
            mask[i, length - n :] = 1
        out: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
        for key in self.token_keys:
            if key in rows[0]:
                values = torch.zeros((len(rows), length), dtype=rows[0][key].dtype)
                for i, row in enumerate(rows):
                    values[i, length - len(row[key]) :] = row[key]
                out[key] = values
        for values_key, grid_key in self.media_keys.items():
            present = [r for r in rows if values_key in r and len(r[grid_key])]
            if present:
                out[values_key] = cat_padded([r[values_key] for r in present])
                out[grid_key] = cat_padded([r[grid_key] for r in present])
        return out

    def rope_positions(self, model: Any, row: dict[str, Any]) -> Any:
        """Rotary positions of a prepared prompt row's tokens, ``[D, Lp]`` (long): ``D = 1``
        for 1-D RoPE (``0 … Lp − 1``, this default), ``D = 3`` for multimodal RoPE (temporal,
        height, width). A completion token ``t`` of the prompt continues at
        ``positions.max() + 1 + t`` on every axis (:mod:`mmrft.policy.group`), so these are the
        positions generation and the training forward give the prompt."""
        import torch

        return torch.arange(len(row["input_ids"]), dtype=torch.long)[None]

    def prompt_attention(self, model: Any, row: dict[str, Any]) -> Any:
        """``[Lp, Lp]`` bool: which tokens of a prepared prompt row each of its tokens attends
        to, when that is not plain causal (``None``, this default). Gemma: causal, plus
        bidirectional among the tokens of each image. :mod:`mmrft.policy.group` and the hf engine's
        prefill use it for the prompt block; completion tokens attend to the whole prompt and
        causally to their own completion, plus bidirectionally within the runs of
        :meth:`bidirectional_tokens` of a tool observation's media."""
        return None

    def bidirectional_tokens(self, model: Any, token_types: Any) -> Any:
        """``[L]`` bool of a row's per-token types (``token_keys[0]``): the tokens that attend
        bidirectionally to the others of their run of consecutive such tokens (Gemma: one
        image's soft tokens); ``None`` (this default): none, the row is causal."""
        return None

    def attention_layers(self, model: Any) -> dict[str, int | None] | None:
        """For a model that takes one attention mask per layer type (a dict keyed by the names
        in its config's ``layer_types``): each type's sliding window in tokens (``None``: full
        attention). ``None`` (this default): one mask for every layer. A query at position
        ``q`` sees a key at ``k`` of a sliding layer only when ``q − k < window``, positions
        being the rotary (text) positions, so a packed completion that restarts after the
        prompt sees exactly the keys it sees in its own sequence."""
        return None

    def annotate(self, sample: Sample) -> None:
        """Store ``box_frame`` and, for the first image, ``input_size`` in ``sample.meta``."""
        sample.meta["box_frame"] = self.box_frame
        size = sample.meta.get("image_size")
        if size is not None:
            sample.meta["input_size"] = list(self.input_size(int(size[0]), int(size[1])))


def base_model(model: Any) -> Any:
    """The transformers model under a peft wrapper (the model itself otherwise)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def submodule(model: Any, name: str) -> Any:
    """``model.model.<name>`` or ``model.<name>`` of a (possibly peft-wrapped) model: where
    transformers keeps an encoder (``visual``, ``vision_tower``, ``audio_tower``)."""
    base = base_model(model)
    for owner in (getattr(base, "model", None), base):
        found = getattr(owner, name, None)
        if found is not None:
            return found
    raise AttributeError(f"{type(base).__name__} has no {name} ('model.{name}' or '{name}')")


def mask_positions(kwargs: dict[str, Any]) -> None:
    """Set ``kwargs["position_ids"]`` to ``cumsum(attention_mask) − 1`` (0 on padding), the
    positions ``generate`` gives a left-padded batch, when a forward's caller passes none, the
    mask is 2-D and no cache is filled. For models whose forward counts positions from the
    first column instead (Qwen2-Audio, Gemma 4), so that a left-padded training forward sees
    the positions of its unpadded sequence."""
    if kwargs.get("position_ids") is not None:
        return
    mask = kwargs.get("attention_mask")
    cache = kwargs.get("cache", kwargs.get("past_key_values"))  # its name in either version
    if mask is None or not hasattr(mask, "dim") or mask.dim() != 2:
        return
    if cache is not None and cache.get_seq_length() > 0:
        return
    positions = mask.long().cumsum(-1) - 1
    kwargs["position_ids"] = positions.masked_fill(mask == 0, 0)


def install_mask_positions(module: Any) -> None:
    """Run :func:`mask_positions` before every forward of ``module`` (a pre-hook)."""

    def hook(_: Any, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        mask_positions(kwargs)
        return args, kwargs

    module.register_forward_pre_hook(hook, with_kwargs=True)


def count_runs(ids: Any, token_id: int) -> int:
    """Number of maximal runs of ``token_id`` in a 1-D id tensor (= number of images)."""
    hits = (ids == token_id).long()
    if hits.numel() == 0:
        return 0
    starts = hits[1:] > hits[:-1]
    return int(hits[0].item()) + int(starts.sum().item())


def model_family(name: str) -> Callable[[type[ModelFamily]], type[ModelFamily]]:
    """Register a :class:`ModelFamily` subclass under ``name``."""
    return MODEL_FAMILIES.named(name)


def family_for_model_type(model_type: str) -> type[ModelFamily]:
    """The registered family whose ``model_types`` contain ``model_type``."""
    for name in MODEL_FAMILIES.names():
        cls = MODEL_FAMILIES.get(name)
        if model_type in cls.model_types:
            return cls
    known = {t: n for n in MODEL_FAMILIES.names() for t in MODEL_FAMILIES.get(n).model_types}
    raise KeyError(
        f"no model family handles model_type '{model_type}'; known: "
        + ", ".join(f"{t} ({n})" for t, n in sorted(known.items()))
    )


@contextmanager
def no_weight_bars() -> Iterator[None]:
    """Without transformers' own ``Loading weights`` and ``Writing model shards`` progress bars
    (mmrft's console says what loads and saves); the hub's download bars stay as they were, and
    transformers' setting is restored after the block."""
    from huggingface_hub.utils import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hub_disabled = are_progress_bars_disabled()
    hf_logging.disable_progress_bar()  # also turns the hub's bars off: back on for downloads
    if not hub_disabled:
        enable_progress_bars()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()  # the hub's too: as they were before
        if hub_disabled:
            disable_progress_bars()


def build_family(cls: type[ModelFamily], cfg: ModelConfig) -> ModelFamily:
    """Instantiate a family with the budgets its constructor takes (media, video, audio)."""
    import inspect

    from mmrft.data.video import VideoBudget

    accepted = inspect.signature(cls.__init__).parameters
    kwargs: dict[str, Any] = {
        "media": MediaBudget(min_pixels=cfg.min_pixels, max_pixels=cfg.max_pixels)
    }
    if "video" in accepted:
        kwargs["video"] = VideoBudget(**dataclasses.asdict(cfg.video))
    if "audio" in accepted:
        from mmrft.data.audio import AudioBudget

        kwargs["audio"] = AudioBudget(max_seconds=cfg.audio.max_seconds, policy=cfg.audio.policy)
    return cls(**kwargs)


def resolve_family(cfg: ModelConfig) -> ModelFamily:
    """The family adapter named by ``model.family`` or found from config.json's model_type."""
    if cfg.family != "auto":
        try:
            return build_family(MODEL_FAMILIES.get(cfg.family), cfg)
        except KeyError as exc:
            raise ConfigError(f"model.family: {exc}") from None
    folder = resolve_path(cfg.path)
    config_file = folder / "config.json"
    if config_file.is_file():
        model_type = json.loads(config_file.read_text())["model_type"]
    elif folder.is_dir():  # a local folder that is not a checkpoint: say what it is
        from mmrft.runtime.checkpoint import list_checkpoints

        found = list_checkpoints(folder / "checkpoints")
        hint = (
            f"it is a run folder; give one of its checkpoints, e.g. model.path={found[-1]}"
            if found
            else "a checkpoint folder holds config.json and the weights"
        )
        raise ConfigError(f"model.path: {folder} has no config.json: {hint}")
    else:  # a hub id such as Qwen/Qwen2.5-VL-3B-Instruct (needs the hub or its local cache)
        # huggingface_hub alone (config.json), not transformers' AutoConfig: the check runs
        # before the heavy imports of a run (mmrft.rollout.preflight)
        from huggingface_hub import hf_hub_download

        offline = go_offline_if_unreachable()
        try:
            model_type = json.loads(Path(hf_hub_download(cfg.path, "config.json")).read_text())[
                "model_type"
            ]
        except Exception as exc:  # not cached offline, no such repository, an invalid id
            if offline:
                raise ConfigError(
                    f"model.path: '{cfg.path}' is not a local folder, {offline}, and it is not "
                    "in the Hugging Face cache: download it where the hub is reachable "
                    f"(`hf download {cfg.path}`) or give a local checkpoint folder"
                ) from None
            raise ConfigError(
                f"model.path: '{cfg.path}' is neither a checkpoint directory nor a loadable "
                f"hub id ({' '.join(str(exc).split())})"
            ) from None
    try:
        return build_family(family_for_model_type(model_type), cfg)
    except KeyError as exc:
        raise ConfigError(f"model.family: {exc}; set model.family explicitly") from None


def go_offline_if_unreachable(timeout_s: float = 3.0) -> str:
    """Whether the Hugging Face hub can be used, asked once with one TCP connection of at
    most ``timeout_s`` seconds to its endpoint; when it cannot, the hub's offline mode is
    turned on for this process (``HF_HUB_OFFLINE``), so hub ids load from the local cache at
    once instead of after the client's retries (about 25 s per file). Returns why the hub is
    not used (``"the hub is unreachable (…)"``, ``"HF_HUB_OFFLINE is set"``), or ``""``
    when it is reachable."""
    import os
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    if constants.is_offline_mode():
        return "HF_HUB_OFFLINE is set"
    url = urlparse(constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=timeout_s).close()
        return ""
    except OSError as exc:
        reason = f"the hub is unreachable ({url.hostname}:{port}: {exc.strerror or exc})"
    # huggingface_hub reads HF_HUB_OFFLINE at import: set both, for this process and children
    os.environ["HF_HUB_OFFLINE"] = "1"
    constants.HF_HUB_OFFLINE = True
    log.warning("%s: loading hub ids from the local cache only", reason)
    return reason
