"""The exact prompts of every bundled benchmark, kept as snapshot files.

``tests/snapshots/prompts/<benchmark>.txt`` holds the filled template (the user text sent
with the image) of the first 3 test samples, with the task's default parameters; grounding
prompts once per family (box frame and the sentence that states it). A change to a
template, a format or box instruction, or the data shows up here as a diff. After an
intended change, rewrite the files and review the diff::

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
BUNDLED = {
    "shapes_colour": ("classification", ["qwen2_5_vl"]),
    "shapes_kind": ("classification", ["qwen2_5_vl"]),
    "shapes_counting": ("counting", ["qwen2_5_vl"]),
    "shapes_grounding": (
        "grounding",
        ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5", "internvl", "gemma3", "glm4v"],
    ),
}
FIRST = 3


def render(benchmark: str) -> str:
    task_name, family_names = BUNDLED[benchmark]
    task = build_task(task_name)
    samples, _ = task.read(REPO / "assets" / "benchmarks" / benchmark / "test.jsonl")
    blocks = [
        f"# {benchmark}: user text of the first {FIRST} test samples (task '{task_name}', "
        "default params).\n# Rewrite: MMRFT_UPDATE_SNAPSHOTS=1 pytest tests/test_prompts_snapshot.py\n"
    ]
    for name in family_names:
        family = MODEL_FAMILIES.get(name)()
        for sample in samples[:FIRST]:
            family.annotate(sample)
            user = task.prompt(sample, family)[-1]
            media = [p["type"] for p in user["content"] if p["type"] != "text"]
            text = user["content"][-1]["text"]
            frame = f" · {name} ({family.box_frame})" if task_name == "grounding" else ""
            blocks.append(f"=== {sample.id}{frame} · media: {', '.join(media)} ===\n{text}\n")
    return "\n".join(blocks)


@pytest.mark.parametrize("benchmark", sorted(BUNDLED))
def test_prompt_snapshot(benchmark):
    path = SNAPSHOTS / f"{benchmark}.txt"
    rendered = render(benchmark)
    if os.environ.get("MMRFT_UPDATE_SNAPSHOTS") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(rendered, encoding="utf-8")
    assert path.is_file(), f"no snapshot {path}; write it with MMRFT_UPDATE_SNAPSHOTS=1"
    expected = path.read_text(encoding="utf-8")
    assert rendered == expected, (
        f"prompts of {benchmark} changed; if intended, rerun with MMRFT_UPDATE_SNAPSHOTS=1 "
        "and review the diff"
    )
