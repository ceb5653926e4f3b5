"""End-to-end training on the tiny model: smoke, checkpoint loading, resume, failures."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from mmrft.config import load_config
from mmrft.rewards import NonFiniteRewardError
from mmrft.trainer import train

REPO = Path(__file__).resolve().parents[1]
MODEL = REPO / "assets/models/tiny-qwen2_5_vl"
BENCH = REPO / "assets/benchmarks/shapes_colour"


LENGTH_PLUGIN = """
from mmrft import verifier

@verifier("test_length", low=0.0, high=1.0)
def length(completions, samples):
    \"\"\"Completion length / 20, capped at 1: varies inside every group of a random model.\"\"\"
    return [min(len(c), 20) / 20 for c in completions]
"""


def tiny_config(tmp_path: Path, *extra: str):
    plugin = tmp_path / "length_plugin.py"
    plugin.write_text(LENGTH_PLUGIN)
    return load_config(
        REPO / "configs/demo.yaml",
        [
            f"output_dir={tmp_path}",
            "name=smoke",
            "warm_start.steps=0",
            "train.steps=3",
            "train.prompts_per_step=2",
            "rollout.group_size=4",
            "rollout.max_new_tokens=6",
            "data.max_test_samples=4",
            "eval.before=false",
            "train.completions_every=1",
            "checkpoint.every=2",
            "checkpoint.keep_last=2",
            f"plugins=[{plugin}]",
            "reward.verifiers=[{name: format}, {name: accuracy}, {name: test_length}]",
            *extra,
        ],
    )


def weights(directory: Path) -> dict[str, torch.Tensor]:
    out = {}
    for file in directory.glob("*.safetensors"):
        out.update(load_file(str(file)))
    return out


def test_three_steps_change_parameters_and_checkpoint_loads(tmp_path):
    # A random model never writes the answer format, so format and accuracy are 0 for every
    # completion; the length reward differs inside each group and gives non-zero advantages.
    summary = train(tiny_config(tmp_path, "train.steps=3", "optim.lr=1e-2"))
    run = Path(summary["run_dir"])
    before = weights(MODEL)
    after_dir = run / "checkpoints" / "step-000003"
    after = weights(after_dir)
    changed = [k for k in before if k in after and not torch.equal(before[k], after[k])]
    assert changed, "no parameter changed in 3 steps"

    from transformers import AutoModelForImageTextToText, AutoProcessor

    model = AutoModelForImageTextToText.from_pretrained(after_dir)
    AutoProcessor.from_pretrained(after_dir)
    assert sum(p.numel() for p in model.parameters()) > 0

    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [m["step"] for m in metrics if "train/reward" in m]
    assert steps == [1, 2, 3]
    for key in (
        "train/reward/format",
        "train/reward/accuracy",
        "train/loss",
        "rollout/len_mean",
        "time/rollout_s",
    ):
        assert key in metrics[0], key
    assert (run / "config.yaml").is_file() and (run / "completions.jsonl").is_file()
    assert (run / "report.png").is_file() and (run / "summary.json").is_file()
    assert (run / "eval" / "after" / "predictions.jsonl").is_file()
    # keep-last-N: step 2 (periodic) and step 3 (final)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-000002", "step-000003"]


def test_resume_continues_from_the_saved_step(tmp_path):
    full = train(tiny_config(tmp_path, "name=full", "train.steps=4", "eval.after=false"))
    # an interrupted run: stop at step 2 (checkpoint), then resume to 4
    train(tiny_config(tmp_path, "name=cut", "train.steps=2", "eval.after=false"))
    cut_dir = tmp_path / "cut"
    resumed = train(tiny_config(tmp_path, "name=cut", "train.steps=4", "eval.after=false"))
    assert resumed["run_dir"] == str(cut_dir)
    lines = [json.loads(x) for x in (cut_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines if "train/reward" in m] == [1, 2, 3, 4]
    reference = [
        json.loads(x) for x in (Path(full["run_dir"]) / "metrics.jsonl").read_text().splitlines()
    ]
    # same data, same sampling RNG: the resumed steps see the same rewards as the full run
    for a, b in zip(reference, lines):
        assert a["step"] == b["step"]
        assert a["train/reward"] == pytest.approx(b["train/reward"], abs=1e-6)


def test_nan_reward_stops_and_keeps_checkpoints(tmp_path):
    plugin = tmp_path / "nan_plugin.py"
    plugin.write_text(
        textwrap.dedent(
            """
            import math
            from mmrft import verifier

            CALLS = {"n": 0}

            @verifier("test_nan_after_two")
            def nan_after_two(completions, samples):
                if completions:
                    CALLS["n"] += 1
                value = math.nan if CALLS["n"] > 2 else 1.0
                return [value for _ in completions]
            """
        )
    )
    cfg = tiny_config(
        tmp_path,
        f"plugins=[{tmp_path / 'length_plugin.py'}, {plugin}]",
        "train.steps=4",
        "checkpoint.every=1",
        "reward.verifiers=[{name: test_nan_after_two}]",
    )
    with pytest.raises(NonFiniteRewardError, match=r"test_nan_after_two.*sample"):
        train(cfg)
    assert (tmp_path / "smoke" / "checkpoints" / "step-000002" / "trainer_state.pt").is_file()


def test_lora_checkpointing_frozen_vision_and_kl(tmp_path):
    """LoRA (merged into the saved checkpoint), gradient checkpointing, a frozen vision tower
    and β > 0 (a reference model is loaded) run together; the checkpoint loads with
    transformers, the vision weights are untouched and the language model changed."""
    summary = train(tiny_config(tmp_path, *_lora_overrides(), "train.steps=2"))
    run = Path(summary["run_dir"])
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert "train/kl" in metrics[-1]
    saved = run / "checkpoints" / "step-000002"
    assert (saved / "adapter" / "adapter_model.safetensors").is_file()
    before, after = weights(MODEL), weights(saved)
    assert set(before) == set(after), "the merged checkpoint has the base model's keys"
    vision = [k for k in before if "visual" in k]
    assert vision and all(torch.equal(before[k], after[k]) for k in vision)
    language = [k for k in before if "visual" not in k and "proj" in k]
    assert any(not torch.equal(before[k], after[k]) for k in language)

    from transformers import AutoModelForImageTextToText

    AutoModelForImageTextToText.from_pretrained(saved)
    # resuming a LoRA run loads the adapter and continues
    resumed = train(tiny_config(tmp_path, *[*_lora_overrides(), "train.steps=3"]))
    assert resumed["steps"] == 3


def _lora_overrides() -> list[str]:
    return [
        "name=lora",
        "optim.lr=5e-2",
        "model.lora.enabled=true",
        "model.lora.r=4",
        "model.lora.alpha=8",
        "model.gradient_checkpointing=true",
        "model.freeze_vision=true",
        "algorithm.beta=0.04",
        "eval.after=false",
    ]
