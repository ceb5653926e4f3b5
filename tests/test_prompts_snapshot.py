"""The exact prompts of every bundled benchmark, kept as snapshot files.

``tests/snapshots/prompts/<snapshot>.txt`` holds the filled template (the user text sent with
the media) of the first 3 test samples with the task's default parameters, for each dataset
format the benchmark ships (``<benchmark>.txt`` for the project JSONL,
``<benchmark>__<format>.txt`` for a peer format); grounding prompts once per family and
detection once per box frame (Qwen2-VL: norm1000, Qwen2.5-VL: input_pixels), with the frame
and the sentence that states it. A change to a template, a format or box instruction, a reader
or the data shows up here as a diff. After an intended change, rewrite the files and review the
diff::

    MMRFT_UPDATE_SNAPSHOTS=1 pytest tests/test_prompts_snapshot.py
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mmrft.plugins import MODEL_FAMILIES
from mmrft.rewards.task import build_task

REPO = Path(__file__).resolve().parents[1]
SNAPSHOTS = REPO / "tests" / "snapshots" / "prompts"
BENCH = REPO / "assets" / "benchmarks"
QWEN25 = ["qwen2_5_vl"]
AUDIO = ["qwen2_audio"]
# snapshot name: (benchmark, file, format, task, families)
BUNDLED = {
    "shapes_colour": ("shapes_colour", "test.jsonl", "mmrft", "classification", QWEN25),
    "shapes_kind": ("shapes_kind", "test.jsonl", "mmrft", "classification", QWEN25),
    "shapes_counting": ("shapes_counting", "test.jsonl", "mmrft", "counting", QWEN25),
    "shapes_grounding": (
        "shapes_grounding",
        "test.jsonl",
        "mmrft",
        "grounding",
        ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5", "internvl", "gemma3", "glm4v"],
    ),
    "shapes_detection": (
        "shapes_detection",
        "test.jsonl",
        "mmrft",
        "detection",
        ["qwen2_vl", "qwen2_5_vl"],
    ),
    "video_temporal": ("video_temporal", "test.jsonl", "mmrft", "temporal_grounding", QWEN25),
    "video_temporal__charades": (
        "video_temporal",
        "charades_sta_test.txt",
        "charades",
        "temporal_grounding",
        QWEN25,
    ),
    "video_direction": ("video_direction", "test.jsonl", "mmrft", "video_qa", QWEN25),
    "video_direction__video_r1": (
        "video_direction",
        "video_r1_test.json",
        "video_r1",
        "video_qa",
        QWEN25,
    ),
    "zoom_marks": ("zoom_marks", "test.jsonl", "mmrft", "classification", QWEN25),
    "zoom_sites": ("zoom_sites", "test.jsonl", "mmrft", "classification", QWEN25),
    "grid_walk": ("grid_walk", "test.jsonl", "mmrft", "prompt", QWEN25),
    "zoom_video": ("zoom_video", "test.jsonl", "mmrft", "video_qa", QWEN25),
    "zoom_slots": ("zoom_slots", "test.jsonl", "mmrft", "video_qa", QWEN25),
    "audio_beeps": ("audio_beeps", "test.jsonl", "mmrft", "counting", AUDIO),
    "audio_zoom": ("audio_zoom", "test.jsonl", "mmrft", "classification", AUDIO),
    "audio_pitch": ("audio_pitch", "test.jsonl", "mmrft", "audio_qa", AUDIO),
    "audio_pitch__r1_aqa": ("audio_pitch", "r1_aqa_test.jsonl", "r1_aqa", "audio_qa", AUDIO),
    "audio_pitch__mmau": ("audio_pitch", "mmau_test.json", "mmau", "audio_qa", AUDIO),
    "charts": ("charts", "test.jsonl", "mmrft", "chart_qa", QWEN25),
}
FIRST = 3


def render(snapshot: str) -> str:
    benchmark, file, fmt, task_name, family_names = BUNDLED[snapshot]
    task = build_task(task_name)
    samples, _ = task.read(BENCH / benchmark / file, fmt=fmt)
    blocks = [
        f"# {snapshot}: user text of the first {FIRST} samples of {benchmark}/{file} (format "
        f"'{fmt}', task '{task_name}', default params).\n"
        "# Rewrite: MMRFT_UPDATE_SNAPSHOTS=1 pytest tests/test_prompts_snapshot.py\n"
    ]
    for name in family_names:
        family = MODEL_FAMILIES.get(name)()
        for sample in samples[:FIRST]:
            family.annotate(sample)
            user = task.prompt(sample, family)[-1]
            media = [p["type"] for p in user["content"] if p["type"] != "text"]
            text = user["content"][-1]["text"]
            frame = f" · {name} ({family.box_frame})" if len(family_names) > 1 else ""
            blocks.append(f"=== {sample.id}{frame} · media: {', '.join(media)} ===\n{text}\n")
    return "\n".join(blocks)


@pytest.mark.parametrize("snapshot", sorted(BUNDLED))
def test_prompt_snapshot(snapshot):
    path = SNAPSHOTS / f"{snapshot}.txt"
    rendered = render(snapshot)
    if os.environ.get("MMRFT_UPDATE_SNAPSHOTS") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(rendered, encoding="utf-8")
    assert path.is_file(), f"no snapshot {path}; write it with MMRFT_UPDATE_SNAPSHOTS=1"
    expected = path.read_text(encoding="utf-8")
    assert rendered == expected, (
        f"prompts of {snapshot} changed; if intended, rerun with MMRFT_UPDATE_SNAPSHOTS=1 "
        "and review the diff"
    )


def test_every_benchmark_has_a_snapshot():
    """Each benchmark folder has at least one snapshot."""
    covered = {b for b, *_ in BUNDLED.values()}
    folders = {p.name for p in BENCH.iterdir() if p.is_dir()}
    assert folders <= covered, sorted(folders - covered)
