"""Start-up check: a completion budget too short for a correct answer is named, not silent."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from mmrft.config import load_config
from mmrft.data import Sample
from mmrft.rewards.task import Task, build_task
from mmrft.training.warm_start import answers_over_budget, warn_answers_over_budget

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(REPO / "assets" / "models" / "tiny-qwen2_5_vl")


def boxes(n: int) -> Sample:
    target = [[10 + 20 * i, 10, 25 + 20 * i, 25] for i in range(n)]
    return Sample(f"d{n}", [], target, {"image_size": [112, 112], "box_frame": "pixels"})


def test_counts_the_answers_longer_than_the_budget(tokenizer):
    task = build_task("detection", {"think": "none"})
    samples = [boxes(n) for n in range(5)]
    lengths = [
        len(tokenizer(f"<answer>{task.reference_answer(s)}</answer>")["input_ids"]) + 1
        for s in samples
    ]
    budget = lengths[2]  # the 0-, 1- and 2-box answers fit, the 3- and 4-box ones do not
    assert answers_over_budget(tokenizer, task, samples, budget) == (2, lengths[4])
    assert answers_over_budget(tokenizer, task, samples, lengths[4]) == (0, lengths[4])
    assert answers_over_budget(tokenizer, task, [], 8) == (0, 0)


def test_a_task_without_reference_answers_is_not_checked(tokenizer):
    class Open(Task):
        name = "open"

    assert answers_over_budget(tokenizer, Open(), [boxes(1)], 1) == (0, 0)


def test_the_warning_names_the_key_to_raise(tokenizer):
    task = build_task("detection", {"think": "none"})
    train, test = [boxes(4), boxes(0)], [boxes(3)]
    cfg = load_config("learn/shapes_detection", ["rollout.max_new_tokens=40"])
    warnings = warn_answers_over_budget(cfg, tokenizer, task, train, test)
    assert len(warnings) == 2
    assert warnings[0].startswith("rollout.max_new_tokens=40: 1 of 2 training samples")
    assert "Raise rollout.max_new_tokens to at least" in warnings[0]
    assert "1 of 1 test samples" in warnings[1]
    cfg = load_config(
        "learn/shapes_detection", ["rollout.max_new_tokens=40", "eval.max_new_tokens=400"]
    )
    (only,) = warn_answers_over_budget(cfg, tokenizer, task, train, test)
    assert only.startswith("rollout.max_new_tokens=40")
    assert (
        warn_answers_over_budget(
            load_config("learn/shapes_detection"), tokenizer, task, train, test
        )
        == []
    )
