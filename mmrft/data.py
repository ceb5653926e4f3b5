"""Samples and dataset readers.

A :class:`Sample` is what every part of mmrft passes around: the prompt as chat messages with
media parts, the ground truth, and metadata. The project's own dataset format is JSONL, one
sample per line::

    {"id": "shapes-0001",
     "messages": [{"role": "user", "content": [
         {"type": "image", "image": "images/0001.png"},
         {"type": "text", "text": "What colour is the shape?"}]}],
     "target": "red",
     "meta": {"choices": ["red", "green", "blue", "yellow"]}}

Media paths are relative to the JSONL file (absolute paths and URLs are kept as they are).
``messages`` may also be a plain string, read as one user turn of text. Readers never skip a
line silently: a malformed line raises :class:`DataError` naming file and line, or, with
``on_error="skip"``, is skipped and counted in :class:`ReadStats`.
"""

from __future__ import annotations

import copy
import json
import logging
import os
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

log = logging.getLogger(__name__)

MEDIA_TYPES = ("image", "video", "audio")
OnError = Literal["raise", "skip"]


class DataError(ValueError):
    """A dataset line or media file that cannot be used; the message names file (and line)."""


@dataclass
class Sample:
    """One prompt with its ground truth.

    Attributes:
        id: unique within its dataset.
        messages: chat messages; ``content`` is a string or a list of parts
            ``{"type": "text", "text": ...}`` / ``{"type": "image"|"video"|"audio", <type>: path}``.
        target: JSON-serialisable ground truth, in the task's canonical frame (boxes: absolute
            pixels ``[x1, y1, x2, y2]`` of the original image, x right, y down).
        meta: everything else a verifier or metric needs (``image_size`` as ``[W, H]``,
            ``choices``, the model input size once a model family annotated it, ...).
    """

    id: str
    messages: list[dict[str, Any]]
    target: Any = None
    meta: dict[str, Any] = field(default_factory=dict)

    def media(self, kind: str | None = None) -> list[str]:
        """Paths or URLs of the media parts, in order (optionally of one kind)."""
        return [
            part[part["type"]]
            for message in self.messages
            if isinstance(message.get("content"), list)
            for part in message["content"]
            if part.get("type") in MEDIA_TYPES and (kind is None or part["type"] == kind)
        ]

    def text(self) -> str:
        """The text of the last user turn (the question), parts joined with newlines."""
        for message in reversed(self.messages):
            if message.get("role") == "user":
                content = message["content"]
                if isinstance(content, str):
                    return content
                return "\n".join(p["text"] for p in content if p.get("type") == "text")
        return ""

    def copy(self) -> Sample:
        return Sample(
            self.id, copy.deepcopy(self.messages), copy.deepcopy(self.target), dict(self.meta)
        )

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "messages": self.messages, "target": self.target, "meta": self.meta}


@dataclass
class ReadStats:
    """What a reader did: lines read, samples kept, and skips counted by reason."""

    path: str
    read: int = 0
    kept: int = 0
    skipped: Counter = field(default_factory=Counter)

    def skip(self, reason: str, where: str) -> None:
        self.skipped[reason] += 1
        log.warning("skipped %s: %s", where, reason)

    def summary(self) -> str:
        text = f"{self.path}: {self.kept}/{self.read} samples kept"
        if self.skipped:
            text += " (skipped: " + ", ".join(f"{r} ×{n}" for r, n in self.skipped.items()) + ")"
        return text


def local_media_path(source: str) -> str | None:
    """The filesystem path of a media reference (``file://`` stripped), ``None`` for URLs and
    data URIs."""
    if source.startswith("file://"):
        return source[len("file://") :]
    if "://" in source or source.startswith("data:"):
        return None
    return source


def media_file_key(path: str, what: str = "media file") -> tuple[str, int, int]:
    """``(path, mtime_ns, size)``, the cache key of a media file; DataError naming the file when
    it is missing, unreadable or not a regular file."""
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        raise DataError(f"{path}: {what} not found") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read {what} ({exc.strerror or exc})") from None
    if not Path(path).is_file():
        raise DataError(f"{path}: not a file")
    return (path, stat.st_mtime_ns, stat.st_size)


