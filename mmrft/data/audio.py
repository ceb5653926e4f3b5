"""Audio loading for the audio model families: decode, mix down, resample, bound, cache.

:func:`load_audio` returns a float32 mono waveform in [-1, 1] at the model's sampling rate:

* **decoding** with ``soundfile`` (libsndfile: WAV, FLAC, OGG/Vorbis, OGG/Opus, MP3 with
  libsndfile ≥ 1.1, AIFF, ...; the format is read from the file's header, not its name).
  torchaudio is not used (see DESIGN.md); formats libsndfile cannot read (AAC/M4A, video
  containers) must be converted beforehand;
* **mono mixdown**: the mean of the channels;
* **resampling** with ``soxr`` at ``"HQ"`` quality (band-limited sinc, deterministic) to the
  rate the model's feature extractor expects (16 000 Hz for Qwen2-Audio and Qwen2.5-Omni);
  samples are clipped to [-1, 1] afterwards (sinc resampling can overshoot a full-scale input);
* **a maximum duration** (seconds) with an explicit policy: ``"truncate"`` keeps the first
  ``max_seconds`` and counts the cut in :data:`AUDIO_STATS` (``"truncated"``; a warning names
  each file the first time it is cut), ``"error"`` raises :class:`mmrft.data.DataError`;
* **a cache**: decoded, resampled (untruncated) waveforms in a process-wide LRU bounded in bytes,
  keyed by ``(path, mtime_ns, size, sampling_rate)``, so the G copies of a prompt in a GRPO group
  and later epochs do not decode again, and an edited file is reloaded. Cached arrays are
  read-only; the function returns read-only views.

A missing file, a file that is not audio (unknown format, a text file renamed ``.wav``), a
corrupt or truncated file, a file with zero samples and a file with non-finite samples all raise
:class:`mmrft.data.DataError` naming the file.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections import Counter, OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from mmrft.data.sample import DataError, media_file_key
from mmrft.typecheck import require_extra

log = logging.getLogger(__name__)

LengthPolicy = Literal["truncate", "error"]


@dataclass(frozen=True)
class AudioBudget:
    """Per-clip audio budget.

    Attributes:
        max_seconds: the longest clip the model gets, in seconds (``None``: the feature
            extractor's window, 30 s for the released Qwen2-Audio / Qwen2.5-Omni).
        policy: a longer clip is ``"truncate"``-d to its first ``max_seconds`` (counted in
            ``AUDIO_STATS["truncated"]``, a warning per file) or is an ``"error"``
            (DataError naming the file; :meth:`mmrft.models.qwen_audio.QwenAudioFamily.check_media` then rejects the
            sample when the dataset is read, under ``data.on_error``).
    """

    max_seconds: float | None = 30.0
    policy: LengthPolicy = "truncate"

    def __post_init__(self) -> None:
        if self.policy not in ("truncate", "error"):
            raise ValueError(f"audio policy must be 'truncate' or 'error', got {self.policy!r}")
        if self.max_seconds is not None and not (
            self.max_seconds > 0 and math.isfinite(self.max_seconds)
        ):
            raise ValueError(f"max_seconds must be a positive number, got {self.max_seconds!r}")


POLICIES: tuple[str, ...] = ("truncate", "error")

# Process-wide counters: "decoded" (files read from disk), "cache_hits", "resampled" (decodes
# that needed a rate change), "truncated" (waveforms returned cut to max_seconds, counted per
# call). Callers log them (the trainer's run log); tests reset them with AUDIO_STATS.clear().
AUDIO_STATS: Counter[str] = Counter()
_warned_truncated: set[str] = set()
_stats_lock = threading.Lock()


def _count(key: str, n: int = 1) -> None:
    with _stats_lock:
        AUDIO_STATS[key] += n


class AudioCache:
    """Thread-safe LRU cache of decoded waveforms, bounded by total bytes.

    Attributes:
        max_bytes: the bound (bytes); the least recently used waveforms are dropped past it.
            One 30 s clip at 16 kHz in float32 is 1.9 MB.
    """

    def __init__(self, max_bytes: int = 256 * 2**20) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[Hashable, np.ndarray] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> np.ndarray | None:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: Hashable, value: np.ndarray) -> None:
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old.nbytes
            self._items[key] = value
            self._bytes += value.nbytes
            while self._bytes > self.max_bytes and len(self._items) > 1:
                _, dropped = self._items.popitem(last=False)
                self._bytes -= dropped.nbytes

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)


AUDIO_CACHE = AudioCache()


def decode_audio(path: str) -> tuple[np.ndarray, int]:
    """Decode a file to ``(mono float32 waveform, sampling rate in Hz)``, channels averaged.

    Raises DataError naming the file when it is missing, not a format libsndfile reads,
    corrupt, empty (zero samples) or holds non-finite samples.
    """
    soundfile = require_extra("soundfile", "audio", "reading audio")

    try:
        data, rate = soundfile.read(path, dtype="float32", always_2d=True)
    except FileNotFoundError:
        raise DataError(f"{path}: audio file not found") from None
    except (soundfile.LibsndfileError, RuntimeError, OSError, ValueError, TypeError) as exc:
        raise DataError(
            f"{path}: not a readable audio file: unknown format or corrupt ({exc}); "
            "soundfile reads WAV, FLAC, OGG, MP3, AIFF and other libsndfile formats, "
            "not AAC/M4A or video containers"
        ) from None
    if data.shape[0] == 0 or data.shape[1] == 0:
        raise DataError(f"{path}: empty audio file (0 samples)")
    mono = data.mean(axis=1, dtype=np.float32) if data.shape[1] > 1 else data[:, 0]
    if not np.isfinite(mono).all():
        raise DataError(f"{path}: audio holds NaN or infinite samples")
    return np.ascontiguousarray(mono, dtype=np.float32), int(rate)


def resample(waveform: np.ndarray, from_rate: int, to_rate: int) -> np.ndarray:
    """Resample a mono float32 waveform from ``from_rate`` to ``to_rate`` (Hz) with soxr "HQ"."""
    if from_rate == to_rate:
        return waveform
    import soxr

    return np.asarray(soxr.resample(waveform, from_rate, to_rate, quality="HQ"), dtype=np.float32)


def load_audio(
    path: str,
    sampling_rate: int,
    *,
    max_seconds: float | None = None,
    policy: LengthPolicy = "truncate",
) -> np.ndarray:
    """A mono float32 waveform in [-1, 1] at ``sampling_rate`` (Hz), at most ``max_seconds``.

    Args:
        path: a local file (``file://`` prefix allowed).
        sampling_rate: target rate in Hz (the feature extractor's ``sampling_rate``).
        max_seconds: the longest audio kept, in seconds (``None``: no bound). The bound in
            samples is ``floor(max_seconds × sampling_rate)``.
        policy: what a longer file gets: ``"truncate"`` (keep the start; counted in
            ``AUDIO_STATS["truncated"]``, a warning per file) or ``"error"`` (DataError).
    Returns:
        A read-only 1-D float32 array (shared with the cache: copy it before writing).
    Raises:
        DataError naming the file (missing, unreadable, empty, too long under ``"error"``);
        ValueError for a bad ``sampling_rate``, ``max_seconds`` or ``policy``.
    """
    if policy not in POLICIES:
        raise ValueError(
            f"audio length policy must be one of {', '.join(POLICIES)}, got {policy!r}"
        )
    if not isinstance(sampling_rate, int) or sampling_rate <= 0:
        raise ValueError(f"sampling_rate must be a positive integer (Hz), got {sampling_rate!r}")
    if max_seconds is not None and not (max_seconds > 0 and math.isfinite(max_seconds)):
        raise ValueError(f"max_seconds must be a positive number of seconds, got {max_seconds!r}")
    path = os.fspath(path)
    if path.startswith("file://"):
        path = path[len("file://") :]
    key = (*media_file_key(path, "audio file"), sampling_rate)
    waveform = AUDIO_CACHE.get(key)
    if waveform is None:
        decoded, rate = decode_audio(path)
        _count("decoded")
        if rate != sampling_rate:
            _count("resampled")
        waveform = np.clip(resample(decoded, rate, sampling_rate), -1.0, 1.0).astype(
            np.float32, copy=False
        )
        if waveform.size == 0:  # a handful of samples can resample to none
            raise DataError(f"{path}: audio too short ({decoded.size} samples at {rate} Hz)")
        waveform.flags.writeable = False
        AUDIO_CACHE.put(key, waveform)
    else:
        _count("cache_hits")
    if max_seconds is not None:
        limit = math.floor(max_seconds * sampling_rate)
        if waveform.size > limit:
            seconds = waveform.size / sampling_rate
            if policy == "error":
                raise DataError(
                    f"{path}: audio is {seconds:.2f} s, longer than the {max_seconds:g} s limit "
                    "(raise the limit, or use the 'truncate' policy)"
                )
            _count("truncated")
            with _stats_lock:
                first = path not in _warned_truncated
                _warned_truncated.add(path)
            if first:
                log.warning("%s: audio of %.2f s truncated to %g s", path, seconds, max_seconds)
            waveform = waveform[:limit]
    return waveform


def audio_duration(path: str) -> float:
    """Duration of a file in seconds from its header (no decoding); DataError naming the file."""
    soundfile = require_extra("soundfile", "audio", "reading audio")

    media_file_key(path, "audio file")
    try:
        info = soundfile.info(path)
    except (soundfile.LibsndfileError, RuntimeError, OSError, ValueError, TypeError) as exc:
        raise DataError(
            f"{path}: not a readable audio file: unknown format or corrupt ({exc})"
        ) from None
    return float(info.frames) / float(info.samplerate)
