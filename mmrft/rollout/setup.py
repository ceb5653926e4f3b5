"""The set-up a run needs before its first rollout, shared by training and evaluation: the data
budget a config, task and model family imply (:func:`data_budget`: prompt tokens within the
model's context, media by header) and the train / test splits read within it (:func:`read_data`).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from mmrft.config import RunConfig, resolve_path
from mmrft.data import (
    MEDIA_TYPES,
    DataBudget,
    Sample,
    reading_budget,
    split_fields,
)
from mmrft.models.family import ModelFamily
from mmrft.rewards.task import Task, read_split
from mmrft.rollout.preflight import configured_tools

log = logging.getLogger(__name__)


def model_context(path: str) -> int | None:
    """The model's context length in tokens (``max_position_embeddings`` of its text config),
    read from its config file without loading weights; ``None`` when the config has none."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError, KeyError) as exc:
        log.warning(
            "no context length from %s (%s): data.max_prompt_tokens has no default", path, exc
        )
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    context = getattr(text, "max_position_embeddings", None)
    return int(context) if isinstance(context, int) else None


def data_budget(cfg: RunConfig, task: Task, family: ModelFamily, processor: Any) -> DataBudget:
    """The ``data.*`` budgets every sample is read under (:class:`~mmrft.data.DataBudget`).
    ``data.max_prompt_tokens`` defaults to the model's context (:func:`model_context`) minus
    ``rollout.max_new_tokens``; prompts are counted as the rollout renders them (the task's
    prompt, with ``rollout.tools``' description when the tools are described and offered,
    through the family's chat template, text tokens). A prompt of at most ``limit − 1``
    UTF-8 bytes is not tokenised: every token covers at least one byte of the text (at most
    one more, a SentencePiece word-start marker), so its byte count bounds its tokens."""
    from mmrft.rollout.tool_loop import renders_tools, tool_descriptions, with_tool_descriptions

    limit = cfg.data.max_prompt_tokens
    if limit is None:
        context = model_context(str(resolve_path(cfg.model.path)))
        limit = None if context is None else max(context - cfg.rollout.max_new_tokens, 1)
    tokenizer = getattr(processor, "tokenizer", processor)
    # what ToolLoop.with_tools prepends
    schemas = tool_descriptions(configured_tools(cfg), cfg.rollout.tools.describe)
    native = renders_tools(processor)

    rendered: dict[str, str] = {}  # the template's text by conversation, media files left out

    def prompt_tokens(sample: Sample) -> int:
        annotated = sample.copy()
        family.annotate(annotated)
        conversation = task.prompt(annotated, family)
        conversation = with_tool_descriptions(conversation, annotated, schemas, native)
        # a chat template writes a placeholder per media part, whatever file it names: samples
        # that differ only in their files share one rendering (a dataset of one question over
        # many images is rendered once, not once per line)
        key = json.dumps(without_media_files(conversation), sort_keys=True, default=repr)
        text = rendered.get(key)
        if text is None:
            text = rendered[key] = family.render(processor, [conversation], True)[0]
        size = len(text.encode("utf-8")) + 1
        if limit is not None and size <= limit:
            return size  # a bound within the budget: no need to count exactly
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    data = cfg.data
    return DataBudget(
        max_prompt_tokens=limit,
        count_tokens=prompt_tokens,
        max_image_pixels=data.max_image_pixels,
        max_video_seconds=data.max_video_seconds,
        max_video_frames=data.max_video_frames,
        max_audio_seconds=data.max_audio_seconds,
        allow_remote_media=data.allow_remote_media,
    )


def without_media_files(conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``conversation`` with the file (or URL, or frame list) of each image, video and audio
    part replaced by its kind: what a chat template's rendering depends on."""
    out = []
    for message in conversation:
        content = message.get("content")
        if isinstance(content, list):
            content = [
                {**part, part["type"]: part["type"]}
                if isinstance(part, dict)
                and part.get("type") in MEDIA_TYPES
                and part["type"] in part
                else part
                for part in content
            ]
        out.append({**message, "content": content})
    return out


def read_data(
    cfg: RunConfig, task: Task, family: ModelFamily, splits: tuple[str, ...] = ("train", "test")
) -> tuple[list[Sample], ...]:
    """The ``splits`` (``data.train`` / ``data.test``; training reads both, evaluation the test
    split), every line and media file checked (errors name the dataset's
    ``file:line`` and the media path) against the ``data.*`` budgets (:func:`data_budget`),
    annotated with the family's frames: all before any weights are loaded. The family's
    processor is loaded first (no weights): it counts prompt tokens, and the audio families
    bound clip lengths by its window."""
    processor = family.load_processor(str(resolve_path(cfg.model.path)))

    def split(name: str, path: str | None, limit: int | None) -> list[Sample]:
        if not path:
            return []
        return read_split(
            task,
            family,
            resolve_path(path),
            fmt=cfg.data.format,
            on_error=cfg.data.on_error,
            limit=limit,
            fields=split_fields(cfg.data.fields, name),
            media_root=cfg.data.media_root or None,
        )

    files = {
        "train": (cfg.data.train, cfg.data.max_train_samples),
        "test": (cfg.data.test, cfg.data.max_test_samples),
    }
    with reading_budget(data_budget(cfg, task, family, processor)):
        return tuple(split(name, *files[name]) for name in splits)