def _resolve_media(value: str, base: Path) -> str:
    if "://" in value or value.startswith("data:"):
        return value
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else (base / path))


def normalise_messages(messages: Any, base: Path, where: str) -> list[dict[str, Any]]:
    """Validate chat messages and make media paths absolute (relative to ``base``)."""
    if isinstance(messages, str):
        return [{"role": "user", "content": [{"type": "text", "text": messages}]}]
    if not isinstance(messages, list) or not messages:
        raise DataError(f"{where}: 'messages' must be a non-empty list or a string")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise DataError(f"{where}: messages[{i}] needs 'role' and 'content'")
        content = message["content"]
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        parts = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text":
                if not isinstance(part.get("text"), str):
                    raise DataError(f"{where}: messages[{i}].content[{j}] has no 'text' string")
                parts.append(dict(part))
            elif kind in MEDIA_TYPES:
                if not isinstance(part.get(kind), str):
                    raise DataError(f"{where}: messages[{i}].content[{j}] has no '{kind}' path")
                parts.append({**part, kind: _resolve_media(part[kind], base)})
            else:
                raise DataError(
                    f"{where}: messages[{i}].content[{j}] has type {kind!r}; "
                    f"expected one of text, {', '.join(MEDIA_TYPES)}"
                )
        out.append({"role": message["role"], "content": parts})
    return out


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, Any, str]]:
    """Yield ``(line_number, parsed_json, where)``; a line that is not JSON raises DataError."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"dataset file not found: {path}")
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                yield number, json.loads(line), where
            except json.JSONDecodeError as exc:
                yield number, DataError(f"{where}: not valid JSON ({exc.msg})"), where


def read_records(
    path: str | Path,
    parse: Callable[[Any, Path, str], Sample],
    on_error: OnError = "raise",
    check: Callable[[Sample], None] | None = None,
) -> tuple[list[Sample], ReadStats]:
    """Read a JSONL file with ``parse(record, base_dir, where) -> Sample``.

    ``check(sample)`` may raise DataError (a missing or corrupt image, say); its message gets
    the line's ``file:line`` in front when it does not name it already, so an error always
    names both the dataset line and the media file. With ``on_error="skip"`` such lines are
    skipped and counted (by the check's own reason, e.g. ``image file not found``); otherwise
    the error propagates.
    """
    path = Path(path)
    stats = ReadStats(str(path))
    samples = []
    seen: set[str] = set()
    for _, record, where in iter_jsonl(path):
        stats.read += 1
        try:
            if isinstance(record, DataError):
                raise record
            sample = parse(record, path.parent, where)
            if sample.id in seen:
                raise DataError(f"{where}: duplicate id '{sample.id}'")
            if check is not None:
                check(sample)
        except DataError as exc:
            message = str(exc)
            if on_error == "skip":
                # the reason without "file:line: " (a line's error) or "path: " (a media check's)
                stats.skip(message.split(": ", 1)[-1].split(" (")[0], where)
                continue
            if message.startswith(where):
                raise
            raise DataError(f"{where}: {message}") from None  # a media check names the file only
        seen.add(sample.id)
        samples.append(sample)
        stats.kept += 1
    return samples, stats


def parse_mmrft_record(record: Any, base: Path, where: str) -> Sample:
    """Parse one line of the project's JSONL format (see the module docstring)."""
    if not isinstance(record, dict):
        raise DataError(f"{where}: expected a JSON object")
    missing = [k for k in ("messages", "target") if k not in record]
    if missing:
        raise DataError(f"{where}: missing field {', '.join(repr(k) for k in missing)}")
    meta = record.get("meta") or {}
    if not isinstance(meta, dict):
        raise DataError(f"{where}: 'meta' must be an object")
    sample_id = str(record.get("id", where.rsplit(":", 1)[-1]))
    return Sample(
        id=sample_id,
        messages=normalise_messages(record["messages"], base, where),
        target=record["target"],
        meta=dict(meta),
    )


def read_mmrft_jsonl(
    path: str | Path, on_error: OnError = "raise", check: Callable[[Sample], None] | None = None
) -> tuple[list[Sample], ReadStats]:
    """Read the project's JSONL format."""
    return read_records(path, parse_mmrft_record, on_error=on_error, check=check)
