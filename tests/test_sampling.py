"""Per-prompt statistics and the samplers (data.sampler): hand-computed cases, and short
trainings per sampler that resume exactly after an interruption, on 1 and on 2 processes."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import length_plugin, one_error_line
from ranks import run_ranks

from mmrft.config import load_config
from mmrft.data import Sample
from mmrft.rollout.sampling import (
    DataStream,
    GroupOutcome,
    PromptStats,
    SampledStream,
    Sampler,
    SamplerError,
    SamplerView,
    build_sampler,
    curriculum_share,
    group_outcome,
    sampler,
    weighted_draw,
)
from mmrft.typecheck import ConfigError

REPO = Path(__file__).resolve().parents[1]


def samples(n: int, **meta_lists) -> list[Sample]:
    return [
        Sample(f"s{i}", [], meta={k: v[i] for k, v in meta_lists.items()}, where=f"d.jsonl:{i + 1}")
        for i in range(n)
    ]


def outcome(sample_id: str, step: int, reward: float, accuracy=None, variance=0.0, diversity=0.25,
            discarded=False) -> GroupOutcome:  # fmt: skip
    return GroupOutcome(sample_id, step, reward, accuracy, variance, diversity, discarded)


def view(
    data: list[Sample], stats: PromptStats, step: int = 1, count: int = 2, **kw
) -> SamplerView:
    args = dict(position=0, total_steps=10, seed=0, bad=set(), reward_range=(0.0, 1.0))
    args.update(kw)
    return SamplerView(count=count, step=step, samples=data, stats=stats, **args)


# ---------------------------------------------------------------------------------------------
# Statistics


def test_group_outcome_by_hand():
    got = group_outcome(
        "a",
        4,
        rewards=[2.0, 0.0, 1.0, 1.0],
        accuracies=[1.0, 0.0, None, 1.0],
        texts=[
            "<answer>The Red</answer>",
            "<answer>red.</answer>",
            "no tag",
            "<answer>blue</answer>",
        ],
        discarded=True,
    )
    # mean 1, variance (1 + 1 + 0 + 0)/4; accuracy over the 3 scored; answers {red, "", blue}
    assert (got.reward, got.variance, got.accuracy, got.diversity) == (1.0, 0.5, 2 / 3, 0.75)
    assert got.discarded and got.step == 4
    none = group_outcome("b", 1, [0.0, 0.0], [None, None], ["x", "y"], False)
    assert none.accuracy is None and none.diversity == 0.5  # both without a tag: one answer


def test_statistics_exponential_means_counts_and_files(tmp_path):
    stats = PromptStats(ema=0.25)
    stats.update(outcome("a", 1, 1.0, accuracy=None, variance=0.2, diversity=0.5))
    stats.update(outcome("a", 3, 0.0, accuracy=1.0, variance=0.0, diversity=0.25, discarded=True))
    stats.update(outcome("a", 5, 1.0, accuracy=0.0))
    a = stats.get("a")
    # reward: 1 → 0.75·1 + 0.25·0 = 0.75 → 0.75·0.75 + 0.25·1 = 0.8125
    assert a.reward == pytest.approx(0.8125)
    # accuracy: first score 1.0 (the first group had none) → 0.75·1 + 0.25·0
    assert a.accuracy == pytest.approx(0.75)
    assert (a.drawn, a.last_step, a.discarded, a.variance) == (3, 5, 1, 0.0)
    assert stats.get("b") is None

    again = PromptStats(ema=0.25)
    again.load_state_dict(stats.state_dict())
    assert again.state_dict() == stats.state_dict()
    path = tmp_path / "prompt_stats.jsonl"
    stats.update(outcome("0-first", 2, 0.5))
    stats.write_jsonl(path)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["0-first", "a"]  # sorted by id
    assert rows[1] == {
        "id": "a", "drawn": 3, "last_step": 5, "reward": 0.8125, "accuracy": 0.75,
        "variance": 0.0, "diversity": 0.25, "discarded": 1,
    }  # fmt: skip
    assert [p.name for p in tmp_path.iterdir()] == ["prompt_stats.jsonl"]  # no temporary left


# ---------------------------------------------------------------------------------------------
# Drawing


def test_weighted_draw_prefers_positive_weights_then_fills_then_repeats():
    rng = np.random.default_rng(0)
    weights = np.array([0.0, 1.0, 0.0, 3.0, 2.0])
    first = weighted_draw(weights, 3, set(), rng)
    assert sorted(first) == [1, 3, 4]  # the positive ones before any of weight 0
    five = weighted_draw(weights, 5, {4}, np.random.default_rng(1))
    # bad sample 4 is never drawn; once the positive ones ran out the zero ones come; then
    # everything was drawn once and a new pass begins
    assert 4 not in five and sorted(five[:2]) == [1, 3] and sorted(five[2:4]) == [0, 2]
    again = weighted_draw(weights, 3, set(), np.random.default_rng(0))
    assert again == first  # a pure function of the generator's seed
    # frequencies follow the weights: sample 3 (weight 3) is drawn first more often than 1
    firsts = [weighted_draw(weights, 1, set(), np.random.default_rng(s))[0] for s in range(600)]
    assert firsts.count(3) > 2 * firsts.count(1) > 0 and set(firsts) == {1, 3, 4}


def test_uniform_sampler_is_the_data_stream_order():
    data = samples(10)
    stream = SampledStream(build_sampler("uniform", {}, data), data, seed=3, total_steps=5)
    plain = DataStream(10, seed=3)
    stats = PromptStats(0.5)
    stats.update(outcome("s1", 1, 1.0, variance=0.25))  # statistics do not move it
    assert stream.take(4, stats, 1) == plain.take(4)
    assert stream.take(13, stats, 2) == plain.take(13)
    stream.bad.add(stream.index_at(15))  # a bad sample's replacement is the stream's too
    plain.bad = set(stream.bad)
    assert stream.index_at(15) == plain.index_at(15) != stream._latest[0][15]


def test_a_bad_sample_is_replaced_by_the_sampler_and_the_others_stay():
    data = samples(6)
    stats = PromptStats(0.5)
    stats.update(outcome("s4", 1, 0.5, variance=0.25, diversity=1.0))
    stream = SampledStream(build_sampler("variance", {}, data), data, seed=1, total_steps=5)
    drawn = stream.take(4, stats, 2)
    assert len(set(drawn)) == 4
    stream.bad.add(drawn[1])  # its media failed when drawn
    again = [stream.index_at(p) for p in range(4)]
    assert again[0] == drawn[0] and again[2:] == drawn[2:] and again[1] != drawn[1]
    assert again[1] == stream.index_at(1)  # a pure function of the position and the bad set
    assert drawn[1] not in stream.take(6, stats, 3)  # never drawn again


def test_variance_weights_by_hand():
    data = samples(4)
    stats = PromptStats(0.5)
    stats.update(outcome("s0", 1, 0.5, variance=0.25, diversity=0.5))  # 1·0.25/0.25 + 2·0.5
    stats.update(outcome("s1", 1, 1.0, variance=0.0, diversity=0.01))  # 0.02 → the floor
    stats.update(outcome("s2", 1, 0.5, variance=0.04, diversity=0.0))  # 0.04/0.25 = 0.16
    got = build_sampler("variance", {"diversity_weight": 2.0, "floor": 0.1, "unseen": 0.7}, data)
    assert got.weights(view(data, stats)) == pytest.approx([2.0, 0.1, 0.16, 0.7])
    # the variance is relative to the largest one on the reward's range: (3 − (−1))² / 4 = 4
    wide = got.weights(view(data, stats, reward_range=(-1.0, 3.0)))
    assert wide[0] == pytest.approx(0.25 / 4 + 1.0)
    # MMR1's blend: half of the probability by the score, half uniform (Σ w = 2.96)
    mixed = build_sampler("variance", {"diversity_weight": 2.0, "floor": 0.1, "unseen": 0.7,
                                       "mix": 0.5}, data)  # fmt: skip
    expected = [0.5 * w / 2.96 + 0.5 / 4 for w in (2.0, 0.1, 0.16, 0.7)]
    assert mixed.weights(view(data, stats)) == pytest.approx(expected)


def test_difficulty_sets_aside_solved_and_unsolved_prompts_then_readmits_them():
    data = samples(5)
    stats = PromptStats(1.0)
    stats.update(outcome("s0", 3, 0.0, accuracy=0.0))  # never solved
    stats.update(outcome("s1", 3, 1.0, accuracy=1.0))  # always solved
    stats.update(outcome("s2", 3, 0.5, accuracy=0.5))  # informative
    stats.update(outcome("s3", 1, 0.0, accuracy=0.04))  # unsolved, drawn long ago
    got = build_sampler("difficulty", {"readmit_after": 3}, data)
    assert got.weights(view(data, stats, step=4)).tolist() == [0, 0, 1, 1, 1]
    assert got.weights(view(data, stats, step=6)).tolist() == [1, 1, 1, 1, 1]
    down = build_sampler("difficulty", {"readmit_after": 3, "aside_weight": 0.2}, data)
    assert down.weights(view(data, stats, step=4)).tolist() == [0.2, 0.2, 1, 1, 1]
    twice = build_sampler("difficulty", {"readmit_after": 3, "min_drawn": 2}, data)
    assert twice.weights(view(data, stats, step=4)).tolist() == [1, 1, 1, 1, 1]
    # a round draws the open prompts first: s2, s3, s4 before the set-aside s0 and s1
    drawn = got.draw(view(data, stats, step=4, count=3))
    assert sorted(drawn) == [2, 3, 4]


def test_curriculum_schedules_by_hand():
    assert curriculum_share("linear", 5, 10, 0.2) == pytest.approx(0.6)
    assert curriculum_share("step", 0, 12, 0.25, 3) == 0.25
    assert curriculum_share("step", 7, 12, 0.25, 3) == pytest.approx(0.625)
    assert curriculum_share("step", 11, 12, 0.25, 3) == pytest.approx(1.0)
    # Platanios et al.: c(t) = min(1, sqrt(t (1 - c0²) / T + c0²))
    assert curriculum_share("competence", 0, 100, 0.1) == pytest.approx(0.1)
    assert curriculum_share("competence", 30, 100, 0.1) == pytest.approx((0.3 * 0.99 + 0.01) ** 0.5)
    assert curriculum_share("competence", 100, 100, 0.1) == 1.0


def test_curriculum_opens_the_easiest_prompts_first():
    data = samples(8, difficulty=[5, 1, 7, 2, 8, 3, 6, 4])
    stats = PromptStats(0.5)
    got = build_sampler("curriculum", {"schedule": "linear", "start": 0.25, "steps": 4}, data)
    # step 0: ⌈0.25·8⌉ = 2 open (difficulties 1 and 2: samples 1 and 3)
    assert np.flatnonzero(got.weights(view(data, stats, step=0))).tolist() == [1, 3]
    # step 2: c = 0.625 → 5 open (difficulties 1..5)
    assert np.flatnonzero(got.weights(view(data, stats, step=2))).tolist() == [0, 1, 3, 5, 7]
    assert sorted(got.draw(view(data, stats, step=0, count=2))) == [1, 3]
    # never fewer open than a round draws
    assert np.flatnonzero(got.weights(view(data, stats, step=0, count=3))).tolist() == [1, 3, 5]
    # by a statistic: difficulty = 1 − accuracy, unseen prompts 0.5
    by_acc = build_sampler("curriculum", {"by": "accuracy", "start": 0.25, "steps": 4}, data)
    stats.update(outcome("s6", 1, 1.0, accuracy=0.9))
    stats.update(outcome("s2", 1, 1.0, accuracy=0.7))
    assert np.flatnonzero(by_acc.weights(view(data, stats, step=0))).tolist() == [2, 6]


def test_sampler_errors_name_the_key():
    data = samples(3, difficulty=[1, 2, "hard"])
    with pytest.raises(
        ConfigError, match=r"^data.sampler: unknown sampler 'varience'; did you mean 'variance'\?"
    ):
        build_sampler("varience", {}, data)
    with pytest.raises(
        ConfigError, match=r"^data.sampler_params: unknown parameter 'flor'; did you mean 'floor'\?"
    ):
        build_sampler("variance", {"flor": 0.1}, data)
    with pytest.raises(
        ConfigError, match=r"^data.sampler_params.readmit_after: expected an integer"
    ):
        build_sampler("difficulty", {"readmit_after": "soon"}, data)
    with pytest.raises(ConfigError, match=r"^data.sampler_params.low: needs 0 ≤ low < high ≤ 1"):
        build_sampler("difficulty", {"low": 0.9, "high": 0.5}, data)
    with pytest.raises(ConfigError, match=r"^data.sampler_params.key: d.jsonl:3: meta.difficulty"):
        build_sampler("curriculum", {}, data)
    with pytest.raises(ConfigError, match=r"^data.stats_ema: must be in \(0, 1\]"):
        load_config(REPO / "configs/demo.yaml", ["data.stats_ema=0"])


def test_a_plugin_sampler_registers_and_is_type_checked():
    @sampler("test_last_only")
    class LastOnly(Sampler):
        """Only the last prompt."""

        def __init__(self, *, weight: float = 1.0) -> None:
            self.weight = weight

        def weights(self, view: SamplerView) -> np.ndarray:
            out = np.zeros(len(view.samples))
            out[-1] = self.weight
            return out

    data = samples(4)
    stream = SampledStream(build_sampler("test_last_only", {"weight": 2}, data), data, 0, 3)
    assert stream.take(1, PromptStats(0.5), 1) == [3]
    with pytest.raises(ConfigError, match="data.sampler_params.weight: expected a number"):
        build_sampler("test_last_only", {"weight": "x"}, data)


# ---------------------------------------------------------------------------------------------
# Budgets: the sampler's numbers and its contract (issue 38)


@pytest.mark.parametrize(
    "weights",
    [[np.nan] * 4, [1.0, np.nan, 1.0, 1.0], [np.inf, 1.0, 1.0, 1.0], [1.0, -1.0, 1.0, 1.0]],
)
def test_weighted_draw_refuses_weights_that_are_not_finite_and_non_negative(weights):
    """A NaN weight was in neither pool (not > 0, not ≤ 0): the draw looped for ever."""
    with pytest.raises(ValueError, match="one finite weight ≥ 0 per sample"):
        weighted_draw(np.array(weights), 6, set(), np.random.default_rng(0))


def test_weighted_draw_of_huge_weights_is_a_draw():
    drawn = weighted_draw(np.array([1e308, 1e308, 0.0]), 2, set(), np.random.default_rng(0))
    assert sorted(drawn) == [0, 1]  # their sum is inf: normalised by the largest first


class _Broken(Sampler):
    """A plugin sampler that breaks its contract as ``how`` says."""

    def __init__(self, *, how: str = "nan") -> None:
        self.how = how

    def weights(self, view: SamplerView) -> np.ndarray:
        n = len(view.samples)
        table = {
            "nan": np.full(n, np.nan),
            "one_nan": np.where(np.arange(n) == 2, np.nan, 1.0),
            "inf": np.full(n, np.inf),
            "negative": -np.ones(n),
            "short": np.ones(3),
            "long": np.ones(n + 1),
            "matrix": np.ones((n, 2)),
            "text": ["a"] * n,
        }
        if self.how == "raises":
            raise ZeroDivisionError("boom\nsecond line")
        return table[self.how]

    def draw(self, view: SamplerView) -> list[int]:
        drawn = {
            "minus_one": [-1] * view.count,
            "too_big": [len(view.samples)] * view.count,
            "float": [0.0] * view.count,
            "bool": [True] * view.count,
            "few": [0],
            "endless": iter(int, 1),  # 0, 0, 0, ... for ever
            "none": None,
            "bad": [next(iter(view.bad), 0)] * view.count,
        }
        if self.how in drawn:
            return drawn[self.how]
        return super().draw(view)


sampler("test_broken")(_Broken)


@pytest.mark.parametrize(
    ("how", "says"),
    [
        ("nan", r"gave weights that are not finite \(nan for 8 of 8 samples: s0, s1, "),
        ("one_nan", r"gave weights that are not finite \(nan for 1 of 8 samples: s2\)"),
        ("inf", r"not finite \(inf for 8 of 8"),
        ("negative", r"gave weights that are negative \(-1.0 for 8 of 8"),
        ("short", r"gave weights of shape \(3,\) for 8 training samples"),
        ("long", r"gave weights of shape \(9,\) for 8 training samples"),
        ("matrix", r"gave weights of shape \(8, 2\)"),
        ("text", r"gave weights that are not numbers"),
        ("raises", r"raised ZeroDivisionError: boom second line"),
        ("minus_one", r"returned index -1, outside \[0, 7\]"),
        ("too_big", r"returned index 8, outside \[0, 7\]"),
        ("float", r"returned 0.0, not a sample index"),
        ("bool", r"returned True, not a sample index"),
        ("few", r"returned 1 indices for a round of 3 prompts"),
        ("endless", r"returned 3\+ indices for a round of 3 prompts"),
        ("none", r"returned NoneType None, not a list of sample indices"),
        ("bad", r"returned index 5, a sample whose media failed"),
    ],
)
def test_a_sampler_that_breaks_its_contract_is_one_line_naming_it_and_the_step(how, says):
    """The old draw looped for ever on NaN, drew only the first prompts of a short array,
    indexed from the end on -1 and raised the plugin's own error with a traceback."""
    data = samples(8)
    stream = SampledStream(build_sampler("test_broken", {"how": how}, data), data, 0, 5)
    stream.bad.add(5)
    with pytest.raises(SamplerError) as caught:
        stream.take(3, PromptStats(0.5), 3)
    message = str(caught.value)
    assert re.search(says, message), message
    assert message.startswith("data.sampler 'test_broken' ") and "\n" not in message
    assert "at step 3 (a round of 3 prompts at data position 0)" in message
    record = caught.value.failure()
    assert record["step"] == 3 and record["sampler"] == "test_broken"
    every = [f"s{i}" for i in range(8)]
    named = {"nan": every, "inf": every, "negative": every, "one_nan": ["s2"]}.get(how, [])
    assert record["samples"] == named
    assert stream.position == 0  # nothing drawn


