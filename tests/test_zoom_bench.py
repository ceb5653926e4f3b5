"""The "looking closer" benchmarks (``zoom_marks``, ``zoom_video`` in
scripts/make_benchmarks.py) and their oracle (benchmarks/zoom_oracle.py), on small sets
generated into a temp dir: deterministic bytes, rows the task adapters read, target boxes and
spans around the mark, and the numbers that say the zoom is needed (a fixed pixel reader near
chance at the base view, near 1 after the crop)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mmrft.rewards.task import build_task

REPO = Path(__file__).resolve().parents[1]
N_MARKS = 16  # images (4 per colour)
N_VIDEO = 8  # clips (2 per colour)


def load_oracle():
    spec = importlib.util.spec_from_file_location(
        "zoom_oracle", REPO / "benchmarks" / "zoom_oracle.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ORACLE = load_oracle()
GENERATOR = ORACLE.load_generator()


def write(name: str, root: Path, n: int, seed: list[int]) -> Path:
    """Write ``n`` test samples of benchmark ``name`` into ``root/name``; its JSONL path."""
    folder = root / name
    folder.mkdir(parents=True)
    writer = {"zoom_marks": GENERATOR.write_zoom_marks, "zoom_video": GENERATOR.write_zoom_video}
    writer[name](folder, "test", n, np.random.default_rng(seed))
    return folder / "test.jsonl"


@pytest.fixture(scope="module")
def marks(tmp_path_factory) -> Path:
    return write("zoom_marks", tmp_path_factory.mktemp("zoom"), N_MARKS, [111, 1])


@pytest.fixture(scope="module")
def video(tmp_path_factory) -> Path:
    pytest.importorskip("av")
    return write("zoom_video", tmp_path_factory.mktemp("zoom"), N_VIDEO, [112, 1])


def records(jsonl: Path) -> list[dict]:
    return [json.loads(line) for line in jsonl.read_text(encoding="utf-8").splitlines()]


def file_bytes(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize("name", ["zoom_marks", "zoom_video"])
def test_generation_is_deterministic(name, tmp_path):
    if name == "zoom_video":
        pytest.importorskip("av")
    for run in ("a", "b"):
        write(name, tmp_path / run, 4, [7, 0])
    write(name, tmp_path / "c", 4, [8, 0])
    a, b, c = (file_bytes(tmp_path / run / name) for run in "abc")
    assert len(a) == 5 and a == b
    assert a["test.jsonl"] != c["test.jsonl"]


def test_registered_with_the_task_and_sizes():
    marks, video = GENERATOR.BENCHMARKS["zoom_marks"], GENERATOR.BENCHMARKS["zoom_video"]
    assert (marks.task, marks.splits) == ("classification", {"train": 400, "test": 100})
    assert (video.task, video.splits) == ("video_qa", {"train": 200, "test": 50})


def test_rows_are_read_by_the_task_adapters(marks, video):
    for task_name, jsonl, n in (("classification", marks, N_MARKS), ("video_qa", video, N_VIDEO)):
        task = build_task(task_name)
        samples, _ = task.read(jsonl)
        assert len(samples) == n
        for sample in samples:
            assert sample.target in sample.meta["choices"]
            assert sample.meta["choices"] == ["red", "green", "blue", "yellow"]
            assert task.reference_answer(sample) in ("red", "green", "blue", "yellow", *"ABCD")
            assert len(sample.meta["target_box"]) == 4
        assert sorted(s.target for s in samples) == sorted(
            ["red", "green", "blue", "yellow"] * (n // 4)
        )


def near(pixel: np.ndarray, colour: str, tolerance: float = 60) -> bool:
    """Within ``tolerance`` RGB units of the named colour (jitter ±15 per channel, codec)."""
    return bool(np.linalg.norm(pixel.astype(float) - GENERATOR.COLOURS[colour]) < tolerance)


def test_mark_lies_in_the_target_box(marks):
    for record in records(marks):
        meta = record["meta"]
        with Image.open(marks.parent / record["messages"][0]["content"][0]["image"]) as image:
            pixels = np.asarray(image.convert("RGB")).astype(int)
        height, width = pixels.shape[:2]
        assert meta["image_size"] == [width, height] and min(width, height) >= 1024
        x1, y1, x2, y2 = meta["target_box"]
        assert 0 <= x1 < x2 <= width and 0 <= y1 < y2 <= height
        assert 16 <= x2 - x1 <= 20 and 16 <= y2 - y1 <= 20
        saturated = pixels.max(axis=2) - pixels.min(axis=2) > 80  # the background is gray
        assert GENERATOR.tight_box(saturated) == [x1, y1, x2, y2], record["id"]
        dx1, dy1, dx2, dy2 = meta["dot_box"]
        assert x1 < dx1 < dx2 < x2 and y1 < dy1 < dy2 < y2
        centre = pixels[(dy1 + dy2) // 2, (dx1 + dx2) // 2]
        assert near(centre, record["target"]), record["id"]
        assert near(pixels[y1 + (y2 - y1) // 2, x1 + 1], meta["ring_colour"]), record["id"]


def test_flash_lies_in_the_target_span_and_box(video):
    for record in records(video):
        meta = record["meta"]
        frames, times, fps = GENERATOR.read_mp4(
            video.parent / record["messages"][0]["content"][0]["video"]
        )
        assert fps == meta["fps"] == 20 and len(frames) == round(meta["duration"] * fps)
        assert list(frames.shape[1:3][::-1]) == meta["frame_size"] == [112, 112]
        start, end = meta["target_span"]
        assert 0 < start < end < meta["duration"] and 0.3 - 1e-9 <= end - start <= 0.5 + 1e-9
        x1, y1, x2, y2 = meta["target_box"]
        assert 0 <= x1 < x2 <= 112 and 0 <= y1 < y2 <= 112
        centre = ((y1 + y2) // 2, (x1 + x2) // 2)
        shown = []
        for i, (t, frame) in enumerate(zip(times, frames)):
            inside = start - 1e-6 <= t < end - 1e-6
            saturation = frame.astype(int).max(axis=2) - frame.astype(int).min(axis=2)
            if inside:
                shown.append(i)
                assert near(frame[centre], record["target"]), (record["id"], t)
                ys, xs = np.nonzero(saturation > 80)  # 1 px of slack: 4:2:0 chroma
                assert (
                    x1 - 1 <= xs.min() and xs.max() <= x2 and y1 - 1 <= ys.min() <= ys.max() <= y2
                )
            else:
                assert (saturation > 80).sum() <= 3, (record["id"], t)
        for count in (8, 16):  # the uniform samplings the flash avoids, a frame to spare
            sampled = GENERATOR.uniform_frame_indices(len(frames), count)
            assert not {i for s in sampled for i in (s - 1, s, s + 1)} & set(shown)


def test_the_question_states_the_time_and_the_zoom_span_shows_the_flash(video):
    """The stated time is the flash's start to 0.1 s; ``meta.zoom_span`` (what the scripted
    call fetches) is ``[t, t + 1]``, inside the clip, holding the flash but at most its first
    frame, and 2 or more of the 8 frames ``video_frames`` samples over it (its frame rule)
    show the flash."""
    for record in records(video):
        meta = record["meta"]
        t, (start, end) = meta["asked_time"], meta["target_span"]
        question = record["messages"][0]["content"][1]["text"]
        assert question == f"What colour is the dot that flashes briefly at about {t:.1f} s?"
        assert t == round(t, 1) and abs(t - start) <= 0.05 + 1e-9
        low, high = meta["zoom_span"]
        assert (low, high) == (t, pytest.approx(t + 1))
        assert 0 < low <= start + 0.05 + 1e-9 and end <= high <= meta["duration"]
        fps = meta["fps"]
        first, last = math.ceil(low * fps - 1e-9), math.floor(high * fps + 1e-9)
        last = min(last, round(meta["duration"] * fps) - 1)
        sampled = GENERATOR.uniform_frame_indices(last - first + 1, 8)
        flash = range(round(start * fps), round(end * fps))
        assert sum(first + i in flash for i in sampled) >= 2, record["id"]


def test_oracle_needs_the_zoom(marks, video, tmp_path):
    out = tmp_path / "oracle.json"
    assert ORACLE.main(["--marks", str(marks), "--video", str(video), "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    by_view = {(r["benchmark"], r["view"].split(" (")[0]): r for r in rows}
    for key in (
        ("zoom_marks", "3136 px"),
        ("zoom_marks", "12544 px"),
        ("zoom_video", "8 frames, 56x56"),
        ("zoom_video", "16 frames, 112x112"),
    ):
        row = by_view[key]
        assert row["base"] < 0.45 and row["crop"] > 0.9, row
    assert all(r["crop"] > 0.9 for r in rows)
    assert by_view[("zoom_video", "32 frames, 56x56")]["base"] > 0.9  # dense sampling sees it


def test_crop_box_stays_inside_the_image():
    assert ORACLE.crop_box([0, 0, 10, 10], (100, 80)) == (0, 0, 20, 20)
    assert ORACLE.crop_box([95, 70, 100, 80], (100, 80)) == (80, 60, 100, 80)
    assert ORACLE.crop_box([40, 40, 50, 50], (100, 80)) == (35, 35, 55, 55)
