"""The token stream of one multi-turn rollout (:class:`Trajectory`, its :class:`Turn` records)
and the rows the policy scores: a prepared prompt followed by trajectories
(:func:`with_media`, :func:`joined_row`). The tool loop (:mod:`mmrft.rollout.tool_loop`) writes
trajectories; the policy's forward (:mod:`mmrft.policy.group`, :mod:`mmrft.policy.model`) reads
them, so they live below both.

A trajectory is append-only: model turns as sampled (loss mask 1) and observations rendered by
the chat template as a delta (loss mask 0), with the observations' media tensors in the order of
their placeholders.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from mmrft.models.family import cat_padded

# Bounds on what a record keeps of model-written call arguments and observation texts.
_RECORD_CHARS = 300


def _short(text: str, n: int = _RECORD_CHARS) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


# ---------------------------------------------------------------------------------------------
# The trajectory


@dataclass
class Turn:
    """One model turn and what its tool calls returned.

    Attributes:
        text: the model's text of the turn (special tokens removed, tool-call tags kept).
        tokens: model tokens of the turn (loss mask 1).
        truncated: the turn hit its token limit without an end-of-turn or ``</tool_call>``.
        calls: one record per call: ``name``, ``arguments`` (JSON text, bounded), ``ok``,
            ``reason``, ``text`` (the observation's text, bounded), ``images``, ``videos``,
            ``info`` (the tool's facts, e.g. crop's ``box_px``).
        observation_tokens: tokens of the observation appended after the turn (loss mask 0).
    """

    text: str
    tokens: int
    truncated: bool
    calls: list[dict[str, Any]] = field(default_factory=list)
    observation_tokens: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "tokens": self.tokens,
            "truncated": self.truncated,
            "calls": self.calls,
            "observation_tokens": self.observation_tokens,
        }


@dataclass
class Trajectory:
    """The token stream after the prompt of one multi-turn rollout (module docstring).

    Attributes:
        ids: every token after the prompt: model turns and observations, in order.
        loss_mask: 1 for the model's own tokens, 0 for observation and template tokens.
        token_types: the family's per-token modality (``mm_token_type_ids``: 0 text,
            1 image placeholder, 2 video placeholder) of each of ``ids``.
        logprobs: the sampler's log-probability of each of ``ids`` (0.0 on observation
            tokens), or ``None`` when the engine reports none.
        media: the observations' media tensors by the family's keys (``pixel_values``,
            ``image_grid_thw``, ``pixel_values_videos``, ``video_grid_thw``, …), one tensor
            per observation, in order.
        engine_media: the observations' media as a rollout engine with its own processor
            takes them (``multi_modal_data`` per observation: resized images, sampled frames),
            for engines that continue a trajectory from its media (vLLM).
        engine_ids: ``ids`` as such an engine is sent them: the model's tokens, and each
            observation as the chat template's text tokenised (one placeholder per medium,
            which the engine's processor expands again to the observation's own ids).
        environment: with an environment (:mod:`mmrft.rollout.environment`): its ``name``,
            ``calls`` run, and the episode's ``done``, ``reward`` (in [0, 1] or None), ``state``
            (JSON), ``lost`` when the instance is gone; ``None`` otherwise.
        turns: the model turns (:class:`Turn`).
        stop: why the trajectory ended (module docstring's table).
        images / videos / audios / visual_tokens: what observations added.
        prompt_media: the media parts of the prompt it continues, by kind (``image``,
            ``video``, ``audio``): templates that number media ("Audio 2:") count on from them.
    """

    ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    token_types: list[int] = field(default_factory=list)
    logprobs: list[float] | None = field(default_factory=list)
    media: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    engine_media: list[dict[str, list[Any]]] = field(default_factory=list)
    engine_ids: list[int] = field(default_factory=list)
    environment: dict[str, Any] | None = None
    turns: list[Turn] = field(default_factory=list)
    stop: str = ""
    images: int = 0
    videos: int = 0
    audios: int = 0
    visual_tokens: int = 0
    prompt_media: dict[str, int] = field(default_factory=dict)

    def add_turn(
        self, ids: list[int], logprobs: list[float] | None, text: str, truncated: bool
    ) -> Turn:
        """Append the model's tokens of one turn (loss mask 1)."""
        self.ids += ids
        self.engine_ids += ids
        self.loss_mask += [1] * len(ids)
        self.token_types += [0] * len(ids)
        if self.logprobs is not None and logprobs is not None:
            self.logprobs += logprobs
        else:
            self.logprobs = None
        turn = Turn(text=text, tokens=len(ids), truncated=truncated)
        self.turns.append(turn)
        return turn

    def add_observation(self, row: dict[str, Any], token_key: str | None) -> None:
        """Append an observation's prepared row (loss mask 0): its ids, its token types
        (``row[token_key]``; 0 when the family has none) and its media tensors."""
        ids = row["input_ids"].tolist()
        self.ids += ids
        self.engine_ids += [int(t) for t in row.get("engine_ids", ids)]
        self.loss_mask += [0] * len(ids)
        types = row.get(token_key) if token_key else None
        self.token_types += types.tolist() if types is not None else [0] * len(ids)
        if self.logprobs is not None:
            self.logprobs += [0.0] * len(ids)
        for key, value in row.items():
            if key not in ("input_ids", token_key) and isinstance(value, torch.Tensor):
                self.media.setdefault(key, []).append(value)
        if row.get("engine_media"):
            self.engine_media.append(row["engine_media"])
        self.turns[-1].observation_tokens += len(ids)

    def media_row(self) -> dict[str, torch.Tensor]:
        """The observations' media, concatenated per key in order."""
        return {key: cat_padded(values) for key, values in self.media.items()}

    @property
    def has_media(self) -> bool:
        return bool(self.images or self.videos or self.audios)

    @property
    def media_added(self) -> int:
        """Images, clips and audio clips the observations added."""
        return self.images + self.videos + self.audios

    def media_so_far(self) -> dict[str, int]:
        """Media parts of the prompt and the observations so far, by kind."""
        added = {"image": self.images, "video": self.videos, "audio": self.audios}
        return {k: self.prompt_media.get(k, 0) + v for k, v in added.items()}

    @property
    def calls(self) -> list[dict[str, Any]]:
        return [call for turn in self.turns for call in turn.calls]

    @property
    def used_tool(self) -> bool:
        """Whether any tool call succeeded."""
        return any(call["ok"] for call in self.calls)

    @property
    def failed_calls(self) -> int:
        return sum(not call["ok"] for call in self.calls)

    def to_json(self) -> dict[str, Any]:
        """The record of ``completions.jsonl`` and ``predictions.jsonl``: turn by turn."""
        return {
            "stop": self.stop,
            "turns": [t.to_json() for t in self.turns],
            "model_tokens": sum(self.loss_mask),
            "observation_tokens": len(self.ids) - sum(self.loss_mask),
            "images_added": self.images,
            "videos_added": self.videos,
            "audios_added": self.audios,
            "visual_tokens_added": self.visual_tokens,
            **({"environment": self.environment} if self.environment is not None else {}),
        }


def with_media(prompt: dict[str, Any], trajectories: list[Trajectory]) -> dict[str, Any]:
    """A copy of a prepared prompt row whose media tensors are followed by those of
    ``trajectories``, in order (ids and per-token keys unchanged): the media of a sequence
    ``[prompt | trajectory 1 | trajectory 2 | …]`` in placeholder order."""
    row = dict(prompt)
    for trajectory in trajectories:
        for key, values in trajectory.media.items():
            row[key] = cat_padded([row[key], *values] if key in row else values)
    return row


def joined_row(
    prompt: dict[str, Any], trajectory: Trajectory, token_keys: tuple[str, ...]
) -> dict[str, Any]:
    """One prepared row of the prompt followed by the whole trajectory: ids concatenated,
    per-token keys concatenated (the trajectory's token types), media tensors concatenated
    prompt first, then each observation's, the order of their placeholders in the ids."""
    row = with_media(prompt, [trajectory])
    row["input_ids"] = torch.cat(
        [prompt["input_ids"], torch.tensor(trajectory.ids, dtype=prompt["input_ids"].dtype)]
    )
    for key in token_keys:
        if key in prompt:
            extra = torch.tensor(trajectory.token_types, dtype=prompt[key].dtype)
            row[key] = torch.cat([prompt[key], extra])
    if "engine_ids" in prompt:
        row["engine_ids"] = [*prompt["engine_ids"], *trajectory.engine_ids]
    if "engine_media" in prompt or trajectory.engine_media:
        merged: dict[str, list[Any]] = {}
        for data in [prompt.get("engine_media") or {}, *trajectory.engine_media]:
            for kind, items in data.items():
                merged.setdefault(kind, []).extend(items)
        row["engine_media"] = merged
    return row