def test_a_replacement_draw_is_held_to_the_contract_too():
    data = samples(4)
    stream = SampledStream(build_sampler("test_broken", {"how": "one_nan"}, data), data, 0, 5)
    stream._latest = ({0: 1}, PromptStats(0.5), 2)
    stream.bad.add(1)  # its media failed: index_at draws again
    with pytest.raises(SamplerError, match="at step 2 .* data position 0"):
        stream.index_at(0)


@pytest.mark.parametrize(
    ("name", "params", "says"),
    [
        ("variance", {"floor": math.nan}, r"data.sampler_params.floor: must be a finite number"),
        ("variance", {"unseen": math.inf}, r"data.sampler_params.unseen: must be a finite"),
        ("variance", {"floor": -0.5}, r"data.sampler_params.floor: must be a finite number ≥ 0"),
        ("variance", {"variance_weight": -1}, r"data.sampler_params.variance_weight: must be"),
        ("variance", {"mix": math.nan}, r"data.sampler_params.mix: must be a finite number"),
        ("variance", {"mix": 1.5}, r"data.sampler_params.mix: must be a finite number in \[0, 1\]"),
        ("difficulty", {"aside_weight": math.nan}, r"data.sampler_params.aside_weight: must be a"),
        ("difficulty", {"low": math.nan}, r"data.sampler_params.low: must be a finite"),
        (
            "difficulty",
            {"min_drawn": 0},
            r"data.sampler_params.min_drawn: must be an integer ≥ 1, got 0",
        ),
        ("curriculum", {"by": "accuracy", "unseen": 2.0}, r"data.sampler_params.unseen: must be"),
        ("curriculum", {"stages": 1}, r"data.sampler_params.stages: must be an integer ≥ 2"),
        ("curriculum", {"steps": -1}, r"data.sampler_params.steps: must be an integer ≥ 0"),
        ("test_broken", {"how": 10**400}, r"data.sampler_params.how: expected a string"),
    ],
)
def test_every_sampler_number_is_checked_at_start_up(name, params, says):
    data = samples(3, difficulty=[1, 2, 3])
    with pytest.raises(ConfigError, match=says):
        build_sampler(name, params, data)


