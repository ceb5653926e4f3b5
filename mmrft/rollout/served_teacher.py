"""A teacher served by vLLM (``teacher.server.url``): on-policy distillation with a teacher on
other devices or machines.

The trainer sends each sampled completion to the teacher's server as one prompt, the policy's
prompt row followed by the completion's tokens (a tool trajectory: its whole token stream,
observations included), with every media item of the row, on vLLM's token-in route
``POST /inference/v1/generate`` (the served rollout engine's wire format,
:mod:`mmrft.rollout.served`: placeholder runs collapsed to one, media as data URLs).
``prompt_logprobs: 0`` makes vLLM return, for every prompt position, the log-probability of the
token actually there and its rank under the teacher: the teacher's log π_T(y_t) of each sampled
token, and whether y_t is its argmax (rank 1). The prompt the server ran (``return_token_ids``)
must be the trainer's row token for token
(:class:`~mmrft.rollout.vllm.EngineParityError` otherwise), so the teacher scored exactly the
tokens and media the policy trains on. ``max_tokens: 1`` generates one token, discarded.

Cost: vLLM does not read its prefix cache for a request that asks for prompt log-probs
(``SamplingParams.skip_reading_prefix_cache`` defaults to on then: cached positions would have
no logits), so the server prefills each completion together with its prompt, ``G`` prompt
passes per group where the in-process teacher's group-shared forward makes one. The requests
are sent concurrently, so the server batches them.

Only the sampled tokens' log-probs come back, so ``algorithm.distill_loss: full`` (the whole
distribution at every position) needs the in-process teacher (checked at start-up). At start-up
the teacher checkpoint's config and processor (``teacher.path``, else the path the server
reports on ``/v1/models``) are checked against the policy's (:func:`~mmrft.policy.teacher.check_teacher`:
the family, every token id, the media preprocessing); its weights are not loaded; and the
server's tokenizer must decode a probe of token ids as the policy's tokenizer does (the server
serves that checkpoint's tokenizer). A served teacher is frozen: nothing is pushed to it and
several trainer processes may share one.

Replies are untrusted input: each is bounded in size before it is parsed (:data:`REPLY_BYTES`)
and every value the trainer uses is checked (:func:`parse_scores`).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mmrft.config import RunConfig
from mmrft.errors import ServerError
from mmrft.models.family import ModelFamily
from mmrft.policy.model import Policy
from mmrft.policy.teacher import check_teacher, teacher_family
from mmrft.policy.trajectory import joined_row
from mmrft.rollout.base import Rollouts, pad_like
from mmrft.rollout.served import (
    GENERATE_PATH,
    MAX_CONTROL_BYTES,
    collapsed_tokens,
    content_parts,
    post_all,
    request_json,
)
from mmrft.rollout.vllm import EngineParityError, engine_prompt_ids, first_difference
from mmrft.typecheck import ConfigError

log = logging.getLogger(__name__)

REPLY_BYTES = (8192, 512)
"""A scoring reply's size bound: 8192 bytes plus 512 per prompt token (vLLM writes ~60 per
position with ``prompt_logprobs: 0``)."""
PROBE_TOKENS = 512
"""Token ids decoded on the server and here at start-up (spread over the vocabulary)."""


@dataclass
class TeacherScores:
    """The teacher's verdict on one completion's tokens (aligned with ``completion_ids``).

    Attributes:
        logps: log π_teacher(y_t | y_<t, prompt) of each token (0.0 where the teacher gave
            none: media placeholders of a tool observation, which the loss masks).
        agree: 1.0 where y_t is the teacher's argmax (vLLM's rank 1), else 0.0.
    """

    logps: list[float]
    agree: list[float]


def parse_scores(reply: Any, ids: list[int], start: int, where: str) -> TeacherScores:
    """The :class:`TeacherScores` of ``ids[start:]`` from a scoring reply of the prompt
    ``ids``; ``ValueError`` naming what is malformed, :class:`EngineParityError` when the
    server ran other tokens than ``ids``. A position may lack an entry only where its token is
    a media placeholder (``None``: the value 0.0, never in the loss)."""
    if not isinstance(reply, dict):
        raise ValueError("the reply is not a JSON object")
    prompt = reply.get("prompt_token_ids")
    if not isinstance(prompt, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in prompt
    ):
        raise ValueError("prompt_token_ids is not a list of token ids")
    if prompt != ids:
        raise EngineParityError(
            f"teacher.server.url: the teacher's server ran other tokens than the trainer's "
            f"{where} (from token {first_difference(ids, prompt)}; {len(prompt)} tokens against "
            f"{len(ids)}): it expanded the media otherwise, so its processor's settings differ "
            "from the policy's"
        )
    entries = reply.get("prompt_logprobs")
    if not isinstance(entries, list) or len(entries) != len(ids):
        raise ValueError(
            f"prompt_logprobs has {len(entries) if isinstance(entries, list) else 'no'} "
            f"entries for {len(ids)} prompt tokens (is prompt_logprobs supported by this server?)"
        )
    logps, agree = [], []
    for position in range(start, len(ids)):
        entry = entries[position]
        if entry is None:
            logps.append(0.0)
            agree.append(0.0)
            continue
        scored = entry.get(str(ids[position])) if isinstance(entry, dict) else None
        if not isinstance(scored, dict):
            raise ValueError(f"position {position} has no log-prob of its token {ids[position]}")
        value, rank = scored.get("logprob"), scored.get("rank")
        if (
            not isinstance(value, (int, float))
            or isinstance(value, bool)
            or not math.isfinite(value)
        ):
            raise ValueError(f"the log-prob at position {position} is not a finite number")
        if value > 1e-4:
            raise ValueError(f"the log-prob at position {position} is positive ({value})")
        if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
            raise ValueError(f"the rank at position {position} is not a positive integer")
        logps.append(float(value))
        agree.append(1.0 if rank == 1 else 0.0)
    return TeacherScores(logps, agree)


class ServedTeacher:
    """The teacher at ``teacher.server.url`` (module docstring), checked against ``policy``.

    Attributes:
        url: the server's base URL.
        model: the model name the server serves (sent with every request).
        checkpoint: the teacher checkpoint whose config and processor were checked.
    """

    def __init__(self, cfg: RunConfig, policy: Policy) -> None:
        server = cfg.teacher.server
        self.url = str(server.url).rstrip("/")
        self.timeout = float(server.request_timeout_s)
        self.policy = policy
        if type(policy.family).engine_inputs is ModelFamily.engine_inputs:
            raise ConfigError(
                f"teacher.server.url: the {policy.family.name} family has no vLLM inputs in "
                "mmrft (its media cannot be sent to a server); use an in-process teacher "
                "(teacher.path alone)"
            )
        self.collapse = collapsed_tokens(policy)
        self.token_keys = policy.family.token_keys
        served = self._served_model()
        self.model = served["id"]
        self.checkpoint = cfg.teacher.path or served.get("root") or self.model
        family = teacher_family(cfg, policy, self.checkpoint, key=self._key(cfg))
        try:
            check_teacher(policy.processor, family.load_processor(self.checkpoint))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{self._key(cfg)}: {exc}") from None
        self._check_tokenizer()
        log.info("teacher: %s served at %s (checked: %s)", self.model, self.url, self.checkpoint)

    def _key(self, cfg: RunConfig) -> str:
        if cfg.teacher.path:
            return "teacher.path"
        return f"teacher.server.url (the checkpoint it serves, {self.checkpoint})"

    def _call(self, path: str, body: Any, what: str) -> Any:
        try:
            return request_json(self.url + path, body, min(self.timeout, 60.0), MAX_CONTROL_BYTES)
        except ServerError as exc:
            raise ServerError(
                f"teacher.server.url: the teacher at {self.url}: {what}: {exc}"
            ) from None

    def _served_model(self) -> dict[str, Any]:
        """The first model of ``/v1/models`` (``id``, and ``root``: the path it loaded)."""
        reply = self._call("/v1/models", None, "listing its models")
        models = reply.get("data") if isinstance(reply, dict) else None
        if not isinstance(models, list) or not models or not isinstance(models[0], dict):
            raise ServerError(f"teacher.server.url: {self.url}/v1/models lists no model")
        first = models[0]
        if not isinstance(first.get("id"), str):
            raise ServerError(f"teacher.server.url: {self.url}/v1/models gives a model no id")
        root = first.get("root")
        out = {"id": first["id"]}
        if isinstance(root, str) and (Path(root).is_dir() or root.count("/") == 1):
            out["root"] = root
        return out

    def _check_tokenizer(self) -> None:
        """The server's tokenizer decodes :data:`PROBE_TOKENS` ids spread over the policy's
        vocabulary (special tokens first) as the policy's does."""
        tokenizer = self.policy.tokenizer
        size = len(tokenizer)
        special = sorted(set(tokenizer.all_special_ids))
        stride = max(size // PROBE_TOKENS, 1)
        probe = (special + list(range(0, size, stride)))[:PROBE_TOKENS]
        probe = [t for t in probe if t not in self.collapse]
        reply = self._call("/detokenize", {"model": self.model, "tokens": probe}, "detokenize")
        theirs = reply.get("prompt") if isinstance(reply, dict) else None
        mine = tokenizer.decode(probe)
        if theirs != mine:
            at = next((k for k, (a, b) in enumerate(zip(mine, theirs or "")) if a != b), 0)
            raise ConfigError(
                f"teacher.server.url: the server at {self.url} decodes token ids otherwise than "
                f"the policy's tokenizer (first difference at character {at}: "
                f"{(theirs or '')[at : at + 20]!r} vs {mine[at : at + 20]!r}): it serves "
                "another tokenizer than the policy's"
            )

    def _request(self, row: dict[str, Any]) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "token_ids": engine_prompt_ids(row, self.collapse),
            "sampling_params": {
                "max_tokens": 1,
                "prompt_logprobs": 0,
                "temperature": 1.0,
                "detokenize": False,
            },
            "return_token_ids": True,
            "output_mode": "tokens",
        }
        parts = content_parts(row.get("engine_media") or {})
        if parts:
            body["content_parts"] = parts
        return body

    def sequence(self, rollouts: Rollouts, i: int) -> dict[str, Any]:
        """Completion ``i`` as one prepared row: its prompt row followed by its tokens (a tool
        trajectory: :func:`~mmrft.policy.trajectory.joined_row`), with the media of both."""
        prompt = rollouts.prompts[rollouts.prompt_index[i]]
        if "engine_media" not in prompt and self._has_media(prompt):
            raise ValueError(
                "a prompt row without its engine media: the rollout engine must keep them "
                "for a served teacher (HFEngine(keep_media=True))"
            )
        if rollouts.trajectories is not None:
            return joined_row(prompt, rollouts.trajectories[i], self.token_keys)
        row = dict(prompt)
        extra = torch.tensor(rollouts.completion_ids[i], dtype=prompt["input_ids"].dtype)
        row["input_ids"] = torch.cat([prompt["input_ids"], extra])
        if "engine_ids" in prompt:
            row["engine_ids"] = [*prompt["engine_ids"], *rollouts.completion_ids[i]]
        return row

    def _has_media(self, row: dict[str, Any]) -> bool:
        return any(key in row for key in self.policy.family.media_keys)

    def score(self, rollouts: Rollouts, indices: list[int]) -> dict[int, TeacherScores]:
        """The teacher's :class:`TeacherScores` of the completions ``indices`` (one concurrent
        request each)."""
        rows = [self.sequence(rollouts, i) for i in indices]
        bodies = [self._request(row) for row in rows]
        base, per_token = REPLY_BYTES
        limits = [base + per_token * len(row["input_ids"]) for row in rows]
        start = time.perf_counter()
        try:
            replies = post_all(self.url + GENERATE_PATH, bodies, self.timeout, limits)
        except ServerError as exc:
            raise ServerError(
                f"teacher.server.url: the teacher at {self.url}: scoring {len(bodies)} "
                f"completions: {exc}"
            ) from None
        out = {}
        for i, row, reply in zip(indices, rows, replies):
            ids = row["input_ids"].tolist()
            prompt_len = len(rollouts.prompts[rollouts.prompt_index[i]]["input_ids"])
            try:
                out[i] = parse_scores(reply, ids, prompt_len, f"completion {i}")
            except EngineParityError:
                raise
            except ValueError as exc:
                raise ServerError(
                    f"teacher.server.url: the teacher at {self.url} answered a malformed "
                    f"score of completion {i} ({exc})"
                ) from None
        log.debug(
            "teacher scored %d completions in %.2f s", len(indices), time.perf_counter() - start
        )
        return out

    def close(self) -> None:
        """Nothing to release: the server is not the run's."""


def padded_scores(
    scores: dict[int, TeacherScores], chunk: list[int], like: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The teacher's log-probs and argmax agreement of the completions ``chunk``, right-padded
    like ``like`` (``[n, C]``, the training forward's log-probs of the same completions)."""
    logps = pad_like([scores[i].logps for i in chunk], like)
    return logps, pad_like([scores[i].agree for i in chunk], like)
