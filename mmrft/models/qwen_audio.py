"""Model-family adapters for Qwen2-Audio and the Qwen2.5-Omni thinker.

* ``qwen2_audio``: ``Qwen2AudioForConditionalGeneration`` + ``Qwen2AudioProcessor`` (Whisper
  log-mel front end, Whisper-style encoder, Qwen2 decoder with 1-D RoPE). Audio and text only;
  R1-AQA's model.
* ``qwen2_5_omni``: the Qwen2.5-Omni *thinker* (``Qwen2_5OmniThinkerForConditionalGeneration``
  + ``Qwen2_5OmniProcessor``): audio encoder, Qwen2.5-VL's vision encoder, and a decoder with
  TMRoPE (3-D positions computed inside the model from ``input_ids`` and the media grids; no
  ``mm_token_type_ids``). Images, videos and audio; Omni-R1's model. The talker (speech output)
  is never loaded. Both ``model_type`` ``qwen2_5_omni`` (the released checkpoints: thinker +
  talker + token2wav) and ``qwen2_5_omni_thinker`` (what mmrft saves) load. Boxes are in
  Qwen2.5-VL's frame, ``input_pixels``: absolute pixels of the resized input image
  (``image_grid_thw × 14``).

Audio parts are ``{"type": "audio", "audio": "/abs/path.wav"}`` (``audio_url`` is accepted as the
key too; ``file://`` paths work; a numpy array is taken as a mono waveform already at the model's
rate). Each file is read with :func:`mmrft.data.audio.load_audio` at the feature extractor's
``sampling_rate`` (16 000 Hz), mixed to mono, cached, and bounded by the family's
:class:`AudioBudget` (seconds; "truncate" or "error"). The bound in effect is the smaller of the
budget and the feature extractor's window (``chunk_length``: 30 s for the released models), since
the processor pads every clip to that window and would silently cut anything longer. URLs are not
fetched (mmrft runs offline): download the file first.

Tensors of a prepared batch (:meth:`QwenAudioFamily.prepare`): ``input_ids`` /
``attention_mask`` ``[B, L]`` left-padded; per audio in prompt order ``input_features``
``[#audios, mel_bins, window_frames]`` (log-mel, padded to the window) and
``feature_attention_mask`` ``[#audios, window_frames]`` (1 on real frames, 100 per second); one
``<|AUDIO|>`` token per 40 ms: ``((frames − 1) // 2 + 1 − 2) // 2 + 1`` tokens per clip.
Omni adds ``pixel_values`` + ``image_grid_thw`` and ``pixel_values_videos`` + ``video_grid_thw`` +
``video_second_per_grid`` (seconds per temporal patch, one per video) as Qwen2.5-VL does; its
videos follow ``model.video`` (:class:`~mmrft.data.video.VideoBudget`) like the VL families', with the
audio tokens counted against ``max_prompt_tokens``. Videos' own audio tracks are not used (``use_audio_in_video`` stays off: it needs torchcodec's
audio decoding); give the track as a separate audio part instead.

Trainer parity. ``completion_logps`` (mmrft.policy) calls the model with ``logits_to_keep``,
which neither model's ``forward`` takes (it would be dropped silently and every position
projected); :meth:`QwenAudioFamily.load_model` installs hooks that honour it on the vocabulary
projection. Qwen2-Audio's forward derives no positions from ``attention_mask`` while
``generate`` does (``cumsum − 1``); the hook derives them the same way when a caller passes none,
so a left-padded training forward sees the positions the sampler saw. ``input_features`` is
listed in :attr:`media_keys` (with ``feature_attention_mask`` as its "grid"), so the trainer's
dtype cast of media values covers it and ``collate_rows`` concatenates audio rows.
"""

from __future__ import annotations

import logging
import math
import threading
from typing import Any, ClassVar

import numpy as np

from mmrft.data import DataError, Sample, media_file_key
from mmrft.data.audio import AudioBudget, decode_audio, load_audio
from mmrft.data.video import VideoBudget
from mmrft.models import qwen_vl
from mmrft.models.family import (
    BoxFrame,
    Conversation,
    MediaBudget,
    ModelFamily,
    count_runs,
    mask_positions,
    model_family,
    submodule,
    unexpanded_ids,
)
from mmrft.models.qwen_vl import Qwen25VL, QwenVLFamily

log = logging.getLogger(__name__)

