"""Per-category results where a benchmark defines categories: MMAU by sound / music / speech and
by difficulty, Video-R1 by problem type; in results.json and in the table on screen."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

import pytest
from rich.console import Console

from mmrft.cli import main
from mmrft.evaluation.evaluate import print_table
from mmrft.rewards.task import build_task

REPO = Path(__file__).resolve().parents[1]
PITCH = REPO / "assets" / "benchmarks" / "audio_pitch"
DIRECTION = REPO / "assets" / "benchmarks" / "video_direction"
KINDS = ("sound", "music", "speech")
LEVELS = ("easy", "medium", "hard")


def mmau_file(tmp_path: Path, n: int = 6) -> Path:
    """The bundled MMAU-format test split with its items spread over MMAU's three tasks and
    difficulties (the bundled file is all sound / easy)."""
    items = json.loads((PITCH / "mmau_test.json").read_text())[:n]
    for i, item in enumerate(items):
        item["task"], item["difficulty"] = KINDS[i % 3], LEVELS[i // 2 % 3]
    path = tmp_path / "mmau-test-mini.json"
    path.write_text(json.dumps(items, indent=1))
    (tmp_path / "audio").symlink_to(PITCH / "audio")
    return path


def test_mmau_categories_count_and_score_each_split(tmp_path):
    task = build_task("audio_qa", {"think": "none"})
    samples, _ = task.read(mmau_file(tmp_path), fmt="mmau")
    # right on items 0, 1, 3 (sound, music, sound)
    completions = [
        f"<answer>{s.target}</answer>" if i in (0, 1, 3) else "<answer>nothing</answer>"
        for i, s in enumerate(samples)
    ]
    categories = task.categories(task.evaluate(completions, samples), samples)
    by_task = categories["task"]
    assert {k: v["samples"] for k, v in by_task.items()} == {"music": 2, "sound": 2, "speech": 2}
    assert {k: v["accuracy"] for k, v in by_task.items()} == {
        "music": 0.5,
        "sound": 1.0,
        "speech": 0.0,
    }
    assert by_task["sound"]["primary"] == 1.0
    assert {k: v["samples"] for k, v in categories["difficulty"].items()} == {
        "easy": 2,
        "hard": 2,
        "medium": 2,
    }
    assert categories["difficulty"]["easy"]["accuracy"] == 1.0
    out = StringIO()
    print_table(
        "mmau",
        {"before": {"accuracy": 0.5}, "after": {"accuracy": 0.5}},
        Console(file=out, width=200),
        categories={"after": categories},
        primary="accuracy",
    )
    table = out.getvalue()
    assert (
        "accuracy · task = music (n=2)" in table and "accuracy · difficulty = hard (n=2)" in table
    )
    row = next(line for line in table.splitlines() if "task = sound" in line)
    assert "—" in row and "1.000" in row  # no 'before' categories: a dash, not a number


def test_video_r1_categories_by_problem_type(tmp_path):
    items = json.loads((DIRECTION / "video_r1_test.json").read_text())[:4]
    for item in items[2:]:
        item.update(problem_type="numerical", options=[], solution="<answer>3</answer>")
    path = tmp_path / "mixed.json"
    path.write_text(json.dumps(items))
    task = build_task("video_qa", {"think": "none", "media_root": str(DIRECTION)})
    samples, _ = task.read(path, fmt="video_r1")
    completions = [
        "<answer>Z</answer>",
        "<answer>Z</answer>",
        "<answer>3</answer>",
        "<answer>4</answer>",
    ]
    categories = task.categories(task.evaluate(completions, samples), samples)
    assert categories["problem_type"]["multiple choice"]["accuracy"] == 0.0
    assert categories["problem_type"]["numerical"]["accuracy"] == 0.5
    assert categories["problem_type"]["numerical"]["samples"] == 2


@pytest.mark.filterwarnings("ignore")
def test_mmrft_eval_writes_categories_to_results_and_the_table(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    test = mmau_file(tmp_path)
    code = main(
        [
            "eval",
            "demo",
            f"model.path={REPO / 'assets' / 'models' / 'tiny-qwen2_audio'}",
            "task.name=audio_qa",
            "task.params={think: none}",
            "data.format=mmau",
            f"data.test={test}",
            "eval.max_new_tokens=4",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert set(results["categories"]["task"]) == set(KINDS)
    assert all(v["samples"] == 2 for v in results["categories"]["task"].values())
    assert set(results["categories"]["difficulty"]) == set(LEVELS)
    for kind in KINDS:
        assert f"accuracy · task = {kind} (n=2)" in out
