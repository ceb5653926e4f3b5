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

Media paths are relative to the JSONL file, or to ``data.media_root`` (absolute paths and URLs
are kept as they are). ``messages`` may also be a plain string, read as one user turn of text.
Readers never skip a line silently: a malformed line raises :class:`DataError` naming file and
line, or, with ``on_error="skip"``, is skipped and counted in :class:`ReadStats` (and in the
process's :func:`skip_counts`). Inside :func:`reading_budget` every sample is also held to a
:class:`DataBudget` (prompt tokens, media size and length read from file headers, remote
media), before any of its media is decoded. JSON nested deeper than :data:`MAX_JSON_DEPTH`,
text that is not UTF-8 and NUL bytes in media paths are bad lines like any other.

The records may sit in any container (:func:`iter_records`): JSON lines, a JSON list, parquet,
a Hugging Face ``datasets`` directory, or a folder of such files. Records of another layout
become project records through a field mapping (``data.fields``, :func:`map_fields`: which keys
hold the question, the answer, the media, the options) or the LLaVA / VLM-R1
``conversations`` layout (:func:`from_conversations`), so that a common dataset needs no code.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import itertools
import json
import logging
import os
import re
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from mmrft.data.sample import MEDIA_TYPES, DataError, OnError, ReadStats, Sample, local_media_path

log = logging.getLogger(__name__)


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
        if not isinstance(content, list):
            raise DataError(
                f"{where}: messages[{i}].content must be a string or a list of parts, "
                f"got {type(content).__name__}"
            )
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
                if "\x00" in part[kind]:
                    raise DataError(f"{where}: messages[{i}].content[{j}]: NUL byte in the path")
                parts.append({**part, kind: _resolve_media(part[kind], base)})
            else:
                raise DataError(
                    f"{where}: messages[{i}].content[{j}] has type {kind!r}; "
                    f"expected one of text, {', '.join(MEDIA_TYPES)}"
                )
        out.append({"role": message["role"], "content": parts})
    return out


MAX_JSON_DEPTH = 100
"""Deepest nesting of lists and objects a dataset record may have (a record of the project's
layout nests 5 deep). Deeper input is refused before it is parsed: Python's JSON parser
recurses, and so do the copies of a record, so 100,000 brackets would be a RecursionError."""

_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_JSON_BRACKET = re.compile(r"[\[\]{}]")


def json_too_deep(text: str, limit: int = MAX_JSON_DEPTH) -> int | None:
    """The offset in ``text`` (JSON) where its nesting passes ``limit``, ``None`` when it stays
    within it. Free for ordinary text (fewer brackets than ``limit``); else one pass over the
    brackets outside strings."""
    if text.count("[") + text.count("{") <= limit:
        return None
    depth = 0
    bare = _JSON_STRING.sub(lambda m: " " * len(m.group()), text)  # same offsets
    for bracket in _JSON_BRACKET.finditer(bare):
        depth += 1 if bracket.group() in "[{" else -1
        if depth > limit:
            return bracket.start()
    return None


def parse_json(text: str, where: str) -> Any:
    """``json.loads(text)``, or :class:`DataError` naming ``where`` when it is not JSON or
    nests deeper than :data:`MAX_JSON_DEPTH`."""
    if json_too_deep(text) is not None:
        raise DataError(f"{where}: not valid JSON (nested deeper than {MAX_JSON_DEPTH} levels)")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"{where}: not valid JSON ({exc.msg})") from None


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, Any, str]]:
    """Yield ``(line_number, parsed_json, where)``; a line that is not UTF-8 or not JSON (or
    nests deeper than :data:`MAX_JSON_DEPTH`) comes as a DataError in place of the value."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"dataset file not found: {path}")
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            where = f"{path}:{number}"
            try:
                yield number, parse_json(utf8(raw, where), where), where
            except DataError as exc:
                yield number, exc, where


def utf8(data: bytes, where: str) -> str:
    """``data`` decoded as UTF-8, or DataError naming ``where`` and the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{where}: not UTF-8 text (at byte {exc.start + 1})") from None


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


class ListItem(NamedTuple):
    """One item of a JSON list file: its 0-based position and its value."""

    index: int
    value: Any


