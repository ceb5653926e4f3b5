"""``mmrft train <recipe> --smoke`` runs every stage of the recipe at least once and says so:
a tool recipe's first completion of each group is a scripted, valid tool call (the observation
and the next turn are the model's), a judge recipe's next completion a scripted answer the
judge grades; the run ends with one ``smoke: stages run: …`` line built from what it recorded.
Outside a smoke run nothing is scripted."""

from __future__ import annotations

import json
import re
from pathlib import Path

from helpers import NO_EVAL, short_run

from mmrft.cli import main
from mmrft.config import load_config
from mmrft.rollout.collector import SCRIPT_MARK
from mmrft.rollout.hf import HFEngine


def stages(out: str) -> str:
    """The smoke run's stage line (exactly one)."""
    lines = [line for line in out.splitlines() if line.startswith("smoke: stages run: ")]
    assert len(lines) == 1, out[-2000:]
    return lines[0]


def count(line: str, pattern: str) -> int:
    found = re.search(pattern, line)
    assert found, (pattern, line)
    return int(found.group(1))


def metrics(run: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [m for m in rows if "train/reward" in m]


def test_tool_recipe_smoke_calls_a_tool_and_samples_a_second_turn(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "400")
    assert main(["train", "deepeyes", "--smoke", "train.completions_every=1"]) == 0
    line = stages(capsys.readouterr().out)
    assert count(line, r"tool calls (\d+)") >= 1
    assert count(line, r"tool calls \d+ \((\d+) scripted,") >= 1
    assert count(line, r"scripted, (\d+) ran without error\)") >= 1
    assert count(line, r"later turns (\d+)") >= 1
    assert count(line, r"completions \((\d+) scripted\)") >= 1
    assert "not run: " in line and "judge (no verifier uses one)" in line
    run = tmp_path / "runs" / "deepeyes-smoke"
    steps = metrics(run)
    assert all(m["smoke/scripted_calls"] >= 1 for m in steps)  # one per group, every step
    rows = [json.loads(x) for x in (run / "completions.jsonl").read_text().splitlines()]
    scripted = [r for r in rows if r["trajectory"]["turns"][0]["calls"]]
    first = scripted[0]["trajectory"]
    assert SCRIPT_MARK in first["turns"][0]["text"]  # the text says it is not the model's
    call = first["turns"][0]["calls"][0]
    assert call["scripted"] is True and call["ok"], call
    assert len(first["turns"]) >= 2 and first["images_added"] == 1


def test_judge_recipe_smoke_asks_the_judge(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "400")
    assert main(["train", "vqa_judge", "--smoke"]) == 0
    line = stages(capsys.readouterr().out)
    calls = count(line, r"judge calls (\d+)")
    assert calls >= 1 and count(line, r"judge calls \d+ \((\d+) scripted answers\)") >= 1
    assert "not run: tools (the recipe enables none)" in line
    run = tmp_path / "runs" / "vqa_judge-smoke"
    assert len((run / "judge_cache.jsonl").read_text().splitlines()) == calls
    assert all(m["smoke/scripted_answers"] >= 1 for m in metrics(run))


def test_plain_recipe_smoke_scripts_nothing_and_says_what_did_not_run(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "400")
    assert main(["train", "r1v_counting", "--smoke"]) == 0
    line = stages(capsys.readouterr().out)
    assert "(0 scripted)" in line and "tool calls" not in line
    missing = line.split("; not run: ", 1)[1]
    for stage in ("tools (the recipe enables none)", "judge (no verifier uses one)", "sandbox"):
        assert stage in missing
    assert count(line, r"evaluation (\d+) samples") == 2


def test_outside_a_smoke_run_nothing_is_scripted(tmp_path, monkeypatch):
    """A tool config trained without --smoke: every generate call finds no script, no
    completion is scripted, and no smoke/ metric is logged."""
    from mmrft.training.trainer import train

    seen = []
    generate = HFEngine.generate

    def spy(self, *args, **kwargs):
        seen.append(self.script)
        return generate(self, *args, **kwargs)

    def never(*args, **kwargs):
        raise AssertionError("a script was applied outside a smoke run")

    monkeypatch.setattr(HFEngine, "generate", spy)
    monkeypatch.setattr(HFEngine, "_forced", never)
    cfg = load_config(
        "tools/zoom_marks",
        [*short_run(tmp_path, "plain", steps=1, new_tokens=8), *NO_EVAL, "train.threads=1"],
    )
    result = train(cfg)
    assert seen and all(script is None for script in seen)
    assert not any(k.startswith("smoke/") for m in metrics(result.run_dir) for k in m)


def test_the_tools_example_calls_are_valid_calls():
    """The example a tool declares (what a smoke run scripts) is a call the tool accepts: crop
    in every box frame, on small and large images, rotate, and video_frames on a short clip."""
    from PIL import Image

    from mmrft.plugins import TOOLS
    from mmrft.rollout.tool import ToolContext

    crop, rotate, video_frames = (TOOLS.get(n) for n in ("crop", "rotate", "video_frames"))
    for frame in ("norm1000", "input_pixels", "norm1", "pixels"):
        for size, seen in (((40, 30), (56, 28)), ((640, 480), (56, 56)), ((300, 1200), (28, 112))):
            context = ToolContext(
                images=[Image.new("RGB", size)], input_sizes=[seen], box_frame=frame
            )
            for spec in (crop, rotate):
                arguments = spec.example(context)
                observation = spec.fn(context, **arguments)
                assert observation.ok, (frame, size, arguments, observation.text)
    assert crop.example(ToolContext()) is None
    video = Path(__file__).resolve().parents[1] / "assets/benchmarks/zoom_video/videos"
    context = ToolContext(video=str(video / "test-0000.mp4"))
    arguments = video_frames.example(context)
    assert video_frames.fn(context, **arguments).ok, arguments
    assert video_frames.example(ToolContext()) is None
