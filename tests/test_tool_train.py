"""Training runs with tool rollouts on CPU (tiny Qwen2.5-VL, tiny Qwen2-Audio): the image, the
video and the audio variant, LoRA, both training paths, evaluation through the loop, exact
resume.

The tiny model's first turn is forced to a valid call (the engine's token choice, as the
scripted tests in test_tool_rollout.py; its log-probs stay the model's), so every trajectory
has an observation with media and the update trains on interleaved turns; later turns are
sampled.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import short_run

from mmrft.config import load_config
from mmrft.rollout.hf import HFEngine
from mmrft.training.trainer import train

REPO = Path(__file__).resolve().parents[1]

CALLS = {
    "tools/zoom_marks": '<tool_call>{"name": "crop", "arguments": {"bbox_2d": [10, 10, 60, 60]}}'
    "</tool_call>",
    "tools/zoom_video": '<tool_call>{"name": "video_frames", "arguments": {"start_s": 1.0, '
    '"end_s": 2.0, "n": 4}}</tool_call>',
    "tools/audio_zoom": '<tool_call>{"name": "audio_clip", "arguments": {"start_s": 4.0, '
    '"end_s": 5.5}}</tool_call>',
}
MODELS = {"tools/audio_zoom": "tiny-qwen2_audio"}  # the others: tiny-qwen2_5_vl


@pytest.fixture
def forced_first_turn(monkeypatch):
    """Every ``generate`` (turn 1) writes the given call; ``continue_rows`` samples freely."""
    state: dict = {"ids": None, "on": False}
    generate, next_tokens = HFEngine.generate, HFEngine._next_tokens

    def forced_generate(self, conversations, n, sampling):
        state["on"] = True
        try:
            return generate(self, conversations, n, sampling)
        finally:
            state["on"] = False

    def forced_next(self, logits, sampling, completions, t, seen=None):
        if not state["on"]:
            return next_tokens(self, logits, sampling, completions, t, seen)
        import torch

        ids = state["ids"]
        token = ids[t] if t < len(ids) else self.stop_ids[0]
        tokens = torch.full((logits.shape[0],), token, dtype=torch.long)
        return tokens, torch.log_softmax(logits, dim=-1)[:, token]

    monkeypatch.setattr(HFEngine, "generate", forced_generate)
    monkeypatch.setattr(HFEngine, "_next_tokens", forced_next)

    def use(config: str, tokenizer) -> None:
        state["ids"] = tokenizer.encode(CALLS[config], add_special_tokens=False)

    return use


def config(tmp_path: Path, name: str, recipe: str, *extra: str):
    return load_config(
        recipe,
        [
            *short_run(tmp_path, name, new_tokens=80),
            "data.max_train_samples=8",
            "data.max_test_samples=2",
            "eval.before=false",
            "eval.batch_size=2",
            "eval.max_new_tokens=80",
            "train.completions_every=1",
            "train.threads=1",
            "checkpoint.every=1",
            *extra,
        ],
    )


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def tokenizer(recipe: str = "tools/zoom_marks"):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(
        REPO / "assets/models" / MODELS.get(recipe, "tiny-qwen2_5_vl")
    )


@pytest.mark.parametrize(
    "recipe, extra",
    [
        ("tools/zoom_marks", ["model.lora.enabled=true"]),
        # slow (make test-slow): the video loop's turns and log-probs are test_tool_rollout's,
        # its training step the image case's; kept out of make test's ten minutes
        pytest.param(
            "tools/zoom_video",
            ["model.video.min_frames=2", "model.video.max_frames=4"],
            marks=pytest.mark.slow,
        ),
        ("tools/audio_zoom", []),
    ],
)
def test_two_steps_and_an_evaluation_with_tools(tmp_path, forced_first_turn, recipe, extra):
    forced_first_turn(recipe, tokenizer(recipe))
    summary = train(config(tmp_path, "run", recipe, *extra))
    run_dir = Path(summary["run_dir"])
    steps = [m for m in metrics(run_dir) if "train/reward" in m]
    assert [m["step"] for m in steps] == [1, 2]
    for m in steps:
        assert m["rollout/tools/use_rate"] == 1.0  # every trajectory got its observation
        assert m["rollout/tools/turns_mean"] >= 2.0
        assert m["rollout/tools/call_success"] > 0
    rows = [json.loads(x) for x in (run_dir / "completions.jsonl").read_text().splitlines()]
    trajectory = rows[0]["trajectory"]
    added = trajectory["images_added"] + trajectory["videos_added"] + trajectory["audios_added"]
    assert added == 1 and trajectory["turns"][0]["calls"][0]["ok"]
    assert trajectory["observation_tokens"] > 0
    predictions = (run_dir / "eval" / "after" / "predictions.jsonl").read_text().splitlines()
    assert all("trajectory" in json.loads(line) for line in predictions)
    results = json.loads((run_dir / "eval" / "after" / "results.json").read_text())
    assert results["metrics"]["tools/use_rate"] == 1.0


def test_per_completion_path_runs_tools(tmp_path):
    """rollout.group_shared=false: turn 1 by transformers generate, later turns and the
    training forward per completion (the tiny model samples on its own here)."""
    summary = train(
        config(
            tmp_path, "plain", "tools/zoom_marks", "rollout.group_shared=false", "eval.after=false"
        )
    )
    steps = [m for m in metrics(Path(summary["run_dir"])) if "train/reward" in m]
    assert len(steps) == 2 and all("rollout/tools/turns_mean" in m for m in steps)


def test_tool_run_resumes_exactly(tmp_path, forced_first_turn):
    forced_first_turn("tools/zoom_marks", tokenizer())
    extra = ("eval.after=false",)
    full = train(config(tmp_path, "full", "tools/zoom_marks", "train.steps=3", *extra))
    train(config(tmp_path, "cut", "tools/zoom_marks", "train.steps=1", *extra))
    cut = train(config(tmp_path, "cut", "tools/zoom_marks", "train.steps=3", *extra))
    a = [m for m in metrics(Path(full["run_dir"])) if "train/reward" in m]
    b = [m for m in metrics(Path(cut["run_dir"])) if "train/reward" in m]
    assert [m["step"] for m in b] == [1, 2, 3]
    for x, y in zip(a, b):
        for key in ("train/reward", "train/loss", "rollout/tools/turns_mean", "rollout/len_mean"):
            assert x[key] == pytest.approx(y[key], abs=1e-6), key


def test_a_teacher_scores_tool_trajectories_of_a_lora_student(tmp_path, forced_first_turn):
    """On-policy distillation through tool turns with LoRA: the teacher (the student's own base
    checkpoint) reads the same interleaved rows, observations included, and scores the
    model's tokens; at step 1 the LoRA student is its base (B = 0), so the reverse KL is 0."""
    forced_first_turn("tools/zoom_marks", tokenizer())
    model = REPO / "assets/models/tiny-qwen2_5_vl"
    cfg = config(
        tmp_path, "distil", "tools/zoom_marks", "model.lora.enabled=true",
        f"teacher.path={model}", "eval.after=false", "checkpoint.every=0",
    )  # fmt: skip
    steps = [m for m in metrics(Path(train(cfg)["run_dir"])) if "train/reward" in m]
    assert [m["step"] for m in steps] == [1, 2]
    assert steps[0]["rollout/tools/use_rate"] == 1.0
    assert steps[0]["distill/reverse_kl"] == 0.0
    assert all(0.0 <= m["distill/teacher_agree"] <= 1.0 for m in steps)