def iter_json_list(path: str | Path) -> Iterator[tuple[ListItem, str]]:
    """Yield ``(ListItem(index, value), where)`` for each item of a file holding one JSON list;
    ``where`` is ``"<path>:<line> (item <index>)"``, the line on which the item starts (several
    items share a line in a list written without indentation, hence the index).

    An item that is not valid JSON ends the list (JSON has no way to resynchronise inside an
    array), so it raises DataError naming its line whatever ``on_error`` says; so do a missing
    file and a file that is not a JSON list.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"dataset file not found: {path}")
    text = utf8(path.read_bytes(), str(path))
    deep = json_too_deep(text, MAX_JSON_DEPTH + 1)  # + 1: the list itself
    if deep is not None:
        line = text.count("\n", 0, deep) + 1
        raise DataError(
            f"{path}:{line}: not valid JSON (nested deeper than {MAX_JSON_DEPTH} levels)"
        )
    decoder = json.JSONDecoder()
    i = _skip_space(text, 0)
    if i >= len(text) or text[i] != "[":
        raise DataError(f"{path}: expected a JSON list of objects (a file starting with '[')")
    i = _skip_space(text, i + 1)
    line, counted = 1, 0
    if i < len(text) and text[i] == "]":
        return
    for index in itertools.count():
        line += text.count("\n", counted, i)
        counted = i
        try:
            value, end = decoder.raw_decode(text, i)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
        yield ListItem(index, value), f"{path}:{line} (item {index})"
        i = _skip_space(text, end)
        if i < len(text) and text[i] == ",":
            i = _skip_space(text, i + 1)
            continue
        if i < len(text) and text[i] == "]":
            return
        line += text.count("\n", counted, i)
        raise DataError(f"{path}:{line}: not valid JSON (expected ',' or ']' after an item)")


def item_id(path: str | Path, item: ListItem) -> str:
    """``<file stem>-<index>``: the id of a JSON-list item that has none of its own."""
    return f"{Path(path).stem}-{item.index}"


def _records_of_file(path: Path) -> Iterator[tuple[Any, str]]:
    if path.suffix == ".parquet":
        yield from _parquet_rows(path)
    elif path.suffix == ".json" and _first_char(path) == "[":
        for item, where in iter_json_list(path):
            yield item.value, where
    else:  # JSON lines (.jsonl, or a .json file holding one object per line)
        for _, record, where in iter_jsonl(path):
            yield record, where


def _first_char(path: Path) -> str:
    with path.open(encoding="utf-8", errors="replace") as f:
        while True:
            chunk = f.read(4096)
            if not chunk:
                return ""
            stripped = chunk.lstrip()
            if stripped:
                return stripped[0]


def from_deepeyes(record: Any, base: Path, where: str) -> dict[str, Any]:
    """A row of DeepEyes' released training parquet files (verl layout) as a project record::

        {"prompt": [{"role": "system", "content": ...},
                    {"role": "user", "content": "<image>\nWhat is the colour of ...?"}],
         "images": [{"bytes": b"...", "path": "..."}],
         "reward_model": {"ground_truth": "B", "style": "model"},
         "data_source": "...", "env_name": "visual_toolbox_v2", "extra_info": {...}}

    The last user turn is the question (``<image>`` placeholders removed, the images in front),
    ``reward_model.ground_truth`` the target (:func:`answer_value`). The per-row tool switch
    goes to ``meta.tools`` (read by the tool loop: ``False`` offers no tool and runs no call):
    on when ``env_name`` names a tool environment, off when the row has an empty one (the
    no-tool reasoning subset); without ``env_name``, ``extra_info.need_tools_kwargs`` decides,
    else on. ``data_source`` and ``ability`` are kept in ``meta``."""
    if not isinstance(record, dict) or not isinstance(record.get("prompt"), list):
        raise DataError(f"{where}: expected a DeepEyes row with a 'prompt' message list")
    users = [m for m in record["prompt"] if isinstance(m, dict) and m.get("role") == "user"]
    question = users[-1].get("content") if users else None
    if isinstance(question, list):  # content parts: keep the text
        question = "".join(str(p.get("text", "")) for p in question if isinstance(p, dict))
    if not isinstance(question, str):
        raise DataError(f"{where}: the prompt needs a user turn with text content")
    truth = record.get("reward_model")
    if not isinstance(truth, dict) or truth.get("ground_truth") is None:
        raise DataError(f"{where}: no reward_model.ground_truth")
    images = record.get("images") or []
    if not isinstance(images, list):
        raise DataError(f"{where}: 'images' must be a list")
    extra = record.get("extra_info") if isinstance(record.get("extra_info"), dict) else {}
    if "env_name" in record:
        tools = bool(record["env_name"])
    else:
        tools = bool(extra.get("need_tools_kwargs", True))
    meta = {"tools": tools}
    for key in ("data_source", "ability"):
        if record.get(key) is not None:
            meta[key] = record[key]
    record_id = extra.get("index", record.get("id"))
    media = [("image", images)] if images else []
    return _user_record(
        record_id, question, media, answer_value(truth["ground_truth"]), meta, base, where
    )


def _parquet_rows(path: Path) -> Iterator[tuple[Any, str]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(
            f"{path}: reading parquet needs pyarrow (pip install 'mmrft[data]')"
        ) from None
    try:
        table = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises its own error types for a bad file
        raise DataError(f"{path}: not a readable parquet file ({exc})") from None
    number = 0
    for batch in table.iter_batches(batch_size=256):
        for row in batch.to_pylist():
            number += 1
            yield row, f"{path} row {number}"


def _did_you_mean(name: str, names: list[str]) -> str:
    from mmrft.plugins import did_you_mean  # plugins imports nothing of data: no cycle at use

    return did_you_mean(name, names)


def _hf_dataset_rows(path: Path, split: str | None = None) -> Iterator[tuple[Any, str]]:
    """Rows of a directory written by ``datasets``' ``save_to_disk`` (of a ``DatasetDict``: the
    split ``split``); image and audio columns as their stored ``{"bytes", "path"}`` (never
    decoded here)."""
    try:
        import datasets
    except ImportError:
        raise DataError(
            f"{path}: a Hugging Face datasets directory needs datasets (pip install 'mmrft[data]')"
        ) from None
    loaded = datasets.load_from_disk(str(path))
    if isinstance(loaded, datasets.DatasetDict):
        first = next(iter(loaded))
        if split is None:
            raise DataError(
                f"{path}: holds the splits {', '.join(loaded)}; name one as {path}:{first}"
            )
        if split not in loaded:
            raise DataError(f"{path}: no split '{split}'; {_did_you_mean(split, list(loaded))}")
        loaded = loaded[split]
    elif split is not None:
        raise DataError(f"{path}:{split}: {path} holds one dataset, not splits; drop ':{split}'")
    for name, feature in loaded.features.items():
        if isinstance(feature, (datasets.Image, datasets.Audio)):
            loaded = loaded.cast_column(name, type(feature)(decode=False))
    for number, row in enumerate(loaded, start=1):
        yield row, f"{path} row {number}"


def iter_records(path: str | Path) -> Iterator[tuple[Any, str]]:
    """``(record, where)`` for every record of a dataset, whatever holds it: JSON lines
    (``.jsonl``, or a ``.json`` file of one object per line), a ``.json`` file holding one list,
    a ``.parquet`` file, a directory written by Hugging Face ``datasets`` (``save_to_disk``: a
    ``state.json`` inside; a ``DatasetDict``'s split as ``folder:split``), or a directory of such files (a hub snapshot's ``data/*.parquet``),
    read in name order. ``where`` names the file and the line (``file:12``), the list item
    (``file:12 (item 3)``) or the row (``file row 12``). A record that is not valid JSON comes
    as a DataError to raise or skip."""
    path = Path(path)
    folder, _, split = str(path).rpartition(":")
    if not path.exists() and folder and split and "/" not in split and Path(folder).is_dir():
        yield from _hf_dataset_rows(Path(folder), split)  # `folder:split` of a DatasetDict
        return
    if path.is_dir():
        if (path / "state.json").is_file() or (path / "dataset_dict.json").is_file():
            yield from _hf_dataset_rows(path)
            return
        files = sorted(
            p
            for p in path.rglob("*")
            if p.suffix in (".parquet", ".jsonl", ".json") and p.is_file()
        )
        files = [p for p in files if p.name not in ("dataset_info.json", "state.json")]
        if not files:
            raise DataError(f"{path}: no .parquet, .jsonl or .json files in this directory")
        for file in files:
            yield from _records_of_file(file)
        return
    if not path.is_file():
        raise DataError(f"dataset file not found: {path}")
    yield from _records_of_file(path)


# ---------------------------------------------------------------------------------------------
# Budgets: what one sample may cost, checked when it is read


CHARS_PER_TOKEN = 32
"""Bound on characters per token used to refuse an over-long text before tokenising it: a
prompt whose text has more than ``max_prompt_tokens × 32`` characters is over the budget
whatever the tokenizer (BPE tokens of natural text average 3–5 characters)."""


class RemoteMediaError(DataError):
    """Remote media without ``data.allow_remote_media``: a decision for the user, raised
    whatever ``data.on_error`` says."""


@dataclass(frozen=True)
class DataBudget:
    """What one sample may cost, checked by :func:`collect_samples` when a dataset is read under
    :func:`reading_budget`, before any model is loaded. Each bound is ``None`` for none; the
    names are the config keys (``data.*``) the messages tell the user to raise.

    Attributes:
        max_prompt_tokens: tokens of the rendered prompt's text (media placeholders counted as
            the tokenizer writes them, not the visual tokens they expand to). A text longer
            than ``max_prompt_tokens ×`` :data:`CHARS_PER_TOKEN` characters is refused without
            tokenising it.
        count_tokens: ``sample -> tokens`` of its rendered prompt, or an upper bound of them
            when that is within ``max_prompt_tokens`` (the trainer builds it from the
            processor; ``None``: only the character bound applies).
        max_image_pixels: source W·H of an image or a video frame (pixels), read from the
            file header before anything is decoded: a decompression bomb costs nothing.
        max_video_seconds / max_video_frames: a video's duration (s) and frame count, from the
            container's metadata.
        max_audio_seconds: an audio file's length (s), from its header (soundfile ``info``).
        allow_remote_media: ``http(s)://`` (any non-file URL) media are refused unless true;
            remote files cannot be checked by header, so the other media bounds skip them.
    """

    max_prompt_tokens: int | None = None
    count_tokens: Callable[[Sample], int] | None = None
    max_image_pixels: int | None = None
    max_video_seconds: float | None = None
    max_video_frames: int | None = None
    max_audio_seconds: float | None = None
    allow_remote_media: bool = True

    def check_remote(self, sample: Sample, where: str) -> None:
        """DataError naming ``where``, the URL and ``data.allow_remote_media`` when ``sample``
        has remote media and they are not allowed (raised whatever ``data.on_error`` says)."""
        if self.allow_remote_media:
            return
        for source in sample.media():
            if "://" in source and not source.startswith("file://"):
                raise RemoteMediaError(
                    f"{where}: remote media {source!r:.120} are fetched only with "
                    "data.allow_remote_media=true"
                )

    def check_media(self, sample: Sample) -> None:
        """The media bounds, from file headers only; a file that cannot be read is left to
        the model family's check, which names it."""
        for kind in MEDIA_TYPES:
            for source in sample.media(kind):
                path = local_media_path(source)
                if path is not None and os.path.isfile(path):
                    {"image": self._image, "video": self._video, "audio": self._audio}[kind](path)

    def _image(self, path: str) -> None:
        if self.max_image_pixels is None:
            return
        from PIL import Image

        # PIL's own guard (Image.MAX_IMAGE_PIXELS) is left as it is: it warns above its value
        # and refuses above twice it, when the header is read; this bound acts first.
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                with Image.open(path) as image:  # lazy: reads the header, decodes nothing
                    width, height = image.size
        except Image.DecompressionBombError as exc:  # over 2 × PIL's limit, whatever ours is
            raise DataError(
                f"{path}: image over PIL's decompression-bomb limit ({exc}; "
                "PIL.Image.MAX_IMAGE_PIXELS, which data.max_image_pixels does not lift)"
            ) from None
        except Exception:  # not an image PIL reads: the family's check names it
            return
        self._pixels(path, "image", width, height)

    def _pixels(self, path: str, what: str, width: int, height: int) -> None:
        if self.max_image_pixels is not None and width * height > self.max_image_pixels:
            raise DataError(
                f"{path}: {what} over data.max_image_pixels ({width}×{height} = "
                f"{width * height:,} pixels > {self.max_image_pixels:,}; raise "
                "data.max_image_pixels, or data.on_error=skip to skip such samples)"
            )

    def _video(self, path: str) -> None:
        if (self.max_image_pixels, self.max_video_seconds, self.max_video_frames) == (None,) * 3:
            return
        from mmrft.data.video import probe_video

        info = probe_video(path)  # headers only, memoised (the family's check probes it too)
        self._pixels(path, "video frame", info.width, info.height)
        if self.max_video_seconds is not None and info.duration_s > self.max_video_seconds:
            raise DataError(
                f"{path}: video over data.max_video_seconds ({info.duration_s:.1f} s > "
                f"{self.max_video_seconds:g} s; raise data.max_video_seconds, or "
                "data.on_error=skip to skip such samples)"
            )
        if self.max_video_frames is not None and info.total_frames > self.max_video_frames:
            raise DataError(
                f"{path}: video over data.max_video_frames ({info.total_frames:,} frames > "
                f"{self.max_video_frames:,}; raise data.max_video_frames, or "
                "data.on_error=skip to skip such samples)"
            )

    def _audio(self, path: str) -> None:
        if self.max_audio_seconds is None:
            return
        import importlib.util

        if importlib.util.find_spec("soundfile") is None:
            return  # the audio families need it and say so
        from mmrft.data.audio import audio_duration

        seconds = audio_duration(path)
        if seconds > self.max_audio_seconds:
            raise DataError(
                f"{path}: audio over data.max_audio_seconds ({seconds:.1f} s > "
                f"{self.max_audio_seconds:g} s; raise data.max_audio_seconds, or "
                "data.on_error=skip to skip such samples)"
            )

    def check_text(self, sample: Sample, where: str) -> None:
        """The prompt length bound in characters (free: nothing is tokenised)."""
        if self.max_prompt_tokens is None:
            return
        chars = sum(
            len(content)
            if isinstance(content, str)
            else sum(len(p.get("text", "")) for p in content)
            for content in (message.get("content") or "" for message in sample.messages)
        )
        if chars > self.max_prompt_tokens * CHARS_PER_TOKEN:
            bound = f"{self.max_prompt_tokens:,} × {CHARS_PER_TOKEN}"
            self._over_long(where, f"{chars:,} characters > {bound}")

    def check_tokens(self, sample: Sample, where: str) -> None:
        """The prompt length bound in tokens of the rendered prompt (:attr:`count_tokens`)."""
        if self.max_prompt_tokens is None or self.count_tokens is None:
            return
        tokens = self.count_tokens(sample)
        if tokens > self.max_prompt_tokens:
            self._over_long(where, f"{tokens:,} tokens > {self.max_prompt_tokens:,}")

    def _over_long(self, where: str, length: str) -> None:
        raise DataError(
            f"{where}: prompt over data.max_prompt_tokens ({length}; raise "
            "data.max_prompt_tokens, or data.on_error=skip to skip such samples)"
        )


_BUDGET: contextvars.ContextVar[DataBudget | None] = contextvars.ContextVar(
    "mmrft_data_budget", default=None
)


@contextlib.contextmanager
def reading_budget(budget: DataBudget) -> Iterator[DataBudget]:
    """Every dataset read inside the ``with`` block (:func:`collect_samples`) checks each
    sample against ``budget``: remote media first (an error whatever ``on_error`` says), then
    the media bounds by header before the reader's own media check decodes anything, then the
    prompt length after it (raised or skipped and counted as any bad line)."""
    token = _BUDGET.set(budget)
    try:
        yield budget
    finally:
        _BUDGET.reset(token)


def collect_samples(
    path: str | Path,
    items: Iterable[tuple[Any, str]],
    parse: Callable[[Any, str], Sample],
    on_error: OnError = "raise",
    check: Callable[[Sample], None] | None = None,
) -> tuple[list[Sample], ReadStats]:
    """Samples from ``(record, where)`` items: the raise / skip-and-count loop of every reader.

    ``parse(record, where)`` builds a Sample or raises DataError naming ``where``; a record that
    is itself a DataError (an unreadable line) is raised as is. Duplicate ids are errors.
    ``check(sample)`` may raise DataError (a missing or corrupt image, say); its message gets
    the item's ``where`` in front when it does not name it already, so an error always names
    both the dataset item and the media file. With ``on_error="skip"`` failing items are
    skipped and counted in the returned :class:`ReadStats` (by reason, e.g. ``image file not
    found``); otherwise the first error propagates. Inside :func:`reading_budget` each sample
    is also checked against the :class:`DataBudget`. Each sample keeps its ``where``.
    """
    stats = ReadStats(str(path))
    budget = _BUDGET.get()
    samples: list[Sample] = []
    seen: set[str] = set()
    for record, where in items:
        stats.read += 1
        try:
            if isinstance(record, DataError):
                raise record
            sample = parse(record, where)
            sample.where = where
            if sample.id in seen:
                raise DataError(f"{where}: duplicate id '{sample.id}'")
            if budget is not None:
                budget.check_remote(sample, where)
                budget.check_text(sample, where)
                budget.check_media(sample)
            if check is not None:
                check(sample)
            if budget is not None:
                budget.check_tokens(sample, where)
        except DataError as exc:
            message = str(exc)
            if on_error == "skip" and not isinstance(exc, RemoteMediaError):
                # the reason without "file:line: " (an item's error) or "path: " (a media check's)
                stats.skip(message.split(": ", 1)[-1].split(" (")[0], where)
                continue
            if message.startswith(where):
                raise
            raise DataError(f"{where}: {message}") from None  # a media check names the file only
        seen.add(sample.id)
        samples.append(sample)
        stats.kept += 1
    return samples, stats


def read_records(
    path: str | Path,
    parse: Callable[[Any, Path, str], Sample],
    on_error: OnError = "raise",
    check: Callable[[Sample], None] | None = None,
    media_root: str | Path | None = None,
) -> tuple[list[Sample], ReadStats]:
    """Read a dataset in any container (:func:`iter_records`) with
    ``parse(record, base, where) -> Sample``, through :func:`collect_samples`. ``base``, the
    folder relative media paths are relative to, is ``media_root`` when given, else the
    dataset file's folder (the directory itself for a dataset directory)."""
    path = Path(path)
    base = Path(media_root) if media_root else (path if path.is_dir() else path.parent)
    return collect_samples(
        path, iter_records(path), lambda r, where: parse(r, base, where), on_error, check
    )


def read_json_list(
    path: str | Path,
    parse: Callable[[Any, str, str], Sample],
    on_error: OnError = "raise",
    check: Callable[[Sample], None] | None = None,
) -> tuple[list[Sample], ReadStats]:
    """Read a file holding one JSON list (:func:`iter_json_list`) with
    ``parse(value, where, item_id) -> Sample``, through :func:`collect_samples`; ``item_id``
    is ``<file stem>-<index>`` (:func:`item_id`), the id of an item that has none."""

    def parse_item(item: ListItem, where: str) -> Sample:
        return parse(item.value, where, item_id(path, item))

    return collect_samples(path, iter_json_list(path), parse_item, on_error, check)


def position(where: str) -> str:
    """The line, item or row number that ends a ``where`` (the id of a record without one)."""
    found = re.search(r"(\d+)\D*$", where)
    return found.group(1) if found else where


def default_id(where: str) -> str:
    """``<file stem>-<line, item or row number>``: the id of a record that has none."""
    file = re.sub(r"(:\d+( \(item \d+\))?| row \d+)$", "", where)
    return f"{Path(file).stem}-{position(where)}"


def require_fields(record: Any, keys: Iterable[str], where: str) -> dict[str, Any]:
    """``record`` when it is a JSON object holding every one of ``keys``, else a DataError
    naming ``where`` and the missing fields (for a task's own dataset formats)."""
    if not isinstance(record, dict):
        raise DataError(f"{where}: expected a JSON object")
    missing = [k for k in keys if k not in record]
    if missing:
        raise DataError(f"{where}: missing field {', '.join(repr(k) for k in missing)}")
    return record


def string_field(record: dict[str, Any], key: str, where: str) -> str:
    """``record[key]`` stripped, when it is a non-empty string, else a DataError."""
    value = record.get(key)
    if not isinstance(value, str) or not value.strip():
        raise DataError(f"{where}: '{key}' must be a non-empty string, got {value!r}")
    return value.strip()


def parse_mmrft_record(record: Any, base: Path, where: str) -> Sample:
    """Parse one line of the project's JSONL format (see the module docstring)."""
    if not isinstance(record, dict):
        raise DataError(f"{where}: expected a JSON object")
    missing = [k for k in ("messages", "target") if k not in record]
    if missing:
        raise DataError(
            f"{where}: missing field {', '.join(repr(k) for k in missing)} (the project's "
            "layout); records with standard columns (a question: "
            f"{'/'.join(STANDARD_FIELDS['question'])}; an answer: "
            f"{'/'.join(STANDARD_FIELDS['answer'])}; media: image(s)/video(s)/audio(s)) are "
            "read as they are; any other layout through data.fields"
        )
    meta = record.get("meta") or {}
    if not isinstance(meta, dict):
        raise DataError(f"{where}: 'meta' must be an object")
    sample_id = str(record["id"]) if record.get("id") is not None else position(where)
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


# ---------------------------------------------------------------------------------------------
# Other layouts of a record: a field mapping, and LLaVA / VLM-R1 conversations

LAYOUTS = ("mmrft", "conversations", "deepeyes")
"""Record layouts every task reads (``data.format``): the project's own (or any layout through
``data.fields``), ``conversations`` and ``deepeyes`` (DeepEyes' parquet rows)."""

FIELD_ROLES = ("id", "question", "answer", "image", "video", "audio", "options")
"""What ``data.fields`` maps: which key of a record holds each. Any other name in the mapping
copies its key into ``meta`` under that name (``category: subject`` → ``meta.category``)."""

_PLACEHOLDER = re.compile(r"<(image|video|audio)>\n?")
_TAGGED_ANSWER = re.compile(r"\s*<answer>(.*?)</answer>\s*", re.S)
_JSON_LITERAL = re.compile(r"\s*(-?\d+(\.\d+)?([eE][-+]?\d+)?|\[.*\]|\{.*\})\s*", re.S)


def answer_value(value: Any) -> Any:
    """A ground truth as datasets write it, made a target: a text wrapped in
    ``<answer>…</answer>`` (R1-V, Video-R1) is unwrapped, and a text that is a JSON number,
    list or object (``"3"``, ``"[10, 20, 30, 40]"``) is parsed; anything else is kept."""
    if not isinstance(value, str):
        return value
    tagged = _TAGGED_ANSWER.fullmatch(value)
    text = (tagged.group(1) if tagged else value).strip()
    if _JSON_LITERAL.fullmatch(text):
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            pass
    return text


def media_cache_dir() -> Path:
    """Where media stored inside a dataset (bytes in parquet / ``datasets`` columns) are written
    as files: ``$MMRFT_CACHE/media``, default ``~/.cache/mmrft/media``."""
    return Path(os.environ.get("MMRFT_CACHE", "~/.cache/mmrft")).expanduser() / "media"


_MAGIC = ((b"\x89PNG", ".png"), (b"\xff\xd8", ".jpg"), (b"GIF8", ".gif"), (b"RIFF", ".wav"))


def media_source(value: Any, base: Path, where: str) -> str:
    """A media reference of a dataset record as a path or URL: a string (relative to ``base``),
    or a ``{"path", "bytes"}`` record as ``datasets`` stores images and audio (the bytes are
    written once into :func:`media_cache_dir`, named by their hash)."""
    if isinstance(value, str) and value:
        if "\x00" in value:
            raise DataError(f"{where}: NUL byte in a media path")
        return _resolve_media(value, base)
    if isinstance(value, dict) and (value.get("bytes") or value.get("path")):
        data, name = value.get("bytes"), value.get("path") or ""
        if "\x00" in str(name):  # with bytes too: its suffix names the cached file
            raise DataError(f"{where}: NUL byte in a media path")
        if not data:
            return _resolve_media(str(name), base)
        if not isinstance(data, (bytes, bytearray)):
            raise DataError(
                f"{where}: a media value's 'bytes' must be bytes, got {type(data).__name__}"
            )
        suffix = Path(str(name)).suffix or next((s for m, s in _MAGIC if data.startswith(m)), "")
        if not suffix and data[4:8] == b"ftyp":
            suffix = ".mp4"
        target = media_cache_dir() / f"{hashlib.sha256(data).hexdigest()[:24]}{suffix or '.bin'}"
        if not target.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.{os.getpid()}")
            tmp.write_bytes(data)
            os.replace(tmp, target)
        return str(target)
    raise DataError(f"{where}: a media value must be a path or {{bytes, path}}, got {value!r:.80}")


def _lookup(record: dict[str, Any], key: str, where: str) -> Any:
    """``record[key]``, where a dotted key reads into nested objects (``annotation.box``)."""
    node: Any = record
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            raise DataError(f"{where}: no field '{key}' (data.fields)")
        node = node[part]
    return node


def _user_record(
    record_id: Any,
    text: str,
    media: list[tuple[str, Any]],
    target: Any,
    meta: dict,
    base: Path,
    where: str,
) -> dict[str, Any]:
    content = [
        {"type": kind, kind: media_source(value, base, where)}
        for kind, values in media
        for value in (values if isinstance(values, list) else [values])
    ]
    content.append({"type": "text", "text": _PLACEHOLDER.sub("", text).strip()})
    out = {"messages": [{"role": "user", "content": content}], "target": target, "meta": meta}
    if record_id is not None:
        out["id"] = str(record_id)
    return out


def split_fields(fields: dict[str, Any] | None, split: str) -> dict[str, str] | None:
    """The ``data.fields`` mapping of one split (``train`` / ``test``): the split's own when the
    mapping is given per split (``{train: {...}, test: {...}}``; ``None`` for a split it
    leaves out), else the one mapping for both."""
    if not fields:
        return None
    if any(isinstance(v, dict) for v in fields.values()):
        return fields.get(split) or None
    return fields


def check_fields(fields: dict[str, str]) -> None:
    """``data.fields`` needs ``question`` and ``answer``; every value is a key name."""
    missing = [role for role in ("question", "answer") if role not in fields]
    if missing:
        raise DataError(
            f"data.fields: map {' and '.join(missing)} too (roles: {', '.join(FIELD_ROLES)})"
        )
    bad = [name for name, key in fields.items() if not isinstance(key, str) or not key]
    if bad:
        raise DataError(f"data.fields: {', '.join(bad)} must name a key of the records")


def map_fields(record: Any, fields: dict[str, str], base: Path, where: str) -> dict[str, Any]:
    """A record of any flat layout as a project record, through ``data.fields``
    (:data:`FIELD_ROLES`): the media parts (paths, lists of paths, or stored bytes) then the
    question (``<image>``-style placeholders removed) as one user turn, the answer as the target
    (:func:`answer_value`), ``options`` as ``meta.choices``, other names as ``meta`` keys."""
    if not isinstance(record, dict):
        raise DataError(f"{where}: expected an object")
    question = _lookup(record, fields["question"], where)
    if not isinstance(question, str):
        raise DataError(f"{where}: '{fields['question']}' (the question) must be a string")
    media = [(kind, _lookup(record, fields[kind], where)) for kind in MEDIA_TYPES if kind in fields]
    meta = {
        name: _lookup(record, key, where) for name, key in fields.items() if name not in FIELD_ROLES
    }
    if "options" in fields:
        meta["choices"] = _lookup(record, fields["options"], where)
    record_id = _lookup(record, fields["id"], where) if "id" in fields else record.get("id")
    # no answer column: target None (the prompt task; other tasks refuse a missing target)
    target = answer_value(_lookup(record, fields["answer"], where)) if "answer" in fields else None
    return _user_record(record_id, question, media, target, meta, base, where)


_MEDIA_KEYS = {
    "image": ("image", "images"),
    "video": ("video", "videos"),
    "audio": ("audio", "audios"),
}


def from_conversations(record: Any, base: Path, where: str) -> dict[str, Any]:
    """A record of the LLaVA / VLM-R1 ``conversations`` layout as a project record::

        {"id": 1, "image": "coco/train2014/COCO_train2014_000000000009.jpg",
         "conversations": [{"from": "human", "value": "<image>Where is the red cup?"},
                           {"from": "gpt", "value": "[61, 40, 212, 180]"}]}

    The first human (or ``user``) turn is the question, the next gpt (or ``assistant``) turn
    the answer (:func:`answer_value`); ``image``/``images``, ``video``/``videos`` and
    ``audio``/``audios`` (a path or a list) are the media; a ``meta`` object is kept."""
    if not isinstance(record, dict) or not isinstance(record.get("conversations"), list):
        raise DataError(f"{where}: expected an object with a 'conversations' list")
    turns = [t for t in record["conversations"] if isinstance(t, dict)]
    asked = next((i for i, t in enumerate(turns) if t.get("from") in ("human", "user")), None)
    answered = next(
        (t for t in turns[(asked or 0) + 1 :] if t.get("from") in ("gpt", "assistant")), None
    )
    if asked is None or answered is None:
        raise DataError(f"{where}: 'conversations' needs a human turn and a gpt turn after it")
    question, answer = turns[asked].get("value"), answered.get("value")
    if not isinstance(question, str) or answer is None:
        raise DataError(f"{where}: the human and gpt turns need a 'value'")
    media = [
        (kind, record[key]) for kind, keys in _MEDIA_KEYS.items() for key in keys if record.get(key)
    ]
    meta = record.get("meta") if isinstance(record.get("meta"), dict) else {}
    return _user_record(
        record.get("id"), question, media, answer_value(answer), dict(meta), base, where
    )


STANDARD_FIELDS: dict[str, tuple[str, ...]] = {
    "question": ("question", "problem", "prompt", "query"),
    "answer": ("answer", "solution", "ground_truth"),
    "image": ("image", "images"),
    "video": ("video", "videos"),
    "audio": ("audio", "audios"),
    "options": ("options", "choices"),
    "id": ("id", "problem_id", "uid"),
}
"""Column names read without ``data.fields``, by role, first match wins (TRL's and EasyR1's
``prompt``/``problem``, ``solution``, ``image(s)``; the common ``question``/``answer``)."""


def standard_fields(record: Any) -> dict[str, str] | None:
    """The ``data.fields`` mapping a record's standard column names imply
    (:data:`STANDARD_FIELDS`; the answer optional, its target then ``None``), plus every other
    column holding a JSON value as a ``meta`` key of its own name; ``None`` when it is a
    project record (``messages``) or lacks a text question."""
    if not isinstance(record, dict) or "messages" in record:
        return None
    mapping = {}
    for role, names in STANDARD_FIELDS.items():
        found = next((n for n in names if n in record), None)
        if found is not None:
            mapping[role] = found
    if "question" not in mapping:
        return None
    if not isinstance(record[mapping["question"]], str):
        return None  # a conversational prompt (a message list): data.fields or conversations
    used = set(mapping.values())
    for key, value in record.items():  # other columns go to meta, as TRL hands them over
        if key not in used and key not in FIELD_ROLES and isinstance(value, _COLUMN_TYPES):
            mapping[key] = key
    return mapping


_COLUMN_TYPES = (str, int, float, bool, list, dict, type(None))
"""Values of other columns kept in ``meta`` (JSON values: not stored bytes or arrays)."""


def standard_or_project(record: Any, base: Path, where: str) -> Any:
    """A project record as it is, a record with standard columns through the mapping they
    imply (:func:`standard_fields`, :func:`map_fields`)."""
    mapping = standard_fields(record)
    return record if mapping is None else map_fields(record, mapping, base, where)


def record_layout(
    fmt: str, fields: dict[str, str] | None = None
) -> Callable[[Any, Path, str], Any] | None:
    """How a record of layout ``fmt`` (:data:`LAYOUTS`) becomes a project record:
    :func:`map_fields` when ``fields`` is given, :func:`from_conversations`,
    :func:`from_deepeyes`, or for ``mmrft`` the record itself or, with standard column names,
    their implied mapping (:func:`standard_or_project`)."""
    if fields:
        if fmt != "mmrft":
            raise DataError(
                f"data.fields: a field mapping reads flat records; data.format is '{fmt}'"
            )
        check_fields(fields)
        return lambda record, base, where: map_fields(record, fields, base, where)
    return {
        "conversations": from_conversations,
        "deepeyes": from_deepeyes,
        "mmrft": standard_or_project,
    }.get(fmt)
