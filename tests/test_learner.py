"""scripts/make_learner.py: the learner's pretraining runs end to end on a few fresh samples,
never on a benchmark's test media, and writes a loadable checkpoint with its record."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _script():
    """scripts/make_learner.py as the module ``make_learner`` (imported once)."""
    if "make_learner" not in sys.modules:
        path = REPO / "scripts" / "make_learner.py"
        spec = importlib.util.spec_from_file_location("make_learner", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["make_learner"] = module
        spec.loader.exec_module(module)
    return sys.modules["make_learner"]


@pytest.mark.slow  # make test-slow: 10-16 s of make test's ten minutes
def test_a_short_pretraining_writes_the_learner_and_its_record(tmp_path: Path) -> None:
    out, cache = tmp_path / "learner", tmp_path / "cache"
    command = [
        sys.executable, str(REPO / "scripts" / "make_learner.py"), "--only", "shapes_grounding",
        "--samples", "12", "--steps", "3", "--batch-size", "2", "--log-every", "1",
        "--threads", "1", "--held-out", "8", "--out", str(out), "--cache", str(cache),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    record = json.loads((out / "pretraining.json").read_text())
    assert record["mixture"] == {"shapes_grounding": 12} and record["steps"] == 3
    assert [step for step, _ in record["loss"]["shapes_grounding"]] == [1, 2, 3]
    held = record["held_out"]["shapes_grounding"]["acc@0.5"]
    assert 0.0 <= held <= 1.0
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "qwen3_vl" and record["parameters"] > 1_000_000
    lines = (cache / "shapes_grounding" / "pretrain.jsonl").read_text().splitlines()
    assert len(lines) == 12 and all('"images/pretrain000-' in line for line in lines)


def test_the_pretraining_split_does_not_depend_on_the_worker_count(tmp_path, monkeypatch) -> None:
    """Chunk c draws at [PRETRAIN_SEED, benchmark, c] whichever process draws it: 12 samples in
    chunks of 5, drawn by one process and by two, are the same records and image bytes."""
    monkeypatch.syspath_prepend(str(REPO / "scripts"))  # the spawned workers import the script
    make_learner = _script()
    monkeypatch.setattr(make_learner, "CHUNK", 5)
    one = make_learner.pretraining_split("shapes_grounding", 12, tmp_path / "one", workers=1)
    two = make_learner.pretraining_split("shapes_grounding", 12, tmp_path / "two", workers=2)
    lines = one.read_text().splitlines()
    assert len(lines) == 12 and one.read_text() == two.read_text()
    assert len({line.split('"image": "')[1].split('"')[0] for line in lines}) == 12
    for image in (one.parent / "images").iterdir():
        assert image.read_bytes() == (two.parent / "images" / image.name).read_bytes()


def test_the_pretraining_split_is_drawn_again_when_the_generator_changed(tmp_path) -> None:
    """The cache is kept only while both the sample count and the bundled test split (which the
    generator writes again whenever its output changes) are the ones it was drawn for: a split
    stamped with the count alone (as before the digest) or another digest is drawn again."""
    make_learner = _script()
    split = make_learner.pretraining_split("shapes_grounding", 3, tmp_path)
    stamp = split.with_name("pretrain.n")
    marker = split.with_name("kept")
    marker.write_text("")
    assert make_learner.pretraining_split("shapes_grounding", 3, tmp_path) == split
    assert marker.exists()  # same count, same generator: kept
    for stale in ("3", "3 0000000000000000"):
        stamp.write_text(stale)
        marker.write_text("")
        make_learner.pretraining_split("shapes_grounding", 3, tmp_path)
        assert not marker.exists() and stamp.read_text() != stale
        assert len(split.read_text().splitlines()) == 3


def test_pretraining_media_equal_to_test_media_are_refused(tmp_path: Path) -> None:
    make_learner = _script()
    benchmark = REPO / "assets" / "benchmarks" / "shapes_grounding"
    (tmp_path / "images").mkdir()
    test_image = benchmark / "images" / "test-0007.png"
    (tmp_path / "images" / "pretrain-0000.png").write_bytes(test_image.read_bytes())
    with pytest.raises(SystemExit, match="1 pretraining media equal test media"):
        make_learner.check_disjoint(tmp_path, benchmark)
    (tmp_path / "images" / "pretrain-0000.png").write_bytes(b"other bytes")
    make_learner.check_disjoint(tmp_path, benchmark)


def test_the_learning_rate_warms_up_then_decays_to_a_tenth() -> None:
    lr_at = _script().lr_at
    assert lr_at(0, 100, 1e-3, 10) == pytest.approx(1e-4)
    assert lr_at(9, 100, 1e-3, 10) == pytest.approx(1e-3)
    assert lr_at(10, 100, 1e-3, 10) == pytest.approx(1e-3)
    assert lr_at(55, 100, 1e-3, 10) == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5))
    assert lr_at(100, 100, 1e-3, 10) == pytest.approx(1e-4)


@pytest.mark.slow  # make test-slow: a few warm-start steps of two phases with video tool calls
def test_a_short_reader_pretraining_writes_the_reader_and_its_record(tmp_path: Path) -> None:
    """scripts/make_reader.py: its three phases (reading after the right call, calls on the
    stated time of other questions, then random calls) run on a few fresh clips and leave a
    loadable model with its record."""
    out, cache = tmp_path / "reader", tmp_path / "cache"
    command = [
        sys.executable, str(REPO / "scripts" / "make_reader.py"), "--clips", "6",
        "--read-steps", "2", "--time-steps", "2", "--call-steps", "2", "--batch-size", "2", "--threads", "1",
        "--workers", "1", "--out", str(out), "--cache", str(cache), "--work", str(tmp_path / "w"),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    record = json.loads((out / "pretraining.json").read_text())
    read, time_, call = (record["phases"][k] for k in ("read", "time", "call"))
    assert read["steps"] == time_["steps"] == call["steps"] == 2 and record["clips"] == 6
    assert "warm_start.train_on=answer" in read["command"]
    assert "warm_start.train_on=calls" in time_["command"] and "timing.jsonl" in time_["command"]
    assert "warm_start.calls=random" in call["command"]
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "qwen2_5_vl"
    lines = (cache / "zoom_video" / "pretrain.jsonl").read_text().splitlines()
    assert len(lines) == 6 and all('"videos/pretrain000-' in line for line in lines)
    timing = [json.loads(line) for line in (cache / "zoom_video" / "timing.jsonl").open()]
    for line, asked in zip(lines, timing):
        original = json.loads(line)
        question = asked["messages"][0]["content"][-1]["text"]
        assert "flashes" not in question and f"{original['meta']['asked_time']:.1f} s?" in question
        assert asked["meta"] == original["meta"] and asked["id"] == original["id"]


def short_reader(tmp_path: Path, benchmark: str, *more: str) -> list[str]:
    """make_reader.py on 4 fresh samples, 2 reading steps of 2, 1 thread; its model in
    ``tmp_path/reader``, its samples in ``tmp_path/cache``, its phases in ``tmp_path/w``."""
    return [
        sys.executable, str(REPO / "scripts" / "make_reader.py"), "--benchmark", benchmark,
        "--clips", "4", "--read-steps", "2", "--batch-size", "2", "--threads", "1",
        "--workers", "1", "--out", str(tmp_path / "reader"), "--cache", str(tmp_path / "cache"),
        "--work", str(tmp_path / "w"), *more,
    ]  # fmt: skip


@pytest.mark.slow  # make test-slow: a few warm-start steps of two phases with crop calls
def test_a_short_site_reader_pretraining_crops_the_sites(tmp_path: Path) -> None:
    """``make_reader.py --benchmark zoom_sites``: reading the site's crop, then random calls
    among the four sites (``meta.zoom_choices``); no timing phase (its questions state none)."""
    out, cache = tmp_path / "reader", tmp_path / "cache"
    command = short_reader(tmp_path, "zoom_sites", "--call-steps", "2")
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    record = json.loads((out / "pretraining.json").read_text())
    assert record["benchmark"] == "zoom_sites" and list(record["phases"]) == ["read", "call"]
    assert "mmrft train tools/zoom_sites" in record["phases"]["call"]["command"]
    lines = [json.loads(line) for line in (cache / "zoom_sites" / "pretrain.jsonl").open()]
    assert len(lines) == 4 and all(len(r["meta"]["zoom_choices"]) == 4 for r in lines)
    refused = subprocess.run(
        command + ["--time-steps", "2"], capture_output=True, text=True, timeout=600
    )
    assert refused.returncode != 0 and "only zoom_video" in refused.stderr


@pytest.mark.slow  # make test-slow: a few warm-start steps of reading with video tool calls
def test_a_reading_only_slot_reader_has_one_phase(tmp_path: Path) -> None:
    """``make_reader.py --benchmark zoom_slots --call-steps 0``: reading the marked slot's
    window only, no call phase; the reader written is the reading phase's model."""
    out = tmp_path / "reader"
    command = short_reader(tmp_path, "zoom_slots", "--call-steps", "0")
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    record = json.loads((out / "pretraining.json").read_text())
    assert record["benchmark"] == "zoom_slots" and list(record["phases"]) == ["read"]
    assert "tools/zoom_slots" in record["phases"]["read"]["command"]
    weights = tmp_path / "w" / "read" / "checkpoints" / "step-000000" / "model.safetensors"
    assert (out / "model.safetensors").read_bytes() == weights.read_bytes()
    assert not (out / "trainer_state.pt").exists()


def test_the_mixture_is_mixture_or_named_benchmarks_with_a_sample_count() -> None:
    """No --only: MIXTURE; --only keeps part of it, or names another benchmark with a learning
    recipe, which then needs --samples; an unknown name or a missing count fails naming it."""
    make_learner = _script()
    assert make_learner.pretraining_mixture(None, None) == make_learner.MIXTURE
    assert make_learner.pretraining_mixture(["shapes_grounding"], 7) == {"shapes_grounding": 7}
    assert make_learner.pretraining_mixture(["video_direction"], 9) == {"video_direction": 9}
    for only, samples, named in (
        (["video_direction"], None, "give --samples"),
        (["shapes_grounded"], 9, "no such benchmark"),
        (["zoom_sites"], 9, "no learning recipe"),
    ):
        with pytest.raises(SystemExit, match=named):
            make_learner.pretraining_mixture(only, samples)