def test_a_plugin_samplers_numbers_and_its_own_errors_are_one_line_at_start_up():
    @sampler("test_params")
    class Params(Sampler):
        def __init__(self, *, boost: float = 1.0, levels: list[float] | None = None) -> None:
            if boost == 7:
                raise TypeError("seven is unlucky")
            self.boost, self.levels = boost, levels

        def check(self, data: list[Sample]) -> None:
            if self.boost == 8:
                raise KeyError("no such column")

        def weights(self, view: SamplerView) -> np.ndarray:
            return np.full(len(view.samples), self.boost)

    data = samples(3)
    for params, says in [
        ({"boost": math.nan}, r"^data.sampler_params.boost: must be a finite number, got nan$"),
        ({"boost": -math.inf}, r"^data.sampler_params.boost: must be a finite number, got -inf"),
        (
            {"boost": 10**400},
            r"^data.sampler_params.boost: an integer of about 401 digits is too large",
        ),
        ({"levels": [1.0, math.nan]}, r"^data.sampler_params.levels\[1\]: must be a finite"),
        ({"boost": 7}, r"^data.sampler: 'test_params' raised TypeError: seven is unlucky"),
        ({"boost": 8}, r"^data.sampler: 'test_params' check\(\) raised KeyError"),
    ]:
        with pytest.raises(ConfigError, match=says):
            build_sampler("test_params", params, data)
    assert build_sampler("test_params", {"boost": 2}, data).boost == 2.0


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, 10**400, "hard", None, True])
def test_curriculum_refuses_a_difficulty_that_is_not_a_finite_number(bad):
    """NaN passed the old check (a float) and sorted anywhere among the difficulties."""
    data = samples(3, difficulty=[1, bad, 2])
    with pytest.raises(
        ConfigError,
        match=r"^data.sampler_params.key: d.jsonl:2: meta.difficulty should be a "
        "finite number",
    ):
        build_sampler("curriculum", {}, data)


