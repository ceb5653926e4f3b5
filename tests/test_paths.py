"""Relative paths from a directory outside the checkout: on the command line they mean the
current directory, in a config file the file's folder, and every task format's media root is
joined once (the Charades reader used to join ``video_root`` twice)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mmrft.config import load_config
from mmrft.policy.model import resolve_family
from mmrft.rewards.task import build_task, read_split

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "assets" / "benchmarks"

# (task, format, data file under assets/benchmarks, task parameter naming a root, its folder)
FORMATS = [
    (
        "temporal_grounding",
        "charades",
        "video_temporal/charades_sta_test.txt",
        "video_root",
        "video_temporal/videos",
    ),
    ("video_qa", "video_r1", "video_direction/video_r1_test.json", "media_root", "video_direction"),
    ("audio_qa", "mmau", "audio_pitch/mmau_test.json", "audio_root", "audio_pitch"),
    ("audio_qa", "r1_aqa", "audio_pitch/r1_aqa_test.jsonl", "audio_root", "audio_pitch"),
    ("classification", "mmrft", "shapes_colour/test.jsonl", None, None),
]
MODELS = {"audio_qa": "tiny-qwen2_audio"}


def read(cfg):
    task = build_task(cfg.task.name, cfg.task.params)
    family = resolve_family(cfg.model)
    family.load_processor(cfg.model.path)
    return read_split(task, family, cfg.data.test, fmt=cfg.data.format, limit=3)


@pytest.mark.parametrize(("name", "fmt", "data", "root_key", "root"), FORMATS, ids=lambda v: str(v))
def test_relative_paths_from_another_directory(
    tmp_path, monkeypatch, name, fmt, data, root_key, root
):
    (tmp_path / "bench").symlink_to(BENCH)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(tmp_path)
    model = f"model.path={REPO / 'assets' / 'models' / MODELS.get(name, 'tiny-qwen2_5_vl')}"
    common = [
        model,
        f"task.name={name}",
        "task.params.think=none",
        f"data.format={fmt}",
        "train.steps=0",
    ]
    # on the command line: relative to the current directory
    overrides = [*common, f"data.test=bench/{data}"]
    if root_key:
        overrides.append(f"task.params.{root_key}=bench/{root}")
    samples = read(load_config(None, overrides))
    # in a config file elsewhere: relative to that file, whatever the current directory is
    config = tmp_path / "configs" / "mine.yaml"
    config.parent.mkdir()
    lines = [f"data:\n  test: ../bench/{data}\n"]
    if root_key:
        lines.append(f"task:\n  params:\n    {root_key}: ../bench/{root}\n")
    config.write_text("".join(lines))
    monkeypatch.chdir(work)
    again = read(load_config(config, common))
    for sample in [*samples, *again]:
        for media in sample.media():
            assert Path(media).is_absolute() and Path(media).is_file(), media
    assert [s.media() for s in samples] == [s.media() for s in again]


def test_charades_relative_video_root_is_joined_once(tmp_path, monkeypatch):
    """A task built in code with a relative root (no config anchoring) reads its videos from
    ``<cwd>/<root>/<id>.mp4``, not ``<root>/<root>/<id>.mp4``."""
    (tmp_path / "bench").symlink_to(BENCH)
    monkeypatch.chdir(tmp_path)
    task = build_task("temporal_grounding", {"video_root": "bench/video_temporal/videos"})
    samples, stats = task.read("bench/video_temporal/charades_sta_test.txt", fmt="charades")
    assert stats.kept == stats.read > 0
    for sample in samples:
        (video,) = sample.media()
        assert video.startswith("bench/video_temporal/videos/") and Path(video).is_file()