AUDIO_TOKEN = "<|AUDIO|>"
QWEN2_AUDIO_SPECIAL_TOKENS = ("<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>")
QWEN2_5_OMNI_SPECIAL_TOKENS = (
    "<|AUDIO|>",
    "<|audio_bos|>",
    "<|audio_eos|>",
    "<|vision_bos|>",
    "<|vision_eos|>",
    "<|vision_pad|>",
    "<|IMAGE|>",
    "<|VIDEO|>",
)


def is_audio_part(part: dict[str, Any]) -> bool:
    """Whether a content part is audio (``type`` ``audio`` or an ``audio``/``audio_url`` key)."""
    return part.get("type") == "audio" or "audio" in part or "audio_url" in part


def audio_parts(conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The audio parts of a conversation, in order."""
    return [
        part
        for message in conversation
        if isinstance(message.get("content"), list)
        for part in message["content"]
        if isinstance(part, dict) and is_audio_part(part)
    ]


def audio_token_count(frames: Any) -> Any:
    """``<|AUDIO|>`` tokens of a clip of ``frames`` mel frames (10 ms each): two stride-2
    reductions, ``((frames − 1) // 2 + 1 − 2) // 2 + 1`` (25 tokens per second)."""
    return ((frames - 1) // 2 + 1 - 2) // 2 + 1


def run_lengths(ids: Any, token_id: int) -> list[int]:
    """Lengths of the maximal runs of ``token_id`` in a 1-D id tensor, in order."""
    hits = (ids == token_id).tolist()
    lengths: list[int] = []
    previous = False
    for hit in hits:
        if hit and previous:
            lengths[-1] += 1
        elif hit:
            lengths.append(1)
        previous = hit
    return lengths


# -- check_media ---------------------------------------------------------------------------------
_durations: dict[tuple[str, int, int], float] = {}
_durations_lock = threading.Lock()


def _local_audio_path(source: Any) -> str | None:
    if not isinstance(source, str):
        return None
    if source.startswith("file://"):
        return source[len("file://") :]
    if "://" in source or source.startswith("data:"):
        return None
    return source


def check_media(sample: Sample, max_seconds: float | None = None) -> None:
    """Check a sample's media once; raise DataError naming a missing or unreadable file.

    Images and videos as :func:`mmrft.models.qwen_vl.check_media`. Each local audio file is
    decoded once per process (same path, mtime and size are not decoded again): a missing file,
    an unknown format, a corrupt or empty file raises. With ``max_seconds`` (seconds), a longer
    clip raises too (the ``"error"`` budget policy). The duration (seconds) of the first audio is
    stored as ``sample.meta["audio_duration"]`` when absent. URLs are not fetched.
    """
    qwen_vl.check_media(sample)
    first: float | None = None
    for part in audio_parts(sample.messages):
        source = part.get("audio", part.get("audio_url"))
        path = _local_audio_path(source)
        if path is None:
            continue
        key = media_file_key(path, "audio file")
        with _durations_lock:
            seconds = _durations.get(key)
        if seconds is None:
            waveform, rate = decode_audio(path)
            seconds = waveform.size / rate
            with _durations_lock:
                _durations[key] = seconds
        if max_seconds is not None and seconds > max_seconds:
            raise DataError(
                f"{path}: audio is {seconds:.2f} s, longer than the {max_seconds:g} s limit"
            )
        if first is None:
            first = seconds
    if first is not None and "audio_duration" not in sample.meta:
        sample.meta["audio_duration"] = round(first, 6)


# -- model hooks ---------------------------------------------------------------------------------
def install_forward_hooks(model: Any, positions_from_mask: bool) -> None:
    """Make ``model(..., logits_to_keep=k)`` project only the last ``k`` positions, and (with
    ``positions_from_mask``) derive 1-D ``position_ids`` from ``attention_mask`` as ``generate``
    does when a caller passes none and no cache is filled.

    The hooks sit on the inner model (``model.model``, called through ``__call__`` by the outer
    forward, so they also run under peft, which calls ``forward`` of the outer model directly)
    and on ``lm_head``.
    """
    import torch

    inner = getattr(model, "model", None)
    head = getattr(model, "lm_head", None)
    if inner is None or head is None or getattr(inner, "_mmrft_audio_hooks", False):
        return
    state: dict[str, Any] = {"keep": None}

    def inner_hook(module: Any, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict]:
        state["keep"] = kwargs.pop("logits_to_keep", None)
        if positions_from_mask:
            mask_positions(kwargs)
        return args, kwargs

    def head_hook(module: Any, args: tuple) -> tuple | None:
        keep = state["keep"]
        if keep is None or (isinstance(keep, int) and keep == 0):
            return None
        hidden = args[0]
        if isinstance(keep, torch.Tensor):
            return (hidden[:, keep, :], *args[1:])
        return (hidden[:, -int(keep) :, :], *args[1:])

    inner.register_forward_pre_hook(inner_hook, with_kwargs=True)
    head.register_forward_pre_hook(head_hook)
    inner._mmrft_audio_hooks = True


# -- the adapters --------------------------------------------------------------------------------
class QwenAudioFamily(ModelFamily):
    """Shared implementation of the audio families (see the module docstring).

    Class attributes:
        model_class: the transformers class that loads the checkpoint.
        processor_class: the processor class the checkpoint must carry.
        special_tokens: placeholder tokens generation must never produce.
        positions_from_mask: whether the model needs 1-D positions derived from the mask.
    """

    model_class: ClassVar[str] = ""
    special_tokens: ClassVar[tuple[str, ...]] = QWEN2_AUDIO_SPECIAL_TOKENS
    positions_from_mask: ClassVar[bool] = False
    audio_token: ClassVar[str] = AUDIO_TOKEN
    token_keys: ClassVar[tuple[str, ...]] = ()
    # Audio rows: input_features with feature_attention_mask as its "grid" (one row per clip),
    # so ModelFamily.collate_rows concatenates them and the trainer casts their dtype.
    media_keys: ClassVar[dict[str, str]] = {"input_features": "feature_attention_mask"}

    def __init__(self, media: MediaBudget | None = None, audio: AudioBudget | None = None) -> None:
        super().__init__(media)
        self.audio = audio or AudioBudget()
        self.window: float | None = None  # the processor's window (s), once one was loaded

    # -- loading ---------------------------------------------------------------------------------
    def load_model(
        self, path: str, dtype: str = "float32", attn_implementation: str | None = None
    ) -> Any:
        """Load :attr:`model_class` (:meth:`ModelFamily.load_checkpoint`); install the
        ``logits_to_keep`` / positions hooks (see the module docstring)."""
        model = self.load_checkpoint(path, dtype, attn_implementation, self.model_class)
        install_forward_hooks(model, self.positions_from_mask)
        return model

    def load_processor(self, path: str) -> Any:
        """:meth:`ModelFamily.load_processor` (checked to be :attr:`processor_class`, left
        padding); the feature extractor's window is remembered for :meth:`check_media`."""
        processor = super().load_processor(path)
        self.window = self.window_seconds(processor)
        return processor

    # -- audio ---------------------------------------------------------------------------------
    @staticmethod
    def window_seconds(processor: Any) -> float:
        """The feature extractor's window in seconds (clips are padded to it; longer are cut)."""
        extractor = processor.feature_extractor
        return float(extractor.n_samples) / float(extractor.sampling_rate)

    def max_audio_seconds(self, processor: Any) -> float:
        """The clip bound in effect (seconds): the budget, capped by the processor's window."""
        window = self.window_seconds(processor)
        budget = self.audio.max_seconds
        return window if budget is None else min(budget, window)

    def load_audio(self, source: Any, processor: Any) -> np.ndarray:
        """One clip as a mono float32 waveform at the processor's rate, within the budget."""
        rate = int(processor.feature_extractor.sampling_rate)
        limit = self.max_audio_seconds(processor)
        if isinstance(source, np.ndarray):
            if source.ndim != 1 or source.size == 0:
                raise DataError(f"an audio array must be 1-D and non-empty, got {source.shape}")
            waveform = source.astype(np.float32, copy=False)
            cap = math.floor(limit * rate)
            if waveform.size > cap:
                if self.audio.policy == "error":
                    raise DataError(
                        f"an audio array of {waveform.size / rate:.2f} s is longer than the "
                        f"{limit:g} s limit"
                    )
                waveform = waveform[:cap]
            return waveform
        path = _local_audio_path(source)
        if path is None:
            raise DataError(
                f"{source}: audio URLs are not fetched (mmrft runs offline); download the file "
                "and give its path"
            )
        return load_audio(path, rate, max_seconds=limit, policy=self.audio.policy)

    def _audios(self, conversation: list[dict[str, Any]], processor: Any) -> list[np.ndarray]:
        out = []
        for part in audio_parts(conversation):
            source = part.get("audio", part.get("audio_url"))
            if source is None:
                raise DataError(f"an audio part without 'audio' (path): {part}")
            out.append(self.load_audio(source, processor))
        return out

    def audio_tokens(self, frames: Any) -> Any:
        """Audio placeholder tokens of clips of ``frames`` mel frames (:func:`audio_token_count`)."""
        return audio_token_count(frames)

    def observation_row(self, processor: Any, text: str, parts: list[dict[str, Any]]) -> dict:
        """:meth:`ModelFamily.observation_row`, with the clips as a rollout engine takes them
        (``engine_media``: ``(waveform, rate)``, as :meth:`Qwen2Audio.engine_inputs` sends a
        prompt's), so an engine continues a trajectory with the audio the trainer reads."""
        row = ModelFamily.observation_row(self, processor, text, parts)
        conversation = [{"role": "user", "content": parts}]
        clips = self._audios(conversation, processor)
        if clips:
            rate = int(processor.feature_extractor.sampling_rate)
            row["engine_media"] = {"audio": [(clip, rate) for clip in clips]}
        return row

    def check_media(self, sample: Sample) -> None:
        """:func:`check_media` with this family's budget: under the ``"error"`` policy a clip
        longer than the bound in effect (``max_seconds``, capped by the window of the processor
        loaded last) is rejected when the dataset is read."""
        limit = None
        if self.audio.policy == "error":
            bounds = [b for b in (self.audio.max_seconds, self.window) if b is not None]
            limit = min(bounds) if bounds else None
        check_media(sample, max_seconds=limit)

    def suppress_token_ids(self, processor: Any) -> list[int]:
        """Ids of the media placeholder tokens (:attr:`special_tokens`)."""
        tokenizer = getattr(processor, "tokenizer", processor)
        ids = tokenizer.convert_tokens_to_ids(list(self.special_tokens))
        return [i for i in ids if i is not None and i != tokenizer.unk_token_id]

    # -- re-collation ----------------------------------------------------------------------------
    def _split_audio(self, batch: Any, rows: list[dict[str, Any]], unpadded: list, processor: Any):
        features = batch.get("input_features")
        if features is None:
            return
        masks = batch["feature_attention_mask"]
        tokenizer = getattr(processor, "tokenizer", processor)
        audio_id = tokenizer.convert_tokens_to_ids(self.audio_token)
        expected = self.audio_tokens(masks.long().sum(-1)).tolist()
        pos = 0
        for row, ids in zip(rows, unpadded):
            runs = run_lengths(ids, audio_id)
            if runs != expected[pos : pos + len(runs)]:
                raise RuntimeError(
                    f"audio tokens and audio features do not match: runs of {runs} tokens for "
                    f"clips of {expected[pos : pos + len(runs)]} tokens"
                )
            row["input_features"] = features[pos : pos + len(runs)].clone()
            row["feature_attention_mask"] = masks[pos : pos + len(runs)].clone()
            pos += len(runs)
        if pos != len(features):
            raise RuntimeError("could not split input_features: audio counts do not add up")

    def split_rows(self, batch: Any, processor: Any) -> list[dict[str, Any]]:
        """One dict per conversation: ``input_ids`` without padding and that conversation's
        audio rows (``input_features`` ``[n, mel, frames]``, ``feature_attention_mask``
        ``[n, frames]``, n ≥ 0). Checks each ``<|AUDIO|>`` run against its clip's length."""
        unpadded = [
            ids[mask.bool()] for ids, mask in zip(batch["input_ids"], batch["attention_mask"])
        ]
        rows: list[dict[str, Any]] = [{"input_ids": ids.clone()} for ids in unpadded]
        self._split_audio(batch, rows, unpadded, processor)
        return rows


@model_family("qwen2_audio")
class Qwen2Audio(QwenAudioFamily):
    """Qwen2-Audio (audio + text). :meth:`vision_tower` is the audio encoder."""

    model_types = ("qwen2_audio",)
    model_class = "Qwen2AudioForConditionalGeneration"
    processor_class = "Qwen2AudioProcessor"
    special_tokens = QWEN2_AUDIO_SPECIAL_TOKENS
    positions_from_mask = True
    box_instruction = ""

    def process(self, processor: Any, texts: list[str], conversations: list[Conversation]) -> Any:
        """Tokenise conversations with their audio: ``input_ids``, ``attention_mask``
        (left-padded) and, when there is audio, ``input_features`` + ``feature_attention_mask``
        (see the module docstring). Image or video parts raise DataError (Qwen2-Audio's chat
        template would drop them silently)."""
        for conv in conversations:
            for message in conv:
                content = message.get("content")
                for part in content if isinstance(content, list) else ():
                    kind = part.get("type")
                    if kind in ("image", "video") or "image" in part or "video" in part:
                        raise DataError(
                            f"Qwen2-Audio takes audio and text only, got a {kind or 'media'} "
                            "part; use qwen2_5_omni for images and videos"
                        )
        audios = [a for conv in conversations for a in self._audios(conv, processor)]
        kwargs: dict[str, Any] = {}
        if audios:
            kwargs = {"audio": audios, "sampling_rate": processor.feature_extractor.sampling_rate}
        return processor(
            text=texts, padding=True, padding_side="left", return_tensors="pt", **kwargs
        )

    def engine_inputs(
        self, processor: Any, conversations: list[Conversation]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The trainer's prompt rows and one vLLM request per conversation: the same text and
        each clip as the trainer's processor got it (decoded at its rate, cut by the audio
        budget), as ``(waveform, sampling rate)``."""
        rows = self.split_rows(self.prepare(processor, conversations), processor)
        rate = int(processor.feature_extractor.sampling_rate)
        requests = []
        texts = self.render(processor, conversations, True)
        for row, text, conversation in zip(rows, texts, conversations):
            clips = [(clip, rate) for clip in self._audios(conversation, processor)]
            if clips:
                row["engine_media"] = {"audio": clips}  # a tool rollout's later turns send them
            row["engine_ids"] = unexpanded_ids(processor, text)
            requests.append(
                {"prompt": text, "multi_modal_data": {"audio": clips}}
                if clips
                else {"prompt": text}
            )
        return rows, requests

    def input_size(self, width: int, height: int) -> tuple[int, int]:
        raise NotImplementedError("Qwen2-Audio takes no images")

    def vision_tower(self, model: Any) -> Any:
        """The audio encoder (``model.audio_tower``: convolutions, Whisper blocks, pooling);
        the audio→text projector stays trainable, as LLaVA-style recipes do."""
        return submodule(model, "audio_tower")


@model_family("qwen2_5_omni")
class Qwen25Omni(QwenAudioFamily, QwenVLFamily):
    """Qwen2.5-Omni thinker (images + videos + audio); boxes in ``input_pixels`` like Qwen2.5-VL.

    :meth:`vision_tower` returns both perception encoders (vision and audio), so that
    ``model.freeze_vision`` freezes — and keeps LoRA out of — every encoder, as it does for the
    single encoder of the other families.
    """

    model_types = ("qwen2_5_omni", "qwen2_5_omni_thinker")
    model_class = "Qwen2_5OmniThinkerForConditionalGeneration"
    processor_class = "Qwen2_5OmniProcessor"
    special_tokens = QWEN2_5_OMNI_SPECIAL_TOKENS
    positions_from_mask = False  # TMRoPE positions come from the model itself
    box_frame: ClassVar[BoxFrame] = "input_pixels"
    box_instruction = Qwen25VL.box_instruction
    media_keys: ClassVar[dict[str, str]] = {
        "pixel_values": "image_grid_thw",
        "pixel_values_videos": "video_grid_thw",
        "input_features": "feature_attention_mask",
    }
    media_tokens: ClassVar[dict[str, str]] = {
        "image_grid_thw": "<|IMAGE|>",
        "video_grid_thw": "<|VIDEO|>",
    }

    def __init__(
        self,
        media: MediaBudget | None = None,
        video: VideoBudget | None = None,
        audio: AudioBudget | None = None,
    ) -> None:
        QwenAudioFamily.__init__(self, media, audio)
        self.video = video or VideoBudget()

    # prompts and observations through process() with the audio (Qwen-VL's skip it)
    prepare = ModelFamily.prepare
    observation_row = ModelFamily.observation_row

    def process(self, processor: Any, texts: list[str], conversations: list[Conversation]) -> Any:
        """Tokenise conversations with images, videos and audio (keys: see the module
        docstring). Images are resized once by qwen-vl-utils (and cached) as for Qwen2.5-VL;
        videos go through :func:`mmrft.data.video.process_vision_info` with the family's
        :class:`~mmrft.data.video.VideoBudget` (decoder order, frame cache, and with
        ``max_prompt_tokens`` the fps and pixels lowered until the prompt fits, counting the
        text, image and audio tokens); ``video_second_per_grid`` is each video's temporal patch
        over its sampled fps."""
        import torch

        from mmrft.data.video import count_text_tokens

        per_conversation = [self._audios(conv, processor) for conv in conversations]
        audios = [a for conv_audios in per_conversation for a in conv_audios]
        text_tokens = None
        if self.video.max_prompt_tokens is not None:  # the budget counts every prompt token
            hop = int(processor.feature_extractor.hop_length)
            text_tokens = [
                count + sum(int(self.audio_tokens(len(a) // hop)) for a in conv_audios)
                for count, conv_audios in zip(count_text_tokens(processor, texts), per_conversation)
            ]
        images, videos, video_kwargs = self._vision_info(conversations, text_tokens)
        kwargs: dict[str, Any] = {}
        if audios:
            kwargs["audio"] = audios
            kwargs["sampling_rate"] = processor.feature_extractor.sampling_rate
        fps: list[float] = []
        if videos is not None:
            fps = [float(f) for f in video_kwargs.get("fps", [])]
            kwargs["do_sample_frames"] = False
        batch = self._process(processor, texts, images, videos, kwargs)
        if videos is not None:
            # The processor assumes one fps (2) for every video; use each video's sampled fps.
            temporal = processor.video_processor.temporal_patch_size
            if len(fps) != len(batch["video_grid_thw"]):
                fps = [2.0] * len(batch["video_grid_thw"])
            batch["video_second_per_grid"] = torch.tensor([temporal / f for f in fps])
        return batch

    def split_rows(self, batch: Any, processor: Any) -> list[dict[str, Any]]:
        """Audio rows as :meth:`QwenAudioFamily.split_rows`; image and video patch rows by
        their grids as Qwen2.5-VL, with ``video_second_per_grid`` per video."""
        import torch

        unpadded = [
            ids[mask.bool()] for ids, mask in zip(batch["input_ids"], batch["attention_mask"])
        ]
        rows: list[dict[str, Any]] = [{"input_ids": ids.clone()} for ids in unpadded]
        self._split_audio(batch, rows, unpadded, processor)
        tokenizer = processor.tokenizer
        seconds = batch.get("video_second_per_grid")
        for values_key, grid_key in self.media_keys.items():
            if grid_key not in self.media_tokens or batch.get(values_key) is None:
                continue
            grids, values = batch[grid_key], batch[values_key]
            token_id = tokenizer.convert_tokens_to_ids(self.media_tokens[grid_key])
            grid_pos = value_pos = 0
            for row, ids in zip(rows, unpadded):
                n = count_runs(ids, token_id)
                n_patches = int(grids[grid_pos : grid_pos + n].prod(dim=-1).sum())
                row[grid_key] = grids[grid_pos : grid_pos + n].clone()
                row[values_key] = values[value_pos : value_pos + n_patches].clone()
                if grid_key == "video_grid_thw" and seconds is not None:
                    row["video_second_per_grid"] = torch.as_tensor(seconds)[
                        grid_pos : grid_pos + n
                    ].clone()
                grid_pos += n
                value_pos += n_patches
            if grid_pos != len(grids) or value_pos != len(values):
                raise RuntimeError(f"could not split {values_key}: media counts do not add up")
        return rows

    def collate_rows(self, rows: list[dict[str, Any]], pad_token_id: int) -> dict[str, Any]:
        """As :meth:`ModelFamily.collate_rows`, also concatenating ``video_second_per_grid``."""
        import torch

        out = ModelFamily.collate_rows(self, rows, pad_token_id)
        seconds = [
            r["video_second_per_grid"] for r in rows if len(r.get("video_second_per_grid", ()))
        ]
        if seconds:
            out["video_second_per_grid"] = torch.cat(seconds)
        return out

    def engine_inputs(
        self, processor: Any, conversations: list[Conversation]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        raise NotImplementedError(
            "rollout.engine=vllm: Qwen2.5-Omni thinker requests are not written yet (vLLM's CPU "
            "build has no Qwen2.5-Omni thinker-only checkpoint type); use rollout.engine=hf"
        )

    def vision_tower(self, model: Any) -> Any:
        """Both encoders, ``ModuleList([visual, audio_tower])`` (a view: the model is not
        changed); see the class docstring."""
        import torch

        # transformers ≥ 5.20 keeps the encoders in the thinker's inner model, earlier ones on
        # the thinker itself
        return torch.nn.ModuleList([submodule(model, "visual"), submodule(model, "audio_tower")])

    def rope_positions(self, model: Any, row: dict[str, Any]) -> Any:
        """``[3, Lp]`` TMRoPE positions of a prompt row from the thinker's ``get_rope_index``
        (images and videos as Qwen2.5-VL, audio tokens along the temporal axis, by each clip's
        feature length)."""
        import torch

        ids = row["input_ids"][None]
        media: dict[str, Any] = {
            "image_grid_thw": row.get("image_grid_thw"),
            "video_grid_thw": row.get("video_grid_thw"),
            "second_per_grids": row.get("video_second_per_grid"),
        }
        media = {k: v for k, v in media.items() if v is not None and len(v)}
        if row.get("feature_attention_mask") is not None and len(row["feature_attention_mask"]):
            media["audio_seqlens"] = row["feature_attention_mask"].sum(-1)
        with torch.no_grad():
            positions, _ = qwen_vl.rope_module(model).get_rope_index(
                ids, attention_mask=torch.ones_like(ids), use_audio_in_video=False, **media
            )
        return positions[:, 0].long()


QWEN3_OMNI_SPECIAL_TOKENS = (
    "<|audio_start|>",
    "<|audio_end|>",
    "<|audio_pad|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)


def qwen3_omni_audio_tokens(frames: Any, n_window: int = 50) -> Any:
    """``<|audio_pad|>`` tokens of a clip of ``frames`` mel frames in the Qwen3-Omni audio
    encoder: 13 per full chunk of ``2·n_window`` frames, and for the rest three stride-2
    reductions (``_get_feat_extract_output_lengths`` of transformers' Qwen3-Omni)."""
    chunk = n_window * 2
    rest = (frames % chunk - 1) // 2 + 1
    return ((rest - 1) // 2 + 1 - 1) // 2 + 1 + (frames // chunk) * 13


@model_family("qwen3_omni")
class Qwen3Omni(Qwen25Omni):
    """Qwen3-Omni thinker (``Qwen3OmniMoeThinkerForConditionalGeneration``: images, videos and
    audio; a sparse-MoE decoder; Qwen3-VL's vision encoder with DeepStack). Inputs and
    positions as :class:`Qwen25Omni` (TMRoPE from the thinker's ``get_rope_index``), with
    Qwen3's placeholder names (``<|audio_start|><|audio_pad|><|audio_end|>``,
    ``<|vision_start|><|image_pad|><|vision_end|>``), patch 16 and the chunked audio encoder
    (13 tokens per 100 mel frames, :func:`qwen3_omni_audio_tokens`). The talker is never
    loaded; both ``qwen3_omni_moe`` (the released thinker + talker checkpoints) and
    ``qwen3_omni_moe_thinker`` (what mmrft saves) load.

    Boxes: ``norm1000`` (integers 0–1000 relative to the image). Qwen3-Omni's model card
    documents no box format of its own; mmrft uses that of Qwen3-VL, the vision model of the
    same generation, whose cookbooks state "Qwen3-VL uses relative coordinates ranging from 0
    to 1000", and states it in the prompt.
    """

    model_types = ("qwen3_omni_moe", "qwen3_omni_moe_thinker")
    model_class = "Qwen3OmniMoeThinkerForConditionalGeneration"
    processor_class = "Qwen3OmniMoeProcessor"
    special_tokens = QWEN3_OMNI_SPECIAL_TOKENS
    audio_token = "<|audio_pad|>"
    box_frame: ClassVar[BoxFrame] = "norm1000"
    box_instruction = qwen_vl.Qwen2VL.box_instruction
    patch_size: ClassVar[int] = 16
    media_tokens: ClassVar[dict[str, str]] = {
        "image_grid_thw": "<|image_pad|>",
        "video_grid_thw": "<|video_pad|>",
    }

    def audio_tokens(self, frames: Any) -> Any:
        return qwen3_omni_audio_tokens(frames)


__all__ = [
    "AudioBudget",
    "Qwen2Audio",
    "Qwen3Omni",
    "Qwen25Omni",
    "QwenAudioFamily",
    "audio_token_count",
    "check_media",
    "install_forward_hooks",
]