NAN_SAMPLER = """
import numpy as np
from mmrft.rollout.sampling import Sampler, sampler


@sampler("test_nan_from_step_2")
class NanFromStep2(Sampler):
    def weights(self, view):
        return np.full(len(view.samples), np.nan if view.step >= 2 else 1.0)
"""


def test_train_stops_on_a_sampler_with_one_line_and_failure_json(tmp_path, capsys):
    """As a verifier plugin's failure: exit 2, one line naming the sampler, the step and the
    samples, failure.json, step 1's checkpoint intact (the old draw hung before step 2)."""
    from helpers import NO_EVAL, short_run

    from mmrft.cli import main

    plugin = tmp_path / "nan_sampler.py"
    plugin.write_text(NAN_SAMPLER)
    args = [
        "train", *short_run(tmp_path, "nan", steps=3), *NO_EVAL, "data.max_train_samples=4",
        "checkpoint.every=1", f"plugins=[{plugin}]", "data.sampler=test_nan_from_step_2",
        "train.threads=1",
    ]  # fmt: skip
    assert main(args) == 2
    captured = capsys.readouterr().err
    error = one_error_line(captured)
    assert error.startswith("error: data.sampler 'test_nan_from_step_2' at step 2 (a round of")
    assert "gave weights that are not finite (nan for 4 of 4 samples: " in error
    failure = json.loads((tmp_path / "nan" / "failure.json").read_text())
    assert failure["step"] == 2 and failure["sampler"] == "test_nan_from_step_2"
    assert len(failure["samples"]) == 4 and failure["reason"] in " ".join(captured.split())
    assert (tmp_path / "nan" / "checkpoints" / "step-000001" / "trainer_state.pt").is_file()
    assert not (tmp_path / "nan" / "checkpoints" / "step-000002").exists()


