"""Audio loading: decoding, mono mixdown, resampling, the length policy, the cache, errors."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from mmrft.data import DataError
from mmrft.data.audio import AUDIO_CACHE, AUDIO_STATS, audio_duration, load_audio


def tone(freq: float, seconds: float, rate: int, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(round(seconds * rate)) / rate
    return (amplitude * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def peak_hz(waveform: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(waveform))
    return float(np.fft.rfftfreq(waveform.size, 1 / rate)[int(spectrum.argmax())])


def named(path: Path) -> str:
    """A regex matching the path literally (DataError messages start with it)."""
    import re

    return re.escape(str(path))


def test_same_rate_int16_wav_is_read_exactly(tmp_path: Path) -> None:
    pcm = (tone(440, 0.5, 16000) * 32767).astype(np.int16)
    path = tmp_path / "pcm.wav"
    sf.write(path, pcm, 16000, subtype="PCM_16")
    out = load_audio(str(path), 16000)
    assert out.dtype == np.float32 and out.ndim == 1 and out.size == 8000
    np.testing.assert_array_equal(out, pcm.astype(np.float32) / 32768)
    assert load_audio(f"file://{path}", 16000).size == 8000  # file:// paths


def test_stereo_is_mixed_to_mono(tmp_path: Path) -> None:
    left, right = np.full(4000, 0.5, np.float32), np.full(4000, 0.1, np.float32)
    path = tmp_path / "stereo.wav"
    sf.write(path, np.stack([left, right], axis=1), 16000, subtype="FLOAT")
    out = load_audio(str(path), 16000)
    assert out.shape == (4000,)
    np.testing.assert_allclose(out, 0.3, atol=1e-6)


@pytest.mark.parametrize(("rate", "fmt"), [(8000, "wav"), (44100, "flac"), (22050, "ogg")])
def test_resampling_keeps_duration_and_pitch(tmp_path: Path, rate: int, fmt: str) -> None:
    path = tmp_path / f"tone.{fmt}"
    sf.write(path, tone(440, 1.0, rate), rate)
    out = load_audio(str(path), 16000)
    assert abs(out.size - 16000) <= 1  # 1 s at 16 kHz
    assert abs(peak_hz(out, 16000) - 440) <= 2
    assert 0.4 < np.abs(out).max() <= 0.55  # amplitude kept (lossy ogg: roughly)
    assert audio_duration(str(path)) == pytest.approx(1.0, abs=1e-3)


def test_output_is_clipped_to_unit_range(tmp_path: Path) -> None:
    path = tmp_path / "hot.wav"
    sf.write(path, np.array([0.0, 1.7, -2.5, 0.25] * 100, np.float32), 16000, subtype="FLOAT")
    out = load_audio(str(path), 16000)
    assert out.max() == 1.0 and out.min() == -1.0


def test_truncate_policy_cuts_counts_and_warns_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "long.wav"
    sf.write(path, tone(300, 3.0, 8000), 8000)
    before = AUDIO_STATS["truncated"]
    with caplog.at_level(logging.WARNING, logger="mmrft.data.audio"):
        first = load_audio(str(path), 16000, max_seconds=1.25, policy="truncate")
        second = load_audio(str(path), 16000, max_seconds=1.25)
    assert first.size == second.size == 20000  # floor(1.25 s × 16 kHz)
    assert AUDIO_STATS["truncated"] - before == 2  # counted per call
    warnings = [r for r in caplog.records if "truncated" in r.getMessage()]
    assert len(warnings) == 1 and str(path) in warnings[0].getMessage()
    full = load_audio(str(path), 16000, max_seconds=None)
    assert full.size == 48000
    np.testing.assert_array_equal(first, full[:20000])  # the start is kept
    assert load_audio(str(path), 16000, max_seconds=3.0).size == 48000  # not longer: untouched


def test_error_policy_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "long.wav"
    sf.write(path, tone(300, 2.0, 16000), 16000)
    with pytest.raises(DataError, match=named(path) + r".*2\.00 s.*1\.5 s"):
        load_audio(str(path), 16000, max_seconds=1.5, policy="error")


def test_cache_hits_and_reloads_an_edited_file(tmp_path: Path) -> None:
    path = tmp_path / "cached.wav"
    sf.write(path, tone(440, 0.5, 16000), 16000)
    start = AUDIO_STATS.copy()
    a = load_audio(str(path), 16000)
    b = load_audio(str(path), 16000)
    assert AUDIO_STATS["decoded"] - start["decoded"] == 1
    assert AUDIO_STATS["cache_hits"] - start["cache_hits"] == 1
    assert not a.flags.writeable and np.array_equal(a, b)
    load_audio(str(path), 8000)  # another rate: another entry
    assert AUDIO_STATS["decoded"] - start["decoded"] == 2
    sf.write(path, tone(880, 0.25, 16000), 16000)
    os.utime(path, ns=(1, 1))  # a different mtime even on coarse clocks
    c = load_audio(str(path), 16000)
    assert c.size == 4000 and AUDIO_STATS["decoded"] - start["decoded"] == 3
    assert len(AUDIO_CACHE) >= 1 and AUDIO_CACHE.nbytes > 0


def test_unreadable_files_raise_data_error_naming_them(tmp_path: Path) -> None:
    missing = tmp_path / "missing.wav"
    text = tmp_path / "notes.wav"
    text.write_text("this is not audio\n" * 20)
    empty_wav = tmp_path / "empty.wav"
    sf.write(empty_wav, np.zeros((0, 1), np.float32), 16000)
    zero_bytes = tmp_path / "zero.flac"
    zero_bytes.write_bytes(b"")
    folder = tmp_path / "folder.wav"
    folder.mkdir()
    cases = {
        missing: "not found",
        text: "not a readable audio file",
        empty_wav: "empty",
        zero_bytes: "not a readable audio file",
        folder: "not a file",
    }
    for path, reason in cases.items():
        with pytest.raises(DataError, match=named(path) + ".*" + reason):
            load_audio(str(path), 16000)
    with pytest.raises(DataError, match=named(text)):
        audio_duration(str(text))


def test_non_finite_samples_are_rejected(tmp_path: Path) -> None:
    path = tmp_path / "nan.wav"
    sf.write(path, np.array([0.0, np.nan, 0.1], np.float32), 16000, subtype="FLOAT")
    with pytest.raises(DataError, match=named(path) + ".*NaN"):
        load_audio(str(path), 16000)


def test_bad_arguments(tmp_path: Path) -> None:
    path = tmp_path / "ok.wav"
    sf.write(path, tone(440, 0.1, 16000), 16000)
    with pytest.raises(ValueError, match="policy"):
        load_audio(str(path), 16000, policy="drop")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sampling_rate"):
        load_audio(str(path), 0)
    with pytest.raises(ValueError, match="max_seconds"):
        load_audio(str(path), 16000, max_seconds=-1.0)
