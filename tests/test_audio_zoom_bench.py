"""``audio_zoom`` ("looking closer" in audio: the asked tone comes after the seconds the model
keeps; scripts/make_benchmarks.py) and its oracle rows (benchmarks/zoom_oracle.py), on a few
clips generated into a temp dir and on the bundled split: the tone after the base view and
inside the clip, the stated time near its onset, balanced targets, deterministic bytes, and
the numbers that say the clip is needed (a fixed spectral reader at chance on the truncated
view, always right on ``[t − 1, t + 1]`` around the stated time)."""

from __future__ import annotations

import importlib.util
import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from mmrft.data.audio import load_audio
from mmrft.rewards.task import build_task

pytest.importorskip("soundfile")  # the audio extra: the generator writes FLAC with it

REPO = Path(__file__).resolve().parents[1]
BUNDLED = REPO / "assets" / "benchmarks" / "audio_zoom"
RATE = 16_000
N = 8  # clips per generated set (2 per class)
CHOICES = ["low", "middle", "high", "very high"]


def load_oracle():
    spec = importlib.util.spec_from_file_location(
        "zoom_oracle", REPO / "benchmarks" / "zoom_oracle.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ORACLE = load_oracle()
GENERATOR = ORACLE.load_generator()


def write(root: Path, n: int, seed: list[int], split: str = "test") -> Path:
    """Write ``n`` samples of ``audio_zoom`` into ``root/audio_zoom``; the JSONL path."""
    folder = root / "audio_zoom"
    folder.mkdir(parents=True, exist_ok=True)
    GENERATOR.write_audio_zoom(folder, split, n, np.random.default_rng(seed))
    return folder / f"{split}.jsonl"


def records(jsonl: Path) -> list[dict]:
    return [json.loads(line) for line in jsonl.read_text(encoding="utf-8").splitlines()]


def audio_path(jsonl: Path, record: dict) -> Path:
    return jsonl.parent / record["messages"][0]["content"][0]["audio"]


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> Path:
    return write(tmp_path_factory.mktemp("audio_zoom"), N, [115, 1])


def test_registered_as_classification_with_its_sizes():
    benchmark = GENERATOR.BENCHMARKS["audio_zoom"]
    assert benchmark.seed == 115 and benchmark.task == "classification"
    assert benchmark.write is GENERATOR.write_audio_zoom
    assert benchmark.splits == {"train": 200, "test": 48}
    assert list(GENERATOR.AUDIO_ZOOM_PITCHES) == CHOICES


def test_the_tone_lies_after_the_base_view_and_inside_the_clip(clips):
    for record in records(clips):
        meta = record["meta"]
        pcm, rate = GENERATOR.read_pcm(audio_path(clips, record))
        assert rate == meta["sample_rate"] == RATE and pcm.dtype == np.int16
        assert len(pcm) == round(meta["duration"] * RATE) and 8.0 <= meta["duration"] <= 10.0
        start, end = meta["target_span"]
        assert meta["base_seconds"] == 2.0 < start and 0.2 - 1e-9 <= end - start <= 0.4 + 1e-9
        assert end <= meta["duration"] - 0.9
        first, last = round(start * RATE), round(end * RATE)
        tone = pcm[first:last].astype(float)
        assert np.abs(tone).max() > 0.1 * 32767, record["id"]
        spectrum = np.abs(np.fft.rfft(tone))
        peak = np.fft.rfftfreq(len(tone), 1 / RATE)[spectrum.argmax()]
        assert abs(peak / meta["frequency_hz"] - 1) < 0.01, record["id"]
        centre = GENERATOR.AUDIO_ZOOM_PITCHES[record["target"]]
        assert abs(meta["frequency_hz"] / centre - 1) <= 0.05 + 1e-3
        # everything else is silence but the knocks, which keep their distance from the tone
        sounding = np.zeros(len(pcm), dtype=bool)
        sounding[first:last] = True
        assert 1 <= len(meta["knocks"]) <= 2
        for k0, k1 in meta["knocks"]:
            assert k1 <= start - 0.5 or k0 >= end + 0.5, record["id"]
            sounding[round(k0 * RATE) : round(k1 * RATE)] = True
        assert not pcm[~sounding].any(), record["id"]
        assert not pcm[first - 1] and not pcm[last]


def test_the_question_states_the_time_near_the_onset(clips):
    for record in records(clips):
        meta = record["meta"]
        t, (start, end) = meta["asked_time"], meta["target_span"]
        question = record["messages"][0]["content"][1]["text"]
        assert question == f"What is the pitch of the short tone at about {t:.1f} s?"
        assert t == round(t, 1) and abs(t - start) <= 0.25 + 1e-9  # within ±0.3 s
        assert t > meta["base_seconds"]
        assert 0 <= t - 1 <= start and end <= t + 1 <= meta["duration"]  # the clip window


def test_targets_are_balanced_and_the_task_reads_them(clips):
    assert Counter(r["target"] for r in records(clips)) == {c: N // 4 for c in CHOICES}
    task = build_task("classification")
    samples, _ = task.read(clips)
    assert len(samples) == N
    for sample in samples:
        assert sample.meta["choices"] == CHOICES and sample.target in CHOICES
        assert task.reference_answer(sample) == sample.target


def test_the_bundled_splits(tmp_path):
    benchmark = GENERATOR.BENCHMARKS["audio_zoom"]
    for split, n in benchmark.splits.items():
        rows = records(BUNDLED / f"{split}.jsonl")
        assert len(rows) == n and len({r["id"] for r in rows}) == n
        counts = Counter(r["target"] for r in rows)
        assert set(counts) == set(CHOICES) and max(counts.values()) - min(counts.values()) <= 1
        for row in rows:
            assert row["meta"]["choices"] == CHOICES
            assert row["meta"]["target_span"][0] > row["meta"]["base_seconds"] == 2.0
            assert audio_path(BUNDLED / f"{split}.jsonl", row).is_file()
    size = sum(p.stat().st_size for p in BUNDLED.rglob("*") if p.is_file())
    assert size <= 3_000_000, f"audio_zoom takes {size / 1e6:.2f} MB"
    # the test split regenerated alone equals the committed one (samples, JSONL bytes)
    GENERATOR.generate("audio_zoom", tmp_path, ["test"])
    assert GENERATOR.differences(BUNDLED, tmp_path / "audio_zoom", partial=True) == []


def file_bytes(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_generation_is_deterministic_and_check_compares_samples(tmp_path):
    for run in ("a", "b"):
        write(tmp_path / run, 4, [7, 0])
    write(tmp_path / "c", 4, [8, 0])
    a, b, c = (file_bytes(tmp_path / run / "audio_zoom") for run in "abc")
    assert len(a) == 5 and a == b
    assert a["test.jsonl"] != c["test.jsonl"]
    # --check reads FLACs by samples: a 1-LSB change passes, a 2-LSB change does not
    folder = tmp_path / "b" / "audio_zoom"
    path = folder / "audio" / "test-0000.flac"
    pcm, _ = GENERATOR.read_pcm(path)
    for step, expected in ((1, []), (2, ["audio/test-0000.flac: samples differ"])):
        changed = pcm.astype(float) / 32767
        changed[0] += step / 32767
        GENERATOR.save_flac(changed, path)
        assert GENERATOR.differences(tmp_path / "a" / "audio_zoom", folder) == expected


def test_the_family_loads_the_flac_and_its_truncation_holds_no_tone(clips):
    for record in records(clips)[:4]:
        path = str(audio_path(clips, record))
        whole = load_audio(path, RATE)
        pcm, _ = GENERATOR.read_pcm(Path(path))
        assert np.array_equal(whole, pcm / np.float32(32768))  # no resampling, lossless
        with ORACLE.quiet_truncation():
            base = load_audio(path, RATE, max_seconds=2.0, policy="truncate")
        assert base.size == 2 * RATE
        span = np.zeros(whole.size, dtype=bool)
        start, end = record["meta"]["target_span"]
        span[round(start * RATE) : round(end * RATE)] = True
        assert not span[: base.size].any()


def test_the_reader_hears_tones_and_guesses_on_silence_and_knocks():
    t = np.arange(RATE) / RATE
    for name, centre in GENERATOR.AUDIO_ZOOM_PITCHES.items():
        for factor in (0.95, 1.05):
            tone = 0.2 * np.sin(2 * np.pi * centre * factor * t) * GENERATOR.fade(RATE, 160)
            order = [c for c in CHOICES if c != name] + [name]  # the guess is never right
            assert ORACLE.read_pitch(tone, RATE, order) == name
    assert ORACLE.read_pitch(np.zeros(RATE), RATE, CHOICES[::-1]) == "very high"
    knock = np.zeros(RATE)
    knock[100:292] = 0.25 * np.exp(-np.arange(192) / 32) * np.random.default_rng(0).normal(size=192)
    assert ORACLE.read_pitch(knock, RATE, CHOICES[::-1]) == "very high"


def test_oracle_needs_the_clip(clips):
    """Generated clips and the bundled test split: the truncated base view at chance (the
    reader's guess on a balanced split: exactly 0.25), the whole clip and the clip around the
    stated time always right."""
    for jsonl in (clips, BUNDLED / "test.jsonl"):
        rows = {r["view"].split(" (")[0]: r for r in ORACLE.evaluate_audio(jsonl)}
        base, whole = rows["first 2 s"], rows["whole clip"]
        assert base["benchmark"] == "audio_zoom" and base["n"] == len(records(jsonl))
        assert math.isclose(base["base"], 0.25) and base["crop"] == 1.0, base
        assert whole["base"] == 1.0 and whole["crop"] == 1.0, whole