def test_correctness_verifier_of_the_statistics():
    from mmrft.rewards.reward import build_reward
    from mmrft.rollout.collector import correctness_verifier

    reward = build_reward([{"name": "format"}, {"name": "accuracy"}], 0, "zero")
    try:
        assert correctness_verifier("", reward) == "accuracy"
        assert correctness_verifier("format", reward) == "format"
        assert correctness_verifier("reward", reward) is None
        with pytest.raises(ConfigError, match=r"^data.stats_verifier: 'acuracy' is not one"):
            correctness_verifier("acuracy", reward)
    finally:
        reward.close()
    only_format = build_reward([{"name": "format"}], 0, "zero")
    try:
        assert correctness_verifier("", only_format) is None
    finally:
        only_format.close()


# ---------------------------------------------------------------------------------------------
# Training: every sampler resumes exactly

SAMPLERS = {
    "uniform": [],
    # unseen prompts weigh nothing: once seen, the step-1 prompts are drawn again
    "variance": ["data.sampler_params={unseen: 0.0}"],
    "difficulty": ["data.sampler_params={readmit_after: 5}"],
    "curriculum": ["data.sampler_params={by: accuracy, start: 0.5, steps: 10}"],
}


def overrides(tmp_path: Path, name: str, steps: int, sampler_name: str) -> list[str]:
    plugin = length_plugin(tmp_path)
    return [
        f"output_dir={tmp_path}", f"name={name}", "warm_start.steps=0", f"train.steps={steps}",
        "train.prompts_per_step=2", "rollout.group_size=4", "rollout.max_new_tokens=6",
        "data.max_train_samples=6", "eval.before=false", "eval.after=false",
        "train.completions_every=1", "checkpoint.every=1", "checkpoint.keep_last=3",
        "algorithm.beta=0", "train.threads=1", f"plugins=[{plugin}]",
        "reward.verifiers=[{name: format}, {name: accuracy}, {name: test_length}]",
        f"data.sampler={sampler_name}", *SAMPLERS[sampler_name],
    ]  # fmt: skip


