"""The sample every part of mmrft passes around, and the data layer's base: :class:`Sample`,
:class:`DataError`, media references (:func:`local_media_path`, :func:`media_file_key`), image
files (:func:`read_image`, :func:`image_size`) and the per-process count of skipped samples. The readers (:mod:`mmrft.data.readers`) and the media
modules (:mod:`mmrft.data.video`, :mod:`mmrft.data.audio`) import it; it imports neither.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import threading
from collections import Counter
from collections.abc import Iterator
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
        where: the dataset item it was read from (``file:line``, ``file row N``; set by
            :func:`collect_samples`, empty for a sample built in code), named by errors that
            come later (a video that fails when a step draws it).
    """

    id: str
    messages: list[dict[str, Any]]
    target: Any = None
    meta: dict[str, Any] = field(default_factory=dict)
    where: str = ""

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
            self.id,
            copy.deepcopy(self.messages),
            copy.deepcopy(self.target),
            dict(self.meta),
            self.where,
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
        count_skip(reason)
        log.warning("skipped %s: %s", where, reason)

    def summary(self) -> str:
        text = f"{self.path}: {self.kept}/{self.read} samples kept"
        if self.skipped:
            text += " (skipped: " + ", ".join(f"{r} ×{n}" for r, n in self.skipped.items()) + ")"
        return text


_SKIPPED: Counter[str] = Counter()
_SKIPPED_LOCK = threading.Lock()


def count_skip(reason: str, n: int = 1) -> None:
    """Count ``n`` samples skipped for ``reason`` in this process (:func:`skip_counts`)."""
    with _SKIPPED_LOCK:
        _SKIPPED[reason] += n


def skip_counts() -> Counter[str]:
    """Samples skipped in this process so far, by reason: lines and media refused when a
    dataset is read (``data.on_error=skip``) and media that failed when a step drew them. A run
    prints what it added (the difference of two snapshots) on the console at its end."""
    with _SKIPPED_LOCK:
        return Counter(_SKIPPED)


def local_media_path(source: str) -> str | None:
    """The filesystem path of a media reference (``file://`` stripped), ``None`` for URLs and
    data URIs."""
    if source.startswith("file://"):
        return source[len("file://") :]
    if "://" in source or source.startswith("data:"):
        return None
    return source


@contextlib.contextmanager
def _opened_image(path: str, missing: str, unreadable: str) -> Iterator[Any]:
    """The image file at ``path`` opened by PIL (lazily: the header is read); DataError naming
    the file: ``<missing> not found``, or ``corrupt or unreadable <unreadable> (<why>)`` for a
    file PIL cannot read, a truncated one, or one over PIL's decompression-bomb limit, whether
    found when opening or in the ``with`` block (decoding)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            yield image
    except FileNotFoundError:
        raise DataError(f"{path}: {missing} not found") from None
    except (
        UnidentifiedImageError,
        OSError,
        SyntaxError,
        ValueError,
        Image.DecompressionBombError,
    ) as exc:
        raise DataError(f"{path}: corrupt or unreadable {unreadable} ({exc})") from None


def read_image(path: str, missing: str = "image file", unreadable: str = "image") -> Any:
    """The image file at ``path`` fully decoded to RGB (a PIL image); DataError naming the file
    (:func:`_opened_image`)."""
    from qwen_vl_utils.vision_process import to_rgb

    with _opened_image(path, missing, unreadable) as image:
        image.load()
        return to_rgb(image)


def image_size(
    path: str, missing: str = "image file", unreadable: str = "image"
) -> tuple[int, int]:
    """``(width, height)`` in pixels of the image file at ``path``, from its header alone
    (nothing decoded); DataError naming the file (:func:`_opened_image`)."""
    with _opened_image(path, missing, unreadable) as image:
        return image.size


def media_file_key(path: str, what: str = "media file") -> tuple[str, int, int]:
    """``(path, mtime_ns, size)``, the cache key of a media file; DataError naming the file when
    it is missing, unreadable or not a regular file."""
    if "\x00" in path:
        raise DataError(f"{path!r}: the {what} path contains a NUL byte")
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        raise DataError(f"{path}: {what} not found") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read {what} ({exc.strerror or exc})") from None
    if not Path(path).is_file():
        raise DataError(f"{path}: not a file")
    return (path, stat.st_mtime_ns, stat.st_size)
