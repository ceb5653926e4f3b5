"""What the model is shown, readable: a prepared prompt as text, and its media.

The prompt a model family builds (chat template, media placeholders expanded to one token per
visual patch group or audio frame) is thousands of tokens of ``<|image_pad|>``. Here it is
decoded with every run of a media placeholder summarised (``<|image_pad|>×64``), and the media
are listed with what the model gets of each: an image's file size and model-input size, a
video's frames, frame size and seconds, an audio clip's seconds, and their token counts. The
trainer prints one such prompt at start-up and ``completions.jsonl`` rows carry the text, so a
wrong template, a missing image or a budget that shrank the video to two frames shows before
any GPU hour is spent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mmrft.data import MEDIA_TYPES, local_media_path


def placeholder_ids(tokenizer: Any, family: Any) -> set[int]:
    """Ids of the family's media placeholder tokens (``media_tokens``, ``audio_token``)."""
    names = list(getattr(family, "media_tokens", {}).values())
    if getattr(family, "audio_token", None):
        names.append(family.audio_token)
    unknown = getattr(tokenizer, "unk_token_id", None)
    ids = {tokenizer.convert_tokens_to_ids(name) for name in names}
    return {i for i in ids if isinstance(i, int) and i != unknown}


def prompt_text(
    tokenizer: Any, ids: Any, placeholders: frozenset[int] | set[int] = frozenset()
) -> str:
    """Decode prompt token ids with special tokens kept and each run of a placeholder token
    (any id in ``placeholders``, or any special token repeated) written ``<token>×N``."""
    ids = [int(i) for i in ids]
    special = set(getattr(tokenizer, "all_special_ids", [])) | set(
        getattr(tokenizer, "added_tokens_decoder", {})
    )
    pieces: list[str] = []
    segment: list[int] = []
    i = 0
    while i < len(ids):
        j = i
        while j < len(ids) and ids[j] == ids[i]:
            j += 1
        if ids[i] in placeholders or (j - i > 1 and ids[i] in special):
            if segment:
                pieces.append(tokenizer.decode(segment, skip_special_tokens=False))
                segment = []
            pieces.append(f"{tokenizer.convert_ids_to_tokens(ids[i])}×{j - i}")
        else:
            segment.extend(ids[i:j])
        i = j
    if segment:
        pieces.append(tokenizer.decode(segment, skip_special_tokens=False))
    return "".join(pieces)


def _media_parts(conversation: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [
        (part["type"], str(part[part["type"]]))
        for message in conversation
        if isinstance(message.get("content"), list)
        for part in message["content"]
        if part.get("type") in MEDIA_TYPES
    ]


def _image_size(source: str) -> tuple[int, int] | None:
    path = local_media_path(source)
    if path is None or not Path(path).is_file():
        return None
    try:
        from PIL import Image

        with Image.open(path) as image:
            return image.size
    except OSError:
        return None


def _video_seconds(source: str) -> float | None:
    path = local_media_path(source)
    if path is None:
        return None
    try:
        from mmrft.data.video import probe_video

        return probe_video(path).duration_s
    except Exception:  # a summary line must never stop the run
        return None


def _runs(ids: Any, token_id: int | None) -> list[int]:
    """Lengths of the maximal runs of ``token_id`` in ``ids``, in order."""
    runs: list[int] = []
    previous = None
    for value in (int(i) for i in ids):
        if value == token_id:
            if previous == token_id:
                runs[-1] += 1
            else:
                runs.append(1)
        previous = value
    return runs


def media_summary(
    conversation: list[dict[str, Any]],
    row: dict[str, Any],
    processor: Any,
    audio_token_id: int | None = None,
) -> list[str]:
    """One line per media part of ``conversation`` with what the prepared ``row`` (one row of
    ``ModelFamily.split_rows``) holds of it: sizes, frames, seconds and tokens (an audio clip's
    tokens are its run of ``audio_token_id``)."""
    image = getattr(processor, "image_processor", None)
    video = getattr(processor, "video_processor", None) or image
    patch = getattr(image, "patch_size", None)
    merge = getattr(image, "merge_size", 1) or 1
    temporal = getattr(video, "temporal_patch_size", 1) or 1
    features = getattr(processor, "feature_extractor", None)
    grids = {
        "image": list(row.get("image_grid_thw", [])),
        "video": list(row.get("video_grid_thw", [])),
        "audio": list(row.get("feature_attention_mask", [])),
    }
    seen = {"image": 0, "video": 0, "audio": 0}
    lines = []
    for kind, source in _media_parts(conversation):
        k = seen[kind]
        seen[kind] += 1
        grid = grids[kind][k] if k < len(grids[kind]) else None
        text = f"{kind} {source}"
        if kind in ("image", "video") and grid is not None:
            t, h, w = (int(v) for v in grid)
            tokens = t * h * w // (merge * merge)
            size = f"{w * patch}×{h * patch} px" if patch else f"{w}×{h} patches"
            if kind == "image":
                original = _image_size(source)
                text += f": {original[0]}×{original[1]} px → {size}" if original else f": {size}"
            else:
                seconds = _video_seconds(source)
                text += f": {t * temporal} frames of {size}"
                text += f" from {seconds:.1f} s" if seconds is not None else ""
            text += f", {tokens} tokens"
        elif kind == "audio" and grid is not None and features is not None:
            frames = int(grid.sum())
            seconds = frames * features.hop_length / features.sampling_rate
            text += f": {seconds:.1f} s at {features.sampling_rate} Hz"
            runs = _runs(row["input_ids"], audio_token_id)
            text += f", {runs[k]} tokens" if k < len(runs) else ""
        lines.append(text)
    return lines


def show_prompt(
    policy: Any, conversation: list[dict[str, Any]], sample_id: str, max_chars: int = 4000
) -> str:
    """The start-up view of one prompt: its id, the rendered text (placeholders summarised,
    cut at ``max_chars``) and the media list. Runs the family's processor on this prompt."""
    family, processor = policy.family, policy.processor
    prepared = family.prepare(processor, [conversation], add_generation_prompt=True)
    row = family.split_rows(prepared, processor)[0]
    tokenizer = getattr(processor, "tokenizer", processor)
    text = prompt_text(tokenizer, row["input_ids"], placeholder_ids(tokenizer, family))
    if len(text) > max_chars:
        text = text[:max_chars] + f"… ({len(text) - max_chars} more characters)"
    audio = getattr(family, "audio_token", None)
    media = media_summary(
        conversation, row, processor, tokenizer.convert_tokens_to_ids(audio) if audio else None
    )
    out = [f"prompt of sample {sample_id} ({len(row['input_ids'])} tokens):", text.rstrip("\n")]
    if media:
        out += ["media:", *(f"  {line}" for line in media)]
    return "\n".join(out)


def row_prompt_text(policy: Any, row: dict[str, Any]) -> str:
    """The rendered text of a prepared prompt row (as :func:`show_prompt` writes it)."""
    tokenizer = getattr(policy.processor, "tokenizer", policy.processor)
    return prompt_text(tokenizer, row["input_ids"], placeholder_ids(tokenizer, policy.family))