def metrics(run_dir: Path) -> list[dict]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [
        {k: v for k, v in m.items() if not k.startswith(("time/", "throughput/"))} for m in lines
    ]


def drawn_by_step(run_dir: Path) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for line in (run_dir / "completions.jsonl").read_text().splitlines():
        row = json.loads(line)
        ids = out.setdefault(row["step"], [])
        if row["id"] not in ids:
            ids.append(row["id"])
    return out


def assert_same_run(full: Path, resumed: Path) -> None:
    a, b = metrics(full), metrics(resumed)
    assert [m["step"] for m in a] == [m["step"] for m in b] == [1, 2]
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for key in x:
            assert x[key] == pytest.approx(y[key], rel=1e-6, abs=1e-7), key
    assert (full / "prompt_stats.jsonl").read_text() == (resumed / "prompt_stats.jsonl").read_text()


def step_one_draws_again(run_dir: Path, sampler_name: str) -> list[str]:
    """Step 2's prompts by the sampler's rule from the statistics saved at step 1."""
    from mmrft.policy.model import resolve_family
    from mmrft.rewards.task import build_task
    from mmrft.rollout.setup import read_data

    cfg = load_config(REPO / "configs/demo.yaml", overrides(run_dir.parent, "x", 2, sampler_name))

    data, _ = read_data(cfg, build_task(cfg.task.name, cfg.task.params), resolve_family(cfg.model))
    state = torch.load(run_dir / "checkpoints/step-000001/trainer_state.pt", weights_only=False)
    stats = PromptStats(cfg.data.stats_ema)
    stats.load_state_dict(state["prompt_stats"])
    chosen = build_sampler(cfg.data.sampler, cfg.data.sampler_params, data)
    stream = SampledStream(chosen, data, cfg.train.seed, 2, (0.0, 3.0), state["data_position"])
    return [data[i].id for i in stream.take(2, stats, 2)]


@pytest.mark.parametrize("sampler_name", list(SAMPLERS))
def test_two_steps_resume_exactly(sampler_name, tmp_path):
    from mmrft.training.trainer import train

    full = Path(
        train(
            load_config(REPO / "configs/demo.yaml", overrides(tmp_path, "full", 2, sampler_name))
        )["run_dir"]
    )
    train(load_config(REPO / "configs/demo.yaml", overrides(tmp_path, "cut", 1, sampler_name)))
    cut = tmp_path / "cut"
    assert json.loads((cut / "prompt_stats.jsonl").read_text().splitlines()[0])["last_step"] == 1
    train(load_config(REPO / "configs/demo.yaml", overrides(tmp_path, "cut", 2, sampler_name)))
    assert_same_run(full, cut)
    drawn = drawn_by_step(full)
    assert drawn == drawn_by_step(cut)
    rows = [json.loads(x) for x in (full / "prompt_stats.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in rows) == sorted({i for ids in drawn.values() for i in ids})
    assert sum(r["drawn"] for r in rows) == 4
    # step 2 drew what the sampler's rule gives from step 1's saved statistics
    assert drawn[2] == step_one_draws_again(full, sampler_name)
    if sampler_name == "variance":
        assert sorted(drawn[2]) == sorted(drawn[1])  # the seen prompts, not the unseen ones
    if sampler_name in ("difficulty", "curriculum"):
        # a random model solves nothing: its prompts are set aside / ranked hardest
        assert not set(drawn[1]) & set(drawn[2])


def _three_runs_on_two_ranks(rank: int, world: int, tmp_path: str, sampler_name: str) -> None:
    """On each of two gloo ranks, in one process (one start-up instead of three): the whole
    2-step run, then the interrupted one (1 step) and its resume to step 2 (a fresh trainer
    reading the checkpoint, as a new launch would)."""
    from mmrft.training.trainer import train

    torch.set_num_threads(1)
    for name, steps in (("full", 2), ("cut", 1), ("cut", 2)):
        train(
            load_config(
                REPO / "configs/demo.yaml", overrides(Path(tmp_path), name, steps, sampler_name)
            )
        )


@pytest.mark.parametrize(
    "sampler_name",  # ~25 s each on 2 cores: one by default, the others with -m slow
    [
        "variance",
        *[pytest.param(n, marks=pytest.mark.slow) for n in ("difficulty", "curriculum", "uniform")],
    ],
)
def test_two_processes_resume_exactly(sampler_name, tmp_path):
    """Every rank holds the same statistics (a rank that kept only its own groups would draw
    other prompts after the resume, which hands it rank 0's table) and the ranks' prompts are
    disjoint. (The launch through torchrun and the CLI: test_sharding's resumes.)"""
    run_ranks(_three_runs_on_two_ranks, str(tmp_path), sampler_name)
    assert_same_run(tmp_path / "full", tmp_path / "cut")
    # rank 0 wrote both ranks' groups: step 1's two prompts (one per rank) are distinct
    state = torch.load(
        tmp_path / "full/checkpoints/step-000001/trainer_state.pt", weights_only=False
    )
    assert state["world_size"] == 2
    assert [s["drawn"] for s in state["prompt_stats"].values()] == [1, 1]
    rows = (tmp_path / "full" / "prompt_stats.jsonl").read_text().splitlines()
    assert sum(json.loads(r)["drawn"] for r in rows) == 4


def test_dynamic_sampling_counts_discarded_groups(tmp_path):
    """A random model scores 0 on format and accuracy: every group has equal rewards, so
    dynamic sampling drops each one, and the statistics count it."""
    from mmrft.training.trainer import train

    extra = [
        "train.steps=1",
        "algorithm.dynamic_sampling=true",
        "algorithm.max_sampling_tries=2",
        "reward.verifiers=[{name: format}, {name: accuracy}]",
    ]
    cfg = load_config(
        REPO / "configs/demo.yaml", [*overrides(tmp_path, "ds", 1, "uniform"), *extra]
    )
    run_dir = Path(train(cfg)["run_dir"])
    rows = [json.loads(x) for x in (run_dir / "prompt_stats.jsonl").read_text().splitlines()]
    assert sum(r["drawn"] for r in rows) == 4  # 2 prompts × 2 tries
    assert all(r["discarded"] == r["drawn"] and r["variance"] == 0.0 for r in rows)
    assert all(r["accuracy"] == 0.0 and r["reward"] == 0.0 for r in rows)


def test_the_docstring_examples_run():
    import doctest

    import mmrft.rollout.sampling

    result = doctest.testmod(mmrft.rollout.sampling)
    assert result.attempted >= 3 and result.failed == 0
